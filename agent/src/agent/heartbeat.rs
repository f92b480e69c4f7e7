//! Heartbeats: reporting phase, health, bootstrap step and directive
//! results, and acting on the answer (directives, then the assignment).

use drover_common::wire::AssignmentNotice;
use tokio::time::Instant;

use super::{Agent, Link, Stopped};
use crate::protocol::assignment::{self, Current, Decision, Stage};
use crate::protocol::directives::is_reset;
use crate::protocol::heartbeat;
use crate::protocol::timing::{heartbeat_timeout, interval_from_seconds};
use crate::shutdown::Shutdown;
use crate::state::{BootstrapProgress, BootstrapStep};

impl Agent {
    pub(super) async fn heartbeat(&mut self, shutdown: &mut Shutdown) -> Result<(), Stopped> {
        self.next_heartbeat = Instant::now() + self.interval;
        let plan = self.probe_plan().await;
        let health = tokio::select! {
            h = self.prober.report(&plan) => h,
            () = shutdown.requested() => return Err(Stopped),
        };
        let request = heartbeat::request(
            self.phase(),
            self.state.applied_generation(),
            health,
            self.bootstrap_report(),
            &self.state.pending_results,
        );
        let answer = tokio::select! {
            r = self.api.heartbeat(&request, heartbeat_timeout(self.interval)) => r,
            () = shutdown.requested() => return Err(Stopped),
        };
        match answer {
            Ok(reply) => {
                match self.link {
                    Link::Up => {}
                    Link::Unknown => tracing::info!(
                        interval_s = reply.heartbeat_interval_seconds,
                        "heartbeat accepted; reporting to the coordinator"
                    ),
                    Link::Down | Link::Refused => {
                        tracing::info!("heartbeat accepted again after failures")
                    }
                }
                self.link = Link::Up;
                tracing::debug!(phase = ?request.phase, applied_generation = request.applied_generation, "heartbeat sent");
                if heartbeat::delivered(&mut self.state.pending_results, &request) {
                    self.persist();
                }
                self.interval = interval_from_seconds(reply.heartbeat_interval_seconds);
                self.next_heartbeat = Instant::now() + self.interval;
                // Directives first, so an assignment is not started when a
                // reset is already asked for.
                self.accept_directives(reply.directives);
                self.on_assignment(reply.assignment);
            }
            Err(e) if e.is_unauthorized() => {
                self.link = Link::Refused;
                tracing::warn!(
                    error = %e,
                    retry_in_s = self.interval.as_secs(),
                    "the coordinator no longer accepts this machine's certificate; retrying at the heartbeat interval"
                );
            }
            Err(e) => {
                self.link = Link::Down;
                tracing::warn!(error = %e, retry_in_s = self.interval.as_secs(), "heartbeat failed; retrying at the next tick");
            }
        }
        Ok(())
    }

    fn on_assignment(&mut self, notice: Option<AssignmentNotice>) {
        let Some(notice) = notice else { return };
        let work_busy = self.work.is_some();
        let fetching = self.config.wanted();
        let current = self.state.bootstrap.as_ref().map(|p| Current {
            generation: p.assignment.generation,
            stage: match &p.step {
                BootstrapStep::Assigned => Stage::Fetching { fetching },
                BootstrapStep::Resetting => Stage::Resetting,
                BootstrapStep::FilesWritten
                | BootstrapStep::KubeadmStarted
                | BootstrapStep::Done => Stage::Applied,
                BootstrapStep::Failed { step, .. } => Stage::Failed {
                    step,
                    busy: work_busy,
                },
            },
        });
        let reset_pending = self.resetting || self.queue.iter().any(is_reset);
        let decision = assignment::decide(
            current,
            self.state.retired_generation,
            reset_pending,
            notice.generation,
        );
        match decision {
            // A command is still running; the next heartbeat looks again.
            Decision::Ignore | Decision::Wait => {}
            Decision::Accept => {
                tracing::info!(
                    cluster = %notice.cluster,
                    role = %notice.role,
                    generation = notice.generation,
                    "assigned to a cluster; fetching the config"
                );
                self.state.bootstrap = Some(BootstrapProgress {
                    assignment: notice,
                    step: BootstrapStep::Assigned,
                    written_files: Vec::new(),
                    kubeadm_config_path: None,
                });
                self.persist();
                self.want_config_now();
                self.heartbeat_soon();
            }
            // A heartbeat saying "assigned" resumes fetching after a 404.
            Decision::ResumeFetch => self.want_config_now(),
            Decision::Replace { fetch } => {
                tracing::info!(
                    generation = notice.generation,
                    "the assignment changed before the config was fetched"
                );
                self.set_assignment(notice);
                self.persist();
                if fetch {
                    self.want_config_now();
                }
                self.heartbeat_soon();
            }
            Decision::StartOver { reset_first } => {
                tracing::info!(
                    generation = notice.generation,
                    reset_first,
                    "a newer assignment after a failed bootstrap; starting over"
                );
                self.set_assignment(notice);
                if reset_first {
                    self.reset_before_retry();
                } else {
                    self.set_step(BootstrapStep::Assigned);
                    self.want_config_now();
                }
                self.heartbeat_soon();
            }
            Decision::RefuseNewer => {
                if self.warned_generation != Some(notice.generation) {
                    tracing::warn!(
                        applied = self.state.applied_generation(),
                        offered = notice.generation,
                        "already bootstrapped an assignment; a newer one needs a reset first, ignoring it"
                    );
                    self.warned_generation = Some(notice.generation);
                }
            }
        }
    }

    /// Replaces the assignment being bootstrapped (not persisted yet).
    fn set_assignment(&mut self, notice: AssignmentNotice) {
        if let Some(progress) = self.state.bootstrap.as_mut() {
            progress.assignment = notice;
        }
    }
}
