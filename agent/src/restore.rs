//! Restoring the cluster's etcd before `kubeadm init`, on the init machine
//! of a cluster being restored (its bundle's `restore`): the sealed
//! snapshot is fetched from the coordinator into the agent's state
//! directory, opened with the cluster's snapshot key (it must be that
//! cluster's, whole, and end with etcd's own hash) and checked against the
//! SHA-256 recorded when it was saved, then `etcdctl snapshot restore`
//! makes a new one-member etcd of it in kubeadm's etcd data directory. Both
//! files are removed whatever happens; nothing is in the clear on the
//! machine but the database etcdctl reads and the data it makes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_common::snapshot::{open_stream, SnapshotKey};
use drover_common::wire::EtcdRestore;

use crate::api::CoordinatorClient;
use crate::command::{self, CommandOutcome};

/// How long fetching the sealed snapshot may take.
pub const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The etcdctl that restores (Debian's etcd-client; on `PATH`).
pub const ETCDCTL: &str = "etcdctl";

/// Why the snapshot was not restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("cannot fetch snapshot {snapshot} from the coordinator: {detail}")]
    Fetch { snapshot: String, detail: String },
    #[error("snapshot {snapshot} does not restore: {detail}")]
    Open { snapshot: String, detail: String },
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{command} failed (exit {exit_code:?}): {output}")]
    Etcdctl {
        command: String,
        exit_code: Option<i32>,
        output: String,
    },
}

/// Files removed when dropped.
struct Scratch(Vec<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Restores `r` into its data directory under `root`; what was restored.
pub async fn restore(
    api: &CoordinatorClient,
    r: &EtcdRestore,
    root: &Path,
    dir: &Path,
    etcdctl: &str,
) -> Result<String, RestoreError> {
    let io = |action: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| RestoreError::Io {
            action,
            path,
            source,
        }
    };
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let sealed = dir.join(format!("{}.restore.drvsnap", r.snapshot));
    let db = dir.join(format!("{}.restore.db", r.snapshot));
    let _scratch = Scratch(vec![sealed.clone(), db.clone()]);
    let fetched = api
        .download_snapshot(&r.path(), &sealed, DOWNLOAD_TIMEOUT)
        .await
        .map_err(|e| RestoreError::Fetch {
            snapshot: r.snapshot.clone(),
            detail: e.to_string(),
        })?;
    tracing::info!(snapshot = %r.snapshot, bytes = fetched, "sealed snapshot fetched; opening it");
    let opened = {
        let (r, sealed, db) = (r.clone(), sealed.clone(), db.clone());
        tokio::task::spawn_blocking(move || open_into(&r, &sealed, &db))
            .await
            .map_err(|e| RestoreError::Open {
                snapshot: "?".into(),
                detail: e.to_string(),
            })??
    };
    let data_dir = root.join(r.data_dir.trim_start_matches('/'));
    // This machine has not run `kubeadm init`: anything in etcd's data
    // directory is what an earlier attempt of this restore left.
    if data_dir.exists() {
        tracing::warn!(path = %data_dir.display(), "removing what an earlier restore attempt left in etcd's data directory");
        std::fs::remove_dir_all(&data_dir).map_err(io("remove", &data_dir))?;
    }
    if let Some(parent) = data_dir.parent() {
        std::fs::create_dir_all(parent).map_err(io("create", parent))?;
    }
    let spec =
        command::etcdctl_snapshot_restore(etcdctl, &db, &r.member_name, &r.peer_url, &data_dir);
    let outcome: CommandOutcome = command::run(&spec, command::OUTPUT_TAIL_LINES).await;
    if !outcome.success {
        return Err(RestoreError::Etcdctl {
            command: outcome.command,
            exit_code: outcome.exit_code,
            output: outcome.output_tail.join("\n"),
        });
    }
    Ok(format!(
        "etcd restored from snapshot {} (revision {}, {} bytes, sha256 {}) into {} as the one member {} ({})",
        r.snapshot,
        r.revision,
        opened,
        r.sha256,
        r.data_dir,
        r.member_name,
        r.peer_url
    ))
}

/// Opens the sealed file into `db`, checked against the record; its size.
fn open_into(r: &EtcdRestore, sealed: &Path, db: &Path) -> Result<u64, RestoreError> {
    let failed = |detail: String| RestoreError::Open {
        snapshot: r.snapshot.clone(),
        detail,
    };
    let key = SnapshotKey::from_base64(&r.key).map_err(|e| failed(e.to_string()))?;
    let input = std::fs::File::open(sealed).map_err(|e| failed(format!("cannot read it: {e}")))?;
    let output = std::fs::File::create(db).map_err(|e| failed(format!("cannot write it: {e}")))?;
    let mut out = std::io::BufWriter::new(output);
    let digest = open_stream(
        &key,
        &r.snapshot,
        &r.cluster_uid,
        &mut std::io::BufReader::new(input),
        &mut out,
    )
    .map_err(|e| failed(e.to_string()))?;
    let file = out
        .into_inner()
        .map_err(|e| failed(format!("cannot write it: {e}")))?;
    file.sync_all()
        .map_err(|e| failed(format!("cannot write it: {e}")))?;
    if digest.sha256 != r.sha256 || digest.size != r.size {
        return Err(failed(format!(
            "it opens to {} bytes with SHA-256 {}, not the {} bytes with SHA-256 {} recorded when it was saved",
            digest.size, digest.sha256, r.size, r.sha256
        )));
    }
    Ok(digest.size)
}
