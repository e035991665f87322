//! Property tests: every packet round-trips in every version it exists in, arbitrary bytes
//! never panic (and whatever decodes re-encodes to the same packet), and a stream decodes to
//! the same packets however it is split into reads.

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use silt_mqtt::*;

const MAX: u32 = u32::MAX;
const VERSIONS: [ProtocolVersion; 3] = [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1, ProtocolVersion::V5];

fn version() -> impl Strategy<Value = ProtocolVersion> {
    prop::sample::select(&VERSIONS[..])
}

/// Strings without U+0000, including multi-byte characters.
fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9/ _\u{e9}\u{4e2d}\u{1F600}+#$-]{0,12}"
}

/// Topic names: non-empty, no wildcards.
fn topic() -> impl Strategy<Value = String> {
    "[a-z0-9/ _\u{e9}\u{1F600}$-]{1,12}"
}

fn binary() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

fn packet_id() -> impl Strategy<Value = PacketId> {
    (1..=u16::MAX).prop_map(|n| PacketId::new(n).expect("non-zero"))
}

fn qos() -> impl Strategy<Value = QoS> {
    prop_oneof![Just(QoS::AtMostOnce), Just(QoS::AtLeastOnce), Just(QoS::ExactlyOnce)]
}

fn users() -> impl Strategy<Value = Vec<UserProperty>> {
    vec((text(), text()), 0..3)
}

fn sub_id() -> impl Strategy<Value = u32> {
    1..=268_435_455u32
}

/// A strategy that yields `T::default()` before MQTT 5.0, which has no properties.
fn v5_only<T: Default + Clone + std::fmt::Debug + 'static>(
    v: ProtocolVersion,
    s: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<T> {
    if v.is_v5() { s.boxed() } else { Just(T::default()).boxed() }
}

fn reason(packet: PacketType) -> impl Strategy<Value = ReasonCode> {
    let allowed: Vec<ReasonCode> =
        (0..=u8::MAX).filter_map(ReasonCode::from_u8).filter(|c| c.allowed_in(packet)).collect();
    prop::sample::select(allowed)
}

fn ack_properties() -> impl Strategy<Value = AckProperties> {
    (option::of(text()), users())
        .prop_map(|(reason_string, user_properties)| AckProperties { reason_string, user_properties })
}

fn connect_properties() -> impl Strategy<Value = ConnectProperties> {
    (
        option::of(any::<u32>()),
        option::of(1..=u16::MAX),
        option::of(1..=u32::MAX),
        option::of(any::<u16>()),
        option::of(any::<bool>()),
        option::of(any::<bool>()),
        users(),
        option::of((text(), option::of(binary()))),
    )
        .prop_map(|(sei, rm, mps, tam, rri, rpi, user_properties, auth)| ConnectProperties {
            session_expiry_interval: sei,
            receive_maximum: rm,
            maximum_packet_size: mps,
            topic_alias_maximum: tam,
            request_response_information: rri,
            request_problem_information: rpi,
            user_properties,
            authentication_data: auth.as_ref().and_then(|(_, data)| data.clone()),
            authentication_method: auth.map(|(method, _)| method),
        })
}

fn will_properties() -> impl Strategy<Value = WillProperties> {
    (
        option::of(any::<u32>()),
        option::of(any::<bool>()),
        option::of(any::<u32>()),
        option::of(text()),
        option::of(topic()),
        option::of(binary()),
        users(),
    )
        .prop_map(|(wdi, pfi, mei, ct, rt, cd, user_properties)| WillProperties {
            will_delay_interval: wdi,
            payload_format_indicator: pfi,
            message_expiry_interval: mei,
            content_type: ct,
            response_topic: rt,
            correlation_data: cd,
            user_properties,
        })
}

fn connect(v: ProtocolVersion) -> impl Strategy<Value = Connect> {
    let will = (topic(), binary(), qos(), any::<bool>(), v5_only(v, will_properties()))
        .prop_map(|(topic, payload, qos, retain, properties)| Will { topic, payload, qos, retain, properties });
    (any::<bool>(), any::<u16>(), text(), option::of(will), option::of(text()), option::of(binary())).prop_flat_map(
        move |(clean_start, keep_alive, client_id, will, username, password)| {
            // Before 5.0 a password needs a user name.
            let password = if v.is_v5() || username.is_some() { password } else { None };
            v5_only(v, connect_properties()).prop_map(move |properties| Connect {
                protocol_version: v,
                clean_start,
                keep_alive,
                client_id: client_id.clone(),
                will: will.clone(),
                username: username.clone(),
                password: password.clone(),
                properties,
            })
        },
    )
}

fn connack(v: ProtocolVersion) -> impl Strategy<Value = ConnAck> {
    let code = if v.is_v5() {
        reason(PacketType::ConnAck).boxed()
    } else {
        prop::sample::select(vec![
            ReasonCode::Success,
            ReasonCode::UnsupportedProtocolVersion,
            ReasonCode::ClientIdentifierNotValid,
            ReasonCode::ServerUnavailable,
            ReasonCode::BadUserNameOrPassword,
            ReasonCode::NotAuthorized,
        ])
        .boxed()
    };
    let first = (
        option::of(any::<u32>()),
        option::of(1..=u16::MAX),
        option::of(prop_oneof![Just(QoS::AtMostOnce), Just(QoS::AtLeastOnce)]),
        option::of(any::<bool>()),
        option::of(1..=u32::MAX),
        option::of(text()),
        option::of(any::<u16>()),
        option::of(text()),
    );
    let second = (
        users(),
        option::of(any::<bool>()),
        option::of(any::<bool>()),
        option::of(any::<bool>()),
        option::of(any::<u16>()),
        option::of(text()),
        option::of(text()),
        option::of((text(), option::of(binary()))),
    );
    let properties =
        (first, second).prop_map(|((sei, rm, mq, ra, mps, aci, tam, rs), (up, wsa, sia, ssa, ska, ri, sr, auth))| {
            ConnAckProperties {
                session_expiry_interval: sei,
                receive_maximum: rm,
                maximum_qos: mq,
                retain_available: ra,
                maximum_packet_size: mps,
                assigned_client_identifier: aci,
                topic_alias_maximum: tam,
                reason_string: rs,
                user_properties: up,
                wildcard_subscription_available: wsa,
                subscription_identifiers_available: sia,
                shared_subscription_available: ssa,
                server_keep_alive: ska,
                response_information: ri,
                server_reference: sr,
                authentication_data: auth.as_ref().and_then(|(_, d)| d.clone()),
                authentication_method: auth.map(|(m, _)| m),
            }
        });
    let present = if v == ProtocolVersion::V3_1 { Just(false).boxed() } else { any::<bool>().boxed() };
    (present, code, v5_only(v, properties)).prop_map(|(session_present, reason_code, properties)| ConnAck {
        session_present,
        reason_code,
        properties,
    })
}

fn publish(v: ProtocolVersion) -> impl Strategy<Value = Publish> {
    let properties = (
        option::of(any::<bool>()),
        option::of(any::<u32>()),
        option::of(1..=u16::MAX),
        option::of(topic()),
        option::of(binary()),
        users(),
        vec(sub_id(), 0..3),
        option::of(text()),
    )
        .prop_map(|(pfi, mei, ta, rt, cd, user_properties, subscription_identifiers, ct)| PublishProperties {
            payload_format_indicator: pfi,
            message_expiry_interval: mei,
            topic_alias: ta,
            response_topic: rt,
            correlation_data: cd,
            user_properties,
            subscription_identifiers,
            content_type: ct,
        });
    (qos(), any::<bool>(), any::<bool>(), topic(), packet_id(), v5_only(v, properties), binary()).prop_map(
        |(qos, dup, retain, topic, id, properties, payload)| {
            let qos0 = qos == QoS::AtMostOnce;
            // An aliased topic may be sent empty.
            let topic = if properties.topic_alias.is_some() && dup { String::new() } else { topic };
            Publish {
                dup: dup && !qos0,
                qos,
                retain,
                topic,
                packet_id: (!qos0).then_some(id),
                properties: properties.into(),
                payload,
            }
        },
    )
}

fn pub_response(v: ProtocolVersion, packet: PacketType) -> impl Strategy<Value = PubResponse> {
    (packet_id(), v5_only(v, reason(packet)), v5_only(v, ack_properties()))
        .prop_map(|(packet_id, reason_code, properties)| PubResponse { packet_id, reason_code, properties })
}

fn subscribe(v: ProtocolVersion) -> impl Strategy<Value = Subscribe> {
    let options = (qos(), any::<bool>(), any::<bool>(), 0..3u8).prop_map(move |(qos, nl, rap, rh)| {
        let retain_handling = match rh {
            0 => RetainHandling::SendAtSubscribe,
            1 => RetainHandling::SendAtSubscribeIfNew,
            _ => RetainHandling::DoNotSend,
        };
        if v.is_v5() {
            SubscriptionOptions { qos, no_local: nl, retain_as_published: rap, retain_handling }
        } else {
            SubscriptionOptions { qos, ..SubscriptionOptions::default() }
        }
    });
    let subscription = (text(), options).prop_map(|(filter, options)| Subscription { filter, options });
    let properties = (option::of(sub_id()), users()).prop_map(|(subscription_identifier, user_properties)| {
        SubscribeProperties { subscription_identifier, user_properties }
    });
    (packet_id(), vec(subscription, 1..4), v5_only(v, properties))
        .prop_map(|(packet_id, subscriptions, properties)| Subscribe { packet_id, subscriptions, properties })
}

fn suback(v: ProtocolVersion) -> impl Strategy<Value = SubAck> {
    let code = if v.is_v5() {
        reason(PacketType::SubAck).boxed()
    } else {
        prop::sample::select(vec![
            ReasonCode::GRANTED_QOS_0,
            ReasonCode::GrantedQoS1,
            ReasonCode::GrantedQoS2,
            ReasonCode::UnspecifiedError,
        ])
        .boxed()
    };
    (packet_id(), vec(code, 0..4), v5_only(v, ack_properties()))
        .prop_map(|(packet_id, reason_codes, properties)| SubAck { packet_id, reason_codes, properties })
}

fn unsubscribe(v: ProtocolVersion) -> impl Strategy<Value = Unsubscribe> {
    let properties = users().prop_map(|user_properties| UnsubscribeProperties { user_properties });
    (packet_id(), vec(text(), 1..4), v5_only(v, properties)).prop_map(|(packet_id, filters, properties)| Unsubscribe {
        packet_id,
        filters,
        properties,
    })
}

fn unsuback(v: ProtocolVersion) -> impl Strategy<Value = UnsubAck> {
    (packet_id(), v5_only(v, vec(reason(PacketType::UnsubAck), 0..4)), v5_only(v, ack_properties()))
        .prop_map(|(packet_id, reason_codes, properties)| UnsubAck { packet_id, reason_codes, properties })
}

fn disconnect(v: ProtocolVersion) -> impl Strategy<Value = Disconnect> {
    let properties = (option::of(any::<u32>()), option::of(text()), users(), option::of(text())).prop_map(
        |(session_expiry_interval, reason_string, user_properties, server_reference)| DisconnectProperties {
            session_expiry_interval,
            reason_string,
            user_properties,
            server_reference,
        },
    );
    (v5_only(v, reason(PacketType::Disconnect)), v5_only(v, properties))
        .prop_map(|(reason_code, properties)| Disconnect { reason_code, properties })
}

fn auth() -> impl Strategy<Value = Auth> {
    let properties = (option::of((text(), option::of(binary()))), option::of(text()), users()).prop_map(
        |(auth, reason_string, user_properties)| AuthProperties {
            authentication_data: auth.as_ref().and_then(|(_, d)| d.clone()),
            authentication_method: auth.map(|(m, _)| m),
            reason_string,
            user_properties,
        },
    );
    (reason(PacketType::Auth), properties).prop_map(|(reason_code, properties)| Auth { reason_code, properties })
}

/// Any packet that exists in `v`, valid for `v`.
fn packet(v: ProtocolVersion) -> BoxedStrategy<Packet> {
    let common = prop_oneof![
        connect(v).prop_map(Packet::from),
        connack(v).prop_map(Packet::from),
        publish(v).prop_map(Packet::Publish),
        pub_response(v, PacketType::PubAck).prop_map(Packet::PubAck),
        pub_response(v, PacketType::PubRec).prop_map(Packet::PubRec),
        pub_response(v, PacketType::PubRel).prop_map(Packet::PubRel),
        pub_response(v, PacketType::PubComp).prop_map(Packet::PubComp),
        subscribe(v).prop_map(Packet::Subscribe),
        suback(v).prop_map(Packet::SubAck),
        unsubscribe(v).prop_map(Packet::Unsubscribe),
        unsuback(v).prop_map(Packet::UnsubAck),
        Just(Packet::PingReq),
        Just(Packet::PingResp),
        disconnect(v).prop_map(Packet::Disconnect),
    ];
    if v.is_v5() { prop_oneof![common, auth().prop_map(|a| Packet::Auth(Box::new(a)))].boxed() } else { common.boxed() }
}

fn versioned_packet() -> impl Strategy<Value = (ProtocolVersion, Packet)> {
    version().prop_flat_map(|v| packet(v).prop_map(move |p| (v, p)))
}

fn versioned_stream() -> impl Strategy<Value = (ProtocolVersion, Vec<Packet>)> {
    version().prop_flat_map(|v| vec(packet(v), 1..6).prop_map(move |ps| (v, ps)))
}

fn encode(p: &Packet, v: ProtocolVersion) -> BytesMut {
    let mut buf = BytesMut::new();
    p.encode(v, &mut buf).expect("generated packets are encodable");
    buf
}

/// Re-encodes a decoded packet; a CONNECT is encoded in the version it declares, which
/// `decode` does not force to match the connection's.
fn re_encode(p: &Packet, v: ProtocolVersion) -> (ProtocolVersion, BytesMut) {
    let v = match p {
        Packet::Connect(c) => c.protocol_version,
        _ => v,
    };
    (v, encode(p, v))
}

/// Decodes everything `buf` holds; panics on error.
fn drain(buf: &mut BytesMut, v: ProtocolVersion, out: &mut Vec<Packet>) {
    while let Some(p) = decode(buf, v, MAX).expect("valid stream") {
        out.push(p);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_packet_round_trips_in_its_versions((v, p) in versioned_packet()) {
        let bytes = encode(&p, v);
        prop_assert_eq!(p.encoded_len(v), Ok(bytes.len()));
        let mut buf = bytes.clone();
        prop_assert_eq!(decode(&mut buf, v, MAX), Ok(Some(p.clone())));
        prop_assert!(buf.is_empty());
        if let Packet::Connect(c) = &p {
            let mut buf = bytes;
            prop_assert_eq!(decode_connect(&mut buf, MAX), Ok(Some((**c).clone())));
        }
    }

    #[test]
    fn a_limit_of_exactly_the_packet_size_accepts_it_and_one_less_refuses_it((v, p) in versioned_packet()) {
        let bytes = encode(&p, v);
        let size = u32::try_from(bytes.len()).expect("small");
        prop_assert!(decode(&mut bytes.clone(), v, size).is_ok());
        prop_assert_eq!(
            decode(&mut bytes.clone(), v, size - 1),
            Err(DecodeError::PacketTooLarge { size: u64::from(size), max: size - 1 })
        );
    }

    #[test]
    fn stream_split_at_any_byte_decodes_to_the_same_packets((v, packets) in versioned_stream()) {
        let mut stream = BytesMut::new();
        for p in &packets {
            stream.extend_from_slice(&encode(p, v));
        }
        for split in 0..=stream.len() {
            let mut buf = BytesMut::from(&stream[..split]);
            let mut out = Vec::new();
            drain(&mut buf, v, &mut out);
            buf.extend_from_slice(&stream[split..]);
            drain(&mut buf, v, &mut out);
            prop_assert!(buf.is_empty());
            prop_assert_eq!(&out, &packets);
        }
        // And one byte per read.
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for &byte in &stream[..] {
            buf.extend_from_slice(&[byte]);
            drain(&mut buf, v, &mut out);
        }
        prop_assert_eq!(&out, &packets);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_what_decodes_re_encodes(v in version(), bytes in vec(any::<u8>(), 0..64)) {
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(p)) = decode(&mut buf, v, 1 << 16) {
            let (v, mut again) = re_encode(&p, v);
            prop_assert_eq!(decode(&mut again, v, MAX), Ok(Some(p)));
        }
        let mut buf = BytesMut::from(&bytes[..]);
        if let Ok(Some(c)) = decode_connect(&mut buf, 1 << 16) {
            let p = Packet::from(c.clone());
            let mut again = encode(&p, c.protocol_version);
            prop_assert_eq!(decode_connect(&mut again, MAX), Ok(Some(c)));
        }
    }

    #[test]
    fn corrupted_valid_packets_never_panic(
        (v, p) in versioned_packet(),
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = encode(&p, v).to_vec();
        for (index, value) in flips {
            let i = index.index(bytes.len());
            bytes[i] = value;
        }
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(decoded)) = decode(&mut buf, v, MAX) {
            let (v, mut again) = re_encode(&decoded, v);
            prop_assert_eq!(decode(&mut again, v, MAX), Ok(Some(decoded)));
        }
        let _ = decode_connect(&mut BytesMut::from(&bytes[..]), MAX);
    }

    #[test]
    fn v5_packets_encode_for_v311_by_dropping_what_it_cannot_carry(p in publish(ProtocolVersion::V5)) {
        let v4 = ProtocolVersion::V3_1_1;
        let mut buf = encode(&Packet::Publish(p.clone()), v4);
        let Ok(Some(Packet::Publish(back))) = decode(&mut buf, v4, MAX) else {
            // An empty aliased topic is not a valid 3.1.1 topic.
            prop_assert!(p.topic.is_empty());
            return Ok(());
        };
        prop_assert!(back.properties.is_empty());
        prop_assert_eq!((back.topic, back.payload, back.qos), (p.topic, p.payload, p.qos));
    }
}
