//! Restoring a cluster's etcd from one of its snapshots (`drover restore
//! cluster`): what is asked (`RestoreRequest`), the restore under way on
//! the cluster's status (`ClusterRestore`), and the last one done
//! (`RestoreDone`).
//!
//! Invariant: while `status.restore` is set, the cluster is not
//! initialized and its only init machine restores that snapshot before
//! `kubeadm init` (the coordinator never hands an init machine of such a
//! cluster a bundle without it); the restore stays until that machine
//! runs, and cannot be withdrawn, because the cluster must never be
//! initialized afresh.

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

/// `POST /v1/clusters/{name}/restore`'s body.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestoreRequest {
    /// The snapshot to restore (`drover get snapshots CLUSTER`); absent:
    /// the newest one saved.
    pub snapshot: Option<String>,
    /// Restore even though some control plane is still healthy: it is
    /// replaced, and every change made since the snapshot is lost.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// The restore under way, on the cluster's status.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterRestore {
    /// The snapshot restored.
    pub snapshot: String,
    /// The etcd revision it holds.
    pub revision: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
    /// Who asked (the admin token's id).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub requested_by: String,
    /// Whether it was asked with `--force` while control planes were
    /// healthy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forced: bool,
    /// The control-plane machines of before, which are removed first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaced: Vec<String>,
    /// The new init machine that restores the snapshot, once created.
    pub machine: Option<String>,
}

/// The last restore that finished, on the cluster's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestoreDone {
    pub snapshot: String,
    pub revision: i64,
    /// The init machine that restored it.
    pub machine: String,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
    /// When that machine ran with the restored etcd.
    #[serde(with = "time::serde::rfc3339")]
    pub completed_at: time::OffsetDateTime,
}

/// The condition a cluster has while a restore is under way (True, reason
/// `RestoringSnapshot`).
pub const RESTORING_CONDITION: &str = "Restoring";
