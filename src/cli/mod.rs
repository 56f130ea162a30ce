//! The command line: what each subcommand takes, and how it maps onto the library. Errors are
//! `anyhow` here, at the edge; exit codes are documented in `--help`.

mod args;
mod common;
mod publish;
mod redrive;
mod status;
mod subscriptions;
mod tier;
mod topology;
mod worker;

use std::process::ExitCode;

pub use args::{
    AttemptsCommand, Cli, Command, EXIT_DRIFT, LadderArg, PublishArgs, RedriveArgs, StatusArgs,
    SubscriptionsCommand, TierCommand, TopologyCommand, WorkerArgs,
};
use common::{connect, load_ladder};

use crate::config::Config;
use crate::delivery::worker::shutdown_signal;

/// Runs one command with a loaded configuration.
pub async fn run(command: Command, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        Command::Topology(cmd) => topology::topology(cmd, &config).await,
        Command::Publish(args) => publish::publish(args, &config).await,
        Command::Worker(args) => worker::worker(args, config).await,
        Command::Subscriptions(SubscriptionsCommand::Check { file }) => {
            subscriptions::check_subscriptions(&file, &config)
        }
        Command::Status(args) => status::status(args, &config).await,
        Command::Tier(cmd) => tier::tier(cmd, &config).await,
        Command::Redrive(args) => redrive::redrive(args, &config).await,
        Command::Attempts(AttemptsCommand::Tail {
            ladder,
            outcome,
            tenant,
            json,
            count,
        }) => {
            let ladder = load_ladder(&ladder, &config)?;
            let conn = connect(&config, "hookrelay attempts tail").await?;
            let channel = conn.create_channel().await?;
            let mut seen = 0usize;
            let exchange = ladder.attempts_exchange();
            let tail = crate::observe::events::tail_attempts(
                &channel,
                &exchange,
                outcome.as_deref(),
                tenant.as_deref(),
                |body| {
                    if json {
                        println!("{}", String::from_utf8_lossy(body));
                    } else {
                        match serde_json::from_slice::<crate::observe::events::AttemptRecord>(body)
                        {
                            Ok(r) => println!("{}", crate::observe::events::format_record(&r)),
                            Err(_) => println!("{}", String::from_utf8_lossy(body)),
                        }
                    }
                    seen += 1;
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
    }
}
