//! The `fleet-summary` task: keeps [`FleetSummary`] (the counts behind
//! `/metrics` and the web overview) in step with the store, on every
//! replica.
//!
//! It subscribes to the store's changes before its first full read, so no
//! change falls between the two; each change is applied by reading the
//! changed record as it is now (from the read cache), which makes applying
//! one twice harmless. When the change feed lags (changes were dropped),
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

/// Applies one store change to `summary`.
fn apply(app: &App, summary: &FleetSummary, c: &Change) -> Result<(), StoreError> {
    match c.kind {
        Kind::Cluster => {
            let cluster = match c.deleted {
                true => None,
                false => app.store.get_json_cached::<Cluster>(c.kind, &c.name)?,
            };
            summary.cluster_changed(&c.name, cluster.as_ref().map(|(c, _)| c));
        }
        Kind::Machine => {
            let machine = match c.deleted {
                true => None,
                false => app.store.get_json_cached::<Machine>(c.kind, &c.name)?,
            };
            summary.machine_changed(&c.name, machine.as_ref().map(|(m, _)| m));
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
