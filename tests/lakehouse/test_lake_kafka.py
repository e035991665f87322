"""Records produced over Kafka land in the same table as MQTT messages (issue 10): a record of
Kafka topic `plant` whose key is an MQTT topic under `plant/` belongs to that MQTT topic, any
other key (or none) to the MQTT topic `plant`; the row keeps the record's key, value, headers (as
properties), position and CreateTime, and the table is partitioned by the day of that time.
"""

import time

import pytest

pytest.register_assert_rewrite("lakehouse_harness", "kafka_clients")

from kafka_clients import CLIENTS, Rec  # noqa: E402
from lakehouse_harness import Sent, assert_no_problems, check_rows, make_payload, seeded  # noqa: E402

pytest_plugins = ["lakehouse_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PARTITIONS = 4
COLUMNS = {"temp": "double", "unit": "string"}
DAY_MS = 86_400_000


def mqtt_topic_of(key):
    """The MQTT topic a record of Kafka topic `plant` belongs to (README: the two views)."""
    try:
        text = key.decode() if key is not None else None
    except UnicodeDecodeError:
        text = None
    if text and text.startswith("plant/") and not any(c in text for c in "+#\0"):
        return text
    return "plant"


def test_kafka_records_land_in_the_same_table_as_mqtt_messages(lake):
    rng = seeded("kafka-into-table")
    cfg = lake.config(topic_defaults={"partitions": PARTITIONS}, topics=[
        {"match": "plant/#", "lakehouse": "iceberg", "commit_interval_ms": 500, "columns": COLUMNS}])
    node = lake.node(config=cfg)

    mqtt_msgs = []
    for i in range(300):
        topic = f"plant/mqtt/d{i % 5}"
        payload, want = make_payload(rng, f"{topic}#{i}", COLUMNS)
        mqtt_msgs.append(Sent(topic, payload, want=want))
    assert all(rc == 0 for rc in lake.publisher(node, "mqtt-pub").send(mqtt_msgs).values())

    base = int(time.time() * 1000) - 3 * DAY_MS
    keys = [f"plant/kafka/d{i}".encode() for i in range(6)] + [b"not-a-topic", b"other/x", None]
    kafka_msgs, items = [], []
    for i in range(300):
        key = keys[i % len(keys)]
        payload, want = make_payload(rng, f"kafka#{i}", COLUMNS)
        headers = (("source", b"kafka"), ("i", str(i).encode()))
        ts = base + i * 15 * 60_000  # three days and more: several day partitions
        items.append(("plant", None, Rec(key, payload, headers, ts)))
        kafka_msgs.append(Sent(mqtt_topic_of(key), payload, qos=None, user=tuple((k, v.decode()) for k, v in headers),
                               want=want, key=key, timestamp_ms=ts, via="kafka"))
    # Kafka's (Java) default partitioner, murmur2 of the key, as silt's MQTT side uses.
    positions = CLIENTS["confluent"].produce(node.bootstrap, items, partitioner="murmur2_random")
    assert all(isinstance(p, tuple) for p in positions), positions[:5]

    table = lake.embedded("plant")
    every = mqtt_msgs + kafka_msgs
    table.wait_count(len(every), 120, node)
    kafka = lake.kafka_records(node, "plant", PARTITIONS)
    for reader, rows in (("DuckDB", table.duck_rows()), ("pyiceberg", table.py_rows())):
        assert_no_problems(check_rows(rows, every, partitions=PARTITIONS, kafka=kafka, columns=tuple(COLUMNS),
                                      reader=reader))
        at = {r["payload"]: (r["partition"], r["offset"]) for r in rows}
        wrong = [(s.key, at.get(s.payload), p) for s, p in zip(kafka_msgs, positions) if at.get(s.payload) != p]
        assert not wrong, f"{reader}: rows not at the position the producer was told, e.g. {wrong[:5]}"
    days = {tuple(sorted(f["partition"].items())) for f in table.data_files()}
    assert len(days) >= 3, f"the records span 4 days, the data files {days}"
