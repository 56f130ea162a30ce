//! What the broker's release means for hookrelay: the facts read from its management API (its
//! version, its metadata store, deprecated features in use, the consumer timeout it applies to
//! the worker's consumers) and the notes they call for, printed by `topology plan` and `status`
//! and logged once by a worker after it starts consuming. Reading is [`BrokerFacts::read`];
//! deciding is [`notes`], pure.
//!
//! RabbitMQ changes that touch hookrelay (docs/brokers.md has the whole table):
//! - 4.0 gives quorum queues a delivery limit of 20: the ladder's delivery-limit policy lifts
//!   it on the lanes, the sink and the parking queues.
//! - 4.0 lowers `max_message_size` to 16 MiB (from 128 MiB): hookrelay's largest message is
//!   `limits.max_body_bytes` plus its properties.
//! - 4.0 ignores `x-death` from clients; hookrelay never counts on it.
//! - 3.13 and 4.x list the deprecated features in use; 4.3 refuses some by default.
//! - 3.12 and later report the consumer timeout of each consumer, which must exceed the lease.

use std::fmt;
use std::time::Duration;

use super::management::{Management, ManagementError};
use crate::contract::ladder::{Ladder, QueueRole};
use crate::units::fmt_duration;

/// RabbitMQ 4's default `max_message_size`.
pub const MAX_MESSAGE_SIZE_4: usize = 16 * 1024 * 1024;

/// A broker release, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release(pub u32, pub u32, pub u32);

impl Release {
    /// `4.0.5`, `3.10.8`, `4.1.0-rc.1` (the suffix ignored); `None` for anything else.
    pub fn parse(version: &str) -> Option<Self> {
        let core = version.split(['-', '+']).next()?;
        let mut parts = core.split('.').map(str::parse::<u32>);
        let major = parts.next()?.ok()?;
        let minor = parts.next().unwrap_or(Ok(0)).ok()?;
        let patch = parts.next().unwrap_or(Ok(0)).ok()?;
        Some(Self(major, minor, patch))
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// Where the broker keeps its metadata (queues, bindings, policies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataStore {
    Mnesia,
    Khepri,
}

/// What hookrelay reads of a broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerFacts {
    /// As the broker reports it (`4.0.5`).
    pub version: String,
    pub release: Option<Release>,
    /// `None`: the management user may not read the feature flags.
    pub store: Option<MetadataStore>,
    /// The deprecated features in use (`None`: the broker cannot say, before 3.13).
    pub deprecated_used: Option<Vec<String>>,
    /// The consumer timeouts the broker applies to hookrelay's consumers on the ladder's lanes
    /// (empty: none consuming, or a broker before 3.12, which does not report them).
    pub consumer_timeouts: Vec<Duration>,
}

/// What hookrelay needs of the broker, from its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// How long a worker may hold a delivery: the broker's consumer timeout must exceed it.
    pub lease: Duration,
    /// The largest message hookrelay publishes (the largest body and its properties).
    pub largest_message: usize,
}

impl Needs {
    /// What `config` asks of the broker.
    pub fn of(config: &crate::config::Config) -> Self {
        Self {
            lease: config.lease_window(),
            largest_message: config.limits.max_body_bytes + crate::contract::headers::FRAME_MAX,
        }
    }
}

/// One thing an operator should act on about this broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The release is older than any tested: quorum dead-lettering and streams need 3.9.
    TooOld(Release),
    /// RabbitMQ 4's 16 MiB `max_message_size` is below hookrelay's largest message.
    MessageSize { largest: usize, limit: usize },
    /// A consumer timeout shorter than the lease: the broker closes a worker's channel while
    /// an attempt may still be running.
    ConsumerTimeout { broker: Duration, lease: Duration },
    /// Deprecated features in use on the broker (by hookrelay or anything else on it).
    Deprecated(Vec<String>),
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::TooOld(r) => write!(
                f,
                "RabbitMQ {r} is older than hookrelay supports (3.10 and later are tested): quorum \
                 tiers dead-letter at-least-once and streams exist from 3.9 on; upgrade"
            ),
            Note::MessageSize { largest, limit } => write!(
                f,
                "hookrelay may publish messages of up to {largest} bytes (limits.max_body_bytes \
                 and the properties), over RabbitMQ 4's default max_message_size of {limit} bytes: \
                 set max_message_size in rabbitmq.conf to at least {largest}, or lower \
                 limits.max_body_bytes"
            ),
            Note::ConsumerTimeout { broker, lease } => write!(
                f,
                "the broker's consumer_timeout for hookrelay's consumers is {}, shorter than a \
                 delivery's lease of {}: it would close a worker's channel mid-attempt and \
                 deliver again. Raise consumer_timeout in rabbitmq.conf above the lease (and set \
                 broker.consumer_timeout to it), or shorten the http timeouts",
                fmt_duration(*broker),
                fmt_duration(*lease)
            ),
            Note::Deprecated(features) => write!(
                f,
                "the broker reports deprecated features in use: {} (RabbitMQ 4.3 refuses some \
                 by default; hookrelay uses none: see GET /api/deprecated-features/used)",
                features.join(", ")
            ),
        }
    }
}

/// The notes `facts` call for, given what hookrelay `needs`.
pub fn notes(facts: &BrokerFacts, needs: Needs) -> Vec<Note> {
    let mut out = Vec::new();
    if let Some(release) = facts.release {
        if release < Release(3, 9, 0) {
            out.push(Note::TooOld(release));
        }
        if release >= Release(4, 0, 0) && needs.largest_message > MAX_MESSAGE_SIZE_4 {
            out.push(Note::MessageSize {
                largest: needs.largest_message,
                limit: MAX_MESSAGE_SIZE_4,
            });
        }
    }
    if let Some(shortest) = facts.consumer_timeouts.iter().min()
        && *shortest <= needs.lease
    {
        out.push(Note::ConsumerTimeout {
            broker: *shortest,
            lease: needs.lease,
        });
    }
    if let Some(used) = &facts.deprecated_used
        && !used.is_empty()
    {
        out.push(Note::Deprecated(used.clone()));
    }
    out
}

impl BrokerFacts {
    /// Reads the facts through `api`; the consumers whose timeouts count are those of
    /// `ladder`'s lanes. Only the version is needed: what a management user without the
    /// monitoring or administrator tag may not read is left unknown.
    pub async fn read(api: &Management, ladder: &Ladder) -> Result<Self, ManagementError> {
        let version = api.broker_version().await?;
        let store = match api.feature_flag("khepri_db").await {
            Ok(Some(state)) if state == "enabled" => Some(MetadataStore::Khepri),
            Ok(_) => Some(MetadataStore::Mnesia),
            Err(_) => None,
        };
        let deprecated_used = api.deprecated_features_used().await.ok().flatten();
        let consumer_timeouts = api
            .consumers()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|c| {
                matches!(
                    ladder.role_of(&c.queue.name),
                    Some(QueueRole::FirstLane { .. } | QueueRole::RetryLane { .. })
                )
            })
            .filter_map(|c| c.consumer_timeout)
            .map(Duration::from_millis)
            .collect();
        Ok(Self {
            release: Release::parse(&version),
            version,
            store,
            deprecated_used,
            consumer_timeouts,
        })
    }

    /// Logs the broker and each note (a worker does, once it consumes).
    pub fn log(&self, needs: Needs) {
        tracing::info!(broker = %self.summary(), "Broker");
        for note in notes(self, needs) {
            tracing::warn!(broker = %self.summary(), "{note}");
        }
    }

    /// One line: `RabbitMQ 4.0.5, metadata in Khepri`.
    pub fn summary(&self) -> String {
        match self.store {
            Some(MetadataStore::Mnesia) => format!("RabbitMQ {}, metadata in Mnesia", self.version),
            Some(MetadataStore::Khepri) => format!("RabbitMQ {}, metadata in Khepri", self.version),
            None => format!("RabbitMQ {}", self.version),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(version: &str) -> BrokerFacts {
        BrokerFacts {
            version: version.to_owned(),
            release: Release::parse(version),
            store: Some(MetadataStore::Mnesia),
            deprecated_used: Some(Vec::new()),
            consumer_timeouts: Vec::new(),
        }
    }

    const NEEDS: Needs = Needs {
        lease: Duration::from_secs(60),
        largest_message: 256 * 1024 + 131_072,
    };

    #[test]
    fn releases_parse_and_order() {
        assert_eq!(Release::parse("4.0.5"), Some(Release(4, 0, 5)));
        assert_eq!(Release::parse("3.10.8"), Some(Release(3, 10, 8)));
        assert_eq!(Release::parse("4.1.0-rc.1"), Some(Release(4, 1, 0)));
        assert_eq!(Release::parse("4"), Some(Release(4, 0, 0)));
        assert_eq!(Release::parse("unknown"), None);
        assert!(Release(3, 10, 8) < Release(3, 13, 0));
        assert!(Release(3, 13, 7) < Release(4, 0, 0));
    }

    #[test]
    fn a_current_broker_with_the_defaults_needs_no_note() {
        assert_eq!(notes(&facts("3.10.8"), NEEDS), vec![]);
        assert_eq!(notes(&facts("4.0.5"), NEEDS), vec![]);
    }

    #[test]
    fn bodies_over_rabbitmq_4s_message_size_are_named_on_4_only() {
        let needs = Needs {
            largest_message: 20 * 1024 * 1024,
            ..NEEDS
        };
        assert_eq!(notes(&facts("3.13.7"), needs), vec![]);
        let n = notes(&facts("4.0.5"), needs);
        assert_eq!(
            n,
            vec![Note::MessageSize {
                largest: 20 * 1024 * 1024,
                limit: MAX_MESSAGE_SIZE_4
            }]
        );
        assert!(n[0].to_string().contains("max_message_size"));
    }

    #[test]
    fn a_consumer_timeout_within_the_lease_is_a_warning() {
        let mut f = facts("4.0.5");
        f.consumer_timeouts = vec![Duration::from_secs(300), Duration::from_secs(30)];
        let n = notes(&f, NEEDS);
        assert_eq!(
            n,
            vec![Note::ConsumerTimeout {
                broker: Duration::from_secs(30),
                lease: NEEDS.lease
            }]
        );
        assert!(n[0].to_string().contains("30s"), "{}", n[0]);
        f.consumer_timeouts = vec![Duration::from_secs(300)];
        assert_eq!(notes(&f, NEEDS), vec![]);
    }

    #[test]
    fn deprecated_features_in_use_are_named() {
        let mut f = facts("4.0.5");
        f.deprecated_used = Some(vec!["transient_nonexcl_queues".into()]);
        let n = notes(&f, NEEDS);
        assert_eq!(
            n,
            vec![Note::Deprecated(vec!["transient_nonexcl_queues".into()])]
        );
        // A broker that cannot say (before 3.13) is not a note.
        f.deprecated_used = None;
        assert_eq!(notes(&f, NEEDS), vec![]);
    }

    #[test]
    fn a_release_before_3_9_is_too_old() {
        assert_eq!(
            notes(&facts("3.8.35"), NEEDS),
            vec![Note::TooOld(Release(3, 8, 35))]
        );
    }
}
