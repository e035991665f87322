//! Wiring tiering into the broker: `ack = "object"` acknowledgements, retention's view of the
//! broker's and the Kafka view's internal streams, what the lakehouse has still to write, and
//! the `$SYS/broker/tiering/...` and `$SYS/broker/lakehouse/...` figures.

use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use silt_broker::{Broker, TierDecision, TopicTiers};
use silt_kafka_broker::Kafka;
use silt_lakehouse::Lakehouse;
use silt_tiering::{InternalState, Policies, Tiering};
use silt_types::LogPosition;

struct Gate(Arc<Tiering>, Arc<Policies>);

impl TopicTiers for Gate {
    fn decide(&self, topic: &str) -> TierDecision {
        let (memory, object_ack) = self.1.decide(topic);
        TierDecision { memory, object_ack }
    }

    fn wait(&self, end: LogPosition) -> Pin<Box<dyn Future<Output = silt_storage::Result<()>> + Send>> {
        let wait = self.0.wait_uploaded(end);
        Box::pin(async move { wait.await.map_err(|e| silt_storage::Error::Remote(e.to_string())) })
    }
}

/// The broker's and the Kafka view's internal state as retention sees it. Holds both weakly:
/// they must not outlive shutdown.
struct Internal {
    broker: Weak<Broker>,
    kafka: Option<Weak<Kafka>>,
    rt: tokio::runtime::Handle,
    last_dump: Mutex<Option<Instant>>,
    lakehouse: LakeSlot,
}

/// Where the lakehouse goes once it runs (it starts after the Kafka view it reads through).
pub type LakeSlot = Arc<OnceLock<Weak<Lakehouse>>>;

/// Dumps are cheap but not free: at most one per this long.
const MIN_DUMP_INTERVAL: Duration = Duration::from_secs(10);

impl InternalState for Internal {
    fn floor(&self) -> LogPosition {
        let kafka = match self.kafka.as_ref().map(|k| k.upgrade().map(|k| k.internal_floor())) {
            None => Ok(LogPosition(u64::MAX)),
            Some(Some(f)) => f,
            Some(None) => Ok(LogPosition(0)),
        };
        let broker = self.broker.upgrade().map_or(Ok(LogPosition(0)), |b| b.internal_floor());
        match (broker, kafka) {
            (Ok(b), Ok(k)) => b.min(k),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "internal floor unknown; retention holds everything");
                LogPosition(0)
            }
        }
    }

    fn hold(&self) -> LogPosition {
        match self.lakehouse.get() {
            None => LogPosition(u64::MAX),
            // Shut down: hold everything rather than let retention outrun a restart.
            Some(l) => l.upgrade().map_or(LogPosition(0), |l| l.floor()),
        }
    }

    fn compact(&self, target: LogPosition) {
        let mut last = self.last_dump.lock().expect("invariant: lock not poisoned");
        if last.is_some_and(|t| t.elapsed() < MIN_DUMP_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        let (broker, kafka) = (self.broker.clone(), self.kafka.clone());
        self.rt.spawn(async move {
            let Some(b) = broker.upgrade() else { return };
            let mut done = b.dump_internal(target).await;
            if let (Ok(()), Some(k)) = (&done, kafka.and_then(|k| k.upgrade())) {
                done = k.dump_internal().await;
            }
            match done {
                Ok(()) => tracing::info!("internal state dumped so retention can delete old segments"),
                Err(e) => tracing::warn!(error = %e, "internal state dump failed"),
            }
        });
    }
}

pub fn wire(
    broker: &Arc<Broker>,
    kafka: Option<&Arc<Kafka>>,
    tiering: &Arc<Tiering>,
    rt: tokio::runtime::Handle,
) -> LakeSlot {
    let lakehouse = LakeSlot::default();
    let policies = tiering.policies();
    // Always: `$SYS` figures live in memory even when no policy names the memory tier. For an
    // ordinary topic without memory or `ack = "object"` policies, deciding is a prefix check.
    broker.set_tiers(Arc::new(Gate(tiering.clone(), policies.clone())));
    tiering.set_internal_state(Arc::new(Internal {
        broker: Arc::downgrade(broker),
        kafka: kafka.map(Arc::downgrade),
        rt,
        last_dump: Mutex::new(None),
        lakehouse: lakehouse.clone(),
    }));
    let t = tiering.clone();
    let lake = lakehouse.clone();
    broker.set_extra_stats(Box::new(move || {
        let s = t.stats();
        let mut figures = vec![
            ("tiering/upload_lag_bytes".into(), s.upload_lag_bytes.to_string()),
            ("tiering/upload_lag_seconds".into(), s.upload_lag_seconds.to_string()),
            ("tiering/puts".into(), s.puts.to_string()),
            ("tiering/put_bytes".into(), s.put_bytes.to_string()),
            ("tiering/gets".into(), s.gets.to_string()),
            ("tiering/write_requests".into(), s.write_requests.to_string()),
            ("tiering/read_requests".into(), s.read_requests.to_string()),
            ("tiering/cache_hit_ratio".into(), format!("{:.3}", s.cache_hit_ratio)),
            ("tiering/objects".into(), s.objects.to_string()),
            ("tiering/deleted_objects".into(), s.deleted_objects.to_string()),
            ("tiering/aborted_uploads".into(), s.aborted_uploads.to_string()),
            ("tiering/upload_failures".into(), s.upload_failures.to_string()),
            ("tiering/uploaded_gaps".into(), s.uploaded_gaps.to_string()),
            ("tiering/uploaded_gap_bytes".into(), s.uploaded_gap_bytes.to_string()),
            ("tiering/fenced".into(), u8::from(s.fenced).to_string()),
            ("tiering/epoch".into(), s.epoch.to_string()),
        ];
        if let Some(l) = lake.get().and_then(Weak::upgrade) {
            for t in l.figures() {
                let at = |k: &str| format!("lakehouse/{}/{k}", t.name);
                figures.extend([
                    (at("commits"), t.commits.to_string()),
                    (at("commit_failures"), t.commit_failures.to_string()),
                    (at("rows"), t.rows.to_string()),
                    (at("files"), t.files.to_string()),
                    (at("compactions"), t.compactions.to_string()),
                    (at("lag_ms"), t.lag_ms.to_string()),
                    (at("holding_retention"), u8::from(t.holding_retention).to_string()),
                    (at("fenced"), u8::from(t.fenced).to_string()),
                ]);
            }
        }
        figures
    }));
    lakehouse
}

/// What a read_committed Kafka consumer may see, for the lakehouse writers.
pub struct KafkaVisibility(pub Weak<Kafka>);

impl silt_lakehouse::Visibility for KafkaVisibility {
    fn stable(&self, stream: &str, partition: u32, from: u64, end: u64) -> (u64, Vec<(i64, u64, u64)>) {
        let Some(k) = self.0.upgrade() else { return (from, Vec::new()) };
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let (lso, aborted) = k.txns.read_committed(stream, partition as i32, clamp(from), clamp(end));
        let aborted =
            aborted.into_iter().map(|a| (a.producer_id, a.first.max(0) as u64, a.last.max(0) as u64)).collect();
        (lso.max(0) as u64, aborted)
    }
}
