//! Consumers: one connection, one Fetch in flight at a time (as the Java consumer and
//! librdkafka do per broker), every partition of the topic in each Fetch.
//!
//! - [`read`]: from the earliest offset to the end offsets seen at the start, as fast as the
//!   broker answers: a backlog read (from the tail cache, the local segments or, on a node
//!   whose disk lost them, the object store). Batches are CRC-checked, not decoded.
//! - [`tail`]: from the latest offset while producers run ([`super::produce`]), decoding every
//!   record for the send-time stamp in its value: end-to-end latency and what arrived. Paced
//!   producers make it the produce→consume latency at a moderate rate.
//!
//! Counts come from the batch headers (record count, last offset delta), so offsets that a
//! broker skips (gaps) are followed, not waited for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use kafka_protocol::messages::{FetchRequest, TopicName};
use serde::Serialize;

use super::batch;
use super::client::{self, EARLIEST, FetchLimits, KafkaClient, LATEST, Versions};
use super::produce::{ProduceConfig, ProduceProgress, Producers};
use crate::Env;
use crate::flow::per_s;
use crate::histogram::{Histogram, Summary};
use crate::payload::{Clock, Stamp};
use crate::procfs::{Proc, Sample};

/// One consumer's position in every partition of a topic.
pub struct Consumer {
    pub client: KafkaClient,
    topic: TopicName,
    /// (partition, next offset to fetch)
    pub positions: Vec<(i32, i64)>,
    limits: FetchLimits,
    pub records: u64,
    pub bytes: u64,
    pub fetches: u64,
    pub latency: Histogram,
}

impl Consumer {
    /// Connects and places the consumer at `at` ([`EARLIEST`] or [`LATEST`]) of every partition.
    pub async fn connect(env: &Env, topic: &str, at: i64, limits: FetchLimits) -> anyhow::Result<Self> {
        let mut c = KafkaClient::connect(env.addr, &format!("{}-consumer", env.prefix)).await?;
        let partitions = c.partitions(topic).await?;
        let mut positions = Vec::with_capacity(partitions as usize);
        for p in 0..partitions {
            positions.push((p, c.list_offset(topic, p, at).await?));
        }
        Ok(Self {
            client: c,
            topic: client::topic_name(topic),
            positions,
            limits,
            records: 0,
            bytes: 0,
            fetches: 0,
            latency: Histogram::default(),
        })
    }

    pub fn versions(&self) -> Versions {
        self.client.versions
    }

    /// One Fetch and its records. `decode`: read every value's stamp into `latency` (else
    /// only the batches' CRCs are checked). Returns the records it brought.
    pub async fn fetch(&mut self, decode: bool, clock: Clock) -> anyhow::Result<u64> {
        let req = client::fetch_request(&self.topic, &self.positions, self.limits);
        let resp = self.client.call::<FetchRequest>(&req, self.client.versions.fetch).await?;
        self.fetches += 1;
        let now_ns = clock.now_ns();
        let mut got = 0;
        for part in client::fetch_result(&resp)? {
            let Some(pos) = self.positions.iter_mut().find(|(p, _)| *p == part.partition) else { continue };
            for b in batch::split(&part.records)? {
                if b.last_offset < pos.1 {
                    continue;
                }
                let n = b.count_from(pos.1);
                if decode {
                    for v in b.values(pos.1)? {
                        if let Some(s) = Stamp::read(&v).filter(|s| s.sent_ns != 0) {
                            self.latency.record(s.latency_us(now_ns));
                        }
                    }
                } else {
                    b.verify()?;
                }
                got += n;
                self.bytes += b.bytes.len() as u64;
                pos.1 = b.last_offset + 1;
            }
        }
        self.records += got;
        Ok(got)
    }

    /// Whether every partition's position reached `ends` (index = partition; `None`: nothing
    /// to wait for there).
    fn reached(&self, ends: &[Option<i64>]) -> bool {
        self.positions.iter().all(|&(p, at)| ends.get(p as usize).copied().flatten().is_none_or(|end| at >= end))
    }
}

#[derive(Clone, Debug)]
pub struct ReadConfig {
    pub topic: String,
    pub limits: FetchLimits,
    /// The row label (e.g. to tell a read from the object store from a read of local segments).
    pub case: Option<String>,
    /// Seconds after which the read is given up.
    pub max_time: Duration,
}

#[derive(Debug, Serialize)]
pub struct ReadReport {
    pub scenario: &'static str,
    pub case: String,
    pub broker: String,
    pub topic: String,
    pub versions: Versions,
    pub partition_max_bytes: i32,
    /// Records between the earliest and the latest offsets at the start.
    pub expected: u64,
    pub records: u64,
    pub missing: u64,
    pub fetches: u64,
    /// Record batch bytes (values plus their framing).
    pub bytes: u64,
    pub read_s: f64,
    pub records_per_s: f64,
    pub mb_per_s: f64,
    pub broker_cpu_s: Option<f64>,
    pub broker_cpu_us_per_record: Option<f64>,
    pub broker_rss_mib: Option<f64>,
    pub loadgen_cpu_s: Option<f64>,
}

/// Reads a topic from its earliest offsets to the latest ones seen at the start.
pub async fn read(env: &Env, cfg: ReadConfig) -> anyhow::Result<ReadReport> {
    let mut c = Consumer::connect(env, &cfg.topic, EARLIEST, cfg.limits).await?;
    let mut ends = Vec::with_capacity(c.positions.len());
    let mut expected = 0u64;
    for &(p, start) in &c.positions {
        let end = c.client.list_offset(&cfg.topic, p, LATEST).await?;
        expected += (end - start).max(0) as u64;
        ends.push(Some(end));
    }
    eprintln!("{}: reading {expected} records of {} from the earliest offsets", env.label, cfg.topic);
    let broker_before = env.broker.map(Sample::take);
    let own_before = Sample::take(Proc::Own);
    let start = Instant::now();
    let mut last_progress = start;
    while !c.reached(&ends) {
        let now = Instant::now();
        if now.duration_since(start) >= cfg.max_time || now.duration_since(last_progress) >= Duration::from_secs(10) {
            break;
        }
        if c.fetch(false, env.clock).await? > 0 {
            last_progress = Instant::now();
        }
    }
    let secs = last_progress.duration_since(start).as_secs_f64();
    let broker_after = env.broker.map(Sample::take);
    let own_after = Sample::take(Proc::Own);
    let broker_cpu_s = broker_before.zip(broker_after).and_then(|(b, a)| a.cpu_since(&b));
    Ok(ReadReport {
        scenario: "kafka-consume",
        case: cfg.case.clone().unwrap_or_else(|| "consume from offset 0".to_owned()),
        broker: env.label.clone(),
        topic: cfg.topic.clone(),
        versions: c.versions(),
        partition_max_bytes: cfg.limits.partition_max_bytes,
        expected,
        records: c.records,
        missing: expected.saturating_sub(c.records),
        fetches: c.fetches,
        bytes: c.bytes,
        read_s: secs,
        records_per_s: per_s(c.records, secs),
        mb_per_s: per_s(c.bytes, secs) / 1e6,
        broker_cpu_s,
        broker_cpu_us_per_record: broker_cpu_s.filter(|_| c.records > 0).map(|s| s * 1e6 / c.records as f64),
        broker_rss_mib: broker_after.and_then(|s| s.rss_kib).map(|k| k as f64 / 1024.0),
        loadgen_cpu_s: own_after.cpu_since(&own_before),
    })
}

#[derive(Clone, Debug)]
pub struct TailConfig {
    pub produce: ProduceConfig,
    pub limits: FetchLimits,
    /// How long the consumer waits for missing records once producing is over.
    pub grace: Duration,
}

#[derive(Debug, Serialize)]
pub struct TailReport {
    pub scenario: &'static str,
    pub case: String,
    pub broker: String,
    pub topic: String,
    pub producers: usize,
    pub batch: usize,
    pub record_bytes: usize,
    pub rate_target: u64,
    pub versions: Versions,
    pub sent: u64,
    pub acked: u64,
    pub produce_errors: u64,
    pub first_error: Option<String>,
    pub consumed: u64,
    /// Acknowledged records the consumer did not get.
    pub lost: u64,
    pub fetches: u64,
    pub produce_records_per_s: f64,
    /// Records consumed per second (first send to last record).
    pub records_per_s: f64,
    /// Record batch megabytes consumed per second.
    pub mb_per_s: f64,
    /// Send (stamp in the value) to the consumer's read of it.
    pub latency_us: Option<Summary>,
    /// Produce request to response.
    pub ack_latency_us: Option<Summary>,
    pub broker_cpu_s: Option<f64>,
    /// Broker CPU per record produced and consumed.
    pub broker_cpu_us_per_record: Option<f64>,
    pub broker_rss_mib: Option<f64>,
    pub loadgen_cpu_s: Option<f64>,
}

/// Producers and one consumer from the latest offsets, at once.
pub async fn tail(env: &Env, cfg: TailConfig) -> anyhow::Result<TailReport> {
    let producers = Producers::connect(env, &cfg.produce).await?;
    let mut c = Consumer::connect(env, &cfg.produce.topic, LATEST, cfg.limits).await?;
    eprintln!("{}: produce→consume {} on {}", env.label, cfg.produce.case(), env.addr);
    let broker_before = env.broker.map(Sample::take);
    let own_before = Sample::take(Proc::Own);
    let running = producers.start(env.clock, Arc::new(ProduceProgress::default()));
    let start = running.start;
    let mut producing = tokio::spawn(running.finish());
    let hard_stop = start + cfg.produce.duration + cfg.grace + Duration::from_secs(30);
    let mut totals = None;
    let mut done_at: Option<Instant> = None;
    let mut last_record = None;
    let mut idle_since = Instant::now();
    loop {
        if totals.is_none() && producing.is_finished() {
            totals = Some((&mut producing).await.context("producers")??);
            done_at = Some(Instant::now());
        }
        let now = Instant::now();
        if let (Some(t), Some(done)) = (&totals, done_at) {
            let ends: Vec<Option<i64>> = t.end_offsets.clone();
            // Offsets before the consumer's start are not ours: the start positions were
            // the latest offsets before the producers began.
            if c.reached(&ends) || now.duration_since(idle_since.max(done)) >= cfg.grace {
                break;
            }
        }
        if now >= hard_stop {
            break;
        }
        if c.fetch(true, env.clock).await? > 0 {
            last_record = Some(Instant::now());
            idle_since = Instant::now();
        }
    }
    let t = match totals {
        Some(t) => t,
        None => producing.await.context("producers")??,
    };
    let broker_after = env.broker.map(Sample::take);
    let own_after = Sample::take(Proc::Own);
    let secs = last_record.map_or(0.0, |l| l.duration_since(start).as_secs_f64());
    let produce_secs = t.last_ack.map_or(0.0, |l| l.duration_since(start).as_secs_f64());
    let broker_cpu_s = broker_before.zip(broker_after).and_then(|(b, a)| a.cpu_since(&b));
    Ok(TailReport {
        scenario: "kafka-tail",
        case: format!("produce→consume {}", cfg.produce.case()),
        broker: env.label.clone(),
        topic: cfg.produce.topic.clone(),
        producers: cfg.produce.producers,
        batch: cfg.produce.batch,
        record_bytes: cfg.produce.record,
        rate_target: cfg.produce.rate,
        versions: c.versions(),
        sent: t.sent,
        acked: t.acked,
        produce_errors: t.errors,
        first_error: t.first_error,
        consumed: c.records,
        lost: t.acked.saturating_sub(c.records),
        fetches: c.fetches,
        produce_records_per_s: per_s(t.acked, produce_secs),
        records_per_s: per_s(c.records, secs),
        mb_per_s: per_s(c.bytes, secs) / 1e6,
        latency_us: c.latency.summary(),
        ack_latency_us: t.ack_latency.summary(),
        broker_cpu_s,
        broker_cpu_us_per_record: broker_cpu_s.filter(|_| t.acked > 0).map(|s| s * 1e6 / t.acked as f64),
        broker_rss_mib: broker_after.and_then(|s| s.rss_kib).map(|k| k as f64 / 1024.0),
        loadgen_cpu_s: own_after.cpu_since(&own_before),
    })
}
