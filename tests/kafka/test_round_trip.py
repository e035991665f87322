"""Produce and consume byte-identical through four real clients, every codec, mixed.

Each producer (kcat, confluent-kafka, kafka-python, aiokafka) writes the same kind of record
set to one topic per codec (none, gzip, snappy, lz4, zstd); then every consumer reads every one
of those topics from offset 0, and what it returns must be what was produced: key (null, empty
and set), value (null = tombstone, empty, binary, 1 MiB), headers (several, binary values,
empty values, non-ASCII names, in order) and the CreateTime timestamp (as set by the producer,
or the producer's clock for kcat, which cannot set one), at dense offsets from 0, and the
offsets the producer's delivery reports named.

Repeated header names are kept, in order, and null header values stay null (their own tests).
"""

import random

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire")

from kafka_clients import CLIENTS, CODECS, MiB, Rec, assert_records, now_ms  # noqa: E402
from kafka_harness import unique  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

NAMES = list(CLIENTS)


def big_value(rnd):
    """1 MiB: half random (incompressible), half a repeated pattern (compressible)."""
    half = MiB // 2
    return rnd.randbytes(half) + (b"silt-" * (half // 5 + 1))[:half]


def record_set(tag, producer):
    """About 30 records covering what a Kafka record can be. kcat sends headers from its
    command line, so its header values are text without NUL."""
    rnd = random.Random(tag)
    sets_ts = CLIENTS[producer].sets_timestamps
    t0 = now_ms() - 3_600_000
    binary = b"text" if producer == "kcat" else bytes([0, 1, 2, 0x7F, 0x80, 0xFE, 0xFF])
    common = (("trace-id", b"4bf92f3577b34da6"), ("bin", binary), ("empty", b""),
              ("ünïcödé-näme", "välue ✓".encode()), ("content-type", b"application/octet-stream"))
    recs = []

    def add(key, value, headers=(), dt=None):
        ts = None if not sets_ts else t0 + (len(recs) * 10 if dt is None else dt)
        recs.append(Rec(key, value, tuple(headers), ts))

    for i in range(16):
        key = None if i in (3, 11) else b"" if i == 5 else f"key-{i}".encode()
        add(key, rnd.randbytes(rnd.randrange(1, 3000)), common)
    add(b"out-of-order-time", b"earlier than the record before it", common, dt=-5_000)
    add(b"tombstone", None)
    if producer == "confluent":
        # kcat skips an empty input message; kafka-python and aiokafka refuse "Need at least
        # one: key or value".
        add(None, None)
    add(b"empty-value", b"", (("only", b"one"),))
    add(b"big", big_value(rnd), (("size", b"1MiB"),))
    for i in range(4):
        add(f"after-big-{i}".encode(), rnd.randbytes(64), common)
    add("ключ/日本".encode(), "значение".encode(), (("h", b"v"),))
    return recs


@pytest.mark.parametrize("producer", NAMES)
def test_every_consumer_reads_what_each_producer_wrote(kafka, producer):
    node = kafka.node()
    p = CLIENTS[producer]
    produced = {}
    for codec in CODECS:
        topic = unique(f"rt-{producer}-{codec}")
        recs = record_set(topic, producer)
        t0 = now_ms()
        acks = p.produce(node.bootstrap, [(topic, 0, r) for r in recs], codec)
        t1 = now_ms()
        if p.reports_offsets:
            assert acks == [(0, i) for i in range(len(recs))], f"{producer} {codec}: delivery reports {acks}"
        produced[topic] = (recs, (t0 - 1000, t1 + 1000), codec)

    seen_times = {}
    for consumer in NAMES:
        wants = {(t, 0): (0, len(recs)) for t, (recs, _, _) in produced.items()}
        got = CLIENTS[consumer].consume(node.bootstrap, wants)
        for t, (recs, clock, codec) in produced.items():
            assert_records(recs, got[(t, 0)], clock=clock, what=f"{producer} -[{codec}]-> {consumer}")
        seen_times[consumer] = {t: [g.timestamp for g in got[(t, 0)]] for t in produced}
    # Timestamps the producer's clock gave (kcat) are the same whoever reads them.
    assert all(times == seen_times[NAMES[0]] for times in seen_times.values()), "consumers disagree on timestamps"

    # Reading from the middle: the records from there on, nothing before.
    topic, (recs, clock, _) = next(iter(produced.items()))
    for consumer in NAMES:
        got = CLIENTS[consumer].consume(node.bootstrap, {(topic, 0): (len(recs) - 6, 6)})
        assert_records(recs[-6:], got[(topic, 0)], first_offset=len(recs) - 6, clock=clock,
                       what=f"{consumer} from offset {len(recs) - 6}")


DUPLICATE_HEADERS = (("a", b"1"), ("b", b"2"), ("a", b"3"), ("a", b""))

@pytest.mark.parametrize("producer", NAMES)
def test_repeated_header_names_are_kept_in_order(kafka, producer):
    node = kafka.node()
    topic = unique(f"dup-{producer}")
    recs = [Rec(b"k", b"v", DUPLICATE_HEADERS, None if producer == "kcat" else now_ms())]
    t0 = now_ms()
    CLIENTS[producer].produce(node.bootstrap, [(topic, 0, r) for r in recs])
    got = CLIENTS["confluent"].consume(node.bootstrap, {(topic, 0): (0, 1)})
    assert_records(recs, got[(topic, 0)], clock=(t0 - 1000, now_ms() + 1000), what=producer)


@pytest.mark.parametrize("producer", ["confluent", "aiokafka"])  # kcat and kafka-python cannot send one
def test_null_header_values_are_kept(kafka, producer):
    node = kafka.node()
    topic = unique(f"nullh-{producer}")
    recs = [Rec(b"k", b"v", (("null", None), ("set", b"x")), now_ms())]
    CLIENTS[producer].produce(node.bootstrap, [(topic, 0, r) for r in recs])
    for consumer in ("confluent", "kafka-python", "aiokafka"):
        got = CLIENTS[consumer].consume(node.bootstrap, {(topic, 0): (0, 1)})
        assert_records(recs, got[(topic, 0)], what=f"{producer} -> {consumer}")
