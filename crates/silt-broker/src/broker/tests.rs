use std::sync::Arc;

use bytes::Bytes;
use silt_storage::{DispatchListener, Storage, StorageConfig};

use super::*;
use crate::auth::Auth;
use crate::message::Message;
use crate::session::SessionSnapshot;

fn open(dir: &std::path::Path) -> (Arc<Storage>, Arc<Router>) {
    let router = Arc::new(Router::default());
    let listener: Arc<dyn DispatchListener> = router.clone();
    let storage = Arc::new(Storage::open_with(dir, StorageConfig::default(), vec![listener]).unwrap());
    (storage, router)
}

/// A broker on the storage in `dir`, with the default settings.
fn start(dir: &std::path::Path) -> Arc<Broker> {
    let (storage, router) = open(dir);
    let appender = Arc::new(silt_dataset::Appender::open(storage, Box::new(|_| 1)).unwrap());
    Broker::new(appender, router, MqttConfig::default(), Auth::open()).unwrap()
}

#[test]
fn start_up_compacts_long_state_replays_to_the_live_state() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, router) = open(dir.path());
    let mut snap = SessionSnapshot { client_id: "c1".into(), expiry_secs: 60, ..SessionSnapshot::default() };
    for i in 0..3000u64 {
        snap.inbound_qos2 = vec![(i % 100) as u16 + 1];
        storage.append_blocking(&[snap.to_record(Timestamp::now())]).unwrap();
    }
    let mut last = None;
    for i in 0..3000u32 {
        let m = Message {
            topic: "status/door".into(),
            payload: Bytes::from(i.to_string()),
            retain: true,
            timestamp: Timestamp::now(),
            ..Message::default()
        };
        let record = m.to_record();
        let pointer = RetainedStore::pointer(&record, m.timestamp);
        let a = storage.append_blocking(&[record, pointer]).unwrap();
        last = Some(a.positions[0]);
    }
    let appender = Arc::new(silt_dataset::Appender::open(storage.clone(), Box::new(|_| 1)).unwrap());
    let broker = Broker::new(appender, router, MqttConfig::default(), Auth::open()).unwrap();
    assert_eq!(broker.session_count(), 1);
    drop(broker);
    storage.wait_dispatched_blocking(storage.stats().log_end).unwrap();

    let (sessions, replayed) = SessionSnapshot::load_all(&storage).unwrap();
    assert_eq!(replayed, 1, "the next start replays the dump only");
    assert_eq!(sessions["c1"], snap);
    let (retained, replayed) = RetainedStore::load(&storage, 128).unwrap();
    assert_eq!(replayed, 1);
    let entries = retained.matching(&TopicFilter::new("status/#").unwrap());
    assert_eq!(entries.len(), 1);
    assert_eq!(Some(entries[0].position), last, "the dump points at the newest retained message");
    let record = storage.read_record(&entries[0]).unwrap();
    assert_eq!(&record.value[..], b"2999");
}

/// An admin delete and a CONNECT of the same client id at once: the CONNECT's new session
/// must not be ended by the delete's tombstone, also after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_during_an_admin_delete_keeps_its_new_session() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path());
    let old = broker.connect("c1", None, true, 3600).await.unwrap();
    broker.persist(&old.session).await.unwrap();
    broker.disconnect(old.conn, &old.session).await;

    // Hold the old session: the delete takes it out of the map, then waits in the middle of
    // ending it, before its tombstone is written.
    let held = old.session.lock().await;
    let deleting = tokio::spawn({
        let broker = broker.clone();
        async move { broker.delete_session("c1", false).await }
    });
    while broker.state().sessions.contains_key("c1") {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let connecting = tokio::spawn({
        let broker = broker.clone();
        async move {
            let new = broker.connect("c1", None, false, 3600).await.unwrap();
            broker.persist(&new.session).await.unwrap();
            new
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!connecting.is_finished(), "a CONNECT waits for the delete's tombstone");
    drop(held);
    assert_eq!(deleting.await.unwrap(), Ok(false));
    let new = connecting.await.unwrap();
    assert!(!new.session_present, "the deleted session is not resumed");
    broker.disconnect(new.conn, &new.session).await;
    drop((old, new));
    let storage = broker.storage.clone();
    drop(broker);
    storage.wait_dispatched_blocking(storage.stats().log_end).unwrap();
    drop(storage);

    let broker = start(dir.path());
    assert_eq!(broker.session_views(Some("c1")).await.len(), 1, "the new session survives a restart");
}

/// A retained message handed to the log before a subscription's lookup is found by it even
/// when its publisher has not yet seen the acknowledgement (which is when the index learns of
/// it): by then the message may be past where the new subscription's queue starts, so the
/// lookup is its only way to the subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_waits_for_retained_messages_already_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path());
    let m = Message {
        topic: "status/door".into(),
        payload: Bytes::from_static(b"open"),
        retain: true,
        timestamp: Timestamp::now(),
        ..Message::default()
    };
    let ack = broker.submit(&m).await.unwrap();
    // The publisher looks at its acknowledgement only later (a busy or descheduled task).
    let publisher = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        ack.await.unwrap();
    });
    let found = broker.retained_for(&TopicFilter::new("status/#").unwrap()).await;
    assert_eq!(found.iter().map(|m| &m.payload[..]).collect::<Vec<_>>(), [&b"open"[..]]);
    publisher.await.unwrap();

    // An append that is dropped unacknowledged does not hold later lookups back.
    let dropped = broker.submit(&Message { payload: Bytes::from_static(b"shut"), ..m.clone() }).await.unwrap();
    drop(dropped);
    let started = std::time::Instant::now();
    let found = broker.retained_for(&TopicFilter::new("status/#").unwrap()).await;
    assert_eq!(found.len(), 1);
    assert!(
        started.elapsed() < crate::retained::RETAINED_WAIT,
        "a dropped acknowledgement held the lookup until the timeout"
    );
}

/// A retained topic being republished stays retained for a subscriber that looks it up at the
/// same moment: the lookup finds the old or the new message, never neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_topic_being_replaced_is_never_missing_from_a_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path());
    let message = |i: u32| Message {
        topic: "status/door".into(),
        payload: Bytes::from(i.to_string()),
        retain: true,
        timestamp: Timestamp::now(),
        ..Message::default()
    };
    broker.publish(&message(0)).await.unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = tokio::spawn({
        let (broker, done) = (broker.clone(), done.clone());
        async move {
            for i in 1..=2000 {
                broker.publish(&message(i)).await.unwrap();
            }
            done.store(true, Ordering::Relaxed);
        }
    });
    let filter = TopicFilter::new("status/#").unwrap();
    let mut lookups = 0u32;
    let mut last = 0u32;
    while !done.load(Ordering::Relaxed) {
        let found = broker.retained_for(&filter).await;
        assert_eq!(found.len(), 1, "lookup {lookups}: the topic is retained throughout");
        let value: u32 = std::str::from_utf8(&found[0].payload).unwrap().parse().unwrap();
        assert!(value >= last, "a lookup never goes back to an older message");
        last = value;
        lookups += 1;
        tokio::task::yield_now().await;
    }
    publisher.await.unwrap();
    assert!(lookups > 100, "the lookups overlapped the republishing ({lookups})");
}
