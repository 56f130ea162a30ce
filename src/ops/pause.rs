//! Resuming a paused subscription: the way back out of its parking queue.
//!
//! Pausing is a line in the subscriptions file (`paused = true`): the worker then parks each of
//! the subscription's deliveries, as it came (id, body, attempt count), in
//! `<prefix>.paused.<subscription>` instead of attempting, cancelling or charging it. Once the
//! file no longer pauses it, [`resume`] returns the parked deliveries where they came from, at a
//! chosen rate, with the mover: a first attempt to the ingress with its tenant as routing key (so
//! to its tenant's lane), a retry through the promote exchange to its tenant's retry lane. Each
//! is republished, confirmed, before it is acked. Then the queue is unbound from the delay
//! exchange (a worker that still parks now has its publish returned and keeps the delivery),
//! what arrived meanwhile is moved, and the queue is removed once empty. (Quorum queues refuse
//! an `if-empty` delete, so nothing may reach the queue when it is deleted.)
//!
//! The decisions ([`check_resumable`], [`return_route`]) are pure, for the API to call too.

use lapin::options::QueueDeleteOptions;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection};

use crate::broker::error::{Refusal, refused};
use crate::broker::publish::Publisher;
use crate::contract::envelope::check_tenant;
use crate::contract::headers::{self, ATTEMPTS_HEADER, DUE_HEADER, ENDPOINT_HEADER, TENANT_HEADER};
use crate::contract::ladder::Ladder;
use crate::ops::mover::{MoveError, MoveOptions, MoveReport, Plan, depth, move_messages};
use crate::ops::progress::Progress;
use crate::subscriptions::Subscriptions;
use crate::units::now_ms;

#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error(
        "subscription {0:?} is still paused in the subscriptions file: what resume returned would \
         park again. Remove `paused = true` (or set it to false), let the workers reload, then \
         resume"
    )]
    StillPaused(String),
    #[error("the broker: {0}")]
    Broker(#[from] lapin::Error),
    #[error(transparent)]
    Move(#[from] MoveError),
}

/// Whether `subscription`'s parked deliveries may be returned now: not while the file in force
/// still pauses it. A subscription no longer in the file may be resumed: its deliveries come
/// back and are cancelled as `deleted`, as anything else waiting for it is.
pub fn check_resumable(
    subscriptions: &Subscriptions,
    subscription: &str,
) -> Result<(), PauseError> {
    match subscriptions.get(subscription) {
        Some(sub) if sub.paused => Err(PauseError::StillPaused(subscription.to_owned())),
        _ => Ok(()),
    }
}

/// Where a parked delivery goes back to. One that hookrelay's accounting headers mark as a
/// retry returns to its tenant's retry lane through the promote exchange (a first-attempt lane
/// would take them for forgeries); a first attempt returns to the ingress, keyed by its tenant.
/// `now_ms` is when: the time it was parked is taken off its horizon
/// ([`headers::returned_properties`]).
pub fn return_route(ladder: &Ladder, properties: &BasicProperties, now_ms: u64) -> Plan {
    let Some(tenant) =
        headers::read_str_header(properties, TENANT_HEADER).filter(|t| check_tenant(t).is_ok())
    else {
        return Plan::Keep("no tenant header".into());
    };
    let retried = headers::read_u64_header(properties, ATTEMPTS_HEADER).is_some_and(|n| n > 0)
        || headers::read_u64_header(properties, DUE_HEADER).is_some()
        || headers::read_str_header(properties, ENDPOINT_HEADER).is_some();
    let (exchange, routing_key) = if retried {
        (ladder.promote_exchange(), ladder.resumed_retry_key(&tenant))
    } else {
        (ladder.ingress(), tenant)
    };
    Plan::Move {
        exchange,
        routing_key,
        properties: headers::returned_properties(properties, now_ms),
    }
}

/// What a resume did.
#[derive(Debug, Clone, Default)]
pub struct Resumed {
    /// Whether there was a parking queue at all.
    pub found: bool,
    pub first_pass: MoveReport,
    /// Parked while the first pass ran (a worker that had not yet reloaded the file).
    pub stragglers: MoveReport,
    /// Whether the parking queue was removed (it was empty).
    pub removed: bool,
}

impl Resumed {
    pub fn moved(&self) -> usize {
        self.first_pass.moved + self.stragglers.moved
    }
    /// Left in the parking queue (no tenant header to route them by); the second pass sees
    /// again what the first kept.
    pub fn kept(&self) -> usize {
        self.stragglers.kept_total()
    }
}

/// Returns `subscription`'s parked deliveries at `options.rate`, then removes its parking queue
/// if it is empty. `subscriptions` is the file in force, checked with [`check_resumable`].
pub async fn resume(
    conn: &Connection,
    publisher: &Publisher,
    ladder: &Ladder,
    subscriptions: &Subscriptions,
    subscription: &str,
    options: &MoveOptions,
    show_progress: bool,
) -> Result<Resumed, PauseError> {
    check_resumable(subscriptions, subscription)?;
    let parking = ladder.paused_queue(subscription);
    // A refusal closes the channel: the look gets one of its own.
    let look = conn.create_channel().await?;
    let parked = match depth(&look, &parking).await {
        Ok(n) => n,
        Err(e) if refused(&e) == Some(Refusal::NotFound) => return Ok(Resumed::default()),
        Err(e) => return Err(e.into()),
    };
    let _ = look.close(200, "looked".into()).await;
    let channel = conn.create_channel().await?;
    let plan = |props: &BasicProperties, _: &[u8]| return_route(ladder, props, now_ms());
    let progress = show_progress.then(|| Progress::new(parked.into(), "moved"));
    let first_pass = move_messages(
        &channel,
        publisher,
        &parking,
        options,
        progress.as_ref(),
        plan,
    )
    .await?;
    channel
        .queue_unbind(
            parking.as_str().into(),
            ladder.delay_exchange().as_str().into(),
            ladder.paused_routing_key(subscription).as_str().into(),
            FieldTable::default(),
        )
        .await?;
    let stragglers = move_messages(&channel, publisher, &parking, options, None, plan).await?;
    let mut resumed = Resumed {
        found: true,
        first_pass,
        stragglers,
        removed: false,
    };
    if depth(&channel, &parking).await? == 0 {
        channel
            .queue_delete(parking.as_str().into(), QueueDeleteOptions::default())
            .await?;
        resumed.removed = true;
    }
    let _ = channel.close(200, "resumed".into()).await;
    Ok(resumed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ladder::QueueType;
    use crate::subscriptions::{SecretRef, Subscription};
    use lapin::types::AMQPValue;

    fn ladder() -> Ladder {
        Ladder::build("p", QueueType::Quorum, &["1s"], &["1s"]).unwrap()
    }

    fn props(pairs: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut headers = FieldTable::default();
        for (k, v) in pairs {
            headers.insert((*k).into(), v.clone());
        }
        BasicProperties::default().with_headers(headers)
    }

    fn tenant() -> (&'static str, AMQPValue) {
        (TENANT_HEADER, AMQPValue::LongString("acme".into()))
    }

    fn route_of(plan: Plan) -> (String, String) {
        match plan {
            Plan::Move {
                exchange,
                routing_key,
                ..
            } => (exchange, routing_key),
            Plan::Keep(why) => panic!("kept: {why}"),
        }
    }

    #[test]
    fn first_attempts_return_to_the_ingress_and_retries_to_the_retry_lanes() {
        let l = ladder();
        assert_eq!(
            route_of(return_route(&l, &props(&[tenant()]), 0)),
            ("p.ingress".into(), "acme".into())
        );
        for accounting in [
            (ATTEMPTS_HEADER, AMQPValue::LongLongInt(2)),
            (DUE_HEADER, AMQPValue::LongLongInt(1)),
            (ENDPOINT_HEADER, AMQPValue::LongString("h#0".into())),
        ] {
            assert_eq!(
                route_of(return_route(&l, &props(&[tenant(), accounting]), 0)),
                ("p.promote".into(), "paused.acme".into())
            );
        }
        assert!(matches!(
            return_route(&l, &props(&[]), 0),
            Plan::Keep(why) if why == "no tenant header"
        ));
    }

    #[test]
    fn the_time_a_delivery_was_parked_is_not_taken_from_its_horizon() {
        let l = ladder();
        let parked = headers::parked_properties(
            &props(&[
                tenant(),
                (ATTEMPTS_HEADER, AMQPValue::LongLongInt(1)),
                (headers::FIRST_TRY_HEADER, AMQPValue::LongLongInt(1_000)),
                (headers::WAITING_SINCE_HEADER, AMQPValue::LongLongInt(4_000)),
            ]),
            "acme",
            5_000,
        );
        // Held for an hour, returned: its first try an hour later, waiting afresh from now.
        let back = match return_route(&l, &parked, 3_605_000) {
            Plan::Move { properties, .. } => properties,
            Plan::Keep(why) => panic!("kept: {why}"),
        };
        let read = |name| headers::read_u64_header(&back, name);
        assert_eq!(read(headers::FIRST_TRY_HEADER), Some(3_601_000));
        assert_eq!(read(headers::WAITING_SINCE_HEADER), Some(3_605_000));
        assert_eq!(read(headers::PARKED_AT_HEADER), None);
        assert_eq!(read(ATTEMPTS_HEADER), Some(1), "its attempts are its own");
    }

    #[test]
    fn resume_waits_for_the_file_to_stop_pausing() {
        let mut sub = Subscription::new(
            "s",
            "acme",
            "https://x.example".parse().unwrap(),
            SecretRef::Env("S".into()),
        );
        sub.paused = true;
        let paused = Subscriptions::from_list([sub.clone()]);
        assert!(matches!(
            check_resumable(&paused, "s"),
            Err(PauseError::StillPaused(_))
        ));
        sub.paused = false;
        assert!(check_resumable(&Subscriptions::from_list([sub]), "s").is_ok());
        assert!(check_resumable(&Subscriptions::default(), "s").is_ok());
    }
}
