//! What a hostile client controls, bounded by the core: topic depth on PUBLISH, SUBSCRIBE and
//! wills, the CONNECT's size, extended authentication the server does not offer, properties
//! only a server may send, and resends that must not grow the server's queues.

use bytes::Bytes;
use silt_mqtt::server::Close;
use silt_mqtt::{
    Connect, ConnectProperties, Packet, PacketId, PubResponse, PublishProperties, QoS, ReasonCode, Subscribe,
    SubscribeProperties, Subscription, SubscriptionOptions, Will,
};

use crate::harness::{V5, V311, World, id, persistent, publish, settings};

/// A topic of `n` levels (the harness allows 8).
fn deep(n: usize) -> String {
    vec!["d"; n].join("/")
}

fn pub_acks(w: &World) -> Vec<(PacketId, ReasonCode)> {
    w.client
        .received
        .iter()
        .filter_map(|p| match p {
            Packet::PubAck(r) | Packet::PubRec(r) => Some((r.packet_id, r.reason_code)),
            _ => None,
        })
        .collect()
}

fn disconnect(w: &World) -> Option<(ReasonCode, Option<String>)> {
    w.client.received.iter().find_map(|p| match p {
        Packet::Disconnect(d) => Some((d.reason_code, d.properties.reason_string.clone())),
        _ => None,
    })
}

#[test]
fn a_qos1_publish_deeper_than_the_limit_gets_puback_0x90_and_is_never_stored() {
    let mut w = World::connected(Connect::new(V5, "deep", 60));
    let ok = w.client.publish(publish(&deep(8), b"fits", QoS::AtLeastOnce)).expect("an id");
    let refused = w.client.publish(publish(&deep(9), b"too deep", QoS::AtLeastOnce)).expect("an id");
    let q2 = w.client.publish(publish(&deep(40), b"too deep", QoS::ExactlyOnce)).expect("an id");
    w.run();
    assert_eq!(
        pub_acks(&w),
        [(ok, ReasonCode::Success), (refused, ReasonCode::TopicNameInvalid), (q2, ReasonCode::TopicNameInvalid)]
    );
    assert_eq!(w.broker.log.len(), 1, "only the message within the limit reached the broker");
    assert!(w.server.is_open(), "a refused message does not end the connection");
    let why = w.client.received.iter().find_map(|p| match p {
        Packet::PubAck(r) if r.packet_id == refused => r.properties.reason_string.clone(),
        _ => None,
    });
    assert!(why.is_some_and(|s| s.contains("max_topic_levels")), "the PUBACK says which limit");
}

#[test]
fn a_qos0_publish_deeper_than_the_limit_closes_the_connection_with_0x90() {
    let mut w = World::connected(Connect::new(V5, "deep0", 60));
    w.client.publish(publish(&deep(9), b"x", QoS::AtMostOnce));
    w.run();
    assert_eq!(disconnect(&w).map(|d| d.0), Some(ReasonCode::TopicNameInvalid));
    assert!(w.broker.log.is_empty());
}

#[test]
fn an_mqtt311_publish_deeper_than_the_limit_closes_the_connection() {
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce] {
        let mut w = World::connected(Connect::new(V311, "deep311", 60));
        w.client.publish(publish(&deep(9), b"x", qos));
        w.run();
        assert!(matches!(w.close_reason(), Some(Close::Error(ReasonCode::TopicNameInvalid, _))), "{qos:?}");
        assert!(pub_acks(&w).is_empty(), "3.1.1 cannot refuse in a PUBACK: no positive one either");
        assert!(w.broker.log.is_empty());
    }
}

#[test]
fn subscriptions_deeper_than_the_limit_are_refused_filter_by_filter() {
    for (version, invalid) in [(V5, ReasonCode::TopicFilterInvalid), (V311, ReasonCode::UnspecifiedError)] {
        let mut w = World::connected(Connect::new(version, "deepsub", 60));
        let sub = |filter: String| Subscription {
            filter,
            options: SubscriptionOptions { qos: QoS::AtLeastOnce, ..SubscriptionOptions::default() },
        };
        w.client.send(Packet::Subscribe(Subscribe {
            packet_id: id(1),
            subscriptions: vec![sub(deep(8)), sub(format!("{}/#", deep(8))), sub(format!("$share/g/{}", deep(7)))],
            properties: SubscribeProperties::default(),
        }));
        w.run();
        let codes = w.client.received.iter().find_map(|p| match p {
            Packet::SubAck(a) => Some(a.reason_codes.clone()),
            _ => None,
        });
        assert_eq!(codes, Some(vec![ReasonCode::GrantedQoS1, invalid, invalid]), "{version:?}");
        assert_eq!(w.broker.sessions["deepsub"].subscriptions.len(), 1, "only the filter within the limit");
        assert!(w.broker.sessions["deepsub"].shared.is_empty());
    }
}

#[test]
fn a_will_topic_deeper_than_the_limit_is_refused_at_connect() {
    for (version, code) in [(V5, ReasonCode::TopicNameInvalid), (V311, ReasonCode::ServerUnavailable)] {
        let mut w = World::new(version);
        let mut c = Connect::new(version, "deepwill", 60);
        c.will = Some(Will { topic: deep(9), payload: Bytes::from_static(b"bye"), ..Will::default() });
        let ack = w.connect(c).expect("a CONNACK");
        assert_eq!(ack.reason_code, code, "{version:?}");
        assert!(!w.server.is_open());
    }
}

#[test]
fn a_connect_larger_than_max_connect_size_is_refused_before_it_is_read_whole() {
    let mut w = World::new(V5);
    let mut c = Connect::new(V5, "big", 60);
    let limit = settings().max_connect_size as usize;
    c.will = Some(Will { topic: "w".into(), payload: Bytes::from(vec![0u8; limit]), ..Will::default() });
    let mut bytes = bytes::BytesMut::new();
    Packet::from(c).encode(V5, &mut bytes).unwrap();
    // Only the first bytes arrive: the fixed header already tells the size.
    w.client.send_bytes(&bytes[..16]);
    w.run();
    let ack = w.client.received.iter().find_map(|p| match p {
        Packet::ConnAck(a) => Some(a.reason_code),
        _ => None,
    });
    assert_eq!(ack, Some(ReasonCode::PacketTooLarge));
    assert!(!w.server.is_open());
}

#[test]
fn a_connect_with_an_authentication_method_gets_0x8c_without_its_credentials_being_checked() {
    let mut w = World::new(V5);
    let mut c = Connect::new(V5, "scram", 60);
    c.username = Some("alice".into());
    c.password = Some(Bytes::from_static(b"pw"));
    c.properties = ConnectProperties { authentication_method: Some("SCRAM-SHA-256".into()), ..Default::default() };
    w.broker.refuse_credentials = None;
    let ack = w.connect(c).expect("a CONNACK");
    assert_eq!(ack.reason_code, ReasonCode::BadAuthenticationMethod);
    assert!(!w.server.is_open());
    assert!(w.broker.sessions.is_empty(), "no session was opened");
}

#[test]
fn a_client_publish_carrying_a_subscription_identifier_is_a_protocol_error() {
    let mut w = World::connected(Connect::new(V5, "subid", 60));
    let mut p = publish("t/x", b"x", QoS::AtLeastOnce);
    p.properties = PublishProperties { subscription_identifiers: vec![7], ..PublishProperties::default() }.into();
    w.client.publish(p);
    w.run();
    assert_eq!(disconnect(&w).map(|d| d.0), Some(ReasonCode::ProtocolError));
    assert!(w.broker.log.is_empty(), "the message was not forwarded");
}

#[test]
fn a_qos2_resend_loop_behind_a_slow_store_grows_a_counter_not_the_queue() {
    let mut w = World::connected(persistent(V5, "loop"));
    // The PUBREC is lost, so the client resends (it has not released the message).
    w.lose(|p| matches!(p, Packet::PubRec(_)));
    let q2 = w.client.publish(publish("t/q2", b"once", QoS::ExactlyOnce)).expect("an id");
    w.run();
    w.broker.manual_stores = true;
    let q1 = w.client.publish(publish("t/q1", b"slow", QoS::AtLeastOnce)).expect("an id");
    w.run();
    // The client resends the stored QoS 2 message (its PUBREL not sent yet) many times.
    let mut resend = publish("t/q2", b"once", QoS::ExactlyOnce);
    resend.packet_id = Some(q2);
    resend.dup = true;
    for _ in 0..10_000 {
        w.client.send(Packet::Publish(resend.clone()));
    }
    w.run();
    assert_eq!(w.broker.log.len(), 1, "stored once");
    w.complete_store(0);
    let acks = pub_acks(&w);
    assert_eq!(acks.iter().filter(|(i, _)| *i == q2).count(), 10_000, "every resend is answered, in turn");
    assert_eq!(acks.last(), Some(&(q2, ReasonCode::Success)));
    assert!(acks.contains(&(q1, ReasonCode::Success)));
    w.client.send(Packet::PubRel(PubResponse::new(q2)));
    w.run();
    assert!(w.server.is_open());
}

#[test]
fn refused_deep_publishes_count_against_receive_maximum_behind_a_slow_store() {
    let mut w = World::connected(Connect::new(V5, "flood", 60));
    w.broker.manual_stores = true;
    w.client.publish(publish("t/slow", b"x", QoS::AtLeastOnce));
    for _ in 0..usize::from(settings().receive_maximum) {
        w.client.publish(publish(&deep(9), b"x", QoS::AtLeastOnce));
    }
    w.run();
    // The connection closes once the store it already handed over is answered.
    w.complete_store(0);
    assert_eq!(disconnect(&w).map(|d| d.0), Some(ReasonCode::ReceiveMaximumExceeded));
}

/// Found by the `mqtt_server` fuzz target: the DISCONNECT for an AUTH packet carried 0x8C,
/// which a DISCONNECT may not carry (the packet failed to encode and was dropped).
#[test]
fn an_auth_packet_without_an_agreed_method_gets_a_protocol_error_disconnect() {
    let mut w = World::connected(Connect::new(V5, "auth", 60));
    w.client.send(Packet::Auth(Box::default()));
    w.run();
    assert_eq!(disconnect(&w).map(|d| d.0), Some(ReasonCode::ProtocolError));
}

/// Found by the `mqtt_server` fuzz target: a second CONNECT naming a version the server does
/// not speak closed the connection with a DISCONNECT carrying 0x84, which a DISCONNECT may
/// not carry (the packet failed to encode and was dropped).
#[test]
fn a_second_connect_with_an_unknown_version_gets_a_protocol_error_disconnect() {
    let mut w = World::connected(Connect::new(V5, "twice", 60));
    // CONNECT, protocol name "MQTT", level 9.
    w.client.send_bytes(&[0x10, 0x0d, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x09, 0x02, 0x00, 0x3c, 0x00, 0x01, b'c']);
    w.run();
    assert_eq!(disconnect(&w).map(|d| d.0), Some(ReasonCode::ProtocolError));
}
