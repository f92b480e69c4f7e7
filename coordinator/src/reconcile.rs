//! The cluster reconciler: a level-triggered loop that, for each cluster,
//! plans the steps from the cluster and the machines as they are (a pure
//! function) and applies them (the executor). It never sees events, only
//! objects, so running it twice changes nothing the second time.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_common::api::{
    Assignment, Cluster, ClusterPhase, ClusterStatus, Machine, MachinePhase, MachineRole,
    PoolStatus, ProviderSpec, CONTROL_PLANE_POOL,
};
use time::OffsetDateTime;

use crate::app::App;
use crate::secrets::{cluster_pki_name, ClusterPki};
use crate::store::{Kind, StoreError};

/// One change the executor makes.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Generate the cluster's CA set.
    EnsurePki,
    /// Claim a free machine for a pool.
    Assign {
        machine: String,
        machine_pool: String,
        role: MachineRole,
    },
    /// Return a machine to its registration pool.
    Release { machine: String, reason: String },
    /// Record the cluster's observed state.
    SetStatus(ClusterStatus),
    /// Every machine is released: remove the cluster and its secrets.
    Finalize,
}

/// What the planner needs to know beyond the objects.
pub struct Observed<'a> {
    pub has_pki: bool,
    pub alive: &'a dyn Fn(&str) -> bool,
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
    let mut steps = vec![];

    if cluster.metadata.deletion_timestamp.is_some() {
        for m in &mine {
            if m.status.phase != MachinePhase::Releasing {
                steps.push(Step::Release {
                    machine: m.metadata.name.clone(),
                    reason: format!("cluster {} is being deleted", cluster.metadata.name),
                });
            }
        }
        if mine.is_empty() {
            steps.push(Step::Finalize);
        } else {
            let mut status = cluster.status.clone();
            status.phase = ClusterPhase::Deleting;
            if status != cluster.status {
                steps.push(Step::SetStatus(status));
            }
        }
        return steps;
    }

    if !observed.has_pki {
        return vec![Step::EnsurePki];
    }

    let ProviderSpec::Pool(provider) = &cluster.spec.provider;
    let mut taken: BTreeSet<&str> = BTreeSet::new();
    let mut free: Vec<&Machine> = machines
        .iter()
        .filter(|m| {
            m.spec.assignment.is_none()
                && m.status.phase == MachinePhase::Registered
                && m.metadata.deletion_timestamp.is_none()
                && provider.pool.as_ref().is_none_or(|p| *p == m.spec.pool)
                && provider.selector.matches(&m.metadata.labels)
                && (observed.alive)(&m.metadata.name)
        })
        .collect();
    free.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    let mut status = cluster.status.clone();
    status.observed_generation = cluster.metadata.generation;
    status.pools.clear();
    let mut init_machine = status.init_machine.clone().filter(|init| {
        mine.iter()
            .any(|m| &m.metadata.name == init && m.status.phase != MachinePhase::Releasing)
    });
    let mut assigned_any = false;
    let mut all_running = true;

    for (pool_name, desired) in cluster.desired_pools() {
        let selector = if pool_name == CONTROL_PLANE_POOL {
            &cluster.spec.control_plane.selector
        } else {
            &cluster
                .spec
                .worker_pools
                .iter()
                .find(|p| p.name == pool_name)
                .expect("desired_pools lists spec pools")
                .selector
        };
        let mut in_pool: Vec<&Machine> = mine
            .iter()
            .copied()
            .filter(|m| {
                m.spec.assignment.as_ref().map(|a| a.machine_pool.as_str()) == Some(&pool_name)
                    && m.status.phase != MachinePhase::Releasing
            })
            .collect();
        let mut count = in_pool.len() as u32;
        let mut new_assignments = 0;
        while count < desired {
            let Some(pos) = free.iter().position(|m| {
                selector.matches(&m.metadata.labels) && !taken.contains(m.metadata.name.as_str())
            }) else {
                break;
            };
            let m = free.remove(pos);
            taken.insert(&m.metadata.name);
            let role = if pool_name == CONTROL_PLANE_POOL {
                if init_machine.is_none() {
                    init_machine = Some(m.metadata.name.clone());
                    MachineRole::Init
                } else {
                    MachineRole::ControlPlane
                }
            } else {
                MachineRole::Worker
            };
            steps.push(Step::Assign {
                machine: m.metadata.name.clone(),
                machine_pool: pool_name.clone(),
                role,
            });
            if role == MachineRole::Init {
                status.control_plane_endpoint = Some(endpoint_for(cluster, m));
            }
            count += 1;
            new_assignments += 1;
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
        let running = in_pool
            .iter()
            .filter(|m| m.status.phase == MachinePhase::Running)
            .count() as u32;
        if running < desired {
            all_running = false;
        }
        if count > 0 || new_assignments > 0 {
            assigned_any = true;
        }
        status.pools.push(PoolStatus {
            name: pool_name.clone(),
            desired,
            assigned: count,
            running: running.min(desired),
        });
    }
    if let Some(ep) = &cluster.spec.control_plane_endpoint {
        status.control_plane_endpoint = Some(ep.clone());
    }
    status.init_machine = init_machine;
    status.phase = if all_running {
        ClusterPhase::Running
    } else if assigned_any {
        ClusterPhase::Provisioning
    } else {
        ClusterPhase::Pending
    };
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
    drover_common::api::set_condition(
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
    drover_common::api::set_condition(
        &mut status.conditions,
        "Ready",
        all_running,
        if all_running {
            "AllRunning"
        } else {
            "Provisioning"
        },
        "",
    );
    if status != cluster.status {
        steps.push(Step::SetStatus(status));
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

/// Loads a cluster's PKI if it exists and belongs to this incarnation.
pub fn load_pki(app: &App, cluster: &Cluster) -> Result<Option<ClusterPki>, StoreError> {
    let uid = cluster.metadata.uid.as_deref().unwrap_or_default();
    Ok(app
        .store
        .get_json::<ClusterPki>(Kind::Secret, &cluster_pki_name(&cluster.metadata.name))?
        .map(|(p, _)| p)
        .filter(|p| p.cluster_uid == uid))
}

/// Errors while applying a step.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("cannot generate the PKI of cluster {cluster}: {source}")]
    Pki {
        cluster: String,
        source: drover_common::pki::PkiError,
    },
}

/// Applies one step. Each step re-reads what it changes, so a plan made from
/// slightly old objects cannot overwrite newer ones.
pub fn execute(app: &App, cluster: &Cluster, step: &Step) -> Result<(), ReconcileError> {
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
                Ok(true)
            })?;
            tracing::info!(cluster = %cname, machine = %machine, %reason, "machine released");
        }
        Step::SetStatus(status) => {
            app.update_cluster::<StoreError>(cname, |c| {
                if c.metadata.uid != cluster.metadata.uid || c.status == *status {
                    return Ok(false);
                }
                if c.status.phase != status.phase {
                    tracing::info!(cluster = %cname, from = %c.status.phase, to = %status.phase, "cluster phase changed");
                }
                c.status = status.clone();
                Ok(true)
            })?;
        }
        Step::Finalize => {
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

/// What the reconcile loop reports about itself.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoopStatus {
    pub name: &'static str,
    pub runs: u64,
    pub last_run_millis: u64,
    pub last_errors: Vec<String>,
}

/// One pass over every cluster. Returns the errors met (each names its
/// cluster); one cluster failing never stops the others.
pub fn reconcile_all(app: &App, now: OffsetDateTime) -> Vec<String> {
    let mut errors = vec![];
    let clusters = match app.clusters() {
        Ok(c) => c,
        Err(e) => return vec![format!("cannot list clusters: {e}")],
    };
    for cluster in clusters {
        // Re-read machines per cluster: an earlier cluster may have claimed some.
        let machines = match app.machines() {
            Ok(m) => m,
            Err(e) => return vec![format!("cannot list machines: {e}")],
        };
        let has_pki = match load_pki(app, &cluster) {
            Ok(p) => p.is_some(),
            Err(e) => {
                errors.push(format!("cluster {}: {e}", cluster.metadata.name));
                continue;
            }
        };
        let alive = |name: &str| app.is_alive(name, now);
        let steps = plan(
            &cluster,
            &machines,
            &Observed {
                has_pki,
                alive: &alive,
            },
        );
        for step in &steps {
            if let Err(e) = execute(app, &cluster, step) {
                let msg = format!("cluster {}: {step:?}: {e}", cluster.metadata.name);
                tracing::warn!(error = %msg, "reconcile step failed");
                errors.push(msg);
                break;
            }
        }
    }
    errors
}

/// Runs the reconcile loop until `shutdown` fires: every `period`, or at
/// once when something calls `app.reconcile_now.notify_one()`.
pub async fn run_loop(
    app: Arc<App>,
    status: Arc<Mutex<LoopStatus>>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let period = app.settings.reconcile_period;
    let mut changes = app.store.watch();
    loop {
        let started = Instant::now();
        let app2 = app.clone();
        let errors =
            tokio::task::spawn_blocking(move || reconcile_all(&app2, drover_common::now()))
                .await
                .unwrap_or_else(|e| vec![format!("reconcile pass panicked: {e}")]);
        {
            let mut s = status.lock().expect("loop status lock");
            s.runs += 1;
            s.last_run_millis = started.elapsed().as_millis() as u64;
            s.last_errors = errors.clone();
        }
        // Errors back off to the period; a clean pass that changed things is
        // usually followed by a wake-up from the writes it made.
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
        ControlPlaneSpec, LabelSelector, MachineSpec, MachineStatus, NetworkSpec, ObjectMeta,
        PoolProviderSpec, WorkerPoolSpec,
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
                assignment: None,
            },
            status: MachineStatus {
                addresses: vec!["10.0.0.9".into()],
                api_server_port: 6443,
                ..Default::default()
            },
        }
    }

    fn alive(_: &str) -> bool {
        true
    }

    #[test]
    fn pki_comes_first() {
        let steps = plan(
            &cluster(1, 2),
            &[free("a", "dev")],
            &Observed {
                has_pki: false,
                alive: &alive,
            },
        );
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
        let steps = plan(
            &cluster(1, 2),
            &machines,
            &Observed {
                has_pki: true,
                alive: &alive,
            },
        );
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
        let dead = |n: &str| n != "a";
        let steps = plan(
            &cluster(1, 0),
            &[free("a", "dev"), free("b", "dev")],
            &Observed {
                has_pki: true,
                alive: &dead,
            },
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
        let obs = Observed {
            has_pki: true,
            alive: &alive,
        };
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
        let obs = Observed {
            has_pki: true,
            alive: &alive,
        };
        let steps = plan(&c, std::slice::from_ref(&m), &obs);
        assert!(matches!(steps[0], Step::Release { .. }));
        assert_eq!(plan(&c, &[], &obs), vec![Step::Finalize]);
    }
}
