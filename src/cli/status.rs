//! `status`: the whole ladder at a glance, once or refreshed in place.

use std::process::ExitCode;

use super::args::StatusArgs;
use super::common::{load_ladder, management};
use crate::config::Config;
use crate::delivery::worker::shutdown_signal;

pub(super) async fn run(args: StatusArgs, config: &Config) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let ladder = load_ladder(&args.ladder, config)?;
    let api = management(config)?;
    let broker = api.broker_version().await?;
    let mut previous: Option<(std::time::Instant, Vec<crate::ops::status::QueueStatus>)> = None;
    loop {
        let rows = crate::ops::status::collect(&api, &ladder, previous.as_ref()).await?;
        if args.json {
            println!("{}", serde_json::to_string(&rows)?);
        } else {
            let table = crate::ops::status::render(&ladder, api.vhost(), &broker, &rows);
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
