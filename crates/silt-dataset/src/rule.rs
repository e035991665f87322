//! The routing rule between the views (DESIGN.md point 6), one place for both directions:
//!
//! - an MQTT topic `a/b/c` belongs to the stream (Kafka topic) `a`, its first level; the record
//!   key is the full MQTT topic, and the partition is Kafka's default partitioner's for that
//!   key, so a device's records share one partition whichever protocol they came by;
//! - a record produced to stream `a` whose key is a valid MQTT topic under `a/` belongs to
//!   that MQTT topic; with any other key, or none, to the MQTT topic `a`.
//!
//! Internal streams (`__silt_*`) hold broker state and are never a Kafka topic; names that are
//! not valid Kafka topic names (MQTT allows almost anything in a first level) are MQTT-only.

use silt_types::TopicName;

/// Prefix of the broker's internal streams.
pub const INTERNAL_PREFIX: &str = "__silt_";

/// Longest Kafka topic name (Kafka's own limit).
pub const MAX_KAFKA_TOPIC_LEN: usize = 249;

/// The stream an MQTT topic belongs to: its first level.
pub fn stream_of(topic: &str) -> &str {
    topic.split('/').next().unwrap_or("")
}

/// The MQTT topic a record produced to `stream` with `key` belongs to.
pub fn mqtt_topic_for(stream: &str, key: Option<&[u8]>) -> String {
    if let Some(k) = key.and_then(|k| std::str::from_utf8(k).ok())
        && k.len() > stream.len()
        && k.starts_with(stream)
        && k.as_bytes()[stream.len()] == b'/'
        && TopicName::new(k).is_ok()
    {
        return k.to_owned();
    }
    stream.to_owned()
}

/// Whether `stream` holds broker state.
pub fn is_internal(stream: &str) -> bool {
    stream.starts_with(INTERNAL_PREFIX)
}

/// Why a name is not a Kafka topic name, if it is not one (Kafka's `Topic.validate`).
pub fn kafka_topic_error(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("the topic name is empty");
    }
    if name == "." || name == ".." {
        return Some("the topic name cannot be \".\" or \"..\"");
    }
    if name.len() > MAX_KAFKA_TOPIC_LEN {
        return Some("the topic name is longer than 249 characters");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return Some("the topic name may contain only ASCII letters, digits, '.', '_' and '-'");
    }
    if is_internal(name) {
        return Some("names starting with __silt_ are the broker's");
    }
    None
}

/// Whether `stream` is visible to Kafka clients.
pub fn is_kafka_topic(stream: &str) -> bool {
    kafka_topic_error(stream).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_belong_to_the_mqtt_topic_their_key_names_under_the_stream() {
        assert_eq!(mqtt_topic_for("factory", Some(b"factory/line1/temp")), "factory/line1/temp");
        assert_eq!(mqtt_topic_for("factory", Some(b"factory")), "factory");
        assert_eq!(mqtt_topic_for("factory", Some(b"factory/")), "factory/", "an empty level is a level");
        assert_eq!(mqtt_topic_for("factory", Some(b"other/x")), "factory");
        assert_eq!(mqtt_topic_for("factory", Some(b"factoryx/y")), "factory");
        assert_eq!(mqtt_topic_for("factory", Some(b"factory/+/x")), "factory", "no wildcards in a topic name");
        assert_eq!(mqtt_topic_for("factory", Some(b"\xff\xfe")), "factory");
        assert_eq!(mqtt_topic_for("factory", None), "factory");
        assert_eq!(stream_of("factory/line1/temp"), "factory");
    }

    #[test]
    fn kafka_topic_names_follow_kafka() {
        assert!(is_kafka_topic("factory"));
        assert!(is_kafka_topic("a.b_c-9"));
        for bad in ["", ".", "..", "with space", "ümlaut", "__silt_sessions", "$SYS"] {
            assert!(!is_kafka_topic(bad), "{bad}");
        }
        assert!(!is_kafka_topic(&"x".repeat(250)));
    }
}
