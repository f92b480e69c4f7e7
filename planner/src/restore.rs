//! Restoring a cluster's etcd from a snapshot, as the planner
//! carries it out once `drover restore cluster` recorded it on the status
//! (`status.restore`):
//! 1. every control-plane machine of before is taken out (a provider's
//!    deleted, the load balancer told first; a pool's released), whatever
//!    quorum says: their etcd is what is being replaced;
//! 2. once none is left, the control-plane pool runs as for a cluster not
//!    initialized yet, so it creates (or claims) one init machine; its bundle carries
//!    the snapshot, which it restores before `kubeadm init`;
//! 3. once that machine runs, the restore is done (`status.lastRestore`),
//!    the cluster is initialized again, and the other control planes join
//!    one at a time as usual.
//!
//! Remediation is paused throughout: workers keep running while their API
//! server is away, and are judged again, with a fresh grace period, once
//! it is back.

use drover_common::api::{
    set_condition, Cluster, ClusterRestore, ClusterStatus, Machine, MachinePhase, RestoreDone,
    CONTROL_PLANE_POOL, RESTORING_CONDITION,
};
use time::OffsetDateTime;

use super::shared::{is_control_plane, Step};

/// The pools a planning pass goes through, each with its desired
/// replicas: all of `cluster`'s, but not the control plane while the
/// control planes of before (`old`) are still being taken out (released
/// from a pool cluster, removed from a provider's); the pass then does not
/// count the cluster as all running.
pub(crate) fn pools_to_plan(cluster: &Cluster, old: &[String]) -> Vec<(String, u32)> {
    let mut pools = cluster.desired_pools();
    if !old.is_empty() {
        pools.retain(|(name, _)| name != CONTROL_PLANE_POOL);
    }
    pools
}

/// The control planes of before still in the cluster (not the restoring
/// init machine `init`): taken out now, unless already on their way:
/// deleted when a provider made them (`provider_made`), else released
/// (their agent resets them when it is heard again, and they return to
/// their pool).
pub(crate) fn remove_old_control_planes(
    restore: &ClusterRestore,
    live: &[&Machine],
    init: Option<&str>,
    provider_made: bool,
    steps: &mut Vec<Step>,
) -> Vec<String> {
    let old: Vec<&Machine> = live
        .iter()
        .copied()
        .filter(|m| is_control_plane(m) && Some(m.metadata.name.as_str()) != init)
        .collect();
    let reason = format!(
        "replaced by the restore of etcd from snapshot {}",
        restore.snapshot
    );
    for m in &old {
        let machine = m.metadata.name.clone();
        match m.status.phase {
            MachinePhase::Deleting | MachinePhase::Releasing => {}
            _ if m.metadata.deletion_timestamp.is_some() => {}
            _ if provider_made => steps.push(Step::DeleteMachine {
                machine,
                reason: reason.clone(),
                remediation: false,
            }),
            _ => steps.push(Step::Release {
                machine,
                reason: reason.clone(),
                remediation: false,
            }),
        }
    }
    old.iter().map(|m| m.metadata.name.clone()).collect()
}

/// Why remediation is paused while `restore` is under way.
pub(crate) fn pause_reason(restore: &ClusterRestore) -> String {
    format!(
        "etcd is being restored from snapshot {}: machines are judged again once the control plane is back",
        restore.snapshot
    )
}

/// The restore's record and condition on the status: done once the init
/// machine that restored it is initialized (runs), else how far it is.
pub(crate) fn finish(
    status: &mut ClusterStatus,
    restore: &ClusterRestore,
    old_left: &[String],
    init: Option<&Machine>,
    initialized: bool,
    now: OffsetDateTime,
) {
    let machine = status.init_machine.clone();
    if initialized {
        if let Some(machine) = machine {
            status.restore = None;
            status.last_restore = Some(RestoreDone {
                snapshot: restore.snapshot.clone(),
                revision: restore.revision,
                machine: machine.clone(),
                requested_at: restore.requested_at,
                completed_at: now,
            });
            set_condition(
                &mut status.conditions,
                RESTORING_CONDITION,
                false,
                "Restored",
                &format!(
                    "etcd was restored from snapshot {} (revision {}) by {machine}",
                    restore.snapshot, restore.revision
                ),
            );
            return;
        }
    }
    let mut r = restore.clone();
    r.machine.clone_from(&machine);
    let message = if !old_left.is_empty() {
        format!(
            "restoring etcd from snapshot {} (revision {}): removing the control planes of before ({})",
            r.snapshot,
            r.revision,
            old_left.join(", ")
        )
    } else if let Some(m) = &machine {
        match init
            .and_then(|i| i.status.bootstrap.as_ref())
            .and_then(|b| Some((b.step.as_str(), b.failure.as_ref()?)))
        {
            Some((step, failure)) => format!(
                "restoring etcd from snapshot {} (revision {}): init machine {m} failed at {step}: {}; see `drover describe machine {m}`, then delete it (`drover delete machine {m}`) and a new one tries again",
                r.snapshot,
                r.revision,
                failure.output_tail.last().map(String::as_str).unwrap_or("no output")
            ),
            None => format!(
                "restoring etcd from snapshot {} (revision {}): init machine {m} restores it and runs kubeadm init",
                r.snapshot, r.revision
            ),
        }
    } else {
        format!(
            "restoring etcd from snapshot {} (revision {}): creating the init machine that restores it",
            r.snapshot, r.revision
        )
    };
    set_condition(
        &mut status.conditions,
        RESTORING_CONDITION,
        true,
        "RestoringSnapshot",
        &message,
    );
    status.restore = Some(r);
}
