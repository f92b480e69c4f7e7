//! Backups of the store: every object as stored, at one revision, in one
//! SQLite database in the embedded backend's schema, whatever the backend
//! (SQLite copies itself with `VACUUM INTO`; etcd is read at one revision
//! and written out). So a backup of either restores as an embedded store,
//! and `drover store migrate` takes it on to etcd.
//!
//! A backup holds sealed records sealed: it never holds the encryption
//! key, which the restore needs beside it.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use super::{Kind, Record, Store, StoreError};

/// What a backup holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupSummary {
    /// The store revision the backup was taken at.
    pub revision: u64,
    /// Objects per kind, in `Kind::ALL` order, every kind listed.
    pub counts: Vec<(Kind, usize)>,
    /// The file's size.
    pub bytes: u64,
}

impl BackupSummary {
    /// `clusters=3,machines=12,...`: every kind, as the
    /// `Drover-Backup-Objects` header carries it.
    pub fn counts_header(&self) -> String {
        self.counts
            .iter()
            .map(|(k, n)| format!("{}={n}", k.as_str()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every object together.
    pub fn total(&self) -> usize {
        self.counts.iter().map(|(_, n)| n).sum()
    }
}

/// Why a file is not a backup this coordinator can restore.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{path} is not a Drover store or store backup: {why}")]
    NotABackup { path: String, why: String },
    #[error("{path} is damaged: SQLite's integrity check says {report}")]
    Damaged { path: String, report: String },
    #[error("{path} holds objects of kind {kind:?}, which this drover does not know; use the drover version that wrote it")]
    UnknownKind { path: String, kind: String },
}

impl Store {
    /// Writes a backup of every object at one revision to `dest`, which
    /// must not exist, while the store keeps serving; returns what it holds.
    pub fn backup(&self, dest: &Path) -> Result<BackupSummary, StoreError> {
        if dest.exists() {
            return Err(StoreError::Backend(format!(
                "cannot write a backup to {}: it exists",
                dest.display()
            )));
        }
        self.backend.backup(dest)?;
        summarize(dest).map_err(|e| StoreError::Backend(e.to_string()))
    }
}

/// A read-only connection to the SQLite database at `path` (a store that
/// may be in use, or a backup), waiting up to 5 s for a writer's lock.
pub(crate) fn open_read_only(path: &Path) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(conn)
}

/// Opens a backup read-only and checks it: a SQLite database whose
/// integrity check passes, with the store's tables and only kinds this
/// drover knows.
fn open_checked(path: &Path) -> Result<Connection, BackupError> {
    let not_a_backup = |why: String| BackupError::NotABackup {
        path: path.display().to_string(),
        why,
    };
    let conn = open_read_only(path).map_err(|e| not_a_backup(e.to_string()))?;
    let report: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(|e| not_a_backup(e.to_string()))?;
    if report != "ok" {
        return Err(BackupError::Damaged {
            path: path.display().to_string(),
            report,
        });
    }
    for table in ["objects", "revision"] {
        let found: bool = conn
            .query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get(0),
            )
            .map_err(|e| not_a_backup(e.to_string()))?;
        if !found {
            return Err(not_a_backup(format!("it has no {table} table")));
        }
    }
    Ok(conn)
}

/// What the backup at `path` holds, after the checks of a restore.
pub fn summarize(path: &Path) -> Result<BackupSummary, BackupError> {
    let (revision, rows) = read_by_kind(
        path,
        "SELECT kind, count(*) FROM objects GROUP BY kind",
        |r| r.get::<_, i64>(1),
    )?;
    let mut counts: Vec<(Kind, usize)> = Kind::ALL.iter().map(|k| (*k, 0)).collect();
    for (kind, n) in rows {
        if let Some(c) = counts.iter_mut().find(|(x, _)| *x == kind) {
            c.1 = n as usize;
        }
    }
    Ok(BackupSummary {
        revision,
        counts,
        bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
    })
}

/// The store revision and every object of the database at `path` (a
/// backup, or a stopped coordinator's `drover.db`), by kind then name, read
/// in one read transaction after the checks of [`summarize`].
pub fn read_snapshot(path: &Path) -> Result<(u64, Vec<(Kind, Record)>), BackupError> {
    read_by_kind(
        path,
        "SELECT kind, name, revision, body FROM objects ORDER BY kind, name",
        |r| {
            Ok(Record {
                name: r.get(1)?,
                revision: r.get::<_, i64>(2)? as u64,
                body: r.get(3)?,
            })
        },
    )
}

/// The store revision and the rows of `sql` (whose first column is the
/// kind) as `row` reads them, in one read transaction of the checked
/// database at `path`; a kind this drover does not know fails.
fn read_by_kind<T>(
    path: &Path,
    sql: &str,
    mut row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<(u64, Vec<(Kind, T)>), BackupError> {
    let conn = open_checked(path)?;
    let fail = |e: rusqlite::Error| BackupError::NotABackup {
        path: path.display().to_string(),
        why: e.to_string(),
    };
    let tx = conn.unchecked_transaction().map_err(fail)?;
    let revision: i64 = tx
        .query_row("SELECT value FROM revision WHERE id = 0", [], |r| r.get(0))
        .map_err(fail)?;
    let mut stmt = tx.prepare(sql).map_err(fail)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, row(r)?)))
        .map_err(fail)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(fail)?;
    let rows = rows
        .into_iter()
        .map(|(kind, v)| {
            Kind::parse(&kind)
                .map(|k| (k, v))
                .ok_or_else(|| BackupError::UnknownKind {
                    path: path.display().to_string(),
                    kind,
                })
        })
        .collect::<Result<_, _>>()?;
    Ok((revision as u64, rows))
}
