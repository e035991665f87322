"""Passwords (argon2 file written by `silt passwd`) and mosquitto-style ACLs, as clients see them."""

import os
import subprocess

import paho.mqtt.client as mqtt
import pytest

from conftest import SILT_BIN, Client, Silt


@pytest.fixture
def secured(data_dir):
    passwd = os.path.join(data_dir, "passwd")
    for user, pw in (("alice", "wonderland"), ("bob", "builder")):
        subprocess.run([SILT_BIN, "passwd", passwd, user], input=pw + "\n", text=True, check=True)
    acl = os.path.join(data_dir, "acl")
    with open(acl, "w") as f:
        f.write(
            "# anonymous clients may only read public topics\n"
            "topic read public/#\n"
            "user alice\n"
            "topic readwrite alice/#\n"
            "topic read public/#\n"
            "topic deny alice/secret/#\n"
            "pattern write devices/%c/#\n"
        )
    cfg = os.path.join(data_dir, "silt.toml")
    with open(cfg, "w") as f:
        f.write(f'[mqtt.auth]\npassword_file = "{passwd}"\nacl_file = "{acl}"\n')
    s = Silt(os.path.join(data_dir, "data"), ["--config", cfg])
    yield s
    if s.proc.poll() is None:
        s.kill()


def connack_code(silt, protocol, username, password, client_id="x", will=None):
    """Connects once and returns the CONNACK reason code (None if none came within 5 s)."""
    answer = connack(silt, protocol, username, password, client_id, will)
    return answer[0] if answer else None


def connack(silt, protocol, username, password, client_id="x", will=None):
    """Connects once and returns the CONNACK's (reason code, properties), or None after 5 s."""
    import time

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
    c.username_pw_set(username, password)
    if will:
        c.will_set(**will)
    result = []
    c.on_connect = lambda *a: result.append((a[3], a[4]))
    c.connect("127.0.0.1", silt.port)
    c.loop_start()
    for _ in range(100):
        if result:
            break
        time.sleep(0.05)
    c.loop_stop()
    return result[0] if result else None


def connect_rc(silt, protocol, username, password):
    return connack_code(silt, protocol, username, password)


def test_wrong_password_is_refused_with_the_right_code(secured):
    assert connect_rc(secured, mqtt.MQTTv5, "alice", "nope").value == 0x86
    # paho reports the 3.1.1 return code 4 under its 5.0 name.
    assert str(connect_rc(secured, mqtt.MQTTv311, "alice", "nope")) == "Bad user name or password"
    assert connect_rc(secured, mqtt.MQTTv5, "mallory", "x").value == 0x86
    assert connect_rc(secured, mqtt.MQTTv5, "alice", "wonderland").value == 0
    # MQTT 5.0 clients are told why in words too (the CONNACK's Reason String).
    code, props = connack(secured, mqtt.MQTTv5, "alice", "nope")
    assert code.value == 0x86 and props.ReasonString == "bad user name or password"


def test_acl_refuses_publish_and_subscribe_with_reason_codes(secured):
    alice = Client(secured, "alice-1", username="alice", password="wonderland")
    alice.c.subscribe("bob/#", qos=1)
    assert alice.subacks.get(timeout=5)[0].value == 0x87
    alice.c.subscribe("alice/#", qos=1)
    assert alice.subacks.get(timeout=5)[0].value == 1
    info = alice.c.publish("bob/inbox", b"x", qos=1)
    mid, rc = alice.published.get(timeout=5)
    assert mid == info.mid and rc.value == 0x87
    alice.c.publish("alice/notes", b"mine", qos=1)
    assert alice.get().payload == b"mine"
    # The deny rule wins over the broader grant: nothing under alice/secret/ is delivered.
    alice.c.publish("alice/secret/x", b"hidden", qos=1)
    assert alice.none()
    # %c pattern: a client may write under its own id only.
    alice.c.publish("devices/alice-1/t", b"ok", qos=1)
    assert alice.published.get(timeout=5)[1].value == 0
    alice.c.publish("devices/other/t", b"no", qos=1)
    assert alice.published.get(timeout=5)[1].value == 0x87
    alice.close()


def test_anonymous_loopback_client_gets_anonymous_rules(secured):
    anon = Client(secured, "anon")
    assert anon.rc.value == 0
    anon.c.subscribe("public/#", qos=1)
    assert anon.subacks.get(timeout=5)[0].value == 1
    anon.c.subscribe("alice/#", qos=1)
    assert anon.subacks.get(timeout=5)[0].value == 0x87
    anon.close()


def test_will_to_a_forbidden_topic_refuses_the_connection(secured):
    will = {"topic": "alice/fake", "payload": b"x", "qos": 1}
    rc = connack_code(secured, mqtt.MQTTv5, "bob", "builder", client_id="w", will=will)
    assert rc is not None and rc.value == 0x87


def test_acl_refusals_in_311(secured):
    """3.1.1 has one refusal code (SUBACK 0x80) and none for a publish: acknowledged, dropped."""
    alice = Client(secured, "alice-311", protocol=mqtt.MQTTv311, username="alice", password="wonderland")
    alice.c.subscribe([("alice/#", 1), ("bob/#", 1)])
    assert [rc.value for rc in alice.subacks.get(timeout=5)] == [1, 0x80]
    info = alice.c.publish("bob/inbox", b"x", qos=1)
    mid, rc = alice.published.get(timeout=5)
    assert mid == info.mid and rc.value == 0, "a plain PUBACK"
    # The deny rule under alice's own grant: acknowledged, not delivered.
    alice.c.publish("alice/secret/x", b"dropped", qos=1).wait_for_publish(5)
    alice.c.publish("alice/notes", b"delivered", qos=1).wait_for_publish(5)
    assert alice.get().payload == b"delivered"
    assert alice.none()
    alice.close()
