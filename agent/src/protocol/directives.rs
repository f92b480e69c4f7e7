//! Directives: what the coordinator asks a machine to do, and when a
//! machine may do it.

use drover_common::api::MachineRole;
use drover_common::wire::{Directive, DirectiveAction};

/// Whether a directive is a reset (which wins over a pending assignment).
pub fn is_reset(d: &Directive) -> bool {
    matches!(d.action, DirectiveAction::Reset { .. })
}

/// A directive's action for logs.
pub fn describe(action: &DirectiveAction) -> String {
    match action {
        DirectiveAction::CreateBootstrapToken { token, ttl_seconds } => {
            format!("create bootstrap token {} (ttl {ttl_seconds}s)", token.id())
        }
        DirectiveAction::Reset { reason } => format!("reset ({reason})"),
        DirectiveAction::RemoveEtcdMember { id, name } => {
            format!("remove etcd member {id} ({name})")
        }
        DirectiveAction::DeleteNode { node } => format!("delete node {node}"),
        DirectiveAction::DrainNode { node, .. } => format!("drain node {node}"),
        DirectiveAction::SetKubernetesVersion { version } => {
            format!("set the kubeadm-config version to {version}")
        }
        DirectiveAction::RenewCertificates { reason } => {
            format!("renew the kubeadm certificates ({reason})")
        }
        DirectiveAction::UpgradeKubernetes { version, command } => {
            format!("upgrade in place to {version} ({command})")
        }
        DirectiveAction::UncordonNode { node } => format!("uncordon node {node}"),
        DirectiveAction::Reboot { reason } => format!("reboot this machine ({reason})"),
        DirectiveAction::UpgradeEssentialAddons { version } => {
            format!("upgrade kube-proxy and CoreDNS to those of {version}")
        }
        DirectiveAction::ApplyManifests { addon, manifests } => {
            format!("apply addon {addon} ({} bytes)", manifests.len())
        }
        DirectiveAction::ApplyImageManifests { addon } => {
            format!("apply addon {addon} from the node image")
        }
        DirectiveAction::SaveEtcdSnapshot { snapshot } => {
            format!("save etcd snapshot {snapshot}")
        }
        DirectiveAction::TakeInventory { snapshot } => {
            format!("take the inventory of the restore of {snapshot}")
        }
    }
}

/// Only a running control-plane machine creates bootstrap tokens.
pub fn may_create_token(running: bool, role: Option<MachineRole>) -> bool {
    running && role.is_some_and(|r| r.is_control_plane())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_rule_and_descriptions() {
        assert!(may_create_token(true, Some(MachineRole::Init)));
        assert!(may_create_token(true, Some(MachineRole::ControlPlane)));
        assert!(!may_create_token(true, Some(MachineRole::Worker)));
        assert!(!may_create_token(false, Some(MachineRole::Init)));
        assert!(!may_create_token(true, None));
        let reset = Directive {
            id: "d1".into(),
            action: DirectiveAction::Reset {
                reason: "deleted".into(),
            },
        };
        assert!(is_reset(&reset));
        assert_eq!(describe(&reset.action), "reset (deleted)");
    }
}
