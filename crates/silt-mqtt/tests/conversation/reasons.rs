//! Reason Strings (MQTT 5.0 §3.1.2.11.7): what went wrong, in words, on CONNACK and
//! DISCONNECT always, on acknowledgements unless the client turned Request Problem
//! Information off, and never past the client's Maximum Packet Size.

use silt_mqtt::server::Refusal;
use silt_mqtt::{Connect, ConnectProperties, Packet, QoS, ReasonCode};

use crate::harness::{V5, V311, World, publish};

/// The Reason Strings of the PUBACKs and DISCONNECTs the client received, in order.
fn reason_strings(w: &World) -> Vec<(&'static str, Option<String>)> {
    w.client
        .received
        .iter()
        .filter_map(|p| match p {
            Packet::PubAck(r) => Some(("PUBACK", r.properties.reason_string.clone())),
            Packet::Disconnect(d) => Some(("DISCONNECT", d.properties.reason_string.clone())),
            _ => None,
        })
        .collect()
}

fn connect_with(props: ConnectProperties) -> Connect {
    let mut c = Connect::new(V5, "why", 60);
    c.properties = props;
    c
}

#[test]
fn refusals_say_why() {
    let mut w = World::connected(connect_with(ConnectProperties::default()));
    w.broker.deny_prefix = Some("secret");
    w.client.publish(publish("secret/a", b"x", QoS::AtLeastOnce));
    w.run();
    w.send_wildcard_topic();
    assert_eq!(
        reason_strings(&w),
        [
            ("PUBACK", Some("not authorized to publish to this topic".to_owned())),
            ("DISCONNECT", Some("protocol error: topic name contains a wildcard".to_owned())),
        ]
    );

    let mut w = World::new(V5);
    w.broker.refuse_credentials = Some(Refusal::BadCredentials);
    let ack = w.connect(Connect::new(V5, "c", 30)).expect("a CONNACK");
    assert_eq!(ack.properties.reason_string.as_deref(), Some("bad user name or password"));
}

#[test]
fn acknowledgements_go_without_reason_strings_when_the_client_asks_for_no_problem_information() {
    let props = ConnectProperties { request_problem_information: Some(false), ..ConnectProperties::default() };
    let mut w = World::connected(connect_with(props));
    w.broker.deny_prefix = Some("secret");
    w.client.publish(publish("secret/a", b"x", QoS::AtLeastOnce));
    w.run();
    w.send_wildcard_topic();
    let strings = reason_strings(&w);
    assert_eq!(strings[0], ("PUBACK", None));
    assert_eq!(strings[1].0, "DISCONNECT");
    assert!(strings[1].1.is_some(), "a DISCONNECT may always say why (MQTT-3.1.2-29)");
}

#[test]
fn a_reason_string_is_left_out_where_it_would_exceed_the_clients_maximum_packet_size() {
    let props = ConnectProperties { maximum_packet_size: Some(24), ..ConnectProperties::default() };
    let mut w = World::connected(connect_with(props));
    w.broker.deny_prefix = Some("secret");
    w.client.publish(publish("secret/a", b"x", QoS::AtLeastOnce));
    w.run();
    match w.client.received.iter().find(|p| matches!(p, Packet::PubAck(_))) {
        Some(Packet::PubAck(r)) => {
            assert_eq!(r.reason_code, ReasonCode::NotAuthorized, "the code still goes");
            assert_eq!(r.properties.reason_string, None);
        }
        other => panic!("expected a PUBACK, got {other:?}"),
    }
}

#[test]
fn mqtt_3_1_1_packets_carry_no_reason_strings() {
    let mut w = World::new(V311);
    w.broker.refuse_credentials = Some(Refusal::BadCredentials);
    let ack = w.connect(Connect::new(V311, "c", 30)).expect("a CONNACK");
    assert_eq!((ack.reason_code, ack.properties.reason_string), (ReasonCode::BadUserNameOrPassword, None));
}
