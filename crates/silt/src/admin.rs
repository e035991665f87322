//! The admin HTTP listener (`[admin] listen`, `silt serve --admin ADDR`), bound before
//! recovery starts:
//! - `/metrics`: Prometheus text ([`crate::metrics`]);
//! - `/healthz`: the process answers; `/readyz`: 200 once recovery finished and every listener
//!   is bound, 503 while recovering, when fenced by a newer node, or stopping;
//! - `/`: the status page, and `/api/status`, its figures as JSON ([`crate::status`]);
//! - `/iceberg/...`: the read side of the Iceberg REST catalog protocol over the node's
//!   lakehouse tables (`silt_lakehouse::serve`), so DuckDB, pyiceberg, Trino or Spark find the
//!   tables by name;
//! - `/silt.admin.v1.Admin/...`: the gRPC admin API ([`crate::grpc`]) over HTTP/2 (h2c, prior
//!   knowledge) on the same port: axum's server answers HTTP/1.1 and HTTP/2 both.
//!
//! With `[admin] token_file` set, `/api/` and gRPC need `Authorization: Bearer <token>`
//! on every address, loopback included (HTTP 401, gRPC UNAUTHENTICATED without it; the page
//! asks for the token on a 401); without one they are open, which config
//! validation allows only on a loopback address. `/metrics`, `/healthz`, `/readyz`, the page
//! and the catalog stay open (Prometheus, load balancers). The token is never logged.
//!
//! axum, on the broker's runtime; catalog reads run on the lakehouse's own.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use silt_lakehouse::Lakehouse;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What the listener serves, filled in as the node comes up.
#[derive(Default)]
pub struct AdminState {
    phase: AtomicU8,
    pub lakehouse: OnceLock<Arc<Lakehouse>>,
    pub metrics: OnceLock<crate::metrics::Sources>,
    /// `(protocol, bound address)` of each listener, added as they bind.
    listeners: Mutex<Vec<(String, String)>>,
    history: crate::status::History,
}

// 0, the default: recovering.
const READY: u8 = 1;
const STOPPING: u8 = 2;

impl AdminState {
    pub fn ready(&self) {
        self.phase.store(READY, Ordering::Release);
    }

    pub fn stopping(&self) {
        self.phase.store(STOPPING, Ordering::Release);
    }

    /// A listener bound `addr` (for the status page).
    pub fn bound(&self, protocol: impl Into<String>, addr: impl ToString) {
        self.listeners.lock().expect("invariant: lock not poisoned").push((protocol.into(), addr.to_string()));
    }

    /// `(protocol, bound address)` of each listener bound so far.
    pub fn listeners(&self) -> Vec<(String, String)> {
        self.listeners.lock().expect("invariant: lock not poisoned").clone()
    }
}

/// The bearer token of `[admin] token_file`. Its `Debug` hides it.
#[derive(Clone)]
pub struct Token(Arc<[u8]>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// Reads `path`: the token is its content, surrounding whitespace trimmed.
    pub fn load(path: &std::path::Path) -> anyhow::Result<Token> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("admin.token_file: cannot read {}: {e}", path.display()))?;
        let token = text.trim();
        if token.is_empty() {
            anyhow::bail!("admin.token_file: {} is empty", path.display());
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            anyhow::bail!("admin.token_file: the token in {} must be one word (no spaces)", path.display());
        }
        Ok(Token(token.as_bytes().into()))
    }

    /// Whether an `Authorization` header value carries this token, compared in constant time
    /// (over the token's length; a length mismatch answers at once, the length is no secret).
    fn accepts(&self, header: Option<&[u8]>) -> bool {
        let Some(given) = header.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return false;
        };
        given.len() == self.0.len() && given.iter().zip(self.0.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// The paths that need the token when one is configured.
fn guarded(path: &str) -> Guard {
    if path.starts_with("/api/") {
        Guard::Http
    } else if path.starts_with("/silt.admin.") {
        Guard::Grpc
    } else {
        Guard::Open
    }
}

enum Guard {
    Open,
    Http,
    Grpc,
}

async fn authorize(State(token): State<Option<Token>>, req: Request, next: axum::middleware::Next) -> Response {
    let Some(token) = token else { return next.run(req).await };
    let header = req.headers().get(axum::http::header::AUTHORIZATION).map(|v| v.as_bytes());
    match guarded(req.uri().path()) {
        Guard::Open => next.run(req).await,
        _ if token.accepts(header) => next.run(req).await,
        Guard::Http => (
            StatusCode::UNAUTHORIZED,
            [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
            "a bearer token is required (admin.token_file)\n",
        )
            .into_response(),
        Guard::Grpc => tonic::Status::unauthenticated("a bearer token is required (admin.token_file)")
            .into_http::<axum::body::Body>(),
    }
}

type Admin = Arc<AdminState>;

/// Binds `addr` (the caller logs the bound address).
pub async fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("admin.listen {addr}: {e}"))
}

/// Serves until `stop` turns true; `token` guards `/api/` and gRPC.
pub async fn run(listener: TcpListener, state: Arc<AdminState>, token: Option<Token>, mut stop: watch::Receiver<bool>) {
    // Only the service's own paths: anything else stays a 404, not a gRPC UNIMPLEMENTED.
    let grpc_path = format!("/{}/{{*rpc}}", crate::grpc::SERVICE);
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/", get(|| async { axum::response::Html(crate::status::INDEX_HTML) }))
        .route("/status.js", get(|| async { asset("text/javascript; charset=utf-8", crate::status::STATUS_JS) }))
        .route("/status.css", get(|| async { asset("text/css; charset=utf-8", crate::status::STATUS_CSS) }))
        .route("/api/status", get(status))
        .route("/iceberg", any(|m: Method, s: State<Admin>| iceberg(m, s, String::new())))
        .route("/iceberg/{*path}", any(|m: Method, s: State<Admin>, Path(p): Path<String>| iceberg(m, s, p)))
        .route_service(&grpc_path, crate::grpc::service(state.clone()))
        .with_state(state.clone())
        .layer(axum::middleware::from_fn_with_state(token, authorize));
    let sampler = tokio::spawn(async move { crate::status::sample_every(&state.history, &state.metrics).await });
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stopped).await {
        tracing::warn!(error = %e, "admin listener failed");
    }
    sampler.abort();
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn status(State(admin): State<Admin>) -> Response {
    if admin.metrics.get().is_none() {
        return (StatusCode::SERVICE_UNAVAILABLE, "recovering\n").into_response();
    }
    // Reads the index (consumer-group lag): off the runtime's threads.
    let doc = tokio::task::spawn_blocking(move || {
        let listeners = admin.listeners.lock().expect("invariant: lock not poisoned").clone();
        admin.metrics.get().map(|m| crate::status::collect(m, &listeners, &admin.history))
    })
    .await;
    match doc {
        Ok(Some(doc)) => axum::Json(doc).into_response(),
        Ok(None) | Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "status failed\n").into_response(),
    }
}

async fn readyz(State(admin): State<Admin>) -> Response {
    let fenced = admin.metrics.get().is_some_and(|m| m.tiering.stats().fenced);
    let (status, why) = match admin.phase.load(Ordering::Acquire) {
        STOPPING => (StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
        READY if fenced => (StatusCode::SERVICE_UNAVAILABLE, "fenced: a newer node owns the object-store prefix\n"),
        READY => (StatusCode::OK, "ready\n"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "recovering\n"),
    };
    (status, why).into_response()
}

async fn metrics(State(admin): State<Admin>) -> Response {
    if admin.metrics.get().is_none() {
        return (StatusCode::SERVICE_UNAVAILABLE, "recovering\n").into_response();
    }
    // A scrape reads the index (consumer-group lag): off the runtime's threads.
    let text = match tokio::task::spawn_blocking(move || admin.metrics.get().map(crate::metrics::render)).await {
        Ok(Some(text)) => text,
        Ok(None) | Err(_) => return (StatusCode::INTERNAL_SERVER_ERROR, "metrics failed\n").into_response(),
    };
    ([(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
        .into_response()
}

async fn iceberg(method: Method, State(admin): State<Admin>, path: String) -> Response {
    let answer = match admin.lakehouse.get().cloned() {
        Some(l) => {
            let on = l.clone();
            let m = method.to_string();
            on.on_runtime(async move { silt_lakehouse::serve::handle(Some(&l), &m, &path).await }).await
        }
        None => Some(silt_lakehouse::serve::handle(None, method.as_str(), &path).await),
    };
    let Some(r) = answer else {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response();
    };
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match r.body {
        Some(body) => (status, axum::Json(body)).into_response(),
        None => status.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_is_accepted() {
        let t = Token(b"abc123".as_slice().into());
        assert!(t.accepts(Some(b"Bearer abc123")));
        for wrong in [&b"Bearer abc124"[..], b"Bearer abc12", b"Bearer abc1234", b"abc123", b"Basic abc123", b""] {
            assert!(!t.accepts(Some(wrong)), "{}", String::from_utf8_lossy(wrong));
        }
        assert!(!t.accepts(None));
        assert_eq!(format!("{t:?}"), "Token(..)");
    }

    #[test]
    fn api_and_grpc_paths_are_guarded_and_the_rest_is_open() {
        assert!(matches!(guarded("/api/status"), Guard::Http));
        assert!(matches!(guarded("/silt.admin.v1.Admin/Status"), Guard::Grpc));
        for open in ["/metrics", "/healthz", "/readyz", "/", "/iceberg/v1/config"] {
            assert!(matches!(guarded(open), Guard::Open), "{open}");
        }
    }
}
