//! The bootstrap step names a machine reports in its heartbeats.

use drover_common::api::MachineRole;
use drover_common::wire::BootstrapReport;

/// Fetching and verifying the config bundle.
pub const FETCH_CONFIG_STEP: &str = "fetch-config";
/// Writing the bundle's files.
pub const WRITE_FILES_STEP: &str = "write-files";
/// `kubeadm reset`.
pub const RESET_STEP: &str = "kubeadm-reset";
/// Restoring the cluster's etcd from a snapshot, before `kubeadm init`.
pub const RESTORE_STEP: &str = "etcd-restore";
/// The cluster's `preKubeadmCommands`.
pub const PRE_COMMANDS_STEP: &str = "pre-kubeadm-commands";
/// The cluster's `postKubeadmCommands`.
pub const POST_COMMANDS_STEP: &str = "post-kubeadm-commands";

/// The kubeadm step name reported for a role.
pub fn kubeadm_step_name(role: MachineRole) -> &'static str {
    match role {
        MachineRole::Init => drover_common::wire::KUBEADM_INIT_STEP,
        MachineRole::ControlPlane | MachineRole::Worker => "kubeadm-join",
    }
}

/// A report of a step under way (no failure).
pub fn at_step(step: &str) -> BootstrapReport {
    BootstrapReport {
        step: step.to_owned(),
        failure: None,
    }
}

/// Whether a bootstrap that failed at `step` needs `kubeadm reset` before
/// it can start over: only the steps before kubeadm ran do not.
pub fn failure_needs_reset(step: &str) -> bool {
    step != FETCH_CONFIG_STEP && step != WRITE_FILES_STEP && step != PRE_COMMANDS_STEP
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names() {
        assert_eq!(kubeadm_step_name(MachineRole::Init), "kubeadm-init");
        assert_eq!(kubeadm_step_name(MachineRole::Worker), "kubeadm-join");
        assert_eq!(kubeadm_step_name(MachineRole::ControlPlane), "kubeadm-join");
        assert_eq!(at_step(FETCH_CONFIG_STEP).step, "fetch-config");
        assert!(at_step(RESET_STEP).failure.is_none());
        assert!(!failure_needs_reset("fetch-config"));
        assert!(!failure_needs_reset("write-files"));
        assert!(!failure_needs_reset("pre-kubeadm-commands"));
        assert!(failure_needs_reset("post-kubeadm-commands"));
        assert!(failure_needs_reset("kubeadm-join"));
        assert!(failure_needs_reset("kubeadm-init"));
        assert!(failure_needs_reset("kubeadm-reset"));
    }
}
