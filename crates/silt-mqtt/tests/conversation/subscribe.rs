//! SUBSCRIBE and UNSUBSCRIBE: reason codes per version, retained messages, identifiers.

use bytes::Bytes;
use silt_mqtt::server::Close;
use silt_mqtt::{
    Connect, Packet, ProtocolVersion, QoS, ReasonCode, RetainHandling, Subscribe, SubscribeProperties, Subscription,
    SubscriptionOptions, Unsubscribe, UnsubscribeProperties,
};

use crate::harness::{V5, V311, World, id, persistent, publish};

fn subscription(filter: &str, qos: QoS, retain_handling: RetainHandling) -> Subscription {
    Subscription {
        filter: filter.into(),
        options: SubscriptionOptions { qos, retain_handling, ..SubscriptionOptions::default() },
    }
}

fn subscribe(w: &mut World, n: u16, subscriptions: Vec<Subscription>, sub_id: Option<u32>) -> Vec<ReasonCode> {
    let properties = SubscribeProperties { subscription_identifier: sub_id, ..SubscribeProperties::default() };
    w.client.send(Packet::Subscribe(Subscribe { packet_id: id(n), subscriptions, properties }));
    w.run();
    w.client
        .received
        .iter()
        .rev()
        .find_map(|p| match p {
            Packet::SubAck(a) if a.packet_id == id(n) => Some(a.reason_codes.clone()),
            _ => None,
        })
        .expect("a SUBACK")
}

fn mixed(version: ProtocolVersion) -> Vec<ReasonCode> {
    let mut w = World::connected(Connect::new(version, "s", 60));
    w.broker.deny_prefix = Some("secret");
    let subs = vec![
        subscription("ok/#", QoS::AtLeastOnce, RetainHandling::SendAtSubscribe),
        subscription("bad/#/x", QoS::AtLeastOnce, RetainHandling::SendAtSubscribe),
        subscription("secret/a", QoS::AtLeastOnce, RetainHandling::SendAtSubscribe),
        subscription("$share/g/s/+", QoS::ExactlyOnce, RetainHandling::SendAtSubscribe),
        subscription("$share//x", QoS::AtLeastOnce, RetainHandling::SendAtSubscribe),
    ];
    subscribe(&mut w, 1, subs, None)
}

#[test]
fn subscribe_refusals_carry_their_reason_in_v5_and_0x80_in_v311() {
    use ReasonCode::*;
    assert_eq!(mixed(V5), [GrantedQoS1, TopicFilterInvalid, NotAuthorized, GrantedQoS2, TopicFilterInvalid]);
    assert_eq!(mixed(V311), [GrantedQoS1, UnspecifiedError, UnspecifiedError, GrantedQoS2, UnspecifiedError]);

    let mut w = World::connected(Connect::new(V5, "s", 60));
    w.broker.fail_subscribes = true;
    let codes = subscribe(&mut w, 1, vec![subscription("a", QoS::AtMostOnce, RetainHandling::SendAtSubscribe)], None);
    assert_eq!(codes, [UnspecifiedError]);
}

#[test]
fn retain_handling_decides_which_subscribes_get_retained_messages() {
    let mut w = World::connected(Connect::new(V5, "r", 60));
    let mut kept = publish("r/a", b"kept", QoS::AtLeastOnce);
    kept.payload = Bytes::from_static(b"kept");
    w.broker.retained.push(kept);
    let retained_after = |w: &mut World, n: u16, filter: &str, handling: RetainHandling| {
        let before = w.client.messages.len();
        subscribe(w, n, vec![subscription(filter, QoS::AtLeastOnce, handling)], Some(7));
        w.client.messages[before..].to_vec()
    };
    let got = retained_after(&mut w, 1, "r/#", RetainHandling::SendAtSubscribeIfNew);
    assert_eq!(got.len(), 1, "a new subscription gets the retained message");
    assert!(got[0].retain);
    assert_eq!(got[0].properties.subscription_identifiers, [7]);
    assert!(retained_after(&mut w, 2, "r/#", RetainHandling::SendAtSubscribeIfNew).is_empty(), "not when it existed");
    assert!(retained_after(&mut w, 3, "r/#", RetainHandling::DoNotSend).is_empty());
    assert_eq!(retained_after(&mut w, 4, "r/#", RetainHandling::SendAtSubscribe).len(), 1, "0: on every SUBSCRIBE");
    assert!(
        retained_after(&mut w, 5, "$share/g/r/#", RetainHandling::SendAtSubscribe).is_empty(),
        "never for a shared subscription"
    );
}

#[test]
fn the_suback_comes_before_the_retained_messages() {
    let mut w = World::connected(Connect::new(V311, "r", 60));
    w.broker.retained.push(publish("r/a", b"kept", QoS::AtMostOnce));
    subscribe(&mut w, 1, vec![subscription("r/#", QoS::AtMostOnce, RetainHandling::DoNotSend)], None);
    let kinds: Vec<_> = w.client.received.iter().skip(1).map(Packet::packet_type).collect();
    use silt_mqtt::PacketType;
    assert_eq!(kinds, [PacketType::SubAck, PacketType::Publish], "3.1.1 always gets them (no retain handling)");
}

#[test]
fn subscription_identifier_zero_is_a_protocol_error() {
    // On the wire the codec refuses it; a packet built otherwise meets the same rule.
    let mut w = World::connected(Connect::new(V5, "s", 60));
    w.client.send_bytes(&[0x82, 0x09, 0x00, 0x01, 0x02, 0x0B, 0x00, 0x00, 0x01, b'a', 0x00]);
    w.run();
    assert!(matches!(w.close_reason(), Some(Close::Malformed(_))));
    assert!(
        matches!(w.client.received.last(), Some(Packet::Disconnect(d)) if d.reason_code == ReasonCode::ProtocolError)
    );

    let mut w = World::connected(Connect::new(V5, "s", 60));
    let now = w.now;
    w.server.handle_packet(
        now,
        Packet::Subscribe(Subscribe {
            packet_id: id(1),
            subscriptions: vec![subscription("a", QoS::AtMostOnce, RetainHandling::SendAtSubscribe)],
            properties: SubscribeProperties { subscription_identifier: Some(0), ..SubscribeProperties::default() },
        }),
    );
    w.run();
    assert!(matches!(w.close_reason(), Some(Close::Error(ReasonCode::ProtocolError, _))));
}

#[test]
fn unsubscribe_reports_which_subscriptions_existed() {
    let mut w = World::connected(Connect::new(V5, "u", 60));
    let subs = vec![
        subscription("ok/#", QoS::AtLeastOnce, RetainHandling::SendAtSubscribe),
        subscription("$share/g/s", QoS::AtLeastOnce, RetainHandling::SendAtSubscribe),
    ];
    subscribe(&mut w, 1, subs, None);
    let filters = ["ok/#", "never", "bad/#/x", "$share/g/s"].map(String::from).to_vec();
    w.client.send(Packet::Unsubscribe(Unsubscribe {
        packet_id: id(2),
        filters,
        properties: UnsubscribeProperties::default(),
    }));
    w.run();
    match w.client.received.last() {
        Some(Packet::UnsubAck(a)) => assert_eq!(
            a.reason_codes,
            [
                ReasonCode::Success,
                ReasonCode::NoSubscriptionExisted,
                ReasonCode::TopicFilterInvalid,
                ReasonCode::Success
            ]
        ),
        other => panic!("expected UNSUBACK, got {other:?}"),
    }
    assert!(w.broker.sessions["u"].subscriptions.is_empty());
}

#[test]
fn no_local_on_a_shared_subscription_is_disconnect_0x82() {
    let mut w = World::connected(persistent(V5, "s"));
    let mut shared = subscription("$share/g/t", QoS::AtLeastOnce, RetainHandling::SendAtSubscribe);
    shared.options.no_local = true;
    let plain = subscription("plain", QoS::AtLeastOnce, RetainHandling::SendAtSubscribe);
    w.client.send(Packet::Subscribe(Subscribe {
        packet_id: id(1),
        subscriptions: vec![plain, shared],
        properties: SubscribeProperties::default(),
    }));
    w.run();
    assert!(matches!(w.close_reason(), Some(Close::Error(ReasonCode::ProtocolError, _))));
    assert!(
        matches!(w.client.received.last(), Some(Packet::Disconnect(d)) if d.reason_code == ReasonCode::ProtocolError)
    );
    assert!(w.broker.sessions["s"].subscriptions.is_empty(), "nothing of the packet was applied");
}
