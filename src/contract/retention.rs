//! The ladder's two streams, the archive of accepted events and the attempt log, and how long
//! the broker keeps what they hold: `[archive]` and `[attempts]` in the ladder file.

use std::time::Duration;

use serde::Deserialize;

use crate::units::fmt_duration;

/// Which of the ladder's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// `<prefix>.archive`: every event the ingress accepted.
    Archive,
    /// `<prefix>.attempts`: a record per settled delivery.
    Attempts,
}

impl StreamKind {
    /// The stream's name after the prefix, and its section in the ladder file.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::Archive => "archive",
            StreamKind::Attempts => "attempts",
        }
    }
}

/// The broker's retention of one stream. Streams drop whole segments, oldest first, once a
/// segment is entirely older than `max_age` or the stream is over `max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_age: Duration,
    pub max_bytes: u64,
}

/// Seven days: long enough to replay a weekend's outage on Monday.
const DEFAULT_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// 5 GB each: bounded so that a busy system cannot fill the broker's disk with history.
const DEFAULT_MAX_BYTES: u64 = 5_000_000_000;
/// RabbitMQ's own segment size, the largest a stream's segments get here.
const MAX_SEGMENT_BYTES: u64 = 500_000_000;
/// Below this a segment costs more in files than it saves in granularity.
const MIN_SEGMENT_BYTES: u64 = 1_000_000;
/// The smallest `max_bytes` accepted: a few of the smallest segments.
const MIN_MAX_BYTES: u64 = 10_000_000;

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_age: DEFAULT_MAX_AGE,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

impl Retention {
    /// `max-age` as the broker writes it: a whole number of the largest unit that divides it
    /// (`7D`, `36h`, `90m`, `45s`).
    pub fn max_age_arg(&self) -> String {
        let s = self.max_age.as_secs().max(1);
        for (unit, size) in [("D", 86_400), ("h", 3_600), ("m", 60)] {
            if s.is_multiple_of(size) {
                return format!("{}{unit}", s / size);
            }
        }
        format!("{s}s")
    }

    /// The segment size: a tenth of `max_bytes` (the broker drops whole segments, so a stream
    /// holds between 90% and 100% of `max_bytes` once full), within 1 MB and RabbitMQ's 500 MB.
    pub fn segment_bytes(&self) -> u64 {
        (self.max_bytes / 10).clamp(MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES)
    }

    /// As the ladder file would write it.
    pub fn describe(&self) -> String {
        format!(
            "max_age {}, max_bytes {}",
            fmt_duration(self.max_age),
            bytesize::ByteSize::b(self.max_bytes).display().si()
        )
    }
}

/// `[archive]` or `[attempts]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamFile {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    max_age: Option<String>,
    #[serde(default)]
    max_bytes: Option<BytesFile>,
}

/// A size written as a number of bytes or with a unit (`"5GB"`, `"512MiB"`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum BytesFile {
    Number(u64),
    Text(String),
}

impl StreamFile {
    /// The stream's retention, or `None` when the section turns it off. The error names the
    /// field at fault.
    pub(crate) fn retention(
        &self,
        kind: StreamKind,
    ) -> Result<Option<Retention>, (String, String)> {
        let section = kind.as_str();
        if self.enabled == Some(false) {
            return Ok(None);
        }
        let mut retention = Retention::default();
        if let Some(raw) = &self.max_age {
            let field = format!("{section}.max_age");
            let age = humantime::parse_duration(raw).map_err(|e| {
                (
                    field.clone(),
                    format!("{raw:?} is not a duration like \"7d\" or \"36h\": {e}"),
                )
            })?;
            if age < Duration::from_secs(1) {
                return Err((field, format!("{raw:?} must be at least 1s")));
            }
            retention.max_age = age;
        }
        if let Some(raw) = &self.max_bytes {
            let field = format!("{section}.max_bytes");
            let bytes = match raw {
                BytesFile::Number(n) => *n,
                BytesFile::Text(text) => text
                    .parse::<bytesize::ByteSize>()
                    .map_err(|e| {
                        (
                            field.clone(),
                            format!("{text:?} is not a size like \"5GB\" or \"512MiB\": {e}"),
                        )
                    })?
                    .as_u64(),
            };
            if bytes < MIN_MAX_BYTES {
                return Err((
                    field,
                    format!("{bytes} bytes is too small; at least 10MB (10000000)"),
                ));
            }
            retention.max_bytes = bytes;
        }
        Ok(Some(retention))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Option<Retention>, (String, String)> {
        let file: StreamFile = toml::from_str(text).unwrap();
        file.retention(StreamKind::Archive)
    }

    #[test]
    fn a_missing_section_keeps_the_defaults_and_enabled_false_turns_it_off() {
        assert_eq!(parse("").unwrap(), Some(Retention::default()));
        assert_eq!(parse("enabled = false").unwrap(), None);
        let r = parse("max_age = \"36h\"\nmax_bytes = \"512MiB\"")
            .unwrap()
            .unwrap();
        assert_eq!(r.max_age, Duration::from_secs(36 * 3600));
        assert_eq!(r.max_bytes, 512 * 1024 * 1024);
        assert_eq!(
            parse("max_bytes = 20000000").unwrap().unwrap().max_bytes,
            20_000_000
        );
    }

    #[test]
    fn bad_values_name_their_field() {
        assert_eq!(
            parse("max_age = \"soon\"").unwrap_err().0,
            "archive.max_age"
        );
        assert_eq!(
            parse("max_age = \"10ms\"").unwrap_err().0,
            "archive.max_age"
        );
        assert_eq!(
            parse("max_bytes = \"lots\"").unwrap_err().0,
            "archive.max_bytes"
        );
        assert_eq!(
            parse("max_bytes = 1000").unwrap_err().0,
            "archive.max_bytes"
        );
    }

    #[test]
    fn max_age_is_written_in_the_largest_whole_unit() {
        let age = |s| Retention {
            max_age: Duration::from_secs(s),
            max_bytes: DEFAULT_MAX_BYTES,
        };
        assert_eq!(age(7 * 86_400).max_age_arg(), "7D");
        assert_eq!(age(36 * 3600).max_age_arg(), "36h");
        assert_eq!(age(90 * 60).max_age_arg(), "90m");
        assert_eq!(age(45).max_age_arg(), "45s");
    }

    #[test]
    fn segments_are_a_tenth_of_the_size_within_bounds() {
        let size = |b| Retention {
            max_age: DEFAULT_MAX_AGE,
            max_bytes: b,
        };
        assert_eq!(size(DEFAULT_MAX_BYTES).segment_bytes(), MAX_SEGMENT_BYTES);
        assert_eq!(size(100_000_000).segment_bytes(), 10_000_000);
        assert_eq!(size(MIN_MAX_BYTES).segment_bytes(), MIN_SEGMENT_BYTES);
    }
}
