//! The `Cluster` object: its spec, status and validation (`Cluster::validate`
//! returns every field error at once). The operations in flight on its
//! status are in [`super::operations`].

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::addons::{
    validate_addons, Addon, AddonApply, AddonMode, AddonSource, AddonStatus, EffectiveAddon,
    IMAGE_CNI_ADDON,
};
use super::aws::AwsProviderSpec;
use super::customise::{
    resolve_file, validate_customisation, CustomiseError, MachineCustomisation, MachineFile,
    MachineFileContent, SecretLookup,
};
use super::format::FormatError;
use super::meta::{is_zero, Condition, LabelSelector, ObjectMeta};
use super::operations::{
    CertificateRenewal, EssentialAddonsUpgrade, EtcdRemoval, MachineUpgrade, NodeDrain,
    NodeRemoval, VersionUpdate,
};
use super::problem::FieldError;
use crate::names::{check_dns_label, check_labels, CONTROL_PLANE_POOL};
use crate::units::{parse_duration, parse_percent};

// ---------------------------------------------------------------- Cluster

/// A declared Kubernetes cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cluster {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ClusterSpec,
    #[serde(default)]
    pub status: ClusterStatus,
}

/// What the cluster should be: versions, counts and templates, and what
/// goes onto its machines around kubeadm (files, commands) and into it
/// (addons, a pod network).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    /// A Kubernetes release such as `v1.31.2`.
    pub kubernetes_version: String,
    pub control_plane: ControlPlaneSpec,
    #[serde(default)]
    pub worker_pools: Vec<WorkerPoolSpec>,
    #[serde(default)]
    pub network: NetworkSpec,
    pub provider: ProviderSpec,
    /// Where every kubelet, join and kubeconfig reaches the API servers:
    /// `host:port` of a load balancer, DNS name or VIP in front of them, or
    /// `{managed: coordinator}` (pool clusters) for a TCP proxy the
    /// coordinator keeps. When unset, a control-plane machine's own address
    /// is used, which dies with that machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ControlPlaneEndpoint>,
    /// When machines count as unhealthy and how many may be replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthPolicy>,
    /// How a machine leaving on purpose is drained first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainPolicy>,
    /// How machines made for an older version (or image) are rolled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradePolicy>,
    /// Files every machine gets before kubeadm runs (a pool may add its
    /// own; `controlPlaneOnly` keeps one off workers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<MachineFile>,
    /// Shell commands every machine runs, in order, after its files are
    /// written and before kubeadm; a pool's own follow these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_kubeadm_commands: Vec<String>,
    /// Shell commands every machine runs, in order, once kubeadm succeeded;
    /// a pool's own follow these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_kubeadm_commands: Vec<String>,
    /// Manifests applied in order, by server-side apply through a running
    /// control plane, once the API server answers. Removing one never
    /// deletes what it applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addons: Vec<Addon>,
}

/// `spec.upgrade`: how a rollout proceeds once `kubernetesVersion` or a
/// machine image changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradePolicy {
    /// How long each new machine must be Running, healthy and its Node
    /// Ready before the rollout takes its next step (default `2m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle_time: Option<String>,
    /// A control plane whose kubeadm certificates expire within this is
    /// replaced (docker, aws) by one with new certificates, at the same
    /// version (default `30d`; from `7d` to under a year, the validity
    /// kubeadm gives them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_certificates_before: Option<String>,
}

/// How long a new machine settles by default.
pub const DEFAULT_SETTLE_TIME: std::time::Duration = std::time::Duration::from_secs(120);

/// How long before their expiry control-plane certificates are renewed by
/// default.
pub const DEFAULT_RENEW_CERTIFICATES_BEFORE: std::time::Duration =
    std::time::Duration::from_secs(30 * 86400);

/// The range `renewCertificatesBefore` may take: a week at least, and
/// less than the year kubeadm's certificates are valid for (or every new
/// control plane would be renewed at once).
pub const RENEW_CERTIFICATES_BEFORE_RANGE: std::ops::Range<std::time::Duration> =
    std::time::Duration::from_secs(7 * 86400)..std::time::Duration::from_secs(365 * 86400);

impl UpgradePolicy {
    /// The settle time of `policy` (validated at apply), or the default.
    pub fn settle_time(policy: Option<&UpgradePolicy>) -> std::time::Duration {
        policy
            .and_then(|p| p.settle_time.as_deref())
            .and_then(|t| crate::units::parse_duration(t).ok())
            .unwrap_or(DEFAULT_SETTLE_TIME)
    }

    /// The renewal window of `policy` (validated at apply), or the default.
    pub fn renew_certificates_before(policy: Option<&UpgradePolicy>) -> std::time::Duration {
        policy
            .and_then(|p| p.renew_certificates_before.as_deref())
            .and_then(|t| crate::units::parse_duration(t).ok())
            .unwrap_or(DEFAULT_RENEW_CERTIFICATES_BEFORE)
    }
}

/// How a pool replaces its machines during a rollout.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutPolicy {
    /// How many machines may be created above the pool's replicas (the
    /// control plane: 0 or 1; default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<u32>,
    /// How many of the pool's machines may be missing (worker pools
    /// only; default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<u32>,
}

impl RolloutPolicy {
    /// `maxSurge`, defaulted.
    pub fn surge(policy: Option<&RolloutPolicy>) -> u32 {
        policy.and_then(|p| p.max_surge).unwrap_or(1)
    }

    /// `maxUnavailable`, defaulted.
    pub fn unavailable(policy: Option<&RolloutPolicy>) -> u32 {
        policy.and_then(|p| p.max_unavailable).unwrap_or(0)
    }
}

/// `spec.drain`: a machine that leaves on purpose (scale-down, `drover
/// delete machine`) is cordoned and its Pods evicted through the Eviction
/// API first, so PodDisruptionBudgets hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrainPolicy {
    /// How long a drain may be refused (by a PodDisruptionBudget, or Pods
    /// that do not go) before the machine's removal halts with a
    /// `DrainFailed` condition; `10m` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// After the timeout, remove the machine anyway instead of halting.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// Evict Pods that declare no controller (bare Pods: nothing creates
    /// them again elsewhere), as `kubectl drain --force` does. Without it a
    /// Node running one is not drained: each attempt is refused naming
    /// those Pods, and the removal halts after the timeout. Finished Pods
    /// (Succeeded, Failed) are always evicted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delete_pods_without_controller: bool,
    /// Evict Pods with an `emptyDir` volume, whose data is lost with the
    /// Pod, as `kubectl drain --delete-emptydir-data` does. Without it a
    /// Node running one is not drained, as above.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delete_empty_dir_data: bool,
}

/// The drain timeout when `spec.drain.timeout` is unset.
pub const DEFAULT_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

impl DrainPolicy {
    /// `spec.drain.timeout`, or the default.
    pub fn timeout(policy: Option<&DrainPolicy>) -> std::time::Duration {
        policy
            .and_then(|p| p.timeout.as_deref())
            .and_then(|t| parse_duration(t).ok())
            .unwrap_or(DEFAULT_DRAIN_TIMEOUT)
    }
}

/// `spec.controlPlaneEndpoint`: an address, or an endpoint Drover keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ControlPlaneEndpoint {
    /// `host:port` of a load balancer, DNS name or VIP the user keeps.
    Address(String),
    /// `{managed: coordinator}`: a port of the coordinator's, proxied to the
    /// cluster's healthy control-plane machines.
    Managed { managed: EndpointManager },
}

/// Who keeps a managed control-plane endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EndpointManager {
    /// The coordinator's own TCP proxy (pool clusters).
    Coordinator,
}

impl<'de> Deserialize<'de> for ControlPlaneEndpoint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const WANT: &str = "a host:port such as lb.example.com:6443, or {managed: coordinator}";
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ControlPlaneEndpoint;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(WANT)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(ControlPlaneEndpoint::Address(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                use serde::de::Error;
                let mut managed = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "managed" {
                        return Err(A::Error::custom(format!(
                            "unknown field {key:?} in controlPlaneEndpoint: expected {WANT}"
                        )));
                    }
                    let who: String = map.next_value()?;
                    managed = Some(match who.as_str() {
                        "coordinator" => EndpointManager::Coordinator,
                        other => {
                            return Err(A::Error::custom(format!(
                                "controlPlaneEndpoint.managed: {other:?} is not known; the only manager is \"coordinator\""
                            )))
                        }
                    });
                }
                managed
                    .map(|managed| ControlPlaneEndpoint::Managed { managed })
                    .ok_or_else(|| {
                        A::Error::custom(format!("controlPlaneEndpoint: expected {WANT}"))
                    })
            }
        }
        d.deserialize_any(V)
    }
}

impl ClusterSpec {
    /// The user's `host:port`, when the spec gives one.
    pub fn endpoint_address(&self) -> Option<&str> {
        match &self.control_plane_endpoint {
            Some(ControlPlaneEndpoint::Address(a)) => Some(a),
            _ => None,
        }
    }

    /// Whether the coordinator keeps the cluster's endpoint.
    pub fn endpoint_managed_by_coordinator(&self) -> bool {
        matches!(
            self.control_plane_endpoint,
            Some(ControlPlaneEndpoint::Managed {
                managed: EndpointManager::Coordinator
            })
        )
    }
}

/// One etcd member, as a control-plane agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdMember {
    /// The member id in hexadecimal, as `etcdctl member list` prints it.
    pub id: String,
    /// The member's name (its node's name); empty until it has started.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peer_urls: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_urls: Vec<String>,
    /// Whether it has started (published its name and client URLs).
    #[serde(default)]
    pub started: bool,
    /// Whether its `/health` answered true to the reporting agent.
    #[serde(default)]
    pub healthy: bool,
    /// Whether it is a learner (etcd's non-voting member, as kubeadm 1.29+
    /// adds a joining control plane's member until it is in sync): it
    /// counts towards no quorum and is no settled member yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_learner: bool,
}

impl EtcdMember {
    /// Whether it votes (every member but a learner).
    pub fn voting(&self) -> bool {
        !self.is_learner
    }
}

/// One Node of the cluster, as a control-plane agent reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterNode {
    pub name: String,
    /// Its `Ready` condition: `True`, `False` or `Unknown`.
    pub ready: String,
    /// When `Ready` last changed (its `lastTransitionTime`).
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub since: Option<time::OffsetDateTime>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unschedulable: bool,
    /// The version its kubelet reports (`status.nodeInfo.kubeletVersion`):
    /// the version that runs, not what a machine's image was meant to hold.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kubelet_version: String,
    /// Why it is not Ready: its `Ready` condition's message (at most
    /// [`MAX_NODE_MESSAGE`] characters), empty while Ready.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The longest Node message kept.
pub const MAX_NODE_MESSAGE: usize = 512;

impl ClusterNode {
    /// Whether the Node is not Ready because its container runtime has no
    /// pod network ("container runtime network not ready ... cni plugin
    /// not initialized"): the cluster lacks a network, which replacing the
    /// machine would not give it.
    pub fn network_not_ready(&self) -> bool {
        self.ready != "True" && self.message.contains("network not ready")
    }
}

/// A rollout's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutStatus {
    /// The version the cluster rolls to.
    pub version: String,
    /// What the machines are rolled to (the version and each pool's image);
    /// a spec change makes a new target, which starts a new rollout.
    pub target: String,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: time::OffsetDateTime,
    /// Per pool, control plane first.
    #[serde(default)]
    pub pools: Vec<PoolRollout>,
    /// Why the rollout stopped; nothing more is replaced until the spec
    /// changes or `drover rollout resume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<RolloutHalt>,
    /// What the rollout waits for before its next step, and why (a new
    /// machine's Node NotReady and what it says, another change under
    /// way, a silent machine); absent while it steps or is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// New machines of this rollout that failed (bootstrap or health) and
    /// were replaced; the second failure halts the rollout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<RolloutHalt>,
}

/// One pool's rollout progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolRollout {
    pub name: String,
    /// Running machines made for the target.
    pub updated: u32,
    pub desired: u32,
    /// Machines still made for an older version or image.
    pub outdated: u32,
}

/// Where and why a rollout halted, or one of its new machines failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutHalt {
    pub machine: String,
    /// The step that failed: `bootstrap`, `health` or `settle`.
    pub step: String,
    pub reason: String,
    #[serde(with = "time::serde::rfc3339")]
    pub at: time::OffsetDateTime,
}

/// Overrides of the coordinator's health and remediation defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthPolicy {
    /// Silence after which a machine is unhealthy, e.g. `40s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_timeout: Option<String>,
    /// Longest time from creation to Running, e.g. `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout: Option<String>,
    /// How long a machine may report a failing kubelet or node, e.g. `2m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_timeout: Option<String>,
    /// Remediation pauses for a pool when more than this share of it is
    /// unhealthy, e.g. `40%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unhealthy: Option<String>,
}

/// The control-plane pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControlPlaneSpec {
    /// 1, 3 or 5 (etcd quorum needs an odd count).
    pub replicas: u32,
    /// Extra labels a pool machine must carry to serve here.
    #[serde(default, skip_serializing_if = "is_default")]
    pub selector: LabelSelector,
    /// How the control plane rolls (`maxSurge` 0 or 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutPolicy>,
    /// Files for control-plane machines only, after `spec.files`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<MachineFile>,
    /// Commands control-plane machines run before kubeadm, after
    /// `spec.preKubeadmCommands`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_kubeadm_commands: Vec<String>,
    /// Commands control-plane machines run after kubeadm, after
    /// `spec.postKubeadmCommands`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_kubeadm_commands: Vec<String>,
}

/// A pool of worker machines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerPoolSpec {
    pub name: String,
    pub replicas: u32,
    #[serde(default, skip_serializing_if = "is_default")]
    pub selector: LabelSelector,
    /// How the pool rolls (`maxSurge`, `maxUnavailable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutPolicy>,
    /// Files for this pool's machines only, after `spec.files`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<MachineFile>,
    /// Commands this pool's machines run before kubeadm, after
    /// `spec.preKubeadmCommands`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_kubeadm_commands: Vec<String>,
    /// Commands this pool's machines run after kubeadm, after
    /// `spec.postKubeadmCommands`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_kubeadm_commands: Vec<String>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Pod and service networks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkSpec {
    #[serde(default = "default_pod_subnet")]
    pub pod_subnet: String,
    #[serde(default = "default_service_subnet")]
    pub service_subnet: String,
    #[serde(default = "default_dns_domain")]
    pub dns_domain: String,
    /// Where the pod network comes from: `none` (an addon or a file gives
    /// it) or `image` (the node image's default network). A document that
    /// leaves it out gets, when the cluster is created, `image` for the
    /// docker provider (unless the spec brings a CNI config file or an
    /// addon named `cni`) and `none` for pool and aws; an existing cluster
    /// keeps what it has (`drover apply`, `http/admin.rs`). A stored
    /// cluster without it is `none`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub cni: CniMode,
}

/// Where a cluster's pod network comes from. Left out of a new cluster's
/// document: `image` on docker (as kind installs kindnet by default;
/// `none` when the spec brings a CNI config file or an addon named `cni`),
/// `none` on pool and aws; an explicit value is always kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CniMode {
    /// Drover installs none: an addon (a CNI's manifests) or `spec.files`
    /// (a CNI config) gives the cluster its network. What a stored cluster
    /// without the field has.
    #[default]
    None,
    /// The node image's default network, for machines on one flat
    /// network: every machine's agent writes the image's CNI config
    /// (`/usr/share/drover/cni/net.d`) with its own Node's `spec.podCIDR`
    /// and routes every other Node's range to that Node's `InternalIP`;
    /// a control plane applies the image's manifest
    /// (`/usr/share/drover/cni/manifests.yaml`) as the first addon, `cni`.
    Image,
}

fn default_pod_subnet() -> String {
    "10.244.0.0/16".into()
}
fn default_service_subnet() -> String {
    "10.96.0.0/12".into()
}
fn default_dns_domain() -> String {
    "cluster.local".into()
}

impl Default for NetworkSpec {
    fn default() -> Self {
        Self {
            pod_subnet: default_pod_subnet(),
            service_subnet: default_service_subnet(),
            dns_domain: default_dns_domain(),
            cni: CniMode::None,
        }
    }
}

/// Where machines come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum ProviderSpec {
    /// Claim machines that registered themselves into a pool.
    Pool(PoolProviderSpec),
    /// Create machines as containers on a Docker network of the cluster's own.
    Docker(DockerProviderSpec),
    /// Create machines as EC2 instances.
    Aws(AwsProviderSpec),
}

impl ProviderSpec {
    pub fn name(&self) -> &'static str {
        match self {
            ProviderSpec::Pool(_) => "pool",
            ProviderSpec::Docker(_) => "docker",
            ProviderSpec::Aws(_) => "aws",
        }
    }

    /// The field a spec update may not change, if `new` changes one: the
    /// provider itself and an AWS region are fixed for a cluster's life;
    /// AWS machine templates and tags, and the docker image, may change
    /// (machines made from the old ones are rolled).
    pub fn immutable_change(&self, new: &ProviderSpec) -> Option<(&'static str, &'static str)> {
        const MOVE: &str = "is immutable; delete the cluster and create it again to move it";
        match (self, new) {
            (ProviderSpec::Aws(a), ProviderSpec::Aws(b)) => {
                if a.region != b.region {
                    Some(("spec.provider.aws.region", MOVE))
                } else {
                    (a.load_balancer != b.load_balancer).then_some((
                        "spec.provider.aws.loadBalancer",
                        "is immutable: the endpoint is in the cluster's certificates and kubeconfigs; delete the cluster and create it again to change it",
                    ))
                }
            }
            (ProviderSpec::Docker(a), ProviderSpec::Docker(b)) => {
                let same_but_image = DockerProviderSpec {
                    image: a.image.clone(),
                    ..b.clone()
                };
                (*a != same_but_image).then_some((
                    "spec.provider.docker",
                    "may change only its image: the profile and privileges are fixed for a cluster's life; delete the cluster and create it again to change them",
                ))
            }
            (a, b) => (a != b).then_some(("spec.provider", MOVE)),
        }
    }

    /// The image the provider makes `pool`'s machines from: the docker
    /// image, or the pool's AMI; `None` for pool clusters.
    pub fn machine_image(&self, pool: &str) -> Option<String> {
        match self {
            ProviderSpec::Pool(_) => None,
            ProviderSpec::Docker(d) => Some(d.image.clone()),
            ProviderSpec::Aws(a) => a.template(pool).map(|t| t.ami.clone()),
        }
    }

    /// Whether the coordinator creates and deletes the cluster's machines.
    pub fn creates_machines(&self) -> bool {
        !matches!(self, ProviderSpec::Pool(_))
    }

    /// Whether the cluster's machines are containers (the `docker`
    /// provider, whatever its profile), whose kubeadm configs then carry the
    /// settings a kubelet inside a container needs.
    pub fn machines_are_containers(&self) -> bool {
        matches!(self, ProviderSpec::Docker(_))
    }
}

/// The `docker` provider: machines are containers from a node image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DockerProviderSpec {
    /// A node image with `drover-agent` in it: as its entrypoint (profile
    /// `minimal`) or started by systemd (profile `kind`).
    pub image: String,
    /// How the image's machines are created; `minimal` when not given.
    #[serde(default, skip_serializing_if = "is_default")]
    pub profile: DockerMachineProfile,
    /// Profile `kind` only: `false` on an engine that cannot grant every
    /// capability (one whose own bounding set lacks some, or that remaps
    /// user namespaces): the machine then gets only `CAP_SYS_ADMIN` and
    /// `CAP_NET_ADMIN` beyond Docker's defaults, enough for systemd and the
    /// agent, not for a real containerd and kubelet. Default `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privileged: Option<bool>,
}

impl DockerProviderSpec {
    /// Whether machines run privileged: profile `kind` unless turned off.
    pub fn privileged(&self) -> bool {
        self.profile == DockerMachineProfile::Kind && self.privileged != Some(false)
    }
}

/// How the `docker` provider creates a machine's container, which depends on
/// what the node image is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DockerMachineProfile {
    /// A plain container whose entrypoint is the agent (the test image
    /// `drover-node:test`, with the stand-in kubeadm and no systemd).
    #[default]
    Minimal,
    /// A container made the way kind makes its nodes, for a real node image
    /// with systemd as PID 1, containerd and the kubelet
    /// (`images/docker/Dockerfile.node`): privileged, tmpfs on `/run` and
    /// `/tmp`, a volume for `/var`, `/lib/modules` read-only, its own cgroup
    /// namespace, stopped with SIGRTMIN+3.
    Kind,
}

/// The `pool` provider: which self-registered machines the cluster may claim.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolProviderSpec {
    /// Only machines that registered into this pool are claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub selector: LabelSelector,
}

/// The observed state of a cluster, written by the coordinator.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterStatus {
    #[serde(default)]
    pub phase: ClusterPhase,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub observed_generation: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<String>,
    /// The coordinator's port that proxies to the control plane, when the
    /// spec asks for `{managed: coordinator}`. Allocated once, before
    /// `kubeadm init`, and kept for the cluster's life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_port: Option<u16>,
    /// The provider's load balancer in front of the control planes (docker
    /// clusters), made before the first machine; `controlPlaneEndpoint` is
    /// its address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerStatus>,
    /// The cluster's etcd members as a control-plane agent last reported
    /// them (`drover describe cluster` shows them). Every quorum decision
    /// uses this list, not the machine count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub etcd_members: Vec<EtcdMember>,
    /// Which machine reported `etcdMembers`, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_reported_by: Option<String>,
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub etcd_reported_at: Option<time::OffsetDateTime>,
    /// The cluster's Nodes as a control-plane agent last reported them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<ClusterNode>,
    /// The Node deletion the coordinator asked a control-plane machine to
    /// make (a Node whose machine left), until it is gone from the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_removal: Option<NodeRemoval>,
    /// The member removal the coordinator asked a control-plane machine to
    /// make, until the member is gone from the reported list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_removal: Option<EtcdRemoval>,
    /// The drain under way of a machine leaving on purpose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<NodeDrain>,
    /// `ClusterConfiguration.kubernetesVersion` in the cluster's
    /// `kube-system/kubeadm-config` as a control plane last reported it:
    /// the version a control plane that joins deploys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeadm_config_version: Option<String>,
    /// Whether the cluster's endpoint answered `/readyz`, as a control
    /// plane last reported it. A rollout takes no step while it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_ready: Option<bool>,
    /// The certificate renewal asked of a pool control plane whose first
    /// kubeadm certificate expires within the renewal window (one machine
    /// at a time), until it reports new ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_renewal: Option<CertificateRenewal>,
    /// The change of that version asked of a control-plane machine, before
    /// the first control plane of a new version joins; until it is reported
    /// done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_update: Option<VersionUpdate>,
    /// The upgrade of kube-proxy and CoreDNS a rollout asked of a
    /// control plane once its last new control plane was in; kept once
    /// done (the version they were last upgraded to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub essential_addons: Option<EssentialAddonsUpgrade>,
    /// The pool machine being upgraded in place (pool clusters, one
    /// machine at a time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_upgrade: Option<MachineUpgrade>,
    /// Each addon of the spec, in its order: applied, pending or failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addons: Vec<AddonStatus>,
    /// The addon apply asked of a running control plane, until it reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addon_apply: Option<AddonApply>,
    /// The rollout under way: machines made for another version or image
    /// being replaced; absent when every machine is up to date.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// The machine that ran `kubeadm init`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_machine: Option<String>,
    /// Whether `kubeadm init` has succeeded once for this cluster.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub initialized: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A provider load balancer that is a cluster's control-plane endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancerStatus {
    /// The endpoint, `host:port`.
    pub address: String,
    /// What the provider calls it (a container name, an ARN).
    pub id: String,
    /// The API servers it was last told to forward to, `ip:port`, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<String>,
}

/// Counts for one pool of a cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolStatus {
    pub name: String,
    pub desired: u32,
    pub assigned: u32,
    pub running: u32,
}

/// A cluster's lifecycle phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum ClusterPhase {
    /// Waiting for machines to claim.
    #[default]
    Pending,
    /// Machines are bootstrapping.
    Provisioning,
    /// Every desired machine is Running.
    Running,
    /// Some machines are unhealthy and not (yet) replaced; the `Ready`
    /// condition names them and why, `RemediationAllowed` why they stay.
    Degraded,
    /// Deletion requested; machines are being released.
    Deleting,
}

impl fmt::Display for ClusterPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl ClusterSpec {
    /// The addons the coordinator applies, in order: the image's network
    /// first when `network.cni` is `image`, then `spec.addons`.
    pub fn effective_addons(&self) -> Vec<EffectiveAddon<'_>> {
        let image = (self.network.cni == CniMode::Image).then_some(EffectiveAddon {
            name: IMAGE_CNI_ADDON,
            mode: AddonMode::ApplyOnce,
            source: AddonSource::Image,
        });
        image
            .into_iter()
            .chain(self.addons.iter().map(|a| EffectiveAddon {
                name: &a.name,
                mode: a.mode,
                source: AddonSource::Spec(&a.manifests),
            }))
            .collect()
    }

    /// Every `contentFrom` of the spec's files, each with its field path
    /// (`spec.workerPools[0].files[1].contentFrom`), in document order.
    pub fn secret_refs(&self) -> Vec<(String, &crate::api::SecretKeyRef)> {
        let lists = std::iter::once(("spec".to_owned(), &self.files))
            .chain(std::iter::once((
                "spec.controlPlane".to_owned(),
                &self.control_plane.files,
            )))
            .chain(
                self.worker_pools
                    .iter()
                    .enumerate()
                    .map(|(i, p)| (format!("spec.workerPools[{i}]"), &p.files)),
            );
        let mut refs = Vec::new();
        for (prefix, files) in lists {
            for (i, file) in files.iter().enumerate() {
                if let Some(r) = &file.content_from {
                    refs.push((format!("{prefix}.files[{i}].contentFrom"), r));
                }
            }
        }
        refs
    }

    /// Resolves what a machine of `pool` (a worker pool's name, or the control
    /// plane's) gets. A pool's file at the same path as one of `spec.files`
    /// replaces it; a `controlPlaneOnly` file never reaches a worker. A
    /// file's `contentFrom` is read through `secrets`, for the files this
    /// machine gets only.
    pub fn machine_customisation(
        &self,
        pool: &str,
        control_plane: bool,
        secrets: SecretLookup<'_>,
    ) -> Result<MachineCustomisation, CustomiseError> {
        let (chosen, pre, post) = self.machine_scope(pool, control_plane);
        let files = chosen
            .into_iter()
            .map(|f| resolve_file(f, secrets))
            .collect::<Result<Vec<MachineFileContent>, _>>()?;
        Ok(MachineCustomisation {
            files,
            pre_kubeadm_commands: pre.into_iter().cloned().collect(),
            post_kubeadm_commands: post.into_iter().cloned().collect(),
        })
    }

    /// How many bytes the files and commands of a machine of `pool` take
    /// in its signed config bundle as it travels (see
    /// [`crate::objects::customise::bundle_text_bytes`]), without reading
    /// a file's content: `content_from_bytes` gives that of a
    /// `contentFrom`'s value (0 for one that cannot be read). A Secret's
    /// value counts once for every file that reads it.
    pub fn machine_customisation_bytes(
        &self,
        pool: &str,
        control_plane: bool,
        content_from_bytes: &dyn Fn(&crate::api::SecretKeyRef) -> usize,
    ) -> usize {
        use crate::objects::customise::{bundle_text_bytes, BUNDLE_FILE_OVERHEAD, DEFAULT_OWNER};
        let (files, pre, post) = self.machine_scope(pool, control_plane);
        let files: usize = files
            .into_iter()
            .map(|f| {
                BUNDLE_FILE_OVERHEAD
                    + bundle_text_bytes(&f.path)
                    + bundle_text_bytes(f.owner.as_deref().unwrap_or(DEFAULT_OWNER))
                    + match (&f.content, &f.content_from) {
                        (Some(text), _) => bundle_text_bytes(text),
                        (None, Some(r)) => content_from_bytes(r),
                        (None, None) => 0,
                    }
            })
            .sum();
        let commands: usize = pre
            .into_iter()
            .chain(post)
            .map(|c| bundle_text_bytes(c) + 1)
            .sum();
        files + commands
    }

    /// The files a machine of `pool` gets (the last at a path wins; a
    /// `controlPlaneOnly` one only on a control plane) and its pre- and
    /// post-kubeadm commands, the cluster's before its pool's.
    fn machine_scope(
        &self,
        pool: &str,
        control_plane: bool,
    ) -> (Vec<&MachineFile>, Vec<&String>, Vec<&String>) {
        let spec = self;
        let (pool_files, pool_pre, pool_post): (&[MachineFile], &[String], &[String]) =
            if control_plane {
                let cp = &spec.control_plane;
                (
                    &cp.files,
                    &cp.pre_kubeadm_commands,
                    &cp.post_kubeadm_commands,
                )
            } else {
                match spec.worker_pools.iter().find(|p| p.name == pool) {
                    Some(p) => (&p.files, &p.pre_kubeadm_commands, &p.post_kubeadm_commands),
                    None => (&[], &[], &[]),
                }
            };
        // The last file at a path wins; only the winners are resolved, so a
        // replaced file's Secret is never read.
        let mut chosen: Vec<&MachineFile> = Vec::new();
        for file in spec
            .files
            .iter()
            .filter(|f| control_plane || !f.control_plane_only)
            .chain(pool_files)
        {
            chosen.retain(|f| f.path != file.path);
            chosen.push(file);
        }
        (
            chosen,
            spec.pre_kubeadm_commands.iter().chain(pool_pre).collect(),
            spec.post_kubeadm_commands.iter().chain(pool_post).collect(),
        )
    }
}

impl Cluster {
    /// Checks everything serde cannot: names, versions, counts, networks.
    /// Returns every problem at once so a user fixes a document in one pass.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        let mut errs = Vec::new();
        let mut err = |field: &str, message: String| {
            errs.push(FieldError {
                field: field.to_owned(),
                message,
            })
        };
        if self.api_version != crate::API_VERSION {
            err(
                "apiVersion",
                format!(
                    "must be {:?}, got {:?}",
                    crate::API_VERSION,
                    self.api_version
                ),
            );
        }
        if self.kind != "Cluster" {
            err("kind", format!("must be \"Cluster\", got {:?}", self.kind));
        }
        if let Err(e) = check_dns_label("cluster name", &self.metadata.name) {
            err("metadata.name", e.to_string());
        } else if self.metadata.name.len() + "cp".len() > crate::names::MAX_NAME_PREFIX {
            err(
                "metadata.name",
                format!(
                    "must be at most {} characters, so machine names (<cluster>-cp-xxxxx) stay DNS-1123 labels",
                    crate::names::MAX_NAME_PREFIX - 2
                ),
            );
        }
        for e in check_labels(&self.metadata.labels) {
            err("metadata.labels", e.to_string());
        }
        for e in check_labels(&self.spec.control_plane.selector.match_labels) {
            err("spec.controlPlane.selector.matchLabels", e.to_string());
        }
        if let Err(why) = check_kubernetes_version(&self.spec.kubernetes_version) {
            err("spec.kubernetesVersion", why.to_string());
        }
        let cp = self.spec.control_plane.replicas;
        if cp == 0 || cp.is_multiple_of(2) || cp > 7 {
            err(
                "spec.controlPlane.replicas",
                format!("must be 1, 3, 5 or 7 (etcd needs an odd number of members), got {cp}"),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, pool) in self.spec.worker_pools.iter().enumerate() {
            if let Err(e) = check_dns_label("worker pool name", &pool.name) {
                err(&format!("spec.workerPools[{i}].name"), e.to_string());
            }
            if self.metadata.name.len() + pool.name.len() > crate::names::MAX_NAME_PREFIX {
                err(
                    &format!("spec.workerPools[{i}].name"),
                    format!(
                        "the cluster name and this pool name together must be at most {} characters, so machine names (<cluster>-<pool>-xxxxx) stay DNS-1123 labels",
                        crate::names::MAX_NAME_PREFIX
                    ),
                );
            }
            if pool.name == CONTROL_PLANE_POOL {
                err(
                    &format!("spec.workerPools[{i}].name"),
                    format!("{CONTROL_PLANE_POOL:?} is reserved for the control plane"),
                );
            }
            if !seen.insert(pool.name.as_str()) {
                err(
                    &format!("spec.workerPools[{i}].name"),
                    format!("duplicate worker pool name {:?}", pool.name),
                );
            }
            for e in check_labels(&pool.selector.match_labels) {
                err(
                    &format!("spec.workerPools[{i}].selector.matchLabels"),
                    e.to_string(),
                );
            }
            validate_customisation(
                &format!("spec.workerPools[{i}]"),
                &pool.files,
                &pool.pre_kubeadm_commands,
                &pool.post_kubeadm_commands,
                &mut |f, m| err(f, m),
            );
            for (j, file) in pool.files.iter().enumerate() {
                if file.control_plane_only {
                    err(
                        &format!("spec.workerPools[{i}].files[{j}].controlPlaneOnly"),
                        "keeps a file of spec.files off workers; in a worker pool's files it would keep the file off every machine it is for. Move the file to spec.files or spec.controlPlane.files".into(),
                    );
                }
            }
            if pool.replicas > 1000 {
                err(
                    &format!("spec.workerPools[{i}].replicas"),
                    format!("must be at most 1000, got {}", pool.replicas),
                );
            }
        }
        validate_customisation(
            "spec",
            &self.spec.files,
            &self.spec.pre_kubeadm_commands,
            &self.spec.post_kubeadm_commands,
            &mut |f, m| err(f, m),
        );
        validate_customisation(
            "spec.controlPlane",
            &self.spec.control_plane.files,
            &self.spec.control_plane.pre_kubeadm_commands,
            &self.spec.control_plane.post_kubeadm_commands,
            &mut |f, m| err(f, m),
        );
        validate_addons(
            &self.spec.addons,
            self.spec.network.cni == CniMode::Image,
            &mut |f, m| err(f, m),
        );
        let pod = parse_cidr(&self.spec.network.pod_subnet);
        if let Err(why) = &pod {
            err("spec.network.podSubnet", why.to_string());
        }
        let svc = parse_cidr(&self.spec.network.service_subnet);
        if let Err(why) = &svc {
            err("spec.network.serviceSubnet", why.to_string());
        }
        if let (Ok(a), Ok(b)) = (&pod, &svc) {
            if cidrs_overlap(*a, *b) {
                err(
                    "spec.network.serviceSubnet",
                    "must not overlap spec.network.podSubnet".into(),
                );
            }
        }
        if let Err(e) = check_dns_subdomain(&self.spec.network.dns_domain) {
            err("spec.network.dnsDomain", e.to_string());
        }
        if let Some(ep) = self.spec.endpoint_address() {
            if let Err(why) = check_host_port(ep) {
                err("spec.controlPlaneEndpoint", why.to_string());
            }
        }
        let pool = matches!(self.spec.provider, ProviderSpec::Pool(_));
        if self.spec.endpoint_managed_by_coordinator() && !pool {
            err(
                "spec.controlPlaneEndpoint",
                format!(
                    "{{managed: coordinator}} is for pool clusters; {} clusters get their endpoint from their provider, or give a host:port",
                    self.spec.provider.name()
                ),
            );
        }
        // (An even count is refused above, with its own message.)
        if pool
            && self.spec.control_plane.replicas > 1
            && self.spec.control_plane.replicas % 2 == 1
            && self.spec.control_plane_endpoint.is_none()
        {
            err(
                "spec.controlPlaneEndpoint",
                format!(
                    "a pool cluster with {} control-plane machines needs an endpoint that outlives any one of them: a load balancer's, DNS name's or VIP's host:port (kube-vip can keep a VIP on the machines), or {{managed: coordinator}} for the coordinator's own proxy",
                    self.spec.control_plane.replicas
                ),
            );
        }
        match &self.spec.provider {
            ProviderSpec::Pool(p) => {
                if let Some(pool) = &p.pool {
                    if let Err(e) = check_dns_label("pool name", pool) {
                        err("spec.provider.pool.pool", e.to_string());
                    }
                }
                for e in check_labels(&p.selector.match_labels) {
                    err("spec.provider.pool.selector.matchLabels", e.to_string());
                }
            }
            ProviderSpec::Docker(d) => {
                if d.image.is_empty()
                    || d.image.len() > 255
                    || d.image.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    err(
                        "spec.provider.docker.image",
                        format!(
                            "must be an image reference such as drover-node:test, got {:?}",
                            d.image
                        ),
                    );
                }
                if d.privileged.is_some() && d.profile != DockerMachineProfile::Kind {
                    err(
                        "spec.provider.docker.privileged",
                        "applies to profile kind only; remove it, or set profile: kind".into(),
                    );
                }
            }
            ProviderSpec::Aws(_) => {}
        }
        if let ProviderSpec::Aws(a) = &self.spec.provider {
            let pools: Vec<&str> = self
                .spec
                .worker_pools
                .iter()
                .map(|p| p.name.as_str())
                .collect();
            a.validate(
                &pools,
                self.spec.endpoint_address().is_some(),
                &mut |f, m| err(f, m),
            );
        }
        if let Some(h) = &self.spec.health {
            for (field, v) in [
                ("spec.health.heartbeatTimeout", &h.heartbeat_timeout),
                ("spec.health.startupTimeout", &h.startup_timeout),
                ("spec.health.unhealthyTimeout", &h.unhealthy_timeout),
            ] {
                if let Some(v) = v {
                    match parse_duration(v) {
                        Ok(d) if d.is_zero() => err(field, "must be positive".into()),
                        Ok(_) => {}
                        Err(e) => err(field, e.to_string()),
                    }
                }
            }
            if let Some(m) = &h.max_unhealthy {
                if let Err(e) = parse_percent(m) {
                    err("spec.health.maxUnhealthy", e.to_string());
                }
            }
        }
        if let Some(t) = self.spec.drain.as_ref().and_then(|d| d.timeout.as_ref()) {
            match parse_duration(t) {
                Ok(d) if d.is_zero() => err("spec.drain.timeout", "must be positive".into()),
                Ok(_) => {}
                Err(e) => err("spec.drain.timeout", e.to_string()),
            }
        }
        if let Some(t) = self
            .spec
            .upgrade
            .as_ref()
            .and_then(|u| u.settle_time.as_ref())
        {
            if let Err(e) = parse_duration(t) {
                err("spec.upgrade.settleTime", e.to_string());
            }
        }
        if let Some(t) = self
            .spec
            .upgrade
            .as_ref()
            .and_then(|u| u.renew_certificates_before.as_ref())
        {
            match parse_duration(t) {
                Ok(d) if RENEW_CERTIFICATES_BEFORE_RANGE.contains(&d) => {}
                Ok(_) => err(
                    "spec.upgrade.renewCertificatesBefore",
                    format!("must be at least 7d and less than 365d (kubeadm's certificates are valid for a year), got {t:?}"),
                ),
                Err(e) => err("spec.upgrade.renewCertificatesBefore", e.to_string()),
            }
        }
        if let Some(r) = &self.spec.control_plane.rollout {
            if r.max_surge.is_some_and(|s| s > 1) {
                err(
                    "spec.controlPlane.rollout.maxSurge",
                    "must be 0 or 1: control planes are replaced one at a time".into(),
                );
            }
            if r.max_surge == Some(0) && self.spec.control_plane.replicas < 3 {
                err(
                    "spec.controlPlane.rollout.maxSurge",
                    format!(
                        "0 (replace in place) needs at least 3 control planes so etcd keeps quorum while one is replaced; this cluster has {}; use 1",
                        self.spec.control_plane.replicas
                    ),
                );
            }
            if r.max_unavailable.is_some() {
                err(
                    "spec.controlPlane.rollout.maxUnavailable",
                    "is for worker pools; the control plane rolls by maxSurge (0 or 1)".into(),
                );
            }
        }
        for (i, p) in self.spec.worker_pools.iter().enumerate() {
            if let Some(r) = &p.rollout {
                if RolloutPolicy::surge(Some(r)) == 0 && RolloutPolicy::unavailable(Some(r)) == 0 {
                    err(
                        &format!("spec.workerPools[{i}].rollout"),
                        "maxSurge and maxUnavailable cannot both be 0: the pool could never replace a machine".into(),
                    );
                }
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs)
        }
    }

    /// How `pool` rolls, as its spec says.
    pub fn rollout_policy(&self, pool: &str) -> Option<&RolloutPolicy> {
        if pool == CONTROL_PLANE_POOL {
            self.spec.control_plane.rollout.as_ref()
        } else {
            self.spec
                .worker_pools
                .iter()
                .find(|p| p.name == pool)
                .and_then(|p| p.rollout.as_ref())
        }
    }

    /// The desired replica count of each pool, control plane first.
    pub fn desired_pools(&self) -> Vec<(String, u32)> {
        let mut v = vec![(
            CONTROL_PLANE_POOL.to_owned(),
            self.spec.control_plane.replicas,
        )];
        v.extend(
            self.spec
                .worker_pools
                .iter()
                .map(|p| (p.name.clone(), p.replicas)),
        );
        v
    }
}

/// The oldest Kubernetes minor release (of 1.x) Drover deploys: kubeadm
/// 1.31, whose config API v1beta4 Drover renders, deploys control planes of
/// its own release and the one before.
pub const OLDEST_KUBERNETES_MINOR: u32 = 30;

/// A Kubernetes release, `vMAJOR.MINOR.PATCH` with an optional pre-release
/// or build suffix (kept in the text, not ordered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubernetesVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl KubernetesVersion {
    /// Parses the form, all of it: `v`, then a SemVer 2.0 version
    /// (`MAJOR.MINOR.PATCH`, an optional `-` pre-release and `+` build of
    /// dot-separated identifiers), as Kubernetes' own
    /// `version.ParseSemantic` does; [`check_kubernetes_version`] also
    /// checks the range. The text goes into kubeadm's config and the
    /// image's upgrade hooks, so nothing outside the grammar passes.
    pub fn parse(v: &str) -> Result<Self, FormatError> {
        let malformed = |why: String| FormatError::KubernetesVersion {
            got: v.to_string(),
            why,
        };
        let rest = v
            .strip_prefix('v')
            .ok_or_else(|| malformed("it does not start with 'v'".into()))?;
        let (rest, build) = match rest.split_once('+') {
            Some((r, b)) => (r, Some(b)),
            None => (rest, None),
        };
        let (core, pre) = match rest.split_once('-') {
            Some((c, p)) => (c, Some(p)),
            None => (rest, None),
        };
        let parts: Vec<u32> = core
            .split('.')
            .map(|p| {
                if !is_numeric_identifier(p) {
                    return Err(malformed(format!(
                        "{p:?} in MAJOR.MINOR.PATCH is not a number without leading zeros"
                    )));
                }
                p.parse::<u32>()
                    .map_err(|_| malformed(format!("{p:?} is too large")))
            })
            .collect::<Result<_, _>>()?;
        let [major, minor, patch] = parts[..] else {
            return Err(malformed(format!(
                "{core:?} has {} numbers, not three (MAJOR.MINOR.PATCH)",
                parts.len()
            )));
        };
        for (what, part) in [("pre-release", pre), ("build", build)] {
            let Some(part) = part else { continue };
            for id in part.split('.') {
                if id.is_empty() {
                    return Err(malformed(format!("the {what} has an empty identifier")));
                }
                if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                    return Err(malformed(format!(
                        "the {what} identifier {id:?} holds a character other than letters, digits and '-'"
                    )));
                }
                if what == "pre-release"
                    && id.bytes().all(|b| b.is_ascii_digit())
                    && !is_numeric_identifier(id)
                {
                    return Err(malformed(format!(
                        "the pre-release identifier {id:?} is a number with a leading zero"
                    )));
                }
            }
        }
        Ok(Self {
            major,
            minor,
            patch,
        })
    }
}

/// SemVer's numeric identifier: `0`, or digits not starting with `0`.
fn is_numeric_identifier(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
}

impl std::fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Checks `vMAJOR.MINOR.PATCH` with an optional pre-release suffix, of a
/// release Drover deploys.
pub fn check_kubernetes_version(v: &str) -> Result<(), FormatError> {
    let k = KubernetesVersion::parse(v)?;
    if k.major != 1 || k.minor < OLDEST_KUBERNETES_MINOR {
        return Err(FormatError::KubernetesTooOld {
            oldest_minor: OLDEST_KUBERNETES_MINOR,
            got: v.to_string(),
        });
    }
    Ok(())
}

/// Why a cluster may not move from version `from` to `to`, naming the
/// versions it may move to: Kubernetes supports no downgrade, and an
/// upgrade goes one minor release at a time (any patch of the current or
/// the next minor). Versions of the wrong form pass here:
/// [`Cluster::validate`] refuses them.
pub fn check_version_change(from: &str, to: &str) -> Result<(), VersionChangeError> {
    let (Ok(f), Ok(t)) = (KubernetesVersion::parse(from), KubernetesVersion::parse(to)) else {
        return Ok(());
    };
    let allowed = format!(
        "{from} itself, a later v{}.{} patch, or a v{}.{} release",
        f.major,
        f.minor,
        f.major,
        f.minor + 1
    );
    let (from, to) = (from.to_owned(), to.to_owned());
    if t < f {
        return Err(VersionChangeError::Downgrade { from, to, allowed });
    }
    if t.major != f.major || t.minor > f.minor + 1 {
        return Err(VersionChangeError::SkippedMinor { from, to, allowed });
    }
    Ok(())
}

/// Why a cluster may not move between two Kubernetes versions; each names
/// the versions it may move to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionChangeError {
    #[error(
        "cannot go from {from} down to {to}: Kubernetes supports no downgrade; allowed: {allowed}"
    )]
    Downgrade {
        from: String,
        to: String,
        allowed: String,
    },
    #[error("cannot go from {from} to {to}: Kubernetes upgrades one minor release at a time; allowed: {allowed}")]
    SkippedMinor {
        from: String,
        to: String,
        allowed: String,
    },
}

/// Parses `a.b.c.d/n` or an IPv6 CIDR.
pub fn parse_cidr(s: &str) -> Result<(IpAddr, u8), FormatError> {
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| FormatError::NotACidr { got: s.to_string() })?;
    let ip: IpAddr = ip.parse().map_err(|_| FormatError::NotAnIp {
        got: ip.to_string(),
    })?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len: u8 =
        len.parse()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| FormatError::PrefixLength {
                max,
                got: len.to_string(),
            })?;
    Ok((ip, len))
}

fn cidrs_overlap(a: (IpAddr, u8), b: (IpAddr, u8)) -> bool {
    match (a.0, b.0) {
        (IpAddr::V4(x), IpAddr::V4(y)) => {
            let len = a.1.min(b.1) as u32;
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            (u32::from(x) & mask) == (u32::from(y) & mask)
        }
        (IpAddr::V6(x), IpAddr::V6(y)) => {
            let len = a.1.min(b.1) as u32;
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            (u128::from(x) & mask) == (u128::from(y) & mask)
        }
        _ => false,
    }
}

fn check_dns_subdomain(s: &str) -> Result<(), FormatError> {
    Ok(crate::names::check_dns_subdomain("DNS domain", s)?)
}

/// Checks `host:port`.
pub fn check_host_port(s: &str) -> Result<(), FormatError> {
    let malformed = || FormatError::NotHostPort { got: s.to_string() };
    let (host, port) = s.rsplit_once(':').ok_or_else(malformed)?;
    if host.is_empty() {
        return Err(malformed());
    }
    port.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .map(|_| ())
        .ok_or_else(|| FormatError::Port {
            got: port.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> &'static str {
        r#"apiVersion: drover.dev/v1alpha1
kind: Cluster
metadata:
  name: demo
spec:
  kubernetesVersion: v1.31.2
  controlPlane:
    replicas: 1
  workerPools:
    - name: default
      replicas: 2
  provider:
    pool:
      selector:
        matchLabels:
          env: dev
"#
    }

    #[test]
    fn parses_and_validates() {
        let c: Cluster = serde_saphyr::from_str(sample()).unwrap();
        c.validate().unwrap();
        assert_eq!(c.spec.network.pod_subnet, "10.244.0.0/16");
        assert_eq!(c.desired_pools().len(), 2);
    }

    /// kubectl drain's `--force` and `--delete-emptydir-data` are policy
    /// fields; anything else under `spec.drain` is refused by name.
    #[test]
    fn the_drain_policy_says_which_pods_a_drain_may_delete() {
        let c: Cluster = serde_saphyr::from_str(sample()).unwrap();
        let policy = c.spec.drain.unwrap_or_default();
        assert!(!policy.delete_pods_without_controller && !policy.delete_empty_dir_data);
        let with = format!(
            "{}  drain:\n    timeout: 5m\n    deletePodsWithoutController: true\n    deleteEmptyDirData: true\n",
            sample()
        );
        let c: Cluster = serde_saphyr::from_str(&with).unwrap();
        c.validate().unwrap();
        let policy = c.spec.drain.clone().unwrap();
        assert!(policy.delete_pods_without_controller && policy.delete_empty_dir_data);
        assert_eq!(
            serde_json::to_value(&policy).unwrap(),
            serde_json::json!({"timeout": "5m", "deletePodsWithoutController": true, "deleteEmptyDirData": true})
        );
        let old_name = format!("{}  drain:\n    deleteLocalData: true\n", sample());
        let e = serde_saphyr::from_str::<Cluster>(&old_name)
            .unwrap_err()
            .to_string();
        assert!(e.contains("deleteLocalData"), "{e}");
    }

    #[test]
    fn control_plane_endpoints_are_an_address_or_managed_by_the_coordinator() {
        let three = sample().replace("replicas: 1", "replicas: 3");
        let c: Cluster = serde_saphyr::from_str(&three).unwrap();
        let errs = c.validate().unwrap_err();
        assert!(
            errs.iter().any(|e| e.field == "spec.controlPlaneEndpoint"
                && e.message.contains("managed: coordinator")),
            "{errs:?}"
        );
        let managed = format!("{three}  controlPlaneEndpoint:\n    managed: coordinator\n");
        let c: Cluster = serde_saphyr::from_str(&managed).unwrap();
        c.validate().unwrap();
        assert!(c.spec.endpoint_managed_by_coordinator());
        assert_eq!(
            serde_json::to_value(&c.spec.control_plane_endpoint).unwrap(),
            serde_json::json!({"managed": "coordinator"})
        );
        let address = format!("{three}  controlPlaneEndpoint: lb.example.com:6443\n");
        let c: Cluster = serde_saphyr::from_str(&address).unwrap();
        c.validate().unwrap();
        assert_eq!(c.spec.endpoint_address(), Some("lb.example.com:6443"));
        let e = serde_saphyr::from_str::<Cluster>(&format!(
            "{three}  controlPlaneEndpoint:\n    managed: nobody\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"nobody\" is not known"), "{e}");
        let mut docker: Cluster = serde_saphyr::from_str(&managed).unwrap();
        docker.spec.provider = ProviderSpec::Docker(super::super::DockerProviderSpec {
            image: "drover-node:test".into(),
            profile: super::super::DockerMachineProfile::Minimal,
            privileged: None,
        });
        let errs = docker.validate().unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e.message.contains("is for pool clusters")),
            "{errs:?}"
        );
    }

    #[test]
    fn docker_profiles_parse_and_privileged_belongs_to_kind() {
        // The sample's provider is its last field.
        let head = &sample()[..sample().find("  provider:").expect("a provider")];
        let with = |provider: &str| format!("{head}{provider}");
        let kind: Cluster = serde_saphyr::from_str(&with(
            "  provider:\n    docker:\n      image: drover-node:systemd\n      profile: kind\n",
        ))
        .unwrap();
        kind.validate().unwrap();
        let ProviderSpec::Docker(d) = &kind.spec.provider else {
            panic!("{:?}", kind.spec.provider)
        };
        assert_eq!(d.profile, super::super::DockerMachineProfile::Kind);
        assert!(d.privileged(), "kind machines are privileged by default");
        let unprivileged: Cluster = serde_saphyr::from_str(&with(
            "  provider:\n    docker:\n      image: x\n      profile: kind\n      privileged: false\n",
        ))
        .unwrap();
        unprivileged.validate().unwrap();
        let ProviderSpec::Docker(d) = &unprivileged.spec.provider else {
            panic!()
        };
        assert!(!d.privileged());
        let minimal: Cluster = serde_saphyr::from_str(&with(
            "  provider:\n    docker:\n      image: x\n      privileged: true\n",
        ))
        .unwrap();
        let errs = minimal.validate().unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e.field == "spec.provider.docker.privileged"
                    && e.message.contains("profile kind only")),
            "{errs:?}"
        );
        let e = serde_saphyr::from_str::<Cluster>(&with(
            "  provider:\n    docker:\n      image: x\n      profile: vm\n",
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("vm"), "{e}");
    }

    #[test]
    fn versions_move_up_one_minor_at_a_time_and_never_down() {
        for ok in ["v1.31.2", "v1.31.9", "v1.32.0", "v1.32.7"] {
            check_version_change("v1.31.2", ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let skip = check_version_change("v1.31.2", "v1.33.0")
            .unwrap_err()
            .to_string();
        assert!(
            skip.contains("one minor release at a time")
                && skip.contains("v1.31.2 itself, a later v1.31 patch, or a v1.32 release"),
            "{skip}"
        );
        let down = check_version_change("v1.31.2", "v1.31.1")
            .unwrap_err()
            .to_string();
        assert!(down.contains("no downgrade"), "{down}");
        assert!(check_version_change("v1.32.0", "v1.31.9").is_err());
        assert!(check_version_change("v1.31.2", "v2.0.0").is_err());
        // Forms are validate()'s to refuse.
        assert!(check_version_change("v1.31.2", "1.33").is_ok());

        let old = check_kubernetes_version("v1.29.9").unwrap_err().to_string();
        assert!(old.contains("v1.30.0 or later"), "{old}");
        check_kubernetes_version("v1.30.0").unwrap();
        check_kubernetes_version("v1.31.2-rc.1").unwrap();
        assert!(check_kubernetes_version("v1.31").is_err());
        assert!(check_kubernetes_version("v1.31.2.1").is_err());
        assert_eq!(
            KubernetesVersion::parse("v1.32.0+build")
                .unwrap()
                .to_string(),
            "v1.32.0"
        );
    }

    #[test]
    fn kubernetes_version_format_is_semver_throughout() {
        for ok in [
            "v1.31.2",
            "v1.31.2-rc.1",
            "v1.31.2-alpha.0.1-x",
            "v1.31.2-0",
            "v1.31.2+build.5",
            "v1.31.2-rc.1+build.05",
            "v1.31.2+k3s1",
            "v1.31.2-eks-abc123",
        ] {
            check_kubernetes_version(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, why) in [
            (
                "v1.31.2-x;$(touch /tmp/pwn)",
                "other than letters, digits and '-'",
            ),
            ("v1.31.2+b;id", "other than letters, digits and '-'"),
            ("v1.31.2-rc..1", "empty identifier"),
            ("v1.31.2-", "empty identifier"),
            ("v1.31.2+", "empty identifier"),
            ("v1.31.2-rc.01", "leading zero"),
            ("v1.031.2", "without leading zeros"),
            ("v1.31.+2", "not a number"),
            ("v1.31.2 ", "without leading zeros"),
            ("1.31.2", "does not start with 'v'"),
            ("v1.31", "not three"),
            ("v1.31.2.1", "not three"),
            ("v1.31.2-rc.1\n", "other than letters"),
        ] {
            let e = check_kubernetes_version(bad).expect_err(bad).to_string();
            assert!(
                e.contains(why) && e.contains("SemVer") && e.contains(&format!("{bad:?}")),
                "{bad}: {e}"
            );
        }
        // Validation names the field.
        let doc = sample().replace("v1.31.2", "v1.31.2-x;$(touch /tmp/pwn)");
        let c: Cluster = serde_saphyr::from_str(&doc).unwrap();
        let errs = c.validate().unwrap_err();
        assert!(
            errs.iter().any(|e| e.field == "spec.kubernetesVersion"
                && e.message
                    .contains("pre-release identifier \"x;$(touch /tmp/pwn)\"")),
            "{errs:?}"
        );
    }

    #[test]
    fn unknown_field_is_named() {
        let doc = sample().replace("replicas: 2", "replicas: 2\n      replica: 3");
        let e = serde_saphyr::from_str::<Cluster>(&doc)
            .unwrap_err()
            .to_string();
        assert!(e.contains("replica"), "{e}");
    }

    #[test]
    fn selectors_and_labels_follow_kubernetes_rules() {
        let mut c: Cluster = serde_saphyr::from_str(sample()).unwrap();
        c.metadata.labels.insert("ok.dev/x".into(), "v".into());
        c.validate().unwrap();
        // Machine names (<cluster>-<pool>-xxxxx) must stay DNS-1123 labels.
        let mut long = c.clone();
        long.metadata.name = "c".repeat(40);
        long.spec.worker_pools[0].name = "p".repeat(20);
        let errs = long.validate().unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "spec.workerPools[0].name");
        long.metadata.name = "c".repeat(60);
        long.spec.worker_pools[0].name = "p".into();
        let errs = long.validate().unwrap_err();
        assert!(errs.iter().any(|e| e.field == "metadata.name"), "{errs:?}");
        let ProviderSpec::Pool(p) = &mut c.spec.provider else {
            panic!("a pool cluster")
        };
        p.selector
            .match_labels
            .insert("env\nrole".into(), "x".into());
        c.spec.worker_pools[0]
            .selector
            .match_labels
            .insert("zone".into(), "a b".into());
        c.spec
            .control_plane
            .selector
            .match_labels
            .insert("..//k".into(), String::new());
        let errs = c.validate().unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "spec.controlPlane.selector.matchLabels",
                "spec.workerPools[0].selector.matchLabels",
                "spec.provider.pool.selector.matchLabels"
            ],
            "{errs:?}"
        );
    }

    #[test]
    fn semantic_errors_name_fields() {
        let mut c: Cluster = serde_saphyr::from_str(sample()).unwrap();
        c.spec.control_plane.replicas = 2;
        c.spec.kubernetes_version = "1.31".into();
        c.spec.network.service_subnet = "10.244.1.0/24".into();
        c.metadata.name = "../x".into();
        let errs = c.validate().unwrap_err();
        let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.name",
                "spec.kubernetesVersion",
                "spec.controlPlane.replicas",
                "spec.network.serviceSubnet"
            ]
        );
    }
    #[test]
    fn a_machine_gets_the_cluster_files_then_its_pools_and_never_control_plane_only_on_a_worker() {
        let spec: ClusterSpec = serde_saphyr::from_str(
            "kubernetesVersion: v1.31.2
controlPlane:
  replicas: 1
  files: [{path: /etc/cp-only, content: cp}]
  preKubeadmCommands: [cp-pre]
provider: {pool: {}}
files:
  - {path: /etc/all, content: cluster}
  - {path: /etc/secret, content: k, controlPlaneOnly: true}
preKubeadmCommands: [all-pre]
postKubeadmCommands: [all-post]
workerPools:
  - name: gpu
    replicas: 1
    files: [{path: /etc/all, content: gpu, permissions: \"0600\"}, {path: /etc/gpu, content: g}]
    postKubeadmCommands: [gpu-post]
  - {name: plain, replicas: 1}
",
        )
        .unwrap();
        let paths = |c: &super::MachineCustomisation| {
            c.files
                .iter()
                .map(|f| format!("{}={}", f.path, f.content))
                .collect::<Vec<_>>()
        };
        let no_secrets: SecretLookup = &|r| panic!("no file reads a secret: {r}");
        let cp = spec
            .machine_customisation("control-plane", true, no_secrets)
            .unwrap();
        assert_eq!(
            paths(&cp),
            ["/etc/all=cluster", "/etc/secret=k", "/etc/cp-only=cp"]
        );
        assert_eq!(cp.pre_kubeadm_commands, ["all-pre", "cp-pre"]);
        assert_eq!(cp.post_kubeadm_commands, ["all-post"]);
        let gpu = spec
            .machine_customisation("gpu", false, no_secrets)
            .unwrap();
        assert_eq!(paths(&gpu), ["/etc/all=gpu", "/etc/gpu=g"]);
        assert_eq!(gpu.files[0].mode, 0o600);
        assert_eq!(gpu.post_kubeadm_commands, ["all-post", "gpu-post"]);
        let plain = spec
            .machine_customisation("plain", false, no_secrets)
            .unwrap();
        assert_eq!(paths(&plain), ["/etc/all=cluster"]);
        assert_eq!(plain.pre_kubeadm_commands, ["all-pre"]);
    }
}
