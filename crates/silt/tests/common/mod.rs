//! A real `silt serve` process for end-to-end tests: started on a temporary data directory and
//! an ephemeral port, stopped by PID.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Silt {
    pub child: Child,
    pub port: u16,
    pub data_dir: PathBuf,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Silt {
    /// Starts `silt serve` on `data_dir` with MQTT on an ephemeral loopback port.
    pub fn start(data_dir: &Path) -> Silt {
        Self::start_with(data_dir, &[])
    }

    pub fn start_with(data_dir: &Path, extra: &[&str]) -> Silt {
        let mut child = Command::new(env!("CARGO_BIN_EXE_silt"))
            .args(["serve", "--mqtt", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(extra)
            .env("SILT_LOG", std::env::var("SILT_TEST_LOG").unwrap_or_else(|_| "info".into()))
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn silt");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("silt is running") {
                    let _ = tx.send(line.clone());
                }
                log2.lock().unwrap().push(line);
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("silt did not start; log: {:#?}", log.lock().unwrap())
            }
        };
        let port = line
            .split("mqtt=127.0.0.1:")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no mqtt port in {line:?}"));
        Silt { child, port, data_dir: data_dir.to_path_buf(), log }
    }

    /// SIGTERM and wait: the clean shutdown path.
    pub fn stop(mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "silt exited with {status:?}; log: {:#?}", self.log.lock().unwrap());
    }

    /// SIGKILL: a crash.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// The port of the listener of `kind` (`tcp`, `tls`, `ws`, `wss`), from its
    /// `mqtt listener bound kind=KIND addr=127.0.0.1:PORT` line (logged before "silt is running").
    pub fn listener_port(&self, kind: &str) -> u16 {
        let needle = format!("kind={kind} addr=127.0.0.1:");
        let log = self.log.lock().unwrap();
        log.iter()
            .filter(|l| l.contains("mqtt listener bound"))
            .find_map(|l| l.split(&needle).nth(1))
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no {kind} listener in the log: {log:#?}"))
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }
}

impl Drop for Silt {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The broker's side of a failed test.
            for line in self.log.lock().map(|l| l.clone()).unwrap_or_default() {
                eprintln!("silt: {line}");
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes of commitlog segments in a data directory.
pub fn log_bytes(data_dir: &Path) -> u64 {
    std::fs::read_dir(data_dir.join("log"))
        .map(|rd| rd.filter_map(|e| e.ok()).filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
}
