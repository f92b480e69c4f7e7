//! The embedded backend: SQLite in one file of the data directory (WAL,
//! `synchronous=FULL`). One connection behind a mutex serialises every
//! transaction; the global revision is a row of its own, bumped by each.
//! Changes are broadcast after commit, so only this process's writes are
//! seen: SQLite serves a single coordinator.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use tokio::sync::broadcast;

use super::backend::{
    Backend, Change, Fence, History, Kind, Op, Record, Span, StoreError, HISTORY_REVISIONS,
};

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}

pub(super) struct Sqlite {
    conn: Mutex<Connection>,
    path: std::path::PathBuf,
    changes: broadcast::Sender<Change>,
}

impl Sqlite {
    /// Opens (creating if needed) the database at `path`.
    pub(super) fn open(
        path: &Path,
        changes: broadcast::Sender<Change>,
    ) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn: Mutex::new(conn),
            path: path.to_owned(),
            changes,
        })
    }
}

/// The tables: every object by kind and name, and the global revision.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS objects (
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        revision INTEGER NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (kind, name)
    );
    CREATE TABLE IF NOT EXISTS revision (id INTEGER PRIMARY KEY CHECK (id = 0), value INTEGER NOT NULL);
    INSERT OR IGNORE INTO revision (id, value) VALUES (0, 0);
    CREATE TABLE IF NOT EXISTS changes (
        revision INTEGER NOT NULL,
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        deleted INTEGER NOT NULL,
        PRIMARY KEY (revision, kind, name)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS change_floor (id INTEGER PRIMARY KEY CHECK (id = 0), value INTEGER NOT NULL);
    INSERT OR IGNORE INTO change_floor (id, value) SELECT 0, value FROM revision WHERE id = 0;";

/// How often (in revisions) a transaction prunes the change history.
const PRUNE_EVERY: i64 = 256;

/// A new database at `dest` in this backend's schema, filled in one
/// transaction by `fill` (a backup of another backend): `fill` hands each
/// batch of records of a kind to the writer it is given, as it reads them,
/// and returns the store revision they were read at.
pub(super) fn write_snapshot(
    dest: &Path,
    fill: impl FnOnce(
        &mut dyn FnMut(Kind, Vec<Record>) -> Result<(), StoreError>,
    ) -> Result<u64, StoreError>,
) -> Result<(), StoreError> {
    let mut conn = Connection::open_with_flags(
        dest,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_CREATE,
    )?;
    conn.execute_batch(SCHEMA)?;
    let tx = conn.transaction()?;
    {
        let mut insert =
            tx.prepare("INSERT INTO objects (kind, name, revision, body) VALUES (?1, ?2, ?3, ?4)")?;
        let revision = fill(&mut |kind, records| {
            for r in records {
                insert.execute(params![kind.as_str(), r.name, r.revision as i64, r.body])?;
            }
            Ok(())
        })?;
        drop(insert);
        tx.execute(
            "UPDATE revision SET value = ?1 WHERE id = 0",
            params![revision as i64],
        )?;
        // A copy keeps no history: it starts at its revision.
        tx.execute(
            "UPDATE change_floor SET value = ?1 WHERE id = 0",
            params![revision as i64],
        )?;
    }
    tx.commit()?;
    Ok(())
}

impl Backend for Sqlite {
    /// `VACUUM INTO` on a read-only connection of its own: one read
    /// transaction (a consistent copy at one revision) that WAL lets run
    /// beside the writer, which is never held up.
    fn backup(&self, dest: &Path) -> Result<(), StoreError> {
        let conn = Connection::open_with_flags(
            &self.path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let dest = dest.to_str().ok_or_else(|| {
            StoreError::Backend(format!("the backup path {} is not UTF-8", dest.display()))
        })?;
        conn.execute("VACUUM INTO ?1", params![dest])?;
        Ok(())
    }

    fn describe(&self) -> String {
        format!("SQLite database {}", self.path.display())
    }

    fn revision(&self) -> Result<u64, StoreError> {
        let conn = self.conn.lock().expect("store lock poisoned");
        let revision: i64 = conn
            .prepare_cached("SELECT value FROM revision WHERE id = 0")?
            .query_row([], |r| r.get(0))?;
        Ok(revision as u64)
    }

    fn history(&self, limit: usize) -> Result<History, StoreError> {
        let conn = self.conn.lock().expect("store lock poisoned");
        let tx = conn.unchecked_transaction()?;
        let floor: i64 = tx
            .prepare_cached("SELECT value FROM change_floor WHERE id = 0")?
            .query_row([], |r| r.get(0))?;
        let head: i64 = tx
            .prepare_cached("SELECT value FROM revision WHERE id = 0")?
            .query_row([], |r| r.get(0))?;
        let mut stmt = tx.prepare_cached(
            "SELECT revision, kind, name, deleted FROM changes WHERE revision > ?1 ORDER BY revision DESC, kind, name LIMIT ?2",
        )?;
        let take = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
        let rows = stmt.query_map(params![floor, take], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, bool>(3)?,
            ))
        })?;
        let mut changes = vec![];
        for row in rows {
            let (revision, kind, name, deleted) = row?;
            let Some(kind) = Kind::parse(&kind) else {
                continue;
            };
            changes.push(Change {
                kind,
                name,
                revision: revision as u64,
                deleted,
                origin: None,
            });
        }
        drop(stmt);
        tx.finish()?;
        changes.reverse();
        let mut history = History {
            floor: floor as u64,
            head: head as u64,
            changes,
        };
        history.truncate(limit);
        Ok(history)
    }

    fn get(&self, kind: Kind, name: &str) -> Result<Option<Record>, StoreError> {
        let conn = self.conn.lock().expect("store lock poisoned");
        let row = conn
            .prepare_cached("SELECT revision, body FROM objects WHERE kind = ?1 AND name = ?2")?
            .query_row(params![kind.as_str(), name], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?))
            })
            .optional()?;
        Ok(row.map(|(revision, body)| Record {
            name: name.to_owned(),
            revision: revision as u64,
            body,
        }))
    }

    fn list(&self, kind: Kind, span: Span<'_>) -> Result<Vec<Record>, StoreError> {
        let conn = self.conn.lock().expect("store lock poisoned");
        let mut stmt = conn.prepare_cached(
            "SELECT name, revision, body FROM objects WHERE kind = ?1 AND name > ?2 ORDER BY name LIMIT ?3",
        )?;
        // SQLite reads a negative LIMIT as none.
        let limit = span
            .limit
            .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
        let rows = stmt.query_map(params![kind.as_str(), span.after, limit], |r| {
            Ok(Record {
                name: r.get(0)?,
                revision: r.get::<_, i64>(1)? as u64,
                body: r.get(2)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>().map_err(Into::into)
    }

    fn txn(&self, ops: &[Op], _fence: Option<Fence>) -> Result<u64, StoreError> {
        let mut conn = self.conn.lock().expect("store lock poisoned");
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let revision: i64 = tx
            .prepare_cached("SELECT value FROM revision WHERE id = 0")?
            .query_row([], |r| r.get(0))?;
        let revision = revision + 1;
        let mut changes = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                Op::Create { kind, name, body } => {
                    let n = tx
                        .prepare_cached(
                            "INSERT OR IGNORE INTO objects (kind, name, revision, body) VALUES (?1, ?2, ?3, ?4)",
                        )?
                        .execute(params![kind.as_str(), name, revision, body])?;
                    if n == 0 {
                        return Err(StoreError::AlreadyExists {
                            kind: kind.as_str(),
                            name: name.clone(),
                        });
                    }
                    changes.push((*kind, name.clone(), false));
                }
                Op::Update {
                    kind,
                    name,
                    body,
                    expected_revision,
                } => {
                    check_revision(&tx, *kind, name, *expected_revision)?;
                    tx.prepare_cached(
                        "UPDATE objects SET revision = ?3, body = ?4 WHERE kind = ?1 AND name = ?2",
                    )?
                    .execute(params![kind.as_str(), name, revision, body])?;
                    changes.push((*kind, name.clone(), false));
                }
                Op::Delete {
                    kind,
                    name,
                    expected_revision,
                } => {
                    check_revision(&tx, *kind, name, *expected_revision)?;
                    tx.prepare_cached("DELETE FROM objects WHERE kind = ?1 AND name = ?2")?
                        .execute(params![kind.as_str(), name])?;
                    changes.push((*kind, name.clone(), true));
                }
            }
        }
        tx.prepare_cached("UPDATE revision SET value = ?1 WHERE id = 0")?
            .execute(params![revision])?;
        {
            let mut history = tx.prepare_cached(
                "INSERT OR REPLACE INTO changes (revision, kind, name, deleted) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (kind, name, deleted) in &changes {
                history.execute(params![revision, kind.as_str(), name, deleted])?;
            }
        }
        let cut = revision - HISTORY_REVISIONS as i64;
        if revision % PRUNE_EVERY == 0 && cut > 0 {
            tx.prepare_cached("DELETE FROM changes WHERE revision <= ?1")?
                .execute(params![cut])?;
            tx.prepare_cached("UPDATE change_floor SET value = max(value, ?1) WHERE id = 0")?
                .execute(params![cut])?;
        }
        tx.commit()?;
        drop(conn);
        let origin = super::backend::current_origin();
        for (kind, name, deleted) in changes {
            // Nobody listening is fine: watchers re-list on start.
            let _ = self.changes.send(Change {
                kind,
                name,
                revision: revision as u64,
                deleted,
                origin: origin.clone(),
            });
        }
        Ok(revision as u64)
    }
}

fn check_revision(
    tx: &rusqlite::Transaction<'_>,
    kind: Kind,
    name: &str,
    expected: Option<u64>,
) -> Result<(), StoreError> {
    let found: Option<i64> = tx
        .prepare_cached("SELECT revision FROM objects WHERE kind = ?1 AND name = ?2")?
        .query_row(params![kind.as_str(), name], |r| r.get(0))
        .optional()?;
    let Some(found) = found else {
        return Err(StoreError::NotFound {
            kind: kind.as_str(),
            name: name.to_owned(),
        });
    };
    if let Some(expected) = expected {
        if expected != found as u64 {
            return Err(StoreError::Conflict {
                kind: kind.as_str(),
                name: name.to_owned(),
                expected,
                found: found as u64,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_database_refuses_writes_with_what_to_do_and_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let (changes, _) = broadcast::channel(16);
        let db = Sqlite::open(&dir.path().join("drover.db"), changes).unwrap();
        // SQLite's cap on the file's size: a write past it fails exactly as
        // on a full disk (SQLITE_FULL).
        {
            let conn = db.conn.lock().unwrap();
            let pages: i64 = conn
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .unwrap();
            conn.pragma_update(None, "max_page_count", pages).unwrap();
        }
        let e = db
            .txn(
                &[Op::Create {
                    kind: Kind::Cluster,
                    name: "c".into(),
                    body: vec![7; 64 * 1024],
                }],
                None,
            )
            .unwrap_err();
        assert!(matches!(e, StoreError::Backend(_)), "{e:?}");
        assert!(e.to_string().contains("database or disk is full"), "{e}");
        let remedy = e.remedy().unwrap_or_default();
        assert!(remedy.contains("is full: free space"), "{remedy}");
        assert!(db.get(Kind::Cluster, "c").unwrap().is_none());
    }
}
