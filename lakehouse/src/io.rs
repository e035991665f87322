//! `iceberg::io::Storage` over the node's `object_store` store: table files go through the
//! same client, credentials and retries as the segments (iceberg's own S3 support lives in
//! iceberg-storage-opendal, a second HTTP stack).
//!
//! Iceberg names files by absolute URI (`s3://bucket/prefix/lakehouse/...`,
//! `file:///dir/lakehouse/...`). Under the node's own prefix, a file goes through the node's
//! store; elsewhere (where a REST catalog puts a table), through a store for that bucket (or
//! the local file system) opened on first use with the same `AWS_*` settings.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use iceberg::io::{
    FileIO, FileIOBuilder, FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

/// The node's store and the URL its root has, and the stores of other buckets.
#[derive(Clone)]
pub struct Store {
    pub store: Arc<dyn ObjectStore>,
    /// `s3://bucket/prefix` or `file:///dir`, without a trailing `/`.
    pub base: String,
    others: Arc<Mutex<HashMap<String, Arc<dyn ObjectStore>>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("base", &self.base).finish()
    }
}

impl Store {
    /// `base` is the root's URI; a `file://` one with a relative path (a relative data
    /// directory) is made absolute: table locations are read by other processes, elsewhere.
    pub fn new(store: Arc<dyn ObjectStore>, base: &str) -> Store {
        let base = match base.strip_prefix("file://") {
            Some(p) if !p.starts_with('/') => {
                std::path::absolute(p).map_or_else(|_| base.to_owned(), |a| format!("file://{}", a.display()))
            }
            _ => base.to_owned(),
        };
        Store { store, base: base.trim_end_matches('/').to_owned(), others: Arc::default() }
    }

    /// The absolute URI of a key under the node's root.
    pub fn uri(&self, key: &str) -> String {
        format!("{}/{}", self.base, key.trim_start_matches('/'))
    }

    /// The store holding `uri`, and its key there.
    pub fn resolve(&self, uri: &str) -> Result<(Arc<dyn ObjectStore>, Path)> {
        let parse =
            |rest: &str| Path::parse(rest).map_err(|e| Error::new(ErrorKind::DataInvalid, format!("{uri}: {e}")));
        if let Some(rest) = uri.strip_prefix(&self.base).and_then(|r| r.strip_prefix('/')) {
            return Ok((self.store.clone(), parse(rest)?));
        }
        let url = url::Url::parse(uri).map_err(|e| Error::new(ErrorKind::DataInvalid, format!("{uri}: {e}")))?;
        let (root, rest) = match url.scheme() {
            "s3" | "s3a" => {
                let bucket = url.host_str().unwrap_or_default();
                (format!("s3://{bucket}"), url.path().trim_start_matches('/').to_owned())
            }
            "file" => ("file:///".to_owned(), url.path().trim_start_matches('/').to_owned()),
            other => {
                return Err(Error::new(ErrorKind::FeatureUnsupported, format!("{uri}: scheme {other} is not served")));
            }
        };
        let mut others = self.others.lock().expect("invariant: lock not poisoned");
        let store = match others.get(&root) {
            Some(s) => s.clone(),
            None => {
                let s = silt_tiering::store::StoreUrl::parse(&root)
                    .and_then(|u| u.open())
                    .map_err(|e| Error::new(ErrorKind::Unexpected, format!("{root}: {e}")))?;
                others.insert(root, s.clone());
                s
            }
        };
        Ok((store, parse(&rest)?))
    }

    /// A FileIO whose every file goes through these stores.
    pub fn file_io(&self) -> FileIO {
        FileIOBuilder::new(Arc::new(ObjectStoreFactory { store: Some(self.clone()) })).build()
    }
}

pub fn store_error(e: object_store::Error) -> Error {
    let kind = match &e {
        object_store::Error::NotFound { .. } => ErrorKind::DataInvalid,
        _ => ErrorKind::Unexpected,
    };
    let retryable = !matches!(e, object_store::Error::NotFound { .. });
    let err = Error::new(kind, "object store request failed").with_source(e);
    if retryable { err.with_retryable(true) } else { err }
}

/// Builds the storage; holds the store in memory only (a FileIO is never sent anywhere).
#[derive(Debug, Serialize, Deserialize)]
struct ObjectStoreFactory {
    #[serde(skip)]
    store: Option<Store>,
}

#[typetag::serde(name = "silt-object-store")]
impl StorageFactory for ObjectStoreFactory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        match &self.store {
            Some(s) => Ok(Arc::new(ObjectStorage { store: Some(s.clone()) })),
            None => Err(Error::new(ErrorKind::Unexpected, "the object store storage has no store")),
        }
    }
}

/// Serializable because iceberg's `Storage` is (typetag); the store itself is never sent.
#[derive(Debug, Serialize, Deserialize)]
struct ObjectStorage {
    #[serde(skip)]
    store: Option<Store>,
}

struct Reader {
    store: Arc<dyn ObjectStore>,
    key: Path,
}

impl ObjectStorage {
    fn store(&self) -> Result<&Store> {
        self.store.as_ref().ok_or_else(|| Error::new(ErrorKind::Unexpected, "the object store storage has no store"))
    }

    fn at(&self, path: &str) -> Result<(Arc<dyn ObjectStore>, Path)> {
        self.store()?.resolve(path)
    }

    fn again(&self) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(ObjectStorage { store: Some(self.store()?.clone()) }))
    }
}

#[async_trait]
impl FileRead for Reader {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        self.store.get_range(&self.key, range).await.map_err(store_error)
    }
}

/// Buffers a file and writes it on close: multipart above 8 MiB (object_store's `BufWriter`).
struct Writer(Option<object_store::buffered::BufWriter>);

#[async_trait]
impl FileWrite for Writer {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        let w = self.0.as_mut().ok_or_else(|| Error::new(ErrorKind::Unexpected, "write after close"))?;
        w.write_all(&bs).await.map_err(|e| Error::new(ErrorKind::Unexpected, "write failed").with_source(e))
    }

    async fn close(&mut self) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        let mut w = self.0.take().ok_or_else(|| Error::new(ErrorKind::Unexpected, "closed twice"))?;
        w.shutdown()
            .await
            .map_err(|e| Error::new(ErrorKind::Unexpected, "upload failed").with_source(e).with_retryable(true))
    }
}

#[async_trait]
#[typetag::serde(name = "silt-object-storage")]
impl Storage for ObjectStorage {
    async fn exists(&self, path: &str) -> Result<bool> {
        let (store, key) = self.at(path)?;
        match store.head(&key).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(store_error(e)),
        }
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let (store, key) = self.at(path)?;
        let meta = store.head(&key).await.map_err(store_error)?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        let (store, key) = self.at(path)?;
        let got = store.get(&key).await.map_err(store_error)?;
        got.bytes().await.map_err(store_error)
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        let (store, key) = self.at(path)?;
        Ok(Box::new(Reader { store, key }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        let (store, key) = self.at(path)?;
        store.put(&key, PutPayload::from_bytes(bs)).await.map(|_| ()).map_err(store_error)
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let (store, key) = self.at(path)?;
        Ok(Box::new(Writer(Some(object_store::buffered::BufWriter::with_capacity(store, key, 8 << 20)))))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let (store, key) = self.at(path)?;
        match store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error(e)),
        }
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        let (store, prefix) = self.at(path.trim_end_matches('/'))?;
        let mut listed = store.list(Some(&prefix));
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(store_error)?;
            store.delete(&meta.location).await.map_err(store_error)?;
        }
        Ok(())
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(p) = paths.next().await {
            self.delete(&p).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        self.at(path)?;
        Ok(InputFile::new(self.again()?, path.to_owned()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        self.at(path)?;
        Ok(OutputFile::new(self.again()?, path.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_local_root_is_made_absolute() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let s = Store::new(store.clone(), "file://./data/objects");
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(s.uri("lakehouse/t"), format!("file://{}/data/objects/lakehouse/t", cwd.display()));
        assert_eq!(Store::new(store, "s3://b/p/").uri("k"), "s3://b/p/k");
    }

    #[tokio::test]
    async fn files_round_trip_through_the_store_under_its_root() {
        let dir = tempfile::tempdir().unwrap();
        let fs = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
        let base = format!("file://{}", dir.path().display());
        let store = Store::new(Arc::new(fs), &base);
        let io = store.file_io();
        let out = io.new_output(store.uri("lakehouse/t/data/a.parquet")).unwrap();
        let mut w = out.writer().await.unwrap();
        w.write(Bytes::from_static(b"hello ")).await.unwrap();
        w.write(Bytes::from_static(b"world")).await.unwrap();
        w.close().await.unwrap();
        assert!(dir.path().join("lakehouse/t/data/a.parquet").exists());
        let input = io.new_input(store.uri("lakehouse/t/data/a.parquet")).unwrap();
        assert_eq!(input.read().await.unwrap(), Bytes::from_static(b"hello world"));
        assert_eq!(input.reader().await.unwrap().read(6..11).await.unwrap(), Bytes::from_static(b"world"));
        assert!(io.exists(store.uri("lakehouse/t/data/a.parquet")).await.unwrap());
        io.delete(store.uri("lakehouse/t/data/a.parquet")).await.unwrap();
        assert!(!io.exists(store.uri("lakehouse/t/data/a.parquet")).await.unwrap());
        assert!(io.new_input("gs://elsewhere/x").is_err(), "only s3:// and file:// are served");
    }
}
