//! A real `silt serve` process for end-to-end tests: started on a temporary data directory and
//! an ephemeral port, stopped by PID.
#![allow(dead_code)]

pub mod raw;

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
        // A free Kafka port unless the test names one: 9092 may be taken on the machine.
        let kafka: &[&str] = if extra.contains(&"--kafka") { &[] } else { &["--kafka", "127.0.0.1:0"] };
        let admin: &[&str] = if extra.contains(&"--admin") { &[] } else { &["--admin", "127.0.0.1:0"] };
        let mut child = Command::new(env!("CARGO_BIN_EXE_silt"))
            .args(["serve", "--mqtt", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(kafka)
            .args(admin)
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

    /// The commitlog's end position (bytes written since it began), from the admin API's
    /// `/api/status`. Not the segment files' sizes: the active one holds preallocated zeros.
    pub fn log_end(&self) -> u64 {
        let body = self.admin_get("/api/status");
        body.split("\"log_end\":")
            .nth(1)
            .and_then(|rest| rest.trim_start().split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no log_end in /api/status: {body}"))
    }

    /// A figure of `/metrics` without labels (a histogram's `_count`, a counter's `_total`).
    pub fn metric(&self, name: &str) -> f64 {
        let body = self.admin_get("/metrics");
        body.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics: {body}"))
    }

    /// The response to a GET of `path` on the admin listener, headers and body.
    fn admin_get(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let addr = {
            let log = self.log.lock().unwrap();
            log.iter()
                .filter(|l| l.contains("admin listener bound"))
                .find_map(|l| l.split("addr=").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_owned)
                .unwrap_or_else(|| panic!("no admin listener in the log: {log:#?}"))
        };
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body
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

/// Writes a `silt.toml` in `dir` enabling auth: user `sensor` with password `hunter2` (hashed by
/// `silt passwd`) allowed `telemetry/#` only. Returns the config's path.
pub fn sensor_auth_config(dir: &Path) -> PathBuf {
    auth_config(dir, &[("sensor", "hunter2")], "user sensor\ntopic readwrite telemetry/#\n", "", "")
}

/// Writes a `silt.toml` in `dir` with a password file of `users` (`(name, password)`, hashed
/// by `silt passwd`), the ACL `acl` (none if empty), `mqtt` lines for `[mqtt]` (e.g.
/// `max_connections = 5`) and `auth` lines for `[mqtt.auth]`. Returns the config's path.
pub fn auth_config(dir: &Path, users: &[(&str, &str)], acl: &str, mqtt: &str, auth: &str) -> PathBuf {
    use std::io::Write;
    let passwd = dir.join("passwd");
    for (user, password) in users {
        let mut add = Command::new(env!("CARGO_BIN_EXE_silt"))
            .arg("passwd")
            .arg(&passwd)
            .arg(user)
            .stdin(Stdio::piped())
            .spawn()
            .expect("silt passwd");
        add.stdin.take().unwrap().write_all(format!("{password}\n").as_bytes()).unwrap();
        assert!(add.wait().unwrap().success());
    }
    let mut table = format!("[mqtt.auth]\npassword_file = {:?}\n{auth}\n", passwd.display());
    if !acl.is_empty() {
        let path = dir.join("acl");
        std::fs::write(&path, acl).unwrap();
        table.push_str(&format!("acl_file = {:?}\n", path.display()));
    }
    let cfg = dir.join("silt.toml");
    std::fs::write(&cfg, format!("[mqtt]\n{mqtt}\n{table}")).unwrap();
    cfg
}

/// Resident memory of process `pid`, in MiB.
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024.0
}

/// A rustls client configuration (ring) that trusts exactly `der`, the test's certificate.
pub fn client_tls_config(
    der: &tokio_rustls::rustls::pki_types::CertificateDer<'static>,
) -> tokio_rustls::rustls::ClientConfig {
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der.clone()).unwrap();
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// A self-signed certificate for `localhost` and `127.0.0.1`, as PEM files in a temp dir.
pub struct Certs {
    _dir: tempfile::TempDir,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: tokio_rustls::rustls::pki_types::CertificateDer<'static>,
}

pub fn certs() -> Certs {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    Certs { der: ck.cert.der().clone(), _dir: dir, cert, key }
}

/// `silt serve` with every listener (TCP, TLS, WebSocket, WebSocket over TLS) on an ephemeral
/// port, TLS material from `certs`, and `extra` arguments.
pub fn start_all_listeners(data: &Path, certs: &Certs, extra: &[&str]) -> Silt {
    let (cert, key) = (certs.cert.to_str().unwrap(), certs.key.to_str().unwrap());
    let mut args = vec![
        "--mqtt-tls",
        "127.0.0.1:0",
        "--mqtt-ws",
        "127.0.0.1:0",
        "--mqtt-wss",
        "127.0.0.1:0",
        "--tls-cert",
        cert,
        "--tls-key",
        key,
    ];
    args.extend_from_slice(extra);
    Silt::start_with(data, &args)
}
