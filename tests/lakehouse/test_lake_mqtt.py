"""MQTT messages become Iceberg rows, each exactly once (issue 10): 20,000 messages on 50 topics
under three tables, JSON and not, some with MQTT 5 properties, read back by DuckDB and pyiceberg
from the bucket with nothing but the table's location.

Tables, from `[[topics]]` (the first matching entry decides): `plant` (filter `plant/#`, name
derived), `fleet_pos` (`fleet/+/pos`: wildcards dropped, levels joined by `_`) and `lab`, which
two entries name. `plant/secret/#` comes first without a lakehouse, so those topics are in no
table; nor are `fleet/+/status` and `misc/x`, which no lakehouse entry matches.
"""

import json
import re
import time

import pytest

pytest.register_assert_rewrite("lakehouse_harness")

from lakehouse_harness import (  # noqa: E402
    ENVELOPE, Sent, assert_no_problems, check_rows, duckdb_connect, make_payload, seeded,
)

pytest_plugins = ["lakehouse_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PARTITIONS = 3
PLANT = {"temp": "double", "unit": "string", "ts": "timestamp", "n": "long", "ok": "boolean", "i": "int", "f": "float"}
FLEET = {"lat": "double", "lon": "double", "ts": "timestamp"}
LAB = {"v": "long", "label": "string"}
TABLES = {"plant": PLANT, "fleet_pos": FLEET, "lab": LAB}

PLANT_TOPICS = ([f"plant/line{i}/dev{j}" for i in range(4) for j in range(6)]
                + ["plant", "plant/line0/dev0/", "plant//x", "plant/größe/✓"])
FLEET_TOPICS = [f"fleet/truck{i}/pos" for i in range(12)]
LAB_TOPICS = [f"lab/{s}/{i}" for s in "ab" for i in range(5)]
OTHER_TOPICS = ["plant/secret/a", "plant/secret/b/c", "fleet/truck0/status", "fleet/truck1/status", "misc/x"]


def table_of(topic):
    if topic.startswith("plant/secret/"):
        return None
    if topic == "plant" or topic.startswith("plant/"):
        return "plant"
    if re.fullmatch(r"fleet/[^/]*/pos", topic):
        return "fleet_pos"
    if topic.startswith("lab/"):
        return "lab"
    return None


def lake_config(lake, interval=500):
    entry = {"lakehouse": "iceberg", "commit_interval_ms": interval}
    return lake.config(topic_defaults={"partitions": PARTITIONS}, topics=[
        {"match": "plant/secret/#", "tier": "object"},
        {"match": "plant/#", **entry, "columns": PLANT},
        {"match": "fleet/+/pos", **entry, "columns": FLEET},
        {"match": "lab/a/#", **entry, "table": "lab", "columns": LAB},
        {"match": "lab/b/#", **entry, "table": "lab", "columns": LAB},
    ])


def make_messages(rng, n_table, n_other):
    table_topics = PLANT_TOPICS + FLEET_TOPICS + LAB_TOPICS
    assert len(table_topics) == 50
    out = []
    for i in range(n_table + n_other):
        topic = rng.choice(table_topics) if i < n_table else rng.choice(OTHER_TOPICS)
        table = table_of(topic)
        cols = TABLES.get(table, PLANT)
        tag = f"{topic}#{i}"
        if i % 1000 == 999:
            payload, want = b"\x00big" + tag.encode() + rng.randbytes(100_000), {c: None for c in cols}
        else:
            payload, want = make_payload(rng, tag, cols)
        user = (("device", topic), ("n", str(i)), ("ünï", "✓")) if i % 10 == 3 else ()
        out.append(Sent(topic, payload, qos=0 if i % 50 == 7 else 1, user=user,
                        content_type="application/json" if i % 15 == 4 else None, want=want))
    rng.shuffle(out)
    out.append(Sent("plant/line0/dev1", b"", want={c: None for c in PLANT}))  # an empty payload
    return out


def test_every_mqtt_message_is_one_row_of_its_table_byte_for_byte(lake):
    rng = seeded("mqtt-20k")
    node = lake.node(config=lake_config(lake))
    msgs = make_messages(rng, 20_000, 500)
    pub = lake.publisher(node, "lake-pub")
    t0 = time.time()
    codes = pub.send(msgs, window=200)
    t1 = time.time()
    assert all(rc == 0 for rc in codes.values()), {rc for rc in codes.values()}
    by_table = {t: [m for m in msgs if table_of(m.topic) == t] for t in TABLES}
    print(f"published {len(msgs)} in {t1 - t0:.1f}s; rows per table {({t: len(v) for t, v in by_table.items()})}")

    tables = {t: lake.embedded(t) for t in TABLES}
    for t, view in tables.items():
        view.wait_count(len(by_table[t]), 120, node)
    kafka = {}
    for stream in ("plant", "fleet", "lab"):
        kafka.update(lake.kafka_records(node, stream, PARTITIONS))

    for t, view in tables.items():
        cols = tuple(TABLES[t])
        for reader, rows in (("DuckDB", view.duck_rows()), ("pyiceberg", view.py_rows())):
            assert_no_problems(check_rows(rows, by_table[t], partitions=PARTITIONS, kafka=kafka, columns=cols,
                                          reader=f"{t} by {reader}"))
            stamps = [r["timestamp"] for r in rows]
            assert (t0 - 2) * 1e6 <= min(stamps) <= max(stamps) <= (t1 + 2) * 1e6, \
                f"{t}: timestamps outside the publishing window"
        check_table_shape(view, TABLES[t])
        check_offsets_summary(view, kafka, all_stream_in_table=(t == "lab"))
        check_sorted_by_topic(lake, view)


def check_table_shape(view, columns):
    """Envelope names and types in order, the projected columns with their types, day(timestamp)
    partitions, and the embedded layout: version-hint.text holds just N of vN.metadata.json."""
    from pyiceberg.types import (
        BinaryType, BooleanType, DoubleType, FloatType, IntegerType, ListType, LongType, MapType, StringType,
        TimestampType, TimestamptzType,
    )
    t = view.py_table()
    schema = t.schema()
    names = [f.name for f in schema.fields]
    assert names[:len(ENVELOPE)] == list(ENVELOPE), names
    assert sorted(names[len(ENVELOPE):]) == sorted(columns), names
    f = {x.name: x.field_type for x in schema.fields}
    want = {"topic": StringType, "stream": StringType, "partition": IntegerType, "offset": LongType,
            "timestamp": TimestamptzType, "key": BinaryType, "payload": BinaryType, "qos": IntegerType}
    for name, typ in want.items():
        assert isinstance(f[name], typ), f"{view.name}.{name} is {f[name]}, expected {typ.__name__}"
    assert isinstance(f["topic_levels"], ListType) and isinstance(f["topic_levels"].element_type, StringType), \
        f["topic_levels"]
    assert (isinstance(f["properties"], MapType) and isinstance(f["properties"].key_type, StringType)
            and isinstance(f["properties"].value_type, StringType)), f["properties"]
    kinds = {"double": (DoubleType,), "string": (StringType,), "long": (LongType,), "int": (IntegerType,),
             "boolean": (BooleanType,), "float": (FloatType,), "timestamp": (TimestamptzType, TimestampType)}
    for c, kind in columns.items():
        assert isinstance(f[c], kinds[kind]), f"{view.name}.{c} is {f[c]}, expected {kind}"
    spec = t.spec()
    assert [(schema.find_field(p.source_id).name, str(p.transform)) for p in spec.fields] == [("timestamp", "day")], spec

    hint = view.version_hint()
    assert re.fullmatch(rb"[0-9]+", hint), f"version-hint.text holds {hint!r}, not just a version number"
    assert t.metadata_location == f"{view.location}/metadata/v{int(hint)}.metadata.json", t.metadata_location
    files = view.data_files()
    assert files, f"{view.name}: no data files"
    for d in files:
        assert d["file_path"].startswith(f"{view.location}/data/") and d["file_path"].endswith(".parquet"), d
    assert sum(d["record_count"] for d in files) == view.count()


def check_offsets_summary(view, kafka, all_stream_in_table):
    """`silt.offsets` in the current snapshot: "stream/partition" -> the next offset to write,
    past every row of that partition and not past the stream's end (at it when every record of
    the stream belongs to the table)."""
    summary = view.summary()
    assert "silt.offsets" in summary, f"{view.name}: snapshot summary {summary}"
    offsets = json.loads(summary["silt.offsets"])
    rows = view.duck_rows()
    last = {}
    for r in rows:
        sp = f"{r['stream']}/{r['partition']}"
        last[sp] = max(last.get(sp, -1), r["offset"])
    ends = {}
    for (s, p, o) in kafka:
        ends[f"{s}/{p}"] = max(ends.get(f"{s}/{p}", 0), o + 1)
    for sp, hi in last.items():
        assert sp in offsets, f"{view.name}: silt.offsets {offsets} lacks {sp}"
        assert hi < offsets[sp] <= ends[sp], f"{view.name}: silt.offsets[{sp}] = {offsets[sp]}, rows end at " \
                                             f"{hi}, the stream at {ends[sp]}"
        if all_stream_in_table:
            assert offsets[sp] == ends[sp], f"{view.name}: silt.offsets[{sp}] = {offsets[sp]}, stream ends at {ends[sp]}"


def check_sorted_by_topic(lake, view):
    """Within each data file the rows are in topic order (issue 10: sorted by topic within a file)."""
    files = [d["file_path"] for d in view.data_files()]
    con = duckdb_connect(lake.s3)
    try:
        listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
        got = con.execute(f"SELECT filename, file_row_number, topic FROM read_parquet([{listed}], "
                          "filename = true, file_row_number = true)").fetchall()
    finally:
        con.close()
    per_file = {}
    for name, n, topic in got:
        per_file.setdefault(name, []).append((n, topic))
    for name, rows in per_file.items():
        topics = [t for _, t in sorted(rows)]
        bad = next((i for i in range(1, len(topics)) if topics[i - 1] > topics[i]), None)
        assert bad is None, f"{name}: row {bad} topic {topics[bad]!r} after {topics[bad - 1]!r}"
