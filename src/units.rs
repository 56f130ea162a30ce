//! Durations, rates, clocks and truncation: small helpers any module may use. A leaf: it uses nothing
//! else of hookrelay's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Formats a duration the way config files write it (`10s`, `1m30s`, `500ms`).
pub fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string().replace(' ', "")
}

/// A pace such as `50/s` or `600/m`; a bare number is per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    per_second: f64,
}

impl Rate {
    pub fn interval(self) -> Duration {
        Duration::from_secs_f64(1.0 / self.per_second)
    }
}

impl std::str::FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (n, unit) = s.split_once('/').unwrap_or((s, "s"));
        let n: f64 = n
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a rate like \"50/s\" or \"600/m\""))?;
        let seconds = match unit.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            other => return Err(format!("unknown unit {other:?} in {s:?}; use /s, /m or /h")),
        };
        if !(n > 0.0 && n.is_finite()) {
            return Err(format!("{s:?}: the rate must be above zero"));
        }
        Ok(Self {
            per_second: n / seconds,
        })
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

/// A time given as RFC 3339 (`2026-12-01T10:00:00Z`) or as a duration ago (`2h`).
pub fn parse_when(s: &str) -> Result<SystemTime, String> {
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return Ok(t);
    }
    let ago = humantime::parse_duration(s).map_err(|_| {
        format!("{s:?} is neither a time like 2026-12-01T10:00:00Z nor a duration like 2h")
    })?;
    SystemTime::now()
        .checked_sub(ago)
        .ok_or_else(|| format!("{s:?} ago is before the epoch"))
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
        assert!("5/d".parse::<Rate>().unwrap_err().contains("unknown unit"));
        // Written back as it is read.
        let r: Rate = "600/m".parse().unwrap();
        assert_eq!(r.to_string(), "10/s");
        assert_eq!(r.to_string().parse::<Rate>().unwrap(), r);
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
