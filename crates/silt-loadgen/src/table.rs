//! Renders result lines (JSON, one per scenario and broker) as a Markdown table comparing a
//! subject broker with a reference broker: each figure for both, and subject/reference.
//!
//! Rows follow the order in which cases first appear. A figure missing on either side (an
//! error, or a counter that does not apply) prints as "–"; so does a ratio over zero.

use std::fmt::Write;

use serde_json::Value;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Better {
    Higher,
    Lower,
}

/// (label, JSON pointer, scale, which way is better).
type Figure = (&'static str, &'static str, f64, Better);

const FLOW: &[Figure] = &[
    ("deliveries/s", "/msgs_per_s", 1.0, Better::Higher),
    ("MB/s delivered", "/mb_per_s", 1.0, Better::Higher),
    ("latency p50 ms", "/latency_us/p50", 1e-3, Better::Lower),
    ("latency p99 ms", "/latency_us/p99", 1e-3, Better::Lower),
    ("latency max ms", "/latency_us/max", 1e-3, Better::Lower),
    ("PUBACK p50 ms", "/ack_latency_us/p50", 1e-3, Better::Lower),
    ("PUBACK p99 ms", "/ack_latency_us/p99", 1e-3, Better::Lower),
    ("lost", "/lost", 1.0, Better::Lower),
    ("broker CPU µs/delivery", "/broker_cpu_us_per_msg", 1.0, Better::Lower),
];

const IDLE: &[Figure] = &[
    ("connects/s", "/connects_per_s", 1.0, Better::Higher),
    ("connect p99 ms", "/connect_latency_us/p99", 1e-3, Better::Lower),
    ("broker RSS KiB/conn", "/broker_rss_kib_per_conn", 1.0, Better::Lower),
    ("broker RSS KiB/conn, settled", "/broker_rss_kib_per_conn_settled", 1.0, Better::Lower),
    ("broker CPU µs/connect", "/broker_cpu_us_per_conn", 1.0, Better::Lower),
    ("failed", "/failed", 1.0, Better::Lower),
];

const DRAIN: &[Figure] = &[
    ("drain msgs/s", "/msgs_per_s", 1.0, Better::Higher),
    ("drain s", "/drain_s", 1.0, Better::Lower),
    ("offline publish msgs/s", "/fill_msgs_per_s", 1.0, Better::Higher),
    ("broker RSS MiB while queued", "/broker_rss_mib_queued", 1.0, Better::Lower),
    ("lost", "/lost", 1.0, Better::Lower),
    ("duplicates", "/duplicates", 1.0, Better::Lower),
];

const KAFKA_PRODUCE: &[Figure] = &[
    ("records/s", "/records_per_s", 1.0, Better::Higher),
    ("MB/s", "/mb_per_s", 1.0, Better::Higher),
    ("produce p50 ms", "/ack_latency_us/p50", 1e-3, Better::Lower),
    ("produce p99 ms", "/ack_latency_us/p99", 1e-3, Better::Lower),
    ("errors", "/errors", 1.0, Better::Lower),
    ("broker CPU µs/record", "/broker_cpu_us_per_record", 1.0, Better::Lower),
];

const KAFKA_CONSUME: &[Figure] = &[
    ("records/s", "/records_per_s", 1.0, Better::Higher),
    ("MB/s", "/mb_per_s", 1.0, Better::Higher),
    ("missing", "/missing", 1.0, Better::Lower),
    ("broker CPU µs/record", "/broker_cpu_us_per_record", 1.0, Better::Lower),
];

/// Produce→consume (Kafka or MQTT in, Kafka out).
const KAFKA_TAIL: &[Figure] = &[
    ("records/s consumed", "/records_per_s", 1.0, Better::Higher),
    ("MB/s consumed", "/mb_per_s", 1.0, Better::Higher),
    ("latency p50 ms", "/latency_us/p50", 1e-3, Better::Lower),
    ("latency p99 ms", "/latency_us/p99", 1e-3, Better::Lower),
    ("latency max ms", "/latency_us/max", 1e-3, Better::Lower),
    ("ack p50 ms", "/ack_latency_us/p50", 1e-3, Better::Lower),
    ("ack p99 ms", "/ack_latency_us/p99", 1e-3, Better::Lower),
    ("lost", "/lost", 1.0, Better::Lower),
    ("broker CPU µs/record", "/broker_cpu_us_per_record", 1.0, Better::Lower),
];

fn figures(scenario: &str) -> &'static [Figure] {
    match scenario {
        "idle" => IDLE,
        "drain" => DRAIN,
        "kafka-produce" => KAFKA_PRODUCE,
        "kafka-consume" => KAFKA_CONSUME,
        "kafka-tail" | "mqtt-kafka" => KAFKA_TAIL,
        _ => FLOW,
    }
}

/// Builds the table from JSON lines; lines that are not JSON objects are skipped. Each
/// reference broker gets a column and a ratio column (subject/reference), in the order given.
pub fn render(lines: &str, references: &[&str], subject: &str) -> String {
    let results: Vec<Value> =
        lines.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(Value::is_object).collect();
    let mut cases: Vec<(&str, &str)> = Vec::new();
    for r in &results {
        let (Some(case), Some(scenario)) = (r["case"].as_str(), r["scenario"].as_str()) else { continue };
        if !cases.iter().any(|(c, _)| *c == case) {
            cases.push((case, scenario));
        }
    }
    let find = |case: &str, broker: &str| {
        results.iter().rev().find(|r| r["case"].as_str() == Some(case) && r["broker"].as_str() == Some(broker))
    };
    let mut out = String::new();
    let ratios: Vec<String> = references.iter().map(|r| format!("{subject}/{r}")).collect();
    let _ = writeln!(out, "| case | figure | {} | {subject} | {} |", references.join(" | "), ratios.join(" | "));
    let _ = writeln!(out, "|---|---|{}---:|{}", "---:|".repeat(references.len()), "---:|".repeat(references.len()));
    for (case, scenario) in cases {
        let refs: Vec<Option<&Value>> = references.iter().map(|r| find(case, r)).collect();
        let s = find(case, subject);
        for &(label, pointer, scale, better) in figures(scenario) {
            let value =
                |v: Option<&Value>| v.and_then(|v| v.pointer(pointer)).and_then(Value::as_f64).map(|x| x * scale);
            let (a, b): (Vec<Option<f64>>, Option<f64>) = (refs.iter().map(|r| value(*r)).collect(), value(s));
            if a.iter().all(Option::is_none) && b.is_none() {
                continue;
            }
            let ratio = |a: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if a != 0.0 => format!("{:.2}", b / a),
                _ => "–".to_owned(),
            };
            let arrow = if better == Better::Higher { "↑" } else { "↓" };
            let cells: Vec<String> = a.iter().zip(&refs).map(|(v, r)| cell(*v, *r)).collect();
            let ratios: Vec<String> = a.iter().map(|v| ratio(*v)).collect();
            let _ = writeln!(
                out,
                "| {case} | {label} {arrow} | {} | {} | {} |",
                cells.join(" | "),
                cell(b, s),
                ratios.join(" | ")
            );
        }
    }
    out
}

fn cell(v: Option<f64>, result: Option<&Value>) -> String {
    match (v, result) {
        (Some(v), _) => number(v),
        (None, Some(r)) if r.get("error").is_some() => "error".to_owned(),
        _ => "–".to_owned(),
    }
}

/// Whole numbers and anything from 100 up: an integer with thousands separators; one or two
/// decimals below.
fn number(v: f64) -> String {
    if v.abs() >= 100.0 || v.fract() == 0.0 {
        let digits = format!("{:.0}", v.abs());
        let mut grouped = String::new();
        for (i, ch) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                grouped.push(',');
            }
            grouped.push(ch);
        }
        if v < 0.0 { format!("-{grouped}") } else { grouped }
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_grouped_and_rounded() {
        assert_eq!(number(1_234_567.4), "1,234,567");
        assert_eq!(number(100.0), "100");
        assert_eq!(number(42.26), "42.3");
        assert_eq!(number(7.0), "7");
        assert_eq!(number(0.123), "0.12");
        assert_eq!(number(-5_000.0), "-5,000");
    }

    #[test]
    fn table_pairs_brokers_per_case_with_ratios() {
        let lines = [
            r#"{"scenario":"fan-in","case":"fan-in 2→1 QoS0","broker":"ref","msgs_per_s":1000.0,"lost":0,"latency_us":{"p50":2000,"p99":4000,"max":9000}}"#,
            r#"{"scenario":"fan-in","case":"fan-in 2→1 QoS0","broker":"sub","msgs_per_s":1500.0,"lost":0,"latency_us":{"p50":1000,"p99":4000,"max":9000}}"#,
            "not json",
            r#"{"scenario":"idle","case":"idle 10 connections","broker":"ref","connects_per_s":50.0,"failed":0}"#,
            r#"{"scenario":"idle","case":"idle 10 connections","broker":"sub","error":"refused"}"#,
        ]
        .join("\n");
        let t = render(&lines, &["ref"], "sub");
        assert!(t.contains("| fan-in 2→1 QoS0 | deliveries/s ↑ | 1,000 | 1,500 | 1.50 |"), "{t}");
        assert!(t.contains("| fan-in 2→1 QoS0 | latency p50 ms ↓ | 2 | 1 | 0.50 |"), "{t}");
        assert!(t.contains("| fan-in 2→1 QoS0 | lost ↓ | 0 | 0 | – |"), "{t}");
        assert!(t.contains("| idle 10 connections | connects/s ↑ | 50 | error | – |"), "{t}");
        assert!(!t.contains("PUBACK"), "{t}");
    }

    #[test]
    fn kafka_rows_use_their_own_figures_and_a_case_one_broker_lacks_shows_dashes() {
        let lines = [
            r#"{"scenario":"kafka-produce","case":"produce 1p","broker":"tansu","records_per_s":100000.0,"mb_per_s":102.4,"errors":0,"ack_latency_us":{"p50":3000,"p99":9000}}"#,
            r#"{"scenario":"kafka-produce","case":"produce 1p","broker":"silt","records_per_s":50000.0,"mb_per_s":51.2,"errors":0,"ack_latency_us":{"p50":6000,"p99":9000}}"#,
            r#"{"scenario":"kafka-consume","case":"consume cold","broker":"silt","records_per_s":9000.0,"mb_per_s":9.3,"missing":0}"#,
        ]
        .join("\n");
        let t = render(&lines, &["tansu"], "silt");
        assert!(t.contains("| produce 1p | records/s ↑ | 100,000 | 50,000 | 0.50 |"), "{t}");
        assert!(t.contains("| produce 1p | produce p50 ms ↓ | 3 | 6 | 2.00 |"), "{t}");
        assert!(t.contains("| consume cold | MB/s ↑ | – | 9.30 | – |"), "{t}");
        assert!(!t.contains("deliveries/s"), "{t}");
    }

    #[test]
    fn two_references_get_a_column_and_a_ratio_each() {
        let lines = [
            r#"{"scenario":"fan-in","case":"fan-in","broker":"mosquitto","msgs_per_s":1000.0}"#,
            r#"{"scenario":"fan-in","case":"fan-in","broker":"rumqttd","msgs_per_s":4000.0}"#,
            r#"{"scenario":"fan-in","case":"fan-in","broker":"silt","msgs_per_s":2000.0}"#,
        ]
        .join("\n");
        let t = render(&lines, &["mosquitto", "rumqttd"], "silt");
        assert!(
            t.starts_with("| case | figure | mosquitto | rumqttd | silt | silt/mosquitto | silt/rumqttd |\n"),
            "{t}"
        );
        assert!(t.contains("|---|---|---:|---:|---:|---:|---:|\n"), "{t}");
        assert!(t.contains("| fan-in | deliveries/s ↑ | 1,000 | 4,000 | 2,000 | 2.00 | 0.50 |"), "{t}");
    }
}
