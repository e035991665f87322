"""A table has one writer at a time, and retention waits for it (issue 10).

- Two nodes on one prefix: node b starts on a's prefix with an empty data directory, takes a newer
  tiering epoch and restores the stream from the bucket; a runs on until it finds out it is
  fenced, and so does its table writer: every snapshot from b's first on carries b's epoch, a
  commits nothing after it, and the table holds every acknowledged message exactly once, each at
  the (stream, partition, offset) b's Kafka view has for it. `fleet/#` uses `ack = "object"`, so
  an acknowledged message is in the bucket b restores from. The same when a's last rows were
  acknowledged on its disk only (`fleet/local/#`), lost to the takeover as that durability
  allows, and never in the table: a's writer commits only what the bucket holds.
- Retention and a table that has not written everything: retention deletes only what the table
  has written (`$SYS/broker/lakehouse/<table>/holding_retention` is 1 while it waits), and the
  table gets every message: while its REST catalog is unreachable (a TCP forwarder in front of
  SeaweedFS's catalog stops listening), and while it lags behind (`max_rows_per_commit`).
  Retention runs every 500 ms on a 2 s `retention_ms`; `storage.segment_max_age_ms` seals the
  segments at once.
"""

import json
import socket
import threading
import time

import pytest

pytest.register_assert_rewrite("lakehouse_harness")

from lakehouse_harness import (  # noqa: E402
    Sent, assert_no_problems, check_rows, wait_until,
)
from kafka_clients import CLIENTS  # noqa: E402 - on the path once lakehouse_harness is imported

pytest_plugins = ["lakehouse_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

COLUMNS = {"n": "long"}


class Messages:
    """Numbered JSON payloads (`n` is the projected column), each unique."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.n = 0

    def make(self, count, phase):
        out = []
        for _ in range(count):
            k = self.n
            self.n += 1
            out.append(Sent(f"{self.prefix}/d{k % 10}", json.dumps({"n": k, "phase": phase}).encode(),
                            want={"n": k}))
        return out


def watermarks(node, stream, partitions):
    """[(low, high)] of each partition of `stream`, from the node's Kafka listener."""
    from confluent_kafka import TopicPartition
    c = CLIENTS["confluent"].consumer(node.bootstrap)
    try:
        return [c.get_watermark_offsets(TopicPartition(stream, p), timeout=30, cached=False)
                for p in range(partitions)]
    finally:
        c.close()


def table_offsets(table):
    """The current snapshot's `silt.offsets` ({} before the first commit)."""
    try:
        return json.loads(table.summary().get("silt.offsets", "{}"))
    except Exception:  # noqa: BLE001 - not readable yet
        return {}


def wait_table_caught_up(table, node, stream, partitions, timeout, unless=None):
    """Waits until the table's recorded offsets are the ends of every partition of `stream` on
    `node` (the table has read everything there is), or until the node logs a line matching
    `unless`."""
    state = {}

    def caught_up():
        if unless is not None and node.lines(unless):
            return True
        ends = {f"{stream}/{p}": hi for p, (_, hi) in enumerate(watermarks(node, stream, partitions)) if hi > 0}
        got = {k: v for k, v in table_offsets(table).items() if k.startswith(f"{stream}/")}
        state.update(ends=ends, table=got)
        return got == ends
    try:
        wait_until(caught_up, timeout, interval=0.5, what=f"table {table.name} at the end of {stream}")
    except AssertionError as e:
        lines = "".join(node.lines(r"lakehouse")[-15:])
        raise AssertionError(f"{e}; last {state}; silt's lakehouse lines:\n{lines}") from None


def snapshot_chain(table):
    """The current snapshot and its ancestors, oldest first, as (snapshot, epoch)."""
    t = table.py_table()
    chain = []
    snap = t.current_snapshot()
    while snap is not None:
        epoch = snap.summary.additional_properties.get("silt.epoch")
        chain.append((snap, int(epoch) if epoch is not None else None))
        snap = t.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    return chain[::-1]


# --- 1: two nodes on one prefix --------------------------------------------------------------

PARTITIONS = 2


def fleet_config(lake):
    """`fleet/#` acknowledged once in the bucket, and `fleet/local/#` (the same stream and table)
    once on the local disk."""
    return lake.config(
        topic_defaults={"partitions": PARTITIONS},
        tiering={"object_ack_window_ms": 50},
        topics=[{"match": "fleet/local/#", "lakehouse": "iceberg", "table": "fleet", "commit_interval_ms": 500,
                 "columns": COLUMNS},
                {"match": "fleet/#", "ack": "object", "lakehouse": "iceberg", "commit_interval_ms": 500,
                 "columns": COLUMNS}])


def check_takeover_table(lake, table, b, acked, may=()):
    """The table, once it read b's stream to its end: every acknowledged message in b's stream
    (else tiering lost it) and in the table exactly once, each row the record b's Kafka view has
    at its position, as many rows as b's stream has records."""
    wait_table_caught_up(table, b, "fleet", PARTITIONS, 90)
    kafka = lake.kafka_records(b, "fleet", PARTITIONS)
    in_stream = {g.value for g in kafka.values()}
    lost = [s for s in acked if s.payload not in in_stream]
    assert not lost, (f"{len(lost)} acknowledged messages are not in b's stream (a tiering loss, not the "
                      f"table's), e.g. {[s.payload[:40] for s in lost[:3]]}")
    for reader, rows in (("DuckDB", table.duck_rows()), ("pyiceberg", table.py_rows())):
        assert_no_problems(check_rows(rows, acked, may=may, partitions=PARTITIONS, kafka=kafka,
                                      columns=tuple(COLUMNS), reader=reader))
        assert len(rows) == len(kafka), f"{reader}: {len(rows)} rows, b's stream has {len(kafka)} records"


def test_a_second_node_on_the_prefix_fences_the_first_nodes_table_writer(lake):
    config = fleet_config(lake)
    a = lake.node("a", config=config)
    table = lake.embedded("fleet")
    m = Messages("fleet")
    first = m.make(400, "a")
    assert all(rc == 0 for rc in lake.publisher(a, "fleet-a").send(first).values())
    wait_table_caught_up(table, a, "fleet", PARTITIONS, 60)
    epoch_a = int(table.summary()["silt.epoch"])

    # b: its own, empty, data directory, restored from the bucket; a runs on, its writer looking
    # for rows every commit interval, until it finds out it is fenced. (a takes no publishes
    # meanwhile: rows a writes but never uploads are the next test's case.)
    mark_a = a.log_mark()
    b = lake.node("b", config=config)
    more = m.make(400, "b")
    assert all(rc == 0 for rc in lake.publisher(b, "fleet-b").send(more).values())
    a.wait_log(r"lakehouse writer stopped", 30, since=mark_a)
    check_takeover_table(lake, table, b, first + more)

    chain = snapshot_chain(table)
    epochs = [e for _, e in chain]
    epoch_b = epochs[-1]
    print(f"snapshot epochs {epochs}; a logged {len(a.commits('fleet'))} commits, b {len(b.commits('fleet'))}")
    assert epoch_b > epoch_a, f"the last snapshot's epoch {epoch_b} is not newer than a's {epoch_a}: {epochs}"
    assert set(epochs) == {epoch_a, epoch_b}, f"snapshot epochs {epochs}, a's {epoch_a}, b's {epoch_b}"
    first_b = epochs.index(epoch_b)
    assert all(e == epoch_b for e in epochs[first_b:]), \
        f"a snapshot of epoch {epoch_a} after b's first commit (snapshot {first_b}): {epochs}"
    # Every commit each node logged is one of its snapshots: a's all before b's first.
    assert len(a.commits("fleet")) == first_b, \
        f"a logged {len(a.commits('fleet'))} commits, the table has {first_b} snapshots of epoch {epoch_a}: {epochs}"
    assert len(b.commits("fleet")) == len(epochs) - first_b, \
        f"b logged {len(b.commits('fleet'))} commits, the table has {len(epochs) - first_b} of epoch {epoch_b}"
    assert b.lines(rf"this node owns the prefix .*epoch={epoch_b}\b"), \
        f"b's start line does not name epoch {epoch_b}: {b.lines('owns the prefix')}"


def test_rows_the_first_node_never_uploaded_do_not_make_the_second_rewrite_the_table(lake):
    """a's last messages are acknowledged on its disk only (`fleet/local/#`, ack = "local": lost
    when b takes the prefix over, as that durability allows) and nothing uploads them (no
    object acknowledgement waits, no segment seals). a's writer has them in the table by then.
    The table must still agree with the stream b restored: each of b's records once, at its
    position."""
    config = fleet_config(lake)
    a = lake.node("a", config=config)
    table = lake.embedded("fleet")
    m = Messages("fleet")
    in_bucket = m.make(400, "object")
    assert all(rc == 0 for rc in lake.publisher(a, "fleet-a1").send(in_bucket).values())
    local = [Sent(s.topic.replace("fleet/", "fleet/local/", 1), s.payload, want=s.want) for s in m.make(300, "local")]
    assert all(rc == 0 for rc in lake.publisher(a, "fleet-a2").send(local).values())
    wait_table_caught_up(table, a, "fleet", PARTITIONS, 60)

    mark_a = a.log_mark()
    b = lake.node("b", config=config)
    more = m.make(400, "b")
    assert all(rc == 0 for rc in lake.publisher(b, "fleet-b").send(more).values())
    a.wait_log(r"lakehouse writer stopped", 30, since=mark_a)
    print(f"b's lakehouse lines: {b.lines('starts over')}")
    check_takeover_table(lake, table, b, in_bucket + more, may=local)


# --- 2: retention waits for a table whose catalog is down -------------------------------------

RETENTION_MS = 2000
CHANCE_S = 25
LAG_S = 16


class Unpluggable:
    """A TCP forwarder on a fixed loopback port to `upstream`: `unplug()` stops listening and
    resets every open connection (connections to the port are refused), `plug()` listens again
    on the same port."""

    def __init__(self, upstream):
        self.upstream = upstream
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._lock = threading.Lock()
        self._conns = set()
        self._listener = None

    def plug(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        s.settimeout(0.1)
        stop = threading.Event()
        self._listener = (s, stop)
        threading.Thread(target=self._accept, args=(s, stop), daemon=True, name="unpluggable").start()

    def _accept(self, s, stop):
        while not stop.is_set():
            try:
                c, _ = s.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            c.settimeout(None)
            try:
                u = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
            except OSError:
                c.close()
                continue
            u.settimeout(None)
            with self._lock:
                self._conns |= {c, u}
            for x, y in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(x, y), daemon=True).start()

    def _pipe(self, src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def unplug(self):
        if self._listener is None:
            return
        s, stop = self._listener
        self._listener = None
        stop.set()
        s.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            try:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                c.close()
            except OSError:
                pass


class Figures:
    """Every `$SYS/broker/lakehouse/<table>/...` reading: (monotonic time, name, value)."""

    def __init__(self, lake, node, table):
        self.prefix = f"$SYS/broker/lakehouse/{table}/"
        self.readings = []
        self._lock = threading.Lock()
        client = lake.mqtt(node, f"figures-{table}", on_message=self._on)
        client.subscribe(self.prefix + "#", qos=0)

    def _on(self, msg):
        try:
            value = float(bytes(msg.payload).decode().strip())
        except ValueError:
            return
        with self._lock:
            self.readings.append((time.monotonic(), msg.topic.removeprefix(self.prefix), value))

    def values(self, name, since=None, until=None):
        with self._lock:
            return [v for t, n, v in self.readings
                    if n == name and (since is None or t >= since) and (until is None or t <= until)]

    def at(self, name, when):
        """The figure's value at monotonic time `when` (its last reading by then; silt publishes
        a figure when it changes)."""
        v = self.values(name, until=when)
        return v[-1] if v else None


def retention_config(lake, catalog_uri):
    s3 = lake.s3
    return lake.config(
        mqtt={"sys_interval_secs": 1},
        storage={"segment_max_age_ms": 500},
        tiering={"retention_check_interval_ms": 500},
        lakehouse={"catalog": "rest", "catalog_uri": catalog_uri, "warehouse": s3.warehouse,
                   "catalog_credential": s3.credential},
        topics=[{"match": "hold/#", "lakehouse": "iceberg", "commit_interval_ms": 500,
                 "retention_ms": RETENTION_MS, "columns": COLUMNS}])


def test_retention_keeps_what_the_table_has_not_written_while_its_catalog_is_down(lake):
    plug = Unpluggable(lake.s3.iceberg_port)
    plug.plug()
    lake.on_cleanup(plug.unplug)
    node = lake.node(config=retention_config(lake, f"http://127.0.0.1:{plug.port}"))
    figures = Figures(lake, node, "hold")
    view = lake.seaweedfs_table("hold")
    m = Messages("hold")

    written = m.make(300, "written")
    assert all(rc == 0 for rc in lake.publisher(node, "hold-1").send(written).values())
    wait_table_caught_up(view, node, "hold", 1, 60)

    mark = node.log_mark()
    plug.unplug()
    down_at = time.monotonic()
    pending = m.make(300, "pending")
    assert all(rc == 0 for rc in lake.publisher(node, "hold-2").send(pending).values())
    acked_at = time.monotonic()
    node.wait_log(r"lakehouse commit failed", 30, since=mark)
    # Retention is at work: what the table has written goes (the first 300 offsets)...
    wait_until(lambda: watermarks(node, "hold", 1)[0][0] > 0, 30, interval=0.5,
               what="retention to delete messages the table has written")
    # ...and gets its chance at the pending messages: 25 s, two of the broker's internal-state
    # dumps (retained `$SYS` figures are in every segment, and retention deletes a segment past
    # the broker's internal floor only after a dump, at most every 10 s), or until it took them.
    wait_until(lambda: time.monotonic() - acked_at > CHANCE_S or watermarks(node, "hold", 1)[0][0] > len(written),
               CHANCE_S + 30, interval=0.5, what="retention rounds after the pending messages expired")
    low, high = watermarks(node, "hold", 1)[0]
    up_at = time.monotonic()
    plug.plug()
    print(f"catalog down {up_at - down_at:.1f}s; hold/0 watermarks then ({low}, {high}); holding_retention "
          f"readings while down {figures.values('holding_retention', down_at, up_at)}")

    lost_line = r"deleted by retention before the table wrote them"
    wait_table_caught_up(view, node, "hold", 1, 60, unless=lost_line)
    for reader, rows in (("DuckDB via the catalog", view.duck_rows()), ("pyiceberg via the catalog", view.py_rows())):
        assert_no_problems(check_rows(rows, written + pending, columns=tuple(COLUMNS), reader=reader))
    assert low <= len(written), (f"retention deleted offsets {len(written)}..{low} of hold/0, which the table "
                                 f"had not written, while its catalog was down")
    assert not node.lines(lost_line), node.lines(lost_line)
    # From shortly after the pending messages were acknowledged until the catalog came back.
    since = acked_at + 2
    held = [figures.at("holding_retention", since)] + figures.values("holding_retention", since, up_at)
    assert held[0] is not None and all(v == 1 for v in held), \
        f"$SYS .../hold/holding_retention while the catalog was down and rows were pending: {held}"


# --- 3: retention waits for a table that lags ------------------------------------------------

def test_retention_waits_for_a_table_that_lags_behind(lake):
    """The writer commits at most 10 rows at a time (`max_rows_per_commit`), so messages published
    faster than that pile up beyond their 2 s retention, for 16 s (retention running every 500 ms,
    the broker dumping its internal state every 10 s at most, as retention past its internal
    floor needs): retention deletes only what the table has written, `holding_retention` is 1
    while it waits, and the table gets every message."""
    config = lake.config(
        mqtt={"sys_interval_secs": 1},
        storage={"segment_max_age_ms": 500},
        tiering={"retention_check_interval_ms": 500},
        lakehouse={"max_rows_per_commit": 10},
        topics=[{"match": "lag/#", "lakehouse": "iceberg", "commit_interval_ms": 500,
                 "retention_ms": RETENTION_MS, "columns": COLUMNS}])
    node = lake.node(config=config)
    figures = Figures(lake, node, "lag")
    table = lake.embedded("lag")
    m = Messages("lag")
    pub = lake.publisher(node, "lag-pub")
    started = time.monotonic()
    samples = []  # (s since start, low watermark, table offset, high watermark)

    def sample():
        lo, hi = watermarks(node, "lag", 1)[0]
        samples.append((round(time.monotonic() - started, 1), lo, table_offsets(table).get("lag/0", 0), hi))
        return samples[-1]
    sent = m.make(3000, "burst")
    assert all(rc == 0 for rc in pub.send(sent).values())
    burst_at = time.monotonic()
    while time.monotonic() - burst_at < LAG_S:
        _, lo, off, hi = sample()
        assert off < hi, f"the table caught up: the test proves nothing: {samples}"
        if hi - off < 600:  # keep the table behind
            wave = m.make(300, f"w{len(sent)}")
            assert all(rc == 0 for rc in pub.send(wave).values())
            sent += wave
        time.sleep(0.5)
    acked_at = time.monotonic()

    def caught_up():
        _, _, off, hi = sample()
        return off == hi
    wait_until(caught_up, 60, interval=0.5, what="the table at the end of lag/0")
    done_at = time.monotonic()
    print(f"{len(sent)} messages, in the table after {done_at - started:.1f}s ({len(node.commits('lag'))} commits); "
          f"(s, low watermark, table offset, end): {samples[::max(1, len(samples) // 15)]}")
    for reader, rows in (("DuckDB", table.duck_rows()), ("pyiceberg", table.py_rows())):
        assert_no_problems(check_rows(rows, sent, columns=tuple(COLUMNS), reader=reader))
    assert all(lo <= off for _, lo, off, _ in samples), \
        f"retention deleted what the table had not written: (s, low watermark, table offset, end) {samples}"
    assert any(lo > 0 for _, lo, off, hi in samples if off < hi), \
        f"retention deleted nothing while the table lagged: the test proves nothing: {samples}"
    assert not node.lines(r"deleted by retention before the table wrote them")
    # From a second (one $SYS interval) after it lagged by 1000 rows until shortly before it caught up.
    lagging = started + next(t for t, _, off, hi in samples if hi - off >= 1000) + 1.5
    held = [figures.at("holding_retention", lagging)] + figures.values("holding_retention", lagging, done_at - 2)
    assert held[0] is not None and all(v == 1 for v in held), \
        f"$SYS .../lag/holding_retention while the table lagged: {held}"
    wait_until(lambda: figures.at("holding_retention", time.monotonic()) == 0, 10,
               what="holding_retention back to 0 once the table caught up")
