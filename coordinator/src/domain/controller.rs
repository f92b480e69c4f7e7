//! The cluster controller's shared state: its work queue of cluster names,
//! the fleet index that maps machines to clusters, and what it reports
//! (`/v1/status`, `drover get tasks`). `reconcile::controller` runs the
//! workers; the HTTP edge queues clusters through `App::reconcile_cluster`
//! and `App::reconcile_machine`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use super::fleet_index::FleetIndex;
use super::workqueue::{Depth, WorkQueue};
use crate::store::Fence;

/// Reconciles the last errors are kept for, at most (`/v1/status`).
const KEPT_ERRORS: usize = 50;

/// What a settled cluster looked like at its last full reconcile: the
/// revisions of it and of its machines, and the heartbeat timeout its
/// machines are judged by. While every revision is the same and no
/// machine's heartbeat is older than the timeout, a reconcile would plan
/// nothing: it is skipped, and the cluster comes back at the next
/// deadline (`reconcile::controller`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub cluster_revision: u64,
    pub cluster_uid: String,
    /// The cluster's machines and their revisions, by name.
    pub machines: Vec<(String, u64)>,
    pub heartbeat_timeout: Duration,
    /// When the cluster's next scheduled etcd snapshot is due, if it has
    /// a schedule.
    pub snapshot_due: Option<time::OffsetDateTime>,
    /// When the full reconcile ran.
    pub at: tokio::time::Instant,
}

/// The controller's state, shared by its workers and the rest of the
/// coordinator (`App::controller`).
#[derive(Debug, Default)]
pub struct Controller {
    pub queue: WorkQueue,
    pub index: FleetIndex,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The leader term the index was built for.
    term: Option<Fence>,
    /// Consecutive failures per cluster.
    failures: BTreeMap<String, u32>,
    /// The last error of each cluster whose last reconcile failed.
    errors: BTreeMap<String, String>,
    /// Clusters known to have their PKI (it is never removed while the
    /// cluster lives), by name, with the UID of the cluster of that name
    /// that has it: a new cluster of a deleted one's name does not inherit
    /// it. Spares decrypting it on every reconcile.
    has_pki: HashMap<String, String>,
    /// Clusters whose last reconcile found nothing to do and nothing that
    /// moves with time but their machines' heartbeats.
    settled: HashMap<String, Settled>,
}

impl Controller {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("controller state lock")
    }

    /// Queues the cluster machine `name` belongs to.
    pub fn machine_event(&self, name: &str) {
        if let Some(cluster) = self.index.cluster_of(name) {
            self.queue.add(&cluster);
        }
    }

    /// The queue as it stands.
    pub fn depth(&self) -> Depth {
        self.queue.depth()
    }

    /// The leader term the index was built for; `None` while following.
    pub fn term(&self) -> Option<Fence> {
        self.lock().term
    }

    pub fn set_term(&self, term: Option<Fence>) {
        self.lock().term = term;
    }

    /// Whether cluster `name` with UID `uid` is known to have its PKI.
    pub fn has_pki(&self, name: &str, uid: &str) -> bool {
        self.lock().has_pki.get(name).is_some_and(|u| u == uid)
    }

    pub fn pki_created(&self, name: &str, uid: &str) {
        self.lock().has_pki.insert(name.to_owned(), uid.to_owned());
    }

    /// Records that cluster `name` was settled at its last full
    /// reconcile (or forgets it, with `None`).
    pub fn set_settled(&self, name: &str, settled: Option<Settled>) {
        let mut s = self.lock();
        match settled {
            Some(mark) => {
                s.settled.insert(name.to_owned(), mark);
            }
            None => {
                s.settled.remove(name);
            }
        }
    }

    /// How cluster `name` was settled, if it was at its last reconcile.
    pub fn settled(&self, name: &str) -> Option<Settled> {
        self.lock().settled.get(name).cloned()
    }

    /// Cluster `name` is gone: forgets what was kept of it.
    pub fn cluster_gone(&self, name: &str) {
        self.index.cluster_gone(name);
        self.queue.forget(name);
        let mut s = self.lock();
        s.has_pki.remove(name);
        s.settled.remove(name);
        s.failures.remove(name);
        s.errors.remove(name);
    }

    /// Records the end of one reconcile of `cluster`; returns how many of
    /// its reconciles in a row failed (0 when this one succeeded).
    pub fn finished(&self, cluster: &str, error: Option<String>) -> u32 {
        let mut s = self.lock();
        match error {
            None => {
                s.failures.remove(cluster);
                s.errors.remove(cluster);
                0
            }
            Some(e) => {
                // Past the cap, a new cluster's error is only counted.
                if s.errors.len() < KEPT_ERRORS || s.errors.contains_key(cluster) {
                    s.errors.insert(cluster.to_owned(), e);
                }
                let n = s.failures.entry(cluster.to_owned()).or_default();
                *n = n.saturating_add(1);
                *n
            }
        }
    }

    /// The last error of each cluster whose last reconcile failed, each
    /// naming its cluster.
    pub fn errors(&self) -> Vec<String> {
        self.lock()
            .errors
            .iter()
            .map(|(c, e)| format!("cluster {c}: {e}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_kept_per_cluster_until_it_succeeds_and_failures_count_up() {
        let c = Controller::default();
        assert_eq!(c.finished("a", Some("boom".into())), 1);
        assert_eq!(c.finished("a", Some("boom again".into())), 2);
        assert_eq!(c.finished("b", None), 0);
        assert_eq!(c.errors(), ["cluster a: boom again"]);
        assert_eq!(c.finished("a", None), 0);
        assert!(c.errors().is_empty());
    }

    #[test]
    fn a_new_cluster_of_a_deleted_ones_name_does_not_inherit_its_pki() {
        let c = Controller::default();
        c.pki_created("prod", "uid-1");
        assert!(c.has_pki("prod", "uid-1"));
        // Deleted and applied again before a reconcile saw it gone.
        assert!(!c.has_pki("prod", "uid-2"));
        c.cluster_gone("prod");
        assert!(!c.has_pki("prod", "uid-1"));
    }
}
