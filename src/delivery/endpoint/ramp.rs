//! The ramp a recovered endpoint climbs back to its cap on: one more per success, half per
//! failure.

/// A recovering endpoint's concurrency limit: additive increase, multiplicative decrease
/// (AIMD). A pure state machine; [`Endpoints`] asks it at admission and tells it every result.
///
/// It grows by one with each success, as Netflix's concurrency-limits `AIMDLimit` does, so with
/// a backlog keeping it full it about doubles with each round of answers; it halves with each
/// failure, never below one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ramp {
    pub(super) limit: u32,
}

impl Ramp {
    pub fn new(start: u32) -> Self {
        Self {
            limit: start.max(1),
        }
    }

    /// Attempts allowed at once now.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    pub fn on_success(&mut self) {
        self.limit = self.limit.saturating_add(1);
    }

    pub fn on_failure(&mut self) {
        self.limit = (self.limit / 2).max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ramp_adds_one_per_success_and_halves_per_failure() {
        let mut r = Ramp::new(2);
        assert_eq!(r.limit(), 2);
        r.on_success();
        r.on_success();
        assert_eq!(r.limit(), 4);
        r.on_failure();
        assert_eq!(r.limit(), 2);
        r.on_failure();
        r.on_failure();
        assert_eq!(r.limit(), 1, "never below one");
        assert_eq!(Ramp::new(0).limit(), 1);
    }
}
