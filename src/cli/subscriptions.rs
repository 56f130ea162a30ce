//! `subscriptions check`: validate a subscriptions file offline; `subscriptions pause` and
//! `resume`: set `paused` in the file, and return a paused subscription's parked deliveries.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

use super::args::SubscriptionsCommand;
use super::common::{connect, load_ladder, publisher};
use crate::config::Config;
use crate::delivery::subscriptions::{SecretStore, Subscriptions};

pub(super) async fn run(cmd: SubscriptionsCommand, config: &Config) -> anyhow::Result<ExitCode> {
    match cmd {
        SubscriptionsCommand::Check { file } => check(&file, config),
        SubscriptionsCommand::Pause { subscription, file } => {
            let path = file.unwrap_or_else(|| config.subscriptions.clone());
            if set_paused(&path, &subscription, true)? {
                println!(
                    "Paused {subscription} in {}: from their next reload (within {}), workers \
                     park its deliveries; nothing is attempted, cancelled or charged. Resume \
                     with `hookrelay subscriptions resume {subscription}`.",
                    path.display(),
                    crate::units::fmt_duration(config.reload.interval)
                );
            } else {
                println!("{subscription} is already paused in {}.", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        SubscriptionsCommand::Resume {
            ladder,
            subscription,
            rate,
            file,
        } => {
            let ladder = load_ladder(&ladder, config)?;
            let path = file.unwrap_or_else(|| config.subscriptions.clone());
            if set_paused(&path, &subscription, false)? {
                // Not needed for safety (a late park is moved by the second pass or returned
                // to the worker after the unbind), only so that little parks again.
                let wait = config.reload.interval * 2;
                println!(
                    "Set paused = false for {subscription} in {}; waiting {} for the workers to \
                     reload.",
                    path.display(),
                    crate::units::fmt_duration(wait)
                );
                tokio::time::sleep(wait).await;
            }
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

/// Sets `paused` for `subscription` in the file at `path` (write, then rename, as the worker's
/// reload expects); false when it already said so.
fn set_paused(path: &PathBuf, subscription: &str, paused: bool) -> anyhow::Result<bool> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let shown = path.display().to_string();
    let current = Subscriptions::parse(&shown, &text).map_err(|e| anyhow::anyhow!("{e}"))?;
    match current.get(subscription) {
        Some(s) if s.paused == paused => return Ok(false),
        // Deleted: nothing to unpause; what it parked comes back and is cancelled as deleted.
        None if !paused => return Ok(false),
        _ => {}
    }
    let edited = Subscriptions::with_paused(&shown, &text, subscription, paused)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let tmp = path.with_extension("hookrelay-tmp");
    std::fs::write(&tmp, edited).with_context(|| format!("cannot write {}", tmp.display()))?;
    if let Ok(meta) = std::fs::metadata(path) {
        let _ = std::fs::set_permissions(&tmp, meta.permissions());
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(true)
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
