//! What an agent reports about its machine and the coordinator keeps in
//! `MachineStatus`: probe results, bootstrap progress, a failed command.
//! The heartbeat (`crate::wire`) carries them; they live here because the
//! `Machine` object holds them.

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;
use time::OffsetDateTime;

/// Health of one probed component.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum ProbeState {
    #[default]
    Unknown,
    Healthy,
    Unhealthy,
}

/// One probe's latest result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Probe {
    pub state: ProbeState,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// What the agent saw when it last probed its machine.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthReport {
    /// kubelet `/healthz`.
    pub kubelet: Probe,
    /// API server `/readyz`, on control-plane machines only.
    pub api_server: Option<Probe>,
    /// Free bytes on the file system holding the agent's root.
    #[serde(default)]
    pub disk_free_bytes: u64,
    /// What is wrong with the machine beyond its probes, as its agent's
    /// checks see it now (none when all is well; see [`NodeProblem`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<NodeProblem>,
    /// The machine's boot ID (`/proc/sys/kernel/random/boot_id`, what the
    /// kubelet reports as a Node's `nodeInfo.bootID`): a new one says the
    /// machine rebooted.
    pub boot_id: Option<String>,
}

/// A problem the agent's checks see on its machine. The coordinator keeps
/// each as a machine condition of that type (status True, and False once
/// it is no longer reported), as node-problem-detector and the kubelet
/// keep theirs on a Node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeProblem {
    /// One of [`NODE_PROBLEM_TYPES`].
    #[serde(rename = "type")]
    pub type_: String,
    /// A CamelCase word that says which check saw it.
    pub reason: String,
    /// What was seen, with the figures and the bound.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The root file system (or the kubelet's or containerd's directory)
/// mounted read-only: nothing can be written, so Pods and the kubelet fail
/// (node-problem-detector's `ReadonlyFilesystem`).
pub const READ_ONLY_FILESYSTEM: &str = "ReadOnlyFilesystem";
/// Free space or free inodes under the kubelet's or containerd's
/// directory below the kubelet's eviction bounds (the kubelet's
/// `DiskPressure`).
pub const DISK_PRESSURE: &str = "DiskPressure";
/// Available memory below the kubelet's eviction bound (the kubelet's
/// `MemoryPressure`).
pub const MEMORY_PRESSURE: &str = "MemoryPressure";
/// Few process IDs left (the kubelet's `PIDPressure`).
pub const PID_PRESSURE: &str = "PIDPressure";
/// The machine's clock off the coordinator's by more than its agent's
/// bound: certificates, tokens and etcd leases assume clocks that agree.
pub const CLOCK_SKEW: &str = "ClockSkew";
/// The kernel reported a task hung in the kernel (its hung task detector):
/// such a task never finishes, and what waits on it hangs too, until the
/// machine reboots (node-problem-detector's `KernelDeadlock`).
pub const KERNEL_DEADLOCK: &str = "KernelDeadlock";
/// The kernel reported I/O errors of a block device or errors of a file
/// system on it: a disk that is failing.
pub const DEVICE_ERROR: &str = "DeviceError";
/// The container runtime did not answer its CRI socket's `Version` and
/// `Status` within the agent's deadline, or says it is not ready
/// (node-problem-detector's `ContainerRuntimeUnhealthy`). Checked only when
/// the agent is told the socket (`--cri-socket`).
pub const CONTAINER_RUNTIME_UNHEALTHY: &str = "ContainerRuntimeUnhealthy";

/// Every problem type an agent reports; a machine condition of one of
/// these types comes from its agent.
pub const NODE_PROBLEM_TYPES: &[&str] = &[
    READ_ONLY_FILESYSTEM,
    DISK_PRESSURE,
    MEMORY_PRESSURE,
    PID_PRESSURE,
    CLOCK_SKEW,
    KERNEL_DEADLOCK,
    DEVICE_ERROR,
    CONTAINER_RUNTIME_UNHEALTHY,
];

impl HealthReport {
    /// Whether every probe that ran is healthy.
    pub fn healthy(&self) -> bool {
        self.kubelet.state == ProbeState::Healthy
            && self
                .api_server
                .as_ref()
                .is_none_or(|p| p.state == ProbeState::Healthy)
    }
}

/// Where bootstrap stands, as the agent reports it.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootstrapReport {
    /// The step in progress or last finished, e.g. `kubeadm-join`.
    pub step: String,
    pub failure: Option<CommandFailure>,
}

/// A failed command, with enough to debug it without logging in.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandFailure {
    /// The command line as run.
    pub command: String,
    /// The exit code, absent when killed by a signal or not started.
    pub exit_code: Option<i32>,
    /// The last lines of its combined output.
    pub output_tail: Vec<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
}
