"""MQTT features with the mosquitto command-line clients (mosquitto_pub, mosquitto_sub), in
MQTT 3.1.1 and 5.0, against a running `silt serve`; paho-mqtt joins in where a peer is needed.

mosquitto_sub prints what it receives with `-F` (topic %t, payload %p, QoS %q, retain %r,
packet id %m; 5.0 properties: user properties %P, content type %C, response topic %R,
correlation data %D, message expiry %E, payload format %F, subscription id %S, topic alias %A).
The 2.0 clients have no flags for no-local, retain-as-published or retain handling.
"""

import os
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from conftest import Client, auth_config, tls_listener_args

BOTH = pytest.mark.parametrize("v", ["3.1.1", "5.0"])


# ---- QoS, wildcards, $ topics, overlapping subscriptions ------------------------------------


@BOTH
def test_qos_is_the_minimum_of_publish_and_subscription_with_packet_ids(silt, mosquitto, v):
    q2 = mosquitto.sub(silt.port, v, "-t", "q/#", "-q", "2", "-F", "%t %p q%q m%m")
    q1 = mosquitto.sub(silt.port, v, "-t", "q/#", "-q", "1", "-F", "%t %p q%q m%m")
    for q in (0, 1, 2):
        mosquitto.pub(silt.port, v, "-t", f"q/{q}", "-m", f"p{q}", "-q", str(q))
    got2 = [line.split() for line in q2.take(3)]
    assert [g[:3] for g in got2] == [["q/0", "p0", "q0"], ["q/1", "p1", "q1"], ["q/2", "p2", "q2"]]
    assert got2[0][3] == "m0" and got2[1][3] != "m0" and got2[2][3] != "m0", "QoS 1/2 carry a packet id"
    got1 = [line.split()[:3] for line in q1.take(3)]
    assert got1 == [["q/0", "p0", "q0"], ["q/1", "p1", "q1"], ["q/2", "p2", "q1"]], "downgraded to QoS 1"
    assert q2.none() and q1.none()


@BOTH
def test_leading_wildcards_do_not_match_dollar_topics(silt, mosquitto, v):
    everything = mosquitto.sub(silt.port, v, "-t", "#", "-t", "+/x", "-q", "1", "-v")
    dollar = mosquitto.sub(silt.port, v, "-t", "$app/#", "-q", "1", "-v")
    mosquitto.pub(silt.port, v, "-t", "$app/x", "-m", "dollar", "-q", "1")
    mosquitto.pub(silt.port, v, "-t", "app/x", "-m", "plain", "-q", "1")
    assert dollar.get() == "$app/x dollar"
    assert everything.get() == "app/x plain", "# and +/x skip topics starting with $"
    assert everything.none() and dollar.none()


@BOTH
def test_overlapping_subscriptions_deliver_once_at_the_highest_qos(silt, mosquitto, v):
    # mosquitto_sub gives every -t the same QoS, so the session gets its two overlapping
    # subscriptions from two connections (-c keeps the session, -E exits after the SUBACK).
    for filt, q in (("ov/#", "0"), ("ov/+", "1")):
        s = mosquitto.sub(silt.port, v, "-i", f"overlap-{v}", "-c", "-E", "-t", filt, "-q", q)
        assert s.wait() == 0
    s = mosquitto.sub(silt.port, v, "-i", f"overlap-{v}", "-c", "-t", "unrelated", "-F", "%t %p q%q")
    mosquitto.pub(silt.port, v, "-t", "ov/x", "-m", "m", "-q", "2")
    assert s.get() == "ov/x m q1"
    assert s.none(), "one copy, not one per matching subscription"


# ---- sessions, wills, retained ---------------------------------------------------------------


@BOTH
def test_shared_subscription_gives_each_message_to_exactly_one_member(silt, mosquitto, v):
    a = mosquitto.sub(silt.port, v, "-t", "$share/workers/jobs/#", "-q", "1", "-v")
    b = mosquitto.sub(silt.port, v, "-t", "$share/workers/jobs/#", "-q", "1", "-v")
    plain = mosquitto.sub(silt.port, v, "-t", "jobs/#", "-q", "1", "-v")
    n = 30
    lines = "".join(f"{i}\n" for i in range(n))
    # -l: one message per line of stdin, on one connection.
    mosquitto.pub(silt.port, v, "-t", "jobs/t", "-l", "-q", "1", stdin=lines)
    want = [f"jobs/t {i}" for i in range(n)]
    assert plain.take(n) == want, "a plain subscriber gets everything"
    got_a, got_b = a.drain(), b.drain()
    # (How the messages are spread between the members is up to the broker.)
    assert sorted(got_a + got_b, key=lambda s: int(s.split()[1])) == want, "each message to exactly one member"


@BOTH
def test_will_is_published_when_mosquitto_sub_is_killed(silt, mosquitto, v):
    watcher = mosquitto.sub(silt.port, v, "-t", "wills/#", "-q", "1", "-F", "%t %p r%r")
    # -E: exits after its SUBACK with a normal DISCONNECT, which discards the will.
    polite = mosquitto.sub(silt.port, v, "-t", "x", "-E", "--will-topic", "wills/polite", "--will-payload", "bye")
    assert polite.wait() == 0
    dying = mosquitto.sub(silt.port, v, "-t", "x", "--will-topic", "wills/dying", "--will-payload", "gone",
                          "--will-qos", "1", "--will-retain")
    dying.kill()
    assert watcher.get() == "wills/dying gone r0"
    assert watcher.none(), "no will after a normal DISCONNECT"
    late = mosquitto.sub(silt.port, v, "-t", "wills/#", "-F", "%t %p r%r")
    assert late.get() == "wills/dying gone r1", "--will-retain: the will is retained"


def test_disconnect_with_will_message_publishes_the_will_v5(silt, mosquitto):
    # On its -W timeout (or SIGTERM), mosquitto_sub 5.0 disconnects with reason code 0x04,
    # "Disconnect with Will Message": the will is published although the DISCONNECT is clean.
    watcher = mosquitto.sub(silt.port, "5.0", "-t", "wills/#", "-q", "1", "-F", "%t %p")
    leaving = mosquitto.sub(silt.port, "5.0", "-t", "x", "--will-topic", "wills/asked", "--will-payload", "bye",
                            "-W", "1")
    assert leaving.wait() == 27, "exit code 27: timed out"
    assert watcher.get() == "wills/asked bye"
    # The same in 3.1.1 is a plain DISCONNECT: no will.
    plain = mosquitto.sub(silt.port, "3.1.1", "-t", "x", "--will-topic", "wills/plain", "--will-payload", "bye",
                          "-W", "1")
    assert plain.wait() == 27
    assert watcher.none()


def test_keep_alive_timeout_closes_a_silent_client_and_publishes_its_will_v5(start_silt, mosquitto):
    s = start_silt("[mqtt]\nserver_keep_alive_secs = 1\n")
    watcher = mosquitto.sub(s.port, "5.0", "-t", "wills/#", "-q", "1", "-F", "%t %p")
    silent = mosquitto.sub(s.port, "5.0", "-t", "x", "-k", "60", "--will-topic", "wills/silent",
                           "--will-payload", "timed out")
    silent.freeze()
    t = time.monotonic()
    assert watcher.get(timeout=5) == "wills/silent timed out"
    assert time.monotonic() - t >= 1.0, "not before the keep alive (1 s, closed after 1.5 s)"
    # A 3.1.1 client is not told about the server keep alive, so its own (60 s) applies.
    old = mosquitto.sub(s.port, "3.1.1", "-t", "x", "-k", "60", "-W", "3")
    assert old.wait() == 27, f"timed out normally rather than being disconnected: {old.stderr}"


def test_will_delay_and_will_properties_v5(silt, mosquitto):
    watcher = mosquitto.sub(silt.port, "5.0", "-t", "wd/#", "-q", "1", "-F", "%t %p|%C|%P")
    dying = mosquitto.sub(silt.port, "5.0", "-t", "x", "-x", "60", "--will-topic", "wd/gone", "--will-payload",
                          "bye", "--will-qos", "1", "-D", "will", "will-delay-interval", "2",
                          "-D", "will", "content-type", "text/plain", "-D", "will", "user-property", "why", "crash")
    t = time.monotonic()
    dying.kill()
    assert watcher.none(wait=1.0), "the will waits for its delay"
    assert watcher.get(timeout=5) == "wd/gone bye|text/plain|why:crash"
    assert time.monotonic() - t >= 1.8


@BOTH
def test_unacknowledged_messages_are_redelivered_with_dup(silt, mosquitto, v):
    sub = mosquitto.sub(silt.port, v, "-i", f"frozen-{v}", "-c", "-t", "dup/#", "-q", "2", "-F", "%t %p")
    # Stopped, the client acknowledges nothing: the broker's PUBLISHes stay in flight.
    sub.freeze()
    mosquitto.pub(silt.port, v, "-t", "dup/1", "-m", "one", "-q", "1")
    mosquitto.pub(silt.port, v, "-t", "dup/2", "-m", "two", "-q", "2")
    time.sleep(0.5)
    sub.kill()
    back = mosquitto.sub(silt.port, v, "-i", f"frozen-{v}", "-c", "-t", "dup/#", "-q", "2", "-F", "%t %p",
                         wait_suback=False)
    assert sorted(back.take(2)) == ["dup/1 one", "dup/2 two"]
    resent = [line for line in back.debug if "received PUBLISH" in line]
    assert len(resent) == 2 and all("(d1, " in line for line in resent), f"DUP set on the resends: {resent}"
    assert back.none()


@BOTH
def test_persistent_session_and_its_expiry(silt, mosquitto, v):
    # -c: clean session off; in 5.0, -x sets the session expiry interval.
    expiring = ["-x", "1"] if v == "5.0" else []
    keep = mosquitto.sub(silt.port, v, "-i", f"keep-{v}", "-c", "-E", "-t", "se/#", "-q", "1")
    assert keep.wait() == 0
    mosquitto.pub(silt.port, v, "-t", "se/1", "-m", "while away", "-q", "1")
    if v == "5.0":
        short = mosquitto.sub(silt.port, v, "-i", "short-5.0", "-c", *expiring, "-E", "-t", "se/#", "-q", "1")
        assert short.wait() == 0
        time.sleep(2.5)  # past the 1 s expiry (the broker sweeps every second)
        mosquitto.pub(silt.port, v, "-t", "se/2", "-m", "after expiry", "-q", "1")
        back = mosquitto.sub(silt.port, v, "-i", "short-5.0", "-c", "-t", "nothing", "-F", "%t %p")
        assert back.none(wait=1.0), "the expired session kept nothing"
    back = mosquitto.sub(silt.port, v, "-i", f"keep-{v}", "-c", "-t", "nothing", "-F", "%t %p", wait_suback=False)
    got = [back.get()]
    if v == "5.0":
        got.append(back.get())
    assert got == ["se/1 while away"] + (["se/2 after expiry"] if v == "5.0" else [])


def test_message_expiry_v5(silt, mosquitto):
    s = mosquitto.sub(silt.port, "5.0", "-i", "ttl", "-c", "-x", "60", "-E", "-t", "ttl/#", "-q", "1")
    assert s.wait() == 0
    mosquitto.pub(silt.port, "5.0", "-t", "ttl/short", "-m", "stale", "-q", "1",
                  "-D", "publish", "message-expiry-interval", "1")
    mosquitto.pub(silt.port, "5.0", "-t", "ttl/long", "-m", "fresh", "-q", "1",
                  "-D", "publish", "message-expiry-interval", "300")
    time.sleep(2.5)
    back = mosquitto.sub(silt.port, "5.0", "-i", "ttl", "-c", "-x", "60", "-t", "none", "-F", "%t %p %E",
                         wait_suback=False)
    topic, payload, expiry = back.get().split()
    assert (topic, payload) == ("ttl/long", "fresh"), "the expired message is not delivered"
    assert 290 <= int(expiry) < 300, "the remaining lifetime is sent, not the original"
    assert back.none()


# ---- MQTT 5.0 properties ---------------------------------------------------------------------

PROPS_FORMAT = "%t|%p|%P|%C|%R|%D|%F|%E"


def test_v5_properties_pass_through_mosquitto_pub_to_mosquitto_sub(silt, mosquitto):
    s = mosquitto.sub(silt.port, "5.0", "-t", "req/#", "-q", "1", "-F", PROPS_FORMAT)
    mosquitto.pub(silt.port, "5.0", "-t", "req/x", "-m", '{"a":1}', "-q", "1",
                  "-D", "publish", "user-property", "trace", "abc",
                  "-D", "publish", "user-property", "trace", "def",
                  "-D", "publish", "content-type", "application/json",
                  "-D", "publish", "response-topic", "resp/1",
                  "-D", "publish", "correlation-data", "corr-42",
                  "-D", "publish", "payload-format-indicator", "1",
                  "-D", "publish", "message-expiry-interval", "120")
    topic, payload, users, ctype, resp, corr, fmt, expiry = s.get().split("|")
    assert (topic, payload, users, ctype, resp, corr, fmt) == (
        "req/x", '{"a":1}', "trace:abc trace:def", "application/json", "resp/1", "corr-42", "1")
    assert 0 < int(expiry) <= 120


def test_v5_properties_pass_through_paho_to_mosquitto_sub(silt, mosquitto):
    s = mosquitto.sub(silt.port, "5.0", "-t", "req/#", "-q", "1", "-F", PROPS_FORMAT)
    pub = Client(silt, "props-paho")
    p = Properties(PacketTypes.PUBLISH)
    p.UserProperty = [("site", "berlin"), ("site", "paris")]
    p.ContentType = "text/plain"
    p.ResponseTopic = "resp/2"
    p.CorrelationData = b"\x30\x31"
    p.PayloadFormatIndicator = 1
    pub.c.publish("req/y", b"hello", qos=1, properties=p).wait_for_publish(5)
    assert s.get() == "req/y|hello|site:berlin site:paris|text/plain|resp/2|01|1|"
    pub.close()


def test_v5_properties_from_mosquitto_pub_reach_paho(silt, mosquitto):
    c = Client(silt, "props-recv")
    c.c.subscribe("req/#", qos=1)
    c.subacks.get(timeout=5)
    mosquitto.pub(silt.port, "5.0", "-t", "req/z", "-m", "m", "-q", "1",
                  "-D", "publish", "user-property", "k", "v", "-D", "publish", "content-type", "a/b",
                  "-D", "publish", "response-topic", "resp/3", "-D", "publish", "correlation-data", "xyz")
    m = c.get()
    assert m.properties.UserProperty == [("k", "v")]
    assert (m.properties.ContentType, m.properties.ResponseTopic) == ("a/b", "resp/3")
    assert m.properties.CorrelationData == b"xyz"
    c.close()


def test_subscription_identifier_v5(silt, mosquitto):
    s = mosquitto.sub(silt.port, "5.0", "-t", "sid/+", "-q", "1", "-D", "subscribe", "subscription-identifier", "42",
                      "-F", "%t %S")
    plain = mosquitto.sub(silt.port, "5.0", "-t", "sid/+", "-q", "1", "-F", "%t [%S]")
    mosquitto.pub(silt.port, "5.0", "-t", "sid/x", "-m", "m", "-q", "1")
    assert s.get() == "sid/x 42"
    assert plain.get() == "sid/x []", "no identifier where the subscription had none"


def test_inbound_topic_alias_v5(silt, mosquitto):
    s = mosquitto.sub(silt.port, "5.0", "-t", "alias/#", "-q", "1", "-F", "%t %p")
    # With -D publish topic-alias, mosquitto_pub sends the topic with the alias once, then the
    # alias alone (an empty topic) for the repeats.
    out = mosquitto.pub(silt.port, "5.0", "-d", "-t", "alias/long/topic/name", "-m", "m", "-q", "1", "--repeat", "3",
                        "-D", "publish", "topic-alias", "3")
    assert "'(null)'" in out.stdout, f"the repeats were sent without a topic: {out.stdout}"
    assert s.take(3) == ["alias/long/topic/name m"] * 3


def test_outbound_topic_alias_reaches_mosquitto_sub_v5(silt, mosquitto):
    # mosquitto_sub 2.0.11 cannot resolve an alias it is sent (libmosquitto reports a protocol
    # error for a PUBLISH with an empty topic and a known alias), so only the first PUBLISH,
    # which defines the alias, is checked here; test_paho_flow.py follows the alias further.
    s = mosquitto.sub(silt.port, "5.0", "-t", "oa/#", "-q", "1", "-D", "connect", "topic-alias-maximum", "2",
                      "-F", "%t %p alias=%A", "-C", "1")
    mosquitto.pub(silt.port, "5.0", "-t", "oa/x", "-m", "m", "-q", "1")
    assert s.get() == "oa/x m alias=1"
    assert s.wait() == 0


def test_assigned_client_identifier_v5(silt, mosquitto):
    # In 5.0 mosquitto_sub sends an empty client id; the CONNACK assigns one.
    s = mosquitto.sub(silt.port, "5.0", "-t", "x")
    assert any(line.startswith("Client (null) sending CONNECT") for line in s.debug)
    line = s.wait_debug(r"received CONNACK \(0\)")
    assigned = line.split()[1]
    assert assigned != "(null)" and len(assigned) > 0


# ---- flow control: packet sizes, receive maximum, keep alive ---------------------------------


def test_client_maximum_packet_size_drops_larger_messages_v5(silt, mosquitto):
    s = mosquitto.sub(silt.port, "5.0", "-t", "mps/#", "-q", "1", "-D", "connect", "maximum-packet-size", "100",
                      "-F", "%t %l")
    mosquitto.pub(silt.port, "5.0", "-t", "mps/small", "-m", "x" * 10, "-q", "1")
    mosquitto.pub(silt.port, "5.0", "-t", "mps/big", "-m", "x" * 300, "-q", "1")
    mosquitto.pub(silt.port, "5.0", "-t", "mps/small2", "-m", "y" * 20, "-q", "1")
    assert s.take(2) == ["mps/small 10", "mps/small2 20"], "the message the client cannot take is discarded"
    assert s.none()


@BOTH
def test_server_maximum_packet_size(start_silt, mosquitto, v):
    s = start_silt("[mqtt]\nmax_packet_size = 200\n")
    sub = mosquitto.sub(s.port, v, "-t", "big/#", "-q", "1", "-F", "%t %l")
    out = mosquitto.pub(s.port, v, "-t", "big/x", "-m", "x" * 300, "-q", "1", check=False)
    if v == "3.1.1":
        # The broker closes the connection (3.1.1 has no DISCONNECT from the server).
        assert out.returncode != 0 and "connection was lost" in out.stderr.lower(), out
    else:
        # libmosquitto reads Maximum Packet Size from the CONNACK and does not send the message.
        assert out.returncode == 0, out
    mosquitto.pub(s.port, v, "-t", "big/ok", "-m", "x" * 100, "-q", "1")
    assert sub.get() == "big/ok 100"
    assert sub.none()


def test_server_receive_maximum_is_honoured_by_mosquitto_pub_v5(start_silt, mosquitto):
    # Receive Maximum 2 in the CONNACK: libmosquitto keeps at most 2 QoS 1 messages in flight,
    # and the broker (which disconnects with 0x93 beyond it) accepts the whole burst.
    s = start_silt("[mqtt]\nreceive_maximum = 2\n")
    sub = mosquitto.sub(s.port, "5.0", "-t", "rm/#", "-q", "1", "-F", "%p")
    n = 40
    out = mosquitto.pub(s.port, "5.0", "-d", "-t", "rm/t", "-l", "-q", "1", stdin="".join(f"{i}\n" for i in range(n)))
    assert out.stdout.count("received PUBACK") == n
    assert sub.take(n) == [str(i) for i in range(n)]


def test_client_receive_maximum_is_honoured_for_a_qos2_backlog_v5(silt, mosquitto):
    # libmosquitto fails with a protocol error if a QoS 2 PUBLISH arrives while its Receive
    # Maximum (1) of QoS 2 messages is still unreleased, so a burst beyond it would end the client.
    s = mosquitto.sub(silt.port, "5.0", "-i", "rm-recv", "-c", "-x", "60", "-E", "-t", "rmq/#", "-q", "2")
    assert s.wait() == 0
    n = 20
    mosquitto.pub(silt.port, "5.0", "-t", "rmq/t", "-l", "-q", "2", stdin="".join(f"{i}\n" for i in range(n)))
    back = mosquitto.sub(silt.port, "5.0", "-i", "rm-recv", "-c", "-x", "60", "-t", "rmq/#", "-q", "2",
                         "-D", "connect", "receive-maximum", "1", "-F", "%p", "-C", str(n), wait_suback=False)
    assert back.take(n) == [str(i) for i in range(n)]
    assert back.wait() == 0, back.stderr


def test_server_keep_alive_v5(start_silt, mosquitto):
    # The broker imposes a 1 s keep alive in the CONNACK; mosquitto_sub asked for 60 s and must
    # adopt it, so it pings within a couple of seconds.
    s = start_silt("[mqtt]\nserver_keep_alive_secs = 1\n")
    sub = mosquitto.sub(s.port, "5.0", "-t", "ka", "-k", "60")
    sub.wait_debug(r"sending PINGREQ", timeout=4)
    sub.wait_debug(r"received PINGRESP", timeout=4)


# ---- $SYS ------------------------------------------------------------------------------------


@BOTH
def test_sys_statistics(start_silt, mosquitto, v):
    s = start_silt("[mqtt]\nsys_interval_secs = 1\n")
    sub = mosquitto.sub(s.port, v, "-t", "$SYS/broker/#", "-F", "%t\t%p")
    names = ("version", "clients/connected", "sessions/total", "messages/received", "messages/sent",
             "bytes/received", "bytes/sent", "retained messages/count")
    seen = {}
    deadline = time.monotonic() + 8
    # Until every figure came and one counts this subscriber. Retained figures arrive in topic
    # order, live ones in publishing order: a figure being republished while the subscription
    # is made can come after `clients/connected` does.
    while time.monotonic() < deadline and (
        seen.get("$SYS/broker/clients/connected", "0") == "0" or any(f"$SYS/broker/{n}" not in seen for n in names)
    ):
        topic, _, value = sub.get().partition("\t")
        seen[topic] = value
    for name in names:
        assert f"$SYS/broker/{name}" in seen, f"{name} missing: {seen}"
    assert seen["$SYS/broker/version"].startswith("silt ")
    assert int(seen["$SYS/broker/clients/connected"]) >= 1, "counts this subscriber"
    out = mosquitto.pub(s.port, v, "-t", "$SYS/broker/version", "-m", "forged", "-q", "1")
    if v == "5.0":
        assert "Not authorized" in out.stderr, "clients may not publish under $SYS (PUBACK 0x87)"
    time.sleep(1.5)
    again = mosquitto.sub(s.port, v, "-t", "$SYS/broker/version", "-F", "%p", "-C", "1")
    assert again.get().startswith("silt ")


# ---- authentication and ACLs ---------------------------------------------------------------


@pytest.fixture
def secured(start_silt, data_dir):
    toml = auth_config(data_dir, {"sensor": "hunter2", "reader": "pw"},
                       ["user sensor", "topic readwrite telemetry/#", "user reader", "topic read telemetry/#"])
    return start_silt(toml)


@BOTH
def test_acl_refusals_with_mosquitto_clients(secured, mosquitto, v):
    creds = ["-u", "sensor", "-P", "hunter2"]
    reader = mosquitto.sub(secured.port, v, "-u", "reader", "-P", "pw", "-t", "telemetry/#", "-t", "admin/#",
                           "-q", "1", "-v")
    # A refused subscription: SUBACK 0x80 (3.1.1 failure) or 0x87 (5.0 not authorized); the allowed one is granted.
    assert reader.suback() == [1, 128 if v == "3.1.1" else 135]
    # The reader may read but not write: 5.0 says so in the PUBACK (0x87); 3.1.1 cannot refuse a
    # publish, so it is acknowledged and dropped.
    out = mosquitto.pub(secured.port, v, "-u", "reader", "-P", "pw", "-t", "telemetry/r", "-m", "no", "-q", "1")
    if v == "5.0":
        assert "Publish 1 failed: Not authorized" in out.stderr, out.stderr
    else:
        assert out.stderr == "", out.stderr
    mosquitto.pub(secured.port, v, *creds, "-t", "telemetry/t", "-m", "yes", "-q", "1")
    assert reader.get() == "telemetry/t yes"
    assert reader.none(), "the refused publish was not delivered"
    # A subscriber whose every filter is refused: mosquitto_sub says so and disconnects.
    denied = mosquitto.sub(secured.port, v, *creds, "-t", "admin/#", "-q", "1", wait_suback=False)
    denied.wait()
    assert denied.suback() == [128 if v == "3.1.1" else 135]
    assert "All subscription requests were denied." in denied.stderr, denied.stderr


# ---- TLS -------------------------------------------------------------------------------------


def test_tls_with_mosquitto_clients_v5(start_silt, tls_cert, mosquitto):
    # (3.1.1 over TLS with these clients: crates/silt/tests/mqtt_tls_ws.rs.) The clients trust the
    # self-signed certificate and check that it names 127.0.0.1.
    s = start_silt("", tls_listener_args(tls_cert))
    tls = ["--cafile", tls_cert[0]]
    port = s.ports["tls"]
    sub = mosquitto.sub(port, "5.0", *tls, "-t", "sec/#", "-q", "2", "-F", "%t %p q%q %P")
    tcp = mosquitto.sub(s.port, "5.0", "-t", "sec/#", "-q", "2", "-F", "%t %p q%q %P")
    mosquitto.pub(port, "5.0", *tls, "-t", "sec/a", "-m", "over tls", "-q", "2", "-D", "publish", "user-property",
                  "k", "v")
    assert sub.get() == "sec/a over tls q2 k:v"
    assert tcp.get() == "sec/a over tls q2 k:v"
    mosquitto.pub(s.port, "5.0", "-t", "sec/b", "-m", "over tcp", "-q", "1")
    assert sub.get() == "sec/b over tcp q1 "
    # Without the certificate the client refuses the server.
    out = mosquitto.pub(port, "5.0", "--cafile", os.devnull, "-t", "sec/c", "-m", "x", check=False)
    assert out.returncode != 0
    assert sub.none()
