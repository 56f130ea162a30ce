//! `subscriptions check`: validate a subscriptions file offline; `subscriptions pause` and
//! `resume`: set `paused` in the file or the store, and return a paused subscription's parked
//! deliveries; `import` and `export`: between a file and the PostgreSQL store.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};

use super::args::{StoreArg, SubscriptionsCommand};
use super::common::{connect, load_ladder, publisher};
use crate::config::Source;
use crate::config::{Config, ProcessEnv};
use crate::store::PgStore;
use crate::subscriptions::{SecretStore, Subscriptions};

pub(super) async fn run(cmd: SubscriptionsCommand, config: &Config) -> anyhow::Result<ExitCode> {
    match cmd {
        SubscriptionsCommand::Check { file } => check(&file, config),
        SubscriptionsCommand::Import { file, store } => import(&file, &store, config).await,
        SubscriptionsCommand::Export {
            store,
            out,
            secrets_dir,
        } => export(&store, out.as_deref(), secrets_dir.as_deref(), config).await,
        SubscriptionsCommand::Pause { subscription, file } => {
            let path = file.unwrap_or_else(|| config.subscriptions.clone());
            let source = Source::from_setting(&path);
            if set_paused(&source, &subscription, true, config).await? {
                println!(
                    "Paused {subscription} in {}: from their next reload (within {}), workers \
                     park its deliveries; nothing is attempted, cancelled or charged. Resume \
                     with `hookrelay subscriptions resume {subscription}`.",
                    source.shown(),
                    crate::units::fmt_duration(seen_within(&source, config))
                );
            } else {
                println!("{subscription} is already paused in {}.", source.shown());
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
            let source = Source::from_setting(&path);
            if set_paused(&source, &subscription, false, config).await? {
                // Not needed for safety (a late park is moved by the second pass or returned
                // to the worker after the unbind), only so that little parks again.
                let wait = seen_within(&source, config) * 2;
                println!(
                    "Set paused = false for {subscription} in {}; waiting {} for the workers to \
                     reload.",
                    source.shown(),
                    crate::units::fmt_duration(wait)
                );
                tokio::time::sleep(wait).await;
            }
            let subscriptions = match &source {
                Source::File(path) => match Subscriptions::load(path) {
                    Ok(s) => s,
                    Err(errors) => bail!("{errors}"),
                },
                Source::Postgres(url) => {
                    let store = PgStore::connect(url, config.store.connect_timeout).await?;
                    store.load_all().await?.0
                }
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

/// How soon workers see a change: the file's reload interval, or a notification from the store.
fn seen_within(source: &Source, config: &Config) -> std::time::Duration {
    match source {
        Source::File(_) => config.reload.interval,
        Source::Postgres(_) => std::time::Duration::from_secs(1),
    }
}

/// Sets `paused` for `subscription` in the file or the store; false when it already said so.
async fn set_paused(
    source: &Source,
    subscription: &str,
    paused: bool,
    config: &Config,
) -> anyhow::Result<bool> {
    match source {
        Source::File(path) => set_paused_in_file(path, subscription, paused),
        Source::Postgres(url) => {
            let store = PgStore::connect(url, config.store.connect_timeout).await?;
            store.check_schema().await?;
            match crate::store::postgres::set_paused(&store, subscription, paused).await? {
                Some(changed) => Ok(changed),
                // Deleted: nothing to unpause; what it parked comes back and is cancelled.
                None if !paused => Ok(false),
                None => bail!("no subscription {subscription:?} in {}", store.shown()),
            }
        }
    }
}

/// Sets `paused` for `subscription` in the file at `path` (write, then rename, as the worker's
/// reload expects); false when it already said so.
fn set_paused_in_file(path: &Path, subscription: &str, paused: bool) -> anyhow::Result<bool> {
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

async fn import(file: &Path, store: &StoreArg, config: &Config) -> anyhow::Result<ExitCode> {
    let subscriptions = match Subscriptions::load(file) {
        Ok(s) => s,
        Err(errors) => bail!(
            "{} is not valid; nothing imported:\n{errors}",
            file.display()
        ),
    };
    let store = super::store::open(store, config).await?;
    store.check_schema().await?;
    let total = u64::try_from(subscriptions.len()).unwrap_or(u64::MAX);
    let progress = crate::ops::progress::Progress::new(total, "written");
    let mut done = 0;
    let report = crate::store::transfer::import(&store, &subscriptions, || {
        done += 1;
        progress.set(done, "in one transaction");
    })
    .await;
    progress.finish();
    let report = report?;
    println!(
        "{} into {}: {} created, {} updated, {} unchanged.",
        file.display(),
        store.shown(),
        report.created,
        report.updated,
        report.unchanged
    );
    Ok(ExitCode::SUCCESS)
}

async fn export(
    store: &StoreArg,
    out: Option<&Path>,
    secrets_dir: Option<&Path>,
    config: &Config,
) -> anyhow::Result<ExitCode> {
    let store = super::store::open(store, config).await?;
    store.check_schema().await?;
    let keyring = if secrets_dir.is_some() {
        crate::store::keyring(&config.store, &ProcessEnv)?
    } else {
        crate::subscriptions::seal::Keyring::empty()
    };
    if let Some(dir) = secrets_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let text = crate::store::transfer::export(&store, &keyring, secrets_dir).await?;
    match out {
        Some(path) => {
            std::fs::write(path, &text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!("{} written from {}.", path.display(), store.shown());
        }
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}
