//! Drives the server core (`silt_mqtt::server::Connection`) through arbitrary conversations:
//! bytes from a client in arbitrary chunks (whole packets from the seeds, deep topics, garbage),
//! time passing, and a broker that answers the core's requests in any order and any way
//! (refusals, failed stores, out-of-order completions), while pushing messages to the client.
//!
//! Besides "never panic", checks what a peer relies on: every byte the server sends decodes,
//! whole, as packets of the connection's version, and `Closed` comes once with nothing after
//! it. Topics go up to the deepest there is (32,768 levels) against a small
//! `max_topic_levels`, so the depth checks and what lies behind them are exercised.
#![no_main]

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use silt_mqtt::server::{Connection, Event, Refusal, Settings, Stored, Subscribed, Token};
use silt_mqtt::{Packet, ProtocolVersion, Publish, QoS, decode};

#[derive(Arbitrary, Debug)]
enum Op {
    /// Bytes from the client.
    Input(Vec<u8>),
    /// A whole packet from the client, encoded by the codec (more reach deep states).
    Packet {
        kind: u8,
        topic_levels: u16,
        qos: u8,
        id: u16,
    },
    Advance(u16),
    /// Answer the `n`th store still pending.
    Store {
        n: u8,
        how: u8,
    },
    /// Push a message to the client.
    Deliver {
        topic_levels: u16,
        qos: u8,
    },
    Close,
}

#[derive(Arbitrary, Debug)]
struct Conversation {
    /// How the broker answers the handshake and subscriptions.
    policy: u8,
    max_topic_levels: u8,
    ops: Vec<Op>,
}

fn topic(levels: u16) -> String {
    // Up to the longest topic there is: 32,768 one-byte levels.
    let n = usize::from(levels).clamp(1, 32_768);
    vec!["t"; n].join("/")
}

fn qos(b: u8) -> QoS {
    QoS::from_u8(b % 3).unwrap_or_default()
}

fuzz_target!(|c: Conversation| {
    let settings = Settings {
        max_packet_size: 1 << 20,
        receive_maximum: 8,
        max_inflight: 4,
        topic_alias_maximum: 4,
        server_keep_alive: 0,
        max_session_expiry: u32::MAX,
        connect_timeout: Duration::from_secs(10),
        max_connect_size: 64 << 10,
        max_topic_levels: u16::from(c.max_topic_levels).max(1),
    };
    let mut now = Instant::now();
    let mut conn: Connection<u64> = Connection::new(now, settings, 7);
    let mut input = BytesMut::new();
    let mut stores: Vec<Token> = Vec::new();
    let mut closed = false;
    let mut handle = 0u64;
    for op in c.ops {
        match op {
            Op::Input(bytes) => input.extend_from_slice(&bytes),
            Op::Packet { kind, topic_levels, qos: q, id } => {
                let packet = client_packet(kind, topic_levels, q, id);
                let version = conn.version();
                let _ = packet.encode(if kind % 8 == 0 { ProtocolVersion::V5 } else { version }, &mut input);
            }
            Op::Advance(ms) => {
                now += Duration::from_millis(u64::from(ms));
                conn.handle_timeout(now);
            }
            Op::Store { n, how } if !stores.is_empty() => {
                let token = stores.remove(usize::from(n) % stores.len());
                let stored = match how % 3 {
                    0 => Stored::Durable,
                    1 => Stored::NotAuthorized,
                    _ => Stored::Failed,
                };
                conn.handle_stored(token, stored);
            }
            Op::Store { .. } => {}
            Op::Deliver { topic_levels, qos: q } => {
                let mut p = Publish::new(topic(topic_levels % 300), Bytes::from_static(b"m"));
                p.qos = qos(q);
                handle += 1;
                let _ = conn.send(p, handle);
            }
            Op::Close => conn.close(silt_mqtt::server::Close::Lost),
        }
        while conn.handle_input(now, &mut input) {
            drain(&mut conn, c.policy, &mut stores, &mut closed, now);
        }
        drain(&mut conn, c.policy, &mut stores, &mut closed, now);
        check_output(&mut conn);
    }
});

/// A packet a client might send, with topics up to the deepest allowed.
fn client_packet(kind: u8, topic_levels: u16, q: u8, id: u16) -> Packet {
    use silt_mqtt::{
        Connect, PacketId, PubResponse, Subscribe, SubscribeProperties, Subscription, SubscriptionOptions, Unsubscribe,
        UnsubscribeProperties, Will,
    };
    let pid = PacketId::new(id.max(1)).expect("invariant: not zero");
    match kind % 8 {
        0 => {
            let mut c = Connect::new(if q % 2 == 0 { ProtocolVersion::V5 } else { ProtocolVersion::V3_1_1 }, "f", 5);
            if q % 3 == 0 {
                c.will =
                    Some(Will { topic: topic(topic_levels), payload: Bytes::from_static(b"w"), ..Will::default() });
            }
            Packet::from(c)
        }
        1 => {
            let mut p = Publish::new(topic(topic_levels), Bytes::from_static(b"p"));
            p.qos = qos(q);
            if p.qos != QoS::AtMostOnce {
                p.packet_id = Some(pid);
            }
            Packet::Publish(p)
        }
        2 => Packet::Subscribe(Subscribe {
            packet_id: pid,
            subscriptions: vec![Subscription {
                filter: if q % 2 == 0 {
                    format!("{}/#", topic(topic_levels))
                } else {
                    format!("$share/g/{}", topic(topic_levels))
                },
                options: SubscriptionOptions { qos: qos(q), ..SubscriptionOptions::default() },
            }],
            properties: SubscribeProperties::default(),
        }),
        3 => Packet::Unsubscribe(Unsubscribe {
            packet_id: pid,
            filters: vec![topic(topic_levels)],
            properties: UnsubscribeProperties::default(),
        }),
        4 => Packet::PubAck(PubResponse::new(pid)),
        5 => Packet::PubRec(PubResponse::new(pid)),
        6 => Packet::PubRel(PubResponse::new(pid)),
        _ => Packet::PubComp(PubResponse::new(pid)),
    }
}

/// Answers every request the core has, the way `policy` says.
fn drain(conn: &mut Connection<u64>, policy: u8, stores: &mut Vec<Token>, closed: &mut bool, now: Instant) {
    while let Some(event) = conn.poll_event() {
        assert!(!*closed, "an event after Closed: {event:?}");
        match event {
            Event::Authenticate(_) => {
                conn.handle_authenticated(if policy & 1 == 0 { Ok(()) } else { Err(Refusal::BadCredentials) })
            }
            Event::Open(_) => {
                if policy & 2 == 0 {
                    conn.accept(now, policy & 4 != 0, std::iter::empty());
                } else {
                    conn.refuse(Refusal::NotAuthorized);
                }
            }
            Event::Publish { token: Some(t), .. } => stores.push(t),
            Event::Publish { token: None, .. } => {}
            Event::Subscribe(r) => {
                let outcomes: Vec<Subscribed> = r
                    .filters
                    .iter()
                    .map(|_| match policy >> 3 & 3 {
                        0 | 1 => Subscribed::Granted { existed: false },
                        2 => Subscribed::NotAuthorized,
                        _ => Subscribed::Failed,
                    })
                    .collect();
                conn.handle_subscribed(r.token, outcomes);
            }
            Event::Unsubscribe(r) => {
                let n = r.filters.len();
                conn.handle_unsubscribed(r.token, (0..n).map(|i| i % 2 == 0));
            }
            Event::Closed { .. } => *closed = true,
            _ => {}
        }
    }
}

/// Whatever the server sends must decode, packet after packet, in the connection's version.
fn check_output(conn: &mut Connection<u64>) {
    let Some(out) = conn.poll_transmit() else { return };
    let mut buf = BytesMut::from(&out[..]);
    let version = conn.version();
    loop {
        match decode(&mut buf, version, u32::MAX) {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => panic!("the server sent bytes that do not decode as {version:?}: {e}"),
        }
    }
    assert!(buf.is_empty(), "the server sent a partial packet");
}
