//! Accept loops: each accepted connection gets its own task, which runs the listener's
//! transport handshake (TLS, WebSocket upgrade; bounded by [`HANDSHAKE_TIMEOUT`]) and then the
//! MQTT connection. The caller passes the shutdown signal in (mini-redis style). Connections
//! are admitted in two pools shared by all listeners (see [`crate::admission`]): pending
//! slots until the CONNECT is answered, open slots after.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::admission::{Admission, Arrival};
use crate::broker::Broker;
use crate::connection::{self, Admitted};
use crate::listeners::{self, HANDSHAKE_TIMEOUT, Listener, Transport};
use crate::router::Kick;
use silt_dataset::log_limit::{self, LogLimit};

/// Accepts MQTT connections on `listener` until `shutdown` turns true, then closes every
/// connection (persisting sessions) and returns.
pub async fn run_tcp(broker: Arc<Broker>, listener: TcpListener, shutdown: watch::Receiver<bool>) {
    run(broker, vec![Listener::new(listener, Transport::Tcp)], shutdown).await;
}

/// Serves every listener until `shutdown` turns true, then closes every connection
/// (persisting sessions) and returns. `mqtt.max_connections` and
/// `mqtt.max_pending_connections` bound them all together.
pub async fn run(broker: Arc<Broker>, listeners: Vec<Listener>, shutdown: watch::Receiver<bool>) {
    let admission = Admission::new(broker.config.max_pending_connections, broker.config.max_connections);
    let mut loops = JoinSet::new();
    for listener in listeners {
        loops.spawn(accept_loop(broker.clone(), listener, admission.clone(), shutdown.clone()));
    }
    while loops.join_next().await.is_some() {}
}

async fn accept_loop(
    broker: Arc<Broker>,
    listener: Listener,
    admission: Arc<Admission>,
    mut shutdown: watch::Receiver<bool>,
) {
    static ACCEPT_FAILED: LogLimit = LogLimit::new(log_limit::EVERY);
    static FULL: LogLimit = LogLimit::new(log_limit::EVERY);
    static EVICTED: LogLimit = LogLimit::new(log_limit::EVERY);
    let kind = listener.kind();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.tcp.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors, typically: back off instead of spinning.
                        if let Some(suppressed) = ACCEPT_FAILED.check() {
                            tracing::warn!(kind, error = %e, suppressed, "accept failed");
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let slot = match admission.arrive() {
                    Arrival::Admitted(slot) => slot,
                    Arrival::Evicted(slot) => {
                        if let Some(suppressed) = EVICTED.check() {
                            tracing::info!(kind, pending = broker.config.max_pending_connections, suppressed,
                                "mqtt.max_pending_connections reached; the oldest connection still in its \
                                 handshake was closed to make room");
                        }
                        slot
                    }
                    Arrival::Full => {
                        if let Some(suppressed) = FULL.check() {
                            tracing::warn!(kind, %peer, suppressed,
                                "mqtt.max_pending_connections reached and every pending connection is \
                                 being authenticated; refusing");
                        }
                        drop(stream);
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let admitted = Admitted { slot, admission: admission.clone() };
                // Detached: the admission's slots count the connections for the drain at
                // shutdown (not a `JoinSet`, an entry per connection, nor a `TaskTracker`,
                // 8 bytes in every connection's task).
                tokio::spawn(serve_one(broker.clone(), listener.transport.clone(), stream, peer, admitted, shutdown.clone()));
            }
        }
    }
    // Every connection past its handshake is told through its signal (one registering now
    // sees the shutdown itself: `Conn::accept`); one still in its handshake sees `shutdown`.
    // Then wait for them all, every listener's (bounded).
    broker.kick_all(Kick::Shutdown);
    if tokio::time::timeout(Duration::from_secs(10), admission.drained()).await.is_err() {
        tracing::warn!(kind, "some connections did not close within 10 s");
    }
}

/// One connection: the transport's handshake, then MQTT. A failed handshake ends only this
/// connection. Its slots are given back when it is gone.
///
/// A plain function, not an `async fn`, so that the arguments are not kept beside the
/// connection's own future for its whole life (see [`connection::run`]).
pub(crate) fn serve_one(
    broker: Arc<Broker>,
    transport: Transport,
    stream: TcpStream,
    peer: SocketAddr,
    admitted: Admitted,
    shutdown: watch::Receiver<bool>,
) -> connection::Task<TcpStream> {
    if let Transport::Tcp = transport {
        return connection::run(broker, stream, peer, shutdown, admitted);
    }
    connection::Task::Other(Box::pin(upgraded(broker, transport, stream, peer, shutdown, admitted)))
}

async fn upgraded(
    broker: Arc<Broker>,
    transport: Transport,
    stream: TcpStream,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
    admitted: Admitted,
) {
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, listeners::upgrade(&transport, stream));
    let io = tokio::select! {
        _ = shutdown.changed() => return,
        _ = admitted.slot.evicted() => return,
        r = handshake => match r {
            Ok(Ok(io)) => io,
            Ok(Err(e)) => {
                tracing::debug!(kind = transport.kind(), %peer, error = %e, "handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(kind = transport.kind(), %peer, "handshake timed out");
                return;
            }
        },
    };
    connection::run(broker, io, peer, shutdown, admitted).await;
}

/// Serves one MQTT connection over `io`, a byte stream already established by the caller (an
/// in-memory pipe such as `tokio::io::duplex`), as if a TCP listener had accepted it from
/// `peer`: the same connection task, admitted through `admission` like the listeners'
/// connections (refused, by closing, when it is full). For benchmarks and tests that drive the
/// whole connection path without sockets; the listeners never call it.
pub async fn serve_io<S>(
    broker: Arc<Broker>,
    admission: Arc<Admission>,
    io: S,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let slot = match admission.arrive() {
        Arrival::Admitted(slot) | Arrival::Evicted(slot) => slot,
        Arrival::Full => return,
    };
    let mut conn =
        std::pin::pin!(connection::run(broker.clone(), io, peer, shutdown.clone(), Admitted { slot, admission }));
    tokio::select! {
        () = &mut conn => {}
        _ = shutdown.changed() => {
            // As the accept loops do: a resting connection waits on its own signal only.
            broker.kick_all(Kick::Shutdown);
            conn.await;
        }
    }
}

/// Periodic housekeeping: session expiry and `$SYS/` statistics.
pub async fn run_housekeeping(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut since_sys = 0u64;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {
                broker.expire_sessions().await;
                since_sys += 1;
                let every = broker.config.sys_interval_secs;
                if every > 0 && since_sys >= every {
                    since_sys = 0;
                    crate::sys::publish_stats(&broker).await;
                }
            }
        }
    }
}
