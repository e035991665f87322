//! Byte vectors captured from real clients and brokers (mosquitto 2.x `mosquitto_pub` /
//! `mosquitto_sub` against a recording TCP listener or proxy) and from the MQTT specs.
//! Each stream is decoded packet by packet, checked field by field, and re-encoded.

use bytes::{Bytes, BytesMut};
use silt_mqtt::{
    ConnAck, DecodeError, Packet, ProtocolVersion, QoS, ReasonCode, RetainHandling, decode, decode_connect,
};

const MAX: u32 = 1 << 20;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit")).collect()
}

/// Decodes a client-to-server stream: CONNECT first, then the rest in its version.
fn client_stream(bytes: &[u8]) -> (ProtocolVersion, Vec<Packet>) {
    let mut buf = BytesMut::from(bytes);
    let connect = decode_connect(&mut buf, MAX).expect("valid CONNECT").expect("complete CONNECT");
    let version = connect.protocol_version;
    let mut packets = vec![Packet::from(connect)];
    packets.extend(server_stream(&mut buf, version));
    (version, packets)
}

fn server_stream(buf: &mut BytesMut, version: ProtocolVersion) -> Vec<Packet> {
    let mut packets = Vec::new();
    while let Some(p) = decode(buf, version, MAX).expect("valid packet") {
        packets.push(p);
    }
    assert!(buf.is_empty(), "stream ends on a packet boundary");
    packets
}

fn encode_all(packets: &[Packet], version: ProtocolVersion) -> Vec<u8> {
    let mut buf = BytesMut::new();
    for p in packets {
        p.encode(version, &mut buf).expect("encodable");
    }
    buf.to_vec()
}

#[test]
fn mosquitto_pub_v5_connect_with_will_and_credentials_then_qos1_publish() {
    // mosquitto_pub -V mqttv5 -i silt-test -t a/b -m hello -q 1 -u user -P pass
    //   --will-topic will/t --will-payload bye --will-qos 1 -D connect session-expiry-interval 60
    //   -D publish user-property k v -D publish content-type text/plain
    let bytes = hex(concat!(
        "103800044d51545405ce003c08110000003c210014000973696c742d7465737400000677696c6c2f74000362796500",
        "047573657200047061737332210003612f620001142600016b00017603000a746578742f706c61696e68656c6c6fe000"
    ));
    let (version, packets) = client_stream(&bytes);
    assert_eq!(version, ProtocolVersion::V5);
    let [Packet::Connect(c), Packet::Publish(p), Packet::Disconnect(d)] = &packets[..] else {
        panic!("unexpected packets {packets:?}");
    };
    assert_eq!(c.client_id, "silt-test");
    assert!(c.clean_start);
    assert_eq!(c.keep_alive, 60);
    assert_eq!(c.username.as_deref(), Some("user"));
    assert_eq!(c.password.as_deref(), Some(&b"pass"[..]));
    assert_eq!(c.properties.session_expiry_interval, Some(60));
    assert_eq!(c.properties.receive_maximum, Some(20));
    let will = c.will.as_ref().expect("will");
    assert_eq!(
        (will.topic.as_str(), &will.payload[..], will.qos, will.retain),
        ("will/t", &b"bye"[..], QoS::AtLeastOnce, false)
    );

    assert_eq!(p.topic, "a/b");
    assert_eq!(p.qos, QoS::AtLeastOnce);
    assert_eq!(p.packet_id.map(|id| id.get()), Some(1));
    assert_eq!(p.payload, Bytes::from_static(b"hello"));
    assert_eq!(p.properties.user_properties, [("k".to_owned(), "v".to_owned())]);
    assert_eq!(p.properties.content_type.as_deref(), Some("text/plain"));
    assert_eq!(d.reason_code, ReasonCode::NORMAL_DISCONNECTION);

    assert_eq!(encode_all(&packets, version), bytes, "re-encoding reproduces mosquitto's bytes");
}

#[test]
fn mosquitto_pub_v311_qos2_retained_publish_and_pubrel() {
    // mosquitto_pub -V mqttv311 -i silt-test -t a/b -m hello -q 2 -r
    let bytes = hex("101500044d5154540402003c000973696c742d74657374350c0003612f62000168656c6c6f62020001e000");
    let (version, packets) = client_stream(&bytes);
    assert_eq!(version, ProtocolVersion::V3_1_1);
    let [Packet::Connect(_), Packet::Publish(p), Packet::PubRel(rel), Packet::Disconnect(_)] = &packets[..] else {
        panic!("unexpected packets {packets:?}");
    };
    assert!(p.retain);
    assert_eq!(p.qos, QoS::ExactlyOnce);
    assert_eq!(rel.packet_id.get(), 1);
    assert_eq!(encode_all(&packets, version), bytes);
}

#[test]
fn mosquitto_pub_v31_uses_mqisdp_level_3() {
    // mosquitto_pub -V mqttv31 -i silt-test -t a/b -m hello -q 0 -k 30
    let bytes = hex("101700064d51497364700302001e000973696c742d74657374300a0003612f6268656c6c6fe000");
    let (version, packets) = client_stream(&bytes);
    assert_eq!(version, ProtocolVersion::V3_1);
    let [Packet::Connect(c), Packet::Publish(p), Packet::Disconnect(_)] = &packets[..] else {
        panic!("unexpected packets {packets:?}");
    };
    assert_eq!(c.keep_alive, 30);
    assert_eq!((p.topic.as_str(), &p.payload[..], p.packet_id), ("a/b", &b"hello"[..], None));
    assert_eq!(encode_all(&packets, version), bytes);
}

#[test]
fn mosquitto_sub_v5_session_in_both_directions() {
    // mosquitto_sub -V mqttv5 -t 'x/+/z' -q 2 -D subscribe user-property a b
    //   -D connect receive-maximum 20 -D connect maximum-packet-size 1000
    //   -D connect topic-alias-maximum 5, through a proxy to mosquitto 2.x.
    let c2s = hex(concat!(
        "101e00044d5154540502003c0b21001427000003e82200050006737562626572",
        "8212000107260001610001620005782f2b2f7a025002000170020001e000"
    ));
    let (version, packets) = client_stream(&c2s);
    let [Packet::Connect(c), Packet::Subscribe(s), Packet::PubRec(_), Packet::PubComp(_), Packet::Disconnect(_)] =
        &packets[..]
    else {
        panic!("unexpected packets {packets:?}");
    };
    assert_eq!(c.properties.maximum_packet_size, Some(1000));
    assert_eq!(c.properties.topic_alias_maximum, Some(5));
    assert_eq!(s.subscriptions[0].filter, "x/+/z");
    assert_eq!(s.subscriptions[0].options.qos, QoS::ExactlyOnce);
    assert_eq!(s.subscriptions[0].options.retain_handling, RetainHandling::SendAtSubscribe);
    assert_eq!(s.properties.user_properties, [("a".to_owned(), "b".to_owned())]);
    assert_eq!(encode_all(&packets, version), c2s);

    let s2c = hex(concat!(
        "200900000622000a21001490040001000234260005782f792f7a00011508000472657370090004636166650101",
        "02000000647061796c6f616462020001"
    ));
    let mut buf = BytesMut::from(&s2c[..]);
    let packets = server_stream(&mut buf, version);
    let [Packet::ConnAck(ack), Packet::SubAck(sub), Packet::Publish(p), Packet::PubRel(_)] = &packets[..] else {
        panic!("unexpected packets {packets:?}");
    };
    assert_eq!(ack.properties.topic_alias_maximum, Some(10));
    assert_eq!(ack.properties.receive_maximum, Some(20));
    assert_eq!(sub.reason_codes, [ReasonCode::GrantedQoS2]);
    assert_eq!(p.properties.message_expiry_interval, Some(100));
    assert_eq!(p.properties.response_topic.as_deref(), Some("resp"));
    assert_eq!(p.properties.correlation_data.as_deref(), Some(&b"cafe"[..]));
    assert_eq!(p.properties.payload_format_indicator, Some(true));
    assert_eq!(p.payload, Bytes::from_static(b"payload"));
    // mosquitto orders properties differently from the spec tables, so compare decoded values.
    let reencoded = encode_all(&packets, version);
    assert_eq!(reencoded.len(), s2c.len());
    assert_eq!(server_stream(&mut BytesMut::from(&reencoded[..]), version), packets);
}

#[test]
fn mosquitto_sub_v311_subscribe_unsubscribe_and_acks() {
    // mosquitto_sub -V mqttv311 -t 'x/#' -t y -q 1 -U 'x/#'
    let c2s = hex("101300044d5154540402003c000773756262657232820c00010003782f230100017901a20700020003782f23e000");
    let (version, packets) = client_stream(&c2s);
    let [Packet::Connect(_), Packet::Subscribe(s), Packet::Unsubscribe(u), Packet::Disconnect(_)] = &packets[..] else {
        panic!("unexpected packets {packets:?}");
    };
    let filters: Vec<_> = s.subscriptions.iter().map(|s| (s.filter.as_str(), s.options.qos)).collect();
    assert_eq!(filters, [("x/#", QoS::AtLeastOnce), ("y", QoS::AtLeastOnce)]);
    assert_eq!(u.filters, ["x/#"]);
    assert_eq!(encode_all(&packets, version), c2s);

    let s2c = hex("20020000900400010101b0020002");
    let packets = server_stream(&mut BytesMut::from(&s2c[..]), version);
    assert_eq!(packets[0], Packet::from(ConnAck::accepted(false)));
    let Packet::SubAck(sub) = &packets[1] else { panic!("SUBACK expected") };
    assert_eq!(sub.reason_codes, [ReasonCode::GrantedQoS1, ReasonCode::GrantedQoS1]);
    assert!(matches!(&packets[2], Packet::UnsubAck(u) if u.packet_id.get() == 2));
    assert_eq!(encode_all(&packets, version), s2c);
}

#[test]
fn spec_v5_connect_variable_header_example() {
    // MQTT 5.0 §3.1.2.12, "Variable Header example": protocol name MQTT, version 5, flags 0xC2,
    // keep alive 10, properties length 5, Session Expiry Interval 10; payload completed with
    // client id "a", user name "u" and password "p".
    let body = hex("00044d51545405c2000a0511000000 0a00016100017500 0170".replace(' ', "").as_str());
    let mut frame = vec![0x10, body.len() as u8];
    frame.extend_from_slice(&body);
    let connect = decode_connect(&mut BytesMut::from(&frame[..]), MAX).expect("valid").expect("complete");
    assert_eq!(connect.keep_alive, 10);
    assert_eq!(connect.properties.session_expiry_interval, Some(10));
    assert_eq!(connect.username.as_deref(), Some("u"));
}

#[test]
fn spec_v5_short_form_acks_and_disconnect() {
    let v5 = ProtocolVersion::V5;
    // PUBACK with remaining length 2, PUBREC with 3, DISCONNECT with 0, AUTH with 0.
    let bytes = hex("400200075003000710e000f000");
    let packets = server_stream(&mut BytesMut::from(&bytes[..]), v5);
    let [Packet::PubAck(ack), Packet::PubRec(rec), Packet::Disconnect(d), Packet::Auth(a)] = &packets[..] else {
        panic!("unexpected packets {packets:?}");
    };
    assert_eq!(ack.reason_code, ReasonCode::Success);
    assert_eq!(rec.reason_code, ReasonCode::NoMatchingSubscribers);
    assert_eq!(d.reason_code, ReasonCode::NORMAL_DISCONNECTION);
    assert_eq!(a.reason_code, ReasonCode::Success);
    assert_eq!(encode_all(&packets, v5), bytes);
}

#[test]
fn malformed_vectors_map_to_their_reason_codes() {
    let v5 = ProtocolVersion::V5;
    let cases: [(&str, ReasonCode); 6] = [
        ("3605000161000161", ReasonCode::MalformedPacket),  // QoS 3 PUBLISH
        ("3205000161000000", ReasonCode::ProtocolError),    // QoS 1, packet id 0
        ("300600032b2f6100", ReasonCode::TopicNameInvalid), // wildcard in topic name
        ("8203000100", ReasonCode::ProtocolError),          // SUBSCRIBE without filters
        ("e00400020101", ReasonCode::MalformedPacket),      // Payload Format Indicator in DISCONNECT
        ("e00200ff", ReasonCode::MalformedPacket),          // truncated property length
    ];
    for (input, expected) in cases {
        let err = decode(&mut BytesMut::from(&hex(input)[..]), v5, MAX).expect_err(input);
        assert_eq!(err.reason_code(), expected, "{input}: {err}");
    }
    let too_big = decode(&mut BytesMut::from(&hex("30ffff03")[..]), v5, 1000).expect_err("too big");
    assert_eq!(too_big, DecodeError::PacketTooLarge { size: 65_535 + 4, max: 1000 });
    assert_eq!(too_big.reason_code(), ReasonCode::PacketTooLarge);
}
