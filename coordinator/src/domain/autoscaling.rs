//! What the cluster-autoscaler sees of a cluster, and what its requests
//! make of it: pure, over a cluster and its machines, so the
//! `externalgrpc` server (issue 36) only parses, checks the caller and
//! writes what this decides.
//!
//! A node group is one autoscaled worker pool (`workerPools[].autoscaling`
//! set); its id is `<cluster>/<pool>`, unambiguous as both are DNS labels.
//! Its target size is the pool's `replicas`. Its instances are the pool's
//! machines, named by their Node's providerID (so the autoscaler matches
//! them to Nodes), and one placeholder per machine the target asks for
//! that no machine fills yet: on a pool cluster with no free matching
//! machine, each placeholder carries an out-of-resources error, so the
//! autoscaler gives up on the scale-up and backs off instead of waiting
//! out its provision timeout.
//!
//! The rules copy what the autoscaler expects of a cloud provider
//! (cluster-autoscaler/cloudprovider/cloud_provider.go: `NodeGroup`'s
//! `IncreaseSize` refuses a delta past the maximum, `DecreaseTargetSize`
//! only gives up requests no node fills yet; `InstanceErrorClass`
//! `OutOfResourcesErrorClass` = 1, `OtherErrorClass` = 99).

use drover_common::api::{Cluster, Machine, MachinePhase, WorkerPoolSpec};
use drover_common::pki::{CertificateAuthority, IssuedCert, LeafSpec, LeafUsage, PkiError};

/// The common name of cluster `C`'s autoscaler certificate is
/// `autoscaler:C`: no machine's (a machine name has no colon).
pub const COMMON_NAME_PREFIX: &str = "autoscaler:";

/// Its organization names the cluster's UID, so a certificate of a
/// deleted cluster does not work for one made again under its name.
pub const ORGANIZATION_PREFIX: &str = "drover:autoscaler:";

/// How long an autoscaler's client certificate is valid.
pub const CREDENTIALS_VALIDITY: time::Duration = time::Duration::days(365);

/// A client certificate for the autoscaler of cluster `cluster` (UID
/// `uid`), signed by `ca`.
pub fn client_credentials(
    ca: &CertificateAuthority,
    cluster: &str,
    uid: &str,
) -> Result<IssuedCert, PkiError> {
    ca.issue(&LeafSpec {
        common_name: format!("{COMMON_NAME_PREFIX}{cluster}"),
        organizations: vec![format!("{ORGANIZATION_PREFIX}{uid}")],
        dns_names: vec![],
        ip_addresses: vec![],
        usage: LeafUsage::Client,
        validity: CREDENTIALS_VALIDITY,
    })
}

/// The error class of an instance that cannot be had: the provider (here
/// the pool) has no capacity (cloud_provider.go `OutOfResourcesErrorClass`).
pub const OUT_OF_RESOURCES: i32 = 1;

/// Any other instance error (cloud_provider.go `OtherErrorClass`).
pub const OTHER_ERROR: i32 = 99;

/// Why an autoscaler request is refused, with the gRPC status code it is
/// answered with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub code: Code,
    pub message: String,
}

/// The gRPC status codes a refusal uses (grpc/codes: the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// A malformed id or a delta of the wrong sign.
    InvalidArgument,
    /// No such node group.
    NotFound,
    /// A node or group of another cluster than the caller's.
    PermissionDenied,
    /// A size past the group's maximum or below its minimum.
    OutOfRange,
    /// The request would remove nodes that exist.
    FailedPrecondition,
}

fn refuse(code: Code, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

/// A node group as the autoscaler lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGroup {
    pub id: String,
    pub min_size: u32,
    pub max_size: u32,
    /// What the autoscaler logs of it.
    pub debug: String,
}

/// The id of pool `pool` of cluster `cluster`.
pub fn group_id(cluster: &str, pool: &str) -> String {
    format!("{cluster}/{pool}")
}

/// The node groups of `cluster`: its autoscaled worker pools.
pub fn node_groups(cluster: &Cluster) -> Vec<NodeGroup> {
    cluster
        .spec
        .worker_pools
        .iter()
        .filter_map(|p| group_of_pool(cluster, p))
        .collect()
}

fn group_of_pool(cluster: &Cluster, pool: &WorkerPoolSpec) -> Option<NodeGroup> {
    let range = pool.autoscaling?;
    Some(NodeGroup {
        id: group_id(&cluster.metadata.name, &pool.name),
        min_size: range.min_replicas,
        max_size: range.max_replicas,
        debug: format!(
            "cluster {} pool {}: {} of {}..{} machines",
            cluster.metadata.name, pool.name, pool.replicas, range.min_replicas, range.max_replicas
        ),
    })
}

/// The autoscaled pool that group `id` names in `cluster` (the caller's
/// cluster): refused when the id is malformed, names another cluster, or
/// names no autoscaled pool.
pub fn pool_of<'a>(cluster: &'a Cluster, id: &str) -> Result<&'a WorkerPoolSpec, Refusal> {
    let Some((cluster_name, pool)) = id.split_once('/') else {
        return Err(refuse(
            Code::InvalidArgument,
            format!("node group id {id:?} is not <cluster>/<pool>"),
        ));
    };
    if cluster_name != cluster.metadata.name {
        return Err(refuse(
            Code::PermissionDenied,
            format!(
                "node group {id} belongs to cluster {cluster_name}; this client's certificate is for cluster {}",
                cluster.metadata.name
            ),
        ));
    }
    cluster
        .spec
        .worker_pools
        .iter()
        .find(|p| p.name == pool && p.autoscaling.is_some())
        .ok_or_else(|| {
            refuse(
                Code::NotFound,
                format!(
                    "cluster {cluster_name} has no autoscaled worker pool {pool:?}; set workerPools[].autoscaling to make it a node group"
                ),
            )
        })
}

/// The Node `spec.providerID` of `machine` of cluster `cluster`.
pub fn provider_id(cluster: &str, machine: &Machine) -> String {
    machine.status.node_provider_id.clone().unwrap_or_else(|| {
        drover_common::kubeadm::drover_provider_id(cluster, &machine.metadata.name)
    })
}

/// The node group of the Node whose providerID is `provider_id`: `None`
/// for a control plane, a pool that is not autoscaled, or a machine this
/// coordinator does not know in `cluster` (the autoscaler then leaves the
/// Node alone); refused for a `drover://` id of another cluster.
pub fn group_for_node(
    cluster: &Cluster,
    machines: &[Machine],
    provider_id_of_node: &str,
) -> Result<Option<NodeGroup>, Refusal> {
    let name = &cluster.metadata.name;
    if let Some(rest) = provider_id_of_node.strip_prefix("drover://") {
        let other = rest.split('/').next().unwrap_or_default();
        if other != name.as_str() {
            return Err(refuse(
                Code::PermissionDenied,
                format!(
                    "node {provider_id_of_node} belongs to cluster {other}; this client's certificate is for cluster {name}"
                ),
            ));
        }
    }
    let Some(machine) = drover_planner::machines_of(cluster, machines)
        .into_iter()
        .find(|m| provider_id(name, m) == provider_id_of_node)
    else {
        return Ok(None);
    };
    let pool = machine
        .spec
        .assignment
        .as_ref()
        .map(|a| a.machine_pool.as_str())
        .unwrap_or_default();
    Ok(cluster
        .spec
        .worker_pools
        .iter()
        .find(|p| p.name == pool)
        .and_then(|p| group_of_pool(cluster, p)))
}

/// The target size after the autoscaler asks for `delta` more machines in
/// `pool`: refused for a delta that is not positive or that would pass
/// the maximum.
pub fn increased(pool: &WorkerPoolSpec, delta: i32) -> Result<u32, Refusal> {
    let range = pool.autoscaling.ok_or_else(|| not_autoscaled(pool))?;
    if delta <= 0 {
        return Err(refuse(
            Code::InvalidArgument,
            format!("size increase must be positive, got {delta}"),
        ));
    }
    let wanted = u64::from(pool.replicas) + delta as u64;
    if wanted > u64::from(range.max_replicas) {
        return Err(refuse(
            Code::OutOfRange,
            format!(
                "size increase too large: pool {} would have {wanted} machines, its maximum is {}",
                pool.name, range.max_replicas
            ),
        ));
    }
    Ok(wanted as u32)
}

/// The target size after the autoscaler gives up `-delta` requested
/// machines of `pool` that have not come yet; `existing` is how many of
/// its machines have (or are getting) a Node. Refused for a delta that is
/// not negative, that would drop below the minimum, or that would take
/// machines that exist: those go only by `NodeGroupDeleteNodes`, which
/// names them.
pub fn decreased_target(pool: &WorkerPoolSpec, delta: i32, existing: u32) -> Result<u32, Refusal> {
    let range = pool.autoscaling.ok_or_else(|| not_autoscaled(pool))?;
    if delta >= 0 {
        return Err(refuse(
            Code::InvalidArgument,
            format!("size decrease must be negative, got {delta}"),
        ));
    }
    let wanted = i64::from(pool.replicas) + i64::from(delta);
    if wanted < i64::from(existing) {
        return Err(refuse(
            Code::FailedPrecondition,
            format!(
                "attempt to delete existing nodes: pool {} targets {} with {existing} machines, delta {delta}; delete them by name instead",
                pool.name, pool.replicas
            ),
        ));
    }
    if wanted < i64::from(range.min_replicas) {
        return Err(refuse(
            Code::OutOfRange,
            format!(
                "size decrease too large: pool {} would have {wanted} machines, its minimum is {}",
                pool.name, range.min_replicas
            ),
        ));
    }
    Ok(wanted as u32)
}

fn not_autoscaled(pool: &WorkerPoolSpec) -> Refusal {
    refuse(
        Code::NotFound,
        format!("worker pool {} is not autoscaled", pool.name),
    )
}

/// An instance's state as the autoscaler reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    Running,
    Creating,
    Deleting,
}

/// Why an instance cannot come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceError {
    pub code: String,
    pub message: String,
    pub class: i32,
}

/// One instance of a node group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Its Node's providerID (a placeholder's is
    /// `drover://<cluster>/<pool>/pending-<n>`, which no Node has).
    pub id: String,
    pub state: InstanceState,
    pub error: Option<InstanceError>,
}

/// Whether `id` is a placeholder [`instances`] made for a machine not
/// there yet.
pub fn is_placeholder(id: &str) -> bool {
    id.strip_prefix("drover://")
        .and_then(|rest| rest.rsplit('/').next())
        .is_some_and(|last| last.starts_with("pending-"))
}

/// The machines of `machines` assigned to `pool` of `cluster`.
fn pool_machines<'a>(
    cluster: &Cluster,
    pool: &'a WorkerPoolSpec,
    machines: &'a [Machine],
) -> impl Iterator<Item = &'a Machine> + 'a {
    drover_planner::machines_of(cluster, machines)
        .into_iter()
        .filter(move |m| {
            m.spec
                .assignment
                .as_ref()
                .is_some_and(|a| a.machine_pool == pool.name)
        })
}

/// The instances of `pool` of `cluster`: its machines, and a placeholder
/// for each machine its target asks for that none fills yet.
/// `can_fill` says whether the provider can make one: a pool cluster's
/// when a free machine matches the pool; a provider that creates
/// machines always can.
pub fn instances(
    cluster: &Cluster,
    pool: &WorkerPoolSpec,
    machines: &[Machine],
    can_fill: bool,
) -> Vec<Instance> {
    let name = &cluster.metadata.name;
    let mut out: Vec<Instance> = pool_machines(cluster, pool, machines)
        .map(|m| {
            let leaving = m.metadata.deletion_timestamp.is_some()
                || m.metadata
                    .annotations
                    .contains_key(drover_common::names::SCALE_DOWN_ANNOTATION)
                || matches!(
                    m.status.phase,
                    MachinePhase::Releasing | MachinePhase::Deleting | MachinePhase::Deleted
                );
            let (state, error) = match m.status.phase {
                _ if leaving => (InstanceState::Deleting, None),
                MachinePhase::Running => (InstanceState::Running, None),
                MachinePhase::Failed => (
                    InstanceState::Creating,
                    Some(InstanceError {
                        code: "BootstrapFailed".into(),
                        message: format!("machine {} failed to bootstrap", m.metadata.name),
                        class: OTHER_ERROR,
                    }),
                ),
                _ => (InstanceState::Creating, None),
            };
            Instance {
                id: provider_id(name, m),
                state,
                error,
            }
        })
        .collect();
    let staying = out
        .iter()
        .filter(|i| i.state != InstanceState::Deleting)
        .count() as u32;
    for n in staying..pool.replicas {
        out.push(Instance {
            id: format!("drover://{name}/{}/pending-{n}", pool.name),
            state: InstanceState::Creating,
            error: (!can_fill).then(|| InstanceError {
                code: "NoFreeMachine".into(),
                message: format!(
                    "no free machine matches pool {} of cluster {name}; register more machines into its pool",
                    pool.name
                ),
                class: OUT_OF_RESOURCES,
            }),
        });
    }
    out
}

/// How many Pods a kubelet runs unless told otherwise (`maxPods`).
pub const DEFAULT_MAX_PODS: u32 = 110;

/// The memory a kubelet keeps from Pods by default: its hard eviction
/// threshold `memory.available<100Mi`.
pub const EVICTION_MEMORY: u64 = 100 << 20;

/// The Node a new machine of a pool would become, for the autoscaler's
/// scale-up simulations (and scale-from-zero).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateNode {
    pub name: String,
    pub provider_id: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub capacity: drover_common::api::Capacity,
    pub kubelet_version: String,
}

/// The CPUs and memory a new machine of `pool` would have, from what
/// machines reported: one of the pool's own (a Running one first), else
/// `free`, a machine it may claim; `None` when none reported them.
pub fn reported_capacity(
    cluster: &Cluster,
    pool: &WorkerPoolSpec,
    machines: &[Machine],
    free: Option<&Machine>,
) -> Option<drover_common::api::Capacity> {
    let mut own: Vec<&Machine> = pool_machines(cluster, pool, machines)
        .filter(|m| m.status.capacity.is_some())
        .collect();
    own.sort_by_key(|m| m.status.phase != MachinePhase::Running);
    own.first()
        .copied()
        .or(free)
        .and_then(|m| m.status.capacity)
}

/// The template node of `pool` with `capacity`.
pub fn template(
    cluster: &Cluster,
    pool: &WorkerPoolSpec,
    capacity: drover_common::api::Capacity,
) -> TemplateNode {
    let name = format!("{}-{}-template", cluster.metadata.name, pool.name);
    let labels = [
        ("kubernetes.io/hostname", name.as_str()),
        ("kubernetes.io/os", "linux"),
        // What Drover's node images run on.
        ("kubernetes.io/arch", "amd64"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    TemplateNode {
        provider_id: format!("drover://{}/{}/template", cluster.metadata.name, pool.name),
        name,
        labels,
        capacity,
        kubelet_version: cluster.spec.kubernetes_version.clone(),
    }
}

/// How many of `pool`'s machines have (or are getting) a Node: what a
/// decrease of its target must leave.
pub fn existing(cluster: &Cluster, pool: &WorkerPoolSpec, machines: &[Machine]) -> u32 {
    instances(cluster, pool, machines, true)
        .iter()
        .filter(|i| i.state != InstanceState::Deleting && !is_placeholder(&i.id))
        .count() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::{AutoscalingSpec, MachineRole};

    use drover_planner::fixtures::{claimed, pool_cluster};

    /// Cluster `c` whose worker pool `w` scales in 1..4.
    fn cluster() -> Cluster {
        let mut c = pool_cluster(1, 2);
        c.spec.worker_pools[0].autoscaling = Some(AutoscalingSpec {
            min_replicas: 1,
            max_replicas: 4,
        });
        c
    }

    fn machine(_: &Cluster, name: &str, pool: &str, phase: MachinePhase) -> Machine {
        let role = if pool == "control-plane" {
            MachineRole::Init
        } else {
            MachineRole::Worker
        };
        claimed(name, pool, role, phase)
    }

    #[test]
    fn a_template_has_the_hardware_a_machine_of_the_pool_reported() {
        let c = cluster();
        let pool = c.spec.worker_pools[0].clone();
        let hw = |cpus| drover_common::api::Capacity {
            cpus,
            memory_bytes: 8 << 30,
        };
        let mut free = drover_planner::fixtures::free("f", "dev");
        assert_eq!(reported_capacity(&c, &pool, &[], Some(&free)), None);
        // From zero: a free machine the pool may claim.
        free.status.capacity = Some(hw(2));
        assert_eq!(reported_capacity(&c, &pool, &[], Some(&free)), Some(hw(2)));
        // The pool's own Running machine wins over a free one.
        let mut own = machine(&c, "w-1", "w", MachinePhase::Running);
        own.status.capacity = Some(hw(8));
        assert_eq!(
            reported_capacity(&c, &pool, &[own], Some(&free)),
            Some(hw(8))
        );
        let t = template(&c, &pool, hw(8));
        assert_eq!((t.capacity.cpus, t.name.as_str()), (8, "c-w-template"));
        assert_eq!(t.labels["kubernetes.io/os"], "linux");
        assert_eq!(t.kubelet_version, c.spec.kubernetes_version);
    }

    #[test]
    fn only_autoscaled_pools_are_node_groups() {
        let mut c = cluster();
        let groups = node_groups(&c);
        assert_eq!(groups.len(), 1);
        assert_eq!(
            (
                groups[0].id.as_str(),
                groups[0].min_size,
                groups[0].max_size
            ),
            ("c/w", 1, 4)
        );
        c.spec.worker_pools[0].autoscaling = None;
        assert!(node_groups(&c).is_empty());
        let e = pool_of(&c, "c/w").unwrap_err();
        assert_eq!(e.code, Code::NotFound);
    }

    #[test]
    fn a_group_or_node_of_another_cluster_is_refused() {
        let c = cluster();
        assert_eq!(
            pool_of(&c, "other/w").unwrap_err().code,
            Code::PermissionDenied
        );
        assert_eq!(
            pool_of(&c, "no-slash").unwrap_err().code,
            Code::InvalidArgument
        );
        let e = group_for_node(&c, &[], "drover://other/other-w-1").unwrap_err();
        assert_eq!(e.code, Code::PermissionDenied);
        assert!(e.message.contains("cluster other"), "{e}");
        // An id no machine here has is no group's: the autoscaler leaves it.
        assert_eq!(group_for_node(&c, &[], "drover://c/unknown").unwrap(), None);
    }

    #[test]
    fn a_nodes_group_is_its_machines_autoscaled_pool() {
        let c = cluster();
        let worker = machine(&c, "w-1", "w", MachinePhase::Running);
        let cp = machine(&c, "cp-1", "control-plane", MachinePhase::Running);
        let machines = [worker, cp];
        let group = group_for_node(&c, &machines, "drover://c/w-1").unwrap();
        assert_eq!(group.map(|g| g.id), Some("c/w".into()));
        assert_eq!(
            group_for_node(&c, &machines, "drover://c/cp-1").unwrap(),
            None
        );
        // On AWS the Node's id is the instance's.
        let mut aws = machine(&c, "w-2", "w", MachinePhase::Running);
        aws.status.node_provider_id = Some("aws:///us-east-1a/i-0abc".into());
        let group = group_for_node(&c, &[aws], "aws:///us-east-1a/i-0abc").unwrap();
        assert_eq!(group.map(|g| g.id), Some("c/w".into()));
    }

    #[test]
    fn increase_stays_within_the_maximum() {
        let mut c = cluster();
        let pool = &mut c.spec.worker_pools[0];
        pool.replicas = 2;
        assert_eq!(increased(pool, 2).unwrap(), 4);
        let e = increased(pool, 3).unwrap_err();
        assert_eq!(e.code, Code::OutOfRange);
        assert!(e.message.contains("maximum is 4"), "{e}");
        assert_eq!(increased(pool, 0).unwrap_err().code, Code::InvalidArgument);
        assert_eq!(
            increased(pool, i32::MAX).unwrap_err().code,
            Code::OutOfRange
        );
    }

    #[test]
    fn a_target_decrease_gives_up_only_machines_not_there_yet() {
        let mut c = cluster();
        let pool = &mut c.spec.worker_pools[0];
        pool.replicas = 4;
        assert_eq!(decreased_target(pool, -2, 2).unwrap(), 2);
        let e = decreased_target(pool, -3, 2).unwrap_err();
        assert_eq!(e.code, Code::FailedPrecondition);
        assert_eq!(
            decreased_target(pool, -4, 0).unwrap_err().code,
            Code::OutOfRange
        );
        assert_eq!(
            decreased_target(pool, 1, 0).unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn instances_are_machines_and_placeholders_for_what_is_missing() {
        let mut c = cluster();
        c.spec.worker_pools[0].replicas = 4;
        let mut leaving = machine(&c, "w-3", "w", MachinePhase::Running);
        leaving.metadata.deletion_timestamp = Some(drover_common::now());
        // One the autoscaler took out is deleting from the moment it is
        // marked, before the reconciler has released it.
        let mut marked = machine(&c, "w-4", "w", MachinePhase::Running);
        marked.metadata.annotations.insert(
            drover_common::names::SCALE_DOWN_ANNOTATION.into(),
            "cluster-autoscaler".into(),
        );
        let machines = [
            machine(&c, "w-1", "w", MachinePhase::Running),
            machine(&c, "w-2", "w", MachinePhase::Bootstrapping),
            leaving,
            marked,
            machine(&c, "cp-1", "control-plane", MachinePhase::Running),
        ];
        let pool = c.spec.worker_pools[0].clone();
        let got = instances(&c, &pool, &machines, false);
        let states: Vec<(&str, InstanceState, Option<i32>)> = got
            .iter()
            .map(|i| (i.id.as_str(), i.state, i.error.as_ref().map(|e| e.class)))
            .collect();
        assert_eq!(
            states,
            [
                ("drover://c/w-1", InstanceState::Running, None),
                ("drover://c/w-2", InstanceState::Creating, None),
                ("drover://c/w-3", InstanceState::Deleting, None),
                ("drover://c/w-4", InstanceState::Deleting, None),
                (
                    "drover://c/w/pending-2",
                    InstanceState::Creating,
                    Some(OUT_OF_RESOURCES)
                ),
                (
                    "drover://c/w/pending-3",
                    InstanceState::Creating,
                    Some(OUT_OF_RESOURCES)
                ),
            ]
        );
        assert!(is_placeholder("drover://c/w/pending-2"));
        assert!(!is_placeholder("drover://c/w-1"));
        // A provider that makes machines has no shortage to report.
        let got = instances(&c, &pool, &machines, true);
        assert!(got.iter().all(|i| i.error.is_none()));
        assert_eq!(existing(&c, &pool, &machines), 2);
    }
}
