"""ListOffsets as clients use it: by timestamp (kcat `-Q` and `-o s@TS`/`e@TS`, confluent-kafka
`offsets_for_times` and `AdminClient.list_offsets`, kafka-python and aiokafka
`offsets_for_times`), earliest and latest (watermarks, `beginning_offsets`/`end_offsets`), and
the largest timestamp (ListOffsets v7, `OffsetSpec.max_timestamp()`).

Kafka's rule for a time: the earliest offset whose timestamp is at or after it; none (offset
-1, or None in the Python clients) when every record is older.
"""

import asyncio
import re
import subprocess

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire")

from kafka_clients import CLIENTS, Rec, now_ms  # noqa: E402
from kafka_harness import unique  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def create_topic(bootstrap, topic, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def produce_at(bootstrap, topic, times_by_partition):
    """Records at the given timestamps ({partition: [ts]}); returns {partition: [Rec]}."""
    items = [(topic, p, Rec(f"p{p}-{i}".encode(), f"at {ts}".encode(), (), ts))
             for p, times in times_by_partition.items() for i, ts in enumerate(times)]
    acks = CLIENTS["confluent"].produce(bootstrap, items)
    for (_, p, _), ack in zip(items, acks):
        assert ack[0] == p
    return {p: [r for t, q, r in items if q == p] for p in times_by_partition}


def expected_offset(times, ts):
    """Kafka's answer: the earliest offset whose timestamp is >= ts, else -1."""
    return next((o for o, t in enumerate(times) if t >= ts), -1)


# --- the clients' calls --------------------------------------------------------------------

def confluent_for_times(bootstrap, topic, queries):
    from confluent_kafka import TopicPartition
    c = CLIENTS["confluent"].consumer(bootstrap)
    try:
        got = c.offsets_for_times([TopicPartition(topic, p, ts) for p, ts in queries], timeout=30)
        for tp in got:
            assert tp.error is None, tp.error
        return [tp.offset for tp in got]
    finally:
        c.close()


def confluent_watermarks(bootstrap, topic, partitions):
    from confluent_kafka import TopicPartition
    c = CLIENTS["confluent"].consumer(bootstrap)
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False) for p in partitions]
    finally:
        c.close()


def admin_list_offsets(bootstrap, topic, specs):
    """AdminClient.list_offsets: [(offset, timestamp)] for [(partition, OffsetSpec)]."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.list_offsets({TopicPartition(topic, p): spec for p, spec in specs}, request_timeout=30)
    by_tp = {(tp.topic, tp.partition): f.result(30) for tp, f in futures.items()}
    return [(by_tp[(topic, p)].offset, by_tp[(topic, p)].timestamp) for p, _ in specs]


def kafka_python_offsets(bootstrap, topic, queries, partitions):
    from kafka import TopicPartition
    c = CLIENTS["kafka-python"].consumer(bootstrap)
    try:
        found = c.offsets_for_times({TopicPartition(topic, p): ts for p, ts in queries})
        times = [found[TopicPartition(topic, p)] for p, _ in queries]
        tps = [TopicPartition(topic, p) for p in partitions]
        begin, end = c.beginning_offsets(tps), c.end_offsets(tps)
        return ([(-1, -1) if x is None else (x.offset, x.timestamp) for x in times],
                [(begin[tp], end[tp]) for tp in tps])
    finally:
        c.close()


def aiokafka_offsets(bootstrap, topic, queries, partitions):
    async def run():
        from aiokafka import AIOKafkaConsumer, TopicPartition
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        await c.start()
        try:
            found = await c.offsets_for_times({TopicPartition(topic, p): ts for p, ts in queries})
            times = [found[TopicPartition(topic, p)] for p, _ in queries]
            tps = [TopicPartition(topic, p) for p in partitions]
            begin, end = await c.beginning_offsets(tps), await c.end_offsets(tps)
            return ([(-1, -1) if x is None else (x.offset, x.timestamp) for x in times],
                    [(begin[tp], end[tp]) for tp in tps])
        finally:
            await c.stop()
    return asyncio.run(run())


def kcat_query(bootstrap, topic, queries):
    args = ["kcat", "-Q", "-b", bootstrap]
    for p, ts in queries:
        args += ["-t", f"{topic}:{p}:{ts}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    found = {int(m.group(1)): int(m.group(2))
             for m in re.finditer(r"\[(\d+)\]\s+offset\s+(-?\d+)", out.stdout)}
    assert len(found) == len({p for p, _ in queries}), f"kcat -Q printed:\n{out.stdout}"
    return found


def kcat_offsets_consumed(bootstrap, topic, partition, start_spec):
    """Offsets kcat consumes with `-o START_SPEC -e`."""
    out = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-p", str(partition), "-o", start_spec,
                          "-e", "-f", r"%o\n"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [int(x) for x in out.stdout.split()]


# --- tests -----------------------------------------------------------------------------------

def test_offsets_by_time_earliest_and_latest_through_every_client(kafka):
    node = kafka.node()
    b = node.bootstrap
    topic = unique("times")
    create_topic(b, topic, 2)
    t0 = now_ms() - 600_000
    times = {0: [t0 + 1000 * i for i in range(10)], 1: [t0 + 500 + 2000 * i for i in range(5)]}
    produce_at(b, topic, times)

    targets = [t0 - 60_000, t0, t0 + 1, t0 + 4500, t0 + 5000, t0 + 8999, t0 + 9000, t0 + 9001, now_ms() + 60_000]
    queries = [(p, ts) for p in times for ts in targets]
    want = [expected_offset(times[p], ts) for p, ts in queries]
    want_ts = [times[p][o] if o >= 0 else -1 for (p, _), o in zip(queries, want)]

    # confluent-kafka: one query per partition per call (a call holds one time per partition).
    got = [confluent_for_times(b, topic, [q])[0] for q in queries]
    assert got == want, f"confluent offsets_for_times {list(zip(queries, got))}, expected {want}"
    assert confluent_watermarks(b, topic, [0, 1]) == [(0, 10), (0, 5)]

    from confluent_kafka.admin import OffsetSpec
    specs = [(p, OffsetSpec.for_timestamp(ts)) for p, ts in queries[:len(targets)]]
    got = [admin_list_offsets(b, topic, [s])[0] for s in specs]
    assert got == list(zip(want, want_ts))[:len(targets)], f"AdminClient.list_offsets by time: {got}"
    assert admin_list_offsets(b, topic, [(0, OffsetSpec.earliest()), (1, OffsetSpec.earliest())]) \
        == [(0, -1), (0, -1)]
    assert admin_list_offsets(b, topic, [(0, OffsetSpec.latest()), (1, OffsetSpec.latest())]) \
        == [(10, -1), (5, -1)]
    assert admin_list_offsets(b, topic, [(0, OffsetSpec.max_timestamp()), (1, OffsetSpec.max_timestamp())]) \
        == [(9, times[0][9]), (4, times[1][4])]

    # kafka-python and aiokafka: several partitions per call, one time each.
    for name, fn in (("kafka-python", kafka_python_offsets), ("aiokafka", aiokafka_offsets)):
        for ts in targets:
            found, marks = fn(b, topic, [(0, ts), (1, ts)], [0, 1])
            exp = [(expected_offset(times[p], ts), times[p][expected_offset(times[p], ts)]
                    if expected_offset(times[p], ts) >= 0 else -1) for p in (0, 1)]
            assert found == exp, f"{name} offsets_for_times({ts - t0:+} ms from t0): {found}, expected {exp}"
            assert marks == [(0, 10), (0, 5)], f"{name} beginning/end offsets {marks}"

    # kcat: query mode, and consuming from/until a time.
    for ts in targets:
        found = kcat_query(b, topic, [(0, ts), (1, ts)])
        for p in (0, 1):
            exp = expected_offset(times[p], ts)
            assert found[p] == exp, f"kcat -Q {topic}:{p}:{ts}: {found[p]}, expected {exp}"
    assert kcat_offsets_consumed(b, topic, 0, f"s@{t0 + 4500}") == [5, 6, 7, 8, 9]
    assert kcat_offsets_consumed(b, topic, 1, f"s@{t0 + 2501}") == [2, 3, 4]
    assert kcat_offsets_consumed(b, topic, 1, f"s@{t0 + 2500}") == [1, 2, 3, 4]
    assert kcat_offsets_consumed(b, topic, 0, "beginning") == list(range(10))
    assert kcat_offsets_consumed(b, topic, 0, "-3") == [7, 8, 9]


def test_an_empty_partition_answers_zero_and_no_time(kafka):
    node = kafka.node()
    topic = unique("empty")
    create_topic(node.bootstrap, topic, 1)
    assert confluent_watermarks(node.bootstrap, topic, [0]) == [(0, 0)]
    assert confluent_for_times(node.bootstrap, topic, [(0, 0)]) == [-1]
    found, marks = kafka_python_offsets(node.bootstrap, topic, [(0, 0)], [0])
    assert (found, marks) == ([(-1, -1)], [(0, 0)])


def test_offset_for_time_with_timestamps_out_of_order(kafka):
    """Producers set CreateTime in any order; Kafka answers the earliest offset whose timestamp is
    at or after the target (its time index keeps a running maximum; so does Silt's)."""
    node = kafka.node()
    topic = unique("ooo")
    t0 = now_ms() - 600_000
    times = [t0 + 1000, t0 + 5000, t0 + 2000, t0 + 3000, t0 + 6000]
    produce_at(node.bootstrap, topic, {0: times})
    for ts in (t0 + 2500, t0 + 1500, t0 + 4000):
        got = confluent_for_times(node.bootstrap, topic, [(0, ts)])[0]
        assert got == expected_offset(times, ts), f"offsets_for_times({ts - t0} ms): {got}"


def test_max_timestamp_offset_with_timestamps_out_of_order(kafka):
    """MAX_TIMESTAMP answers the record with the largest timestamp, not the newest record."""
    from confluent_kafka.admin import OffsetSpec
    node = kafka.node()
    topic = unique("maxts")
    t0 = now_ms() - 600_000
    times = [t0 + 1000, t0 + 5000, t0 + 2000, t0 + 3000]
    produce_at(node.bootstrap, topic, {0: times})
    got = admin_list_offsets(node.bootstrap, topic, [(0, OffsetSpec.max_timestamp())])
    assert got == [(1, t0 + 5000)], f"max_timestamp: {got}"
