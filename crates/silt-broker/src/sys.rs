//! `$SYS/broker/...` statistics, published as retained messages like mosquitto's, so a
//! subscriber to `$SYS/#` sees the current figures at once.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use silt_types::Timestamp;

use crate::broker::Broker;
use crate::message::Message;

pub async fn publish_stats(broker: &std::sync::Arc<Broker>) {
    let s = &broker.stats;
    let storage = broker.storage.stats();
    let figures: Vec<(&str, String)> = vec![
        ("version", format!("silt {}", env!("CARGO_PKG_VERSION"))),
        ("clients/connected", s.connections.load(Ordering::Relaxed).to_string()),
        ("sessions/total", broker.session_count().to_string()),
        ("sessions/backlog", broker.total_backlog().await.to_string()),
        ("messages/received", s.messages_received.load(Ordering::Relaxed).to_string()),
        ("messages/sent", s.messages_sent.load(Ordering::Relaxed).to_string()),
        ("bytes/received", s.bytes_received.load(Ordering::Relaxed).to_string()),
        ("bytes/sent", s.bytes_sent.load(Ordering::Relaxed).to_string()),
        ("retained messages/count", broker.retained_count().to_string()),
        ("store/log bytes", (storage.log_end.get() - storage.log_start.get()).to_string()),
    ];
    for (name, value) in figures {
        let m = Message {
            topic: format!("$SYS/broker/{name}"),
            payload: Bytes::from(value),
            qos: 0,
            retain: true,
            utf8_payload: true,
            timestamp: Timestamp::now(),
            ..Message::default()
        };
        if let Err(e) = broker.publish(&m).await {
            tracing::debug!(error = %e, "$SYS publish failed");
        }
    }
}
