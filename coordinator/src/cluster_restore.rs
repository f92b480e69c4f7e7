//! Restoring a cluster's etcd from one of its snapshots (`drover restore
//! cluster`): the checks made before anything is torn down, the restore
//! recorded on the cluster's status, and the sealed file the init machine
//! fetches (its part of the config bundle is
//! `crate::domain::etcd_restore`'s).
//!
//! Invariants:
//! - Nothing changes until every check passed: the cluster may be
//!   restored (initialized once, not being deleted, no
//!   control plane healthy unless forced), and the snapshot is this
//!   cluster's (its UID), not newer than the cluster's version, and whole:
//!   its sealed file matches the record, opens with the cluster's key and
//!   ends with etcd's own hash.
//! - A recorded restore names a snapshot that stays (retention keeps it)
//!   until the restore is done; the init machine's bundle carries it, or
//!   the machine gets no bundle.

use drover_common::api::{
    Cluster, ClusterRestore, KubernetesVersion, Machine, MachinePhase, RestoreRequest, Snapshot,
};
use drover_common::snapshot::{open_stream, OpenFileError};

use crate::app::App;
use crate::snapshots::{self, SnapshotCallError};
use crate::store::StoreError;

/// Why a restore was not started.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("{kind} {name} does not exist")]
    NotFound { kind: &'static str, name: String },
    /// The cluster or the request does not allow it now; nothing changed.
    #[error("{0}")]
    Refused(String),
    /// The snapshot cannot be restored; nothing changed.
    #[error("snapshot {snapshot} of cluster {cluster} cannot be restored: {detail}; nothing was torn down. Choose another (`drover get snapshots {cluster}`)")]
    Unusable {
        cluster: String,
        snapshot: String,
        detail: String,
    },
    #[error(transparent)]
    Snapshot(#[from] SnapshotCallError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether `m` is a control plane of the cluster with UID `uid` (the
/// fleet index may list others).
fn control_plane_of(m: &Machine, uid: &str) -> bool {
    m.spec
        .assignment
        .as_ref()
        .is_some_and(|a| a.cluster_uid == uid && a.role.is_control_plane())
}

/// The control planes of the cluster with UID `uid` that are healthy:
/// running, heard from and reporting healthy.
fn healthy_control_planes(machines: &[Machine], uid: &str) -> Vec<String> {
    machines
        .iter()
        .filter(|m| {
            control_plane_of(m, uid)
                && m.metadata.deletion_timestamp.is_none()
                && crate::domain::removal::is_healthy(m)
        })
        .map(|m| m.metadata.name.clone())
        .collect()
}

/// The control-plane machines of the cluster with UID `uid` that are not
/// gone yet.
fn control_planes(machines: &[Machine], uid: &str) -> Vec<String> {
    machines
        .iter()
        .filter(|m| control_plane_of(m, uid) && m.status.phase != MachinePhase::Deleted)
        .map(|m| m.metadata.name.clone())
        .collect()
}

/// Checks that `cluster` may be restored as `req` asks; the snapshot to
/// restore. Reads the whole sealed file (on a blocking thread).
pub fn check(app: &App, cluster: &Cluster, req: &RestoreRequest) -> Result<Snapshot, RestoreError> {
    let name = &cluster.metadata.name;
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    let refused = |why: String| Err(RestoreError::Refused(why));
    if cluster.metadata.deletion_timestamp.is_some() {
        return refused(format!(
            "cluster {name} is being deleted; nothing is restored"
        ));
    }
    if let Some(r) = &cluster.status.restore {
        if req.snapshot.as_deref().is_none_or(|s| s == r.snapshot) {
            // Asked again: the answer is the restore under way.
            return find(app, cluster, Some(&r.snapshot));
        }
        return refused(format!(
            "cluster {name} is being restored from snapshot {} already; a restore cannot be withdrawn or replaced once asked (the cluster must not be initialized afresh). Wait for it (`drover get cluster {name}`)",
            r.snapshot
        ));
    }
    if !cluster.status.initialized {
        return refused(format!(
            "cluster {name} never finished `kubeadm init`: there is nothing to restore; it comes up by itself"
        ));
    }
    if drover_planner::stable_endpoint(cluster).is_none() {
        return refused(format!(
            "cluster {name}'s control-plane endpoint ({}) is the address of its first control plane: a restore onto a new machine would change it, and every kubeconfig and kubelet of the cluster names it. A restore needs an endpoint that outlives every machine (spec.controlPlaneEndpoint, or {{managed: coordinator}}), which a cluster gets when it is created; nothing was changed",
            cluster.status.control_plane_endpoint.as_deref().unwrap_or("none yet")
        ));
    }
    let snapshot = find(app, cluster, req.snapshot.as_deref())?;
    let unusable = |detail: String| RestoreError::Unusable {
        cluster: name.clone(),
        snapshot: snapshot.metadata.name.clone(),
        detail,
    };
    if snapshot.spec.cluster_uid != uid {
        return Err(unusable(format!(
            "it was taken of another cluster of the same name (UID {}, this one is {uid})",
            snapshot.spec.cluster_uid
        )));
    }
    if let (Ok(taken), Ok(now)) = (
        KubernetesVersion::parse(&snapshot.spec.kubernetes_version),
        KubernetesVersion::parse(&cluster.spec.kubernetes_version),
    ) {
        if taken > now {
            return Err(unusable(format!(
                "it was taken at Kubernetes {}, newer than the cluster's {}: its objects may be in versions this control plane does not read. Set spec.kubernetesVersion to {} first",
                snapshot.spec.kubernetes_version,
                cluster.spec.kubernetes_version,
                snapshot.spec.kubernetes_version
            )));
        }
    }
    let machines = app.cluster_machines(&uid)?;
    let healthy = healthy_control_planes(&machines, &uid);
    if !healthy.is_empty() && !req.force {
        return refused(format!(
            "cluster {name} still has {} healthy control plane(s) ({}): a restore replaces them and loses every change made since snapshot {} (saved {}). Nothing was changed; pass --force to restore anyway",
            healthy.len(),
            healthy.join(", "),
            snapshot.metadata.name,
            snapshot
                .status
                .saved_at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
        ));
    }
    verify_file(app, cluster, &snapshot).map_err(|e| unusable(e.to_string()))?;
    Ok(snapshot)
}

/// The snapshot `wanted` of `cluster`, or its newest.
pub(crate) fn find(
    app: &App,
    cluster: &Cluster,
    wanted: Option<&str>,
) -> Result<Snapshot, RestoreError> {
    let name = &cluster.metadata.name;
    match wanted {
        Some(s) => {
            let found = app
                .store
                .get_json::<Snapshot>(crate::store::Kind::Snapshot, s)?
                .map(|(s, _)| s)
                .filter(|s| s.spec.cluster == *name);
            found.ok_or_else(|| RestoreError::NotFound {
                kind: "snapshot",
                name: format!("{s} of cluster {name}"),
            })
        }
        None => {
            let uid = cluster.metadata.uid.clone().unwrap_or_default();
            snapshots::snapshots_of(app, name, &uid)?
                .pop()
                .ok_or_else(|| {
                    RestoreError::Refused(format!(
                        "cluster {name} has no snapshot to restore: none was ever saved, or retention let them all go. Nothing was changed"
                    ))
                })
        }
    }
}

/// Why a sealed snapshot file does not restore.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FileProblem {
    #[error("its sealed file {path} is missing or unreadable ({source})")]
    Missing {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "its sealed file is {found} bytes, not the {recorded} recorded: it was cut or altered"
    )]
    Size { found: u64, recorded: u64 },
    #[error("{0}")]
    Open(#[from] OpenFileError),
    #[error("it opens to {found}, not the SHA-256 {recorded} recorded")]
    Digest { found: String, recorded: String },
    #[error(transparent)]
    Key(#[from] SnapshotCallError),
}

/// Reads the whole sealed file of `snapshot`: it must open with the
/// cluster's key into what the record says, ending with etcd's hash.
pub(crate) fn verify_file(
    app: &App,
    cluster: &Cluster,
    snapshot: &Snapshot,
) -> Result<(), FileProblem> {
    let uid = &snapshot.spec.cluster_uid;
    // What is checked is what the init machine is then sent.
    let path = snapshots::local_copy(app, snapshot, true)?;
    let missing = |source| FileProblem::Missing {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(&path).map_err(missing)?;
    let found = file.metadata().map_err(missing)?.len();
    if found != snapshot.status.sealed_size {
        return Err(FileProblem::Size {
            found,
            recorded: snapshot.status.sealed_size,
        });
    }
    let key = snapshots::cluster_key(app, cluster)?;
    let digest = open_stream(
        &key,
        &snapshot.metadata.name,
        uid,
        &mut std::io::BufReader::new(file),
        &mut std::io::sink(),
    )?;
    if digest.sha256 != snapshot.status.sha256 || digest.size != snapshot.status.size {
        return Err(FileProblem::Digest {
            found: format!("{} bytes with SHA-256 {}", digest.size, digest.sha256),
            recorded: snapshot.status.sha256.clone(),
        });
    }
    Ok(())
}

/// Asks for the restore of cluster `name` (`POST
/// /v1/clusters/{name}/restore`): checks, then records it on the status,
/// which the reconciler carries out. The cluster as recorded.
pub fn request(
    app: &App,
    name: &str,
    req: &RestoreRequest,
    by: &str,
) -> Result<Cluster, RestoreError> {
    let not_found = || RestoreError::NotFound {
        kind: "cluster",
        name: name.to_owned(),
    };
    let cluster = app.cluster(name)?.ok_or_else(not_found)?;
    let snapshot = check(app, &cluster, req)?;
    if cluster.status.restore.is_some() {
        return Ok(cluster);
    }
    let uid = cluster.metadata.uid.clone();
    let own = uid.as_deref().unwrap_or_default();
    let replaced = control_planes(&app.cluster_machines(own)?, own);
    let now = drover_common::now();
    let updated = app.update_cluster::<RestoreError>(name, |c| {
        if c.metadata.uid != uid {
            return Err(not_found());
        }
        if c.status.restore.is_some() {
            return Ok(false);
        }
        begin(c, &snapshot, &replaced, req.force, by, now);
        Ok(true)
    })?;
    updated.ok_or_else(not_found)
}

/// Records the restore of `snapshot` on `cluster`'s status: what the
/// control planes of before reported (etcd members, Nodes, the operations
/// asked of them) is forgotten, and the cluster is no longer initialized,
/// so that the planner removes the old control planes and creates an init
/// machine, which restores the snapshot.
fn begin(
    cluster: &mut Cluster,
    snapshot: &Snapshot,
    replaced: &[String],
    forced: bool,
    by: &str,
    now: time::OffsetDateTime,
) {
    let s = &mut cluster.status;
    s.restore = Some(ClusterRestore {
        snapshot: snapshot.metadata.name.clone(),
        revision: snapshot.status.revision,
        requested_at: now,
        requested_by: by.to_owned(),
        forced,
        replaced: replaced.to_vec(),
        machine: None,
        source: None,
    });
    s.initialized = false;
    s.init_machine = None;
    s.etcd_members.clear();
    s.etcd_reported_by = None;
    s.etcd_reported_at = None;
    s.nodes.clear();
    s.node_removal = None;
    s.etcd_removal = None;
    s.drain = None;
    s.endpoint_ready = None;
    s.certificate_renewal = None;
    s.version_update = None;
    s.addon_apply = None;
    s.snapshot = None;
    s.snapshot_requested_at = None;
}

/// The sealed file of snapshot `name` for `machine`, which must be the
/// init machine restoring it.
pub fn file_for(
    app: &App,
    machine: &Machine,
    name: &str,
) -> Result<std::path::PathBuf, RestoreError> {
    let refused = |why: &str| {
        RestoreError::Refused(format!(
            "machine {} may not read snapshot {name}: {why}",
            machine.metadata.name
        ))
    };
    let a = machine
        .spec
        .assignment
        .as_ref()
        .ok_or_else(|| refused("it is in no cluster"))?;
    let cluster = app
        .cluster(&a.cluster)?
        .filter(|c| c.metadata.uid.as_deref() == Some(a.cluster_uid.as_str()))
        .ok_or_else(|| refused("its cluster is gone"))?;
    let restoring = cluster
        .status
        .restore
        .as_ref()
        .filter(|r| r.snapshot == name)
        .filter(|_| {
            a.role == drover_common::api::MachineRole::Init
                && cluster.status.init_machine.as_deref() == Some(machine.metadata.name.as_str())
        });
    let Some(restore) = restoring else {
        return Err(refused(
            "only the init machine of a cluster being restored from it reads a snapshot",
        ));
    };
    // A drill cluster restores a snapshot of the cluster it drills.
    let owner = restore.snapshot_uid(&a.cluster_uid);
    let snapshot = app
        .store
        .get_json::<Snapshot>(crate::store::Kind::Snapshot, name)?
        .map(|(s, _)| s)
        .filter(|s| s.spec.cluster_uid == owner)
        .ok_or_else(|| refused("it is not one of its cluster's snapshots"))?;
    Ok(snapshots::local_copy(app, &snapshot, false)?)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use drover_common::api::{
        MachineRole, ObjectMeta, SnapshotSpec, SnapshotStatus, SnapshotTrigger,
    };
    use drover_common::snapshot::Sealer;
    use drover_planner::fixtures::{docker_cluster, docker_load_balancer, running};
    use sha2::{Digest, Sha256};

    use crate::store::Kind;

    pub(crate) const SNAP: &str = "c-20261128-010000";

    /// Docker cluster `c` (uid `cu`), initialized, stored, with snapshot
    /// `SNAP` of it saved at `version`: its record and sealed file. The
    /// cluster as stored.
    pub(crate) fn with_snapshot(app: &App, version: &str) -> Cluster {
        let mut c = docker_cluster(1, 1);
        c.status.load_balancer = Some(docker_load_balancer(&[]));
        c.status.initialized = true;
        c.status.init_machine = Some("cp".into());
        app.store.create_json(Kind::Cluster, "c", &c).unwrap();
        let key = snapshots::cluster_key(app, &c).unwrap();
        // An etcd snapshot ends with the SHA-256 of what comes before.
        let mut plain = vec![7u8; 5000];
        let hash = Sha256::digest(&plain);
        plain.extend_from_slice(&hash);
        let (mut sealer, mut sealed) = Sealer::new(&key, "c", "cu", SNAP);
        sealer.update(&plain, &mut sealed).unwrap();
        let digest = sealer.finish(&mut sealed).unwrap();
        let path = snapshots::file_of(app, "cu", SNAP);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &sealed).unwrap();
        let record = Snapshot {
            api_version: drover_common::API_VERSION.into(),
            kind: "Snapshot".into(),
            metadata: ObjectMeta {
                name: SNAP.into(),
                ..Default::default()
            },
            spec: SnapshotSpec {
                cluster: "c".into(),
                cluster_uid: "cu".into(),
                trigger: SnapshotTrigger::Manual,
                kubernetes_version: version.into(),
                machine: "cp".into(),
                destination: "coordinator".into(),
                s3: None,
            },
            status: SnapshotStatus {
                saved_at: drover_common::now(),
                revision: 77,
                size: digest.size,
                sha256: digest.sha256,
                sealed_size: sealed.len() as u64,
                sealed_sha256: hex::encode(Sha256::digest(&sealed)),
                etcd_version: "3.4.23".into(),
            },
        };
        app.store
            .create_json(Kind::Snapshot, SNAP, &record)
            .unwrap();
        app.cluster("c").unwrap().unwrap()
    }

    fn refused(e: RestoreError) -> String {
        match e {
            RestoreError::Refused(why) => why,
            e => panic!("not a refusal: {e}"),
        }
    }

    fn unusable(e: RestoreError) -> String {
        match e {
            e @ RestoreError::Unusable { .. } => e.to_string(),
            e => panic!("not an unusable snapshot: {e}"),
        }
    }

    #[tokio::test]
    async fn every_check_passes_before_anything_changes_and_a_restore_cannot_be_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let app = App::for_tests(dir.path());
        let c = with_snapshot(&app, "v1.31.2");
        let newest = RestoreRequest::default();
        assert_eq!(check(&app, &c, &newest).unwrap().metadata.name, SNAP);

        // A snapshot from a newer version, or of another cluster of the
        // same name, is not restored.
        let mut older = c.clone();
        older.spec.kubernetes_version = "v1.30.4".into();
        let why = unusable(check(&app, &older, &newest).unwrap_err());
        assert!(why.contains("newer than the cluster's v1.30.4"), "{why}");
        let mut other = c.clone();
        other.metadata.uid = Some("another".into());
        let named = RestoreRequest {
            snapshot: Some(SNAP.into()),
            ..Default::default()
        };
        let why = unusable(check(&app, &other, &named).unwrap_err());
        assert!(why.contains("another cluster of the same name"), "{why}");
        // The newest of its own: it has none.
        let why = refused(check(&app, &other, &newest).unwrap_err());
        assert!(why.contains("no snapshot to restore"), "{why}");
        // Nor is one whose endpoint is its first control plane's address.
        let mut unstable = c.clone();
        unstable.status.load_balancer = None;
        let why = refused(check(&app, &unstable, &newest).unwrap_err());
        assert!(why.contains("outlives every machine"), "{why}");
        // Nor one never initialized.
        let mut fresh = c.clone();
        fresh.status.initialized = false;
        assert!(refused(check(&app, &fresh, &newest).unwrap_err()).contains("nothing to restore"));
        // Another cluster's healthy control plane does not count ...
        let mut x = running("x", "control-plane", MachineRole::Init);
        x.spec.assignment.as_mut().unwrap().cluster_uid = "other".into();
        app.store.create_json(Kind::Machine, "x", &x).unwrap();
        check(&app, &c, &newest).unwrap();
        // ... its own stops it, unless forced.
        let cp = running("cp", "control-plane", MachineRole::Init);
        app.store.create_json(Kind::Machine, "cp", &cp).unwrap();
        let why = refused(check(&app, &c, &newest).unwrap_err());
        assert!(
            why.contains("1 healthy control plane(s) (cp)") && why.contains("--force"),
            "{why}"
        );
        let forced = RestoreRequest {
            snapshot: Some(SNAP.into()),
            force: true,
            into: None,
        };
        check(&app, &c, &forced).unwrap();
        // A file cut short is found before anything is torn down.
        let path = snapshots::file_of(&app, "cu", SNAP);
        let whole = std::fs::read(&path).unwrap();
        std::fs::write(&path, &whole[..whole.len() - 20]).unwrap();
        let why = unusable(check(&app, &c, &forced).unwrap_err());
        assert!(why.contains("nothing was torn down"), "{why}");
        assert!(app.cluster("c").unwrap().unwrap().status.restore.is_none());
        std::fs::write(&path, &whole).unwrap();

        // Recorded: the cluster is not initialized, what the old control
        // plane reported is forgotten, the old control plane is named.
        let recorded = request(&app, "c", &forced, "admin").unwrap();
        let r = recorded.status.restore.as_ref().unwrap();
        assert_eq!(
            (r.snapshot.as_str(), r.revision, r.forced),
            (SNAP, 77, true)
        );
        assert_eq!(r.replaced, vec!["cp".to_string()]);
        assert!(!recorded.status.initialized && recorded.status.init_machine.is_none());
        // Asked again: the same restore; another snapshot: refused.
        let again = request(&app, "c", &forced, "admin").unwrap();
        assert_eq!(again.status.restore, recorded.status.restore);
        let another = RestoreRequest {
            snapshot: Some("c-20261128-020000".into()),
            force: true,
            into: None,
        };
        let why = refused(request(&app, "c", &another, "admin").unwrap_err());
        assert!(why.contains("cannot be withdrawn or replaced"), "{why}");

        // Only the restoring init machine reads the sealed file.
        let why = file_for(&app, &cp, SNAP).unwrap_err().to_string();
        assert!(why.contains("only the init machine"), "{why}");
        app.update_cluster::<StoreError>("c", |c| {
            c.status.init_machine = Some("n".into());
            Ok(true)
        })
        .unwrap();
        let n = running("n", "control-plane", MachineRole::Init);
        assert_eq!(file_for(&app, &n, SNAP).unwrap(), path);
        assert!(file_for(&app, &n, "c-other").is_err());
    }
}
