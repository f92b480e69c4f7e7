//! The coordinator's background tasks, in one set (after Omicron's Nexus
//! background tasks): every loop `serve.rs` spawns registers here with a
//! name and a period, and gets a [`Task`] through which it waits for its
//! next run (the period, or an early [`Task::activate`]) and records each
//! run. `GET /v1/status` shows every task's [`TaskStatus`] (`tasks`), and
//! `drover get tasks` prints them.
//!
//! The loops keep their own bodies and extra wake-ups (the reconciler's
//! store changes, the gateway listeners' role changes):
//! the set only replaces their period sleep by [`Task::tick`] and takes
//! their reports.
//!
//! The election (`leader::run`) is not a task of the set: its wait is not
//! one period (it renews every third of the lease as leader but campaigns
//! every tenth as follower), one pass is several store calls whose failures
//! it retries on its own schedule, and running it early on request would
//! renew or campaign out of step with the lease.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

pub use crate::types::{QueueStatus, TaskStatus};

/// The cluster reconciler's name in the set (`App::reconcile_soon`
/// activates it).
pub const RECONCILER_TASK: &str = "cluster-reconciler";

/// Every background task of this coordinator, in registration order.
#[derive(Debug, Default)]
pub struct TaskSet {
    tasks: Mutex<Vec<Arc<Task>>>,
}

impl TaskSet {
    /// Registers a task run every `period`; its loop drives it through the
    /// returned handle.
    pub fn register(&self, name: &str, period: Duration) -> Arc<Task> {
        let task = Arc::new(Task {
            name: name.to_owned(),
            period,
            activation: Notify::new(),
            state: Mutex::new(State::default()),
        });
        self.tasks.lock().expect("task set lock").push(task.clone());
        task
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
            .expect("task set lock")
            .iter()
            .find(|t| t.name == name)
            .cloned()
    }

    /// What every task reports, in registration order.
    pub fn statuses(&self) -> Vec<TaskStatus> {
        self.tasks
            .lock()
            .expect("task set lock")
            .iter()
            .map(|t| t.status())
            .collect()
    }
}

/// One registered background task.
#[derive(Debug)]
pub struct Task {
    name: String,
    period: Duration,
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
    queue: Option<QueueStatus>,
}

/// Why [`Task::tick`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The period passed.
    Period,
    /// Something called [`Task::activate`].
    Activated,
}

impl Task {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// Asks the task to run now rather than at the end of its period. An
    /// activation while the task runs makes its next wait end at once.
    pub fn activate(&self) {
        self.activation.notify_one();
    }

    /// Waits for the task's next run: its period, or an activation,
    /// whichever comes first. Records when the run is due.
    pub async fn tick(&self) -> Wake {
        self.lock().next_run = Some(drover_common::now() + self.period);
        tokio::select! {
            _ = tokio::time::sleep(self.period) => Wake::Period,
            _ = self.activation.notified() => Wake::Activated,
        }
    }

    /// Records that a run begins.
    pub fn started(&self) {
        let mut s = self.lock();
        s.last_run_started = Some(drover_common::now());
        s.next_run = None;
        s.started_at = Some(std::time::Instant::now());
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

    /// Records the task's work queue as it stands.
    pub fn set_queue(&self, queue: QueueStatus) {
        self.lock().queue = Some(queue);
    }

    /// What the task reports about itself.
    pub fn status(&self) -> TaskStatus {
        let s = self.lock();
        TaskStatus {
            name: self.name.clone(),
            period_millis: self.period.as_millis() as u64,
            runs: s.runs,
            last_run_started: s.last_run_started,
            last_run_finished: s.last_run_finished,
            last_error: s.last_error.clone(),
            next_run: s.next_run,
            queue: s.queue,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("task state lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop shaped like the coordinator's: run, then wait for the next
    /// tick; its body fails while `fail` holds.
    async fn run(task: Arc<Task>, fail: Arc<std::sync::atomic::AtomicBool>) {
        loop {
            task.started();
            let error = fail
                .load(std::sync::atomic::Ordering::SeqCst)
                .then(|| "the body failed".to_owned());
            task.finished(error);
            task.tick().await;
        }
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn tasks_run_each_period_early_when_activated_and_record_errors() {
        let set = TaskSet::default();
        let task = set.register("test-task", Duration::from_secs(10));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handle = tokio::spawn(run(task.clone(), fail.clone()));
        settle().await;
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
        fail.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(1)).await;
        set.get("test-task").expect("registered").activate();
        settle().await;
        let status = task.status();
        assert_eq!(status.runs, 3);
        assert_eq!(status.last_error.as_deref(), Some("the body failed"));
        assert!(status.last_run_started.is_some() && status.last_run_finished.is_some());

        // The next run succeeds and clears the error.
        fail.store(false, std::sync::atomic::Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(10)).await;
        settle().await;
        let statuses = set.statuses();
        assert_eq!(statuses.len(), 1);
        assert_eq!(statuses[0].name, "test-task");
        assert_eq!(statuses[0].period_millis, 10_000);
        assert_eq!(statuses[0].runs, 4);
        assert_eq!(statuses[0].last_error, None);
        handle.abort();
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
