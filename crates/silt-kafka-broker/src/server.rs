//! The Kafka listener: binds `kafka.listen`, accepts connections up to
//! `kafka.max_connections` and serves each on its own task until shutdown.

use std::sync::Arc;
use std::time::Duration;

use silt_dataset::log_limit::{self, LogLimit};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::connection;
use crate::node::Kafka;

/// Binds the configured address and tells `kafka` what to advertise.
pub async fn bind(kafka: &Kafka) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(&kafka.config.listen).await?;
    kafka.bound(listener.local_addr()?);
    Ok(listener)
}

/// Serves `listener` until `shutdown` turns true; then waits (10 s at most) for connections to
/// finish the request they are in.
pub async fn run(kafka: Arc<Kafka>, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    static FULL: LogLimit = LogLimit::new(log_limit::EVERY);
    static FAILED: LogLimit = LogLimit::new(log_limit::EVERY);
    let limit = Arc::new(Semaphore::new(kafka.config.max_connections));
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
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
                tasks.spawn(async move {
                    connection::serve(k, stream, peer, s).await;
                    drop(permit);
                });
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), drain).await.is_err() {
        tracing::warn!("some kafka connections did not close within 10 s");
    }
}
