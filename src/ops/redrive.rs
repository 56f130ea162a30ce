//! Dead-letter redrive: moves envelopes from the dead sink back to a ready lane (through the
//! ingress exchange, so a tenant with lanes of its own gets them there), filtered by tenant,
//! subscription, reason and time. A redriven envelope keeps its `message_id` (its idempotency
//! key) and body, starts a fresh attempt budget, and carries `x-hookrelay-redrives`.

use std::str::FromStr;
use std::time::SystemTime;

use lapin::BasicProperties;

use crate::contract::envelope::check_tenant;
use crate::contract::headers;
use crate::contract::headers::{DEAD_AT_HEADER, REASON_HEADER, SUBSCRIPTION_HEADER, TENANT_HEADER};
use crate::contract::ladder::Ladder;
use crate::delivery::route::DeadReason;
use crate::ops::mover::Plan;

/// Why a message is in the dead sink, as `redrive --reason` names it: hookrelay's reason for
/// what it dead-lettered, or the broker's for a message a lane dead-lettered by itself.
///
/// Matched by name against the message's `x-hookrelay-reason` header when it has one, and
/// otherwise against the broker's `x-first-death-reason`. `rejected` is a name in both, so it
/// selects either: a 4xx hookrelay gave up on, or a message a consumer rejected without requeue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkReason {
    Hookrelay(DeadReason),
    Broker(BrokerReason),
}

/// The broker's reasons for dead-lettering out of a lane, besides `rejected` (which
/// [`DeadReason::Rejected`] names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerReason {
    /// The message's own `expiration` passed while it waited.
    Expired,
    /// The queue was over its length limit.
    Maxlen,
    /// A quorum queue's delivery limit was reached.
    DeliveryLimit,
}

impl BrokerReason {
    pub const ALL: [BrokerReason; 3] = [
        BrokerReason::Expired,
        BrokerReason::Maxlen,
        BrokerReason::DeliveryLimit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BrokerReason::Expired => "expired",
            BrokerReason::Maxlen => "maxlen",
            BrokerReason::DeliveryLimit => "delivery_limit",
        }
    }
}

impl SinkReason {
    /// Every reason, hookrelay's first.
    pub fn all() -> impl Iterator<Item = SinkReason> {
        DeadReason::ALL
            .into_iter()
            .map(SinkReason::Hookrelay)
            .chain(BrokerReason::ALL.into_iter().map(SinkReason::Broker))
    }

    /// The name in the header it is matched against.
    pub fn as_str(self) -> &'static str {
        match self {
            SinkReason::Hookrelay(r) => r.as_str(),
            SinkReason::Broker(r) => r.as_str(),
        }
    }
}

impl FromStr for SinkReason {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::all().find(|r| r.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = Self::all().map(Self::as_str).collect();
            format!("no dead reason {s:?}; one of {}", names.join(", "))
        })
    }
}

/// Which dead envelopes to move. Every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub tenant: Option<String>,
    pub subscription: Option<String>,
    /// Matched as [`SinkReason`] says: hookrelay's header first, then the broker's.
    pub reason: Option<SinkReason>,
    /// Dead-lettered at or after.
    pub since: Option<SystemTime>,
    /// Dead-lettered before.
    pub until: Option<SystemTime>,
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The reason a dead message carries: hookrelay's header, or the broker's for a message a lane
/// dead-lettered by itself.
fn reason_of(properties: &BasicProperties) -> Option<String> {
    headers::read_str_header(properties, REASON_HEADER)
        .or_else(|| headers::first_death_reason(properties))
}

impl Filter {
    /// Whether a dead message matches; `Err` names the first criterion it fails.
    pub fn check(&self, properties: &BasicProperties) -> Result<(), &'static str> {
        let header = |name| headers::read_str_header(properties, name);
        if let Some(t) = &self.tenant
            && header(TENANT_HEADER).as_ref() != Some(t)
        {
            return Err("other tenant");
        }
        if let Some(s) = &self.subscription
            && header(SUBSCRIPTION_HEADER).as_ref() != Some(s)
        {
            return Err("other subscription");
        }
        if let Some(r) = self.reason
            && reason_of(properties).as_deref() != Some(r.as_str())
        {
            return Err("other reason");
        }
        if self.since.is_some() || self.until.is_some() {
            let Some(at) = headers::read_u64_header(properties, DEAD_AT_HEADER) else {
                return Err("no dead-letter time");
            };
            if self.since.is_some_and(|s| at < ms(s)) || self.until.is_some_and(|u| at >= ms(u)) {
                return Err("outside the time window");
            }
        }
        Ok(())
    }
}

/// The plan for one dead message: back to the ingress with a fresh budget, or stay (and why).
pub fn plan(ladder: &Ladder, filter: &Filter, properties: &BasicProperties) -> Plan {
    if let Err(why) = filter.check(properties) {
        return Plan::Keep(why.to_owned());
    }
    let Some(tenant) = headers::read_str_header(properties, TENANT_HEADER) else {
        // Invalid before its tenant was known: nothing to route it by.
        return Plan::Keep("no tenant header (not redrivable)".to_owned());
    };
    // An invalid message keeps whatever tenant header its producer sent; only a tenant id is a
    // routing key (and a short string) the ingress can take.
    if check_tenant(&tenant).is_err() {
        return Plan::Keep("tenant header is not a tenant id (not redrivable)".to_owned());
    }
    Plan::Move {
        exchange: ladder.ingress(),
        routing_key: tenant,
        properties: headers::redrive_properties(properties),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::envelope::NewEvent;
    use crate::contract::headers::{DeadLetter, dead_properties};
    use std::time::Duration;

    fn dead(tenant: &str, reason: &str) -> BasicProperties {
        let e = NewEvent {
            id: "evt_1".into(),
            tenant: tenant.into(),
            event_type: "order.paid".into(),
            subscription: Some("sub_a".into()),
            timestamp: None,
            body: b"{}".to_vec(),
        };
        dead_properties(
            &e.properties(),
            &DeadLetter {
                reason,
                error: "HTTP 500",
                status: Some(500),
                attempts_made: 10,
                tenant: Some(tenant),
            },
        )
    }

    #[test]
    fn filters_combine() {
        let p = dead("acme", "exhausted");
        assert_eq!(Filter::default().check(&p), Ok(()));
        let f = Filter {
            tenant: Some("acme".into()),
            reason: Some(SinkReason::Hookrelay(DeadReason::Exhausted)),
            subscription: Some("sub_a".into()),
            ..Filter::default()
        };
        assert_eq!(f.check(&p), Ok(()));
        assert_eq!(
            Filter {
                reason: Some(SinkReason::Hookrelay(DeadReason::Rejected)),
                ..f.clone()
            }
            .check(&p),
            Err("other reason")
        );
        assert_eq!(
            Filter {
                tenant: Some("globex".into()),
                ..f.clone()
            }
            .check(&p),
            Err("other tenant")
        );
        let now = SystemTime::now();
        let window = |since: SystemTime, until: SystemTime| Filter {
            since: Some(since),
            until: Some(until),
            ..Filter::default()
        };
        assert_eq!(
            window(now - Duration::from_secs(60), now + Duration::from_secs(60)).check(&p),
            Ok(())
        );
        assert_eq!(
            window(
                now + Duration::from_secs(60),
                now + Duration::from_secs(120)
            )
            .check(&p),
            Err("outside the time window")
        );
    }

    #[test]
    fn a_redriven_envelope_keeps_its_id_and_starts_over() {
        let ladder = Ladder::parse(include_str!("../../topology/ladder.toml")).unwrap();
        let p = dead("acme", "exhausted");
        let Plan::Move {
            exchange,
            routing_key,
            properties,
        } = plan(&ladder, &Filter::default(), &p)
        else {
            panic!("expected a move");
        };
        assert_eq!(
            (exchange.as_str(), routing_key.as_str()),
            ("hookrelay.ingress", "acme")
        );
        assert_eq!(properties.message_id(), p.message_id());
        let env =
            crate::contract::envelope::Envelope::from_delivery(&properties, "acme", b"{}", 64)
                .unwrap();
        assert_eq!(env.attempts_made, 0);
        assert_eq!(
            headers::read_u64_header(&properties, headers::REDRIVES_HEADER),
            Some(1)
        );
        assert_eq!(headers::read_str_header(&properties, REASON_HEADER), None);
        // Twice redriven, twice counted.
        let again = dead_properties(
            &properties,
            &DeadLetter {
                reason: "exhausted",
                error: "HTTP 500",
                status: None,
                attempts_made: 10,
                tenant: Some("acme"),
            },
        );
        let Plan::Move { properties, .. } = plan(&ladder, &Filter::default(), &again) else {
            panic!("expected a move");
        };
        assert_eq!(
            headers::read_u64_header(&properties, headers::REDRIVES_HEADER),
            Some(2)
        );
    }

    #[test]
    fn a_tenant_header_that_is_not_a_tenant_id_stays_in_the_sink() {
        let ladder = Ladder::parse(include_str!("../../topology/ladder.toml")).unwrap();
        // An invalid message keeps the producer's headers: a tenant header of any length, which
        // a routing key cannot carry over 255 bytes.
        for forged in ["t".repeat(300), "ac.me".to_owned(), String::new()] {
            let mut p = dead("acme", "invalid");
            let mut h = p.headers().clone().unwrap_or_default();
            h.insert(
                TENANT_HEADER.into(),
                lapin::types::AMQPValue::LongString(forged.as_str().into()),
            );
            p = p.with_headers(h);
            match plan(&ladder, &Filter::default(), &p) {
                Plan::Keep(why) => {
                    assert_eq!(why, "tenant header is not a tenant id (not redrivable)")
                }
                Plan::Move { routing_key, .. } => panic!("moved with routing key {routing_key:?}"),
            }
        }
    }

    #[test]
    fn reasons_parse_by_the_names_their_headers_carry() {
        for reason in SinkReason::all() {
            assert_eq!(reason.as_str().parse::<SinkReason>(), Ok(reason));
        }
        assert_eq!(
            "egress_denied".parse(),
            Ok(SinkReason::Hookrelay(DeadReason::EgressDenied))
        );
        assert_eq!(
            "delivery_limit".parse(),
            Ok(SinkReason::Broker(BrokerReason::DeliveryLimit))
        );
        assert_eq!(
            "expird".parse::<SinkReason>(),
            Err(
                "no dead reason \"expird\"; one of rejected, exhausted, invalid, gone, \
                 egress_denied, horizon_expired, schema_invalid, expired, maxlen, delivery_limit"
                    .to_owned()
            )
        );
    }

    /// A message a lane dead-lettered by itself: no hookrelay header, only the broker's.
    fn dead_by_the_broker(reason: &str) -> BasicProperties {
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(
            "x-first-death-reason".into(),
            lapin::types::AMQPValue::LongString(reason.into()),
        );
        BasicProperties::default().with_headers(headers)
    }

    #[test]
    fn hookrelays_reason_is_matched_first_then_the_brokers() {
        let only = |reason| Filter {
            reason: Some(reason),
            ..Filter::default()
        };
        let rejected = only(SinkReason::Hookrelay(DeadReason::Rejected));
        let expired = only(SinkReason::Broker(BrokerReason::Expired));
        // `rejected` selects hookrelay's rejections and the broker's alike.
        assert_eq!(rejected.check(&dead("acme", "rejected")), Ok(()));
        assert_eq!(rejected.check(&dead_by_the_broker("rejected")), Ok(()));
        assert_eq!(expired.check(&dead_by_the_broker("expired")), Ok(()));
        assert_eq!(
            expired.check(&dead_by_the_broker("maxlen")),
            Err("other reason")
        );
        // Where hookrelay wrote its reason, the broker's is not looked at.
        let mut both = dead("acme", "exhausted");
        let mut headers = both.headers().clone().unwrap_or_default();
        headers.insert(
            "x-first-death-reason".into(),
            lapin::types::AMQPValue::LongString("expired".into()),
        );
        both = both.with_headers(headers);
        assert_eq!(expired.check(&both), Err("other reason"));
        assert_eq!(
            only(SinkReason::Hookrelay(DeadReason::Exhausted)).check(&both),
            Ok(())
        );
    }

    #[test]
    fn the_command_line_refuses_an_unknown_reason_and_names_the_valid_ones() {
        use clap::Parser;
        let parse = |reason: &str| {
            crate::cli::Cli::try_parse_from(["hookrelay", "redrive", "--reason", reason])
        };
        assert!(parse("delivery_limit").is_ok());
        let err = parse("timeout").unwrap_err().to_string();
        assert!(
            err.contains("no dead reason \"timeout\"; one of rejected, exhausted, invalid"),
            "{err}"
        );
    }
}
