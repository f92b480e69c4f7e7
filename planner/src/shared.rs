//! What both planners share: the steps, what is observed, the cluster's
//! status, its control-plane endpoint, the `Alive` conditions, deletion.

use std::time::Duration;

use drover_common::api::{
    set_condition, Cluster, ClusterPhase, ClusterStatus, Machine, MachinePhase, MachineRole,
    RebootMethod, CONTROL_PLANE_POOL,
};
use time::OffsetDateTime;

use crate::health::{Policy, ALIVE_CONDITION};
use crate::instance::InstanceState;

/// How long deleted machines stay visible for `describe`.
pub const TOMBSTONE_TTL: time::Duration = time::Duration::hours(1);

/// One change the executor makes.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Generate the cluster's CA set.
    EnsurePki,
    /// Give a cluster whose spec asks for `{managed: coordinator}` its
    /// endpoint port, before any machine runs `kubeadm init`.
    AllocateEndpoint,
    /// Make the provider's load balancer that is the cluster's endpoint,
    /// before any machine is created.
    EnsureEndpoint,
    /// Point the cluster's load balancer at these API servers (`ip:port`),
    /// before a control plane that leaves is removed.
    SetEndpointBackends { backends: Vec<String> },
    /// Claim a free pool machine.
    Assign {
        machine: String,
        machine_pool: String,
        role: MachineRole,
        /// The machine this one takes the place of, if any.
        replaces: Option<String>,
    },
    /// Return a pool machine to its registration pool (its agent runs
    /// `kubeadm reset` first).
    Release {
        machine: String,
        reason: String,
        /// Whether it is taken out because it is unhealthy.
        remediation: bool,
    },
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
    /// Record whether a Running machine's Node is among the cluster's
    /// (its `NodeFound` condition).
    SetNodeFound {
        machine: String,
        found: bool,
        message: String,
    },
    /// Reboot a machine (its pool's remediation reboots before it
    /// replaces, or instead): ask its agent, or power-cycle it through its
    /// BMC.
    Reboot {
        machine: String,
        reason: String,
        method: RebootMethod,
    },
    /// Ask a pool machine to run an in-place upgrade, or stop asking.
    SetUpgradeRequest {
        machine: String,
        request: Option<drover_common::api::UpgradeRequest>,
    },
    /// Record the version a pool machine was upgraded to in place in its
    /// assignment (what it is now made for).
    MarkUpgraded { machine: String, version: String },
    /// Record the cluster's observed state.
    SetStatus(Box<ClusterStatus>),
    /// Every machine is gone: remove the cluster, its network and its secrets.
    Finalize,
    /// Start a restore drill of the cluster into new cluster `into`: its
    /// `spec.backup.drill` schedule is due.
    StartDrill { into: String },
    /// This drill cluster's drill ended: record `done` on the cluster
    /// drilled (if it is still the one of `status.drillOf`) and delete this
    /// one.
    FinishDrill {
        done: Box<drover_common::api::DrillDone>,
    },
}

impl Step {
    /// The machine a removal takes out of the cluster (a pool plan releases
    /// it, a provider plan deletes it), and whether it goes because it is
    /// unhealthy.
    pub(crate) fn removal(&self) -> Option<(&String, bool)> {
        match self {
            Step::Release {
                machine,
                remediation,
                ..
            }
            | Step::DeleteMachine {
                machine,
                remediation,
                ..
            } => Some((machine, *remediation)),
            _ => None,
        }
    }
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

/// Forgets the cluster's tombstones (machines Deleted) past their time.
pub(crate) fn forget_steps(mine: &[&Machine], observed: &Observed<'_>) -> Vec<Step> {
    mine.iter()
        .filter(|m| {
            m.status.phase == MachinePhase::Deleted
                && m.metadata
                    .deletion_timestamp
                    .is_some_and(|t| observed.now - t > TOMBSTONE_TTL)
        })
        .map(|m| Step::Forget {
            machine: m.metadata.name.clone(),
        })
        .collect()
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
                remediation: false,
            });
        }
    }
    if live.is_empty() {
        steps.push(Step::Finalize);
    } else {
        let mut status = cluster.status.clone();
        status.phase = ClusterPhase::Deleting;
        if status != cluster.status {
            steps.push(Step::SetStatus(Box::new(status)));
        }
    }
    steps
}

pub(crate) fn needs_replacement_link(m: &Machine) -> bool {
    let remediated = m
        .status
        .events
        .iter()
        .any(|e| e.reason == "Remediating" || e.reason == "DeletionRequested");
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

pub(crate) fn count_running(machines: &[&Machine]) -> u32 {
    machines
        .iter()
        .filter(|m| m.status.phase == MachinePhase::Running)
        .count() as u32
}

/// Whether the cluster was initialized: recorded, or its init machine is
/// Running now.
pub(crate) fn initialized(cluster: &Cluster, live: &[&Machine], init: Option<&str>) -> bool {
    cluster.status.initialized
        || init
            .and_then(|i| live.iter().find(|m| m.metadata.name == i))
            .is_some_and(|m| m.status.phase == MachinePhase::Running)
}

/// Whether the previous pass paused remediation. Remediation resumes only
/// one pass after a pause ends, and the executor then gives every machine a
/// fresh grace period: machines coming back from a partition return one by
/// one, and the last ones must not be replaced for being a little late.
pub(crate) fn remediation_was_paused(cluster: &Cluster) -> bool {
    cluster
        .status
        .conditions
        .iter()
        .any(|c| c.type_ == "RemediationAllowed" && c.status == "False")
}

/// Records whether remediation may go on, with what paused it.
pub(crate) fn set_remediation_condition(status: &mut ClusterStatus, paused: &[String]) {
    set_condition(
        &mut status.conditions,
        "RemediationAllowed",
        paused.is_empty(),
        if paused.is_empty() {
            "WithinLimits"
        } else {
            "RemediationPaused"
        },
        &paused.join("; "),
    );
}

/// The condition a cluster gets when every control-plane machine of an
/// initialized cluster is gone: its etcd data went with them.
pub const CONTROL_PLANE_LOST_CONDITION: &str = "ControlPlaneLost";

/// Sets or clears [`CONTROL_PLANE_LOST_CONDITION`]. A cluster that lost its
/// whole control plane is never initialized a second time: `kubeadm init`
/// would make a new cluster with a new CA and no workloads, which its
/// workers could not join.
pub(crate) fn set_control_plane_lost(status: &mut ClusterStatus, cluster: &str, lost: bool) {
    if lost {
        set_condition(
            &mut status.conditions,
            CONTROL_PLANE_LOST_CONDITION,
            true,
            "NoControlPlaneLeft",
            &format!(
                "every control-plane machine of cluster {cluster} is gone, and its etcd data with them; Drover will not run `kubeadm init` again, which would make a different cluster. Restore etcd from a snapshot onto a new control-plane machine (`drover restore cluster {cluster}`), or delete and re-create the cluster"
            ),
        );
    } else if status
        .conditions
        .iter()
        .any(|c| c.type_ == CONTROL_PLANE_LOST_CONDITION)
    {
        status
            .conditions
            .retain(|c| c.type_ != CONTROL_PLANE_LOST_CONDITION);
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
            crate::health::bounded_list(degraded.iter().map(|(_, d)| d.clone()).collect(), "; "),
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
    if let Some(ep) = stable_endpoint(cluster) {
        return Some(ep);
    }
    let unhealthy = |m: &Machine| degraded.iter().any(|(n, _)| *n == m.metadata.name);
    let mut candidates: Vec<&Machine> = mine
        .iter()
        .copied()
        .filter(|m| {
            is_control_plane(m)
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

/// The machines an operator asked to delete (`drover delete machine`) or
/// the autoscaler chose to take out (the scale-down annotation) that are
/// not already being remediated, in `machines`' order.
pub(crate) fn asked_to_leave<'a>(
    machines: &[&'a Machine],
    remediate: &[(&'a Machine, String)],
) -> Vec<&'a Machine> {
    machines
        .iter()
        .copied()
        .filter(|m| {
            m.metadata.deletion_timestamp.is_some()
                || m.metadata
                    .annotations
                    .contains_key(drover_common::names::SCALE_DOWN_ANNOTATION)
        })
        .filter(|m| {
            !remediate
                .iter()
                .any(|(r, _)| r.metadata.name == m.metadata.name)
        })
        .collect()
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
/// A machine that never had trouble carries no condition (no write). The
/// coordinator's free-machine scan keeps the machines no cluster claimed
/// with it too.
pub fn alive_steps(mine: &[&Machine], observed: &Observed<'_>) -> Vec<Step> {
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
        } else if crate::health::silence(
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

/// Keeps each Running machine's `NodeFound` condition true to the Nodes a
/// control plane last reported (`nodes`, as [`nodes_to_judge`] gives
/// them): False once its Node is not among them, True again once it is.
/// Says nothing while there is no report, before `kubeadm init` and while
/// etcd is being restored; nor of a machine that became Running less than
/// a heartbeat timeout ago, whose Node the next report lists (a kubelet
/// registers it before the agent reports Running, and a control plane
/// reports the Nodes when they change). A machine whose Node was always
/// listed carries no condition (no write).
pub fn node_found_steps(
    cluster: &Cluster,
    mine: &[&Machine],
    nodes: &[drover_common::api::ClusterNode],
    observed: &Observed<'_>,
) -> Vec<Step> {
    use crate::health::NODE_FOUND_CONDITION;
    if nodes.is_empty() || !cluster.status.initialized || cluster.status.restore.is_some() {
        return vec![];
    }
    // Once per pass, not per machine: a cluster of thousands of Nodes.
    let names: std::collections::HashSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let mut steps = vec![];
    for m in mine {
        let host = &m.status.hostname;
        if m.status.phase != MachinePhase::Running || host.is_empty() {
            continue;
        }
        let listed = names.contains(host.as_str());
        let missing = m
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == NODE_FOUND_CONDITION && c.status == "False");
        let settled = running_since(m).is_none_or(|t| {
            observed.now - t
                > time::Duration::try_from(observed.policy.heartbeat_timeout)
                    .unwrap_or(time::Duration::MAX)
        });
        let step = |found: bool, message: String| Step::SetNodeFound {
            machine: m.metadata.name.clone(),
            found,
            message,
        };
        if listed && missing {
            steps.push(step(true, String::new()));
        } else if !listed && !missing && settled {
            steps.push(step(
                false,
                format!(
                    "the cluster's API server lists no Node {host}; its kubelet registers one only when it starts"
                ),
            ));
        }
    }
    steps
}

/// When a machine last became Running (its `Bootstrapped` event), if its
/// events still say.
fn running_since(m: &Machine) -> Option<OffsetDateTime> {
    m.status
        .events
        .iter()
        .rev()
        .find(|e| e.reason == "Bootstrapped")
        .map(|e| e.time)
}

/// The endpoint that outlives every machine, when the cluster has one: the
/// spec's address, the provider's load balancer once made, or the
/// coordinator's managed endpoint once allocated.
pub fn stable_endpoint(cluster: &Cluster) -> Option<String> {
    if let Some(ep) = cluster.spec.endpoint_address() {
        return Some(ep.to_owned());
    }
    if let Some(lb) = &cluster.status.load_balancer {
        return Some(lb.address.clone());
    }
    if cluster.spec.endpoint_managed_by_coordinator() && cluster.status.endpoint_port.is_some() {
        return cluster.status.control_plane_endpoint.clone();
    }
    None
}

pub(crate) fn endpoint_for(cluster: &Cluster, init: &Machine) -> String {
    if let Some(ep) = stable_endpoint(cluster) {
        return ep;
    }
    let addr = init.status.address().to_owned();
    let host = if addr.contains(':') {
        format!("[{addr}]")
    } else {
        addr
    };
    format!("{host}:{}", init.status.api_server_port)
}

/// How long a member removal asked of a machine may stay unanswered before
/// it is asked again (perhaps of another machine).
pub const ETCD_REMOVAL_RETRY: time::Duration = time::Duration::seconds(60);

/// How soon a member removal that failed is asked again.
pub const ETCD_REMOVAL_FAILED_RETRY: time::Duration = time::Duration::seconds(5);

/// What the cluster's reported etcd members call for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EtcdPlan {
    /// The member removal to ask for (kept in the cluster's status, and
    /// handed to its `via` machine with its next heartbeat).
    pub removal: Option<drover_common::api::EtcdRemoval>,
    /// Whether membership is settled: every member started, healthy, a
    /// voter (no learner) and
    /// belonging to a control-plane machine of the cluster, one member per
    /// such machine, and no removal under way. A control-plane join waits
    /// for this, so joins never race a member change.
    pub settled: bool,
}

/// The etcd member a machine runs: by name (its hostname, the node name),
/// or, before it started, by the address in its peer URL.
pub(crate) fn member_of<'a>(
    members: &'a [drover_common::api::EtcdMember],
    m: &Machine,
) -> Option<&'a drover_common::api::EtcdMember> {
    members.iter().find(|e| {
        (!e.name.is_empty() && e.name == m.status.hostname)
            || (e.name.is_empty()
                && e.peer_urls.iter().any(|u| {
                    m.status
                        .addresses
                        .iter()
                        .any(|a| u.contains(&format!("//{a}:")) || u.contains(&format!("//[{a}]:")))
                }))
    })
}

/// Plans etcd membership from the members a control plane reported.
///
/// `owners` are the machines whose members stay: the cluster's control
/// planes that serve it, and released ones still alive (their own
/// `kubeadm reset` removes their member). `leaving` are control planes
/// that go on purpose and whose member must go first, while they still
/// run. Any other member that is not healthy belongs to no machine (a dead
/// control plane taken out): it is removed through a running control plane
/// whose own member is healthy. Removing a member that is down never
/// lowers the number of healthy ones, so quorum is never the obstacle; a
/// healthy member is removed only while the others keep quorum.
pub(crate) fn plan_etcd(
    cluster: &Cluster,
    owners: &[&Machine],
    leaving: &[&Machine],
    via_candidates: &[&Machine],
    now: OffsetDateTime,
) -> EtcdPlan {
    use drover_common::api::EtcdRemoval;
    let members = &cluster.status.etcd_members;
    if members.is_empty() {
        return EtcdPlan {
            removal: None,
            settled: true,
        };
    }
    // A removal asked for recently, whose member is still listed, stands,
    // unless it failed a moment ago: then it is asked again.
    if let Some(r) = &cluster.status.etcd_removal {
        let failed = r
            .failed_at
            .is_some_and(|t| now - t >= ETCD_REMOVAL_FAILED_RETRY);
        if members.iter().any(|m| m.id == r.id)
            && now - r.requested_at < ETCD_REMOVAL_RETRY
            && !failed
        {
            return EtcdPlan {
                removal: Some(r.clone()),
                settled: false,
            };
        }
    }
    let owned = |e: &drover_common::api::EtcdMember| {
        owners
            .iter()
            .any(|m| member_of(members, m).is_some_and(|o| o.id == e.id))
    };
    // Through a healthy voter: a learner serves no member changes.
    let via_for = |victim: &drover_common::api::EtcdMember| {
        via_candidates.iter().find(|m| {
            member_of(members, m)
                .is_some_and(|own| own.healthy && !own.is_learner && own.id != victim.id)
        })
    };
    // Planned departures first (their machines still run), then members
    // of machines that are gone.
    let planned = leaving.iter().filter_map(|m| {
        member_of(members, m).map(|e| {
            (
                e,
                format!(
                    "control-plane machine {} leaves the cluster",
                    m.metadata.name
                ),
            )
        })
    });
    let orphans = members
        .iter()
        .filter(|e| !(owned(e) || e.healthy && e.started))
        .map(|e| {
            (
                e,
                format!(
                    "member {} belongs to no control-plane machine of cluster {} and is down",
                    if e.name.is_empty() { &e.id } else { &e.name },
                    cluster.metadata.name
                ),
            )
        });
    let removal = planned.chain(orphans).find_map(|(e, reason)| {
        // Voting members only: a learner counts towards no quorum.
        let keeps_quorum = crate::health::member_removal_keeps_quorum(members, e);
        let via = via_for(e)?;
        keeps_quorum.then(|| EtcdRemoval {
            id: e.id.clone(),
            name: e.name.clone(),
            via: via.metadata.name.clone(),
            reason,
            requested_at: now,
            failed_at: None,
            error: String::new(),
        })
    });
    // A learner is a join under way (kubeadm promotes it once it is in
    // sync), never a settled member: etcd takes one learner at a time.
    let settled = removal.is_none()
        && members
            .iter()
            .all(|e| e.started && e.healthy && !e.is_learner && owned(e))
        && owners
            .iter()
            .filter(|m| m.status.phase == MachinePhase::Running)
            .all(|m| member_of(members, m).is_some());
    EtcdPlan { removal, settled }
}

/// One pool's health as remediation judges it in one pass.
pub(crate) struct Judgement<'a> {
    /// The unhealthy members and why.
    pub unhealthy: Vec<(&'a Machine, crate::health::Unhealthy)>,
    /// Whom `maxUnhealthy` lets remediation replace, or why it pauses.
    pub decision: crate::health::Decision,
}

impl Judgement<'_> {
    pub fn is_unhealthy(&self, m: &Machine) -> bool {
        self.unhealthy
            .iter()
            .any(|(u, _)| u.metadata.name == m.metadata.name)
    }

    /// Members other than `m` that are Running and not unhealthy.
    pub fn healthy_others(&self, members: &[&Machine], m: &Machine) -> u32 {
        members
            .iter()
            .filter(|o| o.metadata.name != m.metadata.name)
            .filter(|o| o.status.phase == MachinePhase::Running && !self.is_unhealthy(o))
            .count() as u32
    }

    /// Whether control-plane machine `m` may be taken out of `members`
    /// (the control plane's machines) without breaking etcd quorum; if
    /// not, the count that forbids it. Two counts must both allow it: the
    /// machines that run and heartbeat healthy (what the coordinator
    /// sees), and the voting members of etcd as the control planes last
    /// reported them (`etcd`; what etcd itself counts). They differ when a
    /// member is down on a machine that still heartbeats, or when a member
    /// whose machine is gone still votes; a removal judged by machines
    /// alone would then take out a member etcd needs.
    pub fn quorum_without(
        &self,
        members: &[&Machine],
        m: &Machine,
        etcd: &[drover_common::api::EtcdMember],
    ) -> Result<(), QuorumAtStake> {
        use crate::health::quorum_allows_removal;
        let healthy = self.healthy_others(members, m);
        if !quorum_allows_removal(members.len() as u32, healthy) {
            return Err(QuorumAtStake::Machines {
                healthy,
                members: members.len(),
            });
        }
        etcd_quorum_without(etcd, m)
    }
}

/// Why a control plane may not be taken out: the count that would fall
/// below etcd quorum without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuorumAtStake {
    /// The control-plane machines that run and heartbeat healthy, besides
    /// the one to go, of all of them.
    Machines { healthy: u32, members: usize },
    /// etcd's voting members reported healthy, besides the one to go, of
    /// all voting members.
    Etcd { healthy: usize, voters: usize },
}

impl std::fmt::Display for QuorumAtStake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuorumAtStake::Machines { healthy, members } => {
                write!(f, "{healthy} healthy of {members} members")
            }
            QuorumAtStake::Etcd { healthy, voters } => write!(
                f,
                "etcd reports {healthy} other healthy of {voters} voting members"
            ),
        }
    }
}

/// Whether etcd, as the control planes last reported its members
/// (`etcd`), keeps quorum without the member of machine `m`; if not, the
/// count that forbids it. A machine with no member reported takes none
/// out.
pub(crate) fn etcd_quorum_without(
    etcd: &[drover_common::api::EtcdMember],
    m: &Machine,
) -> Result<(), QuorumAtStake> {
    match member_of(etcd, m) {
        Some(victim) if !crate::health::member_removal_keeps_quorum(etcd, victim) => {
            let voters = etcd.iter().filter(|e| e.voting());
            Err(QuorumAtStake::Etcd {
                healthy: voters
                    .clone()
                    .filter(|e| e.healthy && e.id != victim.id)
                    .count(),
                voters: voters.count(),
            })
        }
        _ => Ok(()),
    }
}

/// Judges a pool over all its members at once: the unhealthy ones, the
/// late ones (missed heartbeats, not past their timeout yet: cut off
/// together with a silent one, they cross their own deadlines up to an
/// interval later) and the replacements still in flight count together
/// against `maxUnhealthy`.
pub(crate) fn judge<'a>(
    pool: &str,
    desired: u32,
    members: &[&'a Machine],
    in_flight: Vec<&str>,
    nodes: &[drover_common::api::ClusterNode],
    problems: &[String],
    observed: &Observed<'_>,
) -> Judgement<'a> {
    use crate::health::{
        check, decide, is_late, node_missing, node_not_ready, problem, PoolHealth,
    };
    let unhealthy: Vec<(&'a Machine, crate::health::Unhealthy)> = members
        .iter()
        .filter_map(|m| {
            let uid = m.metadata.uid.as_deref().unwrap_or_default();
            check(
                m,
                observed.now,
                (observed.last_seen)(&m.metadata.name),
                (observed.instance)(uid),
                &observed.policy,
            )
            .or_else(|| {
                let node = nodes.iter().find(|n| n.name == m.status.hostname);
                node_not_ready(m, node, observed.now, &observed.policy)
            })
            // Only while there is a Node list to be missing from.
            .or_else(|| {
                (!nodes.is_empty())
                    .then(|| node_missing(m, observed.now, &observed.policy))
                    .flatten()
            })
            .or_else(|| problem(m, problems, observed.now, &observed.policy))
            .map(|u| (*m, u))
        })
        .collect();
    let late: Vec<&str> = members
        .iter()
        .filter(|m| {
            !unhealthy
                .iter()
                .any(|(u, _)| u.metadata.name == m.metadata.name)
        })
        .filter(|m| {
            is_late(
                m,
                observed.now,
                (observed.last_seen)(&m.metadata.name),
                &observed.policy,
                observed.heartbeat_interval,
            )
        })
        .map(|m| m.metadata.name.as_str())
        .collect();
    let decision = decide(
        &PoolHealth {
            pool,
            desired,
            members: members.len() as u32,
            unhealthy: unhealthy
                .iter()
                .map(|(m, u)| (m.metadata.name.as_str(), u.clone()))
                .collect(),
            late,
            in_flight,
        },
        &observed.policy,
    );
    Judgement {
        unhealthy,
        decision,
    }
}

/// What repairs one unhealthy machine that remediation let go, by its
/// pool's strategy ([`repair`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Repair {
    /// Take it out and put another in its place, for this reason.
    Replace(String),
    /// Reboot it, for this reason: ask its agent, or power-cycle it
    /// through its BMC.
    Reboot(String, RebootMethod),
    /// Nothing now: a reboot is under way, or a rebooted machine gets its
    /// unhealthy timeout to recover, or the strategy reboots only and no
    /// reboot can reach it.
    Wait,
}

/// What repairs machine `m`, unhealthy as `why`, under its pool's
/// remediation `rem`:
/// - `Replace`: replace it.
/// - `Reboot` and `RebootThenReplace`: a Running machine that answers is
///   asked to reboot once per episode of being unhealthy (a reboot asked
///   after the episode began counts); one that cannot be reached (silent,
///   stopped, or never started) is power-cycled through its BMC when it
///   has one. While a reboot is under way (asked, not yet back with a new
///   boot ID, not refused) nothing more happens, however silent the
///   machine is, until `rebootTimeout`; a machine back from it gets the
///   unhealthy timeout to recover. An agent's reboot not back in time is
///   followed by a power cycle when there is a BMC. After that,
///   `RebootThenReplace` replaces it (at once when no reboot can reach
///   it), and `Reboot` reboots again, at most once a `rebootTimeout`.
pub(crate) fn repair(
    rem: &drover_common::api::EffectiveRemediation,
    m: &Machine,
    why: &crate::health::Unhealthy,
    observed: &Observed<'_>,
) -> Repair {
    use crate::health::Unhealthy;
    use drover_common::api::RemediationStrategy::{Reboot, RebootThenReplace, Replace};
    use RebootMethod::{Agent, PowerCycle};
    let text = why.to_string();
    if rem.strategy == Replace {
        return Repair::Replace(text);
    }
    let now = observed.now;
    let timeout = time::Duration::try_from(rem.reboot_timeout).unwrap_or(time::Duration::MAX);
    let bmc = m.spec.bmc.is_some();
    let cycle = |why: String| Repair::Reboot(why, PowerCycle);
    let reboot = m.status.reboot.as_ref();
    if let Some(r) = reboot.filter(|r| r.in_progress()) {
        let waited = now - r.requested_at;
        if waited <= timeout {
            return Repair::Wait;
        }
        let late = format!(
            "{text}; not back from the {} asked {}s ago (rebootTimeout {}s)",
            match r.method {
                Agent => "reboot",
                PowerCycle => "power cycle",
            },
            waited.whole_seconds(),
            rem.reboot_timeout.as_secs()
        );
        return match (rem.strategy, r.method) {
            (_, Agent) if bmc => cycle(late),
            (RebootThenReplace, _) => Repair::Replace(late),
            _ => Repair::Reboot(late, if bmc { PowerCycle } else { Agent }),
        };
    }
    let reachable = m.status.phase == MachinePhase::Running
        && !matches!(
            why,
            Unhealthy::Silent { .. } | Unhealthy::Stopped | Unhealthy::NotStarted { .. }
        );
    let began = crate::health::unhealthy_since(why, m, now, (observed.last_seen)(&m.metadata.name));
    let this_episode = reboot.filter(|r| began.is_some_and(|b| r.requested_at >= b));
    let recovering = this_episode
        .and_then(|r| r.completed_at)
        .is_some_and(|back| now - back <= observed.policy.unhealthy_timeout);
    let unreached =
        format!("{text}; its agent cannot be reached, so it is power-cycled through its BMC");
    match (rem.strategy, this_episode) {
        (_, Some(_)) if recovering => Repair::Wait,
        (RebootThenReplace, None) if !reachable && bmc => cycle(unreached),
        (RebootThenReplace, Some(r)) if !reachable && bmc && r.method == Agent => cycle(unreached),
        (RebootThenReplace, None) if !reachable => {
            Repair::Replace(format!("{text}; a reboot cannot reach it (no BMC)"))
        }
        (RebootThenReplace, Some(r)) => Repair::Replace(match (&r.failed, r.method) {
            (Some(e), Agent) => format!("{text}; its reboot failed: {e}"),
            (Some(e), PowerCycle) => format!("{text}; its power cycle failed: {e}"),
            (None, Agent) => format!("{text}; still unhealthy after a reboot"),
            (None, PowerCycle) => format!("{text}; still unhealthy after a power cycle"),
        }),
        (Reboot, Some(r)) if now - r.completed_at.unwrap_or(r.requested_at) <= timeout => {
            Repair::Wait
        }
        (Reboot, _) if !reachable && bmc => cycle(unreached),
        (Reboot, _) if !reachable => Repair::Wait,
        _ => Repair::Reboot(text, Agent),
    }
}

/// Splits what remediation let go (`chosen`, with why) by [`repair`]: the
/// machines to replace (with why) are returned; a `Reboot` step is pushed
/// for each machine to reboot; the rest wait.
pub(crate) fn repairs<'a>(
    cluster: &Cluster,
    pool: &str,
    chosen: Vec<(&'a Machine, String)>,
    judged: &Judgement<'a>,
    observed: &Observed<'_>,
    steps: &mut Vec<Step>,
) -> Vec<(&'a Machine, String)> {
    let rem = cluster.spec.remediation(pool);
    let mut replace = vec![];
    for (m, text) in chosen {
        let Some((_, why)) = judged
            .unhealthy
            .iter()
            .find(|(u, _)| u.metadata.name == m.metadata.name)
        else {
            replace.push((m, text));
            continue;
        };
        match repair(&rem, m, why, observed) {
            Repair::Replace(why) => replace.push((m, why)),
            Repair::Reboot(reason, method) => steps.push(Step::Reboot {
                machine: m.metadata.name.clone(),
                reason: format!("unhealthy: {reason}"),
                method,
            }),
            Repair::Wait => {}
        }
    }
    replace
}

/// What the reported Nodes call for.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct NodesPlan {
    /// The Node deletion to ask for: a Node whose machine left.
    pub removal: Option<drover_common::api::NodeRemoval>,
    /// The Nodes of the cluster's machines that are not Ready.
    pub not_ready: Vec<String>,
    /// Whether every one of them is not Ready for want of a pod network.
    pub no_network: bool,
}

/// Plans Node cleanup from the Nodes a control plane reported: a Node that
/// belongs to none of `owners` (the cluster's machines that serve it, and
/// released ones still resetting) is deleted through a running control
/// plane of `via`, one at a time. No Node outlives its machine.
pub(crate) fn plan_nodes(
    cluster: &Cluster,
    owners: &[&Machine],
    via: &[&Machine],
    now: OffsetDateTime,
) -> NodesPlan {
    let nodes = &cluster.status.nodes;
    let owned = |n: &drover_common::api::ClusterNode| {
        owners
            .iter()
            .any(|m| !m.status.hostname.is_empty() && m.status.hostname == n.name)
    };
    let unready: Vec<_> = nodes
        .iter()
        .filter(|n| owned(n) && n.ready != "True")
        .collect();
    let no_network = !unready.is_empty() && unready.iter().all(|n| n.network_not_ready());
    let not_ready = unready
        .iter()
        .map(|n| format!("{} ({})", n.name, n.ready))
        .collect();
    let pending = cluster.status.node_removal.clone().filter(|r| {
        nodes.iter().any(|n| n.name == r.node) && now - r.requested_at < ETCD_REMOVAL_RETRY
    });
    let removal = pending.or_else(|| {
        let orphan = nodes.iter().find(|n| !owned(n))?;
        let via = via.first()?;
        Some(drover_common::api::NodeRemoval {
            node: orphan.name.clone(),
            via: via.metadata.name.clone(),
            requested_at: now,
        })
    });
    NodesPlan {
        removal,
        not_ready,
        no_network,
    }
}

/// Whether the cluster's `kubeadm-config` names `version`, as far as a
/// control plane reported it (an unreported version is taken to): a
/// control plane that joins deploys the version it names, not its own.
pub(crate) fn config_names(cluster: &Cluster, version: &str) -> bool {
    cluster
        .status
        .kubeadm_config_version
        .as_deref()
        .is_none_or(|v| v.trim_start_matches('v') == version.trim_start_matches('v'))
}

/// Plans the change of the cluster's `kubeadm-config` version to `wanted`,
/// asked of a running control plane of `via`: kept while it is under way,
/// asked again (of the first of `via`) a while after the last request, and
/// dropped once the config names it or nothing wants it.
pub(crate) fn plan_version_update(
    cluster: &Cluster,
    wanted: Option<&str>,
    via: &[&Machine],
    now: OffsetDateTime,
) -> Option<drover_common::api::VersionUpdate> {
    let wanted = wanted.filter(|v| !config_names(cluster, v))?;
    let pending = cluster.status.version_update.clone().filter(|u| {
        u.version == wanted
            && now - u.requested_at < ETCD_REMOVAL_RETRY
            && via.iter().any(|m| m.metadata.name == u.via)
    });
    pending.or_else(|| {
        Some(drover_common::api::VersionUpdate {
            version: wanted.to_owned(),
            via: via.first()?.metadata.name.clone(),
            requested_at: now,
            error: String::new(),
        })
    })
}

/// How long a certificate renewal may take before it is asked again, and
/// how long after a failure.
pub const CERTIFICATE_RENEWAL_RETRY: time::Duration = time::Duration::minutes(5);
pub const CERTIFICATE_RENEWAL_FAILED_RETRY: time::Duration = time::Duration::minutes(1);

/// Whether `m` is assigned as a control plane.
pub(crate) fn is_control_plane(m: &Machine) -> bool {
    m.spec
        .assignment
        .as_ref()
        .is_some_and(|a| a.role.is_control_plane())
}

/// Plans the renewal of pool control planes' certificates in place: the
/// control plane whose first certificate expires soonest within the
/// renewal window, one at a time and only while every control plane of
/// `members` runs. A request stands until the machine reports
/// certificates outside the window; it is asked again when it has taken
/// too long or failed a while ago.
pub(crate) fn plan_certificate_renewal(
    cluster: &Cluster,
    members: &[&Machine],
    now: OffsetDateTime,
) -> Option<drover_common::api::CertificateRenewal> {
    let window =
        drover_common::api::UpgradePolicy::renew_certificates_before(cluster.spec.upgrade.as_ref());
    let control_planes: Vec<&Machine> = members
        .iter()
        .copied()
        .filter(|m| is_control_plane(m))
        .collect();
    let expiring = |m: &Machine| {
        m.status
            .certificates
            .clone()
            .filter(|c| c.expires_at - now < window)
    };
    if let Some(r) = &cluster.status.certificate_renewal {
        let current = control_planes
            .iter()
            .find(|m| m.metadata.name == r.machine && m.status.phase == MachinePhase::Running)
            .is_some_and(|m| expiring(m).is_some());
        let retry = now - r.requested_at >= CERTIFICATE_RENEWAL_RETRY
            || r.failed_at
                .is_some_and(|t| now - t >= CERTIFICATE_RENEWAL_FAILED_RETRY);
        if current && !retry {
            return Some(r.clone());
        }
    }
    if control_planes
        .iter()
        .any(|m| m.status.phase != MachinePhase::Running)
    {
        return None;
    }
    control_planes
        .iter()
        .filter_map(|m| Some((m, expiring(m)?)))
        .min_by_key(|(_, c)| c.expires_at)
        .map(|(m, c)| drover_common::api::CertificateRenewal {
            machine: m.metadata.name.clone(),
            reason: format!(
                "{} expires at {}, within the renewal window",
                c.certificate,
                c.expires_at.date()
            ),
            requested_at: now,
            failed_at: None,
            error: String::new(),
        })
}

/// The Nodes machines are judged by. None while the cluster's endpoint is
/// down (as its control planes report, or as the provider shows its load
/// balancer): kubelets reach the API through it, so every Node goes
/// NotReady or Unknown, and that is the endpoint's fault, not the
/// machines'. Their own probes and heartbeats still judge them.
pub(crate) fn nodes_to_judge(
    cluster: &Cluster,
    endpoint_down: bool,
) -> &[drover_common::api::ClusterNode] {
    if endpoint_down || cluster.status.endpoint_ready == Some(false) {
        &[]
    } else {
        &cluster.status.nodes
    }
}

/// The cluster condition that says whether its control-plane endpoint
/// (the load balancer in front of the API servers) is up.
pub const ENDPOINT_AVAILABLE_CONDITION: &str = "EndpointAvailable";

/// Sets `EndpointAvailable` False naming what is down, or True again once
/// it is back (only on a cluster that had the condition).
pub(crate) fn set_endpoint_condition(status: &mut ClusterStatus, down: Option<&str>) {
    match down {
        Some(why) => {
            set_condition(
                &mut status.conditions,
                ENDPOINT_AVAILABLE_CONDITION,
                false,
                "LoadBalancerDown",
                why,
            );
        }
        None => {
            if status
                .conditions
                .iter()
                .any(|c| c.type_ == ENDPOINT_AVAILABLE_CONDITION && c.status == "False")
            {
                set_condition(
                    &mut status.conditions,
                    ENDPOINT_AVAILABLE_CONDITION,
                    true,
                    "LoadBalancerRunning",
                    "",
                );
            }
        }
    }
}

/// Keeps `Ready` true to what is inside the cluster: a cluster whose
/// machines all run is not Ready while its API endpoint does not answer
/// `/readyz` (as its control planes report, every heartbeat), nor while
/// any of its Nodes is not.
pub(crate) fn apply_nodes(status: &mut ClusterStatus, plan: &NodesPlan) {
    status.node_removal = plan.removal.clone();
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if ready && status.endpoint_ready == Some(false) {
        let endpoint = status
            .control_plane_endpoint
            .clone()
            .unwrap_or_else(|| "the cluster's endpoint".into());
        set_condition(
            &mut status.conditions,
            "Ready",
            false,
            "EndpointNotReady",
            &format!(
                "the Kubernetes API at {endpoint} does not answer /readyz (as its control planes report): \
                 the API server or what is in front of it is down; the Nodes listed are as last seen"
            ),
        );
        return;
    }
    if ready && !plan.not_ready.is_empty() {
        let nodes = crate::health::bounded_list(plan.not_ready.clone(), ", ");
        let message = if plan.no_network {
            format!(
                "no pod network: Nodes {nodes} report \"cni plugin not initialized\"; \
                 give the cluster one (a CNI addon, or a CNI config through spec.files)"
            )
        } else {
            format!("Nodes not Ready: {nodes}")
        };
        set_condition(
            &mut status.conditions,
            "Ready",
            false,
            "NodesNotReady",
            &message,
        );
    }
}

/// The API servers a cluster's load balancer forwards to, `ip:port`,
/// sorted: every control plane with an address that is not leaving, from
/// the moment it bootstraps (`kubeadm init` and joins reach the API through
/// the endpoint). The load balancer itself sends connections only to those
/// whose `/readyz` answers.
pub(crate) fn endpoint_backends(live: &[&Machine], leaving: &[String]) -> Vec<String> {
    let mut out: Vec<String> = live
        .iter()
        .filter(|m| {
            is_control_plane(m)
                && matches!(
                    m.status.phase,
                    MachinePhase::Assigned | MachinePhase::Bootstrapping | MachinePhase::Running
                )
                && m.metadata.deletion_timestamp.is_none()
                && m.status.api_server_port != 0
                && !leaving.contains(&m.metadata.name)
        })
        .filter_map(|m| backend_of(m))
        .collect();
    out.sort();
    out
}

/// Whether machine `name`'s API server is among the `recorded` backends of
/// the load balancer: a machine still served is not released yet.
pub(crate) fn still_served(live: &[&Machine], recorded: &[String], name: &str) -> bool {
    live.iter()
        .filter(|m| m.metadata.name == name)
        .filter_map(|m| backend_of(m))
        .any(|b| recorded.contains(&b))
}

/// A machine's API server as a load balancer names it, `ip:port`, whatever
/// its phase: what a recorded list of backends is searched for.
pub(crate) fn backend_of(m: &Machine) -> Option<String> {
    let ip: std::net::IpAddr = m.status.addresses.first()?.parse().ok()?;
    Some(std::net::SocketAddr::new(ip, m.status.api_server_port).to_string())
}
