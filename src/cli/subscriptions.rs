//! `subscriptions check`: validate a subscriptions file offline.

use std::process::ExitCode;

use super::args::SubscriptionsCommand;
use crate::config::Config;
use crate::delivery::subscriptions::{SecretStore, Subscriptions};

pub(super) fn run(cmd: SubscriptionsCommand, config: &Config) -> anyhow::Result<ExitCode> {
    let SubscriptionsCommand::Check { file } = cmd;
    match Subscriptions::load(&file) {
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
