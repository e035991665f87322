//! What a hostile client tries against a running `silt serve`, and what it gets: topics deep
//! enough to overflow a recursive walk (refused, and harmless where allowed, across
//! restarts), ACL bypasses through shared subscriptions and `%c`, another user's session,
//! unverifiable usernames, bursts of wrong passwords, idle sockets at the connection limit,
//! and protocol leniency. Clients are the workspace's codec over real sockets
//! (`common::raw`), so every reason code is seen as sent.

mod common;

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::raw::{Raw, pid};
use common::{Silt, auth_config};
use silt_mqtt::{
    Connect, ConnectProperties, Packet, ProtocolVersion, PubResponse, Publish, PublishProperties, QoS, ReasonCode, Will,
};

const V5: ProtocolVersion = ProtocolVersion::V5;

/// A topic of `n` levels.
fn deep(n: usize) -> String {
    vec!["d"; n].join("/")
}

/// A CONNECT with credentials; `clean` or a one-hour session.
fn login(id: &str, user: Option<(&str, &str)>, clean: bool) -> Connect {
    let mut c = Connect::new(V5, id, 60);
    c.clean_start = clean;
    c.properties =
        ConnectProperties { session_expiry_interval: Some(if clean { 0 } else { 3600 }), ..Default::default() };
    if let Some((u, p)) = user {
        c.username = Some(u.into());
        c.password = Some(Bytes::from(p.to_owned()));
    }
    c
}

/// `silt serve` with `toml` as its config file, both under `dir`.
fn start_configured(dir: &std::path::Path, toml: &str) -> Silt {
    let cfg = dir.join("silt.toml");
    std::fs::write(&cfg, toml).unwrap();
    Silt::start_with(&dir.join("data"), &["--config", cfg.to_str().unwrap()])
}

/// Connects and asserts the CONNACK's code; returns the client and whether a session was there.
fn connect_expect(port: u16, c: Connect, code: ReasonCode) -> (Raw, bool) {
    let (raw, ack) = Raw::handshake(port, c);
    let ack = ack.expect("a CONNACK");
    assert_eq!(ack.reason_code, code);
    (raw, ack.session_present)
}

fn publish_qos0(raw: &mut Raw, topic: &str, payload: &'static [u8]) {
    raw.send(Packet::Publish(Publish::new(topic, payload)));
}

/// Receives the next PUBLISH and completes it at its QoS; returns its topic and payload.
fn receive(raw: &mut Raw) -> (String, Vec<u8>) {
    let p = raw.recv_publish();
    match (p.qos, p.packet_id) {
        (QoS::AtLeastOnce, Some(id)) => raw.send(Packet::PubAck(PubResponse::new(id))),
        (QoS::ExactlyOnce, Some(id)) => {
            raw.send(Packet::PubRec(PubResponse::new(id)));
            assert!(matches!(raw.recv(), Some(Packet::PubRel(_))));
            raw.send(Packet::PubComp(PubResponse::new(id)));
        }
        _ => {}
    }
    (p.topic, p.payload.to_vec())
}

#[test]
fn topics_deeper_than_max_topic_levels_are_refused_with_their_reason_codes() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let (mut c, _) = Raw::connect(silt.port, "deep", true);
    assert_eq!(c.subscribe(&format!("{}/#", deep(10_000)), QoS::AtLeastOnce), ReasonCode::TopicFilterInvalid);
    assert_eq!(c.subscribe(&deep(128), QoS::AtLeastOnce), ReasonCode::GrantedQoS1, "the limit itself is fine");
    assert_eq!(c.publish_qos1(&deep(32_767), 2, b"deep", true), Some(ReasonCode::TopicNameInvalid));
    assert_eq!(c.publish_qos1(&deep(128), 3, b"fits", false), Some(ReasonCode::Success));
    assert_eq!(receive(&mut c), (deep(128), b"fits".to_vec()), "the connection goes on");
    publish_qos0(&mut c, &deep(129), b"deep");
    assert_eq!(c.disconnect_reason(), Some(ReasonCode::TopicNameInvalid));

    let mut w = Connect::new(V5, "deep-will", 60);
    w.will = Some(Will { topic: deep(200), payload: Bytes::from_static(b"bye"), ..Will::default() });
    connect_expect(silt.port, w, ReasonCode::TopicNameInvalid);

    // Nothing deep was kept: a new subscriber to everything gets no retained message.
    let (mut all, _) = Raw::connect(silt.port, "all", true);
    all.subscribe("#", QoS::AtLeastOnce);
    assert!(all.quiet_for(300));
    silt.stop();
}

/// Before the trie and the retained store walked with their own stacks, each of these aborted
/// the broker (`thread 'tokio-rt-worker' has overflowed its stack`), and the retained one
/// again after every restart.
#[test]
fn the_deepest_topics_never_crash_the_broker_where_allowed_nor_after_a_restart_under_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("deep.toml");
    std::fs::write(&cfg, "[mqtt]\nmax_topic_levels = 32768\n").unwrap();
    let data = dir.path().join("data");
    let cfg_arg = ["--config", cfg.to_str().unwrap()];
    let silt = Silt::start_with(&data, &cfg_arg);
    let deepest = deep(32_767);
    let deep_filter = format!("{}/#", deep(10_000));
    {
        // A filter 10,000 levels deep, subscribed and left (its removal walks the trie too).
        let (mut gone, _) = Raw::connect(silt.port, "deep-leaver", true);
        assert_eq!(gone.subscribe(&deep_filter, QoS::AtLeastOnce), ReasonCode::GrantedQoS1);
        // And a session that keeps one.
        let (mut kept, _) = Raw::connect(silt.port, "deep-keeper", false);
        assert_eq!(kept.subscribe(&deep_filter, QoS::AtLeastOnce), ReasonCode::GrantedQoS1);
    }
    let (mut p, _) = Raw::connect(silt.port, "deep-pub", true);
    assert_eq!(p.publish_qos1(&deepest, 1, b"retained and deep", true), Some(ReasonCode::Success));
    let (mut all, _) = Raw::connect(silt.port, "all", true);
    all.subscribe("#", QoS::AtLeastOnce);
    assert_eq!(receive(&mut all), (deepest.clone(), b"retained and deep".to_vec()));
    drop(all);
    silt.stop();

    let silt = Silt::start_with(&data, &cfg_arg);
    let (mut all, _) = Raw::connect(silt.port, "all", true);
    all.subscribe("#", QoS::AtLeastOnce);
    assert_eq!(receive(&mut all), (deepest.clone(), b"retained and deep".to_vec()), "back after a restart");
    drop(all);
    silt.kill();

    // Under the default limit the store still starts, and skips what is too deep.
    let silt = Silt::start(&data);
    assert!(silt.log_contains("retained message deeper than mqtt.max_topic_levels skipped"));
    assert!(silt.log_contains("subscription deeper than mqtt.max_topic_levels dropped"));
    let (mut all, _) = Raw::connect(silt.port, "all", true);
    all.subscribe("#", QoS::AtLeastOnce);
    assert!(all.quiet_for(500), "the deep retained message is not served");
    let (mut keeper, present) = Raw::connect(silt.port, "deep-keeper", false);
    assert!(present, "the session itself survives without its deep subscription");
    assert_eq!(keeper.publish_qos1("shallow/x", 1, b"x", false), Some(ReasonCode::Success));
    silt.stop();
}

/// The ACL of the tests below: alice may use `alice/#` but not `alice/secret/#`.
const ALICE_ACL: &str = "user alice\ntopic readwrite alice/#\ntopic deny alice/secret/#\n";

/// A message under a deny rule that a shared subscriber's filter covers, published by a user
/// allowed to write it: before the fix, QoS 1/2 shared subscribers received it.
#[test]
fn a_denied_topic_reaches_no_shared_subscriber_even_when_someone_may_publish_it() {
    let dir = tempfile::tempdir().unwrap();
    let acl = format!("{ALICE_ACL}user ops\ntopic readwrite alice/#\n");
    let cfg = auth_config(dir.path(), &[("alice", "a-pw"), ("ops", "o-pw")], &acl, "", "");
    let silt = Silt::start_with(&dir.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    let (mut ops, _) = connect_expect(silt.port, login("ops", Some(("ops", "o-pw")), true), ReasonCode::Success);
    for (i, qos) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce].into_iter().enumerate() {
        let (mut sub, _) =
            connect_expect(silt.port, login(&format!("s{i}"), Some(("alice", "a-pw")), true), ReasonCode::Success);
        sub.subscribe(&format!("$share/g{i}/alice/#"), qos);
        let (mut plain, _) =
            connect_expect(silt.port, login(&format!("p{i}"), Some(("alice", "a-pw")), true), ReasonCode::Success);
        plain.subscribe("alice/#", qos);
        let id = 1 + i as u16 * 2;
        assert_eq!(ops.publish_qos1("alice/secret/x", id, b"secret", false), Some(ReasonCode::Success));
        assert_eq!(ops.publish_qos1("alice/ok", id + 1, b"ok", false), Some(ReasonCode::Success));
        assert_eq!(receive(&mut sub), ("alice/ok".into(), b"ok".to_vec()), "shared at {qos:?}");
        assert_eq!(receive(&mut plain), ("alice/ok".into(), b"ok".to_vec()), "plain at {qos:?}");
        assert!(sub.quiet_for(200) && plain.quiet_for(200));
    }
    silt.stop();
}

/// mosquitto's CVE-2017-7650: `%c` with a client id of `+` or `#`.
#[test]
fn a_client_id_of_plus_or_hash_reads_and_writes_no_other_device() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = auth_config(dir.path(), &[("dev", "d-pw")], "pattern readwrite devices/%c/#\n", "", "");
    let silt = Silt::start_with(&dir.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    let dev = Some(("dev", "d-pw"));
    let (mut victim, _) = connect_expect(silt.port, login("dev8", dev, true), ReasonCode::Success);
    assert_eq!(victim.subscribe("devices/dev8/#", QoS::AtLeastOnce), ReasonCode::GrantedQoS1);
    for id in ["+", "#"] {
        let (mut attacker, _) = connect_expect(silt.port, login(id, dev, true), ReasonCode::Success);
        assert_eq!(attacker.subscribe("devices/+/cmd", QoS::AtLeastOnce), ReasonCode::NotAuthorized, "id {id}");
        assert_eq!(attacker.subscribe("devices/#", QoS::AtLeastOnce), ReasonCode::NotAuthorized, "id {id}");
        assert_eq!(
            attacker.publish_qos1("devices/dev8/cmd", 1, b"open the door", false),
            Some(ReasonCode::NotAuthorized),
            "id {id}"
        );
    }
    assert!(victim.quiet_for(300), "nothing reached the device");
    assert_eq!(victim.publish_qos1("devices/dev8/state", 2, b"ok", false), Some(ReasonCode::Success));
    assert_eq!(receive(&mut victim), ("devices/dev8/state".into(), b"ok".to_vec()));
    silt.stop();
}

#[test]
fn another_user_cannot_take_a_session_over_and_its_queue_survives_unless_an_acl_allows_it() {
    let dir = tempfile::tempdir().unwrap();
    let acl = "user alice\ntopic readwrite inbox/#\nuser bob\ntopic readwrite inbox/#\nuser admin\ntakeover c1\n";
    let users = [("alice", "a-pw"), ("bob", "b-pw"), ("admin", "x-pw")];
    let cfg = auth_config(dir.path(), &users, acl, "", "");
    let silt = Silt::start_with(&dir.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    let (alice, bob, admin) = (Some(users[0]), Some(users[1]), Some(users[2]));
    {
        let (mut a, _) = connect_expect(silt.port, login("c1", alice, false), ReasonCode::Success);
        a.subscribe("inbox/alice", QoS::AtLeastOnce);
    }
    let (mut b, _) = connect_expect(silt.port, login("bob-pub", bob, true), ReasonCode::Success);
    assert_eq!(b.publish_qos1("inbox/alice", 1, b"queued for alice", false), Some(ReasonCode::Success));
    // Bob with alice's client id: refused whether he asks to resume or to start clean.
    connect_expect(silt.port, login("c1", bob, false), ReasonCode::NotAuthorized);
    connect_expect(silt.port, login("c1", bob, true), ReasonCode::NotAuthorized);
    let (mut a, present) = connect_expect(silt.port, login("c1", alice, false), ReasonCode::Success);
    assert!(present);
    assert_eq!(receive(&mut a), ("inbox/alice".into(), b"queued for alice".to_vec()));
    // Online, alice is not kicked by bob's attempt either.
    connect_expect(silt.port, login("c1", bob, false), ReasonCode::NotAuthorized);
    assert_eq!(b.publish_qos1("inbox/alice", 2, b"still alice's", false), Some(ReasonCode::Success));
    assert_eq!(receive(&mut a), ("inbox/alice".into(), b"still alice's".to_vec()));
    // The ACL lets admin take c1 over; the session stays alice's.
    let (admin_conn, present) = connect_expect(silt.port, login("c1", admin, false), ReasonCode::Success);
    assert!(present);
    assert_eq!(a.disconnect_reason(), Some(ReasonCode::SessionTakenOver));
    drop(admin_conn);
    let (_a, present) = connect_expect(silt.port, login("c1", alice, false), ReasonCode::Success);
    assert!(present, "alice resumes her session after the takeover");
    connect_expect(silt.port, login("c1", bob, false), ReasonCode::NotAuthorized);
    silt.stop();
}

#[test]
fn an_acl_file_without_a_password_file_is_refused_unless_unverified_usernames_are_declared() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl");
    std::fs::write(&acl, "user alice\ntopic readwrite alice/#\n").unwrap();
    let cfg = dir.path().join("silt.toml");
    std::fs::write(&cfg, format!("[mqtt.auth]\nacl_file = {:?}\n", acl.display())).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_silt"))
        .args(["serve", "--mqtt", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mqtt.auth.acl_file") && err.contains("allow_unauthenticated_usernames"), "{err}");

    let declared = format!("[mqtt.auth]\nacl_file = {:?}\nallow_unauthenticated_usernames = true\n", acl.display());
    std::fs::write(&cfg, declared).unwrap();
    let silt = Silt::start_with(&dir.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    assert!(silt.log_contains("usernames are not verified"), "said loudly at start-up");
    silt.stop();
}

/// 192 concurrent wrong-password CONNECTs used to take the broker from 23 MB to 2.9 GB (one
/// argon2 buffer per blocking thread) and starve legitimate clients of CONNACKs.
#[test]
fn a_burst_of_wrong_passwords_keeps_memory_bounded_and_legitimate_clients_connect() {
    let dir = tempfile::tempdir().unwrap();
    // No remembered verifications: every legitimate CONNECT pays argon2 during the burst too.
    let cfg = auth_config(dir.path(), &[("alice", "a-pw")], "", "", "verified_cache_secs = 0");
    let silt = Silt::start_with(&dir.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    let (port, pid) = (silt.port, silt.child.id());
    let before = common::rss_mib(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let attempts = Arc::new(AtomicU64::new(0));
    let attackers: Vec<_> = (0..192)
        .map(|i| {
            let (stop, attempts) = (stop.clone(), attempts.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut raw = Raw::open(port, Some([127, 0, 0, 1]), V5);
                    let ack = raw.send_connect(login(&format!("x{i}"), Some(("alice", "wrong")), true));
                    attempts.fetch_add(1, Ordering::Relaxed);
                    if let Some(a) = ack {
                        assert!(a.reason_code.is_error());
                    }
                    // An attacker elsewhere: the test's own 192 threads must not take the
                    // broker's CPU (2 cores here) with a busy loop.
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut peak = before;
    let mut waits = Vec::new();
    for i in 0..5 {
        let started = Instant::now();
        let mut legit = Raw::open(port, Some([127, 0, 0, 2]), V5);
        let ack = legit.send_connect(login(&format!("legit{i}"), Some(("alice", "a-pw")), true)).expect("a CONNACK");
        waits.push(started.elapsed());
        assert_eq!(ack.reason_code, ReasonCode::Success, "attempt {i}");
        peak = peak.max(common::rss_mib(pid));
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    peak = peak.max(common::rss_mib(pid));
    eprintln!(
        "wrong-password attempts: {}, legitimate CONNACK waits: {waits:?}, RSS {before:.0} -> peak {peak:.0} MiB",
        attempts.load(Ordering::Relaxed)
    );
    assert!(waits.iter().all(|w| *w < Duration::from_secs(1)), "a legitimate CONNACK within a second: {waits:?}");
    // Two verifier threads hold 19 MiB each; everything else is small.
    assert!(peak - before < 120.0, "RSS grew from {before:.0} to {peak:.0} MiB");
    let refusals = silt.log.lock().unwrap().iter().filter(|l| l.contains("connection refused")).count();
    assert!(attempts.load(Ordering::Relaxed) > 100 && refusals <= 3, "refusals logged once per 10 s: {refusals}");
    silt.stop();
}

/// An attacker re-opening idle sockets as they are closed kept every legitimate client out
/// when sockets still in their handshake counted against `max_connections`, and made the
/// broker log one line per refusal (557,150 lines in 30 s).
#[test]
fn idle_sockets_keep_no_client_out_and_the_log_stays_short() {
    let dir = tempfile::tempdir().unwrap();
    let silt = start_configured(dir.path(), "[mqtt]\nmax_connections = 50\nmax_pending_connections = 128\n");
    let port = silt.port;
    let stop = Arc::new(AtomicBool::new(false));
    let attackers: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                // Keep 150 idle sockets open; re-open each one the broker closes.
                let mut held: Vec<TcpStream> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    held.retain(|s| !closed_by_broker(s));
                    while held.len() < 150 {
                        match TcpStream::connect(("127.0.0.1", port)) {
                            Ok(s) => held.push(s),
                            Err(_) => break,
                        }
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let mut connected = 0;
    for i in 0..60 {
        let mut c = Raw::open(port, Some([127, 0, 0, 3]), V5);
        if c.send_connect(login(&format!("legit{i}"), None, true)).is_some_and(|a| a.reason_code == ReasonCode::Success)
        {
            connected += 1;
        }
    }
    // Long enough for a second log line, which carries the count of those left out.
    while started.elapsed() < Duration::from_secs(11) {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    assert_eq!(connected, 60, "every legitimate client got in");
    let log = silt.log.lock().unwrap().clone();
    let lines: Vec<&String> = log.iter().filter(|l| l.contains("mqtt.max_pending_connections reached")).collect();
    assert!(!lines.is_empty() && lines.len() <= 3, "one line per 10 s, not one per socket: {}", lines.len());
    assert!(
        lines.iter().any(|l| l.split("suppressed=").nth(1).is_some_and(|n| !n.starts_with('0'))),
        "a later line counts those left out: {lines:#?}"
    );
    silt.stop();
}

/// Whether the broker closed this idle socket (without blocking).
fn closed_by_broker(s: &TcpStream) -> bool {
    use std::io::Read;
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    match (&mut &*s).read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

#[test]
fn connections_beyond_max_connections_get_quota_exceeded_and_the_others_are_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let silt = start_configured(dir.path(), "[mqtt]\nmax_connections = 2\n");
    let (mut a, _) = Raw::connect(silt.port, "a", true);
    let (_b, _) = Raw::connect(silt.port, "b", true);
    connect_expect(silt.port, login("c", None, true), ReasonCode::QuotaExceeded);
    a.subscribe("t", QoS::AtLeastOnce);
    assert_eq!(a.publish_qos1("t", 1, b"x", false), Some(ReasonCode::Success));
    assert_eq!(receive(&mut a), ("t".into(), b"x".to_vec()));
    drop(a);
    // A slot is given back when a connection ends.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, ack) = Raw::handshake(silt.port, login("c", None, true));
        if ack.is_some_and(|a| a.reason_code == ReasonCode::Success) {
            break;
        }
        assert!(Instant::now() < deadline, "the slot never came back");
        std::thread::sleep(Duration::from_millis(50));
    }
    silt.stop();
}

#[test]
fn subscriptions_beyond_max_subscriptions_per_session_get_quota_exceeded_and_the_others_work() {
    let dir = tempfile::tempdir().unwrap();
    let silt = start_configured(dir.path(), "[mqtt]\nmax_subscriptions_per_session = 2\n");

    // A filter of its own and a shared group's fill a 5.0 session's quota; the third new
    // filter is refused, in the same SUBSCRIBE's order as any other.
    let (mut q, _) = Raw::connect(silt.port, "q", false);
    assert_eq!(q.subscribe("a/#", QoS::AtLeastOnce), ReasonCode::GrantedQoS1);
    assert_eq!(q.subscribe("$share/g/b", QoS::AtLeastOnce), ReasonCode::GrantedQoS1);
    assert_eq!(q.subscribe("c", QoS::AtLeastOnce), ReasonCode::QuotaExceeded);
    assert_eq!(q.subscribe("$share/h/b", QoS::AtLeastOnce), ReasonCode::QuotaExceeded);
    // Replacing a subscription the session holds is not a new one.
    assert_eq!(q.subscribe("a/#", QoS::AtMostOnce), ReasonCode::Success);
    assert_eq!(q.subscribe("$share/g/b", QoS::AtLeastOnce), ReasonCode::GrantedQoS1);
    // What it holds still delivers; the refused filter does not (its message, published
    // first, would arrive first).
    let (mut p, _) = Raw::connect(silt.port, "p", true);
    assert_eq!(p.publish_qos1("c", 1, b"refused", false), Some(ReasonCode::Success));
    assert_eq!(p.publish_qos1("a/1", 2, b"held", false), Some(ReasonCode::Success));
    assert_eq!(receive(&mut q), ("a/1".into(), b"held".to_vec()));
    // An unsubscription gives its room back.
    assert_eq!(q.unsubscribe("a/#"), ReasonCode::Success);
    assert_eq!(q.subscribe("c", QoS::AtLeastOnce), ReasonCode::GrantedQoS1);
    assert_eq!(p.publish_qos1("c", 3, b"now", false), Some(ReasonCode::Success));
    assert_eq!(receive(&mut q), ("c".into(), b"now".to_vec()));
    // Its PUBACK is settled once the broker answers what the client sent after it; otherwise
    // the next connection could take the session over first and get the message again.
    q.send(Packet::PingReq);
    assert!(matches!(q.recv(), Some(Packet::PingResp)));
    drop(q);

    // The quota counts what the session kept across connections.
    let (mut q, present) = Raw::connect(silt.port, "q", false);
    assert!(present);
    assert_eq!(q.subscribe("d", QoS::AtLeastOnce), ReasonCode::QuotaExceeded);

    // A 3.1.1 client has no 0x97: its SUBACK says failure (0x80).
    let mut old = Raw::open(silt.port, None, ProtocolVersion::V3_1_1);
    let ack = old.send_connect(Connect::new(ProtocolVersion::V3_1_1, "old", 60)).expect("a CONNACK");
    assert_eq!(ack.reason_code, ReasonCode::Success);
    assert_eq!(old.subscribe("x", QoS::AtLeastOnce), ReasonCode::GrantedQoS1);
    assert_eq!(old.subscribe("y", QoS::AtLeastOnce), ReasonCode::GrantedQoS1);
    assert_eq!(old.subscribe("z", QoS::AtLeastOnce), ReasonCode::UnspecifiedError);
    assert_eq!(p.publish_qos1("y", 4, b"v3", false), Some(ReasonCode::Success));
    assert_eq!(receive(&mut old), ("y".into(), b"v3".to_vec()));
    silt.stop();
}

#[test]
fn protocol_leniency_is_gone_extended_auth_and_client_subscription_identifiers() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    let mut c = login("scram", None, true);
    c.properties.authentication_method = Some("SCRAM-SHA-256".into());
    connect_expect(silt.port, c, ReasonCode::BadAuthenticationMethod);

    let (mut sub, _) = Raw::connect(silt.port, "watcher", true);
    sub.subscribe("lenient/#", QoS::AtLeastOnce);
    let (mut p, _) = Raw::connect(silt.port, "subid-pub", true);
    let mut publish = Publish::new("lenient/x", &b"forwarded?"[..]);
    publish.qos = QoS::AtLeastOnce;
    publish.packet_id = Some(pid(1));
    publish.properties = PublishProperties { subscription_identifiers: vec![5], ..Default::default() }.into();
    p.send(Packet::Publish(publish));
    assert_eq!(p.disconnect_reason(), Some(ReasonCode::ProtocolError));
    assert!(sub.quiet_for(300), "the message was not forwarded");
    silt.stop();
}
