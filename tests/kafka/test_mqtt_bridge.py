"""One dataset, both ways: MQTT in → Kafka out, Kafka in → MQTT out (live, retained, and to a
persistent session that was offline).

The rule (DESIGN.md point 6): MQTT topic `a/b/c` belongs to Kafka topic `a`; the record key is
the full MQTT topic, the value the payload, MQTT 5 user properties the first headers, verbatim
and in order (repeats kept), other properties under `mqtt.*`; the partition is Kafka's default
partitioner's (murmur2) for the key, computed here in Python. Back: a record of topic `a` whose
key is a valid MQTT topic under `a/` reaches that MQTT topic's subscribers at QoS 1, any other
key (or none) the MQTT topic `a`; headers become user properties; a header `mqtt.retain=true`
makes it retained.
"""

import hashlib
import queue
import random
import time

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire")

from kafka_clients import CLIENTS, Rec, now_ms  # noqa: E402
from kafka_harness import SESSION_FOREVER, is_success, mqtt_properties  # noqa: E402
from kafka_wire import kafka_partition, murmur2  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_murmur2_is_kafkas():
    """Vectors from Kafka's UtilsTest, and kafka-python's own implementation."""
    from kafka.partitioner.default import murmur2 as kafka_python_murmur2
    vectors = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
               b"a-little-bit-longer-string": -1486304829, b"abc": 479470107,
               b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971}
    for data, signed in vectors.items():
        assert murmur2(data) == signed & 0xFFFFFFFF, data
    rnd = random.Random(1)
    for n in range(64):
        data = rnd.randbytes(n)
        assert murmur2(data) & 0x7FFFFFFF == kafka_python_murmur2(data) & 0x7FFFFFFF, data


def consume_all(bootstrap, topic, partitions):
    """Every record of every partition, read with confluent-kafka: {partition: [Got]}."""
    from confluent_kafka import TopicPartition
    c = CLIENTS["confluent"].consumer(bootstrap)
    try:
        ends = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False) for p in range(partitions)]
    finally:
        c.close()
    wants = {(topic, p): (0, hi) for p, (lo, hi) in enumerate(ends) if hi > 0}
    assert all(lo == 0 for lo, _ in ends), ends
    got = CLIENTS["confluent"].consume(bootstrap, wants) if wants else {}
    return {p: got.get((topic, p), []) for p in range(partitions)}


def partition_count(bootstrap, topic):
    from confluent_kafka.admin import AdminClient
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    t = md.topics[topic]
    assert t.error is None, t.error
    return len(t.partitions)


def test_mqtt_publishes_are_kafka_records_keyed_by_topic_on_murmur2_partitions(kafka):
    config = kafka.config(topics=[{"match": "plant/#", "partitions": 4}])
    node = kafka.node(config=config)
    pub = kafka.mqtt(node, "plant-publisher")
    rnd = random.Random(7)
    topics = ["plant"] + [f"plant/line{i}/dev{j}" for i in range(3) for j in range(4)]
    sent = []  # (topic, payload, user properties, correlation)
    t0 = now_ms()
    for rnd_no in range(3):
        for t in topics:
            payload = bytes(range(256)) + rnd.randbytes(rnd.randrange(0, 2000))
            user = [("device", t), ("round", str(rnd_no)), ("dup", "first"), ("dup", "second"), ("ünï", "✓")]
            corr = rnd.randbytes(16)
            props = mqtt_properties(user, content_type="application/x-silt-test",
                                    response_topic="plant/replies", correlation_data=corr)
            rc = pub.publish_with(t, payload, props)
            assert is_success(rc), f"PUBACK {rc:#x} for {t}"
            sent.append((t, payload, user, corr))
    t1 = now_ms()

    assert partition_count(node.bootstrap, "plant") == 4
    by_partition = consume_all(node.bootstrap, "plant", 4)
    assert sum(map(len, by_partition.values())) == len(sent), {p: len(v) for p, v in by_partition.items()}
    assert len([p for p, v in by_partition.items() if v]) >= 3, "murmur2 spread 13 keys over fewer than 3 partitions"

    seen = {t: [] for t in topics}
    for p, recs in by_partition.items():
        assert [g.offset for g in recs] == list(range(len(recs))), f"partition {p}: offsets not dense from 0"
        for g in recs:
            topic = g.key.decode()
            assert topic in seen, f"unexpected key {g.key!r}"
            want_p = kafka_partition(g.key, 4)
            assert p == want_p, f"{topic}: partition {p}, Kafka's default partitioner says {want_p}"
            assert t0 - 1000 <= g.timestamp <= t1 + 1000, f"{topic}: timestamp {g.timestamp} outside {t0}..{t1}"
            seen[topic].append(g)

    for t in topics:
        want = [s for s in sent if s[0] == t]
        got = seen[t]
        assert len(got) == len(want), f"{t}: {len(got)} records for {len(want)} publishes"
        for i, ((_, payload, user, corr), g) in enumerate(zip(want, got)):
            assert g.value == payload, f"{t} #{i}: value differs from the payload"
            n = len(user)
            assert list(g.headers[:n]) == [(k, v.encode()) for k, v in user], \
                f"{t} #{i}: headers {g.headers}, user properties {user}"
            rest = dict(g.headers[n:])
            assert all(k.startswith("mqtt.") for k in rest), f"{t} #{i}: non-mqtt.* header after user properties: {rest}"
            assert rest.get("mqtt.content_type") == b"application/x-silt-test", rest
            assert rest.get("mqtt.response_topic") == b"plant/replies", rest
            assert rest.get("mqtt.correlation_data") == corr, rest


def user_properties(msg):
    return list(getattr(msg.properties, "UserProperty", []) or [])


def receive(client, n, timeout=60):
    """`n` messages from a client's queue (or from a queue)."""
    inbox = getattr(client, "messages", client)
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{len(out)} of {n} MQTT messages after {timeout}s: "
                                 f"{[(m.topic, _brief(bytes(m.payload), user_properties(m))) for m in out]}")
        try:
            out.append(inbox.get(timeout=min(left, 1)))
        except queue.Empty:
            pass
    return out


def _brief(payload, user):
    return (len(payload), hashlib.sha256(payload).hexdigest()[:12], user)


def assert_delivered(msgs, expected):
    """`msgs` (paho messages) are `expected` [(mqtt topic, key, payload, user properties)]: the
    same multiset, all QoS 1, and in the order produced among the records of one key (one
    partition: Kafka orders nothing across partitions)."""
    got_by_topic, want_by_topic, keys = {}, {}, {}
    for m in msgs:
        got_by_topic.setdefault(m.topic, []).append(_brief(bytes(m.payload), user_properties(m)))
        assert m.qos == 1, f"{m.topic}: QoS {m.qos}"
    for t, key, payload, user in expected:
        want_by_topic.setdefault(t, []).append(_brief(payload, list(user)))
        keys.setdefault(t, set()).add(key)
    assert sorted(got_by_topic) == sorted(want_by_topic), \
        f"MQTT topics {sorted(got_by_topic)}, expected {sorted(want_by_topic)}"
    for t, want in want_by_topic.items():
        got = got_by_topic[t]
        if len(keys[t]) > 1:
            got, want = sorted(got, key=repr), sorted(want, key=repr)
        assert got == want, f"{t}: received (size, sha256, user properties) {got}, expected {want}"


def routed(stream, key):
    """The MQTT topic Silt's rule gives a record of `stream` with `key`."""
    try:
        k = key.decode() if key is not None else None
    except UnicodeDecodeError:
        k = None
    if k and k.startswith(stream + "/") and not set(k) & {"+", "#", "\0"}:
        return k
    return stream


def test_kafka_records_reach_live_mqtt_subscribers_and_retained(kafka):
    config = kafka.config(topics=[{"match": "plant/#", "partitions": 3}])
    node = kafka.node(config=config)
    sub = kafka.mqtt(node, "live-sub")
    sub.subscribe("plant/#", qos=1)  # also matches "plant" itself
    rnd = random.Random(3)
    keys = [b"plant/line1/temp", b"plant/line2/hum", b"plant/line1/temp", b"other/x", None, b"plant/+/x",
            b"plant", b"\xff\xfeplant/bad-utf8", b"plantx/y", b"plant/line3/empty", b"plant/line2/hum"]
    recs = []
    for i, k in enumerate(keys):
        value = b"" if k == b"plant/line3/empty" else rnd.randbytes(rnd.randrange(1, 500))
        recs.append(Rec(k, value, (("unit", b"C"), ("seq", str(i).encode()), ("dup-free", "ünï".encode()))))
    acks = CLIENTS["confluent"].produce(node.bootstrap, [("plant", None, r) for r in recs],
                                        partitioner="murmur2_random")
    for r, (p, _) in zip(recs, acks):
        if r.key is not None:
            assert p == kafka_partition(r.key, 3), f"{r.key!r}: librdkafka's murmur2_random put it on {p}"
    expected = [(routed("plant", r.key), r.key, r.value, [(k, v.decode()) for k, v in r.headers]) for r in recs]
    msgs = receive(sub, len(recs))
    assert_delivered(msgs, expected)
    assert not any(m.retain for m in msgs), "retain set on records that did not ask for it"

    # A record asking to be retained: live subscribers get it, and so does a later one, as retained.
    door = Rec(b"plant/status/door", b"open", (("mqtt.retain", b"true"), ("by", b"kafka")))
    CLIENTS["kafka-python"].produce(node.bootstrap, [("plant", None, door)])
    (live,) = receive(sub, 1)
    assert (live.topic, bytes(live.payload), user_properties(live)) == ("plant/status/door", b"open", [("by", "kafka")])
    assert not live.retain, "a live delivery carries retain=0 (no retain-as-published)"
    later = kafka.mqtt(node, "later-sub")
    later.subscribe("plant/status/#", qos=1)
    (kept,) = receive(later, 1)
    assert (kept.topic, bytes(kept.payload), kept.retain) == ("plant/status/door", b"open", True)
    assert user_properties(kept) == [("by", "kafka")]


def test_kafka_records_reach_a_persistent_session_that_was_offline(kafka):
    node = kafka.node()
    s = kafka.mqtt(node, "fleet-session", clean_start=False, session_expiry=SESSION_FOREVER)
    s.subscribe("fleet/#", qos=1)
    s.close()

    rnd = random.Random(5)
    recs = [Rec(f"fleet/truck{i % 5}/gps".encode(), rnd.randbytes(rnd.randrange(1, 800)),
                (("seq", str(i).encode()), ("driver", f"d{i % 3}".encode())))
            for i in range(60)]
    recs.append(Rec(None, b"no key: to the stream's own topic", (("seq", b"60"),)))
    CLIENTS["kafka-python"].produce(node.bootstrap, [("fleet", None, r) for r in recs], codec="lz4")

    back = kafka.mqtt(node, "fleet-session", clean_start=False, session_expiry=SESSION_FOREVER)
    assert back.session_present, "the persistent session was not kept"
    expected = [(routed("fleet", r.key), r.key, r.value, [(k, v.decode()) for k, v in r.headers]) for r in recs]
    assert_delivered(receive(back, len(recs)), expected)

    # Online again: the next record arrives live.
    more = Rec(b"fleet/truck9/gps", b"live again", (("seq", b"61"),))
    CLIENTS["aiokafka"].produce(node.bootstrap, [("fleet", None, more)])
    assert_delivered(receive(back, 1), [("fleet/truck9/gps", more.key, b"live again", [("seq", "61")])])


def test_an_offline_session_gets_kafka_records_acknowledged_before_a_kill_9(kafka):
    node = kafka.node()
    s = kafka.mqtt(node, "crash-session", clean_start=False, session_expiry=SESSION_FOREVER)
    s.subscribe("depot/#", qos=1)
    s.close()
    rnd = random.Random(6)
    recs = [Rec(f"depot/bay{i % 4}".encode(), rnd.randbytes(rnd.randrange(1, 1500)), (("seq", str(i).encode()),))
            for i in range(200)]
    CLIENTS["confluent"].produce(node.bootstrap, [("depot", None, r) for r in recs], codec="zstd",
                                 partitioner="murmur2_random")
    node.kill()
    node.start()
    back = kafka.mqtt(node, "crash-session", clean_start=False, session_expiry=SESSION_FOREVER)
    assert back.session_present, "the persistent session did not survive kill -9"
    expected = [(routed("depot", r.key), r.key, r.value, [(k, v.decode()) for k, v in r.headers]) for r in recs]
    assert_delivered(receive(back, len(recs)), expected)


def test_kafka_records_reach_a_shared_subscription_once_each(kafka):
    node = kafka.node()
    inbox = queue.Queue()  # both members deliver here
    members = [kafka.mqtt(node, f"share-{i}", on_message=inbox.put) for i in range(2)]
    for m in members:
        m.subscribe("$share/workers/jobs/#", qos=1)
    rnd = random.Random(12)
    recs = [Rec(f"jobs/queue{i % 3}".encode(), f"job {i} ".encode() + rnd.randbytes(50), (("job", str(i).encode()),))
            for i in range(60)]
    CLIENTS["confluent"].produce(node.bootstrap, [("jobs", None, r) for r in recs], partitioner="murmur2_random")
    got = receive(inbox, len(recs))
    assert sorted(bytes(m.payload) for m in got) == sorted(r.value for r in recs), "each job exactly once"
    for m in got:
        i = int(bytes(m.payload).split(b" ")[1])
        assert (m.topic, user_properties(m), m.qos) == (f"jobs/queue{i % 3}", [("job", str(i))], 1)
