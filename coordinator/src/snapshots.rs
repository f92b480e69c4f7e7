//! Clusters' etcd snapshots on the coordinator: each cluster's snapshot key
//! (a sealed `Secret` record, made on first use), the grant a control
//! plane asked for a snapshot gets, the sealed files under
//! `DATA_DIR/snapshots/<cluster UID>/`, the `Snapshot` records and their
//! retention.
//!
//! Invariants: a machine is served only the snapshot its cluster's status
//! asks of it (name and machine); a `Snapshot` record is written only once
//! the sealed file is in place whole, with the size and SHA-256 the machine
//! reported; the coordinator never holds a snapshot in the clear.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use drover_common::api::{
    to_prune, Cluster, Machine, ObjectMeta, Snapshot, SnapshotRef, SnapshotSave, SnapshotSpec,
    SnapshotStatus,
};
use drover_common::snapshot::SnapshotKey;
use drover_common::wire::{SnapshotGrant, SnapshotSaved, SnapshotUpload, SNAPSHOT_PATH};
use sha2::{Digest, Sha256};

use crate::app::App;
use crate::domain::etcd_restore::key_record;
use crate::provider::s3::{S3Error, S3Objects};
use crate::store::{Kind, Span, StoreError};

/// The largest sealed snapshot the coordinator takes (etcd's own database
/// is limited to 8 GiB by default, `--quota-backend-bytes`).
pub const MAX_SEALED_BYTES: u64 = 16 << 30;

/// Why a snapshot call of a machine was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotCallError {
    #[error(
        "machine {machine} is in no cluster; only a cluster's control plane saves its snapshots"
    )]
    NotAssigned { machine: String },
    #[error("machine {machine} was not asked for snapshot {snapshot}: {detail}")]
    NotAsked {
        machine: String,
        snapshot: String,
        detail: String,
    },
    #[error(
        "snapshot {snapshot} is larger than the {MAX_SEALED_BYTES} bytes the coordinator takes"
    )]
    TooLarge { snapshot: String },
    #[error("snapshot {snapshot}: {detail}")]
    Mismatch { snapshot: String, detail: String },
    #[error("snapshot {snapshot} was not uploaded here (no sealed file at {path})")]
    NotUploaded { snapshot: String, path: PathBuf },
    #[error("snapshot {snapshot}: the upload broke off: {detail}")]
    Upload { snapshot: String, detail: String },
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the snapshot key of cluster {cluster} is unreadable: {detail}")]
    Key { cluster: String, detail: String },
    #[error("snapshot storage: cannot {0}")]
    Storage(#[from] S3Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

type Result<T, E = SnapshotCallError> = std::result::Result<T, E>;

/// Cluster `cluster`'s snapshot key, made and stored on first use.
pub fn cluster_key(app: &App, cluster: &Cluster) -> Result<SnapshotKey> {
    let uid = cluster.metadata.uid.as_deref().unwrap_or_default();
    let name = key_record(uid);
    let bad = |detail: String| SnapshotCallError::Key {
        cluster: cluster.metadata.name.clone(),
        detail,
    };
    for _ in 0..2 {
        if let Some((text, _)) = app.store.get_json::<String>(Kind::Secret, &name)? {
            return SnapshotKey::from_base64(&text).map_err(|e| bad(e.to_string()));
        }
        let key = SnapshotKey::generate();
        match app.store.create_json(Kind::Secret, &name, &key.to_base64()) {
            Ok(_) => return Ok(key),
            // Another request made it first: read that one.
            Err(StoreError::AlreadyExists { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(bad("it was made and is not found".into()))
}

/// The S3 calls of the coordinator (blocking: see `provider/s3.rs`).
pub fn s3(app: &App) -> S3Objects {
    app.providers.s3()
}

/// The S3 object snapshot `name` of `cluster` goes to, when the cluster's
/// `spec.backup.destination` is a bucket.
pub fn s3_object(cluster: &Cluster, name: &str) -> Option<drover_common::api::S3Object> {
    let dest = cluster
        .spec
        .backup
        .as_ref()?
        .destination
        .as_ref()?
        .s3
        .as_ref()?;
    Some(dest.object(cluster.metadata.uid.as_deref().unwrap_or_default(), name))
}

/// Makes sure the coordinator holds the sealed file of `snapshot` at
/// [`file_of`]: when it went to an S3 object, fetches it (again if
/// `refresh`, else only when there is no copy yet). The copy stays until
/// retention or the cluster's deletion removes it with the object. The
/// path.
pub fn local_copy(app: &App, snapshot: &Snapshot, refresh: bool) -> Result<PathBuf> {
    let path = file_of(app, &snapshot.spec.cluster_uid, &snapshot.metadata.name);
    if let Some(object) = snapshot
        .spec
        .s3
        .as_ref()
        .filter(|_| refresh || !path.exists())
    {
        let len = s3(app).fetch(object, &path)?;
        tracing::info!(snapshot = %snapshot.metadata.name, %object, bytes = len, "sealed snapshot fetched from its bucket");
    }
    Ok(path)
}

/// Where the sealed file of snapshot `name` of cluster `uid` is kept.
pub fn file_of(app: &App, uid: &str, name: &str) -> PathBuf {
    app.settings
        .snapshot_dir
        .join(uid)
        .join(format!("{name}.drvsnap"))
}

/// The cluster of `machine` and the snapshot `name` its status asks of it.
fn asked(app: &App, machine: &Machine, name: &str) -> Result<(Cluster, SnapshotSave)> {
    let me = &machine.metadata.name;
    let a = machine
        .spec
        .assignment
        .as_ref()
        .ok_or_else(|| SnapshotCallError::NotAssigned {
            machine: me.clone(),
        })?;
    let not_asked = |detail: String| SnapshotCallError::NotAsked {
        machine: me.clone(),
        snapshot: name.to_owned(),
        detail,
    };
    let cluster = app
        .cluster(&a.cluster)?
        .filter(|c| c.metadata.uid.as_deref() == Some(a.cluster_uid.as_str()))
        .ok_or_else(|| not_asked(format!("its cluster {} is gone", a.cluster)))?;
    let op = match &cluster.status.snapshot {
        Some(op) if op.name == name && op.via == *me && op.under_way() => op.clone(),
        Some(op) if op.name == name && op.via == *me => {
            return Err(not_asked(format!(
                "it was given up at {}: {}",
                op.failed_at.map(|t| t.to_string()).unwrap_or_default(),
                op.error
            )))
        }
        Some(op) => {
            return Err(not_asked(format!(
                "cluster {} asks {} of {}",
                a.cluster, op.name, op.via
            )))
        }
        None => {
            return Err(not_asked(format!(
                "cluster {} asks for no snapshot now",
                a.cluster
            )))
        }
    };
    Ok((cluster, op))
}

/// `GET /v1/machine/snapshots/{name}`: the grant of the machine asked to
/// save snapshot `name`.
pub fn grant(app: &App, machine: &Machine, name: &str) -> Result<SnapshotGrant> {
    let (cluster, op) = asked(app, machine, name)?;
    let key = cluster_key(app, &cluster)?;
    let upload = match s3_object(&cluster, &op.name) {
        Some(object) => SnapshotUpload::Presigned {
            url: s3(app).presign_put(&object)?,
        },
        None => SnapshotUpload::Coordinator {
            path: format!("{SNAPSHOT_PATH}/{}/data", op.name),
        },
    };
    Ok(SnapshotGrant {
        snapshot: op.name.clone(),
        cluster: cluster.metadata.name.clone(),
        cluster_uid: cluster.metadata.uid.clone().unwrap_or_default(),
        key: key.to_base64(),
        upload,
    })
}

/// Where an upload is written before it is whole.
fn partial(path: &Path) -> PathBuf {
    path.with_extension("drvsnap.part")
}

/// The receiving end of `PUT /v1/machine/snapshots/{name}/data`: checks
/// that the machine was asked for it and opens the partial file.
pub struct Upload {
    snapshot: String,
    path: PathBuf,
    file: std::fs::File,
    hash: Sha256,
    len: u64,
}

impl Upload {
    pub fn start(app: &App, machine: &Machine, name: &str) -> Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let (cluster, op) = asked(app, machine, name)?;
        let uid = cluster.metadata.uid.unwrap_or_default();
        let path = file_of(app, &uid, &op.name);
        let dir = path.parent().map(Path::to_owned).unwrap_or_default();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| SnapshotCallError::Io {
                action: "create",
                path: dir.clone(),
                source,
            })?;
        let part = partial(&path);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&part)
            .map_err(|source| SnapshotCallError::Io {
                action: "create",
                path: part.clone(),
                source,
            })?;
        Ok(Self {
            snapshot: op.name,
            path,
            file,
            hash: Sha256::new(),
            len: 0,
        })
    }

    /// Writes the next bytes of the upload.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.len += bytes.len() as u64;
        if self.len > MAX_SEALED_BYTES {
            return Err(SnapshotCallError::TooLarge {
                snapshot: self.snapshot.clone(),
            });
        }
        self.hash.update(bytes);
        self.file
            .write_all(bytes)
            .map_err(|source| SnapshotCallError::Io {
                action: "write",
                path: partial(&self.path),
                source,
            })
    }

    /// The upload is whole: checks it against the SHA-256 the machine sent
    /// (`expected`), then syncs it and moves it into place. Its size.
    pub fn finish(self, expected: Option<&str>) -> Result<u64> {
        let part = partial(&self.path);
        let got = hex::encode(self.hash.finalize());
        if let Some(want) = expected.filter(|w| !w.eq_ignore_ascii_case(&got)) {
            let _ = std::fs::remove_file(&part);
            return Err(SnapshotCallError::Mismatch {
                snapshot: self.snapshot,
                detail: format!(
                    "the body's SHA-256 is {got}, the upload named {want}: it changed on the way; nothing was kept"
                ),
            });
        }
        let io = |action, source| SnapshotCallError::Io {
            action,
            path: part.clone(),
            source,
        };
        self.file.sync_all().map_err(|e| io("sync", e))?;
        std::fs::rename(&part, &self.path).map_err(|e| io("rename", e))?;
        Ok(self.len)
    }

    /// The upload broke off: the partial file goes.
    pub fn abandon(self) {
        let _ = std::fs::remove_file(partial(&self.path));
    }
}

/// `POST /v1/machine/snapshots/{name}`: the machine saved snapshot `name`
/// and uploaded it. Checks the sealed file against the report, records the
/// `Snapshot`, names it on the cluster's status and prunes what the
/// cluster's retention lets go. Blocking (it reads the whole file).
pub fn record(app: &App, machine: &Machine, name: &str, saved: &SnapshotSaved) -> Result<Snapshot> {
    let (cluster, op) = asked(app, machine, name)?;
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    let path = file_of(app, &uid, name);
    let mismatch = |detail: String| SnapshotCallError::Mismatch {
        snapshot: name.to_owned(),
        detail,
    };
    // Uploaded here, or (when the cluster's destination is a bucket and
    // nothing came here) to the bucket: S3 gives the size to check; the
    // content is checked whole before any restore (it is sealed, so an
    // altered object does not open).
    let object = s3_object(&cluster, name).filter(|_| !path.exists());
    if let Some(object) = &object {
        match s3(app).size(object)? {
            None => {
                return Err(SnapshotCallError::NotUploaded {
                    snapshot: name.to_owned(),
                    path: PathBuf::from(object.to_string()),
                })
            }
            Some(len) if len != saved.sealed_size => {
                return Err(mismatch(format!(
                    "the machine reports {} bytes; {object} holds {len}; upload it again",
                    saved.sealed_size
                )))
            }
            Some(_) => {}
        }
    } else {
        let (len, sha) = hash_file(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => SnapshotCallError::NotUploaded {
                snapshot: name.to_owned(),
                path: path.clone(),
            },
            _ => SnapshotCallError::Io {
                action: "read",
                path: path.clone(),
                source,
            },
        })?;
        if len != saved.sealed_size || !sha.eq_ignore_ascii_case(&saved.sealed_sha256) {
            return Err(mismatch(format!(
                "the machine reports {} bytes with SHA-256 {}; the coordinator holds {len} bytes with SHA-256 {sha}; upload it again",
                saved.sealed_size, saved.sealed_sha256
            )));
        }
    }
    let now = drover_common::now();
    let snapshot = Snapshot {
        api_version: drover_common::API_VERSION.to_owned(),
        kind: "Snapshot".to_owned(),
        metadata: ObjectMeta {
            name: name.to_owned(),
            creation_timestamp: Some(now),
            labels: [(
                "drover.dev/cluster".to_owned(),
                cluster.metadata.name.clone(),
            )]
            .into(),
            ..Default::default()
        },
        spec: SnapshotSpec {
            cluster: cluster.metadata.name.clone(),
            cluster_uid: uid.clone(),
            trigger: op.trigger,
            kubernetes_version: cluster.spec.kubernetes_version.clone(),
            machine: machine.metadata.name.clone(),
            destination: object
                .as_ref()
                .map_or_else(|| "coordinator".to_owned(), ToString::to_string),
            s3: object,
        },
        status: SnapshotStatus {
            saved_at: now,
            revision: saved.revision,
            size: saved.size,
            sha256: saved.sha256.clone(),
            sealed_size: saved.sealed_size,
            sealed_sha256: saved.sealed_sha256.clone(),
            etcd_version: saved.etcd_version.clone(),
        },
    };
    match app.store.create_json(Kind::Snapshot, name, &snapshot) {
        Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let last = SnapshotRef {
        name: name.to_owned(),
        saved_at: now,
        revision: saved.revision,
        size: saved.size,
    };
    app.update_cluster::<SnapshotCallError>(&cluster.metadata.name, |c| {
        if c.metadata.uid.as_deref() != Some(uid.as_str()) {
            return Ok(false);
        }
        if let Some(op) = c.status.snapshot.take_if(|s| s.name == name) {
            // The change it was taken before may go ahead.
            if op.before.is_some() {
                c.status.snapshot_taken_before = op.before;
            }
        }
        let newer = c
            .status
            .last_snapshot
            .as_ref()
            .is_some_and(|l| l.saved_at > now);
        if !newer {
            c.status.last_snapshot = Some(last.clone());
        }
        Ok(true)
    })?;
    tracing::info!(
        cluster = %cluster.metadata.name,
        snapshot = %name,
        machine = %machine.metadata.name,
        revision = saved.revision,
        size = saved.size,
        "etcd snapshot saved"
    );
    app.reconcile_cluster(&cluster.metadata.name);
    prune(app, &cluster)?;
    Ok(snapshot)
}

/// The length and SHA-256 (hex) of the file at `path`.
fn hash_file(path: &Path) -> std::io::Result<(u64, String)> {
    let mut file = std::fs::File::open(path)?;
    let mut hash = Sha256::new();
    let len = std::io::copy(&mut file, &mut hash)?;
    Ok((len, hex::encode(hash.finalize())))
}

/// The snapshots of `cluster` (by its name and UID), oldest first.
pub fn snapshots_of(app: &App, cluster: &str, uid: &str) -> Result<Vec<Snapshot>, StoreError> {
    let prefix = format!("{cluster}-");
    let mut after = prefix.clone();
    let mut out = vec![];
    loop {
        let page = app.store.list_json_page::<Snapshot>(
            Kind::Snapshot,
            Span {
                after: &after,
                limit: Some(500),
            },
        )?;
        let full = page.len() == 500;
        let mut past = false;
        for (s, _) in page {
            if !s.metadata.name.starts_with(&prefix) {
                past = true;
                break;
            }
            after.clone_from(&s.metadata.name);
            if s.spec.cluster_uid == uid {
                out.push(s);
            }
        }
        if past || !full {
            break;
        }
    }
    out.sort_by_key(|s| s.status.saved_at);
    Ok(out)
}

/// Deletes the snapshots of `cluster` its retention lets go, record first
/// (a file without a record is removed again by the next prune's sweep).
pub fn prune(app: &App, cluster: &Cluster) -> Result<Vec<String>> {
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    let keep = cluster
        .spec
        .backup
        .as_ref()
        .map(|b| b.keep.clone())
        .unwrap_or_default();
    let all = snapshots_of(app, &cluster.metadata.name, &uid)?;
    let saved: Vec<(String, time::OffsetDateTime)> = all
        .iter()
        .map(|s| (s.metadata.name.clone(), s.status.saved_at))
        .collect();
    // The snapshot a restore or a drill under way reads stays, whatever
    // retention says.
    let restoring = cluster.status.restore.as_ref().map(|r| r.snapshot.as_str());
    let drilling = cluster.status.drill.as_ref().map(|d| d.snapshot.as_str());
    let gone: Vec<String> = to_prune(&saved, &keep)
        .into_iter()
        .filter(|n| Some(n.as_str()) != restoring && Some(n.as_str()) != drilling)
        .collect();
    let mut pruned = Vec::with_capacity(gone.len());
    for name in &gone {
        // The object first: a record whose object could not be deleted
        // stays, and the next prune tries again.
        let object = all
            .iter()
            .find(|s| s.metadata.name == *name)
            .and_then(|s| s.spec.s3.as_ref());
        if let Some(object) = object {
            if let Err(e) = s3(app).delete(object) {
                tracing::warn!(cluster = %cluster.metadata.name, snapshot = %name, error = %e, "cannot delete a pruned snapshot's object; retention tries again after the next snapshot");
                continue;
            }
        }
        match app.store.delete(Kind::Snapshot, name, None) {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        pruned.push(name.clone());
        let path = file_of(app, &uid, name);
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(cluster = %cluster.metadata.name, snapshot = %name, path = %path.display(), error = %e, "cannot remove a pruned snapshot's file");
            }
        }
        tracing::info!(cluster = %cluster.metadata.name, snapshot = %name, "etcd snapshot pruned by the cluster's retention");
    }
    Ok(pruned)
}

/// Forgets everything of the snapshots of deleted cluster `cluster` (UID
/// `uid`): records, files, objects in buckets and key. An object that
/// cannot be deleted is left (and logged) rather than keep the cluster
/// from going.
pub fn forget_cluster(app: &App, cluster: &str, uid: &str) -> Result<()> {
    for s in snapshots_of(app, cluster, uid)? {
        if let Some(object) = &s.spec.s3 {
            if let Err(e) = s3(app).delete(object) {
                tracing::warn!(%cluster, snapshot = %s.metadata.name, error = %e, "cannot delete the snapshot's object of a deleted cluster; delete it by hand");
            }
        }
        match app.store.delete(Kind::Snapshot, &s.metadata.name, None) {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    match app.store.delete(Kind::Secret, &key_record(uid), None) {
        Ok(_) | Err(StoreError::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let dir = app.settings.snapshot_dir.join(uid);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SnapshotCallError::Io {
            action: "remove",
            path: dir,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::{MachineRole, Retention, SnapshotTrigger};
    use drover_planner::fixtures::{pool_cluster, running};

    /// Pool cluster `c` (uid `cu`) whose status asks `cp` for snapshot
    /// `name` (before its upgrade to v1.32.0), and its running control
    /// plane `cp` and worker `w`.
    fn asking(app: &App, name: &str, keep_last: u32) -> (Machine, Machine) {
        let mut c = pool_cluster(1, 1);
        c.spec.backup = Some(drover_common::api::BackupSpec {
            every: None,
            keep: Retention {
                last: keep_last,
                daily: 0,
            },
            ..Default::default()
        });
        c.status.initialized = true;
        c.status.snapshot = Some(SnapshotSave {
            name: name.into(),
            via: "cp".into(),
            trigger: SnapshotTrigger::BeforeUpgrade,
            before: Some("upgrade to v1.32.0".into()),
            requested_at: drover_common::now(),
            failed_at: None,
            error: String::new(),
        });
        match app.store.get_json::<Cluster>(Kind::Cluster, "c").unwrap() {
            None => {
                app.store.create_json(Kind::Cluster, "c", &c).unwrap();
            }
            Some((stored, rev)) => {
                let mut next = stored;
                next.status.snapshot = c.status.snapshot.clone();
                next.spec.backup = c.spec.backup.clone();
                app.store
                    .update_json(Kind::Cluster, "c", &next, Some(rev))
                    .unwrap();
            }
        }
        let cp = running("cp", "control-plane", MachineRole::Init);
        let w = running("w", "w", MachineRole::Worker);
        (cp, w)
    }

    fn upload(app: &App, cp: &Machine, name: &str, body: &[u8]) -> Result<u64> {
        let mut up = Upload::start(app, cp, name)?;
        for piece in body.chunks(1000) {
            up.write(piece)?;
        }
        up.finish(Some(&hex::encode(Sha256::digest(body))))
    }

    fn saved_of(body: &[u8]) -> SnapshotSaved {
        SnapshotSaved {
            size: 5000,
            sha256: "ab".repeat(32),
            sealed_size: body.len() as u64,
            sealed_sha256: hex::encode(Sha256::digest(body)),
            revision: 77,
            etcd_version: "3.4.23".into(),
        }
    }

    #[tokio::test]
    async fn only_the_machine_asked_uploads_and_a_whole_matching_file_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let app = App::for_tests(dir.path());
        let (cp, w) = asking(&app, "c-20261128-010000", 24);

        // The grant: one key per cluster, the same every time.
        let grant = grant(&app, &cp, "c-20261128-010000").unwrap();
        assert_eq!(grant.cluster_uid, "cu");
        assert_eq!(
            grant.upload,
            SnapshotUpload::Coordinator {
                path: "/v1/machine/snapshots/c-20261128-010000/data".into()
            }
        );
        let again = super::grant(&app, &cp, "c-20261128-010000").unwrap();
        assert_eq!(grant.key, again.key);
        SnapshotKey::from_base64(&grant.key).unwrap();

        // Not the machine asked, not the snapshot asked.
        let err = super::grant(&app, &w, "c-20261128-010000").unwrap_err();
        assert!(
            err.to_string().contains("asks c-20261128-010000 of cp"),
            "{err}"
        );
        let err = super::grant(&app, &cp, "c-other").unwrap_err();
        assert!(matches!(err, SnapshotCallError::NotAsked { .. }), "{err}");

        // A body that changed on the way is not kept.
        let body = vec![7u8; 10_000];
        let mut up = Upload::start(&app, &cp, "c-20261128-010000").unwrap();
        up.write(&body).unwrap();
        let err = up.finish(Some(&"00".repeat(32))).unwrap_err();
        assert!(err.to_string().contains("nothing was kept"), "{err}");
        let path = file_of(&app, "cu", "c-20261128-010000");
        assert!(!path.exists() && !partial(&path).exists());
        // Reported before it was uploaded: refused.
        let err = record(&app, &cp, "c-20261128-010000", &saved_of(&body)).unwrap_err();
        assert!(
            matches!(err, SnapshotCallError::NotUploaded { .. }),
            "{err}"
        );

        assert_eq!(
            upload(&app, &cp, "c-20261128-010000", &body).unwrap(),
            10_000
        );
        // A report that does not match the file is refused.
        let mut wrong = saved_of(&body);
        wrong.sealed_size += 1;
        let err = record(&app, &cp, "c-20261128-010000", &wrong).unwrap_err();
        assert!(err.to_string().contains("upload it again"), "{err}");

        let snapshot = record(&app, &cp, "c-20261128-010000", &saved_of(&body)).unwrap();
        assert_eq!(snapshot.spec.cluster_uid, "cu");
        assert_eq!(snapshot.spec.machine, "cp");
        assert_eq!(snapshot.status.revision, 77);
        assert_eq!(snapshot.spec.trigger, SnapshotTrigger::BeforeUpgrade);
        let c = app.cluster("c").unwrap().unwrap();
        assert_eq!(c.status.snapshot, None, "no longer asked");
        assert_eq!(
            c.status.snapshot_taken_before.as_deref(),
            Some("upgrade to v1.32.0"),
            "the upgrade it was taken before may go ahead"
        );
        assert_eq!(
            c.status.last_snapshot.as_ref().map(|l| l.name.as_str()),
            Some("c-20261128-010000")
        );
        // Once recorded, it is no longer asked: a second upload is refused.
        let err = Upload::start(&app, &cp, "c-20261128-010000").err().unwrap();
        assert!(
            err.to_string().contains("asks for no snapshot now"),
            "{err}"
        );
        assert_eq!(snapshots_of(&app, "c", "cu").unwrap().len(), 1);
    }

    #[tokio::test]
    async fn retention_prunes_records_and_files_and_a_deleted_cluster_forgets_all() {
        let dir = tempfile::tempdir().unwrap();
        let app = App::for_tests(dir.path());
        let names = [
            "c-20261128-010000",
            "c-20261128-020000",
            "c-20261128-030000",
        ];
        for name in names {
            let (cp, _) = asking(&app, name, 2);
            grant(&app, &cp, name).unwrap();
            let body = name.as_bytes().repeat(100);
            upload(&app, &cp, name, &body).unwrap();
            record(&app, &cp, name, &saved_of(&body)).unwrap();
        }
        let kept: Vec<String> = snapshots_of(&app, "c", "cu")
            .unwrap()
            .into_iter()
            .map(|s| s.metadata.name)
            .collect();
        assert_eq!(kept, names[1..], "the newest 2");
        // Pages of the whole list, by name (GET /v1/snapshots?limit=).
        let page = |after: &str| -> Vec<String> {
            let span = crate::store::Span {
                after,
                limit: Some(1),
            };
            let page = app.snapshots_page(span).unwrap();
            page.into_iter().map(|s| s.metadata.name).collect()
        };
        assert_eq!(page(""), names[1..2]);
        assert_eq!(page(names[1]), names[2..]);
        assert!(page(names[2]).is_empty());
        assert!(!file_of(&app, "cu", names[0]).exists());
        assert!(file_of(&app, "cu", names[2]).exists());
        assert!(app
            .store
            .get_json::<String>(Kind::Secret, "snapshot-key-cu")
            .unwrap()
            .is_some());

        forget_cluster(&app, "c", "cu").unwrap();
        assert!(snapshots_of(&app, "c", "cu").unwrap().is_empty());
        assert!(!app.settings.snapshot_dir.join("cu").exists());
        assert!(app
            .store
            .get_json::<String>(Kind::Secret, "snapshot-key-cu")
            .unwrap()
            .is_none());
    }
}
