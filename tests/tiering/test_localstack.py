"""Silt on a second S3 implementation: LocalStack's S3 (host mode, no Docker), started and stopped
by `localstack/start.sh` and `localstack/stop.sh`, so the development scripts are tested too and
the node runs with exactly the environment that start.sh prints.

One recovery: QoS 1 messages (segments large enough for multipart uploads) and retained
messages reach the bucket; the node is SIGKILLed and its data directory deleted; a new node on an
empty directory and the same prefix gives the persistent session every acknowledged message, in
order and byte for byte, and the retained messages.

start.sh creates `.venv-localstack` (Python 3.13, `localstack/requirements.txt`) on first use,
about 20 s; `scripts/test.sh` does that up front with `start.sh --install-only`.
"""

import os
import queue
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from test_tiering import check_manifest, persistent_subscriber, publish_load, resume, wait_uploaded
from tiering_harness import Ledger, Receiver, S3Bucket, Tiering, free_port_pairs, is_success, wait_until

MiB = 1 << 20
SCRIPTS = Path(__file__).resolve().parents[2] / "localstack"


def is_localstack(pid):
    """Whether `pid` is a live LocalStack process (a zombie's command line is empty)."""
    try:
        return b"localstack.runtime.main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class LocalStack(S3Bucket):
    """LocalStack's S3 on a free loopback port with its files in `base_dir`, run by the scripts in
    `localstack/`. `env()` is what start.sh printed for `silt serve`."""

    def __init__(self, base_dir, bucket="silt-tiering"):
        self.dir = Path(base_dir)
        self.log_path = self.dir / "localstack.log"
        (self.port,) = free_port_pairs(1)
        # LocalStack takes any key; these are the ones start.sh prints.
        super().__init__(f"http://127.0.0.1:{self.port}", bucket, "test", "test")
        self.printed_env = None
        self.printed_url = None
        self.pid = None

    def _run(self, script, timeout):
        env = dict(os.environ, SILT_LOCALSTACK_PORT=str(self.port), SILT_LOCALSTACK_DIR=str(self.dir),
                   SILT_LOCALSTACK_BUCKET=self.bucket)
        r = subprocess.run(["bash", str(SCRIPTS / script)], env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"{script} exited with {r.returncode}:\n{r.stdout}{r.stderr}"
        return r.stdout

    def start(self, timeout=600):
        """start.sh (installing LocalStack first if needed); reads the `silt serve` line it printed."""
        began = time.monotonic()
        out = self._run("start.sh", timeout)
        print(out, f"start.sh took {time.monotonic() - began:.1f}s")
        self.pid = int((self.dir / "localstack.pid").read_text())
        line = next((x for x in out.splitlines() if " silt serve " in x), None)
        assert line, f"start.sh printed no `silt serve` line:\n{out}"
        words = shlex.split(line)
        cmd = words.index("silt")
        assert words[cmd:cmd + 3] == ["silt", "serve", "--object-store"], line
        self.printed_env = dict(w.split("=", 1) for w in words[:cmd])
        self.printed_url = words[cmd + 3]
        return self

    def env(self):
        return dict(self.printed_env)

    @property
    def running(self):
        return self.pid is not None and is_localstack(self.pid)

    def stop(self, timeout=60):
        """stop.sh, which stops the process by the PID in its pid file."""
        if self.pid is not None:
            print(self._run("stop.sh", timeout))
            self.pid = None


@pytest.fixture
def localstack(request):
    """A `Tiering` world (see tiering_harness) whose bucket is on LocalStack."""
    with tempfile.TemporaryDirectory(prefix="silt-localstack-") as d:
        s3 = LocalStack(Path(d) / "localstack")
        t = Tiering(d, request.node.name, s3=s3)
        try:
            s3.start()
            yield t
        finally:
            t.cleanup()  # the nodes and clients, then stop.sh
            t.report()


def test_recovery_from_localstack(localstack):
    """25 MiB of QoS 1 messages over 10 topics and retained messages, uploaded (multipart) to
    LocalStack; SIGKILL, data directory deleted: a new node on the bucket gives the persistent
    session everything, in order, and the retained messages; stop.sh then ends LocalStack."""
    t = localstack
    ls = t.s3
    # The line start.sh printed names the variables silt reads (tiering/src/store.rs).
    assert ls.printed_env == {
        "AWS_ENDPOINT_URL": ls.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
    }, ls.printed_env
    assert ls.printed_url.startswith(f"s3://{ls.bucket}/"), ls.printed_url
    assert ls.running

    # 16 MiB segments in 5 MiB parts: every sealed segment goes up as a multipart upload.
    config = t.config(storage={"segment_bytes": 16 * MiB, "segment_max_age_ms": 1000},
                      tiering={"multipart_part_bytes": 5 * MiB}, mqtt={"sys_interval_secs": 1})
    one = t.node("one", config)
    mon = t.monitor(one)
    persistent_subscriber(t, one, "ls-sub", "load/#")

    pub = t.client(one, "ls-pub")
    retained = {"ret/a": b"a-second", "ret/b": b"b" * 3000}
    for topic, payload in [("ret/a", b"a-first"), ("ret/a", b"a-second"), ("ret/b", b"b" * 3000)]:
        assert is_success(pub.publish(topic, payload, retain=True))
    ledger = Ledger()
    publish_load(pub, ledger, [f"load/{i}" for i in range(10)], count=400, size=64 * 1024)
    ended = time.monotonic()
    pub.close()

    # The last segment is sealed segment_max_age_ms after the last publish, then uploaded.
    wait_uploaded(mon, since=ended + 3, timeout=120)
    objects = check_manifest(t.manifest(), t)
    assert sum(o["size"] for o in objects) >= 400 * 64 * 1024, objects
    assert "s3.CompleteMultipartUpload => 200" in ls.log_path.read_text(errors="replace"), \
        "no multipart upload reached LocalStack"

    one.kill()  # SIGKILL: no graceful upload, only what the bucket holds survives
    t.wipe(one)
    two = t.node("two", config)
    wait_until(lambda: two.readyz and two.readyz[-1][0] == 200, 60, what="/readyz 200 on node two")
    two.wait_log(r"commitlog restored from the object store", 5)
    rx = Receiver(ledger)
    resume(t, two, "ls-sub", rx)
    rx.wait_for(ledger.acked, timeout=120)
    rx.assert_exact(ledger.acked_by_topic("load/"))

    reader = t.client(two, "ls-retained")
    reader.subscribe("ret/#")
    got = {}
    while True:
        try:
            m = reader.get(timeout=3)
        except queue.Empty:
            break
        assert m.retain, f"{m.topic} arrived without the retain flag"
        got[m.topic] = bytes(m.payload)
    assert got == retained

    two.kill()
    pid = ls.pid
    ls.stop()
    assert not is_localstack(pid), f"LocalStack (pid {pid}) still runs after stop.sh"
    assert not (ls.dir / "localstack.pid").exists()
