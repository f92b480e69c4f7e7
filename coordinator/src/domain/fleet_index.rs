//! What the reconciler knows of the fleet without reading it: which
//! machines each cluster holds, which machines are free (in their pool, no
//! cluster's), and which pool clusters wait for free machines. Built from
//! one full read when the coordinator starts (or becomes leader), then kept
//! in step with every machine change the store reports.
//!
//! The index holds names only; a reconcile reads each record fresh (from
//! the store's read cache), and the planner filters on what it reads. So an
//! index a moment behind a write never misleads the planner: a machine just
//! claimed by another cluster reads as claimed, a released one as free. It
//! only decides which records a cluster's reconcile reads, which makes a
//! reconcile cost that cluster's machines, not the fleet's.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use drover_common::api::{Cluster, LabelSelector, Machine, MachinePhase, ProviderSpec};

/// A free machine as the index keeps it: enough to match it to a cluster
/// without reading it.
#[derive(Debug, Clone)]
struct Free {
    pool: String,
    labels: BTreeMap<String, String>,
}

/// What a pool cluster asks of free machines.
#[derive(Debug, Clone)]
struct Wants {
    pool: Option<String>,
    provider: LabelSelector,
    /// Each machine pool's selector (control plane first) and replicas.
    pools: Vec<(LabelSelector, u32)>,
}

impl Wants {
    fn of(cluster: &Cluster) -> Option<Self> {
        let ProviderSpec::Pool(p) = &cluster.spec.provider else {
            return None;
        };
        let mut pools = vec![(
            cluster.spec.control_plane.selector.clone(),
            cluster.spec.control_plane.replicas,
        )];
        pools.extend(
            cluster
                .spec
                .worker_pools
                .iter()
                .map(|w| (w.selector.clone(), w.replicas)),
        );
        Some(Self {
            pool: p.pool.clone(),
            provider: p.selector.clone(),
            pools,
        })
    }

    fn takes(&self, f: &Free) -> bool {
        self.pool.as_ref().is_none_or(|p| *p == f.pool) && self.provider.matches(&f.labels)
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Cluster UID → its machines' names.
    by_cluster: HashMap<String, BTreeSet<String>>,
    /// Machine name → the UID of the cluster it is assigned to.
    cluster_of: HashMap<String, String>,
    /// Cluster UID → cluster name.
    names: HashMap<String, String>,
    /// Free machines, ordered by a hash of their name (see
    /// [`FleetIndex::candidates`]).
    free: BTreeMap<(u64, String), Free>,
    /// Pool clusters that lacked free machines at their last reconcile.
    hungry: HashMap<String, Wants>,
}

/// The fleet index; see the module documentation.
#[derive(Debug, Default)]
pub struct FleetIndex {
    inner: Mutex<Inner>,
}

/// How many free candidates a reconcile reads per machine pool, beyond
/// twice its replicas: a window, not the pool, so that claiming costs the
/// cluster's size and not the fleet's.
const CANDIDATE_SLACK: usize = 8;

impl FleetIndex {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("fleet index lock")
    }

    /// Replaces everything with what `machines` and `clusters` say.
    pub fn rebuild(&self, clusters: &[Cluster], machines: &[Machine]) {
        let mut fresh = Inner::default();
        for c in clusters {
            if let Some(uid) = &c.metadata.uid {
                fresh.names.insert(uid.clone(), c.metadata.name.clone());
            }
        }
        for m in machines {
            put(&mut fresh, m);
        }
        let mut inner = self.lock();
        fresh.hungry = std::mem::take(&mut inner.hungry);
        *inner = fresh;
    }

    /// Records `machine` as it is now (or gone, with `None` for the record
    /// of machine `name`). Returns the names of the clusters to reconcile
    /// for it: the cluster it left, the one it joined, and, for a machine
    /// now free, the pool clusters waiting for one it matches.
    pub fn machine_changed(&self, name: &str, machine: Option<&Machine>) -> Vec<String> {
        let mut inner = self.lock();
        let before = inner.cluster_of.get(name).cloned();
        remove(&mut inner, name);
        let mut wake = BTreeSet::new();
        if let Some(uid) = &before {
            if let Some(n) = inner.names.get(uid) {
                wake.insert(n.clone());
            }
        }
        if let Some(m) = machine {
            put(&mut inner, m);
            if let Some(uid) = inner.cluster_of.get(name) {
                if let Some(n) = inner.names.get(uid) {
                    wake.insert(n.clone());
                }
            }
            if let Some(f) = inner.free.get(&(spot(name), name.to_owned())) {
                for (cluster, wants) in &inner.hungry {
                    if wants.takes(f) {
                        wake.insert(cluster.clone());
                    }
                }
            }
        }
        wake.into_iter().collect()
    }

    /// The cluster `name` with UID `uid` exists (or was read again).
    pub fn cluster_seen(&self, cluster: &Cluster) {
        if let Some(uid) = &cluster.metadata.uid {
            self.lock()
                .names
                .insert(uid.clone(), cluster.metadata.name.clone());
        }
    }

    /// The cluster `name` is gone.
    pub fn cluster_gone(&self, name: &str) {
        let mut inner = self.lock();
        inner.names.retain(|_, n| n != name);
        inner.hungry.remove(name);
    }

    /// The name of the cluster machine `name` belongs to, if any.
    pub fn cluster_of(&self, machine: &str) -> Option<String> {
        let inner = self.lock();
        let uid = inner.cluster_of.get(machine)?;
        inner.names.get(uid).cloned()
    }

    /// The names of the machines assigned to the cluster with `uid`.
    pub fn machines_of(&self, uid: &str) -> Vec<String> {
        self.lock()
            .by_cluster
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The free machines a reconcile of `cluster` reads: for each of its
    /// machine pools, up to twice its replicas (and some slack) of the
    /// free machines it may claim that `alive` accepts, from a place in
    /// the free list that differs per cluster, so that clusters reconciled
    /// side by side rarely reach for the same machine.
    pub fn candidates(&self, cluster: &Cluster, alive: impl Fn(&str) -> bool) -> Vec<String> {
        let Some(wants) = Wants::of(cluster) else {
            return vec![];
        };
        let inner = self.lock();
        if inner.free.is_empty() {
            return vec![];
        }
        let start = (spot(&cluster.metadata.name), String::new());
        let mut picked = BTreeSet::new();
        for (selector, replicas) in &wants.pools {
            let want = 2 * *replicas as usize + CANDIDATE_SLACK;
            let mut found = 0;
            // From the cluster's place in the list to its end, then from
            // the start: every free machine once.
            let ring = inner
                .free
                .range(start.clone()..)
                .chain(inner.free.range(..start.clone()));
            for ((_, name), f) in ring {
                if found == want {
                    break;
                }
                if wants.takes(f) && selector.matches(&f.labels) && alive(name) {
                    picked.insert(name.clone());
                    found += 1;
                }
            }
        }
        picked.into_iter().collect()
    }

    /// Records whether pool cluster `cluster` lacked machines at its last
    /// reconcile, so a machine that becomes free wakes it.
    pub fn set_hungry(&self, cluster: &Cluster, hungry: bool) {
        let mut inner = self.lock();
        match (hungry, Wants::of(cluster)) {
            (true, Some(w)) => {
                inner.hungry.insert(cluster.metadata.name.clone(), w);
            }
            _ => {
                inner.hungry.remove(&cluster.metadata.name);
            }
        }
    }

    /// How many machines the index holds, assigned and free.
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.cluster_of.len(), inner.free.len())
    }
}

fn remove(inner: &mut Inner, name: &str) {
    if let Some(uid) = inner.cluster_of.remove(name) {
        if let Some(set) = inner.by_cluster.get_mut(&uid) {
            set.remove(name);
            if set.is_empty() {
                inner.by_cluster.remove(&uid);
            }
        }
    }
    inner.free.remove(&(spot(name), name.to_owned()));
}

/// Where a name sits in the free list: a hash, so that clusters (hashed
/// the same way) start their search at places spread over the list.
fn spot(name: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    h.finish()
}

fn put(inner: &mut Inner, m: &Machine) {
    let name = &m.metadata.name;
    match &m.spec.assignment {
        Some(a) => {
            inner.cluster_of.insert(name.clone(), a.cluster_uid.clone());
            inner
                .by_cluster
                .entry(a.cluster_uid.clone())
                .or_default()
                .insert(name.clone());
            inner
                .names
                .entry(a.cluster_uid.clone())
                .or_insert_with(|| a.cluster.clone());
        }
        None if m.status.phase == MachinePhase::Registered
            && m.metadata.deletion_timestamp.is_none() =>
        {
            inner.free.insert(
                (spot(name), name.clone()),
                Free {
                    pool: m.spec.pool.clone(),
                    labels: m.metadata.labels.clone(),
                },
            );
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::{Assignment, MachineRole};

    /// Pool cluster `name` (uid `uid-NAME`) of pool `p`.
    fn pool_cluster(name: &str, control_planes: u32, workers: u32) -> Cluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": drover_common::API_VERSION,
            "kind": "Cluster",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "generation": 1},
            "spec": {
                "kubernetesVersion": "v1.31.0",
                "controlPlane": {"replicas": control_planes},
                "workerPools": [{"name": "w", "replicas": workers}],
                "provider": {"pool": {"pool": "p"}},
            },
        }))
        .unwrap()
    }

    /// A machine registered into pool `p`, no cluster's.
    fn free_machine(name: &str) -> Machine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": drover_common::API_VERSION,
            "kind": "Machine",
            "metadata": {"name": name, "uid": format!("{name}-uid")},
            "spec": {"pool": "p"},
            "status": {"phase": "Registered", "hostname": name},
        }))
        .unwrap()
    }

    #[test]
    fn a_machine_moving_between_pool_and_cluster_wakes_both_sides() {
        let idx = FleetIndex::default();
        let c = pool_cluster("c1", 1, 1);
        let free = free_machine("m1");
        idx.rebuild(std::slice::from_ref(&c), std::slice::from_ref(&free));
        assert_eq!(idx.counts(), (0, 1));
        assert!(
            idx.machine_changed("m1", Some(&free)).is_empty(),
            "no one waits"
        );

        // c1 waits for machines: a machine that becomes free wakes it.
        idx.set_hungry(&c, true);
        assert_eq!(idx.machine_changed("m1", Some(&free)), ["c1"]);
        assert_eq!(idx.candidates(&c, |_| true), ["m1"]);
        assert!(
            idx.candidates(&c, |_| false).is_empty(),
            "a silent one is no candidate"
        );

        // Claimed: it leaves the free list and joins c1's machines.
        let mut claimed = free.clone();
        claimed.spec.assignment = Some(Assignment {
            cluster: "c1".into(),
            cluster_uid: "uid-c1".into(),
            machine_pool: "control-plane".into(),
            role: MachineRole::Init,
            generation: 1,
            assigned_at: None,
            replaces: None,
            kubernetes_version: None,
            image: None,
        });
        claimed.status.phase = MachinePhase::Assigned;
        assert_eq!(idx.machine_changed("m1", Some(&claimed)), ["c1"]);
        assert_eq!(idx.machines_of("uid-c1"), ["m1"]);
        assert_eq!(idx.cluster_of("m1").as_deref(), Some("c1"));
        assert!(idx.candidates(&c, |_| true).is_empty());

        // Deleted: c1 hears of it, and nothing is left.
        assert_eq!(idx.machine_changed("m1", None), ["c1"]);
        assert!(idx.machines_of("uid-c1").is_empty());
        assert_eq!(idx.counts(), (0, 0));
    }

    #[test]
    fn candidates_are_a_window_per_machine_pool_not_the_whole_pool() {
        let idx = FleetIndex::default();
        let c = pool_cluster("c1", 1, 2);
        let machines: Vec<Machine> = (0..500)
            .map(|i| free_machine(&format!("m{i:03}")))
            .collect();
        idx.rebuild(std::slice::from_ref(&c), &machines);
        let picked = idx.candidates(&c, |_| true);
        // Control plane: 2 x 1 + slack; workers: 2 x 2 + slack; they may
        // overlap.
        assert!(
            (2 + CANDIDATE_SLACK..=2 + 4 + 2 * CANDIDATE_SLACK).contains(&picked.len()),
            "{} candidates",
            picked.len()
        );
        // Another cluster starts elsewhere in the list.
        let d = pool_cluster("another-cluster", 1, 2);
        assert_ne!(idx.candidates(&d, |_| true), picked);
    }
}
