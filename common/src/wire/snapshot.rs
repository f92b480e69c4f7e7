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
