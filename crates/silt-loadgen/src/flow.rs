//! Fan-in and fan-out: publishers and subscribers connected at once, messages flowing for a
//! fixed time, latency measured at the subscribers from the stamp in each payload.
//!
//! - fan-in: publisher `i` sends to `bench/{i}/t`; subscribers (one by default) hold
//!   `bench/+/t`.
//! - fan-out: every publisher (one by default) sends to `fanout/t`; every subscriber holds it.
//!
//! Subscribers are connected and subscribed before the first message, so every message sent
//! is owed to every subscriber: `expected = sent × subscribers`, and anything short of that
//! when the run ends is reported as `lost`. The run ends when every subscriber has its share,
//! or after `grace` without a delivery, or 20 s after `grace` at the latest.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use silt_mqtt::{Packet, QoS};
use tokio::task::JoinSet;

use crate::Env;
use crate::client::{Client, ConnectOptions, PublishTemplate, connect_many};
use crate::histogram::{Histogram, Summary};
use crate::payload::{Clock, HEADER_LEN, Stamp};
use crate::procfs::{Proc, Sample};
use crate::publisher::{self, Gate, Plan, Progress};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    FanIn,
    FanOut,
}

#[derive(Clone, Debug)]
pub struct FlowConfig {
    pub shape: Shape,
    pub publishers: usize,
    pub subscribers: usize,
    pub qos: QoS,
    pub duration: Duration,
    pub payload: usize,
    pub window: usize,
    /// Most deliveries owed to subscribers (sent × subscribers − delivered) before publishers wait.
    pub max_lag: u64,
    /// Aggregate messages per second across publishers; 0: as fast as delivery allows.
    pub rate: u64,
    /// How long subscribers wait for a missing message once publishing is over.
    pub grace: Duration,
}

impl FlowConfig {
    fn topic(&self, publisher: usize) -> String {
        match self.shape {
            Shape::FanIn => format!("bench/{publisher}/t"),
            Shape::FanOut => "fanout/t".to_owned(),
        }
    }

    fn filter(&self) -> &'static str {
        match self.shape {
            Shape::FanIn => "bench/+/t",
            Shape::FanOut => "fanout/t",
        }
    }

    fn name(&self) -> &'static str {
        match self.shape {
            Shape::FanIn => "fan-in",
            Shape::FanOut => "fan-out",
        }
    }

    /// The row label in reports: shape, connections, QoS and pacing.
    pub fn case(&self) -> String {
        let pace = if self.rate > 0 { format!(" @{}/s", self.rate) } else { String::new() };
        format!("{} {}→{} QoS{}{}", self.name(), self.publishers, self.subscribers, self.qos.as_u8(), pace)
    }
}

#[derive(Debug, Serialize)]
pub struct FlowReport {
    pub scenario: &'static str,
    pub case: String,
    pub broker: String,
    pub qos: u8,
    pub publishers: usize,
    pub subscribers: usize,
    pub connections: usize,
    pub payload_bytes: usize,
    pub duration_s: f64,
    pub rate_target: u64,
    pub sent: u64,
    pub acked: u64,
    pub expected: u64,
    pub delivered: u64,
    pub lost: u64,
    /// Messages published per second (until the last write).
    pub pub_msgs_per_s: f64,
    /// Deliveries per second, summed over subscribers (first send to last delivery).
    pub msgs_per_s: f64,
    /// Delivered payload megabytes (10^6) per second.
    pub mb_per_s: f64,
    /// Publish to delivery.
    pub latency_us: Option<Summary>,
    /// PUBLISH to PUBACK at the publisher (QoS 1).
    pub ack_latency_us: Option<Summary>,
    pub broker_cpu_s: Option<f64>,
    /// Broker CPU per delivered message, in microseconds.
    pub broker_cpu_us_per_msg: Option<f64>,
    pub broker_rss_mib: Option<f64>,
    pub loadgen_cpu_s: Option<f64>,
}

struct Delivered {
    client: Client,
    received: u64,
    bytes: u64,
    last: Option<Instant>,
    latency: Histogram,
}

pub async fn run(env: &Env, cfg: FlowConfig) -> anyhow::Result<FlowReport> {
    anyhow::ensure!(cfg.payload >= HEADER_LEN, "payload must be at least {HEADER_LEN} bytes");
    anyhow::ensure!(cfg.publishers > 0 && cfg.subscribers > 0, "need publishers and subscribers");
    anyhow::ensure!(cfg.window > 0 && cfg.window < usize::from(u16::MAX), "window must be in 1..65535");
    let clock = env.clock;
    let progress = Arc::new(Progress::default());
    let opts = |role: &str, i: usize| ConnectOptions::new(format!("{}-{role}-{i}", env.prefix), env.version);

    let subscribers = connect_many(env.addr, (0..cfg.subscribers).map(|i| opts("sub", i)), 64).await;
    let mut subs = Vec::with_capacity(cfg.subscribers);
    for s in subscribers {
        let (mut client, _) = s.result.context("subscriber")?;
        client.subscribe(cfg.filter(), cfg.qos).await?;
        subs.push(client);
    }
    let publishers = connect_many(env.addr, (0..cfg.publishers).map(|i| opts("pub", i)), 64).await;
    let mut pubs = Vec::with_capacity(cfg.publishers);
    for p in publishers {
        pubs.push(p.result.context("publisher")?.0);
    }
    eprintln!("{}: {} connected to {}, running {:?}", env.label, cfg.case(), env.addr, cfg.duration);

    let broker_before = env.broker.map(Sample::take);
    let own_before = Sample::take(Proc::Own);
    let start = Instant::now();
    // Bounds a broker that trickles deliveries too slowly for `grace` to ever expire.
    let hard_stop = start + cfg.duration + cfg.grace + Duration::from_secs(20);
    let publishing_done = Arc::new(tokio::sync::watch::channel(None::<u64>).0);

    let mut sub_tasks = JoinSet::new();
    for client in subs {
        let progress = progress.clone();
        let done = publishing_done.subscribe();
        let grace = cfg.grace;
        sub_tasks.spawn(receive(client, clock, progress, done, grace, hard_stop));
    }
    let plan = Plan {
        qos: cfg.qos,
        window: cfg.window,
        deadline: start + cfg.duration,
        limit: u64::MAX,
        rate: cfg.rate as f64 / cfg.publishers as f64,
        gate: (cfg.max_lag > 0).then(|| Gate {
            progress: progress.clone(),
            max_lag: cfg.max_lag,
            fanout: cfg.subscribers as u64,
        }),
        ack_timeout: Duration::from_secs(30),
    };
    let mut pub_tasks = JoinSet::new();
    for (i, client) in pubs.into_iter().enumerate() {
        let template = PublishTemplate::new(&cfg.topic(i), cfg.qos, cfg.payload, env.version)?;
        let (plan, progress) = (plan.clone(), progress.clone());
        let index = u32::try_from(i).context("publisher index")?;
        pub_tasks.spawn(async move { publisher::run(client, &template, index, &plan, clock, &progress).await });
    }

    let (mut sent, mut acked, mut last_send, mut ack_latency) = (0, 0, start, Histogram::default());
    let mut clients = Vec::new();
    while let Some(joined) = pub_tasks.join_next().await {
        let o = joined.context("publisher task")??;
        sent += o.sent;
        acked += o.acked;
        last_send = last_send.max(o.last_send.unwrap_or(start));
        ack_latency.merge(&o.ack_latency);
        clients.push(o.client);
    }
    publishing_done.send_replace(Some(sent));

    let (mut delivered, mut bytes, mut last, mut latency) = (0, 0, start, Histogram::default());
    while let Some(joined) = sub_tasks.join_next().await {
        let d = joined.context("subscriber task")??;
        delivered += d.received;
        bytes += d.bytes;
        last = last.max(d.last.unwrap_or(start));
        latency.merge(&d.latency);
        clients.push(d.client);
    }
    let broker_after = env.broker.map(Sample::take);
    let own_after = Sample::take(Proc::Own);
    for c in clients {
        c.disconnect().await;
    }

    let expected = sent * cfg.subscribers as u64;
    let deliver_s = last.duration_since(start).as_secs_f64();
    let broker_cpu_s = broker_before.zip(broker_after).and_then(|(b, a)| a.cpu_since(&b));
    Ok(FlowReport {
        scenario: cfg.name(),
        case: cfg.case(),
        broker: env.label.clone(),
        qos: cfg.qos.as_u8(),
        publishers: cfg.publishers,
        subscribers: cfg.subscribers,
        connections: cfg.publishers + cfg.subscribers,
        payload_bytes: cfg.payload,
        duration_s: cfg.duration.as_secs_f64(),
        rate_target: cfg.rate,
        sent,
        acked,
        expected,
        delivered,
        lost: expected.saturating_sub(delivered),
        pub_msgs_per_s: per_s(sent, last_send.duration_since(start).as_secs_f64()),
        msgs_per_s: per_s(delivered, deliver_s),
        mb_per_s: per_s(bytes, deliver_s) / 1e6,
        latency_us: latency.summary(),
        ack_latency_us: ack_latency.summary(),
        broker_cpu_s,
        broker_cpu_us_per_msg: broker_cpu_s.filter(|_| delivered > 0).map(|s| s * 1e6 / delivered as f64),
        broker_rss_mib: broker_after.and_then(|s| s.rss_kib).map(|k| k as f64 / 1024.0),
        loadgen_cpu_s: own_after.cpu_since(&own_before),
    })
}

pub fn per_s(count: u64, seconds: f64) -> f64 {
    if seconds > 0.0 { count as f64 / seconds } else { 0.0 }
}

/// Reads deliveries (acknowledging QoS 1 ones) until this subscriber has every message sent,
/// or nothing arrived for `grace` after publishing ended, or `hard_stop`.
async fn receive(
    mut client: Client,
    clock: Clock,
    progress: Arc<Progress>,
    done: tokio::sync::watch::Receiver<Option<u64>>,
    grace: Duration,
    hard_stop: Instant,
) -> anyhow::Result<Delivered> {
    let (mut received, mut bytes, mut last) = (0u64, 0u64, None);
    let mut latency = Histogram::default();
    let mut idle_since = Instant::now();
    let mut done_at = None;
    loop {
        let now = Instant::now();
        if let Some(total) = *done.borrow() {
            // The grace period starts at the last delivery or when publishing ended, if later.
            let waiting_since = idle_since.max(*done_at.get_or_insert(now));
            if received >= total || now.duration_since(waiting_since) >= grace {
                break;
            }
        }
        if now >= hard_stop {
            break;
        }
        match tokio::time::timeout(Duration::from_millis(100), client.fill()).await {
            Err(_) => continue,
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => anyhow::bail!("broker closed the subscriber connection"),
            Ok(Err(e)) => return Err(e.into()),
        }
        let now_ns = clock.now_ns();
        let mut n = 0u64;
        while let Some(packet) = client.try_next()? {
            let Packet::Publish(p) = packet else { continue };
            if let Some(stamp) = Stamp::read(&p.payload) {
                latency.record(stamp.latency_us(now_ns));
            }
            bytes += p.payload.len() as u64;
            n += 1;
            if let Some(id) = p.packet_id {
                client.queue_puback(id)?;
            }
        }
        if n > 0 {
            received += n;
            progress.delivered.fetch_add(n, Ordering::Relaxed);
            last = Some(clock.instant(now_ns));
            idle_since = Instant::now();
            client.flush().await?;
        }
    }
    Ok(Delivered { client, received, bytes, last, latency })
}
