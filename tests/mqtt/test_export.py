"""`silt export FILTER --since --until`: exactly the records of the matching topics in the time
range come out, byte-identical, as JSON lines and as Parquet; a bad filter is refused."""

import base64
import json
import subprocess
import time

import pyarrow.parquet as pq
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from conftest import SILT_BIN, Client


def export(s, *args, check=True):
    cmd = [SILT_BIN, "export", *args, "--admin", f"127.0.0.1:{s.admin_port}"]
    r = subprocess.run(cmd, capture_output=True, timeout=60)
    if check:
        assert r.returncode == 0, f"{args}: rc={r.returncode} {r.stderr!r}"
    return r


def payload_of(line):
    if line["payload_encoding"] == "base64":
        return base64.b64decode(line["payload"])
    return line["payload"].encode()


def publish(c, topic, payload, user=()):
    props = Properties(PacketTypes.PUBLISH)
    for k, v in user:
        props.UserProperty = (k, v)
    c.c.publish(topic, payload, qos=1, properties=props if user else None).wait_for_publish(10)


def test_export_selects_by_filter_and_time(silt, tmp_path):
    c = Client(silt, "exporter")
    binary = bytes(range(256))
    publish(c, "a/1/t", b"early")
    publish(c, "a/2/t", b"early2")
    time.sleep(1.0)
    since = int(time.time() * 1000)
    time.sleep(0.2)
    publish(c, "a/1/t", binary, user=[("k", "v"), ("k", "w")])
    publish(c, "a/2/t", "héllo".encode())
    publish(c, "a/2/u", b"other topic")
    publish(c, "b/1/t", b"other root")
    publish(c, "a/1/t", b"second")
    time.sleep(0.2)
    until = int(time.time() * 1000)
    time.sleep(0.2)
    publish(c, "a/1/t", b"late")
    c.close()

    r = export(silt, "a/+/t", "--since", str(since), "--until", str(until))
    lines = [json.loads(x) for x in r.stdout.decode().splitlines()]
    got = [(x["topic"], payload_of(x)) for x in lines]
    assert got == [("a/1/t", binary), ("a/1/t", b"second"), ("a/2/t", "héllo".encode())]
    assert lines[0]["payload_encoding"] == "base64"
    assert lines[0]["user_properties"] == [["k", "v"], ["k", "w"]]
    assert lines[2]["payload_encoding"] == "utf8" and lines[2]["payload"] == "héllo"
    assert all(since <= x["timestamp_ms"] < until and x["qos"] == 1 for x in lines)
    assert b"exported 3 records" in r.stderr

    out = tmp_path / "out.parquet"
    export(silt, "a/+/t", "--since", str(since), "--until", str(until), "--format", "parquet", "-o", str(out))
    t = pq.read_table(out).to_pylist()
    assert [(x["topic"], x["payload"]) for x in t] == got
    # The tables' `properties` is a map: one value per name (a repeated user property keeps one).
    assert dict(t[0]["properties"])["k"] in ("v", "w")
    assert dict(t[0]["properties"])["mqtt.publisher"] == "exporter"

    # Defaults: from the beginning to now.
    every = [json.loads(x) for x in export(silt, "a/1/#").stdout.decode().splitlines()]
    assert [payload_of(x) for x in every] == [b"early", binary, b"second", b"late"]


def test_a_bad_filter_is_refused(silt):
    r = export(silt, "a/#/b", check=False)
    assert r.returncode != 0
    assert b"InvalidArgument" in r.stderr and b"a/#/b" in r.stderr, r.stderr
    r = export(silt, "a", "--format", "parquet", check=False)
    assert r.returncode != 0 and b"--output" in r.stderr


def test_records_larger_than_a_grpc_default_message_come_out(start_silt):
    # A node that takes 8 MiB packets: an export batch then exceeds gRPC's 4 MiB default.
    s = start_silt("[mqtt]\nmax_packet_size = 9000000\n")
    c = Client(s, "big-exporter")
    big = bytes(range(256)) * (6 << 12)  # 6 MiB
    publish(c, "big/1", big)
    publish(c, "big/1", b"small")
    c.close()
    r = export(s, "big/#")
    lines = [json.loads(x) for x in r.stdout.decode().splitlines()]
    assert [payload_of(x) for x in lines] == [big, b"small"]
