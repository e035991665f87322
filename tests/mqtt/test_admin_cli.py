"""The gRPC admin API through its CLI (`silt status`, `silt sessions`, ...) against a running
node with known MQTT and Kafka traffic, on the same admin port as /metrics and /api/status; and
the bearer token of `[admin] token_file`."""

import json
import os
import re
import subprocess
import time

import requests
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from conftest import SILT_BIN, Client


def cli(s, *args, token_file=None, check=True):
    cmd = [SILT_BIN, *args, "--admin", f"127.0.0.1:{s.admin_port}"]
    if token_file:
        cmd += ["--token-file", token_file]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check:
        assert r.returncode == 0, f"{args}: rc={r.returncode} {r.stderr}"
    return r


def cli_json(s, *args, **kw):
    return json.loads(cli(s, *args, "--json", **kw).stdout)


def kafka_port(s):
    return next(int(m.group(1)) for line in s.log
                if (m := re.search(r'kafka listener bound kind="tcp" addr=127\.0\.0\.1:(\d+)', line)))


def segments(s):
    text = requests.get(f"http://127.0.0.1:{s.admin_port}/metrics", timeout=10).text
    return float(re.search(r"^silt_log_segments (\S+)$", text, re.M).group(1))


def eventually(what, f, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        got = f()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout}s")
        time.sleep(0.2)


def persistent(s, client_id):
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    return Client(s, client_id, clean=False, properties=props)


def test_status_streams_and_roll_segment(silt):
    status = cli_json(silt, "status")
    version = subprocess.run([SILT_BIN, "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
    assert status["version"] == version and status["epoch"] >= 1 and status["node_id"], status
    listeners = {(x["protocol"], x["address"]) for x in status["listeners"]}
    assert ("admin", f"127.0.0.1:{silt.admin_port}") in listeners, listeners
    assert ("mqtt tcp", f"127.0.0.1:{silt.port}") in listeners, listeners
    table = cli(silt, "status").stdout.splitlines()
    assert table[0].split()[:4] == ["NODE", "EPOCH", "VERSION", "UPTIME"], table
    assert table[1].split()[0] == status["node_id"] and table[1].split()[2] == version, table
    assert any(line.split() == ["mqtt", "tcp", f"127.0.0.1:{silt.port}"] for line in table), table

    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": f"127.0.0.1:{kafka_port(silt)}", "acks": "all"})
    p.produce("meters", value=b"x")
    assert p.flush(30) == 0
    streams = [x for x in cli_json(silt, "streams") if x["name"] == "meters"]
    assert len(streams) == 1 and streams[0]["partitions"] == 1, streams
    assert streams[0]["tier"] == "object" and streams[0]["ack"] == "local", streams
    assert cli_json(silt, "streams", "meters") == streams[0]
    missing = cli(silt, "streams", "no/such", check=False)
    assert missing.returncode == 1 and "NotFound" in missing.stderr, missing.stderr

    before = segments(silt)
    rolled = cli_json(silt, "roll-segment")
    assert rolled["segments"] == before + 1, (before, rolled)
    assert segments(silt) == before + 1


def test_sessions_disconnect_and_delete_session(silt):
    sub = persistent(silt, "admin-offline")
    sub.c.subscribe("tele/#", qos=1)
    assert sub.subacks.get(timeout=10)
    sub.close()
    pub = Client(silt, "admin-pub")
    for i in range(7):
        pub.c.publish(f"tele/{i}", b"v", qos=1).wait_for_publish(10)
    pub.close()

    one = cli_json(silt, "sessions", "admin-offline")
    assert one == {"client_id": "admin-offline", "online": False, "backlog": 7, "subscriptions": ["tele/#"]}, one
    listed = {x["client_id"]: x for x in cli_json(silt, "sessions")}
    assert listed["admin-offline"]["backlog"] == 7, listed
    rows = [line.split() for line in cli(silt, "sessions").stdout.splitlines()]
    assert ["admin-offline", "no", "7", "tele/#"] in rows, rows

    # A live client is kicked and sees the disconnect; its persistent session stays.
    live = persistent(silt, "admin-live")
    assert cli_json(silt, "sessions", "admin-live")["online"] is True
    cli(silt, "disconnect", "admin-live")
    # MQTT 5.0: DISCONNECT with Administrative action (0x98), not Session taken over.
    rc = live.disconnects.get(timeout=10)
    assert getattr(rc, "value", rc) == 0x98, rc
    live.c.loop_stop()
    eventually("offline", lambda: cli_json(silt, "sessions", "admin-live")["online"] is False)
    gone = cli(silt, "disconnect", "admin-live", check=False)
    assert gone.returncode == 1 and "NotFound" in gone.stderr, gone.stderr

    # An online session is refused without --force.
    again = persistent(silt, "admin-live")
    assert again.flags.session_present
    refused = cli(silt, "delete-session", "admin-live", check=False)
    assert refused.returncode == 1 and "FailedPrecondition" in refused.stderr, refused.stderr
    forced = cli_json(silt, "delete-session", "admin-live", "--force")
    assert forced["disconnected"] is True, forced
    again.disconnects.get(timeout=10)
    again.c.loop_stop()

    # An offline session is gone: a reconnect without clean start finds none.
    assert cli_json(silt, "delete-session", "admin-offline") == {
        "client_id": "admin-offline", "deleted": True, "disconnected": False}
    assert "NotFound" in cli(silt, "sessions", "admin-offline", check=False).stderr
    back = persistent(silt, "admin-offline")
    assert not back.flags.session_present
    assert back.none(1.0)
    back.close()


def test_groups_and_reset_offsets(silt):
    from confluent_kafka import Consumer, Producer, TopicPartition
    port = kafka_port(silt)
    p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": "all"})
    for i in range(20):
        p.produce("invoices", value=f"v{i}".encode())
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "billing", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("invoices", 0, 12)], asynchronous=False)
    c.close()

    assert cli_json(silt, "offsets", "invoices", "--earliest") == [{"topic": "invoices", "partition": 0, "offset": 0}]
    assert cli_json(silt, "offsets", "invoices", "--latest") == [{"topic": "invoices", "partition": 0, "offset": 20}]
    assert cli_json(silt, "offsets", "invoices", "--time", "0") == [{"topic": "invoices", "partition": 0, "offset": 0}]
    future_ms = str(int(time.time() * 1000) + 3600_000)
    assert cli_json(silt, "offsets", "invoices", "--time", future_ms) == [
        {"topic": "invoices", "partition": 0, "offset": -1}]
    assert "NotFound" in cli(silt, "offsets", "no-such-topic", "--latest", check=False).stderr

    g = cli_json(silt, "groups", "billing")
    assert g["state"] == "Empty" and g["members"] == [], g
    assert g["offsets"] == [{"topic": "invoices", "partition": 0, "committed": 12, "end": 20, "lag": 8}], g
    rows = [line.split() for line in cli(silt, "groups").stdout.splitlines()]
    assert ["billing", "Empty", "0", "invoices", "0", "12", "20", "8"] in rows, rows

    # With an active member: refused, as Kafka's tool does.
    member = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "billing",
                       "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    member.subscribe(["invoices"])
    first = eventually("a record from offset 12", lambda: member.poll(1.0))
    assert first.offset() == 12
    refused = cli(silt, "reset-offsets", "billing", "invoices", "--to-earliest", check=False)
    assert refused.returncode == 1 and "FailedPrecondition" in refused.stderr and "active member" in refused.stderr
    member.close()
    eventually("the group empty again", lambda: cli_json(silt, "groups", "billing")["state"] == "Empty")

    reset = cli_json(silt, "reset-offsets", "billing", "invoices", "--to-earliest")
    assert reset == [{"topic": "invoices", "partition": 0, "offset": 0}], reset
    assert cli_json(silt, "groups", "billing")["offsets"][0]["lag"] == 20
    again = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "billing",
                      "enable.auto.commit": False, "auto.offset.reset": "latest"})
    try:
        again.subscribe(["invoices"])
        m = eventually("a record after the reset", lambda: again.poll(1.0))
        assert m.offset() == 0 and m.value() == b"v0"
    finally:
        again.close()
    eventually("empty", lambda: cli_json(silt, "groups", "billing")["state"] == "Empty")
    latest = cli_json(silt, "reset-offsets", "billing", "invoices", "--to-latest")
    assert latest == [{"topic": "invoices", "partition": 0, "offset": 20}], latest
    future = cli_json(silt, "reset-offsets", "billing", "invoices", "--to-datetime", future_ms)
    assert future == [{"topic": "invoices", "partition": 0, "offset": 20}], future
    past = cli_json(silt, "reset-offsets", "billing", "invoices", "--to-datetime", "0")
    assert past == [{"topic": "invoices", "partition": 0, "offset": 0}], past


def test_token_file_is_required_when_set(start_silt, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-admin-token\n")
    s = start_silt(f'[admin]\ntoken_file = "{token}"\n')
    plain = cli(s, "status", check=False)
    assert plain.returncode == 1 and "Unauthenticated" in plain.stderr, plain.stderr
    wrong = tmp_path / "wrong"
    wrong.write_text("s3cret-admin-tokeX")
    assert "Unauthenticated" in cli(s, "status", token_file=str(wrong), check=False).stderr
    assert cli_json(s, "status", token_file=str(token))["node_id"]
    base = f"http://127.0.0.1:{s.admin_port}"
    assert requests.get(f"{base}/api/status", timeout=10).status_code == 401
    ok = requests.get(f"{base}/api/status", headers={"Authorization": "Bearer s3cret-admin-token"}, timeout=10)
    assert ok.status_code == 200 and ok.json()["node"]["id"]
    for open_path in ("/metrics", "/healthz", "/readyz"):
        assert requests.get(base + open_path, timeout=10).status_code == 200, open_path
    assert not any("s3cret-admin-token" in line for line in s.log)


def test_admin_off_loopback_needs_a_token_file(data_dir):
    r = subprocess.run([SILT_BIN, "serve", "--data-dir", os.path.join(data_dir, "d"), "--mqtt", "127.0.0.1:0",
                        "--kafka", "127.0.0.1:0", "--admin", "0.0.0.0:0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "admin.token_file" in r.stderr, r.stderr
