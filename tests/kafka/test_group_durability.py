"""Committed group offsets are as durable as the records: they live in the log (`__silt_groups`)
and so in the bucket.

1. Offsets committed by confluent-kafka (explicit commits with metadata, a second commit over
   a first), by kafka-python, and by a group member that consumed and left, come back after
   kill -9 (same data directory), then after a graceful stop and a restart on an EMPTY data
   directory from the same SeaweedFS bucket; a new member resumes at them.
2. Under retention (segments sealed every 300 ms, records kept 1.5 s): once the log start
   moved past the records around a commit and retention deleted their objects, the committed
   offset is still answered, also after a restart on an empty data directory.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire", "kafka_groups")

from kafka_clients import CLIENTS, Rec  # noqa: E402
from kafka_groups import ConfluentMember, committed, create_topic, group_config, watermarks  # noqa: E402
from kafka_harness import unique, wait_until  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PARTS = [0, 1, 2]


def confluent_commit(bootstrap, group, topic, offsets, metadata=None):
    """Commits {partition: offset} for `group` without joining it (a simple consumer)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tps = [TopicPartition(topic, p, o, metadata=metadata) for p, o in offsets.items()]
        for tp in c.commit(offsets=tps, asynchronous=False):
            assert tp.error is None, tp.error
    finally:
        c.close()


def confluent_metadata(bootstrap, group, topic, partitions=PARTS):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return {tp.partition: tp.metadata for tp in c.committed([TopicPartition(topic, p) for p in partitions], timeout=30)}
    finally:
        c.close()


def kafka_python_commit(bootstrap, group, topic, offsets, metadata):
    from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        c.commit({TopicPartition(topic, p): OffsetAndMetadata(o, metadata, -1) for p, o in offsets.items()})
    finally:
        c.close()


def kafka_python_offsets(bootstrap, group):
    """{(topic, partition): (offset, metadata)} through KafkaAdminClient (OffsetFetch, all topics)."""
    from kafka.admin import KafkaAdminClient
    a = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        got = a.list_group_offsets({group: None})[group]
        return {(tp.topic, tp.partition): (om.offset, om.metadata) for tp, om in got.items()}
    finally:
        a.close()


def test_committed_offsets_survive_kill_9_and_a_restart_on_an_empty_disk(kafka):
    node = kafka.s3_node(config=group_config(kafka))
    topic = unique("dur")
    g_conf, g_kp, g_member = unique("g-conf"), unique("g-kp"), unique("g-member")
    create_topic(node.bootstrap, topic, 3)
    CLIENTS["confluent"].produce(node.bootstrap, [(topic, p, Rec(None, f"{p}-{i}".encode()))
                                                  for p in PARTS for i in range(10)])
    confluent_commit(node.bootstrap, g_conf, topic, {0: 2, 1: 5, 2: 7}, metadata="first")
    confluent_commit(node.bootstrap, g_conf, topic, {0: 3}, metadata="second")  # the newer commit wins
    kafka_python_commit(node.bootstrap, g_kp, topic, {0: 9, 2: 1}, "from kafka-python")
    m = ConfluentMember(node.bootstrap, g_member, topic, "durable").start()
    kafka.on_cleanup(m.close)
    wait_until(lambda: len(m.snapshot()[1]) == 30, 30, what="the member's 30 records")
    m.close()

    want = {g_conf: {0: 3, 1: 5, 2: 7}, g_kp: {0: 9, 1: -1001, 2: 1}, g_member: {0: 10, 1: 10, 2: 10}}
    want_kp = {(topic, 0): (9, "from kafka-python"), (topic, 2): (1, "from kafka-python")}

    def check(when):
        b = node.bootstrap
        for group, offsets in want.items():
            assert committed(b, group, topic, PARTS) == offsets, f"{group} {when}"
        assert confluent_metadata(b, g_conf, topic) == {0: "second", 1: "first", 2: "first"}, when
        assert kafka_python_offsets(b, g_kp) == want_kp, when

    check("before any restart")
    node.kill()
    node.start()
    check("after kill -9")
    assert node.stop() == 0, node.log_tail()
    kafka.wipe(node)
    node.start()
    check("after a restart on an empty data directory")

    CLIENTS["confluent"].produce(node.bootstrap, [(topic, p, Rec(None, f"{p}-new".encode())) for p in PARTS])
    again = ConfluentMember(node.bootstrap, g_member, topic, "durable-2").start()
    kafka.on_cleanup(again.close)
    wait_until(lambda: len(again.snapshot()[1]) == 3, 30, what="the three new records")
    again.close()
    assert sorted(again.snapshot()[1]) == [(p, 10, f"{p}-new".encode()) for p in PARTS]


def test_committed_offsets_outlive_the_records_they_point_at(kafka):
    config = group_config(kafka, storage={"segment_max_age_ms": 300},
                          tiering={"retention_check_interval_ms": 200},
                          topic_defaults={"retention_ms": 1500})
    node = kafka.s3_node(config=config)
    topic, group = unique("ret"), unique("g-ret")
    b = node.bootstrap
    create_topic(b, topic, 1)
    mark = node.log_mark()
    CLIENTS["confluent"].produce(b, [(topic, 0, Rec(None, f"early-{i}".encode())) for i in range(5)])
    confluent_commit(b, group, topic, {0: 5}, metadata="kept")
    # Records after the commit, so the commit's own segment is older than the last of them.
    CLIENTS["confluent"].produce(b, [(topic, 0, Rec(None, f"late-{i}".encode())) for i in range(5)])

    wait_until(lambda: watermarks(b, topic, [0])[0] == (10, 10), 60, interval=0.3,
               what="the log start to move past all ten records")
    node.wait_log("retention deleted expired objects", 30, since=mark)
    assert committed(b, group, topic, [0]) == {0: 5}
    assert confluent_metadata(b, group, topic, [0])[0] == "kept"

    assert node.stop() == 0, node.log_tail()
    kafka.wipe(node)
    node.start()
    b = node.bootstrap
    assert watermarks(b, topic, [0])[0] == (10, 10), "the records stay expired"
    assert committed(b, group, topic, [0]) == {0: 5}, "the committed offset is gone after retention"
    assert confluent_metadata(b, group, topic, [0])[0] == "kept"
