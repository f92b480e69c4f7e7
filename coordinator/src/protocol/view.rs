//! A running control plane's view of its cluster (etcd members, Nodes, the
//! `kubeadm-config` version, whether the endpoint answers), kept on the
//! cluster's status.
//!
//! Invariant: only a running control plane's report is kept, and only the
//! parts it could read (a part with an error keeps what was there); the
//! newest report wins.

use drover_common::api::{ClusterStatus, Machine, MachinePhase};
use drover_common::wire::HeartbeatRequest;
use time::OffsetDateTime;

/// Whether a heartbeat of `machine` reports its cluster: a running control
/// plane that read its etcd members or its Nodes.
pub fn reports_view(machine: &Machine, hb: &HeartbeatRequest) -> bool {
    (hb.etcd.is_some() || hb.nodes.is_some())
        && machine.status.phase == MachinePhase::Running
        && machine
            .spec
            .assignment
            .as_ref()
            .is_some_and(|a| a.role.is_control_plane())
}

/// What [`record_view`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ViewChange {
    pub etcd_members: bool,
    pub nodes: bool,
    /// The `kubeadm-config` version, when it changed.
    pub kubeadm_config_version: Option<Option<String>>,
    /// Whether the endpoint answers `/readyz`, when that changed.
    pub endpoint_ready: Option<bool>,
}

impl ViewChange {
    /// Whether anything changed.
    pub fn changed(&self) -> bool {
        self.etcd_members
            || self.nodes
            || self.kubeadm_config_version.is_some()
            || self.endpoint_ready.is_some()
    }
}

/// Why a control plane could not read its etcd members and its Nodes, as
/// it reported (empty when it could).
pub fn read_errors(hb: &HeartbeatRequest) -> (Option<&str>, Option<&str>) {
    let etcd = hb
        .etcd
        .as_ref()
        .map(|r| r.error.as_str())
        .filter(|e| !e.is_empty());
    let nodes = hb
        .nodes
        .as_ref()
        .map(|r| r.error.as_str())
        .filter(|e| !e.is_empty());
    (etcd, nodes)
}

/// Keeps what control plane `by` reports of its cluster on `status`, where
/// it changed.
pub fn record_view(
    status: &mut ClusterStatus,
    by: &str,
    hb: &HeartbeatRequest,
    now: OffsetDateTime,
) -> ViewChange {
    let etcd = hb.etcd.as_ref().filter(|r| r.error.is_empty());
    let nodes = hb.nodes.as_ref().filter(|r| r.error.is_empty());
    let mut change = ViewChange {
        etcd_members: etcd.is_some_and(|r| status.etcd_members != r.members),
        nodes: nodes.is_some_and(|r| status.nodes != r.nodes),
        ..Default::default()
    };
    if change.etcd_members {
        status.etcd_members = etcd.map(|r| r.members.clone()).unwrap_or_default();
        status.etcd_reported_by = Some(by.to_owned());
        status.etcd_reported_at = Some(now);
    }
    if change.nodes {
        status.nodes = nodes.map(|r| r.nodes.clone()).unwrap_or_default();
    }
    let version = nodes.and_then(|r| r.kubeadm_config_version.clone());
    if version.is_some() && status.kubeadm_config_version != version {
        status.kubeadm_config_version.clone_from(&version);
        change.kubeadm_config_version = Some(version);
    }
    // Whether the endpoint answers is kept even when the Nodes could not be
    // listed: an API server that died is exactly when they cannot be.
    let ready = hb.nodes.as_ref().and_then(|r| r.endpoint_ready);
    if ready.is_some() && status.endpoint_ready != ready {
        status.endpoint_ready = ready;
        change.endpoint_ready = ready;
    }
    change
}

/// The etcd members a heartbeat reports, for the log.
pub fn etcd_summary(hb: &HeartbeatRequest) -> String {
    let summary: Vec<String> = hb
        .etcd
        .iter()
        .flat_map(|r| &r.members)
        .map(|m| {
            format!(
                "{}({}{}{})",
                if m.name.is_empty() { &m.id } else { &m.name },
                if m.started { "started" } else { "unstarted" },
                if m.healthy { ",healthy" } else { ",unhealthy" },
                if m.is_learner { ",learner" } else { "" }
            )
        })
        .collect();
    summary.join(" ")
}

/// The Nodes a heartbeat reports, for the log.
pub fn nodes_summary(hb: &HeartbeatRequest) -> String {
    let summary: Vec<String> = hb
        .nodes
        .iter()
        .flat_map(|r| &r.nodes)
        .map(|n| format!("{}({})", n.name, n.ready))
        .collect();
    summary.join(" ")
}
