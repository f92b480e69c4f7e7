//! Providers: where machines come from. The coordinator records a machine as
//! intent in the store first, then asks its provider to create it; every
//! call is idempotent on the machine UID, and everything a provider creates
//! is labelled with the coordinator, cluster and machine, so the sweeper can
//! find and delete what the store does not know.

pub mod docker;

use std::collections::BTreeMap;

/// Labels (or tags) on everything a provider creates.
pub const LABEL_MANAGED: &str = "drover.dev/managed-by";
pub const LABEL_CLUSTER: &str = "drover.dev/cluster";
pub const LABEL_CLUSTER_UID: &str = "drover.dev/cluster-uid";
pub const LABEL_MACHINE: &str = "drover.dev/machine";
pub const LABEL_MACHINE_UID: &str = "drover.dev/machine-uid";

/// What the provider needs to create one machine.
#[derive(Debug, Clone)]
pub struct MachineRequest {
    pub cluster: String,
    pub cluster_uid: String,
    pub machine: String,
    pub machine_uid: String,
    /// The bootstrap document, delivered as user data.
    pub user_data: String,
    pub image: String,
}

/// The state of a provider machine as the provider sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    Pending,
    Running,
    /// Stopped, exited or dead: it will not come back by itself.
    Stopped,
    Paused,
}

/// A machine the provider knows about.
#[derive(Debug, Clone)]
pub struct ProviderMachine {
    pub provider_id: String,
    pub labels: BTreeMap<String, String>,
    pub state: InstanceState,
}

impl ProviderMachine {
    pub fn machine_uid(&self) -> Option<&str> {
        self.labels.get(LABEL_MACHINE_UID).map(String::as_str)
    }
}

/// A cluster-wide resource (a network) the provider created.
#[derive(Debug, Clone)]
pub struct ProviderNetwork {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// Provider failures, with what was being done to which object.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("cannot reach the {provider} provider: {detail}")]
    Unavailable {
        provider: &'static str,
        detail: String,
    },
    #[error("{provider} provider failed to {action} {object}: {detail}")]
    Failed {
        provider: &'static str,
        action: &'static str,
        object: String,
        detail: String,
    },
    #[error(
        "{object} exists but belongs to another owner ({detail}); delete it or rename the cluster"
    )]
    Foreign { object: String, detail: String },
}
