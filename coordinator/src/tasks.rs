//! The coordinator's background-task driver (after Omicron's Nexus
//! `background/driver.rs`): every loop of the coordinator is a
//! [`BackgroundTask`] registered here with a name, a period and how it
//! starts; the driver owns its loop — the wait for the period, an early
//! [`Task::activate`], the task's own watchers ([`BackgroundTask::watch`])
//! and shutdown — and records each run, so `GET /v1/status` (`tasks`) and
//! `drover get tasks` show every task's [`TaskStatus`].
//!
//! Invariant: no loop of the coordinator selects on shutdown itself; a
//! task's code is one run ([`BackgroundTask::activate`]), what wakes it
//! early ([`BackgroundTask::watch`]) and what it does at shutdown
//! ([`BackgroundTask::stop`]). Runs are never cut short by shutdown: the
//! driver stops a task between runs.
//!
//! The cluster reconciler's workers take clusters from a work queue rather
//! than running on a period: the reconciler's task in the driver feeds the
//! queue (and its runs are not counted), and each cluster reconcile is
//! recorded as a run of the same [`Task`] with
//! [`Task::started`]/[`Task::finished`].

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

pub use crate::types::{QueueStatus, TaskStatus};

/// The cluster reconciler's name in the driver (`App::reconcile_soon`
/// activates it).
pub const RECONCILER_TASK: &str = "cluster-reconciler";

/// Why a task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The task was just registered ([`Start::Now`]).
    Start,
    /// The period passed.
    Period,
    /// Something called [`Task::activate`].
    Activated,
    /// The task's own [`BackgroundTask::watch`] resolved.
    Watched,
}

/// When a task's first run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At once.
    Now,
    /// After one period (or an earlier activation or watcher).
    AfterPeriod,
}

/// What one run of a task came to.
#[derive(Debug)]
pub enum Outcome {
    /// The run did its work.
    Done,
    /// There was nothing for this replica to do (a follower's leader-only
    /// task, or a feeder whose work is recorded elsewhere): not counted as
    /// a run.
    Idle,
    /// The run failed; the driver records the error as the task's last.
    Failed(TaskError),
}

/// Why a run of a task failed, as its status shows it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TaskError(String);

impl TaskError {
    /// The error of a run, from what went wrong.
    pub fn new(e: impl std::fmt::Display) -> Self {
        Self(e.to_string())
    }
}

impl<E: std::fmt::Display> From<Result<(), E>> for Outcome {
    fn from(r: Result<(), E>) -> Self {
        match r {
            Ok(()) => Outcome::Done,
            Err(e) => Outcome::Failed(TaskError::new(e)),
        }
    }
}

/// A background task: one run, what wakes it early, what it does at
/// shutdown. The driver calls these one at a time, never concurrently.
pub trait BackgroundTask: Send + 'static {
    /// One run of the task.
    fn activate(&mut self, why: Wake) -> impl Future<Output = Outcome> + Send;

    /// Resolves when something the task watches wants a run before its
    /// period ends (a role change, a store change, a queued request).
    /// Polled only between runs and dropped when a run starts, so it must
    /// be cancel-safe: keep what it received in `self`. The default never
    /// resolves.
    fn watch(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }

    /// How long to wait after this run: the registered period unless the
    /// task's own schedule says otherwise (`None`: only activations and
    /// watchers wake it).
    fn next_wait(&self, period: Option<Duration>) -> Option<Duration> {
        period
    }

    /// Runs once at shutdown, after the last run.
    fn stop(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Every background task of this coordinator, in registration order, and
/// the loops that run them.
#[derive(Debug)]
pub struct Driver {
    tasks: Mutex<Vec<Arc<Task>>>,
    loops: Mutex<Vec<JoinHandle<()>>>,
    stop: watch::Sender<bool>,
}

impl Default for Driver {
    fn default() -> Self {
        Self {
            tasks: Mutex::default(),
            loops: Mutex::default(),
            stop: watch::channel(false).0,
        }
    }
}

impl Driver {
    /// Registers `body` under `name` and starts its loop on the current
    /// tokio runtime: runs at `start`, then every `period` (`None`: only
    /// when activated or its watcher resolves) until [`Driver::shutdown`].
    pub fn spawn<T: BackgroundTask>(
        &self,
        name: &str,
        period: Option<Duration>,
        start: Start,
        body: T,
    ) -> Arc<Task> {
        let task = self.register(name, period);
        self.start(task.clone(), start, body);
        task
    }

    /// Starts the loop of a task already registered (one whose body needs
    /// its [`Task`], as the reconciler's workers do).
    pub fn start<T: BackgroundTask>(&self, task: Arc<Task>, start: Start, body: T) {
        let stop = self.stop.subscribe();
        let handle = tokio::spawn(drive(task, body, start, stop));
        self.loops.lock().expect("driver lock").push(handle);
    }

    /// Registers a task whose runs something else records (the reconciler's
    /// workers, tests); its loop, if any, is the caller's.
    pub fn register(&self, name: &str, period: Option<Duration>) -> Arc<Task> {
        let task = Arc::new(Task {
            name: name.to_owned(),
            period,
            activation: Notify::new(),
            state: Mutex::new(State::default()),
        });
        self.tasks.lock().expect("driver lock").push(task.clone());
        task
    }

    /// Stops every task between runs and waits for their loops (and each
    /// task's [`BackgroundTask::stop`]) to end.
    pub async fn shutdown(&self) {
        self.stop.send_replace(true);
        let loops = std::mem::take(&mut *self.loops.lock().expect("driver lock"));
        for l in loops {
            if let Err(e) = l.await {
                tracing::error!(error = %e, "a background task's loop ended abnormally");
            }
        }
    }

    /// Activates the task registered under `name`, if there is one.
    pub fn activate(&self, name: &str) {
        if let Some(t) = self.get(name) {
            t.activate();
        }
    }

    /// The task registered under `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Task>> {
        self.tasks
            .lock()
            .expect("driver lock")
            .iter()
            .find(|t| t.name == name)
            .cloned()
    }

    /// What every task reports, in registration order.
    pub fn statuses(&self) -> Vec<TaskStatus> {
        self.tasks
            .lock()
            .expect("driver lock")
            .iter()
            .map(|t| t.status())
            .collect()
    }
}

/// The loop the driver runs for one task.
async fn drive<T: BackgroundTask>(
    task: Arc<Task>,
    mut body: T,
    start: Start,
    mut stop: watch::Receiver<bool>,
) {
    let mut why = (start == Start::Now).then_some(Wake::Start);
    loop {
        if let Some(why) = why.take() {
            let began = task.begin();
            match body.activate(why).await {
                Outcome::Done => task.finished(None),
                Outcome::Idle => task.idle(began),
                Outcome::Failed(e) => task.finished(Some(e.to_string())),
            }
        }
        let wait = body.next_wait(task.period);
        task.lock().next_run = wait.map(|w| drover_common::now() + w);
        let period = async {
            match wait {
                Some(w) => tokio::time::sleep(w).await,
                None => std::future::pending().await,
            }
        };
        why = Some(tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => break,
            () = period => Wake::Period,
            () = task.activation.notified() => Wake::Activated,
            () = body.watch() => Wake::Watched,
        });
    }
    task.lock().next_run = None;
    body.stop().await;
}

/// One registered background task: its name, period and status.
#[derive(Debug)]
pub struct Task {
    name: String,
    period: Option<Duration>,
    activation: Notify,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    runs: u64,
    last_run_started: Option<time::OffsetDateTime>,
    last_run_finished: Option<time::OffsetDateTime>,
    last_error: Option<String>,
    next_run: Option<time::OffsetDateTime>,
    /// When the run under way began, for its duration metric.
    started_at: Option<std::time::Instant>,
    /// The start of the last counted run, put back when a run was idle.
    previous_start: Option<time::OffsetDateTime>,
    queue: Option<QueueStatus>,
}

impl Task {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The task's period (`None`: it runs only when activated or woken).
    pub fn period(&self) -> Option<Duration> {
        self.period
    }

    /// Asks the task to run now rather than at the end of its period. An
    /// activation while the task runs makes its next wait end at once.
    pub fn activate(&self) {
        self.activation.notify_one();
    }

    /// Records that a run begins.
    pub fn started(&self) {
        self.begin();
    }

    /// Records that a run begins; returns its start, for [`Task::idle`].
    fn begin(&self) -> time::OffsetDateTime {
        let now = drover_common::now();
        let mut s = self.lock();
        s.previous_start = s.last_run_started;
        s.last_run_started = Some(now);
        s.next_run = None;
        s.started_at = Some(std::time::Instant::now());
        now
    }

    /// Records that the run ended, and what went wrong if anything did: a
    /// run without error clears the last one.
    pub fn finished(&self, error: Option<String>) {
        let mut s = self.lock();
        s.runs += 1;
        s.last_run_finished = Some(drover_common::now());
        let took = s.started_at.take().map(|t| t.elapsed()).unwrap_or_default();
        crate::metrics::global().loop_run(&self.name, self.period, took, error.is_some());
        s.last_error = error;
    }

    /// Records that the run begun at `began` had nothing to do: it is not
    /// counted, and the last counted run's start shows again (unless a run
    /// recorded by someone else began since).
    fn idle(&self, began: time::OffsetDateTime) {
        let mut s = self.lock();
        if s.last_run_started == Some(began) {
            s.last_run_started = s.previous_start;
            s.started_at = None;
        }
    }

    /// Records the task's work queue as it stands.
    pub fn set_queue(&self, queue: QueueStatus) {
        self.lock().queue = Some(queue);
    }

    /// What the task reports about itself.
    pub fn status(&self) -> TaskStatus {
        let s = self.lock();
        TaskStatus {
            name: self.name.clone(),
            period_millis: self.period.unwrap_or_default().as_millis() as u64,
            runs: s.runs,
            last_run_started: s.last_run_started,
            last_run_finished: s.last_run_finished,
            last_error: s.last_error.clone(),
            next_run: s.next_run,
            queue: s.queue,
            object_errors: vec![],
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("task state lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    /// A task that fails while `fail` holds, is idle while `idle` holds,
    /// wakes when `poke` is notified and counts its stops.
    #[derive(Clone, Default)]
    struct Probe {
        fail: Arc<AtomicBool>,
        idle: Arc<AtomicBool>,
        poke: Arc<Notify>,
        wakes: Arc<Mutex<Vec<Wake>>>,
        stops: Arc<AtomicU32>,
        /// While set, a run waits for it to be notified before it ends.
        hold: Option<Arc<Notify>>,
    }

    impl BackgroundTask for Probe {
        async fn activate(&mut self, why: Wake) -> Outcome {
            self.wakes.lock().unwrap().push(why);
            if let Some(hold) = &self.hold {
                hold.notified().await;
            }
            if self.idle.load(Ordering::SeqCst) {
                Outcome::Idle
            } else if self.fail.load(Ordering::SeqCst) {
                Outcome::Failed(TaskError::new("the body failed"))
            } else {
                Outcome::Done
            }
        }

        async fn watch(&mut self) {
            self.poke.notified().await
        }

        async fn stop(&mut self) {
            self.stops.fetch_add(1, Ordering::SeqCst);
        }
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// `probe` spawned as `name`, run at once and every `period`, once its
    /// first run has begun.
    async fn started(driver: &Driver, name: &str, period: Duration, probe: &Probe) -> Arc<Task> {
        let task = driver.spawn(name, Some(period), Start::Now, probe.clone());
        settle().await;
        task
    }

    #[tokio::test(start_paused = true)]
    async fn tasks_run_each_period_early_when_activated_and_record_errors() {
        let driver = Driver::default();
        let probe = Probe::default();
        let task = started(&driver, "test-task", Duration::from_secs(10), &probe).await;
        assert_eq!(task.status().runs, 1, "the first run is at once");
        assert!(task.status().next_run.is_some(), "the next run is due");

        // The period: nothing before it, one run at it.
        tokio::time::advance(Duration::from_secs(9)).await;
        settle().await;
        assert_eq!(task.status().runs, 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        settle().await;
        assert_eq!(task.status().runs, 2);

        // An activation runs it long before the period ends.
        probe.fail.store(true, Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(1)).await;
        driver.activate("test-task");
        settle().await;
        let status = task.status();
        assert_eq!(status.runs, 3);
        assert_eq!(status.last_error.as_deref(), Some("the body failed"));
        assert!(status.last_run_started.is_some() && status.last_run_finished.is_some());

        // The next run succeeds and clears the error.
        probe.fail.store(false, Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(10)).await;
        settle().await;
        let statuses = driver.statuses();
        assert_eq!(statuses.len(), 1);
        assert_eq!(statuses[0].name, "test-task");
        assert_eq!(statuses[0].period_millis, 10_000);
        assert_eq!(statuses[0].runs, 4);
        assert_eq!(statuses[0].last_error, None);
        assert_eq!(
            *probe.wakes.lock().unwrap(),
            [Wake::Start, Wake::Period, Wake::Activated, Wake::Period]
        );
        driver.shutdown().await;
        assert_eq!(probe.stops.load(Ordering::SeqCst), 1, "stopped once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watcher_wakes_a_task_and_idle_runs_are_not_counted() {
        let driver = Driver::default();
        let probe = Probe::default();
        let task = driver.spawn("watched", None, Start::AfterPeriod, probe.clone());
        // No period and no start: nothing runs however long it waits.
        tokio::time::advance(Duration::from_secs(3600)).await;
        settle().await;
        assert_eq!(task.status().runs, 0);
        assert_eq!(task.status().next_run, None);
        assert!(probe.wakes.lock().unwrap().is_empty());

        probe.poke.notify_one();
        settle().await;
        assert_eq!(task.status().runs, 1);
        let first_start = task.status().last_run_started;

        // An idle run leaves the count and the last run as they were.
        probe.idle.store(true, Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(1)).await;
        probe.poke.notify_one();
        settle().await;
        assert_eq!(*probe.wakes.lock().unwrap(), [Wake::Watched, Wake::Watched]);
        assert_eq!(task.status().runs, 1, "an idle run is not a run");
        assert_eq!(task.status().last_run_started, first_start);
        driver.shutdown().await;
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_waits_for_the_run_under_way_then_stops_the_task() {
        let driver = Driver::default();
        let hold = Arc::new(Notify::new());
        let probe = Probe {
            hold: Some(hold.clone()),
            ..Probe::default()
        };
        let task = started(&driver, "held", Duration::from_secs(1), &probe).await;
        assert_eq!(probe.wakes.lock().unwrap().len(), 1, "the run began");
        let shutdown = {
            let driver = Arc::new(driver);
            let d = driver.clone();
            (tokio::spawn(async move { d.shutdown().await }), driver)
        };
        settle().await;
        assert!(!shutdown.0.is_finished(), "shutdown waits for the run");
        assert_eq!(probe.stops.load(Ordering::SeqCst), 0);
        hold.notify_one();
        shutdown.0.await.unwrap();
        assert_eq!(task.status().runs, 1, "the run was not cut short");
        assert_eq!(probe.stops.load(Ordering::SeqCst), 1);
        assert_eq!(probe.wakes.lock().unwrap().len(), 1, "no run after stop");
    }
}

#[cfg(test)]
mod schema_tests {
    /// `GET /v1/status` documents its `tasks`, so response checks against
    /// the OpenAPI document accept them.
    #[test]
    fn the_status_schema_documents_the_tasks() {
        let doc: serde_json::Value =
            serde_json::from_str(crate::http::openapi::document()).expect("the document is JSON");
        let schemas = &doc["components"]["schemas"];
        assert!(
            schemas["CoordinatorStatus"]["properties"]["tasks"].is_object(),
            "{}",
            schemas["CoordinatorStatus"]
        );
        let task = &schemas["TaskStatus"]["properties"];
        for field in [
            "name",
            "periodMillis",
            "runs",
            "lastRunStarted",
            "lastRunFinished",
            "lastError",
            "nextRun",
        ] {
            assert!(task[field].is_object(), "TaskStatus lacks {field}: {task}");
        }
        // A task that has not run yet answers `null` for these.
        for field in ["lastRunStarted", "lastRunFinished", "nextRun"] {
            assert!(
                task[field]["type"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|t| t == "null")),
                "{field} does not admit null: {}",
                task[field]
            );
        }
    }
}
