//! What a cluster should be: the `Cluster` object and its `ClusterSpec`
//! (versions, pools, network, provider, the health, drain and upgrade
//! policies, and what goes onto its machines and into it), with what the
//! coordinator derives from a spec: the addons it applies in order, and a
//! machine's files and commands (`ClusterSpec::machine_customisation`).
//!
//! Invariant: a spec says *what*, never *how*: versions, counts and
//! templates; a policy field left out means the default its accessor
//! (`DrainPolicy::timeout`, `UpgradePolicy::settle_time`, ...) gives, and
//! serialises to nothing, so a stored document round-trips unchanged.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use super::status::ClusterStatus;
use crate::names::CONTROL_PLANE_POOL;
use crate::objects::addons::{Addon, AddonMode, AddonSource, EffectiveAddon, IMAGE_CNI_ADDON};
use crate::objects::aws::AwsProviderSpec;
use crate::objects::customise::{
    resolve_file, CustomiseError, MachineCustomisation, MachineFile, MachineFileContent,
    SecretLookup,
};
use crate::objects::meta::{LabelSelector, ObjectMeta};
use crate::serde_skip::is_default;
use crate::units::parse_duration;

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
#[skip_serializing_none]
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
    pub control_plane_endpoint: Option<ControlPlaneEndpoint>,
    /// When machines count as unhealthy and how many may be replaced.
    pub health: Option<HealthPolicy>,
    /// How a machine leaving on purpose is drained first.
    pub drain: Option<DrainPolicy>,
    /// How machines made for an older version (or image) are rolled.
    pub upgrade: Option<UpgradePolicy>,
    /// Etcd snapshots on a schedule, and how many are kept.
    pub backup: Option<crate::objects::snapshot::BackupSpec>,
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
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradePolicy {
    /// How long each new machine must be Running, healthy and its Node
    /// Ready before the rollout takes its next step (default `2m`).
    pub settle_time: Option<String>,
    /// A control plane whose kubeadm certificates expire within this is
    /// replaced (docker, aws) by one with new certificates, at the same
    /// version (default `30d`; from `7d` to under a year, the validity
    /// kubeadm gives them).
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
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutPolicy {
    /// How many machines may be created above the pool's replicas (the
    /// control plane: 0 or 1; default 1).
    pub max_surge: Option<u32>,
    /// How many of the pool's machines may be missing (worker pools
    /// only; default 0).
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
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrainPolicy {
    /// How long a drain may be refused (by a PodDisruptionBudget, or Pods
    /// that do not go) before the machine's removal halts with a
    /// `DrainFailed` condition; `10m` by default.
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

/// Overrides of the coordinator's health and remediation defaults.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthPolicy {
    /// Silence after which a machine is unhealthy, e.g. `40s`.
    pub heartbeat_timeout: Option<String>,
    /// Longest time from creation to Running, e.g. `10m`.
    pub startup_timeout: Option<String>,
    /// How long a machine may report a failing kubelet or node, e.g. `2m`.
    pub unhealthy_timeout: Option<String>,
    /// Remediation pauses for a pool when more than this share of it is
    /// unhealthy, e.g. `40%`.
    pub max_unhealthy: Option<String>,
}

/// The control-plane pool.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControlPlaneSpec {
    /// 1, 3 or 5 (etcd quorum needs an odd count).
    pub replicas: u32,
    /// Extra labels a pool machine must carry to serve here.
    #[serde(default, skip_serializing_if = "is_default")]
    pub selector: LabelSelector,
    /// How the control plane rolls (`maxSurge` 0 or 1).
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
    /// How an unhealthy control-plane machine is repaired.
    pub remediation: Option<RemediationPolicy>,
}

/// A pool of worker machines.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerPoolSpec {
    pub name: String,
    /// How many machines the pool has. An autoscaled pool's count is the
    /// autoscaler's, within `autoscaling`: a document that leaves it out
    /// keeps the current count (a new pool starts at `minReplicas`), and
    /// one that sets it outside the range is refused.
    #[serde(default)]
    pub replicas: u32,
    /// The range the cluster-autoscaler scales the pool in, through the
    /// coordinator's `externalgrpc` cloud provider.
    pub autoscaling: Option<AutoscalingSpec>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub selector: LabelSelector,
    /// How the pool rolls (`maxSurge`, `maxUnavailable`).
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
    /// How an unhealthy machine of this pool is repaired.
    pub remediation: Option<RemediationPolicy>,
}

/// How an unhealthy machine of a pool is repaired. Every field left out
/// takes its default: the strategy by provider (see
/// [`RemediationStrategy`]), [`DEFAULT_REBOOT_TIMEOUT`], and
/// [`DEFAULT_REMEDIATION_CONDITIONS`].
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemediationPolicy {
    pub strategy: Option<RemediationStrategy>,
    /// How long a machine asked to reboot may take to come back (its agent
    /// reporting a new boot ID) before the next step, e.g. `10m`.
    pub reboot_timeout: Option<String>,
    /// The node problems (machine conditions its agent reports, such as
    /// `ReadOnlyFilesystem` or `DiskPressure`) that make a machine
    /// unhealthy once reported for longer than the unhealthy timeout. A
    /// silent machine, one that does not start, and a failing kubelet,
    /// API server or Node are unhealthy whatever this lists.
    pub conditions: Option<Vec<String>>,
}

impl RemediationPolicy {
    /// What is wrong with it, as (field under the policy, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![];
        if let Some(t) = &self.reboot_timeout {
            match parse_duration(t) {
                Ok(d) if d < std::time::Duration::from_secs(10) => out.push((
                    "rebootTimeout",
                    format!("must be at least 10s (a machine needs that long to reboot and report again), got {t:?}"),
                )),
                Ok(_) => {}
                Err(e) => out.push(("rebootTimeout", e.to_string())),
            }
        }
        let known = crate::objects::report::NODE_PROBLEM_TYPES;
        for c in self.conditions.iter().flatten() {
            if !known.contains(&c.as_str()) {
                out.push((
                    "conditions",
                    format!(
                        "{c:?} is not a node problem the agent reports; use one of {}",
                        known.join(", ")
                    ),
                ));
            }
        }
        out
    }
}

/// What repairs an unhealthy machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum RemediationStrategy {
    /// Take it out and put another in its place (the default where a
    /// provider creates machines: a new VM is cheap, and a fresh one is
    /// the surest repair).
    Replace,
    /// Ask its agent to reboot it (cordoned first), and again after each
    /// `rebootTimeout` while it stays unhealthy; never replace it.
    Reboot,
    /// Reboot it first; replace it when it does not come back within
    /// `rebootTimeout`, when it is still unhealthy after the reboot, or
    /// when the reboot cannot reach it (it is silent). The default for
    /// pool machines: a spare bare-metal server is scarce, and a reboot
    /// fixes most of what goes wrong with one.
    RebootThenReplace,
}

impl fmt::Display for RemediationStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RemediationStrategy::Replace => "Replace",
            RemediationStrategy::Reboot => "Reboot",
            RemediationStrategy::RebootThenReplace => "RebootThenReplace",
        })
    }
}

/// How long a rebooted machine has to come back when the pool does not
/// say: long enough for a server's firmware and POST, which take minutes.
pub const DEFAULT_REBOOT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// The node problems that make a machine unhealthy when the pool does not
/// say: the ones the machine cannot get out of by itself (a file system
/// the kernel made read-only, a task hung in the kernel, a failing disk).
/// The pressure conditions are left to the kubelet, which evicts Pods to
/// relieve them (`MemoryPressure`, `DiskPressure`, `PIDPressure`), and a
/// clock off by some seconds harms certificates and leases but rarely the
/// workload.
pub const DEFAULT_REMEDIATION_CONDITIONS: &[&str] = &[
    crate::objects::report::READ_ONLY_FILESYSTEM,
    crate::objects::report::KERNEL_DEADLOCK,
    crate::objects::report::DEVICE_ERROR,
];

/// A pool's remediation with every default applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveRemediation {
    pub strategy: RemediationStrategy,
    pub reboot_timeout: std::time::Duration,
    pub conditions: Vec<String>,
}

impl ClusterSpec {
    /// The remediation of pool `pool` (`control-plane` or a worker pool's
    /// name), every field left out taking its default.
    pub fn remediation(&self, pool: &str) -> EffectiveRemediation {
        let given = if pool == CONTROL_PLANE_POOL {
            self.control_plane.remediation.as_ref()
        } else {
            self.worker_pools
                .iter()
                .find(|p| p.name == pool)
                .and_then(|p| p.remediation.as_ref())
        };
        let default_strategy = if self.provider.creates_machines() {
            RemediationStrategy::Replace
        } else {
            RemediationStrategy::RebootThenReplace
        };
        EffectiveRemediation {
            strategy: given.and_then(|r| r.strategy).unwrap_or(default_strategy),
            reboot_timeout: given
                .and_then(|r| r.reboot_timeout.as_deref())
                .and_then(|t| parse_duration(t).ok())
                .unwrap_or(DEFAULT_REBOOT_TIMEOUT),
            conditions: given.and_then(|r| r.conditions.clone()).unwrap_or_else(|| {
                DEFAULT_REMEDIATION_CONDITIONS
                    .iter()
                    .map(|c| c.to_string())
                    .collect()
            }),
        }
    }
}

/// The range an autoscaled worker pool is scaled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AutoscalingSpec {
    /// The fewest machines; 0 lets the pool scale from zero.
    pub min_replicas: u32,
    /// The most machines.
    pub max_replicas: u32,
}

impl AutoscalingSpec {
    /// `replicas` brought into the range.
    pub fn clamp(&self, replicas: u32) -> u32 {
        replicas.clamp(self.min_replicas, self.max_replicas.max(self.min_replicas))
    }
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
    /// Create machines as EC2 instances (boxed: its templates make it far
    /// larger than the other two).
    Aws(Box<AwsProviderSpec>),
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
#[skip_serializing_none]
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
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolProviderSpec {
    /// Only machines that registered into this pool are claimed.
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub selector: LabelSelector,
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

#[cfg(test)]
mod tests {
    use super::super::sample;
    use super::*;

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
        docker.spec.provider = ProviderSpec::Docker(DockerProviderSpec {
            image: "drover-node:test".into(),
            profile: DockerMachineProfile::Minimal,
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
        assert_eq!(d.profile, DockerMachineProfile::Kind);
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
    fn unknown_field_is_named() {
        let doc = sample().replace("replicas: 2", "replicas: 2\n      replica: 3");
        let e = serde_saphyr::from_str::<Cluster>(&doc)
            .unwrap_err()
            .to_string();
        assert!(e.contains("replica"), "{e}");
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
