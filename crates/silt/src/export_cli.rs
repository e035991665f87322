//! `silt export`: the client of the admin API's `Export` ([`crate::export`]). Writes the
//! records as JSON lines (stdout or `--output`) or as a Parquet file with the lakehouse tables'
//! envelope columns; a progress bar on stderr when it is a terminal, a summary line at the end.
//!
//! JSON lines, one object per record, in the node's order (topic by topic, each in publish
//! order): `topic`, `offset` (in the topic's queue), `timestamp_ms`, `qos`, `retain`,
//! `payload` with `payload_encoding` — `"utf8"` when the payload is valid UTF-8 (the payload is
//! then the text itself), else `"base64"` (standard alphabet, padded) —, `user_properties`
//! (a list of `[name, value]` pairs in order, as an MQTT 5 subscriber sees them; a Kafka
//! record's headers appear here too), and, when present, `content_type`, `response_topic`,
//! `correlation_data` (base64), `message_expiry` (seconds), `payload_format_utf8`, and `key`
//! (base64; only for a record whose key is not its topic, i.e. one a Kafka producer wrote).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value, json};
use silt_broker::Message;
use silt_storage::Record;
use silt_types::{Partition, Timestamp};

use crate::grpc::pb;

/// The output format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Jsonl,
    Parquet,
}

/// What was written.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub records: u64,
    pub bytes: u64,
    pub topics: usize,
}

/// A time argument as ms since the Unix epoch: digits are ms; `30s`, `15m`, `2h`, `7d` are that
/// long before `now_ms`; anything else must be RFC 3339 (`2026-12-01T10:00:00Z`).
pub fn parse_time(s: &str, now_ms: i64) -> Result<i64, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().map_err(|_| format!("{s:?}: too large for ms since the epoch"));
    }
    if let Some(unit) = s.chars().last().filter(|c| "smhd".contains(*c)) {
        let n = &s[..s.len() - 1];
        if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
            let n: i64 = n.parse().map_err(|_| format!("{s:?}: too large"))?;
            let ms = match unit {
                's' => 1_000,
                'm' => 60_000,
                'h' => 3_600_000,
                _ => 86_400_000,
            };
            return Ok(now_ms.saturating_sub(n.saturating_mul(ms)).max(0));
        }
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("{s:?}: neither ms since the epoch, a duration ago (1h) nor RFC 3339: {e}"))
}

/// The record as storage keeps it, for [`Message::from_record`] (one mapping of headers to
/// MQTT properties).
fn record_of(r: &pb::ExportRecord) -> Record {
    Record {
        timestamp: Timestamp(r.timestamp_ms),
        stream: r.stream.clone(),
        partition: Partition(r.partition),
        topic: r.topic.clone(),
        key: r.key.clone().map(Bytes::from),
        value: Bytes::from(r.payload.clone()),
        headers: r.headers.iter().map(|h| (h.name.clone(), h.value.clone().map(Bytes::from))).collect(),
        attrs: u16::try_from(r.attrs).unwrap_or_default(),
        ..Record::default()
    }
}

/// One JSON line (without the newline).
pub fn json_line(r: &pb::ExportRecord) -> String {
    let m = Message::from_record(record_of(r));
    let mut o = Map::new();
    o.insert("topic".into(), json!(m.topic));
    o.insert("offset".into(), json!(r.offset));
    o.insert("timestamp_ms".into(), json!(r.timestamp_ms));
    o.insert("qos".into(), json!(m.qos));
    o.insert("retain".into(), json!(m.retain));
    let (payload, encoding) = match std::str::from_utf8(&m.payload) {
        Ok(text) => (text.to_owned(), "utf8"),
        Err(_) => (B64.encode(&m.payload), "base64"),
    };
    o.insert("payload".into(), json!(payload));
    o.insert("payload_encoding".into(), json!(encoding));
    o.insert("user_properties".into(), json!(m.user_properties));
    if m.utf8_payload {
        o.insert("payload_format_utf8".into(), json!(true));
    }
    if let Some(v) = m.content_type {
        o.insert("content_type".into(), json!(v));
    }
    if let Some(v) = m.response_topic {
        o.insert("response_topic".into(), json!(v));
    }
    if let Some(v) = m.correlation_data {
        o.insert("correlation_data".into(), json!(B64.encode(v)));
    }
    if let Some(v) = m.expiry {
        o.insert("message_expiry".into(), json!(v));
    }
    if let Some(k) = r.key.as_deref().filter(|k| *k != r.topic.as_bytes()) {
        o.insert("key".into(), json!(B64.encode(k)));
    }
    Value::Object(o).to_string()
}

/// The lakehouse row of a record (`offset` is the topic queue's, not a Kafka partition's).
fn row(r: &pb::ExportRecord) -> silt_lakehouse::rows::Row {
    silt_lakehouse::rows::Row {
        topic: r.topic.clone(),
        stream: r.stream.clone(),
        partition: i32::try_from(r.partition).unwrap_or(i32::MAX),
        offset: i64::try_from(r.offset).unwrap_or(i64::MAX),
        timestamp_ms: r.timestamp_ms,
        key: r.key.clone().map(Bytes::from),
        payload: Bytes::from(r.payload.clone()),
        qos: i32::try_from(r.attrs & u32::from(silt_dataset::attrs::QOS_MASK)).unwrap_or_default(),
        properties: r
            .headers
            .iter()
            .map(|h| (h.name.clone(), String::from_utf8_lossy(h.value.as_deref().unwrap_or_default()).into_owned()))
            .collect(),
    }
}

/// Where the records go.
enum Sink {
    Jsonl(Box<dyn Write>),
    Parquet(Box<parquet::arrow::ArrowWriter<std::fs::File>>, arrow_schema::SchemaRef),
}

fn create(p: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::File::create(p).map_err(|e| anyhow::anyhow!("--output: cannot create {}: {e}", p.display()))
}

impl Sink {
    fn open(format: Format, output: Option<&Path>) -> anyhow::Result<Sink> {
        match (format, output) {
            (Format::Jsonl, None) => Ok(Sink::Jsonl(Box::new(std::io::BufWriter::new(std::io::stdout())))),
            (Format::Jsonl, Some(p)) => Ok(Sink::Jsonl(Box::new(std::io::BufWriter::new(create(p)?)))),
            (Format::Parquet, None) => anyhow::bail!("--format parquet needs --output FILE"),
            (Format::Parquet, Some(p)) => {
                let schema = silt_lakehouse::schema::envelope_arrow()?;
                let props = parquet::file::properties::WriterProperties::builder()
                    .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
                    .build();
                let w = parquet::arrow::ArrowWriter::try_new(create(p)?, schema.clone(), Some(props))?;
                Ok(Sink::Parquet(Box::new(w), schema))
            }
        }
    }

    fn write(&mut self, records: &[pb::ExportRecord]) -> anyhow::Result<()> {
        match self {
            Sink::Jsonl(w) => {
                for r in records {
                    w.write_all(json_line(r).as_bytes())?;
                    w.write_all(b"\n")?;
                }
            }
            Sink::Parquet(w, schema) => {
                let rows: Vec<_> = records.iter().map(row).collect();
                let batch = silt_lakehouse::rows::batch(schema, &BTreeMap::new(), &rows).map_err(anyhow::Error::msg)?;
                w.write(&batch)?;
            }
        }
        Ok(())
    }

    fn finish(self) -> anyhow::Result<()> {
        match self {
            Sink::Jsonl(mut w) => w.flush()?,
            Sink::Parquet(w, _) => {
                w.close()?;
            }
        }
        Ok(())
    }
}

/// The arguments of `silt export`.
pub struct Args<'a> {
    pub filter: &'a str,
    pub since: Option<&'a str>,
    pub until: Option<&'a str>,
    pub format: Format,
    pub output: Option<&'a PathBuf>,
    pub batch: u32,
}

/// Runs one export against the node.
pub async fn run(c: &mut crate::cli::Client, a: Args<'_>) -> Result<Summary, crate::cli::Failure> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let time = |flag: &str, v: Option<&str>| -> anyhow::Result<i64> {
        v.map_or(Ok(0), |v| parse_time(v, now)).map_err(|e| anyhow::anyhow!("{flag} {e}"))
    };
    let since_ms = time("--since", a.since)?;
    // 0: the node's now.
    let until_ms = time("--until", a.until)?;
    if a.format == Format::Parquet && a.output.is_none() {
        return Err(anyhow::anyhow!("--format parquet needs --output FILE").into());
    }
    let req = pb::ExportRequest { filter: a.filter.to_owned(), since_ms, until_ms, batch_records: a.batch };
    let mut stream = c.export(req).await?.into_inner();
    let mut sink = Sink::open(a.format, a.output.map(PathBuf::as_path))?;
    // Drawn on a terminal only (indicatif hides itself otherwise); a script sees the summary.
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{spinner} exporting {bar:30} {pos}/{len} records ({eta} left)")
            .expect("invariant: a valid template"),
    );
    let mut s = Summary::default();
    while let Some(chunk) = stream.message().await? {
        match chunk.part {
            Some(pb::export_chunk::Part::Plan(p)) => {
                s.topics = p.topics.len();
                bar.set_length(p.records);
            }
            Some(pb::export_chunk::Part::Batch(b)) => {
                sink.write(&b.records)?;
                s.records += b.records.len() as u64;
                s.bytes += b.records.iter().map(|r| r.payload.len() as u64).sum::<u64>();
                bar.inc(b.records.len() as u64);
            }
            None => {}
        }
    }
    bar.finish_and_clear();
    sink.finish()?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_ms_durations_ago_or_rfc3339() {
        let now = 1_000_000_000;
        assert_eq!(parse_time("1764583200000", now), Ok(1_764_583_200_000));
        assert_eq!(parse_time("2025-12-01T10:00:00Z", now), Ok(1_764_583_200_000));
        assert_eq!(parse_time("2025-12-01T11:00:00.5+01:00", now), Ok(1_764_583_200_500));
        assert_eq!(parse_time("1h", now), Ok(now - 3_600_000));
        assert_eq!(parse_time("30s", now), Ok(now - 30_000));
        assert_eq!(parse_time("7d", 0), Ok(0));
        assert!(parse_time("yesterday", now).unwrap_err().contains("RFC 3339"));
        assert!(parse_time("h", now).is_err());
        assert!(parse_time("-5", now).is_err());
    }

    fn record(payload: &[u8]) -> pb::ExportRecord {
        let m = Message {
            topic: "a/1/t".into(),
            payload: Bytes::copy_from_slice(payload),
            qos: 1,
            retain: true,
            user_properties: vec![("k".into(), "v".into()), ("mqtt.x".into(), "y".into())],
            content_type: Some("text/plain".into()),
            timestamp: Timestamp(42),
            ..Message::default()
        };
        let r = m.to_record();
        pb::ExportRecord {
            topic: r.topic,
            offset: 7,
            timestamp_ms: r.timestamp.get(),
            payload: r.value.to_vec(),
            attrs: u32::from(r.attrs),
            key: r.key.map(|k| k.to_vec()),
            headers: r.headers.into_iter().map(|(name, v)| pb::Header { name, value: v.map(|v| v.to_vec()) }).collect(),
            stream: r.stream,
            partition: r.partition.get(),
        }
    }

    #[test]
    fn a_json_line_has_the_text_payload_and_mqtt_properties() {
        let v: Value = serde_json::from_str(&json_line(&record(b"hello"))).unwrap();
        assert_eq!(
            v,
            json!({
                "topic": "a/1/t", "offset": 7, "timestamp_ms": 42, "qos": 1, "retain": true,
                "payload": "hello", "payload_encoding": "utf8",
                "user_properties": [["k", "v"], ["mqtt.x", "y"]],
                "content_type": "text/plain",
            })
        );
    }

    #[test]
    fn a_binary_payload_is_base64_and_a_kafka_key_is_kept() {
        let mut r = record(&[0, 159, 146, 150, 255]);
        r.key = Some(b"k1".to_vec());
        let v: Value = serde_json::from_str(&json_line(&r)).unwrap();
        assert_eq!(v["payload_encoding"], "base64");
        assert_eq!(B64.decode(v["payload"].as_str().unwrap()).unwrap(), [0, 159, 146, 150, 255]);
        assert_eq!(v["key"], B64.encode(b"k1"));
    }
}
