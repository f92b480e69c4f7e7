//! Restoring a cluster's etcd from one of its snapshots (`drover restore
//! cluster`): what is asked (`RestoreRequest`), the restore under way on
//! the cluster's status (`ClusterRestore`), and the last one done
//! (`RestoreDone`); restore drills: a snapshot restored into a new cluster
//! that is inventoried and deleted (`DrillOf` on the drill cluster,
//! `DrillUnderWay` and `DrillDone` on the cluster drilled).
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
    /// Restore into a new cluster of this name instead (a drill): the
    /// cluster named stays as it is; the new one gets one control plane,
    /// is inventoried once its API answers, and is deleted
    /// (`status.lastDrill` of the cluster named).
    pub into: Option<String>,
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
    /// The cluster the snapshot is of, when it is another one (a drill).
    pub source: Option<RestoreSource>,
}

impl ClusterRestore {
    /// The UID of the cluster whose snapshot (record, file and key) this
    /// restores; `own` is the restoring cluster's.
    pub fn snapshot_uid<'a>(&'a self, own: &'a str) -> &'a str {
        self.source.as_ref().map_or(own, |s| s.uid.as_str())
    }
}

/// The cluster a drill restores a snapshot of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestoreSource {
    pub cluster: String,
    pub uid: String,
}

/// What started a drill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum DrillTrigger {
    /// `drover restore cluster NAME --into NEW`.
    Manual,
    /// `spec.backup.drill.every`.
    Scheduled,
}

impl std::fmt::Display for DrillTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DrillTrigger::Manual => "manual",
            DrillTrigger::Scheduled => "scheduled",
        })
    }
}

/// On a drill cluster's status: what it drills, and its inventory.
///
/// Invariant: a drill cluster restores `snapshot` of `source` (its
/// `status.restore.source`), is asked for its inventory once that restore
/// is done, and is deleted once the drill ends, whatever the outcome.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrillOf {
    pub source: RestoreSource,
    pub snapshot: String,
    /// The etcd revision the snapshot holds.
    pub revision: i64,
    pub trigger: DrillTrigger,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: time::OffsetDateTime,
    /// The inventory asked of the restored control plane, once asked.
    pub inventory: Option<InventoryAsk>,
    /// Why the drill ended without an inventory, once it did (the drill
    /// cluster is being deleted).
    pub failed: Option<String>,
}

/// The id prefix of inventory directives.
pub const INVENTORY_PREFIX: &str = "inventory-";

/// An inventory asked of a drill cluster's control plane.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InventoryAsk {
    /// The machine asked.
    pub via: String,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
    /// What it found, once reported.
    pub result: Option<Inventory>,
    /// Why it could not take it, once reported.
    pub error: Option<String>,
}

impl InventoryAsk {
    /// The directive's id: one per machine and ask.
    pub fn directive_id(&self) -> String {
        format!(
            "{INVENTORY_PREFIX}{}-{}",
            self.via,
            self.requested_at.unix_timestamp()
        )
    }

    /// Whether it waits for the machine.
    pub fn under_way(&self) -> bool {
        self.result.is_none() && self.error.is_none()
    }
}

/// What a restored cluster holds, as its control plane read it: through
/// the API server (namespaces, which proves it answers) and through etcd
/// (every key under `/registry/`, counted by resource).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Inventory {
    /// The namespaces the API server lists.
    pub namespaces: Vec<String>,
    /// Objects stored in etcd, by resource (`pods`, `configmaps`,
    /// `apiextensions.k8s.io/customresourcedefinitions`).
    pub objects: std::collections::BTreeMap<String, u64>,
    /// Every object stored in etcd.
    pub total: u64,
    /// etcd's revision when counted.
    pub revision: i64,
}

impl Inventory {
    /// One line for logs and the CLI.
    pub fn summary(&self) -> String {
        format!(
            "{} namespace(s), {} object(s) in {} resource(s) at revision {}",
            self.namespaces.len(),
            self.total,
            self.objects.len(),
            self.revision
        )
    }
}

/// On the drilled cluster's status: the drill under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrillUnderWay {
    /// The drill cluster.
    pub cluster: String,
    pub snapshot: String,
    pub trigger: DrillTrigger,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: time::OffsetDateTime,
}

/// On the drilled cluster's status: the last drill that ended.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrillDone {
    /// The drill cluster (deleted since).
    pub cluster: String,
    pub snapshot: String,
    pub revision: i64,
    pub trigger: DrillTrigger,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: time::OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub completed_at: time::OffsetDateTime,
    /// Whether the snapshot restored and the API answered with it.
    pub ok: bool,
    /// What was found, or why it failed.
    pub message: String,
    pub inventory: Option<Inventory>,
}

/// The condition a drilled cluster has once a drill ended (True, reason
/// `DrillPassed`; False, reason `DrillFailed`).
pub const DRILL_CONDITION: &str = "RestoreDrill";

/// The label a drill cluster carries, naming the cluster drilled.
pub const DRILL_OF_LABEL: &str = "drover.dev/drill-of";

/// How long a drill may take, from its start to its inventory, before it
/// fails (the drill cluster is then deleted).
pub const DRILL_TIMEOUT: time::Duration = time::Duration::minutes(45);

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
