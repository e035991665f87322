//! Deleting from the store: retention (a prefix of objects once every topic in them expired and
//! the broker no longer needs their internal records), the sweep of objects earlier nodes left
//! unnamed, and the abort of the multipart uploads they left incomplete.

use super::*;

impl Inner {
    /// Deletes the segment and tail objects that earlier nodes (older epochs) uploaded but no
    /// manifest names: an upload cut short by a fence, a tail that lost the race with its
    /// segment, a delete that failed. Once this node holds the prefix, no older epoch can name
    /// anything again, so such an object can never be needed. Objects of this node's epoch are
    /// left alone (its own uploads in flight). Runs once, at start; this is the one LIST Silt
    /// makes, off the read path.
    pub(crate) async fn sweep_orphans(self: Arc<Self>) {
        use futures_util::StreamExt;
        self.abort_stale_uploads().await;
        let named: std::collections::HashSet<String> = {
            let m = self.manifest.lock().await;
            m.objects.iter().map(|o| o.key.clone()).chain(m.tails.iter().map(|t| t.key.clone())).collect()
        };
        let mut orphans = Vec::new();
        for prefix in ["segments", "tails"] {
            let mut listed = self.store.list(Some(&Path::from(prefix)));
            while let Some(meta) = listed.next().await {
                let meta = match meta {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::debug!(error = %e, "listing for orphan objects failed; they stay until the next start");
                        return;
                    }
                };
                let key = meta.location.to_string();
                if named.contains(&key) {
                    continue;
                }
                match object_epoch(&key) {
                    Some(epoch) if epoch < self.epoch => orphans.push(meta.location),
                    _ => {}
                }
            }
        }
        let mut deleted = 0u64;
        for path in orphans {
            if self.fenced.load(Ordering::Acquire) {
                return;
            }
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => deleted += 1,
                Err(e) => tracing::debug!(error = %e, key = %path, "an orphan object was not deleted"),
            }
        }
        if deleted > 0 {
            self.deleted.fetch_add(deleted, Ordering::Relaxed);
            tracing::info!(objects = deleted, "deleted objects earlier nodes left unnamed by any manifest");
        }
    }

    /// Aborts the incomplete multipart uploads under `segments/` of older epochs (a crash or a
    /// fence in the middle of an upload): no node can complete them any more, and the store
    /// bills their parts. This node's own (in flight) are left alone.
    async fn abort_stale_uploads(&self) {
        let uploads = match self.multipart.list().await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(error = %e, "listing incomplete multipart uploads failed; they stay until the next start");
                return;
            }
        };
        let mut aborted = 0u64;
        for u in uploads {
            if self.fenced.load(Ordering::Acquire) {
                return;
            }
            if object_epoch(&u.key).is_none_or(|epoch| epoch >= self.epoch) {
                continue;
            }
            match self.multipart.abort(&u).await {
                Ok(()) => {
                    aborted += 1;
                    self.aborted.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(key = %u.key, upload_id = %u.id, "aborted an incomplete multipart upload an earlier node left");
                }
                Err(e) => tracing::warn!(key = %u.key, error = %e, "an incomplete multipart upload was not aborted"),
            }
        }
        if aborted > 0 {
            tracing::info!(uploads = aborted, "aborted incomplete multipart uploads earlier nodes left");
        }
    }

    pub(crate) async fn retention_loop(self: Arc<Self>) {
        let every = Duration::from_millis(self.cfg.retention_check_interval_ms);
        loop {
            tokio::time::sleep(every).await;
            if self.fenced.load(Ordering::Acquire) {
                return;
            }
            if !self.policies.any_retention() {
                continue;
            }
            if let Err(e) = self.retention_round().await {
                match e {
                    Error::Fenced { .. } => {
                        self.fence(&e);
                        return;
                    }
                    e => tracing::warn!(error = %e, "retention round failed; retrying later"),
                }
            }
        }
    }

    /// Deletes the oldest objects whose every topic is past its retention, and whose internal
    /// records the broker no longer needs. Deletes only a prefix of the log, so the manifest
    /// stays a contiguous range.
    async fn retention_round(&self) -> Result<(), Error> {
        let m = self.manifest.lock().await.clone();
        let mut footers = Vec::with_capacity(m.objects.len());
        for o in &m.objects {
            footers.push(self.footer(o).await?);
        }
        // Bytes of each topic in objects newer than object i (for retention by size).
        let by_bytes = self.policies.any_retention_bytes();
        let mut newer: Vec<HashMap<&str, u64>> = vec![HashMap::new(); footers.len()];
        if by_bytes {
            let mut acc: HashMap<&str, u64> = HashMap::new();
            for i in (0..footers.len()).rev() {
                newer[i] = acc.clone();
                for s in &footers[i].topics {
                    *acc.entry(s.name.as_str()).or_default() += s.bytes;
                }
            }
        }
        let now = Timestamp::now().get();
        let floor = self.internal.get().map_or(0, |i| i.floor().get());
        let hold = self.internal.get().map_or(u64::MAX, |i| i.hold().get());
        let mut drop = 0;
        let mut held_by_internal = None;
        for (i, f) in footers.iter().enumerate() {
            if f.end > hold {
                tracing::debug!(object_end = f.end, hold, "retention waits for the lakehouse writers");
                break;
            }
            let topic_expired = |name: &str, max_ts: i64| {
                // `$SYS` history is worthless: the figures live in memory (their uploaded
                // copies are stand-ins) and are republished after a start; objects from
                // before they did may still hold durable ones, which expire at once too.
                if name.starts_with("$SYS/") {
                    return true;
                }
                let p = self.policies.for_topic(name);
                let by_age = p.retention_ms > 0 && now.saturating_sub(max_ts) > p.retention_ms as i64;
                let by_size = p.retention_bytes > 0 && newer[i].get(name).copied().unwrap_or(0) >= p.retention_bytes;
                by_age || by_size
            };
            let topics_expired = f.topics.iter().all(|s| topic_expired(&s.name, s.max_ts));
            // Partitions carry the same records as their topics, except streams without
            // topics: the broker's internal streams (and records produced without a topic).
            let mut internal_needed = false;
            let others_expired = f.partitions.iter().all(|s| {
                let stream = s.name.rsplit_once('/').map_or(s.name.as_str(), |(st, _)| st);
                if stream.starts_with("__silt_") {
                    internal_needed |= f.end > floor;
                    true
                } else {
                    f.topics.iter().any(|t| t.name.split('/').next() == Some(stream)) || topic_expired(stream, s.max_ts)
                }
            });
            if topics_expired && others_expired && !internal_needed {
                drop = i + 1;
                continue;
            }
            if topics_expired && others_expired && internal_needed {
                held_by_internal = Some(f.end);
            }
            break;
        }
        if let (Some(target), Some(i)) = (held_by_internal, self.internal.get()) {
            i.compact(LogPosition(target));
        }
        if drop == 0 {
            return Ok(());
        }
        let doomed: Vec<ObjectEntry> = m.objects[..drop].to_vec();
        let start = doomed.last().expect("invariant: drop > 0").end;
        // Queues whose every entry goes: remember where their numbering continues.
        let mut floors: HashMap<&str, u64> = HashMap::new();
        for f in &footers[..drop] {
            for q in &f.queues {
                let e = floors.entry(q.name.as_str()).or_default();
                *e = (*e).max(q.first + q.count);
            }
        }
        for f in &footers[drop..] {
            for q in &f.queues {
                floors.remove(q.name.as_str());
            }
        }
        self.commit(|next| {
            next.objects.retain(|o| o.base >= start);
            next.start = next.start.max(start);
            for (name, end) in &floors {
                let e = next.queue_floors.entry((*name).to_owned()).or_default();
                *e = (*e).max(*end);
            }
        })
        .await?;
        // Named by no manifest from here on; readers are cut off before the objects go.
        self.cold.remove_below(start);
        self.storage().truncate_before(LogPosition(start))?;
        for o in &doomed {
            let path = Path::from(o.key.as_str());
            match retry("delete expired object", || self.store.delete(&path)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    self.deleted.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => tracing::warn!(key = %o.key, error = %e, "expired object not deleted (orphaned)"),
            }
            self.footers.lock().expect("invariant: lock not poisoned").remove(&o.base);
        }
        tracing::info!(objects = doomed.len(), start, "retention deleted expired objects");
        Ok(())
    }
}

/// The writer's epoch in a segment or tail object key (`…-{epoch:08}.seg` / `.bin`).
fn object_epoch(key: &str) -> Option<u64> {
    let stem = key.strip_suffix(".seg").or_else(|| key.strip_suffix(".bin"))?;
    stem.rsplit_once('-')?.1.parse().ok()
}
