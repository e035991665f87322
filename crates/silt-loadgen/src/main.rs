//! `silt-loadgen`: a load generator for whole-broker figures, run against Silt and a reference
//! broker in the same session: MQTT beside mosquitto (`bench/mqtt.sh`), Kafka beside Tansu and
//! the raw disk (`scripts/bench-kafka.sh`).
//!
//! Modules:
//! - `client`: a minimal MQTT client on tokio TCP and the `silt-mqtt` codec; `connect_many`.
//! - `publisher`: one publishing connection with a QoS 1 window, pacing and a backlog gate.
//! - `flow`: the fan-in and fan-out scenarios (throughput, latency from payload stamps).
//! - `idle`: many idle connections (connect rate, broker RSS per connection).
//! - `drain`: an offline persistent session's backlog, timed from reconnect.
//! - `disk`: the disk's own write + `fdatasync` latency, the floor under a broker that syncs.
//! - `payload`, `histogram`, `procfs`: stamps, latency percentiles, `/proc` readings.
//! - `table`: the Markdown comparison of result lines.
//! - `kafka`: a Kafka client on the `kafka-protocol` codecs; produce, consume, produce→consume
//!   and MQTT publish → Kafka fetch scenarios.
//!
//! Each scenario prints one JSON line on stdout (progress goes to stderr). Every loop is
//! bounded in messages and time, and only loopback addresses are accepted as targets.

mod client;
mod disk;
mod drain;
mod flow;
mod histogram;
mod idle;
mod kafka;
mod payload;
mod procfs;
mod publisher;
mod table;
#[cfg(test)]
mod tests;

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use silt_mqtt::{ProtocolVersion, QoS};

use crate::disk::DiskSyncConfig;
use crate::drain::DrainConfig;
use crate::flow::{FlowConfig, Shape};
use crate::idle::IdleConfig;
use crate::kafka::client::FetchLimits;
use crate::kafka::consume::{ReadConfig, TailConfig};
use crate::kafka::mqtt::MqttKafkaConfig;
use crate::kafka::produce::ProduceConfig;
use crate::payload::Clock;
use crate::procfs::Proc;

#[derive(Parser, Debug)]
#[command(
    name = "silt-loadgen",
    version,
    about = "Load generator: MQTT fan-in, fan-out, idle, offline drain; Kafka produce, consume, produce→consume; the disk's sync latency"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Many publishers (bench/{i}/t), wildcard subscribers (bench/+/t).
    FanIn {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        flow: FlowArgs,
    },
    /// Publishers and many subscribers on one topic (fanout/t).
    FanOut {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        flow: FlowArgs,
    },
    /// Open many idle connections: connect rate and broker RSS per connection.
    Idle {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        idle: IdleArgs,
    },
    /// Queue messages for an offline persistent session, then time its drain.
    Drain {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        drain: DrainArgs,
    },
    /// Kafka producers (acks=all by default), each its own connection: records/s, MB/s.
    KafkaProduce {
        #[command(flatten)]
        target: KafkaTarget,
        #[command(flatten)]
        produce: ProduceArgs,
        /// Row label in the results [default: "produce" and the shape], e.g. to keep a fill
        /// apart from a timed run of the same shape.
        #[arg(long)]
        case: Option<String>,
    },
    /// Read a Kafka topic from its earliest offsets to the latest ones seen at the start.
    KafkaConsume {
        #[command(flatten)]
        target: KafkaTarget,
        #[arg(long, default_value = "bench")]
        topic: String,
        #[command(flatten)]
        fetch: FetchArgs,
        /// Row label in the results [default: "consume from offset 0"].
        #[arg(long)]
        case: Option<String>,
        /// Seconds after which the read is given up.
        #[arg(long, default_value_t = 300.0)]
        max_time: f64,
    },
    /// Kafka producers and a consumer from the latest offsets at once: consume rate and
    /// produce→consume latency (pace the producers with --rate for latency without queueing).
    KafkaTail {
        #[command(flatten)]
        target: KafkaTarget,
        #[command(flatten)]
        produce: ProduceArgs,
        #[command(flatten)]
        fetch: FetchArgs,
        /// Seconds the consumer waits for missing records after producing ends.
        #[arg(long, default_value_t = 5.0)]
        grace: f64,
    },
    /// MQTT publishers on TOPIC/{i}/t read back by a Kafka consumer of topic TOPIC (--addr is
    /// the Kafka listener).
    MqttKafka {
        #[command(flatten)]
        target: KafkaTarget,
        #[command(flatten)]
        args: MqttKafkaArgs,
        #[command(flatten)]
        fetch: FetchArgs,
    },
    /// The disk's own latency: write SIZE bytes and fdatasync every INTERVAL for DURATION in
    /// a file in DIR (the broker's data directory's filesystem); no broker involved.
    DiskSync {
        /// Directory to write the probe file in (removed at the end).
        #[arg(long)]
        dir: PathBuf,
        /// Bytes written before each sync.
        #[arg(long, default_value_t = 4096)]
        size: usize,
        /// Microseconds between syncs (a sync that takes longer delays the next one).
        #[arg(long, default_value_t = 500)]
        interval_us: u64,
        /// Seconds.
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
    },
    /// Print result lines (a file or stdin) as a Markdown comparison table.
    Table {
        /// The brokers compared against (denominators of the ratios); repeat for several.
        #[arg(long, default_values_t = ["mosquitto".to_owned()])]
        reference: Vec<String>,
        /// The broker measured (numerator of the ratio).
        #[arg(long, default_value = "silt")]
        subject: String,
        /// JSON lines as printed by the scenarios; stdin if absent.
        file: Option<PathBuf>,
    },
    /// Print a loopback TCP port that is free right now.
    FreePort,
}

#[derive(Args, Debug)]
struct Target {
    /// Broker address; only loopback addresses are accepted.
    #[arg(long, default_value = "127.0.0.1:1883")]
    addr: SocketAddr,
    /// Name of the broker in the results.
    #[arg(long, default_value = "broker")]
    broker: String,
    /// PID of the broker, to read its RSS and CPU time from /proc.
    #[arg(long)]
    broker_pid: Option<u32>,
    /// MQTT version: 3.1.1 or 5.
    #[arg(long, default_value = "3.1.1", value_parser = parse_version)]
    protocol: ProtocolVersion,
    /// Worker threads of the generator (1: a single-threaded runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[derive(Args, Debug)]
struct KafkaTarget {
    /// Kafka listener; only loopback addresses are accepted.
    #[arg(long, default_value = "127.0.0.1:9092")]
    addr: SocketAddr,
    /// Name of the broker in the results.
    #[arg(long, default_value = "broker")]
    broker: String,
    /// PID of the broker, to read its RSS and CPU time from /proc.
    #[arg(long)]
    broker_pid: Option<u32>,
    /// Worker threads of the generator (1: a single-threaded runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[derive(Args, Debug)]
struct ProduceArgs {
    #[arg(long, default_value = "bench")]
    topic: String,
    /// Partitions the topic is created with if it does not exist.
    #[arg(long, default_value_t = 1)]
    partitions: i32,
    /// Producer connections.
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Records per batch (one batch per Produce request).
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Bytes of each record's value (at least 20: the stamp).
    #[arg(long, default_value_t = 1024)]
    record: usize,
    /// Produce requests in flight per producer (max.in.flight.requests.per.connection).
    #[arg(long, default_value_t = 5)]
    window: usize,
    /// -1 (all), 1 or 0.
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    acks: i16,
    /// Seconds of producing.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Records in all (0: as many as the duration allows).
    #[arg(long, default_value_t = 0)]
    records: u64,
    /// Records per second over all producers (0: as fast as acknowledged).
    #[arg(long, default_value_t = 0)]
    rate: u64,
}

#[derive(Args, Debug)]
struct FetchArgs {
    /// Longest a Fetch waits for data (fetch.max.wait.ms).
    #[arg(long, default_value_t = 500)]
    max_wait_ms: i32,
    /// Bytes a Fetch returns per partition at most (max.partition.fetch.bytes).
    #[arg(long, default_value_t = 1 << 20)]
    partition_max_bytes: i32,
    /// Bytes a Fetch returns at most (fetch.max.bytes).
    #[arg(long, default_value_t = 50 << 20)]
    max_bytes: i32,
}

#[derive(Args, Debug)]
struct MqttKafkaArgs {
    /// The broker's MQTT listener.
    #[arg(long, default_value = "127.0.0.1:1883")]
    mqtt_addr: SocketAddr,
    /// MQTT version: 3.1.1 or 5.
    #[arg(long, default_value = "3.1.1", value_parser = parse_version)]
    protocol: ProtocolVersion,
    /// First level of the MQTT topics: the Kafka topic read.
    #[arg(long, default_value = "mqttkafka")]
    topic: String,
    #[arg(long, default_value_t = 1)]
    publishers: usize,
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    qos: u8,
    #[arg(long, default_value_t = 1024)]
    payload: usize,
    /// Unacknowledged QoS 1 publishes per publisher.
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// Publishes per second over all publishers (0: as fast as acknowledged).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds the consumer waits for missing records after publishing ends.
    #[arg(long, default_value_t = 5.0)]
    grace: f64,
}

#[derive(Args, Debug)]
struct FlowArgs {
    /// Publishing connections [fan-in: 50, fan-out: 1].
    #[arg(long)]
    publishers: Option<usize>,
    /// Subscribing connections [fan-in: 1, fan-out: 200].
    #[arg(long)]
    subscribers: Option<usize>,
    /// QoS of publishes and subscriptions: 0 or 1.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    qos: u8,
    /// Seconds of publishing.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Payload bytes (at least 20: the stamp).
    #[arg(long, default_value_t = 128)]
    payload: usize,
    /// Unacknowledged QoS 1 publishes per publisher.
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// Publishers wait while this many deliveries are owed to subscribers (0: never).
    #[arg(long, default_value_t = 10_000)]
    max_lag: u64,
    /// Total publish rate in messages per second (0: as fast as delivery allows).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Seconds subscribers wait for missing messages after publishing ends.
    #[arg(long, default_value_t = 5.0)]
    grace: f64,
}

#[derive(Args, Debug)]
struct IdleArgs {
    #[arg(long, default_value_t = 5_000)]
    connections: usize,
    /// Handshakes in progress at once.
    #[arg(long, default_value_t = 100)]
    concurrency: usize,
    /// Seconds to hold every connection open before reading the broker's RSS.
    #[arg(long, default_value_t = 2.0)]
    settle: f64,
    /// Seconds after the connections opened to read the broker's RSS again, once the
    /// allocator has returned what the burst of connections freed (0: no second reading).
    #[arg(long, default_value_t = 0.0)]
    settled: f64,
    /// Each connection subscribes to a wildcard filter of its own after its CONNACK.
    #[arg(long)]
    subscribe: bool,
}

#[derive(Args, Debug)]
struct DrainArgs {
    /// Messages queued for the offline session.
    #[arg(long, default_value_t = 100_000)]
    messages: u64,
    /// Publishing connections used to queue them.
    #[arg(long, default_value_t = 1)]
    publishers: usize,
    /// Unacknowledged QoS 1 publishes per publisher.
    #[arg(long, default_value_t = 32)]
    window: usize,
    #[arg(long, default_value_t = 128)]
    payload: usize,
    /// Seconds without a delivery after which the drain is given up.
    #[arg(long, default_value_t = 10.0)]
    idle_timeout: f64,
    /// Seconds after which filling or draining is given up.
    #[arg(long, default_value_t = 300.0)]
    max_time: f64,
    /// Seconds to wait between filling and draining.
    #[arg(long, default_value_t = 0.0)]
    pause: f64,
}

fn parse_version(s: &str) -> Result<ProtocolVersion, String> {
    match s {
        "3.1.1" | "4" => Ok(ProtocolVersion::V3_1_1),
        "5" | "5.0" => Ok(ProtocolVersion::V5),
        _ => Err(format!("unsupported MQTT version {s:?} (3.1.1 or 5)")),
    }
}

/// What every scenario needs to know about its target and run.
pub struct Env {
    pub addr: SocketAddr,
    pub label: String,
    pub broker: Option<Proc>,
    pub version: ProtocolVersion,
    pub clock: Clock,
    /// Prefix of client identifiers, unique per generator process.
    pub prefix: String,
}

/// A scenario ready to run, with the names its result line carries.
enum Scenario {
    Flow(FlowConfig),
    Idle(IdleConfig),
    Drain(DrainConfig),
    /// The config and the row label.
    KafkaProduce(ProduceConfig, String),
    KafkaRead(ReadConfig),
    KafkaTail(TailConfig),
    MqttKafka(MqttKafkaConfig),
}

fn produce_config(a: ProduceArgs) -> ProduceConfig {
    ProduceConfig {
        topic: a.topic,
        partitions: a.partitions,
        producers: a.producers,
        batch: a.batch,
        record: a.record,
        window: a.window,
        acks: a.acks,
        duration: secs(a.duration),
        records: a.records,
        rate: a.rate,
    }
}

fn fetch_limits(a: FetchArgs) -> FetchLimits {
    FetchLimits {
        max_wait_ms: a.max_wait_ms,
        partition_max_bytes: a.partition_max_bytes,
        max_bytes: a.max_bytes,
        ..FetchLimits::default()
    }
}

/// A Kafka target as the fields of the MQTT one (the MQTT version only matters to mqtt-kafka).
fn kafka_target(t: KafkaTarget, version: ProtocolVersion) -> Target {
    Target { addr: t.addr, broker: t.broker, broker_pid: t.broker_pid, protocol: version, threads: t.threads }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

fn flow_config(shape: Shape, a: FlowArgs) -> FlowConfig {
    let (publishers, subscribers) = match shape {
        Shape::FanIn => (a.publishers.unwrap_or(50), a.subscribers.unwrap_or(1)),
        Shape::FanOut => (a.publishers.unwrap_or(1), a.subscribers.unwrap_or(200)),
    };
    FlowConfig {
        shape,
        publishers,
        subscribers,
        qos: QoS::from_u8(a.qos).unwrap_or_default(),
        duration: secs(a.duration),
        payload: a.payload,
        window: a.window,
        max_lag: a.max_lag,
        rate: a.rate,
        grace: secs(a.grace),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (target, scenario) = match cli.command {
        Command::FanIn { target, flow } => (target, Scenario::Flow(flow_config(Shape::FanIn, flow))),
        Command::FanOut { target, flow } => (target, Scenario::Flow(flow_config(Shape::FanOut, flow))),
        Command::Idle { target, idle } => (
            target,
            Scenario::Idle(IdleConfig {
                connections: idle.connections,
                concurrency: idle.concurrency,
                settle: secs(idle.settle),
                settled: secs(idle.settled),
                subscribe: idle.subscribe,
            }),
        ),
        Command::Drain { target, drain } => (
            target,
            Scenario::Drain(DrainConfig {
                messages: drain.messages,
                publishers: drain.publishers,
                window: drain.window,
                payload: drain.payload,
                idle_timeout: secs(drain.idle_timeout),
                max_time: secs(drain.max_time),
                pause: secs(drain.pause),
            }),
        ),
        Command::KafkaProduce { target, produce, case } => {
            let cfg = produce_config(produce);
            let case = case.unwrap_or_else(|| format!("produce {}", cfg.case()));
            (kafka_target(target, ProtocolVersion::V3_1_1), Scenario::KafkaProduce(cfg, case))
        }
        Command::KafkaConsume { target, topic, fetch, case, max_time } => (
            kafka_target(target, ProtocolVersion::V3_1_1),
            Scenario::KafkaRead(ReadConfig { topic, limits: fetch_limits(fetch), case, max_time: secs(max_time) }),
        ),
        Command::KafkaTail { target, produce, fetch, grace } => (
            kafka_target(target, ProtocolVersion::V3_1_1),
            Scenario::KafkaTail(TailConfig {
                produce: produce_config(produce),
                limits: fetch_limits(fetch),
                grace: secs(grace),
            }),
        ),
        Command::MqttKafka { target, args: a, fetch } => {
            if !a.mqtt_addr.ip().is_loopback() {
                eprintln!("silt-loadgen: refusing {}: only loopback targets are allowed", a.mqtt_addr);
                return ExitCode::FAILURE;
            }
            (
                kafka_target(target, a.protocol),
                Scenario::MqttKafka(MqttKafkaConfig {
                    mqtt: a.mqtt_addr,
                    topic: a.topic,
                    publishers: a.publishers,
                    qos: QoS::from_u8(a.qos).unwrap_or_default(),
                    payload: a.payload,
                    window: a.window,
                    rate: a.rate,
                    duration: secs(a.duration),
                    limits: fetch_limits(fetch),
                    grace: secs(a.grace),
                }),
            )
        }
        Command::Table { reference, subject, file } => return print_table(file, &reference, &subject),
        Command::FreePort => return free_port(),
        Command::DiskSync { dir, size, interval_us, duration } => {
            let c =
                DiskSyncConfig { dir, size, interval: Duration::from_micros(interval_us), duration: secs(duration) };
            return match disk::run(&c).and_then(|r| Ok(serde_json::to_string(&r)?)) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("silt-loadgen: disk sync in {}: {e:#}", c.dir.display());
                    ExitCode::FAILURE
                }
            };
        }
    };
    if !target.addr.ip().is_loopback() {
        eprintln!("silt-loadgen: refusing {}: only loopback targets are allowed", target.addr);
        return ExitCode::FAILURE;
    }
    let env = Env {
        addr: target.addr,
        label: target.broker.clone(),
        broker: target.broker_pid.map(Proc::Pid),
        version: target.protocol,
        clock: Clock::default(),
        prefix: format!("lg{}", std::process::id()),
    };
    let runtime = if target.threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(target.threads).enable_all().build()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("silt-loadgen: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (name, case) = match &scenario {
        Scenario::Flow(c) => (if c.shape == Shape::FanIn { "fan-in" } else { "fan-out" }, c.case()),
        Scenario::Idle(c) => ("idle", format!("idle {} connections", c.connections)),
        Scenario::Drain(c) => ("drain", format!("offline drain {} QoS1", c.messages)),
        Scenario::KafkaProduce(_, case) => ("kafka-produce", case.clone()),
        Scenario::KafkaRead(c) => ("kafka-consume", c.case.clone().unwrap_or_else(|| "consume from offset 0".into())),
        Scenario::KafkaTail(c) => ("kafka-tail", format!("produce→consume {}", c.produce.case())),
        Scenario::MqttKafka(c) => ("mqtt-kafka", c.case()),
    };
    let result = runtime.block_on(async {
        match scenario {
            Scenario::Flow(c) => flow::run(&env, c).await.and_then(|r| Ok(serde_json::to_string(&r)?)),
            Scenario::Idle(c) => idle::run(&env, c).await.and_then(|r| Ok(serde_json::to_string(&r)?)),
            Scenario::Drain(c) => drain::run(&env, c).await.and_then(|r| Ok(serde_json::to_string(&r)?)),
            Scenario::KafkaProduce(c, case) => {
                kafka::produce::run(&env, c, case).await.and_then(|r| Ok(serde_json::to_string(&r)?))
            }
            Scenario::KafkaRead(c) => kafka::consume::read(&env, c).await.and_then(|r| Ok(serde_json::to_string(&r)?)),
            Scenario::KafkaTail(c) => kafka::consume::tail(&env, c).await.and_then(|r| Ok(serde_json::to_string(&r)?)),
            Scenario::MqttKafka(c) => kafka::mqtt::run(&env, c).await.and_then(|r| Ok(serde_json::to_string(&r)?)),
        }
    });
    // Connections still closing in the background must not hold the process.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("silt-loadgen: {case} against {}: {e:#}", env.label);
            let line =
                serde_json::json!({"scenario": name, "case": case, "broker": env.label, "error": format!("{e:#}")});
            println!("{line}");
            ExitCode::FAILURE
        }
    }
}

fn print_table(file: Option<PathBuf>, references: &[String], subject: &str) -> ExitCode {
    let text = match file {
        Some(path) => std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display())),
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map(|_| s).map_err(|e| format!("stdin: {e}"))
        }
    };
    match text {
        Ok(text) => {
            let references: Vec<&str> = references.iter().map(String::as_str).collect();
            print!("{}", table::render(&text, &references, subject));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("silt-loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}

fn free_port() -> ExitCode {
    match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(addr) => {
            println!("{}", addr.port());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("silt-loadgen: no free port: {e}");
            ExitCode::FAILURE
        }
    }
}
