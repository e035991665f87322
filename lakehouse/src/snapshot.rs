//! Snapshots built here from iceberg's manifest writers: an append (a new manifest with the new
//! files, the parent's manifests kept) and a replace (compaction: the files it merged marked
//! deleted, the merged ones added, every live file rewritten into one manifest so manifests do
//! not pile up commit after commit). Each comes with the requirement that `main` is still the
//! snapshot it was built on: a commit never lands on a table that moved meanwhile.
//!
//! Why not iceberg's `fast_append`: its transaction re-applies itself onto whatever the table
//! became, and iceberg 0.10 has no replace action.

use std::collections::{HashMap, HashSet};

use iceberg::io::FileIO;
use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, ManifestContentType, ManifestFile, ManifestList, ManifestListWriter,
    ManifestWriterBuilder, Operation, Snapshot, SnapshotReference, SnapshotRetention, Summary, TableMetadata,
};
use iceberg::{TableRequirement, TableUpdate};

/// The table updates and requirements of one commit.
pub struct Commit {
    pub updates: Vec<TableUpdate>,
    pub requirements: Vec<TableRequirement>,
    pub snapshot_id: i64,
}

/// A data file a snapshot holds, with what its manifest entry said.
#[derive(Clone, Debug)]
pub struct LiveFile {
    pub file: DataFile,
    pub snapshot_id: i64,
    pub sequence_number: i64,
    pub file_sequence_number: Option<i64>,
}

fn new_snapshot_id(base: &TableMetadata) -> i64 {
    loop {
        let id = (uuid::Uuid::new_v4().as_u64_pair().0 & (i64::MAX as u64)) as i64;
        if id != 0 && base.snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

fn metadata_file(base: &TableMetadata, name: &str) -> String {
    format!("{}/metadata/{name}", base.location().trim_end_matches('/'))
}

/// The manifests of `main`'s snapshot (none for an empty table).
pub async fn manifests(io: &FileIO, base: &TableMetadata) -> iceberg::Result<Vec<ManifestFile>> {
    let Some(snapshot) = base.current_snapshot() else { return Ok(Vec::new()) };
    let bytes = io.new_input(snapshot.manifest_list())?.read().await?;
    Ok(ManifestList::parse_with_version(&bytes, base.format_version())?.consume_entries().into_iter().collect())
}

/// Every data file `main` holds.
pub async fn live_files(io: &FileIO, base: &TableMetadata) -> iceberg::Result<Vec<LiveFile>> {
    let mut out = Vec::new();
    for m in manifests(io, base).await? {
        if m.content != ManifestContentType::Data {
            continue;
        }
        let manifest = m.load_manifest(io).await?;
        for e in manifest.entries() {
            if !e.is_alive() || e.data_file.content_type() != DataContentType::Data {
                continue;
            }
            out.push(LiveFile {
                file: e.data_file.clone(),
                snapshot_id: e.snapshot_id.unwrap_or(m.added_snapshot_id),
                sequence_number: e.sequence_number.unwrap_or(m.sequence_number),
                file_sequence_number: e.file_sequence_number.or(Some(m.sequence_number)),
            });
        }
    }
    Ok(out)
}

fn total(base: &TableMetadata, key: &str) -> u64 {
    base.current_snapshot()
        .and_then(|s| s.summary().additional_properties.get(key))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn sum(files: &[DataFile], f: impl Fn(&DataFile) -> u64) -> u64 {
    files.iter().map(f).sum()
}

async fn finish(
    io: &FileIO,
    base: &TableMetadata,
    snapshot_id: i64,
    sequence_number: i64,
    manifests: Vec<ManifestFile>,
    summary: Summary,
) -> iceberg::Result<Commit> {
    let parent = base.current_snapshot_id();
    let list_path = metadata_file(base, &format!("snap-{snapshot_id}-{}.avro", uuid::Uuid::new_v4()));
    let writer = io.new_output(&list_path)?.writer().await?;
    let mut list = match base.format_version() {
        FormatVersion::V1 => ManifestListWriter::v1(writer, snapshot_id, parent),
        _ => ManifestListWriter::v2(writer, snapshot_id, parent, sequence_number),
    };
    list.add_manifests(manifests.into_iter())?;
    list.close().await?;
    let snapshot = Snapshot::builder()
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(parent)
        .with_sequence_number(sequence_number)
        .with_timestamp_ms(chrono::Utc::now().timestamp_millis().max(base.last_updated_ms()))
        .with_manifest_list(list_path)
        .with_summary(summary)
        .with_schema_id(base.current_schema_id())
        .build();
    let updates = vec![
        TableUpdate::AddSnapshot { snapshot },
        TableUpdate::SetSnapshotRef {
            ref_name: "main".into(),
            reference: SnapshotReference::new(snapshot_id, SnapshotRetention::branch(None, None, None)),
        },
    ];
    let requirements = vec![TableRequirement::RefSnapshotIdMatch { r#ref: "main".into(), snapshot_id: parent }];
    Ok(Commit { updates, requirements, snapshot_id })
}

fn manifest_writer(
    io: &FileIO,
    base: &TableMetadata,
    snapshot_id: i64,
) -> iceberg::Result<iceberg::spec::ManifestWriter> {
    let path = metadata_file(base, &format!("{}-m0.avro", uuid::Uuid::new_v4()));
    let b = ManifestWriterBuilder::new(
        io.new_output(&path)?,
        Some(snapshot_id),
        base.current_schema().clone(),
        base.default_partition_spec().as_ref().clone(),
    );
    Ok(match base.format_version() {
        FormatVersion::V1 => b.build_v1(),
        _ => b.build_v2_data(),
    })
}

/// Appends `files`; `properties` go into the snapshot's summary.
pub async fn append(
    io: &FileIO,
    base: &TableMetadata,
    files: Vec<DataFile>,
    properties: HashMap<String, String>,
) -> iceberg::Result<Commit> {
    let snapshot_id = new_snapshot_id(base);
    let seq = base.next_sequence_number();
    let (added_records, added_size, added_files) =
        (sum(&files, |f| f.record_count()), sum(&files, |f| f.file_size_in_bytes()), files.len() as u64);
    let mut manifests = Vec::new();
    if !files.is_empty() {
        let mut w = manifest_writer(io, base, snapshot_id)?;
        for f in files {
            w.add_file(f, seq)?;
        }
        manifests.push(w.write_manifest_file().await?);
    }
    manifests.extend(self::manifests(io, base).await?);
    let mut props = properties;
    props.extend([
        ("added-data-files".into(), added_files.to_string()),
        ("added-records".into(), added_records.to_string()),
        ("added-files-size".into(), added_size.to_string()),
        ("total-data-files".into(), (total(base, "total-data-files") + added_files).to_string()),
        ("total-records".into(), (total(base, "total-records") + added_records).to_string()),
        ("total-files-size".into(), (total(base, "total-files-size") + added_size).to_string()),
        ("total-delete-files".into(), "0".into()),
        ("total-position-deletes".into(), "0".into()),
        ("total-equality-deletes".into(), "0".into()),
    ]);
    let summary = Summary { operation: Operation::Append, additional_properties: props };
    finish(io, base, snapshot_id, seq, manifests, summary).await
}

/// Replaces the files of `live` whose paths are in `removed` by `added` (the same rows); the
/// summary keeps the base's properties that start with `keep_prefix` (the writer's offsets).
pub async fn replace(
    io: &FileIO,
    base: &TableMetadata,
    live: &[LiveFile],
    removed: &HashSet<String>,
    added: Vec<DataFile>,
    keep_prefix: &str,
) -> iceberg::Result<Commit> {
    let snapshot_id = new_snapshot_id(base);
    let seq = base.next_sequence_number();
    let mut w = manifest_writer(io, base, snapshot_id)?;
    let (mut removed_records, mut removed_size, mut removed_files) = (0u64, 0u64, 0u64);
    for f in live {
        if removed.contains(f.file.file_path()) {
            removed_records += f.file.record_count();
            removed_size += f.file.file_size_in_bytes();
            removed_files += 1;
            w.add_delete_file(f.file.clone(), f.sequence_number, f.file_sequence_number)?;
        } else {
            w.add_existing_file(f.file.clone(), f.snapshot_id, f.sequence_number, f.file_sequence_number)?;
        }
    }
    let (added_records, added_size, added_files) =
        (sum(&added, |f| f.record_count()), sum(&added, |f| f.file_size_in_bytes()), added.len() as u64);
    for f in added {
        w.add_file(f, seq)?;
    }
    let manifest = w.write_manifest_file().await?;
    let mut props: HashMap<String, String> = base
        .current_snapshot()
        .map(|s| s.summary().additional_properties.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with(keep_prefix))
        .collect();
    let total_files = total(base, "total-data-files") + added_files
        - removed_files.min(total(base, "total-data-files") + added_files);
    props.extend([
        ("added-data-files".into(), added_files.to_string()),
        ("deleted-data-files".into(), removed_files.to_string()),
        ("added-records".into(), added_records.to_string()),
        ("deleted-records".into(), removed_records.to_string()),
        ("added-files-size".into(), added_size.to_string()),
        ("removed-files-size".into(), removed_size.to_string()),
        ("total-data-files".into(), total_files.to_string()),
        ("total-records".into(), total(base, "total-records").to_string()),
        (
            "total-files-size".into(),
            (total(base, "total-files-size") + added_size).saturating_sub(removed_size).to_string(),
        ),
        ("total-delete-files".into(), "0".into()),
        ("total-position-deletes".into(), "0".into()),
        ("total-equality-deletes".into(), "0".into()),
    ]);
    let summary = Summary { operation: Operation::Replace, additional_properties: props };
    finish(io, base, snapshot_id, seq, vec![manifest], summary).await
}
