//! Heartbeats: reporting phase, health, bootstrap step and directive
//! results, and acting on the answer (directives, then the assignment).

use drover_common::wire::AssignmentNotice;
use tokio::time::Instant;

use super::{Agent, Link, Stopped};
use crate::protocol::assignment::{self, Current, Decision, Stage};
use crate::protocol::coordinators::{self, Update};
use crate::protocol::datagram::{answer_timeout, DatagramLink, Sent, Unanswered, RETRY_AFTER};
use crate::protocol::directives::is_reset;
use crate::protocol::heartbeat;
use crate::protocol::timing::{heartbeat_timeout, interval_from_seconds};
use crate::shutdown::Shutdown;
use crate::state::{BootstrapProgress, BootstrapStep};
use drover_common::wire::datagram::Verdict;
use drover_common::wire::HeartbeatRequest;

/// How often a control plane repeats an unchanged report of its cluster.
const REPORT_REFRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether a report differs from the last one delivered, or that one is a
/// while ago: the coordinator hears of every change, and of nothing else
/// but a refresh now and then.
fn worth_sending<T: PartialEq>(sent: Option<&(T, Instant)>, report: &T) -> bool {
    sent.is_none_or(|(last, at)| at.elapsed() >= REPORT_REFRESH || last != report)
}

impl Agent {
    pub(super) async fn heartbeat(&mut self, shutdown: &mut Shutdown) -> Result<(), Stopped> {
        self.coordinator.next_heartbeat = Instant::now() + self.coordinator.interval;
        let plan = self.probe_plan().await;
        // A running control plane also reads its etcd members and the
        // Nodes, beside the probes; the heartbeat waits for that view at
        // most half an interval (see `view.rs`).
        let view_ip = match self.reports_cluster() {
            true => self.advertise_address().await,
            false => None,
        };
        let api_server_port = self.settings.api_server_port;
        let budget = self.coordinator.interval / 2;
        let local = &mut self.local;
        let reads = async {
            tokio::join!(
                local.prober.report(&plan),
                local.view.read(view_ip, api_server_port, budget),
            )
        };
        let (mut health, (etcd, nodes)) = tokio::select! {
            r = reads => r,
            () = shutdown.requested() => return Err(Stopped),
        };
        health.boot_id = crate::reboot::boot_id(self.settings.boot_id_file.as_deref());
        crate::reboot::after_reboot(
            &self.settings.root,
            &self.settings.state_dir,
            health.boot_id.as_deref(),
        )
        .await;
        if let Some(mirror) = self.local.node_conditions.as_mut() {
            mirror.sync(&self.settings.root, &health.problems).await;
        }
        let etcd = etcd.filter(|r| worth_sending(self.delivered.etcd.as_ref(), r));
        let nodes = nodes.filter(|r| worth_sending(self.delivered.nodes.as_ref(), r));
        if self.local.kubeadm_version.is_none() {
            self.local.kubeadm_version =
                Some(crate::command::kubeadm_version(&self.settings.kubeadm).await);
        }
        let mut request = heartbeat::request(
            self.phase(),
            self.saved.state.applied_generation(),
            health,
            self.bootstrap_report(),
            &self.saved.state.pending_results,
            etcd,
            nodes,
        );
        request.kubeadm_version = self
            .local
            .kubeadm_version
            .clone()
            .flatten()
            .filter(|v| self.delivered.kubeadm_version.as_ref() != Some(v));
        request.certificates = self.certificates_report();
        request.heartbeat_fallback = self.coordinator.fallback.note();
        request.coordinators_digest = Some(coordinators::digest(&self.saved.state.coordinators));
        if self.beat_by_datagram(&request, shutdown).await? {
            return Ok(());
        }
        let answer = tokio::select! {
            r = self.coordinator.api.heartbeat(&request, heartbeat_timeout(self.coordinator.interval)) => r,
            () = shutdown.requested() => return Err(Stopped),
        };
        match answer {
            Ok(reply) => {
                match self.coordinator.link {
                    Link::Up => {}
                    Link::Unknown => tracing::info!(
                        interval_s = reply.heartbeat_interval_seconds,
                        "heartbeat accepted; reporting to the coordinator"
                    ),
                    Link::Down | Link::Refused => {
                        tracing::info!("heartbeat accepted again after failures")
                    }
                }
                self.coordinator.link = Link::Up;
                tracing::debug!(phase = ?request.phase, applied_generation = request.applied_generation, "heartbeat sent");
                if heartbeat::delivered(&mut self.saved.state.pending_results, &request) {
                    self.persist();
                }
                if let Some(report) = request.etcd.clone() {
                    self.delivered.etcd = Some((report, Instant::now()));
                }
                if let Some(report) = request.nodes.clone() {
                    self.delivered.nodes = Some((report, Instant::now()));
                }
                if let Some(v) = request.kubeadm_version.clone() {
                    self.delivered.kubeadm_version = Some(v);
                }
                if let Some(c) = request.certificates.clone() {
                    self.delivered.certificates = Some(c);
                }
                self.coordinator.interval = interval_from_seconds(reply.heartbeat_interval_seconds);
                self.coordinator.next_heartbeat = Instant::now() + self.coordinator.interval;
                self.take_coordinators(reply.coordinators);
                self.coordinator.datagram = reply.datagram.as_ref().and_then(|offer| {
                    DatagramLink::from_offer(offer, &request)
                        .map_err(|e| tracing::warn!(error = %e, "cannot use the datagram offer"))
                        .ok()
                });
                // Directives first, so an assignment is not started when a
                // reset is already asked for.
                self.accept_directives(reply.directives);
                self.on_assignment(reply.assignment);
            }
            Err(e) if e.is_unauthorized() => {
                self.coordinator.link = Link::Refused;
                self.coordinator.datagram = None;
                tracing::warn!(
                    error = %e,
                    retry_in_s = self.coordinator.interval.as_secs(),
                    "the coordinator no longer accepts this machine's certificate; retrying at the heartbeat interval"
                );
            }
            Err(e) => {
                self.coordinator.link = Link::Down;
                tracing::warn!(error = %e, retry_in_s = self.coordinator.interval.as_secs(), "heartbeat failed; retrying at the next tick");
            }
        }
        Ok(())
    }

    /// Takes up the coordinator URLs a heartbeat answer named: a valid new
    /// list replaces the client's and is saved before the next request, so
    /// a restart keeps it; an invalid one is logged and the old one kept.
    fn take_coordinators(&mut self, offered: Option<Vec<String>>) {
        match coordinators::decide(&self.saved.state.coordinators, offered) {
            Update::Keep => {}
            Update::Replace(urls) => {
                tracing::info!(
                    from = ?self.saved.state.coordinators,
                    to = ?urls,
                    "the coordinator replicas changed; using the new list"
                );
                self.coordinator.api.set_urls(&urls);
                self.saved.state.coordinators = urls;
                self.persist();
            }
            // Logged once per refusal, not at every heartbeat.
            Update::Refuse(e) if self.logged.refused_coordinators.as_ref() != Some(&e) => {
                tracing::warn!(
                    error = %e,
                    kept = ?self.saved.state.coordinators,
                    "the coordinator named an invalid list of coordinator URLs; keeping the current one"
                );
                self.logged.refused_coordinators = Some(e);
            }
            Update::Refuse(_) => {}
        }
    }

    /// Sends a heartbeat as a datagram when it may go as one (see
    /// [`crate::protocol::datagram`]); true when no HTTPS heartbeat is
    /// needed now: the coordinator answered that nothing waits, or a first
    /// datagram in a row went unanswered (the next goes at the interval).
    async fn beat_by_datagram(
        &mut self,
        request: &HeartbeatRequest,
        shutdown: &mut Shutdown,
    ) -> Result<bool, Stopped> {
        let now = Instant::now();
        if !self.coordinator.fallback.may_try(now) {
            return Ok(false);
        }
        let Some(sent) = self
            .coordinator
            .datagram
            .as_mut()
            .and_then(|link| link.beat(request, std::time::SystemTime::now()))
        else {
            return Ok(false);
        };
        let target = match crate::api::datagram_target(&self.coordinator.api.preferred_url()).await
        {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(error = %e, "no address for heartbeat datagrams; heartbeating over HTTPS");
                return Ok(false);
            }
        };
        if self.coordinator.udp.is_none() {
            let any = if target.is_ipv4() {
                "0.0.0.0:0"
            } else {
                "[::]:0"
            };
            match tokio::net::UdpSocket::bind(any).await {
                Ok(s) => self.coordinator.udp = Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open a UDP socket for heartbeat datagrams; heartbeating over HTTPS");
                    return Ok(false);
                }
            }
        }
        let (Some(socket), Some(link)) = (
            self.coordinator.udp.as_ref(),
            self.coordinator.datagram.as_ref(),
        ) else {
            return Ok(false);
        };
        let wait = answer_timeout(self.coordinator.interval);
        let verdict = match socket.send_to(&sent.datagram, target).await {
            Ok(_) => tokio::select! {
                v = await_answer(socket, link, &sent, wait) => v,
                () = shutdown.requested() => return Err(Stopped),
            },
            Err(e) => {
                tracing::debug!(%target, error = %e, "cannot send a heartbeat datagram");
                None
            }
        };
        match verdict {
            Some(Verdict::Quiet) => {
                self.coordinator.fallback.answered();
                if self.coordinator.link != Link::Up {
                    tracing::info!(%target, "heartbeat accepted by datagram");
                }
                self.coordinator.link = Link::Up;
                tracing::debug!(%target, "heartbeat sent as a datagram");
                Ok(true)
            }
            Some(Verdict::CallHttps) => {
                self.coordinator.fallback.answered();
                tracing::debug!(%target, "the coordinator asks for an HTTPS heartbeat");
                Ok(false)
            }
            None => {
                let at = crate::protocol::timing::rfc3339(drover_common::now());
                match self
                    .coordinator
                    .fallback
                    .unanswered(&target.to_string(), now, &at)
                {
                    Unanswered::Wait => {
                        tracing::debug!(%target, "a heartbeat datagram went unanswered; sending the next at the interval");
                        Ok(true)
                    }
                    Unanswered::Https => Ok(false),
                    Unanswered::FallBack => {
                        tracing::warn!(%target, retry_in_s = RETRY_AFTER.as_secs(), "heartbeat datagrams go unanswered; heartbeating over HTTPS");
                        Ok(false)
                    }
                }
            }
        }
    }

    /// Whether this machine reports on its cluster: a running control
    /// plane that is not resetting. Forgets what was sent when it is not.
    fn reports_cluster(&mut self) -> bool {
        let control_plane = self
            .saved
            .state
            .role()
            .is_some_and(|r| r.is_control_plane());
        let reports = self.saved.state.bootstrapped() && control_plane && !self.work.resetting;
        if !reports {
            self.delivered.etcd = None;
            self.delivered.nodes = None;
            self.delivered.certificates = None;
        }
        reports
    }

    /// When a running control plane's first kubeadm certificate expires,
    /// when it differs from what the coordinator last heard (it changes
    /// when the certificates are renewed). The files are read once and
    /// again after each command, not on every heartbeat.
    fn certificates_report(&mut self) -> Option<drover_common::api::CertificateExpiry> {
        if !self.reports_cluster() {
            return None;
        }
        let root = &self.settings.root;
        self.local
            .certificates
            .get_or_insert_with(|| crate::certificates::earliest_expiry(root))
            .clone()
            .filter(|c| self.delivered.certificates.as_ref() != Some(c))
    }

    fn on_assignment(&mut self, notice: Option<AssignmentNotice>) {
        let Some(notice) = notice else { return };
        let work_busy = self.work.running.is_some();
        let fetching = self.config.wanted();
        let current = self.saved.state.bootstrap.as_ref().map(|p| Current {
            generation: p.assignment.generation,
            stage: match &p.step {
                BootstrapStep::Assigned => Stage::Fetching { fetching },
                BootstrapStep::Resetting => Stage::Resetting,
                BootstrapStep::FilesWritten
                | BootstrapStep::KubeadmStarted
                | BootstrapStep::PostKubeadmCommands
                | BootstrapStep::Done => Stage::Applied,
                BootstrapStep::Failed { step, .. } => Stage::Failed {
                    step,
                    busy: work_busy,
                },
            },
        });
        let reset_pending = self.work.resetting || self.work.queue.iter().any(is_reset);
        let decision = assignment::decide(
            current,
            self.saved.state.retired_generation,
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
                self.saved.state.bootstrap = Some(BootstrapProgress {
                    assignment: notice,
                    step: BootstrapStep::Assigned,
                    written_files: Vec::new(),
                    kubeadm_config_path: None,
                    post_kubeadm_commands: Vec::new(),
                    restore: None,
                    restored: None,
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
                if self.logged.warned_generation != Some(notice.generation) {
                    tracing::warn!(
                        applied = self.saved.state.applied_generation(),
                        offered = notice.generation,
                        "already bootstrapped an assignment; a newer one needs a reset first, ignoring it"
                    );
                    self.logged.warned_generation = Some(notice.generation);
                }
            }
        }
    }

    /// Replaces the assignment being bootstrapped (not persisted yet).
    fn set_assignment(&mut self, notice: AssignmentNotice) {
        if let Some(progress) = self.saved.state.bootstrap.as_mut() {
            progress.assignment = notice;
        }
    }
}

/// The verdict of the answer to `sent`, read from `socket` within `wait`;
/// `None` when none came. Anything else arriving (a late answer to an
/// earlier beat, a forgery) is ignored.
async fn await_answer(
    socket: &tokio::net::UdpSocket,
    link: &DatagramLink,
    sent: &Sent,
    wait: std::time::Duration,
) -> Option<Verdict> {
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 64];
    loop {
        let (n, _) = tokio::time::timeout_at(deadline, socket.recv_from(&mut buf))
            .await
            .ok()?
            .ok()?;
        if let Some(v) = link.verdict(&buf[..n], sent) {
            return Some(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn reports_go_out_on_change_and_once_a_minute() {
        let sent = (1u32, Instant::now());
        assert!(worth_sending(None, &1));
        assert!(!worth_sending(Some(&sent), &1));
        assert!(worth_sending(Some(&sent), &2));
        tokio::time::advance(REPORT_REFRESH).await;
        assert!(worth_sending(Some(&sent), &1));
    }
}
