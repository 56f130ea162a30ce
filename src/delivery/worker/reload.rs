//! The subscriptions file kept in force as it changes: polled, and read again on SIGHUP.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::delivery::dispatch::Dispatcher;
use crate::observe::events::OperationalEvent;
use crate::subscriptions::{
    Reload, SecretStore, SubscriptionError, SubscriptionErrors, Subscriptions,
};

use super::*;

/// The subscriptions' secrets must resolve before they are put in force.
pub(super) fn check_secrets(
    secrets: &SecretStore,
    subscriptions: &Subscriptions,
) -> Result<(), SubscriptionErrors> {
    let unresolved = secrets.unresolved(subscriptions);
    if unresolved.is_empty() {
        return Ok(());
    }
    Err(SubscriptionErrors(
        unresolved
            .into_iter()
            .map(|(sub, e)| SubscriptionError {
                path: "(subscriptions)".into(),
                line: 0,
                field: format!("subscription {sub}: secrets"),
                message: e.to_string(),
            })
            .collect(),
    ))
}

/// Looks at the subscriptions file every `reload.interval` and on SIGHUP. A changed, valid file
/// whose secrets resolve goes into force; anything else is refused, loudly, and the last good
/// version stays.
pub(super) async fn reload_loop(
    dispatcher: Arc<Dispatcher>,
    mut hangup: Option<Hangup>,
    stop: CancellationToken,
) {
    if dispatcher.subscriptions.path().is_none() {
        return;
    }
    let mut tick = tokio::time::interval(dispatcher.config.reload.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let hup = async {
            match hangup.as_mut() {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
            () = hup => info!("SIGHUP: reloading subscriptions"),
        }
        let secrets = Arc::clone(&dispatcher.secrets);
        match dispatcher
            .subscriptions
            .reload(|s| check_secrets(&secrets, s))
        {
            Reload::Unchanged => {}
            Reload::Applied(n) => {
                dispatcher
                    .settler
                    .metrics
                    .subscription_reloads
                    .with_label_values(&["applied"])
                    .inc();
                info!(subscriptions = n, "Subscriptions reloaded");
            }
            Reload::Refused { errors, first } => {
                if first {
                    dispatcher
                        .settler
                        .metrics
                        .subscription_reloads
                        .with_label_values(&["refused"])
                        .inc();
                    for e in &errors.0 {
                        error!(problem = %e, "Subscriptions file refused; the previous version stays in force");
                    }
                    dispatcher.settler.notices.operational(
                        OperationalEvent::new("subscriptions.reload_failed", "invalid")
                            .detail(&errors.to_string()),
                    );
                }
            }
        }
    }
}
