//! MQTT against a running `silt serve` with rumqttc (Rust) and raw sockets: the offline backlog
//! without a cap, kill -9 in the middle of a drain, store-once fan-out, and malformed input.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Silt;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};

fn options(id: &str, port: u16, clean: bool) -> MqttOptions {
    let mut o = MqttOptions::new(id, "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(30));
    o.set_clean_session(clean);
    o.set_inflight(100);
    o.set_request_channel_capacity(1000);
    o.set_max_packet_size(1 << 20, 1 << 20);
    o
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Polls until `pred` accepts an event; panics after `secs` seconds.
async fn until(ev: &mut EventLoop, secs: u64, mut pred: impl FnMut(&Event) -> bool) {
    tokio::time::timeout(Duration::from_secs(secs), async {
        loop {
            let e = ev.poll().await.expect("connection");
            if pred(&e) {
                return;
            }
        }
    })
    .await
    .expect("timed out waiting for an event");
}

async fn subscribe_persistent(port: u16, id: &str, filter: &str) {
    let (c, mut ev) = AsyncClient::new(options(id, port, false), 10);
    c.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
    until(&mut ev, 30, |e| matches!(e, Event::Incoming(Packet::SubAck(_)))).await;
    c.disconnect().await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), async { while ev.poll().await.is_ok() {} }).await;
}

async fn publish_seq(port: u16, topic: &str, n: u64) {
    let (c, mut ev) = AsyncClient::new(options("bulk-publisher", port, true), 1000);
    let topic = topic.to_owned();
    let sender = tokio::spawn(async move {
        for i in 0..n {
            c.publish(topic.clone(), QoS::AtLeastOnce, false, i.to_be_bytes().to_vec()).await.unwrap();
        }
        c
    });
    let mut acked = 0;
    until(&mut ev, 600, |e| {
        if matches!(e, Event::Incoming(Packet::PubAck(_))) {
            acked += 1;
        }
        acked == n
    })
    .await;
    sender.await.unwrap().disconnect().await.unwrap();
}

/// Receives sequence numbers until `stop` says so; returns them in arrival order. Acknowledges
/// exactly the messages it returns (manual acks): rumqttc would otherwise acknowledge whatever
/// it has read from the socket, including messages this function never hands back.
async fn receive_seq(port: u16, id: &str, secs: u64, mut stop: impl FnMut(&[u64]) -> bool) -> Vec<u64> {
    let mut opts = options(id, port, false);
    opts.set_manual_acks(true);
    let (c, mut ev) = AsyncClient::new(opts, 100_000);
    let mut got = Vec::new();
    until(&mut ev, secs, |e| {
        if let Event::Incoming(Packet::Publish(p)) = e {
            got.push(u64::from_be_bytes(p.payload[..8].try_into().unwrap()));
            c.try_ack(p).unwrap();
        }
        stop(&got)
    })
    .await;
    // Let the acknowledgements reach the broker.
    let _ = tokio::time::timeout(Duration::from_millis(300), async { while ev.poll().await.is_ok() {} }).await;
    got
}

#[test]
fn offline_session_receives_100k_qos1_messages_in_order_even_across_kill_9() {
    let n: u64 = std::env::var("SILT_TEST_OFFLINE_N").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let silt = Silt::start(dir.path());
    let port = silt.port;
    rt.block_on(subscribe_persistent(port, "drainer", "bulk/#"));
    // mosquitto, EMQX and HiveMQ keep 1,000 offline messages by default; Silt keeps them all.
    let t = std::time::Instant::now();
    rt.block_on(publish_seq(port, "bulk/t", n));
    eprintln!("published {n} in {:?}", t.elapsed());
    let first = rt.block_on(receive_seq(port, "drainer", 300, |g| g.len() as u64 >= n * 3 / 10));
    eprintln!("received {} before the kill at {:?}", first.len(), t.elapsed());
    assert_eq!(first, (0..first.len() as u64).collect::<Vec<_>>(), "in order, no gap, no duplicate");
    silt.kill(); // mid-drain, without a chance to save anything

    let silt = Silt::start(dir.path());
    let rest = rt.block_on(receive_seq(silt.port, "drainer", 300, |g| g.last() == Some(&(n - 1))));
    let resume = rest[0];
    assert!(
        resume <= first.len() as u64,
        "resumed at {resume}, after {} had been received: messages lost",
        first.len()
    );
    assert_eq!(rest, (resume..n).collect::<Vec<_>>(), "in order, every message, from the committed cursor");
    silt.stop();
}

#[test]
fn one_payload_is_stored_once_for_a_thousand_subscribers() {
    const SUBSCRIBERS: usize = 1000;
    const MESSAGES: usize = 10;
    const PAYLOAD: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let silt = Silt::start(dir.path());
    let port = silt.port;
    rt.block_on(async {
        let mut receivers = Vec::new();
        for i in 0..SUBSCRIBERS {
            let (c, mut ev) = AsyncClient::new(options(&format!("fan-{i}"), port, true), 10);
            c.subscribe("fan/out", QoS::AtLeastOnce).await.unwrap();
            until(&mut ev, 60, |e| matches!(e, Event::Incoming(Packet::SubAck(_)))).await;
            receivers.push(tokio::spawn(async move {
                let mut n = 0;
                until(&mut ev, 120, |e| {
                    if let Event::Incoming(Packet::Publish(p)) = e {
                        assert_eq!(p.payload.len(), PAYLOAD);
                        n += 1;
                    }
                    n == MESSAGES
                })
                .await;
                drop(c);
            }));
        }
        let before = silt.log_end();
        let (c, mut ev) = AsyncClient::new(options("fan-publisher", port, true), 100);
        for _ in 0..MESSAGES {
            c.publish("fan/out", QoS::AtLeastOnce, false, vec![7u8; PAYLOAD]).await.unwrap();
        }
        let mut acked = 0;
        until(&mut ev, 60, |e| {
            acked += usize::from(matches!(e, Event::Incoming(Packet::PubAck(_))));
            acked == MESSAGES
        })
        .await;
        for r in receivers {
            r.await.unwrap();
        }
        let grown = silt.log_end() - before;
        let one_copy = (MESSAGES * PAYLOAD) as u64;
        assert!(
            grown >= one_copy && grown < one_copy * 2,
            "log grew {grown} bytes for {one_copy} bytes of payload delivered {SUBSCRIBERS} times"
        );
    });
    silt.stop();
}

/// Sends a raw MQTT 5.0 CONNECT and returns the socket after the CONNACK.
fn raw_v5_client(port: u16, id: u8) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // CONNECT: "MQTT", level 5, clean start, keep alive 60, no properties, client id "raw<id>".
    s.write_all(&[0x10, 17, 0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 60, 0, 0, 4, b'r', b'a', b'w', id]).unwrap();
    let mut connack = [0u8; 64];
    let n = s.read(&mut connack).unwrap();
    assert!(n >= 4 && connack[0] == 0x20 && connack[3] == 0, "CONNACK success, got {:?}", &connack[..n]);
    s
}

/// Reads until EOF and returns the reason code of the DISCONNECT the broker sent, if any.
fn disconnect_reason(s: &mut TcpStream) -> Option<u8> {
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    (buf.first() == Some(&0xE0) && buf.len() >= 3).then(|| buf[2])
}

#[test]
fn malformed_and_oversized_packets_get_reason_codes_and_others_are_unaffected() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let mut bystander = raw_v5_client(silt.port, b'0');

    let mut s = raw_v5_client(silt.port, b'1');
    s.write_all(&[0x00, 0x00]).unwrap(); // reserved packet type 0
    assert_eq!(disconnect_reason(&mut s), Some(0x81), "malformed packet");

    let mut s = raw_v5_client(silt.port, b'2');
    // A PUBLISH announcing 200 MB: refused from its header, before any body is read.
    s.write_all(&[0x30, 0x80, 0x80, 0x80, 0x64]).unwrap();
    assert_eq!(disconnect_reason(&mut s), Some(0x95), "packet too large");

    let mut s = raw_v5_client(silt.port, b'3');
    // PUBLISH QoS 0 to a topic with a wildcard.
    s.write_all(&[0x30, 6, 0, 3, b'a', b'/', b'+', 0]).unwrap();
    assert_eq!(disconnect_reason(&mut s), Some(0x90), "topic name invalid");

    // MQTT 3.1.1 has no DISCONNECT from the server: the connection is just closed.
    let mut s = TcpStream::connect(("127.0.0.1", silt.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60, 0, 1, b'o']).unwrap();
    let mut connack = [0u8; 4];
    s.read_exact(&mut connack).unwrap();
    assert_eq!(connack, [0x20, 2, 0, 0]);
    s.write_all(&[0xF0, 0x00]).unwrap(); // AUTH does not exist in 3.1.1
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).unwrap(), 0, "closed without a reply");

    // The first client still works: PINGREQ → PINGRESP.
    bystander.write_all(&[0xC0, 0]).unwrap();
    let mut pong = [0u8; 2];
    bystander.read_exact(&mut pong).unwrap();
    assert_eq!(pong, [0xD0, 0]);
    silt.stop();
}

#[test]
fn a_subscriber_that_stops_reading_does_not_grow_broker_memory() {
    const MESSAGES: usize = 20_000;
    const PAYLOAD: usize = 10_000; // 200 MB published past a stalled subscriber
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("silt.toml");
    // A small tail cache and the smallest upload parts, so what the test sees is delivery state,
    // not the cache or a segment upload doing its job: an upload holds up to three parts (32 MiB
    // each by default) while it runs, and on busy cores it can still be running when RSS is read.
    std::fs::write(
        &cfg,
        "[storage]\ntail_cache_bytes = 8388608\nfsync = \"interval\"\n[tiering]\nmultipart_part_bytes = 5242880\n",
    )
    .unwrap();
    let silt = Silt::start_with(&dir.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    let port = silt.port;
    let pid = silt.child.id();

    // The stalled subscriber: subscribes at QoS 0 and then never reads its socket.
    let mut stalled = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stalled.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stalled
        .write_all(&[0x10, 17, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 0, 0, 5, b's', b't', b'a', b'l', b'l'])
        .unwrap();
    let mut connack = [0u8; 4];
    stalled.read_exact(&mut connack).unwrap();
    // SUBSCRIBE id 1, "stall/#" QoS 0.
    stalled.write_all(&[0x82, 12, 0, 1, 0, 7, b's', b't', b'a', b'l', b'l', b'/', b'#', 0]).unwrap();
    let mut suback = [0u8; 5];
    stalled.read_exact(&mut suback).unwrap();
    assert_eq!(suback[0], 0x90);

    let before = common::rss_mib(pid);
    let rt = runtime();
    rt.block_on(async {
        let (c, mut ev) = AsyncClient::new(options("stall-publisher", port, true), 1000);
        tokio::spawn(async move {
            for _ in 0..MESSAGES {
                c.publish("stall/t", QoS::AtLeastOnce, false, vec![1u8; PAYLOAD]).await.unwrap();
            }
        });
        let mut acked = 0;
        until(&mut ev, 300, |e| {
            acked += usize::from(matches!(e, Event::Incoming(Packet::PubAck(_))));
            acked == MESSAGES
        })
        .await;
    });
    let grown = common::rss_mib(pid) - before;
    eprintln!("broker RSS grew {grown:.1} MiB while 200 MB went past a stalled subscriber");
    assert!(grown < 100.0, "broker memory grew {grown:.1} MiB: the stalled subscriber's backlog is being buffered");

    // The publisher was never slowed into failure, and the broker still serves others.
    let mut probe = raw_v5_client(port, b'9');
    probe.write_all(&[0xC0, 0]).unwrap();
    let mut pong = [0u8; 2];
    probe.read_exact(&mut pong).unwrap();
    assert_eq!(pong, [0xD0, 0]);
    drop(stalled);
    silt.stop();
}

#[test]
fn a_wildcard_session_over_100k_topics_gets_every_message() {
    const TOPICS: u64 = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let silt = Silt::start(dir.path());
    let port = silt.port;
    rt.block_on(subscribe_persistent(port, "fleet", "devices/+/telemetry"));
    let before = common::rss_mib(silt.child.id());
    rt.block_on(async {
        let (c, mut ev) = AsyncClient::new(options("fleet-publisher", port, true), 1000);
        tokio::spawn(async move {
            for i in 0..TOPICS {
                c.publish(format!("devices/{i}/telemetry"), QoS::AtLeastOnce, false, i.to_be_bytes().to_vec())
                    .await
                    .unwrap();
            }
        });
        let mut acked = 0;
        until(&mut ev, 600, |e| {
            acked += u64::from(matches!(e, Event::Incoming(Packet::PubAck(_))));
            acked == TOPICS
        })
        .await;
    });
    let after = common::rss_mib(silt.child.id());
    eprintln!("100k topics: broker RSS {before:.1} MiB before, {after:.1} MiB after");
    let got = rt.block_on(receive_seq(port, "fleet", 300, |g| g.len() as u64 == TOPICS));
    assert_eq!(got, (0..TOPICS).collect::<Vec<_>>());
    silt.stop();
}

#[test]
fn rumqttc_v5_properties_and_subscription_ids_round_trip() {
    use rumqttc::v5::mqttbytes::QoS as QoS5;
    use rumqttc::v5::mqttbytes::v5::{Packet as Packet5, PublishProperties, SubscribeProperties};
    use rumqttc::v5::{AsyncClient as Client5, Event as Event5, MqttOptions as Options5};

    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let port = silt.port;
    runtime().block_on(async {
        let (sub, mut sub_ev) = Client5::new(Options5::new("v5-sub", "127.0.0.1", port), 10);
        sub.subscribe_with_properties(
            "v5/+",
            QoS5::AtLeastOnce,
            SubscribeProperties { id: Some(11), user_properties: vec![] },
        )
        .await
        .unwrap();
        tokio::time::timeout(Duration::from_secs(10), async {
            while !matches!(sub_ev.poll().await.unwrap(), Event5::Incoming(Packet5::SubAck(_))) {}
        })
        .await
        .unwrap();
        let (publisher, mut pub_ev) = Client5::new(Options5::new("v5-pub", "127.0.0.1", port), 10);
        tokio::spawn(async move { while pub_ev.poll().await.is_ok() {} });
        let props = PublishProperties {
            content_type: Some("text/plain".into()),
            user_properties: vec![("site".into(), "berlin".into())],
            response_topic: Some("v5/reply".into()),
            correlation_data: Some(bytes::Bytes::from_static(b"42")),
            ..PublishProperties::default()
        };
        publisher.publish_with_properties("v5/a", QoS5::AtLeastOnce, false, "hello", props).await.unwrap();
        let p = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Event5::Incoming(Packet5::Publish(p)) = sub_ev.poll().await.unwrap() {
                    return p;
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(&p.payload[..], b"hello");
        let got = p.properties.expect("properties");
        assert_eq!(got.content_type.as_deref(), Some("text/plain"));
        assert_eq!(got.user_properties, vec![("site".to_string(), "berlin".to_string())]);
        assert_eq!(got.response_topic.as_deref(), Some("v5/reply"));
        assert_eq!(got.correlation_data.as_deref(), Some(&b"42"[..]));
        assert_eq!(got.subscription_identifiers, vec![11]);
    });
    silt.stop();
}

#[test]
fn rumqttc_retained_messages_and_wills() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let port = silt.port;
    runtime().block_on(async {
        // A retained message, then a subscriber that arrives later.
        let (p, mut pev) = AsyncClient::new(options("ret-pub", port, true), 10);
        p.publish("ret/state", QoS::AtLeastOnce, true, "on").await.unwrap();
        until(&mut pev, 10, |e| matches!(e, Event::Incoming(Packet::PubAck(_)))).await;
        let (s, mut sev) = AsyncClient::new(options("ret-sub", port, true), 10);
        s.subscribe("ret/#", QoS::AtLeastOnce).await.unwrap();
        let mut retained = None;
        until(&mut sev, 10, |e| {
            if let Event::Incoming(Packet::Publish(m)) = e {
                retained = Some((m.topic.clone(), m.payload.clone(), m.retain));
            }
            retained.is_some()
        })
        .await;
        assert_eq!(retained, Some(("ret/state".to_string(), bytes::Bytes::from_static(b"on"), true)));

        // A client with a will drops its connection without DISCONNECT: the will arrives.
        let mut o = options("ret-dying", port, true);
        o.set_last_will(rumqttc::LastWill::new("ret/will", "gone", QoS::AtLeastOnce, false));
        let (dying, mut dev) = AsyncClient::new(o, 10);
        until(&mut dev, 10, |e| matches!(e, Event::Incoming(Packet::ConnAck(_)))).await;
        drop(dying);
        drop(dev); // the socket closes abruptly
        let mut will = None;
        until(&mut sev, 10, |e| {
            if let Event::Incoming(Packet::Publish(m)) = e {
                will = Some((m.topic.clone(), m.payload.clone()));
            }
            will.is_some()
        })
        .await;
        assert_eq!(will, Some(("ret/will".to_string(), bytes::Bytes::from_static(b"gone"))));
    });
    silt.stop();
}
