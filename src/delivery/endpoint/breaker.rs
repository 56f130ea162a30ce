//! The circuit breaker: stops attempts to an endpoint that keeps failing, then probes it
//! with one.

use std::time::{Duration, Instant};

use super::EndpointKey;

/// What the breaker lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Allowed,
    /// The one attempt that tests whether an open endpoint has recovered.
    Probe,
    /// Open: no attempt until the cool-down ends.
    Refused {
        retry_in: Duration,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// `failures` in a row since the last success; `since`: when the first of them started.
    Closed {
        failures: u32,
        since: Option<Instant>,
    },
    Open {
        until: Instant,
    },
    /// A probe is out since `since`; if it never reports, another is allowed after a cool-down.
    Probing {
        since: Instant,
    },
}

/// A circuit breaker: a pure state machine, driven by `admit` before and `record` after each
/// attempt.
///
/// It opens on failures spread over time, not on a count alone: `threshold` failed attempts in
/// a row whose span, from the start of the first to the end of the latest, is at least
/// `window`. Attempts made together fail together (a burst of new events, a tier promoting
/// its backlog at once), and twenty failures within a fraction of a second are one look at the
/// endpoint, not twenty; a hanging endpoint's timeouts span their whole request time, so they
/// open it as soon as there are enough of them. Like the time-based sliding windows of
/// resilience libraries (resilience4j, Polly), with a success resetting the streak.
#[derive(Debug, Clone)]
pub struct Breaker {
    pub(super) threshold: u32,
    /// How long a streak of failures must span to open it.
    pub(super) window: Duration,
    pub(super) cooldown: Duration,
    pub(super) state: State,
    /// When it last opened from closed; `None` while closed.
    pub(super) open_since: Option<Instant>,
    /// Whether this opening was announced as a quarantine.
    pub(super) quarantined: bool,
    /// Whether this opening asked for its subscriptions to be disabled.
    pub(super) disabled: bool,
}

/// A change in an endpoint's health that operators are told of (`endpoint.quarantined`,
/// `endpoint.recovered`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthSignal {
    /// Its breaker has been open for `open_for`, at least `endpoints.quarantine_after`.
    Quarantined {
        endpoint: String,
        open_for: Duration,
    },
    /// A quarantined endpoint's breaker closed after `open_for`.
    Recovered {
        endpoint: String,
        open_for: Duration,
    },
    /// Its breaker has been open for `open_for`, at least `endpoints.disable_after`: the
    /// subscriptions pointing at `key` are to be disabled (paused, with a reason).
    DisableDue {
        key: EndpointKey,
        open_for: Duration,
    },
}

impl Breaker {
    /// A breaker that opens at `threshold` failures in a row, however close together (see
    /// [`Breaker::with_window`]), for `cooldown`.
    pub fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            window: Duration::ZERO,
            cooldown,
            state: State::Closed {
                failures: 0,
                since: None,
            },
            open_since: None,
            quarantined: false,
            disabled: false,
        }
    }

    /// Opens only when the failures in a row span at least `window`.
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// How long it has been open, the first time that is `after` or longer in this opening:
    /// the moment to disable its subscriptions, once. `after` zero: never.
    pub fn disable_due(&mut self, now: Instant, after: Duration) -> Option<Duration> {
        let open_for = now.saturating_duration_since(self.open_since?);
        if after.is_zero() || self.disabled || open_for < after {
            return None;
        }
        self.disabled = true;
        Some(open_for)
    }

    /// How long it has been open, the first time that is `after` or longer in this opening:
    /// the moment to announce a quarantine, once.
    pub fn quarantine_due(&mut self, now: Instant, after: Duration) -> Option<Duration> {
        let open_for = now.saturating_duration_since(self.open_since?);
        if self.quarantined || open_for < after {
            return None;
        }
        self.quarantined = true;
        Some(open_for)
    }

    pub fn admit(&mut self, now: Instant) -> Admit {
        match self.state {
            State::Closed { .. } => Admit::Allowed,
            State::Open { until } if now >= until => {
                self.state = State::Probing { since: now };
                Admit::Probe
            }
            State::Open { until } => Admit::Refused {
                retry_in: until - now,
            },
            State::Probing { since } if now >= since + self.cooldown => {
                self.state = State::Probing { since: now };
                Admit::Probe
            }
            State::Probing { since } => Admit::Refused {
                retry_in: since + self.cooldown - now,
            },
        }
    }

    /// Records an attempt's result: `failed` for the failures that say the endpoint is unwell;
    /// `started`, when the attempt was admitted. Returns how long it had been open when a
    /// success closes a quarantined breaker.
    pub fn record(&mut self, failed: bool, started: Instant, now: Instant) -> Option<Duration> {
        let was_open = !matches!(self.state, State::Closed { .. });
        self.state = match (self.state, failed) {
            (_, false) => State::Closed {
                failures: 0,
                since: None,
            },
            (State::Closed { failures, since }, true) => {
                let failures = failures.saturating_add(1);
                let since = since.map_or(started, |s| s.min(started));
                if failures >= self.threshold && now.saturating_duration_since(since) >= self.window
                {
                    State::Open {
                        until: now + self.cooldown,
                    }
                } else {
                    State::Closed {
                        failures,
                        since: Some(since),
                    }
                }
            }
            (_, true) => State::Open {
                until: now + self.cooldown,
            },
        };
        let open = !matches!(self.state, State::Closed { .. });
        if open && !was_open {
            self.open_since = Some(now);
        }
        if open {
            return None;
        }
        let since = self.open_since.take()?;
        self.disabled = false;
        std::mem::take(&mut self.quarantined).then(|| now.saturating_duration_since(since))
    }

    /// Whether it refuses attempts (open, or waiting for a probe). Deliveries ask
    /// [`Breaker::admit`]; recording asks this to see a breaker close.
    pub(super) fn is_open(&self) -> bool {
        !matches!(self.state, State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_breaker_opens_probes_and_closes() {
        let t0 = Instant::now();
        let cool = Duration::from_secs(30);
        let mut b = Breaker::new(3, cool);
        assert_eq!(b.admit(t0), Admit::Allowed);
        b.record(true, t0, t0);
        b.record(true, t0, t0);
        b.record(false, t0, t0); // a success resets the count
        b.record(true, t0, t0);
        b.record(true, t0, t0);
        assert_eq!(b.admit(t0), Admit::Allowed);
        b.record(true, t0, t0); // third in a row: open
        assert!(b.is_open());
        assert_eq!(
            b.admit(t0 + Duration::from_secs(10)),
            Admit::Refused {
                retry_in: Duration::from_secs(20)
            }
        );
        // The cool-down ends: one probe, the rest still refused.
        let t1 = t0 + cool;
        assert_eq!(b.admit(t1), Admit::Probe);
        assert!(matches!(b.admit(t1), Admit::Refused { .. }));
        // The probe fails: open again for a whole cool-down.
        b.record(true, t1, t1);
        assert!(matches!(
            b.admit(t1 + Duration::from_secs(29)),
            Admit::Refused { .. }
        ));
        let t2 = t1 + cool;
        assert_eq!(b.admit(t2), Admit::Probe);
        b.record(false, t2, t2);
        assert_eq!(b.admit(t2), Admit::Allowed);
        assert!(!b.is_open());
    }

    #[test]
    fn a_breaker_open_long_enough_asks_once_per_opening_for_its_subscriptions_to_be_disabled() {
        let t0 = Instant::now();
        let after = Duration::from_secs(3600);
        let mut b = Breaker::new(1, Duration::from_secs(5));
        assert_eq!(b.disable_due(t0 + after, after), None, "closed");
        b.record(true, t0, t0);
        assert_eq!(b.disable_due(t0 + after / 2, after), None, "not yet");
        assert_eq!(b.disable_due(t0 + after, Duration::ZERO), None, "0s: never");
        assert_eq!(b.disable_due(t0 + after, after), Some(after));
        assert_eq!(b.disable_due(t0 + after * 2, after), None, "once");
        // Closed and open again: a new opening asks again, after its own time.
        let t1 = t0 + after * 2;
        assert_eq!(b.admit(t1), Admit::Probe);
        b.record(false, t1, t1);
        b.record(true, t1, t1);
        assert_eq!(b.disable_due(t1 + after / 2, after), None);
        assert_eq!(b.disable_due(t1 + after, after), Some(after));
    }

    #[test]
    fn a_breaker_open_long_enough_is_quarantined_once_and_recovers_once() {
        let t0 = Instant::now();
        let cool = Duration::from_secs(5);
        let after = Duration::from_secs(60);
        let mut b = Breaker::new(1, cool);
        assert_eq!(b.quarantine_due(t0, after), None, "closed");
        assert_eq!(b.record(true, t0, t0), None);
        assert_eq!(b.quarantine_due(t0 + cool, after), None, "not yet");
        // Failed probes keep it open since its first opening.
        let t1 = t0 + Duration::from_secs(30);
        assert_eq!(b.admit(t1), Admit::Probe);
        assert_eq!(b.record(true, t1, t1), None);
        let t2 = t0 + after;
        assert_eq!(b.quarantine_due(t2, after), Some(after));
        assert_eq!(b.quarantine_due(t2, after), None, "announced once");
        assert_eq!(b.admit(t2), Admit::Probe);
        assert_eq!(b.record(false, t2, t2), Some(after));
        // A short opening that closes is no news.
        assert_eq!(b.record(true, t2, t2), None);
        assert_eq!(b.record(false, t2 + cool, t2 + cool), None);
    }

    #[test]
    fn a_burst_of_failures_is_one_look_and_failures_spread_over_the_window_open_it() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut b = Breaker::new(20, Duration::from_secs(30)).with_window(Duration::from_secs(1));
        // Twenty attempts made together, failing together within a fraction of a second.
        for i in 0..20 {
            b.record(true, t0, t0 + ms(5 + i));
        }
        assert_eq!(
            b.admit(t0 + ms(30)),
            Admit::Allowed,
            "a burst opens nothing"
        );
        // The same endpoint failing a second later: failures spread over the window.
        b.record(true, t0 + ms(1000), t0 + ms(1005));
        assert!(b.is_open());
        // A success resets the streak and its span.
        let mut b = Breaker::new(3, Duration::from_secs(30)).with_window(Duration::from_secs(1));
        b.record(true, t0, t0 + ms(900));
        b.record(false, t0 + ms(950), t0 + ms(960));
        b.record(true, t0 + ms(970), t0 + ms(980));
        b.record(true, t0 + ms(990), t0 + ms(1_000));
        b.record(true, t0 + ms(1_000), t0 + ms(1_010));
        assert!(!b.is_open(), "the streak started at 970 ms");
        b.record(true, t0 + ms(1_900), t0 + ms(1_980));
        assert!(b.is_open());
        // Attempts that hang until their timeout span it alone: enough of them open it at once.
        let mut b = Breaker::new(3, Duration::from_secs(30)).with_window(Duration::from_secs(1));
        for _ in 0..3 {
            b.record(true, t0, t0 + Duration::from_secs(15));
        }
        assert!(b.is_open());
    }

    #[test]
    fn a_probe_that_never_reports_does_not_wedge_the_breaker() {
        let t0 = Instant::now();
        let cool = Duration::from_secs(5);
        let mut b = Breaker::new(1, cool);
        b.record(true, t0, t0);
        assert_eq!(b.admit(t0 + cool), Admit::Probe);
        // No record() for that probe; after another cool-down a new probe goes.
        assert_eq!(b.admit(t0 + cool * 2), Admit::Probe);
    }
}
