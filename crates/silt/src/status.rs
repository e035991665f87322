//! The status page on the admin listener: `/api/status`, the node's figures as one JSON
//! document, and `/`, a page (compiled into the binary, no network needed) that draws them and
//! fetches them again every 5 s.
//!
//! The figures are the ones `/metrics` reads, plus what labels there must never carry: client
//! ids of the sessions with the largest backlogs, consumer groups by name. The listener is
//! loopback or authenticated by its operator, like `/metrics`.
//!
//! [`History`] keeps the last ten minutes of throughput and ack latency, sampled every 5 s by
//! [`sample_every`], so the page has charts as soon as it loads. Not guaranteed: sessions'
//! backlogs are the ones `$SYS` last published (every `mqtt.sys_interval_secs`), and a stream's
//! bytes are its records' bytes in uploaded segments (`silt_tiering::sizes`): the tail not yet
//! uploaded, and framing, are shown apart as `streams_other`, attributed to no stream.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use silt_types::latency::HistogramSnapshot;

use crate::metrics::Sources;

/// The page: markup, script and style, served as one document.
pub const INDEX_HTML: &str = include_str!("status/index.html");
pub const STATUS_JS: &str = include_str!("status/status.js");
pub const STATUS_CSS: &str = include_str!("status/status.css");

/// How often [`sample_every`] samples, and how many samples [`History`] keeps (10 minutes).
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
const HISTORY_LEN: usize = 120;

/// Most sessions and consumer-group partitions `/api/status` lists.
const TOP_SESSIONS: usize = 10;
const MAX_GROUP_LAGS: usize = 100;

/// One sample: totals since start (the page derives rates from neighbours) and the p99 of the
/// acknowledgements in the interval before it.
#[derive(Clone, Debug, PartialEq)]
struct Sample {
    unix_ms: u64,
    messages_in: u64,
    messages_out: u64,
    ack_p99_ms: Option<f64>,
}

/// The last [`HISTORY_LEN`] samples, oldest first. The lock is held only to copy.
#[derive(Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
    /// The ack histogram at the last sample, for the next interval's p99.
    last_acks: Mutex<Option<HistogramSnapshot>>,
}

impl History {
    fn push(&self, s: Sample) {
        let mut q = self.samples.lock().expect("invariant: lock not poisoned");
        if q.len() == HISTORY_LEN {
            q.pop_front();
        }
        q.push_back(s);
    }

    fn to_json(&self) -> Value {
        let q = self.samples.lock().expect("invariant: lock not poisoned");
        q.iter()
            .map(|s| {
                json!({"unix_ms": s.unix_ms, "messages_in": s.messages_in, "messages_out": s.messages_out,
                       "ack_p99_ms": s.ack_p99_ms})
            })
            .collect()
    }

    /// Takes one sample from `src` (cheap: counters and histograms, no I/O).
    fn sample(&self, src: &Sources) {
        let (mut messages_in, mut messages_out) = (0, 0);
        let mut acks = HistogramSnapshot::default();
        if let Some(b) = src.broker.upgrade() {
            messages_in += b.stats.messages_received.load(Relaxed);
            messages_out += b.stats.messages_sent.load(Relaxed);
            acks = acks.merged(&b.stats.ack_latency.snapshot());
        }
        if let Some(k) = src.kafka.as_ref().and_then(Weak::upgrade) {
            messages_in += k.stats.records_received.load(Relaxed);
            messages_out += k.stats.records_sent.load(Relaxed);
            acks = acks.merged(&k.stats.produce_latency.snapshot());
        }
        let interval = {
            let mut last = self.last_acks.lock().expect("invariant: lock not poisoned");
            let interval = last.as_ref().map_or_else(|| acks.clone(), |l| acks.since(l));
            *last = Some(acks);
            interval
        };
        let ack_p99_ms = interval.quantile(0.99).map(|s| s * 1e3);
        self.push(Sample { unix_ms: unix_ms(), messages_in, messages_out, ack_p99_ms });
    }
}

/// Samples into `history` every [`SAMPLE_INTERVAL`] once the node's parts are up (`sources`
/// set). Runs until dropped (aborted by the admin listener).
pub async fn sample_every(history: &History, sources: &OnceLock<Sources>) {
    let src = loop {
        match sources.get() {
            Some(src) => break src,
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    // The first tick is at once: a page loaded just after start has a first point.
    let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        history.sample(src);
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `{count, p50_ms, p99_ms}` of a histogram.
fn latency(h: &HistogramSnapshot) -> Value {
    let ms = |q| h.quantile(q).map(|s| s * 1e3);
    json!({"count": h.count, "p50_ms": ms(0.5), "p99_ms": ms(0.99)})
}

/// The node as `/api/status` and the admin API's Status show it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NodeInfo {
    pub id: String,
    pub epoch: u64,
    pub version: &'static str,
    pub uptime_secs: u64,
    pub object_store: String,
}

pub fn node(src: &Sources) -> NodeInfo {
    NodeInfo {
        id: src.tiering.node_id().to_owned(),
        epoch: src.tiering.stats().epoch,
        version: env!("CARGO_PKG_VERSION"),
        uptime_secs: src.started.elapsed().as_secs(),
        object_store: src.tiering.describe(),
    }
}

/// A stream and the policy its name resolves to, as `/api/status` and the admin API's
/// ListStreams show it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StreamInfo {
    pub name: String,
    pub partitions: u32,
    pub created_ms: i64,
    /// The policy's spelling in `[[topics]]` ("object", "local", ...).
    pub tier: String,
    pub ack: String,
    pub retention_ms: u64,
    pub retention_bytes: u64,
    pub lakehouse_table: Option<String>,
    /// Record bytes of uploaded segments still on the local disk, and in the bucket.
    pub local_bytes: u64,
    pub bucket_bytes: u64,
}

/// Every stream, by name.
pub fn stream_infos(src: &Sources, broker: &silt_broker::Broker) -> Vec<StreamInfo> {
    let policies = src.tiering.policies();
    let spelling = |v: Value| v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
    let sizes = src.tiering.stream_sizes();
    let mut out: Vec<StreamInfo> = broker
        .appender()
        .streams()
        .list()
        .into_iter()
        .map(|(name, meta)| {
            let p = policies.for_topic(&name);
            let size = sizes.streams.get(&name).copied().unwrap_or_default();
            StreamInfo {
                local_bytes: size.local,
                bucket_bytes: size.bucket,
                partitions: meta.partitions,
                created_ms: meta.created_ms,
                tier: spelling(serde_json::to_value(p.tier).unwrap_or_default()),
                ack: spelling(serde_json::to_value(p.ack).unwrap_or_default()),
                retention_ms: p.retention_ms,
                retention_bytes: p.retention_bytes,
                lakehouse_table: p.lakehouse.as_ref().map(|t| t.table.clone()),
                name,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The document `/api/status` answers. Blocking (reads the index for consumer-group lag): call
/// it off the async runtime.
pub fn collect(src: &Sources, listeners: &[(String, String)], history: &History) -> Value {
    let t = src.tiering.stats();
    let mut node = serde_json::to_value(node(src)).unwrap_or_default();
    node["unix_ms"] = json!(unix_ms());
    let listeners: Vec<Value> =
        listeners.iter().map(|(protocol, addr)| json!({"protocol": protocol, "address": addr})).collect();
    let mut totals = serde_json::Map::new();
    let mut latencies = serde_json::Map::new();
    let mut sessions = json!(null);
    let mut streams = Vec::new();
    if let Some(b) = src.broker.upgrade() {
        let st = &b.stats;
        totals.insert(
            "mqtt".into(),
            json!({
                "messages_in": st.messages_received.load(Relaxed),
                "messages_out": st.messages_sent.load(Relaxed),
                "bytes_in": st.bytes_received.load(Relaxed),
                "bytes_out": st.bytes_sent.load(Relaxed),
                "connections": st.connections.load(Relaxed),
                "connects": st.connects.load(Relaxed),
            }),
        );
        latencies.insert("mqtt_ack".into(), latency(&st.ack_latency.snapshot()));
        let (_, backlog, _) = b.backlog_summary();
        let top: Vec<Value> = b
            .largest_backlogs(TOP_SESSIONS)
            .into_iter()
            .map(|(client_id, backlog)| json!({"client_id": client_id, "backlog": backlog}))
            .collect();
        sessions = json!({"total": b.session_count(), "backlog": backlog, "largest": top});
        streams.extend(stream_infos(src, &b).into_iter().map(|s| serde_json::to_value(s).unwrap_or_default()));
    }
    let other = src.tiering.stream_sizes().other;
    let streams_other = json!({"local_bytes": other.local, "bucket_bytes": other.bucket});
    let mut groups = Vec::new();
    if let Some(k) = src.kafka.as_ref().and_then(Weak::upgrade) {
        let st = &k.stats;
        totals.insert(
            "kafka".into(),
            json!({
                "messages_in": st.records_received.load(Relaxed),
                "messages_out": st.records_sent.load(Relaxed),
                "bytes_in": st.bytes_received.load(Relaxed),
                "bytes_out": st.bytes_sent.load(Relaxed),
                "connections": st.connections.load(Relaxed),
                "connects": st.connects.load(Relaxed),
            }),
        );
        latencies.insert("kafka_produce".into(), latency(&st.produce_latency.snapshot()));
        match k.group_lags(MAX_GROUP_LAGS) {
            Ok(lags) => groups.extend(lags.into_iter().map(|l| {
                json!({"group": l.group, "topic": l.topic, "partition": l.partition,
                       "committed": l.committed, "end": l.end, "lag": l.lag})
            })),
            Err(e) => tracing::warn!(error = %e, "consumer group lag could not be read for /api/status"),
        }
    }
    let s = src.storage.stats();
    latencies.insert("log_append".into(), latency(&s.append_latency));
    latencies.insert("log_fsync".into(), latency(&s.fsync_latency));
    let storage = json!({
        "log_bytes": s.log_end.get() - s.log_start.get(),
        "log_end": s.log_end.get(),
        "segments": s.segments,
        "dispatch_lag_bytes": s.log_end.get().saturating_sub(s.dispatched.get()),
        "tail_cache_bytes": s.tail_cache_bytes,
        "index_sst_bytes": s.index_sst_bytes,
        "quarantined_batches": s.quarantined_batches,
    });
    let tiering = json!({
        "epoch": t.epoch,
        "fenced": t.fenced,
        "upload_lag_bytes": t.upload_lag_bytes,
        "upload_lag_seconds": t.upload_lag_seconds,
        "objects": t.objects,
        "uploads": t.puts,
        "uploaded_bytes": t.put_bytes,
        "deleted_objects": t.deleted_objects,
        "upload_failures": t.upload_failures,
        "block_cache_hit_ratio": t.cache_hit_ratio,
    });
    let lakehouse: Vec<Value> = src
        .lakehouse
        .get()
        .and_then(Weak::upgrade)
        .map(|l| l.figures())
        .unwrap_or_default()
        .into_iter()
        .map(|f| {
            json!({"name": f.name, "rows": f.rows, "commits": f.commits, "commit_failures": f.commit_failures,
                   "files": f.files, "compactions": f.compactions, "lag_ms": f.lag_ms,
                   "holding_retention": f.holding_retention, "fenced": f.fenced})
        })
        .collect();
    json!({
        "node": node,
        "listeners": listeners,
        "totals": totals,
        "latency": latencies,
        "storage": storage,
        "streams": streams,
        "streams_other": streams_other,
        "sessions": sessions,
        "consumer_groups": groups,
        "tiering": tiering,
        "lakehouse": lakehouse,
        "history": history.to_json(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_keeps_ten_minutes() {
        let h = History::default();
        for i in 0..(HISTORY_LEN as u64 + 5) {
            h.push(Sample { unix_ms: i, messages_in: i, messages_out: 0, ack_p99_ms: None });
        }
        let v = h.to_json();
        let samples = v.as_array().expect("an array");
        assert_eq!(samples.len(), HISTORY_LEN);
        assert_eq!(samples[0]["unix_ms"], 5);
    }
}
