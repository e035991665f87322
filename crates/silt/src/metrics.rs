//! `/metrics` on the admin listener: the node's figures in the Prometheus text format
//! (OpenMetrics, through `prometheus-client`), read on each scrape from the counters the parts
//! keep anyway (the same ones `$SYS` publishes). Label sets stay bounded: a protocol, a request
//! kind, a lakehouse table (from the config) — never a client id or an MQTT topic.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use silt_broker::Broker;
use silt_storage::Storage;
use silt_tiering::Tiering;
use silt_types::latency::HistogramSnapshot;

use crate::tiered::LakeSlot;

/// What a scrape reads.
pub struct Sources {
    pub broker: Weak<Broker>,
    pub kafka: Option<Weak<silt_kafka_broker::Kafka>>,
    pub storage: Arc<Storage>,
    pub tiering: Arc<Tiering>,
    pub lakehouse: LakeSlot,
    pub started: Instant,
}

/// One figure: name (counters without `_total`, the encoder adds it), help, labels, value.
#[derive(Debug)]
enum Value {
    Counter(u64),
    Gauge(i64),
    Ratio(f64),
    Histogram(HistogramSnapshot),
}

/// A histogram read from a [`silt_types::latency::LatencyHistogram`], encoded as one.
#[derive(Debug)]
struct ConstHistogram<'a>(&'a HistogramSnapshot);

impl EncodeMetric for ConstHistogram<'_> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.0.sum_seconds, self.0.count, &self.0.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Most consumer-group lag series one scrape reports (groups in id order).
const MAX_GROUP_LAG_SERIES: usize = 10_000;
/// Most streams one scrape reports `silt_stream_bytes` for (streams in name order; two series
/// each).
const MAX_STREAM_BYTES_SERIES: usize = 10_000;
const STREAM_BYTES_HELP: &str = "Record bytes of a stream in uploaded segments, on the local disk and in the bucket (the tail not yet uploaded is in silt_stream_unattributed_bytes).";

#[derive(Debug)]
struct Figure {
    name: &'static str,
    help: &'static str,
    labels: Vec<(&'static str, String)>,
    value: Value,
}

/// The figures of one scrape, taken at once and then encoded.
#[derive(Debug, Default)]
struct Snapshot(Vec<Figure>);

impl Snapshot {
    fn counter(&mut self, name: &'static str, help: &'static str, v: u64) -> &mut Self {
        self.0.push(Figure { name, help, labels: Vec::new(), value: Value::Counter(v) });
        self
    }

    fn gauge(&mut self, name: &'static str, help: &'static str, v: u64) -> &mut Self {
        let v = i64::try_from(v).unwrap_or(i64::MAX);
        self.0.push(Figure { name, help, labels: Vec::new(), value: Value::Gauge(v) });
        self
    }

    fn histogram(&mut self, name: &'static str, help: &'static str, h: HistogramSnapshot) -> &mut Self {
        self.0.push(Figure { name, help, labels: Vec::new(), value: Value::Histogram(h) });
        self
    }

    /// The figure just pushed gets `labels`.
    fn with(&mut self, labels: &[(&'static str, &str)]) -> &mut Self {
        if let Some(f) = self.0.last_mut() {
            f.labels = labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        }
        self
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        // Figures of one name (several label sets) are one family, under one descriptor.
        let mut i = 0;
        while i < self.0.len() {
            let first = &self.0[i];
            let family: Vec<&Figure> = self.0[i..].iter().take_while(|f| f.name == first.name).collect();
            i += family.len();
            let metric_type = match first.value {
                Value::Counter(_) => ConstCounter::new(0u64).metric_type(),
                Value::Gauge(_) | Value::Ratio(_) => ConstGauge::new(0i64).metric_type(),
                Value::Histogram(_) => MetricType::Histogram,
            };
            let mut m = encoder.encode_descriptor(first.name, first.help, None, metric_type)?;
            for f in family {
                let labels: Vec<(&str, &str)> = f.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let e = m.encode_family(&labels)?;
                match f.value {
                    Value::Counter(v) => ConstCounter::new(v).encode(e)?,
                    Value::Gauge(v) => ConstGauge::new(v).encode(e)?,
                    Value::Ratio(v) => ConstGauge::new(v).encode(e)?,
                    Value::Histogram(ref h) => ConstHistogram(h).encode(e)?,
                }
            }
        }
        Ok(())
    }
}

const ACK_LATENCY_HELP: &str = "Received to acknowledged: an MQTT PUBLISH at QoS 1 or 2 to its PUBACK/PUBREC, a Kafka Produce with acks 1 or all to its response (durable as the topic's policy asks).";
const CONNECTS_HELP: &str = "Connections accepted (MQTT: CONNECTs accepted).";

/// The text of one scrape. Blocking (reads the index for consumer-group lag): call it off the
/// async runtime.
pub fn render(src: &Sources) -> String {
    let mut s = Snapshot::default();
    s.gauge("silt_uptime_seconds", "Seconds since this node started.", src.started.elapsed().as_secs());
    s.gauge("silt_build_info", "This node's version (the value is 1).", 1)
        .with(&[("version", env!("CARGO_PKG_VERSION"))]);
    if let Some(b) = src.broker.upgrade() {
        use std::sync::atomic::Ordering::Relaxed;
        let st = &b.stats;
        let mqtt = [("protocol", "mqtt")];
        s.gauge("silt_connections", "Open client connections.", st.connections.load(Relaxed)).with(&mqtt);
        s.gauge(
            "silt_connections_resting",
            "Open client connections resting: idle, kept in their small form until they have work.",
            st.resting.load(Relaxed),
        )
        .with(&mqtt);
        s.counter("silt_connects", CONNECTS_HELP, st.connects.load(Relaxed)).with(&mqtt);
        s.histogram("silt_ack_latency_seconds", ACK_LATENCY_HELP, st.ack_latency.snapshot()).with(&mqtt);
        s.counter("silt_messages_received", "Messages received from clients.", st.messages_received.load(Relaxed))
            .with(&mqtt);
        s.counter("silt_messages_sent", "Messages delivered to clients.", st.messages_sent.load(Relaxed)).with(&mqtt);
        s.counter("silt_received_bytes", "Bytes read from clients.", st.bytes_received.load(Relaxed)).with(&mqtt);
        s.counter("silt_sent_bytes", "Bytes written to clients.", st.bytes_sent.load(Relaxed)).with(&mqtt);
        let (_, total, largest) = b.backlog_summary();
        let sessions = b.session_count() as u64;
        let online = st.connections.load(Relaxed).min(sessions);
        s.gauge("silt_sessions", "MQTT sessions, by whether a client is connected to them.", online)
            .with(&[("state", "online")])
            .gauge("silt_sessions", "MQTT sessions, by whether a client is connected to them.", sessions - online)
            .with(&[("state", "offline")]);
        s.gauge(
            "silt_session_backlog_messages",
            "Messages waiting for all sessions together (as of the last $SYS interval).",
            total,
        );
        s.gauge(
            "silt_session_backlog_max_messages",
            "Messages waiting for the session with the most (as of the last $SYS interval).",
            largest,
        );
        s.gauge("silt_retained_messages", "Retained messages.", b.retained_count() as u64);
    }
    if let Some(k) = src.kafka.as_ref().and_then(Weak::upgrade) {
        use std::sync::atomic::Ordering::Relaxed;
        let st = &k.stats;
        let kafka = [("protocol", "kafka")];
        // Beside the MQTT figures of the same names: one family each, a label per protocol.
        let at = |s: &Snapshot, name: &str| s.0.iter().rposition(|f| f.name == name).map_or(s.0.len(), |i| i + 1);
        for (name, help, counter, v) in [
            ("silt_connections", "Open client connections.", false, st.connections.load(Relaxed)),
            ("silt_connects", CONNECTS_HELP, true, st.connects.load(Relaxed)),
            ("silt_messages_received", "Messages received from clients.", true, st.records_received.load(Relaxed)),
            ("silt_messages_sent", "Messages delivered to clients.", true, st.records_sent.load(Relaxed)),
            ("silt_received_bytes", "Bytes read from clients.", true, st.bytes_received.load(Relaxed)),
            ("silt_sent_bytes", "Bytes written to clients.", true, st.bytes_sent.load(Relaxed)),
        ] {
            let value = if counter { Value::Counter(v) } else { Value::Gauge(i64::try_from(v).unwrap_or(i64::MAX)) };
            let labels = kafka.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
            let i = at(&s, name);
            s.0.insert(i, Figure { name, help, labels, value });
        }
        let labels = kafka.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        let value = Value::Histogram(st.produce_latency.snapshot());
        let i = at(&s, "silt_ack_latency_seconds");
        s.0.insert(i, Figure { name: "silt_ack_latency_seconds", help: ACK_LATENCY_HELP, labels, value });
        match k.group_lags(MAX_GROUP_LAG_SERIES) {
            Ok(lags) => {
                for l in lags {
                    let partition = l.partition.to_string();
                    let labels = [("group", l.group.as_str()), ("topic", l.topic.as_str()), ("partition", &partition)];
                    s.gauge(
                        "silt_kafka_consumer_group_lag",
                        "Records a consumer group has not committed: the partition's end offset less the group's committed offset.",
                        l.lag,
                    )
                    .with(&labels);
                }
            }
            Err(e) => tracing::warn!(error = %e, "consumer group lag could not be read for /metrics"),
        }
    }
    let st = src.storage.stats();
    s.gauge(
        "silt_log_bytes",
        "Bytes of the commitlog held (local and in the bucket).",
        st.log_end.get() - st.log_start.get(),
    )
    .gauge("silt_log_end_bytes", "The commitlog's end position (bytes written since the beginning).", st.log_end.get())
    .gauge(
        "silt_index_dispatch_lag_bytes",
        "Commitlog bytes written but not yet indexed.",
        st.log_end.get().saturating_sub(st.dispatched.get()),
    )
    .gauge("silt_log_segments", "Commitlog segments on the local disk.", st.segments as u64)
    .counter("silt_log_fsyncs", "Fsyncs of the commitlog.", st.fsyncs)
    .histogram(
        "silt_log_append_latency_seconds",
        "Commitlog appends, submitted to answered (written, and fsynced when the policy asks).",
        st.append_latency.clone(),
    )
    .histogram("silt_log_fsync_latency_seconds", "Fsyncs of the commitlog's active segment.", st.fsync_latency.clone())
    .gauge("silt_tail_cache_bytes", "Bytes in the tail cache.", st.tail_cache_bytes)
    .gauge("silt_index_sst_bytes", "Bytes of the index's SST files.", st.index_sst_bytes)
    .gauge("silt_index_memtable_bytes", "Bytes of the index's memtables.", st.index_memtable_bytes)
    .counter("silt_storage_healed_batches", "Bad batches rewritten from a good copy.", st.healed_batches)
    .counter("silt_storage_quarantined_batches", "Bad batches with no good copy, quarantined.", st.quarantined_batches)
    .counter("silt_storage_quarantined_bytes", "Bytes of quarantined batches.", st.quarantined_bytes)
    .counter("silt_storage_skipped_records", "Records dispatch could not index.", st.skipped_records);
    let sizes = src.tiering.stream_sizes();
    for (name, b) in sizes.streams.iter().take(MAX_STREAM_BYTES_SERIES) {
        s.gauge("silt_stream_bytes", STREAM_BYTES_HELP, b.local)
            .with(&[("stream", name.as_str()), ("location", "local")])
            .gauge("silt_stream_bytes", STREAM_BYTES_HELP, b.bucket)
            .with(&[("stream", name.as_str()), ("location", "bucket")]);
    }
    let other = "Bytes held that no stream is named for: batch framing, segment headers and footers, and locally the tail not yet uploaded.";
    s.gauge("silt_stream_unattributed_bytes", other, sizes.other.local)
        .with(&[("location", "local")])
        .gauge("silt_stream_unattributed_bytes", other, sizes.other.bucket)
        .with(&[("location", "bucket")]);
    let t = src.tiering.stats();
    s.gauge("silt_tiering_upload_lag_bytes", "Log bytes not yet in the object store.", t.upload_lag_bytes)
        .gauge(
            "silt_tiering_upload_lag_seconds",
            "How long the oldest data not yet uploaded has waited.",
            t.upload_lag_seconds,
        )
        .counter("silt_tiering_uploads", "Segment objects uploaded.", t.puts)
        .counter("silt_tiering_uploaded_bytes", "Bytes of segment objects uploaded.", t.put_bytes)
        .counter("silt_tiering_block_fetches", "Blocks fetched from the object store by cold reads.", t.gets)
        .counter(
            "silt_object_store_requests",
            "Requests sent to the object store, as stores bill them.",
            t.write_requests,
        )
        .with(&[("kind", "write")])
        .counter(
            "silt_object_store_requests",
            "Requests sent to the object store, as stores bill them.",
            t.read_requests,
        )
        .with(&[("kind", "read")])
        .gauge("silt_tiering_objects", "Segment objects the manifest names.", t.objects)
        .counter("silt_tiering_deleted_objects", "Objects deleted by retention.", t.deleted_objects)
        .counter(
            "silt_tiering_aborted_uploads",
            "Incomplete multipart uploads of earlier nodes aborted.",
            t.aborted_uploads,
        )
        .counter("silt_tiering_upload_failures", "Segment uploads that failed and were retried.", t.upload_failures)
        .counter("silt_tiering_uploaded_gaps", "Quarantined ranges in uploaded segments.", t.uploaded_gaps)
        .gauge("silt_tiering_fenced", "1 when a newer node took this node's prefix over.", u64::from(t.fenced))
        .gauge("silt_tiering_epoch", "This node's epoch in the manifest.", t.epoch);
    s.0.push(Figure {
        name: "silt_tiering_block_cache_hit_ratio",
        help: "Share of cold-read blocks found in the block cache.",
        labels: Vec::new(),
        value: Value::Ratio(t.cache_hit_ratio),
    });
    if let Some(l) = src.lakehouse.get().and_then(Weak::upgrade) {
        let tables = l.figures();
        type Pick = fn(&silt_lakehouse::TableFigures) -> u64;
        let per_table: [(&'static str, &'static str, bool, Pick); 8] = [
            ("silt_lakehouse_commits", "Commits of a lakehouse table.", true, |t| t.commits),
            ("silt_lakehouse_commit_failures", "Failed commits of a lakehouse table (retried).", true, |t| {
                t.commit_failures
            }),
            ("silt_lakehouse_rows", "Rows written to a lakehouse table.", true, |t| t.rows),
            ("silt_lakehouse_data_files", "Data files a lakehouse table's writer added.", true, |t| t.files),
            ("silt_lakehouse_compactions", "Compactions of a lakehouse table.", true, |t| t.compactions),
            (
                "silt_lakehouse_lag_seconds",
                "Age of the oldest message a lakehouse table has not written.",
                false,
                |t| t.lag_ms / 1000,
            ),
            ("silt_lakehouse_holding_retention", "1 while retention waits for a lakehouse table.", false, |t| {
                u64::from(t.holding_retention)
            }),
            ("silt_lakehouse_fenced", "1 when a lakehouse table's writer is fenced.", false, |t| u64::from(t.fenced)),
        ];
        for (name, help, counter, pick) in per_table {
            for t in &tables {
                let v = pick(t);
                if counter { s.counter(name, help, v) } else { s.gauge(name, help, v) }.with(&[("table", &t.name)]);
            }
        }
    }
    let mut registry = Registry::default();
    registry.register_collector(Box::new(s));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        tracing::warn!(error = %e, "metrics could not be encoded");
    }
    out
}
