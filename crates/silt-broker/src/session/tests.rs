use std::sync::Arc;

use silt_storage::{Storage, StorageConfig};

use super::*;

fn storage(dir: &std::path::Path) -> Arc<Storage> {
    Arc::new(Storage::open(dir, StorageConfig::default()).unwrap())
}

fn msg(topic: &str, payload: &str, qos: u8) -> Message {
    Message {
        topic: topic.into(),
        payload: Bytes::copy_from_slice(payload.as_bytes()),
        qos,
        publisher: Some("pub".into()),
        timestamp: Timestamp::now(),
        ..Message::default()
    }
}

fn sub(s: &Storage, subs: &mut Subscriptions, filter: &str, qos: u8) {
    let f = TopicFilter::new(filter).unwrap();
    if f.has_wildcard() {
        s.register_filter_blocking(&f).unwrap();
    }
    let state = SubscriptionState {
        filter: filter.into(),
        qos,
        no_local: false,
        retain_as_published: false,
        subscription_id: None,
        cursor: 0,
        sent: 0,
        settled: Box::default(),
    };
    subs.subs.insert(filter.into(), Box::new(Subscription::new(state)));
}

fn publish(s: &Storage, m: &Message) {
    let a = s.append_blocking(&[m.to_record()]).unwrap();
    s.wait_dispatched_blocking(a.end).unwrap();
}

fn payloads(out: &[Outgoing]) -> Vec<String> {
    out.iter().map(|o| String::from_utf8_lossy(&o.message.payload).into_owned()).collect()
}

#[test]
fn overlapping_subscriptions_deliver_once_at_the_highest_qos() {
    let dir = tempfile::tempdir().unwrap();
    let s = storage(dir.path());
    let mut subs = Subscriptions::default();
    sub(&s, &mut subs, "a/#", 0);
    sub(&s, &mut subs, "a/+", 1);
    sub(&s, &mut subs, "a/b", 2);
    publish(&s, &msg("a/b", "m1", 2));
    publish(&s, &msg("a/c", "m2", 2));
    publish(&s, &msg("a/b/c", "m3", 1));
    let out = subs.pull_blocking(&s, "me", Timestamp::now(), 10).unwrap();
    assert_eq!(payloads(&out), ["m1", "m2", "m3"]);
    assert_eq!(out.iter().map(|o| o.qos).collect::<Vec<_>>(), [2, 1, 0]);
    assert_eq!(out[0].settles.len(), 3, "one delivery settles all three subscriptions");
}

#[test]
fn cursors_advance_only_when_acknowledged_and_rewind_redelivers_with_dup() {
    let dir = tempfile::tempdir().unwrap();
    let s = storage(dir.path());
    let mut subs = Subscriptions::default();
    sub(&s, &mut subs, "t", 1);
    for i in 0..3 {
        publish(&s, &msg("t", &format!("m{i}"), 1));
    }
    let out = subs.pull_blocking(&s, "me", Timestamp::now(), 2).unwrap();
    assert_eq!(payloads(&out), ["m0", "m1"]);
    subs.settle(&out[1].settles);
    assert_eq!(subs.subs["t"].state.cursor, 0, "m0 still unacknowledged");
    subs.settle(&out[0].settles);
    assert_eq!(subs.subs["t"].state.cursor, 2);
    let out = subs.pull_blocking(&s, "me", Timestamp::now(), 10).unwrap();
    assert_eq!(payloads(&out), ["m2"]);
    assert!(!out[0].dup);
    subs.rewind();
    let again = subs.pull_blocking(&s, "me", Timestamp::now(), 10).unwrap();
    assert_eq!(payloads(&again), ["m2"]);
    assert!(again[0].dup, "a resend after rewind carries DUP");
}

#[test]
fn no_local_and_expired_messages_are_skipped_and_settled() {
    let dir = tempfile::tempdir().unwrap();
    let s = storage(dir.path());
    let mut subs = Subscriptions::default();
    sub(&s, &mut subs, "t", 1);
    subs.subs.get_mut("t").unwrap().state.no_local = true;
    publish(&s, &msg("t", "mine", 1));
    let mut old = msg("t", "expired", 1);
    old.publisher = Some("other".into());
    old.expiry = Some(1);
    old.timestamp = Timestamp(Timestamp::now().get() - 5_000);
    publish(&s, &old);
    let mut theirs = msg("t", "theirs", 1);
    theirs.publisher = Some("other".into());
    publish(&s, &theirs);
    let out = subs.pull_blocking(&s, "pub", Timestamp::now(), 10).unwrap();
    assert_eq!(payloads(&out), ["theirs"]);
    subs.settle(&out[0].settles);
    assert_eq!(subs.subs["t"].state.cursor, 3);
}

#[test]
fn snapshots_round_trip_through_the_log_and_tombstones_delete() {
    let dir = tempfile::tempdir().unwrap();
    let s = storage(dir.path());
    let snap = SessionSnapshot {
        client_id: "c1".into(),
        expiry_secs: 3600,
        subscriptions: vec![SubscriptionState {
            filter: "a/+".into(),
            qos: 1,
            no_local: true,
            retain_as_published: false,
            subscription_id: Some(7),
            cursor: 42,
            sent: 45,
            settled: Box::default(),
        }],
        inbound_qos2: vec![3],
        disconnected_at: Some(1),
        outbound_qos2: vec![OutboundQos2 {
            packet_id: 9,
            qos: 2,
            released: true,
            position: 100,
            size: 50,
            timestamp: 7,
            settles: [("a/+".into(), Offset(41))].into_iter().collect(),
            subscription_ids: vec![7],
            group: Some("$share/g/a/#".into()),
        }],
        shared: vec![SharedMembership { key: "$share/g/a/#".into(), qos: 1, subscription_id: None }],
        owner: Some(crate::session::SessionOwner { user: Some("alice".into()) }),
    };
    s.append_blocking(&[snap.to_record(Timestamp::now())]).unwrap();
    let mut c2 = snap.clone();
    c2.client_id = "c2".into();
    s.append_blocking(&[c2.to_record(Timestamp::now())]).unwrap();
    let a = s.append_blocking(&[SessionSnapshot::tombstone("c2", Timestamp::now())]).unwrap();
    s.wait_dispatched_blocking(a.end).unwrap();
    let (all, replayed) = SessionSnapshot::load_all(&s).unwrap();
    assert_eq!(replayed, 3);
    assert_eq!(all.len(), 1);
    assert_eq!(all["c1"], snap);
}

/// Snapshots written before filter names were shared still load, and new ones keep the form.
#[test]
fn in_flight_settles_keep_their_snapshot_form() {
    let json = r#"{"packet_id":9,"qos":1,"position":100,"size":50,"timestamp":7,"settles":[["a/+",41],["a/b",3]]}"#;
    let o: OutboundQos2 = serde_json::from_str(json).unwrap();
    let want: Settles = [("a/+".into(), Offset(41)), ("a/b".into(), Offset(3))].into_iter().collect();
    assert_eq!(o.settles, want);
    let back = serde_json::to_value(&o).unwrap();
    assert_eq!(back["settles"], serde_json::json!([["a/+", 41], ["a/b", 3]]));
}

#[test]
fn shared_subscription_strings_parse_per_spec() {
    assert_eq!(parse_shared("$share/g/a/+").map(|(g, f)| (g, f.as_str().to_owned())), Some(("g", "a/+".into())));
    assert!(parse_shared("$share//a").is_none());
    assert!(parse_shared("$share/g+/a").is_none());
    assert!(parse_shared("$share/g").is_none());
    assert!(parse_shared("a/b").is_none());
}

#[test]
fn released_deliveries_go_out_again_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = storage(dir.path());
    let mut subs = Subscriptions::default();
    sub(&s, &mut subs, "t", 1);
    for i in 0..3 {
        publish(&s, &msg("t", &format!("m{i}"), 1));
    }
    let out = subs.pull_blocking(&s, "me", Timestamp::now(), 2).unwrap();
    subs.release(&out[0].settles);
    subs.release(&out[1].settles);
    let again = subs.pull_blocking(&s, "me", Timestamp::now(), 10).unwrap();
    assert_eq!(payloads(&again), ["m0", "m1", "m2"]);
}

#[test]
fn a_restored_delivery_completed_before_the_pull_reaches_it_is_not_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let s = storage(dir.path());
    let mut subs = Subscriptions::default();
    sub(&s, &mut subs, "r/t", 1);
    for i in 0..4 {
        publish(&s, &msg("r/t", &format!("m{i}"), 1));
    }
    // A reconnect restores offsets 0 and 1 as in flight (resent under their ids)...
    let id = s.queue_id(&QueueName::Topic("r/t".into())).unwrap().unwrap();
    let entries = s.read_index(id, Offset(0), 2).unwrap();
    subs.rewind();
    for (o, e) in &entries {
        subs.hold(&[("r/t".into(), *o)], *e);
    }
    // ...and the client acknowledges them before the window lets the pull run.
    for (o, _) in &entries {
        subs.settle(&[("r/t".into(), *o)]);
    }
    let out = subs.pull_blocking(&s, "me", Timestamp::now(), 10).unwrap();
    assert_eq!(payloads(&out), ["m2", "m3"]);
    assert_eq!(subs.subs["r/t"].state.cursor, 2, "the cursor moved past the completed ones");
}

#[test]
fn offset_sets_merge_split_and_trim() {
    let mut s = OffsetSet::default();
    s.insert_range(5, 7);
    s.insert_range(9, 10);
    s.insert_range(7, 9); // touches both neighbours: one range
    assert_eq!(s.ranges().collect::<Vec<_>>(), [(5, 10)]);
    assert!(s.remove(7) && !s.remove(7));
    assert_eq!(s.ranges().collect::<Vec<_>>(), [(5, 7), (8, 10)]);
    assert!(s.contains(5) && s.contains(9) && !s.contains(7) && !s.contains(10));
    s.insert_range(1, 2);
    s.remove_below(6);
    assert_eq!(s.ranges().collect::<Vec<_>>(), [(6, 7), (8, 10)]);
    s.insert_range(0, 100);
    assert_eq!(s.ranges().collect::<Vec<_>>(), [(0, 100)]);
}

/// Acknowledged out of order, or sent at QoS 0 behind a message still in flight: such
/// messages stay done across a reconnect (rewind) and a restart (snapshot), and only what was
/// in flight comes again.
#[test]
fn messages_settled_above_the_cursor_are_not_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let s = storage(dir.path());
    let mut subs = Subscriptions::default();
    sub(&s, &mut subs, "o/t", 2);
    for (i, qos) in [2, 2, 0, 2, 2].into_iter().enumerate() {
        publish(&s, &msg("o/t", &format!("m{i}"), qos));
    }
    let out = subs.pull_blocking(&s, "me", Timestamp::now(), 10).unwrap();
    assert_eq!(payloads(&out), ["m0", "m1", "m2", "m3", "m4"]);
    // m2 (QoS 0) settled when sent; m1 and m4 completed; m0 and m3 still in flight.
    subs.settle(&out[1].settles);
    subs.settle(&out[4].settles);
    assert_eq!(subs.subs["o/t"].state.cursor, 0);
    let snapshot = subs.states();
    assert_eq!(*snapshot[0].settled, [(1, 3), (4, 5)]);

    subs.rewind();
    let again = subs.pull_blocking(&s, "me", Timestamp::now(), 10).unwrap();
    assert_eq!(payloads(&again), ["m0", "m3"], "after a reconnect");
    assert!(again.iter().all(|o| o.dup));

    // A restart: the subscription comes back from its snapshot.
    let mut restored = Subscriptions::default();
    restored.subs.insert("o/t".into(), Box::new(Subscription::new(snapshot[0].clone())));
    let again = restored.pull_blocking(&s, "me", Timestamp::now(), 10).unwrap();
    assert_eq!(payloads(&again), ["m0", "m3"], "after a restart");
    for o in &again {
        restored.settle(&o.settles);
    }
    assert_eq!(restored.subs["o/t"].state.cursor, 5);
    assert!(restored.states()[0].settled.is_empty());
}

#[test]
fn a_snapshot_written_before_sessions_had_owners_still_loads_without_one() {
    let old = r#"{"client_id":"c1","expiry_secs":60,"subscriptions":[]}"#;
    let snap: SessionSnapshot = serde_json::from_str(old).unwrap();
    assert_eq!(snap.owner, None, "the next user to connect claims it");
    let owned = SessionSnapshot { owner: Some(crate::session::SessionOwner { user: None }), ..snap };
    let back: SessionSnapshot = serde_json::from_slice(&serde_json::to_vec(&owned).unwrap()).unwrap();
    assert_eq!(back.owner, Some(crate::session::SessionOwner { user: None }), "anonymous is an owner too");
}

/// What a pull reads from memory, and what it hands back as reads for the blocking pool.
fn pull_memory(s: &Storage, subs: &mut Subscriptions, max: usize) -> (Vec<String>, bool) {
    let p = subs.pull(s, "me", Timestamp::now(), max).unwrap();
    (payloads(&p.out), p.reads.is_some())
}

#[test]
fn a_subscriber_that_keeps_up_is_served_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let s = storage(dir.path());
    let mut subs = Subscriptions::default();
    publish(&s, &msg("t", "before", 1)); // the queue exists before the subscription
    sub(&s, &mut subs, "t", 1);
    sub(&s, &mut subs, "w/+", 1);
    sub(&s, &mut subs, "never", 1);
    // The first pull looks up only the queue that does not exist: the others (created since
    // the engine opened, the filter's still empty) are known from memory.
    let p = subs.pull(&s, "me", Timestamp::now(), 10).unwrap();
    let r = p.reads.expect("a lookup");
    assert_eq!(r.queues.iter().map(|q| &*q.filter).collect::<Vec<_>>(), ["never"]);
    subs.supply(r.run(&s).unwrap());
    assert_eq!(pull_memory(&s, &mut subs, 10), (vec!["before".to_owned()], false));
    assert_eq!(pull_memory(&s, &mut subs, 10), (vec![], false), "nothing new, and memory says so");
    publish(&s, &msg("t", "m1", 1));
    publish(&s, &msg("w/x", "m2", 1));
    assert_eq!(pull_memory(&s, &mut subs, 10), (vec!["m1".to_owned(), "m2".to_owned()], false));
    // A topic nobody published to yet: memory knows the queues created since, so other new
    // topics cost no lookup, and its own first message is found without one.
    publish(&s, &msg("other", "x", 1));
    assert_eq!(pull_memory(&s, &mut subs, 10), (vec![], false));
    publish(&s, &msg("never", "m3", 1));
    assert_eq!(pull_memory(&s, &mut subs, 10), (vec!["m3".to_owned()], false));
}

#[test]
fn a_subscriber_behind_memory_gets_reads_then_the_messages_in_order() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = storage(dir.path());
        for i in 0..300 {
            publish(&s, &msg(if i % 2 == 0 { "a/1" } else { "a/2" }, &format!("m{i}"), 1));
        }
        s.close().unwrap();
    }
    // Reopened: memory holds neither the index entries nor (tail cache off) the records.
    let config = StorageConfig { tail_cache_bytes: 0, ..StorageConfig::default() };
    let s = Arc::new(Storage::open(dir.path(), config).unwrap());
    let mut subs = Subscriptions::default();
    sub(&s, &mut subs, "a/1", 1);
    sub(&s, &mut subs, "a/2", 1);
    let mut got = Vec::new();
    let mut reads = 0;
    while got.len() < 300 {
        let p = subs.pull(&s, "me", Timestamp::now(), 64).unwrap();
        assert!(p.out.len() <= 64);
        for o in &p.out {
            subs.settle(&o.settles);
        }
        got.extend(payloads(&p.out));
        match p.reads {
            Some(r) => {
                reads += 1;
                subs.supply(r.run(&s).unwrap());
            }
            None => assert!(got.len() == 300 || !p.out.is_empty(), "a pull with nothing and no reads stalls"),
        }
        assert!(reads < 100, "reads make progress");
    }
    assert_eq!(got, (0..300).map(|i| format!("m{i}")).collect::<Vec<_>>(), "log order across both queues");
    // Caught up: memory knows there is nothing more, and what comes next is served from it
    // (the index entries; the records are read, the tail cache being off).
    assert_eq!(pull_memory(&s, &mut subs, 10), (vec![], false));
    publish(&s, &msg("a/2", "new", 1));
    let p = subs.pull(&s, "me", Timestamp::now(), 10).unwrap();
    assert!(p.out.is_empty());
    let r = p.reads.expect("the record is read");
    assert!(r.queues.is_empty(), "the entry came from memory");
    subs.supply(r.run(&s).unwrap());
    assert_eq!(pull_memory(&s, &mut subs, 10), (vec!["new".to_owned()], false));
}

#[test]
fn a_subscription_whose_messages_retention_removed_does_not_hold_back_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let s = storage(dir.path());
    let mut subs = Subscriptions::default();
    sub(&s, &mut subs, "short/#", 1);
    sub(&s, &mut subs, "long/#", 1);
    assert!(subs.pull_blocking(&s, "me", Timestamp::now(), 10).unwrap().is_empty());
    for i in 0..3 {
        publish(&s, &msg("short/a", &format!("s{i}"), 1));
    }
    // Retention: everything written so far is gone.
    let end = s.stats().log_end;
    s.truncate_before(end).unwrap();
    publish(&s, &msg("long/a", "l1", 1));
    let mut got = Vec::new();
    for _ in 0..8 {
        let p = subs.pull(&s, "me", Timestamp::now(), 10).unwrap();
        got.extend(payloads(&p.out));
        match p.reads {
            Some(r) => subs.supply(r.run(&s).unwrap()),
            None => break,
        }
    }
    assert_eq!(got, ["l1"], "the gone messages are skipped and the others delivered");
    assert_eq!(pull_memory(&s, &mut subs, 10), (vec![], false), "and nothing is read again");
}

#[test]
fn subscriptions_stay_in_filter_order_through_inserts_replacements_and_removals() {
    let dir = tempfile::tempdir().unwrap();
    let s = storage(dir.path());
    let mut subs = Subscriptions::default();
    for f in ["m/#", "a/b", "z", "b/+/c"] {
        sub(&s, &mut subs, f, 1);
    }
    let keys = |subs: &Subscriptions| subs.subs.keys().map(|k| k.to_string()).collect::<Vec<_>>();
    assert_eq!(keys(&subs), ["a/b", "b/+/c", "m/#", "z"]);
    sub(&s, &mut subs, "m/#", 0);
    assert_eq!(subs.subs.len(), 4, "a replacement adds nothing");
    assert_eq!(subs.subs["m/#"].state.qos, 0, "and replaces the subscription");
    assert!(subs.subs.remove("b/+/c").is_some());
    assert!(subs.subs.remove("b/+/c").is_none());
    assert!(!subs.subs.contains_key("b/+/c") && subs.subs.contains_key("z"));
    assert_eq!(keys(&subs), ["a/b", "m/#", "z"]);
}

/// Every subscription of every session holds one: 224 bytes is a jemalloc size class, and one
/// byte more costs 256 per subscription (a persistent wildcard per device makes that one per
/// connection).
#[test]
fn a_subscription_fits_its_size_class() {
    let size = std::mem::size_of::<Subscription>();
    assert!(size <= 224, "a subscription grew to {size} bytes");
}

/// Every connection holds its session in one allocation with its lock and count: 224 bytes
/// is a jemalloc size class, and one byte more costs 256 on every connection.
#[test]
fn a_session_with_its_lock_fits_its_size_class() {
    let size = std::mem::size_of::<tokio::sync::Mutex<Session>>() + 2 * std::mem::size_of::<usize>();
    assert!(size <= 224, "a session with its lock and count grew to {size} bytes");
}
