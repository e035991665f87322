"""silt's own Iceberg REST catalog (the read side: config, namespaces, list and load tables) on
its admin HTTP listener, over the embedded object-store catalog (issue 10): pyiceberg
`load_catalog(type="rest")` and DuckDB `ATTACH ... (TYPE iceberg)` find every table without
knowing a path, and each load serves the table's current version.
"""

import pytest
import requests

pytest.register_assert_rewrite("lakehouse_harness")

from lakehouse_harness import (  # noqa: E402
    NAMESPACE, Sent, assert_no_problems, check_rows, duckdb_connect, make_payload, seeded,
)

pytest_plugins = ["lakehouse_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PLANT = {"temp": "double", "unit": "string"}
FLEET = {"lat": "double", "lon": "double"}


def messages(rng, prefix, columns, n, start=0):
    out = []
    for i in range(start, start + n):
        topic = f"{prefix}/d{i % 5}/{'pos' if prefix == 'fleet' else 'temp'}"
        payload, want = make_payload(rng, f"{topic}#{i}", columns)
        out.append(Sent(topic, payload, want=want))
    return out


def test_silts_catalog_endpoint_lists_and_loads_every_table_for_both_readers(lake):
    from pyiceberg.exceptions import NoSuchTableError
    rng = seeded("silt-catalog")
    cfg = lake.config(admin={"listen": "127.0.0.1:0"}, topics=[
        {"match": "plant/#", "lakehouse": "iceberg", "commit_interval_ms": 500, "columns": PLANT},
        {"match": "fleet/+/pos", "lakehouse": "iceberg", "commit_interval_ms": 500, "columns": FLEET},
    ])
    node = lake.node(config=cfg)
    plant = messages(rng, "plant", PLANT, 500)
    fleet = messages(rng, "fleet", FLEET, 500)
    assert all(rc == 0 for rc in lake.publisher(node, "pub").send(plant + fleet).values())
    lake.embedded("plant").wait_count(len(plant), 120, node)
    lake.embedded("fleet_pos").wait_count(len(fleet), 120, node)

    r = requests.get(f"{node.iceberg_uri}/v1/config", timeout=10)
    assert r.status_code == 200, (r.status_code, r.text[:300])
    assert isinstance(r.json().get("defaults"), dict) and isinstance(r.json().get("overrides"), dict), r.json()

    cat = lake.silt_table(node, "plant").catalog()
    assert (NAMESPACE,) in cat.list_namespaces(), cat.list_namespaces()
    assert sorted(cat.list_tables(NAMESPACE)) == [(NAMESPACE, "fleet_pos"), (NAMESPACE, "plant")]
    with pytest.raises(NoSuchTableError):
        cat.load_table((NAMESPACE, "no_such_table"))

    kafka = {**lake.kafka_records(node, "plant", 1), **lake.kafka_records(node, "fleet", 1)}
    for name, sent, cols in (("plant", plant, PLANT), ("fleet_pos", fleet, FLEET)):
        view = lake.silt_table(node, name)
        embedded = lake.embedded(name)
        assert view.py_table().metadata_location == embedded.py_table().metadata_location, \
            "silt's catalog serves another metadata version than version-hint.text names"
        for reader, rows in (("DuckDB ATTACH silt", view.duck_rows()), ("pyiceberg silt catalog", view.py_rows())):
            assert_no_problems(check_rows(rows, sent, kafka=kafka, columns=tuple(cols), reader=f"{name} by {reader}"))

    con = duckdb_connect(lake.s3)
    try:
        con.execute(f"ATTACH 'silt' AS s (TYPE iceberg, ENDPOINT '{node.iceberg_uri}', AUTHORIZATION_TYPE 'none')")
        listed = {(row[1], row[2]) for row in con.execute("SHOW ALL TABLES").fetchall() if row[0] == "s"}
    finally:
        con.close()
    assert listed == {(NAMESPACE, "plant"), (NAMESPACE, "fleet_pos")}, listed

    # A later commit is what the next load sees, through either reader.
    more = messages(rng, "plant", PLANT, 200, start=500)
    assert all(rc == 0 for rc in lake.publisher(node, "pub-2").send(more).values())
    lake.embedded("plant").wait_count(len(plant) + len(more), 120, node)
    view = lake.silt_table(node, "plant")
    assert view.count() == len(plant) + len(more), view.last_error
    assert len(view.py_rows()) == len(plant) + len(more)
