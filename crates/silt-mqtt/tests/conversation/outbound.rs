//! PUBLISH to the client: the window, loss and resend, topic aliases, the client's Maximum
//! Packet Size, the QoS 2 handshake.

use silt_mqtt::server::Sent;
use silt_mqtt::{Connect, ConnectProperties, Packet, PacketId, PubResponse, Publish, QoS, ReasonCode};

use crate::harness::{V5, V311, World, id, persistent, publish};

fn with_properties(client_id: &str, properties: ConnectProperties) -> Connect {
    let mut c = Connect::new(V5, client_id, 60);
    c.properties = properties;
    c
}

fn raw_publishes(w: &World) -> Vec<Publish> {
    w.client
        .received
        .iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_window_is_the_clients_receive_maximum_and_frees_on_puback() {
    let props = ConnectProperties { receive_maximum: Some(2), ..ConnectProperties::default() };
    let mut w = World::connected(with_properties("sub", props));
    w.client.auto_ack = false;
    let handles: Vec<u64> = (0..5).map(|_| w.deliver(publish("t/w", b"m", QoS::AtLeastOnce))).collect();
    assert_eq!(w.client.messages.len(), 2, "no more than the client's Receive Maximum in flight");
    assert_eq!(w.server.send_room(), 0);
    assert!(matches!(w.server.send(publish("t/w", b"m", QoS::ExactlyOnce).view(), 99), Sent::NoRoom(99)));
    assert!(
        matches!(w.server.send(publish("t/w", b"q0", QoS::AtMostOnce).view(), 98), Sent::Queued(None)),
        "QoS 0 takes no room"
    );

    let first = w.client.messages[0].clone();
    w.client.ack(&first);
    w.run();
    assert_eq!(w.broker.settled, [handles[0]], "the PUBACK settles the message");
    let qos1: Vec<_> = w.client.messages.iter().filter(|m| m.qos == QoS::AtLeastOnce).collect();
    assert_eq!(qos1.len(), 3, "and frees one place");
}

#[test]
fn our_max_inflight_caps_a_generous_client() {
    let props = ConnectProperties { receive_maximum: Some(100), ..ConnectProperties::default() };
    let mut w = World::connected(with_properties("sub", props));
    w.client.auto_ack = false;
    for _ in 0..10 {
        w.deliver(publish("t/w", b"m", QoS::AtLeastOnce));
    }
    assert_eq!(w.client.messages.len(), 8);
}

#[test]
fn lost_publishes_are_resent_with_dup_after_a_reconnect() {
    let mut w = World::connected(persistent(V5, "sub"));
    w.lose(|p| matches!(p, Packet::Publish(_)));
    w.lose(|p| matches!(p, Packet::Publish(_)));
    let h1 = w.deliver(publish("t/1", b"one", QoS::AtLeastOnce));
    let h2 = w.deliver(publish("t/2", b"two", QoS::ExactlyOnce));
    assert!(w.client.messages.is_empty());
    let Packet::Publish(lost_q2) = &w.lost[1] else { panic!("a PUBLISH was lost") };
    let q2_id = lost_q2.packet_id.expect("QoS 2");

    let ack = w.reconnect(persistent(V5, "sub")).expect("a CONNACK");
    assert!(ack.session_present);
    assert_eq!(w.broker.undelivered, [h1, h2], "the first connection handed them back");
    let Packet::Publish(lost_q1) = &w.lost[0] else { panic!("a PUBLISH was lost") };
    let q1_id = lost_q1.packet_id.expect("QoS 1");
    let got: Vec<(&str, QoS, bool, Option<PacketId>)> =
        w.client.messages.iter().map(|m| (m.topic.as_str(), m.qos, m.dup, m.packet_id)).collect();
    assert_eq!(
        got,
        [("t/1", QoS::AtLeastOnce, true, Some(q1_id)), ("t/2", QoS::ExactlyOnce, true, Some(q2_id))],
        "both keep their packet ids (MQTT-4.4.0-1)"
    );
    assert_eq!(w.broker.settled, [h1, h2], "both completed this time (QoS 2 a round trip later)");
}

#[test]
fn outbound_topic_aliases_stay_within_the_clients_maximum() {
    let props = ConnectProperties { topic_alias_maximum: Some(2), ..ConnectProperties::default() };
    let mut w = World::connected(with_properties("aliased", props));
    for t in ["al/a", "al/b", "al/c", "al/a", "al/c"] {
        w.deliver(Publish::new(t, &b"x"[..]));
    }
    let sent: Vec<(String, Option<u16>)> =
        raw_publishes(&w).into_iter().map(|p| (p.topic, p.properties.topic_alias)).collect();
    let want = [("al/a", Some(1)), ("al/b", Some(2)), ("al/c", None), ("", Some(1)), ("al/c", None)];
    assert_eq!(sent, want.map(|(t, a)| (t.to_owned(), a)));
    let resolved: Vec<&str> = w.client.messages.iter().map(|m| m.topic.as_str()).collect();
    assert_eq!(resolved, ["al/a", "al/b", "al/c", "al/a", "al/c"]);
}

#[test]
fn a_message_larger_than_the_clients_maximum_is_discarded_as_delivered() {
    let props = ConnectProperties {
        maximum_packet_size: Some(64),
        topic_alias_maximum: Some(2),
        ..ConnectProperties::default()
    };
    let mut w = World::connected(with_properties("small", props));
    let big = w.deliver(publish("big/a", &[b'x'; 100], QoS::AtLeastOnce));
    assert!(w.client.messages.is_empty(), "never sent");
    assert_eq!(w.broker.settled, [big], "settled as if delivered (MQTT 5.0 §3.1.2.11.4)");
    assert_eq!(w.server.send_room(), 8, "and it holds no place in the window");
    w.deliver(publish("big/a", b"fits", QoS::AtLeastOnce));
    let p = &raw_publishes(&w)[0];
    assert_eq!((p.topic.as_str(), p.properties.topic_alias), ("big/a", Some(1)), "the dropped one defined no alias");
}

#[test]
fn the_clients_maximum_counts_the_topic_alias_the_packet_carries() {
    // Sized to fit without its Topic Alias property (3 bytes), not with it.
    let mut edge = publish("big/a", &[b'x'; 40], QoS::AtLeastOnce);
    edge.packet_id = Some(id(1));
    edge.properties.topic_alias = Some(1);
    let with_alias = u32::try_from(Packet::Publish(edge).encoded_len(V5).unwrap()).unwrap();
    let props = ConnectProperties {
        maximum_packet_size: Some(with_alias - 1),
        topic_alias_maximum: Some(2),
        ..ConnectProperties::default()
    };
    let mut w = World::connected(with_properties("edge", props));
    let edge = w.deliver(publish("big/a", &[b'x'; 40], QoS::AtLeastOnce));
    assert!(raw_publishes(&w).is_empty(), "nothing over the client's maximum goes out");
    assert_eq!(w.broker.settled, [edge], "discarded as delivered");
    w.deliver(publish("big/a", &[b'x'; 30], QoS::AtLeastOnce));
    let p = &raw_publishes(&w)[0];
    assert_eq!((p.topic.as_str(), p.properties.topic_alias), ("big/a", Some(1)));
}

#[test]
fn qos2_completes_on_pubcomp_after_pubrec_or_on_a_refusing_pubrec() {
    let mut w = World::connected(Connect::new(V5, "q2", 60));
    w.client.auto_ack = false;
    let h = w.deliver(publish("t", b"x", QoS::ExactlyOnce));
    let pid = w.client.messages[0].packet_id.expect("QoS 2");
    w.client.send(Packet::PubComp(PubResponse::new(pid)));
    w.run();
    assert!(w.broker.settled.is_empty(), "PUBCOMP before PUBREC completes nothing");
    w.client.send(Packet::PubRec(PubResponse::new(pid)));
    w.run();
    assert!(matches!(w.client.received.last(), Some(Packet::PubRel(r)) if r.packet_id == pid));
    w.client.send(Packet::PubComp(PubResponse::new(pid)));
    w.run();
    assert_eq!(w.broker.settled, [h]);

    let refused = w.deliver(publish("t", b"y", QoS::ExactlyOnce));
    let pid = w.client.messages[1].packet_id.expect("QoS 2");
    let mut rec = PubResponse::new(pid);
    rec.reason_code = ReasonCode::QuotaExceeded;
    w.client.send(Packet::PubRec(rec));
    w.run();
    assert_eq!(w.broker.settled, [h, refused], "an error PUBREC ends the message");

    w.client.send(Packet::PubRec(PubResponse::new(id(77))));
    w.run();
    match w.client.received.last() {
        Some(Packet::PubRel(r)) => assert_eq!(r.reason_code, ReasonCode::PacketIdentifierNotFound),
        other => panic!("expected PUBREL 0x92, got {other:?}"),
    }
}

#[test]
fn v311_clients_get_no_aliases_and_no_properties() {
    let mut w = World::connected(Connect::new(V311, "old", 60));
    let mut p = publish("t/old", b"x", QoS::AtLeastOnce);
    p.properties.content_type = Some("text/plain".into());
    w.deliver(p.clone());
    w.deliver(p);
    for p in raw_publishes(&w) {
        assert_eq!(p.topic, "t/old");
        assert_eq!(p.properties, Default::default());
    }
}

#[test]
fn a_released_qos2_message_is_resent_as_pubrel_never_as_publish() {
    let mut w = World::connected(persistent(V5, "rel"));
    w.client.auto_ack = false;
    let h = w.deliver(publish("t/q2", b"once", QoS::ExactlyOnce));
    let pid = w.client.messages[0].packet_id.expect("QoS 2");
    w.client.send(Packet::PubRec(PubResponse::new(pid)));
    w.run();
    assert!(matches!(w.client.received.last(), Some(Packet::PubRel(r)) if r.packet_id == pid));
    // The link drops before the client's PUBCOMP.
    w.reconnect(persistent(V5, "rel")).expect("a CONNACK");
    assert!(w.client.messages.is_empty(), "the PUBLISH is not sent again (the new connection's client saw none)");
    assert!(w.client.received.iter().any(|p| matches!(p, Packet::PubRel(r) if r.packet_id == pid)), "PUBREL again");
    // The new connection's client answers that PUBREL with PUBCOMP: complete, once.
    assert_eq!(w.broker.settled, [h], "completed by PUBCOMP under the same id");
}
