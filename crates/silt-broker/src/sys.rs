//! `$SYS/broker/...` statistics, published as retained messages like mosquitto's, so a
//! subscriber to `$SYS/#` sees the current figures at once. A figure is published when it
//! changes (checked every `sys_interval_secs`).
//!
//! The figures live in the memory tier whatever the topic policies say (tiering decides so):
//! acknowledged without an fsync, stand-ins in the object store, gone after a restart. Nothing
//! is remembered as published at start-up, so the first tick publishes every figure again;
//! later ticks also publish again a figure whose record left the local disk (an evicted
//! segment), so it stays retained.
//!
//! Each session's backlog (messages waiting between its cursors and the end of its queues) is
//! published as `$SYS/broker/sessions/{client id}/backlog` once it is not 0, then whenever it
//! changes (down to 0 again), and cleared when the session ends; a session that never had a
//! backlog has no figure (an idle connection costs no retained topic). `/`, `+` and `#` in a
//! client id are percent-encoded.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use silt_types::Timestamp;

use crate::broker::Broker;
use crate::message::Message;

pub async fn publish_stats(broker: &std::sync::Arc<Broker>) {
    let s = &broker.stats;
    let storage = broker.storage.stats();
    // Without the backlogs this tick publishes nothing: a missing count must not read as
    // every session gone (which clears their figures).
    let Some(backlogs) = broker.backlogs().await else {
        return;
    };
    let total: u64 = backlogs.iter().map(|(_, b)| b).sum();
    // The figures live in the memory tier: one no longer on the local disk is published
    // again, changed or not, so a new `$SYS/#` subscriber still gets every figure.
    let held = broker.sys_retained_locally();
    let backlog_topic = |id: &str| format!("$SYS/broker/sessions/{}/backlog", encode_level(id));
    let changes = {
        let mut last = broker.sys_backlogs.lock().expect("invariant: lock not poisoned");
        let mut changes: Vec<(String, Option<u64>)> = Vec::new();
        let current: std::collections::HashMap<String, u64> = backlogs.into_iter().collect();
        for (id, b) in &current {
            // A session that never had a backlog is not published: with 100k idle devices
            // that would be 100k retained topics (memory per connection) and as many records
            // at the first tick. Once published, a figure follows its session to 0.
            let published = last.get(id).copied();
            let gone = published.is_some() && !held.contains(&backlog_topic(id));
            if published.unwrap_or(0) != *b || gone {
                changes.push((id.clone(), Some(*b)));
            }
        }
        last.retain(|id, _| {
            let live = current.contains_key(id);
            if !live {
                changes.push((id.clone(), None));
            }
            live
        });
        for (id, b) in &changes {
            if let Some(b) = b {
                last.insert(id.clone(), *b);
            }
        }
        changes
    };
    for (id, backlog) in changes {
        // An empty retained payload clears the topic of a session that is gone.
        let value = backlog.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        publish_retained(broker, backlog_topic(&id), value).await;
    }
    let mut figures: Vec<(String, String)> = [
        ("version", format!("silt {}", env!("CARGO_PKG_VERSION"))),
        ("clients/connected", s.connections.load(Ordering::Relaxed).to_string()),
        ("sessions/total", broker.session_count().to_string()),
        ("sessions/backlog", total.to_string()),
        ("messages/received", s.messages_received.load(Ordering::Relaxed).to_string()),
        ("messages/sent", s.messages_sent.load(Ordering::Relaxed).to_string()),
        ("bytes/received", s.bytes_received.load(Ordering::Relaxed).to_string()),
        ("bytes/sent", s.bytes_sent.load(Ordering::Relaxed).to_string()),
        ("retained messages/count", broker.retained_count().to_string()),
        ("store/log bytes", (storage.log_end.get() - storage.log_start.get()).to_string()),
        // Bad disks: batches that failed their checks, healed from a good copy or quarantined
        // (their records lost), and records dispatch had to skip.
        ("storage/healed_batches", storage.healed_batches.to_string()),
        ("storage/quarantined_batches", storage.quarantined_batches.to_string()),
        ("storage/quarantined_bytes", storage.quarantined_bytes.to_string()),
        ("storage/skipped_records", storage.skipped_records.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if let Some(extra) = broker.extra_stats.get() {
        figures.extend(extra());
    }
    // Each figure is a retained message in the log: write only what changed (or is gone), so
    // an idle broker writes next to nothing.
    let changed: Vec<(String, String)> = {
        let mut last = broker.sys_figures.lock().expect("invariant: lock not poisoned");
        figures
            .into_iter()
            .filter(|(k, v)| {
                last.insert(k.clone(), v.clone()).as_ref() != Some(v) || !held.contains(&format!("$SYS/broker/{k}"))
            })
            .collect()
    };
    for (name, value) in changed {
        publish_retained(broker, format!("$SYS/broker/{name}"), Bytes::from(value)).await;
    }
}

async fn publish_retained(broker: &std::sync::Arc<Broker>, topic: String, payload: Bytes) {
    let m =
        Message { topic, payload, retain: true, utf8_payload: true, timestamp: Timestamp::now(), ..Message::default() };
    // The node's own figures are not messages received from clients.
    let published = match broker.submit_uncounted(&m).await {
        Ok(ack) => ack.await,
        Err(e) => Err(e),
    };
    if let Err(e) = published {
        tracing::debug!(error = %e, "$SYS publish failed");
    }
}

/// A client id as one topic level.
fn encode_level(id: &str) -> String {
    id.replace('%', "%25").replace('/', "%2F").replace('+', "%2B").replace('#', "%23")
}
