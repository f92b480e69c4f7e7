//! The fleet in numbers: how many clusters are in each phase, how many
//! machines in each phase and health, and each cluster's conditions, kept
//! up to date from the store's changes (on every replica, leader or not)
//! so that `/metrics` and the web overview cost what they show rather
//! than a read and decode of every object per request.
//!
//! Invariant: after [`FleetSummary::rebuild`] from a full read, applying
//! every later change of a cluster or machine (its record as it is now, or
//! `None` when deleted) leaves the summary equal to a rebuild from a full
//! read at that point; `changes_match_a_rebuild` checks it. A change
//! missed (the store's change feed lagged) is repaired by a rebuild.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use drover_common::api::{Cluster, ClusterPhase, Machine, MachinePhase, ProviderSpec};

use crate::metrics::{FleetGauges, MachineLabels};

/// A machine's health label: silent when the coordinator judged it not
/// alive, else what its last report says.
pub fn machine_health(m: &Machine) -> &'static str {
    if not_alive(m).is_some() {
        return "silent";
    }
    match &m.status.health {
        None => "unknown",
        Some(h) if h.kubelet.state == drover_common::wire::ProbeState::Unknown => "unknown",
        Some(h) if h.healthy() => "healthy",
        Some(_) => "unhealthy",
    }
}

/// The condition by which the coordinator judged a machine not alive, if
/// it did.
pub fn not_alive(m: &Machine) -> Option<&drover_common::api::Condition> {
    m.status
        .conditions
        .iter()
        .find(|c| c.type_ == crate::types::ALIVE_CONDITION && c.status == "False")
}

/// What the summary keeps of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ClusterEntry {
    phase: ClusterPhase,
    /// Its `drover_cluster_condition` series, rendered when it changes.
    condition_series: String,
    /// When its newest etcd snapshot was saved (Unix seconds), and the
    /// `cluster` label of its `drover_snapshot_age_seconds` series, which
    /// a scrape completes with the age then.
    snapshot: Option<(i64, String)>,
    /// Where its provider keeps objects outside the store, for the tasks
    /// that look after them without reading every cluster.
    provider: ProviderUse,
}

/// What a cluster's provider keeps outside the store.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ProviderUse {
    /// Claimed machines only.
    Pool,
    /// A Docker network (found by the cluster's name and UID) and containers.
    Docker { uid: String },
    /// Instances in an AWS region.
    Aws { region: String },
}

impl ProviderUse {
    fn of(c: &Cluster) -> Self {
        match &c.spec.provider {
            ProviderSpec::Pool(_) => ProviderUse::Pool,
            ProviderSpec::Docker(_) => ProviderUse::Docker {
                uid: c.metadata.uid.clone().unwrap_or_default(),
            },
            ProviderSpec::Aws(a) => ProviderUse::Aws {
                region: a.region.clone(),
            },
        }
    }
}

impl ClusterEntry {
    fn of(c: &Cluster) -> Self {
        let mut condition_series = String::new();
        for k in &c.status.conditions {
            crate::metrics::write_condition_series(
                &mut condition_series,
                &c.metadata.name,
                [&k.type_, &k.status, &k.reason],
            );
        }
        let snapshot = c.status.last_snapshot.as_ref().map(|l| {
            let mut series = String::from("drover_snapshot_age_seconds{cluster=\"");
            crate::metrics::escape_label(&mut series, &c.metadata.name);
            series.push_str("\"} ");
            (l.saved_at.unix_timestamp(), series)
        });
        Self {
            phase: c.status.phase,
            condition_series,
            snapshot,
            provider: ProviderUse::of(c),
        }
    }
}

/// The labels a machine is counted under; `None` for a deleted machine
/// (its tombstone is not counted).
fn machine_labels(m: &Machine) -> Option<MachineLabels> {
    (m.status.phase != MachinePhase::Deleted).then(|| MachineLabels {
        phase: m.status.phase.to_string(),
        health: machine_health(m),
        provider: m.spec.provider.clone().unwrap_or_else(|| "pool".into()),
    })
}

/// The node problems a machine's conditions say it has now.
fn machine_problems(m: &Machine) -> Vec<&'static str> {
    drover_common::api::NODE_PROBLEM_TYPES
        .iter()
        .copied()
        .filter(|t| {
            m.status
                .conditions
                .iter()
                .any(|c| c.type_ == *t && c.status == "True")
        })
        .collect()
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Inner {
    /// False until the first rebuild: nothing is known yet.
    built: bool,
    clusters: BTreeMap<String, ClusterEntry>,
    machines: HashMap<String, MachineLabels>,
    cluster_phases: BTreeMap<String, u64>,
    machine_counts: BTreeMap<MachineLabels, u64>,
    /// The node problems of each machine that has any now.
    machine_problems: HashMap<String, Vec<&'static str>>,
    problem_counts: BTreeMap<&'static str, u64>,
}

impl Inner {
    fn put_cluster(&mut self, name: &str, cluster: Option<&Cluster>) {
        if let Some(old) = self.clusters.remove(name) {
            decrement(&mut self.cluster_phases, &old.phase.to_string());
        }
        if let Some(c) = cluster {
            let entry = ClusterEntry::of(c);
            *self
                .cluster_phases
                .entry(entry.phase.to_string())
                .or_default() += 1;
            self.clusters.insert(name.to_owned(), entry);
        }
    }

    fn put_machine(&mut self, name: &str, machine: Option<&Machine>) {
        if let Some(old) = self.machines.remove(name) {
            decrement(&mut self.machine_counts, &old);
        }
        for p in self.machine_problems.remove(name).unwrap_or_default() {
            decrement(&mut self.problem_counts, &p);
        }
        if let Some(labels) = machine.and_then(machine_labels) {
            *self.machine_counts.entry(labels.clone()).or_default() += 1;
            self.machines.insert(name.to_owned(), labels);
            let problems = machine.map(machine_problems).unwrap_or_default();
            if !problems.is_empty() {
                for p in &problems {
                    *self.problem_counts.entry(p).or_default() += 1;
                }
                self.machine_problems.insert(name.to_owned(), problems);
            }
        }
    }
}

fn decrement<K: Ord>(counts: &mut BTreeMap<K, u64>, key: &K) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

/// The counts as a list, in key order.
fn counted<K: Clone>(counts: &BTreeMap<K, u64>) -> Vec<(K, u64)> {
    counts.iter().map(|(k, n)| (k.clone(), *n)).collect()
}

/// The counts the web overview shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overview {
    pub clusters: u64,
    pub cluster_phases: Vec<(String, u64)>,
    pub machines: u64,
    pub machine_phases: Vec<(String, u64)>,
    pub machine_health: Vec<(String, u64)>,
}

/// The summary; see the module documentation.
#[derive(Debug, Default)]
pub struct FleetSummary {
    inner: Mutex<Inner>,
}

impl FleetSummary {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("fleet summary lock")
    }

    /// Whether a full read has been applied yet.
    pub fn is_built(&self) -> bool {
        self.lock().built
    }

    /// Replaces everything with what a full read says.
    pub fn rebuild(&self, clusters: &[Cluster], machines: &[Machine]) {
        let mut fresh = Inner {
            built: true,
            ..Inner::default()
        };
        for c in clusters {
            fresh.put_cluster(&c.metadata.name, Some(c));
        }
        for m in machines {
            fresh.put_machine(&m.metadata.name, Some(m));
        }
        *self.lock() = fresh;
    }

    /// Records cluster `name` as it is now (`None`: deleted).
    pub fn cluster_changed(&self, name: &str, cluster: Option<&Cluster>) {
        self.lock().put_cluster(name, cluster);
    }

    /// Records machine `name` as it is now (`None`: deleted).
    pub fn machine_changed(&self, name: &str, machine: Option<&Machine>) {
        self.lock().put_machine(name, machine);
    }

    /// The counts of the web overview.
    pub fn overview(&self) -> Overview {
        let inner = self.lock();
        let mut phases: BTreeMap<String, u64> = BTreeMap::new();
        let mut health: BTreeMap<String, u64> = BTreeMap::new();
        for (labels, n) in &inner.machine_counts {
            *phases.entry(labels.phase.clone()).or_default() += n;
            *health.entry(labels.health.to_owned()).or_default() += n;
        }
        Overview {
            clusters: inner.clusters.len() as u64,
            cluster_phases: counted(&inner.cluster_phases),
            machines: inner.machines.len() as u64,
            machine_phases: phases.into_iter().collect(),
            machine_health: health.into_iter().collect(),
        }
    }

    /// The names of up to `limit` clusters, in name order, whose phase is
    /// not `phase`, and how many such clusters there are in all.
    pub fn clusters_not_in(&self, phase: ClusterPhase, limit: usize) -> (Vec<String>, usize) {
        let inner = self.lock();
        let mut names = vec![];
        let mut all = 0;
        for (name, entry) in &inner.clusters {
            if entry.phase != phase {
                all += 1;
                if names.len() < limit {
                    names.push(name.clone());
                }
            }
        }
        (names, all)
    }

    /// Whether any cluster uses the Docker provider.
    pub fn uses_docker(&self) -> bool {
        self.lock()
            .clusters
            .values()
            .any(|e| matches!(e.provider, ProviderUse::Docker { .. }))
    }

    /// The name and UID of every cluster that uses the Docker provider.
    pub fn docker_clusters(&self) -> Vec<(String, String)> {
        self.lock()
            .clusters
            .iter()
            .filter_map(|(name, e)| match &e.provider {
                ProviderUse::Docker { uid } => Some((name.clone(), uid.clone())),
                _ => None,
            })
            .collect()
    }

    /// Every AWS region a cluster uses.
    pub fn aws_regions(&self) -> std::collections::BTreeSet<String> {
        self.lock()
            .clusters
            .values()
            .filter_map(|e| match &e.provider {
                ProviderUse::Aws { region } => Some(region.clone()),
                _ => None,
            })
            .collect()
    }
}

impl FleetGauges for FleetSummary {
    fn cluster_phases(&self) -> Vec<(String, u64)> {
        counted(&self.lock().cluster_phases)
    }

    fn machine_counts(&self) -> Vec<(MachineLabels, u64)> {
        counted(&self.lock().machine_counts)
    }

    fn machine_problems(&self) -> Vec<(&'static str, u64)> {
        counted(&self.lock().problem_counts)
    }

    fn write_condition_series(&self, out: &mut String) {
        let inner = self.lock();
        for entry in inner.clusters.values() {
            out.push_str(&entry.condition_series);
        }
    }

    fn write_snapshot_ages(&self, out: &mut String, now: i64) {
        use std::fmt::Write;
        let inner = self.lock();
        for (saved_at, series) in inner.clusters.values().filter_map(|e| e.snapshot.as_ref()) {
            out.push_str(series);
            let _ = writeln!(out, "{}", (now - saved_at).max(0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::Condition;
    use drover_planner::fixtures;

    fn cluster(name: &str, phase: ClusterPhase, ready: &str) -> Cluster {
        let mut c = fixtures::pool_cluster(1, 0);
        c.metadata.name = name.into();
        c.status.phase = phase;
        c.status.conditions = vec![Condition {
            type_: "Ready".into(),
            status: ready.into(),
            reason: "Because".into(),
            message: String::new(),
            last_transition_time: fixtures::t0(),
        }];
        c
    }

    fn machine(name: &str, phase: MachinePhase, provider: Option<&str>) -> Machine {
        let mut m = fixtures::free(name, "dev");
        m.status.phase = phase;
        m.spec.provider = provider.map(str::to_owned);
        m
    }

    /// cluster/type/status/reason of each `drover_cluster_condition` series.
    fn conditions(s: &FleetSummary) -> Vec<String> {
        let mut text = String::new();
        s.write_condition_series(&mut text);
        text.lines()
            .map(|l| {
                let labels = l
                    .strip_prefix("drover_cluster_condition{")
                    .and_then(|l| l.strip_suffix("} 1"))
                    .unwrap_or_else(|| panic!("not a condition series: {l}"));
                labels
                    .split(',')
                    .map(|kv| kv.split_once('=').unwrap().1.trim_matches('"'))
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .collect()
    }

    #[test]
    fn changes_match_a_rebuild() {
        let a = cluster("a", ClusterPhase::Provisioning, "False");
        let b = cluster("b", ClusterPhase::Running, "True");
        let m1 = machine("m1", MachinePhase::Registered, None);
        let m2 = machine("m2", MachinePhase::Running, Some("docker"));
        let s = FleetSummary::default();
        assert!(!s.is_built());
        // m2 has a full disk and memory pressure; m1 had a read-only root
        // that cleared.
        let problem = |m: &mut Machine, t: &str, status: bool| {
            drover_common::api::set_condition(&mut m.status.conditions, t, status, "R", "");
        };
        let mut m1 = m1;
        let mut m2 = m2;
        problem(&mut m1, "ReadOnlyFilesystem", false);
        problem(&mut m2, "DiskPressure", true);
        problem(&mut m2, "MemoryPressure", true);
        s.rebuild(&[a.clone(), b.clone()], &[m1.clone(), m2.clone()]);
        assert!(s.is_built());
        assert_eq!(
            s.machine_problems(),
            [("DiskPressure", 1), ("MemoryPressure", 1)]
        );

        // a comes up, b goes, m1 joins a cluster, m2 is deleted (its
        // tombstone is not counted), m3 registers.
        let a2 = cluster("a", ClusterPhase::Running, "True");
        let mut m1b = machine("m1", MachinePhase::Running, None);
        problem(&mut m1b, "DiskPressure", true);
        let m2b = machine("m2", MachinePhase::Deleted, Some("docker"));
        let m3 = machine("m3", MachinePhase::Registered, None);
        s.cluster_changed("a", Some(&a2));
        s.cluster_changed("b", None);
        s.machine_changed("m1", Some(&m1b));
        s.machine_changed("m2", Some(&m2b));
        s.machine_changed("m3", Some(&m3));

        let fresh = FleetSummary::default();
        fresh.rebuild(&[a2], &[m1b, m2b, m3]);
        assert_eq!(*s.lock(), *fresh.lock());
        // A deleted machine's problems are not counted.
        assert_eq!(s.machine_problems(), [("DiskPressure", 1)]);
        assert_eq!(
            s.overview(),
            Overview {
                clusters: 1,
                cluster_phases: vec![("Running".into(), 1)],
                machines: 2,
                machine_phases: vec![("Registered".into(), 1), ("Running".into(), 1)],
                machine_health: vec![("unknown".into(), 2)],
            }
        );
        assert_eq!(conditions(&s), ["a/Ready/True/Because"]);
        assert_eq!(s.cluster_phases(), [("Running".to_owned(), 1)]);

        // A snapshot saved: its age at each scrape; none for a cluster
        // without one.
        let mut a3 = cluster("a", ClusterPhase::Running, "True");
        let saved_at = fixtures::t0();
        a3.status.last_snapshot = Some(drover_common::api::SnapshotRef {
            name: "a-1".into(),
            saved_at,
            revision: 9,
            size: 1,
        });
        s.cluster_changed("a", Some(&a3));
        let mut ages = String::new();
        s.write_snapshot_ages(&mut ages, saved_at.unix_timestamp() + 75);
        assert_eq!(ages, "drover_snapshot_age_seconds{cluster=\"a\"} 75\n");
        s.cluster_changed("a", Some(&cluster("a", ClusterPhase::Running, "True")));
        let mut none = String::new();
        s.write_snapshot_ages(&mut none, 0);
        assert_eq!(none, "");
        // A count that falls to zero leaves no series behind.
        assert!(s.machine_counts().iter().all(|(l, _)| l.provider == "pool"));
    }

    #[test]
    fn the_overview_lists_the_clusters_that_are_not_running_first_by_name() {
        let s = FleetSummary::default();
        let clusters: Vec<Cluster> = (0..5)
            .map(|i| {
                let phase = if i % 2 == 0 {
                    ClusterPhase::Running
                } else {
                    ClusterPhase::Degraded
                };
                cluster(&format!("c{i}"), phase, "True")
            })
            .collect();
        s.rebuild(&clusters, &[]);
        assert_eq!(
            s.clusters_not_in(ClusterPhase::Running, 1),
            (vec!["c1".to_owned()], 2)
        );
        assert_eq!(
            s.clusters_not_in(ClusterPhase::Running, 10),
            (vec!["c1".to_owned(), "c3".to_owned()], 2)
        );
    }

    #[test]
    fn the_providers_in_use_follow_the_clusters() {
        let mut d = fixtures::docker_cluster(1, 0);
        d.metadata.name = "d".into();
        d.metadata.uid = Some("uid-d".into());
        let mut a = fixtures::pool_cluster(1, 0);
        a.metadata.name = "a".into();
        a.spec.provider = serde_json::from_value(serde_json::json!({"aws": {
            "region": "eu-west-1",
            "controlPlane": {"ami": "ami-1", "instanceType": "t3.medium", "subnets": ["subnet-1"]},
            "workerPools": {},
        }}))
        .unwrap();
        let p = fixtures::pool_cluster(1, 0);
        let s = FleetSummary::default();
        s.rebuild(std::slice::from_ref(&p), &[]);
        assert!(!s.uses_docker());
        assert!(s.docker_clusters().is_empty() && s.aws_regions().is_empty());

        s.cluster_changed("d", Some(&d));
        s.cluster_changed("a", Some(&a));
        assert!(s.uses_docker());
        assert_eq!(
            s.docker_clusters(),
            vec![("d".to_owned(), "uid-d".to_owned())]
        );
        assert_eq!(s.aws_regions(), ["eu-west-1".to_owned()].into());

        s.cluster_changed("d", None);
        s.cluster_changed("a", None);
        assert!(!s.uses_docker());
        assert!(s.docker_clusters().is_empty() && s.aws_regions().is_empty());
    }
}
