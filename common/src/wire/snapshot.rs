//! Etcd snapshots: what a control plane asked to save one (by the directive
//! [`super::DirectiveAction::SaveEtcdSnapshot`]) fetches, sends and reports.
//!
//! The machine reads its grant (`GET /v1/machine/snapshots/{name}`: the
//! cluster's snapshot key and where to upload), streams the snapshot from
//! its etcd member while sealing it ([`crate::snapshot`]), uploads the
//! sealed file where the grant says, then reports what it saved (`POST
//! /v1/machine/snapshots/{name}`); the coordinator records the snapshot
//! only then. No machine holds storage credentials: an upload to a bucket
//! goes to a URL the coordinator presigned for that one object.

use serde::{Deserialize, Serialize};

/// The path prefix of the machine's snapshot calls.
pub const SNAPSHOT_PATH: &str = "/v1/machine/snapshots";

/// The header an upload names the snapshot's sealed SHA-256 in (hex).
pub const SEALED_SHA256_HEADER: &str = "drover-sealed-sha256";

/// What a machine needs to save snapshot `snapshot`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotGrant {
    pub snapshot: String,
    pub cluster: String,
    pub cluster_uid: String,
    /// The cluster's snapshot key, base64 (32 bytes): the snapshot is
    /// sealed with it before it leaves the machine.
    pub key: String,
    pub upload: SnapshotUpload,
}

/// Where the sealed snapshot goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum SnapshotUpload {
    /// `PUT` to this path of the coordinator that granted it, with the
    /// machine's certificate.
    #[serde(rename_all = "camelCase")]
    Coordinator { path: String },
    /// `PUT` to this presigned URL, which names one object and expires;
    /// nothing of the machine's goes with it.
    #[serde(rename_all = "camelCase")]
    Presigned { url: String },
}

/// What a machine saved, as it reports it once uploaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotSaved {
    /// The snapshot's size in bytes, unsealed.
    pub size: u64,
    /// SHA-256 of the unsealed snapshot (hex).
    pub sha256: String,
    /// The sealed file's size in bytes, as uploaded.
    pub sealed_size: u64,
    /// SHA-256 of the sealed file (hex), as uploaded.
    pub sealed_sha256: String,
    /// The etcd revision the snapshot holds: the one its frames name, or
    /// (etcd 3.4 names none) the member's revision as the snapshot began,
    /// which the snapshot holds at least.
    pub revision: i64,
    /// The etcd member's version (`etcdserver`), as it told.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub etcd_version: String,
}

/// What the init machine of a cluster being restored does before `kubeadm
/// init` (in its config bundle): fetch the sealed snapshot (`GET
/// {SNAPSHOT_PATH}/{snapshot}/data`, with its certificate), open it with
/// the cluster's snapshot key, check it against `sha256`, and restore it
/// as a new one-member etcd in `dataDir` (as `etcdutl snapshot restore`
/// does: new cluster id, this member alone), where kubeadm's etcd then
/// starts.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdRestore {
    pub snapshot: String,
    pub cluster_uid: String,
    /// The cluster's snapshot key, base64 (32 bytes).
    pub key: String,
    /// The unsealed snapshot's size and SHA-256 (hex), as recorded.
    pub size: u64,
    pub sha256: String,
    /// The etcd revision it holds.
    pub revision: i64,
    /// The member's name: the Node name kubeadm gives the member.
    pub member_name: String,
    /// The member's peer URL (`https://<advertise address>:2380`).
    pub peer_url: String,
    /// Where kubeadm's etcd keeps its data (`/var/lib/etcd`).
    pub data_dir: String,
}

/// Its `Debug` hides the key.
impl std::fmt::Debug for EtcdRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdRestore")
            .field("snapshot", &self.snapshot)
            .field("cluster_uid", &self.cluster_uid)
            .field("size", &self.size)
            .field("sha256", &self.sha256)
            .field("revision", &self.revision)
            .field("member_name", &self.member_name)
            .field("peer_url", &self.peer_url)
            .field("data_dir", &self.data_dir)
            .finish_non_exhaustive()
    }
}

impl EtcdRestore {
    /// Where the machine fetches the sealed snapshot.
    pub fn path(&self) -> String {
        format!("{SNAPSHOT_PATH}/{}/data", self.snapshot)
    }
}
