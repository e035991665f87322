//! One publishing connection: sends stamped messages until its plan says stop, keeps a window
//! of unacknowledged QoS 1 messages, and measures PUBACK latency.
//!
//! Every run is bounded: by a deadline, a message count, and a timeout on outstanding acks.
//! A shared [`Progress`] lets publishers hold back when the end-to-end backlog (deliveries owed
//! but not yet made) passes `max_lag`, so "full speed" means as fast as messages come out the
//! other side, not as fast as a broker will buffer them in memory.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use silt_mqtt::{Packet, PacketId, QoS};

use crate::client::{Client, PublishTemplate};
use crate::histogram::Histogram;
use crate::payload::{Clock, Stamp};

/// Messages encoded per socket write.
const BATCH: u64 = 16;

/// Counters shared by every publisher and subscriber of a run.
#[derive(Debug, Default)]
pub struct Progress {
    pub sent: AtomicU64,
    pub delivered: AtomicU64,
}

/// Holds publishers back while more than `max_lag` deliveries are owed to subscribers, so the
/// latency measured at saturation is about `max_lag / deliveries per second` for fan-in and
/// fan-out alike.
#[derive(Clone, Debug)]
pub struct Gate {
    pub progress: Arc<Progress>,
    pub max_lag: u64,
    /// Deliveries per message (number of subscribers).
    pub fanout: u64,
}

impl Gate {
    fn open(&self) -> bool {
        let owed = self.progress.sent.load(Ordering::Relaxed) * self.fanout;
        owed.saturating_sub(self.progress.delivered.load(Ordering::Relaxed)) < self.max_lag
    }
}

/// When and how fast one publisher sends.
#[derive(Clone, Debug)]
pub struct Plan {
    pub qos: QoS,
    /// Unacknowledged QoS 1 messages allowed.
    pub window: usize,
    /// No message is sent after this instant.
    pub deadline: Instant,
    /// No more than this many messages are sent.
    pub limit: u64,
    /// Messages per second for this publisher; 0 means no pacing.
    pub rate: f64,
    pub gate: Option<Gate>,
    /// How long to wait for outstanding PUBACKs once sending is over.
    pub ack_timeout: Duration,
}

pub struct Outcome {
    pub client: Client,
    pub sent: u64,
    /// PUBACKs received (QoS 1); equal to `sent` for QoS 0.
    pub acked: u64,
    /// When the last message was written.
    pub last_send: Option<Instant>,
    pub ack_latency: Histogram,
}

/// Runs `plan` on `client`, publishing copies of `template` stamped as publisher `index`.
pub async fn run(
    mut client: Client,
    template: &PublishTemplate,
    index: u32,
    plan: &Plan,
    clock: Clock,
    progress: &Progress,
) -> anyhow::Result<Outcome> {
    let qos1 = plan.qos != QoS::AtMostOnce;
    let start = Instant::now();
    let mut seq = 0u64;
    let mut next_id = 1u16;
    // (packet id, send time) in send order; both brokers acknowledge in order.
    let mut inflight: VecDeque<(u16, u64)> = VecDeque::with_capacity(plan.window);
    let mut acked = 0u64;
    let mut ack_latency = Histogram::default();
    let mut last_send = None;
    let mut sending_over_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let sending = now < plan.deadline && seq < plan.limit;
        if !sending {
            let over = *sending_over_at.get_or_insert(now);
            if inflight.is_empty() || now >= over + plan.ack_timeout {
                break;
            }
        }
        let mut room = if sending { BATCH.min(plan.limit - seq) } else { 0 };
        if qos1 {
            room = room.min((plan.window - inflight.len()) as u64);
        }
        if room > 0 && plan.gate.as_ref().is_some_and(|g| !g.open()) {
            room = 0;
        }
        if room > 0 && plan.rate > 0.0 {
            let allowed = (now.duration_since(start).as_secs_f64() * plan.rate) as u64 + 1;
            room = room.min(allowed.saturating_sub(seq));
        }
        if room > 0 {
            for _ in 0..room {
                let stamp = Stamp { sent_ns: clock.now_ns(), publisher: index, seq };
                let id = qos1.then(|| {
                    let id = next_id;
                    next_id = next_id.checked_add(1).unwrap_or(1);
                    inflight.push_back((id, stamp.sent_ns));
                    PacketId::new(id).expect("invariant: ids skip 0")
                });
                client.queue_publish(template, id, &stamp);
                seq += 1;
            }
            client.flush().await?;
            last_send = Some(Instant::now());
            progress.sent.fetch_add(room, Ordering::Relaxed);
            if !qos1 || inflight.len() < plan.window {
                continue;
            }
        }
        if qos1 && !inflight.is_empty() {
            // Window full: wait for acks. Held back by the gate or the rate: wait briefly.
            let wait =
                if inflight.len() >= plan.window { Duration::from_millis(100) } else { Duration::from_millis(1) };
            match tokio::time::timeout(wait, client.fill()).await {
                Err(_) => continue,
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => anyhow::bail!("broker closed the publisher connection"),
                Ok(Err(e)) => return Err(e.into()),
            }
            let now_ns = clock.now_ns();
            while let Some(packet) = client.try_next()? {
                let Packet::PubAck(ack) = packet else { continue };
                let id = ack.packet_id.get();
                if let Some(at) = inflight.iter().position(|(i, _)| *i == id) {
                    let (_, sent_ns) = inflight.remove(at).expect("invariant: position found");
                    ack_latency.record(now_ns.saturating_sub(sent_ns) / 1_000);
                    acked += 1;
                }
            }
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    Ok(Outcome { client, sent: seq, acked: if qos1 { acked } else { seq }, last_send, ack_latency })
}
