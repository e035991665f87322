//! How an MQTT message is stored as a log [`Record`], and back.
//!
//! Routing (DESIGN.md point 6): the first topic level names the stream, the full topic is the
//! record key, so a Kafka consumer of stream `factory` sees `factory/line1/temp` as the key.
//! MQTT 5 properties become record headers, so Kafka consumers see them too: user properties
//! verbatim, the others under reserved `mqtt.` names. A user property whose name starts with
//! `mqtt.` is stored as `mqtt.user.` + name, so it can never be mistaken for a reserved one.
//! `attrs` carries QoS, retain and the payload format indicator (bits allocated for every
//! protocol in `silt_dataset::attrs`). The partition is the shared append path's to choose
//! (Kafka's default partitioner over the key).

use bytes::Bytes;
use silt_dataset::attrs::{QOS_MASK as ATTR_QOS_MASK, RETAIN as ATTR_RETAIN, UTF8_PAYLOAD as ATTR_UTF8_PAYLOAD};
pub use silt_dataset::rule::stream_of;
use silt_storage::Record;
use silt_types::{Partition, Timestamp};

const H_CONTENT_TYPE: &str = "mqtt.content_type";
const H_RESPONSE_TOPIC: &str = "mqtt.response_topic";
const H_CORRELATION: &str = "mqtt.correlation_data";
const H_EXPIRY: &str = "mqtt.message_expiry";
const H_PUBLISHER: &str = "mqtt.publisher";
const USER_ESCAPE: &str = "mqtt.user.";

/// An application message as the broker handles it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    pub topic: String,
    pub payload: Bytes,
    pub qos: u8,
    pub retain: bool,
    pub utf8_payload: bool,
    /// Message expiry interval in seconds, from the time of publication.
    pub expiry: Option<u32>,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: Vec<(String, String)>,
    /// Client id of the publisher (for no-local), as the bytes of its record header: a
    /// connection's records share one copy, and a delivery reads it without a copy.
    pub publisher: Option<Bytes>,
    pub timestamp: Timestamp,
}

impl Message {
    pub fn to_record(&self) -> Record {
        self.clone().into_record()
    }

    /// [`Self::to_record`], moving the topic, payload and properties into the record.
    pub fn into_record(self) -> Record {
        let mut attrs = u16::from(self.qos) & ATTR_QOS_MASK;
        if self.retain {
            attrs |= ATTR_RETAIN;
        }
        if self.utf8_payload {
            attrs |= ATTR_UTF8_PAYLOAD;
        }
        let mut headers = Vec::with_capacity(self.user_properties.len() + 2);
        for (k, v) in self.user_properties {
            let name = if k.starts_with("mqtt.") { format!("{USER_ESCAPE}{k}") } else { k };
            headers.push((name, Some(Bytes::from(v))));
        }
        let mut put = |k: &str, v: Bytes| headers.push((k.to_owned(), Some(v)));
        if let Some(ct) = self.content_type {
            put(H_CONTENT_TYPE, Bytes::from(ct));
        }
        if let Some(rt) = self.response_topic {
            put(H_RESPONSE_TOPIC, Bytes::from(rt));
        }
        if let Some(cd) = self.correlation_data {
            put(H_CORRELATION, cd);
        }
        if let Some(e) = self.expiry {
            put(H_EXPIRY, Bytes::copy_from_slice(&e.to_be_bytes()));
        }
        if let Some(p) = self.publisher {
            put(H_PUBLISHER, p);
        }
        Record {
            timestamp: self.timestamp,
            stream: stream_of(&self.topic).to_owned(),
            partition: Partition(0),
            key: Some(Bytes::copy_from_slice(self.topic.as_bytes())),
            topic: self.topic,
            value: self.payload,
            headers,
            attrs,
            control: false,
            withheld: false,
            volatile: false,
            producer: None,
        }
    }

    pub fn from_record(r: Record) -> Message {
        let mut m = Message {
            topic: r.topic,
            payload: r.value,
            qos: (r.attrs & ATTR_QOS_MASK).min(2) as u8,
            retain: r.attrs & ATTR_RETAIN != 0,
            utf8_payload: r.attrs & ATTR_UTF8_PAYLOAD != 0,
            timestamp: r.timestamp,
            ..Message::default()
        };
        let text = |v: &Bytes| String::from_utf8_lossy(v).into_owned();
        for (k, v) in r.headers {
            // MQTT has no null property value: a Kafka header's null value arrives empty.
            let v = v.unwrap_or_default();
            match k.as_str() {
                H_CONTENT_TYPE => m.content_type = Some(text(&v)),
                H_RESPONSE_TOPIC => m.response_topic = Some(text(&v)),
                H_CORRELATION => m.correlation_data = Some(v),
                H_EXPIRY => m.expiry = v.as_ref().try_into().ok().map(u32::from_be_bytes),
                H_PUBLISHER => m.publisher = Some(v),
                _ => {
                    let name = k.strip_prefix(USER_ESCAPE).map(str::to_owned).unwrap_or(k);
                    m.user_properties.push((name, text(&v)));
                }
            }
        }
        m
    }

    /// Seconds of expiry left at `now`, or `None` if the message never expires.
    /// `Some(0)` means it has expired and must not be delivered.
    pub fn remaining_expiry(&self, now: Timestamp) -> Option<u32> {
        let e = self.expiry?;
        let elapsed = ((now.get() - self.timestamp.get()).max(0) / 1000) as u64;
        Some(u64::from(e).saturating_sub(elapsed) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_round_trips_through_a_record() {
        let m = Message {
            topic: "factory/line1/temp".into(),
            payload: Bytes::from_static(b"21.5"),
            qos: 2,
            retain: true,
            utf8_payload: true,
            expiry: Some(60),
            content_type: Some("text/plain".into()),
            response_topic: Some("reply/1".into()),
            correlation_data: Some(Bytes::from_static(b"\x00\x01")),
            user_properties: vec![
                ("a".into(), "1".into()),
                ("mqtt.sneaky".into(), "2".into()),
                ("a".into(), "3".into()),
            ],
            publisher: Some("dev-1".into()),
            timestamp: Timestamp(1000),
        };
        let r = m.to_record();
        assert_eq!(r, m.clone().into_record());
        assert_eq!(r.stream, "factory");
        assert_eq!(r.key.as_deref(), Some(&b"factory/line1/temp"[..]));
        assert_eq!(Message::from_record(r), m);
    }

    #[test]
    fn expiry_counts_down_from_publication() {
        let m = Message { expiry: Some(10), timestamp: Timestamp(0), ..Message::default() };
        assert_eq!(m.remaining_expiry(Timestamp(3_500)), Some(7));
        assert_eq!(m.remaining_expiry(Timestamp(11_000)), Some(0));
        assert_eq!(Message::default().remaining_expiry(Timestamp(5)), None);
    }
}
