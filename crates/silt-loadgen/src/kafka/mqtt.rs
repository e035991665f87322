//! MQTT publish → Kafka fetch: MQTT publishers on `{topic}/{i}/t` (QoS 1, paced), one Kafka
//! consumer on the Kafka topic `{topic}` (the MQTT topic's first level, Silt's default
//! routing rule) from its latest offsets. The latency is from the stamp in each MQTT payload
//! to the Fetch response that carried it; the PUBACK latency is the MQTT side's.
//!
//! Only a broker that serves one dataset through both protocols (Silt) can run it: there is
//! no reference broker for this row.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use silt_mqtt::QoS;
use tokio::task::JoinSet;

use super::client::{FetchLimits, KafkaClient, LATEST, Versions};
use super::consume::Consumer;
use crate::Env;
use crate::client::{ConnectOptions, PublishTemplate, connect_many};
use crate::flow::per_s;
use crate::histogram::{Histogram, Summary};
use crate::payload::HEADER_LEN;
use crate::procfs::{Proc, Sample};
use crate::publisher::{self, Plan, Progress};

#[derive(Clone, Debug)]
pub struct MqttKafkaConfig {
    /// The broker's MQTT listener (the Kafka one is the target address).
    pub mqtt: SocketAddr,
    /// First level of the MQTT topics, and so the Kafka topic read.
    pub topic: String,
    pub publishers: usize,
    pub qos: QoS,
    pub payload: usize,
    pub window: usize,
    /// MQTT publishes per second over all publishers (0: as fast as acknowledged).
    pub rate: u64,
    pub duration: Duration,
    pub limits: FetchLimits,
    pub grace: Duration,
}

impl MqttKafkaConfig {
    pub fn case(&self) -> String {
        let pace = if self.rate > 0 { format!(" @{}/s", self.rate) } else { String::new() };
        format!("MQTT publish → Kafka fetch {}p QoS{} {} B{pace}", self.publishers, self.qos.as_u8(), self.payload)
    }
}

#[derive(Debug, Serialize)]
pub struct MqttKafkaReport {
    pub scenario: &'static str,
    pub case: String,
    pub broker: String,
    pub topic: String,
    pub publishers: usize,
    pub qos: u8,
    pub payload_bytes: usize,
    pub rate_target: u64,
    pub versions: Versions,
    pub sent: u64,
    pub acked: u64,
    pub consumed: u64,
    pub lost: u64,
    pub fetches: u64,
    pub pub_msgs_per_s: f64,
    pub records_per_s: f64,
    pub mb_per_s: f64,
    /// MQTT send (payload stamp) to the Kafka consumer's read.
    pub latency_us: Option<Summary>,
    /// PUBLISH to PUBACK (QoS 1).
    pub ack_latency_us: Option<Summary>,
    pub broker_cpu_s: Option<f64>,
    pub broker_cpu_us_per_record: Option<f64>,
    pub broker_rss_mib: Option<f64>,
    pub loadgen_cpu_s: Option<f64>,
}

pub async fn run(env: &Env, cfg: MqttKafkaConfig) -> anyhow::Result<MqttKafkaReport> {
    anyhow::ensure!(cfg.payload >= HEADER_LEN, "payload must be at least {HEADER_LEN} bytes");
    anyhow::ensure!(cfg.publishers > 0, "need a publisher");
    anyhow::ensure!(cfg.window > 0 && cfg.window < usize::from(u16::MAX), "window must be in 1..65535");
    // The stream exists before the consumer asks for its latest offsets.
    KafkaClient::connect(env.addr, &format!("{}-admin", env.prefix)).await?.ensure_topic(&cfg.topic, 1).await?;
    let mut c = Consumer::connect(env, &cfg.topic, LATEST, cfg.limits).await?;
    let opts = |i: usize| ConnectOptions::new(format!("{}-mqtt-pub-{i}", env.prefix), env.version);
    let mut pubs = Vec::with_capacity(cfg.publishers);
    for a in connect_many(cfg.mqtt, (0..cfg.publishers).map(opts), 64).await {
        pubs.push(a.result.context("MQTT publisher")?.0);
    }
    eprintln!("{}: {} (MQTT {}, Kafka {})", env.label, cfg.case(), cfg.mqtt, env.addr);
    let broker_before = env.broker.map(Sample::take);
    let own_before = Sample::take(Proc::Own);
    let start = Instant::now();
    let plan = Plan {
        qos: cfg.qos,
        window: cfg.window,
        deadline: start + cfg.duration,
        limit: u64::MAX,
        rate: cfg.rate as f64 / cfg.publishers as f64,
        gate: None,
        ack_timeout: Duration::from_secs(30),
    };
    let progress = Arc::new(Progress::default());
    let mut tasks = JoinSet::new();
    for (i, client) in pubs.into_iter().enumerate() {
        let template = PublishTemplate::new(&format!("{}/{i}/t", cfg.topic), cfg.qos, cfg.payload, env.version)?;
        let (plan, progress, clock) = (plan.clone(), progress.clone(), env.clock);
        let index = u32::try_from(i).context("publisher index")?;
        tasks.spawn(async move { publisher::run(client, &template, index, &plan, clock, &progress).await });
    }
    let hard_stop = start + cfg.duration + cfg.grace + Duration::from_secs(30);
    let mut outcome: Option<(u64, u64, Option<Instant>, Histogram)> = None;
    let mut done_at = None;
    let mut idle_since = Instant::now();
    let mut last_record = None;
    let mut clients = Vec::new();
    loop {
        while let Some(joined) = tasks.try_join_next() {
            let o = joined.context("publisher task")??;
            let acc = outcome.get_or_insert((0, 0, None, Histogram::default()));
            acc.0 += o.sent;
            acc.1 += o.acked;
            acc.2 = acc.2.max(o.last_send);
            acc.3.merge(&o.ack_latency);
            clients.push(o.client);
            if tasks.is_empty() {
                done_at = Some(Instant::now());
            }
        }
        let now = Instant::now();
        if let (Some(o), Some(done)) = (&outcome, done_at)
            && tasks.is_empty()
            && (c.records >= o.1 || now.duration_since(idle_since.max(done)) >= cfg.grace)
        {
            break;
        }
        if now >= hard_stop {
            break;
        }
        if c.fetch(true, env.clock).await? > 0 {
            last_record = Some(Instant::now());
            idle_since = Instant::now();
        }
    }
    tasks.abort_all();
    let (sent, acked, last_send, ack_latency) = outcome.unwrap_or((0, 0, None, Histogram::default()));
    let broker_after = env.broker.map(Sample::take);
    let own_after = Sample::take(Proc::Own);
    for client in clients {
        client.disconnect().await;
    }
    let secs = last_record.map_or(0.0, |l| l.duration_since(start).as_secs_f64());
    let pub_secs = last_send.map_or(0.0, |l| l.duration_since(start).as_secs_f64());
    let broker_cpu_s = broker_before.zip(broker_after).and_then(|(b, a)| a.cpu_since(&b));
    Ok(MqttKafkaReport {
        scenario: "mqtt-kafka",
        case: cfg.case(),
        broker: env.label.clone(),
        topic: cfg.topic.clone(),
        publishers: cfg.publishers,
        qos: cfg.qos.as_u8(),
        payload_bytes: cfg.payload,
        rate_target: cfg.rate,
        versions: c.versions(),
        sent,
        acked,
        consumed: c.records,
        lost: acked.saturating_sub(c.records),
        fetches: c.fetches,
        pub_msgs_per_s: per_s(sent, pub_secs),
        records_per_s: per_s(c.records, secs),
        mb_per_s: per_s(c.bytes, secs) / 1e6,
        latency_us: c.latency.summary(),
        ack_latency_us: ack_latency.summary(),
        broker_cpu_s,
        broker_cpu_us_per_record: broker_cpu_s.filter(|_| acked > 0).map(|s| s * 1e6 / acked as f64),
        broker_rss_mib: broker_after.and_then(|s| s.rss_kib).map(|k| k as f64 / 1024.0),
        loadgen_cpu_s: own_after.cpu_since(&own_before),
    })
}
