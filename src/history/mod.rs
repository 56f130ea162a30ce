//! History: what the archive and attempt-log streams hold, materialized into PostgreSQL so an
//! event's story can be asked for by id and a subscription's attempts listed.
//!
//! - [`rows`]: a stream message as a row, written as `COPY` text; the day partitions (pure).
//! - [`materialize`]: `hookrelay history`, the process that reads the streams into the
//!   database, a batch and its stream offset per transaction.
//! - [`trace`]: the queries `hookrelay trace` and the API's history routes answer with.
//! - [`scan`]: the same story read from the streams over a window, without the database.
//! - [`progress`]: where history is in each stream, for `hookrelay status`.
//! - [`health`]: the endpoints failing now and the recent dead-letterings, for the console.

pub mod health;
pub mod materialize;
pub mod progress;
pub mod rows;
pub mod scan;
pub mod trace;

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, TextEncoder};
use tokio_util::sync::CancellationToken;

pub use materialize::{HistoryError, HistoryMetrics, HistorySetup};

/// Serves `/metrics` and `/healthz` for `hookrelay history` until `stop`.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: HistoryMetrics,
    stop: CancellationToken,
) {
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = metrics.registry.clone();
                async move {
                    let mut text = Vec::new();
                    let _ = TextEncoder::new().encode(&registry.gather(), &mut text);
                    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }));
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
}
