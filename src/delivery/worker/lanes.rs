//! The lanes a worker consumes: which, with what budgets, and its consumers of them.

use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream};
use lapin::message::Delivery;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tracing::{error, info, warn};

use crate::broker::error::{Refusal, refused};
use crate::broker::management::Management;
use crate::config::Config;
use crate::contract::ladder::Ladder;
use crate::contract::ladder::QueueRole;
use crate::delivery::lane::{Lane, LaneKind, LaneSpec};

use super::*;

/// Budget a retired tenant's lanes get while they drain.
pub(super) const RETIRED_IN_FLIGHT: u16 = 20;

/// The lanes to consume: the shared pair, or each shard's pair, and each dedicated tenant's pair
/// (required), and the lanes the ladder no longer routes to among `listed` (the queues that
/// exist: tenants no longer dedicated, shards of another shard count, the unsharded pair of a
/// sharded ladder or the shards of an unsharded one), so what they hold is delivered. Without a
/// listing, only the required ones.
///
/// The shards' rule: each shard's prefetch is `ceil(2 × budget / N)` of its kind's budget
/// (`worker.in_flight` split by `worker.retry_share`), at most the budget, and every delivery
/// from a shard takes a permit of a worker-wide semaphore of that budget before it is
/// processed. So deliveries processed at once never exceed the budget, a busy shard can use up
/// to twice its even share while others idle, and one shard never holds all of it.
///
/// On a shared lane (or shard) one endpoint's attempts hold at most `endpoints.lane_share` of
/// its prefetch ([`endpoint_most`]): an attempt holds its slot until it ends, so an endpoint
/// that hangs would otherwise leave the tenants behind it only what its cap leaves of the
/// lane. A dedicated tenant's lanes are its own and have no such limit.
pub fn lane_specs(config: &Config, ladder: &Ladder, listed: Option<&[String]>) -> Vec<LaneSpec> {
    let mut specs = Vec::new();
    let share = config.endpoints.lane_share;
    let mut pair =
        |first: String, retry: String, budget: (u16, u16), shared: bool, shard, shares| {
            let (first_prefetch, retry_prefetch) = budget;
            specs.push(LaneSpec {
                kind: LaneKind::First,
                queue: first,
                prefetch: first_prefetch,
                required: true,
                shard,
                shares_budget: shares,
                endpoint_most: shared.then(|| endpoint_most(first_prefetch, share)),
            });
            specs.push(LaneSpec {
                kind: LaneKind::Retry,
                queue: retry,
                prefetch: retry_prefetch,
                required: true,
                shard,
                shares_budget: shares,
                endpoint_most: shared.then(|| endpoint_most(retry_prefetch, share)),
            });
        };
    let (first_budget, retry_budget) = config.worker.split(config.worker.in_flight);
    let sharded = ladder.shards > 1;
    let per_shard = (
        shard_prefetch(first_budget, ladder.shards),
        shard_prefetch(retry_budget, ladder.shards),
    );
    for (first, retry, shard) in ladder.shared_lanes() {
        pair(first, retry, per_shard, true, shard, sharded);
    }
    for d in &ladder.dedicated {
        pair(
            ladder.first_lane_of(&d.tenant),
            ladder.retry_lane_of(&d.tenant),
            config.worker.split(d.in_flight),
            false,
            None,
            false,
        );
    }
    let (retired_first, retired_retry) = config.worker.split(RETIRED_IN_FLIGHT);
    let mut retired: Vec<LaneSpec> = listed
        .unwrap_or_default()
        .iter()
        .filter_map(|queue| {
            let role = ladder.role_of(queue)?;
            if !ladder.is_retired_lane(&role) {
                return None;
            }
            let (kind, prefetch, shard) = match role {
                QueueRole::FirstLane { shard, .. } => (LaneKind::First, retired_first, shard),
                QueueRole::RetryLane { shard, .. } => (LaneKind::Retry, retired_retry, shard),
                _ => return None,
            };
            Some(LaneSpec {
                kind,
                queue: queue.clone(),
                prefetch,
                required: false,
                shard,
                shares_budget: false,
                endpoint_most: None,
            })
        })
        .collect();
    retired.sort_by(|a, b| a.queue.cmp(&b.queue));
    specs.extend(retired);
    specs
}

/// The most attempts one endpoint may have out from a shared lane of `prefetch`: `share` of it,
/// rounded up, at least 1.
pub fn endpoint_most(prefetch: u16, share: f64) -> u32 {
    ((f64::from(prefetch) * share).ceil() as u32).clamp(1, u32::from(prefetch.max(1)))
}

/// A shard's prefetch: `ceil(2 × budget / shards)`, at least 1, at most `budget` (exactly the
/// budget when there is one shard).
pub fn shard_prefetch(budget: u16, shards: u16) -> u16 {
    let shards = u32::from(shards.max(1));
    let share = (2 * u32::from(budget)).div_ceil(shards);
    u16::try_from(share.clamp(1, u32::from(budget.max(1)))).unwrap_or(budget)
}

/// The queues of the worker's vhost, or `None` (logged) when the management API cannot say.
pub(super) async fn list_queues(
    config: &Config,
) -> Option<Vec<crate::broker::management::QueueInfo>> {
    let listed = match Management::new(
        &config.management.url,
        &Management::vhost_of(&config.amqp.url),
    ) {
        Ok(api) => api.queues().await,
        Err(e) => Err(e),
    };
    match listed {
        Ok(queues) => Some(queues),
        Err(e) => {
            warn!(error = %e, "Cannot list queues; lanes of tenants no longer dedicated are drained once the management API answers");
            None
        }
    }
}

/// Why a lane could not be consumed.
#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    /// The queue does not exist (the broker closed only that lane's channel).
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Other(String),
}

/// Why a session's lanes could not all be consumed. [`LaneError::retry_helps`] tells missing
/// topology or a refusal, which an operator must mend, from a broker that may answer next time.
#[derive(Debug, thiserror::Error)]
pub enum LaneError {
    #[error(
        "exchange {0} does not exist (a ladder applied by an earlier version has tiers without \
         exchanges of their own); the topology is missing: run `hookrelay topology apply`"
    )]
    NoExchange(String),
    #[error("checking exchange {name}: {error}")]
    Exchange { name: String, error: lapin::Error },
    #[error("checking the tiers' exchanges: {0}")]
    Tiers(lapin::Error),
    #[error("checking the tiers' exchanges: no answer within {BROKER_ANSWER:?}")]
    TiersSilent,
    #[error("consuming {queue}: {error}")]
    Consume { queue: String, error: ConsumeError },
}

impl LaneError {
    /// Whether trying again, as the worker does with backoff, may succeed with nobody acting:
    /// not for a missing exchange or lane (`hookrelay topology apply`), nor for an exchange
    /// the broker refused to show (the user's permissions).
    pub fn retry_helps(&self) -> bool {
        match self {
            LaneError::NoExchange(_) => false,
            LaneError::Exchange { error, .. } => refused(error).is_none(),
            LaneError::Consume { error, .. } => !matches!(error, ConsumeError::NotFound(_)),
            LaneError::Tiers(_) | LaneError::TiersSilent => true,
        }
    }
}

pub(super) fn lane_missing(spec: &LaneSpec, e: &str) {
    if spec.required {
        error!(lane = %spec.queue, error = %e, "A lane of the ladder is missing; not ready until it exists: run `hookrelay topology apply`");
    } else {
        info!(lane = %spec.queue, "A lane of a tenant no longer dedicated is gone; not consuming it");
    }
}

pub(super) type LaneItem = (Arc<Lane>, Option<lapin::Result<Delivery>>);

/// A session's consumers: each lane's channel and consumer tag, and all their deliveries as one
/// stream (a lane's stream ends with a `None` item, which tells which consumer ended).
#[derive(Default)]
pub(super) struct Consumed {
    pub(super) by_queue: std::collections::BTreeMap<String, (Channel, String, bool)>,
    pub(super) deliveries: stream::SelectAll<BoxStream<'static, LaneItem>>,
    /// Channels of lanes that ended: kept open for the acks of what they delivered.
    pub(super) ended: Vec<(Channel, String)>,
}

impl Consumed {
    pub(super) fn has(&self, queue: &str) -> bool {
        self.by_queue.contains_key(queue)
    }

    pub(super) fn has_all(&self, wanted: &[LaneSpec]) -> bool {
        wanted
            .iter()
            .filter(|s| s.required)
            .all(|s| self.has(&s.queue))
    }

    pub(super) fn queues(&self) -> Vec<&str> {
        self.by_queue.keys().map(String::as_str).collect()
    }

    pub(super) fn channel_open(&self, queue: &str) -> bool {
        self.by_queue
            .get(queue)
            .is_some_and(|(ch, _, _)| ch.status().connected())
    }

    /// Forgets an ended lane; returns whether it was required.
    pub(super) fn remove(&mut self, queue: &str) -> bool {
        match self.by_queue.remove(queue) {
            Some((ch, tag, required)) => {
                self.ended.push((ch, tag));
                required
            }
            None => false,
        }
    }

    /// Every consumer still on, to cancel.
    pub(super) fn consumers(&self) -> impl Iterator<Item = (&Channel, &String)> {
        self.by_queue.values().map(|(ch, tag, _)| (ch, tag))
    }
}

impl Worker {
    /// Opens a channel for `spec` with its prefetch and consumes the lane, within
    /// [`BROKER_ANSWER`].
    pub(super) async fn consume(
        &self,
        conn: &Connection,
        spec: &LaneSpec,
        consumed: &mut Consumed,
    ) -> Result<(), ConsumeError> {
        let lane = self.lanes.lane(spec, &self.dispatcher.settler.metrics);
        let consumer = async {
            let ch = conn.create_channel().await?;
            ch.basic_qos(lane.prefetch, BasicQosOptions::default())
                .await?;
            let consumer = ch
                .basic_consume(
                    lane.queue.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            Ok::<_, lapin::Error>((ch, consumer))
        };
        let (ch, consumer) = match tokio::time::timeout(BROKER_ANSWER, consumer).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return Err(match refused(&e) {
                    Some(Refusal::NotFound) => ConsumeError::NotFound(format!(
                        "{e}; the topology is missing: run `hookrelay topology apply`"
                    )),
                    _ => ConsumeError::Other(e.to_string()),
                });
            }
            Err(_) => {
                return Err(ConsumeError::Other(format!(
                    "no answer within {BROKER_ANSWER:?}"
                )));
            }
        };
        let tag = consumer.tag().to_string();
        consumed
            .by_queue
            .insert(spec.queue.clone(), (ch, tag, spec.required));
        consumed.deliveries.push(
            consumer
                .map(Some)
                .chain(stream::once(async { None }))
                .map(move |d| (Arc::clone(&lane), d))
                .boxed(),
        );
        Ok(())
    }

    /// Consumes every lane of `wanted`. A lane that is not there is skipped (logged), but in the
    /// very `first` session a missing lane of the ladder fails it, with the reason.
    pub(super) async fn open_lanes(
        &self,
        conn: &Connection,
        wanted: &[LaneSpec],
        first: bool,
        consumed: &mut Consumed,
    ) -> Result<(), LaneError> {
        if first {
            self.tier_exchanges_exist(conn).await?;
        }
        for spec in wanted {
            match self.consume(conn, spec, consumed).await {
                Ok(()) => {}
                // A lane that is not there: a retired one was deleted, which is the operator's
                // right; a required one is missing topology. Neither ends the session, except
                // the very first, which fails the start with the reason.
                Err(ConsumeError::NotFound(e)) if !(spec.required && first) => {
                    lane_missing(spec, &e);
                }
                Err(error) => {
                    return Err(LaneError::Consume {
                        queue: spec.queue.clone(),
                        error,
                    });
                }
            }
        }
        Ok(())
    }

    /// Every tier's exchange is there, so retries have somewhere to go: a ladder applied by an
    /// earlier version has the tiers without them, and the worker says so before consuming.
    async fn tier_exchanges_exist(&self, conn: &Connection) -> Result<(), LaneError> {
        let ladder = &self.dispatcher.ladder;
        let checked = async {
            // A passive declare of a missing exchange closes its channel: one of its own.
            let ch = conn.create_channel().await?;
            for tier in ladder.tier_ids() {
                let name = ladder.tier_exchange(tier);
                let passive = lapin::options::ExchangeDeclareOptions {
                    passive: true,
                    durable: true,
                    ..Default::default()
                };
                if let Err(e) = ch
                    .exchange_declare(
                        name.as_str().into(),
                        lapin::ExchangeKind::Fanout,
                        passive,
                        FieldTable::default(),
                    )
                    .await
                {
                    return Ok(Err((name, e)));
                }
            }
            let _ = ch.close(200, "checked".into()).await;
            Ok::<_, lapin::Error>(Ok(()))
        };
        match tokio::time::timeout(BROKER_ANSWER, checked).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err((name, error)))) => Err(match refused(&error) {
                Some(Refusal::NotFound) => LaneError::NoExchange(name),
                _ => LaneError::Exchange { name, error },
            }),
            Ok(Err(e)) => Err(LaneError::Tiers(e)),
            Err(_) => Err(LaneError::TiersSilent),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ladders_lanes_are_required_and_retired_ones_are_consumed_while_listed() {
        let config = Config::default();
        let ladder = Ladder::parse(include_str!("../../../topology/ladder.toml"))
            .unwrap()
            .with_dedicated("bigco", 100)
            .unwrap();
        let names = |specs: &[LaneSpec], required: bool| -> Vec<String> {
            specs
                .iter()
                .filter(|s| s.required == required)
                .map(|s| s.queue.clone())
                .collect()
        };
        let ours = [
            "hookrelay.ready.first",
            "hookrelay.ready.retry",
            "hookrelay.ready.first.bigco",
            "hookrelay.ready.retry.bigco",
        ];
        // Without a listing: the ladder's lanes only.
        let unlisted = lane_specs(&config, &ladder, None);
        assert_eq!(names(&unlisted, true), ours);
        assert!(names(&unlisted, false).is_empty());
        // Listed: a retired tenant's lanes, each on its own (one may be deleted already);
        // never a dedicated tenant's twice, never a tier or another ladder's queue.
        let listed: Vec<String> = [
            "hookrelay.ready.first.oldco",
            "hookrelay.ready.retry.gone",
            "hookrelay.ready.first.bigco",
            "hookrelay.retry-10s",
            "other.ready.first.oldco",
        ]
        .map(String::from)
        .to_vec();
        let specs = lane_specs(&config, &ladder, Some(&listed));
        assert_eq!(names(&specs, true), ours);
        assert_eq!(
            names(&specs, false),
            ["hookrelay.ready.first.oldco", "hookrelay.ready.retry.gone"]
        );
        let retired: Vec<_> = specs.iter().filter(|s| !s.required).collect();
        assert_eq!(retired[0].kind, LaneKind::First);
        assert_eq!(retired[1].kind, LaneKind::Retry);
        let (first, retry) = config.worker.split(RETIRED_IN_FLIGHT);
        assert_eq!((retired[0].prefetch, retired[1].prefetch), (first, retry));
        // An endpoint holds at most a quarter (the default share) of a shared lane; a dedicated
        // tenant's lanes are its own.
        let most: Vec<_> = specs.iter().map(|s| s.endpoint_most).collect();
        assert_eq!(most, [Some(53), Some(23), None, None, None, None]);
    }

    #[test]
    fn shards_share_the_budget_and_the_unsharded_lanes_are_drained_once_listed() {
        let config = Config::default(); // in_flight 300: 210 first, 90 retry
        let ladder = Ladder::parse(include_str!("../../../topology/ladder.toml"))
            .unwrap()
            .with_shards(4)
            .unwrap();
        let listed: Vec<String> = [
            "hookrelay.ready.first",
            "hookrelay.ready.retry",
            "hookrelay.ready.first-s1",
            "hookrelay.ready.first-s7",
        ]
        .map(String::from)
        .to_vec();
        let specs = lane_specs(&config, &ladder, Some(&listed));
        let shards: Vec<_> = specs.iter().filter(|s| s.required).collect();
        assert_eq!(shards.len(), 8);
        for s in &shards {
            assert!(s.shares_budget && s.shard.is_some(), "{s:?}");
            let want = match s.kind {
                LaneKind::First => 105, // ceil(2 × 210 / 4)
                LaneKind::Retry => 45,  // ceil(2 × 90 / 4)
            };
            assert_eq!(s.prefetch, want, "{s:?}");
            // A quarter of the shard, rounded up: what one endpoint's attempts may hold of it.
            assert_eq!(s.endpoint_most, Some(u32::from(want).div_ceil(4)), "{s:?}");
        }
        let retired: Vec<_> = specs
            .iter()
            .filter(|s| !s.required)
            .map(|s| (s.queue.as_str(), s.shard, s.shares_budget))
            .collect();
        assert_eq!(
            retired,
            [
                ("hookrelay.ready.first", None, false),
                ("hookrelay.ready.first-s7", Some(7), false),
                ("hookrelay.ready.retry", None, false),
            ]
        );
        assert_eq!(shard_prefetch(210, 1), 210, "one shard: the whole budget");
        assert_eq!(shard_prefetch(8, 4), 4);
        assert_eq!(shard_prefetch(3, 64), 1);
        assert_eq!(shard_prefetch(5, 2), 5, "never more than the budget");
        assert_eq!(endpoint_most(105, 0.25), 27);
        assert_eq!(endpoint_most(3, 0.01), 1, "at least one");
        assert_eq!(endpoint_most(210, 1.0), 210, "1: the whole lane");
    }

    #[test]
    fn missing_topology_waits_for_an_operator_and_a_silent_broker_does_not() {
        let missing = LaneError::NoExchange("hookrelay.retry-10s".into());
        assert!(!missing.retry_helps(), "{missing}");
        assert!(
            missing
                .to_string()
                .starts_with("exchange hookrelay.retry-10s does not exist"),
            "{missing}"
        );
        let lane = |error| LaneError::Consume {
            queue: "hookrelay.ready.first".into(),
            error,
        };
        assert!(!lane(ConsumeError::NotFound("NOT_FOUND".into())).retry_helps());
        let silent = lane(ConsumeError::Other("no answer within 30s".into()));
        assert!(silent.retry_helps(), "{silent}");
        assert_eq!(
            silent.to_string(),
            "consuming hookrelay.ready.first: no answer within 30s"
        );
        assert!(LaneError::TiersSilent.retry_helps());
        // A session says what its lanes say; its own failures are the broker's, which may recover.
        let session = SessionError::from(missing);
        assert!(!session.retry_helps());
        let shown = session.to_string();
        let failed = WorkerError::Consume(session);
        assert_eq!(
            failed.to_string(),
            format!("cannot consume from the broker: {shown}")
        );
        // Whole: an error chain (`{:#}`) does not say the cause twice.
        assert!(std::error::Error::source(&failed).is_none());
        assert!(SessionError::ChannelEnded("hookrelay.ready.first".into()).retry_helps());
    }
}
