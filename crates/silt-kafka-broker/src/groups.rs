//! The driver of the group coordinator (`silt_kafka::group`): its clock, its parked requests
//! (JoinGroup, SyncGroup, OffsetCommit, DeleteGroups answer later), and its records made
//! durable in the internal stream `__silt_groups` before the commits they carry are
//! acknowledged — so a committed offset survives kill -9, and a restart on an empty data
//! directory (the stream is uploaded with the rest).
//!
//! One std mutex around the coordinator: its steps are short and never wait on I/O. Persisting
//! is one task taking batches in the order they were raised (the coordinator requires it),
//! appending all that are waiting as one batch, and reporting back in order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use silt_dataset::internal;
use silt_kafka::group::{Coordinator, Event, PersistId, Record, RequestToken, Settings};
use silt_kafka::kafka_protocol::messages::ResponseKind;
use silt_storage::Storage;
use silt_types::{Partition, Timestamp};
use tokio::sync::{Notify, mpsc, oneshot};

/// Internal stream of the coordinator's records (key: group id).
pub const GROUPS_STREAM: &str = "__silt_groups";

struct Inner {
    coord: Coordinator,
    waiting: HashMap<RequestToken, oneshot::Sender<Box<ResponseKind>>>,
    next_token: u64,
}

pub struct Groups {
    inner: Mutex<Inner>,
    /// The coordinator's next deadline may have moved.
    poke: Notify,
    persist: mpsc::UnboundedSender<ToPersist>,
    persist_rx: Mutex<Option<mpsc::UnboundedReceiver<ToPersist>>>,
}

/// The persister's work, done in the order queued.
enum ToPersist {
    /// A batch of the coordinator's records to make durable.
    Batch(PersistId, Vec<Record>),
    /// A full dump, taken under the coordinator's lock when queued: written behind every
    /// batch raised before and ahead of every batch raised after, so a replay from its
    /// checkpoint never sees an older offset after a newer one.
    Dump(Vec<silt_storage::Record>, oneshot::Sender<silt_storage::Result<()>>),
}

/// Cancels a parked request whose waiter went away (its connection closed).
struct Parked<'a> {
    groups: &'a Groups,
    token: RequestToken,
    answered: bool,
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        if !self.answered {
            let mut inner = self.groups.lock();
            inner.waiting.remove(&self.token);
            inner.coord.cancel(self.token);
            self.groups.drain(&mut inner);
        }
    }
}

fn to_log(r: &Record) -> Option<silt_storage::Record> {
    match r.encode() {
        Ok(value) => Some(silt_storage::Record {
            timestamp: Timestamp::now(),
            stream: GROUPS_STREAM.into(),
            partition: Partition(0),
            key: Some(Bytes::copy_from_slice(r.group().as_bytes())),
            value,
            ..silt_storage::Record::default()
        }),
        Err(e) => {
            tracing::error!(group = %r.group(), error = %e, "a group record did not encode; not persisted");
            None
        }
    }
}

impl Groups {
    /// Replays `__silt_groups` into a new coordinator (blocking: call it before a runtime
    /// serves clients), compacting the stream when the replay was much longer than what lives.
    pub fn open(storage: &Storage, settings: Settings) -> silt_storage::Result<Arc<Groups>> {
        let mut seed = [0u8; 8];
        getrandom(&mut seed);
        let mut coord = Coordinator::new(settings, Instant::now(), Timestamp::now(), u64::from_le_bytes(seed));
        let from = internal::checkpoint(storage, GROUPS_STREAM)?;
        let mut bad = 0u64;
        let replayed = internal::scan(storage, GROUPS_STREAM, from, |_, r| match Record::decode(&r.value) {
            Ok(rec) => coord.restore(rec),
            Err(_) => bad += 1,
        })?;
        if bad > 0 {
            tracing::warn!(records = bad, "unreadable group records skipped");
        }
        let live: Vec<silt_storage::Record> = coord.snapshot().filter_map(|r| to_log(&r)).collect();
        if internal::worth_compacting(replayed, live.len()) {
            let start = internal::stream_end(storage, GROUPS_STREAM)?;
            for chunk in live.chunks(1000) {
                storage.append_blocking(chunk)?;
            }
            storage.append_blocking(&[internal::checkpoint_record(GROUPS_STREAM, start)])?;
            tracing::info!(replayed, live = live.len(), "group offsets compacted");
        }
        let (persist, rx) = mpsc::unbounded_channel();
        Ok(Arc::new(Groups {
            inner: Mutex::new(Inner { coord, waiting: HashMap::new(), next_token: 1 }),
            poke: Notify::new(),
            persist,
            persist_rx: Mutex::new(Some(rx)),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("invariant: lock not poisoned")
    }

    /// Starts the clock and the persister on the current runtime; they end when `self` is
    /// the last one holding the coordinator.
    pub fn start(self: &Arc<Self>, storage: Arc<Storage>) {
        let Some(mut rx) = self.persist_rx.lock().expect("invariant: lock not poisoned").take() else { return };
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut next = None;
            loop {
                let job = match next.take() {
                    Some(job) => job,
                    None => match rx.recv().await {
                        Some(job) => job,
                        None => break,
                    },
                };
                let (id, records) = match job {
                    ToPersist::Batch(id, records) => (id, records),
                    ToPersist::Dump(records, done) => {
                        let _ = done.send(write_dump(&storage, &records).await);
                        continue;
                    }
                };
                let mut ids = vec![id];
                let mut batch: Vec<silt_storage::Record> = records.iter().filter_map(to_log).collect();
                while let Ok(more) = rx.try_recv() {
                    match more {
                        ToPersist::Batch(more, recs) => {
                            ids.push(more);
                            batch.extend(recs.iter().filter_map(to_log));
                        }
                        dump => {
                            next = Some(dump);
                            break;
                        }
                    }
                }
                let last = *ids.last().expect("invariant: at least one");
                let result = if batch.is_empty() { Ok(()) } else { storage.append(&batch).await.map(|_| ()) };
                let Some(groups) = weak.upgrade() else { return };
                let mut inner = groups.lock();
                match result {
                    Ok(()) => inner.coord.handle_persisted(last),
                    Err(e) => {
                        tracing::warn!(error = %e, "group records not persisted; their commits are refused");
                        // Every batch of the append failed, each reported in its turn.
                        for id in ids {
                            inner.coord.handle_persist_failed(id);
                        }
                    }
                }
                groups.drain(&mut inner);
            }
        });
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(groups) = weak.upgrade() else { return };
                let (deadline, poked) = {
                    let inner = groups.lock();
                    (inner.coord.poll_timeout(), groups.poke.notified())
                };
                let sleep = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = sleep => {
                        let mut inner = groups.lock();
                        inner.coord.handle_timeout(Instant::now());
                        groups.drain(&mut inner);
                    }
                    _ = poked => {}
                }
            }
        });
    }

    /// Executes the coordinator's events: answers to parked requests, records to persist.
    fn drain(&self, inner: &mut Inner) {
        while let Some(e) = inner.coord.poll_event() {
            match e {
                Event::Respond { token, response } => {
                    if let Some(tx) = inner.waiting.remove(&token) {
                        let _ = tx.send(response);
                    }
                }
                Event::Persist { id, records } => {
                    if self.persist.send(ToPersist::Batch(id, records)).is_err() {
                        inner.coord.handle_persist_failed(id);
                    }
                }
            }
        }
        self.poke.notify_one();
    }

    /// A request answered at once.
    pub fn now<R>(&self, f: impl FnOnce(&mut Coordinator, Instant) -> R) -> R {
        let mut inner = self.lock();
        let r = f(&mut inner.coord, Instant::now());
        self.drain(&mut inner);
        r
    }

    /// A request answered later: `f` hands it to the coordinator under a fresh token, and this
    /// waits for the answer. `None` if the coordinator dropped it (superseded by the same
    /// member's next request, as in Kafka).
    pub async fn parked(&self, f: impl FnOnce(&mut Coordinator, Instant, RequestToken)) -> Option<Box<ResponseKind>> {
        let (tx, rx) = oneshot::channel();
        let token = {
            let mut inner = self.lock();
            let token = RequestToken(inner.next_token);
            inner.next_token += 1;
            inner.waiting.insert(token, tx);
            f(&mut inner.coord, Instant::now(), token);
            self.drain(&mut inner);
            token
        };
        let mut guard = Parked { groups: self, token, answered: false };
        let answer = rx.await.ok();
        guard.answered = true;
        answer
    }

    /// Writes a full dump of `__silt_groups` with its checkpoint marker, so retention may
    /// delete what came before. Returns once it is durable.
    pub async fn dump(&self) -> silt_storage::Result<()> {
        let (tx, rx) = oneshot::channel();
        {
            let inner = self.lock();
            let records = inner.coord.snapshot().filter_map(|r| to_log(&r)).collect();
            if self.persist.send(ToPersist::Dump(records, tx)).is_err() {
                return Err(silt_storage::Error::Closed);
            }
        }
        rx.await.unwrap_or(Err(silt_storage::Error::Closed))
    }
}

/// The persister's half of [`Groups::dump`]: the dump starts where the stream ends now, as
/// every batch queued before it is written.
async fn write_dump(storage: &Arc<Storage>, records: &[silt_storage::Record]) -> silt_storage::Result<()> {
    let s = storage.clone();
    let start = tokio::task::spawn_blocking(move || internal::stream_end(&s, GROUPS_STREAM))
        .await
        .map_err(|_| silt_storage::Error::Closed)??;
    for chunk in records.chunks(1000) {
        storage.append(chunk).await?;
    }
    storage.append(&[internal::checkpoint_record(GROUPS_STREAM, start)]).await?;
    Ok(())
}

/// Randomness for the member-id generator's seed, without a new dependency: the standard
/// library's per-process random hasher keys.
fn getrandom(out: &mut [u8; 8]) {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    *out = h.finish().to_le_bytes();
}
