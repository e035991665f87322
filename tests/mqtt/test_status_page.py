"""The status page of a running `silt serve`: /api/status carries figures that move with known
traffic (an offline session 30 messages behind, a Kafka consumer group 8 records behind), and
`/`, loaded in headless Chromium with no network but the node, shows them, with its charts.
A screenshot goes to $SILT_TEST_ARTIFACTS (else target/test-artifacts/) for a person to look at."""

import html
import json
import os
import re
import shutil
import subprocess
import time

import pytest
import requests
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from conftest import SILT_BIN, Client

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM = shutil.which("chromium")


def status(s):
    r = requests.get(f"http://127.0.0.1:{s.admin_port}/api/status", timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    return r.json()


def wait_for(s, what, ok, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        doc = status(s)
        if ok(doc):
            return doc
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen in /api/status after {timeout}s: {doc}")
        time.sleep(0.3)


def chromium(tmp_path, *args):
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.iterdir()))}"
    profile.mkdir()
    p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}", *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def cells(dom, table_id):
    """The rows of a table's body, each a list of cell texts."""
    m = re.search(rf'<table id="{table_id}".*?<tbody>(.*?)</tbody>', dom, re.S)
    assert m, f"table #{table_id} missing from the page"
    return [[html.unescape(re.sub(r"<[^>]*>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", m.group(1), re.S)]


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (scripts/test.sh installs it)")
def test_status_page_shows_known_backlogs_and_lag(start_silt, tmp_path):
    from confluent_kafka import Consumer, Producer, TopicPartition
    s = start_silt("[mqtt]\nsys_interval_secs = 1\n")
    kafka_port = next(int(m.group(1)) for line in s.log
                      if (m := re.search(r'kafka listener bound kind="tcp" addr=127\.0\.0\.1:(\d+)', line)))

    # A persistent session, offline, 30 QoS 1 messages behind.
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    sub = Client(s, "status-offline-sub", clean=False, properties=props)
    sub.c.subscribe("gauges/#", qos=1)
    assert sub.subacks.get(timeout=10)
    sub.close()
    pub = Client(s, "status-publisher")
    for i in range(30):
        pub.c.publish(f"gauges/g{i % 3}", b"x" * 200, qos=1).wait_for_publish(10)
    pub.close()

    # A consumer group that committed 12 of 20 records: lag 8.
    p = Producer({"bootstrap.servers": f"127.0.0.1:{kafka_port}", "acks": "all"})
    for i in range(20):
        p.produce("orders", value=b"o" * 100)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{kafka_port}", "group.id": "status-readers",
                  "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition("orders", 0, 12)], asynchronous=False)
    finally:
        c.close()

    def backlog(doc):
        return {x["client_id"]: x["backlog"] for x in doc["sessions"]["largest"]}.get("status-offline-sub")

    def lag(doc):
        return [(g["committed"], g["end"], g["lag"]) for g in doc["consumer_groups"]
                if (g["group"], g["topic"], g["partition"]) == ("status-readers", "orders", 0)]

    # Both figures, and two history samples (5 s apart) so the charts have a line.
    doc = wait_for(s, "backlog 30, lag 8 and two samples",
                   lambda d: backlog(d) == 30 and lag(d) == [(12, 20, 8)] and len(d["history"]) >= 2)
    version = subprocess.run([SILT_BIN, "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
    node = doc["node"]
    assert node["version"] == version and node["epoch"] >= 1 and node["id"], node
    assert node["uptime_secs"] >= 1
    listeners = {(x["protocol"], x["address"]) for x in doc["listeners"]}
    assert {("mqtt tcp", f"127.0.0.1:{s.port}"), ("kafka tcp", f"127.0.0.1:{kafka_port}"),
            ("admin", f"127.0.0.1:{s.admin_port}")} <= listeners, listeners
    mqtt, kafka = doc["totals"]["mqtt"], doc["totals"]["kafka"]
    assert mqtt["messages_in"] >= 30 and mqtt["bytes_in"] >= 30 * 200, mqtt
    assert mqtt["connects"] >= 2 and mqtt["connections"] == 0, mqtt
    assert kafka["messages_in"] == 20 and kafka["bytes_in"] >= 20 * 100, kafka
    assert doc["sessions"]["total"] >= 1 and doc["sessions"]["backlog"] >= 30, doc["sessions"]
    # Every QoS 1 publish and the Produce were timed; quantiles come from the buckets.
    ack = doc["latency"]["mqtt_ack"]
    assert ack["count"] >= 30 and 0 < ack["p50_ms"] <= ack["p99_ms"], ack
    assert doc["latency"]["kafka_produce"]["count"] >= 1, doc["latency"]
    streams = {x["name"]: x for x in doc["streams"]}
    assert streams["orders"]["partitions"] == 1 and streams["orders"]["tier"] == "object", streams
    assert streams["gauges"]["partitions"] >= 1, streams
    t = doc["tiering"]
    assert t["epoch"] == node["epoch"] and t["fenced"] is False and t["upload_lag_bytes"] >= 0, t
    assert doc["lakehouse"] == []
    h = doc["history"]
    assert all(a["unix_ms"] < b["unix_ms"] and a["messages_in"] <= b["messages_in"] for a, b in zip(h, h[1:])), h
    assert len(h) <= 120

    # The page, after its scripts ran (fetch /api/status, render), with no other network.
    url = f"http://127.0.0.1:{s.admin_port}/"
    dom = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=10000", url)
    assert re.search(rf'id="node-version">{re.escape(version)}<', dom), dom[:2000]
    assert re.search(rf'id="node-epoch">{node["epoch"]}<', dom)
    assert f"127.0.0.1:{kafka_port}" in dom and f"127.0.0.1:{s.port}" in dom
    assert ["status-offline-sub", "30"] in cells(dom, "sessions"), cells(dom, "sessions")
    assert ["status-readers", "orders", "0", "12", "20", "8"] in cells(dom, "groups"), cells(dom, "groups")
    rows = {r[0]: r for r in cells(dom, "streams")}
    assert rows["orders"][1:3] == ["1", "object"], rows
    assert any(r[0] == "mqtt" and r[2] != "0" for r in cells(dom, "totals")), cells(dom, "totals")
    # Both charts drawn as inline SVG; the throughput one has points (two samples or more).
    for chart in ("chart-throughput", "chart-latency"):
        assert re.search(rf'id="{chart}"[^>]*><svg', dom), chart
    line = re.search(r'<polyline class="line-in" points="([^"]+)"', dom)
    assert line and len(line.group(1).split()) >= 1, dom
    assert "Could not read /api/status" not in dom

    shot = tmp_path / "status-page.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", "--virtual-time-budget=10000", url)
    assert shot.exists() and shot.stat().st_size > 20_000, shot.stat().st_size if shot.exists() else None
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    artifacts = os.environ.get("SILT_TEST_ARTIFACTS") or os.path.join(REPO, "target", "test-artifacts")
    os.makedirs(artifacts, exist_ok=True)
    shutil.copy(shot, os.path.join(artifacts, "status-page.png"))


def test_the_page_and_its_assets_are_served_from_the_binary(start_silt):
    s = start_silt()
    base = f"http://127.0.0.1:{s.admin_port}"
    page = requests.get(base + "/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    # Nothing fetched from elsewhere: every script and stylesheet is the node's own.
    assert not re.search(r'(src|href)="(https?:)?//', page.text), page.text
    for path, kind in (("/status.js", "text/javascript"), ("/status.css", "text/css")):
        r = requests.get(base + path, timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind) and r.text, path


class DevTools:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4, messages
    ended by NUL), so a test can type into the page like a person; no extra packages."""

    def __init__(self, tmp_path):
        profile = tmp_path / "chromium-devtools-profile"
        profile.mkdir()
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def fds():
            # Through copies: a pipe end may already be fd 3 or 4, and dup2 onto itself would
            # leave it close-on-exec.
            r, w = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
             "--remote-debugging-pipe", "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def call(self, method, session=None, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._r, 65536)
                assert chunk, "chromium closed the DevTools pipe"
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                assert "error" not in reply, reply
                return reply["result"]

    def eval(self, expr):
        r = self.call("Runtime.evaluate", self.session, expression=expr, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def wait_for(self, what, expr, timeout=20):
        deadline = time.monotonic() + timeout
        while not self.eval(expr):
            assert time.monotonic() < deadline, f"{what} not seen: {self.eval('document.body.innerText')}"
            time.sleep(0.2)

    def close(self):
        self.proc.kill()
        self.proc.wait(30)
        os.close(self._w)
        os.close(self._r)


def visible(id_):
    return f"!document.getElementById({json.dumps(id_)}).hidden"


def submit_token(dt, token):
    dt.eval(f"document.getElementById('token').value = {json.dumps(token)};"
            "document.getElementById('login').requestSubmit(); true")


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (scripts/test.sh installs it)")
def test_status_page_asks_for_the_token_when_one_is_set(start_silt, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-page-token\n")
    # On loopback too: with a token file the API needs it wherever the listener is.
    s = start_silt(f'[admin]\ntoken_file = "{token}"\n')
    base = f"http://127.0.0.1:{s.admin_port}"
    assert requests.get(base + "/api/status", timeout=10).status_code == 401
    assert requests.get(base + "/", timeout=10).status_code == 200
    node_id = requests.get(base + "/api/status", headers={"Authorization": "Bearer s3cret-page-token"},
                           timeout=10).json()["node"]["id"]

    dt = DevTools(tmp_path)
    try:
        dt.call("Page.navigate", dt.session, url=base + "/")
        dt.wait_for("the token form", f"document.readyState === 'complete' && {visible('login')}")
        assert dt.eval("document.getElementById('node-id').textContent") == "…"
        assert dt.eval(f"{visible('error')}") is False

        submit_token(dt, "wrong-token")
        dt.wait_for("the wrong-token error",
                    f"{visible('login-error')} && document.getElementById('login-error').textContent.includes('not accepted')")
        assert dt.eval("sessionStorage.length") == 0
        assert dt.eval("document.getElementById('node-id').textContent") == "…"

        submit_token(dt, "s3cret-page-token")
        dt.wait_for("the node's data", f"document.getElementById('node-id').textContent === {json.dumps(node_id)}")
        assert dt.eval(f"{visible('login')}") is False
        assert dt.eval("sessionStorage.getItem('silt-admin-token')") == "s3cret-page-token"
        assert "s3cret" not in dt.eval("location.href")
        # A reload in the same tab keeps it: the data comes back without the form.
        dt.call("Page.reload", dt.session)
        dt.wait_for("the data after a reload",
                    f"document.readyState === 'complete' && document.getElementById('node-id').textContent === {json.dumps(node_id)}")
        assert dt.eval(f"{visible('login')}") is False
    finally:
        dt.close()
    assert not any("s3cret" in line for line in s.log)
