//! The recent store changes a watch replays from a `resourceVersion`
//! ([`ChangeLog`]), kept by the `change-log` task ([`Recorder`]) on every
//! replica, as the Kubernetes API server's watch cache keeps them
//! (staging/src/k8s.io/apiserver/pkg/storage/cacher/watch_cache.go: a ring
//! of recent events; a watch from before its oldest is answered `410
//! Gone`, "too old resource version", and the client lists again).
//!
//! The ring starts from the store's own history ([`Store::history`]: a
//! table SQLite writes with every transaction, etcd's revisions), so a
//! watch from a `resourceVersion` given before a restart, or by another
//! replica, resumes instead of listing again.
//!
//! Invariant: every change with a revision above `floor` is in the ring,
//! in revision order. The task subscribes before it reads the history
//! (the first floor, up to its head), so nothing falls between, and the
//! feed's copies of changes the history held are not recorded twice; when
//! the change feed lags, or the ring is full, the floor moves up past what
//! was lost, and a watch that needs older changes expires instead of
//! missing them.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::Notify;

use crate::store::{Change, Kind, Store};
use crate::tasks::{BackgroundTask, Outcome, TaskError, Wake};

/// How many changes the ring keeps.
pub const CAPACITY: usize = 10_000;

/// A watch asked for changes older than the ring holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "too old resource version: {asked} (the oldest this coordinator can replay from is {floor})"
)]
pub struct Expired {
    pub asked: u64,
    pub floor: u64,
}

#[derive(Debug, Default)]
struct Ring {
    /// Every change above it is in `changes`; `None` until the task's
    /// first run.
    floor: Option<u64>,
    /// Changes up to this revision came from the store's history: the
    /// change feed's copies of them are not recorded twice.
    loaded_to: u64,
    changes: VecDeque<Change>,
}

/// The recent changes; see the module documentation.
#[derive(Debug, Default)]
pub struct ChangeLog {
    ring: Mutex<Ring>,
    /// Woken at every change recorded and every reset.
    notify: Notify,
}

impl ChangeLog {
    /// The changes of `kind` after revision `after`, and the revision the
    /// answer is complete up to (the newest recorded, or the floor).
    pub fn since(&self, kind: Kind, after: u64) -> Result<(Vec<Change>, u64), Expired> {
        let ring = self.ring.lock().expect("change log poisoned");
        let floor = ring.floor.unwrap_or(u64::MAX);
        if after < floor {
            return Err(Expired {
                asked: after,
                floor: ring.floor.unwrap_or(0),
            });
        }
        let head = ring.changes.back().map_or(floor, |c| c.revision.max(floor));
        // In revision order: the first one after `after` is found by halves.
        let first = ring.changes.partition_point(|c| c.revision <= after);
        let changes = ring
            .changes
            .range(first..)
            .filter(|c| c.kind == kind)
            .cloned()
            .collect();
        Ok((changes, head))
    }

    /// The revision the log is complete up to, once started.
    pub fn head(&self) -> Option<u64> {
        let ring = self.ring.lock().expect("change log poisoned");
        let floor = ring.floor?;
        Some(ring.changes.back().map_or(floor, |c| c.revision.max(floor)))
    }

    /// Resolves at the next change recorded (or reset); call before
    /// reading with [`ChangeLog::since`] to miss none.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Starts over from the store's `history`: what was recorded is
    /// dropped; the newest [`CAPACITY`] changes of the history are kept.
    fn reset(&self, mut history: crate::store::History) {
        history.truncate(CAPACITY);
        let mut ring = self.ring.lock().expect("change log poisoned");
        ring.floor = Some(history.floor);
        ring.loaded_to = history.head;
        ring.changes = history.changes.into();
        drop(ring);
        self.notify.notify_waiters();
    }

    /// Records `c`, dropping the oldest past [`CAPACITY`] (the floor
    /// moves up to it).
    fn record(&self, c: Change) {
        let mut ring = self.ring.lock().expect("change log poisoned");
        let Some(floor) = ring.floor else { return };
        if c.revision <= floor.max(ring.loaded_to) {
            return;
        }
        if ring.changes.len() == CAPACITY {
            if let Some(old) = ring.changes.pop_front() {
                ring.floor = Some(old.revision);
            }
        }
        ring.changes.push_back(c);
        drop(ring);
        self.notify.notify_waiters();
    }
}

/// The `change-log` task: records every store change in the app's
/// [`ChangeLog`]; after a lag, starts over at the store's revision.
pub struct Recorder {
    store: Store,
    log: std::sync::Arc<ChangeLog>,
    changes: tokio::sync::broadcast::Receiver<Change>,
    /// The floor must be read (at the start, or changes were lost).
    restart: bool,
}

impl Recorder {
    /// The task, subscribed to `store`'s changes.
    pub fn new(store: Store, log: std::sync::Arc<ChangeLog>) -> Self {
        Self {
            changes: store.watch(),
            store,
            log,
            restart: true,
        }
    }
}

impl BackgroundTask for Recorder {
    async fn activate(&mut self, _: Wake) -> Outcome {
        if !self.restart {
            return Outcome::Idle;
        }
        let store = self.store.clone();
        match crate::store::blocking(move || store.history(CAPACITY)).await {
            Ok(history) => {
                tracing::info!(
                    from = history.floor,
                    to = history.head,
                    changes = history.changes.len(),
                    "change log started from the store's history; watches from these revisions resume"
                );
                self.log.reset(history);
                self.restart = false;
                Outcome::Done
            }
            Err(e) => Outcome::Failed(TaskError::new(format_args!(
                "cannot read the store's change history to start the change log: {e}"
            ))),
        }
    }

    async fn watch(&mut self) {
        if self.restart {
            return std::future::pending().await;
        }
        loop {
            match self.changes.recv().await {
                Ok(c) => self.log.record(c),
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(
                        missed = n,
                        "the change log missed store changes; watches from before now expire and list again"
                    );
                    self.restart = true;
                    return;
                }
                Err(RecvError::Closed) => return std::future::pending().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(revision: u64, name: &str) -> Change {
        Change {
            kind: Kind::Cluster,
            name: name.into(),
            revision,
            deleted: false,
            origin: None,
        }
    }

    #[test]
    fn a_watch_replays_what_the_ring_holds_and_expires_before_it() {
        let log = ChangeLog::default();
        assert!(log.since(Kind::Cluster, 0).is_err(), "not started");
        log.reset(crate::store::History {
            floor: 10,
            head: 10,
            changes: vec![],
        });
        log.record(change(9, "old"));
        log.record(change(11, "a"));
        log.record(change(12, "b"));
        let (got, head) = log.since(Kind::Cluster, 10).unwrap();
        assert_eq!(
            got.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(head, 12);
        assert_eq!(log.since(Kind::Cluster, 11).unwrap().0.len(), 1);
        assert!(log.since(Kind::Machine, 10).unwrap().0.is_empty());
        assert_eq!(
            log.since(Kind::Cluster, 9).unwrap_err(),
            Expired {
                asked: 9,
                floor: 10
            }
        );
        // Full: the oldest goes, and the floor with it.
        for r in 13..(13 + CAPACITY as u64) {
            log.record(change(r, "x"));
        }
        assert!(log.since(Kind::Cluster, 11).is_err());
        assert!(log.since(Kind::Cluster, 12).is_ok());
    }

    #[test]
    fn a_log_started_from_history_replays_it_and_records_no_change_twice() {
        let log = ChangeLog::default();
        log.reset(crate::store::History {
            floor: 4,
            head: 7,
            changes: vec![change(5, "a"), change(7, "b")],
        });
        // The feed's copy of revision 7 (it subscribed first) is dropped.
        log.record(change(7, "b"));
        log.record(change(8, "c"));
        let (got, head) = log.since(Kind::Cluster, 4).unwrap();
        assert_eq!(
            got.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert_eq!(head, 8);
        assert!(log.since(Kind::Cluster, 3).is_err());
    }
}
