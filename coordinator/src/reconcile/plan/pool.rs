//! Planning for clusters of pool machines: claim registered machines that
//! match a pool's selector, release the ones past the desired count.

use super::shared::*;
use std::collections::BTreeSet;

use drover_common::api::{
    set_condition, Cluster, Machine, MachinePhase, MachineRole, PoolStatus, ProviderSpec,
};

pub(super) fn plan_pool(
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
