//! Rollouts of provider clusters (docker, aws): a machine made for another
//! Kubernetes version or image than the spec names is replaced, never
//! patched. Pools roll one at a time, the control plane first; each new
//! machine must settle (Running, healthy, its Node Ready for the settle
//! time) before the next step, and a new machine that fails halts the
//! rollout until the spec changes or an operator resumes it. A failed new
//! machine is replaced once: the rollout records it, and the second
//! failure in the same rollout halts it, naming both machines (an image
//! whose machines always die is not replaced forever).
//!
//! This module decides, per pool, how far the pool may grow this pass and
//! which outdated machines leave; `provider.rs` turns that into the same
//! create and delete steps as scaling, so an outdated machine leaves by
//! the safe path (load balancer first, drain, etcd member, Node).

use drover_common::api::{
    CertificateExpiry, Cluster, EssentialAddonsUpgrade, Machine, MachinePhase, PoolRollout,
    RolloutHalt, RolloutPolicy, RolloutStatus, UpgradePolicy,
};
use time::OffsetDateTime;

/// The cluster condition that says a rollout halted.
pub const UPGRADE_HALTED_CONDITION: &str = "UpgradeHalted";

/// How many new machines of one rollout may fail before it halts: the
/// first is replaced (a machine can die of its own fault), the second
/// stops it (the version or image is likely at fault).
pub const FAILURES_BEFORE_HALT: usize = 2;

/// What the cluster's machines should be made from: the version and each
/// pool's image. A change of it starts a new rollout.
pub(crate) fn target(cluster: &Cluster) -> String {
    let mut t = cluster.spec.kubernetes_version.clone();
    for (pool, _) in cluster.desired_pools() {
        if let Some(image) = cluster.spec.provider.machine_image(&pool) {
            t.push_str(&format!(" {pool}={image}"));
        }
    }
    t
}

/// Whether `m` is to be replaced: made for another version or image than
/// the cluster's spec names, or a control plane whose certificates expire
/// within the cluster's renewal window (its replacement gets new ones).
pub(crate) fn is_outdated(cluster: &Cluster, m: &Machine, now: OffsetDateTime) -> bool {
    made_for_another(cluster, m) || expiring_certificates(cluster, m, now).is_some()
}

/// The first certificate of control plane `m` to expire, when that is
/// within the cluster's renewal window.
pub(crate) fn expiring_certificates<'m>(
    cluster: &Cluster,
    m: &'m Machine,
    now: OffsetDateTime,
) -> Option<&'m CertificateExpiry> {
    let control_plane = super::shared::is_control_plane(m);
    let window = UpgradePolicy::renew_certificates_before(cluster.spec.upgrade.as_ref());
    m.status
        .certificates
        .as_ref()
        .filter(|c| control_plane && c.expires_at - now < window)
}

/// Whether `m` was made for another version or image than the cluster's
/// spec names. A machine with nothing recorded (made before rollouts) is
/// taken as current.
pub(crate) fn made_for_another(cluster: &Cluster, m: &Machine) -> bool {
    let Some(a) = &m.spec.assignment else {
        return false;
    };
    let version = a
        .kubernetes_version
        .as_deref()
        .is_some_and(|v| v != cluster.spec.kubernetes_version);
    let image = a.image.as_deref().is_some_and(|i| {
        cluster
            .spec
            .provider
            .machine_image(&a.machine_pool)
            .is_some_and(|want| want != i)
    });
    version || image
}

/// One pool, as the rollout sees it.
pub(crate) struct PoolRoll<'a, 'm> {
    pub pool: &'a str,
    pub desired: u32,
    pub control_plane: bool,
    pub policy: Option<&'a RolloutPolicy>,
    /// The pool's machines that are not leaving.
    pub remaining: &'a [&'m Machine],
    /// The pool's unhealthy machines, with why, including those being
    /// replaced this pass.
    pub unhealthy: &'a [(&'m Machine, String)],
    /// The new machines of this rollout that failed in earlier passes.
    pub failed_before: &'a [RolloutHalt],
    /// Why the pool may not take a step now (`None`: it may): something
    /// else changes in it, an earlier pool is not done, (control plane)
    /// etcd is not whole, the endpoint does not answer.
    pub blocked: Option<String>,
    /// The rollout is halted (recorded for this target).
    pub halted: bool,
    /// Outdated machines already on their way out (a control plane whose
    /// etcd member is being or was removed): they go on leaving whatever
    /// the gates say, or a rollout that took a member would stop there.
    pub leaving: &'a [&'m Machine],
}

/// What a pool's rollout does this pass.
#[derive(Debug)]
pub(crate) struct Roll<'m> {
    /// The pool may have this many machines (its replicas plus surge).
    pub ceiling: u32,
    /// Outdated machines that leave now.
    pub retire: Vec<&'m Machine>,
    pub progress: PoolRollout,
    /// A second new machine failed: the rollout halts.
    pub halt: Option<RolloutHalt>,
    /// New machines found failing this pass (to be recorded).
    pub failures: Vec<RolloutHalt>,
    /// The pool has outdated machines, or a surplus still to shed.
    pub rolling: bool,
    /// What the pool's rollout waits for, and why, when it takes no step.
    pub waiting: Option<String>,
}

/// Decides one pool's rollout step. Pure.
pub(crate) fn roll_pool<'m>(
    cluster: &Cluster,
    input: &PoolRoll<'_, 'm>,
    now: OffsetDateTime,
) -> Roll<'m> {
    let desired = input.desired;
    let count = input.remaining.len() as u32;
    let mut outdated: Vec<&'m Machine> = input
        .remaining
        .iter()
        .copied()
        .filter(|m| is_outdated(cluster, m, now))
        .collect();
    // Machines that do not serve go first, then the oldest.
    outdated.sort_by_key(|m| {
        (
            m.status.phase == MachinePhase::Running,
            m.metadata.creation_timestamp,
        )
    });
    let updated: Vec<&'m Machine> = input
        .remaining
        .iter()
        .copied()
        .filter(|m| !is_outdated(cluster, m, now))
        .collect();
    let progress = PoolRollout {
        name: input.pool.to_owned(),
        updated: updated
            .iter()
            .filter(|m| m.status.phase == MachinePhase::Running)
            .count() as u32,
        desired,
        outdated: outdated.len() as u32,
    };
    let mut roll = Roll {
        ceiling: desired,
        retire: vec![],
        progress,
        halt: None,
        failures: vec![],
        rolling: !outdated.is_empty(),
        waiting: None,
    };
    if outdated.is_empty() {
        return roll;
    }
    // New machines that fail, whether or not they are replaced this pass
    // (a machine killed mid-join is replaced the pass it is found).
    roll.failures = input
        .unhealthy
        .iter()
        .filter(|(m, _)| !is_outdated(cluster, m, now))
        .filter(|(m, _)| {
            !input
                .failed_before
                .iter()
                .any(|f| f.machine == m.metadata.name)
        })
        .map(|(m, why)| RolloutHalt {
            machine: m.metadata.name.clone(),
            step: if m.status.phase == MachinePhase::Running {
                "health".into()
            } else {
                "bootstrap".into()
            },
            reason: why.clone(),
            at: now,
        })
        .collect();
    // The second failure halts the rollout: the pool goes back to its
    // replicas of outdated machines (the surplus is shed).
    let all: Vec<&RolloutHalt> = input.failed_before.iter().chain(&roll.failures).collect();
    if all.len() >= FAILURES_BEFORE_HALT && !roll.failures.is_empty() {
        let last = all[all.len() - 1];
        roll.halt = Some(RolloutHalt {
            machine: last.machine.clone(),
            step: last.step.clone(),
            reason: format!(
                "{} new machines failed: {}",
                all.len(),
                all.iter()
                    .map(|f| format!("{} ({}: {})", f.machine, f.step, f.reason))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            at: now,
        });
    }
    if input.halted || roll.halt.is_some() {
        return roll;
    }
    let surge = if input.control_plane {
        RolloutPolicy::surge(input.policy).min(1)
    } else {
        RolloutPolicy::surge(input.policy)
    };
    let unavailable = if input.control_plane {
        // With no surge, a control plane is replaced in place: one leaves
        // first (the validation asks for three, so etcd keeps quorum).
        u32::from(RolloutPolicy::surge(input.policy) == 0)
    } else {
        RolloutPolicy::unavailable(input.policy)
    };
    let surge = surge.min(outdated.len() as u32);
    // While waiting, the pool keeps what it has (up to its surge).
    roll.ceiling = count.clamp(desired, desired + surge);
    if !input.leaving.is_empty() {
        roll.retire = input.leaving.to_vec();
        return roll;
    }
    if let Some(why) = &input.blocked {
        roll.waiting = Some(why.clone());
        return roll;
    }
    let settle = UpgradePolicy::settle_time(cluster.spec.upgrade.as_ref());
    if let Some(why) = updated
        .iter()
        .find_map(|m| not_settled(cluster, m, settle, now))
    {
        roll.waiting = Some(why);
        return roll;
    }
    // The first new machine is the canary: until one has settled, one
    // step at a time.
    let canary_passed = !updated.is_empty();
    let mut ceiling = desired + surge;
    let mut leave = (count + unavailable).saturating_sub(desired) as usize;
    if !canary_passed {
        ceiling = ceiling.min(desired + 1);
        leave = leave.min(1);
    }
    if input.control_plane {
        leave = leave.min(1);
    }
    roll.ceiling = ceiling;
    roll.retire = outdated.into_iter().take(leave).collect();
    roll
}

/// Why a new machine has not settled yet (`None` once it has): it must be
/// Running and its Node Ready for `settle`. The words name the machine,
/// its Node and what the Node says, so a rollout that waits (for a pod
/// network, say) says what for.
fn not_settled(
    cluster: &Cluster,
    m: &Machine,
    settle: std::time::Duration,
    now: OffsetDateTime,
) -> Option<String> {
    let name = &m.metadata.name;
    if m.status.phase != MachinePhase::Running {
        return Some(format!(
            "new machine {name} to run (it is {:?})",
            m.status.phase
        ));
    }
    let Some(node) = cluster
        .status
        .nodes
        .iter()
        .find(|n| n.name == m.status.hostname)
    else {
        return Some(format!(
            "the Node of new machine {name} ({}) to register",
            m.status.hostname
        ));
    };
    if node.ready != "True" {
        let why = if node.network_not_ready() {
            "no pod network (give the cluster a CNI addon or `cni: image`)".to_owned()
        } else if node.message.is_empty() {
            format!("Ready={}", node.ready)
        } else {
            node.message.clone()
        };
        return Some(format!(
            "Node {} of new machine {name} to be Ready: it is NotReady: {why}",
            node.name
        ));
    }
    let ready_for = node.since.map_or(settle, |t| {
        std::time::Duration::try_from(now - t).unwrap_or_default()
    });
    (ready_for < settle).then(|| {
        format!(
            "Node {} of new machine {name} to stay Ready for {}s (Ready for {}s)",
            node.name,
            settle.as_secs(),
            ready_for.as_secs()
        )
    })
}

/// The rollout status for this pass: `None` once nothing is outdated.
/// Keeps the start time and a halt while the target is the same; a halt
/// found now is recorded.
pub(crate) fn rollout_status(
    cluster: &Cluster,
    pools: Vec<PoolRollout>,
    rolling: bool,
    halt: Option<RolloutHalt>,
    failures: Vec<RolloutHalt>,
    waiting: Option<String>,
    now: OffsetDateTime,
) -> Option<RolloutStatus> {
    if !rolling {
        return None;
    }
    let target = target(cluster);
    let previous = cluster
        .status
        .rollout
        .as_ref()
        .filter(|r| r.target == target);
    Some(RolloutStatus {
        version: cluster.spec.kubernetes_version.clone(),
        target,
        started_at: previous.map_or(now, |r| r.started_at),
        pools,
        halted: previous.and_then(|r| r.halted.clone()).or(halt),
        waiting_for: waiting,
        failures: {
            let mut all = failed_before(cluster).to_vec();
            for f in failures {
                if !all.iter().any(|a| a.machine == f.machine) {
                    all.push(f);
                }
            }
            all
        },
    })
}

/// The new machines of the cluster's current rollout that failed so far.
pub(crate) fn failed_before(cluster: &Cluster) -> &[RolloutHalt] {
    cluster
        .status
        .rollout
        .as_ref()
        .filter(|r| r.target == target(cluster))
        .map_or(&[], |r| r.failures.as_slice())
}

/// Whether the recorded rollout of `cluster` is halted for its current
/// target.
pub(crate) fn is_halted(cluster: &Cluster) -> bool {
    cluster
        .status
        .rollout
        .as_ref()
        .is_some_and(|r| r.halted.is_some() && r.target == target(cluster))
}

/// How long an upgrade of kube-proxy and CoreDNS asked of a control plane
/// may stay unreported, or stand failed, before it is asked again (perhaps
/// of another control plane).
pub const ESSENTIAL_ADDONS_RETRY: time::Duration = time::Duration::seconds(60);

/// Plans the upgrade of kube-proxy and CoreDNS (kubeadm's essential
/// addons) to `wanted`, the version of a rollout whose last new control
/// plane is in (`None`: nothing asks for one now), through a running
/// control plane of `via`: real `kubeadm join` never touches them, and a
/// provider cluster's machines are replaced, never upgraded with `kubeadm
/// upgrade apply`, which would upgrade them after the control plane
/// (kubeadm's `phases/upgrade/postupgrade.go`; Cluster API's
/// KubeadmControlPlane updates both on every reconcile). A request stands
/// until the machine reports it done, and is asked again (a new directive,
/// of the first of `via` if its machine no longer runs) a while after it
/// was made or failed; one done stays recorded, one under way that nothing
/// wants any more is dropped.
pub(crate) fn plan_essential_addons(
    cluster: &Cluster,
    wanted: Option<&str>,
    via: &[&Machine],
    now: OffsetDateTime,
) -> Option<EssentialAddonsUpgrade> {
    let current = cluster.status.essential_addons.as_ref();
    let Some(wanted) = wanted else {
        return current.filter(|u| u.is_done()).cloned();
    };
    let same = current.filter(|u| u.version == wanted);
    if let Some(u) = same {
        let standing = now - u.requested_at < ESSENTIAL_ADDONS_RETRY
            && via.iter().any(|m| m.metadata.name == u.via);
        if u.is_done() || standing {
            return Some(u.clone());
        }
    }
    let Some(first) = via.first() else {
        return current.cloned();
    };
    Some(EssentialAddonsUpgrade {
        version: wanted.to_owned(),
        via: first.metadata.name.clone(),
        requested_at: now,
        done_at: None,
        message: String::new(),
        // Why the last attempt failed stays until this one reports.
        error: same.map(|u| u.error.clone()).unwrap_or_default(),
    })
}

/// What a rollout waits for while kube-proxy and CoreDNS are upgraded
/// to `version` (`upgrade` as planned).
pub(crate) fn essential_addons_waiting(
    version: &str,
    upgrade: Option<&EssentialAddonsUpgrade>,
    now: OffsetDateTime,
) -> String {
    match upgrade.filter(|u| u.version == version) {
        Some(u) => {
            let mut why = format!(
                "kube-proxy and CoreDNS to be upgraded to {version}'s images by control plane {} (asked {}s ago)",
                u.via,
                (now - u.requested_at).whole_seconds().max(0)
            );
            if !u.error.is_empty() {
                why.push_str(&format!("; the last attempt failed: {}", u.error));
            }
            why
        }
        None => format!(
            "a running control plane to upgrade kube-proxy and CoreDNS to {version}'s images"
        ),
    }
}

/// The cluster condition that says what a rollout waits for.
pub const ROLLOUT_WAITING_CONDITION: &str = "RolloutWaiting";

/// Sets or clears the `RolloutWaiting` condition from the rollout status:
/// True with what the rollout waits for while it takes no step.
pub(crate) fn set_waiting_condition(status: &mut drover_common::api::ClusterStatus) {
    let waiting = status.rollout.as_ref().and_then(|r| r.waiting_for.clone());
    let set = waiting.map(|why| ("Waiting", format!("the rollout waits for {why}")));
    set_or_clear(status, ROLLOUT_WAITING_CONDITION, set, "NotWaiting", |c| {
        c.status == "True"
    });
}

/// Sets or clears the `UpgradeHalted` condition from the rollout status.
pub(crate) fn set_halted_condition(status: &mut drover_common::api::ClusterStatus) {
    let halted = status.rollout.as_ref().and_then(|r| r.halted.as_ref());
    let set = halted.map(|h| {
        (
            "NewMachineFailed",
            format!(
                "the rollout to {} halted at machine {} (step {}): {}; nothing more is replaced until the spec changes or `drover rollout resume`",
                status.rollout.as_ref().map_or("", |r| r.version.as_str()),
                h.machine,
                h.step,
                h.reason
            ),
        )
    });
    set_or_clear(status, UPGRADE_HALTED_CONDITION, set, "NotHalted", |_| true);
}

/// Sets condition `type_` True with `set`'s reason and message, or, without
/// `set`, False with reason `cleared` where a condition `stale` finds
/// (none is added).
fn set_or_clear(
    status: &mut drover_common::api::ClusterStatus,
    type_: &str,
    set: Option<(&str, String)>,
    cleared: &str,
    stale: impl Fn(&drover_common::api::Condition) -> bool,
) {
    let (ok, reason, message) = match &set {
        Some((reason, message)) => (true, *reason, message.as_str()),
        None if status
            .conditions
            .iter()
            .any(|c| c.type_ == type_ && stale(c)) =>
        {
            (false, cleared, "")
        }
        None => return,
    };
    drover_common::api::set_condition(&mut status.conditions, type_, ok, reason, message);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{running, t0};
    use drover_common::api::{ClusterNode, MachineRole};

    fn cluster(version: &str, image: &str) -> Cluster {
        crate::fixtures::cluster(
            version,
            1,
            2,
            serde_json::json!({"docker": {"image": image}}),
        )
    }

    fn machine(name: &str, version: &str, image: &str, age_s: i64) -> Machine {
        let mut m = running(name, "w", MachineRole::Worker);
        m.metadata.creation_timestamp = Some(t0() - time::Duration::seconds(age_s));
        let a = m.spec.assignment.as_mut().unwrap();
        a.kubernetes_version = Some(version.into());
        a.image = Some(image.into());
        m
    }

    fn ready_since(c: &mut Cluster, name: &str, ago_s: i64) {
        c.status.nodes.push(ClusterNode {
            message: String::new(),
            name: name.into(),
            ready: "True".into(),
            since: Some(t0() - time::Duration::seconds(ago_s)),
            unschedulable: false,
            kubelet_version: String::new(),
        });
    }

    /// The worker pool `w` of two, free to step.
    fn input<'a, 'm>(
        remaining: &'a [&'m Machine],
        unhealthy: &'a [(&'m Machine, String)],
    ) -> PoolRoll<'a, 'm> {
        PoolRoll {
            pool: "w",
            desired: 2,
            control_plane: false,
            policy: None,
            remaining,
            unhealthy,
            failed_before: &[],
            blocked: None,
            halted: false,
            leaving: &[],
        }
    }

    fn roll<'m>(
        c: &Cluster,
        remaining: &[&'m Machine],
        unhealthy: &[(&'m Machine, String)],
    ) -> Roll<'m> {
        roll_pool(c, &input(remaining, unhealthy), t0())
    }

    /// [`roll`] after a pass that recorded `failed_before`.
    fn roll_after<'m>(
        c: &Cluster,
        failed_before: &[RolloutHalt],
        remaining: &[&'m Machine],
        unhealthy: &[(&'m Machine, String)],
    ) -> Roll<'m> {
        let again = PoolRoll {
            failed_before,
            ..input(remaining, unhealthy)
        };
        roll_pool(c, &again, t0())
    }

    #[test]
    fn a_version_or_image_change_makes_machines_outdated() {
        let c = cluster("v1.32.0", "node:v1.32.0");
        let outdated = |m: &Machine| is_outdated(&c, m, t0());
        assert!(outdated(&machine("a", "v1.31.2", "node:v1.31.2", 9)));
        assert!(outdated(&machine("b", "v1.32.0", "node:other", 9)));
        assert!(!outdated(&machine("d", "v1.32.0", "node:v1.32.0", 9)));
        let mut legacy = machine("e", "v1.31.2", "x", 9);
        legacy.spec.assignment.as_mut().unwrap().kubernetes_version = None;
        legacy.spec.assignment.as_mut().unwrap().image = None;
        assert!(!outdated(&legacy), "nothing recorded: current");
    }

    #[test]
    fn a_control_plane_whose_certificates_expire_within_the_window_is_outdated() {
        let mut c = cluster("v1.32.0", "node:v1.32.0");
        let mut cp = machine("cp", "v1.32.0", "node:v1.32.0", 9);
        cp.spec.assignment.as_mut().unwrap().role = MachineRole::ControlPlane;
        let expiring = |m: &mut Machine, days: i64| {
            m.status.certificates = Some(CertificateExpiry {
                certificate: "pki/apiserver.crt".into(),
                expires_at: t0() + time::Duration::days(days),
            });
        };
        // Default window: 30 days.
        expiring(&mut cp, 31);
        assert!(!is_outdated(&c, &cp, t0()));
        expiring(&mut cp, 29);
        assert!(is_outdated(&c, &cp, t0()));
        assert_eq!(
            expiring_certificates(&c, &cp, t0()).unwrap().certificate,
            "pki/apiserver.crt"
        );
        // A wider window, from the spec.
        expiring(&mut cp, 59);
        assert!(!is_outdated(&c, &cp, t0()));
        c.spec.upgrade.as_mut().unwrap().renew_certificates_before = Some("60d".into());
        assert!(is_outdated(&c, &cp, t0()));
        // A worker's certificates are not the control plane's.
        let mut w = machine("w", "v1.32.0", "node:v1.32.0", 9);
        expiring(&mut w, 1);
        assert!(!is_outdated(&c, &w, t0()));
    }

    #[test]
    fn a_worker_pool_surges_one_canary_waits_for_it_to_settle_then_retires_the_oldest() {
        let mut c = cluster("v1.32.0", "node:v1.32.0");
        let old1 = machine("old1", "v1.31.2", "node:v1.31.2", 900);
        let old2 = machine("old2", "v1.31.2", "node:v1.31.2", 800);
        // Step 1: one new machine above the replicas, nothing retired.
        let r = roll(&c, &[&old1, &old2], &[]);
        assert_eq!((r.ceiling, r.retire.len()), (3, 0));
        assert!(r.rolling && r.halt.is_none());
        assert_eq!((r.progress.updated, r.progress.outdated), (0, 2));
        // The canary bootstraps: the pool keeps its three, retires none.
        let mut new1 = machine("new1", "v1.32.0", "node:v1.32.0", 20);
        new1.status.phase = MachinePhase::Bootstrapping;
        let r = roll(&c, &[&old1, &old2, &new1], &[]);
        assert_eq!((r.ceiling, r.retire.len()), (3, 0));
        // Running, its Node Ready for less than the settle time: waits.
        new1.status.phase = MachinePhase::Running;
        ready_since(&mut c, "new1", 10);
        let r = roll(&c, &[&old1, &old2, &new1], &[]);
        assert_eq!((r.ceiling, r.retire.len()), (3, 0));
        // Settled: the oldest outdated machine leaves.
        c.status.nodes.clear();
        ready_since(&mut c, "new1", 31);
        let r = roll(&c, &[&old1, &old2, &new1], &[]);
        assert_eq!(r.ceiling, 3);
        assert_eq!(
            r.retire
                .iter()
                .map(|m| m.metadata.name.as_str())
                .collect::<Vec<_>>(),
            ["old1"]
        );
        assert_eq!(r.progress.updated, 1);
        // Done: nothing outdated, the pool back at its replicas.
        let new2 = machine("new2", "v1.32.0", "node:v1.32.0", 5);
        let r = roll(&c, &[&new1, &new2], &[]);
        assert_eq!((r.ceiling, r.retire.len(), r.rolling), (2, 0, false));
    }

    #[test]
    fn a_failing_new_machine_is_replaced_once_and_the_second_halts_the_rollout() {
        let c = cluster("v1.32.0", "node:v1.32.0");
        let old1 = machine("old1", "v1.31.2", "node:v1.31.2", 900);
        let old2 = machine("old2", "v1.31.2", "node:v1.31.2", 800);
        let mut new1 = machine("new1", "v1.32.0", "node:v1.32.0", 700);
        new1.status.phase = MachinePhase::Bootstrapping;
        // The first new machine fails (and is replaced this pass, so it is
        // not among the remaining machines): recorded, no halt.
        let unhealthy = [(&new1, "did not start within 10m".to_string())];
        let r = roll(&c, &[&old1, &old2], &unhealthy);
        assert!(r.halt.is_none(), "{:?}", r.halt);
        assert_eq!(r.failures.len(), 1);
        assert_eq!(
            (r.failures[0].machine.as_str(), r.failures[0].step.as_str()),
            ("new1", "bootstrap")
        );
        let failed_before = r.failures.clone();
        // Found again in a later pass, it is not counted twice.
        let r = roll_after(&c, &failed_before, &[&old1, &old2, &new1], &unhealthy);
        assert!(r.halt.is_none() && r.failures.is_empty(), "{r:?}");
        // Its replacement fails too, after joining: the rollout halts,
        // naming both machines and why each failed.
        let new2 = machine("new2", "v1.32.0", "node:v1.32.0", 100);
        let unhealthy = [(&new2, "silent for 41s".to_string())];
        let r = roll_after(&c, &failed_before, &[&old1, &old2, &new2], &unhealthy);
        let halt = r.halt.expect("halted");
        assert_eq!(
            (halt.machine.as_str(), halt.step.as_str()),
            ("new2", "health")
        );
        assert_eq!(
            halt.reason,
            "2 new machines failed: new1 (bootstrap: did not start within 10m); new2 (health: silent for 41s)"
        );
        // The pool goes back to its replicas; nothing retired.
        assert_eq!((r.ceiling, r.retire.len()), (2, 0));
        // An outdated machine failing is not the rollout's failure.
        let r = roll(&c, &[&old2], &[(&old1, "silent for 41s".to_string())]);
        assert!(r.failures.is_empty() && r.halt.is_none());
        // Once recorded, the halt holds after the failed machine is gone.
        let r = roll_pool(
            &c,
            &PoolRoll {
                halted: true,
                ..input(&[&old1, &old2], &[])
            },
            t0(),
        );
        assert_eq!((r.ceiling, r.retire.len()), (2, 0));
    }

    #[test]
    fn a_waiting_rollout_says_what_for() {
        let mut c = cluster("v1.32.0", "node:v1.32.0");
        let old1 = machine("old1", "v1.31.2", "node:v1.31.2", 900);
        let old2 = machine("old2", "v1.31.2", "node:v1.31.2", 800);
        let mut new1 = machine("new1", "v1.32.0", "node:v1.32.0", 20);
        new1.status.hostname = "new1".into();
        new1.status.phase = MachinePhase::Bootstrapping;
        let waiting = |c: &Cluster, new1: &Machine| {
            roll(c, &[&old1, &old2, new1], &[])
                .waiting
                .unwrap_or_default()
        };
        assert_eq!(
            waiting(&c, &new1),
            "new machine new1 to run (it is Bootstrapping)"
        );
        new1.status.phase = MachinePhase::Running;
        assert!(
            waiting(&c, &new1).contains("Node of new machine new1 (new1) to register"),
            "{}",
            waiting(&c, &new1)
        );
        // Joined, and NotReady for want of a pod network: said so.
        c.status.nodes.push(ClusterNode {
            message: "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized".into(),
            name: "new1".into(),
            ready: "False".into(),
            since: Some(t0()),
            unschedulable: false,
            kubelet_version: String::new(),
        });
        let w = waiting(&c, &new1);
        assert!(
            w.starts_with(
                "Node new1 of new machine new1 to be Ready: it is NotReady: no pod network"
            ),
            "{w}"
        );
        c.status.nodes.clear();
        ready_since(&mut c, "new1", 10);
        assert_eq!(
            waiting(&c, &new1),
            "Node new1 of new machine new1 to stay Ready for 30s (Ready for 10s)"
        );
        // Blocked by something else: that reason.
        let r = roll_pool(
            &c,
            &PoolRoll {
                blocked: Some("pool control-plane to finish its rollout first".into()),
                ..input(&[&old1, &old2, &new1], &[])
            },
            t0(),
        );
        assert_eq!(
            r.waiting.as_deref(),
            Some("pool control-plane to finish its rollout first")
        );
        // Stepping: not waiting.
        c.status.nodes.clear();
        ready_since(&mut c, "new1", 31);
        let r = roll(&c, &[&old1, &old2, &new1], &[]);
        assert!(r.waiting.is_none() && !r.retire.is_empty(), "{r:?}");
        // The condition carries it.
        let mut st = c.status.clone();
        st.rollout = rollout_status(
            &c,
            vec![],
            true,
            None,
            vec![],
            Some("w: Node new1 of new machine new1 to be Ready".into()),
            t0(),
        );
        set_waiting_condition(&mut st);
        let cond = st
            .conditions
            .iter()
            .find(|x| x.type_ == ROLLOUT_WAITING_CONDITION)
            .unwrap();
        assert_eq!(cond.status, "True");
        assert!(
            cond.message.contains("waits for w: Node new1"),
            "{}",
            cond.message
        );
        st.rollout = None;
        set_waiting_condition(&mut st);
        assert!(st
            .conditions
            .iter()
            .any(|x| x.type_ == ROLLOUT_WAITING_CONDITION && x.status == "False"));
    }

    /// The whole provider planner, as the reconciler runs it, at `t0() +
    /// after_s`: every machine heard from just now.
    fn plan_at(c: &Cluster, machines: &[Machine], after_s: i64) -> Vec<crate::Step> {
        let now = t0() + time::Duration::seconds(after_s);
        let seen = move |_: &str| Some(now);
        let no_instance = |_: &str| None;
        let no_retry = |_: &str| None;
        let observed = crate::Observed {
            now,
            has_pki: true,
            last_seen: &seen,
            instance: &no_instance,
            retry_not_before: &no_retry,
            policy: crate::health::Policy::defaults(std::time::Duration::from_secs(40)),
            heartbeat_interval: std::time::Duration::from_secs(10),
        };
        crate::plan(c, machines, &observed)
    }

    fn planned_status(steps: &[crate::Step]) -> drover_common::api::ClusterStatus {
        steps
            .iter()
            .find_map(|s| match s {
                crate::Step::SetStatus(st) => Some((**st).clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("a status step: {steps:?}"))
    }

    #[test]
    fn kube_proxy_and_coredns_follow_the_last_new_control_plane_and_end_the_rollout() {
        let mut c = cluster("v1.32.0", "node:test");
        c.spec.worker_pools[0].replicas = 1;
        c.status.initialized = true;
        c.status.kubeadm_config_version = Some("v1.32.0".into());
        c.status.endpoint_ready = Some(true);
        let made_for = |name: &str, pool: &str, role: MachineRole, version: &str| {
            let mut m = running(name, pool, role);
            m.status.provider_id = Some(format!("ctr-{name}"));
            m.metadata.creation_timestamp = Some(t0() - time::Duration::hours(1));
            let a = m.spec.assignment.as_mut().unwrap();
            a.kubernetes_version = Some(version.into());
            a.image = Some("node:test".into());
            m
        };
        let cp_old = made_for("cp-old", "control-plane", MachineRole::Init, "v1.31.2");
        let cp_new = made_for(
            "cp-new",
            "control-plane",
            MachineRole::ControlPlane,
            "v1.32.0",
        );
        let w_old = made_for("w-old", "w", MachineRole::Worker, "v1.31.2");
        let w_new = made_for("w-new", "w", MachineRole::Worker, "v1.32.0");
        for n in ["cp-old", "cp-new", "w-old", "w-new"] {
            ready_since(&mut c, n, 3600);
        }
        let asks = |steps: &[crate::Step]| planned_status(steps).essential_addons;

        // An outdated control plane is still in: nothing asked yet.
        let steps = plan_at(&c, &[cp_old.clone(), cp_new.clone(), w_old.clone()], 0);
        assert_eq!(asks(&steps), None);
        c.status.rollout = planned_status(&steps).rollout;
        assert!(c.status.rollout.is_some());

        // The last new control plane is in (workers still roll): asked of
        // it, once.
        let steps = plan_at(&c, &[cp_new.clone(), w_old.clone()], 0);
        let asked = asks(&steps).expect("asked once the control plane is new");
        assert_eq!(
            (asked.version.as_str(), asked.via.as_str(), asked.done_at),
            ("v1.32.0", "cp-new", None)
        );
        assert_eq!(
            asked.directive_id(),
            format!("essential-addons-v1.32.0-{}", t0().unix_timestamp())
        );
        c.status.essential_addons = Some(asked.clone());
        c.status.rollout = planned_status(&steps).rollout;
        let steps = plan_at(&c, &[cp_new.clone(), w_old.clone()], 10);
        assert_eq!(asks(&steps), Some(asked.clone()), "the same request stands");

        // Every machine is new, but the upgrade is not reported: the
        // rollout is not done, and says what it waits for.
        let machines = [cp_new.clone(), w_new.clone()];
        let steps = plan_at(&c, &machines, 20);
        let st = planned_status(&steps);
        let rollout = st
            .rollout
            .clone()
            .expect("the rollout waits for the addons");
        let waiting = rollout.waiting_for.unwrap_or_default();
        assert!(
            waiting.contains(
                "kube-proxy and CoreDNS to be upgraded to v1.32.0's images by control plane cp-new"
            ),
            "{waiting}"
        );
        assert!(st
            .conditions
            .iter()
            .any(|x| x.type_ == ROLLOUT_WAITING_CONDITION
                && x.status == "True"
                && x.message.contains("kube-proxy and CoreDNS")));
        c.status.rollout = st.rollout;

        // A failure is said, and asked again a while later (a new directive).
        c.status.essential_addons.as_mut().unwrap().error =
            "update DaemonSet kube-system/kube-proxy failed: 409 Conflict".into();
        let st = planned_status(&plan_at(&c, &machines, 30));
        assert!(st
            .rollout
            .and_then(|r| r.waiting_for)
            .unwrap_or_default()
            .contains("the last attempt failed: update DaemonSet"));
        let again = asks(&plan_at(&c, &machines, 61)).unwrap();
        assert_eq!(again.requested_at, t0() + time::Duration::seconds(61));
        assert_ne!(again.directive_id(), asked.directive_id());
        assert!(again.error.contains("409 Conflict") && again.done_at.is_none());

        // Reported done: the rollout ends; the record stays.
        let mut done = asked.clone();
        done.done_at = Some(t0() + time::Duration::seconds(25));
        done.message = "DaemonSet kube-system/kube-proxy image registry.k8s.io/kube-proxy:v1.31.2 -> registry.k8s.io/kube-proxy:v1.32.0".into();
        c.status.essential_addons = Some(done.clone());
        let st = planned_status(&plan_at(&c, &machines, 30));
        assert_eq!(st.rollout, None);
        assert_eq!(st.essential_addons, Some(done.clone()));
        c.status.rollout = None;
        // A cluster that is not rolling asks nothing more.
        let steps = plan_at(&c, &machines, 600);
        assert!(steps.iter().all(|s| match s {
            crate::Step::SetStatus(st) => st.essential_addons == Some(done.clone()),
            _ => true,
        }));
    }

    #[test]
    fn a_control_plane_without_surge_is_replaced_in_place_one_at_a_time() {
        let c = cluster("v1.32.0", "node:v1.32.0");
        let cps: Vec<Machine> = (0..3)
            .map(|i| machine(&format!("cp{i}"), "v1.31.2", "node:v1.31.2", 900 - i))
            .collect();
        let refs: Vec<&Machine> = cps.iter().collect();
        let policy = RolloutPolicy {
            max_surge: Some(0),
            max_unavailable: None,
        };
        let cp = PoolRoll {
            pool: "control-plane",
            desired: 3,
            control_plane: true,
            policy: Some(&policy),
            ..input(&refs, &[])
        };
        let r = roll_pool(&c, &cp, t0());
        assert_eq!(r.ceiling, 3);
        let names = |r: &Roll<'_>| -> Vec<String> {
            r.retire.iter().map(|m| m.metadata.name.clone()).collect()
        };
        assert_eq!(names(&r), ["cp0"]);
        // While another change is under way, nothing happens...
        let waiting = PoolRoll {
            blocked: Some("machine x is leaving".into()),
            ..cp
        };
        let r = roll_pool(&c, &waiting, t0());
        assert_eq!((r.ceiling, r.retire.len()), (3, 0));
        // ...but a control plane already leaving (its member removed) goes
        // on leaving.
        let leaving = [&cps[1]];
        let r = roll_pool(
            &c,
            &PoolRoll {
                leaving: &leaving,
                ..waiting
            },
            t0(),
        );
        assert_eq!(names(&r), ["cp1"]);
    }

    #[test]
    fn the_status_keeps_its_start_and_halt_until_the_target_changes() {
        let mut c = cluster("v1.32.0", "node:v1.32.0");
        let halt = RolloutHalt {
            machine: "new1".into(),
            step: "health".into(),
            reason: "Node not Ready".into(),
            at: t0(),
        };
        let s = rollout_status(&c, vec![], true, Some(halt.clone()), vec![], None, t0()).unwrap();
        assert_eq!(
            s.target,
            "v1.32.0 control-plane=node:v1.32.0 w=node:v1.32.0"
        );
        c.status.rollout = Some(s);
        assert!(is_halted(&c));
        let later = t0() + time::Duration::seconds(60);
        let s = rollout_status(&c, vec![], true, None, vec![], None, later).unwrap();
        assert_eq!((s.started_at, s.halted.as_ref()), (t0(), Some(&halt)));
        set_halted_condition(&mut c.status);
        assert!(c
            .status
            .conditions
            .iter()
            .any(|x| x.type_ == UPGRADE_HALTED_CONDITION
                && x.status == "True"
                && x.message.contains("new1")));
        // A new target (another image) starts over, not halted.
        let mut d = c.clone();
        if let drover_common::api::ProviderSpec::Docker(p) = &mut d.spec.provider {
            p.image = "node:v1.32.1".into();
        }
        assert!(!is_halted(&d));
        let s = rollout_status(&d, vec![], true, None, vec![], None, later).unwrap();
        assert_eq!((s.started_at, s.halted), (later, None));
        assert!(rollout_status(&d, vec![], false, None, vec![], None, later).is_none());
    }
}
