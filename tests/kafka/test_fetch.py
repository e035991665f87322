"""Fetch as consumers use it:

- a long poll (`max_wait_ms` far beyond the test's deadline, `kafka.max_fetch_wait_ms` raised to
  allow it) is answered once a record arrives, whether a Kafka producer or an MQTT publisher
  wrote it and whether the partition held anything before: woken by dispatch, not by its
  timeout;
- small fetch limits page through a partition record by record, and a record larger than every
  limit still comes back (KIP-74), through librdkafka and kafka-python.
"""

import random
import threading
import time

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire")

from kafka_clients import CLIENTS, Rec, assert_records, now_ms  # noqa: E402
from kafka_harness import is_success  # noqa: E402
from kafka_wire import RawKafka, record_batch  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

FOREVER_MS = 600_000  # the long poll's max wait: ten times the test's deadline


class WaitingFetch(threading.Thread):
    """A raw Fetch v4 with min_bytes 1 and a 600 s max wait, on its own connection."""

    def __init__(self, port, topic, partition, offset):
        super().__init__(daemon=True, name="waiting-fetch")
        self.conn = RawKafka(port, client_id="long-poll", timeout=FOREVER_MS / 1000 + 30)
        self.args = (topic, partition, offset)
        self.result = self.error = None

    def run(self):
        try:
            topic, partition, offset = self.args
            self.result = self.conn.fetch(topic, partition, offset, max_wait_ms=FOREVER_MS, min_bytes=1)
        except Exception as e:  # noqa: BLE001 (reported by answer())
            self.error = e

    def answer(self, timeout=60):
        self.join(timeout)
        assert not self.is_alive(), f"the fetch was not answered within {timeout}s of the record's arrival"
        assert self.error is None, self.error
        return self.result


@pytest.mark.parametrize("writer", ["kafka", "mqtt"])
@pytest.mark.parametrize("partition_state", ["written-before", "never-written"])
def test_a_long_poll_is_answered_when_a_record_arrives(kafka, writer, partition_state):
    node = kafka.node(config=kafka.config(kafka={"max_fetch_wait_ms": FOREVER_MS}))
    topic = "poll"
    start = 0
    if partition_state == "written-before":
        CLIENTS["confluent"].produce(node.bootstrap, [(topic, 0, Rec(b"poll", b"before"))])
        start = 1
    else:
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": node.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    f = WaitingFetch(node.kafka_port, topic, 0, start)
    kafka.on_cleanup(f.conn.close)
    f.start()
    # Give the request time to reach the broker and park (no signal says it has). Too short a
    # pause makes the test pass without a wait, never fail wrongly.
    time.sleep(0.5)
    payload = random.Random(1).randbytes(300)
    if writer == "kafka":
        CLIENTS["kafka-python"].produce(node.bootstrap, [(topic, 0, Rec(b"poll", payload))])
    else:
        pub = kafka.mqtt(node, "poller")
        assert is_success(pub.publish("poll/sensor", payload))
    err, hw, recs = f.answer()
    assert (err, hw) == (0, start + 1)
    assert [(x.offset, x.value) for x in recs] == [(start, payload)]


def test_small_fetch_limits_page_through_and_a_big_record_still_comes_back(kafka):
    node = kafka.node()
    topic = "paged"
    rnd = random.Random(4)
    recs = [Rec(f"k{i}".encode(), rnd.randbytes(300), (("i", str(i).encode()),), now_ms()) for i in range(150)]
    recs.insert(75, Rec(b"huge", rnd.randbytes(300_000), (), now_ms()))
    CLIENTS["confluent"].produce(node.bootstrap, [(topic, 0, r) for r in recs], codec="gzip")
    wants = {(topic, 0): (0, len(recs))}
    got = CLIENTS["confluent"].consume(node.bootstrap, wants, **{"max.partition.fetch.bytes": 512,
                                                                 "fetch.max.bytes": 1024, "message.max.bytes": 1000})
    assert_records(recs, got[(topic, 0)], what="librdkafka, 512-byte partition limit")
    got = CLIENTS["kafka-python"].consume(node.bootstrap, wants, max_partition_fetch_bytes=512, fetch_max_bytes=1024)
    assert_records(recs, got[(topic, 0)], what="kafka-python, 512-byte partition limit")
    # By hand: one response holds whole records only, and at least one.
    r = RawKafka(node.kafka_port)
    kafka.on_cleanup(r.close)
    err, _, first = r.fetch(topic, 0, 75, max_bytes=100)
    assert err == 0 and [x.offset for x in first] == [75] and len(first[0].value) == 300_000
    err, _, some = r.fetch(topic, 0, 0, max_bytes=2000)
    assert err == 0 and 1 <= len(some) <= 6 and [x.offset for x in some] == list(range(len(some)))
    assert r.produce(topic, 0, record_batch([(b"k", b"v", [], now_ms())])) == (0, len(recs))
