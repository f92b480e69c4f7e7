//! The reconciler's work queue of cluster names (after client-go's
//! `workqueue` that controller-runtime and kube-rs' `Controller` use):
//!
//! - a name is queued at most once: adding a queued name changes nothing;
//! - a name handed to a worker is never handed to another until that worker
//!   calls [`WorkQueue::done`]; added meanwhile, it is queued again then, so
//!   a change that arrives during a reconcile is never lost and never runs
//!   beside it;
//! - [`WorkQueue::done`] may ask for the name again after a delay (the
//!   reconcile's `requeue_after`); an earlier add or deadline wins;
//! - names come out in the order they were added (first in, first out), so
//!   one cluster's long reconcile never holds back another's: it holds one
//!   worker, and the others go on.
//!
//! The queue knows nothing of clusters; `controller.rs` feeds it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// A name handed to a worker, with how long it waited in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub key: String,
    pub waited: Duration,
}

/// What the queue holds now, for `drover get tasks` and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Depth {
    /// Names ready to be reconciled, not yet taken by a worker.
    pub ready: usize,
    /// Names being reconciled.
    pub processing: usize,
    /// Names waiting for their requeue time.
    pub delayed: usize,
}

#[derive(Debug, Default)]
struct Inner {
    ready: VecDeque<String>,
    /// Names in `ready`, with when they were added.
    queued: HashMap<String, Instant>,
    processing: HashSet<String>,
    /// Names added while being processed, with when: queued at `done`.
    dirty: HashMap<String, Instant>,
    /// Requeue times; an entry whose time is not `due[key]` is stale.
    delayed: BinaryHeap<Reverse<(Instant, String)>>,
    due: HashMap<String, Instant>,
    shut: bool,
}

impl Inner {
    fn add(&mut self, key: &str, now: Instant) -> bool {
        if self.queued.contains_key(key) {
            return false;
        }
        if self.processing.contains(key) {
            self.dirty.entry(key.to_owned()).or_insert(now);
            return false;
        }
        self.queued.insert(key.to_owned(), now);
        self.ready.push_back(key.to_owned());
        true
    }

    /// Moves every name whose requeue time came into `ready`.
    fn promote(&mut self, now: Instant) -> usize {
        let mut added = 0;
        while let Some(Reverse((at, _))) = self.delayed.peek() {
            if *at > now {
                break;
            }
            let Reverse((at, key)) = self.delayed.pop().expect("peeked");
            if self.due.get(&key) == Some(&at) {
                self.due.remove(&key);
                if self.add(&key, at) {
                    added += 1;
                }
            }
        }
        added
    }

    fn next_due(&self) -> Option<Instant> {
        self.delayed.peek().map(|Reverse((at, _))| *at)
    }
}

/// A queue of names for a bounded set of workers.
#[derive(Debug, Default)]
pub struct WorkQueue {
    inner: Mutex<Inner>,
    notify: Notify,
}

impl WorkQueue {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("work queue lock")
    }

    /// Queues `key` now.
    pub fn add(&self, key: &str) {
        let added = self.lock().add(key, Instant::now());
        if added {
            self.notify.notify_one();
        }
    }

    /// Queues every name of `keys` now.
    pub fn add_all<'a>(&self, keys: impl IntoIterator<Item = &'a str>) {
        let now = Instant::now();
        let mut added = 0;
        {
            let mut inner = self.lock();
            for k in keys {
                if inner.add(k, now) {
                    added += 1;
                }
            }
        }
        for _ in 0..added.min(64) {
            self.notify.notify_one();
        }
    }

    /// Queues `key` after `delay`, unless it is due earlier already.
    pub fn add_after(&self, key: &str, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let at = Instant::now() + delay;
        let mut inner = self.lock();
        if inner.due.get(key).is_some_and(|due| *due <= at) {
            return;
        }
        let earliest = inner.next_due().is_none_or(|next| at < next);
        inner.due.insert(key.to_owned(), at);
        inner.delayed.push(Reverse((at, key.to_owned())));
        drop(inner);
        if earliest {
            // A waiting worker sleeps until the earliest time it knew.
            self.notify.notify_one();
        }
    }

    /// Waits for the next name to reconcile; `None` once shut down.
    pub async fn next(&self) -> Option<Item> {
        loop {
            let notified = self.notify.notified();
            let next_due = {
                let mut inner = self.lock();
                if inner.shut {
                    return None;
                }
                let now = Instant::now();
                inner.promote(now);
                if let Some(key) = inner.ready.pop_front() {
                    let added = inner.queued.remove(&key).unwrap_or(now);
                    inner.processing.insert(key.clone());
                    let more = !inner.ready.is_empty();
                    drop(inner);
                    if more {
                        // Pass the wake-up on: this worker took one name.
                        self.notify.notify_one();
                    }
                    return Some(Item {
                        key,
                        waited: now.saturating_duration_since(added),
                    });
                }
                inner.next_due()
            };
            match next_due {
                Some(at) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Ends the reconcile of `key`: queues it again if it was added
    /// meanwhile, and after `requeue_after` otherwise (replacing the
    /// requeue time an earlier reconcile asked for).
    pub fn done(&self, key: &str, requeue_after: Option<Duration>) {
        let mut inner = self.lock();
        inner.processing.remove(key);
        inner.due.remove(key);
        let mut wake = false;
        if let Some(added) = inner.dirty.remove(key) {
            wake = inner.add(key, added);
        }
        drop(inner);
        if wake {
            self.notify.notify_one();
        }
        if let Some(d) = requeue_after {
            self.add_after(key, d);
        }
    }

    /// Drops everything queued or scheduled for `key` (its cluster is
    /// gone). A reconcile under way still ends with [`WorkQueue::done`].
    pub fn forget(&self, key: &str) {
        let mut inner = self.lock();
        if inner.queued.remove(key).is_some() {
            inner.ready.retain(|k| k != key);
        }
        inner.dirty.remove(key);
        inner.due.remove(key);
    }

    /// Drops everything queued or scheduled (leadership lost): the next
    /// leader term starts from a full resync.
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.ready.clear();
        inner.queued.clear();
        inner.dirty.clear();
        inner.due.clear();
        inner.delayed.clear();
    }

    /// Wakes every waiting worker with `None`.
    pub fn shut_down(&self) {
        self.lock().shut = true;
        self.notify.notify_waiters();
        // A worker between its check and its wait takes the permit.
        self.notify.notify_one();
    }

    pub fn depth(&self) -> Depth {
        let inner = self.lock();
        Depth {
            ready: inner.ready.len(),
            processing: inner.processing.len(),
            delayed: inner.due.len(),
        }
    }

    /// When `key` is due next by its requeue time, if it has one.
    pub fn due(&self, key: &str) -> Option<Instant> {
        self.lock().due.get(key).copied()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    async fn next_now(q: &WorkQueue) -> Option<String> {
        tokio::select! {
            biased;
            item = q.next() => item.map(|i| i.key),
            () = tokio::task::yield_now() => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_name_is_queued_once_and_never_handed_to_two_workers() {
        let q = WorkQueue::new();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(
            q.depth(),
            Depth {
                ready: 2,
                processing: 0,
                delayed: 0
            }
        );
        let first = q.next().await.unwrap();
        assert_eq!(first.key, "a");
        // Changed again while a worker has it: not handed out...
        q.add("a");
        assert_eq!(next_now(&q).await.as_deref(), Some("b"));
        assert_eq!(next_now(&q).await, None, "a is being reconciled");
        // ...until that worker is done; then once more, not twice.
        q.done("a", None);
        assert_eq!(next_now(&q).await.as_deref(), Some("a"));
        q.done("a", None);
        q.done("b", None);
        assert_eq!(next_now(&q).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_comes_back_at_its_time_and_an_earlier_add_wins() {
        let q = WorkQueue::new();
        q.add("a");
        let a = q.next().await.unwrap();
        q.done(&a.key, Some(Duration::from_secs(30)));
        assert_eq!(q.depth().delayed, 1);
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(next_now(&q).await, None);
        tokio::time::advance(Duration::from_secs(1)).await;
        let again = q.next().await.unwrap();
        assert_eq!(again.key, "a");
        // A later requeue replaces the earlier one at done; an add before
        // it runs the name at once.
        q.done("a", Some(Duration::from_secs(60)));
        q.add_after("a", Duration::from_secs(120));
        assert_eq!(
            q.due("a"),
            Some(Instant::now() + Duration::from_secs(60)),
            "the earlier time wins"
        );
        q.add("a");
        assert_eq!(next_now(&q).await.as_deref(), Some("a"));
    }

    /// A worker blocked in one cluster's long step never delays another
    /// cluster: the second worker takes it at once.
    #[tokio::test(start_paused = true)]
    async fn a_change_to_one_cluster_never_waits_behind_anothers_long_step() {
        let q = Arc::new(WorkQueue::new());
        // b's long step lasts until the test adds a permit.
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<(String, Duration)>();
        let mut workers = vec![];
        for _ in 0..2 {
            let (q, gate, done_tx) = (q.clone(), gate.clone(), done_tx.clone());
            workers.push(tokio::spawn(async move {
                while let Some(item) = q.next().await {
                    if item.key == "b" {
                        let _permit = gate.acquire().await.expect("gate open");
                    }
                    q.done(&item.key, None);
                    let _ = done_tx.send((item.key, item.waited));
                }
            }));
        }
        q.add("b");
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        assert_eq!(q.depth().processing, 1, "b's step is under way");
        q.add("a");
        let (key, waited) = tokio::time::timeout(Duration::from_secs(5), done_rx.recv())
            .await
            .expect("a is reconciled while b's step goes on")
            .expect("a worker reported");
        assert_eq!(key, "a");
        assert_eq!(waited, Duration::ZERO, "a waited for nothing");
        gate.add_permits(1);
        let (key, _) = done_rx.recv().await.unwrap();
        assert_eq!(key, "b");
        q.shut_down();
        for w in workers {
            w.await.unwrap();
        }
    }

    /// Many workers, one name added over and over: never two at once.
    #[tokio::test(start_paused = true)]
    async fn many_workers_never_reconcile_one_name_at_once() {
        let q = Arc::new(WorkQueue::new());
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let overlap = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut workers = vec![];
        for _ in 0..4 {
            let (q, running, overlap, runs) =
                (q.clone(), running.clone(), overlap.clone(), runs.clone());
            workers.push(tokio::spawn(async move {
                while let Some(item) = q.next().await {
                    use std::sync::atomic::Ordering::SeqCst;
                    if running.fetch_add(1, SeqCst) != 0 {
                        overlap.store(true, SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    running.fetch_sub(1, SeqCst);
                    runs.fetch_add(1, SeqCst);
                    q.done(&item.key, None);
                }
            }));
        }
        for _ in 0..50 {
            q.add("only");
            tokio::time::advance(Duration::from_millis(3)).await;
        }
        tokio::time::advance(Duration::from_millis(100)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        use std::sync::atomic::Ordering::SeqCst;
        assert!(!overlap.load(SeqCst), "two workers had the name at once");
        let n = runs.load(SeqCst);
        assert!(
            (2..50).contains(&n),
            "adds during a run fold into one more run: {n} runs"
        );
        q.shut_down();
        for w in workers {
            w.await.unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn forget_and_clear_drop_what_is_queued() {
        let q = WorkQueue::new();
        q.add("a");
        q.add("b");
        q.add_after("c", Duration::from_secs(5));
        q.forget("a");
        q.forget("c");
        assert_eq!(next_now(&q).await.as_deref(), Some("b"));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(next_now(&q).await, None);
        q.add("d");
        q.clear();
        assert_eq!(next_now(&q).await, None);
        q.shut_down();
        assert_eq!(q.next().await, None);
    }
}
