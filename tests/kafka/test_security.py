"""Who may use the Kafka listener, and for what: SASL PLAIN and SCRAM-SHA-256/512 against the
users `silt passwd` writes (the MQTT users), with each of the four clients; anonymous access
as `mqtt.auth.allow_anonymous` says; the limits before authentication; the MQTT topic ACLs on
produce, fetch, groups and transactions; and the TLS listener."""

from __future__ import annotations

import socket
import struct
import subprocess
import time

import pytest
from kafka_clients import AioKafka, Confluent, KafkaPython, Kcat, Rec
from kafka_harness import unique, wait_until
from kafka_wire import RawKafka

pytest_plugins = ["kafka_harness"]

MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
USERS = {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw"}
ACL = """\
user alice
topic readwrite plant/#
topic readwrite secret/#
group g-alice*
transactional_id tx-alice-*
user bob
topic read plant/line1/#
topic readwrite bob/#
group g-bob
user carol
topic write plant/line1/#
"""


def passwd_file(kafka, users=USERS):
    path = kafka.base / "passwd"
    for user, pw in users.items():
        p = subprocess.run([str(silt_bin()), "passwd", str(path), user], input=pw + "\n", text=True,
                           capture_output=True, timeout=60)
        assert p.returncode == 0, p.stderr
    return path


def silt_bin():
    from tiering_harness import SILT_BIN
    return SILT_BIN


def secure_node(kafka, acl=ACL, anonymous="never", name="a", tls=None, **kafka_section):
    auth = {"password_file": str(passwd_file(kafka)), "allow_anonymous": anonymous}
    if acl is not None:
        (kafka.base / "acl").write_text(acl)
        auth["acl_file"] = str(kafka.base / "acl")
    sections = {"mqtt.auth": auth}
    if kafka_section:
        sections["kafka"] = kafka_section
    if tls:
        sections["kafka.tls"] = tls
    return kafka.node(name, config=kafka.config(f"{name}.toml", **sections))


def confluent_sasl(mech, user, pw=None):
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mech, "sasl.username": user,
            "sasl.password": USERS[user] if pw is None else pw}


def python_sasl(mech, user, pw=None):
    return dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mech, sasl_plain_username=user,
                sasl_plain_password=USERS[user] if pw is None else pw)


@pytest.mark.parametrize("mech", MECHANISMS)
def test_every_client_authenticates_with_each_mechanism(kafka, mech):
    node = secure_node(kafka, acl=None)
    topic = unique("sasl")
    clients = [Confluent(confluent_sasl(mech, "alice")), Kcat(confluent_sasl(mech, "alice"))]
    for i, c in enumerate(clients):
        c.produce(node.bootstrap, [(topic, 0, Rec(f"{topic}/k".encode(), f"{c.name}-{i}".encode()))])
    KafkaPython().produce(node.bootstrap, [(topic, 0, Rec(None, b"kafka-python"))], **python_sasl(mech, "bob"))
    AioKafka().produce(node.bootstrap, [(topic, 0, Rec(None, b"aiokafka"))], **python_sasl(mech, "carol"))
    want = [b"confluent-0", b"kcat-1", b"kafka-python", b"aiokafka"]
    for c, conf in [(Confluent(confluent_sasl(mech, "bob")), {}), (Kcat(confluent_sasl(mech, "carol")), {}),
                    (KafkaPython(), python_sasl(mech, "alice")), (AioKafka(), python_sasl(mech, "bob"))]:
        got = c.consume(node.bootstrap, {(topic, 0): (0, 4)}, **conf)[(topic, 0)]
        assert [g.value for g in got] == want, c.name


@pytest.mark.parametrize("mech", MECHANISMS)
def test_a_wrong_password_or_an_unknown_user_is_refused_and_never_logged(kafka, mech):
    kafka.expect_closed_connections()
    from confluent_kafka import Producer
    # One node per attempt: failures from one address slow that address's next attempts down
    # (silt-auth's verifier backoff), which would turn the second answer into "busy".
    for i, (user, pw) in enumerate([("alice", "not-her-password"), ("mallory", "whatever-pw")]):
        node = secure_node(kafka, acl=None, name=f"n{i}")
        errors = []
        conf = {"bootstrap.servers": node.bootstrap, **confluent_sasl(mech, "alice", pw), "sasl.username": user,
                "error_cb": lambda e: errors.append(e)}
        p = Producer(conf)
        p.produce(unique("denied"), b"x")
        assert p.flush(3) == 1, "nothing is written"
        assert any("invalid credentials" in e.str() for e in errors), (user, [e.str() for e in errors])
        assert node.lines("kafka connection closed.*invalid credentials"), "the broker says why it closed"
        assert not node.lines("not-her-password|whatever-pw"), "a password reached the log"


def test_without_credentials_only_api_versions_and_sasl_are_served(kafka):
    kafka.expect_closed_connections()
    node = secure_node(kafka, acl=None)
    raw = RawKafka(node.kafka_port)
    kafka.on_cleanup(raw.close)
    versions = raw.api_versions()
    assert 17 in versions and 36 in versions, "SaslHandshake and SaslAuthenticate are announced"
    raw.send_raw(raw.frame(3, 1, struct.pack(">i", -1))[0])  # Metadata v1, all topics
    assert raw.closed_by_peer(10), "an unauthenticated Metadata request closes the connection"
    assert wait_until(lambda: node.lines("kafka connection closed.*authentication required"), 10)
    # A client without SASL settings cannot do anything.
    from confluent_kafka.admin import AdminClient
    md = AdminClient({"bootstrap.servers": node.bootstrap})
    with pytest.raises(Exception):
        md.list_topics(timeout=3)


def test_anonymous_clients_are_served_where_allowed_and_may_still_log_in(kafka):
    node = secure_node(kafka, acl="topic readwrite open/#\nuser alice\ntopic readwrite alice/#\n",
                       anonymous="loopback")
    Confluent().produce(node.bootstrap, [("open", 0, Rec(None, b"anonymous"))])
    with pytest.raises(Exception, match="TOPIC_AUTHORIZATION_FAILED|authorization|Authorization"):
        Confluent().produce(node.bootstrap, [("alice", 0, Rec(None, b"anonymous"))])
    Confluent(confluent_sasl("SCRAM-SHA-256", "alice")).produce(node.bootstrap, [("alice", 0, Rec(None, b"a"))])


def test_before_authentication_frames_are_small_and_time_is_short(kafka):
    kafka.expect_closed_connections()
    # Two nodes: the "connection closed" line is written once per 10 s at most.
    node = secure_node(kafka, acl=None, name="big")
    big = socket.create_connection(("127.0.0.1", node.kafka_port))
    kafka.on_cleanup(big.close)
    big.sendall(struct.pack(">i", 10 << 20))  # announces 10 MiB, far below max_request_bytes
    big.settimeout(10)
    assert big.recv(1) == b"", "the connection is closed before any body is read"
    assert wait_until(lambda: node.lines("kafka connection closed.*before authentication \\(at most 65536"), 10)
    node = secure_node(kafka, acl=None, name="slow", auth_timeout_ms=1500)
    idle = RawKafka(node.kafka_port)
    kafka.on_cleanup(idle.close)
    idle.api_versions()
    started = time.monotonic()
    assert idle.closed_by_peer(15), "a connection that never authenticates is closed"
    assert time.monotonic() - started < 10
    assert wait_until(lambda: node.lines("kafka connection closed.*not authenticated within"), 10)


def produced_offsets(node, topic, user="alice", keys=()):
    c = Confluent(confluent_sasl("PLAIN", user))
    return c.produce(node.bootstrap, [(topic, 0, Rec(k.encode(), k.encode())) for k in keys])


def test_a_consumer_reads_only_the_mqtt_topics_its_user_may_read_and_moves_past_the_rest(kafka):
    node = secure_node(kafka)
    keys = ["plant/line1/a", "plant/line2/a", "plant/line1/b", "plant/line2/b", "plant/line2/c", "plant/line2/d"]
    produced_offsets(node, "plant", keys=keys)
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    c = Consumer({"bootstrap.servers": node.bootstrap, **confluent_sasl("SCRAM-SHA-512", "bob"),
                  "group.id": "g-bob", "enable.auto.commit": False, "enable.partition.eof": True})
    kafka.on_cleanup(c.close)
    c.assign([TopicPartition("plant", 0, 0)])
    got, eof = [], None
    deadline = time.monotonic() + 20
    while eof is None and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error() and m.error().code() == KafkaError._PARTITION_EOF:
            eof = m.offset()
        elif not m.error():
            got.append((m.offset(), m.key()))
    assert got == [(0, b"plant/line1/a"), (2, b"plant/line1/b")]
    # The end of the partition is reached at its high watermark: the fetch moved past the
    # records bob may not read (else it would ask for offset 3 forever, never at the end).
    assert eof == len(keys), f"end of partition at {eof}"
    # The other clients agree.
    for client, conf in [(Kcat(confluent_sasl("PLAIN", "bob")), {}),
                         (KafkaPython(), python_sasl("PLAIN", "bob")), (AioKafka(), python_sasl("PLAIN", "bob"))]:
        seen = client.consume(node.bootstrap, {("plant", 0): (0, 2)}, **conf)[("plant", 0)]
        assert [g.offset for g in seen] == [0, 2], client.name
    # A topic bob may read none of is refused, and left out of his topic list.
    produced_offsets(node, "secret", keys=["secret/x"])
    from confluent_kafka.admin import AdminClient
    bob_admin = AdminClient({"bootstrap.servers": node.bootstrap, **confluent_sasl("PLAIN", "bob")})
    alice_admin = AdminClient({"bootstrap.servers": node.bootstrap, **confluent_sasl("PLAIN", "alice")})
    assert "secret" in alice_admin.list_topics(timeout=10).topics
    assert "secret" not in bob_admin.list_topics(timeout=10).topics
    err = bob_admin.list_topics("secret", timeout=10).topics["secret"].error
    assert err is not None and err.name() == "TOPIC_AUTHORIZATION_FAILED", err


def test_a_producer_writes_only_where_its_user_may_publish(kafka):
    node = secure_node(kafka)
    produced_offsets(node, "plant", keys=["plant/line1/first"])
    from confluent_kafka import KafkaException
    # Bob may read plant/line1 but write nothing under plant.
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        produced_offsets(node, "plant", user="bob", keys=["plant/line1/x"])
    assert produced_offsets(node, "bob", user="bob", keys=["bob/x"]) == [(0, 0)]
    # Carol may write plant/line1 only: a batch with one record elsewhere is refused whole.
    c = Confluent(confluent_sasl("PLAIN", "carol"))
    assert c.produce(node.bootstrap, [("plant", 0, Rec(b"plant/line1/c", b"ok"))]) == [(0, 1)]
    raw_batch = [("plant", 0, Rec(b"plant/line1/c", b"in")), ("plant", 0, Rec(b"plant/line9/c", b"out"))]
    # One batch whatever the load: it leaves once it holds both records (a linger of 200 ms
    # let a starved client send the first alone, which is then rightly accepted).
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        c.produce(node.bootstrap, raw_batch, **{"linger.ms": 30000, "batch.num.messages": 2})
    got = Confluent(confluent_sasl("PLAIN", "alice")).consume(node.bootstrap, {("plant", 0): (0, 2)},
                                                              **{"group.id": "g-alice"})
    assert [g.value for g in got[("plant", 0)]] == [b"plant/line1/first", b"ok"]
    lo, hi = alice_watermarks(node, "plant")
    assert hi == 2, "nothing of the refused batch was written"


def alice_watermarks(node, topic):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": node.bootstrap, **confluent_sasl("PLAIN", "alice"), "group.id": "g-alice"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        c.close()


def test_groups_and_transactional_ids_need_a_rule(kafka):
    node = secure_node(kafka)
    produced_offsets(node, "plant", keys=["plant/line1/a", "plant/line1/b"])
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    def committed(user, group):
        errors = []
        c = Consumer({"bootstrap.servers": node.bootstrap, **confluent_sasl("PLAIN", user), "group.id": group,
                      "enable.auto.commit": False, "error_cb": errors.append})
        try:
            c.commit(offsets=[TopicPartition("plant", 0, 2)], asynchronous=False)
            return c.committed([TopicPartition("plant", 0)], timeout=10)[0].offset
        except KafkaException as e:
            # librdkafka finds the coordinator first; the broker's refusal comes from there.
            raise KafkaException(f"{e}; {[x.name() for x in errors]}") from None
        finally:
            c.close()

    assert committed("bob", "g-bob") == 2
    assert committed("alice", "g-alice-etl") == 2
    # librdkafka looks the coordinator up first and only says it is waiting for one; kafka-python
    # reports the broker's answer.
    from kafka import KafkaConsumer, OffsetAndMetadata
    from kafka import TopicPartition as KTopicPartition
    kc = KafkaConsumer(bootstrap_servers=node.bootstrap, group_id="g-alice-etl", enable_auto_commit=False,
                       **python_sasl("PLAIN", "bob"))
    kafka.on_cleanup(kc.close)
    with pytest.raises(Exception, match="GroupAuthorizationFailed"):
        kc.commit({KTopicPartition("plant", 0): OffsetAndMetadata(1, "", -1)})
    assert committed("alice", "g-alice-etl") == 2, "bob's attempt changed nothing"
    # Joining a group it may not use fails the same way.
    c = Consumer({"bootstrap.servers": node.bootstrap, **confluent_sasl("PLAIN", "bob"), "group.id": "g-other"})
    kafka.on_cleanup(c.close)
    c.subscribe(["plant"])
    err = wait_until(lambda: (lambda m: m and m.error())(c.poll(0.5)), 20, what="an error for the group")
    assert "GROUP_AUTHORIZATION_FAILED" in err.name() or "authoriz" in err.str().lower(), err

    def transactional(user, txn):
        p = Producer({"bootstrap.servers": node.bootstrap, **confluent_sasl("SCRAM-SHA-256", user),
                      "transactional.id": txn})
        p.init_transactions(15)
        p.begin_transaction()
        p.produce("plant", key=b"plant/line1/t", value=txn.encode(), partition=0)
        p.commit_transaction(15)

    transactional("alice", "tx-alice-1")
    with pytest.raises(KafkaException, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
        transactional("bob", "tx-alice-1")


def self_signed(kafka):
    cert, key = kafka.base / "cert.pem", kafka.base / "key.pem"
    p = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return cert, key


def test_the_tls_listener_serves_the_same_dataset_and_advertises_itself(kafka):
    cert, key = self_signed(kafka)
    node = secure_node(kafka, acl=None, tls={"listen": "127.0.0.1:0", "cert_file": str(cert),
                                             "key_file": str(key)})
    tls_port = node.kafka_ports["tls"]
    assert tls_port != node.kafka_port
    tls = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
           "sasl.password": USERS["alice"], "ssl.ca.location": str(cert)}
    boot = f"127.0.0.1:{tls_port}"
    Confluent(tls).produce(boot, [("secure", 0, Rec(b"secure/a", b"over tls"))])
    Kcat(tls).produce(boot, [("secure", 0, Rec(b"secure/b", b"kcat over tls"))])
    got = Confluent(confluent_sasl("PLAIN", "bob")).consume(node.bootstrap, {("secure", 0): (0, 2)})
    assert [g.value for g in got[("secure", 0)]] == [b"over tls", b"kcat over tls"]
    from confluent_kafka.admin import AdminClient
    brokers = AdminClient({"bootstrap.servers": boot, **tls}).list_topics(timeout=10).brokers
    assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.1", tls_port)]
    # Plain TCP on the TLS port is not TLS: the handshake fails, nothing is served.
    raw = socket.create_connection(("127.0.0.1", tls_port))
    kafka.on_cleanup(raw.close)
    raw.sendall(b"\x00\x00\x00\x0a" + b"\x00" * 10)
    raw.settimeout(10)
    data = raw.recv(64)
    assert data == b"" or data[0] == 0x15, f"a TLS alert or a close, not a Kafka answer: {data!r}"
