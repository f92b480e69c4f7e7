//! The store: every durable object of the coordinator, behind one interface.
//!
//! Objects are JSON documents addressed by `(kind, name)`. Each write bumps a
//! global revision (as etcd does), and each object remembers the revision of
//! its last write, which the API exposes as `resourceVersion`. Writes are
//! transactions of operations with preconditions on those revisions, so
//! callers get optimistic concurrency and multi-object atomicity (a ticket
//! redemption and the machine it registers commit together or not at all).
//!
//! The embedded backend is SQLite in one file of the data directory.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::broadcast;

/// The kinds of object the store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Cluster,
    Machine,
    RegistrationToken,
    /// Key material and other secrets, never served by the API.
    Secret,
    /// Per-cluster kubeadm join tokens.
    JoinTokens,
}

impl Kind {
    /// Kinds whose bodies are encrypted at rest.
    pub fn is_sealed(self) -> bool {
        matches!(self, Kind::Secret | Kind::JoinTokens)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Cluster => "clusters",
            Kind::Machine => "machines",
            Kind::RegistrationToken => "registrationtokens",
            Kind::Secret => "secrets",
            Kind::JoinTokens => "jointokens",
        }
    }
}

/// A stored object: its name, the revision of its last write and its body.
#[derive(Debug, Clone)]
pub struct Record {
    pub name: String,
    pub revision: u64,
    pub body: Vec<u8>,
}

/// One operation of a transaction.
#[derive(Debug, Clone)]
pub enum Op {
    /// Fails with `AlreadyExists` if the object exists.
    Create {
        kind: Kind,
        name: String,
        body: Vec<u8>,
    },
    /// Fails with `NotFound`, or `Conflict` if `expected_revision` is given
    /// and differs from the stored one.
    Update {
        kind: Kind,
        name: String,
        body: Vec<u8>,
        expected_revision: Option<u64>,
    },
    /// Fails like `Update`.
    Delete {
        kind: Kind,
        name: String,
        expected_revision: Option<u64>,
    },
}

/// Store failures, each naming the object concerned.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{kind} {name:?} already exists")]
    AlreadyExists { kind: &'static str, name: String },
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} {name:?} was changed concurrently (expected resourceVersion {expected}, found {found}); read it again and retry")]
    Conflict {
        kind: &'static str,
        name: String,
        expected: u64,
        found: u64,
    },
    #[error("stored {kind} {name:?} is corrupt: {detail}")]
    Corrupt {
        kind: &'static str,
        name: String,
        detail: String,
    },
    #[error("store backend failed: {0}")]
    Backend(String),
    #[error(transparent)]
    Sealed(#[from] crate::keyring::KeyError),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}

/// A committed change, broadcast to in-process watchers.
#[derive(Debug, Clone)]
pub struct Change {
    pub kind: Kind,
    pub name: String,
    pub revision: u64,
    pub deleted: bool,
}

/// The store handle, cheap to clone.
#[derive(Clone)]
pub struct Store {
    backend: Arc<Sqlite>,
    changes: broadcast::Sender<Change>,
    /// Seals secret kinds at rest; `None` only in tests of the store itself.
    keyring: Option<Arc<RwLock<crate::keyring::Keyring>>>,
}

struct Sqlite {
    conn: Mutex<Connection>,
}

impl Store {
    /// Opens (creating if needed) the SQLite store at `path`.
    pub fn open_sqlite(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS objects (
                kind TEXT NOT NULL,
                name TEXT NOT NULL,
                revision INTEGER NOT NULL,
                body BLOB NOT NULL,
                PRIMARY KEY (kind, name)
            );
            CREATE TABLE IF NOT EXISTS revision (id INTEGER PRIMARY KEY CHECK (id = 0), value INTEGER NOT NULL);
            INSERT OR IGNORE INTO revision (id, value) VALUES (0, 0);",
        )?;
        let (changes, _) = broadcast::channel(1024);
        Ok(Self {
            backend: Arc::new(Sqlite {
                conn: Mutex::new(conn),
            }),
            changes,
            keyring: None,
        })
    }

    /// Encrypts secret kinds with `keyring` from now on.
    pub fn with_keyring(mut self, keyring: Arc<RwLock<crate::keyring::Keyring>>) -> Self {
        self.keyring = Some(keyring);
        self
    }

    /// The keyring, if the store encrypts.
    pub fn keyring(&self) -> Option<&Arc<RwLock<crate::keyring::Keyring>>> {
        self.keyring.as_ref()
    }

    fn seal(&self, kind: Kind, name: &str, body: &[u8]) -> Vec<u8> {
        match (&self.keyring, kind.is_sealed()) {
            (Some(k), true) => k
                .read()
                .expect("keyring lock")
                .seal(&format!("{}/{name}", kind.as_str()), body),
            _ => body.to_vec(),
        }
    }

    fn open(&self, kind: Kind, r: Record) -> Result<Record, StoreError> {
        match (&self.keyring, kind.is_sealed()) {
            (Some(k), true) => {
                let body = k
                    .read()
                    .expect("keyring lock")
                    .open(&format!("{}/{}", kind.as_str(), r.name), &r.body)?;
                Ok(Record { body, ..r })
            }
            _ => Ok(r),
        }
    }

    /// Reads one object as stored (still sealed).
    pub fn get_raw(&self, kind: Kind, name: &str) -> Result<Option<Record>, StoreError> {
        let conn = self.backend.conn.lock().expect("store lock poisoned");
        let row = conn
            .query_row(
                "SELECT revision, body FROM objects WHERE kind = ?1 AND name = ?2",
                params![kind.as_str(), name],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)),
            )
            .optional()?;
        Ok(row.map(|(revision, body)| Record {
            name: name.to_owned(),
            revision: revision as u64,
            body,
        }))
    }

    /// Reads every object of a kind as stored (still sealed).
    pub fn list_raw(&self, kind: Kind) -> Result<Vec<Record>, StoreError> {
        let conn = self.backend.conn.lock().expect("store lock poisoned");
        let mut stmt = conn.prepare_cached(
            "SELECT name, revision, body FROM objects WHERE kind = ?1 ORDER BY name",
        )?;
        let rows = stmt.query_map(params![kind.as_str()], |r| {
            Ok(Record {
                name: r.get(0)?,
                revision: r.get::<_, i64>(1)? as u64,
                body: r.get(2)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>().map_err(Into::into)
    }

    /// Checks that every sealed record opens with the keyring and re-seals
    /// those not sealed with the primary key (records written before
    /// encryption, or under a key being rotated out). Returns how many
    /// records were re-sealed. Fails without changing anything when any
    /// record cannot be opened.
    pub fn reseal_all(&self) -> Result<usize, StoreError> {
        let Some(keyring) = &self.keyring else {
            return Ok(0);
        };
        let mut todo = vec![];
        for kind in [Kind::Secret, Kind::JoinTokens] {
            for r in self.list_raw(kind)? {
                let primary = keyring
                    .read()
                    .expect("keyring lock")
                    .primary_id()
                    .to_owned();
                let sealed_with = crate::keyring::Keyring::sealed_with(&r.body);
                let opened = self.open(kind, r.clone())?;
                if sealed_with.as_deref() != Some(primary.as_str()) {
                    todo.push((kind, opened));
                }
            }
        }
        let n = todo.len();
        for (kind, r) in todo {
            match self.txn(vec![Op::Update {
                kind,
                name: r.name.clone(),
                body: r.body,
                expected_revision: Some(r.revision),
            }]) {
                // A concurrent write re-sealed it with the primary key anyway.
                Ok(_) | Err(StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    /// Whether the store holds any secret yet (a first start has none).
    pub fn has_secrets(&self) -> Result<bool, StoreError> {
        Ok(!self.list_raw(Kind::Secret)?.is_empty())
    }

    /// Subscribes to committed changes.
    pub fn watch(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// Reads one object.
    pub fn get(&self, kind: Kind, name: &str) -> Result<Option<Record>, StoreError> {
        self.get_raw(kind, name)?
            .map(|r| self.open(kind, r))
            .transpose()
    }

    /// Reads every object of a kind, ordered by name.
    pub fn list(&self, kind: Kind) -> Result<Vec<Record>, StoreError> {
        self.list_raw(kind)?
            .into_iter()
            .map(|r| self.open(kind, r))
            .collect()
    }

    /// Applies operations atomically; returns the revision the transaction
    /// committed at. Nothing is written if any precondition fails.
    pub fn txn(&self, ops: Vec<Op>) -> Result<u64, StoreError> {
        let ops: Vec<Op> = ops
            .into_iter()
            .map(|op| match op {
                Op::Create { kind, name, body } => Op::Create {
                    body: self.seal(kind, &name, &body),
                    kind,
                    name,
                },
                Op::Update {
                    kind,
                    name,
                    body,
                    expected_revision,
                } => Op::Update {
                    body: self.seal(kind, &name, &body),
                    kind,
                    name,
                    expected_revision,
                },
                other => other,
            })
            .collect();
        let mut conn = self.backend.conn.lock().expect("store lock poisoned");
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let revision: i64 =
            tx.query_row("SELECT value FROM revision WHERE id = 0", [], |r| r.get(0))?;
        let revision = revision + 1;
        let mut changes = Vec::with_capacity(ops.len());
        for op in &ops {
            match op {
                Op::Create { kind, name, body } => {
                    let n = tx.execute(
                        "INSERT OR IGNORE INTO objects (kind, name, revision, body) VALUES (?1, ?2, ?3, ?4)",
                        params![kind.as_str(), name, revision, body],
                    )?;
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
                    tx.execute(
                        "UPDATE objects SET revision = ?3, body = ?4 WHERE kind = ?1 AND name = ?2",
                        params![kind.as_str(), name, revision, body],
                    )?;
                    changes.push((*kind, name.clone(), false));
                }
                Op::Delete {
                    kind,
                    name,
                    expected_revision,
                } => {
                    check_revision(&tx, *kind, name, *expected_revision)?;
                    tx.execute(
                        "DELETE FROM objects WHERE kind = ?1 AND name = ?2",
                        params![kind.as_str(), name],
                    )?;
                    changes.push((*kind, name.clone(), true));
                }
            }
        }
        tx.execute(
            "UPDATE revision SET value = ?1 WHERE id = 0",
            params![revision],
        )?;
        tx.commit()?;
        drop(conn);
        for (kind, name, deleted) in changes {
            // Nobody listening is fine: watchers re-list on start.
            let _ = self.changes.send(Change {
                kind,
                name,
                revision: revision as u64,
                deleted,
            });
        }
        Ok(revision as u64)
    }

    /// Reads and decodes one object.
    pub fn get_json<T: DeserializeOwned>(
        &self,
        kind: Kind,
        name: &str,
    ) -> Result<Option<(T, u64)>, StoreError> {
        self.get(kind, name)?
            .map(|r| decode(kind, &r).map(|v| (v, r.revision)))
            .transpose()
    }

    /// Reads and decodes every object of a kind.
    pub fn list_json<T: DeserializeOwned>(&self, kind: Kind) -> Result<Vec<(T, u64)>, StoreError> {
        self.list(kind)?
            .iter()
            .map(|r| decode(kind, r).map(|v| (v, r.revision)))
            .collect()
    }

    /// Creates one object.
    pub fn create_json<T: Serialize>(
        &self,
        kind: Kind,
        name: &str,
        v: &T,
    ) -> Result<u64, StoreError> {
        self.txn(vec![Op::Create {
            kind,
            name: name.to_owned(),
            body: encode(v),
        }])
    }

    /// Updates one object, conditional on its revision when given.
    pub fn update_json<T: Serialize>(
        &self,
        kind: Kind,
        name: &str,
        v: &T,
        expected_revision: Option<u64>,
    ) -> Result<u64, StoreError> {
        self.txn(vec![Op::Update {
            kind,
            name: name.to_owned(),
            body: encode(v),
            expected_revision,
        }])
    }

    /// Deletes one object, conditional on its revision when given.
    pub fn delete(
        &self,
        kind: Kind,
        name: &str,
        expected_revision: Option<u64>,
    ) -> Result<u64, StoreError> {
        self.txn(vec![Op::Delete {
            kind,
            name: name.to_owned(),
            expected_revision,
        }])
    }
}

/// Serializes a value for storage.
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("stored types serialize")
}

fn decode<T: DeserializeOwned>(kind: Kind, r: &Record) -> Result<T, StoreError> {
    serde_json::from_slice(&r.body).map_err(|e| StoreError::Corrupt {
        kind: kind.as_str(),
        name: r.name.clone(),
        detail: e.to_string(),
    })
}

fn check_revision(
    tx: &rusqlite::Transaction<'_>,
    kind: Kind,
    name: &str,
    expected: Option<u64>,
) -> Result<(), StoreError> {
    let found: Option<i64> = tx
        .query_row(
            "SELECT revision FROM objects WHERE kind = ?1 AND name = ?2",
            params![kind.as_str(), name],
            |r| r.get(0),
        )
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

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_sqlite(&dir.path().join("s.db")).unwrap();
        (dir, s)
    }

    #[test]
    fn create_update_conflict_delete() {
        let (_d, s) = store();
        let r1 = s.create_json(Kind::Cluster, "a", &1u32).unwrap();
        assert!(matches!(
            s.create_json(Kind::Cluster, "a", &2u32),
            Err(StoreError::AlreadyExists { .. })
        ));
        let r2 = s.update_json(Kind::Cluster, "a", &2u32, Some(r1)).unwrap();
        assert!(r2 > r1);
        assert!(matches!(
            s.update_json(Kind::Cluster, "a", &3u32, Some(r1)),
            Err(StoreError::Conflict { .. })
        ));
        assert_eq!(
            s.get_json::<u32>(Kind::Cluster, "a").unwrap(),
            Some((2, r2))
        );
        s.delete(Kind::Cluster, "a", Some(r2)).unwrap();
        assert!(s.get(Kind::Cluster, "a").unwrap().is_none());
    }

    #[test]
    fn failed_transaction_writes_nothing() {
        let (_d, s) = store();
        s.create_json(Kind::Machine, "m", &1u32).unwrap();
        let err = s.txn(vec![
            Op::Create {
                kind: Kind::Machine,
                name: "n".into(),
                body: encode(&1u32),
            },
            Op::Update {
                kind: Kind::Machine,
                name: "missing".into(),
                body: encode(&1u32),
                expected_revision: None,
            },
        ]);
        assert!(matches!(err, Err(StoreError::NotFound { .. })));
        assert!(s.get(Kind::Machine, "n").unwrap().is_none());
        assert_eq!(s.list(Kind::Machine).unwrap().len(), 1);
    }

    #[test]
    fn survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let rev = {
            let s = Store::open_sqlite(&path).unwrap();
            s.create_json(Kind::Secret, "k", &"v").unwrap()
        };
        let s = Store::open_sqlite(&path).unwrap();
        assert_eq!(
            s.get_json::<String>(Kind::Secret, "k").unwrap(),
            Some(("v".to_string(), rev))
        );
        assert!(s.create_json(Kind::Secret, "k2", &"v").unwrap() > rev);
    }

    #[test]
    fn secrets_are_sealed_on_disk_and_need_the_key() {
        use crate::keyring::{KeySource, Keyring};
        use base64::Engine;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let ring = |k: &str| Arc::new(RwLock::new(Keyring::parse(k, KeySource::Env).unwrap()));
        let s = Store::open_sqlite(&path).unwrap().with_keyring(ring(&key));
        s.create_json(Kind::Secret, "ca", &"PRIVATE KEY MATERIAL")
            .unwrap();
        s.create_json(Kind::Cluster, "c", &"public").unwrap();
        assert_eq!(
            s.get_json::<String>(Kind::Secret, "ca").unwrap().unwrap().0,
            "PRIVATE KEY MATERIAL"
        );
        let raw = s.get_raw(Kind::Secret, "ca").unwrap().unwrap().body;
        assert!(!String::from_utf8_lossy(&raw).contains("PRIVATE"));
        assert!(
            String::from_utf8_lossy(&s.get_raw(Kind::Cluster, "c").unwrap().unwrap().body)
                .contains("public")
        );
        drop(s);
        let other = base64::engine::general_purpose::STANDARD.encode([8u8; 32]);
        let s = Store::open_sqlite(&path)
            .unwrap()
            .with_keyring(ring(&other));
        assert!(matches!(s.reseal_all(), Err(StoreError::Sealed(_))));
        assert!(matches!(
            s.get(Kind::Secret, "ca"),
            Err(StoreError::Sealed(_))
        ));
    }
}
