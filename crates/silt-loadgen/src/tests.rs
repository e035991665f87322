//! Every scenario, small, against a real mosquitto on a free loopback port: counts must add up
//! (nothing lost, nothing duplicated). Skipped, with a note, where mosquitto is not installed.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use silt_mqtt::{ProtocolVersion, QoS};

use crate::Env;
use crate::drain::{self, DrainConfig};
use crate::flow::{self, FlowConfig, Shape};
use crate::idle::{self, IdleConfig};
use crate::payload::Clock;
use crate::procfs::Proc;

struct Mosquitto {
    child: Child,
    _dir: tempfile::TempDir,
    port: u16,
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn mosquitto() -> Option<Mosquitto> {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let conf = dir.path().join("mosquitto.conf");
    let text = format!("listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\npersistence false\n");
    std::fs::write(&conf, text).unwrap();
    let Ok(child) = Command::new("mosquitto").arg("-c").arg(&conf).stderr(Stdio::null()).spawn() else {
        eprintln!("mosquitto not installed: skipping");
        return None;
    };
    let m = Mosquitto { child, _dir: dir, port };
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Some(m);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("mosquitto did not listen on {port}");
}

fn env(m: &Mosquitto, version: ProtocolVersion) -> Env {
    Env {
        addr: ([127, 0, 0, 1], m.port).into(),
        label: "mosquitto".into(),
        broker: Some(Proc::Pid(m.child.id())),
        version,
        clock: Clock::default(),
        prefix: format!("lgtest{}", std::process::id()),
    }
}

fn flow_config(shape: Shape, qos: QoS) -> FlowConfig {
    FlowConfig {
        shape,
        publishers: 3,
        subscribers: 4,
        qos,
        duration: Duration::from_millis(300),
        payload: 64,
        window: 8,
        max_lag: 1_000,
        rate: 0,
        grace: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn fan_in_and_fan_out_deliver_every_message_to_every_subscriber() {
    let Some(m) = mosquitto().await else { return };
    for version in [ProtocolVersion::V3_1_1, ProtocolVersion::V5] {
        for shape in [Shape::FanIn, Shape::FanOut] {
            for qos in [QoS::AtMostOnce, QoS::AtLeastOnce] {
                let r = flow::run(&env(&m, version), flow_config(shape, qos)).await.unwrap();
                assert!(r.sent > 0, "{}", r.case);
                assert_eq!((r.expected, r.delivered, r.lost), (r.sent * 4, r.sent * 4, 0), "{}", r.case);
                assert_eq!(r.acked, r.sent, "{}", r.case);
                assert_eq!(r.latency_us.map(|l| l.count), Some(r.delivered), "{}", r.case);
                assert_eq!(r.ack_latency_us.is_some(), qos == QoS::AtLeastOnce, "{}", r.case);
            }
        }
    }
}

#[tokio::test]
async fn paced_publishers_send_about_the_rate() {
    let Some(m) = mosquitto().await else { return };
    let cfg = FlowConfig { rate: 100, duration: Duration::from_secs(1), ..flow_config(Shape::FanIn, QoS::AtLeastOnce) };
    let r = flow::run(&env(&m, ProtocolVersion::V3_1_1), cfg).await.unwrap();
    // 100/s for 1 s, each of 3 publishers allowed one message ahead of its schedule.
    assert!(r.sent <= 103, "sent {}", r.sent);
    assert_eq!(r.delivered, r.sent * 4);
}

#[tokio::test]
async fn idle_connections_all_answer_a_ping() {
    let Some(m) = mosquitto().await else { return };
    let cfg = IdleConfig {
        connections: 200,
        concurrency: 20,
        settle: Duration::ZERO,
        settled: Duration::from_millis(200),
        subscribe: true,
    };
    let r = idle::run(&env(&m, ProtocolVersion::V3_1_1), cfg).await.unwrap();
    assert_eq!((r.connections, r.failed, r.ping_ok), (200, 0, 200));
    assert!(r.broker_rss_kib_after.is_some());
    assert!(r.broker_rss_kib_per_conn_settled.is_some(), "the second reading was asked for");
}

#[tokio::test]
async fn offline_session_drains_every_message_once() {
    let Some(m) = mosquitto().await else { return };
    for version in [ProtocolVersion::V3_1_1, ProtocolVersion::V5] {
        let cfg = DrainConfig {
            messages: 3_001,
            publishers: 2,
            window: 16,
            payload: 32,
            idle_timeout: Duration::from_secs(5),
            max_time: Duration::from_secs(60),
            pause: Duration::ZERO,
        };
        let r = drain::run(&env(&m, version), cfg).await.unwrap();
        assert!(r.session_present, "{version}");
        assert_eq!((r.acked, r.unique, r.lost, r.duplicates), (3_001, 3_001, 0, 0), "{version}");
    }
}
