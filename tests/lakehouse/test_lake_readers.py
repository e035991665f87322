"""The readers the lakehouse tests trust, checked without silt: DuckDB and its extensions load
from the wheels with nothing fetched, and a table in silt's layout, written here by pyiceberg into
SeaweedFS (through its Iceberg REST catalog), reads back the same through every path the other
tests use (DuckDB `ATTACH` and `iceberg_scan` via `version-hint.text`, pyiceberg's REST catalog
and `StaticTable`). So when a silt test fails, the reader side is known to work; and
`check_rows` is shown to catch a duplicate, a loss and a wrong value.
"""

import json
import time

import pytest

pytest.register_assert_rewrite("lakehouse_harness")

from lakehouse_harness import (  # noqa: E402
    ENVELOPE, NAMESPACE, TABLE_BUCKET, EmbeddedTable, Sent, assert_no_problems, check_rows, duckdb_connect,
    kafka_partition, make_payload, seeded,
)

pytest_plugins = ["lakehouse_harness"]

COLUMNS = {"temp": "double", "unit": "string", "ts": "timestamp", "n": "long", "ok": "boolean", "i": "int",
           "f": "float"}


def test_duckdb_loads_iceberg_httpfs_and_avro_from_the_wheels_alone():
    con = duckdb_connect()
    loaded = dict(con.execute("SELECT extension_name, loaded FROM duckdb_extensions()").fetchall())
    assert all(loaded.get(e) for e in ("iceberg", "httpfs", "avro")), loaded
    settings = dict(con.execute("SELECT name, value FROM duckdb_settings() WHERE name IN "
                                "('autoinstall_known_extensions', 'autoload_known_extensions')").fetchall())
    assert settings == {"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}, settings
    import pyiceberg
    import pyiceberg_core  # noqa: F401 - the day() transform needs it
    assert pyiceberg.__version__ == "0.12.0"


def _silt_like_schema():
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType, BooleanType, DoubleType, FloatType, IntegerType, ListType, LongType, MapType, NestedField,
        StringType, TimestamptzType,
    )
    types = {"double": DoubleType(), "string": StringType(), "timestamp": TimestamptzType(), "long": LongType(),
             "boolean": BooleanType(), "int": IntegerType(), "float": FloatType()}
    fields = [
        NestedField(1, "topic", StringType()), NestedField(2, "topic_levels", ListType(100, StringType())),
        NestedField(3, "stream", StringType()), NestedField(4, "partition", IntegerType()),
        NestedField(5, "offset", LongType()), NestedField(6, "timestamp", TimestamptzType()),
        NestedField(7, "key", BinaryType()), NestedField(8, "payload", BinaryType()),
        NestedField(9, "qos", IntegerType()),
        NestedField(10, "properties", MapType(101, StringType(), 102, StringType(), value_required=False)),
    ]
    fields += [NestedField(11 + i, c, types[t]) for i, (c, t) in enumerate(COLUMNS.items())]
    return Schema(*fields)


def _rows_for(sent, partitions, t0_ms):
    offsets = {}
    rows = []
    for i, s in enumerate(sent):
        p = kafka_partition(s.key, partitions)
        stream = s.topic.split("/")[0]
        off = offsets.get((stream, p), 0)
        offsets[(stream, p)] = off + 1
        props = dict(s.user)
        if s.content_type:
            props["mqtt.content_type"] = s.content_type
        row = {"topic": s.topic, "topic_levels": s.topic.split("/"), "stream": stream, "partition": p,
               "offset": off, "timestamp": (t0_ms + i * 400_000) * 1000, "key": s.key, "payload": s.payload,
               "qos": s.qos, "properties": list(props.items())}
        row.update({c: s.want.get(c) for c in COLUMNS})
        rows.append(row)
    return rows, offsets


def test_a_table_in_silts_layout_reads_back_through_every_reader(lake):
    import pyarrow as pa
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    rng = seeded("readers")
    sent = []
    for i in range(600):
        topic = rng.choice(["plant", "plant/a/b", "plant//x", "plant/line1/dev2/", "plant/größe/✓"])
        payload, want = make_payload(rng, f"{topic}#{i}", COLUMNS)
        user = (("device", topic), ("ünï", "✓")) if i % 7 == 0 else ()
        sent.append(Sent(topic, payload, qos=i % 2, user=user, content_type="application/json" if i % 5 == 0 else None,
                         want=want))
    sent.append(Sent("plant/empty", b"", want={c: None for c in COLUMNS}))
    t0 = int(time.time() * 1000) - 3 * 86_400_000  # spans several day partitions
    rows, offsets = _rows_for(sent, 3, t0)

    cat = lake.s3.catalog()
    cat.create_namespace_if_not_exists(NAMESPACE)
    schema = _silt_like_schema()
    spec = PartitionSpec(PartitionField(source_id=6, field_id=1000, transform=DayTransform(), name="timestamp_day"))
    table = cat.create_table((NAMESPACE, "probe"), schema=schema, partition_spec=spec)
    data = pa.Table.from_pylist(rows, schema=table.schema().as_arrow())  # the catalog assigns field ids
    silt_offsets = json.dumps({f"{s}/{p}": n for (s, p), n in offsets.items()})
    half = len(rows) // 2
    table.append(data.slice(0, half), snapshot_properties={"silt.offsets": "{}"})
    table = cat.load_table((NAMESPACE, "probe"))
    table.append(data.slice(half), snapshot_properties={"silt.offsets": silt_offsets})

    via_rest = lake.seaweedfs_table("probe")
    assert via_rest.wait_count(len(rows), 30) == len(rows)
    columns = tuple(COLUMNS)
    for name, got in (("DuckDB ATTACH", via_rest.duck_rows()), ("pyiceberg REST", via_rest.py_rows())):
        assert_no_problems(check_rows(got, sent, partitions=3, columns=columns, reader=name))
    assert via_rest.summary()["silt.offsets"] == silt_offsets
    assert [f.name for f in via_rest.py_table().schema().fields[:len(ENVELOPE)]] == list(ENVELOPE)

    # The layout silt's own catalog writes: version-hint.text (just N) beside vN.metadata.json.
    location = via_rest.py_table().location()
    meta = via_rest.py_table().metadata_location
    version = int(meta.rsplit("/", 1)[-1].split(".")[0].lstrip("v"))
    key = location.removeprefix(f"s3://{TABLE_BUCKET}/")
    lake.s3.client().put_object(Bucket=TABLE_BUCKET, Key=f"{key}/metadata/version-hint.text", Body=str(version).encode())
    by_path = EmbeddedTable(lake.s3, location)
    for name, got in (("DuckDB iceberg_scan", by_path.duck_rows()), ("pyiceberg StaticTable", by_path.py_rows())):
        assert_no_problems(check_rows(got, sent, partitions=3, columns=columns, reader=name))
    days = {f["partition"]["timestamp_day"] for f in by_path.data_files()}
    assert len(days) >= 3, days

    # The checker is not vacuous.
    good = by_path.py_rows()
    dup = good + [dict(good[0], offset=10 ** 9)]
    assert any("more than once" in p for p in check_rows(dup, sent, partitions=3, columns=columns))
    assert any("not in the table" in p for p in check_rows(good[1:], sent, partitions=3, columns=columns))
    wrong = [dict(good[0], payload=good[0]["payload"] + b"!")] + good[1:]
    assert any("nobody sent" in p for p in check_rows(wrong, sent, partitions=3, columns=columns))
    full = next(i for i, r in enumerate(good) if r["temp"] is not None)
    off = [dict(r, temp=r["temp"] + 1) if i == full else r for i, r in enumerate(good)]
    assert any("temp =" in p for p in check_rows(off, sent, partitions=3, columns=columns))
