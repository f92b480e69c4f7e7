//! The part of a restore of a cluster's etcd that the init machine's config
//! bundle carries ([`EtcdRestore`]), and where each cluster's snapshot key
//! is stored. Asking for a restore and its checks are
//! `crate::cluster_restore`'s.

use drover_common::api::{Cluster, Machine, Snapshot};
use drover_common::snapshot::SnapshotKey;
use drover_common::wire::EtcdRestore;

use crate::store::{Kind, Store, StoreError};

/// Why an init machine's restore cannot be handed out.
#[derive(Debug, thiserror::Error)]
pub enum RestoreBundleError {
    /// What the restore needs is gone: it cannot go on.
    #[error("{0}")]
    Gone(String),
    /// The machine has not reported what its member is named by yet.
    #[error("{0}")]
    NotYet(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The `Secret` record holding the snapshot key of the cluster with UID
/// `uid`.
pub fn key_record(uid: &str) -> String {
    format!("snapshot-key-{uid}")
}

/// The restore the init machine `machine` of `cluster` carries out before
/// `kubeadm init`, if the cluster is being restored. The snapshot, its key
/// and the machine's name and address must all be known: an init machine
/// of a cluster being restored is never handed a bundle without them.
pub fn for_init_machine(
    store: &Store,
    cluster: &Cluster,
    machine: &Machine,
) -> Result<Option<EtcdRestore>, RestoreBundleError> {
    let Some(r) = &cluster.status.restore else {
        return Ok(None);
    };
    let name = &cluster.metadata.name;
    let own = cluster.metadata.uid.clone().unwrap_or_default();
    // A drill cluster restores a snapshot of the cluster it drills: that
    // one's record, key and UID.
    let uid = r.snapshot_uid(&own).to_owned();
    let gone = |what: String| {
        RestoreBundleError::Gone(format!(
            "cluster {name} is being restored from snapshot {}, but {what}; the restore cannot go on: delete and re-create the cluster, or restore the coordinator's store from a backup that holds it",
            r.snapshot
        ))
    };
    let snapshot = store
        .get_json::<Snapshot>(Kind::Snapshot, &r.snapshot)?
        .map(|(s, _)| s)
        .filter(|s| s.spec.cluster_uid == uid)
        .ok_or_else(|| gone("that snapshot's record is gone".into()))?;
    let key = store
        .get_json::<String>(Kind::Secret, &key_record(&uid))?
        .ok_or_else(|| gone("its snapshot key is gone".into()))
        .and_then(|(text, _)| {
            SnapshotKey::from_base64(&text)
                .map_err(|e| gone(format!("its snapshot key is unreadable ({e})")))
        })?;
    let member_name = machine.status.hostname.clone();
    let address = machine.status.address();
    if member_name.is_empty() || address.is_empty() {
        return Err(RestoreBundleError::NotYet(format!(
            "machine {} has not reported its hostname and address yet, which its restored etcd member is named by",
            machine.metadata.name
        )));
    }
    let peer_url = match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(ip)) => format!("https://[{ip}]:2380"),
        _ => format!("https://{address}:2380"),
    };
    Ok(Some(EtcdRestore {
        snapshot: r.snapshot.clone(),
        cluster_uid: uid,
        key: key.to_base64(),
        size: snapshot.status.size,
        sha256: snapshot.status.sha256.clone(),
        revision: snapshot.status.revision,
        member_name,
        peer_url,
        data_dir: "/var/lib/etcd".into(),
    }))
}
