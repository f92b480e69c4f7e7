//! What a provider reports of its instances, as the planner reads it: the
//! state of a machine's instance (keyed by machine UID) and of a cluster's
//! provider-run endpoint (keyed by [`endpoint_key`]). The coordinator's
//! providers produce these facts (`provider::Provider::list` and
//! `endpoint_states`); the planner only reads them through
//! [`crate::Observed::instance`]. A leaf: it imports nothing of the crate.

/// The state of a provider machine as the provider sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    Pending,
    Running,
    /// Stopped, exited or dead: it will not come back by itself.
    Stopped,
    Paused,
}

/// The key under which the reconciler's observation holds the state of a
/// cluster's provider-run endpoint (see the coordinator's
/// `Provider::endpoint_states`), beside the machines' states keyed by
/// machine UID.
pub fn endpoint_key(cluster_uid: &str) -> String {
    format!("endpoint:{cluster_uid}")
}
