"""The Kafka wire protocol, by hand, for what real clients will not send on purpose.

- `murmur2` / `kafka_partition`: Kafka's default partitioner (`Utils.murmur2`, `toPositive`),
  to check where Silt puts an MQTT message and where a producer with
  `partitioner=murmur2_random` puts a keyed record.
- `RawKafka`: one plain TCP connection speaking non-flexible request versions (header v1):
  ApiVersions v0, Metadata v1, Produce v3, Fetch v4, ListOffsets v1. Used for requests a client
  checks away locally (a produce to a partition that does not exist, a negative fetch offset)
  and for malformed frames.
- `record_batch` / `parse_batches`: RecordBatch v2 ("magic 2"), uncompressed, as Kafka lays it
  out (`DefaultRecordBatch`); CRC-32C checked on the way in.
- `ProtocolRecorder`: a TCP proxy that notes (API key, version) of every request a client sends,
  so a test can say which APIs and versions each client uses (the broker advertises the proxy).

Nothing here knows Silt; it is Kafka's format.
"""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass, field

import crc32c

# --- the default partitioner -----------------------------------------------------------------

def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2` (seed 0x9747b28c) as an unsigned 32-bit int."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[4 * i:4 * i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail, extra = length & ~3, length % 4
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def kafka_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# --- primitive encoders ----------------------------------------------------------------------

def i8(v): return struct.pack(">b", v)
def i16(v): return struct.pack(">h", v)
def i32(v): return struct.pack(">i", v)
def i64(v): return struct.pack(">q", v)


def string(s):
    if s is None:
        return i16(-1)
    b = s.encode() if isinstance(s, str) else s
    return i16(len(b)) + b


def array(items):
    items = list(items)
    return i32(len(items)) + b"".join(items)


def zigzag(v: int) -> bytes:
    z = (v << 1) ^ (v >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def varbytes(b):
    return zigzag(-1) if b is None else zigzag(len(b)) + b


class Reader:
    def __init__(self, data: bytes):
        self.b, self.at = data, 0

    def take(self, n):
        if self.at + n > len(self.b):
            raise ValueError(f"truncated: need {n} bytes at {self.at} of {len(self.b)}")
        out = self.b[self.at:self.at + n]
        self.at += n
        return out

    def i8(self): return struct.unpack(">b", self.take(1))[0]
    def i16(self): return struct.unpack(">h", self.take(2))[0]
    def i32(self): return struct.unpack(">i", self.take(4))[0]
    def u32(self): return struct.unpack(">I", self.take(4))[0]
    def i64(self): return struct.unpack(">q", self.take(8))[0]

    def string(self):
        n = self.i16()
        return None if n < 0 else self.take(n).decode()

    def bytes32(self):
        n = self.i32()
        return None if n < 0 else self.take(n)

    def array(self, item):
        n = self.i32()
        return [] if n < 0 else [item(self) for _ in range(n)]

    def varint(self):
        shift = z = 0
        while True:
            b = self.take(1)[0]
            z |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        return (z >> 1) ^ -(z & 1)

    def varbytes(self):
        n = self.varint()
        return None if n < 0 else self.take(n)

    def done(self):
        return self.at >= len(self.b)


# --- record batches --------------------------------------------------------------------------

@dataclass
class WireRecord:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list = field(default_factory=list)  # [(name str, value bytes | None)]


def record_batch(records, base_timestamp=None):
    """One uncompressed RecordBatch v2 of `records` [(key, value, headers, timestamp)] with base
    offset 0 and no producer id, as a producer sends it."""
    ts = [r[3] for r in records]
    base_ts = min(ts) if base_timestamp is None else base_timestamp
    body = b""
    for delta, (key, value, headers, t) in enumerate(records):
        rec = (i8(0) + zigzag(t - base_ts) + zigzag(delta) + varbytes(key) + varbytes(value)
               + zigzag(len(headers))
               + b"".join(varbytes(k.encode()) + varbytes(v) for k, v in headers))
        body += zigzag(len(rec)) + rec
    after_crc = (i16(0) + i32(len(records) - 1) + i64(base_ts) + i64(max(ts)) + i64(-1) + i16(-1) + i32(-1)
                 + i32(len(records)) + body)
    crc = crc32c.crc32c(after_crc)
    tail = i32(-1) + i8(2) + struct.pack(">I", crc) + after_crc
    return i64(0) + i32(len(tail)) + tail


def parse_batches(data: bytes):
    """Every record of a fetch response's record set (uncompressed batches, CRC checked)."""
    out = []
    r = Reader(data)
    while not r.done():
        if len(r.b) - r.at < 12:
            break  # a partial batch at the end of a size-limited response
        base = r.i64()
        length = r.i32()
        if len(r.b) - r.at < length:
            break
        batch = Reader(r.take(length))
        batch.i32()  # partition leader epoch
        magic = batch.i8()
        assert magic == 2, f"magic {magic}"
        crc = batch.u32()
        rest = batch.b[batch.at:]
        assert crc32c.crc32c(rest) == crc, f"batch at offset {base}: CRC mismatch"
        attributes = batch.i16()
        assert attributes & 7 == 0, f"compressed fetch batch (attributes {attributes:#x})"
        batch.i32()  # last offset delta
        base_ts = batch.i64()
        batch.i64()  # max timestamp
        batch.i64(), batch.i16(), batch.i32()  # producer id, epoch, base sequence
        count = batch.i32()
        for _ in range(count):
            rec = Reader(batch.take(batch.varint()))
            rec.i8()
            ts = base_ts + rec.varint()
            offset = base + rec.varint()
            key, value = rec.varbytes(), rec.varbytes()
            headers = []
            for _ in range(rec.varint()):
                name = rec.varbytes().decode()
                headers.append((name, rec.varbytes()))
            out.append(WireRecord(offset, ts, key, value, headers))
    return out


# --- a connection ----------------------------------------------------------------------------

API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA, API_API_VERSIONS = 0, 1, 2, 3, 18
API_NAMES = {
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit", 9: "OffsetFetch",
    10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat", 13: "LeaveGroup", 14: "SyncGroup",
    15: "DescribeGroups", 16: "ListGroups", 17: "SaslHandshake", 18: "ApiVersions", 19: "CreateTopics",
    20: "DeleteTopics", 22: "InitProducerId", 24: "AddPartitionsToTxn", 25: "AddOffsetsToTxn", 26: "EndTxn",
    28: "TxnOffsetCommit", 32: "DescribeConfigs", 36: "SaslAuthenticate", 37: "CreatePartitions",
    42: "DeleteGroups", 60: "DescribeCluster", 61: "DescribeProducers", 68: "ConsumerGroupHeartbeat",
    71: "GetTelemetrySubscriptions", 72: "PushTelemetry",
}


class Closed(Exception):
    """The broker closed the connection."""


class RawKafka:
    """One TCP connection; `request()` sends a frame and reads its response (header v0)."""

    def __init__(self, port, client_id="silt-raw-test", timeout=30):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.client_id = client_id
        self.correlation = 0

    @property
    def local_port(self):
        return self.sock.getsockname()[1]

    def send_raw(self, data: bytes):
        self.sock.sendall(data)

    def frame(self, api_key, version, body, correlation=None):
        if correlation is None:
            self.correlation += 1
            correlation = self.correlation
        payload = i16(api_key) + i16(version) + i32(correlation) + string(self.client_id) + body
        return i32(len(payload)) + payload, correlation

    def _recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError as e:
                raise Closed(f"connection reset ({e})") from e
            if not chunk:
                raise Closed(f"connection closed by the broker after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def read_frame(self):
        n = struct.unpack(">i", self._recv_exact(4))[0]
        return self._recv_exact(n)

    def request(self, api_key, version, body):
        data, correlation = self.frame(api_key, version, body)
        self.sock.sendall(data)
        resp = Reader(self.read_frame())
        got = resp.i32()
        assert got == correlation, f"correlation id {got}, expected {correlation}"
        return resp

    def closed_by_peer(self, timeout=30):
        """Whether the broker closes the connection within `timeout` s (reads and drops bytes)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except ConnectionResetError:
            return True
        except (socket.timeout, TimeoutError):
            return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    # --- APIs (non-flexible versions) ---

    def api_versions(self):
        """{api_key: (min, max)} from ApiVersions v0."""
        r = self.request(API_API_VERSIONS, 0, b"")
        err = r.i16()
        assert err == 0, f"ApiVersions error {err}"
        return {k: (lo, hi) for k, lo, hi in r.array(lambda x: (x.i16(), x.i16(), x.i16()))}

    def metadata(self, topics=None):
        """Metadata v1: {"brokers": [...], "topics": {name: (error, [(partition, error, leader)])}}."""
        body = i32(-1) if topics is None else array(string(t) for t in topics)
        r = self.request(API_METADATA, 1, body)
        brokers = r.array(lambda x: (x.i32(), x.string(), x.i32(), x.string()))
        r.i32()  # controller

        def topic(x):
            err, name, _internal = x.i16(), x.string(), x.i8()
            parts = x.array(lambda y: (y.i16(), y.i32(), y.i32(), y.array(Reader.i32), y.array(Reader.i32)))
            return name, (err, [(p, e, leader) for e, p, leader, _, _ in parts])
        return {"brokers": brokers, "topics": dict(r.array(topic))}

    def produce(self, topic, partition, records_bytes, acks=-1, timeout_ms=30000):
        """Produce v3 of one record set; returns (error_code, base_offset)."""
        body = (string(None) + i16(acks) + i32(timeout_ms)
                + array([string(topic) + array([i32(partition) + i32(len(records_bytes)) + records_bytes])]))
        r = self.request(API_PRODUCE, 3, body)
        topics = r.array(lambda x: (x.string(), x.array(lambda y: (y.i32(), y.i16(), y.i64(), y.i64()))))
        (_, [(_, err, base, _)]), = topics
        return err, base

    def fetch(self, topic, partition, offset, max_bytes=4 << 20, max_wait_ms=0, min_bytes=0):
        """Fetch v4 of one partition: (error_code, high_watermark, [WireRecord])."""
        body = (i32(-1) + i32(max_wait_ms) + i32(min_bytes) + i32(max_bytes) + i8(0)
                + array([string(topic) + array([i32(partition) + i64(offset) + i32(max_bytes)])]))
        r = self.request(API_FETCH, 4, body)
        r.i32()  # throttle

        def part(y):
            p, err, hw, _lso = y.i32(), y.i16(), y.i64(), y.i64()
            y.array(lambda z: (z.i64(), z.i64()))  # aborted transactions
            return p, err, hw, y.bytes32()
        (_, [(_, err, hw, recs)]), = r.array(lambda x: (x.string(), x.array(part)))
        return err, hw, parse_batches(recs or b"")

    def list_offsets(self, topic, partition, timestamp):
        """ListOffsets v1: (error_code, timestamp, offset)."""
        body = i32(-1) + array([string(topic) + array([i32(partition) + i64(timestamp)])])
        r = self.request(API_LIST_OFFSETS, 1, body)
        (_, [(_, err, ts, off)]), = r.array(
            lambda x: (x.string(), x.array(lambda y: (y.i32(), y.i16(), y.i64(), y.i64()))))
        return err, ts, off


# --- a recording proxy -----------------------------------------------------------------------

class ProtocolRecorder:
    """Listens on a loopback port (bound at construction, so a broker can advertise it) and
    forwards every connection to `127.0.0.1:target`, noting (api key, version) of each request
    frame the client sends. `take()` returns and clears what was seen: {(key, version): count}."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.target = None
        self.seen = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._socks = []
        self._thread = None

    def start(self, target_port):
        self.target = target_port
        self._thread = threading.Thread(target=self._accept, daemon=True, name="kafka-recorder")
        self._thread.start()
        return self

    def take(self):
        with self.lock:
            out, self.seen = self.seen, {}
        return out

    def _accept(self):
        self.listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self.lock:
                self._socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src, dst, requests):
        pending = b""
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if requests:
                    pending += data
                    while len(pending) >= 8:
                        n = struct.unpack(">i", pending[:4])[0]
                        if len(pending) < 4 + n:
                            break
                        key, version = struct.unpack(">hh", pending[4:8])
                        with self.lock:
                            self.seen[(key, version)] = self.seen.get((key, version), 0) + 1
                        pending = pending[4 + n:]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self._stop.set()
        try:
            self.listener.close()
        except OSError:
            pass
        with self.lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.close()
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(5)
