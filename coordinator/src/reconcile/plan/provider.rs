//! Planning for clusters whose machines a provider (docker, aws) creates
//! and destroys.

use super::shared::*;

use drover_common::api::{
    set_condition, Cluster, Machine, MachinePhase, MachineRole, PoolStatus, CONTROL_PLANE_POOL,
};

use crate::domain::health::{check, decide, is_late, quorum, Decision, PoolHealth, Unhealthy};

pub(super) fn plan_provider(
    cluster: &Cluster,
    mine: &[&Machine],
    observed: &Observed<'_>,
) -> Vec<Step> {
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
