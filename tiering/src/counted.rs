//! The object store with its requests counted, so the broker can say what tiering costs in the
//! units object stores bill: write requests (PUT, COPY, POST: single uploads, each step of a
//! multipart upload, manifest versions), read requests (GET, HEAD) and LISTs. Deletes are
//! counted by object. A wrapper over `object_store`'s trait (as its own `LimitStore` is): no
//! hook in the crate counts requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, RenameOptions, Result, UploadPart,
};

/// Requests sent to the store, by the kind stores bill.
#[derive(Debug, Default)]
pub struct Requests {
    pub writes: AtomicU64,
    pub reads: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
}

impl Requests {
    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// An [`ObjectStore`] that counts the requests it passes on.
#[derive(Debug)]
pub struct Counted {
    inner: Arc<dyn ObjectStore>,
    requests: Arc<Requests>,
}

impl Counted {
    pub fn new(inner: Arc<dyn ObjectStore>, requests: Arc<Requests>) -> Self {
        Self { inner, requests }
    }
}

impl std::fmt::Display for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counted({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Counted {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        Requests::count(&self.requests.writes);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        Requests::count(&self.requests.writes);
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(CountedUpload { upload, requests: self.requests.clone() }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        Requests::count(&self.requests.reads);
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: futures_util::stream::BoxStream<'static, Result<Path>>,
    ) -> futures_util::stream::BoxStream<'static, Result<Path>> {
        let requests = self.requests.clone();
        self.inner
            .delete_stream(locations)
            .inspect(move |r| {
                if r.is_ok() {
                    Requests::count(&requests.deletes);
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> futures_util::stream::BoxStream<'static, Result<ObjectMeta>> {
        Requests::count(&self.requests.lists);
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> futures_util::stream::BoxStream<'static, Result<ObjectMeta>> {
        Requests::count(&self.requests.lists);
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        Requests::count(&self.requests.lists);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        Requests::count(&self.requests.writes);
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        Requests::count(&self.requests.writes);
        self.inner.rename_opts(from, to, options).await
    }
}

#[derive(Debug)]
struct CountedUpload {
    upload: Box<dyn MultipartUpload>,
    requests: Arc<Requests>,
}

#[async_trait]
impl MultipartUpload for CountedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        Requests::count(&self.requests.writes);
        self.upload.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        Requests::count(&self.requests.writes);
        self.upload.complete().await
    }

    async fn abort(&mut self) -> Result<()> {
        Requests::count(&self.requests.writes);
        self.upload.abort().await
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, WriteMultipart};

    use super::*;

    #[tokio::test]
    async fn every_request_is_counted_by_kind() {
        let requests = Arc::new(Requests::default());
        let store = Counted::new(Arc::new(InMemory::new()), requests.clone());
        store.put(&Path::from("a"), PutPayload::from_static(b"x")).await.unwrap();
        let mut w = WriteMultipart::new_with_chunk_size(store.put_multipart(&Path::from("b")).await.unwrap(), 5);
        w.put(bytes::Bytes::from_static(b"0123456789ab")); // three parts of at most 5 bytes
        w.finish().await.unwrap();
        store.get_range(&Path::from("b"), 0..4).await.unwrap();
        store.head(&Path::from("a")).await.unwrap();
        store.delete(&Path::from("a")).await.unwrap();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        // put; create + 3 parts + complete
        assert_eq!(get(&requests.writes), 1 + 1 + 3 + 1);
        assert_eq!((get(&requests.reads), get(&requests.deletes), get(&requests.lists)), (2, 1, 0));
    }
}
