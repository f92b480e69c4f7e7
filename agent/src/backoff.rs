//! Exponential back-off with jitter, so a fleet of machines that lost their
//! coordinator at the same moment does not come back in lockstep.

use std::time::Duration;

use rand::Rng;

/// Doubling delays from `initial` up to `max`, each drawn uniformly from the
/// upper half of the current step.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            current: initial,
        }
    }

    /// The agent's standard back-off: 1 s doubling to 30 s.
    pub fn standard() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(30))
    }

    /// The next delay, with jitter from the thread's random generator.
    pub fn next_delay(&mut self) -> Duration {
        let fraction = rand::rng().random_range(0.5..=1.0);
        self.next_delay_with(fraction)
    }

    /// The next delay, scaling the current step by `fraction` (0.5..=1).
    pub fn next_delay_with(&mut self, fraction: f64) -> Duration {
        let delay = self.current.mul_f64(fraction.clamp(0.5, 1.0));
        self.current = (self.current * 2).min(self.max);
        delay
    }

    /// Starts again from the initial delay.
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_with_jitter() {
        let mut b = Backoff::standard();
        let full: Vec<u64> = (0..8).map(|_| b.next_delay_with(1.0).as_secs()).collect();
        assert_eq!(full, [1, 2, 4, 8, 16, 30, 30, 30]);
        b.reset();
        assert_eq!(b.next_delay_with(0.5), Duration::from_millis(500));
        for _ in 0..50 {
            let d = b.next_delay();
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_secs(30),
                "{d:?}"
            );
        }
    }
}
