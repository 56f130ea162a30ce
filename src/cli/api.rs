//! `api`: serve the control plane's HTTP API until a signal; `api openapi`: print its OpenAPI
//! document.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};

use super::args::{ApiArgs, ApiCommand};
use super::common::load_ladder;
use crate::api::auth::Tokens;
use crate::api::validate::Egress;
use crate::api::{ApiSetup, BrokerSetup};
use crate::config::Source;
use crate::config::{Config, ProcessEnv};
use crate::delivery::egress::{EgressPolicy, SystemLookup};
use crate::delivery::worker::shutdown_signal;
use crate::store::PgStore;

pub(super) async fn run(args: ApiArgs, config: Config) -> anyhow::Result<ExitCode> {
    if let Some(ApiCommand::Openapi) = args.command {
        print!("{}", crate::api::openapi::document());
        return Ok(ExitCode::SUCCESS);
    }
    let shutdown = shutdown_signal();
    let Source::Postgres(url) = Source::from_setting(&config.subscriptions) else {
        bail!(
            "`hookrelay api` serves the PostgreSQL store: set `subscriptions` \
             (HOOKRELAY_SUBSCRIPTIONS) to a postgres:// URL"
        );
    };
    let tokens = Tokens::resolve(&config.api.tokens, &ProcessEnv)?;
    if tokens.is_empty() {
        bail!("api.tokens is empty: nobody could call the API; configure at least one token");
    }
    let keyring = crate::store::keyring(&config.store, &ProcessEnv)?;
    if keyring.is_empty() {
        bail!("store.keys is empty: the API seals the secrets it generates with the first key");
    }
    let ladder = load_ladder(&args.ladder, &config)?;
    let store = PgStore::connect(&url, config.store.connect_timeout).await?;
    store.check_schema().await?;
    // History in the store's database unless history.database names another.
    let history = match config.history_database() {
        Some(h) if h != url => {
            let db = PgStore::connect(&h, config.store.connect_timeout).await?;
            db.check_schema().await?;
            db.pool().clone()
        }
        _ => store.pool().clone(),
    };
    let listen = args.listen.unwrap_or(config.api.listen);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (api.listen, --listen)"))?;
    let setup = ApiSetup {
        pool: store.pool().clone(),
        keyring: Arc::new(keyring),
        tokens,
        egress: Egress::new(
            EgressPolicy::from_config(&config.egress),
            Arc::new(SystemLookup),
            config.http.connect_timeout,
        ),
        max_body: config.api.max_body_bytes,
        broker: Some(BrokerSetup {
            amqp_url: config.amqp.url.clone(),
            confirm_timeout: config.amqp.confirm_timeout,
            ladder,
            max_event_bytes: config.limits.max_body_bytes,
            resume_wait: config.api.resume_wait,
            // Only a malformed URL fails here; an unreachable API is reported by the pages.
            management: match super::common::management(&config) {
                Ok(api) => Some(api),
                Err(e) => {
                    tracing::warn!(error = %e, "The console shows no broker figures");
                    None
                }
            },
        }),
        history: Some(history),
        limits: crate::api::quota::Limits::from_config(&config.api),
        pages: crate::api::PagesSetup::from_config(&config.api),
    };
    tracing::info!(store = %store.shown(), "Starting the API");
    let (app, state) = crate::web::app(setup);
    crate::api::serve(listener, app, state, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
