//! Incomplete multipart uploads: a crash (or a fence) in the middle of a segment upload leaves
//! one behind, and S3 bills its parts until it is aborted. The orphan sweep aborts those of
//! older epochs at start-up (see `retention`).
//!
//! Hand-written because `object_store` 0.13.2 can abort a multipart upload
//! (`MultipartStore::abort_multipart`) but not list them: S3 ListMultipartUploads
//! (`GET /?uploads&prefix=…`) is built here from `object_store`'s public pieces — the store's
//! credential provider (`AmazonS3::credentials`), SigV4 signing (`AwsAuthorizer`), its HTTP
//! client (`ReqwestConnector`) — and the XML answer is read with `quick-xml` (already in the
//! dependency tree through `object_store`'s `aws` feature). For a `file://` store the
//! equivalent is the staging file `LocalFileSystem` writes an upload into,
//! `{destination}#{n}`, left behind when `put_multipart` is interrupted.
//!
//! Not guaranteed: only uploads under `segments/` are listed (Silt's only multipart uploads);
//! an S3-compatible store without ListMultipartUploads makes the sweep log and skip.

use std::path::PathBuf;

use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::client::{HttpClient, HttpRequestBody};
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use serde::Deserialize;

/// Where a store's incomplete multipart uploads can be found.
#[derive(Clone, Debug)]
pub enum Multipart {
    S3(Box<S3Uploads>),
    /// The root directory of a `file://` store.
    File(PathBuf),
}

/// What listing and aborting S3 multipart uploads needs.
#[derive(Clone, Debug)]
pub struct S3Uploads {
    pub s3: AmazonS3,
    pub client: HttpClient,
    /// `https://host/bucket` (path style) or `https://bucket.host` (virtual hosted).
    pub bucket_url: String,
    pub region: String,
    /// The store's key prefix (no leading or trailing `/`), empty for none.
    pub prefix: String,
}

/// One incomplete upload: its key relative to the store's prefix, and its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upload {
    pub key: String,
    pub id: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListResult {
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_key_marker: Option<String>,
    #[serde(default)]
    next_upload_id_marker: Option<String>,
    #[serde(default, rename = "Upload")]
    uploads: Vec<ListedUpload>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListedUpload {
    key: String,
    upload_id: String,
}

/// Most pages one listing reads (1,000 uploads each).
const MAX_PAGES: usize = 100;

impl Multipart {
    /// The incomplete uploads under `segments/`.
    pub async fn list(&self) -> Result<Vec<Upload>, String> {
        match self {
            Multipart::S3(s3) => s3.list().await,
            Multipart::File(root) => {
                let root = root.clone();
                tokio::task::spawn_blocking(move || list_staged(&root)).await.map_err(|e| e.to_string())?
            }
        }
    }

    /// Aborts one upload listed by [`Self::list`].
    pub async fn abort(&self, upload: &Upload) -> Result<(), String> {
        match self {
            Multipart::S3(s3) => {
                let path = Path::from(s3.full_key(&upload.key));
                s3.s3.abort_multipart(&path, &upload.id).await.map_err(|e| e.to_string())
            }
            Multipart::File(root) => {
                let path = root.join(format!("{}#{}", upload.key, upload.id));
                match std::fs::remove_file(&path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(format!("{}: {e}", path.display())),
                }
            }
        }
    }
}

impl S3Uploads {
    fn full_key(&self, key: &str) -> String {
        if self.prefix.is_empty() { key.to_owned() } else { format!("{}/{key}", self.prefix) }
    }

    async fn list(&self) -> Result<Vec<Upload>, String> {
        let prefix = self.full_key("segments/");
        let strip = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        let mut out = Vec::new();
        let mut markers: Option<(String, String)> = None;
        for _ in 0..MAX_PAGES {
            let page = self.list_page(&prefix, markers.as_ref()).await?;
            for u in page.uploads {
                if let Some(key) = u.key.strip_prefix(&strip) {
                    out.push(Upload { key: key.to_owned(), id: u.upload_id });
                }
            }
            match (page.is_truncated, page.next_key_marker, page.next_upload_id_marker) {
                (true, Some(k), Some(u)) => markers = Some((k, u)),
                _ => return Ok(out),
            }
        }
        Ok(out)
    }

    /// One signed `GET ?uploads` request.
    async fn list_page(&self, prefix: &str, markers: Option<&(String, String)>) -> Result<ListResult, String> {
        let mut url = url::Url::parse(&format!("{}/", self.bucket_url.trim_end_matches('/')))
            .map_err(|e| format!("bucket URL {}: {e}", self.bucket_url))?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("uploads", "");
            q.append_pair("prefix", prefix);
            if let Some((key, id)) = markers {
                q.append_pair("key-marker", key);
                q.append_pair("upload-id-marker", id);
            }
        }
        let mut req = http::Request::builder()
            .method(http::Method::GET)
            .uri(url.as_str())
            .body(HttpRequestBody::empty())
            .map_err(|e| e.to_string())?;
        let credential = self.s3.credentials().get_credential().await.map_err(|e| e.to_string())?;
        AwsAuthorizer::new(&credential, "s3", &self.region).authorize(&mut req, None);
        let resp = self.client.execute(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp.into_body().bytes().await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() {
            return Err(format!(
                "ListMultipartUploads answered {status}: {}",
                text.chars().take(300).collect::<String>()
            ));
        }
        parse_list(&text)
    }
}

fn parse_list(xml: &str) -> Result<ListResult, String> {
    quick_xml::de::from_str(xml).map_err(|e| format!("ListMultipartUploads answer: {e}"))
}

/// Staging files of interrupted uploads in a local store: `segments/{key}#{n}`.
fn list_staged(root: &std::path::Path) -> Result<Vec<Upload>, String> {
    let dir = root.join("segments");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((key, n)) = name.to_str().and_then(|n| n.rsplit_once('#')) else { continue };
        if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
            out.push(Upload { key: format!("segments/{key}"), id: n.to_owned() });
        }
    }
    out.sort_by(|a, b| (&a.key, &a.id).cmp(&(&b.key, &b.id)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_multipart_uploads_answer_is_read() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>b</Bucket><KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker>
  <NextKeyMarker>p/segments/2.seg</NextKeyMarker><NextUploadIdMarker>id2</NextUploadIdMarker>
  <Prefix>p/segments/</Prefix><MaxUploads>1000</MaxUploads><IsTruncated>true</IsTruncated>
  <Upload><Key>p/segments/1.seg</Key><UploadId>id1</UploadId><Initiated>2024-01-01T00:00:00.000Z</Initiated></Upload>
  <Upload><Key>p/segments/2.seg</Key><UploadId>id2</UploadId></Upload>
</ListMultipartUploadsResult>"#;
        let r = parse_list(xml).unwrap();
        assert!(r.is_truncated);
        assert_eq!(r.uploads.len(), 2);
        assert_eq!((r.uploads[1].key.as_str(), r.uploads[1].upload_id.as_str()), ("p/segments/2.seg", "id2"));
        assert_eq!(r.next_upload_id_marker.as_deref(), Some("id2"));
        let empty =
            parse_list("<ListMultipartUploadsResult><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>")
                .unwrap();
        assert!(empty.uploads.is_empty() && !empty.is_truncated);
    }

    #[test]
    fn staging_files_of_a_local_store_are_its_incomplete_uploads() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("segments")).unwrap();
        for name in ["00000000000000000000-00000001.seg#1", "00000000000000000000-00000001.seg", "x#y", "a.seg#12"] {
            std::fs::write(dir.path().join("segments").join(name), b"").unwrap();
        }
        let got = list_staged(dir.path()).unwrap();
        assert_eq!(
            got,
            vec![
                Upload { key: "segments/00000000000000000000-00000001.seg".into(), id: "1".into() },
                Upload { key: "segments/a.seg".into(), id: "12".into() },
            ]
        );
    }
}
