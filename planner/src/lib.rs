//! The planner: `plan(cluster, machines, observed) -> Vec<Step>`, what the
//! coordinator's reconciler does next for one cluster, and the machine
//! health judgement it rests on.
//!
//! Invariant: **the planner does no IO.** It is a function of the cluster,
//! its machines and what the coordinator observed ([`Observed`]: the time,
//! heartbeats, what the providers report, back-offs); the coordinator reads
//! them and applies the steps. Cargo keeps it so: this crate depends only on
//! `drover-common` and `time`, which `tests/tests/layers.rs` checks.
//!
//! - `health.rs`: when a machine is unhealthy and what remediation may do
//!   over a pool (`decide`), etcd quorum. `instance.rs`: what a provider
//!   reports of its instances, as the planner reads it. Both are below the
//!   planners and import none of them.
//! - `shared.rs`: [`Step`], [`Observed`] and what both planners share.
//! - `pool.rs` plans clusters of pool machines, `provider.rs` clusters whose
//!   machines a provider (docker, aws) creates; `rollout.rs` rolls a
//!   provider cluster to a new version or image, `in_place.rs` upgrades a
//!   pool cluster's machines where they stand, `addons.rs` applies the
//!   spec's addons, `backup.rs` asks for etcd snapshots, `restore.rs`
//!   restores etcd from one onto a new init machine, `drill.rs` restores
//!   one into a new cluster to prove it (restore drills), and `drain.rs`
//!   holds back the removal of a machine
//!   leaving on purpose until its Node is drained.
//! - `fixtures.rs` (tests, and the `fixtures` feature for the coordinator's
//!   tests): the objects every planner test builds on.

mod addons;
pub use addons::pending_addon;
mod backup;
pub use backup::{snapshot_due_at, SNAPSHOT_FAILED_RETRY, SNAPSHOT_TIMEOUT};
mod drain;
mod drill;
pub use drill::{drill_due_at, drill_name};
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod health;
mod in_place;
mod instance;
mod pool;
mod provider;
mod restore;
mod rollout;
mod shared;
#[cfg(test)]
mod tests;

pub use instance::{endpoint_key, InstanceState};
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
    let mut steps = drain::gate_drains(cluster, &mine, observed, steps);
    steps.extend(drill::drill_steps(cluster, &mine, observed.now));
    steps
}
