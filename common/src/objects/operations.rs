//! The operations in flight on a cluster's status: each is asked of one
//! machine through a heartbeat directive and kept on `status` until the
//! machine reports its result (a Node deletion, a member removal, a drain,
//! a certificate renewal, a `kubeadm-config` version change, the essential
//! addons' upgrade, a step of an in-place upgrade; an addon apply,
//! [`super::addons::AddonApply`], is one too).
//!
//! Invariant: a directive's id is the operation's prefix, what it concerns
//! and the second it was asked for (`operation_id`), so a retry (asked
//! again later) is a new directive and a result names the request it
//! answers. The coordinator's machine protocol folds their directives and
//! result records behind one trait; these are the records as stored.

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

/// The id of the directive carrying an operation with id prefix `prefix`,
/// about `subject` (`None` when the time alone tells requests apart), asked
/// for at `requested_at`.
pub(crate) fn operation_id(
    prefix: &str,
    subject: Option<&str>,
    requested_at: time::OffsetDateTime,
) -> String {
    let at = requested_at.unix_timestamp();
    match subject {
        Some(subject) => format!("{prefix}{subject}-{at}"),
        None => format!("{prefix}{at}"),
    }
}

/// A Node's name as a directive id carries it: its first 32 characters.
fn node_subject(node: &str) -> String {
    node.chars().take(32).collect()
}

/// A Node deletion asked of a control-plane machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeRemoval {
    pub node: String,
    /// The machine asked to delete it.
    pub via: String,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
}

impl NodeRemoval {
    /// The id of the directive that carries this request.
    pub fn directive_id(&self) -> String {
        operation_id(
            NODE_DELETE_PREFIX,
            Some(&node_subject(&self.node)),
            self.requested_at,
        )
    }
}

/// The id prefix of Node deletion directives.
pub const NODE_DELETE_PREFIX: &str = "node-delete-";

/// A renewal of a pool control plane's kubeadm certificates, asked of that
/// machine.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateRenewal {
    pub machine: String,
    /// Which certificate expires when.
    pub reason: String,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
    /// When the last attempt failed and why, as the machine reported it.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub failed_at: Option<time::OffsetDateTime>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl CertificateRenewal {
    /// The id of the directive that carries this request; a retry is a new
    /// directive.
    pub fn directive_id(&self) -> String {
        operation_id(CERTIFICATE_RENEWAL_PREFIX, None, self.requested_at)
    }
}

/// The id prefix of certificate-renewal directives.
pub const CERTIFICATE_RENEWAL_PREFIX: &str = "certs-renew-";

/// A change of the cluster's `kubeadm-config` version asked of a
/// control-plane machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VersionUpdate {
    /// The version the config is to name.
    pub version: String,
    /// The machine asked to set it.
    pub via: String,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
    /// Why the last attempt failed, as the machine reported it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl VersionUpdate {
    /// The id of the directive that carries this request; a retry (a new
    /// `requestedAt`) is a new directive.
    pub fn directive_id(&self) -> String {
        operation_id(
            VERSION_UPDATE_PREFIX,
            Some(&self.version),
            self.requested_at,
        )
    }
}

/// The id prefix of the directives that set the `kubeadm-config` version.
pub const VERSION_UPDATE_PREFIX: &str = "kubeadm-config-version-";

/// The upgrade of the addons `kubeadm init` installs (kube-proxy and
/// CoreDNS, kubeadm's "essential addons") to a Kubernetes version, asked of
/// a running control plane once the last new control plane of a rollout is
/// in: real `kubeadm join` never touches them, `kubeadm upgrade apply`
/// upgrades them after the control plane (kubeadm's
/// `phases/upgrade/postupgrade.go`). Kept once done, as the version they
/// were last upgraded to.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EssentialAddonsUpgrade {
    /// The Kubernetes version whose kube-proxy and CoreDNS are wanted.
    pub version: String,
    /// The control plane asked to upgrade them.
    pub via: String,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
    /// When the machine reported both at that version's images; absent
    /// while the upgrade is under way.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub done_at: Option<time::OffsetDateTime>,
    /// What the machine reported it did (the images set).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Why the last attempt failed, as the machine reported it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl EssentialAddonsUpgrade {
    /// The id of the directive that carries this request; a retry (a new
    /// `requestedAt`) is a new directive.
    pub fn directive_id(&self) -> String {
        operation_id(
            ESSENTIAL_ADDONS_PREFIX,
            Some(&self.version),
            self.requested_at,
        )
    }

    /// Whether the machine reported it done.
    pub fn is_done(&self) -> bool {
        self.done_at.is_some()
    }
}

/// The id prefix of the directives that upgrade kube-proxy and CoreDNS.
pub const ESSENTIAL_ADDONS_PREFIX: &str = "essential-addons-";

/// The in-place upgrade of one pool machine to the cluster's version: its
/// Node is drained, the machine upgrades itself (`kubeadm upgrade apply` on
/// the first control plane, `kubeadm upgrade node` elsewhere, then the
/// image's kubelet hook), a control plane uncordons the Node, and the
/// machine settles before the next one starts.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineUpgrade {
    pub machine: String,
    pub node: String,
    /// The version it upgrades to.
    pub version: String,
    pub command: UpgradeCommand,
    pub step: MachineUpgradeStep,
    /// When this machine's upgrade started.
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: time::OffsetDateTime,
    /// When the current step was asked for (it names the directive).
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
    /// The control-plane machine asked to uncordon the Node.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub via: String,
    /// The current step's outcome, once the machine reported it.
    pub result: Option<DrainResult>,
}

/// Which `kubeadm upgrade` a machine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum UpgradeCommand {
    /// `kubeadm upgrade apply VERSION -y`: the first control plane, which
    /// also records the version in `kube-system/kubeadm-config`.
    Apply,
    /// `kubeadm upgrade node`: every other machine.
    Node,
}

impl std::fmt::Display for UpgradeCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Apply => "kubeadm upgrade apply",
            Self::Node => "kubeadm upgrade node",
        })
    }
}

/// Where a machine's in-place upgrade stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum MachineUpgradeStep {
    /// Its Node is being drained (`status.drain`).
    Drain,
    /// The machine runs the upgrade.
    Upgrade,
    /// A control plane uncordons its Node.
    Uncordon,
    /// Upgraded and uncordoned: it must stay Running, healthy and Ready
    /// for the settle time.
    Settle,
}

impl std::fmt::Display for MachineUpgradeStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Drain => "drain",
            Self::Upgrade => "upgrade",
            Self::Uncordon => "uncordon",
            Self::Settle => "settle",
        })
    }
}

impl MachineUpgrade {
    /// The id of the current step's directive; a retry is a new directive.
    pub fn directive_id(&self) -> String {
        let prefix = match self.step {
            MachineUpgradeStep::Uncordon => UNCORDON_PREFIX,
            _ => MACHINE_UPGRADE_PREFIX,
        };
        operation_id(prefix, Some(&node_subject(&self.node)), self.requested_at)
    }
}

impl MachineUpgrade {
    /// What the machine is asked to run, while its upgrade step waits for
    /// it.
    pub fn request(&self) -> Option<UpgradeRequest> {
        (self.step == MachineUpgradeStep::Upgrade && self.result.is_none()).then(|| {
            UpgradeRequest {
                id: self.directive_id(),
                version: self.version.clone(),
                command: self.command,
            }
        })
    }
}

/// An in-place upgrade a pool machine is asked to run: the directive its
/// heartbeat answers carry until it reports the outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradeRequest {
    /// The directive's id.
    pub id: String,
    pub version: String,
    pub command: UpgradeCommand,
}

/// A reboot the coordinator asked of a machine to repair it (its pool's
/// remediation reboots before it replaces): the directive its heartbeat
/// answers carry until its agent reports the outcome, and what came of it.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RebootRequest {
    /// The directive's id ([`REBOOT_PREFIX`] and a number).
    pub id: String,
    /// Why, as the remediation judged it.
    pub reason: String,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
    /// The machine's boot ID when it was asked; a report with another one
    /// says it rebooted.
    pub boot_id: Option<String>,
    /// When its agent said it asked the init system to reboot (its
    /// directive's result); the directive is not carried after.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub started_at: Option<time::OffsetDateTime>,
    /// When its agent reported the new boot ID.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub completed_at: Option<time::OffsetDateTime>,
    /// Why its agent could not reboot it, when it could not.
    pub failed: Option<String>,
    /// How: asked of the agent (the default), or a power cycle through the
    /// machine's BMC, for a machine whose agent cannot be reached.
    #[serde(default, skip_serializing_if = "crate::serde_skip::is_default")]
    pub method: RebootMethod,
}

/// How a reboot is carried out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum RebootMethod {
    /// A directive the agent carries out: cordon, then the init system.
    #[default]
    Agent,
    /// A Redfish reset through the machine's BMC (`spec.bmc`).
    PowerCycle,
}

impl RebootRequest {
    /// Asked, neither back nor refused yet.
    pub fn in_progress(&self) -> bool {
        self.completed_at.is_none() && self.failed.is_none()
    }
}

/// The id prefix of reboot directives.
pub const REBOOT_PREFIX: &str = "reboot-";

/// The id prefix of in-place upgrade directives.
pub const MACHINE_UPGRADE_PREFIX: &str = "upgrade-";
/// The id prefix of uncordon directives.
pub const UNCORDON_PREFIX: &str = "uncordon-";

/// The drain of a machine leaving on purpose, asked of a control-plane
/// machine (one attempt at a time, retried until the drain timeout).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeDrain {
    /// The machine that leaves, and its Node.
    pub machine: String,
    pub node: String,
    /// The control-plane machine asked to drain it.
    pub via: String,
    /// When the first attempt was asked for; the timeout counts from here.
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: time::OffsetDateTime,
    /// When this attempt was asked for (it names the directive).
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
    /// This attempt's outcome, once the agent reported it.
    pub result: Option<DrainResult>,
}

/// How a drain attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrainResult {
    pub ok: bool,
    /// What was evicted, or what blocks the drain (the Pods and the
    /// PodDisruptionBudgets that refused their eviction).
    pub message: String,
}

/// The id prefix of drain directives.
pub const DRAIN_PREFIX: &str = "drain-";

impl NodeDrain {
    /// The id of this attempt's directive.
    pub fn directive_id(&self) -> String {
        operation_id(
            DRAIN_PREFIX,
            Some(&node_subject(&self.node)),
            self.requested_at,
        )
    }
}

/// A member removal asked of a control-plane machine.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdRemoval {
    /// The member id (hexadecimal) and name.
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The machine asked to remove it.
    pub via: String,
    /// Why it goes.
    pub reason: String,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
    /// When this request failed and why, as the machine reported it (etcd
    /// refuses a removal while a member that just joined is not yet
    /// active): it is asked again shortly.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub failed_at: Option<time::OffsetDateTime>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl EtcdRemoval {
    /// The id of the directive that carries this request; a retry (a new
    /// `requestedAt`) is a new directive.
    pub fn directive_id(&self) -> String {
        operation_id(ETCD_REMOVAL_PREFIX, Some(&self.id), self.requested_at)
    }
}

/// The id prefix of member-removal directives.
pub const ETCD_REMOVAL_PREFIX: &str = "etcd-remove-";

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> time::OffsetDateTime {
        time::OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap()
    }

    /// The ids are what agents already hold results for: their form is the
    /// wire's, one function makes them all.
    #[test]
    fn every_operation_names_its_directive_by_prefix_subject_and_second() {
        let node = "a-node-name-longer-than-thirty-two-characters";
        let removal = NodeRemoval {
            node: node.into(),
            via: "cp".into(),
            requested_at: at(),
        };
        assert_eq!(
            removal.directive_id(),
            "node-delete-a-node-name-longer-than-thirty-t-1700000000"
        );
        let renewal = CertificateRenewal {
            machine: "cp".into(),
            reason: "apiserver expires".into(),
            requested_at: at(),
            failed_at: None,
            error: String::new(),
        };
        assert_eq!(renewal.directive_id(), "certs-renew-1700000000");
        let version = VersionUpdate {
            version: "v1.32.0".into(),
            via: "cp".into(),
            requested_at: at(),
            error: String::new(),
        };
        assert_eq!(
            version.directive_id(),
            "kubeadm-config-version-v1.32.0-1700000000"
        );
        let addons = EssentialAddonsUpgrade {
            version: "v1.32.0".into(),
            via: "cp".into(),
            requested_at: at(),
            done_at: None,
            message: String::new(),
            error: String::new(),
        };
        assert_eq!(addons.directive_id(), "essential-addons-v1.32.0-1700000000");
        let mut upgrade = MachineUpgrade {
            machine: "w".into(),
            node: "node-w".into(),
            version: "v1.32.0".into(),
            command: UpgradeCommand::Node,
            step: MachineUpgradeStep::Upgrade,
            started_at: at(),
            requested_at: at(),
            via: String::new(),
            result: None,
        };
        assert_eq!(upgrade.directive_id(), "upgrade-node-w-1700000000");
        assert_eq!(
            upgrade.request().map(|r| r.id),
            Some(upgrade.directive_id())
        );
        upgrade.step = MachineUpgradeStep::Uncordon;
        assert_eq!(upgrade.directive_id(), "uncordon-node-w-1700000000");
        assert_eq!(upgrade.request(), None);
        let drain = NodeDrain {
            machine: "w".into(),
            node: node.into(),
            via: "cp".into(),
            started_at: at(),
            requested_at: at(),
            result: None,
        };
        assert_eq!(
            drain.directive_id(),
            "drain-a-node-name-longer-than-thirty-t-1700000000"
        );
        let etcd = EtcdRemoval {
            id: "8e9e05c52164694d".into(),
            name: "cp-2".into(),
            via: "cp".into(),
            reason: "replaced".into(),
            requested_at: at(),
            failed_at: None,
            error: String::new(),
        };
        assert_eq!(
            etcd.directive_id(),
            "etcd-remove-8e9e05c52164694d-1700000000"
        );
    }
}
