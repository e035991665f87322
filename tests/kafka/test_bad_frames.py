"""Bad frames on a raw socket close only that connection, with a log line naming the peer and
the reason; another client's produce and consume, on connections open across the event, go on
unaffected (every record consumed byte for byte), and so does an idle second raw connection.

Cases: garbage after a length prefix, a header that does not decode, a body that does not
decode, an unknown API key, an unsupported version, a frame over `kafka.max_request_bytes`
(default 100 MiB: only the prefix is sent; the broker must not wait for the body), a negative
length. One broker per case: the broker writes that log line at most once per 10 s.

And the one exception the protocol makes: an ApiVersions request of a version the broker does
not speak is answered (UNSUPPORTED_VERSION with the versions it does speak), not closed.
"""

import re
import struct
import time

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire")

from kafka_clients import CLIENTS, Got, Rec, assert_records  # noqa: E402
from kafka_harness import unique  # noqa: E402
from kafka_wire import API_API_VERSIONS, RawKafka, Reader, i16, i32, string  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def frame(body):
    return i32(len(body)) + body


def header(key, version, correlation=1, client_id="bad-frames"):
    return i16(key) + i16(version) + i32(correlation) + string(client_id)


CASES = {
    "garbage": (frame(b"\xde\xad\xbe\xef" * 8), r"unknown API key"),
    "header": (frame(i16(3) + i16(1) + i32(1) + i16(0x7FFF) + b"short"), r"malformed request header"),
    "body": (frame(header(3, 1) + i32(1000) + b"\x00"), r"malformed request body"),
    "unknown-api-key": (frame(header(0x7F00, 0)), r"unknown API key 32512"),
    # Metadata is flexible from v9: header v2 ends with an (empty) tagged-field section.
    "unsupported-version": (frame(header(3, 99) + b"\x00" + b"\x00\x00"), r"Metadata version 99 is not supported"),
    "over-max-request-bytes": (struct.pack(">i", 200 << 20), r"exceeds the limit of 104857600"),
    "negative-length": (struct.pack(">i", -5), r"negative frame length -5"),
}


class Bystander:
    """A confluent-kafka producer and consumer kept open across the bad frame."""

    def __init__(self, kafka, bootstrap, topic):
        self.topic = topic
        self.p = CLIENTS["confluent"].producer(bootstrap, **{"linger.ms": 0})
        self.c = CLIENTS["confluent"].consumer(bootstrap)
        kafka.on_cleanup(self.c.close)
        from confluent_kafka import TopicPartition
        self.c.assign([TopicPartition(topic, 0, 0)])
        self.sent, self.got = [], []

    def produce(self, n):
        for _ in range(n):
            r = Rec(f"k{len(self.sent)}".encode(), bytes([len(self.sent) % 256]) * (len(self.sent) + 1),
                    (("n", str(len(self.sent)).encode()),))
            self.p.produce(self.topic, value=r.value, key=r.key, headers=list(r.headers), partition=0)
            self.sent.append(r)
        assert self.p.flush(60) == 0

    def consume_all(self, timeout=60):
        deadline = time.monotonic() + timeout
        while len(self.got) < len(self.sent):
            assert time.monotonic() < deadline, f"bystander consumed {len(self.got)} of {len(self.sent)}"
            for m in self.c.consume(100, 0.5):
                assert not m.error(), m.error()
                self.got.append(Got(m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                                    tuple(m.headers() or ()), m.timestamp()[1], m.timestamp()[0] == 1, "confluent"))
        assert_records([Rec(r.key, r.value, r.headers) for r in self.sent], self.got, what="bystander")


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_frame_closes_only_its_connection(kafka, case):
    data, reason = CASES[case]
    kafka.expect_closed_connections()
    node = kafka.node()
    topic = unique("bystander")
    by = Bystander(kafka, node.bootstrap, topic)
    by.produce(50)
    by.consume_all()
    idle = RawKafka(node.kafka_port, client_id="idle")
    kafka.on_cleanup(idle.close)
    assert idle.metadata([topic])["topics"][topic][0] == 0

    bad = RawKafka(node.kafka_port)
    kafka.on_cleanup(bad.close)
    mark = node.log_mark()
    bad.send_raw(data)
    assert bad.closed_by_peer(timeout=60), f"{case}: the broker kept the connection open"
    line = node.wait_log(rf"kafka connection closed.*peer=127\.0\.0\.1:{bad.local_port}\b", 60, since=mark)
    assert re.search(reason, line), f"{case}: the log line does not say why: {line}"

    closed = node.lines("kafka connection closed", since=mark)
    assert closed == [line], f"other connections closed too: {closed}"
    by.produce(50)
    by.consume_all()
    assert idle.metadata([topic])["topics"][topic][0] == 0, "the idle connection was affected"
    assert node.running


def test_an_api_versions_request_of_an_unknown_version_is_answered(kafka):
    node = kafka.node()
    r = RawKafka(node.kafka_port)
    kafka.on_cleanup(r.close)
    # v99 of a flexible request: header v2 (client id, then an empty tagged-field section).
    data, correlation = r.frame(API_API_VERSIONS, 99, b"\x00")
    r.send_raw(data)
    resp = Reader(r.read_frame())
    assert resp.i32() == correlation
    assert resp.i16() == 35, "UNSUPPORTED_VERSION"
    versions = dict((k, (lo, hi)) for k, lo, hi in resp.array(lambda x: (x.i16(), x.i16(), x.i16())))
    assert versions.get(API_API_VERSIONS, (0, -1))[0] == 0, versions
    assert r.api_versions()[API_API_VERSIONS][1] >= 3, "the connection stays and answers v0"
