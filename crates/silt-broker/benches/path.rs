//! The in-process publish → dispatch → delivery path, end to end, without sockets.
//! `cargo bench -p silt-broker --bench path`; results are in BENCHMARKS.md.
//!
//! A real [`Broker`] on a storage engine in a temporary directory (opened the way `silt serve`
//! opens it: the router as dispatch listener, the shared appender), and real MQTT connections:
//! each client is one end of a `tokio::io::duplex` pipe whose other end is served by
//! [`silt_broker::server::serve_io`], the same connection task a TCP listener runs (codec,
//! sans-I/O core, pipelined stores, router wake-ups, pulls from the cursors, PUBACKs). The
//! clients are minimal MQTT 3.1.1 clients written with `silt_mqtt`'s codec, clean sessions: N
//! subscribers, each a task on the broker's 2-thread runtime, and one publisher driven from the
//! benchmark's thread.
//!
//! `path/{fsync}/qos{q}/{subscribers}`: deliveries/s (`Throughput::Elements` = messages
//! published × subscribers). One iteration publishes a batch of 64 B messages to `bench/t` at
//! QoS `q` (QoS 1 with up to 128 in flight, each PUBACK awaited) and ends when every subscriber
//! has received — and for QoS 1 acknowledged — every message of the batch. `{subscribers}` is
//! `1`, `100` (all on `bench/t`) or `100_wildcard` (all on `bench/+`, a filter queue).
//! `{fsync}` is the log's policy: `never` shows the broker's own cost per message, `always`
//! (the default) adds group-committed fsyncs, which every message, QoS 0 included, waits for
//! before it is delivered. The figures include the clients' own decoding and encoding, which
//! share the two threads with the broker.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use silt_broker::admission::Admission;
use silt_broker::{Broker, MqttConfig, Router};
use silt_mqtt::{
    Connect, Packet, PacketId, ProtocolVersion, PubResponse, Publish, QoS, Subscribe, Subscription,
    SubscriptionOptions, decode,
};
use silt_storage::{DispatchListener, FsyncPolicy, Storage, StorageConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::runtime::Runtime;
use tokio::sync::{Notify, watch};

const VERSION: ProtocolVersion = ProtocolVersion::V3_1_1;
const MAX_PACKET: u32 = 1 << 20;
const PIPE_BYTES: usize = 256 << 10;
const TOPIC: &str = "bench/t";
/// QoS 1 publishes in flight from the publisher (below the broker's `receive_maximum`, 256).
const WINDOW: usize = 128;

/// A client's end of a connection.
struct Client {
    io: DuplexStream,
    inbuf: BytesMut,
}

impl Client {
    async fn send(&mut self, packets: &[Packet]) {
        let mut out = BytesMut::new();
        for p in packets {
            p.encode(VERSION, &mut out).expect("encodable");
        }
        self.io.write_all(&out).await.expect("broker reads");
    }

    /// The next packet from the broker.
    async fn recv(&mut self) -> Packet {
        loop {
            if let Some(p) = decode(&mut self.inbuf, VERSION, MAX_PACKET).expect("valid packet") {
                return p;
            }
            let n = self.io.read_buf(&mut self.inbuf).await.expect("broker writes");
            assert!(n > 0, "the broker closed the connection");
        }
    }
}

/// A broker on a fresh storage directory, opened as `silt serve` opens one.
fn broker(dir: &std::path::Path, fsync: FsyncPolicy) -> Arc<Broker> {
    let router = Arc::new(Router::default());
    let listener: Arc<dyn DispatchListener> = router.clone();
    let config = StorageConfig { fsync, ..StorageConfig::default() };
    let storage = Arc::new(Storage::open_with(dir, config, vec![listener]).expect("storage opens"));
    let appender = Arc::new(silt_dataset::Appender::open(storage, Box::new(|_| 1)).expect("appender opens"));
    Broker::new(appender, router, MqttConfig::default(), silt_broker::auth::Auth::open()).expect("broker starts")
}

/// Connects a client (clean session) through the broker's connection task.
async fn connect(
    broker: &Arc<Broker>,
    admission: &Arc<Admission>,
    shutdown: &watch::Receiver<bool>,
    client_id: &str,
) -> Client {
    let (client, server) = tokio::io::duplex(PIPE_BYTES);
    // Loopback, so that the default anonymous policy admits it.
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("an address");
    tokio::spawn(silt_broker::server::serve_io(broker.clone(), admission.clone(), server, peer, shutdown.clone()));
    let mut c = Client { io: client, inbuf: BytesMut::with_capacity(64 << 10) };
    c.send(&[Packet::Connect(Box::new(Connect::new(VERSION, client_id, 0)))]).await;
    match c.recv().await {
        Packet::ConnAck(_) => c,
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

/// Receives messages until the broker closes the pipe, acknowledging QoS 1 ones, and counts
/// them in `delivered`; wakes `done` once `delivered` reaches `target`.
async fn subscriber(mut c: Client, delivered: Arc<AtomicU64>, target: Arc<AtomicU64>, done: Arc<Notify>) {
    let mut out = BytesMut::new();
    loop {
        let mut n = 0u64;
        while let Ok(Some(p)) = decode(&mut c.inbuf, VERSION, MAX_PACKET) {
            if let Packet::Publish(p) = p {
                n += 1;
                if let Some(id) = p.packet_id {
                    Packet::PubAck(PubResponse::new(id)).encode(VERSION, &mut out).expect("encodable");
                }
            }
        }
        if !out.is_empty() {
            if c.io.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if n > 0 && delivered.fetch_add(n, Ordering::AcqRel) + n >= target.load(Ordering::Acquire) {
            done.notify_one();
        }
        match c.io.read_buf(&mut c.inbuf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Publishes `n` messages and, at QoS 1, waits for every PUBACK.
async fn publish_batch(c: &mut Client, qos: QoS, n: usize, payload: &Bytes, next_id: &mut u16) {
    let message = |id: Option<PacketId>| {
        let mut p = Publish::new(TOPIC, payload.clone());
        p.qos = qos;
        p.packet_id = id;
        Packet::Publish(p)
    };
    if qos == QoS::AtMostOnce {
        let mut left = n;
        while left > 0 {
            let k = left.min(64);
            c.send(&vec![message(None); k]).await;
            left -= k;
        }
        return;
    }
    let (mut sent, mut acked) = (0usize, 0usize);
    while acked < n {
        let mut batch = Vec::new();
        while sent - acked < WINDOW && sent < n {
            *next_id = next_id.checked_add(1).unwrap_or(1);
            batch.push(message(PacketId::new(*next_id)));
            sent += 1;
        }
        if !batch.is_empty() {
            c.send(&batch).await;
        }
        // One PUBACK awaited, then every one already buffered.
        let mut next = Some(c.recv().await);
        while let Some(p) = next {
            match p {
                Packet::PubAck(_) => acked += 1,
                other => panic!("expected PUBACK, got {other:?}"),
            }
            next = decode(&mut c.inbuf, VERSION, MAX_PACKET).expect("valid packet");
        }
    }
}

/// One benchmark's world: the broker, its connections and the delivery counters.
struct World {
    rt: Runtime,
    _dir: tempfile::TempDir,
    broker: Arc<Broker>,
    shutdown: watch::Sender<bool>,
    publisher: Client,
    delivered: Arc<AtomicU64>,
    target: Arc<AtomicU64>,
    done: Arc<Notify>,
    next_id: u16,
}

impl World {
    fn new(fsync: FsyncPolicy, qos: QoS, subscribers: usize, filter: &str) -> World {
        let dir = tempfile::tempdir_in(".").expect("temporary directory");
        let broker = broker(dir.path(), fsync);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let (shutdown, shutdown_rx) = watch::channel(false);
        let admission = Admission::new(broker.config.max_pending_connections, broker.config.max_connections);
        let delivered = Arc::new(AtomicU64::new(0));
        let target = Arc::new(AtomicU64::new(u64::MAX));
        let done = Arc::new(Notify::new());
        let publisher = rt.block_on(async {
            for i in 0..subscribers {
                let mut c = connect(&broker, &admission, &shutdown_rx, &format!("sub{i}")).await;
                let options = SubscriptionOptions { qos, ..SubscriptionOptions::default() };
                let subscribe = Subscribe {
                    packet_id: PacketId::new(1).expect("non-zero"),
                    subscriptions: vec![Subscription { filter: filter.into(), options }],
                    properties: Default::default(),
                };
                c.send(&[Packet::Subscribe(subscribe)]).await;
                match c.recv().await {
                    Packet::SubAck(_) => {}
                    other => panic!("expected SUBACK, got {other:?}"),
                }
                tokio::spawn(subscriber(c, delivered.clone(), target.clone(), done.clone()));
            }
            connect(&broker, &admission, &shutdown_rx, "publisher").await
        });
        World { rt, _dir: dir, broker, shutdown, publisher, delivered, target, done, next_id: 0 }
    }

    /// Publishes `n` messages and waits until `deliveries` more have been received.
    fn round(&mut self, qos: QoS, n: usize, deliveries: u64, payload: &Bytes) {
        let want = self.delivered.load(Ordering::Acquire) + deliveries;
        self.target.store(want, Ordering::Release);
        let (publisher, next_id) = (&mut self.publisher, &mut self.next_id);
        let (delivered, done) = (&self.delivered, &self.done);
        self.rt.block_on(async {
            publish_batch(publisher, qos, n, payload, next_id).await;
            while delivered.load(Ordering::Acquire) < want {
                done.notified().await;
            }
        });
    }

    fn close(self) {
        let _ = self.shutdown.send(true);
        self.rt.shutdown_timeout(Duration::from_secs(5));
        self.broker.storage.close().expect("storage closes");
    }
}

fn path(c: &mut Criterion) {
    let mut g = c.benchmark_group("path");
    g.sample_size(10).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    let payload = Bytes::from(vec![0x5a; 64]);
    for (fname, fsync) in [("never", FsyncPolicy::Never), ("always", FsyncPolicy::Always)] {
        for (qname, qos) in [("qos0", QoS::AtMostOnce), ("qos1", QoS::AtLeastOnce)] {
            for (sname, subscribers, filter, batch) in
                [("1", 1usize, TOPIC, 2000usize), ("100", 100, TOPIC, 200), ("100_wildcard", 100, "bench/+", 200)]
            {
                let mut world = World::new(fsync, qos, subscribers, filter);
                let deliveries = (batch * subscribers) as u64;
                g.throughput(Throughput::Elements(deliveries));
                g.bench_function(BenchmarkId::new(format!("{fname}/{qname}"), sname), |b| {
                    b.iter_custom(|iters| {
                        let start = Instant::now();
                        for _ in 0..iters {
                            world.round(qos, batch, deliveries, &payload);
                        }
                        start.elapsed()
                    })
                });
                world.close();
            }
        }
    }
    g.finish();
}

criterion_group!(benches, path);
criterion_main!(benches);
