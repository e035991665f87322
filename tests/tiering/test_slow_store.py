"""A stalled object store holds back only the readers that need it.

What a user relies on: offline MQTT sessions whose backlog was uploaded and evicted from the
local disk drain it through the object store; while that store answers nothing (a stall, not
a refusal), those drains wait, but other clients' live traffic on the same node keeps flowing,
PUBACKs included. Once the store answers again, the drains complete and nothing is lost.

The stall is a TCP proxy in this file between silt and SeaweedFS: silt's endpoint
(`AWS_ENDPOINT_URL`) is the proxy, which, while paused, keeps accepting connections and passes
requests on but holds every response byte until it is resumed. The pause stays far below the
object-store client's timeouts (connect 5 s, request 120 s: `tiering/src/store.rs`), so silt
sees a slow store, not a failing one.
"""

import socket
import threading
import time

import pytest

from tiering_harness import SESSION_FOREVER, Ledger, Receiver, SiltNode, dir_bytes, is_success, wait_until

pytest_plugins = ["tiering_harness"]  # the `tiering` fixture

MiB = 1 << 20
SESSIONS = ("drain-0", "drain-1", "drain-2")
HANG = 60  # s: a hang detector for the live pair, not a latency bound


class StallProxy:
    """A TCP proxy on 127.0.0.1 (ephemeral port) to `upstream`, one thread per direction of
    each connection. `pause()`: requests still reach upstream, responses are held (nothing is
    dropped); `resume()` sends what was held and forwards again."""

    def __init__(self, upstream_port):
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.flowing = threading.Event()
        self.flowing.set()
        self.lock = threading.Lock()
        self.sockets = []
        self.closed = False
        self.requests_while_paused = 0  # client chunks passed upstream while paused
        self.held_chunks = 0            # response chunks that waited for resume()
        threading.Thread(target=self._accept, daemon=True, name="stall-proxy").start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def pause(self):
        self.flowing.clear()

    def resume(self):
        self.flowing.set()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.closed:
                    client.close()
                    server.close()
                    return
                self.sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src, dst, response):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if response:
                    if not self.flowing.is_set():
                        with self.lock:
                            self.held_chunks += 1
                    self.flowing.wait()
                elif not self.flowing.is_set():
                    with self.lock:
                        self.requests_while_paused += 1
                if self.closed:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        with self.lock:
            self.closed = True
            socks = list(self.sockets)
        self.listener.close()
        self.flowing.set()
        for s in socks:
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture
def proxy(tiering):
    p = StallProxy(tiering.s3.s3_port)
    try:
        yield p
    finally:
        p.close()


def test_stalled_store_holds_back_cold_drains_not_live_traffic(tiering, proxy):
    """Three offline sessions drain an evicted backlog while the store stalls: a live publisher
    and subscriber on the same node exchange 200 QoS 1 messages meanwhile, one session's client
    reconnects, and after the store answers again every backlog message reaches every session
    (the reconnected one on its new connection)."""
    t = tiering
    size = 16 * 1024
    config = t.config(storage={"segment_bytes": MiB, "segment_max_age_ms": 1000, "tail_cache_bytes": MiB},
                      mqtt={"sys_interval_secs": 1},
                      tiering={"hot_cache_bytes": MiB})
    node = SiltNode("a", t.data_dir("a"), config=config, object_store=t.url,
                    env={**t.s3.env(), "AWS_ENDPOINT_URL": proxy.url}, log_dir=t.base)
    t.nodes.append(node)
    node.start()
    mon = t.monitor(node)

    for cid in SESSIONS:
        c = t.client(node, cid, clean_start=False, session_expiry=SESSION_FOREVER)
        c.subscribe("backlog/#", qos=1)
        c.close()

    ledger = Ledger()
    topics = [f"backlog/{i}" for i in range(4)]
    pub = t.client(node, "backlog-pub")
    keys = []

    def items():
        for i in range(8 * MiB // size):
            p = ledger.make(topics[i % len(topics)], size)
            keys.append(Ledger.parse(p))
            yield topics[i % len(topics)], p

    rcs = pub.publish_many(items())
    for key, rc in zip(keys, rcs):
        ledger.record(key, rc, size)
    assert not ledger.refused, f"{len(ledger.refused)} backlog publishes refused"
    pub.close()
    backlog = set(ledger.acked)

    mon.wait("upload_lag_bytes", lambda v: v == 0, 120, since=time.monotonic() + 3)
    wait_until(lambda: dir_bytes(node.data_dir, skip=("index",)) < ledger.bytes_sent // 2, 30, interval=1,
               what="eviction of uploaded segments")

    proxy.pause()
    paused_at = time.monotonic()
    drains = {cid: Receiver(ledger) for cid in SESSIONS}
    for cid, rx in drains.items():
        c = t.client(node, cid, clean_start=False, session_expiry=SESSION_FOREVER, on_message=rx)
        assert c.session_present, f"{cid}: session not found"
    # The drains' first reads are in flight to the store (and held) before the live pair starts.
    wait_until(lambda: proxy.held_chunks, 30, interval=0.05, what="a held object-store response")

    live_ledger = Ledger()
    live_rx = Receiver(live_ledger)
    sub = t.client(node, "live-sub", on_message=live_rx)
    sub.subscribe("live/t", qos=1)
    live_pub = t.client(node, "live-pub")
    payloads = [live_ledger.make("live/t", 256) for _ in range(200)]
    live_rcs = live_pub.publish_many((("live/t", p) for p in payloads), window=20, stall_timeout=HANG)
    assert all(is_success(rc) for rc in live_rcs), [hex(rc) for rc in live_rcs if not is_success(rc)]
    for p, rc in zip(payloads, live_rcs):
        live_ledger.record(Ledger.parse(p), rc, len(p))
    live_rx.wait_for(live_ledger.acked, HANG, idle=0.5)
    live_rx.assert_exact(live_ledger.acked_by_topic("live/t"))

    live_done = time.monotonic() - paused_at
    # Still paused, and a while longer: the drains wait on the store (else this test proves
    # nothing). The oldest messages are only in the bucket, so none of them has arrived.
    time.sleep(max(0.0, 5 - live_done))
    assert not proxy.flowing.is_set()
    during = {cid: len(rx.distinct()) for cid, rx in drains.items()}
    assert all(n < len(backlog) for n in during.values()), f"drains finished without the store: {during}"
    oldest = {(topic, 0) for topic in topics}
    early = {cid: sorted(rx.distinct() & oldest) for cid, rx in drains.items()}
    assert not any(early.values()), f"oldest messages delivered while the store stalled: {early}"
    print(f"live pair done {live_done:.1f}s after the pause; backlog received while "
          f"paused {during} of {len(backlog)}; proxy held {proxy.held_chunks} response chunks, "
          f"{proxy.requests_while_paused} request chunks passed")

    # drain-0 reconnects (takes its own session over) while its old connection still waits on
    # the store: the new connection gets the whole backlog, without another reconnect. (The
    # old one's read, finishing after the takeover, must not hand it messages.)
    assert during["drain-0"] == 0, "delivery is in log order and the oldest is in the bucket"
    drains["drain-0"] = Receiver(ledger)
    again = t.client(node, "drain-0", clean_start=False, session_expiry=SESSION_FOREVER, on_message=drains["drain-0"])
    assert again.session_present

    proxy.resume()
    resumed_at = time.monotonic()
    for cid, rx in drains.items():
        rx.wait_for(backlog, 120, idle=0)
        assert not rx.bad, f"{cid}: {rx.bad[:5]}"
        assert rx.distinct() >= backlog
    print(f"drains complete {time.monotonic() - resumed_at:.1f}s after resume; "
          f"duplicates {[rx.count - len(rx.distinct()) for rx in drains.values()]}")
    for line in node.log_text().splitlines():
        if " WARN " in line or " ERROR " in line:
            print(line)
