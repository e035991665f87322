//! PUBLISH from the client: acknowledgement order, exactly once, Receive Maximum, topic
//! aliases, refusals per version.

use silt_mqtt::server::Close;
use silt_mqtt::{Connect, Packet, PacketId, PubResponse, QoS, ReasonCode};

use crate::harness::{V5, V311, World, id, persistent, publish};

fn acks(w: &World) -> Vec<(PacketId, ReasonCode)> {
    w.client
        .received
        .iter()
        .filter_map(|p| match p {
            Packet::PubAck(r) | Packet::PubRec(r) => Some((r.packet_id, r.reason_code)),
            _ => None,
        })
        .collect()
}

fn disconnects(w: &World) -> Vec<ReasonCode> {
    w.client
        .received
        .iter()
        .filter_map(|p| match p {
            Packet::Disconnect(d) => Some(d.reason_code),
            _ => None,
        })
        .collect()
}

#[test]
fn qos1_pubacks_leave_in_arrival_order_when_stores_complete_out_of_order() {
    let mut w = World::connected(Connect::new(V5, "pub", 60));
    w.broker.manual_stores = true;
    let sent: Vec<PacketId> =
        (0..3).map(|_| w.client.publish(publish("t/order", b"m", QoS::AtLeastOnce)).expect("an id")).collect();
    w.run();
    assert_eq!(w.broker.pending.len(), 3, "all three handed to the broker at once (pipelined)");
    w.complete_store(2);
    w.complete_store(1);
    assert!(acks(&w).is_empty(), "the first is not stored yet: nothing may overtake it");
    w.complete_store(0);
    let got: Vec<PacketId> = acks(&w).into_iter().map(|(i, _)| i).collect();
    assert_eq!(got, sent);
    assert!(w.client.outbound.is_empty());
}

#[test]
fn qos2_message_is_stored_once_when_resent_with_dup_after_a_lost_pubrec() {
    let mut w = World::connected(persistent(V5, "q2"));
    w.lose(|p| matches!(p, Packet::PubRec(_)));
    let pid = w.client.publish(publish("t/q2", b"once", QoS::ExactlyOnce)).expect("an id");
    w.run();
    assert_eq!(w.lost.len(), 1, "the PUBREC never arrived");
    assert_eq!(w.broker.log.len(), 1);
    assert!(w.broker.sessions["q2"].awaiting_release.contains(&pid.get()), "the session remembers the id");

    let ack = w.reconnect(persistent(V5, "q2")).expect("a CONNACK");
    assert!(ack.session_present);
    w.client.resend_unacked();
    w.run();
    assert_eq!(w.broker.log.len(), 1, "the resend is acknowledged, not stored again");
    assert_eq!(acks(&w), [(pid, ReasonCode::Success)]);
    assert!(w.client.outbound.is_empty(), "PUBREL and PUBCOMP completed it");
    assert!(w.broker.sessions["q2"].awaiting_release.is_empty(), "released");
}

#[test]
fn pubrel_for_an_unknown_id_gets_pubcomp_0x92() {
    let mut w = World::connected(Connect::new(V5, "rel", 60));
    w.client.send(Packet::PubRel(PubResponse::new(id(9))));
    w.run();
    match w.client.received.last() {
        Some(Packet::PubComp(r)) => {
            assert_eq!((r.packet_id, r.reason_code), (id(9), ReasonCode::PacketIdentifierNotFound))
        }
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
}

#[test]
fn exceeding_receive_maximum_is_disconnect_0x93_in_v5_and_a_plain_close_in_v311() {
    for version in [V5, V311] {
        // Receive Maximum 4: two QoS 2 messages stored but never released (their PUBRECs are
        // lost, so the client sends no PUBREL), two QoS 1 messages not yet stored.
        let mut w = World::connected(Connect::new(version, "greedy", 60));
        w.lose(|p| matches!(p, Packet::PubRec(_)));
        w.lose(|p| matches!(p, Packet::PubRec(_)));
        for _ in 0..2 {
            w.client.publish(publish("rm/t", b"x", QoS::ExactlyOnce));
        }
        w.run();
        w.broker.manual_stores = true;
        for _ in 0..2 {
            w.client.publish(publish("rm/t", b"x", QoS::AtLeastOnce));
        }
        w.run();
        assert_eq!(w.close_reason(), None, "{version}: four outstanding is the limit");
        w.client.publish(publish("rm/t", b"x", QoS::AtLeastOnce));
        w.run();
        assert_eq!(w.close_reason(), None, "{version}: closing waits for the stores already requested");
        w.complete_store(0);
        w.complete_store(0);
        assert!(matches!(w.close_reason(), Some(Close::Error(ReasonCode::ReceiveMaximumExceeded, _))), "{version}");
        let want: &[ReasonCode] = if version.is_v5() { &[ReasonCode::ReceiveMaximumExceeded] } else { &[] };
        assert_eq!(disconnects(&w), want, "{version}");
        assert_eq!(w.broker.log.len(), 4, "{version}: the fifth was never stored");
    }
}

#[test]
fn inbound_topic_alias_is_resolved_and_an_unknown_one_is_a_protocol_error() {
    let mut w = World::connected(Connect::new(V5, "alias", 60));
    let mut p = publish("alias/long/topic", b"one", QoS::AtMostOnce);
    p.properties.topic_alias = Some(3);
    w.client.publish(p);
    let mut p = publish("", b"two", QoS::AtMostOnce);
    p.properties.topic_alias = Some(3);
    w.client.publish(p);
    w.run();
    let topics: Vec<&str> = w.broker.log.iter().map(|m| m.topic.as_str()).collect();
    assert_eq!(topics, ["alias/long/topic", "alias/long/topic"]);

    let mut p = publish("", b"three", QoS::AtMostOnce);
    p.properties.topic_alias = Some(2); // never defined
    w.client.publish(p);
    w.run();
    assert_eq!(disconnects(&w), [ReasonCode::ProtocolError]);

    let mut w = World::connected(Connect::new(V5, "alias", 60));
    let mut p = publish("a", b"x", QoS::AtMostOnce);
    p.properties.topic_alias = Some(5); // above our Topic Alias Maximum (4)
    w.client.publish(p);
    w.run();
    assert_eq!(disconnects(&w), [ReasonCode::TopicAliasInvalid]);
}

#[test]
fn refused_publishes_get_reason_codes_in_v5_and_3_1_1_cannot_say_no() {
    // Not authorized: 0x87 in 5.0; a plain acknowledgement in 3.1.1 (the message is dropped).
    for (version, code) in [(V5, ReasonCode::NotAuthorized), (V311, ReasonCode::Success)] {
        let mut w = World::connected(Connect::new(version, "p", 60));
        w.broker.deny_prefix = Some("secret");
        let a = w.client.publish(publish("secret/a", b"x", QoS::AtLeastOnce)).expect("an id");
        let b = w.client.publish(publish("secret/b", b"x", QoS::ExactlyOnce)).expect("an id");
        w.run();
        assert_eq!(acks(&w), [(a, code), (b, code)], "{version}");
        assert!(w.broker.log.is_empty());
        assert!(w.server.is_open());
    }
    // Not stored: 0x80 in 5.0; 3.1.1 closes without an acknowledgement, so the client resends.
    let mut w = World::connected(Connect::new(V5, "p", 60));
    w.broker.fail_stores = true;
    let a = w.client.publish(publish("t", b"x", QoS::AtLeastOnce)).expect("an id");
    w.run();
    assert_eq!(acks(&w), [(a, ReasonCode::UnspecifiedError)]);
    assert!(w.server.is_open());
    let mut w = World::connected(Connect::new(V311, "p", 60));
    w.broker.fail_stores = true;
    w.client.publish(publish("t", b"x", QoS::AtLeastOnce));
    w.run();
    assert!(acks(&w).is_empty());
    assert_eq!(w.close_reason(), Some(&Close::Lost));
}

#[test]
fn a_wildcard_in_a_topic_name_is_disconnect_0x90() {
    let mut w = World::connected(Connect::new(V5, "p", 60));
    w.send_wildcard_topic();
    assert_eq!(disconnects(&w), [ReasonCode::TopicNameInvalid]);
}

#[test]
fn stores_requested_before_a_close_are_still_acknowledged_before_the_disconnect() {
    let mut w = World::connected(Connect::new(V5, "late", 60));
    w.broker.manual_stores = true;
    let pid = w.client.publish(publish("t", b"x", QoS::AtLeastOnce)).expect("an id");
    w.run();
    w.server.close(Close::TakenOver);
    w.run();
    assert_eq!(w.close_reason(), None, "the store is still awaited");
    assert!(!w.server.is_open(), "but nothing more is read");
    w.complete_store(0);
    let tail: Vec<_> = w.client.received.iter().rev().take(2).rev().cloned().collect();
    match tail.as_slice() {
        [Packet::PubAck(a), Packet::Disconnect(d)] => {
            assert_eq!(a.packet_id, pid);
            assert_eq!(d.reason_code, ReasonCode::SessionTakenOver);
        }
        other => panic!("expected PUBACK then DISCONNECT, got {other:?}"),
    }
    assert_eq!(w.close_reason(), Some(&Close::TakenOver));
}

#[test]
fn refusals_wait_their_turn_behind_earlier_stores() {
    let mut w = World::connected(Connect::new(V5, "p", 60));
    w.broker.manual_stores = true;
    w.broker.deny_prefix = Some("secret");
    let stored = w.client.publish(publish("open/a", b"x", QoS::AtLeastOnce)).expect("an id");
    let denied = w.client.publish(publish("secret/a", b"x", QoS::AtLeastOnce)).expect("an id");
    w.run();
    assert!(acks(&w).is_empty(), "the refusal may not overtake the store before it (MQTT 4.6)");
    w.complete_store(0);
    assert_eq!(acks(&w), [(stored, ReasonCode::Success), (denied, ReasonCode::NotAuthorized)]);
}

#[test]
fn resent_qos2_publishes_take_no_new_place_under_the_receive_maximum() {
    // Receive Maximum 4, and four QoS 2 messages stored whose PUBRECs are lost: after a
    // reconnect the client resends all four, which is no violation.
    let mut w = World::connected(persistent(V5, "full"));
    for _ in 0..4 {
        w.lose(|p| matches!(p, Packet::PubRec(_)));
        w.client.publish(publish("t/full", b"x", QoS::ExactlyOnce));
    }
    w.run();
    assert_eq!(w.broker.sessions["full"].awaiting_release.len(), 4);
    w.reconnect(persistent(V5, "full")).expect("a CONNACK");
    w.client.resend_unacked();
    w.run();
    assert_eq!(w.close_reason(), None);
    assert_eq!(acks(&w).len(), 4);
    assert!(w.client.outbound.is_empty(), "all four completed");
    assert_eq!(w.broker.log.len(), 4, "each stored once");
}

#[test]
fn a_qos2_publish_resent_before_its_pubrec_is_stored_once() {
    // A 3.1.1 client may retry on the same connection while the store is still pending.
    for version in [V5, V311] {
        let mut w = World::connected(Connect::new(version, "retry", 60));
        w.broker.manual_stores = true;
        let pid = w.client.publish(publish("t/retry", b"x", QoS::ExactlyOnce)).expect("an id");
        w.run();
        w.client.resend_unacked();
        w.run();
        assert_eq!(w.broker.pending.len(), 1, "{version}: handed to the broker once");
        w.complete_store(0);
        assert_eq!(acks(&w), [(pid, ReasonCode::Success), (pid, ReasonCode::Success)], "{version}: one PUBREC each");
        assert_eq!(w.broker.log.len(), 1);
        assert!(w.client.outbound.is_empty(), "{version}: completed");
    }
    // Should the store fail, the resend hears the same.
    let mut w = World::connected(Connect::new(V5, "retry", 60));
    w.broker.manual_stores = true;
    let pid = w.client.publish(publish("t/retry", b"x", QoS::ExactlyOnce)).expect("an id");
    w.run();
    w.client.resend_unacked();
    w.run();
    w.fail_store(0);
    assert_eq!(acks(&w), [(pid, ReasonCode::UnspecifiedError), (pid, ReasonCode::UnspecifiedError)]);
    assert!(w.broker.sessions["retry"].awaiting_release.is_empty());
}
