//! `drover store migrate`: moves a stopped coordinator's SQLite store into
//! an empty etcd store, so the installation can run as several replicas
//! sharing it. A migrated installation keeps its clusters, machines,
//! tickets, tokens and secrets.
//!
//! What it guarantees:
//! - The source is only read (a read-only SQLite connection), so a failed
//!   migration loses nothing: the old coordinator can start again on it.
//! - The copy is one consistent snapshot: every record is read in one SQLite
//!   read transaction, and the coordinator must be stopped. `drover serve`
//!   holds no lock or pid file, so a running one is found by the open
//!   `drover.db` it holds (any process, by device and inode, so also one in a
//!   container, as far as `/proc` lets this user see); and the source's
//!   revision is read again after the copy, so a write nobody saw coming
//!   still fails the migration.
//! - Records are copied as stored: sealed secrets stay sealed, byte for
//!   byte, so the replicas need the same encryption key. Before anything is
//!   written, the key must open every sealed record of the source. (A
//!   secret-kind record still in plaintext, from before encryption, is
//!   sealed with the primary key on the way, as a coordinator start would.)
//! - The destination must hold no Drover object; every write is a `Create`
//!   (etcd: `create_revision == 0`), so a concurrent writer is never
//!   overwritten. Transactions carry at most 100 objects (etcd allows 128)
//!   and about 1 MiB (etcd allows 1.5 MiB).
//! - Afterwards every record is read back from etcd and compared, bytes and
//!   count, and every sealed one opened with the key. When writing or this
//!   check fails, what was copied is removed again (each object only if it
//!   still holds the copied bytes, conditional on its revision).
//!
//! What changes: objects' revisions (`resourceVersion`) are per store, so
//! they differ in etcd; clients re-read before they write anyway. Machines'
//! liveness is not stored at all: every coordinator start gives each machine
//! a fresh grace period. The audit log and `ca.crt` live in the data
//! directory, not the store.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};

use crate::store::keyring::{KeyError, KeySource, Keyring, KEY_ENV};
use crate::store::{EtcdOptions, Kind, Location, Op, Record, Store, StoreError};

/// Objects per etcd transaction (etcd's `--max-txn-ops` default is 128).
const MAX_TXN_OPS: usize = 100;
/// Key and value bytes per etcd transaction (etcd's `--max-request-bytes`
/// default is 1.5 MiB); a larger single object goes alone.
const MAX_TXN_BYTES: usize = 1 << 20;
/// The order objects are written in: secrets first, so a replica started
/// too early finds the coordinator's keys instead of creating new ones (and
/// then fails the migration's creates rather than being overwritten).
const WRITE_ORDER: [Kind; 7] = [
    Kind::Secret,
    Kind::JoinTokens,
    Kind::UserSecret,
    Kind::Cluster,
    Kind::RegistrationToken,
    Kind::Machine,
    Kind::Snapshot,
];

/// `drover store`.
#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Debug, clap::Subcommand)]
enum StoreCommand {
    /// Copy a stopped coordinator's SQLite store into an empty etcd store,
    /// so replicas can share it (`drover serve --store etcd://...`). The
    /// source is only read; the copy is verified.
    Migrate(MigrateArgs),
    /// Make a coordinator's data directory from a backup (`drover backup
    /// --out FILE`): checked, with the encryption key, before anything is
    /// written; never over an existing store.
    Restore(crate::restore::RestoreArgs),
}

#[derive(Debug, clap::Args)]
struct MigrateArgs {
    /// The store to copy: `sqlite:DIR`, the directory holding `drover.db`
    /// (the coordinator's --data-dir, or DIR of its `--store sqlite:DIR`).
    /// Only read. The coordinator must be stopped.
    #[arg(long)]
    from: Location,
    /// The etcd store to copy into, which must hold no Drover object:
    /// `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` (keys under PREFIX,
    /// default /drover), as `drover serve --store` will be given.
    #[arg(long)]
    to: Location,
    #[command(flatten)]
    etcd: crate::serve::EtcdTlsArgs,
    /// The source coordinator's encryption keyring (default:
    /// DIR/encryption.key); DROVER_ENCRYPTION_KEY overrides it, as for
    /// `drover serve`. It must open every secret of the source; the
    /// replicas need the same keys.
    #[arg(long)]
    encryption_key_file: Option<PathBuf>,
    /// Check everything and print what would be copied, writing nothing.
    #[arg(long)]
    dry_run: bool,
}

/// A flag that cannot be used, naming it: exit code 64.
#[derive(Debug)]
struct Usage(String);

/// Runs `drover store ...`.
pub fn run(args: StoreArgs) -> ExitCode {
    match args.command {
        StoreCommand::Restore(a) => crate::restore::run(a),
        StoreCommand::Migrate(a) => {
            let plan = match Plan::from_args(a) {
                Ok(p) => p,
                Err(Usage(msg)) => {
                    eprintln!("drover store migrate: {msg}");
                    return ExitCode::from(crate::types::EXIT_CONFIG);
                }
            };
            if std::env::var_os(KEY_ENV).is_some() {
                eprintln!("drover store migrate: using the encryption key in {KEY_ENV}, which overrides --encryption-key-file (as for drover serve)");
            }
            match migrate(&plan, &mut std::io::stdout().lock()) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("drover store migrate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// A checked migration: where from, where to, with which key.
struct Plan {
    /// `--from`, for messages.
    from: Location,
    /// The source database, `DIR/drover.db`.
    db: PathBuf,
    /// `--to`, for messages.
    to: Location,
    dest: EtcdOptions,
    /// The etcd TLS flags as given, repeated in the next steps.
    tls_flags: String,
    keyring: Keyring,
    dry_run: bool,
}

impl Plan {
    fn from_args(a: MigrateArgs) -> Result<Self, Usage> {
        let dir = match &a.from {
            Location::Sqlite(Some(dir)) => dir.clone(),
            Location::Sqlite(None) => {
                return Err(Usage(
                    "--from sqlite needs the directory holding drover.db: --from sqlite:DIR (the coordinator's --data-dir, or DIR of its --store sqlite:DIR)".into(),
                ))
            }
            Location::Etcd { .. } => {
                return Err(Usage(format!(
                    "--from {}: only a SQLite store can be migrated (--from sqlite:DIR)",
                    a.from
                )))
            }
        };
        let db = dir.join("drover.db");
        if !db.is_file() {
            return Err(Usage(format!(
                "--from {}: {} does not exist; DIR must be the directory holding the coordinator's drover.db",
                a.from,
                db.display()
            )));
        }
        let (endpoints, prefix) = match &a.to {
            Location::Etcd { endpoints, prefix } => (endpoints.clone(), prefix.clone()),
            Location::Sqlite(_) => {
                return Err(Usage(format!(
                    "--to {}: the destination must be an etcd store (etcd://HOST:PORT[,HOST:PORT...][/PREFIX])",
                    a.to
                )))
            }
        };
        let mut dest = EtcdOptions::new(endpoints, prefix);
        dest.tls = crate::serve::etcd_tls(
            a.etcd.etcd_ca_file.as_deref(),
            a.etcd.etcd_cert_file.as_deref(),
            a.etcd.etcd_key_file.as_deref(),
        )
        .map_err(|e| Usage(e.to_string()))?;
        let mut tls_flags = String::new();
        for (flag, file) in [
            ("--etcd-ca-file", &a.etcd.etcd_ca_file),
            ("--etcd-cert-file", &a.etcd.etcd_cert_file),
            ("--etcd-key-file", &a.etcd.etcd_key_file),
        ] {
            if let Some(f) = file {
                tls_flags.push_str(&format!(" {flag} {}", f.display()));
            }
        }
        let keyring = load_keyring(&dir, a.encryption_key_file.as_deref())?;
        Ok(Self {
            from: a.from,
            db,
            to: a.to,
            dest,
            tls_flags,
            keyring,
            dry_run: a.dry_run,
        })
    }
}

/// The keyring as `drover serve` loads it: DROVER_ENCRYPTION_KEY, else the
/// file (never created here).
fn load_keyring(dir: &Path, file: Option<&Path>) -> Result<Keyring, Usage> {
    let path = file
        .map(Path::to_owned)
        .unwrap_or_else(|| dir.join("encryption.key"));
    let flag = match file {
        Some(_) => format!("--encryption-key-file {}", path.display()),
        None => format!(
            "--encryption-key-file (default {}, DIR of --from)",
            path.display()
        ),
    };
    Keyring::load(&path, false)
        .map(|(ring, _)| ring)
        .map_err(|e| match e {
            KeyError::Read { source, .. } => Usage(format!(
                "{flag}: cannot read it: {source}; pass the key file the source coordinator runs with, or set {KEY_ENV}"
            )),
            e => Usage(format!("{flag}: {e}")),
        })
}

/// One object to copy: as read from the source, and as it will be written.
struct Item {
    kind: Kind,
    name: String,
    /// The bytes written to etcd: the source's, unless a secret-kind record
    /// was still plaintext and is sealed now.
    body: Vec<u8>,
    /// Sealed kinds: the plaintext, to check the copy opens to it.
    plain: Option<Vec<u8>>,
    /// Sealed kinds: the key id the source record is sealed with (`None`:
    /// it was plaintext and is sealed on the way).
    sealed_with: Option<String>,
}

/// What a migration copied (or, in a dry run, would copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Objects per kind, in `Kind::ALL` order, every kind listed.
    pub counts: Vec<(Kind, usize)>,
    /// The source's store revision the snapshot was taken at.
    pub source_revision: u64,
    /// Secret-kind records that were plaintext in the source, sealed now.
    pub sealed_now: usize,
    pub dry_run: bool,
}

impl Summary {
    /// `clusters: 3, machines: 12, ...`.
    fn counts_line(&self) -> String {
        self.counts
            .iter()
            .map(|(k, n)| format!("{}: {n}", k.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn total(&self) -> usize {
        self.counts.iter().map(|(_, n)| n).sum()
    }
}

/// Runs a migration, reporting progress and the result on `out`.
fn migrate(plan: &Plan, out: &mut dyn Write) -> anyhow::Result<Summary> {
    // 1. The source: stopped, read in one snapshot, opened by the key.
    let holders = processes_holding(&plan.db);
    if !holders.is_empty() {
        let who = holders.join("; ");
        if !plan.dry_run {
            bail!(
                "refusing to migrate: {} is in use ({who}); stop the coordinator first (and anything else that has the store open), so the copy is its final state",
                plan.db.display()
            );
        }
        writeln!(
            out,
            "warning: {} is in use ({who}); stop the coordinator before the real migration",
            plan.db.display()
        )?;
    }
    let snapshot = read_snapshot(&plan.db)?;
    if snapshot.records.is_empty() {
        bail!(
            "nothing to migrate: {} holds no Drover object",
            plan.db.display()
        );
    }
    let items = check_sealed(&plan.keyring, snapshot.records)?;
    let summary = Summary {
        counts: Kind::ALL
            .iter()
            .map(|k| (*k, items.iter().filter(|i| i.kind == *k).count()))
            .collect(),
        source_revision: snapshot.revision,
        sealed_now: items
            .iter()
            .filter(|i| i.kind.is_sealed() && i.sealed_with.is_none())
            .count(),
        dry_run: plan.dry_run,
    };

    // 2. The destination: reachable and empty.
    let dest = Store::open_etcd(&plan.dest)
        .with_context(|| format!("cannot reach the destination {}", plan.to))?;
    let mut present = vec![];
    for kind in Kind::ALL {
        let records = dest
            .list_raw(kind)
            .with_context(|| format!("cannot read the destination {}", plan.to))?;
        if !records.is_empty() {
            let mut names: Vec<&str> = records.iter().take(5).map(|r| r.name.as_str()).collect();
            if records.len() > names.len() {
                names.push("...");
            }
            present.push(format!(
                "{}: {} ({})",
                kind.as_str(),
                records.len(),
                names.join(", ")
            ));
        }
    }
    if !present.is_empty() {
        bail!(
            "refusing to migrate: the destination {} already holds Drover objects ({}); it must hold none. A coordinator may already run on it, or an earlier migration completed. Use an empty etcd or another prefix (etcd://HOST:PORT/PREFIX); only if those objects are unwanted, remove them with `etcdctl del --prefix {}/`",
            dest.describe(),
            present.join("; "),
            plan.dest.prefix
        );
    }

    if plan.dry_run {
        writeln!(
            out,
            "Would copy {} objects from {} (store revision {}) to {}:",
            summary.total(),
            plan.from,
            summary.source_revision,
            plan.to
        )?;
        for i in &items {
            let how = match (i.kind.is_sealed(), &i.sealed_with) {
                (false, _) => String::new(),
                (true, Some(key)) => format!(", encrypted with key {key}"),
                (true, None) => ", plaintext: would be encrypted with the primary key".into(),
            };
            writeln!(
                out,
                "  {}/{} ({} bytes{how})",
                i.kind.as_str(),
                i.name,
                i.body.len()
            )?;
        }
        writeln!(out, "  {}", summary.counts_line())?;
        writeln!(
            out,
            "The key opens every encrypted record; the destination is empty. Dry run: nothing was written."
        )?;
        return Ok(summary);
    }

    // 3. Copy, check, and undo on failure.
    let copied = copy(&dest, &items)
        .and_then(|()| verify(&dest, &plan.keyring, &items))
        .and_then(|()| source_unchanged(plan, snapshot.revision));
    if let Err(e) = copied {
        let undo = match roll_back(&dest, &items) {
            Ok(0) => "nothing was left in the destination".to_string(),
            Ok(n) => format!("the {n} objects copied were removed from the destination again"),
            Err(undo) => format!(
                "removing what was copied failed too ({undo:#}); remove it with `etcdctl del --prefix {}/` before migrating again",
                plan.dest.prefix
            ),
        };
        bail!(
            "{e:#}; {undo}. The source {} is unchanged.",
            plan.db.display()
        );
    }
    report(plan, &summary, out)?;
    Ok(summary)
}

/// The source's objects at one revision.
struct Snapshot {
    revision: u64,
    /// In `WRITE_ORDER`, by name within a kind.
    records: Vec<(Kind, Record)>,
}

/// Reads every object of the SQLite store at `db` in one read transaction
/// on a read-only connection (the checks and reader of a backup: the
/// schema is the same).
fn read_snapshot(db: &Path) -> anyhow::Result<Snapshot> {
    let (revision, mut records) = crate::store::backup::read_snapshot(db)
        .with_context(|| format!("cannot migrate {}", db.display()))?;
    records.sort_by(|(ka, a), (kb, b)| {
        let pos = |k: &Kind| WRITE_ORDER.iter().position(|w| w == k);
        (pos(ka), &a.name).cmp(&(pos(kb), &b.name))
    });
    Ok(Snapshot { revision, records })
}

/// Checks that the keyring opens every sealed record, and makes the items
/// to write. Fails, naming the records and keys, before anything is written.
fn check_sealed(keyring: &Keyring, records: Vec<(Kind, Record)>) -> anyhow::Result<Vec<Item>> {
    let mut items = vec![];
    let mut failed: Vec<String> = vec![];
    let mut sealed = 0;
    for (kind, r) in records {
        if !kind.is_sealed() {
            items.push(Item {
                kind,
                name: r.name,
                body: r.body,
                plain: None,
                sealed_with: None,
            });
            continue;
        }
        sealed += 1;
        let what = format!("{}/{}", kind.as_str(), r.name);
        match keyring.open(&what, &r.body) {
            Err(e) => failed.push(e.to_string()),
            Ok(plain) => {
                let sealed_with = Keyring::sealed_with(&r.body);
                let body = match sealed_with {
                    Some(_) => r.body,
                    None => keyring.seal(&what, &plain),
                };
                items.push(Item {
                    kind,
                    name: r.name,
                    body,
                    plain: Some(plain),
                    sealed_with,
                });
            }
        }
    }
    if let Some(first) = failed.first() {
        bail!(
            "refusing to migrate: the encryption key ({}) does not open {} of the source's {sealed} encrypted records (first: {first}). Pass the key the source coordinator runs with (--encryption-key-file or {KEY_ENV}); the etcd replicas need it too. Nothing was written.",
            keyring.describe(),
            failed.len(),
        );
    }
    Ok(items)
}

/// Creates every item in transactions of at most `MAX_TXN_OPS` objects and
/// about `MAX_TXN_BYTES`.
fn copy(dest: &Store, items: &[Item]) -> anyhow::Result<()> {
    for batch in batches(items) {
        let ops = batch
            .iter()
            .map(|i| Op::Create {
                kind: i.kind,
                name: i.name.clone(),
                body: i.body.clone(),
            })
            .collect();
        dest.txn(ops).map_err(|e| match e {
            StoreError::AlreadyExists { kind, name } => anyhow::anyhow!(
                "{kind}/{name} appeared in the destination during the migration: something else writes there (a coordinator replica started too early?)"
            ),
            e => anyhow::Error::new(e).context("writing to the destination failed"),
        })?;
    }
    Ok(())
}

/// Splits items into transactions' worth.
fn batches(items: &[Item]) -> Vec<&[Item]> {
    let mut out = vec![];
    let (mut start, mut bytes) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        let size = item.kind.as_str().len() + item.name.len() + item.body.len() + 16;
        if i > start && (i - start == MAX_TXN_OPS || bytes + size > MAX_TXN_BYTES) {
            out.push(&items[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// Reads the destination back: exactly the items, byte for byte, and every
/// sealed one opens with the key to the source's plaintext.
fn verify(dest: &Store, keyring: &Keyring, items: &[Item]) -> anyhow::Result<()> {
    for kind in Kind::ALL {
        let want: BTreeMap<&str, &Item> = items
            .iter()
            .filter(|i| i.kind == kind)
            .map(|i| (i.name.as_str(), i))
            .collect();
        let have = dest
            .list_raw(kind)
            .with_context(|| format!("cannot read {} back from the destination", kind.as_str()))?;
        if have.len() != want.len() {
            bail!(
                "verification failed: the destination holds {} {}, the source {}",
                have.len(),
                kind.as_str(),
                want.len()
            );
        }
        for r in &have {
            let what = format!("{}/{}", kind.as_str(), r.name);
            let Some(item) = want.get(r.name.as_str()) else {
                bail!(
                    "verification failed: the destination holds {what}, which the source does not"
                );
            };
            if r.body != item.body {
                bail!("verification failed: {what} differs from the source in the destination");
            }
            if let Some(plain) = &item.plain {
                let opened = keyring
                    .open(&what, &r.body)
                    .with_context(|| format!("verification failed: {what} does not open"))?;
                if &opened != plain {
                    bail!("verification failed: {what} opens to other contents than in the source");
                }
            }
        }
    }
    Ok(())
}

/// Nothing wrote to the source while it was copied, and nothing has it open.
fn source_unchanged(plan: &Plan, revision: u64) -> anyhow::Result<()> {
    let now: i64 = crate::store::backup::open_read_only(&plan.db)
        .and_then(|c| c.query_row("SELECT value FROM revision WHERE id = 0", [], |r| r.get(0)))
        .with_context(|| format!("cannot read {} again", plan.db.display()))?;
    if now as u64 != revision {
        bail!(
            "the source changed during the migration (store revision {revision}, now {now}): a coordinator is running on it; stop it and migrate again"
        );
    }
    let holders = processes_holding(&plan.db);
    if !holders.is_empty() {
        bail!(
            "{} was opened during the migration ({}); stop the coordinator and migrate again",
            plan.db.display(),
            holders.join("; ")
        );
    }
    Ok(())
}

/// Removes from the destination what this migration wrote: each object that
/// still holds the copied bytes, conditional on the revision it was read
/// at, so nothing another writer changed is deleted. Returns how many.
fn roll_back(dest: &Store, items: &[Item]) -> Result<usize, StoreError> {
    let ours: HashSet<(Kind, &str, &[u8])> = items
        .iter()
        .map(|i| (i.kind, i.name.as_str(), i.body.as_slice()))
        .collect();
    let mut doomed = vec![];
    for kind in Kind::ALL {
        for r in dest.list_raw(kind)? {
            if ours.contains(&(kind, r.name.as_str(), r.body.as_slice())) {
                doomed.push(Op::Delete {
                    kind,
                    name: r.name,
                    expected_revision: Some(r.revision),
                });
            }
        }
    }
    let mut removed = 0;
    for batch in doomed.chunks(MAX_TXN_OPS) {
        match dest.txn(batch.to_vec()) {
            Ok(_) => removed += batch.len(),
            // Changed meanwhile: delete the others one by one.
            Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {
                for op in batch {
                    match dest.txn(vec![op.clone()]) {
                        Ok(_) => removed += 1,
                        Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

/// Prints the result and what to do next.
fn report(plan: &Plan, summary: &Summary, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "Copied {} objects from {} (store revision {}) to {} and read them back: all there, byte for byte.",
        summary.total(),
        plan.from,
        summary.source_revision,
        plan.to
    )?;
    writeln!(out, "  {}", summary.counts_line())?;
    if summary.sealed_now > 0 {
        writeln!(
            out,
            "  {} secret records stored in plaintext in the source were encrypted with key {}.",
            summary.sealed_now,
            plan.keyring.primary_id()
        )?;
    }
    let (key_step, key_flag) = match &plan.keyring.source {
        KeySource::File(p) => (
            format!(
                "Copy the encryption key file {} (key ids {}) to every replica, mode 0600: it is not in etcd, and a replica without it refuses to start.",
                p.display(),
                plan.keyring.ids().join(", ")
            ),
            " --encryption-key-file /path/to/encryption.key".to_string(),
        ),
        KeySource::Env => (
            format!(
                "Set {KEY_ENV} on every replica to the value used here (key ids {}): it is not in etcd, and a replica without it refuses to start.",
                plan.keyring.ids().join(", ")
            ),
            String::new(),
        ),
    };
    writeln!(out, "Next steps:")?;
    writeln!(out, "  1. {key_step}")?;
    writeln!(
        out,
        "  2. On each replica run: drover serve --data-dir DATA_DIR --store {}{}{key_flag}",
        plan.to, plan.tls_flags
    )?;
    writeln!(
        out,
        "     with the --listen and --advertise-url machines and clients reach the coordinator at (one address in front of the replicas)."
    )?;
    writeln!(
        out,
        "  3. Check with `drover get clusters` and `drover token list`; admin tokens and the CA are in the store, so client configs keep working."
    )?;
    writeln!(
        out,
        "  4. Do not start a coordinator on {} again: it is now a stale copy, left untouched as a backup. Its data directory keeps the audit log.",
        plan.from
    )?;
    writeln!(
        out,
        "Objects' resourceVersions differ in etcd (they are per store); machines get a fresh heartbeat grace period when the replicas start."
    )
}

/// Other processes that have `db` (or its WAL files) open, as
/// `pid N (command line)`. Matches by device and inode, so a coordinator in
/// a container is found too; only processes this user may inspect are seen
/// (every one, as root).
fn processes_holding(db: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut files = HashSet::new();
    for suffix in ["", "-wal", "-shm"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        if let Ok(m) = std::fs::metadata(&p) {
            files.insert((m.dev(), m.ino()));
        }
    }
    let me = std::process::id();
    let mut found = vec![];
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::metadata(fd.path())
                .map(|m| files.contains(&(m.dev(), m.ino())))
                .unwrap_or(false)
        });
        if holds {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let mut cmd = String::from_utf8_lossy(&cmdline)
                .replace('\0', " ")
                .trim()
                .to_owned();
            if cmd.chars().count() > 100 {
                cmd = cmd.chars().take(100).collect::<String>() + "...";
            }
            found.push(format!("pid {pid} ({cmd})"));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_etcd::TestEtcd;
    use std::sync::{Arc, RwLock};
    use std::time::Duration;

    fn key_b64(byte: u8) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode([byte; 32])
    }

    fn ring(byte: u8) -> Keyring {
        Keyring::parse(&key_b64(byte), KeySource::Env).unwrap()
    }

    fn shared(k: &Keyring) -> Arc<RwLock<Keyring>> {
        Arc::new(RwLock::new(k.clone()))
    }

    /// A stopped coordinator's data directory: the coordinator's own
    /// secrets, a cluster and its join tokens, enough machines for several
    /// transactions, a registration token.
    fn source(key: &Keyring, machines: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite(&dir.path().join("drover.db"))
            .unwrap()
            .with_keyring(shared(key));
        crate::domain::secrets::load_or_init(&store).unwrap();
        let cluster = serde_json::json!({
            "apiVersion": "drover.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "demo"}, "spec": {"controlPlane": {"replicas": 1}},
        });
        let r = store.create_json(Kind::Cluster, "demo", &cluster).unwrap();
        store
            .update_json(Kind::Cluster, "demo", &cluster, Some(r))
            .unwrap();
        store
            .create_json(Kind::JoinTokens, "demo", &"abcdef.0123456789abcdef")
            .unwrap();
        store
            .create_json(
                Kind::RegistrationToken,
                "tok-1",
                &serde_json::json!({"pool": "default", "uses": 3}),
            )
            .unwrap();
        let names: Vec<String> = (0..machines).map(|i| format!("demo-{i:03}")).collect();
        for chunk in names.chunks(100) {
            store
                .txn(
                    chunk
                        .iter()
                        .map(|n| Op::Create {
                            kind: Kind::Machine,
                            name: n.clone(),
                            body: crate::store::encode(&serde_json::json!({"name": n})),
                        })
                        .collect(),
                )
                .unwrap();
        }
        dir
    }

    fn plan(dir: &Path, dest: EtcdOptions, key: &Keyring, dry_run: bool) -> Plan {
        Plan {
            from: Location::Sqlite(Some(dir.to_owned())),
            db: dir.join("drover.db"),
            to: Location::Etcd {
                endpoints: dest.endpoints.clone(),
                prefix: dest.prefix.clone(),
            },
            dest,
            tls_flags: String::new(),
            keyring: key.clone(),
            dry_run,
        }
    }

    /// Every record of every kind, as stored, by kind and name.
    fn raw(store: &Store) -> BTreeMap<(&'static str, String), (Vec<u8>, u64)> {
        let mut out = BTreeMap::new();
        for kind in Kind::ALL {
            for r in store.list_raw(kind).unwrap() {
                out.insert((kind.as_str(), r.name), (r.body, r.revision));
            }
        }
        out
    }

    fn bodies(store: &Store) -> BTreeMap<(&'static str, String), Vec<u8>> {
        raw(store).into_iter().map(|(k, (b, _))| (k, b)).collect()
    }

    /// A test etcd (none when it cannot start), a key, and a source of
    /// `machines` machines sealed with it.
    fn etcd_and_source(machines: usize) -> Option<(TestEtcd, Keyring, tempfile::TempDir)> {
        let etcd = TestEtcd::start()?;
        let key = ring(7);
        let dir = source(&key, machines);
        Some((etcd, key, dir))
    }

    fn digest(path: &Path) -> Vec<u8> {
        use sha2::Digest;
        sha2::Sha256::digest(std::fs::read(path).unwrap()).to_vec()
    }

    fn err(r: anyhow::Result<Summary>) -> String {
        match r {
            Err(e) => format!("{e:#}"),
            Ok(s) => panic!("expected a refusal, got {s:?}"),
        }
    }

    #[test]
    fn migrates_everything_once_and_secrets_stay_sealed() {
        let Some((etcd, key, dir)) = etcd_and_source(250) else {
            return;
        };
        let db = dir.path().join("drover.db");
        let before = digest(&db);
        let src = Store::open_sqlite(&db).unwrap().with_keyring(shared(&key));
        let src_secrets = crate::domain::secrets::load_or_init(&src).unwrap();
        let src_bodies = bodies(&src);
        drop(src);

        // A dry run checks everything and writes nothing.
        let mut out = vec![];
        let s = migrate(
            &plan(dir.path(), etcd.options("/drover"), &key, true),
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("secrets/coordinator-ca ("), "{text}");
        assert!(text.contains("Dry run: nothing was written"), "{text}");
        assert!(bodies(&etcd.open()).is_empty());

        let mut out = vec![];
        let summary = migrate(
            &plan(dir.path(), etcd.options("/drover"), &key, false),
            &mut out,
        )
        .unwrap();
        assert_eq!(
            summary,
            Summary {
                dry_run: false,
                ..s
            }
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(
                "clusters: 1, machines: 250, registrationtokens: 1, secrets: 3, jointokens: 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("drover serve --data-dir DATA_DIR --store etcd://"),
            "{text}"
        );

        // Every record, byte for byte (sealed ones too), in etcd.
        let dest = etcd.open().with_keyring(shared(&key));
        assert_eq!(bodies(&dest), src_bodies);
        assert_eq!(src_bodies.len(), 256);
        // Read through the store with the same key: the same objects.
        let src = Store::open_sqlite(&db).unwrap().with_keyring(shared(&key));
        for kind in Kind::ALL {
            let (a, b) = (src.list(kind).unwrap(), dest.list(kind).unwrap());
            assert_eq!(a.len(), b.len());
            for (a, b) in a.iter().zip(&b) {
                assert_eq!((&a.name, &a.body), (&b.name, &b.body));
            }
        }
        assert_eq!(
            dest.get_json::<String>(Kind::JoinTokens, "demo")
                .unwrap()
                .unwrap()
                .0,
            "abcdef.0123456789abcdef"
        );
        let dest_secrets = crate::domain::secrets::load_or_init(&dest).unwrap();
        assert_eq!(dest_secrets.ca.cert_pem, src_secrets.ca.cert_pem);
        assert_eq!(
            dest_secrets.ticket_key.as_bytes(),
            src_secrets.ticket_key.as_bytes()
        );
        assert!(dest_secrets.first_admin_token.is_none());
        assert_eq!(dest.reseal_all().unwrap(), 0);
        drop(src);
        // The source was only read.
        assert_eq!(digest(&db), before);

        // Again: refused, naming what is there, and nothing changes.
        let after = raw(&dest);
        for dry_run in [true, false] {
            let msg = err(migrate(
                &plan(dir.path(), etcd.options("/drover"), &key, dry_run),
                &mut vec![],
            ));
            assert!(msg.contains("already holds Drover objects"), "{msg}");
            assert!(msg.contains("clusters: 1 (demo)"), "{msg}");
            assert!(msg.contains("machines: 250 (demo-000, "), "{msg}");
        }
        assert_eq!(raw(&dest), after);
        // Another prefix of the same etcd is another, empty store.
        migrate(
            &plan(dir.path(), etcd.options("/other"), &key, false),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(raw(&dest), after);
    }

    #[test]
    fn a_wrong_key_is_refused_before_anything_is_written() {
        let Some((etcd, _, dir)) = etcd_and_source(1) else {
            return;
        };
        let wrong = ring(8);
        let msg = err(migrate(
            &plan(dir.path(), etcd.options("/drover"), &wrong, false),
            &mut vec![],
        ));
        assert!(
            msg.contains("does not open 4 of the source's 4 encrypted records"),
            "{msg}"
        );
        assert!(msg.contains(&ring(7).primary_id().to_string()), "{msg}");
        assert!(msg.contains("Nothing was written"), "{msg}");
        assert!(bodies(&etcd.open()).is_empty());
        // A keyring that also holds the right key (a rotation) opens them.
        let both =
            Keyring::parse(&format!("{}\n{}", key_b64(8), key_b64(7)), KeySource::Env).unwrap();
        migrate(
            &plan(dir.path(), etcd.options("/drover"), &both, false),
            &mut vec![],
        )
        .unwrap();
    }

    #[test]
    fn plaintext_secrets_are_sealed_on_the_way() {
        let Some((etcd, key, dir)) = etcd_and_source(1) else {
            return;
        };
        // A record from before encryption.
        Store::open_sqlite(&dir.path().join("drover.db"))
            .unwrap()
            .create_json(Kind::Secret, "old", &"PLAIN SECRET")
            .unwrap();
        let summary = migrate(
            &plan(dir.path(), etcd.options("/drover"), &key, false),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(summary.sealed_now, 1);
        let dest = etcd.open();
        let raw = dest.get_raw(Kind::Secret, "old").unwrap().unwrap().body;
        assert!(!String::from_utf8_lossy(&raw).contains("PLAIN"));
        assert_eq!(
            dest.with_keyring(shared(&key))
                .get_json::<String>(Kind::Secret, "old")
                .unwrap()
                .unwrap()
                .0,
            "PLAIN SECRET"
        );
    }

    #[test]
    fn roll_back_removes_only_what_is_still_the_copy() {
        let Some((etcd, key, dir)) = etcd_and_source(120) else {
            return;
        };
        let snapshot = read_snapshot(&dir.path().join("drover.db")).unwrap();
        let items = check_sealed(&key, snapshot.records).unwrap();
        let dest = etcd.open();
        copy(&dest, &items).unwrap();
        verify(&dest, &key, &items).unwrap();
        // Another writer changed one copied object and added its own.
        let (_, rev) = dest
            .get_json::<serde_json::Value>(Kind::Machine, "demo-007")
            .unwrap()
            .unwrap();
        dest.update_json(Kind::Machine, "demo-007", &"changed", Some(rev))
            .unwrap();
        dest.create_json(Kind::Machine, "zz-theirs", &1).unwrap();
        assert!(verify(&dest, &key, &items).is_err());
        assert_eq!(roll_back(&dest, &items).unwrap(), items.len() - 1);
        let left: Vec<String> = dest
            .list(Kind::Machine)
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(left, ["demo-007", "zz-theirs"]);
        assert_eq!(raw(&dest).len(), 2);
    }

    #[test]
    fn an_unreachable_etcd_fails_clearly() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let key = ring(7);
        let dir = source(&key, 1);
        let mut dest = EtcdOptions::new(vec![format!("127.0.0.1:{port}")], "/drover");
        dest.timeout = Duration::from_secs(1);
        let msg = err(migrate(&plan(dir.path(), dest, &key, false), &mut vec![]));
        assert!(
            msg.starts_with(&format!(
                "cannot reach the destination etcd://127.0.0.1:{port}/drover"
            )),
            "{msg}"
        );
        assert!(msg.contains(&format!("http://127.0.0.1:{port}")), "{msg}");
    }

    #[test]
    fn a_running_coordinator_is_refused() {
        let key = ring(7);
        let dir = source(&key, 1);
        let db = dir.path().join("drover.db");
        // Another process holding the database open, as `drover serve` does.
        let mut holder = std::process::Command::new("sleep")
            .arg("60")
            .stdin(std::fs::File::open(&db).unwrap())
            .spawn()
            .unwrap();
        let expected = format!("pid {} (sleep 60)", holder.id());
        // Until the child has exec'd, /proc shows the test's command line.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let found = loop {
            let found = processes_holding(&db);
            if found.contains(&expected) || std::time::Instant::now() > deadline {
                break found;
            }
            std::thread::yield_now();
        };
        let unreachable = EtcdOptions::new(vec!["127.0.0.1:1".into()], "/drover");
        let msg = err(migrate(
            &plan(dir.path(), unreachable, &key, false),
            &mut vec![],
        ));
        let _ = holder.kill();
        let _ = holder.wait();
        assert!(found.contains(&expected), "{expected} not in {found:?}");
        assert!(msg.contains(&expected), "{msg}");
        assert!(msg.contains("stop the coordinator first"), "{msg}");
    }

    #[test]
    fn an_empty_or_foreign_source_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("drover.db");
        drop(Store::open_sqlite(&db).unwrap());
        let unreachable = EtcdOptions::new(vec!["127.0.0.1:1".into()], "/drover");
        let msg = err(migrate(
            &plan(dir.path(), unreachable.clone(), &ring(7), false),
            &mut vec![],
        ));
        assert!(msg.starts_with("nothing to migrate"), "{msg}");
        std::fs::write(&db, b"not a database").unwrap();
        let msg = err(migrate(
            &plan(dir.path(), unreachable, &ring(7), false),
            &mut vec![],
        ));
        assert!(msg.contains("is not a Drover store"), "{msg}");
    }

    #[test]
    fn batches_stay_within_etcd_limits() {
        let item = |size: usize| Item {
            kind: Kind::Machine,
            name: "m".into(),
            body: vec![b'x'; size],
            plain: None,
            sealed_with: None,
        };
        let sizes =
            |items: &[Item]| -> Vec<usize> { batches(items).iter().map(|b| b.len()).collect() };
        let small: Vec<Item> = (0..250).map(|_| item(10)).collect();
        assert_eq!(sizes(&small), [100, 100, 50]);
        let big: Vec<Item> = (0..5).map(|_| item(400 << 10)).collect();
        assert_eq!(sizes(&big), [2, 2, 1]);
        let huge = vec![item(3 << 20), item(1)];
        assert_eq!(sizes(&huge), [1, 1]);
        assert!(batches(&[]).is_empty());
    }

    #[test]
    fn bad_flags_name_the_flag() {
        let dir = source(&ring(7), 1);
        let d = dir.path().display().to_string();
        std::fs::write(dir.path().join("encryption.key"), key_b64(7)).unwrap();
        let args = |from: &str, to: &str, extra: &[&str]| {
            #[derive(clap::Parser)]
            struct T {
                #[command(flatten)]
                a: MigrateArgs,
            }
            let mut argv = vec!["t", "--from", from, "--to", to];
            argv.extend_from_slice(extra);
            <T as clap::Parser>::try_parse_from(argv).map(|t| t.a)
        };
        let refused = |from: &str, to: &str, extra: &[&str]| match Plan::from_args(
            args(from, to, extra).unwrap(),
        ) {
            Err(Usage(m)) => m,
            Ok(_) => panic!("accepted {from} {to} {extra:?}"),
        };
        let from = format!("sqlite:{d}");
        let to = "etcd://127.0.0.1:2379";
        if std::env::var_os(KEY_ENV).is_none() {
            let p = Plan::from_args(args(&from, to, &[]).unwrap()).unwrap();
            assert_eq!(p.keyring.primary_id(), ring(7).primary_id());
            assert_eq!(p.dest.prefix, "/drover");
            let m = refused(&from, to, &["--encryption-key-file", "/nonexistent/k"]);
            assert!(
                m.starts_with("--encryption-key-file /nonexistent/k: cannot read it"),
                "{m}"
            );
            std::fs::remove_file(dir.path().join("encryption.key")).unwrap();
            let m = refused(&from, to, &[]);
            assert!(m.starts_with("--encryption-key-file (default "), "{m}");
        }
        assert!(args("sqlite:", to, &[]).is_err());
        assert!(args(&from, "etcd://nohost", &[]).is_err());
        assert!(refused("sqlite", to, &[]).starts_with("--from sqlite needs"));
        assert!(refused(to, to, &[]).starts_with("--from etcd://"));
        assert!(refused(&from, &from, &[]).starts_with("--to sqlite:"));
        let m = refused("sqlite:/nonexistent", to, &[]);
        assert!(m.contains("/nonexistent/drover.db does not exist"), "{m}");
        let m = refused(&from, to, &["--etcd-cert-file", "c.pem"]);
        assert!(
            m.starts_with("--etcd-cert-file needs --etcd-key-file"),
            "{m}"
        );
        let m = refused(&from, to, &["--etcd-ca-file", "/nonexistent/ca.pem"]);
        assert!(m.starts_with("--etcd-ca-file /nonexistent/ca.pem"), "{m}");
    }
}
