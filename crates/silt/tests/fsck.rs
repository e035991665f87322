//! `silt fsck DATA_DIR` on a stopped node's data directory: clean after a clean stop (the
//! batches and the index against the log), and a flipped byte in a sealed segment named by
//! segment and log position (exit code 1), without the file being changed. The index check's
//! findings are tested in silt-storage's `tests/check.rs`.

mod common;

use std::process::Command;

use common::Silt;

fn fsck(data: &std::path::Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_silt")).arg("fsck").arg(data).output().expect("run silt fsck");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn fsck_finds_a_flipped_byte_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Small segments: the messages span several, and the damaged one is sealed.
    let config = dir.path().join("silt.toml");
    std::fs::write(&config, "[storage]\nsegment_bytes = 4096\n").unwrap();
    let silt = Silt::start_with(&data, &["--config", config.to_str().unwrap()]);
    for i in 0..60 {
        let out = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &silt.port.to_string(), "-q", "1", "-t", "fsck/t"])
            .args(["-m", &format!("message {i} {}", "x".repeat(200))])
            .output()
            .expect("mosquitto_pub is installed by scripts/test.sh");
        assert!(out.status.success());
    }
    silt.stop();

    let (code, out) = fsck(&data);
    assert_eq!(code, 0, "{out}");
    assert!(out.trim_end().ends_with("clean"), "{out}");
    // The index was checked against the log too: every message is in its topic's queue.
    let entries: u64 = out
        .split(" index entries checked")
        .next()
        .and_then(|h| h.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no index figure in {out}"));
    assert!(entries >= 60, "{out}");

    let log = data.join("log");
    let mut segments: Vec<_> = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    assert!(segments.len() >= 3, "{segments:?}");
    let victim = &segments[1];
    let mut bytes = std::fs::read(victim).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(victim, &bytes).unwrap();

    let (code, out) = fsck(&data);
    assert_eq!(code, 1, "{out}");
    let name = victim.file_name().unwrap().to_str().unwrap();
    let base: u64 = name.trim_end_matches(".log").parse().unwrap();
    let line = out.lines().find(|l| l.contains(name)).unwrap_or_else(|| panic!("{name} not named:\n{out}"));
    let position: u64 = line
        .split("log position ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no log position in {line:?}"));
    assert!(position >= base && position <= base + at as u64, "{line} (byte {at} of segment {base})");
    assert!(line.contains("CRC") || line.contains("bad"), "{line}");
    assert!(out.trim_end().ends_with("1 problem"), "{out}");
    assert_eq!(std::fs::read(victim).unwrap(), bytes, "fsck changed the segment");
}
