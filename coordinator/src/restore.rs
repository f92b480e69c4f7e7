//! `drover store restore`: makes a coordinator's data directory from a
//! backup (`drover backup --out FILE`), on a new host or after the old
//! data was lost.
//!
//! What it guarantees:
//! - Nothing is written until the backup has passed every check: a SQLite
//!   database whose integrity check passes, in the store's schema, with
//!   only kinds this drover knows, holding objects, and the encryption key
//!   given here opens every sealed record (a backup never holds the key).
//! - An existing store is never overwritten: the data directory must hold
//!   no `drover.db`.
//! - `drover.db` appears whole or not at all (written beside it, synced,
//!   renamed), and is opened as a store before the command says it is done.
//!
//! What it does not bring back: changes after the backup's revision
//! (clusters applied since, machines registered since: such a machine's
//! heartbeats are refused as unknown, and it registers again with a new
//! ticket), and the audit log, which lives beside the store.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};

use crate::store::backup::{self, BackupSummary};
use crate::store::keyring::{KeySource, Keyring, KEY_ENV};
use crate::store::Store;

#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The backup, as `drover backup --out FILE` wrote it. Only read.
    #[arg(long)]
    from: PathBuf,
    /// The restored coordinator's data directory (made if missing, mode
    /// 0700). It must hold no store (`drover.db`).
    #[arg(long)]
    data_dir: PathBuf,
    /// The encryption keyring the backed-up coordinator ran with (default:
    /// DATA_DIR/encryption.key); DROVER_ENCRYPTION_KEY overrides it, as for
    /// `drover serve`. The backup does not hold it; it must open every
    /// secret of the backup.
    #[arg(long)]
    encryption_key_file: Option<PathBuf>,
}

/// Runs `drover store restore`.
pub fn run(args: RestoreArgs) -> ExitCode {
    if let Err(msg) = check_args(&args) {
        eprintln!("drover store restore: {msg}");
        return ExitCode::from(crate::types::EXIT_CONFIG);
    }
    match restore(&args, &mut std::io::stdout().lock()) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("drover store restore: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A flag that cannot be used, naming it and what to pass: exit 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Usage(String);

/// The flags' own checks.
fn check_args(a: &RestoreArgs) -> Result<(), Usage> {
    if !a.from.is_file() {
        return Err(Usage(format!(
            "--from {}: no such file; pass the file `drover backup --out FILE` wrote",
            a.from.display()
        )));
    }
    let db = a.data_dir.join("drover.db");
    if db.exists() {
        return Err(Usage(format!(
            "--data-dir {}: it already holds a store ({}); restore into a new, empty data directory, or move that store away first (it is never overwritten)",
            a.data_dir.display(),
            db.display()
        )));
    }
    if a.data_dir.exists() && !a.data_dir.is_dir() {
        return Err(Usage(format!(
            "--data-dir {}: it is not a directory",
            a.data_dir.display()
        )));
    }
    Ok(())
}

/// Checks the backup and the key, then writes `DATA_DIR/drover.db`;
/// reports on `out`.
pub fn restore(a: &RestoreArgs, out: &mut dyn Write) -> anyhow::Result<BackupSummary> {
    let summary = backup::summarize(&a.from).context("refusing to restore; nothing was written")?;
    if summary.total() == 0 {
        bail!(
            "refusing to restore: {} holds no object; nothing was written",
            a.from.display()
        );
    }
    let keyring = load_keyring(a)?;
    check_key(&keyring, &a.from)?;

    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("cannot create {}", a.data_dir.display()))?;
    set_private(&a.data_dir)?;
    let db = a.data_dir.join("drover.db");
    let partial = a.data_dir.join(".drover.db.restoring");
    let _ = std::fs::remove_file(&partial);
    std::fs::copy(&a.from, &partial)
        .with_context(|| format!("cannot copy {} to {}", a.from.display(), partial.display()))?;
    std::fs::File::open(&partial)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("cannot sync {}", partial.display()))?;
    std::fs::rename(&partial, &db)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), db.display()))?;
    std::fs::File::open(&a.data_dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", a.data_dir.display()))?;
    // Opened as `drover serve` will open it (WAL from here on).
    let store = Store::open_sqlite(&db)
        .with_context(|| format!("the restored {} does not open as a store", db.display()))?;
    drop(store);
    report(a, &summary, &keyring, out)?;
    Ok(summary)
}

/// The keyring as `drover serve` loads it, never created here.
fn load_keyring(a: &RestoreArgs) -> anyhow::Result<Keyring> {
    let path = a
        .encryption_key_file
        .clone()
        .unwrap_or_else(|| a.data_dir.join("encryption.key"));
    Keyring::load(&path, false).map(|(ring, _)| ring).map_err(|e| {
        anyhow::anyhow!(
            "refusing to restore: cannot load the encryption key ({e}). A backup holds every secret sealed and never the key: pass the key file the backed-up coordinator ran with (--encryption-key-file, or copy it to {}), or set {KEY_ENV}. Nothing was written.",
            path.display()
        )
    })
}

/// Fails, naming the records and key ids, unless `keyring` opens every
/// sealed record of the backup.
fn check_key(keyring: &Keyring, file: &Path) -> anyhow::Result<()> {
    let (_, records) =
        backup::read_snapshot(file).context("refusing to restore; nothing was written")?;
    let mut sealed = 0;
    let mut failed = vec![];
    for (kind, r) in records.iter().filter(|(k, _)| k.is_sealed()) {
        sealed += 1;
        if let Err(e) = keyring.open(&format!("{}/{}", kind.as_str(), r.name), &r.body) {
            failed.push(e.to_string());
        }
    }
    if let Some(first) = failed.first() {
        bail!(
            "refusing to restore: the encryption key ({}) does not open {} of the backup's {sealed} encrypted records (first: {first}). Pass the key the backed-up coordinator ran with (--encryption-key-file or {KEY_ENV}). Nothing was written.",
            keyring.describe(),
            failed.len()
        );
    }
    Ok(())
}

fn set_private(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot set mode 0700 on {}", dir.display()))
}

/// What was restored and what to do next.
fn report(
    a: &RestoreArgs,
    summary: &BackupSummary,
    keyring: &Keyring,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    writeln!(
        out,
        "Restored {} objects from {} (store revision {}) into {}.",
        summary.total(),
        a.from.display(),
        summary.revision,
        a.data_dir.join("drover.db").display()
    )?;
    writeln!(out, "  {}", summary.counts_header().replace(',', ", "))?;
    let key_flag = match &keyring.source {
        KeySource::File(p) if *p != a.data_dir.join("encryption.key") => {
            format!(" --encryption-key-file {}", p.display())
        }
        _ => String::new(),
    };
    writeln!(out, "Next steps:")?;
    writeln!(
        out,
        "  1. Start the coordinator: drover serve --data-dir {}{key_flag}, listening where machines and clients reach it (the --listen and --advertise-url of the old one, or move that address here).",
        a.data_dir.display()
    )?;
    writeln!(
        out,
        "  2. Machines reconnect with the certificates they hold (the CA is in the backup) and every machine gets a fresh heartbeat grace period: none is replaced for the silence of the move."
    )?;
    writeln!(
        out,
        "  3. What changed after revision {} is not here: re-apply clusters changed since; a machine registered since is unknown and must register again.",
        summary.revision
    )?;
    writeln!(
        out,
        "  4. To run replicas on etcd instead: drover store migrate --from sqlite:{} --to etcd://HOST:PORT (before the first start).",
        a.data_dir.display()
    )
}
