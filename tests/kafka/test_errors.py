"""Errors as a Kafka client sees them, each on a connection that stays usable:

- a record over `kafka.max_message_bytes` (default 2 MiB, reported as `message.max.bytes` by
  DescribeConfigs): MESSAGE_TOO_LARGE in the producer's delivery report, for each client;
- an invalid topic name: INVALID_TOPIC_EXCEPTION (librdkafka: TOPIC_EXCEPTION) from produce,
  Metadata and CreateTopics; internal streams and MQTT-only names are not Kafka topics;
- a fetch above the end, or below the log start (once retention moved it): OFFSET_OUT_OF_RANGE
  (`auto.offset.reset=error` in librdkafka, `auto_offset_reset="none"` in kafka-python), and
  `earliest` resets to the log start;
- CreateTopics of an existing topic: TOPIC_ALREADY_EXISTS (and the other CreateTopics checks);
- a produce (and fetch, ListOffsets) to a partition that does not exist: librdkafka and
  kafka-python refuse it locally, so it is also sent by hand; the broker answers
  UNKNOWN_TOPIC_OR_PARTITION and serves the next request on the same connection.

The harness fails any test after which the broker logged a closed Kafka connection.
"""

import asyncio
import time

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire")

from kafka_clients import CLIENTS, MiB, Rec, now_ms  # noqa: E402
from kafka_harness import unique, wait_until  # noqa: E402
from kafka_wire import RawKafka, record_batch  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MESSAGE_TOO_LARGE, INVALID_TOPIC, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION = 10, 17, 1, 3


def raw(kafka, node):
    r = RawKafka(node.kafka_port)
    kafka.on_cleanup(r.close)
    return r


def confluent_delivery(producer, topic, value, **kw):
    """Produces one record and returns (error or None, offset)."""
    out = []
    producer.produce(topic, value=value, on_delivery=lambda err, msg: out.append((err, msg.offset())), **kw)
    assert producer.flush(60) == 0, "no delivery report within 60 s"
    return out[0]


def describe(bootstrap, kind, name, key):
    from confluent_kafka.admin import AdminClient, ConfigResource
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(kind, name)
    return admin.describe_configs([res])[res].result(30)[key].value


# --- MESSAGE_TOO_LARGE -----------------------------------------------------------------------

def test_a_record_over_max_message_bytes_gets_message_too_large_and_the_connection_stays(kafka):
    from confluent_kafka import KafkaError
    limit = 64 * 1024
    node = kafka.node(config=kafka.config(kafka={"max_message_bytes": limit}))
    b = node.bootstrap
    topic = unique("big")
    assert describe(b, "broker", "0", "message.max.bytes") == str(limit)

    # confluent-kafka: the delivery report says so; the same producer then goes on.
    p = CLIENTS["confluent"].producer(b, **{"message.max.bytes": 1_000_000, "linger.ms": 0})
    err, _ = confluent_delivery(p, topic, b"x" * (limit + 1))
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, f"confluent delivery report: {err}"
    assert not err.retriable()
    err, offset = confluent_delivery(p, topic, b"fits")
    assert (err, offset) == (None, 0), "the refused record must not take an offset"
    assert describe(b, "topic", topic, "max.message.bytes") == str(limit)

    # kafka-python and aiokafka: the future fails with MessageSizeTooLargeError.
    from kafka.errors import MessageSizeTooLargeError
    kp = CLIENTS["kafka-python"].producer(b, max_request_size=1_000_000)
    kafka.on_cleanup(lambda: kp.close(5))
    with pytest.raises(MessageSizeTooLargeError):
        kp.send(topic, b"y" * (limit + 1)).get(60)
    assert kp.send(topic, b"fits too").get(60).offset == 1

    async def aio():
        from aiokafka import AIOKafkaProducer
        from aiokafka.errors import MessageSizeTooLargeError as AioTooLarge
        ap = AIOKafkaProducer(bootstrap_servers=b, max_request_size=1_000_000, linger_ms=0)
        await ap.start()
        try:
            with pytest.raises(AioTooLarge):
                await ap.send_and_wait(topic, b"z" * (limit + 1))
            return (await ap.send_and_wait(topic, b"and this")).offset
        finally:
            await ap.stop()
    assert asyncio.run(aio()) == 2

    # kcat: it reports the failed delivery.
    import subprocess
    out = subprocess.run(["kcat", "-P", "-b", b, "-t", topic, "-X", "message.max.bytes=1000000"],
                         input=b"k" * (limit + 1), capture_output=True, timeout=60)
    assert b"Message size too large" in out.stderr or b"MSG_SIZE_TOO_LARGE" in out.stderr, out.stderr

    # By hand: the same connection serves the next request.
    r = raw(kafka, node)
    big = record_batch([(b"k", b"w" * (limit + 1), [], now_ms())])
    assert r.produce(topic, 0, big) == (MESSAGE_TOO_LARGE, -1)
    assert r.produce(topic, 0, record_batch([(b"k", b"small", [], now_ms())])) == (0, 3)
    err, hw, recs = r.fetch(topic, 0, 0)
    assert (err, hw) == (0, 4)
    assert [x.value for x in recs] == [b"fits", b"fits too", b"and this", b"small"]


def test_the_default_limit_is_two_mib(kafka):
    from confluent_kafka import KafkaError
    node = kafka.node()
    b = node.bootstrap
    topic = unique("default-limit")
    assert describe(b, "broker", "0", "message.max.bytes") == str(2 * MiB)
    p = CLIENTS["confluent"].producer(b, **{"message.max.bytes": 4 * MiB, "linger.ms": 0})
    err, _ = confluent_delivery(p, topic, b"o" * (2 * MiB + 1))
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    value = bytes(range(256)) * ((2 * MiB - 4096) // 256)
    assert confluent_delivery(p, topic, value) == (None, 0)
    got = CLIENTS["kafka-python"].consume(b, {(topic, 0): (0, 1)})[(topic, 0)]
    assert got[0].value == value


# --- invalid topic names ---------------------------------------------------------------------

BAD_NAMES = ["bad topic!", "ümlaut", "__silt_sessions", ".", "x" * 250, "a/b"]


def broker_refusal(name, new_producer, attempts=5):
    """The delivery report of one produce to `name` from a fresh producer: the broker's answer
    as the client reports it. A producer whose metadata already names the topic bad refuses
    produce() itself (_UNKNOWN_TOPIC) without sending anything, and librdkafka can hold such
    metadata from its first request; that refusal says nothing of the broker, so the produce is
    tried again from another fresh producer."""
    from confluent_kafka import KafkaError, KafkaException
    for _ in range(attempts):
        try:
            return confluent_delivery(new_producer(), name, b"x")[0]
        except KafkaException as e:
            if e.args[0].code() != KafkaError._UNKNOWN_TOPIC:
                raise
    pytest.fail(f"librdkafka refused every produce to {name[:20]!r} locally; the broker never answered")


def test_invalid_topic_names_get_invalid_topic_exception(kafka):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic
    node = kafka.node()
    b = node.bootstrap
    for name in BAD_NAMES:
        err = broker_refusal(name, lambda: CLIENTS["confluent"].producer(b, **{"message.timeout.ms": 30000}))
        assert err is not None and err.code() == KafkaError.TOPIC_EXCEPTION, f"produce to {name[:20]!r}: {err}"

    admin = AdminClient({"bootstrap.servers": b})
    for name in BAD_NAMES:
        fut = admin.create_topics([NewTopic(name, 1, 1)])[name]
        with pytest.raises(Exception) as e:
            fut.result(30)
        assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, f"create {name[:20]!r}: {e.value}"

    from kafka.admin import KafkaAdminClient, NewTopic as KNewTopic
    from kafka.errors import InvalidTopicError
    ka = KafkaAdminClient(bootstrap_servers=b)
    kafka.on_cleanup(ka.close)
    with pytest.raises(InvalidTopicError):
        ka.create_topics([KNewTopic("bad topic!", 1, 1)])

    r = raw(kafka, node)
    md = r.metadata(BAD_NAMES + ["fine"])["topics"]
    for name in BAD_NAMES:
        assert md[name][0] == INVALID_TOPIC, f"Metadata for {name[:20]!r}: {md[name]}"
    assert md["fine"][0] == 0, "auto-created on Metadata"
    assert r.produce("bad topic!", 0, record_batch([(None, b"x", [], now_ms())]))[0] == INVALID_TOPIC
    assert r.fetch("fine", 0, 0)[0] == 0, "the connection stays"


def test_internal_and_mqtt_only_streams_are_not_kafka_topics(kafka):
    node = kafka.node()
    c = kafka.mqtt(node, "names", clean_start=False, session_expiry=3600)
    c.subscribe("with space/#", qos=1)  # a persistent session: the broker's own state is written
    for t in ("with space/x", "ümlaut/y", "plain/z"):
        assert c.publish(t, b"m", retain=True) < 0x80
    from confluent_kafka.admin import AdminClient
    topics = set(AdminClient({"bootstrap.servers": node.bootstrap}).list_topics(timeout=30).topics)
    assert topics == {"plain"}, f"Metadata lists {sorted(topics)}"


# --- OFFSET_OUT_OF_RANGE ---------------------------------------------------------------------

def confluent_first(bootstrap, topic, offset, reset, timeout=60):
    """What a confluent consumer assigned at `offset` gets first: ("error", KafkaError) or
    ("record", offset, value)."""
    c = CLIENTS["confluent"].consumer(bootstrap, **{"auto.offset.reset": reset})
    from confluent_kafka import TopicPartition
    try:
        c.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                return ("error", m.error())
            return ("record", m.offset(), m.value())
        raise AssertionError(f"nothing from {topic} at {offset} in {timeout}s")
    finally:
        c.close()


def assert_out_of_range(first):
    from confluent_kafka import KafkaError
    assert first[0] == "error", f"expected an error, got {first}"
    err = first[1]
    assert err.code() == KafkaError._AUTO_OFFSET_RESET and "out of range" in err.str().lower(), err


def test_fetching_above_the_end_is_offset_out_of_range(kafka):
    node = kafka.node()
    b = node.bootstrap
    topic = unique("oor")
    CLIENTS["confluent"].produce(b, [(topic, 0, Rec(f"k{i}".encode(), f"v{i}".encode())) for i in range(5)])

    assert_out_of_range(confluent_first(b, topic, 50, "error"))
    assert confluent_first(b, topic, 50, "earliest") == ("record", 0, b"v0")

    from kafka import TopicPartition
    from kafka.errors import OffsetOutOfRangeError
    c = CLIENTS["kafka-python"].consumer(b)
    kafka.on_cleanup(c.close)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek(tp, 50)
    with pytest.raises(OffsetOutOfRangeError):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            c.poll(timeout_ms=500)

    r = raw(kafka, node)
    assert r.fetch(topic, 0, 6)[:2] == (OFFSET_OUT_OF_RANGE, 5)
    assert r.fetch(topic, 0, -1)[:2] == (OFFSET_OUT_OF_RANGE, 5), "a negative offset is below the log start"
    err, hw, recs = r.fetch(topic, 0, 5)
    assert (err, hw, recs) == (0, 5, []), "at the end: nothing yet, no error"
    assert [x.value for x in r.fetch(topic, 0, 3)[2]] == [b"v3", b"v4"]


def test_fetching_below_the_log_start_after_retention_is_offset_out_of_range(kafka):
    config = kafka.config(storage={"segment_max_age_ms": 500}, tiering={"retention_check_interval_ms": 500},
                          topic_defaults={"retention_ms": 0},
                          topics=[{"match": "short/#", "retention_ms": 2000}])
    node = kafka.node(config=config)
    b = node.bootstrap
    CLIENTS["confluent"].produce(b, [("short", 0, Rec(f"old{i}".encode(), b"expires")) for i in range(5)])
    r = raw(kafka, node)

    def moved():
        err, _, start = r.list_offsets("short", 0, -2)
        assert err == 0
        return start > 0 and start
    start = wait_until(moved, 90, interval=0.5, what="retention to move the log start")
    assert start == 5, f"log start {start}: every record had expired"
    CLIENTS["confluent"].produce(b, [("short", 0, Rec(b"new", b"kept"))])

    assert_out_of_range(confluent_first(b, "short", 0, "error"))
    assert confluent_first(b, "short", 0, "earliest") == ("record", 5, b"kept")
    assert r.fetch("short", 0, 4)[:2] == (OFFSET_OUT_OF_RANGE, 6)
    got = CLIENTS["kafka-python"].consume(b, {("short", 0): (5, 1)})[("short", 0)]
    assert [(g.offset, g.key, g.value) for g in got] == [(5, b"new", b"kept")]


# --- CreateTopics ----------------------------------------------------------------------------

def test_create_topics_of_an_existing_topic_is_topic_already_exists(kafka):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic
    node = kafka.node()
    b = node.bootstrap
    admin = AdminClient({"bootstrap.servers": b})

    def create(name, partitions=1, rf=1, validate_only=False):
        try:
            admin.create_topics([NewTopic(name, partitions, rf)], validate_only=validate_only)[name].result(30)
            return None
        except Exception as e:
            return e.args[0].code()

    assert create("made", 3) is None
    assert create("made", 3) == KafkaError.TOPIC_ALREADY_EXISTS
    assert create("made", 1, validate_only=True) == KafkaError.TOPIC_ALREADY_EXISTS
    CLIENTS["confluent"].produce(b, [("auto-made", 0, Rec(b"k", b"v"))])  # auto-created by the produce
    assert create("auto-made") == KafkaError.TOPIC_ALREADY_EXISTS
    assert create("rf3", 1, rf=3) == KafkaError.INVALID_REPLICATION_FACTOR
    assert create("zero", 0) == KafkaError.INVALID_PARTITIONS
    assert create("checked-only", 2, validate_only=True) is None
    md = admin.list_topics(timeout=30).topics
    assert "checked-only" not in md and "rf3" not in md
    assert len(md["made"].partitions) == 3

    from kafka.admin import KafkaAdminClient, NewTopic as KNewTopic
    from kafka.errors import TopicAlreadyExistsError
    ka = KafkaAdminClient(bootstrap_servers=b)
    kafka.on_cleanup(ka.close)
    with pytest.raises(TopicAlreadyExistsError):
        ka.create_topics([KNewTopic("made", 3, 1)])

    async def aio():
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic as ANewTopic
        a = AIOKafkaAdminClient(bootstrap_servers=b)
        await a.start()
        try:
            resp = await a.create_topics([ANewTopic("made", 3, 1)])
            return [t[1] for t in resp.topic_errors]
        finally:
            await a.close()
    assert asyncio.run(aio()) == [36]


def test_deleted_topic_is_gone_and_a_new_one_starts_at_zero(kafka):
    from confluent_kafka.admin import AdminClient
    node = kafka.node()
    b = node.bootstrap
    CLIENTS["confluent"].produce(b, [("doomed", 0, Rec(b"k", f"v{i}".encode())) for i in range(3)])
    admin = AdminClient({"bootstrap.servers": b})
    admin.delete_topics(["doomed"])["doomed"].result(30)
    assert "doomed" not in admin.list_topics(timeout=30).topics
    from confluent_kafka import KafkaError
    with pytest.raises(Exception) as e:
        admin.delete_topics(["doomed"])["doomed"].result(30)
    assert e.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    acks = CLIENTS["confluent"].produce(b, [("doomed", 0, Rec(b"k", b"again"))])
    assert acks == [(0, 0)]
    got = CLIENTS["kafka-python"].consume(b, {("doomed", 0): (0, 1)})[("doomed", 0)]
    assert [(g.offset, g.value) for g in got] == [(0, b"again")]


# --- partitions that do not exist ------------------------------------------------------------

def test_a_produce_to_a_partition_that_does_not_exist(kafka):
    from confluent_kafka import KafkaError
    node = kafka.node()
    b = node.bootstrap
    topic = unique("parts")
    CLIENTS["confluent"].produce(b, [(topic, 0, Rec(b"k", b"first"))])

    # The clients refuse it before sending.
    p = CLIENTS["confluent"].producer(b)
    err, _ = confluent_delivery(p, topic, b"x", partition=7)
    assert err is not None and err.code() == KafkaError._UNKNOWN_PARTITION, err
    kp = CLIENTS["kafka-python"].producer(b)
    kafka.on_cleanup(lambda: kp.close(5))
    with pytest.raises((ValueError, AssertionError)):
        kp.send(topic, b"x", partition=7).get(30)

    # The broker, asked anyway.
    r = raw(kafka, node)
    batch = record_batch([(b"k", b"nowhere", [], now_ms())])
    assert r.produce(topic, 7, batch) == (UNKNOWN_TOPIC_OR_PARTITION, -1)
    assert r.produce(topic, -1, batch) == (UNKNOWN_TOPIC_OR_PARTITION, -1)
    assert r.fetch(topic, 7, 0)[0] == UNKNOWN_TOPIC_OR_PARTITION
    assert r.list_offsets(topic, 7, -1)[0] == UNKNOWN_TOPIC_OR_PARTITION
    assert r.produce(topic, 0, record_batch([(b"k", b"second", [], now_ms())])) == (0, 1)
    assert [x.value for x in r.fetch(topic, 0, 0)[2]] == [b"first", b"second"]
    md = r.metadata([topic])["topics"][topic]
    assert md == (0, [(0, 0, 0)]), f"the topic still has one partition: {md}"
