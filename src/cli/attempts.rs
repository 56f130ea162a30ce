//! `attempts tail`: follow the attempt log.

use std::process::ExitCode;

use super::args::AttemptsCommand;
use super::common::{connect, load_ladder};
use crate::config::Config;
use crate::delivery::worker::shutdown_signal;

pub(super) async fn run(cmd: AttemptsCommand, config: &Config) -> anyhow::Result<ExitCode> {
    let AttemptsCommand::Tail {
        ladder,
        outcome,
        tenant,
        json,
        count,
    } = cmd;
    let ladder = load_ladder(&ladder, config)?;
    let conn = connect(config, "hookrelay attempts tail").await?;
    let channel = conn.create_channel().await?;
    let mut seen = 0usize;
    let exchange = ladder.attempts_exchange();
    let tail = crate::ops::tail::tail_attempts(
        &channel,
        &exchange,
        outcome.as_deref(),
        tenant.as_deref(),
        |body| {
            // One line a record, also for a message that carries several; a batch carries
            // other outcomes' and tenants' records beside those the binding asked for.
            match crate::observe::events::AttemptRecord::read_message(body) {
                Ok(records) => {
                    for r in records
                        .into_iter()
                        .filter(|r| r.matches(outcome.as_deref(), tenant.as_deref()))
                    {
                        if count.is_some_and(|c| seen >= c) {
                            break;
                        }
                        if json {
                            println!("{}", serde_json::to_string(&r).unwrap_or_default());
                        } else {
                            println!("{}", crate::ops::tail::format_record(&r));
                        }
                        seen += 1;
                    }
                }
                Err(_) => {
                    println!("{}", String::from_utf8_lossy(body));
                    seen += 1;
                }
            }
            count.is_none_or(|c| seen < c)
        },
    );
    tokio::select! {
        r = tail => r?,
        () = shutdown_signal() => {}
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(ExitCode::SUCCESS)
}
