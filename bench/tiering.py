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

Settings (environment): DURATION (s, 10), RATE (msgs/s of the paced run, 5000), PAYLOAD
(bytes, 256), UPLOAD_MB (256), RESULTS (JSON lines file).
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
    print(f"\nJSON lines: {results}")


if __name__ == "__main__":
    main()
