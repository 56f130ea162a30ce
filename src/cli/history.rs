//! `history`: materialize the archive and the attempt log into PostgreSQL until a signal;
//! `trace`: an event's story from it.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio_util::sync::CancellationToken;

use super::args::{HistoryArgs, TraceArgs};
use super::common::{connect, load_ladder};
use crate::config::Config;
use crate::delivery::worker::shutdown_signal;
use crate::history::{HistoryMetrics, HistorySetup};
use crate::store::PgStore;

/// The history database, migrated to this version's schema.
async fn database(config: &Config) -> anyhow::Result<PgStore> {
    let Some(url) = config.history_database() else {
        bail!(
            "history needs a PostgreSQL database: set history.database \
             (HOOKRELAY_HISTORY_DATABASE) or `subscriptions` to a postgres:// URL"
        );
    };
    let store = PgStore::connect(&url, config.store.connect_timeout).await?;
    store.check_schema().await?;
    Ok(store)
}

pub(super) async fn run(args: HistoryArgs, config: Config) -> anyhow::Result<ExitCode> {
    let ladder = load_ladder(&args.ladder, &config)?;
    let store = database(&config).await?;
    let stop = CancellationToken::new();
    let signal = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        signal.cancel();
    });
    let metrics = HistoryMetrics::new();
    if let Some(listen) = config.history.listen {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen} (history.listen)"))?;
        tokio::spawn(crate::history::serve_metrics(
            listener,
            metrics.clone(),
            stop.clone(),
        ));
    }
    tracing::info!(database = %store.shown(), listen = ?config.history.listen, "Starting history");
    let setup = HistorySetup {
        pool: store.pool().clone(),
        amqp_url: config.amqp.url.clone(),
        ladder,
        config: config.history.clone(),
        metrics,
    };
    crate::history::materialize::run(setup, stop).await?;
    tracing::info!("History stopped");
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn trace(args: TraceArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let deadline = tokio::time::Instant::now() + args.wait.unwrap_or(Duration::ZERO);
    let story = if let Some(since) = args.since {
        let ladder = load_ladder(&args.ladder, config)?;
        let conn = connect(config, "hookrelay trace").await?;
        let story = crate::history::scan::story(&conn, &ladder, &args.id, since).await;
        let _ = conn.close(200, "done".into()).await;
        story?
    } else {
        let store = database(config).await?;
        loop {
            let story = crate::history::trace::story(store.pool(), &args.id, None).await?;
            if story.is_some() || tokio::time::Instant::now() >= deadline {
                break story;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let Some(story) = story else {
        eprintln!(
            "history holds nothing of {:?}: not an id that was accepted or attempted, past the \
             retention, or not materialized yet (is `hookrelay history` running?)",
            args.id
        );
        return Ok(ExitCode::from(4));
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&story)?);
    } else {
        print!("{}", crate::history::trace::render(&story));
    }
    Ok(ExitCode::SUCCESS)
}
