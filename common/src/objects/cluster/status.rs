//! What the coordinator observes of a cluster and keeps in its
//! `ClusterStatus`: the phase, its pools' counts, the etcd members and Nodes
//! a control plane last reported, the endpoint and load balancer, the
//! rollout under way and the operations in flight (their types are in
//! [`crate::objects::operations`]).
//!
//! Invariant: only the coordinator writes a status; a user's document never
//! sets one (a missing status is the default, `Pending`), and every field
//! left empty serialises to nothing.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::objects::addons::{AddonApply, AddonStatus};
use crate::objects::meta::Condition;
use crate::objects::operations::{
    CertificateRenewal, EssentialAddonsUpgrade, EtcdRemoval, MachineUpgrade, NodeDrain,
    NodeRemoval, VersionUpdate,
};
use crate::serde_skip::is_default;

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
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterNode {
    pub name: String,
    /// Its `Ready` condition: `True`, `False` or `Unknown`.
    pub ready: String,
    /// When `Ready` last changed (its `lastTransitionTime`).
    #[serde(default, with = "time::serde::rfc3339::option")]
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
#[skip_serializing_none]
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
    pub halted: Option<RolloutHalt>,
    /// What the rollout waits for before its next step, and why (a new
    /// machine's Node NotReady and what it says, another change under
    /// way, a silent machine); absent while it steps or is done.
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

/// The observed state of a cluster, written by the coordinator.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterStatus {
    #[serde(default)]
    pub phase: ClusterPhase,
    #[serde(default, skip_serializing_if = "is_default")]
    pub observed_generation: u64,
    pub control_plane_endpoint: Option<String>,
    /// The coordinator's port that proxies to the control plane, when the
    /// spec asks for `{managed: coordinator}`. Allocated once, before
    /// `kubeadm init`, and kept for the cluster's life.
    pub endpoint_port: Option<u16>,
    /// The provider's load balancer in front of the control planes (docker
    /// clusters), made before the first machine; `controlPlaneEndpoint` is
    /// its address.
    pub load_balancer: Option<LoadBalancerStatus>,
    /// The cluster's etcd members as a control-plane agent last reported
    /// them (`drover describe cluster` shows them). Every quorum decision
    /// uses this list, not the machine count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub etcd_members: Vec<EtcdMember>,
    /// Which machine reported `etcdMembers`, and when.
    pub etcd_reported_by: Option<String>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub etcd_reported_at: Option<time::OffsetDateTime>,
    /// The cluster's Nodes as a control-plane agent last reported them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<ClusterNode>,
    /// The Node deletion the coordinator asked a control-plane machine to
    /// make (a Node whose machine left), until it is gone from the list.
    pub node_removal: Option<NodeRemoval>,
    /// The member removal the coordinator asked a control-plane machine to
    /// make, until the member is gone from the reported list.
    pub etcd_removal: Option<EtcdRemoval>,
    /// The drain under way of a machine leaving on purpose.
    pub drain: Option<NodeDrain>,
    /// `ClusterConfiguration.kubernetesVersion` in the cluster's
    /// `kube-system/kubeadm-config` as a control plane last reported it:
    /// the version a control plane that joins deploys.
    pub kubeadm_config_version: Option<String>,
    /// Whether the cluster's endpoint answered `/readyz`, as a control
    /// plane last reported it. A rollout takes no step while it does not.
    pub endpoint_ready: Option<bool>,
    /// The certificate renewal asked of a pool control plane whose first
    /// kubeadm certificate expires within the renewal window (one machine
    /// at a time), until it reports new ones.
    pub certificate_renewal: Option<CertificateRenewal>,
    /// The change of that version asked of a control-plane machine, before
    /// the first control plane of a new version joins; until it is reported
    /// done.
    pub version_update: Option<VersionUpdate>,
    /// The upgrade of kube-proxy and CoreDNS a rollout asked of a
    /// control plane once its last new control plane was in; kept once
    /// done (the version they were last upgraded to).
    pub essential_addons: Option<EssentialAddonsUpgrade>,
    /// The pool machine being upgraded in place (pool clusters, one
    /// machine at a time).
    pub machine_upgrade: Option<MachineUpgrade>,
    /// Each addon of the spec, in its order: applied, pending or failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addons: Vec<AddonStatus>,
    /// The addon apply asked of a running control plane, until it reports.
    pub addon_apply: Option<AddonApply>,
    /// The rollout under way: machines made for another version or image
    /// being replaced; absent when every machine is up to date.
    pub rollout: Option<RolloutStatus>,
    /// The etcd snapshot asked of a running control plane, until it is
    /// saved, or its failure until it is asked again.
    pub snapshot: Option<crate::objects::snapshot::SnapshotSave>,
    /// When `drover backup cluster` asked for a snapshot not yet asked of
    /// a machine.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub snapshot_requested_at: Option<time::OffsetDateTime>,
    /// The newest snapshot saved.
    pub last_snapshot: Option<crate::objects::snapshot::SnapshotRef>,
    /// The change (`upgrade to v1.31.2`, `control-plane scale-down to 1
    /// at generation 7`) the last snapshot taken before one was saved
    /// for: that change may go ahead.
    pub snapshot_taken_before: Option<String>,
    /// The restore of etcd from a snapshot under way (`drover restore
    /// cluster`), until its init machine runs.
    pub restore: Option<crate::objects::restore::ClusterRestore>,
    /// The last restore that finished.
    pub last_restore: Option<crate::objects::restore::RestoreDone>,
    /// On a drill cluster: the cluster and snapshot it drills, and its
    /// inventory.
    pub drill_of: Option<crate::objects::restore::DrillOf>,
    /// The restore drill of this cluster under way (its drill cluster).
    pub drill: Option<crate::objects::restore::DrillUnderWay>,
    /// The last restore drill of this cluster that ended.
    pub last_drill: Option<crate::objects::restore::DrillDone>,
    /// The machine that ran `kubeadm init`.
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
