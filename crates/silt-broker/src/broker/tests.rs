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
