//! `status`: the whole ladder at a glance, once or refreshed in place.

use std::process::ExitCode;

use super::args::StatusArgs;
use super::common::{load_ladder, management};
use crate::config::Config;
use crate::delivery::worker::shutdown_signal;

/// The history database, when one is configured and answers within a few seconds; status
/// shows the ladder without it otherwise.
async fn history_pool(config: &Config) -> Option<sqlx::PgPool> {
    let url = config.history_database()?;
    match crate::store::PgStore::connect(&url, std::time::Duration::from_secs(3)).await {
        Ok(store) => Some(store.pool().clone()),
        Err(e) => {
            eprintln!("status: history's progress is left out: {e}");
            None
        }
    }
}

pub(super) async fn run(args: StatusArgs, config: &Config) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let ladder = load_ladder(&args.ladder, config)?;
    let api = management(config)?;
    let facts = crate::broker::compat::BrokerFacts::read(&api, &ladder).await?;
    let broker = facts.summary();
    let notes = crate::broker::compat::notes(&facts, crate::broker::compat::Needs::of(config));
    let mut previous: Option<(std::time::Instant, Vec<crate::ops::status::QueueStatus>)> = None;
    let history = history_pool(config).await;
    let streams: Vec<String> = ladder
        .streams()
        .into_iter()
        .map(|(kind, _)| ladder.stream(kind))
        .collect();
    loop {
        let rows = crate::ops::status::collect(&api, &ladder, previous.as_ref()).await?;
        if args.json {
            println!("{}", serde_json::to_string(&rows)?);
        } else {
            let mut table = crate::ops::status::render(&ladder, api.vhost(), &broker, &rows);
            for note in &notes {
                table.push_str(&format!("Warning: {note}\n"));
            }
            if let Some(pool) = &history
                && !streams.is_empty()
            {
                match crate::history::progress::of(pool, &streams).await {
                    Ok(p) => table.push_str(&crate::history::progress::render(&streams, &p)),
                    Err(e) => table.push_str(&format!("History: cannot read its progress: {e}\n")),
                }
            }
            if args.watch {
                // Home the cursor and clear, so the table refreshes in place.
                print!("\x1b[H\x1b[2J{table}");
                let _ = std::io::stdout().flush();
            } else {
                print!("{table}");
            }
        }
        if !args.watch {
            return Ok(ExitCode::SUCCESS);
        }
        previous = Some((std::time::Instant::now(), rows));
        tokio::select! {
            () = tokio::time::sleep(args.interval) => {}
            () = shutdown_signal() => return Ok(ExitCode::SUCCESS),
        }
    }
}
