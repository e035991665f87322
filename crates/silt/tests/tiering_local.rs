//! Tiering through the server binary with a local-directory object store: retention with the
//! broker's internal streams (sessions, retained messages, `$SYS`) in the same segments,
//! recovery of an empty data directory, memory-tier topics and `$SYS` figures kept off the
//! store. The S3 path runs against SeaweedFS in tests/tiering/.

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

/// `$SYS/...` retained figures, as "retain-flag topic payload" lines a new `$SYS/#` subscriber
/// gets within `secs` seconds.
fn sys_figures(port: u16, secs: u32) -> Vec<String> {
    let out = Command::new("mosquitto_sub")
        .args(["-p", &port.to_string(), "-t", "$SYS/#", "-F", "%r %t %p", "-W", &secs.to_string()])
        .output()
        .expect("mosquitto_sub");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

#[test]
fn sys_figures_live_in_memory_and_come_back_at_the_first_tick_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("bucket");
    let cfg = dir.path().join("silt.toml");
    // No policy names the memory tier, and every other topic goes to the bucket. No hot cache:
    // a segment leaves the disk once uploaded.
    let config = |sys_interval_secs: u32| {
        let toml = format!(
            "[storage]\nsegment_max_age_ms = 200\ntail_cache_bytes = 0\n[mqtt]\nsys_interval_secs = {sys_interval_secs}\n\
             [tiering]\nhot_cache_bytes = 0\n[[topics]]\nmatch = \"#\"\ntier = \"object\"\n"
        );
        std::fs::write(&cfg, toml).unwrap();
    };
    config(1);
    let url = format!("file://{}", store.display());
    let args = ["--config", cfg.to_str().unwrap(), "--object-store", &url];
    let data = dir.path().join("data");
    let silt = Silt::start_with(&data, &args);

    // A `$SYS/#` subscriber gets the figures as retained messages.
    let t = Instant::now();
    let version = loop {
        let figures = sys_figures(silt.port, 2);
        // (A subscriber that arrives during the first tick gets the rest as they come.)
        let version = figures.iter().find_map(|l| l.strip_prefix("1 $SYS/broker/version "));
        if let Some(v) = version
            && figures.iter().any(|l| l.starts_with("1 $SYS/broker/messages/received "))
        {
            break v.to_owned();
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no retained $SYS figures: {figures:?}");
    };
    assert!(version.starts_with("silt "), "{version}");
    publish(silt.port, "disk/r", "durable-retained", true);

    // The segment holding the figures reaches the bucket with stand-ins (their topics are
    // there, their payloads are not), beside the ordinary topic's payload.
    let t = Instant::now();
    while !(store_holds(&store, b"durable-retained") && store_holds(&store, b"$SYS/broker/version")) {
        assert!(t.elapsed() < Duration::from_secs(30), "the segments never reached the store");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!store_holds(&store, version.as_bytes()), "the $SYS payload {version:?} was uploaded");

    // The first segment, with the first figures, leaves the disk; its stand-ins are all the
    // store has of them, so the figures are published again though they did not change (here
    // at every tick: each segment leaves the disk once uploaded).
    let first = data.join("log").join(format!("{:020}.log", 0));
    let t = Instant::now();
    while first.exists() {
        assert!(t.elapsed() < Duration::from_secs(30), "{} was never evicted", first.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = Command::new("mosquitto_sub")
        .args(["-p", &silt.port.to_string(), "-t", "$SYS/broker/version", "-F", "%p", "-C", "2", "-W", "10"])
        .output()
        .expect("mosquitto_sub");
    let versions: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(versions, [version.clone(), version.clone()], "the unchanged figure was published again");

    // A crash, then a start on the same data directory with a slower tick: the figures are
    // gone until the first tick publishes them again; the ordinary retained message stays.
    silt.kill();
    config(4);
    let silt = Silt::start_with(&data, &args);
    assert_eq!(retained(silt.port, "disk/r").as_deref(), Some("durable-retained"));
    let before_tick = sys_figures(silt.port, 1);
    assert!(before_tick.iter().all(|l| !l.starts_with("1 ")), "retained figures of the last run: {before_tick:?}");
    let t = Instant::now();
    loop {
        let figures = sys_figures(silt.port, 2);
        if figures.iter().any(|l| *l == format!("1 $SYS/broker/version {version}")) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "$SYS/broker/version not retained again: {figures:?}");
    }
    silt.stop();
}
