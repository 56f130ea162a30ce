//! The retry ladder as the application owns it: the file in `topology/` (prefix, queue type,
//! tiers, schedule, deferral queues, dedicated tenants), the schedule's arithmetic, and every
//! name the ladder gives a queue or exchange, with the role a queue name stands for. The broker
//! objects it stands for are [`crate::broker::topology`]'s.
//!
//! ```text
//! producer --(key: tenant)--> {p}.ingress --(alternate)--> {p}.ingress.unrouted --> {p}.ready.first
//! worker --(key: retry-10s.<tenant>)--> {p}.delay.retry-10s (fanout) --> {p}.retry-10s (TTL)
//!     --(expired, same key)--> {p}.promote --(alternate)--> {p}.promote.unrouted --> {p}.ready.retry
//! worker --(key: defer-250ms.<tenant>)--> {p}.delay.defer-250ms --> {p}.defer-250ms (TTL)
//!     --(expired)--> {p}.promote, as a tier (a deferral queue: a busy endpoint's delivery waits there)
//! {p}.delay (topic) also routes `<tier>.<tenant>` to each tier, for tools and earlier workers
//! worker --(default exchange)--> {p}.dead
//!
//! with `shards = N` (N > 1), the shared lanes become N of each, keyed by tenant:
//! {p}.ingress.unrouted --> {p}.ingress.shards (consistent hash of the tenant) --> {p}.ready.first-s<i>
//! {p}.promote.unrouted --> {p}.promote.shards (header x-hookrelay-shard = i) --> {p}.ready.retry-s<i>
//!     (no such header, or no such shard: --(alternate)--> {p}.promote.shards.unmatched --> {p}.ready.retry-s0)
//! worker --(key: paused.<subscription>)--> {p}.delay --> {p}.paused.<subscription>
//!     (while the subscription is paused; `subscriptions resume` unbinds and empties it)
//! ```//!
//! - [`names`]: the name of every queue and exchange, and the role a queue's name stands for.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::contract::retention::{Retention, StreamFile, StreamKind};
use crate::units::fmt_duration;

mod names;

pub use names::QueueRole;

/// The most shards a ladder may have: each is two quorum queues (two Raft groups).
pub const MAX_SHARDS: u16 = 64;

/// RabbitMQ's limit for `x-message-ttl` (2^32 - 1 ms, about 49 days).
const MAX_TTL_MS: u128 = u32::MAX as u128;

/// Why a ladder file cannot be used. Fix the file; nothing was declared.
#[derive(Debug, thiserror::Error)]
pub enum LadderError {
    #[error("cannot read ladder file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("ladder file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid ladder: {field}: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> LadderError {
    LadderError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// Quorum queues are replicated and dead-letter at-least-once; classic queues are the fallback
/// for brokers or deployments that cannot run quorum queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    Quorum,
    Classic,
}

impl QueueType {
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Quorum => "quorum",
            QueueType::Classic => "classic",
        }
    }
}

/// The ladder file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LadderFile {
    #[serde(default = "default_prefix")]
    prefix: String,
    #[serde(default = "default_queue_type")]
    queue_type: QueueType,
    tiers: Vec<String>,
    schedule: Vec<String>,
    #[serde(default)]
    dedicated: Vec<DedicatedFile>,
    #[serde(default = "default_shards")]
    shards: u16,
    #[serde(default = "default_deferrals")]
    defer: Vec<String>,
    #[serde(default)]
    archive: StreamFile,
    #[serde(default)]
    attempts: StreamFile,
}

/// The deferral queues of a ladder file without the setting.
pub const DEFAULT_DEFERRALS: [&str; 4] = ["250ms", "500ms", "1s", "5s"];

fn default_deferrals() -> Vec<String> {
    DEFAULT_DEFERRALS.iter().map(|d| (*d).to_owned()).collect()
}

/// One shard keeps the layout of a ladder without the setting: one shared first lane, one
/// shared retry lane, no plugin needed.
fn default_shards() -> u16 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DedicatedFile {
    tenant: String,
    #[serde(default = "default_dedicated_in_flight")]
    in_flight: u16,
}

fn default_dedicated_in_flight() -> u16 {
    100
}

/// A tenant with lanes of its own: its events and retries never queue behind anyone else's,
/// and the worker gives it a budget of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dedicated {
    pub tenant: String,
    /// Deliveries at once from its two lanes (split by `worker.retry_share`).
    pub in_flight: u16,
}

fn default_prefix() -> String {
    "hookrelay".into()
}
fn default_queue_type() -> QueueType {
    QueueType::Quorum
}

/// One delay tier: a TTL queue named after its delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    pub delay: Duration,
    /// `retry-10s`: the queue name after the prefix, and the first word of its routing keys.
    pub name: String,
}

/// A tier or a deferral queue of one ladder: only the ladder hands them out. Retry tiers come
/// first, shortest delay first, then the deferral queues, shortest first: two ids of one kind
/// order as their delays do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TierId(usize);

impl TierId {
    /// The tier's position in [`Ladder::tiers`] (a deferral queue's is past the last tier).
    pub fn index(self) -> usize {
        self.0
    }
}

/// A validated ladder: prefix, queue type, tiers (shortest first) and the retry schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ladder {
    pub prefix: String,
    pub queue_type: QueueType,
    pub tiers: Vec<Tier>,
    /// `schedule[i]` is the tier of the wait before attempt `i + 2`.
    pub schedule: Vec<TierId>,
    /// Tenants with lanes of their own.
    pub dedicated: Vec<Dedicated>,
    /// How many shared first-attempt (and retry) lanes there are, keyed by tenant; 1 is the
    /// unsharded layout.
    pub shards: u16,
    /// Deferral queues, shortest first: TTL queues like the tiers (named `defer-250ms`), where
    /// a delivery waits whose endpoint is up but busy (at its cap, its host's cap, its rate or
    /// its recovery limit). Not part of the schedule; possibly none.
    pub deferrals: Vec<Tier>,
    /// The archive of accepted events (`<prefix>.archive`), unless turned off.
    pub archive: Option<Retention>,
    /// The attempt log's stream (`<prefix>.attempts`), unless turned off.
    pub attempts: Option<Retention>,
}

impl Ladder {
    pub fn load(path: &Path) -> Result<Self, LadderError> {
        let text = std::fs::read_to_string(path).map_err(|source| LadderError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            LadderError::Parse { message, .. } => LadderError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<Self, LadderError> {
        let file: LadderFile = toml::from_str(text).map_err(|e| LadderError::Parse {
            path: PathBuf::from("(inline)"),
            message: e.to_string(),
        })?;
        let mut ladder = Self::build(
            &file.prefix,
            file.queue_type,
            &file.tiers.iter().map(String::as_str).collect::<Vec<_>>(),
            &file.schedule.iter().map(String::as_str).collect::<Vec<_>>(),
        )?
        .with_shards(file.shards)?
        .with_deferrals(&file.defer.iter().map(String::as_str).collect::<Vec<_>>())?;
        for (kind, section) in [
            (StreamKind::Archive, &file.archive),
            (StreamKind::Attempts, &file.attempts),
        ] {
            let retention = section
                .retention(kind)
                .map_err(|(field, message)| invalid(field, message))?;
            ladder = ladder.with_stream(kind, retention);
        }
        for (i, d) in file.dedicated.into_iter().enumerate() {
            ladder = ladder
                .with_dedicated(&d.tenant, d.in_flight)
                .map_err(|e| match e {
                    LadderError::Invalid { message, .. } => {
                        invalid(format!("dedicated[{i}]"), message)
                    }
                    other => other,
                })?;
        }
        Ok(ladder)
    }

    /// Shards the shared lanes `shards` ways (1 to [`MAX_SHARDS`]; 1 is unsharded).
    pub fn with_shards(mut self, shards: u16) -> Result<Self, LadderError> {
        if !(1..=MAX_SHARDS).contains(&shards) {
            return Err(invalid(
                "shards",
                format!("{shards}: expected 1 (unsharded) to {MAX_SHARDS}"),
            ));
        }
        self.shards = shards;
        Ok(self)
    }

    /// Replaces the deferral queues with ones of these delays (`[]`: none; busy endpoints'
    /// deliveries then wait in the shortest tier).
    pub fn with_deferrals(mut self, delays: &[&str]) -> Result<Self, LadderError> {
        self.deferrals = parse_waits("defer", "defer", delays)?;
        Ok(self)
    }

    /// Sets one stream's retention, or turns it off (`None`).
    pub fn with_stream(mut self, kind: StreamKind, retention: Option<Retention>) -> Self {
        match kind {
            StreamKind::Archive => self.archive = retention,
            StreamKind::Attempts => self.attempts = retention,
        }
        self
    }

    /// The ladder's streams that are on, with their retention.
    pub fn streams(&self) -> Vec<(StreamKind, Retention)> {
        [
            (StreamKind::Archive, self.archive),
            (StreamKind::Attempts, self.attempts),
        ]
        .into_iter()
        .filter_map(|(kind, r)| r.map(|r| (kind, r)))
        .collect()
    }

    /// Adds a tenant with lanes of its own.
    pub fn with_dedicated(mut self, tenant: &str, in_flight: u16) -> Result<Self, LadderError> {
        crate::contract::envelope::check_tenant(tenant)
            .map_err(|e| invalid("dedicated", e.to_string()))?;
        if self.dedicated.iter().any(|d| d.tenant == tenant) {
            return Err(invalid(
                "dedicated",
                format!("tenant {tenant:?} is listed twice"),
            ));
        }
        if in_flight < 2 {
            return Err(invalid(
                "dedicated",
                format!("tenant {tenant:?}: in_flight must be at least 2 (one per lane)"),
            ));
        }
        self.dedicated.push(Dedicated {
            tenant: tenant.to_owned(),
            in_flight,
        });
        Ok(self)
    }

    /// Builds and validates a ladder from its parts (durations as written: `10s`, `500ms`).
    pub fn build(
        prefix: &str,
        queue_type: QueueType,
        tiers: &[&str],
        schedule: &[&str],
    ) -> Result<Self, LadderError> {
        if prefix.is_empty()
            || prefix.len() > 64
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(invalid(
                "prefix",
                format!(
                    "{prefix:?}: expected 1 to 64 letters, digits, '_', '-' or '.', as in \"hookrelay\""
                ),
            ));
        }
        if tiers.is_empty() {
            return Err(invalid("tiers", "at least one tier is needed"));
        }
        let parsed = parse_waits("tiers", "retry", tiers)?;
        let mut steps = Vec::with_capacity(schedule.len());
        for (i, raw) in schedule.iter().enumerate() {
            let delay = parse_delay(&format!("schedule[{i}]"), raw)?;
            let Some(index) = parsed.iter().position(|t| t.delay == delay) else {
                return Err(invalid(
                    format!("schedule[{i}]"),
                    format!(
                        "{raw} has no tier; every wait in the schedule must be one of the tiers ({})",
                        parsed
                            .iter()
                            .map(|t| fmt_duration(t.delay))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            };
            steps.push(TierId(index));
        }
        Self {
            prefix: prefix.to_owned(),
            queue_type,
            tiers: parsed,
            schedule: steps,
            dedicated: Vec::new(),
            shards: 1,
            deferrals: Vec::new(),
            archive: Some(Retention::default()),
            attempts: Some(Retention::default()),
        }
        .with_deferrals(&DEFAULT_DEFERRALS)
    }

    /// The number of attempts an envelope gets: the first, then one per schedule entry.
    pub fn max_attempts(&self) -> u32 {
        u32::try_from(self.schedule.len()).unwrap_or(u32::MAX - 1) + 1
    }

    /// The schedule's span: the sum of its waits, from the first attempt to the last.
    pub fn span(&self) -> Duration {
        self.schedule.iter().map(|id| self.tier(*id).delay).sum()
    }

    /// The delivery horizon `configured` (`endpoints.horizon`) gives: itself, or for zero the
    /// schedule's span.
    pub fn horizon(&self, configured: Duration) -> Duration {
        match configured {
            Duration::ZERO => self.span(),
            configured => configured,
        }
    }

    /// The shortest wait of the schedule (of the tiers, for a schedule of no retries): the
    /// longest an endpoint's breaker may stay open before it lets a probe through, so no
    /// envelope's next scheduled retry comes before the probe is due.
    pub fn shortest_wait(&self) -> Duration {
        self.schedule
            .iter()
            .map(|id| self.tier(*id).delay)
            .min()
            .or_else(|| self.tiers.iter().map(|t| t.delay).min())
            .unwrap_or(Duration::ZERO)
    }

    /// The tier to wait in after `attempts_made` attempts, or `None` when the budget is spent.
    pub fn tier_after(&self, attempts_made: u32) -> Option<TierId> {
        let step = usize::try_from(attempts_made).ok()?.checked_sub(1)?;
        self.schedule.get(step).copied()
    }

    /// The smallest tier not shorter than `wait`; the longest tier when none is long enough.
    pub fn tier_not_shorter_than(&self, wait: Duration) -> TierId {
        // A ladder has at least one tier (`build` refuses none).
        TierId(
            self.tiers
                .iter()
                .position(|t| t.delay >= wait)
                .unwrap_or(self.tiers.len().saturating_sub(1)),
        )
    }

    /// Tier (or deferral queue) `id`.
    pub fn tier(&self, id: TierId) -> &Tier {
        self.tiers
            .get(id.0)
            .unwrap_or_else(|| &self.deferrals[id.0 - self.tiers.len()])
    }

    /// Every tier, shortest first, then every deferral queue, shortest first: every TTL queue
    /// that promotes into the retry lanes.
    pub fn tier_ids(&self) -> impl Iterator<Item = TierId> + use<> {
        (0..self.tiers.len() + self.deferrals.len()).map(TierId)
    }

    /// The tier at `index` in [`Ladder::tiers`], if there is one.
    pub fn tier_at(&self, index: usize) -> Option<TierId> {
        (index < self.tiers.len()).then_some(TierId(index))
    }

    /// The deferral queue at `index` in [`Ladder::deferrals`], if there is one.
    pub fn deferral_at(&self, index: usize) -> Option<TierId> {
        (index < self.deferrals.len()).then_some(TierId(self.tiers.len() + index))
    }

    /// Where a delivery waits whose endpoint is busy, after `busy_before` such deferrals in a
    /// row: the shortest deferral queue first, then each next one, then the longest for good,
    /// so a slow endpoint's backlog does not cycle through the broker at the shortest delay.
    /// `None` when the ladder has no deferral queues.
    pub fn deferral_after(&self, busy_before: u32) -> Option<TierId> {
        let last = self.deferrals.len().checked_sub(1)?;
        let step = usize::try_from(busy_before).unwrap_or(usize::MAX).min(last);
        self.deferral_at(step)
    }

    /// The longest deferral queue's delay (zero without deferral queues).
    pub fn longest_deferral(&self) -> Duration {
        self.deferrals.last().map_or(Duration::ZERO, |t| t.delay)
    }

    /// Where a delivery waits whose turn at a busy endpoint comes in `turn_in`: the longest
    /// deferral queue that brings it back by then, the shortest if none does. Back early, it
    /// is booked again; back late, the endpoint's slot may have gone unused. `None` when the
    /// ladder has no deferral queues.
    pub fn deferral_within(&self, turn_in: Duration) -> Option<TierId> {
        let within = self.deferrals.iter().rposition(|t| t.delay <= turn_in);
        self.deferral_at(within.unwrap_or(0))
    }

    /// Whether `id` is a deferral queue rather than a tier of the schedule.
    pub fn is_deferral(&self, id: TierId) -> bool {
        id.0 >= self.tiers.len()
    }

    /// The tier or deferral queue whose name (`retry-1m`, `defer-1s`) or delay (`1m`) is
    /// `name`; a delay names a tier before a deferral queue of the same delay.
    pub fn find_tier(&self, name: &str) -> Option<TierId> {
        let bare = self.local_name(name);
        let all = || self.tier_ids().map(|id| (id, self.tier(id)));
        all()
            .find(|(_, t)| t.name == bare)
            .map(|(id, _)| id)
            .or_else(|| {
                let delay = parse_delay("", bare).ok()?;
                all().find(|(_, t)| t.delay == delay).map(|(id, _)| id)
            })
    }
}

/// Parses the delays of a list of TTL queues (`field`, named `<kind>-<delay>`): each at least
/// 1 ms, within RabbitMQ's TTL limit, listed once; returned shortest first.
fn parse_waits(field: &str, kind: &str, delays: &[&str]) -> Result<Vec<Tier>, LadderError> {
    let mut parsed: Vec<Tier> = Vec::with_capacity(delays.len());
    for (i, raw) in delays.iter().enumerate() {
        let delay = parse_delay(&format!("{field}[{i}]"), raw)?;
        if delay.as_millis() > MAX_TTL_MS {
            return Err(invalid(
                format!("{field}[{i}]"),
                format!("{raw} is longer than RabbitMQ's TTL limit (about 49 days)"),
            ));
        }
        if parsed.iter().any(|t| t.delay == delay) {
            return Err(invalid(
                format!("{field}[{i}]"),
                format!("{raw} is listed twice"),
            ));
        }
        parsed.push(Tier {
            delay,
            name: format!("{kind}-{}", fmt_duration(delay)),
        });
    }
    parsed.sort_by_key(|t| t.delay);
    Ok(parsed)
}

fn parse_delay(field: &str, raw: &str) -> Result<Duration, LadderError> {
    let delay = humantime::parse_duration(raw).map_err(|e| {
        invalid(
            field,
            format!("{raw:?} is not a duration like \"10s\", \"1m\" or \"500ms\": {e}"),
        )
    })?;
    if delay.as_millis() == 0 {
        return Err(invalid(field, format!("{raw:?} must be at least 1ms")));
    }
    Ok(delay)
}
#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const DEFAULT_LADDER: &str = include_str!("../../../topology/ladder.toml");

    #[test]
    fn the_shipped_ladder_is_the_documented_default() {
        let ladder = Ladder::parse(DEFAULT_LADDER).unwrap();
        assert_eq!(ladder.prefix, "hookrelay");
        assert_eq!(ladder.queue_type, QueueType::Quorum);
        let names: Vec<_> = ladder.tiers.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            ["retry-10s", "retry-1m", "retry-10m", "retry-1h", "retry-6h"]
        );
        assert_eq!(ladder.max_attempts(), 10);
        let total: Duration = ladder.schedule.iter().map(|&i| ladder.tier(i).delay).sum();
        assert_eq!(
            total,
            Duration::from_secs(10 + 60 + 600 + 3600 + 5 * 6 * 3600)
        );
    }

    #[test]
    fn schedule_walks_the_tiers_then_stops() {
        let ladder = Ladder::parse(DEFAULT_LADDER).unwrap();
        assert_eq!(ladder.tier_after(0), None);
        assert_eq!(ladder.tier_after(1), Some(TierId(0)));
        assert_eq!(ladder.tier_after(2), Some(TierId(1)));
        assert_eq!(ladder.tier_after(9), Some(TierId(4)));
        assert_eq!(ladder.tier_after(10), None);
        assert_eq!(
            ladder.tier_not_shorter_than(Duration::from_secs(30)),
            TierId(1)
        );
        assert_eq!(
            ladder.tier_not_shorter_than(Duration::from_secs(60)),
            TierId(1)
        );
        assert_eq!(ladder.tier_not_shorter_than(Duration::ZERO), TierId(0));
        assert_eq!(
            ladder.tier_not_shorter_than(Duration::from_secs(86400)),
            TierId(4)
        );
        assert_eq!(ladder.find_tier("retry-1h"), Some(TierId(3)));
        assert_eq!(ladder.find_tier("hookrelay.retry-1h"), Some(TierId(3)));
        assert_eq!(ladder.find_tier("10m"), Some(TierId(2)));
        assert_eq!(ladder.find_tier("2m"), None);
    }

    #[test]
    fn deferral_queues_follow_the_tiers_and_escalate_to_the_longest() {
        let ladder = Ladder::parse(DEFAULT_LADDER).unwrap();
        let names: Vec<_> = ladder.deferrals.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            ["defer-250ms", "defer-500ms", "defer-1s", "defer-5s"]
        );
        // Ids past the tiers: the schedule and the tier arithmetic never see them.
        let first = ladder.deferral_at(0).unwrap();
        assert_eq!(first.index(), ladder.tiers.len());
        assert!(ladder.is_deferral(first) && !ladder.is_deferral(TierId(4)));
        assert_eq!(ladder.tier_ids().count(), 9);
        assert_eq!(
            ladder.tier_not_shorter_than(Duration::ZERO),
            TierId(0),
            "the shortest tier, not a deferral queue"
        );
        assert_eq!(ladder.tier_at(5), None);
        let steps: Vec<_> = [0, 1, 2, 3, 1000]
            .iter()
            .map(|&n| ladder.tier(ladder.deferral_after(n).unwrap()).name.as_str())
            .collect();
        assert_eq!(
            steps,
            [
                "defer-250ms",
                "defer-500ms",
                "defer-1s",
                "defer-5s",
                "defer-5s"
            ]
        );
        // A booked turn: the longest queue back by then, the shortest when none is.
        let within: Vec<_> = [0, 249, 250, 999, 1000, 4999, 5000, 60_000]
            .iter()
            .map(|&ms| {
                let id = ladder.deferral_within(Duration::from_millis(ms)).unwrap();
                ladder.tier(id).name.as_str()
            })
            .collect();
        assert_eq!(
            within,
            [
                "defer-250ms",
                "defer-250ms",
                "defer-250ms",
                "defer-500ms",
                "defer-1s",
                "defer-1s",
                "defer-5s",
                "defer-5s"
            ]
        );
        assert_eq!(ladder.longest_deferral(), Duration::from_secs(5));
        // Found by name, by delay (a tier first), and by the name of their queues.
        assert_eq!(ladder.find_tier("defer-1s"), ladder.deferral_at(2));
        assert_eq!(
            ladder.find_tier("hookrelay.defer-5s"),
            ladder.deferral_at(3)
        );
        assert_eq!(ladder.find_tier("250ms"), ladder.deferral_at(0));
        assert_eq!(ladder.find_tier("10s"), Some(TierId(0)));
        assert_eq!(
            ladder.role_of("hookrelay.defer-250ms"),
            Some(QueueRole::Tier(first))
        );
        assert_eq!(
            ladder.role_of("hookrelay.held.defer-250ms"),
            Some(QueueRole::Parked(first))
        );
        assert_eq!(ladder.tier_queue(first), "hookrelay.defer-250ms");
        assert_eq!(ladder.tier_routing_key(first, "acme"), "defer-250ms.acme");
        // None at all: a busy endpoint's delivery has nowhere but the tiers.
        let none = Ladder::parse("tiers = [\"1s\"]\nschedule = []\ndefer = []\n").unwrap();
        assert_eq!(none.deferral_after(0), None);
        assert_eq!(none.deferral_within(Duration::from_secs(1)), None);
        assert_eq!(none.tier_ids().count(), 1);
        let err = ladder.with_deferrals(&["1s", "1000ms"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid ladder: defer[1]: 1000ms is listed twice"
        );
    }

    #[test]
    fn bad_ladders_are_explained() {
        let err = Ladder::parse("tiers = [\"10s\"]\nschedule = [\"10s\", \"2m\"]\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid ladder: schedule[1]: 2m has no tier; every wait in the schedule must be one of the tiers (10s)"
        );
        let err = Ladder::parse("tiers = [\"soon\"]\nschedule = []\n").unwrap_err();
        assert!(err.to_string().contains("tiers[0]"), "{err}");
        let err = Ladder::parse("prefix = \"a b\"\ntiers = [\"1s\"]\nschedule = []\n").unwrap_err();
        assert!(err.to_string().contains("prefix"), "{err}");
        let err = Ladder::parse("queue_type = \"stream\"\ntiers = [\"1s\"]\nschedule = []\n")
            .unwrap_err();
        assert!(err.to_string().contains("queue_type"), "{err}");
        let err = Ladder::parse("tiers = []\nschedule = []\n").unwrap_err();
        assert!(err.to_string().contains("at least one tier"), "{err}");
        let err = Ladder::parse("tiers = [\"1s\", \"1000ms\"]\nschedule = []\n").unwrap_err();
        assert!(err.to_string().contains("listed twice"), "{err}");
    }

    #[test]
    fn odd_delays_get_compact_names() {
        let ladder = Ladder::build(
            "t",
            QueueType::Classic,
            &["90s", "250ms"],
            &["250ms", "90s"],
        )
        .unwrap();
        assert_eq!(ladder.tiers[0].name, "retry-250ms");
        assert_eq!(ladder.tiers[1].name, "retry-1m30s");
        assert_eq!(ladder.schedule, vec![TierId(0), TierId(1)]);
    }
}
