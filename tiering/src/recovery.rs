//! Recovery from the bucket: filling an empty data directory from the manifest's segment
//! objects and tails, and reading objects' footers.

use super::*;

/// Fills an empty data directory from the manifest's objects (or, when the index is missing,
/// brings back evicted segments the rebuild needs). Refuses a local log that is behind the
/// bucket: it belongs to an older owner of the prefix. Returns the queue seeds a rebuilt
/// index needs when retention deleted the start of the log.
pub(crate) async fn restore_local(
    store: &Arc<dyn ObjectStore>,
    m: &Manifest,
    data_dir: &FsPath,
    max_batch: u32,
) -> Result<Vec<(QueueName, Offset)>, Error> {
    let log_dir = silt_storage::log_dir(data_dir);
    let local = local_segments(&log_dir)?;
    let empty = local.is_empty() || (local.len() == 1 && local[0].1 <= silt_storage::format::SEGMENT_HEADER_LEN);
    let end = m.end();
    let rebuild = empty || !data_dir.join("index").exists();
    let tails_ok = m.tails.first().is_none_or(|t| t.base == end) && m.tails.windows(2).all(|w| w[0].end == w[1].base);
    if !tails_ok {
        return Err(Error::Recovery(format!("the manifest's tails do not continue its objects (which end at {end})")));
    }
    if !empty {
        let local_end = local.last().map_or(0, |(b, l)| b + l);
        if end > 0 && !local.iter().any(|(b, _)| *b == end) {
            return Err(Error::Recovery(format!(
                "the data directory's log (ends at {local_end}) does not continue the object store's (ends at {end}): \
                 it was written by another node or is older than the bucket; move it away to recover from the bucket"
            )));
        }
        // Acknowledged for `ack = "object"` topics but lost locally (a machine crash before
        // the fsync): the active segment comes back from its tails.
        if !m.tails.is_empty() && local_end < m.covered_end() && local.last().is_some_and(|(b, _)| *b == end) {
            tracing::warn!(
                local_end,
                bucket_end = m.covered_end(),
                "the local log ends before the bucket's tail; restoring the active segment from it"
            );
            restore_tails(store, m, &log_dir).await?;
        }
        if !rebuild {
            return Ok(Vec::new());
        }
    }
    if empty {
        for (b, _) in &local {
            let p = log_dir.join(format!("{b:020}.log"));
            std::fs::remove_file(&p).map_err(|e| Error::Recovery(format!("remove {}: {e}", p.display())))?;
        }
    }
    let present: std::collections::HashSet<u64> = local.iter().map(|(b, _)| *b).collect();
    let missing: Vec<&ObjectEntry> = m.objects.iter().filter(|o| !present.contains(&o.base)).collect();
    let total: u64 = missing.iter().map(|o| o.end - o.base).sum();
    if !missing.is_empty() {
        tracing::info!(objects = missing.len(), bytes = total, "restoring the commitlog from the object store");
    }
    std::fs::create_dir_all(&log_dir).map_err(|e| Error::Recovery(format!("{}: {e}", log_dir.display())))?;
    let mut progress = Progress::new(total, missing.len());
    // The scans only check: a chunk is dropped before the next is read, so two buffers serve
    // every download.
    let pool = footer::ChunkPool::new(footer::CHUNK, 2);
    for o in missing {
        let staged = silt_storage::staging_path(&log_dir, LogPosition(o.base));
        retry("download segment", || download(store, o, &staged)).await?;
        // Every batch's CRC is checked: the object is the segment the manifest names.
        let (base, len, check, pool) = (o.base, o.end - o.base, staged.clone(), pool.clone());
        let gaps: Vec<(u64, u64)> = o.gaps.iter().map(|&(s, e)| (s - o.base, e - o.base)).collect();
        tokio::task::spawn_blocking(move || {
            footer::scan_file(&check, base, len, max_batch as usize, &gaps, &pool, &|_, _| false, &mut |_| Ok(()))
        })
        .await
        .map_err(|e| Error::Recovery(e.to_string()))?
        .map_err(|e| Error::Recovery(format!("object {} is not a valid segment: {e}", o.key)))?;
        silt_storage::install_segment_file(&log_dir, LogPosition(o.base))?;
        progress.done(o.end - o.base);
    }
    progress.finish();
    if empty && !m.tails.is_empty() {
        restore_tails(store, m, &log_dir).await?;
    } else if empty && end > 0 {
        silt_storage::start_segment(&log_dir, LogPosition(end))?;
    }
    if m.start == 0 {
        return Ok(Vec::new()); // nothing deleted: a rebuild numbers every queue from 0 as before
    }
    // The first footer naming a queue says where its surviving entries start.
    let mut seeds: HashMap<String, u64> = m.queue_floors.clone().into_iter().collect();
    let mut seen = std::collections::HashSet::new();
    for o in &m.objects {
        for q in &read_footer(store, o).await?.queues {
            if seen.insert(q.name.clone()) {
                seeds.insert(q.name.clone(), q.first);
            }
        }
    }
    Ok(seeds
        .into_iter()
        .filter_map(|(k, v)| Some((footer::parse_queue_key(&k)?, Offset(v))))
        .filter(|(_, v)| v.get() > 0)
        .collect())
}

/// Rebuilds the active segment from the manifest's tails (which start with its header) and
/// installs it in place of any local copy.
async fn restore_tails(store: &Arc<dyn ObjectStore>, m: &Manifest, log_dir: &FsPath) -> Result<(), Error> {
    use std::io::Write;
    let base = m.end();
    let staged = silt_storage::staging_path(log_dir, LogPosition(base));
    let mut file = std::fs::File::create(&staged).map_err(|e| Error::Recovery(format!("{}: {e}", staged.display())))?;
    for t in &m.tails {
        let path = Path::from(t.key.as_str());
        let bytes = retry("download tail", || async { store.get(&path).await?.bytes().await }).await?;
        if bytes.len() as u64 != t.end - t.base {
            return Err(Error::Recovery(format!("tail {} holds {} bytes, not {}", t.key, bytes.len(), t.end - t.base)));
        }
        file.write_all(&bytes).map_err(|e| Error::Recovery(format!("{}: {e}", staged.display())))?;
    }
    drop(file);
    tracing::info!(base, end = m.covered_end(), tails = m.tails.len(), "active segment restored from the object store");
    // The log's own recovery checks every batch when it opens the segment.
    silt_storage::install_segment_file(log_dir, LogPosition(base))?;
    Ok(())
}

/// Streams the segment part of an object (without its footer) into `to`.
async fn download(store: &Arc<dyn ObjectStore>, o: &ObjectEntry, to: &FsPath) -> Result<(), object_store::Error> {
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    let local = |e: std::io::Error| object_store::Error::Generic { store: "local file", source: Box::new(e) };
    let path = Path::from(o.key.as_str());
    let opts = object_store::GetOptions { range: Some((0..o.end - o.base).into()), ..Default::default() };
    let mut body = store.get_opts(&path, opts).await?.into_stream();
    let mut file = tokio::fs::File::create(to).await.map_err(local)?;
    let mut written = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        written += chunk.len() as u64;
        file.write_all(&chunk).await.map_err(local)?;
    }
    file.flush().await.map_err(local)?;
    if written != o.end - o.base {
        return Err(object_store::Error::Generic {
            store: "segment object",
            source: format!("{}: got {written} bytes, expected {}", o.key, o.end - o.base).into(),
        });
    }
    Ok(())
}

/// An object's footer, from its tail (two ranged GETs).
pub(crate) async fn read_footer(store: &Arc<dyn ObjectStore>, o: &ObjectEntry) -> Result<Footer, Error> {
    let path = Path::from(o.key.as_str());
    let bad = |e: String| Error::Recovery(format!("object {}: {e}", o.key));
    let at = o.size.checked_sub(footer::TRAILER_LEN as u64).ok_or_else(|| bad("shorter than a footer".into()))?;
    let trailer = retry("read footer", || store.get_range(&path, at..o.size)).await?;
    let range = footer::footer_range(o.size, &trailer).map_err(bad)?;
    let json = retry("read footer", || store.get_range(&path, range.clone())).await?;
    footer::decode(&json).map_err(bad)
}

/// `(base, length)` of each segment file, in order.
fn local_segments(log_dir: &FsPath) -> Result<Vec<(u64, u64)>, Error> {
    let Ok(entries) = std::fs::read_dir(log_dir) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(digits) = name.to_str().and_then(|n| n.strip_suffix(".log")) else { continue };
        if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let len = e.metadata().map_err(|err| Error::Recovery(format!("{}: {err}", e.path().display())))?.len();
        out.push((digits.parse().expect("invariant: 20 digits"), len));
    }
    out.sort();
    Ok(out)
}

/// Progress lines of a long restore: percent, rate and time left, at most every few seconds
/// (and at each tenth done), then one line when it is over.
struct Progress {
    total: u64,
    objects: usize,
    done: u64,
    restored: usize,
    started: std::time::Instant,
    last: std::time::Instant,
    last_tenth: u64,
}

impl Progress {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(5);

    fn new(total: u64, objects: usize) -> Progress {
        let now = std::time::Instant::now();
        Progress { total, objects, done: 0, restored: 0, started: now, last: now, last_tenth: 0 }
    }

    fn done(&mut self, bytes: u64) {
        self.done += bytes;
        self.restored += 1;
        let tenth = self.done.saturating_mul(10) / self.total.max(1);
        if self.restored == self.objects || (self.last.elapsed() < Self::EVERY && tenth == self.last_tenth) {
            return;
        }
        self.last = std::time::Instant::now();
        self.last_tenth = tenth;
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = self.done as f64 / secs;
        let eta = (self.total - self.done.min(self.total)) as f64 / rate.max(1.0);
        tracing::info!(
            percent = format!("{:.0}", self.done as f64 * 100.0 / self.total.max(1) as f64),
            bytes = self.done,
            total = self.total,
            objects = self.restored,
            of = self.objects,
            mib_per_s = format!("{:.1}", rate / 1048576.0),
            eta_s = eta.round() as u64,
            "restoring the commitlog from the object store"
        );
    }

    fn finish(&self) {
        if self.objects > 0 {
            tracing::info!(
                objects = self.objects,
                bytes = self.total,
                seconds = format!("{:.1}", self.started.elapsed().as_secs_f64()),
                "commitlog restored from the object store"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::local::LocalFileSystem;

    fn entry(size: u64) -> ObjectEntry {
        ObjectEntry {
            key: "segments/x".into(),
            base: 0,
            end: 4,
            size,
            min_ts: 0,
            max_ts: 0,
            gaps: Vec::new(),
            streams: Default::default(),
        }
    }

    /// An object whose trailer names a footer longer than the object, or that is shorter than
    /// a trailer, is refused with an error naming it (the lengths used to be subtracted
    /// unchecked: a panic in a debug build, a range wrapped around in a release one).
    #[tokio::test]
    async fn a_footer_length_beyond_the_object_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(d.path()).unwrap());
        let mut object = b"segm".to_vec();
        object.extend_from_slice(&1000u32.to_le_bytes());
        object.extend_from_slice(footer::FOOTER_MAGIC);
        let size = object.len() as u64;
        store.put(&Path::from("segments/x"), PutPayload::from(object)).await.unwrap();
        let err = read_footer(&store, &entry(size)).await.unwrap_err().to_string();
        assert!(err.contains("segments/x") && err.contains("1000 bytes"), "{err}");
        let err = read_footer(&store, &entry(5)).await.unwrap_err().to_string();
        assert!(err.contains("shorter"), "{err}");
    }
}
