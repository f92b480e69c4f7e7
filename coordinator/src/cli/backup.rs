//! `drover backup --out FILE`: a backup of the coordinator's store, taken
//! while it serves, written to FILE.

use std::path::PathBuf;

use anyhow::Context;

use crate::cli::client::{Client, ConnectArgs};

#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// Where to write the backup; it must not exist.
    #[arg(long, short = 'o')]
    pub out: PathBuf,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// Takes the backup into a file beside FILE, then renames it to FILE, so
/// FILE is either a whole backup or absent.
pub(super) async fn backup(b: BackupArgs) -> anyhow::Result<()> {
    if b.out.exists() {
        return Err(crate::cli::client::Usage(format!(
            "--out {}: it exists; choose another file (a backup never overwrites one)",
            b.out.display()
        ))
        .into());
    }
    let client = Client::connect(&b.conn)?;
    let name = b
        .out
        .file_name()
        .with_context(|| format!("--out {}: name a file", b.out.display()))?;
    let partial = b
        .out
        .with_file_name(format!(".{}.partial", name.to_string_lossy()));
    let headers = match client.download("/v1/backup", &partial).await {
        Ok(h) => h,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    std::fs::rename(&partial, &b.out)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), b.out.display()))?;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?")
            .to_owned()
    };
    let bytes = std::fs::metadata(&b.out).map(|m| m.len()).unwrap_or(0);
    println!(
        "backup of store revision {} written to {} ({bytes} bytes; {})",
        header("drover-backup-revision"),
        b.out.display(),
        header("drover-backup-objects").replace(',', ", ")
    );
    println!(
        "It holds every secret sealed, not the encryption key that opens them (the coordinator's DATA_DIR/encryption.key or DROVER_ENCRYPTION_KEY): keep a copy of that key apart from the backup. Restore with `drover store restore --from {} --data-dir DIR`.",
        b.out.display()
    );
    Ok(())
}
