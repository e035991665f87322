"""paho-mqtt: redelivery (DUP, packet ids), Receive Maximum, Maximum Packet Size, topic aliases,
server keep alive, $ topics and refusals, in MQTT 3.1.1 and 5.0 where the feature exists."""

import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from conftest import Client, drain

BOTH_VERSIONS = pytest.mark.parametrize("proto", [mqtt.MQTTv311, mqtt.MQTTv5], ids=["3.1.1", "5.0"])


def props(packet_type, **kw):
    p = Properties(packet_type)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def persistent(silt, client_id, proto, **kw):
    """A client whose session outlives its connection (clean session 0 / session expiry 300 s)."""
    p = props(PacketTypes.CONNECT, SessionExpiryInterval=300, **kw) if proto == mqtt.MQTTv5 else None
    return Client(silt, client_id, protocol=proto, clean=False, properties=p)


# ---- redelivery ------------------------------------------------------------------------------


def unacked_qos1_then_reconnect(silt, proto, client_id):
    """Delivers 4 QoS 1 messages to a session that acknowledges only the first, drops the
    connection and reconnects; returns (first deliveries, redeliveries)."""
    c = persistent(silt, client_id, proto)
    c.c.manual_ack_set(True)
    c.c.subscribe("redo/#", qos=1)
    c.subacks.get(timeout=5)
    pub = Client(silt, client_id + "-pub", protocol=proto)
    for i in range(4):
        pub.c.publish(f"redo/{i}", str(i).encode(), qos=1).wait_for_publish(5)
    first = [c.get() for _ in range(4)]
    c.c.ack(first[0].mid, 1)
    time.sleep(0.3)  # let the PUBACK arrive
    c.drop()
    pub.close()
    c = persistent(silt, client_id, proto)
    assert c.flags.session_present
    again = drain(c)
    c.close()
    return first, again


@BOTH_VERSIONS
def test_unacknowledged_qos1_messages_are_redelivered_with_dup(silt, proto):
    first, again = unacked_qos1_then_reconnect(silt, proto, "redo-dup")
    assert [m.payload for m in first] == [b"0", b"1", b"2", b"3"]
    assert not any(m.dup for m in first)
    assert [m.payload for m in again] == [b"1", b"2", b"3"], "the acknowledged message is not resent"
    assert all(m.dup for m in again), "a resent PUBLISH has DUP set"
    assert all(m.qos == 1 for m in again)


@BOTH_VERSIONS
def test_unacknowledged_qos1_messages_are_redelivered_with_their_packet_ids(silt, proto):
    first, again = unacked_qos1_then_reconnect(silt, proto, "redo-ids")
    assert [(m.payload, m.mid) for m in again] == [(m.payload, m.mid) for m in first[1:]]


@BOTH_VERSIONS
def test_released_qos2_message_is_not_delivered_again_after_reconnect(silt, proto):
    c = persistent(silt, "q2-released", proto)
    # With manual acks paho answers PUBLISH with PUBREC, hands the message over on PUBREL and
    # holds back the PUBCOMP; the connection then drops before it is sent.
    c.c.manual_ack_set(True)
    c.c.subscribe("q2r/#", qos=2)
    c.subacks.get(timeout=5)
    pub = Client(silt, "q2-released-pub", protocol=proto)
    pub.c.publish("q2r/a", b"exactly once", qos=2).wait_for_publish(5)
    m = c.get()
    assert (m.payload, m.qos) == (b"exactly once", 2)
    time.sleep(0.3)
    c.drop()
    pub.close()
    # The broker must resend the PUBREL (paho answers PUBCOMP), not the PUBLISH.
    c = persistent(silt, "q2-released", proto)
    assert c.flags.session_present
    assert [x.payload for x in drain(c)] == [], "the message was delivered twice"
    c.close()


# ---- retain handling -------------------------------------------------------------------------


def test_retain_handling_1_sends_retained_messages_only_for_a_new_subscription(silt):
    from paho.mqtt.subscribeoptions import SubscribeOptions

    pub = Client(silt, "rh1-pub")
    pub.c.publish("rh1/a", b"kept", qos=1, retain=True).wait_for_publish(5)
    c = Client(silt, "rh1")
    if_new = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
    c.c.subscribe("rh1/#", options=if_new)
    m = c.get()
    assert (m.payload, m.retain) == (b"kept", True), "a new subscription gets the retained message"
    c.c.subscribe("rh1/#", options=if_new)
    c.subacks.get(timeout=5)
    c.subacks.get(timeout=5)
    assert c.none(), "subscribing again to an existing subscription does not"
    c.c.subscribe("rh1/#", options=SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_ON_SUBSCRIBE))
    m = c.get()
    assert (m.payload, m.retain) == (b"kept", True), "retain handling 0 sends it on every SUBSCRIBE"
    pub.close()
    c.close()


# ---- Receive Maximum -------------------------------------------------------------------------


def test_client_receive_maximum_limits_unacknowledged_deliveries(silt):
    c = Client(silt, "rmax", properties=props(PacketTypes.CONNECT, ReceiveMaximum=2), manual_ack=True)
    c.c.subscribe("rmax/#", qos=1)
    c.subacks.get(timeout=5)
    pub = Client(silt, "rmax-pub")
    for i in range(6):
        pub.c.publish(f"rmax/{i}", str(i).encode(), qos=1).wait_for_publish(5)
    got = drain(c, wait=0.7)
    assert [m.payload for m in got] == [b"0", b"1"], "no more than 2 unacknowledged"
    c.c.ack(got[0].mid, 1)
    got = drain(c, wait=0.7)
    assert [m.payload for m in got] == [b"2"], "one acknowledgement, one more message"
    c.c.ack(got[0].mid, 1)
    pub.close()
    c.close()


def test_connack_announces_the_configured_limits(start_silt):
    s = start_silt("[mqtt]\nreceive_maximum = 7\nmax_packet_size = 5000\ntopic_alias_maximum = 3\n"
                   "server_keep_alive_secs = 5\n")
    c = Client(s, "limits")  # asks for keep alive 30
    assert c.props.ReceiveMaximum == 7
    assert c.props.MaximumPacketSize == 5000
    assert c.props.TopicAliasMaximum == 3
    assert c.props.ServerKeepAlive == 5
    c.close()


# ---- Maximum Packet Size -------------------------------------------------------------------


def test_messages_larger_than_the_client_maximum_packet_size_are_dropped(silt):
    c = Client(silt, "small", properties=props(PacketTypes.CONNECT, MaximumPacketSize=200))
    c.c.subscribe("mps/#", qos=1)
    c.subacks.get(timeout=5)
    pub = Client(silt, "mps-pub")
    for topic, size in (("mps/a", 50), ("mps/big", 500), ("mps/b", 60)):
        pub.c.publish(topic, b"x" * size, qos=1).wait_for_publish(5)
    assert [(m.topic, len(m.payload)) for m in drain(c)] == [("mps/a", 50), ("mps/b", 60)]
    pub.close()
    c.close()


@BOTH_VERSIONS
def test_a_packet_over_the_server_maximum_ends_the_connection(start_silt, proto):
    s = start_silt("[mqtt]\nmax_packet_size = 1000\n")
    watcher = Client(s, "mps-watch", protocol=proto)
    watcher.c.subscribe("big/#", qos=1)
    watcher.subacks.get(timeout=5)
    c = Client(s, "too-big", protocol=proto)
    c.c.publish("big/x", b"x" * 2000, qos=1)
    rc = c.disconnects.get(timeout=5)
    if proto == mqtt.MQTTv5:
        assert rc.value == 0x95, f"DISCONNECT with Packet too large, got {rc}"
    c.c.loop_stop()
    assert watcher.none()
    watcher.close()


# ---- topic aliases -----------------------------------------------------------------------------


def test_inbound_topic_aliases_are_resolved(silt):
    sub = Client(silt, "ta-sub")
    sub.c.subscribe("ta/#", qos=1)
    sub.subacks.get(timeout=5)
    pub = Client(silt, "ta-pub")
    pub.c.publish("ta/first", b"1", qos=1, properties=props(PacketTypes.PUBLISH, TopicAlias=1)).wait_for_publish(5)
    pub.c.publish("ta/second", b"2", qos=1, properties=props(PacketTypes.PUBLISH, TopicAlias=2)).wait_for_publish(5)
    for alias, payload in ((1, b"3"), (2, b"4"), (1, b"5")):
        pub.c.publish("", payload, qos=1, properties=props(PacketTypes.PUBLISH, TopicAlias=alias)).wait_for_publish(5)
    # An alias can be redefined.
    pub.c.publish("ta/third", b"6", qos=1, properties=props(PacketTypes.PUBLISH, TopicAlias=1)).wait_for_publish(5)
    pub.c.publish("", b"7", qos=1, properties=props(PacketTypes.PUBLISH, TopicAlias=1)).wait_for_publish(5)
    got = [(m.topic, m.payload) for m in drain(sub)]
    assert got == [("ta/first", b"1"), ("ta/second", b"2"), ("ta/first", b"3"), ("ta/second", b"4"),
                   ("ta/first", b"5"), ("ta/third", b"6"), ("ta/third", b"7")]
    pub.close()
    sub.close()


def test_alias_above_the_server_maximum_is_disconnect_0x94(start_silt):
    s = start_silt("[mqtt]\ntopic_alias_maximum = 2\n")
    c = Client(s, "ta-bad")
    c.c.publish("ta/x", b"1", qos=1, properties=props(PacketTypes.PUBLISH, TopicAlias=3))
    assert c.disconnects.get(timeout=5).value == 0x94, "Topic Alias invalid"
    c.c.loop_stop()


def test_outbound_topic_aliases_stay_within_the_client_maximum(silt):
    # paho hands over what it receives: the topic and, if any, its TopicAlias property; an
    # alias alone comes with an empty topic, which the test resolves itself.
    c = Client(silt, "ta-out", properties=props(PacketTypes.CONNECT, TopicAliasMaximum=2))
    c.c.subscribe("out/#", qos=1)
    c.subacks.get(timeout=5)
    pub = Client(silt, "ta-out-pub")
    topics = ["out/alpha/long/topic", "out/beta/long/topic", "out/gamma/long/topic"]
    for round_ in range(3):
        for t in topics:
            pub.c.publish(t, t.encode(), qos=1).wait_for_publish(5)
    aliases = {}
    used_alias_only = 0
    for m in drain(c):
        alias = getattr(m.properties, "TopicAlias", None)
        assert alias is None or 1 <= alias <= 2, f"alias {alias} above the client's maximum"
        if m.topic:
            if alias:
                aliases[alias] = m.topic
            topic = m.topic
        else:
            assert alias in aliases, "an empty topic needs an alias defined earlier"
            topic = aliases[alias]
            used_alias_only += 1
        assert topic.encode() == m.payload
    assert used_alias_only > 0, "the broker used its aliases"
    pub.close()
    c.close()


# ---- $ topics, reason codes --------------------------------------------------------------------


@BOTH_VERSIONS
def test_leading_wildcards_do_not_match_dollar_topics(silt, proto):
    every = Client(silt, "dollar-all", protocol=proto)
    every.c.subscribe([("#", 1), ("+/x", 1)])
    every.subacks.get(timeout=5)
    dollar = Client(silt, "dollar-only", protocol=proto)
    dollar.c.subscribe("$app/+", qos=1)
    dollar.subacks.get(timeout=5)
    pub = Client(silt, "dollar-pub", protocol=proto)
    pub.c.publish("$app/x", b"d", qos=1).wait_for_publish(5)
    pub.c.publish("app/x", b"p", qos=1).wait_for_publish(5)
    assert [m.topic for m in drain(every)] == ["app/x"]
    assert [m.topic for m in drain(dollar)] == ["$app/x"]
    for c in (every, dollar, pub):
        c.close()


def test_publishing_under_sys_is_refused_0x87(silt):
    c = Client(silt, "sys-forger")
    info = c.c.publish("$SYS/broker/version", b"forged", qos=1)
    mid, rc = c.published.get(timeout=5)
    assert mid == info.mid and rc.value == 0x87
    c.close()


def test_unsubscribe_reports_no_subscription_existed(silt):
    c = Client(silt, "unsub")
    c.c.subscribe("u/a", qos=1)
    c.subacks.get(timeout=5)
    got = []
    c.c.on_unsubscribe = lambda cl, u, mid, rcs, p: got.append([r.value for r in rcs])
    c.c.unsubscribe(["u/a", "u/never"])
    for _ in range(50):
        if got:
            break
        time.sleep(0.1)
    assert got == [[0x00, 0x11]], "Success, then No subscription existed"
    c.close()
