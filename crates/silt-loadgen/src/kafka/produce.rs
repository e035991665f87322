//! Producers: each its own connection, sending one record batch per Produce request with a
//! window of requests in flight (the Java client's `max.in.flight.requests.per.connection`),
//! and the produce scenario that runs N of them for a fixed time or record count.
//!
//! Full speed means as fast as the broker acknowledges: a producer sends while its window has
//! room, so what is measured is acknowledged records, not what a broker buffered. Paced
//! producers (`rate`) stamp every record with its send time for the consumer's latency;
//! unpaced ones stamp only the first record of each batch and share one buffer for the rest,
//! so the generator's CPU stays out of the figures.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use kafka_protocol::messages::{ProduceRequest, TopicName};
use serde::Serialize;
use tokio::task::JoinSet;

use super::batch;
use super::client::{self, KafkaClient, Versions};
use crate::Env;
use crate::flow::per_s;
use crate::histogram::{Histogram, Summary};
use crate::payload::{Clock, HEADER_LEN, Stamp};
use crate::procfs::{Proc, Sample};

/// What the producers of a run send.
#[derive(Clone, Debug)]
pub struct ProduceConfig {
    pub topic: String,
    /// Partitions the topic is created with (if it does not exist); producer `i` writes to
    /// partition `i % partitions`.
    pub partitions: i32,
    pub producers: usize,
    /// Records per batch (one batch per request).
    pub batch: usize,
    /// Bytes of each record's value.
    pub record: usize,
    /// Produce requests in flight per producer.
    pub window: usize,
    /// -1 (all), 1 or 0.
    pub acks: i16,
    /// No request is sent after this long.
    pub duration: Duration,
    /// Records to send in all (0: no limit but the duration).
    pub records: u64,
    /// Records per second over all producers (0: as fast as acknowledged).
    pub rate: u64,
}

impl ProduceConfig {
    /// The row label: producers, batch shape, acks and pacing.
    pub fn case(&self) -> String {
        let pace = if self.rate > 0 { format!(" @{}/s", self.rate) } else { String::new() };
        let size = if self.record.is_multiple_of(1024) {
            format!("{} KiB", self.record / 1024)
        } else {
            format!("{} B", self.record)
        };
        let acks = if self.acks == -1 { "all".to_owned() } else { self.acks.to_string() };
        format!("{}p × batch {} × {size} acks={acks}{pace}", self.producers, self.batch)
    }

    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.producers > 0 && self.partitions > 0, "need a producer and a partition");
        anyhow::ensure!(self.batch > 0 && self.window > 0, "batch and window must be at least 1");
        anyhow::ensure!(self.record >= HEADER_LEN, "records must be at least {HEADER_LEN} bytes (the stamp)");
        anyhow::ensure!((-1..=1).contains(&self.acks), "acks must be -1, 0 or 1");
        Ok(())
    }
}

/// What one producer did.
pub struct Produced {
    pub client: KafkaClient,
    pub partition: i32,
    pub sent: u64,
    pub acked: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// One past the highest offset acknowledged (base offset + records), if any.
    pub end_offset: Option<i64>,
    pub last_ack: Option<Instant>,
    pub ack_latency: Histogram,
}

/// Records acknowledged so far by every producer of a run (for consumers to follow).
#[derive(Debug, Default)]
pub struct ProduceProgress {
    pub acked: AtomicU64,
}

struct Plan {
    topic: TopicName,
    partition: i32,
    index: u32,
    batch: usize,
    record: usize,
    window: usize,
    acks: i16,
    deadline: Instant,
    limit: u64,
    /// Records per second of this producer; 0: unpaced.
    rate: f64,
    ack_timeout: Duration,
}

/// Runs one producer on `client` until its plan says stop and its window is empty.
async fn run_one(
    mut client: KafkaClient,
    plan: Plan,
    clock: Clock,
    progress: Arc<ProduceProgress>,
) -> anyhow::Result<Produced> {
    let version = client.versions.produce;
    let shared = Bytes::from(vec![0u8; plan.record]);
    let start = Instant::now();
    let mut inflight: VecDeque<(u64, u64)> = VecDeque::with_capacity(plan.window); // (sent ns, records)
    let (mut sent, mut acked, mut errors) = (0u64, 0u64, 0u64);
    let mut first_error = None;
    let mut end_offset = None;
    let mut last_ack = None;
    let mut ack_latency = Histogram::default();
    let mut sending_over_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let sending = now < plan.deadline && sent < plan.limit;
        if !sending {
            let over = *sending_over_at.get_or_insert(now);
            if inflight.is_empty() || now >= over + plan.ack_timeout {
                break;
            }
        }
        let mut queued = false;
        while sending && inflight.len() < plan.window && sent < plan.limit {
            let mut n = (plan.batch as u64).min(plan.limit - sent);
            if plan.rate > 0.0 {
                let allowed = (Instant::now().duration_since(start).as_secs_f64() * plan.rate) as u64 + 1;
                n = n.min(allowed.saturating_sub(sent));
                if n == 0 {
                    break;
                }
            }
            let sent_ns = clock.now_ns();
            let values: Vec<Bytes> = (0..n)
                .map(|i| {
                    if i == 0 || plan.rate > 0.0 {
                        batch::stamped_value(plan.record, &Stamp { sent_ns, publisher: plan.index, seq: sent + i })
                    } else {
                        shared.clone()
                    }
                })
                .collect();
            let records = batch::encode(&values, None, wall_clock_ms())?;
            client.send(&client::produce_request(&plan.topic, plan.partition, records, plan.acks), version)?;
            sent += n;
            queued = true;
            if plan.acks == 0 {
                acked += n;
                progress.acked.fetch_add(n, Ordering::Relaxed);
            } else {
                inflight.push_back((sent_ns, n));
            }
        }
        if queued {
            client.flush().await?;
        }
        if plan.acks == 0 {
            // Nothing comes back: the next batch goes when the rate allows.
            if sending && plan.rate > 0.0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            } else {
                tokio::task::yield_now().await;
            }
            continue;
        }
        if inflight.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        // Wait for a response; paced producers also wake to send the next batch on time.
        let wait = if plan.rate > 0.0 && inflight.len() < plan.window && sending {
            Duration::from_millis(1)
        } else {
            Duration::from_millis(200)
        };
        let resp = match tokio::time::timeout(wait, client.recv::<ProduceRequest>()).await {
            Err(_) => continue,
            Ok(r) => r?,
        };
        let (sent_ns, n) = inflight.pop_front().expect("invariant: a response answers a request in flight");
        match client::produce_result(&resp) {
            Ok(base) => {
                acked += n;
                progress.acked.fetch_add(n, Ordering::Relaxed);
                end_offset = Some(end_offset.unwrap_or(0).max(base + n as i64));
                let now_ns = clock.now_ns();
                ack_latency.record(now_ns.saturating_sub(sent_ns) / 1_000);
                last_ack = Some(clock.instant(now_ns));
            }
            Err(e) => {
                errors += n;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
    Ok(Produced {
        client,
        partition: plan.partition,
        sent,
        acked,
        errors,
        first_error,
        end_offset,
        last_ack,
        ack_latency,
    })
}

/// Milliseconds since the Unix epoch, for record timestamps.
fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Producers connected and ready, started by [`Producers::start`].
pub struct Producers {
    clients: Vec<KafkaClient>,
    cfg: ProduceConfig,
    pub versions: Versions,
}

/// The producers' outcome, summed.
pub struct ProduceTotals {
    pub sent: u64,
    pub acked: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// One past the highest offset acknowledged, per partition (index = partition).
    pub end_offsets: Vec<Option<i64>>,
    pub last_ack: Option<Instant>,
    pub ack_latency: Histogram,
}

impl Producers {
    /// Creates the topic if needed and connects every producer.
    pub async fn connect(env: &Env, cfg: &ProduceConfig) -> anyhow::Result<Self> {
        cfg.validate()?;
        let mut admin = KafkaClient::connect(env.addr, &format!("{}-admin", env.prefix)).await?;
        let partitions = admin.ensure_topic(&cfg.topic, cfg.partitions).await?;
        anyhow::ensure!(
            partitions >= cfg.partitions,
            "topic {} has {partitions} partitions, {} asked for",
            cfg.topic,
            cfg.partitions
        );
        let versions = admin.versions;
        let mut clients = Vec::with_capacity(cfg.producers);
        for i in 0..cfg.producers {
            clients.push(KafkaClient::connect(env.addr, &format!("{}-producer-{i}", env.prefix)).await?);
        }
        Ok(Self { clients, cfg: cfg.clone(), versions })
    }

    /// Starts sending now; [`Running::finish`] waits for every producer.
    pub fn start(self, clock: Clock, progress: Arc<ProduceProgress>) -> Running {
        let cfg = self.cfg;
        let start = Instant::now();
        let mut tasks = JoinSet::new();
        let n = cfg.producers as u64;
        for (i, client) in self.clients.into_iter().enumerate() {
            // The record limit shared out, the first producers taking the remainder.
            let limit =
                if cfg.records == 0 { u64::MAX } else { cfg.records / n + u64::from((i as u64) < cfg.records % n) };
            let plan = Plan {
                topic: client::topic_name(&cfg.topic),
                partition: i as i32 % cfg.partitions,
                index: i as u32,
                batch: cfg.batch,
                record: cfg.record,
                window: cfg.window,
                acks: cfg.acks,
                deadline: start + cfg.duration,
                limit,
                rate: cfg.rate as f64 / n as f64,
                ack_timeout: Duration::from_secs(30),
            };
            tasks.spawn(run_one(client, plan, clock, progress.clone()));
        }
        Running { tasks, partitions: cfg.partitions, start }
    }
}

pub struct Running {
    tasks: JoinSet<anyhow::Result<Produced>>,
    partitions: i32,
    pub start: Instant,
}

impl Running {
    pub async fn finish(mut self) -> anyhow::Result<ProduceTotals> {
        let mut t = ProduceTotals {
            sent: 0,
            acked: 0,
            errors: 0,
            first_error: None,
            end_offsets: vec![None; self.partitions as usize],
            last_ack: None,
            ack_latency: Histogram::default(),
        };
        let mut clients = Vec::new();
        while let Some(joined) = self.tasks.join_next().await {
            let p = joined.context("producer task")??;
            t.sent += p.sent;
            t.acked += p.acked;
            t.errors += p.errors;
            if t.first_error.is_none() {
                t.first_error = p.first_error;
            }
            if let Some(end) = p.end_offset {
                let slot = &mut t.end_offsets[p.partition as usize];
                *slot = Some(slot.unwrap_or(0).max(end));
            }
            t.last_ack = t.last_ack.max(p.last_ack);
            t.ack_latency.merge(&p.ack_latency);
            clients.push(p.client);
        }
        drop(clients);
        Ok(t)
    }
}

#[derive(Debug, Serialize)]
pub struct ProduceReport {
    pub scenario: &'static str,
    pub case: String,
    pub broker: String,
    pub topic: String,
    pub producers: usize,
    pub partitions: i32,
    pub batch: usize,
    pub record_bytes: usize,
    pub window: usize,
    pub acks: i16,
    pub rate_target: u64,
    pub versions: Versions,
    pub sent: u64,
    pub acked: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Acknowledged records per second (first send to last acknowledgement).
    pub records_per_s: f64,
    /// Acknowledged value megabytes (10^6) per second.
    pub mb_per_s: f64,
    /// Produce request to its response.
    pub ack_latency_us: Option<Summary>,
    pub broker_cpu_s: Option<f64>,
    pub broker_cpu_us_per_record: Option<f64>,
    pub broker_rss_mib: Option<f64>,
    pub loadgen_cpu_s: Option<f64>,
}

/// Runs the producers of `cfg`; `case` labels the result line.
pub async fn run(env: &Env, cfg: ProduceConfig, case: String) -> anyhow::Result<ProduceReport> {
    let producers = Producers::connect(env, &cfg).await?;
    let versions = producers.versions;
    eprintln!("{}: produce {} to {} ({:?})", env.label, cfg.case(), env.addr, versions);
    let broker_before = env.broker.map(Sample::take);
    let own_before = Sample::take(Proc::Own);
    let running = producers.start(env.clock, Arc::default());
    let start = running.start;
    let t = running.finish().await?;
    let broker_after = env.broker.map(Sample::take);
    let own_after = Sample::take(Proc::Own);
    let secs = t.last_ack.map_or(0.0, |l| l.duration_since(start).as_secs_f64());
    let broker_cpu_s = broker_before.zip(broker_after).and_then(|(b, a)| a.cpu_since(&b));
    Ok(ProduceReport {
        scenario: "kafka-produce",
        case,
        broker: env.label.clone(),
        topic: cfg.topic.clone(),
        producers: cfg.producers,
        partitions: cfg.partitions,
        batch: cfg.batch,
        record_bytes: cfg.record,
        window: cfg.window,
        acks: cfg.acks,
        rate_target: cfg.rate,
        versions,
        sent: t.sent,
        acked: t.acked,
        errors: t.errors,
        first_error: t.first_error,
        records_per_s: per_s(t.acked, secs),
        mb_per_s: per_s(t.acked * cfg.record as u64, secs) / 1e6,
        ack_latency_us: t.ack_latency.summary(),
        broker_cpu_s,
        broker_cpu_us_per_record: broker_cpu_s.filter(|_| t.acked > 0).map(|s| s * 1e6 / t.acked as f64),
        broker_rss_mib: broker_after.and_then(|s| s.rss_kib).map(|k| k as f64 / 1024.0),
        loadgen_cpu_s: own_after.cpu_since(&own_before),
    })
}
