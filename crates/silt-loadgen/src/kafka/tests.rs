//! The Kafka client and scenarios, small, against a real `silt serve` on free loopback ports
//! and a temporary data directory: counts must add up (every acknowledged record consumed,
//! offsets dense). The binary is `SILT_BIN`, or `silt` in the target directory this test was
//! built into (a workspace build or test run builds it); skipped, with a note, when absent.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{FetchRequest, ProduceRequest};
use silt_mqtt::{ProtocolVersion, QoS};

use super::batch;
use super::client::{self, EARLIEST, FetchLimits, KafkaClient, LATEST};
use super::consume::{self, ReadConfig, TailConfig};
use super::mqtt::{self, MqttKafkaConfig};
use super::produce::{self, ProduceConfig};
use crate::Env;
use crate::payload::{Clock, Stamp};
use crate::procfs::Proc;

struct Silt {
    child: Child,
    _dir: tempfile::TempDir,
    kafka: SocketAddr,
    mqtt: SocketAddr,
}

impl Drop for Silt {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn silt_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SILT_BIN") {
        return Some(PathBuf::from(p));
    }
    // target/<profile>/deps/silt_loadgen-<hash> → target/<profile>/silt
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("silt");
    bin.is_file().then_some(bin)
}

/// The address after `marker` and `key` in a log line, e.g. `addr=127.0.0.1:PORT`.
fn addr_after(line: &str, marker: &str, key: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let rest = &rest[rest.find(key)? + key.len()..];
    rest.split(|c: char| c.is_whitespace() || c == ',').next()?.parse().ok()
}

fn silt() -> Option<Silt> {
    let Some(bin) = silt_bin() else {
        eprintln!("silt binary not built (cargo build -p silt, or SILT_BIN): skipping");
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin)
        .args(["serve", "--mqtt", "127.0.0.1:0", "--kafka", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("SILT_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn silt");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut kafka, mut log) = (None, Vec::new());
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if kafka.is_none() {
                kafka = addr_after(&line, "kafka listener bound", "addr=");
            }
            if let Some(mqtt) = addr_after(&line, "silt is running", "mqtt=") {
                let _ = tx.send(Ok((kafka, mqtt)));
            }
            log.push(line);
            if log.len() > 200 {
                log.remove(0);
            }
        }
        let _ = tx.send(Err(log));
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok((Some(kafka), mqtt))) => Some(Silt { child, _dir: dir, kafka, mqtt }),
        other => {
            let _ = child.kill();
            panic!("silt did not start with a Kafka listener: {other:?}");
        }
    }
}

fn env(s: &Silt) -> Env {
    Env {
        addr: s.kafka,
        label: "silt".into(),
        broker: Some(Proc::Pid(s.child.id())),
        version: ProtocolVersion::V3_1_1,
        clock: Clock::default(),
        prefix: format!("lgtest{}", std::process::id()),
    }
}

fn produce_config(topic: &str) -> ProduceConfig {
    ProduceConfig {
        topic: topic.into(),
        partitions: 1,
        producers: 2,
        batch: 10,
        record: 256,
        window: 3,
        acks: -1,
        duration: Duration::from_millis(400),
        records: 0,
        rate: 0,
    }
}

#[tokio::test]
async fn batches_get_dense_offsets_and_fetch_returns_them_from_any_offset() {
    let Some(s) = silt() else { return };
    let mut c = KafkaClient::connect(s.kafka, "lgtest-client").await.unwrap();
    // Silt's announced maxima are the client's: the same requests as a reference broker.
    assert_eq!((c.versions.produce, c.versions.fetch), (9, 12));
    assert_eq!(c.ensure_topic("dense", 1).await.unwrap(), 1);
    assert_eq!(c.ensure_topic("dense", 1).await.unwrap(), 1, "an existing topic is fine");
    let topic = client::topic_name("dense");
    let clock = Clock::default();
    for i in 0..3u64 {
        let values: Vec<Bytes> = (0..5)
            .map(|j| batch::stamped_value(64, &Stamp { sent_ns: clock.now_ns(), publisher: 1, seq: i * 5 + j }))
            .collect();
        let records = batch::encode(&values, Some(&Bytes::from_static(b"key")), 1_700_000_000_000).unwrap();
        c.send(&client::produce_request(&topic, 0, records, -1), c.versions.produce).unwrap();
    }
    // Three requests in one write, then their responses in order: pipelined.
    c.flush().await.unwrap();
    let mut bases = Vec::new();
    for _ in 0..3 {
        bases.push(client::produce_result(&c.recv::<ProduceRequest>().await.unwrap()).unwrap());
    }
    assert_eq!(bases, vec![0, 5, 10]);
    assert_eq!(c.list_offset("dense", 0, EARLIEST).await.unwrap(), 0);
    assert_eq!(c.list_offset("dense", 0, LATEST).await.unwrap(), 15);

    let req = client::fetch_request(&topic, &[(0, 7)], FetchLimits::default());
    let resp = c.call::<FetchRequest>(&req, c.versions.fetch).await.unwrap();
    assert_eq!(resp.responses[0].partitions[0].high_watermark, 15);
    let parts = client::fetch_result(&resp).unwrap();
    assert_eq!(parts.len(), 1);
    let (mut at, mut seqs) = (7, Vec::new());
    for b in batch::split(&parts[0].records).unwrap() {
        b.verify().unwrap();
        assert!(b.last_offset >= at);
        seqs.extend(b.values(at).unwrap().iter().map(|v| Stamp::read(v).unwrap().seq));
        at = b.last_offset + 1;
    }
    assert_eq!(seqs, (7..15).collect::<Vec<_>>());
    assert_eq!(at, 15);
}

#[tokio::test]
async fn a_read_from_offset_zero_gets_exactly_the_records_produced() {
    let Some(s) = silt() else { return };
    let e = env(&s);
    let cfg = ProduceConfig { records: 1_001, duration: Duration::from_secs(30), ..produce_config("fill") };
    let p = produce::run(&e, cfg, "fill".into()).await.unwrap();
    assert_eq!(p.case, "fill");
    assert_eq!((p.sent, p.acked, p.errors), (1_001, 1_001, 0), "{:?}", p.first_error);
    assert!(p.records_per_s > 0.0 && p.ack_latency_us.is_some_and(|l| l.count == 101));
    assert!(p.broker_cpu_us_per_record.is_some());
    // Small fetches, so the read takes many round trips.
    let limits = FetchLimits { partition_max_bytes: 16 * 1024, ..FetchLimits::default() };
    let cfg = ReadConfig { topic: "fill".into(), limits, case: None, max_time: Duration::from_secs(60) };
    let r = consume::read(&e, cfg).await.unwrap();
    assert_eq!((r.expected, r.records, r.missing), (1_001, 1_001, 0));
    assert!(r.fetches > 10, "{} fetches", r.fetches);
    assert!(r.bytes >= 1_001 * 256);
}

#[tokio::test]
async fn a_tailing_consumer_gets_every_acknowledged_record() {
    let Some(s) = silt() else { return };
    let cfg =
        TailConfig { produce: produce_config("tail"), limits: FetchLimits::default(), grace: Duration::from_secs(5) };
    let r = consume::tail(&env(&s), cfg).await.unwrap();
    assert!(r.acked > 0 && r.produce_errors == 0, "{:?}", r.first_error);
    assert_eq!((r.consumed, r.lost), (r.acked, 0));
    // Unpaced: one stamp per batch of 10.
    assert_eq!(r.latency_us.map(|l| l.count), Some(r.acked / 10));
}

#[tokio::test]
async fn paced_producers_stamp_every_record_at_about_the_rate() {
    let Some(s) = silt() else { return };
    let produce = ProduceConfig { rate: 200, batch: 1, duration: Duration::from_secs(1), ..produce_config("paced") };
    let cfg = TailConfig { produce, limits: FetchLimits::default(), grace: Duration::from_secs(5) };
    let r = consume::tail(&env(&s), cfg).await.unwrap();
    // 200/s for 1 s, each of 2 producers allowed one record ahead of its schedule.
    assert!(r.acked > 100 && r.acked <= 202, "acked {}", r.acked);
    assert_eq!((r.consumed, r.lost), (r.acked, 0));
    assert_eq!(r.latency_us.map(|l| l.count), Some(r.acked));
}

#[tokio::test]
async fn mqtt_publishes_are_fetched_over_kafka() {
    let Some(s) = silt() else { return };
    let cfg = MqttKafkaConfig {
        mqtt: s.mqtt,
        topic: "mk".into(),
        publishers: 2,
        qos: QoS::AtLeastOnce,
        payload: 128,
        window: 8,
        rate: 200,
        duration: Duration::from_secs(1),
        limits: FetchLimits::default(),
        grace: Duration::from_secs(5),
    };
    let r = mqtt::run(&env(&s), cfg).await.unwrap();
    assert!(r.acked > 100, "acked {}", r.acked);
    assert_eq!((r.consumed, r.lost), (r.acked, 0));
    assert_eq!(r.latency_us.map(|l| l.count), Some(r.acked));
    assert!(r.ack_latency_us.is_some());
}
