//! Assignment notices: what a machine does when a heartbeat answer names
//! the cluster and role it is assigned to, by generation.

use super::report::failure_needs_reset;

/// How far a machine has come with its current assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage<'a> {
    /// The config bundle has not been applied yet; `fetching` when a fetch
    /// is scheduled (not after the coordinator answered "not assigned").
    Fetching { fetching: bool },
    /// `kubeadm reset` runs before bootstrapping again.
    Resetting,
    /// The bundle was applied (files written, kubeadm started or done).
    Applied,
    /// Bootstrap failed at `step`; `busy` while a command still runs.
    Failed { step: &'a str, busy: bool },
}

/// The assignment a machine holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Current<'a> {
    pub generation: u64,
    pub stage: Stage<'a>,
}

/// What to do about an assignment notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Nothing: the same or an older assignment, or a reset comes first.
    Ignore,
    /// A first assignment (newer than any the machine was reset away
    /// from): take it and fetch its config.
    Accept,
    /// The same assignment, whose config fetch stopped after a "not
    /// assigned" answer: fetch again.
    ResumeFetch,
    /// A newer assignment before the bundle was applied: take it instead,
    /// and fetch the config when `fetch` (not while a reset runs).
    Replace { fetch: bool },
    /// A newer assignment after a failed bootstrap: start over, with
    /// `kubeadm reset` first when kubeadm may have run.
    StartOver { reset_first: bool },
    /// A newer assignment after a failed bootstrap while a command still
    /// runs: a later notice decides.
    Wait,
    /// A newer assignment after the bundle was applied: it needs a reset
    /// first, so it is not taken.
    RefuseNewer,
}

/// Decides about a notice of assignment generation `offered`. `retired` is
/// the newest generation the machine was reset away from; `reset_pending`
/// is true while a reset directive is queued or running.
pub fn decide(
    current: Option<Current<'_>>,
    retired: u64,
    reset_pending: bool,
    offered: u64,
) -> Decision {
    if reset_pending {
        return Decision::Ignore;
    }
    let Some(current) = current else {
        return if offered > retired {
            Decision::Accept
        } else {
            Decision::Ignore
        };
    };
    if offered == current.generation {
        return match current.stage {
            Stage::Fetching { fetching: false } => Decision::ResumeFetch,
            _ => Decision::Ignore,
        };
    }
    if offered < current.generation {
        return Decision::Ignore;
    }
    match current.stage {
        Stage::Fetching { .. } => Decision::Replace { fetch: true },
        Stage::Resetting => Decision::Replace { fetch: false },
        Stage::Failed { step, busy: false } => Decision::StartOver {
            reset_first: failure_needs_reset(step),
        },
        Stage::Failed { busy: true, .. } => Decision::Wait,
        Stage::Applied => Decision::RefuseNewer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(generation: u64, stage: Stage<'_>) -> Option<Current<'_>> {
        Some(Current { generation, stage })
    }

    #[test]
    fn first_assignment_must_be_newer_than_the_retired_one() {
        assert_eq!(decide(None, 0, false, 1), Decision::Accept);
        assert_eq!(decide(None, 4, false, 4), Decision::Ignore);
        assert_eq!(decide(None, 4, false, 3), Decision::Ignore);
        assert_eq!(decide(None, 4, false, 5), Decision::Accept);
        // A reset queued or running comes first.
        assert_eq!(decide(None, 0, true, 1), Decision::Ignore);
    }

    #[test]
    fn same_generation_only_resumes_a_stopped_fetch() {
        let stopped = Stage::Fetching { fetching: false };
        assert_eq!(decide(at(3, stopped), 0, false, 3), Decision::ResumeFetch);
        for stage in [
            Stage::Fetching { fetching: true },
            Stage::Resetting,
            Stage::Applied,
            Stage::Failed {
                step: "fetch-config",
                busy: false,
            },
        ] {
            assert_eq!(decide(at(3, stage), 0, false, 3), Decision::Ignore);
            // Older notices are stale.
            assert_eq!(decide(at(3, stage), 0, false, 2), Decision::Ignore);
        }
    }

    #[test]
    fn newer_generation_by_stage() {
        let newer = |stage| decide(at(3, stage), 0, false, 4);
        assert_eq!(
            newer(Stage::Fetching { fetching: true }),
            Decision::Replace { fetch: true }
        );
        assert_eq!(
            newer(Stage::Fetching { fetching: false }),
            Decision::Replace { fetch: true }
        );
        assert_eq!(newer(Stage::Resetting), Decision::Replace { fetch: false });
        assert_eq!(newer(Stage::Applied), Decision::RefuseNewer);
        for (step, reset_first) in [
            ("fetch-config", false),
            ("write-files", false),
            ("kubeadm-join", true),
            ("kubeadm-init", true),
            ("kubeadm-reset", true),
        ] {
            assert_eq!(
                newer(Stage::Failed { step, busy: false }),
                Decision::StartOver { reset_first },
                "{step}"
            );
            assert_eq!(newer(Stage::Failed { step, busy: true }), Decision::Wait);
        }
        assert_eq!(decide(at(3, Stage::Applied), 0, true, 4), Decision::Ignore);
    }
}
