//! The cluster reconciler: a level-triggered loop that, for each cluster,
//! plans the steps from the cluster and the machines as they are (a pure
//! function) and applies them (the executor). It never sees events, only
//! objects, so running it twice changes nothing the second time.

pub mod error;
pub mod provisioner;
pub mod retries;
pub mod status;

pub use error::ReconcileError;
pub use retries::ProvisionRetries;
pub use status::LoopStatus;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_common::api::{
    push_event, set_condition, Assignment, Cluster, ClusterPhase, ClusterStatus, Machine,
    MachinePhase, MachineRole, MachineSpec, MachineStatus, ObjectMeta, PoolStatus, ProviderSpec,
    CONTROL_PLANE_POOL,
};
use time::OffsetDateTime;

use crate::app::App;
use crate::domain::health::{
    check, decide, is_late, quorum, Decision, Policy, PoolHealth, Unhealthy, ALIVE_CONDITION,
};
use crate::domain::secrets::{cluster_pki_name, ClusterPki};
use crate::provider::InstanceState;
use crate::store::{Kind, StoreError};

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
    fn alive(&self, name: &str) -> bool {
        (self.last_seen)(name).is_some_and(|t| self.now - t <= self.policy.heartbeat_timeout)
    }
}

/// Plans the steps that bring `cluster` closer to its spec. Pure.
pub fn plan(cluster: &Cluster, machines: &[Machine], observed: &Observed<'_>) -> Vec<Step> {
    let uid = cluster.metadata.uid.as_deref().unwrap_or_default();
    let mine: Vec<&Machine> = machines
        .iter()
        .filter(|m| {
            m.spec
                .assignment
                .as_ref()
                .is_some_and(|a| a.cluster_uid == uid)
        })
        .collect();
    if cluster.spec.provider.creates_machines() {
        plan_provider(cluster, &mine, observed)
    } else {
        plan_pool(cluster, &mine, machines, observed)
    }
}

fn deleting_steps(cluster: &Cluster, mine: &[&Machine], provider: bool) -> Vec<Step> {
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

fn plan_pool(
    cluster: &Cluster,
    mine: &[&Machine],
    machines: &[Machine],
    observed: &Observed<'_>,
) -> Vec<Step> {
    if cluster.metadata.deletion_timestamp.is_some() {
        return deleting_steps(cluster, mine, false);
    }
    if !observed.has_pki {
        return vec![Step::EnsurePki];
    }
    let ProviderSpec::Pool(provider) = &cluster.spec.provider else {
        unreachable!("plan_pool is called for pool clusters only")
    };
    let mut steps = vec![];
    let mut taken: BTreeSet<&str> = BTreeSet::new();
    let mut free: Vec<&Machine> = machines
        .iter()
        .filter(|m| {
            m.spec.assignment.is_none()
                && m.status.phase == MachinePhase::Registered
                && m.metadata.deletion_timestamp.is_none()
                && provider.pool.as_ref().is_none_or(|p| *p == m.spec.pool)
                && provider.selector.matches(&m.metadata.labels)
                && observed.alive(&m.metadata.name)
        })
        .collect();
    free.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    let mut status = base_status(cluster);
    let mut init_machine = current_init(cluster, mine);
    let mut assigned_any = false;
    let mut all_running = true;

    for (pool_name, desired) in cluster.desired_pools() {
        let selector = pool_selector(cluster, &pool_name);
        let mut in_pool = pool_members(mine, &pool_name);
        let mut count = in_pool.len() as u32;
        while count < desired {
            let Some(pos) = free.iter().position(|m| {
                selector.matches(&m.metadata.labels) && !taken.contains(m.metadata.name.as_str())
            }) else {
                break;
            };
            let m = free.remove(pos);
            taken.insert(&m.metadata.name);
            let role = next_role(&pool_name, &mut init_machine, &m.metadata.name);
            steps.push(Step::Assign {
                machine: m.metadata.name.clone(),
                machine_pool: pool_name.clone(),
                role,
            });
            if role == MachineRole::Init {
                status.control_plane_endpoint = Some(endpoint_for(cluster, m));
            }
            count += 1;
        }
        if count > desired {
            // Scale down: release machines that are not the init machine,
            // newest first.
            in_pool.sort_by_key(|m| {
                (
                    Some(&m.metadata.name) == init_machine.as_ref(),
                    std::cmp::Reverse(m.metadata.creation_timestamp),
                )
            });
            for m in in_pool.iter().take((count - desired) as usize) {
                steps.push(Step::Release {
                    machine: m.metadata.name.clone(),
                    reason: format!(
                        "pool {pool_name} of cluster {} scaled down",
                        cluster.metadata.name
                    ),
                });
            }
            count = desired;
        }
        let running = count_running(&in_pool);
        all_running &= running >= desired;
        assigned_any |= count > 0;
        status.pools.push(PoolStatus {
            name: pool_name.clone(),
            desired,
            assigned: count,
            running: running.min(desired),
        });
    }
    steps.extend(alive_steps(mine, observed));
    finish_status(
        cluster,
        mine,
        &mut status,
        init_machine,
        all_running,
        assigned_any,
        &[],
    );
    let waiting: u32 = status
        .pools
        .iter()
        .map(|p| p.desired.saturating_sub(p.assigned))
        .sum();
    let msg = if waiting > 0 {
        format!("waiting for {waiting} more matching machine(s) to register in the pool")
    } else {
        String::new()
    };
    set_condition(
        &mut status.conditions,
        "MachinesAvailable",
        waiting == 0,
        if waiting == 0 {
            "AllClaimed"
        } else {
            "WaitingForMachines"
        },
        &msg,
    );
    if status != cluster.status {
        steps.push(Step::SetStatus(status));
    }
    steps
}

fn plan_provider(cluster: &Cluster, mine: &[&Machine], observed: &Observed<'_>) -> Vec<Step> {
    let mut steps = vec![];
    for m in mine {
        if m.status.phase == MachinePhase::Deleted
            && m.metadata
                .deletion_timestamp
                .is_some_and(|t| observed.now - t > TOMBSTONE_TTL)
        {
            steps.push(Step::Forget {
                machine: m.metadata.name.clone(),
            });
        }
    }
    if cluster.metadata.deletion_timestamp.is_some() {
        steps.extend(deleting_steps(cluster, mine, true));
        return steps;
    }
    if !observed.has_pki {
        steps.push(Step::EnsurePki);
        return steps;
    }
    let mut status = base_status(cluster);
    let live: Vec<&Machine> = mine
        .iter()
        .copied()
        .filter(|m| !matches!(m.status.phase, MachinePhase::Deleted))
        .collect();
    let mut init_machine = current_init(cluster, &live);
    let initialized = cluster.status.initialized
        || init_machine
            .as_ref()
            .and_then(|i| live.iter().find(|m| &m.metadata.name == i))
            .is_some_and(|m| m.status.phase == MachinePhase::Running);
    if init_machine.is_none() && initialized {
        // The init machine is gone after it initialized the cluster: the
        // cluster keeps its initialized state; new control-plane machines join.
        init_machine = None;
    }
    let mut all_running = true;
    let mut assigned_any = false;
    let mut paused = vec![];
    // Unhealthy members: the name, and "pool: machine why" without ages.
    let mut degraded: Vec<(String, String)> = vec![];
    // Remediation resumes only one pass after a pause ends, and the executor
    // then gives every machine a fresh grace period: machines coming back
    // from a partition return one by one, and the last ones must not be
    // replaced for being a little late.
    let was_paused = cluster
        .status
        .conditions
        .iter()
        .any(|c| c.type_ == "RemediationAllowed" && c.status == "False");

    // Machines already being deleted are finished first.
    for m in &live {
        if m.status.phase == MachinePhase::Deleting {
            steps.push(Step::Destroy {
                machine: m.metadata.name.clone(),
            });
        }
    }
    steps.extend(alive_steps(&live, observed));

    for (pool_name, desired) in cluster.desired_pools() {
        let is_cp = pool_name == CONTROL_PLANE_POOL;
        let members: Vec<&Machine> = live
            .iter()
            .copied()
            .filter(|m| {
                m.spec.assignment.as_ref().map(|a| a.machine_pool.as_str()) == Some(&pool_name)
            })
            .collect();
        let active: Vec<&Machine> = members
            .iter()
            .copied()
            .filter(|m| m.status.phase != MachinePhase::Deleting)
            .collect();
        let deleting_here = members.len() - active.len();

        // Provision what was recorded but not yet created, unless its last
        // attempt failed and its back-off has not run out.
        for m in &active {
            if m.status.provider_id.is_none()
                && (observed.retry_not_before)(&m.metadata.name).is_none_or(|t| t <= observed.now)
            {
                steps.push(Step::Provision {
                    machine: m.metadata.name.clone(),
                });
            }
        }

        // Health, decided over the whole pool: the unhealthy members and
        // the replacements of earlier remediations not Running yet count
        // together against maxUnhealthy.
        let unhealthy: Vec<(&Machine, Unhealthy)> = active
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
                .map(|r| (*m, r))
            })
            .collect();
        for (m, u) in &unhealthy {
            degraded.push((
                m.metadata.name.clone(),
                format!("{pool_name}: {} {}", m.metadata.name, u.summary()),
            ));
        }
        // Members that missed heartbeats but are not past their timeout yet
        // count too: cut off together with a silent one, they cross their
        // own deadlines up to an interval later.
        let late: Vec<&str> = active
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
        let in_flight = in_flight_replacements(mine, &live, &pool_name);
        let pool_health = PoolHealth {
            pool: &pool_name,
            desired,
            members: active.len() as u32,
            unhealthy: unhealthy
                .iter()
                .map(|(m, u)| (m.metadata.name.as_str(), u.clone()))
                .collect(),
            late,
            in_flight,
        };
        let mut remediate: Vec<(&Machine, String)> = vec![];
        match decide(&pool_health, &observed.policy) {
            Decision::Paused(msg) => paused.push(msg),
            Decision::Remediate(names) => {
                let chosen = unhealthy
                    .iter()
                    .filter(|(m, _)| names.contains(&m.metadata.name));
                if is_cp {
                    // One control-plane machine at a time, and only while the
                    // rest keeps etcd quorum (before init there is no etcd to
                    // protect).
                    if let Some((m, why)) = chosen.clone().next().filter(|_| deleting_here == 0) {
                        let healthy_others = active
                            .iter()
                            .filter(|o| o.metadata.name != m.metadata.name)
                            .filter(|o| o.status.phase == MachinePhase::Running)
                            .filter(|o| {
                                !unhealthy
                                    .iter()
                                    .any(|(u, _)| u.metadata.name == o.metadata.name)
                            })
                            .count() as u32;
                        let members_after = (active.len() as u32).saturating_sub(1);
                        if !initialized
                            || (members_after > 0 && healthy_others >= quorum(members_after))
                        {
                            remediate.push((m, why.to_string()));
                        } else {
                            paused.push(format!(
                                "control plane: {} is {} but removing it would break etcd quorum ({healthy_others} healthy of {} members); not remediated",
                                m.metadata.name,
                                why.summary(),
                                active.len()
                            ));
                        }
                    }
                } else {
                    remediate = chosen.map(|(m, why)| (*m, why.to_string())).collect();
                }
            }
        }
        if was_paused {
            remediate.clear();
        }
        for (m, why) in &remediate {
            steps.push(Step::DeleteMachine {
                machine: m.metadata.name.clone(),
                reason: format!("unhealthy: {why}"),
                remediation: true,
            });
        }
        let remaining: Vec<&Machine> = active
            .iter()
            .copied()
            .filter(|m| {
                !remediate
                    .iter()
                    .any(|(r, _)| r.metadata.name == m.metadata.name)
            })
            .collect();
        let mut count = remaining.len() as u32;

        // Machines this pool lost to remediation and not yet replaced.
        let mut to_replace: Vec<String> = members
            .iter()
            .chain(mine.iter().filter(|m| {
                m.status.phase == MachinePhase::Deleted
                    && m.spec.assignment.as_ref().map(|a| a.machine_pool.as_str())
                        == Some(&pool_name)
            }))
            .filter(|m| needs_replacement_link(m))
            .map(|m| m.metadata.name.clone())
            .chain(remediate.iter().map(|(m, _)| m.metadata.name.clone()))
            .collect();
        to_replace.sort();
        to_replace.dedup();

        // Scale up. Control-plane machines come one at a time, and the
        // others only once the first has initialized the cluster.
        while count < desired {
            if is_cp {
                let busy = remaining
                    .iter()
                    .any(|m| m.status.phase != MachinePhase::Running);
                if busy || (count > 0 && !initialized) {
                    break;
                }
            }
            let role = if is_cp {
                if !initialized && init_machine.is_none() {
                    MachineRole::Init
                } else {
                    MachineRole::ControlPlane
                }
            } else {
                MachineRole::Worker
            };
            if role == MachineRole::Init {
                // The executor names it; the status records it after creation.
                init_machine = None;
            }
            steps.push(Step::CreateMachine {
                machine_pool: pool_name.clone(),
                role,
                replaces: to_replace.pop(),
            });
            count += 1;
            if is_cp {
                break;
            }
        }
        // Scale down: unhealthy first (already removed above), then newest,
        // never the init machine while it is needed.
        if count > desired {
            let mut victims: Vec<&Machine> = remaining.clone();
            victims.sort_by_key(|m| {
                (
                    Some(&m.metadata.name) == init_machine.as_ref(),
                    m.status.phase == MachinePhase::Running,
                    std::cmp::Reverse(m.metadata.creation_timestamp),
                )
            });
            let excess = (count - desired) as usize;
            let take = if is_cp { excess.min(1) } else { excess };
            for m in victims.iter().take(take) {
                steps.push(Step::DeleteMachine {
                    machine: m.metadata.name.clone(),
                    reason: format!(
                        "pool {pool_name} of cluster {} scaled down to {desired}",
                        cluster.metadata.name
                    ),
                    remediation: false,
                });
            }
            count = desired;
        }
        let running = count_running(&remaining);
        all_running &= running >= desired && unhealthy.is_empty();
        assigned_any |= !members.is_empty();
        status.pools.push(PoolStatus {
            name: pool_name.clone(),
            desired,
            assigned: count.min(remaining.len() as u32),
            running: running.min(desired),
        });
    }
    finish_status(
        cluster,
        &live,
        &mut status,
        init_machine,
        all_running,
        assigned_any,
        &degraded,
    );
    status.initialized = initialized;
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
    if status != cluster.status {
        steps.push(Step::SetStatus(status));
    }
    steps
}

fn needs_replacement_link(m: &Machine) -> bool {
    let remediated = m.status.events.iter().any(|e| e.reason == "Remediating");
    let linked = m.status.events.iter().any(|e| e.reason == "ReplacedBy");
    remediated && !linked
}

fn base_status(cluster: &Cluster) -> ClusterStatus {
    let mut status = cluster.status.clone();
    status.observed_generation = cluster.metadata.generation;
    status.pools.clear();
    status
}

/// The recorded init machine, if it is still a member of the cluster.
fn current_init(cluster: &Cluster, mine: &[&Machine]) -> Option<String> {
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

fn pool_selector<'a>(cluster: &'a Cluster, pool: &str) -> &'a drover_common::api::LabelSelector {
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

fn pool_members<'a>(mine: &[&'a Machine], pool: &str) -> Vec<&'a Machine> {
    mine.iter()
        .copied()
        .filter(|m| {
            m.spec.assignment.as_ref().map(|a| a.machine_pool.as_str()) == Some(pool)
                && m.status.phase != MachinePhase::Releasing
        })
        .collect()
}

fn count_running(machines: &[&Machine]) -> u32 {
    machines
        .iter()
        .filter(|m| m.status.phase == MachinePhase::Running)
        .count() as u32
}

fn next_role(pool: &str, init_machine: &mut Option<String>, candidate: &str) -> MachineRole {
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

fn finish_status(
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
fn choose_endpoint(
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
fn in_flight_replacements<'a>(
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
fn replaced_by(m: &Machine) -> Option<&str> {
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
fn alive_steps(mine: &[&Machine], observed: &Observed<'_>) -> Vec<Step> {
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

fn endpoint_for(cluster: &Cluster, init: &Machine) -> String {
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

fn random_suffix() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..5)
        .map(|_| {
            let i = rng.random_range(0..36u8);
            (if i < 10 { b'0' + i } else { b'a' + i - 10 }) as char
        })
        .collect()
}

/// Applies one step. Each step re-reads what it changes, so a plan made from
/// slightly old objects cannot overwrite newer ones.
pub async fn execute(app: &App, cluster: &Cluster, step: &Step) -> Result<(), ReconcileError> {
    let cname = &cluster.metadata.name;
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    match step {
        Step::EnsurePki => {
            let pki = ClusterPki::generate(&uid).map_err(|source| ReconcileError::Pki {
                cluster: cname.clone(),
                source,
            })?;
            let name = cluster_pki_name(cname);
            match app.store.get_json::<ClusterPki>(Kind::Secret, &name)? {
                None => {
                    app.store.create_json(Kind::Secret, &name, &pki)?;
                }
                Some((old, rev)) if old.cluster_uid != uid => {
                    // A leftover of a deleted namesake: never reuse its CA.
                    app.store
                        .update_json(Kind::Secret, &name, &pki, Some(rev))?;
                }
                Some(_) => return Ok(()),
            }
            tracing::info!(cluster = %cname, "cluster PKI created");
        }
        Step::Assign {
            machine,
            machine_pool,
            role,
        } => {
            let done = app.update_machine::<StoreError>(machine, |m| {
                if m.spec.assignment.is_some() || m.status.phase != MachinePhase::Registered {
                    return Ok(false);
                }
                m.metadata.generation += 1;
                m.spec.assignment = Some(Assignment {
                    cluster: cname.clone(),
                    cluster_uid: uid.clone(),
                    machine_pool: machine_pool.clone(),
                    role: *role,
                    generation: m.metadata.generation,
                });
                m.status.phase = MachinePhase::Assigned;
                push_event(
                    &mut m.status.events,
                    "Assigned",
                    format!("claimed by cluster {cname} as {role} in pool {machine_pool}"),
                );
                Ok(true)
            })?;
            if done.is_some_and(|m| {
                m.spec
                    .assignment
                    .as_ref()
                    .is_some_and(|a| a.cluster_uid == uid)
            }) {
                tracing::info!(cluster = %cname, machine = %machine, pool = %machine_pool, role = %role, "machine assigned");
            }
        }
        Step::Release { machine, reason } => {
            app.update_machine::<StoreError>(machine, |m| {
                if m.status.phase == MachinePhase::Releasing || m.spec.assignment.is_none() {
                    return Ok(false);
                }
                if m.status.phase == MachinePhase::Assigned && m.status.applied_generation == 0 {
                    // The agent has not started: nothing to undo on the machine.
                    m.spec.assignment = None;
                    m.status.phase = MachinePhase::Registered;
                } else {
                    m.status.phase = MachinePhase::Releasing;
                }
                push_event(&mut m.status.events, "Released", reason.clone());
                Ok(true)
            })?;
            tracing::info!(cluster = %cname, machine = %machine, %reason, "machine released");
        }
        Step::CreateMachine {
            machine_pool,
            role,
            replaces,
        } => {
            let short = if machine_pool == CONTROL_PLANE_POOL {
                "cp"
            } else {
                machine_pool.as_str()
            };
            let name = format!("{cname}-{short}-{}", random_suffix());
            let now = drover_common::now();
            let mut status = MachineStatus {
                phase: MachinePhase::Provisioning,
                ..Default::default()
            };
            push_event(
                &mut status.events,
                "Created",
                format!(
                    "recorded for cluster {cname}, pool {machine_pool}, role {role}{}",
                    replaces
                        .as_ref()
                        .map(|r| format!(", replacing {r}"))
                        .unwrap_or_default()
                ),
            );
            let machine = Machine {
                api_version: drover_common::API_VERSION.into(),
                kind: "Machine".into(),
                metadata: ObjectMeta {
                    name: name.clone(),
                    uid: Some(uuid::Uuid::new_v4().to_string()),
                    generation: 1,
                    creation_timestamp: Some(now),
                    labels: [
                        ("drover.dev/cluster".to_string(), cname.clone()),
                        ("drover.dev/pool".to_string(), machine_pool.clone()),
                    ]
                    .into(),
                    ..Default::default()
                },
                spec: MachineSpec {
                    pool: String::new(),
                    provider: Some(cluster.spec.provider.name().to_owned()),
                    assignment: Some(Assignment {
                        cluster: cname.clone(),
                        cluster_uid: uid.clone(),
                        machine_pool: machine_pool.clone(),
                        role: *role,
                        generation: 1,
                    }),
                },
                status,
            };
            app.store.create_json(Kind::Machine, &name, &machine)?;
            tracing::info!(cluster = %cname, machine = %name, pool = %machine_pool, role = %role, "machine recorded");
            if *role == MachineRole::Init {
                app.update_cluster::<StoreError>(cname, |c| {
                    if c.metadata.uid.as_deref() != Some(uid.as_str()) {
                        return Ok(false);
                    }
                    c.status.init_machine = Some(name.clone());
                    Ok(true)
                })?;
            }
            if let Some(old) = replaces {
                app.update_machine::<StoreError>(old, |m| {
                    push_event(
                        &mut m.status.events,
                        "ReplacedBy",
                        format!("replaced by {name}"),
                    );
                    Ok(true)
                })?;
            }
        }
        Step::Provision { machine } => {
            crate::reconcile::provisioner::provision(app, cluster, machine).await?;
        }
        Step::DeleteMachine {
            machine,
            reason,
            remediation,
        } => {
            app.update_machine::<StoreError>(machine, |m| {
                if matches!(
                    m.status.phase,
                    MachinePhase::Deleting | MachinePhase::Deleted
                ) {
                    return Ok(false);
                }
                m.status.phase = MachinePhase::Deleting;
                m.metadata.deletion_timestamp = Some(drover_common::now());
                if *remediation {
                    push_event(&mut m.status.events, "Unhealthy", reason.clone());
                    push_event(
                        &mut m.status.events,
                        "Remediating",
                        "deleting to replace it",
                    );
                } else {
                    push_event(&mut m.status.events, "Deleting", reason.clone());
                }
                Ok(true)
            })?;
            tracing::info!(cluster = %cname, machine = %machine, %reason, "machine deletion started");
            crate::reconcile::provisioner::destroy(app, cluster, machine).await?;
        }
        Step::Destroy { machine } => {
            crate::reconcile::provisioner::destroy(app, cluster, machine).await?;
        }
        Step::SetAlive {
            machine,
            alive,
            reason,
            message,
        } => set_alive(app, Some(cname), machine, *alive, reason, message)?,
        Step::Forget { machine } => match app.store.delete(Kind::Machine, machine, None) {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        },
        Step::SetStatus(status) => {
            let allowed = |st: &ClusterStatus| {
                st.conditions
                    .iter()
                    .any(|c| c.type_ == "RemediationAllowed" && c.status == "True")
            };
            if !allowed(&cluster.status)
                && cluster
                    .status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "RemediationAllowed")
                && allowed(status)
            {
                grant_grace(app, &uid);
                tracing::info!(cluster = %cname, "remediation resumes; every machine gets a fresh grace period");
            }
            app.update_cluster::<StoreError>(cname, |c| {
                if c.metadata.uid != cluster.metadata.uid || c.status == *status {
                    return Ok(false);
                }
                if c.status.phase != status.phase {
                    tracing::info!(cluster = %cname, from = %c.status.phase, to = %status.phase, "cluster phase changed");
                }
                // The executor may have named a new init machine meanwhile
                // (this pass's CreateMachine); a name the plan dropped on
                // purpose (its machine is gone) stays dropped.
                let init = c.status.init_machine.clone();
                let named_meanwhile = init != cluster.status.init_machine;
                c.status = status.clone();
                if c.status.init_machine.is_none() && named_meanwhile {
                    c.status.init_machine = init;
                }
                Ok(true)
            })?;
        }
        Step::Finalize => {
            if cluster.spec.provider.creates_machines() {
                crate::reconcile::provisioner::delete_cluster_resources(app, cluster).await?;
            }
            // Tombstones of the cluster's machines go with it.
            for m in app.machines()? {
                if m.status.phase == MachinePhase::Deleted
                    && m.spec
                        .assignment
                        .as_ref()
                        .is_some_and(|a| a.cluster_uid == uid)
                {
                    let _ = app.store.delete(Kind::Machine, &m.metadata.name, None);
                }
            }
            let rev = cluster
                .metadata
                .resource_version
                .as_ref()
                .and_then(|r| r.parse().ok());
            for (kind, name) in [
                (Kind::Secret, cluster_pki_name(cname)),
                (Kind::JoinTokens, cname.clone()),
            ] {
                match app.store.delete(kind, &name, None) {
                    Ok(_) | Err(StoreError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            match app.store.delete(Kind::Cluster, cname, rev) {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            tracing::info!(cluster = %cname, "cluster deleted");
        }
    }
    Ok(())
}

/// Records a machine's `Alive` condition, unless it is leaving.
fn set_alive(
    app: &App,
    cluster: Option<&str>,
    machine: &str,
    alive: bool,
    reason: &str,
    message: &str,
) -> Result<(), StoreError> {
    let mut changed = false;
    app.update_machine::<StoreError>(machine, |m| {
        changed = !matches!(
            m.status.phase,
            MachinePhase::Releasing | MachinePhase::Deleting | MachinePhase::Deleted
        ) && set_condition(
            &mut m.status.conditions,
            ALIVE_CONDITION,
            alive,
            reason,
            message,
        );
        Ok(changed)
    })?;
    if changed {
        tracing::info!(cluster = cluster.unwrap_or("-"), machine = %machine, alive, %reason, "machine liveness changed");
    }
    Ok(())
}

/// Keeps the `Alive` condition of machines in no cluster (pool machines
/// waiting to be claimed) true to what the coordinator sees, with the
/// coordinator's health defaults. Returns the errors met.
fn unassigned_alive(app: &App, machines: &[Machine]) -> Vec<String> {
    let free: Vec<&Machine> = machines
        .iter()
        .filter(|m| m.spec.assignment.is_none())
        .collect();
    let last_seen = |name: &str| app.last_seen(name);
    let observed = Observed {
        now: drover_common::now(),
        has_pki: false,
        last_seen: &last_seen,
        instance: &|_| None,
        retry_not_before: &|_| None,
        policy: app.settings.health_defaults,
        heartbeat_interval: app.settings.heartbeat_interval,
    };
    let mut errors = vec![];
    for step in alive_steps(&free, &observed) {
        if let Step::SetAlive {
            machine,
            alive,
            reason,
            message,
        } = &step
        {
            if let Err(e) = set_alive(app, None, machine, *alive, reason, message) {
                let msg = format!("machine {machine}: cannot record its liveness: {e}");
                tracing::warn!(error = %msg, "reconcile step failed");
                errors.push(msg);
            }
        }
    }
    errors
}

/// Gives every machine of a cluster a fresh heartbeat grace period.
fn grant_grace(app: &App, cluster_uid: &str) {
    let now = drover_common::now();
    let Ok(machines) = app.machines() else { return };
    let mut live = app.liveness.lock().expect("liveness lock");
    for m in machines {
        if m.spec
            .assignment
            .as_ref()
            .is_some_and(|a| a.cluster_uid == cluster_uid)
        {
            live.insert(
                m.metadata.name,
                crate::domain::liveness::Liveness { last_seen: now },
            );
        }
    }
}

/// One pass over every cluster. Returns the errors met (each names its
/// cluster); one cluster failing never stops the others.
pub async fn reconcile_all(app: &App) -> Vec<String> {
    let mut errors = vec![];
    let clusters = match app.clusters() {
        Ok(c) => c,
        Err(e) => return vec![format!("cannot list clusters: {e}")],
    };
    // What providers report, once per pass.
    let (instances, provider_errors) = crate::reconcile::provisioner::observe(app, &clusters).await;
    errors.extend(
        provider_errors
            .into_iter()
            .map(|e| format!("cannot list provider machines: {e}")),
    );
    // Read once, and again only after a cluster changed something (it may
    // have claimed pool machines): with many clusters and a large fleet, a
    // read per cluster would make each pass clusters x machines decodes.
    let mut listed: Option<Vec<Machine>> = None;
    for cluster in clusters {
        let now = drover_common::now();
        let machines = match listed.take() {
            Some(m) => m,
            None => match app.machines() {
                Ok(m) => m,
                Err(e) => return vec![format!("cannot list machines: {e}")],
            },
        };
        let has_pki = match crate::domain::secrets::load_pki(&app.store, &cluster) {
            Ok(p) => p.is_some(),
            Err(e) => {
                errors.push(format!("cluster {}: {e}", cluster.metadata.name));
                continue;
            }
        };
        let last_seen = |name: &str| app.last_seen(name);
        let instance = |uid: &str| instances.get(uid).copied();
        let generation = cluster.metadata.generation;
        let retry_not_before = |name: &str| app.provision_retries.not_before(name, generation);
        let policy = Policy::for_cluster(&cluster, app.settings.health_defaults);
        let steps = plan(
            &cluster,
            &machines,
            &Observed {
                now,
                has_pki,
                last_seen: &last_seen,
                instance: &instance,
                retry_not_before: &retry_not_before,
                policy,
                heartbeat_interval: app.settings.heartbeat_interval,
            },
        );
        for step in &steps {
            if let Err(e) = execute(app, &cluster, step).await {
                let msg = format!("cluster {}: {step:?}: {e}", cluster.metadata.name);
                tracing::warn!(error = %msg, "reconcile step failed");
                errors.push(msg);
                break;
            }
        }
        if steps.is_empty() {
            listed = Some(machines);
        }
    }
    match listed.map_or_else(|| app.machines(), Ok) {
        Ok(machines) => errors.extend(unassigned_alive(app, &machines)),
        Err(e) => errors.push(format!("cannot list machines: {e}")),
    }
    errors
}

/// Runs the reconcile loop until `shutdown` fires: every `period`, on store
/// changes, or at once when something calls `app.reconcile_now.notify_one()`.
pub async fn run_loop(
    app: Arc<App>,
    status: Arc<Mutex<LoopStatus>>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let period = app.settings.reconcile_period;
    let mut changes = app.store.watch();
    loop {
        let started = Instant::now();
        // Only the leader reconciles, and every write of its pass is fenced
        // by its term.
        // A follower's loop idles: `runs` counts passes made as leader.
        if let Some(term) = app.leadership.term() {
            let errors = crate::store::fenced(term, reconcile_all(&app)).await;
            let mut s = status.lock().expect("loop status lock");
            s.runs += 1;
            s.last_run_millis = started.elapsed().as_millis() as u64;
            s.last_errors = errors;
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = app.reconcile_now.notified() => {
                // Let a burst of changes settle into one pass.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            change = changes.recv() => {
                if let Ok(c) = &change {
                    tracing::trace!(kind = c.kind.as_str(), name = %c.name, revision = c.revision, deleted = c.deleted, "store change");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                // Coalesce everything that arrived meanwhile into this pass.
                while changes.try_recv().is_ok() {}
            }
            _ = tokio::time::sleep(period) => {}
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::{
        ControlPlaneSpec, LabelSelector, NetworkSpec, PoolProviderSpec, WorkerPoolSpec,
    };
    use std::collections::BTreeMap;

    fn cluster(cp: u32, workers: u32) -> Cluster {
        Cluster {
            api_version: drover_common::API_VERSION.into(),
            kind: "Cluster".into(),
            metadata: ObjectMeta {
                name: "c".into(),
                uid: Some("cu".into()),
                generation: 1,
                ..Default::default()
            },
            spec: drover_common::api::ClusterSpec {
                kubernetes_version: "v1.31.2".into(),
                control_plane: ControlPlaneSpec {
                    replicas: cp,
                    selector: LabelSelector::default(),
                },
                worker_pools: vec![WorkerPoolSpec {
                    name: "w".into(),
                    replicas: workers,
                    selector: LabelSelector::default(),
                }],
                network: NetworkSpec::default(),
                provider: ProviderSpec::Pool(PoolProviderSpec {
                    pool: None,
                    selector: LabelSelector {
                        match_labels: BTreeMap::from([("env".into(), "dev".into())]),
                    },
                }),
                control_plane_endpoint: None,
                health: None,
            },
            status: ClusterStatus::default(),
        }
    }

    fn free(name: &str, env: &str) -> Machine {
        Machine {
            api_version: drover_common::API_VERSION.into(),
            kind: "Machine".into(),
            metadata: ObjectMeta {
                name: name.into(),
                labels: BTreeMap::from([("env".into(), env.into())]),
                ..Default::default()
            },
            spec: MachineSpec {
                pool: "p".into(),
                provider: None,
                assignment: None,
            },
            status: MachineStatus {
                addresses: vec!["10.0.0.9".into()],
                api_server_port: 6443,
                ..Default::default()
            },
        }
    }

    fn seen_now(_: &str) -> Option<OffsetDateTime> {
        Some(drover_common::now())
    }

    fn no_instance(_: &str) -> Option<InstanceState> {
        None
    }

    fn no_retry(_: &str) -> Option<OffsetDateTime> {
        None
    }

    fn obs<'a>(
        has_pki: bool,
        last_seen: &'a dyn Fn(&str) -> Option<OffsetDateTime>,
    ) -> Observed<'a> {
        Observed {
            now: drover_common::now(),
            has_pki,
            last_seen,
            instance: &no_instance,
            retry_not_before: &no_retry,
            policy: Policy::defaults(Duration::from_secs(40)),
            heartbeat_interval: Duration::from_secs(10),
        }
    }

    #[test]
    fn pki_comes_first() {
        let steps = plan(&cluster(1, 2), &[free("a", "dev")], &obs(false, &seen_now));
        assert_eq!(steps, vec![Step::EnsurePki]);
    }

    #[test]
    fn claims_matching_machines_init_first() {
        let machines = vec![
            free("a", "dev"),
            free("b", "prod"),
            free("c", "dev"),
            free("d", "dev"),
        ];
        let steps = plan(&cluster(1, 2), &machines, &obs(true, &seen_now));
        let assigns: Vec<_> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Assign { machine, role, .. } => Some((machine.as_str(), *role)),
                _ => None,
            })
            .collect();
        assert_eq!(
            assigns,
            vec![
                ("a", MachineRole::Init),
                ("c", MachineRole::Worker),
                ("d", MachineRole::Worker)
            ]
        );
        let Some(Step::SetStatus(st)) = steps.last() else {
            panic!("status step expected")
        };
        assert_eq!(st.init_machine.as_deref(), Some("a"));
        assert_eq!(st.control_plane_endpoint.as_deref(), Some("10.0.0.9:6443"));
        assert_eq!(st.phase, ClusterPhase::Provisioning);
    }

    #[test]
    fn dead_machines_are_not_claimed() {
        let dead = |n: &str| (n != "a").then(drover_common::now);
        let steps = plan(
            &cluster(1, 0),
            &[free("a", "dev"), free("b", "dev")],
            &obs(true, &dead),
        );
        assert!(steps.contains(&Step::Assign {
            machine: "b".into(),
            machine_pool: CONTROL_PLANE_POOL.into(),
            role: MachineRole::Init
        }));
    }

    #[test]
    fn converged_cluster_plans_nothing() {
        let mut c = cluster(1, 0);
        let mut m = free("a", "dev");
        m.spec.assignment = Some(Assignment {
            cluster: "c".into(),
            cluster_uid: "cu".into(),
            machine_pool: CONTROL_PLANE_POOL.into(),
            role: MachineRole::Init,
            generation: 2,
        });
        m.status.phase = MachinePhase::Running;
        let obs = obs(true, &seen_now);
        let steps = plan(&c, std::slice::from_ref(&m), &obs);
        let Some(Step::SetStatus(st)) = steps.last() else {
            panic!()
        };
        assert_eq!(st.phase, ClusterPhase::Running);
        c.status = st.clone();
        assert!(plan(&c, &[m], &obs).is_empty());
    }

    #[test]
    fn deletion_releases_then_finalizes() {
        let mut c = cluster(1, 0);
        c.metadata.deletion_timestamp = Some(drover_common::now());
        let mut m = free("a", "dev");
        m.spec.assignment = Some(Assignment {
            cluster: "c".into(),
            cluster_uid: "cu".into(),
            machine_pool: CONTROL_PLANE_POOL.into(),
            role: MachineRole::Init,
            generation: 2,
        });
        m.status.phase = MachinePhase::Running;
        let obs = obs(true, &seen_now);
        let steps = plan(&c, std::slice::from_ref(&m), &obs);
        assert!(matches!(steps[0], Step::Release { .. }));
        assert_eq!(plan(&c, &[], &obs), vec![Step::Finalize]);
    }

    fn docker_cluster(cp: u32, workers: u32) -> Cluster {
        let mut c = cluster(cp, workers);
        c.spec.provider = ProviderSpec::Docker(drover_common::api::DockerProviderSpec {
            image: "drover-node:test".into(),
        });
        c
    }

    fn created(name: &str, pool: &str, role: MachineRole, phase: MachinePhase) -> Machine {
        let mut m = free(name, "dev");
        m.metadata.uid = Some(format!("uid-{name}"));
        m.metadata.creation_timestamp = Some(drover_common::now());
        m.spec.provider = Some("docker".into());
        m.spec.assignment = Some(Assignment {
            cluster: "c".into(),
            cluster_uid: "cu".into(),
            machine_pool: pool.into(),
            role,
            generation: 1,
        });
        m.status.phase = phase;
        m.status.provider_id = Some(format!("ctr-{name}"));
        m.status.ticket_redeemed = true;
        m
    }

    fn creates(steps: &[Step]) -> Vec<(String, MachineRole)> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::CreateMachine {
                    machine_pool, role, ..
                } => Some((machine_pool.clone(), *role)),
                _ => None,
            })
            .collect()
    }

    fn deletes(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::DeleteMachine { machine, .. } => Some(machine.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_failed_create_waits_out_its_back_off() {
        let c = docker_cluster(1, 1);
        let mut pending = created("w1", "w", MachineRole::Worker, MachinePhase::Provisioning);
        pending.status.provider_id = None;
        pending.status.ticket_redeemed = false;
        let machines = vec![
            created(
                "cp1",
                CONTROL_PLANE_POOL,
                MachineRole::Init,
                MachinePhase::Running,
            ),
            pending,
        ];
        let provisions = |o: &Observed<'_>| {
            plan(&c, &machines, o)
                .into_iter()
                .filter(|s| matches!(s, Step::Provision { .. }))
                .count()
        };
        let base = obs(true, &seen_now);
        let later = base.now + time::Duration::seconds(30);
        let waiting = |name: &str| (name == "w1").then_some(later);
        assert_eq!(provisions(&base), 1);
        assert_eq!(
            provisions(&Observed {
                retry_not_before: &waiting,
                ..obs(true, &seen_now)
            }),
            0
        );
        assert_eq!(
            provisions(&Observed {
                retry_not_before: &waiting,
                now: later,
                ..obs(true, &seen_now)
            }),
            1
        );
    }

    #[test]
    fn provider_cluster_starts_with_the_init_machine_and_workers() {
        let steps = plan(&docker_cluster(3, 2), &[], &obs(true, &seen_now));
        assert_eq!(
            creates(&steps),
            vec![
                (CONTROL_PLANE_POOL.to_string(), MachineRole::Init),
                ("w".to_string(), MachineRole::Worker),
                ("w".to_string(), MachineRole::Worker)
            ]
        );
        // With the init machine recorded but not running, no other control plane yet.
        let mut c = docker_cluster(3, 0);
        c.status.init_machine = Some("i".into());
        let init = created(
            "i",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Bootstrapping,
        );
        assert!(creates(&plan(&c, &[init], &obs(true, &seen_now))).is_empty());
    }

    #[test]
    fn stopped_worker_is_replaced() {
        let mut c = docker_cluster(1, 3);
        c.status.init_machine = Some("i".into());
        c.status.initialized = true;
        let machines = vec![
            created(
                "i",
                CONTROL_PLANE_POOL,
                MachineRole::Init,
                MachinePhase::Running,
            ),
            created("w1", "w", MachineRole::Worker, MachinePhase::Running),
            created("w2", "w", MachineRole::Worker, MachinePhase::Running),
            created("w3", "w", MachineRole::Worker, MachinePhase::Running),
        ];
        let stopped = |uid: &str| (uid == "uid-w2").then_some(InstanceState::Stopped);
        let o = Observed {
            instance: &stopped,
            ..obs(true, &seen_now)
        };
        let steps = plan(&c, &machines, &o);
        assert_eq!(deletes(&steps), vec!["w2".to_string()]);
        assert!(steps.contains(&Step::CreateMachine {
            machine_pool: "w".into(),
            role: MachineRole::Worker,
            replaces: Some("w2".into()),
        }));
    }

    #[test]
    fn too_many_unhealthy_pauses_remediation() {
        let mut c = docker_cluster(1, 2);
        c.status.init_machine = Some("i".into());
        c.status.initialized = true;
        let machines = vec![
            created(
                "i",
                CONTROL_PLANE_POOL,
                MachineRole::Init,
                MachinePhase::Running,
            ),
            created("w1", "w", MachineRole::Worker, MachinePhase::Running),
            created("w2", "w", MachineRole::Worker, MachinePhase::Running),
        ];
        let silent = |n: &str| {
            Some(if n.starts_with('w') {
                drover_common::now() - time::Duration::minutes(5)
            } else {
                drover_common::now()
            })
        };
        let steps = plan(&c, &machines, &obs(true, &silent));
        assert!(deletes(&steps).is_empty(), "{steps:?}");
        let Some(Step::SetStatus(st)) = steps.last() else {
            panic!("{steps:?}")
        };
        let cond = st
            .conditions
            .iter()
            .find(|c| c.type_ == "RemediationAllowed")
            .unwrap();
        assert_eq!(cond.status, "False");
        assert!(
            cond.message.contains("remediation paused"),
            "{}",
            cond.message
        );
    }

    #[test]
    fn lone_initialized_control_plane_is_not_remediated() {
        let mut c = docker_cluster(1, 0);
        c.status.init_machine = Some("i".into());
        c.status.initialized = true;
        let machines = vec![created(
            "i",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        )];
        let silent = |_: &str| Some(drover_common::now() - time::Duration::minutes(5));
        let steps = plan(&c, &machines, &obs(true, &silent));
        assert!(deletes(&steps).is_empty(), "{steps:?}");
    }

    #[test]
    fn three_control_planes_remediate_one_keeping_quorum() {
        let mut c = docker_cluster(3, 0);
        c.status.init_machine = Some("a".into());
        c.status.initialized = true;
        let machines = vec![
            created(
                "a",
                CONTROL_PLANE_POOL,
                MachineRole::Init,
                MachinePhase::Running,
            ),
            created(
                "b",
                CONTROL_PLANE_POOL,
                MachineRole::ControlPlane,
                MachinePhase::Running,
            ),
            created(
                "c",
                CONTROL_PLANE_POOL,
                MachineRole::ControlPlane,
                MachinePhase::Running,
            ),
        ];
        let one_silent = |n: &str| {
            Some(if n == "c" {
                drover_common::now() - time::Duration::minutes(5)
            } else {
                drover_common::now()
            })
        };
        assert_eq!(
            deletes(&plan(&c, &machines, &obs(true, &one_silent))),
            vec!["c".to_string()]
        );
        let two_silent = |n: &str| {
            Some(if n == "a" {
                drover_common::now()
            } else {
                drover_common::now() - time::Duration::minutes(5)
            })
        };
        // Two of three unhealthy: over maxUnhealthy, and quorum would break anyway.
        assert!(deletes(&plan(&c, &machines, &obs(true, &two_silent))).is_empty());
    }

    #[test]
    fn scale_down_removes_newest_worker() {
        let mut c = docker_cluster(1, 1);
        c.status.init_machine = Some("i".into());
        c.status.initialized = true;
        let mut old = created("w1", "w", MachineRole::Worker, MachinePhase::Running);
        old.metadata.creation_timestamp = Some(drover_common::now() - time::Duration::hours(1));
        let machines = vec![
            created(
                "i",
                CONTROL_PLANE_POOL,
                MachineRole::Init,
                MachinePhase::Running,
            ),
            old,
            created("w2", "w", MachineRole::Worker, MachinePhase::Running),
        ];
        assert_eq!(
            deletes(&plan(&c, &machines, &obs(true, &seen_now))),
            vec!["w2".to_string()]
        );
    }

    #[test]
    fn no_remediation_in_the_pass_that_ends_a_pause() {
        let mut c = docker_cluster(1, 3);
        c.status.init_machine = Some("i".into());
        c.status.initialized = true;
        set_condition(
            &mut c.status.conditions,
            "RemediationAllowed",
            false,
            "RemediationPaused",
            "x",
        );
        let machines = vec![
            created(
                "i",
                CONTROL_PLANE_POOL,
                MachineRole::Init,
                MachinePhase::Running,
            ),
            created("w1", "w", MachineRole::Worker, MachinePhase::Running),
            created("w2", "w", MachineRole::Worker, MachinePhase::Running),
            created("w3", "w", MachineRole::Worker, MachinePhase::Running),
        ];
        // w1 is back, w2 is still a little late.
        let late = |n: &str| {
            Some(if n == "w2" {
                drover_common::now() - time::Duration::minutes(1)
            } else {
                drover_common::now()
            })
        };
        let steps = plan(&c, &machines, &obs(true, &late));
        assert!(deletes(&steps).is_empty(), "{steps:?}");
        let Some(Step::SetStatus(st)) = steps.last() else {
            panic!("{steps:?}")
        };
        let cond = st
            .conditions
            .iter()
            .find(|c| c.type_ == "RemediationAllowed")
            .unwrap();
        assert_eq!(cond.status, "True");
    }

    fn status_of(steps: &[Step]) -> &ClusterStatus {
        steps
            .iter()
            .find_map(|s| match s {
                Step::SetStatus(st) => Some(st),
                _ => None,
            })
            .unwrap_or_else(|| panic!("status step expected: {steps:?}"))
    }

    fn condition<'a>(st: &'a ClusterStatus, t: &str) -> &'a drover_common::api::Condition {
        st.conditions
            .iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("no {t} condition in {st:?}"))
    }

    #[test]
    fn a_replacement_still_starting_counts_against_max_unhealthy() {
        let mut c = docker_cluster(1, 3);
        c.status.init_machine = Some("i".into());
        c.status.initialized = true;
        let mut old = created("w1", "w", MachineRole::Worker, MachinePhase::Deleted);
        push_event(
            &mut old.status.events,
            "Remediating",
            "deleting to replace it",
        );
        push_event(&mut old.status.events, "ReplacedBy", "replaced by r1");
        old.metadata.deletion_timestamp = Some(drover_common::now());
        let machines = vec![
            created(
                "i",
                CONTROL_PLANE_POOL,
                MachineRole::Init,
                MachinePhase::Running,
            ),
            old,
            created("r1", "w", MachineRole::Worker, MachinePhase::Bootstrapping),
            created("w2", "w", MachineRole::Worker, MachinePhase::Running),
            created("w3", "w", MachineRole::Worker, MachinePhase::Running),
        ];
        // w2 went silent a pass after w1: with r1 not Running yet, two of
        // three slots are down.
        let w2_silent = |n: &str| {
            Some(if n == "w2" {
                drover_common::now() - time::Duration::minutes(5)
            } else {
                drover_common::now()
            })
        };
        let steps = plan(&c, &machines, &obs(true, &w2_silent));
        assert!(deletes(&steps).is_empty(), "{steps:?}");
        let cond = condition(status_of(&steps), "RemediationAllowed");
        assert_eq!(cond.status, "False");
        assert!(
            cond.message.contains("r1 being replaced"),
            "{}",
            cond.message
        );
        // Once r1 runs, w2 alone is within the limit.
        let mut machines = machines;
        machines[2].status.phase = MachinePhase::Running;
        assert_eq!(
            deletes(&plan(&c, &machines, &obs(true, &w2_silent))),
            vec!["w2".to_string()]
        );
    }

    #[test]
    fn a_silent_machine_is_replaced_at_its_timeout_unless_others_missed_beats_too() {
        let mut c = docker_cluster(1, 3);
        c.status.init_machine = Some("i".into());
        c.status.initialized = true;
        let machines = vec![
            created(
                "i",
                CONTROL_PLANE_POOL,
                MachineRole::Init,
                MachinePhase::Running,
            ),
            created("w1", "w", MachineRole::Worker, MachinePhase::Running),
            created("w2", "w", MachineRole::Worker, MachinePhase::Running),
            created("w3", "w", MachineRole::Worker, MachinePhase::Running),
        ];
        let now = drover_common::now();
        let silent = |w1: i64, w2: i64| {
            move |n: &str| {
                Some(match n {
                    "w1" => now - time::Duration::seconds(w1),
                    "w2" => now - time::Duration::seconds(w2),
                    _ => now,
                })
            }
        };
        // Timeout 40 s, interval 10 s. w1 alone is past its timeout: it is
        // replaced at once, with no wait beyond the timeout.
        let alone = silent(41, 0);
        assert_eq!(
            deletes(&plan(
                &c,
                &machines,
                &Observed {
                    now,
                    ..obs(true, &alone)
                }
            )),
            vec!["w1".to_string()]
        );
        // w2 was cut off with it and has missed beats for 32 s (late, not
        // yet past its own timeout): two of three count, so nothing is
        // replaced and remediation pauses.
        let together = silent(41, 32);
        let steps = plan(
            &c,
            &machines,
            &Observed {
                now,
                ..obs(true, &together)
            },
        );
        assert!(deletes(&steps).is_empty(), "{steps:?}");
        let status = status_of(&steps);
        let allowed = status
            .conditions
            .iter()
            .find(|c| c.type_ == "RemediationAllowed")
            .expect("RemediationAllowed condition");
        assert_eq!(allowed.status, "False", "{allowed:?}");
        assert!(
            allowed.message.contains("w2 missing heartbeats"),
            "{}",
            allowed.message
        );
    }

    #[test]
    fn a_dead_lone_control_plane_degrades_the_cluster_with_a_stable_status() {
        let mut c = docker_cluster(1, 1);
        c.status.init_machine = Some("i".into());
        c.status.initialized = true;
        c.status.control_plane_endpoint = Some("10.0.0.9:6443".into());
        let machines = vec![
            created(
                "i",
                CONTROL_PLANE_POOL,
                MachineRole::Init,
                MachinePhase::Running,
            ),
            created("w1", "w", MachineRole::Worker, MachinePhase::Running),
        ];
        let now = drover_common::now();
        let cp_silent_since = now - time::Duration::minutes(5);
        let cp_silent = |n: &str| Some(if n == "i" { cp_silent_since } else { now });
        let steps = plan(
            &c,
            &machines,
            &Observed {
                now,
                ..obs(true, &cp_silent)
            },
        );
        assert!(deletes(&steps).is_empty(), "{steps:?}");
        assert!(steps.contains(&Step::SetAlive {
            machine: "i".into(),
            alive: false,
            reason: "Silent".into(),
            message: "no heartbeat within the heartbeat timeout (40s)".into(),
        }));
        let st = status_of(&steps).clone();
        assert_eq!(st.phase, ClusterPhase::Degraded);
        let ready = condition(&st, "Ready");
        assert_eq!(ready.reason, "MachinesUnhealthy");
        assert_eq!(ready.message, "control-plane: i silent");
        let allowed = condition(&st, "RemediationAllowed");
        assert_eq!(allowed.status, "False");
        assert_eq!(
            allowed.message,
            "pool control-plane: 1 of 1 machines are unhealthy or being replaced (i silent), more than maxUnhealthy 40% allows (0); remediation paused"
        );
        // A minute later nothing in the status changes: no rewrite per pass.
        c.status = st;
        let later = now + time::Duration::minutes(1);
        let still_silent = |n: &str| Some(if n == "i" { cp_silent_since } else { later });
        let steps = plan(
            &c,
            &machines,
            &Observed {
                now: later,
                ..obs(true, &still_silent)
            },
        );
        assert!(
            !steps.iter().any(|s| matches!(s, Step::SetStatus(_))),
            "{steps:?}"
        );
    }

    #[test]
    fn after_the_init_machine_is_replaced_joins_aim_at_a_live_control_plane() {
        let mut c = docker_cluster(3, 0);
        c.status.init_machine = Some("a".into());
        c.status.initialized = true;
        c.status.control_plane_endpoint = Some("10.0.0.1:6443".into());
        let mut a = created(
            "a",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Deleted,
        );
        a.status.addresses = vec!["10.0.0.1".into()];
        push_event(
            &mut a.status.events,
            "Remediating",
            "deleting to replace it",
        );
        a.metadata.deletion_timestamp = Some(drover_common::now());
        let mut b = created(
            "b",
            CONTROL_PLANE_POOL,
            MachineRole::ControlPlane,
            MachinePhase::Running,
        );
        b.status.addresses = vec!["10.0.0.2".into()];
        let mut cc = created(
            "c",
            CONTROL_PLANE_POOL,
            MachineRole::ControlPlane,
            MachinePhase::Running,
        );
        cc.status.addresses = vec!["10.0.0.3".into()];
        b.metadata.creation_timestamp = Some(drover_common::now() - time::Duration::minutes(2));
        let steps = plan(&c, &[a, b, cc], &obs(true, &seen_now));
        // The replacement joins as a control plane: the cluster is initialized.
        assert!(steps.contains(&Step::CreateMachine {
            machine_pool: CONTROL_PLANE_POOL.into(),
            role: MachineRole::ControlPlane,
            replaces: Some("a".into()),
        }));
        let st = status_of(&steps);
        assert_eq!(st.init_machine, None, "a deleted machine's name stays");
        assert!(st.initialized);
        assert_eq!(st.control_plane_endpoint.as_deref(), Some("10.0.0.2:6443"));
    }

    #[test]
    fn alive_condition_is_written_only_when_it_changes() {
        let mut m = free("a", "dev");
        m.status.phase = MachinePhase::Registered;
        let now = drover_common::now();
        let silent = |_: &str| Some(now - time::Duration::minutes(5));
        let heard = |_: &str| Some(now);
        // Never in trouble: no condition, no write.
        assert!(alive_steps(
            &[&m],
            &Observed {
                now,
                ..obs(true, &heard)
            }
        )
        .is_empty());
        let steps = alive_steps(
            &[&m],
            &Observed {
                now,
                ..obs(true, &silent)
            },
        );
        assert_eq!(
            steps,
            vec![Step::SetAlive {
                machine: "a".into(),
                alive: false,
                reason: "Silent".into(),
                message: "no heartbeat within the heartbeat timeout (40s)".into(),
            }]
        );
        set_condition(
            &mut m.status.conditions,
            ALIVE_CONDITION,
            false,
            "Silent",
            "no heartbeat within the heartbeat timeout (40s)",
        );
        assert!(alive_steps(
            &[&m],
            &Observed {
                now,
                ..obs(true, &silent)
            }
        )
        .is_empty());
        let stopped = |_: &str| Some(InstanceState::Stopped);
        assert!(matches!(
            &alive_steps(
                &[&m],
                &Observed {
                    now,
                    instance: &stopped,
                    ..obs(true, &heard)
                }
            )[..],
            [Step::SetAlive { alive: false, reason, .. }] if reason == "Stopped"
        ));
        assert!(matches!(
            &alive_steps(&[&m], &Observed { now, ..obs(true, &heard) })[..],
            [Step::SetAlive { alive: true, reason, .. }] if reason == "Heartbeating"
        ));
        // A deleted machine is left alone.
        m.status.phase = MachinePhase::Deleted;
        assert!(alive_steps(
            &[&m],
            &Observed {
                now,
                ..obs(true, &heard)
            }
        )
        .is_empty());
    }
}
