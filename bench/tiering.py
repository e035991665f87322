#!/usr/bin/env python3
"""Tiering figures beside their references, in one run, on a real S3-compatible server.

    .venv/bin/python bench/tiering.py                  # about 3 minutes plus the release build
    DURATION=5 UPLOAD_MB=128 .venv/bin/python bench/tiering.py

What it measures (SeaweedFS `weed mini` on loopback, started and stopped here by PID; Silt
release build; `silt-loadgen` for MQTT load):

1. QoS 1 fan-in (50 publishers, one wildcard subscriber), paced and unpaced, for three
   Silt configurations: the default local-directory object store with ack "local"
   (the reference), S3 with ack "local", and S3 with ack "object" (every publish
   acknowledged only once the bucket holds it). Printed as the loadgen's comparison tables.
2. Upload throughput: Silt's uploader (sealed 16 MiB segments -> PUT/multipart, footer
   built, manifest committed) against raw sequential 16 MiB PUTs with boto3 to the same
   server, as MiB/s and their ratio.
3. Requests at a steady ingest: INGEST_MB MB/s of QoS 0 across 1,000 topics (one publisher
   each, 4 KiB payloads) with the default segment and part sizes; the store's write requests
   per second (PUT, multipart steps, manifest versions; counted by Silt, `$SYS`) over the
   steady part. The goal at 50 MB/s: at most 4 per second.
4. `ack = "object"` latency beside a single PUT's: the PUBACK p50/p99 of item 1 next to the
   latency of sequential small PUTs (1 KiB) and 16 MiB PUTs with boto3 to the same server.
5. Cold reads: COLD_MB queued for an offline session in 16 MiB segments with no hot cache,
   uploaded and evicted, then drained (ranged GETs through the block cache), against
   sequential whole-object GETs of the same objects with boto3, in MiB/s.

Settings (environment): DURATION (s, 10), RATE (msgs/s of the paced run, 5000), PAYLOAD
(bytes, 256), UPLOAD_MB (256), INGEST_MB (50), STEADY_S (40), COLD_MB (256), RESULTS (JSON
lines file).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "tiering"))
from tiering_harness import SeaweedFS  # noqa: E402

import paho.mqtt.client as mqtt  # noqa: E402

DURATION = float(os.environ.get("DURATION", "10"))
RATE = int(os.environ.get("RATE", "5000"))
PAYLOAD = int(os.environ.get("PAYLOAD", "256"))
UPLOAD_MB = int(os.environ.get("UPLOAD_MB", "256"))
INGEST_MB = float(os.environ.get("INGEST_MB", "50"))
STEADY_S = float(os.environ.get("STEADY_S", "40"))
COLD_MB = int(os.environ.get("COLD_MB", "256"))
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", "/var/tmp/silt-target"))


def build():
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "silt", "-p", "silt-loadgen"], cwd=ROOT, check=True,
                   env={**os.environ, "CARGO_TARGET_DIR": str(TARGET)})
    return TARGET / "release" / "silt", TARGET / "release" / "silt-loadgen"



class Silt:
    def __init__(self, silt, work, name, toml, store_url, env):
        self.port = None
        data = work / f"data-{name}"
        cfg = work / f"{name}.toml"
        cfg.write_text(toml)
        self.log = work / f"{name}.log"
        self.proc = subprocess.Popen(
            [silt, "serve", "--mqtt", "127.0.0.1:0", "--data-dir", data, "--config", cfg, "--object-store", store_url],
            stderr=open(self.log, "w"), stdout=subprocess.DEVNULL, env={**os.environ, "SILT_LOG": "info", **env})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.port is None:
            for line in self.log.read_text().splitlines():
                if "silt is running" in line:
                    self.port = int(line.split("mqtt=127.0.0.1:")[1].split()[0])
            time.sleep(0.1)
        if self.port is None:
            self.proc.kill()
            raise RuntimeError(f"silt did not start:\n{self.log.read_text()[-3000:]}")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class SysWatch:
    """Follows $SYS/broker/tiering/# figures."""

    def __init__(self, port):
        self.values = {}
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-sys")
        self.c.on_message = lambda c, u, m: self.values.__setitem__(m.topic.rsplit("/", 1)[1], float(m.payload))
        self.c.connect("127.0.0.1", port)
        self.c.subscribe("$SYS/broker/tiering/#")
        self.c.loop_start()

    def get(self, name, default=0.0):
        return self.values.get(name, default)

    def close(self):
        self.c.loop_stop()
        self.c.disconnect()


def fan_in(loadgen, silt, name, results, extra):
    out = subprocess.run(
        [loadgen, "fan-in", "--addr", f"127.0.0.1:{silt.port}", "--broker", name, "--broker-pid", str(silt.proc.pid),
         "--publishers", "50", "--qos", "1", "--duration", str(DURATION), "--payload", str(PAYLOAD), *extra],
        check=True, capture_output=True, text=True)
    with open(results, "a") as f:
        f.write(out.stdout)


def raw_put_mib_s(s3, n, size):
    body = os.urandom(size)
    started = time.monotonic()
    for i in range(n):
        s3.client().put_object(Bucket=s3.bucket, Key=f"bench/raw/{i}", Body=body)
    return n * size / (1 << 20) / (time.monotonic() - started)


def silt_upload_mib_s(silt_bin, loadgen, work, s3, env):
    """Publishes UPLOAD_MB at QoS 0 in 16 MiB segments while uploads run; rate = bytes put over
    the time from the first to the last PUT."""
    toml = "[storage]\nsegment_bytes = 16777216\nfsync = \"never\"\n[mqtt]\nsys_interval_secs = 1\n"
    silt = Silt(silt_bin, work, "upload", toml, f"s3://{s3.bucket}/bench-upload", env)
    watch = SysWatch(silt.port)
    payload = 16384
    seconds = max(2.0, UPLOAD_MB * (1 << 20) / payload / 20000)
    subprocess.run([loadgen, "fan-in", "--addr", f"127.0.0.1:{silt.port}", "--broker", "upload",
                    "--publishers", "8", "--subscribers", "1", "--qos", "0", "--duration", str(seconds),
                    "--payload", str(payload), "--max-lag", "0"], check=True, capture_output=True, text=True)
    samples = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        samples.append((time.monotonic(), watch.get("put_bytes"), watch.get("upload_lag_bytes", 1)))
        if samples[-1][2] < (16 << 20) and len(samples) > 3:
            break
        time.sleep(0.5)
    watch.close()
    silt.stop()
    moving = [s for s in samples if s[1] > samples[0][1]]
    if len(moving) < 2:
        return None, samples[-1][1]
    first = next(s for s in samples if s[1] > 0)
    last = samples[-1]
    return (last[1] - first[1]) / (1 << 20) / max(0.5, last[0] - first[0]), last[1]


def steady_requests(silt_bin, loadgen, work, s3, env):
    """INGEST_MB MB/s over 1,000 topics for STEADY_S seconds with the default segment (128 MiB)
    and part (32 MiB) sizes; write requests per second between 25% and 100% of the run, and
    the ingest and upload rates over the same span."""
    silt = Silt(silt_bin, work, "steady", "[mqtt]\nsys_interval_secs = 1\n", f"s3://{s3.bucket}/bench-steady", env)
    watch = SysWatch(silt.port)
    payload = 4096
    rate = int(INGEST_MB * 1e6 / payload)
    load = subprocess.Popen(
        [loadgen, "fan-in", "--addr", f"127.0.0.1:{silt.port}", "--broker", "steady", "--publishers", "1000",
         "--qos", "0", "--rate", str(rate), "--payload", str(payload), "--duration", str(STEADY_S), "--max-lag", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(STEADY_S * 0.25)
    first = (time.monotonic(), watch.get("write_requests"), watch.get("put_bytes"), watch.get("puts"))
    report = json.loads(load.communicate()[0].strip().splitlines()[-1])
    last = (time.monotonic(), watch.get("write_requests"), watch.get("put_bytes"), watch.get("puts"))
    watch.close()
    silt.stop()
    span = last[0] - first[0]
    return {
        "ingest_mb_s": report["pub_msgs_per_s"] * payload / 1e6,
        "writes_per_s": (last[1] - first[1]) / span,
        "objects_per_s": (last[3] - first[3]) / span,
        "upload_mb_s": (last[2] - first[2]) / 1e6 / span,
    }


def put_latency_ms(s3, size, n):
    """p50 and p99 of n sequential PUTs of `size` bytes, in ms."""
    body = os.urandom(size)
    times = []
    for i in range(n):
        started = time.monotonic()
        s3.client().put_object(Bucket=s3.bucket, Key=f"bench/latency/{size}/{i}", Body=body)
        times.append((time.monotonic() - started) * 1000)
    times.sort()
    return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))]


def cold_read(silt_bin, loadgen, work, s3, env, evict=True):
    """Drain of COLD_MB read back from the store (`evict`) or from the local segments (the
    reference for the delivery path itself), and raw GETs of the same objects."""
    hot = 0 if evict else 1 << 40
    toml = ("[storage]\nsegment_bytes = 16777216\nfsync = \"never\"\ntail_cache_bytes = 1048576\n"
            f"[mqtt]\nsys_interval_secs = 1\n[tiering]\nhot_cache_bytes = {hot}\n")
    prefix = "bench-cold" if evict else "bench-warm"
    silt = Silt(silt_bin, work, prefix, toml, f"s3://{s3.bucket}/{prefix}", {**env, "SILT_LOG": "info,silt_tiering=debug"})
    watch = SysWatch(silt.port)
    payload = 16384
    messages = COLD_MB * (1 << 20) // payload
    drain = subprocess.Popen(
        [loadgen, "drain", "--addr", f"127.0.0.1:{silt.port}", "--broker", "cold", "--broker-pid",
         str(silt.proc.pid), "--messages", str(messages), "--payload", str(payload), "--publishers", "4",
         "--pause", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = drain.communicate()
    time.sleep(2.5)  # the next $SYS figures
    gets = watch.get("gets")
    watch.close()
    silt.stop()
    if drain.returncode != 0:
        raise RuntimeError(f"drain failed: {err[-2000:]}")
    report = json.loads(out.strip().splitlines()[-1])
    evicted = "evicted uploaded segments" in silt.log.read_text()
    keys = [o["Key"] for page in s3.client().get_paginator("list_objects_v2").paginate(
        Bucket=s3.bucket, Prefix=f"{prefix}/segments/") for o in page.get("Contents", [])]
    started, got = time.monotonic(), 0
    for k in keys:
        got += len(s3.client().get_object(Bucket=s3.bucket, Key=k)["Body"].read())
    raw = got / (1 << 20) / (time.monotonic() - started)
    drained = report["unique"] * payload / (1 << 20) / max(report["drain_s"], 1e-9)
    return {"drain_mib_s": drained, "raw_get_mib_s": raw, "gets": gets, "objects": len(keys),
            "lost": report["lost"], "duplicates": report["duplicates"], "evicted_logged": evicted}


def main():
    silt_bin, loadgen = build()
    work = Path(tempfile.mkdtemp(prefix="silt-tiering-bench."))
    results = Path(os.environ.get("RESULTS", work / "results.jsonl"))
    s3 = SeaweedFS(work / "weed").start()
    env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key, "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": s3.endpoint}
    try:
        configs = [
            ("local-dir", "", f"file://{work}/objects"),
            ("s3-ack-local", "", f"s3://{s3.bucket}/bench-local"),
            ("s3-ack-object", "[topic_defaults]\nack = \"object\"\n", f"s3://{s3.bucket}/bench-object"),
        ]
        for paced in (False, True):
            for name, toml, url in configs:
                silt = Silt(silt_bin, work, name, toml, url, env)
                fan_in(loadgen, silt, name, results, ["--rate", str(RATE)] if paced else [])
                silt.stop()
        raw = raw_put_mib_s(s3, 8, 16 << 20)
        upload, uploaded = silt_upload_mib_s(silt_bin, loadgen, work, s3, env)
        small_put = put_latency_ms(s3, 1024, 200)
        big_put = put_latency_ms(s3, 16 << 20, 10)
        steady = steady_requests(silt_bin, loadgen, work, s3, env)
        cold = cold_read(silt_bin, loadgen, work, s3, env, evict=True)
        warm = cold_read(silt_bin, loadgen, work, s3, env, evict=False)
    finally:
        s3.stop()
    print(f"\nMachine: {os.cpu_count()} CPUs, {os.uname().sysname} {os.uname().release}; SeaweedFS weed mini on "
          f"loopback; QoS 1 fan-in, 50 publishers, payload {PAYLOAD} B, {DURATION:.0f} s per run, paced run at "
          f"{RATE} msgs/s.\n")
    for subject in ("s3-ack-local", "s3-ack-object"):
        print(subprocess.run([loadgen, "table", "--reference", "local-dir", "--subject", subject, str(results)],
                             check=True, capture_output=True, text=True).stdout)
    print("| upload path | MiB/s | ratio |\n|---|---|---|")
    print(f"| raw boto3 PUT, 16 MiB objects, sequential | {raw:.1f} | 1.00 |")
    if upload is None:
        print(f"| Silt uploader (16 MiB segments) | not measured ({uploaded / (1 << 20):.0f} MiB uploaded) | |")
    else:
        print(f"| Silt uploader (16 MiB segments, footer, manifest commit) | {upload:.1f} | {upload / raw:.2f} |")
    acks = {}
    for line in open(results):
        r = json.loads(line)
        if r.get("broker") == "s3-ack-object":
            acks[r["case"]] = r["ack_latency_us"]
    print("\n| latency | p50 ms | p99 ms |\n|---|---:|---:|")
    print(f"| boto3 PUT, 1 KiB, sequential (200) | {small_put[0]:.1f} | {small_put[1]:.1f} |")
    print(f"| boto3 PUT, 16 MiB, sequential (10) | {big_put[0]:.1f} | {big_put[1]:.1f} |")
    for case, a in acks.items():
        print(f"| Silt PUBACK, ack = \"object\", {case} | {a['p50'] / 1000:.1f} | {a['p99'] / 1000:.1f} |")
    print(f"\nSteady ingest, 1,000 topics, 4 KiB QoS 0: {steady['ingest_mb_s']:.1f} MB/s in, "
          f"{steady['upload_mb_s']:.1f} MB/s uploaded, {steady['writes_per_s']:.2f} write requests/s "
          f"({steady['objects_per_s']:.2f} segment objects/s); goal at 50 MB/s: <= 4/s.")
    print(f"\n| cold read | MiB/s | ratio |\n|---|---:|---:|")
    print(f"| boto3 GET, whole objects, sequential ({cold['objects']}) | {cold['raw_get_mib_s']:.1f} | 1.00 |")
    print(f"| Silt offline drain from evicted segments ({cold['gets']:.0f} GETs; lost {cold['lost']}, "
          f"duplicates {cold['duplicates']}) | {cold['drain_mib_s']:.1f} | "
          f"{cold['drain_mib_s'] / cold['raw_get_mib_s']:.2f} |")
    print(f"| Silt offline drain from local segments (reference; {warm['gets']:.0f} GETs) | "
          f"{warm['drain_mib_s']:.1f} | {warm['drain_mib_s'] / cold['raw_get_mib_s']:.2f} |")
    if not cold["evicted_logged"]:
        print("(no eviction was logged: the drain may have read local segments)")
    print(f"\nJSON lines: {results}")


if __name__ == "__main__":
    main()
