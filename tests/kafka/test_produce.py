"""Produce semantics a producer relies on beyond one client's round trip:

- acks 0, 1 and all: every record lands, in order; acks 1 and all report its offset;
- several producers at once (four confluent-kafka producers and an MQTT publisher) into one
  partition: each delivery report's offset holds exactly that record, offsets stay dense and
  each producer's records keep their order;
- `kafka.auto_create_topics = false`: a produce to an unknown topic fails, CreateTopics works.
"""

import random
import threading

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire")

from kafka_clients import CLIENTS, Rec, assert_records, now_ms  # noqa: E402
from kafka_harness import is_success, unique  # noqa: E402
from kafka_wire import RawKafka, record_batch  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def records(tag, n, rnd):
    return [Rec(f"{tag}-{i}".encode(), f"{tag}#{i}#".encode() + rnd.randbytes(rnd.randrange(0, 600)),
                (("producer", tag.encode()),)) for i in range(n)]


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_every_acks_setting_lands_every_record_in_order(kafka, acks):
    node = kafka.node()
    topic = unique(f"acks{acks}")
    recs = records(f"acks{acks}", 500, random.Random(acks))
    reports = CLIENTS["confluent"].produce(node.bootstrap, [(topic, 0, r) for r in recs], codec="lz4",
                                           acks=acks)
    if acks == "0":
        assert all(o is None for _, o in reports), f"acks=0: no offsets are known, yet {reports[:3]}"
    else:
        assert reports == [(0, i) for i in range(len(recs))]
    got = CLIENTS["kafka-python"].consume(node.bootstrap, {(topic, 0): (0, len(recs))})
    assert_records(recs, got[(topic, 0)])


def test_concurrent_producers_get_the_offsets_their_records_are_at(kafka):
    node = kafka.node()
    topic = "shared"
    rnd = random.Random(9)
    plans = {f"p{i}": records(f"p{i}", 1500, random.Random(i)) for i in range(4)}
    reports, errors = {}, []

    def run(tag):
        try:
            reports[tag] = CLIENTS["confluent"].produce(
                node.bootstrap, [(topic, 0, r) for r in plans[tag]], codec=["none", "gzip", "zstd", "snappy"][int(tag[1])],
                **{"linger.ms": 1, "batch.num.messages": 50})
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append((tag, e))

    # MQTT messages of topic "shared/..." land in the same single partition meanwhile.
    pub = kafka.mqtt(node, "shared-mqtt")
    threads = [threading.Thread(target=run, args=(t,)) for t in plans]
    for t in threads:
        t.start()
    mqtt_sent = []
    for i in range(200):
        payload = f"mqtt#{i}#".encode() + rnd.randbytes(100)
        assert is_success(pub.publish(f"shared/dev{i % 3}", payload))
        mqtt_sent.append(payload)
    for t in threads:
        t.join(300)
    assert not errors, errors

    total = sum(map(len, plans.values())) + len(mqtt_sent)
    got = CLIENTS["confluent"].consume(node.bootstrap, {(topic, 0): (0, total)})[(topic, 0)]
    assert [g.offset for g in got] == list(range(total)), "offsets not dense"
    at = {g.offset: g for g in got}
    for tag, recs in plans.items():
        offsets = [o for _, o in reports[tag]]
        assert offsets == sorted(offsets), f"{tag}: its records out of order"
        for r, (p, o) in zip(recs, reports[tag]):
            g = at[o]
            assert (p, g.key, g.value, g.headers) == (0, r.key, r.value, r.headers), \
                f"{tag}: offset {o} from its delivery report holds {g.key!r}, not {r.key!r}"
    mqtt_got = [g.value for g in got if g.key and g.key.startswith(b"shared/")]
    assert mqtt_got == mqtt_sent, "MQTT messages missing, changed or out of order"


def test_no_auto_creation_when_switched_off(kafka):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic
    node = kafka.node(config=kafka.config(kafka={"auto_create_topics": False}))
    b = node.bootstrap
    # librdkafka waits topic.metadata.propagation.max.ms for the topic to appear, then gives up.
    p = CLIENTS["confluent"].producer(b, **{"topic.metadata.propagation.max.ms": 1000})
    out = []
    p.produce("nowhere", b"x", on_delivery=lambda err, msg: out.append(err))
    assert p.flush(60) == 0
    assert out[0] is not None and out[0].code() in (KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART), out
    r = RawKafka(node.kafka_port)
    kafka.on_cleanup(r.close)
    assert r.metadata(["nowhere"])["topics"]["nowhere"][0] == 3, "UNKNOWN_TOPIC_OR_PARTITION"
    assert r.produce("nowhere", 0, record_batch([(b"k", b"v", [], now_ms())])) == (3, -1)
    admin = AdminClient({"bootstrap.servers": b})
    assert "nowhere" not in admin.list_topics(timeout=30).topics
    admin.create_topics([NewTopic("made", 2, 1)])["made"].result(30)
    assert CLIENTS["confluent"].produce(b, [("made", 1, Rec(b"k", b"v"))]) == [(1, 0)]
