//! Durations, rates, clocks and truncation: small helpers any module may use. A leaf: it uses nothing
//! else of hookrelay's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Formats a duration the way config files write it (`10s`, `1m30s`, `500ms`).
pub fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string().replace(' ', "")
}

/// A pace such as `50/s` or `600/m`; a bare number is per second. Always between
/// [`Rate::MIN_PER_SECOND`] and [`Rate::MAX_PER_SECOND`], so every rate makes a pace: a rate of
/// `1e-300/s` once made an interval no `Duration` holds, and `1e308/s` one of zero, and either
/// panicked whatever was pacing by it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    per_second: f64,
}

impl Rate {
    /// One per 277 hours and a bit (an interval of 1,000,000 s).
    pub const MIN_PER_SECOND: f64 = 1e-6;
    /// An interval of 1 µs.
    pub const MAX_PER_SECOND: f64 = 1e6;
    const BOUNDS: &str = "between one per 277 hours (0.000001/s) and 1000000/s";

    /// A rate this code writes as a default, brought within the bounds.
    pub fn shipped(per_second: f64) -> Self {
        Self {
            per_second: per_second.clamp(Self::MIN_PER_SECOND, Self::MAX_PER_SECOND),
        }
    }

    /// The time between two events: from 1 µs to 1,000,000 s, by the bounds.
    pub fn interval(self) -> Duration {
        Duration::from_secs_f64(1.0 / self.per_second)
    }
}

/// Why a rate was refused: each says what to correct in the text given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    #[error("{0:?} is not a rate like \"50/s\" or \"600/m\"")]
    NotANumber(String),
    #[error("unknown unit {unit:?} in {rate:?}; use /s, /m or /h")]
    UnknownUnit { unit: String, rate: String },
    #[error("{0:?}: the rate must be {bounds}", bounds = Rate::BOUNDS)]
    OutOfBounds(String),
}

impl std::str::FromStr for Rate {
    type Err = RateError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (n, unit) = s.split_once('/').unwrap_or((s, "s"));
        let n: f64 = n
            .trim()
            .parse()
            .map_err(|_| RateError::NotANumber(s.to_owned()))?;
        let seconds = match unit.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            other => {
                return Err(RateError::UnknownUnit {
                    unit: other.to_owned(),
                    rate: s.to_owned(),
                });
            }
        };
        let per_second = n / seconds;
        // NaN fails both comparisons, and so is refused with the rest.
        if !(Self::MIN_PER_SECOND..=Self::MAX_PER_SECOND).contains(&per_second) {
            return Err(RateError::OutOfBounds(s.to_owned()));
        }
        Ok(Self { per_second })
    }
}

/// A parsed rate is finite and above zero, never NaN, so equality is total.
impl Eq for Rate {}

impl Rate {
    /// Events per second.
    pub fn per_second(self) -> f64 {
        self.per_second
    }
}

/// As the files write it: `50/s`, or a fraction per second for slower rates (`0.5/s`).
impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/s", self.per_second)
    }
}

impl serde::Serialize for Rate {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// What time it is for the decisions that read a clock (endpoint admission, the breaker, the
/// ramp): the system's, or one that stands still until a simulation moves it, so the same code
/// runs in a deterministic simulation of hours in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct Clock(Option<std::sync::Arc<SetClock>>);

/// A clock's time as a simulation sets it: an offset from when it was made.
#[derive(Debug)]
pub struct SetClock {
    base: std::time::Instant,
    base_ms: u64,
    elapsed_ms: std::sync::atomic::AtomicU64,
}

impl Clock {
    /// The system's clock.
    pub fn system() -> Self {
        Self(None)
    }

    /// A clock at `base_ms` (ms since the epoch) that moves only when told to.
    pub fn set(base_ms: u64) -> (Self, std::sync::Arc<SetClock>) {
        let set = std::sync::Arc::new(SetClock {
            base: std::time::Instant::now(),
            base_ms,
            elapsed_ms: std::sync::atomic::AtomicU64::new(0),
        });
        (Self(Some(std::sync::Arc::clone(&set))), set)
    }

    pub fn now(&self) -> std::time::Instant {
        match &self.0 {
            None => std::time::Instant::now(),
            Some(set) => set.base + set.elapsed(),
        }
    }

    /// Milliseconds since the epoch.
    pub fn now_ms(&self) -> u64 {
        match &self.0 {
            None => now_ms(),
            Some(set) => set.base_ms + set.elapsed().as_millis() as u64,
        }
    }
}

impl SetClock {
    /// Moves the clock to `elapsed` after it was made (never back).
    pub fn advance_to(&self, elapsed: Duration) {
        let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        self.elapsed_ms
            .fetch_max(ms, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn elapsed(&self) -> Duration {
        Duration::from_millis(self.elapsed_ms.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Now, as the records write it.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// An error with every cause under it, `outer: inner: innermost` (a client library's outer
/// message alone, "error sending request", does not say what went wrong).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let said = inner.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = inner.source();
    }
    text
}

/// At most `max` bytes of `text`, cut back to a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` as it is when at most `max` bytes long; otherwise cut to `max` bytes, with its full
/// length, for showing a refused value without repeating all of it.
pub fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    format!("{}... ({} bytes)", cut(text, max), text.len())
}

/// Why a time was refused: the text given is to be corrected, both say which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhenError {
    #[error("{0:?} is neither a time like 2026-12-01T10:00:00Z nor a duration like 2h")]
    Unreadable(String),
    #[error("{0:?} ago is before 1970")]
    BeforeEpoch(String),
}

/// A time given as RFC 3339 (`2026-12-01T10:00:00Z`) or as a duration ago (`2h`).
pub fn parse_when(s: &str) -> Result<SystemTime, WhenError> {
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return Ok(t);
    }
    let ago = humantime::parse_duration(s).map_err(|_| WhenError::Unreadable(s.to_owned()))?;
    SystemTime::now()
        .checked_sub(ago)
        .filter(|t| *t >= UNIX_EPOCH)
        .ok_or_else(|| WhenError::BeforeEpoch(s.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_config_files_write_them() {
        assert_eq!(fmt_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(fmt_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(fmt_duration(Duration::from_secs(2 * 3600)), "2h");
        assert_eq!(
            humantime::parse_duration(&fmt_duration(Duration::from_millis(61_250))).unwrap(),
            Duration::from_millis(61_250)
        );
    }

    #[test]
    fn clocks_read_now() {
        let before = now_ms();
        assert!(before > 1_700_000_000_000, "{before}");
        let at = now_rfc3339();
        assert!(
            at.ends_with('Z') && at.len() == "2026-01-01T00:00:00.000Z".len(),
            "{at}"
        );
        assert!(humantime::parse_rfc3339(&at).is_ok(), "{at}");
        assert!(now_ms() >= before);
    }

    #[test]
    fn rates_parse_with_units() {
        assert_eq!(
            "50/s".parse::<Rate>().unwrap().interval(),
            Duration::from_millis(20)
        );
        assert_eq!(
            "600/m".parse::<Rate>().unwrap().interval(),
            Duration::from_millis(100)
        );
        assert_eq!(
            "4".parse::<Rate>().unwrap().interval(),
            Duration::from_millis(250)
        );
        assert!("0/s".parse::<Rate>().is_err());
        assert!("fast".parse::<Rate>().is_err());
        assert_eq!(
            "5/d".parse::<Rate>().unwrap_err().to_string(),
            "unknown unit \"d\" in \"5/d\"; use /s, /m or /h"
        );
        // Written back as it is read.
        let r: Rate = "600/m".parse().unwrap();
        assert_eq!(r.to_string(), "10/s");
        assert_eq!(r.to_string().parse::<Rate>().unwrap(), r);
    }

    #[test]
    fn rates_are_bounded_and_their_interval_never_panics() {
        for bad in [
            "1e-300/s",
            "1e308/s",
            "0.0000001/s",
            "1000001/s",
            "1e400/s",
            "NaN/s",
        ] {
            let e = bad.parse::<Rate>().unwrap_err();
            assert_eq!(e, RateError::OutOfBounds(bad.to_owned()));
            assert!(e.to_string().contains("between"), "{bad}: {e}");
        }
        for edge in ["0.000001/s", "1000000/s", "0.0036/h", "60000000/m"] {
            let r: Rate = edge.parse().unwrap_or_else(|e| panic!("{edge}: {e}"));
            // A pace tokio's interval takes: above zero, far from overflowing an instant.
            let i = r.interval();
            assert!(
                i > Duration::ZERO && i <= Duration::from_secs(1_000_000),
                "{edge}: {i:?}"
            );
            assert_eq!(r.to_string().parse::<Rate>().unwrap(), r, "{edge}");
        }
    }

    #[test]
    fn a_time_before_the_epoch_is_refused() {
        assert!(parse_when("1h").is_ok());
        assert!(parse_when("2026-12-01T10:00:00Z").is_ok());
        let e = parse_when("100y").unwrap_err();
        assert_eq!(e, WhenError::BeforeEpoch("100y".into()));
        assert!(e.to_string().contains("before 1970"), "{e}");
        assert!(parse_when("1960-01-01T00:00:00Z").is_err());
    }

    #[test]
    fn cutting_never_splits_a_character() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("abcdef", 3), "abc");
        // "é" is two bytes: a cut in its middle backs off to before it.
        assert_eq!(cut("aé", 2), "a");
        assert_eq!(cut("ééé", 5), "éé");
        assert_eq!(cut("€", 0), "");
    }

    #[test]
    fn shortening_says_how_long_the_whole_was() {
        assert_eq!(shorten("evt_1", 80), "evt_1");
        assert_eq!(
            shorten(&"x".repeat(81), 80),
            format!("{}... (81 bytes)", "x".repeat(80))
        );
        assert_eq!(shorten("aéb", 2), "a... (4 bytes)");
    }
}
