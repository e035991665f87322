//! MQTT codec benchmarks: the packets on the publish → delivery hot path, through the crate's
//! public codec ([`decode`], [`Packet::encode`]). `cargo bench -p silt-mqtt --bench codec`;
//! results are in BENCHMARKS.md. Every figure is packets/s (`Throughput::Elements`).
//!
//! Cases: `{version}` is `v3.1.1`, `v5` (no properties) or `v5_props` (MQTT 5.0 with a
//! Message Expiry Interval and a Content Type, what a 5.0 publisher commonly sets);
//! `{qos}` is `qos0` or `qos1` (a packet identifier); payloads of 64 B and 1 KiB; topic
//! `devices/0042/telemetry`.
//!
//! - `decode/publish/{version}/{qos}/{size}B`: one PUBLISH decoded from a buffer holding just
//!   it (the buffer's copy is made outside the timing).
//! - `encode/publish/{version}/{qos}/{size}B`: one PUBLISH appended to a reused buffer, as the
//!   connection core does for each delivery (the encoder measures the body, then writes it).
//! - `decode/puback/{version}`, `encode/puback/{version}`: PUBACK, the per-message reply.
//! - `decode_stream/{version}/1000x_qos1_64B`: 1,000 back-to-back QoS 1 PUBLISH packets
//!   decoded from one buffer until it is empty, as a connection's read loop does after a
//!   large read.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use silt_mqtt::{Packet, PacketId, ProtocolVersion, PubResponse, Publish, QoS, decode};

const MAX_PACKET: u32 = 1 << 20;
const TOPIC: &str = "devices/0042/telemetry";

fn versions() -> [(&'static str, ProtocolVersion, bool); 3] {
    [
        ("v3.1.1", ProtocolVersion::V3_1_1, false),
        ("v5", ProtocolVersion::V5, false),
        ("v5_props", ProtocolVersion::V5, true),
    ]
}

fn publish(qos: QoS, size: usize, props: bool, id: u16) -> Packet {
    let mut p = Publish::new(TOPIC, Bytes::from(vec![0x5a; size]));
    p.qos = qos;
    if qos != QoS::AtMostOnce {
        p.packet_id = PacketId::new(id);
    }
    if props {
        p.properties.message_expiry_interval = Some(3600);
        p.properties.content_type = Some("application/json".into());
    }
    Packet::Publish(p)
}

fn encoded(p: &Packet, version: ProtocolVersion) -> BytesMut {
    let mut buf = BytesMut::new();
    p.encode(version, &mut buf).expect("encodable");
    buf
}

fn tuned<'a>(c: &'a mut Criterion, name: &str) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    g
}

fn publish_cases() -> Vec<(String, ProtocolVersion, Packet)> {
    let mut cases = Vec::new();
    for (vname, version, props) in versions() {
        for (qname, qos) in [("qos0", QoS::AtMostOnce), ("qos1", QoS::AtLeastOnce)] {
            for size in [64usize, 1024] {
                cases.push((format!("{vname}/{qname}/{size}B"), version, publish(qos, size, props, 1)));
            }
        }
    }
    cases
}

fn puback_cases() -> [(&'static str, ProtocolVersion); 2] {
    [("v3.1.1", ProtocolVersion::V3_1_1), ("v5", ProtocolVersion::V5)]
}

fn puback() -> Packet {
    Packet::PubAck(PubResponse::new(PacketId::new(1).expect("non-zero")))
}

fn decode_one(c: &mut Criterion) {
    let mut g = tuned(c, "decode");
    g.throughput(Throughput::Elements(1));
    let mut cases: Vec<(String, ProtocolVersion, Packet)> =
        publish_cases().into_iter().map(|(name, v, p)| (format!("publish/{name}"), v, p)).collect();
    cases.extend(puback_cases().map(|(name, v)| (format!("puback/{name}"), v, puback())));
    for (name, version, packet) in cases {
        let frame = encoded(&packet, version);
        g.bench_function(BenchmarkId::from_parameter(&name), |b| {
            b.iter_batched_ref(
                || frame.clone(),
                |buf| decode(buf, version, MAX_PACKET).expect("valid").expect("whole packet"),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn encode_one(c: &mut Criterion) {
    let mut g = tuned(c, "encode");
    g.throughput(Throughput::Elements(1));
    let mut cases: Vec<(String, ProtocolVersion, Packet)> =
        publish_cases().into_iter().map(|(name, v, p)| (format!("publish/{name}"), v, p)).collect();
    cases.extend(puback_cases().map(|(name, v)| (format!("puback/{name}"), v, puback())));
    for (name, version, packet) in cases {
        let mut buf = BytesMut::with_capacity(4096);
        g.bench_function(BenchmarkId::from_parameter(&name), |b| {
            b.iter(|| {
                buf.clear();
                packet.encode(version, &mut buf).expect("encodable");
                buf.len()
            })
        });
    }
    g.finish();
}

fn decode_stream(c: &mut Criterion) {
    let mut g = tuned(c, "decode_stream");
    const N: u16 = 1000;
    g.throughput(Throughput::Elements(u64::from(N)));
    for (vname, version, props) in versions() {
        let mut stream = BytesMut::new();
        for id in 1..=N {
            publish(QoS::AtLeastOnce, 64, props, id).encode(version, &mut stream).expect("encodable");
        }
        g.bench_function(BenchmarkId::new(vname, "1000x_qos1_64B"), |b| {
            b.iter_batched_ref(
                || stream.clone(),
                |buf| {
                    let mut n = 0u32;
                    while let Some(p) = decode(buf, version, MAX_PACKET).expect("valid") {
                        n += u32::from(matches!(p, Packet::Publish(_)));
                    }
                    assert_eq!(n, u32::from(N));
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, decode_one, encode_one, decode_stream);
criterion_main!(benches);
