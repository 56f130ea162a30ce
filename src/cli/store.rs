//! `store migrate|status|generate-key|reseal`: the PostgreSQL subscription store.

use std::process::ExitCode;

use anyhow::bail;

use super::args::{StoreArg, StoreCommand};
use crate::config::Source;
use crate::config::{Config, ProcessEnv};
use crate::store::PgStore;

pub(super) async fn run(cmd: StoreCommand, config: &Config) -> anyhow::Result<ExitCode> {
    match cmd {
        StoreCommand::GenerateKey => {
            println!("{}", crate::subscriptions::seal::generate_key());
            Ok(ExitCode::SUCCESS)
        }
        StoreCommand::Migrate(arg) => {
            let store = open(&arg, config).await?;
            let applied = store.migrate().await?;
            if applied.is_empty() {
                println!(
                    "{}: the schema is current; nothing to apply.",
                    store.shown()
                );
            }
            for (version, description) in applied {
                println!("{}: applied {version} {description}", store.shown());
            }
            Ok(ExitCode::SUCCESS)
        }
        StoreCommand::Status(arg) => {
            let store = open(&arg, config).await?;
            let applied = store.applied().await?;
            println!("store:          {}", store.shown());
            println!(
                "schema:         {}",
                match store.check_schema().await {
                    Ok(()) => format!("current (migrations {applied:?})"),
                    Err(e) => e.to_string(),
                }
            );
            if store.check_schema().await.is_err() {
                return Ok(ExitCode::FAILURE);
            }
            let (subs, problems) = store.load_all().await?;
            let counts = crate::store::postgres::secret_counts(&store).await?;
            let keyring = crate::store::keyring(&config.store, &ProcessEnv);
            println!(
                "subscriptions:  {} ({} enabled, {} paused)",
                subs.len(),
                subs.iter().filter(|s| s.enabled).count(),
                subs.iter().filter(|s| s.paused).count()
            );
            println!(
                "secrets:        {} reference(s), {} sealed",
                counts.references, counts.sealed
            );
            match keyring {
                Ok(ring) => match ring.current_key_id() {
                    Some(id) => println!(
                        "sealing key:    {id} ({} sealed with an older key or in the older form)",
                        counts.sealed - crate::store::postgres::sealed_with(&store, &ring).await?
                    ),
                    None => println!("sealing key:    none (store.keys is empty)"),
                },
                Err(e) => println!("sealing key:    {e}"),
            }
            for p in &problems {
                println!("problem:        {p}");
            }
            Ok(if problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        StoreCommand::Reseal(arg) => {
            let store = open(&arg, config).await?;
            store.check_schema().await?;
            let ring = crate::store::keyring(&config.store, &ProcessEnv)?;
            let Some(key) = ring.current_key_id() else {
                bail!("store.keys is empty: nothing to seal with");
            };
            let done = crate::store::postgres::reseal(&store, &ring).await?;
            println!(
                "{}: {} secret(s) sealed again with key {key}, bound to their tenant, \
                 subscription and purpose; {} remembered create answer(s) now refer to their \
                 secret instead of holding it. Every sealed secret now opens with this key, and \
                 older keys can leave store.keys.",
                store.shown(),
                done.secrets,
                done.answers
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The store named by --store or the config's `subscriptions`, which must be a postgres:// URL.
pub(super) async fn open(arg: &StoreArg, config: &Config) -> anyhow::Result<PgStore> {
    let url = match &arg.store {
        Some(url) => url.clone(),
        None => match Source::from_setting(&config.subscriptions) {
            Source::Postgres(url) => url,
            Source::File(path) => bail!(
                "`subscriptions` is a file ({}), not a postgres:// URL: give --store URL or set \
                 HOOKRELAY_SUBSCRIPTIONS",
                path.display()
            ),
        },
    };
    Ok(PgStore::connect(&url, config.store.connect_timeout).await?)
}
