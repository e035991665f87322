//! Opening the object store named by a URL, with retries that outlast an outage.
//!
//! The `object_store` crate speaks S3 (and MinIO, SeaweedFS) and the local filesystem; it also
//! retries single requests. Its retry budget is kept short here so a request fails in seconds;
//! [`retry`] then keeps trying with capped exponential backoff and full jitter for as long as
//! the store is down, so a slow or absent store delays uploads and never drops them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{HttpConnector, ReqwestConnector};
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::{ClientOptions, ObjectStore, RetryConfig};
use rand::Rng;

use crate::multipart::{Multipart, S3Uploads};

/// A parsed `tiering.object_store` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    S3 { bucket: String, prefix: String },
    File(PathBuf),
}

impl StoreUrl {
    pub fn parse(s: &str) -> Result<StoreUrl, String> {
        let url = url::Url::parse(s).map_err(|e| format!("{s:?} is not a URL: {e}"))?;
        match url.scheme() {
            "s3" => {
                let bucket = url.host_str().filter(|b| !b.is_empty()).ok_or("s3:// URL without a bucket")?;
                let prefix = url.path().trim_matches('/').to_owned();
                Ok(StoreUrl::S3 { bucket: bucket.to_owned(), prefix })
            }
            "file" => {
                let path = url.to_file_path().map_err(|_| format!("{s:?} is not an absolute file:// path"))?;
                Ok(StoreUrl::File(path))
            }
            other => Err(format!("unsupported scheme {other:?} (use s3:// or file://)")),
        }
    }

    /// The default: a directory inside the data directory.
    pub fn default_for(data_dir: &Path) -> StoreUrl {
        StoreUrl::File(data_dir.join("objects"))
    }

    /// For logs: never carries credentials (they come from the environment).
    pub fn describe(&self) -> String {
        match self {
            StoreUrl::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
            StoreUrl::File(p) => format!("file://{}", p.display()),
        }
    }

    pub fn open(&self) -> Result<Arc<dyn ObjectStore>, String> {
        self.open_with_multipart().map(|(store, _)| store)
    }

    /// The store, and where its incomplete multipart uploads can be listed and aborted.
    pub fn open_with_multipart(&self) -> Result<(Arc<dyn ObjectStore>, Multipart), String> {
        match self {
            StoreUrl::S3 { bucket, prefix } => {
                let mut client = ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(120));
                // Set first: `with_client_options` replaces every client option set before it.
                let mut b = AmazonS3Builder::from_env().with_client_options(client.clone()).with_bucket_name(bucket);
                let endpoint = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
                    .iter()
                    .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
                let allow_http = std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
                if let Some(e) = &endpoint {
                    // A custom endpoint (MinIO, SeaweedFS), addressed by path.
                    b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
                }
                if allow_http || endpoint.as_deref().is_some_and(|e| e.starts_with("http://")) {
                    client = client.with_allow_http(true);
                    b = b.with_client_options(client.clone());
                }
                if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
                    b = b.with_region("us-east-1");
                }
                let retry =
                    RetryConfig { max_retries: 3, retry_timeout: Duration::from_secs(15), backoff: Default::default() };
                let region = b.get_config_value(&AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".into());
                let virtual_hosted =
                    b.get_config_value(&AmazonS3ConfigKey::VirtualHostedStyleRequest).is_some_and(|v| v == "true");
                // As object_store derives it (no S3 Express here).
                let bucket_url = match (&endpoint, virtual_hosted) {
                    (Some(e), true) => e.clone(),
                    (Some(e), false) => format!("{}/{bucket}", e.trim_end_matches('/')),
                    (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
                    (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
                };
                let s3 = b.with_retry(retry).build().map_err(|e| e.to_string())?;
                let http = ReqwestConnector::default().connect(&client).map_err(|e| e.to_string())?;
                let uploads = S3Uploads { s3: s3.clone(), client: http, bucket_url, region, prefix: prefix.clone() };
                let store: Arc<dyn ObjectStore> =
                    if prefix.is_empty() { Arc::new(s3) } else { Arc::new(PrefixStore::new(s3, prefix.as_str())) };
                Ok((store, Multipart::S3(Box::new(uploads))))
            }
            StoreUrl::File(path) => {
                std::fs::create_dir_all(path).map_err(|e| format!("create {}: {e}", path.display()))?;
                let fs = LocalFileSystem::new_with_prefix(path).map_err(|e| e.to_string())?;
                Ok((Arc::new(fs), Multipart::File(path.clone())))
            }
        }
    }
}

/// Whether an error is about the request, not the store's health: retrying cannot help.
/// Refused credentials are retried (loudly): roles and keys get fixed without a restart.
/// A failure reading the local segment during an upload is not the store's: retrying the
/// request cannot help (the uploader checks the segment again and retries the whole upload).
pub fn is_permanent(e: &object_store::Error) -> bool {
    match e {
        object_store::Error::Generic { store, .. } => *store == LOCAL_SEGMENT,
        e => matches!(
            e,
            object_store::Error::NotFound { .. }
                | object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }
                | object_store::Error::NotSupported { .. }
                | object_store::Error::NotImplemented { .. }
                | object_store::Error::InvalidPath { .. }
        ),
    }
}

/// The `store` of an error that came from reading the local segment, not from the store.
pub const LOCAL_SEGMENT: &str = "local segment";

/// Capped exponential backoff with full jitter.
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new() -> Self {
        Self { next: Duration::from_millis(100), max: Duration::from_secs(5) }
    }

    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        let ms = rand::rng().random_range(0..=d.as_millis() as u64);
        Duration::from_millis(ms.max(10))
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `op` until it succeeds or fails permanently, sleeping with backoff between attempts.
pub async fn retry<T, F, Fut>(what: &str, mut op: F) -> Result<T, object_store::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, object_store::Error>>,
{
    let mut backoff = Backoff::new();
    let mut failures = 0u32;
    loop {
        match op().await {
            Ok(v) => {
                if failures > 0 {
                    tracing::info!(what, failures, "object store reachable again");
                }
                return Ok(v);
            }
            Err(e) if is_permanent(&e) => return Err(e),
            Err(e) => {
                failures += 1;
                let delay = backoff.next_delay();
                if failures == 1 || failures.is_multiple_of(20) {
                    tracing::warn!(what, failures, error = %e, "object store request failed; retrying");
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_s3_and_file_urls() {
        assert_eq!(
            StoreUrl::parse("s3://bkt/a/b/").unwrap(),
            StoreUrl::S3 { bucket: "bkt".into(), prefix: "a/b".into() }
        );
        assert_eq!(StoreUrl::parse("s3://bkt").unwrap(), StoreUrl::S3 { bucket: "bkt".into(), prefix: String::new() });
        assert_eq!(StoreUrl::parse("file:///var/silt").unwrap(), StoreUrl::File("/var/silt".into()));
        assert!(StoreUrl::parse("gs://x").unwrap_err().contains("unsupported scheme"));
        assert!(StoreUrl::parse("s3:///nobucket").is_err());
        assert!(StoreUrl::parse("not a url").is_err());
    }

    #[test]
    fn backoff_is_capped_and_jittered() {
        let mut b = Backoff::new();
        for _ in 0..50 {
            assert!(b.next_delay() <= Duration::from_secs(5));
        }
    }
}
