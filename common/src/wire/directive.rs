//! Directives: what the coordinator asks an agent to do in a heartbeat's
//! answer, and their results.

use serde::{Deserialize, Serialize};

use crate::token::BootstrapToken;

/// Something the coordinator asks an agent to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Directive {
    /// Unique; echoed in the result.
    pub id: String,
    pub action: DirectiveAction,
}

/// The actions a heartbeat reply can carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum DirectiveAction {
    /// Register a kubeadm bootstrap token in the cluster
    /// (`kubeadm token create TOKEN --ttl ...`), on a control-plane machine.
    #[serde(rename_all = "camelCase")]
    CreateBootstrapToken {
        token: BootstrapToken,
        ttl_seconds: u64,
    },
    /// Leave the cluster (`kubeadm reset -f`) and return to the pool.
    #[serde(rename_all = "camelCase")]
    Reset { reason: String },
    /// Remove another machine's member from the cluster's etcd, through
    /// this control plane's local member (`id` in hexadecimal). The agent
    /// refuses its own member.
    #[serde(rename_all = "camelCase")]
    RemoveEtcdMember { id: String, name: String },
    /// Delete a Node object of a machine that left the cluster (a missing
    /// Node counts as done).
    #[serde(rename_all = "camelCase")]
    DeleteNode { node: String },
    /// Cordon a Node and evict its Pods through the Eviction API (so
    /// PodDisruptionBudgets hold), then wait for them to go (each for its
    /// grace period and a margin), as `kubectl drain --ignore-daemonsets`
    /// does; Pods without a controller and Pods with `emptyDir` volumes
    /// refuse the drain unless the cluster's drain policy allows deleting
    /// them. Fails naming the Pods that block it and why.
    #[serde(rename_all = "camelCase")]
    DrainNode {
        node: String,
        /// `spec.drain.deletePodsWithoutController` (kubectl's `--force`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        delete_pods_without_controller: bool,
        /// `spec.drain.deleteEmptyDirData` (kubectl's
        /// `--delete-emptydir-data`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        delete_empty_dir_data: bool,
    },
    /// Set `ClusterConfiguration.kubernetesVersion` in the ConfigMap
    /// `kube-system/kubeadm-config` to `version`, so the control planes
    /// that join from now on deploy that version (what `kubeadm upgrade
    /// apply` records, and Cluster API does before its first new control
    /// plane). Setting the version it already has is done at once.
    #[serde(rename_all = "camelCase")]
    SetKubernetesVersion { version: String },
    /// Renew this control plane's kubeadm certificates (`kubeadm certs
    /// renew all`) and restart its static Pods so they use them (each
    /// manifest moved out of `/etc/kubernetes/manifests` for the kubelet's
    /// file check period, then back). `reason` says which certificate
    /// expires when.
    #[serde(rename_all = "camelCase")]
    RenewCertificates { reason: String },
    /// Apply addon `addon`'s manifests (a YAML stream the coordinator has
    /// validated) through this control plane's API server, document by
    /// document, by server-side apply with field manager `drover`. Fails
    /// naming the first object the API server refused and its message.
    #[serde(rename_all = "camelCase")]
    ApplyManifests { addon: String, manifests: String },
    /// Apply the node image's default pod network
    /// (`/usr/share/drover/cni/manifests.yaml` under the agent's root) as
    /// addon `addon`, as [`DirectiveAction::ApplyManifests`] applies the
    /// spec's (`spec.network.cni: image`).
    #[serde(rename_all = "camelCase")]
    ApplyImageManifests { addon: String },
    /// Upgrade this machine in place to `version`: the image's
    /// `upgrade-kubeadm` hook, then `command` (`kubeadm upgrade apply
    /// VERSION -y` or `kubeadm upgrade node`), then its `upgrade-kubelet`
    /// hook, which installs and restarts the kubelet. Its Node was drained
    /// first; a control plane uncordons it afterwards.
    #[serde(rename_all = "camelCase")]
    UpgradeKubernetes {
        version: String,
        command: crate::api::UpgradeCommand,
    },
    /// Mark a Node schedulable again (after its machine's upgrade).
    #[serde(rename_all = "camelCase")]
    UncordonNode { node: String },
    /// Upgrade the addons `kubeadm init` installs (its "essential
    /// addons") to those of Kubernetes `version`, as `kubeadm upgrade
    /// apply` does once the control plane is upgraded: the image of the
    /// DaemonSet `kube-system/kube-proxy` to `<imageRepository>/kube-proxy:
    /// <version>` and that of the Deployment `kube-system/coredns` to the
    /// CoreDNS kubeadm pairs with that minor release, each by an update
    /// with the `resourceVersion` read. One that is absent (the cluster
    /// runs without it) is left alone; one already at its image is done.
    #[serde(rename_all = "camelCase")]
    UpgradeEssentialAddons { version: String },
    /// Save snapshot `snapshot` of the cluster's etcd through this control
    /// plane's member (etcd's Maintenance.Snapshot), sealed with the
    /// cluster's snapshot key, where its grant says
    /// ([`crate::wire::snapshot`]).
    #[serde(rename_all = "camelCase")]
    SaveEtcdSnapshot { snapshot: String },
    /// Take the inventory of this drill cluster's restored control plane
    /// (restored from `snapshot`): the namespaces its API server lists and
    /// the objects its etcd holds by resource, reported with
    /// `POST /v1/machine/inventory` ([`InventoryReport`]) before the
    /// directive's result.
    #[serde(rename_all = "camelCase")]
    TakeInventory { snapshot: String },
    /// Reboot this machine to repair it: cordon its Node with the kubelet's
    /// own credentials (what a Node may change of itself), then ask the
    /// init system to reboot (the agent's reboot command, `systemctl
    /// reboot` by default). The result says the reboot was asked for; the
    /// machine's next report with a new boot ID says it came back, and its
    /// agent then uncordons the Node it cordoned.
    Reboot { reason: String },
}

/// Where a machine reports an inventory.
pub const INVENTORY_PATH: &str = "/v1/machine/inventory";

/// `POST /v1/machine/inventory`'s body: the inventory directive `id` asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InventoryReport {
    pub id: String,
    pub inventory: crate::api::Inventory,
}

/// The outcome of a directive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DirectiveResult {
    pub id: String,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}
