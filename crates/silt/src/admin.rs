//! The admin HTTP listener (`[admin] listen`, `silt serve --admin ADDR`): `/healthz`, and the
//! read side of the Iceberg REST catalog protocol over the node's lakehouse tables at
//! `/iceberg` (`silt_lakehouse::serve`), so DuckDB, pyiceberg, Trino or Spark find the
//! tables by name. axum, on the broker's runtime; catalog reads run on the lakehouse's own.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use silt_lakehouse::Lakehouse;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Clone)]
struct Admin {
    lakehouse: Option<Arc<Lakehouse>>,
}

/// Binds `addr` (the caller logs the bound address).
pub async fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("admin.listen {addr}: {e}"))
}

/// Serves until `stop` turns true.
pub async fn run(listener: TcpListener, lakehouse: Option<Arc<Lakehouse>>, mut stop: watch::Receiver<bool>) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/iceberg", any(|m: Method, s: State<Admin>| iceberg(m, s, String::new())))
        .route("/iceberg/{*path}", any(|m: Method, s: State<Admin>, Path(p): Path<String>| iceberg(m, s, p)))
        .with_state(Admin { lakehouse });
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stopped).await {
        tracing::warn!(error = %e, "admin listener failed");
    }
}

async fn iceberg(method: Method, State(admin): State<Admin>, path: String) -> Response {
    let answer = match admin.lakehouse {
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
