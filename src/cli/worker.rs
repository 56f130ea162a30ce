//! `worker`: consume and deliver until a signal.

use std::process::ExitCode;

use super::args::WorkerArgs;
use super::common::load_ladder;
use std::sync::Arc;

use crate::catalog::LiveCatalog;
use crate::config::Source;
use crate::config::{Config, ProcessEnv};
use crate::delivery::worker::catalog::{self, CatalogSource};
use crate::delivery::worker::{Worker, WorkerSetup, shutdown_signal};
use crate::subscriptions::{LiveSubscriptions, SecretStore};

pub(super) async fn run(args: WorkerArgs, config: Config) -> anyhow::Result<ExitCode> {
    // Installed first: from here on SIGTERM or SIGINT is a clean stop, even while connecting.
    let mut shutdown = std::pin::pin!(shutdown_signal());
    let ladder = load_ladder(&args.ladder, &config)?;
    let setting = args
        .subscriptions
        .clone()
        .unwrap_or_else(|| config.subscriptions.clone());
    let source = Source::from_setting(&setting);
    let (subscriptions, store) = match &source {
        Source::File(path) => (LiveSubscriptions::from_file(path)?, None),
        Source::Postgres(url) => {
            let store = crate::store::follow::open(url, config.store.connect_timeout).await?;
            if let Some(limits) = crate::subscriptions::cache::CacheLimits::of(&config.store) {
                // Held as deliveries need them: the store's size does not bound the worker's
                // memory, and nothing is read at start.
                let loader = crate::store::held::StoreLoader::own_pool(
                    &store,
                    config.store.lookup_connections,
                );
                let cache =
                    crate::subscriptions::cache::SubscriptionCache::new(limits, Arc::new(loader));
                let opened = crate::store::follow::Opened::listen(store).await?;
                (
                    LiveSubscriptions::cached(Arc::new(cache)),
                    Some(opened.following()),
                )
            } else {
                let mut opened = crate::store::follow::Opened::open(store).await?;
                for p in &opened.problems {
                    tracing::error!(problem = %p, "A stored subscription does not validate; left out");
                }
                let first = std::mem::take(&mut opened.first);
                (LiveSubscriptions::followed(first), Some(opened.following()))
            }
        }
    };
    let catalog_source = match (&source, &store) {
        (Source::File(path), _) => CatalogSource::File(path.clone()),
        (Source::Postgres(_), Some(following)) => CatalogSource::Postgres(following.store.clone()),
        (Source::Postgres(_), None) => CatalogSource::Fixed,
    };
    // Read once here so a catalog that does not read stops the start, as subscriptions do.
    let types = catalog_source.read().await?;
    let catalog = catalog::compile(&types, config.catalog.unlisted);
    tracing::info!(
        event_types = catalog.len(),
        subscriptions = subscriptions.current().len(),
        from = %source.shown(),
        ladder = %ladder.prefix,
        lease_window = %crate::units::fmt_duration(config.lease_window()),
        "Starting worker"
    );
    let keyring = if store.is_some() {
        crate::store::keyring(&config.store, &ProcessEnv)?
    } else {
        crate::subscriptions::seal::Keyring::empty()
    };
    let mut setup = WorkerSetup::new(config, ladder, subscriptions);
    setup.secrets = SecretStore::new(setup.config.secrets.refresh).with_keyring(Arc::new(keyring));
    setup.store = store;
    setup.catalog = Arc::new(LiveCatalog::new(catalog));
    setup.catalog_source = catalog_source;
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
