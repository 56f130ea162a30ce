//! `topology apply`, `plan` and `export`, and the broker check quorum tiers need first.

use std::process::ExitCode;

use anyhow::bail;

use super::args::{EXIT_DRIFT, TopologyCommand};
use super::common::{connect, load_ladder, management};
use crate::broker::compat::{BrokerFacts, Needs, notes};
use crate::broker::topology::{CONSISTENT_HASH, CONSISTENT_HASH_PLUGIN};
use crate::config::Config;
use crate::contract::ladder::{QueueRole, QueueType};

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
            if ladder.queue_type == QueueType::Quorum || !ladder.streams().is_empty() {
                check_at_least_once(config).await?;
            }
            if ladder.shards > 1 {
                check_consistent_hash(config).await?;
            }
            let conn = connect(config, "hookrelay topology").await?;
            let channel = conn.create_channel().await?;
            let topology = ladder.objects();
            // Policies first: a sharded ladder's leader placement is read when a queue is
            // created. The delivery limit does not mind the order.
            let api = management(config)?;
            let policies = topology.apply_policies(&api).await?;
            let applied = topology.apply(&channel).await?;
            // Lanes the ladder no longer routes to (tenants dropped from `dedicated`, shards
            // of another shard count, the unsharded lanes of a sharded ladder or the other way
            // round) are unbound now that the ladder's own bindings are in place; the queues
            // are kept until workers have drained them.
            match api.objects().await {
                Ok(objects) => {
                    for binding in topology.stale_bindings(&ladder, &objects) {
                        binding.unbind(&channel).await?;
                    }
                    for tenant in ladder.retired_tenants(objects.queues.keys()) {
                        println!(
                            "Tenant {tenant:?} is no longer dedicated: its lanes are unbound (new events \
                             and retries take the shared lanes) and kept until workers have drained them."
                        );
                    }
                    for queue in objects.queues.keys() {
                        let retired_shared = ladder.role_of(queue).is_some_and(|role| {
                            ladder.is_retired_lane(&role)
                                && matches!(
                                    role,
                                    QueueRole::FirstLane { tenant: None, .. }
                                        | QueueRole::RetryLane { tenant: None, .. }
                                )
                        });
                        if retired_shared {
                            println!(
                                "Shared lane {queue} is not one of the ladder's {} shard(s): it is \
                                 unbound and kept until workers have drained it (delete it once empty).",
                                ladder.shards
                            );
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Cannot list queues and bindings: lanes the ladder no longer routes to were not unbound")
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
            let facts = BrokerFacts::read(&api, &ladder).await?;
            println!("Broker: {}.", facts.summary());
            for note in notes(&facts, Needs::of(config)) {
                println!("Warning: {note}");
            }
            let objects = api.objects().await?;
            let topology = ladder.objects();
            let drift = topology.diff(&objects);
            for extra in topology.extras(&ladder, &objects) {
                let what = extra
                    .strip_prefix("queue ")
                    .and_then(|q| ladder.role_of(q))
                    .filter(|role| ladder.is_retired_lane(role));
                if extra.starts_with("binding ") {
                    println!("not in ladder: {extra} (`hookrelay topology apply` unbinds it)");
                } else if what.is_some() {
                    println!(
                        "not in ladder: {extra} (a retired lane: workers drain it; delete it once empty)"
                    );
                } else {
                    println!(
                        "not in ladder: {extra} (left alone; delete it once empty if it is an old tier)"
                    );
                }
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

/// A sharded ladder's first-attempt lanes sit behind a consistent-hash exchange, which only
/// the plugin provides; without it the declaration would fail with a less helpful error.
pub(super) async fn check_consistent_hash(config: &Config) -> anyhow::Result<()> {
    let api = management(config)?;
    match api.exchange_types().await {
        Ok(types) if types.iter().any(|t| t == CONSISTENT_HASH) => Ok(()),
        Ok(_) => bail!(
            "the broker has no {CONSISTENT_HASH} exchange type; a ladder with shards > 1 needs \
             the {CONSISTENT_HASH_PLUGIN} plugin. Enable it with \
             `rabbitmq-plugins enable {CONSISTENT_HASH_PLUGIN}` (and list it in \
             rabbitmq/enabled_plugins), or use shards = 1"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "Cannot list the broker's exchange types; a sharded ladder needs the {CONSISTENT_HASH_PLUGIN} plugin");
            Ok(())
        }
    }
}

/// Quorum tiers dead-letter at-least-once only with the `stream_queue` feature flag enabled;
/// without it the broker would silently fall back to at-most-once. The archive and attempt
/// log are streams, which need it too.
pub(super) async fn check_at_least_once(config: &Config) -> anyhow::Result<()> {
    let api = management(config)?;
    match api.feature_flag("stream_queue").await {
        Ok(Some(state)) if state == "enabled" => Ok(()),
        Ok(Some(state)) => bail!(
            "the broker's stream_queue feature flag is {state}; quorum tiers need it for \
             at-least-once dead-lettering, and the archive and attempt log are streams. Enable \
             it with `rabbitmqctl enable_feature_flag stream_queue`, or use queue_type = \
             \"classic\" with [archive] and [attempts] enabled = false"
        ),
        Ok(None) => bail!(
            "the broker has no stream_queue feature flag (RabbitMQ older than 3.9?); quorum tiers \
             need it for at-least-once dead-lettering, and the archive and attempt log are \
             streams. Upgrade, or use queue_type = \"classic\" with [archive] and [attempts] \
             enabled = false"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "Cannot check the stream_queue feature flag; at-least-once dead-lettering out of the tiers needs it");
            Ok(())
        }
    }
}
