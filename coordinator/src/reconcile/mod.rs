//! The cluster reconciler: for each cluster on its own, level-triggered,
//! it plans the steps from the cluster and its machines as they are (a
//! pure function) and applies them (the executor). It never sees events,
//! only objects, so running it twice changes nothing the second time. The
//! controller (`controller.rs`) decides when: a work queue of cluster names
//! (`domain::workqueue`) fed by store changes through the fleet index
//! (`domain::fleet_index`).

pub mod controller;
pub mod error;
pub mod provisioner;

pub use crate::provider::retries::ProvisionRetries;
pub use error::ReconcileError;

mod executor;

pub use executor::execute;
use executor::unassigned_alive;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::app::App;

/// Keeps the `Alive` condition of pool machines that no cluster claimed true
/// to what the coordinator sees. A machine's condition can only need a
/// change when its heartbeats stop or start again, so after a first read of
/// every machine the scan reads only those whose heartbeats went quiet or
/// came back since ([`FreeScan`]), and every machine again only every
/// [`FULL_FREE_SCAN`]: decoding a large fleet every heartbeat interval cost
/// more memory than the whole heartbeat path. It runs on a blocking thread,
/// at most once per heartbeat interval (a machine cannot go silent faster),
/// not on every store change.
async fn free_machines_alive(app: Arc<App>, mut scan: FreeScan) -> (FreeScan, Vec<String>) {
    crate::store::blocking(move || {
        let errors = scan.run(&app);
        (scan, errors)
    })
    .await
}

/// How often the free-machine scan reads every machine regardless.
pub const FULL_FREE_SCAN: Duration = Duration::from_secs(600);

/// What the free-machine scan saw: for each machine with a heartbeat
/// record, whether its heartbeats had stopped (longer than the heartbeat
/// timeout) when it was last looked at.
#[derive(Debug, Default)]
pub struct FreeScan {
    quiet: std::collections::HashMap<String, bool>,
    full_at: Option<Instant>,
}

impl FreeScan {
    /// Reads the machines that may need their `Alive` condition changed and
    /// changes it. Returns the errors met.
    fn run(&mut self, app: &App) -> Vec<String> {
        let now = drover_common::now();
        let timeout = app.settings.health_defaults.heartbeat_timeout;
        let quiet: std::collections::HashMap<String, bool> = app
            .fleet
            .liveness
            .lock()
            .expect("liveness lock")
            .iter()
            .map(|(name, l)| {
                // The stall clock is asked only of what looks quiet.
                let quiet = now - l.last_seen > timeout
                    && now - app.fleet.stalls.judged_last_seen(l.last_seen, now) > timeout;
                (name.clone(), quiet)
            })
            .collect();
        let full = self.full_at.is_none_or(|at| at.elapsed() >= FULL_FREE_SCAN);
        let machines = if full {
            match app.machines() {
                Ok(m) => m,
                Err(e) => return vec![format!("cannot list machines: {e}")],
            }
        } else {
            let mut read = vec![];
            for (name, q) in &quiet {
                if self.quiet.get(name) == Some(q) {
                    continue;
                }
                match app.machine(name) {
                    Ok(Some(m)) => read.push(m),
                    Ok(None) => {}
                    Err(e) => return vec![format!("cannot read machine {name}: {e}")],
                }
            }
            read
        };
        let errors = unassigned_alive(app, &machines);
        if errors.is_empty() {
            if full {
                self.full_at = Some(Instant::now());
            }
            self.quiet = quiet;
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use drover_common::api::{MachinePhase, ALIVE_CONDITION};
    use drover_planner::fixtures::free;
    use time::OffsetDateTime;

    use crate::app::{App, Liveness};
    use crate::store::{Kind, StoreError};

    /// A coordinator in `dir` holding free machine `m`, Registered.
    fn with_free_machine(dir: &std::path::Path) -> Arc<App> {
        let app = App::for_tests(dir);
        let mut m = free("m", "dev");
        m.status.phase = MachinePhase::Registered;
        app.store.create_json(Kind::Machine, "m", &m).unwrap();
        app
    }

    /// Records that `m` was last heard from at `at`.
    fn heard(app: &App, at: OffsetDateTime) {
        app.fleet
            .liveness
            .lock()
            .unwrap()
            .insert("m".into(), Liveness { last_seen: at });
    }

    /// `m`'s Alive condition: status and reason.
    fn alive(app: &App) -> Option<(String, String)> {
        let m = app.machine("m").unwrap().unwrap();
        m.status
            .conditions
            .iter()
            .find(|c| c.type_ == ALIVE_CONDITION)
            .map(|c| (c.status.clone(), c.reason.clone()))
    }

    #[tokio::test]
    async fn free_machines_are_read_again_only_when_their_heartbeats_stop_or_resume() {
        let dir = tempfile::tempdir().unwrap();
        let app = with_free_machine(dir.path());
        let seen = |ago: u64| heard(&app, drover_common::now() - Duration::from_secs(ago));
        let alive = || alive(&app);
        let mut scan = super::FreeScan::default();
        // Silent for an hour: Alive turns False.
        seen(3600);
        assert!(scan.run(&app).is_empty());
        assert_eq!(alive(), Some(("False".into(), "Silent".into())));
        // Heartbeating again: True.
        seen(0);
        assert!(scan.run(&app).is_empty());
        assert_eq!(alive(), Some(("True".into(), "Heartbeating".into())));
        // While its heartbeats keep coming the machine is not read again:
        // a condition written behind the scan's back stays as it is ...
        app.update_machine::<StoreError>("m", |m| {
            for c in &mut m.status.conditions {
                if c.type_ == ALIVE_CONDITION {
                    c.status = "False".into();
                    c.reason = "Silent".into();
                }
            }
            Ok(true)
        })
        .unwrap();
        assert!(scan.run(&app).is_empty());
        assert_eq!(alive(), Some(("False".into(), "Silent".into())));
        // ... until the periodic full scan reads every machine.
        scan.full_at = std::time::Instant::now().checked_sub(super::FULL_FREE_SCAN);
        assert!(scan.run(&app).is_empty());
        assert_eq!(alive(), Some(("True".into(), "Heartbeating".into())));
    }

    #[tokio::test]
    async fn silence_while_the_coordinator_stalled_is_not_held_against_a_machine() {
        let dir = tempfile::tempdir().unwrap();
        let app = with_free_machine(dir.path());
        // Last heard 60 s ago (the timeout is 40 s), just before the
        // coordinator's runtime stood still for 59 s.
        let now = drover_common::now();
        let last = now - Duration::from_secs(60);
        heard(&app, last);
        let stalls = &app.fleet.stalls;
        stalls.tick(last);
        assert!(stalls.tick(now - Duration::from_millis(700)).is_some());
        stalls.tick(now);
        let mut scan = super::FreeScan::default();
        assert!(scan.run(&app).is_empty());
        assert_ne!(
            alive(&app).map(|(status, _)| status).as_deref(),
            Some("False"),
            "judged silent across a stall"
        );
        // The same silence with the coordinator running all along is.
        let other = tempfile::tempdir().unwrap();
        let app = with_free_machine(other.path());
        heard(&app, last);
        let mut scan = super::FreeScan::default();
        assert!(scan.run(&app).is_empty());
        assert_eq!(alive(&app), Some(("False".into(), "Silent".into())));
    }
}
