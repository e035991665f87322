//! Producer ids and the transaction coordinator (Kafka's transaction protocol before KIP-890)
//! as a sans-I/O state machine: what InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
//! TxnOffsetCommit and EndTxn decide, and when a transaction times out.
//!
//! A transactional id maps to a producer id and epoch; every InitProducerId bumps the epoch
//! (fencing the producer that had it: its requests get PRODUCER_FENCED), aborting a
//! transaction it left open. A transaction moves Empty → Ongoing (partitions or a group added)
//! → PrepareCommit / PrepareAbort (EndTxn) → CompleteCommit / CompleteAbort once the driver has
//! written the commit or abort marker into every partition and, on commit, applied the staged
//! group offsets ([`Txns::completed`]). A transaction open longer than its timeout is aborted
//! with an epoch bump.
//!
//! Durability: every change that a client relies on comes with a [`TxnRecord`] for the driver
//! to make durable before it answers; replaying them ([`Txns::restore`]) rebuilds the state.
//! Producer ids are handed out from blocks whose end is recorded first, so no id is given twice
//! across restarts. The record encoding is JSON (a few per transaction: not a hot path).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// Producer ids reserved per block record.
pub const PID_BLOCK: i64 = 1000;
/// Longest transaction timeout a producer may ask for (ms; Kafka's
/// `transaction.max.timeout.ms` default).
pub const MAX_TIMEOUT_MS: i32 = 900_000;
/// Most transactional ids kept, and partitions per transaction (bounds on what clients make
/// the coordinator hold).
pub const MAX_TRANSACTIONAL_IDS: usize = 100_000;
pub const MAX_TXN_PARTITIONS: usize = 10_000;

/// Where a transaction stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

/// An offset staged by TxnOffsetCommit, applied to its group when the transaction commits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
}

/// One transactional id's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txn {
    pub id: String,
    pub producer_id: i64,
    pub epoch: i16,
    pub state: TxnState,
    pub timeout_ms: i32,
    /// When the open transaction began (ms since epoch).
    pub started_ms: i64,
    /// Partitions written in the open transaction, with the offset of its first record there
    /// once known.
    #[serde(with = "pairs")]
    pub partitions: BTreeMap<(String, i32), Option<i64>>,
    /// Groups whose offsets it commits, and the offsets staged for them.
    pub groups: BTreeMap<String, Vec<StagedOffset>>,
}

/// A map with tuple keys as a JSON list of pairs (JSON object keys are strings).
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    type Firsts = BTreeMap<(String, i32), Option<i64>>;

    pub fn serialize<S: Serializer>(m: &Firsts, s: S) -> Result<S::Ok, S::Error> {
        m.iter().collect::<Vec<_>>().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Firsts, D::Error> {
        Ok(Vec::<((String, i32), Option<i64>)>::deserialize(d)?.into_iter().collect())
    }
}

/// A change to persist (and replay in order at start-up).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnRecord {
    /// Producer ids below `end` may have been handed out.
    PidBlock { end: i64 },
    /// A transactional id's state, as it is now.
    State(Txn),
}

impl TxnRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("invariant: plain data serializes")
    }

    pub fn decode(bytes: &[u8]) -> Option<TxnRecord> {
        serde_json::from_slice(bytes).ok()
    }
}

/// What ending a transaction requires of the driver: a marker in every partition, then (on
/// commit) the staged offsets applied, then [`Txns::completed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ending {
    pub id: String,
    pub producer_id: i64,
    pub epoch: i16,
    pub commit: bool,
    pub partitions: Vec<((String, i32), Option<i64>)>,
    pub offsets: Vec<(String, StagedOffset)>,
}

/// Kafka error codes this module answers with.
pub mod code {
    pub const CONCURRENT_TRANSACTIONS: i16 = 51;
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub const INVALID_TXN_STATE: i16 = 48;
    pub const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
    pub const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
    pub const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
    pub const PRODUCER_FENCED: i16 = 90;
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    pub const INVALID_REQUEST: i16 = 42;
}

#[derive(Debug, Default)]
pub struct Txns {
    by_id: HashMap<String, Txn>,
    next_pid: i64,
    block_end: i64,
}

/// The result of an operation: a Kafka error code, or what to persist (in order) before
/// answering, and the value.
pub type Outcome<T> = Result<(Vec<TxnRecord>, T), i16>;

impl Txns {
    /// Replays one persisted record (in the order they were written).
    pub fn restore(&mut self, r: TxnRecord) {
        match r {
            TxnRecord::PidBlock { end } => {
                self.block_end = self.block_end.max(end);
                self.next_pid = self.block_end;
            }
            TxnRecord::State(t) => {
                self.next_pid = self.next_pid.max(t.producer_id + 1).max(self.block_end);
                self.by_id.insert(t.id.clone(), t);
            }
        }
    }

    /// Transactions left open or half-ended when the broker stopped: to be aborted (or, for a
    /// half-ended one, finished as decided) before clients are served.
    pub fn unfinished(&self) -> Vec<Ending> {
        self.by_id
            .values()
            .filter_map(|t| match t.state {
                TxnState::Ongoing | TxnState::PrepareAbort => Some(ending(t, false)),
                TxnState::PrepareCommit => Some(ending(t, true)),
                _ => None,
            })
            .collect()
    }

    fn allocate(&mut self, out: &mut Vec<TxnRecord>) -> i64 {
        if self.next_pid >= self.block_end {
            self.block_end = self.next_pid + PID_BLOCK;
            out.push(TxnRecord::PidBlock { end: self.block_end });
        }
        let pid = self.next_pid;
        self.next_pid += 1;
        pid
    }

    /// InitProducerId. Without a transactional id: a fresh producer id at epoch 0. With one:
    /// its producer id at the next epoch (a fresh id when the epoch would overflow); an open
    /// transaction of the fenced epoch is returned to be aborted first. `given` is the
    /// (producer id, epoch) of a v3+ request re-initialising a known producer.
    pub fn init(
        &mut self,
        transactional_id: Option<&str>,
        timeout_ms: i32,
        given: Option<(i64, i16)>,
        now_ms: i64,
    ) -> Outcome<(i64, i16, Option<Ending>)> {
        let mut out = Vec::new();
        let Some(id) = transactional_id else {
            let pid = self.allocate(&mut out);
            return Ok((out, (pid, 0, None)));
        };
        if !(1..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
            return Err(code::INVALID_TRANSACTION_TIMEOUT);
        }
        if id.is_empty() || id.len() > 255 {
            return Err(code::INVALID_REQUEST);
        }
        if !self.by_id.contains_key(id) && self.by_id.len() >= MAX_TRANSACTIONAL_IDS {
            return Err(code::COORDINATOR_LOAD_IN_PROGRESS);
        }
        if let Some(t) = self.by_id.get(id)
            && matches!(t.state, TxnState::PrepareCommit | TxnState::PrepareAbort)
        {
            return Err(code::CONCURRENT_TRANSACTIONS);
        }
        if let (Some((gpid, gepoch)), Some(t)) = (given, self.by_id.get(id))
            && gpid >= 0
            && (gpid != t.producer_id || gepoch != t.epoch)
        {
            return Err(code::PRODUCER_FENCED);
        }
        let fresh = match self.by_id.get(id) {
            None => true,
            Some(t) => t.epoch >= i16::MAX - 1,
        };
        let pid = if fresh { self.allocate(&mut out) } else { self.by_id[id].producer_id };
        let t = self.by_id.entry(id.to_owned()).or_insert_with(|| Txn {
            id: id.to_owned(),
            producer_id: pid,
            epoch: -1,
            state: TxnState::Empty,
            timeout_ms,
            started_ms: now_ms,
            partitions: BTreeMap::new(),
            groups: BTreeMap::new(),
        });
        let abort = (t.state == TxnState::Ongoing).then(|| ending(t, false));
        if fresh {
            t.producer_id = pid;
            t.epoch = 0;
        } else {
            t.epoch += 1;
        }
        t.timeout_ms = timeout_ms;
        if abort.is_some() {
            // The fenced epoch's transaction is aborted under the new epoch's authority.
            t.state = TxnState::PrepareAbort;
        } else {
            t.state = TxnState::Empty;
            t.partitions.clear();
            t.groups.clear();
        }
        out.push(TxnRecord::State(t.clone()));
        Ok((
            out,
            (
                t.producer_id,
                t.epoch,
                abort.map(|mut e| {
                    e.epoch = t.epoch;
                    e
                }),
            ),
        ))
    }

    fn current(&mut self, id: &str, pid: i64, epoch: i16) -> Result<&mut Txn, i16> {
        let t = self.by_id.get_mut(id).ok_or(code::TRANSACTIONAL_ID_NOT_FOUND)?;
        if t.producer_id != pid {
            return Err(code::INVALID_PRODUCER_ID_MAPPING);
        }
        if epoch != t.epoch {
            return Err(code::PRODUCER_FENCED);
        }
        Ok(t)
    }

    fn begin(t: &mut Txn, now_ms: i64) -> Result<(), i16> {
        match t.state {
            TxnState::Ongoing => Ok(()),
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                t.state = TxnState::Ongoing;
                t.started_ms = now_ms;
                t.partitions.clear();
                t.groups.clear();
                Ok(())
            }
            TxnState::PrepareCommit | TxnState::PrepareAbort => Err(code::CONCURRENT_TRANSACTIONS),
        }
    }

    /// AddPartitionsToTxn.
    pub fn add_partitions(
        &mut self,
        id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[(String, i32)],
        now_ms: i64,
    ) -> Outcome<()> {
        let t = self.current(id, pid, epoch)?;
        Self::begin(t, now_ms)?;
        let new = partitions.iter().filter(|p| !t.partitions.contains_key(*p)).count();
        if t.partitions.len() + new > MAX_TXN_PARTITIONS {
            return Err(code::INVALID_REQUEST);
        }
        if new == 0 && !partitions.is_empty() {
            return Ok((Vec::new(), ()));
        }
        for p in partitions {
            t.partitions.entry(p.clone()).or_insert(None);
        }
        Ok((vec![TxnRecord::State(t.clone())], ()))
    }

    /// AddOffsetsToTxn.
    pub fn add_offsets(&mut self, id: &str, pid: i64, epoch: i16, group: &str, now_ms: i64) -> Outcome<()> {
        let t = self.current(id, pid, epoch)?;
        Self::begin(t, now_ms)?;
        if t.groups.contains_key(group) {
            return Ok((Vec::new(), ()));
        }
        t.groups.insert(group.to_owned(), Vec::new());
        Ok((vec![TxnRecord::State(t.clone())], ()))
    }

    /// TxnOffsetCommit: the offsets wait in the transaction until it commits.
    pub fn stage_offsets(
        &mut self,
        id: &str,
        pid: i64,
        epoch: i16,
        group: &str,
        offsets: Vec<StagedOffset>,
    ) -> Outcome<()> {
        let t = self.current(id, pid, epoch)?;
        if t.state != TxnState::Ongoing {
            return Err(code::INVALID_TXN_STATE);
        }
        let Some(staged) = t.groups.get_mut(group) else { return Err(code::INVALID_TXN_STATE) };
        for o in offsets {
            staged.retain(|s| (s.topic.as_str(), s.partition) != (o.topic.as_str(), o.partition));
            staged.push(o);
        }
        Ok((vec![TxnRecord::State(t.clone())], ()))
    }

    /// Whether `pid`/`epoch` may write to a partition in transaction `id` (it was added).
    pub fn may_produce(&self, id: &str, pid: i64, epoch: i16, topic: &str, partition: i32) -> Result<(), i16> {
        let t = self.by_id.get(id).ok_or(code::TRANSACTIONAL_ID_NOT_FOUND)?;
        if t.producer_id != pid {
            return Err(code::INVALID_PRODUCER_ID_MAPPING);
        }
        if epoch != t.epoch {
            return Err(code::INVALID_PRODUCER_EPOCH);
        }
        if t.state != TxnState::Ongoing || !t.partitions.contains_key(&(topic.to_owned(), partition)) {
            return Err(code::INVALID_TXN_STATE);
        }
        Ok(())
    }

    /// The first record of transaction `id` in a partition landed at `offset`: remembered
    /// (persist the record before acknowledging the produce, so a restart can abort it).
    pub fn first_offset(&mut self, id: &str, topic: &str, partition: i32, offset: i64) -> Vec<TxnRecord> {
        let Some(t) = self.by_id.get_mut(id) else { return Vec::new() };
        match t.partitions.get_mut(&(topic.to_owned(), partition)) {
            Some(slot @ None) => {
                *slot = Some(offset);
                vec![TxnRecord::State(t.clone())]
            }
            _ => Vec::new(),
        }
    }

    /// EndTxn. A retry of an ending already done is answered as it was.
    pub fn end(&mut self, id: &str, pid: i64, epoch: i16, commit: bool) -> Outcome<Option<Ending>> {
        let t = self.current(id, pid, epoch)?;
        match (t.state, commit) {
            (TxnState::Ongoing, _) => {
                t.state = if commit { TxnState::PrepareCommit } else { TxnState::PrepareAbort };
                let e = ending(t, commit);
                Ok((vec![TxnRecord::State(t.clone())], Some(e)))
            }
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => Ok((Vec::new(), None)),
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => Err(code::CONCURRENT_TRANSACTIONS),
            _ => Err(code::INVALID_TXN_STATE),
        }
    }

    /// The markers of an ending are written (and, on commit, its offsets applied).
    pub fn completed(&mut self, e: &Ending) -> Vec<TxnRecord> {
        let Some(t) = self.by_id.get_mut(&e.id) else { return Vec::new() };
        if t.producer_id != e.producer_id {
            return Vec::new();
        }
        t.state = if e.commit { TxnState::CompleteCommit } else { TxnState::CompleteAbort };
        t.partitions.clear();
        t.groups.clear();
        vec![TxnRecord::State(t.clone())]
    }

    /// Open transactions past their timeout at `now_ms`: aborted under a bumped epoch (the
    /// producer that let it lapse is fenced).
    pub fn expire(&mut self, now_ms: i64) -> (Vec<TxnRecord>, Vec<Ending>) {
        let mut records = Vec::new();
        let mut endings = Vec::new();
        for t in self.by_id.values_mut() {
            if t.state == TxnState::Ongoing && now_ms - t.started_ms > i64::from(t.timeout_ms) {
                t.epoch = t.epoch.saturating_add(1);
                t.state = TxnState::PrepareAbort;
                endings.push(ending(t, false));
                records.push(TxnRecord::State(t.clone()));
            }
        }
        (records, endings)
    }

    /// The earliest deadline of an open transaction (ms since epoch).
    pub fn next_deadline(&self) -> Option<i64> {
        self.by_id
            .values()
            .filter(|t| t.state == TxnState::Ongoing)
            .map(|t| t.started_ms + i64::from(t.timeout_ms))
            .min()
    }

    /// Every live record, for a dump (compaction).
    pub fn dump(&self) -> Vec<TxnRecord> {
        let mut out = vec![TxnRecord::PidBlock { end: self.block_end }];
        out.extend(self.by_id.values().cloned().map(TxnRecord::State));
        out
    }

    pub fn get(&self, id: &str) -> Option<&Txn> {
        self.by_id.get(id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

fn ending(t: &Txn, commit: bool) -> Ending {
    Ending {
        id: t.id.clone(),
        producer_id: t.producer_id,
        epoch: t.epoch,
        commit,
        partitions: t.partitions.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        offsets: if commit {
            t.groups.iter().flat_map(|(g, os)| os.iter().map(move |o| (g.clone(), o.clone()))).collect()
        } else {
            Vec::new()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t: &str, i: i32) -> (String, i32) {
        (t.to_owned(), i)
    }

    #[test]
    fn a_transaction_commits_its_partitions_and_offsets_once_its_markers_are_written() {
        let mut t = Txns::default();
        let (recs, (pid, epoch, abort)) = t.init(Some("tx"), 60_000, None, 0).unwrap();
        assert_eq!((epoch, abort), (0, None));
        assert!(matches!(recs[0], TxnRecord::PidBlock { .. }), "the id block is recorded first");
        t.add_partitions("tx", pid, epoch, &[p("a", 0), p("b", 1)], 10).unwrap();
        assert_eq!(t.may_produce("tx", pid, epoch, "a", 0), Ok(()));
        assert_eq!(t.may_produce("tx", pid, epoch, "a", 1), Err(code::INVALID_TXN_STATE), "not added");
        t.first_offset("tx", "a", 0, 41);
        t.add_offsets("tx", pid, epoch, "g", 10).unwrap();
        let o = StagedOffset { topic: "in".into(), partition: 0, offset: 7, leader_epoch: -1, metadata: String::new() };
        t.stage_offsets("tx", pid, epoch, "g", vec![o.clone()]).unwrap();
        let (_, e) = t.end("tx", pid, epoch, true).unwrap();
        let e = e.unwrap();
        assert!(e.commit);
        assert_eq!(e.partitions, vec![(p("a", 0), Some(41)), (p("b", 1), None)]);
        assert_eq!(e.offsets, vec![("g".to_owned(), o)]);
        assert_eq!(t.end("tx", pid, epoch, true), Err(code::CONCURRENT_TRANSACTIONS), "markers not written yet");
        t.completed(&e);
        assert_eq!(t.end("tx", pid, epoch, true).unwrap().1, None, "a retry of the commit is a success");
        assert_eq!(t.end("tx", pid, epoch, false), Err(code::INVALID_TXN_STATE));
    }

    #[test]
    fn a_new_producer_for_the_id_fences_the_old_and_aborts_its_open_transaction() {
        let mut t = Txns::default();
        let (_, (pid, e0, _)) = t.init(Some("tx"), 60_000, None, 0).unwrap();
        t.add_partitions("tx", pid, e0, &[p("a", 0)], 0).unwrap();
        let (_, (pid2, e1, abort)) = t.init(Some("tx"), 60_000, None, 5).unwrap();
        assert_eq!((pid2, e1), (pid, e0 + 1));
        let abort = abort.expect("the open transaction is aborted");
        assert!(!abort.commit);
        assert_eq!(abort.epoch, e1, "markers under the new epoch");
        assert_eq!(t.may_produce("tx", pid, e0, "a", 0), Err(code::INVALID_PRODUCER_EPOCH));
        assert_eq!(t.end("tx", pid, e0, true), Err(code::PRODUCER_FENCED));
        t.completed(&abort);
        t.add_partitions("tx", pid, e1, &[p("a", 0)], 6).unwrap();
    }

    #[test]
    fn transactions_time_out_and_ids_survive_a_replay() {
        let mut t = Txns::default();
        let mut log = Vec::new();
        let (r, (pid, e0, _)) = t.init(Some("tx"), 1_000, None, 0).unwrap();
        log.extend(r);
        let (r, _) = t.add_partitions("tx", pid, e0, &[p("a", 0)], 100).unwrap();
        log.extend(r);
        assert_eq!(t.next_deadline(), Some(1_100));
        let (r, endings) = t.expire(1_101);
        log.extend(r);
        assert_eq!(endings.len(), 1);
        assert_eq!(t.may_produce("tx", pid, e0, "a", 0), Err(code::INVALID_PRODUCER_EPOCH), "fenced");
        let (r, (other, _, _)) = t.init(None, 0, None, 2_000).unwrap();
        log.extend(r);
        let mut back = Txns::default();
        for r in log {
            back.restore(TxnRecord::decode(&r.encode()).unwrap());
        }
        assert_eq!(back.get("tx"), t.get("tx"));
        assert_eq!(back.unfinished().len(), 1, "the timed-out abort is still to be finished");
        let (_, (next, _, _)) = back.init(None, 0, None, 3_000).unwrap();
        assert!(next > other, "no producer id is handed out twice");
        assert!(TxnRecord::decode(b"garbage").is_none());
    }

    #[test]
    fn bad_timeouts_and_unknown_ids_are_refused() {
        let mut t = Txns::default();
        assert_eq!(t.init(Some("tx"), 0, None, 0).unwrap_err(), code::INVALID_TRANSACTION_TIMEOUT);
        assert_eq!(t.init(Some("tx"), MAX_TIMEOUT_MS + 1, None, 0).unwrap_err(), code::INVALID_TRANSACTION_TIMEOUT);
        assert_eq!(t.add_partitions("nope", 1, 0, &[p("a", 0)], 0).unwrap_err(), code::TRANSACTIONAL_ID_NOT_FOUND);
        let (_, (pid, e, _)) = t.init(Some("tx"), 1000, None, 0).unwrap();
        assert_eq!(t.add_partitions("tx", pid + 1, e, &[p("a", 0)], 0).unwrap_err(), code::INVALID_PRODUCER_ID_MAPPING);
        assert_eq!(t.init(Some("tx"), 1000, Some((pid, e + 3)), 0).unwrap_err(), code::PRODUCER_FENCED);
    }
}
