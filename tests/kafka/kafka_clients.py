"""Four real Kafka clients behind one small interface, and byte-for-byte record checks.

Clients (see `CLIENTS`): `kcat` (Debian's, librdkafka 2.0 inside), `confluent` (confluent-kafka,
its own librdkafka), `kafka-python` and `aiokafka`. Each can

- `produce(bootstrap, items, codec)`: `items` are (topic, partition, Rec); returns the
  (partition, offset) each record was acknowledged at, in order (kcat reports none: None);
- `consume(bootstrap, wants)`: `wants` maps (topic, partition) to (first offset, count); returns
  {(topic, partition): [Got]} once `count` records arrived (or raises after a deadline).

How each is held, since the broker serves no consumer groups and no idempotence yet:
- consumers assign partitions at explicit offsets and never join a group: librdkafka needs a
  `group.id` to build a consumer, so it gets one that is never joined (`assign()` only,
  `enable.auto.commit=false`, explicit offsets, so no OffsetFetch either); kafka-python and
  aiokafka run with `group_id=None`;
- producers run without idempotence (librdkafka's default; kafka-python 3 turns it on by
  default, so it is turned off; aiokafka's default is off).

`Rec` is what a test means to produce; `assert_records` compares what a consumer returned with
it: key, value, headers (names, values, order, repeats) and the CreateTime timestamp, and the
offsets dense from a first one.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
MiB = 1 << 20
# The broker's default `kafka.max_message_bytes`; clients' own limits are raised to it (their
# defaults, about 1 MB, would refuse a 1 MiB value before sending it).
MAX_MESSAGE = 2 * MiB
# A `group.id` librdkafka insists on for a consumer; no test ever joins it.
NEVER_JOINED = "silt-tests-assign-only"


@dataclass(frozen=True)
class Rec:
    key: bytes | None
    value: bytes | None
    headers: tuple = ()         # ((name str, value bytes | None), ...), order and repeats kept
    timestamp: int | None = None  # CreateTime (ms) the producer sets; None: the client's clock


@dataclass
class Got:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple
    timestamp: int
    create_time: bool = True     # the timestamp type is CreateTime
    client: str = ""


def _short(b, n=40):
    if b is None:
        return "None"
    return repr(b[:n]) + (f"...({len(b)} bytes)" if len(b) > n else "")


def first_difference(a: bytes | None, b: bytes | None):
    if a is None or b is None:
        return f"{_short(a)} vs {_short(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"lengths {len(a)} vs {len(b)}, first difference at byte {i}: {a[i:i + 8]!r} vs {b[i:i + 8]!r}"
    return f"lengths {len(a)} vs {len(b)}"


def assert_records(want, got, first_offset=0, clock=None, what=""):
    """`got` (a consumer's [Got] of one partition) is `want` ([Rec]) exactly, at dense offsets
    from `first_offset`. A Rec without timestamp must have one within `clock` = (lo, hi) ms."""
    where = f"{what}: " if what else ""
    assert len(got) == len(want), f"{where}consumed {len(got)} records, produced {len(want)}"
    for i, (w, g) in enumerate(zip(want, got)):
        at = f"{where}record {i} (offset {g.offset}, consumed by {g.client})"
        assert g.offset == first_offset + i, f"{at}: offset {g.offset}, expected {first_offset + i}"
        assert g.key == w.key, f"{at}: key {first_difference(g.key, w.key)}"
        assert g.value == w.value, f"{at}: value {first_difference(g.value, w.value)}"
        assert g.headers == tuple(w.headers), f"{at}: headers {list(g.headers)} != produced {list(w.headers)}"
        assert g.create_time, f"{at}: timestamp type is not CreateTime"
        if w.timestamp is not None:
            assert g.timestamp == w.timestamp, f"{at}: timestamp {g.timestamp}, produced {w.timestamp}"
        elif clock is not None:
            lo, hi = clock
            assert lo <= g.timestamp <= hi, f"{at}: timestamp {g.timestamp} outside the produce window {clock}"


def now_ms():
    return int(time.time() * 1000)


# --- librdkafka through Python ---------------------------------------------------------------

class Confluent:
    name = "confluent"
    sets_timestamps = True
    reports_offsets = True

    def __init__(self, extra=None):
        self.extra = dict(extra or {})

    @staticmethod
    def versions():
        import confluent_kafka
        v = confluent_kafka.version()
        return f"confluent-kafka {v[0] if isinstance(v, tuple) else v}, librdkafka {confluent_kafka.libversion()[0]}"

    def producer(self, bootstrap, **conf):
        from confluent_kafka import Producer
        c = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
             "message.max.bytes": MAX_MESSAGE, "linger.ms": 5, "message.timeout.ms": 60000}
        c.update(self.extra)
        c.update(conf)
        return Producer(c)

    def consumer(self, bootstrap, **conf):
        from confluent_kafka import Consumer
        c = {"bootstrap.servers": bootstrap, "group.id": NEVER_JOINED, "enable.auto.commit": False,
             "enable.auto.offset.store": False, "auto.offset.reset": "error", "fetch.wait.max.ms": 100}
        c.update(self.extra)
        c.update(conf)
        return Consumer(c)

    def produce(self, bootstrap, items, codec="none", **conf):
        from confluent_kafka import KafkaException
        p = self.producer(bootstrap, **{"compression.type": codec, **conf})
        results = [None] * len(items)

        def report(i):
            def cb(err, msg):
                results[i] = err if err is not None else (msg.partition(), msg.offset())
            return cb

        for i, (topic, partition, r) in enumerate(items):
            kw = {} if partition is None else {"partition": partition}
            if r.timestamp is not None:
                kw["timestamp"] = r.timestamp
            while True:
                try:
                    p.produce(topic, value=r.value, key=r.key, headers=list(r.headers) or None,
                              on_delivery=report(i), **kw)
                    break
                except BufferError:
                    p.poll(0.1)
            p.poll(0)
        left = p.flush(120)
        assert left == 0, f"confluent: {left} records still unacknowledged after 120 s"
        errors = [(i, e) for i, e in enumerate(results) if not isinstance(e, tuple)]
        if errors:
            raise KafkaException(errors[0][1])
        return results

    def consume(self, bootstrap, wants, timeout=60, **conf):
        from confluent_kafka import KafkaError, KafkaException, TopicPartition
        c = self.consumer(bootstrap, **conf)
        try:
            c.assign([TopicPartition(t, p, start) for (t, p), (start, _) in wants.items()])
            out = {tp: [] for tp in wants}
            need = {tp: n for tp, (_, n) in wants.items()}
            deadline = time.monotonic() + timeout
            while any(len(out[tp]) < need[tp] for tp in wants):
                if time.monotonic() > deadline:
                    raise AssertionError(f"confluent: {_progress(out, need)} after {timeout}s")
                for m in c.consume(100, 0.5):
                    if m.error():
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            continue
                        raise KafkaException(m.error())
                    kind, ts = m.timestamp()
                    out[(m.topic(), m.partition())].append(
                        Got(m.topic(), m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers() or ()),
                            ts, kind == 1, self.name))
            return out
        finally:
            c.close()


# --- kcat ------------------------------------------------------------------------------------

class Kcat:
    """Debian's kcat (its librdkafka is 2.0.2). Records go in with `-l` from a file split by
    delimiters that occur in none of them (`-K` for keys: none given means a null key; `-Z` for
    null values), one process per run of records that share topic, partition, headers and
    null-ness of the value (`-H` applies to a whole run). kcat cannot set timestamps (the
    client's clock) nor report offsets. Consumed with a format that gives lengths
    (`%K`, `%S`), then key and value raw, so binary data comes back exactly; headers as kcat
    prints them (`name=value,...`), compared with that rendering of what was produced."""

    name = "kcat"
    sets_timestamps = False
    reports_offsets = False
    FORMAT = r"@@%t %p %o %T %K %S %h\n%k%s\n"

    def __init__(self, extra=None):
        self.extra = dict(extra or {})

    @staticmethod
    def versions():
        out = subprocess.run(["kcat", "-V"], capture_output=True, text=True, timeout=30)
        m = re.search(r"Version (\S+).*?librdkafka (\S+)", out.stdout + out.stderr, re.S)
        return f"kcat {m.group(1)}, librdkafka {m.group(2)}" if m else "kcat (version unknown)"

    def _x(self, conf):
        args = []
        for k, v in {**self.extra, **conf}.items():
            args += ["-X", f"{k}={v}"]
        return args

    @staticmethod
    def _delimiter(blobs):
        while True:
            d = "#~" + os.urandom(6).hex() + "~#"
            if not any(b is not None and d.encode() in b for b in blobs):
                return d

    def produce(self, bootstrap, items, codec="none", timeout=120, **conf):
        runs = []
        for topic, partition, r in items:
            key = (topic, partition, tuple(r.headers), r.value is None)
            if runs and runs[-1][0] == key:
                runs[-1][1].append(r)
            else:
                runs.append((key, [r]))
        with tempfile.TemporaryDirectory(prefix="kcat-") as d:
            for n, ((topic, partition, headers, null_value), recs) in enumerate(runs):
                assert all(v is not None for _, v in headers), "kcat cannot send a null header value"
                blobs = [r.key for r in recs] + [r.value for r in recs]
                dm, dk = self._delimiter(blobs), self._delimiter(blobs)
                data = b"".join((b"" if r.key is None else r.key + dk.encode()) + (r.value or b"") + dm.encode()
                                for r in recs)
                path = Path(d) / f"in-{n}"
                path.write_bytes(data)
                args = ["kcat", "-P", "-b", bootstrap, "-t", topic, "-D", dm, "-K", dk, "-l", str(path),
                        "-X", f"compression.codec={codec}", "-X", f"message.max.bytes={MAX_MESSAGE}",
                        "-X", "enable.idempotence=false", "-X", "acks=all", "-c", str(len(recs))]
                if partition is not None:
                    args += ["-p", str(partition)]
                if null_value:
                    args.append("-Z")
                for k, v in headers:
                    args += ["-H", f"{k}={v.decode()}"]
                args += self._x(conf)
                p = subprocess.run(args, capture_output=True, timeout=timeout)
                assert p.returncode == 0, f"kcat -P exited {p.returncode}: {p.stderr.decode(errors='replace')[-2000:]}"
                assert b"ERROR" not in p.stderr and b"failed" not in p.stderr, \
                    f"kcat -P reported: {p.stderr.decode(errors='replace')[-2000:]}"
        return [None] * len(items)

    def consume(self, bootstrap, wants, timeout=60, **conf):
        out = {}
        for (topic, partition), (start, count) in wants.items():
            args = ["kcat", "-C", "-b", bootstrap, "-t", topic, "-p", str(partition), "-o", str(start),
                    "-c", str(count), "-e", "-f", self.FORMAT, "-X", "fetch.wait.max.ms=100",
                    "-X", "auto.offset.reset=error"] + self._x(conf)
            p = subprocess.run(args, capture_output=True, timeout=timeout)
            assert p.returncode == 0, f"kcat -C exited {p.returncode}: {p.stderr.decode(errors='replace')[-2000:]}"
            out[(topic, partition)] = self.parse(p.stdout)
        return out

    HEAD = re.compile(rb"@@(\S+) (-?\d+) (-?\d+) (-?\d+) (-?\d+) (-?\d+) ")

    @classmethod
    def parse(cls, data):
        got, at = [], 0
        while at < len(data):
            m = cls.HEAD.match(data, at)
            assert m, f"kcat output not understood at byte {at}: {data[at:at + 80]!r}"
            topic, part, off, ts, klen, vlen = m.groups()
            eol = data.index(b"\n", m.end())
            headers = data[m.end():eol]
            at = eol + 1
            klen, vlen = int(klen), int(vlen)
            key = data[at:at + klen] if klen >= 0 else None
            at += max(klen, 0)
            value = data[at:at + vlen] if vlen >= 0 else None
            at += max(vlen, 0)
            assert data[at:at + 1] == b"\n", f"kcat record at offset {int(off)} not followed by a newline"
            at += 1
            got.append(Got(topic.decode(), int(part), int(off), key, value, KcatHeaders(headers), int(ts),
                           True, cls.name))
        return got


class KcatHeaders(tuple):
    """Headers as kcat prints them (`a=1,b=2`, each value as a C string: up to its first NUL):
    equal to produced headers rendered the same way."""

    def __new__(cls, raw: bytes):
        t = super().__new__(cls, (raw,))
        t.raw = raw
        return t

    def __eq__(self, other):
        if isinstance(other, KcatHeaders):
            return self.raw == other.raw
        rendered = b",".join(k.encode() + b"=" + (v or b"").split(b"\0")[0] for k, v in other)
        return self.raw == rendered

    def __ne__(self, other):
        return not self == other

    __hash__ = tuple.__hash__

    def __repr__(self):
        return f"kcat:{self.raw!r}"


# --- kafka-python ----------------------------------------------------------------------------

class KafkaPython:
    name = "kafka-python"
    sets_timestamps = True
    reports_offsets = True

    @staticmethod
    def versions():
        import kafka
        return f"kafka-python {kafka.__version__}"

    def producer(self, bootstrap, **kw):
        from kafka import KafkaProducer
        args = dict(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False,
                    max_request_size=MAX_MESSAGE, linger_ms=5, request_timeout_ms=60000)
        args.update(kw)
        return KafkaProducer(**args)

    def consumer(self, bootstrap, **kw):
        from kafka import KafkaConsumer
        args = dict(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                    auto_offset_reset="none", fetch_max_wait_ms=100)
        args.update(kw)
        return KafkaConsumer(**args)

    def produce(self, bootstrap, items, codec="none", **kw):
        p = self.producer(bootstrap, compression_type=None if codec == "none" else codec, **kw)
        try:
            futures = [p.send(topic, value=r.value, key=r.key, partition=partition,
                              headers=list(r.headers), timestamp_ms=r.timestamp)
                       for topic, partition, r in items]
            p.flush(120)
            results = []
            for f in futures:
                md = f.get(timeout=120)
                results.append((md.partition, md.offset))
            return results
        finally:
            p.close(10)

    def consume(self, bootstrap, wants, timeout=60, **kw):
        from kafka import TopicPartition
        c = self.consumer(bootstrap, **kw)
        try:
            tps = {TopicPartition(t, p): (start, n) for (t, p), (start, n) in wants.items()}
            c.assign(list(tps))
            for tp, (start, _) in tps.items():
                c.seek(tp, start)
            out = {tp: [] for tp in wants}
            need = {tp: n for tp, (_, n) in wants.items()}
            deadline = time.monotonic() + timeout
            while any(len(out[tp]) < need[tp] for tp in wants):
                if time.monotonic() > deadline:
                    raise AssertionError(f"kafka-python: {_progress(out, need)} after {timeout}s")
                for tp, msgs in c.poll(timeout_ms=500).items():
                    for m in msgs:
                        out[(m.topic, m.partition)].append(
                            Got(m.topic, m.partition, m.offset, m.key, m.value, tuple(m.headers or ()),
                                m.timestamp, m.timestamp_type == 0, self.name))
            return out
        finally:
            c.close()


# --- aiokafka --------------------------------------------------------------------------------

class AioKafka:
    name = "aiokafka"
    sets_timestamps = True
    reports_offsets = True

    @staticmethod
    def versions():
        import aiokafka
        return f"aiokafka {aiokafka.__version__}"

    def produce(self, bootstrap, items, codec="none", **kw):
        return asyncio.run(self._produce(bootstrap, items, codec, kw))

    async def _produce(self, bootstrap, items, codec, kw):
        from aiokafka import AIOKafkaProducer
        args = dict(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False,
                    max_request_size=MAX_MESSAGE, linger_ms=5, request_timeout_ms=60000,
                    compression_type=None if codec == "none" else codec)
        args.update(kw)
        p = AIOKafkaProducer(**args)
        await p.start()
        try:
            futures = [await p.send(topic, value=r.value, key=r.key, partition=partition,
                                    headers=list(r.headers), timestamp_ms=r.timestamp)
                       for topic, partition, r in items]
            results = []
            for f in futures:
                md = await asyncio.wait_for(f, 120)
                results.append((md.partition, md.offset))
            return results
        finally:
            await p.stop()

    def consume(self, bootstrap, wants, timeout=60, **kw):
        return asyncio.run(self._consume(bootstrap, wants, timeout, kw))

    async def _consume(self, bootstrap, wants, timeout, kw):
        from aiokafka import AIOKafkaConsumer, TopicPartition
        args = dict(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                    auto_offset_reset="none", fetch_max_wait_ms=100)
        args.update(kw)
        c = AIOKafkaConsumer(**args)
        await c.start()
        try:
            tps = {TopicPartition(t, p): (start, n) for (t, p), (start, n) in wants.items()}
            c.assign(list(tps))
            for tp, (start, _) in tps.items():
                c.seek(tp, start)
            out = {tp: [] for tp in wants}
            need = {tp: n for tp, (_, n) in wants.items()}
            deadline = time.monotonic() + timeout
            while any(len(out[tp]) < need[tp] for tp in wants):
                if time.monotonic() > deadline:
                    raise AssertionError(f"aiokafka: {_progress(out, need)} after {timeout}s")
                for tp, msgs in (await c.getmany(timeout_ms=500)).items():
                    for m in msgs:
                        out[(m.topic, m.partition)].append(
                            Got(m.topic, m.partition, m.offset, m.key, m.value, tuple(m.headers or ()),
                                m.timestamp, m.timestamp_type == 0, self.name))
            return out
        finally:
            await c.stop()


def _progress(out, need):
    return ", ".join(f"{t}[{p}] {len(out[(t, p)])}/{need[(t, p)]}" for (t, p) in need)


CLIENTS = {c.name: c for c in (Kcat(), Confluent(), KafkaPython(), AioKafka())}

