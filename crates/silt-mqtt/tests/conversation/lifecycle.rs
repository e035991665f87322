//! Keep alive in virtual time, the ways a connection ends, and the will.

use std::time::Duration;

use bytes::Bytes;
use silt_mqtt::server::Close;
use silt_mqtt::{
    Connect, ConnectProperties, Disconnect, DisconnectProperties, Packet, QoS, ReasonCode, Will, WillProperties,
};

use crate::harness::{V5, V311, World, persistent, settings};

fn with_will(version: silt_mqtt::ProtocolVersion, keep_alive: u16, delay: u32, session_expiry: u32) -> Connect {
    let mut c = Connect::new(version, "mortal", keep_alive);
    c.will = Some(Will {
        topic: "wills/mortal".into(),
        payload: Bytes::from_static(b"gone"),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: WillProperties { will_delay_interval: Some(delay), ..WillProperties::default() },
    });
    if version.is_v5() {
        c.properties =
            ConnectProperties { session_expiry_interval: Some(session_expiry), ..ConnectProperties::default() };
    }
    c
}

fn last_disconnect(w: &World) -> Option<ReasonCode> {
    w.client.received.iter().rev().find_map(|p| match p {
        Packet::Disconnect(d) => Some(d.reason_code),
        _ => None,
    })
}

fn will_of(w: &World) -> Option<(String, Duration)> {
    w.broker.closed.as_ref().and_then(|(_, will)| will.as_ref()).map(|w| (w.will.topic.clone(), w.delay))
}

#[test]
fn keep_alive_expires_at_one_and_a_half_intervals_and_publishes_the_will() {
    let mut w = World::connected(with_will(V5, 10, 30, 20));
    assert_eq!(w.server.poll_timeout(), Some(w.now + Duration::from_secs(15)));
    w.advance(Duration::from_secs(14));
    w.client.send(Packet::PingReq);
    w.run();
    assert!(matches!(w.client.received.last(), Some(Packet::PingResp)));
    assert_eq!(w.server.poll_timeout(), Some(w.now + Duration::from_secs(15)), "any packet counts");
    w.advance(Duration::from_millis(14_999));
    assert_eq!(w.close_reason(), None);
    w.advance(Duration::from_millis(1));
    assert_eq!(w.close_reason(), Some(&Close::KeepAliveTimeout));
    assert_eq!(last_disconnect(&w), Some(ReasonCode::KeepAliveTimeout));
    assert_eq!(
        will_of(&w),
        Some(("wills/mortal".into(), Duration::from_secs(20))),
        "the will waits its delay, but no longer than the session lives"
    );
}

#[test]
fn a_partial_packet_counts_as_activity() {
    let mut w = World::connected(Connect::new(V311, "slow", 10));
    w.advance(Duration::from_secs(14));
    w.client.send_bytes(&[0x30, 0x10]); // the start of a PUBLISH
    w.run();
    w.advance(Duration::from_secs(14));
    assert_eq!(w.close_reason(), None);
    w.advance(Duration::from_secs(1));
    assert_eq!(w.close_reason(), Some(&Close::KeepAliveTimeout));
    assert_eq!(last_disconnect(&w), None, "3.1.1 has no DISCONNECT from the server");
}

#[test]
fn server_keep_alive_lowers_a_longer_v5_keep_alive_only() {
    let mut s = settings();
    s.server_keep_alive = 5;
    let mut w = World::with_settings(V5, s);
    let ack = w.connect(Connect::new(V5, "ka", 60)).expect("a CONNACK");
    assert_eq!(ack.properties.server_keep_alive, Some(5));
    assert_eq!(w.server.poll_timeout(), Some(w.now + Duration::from_millis(7_500)));

    let mut w = World::with_settings(V5, s);
    let ack = w.connect(Connect::new(V5, "none", 0)).expect("a CONNACK");
    assert_eq!(ack.properties.server_keep_alive, Some(5), "no keep alive is longer than any");

    let mut w = World::with_settings(V5, s);
    let ack = w.connect(Connect::new(V5, "short", 2)).expect("a CONNACK");
    assert_eq!(ack.properties.server_keep_alive, None, "a shorter keep alive is the client's own");
    assert_eq!(w.server.poll_timeout(), Some(w.now + Duration::from_secs(3)));

    let mut w = World::with_settings(V311, s);
    w.connect(Connect::new(V311, "ka", 60)).expect("a CONNACK");
    assert_eq!(w.server.poll_timeout(), Some(w.now + Duration::from_secs(90)));

    let w = World::connected(Connect::new(V5, "forever", 0));
    assert_eq!(w.server.poll_timeout(), None, "keep alive 0: never");
}

#[test]
fn a_normal_disconnect_discards_the_will_and_0x04_publishes_it() {
    let mut w = World::connected(with_will(V5, 60, 0, 0));
    w.client.send(Packet::Disconnect(Disconnect::new(ReasonCode::NORMAL_DISCONNECTION)));
    w.run();
    assert_eq!(w.close_reason(), Some(&Close::Client { with_will: false }));
    assert_eq!(will_of(&w), None);
    assert_eq!(last_disconnect(&w), None, "the server does not answer a DISCONNECT");

    let mut w = World::connected(with_will(V5, 60, 0, 0));
    w.client.send(Packet::Disconnect(Disconnect::new(ReasonCode::DisconnectWithWillMessage)));
    w.run();
    assert_eq!(will_of(&w), Some(("wills/mortal".into(), Duration::ZERO)));
}

#[test]
fn shutdown_sends_0x8b_without_the_will_and_a_takeover_0x8e_with_it() {
    let mut w = World::connected(with_will(V5, 60, 0, 0));
    w.server.close(Close::Shutdown);
    w.run();
    assert_eq!(last_disconnect(&w), Some(ReasonCode::ServerShuttingDown));
    assert_eq!(will_of(&w), None);

    let mut w = World::connected(with_will(V5, 60, 0, 0));
    w.server.close(Close::TakenOver);
    w.run();
    assert_eq!(last_disconnect(&w), Some(ReasonCode::SessionTakenOver));
    assert!(will_of(&w).is_some());

    let mut w = World::connected(with_will(V311, 60, 0, 0));
    w.server.close(Close::Lost);
    w.run();
    assert!(will_of(&w).is_some(), "a lost connection publishes the will");
}

#[test]
fn disconnect_may_change_the_session_expiry_but_not_extend_a_session_that_ends_with_the_connection() {
    let mut w = World::connected(persistent(V5, "s"));
    let mut d = Disconnect::new(ReasonCode::NORMAL_DISCONNECTION);
    d.properties = DisconnectProperties { session_expiry_interval: Some(60), ..DisconnectProperties::default() };
    w.client.send(Packet::Disconnect(d.clone()));
    w.run();
    assert_eq!(w.broker.sessions["s"].expiry, 60);

    let mut w = World::connected(Connect::new(V5, "s", 60)); // expiry 0
    w.client.send(Packet::Disconnect(d));
    w.run();
    assert!(matches!(w.close_reason(), Some(Close::Error(ReasonCode::ProtocolError, _))));
    assert_eq!(last_disconnect(&w), Some(ReasonCode::ProtocolError));
    assert!(!w.broker.sessions.contains_key("s"), "the session ended with the connection");
}

#[test]
fn violations_are_disconnect_reasons_in_v5_and_a_plain_close_in_v311() {
    for version in [V5, V311] {
        let mut w = World::connected(Connect::new(version, "twice", 60));
        w.client.send(Packet::from(Connect::new(version, "twice", 60)));
        w.run();
        assert!(matches!(w.close_reason(), Some(Close::Error(ReasonCode::ProtocolError, _))), "{version}");
        let want = version.is_v5().then_some(ReasonCode::ProtocolError);
        assert_eq!(last_disconnect(&w), want, "{version}");
    }
    // Malformed: PUBREL with the flags of a PUBACK.
    let mut w = World::connected(Connect::new(V5, "bad", 60));
    w.client.send_bytes(&[0x60, 0x02, 0x00, 0x01]);
    w.run();
    assert!(matches!(w.close_reason(), Some(Close::Malformed(_))));
    assert_eq!(last_disconnect(&w), Some(ReasonCode::MalformedPacket));
    // A packet over our Maximum Packet Size, refused from its header alone.
    let mut s = settings();
    s.max_packet_size = 64;
    let mut w = World::with_settings(V5, s);
    w.connect(Connect::new(V5, "big", 60)).expect("a CONNACK");
    w.client.send_bytes(&[0x30, 0xC8, 0x01]);
    w.run();
    assert_eq!(last_disconnect(&w), Some(ReasonCode::PacketTooLarge));
}

#[test]
fn disconnect_may_set_the_expiry_a_connect_asked_for_even_when_the_server_granted_none() {
    let mut s = settings();
    s.max_session_expiry = 0;
    let mut w = World::with_settings(V5, s);
    let ack = w.connect(persistent(V5, "capped")).expect("a CONNACK");
    assert_eq!(ack.properties.session_expiry_interval, Some(0), "asked for an hour, granted none");
    let mut d = Disconnect::new(ReasonCode::NORMAL_DISCONNECTION);
    d.properties = DisconnectProperties { session_expiry_interval: Some(60), ..DisconnectProperties::default() };
    w.client.send(Packet::Disconnect(d));
    w.run();
    assert_eq!(w.close_reason(), Some(&Close::Client { with_will: false }), "a normal DISCONNECT, not 0x82");
}

/// A driver parks a connection at rest and takes it back when it has work: the protocol goes
/// on as if it had stayed in its working form (aliases both ways, the next packet id, keep
/// alive from the last input, the will).
#[test]
fn a_parked_connection_goes_on_as_it_was() {
    let mut connect = with_will(V5, 10, 0, 60);
    connect.properties.topic_alias_maximum = Some(4);
    let mut w = World::connected(connect);
    let mut aliased = crate::harness::publish("in/topic", b"1", QoS::AtLeastOnce);
    aliased.properties.topic_alias = Some(1);
    w.client.publish(aliased);
    w.run();
    w.deliver(crate::harness::publish("out/topic", b"a", QoS::AtLeastOnce));
    assert!(w.park_and_resume(), "nothing in flight, nothing to write: at rest");

    let mut by_alias = crate::harness::publish("", b"2", QoS::AtLeastOnce);
    by_alias.properties.topic_alias = Some(1);
    w.client.publish(by_alias);
    w.run();
    let stored: Vec<&str> = w.broker.log.iter().map(|p| p.topic.as_str()).collect();
    assert_eq!(stored, ["in/topic", "in/topic"], "the client's alias outlives the rest");
    w.deliver(crate::harness::publish("out/topic", b"b", QoS::AtLeastOnce));
    let sent: Vec<_> = w
        .client
        .received
        .iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some((p.topic.clone(), p.properties.topic_alias, p.packet_id.map(|i| i.get()))),
            _ => None,
        })
        .collect();
    assert_eq!(
        sent,
        [("out/topic".to_string(), Some(1), Some(1)), (String::new(), Some(1), Some(2))],
        "the server's alias is used alone after the rest, and packet ids go on"
    );

    assert_eq!(w.server.poll_timeout(), Some(w.now + Duration::from_secs(15)));
    assert!(w.park_and_resume());
    w.advance(Duration::from_millis(14_999));
    assert_eq!(w.close_reason(), None);
    w.advance(Duration::from_millis(1));
    assert_eq!(w.close_reason(), Some(&Close::KeepAliveTimeout), "keep alive counts from the last input");
    assert_eq!(will_of(&w), Some(("wills/mortal".into(), Duration::ZERO)), "the will is kept");
}

/// The Topic Alias Maximum we announced holds after a rest as before it: the parked form
/// keeps the client's aliases, and takes our limit from the settings again.
#[test]
fn a_parked_connection_keeps_our_topic_alias_limit() {
    let mut w = World::connected(Connect::new(V5, "alias", 60));
    let max = w.settings.topic_alias_maximum;
    assert!(max > 0, "the harness accepts aliases");
    let mut within = crate::harness::publish("in/last", b"1", QoS::AtMostOnce);
    within.properties.topic_alias = Some(max);
    w.client.publish(within);
    w.run();
    assert!(w.park_and_resume());
    let mut beyond = crate::harness::publish("in/beyond", b"2", QoS::AtMostOnce);
    beyond.properties.topic_alias = Some(max + 1);
    w.client.publish(beyond);
    w.run();
    let stored: Vec<&str> = w.broker.log.iter().map(|p| p.topic.as_str()).collect();
    assert_eq!(stored, ["in/last"], "the alias above the limit is refused, not stored");
    let reasons: Vec<ReasonCode> = w
        .client
        .received
        .iter()
        .filter_map(|p| match p {
            Packet::Disconnect(d) => Some(d.reason_code),
            _ => None,
        })
        .collect();
    assert_eq!(reasons, [ReasonCode::TopicAliasInvalid]);
}

/// A connection with anything in flight is not at rest: parking gives it back whole.
#[test]
fn a_connection_with_work_in_flight_is_not_parked() {
    let mut w = World::connected(persistent(V5, "busy"));
    w.client.auto_ack = false;
    w.deliver(crate::harness::publish("t", b"x", QoS::AtLeastOnce));
    assert!(!w.park_and_resume(), "a delivery awaits its PUBACK");
    let delivered = w.client.messages[0].clone();
    w.client.ack(&delivered);
    w.run();
    assert_eq!(w.broker.settled.len(), 1, "the acknowledgement still settles it");
    assert!(w.park_and_resume());

    w.broker.manual_stores = true;
    w.client.publish(crate::harness::publish("t", b"y", QoS::AtLeastOnce));
    w.run();
    assert!(!w.park_and_resume(), "a store awaits the broker");
    w.complete_store(0);
    assert!(matches!(w.client.received.last(), Some(Packet::PubAck(_))));
    assert!(w.park_and_resume());
}
