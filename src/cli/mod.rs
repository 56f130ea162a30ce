//! The command line: what each subcommand takes, and how it maps onto the library. Errors are
//! `anyhow` here, at the edge; exit codes are documented in `--help`.
//!
//! `args` holds the clap definitions, whose doc comments are the help text; each command group
//! has a file of its own (`api`, `topology`, `publish`, `worker`, `subscriptions`, `status`, `tier`,
//! `redrive`, `replay`, `attempts`, `history` with `trace`, `store`), and `common` what several of them share.

mod api;
mod args;
mod attempts;
mod common;
mod history;
mod publish;
mod redrive;
mod replay;
mod status;
mod store;
mod subscriptions;
mod tier;
mod topology;
mod worker;

use std::process::ExitCode;

pub use args::{
    ApiArgs, ApiCommand, AttemptsCommand, Cli, Command, EXIT_DRIFT, HistoryArgs, KeysCommand,
    LadderArg, PublishArgs, RedriveArgs, ReplayArgs, StatusArgs, StoreArg, StoreCommand,
    SubscriptionsCommand, TierCommand, TopologyCommand, TraceArgs, WorkerArgs,
};

use crate::config::Config;

/// Runs one command with a loaded configuration.
pub async fn run(command: Command, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        Command::Topology(cmd) => topology::run(cmd, &config).await,
        Command::Publish(args) => publish::run(args, &config).await,
        Command::Worker(args) => worker::run(args, config).await,
        Command::Subscriptions(cmd) => subscriptions::run(cmd, &config).await,
        Command::Status(args) => status::run(args, &config).await,
        Command::Tier(cmd) => tier::run(cmd, &config).await,
        Command::Redrive(args) => redrive::run(args, &config).await,
        Command::Replay(args) => replay::run(args, &config).await,
        Command::Attempts(cmd) => attempts::run(cmd, &config).await,
        Command::History(args) => history::run(args, config).await,
        Command::Trace(args) => history::trace(args, &config).await,
        Command::Store(cmd) => store::run(cmd, &config).await,
        Command::Api(args) => api::run(args, config).await,
        Command::Keys(KeysCommand::Generate) => {
            let (secret_key, public_key) = crate::contract::signing::generate_key_pair();
            println!("secret_key={secret_key}\npublic_key={public_key}");
            Ok(ExitCode::SUCCESS)
        }
    }
}
