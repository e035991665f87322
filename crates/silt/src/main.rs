//! `silt`: the Silt broker's server binary.
//!
//! `silt serve` opens the storage engine on the data directory, recovers sessions and retained
//! messages, serves MQTT, and runs until SIGINT or SIGTERM; then it closes connections,
//! persists sessions, writes, fsyncs and indexes everything acknowledged and exits 0.

mod admin;
mod cli;
mod config;
mod export;
mod export_cli;
mod fsck;
mod grpc;
mod metrics;
mod status;
mod tiered;

use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;

use clap::{Parser, Subcommand};
use silt_broker::{Broker, Router};
use silt_storage::Storage;
use silt_tiering::Tiering;
use tokio::sync::watch;

use crate::config::SiltConfig;

/// jemalloc instead of glibc's malloc: the per-message path allocates and frees small buffers
/// on every connection task, and glibc's allocator took about 14% of the broker's CPU in a
/// QoS 1 fan-in (perf). Measured side by side (BENCHMARKS.md, issue 12): 22–30% less CPU per
/// delivered message, the same memory per idle connection (mimalloc was as fast but took
/// 8 KiB per idle connection instead of 5).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its start. `background_thread`: freed memory goes back to the
/// system (after jemalloc's decay, about 10 s) from a thread of its own, also when the broker
/// has gone quiet. Without it pages are purged only during later allocations, so a broker
/// whose connections went idle kept the memory their working state had used (measured,
/// BENCHMARKS.md: 3.1 KiB of RSS per idle connection after 15 s, 2.7 with it). The
/// `_RJEM_MALLOC_CONF` environment variable still overrides these.
#[allow(non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: &[u8; 23] = b"background_thread:true\0";

#[derive(Parser, Debug)]
#[command(name = "silt", version, about = "Silt: an object-storage-backed, tiered message broker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the broker.
    Serve(Box<ServeArgs>),
    /// Add or replace a user in a password file (argon2id for MQTT and Kafka SASL PLAIN, and
    /// SCRAM-SHA-256/512 credentials for Kafka SCRAM); reads the password from stdin.
    Passwd {
        /// The password file (`mqtt.auth.password_file`); created if missing.
        file: PathBuf,
        /// The username.
        user: String,
    },
    /// Check a stopped node's commitlog offline: every batch's CRC and framing, read only.
    /// Exits 1 and names each bad range when anything is bad.
    Fsck {
        /// The node's data directory.
        data_dir: PathBuf,
        /// The node's config file (for `storage.max_batch_bytes`).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// A running node's admin API (gRPC on its admin listener).
    #[command(flatten)]
    Admin(cli::Command),
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// TOML config file (see config/silt.toml for every key and its default).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory (commitlog and index); overrides `data_dir` from the config file.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// MQTT TCP listener address; overrides `mqtt.listen` (default 127.0.0.1:1883).
    #[arg(long, value_name = "ADDR")]
    mqtt: Option<String>,
    /// MQTT over TLS on ADDR; sets `mqtt.tls.listen` (needs a certificate and key: `[mqtt.tls]`
    /// in the config file, or --tls-cert and --tls-key).
    #[arg(long, value_name = "ADDR")]
    mqtt_tls: Option<String>,
    /// MQTT over WebSocket on ADDR (path /mqtt); sets `mqtt.websocket.listen`.
    #[arg(long, value_name = "ADDR")]
    mqtt_ws: Option<String>,
    /// MQTT over WebSocket over TLS on ADDR (path /mqtt); sets `mqtt.websocket_tls.listen`.
    #[arg(long, value_name = "ADDR")]
    mqtt_wss: Option<String>,
    /// PEM certificate chain for the TLS listeners; overrides their `cert_file`.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for the TLS listeners; overrides their `key_file`.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Kafka listener address; overrides `kafka.listen` (default 127.0.0.1:9092).
    #[arg(long, value_name = "ADDR")]
    kafka: Option<String>,
    /// Object store for sealed segments: s3://bucket/prefix (credentials, region and endpoint
    /// from AWS_* variables or the instance role) or file:///path; overrides
    /// `tiering.object_store` (default: DATA_DIR/objects).
    #[arg(long, value_name = "URL")]
    object_store: Option<String>,
    /// Admin HTTP listener (the status page at `/` and `/api/status`, `/metrics`, `/healthz`,
    /// `/readyz`, the Iceberg REST catalog at `/iceberg`); overrides `admin.listen` (default 127.0.0.1:8080).
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SILT_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Passwd { file, user } => passwd(&file, &user),
        Command::Fsck { data_dir, config } => return fsck(&data_dir, config.as_deref()),
        Command::Admin(cmd) => return cli::run(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("silt: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn passwd(file: &std::path::Path, user: &str) -> anyhow::Result<()> {
    if user.is_empty() || user.contains(':') || user.contains(char::is_whitespace) {
        anyhow::bail!("username must be non-empty, without ':' or spaces");
    }
    let mut password = String::new();
    std::io::stdin().read_line(&mut password)?;
    let password = password.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        anyhow::bail!("empty password on stdin");
    }
    let line = silt_broker::auth::password_line(user, password).map_err(|e| anyhow::anyhow!(e))?;
    let existing = std::fs::read_to_string(file).unwrap_or_default();
    let mut lines: Vec<String> =
        existing.lines().filter(|l| l.split_once(':').map(|(u, _)| u) != Some(user)).map(str::to_owned).collect();
    lines.push(line);
    std::fs::write(file, lines.join("\n") + "\n")
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", file.display()))?;
    eprintln!("silt: {user} set in {}", file.display());
    Ok(())
}

fn fsck(data_dir: &std::path::Path, config: Option<&std::path::Path>) -> ExitCode {
    let storage = match config.map(SiltConfig::load).transpose() {
        Ok(c) => c.unwrap_or_default().storage,
        Err(e) => {
            eprintln!("silt: {e:#}");
            return ExitCode::from(2);
        }
    };
    match fsck::run(data_dir, &storage) {
        Ok(s) => {
            for p in &s.problems {
                println!("{p}");
            }
            let index = match &s.index {
                Some(i) => format!("{} queues, {} index entries checked", i.queues, i.entries),
                None => "no index (the next start builds it)".to_owned(),
            };
            println!(
                "{} segments, {} bytes, {} batches, {} gaps quarantined before, {index}: {}",
                s.segments,
                s.bytes,
                s.batches,
                s.gaps,
                match s.problems.len() {
                    0 => "clean".to_string(),
                    1 => "1 problem".to_string(),
                    n => format!("{n} problems"),
                }
            );
            if s.problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
        Err(e) => {
            eprintln!("silt fsck: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut cfg = match &args.config {
        Some(path) => SiltConfig::load(path)?,
        None => SiltConfig::default(),
    };
    apply_listener_flags(&mut cfg.mqtt, &args);
    if let Some(dir) = args.data_dir {
        cfg.data_dir = dir;
    }
    if let Some(addr) = args.mqtt {
        cfg.mqtt.listen = addr;
    }
    if let Some(addr) = args.kafka {
        cfg.kafka.listen = addr;
    }
    if let Some(url) = args.object_store {
        cfg.tiering.object_store = Some(url);
    }
    if let Some(addr) = args.admin {
        cfg.admin.enabled = true;
        cfg.admin.listen = addr;
    }
    cfg.validate()?;
    // Signal handlers go in before anything is announced, so a signal is never lost to the
    // default action (which would skip the clean shutdown).
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut signals = rt.block_on(async { Signals::new() })?;
    let started = std::time::Instant::now();

    // The admin listener first: /readyz answers 503 while the node recovers.
    let (stop_tx, stop_rx) = watch::channel(false);
    let admin_state = Arc::new(admin::AdminState::default());
    let admin = match cfg.admin.enabled {
        true => {
            let token = cfg.admin.token_file.as_deref().map(admin::Token::load).transpose()?;
            let listener = rt.block_on(admin::bind(&cfg.admin.listen))?;
            tracing::info!(addr = %listener.local_addr()?, token = token.is_some(), "admin listener bound");
            admin_state.bound("admin", listener.local_addr()?);
            Some(rt.spawn(admin::run(listener, admin_state.clone(), token, stop_rx.clone())))
        }
        false => None,
    };

    let tiering = Tiering::prepare(cfg.tiering.clone(), cfg.policies()?, &cfg.data_dir, cfg.storage.max_batch_bytes)
        .map_err(|e| anyhow::anyhow!("tiering: {e}"))?;
    tracing::info!(data_dir = %cfg.data_dir.display(), fsync = ?cfg.storage.fsync, "opening storage");
    let router = Arc::new(Router::default());
    let wakers = Arc::new(silt_kafka_broker::wake::Wakers::default());
    let listeners: Vec<Arc<dyn silt_storage::DispatchListener>> = vec![router.clone(), wakers.clone()];
    let storage = Storage::open_seeded(&cfg.data_dir, cfg.storage.clone(), listeners, tiering.seeds())
        .map(Arc::new)
        .map_err(|e| anyhow::anyhow!("cannot open storage in {}: {e}", cfg.data_dir.display()))?;
    tiering.attach(storage.clone()).map_err(|e| anyhow::anyhow!("tiering: {e}"))?;
    let auth = silt_broker::auth::Auth::load(&cfg.mqtt.auth).map_err(|e| anyhow::anyhow!("mqtt.auth: {e}"))?;
    let policies = tiering.policies();
    let partitions: silt_dataset::DefaultPartitions = Box::new(move |stream| policies.for_topic(stream).partitions);
    let appender = silt_dataset::Appender::open(storage.clone(), partitions)
        .map(Arc::new)
        .map_err(|e| anyhow::anyhow!("cannot recover the stream registry: {e}"))?;
    let streams = appender.streams().clone();
    let broker = Broker::new(appender.clone(), router, cfg.mqtt.clone(), auth)
        .map_err(|e| anyhow::anyhow!("cannot recover broker state: {e}"))?;
    let tiering = Arc::new(tiering);
    let kafka_node = if cfg.kafka.enabled {
        let cluster_id = cluster_id(&tiering.describe());
        Some(
            silt_kafka_broker::Kafka::open(cfg.kafka.clone(), appender, wakers, cluster_id, broker.auth.clone())
                .map_err(|e| anyhow::anyhow!("cannot recover the Kafka state: {e}"))?,
        )
    } else {
        None
    };
    if let Some(k) = &kafka_node {
        let policies = tiering.policies();
        // Kafka's spelling: -1 is "no limit" where the policy says 0.
        let limit = |v: u64| if v == 0 { "-1".to_string() } else { v.to_string() };
        k.set_topic_configs(Box::new(move |topic| {
            let p = policies.for_topic(topic);
            vec![("retention.ms", limit(p.retention_ms)), ("retention.bytes", limit(p.retention_bytes))]
        }));
    }
    let lake_slot = tiered::wire(&broker, kafka_node.as_ref(), &tiering, rt.handle().clone());
    let kafka_weak = kafka_node.as_ref().map(Arc::downgrade);

    let listeners = rt.block_on(silt_broker::listeners::Listener::bind_all(&cfg.mqtt))?;
    for l in &listeners {
        tracing::info!(kind = %l.kind(), addr = %l.local_addr()?, "mqtt listener bound");
        admin_state.bound(format!("mqtt {}", l.kind()), l.local_addr()?);
    }
    let mqtt_addr = listeners[0].local_addr()?;
    let mut visibility: Option<Arc<dyn silt_lakehouse::Visibility>> = None;
    let kafka = if let Some(node) = kafka_node {
        rt.block_on(node.start());
        visibility = Some(Arc::new(tiered::KafkaVisibility(Arc::downgrade(&node))));
        let listeners = rt.block_on(silt_kafka_broker::server::bind(&node)).map_err(|e| anyhow::anyhow!(e))?;
        for (kind, addr) in listeners.addrs()? {
            let advertised = node.advertised_for(kind == "tls");
            tracing::info!(kind, %addr, ?advertised, "kafka listener bound");
            admin_state.bound(format!("kafka {kind}"), addr);
        }
        Some(rt.spawn(silt_kafka_broker::server::run(node, listeners, stop_rx.clone())))
    } else {
        None
    };
    // After the Kafka view: its transactions' state decides what a table may see.
    let lakehouse = silt_lakehouse::Lakehouse::start(
        cfg.lakehouse.clone(),
        &tiering,
        storage.clone(),
        streams,
        tiering.policies(),
        visibility,
    )
    .map_err(|e| anyhow::anyhow!("lakehouse: {e}"))?;
    if let Some(l) = &lakehouse {
        let _ = lake_slot.set(Arc::downgrade(l));
        let _ = admin_state.lakehouse.set(l.clone());
    }
    let _ = admin_state.metrics.set(metrics::Sources {
        broker: Arc::downgrade(&broker),
        kafka: kafka_weak,
        storage: storage.clone(),
        tiering: tiering.clone(),
        lakehouse: lake_slot.clone(),
        started,
    });
    let server = rt.spawn(silt_broker::server::run(broker.clone(), listeners, stop_rx.clone()));
    let housekeeping = rt.spawn(silt_broker::server::run_housekeeping(broker.clone(), stop_rx));
    let stats = storage.stats();
    tracing::info!(mqtt = %mqtt_addr, log_end = %stats.log_end, "silt is running");
    admin_state.ready();

    rt.block_on(signals.recv());
    admin_state.stopping();

    tracing::info!("shutting down: closing connections, then flushing the commitlog and the index");
    let _ = stop_tx.send(true);
    rt.block_on(async {
        let _ = server.await;
        if let Some(k) = kafka {
            let _ = k.await;
        }
        if let Some(a) = admin {
            let _ = a.await;
        }
        let _ = housekeeping.await;
        broker.persist_all().await;
    });
    drop(broker);
    // The writers stop before the log closes; what they had not committed, the next start writes.
    if let Some(l) = lakehouse {
        l.shutdown();
    }
    tiering.shutdown();
    storage.close().map_err(|e| anyhow::anyhow!("storage did not close cleanly: {e}"))?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// A cluster id for Kafka clients, stable for a bucket prefix (it names the one dataset).
fn cluster_id(store: &str) -> String {
    // FNV-1a: stable across builds and platforms, unlike the standard library's hasher.
    let h = store.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("silt-{h:016x}")
}

/// `--mqtt-tls`, `--mqtt-ws`, `--mqtt-wss`, `--tls-cert` and `--tls-key` over the config file.
fn apply_listener_flags(mqtt: &mut silt_broker::MqttConfig, args: &ServeArgs) {
    if let Some(addr) = &args.mqtt_tls {
        mqtt.tls.get_or_insert_with(Default::default).listen = addr.clone();
    }
    if let Some(addr) = &args.mqtt_ws {
        mqtt.websocket.get_or_insert_with(Default::default).listen = addr.clone();
    }
    if let Some(addr) = &args.mqtt_wss {
        mqtt.websocket_tls.get_or_insert_with(Default::default).listen = addr.clone();
    }
    if let Some(cert) = &args.tls_cert {
        mqtt.tls.iter_mut().for_each(|t| t.cert_file = cert.clone());
        mqtt.websocket_tls.iter_mut().for_each(|t| t.cert_file = cert.clone());
    }
    if let Some(key) = &args.tls_key {
        mqtt.tls.iter_mut().for_each(|t| t.key_file = key.clone());
        mqtt.websocket_tls.iter_mut().for_each(|t| t.key_file = key.clone());
    }
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM received"),
            _ = self.int.recv() => tracing::info!("SIGINT received"),
        }
    }
}
