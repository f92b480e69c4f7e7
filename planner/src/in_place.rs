//! In-place upgrades of pool clusters. Pool machines are hardware, so they
//! upgrade where they stand, one machine at a time, the control plane
//! first: its Node is drained, the machine runs its image's
//! `upgrade-kubeadm` hook, `kubeadm upgrade apply VERSION` (the first
//! control plane) or `kubeadm upgrade node` (every other machine) and its
//! `upgrade-kubelet` hook, a control plane uncordons the Node, and the
//! machine must stay Running, healthy and Ready for the settle time
//! before the next one starts. A step that fails or takes too long halts
//! the rollout (`UpgradeHalted`) until the spec changes or an operator
//! resumes it.
//!
//! A machine's version is its Node's kubelet version, as the control
//! planes report it: the version that runs, not the one asked for.

use drover_common::api::{
    Cluster, DrainPolicy, DrainResult, Machine, MachinePhase, MachineUpgrade, MachineUpgradeStep,
    PoolRollout, RolloutHalt, RolloutStatus, UpgradeCommand, UpgradePolicy, CONTROL_PLANE_POOL,
};
use time::OffsetDateTime;

use super::rollout::{is_halted, rollout_status};
use super::shared::is_control_plane;

/// How long a machine may take to upgrade itself (both hooks and kubeadm)
/// before the rollout halts.
pub const UPGRADE_TIMEOUT: time::Duration = time::Duration::minutes(30);

/// How long an uncordon may go unanswered, or wait after a failure, before
/// it is asked again.
pub const UNCORDON_RESEND: time::Duration = time::Duration::seconds(60);
pub const UNCORDON_RETRY: time::Duration = time::Duration::seconds(10);

/// How long past the settle time a machine may take to come back (Running,
/// healthy, its Node Ready and schedulable at the new version) before the
/// rollout halts.
pub const SETTLE_TIMEOUT: time::Duration = time::Duration::minutes(10);

/// How long a drain may take to be asked for at all (the machine is silent
/// or its Node not Ready, so nothing drains it) before the rollout halts.
pub const DRAIN_START_TIMEOUT: time::Duration = time::Duration::minutes(2);

/// The cluster as the in-place planner sees it in one pass.
pub(crate) struct InPlace<'a, 'm> {
    /// The members (not leaving), control planes first, then each worker
    /// pool in spec order.
    pub members: &'a [&'m Machine],
    /// The names of unhealthy members, with why.
    pub unhealthy: &'a [(String, String)],
    /// Whether a machine may start its upgrade: every pool is whole and
    /// Running, etcd settled, nothing else changes.
    pub may_start: bool,
    /// Whether a machine is heard from.
    pub alive: &'a dyn Fn(&str) -> bool,
}

/// What the pass records: the upgrade under way and the rollout status.
#[derive(Debug, Default)]
pub(crate) struct InPlacePlan {
    pub upgrade: Option<MachineUpgrade>,
    pub rollout: Option<RolloutStatus>,
    /// A machine whose upgrade settled this pass, and its new version.
    pub upgraded: Option<(String, String)>,
}

/// Plans one pass of a pool cluster's in-place upgrade. Pure.
pub(crate) fn plan_in_place(
    cluster: &Cluster,
    input: &InPlace<'_, '_>,
    now: OffsetDateTime,
) -> InPlacePlan {
    let target = &cluster.spec.kubernetes_version;
    let version_of = |m: &Machine| kubelet_version(cluster, m);
    let at_target = |m: &Machine| version_of(m).is_some_and(|v| same_version(v, target));
    let outdated = |m: &Machine| version_of(m).is_some_and(|v| !same_version(v, target));
    let mut halt = None;
    let mut upgraded = None;
    let upgrade = match cluster
        .status
        .machine_upgrade
        .as_ref()
        .filter(|u| u.version == *target)
    {
        Some(u) => match input.members.iter().find(|m| m.metadata.name == u.machine) {
            Some(m) => match advance(cluster, input, u, m, now) {
                Ok(Some(next)) => Some(next),
                Ok(None) => {
                    upgraded = Some((u.machine.clone(), u.version.clone()));
                    None
                }
                Err(h) => {
                    halt = Some(h);
                    None
                }
            },
            // The machine left (remediated, or released): nothing to finish.
            None => None,
        },
        None => None,
    };
    let halted = is_halted(cluster) || halt.is_some();
    let upgrade = match upgrade {
        Some(u) => Some(u),
        None if !halted && input.may_start => start_next(cluster, input, now),
        None => None,
    };
    let mut pools: Vec<PoolRollout> = cluster
        .desired_pools()
        .into_iter()
        .map(|(name, desired)| PoolRollout {
            name,
            updated: 0,
            desired,
            outdated: 0,
        })
        .collect();
    for m in input.members {
        let pool = m
            .spec
            .assignment
            .as_ref()
            .map_or("", |a| a.machine_pool.as_str());
        let Some(p) = pools.iter_mut().find(|p| p.name == pool) else {
            continue;
        };
        if at_target(m) && m.status.phase == MachinePhase::Running {
            p.updated += 1;
        } else if outdated(m) {
            p.outdated += 1;
        }
    }
    // A halt stands until resumed, even when it was the last machine's.
    let rolling = upgrade.is_some() || halted || input.members.iter().any(|m| outdated(m));
    // What the rollout waits for, said while it waits: a machine in its
    // step that is silent, an unhealthy member, another change.
    let waiting = if halted || !rolling {
        None
    } else if let Some(u) = &upgrade {
        if !(input.alive)(&u.machine) {
            Some(format!(
                "machine {} is silent during its in-place upgrade (step {}): it goes on once it heartbeats again, or the rollout halts after the step's timeout",
                u.machine, u.step
            ))
        } else {
            Some(format!("machine {} to finish step {}", u.machine, u.step))
        }
    } else if let Some((m, why)) = input.unhealthy.first() {
        Some(format!("machine {m} to be healthy: {why}"))
    } else if !input.may_start {
        Some(
            "every pool to be whole and Running, etcd settled and no other change under way".into(),
        )
    } else {
        None
    };
    InPlacePlan {
        rollout: rollout_status(cluster, pools, rolling, halt, vec![], waiting, now),
        upgrade,
        upgraded,
    }
}

/// The version of `m`'s kubelet, from its Node as last reported.
pub(crate) fn kubelet_version<'c>(cluster: &'c Cluster, m: &Machine) -> Option<&'c str> {
    cluster
        .status
        .nodes
        .iter()
        .find(|n| n.name == m.status.hostname && !n.kubelet_version.is_empty())
        .map(|n| n.kubelet_version.as_str())
}

pub(crate) fn same_version(a: &str, b: &str) -> bool {
    a.trim_start_matches('v') == b.trim_start_matches('v')
}

/// Moves the upgrade of `m` on by what was reported since the last pass:
/// the next record, `None` once it settled, or why the rollout halts.
fn advance(
    cluster: &Cluster,
    input: &InPlace<'_, '_>,
    u: &MachineUpgrade,
    m: &Machine,
    now: OffsetDateTime,
) -> Result<Option<MachineUpgrade>, RolloutHalt> {
    let halt = |step: MachineUpgradeStep, reason: String| RolloutHalt {
        machine: u.machine.clone(),
        step: step.to_string(),
        reason,
        at: now,
    };
    let next = |step: MachineUpgradeStep, via: String| MachineUpgrade {
        step,
        via,
        requested_at: now,
        result: None,
        ..u.clone()
    };
    let since = now - u.requested_at;
    match u.step {
        MachineUpgradeStep::Drain => {
            let drain = cluster
                .status
                .drain
                .as_ref()
                .filter(|d| d.machine == u.machine);
            match drain {
                Some(d) if d.result.as_ref().is_some_and(|r| r.ok) => {
                    Ok(Some(next(MachineUpgradeStep::Upgrade, String::new())))
                }
                Some(d) => {
                    let timeout = time::Duration::try_from(DrainPolicy::timeout(
                        cluster.spec.drain.as_ref(),
                    ))
                    .unwrap_or(time::Duration::minutes(10));
                    let force = cluster.spec.drain.as_ref().is_some_and(|p| p.force);
                    let over = now - d.started_at >= timeout;
                    match (over, force) {
                        (true, true) => Ok(Some(next(MachineUpgradeStep::Upgrade, String::new()))),
                        (true, false) => Err(halt(
                            u.step,
                            format!(
                                "draining Node {} failed for {}s: {}; remove what blocks it, or set spec.drain.force",
                                u.node,
                                timeout.whole_seconds(),
                                d.result.as_ref().map_or("no answer", |r| r.message.as_str())
                            ),
                        )),
                        _ => Ok(Some(u.clone())),
                    }
                }
                None if since >= DRAIN_START_TIMEOUT => Err(halt(
                    u.step,
                    format!(
                        "Node {} could not be drained for {}s: the machine is silent or its Node is not Ready",
                        u.node,
                        DRAIN_START_TIMEOUT.whole_seconds()
                    ),
                )),
                None => Ok(Some(u.clone())),
            }
        }
        MachineUpgradeStep::Upgrade => match &u.result {
            Some(DrainResult { ok: true, .. }) => {
                match uncordon_via(input, m) {
                    Some(via) => Ok(Some(next(MachineUpgradeStep::Uncordon, via))),
                    // No control plane to uncordon through yet: wait.
                    None => Ok(Some(u.clone())),
                }
            }
            Some(DrainResult { ok: false, message }) => Err(halt(u.step, message.clone())),
            None if since >= UPGRADE_TIMEOUT => Err(halt(
                u.step,
                format!(
                    "{} did not report its upgrade within {}m",
                    u.machine,
                    UPGRADE_TIMEOUT.whole_minutes()
                ),
            )),
            None => Ok(Some(u.clone())),
        },
        MachineUpgradeStep::Uncordon => {
            let via_alive = (input.alive)(&u.via);
            let again = match &u.result {
                Some(r) if r.ok => {
                    return Ok(Some(next(MachineUpgradeStep::Settle, String::new())))
                }
                Some(_) => since >= UNCORDON_RETRY,
                None => since >= UNCORDON_RESEND || !via_alive,
            };
            if !again {
                return Ok(Some(u.clone()));
            }
            Ok(Some(match uncordon_via(input, m) {
                Some(via) => next(MachineUpgradeStep::Uncordon, via),
                None => u.clone(),
            }))
        }
        MachineUpgradeStep::Settle => {
            let node = cluster.status.nodes.iter().find(|n| n.name == u.node);
            if let Some((_, why)) = input.unhealthy.iter().find(|(n, _)| *n == u.machine) {
                return Err(halt(u.step, format!("unhealthy after its upgrade: {why}")));
            }
            let back = m.status.phase == MachinePhase::Running
                && node.is_some_and(|n| {
                    n.ready == "True"
                        && !n.unschedulable
                        && same_version(&n.kubelet_version, &u.version)
                });
            let settle =
                time::Duration::try_from(UpgradePolicy::settle_time(cluster.spec.upgrade.as_ref()))
                    .unwrap_or(time::Duration::minutes(2));
            if back && since >= settle {
                return Ok(None);
            }
            if !back && since >= settle + SETTLE_TIMEOUT {
                let seen = node.map_or("not reported".to_owned(), |n| {
                    format!(
                        "Ready {}, {}, kubelet {}",
                        n.ready,
                        if n.unschedulable {
                            "cordoned"
                        } else {
                            "schedulable"
                        },
                        n.kubelet_version
                    )
                });
                return Err(halt(
                    u.step,
                    format!(
                        "Node {} is not back at {} {}s after the upgrade: {seen}",
                        u.node,
                        u.version,
                        since.whole_seconds()
                    ),
                ));
            }
            Ok(Some(u.clone()))
        }
    }
}

/// The next machine to upgrade, if one is outdated and may go: control
/// planes first (the first of them runs `kubeadm upgrade apply`), workers
/// once every control plane runs the target version.
fn start_next(
    cluster: &Cluster,
    input: &InPlace<'_, '_>,
    now: OffsetDateTime,
) -> Option<MachineUpgrade> {
    let target = &cluster.spec.kubernetes_version;
    let version_of = |m: &Machine| kubelet_version(cluster, m);
    // Every member's Node must be reported: a version not known is not
    // known to be current.
    if input.members.iter().any(|m| version_of(m).is_none()) {
        return None;
    }
    let at_target = |m: &&&Machine| version_of(m).is_some_and(|v| same_version(v, target));
    let control_planes: Vec<&&Machine> = input
        .members
        .iter()
        .filter(|m| is_control_plane(m))
        .collect();
    let cp_outdated = control_planes.iter().find(|m| !at_target(m));
    let m = match cp_outdated {
        Some(m) => **m,
        None => *input.members.iter().find(|m| !at_target(m))?,
    };
    let first = is_control_plane(m)
        && !control_planes.iter().any(at_target)
        && cluster
            .status
            .kubeadm_config_version
            .as_deref()
            .is_none_or(|v| !same_version(v, target));
    Some(MachineUpgrade {
        machine: m.metadata.name.clone(),
        node: m.status.hostname.clone(),
        version: target.clone(),
        command: if first {
            UpgradeCommand::Apply
        } else {
            UpgradeCommand::Node
        },
        step: MachineUpgradeStep::Drain,
        started_at: now,
        requested_at: now,
        via: String::new(),
        result: None,
    })
}

/// A running control plane, heard from, to uncordon `m`'s Node through:
/// `m` itself when it is one, else the first other.
fn uncordon_via(input: &InPlace<'_, '_>, m: &Machine) -> Option<String> {
    let mut running: Vec<&&Machine> = input
        .members
        .iter()
        .filter(|c| {
            is_control_plane(c)
                && c.status.phase == MachinePhase::Running
                && (input.alive)(&c.metadata.name)
        })
        .collect();
    running.sort_by_key(|c| (c.metadata.name != m.metadata.name, c.metadata.name.clone()));
    running.first().map(|c| c.metadata.name.clone())
}

/// Orders `members` as the upgrade goes: control planes first, then each
/// worker pool in spec order; by name within a pool.
pub(crate) fn upgrade_order(cluster: &Cluster, members: &mut [&Machine]) {
    let pools: Vec<String> = cluster
        .desired_pools()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    members.sort_by_key(|m| {
        let pool = m
            .spec
            .assignment
            .as_ref()
            .map_or("", |a| a.machine_pool.as_str());
        let rank = if pool == CONTROL_PLANE_POOL {
            0
        } else {
            1 + pools.iter().position(|p| p == pool).unwrap_or(pools.len())
        };
        (rank, m.metadata.name.clone())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{running, t0};
    use drover_common::api::{ClusterNode, MachineRole, NodeDrain};

    fn cluster(version: &str, control_planes: u32) -> Cluster {
        crate::fixtures::cluster(
            version,
            control_planes,
            1,
            serde_json::json!({"pool": {"selector": {"matchLabels": {"env": "dev"}}}}),
        )
    }

    fn machine(name: &str, role: MachineRole) -> Machine {
        let pool = if role == MachineRole::Worker {
            "w"
        } else {
            CONTROL_PLANE_POOL
        };
        running(name, pool, role)
    }

    /// Every machine's Node, Ready at `versions[i]`.
    fn nodes(c: &mut Cluster, machines: &[&Machine], versions: &[&str]) {
        c.status.nodes = machines
            .iter()
            .zip(versions)
            .map(|(m, v)| ClusterNode {
                message: String::new(),
                name: m.status.hostname.clone(),
                ready: "True".into(),
                since: Some(t0() - time::Duration::hours(1)),
                unschedulable: false,
                kubelet_version: (*v).into(),
            })
            .collect();
    }

    /// A cluster of one control plane, `cp`, at v1.32.0, whose Node runs
    /// kubelet `node_version`.
    fn lone_control_plane(node_version: &str) -> (Machine, Cluster) {
        let cp = machine("cp", MachineRole::Init);
        let mut c = cluster("v1.32.0", 1);
        nodes(&mut c, &[&cp], &[node_version]);
        (cp, c)
    }

    fn pass(c: &Cluster, members: &[&Machine], unhealthy: &[(String, String)]) -> InPlacePlan {
        pass_at(c, members, unhealthy, t0())
    }

    fn pass_at(
        c: &Cluster,
        members: &[&Machine],
        unhealthy: &[(String, String)],
        now: OffsetDateTime,
    ) -> InPlacePlan {
        plan_in_place(
            c,
            &InPlace {
                members,
                unhealthy,
                may_start: true,
                alive: &|_| true,
            },
            now,
        )
    }

    #[test]
    fn control_planes_go_first_the_first_with_upgrade_apply() {
        let cps: Vec<Machine> = ["cp-b", "cp-a", "cp-c"]
            .iter()
            .map(|n| machine(n, MachineRole::ControlPlane))
            .collect();
        let w = machine("a-worker", MachineRole::Worker);
        let mut members: Vec<&Machine> = cps.iter().chain([&w]).collect();
        let mut c = cluster("v1.32.0", 3);
        upgrade_order(&c, &mut members);
        let names: Vec<&str> = members.iter().map(|m| m.metadata.name.as_str()).collect();
        assert_eq!(names, ["cp-a", "cp-b", "cp-c", "a-worker"]);

        // Nothing starts while a Node's version is not known.
        nodes(&mut c, &members[..3], &["v1.31.2"; 3]);
        let p = pass(&c, &members, &[]);
        assert!(p.upgrade.is_none());
        assert_eq!(p.rollout.as_ref().unwrap().pools[0].outdated, 3);

        nodes(&mut c, &members, &["v1.31.2"; 4]);
        let u = pass(&c, &members, &[]).upgrade.unwrap();
        assert_eq!(
            (u.machine.as_str(), u.command, u.step),
            ("cp-a", UpgradeCommand::Apply, MachineUpgradeStep::Drain)
        );
        // Once one control plane runs the new version, the others run
        // `upgrade node`; the worker waits for all three.
        nodes(
            &mut c,
            &members,
            &["v1.32.0", "v1.31.2", "v1.31.2", "v1.31.2"],
        );
        let u = pass(&c, &members, &[]).upgrade.unwrap();
        assert_eq!(
            (u.machine.as_str(), u.command),
            ("cp-b", UpgradeCommand::Node)
        );
        nodes(
            &mut c,
            &members,
            &["v1.32.0", "v1.32.0", "v1.32.0", "v1.31.2"],
        );
        let p = pass(&c, &members, &[]);
        let u = p.upgrade.unwrap();
        assert_eq!(
            (u.machine.as_str(), u.command),
            ("a-worker", UpgradeCommand::Node)
        );
        let pools = &p.rollout.unwrap().pools;
        assert_eq!((pools[0].updated, pools[0].outdated), (3, 0));
        assert_eq!((pools[1].updated, pools[1].outdated), (0, 1));
        // Done: no rollout.
        nodes(&mut c, &members, &["v1.32.0"; 4]);
        let p = pass(&c, &members, &[]);
        assert!(p.upgrade.is_none() && p.rollout.is_none());
    }

    #[test]
    fn each_step_follows_the_last_ones_outcome_and_the_machine_settles() {
        let (cp, mut c) = lone_control_plane("v1.31.2");
        let members = [&cp];
        let mut u = pass(&c, &members, &[]).upgrade.unwrap();
        c.status.machine_upgrade = Some(u.clone());
        // Waits for its drain, then asks for the upgrade.
        assert_eq!(pass(&c, &members, &[]).upgrade.as_ref(), Some(&u));
        c.status.drain = Some(NodeDrain {
            machine: "cp".into(),
            node: "cp".into(),
            via: "cp".into(),
            started_at: t0(),
            requested_at: t0(),
            result: Some(DrainResult {
                ok: true,
                message: "drained".into(),
            }),
        });
        let later = t0() + time::Duration::seconds(5);
        u = pass_at(&c, &members, &[], later).upgrade.unwrap();
        assert_eq!(
            (u.step, u.requested_at),
            (MachineUpgradeStep::Upgrade, later)
        );
        c.status.drain = None;
        // Done: a control plane (itself) uncordons the Node.
        u.result = Some(DrainResult {
            ok: true,
            message: "upgraded".into(),
        });
        c.status.machine_upgrade = Some(u);
        let u = pass(&c, &members, &[]).upgrade.unwrap();
        assert_eq!(
            (u.step, u.via.as_str()),
            (MachineUpgradeStep::Uncordon, "cp")
        );
        // An uncordon that failed is asked again after a while.
        let mut failed = u.clone();
        failed.result = Some(DrainResult {
            ok: false,
            message: "refused".into(),
        });
        c.status.machine_upgrade = Some(failed.clone());
        assert_eq!(pass(&c, &members, &[]).upgrade, Some(failed));
        let retry = pass_at(&c, &members, &[], t0() + UNCORDON_RETRY)
            .upgrade
            .unwrap();
        assert_eq!(
            (retry.step, retry.result),
            (MachineUpgradeStep::Uncordon, None)
        );
        // Uncordoned: it settles at the new version, Ready, for 30 s.
        let mut done = u.clone();
        done.result = Some(DrainResult {
            ok: true,
            message: "uncordoned".into(),
        });
        c.status.machine_upgrade = Some(done);
        let settling = pass(&c, &members, &[]).upgrade.unwrap();
        assert_eq!(settling.step, MachineUpgradeStep::Settle);
        c.status.machine_upgrade = Some(settling);
        let soon = t0() + time::Duration::seconds(29);
        assert!(pass_at(&c, &members, &[], soon).upgrade.is_some());
        let settled = t0() + time::Duration::seconds(30);
        // Still at the old version: not back yet.
        assert!(pass_at(&c, &members, &[], settled).upgrade.is_some());
        nodes(&mut c, &members, &["v1.32.0"]);
        let p = pass_at(&c, &members, &[], settled);
        assert!(p.upgrade.is_none() && p.rollout.is_none());
        assert_eq!(p.upgraded, Some(("cp".into(), "v1.32.0".into())));
    }

    #[test]
    fn a_failed_or_silent_upgrade_halts_the_rollout_until_resumed() {
        let cp = machine("cp", MachineRole::Init);
        let w = machine("w1", MachineRole::Worker);
        let members = [&cp, &w];
        let mut c = cluster("v1.32.0", 1);
        nodes(&mut c, &members, &["v1.32.0", "v1.31.2"]);
        let mut u = pass(&c, &members, &[]).upgrade.unwrap();
        u.step = MachineUpgradeStep::Upgrade;
        u.result = Some(DrainResult {
            ok: false,
            message: "kubeadm upgrade node exited with code 1".into(),
        });
        c.status.machine_upgrade = Some(u.clone());
        let p = pass(&c, &members, &[]);
        assert!(p.upgrade.is_none());
        let r = p.rollout.unwrap();
        let h = r.halted.clone().unwrap();
        assert_eq!(
            (h.machine.as_str(), h.step.as_str(), h.reason.as_str()),
            ("w1", "upgrade", "kubeadm upgrade node exited with code 1")
        );
        // Recorded, the halt holds: nothing starts again...
        c.status.machine_upgrade = None;
        c.status.rollout = Some(r);
        assert!(pass(&c, &members, &[]).upgrade.is_none());
        // ...until an operator resumes (the halt cleared).
        c.status.rollout.as_mut().unwrap().halted = None;
        assert_eq!(pass(&c, &members, &[]).upgrade.unwrap().machine, "w1");

        // An upgrade that never reports halts after the timeout.
        u.result = None;
        c.status.machine_upgrade = Some(u);
        c.status.rollout = None;
        assert!(pass(&c, &members, &[]).upgrade.is_some());
        let p = pass_at(&c, &members, &[], t0() + UPGRADE_TIMEOUT);
        assert!(p
            .rollout
            .unwrap()
            .halted
            .unwrap()
            .reason
            .contains("did not report"));
    }

    #[test]
    fn an_upgraded_machine_that_turns_unhealthy_halts_the_rollout() {
        let (cp, mut c) = lone_control_plane("v1.32.0");
        let members = [&cp];
        assert!(pass(&c, &members, &[]).upgrade.is_none(), "already there");
        nodes(&mut c, &members, &["v1.31.2"]);
        let mut u = pass(&c, &members, &[]).upgrade.unwrap();
        u.step = MachineUpgradeStep::Settle;
        c.status.machine_upgrade = Some(u);
        // Upgraded (the last machine), then unhealthy while it settles.
        nodes(&mut c, &members, &["v1.32.0"]);
        let unhealthy = [("cp".to_string(), "kubelet down".to_string())];
        let r = pass(&c, &members, &unhealthy).rollout.unwrap();
        let h = r.halted.clone().unwrap();
        assert_eq!(h.step, "settle");
        assert!(h.reason.contains("kubelet down"), "{}", h.reason);
        // The halt stands until an operator resumes, though nothing is
        // left to upgrade.
        c.status.machine_upgrade = None;
        c.status.rollout = Some(r);
        assert!(pass(&c, &members, &[]).rollout.unwrap().halted.is_some());
        c.status.rollout.as_mut().unwrap().halted = None;
        assert!(pass(&c, &members, &[]).rollout.is_none());
    }
}
