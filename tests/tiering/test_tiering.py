"""Tiering acceptance tests: silt nodes on a real S3-compatible server (SeaweedFS).

Interface under test:
- `silt serve --config FILE --object-store s3://BUCKET/PREFIX` with AWS_ACCESS_KEY_ID,
  AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL and AWS_ALLOW_HTTP in the environment;
- the manifest: versions `PREFIX/manifest/{version:020}.json`, whole or deltas against a
  checkpoint, with `PREFIX/manifest.json` a copy of the newest checkpoint (the harness reads
  the head as a node does); the head is {"format": 1, "epoch", "writer", "objects": [{"key"
  (relative to PREFIX, under segments/), "base", "end", "size", "min_ts", "max_ts"}], "tails"};
- `$SYS/broker/tiering/{upload_lag_bytes, upload_lag_seconds, puts, gets, cache_hit_ratio, fenced}`
  every `mqtt.sys_interval_secs`;
- per-topic `ack` ("local" or "object") and retention from `[topic_defaults]` and `[[topics]]`.

Every payload carries its topic and sequence number and is checked byte for byte (SHA-256).
"""

import os
import queue
import threading
import time

import requests

from tiering_harness import (
    SESSION_FOREVER, Closed, ConnectRefused, Ledger, Receiver, dir_bytes, is_success, wait_until,
)

pytest_plugins = ["tiering_harness"]  # the `tiering` fixture

MiB = 1 << 20


def persistent_subscriber(t, node, client_id, *filters):
    """Creates a persistent session subscribed to `filters` (QoS 1) and leaves it offline."""
    c = t.client(node, client_id, clean_start=False, session_expiry=SESSION_FOREVER)
    c.subscribe(*filters, qos=1)
    c.close()


def resume(t, node, client_id, receiver):
    """Reconnects a persistent session (clean start off); its messages go to `receiver`."""
    c = t.client(node, client_id, clean_start=False, session_expiry=SESSION_FOREVER, on_message=receiver)
    assert c.session_present, f"{client_id}: the session was not found on {node.name}"
    return c


def publish_load(client, ledger, topics, count, size, window=100):
    """`count` QoS 1 publishes round-robin over `topics`, pipelined; records the PUBACKs.
    Returns the wall-clock time (ms) just before the last one was sent: its timestamp in silt
    is not earlier."""
    keys = []
    last_ms = [0]

    def items():
        for i in range(count):
            topic = topics[i % len(topics)]
            p = ledger.make(topic, size)
            keys.append(Ledger.parse(p))
            last_ms[0] = int(time.time() * 1000) - 1
            yield topic, p

    rcs = client.publish_many(items(), window=window)
    for key, rc in zip(keys, rcs):
        ledger.record(key, rc, size)
    bad = [(k, hex(rc)) for k, rc in zip(keys, rcs) if not is_success(rc)]
    assert not bad, f"{len(bad)} publishes refused, e.g. {bad[:5]}"
    return last_ms[0]


def log_end(node):
    """The commitlog's end position on `node` (its admin `/api/status`)."""
    r = requests.get(f"http://127.0.0.1:{node.admin_port}/api/status", timeout=10)
    r.raise_for_status()
    return r.json()["storage"]["log_end"]


def wait_uploaded(monitor, since, timeout=90):
    """Waits for `$SYS/broker/tiering/upload_lag_bytes` = 0 in a reading taken at or after the
    monotonic time `since`."""
    monitor.wait("upload_lag_bytes", lambda v: v == 0, timeout, since=since)


def check_manifest(manifest, t):
    """The manifest's shape, and every object it names exists in the bucket with its size."""
    assert manifest is not None, "no manifest under the prefix"
    assert manifest["format"] == 1
    assert isinstance(manifest["epoch"], int) and manifest["epoch"] >= 1
    assert isinstance(manifest["writer"], str) and manifest["writer"]
    objects = manifest["objects"]
    assert objects, "the manifest names no object"
    stored = t.segment_objects()
    prev_end = None
    for o in sorted(objects, key=lambda o: o["base"]):
        key = f"{t.prefix}/{o['key']}"
        assert o["key"].startswith("segments/"), o
        assert stored.get(key) == o["size"], f"{key}: manifest size {o['size']}, bucket {stored.get(key)}"
        assert o["base"] <= o["end"] and o["min_ts"] <= o["max_ts"], o
        if prev_end is not None:
            assert o["base"] >= prev_end, f"objects overlap at {o}"
        prev_end = o["end"]
    return objects


# --- 1 ---------------------------------------------------------------------------------------

def test_recovery_from_bucket(tiering):
    """~200 MB (SILT_TIERING_MB) over 100 topics, SIGTERM, data directory deleted: a new node on
    the bucket gives a persistent session everything, in order, and the retained messages."""
    t = tiering
    mb = int(os.environ.get("SILT_TIERING_MB", "200"))
    size = 64 * 1024
    count = max(mb * MiB // size, 100)
    config = t.config(storage={"segment_bytes": 8 * MiB, "segment_max_age_ms": 1000},
                      mqtt={"sys_interval_secs": 1})
    one = t.node("one", config)
    persistent_subscriber(t, one, "recovery-sub", "load/#")

    pub = t.client(one, "recovery-pub")
    retained = {"ret/a": b"a-second", "ret/b": b"b-only", "ret/c": b"c" * 5000}
    for topic, payload in [("ret/a", b"a-first"), ("ret/a", b"a-second"), ("ret/b", b"b-only"),
                           ("ret/c", b"c" * 5000), ("ret/d", b"d-cleared"), ("ret/d", b"")]:
        assert is_success(pub.publish(topic, payload, retain=True))

    ledger = Ledger()
    started = time.monotonic()
    publish_load(pub, ledger, [f"load/{i}" for i in range(100)], count, size, window=100)
    print(f"published {count} x {size} B in {time.monotonic() - started:.1f}s")
    pub.close()

    assert one.stop(timeout=300) == 0, one.log_tail()
    check_manifest(t.manifest(), t)
    t.wipe(one)

    two = t.node("two", config)  # a fresh, empty data directory on the same bucket and prefix
    # /readyz said "recovering" while the bucket was read, then "ready".
    wait_until(lambda: two.readyz and two.readyz[-1][0] == 200, 30, what="/readyz 200 on node two")
    assert two.readyz[0] == (503, "recovering\n") and two.readyz[-1] == (200, "ready\n"), two.readyz
    # The restore said how far it was (each tenth, at least), then that it was done.
    two.wait_log(r"restoring the commitlog from the object store.*percent=", 1)
    two.wait_log(r"commitlog restored from the object store", 1)
    rx = Receiver(ledger)
    resume(t, two, "recovery-sub", rx)
    rx.wait_for(ledger.acked, timeout=max(300, mb * 2))
    rx.assert_exact(ledger.acked_by_topic("load/"))

    reader = t.client(two, "retained-reader")
    reader.subscribe("ret/#")
    got = {}
    while True:
        try:
            m = reader.get(timeout=3)
        except queue.Empty:
            break
        assert m.retain, f"{m.topic} arrived without the retain flag"
        got[m.topic] = bytes(m.payload)
    assert got == retained


# --- 2 ---------------------------------------------------------------------------------------

class SteadyPublisher(threading.Thread):
    """QoS 1 publishes at `rate` per second (at most `window` in flight) until stopped."""

    def __init__(self, client, ledger, topics, rate, size, window=50):
        super().__init__(daemon=True)
        self.client, self.ledger, self.topics = client, ledger, topics
        self.rate, self.size, self.window = rate, size, window
        self.stop_event = threading.Event()
        self.tokens = {}  # token -> (topic, seq)
        self.skipped = 0  # ticks with the window full
        self.error = None

    def run(self):
        try:
            i = 0
            next_t = time.monotonic()
            while not self.stop_event.is_set():
                if self.client.in_flight < self.window:
                    topic = self.topics[i % len(self.topics)]
                    p = self.ledger.make(topic, self.size)
                    self.tokens[self.client.submit(topic, p)] = Ledger.parse(p)
                    i += 1
                else:
                    self.skipped += 1
                next_t += 1 / self.rate
                while (left := next_t - time.monotonic()) > 0:
                    self.client.pump(left)
            self.client.wait_acks(list(self.tokens), 60)
        except Exception as e:  # reported by the test
            self.error = e
        finally:
            self.client.pump()
            for tok, key in self.tokens.items():
                if tok in self.client.results:
                    self.ledger.record(key, self.client.results[tok], self.size)

    def finish(self):
        self.stop_event.set()
        self.join(120)
        assert not self.is_alive()


def test_store_down_ack_local(tiering):
    """ack = "local": with the object store down for 60 s publishing goes on, the upload lag
    grows, then drains once the store is back; everything reaches the bucket."""
    t = tiering
    outage = float(os.environ.get("SILT_TIERING_OUTAGE_S", "60"))
    config = t.config(storage={"segment_bytes": 4 * MiB, "segment_max_age_ms": 1000},
                      mqtt={"sys_interval_secs": 1})
    node = t.node("a", config)
    mon = t.monitor(node)
    persistent_subscriber(t, node, "live-sub", "steady/#")
    persistent_subscriber(t, node, "bucket-sub", "steady/#")

    ledger = Ledger()
    rate = 20
    pub = SteadyPublisher(t.client(node, "steady-pub"), ledger, [f"steady/{i}" for i in range(4)],
                          rate=rate, size=4096)
    pub.start()
    time.sleep(8)
    down = time.monotonic()
    t.s3.stop()
    time.sleep(max(0.0, outage - (time.monotonic() - down)))
    up = time.monotonic()
    t.s3.start()
    time.sleep(8)
    pub.finish()
    ended = time.monotonic()
    assert pub.error is None, f"publisher: {pub.error!r}"

    c = pub.client
    lat = {tok: c.ack_times[tok] - c.submit_times[tok] for tok in pub.tokens if tok in c.ack_times}
    assert len(lat) == len(pub.tokens)
    assert all(is_success(c.results[tok]) for tok in pub.tokens)
    assert max(lat.values()) < 5, f"a publish took {max(lat.values()):.1f}s to be acknowledged"
    during = [tok for tok in pub.tokens if down + 2 <= c.ack_times[tok] <= up]
    assert len(during) >= 0.8 * rate * (up - down - 2), (
        f"only {len(during)} publishes acknowledged during the {up - down:.0f}s outage ({pub.skipped} ticks skipped)")

    lag_bytes = mon.values("upload_lag_bytes", since=down, until=up)
    lag_secs = mon.values("upload_lag_seconds", since=down, until=up)
    assert lag_bytes and max(lag_bytes) > 0, f"upload_lag_bytes during the outage: {lag_bytes}"
    assert lag_secs and max(lag_secs) > 0, f"upload_lag_seconds during the outage: {lag_secs}"
    # The last segment is sealed segment_max_age_ms after the last publish, then uploaded.
    wait_uploaded(mon, since=ended + 3, timeout=90)
    print(f"lag peaked at {max(lag_bytes):.0f} bytes; drained {time.monotonic() - ended:.0f}s after the last publish")

    rx = Receiver(ledger)
    live = resume(t, node, "live-sub", rx)
    rx.wait_for(ledger.acked, 120)
    rx.assert_exact(ledger.acked_by_topic("steady/"))
    live.close()

    # Everything reached the bucket: no graceful shutdown, no local data.
    node.kill()
    t.wipe(node)
    fresh = t.node("b", config)
    rx2 = Receiver(ledger)
    resume(t, fresh, "bucket-sub", rx2)
    rx2.wait_for(ledger.acked, 120)
    rx2.assert_exact(ledger.acked_by_topic("steady/"))


# --- 3 ---------------------------------------------------------------------------------------

def test_store_down_ack_object(tiering):
    """ack = "object": while the store is down, publishes to obj/# get no success PUBACK; once it
    is back they complete, and every acknowledged message is in the bucket (checked after
    SIGKILL and an empty data directory)."""
    t = tiering
    config = t.config(storage={"segment_max_age_ms": 500}, mqtt={"sys_interval_secs": 1},
                      tiering={"object_ack_window_ms": 100},
                      topics=[{"match": "obj/#", "ack": "object"}])
    node = t.node("a", config)
    mon = t.monitor(node)
    persistent_subscriber(t, node, "obj-sub", "obj/#")

    ledger = Ledger()
    pub = t.client(node, "obj-pub")

    def publish_now(n):
        for _ in range(n):
            p = ledger.make("obj/x", 2048)
            rc = pub.publish("obj/x", p, timeout=15)
            assert is_success(rc), f"PUBACK {rc:#x} with the store up"
            ledger.record(Ledger.parse(p), rc, len(p))

    publish_now(5)
    # The session (and everything before) is in the bucket before the outage.
    wait_uploaded(mon, since=time.monotonic() + 2, timeout=60)

    t.s3.stop()
    local = t.client(node, "local-pub")
    assert is_success(local.publish("loc/x", b"ack local is not held back", timeout=10))

    held = {}  # token -> payload
    for _ in range(20):
        p = ledger.make("obj/x", 2048)
        held[pub.submit("obj/x", p)] = p
        pub.pump(0.1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pub.pump(0.5)
    assert not pub.closed.is_set(), f"the publisher was disconnected ({pub.disconnect_reason})"
    early = {tok: pub.results[tok] for tok in held if tok in pub.results}
    assert not [rc for rc in early.values() if is_success(rc)], f"success PUBACKs with the store down: {early}"
    refused = [tok for tok, rc in early.items() if not is_success(rc)]
    pending = [tok for tok in held if tok not in pub.results]
    print(f"store down: {len(pending)} publishes held, {len(refused)} refused")

    t.s3.start()
    for tok, rc in pub.wait_acks(pending, 120).items():
        assert is_success(rc), f"PUBACK {rc:#x} after the store came back"
        ledger.record(Ledger.parse(held[tok]), rc, len(held[tok]))
    for tok in refused:  # an error code means "not stored": publish it again
        rc = pub.publish("obj/x", held[tok], timeout=60)
        assert is_success(rc), f"PUBACK {rc:#x} for a retry after the store came back"
        ledger.record(Ledger.parse(held[tok]), rc, len(held[tok]))
    publish_now(5)

    node.kill()  # no graceful upload: only what the bucket holds survives
    t.wipe(node)
    fresh = t.node("b", config)
    rx = Receiver(ledger)
    resume(t, fresh, "obj-sub", rx)
    rx.wait_for(ledger.acked, 60)
    if not refused:
        rx.assert_exact(ledger.acked_by_topic("obj/"))
    else:  # retried messages may also have been stored the first time
        assert not rx.bad, rx.bad[:5]
        assert rx.distinct() >= ledger.acked


# --- 4 ---------------------------------------------------------------------------------------

class ManifestWatcher(threading.Thread):
    """Samples (epoch, writer) of the head manifest every 0.3 s."""

    def __init__(self, t):
        super().__init__(daemon=True)
        self.t = t
        self.samples = []
        self.stop_event = threading.Event()

    def run(self):
        while not self.stop_event.is_set():
            try:
                m = self.t.manifest()
            except Exception:
                m = None
            if m is not None:
                self.samples.append((m["epoch"], m["writer"]))
            self.stop_event.wait(0.3)

    def finish(self):
        self.stop_event.set()
        self.join(10)


def try_publish(t, node, client, topic, payload, timeout=15):
    """Outcome of one QoS 1 publish to `node`: "acked", "refused" (reason code >= 0x80),
    "closed" (the connection ended), "no-connect" or "no-answer". Returns (outcome, client)."""
    if client is None or client.closed.is_set():
        try:
            client = t.client(node, "")
        except ConnectRefused:
            return "no-connect", None
    try:
        rc = client.publish(topic, payload, timeout=timeout)
    except Closed:
        return "closed", client
    except AssertionError:
        return "no-answer", client
    return ("acked" if is_success(rc) else "refused"), client


def test_two_nodes_fence(tiering):
    """A second node on the same prefix takes a newer epoch: the first is fenced (refuses
    publishes), the manifest stays the second's, and the second serves the first's history."""
    t = tiering
    config = t.config(storage={"segment_max_age_ms": 500}, mqtt={"sys_interval_secs": 1})
    a = t.node("a", config)
    mon_a = t.monitor(a)
    persistent_subscriber(t, a, "hist-sub", "hist/#")
    pub = t.client(a, "hist-pub")
    ledger = Ledger()
    publish_load(pub, ledger, [f"hist/{i}" for i in range(4)], 200, 4096)
    kept = {f"keep/ret/{i}": f"retained {i}".encode() for i in range(3)}
    for topic, payload in kept.items():
        assert is_success(pub.publish(topic, payload, retain=True))
    wait_uploaded(mon_a, since=time.monotonic() + 2, timeout=60)
    before = t.manifest()
    check_manifest(before, t)
    epoch_a, writer_a = before["epoch"], before["writer"]

    watcher = ManifestWatcher(t)
    watcher.start()
    mark = a.log_mark()
    b = t.node("b", config)
    after = wait_until(lambda: (m := t.manifest()) and m["epoch"] > epoch_a and m, 60,
                       what="node b's epoch in the manifest")
    epoch_b, writer_b = after["epoch"], after["writer"]
    assert writer_b != writer_a

    # Make a try to upload: new data on a, sealed after segment_max_age_ms.
    for i in range(5):
        try:
            pub.submit("poke/a", f"poke {i}".encode())
        except Closed:
            break
    a.wait_log(r"(?i)fenced", 60, since=mark)

    client = pub
    outcomes = []
    for i in range(3):
        outcome, client = try_publish(t, a, client, "poke/b", f"after fence {i}".encode())
        outcomes.append(outcome)
    print(f"publishes to the fenced node: {outcomes}")
    assert all(o in ("refused", "closed", "no-connect") for o in outcomes), (
        f"publishes to the fenced node: {outcomes}")

    time.sleep(2)
    watcher.finish()
    final = t.manifest()
    assert final["epoch"] >= epoch_b and final["writer"] == writer_b, final
    epochs = [e for e, _ in watcher.samples]
    assert epochs == sorted(epochs), f"the manifest epoch went back: {epochs}"
    taken = [(e, w) for e, w in watcher.samples if e >= epoch_b]
    assert all(w == writer_b for _, w in taken), f"writers after b took over: {sorted(set(taken))}"
    check_manifest(final, t)

    rx = Receiver(ledger)
    resume(t, b, "hist-sub", rx)
    rx.wait_for(ledger.acked, 60)
    rx.assert_exact(ledger.acked_by_topic("hist/"))
    reader = t.client(b, "keep-reader")
    reader.subscribe("keep/ret/#")
    got = {}
    for _ in kept:
        m = reader.get(timeout=10)
        got[m.topic] = bytes(m.payload)
    assert got == kept

    # The fenced node says why it refuses writes. (Not in $SYS: its figures are records in
    # the log it no longer writes to.)
    assert "this node is fenced" in a.log_text(), a.log_tail()


# --- 5 ---------------------------------------------------------------------------------------

def test_retention_deletes_objects(tiering):
    """short/# keeps 2 s: its objects are deleted from the bucket and the manifest, newer objects
    (long/#) stay, and a subscriber does not get the expired messages."""
    t = tiering
    # $SYS off: its retained statistics are log records too, and would land in every segment.
    config = t.config(storage={"segment_max_age_ms": 500}, mqtt={"sys_interval_secs": 0},
                      tiering={"retention_check_interval_ms": 500},
                      topic_defaults={"retention_ms": 0},
                      topics=[{"match": "short/#", "retention_ms": 2000},
                              {"match": "long/#", "retention_ms": 600000}])
    node = t.node("a", config)
    persistent_subscriber(t, node, "retention-sub", "short/#", "long/#")
    time.sleep(2)  # the session's own records, if any, are sealed and uploaded on their own
    initial = t.manifest_keys()

    ledger = Ledger()
    pub = t.client(node, "retention-pub")

    def publish_and_wait_uploaded(topics, count):
        publish_load(pub, ledger, topics, count, 1024, window=20)
        # Every message published is below the log's end now: wait until sealed objects cover
        # it. (A timestamp is not enough: the segment can be sealed by age in the middle of the
        # last millisecond's messages, and the rest would share an object with the next topics.)
        end = log_end(node)

        def uploaded():
            m = t.manifest()
            return m if m and any(o["end"] >= end for o in m["objects"]) else None
        return wait_until(uploaded, 30, what=f"{topics[0]}... uploaded")

    with_short = t.manifest_keys(publish_and_wait_uploaded([f"short/{i}" for i in range(4)], 40))
    short_objects = with_short - initial
    assert short_objects, "no new object for short/#"
    with_long = t.manifest_keys(publish_and_wait_uploaded([f"long/{i}" for i in range(2)], 10))
    long_objects = with_long - with_short
    assert long_objects, "no new object for long/#"
    pub.close()

    def short_gone():
        listed = set(t.segment_objects())
        named = t.manifest_keys()
        return not (short_objects & listed) and not (short_objects & named) and (listed, named)
    listed, named = wait_until(short_gone, 30, interval=0.5, what="the short/# objects to be deleted")
    assert long_objects <= named, f"newer objects dropped from the manifest: {long_objects - named}"
    assert long_objects <= listed, f"newer objects deleted from the bucket: {long_objects - listed}"
    check_manifest(t.manifest(), t)

    rx = Receiver(ledger)
    resume(t, node, "retention-sub", rx)
    long_keys = {k for k in ledger.acked if k[0].startswith("long/")}
    rx.wait_for(long_keys, 30, idle=3)
    expired = sorted(k for k in rx.distinct() if k[0].startswith("short/"))
    assert not expired, f"{len(expired)} expired messages delivered, e.g. {expired[:5]}"
    rx.assert_exact(ledger.acked_by_topic("long/"))


# --- 6 ---------------------------------------------------------------------------------------

def test_cold_read_after_eviction(tiering):
    """A small hot cache: after upload, old segments leave the local disk, and an offline
    session's backlog is read back from the bucket (ranged GETs)."""
    t = tiering
    mb = int(os.environ.get("SILT_TIERING_COLD_MB", "20"))
    size = 16 * 1024
    config = t.config(storage={"segment_bytes": MiB, "segment_max_age_ms": 1000, "tail_cache_bytes": MiB},
                      mqtt={"sys_interval_secs": 1},
                      tiering={"hot_cache_bytes": MiB})
    node = t.node("a", config)
    mon = t.monitor(node)
    persistent_subscriber(t, node, "cold-sub", "cold/#")
    pub = t.client(node, "cold-pub")
    ledger = Ledger()
    publish_load(pub, ledger, [f"cold/{i}" for i in range(10)], mb * MiB // size, size)
    pub.close()
    wait_uploaded(mon, since=time.monotonic() + 3, timeout=120)
    objects = check_manifest(t.manifest(), t)
    assert len(objects) >= 2, f"{len(objects)} objects for {mb} MB in 1 MiB segments"

    local = lambda: dir_bytes(node.data_dir, skip=("index",))  # noqa: E731
    wait_until(lambda: local() < ledger.bytes_sent // 2, 30, interval=1,
               what=f"eviction (local data {local()} bytes, {ledger.bytes_sent} published)")
    gets_before = mon.latest("gets") or 0

    rx = Receiver(ledger)
    resume(t, node, "cold-sub", rx)
    rx.wait_for(ledger.acked, 180)
    rx.assert_exact(ledger.acked_by_topic("cold/"))
    drained = time.monotonic()
    gets = mon.wait("gets", lambda v: v > gets_before, 15, since=drained)
    assert gets > 0
    print(f"gets {gets_before:.0f} -> {gets:.0f}, cache hit ratio {mon.latest('cache_hit_ratio')}")
