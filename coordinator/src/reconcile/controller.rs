//! The cluster controller: each cluster reconciled on its own, when
//! something about it changed, by one of a bounded set of workers (after
//! controller-runtime and kube-rs' `Controller`).
//!
//! - **What wakes a cluster**: a store change of the cluster or of one of
//!   its machines (the [`FleetIndex`] maps a machine to its cluster) that
//!   its own reconcile did not make (a reconcile that wrote is not
//!   settled and comes back after the reconcile period anyway), a
//!   machine that becomes free while a pool cluster waits for one, a
//!   machine whose heartbeats come back, an operator's request
//!   ([`crate::app::App::reconcile_soon`]), and the cluster's own requeue
//!   time.
//! - **Requeue**: a cluster with work under way (steps taken, machines not
//!   yet running, an operation in flight) comes back every reconcile
//!   period; a settled one at the first heartbeat deadline of its machines
//!   (so a silent machine is judged at the timeout itself, not on the next
//!   pass over the fleet) and at the latest after [`RESYNC`], jittered.
//!   A failed reconcile comes back after a doubling back-off.
//! - **One at a time**: the [`WorkQueue`] never hands one cluster to two
//!   workers; a cluster's long step holds one worker, and the others go on.
//! - **Off the async workers**: a reconcile runs on a blocking thread (its
//!   store calls are synchronous), so the coordinator's own load never
//!   keeps the async workers from answering machines.
//! - **A reconcile reads its cluster**: the cluster, its machines, and a
//!   window of the free machines it may claim, from the store's read cache
//!   — not the fleet.
//!
//! The planner is unchanged: one cluster and its machines in, steps out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_common::api::{AddonPhase, Cluster, ClusterPhase, Machine, MachinePhase};
use drover_planner::health::Policy;
use drover_planner::{machines_of, plan, Observed, Step, TOMBSTONE_TTL};
use tokio::sync::broadcast::error::RecvError;

use super::execute;
use crate::app::App;
use crate::domain::controller::Settled;
use crate::store::Kind;

/// How long a settled cluster goes without a reconcile at most.
pub const RESYNC: Duration = Duration::from_secs(300);

/// How many clusters are reconciled at once.
pub const WORKERS: usize = 4;

/// The longest back-off after failed reconciles, in reconcile periods.
const MAX_BACKOFF_PERIODS: u32 = 8;

/// What one reconcile came to.
#[derive(Debug)]
struct Outcome {
    requeue: Option<Duration>,
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("cannot read the cluster or its machines: {0}")]
    Read(#[from] crate::store::StoreError),
    #[error("cannot list provider machines: {0}")]
    Provider(#[from] crate::provider::ProviderError),
    #[error("{step}: {source}")]
    Step {
        step: String,
        source: super::ReconcileError,
    },
    #[error("the reconcile panicked: {0}")]
    Panicked(String),
}

/// Queues every cluster.
fn enqueue_all(app: &App) {
    match app.clusters() {
        Ok(clusters) => app
            .fleet
            .controller
            .queue
            .add_all(clusters.iter().map(|c| c.metadata.name.as_str())),
        Err(e) => tracing::warn!(error = %e, "cannot list clusters to reconcile them"),
    }
}

/// The `cluster-reconciler` task: its runs feed the queue (a new leader
/// term builds the index and queues every cluster; an activation queues
/// every cluster), its watcher queues what each store change touches, and
/// [`WORKERS`] workers reconcile what is queued, each reconcile recorded
/// as a run of the task. Feeding runs are not counted.
pub struct Reconciler {
    app: Arc<App>,
    changes: tokio::sync::broadcast::Receiver<crate::store::Change>,
    role: tokio::sync::watch::Receiver<crate::domain::leadership::Role>,
    /// The index must be built again from a full read (changes were lost).
    rebuild: bool,
    workers: tokio::task::JoinSet<()>,
}

impl Reconciler {
    /// The reconciler, with its workers started; `task` is its entry in
    /// the driver, where each cluster reconcile is recorded.
    pub fn new(app: Arc<App>, task: Arc<crate::tasks::Task>) -> Self {
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..WORKERS {
            workers.spawn(worker(app.clone(), task.clone()));
        }
        Self {
            changes: app.store.watch(),
            role: app.leadership.changes(),
            app,
            rebuild: false,
            workers,
        }
    }
}

impl crate::tasks::BackgroundTask for Reconciler {
    async fn activate(&mut self, why: crate::tasks::Wake) -> crate::tasks::Outcome {
        start_term(&self.app, std::mem::take(&mut self.rebuild)).await;
        if why == crate::tasks::Wake::Activated {
            enqueue_all(&self.app);
        }
        crate::tasks::Outcome::Idle
    }

    /// Queues the clusters each store change touches; resolves when the
    /// role changes, or when changes were lost and the index must be
    /// built again.
    async fn watch(&mut self) {
        loop {
            tokio::select! {
                change = self.changes.recv() => match change {
                    Ok(c) => {
                        if !on_change(&self.app, &c) {
                            self.rebuild = true;
                            return;
                        }
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "the reconciler missed store changes; reading everything again");
                        self.rebuild = true;
                        return;
                    }
                    Err(RecvError::Closed) => std::future::pending::<()>().await,
                },
                Ok(()) = self.role.changed() => return,
            }
        }
    }

    async fn stop(&mut self) {
        self.app.fleet.controller.queue.shut_down();
        while self.workers.join_next().await.is_some() {}
    }
}

/// On a new leader term (or with `force`), builds the index from a full
/// read and queues every cluster; when leadership is lost, drops the queue.
async fn start_term(app: &Arc<App>, force: bool) {
    let ctl = &app.fleet.controller;
    let term = app.leadership.term();
    let known = ctl.term();
    if term == known && !force {
        return;
    }
    let Some(t) = term else {
        ctl.set_term(None);
        ctl.queue.clear();
        return;
    };
    let read = {
        let app = app.clone();
        crate::store::blocking(
            move || -> Result<(Vec<Cluster>, Vec<Machine>), crate::store::StoreError> {
                Ok((app.clusters()?, app.machines()?))
            },
        )
        .await
    };
    match read {
        Ok((clusters, machines)) => {
            ctl.index.rebuild(&clusters, &machines);
            ctl.set_term(Some(t));
            ctl.queue
                .add_all(clusters.iter().map(|c| c.metadata.name.as_str()));
            tracing::info!(
                clusters = clusters.len(),
                machines = machines.len(),
                "reconciling every cluster"
            );
        }
        // Tried again at the next run.
        Err(e) => tracing::warn!(error = %e, "cannot read the fleet to reconcile it"),
    }
}

/// Queues the clusters a store change touches; false when the changed
/// record cannot be read (the index must be built again).
fn on_change(app: &Arc<App>, c: &crate::store::Change) -> bool {
    let ctl = &app.fleet.controller;
    if ctl.term().is_none() {
        return true;
    }
    tracing::trace!(kind = c.kind.as_str(), name = %c.name, revision = c.revision, deleted = c.deleted, "store change");
    // A reconcile's own writes do not wake its cluster: it planned them,
    // and one that wrote anything is not settled, so it comes back after
    // the reconcile period anyway.
    let own = |cluster: &str| c.origin.as_deref() == Some(cluster);
    match c.kind {
        Kind::Cluster if own(&c.name) => {}
        Kind::Cluster => ctl.queue.add(&c.name),
        Kind::Machine => {
            let record = if c.deleted {
                None
            } else {
                // As of this change: the read cache may not hold it yet.
                match app.machine_at_least(&c.name, c.revision) {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(machine = %c.name, error = %e, "cannot read a changed machine; reading everything again");
                        return false;
                    }
                }
            };
            for cluster in ctl.index.machine_changed(&c.name, record.as_ref()) {
                if !own(&cluster) {
                    ctl.queue.add(&cluster);
                }
            }
        }
        // Machine files may name an operator's Secret.
        Kind::UserSecret => enqueue_all(app),
        Kind::RegistrationToken | Kind::Secret | Kind::JoinTokens | Kind::Snapshot => {}
    }
    true
}

async fn worker(app: Arc<App>, task: Arc<crate::tasks::Task>) {
    let ctl = app.fleet.controller.clone();
    while let Some(item) = ctl.queue.next().await {
        let Some(term) = app.leadership.term() else {
            ctl.queue.done(&item.key, None);
            continue;
        };
        let metrics = crate::metrics::global();
        metrics.reconcile_queued(item.waited);
        task.started();
        let started = Instant::now();
        if let Some(requeue) = still_settled(&app, &item.key) {
            // Nothing about the cluster changed and no heartbeat deadline
            // passed: a reconcile would plan nothing.
            ctl.finished(&item.key, None);
            task.finished(None);
            ctl.queue.done(&item.key, Some(requeue));
            continue;
        }
        let outcome = {
            let (app, key) = (app.clone(), item.key.clone());
            let handle = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || {
                // Its own writes do not wake it again (`on_change`).
                crate::store::attributed(&key, || {
                    handle.block_on(crate::store::fenced(term, reconcile(&app, &key)))
                })
            })
            .await
            .unwrap_or_else(|e| Err(Failure::Panicked(e.to_string())))
        };
        let took = started.elapsed();
        let depth = ctl.queue.depth();
        metrics.reconcile_done(took, outcome.is_ok(), depth.ready);
        task.set_queue(crate::types::QueueStatus {
            ready: depth.ready as u64,
            processing: depth.processing as u64,
            delayed: depth.delayed as u64,
            last_wait_millis: item.waited.as_millis() as u64,
        });
        match outcome {
            Ok(o) => {
                ctl.finished(&item.key, None);
                task.finished(None);
                ctl.queue.done(&item.key, o.requeue);
            }
            Err(e) => {
                tracing::warn!(cluster = %item.key, error = %e, "reconcile failed");
                let failures = ctl.finished(&item.key, Some(e.to_string()));
                task.finished(Some(format!("cluster {}: {e}", item.key)));
                let period = app.settings.reconcile_period;
                let backoff = period * 2u32.pow(failures.saturating_sub(1).min(3));
                ctl.queue
                    .done(&item.key, Some(backoff.min(period * MAX_BACKOFF_PERIODS)));
            }
        }
    }
}

/// Reconciles cluster `name`: reads it and its machines, plans, applies
/// the steps, and says when to come back.
async fn reconcile(app: &Arc<App>, name: &str) -> Result<Outcome, Failure> {
    let ctl = &app.fleet.controller;
    let Some(cluster) = app.cluster_cached(name)? else {
        ctl.cluster_gone(name);
        return Ok(Outcome { requeue: None });
    };
    ctl.index.cluster_seen(&cluster);
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    let mut names = ctl.index.machines_of(&uid);
    let policy = Policy::for_cluster(&cluster, app.settings.health_defaults);
    let now = drover_common::now();
    let alive = |m: &str| {
        app.last_seen(m)
            .is_some_and(|t| now - t <= policy.heartbeat_timeout)
    };
    names.extend(ctl.index.candidates(&cluster, alive));
    let mut machines = Vec::with_capacity(names.len());
    for n in &names {
        if let Some(m) = app.machine_cached(n)? {
            machines.push(m);
        }
    }
    let has_pki = ctl.has_pki(name, &uid) || {
        let has = crate::domain::secrets::load_pki(&app.store, &cluster)?.is_some();
        if has {
            ctl.pki_created(name, &uid);
        }
        has
    };
    let instances = if cluster.spec.provider.creates_machines() {
        let (instances, errors) =
            crate::reconcile::provisioner::observe(app, std::slice::from_ref(&cluster)).await;
        if let Some(e) = errors.into_iter().next() {
            return Err(e.into());
        }
        instances
    } else {
        Default::default()
    };
    // Listing the provider takes a while: plan on the cluster and the
    // machines as they are now, not as they were before it.
    let (cluster, machines) = if cluster.spec.provider.creates_machines() {
        let Some(fresh) = app.cluster_cached(name)? else {
            return Ok(Outcome {
                requeue: Some(app.settings.reconcile_period),
            });
        };
        let mut again = Vec::with_capacity(machines.len());
        for m in &machines {
            again.extend(app.machine_cached(&m.metadata.name)?);
        }
        (fresh, again)
    } else {
        (cluster, machines)
    };
    let last_seen = |n: &str| app.last_seen(n);
    let instance = |uid: &str| instances.get(uid).copied();
    let generation = cluster.metadata.generation;
    let retry_not_before = |n: &str| app.fleet.provision_retries.not_before(n, generation);
    let observed = Observed {
        now,
        has_pki,
        last_seen: &last_seen,
        instance: &instance,
        retry_not_before: &retry_not_before,
        policy,
        heartbeat_interval: app.settings.heartbeat_interval,
    };
    let steps = plan(&cluster, &machines, &observed);
    for step in &steps {
        execute(app, &cluster, step)
            .await
            .map_err(|source| Failure::Step {
                step: format!("{step:?}"),
                source,
            })?;
    }
    let mine = machines_of(&cluster, &machines);
    ctl.index
        .set_hungry(&cluster, lacks_machines(&cluster, &mine));
    let period = app.settings.reconcile_period;
    let is_settled = settled(&cluster, &mine, &steps);
    ctl.set_settled(
        name,
        is_settled
            .then(|| settled_mark(&cluster, &mine, policy.heartbeat_timeout))
            .flatten(),
    );
    let requeue = if !is_settled {
        period
    } else {
        let snapshot = timed_work_due(&cluster).map(|at| {
            Duration::try_from(at - now + time::Duration::milliseconds(100))
                .unwrap_or(Duration::from_millis(100))
        });
        next_deadline(&mine, &observed)
            .into_iter()
            .chain(snapshot)
            .min()
            .unwrap_or(RESYNC)
            .min(jittered(RESYNC, name))
    };
    Ok(Outcome {
        requeue: Some(requeue),
    })
}

/// When the first scheduled work of `cluster` is due: a snapshot or a
/// restore drill.
fn timed_work_due(cluster: &Cluster) -> Option<time::OffsetDateTime> {
    drover_planner::snapshot_due_at(cluster)
        .into_iter()
        .chain(drover_planner::drill_due_at(cluster))
        .min()
}

/// What a settled cluster looks like, to skip its reconciles while it
/// stays so; `None` when a revision is unknown.
fn settled_mark(
    cluster: &Cluster,
    mine: &[&Machine],
    heartbeat_timeout: Duration,
) -> Option<Settled> {
    let revision = |m: &drover_common::api::ObjectMeta| m.resource_version.as_deref()?.parse().ok();
    Some(Settled {
        cluster_revision: revision(&cluster.metadata)?,
        cluster_uid: cluster.metadata.uid.clone()?,
        machines: mine
            .iter()
            .map(|m| Some((m.metadata.name.clone(), revision(&m.metadata)?)))
            .collect::<Option<Vec<_>>>()?,
        heartbeat_timeout,
        snapshot_due: timed_work_due(cluster),
        at: tokio::time::Instant::now(),
    })
}

/// When cluster `name` is as it was at its last full reconcile, which
/// found it settled (the same revisions of it and its machines as the read
/// cache holds them, the same machines, none past its heartbeat timeout,
/// less than [`RESYNC`] ago): when to come back. `None` when it must be
/// reconciled.
fn still_settled(app: &App, name: &str) -> Option<Duration> {
    let ctl = &app.fleet.controller;
    let mark = ctl.settled(name)?;
    let fresh = mark.at.elapsed() < RESYNC
        && app.store.cached_revision(Kind::Cluster, name) == Some(mark.cluster_revision)
        && ctl.index.machines_of(&mark.cluster_uid).len() == mark.machines.len()
        && mark
            .machines
            .iter()
            .all(|(m, rev)| app.store.cached_revision(Kind::Machine, m) == Some(*rev));
    if !fresh {
        ctl.set_settled(name, None);
        return None;
    }
    let now = drover_common::now();
    if mark.snapshot_due.is_some_and(|due| due <= now) {
        return None;
    }
    let mut first: Option<time::OffsetDateTime> = mark.snapshot_due;
    for (m, _) in &mark.machines {
        let deadline = app.last_seen(m)? + mark.heartbeat_timeout;
        if deadline <= now {
            return None;
        }
        first = Some(first.map_or(deadline, |f| f.min(deadline)));
    }
    let until_resync = RESYNC.saturating_sub(mark.at.elapsed());
    let next = first.map_or(until_resync, |at| {
        Duration::try_from(at - now + time::Duration::milliseconds(100))
            .unwrap_or(Duration::from_millis(100))
    });
    Some(next.min(until_resync))
}

/// Whether the cluster wants more machines than it holds (pool clusters
/// then wait for free ones).
fn lacks_machines(cluster: &Cluster, mine: &[&Machine]) -> bool {
    let wanted = cluster.spec.control_plane.replicas
        + cluster
            .spec
            .worker_pools
            .iter()
            .map(|w| w.replicas)
            .sum::<u32>();
    let live = mine
        .iter()
        .filter(|m| {
            m.status.phase != MachinePhase::Deleted && m.metadata.deletion_timestamp.is_none()
        })
        .count();
    (live as u64) < wanted as u64 || cluster.status.phase == ClusterPhase::Degraded
}

/// Whether nothing about the cluster moves with time alone but its
/// machines' heartbeats: every machine running, nothing in flight, nothing
/// to do.
fn settled(cluster: &Cluster, mine: &[&Machine], steps: &[Step]) -> bool {
    let s = &cluster.status;
    let nodes: std::collections::HashSet<&str> = s.nodes.iter().map(|n| n.name.as_str()).collect();
    steps.is_empty()
        && cluster.metadata.deletion_timestamp.is_none()
        && s.phase == ClusterPhase::Running
        && s.observed_generation == cluster.metadata.generation
        && s.node_removal.is_none()
        && s.etcd_removal.is_none()
        && s.drain.is_none()
        && s.certificate_renewal.is_none()
        && s.version_update.is_none()
        && s.machine_upgrade.is_none()
        && s.addon_apply.is_none()
        && s.snapshot_requested_at.is_none()
        && s.snapshot.as_ref().is_none_or(|s| !s.under_way())
        && s.rollout.is_none()
        && s.addons.iter().all(|a| a.phase == AddonPhase::Applied)
        // A Node not Ready is judged after a timeout of its own.
        && s.nodes.iter().all(|n| n.ready == "True" && !n.unschedulable)
        && s.endpoint_ready != Some(false)
        && mine.iter().all(|m| {
            m.status.phase == MachinePhase::Running
                && m.metadata.deletion_timestamp.is_none()
                && m.status.upgrade.is_none()
                // A missing Node is judged after the unhealthy timeout.
                && !m.status.conditions.iter().any(|c| {
                    c.type_ == drover_planner::health::NODE_FOUND_CONDITION && c.status == "False"
                })
                && (nodes.is_empty() || nodes.contains(m.status.hostname.as_str()))
                // A reboot under way ends with a report or at its timeout.
                && !m.status.rebooting()
                // A problem its pool's remediation lists is judged after
                // the unhealthy timeout.
                && !reports_listed_problem(cluster, m)
        })
}

/// Whether machine `m` reports a node problem that its pool's remediation
/// lists.
fn reports_listed_problem(cluster: &Cluster, m: &Machine) -> bool {
    let Some(a) = m.spec.assignment.as_ref() else {
        return false;
    };
    let listed = cluster.spec.remediation(&a.machine_pool).conditions;
    m.status
        .conditions
        .iter()
        .any(|c| c.status == "True" && listed.contains(&c.type_))
}

/// The first time a settled cluster's state changes with time alone: a
/// machine's heartbeat timeout running out, a tombstone's time to go.
fn next_deadline(mine: &[&Machine], observed: &Observed<'_>) -> Option<Duration> {
    let timeout = observed.policy.heartbeat_timeout;
    let mut first: Option<time::OffsetDateTime> = None;
    for m in mine {
        let at = if m.status.phase == MachinePhase::Deleted {
            m.metadata.deletion_timestamp.map(|t| t + TOMBSTONE_TTL)
        } else {
            (observed.last_seen)(&m.metadata.name).map(|t| t + timeout)
        };
        if let Some(at) = at {
            first = Some(first.map_or(at, |f| f.min(at)));
        }
    }
    // Just past the deadline, so the judgement sees it passed.
    first.map(|at| {
        let left = at - observed.now + time::Duration::milliseconds(100);
        Duration::try_from(left).unwrap_or(Duration::from_millis(100))
    })
}

/// `period` less up to a tenth, by cluster name: settled clusters spread
/// over the period instead of coming back together.
fn jittered(period: Duration, name: &str) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    let tenth = period.as_millis() as u64 / 10;
    period - Duration::from_millis(h.finish() % tenth.max(1))
}

/// The `free-machines` task: keeps the `Alive` condition of free machines
/// true (see [`super::FreeScan`]), once per heartbeat interval while
/// leading.
pub struct FreeMachines {
    app: Arc<App>,
    scan: super::FreeScan,
}

impl FreeMachines {
    pub fn new(app: Arc<App>) -> Self {
        Self {
            app,
            scan: super::FreeScan::default(),
        }
    }
}

impl crate::tasks::BackgroundTask for FreeMachines {
    async fn activate(&mut self, _: crate::tasks::Wake) -> crate::tasks::Outcome {
        let app = self.app.clone();
        let Some(term) = app.leadership.term() else {
            return crate::tasks::Outcome::Idle;
        };
        let taken = std::mem::take(&mut self.scan);
        let (back, errors) =
            crate::store::fenced(term, super::free_machines_alive(app, taken)).await;
        self.scan = back;
        for e in &errors {
            tracing::warn!(error = %e, "free machine scan");
        }
        match errors.first() {
            None => crate::tasks::Outcome::Done,
            Some(e) => crate::tasks::Outcome::Failed(crate::tasks::TaskError::new(format!(
                "{e} ({} errors)",
                errors.len()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::MachineRole;
    use drover_planner::fixtures::{running, t0};

    #[tokio::test]
    async fn a_reconciles_own_writes_do_not_wake_its_cluster_and_everyone_elses_do() {
        let dir = tempfile::tempdir().unwrap();
        let app = App::for_tests(dir.path());
        let ctl = &app.fleet.controller;
        ctl.set_term(Some(crate::store::Fence(1)));
        let mut changes = app.store.watch();
        let cluster = drover_planner::fixtures::pool_cluster(1, 0);
        let mut write = |origin: Option<&str>| {
            let put = || {
                let current = app.store.get(Kind::Cluster, "c").unwrap();
                match current {
                    None => app.store.create_json(Kind::Cluster, "c", &cluster),
                    Some(r) => {
                        app.store
                            .update_json(Kind::Cluster, "c", &cluster, Some(r.revision))
                    }
                }
                .unwrap()
            };
            match origin {
                Some(o) => crate::store::attributed(o, put),
                None => put(),
            };
            let change = changes.try_recv().expect("the write's change");
            assert!(on_change(&app, &change));
            (change.origin, ctl.queue.depth().ready)
        };
        // An operator's write (no origin) queues the cluster.
        assert_eq!(write(None), (None, 1));
        while ctl.queue.depth().ready > 0 {
            let item = ctl.queue.next().await.unwrap();
            ctl.queue.done(&item.key, None);
        }
        // Its own reconcile's write does not; another cluster's reconcile
        // writing it (none does, but any other origin) does.
        assert_eq!(write(Some("c")).1, 0);
        assert_eq!(write(Some("other")).1, 1);
        // The attribution ends with the closure.
        assert_eq!(write(None), (None, 1));
    }

    #[test]
    fn a_settled_cluster_comes_back_just_after_its_first_heartbeat_deadline() {
        let a = running("a", "w", MachineRole::Worker);
        let b = running("b", "w", MachineRole::Worker);
        let now = t0();
        let last_seen = |n: &str| match n {
            "a" => Some(now - time::Duration::seconds(10)),
            "b" => Some(now - time::Duration::seconds(30)),
            _ => None,
        };
        let no_instance = |_: &str| None;
        let no_retry = |_: &str| None;
        let observed = Observed {
            now,
            has_pki: true,
            last_seen: &last_seen,
            instance: &no_instance,
            retry_not_before: &no_retry,
            policy: Policy::defaults(Duration::from_secs(40)),
            heartbeat_interval: Duration::from_secs(10),
        };
        // b's timeout runs out first: 40 s after it was last seen.
        assert_eq!(
            next_deadline(&[&a, &b], &observed),
            Some(Duration::from_millis(10_100))
        );
        // Already past it (its cluster has not judged it yet): at once.
        let late = |_: &str| Some(now - time::Duration::seconds(60));
        let observed = Observed {
            last_seen: &late,
            ..observed
        };
        assert_eq!(
            next_deadline(&[&a], &observed),
            Some(Duration::from_millis(100))
        );
    }

    #[test]
    fn only_a_running_cluster_with_nothing_in_flight_is_settled() {
        let mut c =
            drover_planner::fixtures::cluster("v1.31.2", 1, 1, serde_json::json!({"pool": {}}));
        c.status.phase = ClusterPhase::Running;
        c.status.observed_generation = c.metadata.generation;
        let cp = running("cp", "control-plane", MachineRole::Init);
        let w = running("w1", "w", MachineRole::Worker);
        assert!(settled(&c, &[&cp, &w], &[]));
        assert!(!settled(&c, &[&cp, &w], &[Step::EnsurePki]), "steps taken");
        let mut joining = w.clone();
        joining.status.phase = MachinePhase::Bootstrapping;
        assert!(!settled(&c, &[&cp, &joining], &[]), "a machine joining");
        let mut provisioning = c.clone();
        provisioning.status.phase = ClusterPhase::Provisioning;
        assert!(!settled(&provisioning, &[&cp, &w], &[]));
        let mut changed = c.clone();
        changed.metadata.generation += 1;
        assert!(!settled(&changed, &[&cp, &w], &[]), "a new generation");
        // A Running machine whose Node the reported list lacks, or whose
        // Node is known missing, is judged on a timeout of its own.
        let mut reported = c.clone();
        let node = |name: &str| drover_common::api::ClusterNode {
            name: name.into(),
            ready: "True".into(),
            since: None,
            unschedulable: false,
            kubelet_version: String::new(),
            message: String::new(),
        };
        let (mut cp, mut w) = (cp, w);
        cp.status.hostname = "cp".into();
        w.status.hostname = "w1".into();
        reported.status.nodes = vec![node("cp")];
        assert!(!settled(&reported, &[&cp, &w], &[]), "a Node not listed");
        reported.status.nodes.push(node("w1"));
        assert!(settled(&reported, &[&cp, &w], &[]));
        drover_common::api::set_condition(
            &mut w.status.conditions,
            drover_planner::health::NODE_FOUND_CONDITION,
            false,
            "NodeMissing",
            "",
        );
        assert!(!settled(&reported, &[&cp, &w], &[]), "a Node missing");
        // A problem the pool lists is judged after the unhealthy timeout;
        // one it does not list changes nothing.
        w.status.conditions.clear();
        drover_common::api::set_condition(
            &mut w.status.conditions,
            "DiskPressure",
            true,
            "DiskSpaceLow",
            "",
        );
        assert!(
            settled(&reported, &[&cp, &w], &[]),
            "DiskPressure is not listed"
        );
        drover_common::api::set_condition(
            &mut w.status.conditions,
            "KernelDeadlock",
            true,
            "TaskHung",
            "",
        );
        assert!(!settled(&reported, &[&cp, &w], &[]), "a listed problem");
        // A reboot under way ends with a report or at its timeout.
        w.status.conditions.clear();
        w.status.reboot = Some(drover_common::api::RebootRequest {
            id: "reboot-1".into(),
            reason: String::new(),
            requested_at: drover_common::now(),
            boot_id: None,
            started_at: None,
            completed_at: None,
            failed: None,
            method: drover_common::api::RebootMethod::Agent,
        });
        assert!(!settled(&reported, &[&cp, &w], &[]), "a reboot under way");
    }

    #[test]
    fn settled_clusters_come_back_spread_over_the_resync_period() {
        let a = jittered(RESYNC, "a");
        let b = jittered(RESYNC, "b");
        for j in [a, b] {
            assert!(j <= RESYNC && j > RESYNC - RESYNC / 10, "{j:?}");
        }
        assert_ne!(a, b);
        assert_eq!(jittered(RESYNC, "a"), a, "stable per cluster");
    }
}
