//! Per-source token buckets, for registration.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

/// Allows `rate` events per second per source with bursts of `burst`.
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<IpAddr, (f64, Instant)>>,
}

impl RateLimiter {
    /// `rate` 0 disables the limit.
    pub fn new(rate: u32, burst: u32) -> Self {
        Self {
            rate: rate as f64,
            burst: burst.max(1) as f64,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `source` at `now`; on refusal, the seconds until
    /// one is available.
    pub fn check(&self, source: IpAddr, now: Instant) -> Result<(), u64> {
        if self.rate == 0.0 {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().expect("rate limiter lock");
        if buckets.len() > 100_000 {
            // Forget sources that have been quiet long enough to be full again.
            let full_after = self.burst / self.rate;
            buckets.retain(|_, (_, t)| now.duration_since(*t).as_secs_f64() < full_after);
        }
        let (tokens, last) = buckets.entry(source).or_insert((self.burst, now));
        let refill = now.duration_since(*last).as_secs_f64() * self.rate;
        *tokens = (*tokens + refill).min(self.burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - *tokens) / self.rate).ceil().max(1.0) as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bursts_then_refills_per_source() {
        let l = RateLimiter::new(2, 4);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let t = Instant::now();
        for _ in 0..4 {
            assert!(l.check(a, t).is_ok());
        }
        assert_eq!(l.check(a, t), Err(1));
        assert!(l.check(b, t).is_ok(), "another source has its own bucket");
        assert!(l.check(a, t + Duration::from_millis(600)).is_ok());
        assert!(RateLimiter::new(0, 0).check(a, t).is_ok());
    }
}
