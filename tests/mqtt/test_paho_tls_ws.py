"""paho-mqtt over TLS, WebSocket and WebSocket over TLS, in MQTT 3.1.1 and 5.0.

The certificate is self-signed and made at test time (the `tls_cert` fixture); the TLS clients
trust exactly it and check the host (127.0.0.1 is in its subjectAltName).
"""

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from conftest import Client, auth_config, tls_listener_args, drain

BOTH_VERSIONS = pytest.mark.parametrize("proto", [mqtt.MQTTv311, mqtt.MQTTv5], ids=["3.1.1", "5.0"])
TRANSPORTS = pytest.mark.parametrize("transport", ["tls", "ws", "wss"])


@pytest.fixture
def secure(start_silt, tls_cert):
    """A broker with TCP, TLS, WebSocket and WebSocket-over-TLS listeners."""
    return start_silt("", tls_listener_args(tls_cert))


def on(secure, tls_cert, transport, client_id, proto, **kw):
    """A paho client on the listener of `transport`."""
    return Client(secure, client_id, protocol=proto, transport=transport, ca_file=tls_cert[0], **kw)


@TRANSPORTS
@BOTH_VERSIONS
def test_qos_0_1_2_round_trip(secure, tls_cert, transport, proto):
    sub = on(secure, tls_cert, transport, "rt-sub", proto)
    sub.c.subscribe("rt/#", qos=2)
    assert sub.subacks.get(timeout=5)[0].value == 2
    # A plain TCP subscriber sees the same messages: one broker behind every listener.
    tcp = Client(secure, "rt-tcp", protocol=proto)
    tcp.c.subscribe("rt/#", qos=2)
    tcp.subacks.get(timeout=5)
    pub = on(secure, tls_cert, transport, "rt-pub", proto)
    for q in (0, 1, 2):
        pub.c.publish(f"rt/q{q}", f"qos {q} over {transport}".encode(), qos=q).wait_for_publish(5)
    for c in (sub, tcp):
        got = sorted((m.topic, m.payload, m.qos) for m in (c.get(), c.get(), c.get()))
        assert got == [(f"rt/q{q}", f"qos {q} over {transport}".encode(), q) for q in (0, 1, 2)]
        assert c.none()
    # And the other way: a TCP publisher reaches the subscriber on this transport.
    tcp.c.publish("rt/back", b"from tcp", qos=1).wait_for_publish(5)
    m = sub.get()
    assert (m.topic, m.payload, m.qos) == ("rt/back", b"from tcp", 1)
    for c in (sub, tcp, pub):
        c.close()


@TRANSPORTS
@BOTH_VERSIONS
def test_retained_message_and_its_deletion(secure, tls_cert, transport, proto):
    pub = on(secure, tls_cert, transport, "ret-pub", proto)
    pub.c.publish("ret/a", b"kept", qos=1, retain=True).wait_for_publish(5)
    pub.c.publish("ret/b", b"to delete", qos=1, retain=True).wait_for_publish(5)
    pub.c.publish("ret/b", b"", qos=1, retain=True).wait_for_publish(5)
    late = on(secure, tls_cert, transport, "ret-late", proto)
    late.c.subscribe("ret/#", qos=1)
    m = late.get()
    assert (m.topic, m.payload, m.retain) == ("ret/a", b"kept", True)
    assert late.none(), "the empty retained payload deleted ret/b"
    for c in (pub, late):
        c.close()


@TRANSPORTS
@BOTH_VERSIONS
def test_persistent_session_resumes_with_queued_messages(secure, tls_cert, transport, proto):
    props = None
    if proto == mqtt.MQTTv5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 300
    c = on(secure, tls_cert, transport, "persist", proto, clean=False, properties=props)
    assert not c.flags.session_present
    c.c.subscribe("persist/#", qos=1)
    c.subacks.get(timeout=5)
    c.close()
    pub = on(secure, tls_cert, transport, "persist-pub", proto)
    for i in range(5):
        pub.c.publish(f"persist/{i}", str(i).encode(), qos=1).wait_for_publish(5)
    c = on(secure, tls_cert, transport, "persist", proto, clean=False, properties=props)
    assert c.flags.session_present
    assert [m.payload for m in drain(c)] == [str(i).encode() for i in range(5)]
    for x in (c, pub):
        x.close()


@pytest.mark.parametrize("transport", ["tls", "wss"])
@BOTH_VERSIONS
def test_wrong_password_is_refused_over_tls(start_silt, data_dir, tls_cert, transport, proto):
    toml = auth_config(data_dir, {"alice": "wonderland"})
    s = start_silt(toml, tls_listener_args(tls_cert))
    bad = on(s, tls_cert, transport, "bad", proto, username="alice", password="nope")
    # 5.0: reason code 0x86; paho reports the 3.1.1 return code 4 under the same name.
    assert str(bad.rc) == "Bad user name or password"
    bad.close()
    unknown = on(s, tls_cert, transport, "unknown", proto, username="mallory", password="x")
    assert str(unknown.rc) == "Bad user name or password"
    unknown.close()
    good = on(s, tls_cert, transport, "good", proto, username="alice", password="wonderland")
    assert str(good.rc) == "Success"
    good.c.subscribe("a/b", qos=1)
    assert good.subacks.get(timeout=5)[0].value == 1
    good.close()
