//! `topology apply`, `plan` and `export`, and the broker check quorum tiers need first.

use std::process::ExitCode;

use anyhow::bail;

use super::args::{EXIT_DRIFT, TopologyCommand};
use super::common::{connect, load_ladder, management};
use crate::config::Config;
use crate::contract::ladder::QueueType;

pub(super) async fn run(cmd: TopologyCommand, config: &Config) -> anyhow::Result<ExitCode> {
    match cmd {
        TopologyCommand::Export { ladder, vhost } => {
            let ladder = load_ladder(&ladder, config)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&ladder.objects().export(&vhost))?
            );
            Ok(ExitCode::SUCCESS)
        }
        TopologyCommand::Apply(arg) => {
            let ladder = load_ladder(&arg, config)?;
            if ladder.queue_type == QueueType::Quorum {
                check_at_least_once(config).await?;
            }
            let conn = connect(config, "hookrelay topology").await?;
            let channel = conn.create_channel().await?;
            let topology = ladder.objects();
            let applied = topology.apply(&channel).await?;
            let api = management(config)?;
            let policies = topology.apply_policies(&api).await?;
            // Tenants dropped from `dedicated`: their lanes are unbound, not deleted.
            match api.objects().await {
                Ok(objects) => {
                    let retired = ladder.retired_tenants(objects.queues.keys());
                    crate::broker::topology::Topology::retire(&ladder, &channel, &retired).await?;
                    for tenant in &retired {
                        println!(
                            "Tenant {tenant:?} is no longer dedicated: its lanes are unbound (new events \
                             and retries take the shared lanes) and kept until workers have drained them."
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Cannot list queues: lanes of tenants removed from `dedicated` were not unbound")
                }
            }
            let _ = conn.close(200, "done".into()).await;
            println!(
                "Applied ladder {:?} ({} queues): {} exchanges, {} queues, {} bindings, {} policies. Producers publish to {}.",
                ladder.prefix,
                ladder.queue_type.as_str(),
                applied.exchanges,
                applied.queues,
                applied.bindings,
                policies,
                ladder.ingress()
            );
            Ok(ExitCode::SUCCESS)
        }
        TopologyCommand::Plan(arg) => {
            let ladder = load_ladder(&arg, config)?;
            let api = management(config)?;
            let objects = api.objects().await?;
            let topology = ladder.objects();
            let drift = topology.diff(&objects);
            for extra in topology.extras(&ladder, &objects) {
                println!(
                    "not in ladder: {extra} (left alone; delete it once empty if it is an old tier)"
                );
            }
            if drift.is_empty() {
                println!(
                    "No drift: the broker has every object of ladder {:?} with the same arguments.",
                    ladder.prefix
                );
                Ok(ExitCode::SUCCESS)
            } else {
                for d in &drift {
                    println!("{d}");
                }
                println!(
                    "{} difference(s). Missing objects are created by `hookrelay topology apply`; \
                     a queue with different arguments must be deleted (after draining) or the \
                     ladder changed, since RabbitMQ cannot change queue arguments in place.",
                    drift.len()
                );
                Ok(ExitCode::from(EXIT_DRIFT))
            }
        }
    }
}

/// Quorum tiers dead-letter at-least-once only with the `stream_queue` feature flag enabled;
/// without it the broker would silently fall back to at-most-once.
pub(super) async fn check_at_least_once(config: &Config) -> anyhow::Result<()> {
    let api = management(config)?;
    match api.feature_flag("stream_queue").await {
        Ok(Some(state)) if state == "enabled" => Ok(()),
        Ok(Some(state)) => bail!(
            "the broker's stream_queue feature flag is {state}; quorum tiers need it for \
             at-least-once dead-lettering. Enable it with \
             `rabbitmqctl enable_feature_flag stream_queue`, or use queue_type = \"classic\""
        ),
        Ok(None) => bail!(
            "the broker has no stream_queue feature flag (RabbitMQ older than 3.9?); quorum tiers \
             need it for at-least-once dead-lettering. Upgrade, or use queue_type = \"classic\""
        ),
        Err(e) => {
            tracing::warn!(error = %e, "Cannot check the stream_queue feature flag; at-least-once dead-lettering out of the tiers needs it");
            Ok(())
        }
    }
}
