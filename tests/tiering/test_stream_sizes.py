"""Per-stream sizes (issue 11): each stream's record bytes on the local disk and in the bucket,
from the per-stream figures the uploader writes into each segment object's manifest entry.

Known traffic on a real S3 server (SeaweedFS): 200 x 1 KiB to `alpha/...` and 50 x 1 KiB to
`beta/...` over MQTT, the active segment rolled through the admin API, then the figures read
where an operator reads them: `/api/status`, `silt streams --json` and `/metrics`
(`silt_stream_bytes{stream, location}`), and after a restart on an emptied data directory
(recovered from the bucket) the bucket figures are the same.
"""

import json
import re
import subprocess

import requests

from tiering_harness import SILT_BIN, is_success, wait_until

pytest_plugins = ["tiering_harness"]  # the `tiering` fixture

KiB = 1024
COUNTS = {"alpha": 200, "beta": 50}
# A record is its payload plus its topic, timestamp and header fields: well under this each.
RECORD_OVERHEAD = 256


def status_streams(node):
    doc = requests.get(f"http://127.0.0.1:{node.admin_port}/api/status", timeout=10).json()
    return {s["name"]: s for s in doc["streams"]}, doc["streams_other"]


def cli_streams(node):
    r = subprocess.run([SILT_BIN, "streams", "--json", "--admin", f"127.0.0.1:{node.admin_port}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return {s["name"]: s for s in json.loads(r.stdout)}


def metric_bytes(node):
    text = requests.get(f"http://127.0.0.1:{node.admin_port}/metrics", timeout=10).text
    return {(m.group(1), m.group(2)): int(float(m.group(3))) for m in
            re.finditer(r'^silt_stream_bytes\{stream="([^"]+)",location="(\w+)"\} (\S+)$', text, re.M)}


def check_bounds(bucket):
    for stream, count in COUNTS.items():
        payload = count * KiB
        assert payload <= bucket[stream] <= payload + count * RECORD_OVERHEAD, (stream, bucket[stream], payload)
    assert bucket["alpha"] > bucket["beta"]


def test_stream_sizes_local_and_in_the_bucket(tiering):
    t = tiering
    # $SYS off: its statistics are log records too. No age-based roll: the test rolls.
    config = t.config(mqtt={"sys_interval_secs": 0})
    node = t.node("a", config)
    pub = t.client(node, "sizes-pub")
    items = [(f"alpha/{i % 4}", bytes([i % 251]) * KiB) for i in range(COUNTS["alpha"])]
    items += [(f"beta/{i % 2}", bytes([i % 241]) * KiB) for i in range(COUNTS["beta"])]
    assert all(is_success(rc) for rc in pub.publish_many(items, window=20))

    r = subprocess.run([SILT_BIN, "roll-segment", "--admin", f"127.0.0.1:{node.admin_port}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr

    def uploaded():
        streams, _ = status_streams(node)
        done = all(streams.get(s, {}).get("bucket_bytes", 0) >= c * KiB for s, c in COUNTS.items())
        return done and streams
    streams = wait_until(uploaded, 60, interval=0.5, what="both streams' segments uploaded")
    _, other = status_streams(node)
    bucket = {s: streams[s]["bucket_bytes"] for s in COUNTS}
    print(f"bucket bytes {bucket}, not attributed {other}")
    check_bounds(bucket)
    # Nothing evicted (the default hot cache is far larger): the same bytes are local.
    assert {s: streams[s]["local_bytes"] for s in COUNTS} == bucket, streams
    assert other["bucket_bytes"] > 0, other  # framing and footers, attributed to no stream

    # The manifest names them, so they survive recovery from the bucket.
    m = t.manifest()
    named = {}
    for o in m["objects"]:
        for s, b in o.get("streams", {}).items():
            named[s] = named.get(s, 0) + b
    assert {s: named.get(s) for s in COUNTS} == bucket, m

    listed = cli_streams(node)
    assert {s: int(listed[s]["bucket_bytes"]) for s in COUNTS} == bucket, listed
    assert {s: int(listed[s]["local_bytes"]) for s in COUNTS} == bucket, listed

    metrics = metric_bytes(node)
    assert {s: metrics[(s, "bucket")] for s in COUNTS} == bucket, metrics
    assert {s: metrics[(s, "local")] for s in COUNTS} == bucket, metrics

    # An emptied data directory recovered from the bucket: the bucket figures are the same.
    pub.close()
    node.stop()
    t.wipe(node)
    node.start()
    again = wait_until(lambda: (m := metric_bytes(node)) and all((s, "bucket") in m for s in COUNTS) and m,
                       60, interval=0.5, what="sizes after recovery")
    assert {s: again[(s, "bucket")] for s in COUNTS} == bucket, again
