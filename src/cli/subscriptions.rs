//! `subscriptions check`: validate a subscriptions file offline; `subscriptions resume`: return
//! a paused subscription's parked deliveries.

use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;

use super::args::SubscriptionsCommand;
use super::common::{connect, load_ladder, publisher};
use crate::config::Config;
use crate::delivery::subscriptions::{SecretStore, Subscriptions};

pub(super) async fn run(cmd: SubscriptionsCommand, config: &Config) -> anyhow::Result<ExitCode> {
    match cmd {
        SubscriptionsCommand::Check { file } => check(&file, config),
        SubscriptionsCommand::Resume {
            ladder,
            subscription,
            rate,
            file,
        } => {
            let ladder = load_ladder(&ladder, config)?;
            let path = file.unwrap_or_else(|| config.subscriptions.clone());
            let subscriptions = match Subscriptions::load(&path) {
                Ok(s) => s,
                Err(errors) => bail!("{errors}"),
            };
            // Refused before connecting: nothing to clean up.
            crate::ops::pause::check_resumable(&subscriptions, &subscription)?;
            let conn = connect(config, "hookrelay subscriptions").await?;
            let publisher = publisher(config, "hookrelay subscriptions").await?;
            let options = crate::ops::mover::MoveOptions {
                rate,
                ..Default::default()
            };
            let resumed = crate::ops::pause::resume(
                &conn,
                &publisher,
                &ladder,
                &subscriptions,
                &subscription,
                &options,
                true,
            )
            .await;
            publisher.close().await;
            let _ = conn.close(200, "done".into()).await;
            let resumed = resumed?;
            let parking = ladder.paused_queue(&subscription);
            if !resumed.found {
                println!("Nothing to resume: {parking} does not exist.");
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "Resumed {subscription}: {} parked delivery(ies) returned ({} parked during the \
                 resume); {}.",
                resumed.first_pass.moved,
                resumed.stragglers.moved,
                if resumed.removed {
                    format!("{parking} removed")
                } else {
                    format!("{parking} kept: {} left in it", resumed.kept())
                }
            );
            Ok(if resumed.kept() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

fn check(file: &Path, config: &Config) -> anyhow::Result<ExitCode> {
    match Subscriptions::load(file) {
        Ok(subs) => {
            println!("{}: {} subscription(s), valid", file.display(), subs.len());
            let secrets = SecretStore::new(config.secrets.refresh);
            for (sub, e) in secrets.unresolved(&subs) {
                println!(
                    "note: subscription {sub}: {e} (here; it must resolve where the worker runs)"
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            for e in &errors.0 {
                println!("{e}");
            }
            println!("{}: {} problem(s)", file.display(), errors.0.len());
            Ok(ExitCode::FAILURE)
        }
    }
}
