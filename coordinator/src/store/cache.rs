//! The store's read cache: the last known body and revision of every object
//! of the kinds not sealed at rest (clusters, machines, registration tokens),
//! so a heartbeat that changes nothing reads no database and no network.
//!
//! Coherence rules, which `Store` and the backends keep:
//! - a transaction this process commits installs what it wrote (or removes
//!   what it deleted) before `txn` returns, so this process reads its own
//!   writes;
//! - a change made elsewhere (another replica, seen by the etcd watch)
//!   removes the entry unless the cache already holds that revision or a
//!   newer one; a gap in the watch clears everything;
//! - a failed transaction removes the entries it touched, since a failed
//!   precondition means the cached copy may be stale;
//! - a read from the backend is installed only if nothing was removed
//!   while it was in flight (the `epoch` check), and never over a newer
//!   revision, so a slow read cannot put back what a change removed.
//!
//! Memory follows the live objects: a deleted object leaves nothing behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::backend::{Kind, Record};

/// The cache; shared by the `Store` handles and the etcd watch.
#[derive(Default)]
pub(super) struct ReadCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Bumped by every removal, so reads in flight do not install a copy
    /// that a removal meant to drop.
    epoch: u64,
    objects: HashMap<Kind, HashMap<String, Cached>>,
}

#[derive(Clone)]
struct Cached {
    revision: u64,
    body: Arc<[u8]>,
}

/// Whether objects of `kind` are cached. Sealed kinds are not: their
/// plaintext stays out of long-lived memory.
pub(super) fn caches(kind: Kind) -> bool {
    !kind.is_sealed()
}

impl ReadCache {
    /// The cached record, if any.
    pub(super) fn get(&self, kind: Kind, name: &str) -> Option<Record> {
        self.read(kind, name, |c| Record {
            name: name.to_owned(),
            revision: c.revision,
            body: c.body.to_vec(),
        })
    }

    /// The cached revision of one object, if it is cached.
    pub(super) fn revision(&self, kind: Kind, name: &str) -> Option<u64> {
        self.read(kind, name, |c| c.revision)
    }

    /// What `f` reads of one cached object, if it is cached.
    fn read<T>(&self, kind: Kind, name: &str, f: impl FnOnce(&Cached) -> T) -> Option<T> {
        let inner = self.inner.lock().expect("store cache lock");
        inner.objects.get(&kind).and_then(|m| m.get(name)).map(f)
    }

    /// The epoch a backend read starts at, for [`ReadCache::fill`].
    pub(super) fn epoch(&self) -> u64 {
        self.inner.lock().expect("store cache lock").epoch
    }

    /// Installs records read from the backend when the read started at
    /// `epoch`, unless something was removed since.
    pub(super) fn fill<'a>(
        &self,
        kind: Kind,
        epoch: u64,
        records: impl Iterator<Item = &'a Record>,
    ) {
        let mut inner = self.inner.lock().expect("store cache lock");
        if inner.epoch != epoch {
            return;
        }
        let objects = inner.objects.entry(kind).or_default();
        for r in records {
            install(objects, &r.name, r.revision, &r.body);
        }
    }

    /// Installs what this process just wrote at `revision`.
    pub(super) fn wrote(&self, kind: Kind, name: &str, revision: u64, body: &[u8]) {
        let mut inner = self.inner.lock().expect("store cache lock");
        install(inner.objects.entry(kind).or_default(), name, revision, body);
    }

    /// Drops one object: deleted, or changed at `revision` elsewhere (`None`:
    /// changed in a way not known, such as a failed precondition).
    pub(super) fn changed(&self, kind: Kind, name: &str, revision: Option<u64>) {
        let mut inner = self.inner.lock().expect("store cache lock");
        let objects = inner.objects.entry(kind).or_default();
        if let (Some(rev), Some(c)) = (revision, objects.get(name)) {
            if c.revision >= rev {
                // This process's own write, echoed by the watch.
                return;
            }
        }
        objects.remove(name);
        inner.epoch += 1;
    }

    /// Forgets everything (the etcd watch missed changes).
    pub(super) fn clear(&self) {
        let mut inner = self.inner.lock().expect("store cache lock");
        inner.objects.clear();
        inner.epoch += 1;
    }

    /// How many objects are cached, for tests and status.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        let inner = self.inner.lock().expect("store cache lock");
        inner.objects.values().map(HashMap::len).sum()
    }
}

fn install(objects: &mut HashMap<String, Cached>, name: &str, revision: u64, body: &[u8]) {
    match objects.get_mut(name) {
        Some(c) if c.revision >= revision => {}
        Some(c) => {
            *c = Cached {
                revision,
                body: body.into(),
            }
        }
        None => {
            objects.insert(
                name.to_owned(),
                Cached {
                    revision,
                    body: body.into(),
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, revision: u64, body: &str) -> Record {
        Record {
            name: name.into(),
            revision,
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_read_in_flight_does_not_undo_a_removal() {
        let c = ReadCache::default();
        let epoch = c.epoch();
        // Another replica changes the object while the read is in flight.
        c.changed(Kind::Machine, "m", Some(7));
        c.fill(Kind::Machine, epoch, [rec("m", 6, "old")].iter());
        assert!(c.get(Kind::Machine, "m").is_none());
        // A read started after the change is installed.
        let epoch = c.epoch();
        c.fill(Kind::Machine, epoch, [rec("m", 7, "new")].iter());
        assert_eq!(c.get(Kind::Machine, "m").unwrap().body, b"new");
    }

    #[test]
    fn older_revisions_never_replace_newer_ones() {
        let c = ReadCache::default();
        c.wrote(Kind::Machine, "m", 9, b"mine");
        let epoch = c.epoch();
        c.fill(Kind::Machine, epoch, [rec("m", 8, "older")].iter());
        let got = c.get(Kind::Machine, "m").unwrap();
        assert_eq!((got.revision, got.body.as_slice()), (9, &b"mine"[..]));
        // The watch echoing this process's own write keeps it.
        c.changed(Kind::Machine, "m", Some(9));
        assert!(c.get(Kind::Machine, "m").is_some());
        // A newer change elsewhere drops it.
        c.changed(Kind::Machine, "m", Some(10));
        assert!(c.get(Kind::Machine, "m").is_none());
    }

    #[test]
    fn deletes_and_clears_leave_nothing_behind() {
        let c = ReadCache::default();
        for i in 0..100 {
            c.wrote(Kind::Machine, &format!("m{i}"), i + 1, b"x");
        }
        assert_eq!(c.len(), 100);
        for i in 0..50 {
            c.changed(Kind::Machine, &format!("m{i}"), None);
        }
        assert_eq!(c.len(), 50);
        c.clear();
        assert_eq!(c.len(), 0);
    }
}
