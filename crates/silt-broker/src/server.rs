//! Listeners: accept connections and hand each to its own connection task. The caller passes
//! the shutdown signal in (mini-redis style); a semaphore bounds open connections.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::broker::Broker;
use crate::connection;

/// Accepts MQTT connections on `listener` until `shutdown` turns true, then closes every
/// connection (persisting sessions) and returns.
pub async fn run_tcp(broker: Arc<Broker>, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let limit = Arc::new(Semaphore::new(broker.config.max_connections));
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, "connection limit reached; refusing");
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let broker = broker.clone();
                let shutdown = shutdown.clone();
                tasks.spawn(async move {
                    connection::run(broker, stream, peer, shutdown).await;
                    drop(permit);
                });
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    // Connections see the same signal and close themselves; wait for them (bounded).
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), drain).await.is_err() {
        tracing::warn!("some connections did not close within 10 s");
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
