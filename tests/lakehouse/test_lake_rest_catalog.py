"""Tables in an external Iceberg REST catalog (issue 10, `catalog = "rest"`): SeaweedFS's own,
which authenticates with OAuth2 client credentials (by default silt's AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY) and says where each table's files go. Read through that catalog by
pyiceberg and DuckDB (`ATTACH`).

And the catalog down (SeaweedFS stopped, which takes the bucket with it): silt goes on serving
MQTT, says `lakehouse commit failed`, and once the catalog is back every message is in the table
exactly once.
"""

import json
import time

import pytest

pytest.register_assert_rewrite("lakehouse_harness")

from lakehouse_harness import (  # noqa: E402
    NAMESPACE, Sent, assert_no_problems, check_rows, make_payload, seeded,
)

pytest_plugins = ["lakehouse_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

COLUMNS = {"temp": "double", "unit": "string", "ts": "timestamp"}


def rest_config(lake, **extra):
    s3 = lake.s3
    return lake.config(
        lakehouse={"catalog": "rest", "catalog_uri": s3.catalog_uri, "warehouse": s3.warehouse, **extra},
        topics=[{"match": "cell/#", "lakehouse": "iceberg", "commit_interval_ms": 500, "columns": COLUMNS}])


def messages(rng, n, start=0):
    out = []
    for i in range(start, start + n):
        topic = f"cell/c{i % 7}/s{i % 3}"
        payload, want = make_payload(rng, f"{topic}#{i}", COLUMNS)
        out.append(Sent(topic, payload, user=(("i", str(i)),) if i % 9 == 0 else (), want=want))
    return out


def check_table(lake, node, view, sent):
    kafka = lake.kafka_records(node, "cell", 1)
    for reader, rows in (("DuckDB via the catalog", view.duck_rows()), ("pyiceberg via the catalog", view.py_rows())):
        assert_no_problems(check_rows(rows, sent, kafka=kafka, columns=tuple(COLUMNS), reader=reader))
    ends = {f"{s}/{p}": o + 1 for s, p, o in sorted(kafka)}
    assert json.loads(view.summary()["silt.offsets"]) == ends


def test_tables_in_a_rest_catalog_read_through_that_catalog(lake):
    rng = seeded("rest")
    node = lake.node(config=rest_config(lake))
    sent = messages(rng, 2000)
    codes = lake.publisher(node, "cell-pub").send(sent)
    assert all(rc == 0 for rc in codes.values())
    view = lake.seaweedfs_table("cell")
    view.wait_count(len(sent), 120, node)
    check_table(lake, node, view, sent)

    t = view.py_table()
    assert t.location().startswith(f"s3://{lake.s3.warehouse.removeprefix('s3://').rstrip('/')}/"), t.location()
    files = view.data_files()
    assert files and all(f["file_path"].startswith(t.location() + "/") for f in files), \
        f"data files outside the table location {t.location()}: {[f['file_path'] for f in files][:3]}"
    assert (NAMESPACE, "cell") in lake.s3.catalog().list_tables(NAMESPACE)
    assert lake.s3.list(f"{lake.prefix}/lakehouse/") == {}, "the REST case wrote an object-store catalog too"


def test_the_catalog_down_keeps_mqtt_serving_and_loses_no_row(lake):
    rng = seeded("rest-down")
    s3 = lake.s3
    node = lake.node(config=rest_config(lake, catalog_credential=s3.credential))
    view = lake.seaweedfs_table("cell")
    first = messages(rng, 300)
    assert all(rc == 0 for rc in lake.publisher(node, "cell-pub-1").send(first).values())
    view.wait_count(len(first), 120, node)

    watcher = lake.mqtt(node, "cell-watcher")
    watcher.subscribe("cell/#", qos=1)
    mark = node.log_mark()
    s3.stop()
    down_at = time.monotonic()
    during = messages(rng, 300, start=300)
    codes = lake.publisher(node, "cell-pub-2").send(during)
    assert all(rc == 0 for rc in codes.values()), f"publishes refused while the catalog is down: {set(codes.values())}"
    got = {bytes(watcher.get(30).payload) for _ in during}
    assert got == {s.payload for s in during}, "the subscriber missed messages while the catalog was down"
    node.wait_log(r"lakehouse commit failed", 60, since=mark)
    assert node.running
    print(f"catalog down for {time.monotonic() - down_at:.1f}s")
    s3.start()

    view.wait_count(len(first) + len(during), 180, node)
    after = messages(rng, 300, start=600)
    assert all(rc == 0 for rc in lake.publisher(node, "cell-pub-3").send(after).values())
    view.wait_count(len(first) + len(during) + len(after), 120, node)
    check_table(lake, node, view, first + during + after)
