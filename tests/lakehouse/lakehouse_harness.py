"""Processes, readers and checks for the lakehouse end-to-end tests (issue 10), on top of the
tiering and Kafka harnesses (`SeaweedFS`, `KafkaNode`, `Mqtt5`, reused by import):

- `IcebergSeaweedFS`: `weed mini` with its Iceberg REST catalog on a free port and a table bucket
  (`TABLE_BUCKET`), besides the plain bucket (`BUCKET`) silt's prefix lives in. SeaweedFS serves
  one catalog per table bucket: a client names it as `warehouse = "s3://silt-tables/"` and the
  config endpoint answers with `prefix = silt-tables`, which the client must put into every
  later path (`/v1/silt-tables/namespaces`).
- `LakeNode`: a `silt serve` (a `KafkaNode`: its Kafka port is read from the log) whose admin
  HTTP listener, when the config has `[admin]`, is read from `admin listener bound addr=...`.
- Readers, each a real client: DuckDB 1.5.5 with the iceberg, httpfs and avro extensions loaded
  from the PyPI wheels by file path (autoinstall and autoload off, so nothing is fetched and a
  missing extension fails loudly), and pyiceberg 0.12 (pyarrow). `EmbeddedTable` reads a table
  of silt's object-store catalog by its location alone (DuckDB `iceberg_scan`, pyiceberg
  `StaticTable`, both through `metadata/version-hint.text`); `CatalogTable` reads one through an
  Iceberg REST catalog (SeaweedFS's, or silt's own at `http://ADMIN/iceberg`): DuckDB `ATTACH
  ... (TYPE iceberg)`, pyiceberg `load_catalog(type="rest")`.
- `Sent` / `check_rows`: what a test published (MQTT or Kafka) with the column values it means
  the table to hold, and the comparison of a reader's rows with it: every expected message
  exactly once, byte for byte, with its envelope (topic, levels, stream, partition, offset,
  timestamp, key, qos, properties), and, given the Kafka view of the same streams, each row at
  the (stream, partition, offset) Kafka has for it.
- `Lake` (fixture `lake`): one test's world, SeaweedFS (started on first use), a unique prefix,
  the nodes and clients it starts (stopped by PID at teardown) and their log tails.

Test modules load the fixture with `pytest_plugins = ["lakehouse_harness"]` (no conftest.py, for
the reason tiering_harness gives).

Knobs (environment): SILT_BIN, WEED_BIN (see tiering_harness).
"""

from __future__ import annotations

import glob
import json
import os
import random
import re
import shutil
import struct
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
for _d in ("tiering", "kafka"):
    if str(_HERE.parent / _d) not in sys.path:
        sys.path.insert(0, str(_HERE.parent / _d))
pytest.register_assert_rewrite("tiering_harness", "kafka_harness", "kafka_clients")

import requests  # noqa: E402
from kafka_clients import CLIENTS  # noqa: E402
from kafka_harness import KafkaNode, Mqtt5, mqtt_properties  # noqa: E402
from kafka_wire import kafka_partition  # noqa: E402
from tiering_harness import (  # noqa: E402
    Closed, SeaweedFS, free_port_pairs, is_success, tail, toml_value, wait_until,
)

__all__ = ["BUCKET", "NAMESPACE", "TABLE_BUCKET", "CatalogTable", "Closed", "EmbeddedTable", "Lake",
           "LakeNode", "Sent", "check_rows", "duckdb_connect", "is_success", "kafka_partition",
           "wait_until"]

BUCKET = "silt-lake"
TABLE_BUCKET = "silt-tables"
NAMESPACE = "silt"
# The envelope every silt table starts with (issue 10), in this order, then the projected columns.
ENVELOPE = ("topic", "topic_levels", "stream", "partition", "offset", "timestamp", "key", "payload",
            "qos", "properties")
# Lines no test expects.
BAD_LINES = re.compile(r"panicked")


# --- config ----------------------------------------------------------------------------------

def toml_any(v):
    """tiering_harness.toml_value plus inline tables (`columns = { temp = "double" }`)."""
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {toml_any(x)}" for k, x in v.items()) + " }"
    return toml_value(v)


def _toml_key(k):
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def write_config(path, topics=(), **sections):
    """A silt TOML config: `sections` are tables (`lakehouse={...}`; a dotted name such as
    `"mqtt.auth"` is passed with `**{...}`), `topics` the `[[topics]]` array, in order (the first
    matching entry decides a topic's policy)."""
    lines = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{_toml_key(k)} = {toml_any(v)}" for k, v in table.items()]
        lines.append("")
    for entry in topics:
        lines.append("[[topics]]")
        lines += [f"{_toml_key(k)} = {toml_any(v)}" for k, v in entry.items()]
        lines.append("")
    Path(path).write_text("\n".join(lines))
    return Path(path)


# --- SeaweedFS with its Iceberg REST catalog -------------------------------------------------

class IcebergSeaweedFS(SeaweedFS):
    """`weed mini` with the Iceberg REST catalog on `iceberg_port` and the table bucket
    `TABLE_BUCKET` created at start. Catalog requests authenticate with OAuth2 client
    credentials (`/v1/oauth/tokens`, client id and secret = the S3 access key and secret key)."""

    def __init__(self, base_dir):
        super().__init__(base_dir, bucket=BUCKET)
        taken = {self.s3_port, self.master, self.volume, self.filer, self.admin}
        taken |= {p + 10000 for p in taken}
        while True:
            (port,) = free_port_pairs(1)
            if port not in taken and port + 10000 not in taken:
                break
        self.iceberg_port = port
        self.catalog_uri = f"http://127.0.0.1:{port}"
        self.warehouse = f"s3://{TABLE_BUCKET}/"
        self.credential = f"{self.access_key}:{self.secret_key}"

    def args(self):
        a = [f"-s3.port.iceberg={self.iceberg_port}" if x == "-s3.port.iceberg=0" else x for x in super().args()]
        assert f"-s3.port.iceberg={self.iceberg_port}" in a, "tiering_harness no longer disables the catalog port"
        return a + [f"-tableBucket={TABLE_BUCKET}"]

    def start(self, timeout=60):
        """Starts weed, then waits for the S3 probe (SeaweedFS.start) and for the catalog to
        answer for the table bucket with a token it handed out."""
        super().start(timeout)
        last = None

        def catalog_ready():
            nonlocal last
            try:
                r = requests.get(f"{self.catalog_uri}/v1/config", params={"warehouse": self.warehouse}, timeout=5)
                if r.status_code != 200:
                    last = f"config: HTTP {r.status_code} {r.text[:200]}"
                    return False
                # The table bucket is created after the catalog starts answering.
                r = requests.get(f"{self.catalog_uri}/v1/{TABLE_BUCKET}/namespaces", timeout=5,
                                 headers={"Authorization": f"Bearer {self.token()}"})
                if r.status_code != 200:
                    last = f"namespaces: HTTP {r.status_code} {r.text[:200]}"
                    return False
                return True
            except (requests.RequestException, AssertionError) as e:
                last = repr(e)
                return False
        try:
            wait_until(catalog_ready, timeout, interval=0.25, what="the SeaweedFS Iceberg catalog")
        except AssertionError as e:
            raise RuntimeError(f"{e} (last: {last}):\n{tail(self.log_path)}") from None
        return self

    def token(self):
        r = requests.post(f"{self.catalog_uri}/v1/oauth/tokens", timeout=5, data={
            "grant_type": "client_credentials", "client_id": self.access_key, "client_secret": self.secret_key})
        assert r.status_code == 200, f"token: HTTP {r.status_code} {r.text[:200]}"
        return r.json()["access_token"]

    def s3_properties(self):
        """pyiceberg FileIO properties for this server."""
        return {"s3.endpoint": self.endpoint, "s3.access-key-id": self.access_key,
                "s3.secret-access-key": self.secret_key, "s3.region": "us-east-1",
                "s3.path-style-access": "true"}

    def catalog(self):
        """pyiceberg's REST catalog client for the table bucket."""
        from pyiceberg.catalog import load_catalog
        return load_catalog("seaweedfs", type="rest", uri=self.catalog_uri, warehouse=self.warehouse,
                            credential=self.credential, **{"oauth2-server-uri": f"{self.catalog_uri}/v1/oauth/tokens"},
                            **self.s3_properties())


# --- DuckDB ----------------------------------------------------------------------------------

def _extension_file(module):
    """The .duckdb_extension file a duckdb-extension-* wheel ships, for this duckdb's version."""
    import duckdb
    files = glob.glob(os.path.join(os.path.dirname(module.__file__), "extensions", "*", "*.duckdb_extension"))
    assert len(files) == 1, f"{module.__name__}: expected one extension file, found {files}"
    version_dir = Path(files[0]).parent.name
    assert version_dir == f"v{duckdb.__version__}", \
        f"{module.__name__} is built for DuckDB {version_dir}, this is {duckdb.__version__} (tests/requirements.txt)"
    return files[0]


def duckdb_connect(s3=None):
    """A DuckDB connection with httpfs, avro and iceberg loaded from their wheels by path, and an
    S3 secret for `s3` (a SeaweedFS) if given. No extension is installed or autoloaded, and
    `iceberg_scan` of a folder must find `metadata/version-hint.text` (no version guessing)."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_httpfs
    import duckdb_extension_iceberg
    con = duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
    for m in (duckdb_extension_httpfs, duckdb_extension_avro, duckdb_extension_iceberg):
        path = _extension_file(m)
        con.execute(f"LOAD '{_sql_str(path)}'")
    con.execute("SET unsafe_enable_version_guessing = false")
    if s3 is not None:
        host = s3.endpoint.removeprefix("http://")
        con.execute(f"""CREATE SECRET seaweedfs_s3 (TYPE s3, KEY_ID '{_sql_str(s3.access_key)}',
            SECRET '{_sql_str(s3.secret_key)}', REGION 'us-east-1', ENDPOINT '{_sql_str(host)}',
            URL_STYLE 'path', USE_SSL false)""")
    return con


def _sql_str(s):
    return str(s).replace("'", "''")


def _ident(s):
    return '"' + str(s).replace('"', '""') + '"'


# --- rows ------------------------------------------------------------------------------------

def normalize(arrow_table):
    """A reader's Arrow result as plain rows: timestamps as epoch microseconds (so no time-zone
    library decides anything), maps as dicts, lists as tuples, binaries as bytes."""
    import pyarrow as pa
    cols = {}
    for name in arrow_table.column_names:
        col = arrow_table.column(name)
        if pa.types.is_timestamp(col.type):
            col = col.cast(pa.timestamp("us", tz=col.type.tz), safe=False).cast(pa.int64())
        cols[name] = col.to_pylist()
    rows = [dict(zip(cols, values)) for values in zip(*cols.values())] if cols else []
    for r in rows:
        for k, v in r.items():
            if k == "properties" and isinstance(v, list):
                r[k] = dict(v)
            elif isinstance(v, list):
                r[k] = tuple(v)
    return rows


class TableView:
    """One table as both readers see it (subclasses say how they find it)."""

    name: str

    def duck_from(self, con):
        """Prepares `con` (ATTACH, if any) and returns the FROM item naming the table."""
        raise NotImplementedError

    def py_table(self):
        raise NotImplementedError

    def duck_rows(self):
        con = self._duck()
        try:
            return normalize(con.execute(f"SELECT * FROM {self.duck_from(con)}").to_arrow_table())
        finally:
            con.close()

    def py_rows(self, snapshot_id=None):
        t = self.py_table()
        return normalize(t.scan(snapshot_id=snapshot_id).to_arrow())

    def count(self):
        """Rows in the current snapshot, by DuckDB; None while there is no readable table."""
        con = self._duck()
        try:
            return con.execute(f"SELECT count(*) FROM {self.duck_from(con)}").fetchone()[0]
        except Exception as e:  # noqa: BLE001 - any reader error means "not (yet) readable"
            self.last_error = f"{type(e).__name__}: {e}"
            return None
        finally:
            con.close()

    def wait_count(self, n, timeout, node=None):
        """Waits until the table holds at least `n` rows; returns the count."""
        self.last_error = None
        seen = []

        def enough():
            c = self.count()
            seen.append(c)
            return c if c is not None and c >= n else None
        try:
            return wait_until(enough, timeout, interval=0.5, what=f"{n} rows in table {self.name}")
        except AssertionError as e:
            lines = "".join(node.lines(r"lakehouse")[-15:]) if node is not None else ""
            raise AssertionError(f"{e}: last count {seen[-1] if seen else None}, last reader error "
                                 f"{self.last_error}; silt's lakehouse lines:\n{lines}") from None

    def metadata(self):
        """pyiceberg's TableMetadata of the current version."""
        return self.py_table().metadata

    def summary(self):
        snap = self.py_table().current_snapshot()
        assert snap is not None, f"table {self.name} has no snapshot"
        return dict(snap.summary.additional_properties, operation=snap.summary.operation.value)

    def data_files(self, snapshot_id=None):
        """[{file_path, record_count, file_size_in_bytes, partition}] of a snapshot (default the
        current one), from pyiceberg's manifests."""
        t = self.py_table()
        return t.inspect.data_files(snapshot_id=snapshot_id).select(
            ["file_path", "record_count", "file_size_in_bytes", "partition"]).to_pylist()


class EmbeddedTable(TableView):
    """A table read by its location alone (silt's default catalog puts it at `s3://BUCKET/PREFIX/
    lakehouse/NAMESPACE/NAME`, or under DATA_DIR/objects/ without an object store), through
    `metadata/version-hint.text`. `s3` is the SeaweedFS of an `s3://` location."""

    def __init__(self, s3, location):
        self.s3 = s3
        self.location = str(location).rstrip("/")
        m = re.fullmatch(r"s3://([^/]+)/(.+)", self.location)
        if m:
            assert s3 is not None, location
            self.bucket, self.key = m.group(1), m.group(2)
        else:
            assert self.location.startswith("/"), f"neither s3:// nor an absolute path: {location}"
            self.bucket, self.key = None, self.location
        self.name = self.key.rsplit("/", 1)[-1]
        self.last_error = None

    def _duck(self):
        return duckdb_connect(self.s3 if self.bucket else None)

    def duck_from(self, con):
        return f"iceberg_scan('{_sql_str(self.location)}')"

    def py_table(self):
        from pyiceberg.table import StaticTable
        return StaticTable.from_metadata(self.location, self.s3.s3_properties() if self.bucket else {})

    def version_hint(self):
        """The raw bytes of metadata/version-hint.text."""
        if self.bucket is None:
            return Path(self.key, "metadata", "version-hint.text").read_bytes()
        c = self.s3.client()
        return c.get_object(Bucket=self.bucket, Key=f"{self.key}/metadata/version-hint.text")["Body"].read()

    def objects(self, sub=""):
        """{key (or path): size} under the table's folder (`sub`: "data/", "metadata/")."""
        if self.bucket is None:
            root = Path(self.key, sub)
            return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()} if root.exists() else {}
        out = {}
        for page in self.s3.client().get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=f"{self.key}/{sub}"):
            out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        return out


class CatalogTable(TableView):
    """A table found through an Iceberg REST catalog: SeaweedFS's (`seaweedfs=`) or silt's own
    (`silt_uri=`, no authentication)."""

    def __init__(self, s3, name, namespace=NAMESPACE, seaweedfs=None, silt_uri=None):
        assert (seaweedfs is None) != (silt_uri is None)
        self.s3 = s3
        self.name = name
        self.namespace = namespace
        self.seaweedfs = seaweedfs
        self.silt_uri = silt_uri
        self.last_error = None

    def _duck(self):
        return duckdb_connect(self.s3)

    def duck_from(self, con):
        if self.seaweedfs is not None:
            sw = self.seaweedfs
            con.execute(f"""CREATE SECRET seaweedfs_catalog (TYPE iceberg,
                CLIENT_ID '{_sql_str(sw.access_key)}', CLIENT_SECRET '{_sql_str(sw.secret_key)}',
                OAUTH2_SERVER_URI '{_sql_str(sw.catalog_uri)}/v1/oauth/tokens')""")
            con.execute(f"""ATTACH '{TABLE_BUCKET}' AS cat (TYPE iceberg, SECRET seaweedfs_catalog,
                ENDPOINT '{_sql_str(sw.catalog_uri)}')""")
        else:
            con.execute(f"""ATTACH 'silt' AS cat (TYPE iceberg, ENDPOINT '{_sql_str(self.silt_uri)}',
                AUTHORIZATION_TYPE 'none')""")
        return f"cat.{_ident(self.namespace)}.{_ident(self.name)}"

    def catalog(self):
        from pyiceberg.catalog import load_catalog
        if self.seaweedfs is not None:
            return self.seaweedfs.catalog()
        return load_catalog("silt", type="rest", uri=self.silt_uri, **self.s3.s3_properties())

    def py_table(self):
        return self.catalog().load_table((self.namespace, self.name))


# --- what a test sent, and the comparison ----------------------------------------------------

@dataclass
class Sent:
    """One message a test published, and what its table row must say.

    `want` maps each projected column to its value (None: NULL); `key` is the record key (an
    MQTT message's is its topic; a Kafka record's what the producer set); `props` the properties
    the row must carry (MQTT 5 user properties, `mqtt.content_type`, Kafka headers as text)."""

    topic: str
    payload: bytes
    qos: int | None = 1
    user: tuple = ()
    content_type: str | None = None
    want: dict = field(default_factory=dict)
    key: bytes | None = None
    timestamp_ms: int | None = None   # a Kafka producer's CreateTime, when it set one
    via: str = "mqtt"

    def __post_init__(self):
        if self.via == "mqtt" and self.key is None:
            self.key = self.topic.encode()

    def properties(self):
        if not self.user and self.content_type is None:
            return None
        return mqtt_properties(list(self.user), content_type=self.content_type)


def _levels(topic):
    return tuple(topic.split("/"))


def _same(a, b):
    """Equal, where a boolean equals only a boolean (True == 1 in Python) and NaN equals NaN."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


def check_rows(rows, must, may=(), partitions=1, kafka=None, columns=(), reader=""):
    """Problems (a list of strings, empty if none) between a reader's `rows` and what was sent:

    - every `must` message (acknowledged) exactly once, every row a `must` or `may` message (sent
      but not acknowledged, e.g. in flight at a kill), no (stream, partition, offset) twice;
    - each row's envelope: topic, topic_levels (the topic split at `/`), stream (first level),
      key, payload byte for byte, qos (MQTT), properties ⊇ the user properties and content type
      (and nothing but `mqtt.*` besides), partition = Kafka's partitioner of the key;
    - each projected column in `columns` = `Sent.want[column]`;
    - with `kafka` ({(stream, partition, offset): Got} of the same streams): the row's position
      holds that very record (same key and value) and the row's timestamp is its timestamp.
    """
    where = f"{reader}: " if reader else ""
    index = {}
    for s in list(must) + list(may):
        assert s.payload not in index, f"test bug: payload sent twice {s.payload[:40]!r}"
        index[s.payload] = s
    must_payloads = {s.payload for s in must}
    problems = []
    seen = {}
    positions = {}
    for r in rows:
        p = r.get("payload")
        s = index.get(p)
        pos = (r.get("stream"), r.get("partition"), r.get("offset"))
        if pos in positions:
            problems.append(f"{where}two rows at {pos}: {_brief(positions[pos])} and {_brief(r)}")
        positions[pos] = r
        if s is None:
            problems.append(f"{where}row at {pos} holds a payload nobody sent: {_brief(r)}")
            continue
        seen[p] = seen.get(p, 0) + 1
        if seen[p] == 2:
            problems.append(f"{where}{s.topic}: a message is in the table more than once ({_brief(r)})")
        if seen[p] > 1:
            continue
        problems += [f"{where}{s.topic} at {pos}: {x}" for x in _row_problems(r, s, partitions, kafka, columns)]
    missing = [index[p] for p in must_payloads - set(seen)]
    if missing:
        problems.append(f"{where}{len(missing)} of {len(must_payloads)} acknowledged messages are not in the "
                        f"table, e.g. {[(m.topic, m.payload[:30]) for m in missing[:5]]}")
    return problems


def _row_problems(r, s, partitions, kafka, columns):
    out = []
    stream = s.topic.split("/")[0]

    def expect(col, want):
        got = r.get(col, "<no such column>")
        if not _same(got, want):
            out.append(f"{col} = {_short(got)}, expected {_short(want)}")
    expect("topic", s.topic)
    expect("topic_levels", _levels(s.topic))
    expect("stream", stream)
    expect("key", s.key)
    if s.via == "mqtt":
        expect("qos", s.qos)
    if s.key is not None:
        expect("partition", kafka_partition(s.key, partitions))
    props = r.get("properties")
    if not isinstance(props, dict):
        out.append(f"properties = {_short(props)}, expected a map")
    else:
        want_user = dict(s.user)
        plain = {k: v for k, v in props.items() if not k.startswith("mqtt.")}
        if plain != want_user:
            out.append(f"properties (other than mqtt.*) {plain}, expected {want_user}")
        if s.content_type is not None and props.get("mqtt.content_type") != s.content_type:
            out.append(f"properties[mqtt.content_type] = {props.get('mqtt.content_type')!r}, "
                       f"expected {s.content_type!r}")
    for c in columns:
        expect(c, s.want.get(c))
    if s.timestamp_ms is not None:
        expect("timestamp", s.timestamp_ms * 1000)
    if kafka is not None:
        pos = (stream, r.get("partition"), r.get("offset"))
        g = kafka.get(pos)
        if g is None:
            out.append(f"the Kafka view has no record at {pos}")
        else:
            if g.value != s.payload or g.key != s.key:
                out.append(f"the Kafka view has another record at {pos}: key {_short(g.key)}, "
                           f"value {_short(g.value)}")
            expect("timestamp", g.timestamp * 1000)
    return out


def _short(v, n=48):
    if isinstance(v, (bytes, bytearray)):
        return repr(bytes(v[:n])) + (f"...({len(v)} bytes)" if len(v) > n else "")
    s = repr(v)
    return s if len(s) <= 2 * n else s[:2 * n] + "..."


def _brief(r):
    return {k: _short(r.get(k)) for k in ("topic", "stream", "partition", "offset", "payload")}


def assert_no_problems(problems, n=15):
    assert not problems, f"{len(problems)} problems:\n  " + "\n  ".join(problems[:n])


def f32(x):
    """`x` as a 32-bit float holds it."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def rfc3339_ms(ms, offset_minutes=0):
    """Epoch milliseconds as an RFC 3339 string with millisecond precision, at a UTC offset."""
    from datetime import timedelta
    tz = timezone(timedelta(minutes=offset_minutes))
    d = datetime.fromtimestamp(ms / 1000, tz)
    base = d.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}"
    if offset_minutes == 0:
        return base + "Z"
    sign = "+" if offset_minutes > 0 else "-"
    m = abs(offset_minutes)
    return f"{base}{sign}{m // 60:02d}:{m % 60:02d}"


# --- payloads with projected values ----------------------------------------------------------

# Values of each column type that every JSON parser reads exactly (short decimals, quarters for
# float), and values that do not parse as that type (the row is still written, the column NULL).
def _good(rng, kind):
    if kind == "double":
        return rng.choice([round(rng.uniform(-100, 100), 3), 0.1, 21, -0.5, 1e6])
    if kind == "float":
        return rng.randrange(-4000, 4000) / 4
    if kind == "long":
        return rng.choice([rng.randrange(-2 ** 62, 2 ** 62), 0, -1, 2 ** 53 + 1])
    if kind == "int":
        return rng.choice([rng.randrange(-2 ** 31, 2 ** 31), 0, 2 ** 31 - 1, -2 ** 31])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "string":
        return rng.choice(["°C", "K", "", "ünïcødé ✓", "with \"quotes\" and \\ and \n"]) + str(rng.randrange(100))
    if kind == "timestamp":
        return rng.randrange(1_600_000_000_000, 1_900_000_000_000)  # epoch ms, written as RFC 3339
    raise ValueError(kind)


_BAD = {
    "double": ["hot", {"v": 1}, [1.5]],
    "float": ["warm", {}, [2]],
    "long": ["many", {"v": 1}, [2]],
    "int": ["x", 2 ** 40, {"v": 1}, -2 ** 40],
    "boolean": ["maybe", {"v": True}, [True]],
    "timestamp": ["yesterday", "2026-13-45T99:00:00Z", {"t": 1}],
}


def _expected(kind, v):
    if kind == "float":
        return f32(float(v))
    if kind == "double":
        return float(v)
    if kind == "timestamp":
        return v * 1000  # microseconds, as normalize() returns timestamps
    return v


def _json_value(kind, v, rng):
    if kind == "timestamp":
        return rfc3339_ms(v, rng.choice([0, 0, 120, -330]))
    return v


PAYLOAD_KINDS = ("full", "full", "full", "partial", "bad", "nulls", "nested", "text", "binary", "truncated",
                 "array", "scalar")


def make_payload(rng, tag, columns, kind=None):
    """(payload bytes, {column: expected value}) for a message identified by `tag` (unique text).

    JSON kinds: "full" (every column a good value), "partial" (some absent), "bad" (some of the
    wrong kind), "nulls" (JSON null), "nested" (only inside a nested object: not top level).
    Others, whose projected columns are all NULL: "text" (not JSON), "binary" (not UTF-8),
    "truncated" (JSON cut short), "array" and "scalar" (valid JSON, but not an object)."""
    kind = kind or rng.choice(PAYLOAD_KINDS)
    want = {c: None for c in columns}
    if kind in ("full", "partial", "bad", "nulls", "nested"):
        doc = {"tag": tag}
        inner = {}
        for c, t in columns.items():
            roll = rng.random()
            if kind == "partial" and roll < 0.5:
                continue
            if kind == "bad" and roll < 0.5:
                doc[c] = rng.choice(_BAD[t]) if t in _BAD else None
                continue
            if kind == "nulls" and roll < 0.6:
                doc[c] = None
                continue
            v = _good(rng, t)
            if kind == "nested":
                inner[c] = _json_value(t, v, rng)
                continue
            doc[c] = _json_value(t, v, rng)
            want[c] = _expected(t, v)
        if inner:
            doc["nested"] = inner
        keys = list(doc)
        rng.shuffle(keys)
        return json.dumps({k: doc[k] for k in keys}, ensure_ascii=rng.random() < 0.5).encode(), want
    if kind == "text":
        return f"reading {tag}: 21.5 degrees, not JSON".encode(), want
    if kind == "binary":
        return b"\xff\xfe\x00" + tag.encode() + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300))), want
    if kind == "truncated":
        c = next(iter(columns), "x")
        return f'{{"tag": "{tag}", "{c}": 1'.encode(), want
    if kind == "array":
        return json.dumps([tag, 1.5, {c: 1 for c in columns}]).encode(), want
    if kind == "scalar":
        return json.dumps(tag).encode(), want  # a JSON string: valid JSON, no fields
    raise ValueError(kind)


# --- silt ------------------------------------------------------------------------------------

class LakeNode(KafkaNode):
    """A silt node; `admin_port` from `admin listener bound addr=...` when the config has
    `[admin]`."""

    def start(self, timeout=120):
        mark = self.log_mark()
        super().start(timeout)
        self.admin_port = None
        with self._log_lock:
            lines = self.log[mark:]
        for line in lines:
            m = re.search(r"admin listener bound.*addr=127\.0\.0\.1:(\d+)", line)
            if m:
                self.admin_port = int(m.group(1))
        return self

    @property
    def iceberg_uri(self):
        assert self.admin_port is not None, f"silt {self.name}: no 'admin listener bound' line:\n{self.log_tail()}"
        return f"http://127.0.0.1:{self.admin_port}/iceberg"

    def commits(self, table, since=0):
        """[(rows, line)] of `lakehouse commit` lines for `table` from log index `since` on."""
        out = []
        for line in self.lines(r"lakehouse commit\b", since):
            if "failed" in line or not re.search(rf"\btable=\"?{re.escape(table)}\"?(\s|$)", line):
                continue
            m = re.search(r"\brows=(\d+)", line)
            out.append((int(m.group(1)) if m else None, line))
        return out

    def wait_commits(self, table, n, timeout, since=0):
        """Waits for `n` `lakehouse commit` lines for `table` from log index `since` on."""
        return wait_until(lambda: len(self.commits(table, since)) >= n, timeout, interval=0.1,
                          what=f"{n} 'lakehouse commit table={table}' lines from {self.name}")


class Publisher(Mqtt5):
    """Pipelined MQTT publishes of `Sent` messages: QoS 1 ones tracked to their PUBACK, QoS 0
    ones sent and forgotten (they arrive in order on the one connection)."""

    def send(self, msgs, window=100, stall_timeout=60, on_ack=None):
        """Publishes `msgs` in order with at most `window` QoS 1 publishes unacknowledged; returns
        {index: reason code} of the QoS 1 ones. `on_ack(i, rc)` is called as PUBACKs arrive.
        Raises Closed if the connection ends (what was acknowledged until then is in
        `self.acked_msgs`)."""
        self.acked_msgs = getattr(self, "acked_msgs", [])
        self.sent_upto = 0
        by_token = {}
        codes = {}

        def collect(timeout):
            n = self.pump(timeout)
            for tok in [t for t in by_token if t in self.results]:
                i = by_token.pop(tok)
                rc = self.results[tok]
                codes[i] = rc
                if is_success(rc):
                    self.acked_msgs.append(msgs[i])
                if on_ack:
                    on_ack(i, rc)
            return n
        last = time.monotonic()
        try:
            for i, m in enumerate(msgs):
                while self.in_flight >= window:
                    if collect(0.2):
                        last = time.monotonic()
                    elif self.closed.is_set():
                        raise Closed(f"connection closed ({self.disconnect_reason}) after {i} publishes")
                    elif time.monotonic() - last > stall_timeout:
                        raise AssertionError(f"no PUBACK for {stall_timeout}s ({self.in_flight} in flight)")
                if self.closed.is_set():
                    raise Closed(f"connection closed ({self.disconnect_reason}) after {i} publishes")
                info = self.c.publish(m.topic, m.payload, qos=m.qos, properties=m.properties())
                self.sent_upto = i + 1
                if info.rc != 0:
                    self.closed.wait(1)
                    raise Closed(f"publish refused locally: {info.rc} (disconnect reason {self.disconnect_reason})")
                if m.qos == 0:
                    continue
                tok = next(self._tokens)
                self._pending[info.mid] = tok
                by_token[tok] = i
            deadline = time.monotonic() + stall_timeout
            while by_token:
                if self.closed.is_set():
                    collect(0)
                    raise Closed(f"connection closed ({self.disconnect_reason}) with {len(by_token)} unacknowledged")
                if time.monotonic() > deadline:
                    raise AssertionError(f"{len(by_token)} QoS 1 publishes unacknowledged after {stall_timeout}s")
                collect(0.2)
        finally:
            collect(0)
        return codes


class Lake:
    """One test's world (see the module docs)."""

    def __init__(self, base, test_name):
        self.base = Path(base)
        self.test_name = test_name
        self.prefix = f"l/{re.sub(r'[^A-Za-z0-9_-]+', '-', test_name)[:40]}-{uuid.uuid4().hex[:8]}"
        self.nodes = []
        self.closers = []
        self._s3 = None

    @property
    def s3(self):
        """SeaweedFS (S3 and the Iceberg catalog), started on first use."""
        if self._s3 is None:
            self._s3 = IcebergSeaweedFS(self.base / "weed")
            self._s3.start()
        return self._s3

    @property
    def url(self):
        return self.s3.url(self.prefix)

    def config(self, name="silt.toml", topics=(), **sections):
        """A config file (see `write_config`); `[mqtt] sys_interval_secs = 0` unless given, so no
        `$SYS` messages enter the streams."""
        sections.setdefault("mqtt", {}).setdefault("sys_interval_secs", 0)
        return write_config(self.base / name, topics=topics, **sections)

    def data_dir(self, name):
        return self.base / f"data-{name}"

    def node(self, name="a", config=None, data_dir=None, start=True, object_store="default"):
        """A silt node on this test's prefix of the bucket, with the AWS_* environment that
        reaches SeaweedFS (which the lakehouse also uses, and the REST catalog credential's
        default); `object_store=None`: no --object-store (DATA_DIR/objects) and no SeaweedFS."""
        if object_store == "default":
            object_store = self.url
        n = LakeNode(name, data_dir or self.data_dir(name), config=config, object_store=object_store,
                     env=self.s3.env() if object_store is not None else {}, log_dir=self.base)
        self.nodes.append(n)
        if start:
            n.start()
        return n

    def wipe(self, node):
        assert not node.running
        shutil.rmtree(node.data_dir, ignore_errors=True)
        assert not node.data_dir.exists()

    def publisher(self, node, client_id="", **kw):
        c = Publisher(node.port, client_id, **kw)
        self.closers.append(c.close)
        return c

    def mqtt(self, node, client_id="", **kw):
        c = Mqtt5(node.port, client_id, **kw)
        self.closers.append(c.close)
        return c

    def embedded(self, table, namespace=NAMESPACE):
        """A table of silt's default (object-store) catalog on this test's prefix."""
        return EmbeddedTable(self.s3, f"{self.url}/lakehouse/{namespace}/{table}")

    def seaweedfs_table(self, table):
        return CatalogTable(self.s3, table, seaweedfs=self.s3)

    def silt_table(self, node, table):
        return CatalogTable(self.s3, table, silt_uri=node.iceberg_uri)

    def kafka_records(self, node, stream, partitions):
        """{(stream, partition, offset): Got} of every record of `stream`, read with
        confluent-kafka from offset 0 to each partition's end."""
        from confluent_kafka import TopicPartition
        client = CLIENTS["confluent"]
        c = client.consumer(node.bootstrap)
        try:
            ends = [c.get_watermark_offsets(TopicPartition(stream, p), timeout=30, cached=False)
                    for p in range(partitions)]
        finally:
            c.close()
        assert all(lo == 0 for lo, _ in ends), f"{stream}: watermarks {ends} (retention is off in these tests)"
        wants = {(stream, p): (0, hi) for p, (_, hi) in enumerate(ends) if hi > 0}
        got = client.consume(node.bootstrap, wants) if wants else {}
        return {(stream, g.partition, g.offset): g for recs in got.values() for g in recs}

    def on_cleanup(self, fn):
        self.closers.append(fn)
        return fn

    def unexpected_lines(self):
        out = []
        for n in self.nodes:
            out += [f"{n.name}: {line.rstrip()}" for line in n.lines(".*") if BAD_LINES.search(line)]
        return out

    def cleanup(self):
        for fn in reversed(self.closers):
            try:
                fn()
            except Exception:
                pass
        for n in self.nodes:
            if n.proc is not None:
                n.kill()
        if self._s3 is not None:
            self._s3.stop(10)

    def report(self):
        for n in self.nodes:
            print(f"\n---- silt {n.name} (mqtt {n.port}) lakehouse lines ----\n"
                  + "".join(n.lines(r"lakehouse")[-30:])
                  + f"\n---- silt {n.name} log tail ----\n{tail(n.log_path, 60)}")
        if self._s3 is not None:
            print(f"\n---- weed log tail ----\n{tail(self._s3.log_path, 30)}")


@pytest.fixture
def lake(request):
    with tempfile.TemporaryDirectory(prefix="silt-lake-") as d:
        w = Lake(d, request.node.name)
        try:
            yield w
        finally:
            w.cleanup()
            w.report()
        bad = w.unexpected_lines()
        assert not bad, "silt logged what no test should cause:\n" + "\n".join(bad[:20])


def seeded(name):
    """A random generator seeded by a test's name, so a failure replays with the same data."""
    return random.Random(name)


def background(fn, name):
    """Runs `fn` in a daemon thread; returns (thread, errors list)."""
    errors = []

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported by the test that joins it
            errors.append(e)
    t = threading.Thread(target=run, daemon=True, name=name)
    t.start()
    return t, errors
