//! Protocol details driven packet by packet with the workspace's MQTT codec as the client:
//! QoS 2 exactly-once across kill -9 (an incomplete delivery is resent with its original
//! packet id and DUP, and only once), Receive Maximum (0x93), inbound topic aliases, and reads
//! after an idle connection gave its read buffer back, commits after an idle spell, and a burst
//! of publishes in one write (acknowledged in order, durable across kill -9).

mod common;

use std::time::Duration;

use common::Silt;
use common::raw::{Raw, pid};
use silt_mqtt::{
    ConnectProperties, Packet, PubResponse, Publish, QoS, Subscribe, SubscribeProperties, Subscription,
    SubscriptionOptions,
};

/// A QoS 2 message completed while an earlier one is still in flight is never delivered
/// again: not after a reconnect, not after kill -9. The earlier one is resent as it was.
#[test]
fn a_qos2_message_completed_out_of_order_is_not_redelivered_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let (mut sub, _) = Raw::connect(silt.port, "q2-out-of-order", true);
    sub.subscribe("ooo/+", QoS::ExactlyOnce);
    let (mut publisher, _) = Raw::connect(silt.port, "q2-ooo-pub", true);
    publisher.publish_qos2("ooo/a", 1, b"first");
    publisher.publish_qos2("ooo/a", 2, b"second");
    let (a, b) = (sub.recv_publish(), sub.recv_publish());
    assert_eq!((&a.payload[..], &b.payload[..]), (&b"first"[..], &b"second"[..]));
    // Complete the second only; the first stays unanswered.
    let id_b = b.packet_id.unwrap();
    sub.send(Packet::PubRec(PubResponse::new(id_b)));
    assert!(matches!(sub.recv(), Some(Packet::PubRel(r)) if r.packet_id == id_b));
    sub.send(Packet::PubComp(PubResponse::new(id_b)));
    // A PINGREQ is answered only after the PUBCOMP before it was handled.
    sub.send(Packet::PingReq);
    assert!(matches!(sub.recv(), Some(Packet::PingResp)));

    // A reconnect: the first again, the second not.
    drop(sub);
    let (mut sub, present) = Raw::connect(silt.port, "q2-out-of-order", false);
    assert!(present);
    let again = sub.recv_publish();
    assert_eq!((again.packet_id, again.dup, &again.payload[..]), (a.packet_id, true, &b"first"[..]));
    assert!(sub.quiet_for(500), "the completed message came again after a reconnect");

    // A crash: the same.
    silt.kill();
    drop((sub, publisher));
    let silt = Silt::start(dir.path());
    let (mut sub, present) = Raw::connect(silt.port, "q2-out-of-order", false);
    assert!(present);
    let again = sub.recv_publish();
    assert_eq!((again.packet_id, again.dup, &again.payload[..]), (a.packet_id, true, &b"first"[..]));
    assert!(sub.quiet_for(500), "the completed message came again after kill -9");
    let id_a = again.packet_id.unwrap();
    sub.send(Packet::PubRec(PubResponse::new(id_a)));
    assert!(matches!(sub.recv(), Some(Packet::PubRel(r)) if r.packet_id == id_a));
    sub.send(Packet::PubComp(PubResponse::new(id_a)));
    assert!(sub.quiet_for(300));
    silt.stop();
}

/// MQTT 5 §4.8.2: a QoS 1 message in flight to a shared-subscription member whose connection
/// breaks goes to another member at once, without waiting for more traffic.
#[test]
fn a_shared_groups_qos1_message_goes_to_another_member_when_its_member_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let (mut a, _) = Raw::connect(silt.port, "share-q1-a", true);
    a.subscribe("$share/g/s1/#", QoS::AtLeastOnce);
    let (mut publisher, _) = Raw::connect(silt.port, "share-q1-pub", true);
    let mut p = Publish::new("s1/x", &b"only"[..]);
    p.qos = QoS::AtLeastOnce;
    p.packet_id = Some(pid(1));
    publisher.send(Packet::Publish(p));
    assert!(matches!(publisher.recv(), Some(Packet::PubAck(_))));
    assert_eq!(&a.recv_publish().payload[..], b"only");
    let (mut b, _) = Raw::connect(silt.port, "share-q1-b", true);
    b.subscribe("$share/g/s1/#", QoS::AtLeastOnce);
    drop(a);
    let got = b.recv_publish();
    assert_eq!((&got.payload[..], got.dup), (&b"only"[..], true));
    silt.stop();
}

/// MQTT 5 §4.8.2: a QoS 2 message in flight to a shared-subscription member whose connection
/// breaks is completed with that member when it reconnects (MQTT-4.8.2-4), across kill -9 too,
/// and never sent to another member, not even when the member's session ends (MQTT-4.8.2-5).
#[test]
fn a_shared_groups_qos2_delivery_stays_with_its_member() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let (mut a, _) = Raw::connect(silt.port, "share-q2-a", true);
    a.subscribe("$share/g/sq/#", QoS::ExactlyOnce);
    let (mut publisher, _) = Raw::connect(silt.port, "share-q2-pub", true);
    publisher.publish_qos2("sq/1", 1, b"first");
    let first = a.recv_publish();
    assert_eq!(&first.payload[..], b"first");
    let id = first.packet_id.unwrap();

    // B joins; A's connection breaks with "first" in flight. B gets later messages only.
    let (mut b, _) = Raw::connect(silt.port, "share-q2-b", true);
    b.subscribe("$share/g/sq/#", QoS::ExactlyOnce);
    drop(a);
    assert!(b.quiet_for(700), "the member's QoS 2 message went to another member");
    publisher.publish_qos2("sq/1", 2, b"second");
    assert_eq!(b.complete_qos2(), b"second");

    // Across kill -9: B comes back first and still does not get it; A does, as it was.
    silt.kill();
    drop((b, publisher));
    let silt = Silt::start(dir.path());
    let (mut b, _) = Raw::connect(silt.port, "share-q2-b", false);
    assert!(b.quiet_for(700), "after a restart, the member's QoS 2 message went to another member");
    let (mut a, present) = Raw::connect(silt.port, "share-q2-a", false);
    assert!(present);
    let again = a.recv_publish();
    assert_eq!((again.packet_id, again.dup, &again.payload[..]), (Some(id), true, &b"first"[..]));
    a.send(Packet::PubRec(PubResponse::new(id)));
    assert!(matches!(a.recv(), Some(Packet::PubRel(r)) if r.packet_id == id));
    a.send(Packet::PubComp(PubResponse::new(id)));
    assert!(a.quiet_for(300) && b.quiet_for(300), "completed once, by A alone");

    // A's session ends (clean start) with "third" in flight: it is never given to B.
    drop(b);
    let (mut publisher, _) = Raw::connect(silt.port, "share-q2-pub", true);
    publisher.publish_qos2("sq/2", 3, b"third");
    assert_eq!(&a.recv_publish().payload[..], b"third");
    let (mut b, _) = Raw::connect(silt.port, "share-q2-b", false);
    drop(a);
    let (_a, present) = Raw::connect(silt.port, "share-q2-a", true);
    assert!(!present);
    assert!(b.quiet_for(700), "a QoS 2 message of an ended session went to another member");
    publisher.publish_qos2("sq/2", 4, b"fourth");
    assert_eq!(b.complete_qos2(), b"fourth", "the group goes on");
    silt.stop();
}

#[test]
fn incomplete_qos2_delivery_is_resent_with_its_packet_id_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let (mut sub, _) = Raw::connect(silt.port, "q2-receiver", true);
    sub.send(Packet::Subscribe(Subscribe {
        packet_id: pid(1),
        subscriptions: vec![Subscription {
            filter: "q2/+".into(),
            options: SubscriptionOptions { qos: QoS::ExactlyOnce, ..SubscriptionOptions::default() },
        }],
        properties: SubscribeProperties::default(),
    }));
    assert!(matches!(sub.recv(), Some(Packet::SubAck(_))));

    let (mut publisher, _) = Raw::connect(silt.port, "q2-sender", true);
    let mut publish = |n: u16, payload: &'static [u8]| {
        let mut p = Publish::new("q2/a", payload);
        p.qos = QoS::ExactlyOnce;
        p.packet_id = Some(pid(n));
        publisher.send(Packet::Publish(p));
        assert!(matches!(publisher.recv(), Some(Packet::PubRec(_))));
        publisher.send(Packet::PubRel(PubResponse::new(pid(n))));
        assert!(matches!(publisher.recv(), Some(Packet::PubComp(_))));
    };
    // Two messages completed normally, so the in-flight one does not carry packet id 1 (which
    // a fresh connection would pick by chance).
    for (n, payload) in [(5, &b"warm-up 1"[..]), (6, &b"warm-up 2"[..])] {
        publish(n, payload);
        let p = sub.recv_publish();
        let id = p.packet_id.unwrap();
        sub.send(Packet::PubRec(PubResponse::new(id)));
        assert!(matches!(sub.recv(), Some(Packet::PubRel(_))));
        sub.send(Packet::PubComp(PubResponse::new(id)));
    }
    publish(7, b"exactly once");

    // The receiver gets the PUBLISH and does not answer: the delivery is in flight.
    let first = sub.recv_publish();
    assert_eq!((first.qos, first.dup, &first.payload[..]), (QoS::ExactlyOnce, false, &b"exactly once"[..]));
    let id = first.packet_id.unwrap();
    assert_ne!(id, pid(1));
    silt.kill();
    drop(sub);

    let silt = Silt::start(dir.path());
    let (mut sub, present) = Raw::connect(silt.port, "q2-receiver", false);
    assert!(present);
    let again = sub.recv_publish();
    assert_eq!(again.packet_id, Some(id), "resent with the original packet id");
    assert!(again.dup, "and marked as a duplicate");
    assert_eq!(&again.payload[..], b"exactly once");
    sub.send(Packet::PubRec(PubResponse::new(id)));
    assert!(matches!(sub.recv(), Some(Packet::PubRel(r)) if r.packet_id == id));
    sub.send(Packet::PubComp(PubResponse::new(id)));

    // Completed: it never comes back, not on this connection and not after another kill -9
    // right after the PUBCOMP (well inside the periodic cursor commit).
    sub.s.set_read_timeout(Some(Duration::from_millis(150))).unwrap();
    assert!(sub.recv().is_none(), "nothing more to deliver");
    drop(sub);
    silt.kill();
    let silt = Silt::start(dir.path());
    let (mut sub, present) = Raw::connect(silt.port, "q2-receiver", false);
    assert!(present);
    sub.s.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
    assert!(sub.recv().is_none(), "a completed QoS 2 message is never redelivered");
    silt.stop();
}

#[test]
fn exceeding_receive_maximum_is_disconnect_0x93() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let (mut c, _) = Raw::connect(silt.port, "greedy", true);
    // QoS 2 publishes never released (no PUBREL) stay counted against our Receive Maximum
    // (256 by default); the 257th is one too many.
    for n in 1..=257u16 {
        let mut p = Publish::new("rm/t", &b"x"[..]);
        p.qos = QoS::ExactlyOnce;
        p.packet_id = Some(pid(n));
        c.send(Packet::Publish(p));
        if n < 257 {
            assert!(matches!(c.recv(), Some(Packet::PubRec(r)) if r.packet_id == pid(n)));
        }
    }
    loop {
        match c.recv() {
            Some(Packet::Disconnect(d)) => {
                assert_eq!(d.reason_code, silt_mqtt::ReasonCode::ReceiveMaximumExceeded);
                break;
            }
            Some(_) => {}
            None => panic!("closed without DISCONNECT 0x93"),
        }
    }
    silt.stop();
}

#[test]
fn inbound_topic_alias_is_resolved_and_unknown_alias_refused() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let (mut sub, _) = Raw::connect(silt.port, "alias-sub", true);
    sub.send(Packet::Subscribe(Subscribe {
        packet_id: pid(1),
        subscriptions: vec![Subscription { filter: "alias/#".into(), options: SubscriptionOptions::default() }],
        properties: SubscribeProperties::default(),
    }));
    assert!(matches!(sub.recv(), Some(Packet::SubAck(_))));
    let (mut publisher, _) = Raw::connect(silt.port, "alias-pub", true);
    let mut p = Publish::new("alias/long/topic/name", &b"one"[..]);
    p.properties.topic_alias = Some(3);
    publisher.send(Packet::Publish(p));
    let mut p = Publish::new("", &b"two"[..]); // topic by alias only
    p.properties.topic_alias = Some(3);
    publisher.send(Packet::Publish(p));
    for want in [&b"one"[..], &b"two"[..]] {
        let got = sub.recv_publish();
        assert_eq!((got.topic.as_str(), &got.payload[..]), ("alias/long/topic/name", want));
    }
    let mut p = Publish::new("", &b"three"[..]);
    p.properties.topic_alias = Some(4); // never set
    publisher.send(Packet::Publish(p));
    match publisher.recv() {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code, silt_mqtt::ReasonCode::ProtocolError),
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
    silt.stop();
}

#[test]
fn outbound_topic_aliases_stay_within_the_clients_maximum() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let props = ConnectProperties { topic_alias_maximum: Some(2), ..ConnectProperties::default() };
    let (mut sub, _) = Raw::connect_with(silt.port, "aliased", true, props);
    sub.send(Packet::Subscribe(Subscribe {
        packet_id: pid(1),
        subscriptions: vec![Subscription { filter: "al/#".into(), options: SubscriptionOptions::default() }],
        properties: SubscribeProperties::default(),
    }));
    assert!(matches!(sub.recv(), Some(Packet::SubAck(_))));
    let (mut publisher, _) = Raw::connect(silt.port, "al-pub", true);
    let topics = ["al/a", "al/b", "al/c", "al/a", "al/c"];
    for t in topics {
        publisher.send(Packet::Publish(Publish::new(t, &b"x"[..])));
    }
    let got: Vec<(String, Option<u16>)> =
        (0..topics.len()).map(|_| sub.recv_publish()).map(|p| (p.topic, p.properties.topic_alias)).collect();
    let want = [
        ("al/a", Some(1)), // first use: topic and the alias it defines
        ("al/b", Some(2)),
        ("al/c", None), // the client allows 2 aliases: plain topic
        ("", Some(1)),  // later: the alias alone
        ("al/c", None),
    ];
    let want: Vec<(String, Option<u16>)> = want.iter().map(|(t, a)| (t.to_string(), *a)).collect();
    assert_eq!(got, want);
    silt.stop();
}

/// An idle connection gives its read buffer back (at the cursor commit tick, 500 ms by
/// default); whatever arrives afterwards is read whole: a publish far larger than the buffer
/// was, sent in pieces with pauses longer than the tick between them (so a tick finds part of
/// a packet buffered), and a small one behind it.
#[test]
fn a_connection_idle_past_its_buffer_release_reads_what_comes_next_whole() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let (mut sub, _) = Raw::connect(silt.port, "idle-sub", true);
    assert_eq!(sub.subscribe("idle/+", QoS::AtLeastOnce), silt_mqtt::ReasonCode::GrantedQoS1);
    let (mut publisher, _) = Raw::connect(silt.port, "idle-pub", true);
    std::thread::sleep(Duration::from_millis(1500));

    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let mut p = Publish::new("idle/big", payload.clone());
    p.qos = QoS::AtLeastOnce;
    p.packet_id = Some(pid(1));
    let mut wire = bytes::BytesMut::new();
    Packet::Publish(p).encode(publisher.version, &mut wire).unwrap();
    for piece in wire.chunks(wire.len() / 3 + 1) {
        publisher.s.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(600));
    }
    assert!(matches!(publisher.recv(), Some(Packet::PubAck(a)) if a.packet_id == pid(1)));
    assert_eq!(publisher.publish_qos1("idle/small", 2, b"after", false), Some(silt_mqtt::ReasonCode::Success));

    let big = sub.recv_publish();
    assert_eq!((big.topic.as_str(), big.payload.len()), ("idle/big", payload.len()));
    assert!(big.payload[..] == payload[..], "the large payload arrived altered");
    let small = sub.recv_publish();
    assert_eq!((small.topic.as_str(), &small.payload[..]), ("idle/small", &b"after"[..]));
    silt.stop();
}

/// A connection that sat idle (its commit timer at rest) still commits what it acknowledges
/// next: a QoS 1 message acknowledged after a quiet spell is not delivered again after
/// kill -9, and the message after it is.
#[test]
fn an_acknowledgement_after_an_idle_spell_is_committed_before_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let (mut sub, _) = Raw::connect(silt.port, "idle-commit-sub", false);
    assert_eq!(sub.subscribe("idle-commit/+", QoS::AtLeastOnce), silt_mqtt::ReasonCode::GrantedQoS1);
    let (mut publisher, _) = Raw::connect(silt.port, "idle-commit-pub", true);
    // Longer than two commit intervals (500 ms): the subscriber's timer has gone quiet.
    std::thread::sleep(Duration::from_millis(1600));
    assert_eq!(publisher.publish_qos1("idle-commit/a", 1, b"first", false), Some(silt_mqtt::ReasonCode::Success));
    let first = sub.recv_publish();
    assert_eq!(&first.payload[..], b"first");
    sub.send(Packet::PubAck(PubResponse::new(first.packet_id.unwrap())));
    // The acknowledgement is committed within an interval; wait two, then crash.
    std::thread::sleep(Duration::from_millis(1200));
    silt.kill();
    drop((sub, publisher));

    let silt = Silt::start(dir.path());
    let (mut sub, present) = Raw::connect(silt.port, "idle-commit-sub", false);
    assert!(present);
    assert!(sub.quiet_for(800), "the acknowledged message came again after kill -9");
    let (mut publisher, _) = Raw::connect(silt.port, "idle-commit-pub", true);
    assert_eq!(publisher.publish_qos1("idle-commit/a", 2, b"second", false), Some(silt_mqtt::ReasonCode::Success));
    assert_eq!(&sub.recv_publish().payload[..], b"second");
    silt.stop();
}

/// A client's burst (one write holding more publishes than the broker hands the log in one
/// batch, QoS 0 and QoS 1 mixed, a retained one among them, a SUBSCRIBE in the middle) goes to
/// the log in a few batches, not one per publish; every QoS 1 publish is acknowledged once and
/// in order, and after the last acknowledgement all of it survives kill -9 in the order it was
/// sent, with the retained message kept.
#[test]
fn a_burst_of_publishes_in_one_write_is_acknowledged_in_order_and_survives_kill_9() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let (mut sub, _) = Raw::connect(silt.port, "burst-sub", false);
    assert_eq!(sub.subscribe("burst/+", QoS::AtLeastOnce), silt_mqtt::ReasonCode::GrantedQoS1);
    drop(sub); // offline: its queue keeps everything

    let (mut publisher, _) = Raw::connect(silt.port, "burst-pub", true);
    let appends_before = silt.metric("silt_log_append_latency_seconds_count");
    let mut wire = bytes::BytesMut::new();
    let mut sent = Vec::new();
    // 400 QoS 0, a SUBSCRIBE, then 250 QoS 1 (under the broker's Receive Maximum of 256),
    // the 100th of them retained: 650 publishes, more than one batch's worth.
    for i in 0..650u32 {
        if i == 400 {
            Packet::Subscribe(Subscribe {
                packet_id: pid(999),
                subscriptions: vec![Subscription {
                    filter: "burst-echo/#".into(),
                    options: SubscriptionOptions { qos: QoS::AtMostOnce, ..SubscriptionOptions::default() },
                }],
                properties: SubscribeProperties::default(),
            })
            .encode(publisher.version, &mut wire)
            .unwrap();
        }
        let payload = format!("m{i}").into_bytes();
        let mut p = Publish::new(format!("burst/{}", i % 3), payload.clone());
        if i >= 400 {
            p.qos = QoS::AtLeastOnce;
            p.packet_id = Some(pid((i - 399) as u16));
            p.retain = i == 499;
        }
        Packet::Publish(p).encode(publisher.version, &mut wire).unwrap();
        sent.push(payload);
    }
    publisher.s.write_all(&wire).unwrap();
    let mut acks = Vec::new();
    let mut subacks = 0;
    while acks.len() < 250 {
        match publisher.recv() {
            Some(Packet::PubAck(a)) => {
                assert_eq!(a.reason_code, silt_mqtt::ReasonCode::Success);
                acks.push(a.packet_id.get());
            }
            Some(Packet::SubAck(a)) if a.packet_id == pid(999) => subacks += 1,
            other => panic!("expected a PUBACK or the SUBACK, got {other:?} after {} PUBACKs", acks.len()),
        }
    }
    assert_eq!(acks, (1..=250).collect::<Vec<u16>>(), "PUBACKs out of order or repeated");
    assert!(subacks == 1 || matches!(publisher.recv(), Some(Packet::SubAck(a)) if a.packet_id == pid(999)));
    // Publishes read together went to the log together: a handful of appends (one per read
    // of the socket, and the session's snapshot after the SUBSCRIBE), not one per publish.
    let appends = silt.metric("silt_log_append_latency_seconds_count") - appends_before;
    assert!(appends < 100.0, "{appends} appends for 650 publishes sent in one write");

    silt.kill();
    drop(publisher);
    let silt = Silt::start(dir.path());
    let (mut sub, present) = Raw::connect(silt.port, "burst-sub", false);
    assert!(present);
    for (i, want) in sent.iter().enumerate() {
        let p = sub.recv_publish();
        assert_eq!((p.topic.as_str(), &p.payload[..]), (format!("burst/{}", i % 3).as_str(), &want[..]), "message {i}");
        if let Some(id) = p.packet_id {
            sub.send(Packet::PubAck(PubResponse::new(id)));
        }
    }
    assert!(sub.quiet_for(300), "more than was sent");
    let (mut late, _) = Raw::connect(silt.port, "burst-late", true);
    late.subscribe("burst/1", QoS::AtMostOnce);
    let retained = late.recv_publish();
    assert_eq!((&retained.payload[..], retained.retain), (&b"m499"[..], true));
    silt.stop();
}

/// Resting MQTT connections now, from `/metrics`.
fn resting(silt: &Silt) -> f64 {
    silt.metric("silt_connections_resting{protocol=\"mqtt\"}")
}

fn wait_resting(silt: &Silt, n: f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while resting(silt) != n {
        assert!(std::time::Instant::now() < deadline, "{n} connections never rested together (now {})", resting(silt));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An idle connection rests in a small form (after a quiet commit interval) and wakes for
/// everything it waits on, as if it had stayed awake: a message to deliver, the client's next
/// packet (its topic alias still known), a takeover, keep alive running out (the will
/// published), the server shutting down.
#[test]
fn resting_connections_wake_for_everything_they_wait_on() {
    use silt_mqtt::{Connect, ProtocolVersion, ReasonCode, Will};
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("silt.toml");
    std::fs::write(&cfg, "[mqtt]\ncursor_commit_ms = 50\n").unwrap();
    let silt = Silt::start_with(&dir.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    let (mut sub, _) = Raw::connect(silt.port, "rest-sub", false);
    assert_eq!(sub.subscribe("rest/#", QoS::AtLeastOnce), ReasonCode::GrantedQoS1);
    let (mut publisher, _) = Raw::connect(silt.port, "rest-pub", true);
    let mut p = Publish::new("rest/aliased", &b"one"[..]);
    (p.qos, p.packet_id, p.properties.topic_alias) = (QoS::AtLeastOnce, Some(pid(1)), Some(7));
    publisher.send(Packet::Publish(p));
    assert!(matches!(publisher.recv(), Some(Packet::PubAck(a)) if a.packet_id == pid(1)));
    let got = sub.recv_publish();
    assert_eq!((got.topic.as_str(), &got.payload[..]), ("rest/aliased", &b"one"[..]));
    sub.send(Packet::PubAck(PubResponse::new(got.packet_id.unwrap())));
    wait_resting(&silt, 2.0);

    // The resting publisher reads its next packet, by alias only; the resting subscriber is
    // woken for it.
    let mut p = Publish::new("", &b"two"[..]);
    (p.qos, p.packet_id, p.properties.topic_alias) = (QoS::AtLeastOnce, Some(pid(2)), Some(7));
    publisher.send(Packet::Publish(p));
    match publisher.recv() {
        Some(Packet::PubAck(a)) => assert_eq!((a.packet_id, a.reason_code), (pid(2), ReasonCode::Success)),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    let got = sub.recv_publish();
    assert_eq!((got.topic.as_str(), &got.payload[..]), ("rest/aliased", &b"two"[..]));
    assert_eq!(got.packet_id, Some(pid(2)), "packet ids go on after a rest");
    sub.send(Packet::PubAck(PubResponse::new(pid(2))));

    // A packet larger than a rest reads on waking (the working loop reads the rest of it).
    wait_resting(&silt, 2.0);
    let big: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
    let mut p = Publish::new("rest/big", big.clone());
    (p.qos, p.packet_id) = (QoS::AtLeastOnce, Some(pid(3)));
    publisher.send(Packet::Publish(p));
    assert!(matches!(publisher.recv(), Some(Packet::PubAck(a)) if a.packet_id == pid(3)));
    let got = sub.recv_publish();
    assert_eq!((got.topic.as_str(), &got.payload[..]), ("rest/big", &big[..]));
    sub.send(Packet::PubAck(PubResponse::new(got.packet_id.unwrap())));

    // Keep alive runs out while the connection rests: closed at 1.5 intervals, will published.
    let mut mortal = Connect::new(ProtocolVersion::V5, "rest-mortal", 1);
    mortal.will =
        Some(Will { topic: "rest/will".into(), payload: bytes::Bytes::from_static(b"gone"), ..Will::default() });
    let (mut mortal, ack) = Raw::handshake(silt.port, mortal);
    assert_eq!(ack.map(|a| a.reason_code), Some(ReasonCode::Success));
    wait_resting(&silt, 3.0);
    let started = std::time::Instant::now();
    let will = sub.recv_publish();
    assert_eq!((will.topic.as_str(), &will.payload[..]), ("rest/will", &b"gone"[..]));
    assert!(started.elapsed() < Duration::from_secs(5), "keep alive did not close the resting connection in time");
    assert_eq!(mortal.disconnect_reason(), Some(ReasonCode::KeepAliveTimeout));

    // A takeover wakes the resting subscriber to close it; its session goes on.
    wait_resting(&silt, 2.0);
    let (mut again, present) = Raw::connect(silt.port, "rest-sub", false);
    assert!(present);
    assert_eq!(sub.disconnect_reason(), Some(ReasonCode::SessionTakenOver));

    // Shutdown reaches resting connections too.
    wait_resting(&silt, 2.0);
    silt.stop();
    assert_eq!(again.disconnect_reason(), Some(ReasonCode::ServerShuttingDown));
    assert_eq!(publisher.disconnect_reason(), Some(ReasonCode::ServerShuttingDown));
}
