//! The read side of the Iceberg REST catalog protocol, served by the node itself (the admin
//! listener mounts it at `/iceberg`): config, namespaces, list, load and exists of tables, so
//! DuckDB (`ATTACH ... (TYPE iceberg, ENDPOINT ...)`) and pyiceberg (`load_catalog(type="rest")`)
//! find every table without knowing paths. Read only: Silt writes the tables; anything else is
//! answered 405 with the protocol's error body.
//!
//! Framework-free: [`handle`] maps a method and a path to a status and a JSON body, so the
//! admin listener's HTTP stack stays its own choice.

use serde_json::{Value, json};

use crate::Lakehouse;
use crate::catalog::CatalogError;

/// A response: status and JSON body (`None` for HEAD and 204).
pub struct Response {
    pub status: u16,
    pub body: Option<Value>,
}

fn error(status: u16, kind: &str, message: impl Into<String>) -> Response {
    Response { status, body: Some(json!({ "error": { "message": message.into(), "type": kind, "code": status } })) }
}

fn ok(body: Value) -> Response {
    Response { status: 200, body: Some(body) }
}

/// Answers `method` on `path` (the part after the mount point, e.g. `/v1/config`).
pub async fn handle(lakehouse: Option<&Lakehouse>, method: &str, path: &str) -> Response {
    let parts: Vec<&str> = path.trim_matches('/').split('/').filter(|p| !p.is_empty()).collect();
    let read = matches!(method, "GET" | "HEAD");
    if !read {
        return error(405, "NotSupportedException", "this catalog is read only: Silt writes its tables");
    }
    let head = method == "HEAD";
    let ns_name = lakehouse.map(|l| l.namespace().to_owned());
    let known_ns = |ns: &str| ns_name.as_deref() == Some(ns);
    match parts.as_slice() {
        ["v1", "config"] => ok(json!({
            "defaults": {},
            "overrides": {},
            "endpoints": [
                "GET /v1/{prefix}/namespaces",
                "GET /v1/{prefix}/namespaces/{namespace}",
                "HEAD /v1/{prefix}/namespaces/{namespace}",
                "GET /v1/{prefix}/namespaces/{namespace}/tables",
                "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
                "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
            ],
        })),
        ["v1", "namespaces"] => {
            ok(json!({ "namespaces": ns_name.iter().map(|n| vec![n.clone()]).collect::<Vec<_>>() }))
        }
        ["v1", "namespaces", ns] if known_ns(ns) => {
            if head {
                Response { status: 204, body: None }
            } else {
                ok(json!({ "namespace": [ns], "properties": {} }))
            }
        }
        ["v1", "namespaces", ns] => error(404, "NoSuchNamespaceException", format!("namespace {ns} does not exist")),
        ["v1", "namespaces", ns, "tables"] if known_ns(ns) => {
            let l = lakehouse.expect("invariant: a known namespace has a lakehouse");
            match l.catalog().list(ns).await {
                Ok(names) => ok(json!({
                    "identifiers": names.iter().map(|n| json!({ "namespace": [ns], "name": n })).collect::<Vec<_>>(),
                })),
                Err(e) => unavailable(e),
            }
        }
        ["v1", "namespaces", ns, "tables", table] if known_ns(ns) => {
            let l = lakehouse.expect("invariant: a known namespace has a lakehouse");
            match l.catalog().load(ns, table).await {
                Ok(Some(_)) if head => Response { status: 204, body: None },
                Ok(Some(t)) => ok(json!({ "metadata-location": t.location, "metadata": t.metadata, "config": {} })),
                Ok(None) => error(404, "NoSuchTableException", format!("table {ns}.{table} does not exist")),
                Err(e) => unavailable(e),
            }
        }
        ["v1", "namespaces", ns, ..] => {
            error(404, "NoSuchNamespaceException", format!("namespace {ns} does not exist"))
        }
        _ => error(404, "NotFoundException", format!("no such endpoint: {path}")),
    }
}

fn unavailable(e: CatalogError) -> Response {
    error(503, "ServiceUnavailableException", e.to_string())
}
