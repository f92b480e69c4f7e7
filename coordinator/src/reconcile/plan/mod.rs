//! The planner: `plan(cluster, machines, observed) -> Vec<Step>`, pure.
//! `pool.rs` plans clusters of pool machines, `provider.rs` clusters whose
//! machines a provider (docker, aws) creates; `shared.rs` holds what both
//! use; `drain.rs` holds back the removal of a machine leaving on purpose
//! until its Node is drained.

mod addons;
mod drain;
#[cfg(test)]
pub(crate) mod fixtures;
mod in_place;
mod pool;
mod provider;
mod rollout;
mod shared;

#[cfg(test)]
pub use drain::DRAIN_CONDITION;
use pool::plan_pool;
use provider::plan_provider;
pub use shared::*;

use drover_common::api::{Cluster, Machine};

/// The machines of `machines` assigned to `cluster`.
pub fn machines_of<'a>(cluster: &Cluster, machines: &'a [Machine]) -> Vec<&'a Machine> {
    let uid = cluster.metadata.uid.as_deref().unwrap_or_default();
    machines
        .iter()
        .filter(|m| {
            m.spec
                .assignment
                .as_ref()
                .is_some_and(|a| a.cluster_uid == uid)
        })
        .collect()
}

/// Plans the steps that bring `cluster` closer to its spec. Pure.
pub fn plan(cluster: &Cluster, machines: &[Machine], observed: &Observed<'_>) -> Vec<Step> {
    let mine = machines_of(cluster, machines);
    let steps = if cluster.spec.provider.creates_machines() {
        plan_provider(cluster, &mine, observed)
    } else {
        plan_pool(cluster, &mine, machines, observed)
    };
    drain::gate_drains(cluster, &mine, observed, steps)
}
