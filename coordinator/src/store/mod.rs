//! The store: every durable object of the coordinator, behind one interface.
//!
//! Objects are JSON documents addressed by `(kind, name)`. Each write bumps a
//! global revision (as etcd does), and each object remembers the revision of
//! its last write, which the API exposes as `resourceVersion`. Writes are
//! transactions of operations with preconditions on those revisions, so
//! callers get optimistic concurrency and multi-object atomicity (a ticket
//! redemption and the machine it registers commit together or not at all).
//!
//! Two backends implement [`Backend`] with the same semantics: SQLite in one
//! file of the data directory (`sqlite.rs`, the embedded default) and etcd
//! (`etcd.rs`, so several coordinator replicas share one store). This module
//! keeps what they share: sealing secret kinds at rest (backends only ever
//! see sealed bytes), JSON encoding, and the change broadcast.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::broadcast;

mod backend;
pub mod backup;
mod cache;
mod etcd;
pub mod keyring;
mod sqlite;
#[cfg(test)]
pub(crate) mod test_etcd;

use backend::Backend;
pub use backend::{attributed, Change, Fence, History, Kind, Op, Record, Span, StoreError};
pub use etcd::{Election, EtcdOptions, EtcdTls, EtcdTlsError, TlsFile};

/// Where `drover serve` keeps its objects (`--store`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// SQLite, `drover.db` in this directory (`None`: the data directory).
    Sqlite(Option<PathBuf>),
    /// An etcd cluster: client endpoints as `host:port`, and the key prefix
    /// (`/drover` unless the URL has a path) under which objects live.
    Etcd {
        endpoints: Vec<String>,
        prefix: String,
    },
}

impl std::str::FromStr for Location {
    type Err = LocationError;

    /// `sqlite`, `sqlite:DIR`, or `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`.
    fn from_str(s: &str) -> Result<Self, LocationError> {
        if s == "sqlite" {
            return Ok(Location::Sqlite(None));
        }
        if let Some(dir) = s.strip_prefix("sqlite:") {
            if dir.is_empty() || dir.starts_with("//") {
                return Err(LocationError::NoSqliteDir {
                    input: s.to_owned(),
                });
            }
            return Ok(Location::Sqlite(Some(PathBuf::from(dir))));
        }
        let Some(rest) = s.strip_prefix("etcd://") else {
            return Err(LocationError::NotAStore {
                input: s.to_owned(),
            });
        };
        let (hosts, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let mut endpoints = vec![];
        for ep in hosts.split(',') {
            endpoints.push(parse_endpoint(ep).map_err(|why| LocationError::Endpoint {
                input: s.to_owned(),
                why,
            })?);
        }
        let prefix = path.trim_end_matches('/');
        let prefix = if prefix.is_empty() { "/drover" } else { prefix };
        if prefix.contains("//") || prefix.chars().any(|c| c.is_control() || c == ' ') {
            return Err(LocationError::Prefix {
                input: s.to_owned(),
                prefix: prefix.to_owned(),
            });
        }
        Ok(Location::Etcd {
            endpoints,
            prefix: prefix.to_owned(),
        })
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(None) => write!(f, "sqlite"),
            Location::Sqlite(Some(d)) => write!(f, "sqlite:{}", d.display()),
            Location::Etcd { endpoints, prefix } => {
                write!(f, "etcd://{}{prefix}", endpoints.join(","))
            }
        }
    }
}

/// Checks one `host:port` (or `[v6]:port`) of an etcd URL.
fn parse_endpoint(ep: &str) -> Result<String, EndpointError> {
    let (host, port) = if let Some(v6) = ep.strip_prefix('[') {
        let (h, p) = v6
            .split_once("]:")
            .ok_or_else(|| EndpointError::NotIpv6Port(ep.to_owned()))?;
        h.parse::<std::net::Ipv6Addr>()
            .map_err(|_| EndpointError::BadIpv6(ep.to_owned()))?;
        (h, p)
    } else {
        ep.rsplit_once(':')
            .ok_or_else(|| EndpointError::NotHostPort(ep.to_owned()))?
    };
    let valid_host = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if !valid_host {
        return Err(EndpointError::BadHost(ep.to_owned()));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(ep.to_owned()),
        _ => Err(EndpointError::BadPort(ep.to_owned())),
    }
}

/// What `--store` accepts.
const LOCATION_USAGE: &str =
    "expected sqlite, sqlite:DIR or etcd://HOST:PORT[,HOST:PORT...][/PREFIX]";

/// Why a `--store` value is not a store location.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum LocationError {
    #[error("{input:?}: sqlite:DIR needs a directory path; {usage}", usage = LOCATION_USAGE)]
    NoSqliteDir { input: String },
    #[error("{input:?} is not a store; {usage}", usage = LOCATION_USAGE)]
    NotAStore { input: String },
    #[error("{input:?}: {why}; {usage}", usage = LOCATION_USAGE)]
    Endpoint { input: String, why: EndpointError },
    #[error("{input:?}: the key prefix {prefix:?} is malformed; {usage}", usage = LOCATION_USAGE)]
    Prefix { input: String, prefix: String },
}

/// Why one `host:port` of an etcd URL is malformed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("endpoint {0:?} is not [IPV6]:PORT")]
    NotIpv6Port(String),
    #[error("endpoint {0:?} has a malformed IPv6 address")]
    BadIpv6(String),
    #[error("endpoint {0:?} is not HOST:PORT")]
    NotHostPort(String),
    #[error("endpoint {0:?} has no valid host")]
    BadHost(String),
    #[error("endpoint {0:?} has no valid port")]
    BadPort(String),
}

tokio::task_local! {
    static FENCE: Fence;
}

/// Runs `work` (one reconcile pass, one machine API request) with every
/// store write it makes fenced by `term`.
pub async fn fenced<F: std::future::Future>(term: Fence, work: F) -> F::Output {
    FENCE.scope(term, work).await
}

/// The term the current task's writes are fenced by, if any.
pub fn current_fence() -> Option<Fence> {
    FENCE.try_with(|f| *f).ok()
}

/// Runs synchronous `work` with every store write it makes fenced by `term`
/// (for work moved off the task that was fenced).
pub fn with_fence<T>(term: Fence, work: impl FnOnce() -> T) -> T {
    FENCE.sync_scope(term, work)
}

/// How many store changes a watcher may fall behind before it misses some
/// (and must read everything again): a burst of registrations commits
/// thousands of machines in seconds, and the reconciler must keep up with
/// them without rereading the fleet.
pub const CHANGE_BUFFER: usize = 65_536;

/// Runs blocking work (store reads and writes, certificate signing) on
/// tokio's blocking threads instead of an async worker, under the calling
/// task's fence. A slow fsync or etcd round trip then holds one of those
/// threads, not a worker that other requests (heartbeats) are waiting for.
pub async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let fence = current_fence();
    let task = tokio::task::spawn_blocking(move || match fence {
        Some(f) => with_fence(f, work),
        None => work(),
    });
    match task.await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// What [`Store::modify_json`]'s change decided.
#[derive(Debug)]
pub enum Modify<T, R> {
    /// Write nothing; answer this.
    Keep(R),
    /// Write this value; answer that once it is written.
    Write(T, R),
}

/// How often [`Store::modify_json`] retries a conflicting write.
pub const MODIFY_ATTEMPTS: u32 = 16;

/// The store handle, cheap to clone.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
    changes: broadcast::Sender<Change>,
    /// The last known copy of every object of a kind not sealed at rest.
    cache: Arc<cache::ReadCache>,
    /// Seals secret kinds at rest; `None` only in tests of the store itself.
    keyring: Option<Arc<RwLock<crate::store::keyring::Keyring>>>,
    /// Leader election, on a store several replicas share (etcd).
    election: Option<etcd::Election>,
    /// The exclusive lock of a SQLite database being served.
    serving: Option<Arc<nix::fcntl::Flock<std::fs::File>>>,
}

impl Store {
    /// Opens (creating if needed) the SQLite store at `path`.
    pub fn open_sqlite(path: &Path) -> Result<Self, StoreError> {
        let (changes, _) = broadcast::channel(CHANGE_BUFFER);
        let backend = sqlite::Sqlite::open(path, changes.clone())?;
        Ok(Self::new(Arc::new(backend), changes, Arc::default()))
    }

    /// Opens the SQLite store at `path` for serving: exclusively, holding a
    /// lock on `PATH.lock` for as long as any handle lives. The read cache
    /// assumes this process makes every write; a second coordinator on the
    /// same database would break that, so it is refused with who holds it.
    pub fn open_sqlite_exclusive(path: &Path) -> Result<Self, StoreError> {
        use nix::fcntl::{Flock, FlockArg};
        let lock_path = path.with_extension("db.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock_path)
            .map_err(|e| {
                StoreError::Backend(format!(
                    "cannot open the lock file {}: {e}",
                    lock_path.display()
                ))
            })?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
            if errno == nix::errno::Errno::EWOULDBLOCK {
                StoreError::Backend(format!(
                    "another coordinator is serving the SQLite store {} (it holds {}); stop it, or give this one another --data-dir",
                    path.display(),
                    lock_path.display()
                ))
            } else {
                StoreError::Backend(format!("cannot lock {}: {errno}", lock_path.display()))
            }
        })?;
        let mut store = Self::open_sqlite(path)?;
        store.serving = Some(Arc::new(lock));
        Ok(store)
    }

    /// Connects to the etcd cluster of `options`, checks that it answers,
    /// and starts watching its prefix.
    pub fn open_etcd(options: &EtcdOptions) -> Result<Self, StoreError> {
        let (changes, _) = broadcast::channel(CHANGE_BUFFER);
        let cache = Arc::new(cache::ReadCache::default());
        let backend = etcd::Etcd::open(options, changes.clone(), cache.clone())?;
        let election = backend.election();
        let mut store = Self::new(Arc::new(backend), changes, cache);
        store.election = Some(election);
        Ok(store)
    }

    fn new(
        backend: Arc<dyn Backend>,
        changes: broadcast::Sender<Change>,
        cache: Arc<cache::ReadCache>,
    ) -> Self {
        Self {
            backend,
            changes,
            cache,
            keyring: None,
            election: None,
            serving: None,
        }
    }

    /// Leader election among the replicas sharing this store; `None` for a
    /// store only one coordinator can open (SQLite), whose single replica
    /// always leads.
    pub fn election(&self) -> Option<&etcd::Election> {
        self.election.as_ref()
    }

    /// Where the data lives, for messages.
    pub fn describe(&self) -> String {
        self.backend.describe()
    }

    /// Encrypts secret kinds with `keyring` from now on.
    pub fn with_keyring(mut self, keyring: Arc<RwLock<crate::store::keyring::Keyring>>) -> Self {
        self.keyring = Some(keyring);
        self
    }

    /// The keyring, if the store encrypts.
    pub fn keyring(&self) -> Option<&Arc<RwLock<crate::store::keyring::Keyring>>> {
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

    /// Reads one object as stored (still sealed), from the backend: the
    /// latest committed copy (refreshing the read cache).
    pub fn get_raw(&self, kind: Kind, name: &str) -> Result<Option<Record>, StoreError> {
        self.read_through(kind, "get", || self.backend.get(kind, name))
    }

    /// Reads records of `kind` from the backend with `read` (timed as
    /// `operation`) and, for a kind the read cache holds, installs them
    /// there; the cache's epoch is taken before the read, so records a
    /// removal made stale meanwhile are not installed.
    fn read_through<R>(
        &self,
        kind: Kind,
        operation: &'static str,
        read: impl FnOnce() -> Result<R, StoreError>,
    ) -> Result<R, StoreError>
    where
        for<'a> &'a R: IntoIterator<Item = &'a Record>,
    {
        if !cache::caches(kind) {
            return timed(operation, read);
        }
        let epoch = self.cache.epoch();
        let records = timed(operation, read)?;
        self.cache.fill(kind, epoch, (&records).into_iter());
        Ok(records)
    }

    /// Reads one object of a kind not sealed at rest from the read cache,
    /// or from the backend when the cache lacks it. Every write this
    /// process made is visible; another replica's write becomes visible
    /// when the etcd watch delivers it (milliseconds). For reads on hot
    /// paths (every heartbeat authenticates its machine) whose decisions
    /// do not need the very latest copy: a read-modify-write re-reads
    /// with [`Store::get`] on a conflict anyway.
    pub fn get_cached(&self, kind: Kind, name: &str) -> Result<Option<Record>, StoreError> {
        if cache::caches(kind) {
            if let Some(r) = self.cache.get(kind, name) {
                return Ok(Some(r));
            }
        }
        self.get(kind, name)
    }

    /// The revision of one object as the read cache holds it, without
    /// copying its body or reading the backend: `None` when the object is
    /// not cached (gone, changed elsewhere since, or never read). For the
    /// datagram heartbeat, which asks only whether a machine changed.
    pub fn cached_revision(&self, kind: Kind, name: &str) -> Option<u64> {
        self.cache.revision(kind, name)
    }

    /// Whether a cached copy is the latest committed one: while this
    /// process serves a SQLite store it makes every write, and installs
    /// each in the cache before the write returns. On etcd another
    /// replica's write shows only once the watch delivers it.
    pub fn cache_is_current(&self) -> bool {
        self.serving.is_some()
    }

    /// Reads and decodes one object like [`Store::get_cached`].
    pub fn get_json_cached<T: DeserializeOwned>(
        &self,
        kind: Kind,
        name: &str,
    ) -> Result<Option<(T, u64)>, StoreError> {
        decode_record(kind, self.get_cached(kind, name)?)
    }

    /// Reads and decodes the object a [`Change`] announced, at its revision
    /// or later: from the read cache when the cache has caught up, else
    /// from the backend. (A backend announces a commit before the writer
    /// installs it in the cache, so for a moment the cache may still hold
    /// the copy from before the change.)
    pub fn get_json_at_least<T: DeserializeOwned>(
        &self,
        kind: Kind,
        name: &str,
        revision: u64,
    ) -> Result<Option<(T, u64)>, StoreError> {
        match self.get_json_cached::<T>(kind, name)? {
            Some((v, rev)) if rev >= revision => Ok(Some((v, rev))),
            _ => self.get_json::<T>(kind, name),
        }
    }

    /// Reads every object of a kind as stored (still sealed), ordered by
    /// name, always from the backend (refreshing the read cache).
    pub fn list_raw(&self, kind: Kind) -> Result<Vec<Record>, StoreError> {
        self.list_raw_page(kind, Span::ALL)
    }

    /// Reads the objects of a kind in `span` as stored, ordered by name.
    fn list_raw_page(&self, kind: Kind, span: Span<'_>) -> Result<Vec<Record>, StoreError> {
        self.read_through(kind, "list", || self.backend.list(kind, span))
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
        for kind in Kind::ALL.into_iter().filter(|k| k.is_sealed()) {
            for r in self.list_raw(kind)? {
                let primary = keyring
                    .read()
                    .expect("keyring lock")
                    .primary_id()
                    .to_owned();
                let sealed_with = crate::store::keyring::Keyring::sealed_with(&r.body);
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

    /// The store's revision now (see `Backend::revision`).
    pub fn revision(&self) -> Result<u64, StoreError> {
        self.backend.revision()
    }

    /// The newest changes the store keeps, at most `limit` (see
    /// [`History`]): what a watch from before this process started can
    /// still be replayed from.
    pub fn history(&self, limit: usize) -> Result<History, StoreError> {
        self.backend.history(limit)
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
        let fence = current_fence();
        // What the transaction leaves in each cached object, in order: a
        // later operation on the same object wins.
        let mut outcome: std::collections::HashMap<(Kind, &str), Option<&[u8]>> =
            std::collections::HashMap::new();
        for op in &ops {
            match op {
                Op::Create { kind, name, body }
                | Op::Update {
                    kind, name, body, ..
                } => {
                    outcome.insert((*kind, name), Some(body));
                }
                Op::Delete { kind, name, .. } => {
                    outcome.insert((*kind, name), None);
                }
            }
        }
        outcome.retain(|(kind, _), _| cache::caches(*kind));
        let result = timed("txn", || self.backend.txn(&ops, fence));
        for ((kind, name), body) in outcome {
            match (&result, body) {
                (Ok(revision), Some(body)) => self.cache.wrote(kind, name, *revision, body),
                // Deleted, or a failed precondition: the cached copy may be stale.
                _ => self.cache.changed(kind, name, None),
            }
        }
        result
    }

    /// Reads and decodes one object.
    pub fn get_json<T: DeserializeOwned>(
        &self,
        kind: Kind,
        name: &str,
    ) -> Result<Option<(T, u64)>, StoreError> {
        decode_record(kind, self.get(kind, name)?)
    }

    /// Reads and decodes every object of a kind.
    pub fn list_json<T: DeserializeOwned>(&self, kind: Kind) -> Result<Vec<(T, u64)>, StoreError> {
        self.list_json_page(kind, Span::ALL)
    }

    /// Decodes the objects of a kind in `span`, ordered by name: one page
    /// of a list reads only that page.
    pub fn list_json_page<T: DeserializeOwned>(
        &self,
        kind: Kind,
        span: Span<'_>,
    ) -> Result<Vec<(T, u64)>, StoreError> {
        self.list_raw_page(kind, span)?
            .into_iter()
            .map(|r| {
                let r = self.open(kind, r)?;
                decode(kind, &r).map(|v| (v, r.revision))
            })
            .collect()
    }

    /// Creates one object.
    pub fn create_json<T: Serialize>(
        &self,
        kind: Kind,
        name: &str,
        v: &T,
    ) -> Result<u64, StoreError> {
        self.txn(vec![Op::create(kind, name, v)])
    }

    /// Read-modify-write of one object with optimistic concurrency, the one
    /// retry-on-conflict loop for records that are not `App` objects (join
    /// tokens, the admin token list). `change` sees the current value
    /// (`None` when absent) and says what to do; on a conflict (or a create
    /// that lost a race) it runs again on the newer value, up to
    /// [`MODIFY_ATTEMPTS`] times.
    pub fn modify_json<T, R, E>(
        &self,
        kind: Kind,
        name: &str,
        mut change: impl FnMut(Option<T>) -> Result<Modify<T, R>, E>,
    ) -> Result<R, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<StoreError>,
    {
        for _ in 0..MODIFY_ATTEMPTS {
            let current = self.get_json::<T>(kind, name)?;
            let rev = current.as_ref().map(|(_, r)| *r);
            let (value, result) = match change(current.map(|(v, _)| v))? {
                Modify::Keep(result) => return Ok(result),
                Modify::Write(value, result) => (value, result),
            };
            let written = match rev {
                Some(rev) => self.update_json(kind, name, &value, Some(rev)),
                None => self.create_json(kind, name, &value),
            };
            match written {
                Ok(_) => return Ok(result),
                Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(StoreError::Contended {
            kind: kind.as_str(),
            name: name.to_owned(),
            attempts: MODIFY_ATTEMPTS,
        }
        .into())
    }

    /// Updates one object, conditional on its revision when given.
    pub fn update_json<T: Serialize>(
        &self,
        kind: Kind,
        name: &str,
        v: &T,
        expected_revision: Option<u64>,
    ) -> Result<u64, StoreError> {
        self.txn(vec![Op::update(kind, name, v, expected_revision)])
    }

    /// Deletes one object, conditional on its revision when given.
    pub fn delete(
        &self,
        kind: Kind,
        name: &str,
        expected_revision: Option<u64>,
    ) -> Result<u64, StoreError> {
        self.txn(vec![Op::delete(kind, name, expected_revision)])
    }
}

/// Runs one backend operation, recording its time and result in the
/// `drover_store_operation_duration_seconds` metric.
fn timed<T>(
    operation: &'static str,
    work: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let started = std::time::Instant::now();
    let r = work();
    let result = match &r {
        Ok(_) => "ok",
        Err(
            StoreError::Conflict { .. }
            | StoreError::AlreadyExists { .. }
            | StoreError::NotFound { .. },
        ) => "conflict",
        Err(_) => "error",
    };
    crate::metrics::global().store_operation(operation, result, started.elapsed());
    r
}

impl Op {
    /// Creates object `name` of `kind` holding `v`.
    pub fn create<T: Serialize>(kind: Kind, name: &str, v: &T) -> Self {
        Op::Create {
            kind,
            name: name.to_owned(),
            body: encode(v),
        }
    }

    /// Updates object `name` of `kind` to `v`, conditional on its revision
    /// when given.
    pub fn update<T: Serialize>(
        kind: Kind,
        name: &str,
        v: &T,
        expected_revision: Option<u64>,
    ) -> Self {
        Op::Update {
            kind,
            name: name.to_owned(),
            body: encode(v),
            expected_revision,
        }
    }

    /// Deletes object `name` of `kind`, conditional on its revision when
    /// given.
    pub fn delete(kind: Kind, name: &str, expected_revision: Option<u64>) -> Self {
        Op::Delete {
            kind,
            name: name.to_owned(),
            expected_revision,
        }
    }
}

/// Decodes a record read, if there is one, with its revision.
fn decode_record<T: DeserializeOwned>(
    kind: Kind,
    record: Option<Record>,
) -> Result<Option<(T, u64)>, StoreError> {
    record
        .map(|r| decode(kind, &r).map(|v| (v, r.revision)))
        .transpose()
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

#[cfg(test)]
mod tests {
    use super::test_etcd::TestEtcd;
    use super::*;
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    /// The data a test runs on, behind either backend; `open` gives a new
    /// handle on the same data (a reopened file, or another replica).
    enum Backing {
        Sqlite(tempfile::TempDir),
        Etcd(TestEtcd),
    }

    impl Backing {
        fn sqlite() -> Self {
            Backing::Sqlite(tempfile::tempdir().unwrap())
        }

        fn etcd() -> Option<Self> {
            TestEtcd::start().map(Backing::Etcd)
        }

        fn open(&self) -> Store {
            match self {
                Backing::Sqlite(dir) => Store::open_sqlite(&dir.path().join("s.db")).unwrap(),
                Backing::Etcd(etcd) => etcd.open(),
            }
        }
    }

    /// Runs each test body once per backend: `store::tests::NAME::sqlite`
    /// and `store::tests::NAME::etcd`.
    macro_rules! on_both_backends {
        ($($name:ident),* $(,)?) => {$(
            mod $name {
                #[test]
                fn sqlite() {
                    super::$name(&super::Backing::sqlite());
                }

                #[test]
                fn etcd() {
                    if let Some(b) = super::Backing::etcd() {
                        super::$name(&b);
                    }
                }
            }
        )*};
    }

    on_both_backends!(
        create_update_conflict_delete,
        create_twice_already_exists,
        failed_transaction_writes_nothing,
        one_failing_precondition_writes_nothing,
        operations_apply_in_order,
        concurrent_updates_conflict,
        revisions_strictly_increase,
        list_is_complete_and_ordered,
        survives_reopen,
        secrets_are_sealed_at_rest_and_need_the_key,
        watch_reports_committed_changes,
        modify_creates_retries_a_conflict_and_keeps,
        a_backup_holds_every_object_at_one_revision_and_restores,
        history_survives_reopen,
    );

    /// The store's change history outlives the handle that wrote it:
    /// another handle (a restarted coordinator, another replica) reads
    /// every change after the floor, deletions included, and a limit
    /// keeps the newest.
    fn history_survives_reopen(b: &Backing) {
        let first = b.open();
        let start = first.revision().unwrap();
        first.create_json(Kind::Cluster, "h-a", &1).unwrap();
        first.create_json(Kind::Cluster, "h-b", &2).unwrap();
        first.delete(Kind::Cluster, "h-a", None).unwrap();
        let head = first.revision().unwrap();
        drop(first);
        let second = b.open();
        let history = second.history(100).unwrap();
        assert!(
            history.floor <= start && history.head >= head,
            "{history:?}"
        );
        let seen: Vec<(&str, bool)> = history
            .changes
            .iter()
            .filter(|c| c.kind == Kind::Cluster && c.name.starts_with("h-"))
            .map(|c| (c.name.as_str(), c.deleted))
            .collect();
        assert_eq!(seen, [("h-a", false), ("h-b", false), ("h-a", true)]);
        assert!(history
            .changes
            .windows(2)
            .all(|w| w[0].revision <= w[1].revision));
        let newest = second.history(1).unwrap();
        assert_eq!(newest.changes.len(), 1, "{newest:?}");
        assert_eq!(newest.floor, newest.changes[0].revision - 1);
    }

    /// A backup taken while another handle writes holds every object as
    /// stored (a sealed one still sealed) at one revision, and opens as a
    /// SQLite store that reads the same and goes on from that revision.
    fn a_backup_holds_every_object_at_one_revision_and_restores(b: &Backing) {
        let s = b.open();
        for i in 0..300 {
            s.create_json(Kind::Machine, &format!("m-{i:03}"), &i)
                .unwrap();
        }
        s.create_json(Kind::Cluster, "c", &"cluster").unwrap();
        let secret_rev = s.create_json(Kind::Secret, "ca", &"key material").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let writer = {
            let other = b.open();
            std::thread::spawn(move || {
                for i in 0..200 {
                    other
                        .create_json(Kind::Machine, &format!("n-{i:03}"), &i)
                        .unwrap();
                }
            })
        };
        let file = dir.path().join("backup.db");
        let summary = s.backup(&file).unwrap();
        writer.join().unwrap();
        // Whatever the writer had done by then, the counts and revision
        // agree: every object written at or before the revision, none after.
        let count = |k: Kind| summary.counts.iter().find(|(x, _)| *x == k).unwrap().1;
        let written_by_then = count(Kind::Machine) - 300;
        assert!(written_by_then <= 200, "{summary:?}");
        assert_eq!(count(Kind::Cluster), 1);
        assert_eq!(count(Kind::Secret), 1);
        assert!(summary.revision >= secret_rev, "{summary:?}");
        assert!(summary.bytes > 0);
        assert!(s.backup(&file).is_err(), "a backup never overwrites a file");

        let (revision, records) = backup::read_snapshot(&file).unwrap();
        assert_eq!(revision, summary.revision);
        let sealed = records
            .iter()
            .find(|(k, r)| *k == Kind::Secret && r.name == "ca")
            .unwrap();
        assert_eq!(
            sealed.1.body,
            s.get_raw(Kind::Secret, "ca").unwrap().unwrap().body,
            "sealed records are copied as stored"
        );
        assert!(records.iter().all(|(_, r)| r.revision <= summary.revision));

        // The backup is a store of its own.
        let restored_dir = tempfile::tempdir().unwrap();
        let db = restored_dir.path().join("drover.db");
        std::fs::copy(&file, &db).unwrap();
        let restored = Store::open_sqlite(&db).unwrap();
        let machines = restored.list_json::<u32>(Kind::Machine).unwrap();
        assert_eq!(machines.len(), count(Kind::Machine));
        assert_eq!(
            restored
                .get_json::<String>(Kind::Cluster, "c")
                .unwrap()
                .unwrap()
                .0,
            "cluster"
        );
        let next = restored
            .create_json(Kind::Cluster, "after", &"restore")
            .unwrap();
        assert!(next > summary.revision, "{next} after {}", summary.revision);
    }

    /// `modify_json` creates an absent record, runs its change again on the
    /// newer value after a concurrent write, and writes nothing on `Keep`.
    fn modify_creates_retries_a_conflict_and_keeps(b: &Backing) {
        let s = b.open();
        let other = b.open();
        let n: u32 = s
            .modify_json(Kind::JoinTokens, "m", |v: Option<u32>| {
                assert!(v.is_none());
                Ok::<_, StoreError>(Modify::Write(1, 1))
            })
            .unwrap();
        assert_eq!(n, 1);
        let mut calls = 0;
        let seen = s
            .modify_json(Kind::JoinTokens, "m", |v: Option<u32>| {
                calls += 1;
                let v = v.unwrap();
                if calls == 1 {
                    // Someone else writes between this read and its write.
                    let (_, rev) = other
                        .get_json::<u32>(Kind::JoinTokens, "m")
                        .unwrap()
                        .unwrap();
                    other
                        .update_json(Kind::JoinTokens, "m", &10u32, Some(rev))
                        .unwrap();
                }
                Ok::<_, StoreError>(Modify::Write(v + 1, v))
            })
            .unwrap();
        assert_eq!((calls, seen), (2, 10), "the second run saw the other write");
        assert_eq!(
            s.get_json::<u32>(Kind::JoinTokens, "m").unwrap().unwrap().0,
            11
        );
        let rev = s.get_json::<u32>(Kind::JoinTokens, "m").unwrap().unwrap().1;
        let kept: &str = s
            .modify_json(Kind::JoinTokens, "m", |_: Option<u32>| {
                Ok::<_, StoreError>(Modify::Keep("kept"))
            })
            .unwrap();
        assert_eq!(kept, "kept");
        assert_eq!(
            s.get_json::<u32>(Kind::JoinTokens, "m").unwrap().unwrap().1,
            rev
        );
    }

    /// The next change within 10 s (etcd's arrive asynchronously).
    fn next_change(rx: &mut broadcast::Receiver<Change>) -> Change {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match rx.try_recv() {
                Ok(c) => return c,
                Err(broadcast::error::TryRecvError::Empty) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("no change within 10s: {e:?}"),
            }
        }
    }

    fn create_update_conflict_delete(b: &Backing) {
        let s = b.open();
        let r1 = s.create_json(Kind::Cluster, "a", &1u32).unwrap();
        assert!(matches!(
            s.create_json(Kind::Cluster, "a", &2u32),
            Err(StoreError::AlreadyExists { .. })
        ));
        let r2 = s.update_json(Kind::Cluster, "a", &2u32, Some(r1)).unwrap();
        assert!(r2 > r1);
        assert!(matches!(
            s.update_json(Kind::Cluster, "a", &3u32, Some(r1)),
            Err(StoreError::Conflict { expected, found, .. }) if expected == r1 && found == r2
        ));
        assert!(matches!(
            s.delete(Kind::Cluster, "a", Some(r1)),
            Err(StoreError::Conflict { .. })
        ));
        assert_eq!(
            s.get_json::<u32>(Kind::Cluster, "a").unwrap(),
            Some((2, r2))
        );
        // Unconditional writes need the object to exist.
        let r3 = s.update_json(Kind::Cluster, "a", &3u32, None).unwrap();
        assert!(r3 > r2);
        s.delete(Kind::Cluster, "a", Some(r3)).unwrap();
        assert!(s.get(Kind::Cluster, "a").unwrap().is_none());
        assert!(matches!(
            s.update_json(Kind::Cluster, "a", &4u32, None),
            Err(StoreError::NotFound {
                kind: "clusters",
                ..
            })
        ));
        assert!(matches!(
            s.delete(Kind::Cluster, "a", None),
            Err(StoreError::NotFound { .. })
        ));
    }

    fn create_twice_already_exists(b: &Backing) {
        let (s, other) = (b.open(), b.open());
        let r = s.create_json(Kind::Machine, "m", &"first").unwrap();
        for store in [&s, &other] {
            match store.create_json(Kind::Machine, "m", &"second") {
                Err(StoreError::AlreadyExists { kind, name }) => {
                    assert_eq!((kind, name.as_str()), ("machines", "m"))
                }
                other => panic!("expected AlreadyExists, got {other:?}"),
            }
        }
        assert_eq!(
            other.get_json::<String>(Kind::Machine, "m").unwrap(),
            Some(("first".to_string(), r))
        );
        // The same name in another kind is another object.
        s.create_json(Kind::Cluster, "m", &"cluster").unwrap();
    }

    fn failed_transaction_writes_nothing(b: &Backing) {
        let s = b.open();
        s.create_json(Kind::Machine, "m", &1u32).unwrap();
        let err = s.txn(vec![
            Op::create(Kind::Machine, "n", &1u32),
            Op::update(Kind::Machine, "missing", &1u32, None),
        ]);
        assert!(matches!(err, Err(StoreError::NotFound { .. })));
        assert!(s.get(Kind::Machine, "n").unwrap().is_none());
        assert_eq!(s.list(Kind::Machine).unwrap().len(), 1);
    }

    fn one_failing_precondition_writes_nothing(b: &Backing) {
        let s = b.open();
        let ry = s.create_json(Kind::Machine, "y", &1u32).unwrap();
        let ry2 = s.update_json(Kind::Machine, "y", &2u32, Some(ry)).unwrap();
        let rz = s.create_json(Kind::Machine, "z", &1u32).unwrap();
        let ops = |y_expected| {
            vec![
                Op::create(Kind::Machine, "x", &1u32),
                Op::update(Kind::Machine, "y", &3u32, Some(y_expected)),
                Op::delete(Kind::Machine, "z", Some(rz)),
            ]
        };
        match s.txn(ops(ry)) {
            Err(StoreError::Conflict {
                kind,
                name,
                expected,
                found,
            }) => assert_eq!(
                (kind, name.as_str(), expected, found),
                ("machines", "y", ry, ry2)
            ),
            other => panic!("expected a conflict on y, got {other:?}"),
        }
        assert!(s.get(Kind::Machine, "x").unwrap().is_none());
        assert_eq!(
            s.get_json::<u32>(Kind::Machine, "y").unwrap(),
            Some((2, ry2))
        );
        assert_eq!(
            s.get_json::<u32>(Kind::Machine, "z").unwrap(),
            Some((1, rz))
        );
        // The first failing operation is the one reported.
        let err = s.txn(vec![
            Op::delete(Kind::Machine, "nope", None),
            Op::create(Kind::Machine, "y", &0u32),
        ]);
        assert!(matches!(err, Err(StoreError::NotFound { name, .. }) if name == "nope"));
        // With every precondition right, all three commit at one revision.
        let r = s.txn(ops(ry2)).unwrap();
        assert_eq!(s.get(Kind::Machine, "x").unwrap().unwrap().revision, r);
        assert_eq!(s.get(Kind::Machine, "y").unwrap().unwrap().revision, r);
        assert!(s.get(Kind::Machine, "z").unwrap().is_none());
    }

    fn operations_apply_in_order(b: &Backing) {
        let s = b.open();
        let create = |v: u32| Op::create(Kind::Cluster, "c", &v);
        let update = |v: u32| Op::update(Kind::Cluster, "c", &v, None);
        let delete = || Op::delete(Kind::Cluster, "c", None);
        let r = s.txn(vec![create(1), update(2)]).unwrap();
        assert_eq!(s.get_json::<u32>(Kind::Cluster, "c").unwrap(), Some((2, r)));
        assert!(matches!(
            s.txn(vec![delete(), update(3)]),
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            s.txn(vec![delete(), create(4), create(5)]),
            Err(StoreError::AlreadyExists { .. })
        ));
        assert_eq!(s.get_json::<u32>(Kind::Cluster, "c").unwrap(), Some((2, r)));
        let r2 = s.txn(vec![delete(), create(6)]).unwrap();
        assert_eq!(
            s.get_json::<u32>(Kind::Cluster, "c").unwrap(),
            Some((6, r2))
        );
    }

    fn concurrent_updates_conflict(b: &Backing) {
        let (s1, s2) = (b.open(), b.open());
        let r = s1.create_json(Kind::Cluster, "c", &0u32).unwrap();
        // Two writers that read the same revision: one wins, one conflicts.
        let barrier = std::sync::Barrier::new(2);
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = [(&s1, 1u32), (&s2, 2u32)]
                .into_iter()
                .map(|(s, v)| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        barrier.wait();
                        s.update_json(Kind::Cluster, "c", &v, Some(r))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: Vec<u64> = results
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        assert_eq!(won.len(), 1, "exactly one writer wins: {results:?}");
        assert!(results.iter().any(|x| matches!(x,
            Err(StoreError::Conflict { expected, found, .. }) if *expected == r && *found == won[0]
        )));

        // Read-modify-write loops from four threads lose no increment.
        let stores = [b.open(), b.open(), s1.clone(), s2.clone()];
        std::thread::scope(|scope| {
            for s in &stores {
                scope.spawn(move || {
                    for _ in 0..10 {
                        loop {
                            let (v, rev) = s.get_json::<u32>(Kind::Cluster, "c").unwrap().unwrap();
                            match s.update_json(Kind::Cluster, "c", &(v + 100), Some(rev)) {
                                Ok(_) => break,
                                Err(StoreError::Conflict { .. }) => continue,
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                });
            }
        });
        let (v, _) = s1.get_json::<u32>(Kind::Cluster, "c").unwrap().unwrap();
        assert_eq!(v / 100, 40, "every one of 40 increments landed once");
    }

    fn revisions_strictly_increase(b: &Backing) {
        let (s, other) = (b.open(), b.open());
        let mut last = 0;
        let mut next = |r: u64| {
            assert!(r > last, "revision {r} after {last}");
            last = r;
            r
        };
        let a = next(s.create_json(Kind::Machine, "a", &1u32).unwrap());
        let b2 = next(other.create_json(Kind::Machine, "b", &1u32).unwrap());
        let a2 = next(s.update_json(Kind::Machine, "a", &2u32, Some(a)).unwrap());
        next(other.update_json(Kind::Machine, "b", &2u32, None).unwrap());
        let both = next(
            s.txn(vec![
                Op::update(Kind::Machine, "a", &3u32, Some(a2)),
                Op::create(Kind::Cluster, "k", &1u32),
            ])
            .unwrap(),
        );
        // Failed transactions do not count.
        assert!(s.update_json(Kind::Machine, "b", &9u32, Some(b2)).is_err());
        next(s.delete(Kind::Machine, "b", None).unwrap());
        let c = next(other.create_json(Kind::Machine, "c", &1u32).unwrap());
        // Each object carries the revision of its last write.
        let revs: Vec<(String, u64)> = other
            .list(Kind::Machine)
            .unwrap()
            .into_iter()
            .map(|r| (r.name, r.revision))
            .collect();
        assert_eq!(revs, [("a".to_string(), both), ("c".to_string(), c)]);
        assert_eq!(s.get(Kind::Cluster, "k").unwrap().unwrap().revision, both);
    }

    fn list_is_complete_and_ordered(b: &Backing) {
        let s = b.open();
        // More than one etcd page, written in transactions of 100.
        let mut names: Vec<String> = (0..600)
            .map(|i| format!("m-{:03}", (i * 7) % 600))
            .collect();
        for chunk in names.chunks(100) {
            s.txn(
                chunk
                    .iter()
                    .map(|n| Op::create(Kind::Machine, n, n))
                    .collect(),
            )
            .unwrap();
        }
        s.create_json(Kind::Cluster, "m-000x", &"another kind")
            .unwrap();
        names.sort();
        let listed = s.list_json::<String>(Kind::Machine).unwrap();
        assert_eq!(
            listed.iter().map(|(v, _)| v.clone()).collect::<Vec<_>>(),
            names
        );
        assert!(s.list(Kind::RegistrationToken).unwrap().is_empty());
        // Pages of 257 (an etcd range is read 256 at a time) from the name
        // after the last one listed give every name once, in order, and
        // a name that no longer exists still places the next page.
        let mut paged = vec![];
        let mut after = String::new();
        loop {
            let span = Span {
                after: &after,
                limit: Some(257),
            };
            let page = s.list_json_page::<String>(Kind::Machine, span).unwrap();
            assert!(page.len() <= 257);
            let Some((last, _)) = page.last() else { break };
            after = last.clone();
            paged.extend(page.into_iter().map(|(v, _)| v));
        }
        assert_eq!(paged, names);
        let span = Span {
            after: "m-0995",
            limit: Some(2),
        };
        let from_gone = s.list_json_page::<String>(Kind::Machine, span).unwrap();
        assert_eq!(
            from_gone
                .iter()
                .map(|(v, _)| v.as_str())
                .collect::<Vec<_>>(),
            ["m-100", "m-101"]
        );
    }

    fn survives_reopen(b: &Backing) {
        let rev = {
            let s = b.open();
            s.create_json(Kind::Secret, "k", &"v").unwrap()
        };
        let s = b.open();
        assert_eq!(
            s.get_json::<String>(Kind::Secret, "k").unwrap(),
            Some(("v".to_string(), rev))
        );
        assert!(s.create_json(Kind::Secret, "k2", &"v").unwrap() > rev);
    }

    fn ring(k: &str) -> Arc<RwLock<crate::store::keyring::Keyring>> {
        use crate::store::keyring::{KeySource, Keyring};
        Arc::new(RwLock::new(Keyring::parse(k, KeySource::Env).unwrap()))
    }

    fn key_b64(byte: u8) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode([byte; 32])
    }

    fn secrets_are_sealed_at_rest_and_need_the_key(b: &Backing) {
        let s = b.open().with_keyring(ring(&key_b64(7)));
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
        // Another handle with the same key reads it.
        assert_eq!(
            b.open()
                .with_keyring(ring(&key_b64(7)))
                .get_json::<String>(Kind::Secret, "ca")
                .unwrap()
                .unwrap()
                .0,
            "PRIVATE KEY MATERIAL"
        );
        drop(s);
        let s = b.open().with_keyring(ring(&key_b64(8)));
        assert!(matches!(s.reseal_all(), Err(StoreError::Sealed(_))));
        assert!(matches!(
            s.get(Kind::Secret, "ca"),
            Err(StoreError::Sealed(_))
        ));
    }

    fn watch_reports_committed_changes(b: &Backing) {
        let s = b.open();
        let mut rx = s.watch();
        let r1 = s.create_json(Kind::Machine, "m", &1u32).unwrap();
        let r2 = s.update_json(Kind::Machine, "m", &2u32, Some(r1)).unwrap();
        assert!(s.update_json(Kind::Machine, "m", &3u32, Some(r1)).is_err());
        let r3 = s
            .txn(vec![
                Op::delete(Kind::Machine, "m", Some(r2)),
                Op::create(Kind::Secret, "s", &1u32),
            ])
            .unwrap();
        let mut seen = vec![];
        for _ in 0..4 {
            let c = next_change(&mut rx);
            seen.push((c.kind, c.name, c.revision, c.deleted));
        }
        assert_eq!(
            seen,
            [
                (Kind::Machine, "m".to_string(), r1, false),
                (Kind::Machine, "m".to_string(), r2, false),
                (Kind::Machine, "m".to_string(), r3, true),
                (Kind::Secret, "s".to_string(), r3, false),
            ]
        );
        // The failed update announced nothing.
        std::thread::sleep(Duration::from_millis(200));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn etcd_watch_sees_writes_of_another_replica() {
        let Some(etcd) = TestEtcd::start() else {
            return;
        };
        let (a, b) = (etcd.open(), etcd.open());
        let mut rx = a.watch();
        let r = b.create_json(Kind::Cluster, "from-b", &1u32).unwrap();
        let c = next_change(&mut rx);
        assert_eq!(
            (c.kind, c.name.as_str(), c.revision, c.deleted),
            (Kind::Cluster, "from-b", r, false)
        );
        // A's read cache follows B's writes: the watch drops a cached copy
        // before it announces the change.
        assert_eq!(
            a.get_json_cached::<u32>(Kind::Cluster, "from-b").unwrap(),
            Some((1, r))
        );
        let r = b
            .update_json(Kind::Cluster, "from-b", &2u32, Some(r))
            .unwrap();
        assert_eq!(next_change(&mut rx).revision, r);
        assert_eq!(
            a.get_json_cached::<u32>(Kind::Cluster, "from-b").unwrap(),
            Some((2, r))
        );
        // Other prefixes on the same etcd are other stores.
        let elsewhere = Store::open_etcd(&etcd.options("/elsewhere")).unwrap();
        elsewhere.create_json(Kind::Cluster, "x", &1u32).unwrap();
        assert!(a.get(Kind::Cluster, "x").unwrap().is_none());
        let r = b.delete(Kind::Cluster, "from-b", None).unwrap();
        let c = next_change(&mut rx);
        assert_eq!(
            (c.name.as_str(), c.revision, c.deleted),
            ("from-b", r, true)
        );
        assert_eq!(
            a.get_json_cached::<u32>(Kind::Cluster, "from-b").unwrap(),
            None
        );
    }

    #[test]
    fn etcd_fences_writes_of_a_deposed_leader() {
        let Some(etcd) = TestEtcd::start() else {
            return;
        };
        let (a, b) = (etcd.open(), etcd.open());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (ea, eb) = (a.election().unwrap(), b.election().unwrap());
            let lease_a = ea.grant(Duration::from_secs(5)).await.unwrap();
            let term_a = ea.campaign(lease_a, b"a".to_vec()).await.unwrap().unwrap();
            // A second campaign under the same lease finds its own term.
            assert_eq!(
                ea.campaign(lease_a, b"a".to_vec()).await.unwrap(),
                Ok(term_a)
            );
            let lease_b = eb.grant(Duration::from_secs(5)).await.unwrap();
            assert_eq!(
                eb.campaign(lease_b, b"b".to_vec()).await.unwrap(),
                Err(b"a".to_vec())
            );
            assert!(ea.keep_alive(lease_a).await.unwrap() > Duration::ZERO);

            // The leader writes inside its term.
            let r = fenced(term_a, async { a.create_json(Kind::Cluster, "c", &1u32) })
                .await
                .unwrap();

            // Its lease ends (as when it is paused past it); b takes over.
            ea.resign(lease_a).await.unwrap();
            assert_eq!(ea.keep_alive(lease_a).await.unwrap(), Duration::ZERO);
            let term_b = eb.campaign(lease_b, b"b".to_vec()).await.unwrap().unwrap();
            assert_ne!(term_a, term_b);
            assert_eq!(ea.leader().await.unwrap(), Some((b"b".to_vec(), term_b)));

            // The old leader's late writes are refused and change nothing.
            let late = fenced(term_a, async {
                a.update_json(Kind::Cluster, "c", &2u32, Some(r))
            })
            .await;
            assert!(
                matches!(late, Err(StoreError::Fenced { term, .. }) if term == term_a.0),
                "{late:?}"
            );
            assert_eq!(a.get_json::<u32>(Kind::Cluster, "c").unwrap(), Some((1, r)));
            // Unfenced writes (the admin API on any replica) go through, and
            // so do the new leader's.
            let r2 = a.update_json(Kind::Cluster, "c", &3u32, Some(r)).unwrap();
            fenced(term_b, async {
                b.update_json(Kind::Cluster, "c", &4u32, Some(r2))
            })
            .await
            .unwrap();
            // The registry lists replicas while their leases live.
            eb.announce("b", b"info-b".to_vec(), lease_b).await.unwrap();
            assert_eq!(eb.replicas().await.unwrap(), vec![b"info-b".to_vec()]);
            eb.resign(lease_b).await.unwrap();
            assert!(eb.replicas().await.unwrap().is_empty());
            assert_eq!(eb.leader().await.unwrap(), None);
        });
    }

    #[test]
    fn etcd_holds_only_sealed_secrets() {
        let Some(etcd) = TestEtcd::start() else {
            return;
        };
        let s = etcd.open().with_keyring(ring(&key_b64(7)));
        s.create_json(Kind::Secret, "ca", &"PRIVATE KEY MATERIAL")
            .unwrap();
        s.create_json(Kind::JoinTokens, "c", &"abcdef.0123456789abcdef")
            .unwrap();
        s.create_json(Kind::Cluster, "c", &"public").unwrap();
        // Everything etcd holds, read with a plain etcd client.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let kvs: HashMap<String, Vec<u8>> = rt.block_on(async {
            let mut c = etcd_client::Client::connect([etcd.endpoints[0].as_str()], None)
                .await
                .unwrap();
            let opts = etcd_client::GetOptions::new().with_all_keys();
            let resp = c.get("", Some(opts)).await.unwrap();
            resp.kvs()
                .iter()
                .map(|kv| (kv.key_str().unwrap().to_owned(), kv.value().to_vec()))
                .collect()
        });
        let mut keys: Vec<&str> = kvs.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "/drover/clusters/c",
                "/drover/jointokens/c",
                "/drover/secrets/ca"
            ]
        );
        for (key, value) in &kvs {
            let text = String::from_utf8_lossy(value);
            assert!(
                !text.contains("PRIVATE") && !text.contains("abcdef"),
                "{key} holds plaintext: {text}"
            );
        }
        assert!(String::from_utf8_lossy(&kvs["/drover/clusters/c"]).contains("public"));
        // The same bytes the store reports as stored, readable through it.
        assert_eq!(
            s.get_raw(Kind::Secret, "ca").unwrap().unwrap().body,
            kvs["/drover/secrets/ca"]
        );
        assert_eq!(
            s.get_json::<String>(Kind::JoinTokens, "c")
                .unwrap()
                .unwrap()
                .0,
            "abcdef.0123456789abcdef"
        );
        assert_eq!(s.reseal_all().unwrap(), 0);
    }

    #[test]
    fn etcd_survives_losing_a_member() {
        let Some(mut etcd) = TestEtcd::start_cluster(3) else {
            return;
        };
        let s = etcd.open();
        let mut rx = s.watch();
        let r1 = s.create_json(Kind::Cluster, "c", &1u32).unwrap();
        assert_eq!(next_change(&mut rx).revision, r1);
        // The member that every request and the watch went to so far.
        etcd.kill_member(0);
        // If it was the leader, a write a follower takes before it notices
        // may time out, applied or not, until a new leader is elected: the
        // caller's read-modify-write loop sorts that out, as here.
        let deadline = Instant::now() + Duration::from_secs(30);
        let r2 = loop {
            match s.update_json(Kind::Cluster, "c", &2u32, Some(r1)) {
                Ok(r) => break r,
                Err(StoreError::Conflict { found, .. }) => break found,
                Err(StoreError::Backend(_)) if Instant::now() < deadline => continue,
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(
            s.get_json::<u32>(Kind::Cluster, "c").unwrap(),
            Some((2, r2))
        );
        assert_eq!(s.list(Kind::Cluster).unwrap().len(), 1);
        let c = next_change(&mut rx);
        assert_eq!((c.name.as_str(), c.revision), ("c", r2));
        // A replica starting now, the dead member first in its list.
        let other = etcd.open();
        assert_eq!(
            other.get_json::<u32>(Kind::Cluster, "c").unwrap(),
            Some((2, r2))
        );
        // Without a quorum, calls fail within the deadline, saying what failed.
        etcd.kill_member(1);
        let started = Instant::now();
        match s.update_json(Kind::Cluster, "c", &3u32, Some(r2)) {
            Err(StoreError::Backend(msg)) => {
                assert!(msg.contains("transaction on /drover/clusters/c"), "{msg}")
            }
            other => panic!("expected a backend error, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(8));
    }

    #[test]
    fn etcd_over_tls_with_a_client_certificate() {
        use drover_common::pki::{CertificateAuthority, LeafSpec, LeafUsage};
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate("test etcd CA").unwrap();
        let leaf = |cn: &str, usage| ca.issue(&LeafSpec::loopback(cn, usage)).unwrap();
        let write = |name: &str, pem: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let (server, client) = (
            leaf("etcd", LeafUsage::Server),
            leaf("drover", LeafUsage::Client),
        );
        let ca_file = write("ca.crt", &ca.cert_pem);
        let tls = test_etcd::TestTls {
            cert_file: write("server.crt", &server.cert_pem),
            key_file: write("server.key", server.key_pem.as_deref().unwrap()),
            client_ca_file: Some(ca_file.clone()),
        };
        let client_cert = write("client.crt", &client.cert_pem);
        let client_key = write("client.key", client.key_pem.as_deref().unwrap());
        let Some(etcd) = TestEtcd::start_tls(&tls) else {
            return;
        };
        let mut options = etcd.options("/drover");
        options.tls =
            Some(EtcdTls::from_files(&ca_file, Some((&client_cert, &client_key))).unwrap());
        let s = Store::open_etcd(&options).unwrap();
        let mut rx = s.watch();
        let r = s.create_json(Kind::Cluster, "c", &1u32).unwrap();
        assert_eq!(next_change(&mut rx).revision, r);
        assert!(s.describe().contains("https://127.0.0.1:"));
        // Without a client certificate, etcd refuses.
        options.timeout = Duration::from_secs(2);
        options.tls = Some(EtcdTls::from_files(&ca_file, None).unwrap());
        assert!(matches!(
            Store::open_etcd(&options),
            Err(StoreError::Backend(_))
        ));
        // The files are checked before anything connects.
        match EtcdTls::from_files(&client_key, None) {
            Err(e) => assert_eq!(e.file, TlsFile::Ca),
            Ok(_) => panic!("a key passed as a CA"),
        }
        match EtcdTls::from_files(&ca_file, Some((&client_cert, &tls.key_file))) {
            Err(e) => assert_eq!(e.file, TlsFile::Key, "{e}"),
            Ok(_) => panic!("the server's key passed for the client certificate"),
        }
    }

    #[test]
    fn etcd_unreachable_is_an_error_naming_endpoint_and_operation() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut o = EtcdOptions::new(vec![format!("127.0.0.1:{port}")], "/drover");
        o.timeout = Duration::from_secs(1);
        let started = Instant::now();
        match Store::open_etcd(&o) {
            Err(StoreError::Backend(msg)) => {
                assert!(msg.contains(&format!("http://127.0.0.1:{port}")), "{msg}");
                assert!(msg.contains("read the store revision"), "{msg}");
            }
            Err(e) => panic!("expected a backend error, got {e}"),
            Ok(_) => panic!("opened a store on a closed port"),
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_served_sqlite_store_is_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("drover.db");
        let first = Store::open_sqlite_exclusive(&db).unwrap();
        let err = Store::open_sqlite_exclusive(&db)
            .err()
            .expect("second open refused");
        let msg = err.to_string();
        assert!(msg.contains("another coordinator is serving"), "{msg}");
        assert!(msg.contains("drover.db.lock"), "{msg}");
        // A clone shares the lock; dropping every handle releases it.
        let clone = first.clone();
        drop(first);
        assert!(Store::open_sqlite_exclusive(&db).is_err());
        drop(clone);
        Store::open_sqlite_exclusive(&db).unwrap();
    }

    #[test]
    fn cached_reads_see_this_process_writes_and_list_refreshes() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_sqlite(&dir.path().join("drover.db")).unwrap();
        let r1 = s.create_json(Kind::Machine, "m", &1u32).unwrap();
        assert_eq!(
            s.get_json_cached::<u32>(Kind::Machine, "m").unwrap(),
            Some((1, r1))
        );
        let r2 = s.update_json(Kind::Machine, "m", &2u32, Some(r1)).unwrap();
        assert_eq!(
            s.get_json_cached::<u32>(Kind::Machine, "m").unwrap(),
            Some((2, r2))
        );
        // A failed precondition drops the cached copy; the next read refills it.
        assert!(s.update_json(Kind::Machine, "m", &9u32, Some(r1)).is_err());
        assert_eq!(s.cache.len(), 0);
        assert_eq!(
            s.get_json_cached::<u32>(Kind::Machine, "m").unwrap(),
            Some((2, r2))
        );
        s.delete(Kind::Machine, "m", None).unwrap();
        assert_eq!(s.get_json_cached::<u32>(Kind::Machine, "m").unwrap(), None);
        // A create and an update of one object in one transaction leave the
        // update's body.
        let r = s
            .txn(vec![
                Op::create(Kind::Machine, "n", &1u32),
                Op::update(Kind::Machine, "n", &3u32, None),
            ])
            .unwrap();
        assert_eq!(
            s.get_json_cached::<u32>(Kind::Machine, "n").unwrap(),
            Some((3, r))
        );
        // Sealed kinds are never cached.
        s.create_json(Kind::Secret, "k", &1u32).unwrap();
        assert_eq!(s.cache.len(), 1);
    }

    #[test]
    fn locations_parse() {
        let p = |s: &str| s.parse::<Location>();
        assert_eq!(p("sqlite"), Ok(Location::Sqlite(None)));
        assert_eq!(
            p("sqlite:/var/lib/d"),
            Ok(Location::Sqlite(Some("/var/lib/d".into())))
        );
        assert_eq!(
            p("etcd://10.0.0.1:2379,etcd-2.local:2379"),
            Ok(Location::Etcd {
                endpoints: vec!["10.0.0.1:2379".into(), "etcd-2.local:2379".into()],
                prefix: "/drover".into()
            })
        );
        assert_eq!(
            p("etcd://[::1]:2379/prod/drover/"),
            Ok(Location::Etcd {
                endpoints: vec!["[::1]:2379".into()],
                prefix: "/prod/drover".into()
            })
        );
        for bad in [
            "",
            "postgres://x",
            "sqlite:",
            "etcd://",
            "etcd://host",
            "etcd://host:0",
            "etcd://host:99999",
            "etcd://a:1,,b:2",
            "etcd://http://a:1",
            "etcd://[zz]:1",
        ] {
            assert!(p(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(
            p("etcd://a:1,b:2/x").unwrap().to_string(),
            "etcd://a:1,b:2/x"
        );
    }
}
