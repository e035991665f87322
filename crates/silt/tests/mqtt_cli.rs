//! MQTT against a running `silt serve` with the mosquitto command-line clients (the tools
//! mosquitto users script with), in MQTT 3.1.1 and 5.0.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::Silt;

fn mosquitto_pub(port: u16, version: &str, args: &[&str]) {
    let out = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-V", version])
        .args(args)
        .output()
        .expect("mosquitto_pub is installed by scripts/test.sh");
    assert!(out.status.success(), "mosquitto_pub {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A running mosquitto_sub that has received its SUBACK (its `-d` debug output says so), so
/// nothing published afterwards can be missed.
struct Sub {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

fn mosquitto_sub(port: u16, version: &str, count: usize, args: &[&str]) -> Sub {
    start_sub(port, version, count, args, true)
}

/// Like [`mosquitto_sub`] without waiting for the SUBACK: for a resumed session, whose stored
/// messages may all arrive (and end the client) before it.
fn mosquitto_sub_resume(port: u16, version: &str, count: usize, args: &[&str]) -> Sub {
    start_sub(port, version, count, args, false)
}

fn start_sub(port: u16, version: &str, count: usize, args: &[&str], wait_suback: bool) -> Sub {
    // stdbuf: line-buffered stdout, so the SUBACK line arrives when it happens.
    let mut child = Command::new("stdbuf")
        .args([
            "-oL",
            "mosquitto_sub",
            "-d",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-V",
            version,
            "-C",
            &count.to_string(),
            "-W",
            "30",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mosquitto_sub is installed by scripts/test.sh");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut early = Vec::new();
    if wait_suback {
        loop {
            let line = rx.recv_timeout(Duration::from_secs(30)).expect("mosquitto_sub never got its SUBACK");
            if line.contains("received SUBACK") {
                break;
            }
            early.push(line);
        }
    }
    let (tx2, rx2) = std::sync::mpsc::channel();
    for l in early {
        let _ = tx2.send(l);
    }
    std::thread::spawn(move || {
        for l in rx {
            let _ = tx2.send(l);
        }
    });
    Sub { child, lines: rx2 }
}

/// The messages mosquitto_sub printed (its debug lines left out), once it exits.
fn lines(sub: Sub) -> Vec<String> {
    let out = sub.child.wait_with_output().unwrap();
    assert!(out.status.success(), "mosquitto_sub failed: {}", String::from_utf8_lossy(&out.stderr));
    sub.lines.iter().filter(|l| !l.starts_with("Client ") && !l.starts_with("Subscribed")).collect()
}

#[test]
fn wildcard_subscribers_receive_what_mosquitto_pub_sends_in_every_version() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    for version in ["mqttv31", "mqttv311", "mqttv5"] {
        let sub = mosquitto_sub(silt.port, version, 3, &["-t", "factory/+/temp", "-t", "alarms/#", "-q", "1", "-v"]);
        mosquitto_pub(silt.port, version, &["-t", "factory/line1/temp", "-m", "21.5", "-q", "1"]);
        mosquitto_pub(silt.port, version, &["-t", "factory/line1/pressure", "-m", "nope", "-q", "1"]);
        mosquitto_pub(silt.port, version, &["-t", "alarms", "-m", "parent level", "-q", "0"]);
        mosquitto_pub(silt.port, version, &["-t", "alarms/fire/3", "-m", "hot", "-q", "2"]);
        assert_eq!(lines(sub), ["factory/line1/temp 21.5", "alarms parent level", "alarms/fire/3 hot"], "{version}");
    }
    silt.stop();
}

#[test]
fn retained_message_reaches_late_subscribers_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    mosquitto_pub(silt.port, "mqttv311", &["-t", "status/door", "-m", "open", "-r", "-q", "1"]);
    mosquitto_pub(silt.port, "mqttv311", &["-t", "status/window", "-m", "closed", "-r", "-q", "1"]);
    mosquitto_pub(silt.port, "mqttv311", &["-t", "status/window", "-m", "", "-r", "-q", "1"]);
    let got = lines(mosquitto_sub(silt.port, "mqttv5", 1, &["-t", "status/#", "-v"]));
    assert_eq!(got, ["status/door open"]);
    silt.stop();
    let silt = Silt::start(dir.path());
    let got = lines(mosquitto_sub(silt.port, "mqttv311", 1, &["-t", "status/+", "-v"]));
    assert_eq!(got, ["status/door open"], "retained messages are durable");
    silt.stop();
}

#[test]
fn persistent_session_gets_offline_messages_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::start(dir.path());
    // Create the persistent session and its subscription, then go away.
    let sub = mosquitto_sub(silt.port, "mqttv311", 1, &["-i", "offline-1", "-c", "-q", "1", "-t", "jobs/#"]);
    mosquitto_pub(silt.port, "mqttv311", &["-t", "jobs/0", "-m", "first", "-q", "1"]);
    assert_eq!(lines(sub), ["first"]);
    for i in 1..=50 {
        mosquitto_pub(silt.port, "mqttv311", &["-t", &format!("jobs/{i}"), "-m", &format!("job {i}"), "-q", "1"]);
    }
    silt.stop();
    let silt = Silt::start(dir.path());
    let got =
        lines(mosquitto_sub_resume(silt.port, "mqttv311", 50, &["-i", "offline-1", "-c", "-q", "1", "-t", "jobs/#"]));
    let want: Vec<String> = (1..=50).map(|i| format!("job {i}")).collect();
    assert_eq!(got, want);
    silt.stop();
}

/// mosquitto_pub's exit status and stderr, for refusals.
fn mosquitto_pub_result(port: u16, version: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-V", version])
        .args(args)
        .output()
        .expect("mosquitto_pub is installed by scripts/test.sh");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn passwords_and_acls_with_the_mosquitto_clients_in_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::sensor_auth_config(dir.path());
    let silt = Silt::start_with(&dir.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    for version in ["mqttv311", "mqttv5"] {
        let (ok, err) =
            mosquitto_pub_result(silt.port, version, &["-u", "sensor", "-P", "wrong", "-t", "telemetry/x", "-m", "1"]);
        assert!(!ok, "{version}: a wrong password is refused");
        assert!(
            err.to_lowercase().contains("not authorised") || err.to_lowercase().contains("bad user"),
            "{version}: {err}"
        );
        let sub =
            mosquitto_sub(silt.port, version, 1, &["-u", "sensor", "-P", "hunter2", "-t", "telemetry/#", "-q", "1"]);
        mosquitto_pub(
            silt.port,
            version,
            &["-u", "sensor", "-P", "hunter2", "-t", "telemetry/t1", "-m", "ok", "-q", "1"],
        );
        assert_eq!(lines(sub), ["ok"], "{version}");
    }
    // MQTT 5: a publish outside the ACL is refused with a reason code mosquitto_pub reports.
    let (ok, err) = mosquitto_pub_result(
        silt.port,
        "mqttv5",
        &["-u", "sensor", "-P", "hunter2", "-t", "admin/x", "-m", "1", "-q", "1"],
    );
    assert!(ok, "the connection itself is fine");
    assert!(err.contains("Publish 1 failed: Not authorized"), "PUBACK 0x87 reported: {err}");
    silt.stop();
}
