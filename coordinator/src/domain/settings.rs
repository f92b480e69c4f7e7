//! The settings of a running coordinator, fixed when `drover serve` starts.

use std::time::Duration;

/// Settings of a running coordinator.
#[derive(Debug, Clone)]
pub struct Settings {
    /// URLs agents use to reach this coordinator.
    pub advertise_urls: Vec<String>,
    pub heartbeat_interval: Duration,
    /// Lifetime of machine client certificates.
    pub machine_cert_ttl: Duration,
    /// Lifetime of kubeadm join tokens the coordinator mints.
    pub join_token_ttl: Duration,
    /// Period of the cluster reconcile loop when nothing wakes it earlier.
    pub reconcile_period: Duration,
    /// Health and remediation defaults; clusters may override them.
    pub health_defaults: drover_planner::health::Policy,
    /// Managed control-plane endpoints: their ports and address.
    pub endpoints: crate::domain::endpoint::EndpointSettings,
    /// Where the sealed etcd snapshots of clusters are kept
    /// (`DATA_DIR/snapshots`).
    pub snapshot_dir: std::path::PathBuf,
    /// Where the cluster-autoscaler's service is reached (`host:port`),
    /// when `--autoscaler-listen` serves it.
    pub autoscaler_address: Option<String>,
}
