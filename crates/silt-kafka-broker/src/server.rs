//! The Kafka listeners: `kafka.listen` (TCP) and, with `[kafka.tls]`, a TLS one. Both accept
//! connections up to `kafka.max_connections` together and serve each on its own task until
//! shutdown. A TLS handshake has `kafka.auth_timeout_ms` to finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use silt_dataset::log_limit::{self, LogLimit};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::connection;
use crate::node::Kafka;

/// The bound listeners.
pub struct Listeners {
    pub tcp: TcpListener,
    pub tls: Option<(TcpListener, TlsAcceptor)>,
}

impl Listeners {
    /// `(kind, address)` of each, for the log.
    pub fn addrs(&self) -> std::io::Result<Vec<(&'static str, SocketAddr)>> {
        let mut out = vec![("tcp", self.tcp.local_addr()?)];
        if let Some((l, _)) = &self.tls {
            out.push(("tls", l.local_addr()?));
        }
        Ok(out)
    }
}

/// Loads the TLS certificate (first, so a bad file binds nothing), binds the configured
/// addresses and tells `kafka` what to advertise. Errors name the config key.
pub async fn bind(kafka: &Kafka) -> Result<Listeners, String> {
    let acceptor = match &kafka.config.tls {
        Some(t) => Some(silt_auth::tls::acceptor("kafka.tls", &t.cert_file, &t.key_file).map_err(|e| e.to_string())?),
        None => None,
    };
    fn at<'a>(key: &'a str, addr: &'a str) -> impl Fn(std::io::Error) -> String + 'a {
        move |e| format!("{key} {addr}: {e}")
    }
    let listen = &kafka.config.listen;
    let tcp = TcpListener::bind(listen).await.map_err(at("kafka.listen", listen))?;
    kafka.bound(tcp.local_addr().map_err(at("kafka.listen", listen))?);
    let tls = match (acceptor, &kafka.config.tls) {
        (Some(acceptor), Some(t)) => {
            let l = TcpListener::bind(&t.listen).await.map_err(at("kafka.tls.listen", &t.listen))?;
            kafka.bound_tls(l.local_addr().map_err(at("kafka.tls.listen", &t.listen))?);
            Some((l, acceptor))
        }
        _ => None,
    };
    Ok(Listeners { tcp, tls })
}

/// Serves the listeners until `shutdown` turns true; then waits (10 s at most) for
/// connections to finish the request they are in.
pub async fn run(kafka: Arc<Kafka>, listeners: Listeners, mut shutdown: watch::Receiver<bool>) {
    static FULL: LogLimit = LogLimit::new(log_limit::EVERY);
    static FAILED: LogLimit = LogLimit::new(log_limit::EVERY);
    static HANDSHAKE: LogLimit = LogLimit::new(log_limit::EVERY);
    let limit = Arc::new(Semaphore::new(kafka.config.max_connections));
    let mut tasks = JoinSet::new();
    let (tls_listener, acceptor) = match listeners.tls {
        Some((l, a)) => (Some(l), Some(a)),
        None => (None, None),
    };
    loop {
        // `accept` is cancel-safe: a fresh future per turn loses nothing.
        let (accepted, tls) = tokio::select! {
            _ = shutdown.changed() => break,
            a = listeners.tcp.accept() => (a, false),
            a = accept(tls_listener.as_ref()) => (a, true),
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let (stream, peer): (TcpStream, SocketAddr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                if let Some(suppressed) = FAILED.check() {
                    tracing::warn!(error = %e, suppressed, "kafka accept failed");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            if let Some(suppressed) = FULL.check() {
                tracing::warn!(%peer, limit = kafka.config.max_connections, suppressed,
                    "kafka.max_connections reached; connection closed");
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (k, s) = (kafka.clone(), shutdown.clone());
        let acceptor = if tls { acceptor.clone() } else { None };
        tasks.spawn(async move {
            let _open = Open::new(k.clone());
            match acceptor {
                None => connection::serve(k, stream, peer, false, s).await,
                Some(a) => {
                    let timeout = Duration::from_millis(k.config.auth_timeout_ms);
                    match tokio::time::timeout(timeout, a.accept(stream)).await {
                        Ok(Ok(tls_stream)) => connection::serve(k, tls_stream, peer, true, s).await,
                        Ok(Err(e)) => {
                            if let Some(suppressed) = HANDSHAKE.check() {
                                tracing::warn!(%peer, error = %e, suppressed, "kafka TLS handshake failed");
                            }
                        }
                        Err(_) => {
                            if let Some(suppressed) = HANDSHAKE.check() {
                                tracing::warn!(%peer, suppressed, "kafka TLS handshake timed out");
                            }
                        }
                    }
                }
            }
            drop(permit);
        });
    }
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), drain).await.is_err() {
        tracing::warn!("some kafka connections did not close within 10 s");
    }
}

async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Counts a connection open for as long as it lives.
struct Open(Arc<Kafka>);

impl Open {
    fn new(k: Arc<Kafka>) -> Self {
        k.stats.connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        k.stats.connects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Open(k)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.stats.connections.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}
