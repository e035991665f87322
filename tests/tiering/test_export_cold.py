"""`silt export` of records whose segments were uploaded and evicted from the local disk: the
node reads them back from the bucket and every acknowledged record comes out, byte-identical."""

import base64
import hashlib
import json
import subprocess
import time

from test_tiering import MiB, publish_load, wait_uploaded
from tiering_harness import SILT_BIN, Ledger, dir_bytes, wait_until

pytest_plugins = ["tiering_harness"]  # the `tiering` fixture


def test_export_reads_evicted_segments_from_the_bucket(tiering):
    t = tiering
    size = 16 * 1024
    config = t.config(storage={"segment_bytes": MiB, "segment_max_age_ms": 1000, "tail_cache_bytes": MiB},
                      tiering={"hot_cache_bytes": MiB})
    node = t.node("a", config)
    mon = t.monitor(node)
    pub = t.client(node, "cold-pub")
    ledger = Ledger()
    publish_load(pub, ledger, [f"cold/{i}" for i in range(4)], 8 * MiB // size, size)
    pub.close()
    wait_uploaded(mon, since=time.monotonic() + 3, timeout=120)
    local = lambda: dir_bytes(node.data_dir, skip=("index",))  # noqa: E731
    wait_until(lambda: local() < ledger.bytes_sent // 2, 30, interval=1, what="eviction")
    gets_before = mon.latest("gets") or 0

    r = subprocess.run([SILT_BIN, "export", "cold/+", "--admin", f"127.0.0.1:{node.admin_port}"],
                       capture_output=True, timeout=180)
    assert r.returncode == 0, r.stderr
    got = {}
    for line in r.stdout.decode().splitlines():
        x = json.loads(line)
        p = base64.b64decode(x["payload"]) if x["payload_encoding"] == "base64" else x["payload"].encode()
        got[Ledger.parse(p)] = hashlib.sha256(p).digest()
    assert set(got) == ledger.acked
    assert all(ledger.digests[k] == d for k, d in got.items())
    # The evicted part came from the bucket (ranged GETs).
    assert mon.wait("gets", lambda v: v > gets_before, 15, since=time.monotonic()) > gets_before
