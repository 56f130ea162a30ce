//! The catalog of event types kept in force as it changes, compiled once per change: read
//! again from the subscriptions file when its `[[event_type]]` section changes (every
//! `reload.interval`), or from PostgreSQL when its revision moves (every `catalog.refresh`,
//! one small query). A catalog that does not read is refused loudly and the last good one
//! stays; a type whose schema no longer compiles is left out and named.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::catalog::{Catalog, EventType, LiveCatalog, ValidationMode};
use crate::store::PgStore;

/// Where a worker's catalog comes from.
#[derive(Debug, Clone, Default)]
pub enum CatalogSource {
    /// Never changes (tests, the demo, the bench).
    #[default]
    Fixed,
    /// The `[[event_type]]` section of the subscriptions file.
    File(PathBuf),
    /// The `event_types` tables of the store.
    Postgres(PgStore),
}

/// Why a catalog could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CatalogReadError {
    #[error("{path}: cannot read: {error}")]
    Unreadable { path: String, error: std::io::Error },
    #[error("{path}: {error}")]
    File {
        path: String,
        error: crate::catalog::file::CatalogFileError,
    },
    #[error("event types in the store: {0}")]
    Store(#[from] crate::store::QueryError),
}

impl CatalogSource {
    /// Reads the catalog's types as the source holds them now.
    pub async fn read(&self) -> Result<Vec<EventType>, CatalogReadError> {
        match self {
            CatalogSource::Fixed => Ok(Vec::new()),
            CatalogSource::File(path) => {
                let shown = || path.display().to_string();
                let text = tokio::fs::read_to_string(path).await.map_err(|error| {
                    CatalogReadError::Unreadable {
                        path: shown(),
                        error,
                    }
                })?;
                crate::catalog::file::parse(&text).map_err(|error| CatalogReadError::File {
                    path: shown(),
                    error,
                })
            }
            CatalogSource::Postgres(store) => {
                let rows = crate::store::catalog::list(store.pool()).await?;
                Ok(rows.into_iter().map(|r| r.event_type).collect())
            }
        }
    }
}

/// Compiles `types`, logging each type left out.
pub fn compile(types: &[EventType], unlisted: ValidationMode) -> Catalog {
    let (catalog, problems) = Catalog::compile(types, unlisted);
    for (name, problem) in problems {
        error!(event_type = %name, problem = %problem, "An event type's schema does not compile; its events follow catalog.unlisted");
    }
    catalog
}

/// Follows `source` into `live` until `stop`.
pub(super) async fn follow(
    source: CatalogSource,
    live: Arc<LiveCatalog>,
    unlisted: ValidationMode,
    every: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.reset();
    // What was last put in force: the file's section as read, or the store's revision.
    let mut seen_types: Option<Vec<EventType>> = None;
    let mut seen_revision: Option<(i64, i64)> = None;
    let mut reported: Option<String> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let CatalogSource::Postgres(store) = &source {
            match crate::store::catalog::revision(store.pool()).await {
                Ok(revision) if seen_revision == Some(revision) => continue,
                Ok(revision) => seen_revision = Some(revision),
                Err(e) => {
                    warn!(error = %e, "Catalog of event types not read; the last one stays in force");
                    continue;
                }
            }
        }
        match source.read().await {
            Ok(types) if seen_types.as_ref() == Some(&types) => reported = None,
            Ok(types) => {
                let catalog = compile(&types, unlisted);
                info!(
                    event_types = catalog.len(),
                    "Catalog of event types in force"
                );
                live.replace(catalog);
                seen_types = Some(types);
                reported = None;
            }
            Err(e) => {
                // A store that did not answer is tried again at the next look.
                seen_revision = None;
                let shown = e.to_string();
                if reported.as_deref() != Some(shown.as_str()) {
                    error!(problem = %shown, "Catalog of event types refused; the last good one stays in force");
                    reported = Some(shown);
                }
            }
        }
    }
}
