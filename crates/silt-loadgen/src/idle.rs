//! Idle connections: open many as fast as the broker accepts them, hold them, and measure what
//! each one costs the broker in resident memory.
//!
//! Connect rate counts TCP connect through CONNACK (and, with `subscribe`, through the SUBACK
//! of a wildcard filter of the connection's own), `concurrency` handshakes at a time. RSS is
//! read from `/proc/PID/status` before the first connection and after a settling pause with
//! all of them open (and optionally once more, later: see [`IdleConfig::settled`]); the
//! difference per connection is what the broker process allocates per client (socket buffers
//! live in the kernel and are not in RSS). Before closing, every connection must answer a
//! PINGREQ, so a broker cannot look cheap by dropping them.

use std::time::{Duration, Instant};

use serde::Serialize;
use silt_mqtt::Packet;
use tokio::task::JoinSet;

use crate::Env;
use crate::client::{Client, ConnectOptions, connect_many};
use crate::flow::per_s;
use crate::histogram::{Histogram, Summary};
use crate::procfs::{Proc, Sample};

#[derive(Clone, Debug)]
pub struct IdleConfig {
    pub connections: usize,
    pub concurrency: usize,
    /// Pause with every connection open before RSS is read.
    pub settle: Duration,
    /// Time after the last connection opened at which RSS is read again, if later than
    /// `settle` (zero: no second reading). A burst of connections frees its working memory
    /// as the connections go idle, and an allocator returns freed pages over seconds (jemalloc
    /// decays them over about 10 s): the second reading is what the idle connections keep.
    pub settled: Duration,
    /// Each connection also subscribes to a wildcard filter of its own
    /// (`{prefix}/devices/{i}/cmd/#`), as a device fleet does on (re)connecting.
    pub subscribe: bool,
}

#[derive(Debug, Serialize)]
pub struct IdleReport {
    pub scenario: &'static str,
    pub case: String,
    pub broker: String,
    pub connections: usize,
    pub failed: usize,
    pub first_error: Option<String>,
    pub connects_per_s: f64,
    pub connect_latency_us: Option<Summary>,
    /// Connections that answered PINGREQ after the settling pause.
    pub ping_ok: usize,
    pub broker_rss_kib_before: Option<u64>,
    pub broker_rss_kib_after: Option<u64>,
    pub broker_rss_kib_per_conn: Option<f64>,
    /// The same at `settled` (see [`IdleConfig::settled`]).
    pub broker_rss_kib_per_conn_settled: Option<f64>,
    /// Broker CPU per connection set up, in microseconds.
    pub broker_cpu_us_per_conn: Option<f64>,
    pub loadgen_rss_kib_per_conn: Option<f64>,
}

pub async fn run(env: &Env, cfg: IdleConfig) -> anyhow::Result<IdleReport> {
    let broker_before = env.broker.map(Sample::take);
    let own_before = Sample::take(Proc::Own);
    let options = (0..cfg.connections).map(|i| {
        let mut o = ConnectOptions::new(format!("{}-idle-{i}", env.prefix), env.version);
        o.read_buffer = 256;
        if cfg.subscribe {
            o.subscribe = Some(format!("{}/devices/{i}/cmd/#", env.prefix));
        }
        o
    });
    let start = Instant::now();
    let attempts = connect_many(env.addr, options, cfg.concurrency).await;
    let elapsed = start.elapsed();
    let broker_connected = env.broker.map(Sample::take);

    let mut latency = Histogram::default();
    let mut clients = Vec::with_capacity(attempts.len());
    let (mut failed, mut first_error) = (0, None);
    for a in attempts {
        match a.result {
            Ok((client, _)) => {
                latency.record(a.took.as_micros() as u64);
                clients.push(client);
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
    eprintln!("{}: {} connections open ({failed} failed) in {elapsed:?}", env.label, clients.len());
    let opened = Instant::now();
    tokio::time::sleep(cfg.settle).await;
    let broker_after = env.broker.map(Sample::take);
    let own_after = Sample::take(Proc::Own);
    let broker_settled = if cfg.settled > cfg.settle {
        tokio::time::sleep_until((opened + cfg.settled).into()).await;
        env.broker.map(Sample::take)
    } else {
        None
    };

    let open = clients.len();
    let (clients, ping_ok) = ping_all(clients).await;
    let mut closing = JoinSet::new();
    for c in clients {
        closing.spawn(c.disconnect());
    }
    while closing.join_next().await.is_some() {}

    let per_conn = |before: Option<u64>, after: Option<u64>| {
        let (b, a) = (before?, after?);
        (open > 0).then(|| (a as f64 - b as f64) / open as f64)
    };
    let rss_before = broker_before.and_then(|s| s.rss_kib);
    let rss_after = broker_after.and_then(|s| s.rss_kib);
    let cpu = broker_before.zip(broker_connected).and_then(|(b, a)| a.cpu_since(&b));
    Ok(IdleReport {
        scenario: "idle",
        case: if cfg.subscribe {
            format!("idle {} connections + own wildcard", cfg.connections)
        } else {
            format!("idle {} connections", cfg.connections)
        },
        broker: env.label.clone(),
        connections: open,
        failed,
        first_error,
        connects_per_s: per_s(open as u64, elapsed.as_secs_f64()),
        connect_latency_us: latency.summary(),
        ping_ok,
        broker_rss_kib_before: rss_before,
        broker_rss_kib_after: rss_after,
        broker_rss_kib_per_conn: per_conn(rss_before, rss_after),
        broker_rss_kib_per_conn_settled: per_conn(rss_before, broker_settled.and_then(|s| s.rss_kib)),
        broker_cpu_us_per_conn: cpu.filter(|_| open > 0).map(|s| s * 1e6 / open as f64),
        loadgen_rss_kib_per_conn: per_conn(own_before.rss_kib, own_after.rss_kib),
    })
}

/// Sends PINGREQ on every connection and counts PINGRESPs (10 s limit each).
async fn ping_all(clients: Vec<Client>) -> (Vec<Client>, usize) {
    let mut tasks = JoinSet::new();
    for mut c in clients {
        tasks.spawn(async move {
            let ping = async {
                c.queue(&Packet::PingReq)?;
                c.flush().await?;
                loop {
                    if let Packet::PingResp = c.recv().await? {
                        return anyhow::Ok(());
                    }
                }
            };
            let ok = matches!(tokio::time::timeout(Duration::from_secs(10), ping).await, Ok(Ok(())));
            (c, ok)
        });
    }
    let mut out = Vec::new();
    let mut ok = 0;
    while let Some(joined) = tasks.join_next().await {
        if let Ok((c, answered)) = joined {
            ok += usize::from(answered);
            out.push(c);
        }
    }
    (out, ok)
}
