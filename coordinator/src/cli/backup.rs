//! `drover backup --out FILE`: a backup of the coordinator's store, taken
//! while it serves, written to FILE; `drover backup cluster NAME`: an etcd
//! snapshot of a cluster, now (`--wait` until it is saved).

use std::path::PathBuf;

use anyhow::{bail, Context};

use crate::cli::client::{Client, ConnectArgs, Usage};
use crate::cli::render::Look;
use crate::cli::{cluster_action, wait_cluster};

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BackupArgs {
    #[command(subcommand)]
    pub what: Option<BackupOf>,
    /// Where to write the backup of the coordinator's store; it must not
    /// exist.
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum BackupOf {
    /// An etcd snapshot of a cluster, taken now by one of its running
    /// control planes and kept sealed by the coordinator (`drover get
    /// snapshots CLUSTER` lists them).
    Cluster(BackupClusterArgs),
}

#[derive(Debug, clap::Args)]
pub struct BackupClusterArgs {
    #[arg(value_parser = crate::cli::object_name)]
    pub name: String,
    /// Wait until the snapshot is saved, showing progress.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "10m", value_parser = drover_common::api::parse_duration)]
    pub timeout: std::time::Duration,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

pub(super) async fn backup(b: BackupArgs) -> anyhow::Result<()> {
    match (b.what, b.out) {
        (Some(BackupOf::Cluster(c)), _) => backup_cluster(c).await,
        (None, Some(out)) => backup_store(out, &b.conn).await,
        (None, None) => Err(Usage(
            "name what to back up: `drover backup --out FILE` (the coordinator's store) or `drover backup cluster NAME` (a cluster's etcd)".into(),
        )
        .into()),
    }
}

/// Asks for a snapshot of cluster `c.name`; with `--wait`, follows it until
/// it is saved or fails.
async fn backup_cluster(c: BackupClusterArgs) -> anyhow::Result<()> {
    let client = Client::connect(&c.conn)?;
    let name = &c.name;
    let asked = cluster_action(&client, name, &["snapshots"], &serde_json::json!({})).await?;
    // The coordinator's clock: the request, or the snapshot already asked.
    let since = asked.status.snapshot_requested_at.or(asked
        .status
        .snapshot
        .as_ref()
        .filter(|s| s.under_way())
        .map(|s| s.requested_at));
    let Some(since) = since else {
        bail!("the coordinator did not record the request for a snapshot of cluster {name}; ask again");
    };
    if !c.wait {
        println!("cluster/{name}: etcd snapshot requested (`drover get snapshots {name}` lists those saved)");
        return Ok(());
    }
    let saved = wait_cluster(
        &client,
        name,
        c.timeout,
        |cluster| {
            let s = cluster.status;
            if let Some(saved) = s.last_snapshot.filter(|l| l.saved_at >= since) {
                return Ok(Look::Done(saved));
            }
            Ok(Look::Waiting(match s.snapshot {
                Some(op) if op.requested_at >= since && !op.under_way() => bail!(
                    "snapshot {} of cluster {name} failed on {}: {}",
                    op.name,
                    op.via,
                    op.error
                ),
                Some(op) if op.requested_at >= since => {
                    format!("snapshot {} asked of {}", op.name, op.via)
                }
                _ => "waiting for a running control plane to ask".to_owned(),
            }))
        },
        |last| {
            anyhow::anyhow!(
                "no snapshot of cluster {name} was saved within {:?} ({last}); see `drover describe cluster {name}`",
                c.timeout
            )
        },
    )
    .await?;
    println!(
        "snapshot/{} saved: etcd revision {}, {} bytes",
        saved.name, saved.revision, saved.size
    );
    Ok(())
}

/// Takes the backup into a file beside `out`, then renames it to `out`,
/// so `out` is either a whole backup or absent.
async fn backup_store(out: PathBuf, conn: &ConnectArgs) -> anyhow::Result<()> {
    if out.exists() {
        return Err(Usage(format!(
            "--out {}: it exists; choose another file (a backup never overwrites one)",
            out.display()
        ))
        .into());
    }
    let client = Client::connect(conn)?;
    let name = out
        .file_name()
        .with_context(|| format!("--out {}: name a file", out.display()))?;
    let partial = out.with_file_name(format!(".{}.partial", name.to_string_lossy()));
    let headers = match client.download("/v1/backup", &partial).await {
        Ok(h) => h,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    std::fs::rename(&partial, &out)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), out.display()))?;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?")
            .to_owned()
    };
    let bytes = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    println!(
        "backup of store revision {} written to {} ({bytes} bytes; {})",
        header("drover-backup-revision"),
        out.display(),
        header("drover-backup-objects").replace(',', ", ")
    );
    println!(
        "It holds every secret sealed, not the encryption key that opens them (the coordinator's DATA_DIR/encryption.key or DROVER_ENCRYPTION_KEY): keep a copy of that key apart from the backup. Restore with `drover store restore --from {} --data-dir DIR`.",
        out.display()
    );
    Ok(())
}
