//! The signals a worker answers: SIGHUP (read the subscriptions again) and SIGTERM or
//! Ctrl-C (drain and stop).

use std::future::Future;

use tracing::info;

/// SIGHUP, where there is such a thing.
pub(super) struct Hangup(#[cfg(unix)] tokio::signal::unix::Signal);

impl Hangup {
    pub(super) fn listen() -> Option<Self> {
        #[cfg(unix)]
        {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .ok()
                .map(Hangup)
        }
        #[cfg(not(unix))]
        {
            None
        }
    }

    pub(super) async fn recv(&mut self) {
        #[cfg(unix)]
        {
            self.0.recv().await;
        }
        #[cfg(not(unix))]
        std::future::pending::<()>().await
    }
}

/// Resolves when the process receives SIGTERM or SIGINT. The handlers are installed when this
/// is called, not when the future is first polled: a signal that arrives while the worker is
/// still starting (connecting to a slow broker) is then a clean stop, not the default action,
/// death by signal.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let installed = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        match installed {
            (Some(mut term), Some(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (Some(mut term), None) => {
                term.recv().await;
            }
            (None, _) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        info!("Shutdown signal received");
    }
}
