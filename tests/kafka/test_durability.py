"""Durability as a Kafka producer relies on it.

1. kill -9 under `acks=all` load from confluent-kafka: after a restart on the same data
   directory, every acknowledged record is exactly where its delivery report said (partition,
   offset), byte for byte; every record there is one that was produced (no garbage), offsets
   are dense, and new records continue after them.
2. A restart on an EMPTY data directory with the same bucket (SeaweedFS): the topics come back
   with their partition counts, and the records at their offsets, byte for byte:
   - after a graceful stop (SIGTERM uploads what is pending), `ack = "local"`;
   - after kill -9 with `ack = "object"` (acknowledged only once the bucket holds the batch).

Knob: SILT_KAFKA_KILL_RECORDS (acknowledged records before the kill, default 20000).
"""

import os
import random
import threading

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire")

from kafka_clients import CLIENTS, Rec  # noqa: E402
from kafka_harness import wait_until  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

POOL = random.Random(11).randbytes(1 << 20)


def record(seq, rnd):
    """Record `seq`: its value starts with the sequence number, the rest is cut from a pool."""
    n = rnd.randrange(16, 2048)
    off = rnd.randrange(0, len(POOL) - n)
    value = f"seq={seq};".encode() + POOL[off:off + n]
    return Rec(f"key-{seq % 97}".encode(), value, (("seq", str(seq).encode()), ("src", b"durability")))


def seq_of(value):
    head = value.split(b";", 1)[0]
    assert head.startswith(b"seq="), f"not a produced value: {value[:40]!r}"
    return int(head[4:])


class Load:
    """A confluent-kafka producer (acks=all, murmur2 partitioner) on its own thread, producing
    until stopped; `produced[seq]` is every record handed to it, `acked[seq]` the (partition,
    offset) of each delivered one."""

    def __init__(self, bootstrap, topic):
        self.topic = topic
        self.p = CLIENTS["confluent"].producer(bootstrap, **{
            "partitioner": "murmur2_random", "linger.ms": 2, "message.timeout.ms": 300000,
            "queue.buffering.max.messages": 2000})
        self.produced, self.acked, self.failed = {}, {}, {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="kafka-load")
        self.rnd = random.Random(5)

    def _report(self, seq):
        def cb(err, msg):
            with self.lock:
                if err is None:
                    self.acked[seq] = (msg.partition(), msg.offset())
                else:
                    self.failed[seq] = err
        return cb

    def _run(self):
        seq = 0
        while not self.stop.is_set():
            r = record(seq, self.rnd)
            try:
                self.p.produce(self.topic, value=r.value, key=r.key, headers=list(r.headers),
                               on_delivery=self._report(seq))
            except BufferError:
                self.p.poll(0.05)
                continue
            self.produced[seq] = r
            seq += 1
            self.p.poll(0)
        # Whatever was not answered is given up (the broker is gone).
        self.p.purge(in_queue=True, in_flight=True)
        self.p.flush(30)

    def n_acked(self):
        with self.lock:
            return len(self.acked)


def read_partitions(bootstrap, topic, partitions):
    """Every record of every partition (confluent-kafka): {partition: [Got]}, from offset 0."""
    from confluent_kafka import TopicPartition
    c = CLIENTS["confluent"].consumer(bootstrap)
    try:
        marks = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False) for p in range(partitions)]
    finally:
        c.close()
    assert all(lo == 0 for lo, _ in marks), f"log start moved: {marks}"
    wants = {(topic, p): (0, hi) for p, (_, hi) in enumerate(marks) if hi}
    got = CLIENTS["confluent"].consume(bootstrap, wants, timeout=180) if wants else {}
    return {p: got.get((topic, p), []) for p in range(partitions)}


def check_log(by_partition, produced, acked):
    """Dense offsets, only produced records (byte for byte), every acked one where it was acked."""
    at = {}
    for p, recs in by_partition.items():
        assert [g.offset for g in recs] == list(range(len(recs))), f"partition {p}: offsets not dense"
        for g in recs:
            seq = seq_of(g.value)
            want = produced.get(seq)
            assert want is not None, f"[{p}@{g.offset}] seq {seq} was never produced"
            assert (g.key, g.value, tuple(g.headers)) == (want.key, want.value, want.headers), \
                f"[{p}@{g.offset}] seq {seq} differs from what was produced"
            at[(p, g.offset)] = seq
    lost = [(seq, pos) for seq, pos in sorted(acked.items()) if at.get(pos) != seq]
    assert not lost, (f"{len(lost)} of {len(acked)} acknowledged records are not where their delivery "
                      f"report said, e.g. (seq, (partition, offset)) {lost[:10]}; there: "
                      f"{[at.get(pos) for _, pos in lost[:10]]}")


def test_every_acknowledged_record_survives_kill_9_under_load(kafka):
    target = int(os.environ.get("SILT_KAFKA_KILL_RECORDS", "20000"))
    node = kafka.node(config=kafka.config(topics=[{"match": "load/#", "partitions": 3}]))
    load = Load(node.bootstrap, "load")
    load.thread.start()
    kafka.on_cleanup(lambda: (load.stop.set(), load.thread.join(60)))
    wait_until(lambda: load.n_acked() >= target, 300, what=f"{target} acknowledged records")
    in_flight = len(load.p)
    node.kill()
    load.stop.set()
    load.thread.join(120)
    assert not load.thread.is_alive()
    with load.lock:
        acked, produced = dict(load.acked), dict(load.produced)
    assert in_flight > 0, "nothing was in flight when the broker was killed: not under load"
    assert len(produced) > len(acked), "every record was acknowledged before the kill"
    print(f"kill -9 with {len(acked)} acknowledged, {len(produced) - len(acked)} not, {in_flight} in the "
          f"producer's queue or in flight")

    node.start()
    by_partition = read_partitions(node.bootstrap, "load", 3)
    assert sum(1 for recs in by_partition.values() if recs) == 3, "97 keys over 3 partitions"
    check_log(by_partition, produced, acked)

    # The log goes on densely from there.
    more = CLIENTS["confluent"].produce(node.bootstrap, [("load", p, Rec(b"after", b"restart")) for p in range(3)])
    assert more == [(p, len(by_partition[p])) for p in range(3)]


def produce_topics(bootstrap, plan, rnd):
    """Records to each topic of `plan` ({topic: (partitions, count)}), spread over its partitions.
    Returns {topic: {seq: Rec}}, {topic: {seq: (partition, offset)}}."""
    produced, acked = {}, {}
    seq = 0
    for topic, (parts, count) in plan.items():
        items = []
        for i in range(count):
            items.append((topic, i % parts, record(seq, rnd)))
            seq += 1
        acks = CLIENTS["confluent"].produce(bootstrap, items, codec="zstd")
        produced[topic] = {seq_of(r.value): r for _, _, r in items}
        acked[topic] = {seq_of(r.value): a for (_, _, r), a in zip(items, acks)}
    return produced, acked


def partition_counts(bootstrap):
    from confluent_kafka.admin import AdminClient
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    return {t: len(m.partitions) for t, m in md.topics.items()}


def create_topic(bootstrap, name, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer is in
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def check_all(bootstrap, plan, produced, acked):
    counts = partition_counts(bootstrap)
    assert {t: counts.get(t) for t in plan} == {t: p for t, (p, _) in plan.items()}, f"partition counts {counts}"
    for topic, (parts, count) in plan.items():
        by_partition = read_partitions(bootstrap, topic, parts)
        assert sum(map(len, by_partition.values())) == count, f"{topic}: {sum(map(len, by_partition.values()))} of {count}"
        check_log(by_partition, produced[topic], acked[topic])



def test_topics_and_records_come_back_on_an_empty_disk_after_a_graceful_stop(kafka):
    config = kafka.config(topics=[{"match": "policy3/#", "partitions": 3}])
    node = kafka.s3_node(config=config)
    b = node.bootstrap
    create_topic(b, "made5", 5)
    plan = {"policy3": (3, 300), "made5": (5, 250), "auto1": (1, 100)}
    produced, acked = produce_topics(b, plan, random.Random(1))
    check_all(b, plan, produced, acked)

    assert node.stop() == 0, node.log_tail()
    kafka.wipe(node)
    node.start()
    check_all(node.bootstrap, plan, produced, acked)
    more = CLIENTS["confluent"].produce(node.bootstrap, [("made5", 4, Rec(b"after", b"empty disk"))])
    assert more == [(4, 50)]


def test_acked_records_with_ack_object_come_back_on_an_empty_disk_after_kill_9(kafka):
    config = kafka.config(topic_defaults={"ack": "object"}, topics=[{"match": "obj3/#", "partitions": 3}])
    node = kafka.s3_node(config=config)
    b = node.bootstrap
    create_topic(b, "objmade2", 2)
    plan = {"obj3": (3, 150), "objmade2": (2, 100)}
    produced, acked = produce_topics(b, plan, random.Random(2))
    node.kill()
    kafka.wipe(node)
    node.start()
    check_all(node.bootstrap, plan, produced, acked)
