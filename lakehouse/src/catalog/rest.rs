//! A client of the Iceberg REST catalog protocol (Polaris, Lakekeeper, Glue's REST endpoint,
//! SeaweedFS): config, namespaces, create, load, list, and a commit of table updates with
//! requirements.
//!
//! Authentication: a static bearer token (`catalog_token`), or OAuth2 client credentials
//! (`catalog_credential = "id:secret"`) exchanged at the catalog's `v1/oauth/tokens` endpoint;
//! the token is renewed when four fifths of its lifetime have passed, and once more when the
//! catalog answers 401.
//!
//! Hand-written on reqwest (in the tree already) rather than with iceberg-catalog-rest 0.10:
//! that client commits only what iceberg's own transaction actions build (no replace
//! snapshots, which compaction needs, and no requirement on the writer's own base) and does
//! not renew tokens.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use iceberg::spec::TableMetadata;
use iceberg::{TableCreation, TableRequirement, TableUpdate};
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Mutex;

use super::{Catalog, CatalogError, Loaded, Result};

pub struct RestCatalog {
    http: reqwest::Client,
    uri: String,
    /// `v1/` or `v1/<prefix>/`, from the catalog's config.
    base: Mutex<Option<String>>,
    warehouse: Option<String>,
    auth: Auth,
    token: Mutex<Option<(String, Instant)>>,
}

enum Auth {
    None,
    Token(String),
    Credential { id: String, secret: String },
}

#[derive(Deserialize)]
struct LoadTableResult {
    #[serde(rename = "metadata-location")]
    metadata_location: Option<String>,
    metadata: TableMetadata,
}

#[derive(Deserialize)]
struct ConfigResponse {
    #[serde(default)]
    overrides: std::collections::HashMap<String, String>,
    #[serde(default)]
    defaults: std::collections::HashMap<String, String>,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    expires_in: Option<u64>,
}

#[derive(Deserialize)]
struct ListTablesResponse {
    identifiers: Vec<Ident>,
    #[serde(rename = "next-page-token")]
    next_page_token: Option<String>,
}

#[derive(Deserialize)]
struct Ident {
    name: String,
}

fn failed(what: &str, e: impl std::fmt::Display) -> CatalogError {
    CatalogError::Failed(format!("REST catalog {what}: {e}"))
}

impl RestCatalog {
    pub fn new(
        uri: &str,
        warehouse: Option<String>,
        credential: Option<String>,
        token: Option<String>,
    ) -> Result<RestCatalog> {
        let auth = match (token, credential) {
            (Some(t), _) => Auth::Token(t),
            (None, Some(c)) => {
                let (id, secret) = c.split_once(':').ok_or_else(|| failed("credential", "must be id:secret"))?;
                Auth::Credential { id: id.to_owned(), secret: secret.to_owned() }
            }
            (None, None) => Auth::None,
        };
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| failed("client", e))?;
        Ok(RestCatalog {
            http,
            uri: uri.trim_end_matches('/').to_owned(),
            base: Mutex::new(None),
            warehouse,
            auth,
            token: Mutex::new(None),
        })
    }

    /// The bearer token to send, fetched or renewed as needed.
    async fn bearer(&self, renew: bool) -> Result<Option<String>> {
        let (id, secret) = match &self.auth {
            Auth::None => return Ok(None),
            Auth::Token(t) => return Ok(Some(t.clone())),
            Auth::Credential { id, secret } => (id, secret),
        };
        let mut token = self.token.lock().await;
        if let Some((t, renew_at)) = token.as_ref()
            && !renew
            && Instant::now() < *renew_at
        {
            return Ok(Some(t.clone()));
        }
        let form = [
            ("grant_type", "client_credentials"),
            ("client_id", id.as_str()),
            ("client_secret", secret.as_str()),
            ("scope", "catalog"),
        ];
        let resp = self
            .http
            .post(format!("{}/v1/oauth/tokens", self.uri))
            .form(&form)
            .send()
            .await
            .map_err(|e| failed("token request", e))?;
        if !resp.status().is_success() {
            let status = resp.status();
            return Err(failed("token request", format!("{status}: {}", resp.text().await.unwrap_or_default())));
        }
        let t: TokenResponse = resp.json().await.map_err(|e| failed("token response", e))?;
        let lifetime = Duration::from_secs(t.expires_in.unwrap_or(3600));
        *token = Some((t.access_token.clone(), Instant::now() + lifetime * 4 / 5));
        Ok(Some(t.access_token))
    }

    /// Sends a request built by `build` with the token; once more with a renewed one on 401.
    async fn send(&self, build: impl Fn() -> reqwest::RequestBuilder) -> Result<reqwest::Response> {
        for renew in [false, true] {
            let mut req = build();
            if let Some(t) = self.bearer(renew).await? {
                req = req.bearer_auth(t);
            }
            let resp = req.send().await.map_err(|e| failed("request", e))?;
            if resp.status() == StatusCode::UNAUTHORIZED && !renew && matches!(self.auth, Auth::Credential { .. }) {
                continue;
            }
            return Ok(resp);
        }
        unreachable!("the loop returns in its second turn")
    }

    /// `<uri>/v1/[<prefix>/]`, the prefix from the catalog's config (asked once).
    async fn base(&self) -> Result<String> {
        let mut base = self.base.lock().await;
        if let Some(b) = base.as_ref() {
            return Ok(b.clone());
        }
        let url = format!("{}/v1/config", self.uri);
        let resp = self
            .send(|| {
                let r = self.http.get(&url);
                match &self.warehouse {
                    Some(w) => r.query(&[("warehouse", w)]),
                    None => r,
                }
            })
            .await?;
        if !resp.status().is_success() {
            return Err(failed("config", resp.status()));
        }
        let config: ConfigResponse = resp.json().await.map_err(|e| failed("config response", e))?;
        let prefix = config.overrides.get("prefix").or(config.defaults.get("prefix"));
        let b = match prefix {
            Some(p) if !p.is_empty() => format!("{}/v1/{}/", self.uri, p.trim_matches('/')),
            _ => format!("{}/v1/", self.uri),
        };
        *base = Some(b.clone());
        Ok(b)
    }

    async fn loaded(resp: reqwest::Response, what: &str) -> Result<Loaded> {
        let r: LoadTableResult = resp.json().await.map_err(|e| failed(what, e))?;
        let location = r.metadata_location.unwrap_or_else(|| r.metadata.location().to_owned());
        Ok(Loaded { metadata: r.metadata, location })
    }
}

async fn error_text(resp: reqwest::Response) -> String {
    let status = resp.status();
    format!("{status}: {}", resp.text().await.unwrap_or_default().chars().take(500).collect::<String>())
}

#[async_trait]
impl Catalog for RestCatalog {
    fn describe(&self) -> String {
        format!("REST catalog {}", self.uri)
    }

    async fn ensure_namespace(&self, namespace: &str) -> Result<()> {
        let url = format!("{}namespaces", self.base().await?);
        let body = json!({ "namespace": [namespace], "properties": {} });
        let resp = self.send(|| self.http.post(&url).json(&body)).await?;
        match resp.status() {
            s if s.is_success() || s == StatusCode::CONFLICT => Ok(()),
            _ => Err(failed("create namespace", error_text(resp).await)),
        }
    }

    async fn load(&self, namespace: &str, table: &str) -> Result<Option<Loaded>> {
        let url = format!("{}namespaces/{namespace}/tables/{table}", self.base().await?);
        let resp = self.send(|| self.http.get(&url)).await?;
        match resp.status() {
            StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => Self::loaded(resp, "load table").await.map(Some),
            _ => Err(failed("load table", error_text(resp).await)),
        }
    }

    async fn create(&self, namespace: &str, creation: TableCreation) -> Result<Loaded> {
        let url = format!("{}namespaces/{namespace}/tables", self.base().await?);
        let name = creation.name.clone();
        let body = json!({
            "name": creation.name,
            "location": creation.location,
            "schema": creation.schema,
            "partition-spec": creation.partition_spec,
            "write-order": creation.sort_order,
            "stage-create": false,
            "properties": creation.properties,
        });
        let resp = self.send(|| self.http.post(&url).json(&body)).await?;
        match resp.status() {
            StatusCode::CONFLICT => self.load(namespace, &name).await?.ok_or_else(|| failed("create", "gone")),
            s if s.is_success() => Self::loaded(resp, "create table").await,
            _ => Err(failed("create table", error_text(resp).await)),
        }
    }

    async fn commit(
        &self,
        namespace: &str,
        table: &str,
        base: &Loaded,
        mut requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<Loaded> {
        // The catalog checks the requirements; the table's uuid stands for "this table".
        requirements.insert(0, TableRequirement::UuidMatch { uuid: base.metadata.uuid() });
        let url = format!("{}namespaces/{namespace}/tables/{table}", self.base().await?);
        let body = json!({
            "identifier": { "namespace": [namespace], "name": table },
            "requirements": requirements,
            "updates": updates,
        });
        let resp = self.send(|| self.http.post(&url).json(&body)).await?;
        match resp.status() {
            StatusCode::CONFLICT => Err(CatalogError::Conflict(error_text(resp).await)),
            s if s.is_success() => Self::loaded(resp, "commit").await,
            // 5xx may mean "committed, but the answer was lost": the writer reloads before it
            // does anything else.
            _ => Err(failed("commit", error_text(resp).await)),
        }
    }

    async fn list(&self, namespace: &str) -> Result<Vec<String>> {
        let url = format!("{}namespaces/{namespace}/tables", self.base().await?);
        let mut out = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let resp = self
                .send(|| {
                    let r = self.http.get(&url);
                    match &page {
                        Some(p) => r.query(&[("pageToken", p)]),
                        None => r,
                    }
                })
                .await?;
            if !resp.status().is_success() {
                return Err(failed("list tables", error_text(resp).await));
            }
            let l: ListTablesResponse = resp.json().await.map_err(|e| failed("list tables", e))?;
            out.extend(l.identifiers.into_iter().map(|i| i.name));
            match l.next_page_token {
                Some(t) if !t.is_empty() => page = Some(t),
                _ => break,
            }
        }
        Ok(out)
    }
}
