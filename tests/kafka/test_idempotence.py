"""Idempotent producers: retries are written once, gaps refused.

1. confluent-kafka (`enable.idempotence=true`) and kafka-python 3 (idempotent by default)
   produce keyed records while the broker is killed -9 and started again on the same data
   directory and address; the producer retries what was in flight. Afterwards every record is
   acknowledged, the log holds each exactly once (no duplicate from a retry) where its delivery
   report said, and each key's records are in the order produced.
2. By hand (Produce v3 with a producer id from InitProducerId v0): a batch sent twice is
   answered both times with the offset of its first write and stored once, also when the
   repeat comes after a kill -9 and restart; a batch whose first sequence skips ahead gets
   OUT_OF_ORDER_SEQUENCE_NUMBER (45) and writes nothing; a stale epoch is refused too.
"""

from __future__ import annotations

import struct
import threading

import crc32c
import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire", "kafka_groups")

from kafka_clients import CLIENTS, now_ms  # noqa: E402
from kafka_groups import create_topic, free_port, watermarks  # noqa: E402
from kafka_harness import unique, wait_until  # noqa: E402
from kafka_wire import RawKafka, i8, i16, i32, i64, string, varbytes, zigzag  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

RECORDS = 3000
KEYS = 7
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47


class Retrying:
    """`RECORDS` keyed records (`seq=N`, key `key-(N % KEYS)`) from a producer on a thread, ten
    every 5 ms (so the broker dies mid-run); `sent` counts those handed to the client,
    `acked[seq]` is the (partition, offset) of each acknowledged one."""

    def __init__(self, client, bootstrap, topic):
        self.client, self.bootstrap, self.topic = client, bootstrap, topic
        self.acked, self.failed = {}, {}
        self.lock = threading.Lock()
        self.error = None
        self.sent = 0
        self.pace = threading.Event()  # never set: a clock for the pacing waits
        self.thread = threading.Thread(target=self._guarded, daemon=True, name=f"idempotent-{client}")

    def start(self):
        self.thread.start()
        return self

    def n_acked(self):
        with self.lock:
            return len(self.acked)

    def _sent(self, seq):
        self.sent = seq + 1
        if seq % 10 == 9:
            self.pace.wait(0.005)

    def _guarded(self):
        try:
            getattr(self, f"_run_{self.client.replace('-', '_')}")()
        except Exception as e:  # noqa: BLE001 - the test reports it
            self.error = e

    def _note(self, seq, err, where):
        with self.lock:
            if err is None:
                self.acked[seq] = where
            else:
                self.failed[seq] = err

    def _run_confluent(self):
        p = CLIENTS["confluent"].producer(self.bootstrap, **{
            "enable.idempotence": True, "partitioner": "murmur2_random", "linger.ms": 5,
            "message.timeout.ms": 120000, "queue.buffering.max.messages": 500})
        for seq in range(RECORDS):
            def cb(err, msg, seq=seq):
                self._note(seq, err, None if err else (msg.partition(), msg.offset()))
            while True:
                try:
                    p.produce(self.topic, key=f"key-{seq % KEYS}".encode(), value=f"seq={seq}".encode(),
                              on_delivery=cb)
                    break
                except BufferError:
                    p.poll(0.05)
            p.poll(0)
            self._sent(seq)
        assert p.flush(120) == 0, "records left unacknowledged"

    def _run_kafka_python(self):
        from kafka import KafkaProducer
        p = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5, request_timeout_ms=10000,
                          delivery_timeout_ms=120000, reconnect_backoff_max_ms=200)
        assert p.config["enable_idempotence"], "kafka-python 3 is idempotent by default"
        try:
            for seq in range(RECORDS):
                f = p.send(self.topic, key=f"key-{seq % KEYS}".encode(), value=f"seq={seq}".encode())
                f.add_callback(lambda md, seq=seq: self._note(seq, None, (md.partition, md.offset)))
                f.add_errback(lambda e, seq=seq: self._note(seq, e, None))
                self._sent(seq)
            p.flush(120)
        finally:
            p.close(10)


def read_all(bootstrap, topic, partitions):
    marks = watermarks(bootstrap, topic, partitions)
    assert all(lo == 0 for lo, _ in marks), marks
    wants = {(topic, p): (0, hi) for p, (_, hi) in zip(partitions, marks) if hi}
    got = CLIENTS["confluent"].consume(bootstrap, wants, timeout=120)
    return {p: got.get((topic, p), []) for p in partitions}


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_retries_across_a_kill_9_are_written_once_and_in_order(kafka, client):
    node = kafka.node(kafka_listen=f"127.0.0.1:{free_port()}")
    topic = unique(f"idem-{client}")
    create_topic(node.bootstrap, topic, 3)
    run = Retrying(client, node.bootstrap, topic).start()
    kafka.on_cleanup(lambda: run.thread.join(5))
    wait_until(lambda: run.n_acked() >= RECORDS // 3 or run.error, 120, interval=0.02,
               what="a third of the records acknowledged")
    node.kill()
    at_kill, sent = run.n_acked(), run.sent
    node.start()
    run.thread.join(180)
    assert not run.thread.is_alive(), "the producer did not finish"
    assert run.error is None, f"{client}: {run.error!r}"
    assert not run.failed, f"{len(run.failed)} records failed, e.g. {list(run.failed.items())[:3]}"
    assert sent > at_kill, "nothing was in flight when the broker was killed"
    assert len(run.acked) == RECORDS

    by_partition = read_all(node.bootstrap, topic, [0, 1, 2])
    where, per_key = {}, {}
    for p, recs in by_partition.items():
        for g in recs:
            seq = int(g.value.split(b"=")[1])
            assert g.key == f"key-{seq % KEYS}".encode(), f"{p}@{g.offset}: key {g.key!r} for seq {seq}"
            where.setdefault(seq, []).append((p, g.offset))
            per_key.setdefault(g.key, []).append(seq)
    twice = {s: w for s, w in where.items() if len(w) > 1}
    assert not twice, f"{len(twice)} records written more than once (a retry written again), e.g. " \
                      f"{sorted(twice.items())[:5]}"
    assert sorted(where) == list(range(RECORDS)), f"{RECORDS - len(where)} records missing"
    moved = {s: (w[0], run.acked[s]) for s, w in where.items() if w[0] != run.acked[s]}
    assert not moved, f"records not where their delivery report said (seq: (there, acked)): {list(moved.items())[:5]}"
    for key, seqs in per_key.items():
        assert seqs == sorted(seqs), f"{key!r}: out of order, e.g. {[s for a, s in zip(seqs, seqs[1:]) if s < a][:5]}"
    print(f"{client}: killed with {at_kill} of {RECORDS} acknowledged, {sent - at_kill} in flight")


# --- by hand ---------------------------------------------------------------------------------

API_INIT_PRODUCER_ID = 22


def init_producer_id(raw):
    """InitProducerId v0 without a transactional id: (producer id, epoch)."""
    r = raw.request(API_INIT_PRODUCER_ID, 0, string(None) + i32(60000))
    r.i32()  # throttle
    err, pid, epoch = r.i16(), r.i64(), r.i16()
    assert err == 0, f"InitProducerId error {err}"
    return pid, epoch


def idempotent_batch(values, pid, epoch, base_sequence):
    """An uncompressed RecordBatch v2 of `values` from producer `pid`/`epoch`, its first record
    at sequence `base_sequence` (the layout of kafka_wire.record_batch, with a producer)."""
    ts = now_ms()
    body = b""
    for delta, value in enumerate(values):
        rec = i8(0) + zigzag(0) + zigzag(delta) + varbytes(None) + varbytes(value) + zigzag(0)
        body += zigzag(len(rec)) + rec
    after_crc = (i16(0) + i32(len(values) - 1) + i64(ts) + i64(ts) + i64(pid) + i16(epoch) + i32(base_sequence)
                 + i32(len(values)) + body)
    tail = i32(-1) + i8(2) + struct.pack(">I", crc32c.crc32c(after_crc)) + after_crc
    return i64(0) + i32(len(tail)) + tail


def test_a_repeated_batch_is_stored_once_and_a_gap_is_refused(kafka):
    node = kafka.node()
    topic = unique("idem-raw")
    create_topic(node.bootstrap, topic, 1)
    raw = RawKafka(node.kafka_port)
    kafka.on_cleanup(raw.close)
    pid, epoch = init_producer_id(raw)
    assert pid >= 0 and epoch == 0

    first = idempotent_batch([b"a0", b"a1", b"a2"], pid, epoch, 0)
    err, base = raw.produce(topic, 0, first)
    assert err == 0
    assert raw.produce(topic, 0, first) == (0, base), "a retry is answered with the first write's offset"
    err, hw, recs = raw.fetch(topic, 0, base)
    assert err == 0 and hw == base + 3 and [r.value for r in recs] == [b"a0", b"a1", b"a2"], (hw, recs)

    gap = idempotent_batch([b"c5"], pid, epoch, 5)  # sequences 3 and 4 never came
    assert raw.produce(topic, 0, gap)[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    second = idempotent_batch([b"b3", b"b4"], pid, epoch, 3)
    assert raw.produce(topic, 0, second) == (0, base + 3)
    assert raw.produce(topic, 0, first) == (0, base), "an older batch among the last five is still a retry"
    assert raw.produce(topic, 0, idempotent_batch([b"c7"], pid, epoch, 7))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER

    # After kill -9 the broker finds the producer's last batches in the log.
    node.kill()
    node.start()
    raw = RawKafka(node.kafka_port)
    kafka.on_cleanup(raw.close)
    assert raw.produce(topic, 0, second) == (0, base + 3), "a retry across a restart is written again"
    assert raw.produce(topic, 0, idempotent_batch([b"c6"], pid, epoch, 6))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert raw.produce(topic, 0, idempotent_batch([b"c5"], pid, epoch, 5)) == (0, base + 5)

    # A newer epoch starts over at sequence 0; the older one is fenced.
    assert raw.produce(topic, 0, idempotent_batch([b"e0"], pid, epoch + 1, 0)) == (0, base + 6)
    assert raw.produce(topic, 0, idempotent_batch([b"c6"], pid, epoch, 6))[0] == INVALID_PRODUCER_EPOCH

    err, hw, recs = raw.fetch(topic, 0, base)
    assert err == 0 and hw == base + 7, f"high watermark {hw}, expected {base + 7}"
    assert [r.value for r in recs] == [b"a0", b"a1", b"a2", b"b3", b"b4", b"c5", b"e0"]
