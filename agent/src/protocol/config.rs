//! Fetching the config bundle: reading the answers of
//! `GET /v1/machine/config`, the stale-bundle rule, and when to ask again.

use drover_common::bundle::{self, ConfigBundle, SignedBundle};
use drover_common::wire::{CommandFailure, ConfigNotReady};
use tokio::time::Instant;

use super::paths::CONFIG_PATH;
use super::timing::config_retry_delay;
use crate::backoff::Backoff;

/// The answers of `GET /v1/machine/config`.
#[derive(Debug)]
pub enum ConfigAnswer {
    Bundle(SignedBundle),
    NotReady(ConfigNotReady),
    NotAssigned,
}

/// Why a fetched bundle is not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundleRefusal {
    /// Older than the assignment; the coordinator may catch up.
    Stale { got: u64, want: u64 },
    /// Unusable: bad signature, wrong machine, malformed.
    Invalid(String),
}

/// Verifies a signed bundle for machine `machine_uid` against the
/// coordinator CA (DER).
pub fn verify(
    signed: &SignedBundle,
    ca_der: &[u8],
    machine_uid: &str,
) -> Result<ConfigBundle, BundleRefusal> {
    bundle::verify(signed, ca_der, machine_uid)
        .map_err(|e| BundleRefusal::Invalid(format!("config bundle refused: {e}")))
}

/// The stale-bundle rule: a verified bundle older than the assignment
/// generation `want` is not used; the coordinator may not have caught up.
pub fn check_generation(bundle: ConfigBundle, want: u64) -> Result<ConfigBundle, BundleRefusal> {
    if bundle.generation < want {
        return Err(BundleRefusal::Stale {
            got: bundle.generation,
            want,
        });
    }
    Ok(bundle)
}

/// The failure reported when the fetched bundle is unusable.
pub fn fetch_failure(why: String, at: time::OffsetDateTime) -> CommandFailure {
    CommandFailure {
        command: format!("GET {CONFIG_PATH}"),
        exit_code: None,
        output_tail: vec![why],
        at,
    }
}

/// What a config answer means for the machine.
#[derive(Debug)]
pub enum ConfigStep {
    /// A verified, current bundle: apply it. Fetching stopped. Boxed: a
    /// bundle is far larger than the other answers.
    Apply(Box<ConfigBundle>),
    /// A bundle older than the assignment; fetched again after a back-off.
    Stale {
        got: u64,
        want: u64,
        retry_in: std::time::Duration,
    },
    /// An unusable bundle: the bootstrap fails. Fetching stopped.
    Invalid(String),
    /// Not ready yet; fetched again when the coordinator said.
    NotReady(ConfigNotReady),
    /// The coordinator says the machine is not assigned: fetching stops
    /// until a heartbeat says it is.
    NotAssigned,
}

/// When the machine fetches its config next.
#[derive(Debug, Clone)]
pub struct ConfigFetch {
    next_at: Option<Instant>,
    backoff: Backoff,
}

impl Default for ConfigFetch {
    fn default() -> Self {
        Self {
            next_at: None,
            backoff: Backoff::standard(),
        }
    }
}

impl ConfigFetch {
    /// When the next fetch is due, if one is wanted.
    pub fn next_at(&self) -> Option<Instant> {
        self.next_at
    }

    /// Whether a fetch is scheduled.
    pub fn wanted(&self) -> bool {
        self.next_at.is_some()
    }

    /// Fetches at `now`, the back-off starting over.
    pub fn want_now(&mut self, now: Instant) {
        self.next_at = Some(now);
        self.backoff.reset();
    }

    /// Fetches at `now`, keeping the back-off where it is.
    pub fn resume(&mut self, now: Instant) {
        self.next_at = Some(now);
    }

    /// Stops fetching.
    pub fn stop(&mut self) {
        self.next_at = None;
    }

    /// Fetches again at `at`.
    pub fn retry_at(&mut self, at: Instant) {
        self.next_at = Some(at);
    }

    /// Fetches again after the next back-off delay; returns the delay.
    pub fn retry_after_backoff(&mut self, now: Instant) -> std::time::Duration {
        let delay = self.backoff.next_delay();
        self.next_at = Some(now + delay);
        delay
    }

    /// Acts on an answer for the assignment of generation `want`;
    /// `verify` checks a bundle's signature and machine.
    pub fn on_answer(
        &mut self,
        now: Instant,
        answer: ConfigAnswer,
        want: u64,
        verify: impl FnOnce(&SignedBundle) -> Result<ConfigBundle, BundleRefusal>,
    ) -> ConfigStep {
        match answer {
            ConfigAnswer::Bundle(signed) => {
                match verify(&signed).and_then(|b| check_generation(b, want)) {
                    Ok(bundle) => {
                        self.stop();
                        ConfigStep::Apply(Box::new(bundle))
                    }
                    Err(BundleRefusal::Stale { got, want }) => ConfigStep::Stale {
                        got,
                        want,
                        retry_in: self.retry_after_backoff(now),
                    },
                    Err(BundleRefusal::Invalid(why)) => {
                        self.stop();
                        ConfigStep::Invalid(why)
                    }
                }
            }
            ConfigAnswer::NotReady(not_ready) => {
                self.backoff.reset();
                self.next_at = Some(now + config_retry_delay(not_ready.retry_after_seconds));
                ConfigStep::NotReady(not_ready)
            }
            ConfigAnswer::NotAssigned => {
                self.stop();
                ConfigStep::NotAssigned
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use drover_common::api::MachineRole;

    fn bundle(generation: u64) -> ConfigBundle {
        ConfigBundle {
            machine_uid: "uid-1".into(),
            cluster: "c".into(),
            role: MachineRole::Worker,
            generation,
            kubernetes_version: "v1.31.0".into(),
            machine_files: vec![],
            pre_kubeadm_commands: vec![],
            post_kubeadm_commands: vec![],
            image_cni: false,
            addons: vec![],
            restore: None,
            kubeadm_config_path: "/etc/drover/kubeadm.yaml".into(),
            files: vec![],
            issued_at: time::OffsetDateTime::UNIX_EPOCH,
        }
    }

    fn signed() -> SignedBundle {
        SignedBundle {
            payload: String::new(),
            signature: String::new(),
        }
    }

    #[test]
    fn stale_bundles_are_refused_by_generation() {
        assert_eq!(check_generation(bundle(3), 3).unwrap().generation, 3);
        assert_eq!(check_generation(bundle(4), 3).unwrap().generation, 4);
        assert_eq!(
            check_generation(bundle(2), 3).unwrap_err(),
            BundleRefusal::Stale { got: 2, want: 3 }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn answers_schedule_the_next_fetch() {
        let now = Instant::now();
        let mut fetch = ConfigFetch::default();
        assert!(!fetch.wanted());
        fetch.want_now(now);
        assert_eq!(fetch.next_at(), Some(now));

        // A stale bundle: again after a back-off of 0.5 to 1 s.
        let step = fetch.on_answer(now, ConfigAnswer::Bundle(signed()), 3, |_| Ok(bundle(2)));
        match step {
            ConfigStep::Stale {
                got: 2,
                want: 3,
                retry_in,
            } => {
                assert!(
                    retry_in >= Duration::from_millis(500) && retry_in <= Duration::from_secs(1)
                );
                assert_eq!(fetch.next_at(), Some(now + retry_in));
            }
            other => panic!("{other:?}"),
        }

        // Not ready: when the coordinator said, within bounds.
        let step = fetch.on_answer(
            now,
            ConfigAnswer::NotReady(ConfigNotReady {
                reason: "waiting for init".into(),
                retry_after_seconds: 7,
            }),
            3,
            |_| unreachable!("no bundle"),
        );
        assert!(matches!(step, ConfigStep::NotReady(_)), "{step:?}");
        assert_eq!(fetch.next_at(), Some(now + Duration::from_secs(7)));

        // Current bundles are applied, invalid ones fail; both stop fetching.
        let step = fetch.on_answer(now, ConfigAnswer::Bundle(signed()), 3, |_| Ok(bundle(3)));
        assert!(matches!(step, ConfigStep::Apply(b) if b.generation == 3));
        assert!(!fetch.wanted());
        fetch.resume(now);
        let step = fetch.on_answer(now, ConfigAnswer::Bundle(signed()), 3, |_| {
            Err(BundleRefusal::Invalid(
                "config bundle refused: bad signature".into(),
            ))
        });
        assert!(matches!(step, ConfigStep::Invalid(ref why) if why.contains("bad signature")));
        assert!(!fetch.wanted());

        // "Not assigned" stops until a heartbeat says otherwise.
        fetch.want_now(now);
        let step = fetch.on_answer(now, ConfigAnswer::NotAssigned, 3, |_| unreachable!());
        assert!(matches!(step, ConfigStep::NotAssigned));
        assert!(!fetch.wanted());
        let failure = fetch_failure("why".into(), time::OffsetDateTime::UNIX_EPOCH);
        assert_eq!(failure.command, "GET /v1/machine/config");
        assert_eq!(failure.output_tail, ["why"]);
    }
}
