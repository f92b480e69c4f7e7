//! The per-machine back-off of failed creates: how long the reconciler
//! waits before asking a provider again, by the class of its last error.

use std::collections::HashMap;

use super::CloudErrorClass;

/// Per-machine back-off of failed creates, kept in memory: a restart
/// retries at once, which is what an operator restarting it wants.
#[derive(Default)]
pub struct ProvisionRetries(std::sync::Mutex<HashMap<String, Retry>>);

#[derive(Debug, Clone, Copy)]
struct Retry {
    attempts: u32,
    not_before: time::OffsetDateTime,
    /// The cluster generation the failures were met at: a new spec (a fixed
    /// AMI, say) is tried at once.
    generation: u64,
}

impl ProvisionRetries {
    /// When the machine's next create may run, if it must wait.
    pub fn not_before(&self, machine: &str, generation: u64) -> Option<time::OffsetDateTime> {
        self.0
            .lock()
            .expect("retry lock")
            .get(machine)
            .filter(|r| r.generation == generation)
            .map(|r| r.not_before)
    }

    /// Records a failure; returns the attempt number and the delay before
    /// the next one (exponential per failure class, with ±20 % jitter).
    pub fn failed(
        &self,
        machine: &str,
        generation: u64,
        class: CloudErrorClass,
        now: time::OffsetDateTime,
    ) -> (u32, std::time::Duration) {
        use rand::Rng;
        let mut map = self.0.lock().expect("retry lock");
        let attempts = map
            .get(machine)
            .filter(|r| r.generation == generation)
            .map_or(0, |r| r.attempts)
            + 1;
        let (base, max) = class.backoff();
        let exp = base.saturating_mul(1u32 << (attempts - 1).min(16)).min(max);
        let jitter = rand::rng().random_range(0.8..1.2);
        let delay = exp.mul_f64(jitter);
        map.insert(
            machine.to_owned(),
            Retry {
                attempts,
                not_before: now + delay,
                generation,
            },
        );
        (attempts, delay)
    }

    /// Forgets a machine's failures.
    pub fn succeeded(&self, machine: &str) {
        self.0.lock().expect("retry lock").remove(machine);
    }
}
