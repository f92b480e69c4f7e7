//! What both planners share: the steps, what is observed, the cluster's
//! status, its control-plane endpoint, the `Alive` conditions, deletion.

use std::time::Duration;

use drover_common::api::{
    set_condition, Cluster, ClusterPhase, ClusterStatus, Machine, MachinePhase, MachineRole,
    CONTROL_PLANE_POOL,
};
use time::OffsetDateTime;

use crate::domain::health::{Policy, ALIVE_CONDITION};
use crate::provider::InstanceState;

/// How long deleted machines stay visible for `describe`.
pub const TOMBSTONE_TTL: time::Duration = time::Duration::hours(1);

/// One change the executor makes.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Generate the cluster's CA set.
    EnsurePki,
    /// Claim a free pool machine.
    Assign {
        machine: String,
        machine_pool: String,
        role: MachineRole,
    },
    /// Return a pool machine to its registration pool.
    Release { machine: String, reason: String },
    /// Record a new provider machine in the store (the intent), before any
    /// provider call.
    CreateMachine {
        machine_pool: String,
        role: MachineRole,
        /// The machine this one replaces, if any.
        replaces: Option<String>,
    },
    /// Ask the provider for a recorded machine (idempotent).
    Provision { machine: String },
    /// Start deleting a provider machine.
    DeleteMachine {
        machine: String,
        reason: String,
        /// Whether it is deleted because it is unhealthy.
        remediation: bool,
    },
    /// Delete a machine marked Deleting through its provider.
    Destroy { machine: String },
    /// Forget a tombstone past its time.
    Forget { machine: String },
    /// Record whether a machine is heard from (its `Alive` condition).
    SetAlive {
        machine: String,
        alive: bool,
        reason: String,
        message: String,
    },
    /// Record the cluster's observed state.
    SetStatus(ClusterStatus),
    /// Every machine is gone: remove the cluster, its network and its secrets.
    Finalize,
}

/// What the planner needs to know beyond the objects.
pub struct Observed<'a> {
    pub now: OffsetDateTime,
    pub has_pki: bool,
    /// The last heartbeat of a machine, by name.
    pub last_seen: &'a dyn Fn(&str) -> Option<OffsetDateTime>,
    /// What the provider reports of a machine, by machine UID.
    pub instance: &'a dyn Fn(&str) -> Option<InstanceState>,
    /// When a machine whose create failed may be tried again, by name.
    pub retry_not_before: &'a dyn Fn(&str) -> Option<OffsetDateTime>,
    pub policy: Policy,
    /// How often agents heartbeat (the coordinator's setting).
    pub heartbeat_interval: Duration,
}

impl Observed<'_> {
    pub(crate) fn alive(&self, name: &str) -> bool {
        (self.last_seen)(name).is_some_and(|t| self.now - t <= self.policy.heartbeat_timeout)
    }
}

pub(crate) fn deleting_steps(cluster: &Cluster, mine: &[&Machine], provider: bool) -> Vec<Step> {
    let mut steps = vec![];
    let live: Vec<&&Machine> = mine
        .iter()
        .filter(|m| m.status.phase != MachinePhase::Deleted)
        .collect();
    for m in &live {
        let name = m.metadata.name.clone();
        if provider {
            match m.status.phase {
                MachinePhase::Deleting => steps.push(Step::Destroy { machine: name }),
                _ => steps.push(Step::DeleteMachine {
                    machine: name,
                    reason: format!("cluster {} is being deleted", cluster.metadata.name),
                    remediation: false,
                }),
            }
        } else if m.status.phase != MachinePhase::Releasing {
            steps.push(Step::Release {
                machine: name,
                reason: format!("cluster {} is being deleted", cluster.metadata.name),
            });
        }
    }
    if live.is_empty() {
        steps.push(Step::Finalize);
    } else {
        let mut status = cluster.status.clone();
        status.phase = ClusterPhase::Deleting;
        if status != cluster.status {
            steps.push(Step::SetStatus(status));
        }
    }
    steps
}

pub(crate) fn needs_replacement_link(m: &Machine) -> bool {
    let remediated = m.status.events.iter().any(|e| e.reason == "Remediating");
    let linked = m.status.events.iter().any(|e| e.reason == "ReplacedBy");
    remediated && !linked
}

pub(crate) fn base_status(cluster: &Cluster) -> ClusterStatus {
    let mut status = cluster.status.clone();
    status.observed_generation = cluster.metadata.generation;
    status.pools.clear();
    status
}

/// The recorded init machine, if it is still a member of the cluster.
pub(crate) fn current_init(cluster: &Cluster, mine: &[&Machine]) -> Option<String> {
    cluster.status.init_machine.clone().filter(|init| {
        mine.iter().any(|m| {
            &m.metadata.name == init
                && !matches!(
                    m.status.phase,
                    MachinePhase::Releasing | MachinePhase::Deleting | MachinePhase::Deleted
                )
        })
    })
}

pub(crate) fn pool_selector<'a>(
    cluster: &'a Cluster,
    pool: &str,
) -> &'a drover_common::api::LabelSelector {
    if pool == CONTROL_PLANE_POOL {
        &cluster.spec.control_plane.selector
    } else {
        &cluster
            .spec
            .worker_pools
            .iter()
            .find(|p| p.name == pool)
            .expect("desired_pools lists spec pools")
            .selector
    }
}

pub(crate) fn pool_members<'a>(mine: &[&'a Machine], pool: &str) -> Vec<&'a Machine> {
    mine.iter()
        .copied()
        .filter(|m| {
            m.spec.assignment.as_ref().map(|a| a.machine_pool.as_str()) == Some(pool)
                && m.status.phase != MachinePhase::Releasing
        })
        .collect()
}

pub(crate) fn count_running(machines: &[&Machine]) -> u32 {
    machines
        .iter()
        .filter(|m| m.status.phase == MachinePhase::Running)
        .count() as u32
}

pub(crate) fn next_role(
    pool: &str,
    init_machine: &mut Option<String>,
    candidate: &str,
) -> MachineRole {
    if pool == CONTROL_PLANE_POOL {
        if init_machine.is_none() {
            *init_machine = Some(candidate.to_owned());
            MachineRole::Init
        } else {
            MachineRole::ControlPlane
        }
    } else {
        MachineRole::Worker
    }
}

pub(crate) fn finish_status(
    cluster: &Cluster,
    mine: &[&Machine],
    status: &mut ClusterStatus,
    init_machine: Option<String>,
    all_running: bool,
    assigned_any: bool,
    degraded: &[(String, String)],
) {
    if let Some(ep) = choose_endpoint(cluster, mine, init_machine.as_deref(), degraded) {
        status.control_plane_endpoint = Some(ep);
    }
    // Only a machine that is still a member: a deleted init machine's name
    // would send readers (and joiners) to a machine that is gone.
    status.init_machine = init_machine;
    if status.init_machine.as_ref().is_some_and(|i| {
        mine.iter()
            .any(|m| &m.metadata.name == i && m.status.phase == MachinePhase::Running)
    }) {
        status.initialized = true;
    }
    let is_degraded = !all_running && !degraded.is_empty();
    status.phase = if all_running {
        ClusterPhase::Running
    } else if is_degraded {
        ClusterPhase::Degraded
    } else if assigned_any {
        ClusterPhase::Provisioning
    } else {
        ClusterPhase::Pending
    };
    let (reason, message) = if all_running {
        ("AllRunning", String::new())
    } else if is_degraded {
        (
            "MachinesUnhealthy",
            crate::domain::health::bounded_list(
                degraded.iter().map(|(_, d)| d.clone()).collect(),
                "; ",
            ),
        )
    } else {
        ("Provisioning", String::new())
    };
    set_condition(
        &mut status.conditions,
        "Ready",
        all_running,
        reason,
        &message,
    );
}

/// The control-plane endpoint joiners use. A stable one from the spec wins.
/// Else (docker and pool clusters without one) it is a control-plane
/// machine's own address: the init machine's while it is a member, and once
/// it is gone, a Running control-plane machine's, so that joins never aim at
/// a machine that no longer exists. The current choice is kept while its
/// machine is a healthy member.
pub(crate) fn choose_endpoint(
    cluster: &Cluster,
    mine: &[&Machine],
    init_machine: Option<&str>,
    degraded: &[(String, String)],
) -> Option<String> {
    if let Some(ep) = &cluster.spec.control_plane_endpoint {
        return Some(ep.clone());
    }
    let unhealthy = |m: &Machine| degraded.iter().any(|(n, _)| *n == m.metadata.name);
    let mut candidates: Vec<&Machine> = mine
        .iter()
        .copied()
        .filter(|m| {
            m.spec
                .assignment
                .as_ref()
                .is_some_and(|a| a.role.is_control_plane())
                && !m.status.addresses.is_empty()
                && !matches!(
                    m.status.phase,
                    MachinePhase::Releasing | MachinePhase::Deleting | MachinePhase::Deleted
                )
                && !unhealthy(m)
        })
        .collect();
    candidates.sort_by_key(|m| (m.metadata.creation_timestamp, m.metadata.name.clone()));
    if let Some(current) = &cluster.status.control_plane_endpoint {
        if candidates
            .iter()
            .any(|m| &endpoint_for(cluster, m) == current)
        {
            return Some(current.clone());
        }
    }
    if let Some(init) = init_machine.and_then(|i| candidates.iter().find(|m| m.metadata.name == i))
    {
        return Some(endpoint_for(cluster, init));
    }
    candidates
        .iter()
        .find(|m| m.status.phase == MachinePhase::Running)
        .map(|m| endpoint_for(cluster, m))
}

/// The remediated machines of a pool whose replacement is not Running yet,
/// one name per slot: the replacement's, or the remediated machine's while
/// it has none. A Running replacement is judged by its own health.
pub(crate) fn in_flight_replacements<'a>(
    mine: &[&'a Machine],
    live: &[&'a Machine],
    pool: &str,
) -> Vec<&'a str> {
    let mut out = vec![];
    for old in mine.iter().filter(|m| {
        matches!(
            m.status.phase,
            MachinePhase::Deleting | MachinePhase::Deleted
        ) && m.spec.assignment.as_ref().map(|a| a.machine_pool.as_str()) == Some(pool)
            && m.status.events.iter().any(|e| e.reason == "Remediating")
    }) {
        match replaced_by(old) {
            None => out.push(old.metadata.name.as_str()),
            Some(new) => {
                if let Some(n) = live.iter().find(|m| m.metadata.name == new) {
                    if !matches!(
                        n.status.phase,
                        MachinePhase::Running | MachinePhase::Deleting | MachinePhase::Deleted
                    ) {
                        out.push(n.metadata.name.as_str());
                    }
                }
            }
        }
    }
    out.sort();
    out
}

/// The machine that replaced `m`, from its `ReplacedBy` event.
pub(crate) fn replaced_by(m: &Machine) -> Option<&str> {
    m.status
        .events
        .iter()
        .rev()
        .find(|e| e.reason == "ReplacedBy")
        .and_then(|e| e.message.strip_prefix("replaced by "))
}

/// Keeps each member's `Alive` condition true to what the coordinator sees:
/// False with `Silent` or `Stopped` while it is, True again once it is not.
/// A machine that never had trouble carries no condition (no write).
pub(crate) fn alive_steps(mine: &[&Machine], observed: &Observed<'_>) -> Vec<Step> {
    let mut steps = vec![];
    for m in mine {
        if matches!(
            m.status.phase,
            MachinePhase::Releasing | MachinePhase::Deleting | MachinePhase::Deleted
        ) {
            continue;
        }
        let uid = m.metadata.uid.as_deref().unwrap_or_default();
        let (alive, reason, message) = if (observed.instance)(uid) == Some(InstanceState::Stopped) {
            (
                false,
                "Stopped",
                "its provider reports it stopped".to_string(),
            )
        } else if crate::domain::health::silence(
            m,
            observed.now,
            (observed.last_seen)(&m.metadata.name),
            &observed.policy,
        )
        .is_some()
        {
            (
                false,
                "Silent",
                format!(
                    "no heartbeat within the heartbeat timeout ({}s)",
                    observed.policy.heartbeat_timeout.as_secs()
                ),
            )
        } else {
            (true, "Heartbeating", String::new())
        };
        let current = m
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == ALIVE_CONDITION);
        let differs = match current {
            None => !alive,
            Some(c) => (c.status == "True") != alive || c.reason != reason || c.message != message,
        };
        if differs {
            steps.push(Step::SetAlive {
                machine: m.metadata.name.clone(),
                alive,
                reason: reason.to_owned(),
                message,
            });
        }
    }
    steps
}

pub(crate) fn endpoint_for(cluster: &Cluster, init: &Machine) -> String {
    if let Some(ep) = &cluster.spec.control_plane_endpoint {
        return ep.clone();
    }
    let addr = init.status.addresses.first().cloned().unwrap_or_default();
    let host = if addr.contains(':') {
        format!("[{addr}]")
    } else {
        addr
    };
    format!("{host}:{}", init.status.api_server_port)
}
