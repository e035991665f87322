//! Tiering through the server binary with a local-directory object store: retention with the
//! broker's internal streams (sessions, retained messages, `$SYS`) in the same segments, and
//! recovery of an empty data directory. The S3 path runs against SeaweedFS in tests/tiering/.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Silt;

fn publish(port: u16, topic: &str, msg: &str, retain: bool) {
    let mut args = vec!["-p".to_string(), port.to_string(), "-t".into(), topic.into(), "-m".into(), msg.into()];
    args.extend(["-q".into(), "1".into()]);
    if retain {
        args.push("-r".into());
    }
    let st = Command::new("mosquitto_pub").args(&args).status().expect("mosquitto_pub");
    assert!(st.success());
}

/// The retained message of `topic`, if any.
fn retained(port: u16, topic: &str) -> Option<String> {
    let out = Command::new("mosquitto_sub")
        .args(["-p", &port.to_string(), "-t", topic, "-C", "1", "-W", "3", "-F", "%p"])
        .output()
        .expect("mosquitto_sub");
    let s = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!s.is_empty()).then_some(s)
}

/// The head manifest, read as a starting node reads it (the hint, then the versions after it).
fn manifest(store: &Path) -> serde_json::Value {
    let fs = object_store::local::LocalFileSystem::new_with_prefix(store).unwrap();
    let log = silt_tiering::manifest::ManifestLog::new(std::sync::Arc::new(fs));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    serde_json::to_value(rt.block_on(log.latest()).unwrap().expect("a manifest")).unwrap()
}

fn keys(manifest: &serde_json::Value) -> Vec<String> {
    manifest["objects"].as_array().unwrap().iter().map(|o| o["key"].as_str().unwrap().to_owned()).collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[test]
fn retention_deletes_old_objects_but_keeps_retained_messages_and_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("bucket");
    let cfg = dir.path().join("silt.toml");
    std::fs::write(
        &cfg,
        "[storage]\nsegment_max_age_ms = 300\n[mqtt]\nsys_interval_secs = 1\n\
         [tiering]\nretention_check_interval_ms = 200\n\
         [topic_defaults]\nretention_ms = 1500\n",
    )
    .unwrap();
    let url = format!("file://{}", store.display());
    let args = ["--config", cfg.to_str().unwrap(), "--object-store", &url];
    let silt = Silt::start_with(&dir.path().join("data"), &args);
    // A retained message that is never replaced, and a persistent session.
    publish(silt.port, "short/r", "keep-me", true);
    // Subscribes, then leaves after a second (-W); the session stays.
    let _ = Command::new("mosquitto_sub")
        .args(["-p", &silt.port.to_string(), "-i", "keeper", "-c", "-q", "1", "-t", "short/t", "-W", "1"])
        .status()
        .unwrap();
    for i in 0..20 {
        publish(silt.port, "short/t", &format!("m{i}"), false);
    }
    let published = now_ms();
    std::thread::sleep(Duration::from_secs(1)); // let the last messages' segment seal and upload
    let before: Vec<String> = keys(&manifest(&store));
    // Old objects go once every topic in them is 1.5 s old and the broker has re-dumped its
    // sessions and copied the retained message forward.
    let t = Instant::now();
    loop {
        let m = manifest(&store);
        let first_ts = m["objects"].get(0).map_or(i64::MAX, |o| o["min_ts"].as_i64().unwrap());
        if m["start"].as_u64().unwrap() > 0 && first_ts > published {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "retention kept the published messages: {m}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let now_named = keys(&manifest(&store));
    let gone: Vec<&String> = before.iter().filter(|k| !now_named.contains(k)).collect();
    assert!(!gone.is_empty());
    for k in gone {
        assert!(!store.join(k).exists(), "{k} is no longer named but still in the store");
    }
    assert!(silt.log_contains("retention deleted expired objects"));
    assert!(silt.log_contains("old retained messages copied forward"), "the retained message pinned nothing");
    // The retained message outlives the segment it was published in.
    assert_eq!(retained(silt.port, "short/r").as_deref(), Some("keep-me"));
    silt.stop();

    // A new node on an empty data directory recovers the retained message and the session.
    let fresh = tempfile::tempdir().unwrap();
    let silt = Silt::start_with(fresh.path(), &args);
    assert_eq!(retained(silt.port, "short/r").as_deref(), Some("keep-me"));
    publish(silt.port, "short/t", "after", false);
    let out = Command::new("mosquitto_sub")
        .args(["-p", &silt.port.to_string(), "-i", "keeper", "-c", "-q", "1", "-t", "short/t", "-C", "1", "-W", "5"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "after", "the session resumed where it was");
    silt.stop();
}

/// Resumes the persistent session `id` on `filters` and returns "topic payload" lines until
/// `count` arrived or 3 s passed without one.
fn resume(port: u16, id: &str, filters: &[&str], count: usize) -> Vec<String> {
    let mut args: Vec<String> = ["-p", &port.to_string(), "-i", id, "-c", "-q", "1", "-F", "%t %p", "-W", "3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for f in filters {
        args.extend(["-t".into(), f.to_string()]);
    }
    if count > 0 {
        args.extend(["-C".into(), count.to_string()]);
    }
    let out = Command::new("mosquitto_sub").args(&args).output().expect("mosquitto_sub");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

/// Whether any object under the store holds `needle`.
fn store_holds(store: &Path, needle: &[u8]) -> bool {
    let segments = store.join("segments");
    std::fs::read_dir(&segments).is_ok_and(|d| {
        d.filter_map(Result::ok)
            .any(|e| std::fs::read(e.path()).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)))
    })
}

#[test]
fn memory_tier_messages_are_delivered_while_the_broker_runs_and_gone_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("bucket");
    let cfg = dir.path().join("silt.toml");
    std::fs::write(
        &cfg,
        "[storage]\nsegment_max_age_ms = 200\n[mqtt]\nsys_interval_secs = 0\n\
         [[topics]]\nmatch = \"mem/#\"\ntier = \"memory\"\n",
    )
    .unwrap();
    let url = format!("file://{}", store.display());
    let args = ["--config", cfg.to_str().unwrap(), "--object-store", &url];
    let data = dir.path().join("data");
    let silt = Silt::start_with(&data, &args);
    let filters = ["mem/#", "disk/#"];
    assert!(resume(silt.port, "mem-keeper", &filters, 0).is_empty());

    // While the broker runs, memory topics behave like any other: an offline session gets them
    // in order with the durable ones, and retained messages are there.
    publish(silt.port, "mem/t", "volatile-1", false);
    publish(silt.port, "disk/t", "durable-1", false);
    publish(silt.port, "mem/r", "volatile-retained", true);
    assert_eq!(
        resume(silt.port, "mem-keeper", &filters, 3),
        ["mem/t volatile-1", "disk/t durable-1", "mem/r volatile-retained"]
    );
    assert_eq!(retained(silt.port, "mem/r").as_deref(), Some("volatile-retained"));
    publish(silt.port, "mem/t", "volatile-2", false);
    publish(silt.port, "disk/t", "durable-2", false);

    // The bucket gets the durable messages and never the memory ones.
    let t = Instant::now();
    while !store_holds(&store, b"durable-2") {
        assert!(t.elapsed() < Duration::from_secs(30), "durable-2 never reached the store");
        std::thread::sleep(Duration::from_millis(100));
    }
    for payload in ["volatile-1", "volatile-2", "volatile-retained"] {
        assert!(!store_holds(&store, payload.as_bytes()), "{payload} was uploaded");
    }

    // After a restart they are gone: the session gets the durable message only, and the
    // retained memory message is no longer there; numbering and new messages carry on.
    silt.stop();
    let silt = Silt::start_with(&data, &args);
    assert_eq!(resume(silt.port, "mem-keeper", &filters, 0), ["disk/t durable-2"]);
    assert_eq!(retained(silt.port, "mem/r"), None);
    publish(silt.port, "mem/t", "volatile-3", false);
    assert_eq!(resume(silt.port, "mem-keeper", &filters, 1), ["mem/t volatile-3"]);
    silt.stop();
}
