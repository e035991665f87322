"""DescribeConfigs as admin tools and connectors read it: the broker's `message.max.bytes`,
`auto.create.topics.enable` and `num.partitions` from the config file; a topic's
`max.message.bytes`; an unknown topic's UNKNOWN_TOPIC_OR_PARTITION; and the retention a topic's
policy gives (`retention.ms`, `retention.bytes`), which Kafka Connect and ops tools look for.
"""

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire")

from kafka_clients import CLIENTS, Rec  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def configs(bootstrap, kind, name):
    """{key: value} of one resource (confluent-kafka's AdminClient)."""
    from confluent_kafka.admin import AdminClient, ConfigResource
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(kind, name)
    return {k: e.value for k, e in admin.describe_configs([res])[res].result(30).items()}


def test_broker_and_topic_configs_say_what_the_config_file_does(kafka):
    node = kafka.node(config=kafka.config(kafka={"max_message_bytes": 1 << 20, "auto_create_topics": False},
                                          topic_defaults={"partitions": 3}))
    b = node.bootstrap
    broker = configs(b, "broker", "0")
    assert broker.get("message.max.bytes") == str(1 << 20), broker
    assert broker.get("auto.create.topics.enable") == "false", broker
    assert broker.get("num.partitions") == "3", broker

    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": b})
    admin.create_topics([NewTopic("conf", -1, -1)])["conf"].result(30)  # the policy's partition count
    assert len(admin.list_topics("conf", timeout=30).topics["conf"].partitions) == 3
    topic = configs(b, "topic", "conf")
    assert topic.get("max.message.bytes") == str(1 << 20), topic

    from confluent_kafka import KafkaError
    with pytest.raises(Exception) as e:
        configs(b, "topic", "no-such-topic")
    assert e.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, e.value

    # kafka-python reads the same.
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
    ka = KafkaAdminClient(bootstrap_servers=b)
    kafka.on_cleanup(ka.close)
    # (Its default filter, "modified", shows dynamically altered configs only; Silt's come from
    # its config file, STATIC_BROKER_CONFIG.)
    got = ka.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "conf")], config_filter="all")
    assert got["topic"]["conf"]["max.message.bytes"]["config_source"] == "STATIC_BROKER_CONFIG", got
    entry = got["topic"]["conf"].get("max.message.bytes")
    assert entry is not None and entry["value"] == str(1 << 20), got


def test_a_topics_retention_policy_is_reported(kafka):
    node = kafka.node(config=kafka.config(topics=[{"match": "kept/#", "retention_ms": 604800000,
                                                   "retention_bytes": 1 << 30}]))
    CLIENTS["confluent"].produce(node.bootstrap, [("kept", 0, Rec(b"k", b"v"))])
    topic = configs(node.bootstrap, "topic", "kept")
    assert topic.get("retention.ms") == "604800000", topic
    assert topic.get("retention.bytes") == str(1 << 30), topic
    CLIENTS["confluent"].produce(node.bootstrap, [("forever", 0, Rec(b"k", b"v"))])
    assert configs(node.bootstrap, "topic", "forever").get("retention.ms") == "-1", "no limit, in Kafka's words"
