"""Which Kafka APIs, at which versions, each client sends for produce, consume, offsets and
admin calls: every connection goes through a recording proxy (the broker advertises it), and
every request must be one the broker announces in ApiVersions, at a version in its range (a
client that joined a group or asked for a producer id would show up here).

Run with `-s` to see the table.
"""

import asyncio
import subprocess

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire")

from kafka_clients import CLIENTS, Rec, now_ms  # noqa: E402
from kafka_harness import unique  # noqa: E402
from kafka_wire import API_NAMES, ProtocolRecorder, RawKafka  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def confluent_admin(boot, topic):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec
    a = AdminClient({"bootstrap.servers": boot})
    a.create_topics([NewTopic(topic + "-admin", 2, 1)])[topic + "-admin"].result(30)
    res = ConfigResource("topic", topic)
    a.describe_configs([res])[res].result(30)
    for f in a.list_offsets({TopicPartition(topic, 0): OffsetSpec.for_timestamp(0)}).values():
        f.result(30)
    a.delete_topics([topic + "-admin"])[topic + "-admin"].result(30)
    c = CLIENTS["confluent"].consumer(boot)
    try:
        c.offsets_for_times([TopicPartition(topic, 0, 0)], timeout=30)
        c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30, cached=False)
    finally:
        c.close()


def kafka_python_admin(boot, topic):
    from kafka import TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
    a = KafkaAdminClient(bootstrap_servers=boot)
    try:
        a.create_topics([NewTopic(topic + "-admin", 2, 1)])
        a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        a.delete_topics([topic + "-admin"])
    finally:
        a.close()
    c = CLIENTS["kafka-python"].consumer(boot)
    try:
        tp = TopicPartition(topic, 0)
        c.offsets_for_times({tp: 0})
        c.beginning_offsets([tp])
        c.end_offsets([tp])
    finally:
        c.close()


def aiokafka_admin(boot, topic):
    async def run():
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        a = AIOKafkaAdminClient(bootstrap_servers=boot)
        await a.start()
        try:
            await a.create_topics([NewTopic(topic + "-admin", 2, 1)])
            await a.delete_topics([topic + "-admin"])
        finally:
            await a.close()
        c = AIOKafkaConsumer(bootstrap_servers=boot, group_id=None, enable_auto_commit=False)
        await c.start()
        try:
            tp = TopicPartition(topic, 0)
            await c.offsets_for_times({tp: 0})
            await c.beginning_offsets([tp])
            await c.end_offsets([tp])
        finally:
            await c.stop()
    asyncio.run(run())


def kcat_admin(boot, topic):
    for args in (["-L"], ["-Q", "-t", f"{topic}:0:0"]):
        out = subprocess.run(["kcat", "-b", boot, *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr


ADMIN = {"kcat": kcat_admin, "confluent": confluent_admin, "kafka-python": kafka_python_admin,
         "aiokafka": aiokafka_admin}


def test_each_client_uses_only_apis_and_versions_the_broker_serves(kafka):
    rec = ProtocolRecorder()
    kafka.on_cleanup(rec.close)
    node = kafka.node(config=kafka.config(kafka={"advertised": f"127.0.0.1:{rec.port}"}))
    rec.start(node.kafka_port)
    r = RawKafka(node.kafka_port)
    kafka.on_cleanup(r.close)
    served = r.api_versions()
    boot = f"127.0.0.1:{rec.port}"

    table = {}
    for name, client in CLIENTS.items():
        topic = unique(f"census-{name}")
        rec.take()
        client.produce(boot, [(topic, 0, Rec(b"k", b"v", (("h", b"1"),), None if name == "kcat" else now_ms()))],
                       codec="gzip")
        client.consume(boot, {(topic, 0): (0, 1)})
        ADMIN[name](boot, topic)
        table[name] = rec.take()

    lines = []
    for name, seen in table.items():
        lines.append(f"{CLIENTS[name].versions()}:")
        for (key, version), count in sorted(seen.items()):
            lines.append(f"    {API_NAMES.get(key, key)} v{version} x{count}")
    print("\nKafka requests per client (through the recording proxy):\n" + "\n".join(lines))

    for name, seen in table.items():
        assert seen, f"{name}: nothing went through the proxy"
        for key, version in seen:
            assert key in served, f"{name} sent {API_NAMES.get(key, key)} (key {key}), which the broker does not serve"
            lo, hi = served[key]
            assert lo <= version <= hi, f"{name} sent {API_NAMES.get(key, key)} v{version}, served {lo}..{hi}"
