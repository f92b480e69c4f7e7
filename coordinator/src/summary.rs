//! The `fleet-summary` task: keeps [`FleetSummary`] (the counts behind
//! `/metrics` and the web overview) in step with the store, on every
//! replica.
//!
//! It subscribes to the store's changes before its first full read, so no
//! change falls between the two; each change is applied by reading the
//! changed record as it is now, at the announced revision or later (from
//! the read cache when it has caught up, else from the backend), which
//! makes applying one twice harmless. When the change feed lags (changes were dropped),
//! the next run reads everything again.

use std::sync::Arc;
use std::time::Duration;

use drover_common::api::{Cluster, Machine};
use tokio::sync::broadcast::error::RecvError;

use crate::app::App;
use crate::domain::fleet_summary::FleetSummary;
use crate::store::{Change, Kind, StoreError};
use crate::tasks::{BackgroundTask, Outcome, TaskError, Wake};

/// How often the task looks whether it must read everything (again): only
/// until its first full read succeeds, or after the change feed lagged.
pub const PERIOD: Duration = Duration::from_secs(30);

/// The task; see the module documentation.
pub struct Summarizer {
    app: Arc<App>,
    changes: tokio::sync::broadcast::Receiver<Change>,
    /// A full read is due (at the start, or changes were lost).
    rebuild: bool,
}

impl Summarizer {
    /// The task, subscribed to the store's changes.
    pub fn new(app: Arc<App>) -> Self {
        Self {
            changes: app.store.watch(),
            app,
            rebuild: true,
        }
    }
}

/// The record a change announced, as of that change or later (`None`:
/// deleted).
fn read_changed<T: serde::de::DeserializeOwned>(
    app: &App,
    c: &Change,
) -> Result<Option<T>, StoreError> {
    if c.deleted {
        return Ok(None);
    }
    Ok(app
        .store
        .get_json_at_least::<T>(c.kind, &c.name, c.revision)?
        .map(|(v, _)| v))
}

/// Applies one store change to `summary`.
fn apply(app: &App, summary: &FleetSummary, c: &Change) -> Result<(), StoreError> {
    match c.kind {
        Kind::Cluster => {
            let cluster = read_changed::<Cluster>(app, c)?;
            summary.cluster_changed(&c.name, cluster.as_ref());
        }
        Kind::Machine => {
            let machine = read_changed::<Machine>(app, c)?;
            summary.machine_changed(&c.name, machine.as_ref());
        }
        _ => {}
    }
    Ok(())
}

impl BackgroundTask for Summarizer {
    async fn activate(&mut self, _: Wake) -> Outcome {
        if !self.rebuild {
            return Outcome::Idle;
        }
        let app = self.app.clone();
        let read = crate::store::blocking(move || -> Result<(), StoreError> {
            let (clusters, machines) = (app.clusters()?, app.machines()?);
            app.fleet.summary.rebuild(&clusters, &machines);
            tracing::debug!(
                clusters = clusters.len(),
                machines = machines.len(),
                "fleet summary built"
            );
            Ok(())
        })
        .await;
        match read {
            Ok(()) => {
                self.rebuild = false;
                Outcome::Done
            }
            Err(e) => Outcome::Failed(TaskError::new(format_args!(
                "cannot read the fleet to count it: {e}"
            ))),
        }
    }

    /// Applies each change as it comes; resolves when changes were lost
    /// (or one could not be read), so that the run reads everything.
    async fn watch(&mut self) {
        if self.rebuild {
            return std::future::pending().await;
        }
        loop {
            match self.changes.recv().await {
                Ok(c) => {
                    if let Err(e) = apply(&self.app, &self.app.fleet.summary, &c) {
                        tracing::warn!(kind = c.kind.as_str(), name = %c.name, error = %e, "cannot read a changed object to count it; reading everything again");
                        self.rebuild = true;
                        return;
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(
                        missed = n,
                        "the fleet summary missed store changes; reading everything again"
                    );
                    self.rebuild = true;
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
    use drover_common::api::ClusterPhase;

    /// Cluster `name`'s phase as the summary counts it.
    fn counted(app: &App, phase: &str) -> u64 {
        use crate::metrics::FleetGauges;
        app.fleet
            .summary
            .cluster_phases()
            .into_iter()
            .find(|(p, _)| p == phase)
            .map_or(0, |(_, n)| n)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_summary_follows_every_change_though_the_feed_runs_ahead_of_the_cache() {
        const CLUSTERS: usize = 300;
        let dir = tempfile::tempdir().unwrap();
        let app = App::for_tests(dir.path());
        let mut c = drover_planner::fixtures::pool_cluster(1, 0);
        for i in 0..CLUSTERS {
            c.metadata.name = format!("c{i}");
            app.store
                .create_json(Kind::Cluster, &c.metadata.name, &c)
                .unwrap();
        }
        let mut task = Summarizer::new(app.clone());
        assert!(matches!(task.activate(Wake::Start).await, Outcome::Done));
        assert_eq!(counted(&app, "Pending"), CLUSTERS as u64);
        let watching = tokio::spawn(async move {
            task.watch().await;
            task.rebuild
        });
        // From another thread, each cluster read into the read cache and
        // then written once, Running: the summary counts them all Running
        // only if it applied each change as written, not the cached copy
        // from before it.
        let writer = app.clone();
        tokio::task::spawn_blocking(move || {
            for i in 0..CLUSTERS {
                let name = format!("c{i}");
                let (mut c, rev) = writer
                    .store
                    .get_json_cached::<Cluster>(Kind::Cluster, &name)
                    .unwrap()
                    .unwrap();
                c.status.phase = ClusterPhase::Running;
                writer
                    .store
                    .update_json(Kind::Cluster, &name, &c, Some(rev))
                    .unwrap();
            }
        })
        .await
        .unwrap();
        let caught_up = tokio::time::timeout(Duration::from_secs(20), async {
            while counted(&app, "Running") != CLUSTERS as u64 && !watching.is_finished() {
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(!watching.is_finished(), "the feed lagged");
        assert!(
            caught_up.is_ok(),
            "the summary did not catch up: {:?}",
            crate::metrics::FleetGauges::cluster_phases(&app.fleet.summary)
        );
        watching.abort();
    }
}
