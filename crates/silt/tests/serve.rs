//! `silt serve` as a user runs it: starts on a data directory, stops cleanly on a signal, and
//! refuses a bad config naming the key.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn silt() -> Command {
    Command::new(env!("CARGO_BIN_EXE_silt"))
}

/// Waits for a line containing `needle` on the child's stderr.
fn wait_for(child: &mut Child, needle: &str) -> Vec<String> {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(30)) {
        let done = line.contains(needle);
        seen.push(line);
        if done {
            return seen;
        }
    }
    panic!("never saw {needle:?}; stderr was: {seen:#?}");
}

fn stop_with(signal: i32) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = silt()
        .args(["serve", "--mqtt", "127.0.0.1:0", "--kafka", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&mut child, "silt is running");
    // SAFETY: plain kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "exit status {status:?}");
    assert!(dir.path().join("log").is_dir() && dir.path().join("index").is_dir());
}

#[test]
fn serve_exits_zero_on_sigterm() {
    stop_with(libc::SIGTERM);
}

#[test]
fn serve_exits_zero_on_sigint() {
    stop_with(libc::SIGINT);
}

#[test]
fn bad_config_key_is_named_and_exits_nonzero() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("silt.toml");
    std::fs::write(&cfg, "[storage]\nfsync = \"always\"\nsegmnt_bytes = 10\n").unwrap();
    let out = silt().args(["serve", "--config"]).arg(&cfg).arg("--data-dir").arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("segmnt_bytes"), "{err}");
}

#[test]
fn out_of_range_setting_is_named_and_exits_nonzero() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("silt.toml");
    std::fs::write(&cfg, "[storage]\nfsync = \"interval\"\nfsync_interval_ms = 0\n").unwrap();
    let out = silt().args(["serve", "--config"]).arg(&cfg).arg("--data-dir").arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("storage.fsync_interval_ms"), "{err}");
}
