//! Rollouts of provider clusters (docker, aws): a machine made for another
//! Kubernetes version or image than the spec names is replaced, never
//! patched. Pools roll one at a time, the control plane first; each new
//! machine must settle (Running, healthy, its Node Ready for the settle
//! time) before the next step, and a new machine that fails halts the
//! rollout until the spec changes or an operator resumes it.
//!
//! This module decides, per pool, how far the pool may grow this pass and
//! which outdated machines leave; `provider.rs` turns that into the same
//! create and delete steps as scaling, so an outdated machine leaves by
//! the safe path (load balancer first, drain, etcd member, Node).

use drover_common::api::{
    CertificateExpiry, Cluster, Machine, MachinePhase, PoolRollout, RolloutHalt, RolloutPolicy,
    RolloutStatus, UpgradePolicy,
};
use time::OffsetDateTime;

/// The cluster condition that says a rollout halted.
pub const UPGRADE_HALTED_CONDITION: &str = "UpgradeHalted";

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
fn made_for_another(cluster: &Cluster, m: &Machine) -> bool {
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
    /// The pool's unhealthy machines, with why.
    pub unhealthy: &'a [(&'m Machine, String)],
    /// Whether the pool may take a step now: nothing else changes in it,
    /// the earlier pools are done, and (control plane) etcd is whole.
    pub may_step: bool,
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
    /// A new machine failed: the rollout halts.
    pub halt: Option<RolloutHalt>,
    /// The pool has outdated machines, or a surplus still to shed.
    pub rolling: bool,
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
        rolling: !outdated.is_empty(),
    };
    if outdated.is_empty() {
        return roll;
    }
    // A new machine that fails halts the rollout: the pool goes back to
    // its replicas of outdated machines (the surplus is shed).
    roll.halt = updated.iter().find_map(|m| {
        input
            .unhealthy
            .iter()
            .find(|(u, _)| u.metadata.name == m.metadata.name)
            .map(|(_, why)| RolloutHalt {
                machine: m.metadata.name.clone(),
                step: if m.status.phase == MachinePhase::Running {
                    "health".into()
                } else {
                    "bootstrap".into()
                },
                reason: why.clone(),
                at: now,
            })
    });
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
    if !input.may_step {
        return roll;
    }
    let settle = UpgradePolicy::settle_time(cluster.spec.upgrade.as_ref());
    let settled = |m: &Machine| settled(cluster, m, settle, now);
    if updated.iter().any(|m| !settled(m)) {
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

/// Whether a new machine has settled: Running, and its Node Ready for
/// `settle`.
fn settled(
    cluster: &Cluster,
    m: &Machine,
    settle: std::time::Duration,
    now: OffsetDateTime,
) -> bool {
    m.status.phase == MachinePhase::Running
        && cluster.status.nodes.iter().any(|n| {
            n.name == m.status.hostname
                && n.ready == "True"
                && n.since.is_none_or(|t| now - t >= settle)
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
    })
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

/// Sets or clears the `UpgradeHalted` condition from the rollout status.
pub(crate) fn set_halted_condition(status: &mut drover_common::api::ClusterStatus) {
    let halted = status.rollout.as_ref().and_then(|r| r.halted.as_ref());
    match halted {
        Some(h) => {
            drover_common::api::set_condition(
                &mut status.conditions,
                UPGRADE_HALTED_CONDITION,
                true,
                "NewMachineFailed",
                &format!(
                    "the rollout to {} halted at machine {} (step {}): {}; nothing more is replaced until the spec changes or `drover rollout resume`",
                    status.rollout.as_ref().map_or("", |r| r.version.as_str()),
                    h.machine,
                    h.step,
                    h.reason
                ),
            );
        }
        None => {
            if status
                .conditions
                .iter()
                .any(|c| c.type_ == UPGRADE_HALTED_CONDITION)
            {
                drover_common::api::set_condition(
                    &mut status.conditions,
                    UPGRADE_HALTED_CONDITION,
                    false,
                    "NotHalted",
                    "",
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{running, t0};
    use super::*;
    use drover_common::api::{ClusterNode, MachineRole};

    fn cluster(version: &str, image: &str) -> Cluster {
        super::super::fixtures::cluster(
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
            may_step: true,
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
    fn a_failing_new_machine_halts_the_rollout_and_the_surplus_goes() {
        let c = cluster("v1.32.0", "node:v1.32.0");
        let old1 = machine("old1", "v1.31.2", "node:v1.31.2", 900);
        let old2 = machine("old2", "v1.31.2", "node:v1.31.2", 800);
        let mut new1 = machine("new1", "v1.32.0", "node:v1.32.0", 700);
        new1.status.phase = MachinePhase::Bootstrapping;
        let unhealthy = [(&new1, "did not start within 10m".to_string())];
        let r = roll(&c, &[&old1, &old2, &new1], &unhealthy);
        let halt = r.halt.expect("halted");
        assert_eq!(
            (halt.machine.as_str(), halt.step.as_str()),
            ("new1", "bootstrap")
        );
        assert_eq!(halt.reason, "did not start within 10m");
        // The pool goes back to its replicas; nothing retired.
        assert_eq!((r.ceiling, r.retire.len()), (2, 0));
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
            may_step: false,
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
        let s = rollout_status(&c, vec![], true, Some(halt.clone()), t0()).unwrap();
        assert_eq!(
            s.target,
            "v1.32.0 control-plane=node:v1.32.0 w=node:v1.32.0"
        );
        c.status.rollout = Some(s);
        assert!(is_halted(&c));
        let later = t0() + time::Duration::seconds(60);
        let s = rollout_status(&c, vec![], true, None, later).unwrap();
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
        let s = rollout_status(&d, vec![], true, None, later).unwrap();
        assert_eq!((s.started_at, s.halted), (later, None));
        assert!(rollout_status(&d, vec![], false, None, later).is_none());
    }
}
