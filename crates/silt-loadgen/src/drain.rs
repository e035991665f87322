//! Offline drain: a persistent session subscribes at QoS 1 and goes away; messages are
//! published while it is offline; then it comes back and the time to receive the backlog is
//! measured.
//!
//! Steps: wipe any old session (clean connect), connect with a persistent session (MQTT 3.x:
//! Clean Session 0; 5.0: Session Expiry 1 h), subscribe `drain/t` at QoS 1, DISCONNECT; publish
//! `messages` at QoS 1 and wait for every PUBACK; reconnect (Clean Session 0) and acknowledge
//! every delivery until all are in, or nothing came for `idle_timeout`; finally end the session.
//! Every delivery is checked off by (publisher, sequence), so duplicates and gaps are counted
//! exactly. A broker that caps offline queues shows up as `lost`, not as a faster drain.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use silt_mqtt::{Packet, QoS};
use tokio::task::JoinSet;

use crate::Env;
use crate::client::{Client, ConnectOptions, PublishTemplate, connect_many};
use crate::flow::per_s;
use crate::payload::{HEADER_LEN, Stamp};
use crate::procfs::Sample;
use crate::publisher::{self, Plan, Progress};

const TOPIC: &str = "drain/t";

#[derive(Clone, Debug)]
pub struct DrainConfig {
    pub messages: u64,
    pub publishers: usize,
    pub window: usize,
    pub payload: usize,
    /// Give up when no delivery arrives for this long.
    pub idle_timeout: Duration,
    /// Give up on the whole drain after this long.
    pub max_time: Duration,
    /// Wait between filling and draining (for instance while tiering uploads and evicts the
    /// backlog, so the drain reads it back from the object store).
    pub pause: Duration,
}

#[derive(Debug, Serialize)]
pub struct DrainReport {
    pub scenario: &'static str,
    pub case: String,
    pub broker: String,
    pub messages: u64,
    pub payload_bytes: usize,
    /// Messages the broker acknowledged while the subscriber was offline.
    pub acked: u64,
    pub fill_s: f64,
    pub fill_msgs_per_s: f64,
    pub session_present: bool,
    pub received: u64,
    pub unique: u64,
    pub duplicates: u64,
    pub lost: u64,
    /// Reconnect (TCP connect) to the last delivery.
    pub drain_s: f64,
    pub msgs_per_s: f64,
    pub mb_per_s: f64,
    /// Broker RSS growth while the backlog was queued.
    pub broker_rss_mib_queued: Option<f64>,
    pub broker_cpu_s_drain: Option<f64>,
}

pub async fn run(env: &Env, cfg: DrainConfig) -> anyhow::Result<DrainReport> {
    anyhow::ensure!(cfg.payload >= HEADER_LEN, "payload must be at least {HEADER_LEN} bytes");
    anyhow::ensure!(cfg.publishers > 0 && cfg.messages > 0, "need publishers and messages");
    let mut session = ConnectOptions::new(format!("{}-drain", env.prefix), env.version);
    Client::connect(env.addr, &session).await.context("clean connect")?.0.disconnect().await;
    session.clean_start = false;
    session.session_expiry = Some(3600);
    session.read_buffer = 64 * 1024;
    let (mut sub, _) = Client::connect(env.addr, &session).await.context("persistent connect")?;
    sub.subscribe(TOPIC, QoS::AtLeastOnce).await?;
    sub.disconnect().await;
    // Let the broker see the session go offline before the first message.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let broker_before = env.broker.map(Sample::take);
    let per_publisher = cfg.messages.div_ceil(cfg.publishers as u64);
    let pub_options =
        (0..cfg.publishers).map(|i| ConnectOptions::new(format!("{}-drainpub-{i}", env.prefix), env.version));
    let mut tasks = JoinSet::new();
    let progress = std::sync::Arc::new(Progress::default());
    let fill_start = Instant::now();
    for (i, attempt) in connect_many(env.addr, pub_options, 64).await.into_iter().enumerate() {
        let client = attempt.result.context("publisher")?.0;
        let limit = per_publisher.min(cfg.messages - per_publisher * i as u64);
        let plan = Plan {
            qos: QoS::AtLeastOnce,
            window: cfg.window,
            deadline: fill_start + cfg.max_time,
            limit,
            rate: 0.0,
            gate: None,
            ack_timeout: Duration::from_secs(30),
        };
        let template = PublishTemplate::new(TOPIC, QoS::AtLeastOnce, cfg.payload, env.version)?;
        let (clock, progress) = (env.clock, progress.clone());
        let index = u32::try_from(i).context("publisher index")?;
        tasks.spawn(async move { publisher::run(client, &template, index, &plan, clock, &progress).await });
    }
    let mut acked = 0;
    while let Some(joined) = tasks.join_next().await {
        let o = joined.context("publisher task")??;
        acked += o.acked;
        o.client.disconnect().await;
    }
    let fill_s = fill_start.elapsed().as_secs_f64();
    let broker_queued = env.broker.map(Sample::take);
    eprintln!("{}: {acked} messages queued for the offline session in {fill_s:.2} s; draining", env.label);
    tokio::time::sleep(cfg.pause).await;

    let drain_start = Instant::now();
    let (mut sub, ack) = Client::connect(env.addr, &session).await.context("reconnect")?;
    let mut seen = Seen::new(cfg.publishers, per_publisher);
    let (mut received, mut bytes, mut last) = (0u64, 0u64, drain_start);
    let give_up = drain_start + cfg.max_time;
    loop {
        // Packets may already be buffered behind the CONNACK: decode before reading.
        let before = received;
        while let Some(packet) = sub.try_next()? {
            let Packet::Publish(p) = packet else { continue };
            received += 1;
            bytes += p.payload.len() as u64;
            if let Some(stamp) = Stamp::read(&p.payload) {
                seen.mark(&stamp);
            }
            if let Some(id) = p.packet_id {
                sub.queue_puback(id)?;
            }
        }
        if received > before {
            last = Instant::now();
        }
        sub.flush().await?;
        if seen.unique >= cfg.messages || Instant::now() >= give_up {
            break;
        }
        match tokio::time::timeout(cfg.idle_timeout, sub.fill()).await {
            Err(_) => break,
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => anyhow::bail!("broker closed the draining connection"),
            Ok(Err(e)) => return Err(e.into()),
        }
    }
    sub.flush().await?;
    let broker_drained = env.broker.map(Sample::take);
    sub.disconnect().await;
    session.clean_start = true;
    session.session_expiry = None;
    Client::connect(env.addr, &session).await.context("ending the session")?.0.disconnect().await;

    let drain_s = last.duration_since(drain_start).as_secs_f64();
    let rss_queued = broker_before.zip(broker_queued).and_then(|(b, a)| Some(a.rss_kib? as f64 - b.rss_kib? as f64));
    Ok(DrainReport {
        scenario: "drain",
        case: format!("offline drain {} QoS1", cfg.messages),
        broker: env.label.clone(),
        messages: cfg.messages,
        payload_bytes: cfg.payload,
        acked,
        fill_s,
        fill_msgs_per_s: per_s(acked, fill_s),
        session_present: ack.session_present,
        received,
        unique: seen.unique,
        duplicates: received - seen.unique,
        lost: cfg.messages - seen.unique,
        drain_s,
        msgs_per_s: per_s(seen.unique, drain_s),
        mb_per_s: per_s(bytes, drain_s) / 1e6,
        broker_rss_mib_queued: rss_queued.map(|k| k / 1024.0),
        broker_cpu_s_drain: broker_queued.zip(broker_drained).and_then(|(b, a)| a.cpu_since(&b)),
    })
}

/// Which (publisher, sequence) pairs have arrived: one bit each.
struct Seen {
    per_publisher: u64,
    len: u64,
    bits: Vec<u64>,
    unique: u64,
}

impl Seen {
    fn new(publishers: usize, per_publisher: u64) -> Self {
        let n = publishers as u64 * per_publisher;
        Self { per_publisher, len: n, bits: vec![0; n.div_ceil(64) as usize], unique: 0 }
    }

    fn mark(&mut self, s: &Stamp) {
        if s.seq >= self.per_publisher {
            return;
        }
        let i = u64::from(s.publisher) * self.per_publisher + s.seq;
        if i >= self.len {
            return;
        }
        let word = &mut self.bits[(i / 64) as usize];
        let bit = 1u64 << (i % 64);
        if *word & bit == 0 {
            *word |= bit;
            self.unique += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_counts_each_message_once_and_ignores_strangers() {
        let mut seen = Seen::new(2, 100);
        for (publisher, seq) in [(0, 0), (1, 99), (0, 0), (1, 63), (1, 100), (2, 0)] {
            seen.mark(&Stamp { sent_ns: 0, publisher, seq });
        }
        assert_eq!(seen.unique, 3);
    }
}
