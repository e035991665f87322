"""The admin HTTP listener of a running `silt serve`: Prometheus text at /metrics whose figures
move with known MQTT traffic (and never carry a client id or a topic as a label), /healthz and
/readyz, and the default of binding it at all (on, as an operator expects, unless disabled)."""

import re
import subprocess
import time

import requests
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from conftest import SILT_BIN, Client

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def scrape(s):
    r = requests.get(f"http://127.0.0.1:{s.admin_port}/metrics", timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/openmetrics-text"), r.headers
    return parse(r.text)


def parse(text):
    assert text.rstrip().endswith("# EOF"), text[-200:]
    samples = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = SAMPLE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return text, samples


def wait_for(s, name, ok, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        _, got = scrape(s)
        if name in got and ok(got[name]):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} = {got.get(name)} after {timeout}s")
        time.sleep(0.2)


def histogram(text, name, labels=""):
    """`(count, sum, [(le, cumulative count)])` of one histogram series, checked for shape: the
    buckets grow with `le`, end at +Inf, and +Inf equals the count."""
    want = dict(re.findall(r'(\w+)="([^"]*)"', labels))
    buckets = []
    for line in text.splitlines():
        m = re.match(rf"^{name}_bucket\{{(.*)\}} (\S+)$", line)
        if m:
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            le = got.pop("le")
            if got == want:
                buckets.append((float(le), float(m.group(2))))
    assert buckets, f"{name}{labels} has no buckets:\n{text}"
    _, got = parse(text)
    count, total = got[f"{name}_count{labels}"], got[f"{name}_sum{labels}"]
    assert [le for le, _ in buckets] == sorted(le for le, _ in buckets) and buckets[-1][0] == float("inf")
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), buckets
    assert buckets[-1][1] == count, (buckets, count)
    return count, total, buckets


def test_metrics_move_with_known_traffic(start_silt):
    s = start_silt("[mqtt]\nsys_interval_secs = 1\n")
    text, before = scrape(s)
    text_before = text
    for name in ("silt_uptime_seconds", 'silt_connections{protocol="mqtt"}', "silt_log_end_bytes",
                 'silt_messages_received_total{protocol="mqtt"}', 'silt_received_bytes_total{protocol="mqtt"}',
                 'silt_sessions{state="online"}', 'silt_sessions{state="offline"}',
                 'silt_connects_total{protocol="mqtt"}', "silt_session_backlog_messages", "silt_tiering_epoch",
                 'silt_object_store_requests_total{kind="write"}', "silt_index_dispatch_lag_bytes"):
        assert name in before, f"{name} missing from /metrics:\n{text}"

    # A persistent session that goes offline, then 40 QoS 1 publishes it misses.
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    sub = Client(s, "metrics-offline-sub", clean=False, properties=props)
    sub.c.subscribe("meters/#", qos=1)
    assert sub.subacks.get(timeout=10)
    sub.close()
    pub = Client(s, "metrics-publisher")
    wait_for(s, 'silt_connections{protocol="mqtt"}', lambda v: v >= 1)
    payload = b"x" * 1000
    for i in range(40):
        pub.c.publish(f"meters/m{i % 4}", payload, qos=1).wait_for_publish(10)
    received = 'silt_messages_received_total{protocol="mqtt"}'
    got = wait_for(s, received, lambda v: v >= before[received] + 40)
    assert got['silt_received_bytes_total{protocol="mqtt"}'] - before['silt_received_bytes_total{protocol="mqtt"}'] \
        >= 40 * 1000
    assert got["silt_log_end_bytes"] > before["silt_log_end_bytes"] + 40 * 1000
    assert got['silt_sessions{state="online"}'] >= 1 and got['silt_sessions{state="offline"}'] >= 1
    assert got['silt_connects_total{protocol="mqtt"}'] - before['silt_connects_total{protocol="mqtt"}'] >= 2
    # Every QoS 1 publish was timed to its PUBACK, every append to its answer, and the
    # default policy (fsync always) fsynced.
    text, _ = scrape(s)
    acks, ack_seconds, _ = histogram(text, "silt_ack_latency_seconds", '{protocol="mqtt"}')
    acks_before, _, _ = histogram(text_before, "silt_ack_latency_seconds", '{protocol="mqtt"}')
    assert acks - acks_before >= 40 and ack_seconds > 0
    appends, _, _ = histogram(text, "silt_log_append_latency_seconds")
    appends_before, _, _ = histogram(text_before, "silt_log_append_latency_seconds")
    assert appends - appends_before >= 40
    fsyncs, fsync_seconds, _ = histogram(text, "silt_log_fsync_latency_seconds")
    assert fsyncs >= 1 and fsync_seconds > 0
    # The backlog figure comes with the $SYS interval (1 s here).
    got = wait_for(s, "silt_session_backlog_messages", lambda v: v >= 40)
    assert got["silt_session_backlog_max_messages"] >= 40
    # Client publishes only: the node's own $SYS figures (published every second here, the
    # backlog just seen among them) are not messages received.
    assert before[received] == 0 and got[received] == 40, (before[received], got[received])
    pub.close()
    got = wait_for(s, 'silt_connections{protocol="mqtt"}', lambda v: v == 0)

    text, _ = scrape(s)
    for private in ("metrics-offline-sub", "metrics-publisher", "meters/"):
        assert private not in text, f"{private!r} appears in /metrics: labels must stay bounded"


def test_healthz_and_readyz_answer_once_running(start_silt):
    s = start_silt()
    assert requests.get(f"http://127.0.0.1:{s.admin_port}/healthz", timeout=10).status_code == 200
    r = requests.get(f"http://127.0.0.1:{s.admin_port}/readyz", timeout=10)
    assert (r.status_code, r.text) == (200, "ready\n")
    assert requests.get(f"http://127.0.0.1:{s.admin_port}/nothing-here", timeout=10).status_code == 404


def test_the_admin_listener_is_on_by_default_and_can_be_turned_off(tmp_path):
    """Run directly (the harness always passes --admin): with no flag the config decides."""
    def first_lines(toml):
        cfg = tmp_path / f"{len(list(tmp_path.iterdir()))}.toml"
        cfg.write_text(toml)
        p = subprocess.Popen([SILT_BIN, "serve", "--mqtt", "127.0.0.1:0", "--kafka", "127.0.0.1:0",
                              "--data-dir", str(tmp_path / f"data-{cfg.stem}"), "--config", str(cfg)],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        lines = []
        try:
            for line in p.stderr:
                lines.append(line)
                if "silt is running" in line:
                    break
        finally:
            p.kill()
            p.wait(30)
        return "".join(lines)

    # The default address, 127.0.0.1:8080, may be taken here: name a free one in the config.
    on = first_lines('[admin]\nlisten = "127.0.0.1:0"\n')
    assert re.search(r"admin listener bound addr=127\.0\.0\.1:\d+", on), on
    off = first_lines('[admin]\nenabled = false\nlisten = "127.0.0.1:0"\n')
    assert "silt is running" in off and "admin listener bound" not in off, off


def test_a_bad_admin_address_is_refused_by_name(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[admin]\nlisten = "nowhere"\n')
    p = subprocess.run([SILT_BIN, "serve", "--mqtt", "127.0.0.1:0", "--kafka", "127.0.0.1:0",
                        "--data-dir", str(tmp_path / "data"), "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "admin.listen" in p.stderr, p.stderr


def test_kafka_figures_sit_beside_the_mqtt_ones(start_silt):
    from confluent_kafka import Consumer, Producer, TopicPartition
    s = start_silt()
    port = next(int(m.group(1)) for line in s.log
                if (m := re.search(r'kafka listener bound kind="tcp" addr=127\.0\.0\.1:(\d+)', line)))
    _, before = scrape(s)
    p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": "all"})
    for i in range(25):
        p.produce("plant", key=f"plant/line{i % 3}".encode(), value=b"v" * 500)
    assert p.flush(30) == 0
    got = wait_for(s, 'silt_messages_received_total{protocol="kafka"}', lambda v: v >= 25)
    assert got['silt_received_bytes_total{protocol="kafka"}'] >= 25 * 500
    # Counted apart: the MQTT figure did not take the Kafka records.
    mqtt_in = 'silt_messages_received_total{protocol="mqtt"}'
    assert got[mqtt_in] - before[mqtt_in] == 0
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "metrics", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition("plant", 0, 0)])
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 25 and time.monotonic() < deadline:
            seen += len(c.consume(100, 0.5))
        assert seen == 25
        got = wait_for(s, 'silt_connections{protocol="kafka"}', lambda v: v >= 1)
        assert got['silt_sent_bytes_total{protocol="kafka"}'] >= 25 * 500
        # Records fetched, beside the bytes: each of the 25 once.
        assert got['silt_messages_sent_total{protocol="kafka"}'] == 25
        assert got['silt_connects_total{protocol="kafka"}'] >= 2
        text, _ = scrape(s)
        produces, _, _ = histogram(text, "silt_ack_latency_seconds", '{protocol="kafka"}')
        assert produces >= 1
        # The group's lag per partition: end offset 25 less what it committed.
        lag = 'silt_kafka_consumer_group_lag{group="metrics",topic="plant",partition="0"}'
        c.commit(offsets=[TopicPartition("plant", 0, 10)], asynchronous=False)
        wait_for(s, lag, lambda v: v == 15)
        c.commit(offsets=[TopicPartition("plant", 0, 25)], asynchronous=False)
        wait_for(s, lag, lambda v: v == 0)
    finally:
        c.close()
