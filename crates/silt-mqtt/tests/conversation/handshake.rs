//! CONNECT to CONNACK: what is announced, what is refused and how each version hears it.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use silt_mqtt::server::{Close, Refusal};
use silt_mqtt::{Connect, Packet, QoS, ReasonCode, Will};

use crate::harness::{V5, V311, World, persistent};

fn raw_connect(version: silt_mqtt::ProtocolVersion) -> BytesMut {
    let mut buf = BytesMut::new();
    Packet::from(Connect::new(version, "raw", 60)).encode(version, &mut buf).expect("encodable");
    buf
}

#[test]
fn v5_connack_announces_the_limits_and_assigns_an_empty_client_id() {
    let mut w = World::new(V5);
    let ack = w.connect(Connect::new(V5, "", 30)).expect("a CONNACK");
    assert_eq!((ack.reason_code, ack.session_present), (ReasonCode::Success, false));
    let p = &ack.properties;
    assert_eq!(p.receive_maximum, Some(4));
    assert_eq!(p.maximum_packet_size, Some(1 << 20));
    assert_eq!(p.topic_alias_maximum, Some(4));
    assert_eq!(p.assigned_client_identifier.as_deref(), Some("silt-0000000000005eed"), "seeded by the driver");
    assert_eq!(w.broker.client_id, "silt-0000000000005eed", "the session is opened under it");
    assert_eq!(p.session_expiry_interval, None, "granted as asked");
    assert_eq!(p.server_keep_alive, None);
    assert!(w.server.is_open());
}

#[test]
fn a_capped_session_expiry_is_announced() {
    let mut settings = crate::harness::settings();
    settings.max_session_expiry = 600;
    let mut w = World::with_settings(V5, settings);
    let ack = w.connect(persistent(V5, "capped")).expect("a CONNACK");
    assert_eq!(ack.properties.session_expiry_interval, Some(600));
    assert_eq!(w.broker.sessions["capped"].expiry, 600);
}

#[test]
fn a_resumed_session_is_present_and_a_clean_start_is_not() {
    let mut w = World::connected(persistent(V5, "back"));
    let ack = w.reconnect(persistent(V5, "back")).expect("a CONNACK");
    assert!(ack.session_present);
    let mut clean = persistent(V5, "back");
    clean.clean_start = true;
    assert!(!w.reconnect(clean).expect("a CONNACK").session_present);
}

#[test]
fn v311_empty_client_id_needs_a_clean_session() {
    let mut w = World::new(V311);
    let mut c = Connect::new(V311, "", 30);
    c.clean_start = false;
    let ack = w.connect(c).expect("a CONNACK");
    assert_eq!(ack.reason_code, ReasonCode::ClientIdentifierNotValid);
    assert_eq!(w.close_reason(), Some(&Close::Refused(ReasonCode::ClientIdentifierNotValid)));
    assert!(w.broker.sessions.is_empty(), "no session was opened");

    let mut w = World::new(V311);
    let ack = w.connect(Connect::new(V311, "", 30)).expect("a CONNACK");
    assert_eq!(ack.reason_code, ReasonCode::Success, "a clean session gets an identifier");
    assert_eq!(ack.properties.assigned_client_identifier, None, "which 3.1.1 cannot announce");
}

#[test]
fn credentials_are_refused_before_the_client_identifier_is_checked() {
    let mut w = World::new(V5);
    w.broker.refuse_credentials = Some(Refusal::BadCredentials);
    let ack = w.connect(Connect::new(V5, "$share/not-a-client", 30)).expect("a CONNACK");
    assert_eq!(ack.reason_code, ReasonCode::BadUserNameOrPassword);

    let mut w = World::new(V311);
    w.broker.refuse_credentials = Some(Refusal::NotAuthorized);
    let ack = w.connect(Connect::new(V311, "c", 30)).expect("a CONNACK");
    assert_eq!(ack.reason_code, ReasonCode::NotAuthorized, "3.1.1 return code 5");
}

#[test]
fn shared_subscription_names_are_not_client_identifiers() {
    let mut w = World::new(V5);
    let ack = w.connect(Connect::new(V5, "$share/g/x", 30)).expect("a CONNACK");
    assert_eq!(ack.reason_code, ReasonCode::ClientIdentifierNotValid);
}

#[test]
fn a_will_topic_the_broker_does_not_allow_refuses_the_connect() {
    let mut w = World::new(V5);
    w.broker.refuse_will = true;
    let mut c = Connect::new(V5, "w", 30);
    c.will = Some(Will { topic: "wills/w".into(), payload: Bytes::from_static(b"bye"), ..Will::default() });
    let ack = w.connect(c).expect("a CONNACK");
    assert_eq!(ack.reason_code, ReasonCode::NotAuthorized);
    assert_eq!(w.close_reason(), Some(&Close::Refused(ReasonCode::NotAuthorized)));
    assert!(w.broker.sessions.is_empty());
}

#[test]
fn malformed_connect_gets_a_connack_only_in_v5() {
    // The reserved bit of the connect flags is set.
    for (version, answered) in [(V5, true), (V311, false)] {
        let mut w = World::new(version);
        let mut bytes = raw_connect(version);
        bytes[9] |= 0x01;
        w.client.send_bytes(&bytes);
        w.run();
        let acks: Vec<_> = w.client.received.iter().filter(|p| matches!(p, Packet::ConnAck(_))).collect();
        assert_eq!(acks.len(), usize::from(answered), "{version}");
        if let Some(Packet::ConnAck(a)) = acks.first() {
            assert_eq!(a.reason_code, ReasonCode::MalformedPacket);
        }
        assert!(matches!(w.close_reason(), Some(Close::Malformed(_))), "{version}");
    }
}

#[test]
fn unknown_protocol_level_is_answered_in_3_1_1() {
    let mut w = World::new(V311);
    let mut bytes = raw_connect(V311);
    bytes[8] = 6; // "MQTT" level 6
    w.client.send_bytes(&bytes);
    w.run();
    match w.client.received.as_slice() {
        [Packet::ConnAck(a)] => assert_eq!(a.reason_code, ReasonCode::UnsupportedProtocolVersion),
        other => panic!("expected one CONNACK, got {other:?}"),
    }
}

#[test]
fn no_connect_within_the_timeout_closes_silently() {
    let mut w = World::new(V5);
    assert_eq!(w.server.poll_timeout(), Some(w.now + Duration::from_secs(10)));
    w.client.send_bytes(&raw_connect(V5)[..5]); // a CONNECT that never ends
    w.advance(Duration::from_millis(9_999));
    assert_eq!(w.close_reason(), None);
    w.advance(Duration::from_millis(1));
    assert_eq!(w.close_reason(), Some(&Close::ConnectTimeout));
    assert!(w.client.received.is_empty());
}

#[test]
fn packets_behind_the_connect_wait_for_the_connack() {
    let mut w = World::new(V5);
    let mut bytes = raw_connect(V5);
    Packet::PingReq.encode(V5, &mut bytes).expect("encodable");
    let mut p = silt_mqtt::Publish::new("t", Bytes::from_static(b"early"));
    p.qos = QoS::AtLeastOnce;
    p.packet_id = silt_mqtt::PacketId::new(1);
    Packet::Publish(p).encode(V5, &mut bytes).expect("encodable");
    w.client.send_bytes(&bytes);
    w.run();
    let kinds: Vec<_> = w.client.received.iter().map(Packet::packet_type).collect();
    use silt_mqtt::PacketType::*;
    assert_eq!(kinds, [ConnAck, PingResp, PubAck]);
    assert_eq!(w.broker.log.len(), 1);
}
