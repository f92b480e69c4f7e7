//! Planning for clusters whose machines a provider (docker, aws) creates
//! and destroys.

use super::rollout::{self, PoolRoll};
use super::shared::*;

use drover_common::api::{
    Cluster, Machine, MachinePhase, MachineRole, PoolStatus, ProviderSpec, CONTROL_PLANE_POOL,
};

use crate::health::{quorum_allows_removal, Decision};
use crate::instance::InstanceState;

pub(super) fn plan_provider(
    cluster: &Cluster,
    mine: &[&Machine],
    observed: &Observed<'_>,
) -> Vec<Step> {
    let mut steps = forget_steps(mine, observed);
    if cluster.metadata.deletion_timestamp.is_some() {
        steps.extend(deleting_steps(cluster, mine, true));
        return steps;
    }
    if !observed.has_pki {
        steps.push(Step::EnsurePki);
        return steps;
    }
    if wants_load_balancer(cluster, mine) {
        // The endpoint goes into the API server's certificate and every
        // kubeconfig, so the load balancer comes before the first machine.
        steps.push(Step::EnsureEndpoint);
        return steps;
    }
    // The load balancer is part of the cluster: checked every pass, and
    // brought back (started, unpaused, made again) when it is down.
    let endpoint_down = endpoint_down(cluster, observed);
    if endpoint_down.is_some() {
        steps.push(Step::EnsureEndpoint);
    }
    let mut status = base_status(cluster);
    let live: Vec<&Machine> = mine
        .iter()
        .copied()
        .filter(|m| !matches!(m.status.phase, MachinePhase::Deleted))
        .collect();
    let mut init_machine = current_init(cluster, &live);
    let initialized = initialized(cluster, &live, init_machine.as_deref());
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
    let was_paused = remediation_was_paused(cluster);

    // Machines already being deleted are finished first.
    for m in &live {
        if m.status.phase == MachinePhase::Deleting {
            steps.push(Step::Destroy {
                machine: m.metadata.name.clone(),
            });
        }
    }
    steps.extend(alive_steps(&live, observed));

    // etcd membership as the control planes report it: joins wait until it
    // is settled, and a control plane that leaves on purpose has its
    // member removed (through another one) before it is deleted.
    let etcd_members = &cluster.status.etcd_members;
    let cp_owners: Vec<&Machine> = live
        .iter()
        .copied()
        .filter(|m| m.status.phase != MachinePhase::Deleting && is_control_plane(m))
        .collect();
    let via: Vec<&Machine> = cp_owners
        .iter()
        .copied()
        .filter(|m| {
            m.status.phase == MachinePhase::Running && m.metadata.deletion_timestamp.is_none()
        })
        .collect();
    let etcd_settled = plan_etcd(cluster, &cp_owners, &[], &via, observed.now).settled;
    let mut etcd_leaving: Vec<&Machine> = vec![];
    // etcd whole: a healthy member for every control plane, no other.
    let etcd_whole = etcd_settled
        && etcd_members.len() == cp_owners.len()
        && etcd_members.iter().all(|m| m.healthy && !m.is_learner)
        && cp_owners
            .iter()
            .all(|m| member_of(etcd_members, m).is_some());
    let halted = rollout::is_halted(cluster);
    // The first pool still rolling: the later ones wait for it.
    let mut rolling_pool: Option<String> = None;
    let mut waiting: Option<String> = None;
    let mut rollouts = vec![];
    let mut new_halt = None;
    let mut new_failures = vec![];
    let failed_before = rollout::failed_before(cluster);
    let mut config_behind = false;
    // The control-plane pool has nothing outdated and all its machines run.
    let mut cp_rolled = false;

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
        let in_flight = in_flight_replacements(mine, &live, &pool_name);
        let judged = judge(
            &pool_name,
            desired,
            &active,
            in_flight,
            nodes_to_judge(cluster, endpoint_down.is_some()),
            observed,
        );
        let unhealthy = &judged.unhealthy;
        for (m, u) in unhealthy {
            degraded.push((
                m.metadata.name.clone(),
                format!("{pool_name}: {} {}", m.metadata.name, u.summary()),
            ));
        }
        let mut remediate = remediation(
            &judged,
            &active,
            Gate {
                control_plane: is_cp,
                busy: deleting_here > 0,
                initialized,
            },
            &mut paused,
        );
        if was_paused {
            // Remediation resumes one pass after a pause ends.
            remediate.clear();
        }
        for (m, why) in &remediate {
            steps.push(Step::DeleteMachine {
                machine: m.metadata.name.clone(),
                reason: format!("unhealthy: {why}"),
                remediation: true,
            });
        }
        // Machines an operator asked to delete leave the same way, and are
        // replaced; a control-plane machine only when no other change is
        // under way and the rest keeps quorum.
        let requested = requested_deletions(
            &judged,
            &active,
            &remediate,
            Gate {
                control_plane: is_cp,
                busy: deleting_here > 0
                    || !remediate.is_empty()
                    || active.iter().any(|m| {
                        m.status.phase != MachinePhase::Running
                            && m.metadata.deletion_timestamp.is_none()
                    }),
                initialized,
            },
        );
        let (requested, first_member): (Vec<&Machine>, Vec<&Machine>) = requested
            .into_iter()
            .partition(|m| member_of(etcd_members, m).is_none());
        etcd_leaving.extend(first_member);
        for m in &requested {
            steps.push(Step::DeleteMachine {
                machine: m.metadata.name.clone(),
                reason: "deletion requested by an operator".into(),
                remediation: false,
            });
            remediate.push((m, "deletion requested".into()));
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

        // A rollout may grow the pool above its replicas (surge) and
        // retires outdated machines; pools roll one at a time.
        let unhealthy_why: Vec<(&Machine, String)> =
            unhealthy.iter().map(|(m, u)| (*m, u.summary())).collect();
        let leaving: Vec<&Machine> = remaining
            .iter()
            .copied()
            .filter(|m| {
                is_cp
                    && initialized
                    && m.status.phase == MachinePhase::Running
                    && rollout::is_outdated(cluster, m, observed.now)
                    && match member_of(etcd_members, m) {
                        // Its member was removed: it alone of the control
                        // planes has none (an empty or partial report
                        // says nothing).
                        None => {
                            !etcd_members.is_empty()
                                && cp_owners
                                    .iter()
                                    .filter(|o| member_of(etcd_members, o).is_none())
                                    .count()
                                    == 1
                        }
                        Some(member) => cluster
                            .status
                            .etcd_removal
                            .as_ref()
                            .is_some_and(|r| r.id == member.id),
                    }
            })
            .collect();
        let roll = rollout::roll_pool(
            cluster,
            &PoolRoll {
                pool: &pool_name,
                desired,
                control_plane: is_cp,
                policy: cluster.rollout_policy(&pool_name),
                remaining: &remaining,
                unhealthy: &unhealthy_why,
                failed_before,
                blocked: if let Some(pool) = &rolling_pool {
                    Some(format!("pool {pool} to finish its rollout first"))
                } else if !initialized {
                    Some("the cluster to initialize".into())
                } else if deleting_here > 0 {
                    Some(format!(
                        "{deleting_here} machine(s) of pool {pool_name} to finish leaving"
                    ))
                } else if let Some((m, why)) = remediate.first() {
                    Some(format!(
                        "machine {} to be replaced ({why})",
                        m.metadata.name
                    ))
                } else if let Some((m, u)) = unhealthy.first() {
                    Some(format!(
                        "machine {} to be healthy: {}",
                        m.metadata.name,
                        u.summary()
                    ))
                } else if is_cp && !etcd_whole {
                    Some(
                        "etcd to be whole (a healthy member for every control plane, as they report)"
                            .into(),
                    )
                } else if cluster.status.endpoint_ready == Some(false) {
                    Some("the cluster's endpoint to answer /readyz".into())
                } else {
                    None
                },
                halted,
                leaving: &leaving,
            },
            observed.now,
        );
        if roll.rolling && rolling_pool.is_none() {
            rolling_pool = Some(pool_name.clone());
        }
        if is_cp {
            cp_rolled = !roll.rolling && count_running(&remaining) >= desired;
        }
        if waiting.is_none() {
            waiting = roll.waiting.clone().map(|w| format!("{pool_name}: {w}"));
        }
        rollouts.push(roll.progress.clone());
        if new_halt.is_none() {
            new_halt = roll.halt.clone();
        }
        new_failures.extend(roll.failures.iter().cloned());
        let ceiling = roll.ceiling;

        let mut to_replace = unreplaced(mine, &members, &pool_name, &remediate);
        // Scale up. Control-plane machines come one at a time, and the
        // others only once the first has initialized the cluster.
        while count < ceiling {
            if is_cp {
                let busy = remaining
                    .iter()
                    .any(|m| m.status.phase != MachinePhase::Running);
                // A control plane leaving in this pass still counts as a
                // healthy etcd member in what was last reported; its
                // replacement is created once its member is gone, or the
                // join would meet a cluster with a member down.
                let leaving_now = !remediate.is_empty();
                if busy || leaving_now || !etcd_settled || (count > 0 && !initialized) {
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
            if role == MachineRole::ControlPlane
                && !config_names(cluster, &cluster.spec.kubernetes_version)
            {
                // It would deploy the version kubeadm-config names: that
                // changes first.
                config_behind = true;
                break;
            }
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
        if count > ceiling {
            let victims = scale_down(
                &remaining,
                (count - ceiling) as usize,
                init_machine.as_deref(),
                is_cp,
            );
            let leave = Leave {
                control_plane: is_cp,
                etcd_members,
            };
            leave.apply(victims, &mut etcd_leaving, &mut steps, |_| {
                format!(
                    "pool {pool_name} of cluster {} scaled down to {desired}",
                    cluster.metadata.name
                )
            });
            count = ceiling;
        } else if !roll.retire.is_empty() {
            // Outdated machines leave by the safe path, as in a
            // scale-down.
            let leave = Leave {
                control_plane: is_cp,
                etcd_members,
            };
            leave.apply(
                roll.retire.iter().copied(),
                &mut etcd_leaving,
                &mut steps,
                |m| match rollout::expiring_certificates(cluster, m, observed.now) {
                    Some(c) => format!(
                        "its certificates are renewed: {} expires at {}",
                        c.certificate,
                        c.expires_at.date()
                    ),
                    None => format!(
                        "rolled out: made for {}, cluster {} now runs {}",
                        made_for(m),
                        cluster.metadata.name,
                        rollout::target(cluster)
                    ),
                },
            );
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
    if let Some(lb) = &cluster.status.load_balancer {
        // A control plane that leaves gets no new connection from the
        // moment it is chosen: the backends change before it goes.
        let leaving: Vec<String> = steps
            .iter()
            .filter_map(|s| match s {
                Step::DeleteMachine { machine, .. } => Some(machine.clone()),
                _ => None,
            })
            .chain(etcd_leaving.iter().map(|m| m.metadata.name.clone()))
            .collect();
        let backends = endpoint_backends(&live, &leaving);
        if backends != lb.backends {
            steps.insert(0, Step::SetEndpointBackends { backends });
        }
        // It goes (its member removed, or its machine deleted) only once
        // the load balancer was told: a later pass.
        let still_served = |name: &str| {
            live.iter()
                .filter(|m| m.metadata.name == name)
                .filter_map(|m| backend_of(m))
                .any(|b| lb.backends.contains(&b))
        };
        steps.retain(|s| match s {
            Step::DeleteMachine {
                machine,
                remediation: false,
                ..
            } => !still_served(machine),
            _ => true,
        });
        etcd_leaving.retain(|m| !still_served(&m.metadata.name));
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
    status.etcd_removal = plan_etcd(cluster, &cp_owners, &etcd_leaving, &via, observed.now).removal;
    status.version_update = plan_version_update(
        cluster,
        config_behind.then_some(cluster.spec.kubernetes_version.as_str()),
        &via,
        observed.now,
    );
    // Once the last new control plane of a rollout is in, kube-proxy and
    // CoreDNS follow, as `kubeadm upgrade apply` upgrades them after the
    // control plane; the rollout is done only once they are.
    let version = cluster.spec.kubernetes_version.as_str();
    let rollout_under_way = rolling_pool.is_some()
        || cluster
            .status
            .rollout
            .as_ref()
            .is_some_and(|r| r.target == rollout::target(cluster));
    let addons_wanted =
        (initialized && cp_rolled && rollout_under_way && config_names(cluster, version))
            .then_some(version);
    status.essential_addons =
        rollout::plan_essential_addons(cluster, addons_wanted, &via, observed.now);
    let addons_pending = addons_wanted.is_some()
        && !status
            .essential_addons
            .as_ref()
            .is_some_and(|u| u.version == version && u.is_done());
    if addons_pending && waiting.is_none() {
        waiting = Some(rollout::essential_addons_waiting(
            version,
            status.essential_addons.as_ref(),
            observed.now,
        ));
    }
    let owners: Vec<&Machine> = live
        .iter()
        .copied()
        .filter(|m| m.status.phase != MachinePhase::Deleting)
        .collect();
    apply_nodes(
        &mut status,
        &plan_nodes(cluster, &owners, &via, observed.now),
    );
    super::addons::apply_addons(&mut status, cluster, &via, observed.now);
    set_remediation_condition(&mut status, &paused);
    status.rollout = rollout::rollout_status(
        cluster,
        rollouts,
        rolling_pool.is_some() || addons_pending,
        new_halt,
        new_failures,
        waiting,
        observed.now,
    );
    rollout::set_halted_condition(&mut status);
    rollout::set_waiting_condition(&mut status);
    set_endpoint_condition(&mut status, endpoint_down.as_deref());
    if status != cluster.status {
        steps.push(Step::SetStatus(Box::new(status)));
    }
    steps
}

/// Whether the cluster gets a provider load balancer as its endpoint: a
/// docker cluster without one of the user's, before its first machine (a
/// cluster that has machines from before load balancers keeps its
/// machine-address endpoint: its certificates do not name another). An aws
/// cluster gets its Network Load Balancer the same way, or, when the spec
/// names the user's target group, has that recorded as its load balancer
/// (Drover then only registers control planes in it).
fn wants_load_balancer(cluster: &Cluster, mine: &[&Machine]) -> bool {
    let wanted = match &cluster.spec.provider {
        ProviderSpec::Docker(_) => cluster.spec.control_plane_endpoint.is_none(),
        ProviderSpec::Aws(a) => {
            cluster.spec.control_plane_endpoint.is_none() || a.user_target_group().is_some()
        }
        ProviderSpec::Pool(_) => false,
    };
    wanted
        && cluster.status.load_balancer.is_none()
        && mine.iter().all(|m| m.status.phase == MachinePhase::Deleted)
}

/// Why the cluster's provider-run endpoint (docker's load-balancer
/// container) is down, as observed this pass; `None` while it runs or is
/// not observed (another provider, a listing that failed).
fn endpoint_down(cluster: &Cluster, observed: &Observed<'_>) -> Option<String> {
    let lb = cluster.status.load_balancer.as_ref()?;
    if !matches!(cluster.spec.provider, ProviderSpec::Docker(_)) {
        return None;
    }
    let uid = cluster.metadata.uid.as_deref()?;
    let state = (observed.instance)(&crate::instance::endpoint_key(uid))?;
    let what = match state {
        InstanceState::Running | InstanceState::Pending => return None,
        InstanceState::Paused => "paused",
        InstanceState::Stopped => "stopped or removed",
    };
    Some(format!(
        "load balancer {} ({}) is {what}; the coordinator brings it back",
        lb.id, lb.address
    ))
}

/// What a machine was made for: its version and image, as recorded.
fn made_for(m: &Machine) -> String {
    let a = m.spec.assignment.as_ref();
    let version = a
        .and_then(|a| a.kubernetes_version.as_deref())
        .unwrap_or("an unrecorded version");
    match a.and_then(|a| a.image.as_deref()) {
        Some(image) => format!("{version} from {image}"),
        None => version.to_owned(),
    }
}

/// What limits a pool's changes in one pass.
#[derive(Debug, Clone, Copy)]
struct Gate {
    /// The pool is the control plane: one machine at a time, under quorum.
    control_plane: bool,
    /// Another change of the pool is under way.
    busy: bool,
    /// `kubeadm init` has run: there is etcd quorum to keep.
    initialized: bool,
}

/// The unhealthy machines to replace now: those `maxUnhealthy` allows, and
/// of the control plane one at a time and only while the rest keeps etcd
/// quorum (before init there is no etcd to protect). Why a control plane
/// waits goes into `paused`.
fn remediation<'a>(
    judged: &Judgement<'a>,
    active: &[&'a Machine],
    gate: Gate,
    paused: &mut Vec<String>,
) -> Vec<(&'a Machine, String)> {
    let names = match &judged.decision {
        Decision::Paused(msg) => {
            paused.push(msg.clone());
            return vec![];
        }
        Decision::Remediate(names) => names,
    };
    let mut chosen = judged
        .unhealthy
        .iter()
        .filter(|(m, _)| names.contains(&m.metadata.name));
    if !gate.control_plane {
        return chosen.map(|(m, why)| (*m, why.to_string())).collect();
    }
    let Some((m, why)) = chosen.next().filter(|_| !gate.busy) else {
        return vec![];
    };
    let healthy_others = judged.healthy_others(active, m);
    if !gate.initialized || quorum_allows_removal(active.len() as u32, healthy_others) {
        vec![(*m, why.to_string())]
    } else {
        paused.push(format!(
            "control plane: {} is {} but removing it would break etcd quorum ({healthy_others} healthy of {} members); not remediated",
            m.metadata.name,
            why.summary(),
            active.len()
        ));
        vec![]
    }
}

/// The machines an operator asked to delete that may leave now (and are
/// replaced): every worker, and one control-plane machine when no other
/// change is under way and the rest keeps quorum.
fn requested_deletions<'a>(
    judged: &Judgement<'a>,
    active: &[&'a Machine],
    remediate: &[(&'a Machine, String)],
    gate: Gate,
) -> Vec<&'a Machine> {
    let requested = asked_to_leave(active, remediate);
    if !gate.control_plane {
        return requested;
    }
    requested
        .into_iter()
        .take(1)
        .filter(|m| {
            !gate.busy
                && quorum_allows_removal(active.len() as u32, judged.healthy_others(active, m))
        })
        .collect()
}

/// Machines this pool lost (to remediation or an operator's request) that
/// no machine replaces yet, by name; the last is replaced first.
fn unreplaced(
    mine: &[&Machine],
    members: &[&Machine],
    pool: &str,
    leaving_now: &[(&Machine, String)],
) -> Vec<String> {
    let mut out: Vec<String> = members
        .iter()
        .chain(mine.iter().filter(|m| {
            m.status.phase == MachinePhase::Deleted
                && m.spec.assignment.as_ref().map(|a| a.machine_pool.as_str()) == Some(pool)
        }))
        .filter(|m| needs_replacement_link(m))
        .map(|m| m.metadata.name.clone())
        .chain(leaving_now.iter().map(|(m, _)| m.metadata.name.clone()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Which of `remaining` a scale-down by `excess` deletes now: the newest
/// first, never the init machine while it is needed, and of the control
/// plane one per pass. They leave through [`Leave`].
fn scale_down<'a>(
    remaining: &[&'a Machine],
    excess: usize,
    init_machine: Option<&str>,
    control_plane: bool,
) -> Vec<&'a Machine> {
    let mut victims: Vec<&Machine> = remaining.to_vec();
    victims.sort_by_key(|m| {
        (
            Some(m.metadata.name.as_str()) == init_machine,
            m.status.phase == MachinePhase::Running,
            std::cmp::Reverse(m.metadata.creation_timestamp),
        )
    });
    let take = if control_plane { excess.min(1) } else { excess };
    victims.truncate(take);
    victims
}

/// How machines leave a pool by the safe path: a control plane with an etcd
/// member has the member removed first, the others are deleted at once.
struct Leave<'e> {
    control_plane: bool,
    etcd_members: &'e [drover_common::api::EtcdMember],
}

impl Leave<'_> {
    /// Sends each of `machines` on its way: into `etcd_leaving`, or a
    /// `DeleteMachine` step with the reason `why` gives.
    fn apply<'a>(
        &self,
        machines: impl IntoIterator<Item = &'a Machine>,
        etcd_leaving: &mut Vec<&'a Machine>,
        steps: &mut Vec<Step>,
        why: impl Fn(&Machine) -> String,
    ) {
        for m in machines {
            if self.control_plane && member_of(self.etcd_members, m).is_some() {
                etcd_leaving.push(m);
                continue;
            }
            steps.push(Step::DeleteMachine {
                machine: m.metadata.name.clone(),
                reason: why(m),
                remediation: false,
            });
        }
    }
}
