//! What every Kafka connection shares: settings, the append path into the one log, the fetch
//! wakers, and who this broker says it is (one node, id 0, leader of every partition).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use silt_dataset::{Appender, StreamMeta, rule};
use silt_kafka::kafka_protocol::ResponseError;
use silt_storage::Storage;

use crate::config::KafkaConfig;
use crate::groups::Groups;
use crate::txns::Transactions;
use crate::wake::Wakers;

/// This broker's node id in Metadata: the only one, leader of every partition.
pub const NODE_ID: i32 = 0;

pub struct Kafka {
    pub config: Arc<KafkaConfig>,
    pub appender: Arc<Appender>,
    pub wakers: Arc<Wakers>,
    pub groups: Arc<Groups>,
    pub txns: Arc<Transactions>,
    pub cluster_id: String,
    /// Users and ACLs, shared with the MQTT broker.
    pub auth: Arc<silt_auth::Auth>,
    advertised: OnceLock<(String, u16)>,
    advertised_tls: OnceLock<(String, u16)>,
    topic_configs: OnceLock<TopicConfigs>,
    pub stats: KafkaStats,
}

/// One consumer group's position on one partition ([`Kafka::group_lags`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLag {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub committed: i64,
    /// The partition's end offset (high watermark).
    pub end: u64,
    pub lag: u64,
}

/// Counters of the Kafka view, for `/metrics`.
#[derive(Default)]
pub struct KafkaStats {
    /// Open client connections.
    pub connections: std::sync::atomic::AtomicU64,
    /// Connections accepted since start.
    pub connects: std::sync::atomic::AtomicU64,
    /// Records appended by Produce, and the bytes of their record batches as sent.
    pub records_received: std::sync::atomic::AtomicU64,
    pub bytes_received: std::sync::atomic::AtomicU64,
    /// Bytes of record batches answered by Fetch, and the records in them.
    pub bytes_sent: std::sync::atomic::AtomicU64,
    pub records_sent: std::sync::atomic::AtomicU64,
    /// Produce requests with acks 1 or all, received to answered (durable under the topics'
    /// policies, or refused).
    pub produce_latency: silt_types::latency::LatencyHistogram,
}

/// The `(key, value)` topic configs a topic's policy gives (`retention.ms`, ...), for
/// DescribeConfigs; set by whoever owns the policies.
pub type TopicConfigs = Box<dyn Fn(&str) -> Vec<(&'static str, String)> + Send + Sync>;

impl Kafka {
    /// Recovers the Kafka view's state from the log (blocking: call it before a runtime
    /// serves clients). `start` it on the runtime.
    pub fn open(
        config: KafkaConfig,
        appender: Arc<Appender>,
        wakers: Arc<Wakers>,
        cluster_id: String,
        auth: Arc<silt_auth::Auth>,
    ) -> silt_storage::Result<Arc<Kafka>> {
        let groups = Groups::open(appender.storage(), config.group_settings())?;
        let txns = Transactions::open(appender.storage())?;
        Ok(Arc::new(Kafka {
            config: Arc::new(config),
            appender,
            wakers,
            groups,
            txns,
            cluster_id,
            auth,
            advertised: OnceLock::new(),
            advertised_tls: OnceLock::new(),
            topic_configs: OnceLock::new(),
            stats: KafkaStats::default(),
        }))
    }

    /// Starts the background work on the current runtime (the group coordinator's clock and
    /// persister, the transaction persister and timeouts), after finishing the transactions a
    /// restart left open: they are aborted (or a decided commit completed) before anyone is
    /// served.
    pub async fn start(self: &Arc<Self>) {
        self.groups.start(self.storage().clone());
        self.txns.start(self.storage().clone());
        for e in self.txns.unfinished() {
            let what = if e.commit { "completed" } else { "aborted" };
            match self.txns.finish(self, &e).await {
                Ok(()) => tracing::info!(transactional_id = %e.id, "a transaction left open by the restart was {what}"),
                Err(code) => {
                    tracing::warn!(transactional_id = %e.id, code, "a transaction left open could not be ended")
                }
            }
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(k) = weak.upgrade() else { return };
                for e in k.txns.expired().await {
                    tracing::info!(transactional_id = %e.id, "a transaction passed its timeout and was aborted");
                    if let Err(code) = k.txns.finish(&k, &e).await {
                        tracing::warn!(transactional_id = %e.id, code, "a timed-out transaction could not be ended");
                    }
                }
            }
        });
    }

    /// The lowest log position holding state of the Kafka view that a restart still reads
    /// (group offsets, transactions): retention deletes only below it.
    pub fn internal_floor(&self) -> silt_storage::Result<silt_types::LogPosition> {
        let storage = self.storage();
        let mut floor = storage.stats().log_end;
        for stream in [crate::groups::GROUPS_STREAM, crate::txns::TXN_STREAM, crate::txns::ABORTED_STREAM] {
            if let Some(p) = silt_dataset::internal::floor(storage, stream)? {
                floor = floor.min(p);
            }
        }
        Ok(floor)
    }

    /// Each consumer group's lag per partition it committed an offset for: the partition's end
    /// offset (its high watermark) less the committed offset, as `kafka-consumer-groups
    /// --describe` shows it. At most `limit` entries, groups in id order, so a scrape stays
    /// bounded however many groups clients create. Blocking (reads the index): call it off the
    /// async runtime.
    pub fn group_lags(&self, limit: usize) -> silt_storage::Result<Vec<GroupLag>> {
        let mut committed: Vec<(String, String, i32, i64)> = self.groups.now(|coord, _| {
            let mut ids: Vec<&str> = coord.groups().map(|g| g.id).collect();
            ids.sort_unstable();
            ids.into_iter()
                .flat_map(|g| {
                    coord.committed_offsets(g).map(move |(t, p, c)| (g.to_owned(), t.to_owned(), p, c.offset))
                })
                .take(limit)
                .collect()
        });
        committed.sort();
        let storage = self.storage();
        let mut out = Vec::with_capacity(committed.len());
        for (group, topic, partition, offset) in committed {
            let Ok(index) = u32::try_from(partition) else { continue };
            let name =
                silt_storage::QueueName::Partition { stream: topic.clone(), partition: silt_types::Partition(index) };
            let end = match storage.queue_id(&name)? {
                Some(id) => storage.queue_bounds(id)?.1.get(),
                None => 0,
            };
            let lag = end.saturating_sub(u64::try_from(offset).unwrap_or(0));
            out.push(GroupLag { group, topic, partition, committed: offset, end, lag });
        }
        Ok(out)
    }

    /// Writes fresh dumps of the Kafka view's internal state, so its floor moves up.
    pub async fn dump_internal(&self) -> silt_storage::Result<()> {
        self.groups.dump().await?;
        self.txns.dump().await
    }

    pub fn storage(&self) -> &Arc<Storage> {
        self.appender.storage()
    }

    /// Says where a topic's policy configs come from (once).
    pub fn set_topic_configs(&self, f: TopicConfigs) {
        let _ = self.topic_configs.set(f);
    }

    /// The configs a topic's policy gives.
    pub fn topic_configs(&self, topic: &str) -> Vec<(&'static str, String)> {
        self.topic_configs.get().map(|f| f(topic)).unwrap_or_default()
    }

    /// Sets the address Metadata names, from `kafka.advertised` or else the bound address.
    pub fn bound(&self, addr: SocketAddr) {
        let _ = self.advertised.set(advertise(self.config.advertised.as_deref(), addr));
    }

    /// Sets the address Metadata names to clients of the TLS listener.
    pub fn bound_tls(&self, addr: SocketAddr) {
        let configured = self.config.tls.as_ref().and_then(|t| t.advertised.as_deref());
        let _ = self.advertised_tls.set(advertise(configured, addr));
    }

    /// The `host:port` clients of a listener are told to connect to.
    pub fn advertised_for(&self, tls: bool) -> (String, u16) {
        let set = if tls { &self.advertised_tls } else { &self.advertised };
        set.get().cloned().unwrap_or_else(|| ("127.0.0.1".into(), 9092))
    }

    /// The `host:port` clients of the TCP listener are told to connect to.
    pub fn advertised(&self) -> (String, u16) {
        self.advertised_for(false)
    }

    /// The stream behind a Kafka topic a client names, created when `create` and the topic
    /// is new and `kafka.auto_create_topics` allows it. Errors are Kafka error codes.
    pub async fn topic(&self, name: &str, create: bool) -> Result<StreamMeta, i16> {
        if rule::kafka_topic_error(name).is_some() {
            return Err(ResponseError::InvalidTopicException.code());
        }
        if let Some(meta) = self.appender.streams().get(name) {
            return Ok(meta);
        }
        if !(create && self.config.auto_create_topics) {
            return Err(ResponseError::UnknownTopicOrPartition.code());
        }
        match self.appender.create_stream(name, None).await {
            Ok(Ok(meta) | Err(meta)) => {
                tracing::info!(topic = %name, partitions = meta.partitions, "topic auto-created");
                Ok(meta)
            }
            Err(e) => Err(crate::apis::storage_error(&e)),
        }
    }
}

fn advertise(configured: Option<&str>, bound: SocketAddr) -> (String, u16) {
    match configured {
        Some(a) => {
            let (h, p) = a.rsplit_once(':').expect("invariant: validated host:port");
            (h.to_owned(), p.parse().expect("invariant: validated port"))
        }
        None => (bound.ip().to_string(), bound.port()),
    }
}
