"""Schema evolution (issue 10): a restart with another `columns` evolves the table's schema
instead of making a new table. Added columns are NULL in the rows written before and hold values
in the rows after; columns dropped from the config stay in the table with their old values; the
table keeps its uuid and every kept column its field id, and the schema id goes up.
"""

import json

import pytest

pytest.register_assert_rewrite("lakehouse_harness")

from lakehouse_harness import Sent, assert_no_problems, check_rows  # noqa: E402

pytest_plugins = ["lakehouse_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def config(lake, name, columns):
    return lake.config(name, topics=[{"match": "env/#", "lakehouse": "iceberg", "commit_interval_ms": 500,
                                      "columns": columns}])


def batch(start, n, columns):
    """Payloads carrying temp, unit and hum, whichever columns the table has now."""
    out = []
    for i in range(start, start + n):
        doc = {"i": i, "temp": i / 4, "unit": f"u{i % 3}", "hum": i * 10}
        want = {"temp": i / 4, "unit": f"u{i % 3}", "hum": i * 10}
        out.append(Sent(f"env/room{i % 4}", json.dumps(doc).encode(),
                        want={c: (want[c] if c in columns else None) for c in ("temp", "unit", "hum")}))
    return out


def field_ids(t):
    return {f.name: f.field_id for f in t.schema().fields}


def test_changing_columns_evolves_the_same_table(lake):
    table = lake.embedded("env")
    v1 = {"temp": "double"}
    node = lake.node(config=config(lake, "v1.toml", v1))
    first = batch(0, 300, v1)
    assert all(rc == 0 for rc in lake.publisher(node, "env-1").send(first).values())
    table.wait_count(len(first), 120, node)
    t1 = table.py_table()
    uuid1, schema1, ids1 = t1.metadata.table_uuid, t1.metadata.current_schema_id, field_ids(t1)
    assert "temp" in ids1 and "unit" not in ids1, ids1
    assert node.stop() == 0

    v2 = {"temp": "double", "unit": "string"}
    node.config = config(lake, "v2.toml", v2)
    node.start()
    second = batch(300, 300, v2)
    assert all(rc == 0 for rc in lake.publisher(node, "env-2").send(second).values())
    table.wait_count(len(first) + len(second), 120, node)
    t2 = table.py_table()
    ids2 = field_ids(t2)
    assert t2.metadata.table_uuid == uuid1, "a new table instead of the evolved one"
    assert t2.metadata.current_schema_id > schema1, (schema1, t2.metadata.current_schema_id)
    assert {k: ids2[k] for k in ids1} == ids1, f"field ids changed: {ids1} -> {ids2}"
    assert ids2["unit"] not in ids1.values(), f"the new column reuses a field id: {ids2}"
    for reader, rows in (("DuckDB", table.duck_rows()), ("pyiceberg", table.py_rows())):
        assert_no_problems(check_rows(rows, first + second, columns=("temp", "unit"), reader=reader))
    assert node.stop() == 0

    # Dropping a column from the config keeps it (and its values) in the table.
    v3 = {"unit": "string", "hum": "long"}
    node.config = config(lake, "v3.toml", v3)
    node.start()
    third = batch(600, 300, v3)
    assert all(rc == 0 for rc in lake.publisher(node, "env-3").send(third).values())
    table.wait_count(len(first) + len(second) + len(third), 120, node)
    t3 = table.py_table()
    ids3 = field_ids(t3)
    assert t3.metadata.table_uuid == uuid1
    assert t3.metadata.current_schema_id > t2.metadata.current_schema_id
    assert {k: ids3[k] for k in ids2} == ids2, f"field ids changed: {ids2} -> {ids3}"
    for reader, rows in (("DuckDB", table.duck_rows()), ("pyiceberg", table.py_rows())):
        old = [r for r in rows if json.loads(r["payload"])["i"] < 600]
        assert_no_problems(check_rows(old, first + second, columns=("temp", "unit", "hum"), reader=reader))
        new = [r for r in rows if json.loads(r["payload"])["i"] >= 600]
        assert_no_problems(check_rows(new, third, columns=("unit", "hum"), reader=reader))
