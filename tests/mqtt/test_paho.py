"""MQTT 5.0 and 3.1.1 features with paho-mqtt against a running `silt serve`."""

import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from conftest import Client, drain


BOTH_VERSIONS = pytest.mark.parametrize("proto", [mqtt.MQTTv311, mqtt.MQTTv5], ids=["3.1.1", "5.0"])


def publish_props(**kw):
    p = Properties(PacketTypes.PUBLISH)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def test_v5_properties_pass_through(silt):
    sub = Client(silt, "props-sub")
    sub.c.subscribe("req/#", qos=1)
    time.sleep(0.3)
    pub = Client(silt, "props-pub")
    props = publish_props(
        UserProperty=[("trace", "abc"), ("trace", "def")],
        ContentType="application/json",
        ResponseTopic="resp/1",
        CorrelationData=b"\x01\x02",
        PayloadFormatIndicator=1,
        MessageExpiryInterval=120,
    )
    pub.c.publish("req/x", b'{"a":1}', qos=1, properties=props).wait_for_publish(5)
    m = sub.get()
    assert m.payload == b'{"a":1}'
    assert m.properties.UserProperty == [("trace", "abc"), ("trace", "def")]
    assert m.properties.ContentType == "application/json"
    assert m.properties.ResponseTopic == "resp/1"
    assert m.properties.CorrelationData == b"\x01\x02"
    assert m.properties.PayloadFormatIndicator == 1
    assert 0 < m.properties.MessageExpiryInterval <= 120
    pub.close()
    sub.close()


@BOTH_VERSIONS
def test_qos2_both_ways_delivers_exactly_once(silt, proto):
    sub = Client(silt, "q2-sub", protocol=proto)
    sub.c.subscribe("q2/t", qos=2)
    time.sleep(0.3)
    pub = Client(silt, "q2-pub", protocol=proto)
    for i in range(20):
        pub.c.publish("q2/t", str(i).encode(), qos=2).wait_for_publish(5)
    got = [sub.get() for _ in range(20)]
    assert [m.payload for m in got] == [str(i).encode() for i in range(20)]
    assert all(m.qos == 2 for m in got)
    assert sub.none()
    pub.close()
    sub.close()


@BOTH_VERSIONS
def test_overlapping_subscriptions_deliver_once_at_max_qos(silt, proto):
    sub = Client(silt, "overlap", protocol=proto)
    sub.c.subscribe([("o/#", 0), ("o/+", 1)])
    time.sleep(0.3)
    pub = Client(silt, "overlap-pub", protocol=proto)
    pub.c.publish("o/x", b"m", qos=2).wait_for_publish(5)
    m = sub.get()
    assert m.qos == 1
    assert sub.none()
    pub.close()
    sub.close()


def test_no_local_skips_own_messages(silt):
    c = Client(silt, "nl")
    c.c.subscribe("nl/t", options=SubscribeOptions(qos=1, noLocal=True))
    other = Client(silt, "nl-other")
    time.sleep(0.3)
    c.c.publish("nl/t", b"mine", qos=1).wait_for_publish(5)
    other.c.publish("nl/t", b"theirs", qos=1).wait_for_publish(5)
    assert c.get().payload == b"theirs"
    assert c.none()
    c.close()
    other.close()


def test_retain_handling_and_retain_as_published(silt):
    pub = Client(silt, "rh-pub")
    pub.c.publish("rh/a", b"kept", qos=1, retain=True).wait_for_publish(5)
    c = Client(silt, "rh")
    c.c.subscribe("rh/#", options=SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND))
    assert c.none()
    c2 = Client(silt, "rh2")
    c2.c.subscribe("rh/#", options=SubscribeOptions(qos=1, retainAsPublished=True))
    m = c2.get()
    assert m.payload == b"kept" and m.retain
    pub.c.publish("rh/a", b"live", qos=1, retain=True).wait_for_publish(5)
    live = c2.get()
    assert live.payload == b"live" and live.retain, "retain-as-published keeps the flag on live messages"
    plain = c.get()
    assert plain.payload == b"live" and not plain.retain, "without retain-as-published the flag is cleared"
    for x in (pub, c, c2):
        x.close()


def test_subscription_identifiers_are_returned(silt):
    c = Client(silt, "sid")
    p = Properties(PacketTypes.SUBSCRIBE)
    p.SubscriptionIdentifier = 42
    c.c.subscribe("sid/+", qos=1, properties=p)
    time.sleep(0.3)
    pub = Client(silt, "sid-pub")
    pub.c.publish("sid/x", b"m", qos=1).wait_for_publish(5)
    m = c.get()
    assert m.properties.SubscriptionIdentifier == [42]
    pub.close()
    c.close()


@BOTH_VERSIONS
def test_will_is_published_on_abnormal_close_not_on_disconnect(silt, proto):
    watcher = Client(silt, "will-watch", protocol=proto)
    watcher.c.subscribe("wills/#", qos=1)
    time.sleep(0.3)
    polite = Client(silt, "polite", protocol=proto, will={"topic": "wills/polite", "payload": b"gone", "qos": 1})
    polite.close()
    rude = Client(silt, "rude", protocol=proto, will={"topic": "wills/rude", "payload": b"gone", "qos": 1})
    rude.drop()
    m = watcher.get()
    assert m.topic == "wills/rude"
    assert watcher.none()
    watcher.close()


def test_assigned_client_identifier_for_empty_id(silt):
    c = Client(silt, "")
    assert c.props.AssignedClientIdentifier
    c.close()


def test_v311_persistent_session_resumes_with_session_present(silt):
    c = Client(silt, "p311", protocol=mqtt.MQTTv311, clean=False)
    c.c.subscribe("p/#", qos=1)
    time.sleep(0.3)
    c.close()
    pub = Client(silt, "p311-pub", protocol=mqtt.MQTTv311)
    for i in range(10):
        pub.c.publish(f"p/{i}", str(i).encode(), qos=1).wait_for_publish(5)
    c = Client(silt, "p311", protocol=mqtt.MQTTv311, clean=False)
    assert c.flags.session_present
    assert [c.get().payload for _ in range(10)] == [str(i).encode() for i in range(10)]
    c.close()
    pub.close()


@BOTH_VERSIONS
def test_shared_subscription_gives_each_message_to_one_member(silt, proto):
    a = Client(silt, "share-a", protocol=proto)
    b = Client(silt, "share-b", protocol=proto)
    plain = Client(silt, "share-plain", protocol=proto)
    for c in (a, b):
        c.c.subscribe("$share/workers/jobs/#", qos=1)
        assert c.subacks.get(timeout=5)[0].value == 1
    plain.c.subscribe("jobs/#", qos=1)
    plain.subacks.get(timeout=5)
    pub = Client(silt, "share-pub", protocol=proto)
    for i in range(40):
        pub.c.publish(f"jobs/{i}", str(i).encode(), qos=1).wait_for_publish(5)
    got_a = [m.payload for m in drain(a)]
    got_b = [m.payload for m in drain(b)]
    assert sorted(got_a + got_b, key=int) == [str(i).encode() for i in range(40)], "each message to exactly one member"
    assert [m.payload for m in drain(plain)] == [str(i).encode() for i in range(40)], "plain subscribers are unaffected"
    for x in (a, b, plain, pub):
        x.close()


def test_shared_group_keeps_its_backlog_while_all_members_are_offline(silt):
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    m = Client(silt, "share-offline", clean=False, properties=props)
    m.c.subscribe("$share/g/backlog/+", qos=1)
    m.subacks.get(timeout=5)
    m.close()
    pub = Client(silt, "share-offline-pub")
    for i in range(10):
        pub.c.publish(f"backlog/{i}", str(i).encode(), qos=1).wait_for_publish(5)
    silt.stop()
    from conftest import Silt
    again = Silt(silt.data_dir)
    try:
        m = Client(again, "share-offline", clean=False, properties=props)
        assert m.flags.session_present
        assert [x.payload for x in drain(m)] == [str(i).encode() for i in range(10)]
        m.close()
    finally:
        again.kill()


def test_session_backlog_is_visible_under_sys(data_dir):
    import os

    from conftest import Silt

    cfg = os.path.join(data_dir, "silt.toml")
    with open(cfg, "w") as f:
        f.write("[mqtt]\nsys_interval_secs = 1\n")
    silt = Silt(os.path.join(data_dir, "data"), ["--config", cfg])
    try:
        c = Client(silt, "backlogged", protocol=mqtt.MQTTv311, clean=False)
        c.c.subscribe("bk/#", qos=1)
        c.subacks.get(timeout=5)
        c.close()
        pub = Client(silt, "bk-pub")
        for i in range(7):
            pub.c.publish(f"bk/{i}", b"x", qos=1).wait_for_publish(5)
        watch = Client(silt, "bk-watch")
        watch.c.subscribe("$SYS/broker/sessions/backlogged/backlog", qos=0)
        seen = None
        for _ in range(20):
            seen = watch.get(timeout=5).payload
            if seen == b"7":
                break
        assert seen == b"7", "the offline session's 7 waiting messages are reported"
        c = Client(silt, "backlogged", protocol=mqtt.MQTTv311, clean=False)
        assert len(drain(c)) == 7
        for _ in range(20):
            seen = watch.get(timeout=5).payload
            if seen == b"0":
                break
        assert seen == b"0", "and the backlog drops to 0 once delivered"
        # Sessions that never had a backlog (the publisher, the watcher: connected for several
        # ticks by now) have no figure: an idle connection costs no retained topic.
        every = Client(silt, "bk-every")
        every.c.subscribe("$SYS/broker/sessions/+/backlog", qos=0)
        figures = {}
        deadline = time.time() + 2
        while time.time() < deadline:
            try:
                m = every.get(timeout=0.5)
            except Exception:
                continue
            figures[m.topic] = m.payload
        assert figures == {"$SYS/broker/sessions/backlogged/backlog": b"0"}, figures
        for x in (c, pub, watch, every):
            x.close()
    finally:
        silt.kill()


def connect_props(**kw):
    p = Properties(PacketTypes.CONNECT)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def test_session_expiry_ends_an_offline_session(silt):
    c = Client(silt, "short-lived", clean=False, properties=connect_props(SessionExpiryInterval=1))
    c.c.subscribe("exp/#", qos=1)
    c.subacks.get(timeout=5)
    c.close()
    time.sleep(3)  # expiry is 1 s; the broker sweeps every second
    c = Client(silt, "short-lived", clean=False, properties=connect_props(SessionExpiryInterval=60))
    assert not c.flags.session_present, "the session expired while the client was away"
    c.close()
    kept = Client(silt, "long-lived", clean=False, properties=connect_props(SessionExpiryInterval=60))
    kept.close()
    time.sleep(2)
    kept = Client(silt, "long-lived", clean=False, properties=connect_props(SessionExpiryInterval=60))
    assert kept.flags.session_present
    kept.close()


def test_expired_message_is_not_delivered_to_a_returning_session(silt):
    c = Client(silt, "late", clean=False, properties=connect_props(SessionExpiryInterval=60))
    c.c.subscribe("ttl/#", qos=1)
    c.subacks.get(timeout=5)
    c.close()
    pub = Client(silt, "ttl-pub")
    pub.c.publish("ttl/short", b"stale", qos=1, properties=publish_props(MessageExpiryInterval=1)).wait_for_publish(5)
    pub.c.publish("ttl/long", b"fresh", qos=1, properties=publish_props(MessageExpiryInterval=300)).wait_for_publish(5)
    time.sleep(2.5)
    c = Client(silt, "late", clean=False, properties=connect_props(SessionExpiryInterval=60))
    got = drain(c)
    assert [m.payload for m in got] == [b"fresh"]
    assert got[0].properties.MessageExpiryInterval < 300, "the remaining lifetime is sent, not the original"
    c.close()
    pub.close()


def test_will_delay_is_cancelled_by_a_timely_reconnect(silt):
    watcher = Client(silt, "wd-watch")
    watcher.c.subscribe("wd/#", qos=1)
    watcher.subacks.get(timeout=5)
    will_props = Properties(PacketTypes.WILLMESSAGE)
    will_props.WillDelayInterval = 2
    will = {"topic": "wd/gone", "payload": b"gone", "qos": 1, "properties": will_props}
    c = Client(silt, "wd", clean=False, properties=connect_props(SessionExpiryInterval=60), will=will)
    c.drop()
    time.sleep(0.5)
    back = Client(silt, "wd", clean=False, properties=connect_props(SessionExpiryInterval=60))
    assert watcher.none(wait=3.0), "the client came back within the delay: no will"
    back.drop()
    # This time it stays away (the new connection had no will, so nothing is sent either).
    assert watcher.none(wait=3.0)
    c = Client(silt, "wd2", clean=False, properties=connect_props(SessionExpiryInterval=60), will=will)
    c.drop()
    m = watcher.get(timeout=6)
    assert m.topic == "wd/gone", "after the delay the will is published"
    watcher.close()


def test_a_second_connection_takes_the_session_over(silt):
    first = Client(silt, "twin")
    second = Client(silt, "twin")
    rc = first.disconnects.get(timeout=5)
    assert rc.value == 0x8E, "session taken over"
    second.close()


@BOTH_VERSIONS
def test_leaving_a_shared_group_keeps_the_plain_subscription_on_the_same_filter(silt, proto):
    c = Client(silt, "both", protocol=proto)
    c.c.subscribe("r/#", qos=1)
    c.subacks.get(timeout=5)
    c.c.subscribe("$share/g/r/#", qos=1)
    c.subacks.get(timeout=5)
    c.c.unsubscribe("$share/g/r/#")
    time.sleep(0.3)
    pub = Client(silt, "both-pub", protocol=proto)
    pub.c.publish("r/x", b"still here", qos=1).wait_for_publish(5)
    assert c.get(timeout=5).payload == b"still here"
    c.close()
    pub.close()

