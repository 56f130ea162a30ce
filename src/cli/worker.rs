//! `worker`: consume and deliver until a signal.

use std::process::ExitCode;

use super::args::WorkerArgs;
use super::common::load_ladder;
use crate::config::Config;
use crate::delivery::subscriptions::LiveSubscriptions;
use crate::delivery::worker::{Worker, WorkerSetup, shutdown_signal};

pub(super) async fn run(args: WorkerArgs, config: Config) -> anyhow::Result<ExitCode> {
    // Installed first: from here on SIGTERM or SIGINT is a clean stop, even while connecting.
    let mut shutdown = std::pin::pin!(shutdown_signal());
    let ladder = load_ladder(&args.ladder, &config)?;
    let path = args
        .subscriptions
        .clone()
        .unwrap_or_else(|| config.subscriptions.clone());
    let subscriptions = LiveSubscriptions::from_file(&path)?;
    tracing::info!(
        subscriptions = subscriptions.current().len(),
        file = %path.display(),
        ladder = %ladder.prefix,
        lease_window = %crate::units::fmt_duration(config.lease_window()),
        "Starting worker"
    );
    let mut setup = WorkerSetup::new(config, ladder, subscriptions);
    setup.name = args.name;
    let worker = tokio::select! {
        started = Worker::start(setup) => started?,
        () = &mut shutdown => {
            tracing::info!("Stopped before the worker had started");
            return Ok(ExitCode::SUCCESS);
        }
    };
    worker.run(shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
