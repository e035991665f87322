//! Uploading a sealed segment: scan it into a footer while streaming it to the store (one PUT
//! or a multipart upload), checking every batch on the way, and commit it to the manifest. A
//! batch that fails its check stops the attempt; the segment is then checked through the
//! storage engine (which repairs bad batches: healed from a good copy or quarantined behind a
//! gap batch) and scanned again. Only local trouble fails an upload; the uploader retries it.

use super::*;

impl Inner {
    /// Uploads one sealed segment and commits it to the manifest. The file is streamed (one
    /// PUT when small, a multipart upload otherwise), so memory stays at a few parts; records
    /// of `tier = "local"` topics are withheld from the object.
    ///
    /// The scan checks every batch as it streams it, so a healthy segment is read and checked
    /// once. When a batch fails, or the attempt fails for another local reason, the segment is
    /// checked through the storage engine (a bad batch healed from a good copy or quarantined
    /// behind a gap batch, and the quarantined ranges learnt) and scanned once more; `fresh`
    /// (after a failed upload) does that check first, also re-checking batches checked before.
    pub(crate) async fn upload(&self, seg: &SealedSegment, fresh: bool) -> Result<(), Error> {
        let max_batch = self.storage().config().max_batch_bytes as usize;
        let base = seg.base.get();
        let key = format!("segments/{base:020}-{:08}.seg", self.epoch);
        let path = &Path::from(key.as_str());
        let attempt = |gaps: Vec<(u64, u64)>| async move {
            retry("upload segment", || self.put_object(seg, path, max_batch, &gaps)).await.map_err(|e| match e {
                object_store::Error::Generic { store, source } if store == LOCAL_SEGMENT => {
                    match source.downcast::<Error>() {
                        Ok(e) => *e,
                        Err(source) => Error::Recovery(format!("reading {}: {source}", seg.path.display())),
                    }
                }
                e => Error::Store(e),
            })
        };
        let (footer, size) = if fresh {
            attempt(self.check_segment(seg, true).await?).await?
        } else {
            match attempt(Vec::new()).await {
                Err(Error::Recovery(reason)) => {
                    tracing::info!(base, reason, "segment failed its check while uploading; repairing it first");
                    attempt(self.check_segment(seg, false).await?).await?
                }
                done => done?,
            }
        };
        self.puts.fetch_add(1, Ordering::Relaxed);
        self.put_bytes.fetch_add(size, Ordering::Relaxed);
        let entry = ObjectEntry {
            key: key.clone(),
            base,
            end: seg.end.get(),
            size,
            min_ts: footer.min_ts,
            max_ts: footer.max_ts,
            gaps: footer.gaps.iter().map(|&(s, e)| (base + s, base + e)).collect(),
            streams: ObjectEntry::stream_bytes(&footer.partitions),
        };
        if !entry.gaps.is_empty() {
            let bytes: u64 = footer.gaps.iter().map(|(s, e)| e - s).sum();
            self.uploaded_gaps.fetch_add(footer.gaps.len() as u64, Ordering::Relaxed);
            self.uploaded_gap_bytes.fetch_add(bytes, Ordering::Relaxed);
            tracing::warn!(
                key, gaps = ?entry.gaps, bytes,
                "segment uploaded with quarantined ranges (their records were lost locally); named in its footer and the manifest"
            );
        }
        // The tails of this segment (uploaded for object acknowledgements) are now covered.
        let seg_end = seg.end.get();
        let replaced: Vec<String> = {
            let m = self.manifest.lock().await;
            m.tails.iter().filter(|t| t.base < seg_end).map(|t| t.key.clone()).collect()
        };
        self.commit(|m| {
            m.objects.push(entry.clone());
            m.tails.retain(|t| t.base >= seg_end);
        })
        .await?;
        self.cold.add(ObjectRef { base, end: seg.end.get(), key, gaps: entry.gaps.clone() });
        self.cold.remove_tails_below(seg_end);
        self.footers.lock().expect("invariant: lock not poisoned").insert(base, Arc::new(footer));
        let covered = self.manifest.lock().await.covered_end();
        self.uploaded.send_replace(covered.max(seg_end));
        for key in replaced {
            if let Err(e) = self.store.delete(&Path::from(key.as_str())).await {
                tracing::warn!(error = %e, key, "a replaced tail object was not deleted");
            }
        }
        tracing::debug!(base, end = seg.end.get(), size, "segment uploaded");
        Ok(())
    }

    /// Checks (and repairs) every batch of `seg` through the storage engine, on the blocking
    /// pool; `fresh` re-checks batches checked before. Returns its quarantined ranges as
    /// object offsets.
    async fn check_segment(&self, seg: &SealedSegment, fresh: bool) -> Result<Vec<(u64, u64)>, Error> {
        let base = seg.base.get();
        let (storage, checked) = (self.storage().clone(), seg.clone());
        Ok(tokio::task::spawn_blocking(move || storage.check_segment(&checked, fresh))
            .await
            .map_err(|e| Error::Recovery(e.to_string()))??
            .into_iter()
            .map(|(p, n)| (p.get() - base, p.get() - base + n))
            .collect())
    }

    /// One attempt at writing a segment object, in one pass over the file: the scan checks
    /// every batch and builds the footer while it streams the (withheld where needed) bytes to
    /// the store; then the footer is completed from the index (where each queue's entries
    /// start) and written last. Returns the footer and the object's size. A failure to read
    /// the local segment or the index is a `LOCAL_SEGMENT` error (permanent: the caller
    /// retries the upload as a whole); its source is the [`Error`] when it has one.
    async fn put_object(
        &self,
        seg: &SealedSegment,
        path: &Path,
        max_batch: usize,
        gaps: &[(u64, u64)],
    ) -> Result<(footer::Footer, u64), object_store::Error> {
        let len = seg.end.get() - seg.base.get();
        let part = self.cfg.multipart_part_bytes;
        // A few runs of batches (up to 1 MiB each) in flight between the scan and the store.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let (file, policies, base, gaps) = (seg.path.clone(), self.policies.clone(), seg.base.get(), gaps.to_vec());
        let pool = self.chunks.clone();
        let scan = tokio::task::spawn_blocking(move || {
            let withhold = |t: &str, st: &str| policies.withholds(t, st);
            let mut emit = |b: Bytes| tx.blocking_send(b).map_err(|_| "upload attempt ended".to_string());
            footer::scan_file(&file, base, len, max_batch, &gaps, &pool, &withhold, &mut emit)
        });
        let local = |e: String| object_store::Error::Generic { store: LOCAL_SEGMENT, source: e.into() };
        if len <= part {
            let mut pieces = Vec::new();
            while let Some(b) = rx.recv().await {
                pieces.push(b);
            }
            let footer = scan.await.map_err(|e| local(e.to_string()))?.map_err(local)?;
            let (footer, tail) = self.complete_footer(seg, footer).await?;
            let size = len + tail.len() as u64;
            pieces.push(tail);
            self.store.put(path, PutPayload::from_iter(pieces)).await?;
            return Ok((footer, size));
        }
        let mut w = WriteMultipart::new_with_chunk_size(self.store.put_multipart(path).await?, part as usize);
        let mut failed = None;
        while let Some(b) = rx.recv().await {
            if let Err(e) = w.wait_for_capacity(2).await {
                failed = Some(e);
                break;
            }
            w.put(b);
        }
        drop(rx); // stops the scan if the upload failed
        let scanned = scan.await.map_err(|e| local(e.to_string())).and_then(|r| r.map_err(local));
        let completed = match (failed, scanned) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(footer)) => self.complete_footer(seg, footer).await,
        };
        let (footer, tail) = match completed {
            Ok(done) => done,
            Err(e) => {
                let _ = w.abort().await;
                return Err(e);
            }
        };
        let size = len + tail.len() as u64;
        w.put(tail);
        w.finish().await?;
        Ok((footer, size))
    }

    /// Fills in where each consume queue's entries in the segment start (from the index, once
    /// the segment is dispatched) and encodes the footer into the object's tail.
    async fn complete_footer(
        &self,
        seg: &SealedSegment,
        mut footer: footer::Footer,
    ) -> Result<(footer::Footer, Bytes), object_store::Error> {
        let local = |e: Error| object_store::Error::Generic { store: LOCAL_SEGMENT, source: Box::new(e) };
        let storage = self.storage().clone();
        storage.wait_dispatched(seg.end).await.map_err(|e| local(e.into()))?;
        let (from, to) = (seg.base, seg.end);
        let footer = tokio::task::spawn_blocking(move || {
            footer.queues = queue_spans(&storage, &footer, from, to)?;
            Ok::<_, Error>(footer)
        })
        .await
        .map_err(|e| local(Error::Recovery(e.to_string())))?
        .map_err(local)?;
        let tail = footer::encode_tail(&footer);
        Ok((footer, tail))
    }
}

/// The consume queues with entries in `[from, to)` and where those entries start.
fn queue_spans(
    storage: &Storage,
    f: &Footer,
    from: LogPosition,
    to: LogPosition,
) -> Result<Vec<footer::QueueSpan>, Error> {
    let mut names: Vec<QueueName> = f.topics.iter().map(|s| QueueName::Topic(s.name.clone())).collect();
    names.extend(f.partitions.iter().filter_map(|s| footer::parse_queue_key(&format!("p:{}", s.name))));
    // The filters come from the dispatcher's trie, one walk per topic of the segment: with
    // 100k per-device filters a check of every filter against every topic would cost
    // filters × topics at each upload.
    names.extend(storage.filters_matching(f.topics.iter().map(|t| t.name.as_str())).into_iter().map(QueueName::Filter));
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        if let Some((first, count)) = storage.queue_span(&name, from, to)? {
            out.push(footer::QueueSpan { name: footer::queue_key(&name), first: first.get(), count });
        }
    }
    Ok(out)
}
