//! Whether an operator may take a machine out (`drover delete machine`),
//! decided on the machine and its cluster's machines as they are. Pure, so
//! the HTTP edge and the tests share one rule.

use drover_common::api::{Machine, MachinePhase, CONTROL_PLANE_POOL};
use drover_planner::health::{quorum_allows_removal, ALIVE_CONDITION, HEALTHY_CONDITION};

/// What a removal request does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// The machine serves no cluster: its record goes now.
    Deregister,
    /// The machine leaves its cluster through the safe path (replaced or
    /// released by the reconciler, one control plane at a time).
    Mark,
    /// Its removal was requested already, or it is leaving: nothing to add.
    AlreadyLeaving,
}

/// Why a removal is refused; each message says what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemovalRefused {
    #[error("machine {machine} is the only control-plane machine of cluster {cluster}: taking it out would lose the cluster's etcd data. Add control-plane machines first (spec.controlPlane.replicas), or delete the cluster")]
    OnlyControlPlane { machine: String, cluster: String },
    #[error("taking control-plane machine {machine} out of cluster {cluster} would break etcd quorum: {healthy} of the {members} other members are healthy and {needed} are needed. Bring the unhealthy members back (or wait for their replacement) first")]
    Quorum {
        machine: String,
        cluster: String,
        members: u32,
        healthy: u32,
        needed: u32,
    },
}

/// Decides what removing `machine` does, given every machine of the store.
pub fn check_removal(machine: &Machine, all: &[Machine]) -> Result<Removal, RemovalRefused> {
    let Some(a) = &machine.spec.assignment else {
        return Ok(Removal::Deregister);
    };
    if machine.metadata.deletion_timestamp.is_some()
        || matches!(
            machine.status.phase,
            MachinePhase::Releasing | MachinePhase::Deleting | MachinePhase::Deleted
        )
    {
        return Ok(Removal::AlreadyLeaving);
    }
    if a.machine_pool != CONTROL_PLANE_POOL {
        return Ok(Removal::Mark);
    }
    let others: Vec<&Machine> = all
        .iter()
        .filter(|m| m.metadata.name != machine.metadata.name)
        .filter(|m| {
            m.spec.assignment.as_ref().is_some_and(|o| {
                o.cluster_uid == a.cluster_uid && o.machine_pool == CONTROL_PLANE_POOL
            })
        })
        .filter(|m| {
            m.metadata.deletion_timestamp.is_none()
                && !matches!(
                    m.status.phase,
                    MachinePhase::Releasing | MachinePhase::Deleting | MachinePhase::Deleted
                )
        })
        .collect();
    if machine.status.phase != MachinePhase::Running && others.is_empty() {
        // Never joined: there is no etcd member to protect.
        return Ok(Removal::Mark);
    }
    if others.is_empty() {
        return Err(RemovalRefused::OnlyControlPlane {
            machine: machine.metadata.name.clone(),
            cluster: a.cluster.clone(),
        });
    }
    let healthy = others.iter().filter(|m| is_healthy(m)).count() as u32;
    let members = others.len() as u32 + 1;
    if quorum_allows_removal(members, healthy) {
        Ok(Removal::Mark)
    } else {
        Err(RemovalRefused::Quorum {
            machine: machine.metadata.name.clone(),
            cluster: a.cluster.clone(),
            members: members - 1,
            healthy,
            needed: drover_planner::health::quorum(members - 1),
        })
    }
}

/// A machine that has left its cluster (reset, or never started): an
/// operator deleted it, so it is deregistered (a `Deleted` tombstone that
/// keeps its assignment for the cluster's history, its identity revoked),
/// or it is back in its pool.
pub fn finish_leaving(m: &mut Machine) {
    // An upgrade asked of it by the cluster it left is not its next
    // cluster's.
    m.status.upgrade = None;
    if m.metadata.deletion_timestamp.is_some() {
        m.status.phase = MachinePhase::Deleted;
        m.status.identity_revoked_at = Some(drover_common::now());
    } else {
        m.spec.assignment = None;
        m.status.phase = MachinePhase::Registered;
    }
}

/// Running, heard from, and reporting healthy, as far as the coordinator
/// knows.
pub fn is_healthy(m: &Machine) -> bool {
    m.status.phase == MachinePhase::Running
        && !m.status.conditions.iter().any(|c| {
            (c.type_ == HEALTHY_CONDITION || c.type_ == ALIVE_CONDITION) && c.status == "False"
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::{set_condition, MachineRole, MachineSpec};

    fn cp(name: &str, phase: MachinePhase) -> Machine {
        Machine {
            spec: MachineSpec {
                assignment: Some(drover_planner::fixtures::assignment(
                    CONTROL_PLANE_POOL,
                    MachineRole::ControlPlane,
                )),
                ..Default::default()
            },
            status: drover_common::api::MachineStatus {
                phase,
                ..Default::default()
            },
            ..crate::protocol::fixtures::machine(name)
        }
    }

    #[test]
    fn a_free_machine_is_deregistered_and_a_worker_marked() {
        let mut m = cp("f", MachinePhase::Registered);
        m.spec.assignment = None;
        assert_eq!(check_removal(&m, &[]), Ok(Removal::Deregister));
        let mut w = cp("w", MachinePhase::Running);
        w.spec.assignment.as_mut().unwrap().machine_pool = "workers".into();
        assert_eq!(check_removal(&w, &[]), Ok(Removal::Mark));
    }

    #[test]
    fn the_only_control_plane_is_refused() {
        let a = cp("a", MachinePhase::Running);
        let err = check_removal(&a, std::slice::from_ref(&a)).unwrap_err();
        assert!(err.to_string().contains("only control-plane"), "{err}");
    }

    #[test]
    fn removal_that_breaks_quorum_is_refused_and_one_that_keeps_it_allowed() {
        let a = cp("a", MachinePhase::Running);
        let b = cp("b", MachinePhase::Running);
        let mut d = cp("d", MachinePhase::Running);
        let all = vec![a.clone(), b.clone(), d.clone()];
        assert_eq!(check_removal(&a, &all), Ok(Removal::Mark));
        set_condition(
            &mut d.status.conditions,
            HEALTHY_CONDITION,
            false,
            "KubeletUnhealthy",
            "",
        );
        let all = vec![a.clone(), b, d.clone()];
        // Of b and d only b is healthy; two members need two.
        let err = check_removal(&a, &all).unwrap_err();
        assert!(
            matches!(
                err,
                RemovalRefused::Quorum {
                    healthy: 1,
                    needed: 2,
                    ..
                }
            ),
            "{err:?}"
        );
        // The unhealthy one itself may go: a and b keep quorum.
        assert_eq!(check_removal(&d, &all), Ok(Removal::Mark));
        // Asking twice changes nothing.
        let mut leaving = d.clone();
        leaving.metadata.deletion_timestamp = Some(drover_common::now());
        assert_eq!(check_removal(&leaving, &all), Ok(Removal::AlreadyLeaving));
    }
}
