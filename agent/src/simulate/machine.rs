//! One simulated machine: it registers, heartbeats, fetches its config
//! and answers directives by the rules of the protocol core, and reports
//! what happened to the fleet's statistics.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use drover_common::api::MachineRole;
use drover_common::wire::{
    AgentPhase, AssignmentNotice, BootstrapReport, DirectiveAction, DirectiveResult, HealthReport,
    HeartbeatRequest, HeartbeatResponse, Probe, ProbeState, RegisterResponse,
};
use rustls::client::Resumption;
use tokio::time::Instant;

use super::fleet::{CoordinatorCa, Fleet, IdentityError, ASSIGNED, GONE, IN_POOL};
use super::histogram::micros;
use crate::api::{ApiError, CoordinatorClient};
use crate::backoff::Backoff;
use crate::protocol::assignment::{self, Current, Decision, Stage};
use crate::protocol::config::{self, ConfigFetch, ConfigStep};
use crate::protocol::coordinators::{self, Update};
use crate::protocol::datagram::{answer_timeout, DatagramLink, Fallback, Unanswered};
use crate::protocol::directives::may_create_token;
use crate::protocol::heartbeat;
use crate::protocol::register::{self, permanent_status, Facts};
use crate::protocol::report::{self, kubeadm_step_name};
use crate::protocol::timing::{heartbeat_timeout, interval_from_seconds};
use crate::shutdown::Shutdown;
use crate::tls;
use drover_common::wire::datagram::Verdict;

/// Free disk space every simulated machine reports (constant, so a
/// heartbeat that changes nothing stays one).
const DISK_FREE_BYTES: u64 = 50 << 30;

/// TLS sessions each machine keeps for resumption (one per coordinator
/// replica is plenty; rustls' default of 256 costs tens of KiB each).
const SESSIONS_PER_MACHINE: usize = 4;

/// Directive ids each machine remembers, so a repeated one is not redone.
const REMEMBERED_DIRECTIVES: usize = 64;

/// One simulated machine, from its start to the end of the run.
pub(super) async fn machine(
    fleet: Arc<Fleet>,
    index: usize,
    start_at: Instant,
    mut stop: Shutdown,
) {
    tokio::select! {
        biased;
        () = stop.requested() => return,
        () = tokio::time::sleep_until(start_at) => {}
    }
    match register(&fleet, index, &mut stop).await {
        Some(m) => m.run(&fleet, &mut stop).await,
        None => fleet.set_state(index, GONE),
    }
}

/// Registers machine `index`; `None` when it failed for good or the run
/// ended first.
async fn register(fleet: &Fleet, index: usize, stop: &mut Shutdown) -> Option<Sim> {
    let hostname = format!(
        "{}-{:0width$}",
        fleet.hostname_prefix,
        index + 1,
        width = fleet.hostname_width
    );
    let fail = |kind: &str, message: String| {
        let mut s = fleet.stats();
        s.registration_failed += 1;
        s.error(format!("register: {kind}"), message);
        fleet.settle(&mut s);
    };
    let (key_pem, csr_pem) = match drover_common::pki::generate_key_and_csr(&hostname) {
        Ok(pair) => pair,
        Err(e) => {
            fail("key", e.to_string());
            return None;
        }
    };
    // A machine's first connection: a full handshake, no shared session.
    let mut config = fleet.pinned.clone();
    config.resumption = Resumption::disabled();
    let client = match fleet.client(index, config) {
        Ok(c) => c,
        Err(e) => {
            fail("client", e.to_string());
            return None;
        }
    };
    let request = register::request(
        &fleet.ticket,
        &csr_pem,
        Facts {
            hostname: &hostname,
            address: fleet.source(index),
            api_server_port: 6443,
            kubelet_healthz_port: 10248,
            agent_version: concat!(env!("CARGO_PKG_VERSION"), "-simulated"),
            instance_id: None,
            // What a simulated machine says it has: a 4-CPU, 16 GiB host.
            capacity: Some(drover_common::api::Capacity {
                cpus: 4,
                memory_bytes: 16 << 30,
            }),
        },
    );
    let mut backoff = Backoff::standard();
    let mut first_sent = None;
    let (response, took) = loop {
        let permit = tokio::select! {
            biased;
            () = stop.requested() => return None,
            p = fleet.registrations.acquire() => p.expect("the semaphore is never closed"),
        };
        let sent = Instant::now();
        let since = *first_sent.get_or_insert(sent);
        let answer = tokio::select! {
            biased;
            () = stop.requested() => return None,
            r = client.register(&request) => r,
        };
        drop(permit);
        match answer {
            Ok(r) => break (r, since.elapsed()),
            Err(e) => {
                let permanent = match &e {
                    ApiError::PinMismatch(_) | ApiError::Client(_) => true,
                    ApiError::Refused { status, .. } => permanent_status(*status),
                    _ => false,
                };
                let mut s = fleet.stats();
                s.api_error("register", &e);
                if permanent {
                    s.registration_failed += 1;
                    fleet.settle(&mut s);
                    return None;
                }
                s.registration_retries += 1;
            }
        }
        tokio::select! {
            biased;
            () = stop.requested() => return None,
            () = tokio::time::sleep(backoff.next_delay()) => {}
        }
    };
    drop(client);
    match Sim::new(fleet, index, &key_pem, response) {
        Ok(sim) => {
            let mut s = fleet.stats();
            s.registered += 1;
            s.registration.record(micros(took));
            s.last_registered = Some(Instant::now());
            s.interval.get_or_insert(sim.interval);
            fleet.settle(&mut s);
            drop(s);
            fleet.set_state(index, IN_POOL);
            Some(sim)
        }
        Err(why) => {
            fail("identity", why.to_string());
            None
        }
    }
}

/// Shutdown was requested during a call.
struct Stopped;

/// Records a heartbeat answered `took` after it was sent `at`.
/// Why a simulated control plane did not save a snapshot.
#[derive(Debug, thiserror::Error)]
enum SimulatedSnapshotError {
    #[error("the coordinator: {0}")]
    Coordinator(#[from] ApiError),
    #[error("sealing it: {0}")]
    Seal(#[from] drover_common::snapshot::SnapshotError),
    #[error("cannot write {path}: {source}")]
    Write {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// The result of a directive a simulated machine cannot carry out, for it
/// runs no `what`: what did not happen.
fn cannot(what: &str, outcome: String) -> (bool, String) {
    (
        false,
        format!("simulated machines run no {what}; {outcome}"),
    )
}

fn record_ok(fleet: &Fleet, s: &mut super::fleet::Stats, at: Instant, took: Duration) {
    s.heartbeats_ok += 1;
    s.heartbeat.record(micros(took));
    if s.steady_from.is_some_and(|from| at >= from) {
        s.steady_heartbeat.record(micros(took));
    }
    s.first_heartbeat.get_or_insert(at);
    let second = (at - fleet.start).as_secs() as usize;
    if s.heartbeats_per_second.len() <= second {
        s.heartbeats_per_second.resize(second + 1, 0);
    }
    s.heartbeats_per_second[second] += 1;
}

/// A registered simulated machine.
struct Sim {
    index: usize,
    uid: String,
    /// The HTTPS client, dropped (closing its connection) while the
    /// machine heartbeats by datagram, and made again when needed.
    api: Option<CoordinatorClient>,
    /// The machine's TLS setup (identity and session cache), to make the
    /// client again.
    tls: rustls::ClientConfig,
    /// Datagram heartbeats, while the coordinator offers them and the
    /// run's transport is `datagram`.
    link: Option<DatagramLink>,
    /// Where the datagrams go.
    target: Option<std::net::SocketAddr>,
    /// Whether datagrams get answered.
    fallback: Fallback<Instant>,
    ca: Arc<CoordinatorCa>,
    interval: Duration,
    phase: AgentPhase,
    assignment: Option<AssignmentNotice>,
    /// The newest assignment generation a reset gave up.
    retired: u64,
    bootstrap: Option<BootstrapReport>,
    results: Vec<DirectiveResult>,
    done: VecDeque<String>,
    /// Snapshots asked of this machine (directive id, snapshot), saved
    /// after the heartbeat that asked.
    snapshots: Vec<(String, String)>,
    config: ConfigFetch,
    /// The coordinator URLs a heartbeat answer named for this machine, and
    /// their digest; `None` while it uses the run's.
    coordinators: Option<(Vec<String>, String)>,
}

impl Sim {
    fn new(
        fleet: &Fleet,
        index: usize,
        key_pem: &str,
        r: RegisterResponse,
    ) -> Result<Self, IdentityError> {
        let ca = fleet.coordinator_ca(&r.coordinator_ca_pem)?;
        let mut config = tls::mtls_config_with(ca.verifier.clone(), &r.certificate_pem, key_pem)?;
        config.resumption = Resumption::in_memory_sessions(SESSIONS_PER_MACHINE);
        let api = fleet.client(index, config.clone())?;
        let _ = fleet.slots[index].name.set(r.machine_name);
        Ok(Self {
            index,
            uid: r.machine_uid,
            api: Some(api),
            tls: config,
            link: None,
            target: None,
            fallback: Fallback::default(),
            ca,
            interval: interval_from_seconds(r.heartbeat_interval_seconds),
            phase: AgentPhase::Waiting,
            assignment: None,
            retired: 0,
            bootstrap: None,
            results: Vec::new(),
            done: VecDeque::new(),
            snapshots: Vec::new(),
            config: ConfigFetch::default(),
            coordinators: None,
        })
    }

    /// Heartbeats (and fetches the config when assigned) until the run ends
    /// or the machine is silenced.
    async fn run(mut self, fleet: &Fleet, stop: &mut Shutdown) {
        // Like the agent: the first heartbeat right after registration.
        let mut next_heartbeat = Instant::now();
        loop {
            let wake = match self.config.next_at() {
                Some(at) if at < next_heartbeat => at,
                _ => next_heartbeat,
            };
            tokio::select! {
                biased;
                () = stop.requested() => return,
                () = tokio::time::sleep_until(wake) => {}
            }
            if fleet.slots[self.index].silence.load(Ordering::Relaxed) {
                // Dropping the client closes the connection, as a dead
                // machine's kernel would.
                fleet.set_state(self.index, GONE);
                return;
            }
            let mut soon = false;
            if self.config.next_at().is_some_and(|at| at <= Instant::now()) {
                match self.fetch_config(fleet, stop).await {
                    Ok(s) => soon = s,
                    Err(Stopped) => return,
                }
            }
            if soon || next_heartbeat <= Instant::now() {
                match self.heartbeat(fleet, stop).await {
                    Ok(next) => next_heartbeat = next,
                    Err(Stopped) => return,
                }
            }
        }
    }

    fn role(&self) -> Option<MachineRole> {
        self.assignment.as_ref().map(|a| a.role)
    }

    fn request(&self) -> HeartbeatRequest {
        let healthy = || Probe {
            state: ProbeState::Healthy,
            message: String::new(),
        };
        let control_plane = self.role().is_some_and(|r| r.is_control_plane());
        heartbeat::request(
            self.phase,
            self.assignment.as_ref().map_or(0, |a| a.generation),
            HealthReport {
                kubelet: healthy(),
                api_server: (self.phase == AgentPhase::Running && control_plane).then(healthy),
                disk_free_bytes: DISK_FREE_BYTES,
                // A simulated machine has no file systems or memory of its
                // own to check, and no boot of its own.
                problems: vec![],
                boot_id: None,
            },
            self.bootstrap.clone(),
            &self.results,
            // Simulated machines run no etcd and no API server.
            None,
            None,
        )
    }

    /// The HTTPS client, made again if the machine dropped it.
    fn api(&mut self, fleet: &Fleet) -> Result<&CoordinatorClient, ApiError> {
        if self.api.is_none() {
            let urls = self
                .coordinators
                .as_ref()
                .map_or(fleet.urls(), |(urls, _)| urls.as_slice());
            self.api = Some(fleet.client_for(self.index, self.tls.clone(), urls)?);
        }
        Ok(self.api.as_ref().expect("made above"))
    }

    /// Sends one heartbeat as a datagram when it may go as one; true when
    /// the coordinator answered that nothing waits.
    async fn beat_by_datagram(
        &mut self,
        fleet: &Fleet,
        request: &HeartbeatRequest,
        stop: &mut Shutdown,
    ) -> Result<bool, Stopped> {
        if !self.fallback.may_try(Instant::now()) {
            return Ok(false);
        }
        let (Some(hub), Some(target), Some(link)) =
            (fleet.datagrams.as_ref(), self.target, self.link.as_mut())
        else {
            return Ok(false);
        };
        let Some(sent) = link.beat(request, std::time::SystemTime::now()) else {
            return Ok(false);
        };
        let at = Instant::now();
        let answer = tokio::select! {
            biased;
            () = stop.requested() => return Err(Stopped),
            a = hub.exchange(self.index, target, link.id(), &sent.datagram, answer_timeout(self.interval)) => a,
        };
        let took = at.elapsed();
        match answer.and_then(|a| link.verdict(&a, &sent)) {
            Some(Verdict::Quiet) => {
                self.fallback.answered();
                let mut s = fleet.stats();
                s.heartbeats_sent += 1;
                s.datagrams.quiet += 1;
                record_ok(fleet, &mut s, at, took);
                Ok(true)
            }
            Some(Verdict::CallHttps) => {
                self.fallback.answered();
                fleet.stats().datagrams.call_https += 1;
                Ok(false)
            }
            None => {
                fleet.stats().datagrams.unanswered += 1;
                let at = crate::protocol::timing::rfc3339(drover_common::now());
                // As the agent: the first in a row waits for the next
                // interval, so a stall does not turn into an HTTPS storm.
                Ok(self
                    .fallback
                    .unanswered(&target.to_string(), Instant::now(), &at)
                    == Unanswered::Wait)
            }
        }
    }

    /// Sends one heartbeat; returns when the next is due.
    async fn heartbeat(&mut self, fleet: &Fleet, stop: &mut Shutdown) -> Result<Instant, Stopped> {
        let mut request = self.request();
        request.heartbeat_fallback = self.fallback.note();
        // With `--transport https`, the machines are agents that take no
        // datagram offer.
        request.datagrams = fleet.datagrams.is_some();
        request.coordinators_digest = Some(
            self.coordinators
                .as_ref()
                .map_or_else(|| fleet.coordinators_digest.clone(), |(_, d)| d.clone()),
        );
        if self.beat_by_datagram(fleet, &request, stop).await? {
            return Ok(Instant::now() + fleet.jittered(self.interval));
        }
        let timeout = heartbeat_timeout(self.interval);
        let sent = Instant::now();
        fleet.stats().heartbeats_sent += 1;
        let answer = match self.api(fleet) {
            Ok(api) => tokio::select! {
                biased;
                () = stop.requested() => return Err(Stopped),
                r = api.heartbeat(&request, timeout) => r,
            },
            Err(e) => Err(e),
        };
        let took = sent.elapsed();
        match answer {
            Ok(mut reply) => {
                record_ok(fleet, &mut fleet.stats(), sent, took);
                heartbeat::delivered(&mut self.results, &request);
                self.interval = interval_from_seconds(reply.heartbeat_interval_seconds);
                self.take_coordinators(fleet, reply.coordinators.take());
                self.take_offer(reply.datagram.take(), &request, fleet)
                    .await;
                let mut soon = self.on_reply(fleet, reply);
                soon |= self.save_snapshots(fleet).await;
                Ok(if soon {
                    Instant::now()
                } else {
                    Instant::now() + fleet.jittered(self.interval)
                })
            }
            Err(e) => {
                let mut s = fleet.stats();
                s.heartbeats_failed += 1;
                s.api_error("heartbeat", &e);
                drop(s);
                Ok(Instant::now() + fleet.jittered(self.interval))
            }
        }
    }

    /// Takes up the coordinator URLs an answer named, as the agent does
    /// (without saving them: a simulated machine has no state file).
    fn take_coordinators(&mut self, fleet: &Fleet, offered: Option<Vec<String>>) {
        let current = self
            .coordinators
            .as_ref()
            .map_or(fleet.urls(), |(urls, _)| urls.as_slice());
        if let Update::Replace(urls) = coordinators::decide(current, offered) {
            if let Some(api) = &self.api {
                api.set_urls(&urls);
            }
            let digest = coordinators::digest(&urls);
            self.coordinators = Some((urls, digest));
        }
    }

    /// Takes up the datagram offer of an answer to `request` (with
    /// `--transport datagram`); the HTTPS client is dropped while datagrams
    /// carry the heartbeats.
    async fn take_offer(
        &mut self,
        offer: Option<drover_common::wire::DatagramOffer>,
        request: &HeartbeatRequest,
        fleet: &Fleet,
    ) {
        self.link = offer
            .filter(|_| fleet.datagrams.is_some())
            .and_then(|o| DatagramLink::from_offer(&o, request).ok());
        if self.link.is_none() {
            return;
        }
        if self.target.is_none() {
            let url = self.api.as_ref().map(|a| a.preferred_url());
            self.target = match url {
                Some(u) => crate::api::datagram_target(&u).await.ok(),
                None => None,
            };
        }
        if self.target.is_some() {
            self.api = None;
        }
    }

    /// Acts on a heartbeat answer; true when the next heartbeat should go
    /// at once (to report what changed).
    fn on_reply(&mut self, fleet: &Fleet, reply: HeartbeatResponse) -> bool {
        let mut soon = false;
        for d in reply.directives {
            if self.done.contains(&d.id) {
                continue;
            }
            if let DirectiveAction::SaveEtcdSnapshot { snapshot } = &d.action {
                if self.phase == AgentPhase::Running
                    && self.role().is_some_and(|r| r.is_control_plane())
                {
                    // Saved (and answered) once this answer is read.
                    self.remember(&d.id);
                    self.snapshots.push((d.id.clone(), snapshot.clone()));
                    continue;
                }
            }
            let (ok, message) = match d.action {
                DirectiveAction::RemoveEtcdMember { id, .. } => {
                    cannot("etcd", format!("member {id} was not removed"))
                }
                DirectiveAction::DeleteNode { node } => {
                    cannot("API server", format!("node {node} was not deleted"))
                }
                DirectiveAction::DrainNode { node, .. } => {
                    cannot("API server", format!("node {node} was not drained"))
                }
                DirectiveAction::SetKubernetesVersion { version } => cannot(
                    "API server",
                    format!("kubeadm-config was not set to {version}"),
                ),
                DirectiveAction::ApplyManifests { addon, .. }
                | DirectiveAction::ApplyImageManifests { addon } => {
                    cannot("API server", format!("addon {addon} was not applied"))
                }
                DirectiveAction::RenewCertificates { .. } => {
                    cannot("kubeadm", "no certificate was renewed".to_owned())
                }
                DirectiveAction::UpgradeKubernetes { version, .. } => {
                    cannot("kubeadm", format!("nothing was upgraded to {version}"))
                }
                DirectiveAction::UpgradeEssentialAddons { version } => cannot(
                    "API server",
                    format!("kube-proxy and CoreDNS were not upgraded to {version}'s"),
                ),
                DirectiveAction::UncordonNode { node } => {
                    cannot("API server", format!("node {node} was not uncordoned"))
                }
                DirectiveAction::Reboot { .. } => {
                    cannot("init system", "the machine was not rebooted".to_owned())
                }
                DirectiveAction::SaveEtcdSnapshot { snapshot } => {
                    cannot("etcd", format!("snapshot {snapshot} was not saved"))
                }
                DirectiveAction::TakeInventory { snapshot } => cannot(
                    "API server",
                    format!("no inventory of the restore of {snapshot} was taken"),
                ),
                DirectiveAction::CreateBootstrapToken { token, .. } => {
                    if may_create_token(self.phase == AgentPhase::Running, self.role()) {
                        (
                            true,
                            format!(
                                "bootstrap token {} created (simulated machine; no kubeadm ran)",
                                token.id()
                            ),
                        )
                    } else {
                        (
                            false,
                            format!(
                                "this machine cannot create bootstrap tokens: it is not a running control-plane machine (phase {:?})",
                                self.phase
                            ),
                        )
                    }
                }
                DirectiveAction::Reset { .. } => {
                    if let Some(a) = self.assignment.take() {
                        self.retired = self.retired.max(a.generation);
                    }
                    self.phase = AgentPhase::Waiting;
                    self.bootstrap = None;
                    self.config.stop();
                    fleet.set_state(self.index, IN_POOL);
                    (
                        true,
                        "reset done (simulated machine); back in the pool".to_owned(),
                    )
                }
            };
            fleet.stats().directives += 1;
            self.remember(&d.id);
            self.results.push(DirectiveResult {
                id: d.id,
                ok,
                message,
            });
            soon = true;
        }
        if let Some(notice) = reply.assignment {
            soon |= self.on_assignment(fleet, notice);
        }
        soon
    }

    /// Remembers directive `id` as done, so a repeat is not redone.
    fn remember(&mut self, id: &str) {
        if self.done.len() == REMEMBERED_DIRECTIVES {
            self.done.pop_front();
        }
        self.done.push_back(id.to_owned());
    }

    /// Saves the snapshots asked in the last answer; true when there were
    /// any (their results go with the next heartbeat).
    async fn save_snapshots(&mut self, fleet: &Fleet) -> bool {
        let asked = std::mem::take(&mut self.snapshots);
        let any = !asked.is_empty();
        for (id, snapshot) in asked {
            let (ok, message) = match self.save_snapshot(fleet, &snapshot).await {
                Ok(m) => (true, m),
                Err(e) => (false, format!("snapshot {snapshot}: {e}")),
            };
            fleet.stats().directives += 1;
            self.results.push(DirectiveResult { id, ok, message });
        }
        any
    }

    /// Saves snapshot `name` as a control plane's agent does, of a made-up
    /// database of `--snapshot-bytes` (with the SHA-256 etcd appends): the
    /// grant, the snapshot sealed with the cluster's key, its upload and
    /// its report.
    async fn save_snapshot(
        &mut self,
        fleet: &Fleet,
        name: &str,
    ) -> Result<String, SimulatedSnapshotError> {
        use drover_common::snapshot::{Sealer, SnapshotKey};
        use sha2::{Digest, Sha256};
        let size = fleet.snapshot_bytes as usize;
        let api = self.api(fleet)?;
        let grant = api.snapshot_grant(name).await?;
        let key = SnapshotKey::from_base64(&grant.key)?;
        let mut plain: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let hash = Sha256::digest(&plain);
        plain.extend_from_slice(&hash);
        let (mut sealer, mut sealed) = Sealer::new(&key, &grant.cluster, &grant.cluster_uid, name);
        sealer.update(&plain, &mut sealed)?;
        let digest = sealer.finish(&mut sealed)?;
        drop(plain);
        let sealed_sha256 = hex::encode(Sha256::digest(&sealed));
        let file = std::env::temp_dir().join(format!(
            "drover-simulate-{}-{name}.drvsnap",
            std::process::id()
        ));
        std::fs::write(&file, &sealed).map_err(|source| SimulatedSnapshotError::Write {
            path: file.clone(),
            source,
        })?;
        let uploaded = api
            .upload_snapshot(
                &grant.upload,
                &file,
                sealed.len() as u64,
                &sealed_sha256,
                crate::snapshot::UPLOAD_TIMEOUT,
            )
            .await;
        let _ = std::fs::remove_file(&file);
        uploaded?;
        let saved = drover_common::wire::SnapshotSaved {
            size: digest.size,
            sha256: digest.sha256,
            sealed_size: sealed.len() as u64,
            sealed_sha256,
            revision: 1,
            etcd_version: "simulated".into(),
        };
        api.snapshot_saved(name, &saved).await?;
        Ok(format!(
            "simulated etcd snapshot {name} saved: {} bytes (sealed {})",
            saved.size, saved.sealed_size
        ))
    }

    /// Acts on an assignment notice by the protocol's rule; true when the
    /// machine has something new to report.
    fn on_assignment(&mut self, fleet: &Fleet, notice: AssignmentNotice) -> bool {
        let current = self.assignment.as_ref().map(|a| Current {
            generation: a.generation,
            stage: match self.phase {
                AgentPhase::Running => Stage::Applied,
                AgentPhase::Failed => Stage::Failed {
                    step: report::FETCH_CONFIG_STEP,
                    busy: false,
                },
                _ => Stage::Fetching {
                    fetching: self.config.wanted(),
                },
            },
        });
        match assignment::decide(current, self.retired, false, notice.generation) {
            Decision::Accept | Decision::Replace { .. } | Decision::StartOver { .. } => {
                self.assignment = Some(notice);
                self.phase = AgentPhase::Bootstrapping;
                self.bootstrap = Some(report::at_step(report::FETCH_CONFIG_STEP));
                self.config.want_now(Instant::now());
                fleet.set_state(self.index, ASSIGNED);
                true
            }
            // A heartbeat saying "assigned" resumes fetching after a 404.
            Decision::ResumeFetch => {
                self.config.resume(Instant::now());
                false
            }
            Decision::Ignore | Decision::Wait | Decision::RefuseNewer => false,
        }
    }

    /// Fetches and verifies the config bundle; true when the machine now
    /// has something new to report.
    async fn fetch_config(&mut self, fleet: &Fleet, stop: &mut Shutdown) -> Result<bool, Stopped> {
        let Some(want) = self.assignment.as_ref().map(|a| a.generation) else {
            self.config.stop();
            return Ok(false);
        };
        let sent = Instant::now();
        let answer = match self.api(fleet) {
            Ok(api) => tokio::select! {
                biased;
                () = stop.requested() => return Err(Stopped),
                r = api.config() => r,
            },
            Err(e) => Err(e),
        };
        let took = sent.elapsed();
        let now = Instant::now();
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                {
                    let mut s = fleet.stats();
                    s.config_failed += 1;
                    s.api_error("config", &e);
                }
                self.config.retry_after_backoff(now);
                return Ok(false);
            }
        };
        let (ca, uid) = (&self.ca.der, &self.uid);
        match self
            .config
            .on_answer(now, answer, want, |signed| config::verify(signed, ca, uid))
        {
            ConfigStep::Apply(bundle) => {
                {
                    let mut s = fleet.stats();
                    s.config_fetches += 1;
                    s.config.record(micros(took));
                }
                self.assignment = Some(AssignmentNotice {
                    cluster: bundle.cluster,
                    role: bundle.role,
                    generation: bundle.generation,
                });
                // As if kubeadm had run and succeeded.
                self.phase = AgentPhase::Running;
                self.bootstrap = Some(report::at_step(kubeadm_step_name(bundle.role)));
                Ok(true)
            }
            ConfigStep::Stale { got, want, .. } => {
                fleet.stats().error(
                    "config: stale bundle".into(),
                    format!("bundle generation {got} is older than the assignment's {want}"),
                );
                Ok(false)
            }
            ConfigStep::Invalid(why) => {
                {
                    let mut s = fleet.stats();
                    s.config_failed += 1;
                    s.error("config: invalid bundle".into(), why.clone());
                }
                self.phase = AgentPhase::Failed;
                self.bootstrap = Some(BootstrapReport {
                    step: report::FETCH_CONFIG_STEP.into(),
                    failure: Some(config::fetch_failure(why, drover_common::now())),
                });
                Ok(true)
            }
            ConfigStep::NotReady(_) => {
                fleet.stats().config_not_ready += 1;
                Ok(false)
            }
            ConfigStep::NotAssigned => Ok(false),
        }
    }
}
