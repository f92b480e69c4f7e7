//! The store's vocabulary, shared by `Store` and its backends: kinds,
//! records, transaction operations, errors, changes, fences, and the
//! `Backend` trait SQLite and etcd implement.

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
    /// The operators' Secrets (`kind: Secret`), which machine files read.
    UserSecret,
    /// Clusters' saved etcd snapshots (the records; the sealed files are
    /// outside the store).
    Snapshot,
}

impl Kind {
    /// Kinds whose bodies are encrypted at rest.
    pub fn is_sealed(self) -> bool {
        matches!(self, Kind::Secret | Kind::JoinTokens | Kind::UserSecret)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Cluster => "clusters",
            Kind::Machine => "machines",
            Kind::RegistrationToken => "registrationtokens",
            Kind::Secret => "secrets",
            Kind::JoinTokens => "jointokens",
            Kind::UserSecret => "usersecrets",
            Kind::Snapshot => "snapshots",
        }
    }

    /// Every kind, for backends that map names back to kinds.
    pub const ALL: [Kind; 7] = [
        Kind::Cluster,
        Kind::Machine,
        Kind::RegistrationToken,
        Kind::Secret,
        Kind::JoinTokens,
        Kind::UserSecret,
        Kind::Snapshot,
    ];

    /// The kind whose `as_str` is `s`.
    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
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
    #[error("{kind} {name:?} kept changing under {attempts} consecutive updates; try again")]
    Contended {
        kind: &'static str,
        name: String,
        attempts: u32,
    },
    #[error("write refused: this coordinator's leadership term {term} has ended ({detail}); the new leader makes this change")]
    Fenced { term: u64, detail: String },
    #[error(transparent)]
    Sealed(#[from] crate::store::keyring::KeyError),
}

impl StoreError {
    /// What an operator does when the store itself failed, not an object in
    /// it (the etcd cluster lost quorum or cannot be reached, the disk is
    /// full): `None` for every other error.
    pub fn remedy(&self) -> Option<&'static str> {
        let StoreError::Backend(cause) = self else {
            return None;
        };
        Some(if cause.contains("database or disk is full") {
            "the disk holding the coordinator's SQLite database (drover.db in its data directory, or in the directory of --store sqlite:DIR) is full: free space on it (df -h shows it), then retry"
        } else if cause.starts_with("etcd") {
            "the etcd cluster does not answer or has lost quorum: start the members that are down so that a majority runs and reaches each other (etcdctl endpoint health --cluster shows them), then retry; the coordinator's /readyz answers 200 again once the store answers"
        } else {
            "check the coordinator's log and the disk or hosts of its store, then retry; the coordinator's /readyz answers 200 again once the store answers"
        })
    }
}

/// A committed change, broadcast to watchers. With SQLite, the writes of
/// this process; with etcd, the writes of every replica.
#[derive(Debug, Clone)]
pub struct Change {
    pub kind: Kind,
    pub name: String,
    pub revision: u64,
    pub deleted: bool,
    /// Who wrote it, when the write was made under [`attributed`] on this
    /// process's thread (the cluster a reconcile was for); `None` for
    /// every other write, and for every change read back from etcd.
    pub origin: Option<std::sync::Arc<str>>,
}

/// Recent changes as a backend keeps them (see [`Backend::history`]).
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Every change with a revision above it, up to `head`, is in
    /// `changes`.
    pub floor: u64,
    /// The revision the history was read at.
    pub head: u64,
    pub changes: Vec<Change>,
}

impl History {
    /// Keeps the newest `limit` changes, raising the floor past what was
    /// dropped (a revision's changes go all or none, so the invariant
    /// holds).
    pub fn truncate(&mut self, limit: usize) {
        if self.changes.len() <= limit {
            return;
        }
        // The newest revision dropped: its other changes go too.
        let cut = self.changes[self.changes.len() - limit - 1].revision;
        self.changes.retain(|c| c.revision > cut);
        self.floor = self.floor.max(cut);
    }
}

/// How many revisions of history a backend keeps, at least: SQLite prunes
/// older changes; etcd is read back this far (or to its compaction).
pub const HISTORY_REVISIONS: u64 = 10_000;

std::thread_local! {
    static ORIGIN: std::cell::RefCell<Option<std::sync::Arc<str>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with every store write it makes on this thread attributed to
/// `origin` ([`Change::origin`]). Writes that `f` hands to other threads
/// (`store::blocking`, spawned tasks) are not attributed: a watcher then
/// sees them as anyone's, which is always safe.
pub fn attributed<T>(origin: &str, f: impl FnOnce() -> T) -> T {
    struct Reset(Option<std::sync::Arc<str>>);
    impl Drop for Reset {
        fn drop(&mut self) {
            ORIGIN.with(|o| *o.borrow_mut() = self.0.take());
        }
    }
    let before = ORIGIN.with(|o| o.borrow_mut().replace(origin.into()));
    let _reset = Reset(before);
    f()
}

/// The origin [`attributed`] set on this thread, if any.
pub(crate) fn current_origin() -> Option<std::sync::Arc<str>> {
    ORIGIN.with(|o| o.borrow().clone())
}

/// Which objects of a kind a list reads: those named after `after` (`""`:
/// from the first), at most `limit` of them (`None`: all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span<'a> {
    pub after: &'a str,
    pub limit: Option<usize>,
}

impl Span<'_> {
    /// Every object.
    pub const ALL: Span<'static> = Span {
        after: "",
        limit: None,
    };
}

/// What a backend provides. Bodies arrive sealed and leave as stored; the
/// `Store` around it seals and opens. Semantics every backend keeps:
///
/// - one global revision, advanced by every committed transaction; every
///   object written by a transaction gets that transaction's revision;
/// - `txn` applies its operations in order, all or nothing, with exactly
///   the preconditions and errors documented on [`Op`] (the first failing
///   operation's error is returned);
/// - `list` is ordered by name, from the first name after `after`, and
///   returns at most `limit` records (all of them without one), read at
///   one revision;
/// - every committed write reaches the `broadcast::Sender<Change>` the
///   backend was opened with, one `Change` per written object.
pub(super) trait Backend: Send + Sync {
    fn get(&self, kind: Kind, name: &str) -> Result<Option<Record>, StoreError>;
    fn list(&self, kind: Kind, span: Span<'_>) -> Result<Vec<Record>, StoreError>;
    /// With a `fence`, the transaction also requires that leadership term
    /// to be current, and fails with [`StoreError::Fenced`] otherwise. A
    /// single-replica backend has one term forever and ignores it.
    fn txn(&self, ops: &[Op], fence: Option<Fence>) -> Result<u64, StoreError>;
    /// The store's revision now: every committed write has a revision at
    /// most this, and the next one will have more.
    fn revision(&self) -> Result<u64, StoreError>;
    /// The newest changes the backend still keeps (SQLite: a table written
    /// with every transaction; etcd: its own history, until compacted), at
    /// most `limit`, in revision order, read at one revision.
    fn history(&self, limit: usize) -> Result<History, StoreError>;
    /// Where the data lives, for messages ("SQLite database /d/drover.db").
    fn describe(&self) -> String;
    /// Writes every object, as stored (sealed records stay sealed), at one
    /// revision into a new SQLite database at `dest` in the embedded
    /// backend's schema, with that revision; the store keeps serving. `dest`
    /// must not exist.
    fn backup(&self, dest: &std::path::Path) -> Result<(), StoreError>;
}

/// A leadership term: the revision at which this replica's leader key was
/// created. Writes made inside [`fenced`] carry it, and the store commits
/// them only while that term is current, so a leader that was paused past
/// its lease and wakes up late cannot change anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence(pub u64);
