//! The agent's main loop after registration: heartbeats, bootstrap,
//! directives and certificate renewal.
//!
//! Everything runs on one task. The loop sleeps until the next heartbeat, the
//! next config fetch, the certificate renewal time or the end of the running
//! command, so an idle agent uses no CPU. Every state transition is persisted
//! before the action it announces, so the agent can be stopped at any await
//! point and resume correctly.

use std::collections::VecDeque;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use drover_common::bundle::{self, ConfigBundle, SignedBundle};
use drover_common::pin::CaPin;
use drover_common::wire::{
    AgentPhase, AssignmentNotice, BootstrapReport, CommandFailure, Directive, DirectiveAction,
    DirectiveResult, HeartbeatRequest, RenewRequest,
};
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::api::{ApiError, ConfigAnswer, CoordinatorClient, Timeouts};
use crate::backoff::Backoff;
use crate::command::{self, CommandOutcome, CommandSpec, OUTPUT_TAIL_LINES};
use crate::files;
use crate::health::{ApiServerPlan, ProbePlan, Prober};
use crate::register::advertise_address;
use crate::state::{
    decide_resume, kubeadm_step_name, BootstrapProgress, BootstrapStep, ResumeAction, ResumeFiles,
    State, StateStore,
};
use crate::tls::{self, TlsError};

/// The heartbeat interval used until the coordinator names one.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);

/// The longest wait for a config the coordinator says is not ready yet.
pub const MAX_CONFIG_RETRY: Duration = Duration::from_secs(30);

/// Settings resolved from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The machine's root directory; kubeadm gets `--rootfs` unless it is `/`.
    pub root: PathBuf,
    /// The kubeadm program.
    pub kubeadm: String,
    pub state_dir: PathBuf,
    /// The address to advertise; found by routing towards the coordinator
    /// when unset.
    pub advertise_address: Option<IpAddr>,
    pub api_server_port: u16,
    pub kubelet_healthz_url: reqwest::Url,
    pub hostname: String,
}

impl Settings {
    /// The port of the kubelet health URL.
    pub fn kubelet_healthz_port(&self) -> u16 {
        self.kubelet_healthz_url
            .port_or_known_default()
            .unwrap_or(10248)
    }
}

/// Tells the agent to stop.
#[derive(Debug)]
pub struct ShutdownTrigger(watch::Sender<bool>);

impl ShutdownTrigger {
    pub fn trigger(&self) {
        let _ = self.0.send(true);
    }
}

/// Resolves once shutdown was requested.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (ShutdownTrigger(tx), Shutdown(rx))
    }

    /// Waits until shutdown is requested (or the trigger is gone).
    pub async fn requested(&mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

/// Why the agent cannot run.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the saved coordinator CA does not match the pinned {pinned}; the state file was tampered with or corrupted")]
    SavedCaMismatch { pinned: CaPin },
    #[error("cannot set up TLS from the saved identity: {0}")]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Client(#[from] ApiError),
}

/// Where the identity the agent runs with came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Registered just now; the registration answer named the first
    /// heartbeat interval.
    Registered { heartbeat_interval: Duration },
    /// Read from the state file of an earlier run.
    Saved,
}

/// How the last heartbeat went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Unknown,
    Up,
    Down,
    Refused,
}

/// Shutdown was requested during an operation.
struct Stopped;

/// A command running in the background of the loop.
struct Work {
    kind: WorkKind,
    outcome: Pin<Box<dyn Future<Output = CommandOutcome> + Send>>,
}

#[derive(Debug, Clone)]
enum WorkKind {
    /// `kubeadm init` or `kubeadm join`.
    Bootstrap,
    /// `kubeadm token create` for a directive.
    TokenCreate { id: String, token_id: String },
    /// `kubeadm reset` for a directive.
    Reset { id: String },
    /// `kubeadm reset` before bootstrapping again (interrupted join, or a new
    /// assignment after a failure).
    ResetBeforeRetry,
}

/// Fetching the config bundle.
struct ConfigFetch {
    wanted: bool,
    next_at: Instant,
    backoff: Backoff,
    /// The last "not ready" reason logged, so each is logged once.
    last_reason: Option<String>,
}

/// Why a fetched bundle is not used.
enum BundleRefusal {
    /// Older than the assignment; the coordinator may catch up.
    Stale { got: u64, want: u64 },
    /// Unusable: bad signature, wrong machine, malformed.
    Invalid(String),
}

enum Wake {
    Shutdown,
    WorkDone(CommandOutcome),
    Heartbeat,
    FetchConfig,
    Renew,
}

/// The registered agent.
pub struct Agent {
    settings: Settings,
    store: StateStore,
    state: State,
    api: CoordinatorClient,
    prober: Prober,
    advertise: Option<IpAddr>,
    interval: Duration,
    next_heartbeat: Instant,
    config: ConfigFetch,
    work: Option<Work>,
    queue: VecDeque<Directive>,
    /// A Reset directive is being carried out.
    resetting: bool,
    /// The step to report while a reset runs.
    activity: Option<&'static str>,
    renew_at: Instant,
    renew_backoff: Backoff,
    /// The key and CSR of a renewal not yet done: retries reuse them, so a
    /// renewal whose answer was lost is a retry to the coordinator, not a
    /// second holder of the identity (which revokes it).
    renewal_key: Option<(String, String)>,
    /// How the last heartbeat went, so transitions are logged once.
    link: Link,
    /// The newer assignment generation already warned about.
    warned_generation: Option<u64>,
    origin: Origin,
}

impl Agent {
    /// Sets up the agent from its saved identity.
    pub fn new(
        settings: Settings,
        store: StateStore,
        state: State,
        origin: Origin,
    ) -> Result<Self, AgentError> {
        if CaPin::from_cert_pem(&state.coordinator_ca_pem)
            .ok()
            .as_ref()
            != Some(&state.ca_pin)
        {
            return Err(AgentError::SavedCaMismatch {
                pinned: state.ca_pin.clone(),
            });
        }
        let api = mtls_client(&state)?;
        let prober = Prober::new(&settings.root, settings.kubelet_healthz_url.clone());
        let now = Instant::now();
        let renew_at = renewal_instant(&state);
        Ok(Self {
            advertise: settings.advertise_address,
            settings,
            store,
            state,
            api,
            prober,
            interval: match origin {
                Origin::Registered { heartbeat_interval } => clamp_interval(heartbeat_interval),
                Origin::Saved => DEFAULT_HEARTBEAT_INTERVAL,
            },
            origin,
            next_heartbeat: now,
            config: ConfigFetch {
                wanted: false,
                next_at: now,
                backoff: Backoff::standard(),
                last_reason: None,
            },
            work: None,
            queue: VecDeque::new(),
            resetting: false,
            activity: None,
            renew_at,
            renew_backoff: Backoff::standard(),
            renewal_key: None,
            link: Link::Unknown,
            warned_generation: None,
        })
    }

    /// Runs until shutdown is requested.
    pub async fn run(mut self, mut shutdown: Shutdown) -> Result<(), AgentError> {
        self.resume();
        loop {
            self.start_queued_directives();
            let heartbeat_at = self.next_heartbeat;
            let renew_at = self.renew_at;
            let config_at = (self.config.wanted && self.work.is_none() && !self.resetting)
                .then_some(self.config.next_at);
            let wake = {
                let work = self.work.as_mut().map(|w| &mut w.outcome);
                tokio::select! {
                    biased;
                    () = shutdown.requested() => Wake::Shutdown,
                    outcome = maybe(work) => Wake::WorkDone(outcome),
                    () = tokio::time::sleep_until(heartbeat_at) => Wake::Heartbeat,
                    () = maybe_sleep_until(config_at) => Wake::FetchConfig,
                    () = tokio::time::sleep_until(renew_at) => Wake::Renew,
                }
            };
            let step = match wake {
                Wake::Shutdown => Err(Stopped),
                Wake::WorkDone(outcome) => {
                    let work = self.work.take().expect("work was running");
                    self.finish_work(work.kind, outcome);
                    Ok(())
                }
                Wake::Heartbeat => self.heartbeat(&mut shutdown).await,
                Wake::FetchConfig => self.fetch_config(&mut shutdown).await,
                Wake::Renew => self.renew(&mut shutdown).await,
            };
            if step.is_err() {
                if self.work.is_some() {
                    tracing::info!(
                        "shutting down while a command runs; it keeps running and a restarted agent resumes from the saved progress"
                    );
                }
                self.persist();
                tracing::info!("shut down");
                return Ok(());
            }
        }
    }

    // ------------------------------------------------------------ reporting

    fn phase(&self) -> AgentPhase {
        if self.resetting {
            return AgentPhase::Resetting;
        }
        match self.state.bootstrap.as_ref().map(|p| &p.step) {
            None => AgentPhase::Waiting,
            Some(BootstrapStep::Done) => AgentPhase::Running,
            Some(BootstrapStep::Failed { .. }) => AgentPhase::Failed,
            Some(_) => AgentPhase::Bootstrapping,
        }
    }

    fn bootstrap_report(&self) -> Option<BootstrapReport> {
        if let Some(activity) = self.activity {
            return Some(BootstrapReport {
                step: activity.to_owned(),
                failure: None,
            });
        }
        let progress = self.state.bootstrap.as_ref()?;
        let step = match &progress.step {
            BootstrapStep::Assigned => "fetch-config",
            BootstrapStep::Resetting => "kubeadm-reset",
            BootstrapStep::FilesWritten => "write-files",
            BootstrapStep::KubeadmStarted | BootstrapStep::Done => {
                kubeadm_step_name(progress.assignment.role)
            }
            BootstrapStep::Failed { step, failure } => {
                return Some(BootstrapReport {
                    step: step.clone(),
                    failure: Some(failure.clone()),
                })
            }
        };
        Some(BootstrapReport {
            step: step.to_owned(),
            failure: None,
        })
    }

    async fn probe_plan(&mut self) -> ProbePlan {
        let done = self.state.bootstrapped() && !self.resetting;
        let control_plane = self.state.role().is_some_and(|r| r.is_control_plane());
        let api_server = if done && control_plane {
            match self.advertise_address().await {
                Some(ip) => {
                    ApiServerPlan::Probe(SocketAddr::new(ip, self.settings.api_server_port))
                }
                None => ApiServerPlan::Unknown("cannot determine the advertise address".into()),
            }
        } else {
            ApiServerPlan::None
        };
        ProbePlan {
            kubelet: done,
            api_server,
        }
    }

    async fn advertise_address(&mut self) -> Option<IpAddr> {
        if self.advertise.is_none() {
            match advertise_address(&self.settings, &self.state.coordinators).await {
                Ok(ip) => self.advertise = Some(ip),
                Err(e) => tracing::warn!(error = %e, "cannot determine the advertise address"),
            }
        }
        self.advertise
    }

    fn heartbeat_soon(&mut self) {
        self.next_heartbeat = Instant::now();
    }

    fn persist(&self) {
        if let Err(e) = self.store.save(&self.state) {
            tracing::error!(error = %e, "cannot save the agent state");
        }
    }

    // ------------------------------------------------------------ resuming

    fn resume(&mut self) {
        let files = ResumeFiles::probe(&self.settings.root);
        let action = decide_resume(&self.state, files);
        let message = match self.origin {
            Origin::Registered { .. } => "agent started; waiting for an assignment",
            Origin::Saved => "resuming from the saved state",
        };
        tracing::info!(
            machine = %self.state.machine_name,
            uid = %self.state.machine_uid,
            state = %self.store.path().display(),
            assignment = ?self.state.bootstrap.as_ref().map(|p| &p.assignment),
            ?action,
            "{message}"
        );
        match action {
            ResumeAction::Idle | ResumeAction::Running | ResumeAction::StayFailed => {}
            ResumeAction::FetchConfig => {
                self.set_step(BootstrapStep::Assigned);
                self.want_config_now();
            }
            ResumeAction::MarkDone => {
                tracing::info!("kubeadm had finished before the restart; bootstrap is done");
                self.set_step(BootstrapStep::Done);
            }
            ResumeAction::InitInterrupted => {
                let command = self.bootstrap_command().display();
                let admin = self.settings.root.join("etc/kubernetes/admin.conf");
                self.fail_bootstrap(
                    "kubeadm-init",
                    CommandFailure {
                        command,
                        exit_code: None,
                        output_tail: vec![format!(
                            "kubeadm init was interrupted (the agent stopped while it ran) and {} does not exist; \
                             the machine needs `kubeadm reset` before it can bootstrap again, \
                             and the agent never runs kubeadm init twice",
                            admin.display()
                        )],
                        at: drover_common::now(),
                    },
                );
            }
            ResumeAction::ResetAndRetry => {
                tracing::info!(
                    "kubeadm join or reset was interrupted; resetting and bootstrapping again"
                );
                self.reset_before_retry();
            }
        }
    }

    /// Records the `Resetting` step, then runs `kubeadm reset -f`; the
    /// bundle is fetched again once it succeeds.
    fn reset_before_retry(&mut self) {
        self.set_step(BootstrapStep::Resetting);
        let spec = command::kubeadm_reset(&self.settings.kubeadm, &self.settings.root);
        tracing::info!(command = %spec.display(), "resetting before bootstrapping again");
        self.start_work(WorkKind::ResetBeforeRetry, spec);
    }

    fn set_step(&mut self, step: BootstrapStep) {
        if let Some(p) = self.state.bootstrap.as_mut() {
            p.step = step;
            self.persist();
        }
    }

    fn bootstrap_command(&self) -> CommandSpec {
        let (role, path) = self
            .state
            .bootstrap
            .as_ref()
            .map_or((drover_common::api::MachineRole::Worker, None), |p| {
                (p.assignment.role, p.kubeadm_config_path.clone())
            });
        command::kubeadm_bootstrap(
            &self.settings.kubeadm,
            role,
            path.as_deref().unwrap_or("/etc/drover/kubeadm.yaml"),
            &self.settings.root,
        )
    }

    // ----------------------------------------------------------- heartbeat

    async fn heartbeat(&mut self, shutdown: &mut Shutdown) -> Result<(), Stopped> {
        self.next_heartbeat = Instant::now() + self.interval;
        let plan = self.probe_plan().await;
        let health = tokio::select! {
            h = self.prober.report(&plan) => h,
            () = shutdown.requested() => return Err(Stopped),
        };
        let sent = self.state.pending_results.len();
        let request = HeartbeatRequest {
            phase: self.phase(),
            applied_generation: self.state.applied_generation(),
            health,
            bootstrap: self.bootstrap_report(),
            directive_results: self.state.pending_results.clone(),
        };
        let answer = tokio::select! {
            r = self.api.heartbeat(
                &request,
                self.interval.clamp(Duration::from_secs(2), Duration::from_secs(20)),
            ) => r,
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
                if sent > 0 {
                    self.state.pending_results.drain(..sent);
                    self.persist();
                }
                self.interval =
                    clamp_interval(Duration::from_secs(reply.heartbeat_interval_seconds));
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
        if self.resetting || self.queue.iter().any(is_reset) {
            return;
        }
        let work_idle = self.work.is_none();
        let Some(progress) = self.state.bootstrap.as_mut() else {
            if notice.generation > self.state.retired_generation {
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
            return;
        };
        if notice.generation == progress.assignment.generation {
            // A heartbeat saying "assigned" resumes fetching after a 404.
            if progress.step == BootstrapStep::Assigned && !self.config.wanted {
                self.want_config_now();
            }
            return;
        }
        if notice.generation < progress.assignment.generation {
            return;
        }
        match &progress.step {
            BootstrapStep::Assigned | BootstrapStep::Resetting => {
                tracing::info!(
                    generation = notice.generation,
                    "the assignment changed before the config was fetched"
                );
                let fetch = progress.step == BootstrapStep::Assigned;
                progress.assignment = notice;
                self.persist();
                if fetch {
                    self.want_config_now();
                }
                self.heartbeat_soon();
            }
            BootstrapStep::Failed { step, .. } if work_idle => {
                let needs_reset = step != "fetch-config" && step != "write-files";
                tracing::info!(
                    generation = notice.generation,
                    reset_first = needs_reset,
                    "a newer assignment after a failed bootstrap; starting over"
                );
                progress.assignment = notice;
                if needs_reset {
                    self.reset_before_retry();
                } else {
                    self.set_step(BootstrapStep::Assigned);
                    self.want_config_now();
                }
                self.heartbeat_soon();
            }
            // A command is still running; the next heartbeat looks again.
            BootstrapStep::Failed { .. } => {}
            BootstrapStep::FilesWritten | BootstrapStep::KubeadmStarted | BootstrapStep::Done => {
                if self.warned_generation != Some(notice.generation) {
                    tracing::warn!(
                        applied = progress.assignment.generation,
                        offered = notice.generation,
                        "already bootstrapped an assignment; a newer one needs a reset first, ignoring it"
                    );
                    self.warned_generation = Some(notice.generation);
                }
            }
        }
    }

    // ----------------------------------------------------------- bootstrap

    fn want_config_now(&mut self) {
        self.config.wanted = true;
        self.config.next_at = Instant::now();
        self.config.backoff.reset();
    }

    async fn fetch_config(&mut self, shutdown: &mut Shutdown) -> Result<(), Stopped> {
        let want = match &self.state.bootstrap {
            Some(p) if p.step == BootstrapStep::Assigned => p.assignment.generation,
            _ => {
                self.config.wanted = false;
                return Ok(());
            }
        };
        let answer = tokio::select! {
            r = self.api.config() => r,
            () = shutdown.requested() => return Err(Stopped),
        };
        let now = Instant::now();
        match answer {
            Ok(ConfigAnswer::Bundle(signed)) => match self.check_bundle(&signed, want) {
                Ok(bundle) => {
                    self.config.wanted = false;
                    self.config.last_reason = None;
                    self.apply_bundle(bundle);
                }
                Err(BundleRefusal::Stale { got, want }) => {
                    let delay = self.config.backoff.next_delay();
                    tracing::warn!(
                        bundle_generation = got,
                        assignment_generation = want,
                        retry_in_ms = delay.as_millis() as u64,
                        "refusing a config bundle older than the assignment"
                    );
                    self.config.next_at = now + delay;
                }
                Err(BundleRefusal::Invalid(why)) => {
                    self.config.wanted = false;
                    self.fail_bootstrap(
                        "fetch-config",
                        CommandFailure {
                            command: format!("GET {}", crate::api::CONFIG_PATH),
                            exit_code: None,
                            output_tail: vec![why],
                            at: drover_common::now(),
                        },
                    );
                }
            },
            Ok(ConfigAnswer::NotReady(not_ready)) => {
                if self.config.last_reason.as_deref() != Some(not_ready.reason.as_str()) {
                    tracing::info!(
                        reason = %not_ready.reason,
                        retry_after_s = not_ready.retry_after_seconds,
                        "the config is not ready yet; waiting"
                    );
                    self.config.last_reason = Some(not_ready.reason);
                }
                self.config.backoff.reset();
                self.config.next_at = now + config_retry_delay(not_ready.retry_after_seconds);
            }
            Ok(ConfigAnswer::NotAssigned) => {
                tracing::info!(
                    "the coordinator says this machine is not assigned; waiting for a heartbeat that says it is"
                );
                self.config.wanted = false;
            }
            Err(e) if e.is_unauthorized() => {
                tracing::warn!(error = %e, "the coordinator no longer accepts this machine's certificate");
                self.config.next_at = now + self.interval;
            }
            Err(e) => {
                let delay = self.config.backoff.next_delay();
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot fetch the config");
                self.config.next_at = now + delay;
            }
        }
        Ok(())
    }

    fn check_bundle(
        &self,
        signed: &SignedBundle,
        want: u64,
    ) -> Result<ConfigBundle, BundleRefusal> {
        let ca =
            drover_common::pki::first_cert_der(&self.state.coordinator_ca_pem).map_err(|e| {
                BundleRefusal::Invalid(format!("the saved coordinator CA is unreadable: {e}"))
            })?;
        let bundle = bundle::verify(signed, &ca, &self.state.machine_uid)
            .map_err(|e| BundleRefusal::Invalid(format!("config bundle refused: {e}")))?;
        if bundle.generation < want {
            return Err(BundleRefusal::Stale {
                got: bundle.generation,
                want,
            });
        }
        // kubeadm runs with the config the agent allows, nothing else.
        if bundle.kubeadm_config_path != files::KUBEADM_CONFIG_PATH {
            return Err(BundleRefusal::Invalid(format!(
                "config bundle refused: kubeadm config path {:?} is not {}",
                bundle.kubeadm_config_path,
                files::KUBEADM_CONFIG_PATH
            )));
        }
        Ok(bundle)
    }

    fn apply_bundle(&mut self, bundle: ConfigBundle) {
        let root = self.settings.root.clone();
        {
            let progress = self.state.bootstrap.as_mut().expect("assigned");
            if progress.assignment.role != bundle.role
                || progress.assignment.cluster != bundle.cluster
            {
                tracing::warn!(
                    assigned = ?progress.assignment,
                    bundle_cluster = %bundle.cluster,
                    bundle_role = %bundle.role,
                    "the signed bundle differs from the assignment notice; following the bundle"
                );
            }
            progress.assignment = AssignmentNotice {
                cluster: bundle.cluster.clone(),
                role: bundle.role,
                generation: bundle.generation.max(progress.assignment.generation),
            };
        }
        tracing::info!(
            cluster = %bundle.cluster,
            role = %bundle.role,
            generation = bundle.generation,
            kubernetes_version = %bundle.kubernetes_version,
            files = bundle.files.len(),
            "writing the config bundle"
        );
        let written = match files::write_bundle_files(&root, &bundle.files) {
            Ok(w) => w,
            Err(e) => {
                self.fail_bootstrap(
                    "write-files",
                    CommandFailure {
                        command: format!(
                            "write {} bundle files under {}",
                            bundle.files.len(),
                            root.display()
                        ),
                        exit_code: None,
                        output_tail: vec![e.to_string()],
                        at: drover_common::now(),
                    },
                );
                return;
            }
        };
        let progress = self.state.bootstrap.as_mut().expect("assigned");
        for path in written {
            if !progress.written_files.contains(&path) {
                progress.written_files.push(path);
            }
        }
        progress.kubeadm_config_path = Some(bundle.kubeadm_config_path.clone());
        progress.step = BootstrapStep::FilesWritten;
        self.persist();

        let spec = self.bootstrap_command();
        let step = kubeadm_step_name(bundle.role);
        // The record that kubeadm may have run must exist before it runs.
        self.state.bootstrap.as_mut().expect("assigned").step = BootstrapStep::KubeadmStarted;
        if let Err(e) = self.store.save(&self.state) {
            self.fail_bootstrap(
                step,
                CommandFailure {
                    command: spec.display(),
                    exit_code: None,
                    output_tail: vec![format!(
                        "not started, because the agent cannot record that it started: {e}"
                    )],
                    at: drover_common::now(),
                },
            );
            return;
        }
        tracing::info!(command = %spec.display(), "running kubeadm");
        self.start_work(WorkKind::Bootstrap, spec);
        self.heartbeat_soon();
    }

    fn fail_bootstrap(&mut self, step: &str, failure: CommandFailure) {
        tracing::error!(
            step,
            command = %failure.command,
            exit_code = ?failure.exit_code,
            output_tail = %failure.output_tail.join("\n"),
            "bootstrap failed; waiting for the coordinator to decide"
        );
        if let Some(p) = self.state.bootstrap.as_mut() {
            p.step = BootstrapStep::Failed {
                step: step.to_owned(),
                failure,
            };
        }
        self.persist();
        self.heartbeat_soon();
    }

    // ---------------------------------------------------------- directives

    fn accept_directives(&mut self, directives: Vec<Directive>) {
        for directive in directives {
            let running = matches!(
                self.work.as_ref().map(|w| &w.kind),
                Some(WorkKind::TokenCreate { id, .. } | WorkKind::Reset { id }) if *id == directive.id
            );
            if running
                || self.state.directive_completed(&directive.id)
                || self.queue.iter().any(|d| d.id == directive.id)
            {
                continue;
            }
            tracing::info!(id = %directive.id, action = %describe(&directive.action), "directive received");
            self.queue.push_back(directive);
        }
    }

    fn start_queued_directives(&mut self) {
        while self.work.is_none() {
            let Some(directive) = self.queue.pop_front() else {
                return;
            };
            match directive.action {
                DirectiveAction::CreateBootstrapToken { token, ttl_seconds } => {
                    let control_plane = self.state.role().is_some_and(|r| r.is_control_plane());
                    if !(self.state.bootstrapped() && control_plane) {
                        self.finish_directive(
                            directive.id,
                            false,
                            format!(
                                "this machine cannot create bootstrap tokens: it is not a running control-plane machine (phase {:?}, role {})",
                                self.phase(),
                                self.state.role().map_or("none".to_owned(), |r| r.to_string())
                            ),
                        );
                        continue;
                    }
                    let spec = command::kubeadm_token_create(
                        &self.settings.kubeadm,
                        &token,
                        ttl_seconds,
                        &self.settings.root,
                    );
                    tracing::info!(command = %spec.display(), "creating a bootstrap token");
                    self.start_work(
                        WorkKind::TokenCreate {
                            id: directive.id,
                            token_id: token.id().to_owned(),
                        },
                        spec,
                    );
                }
                DirectiveAction::Reset { reason } => {
                    tracing::info!(reason = %reason, "resetting this machine at the coordinator's request");
                    self.resetting = true;
                    self.activity = Some("kubeadm-reset");
                    self.config.wanted = false;
                    let spec = command::kubeadm_reset(&self.settings.kubeadm, &self.settings.root);
                    self.start_work(WorkKind::Reset { id: directive.id }, spec);
                    self.heartbeat_soon();
                }
            }
        }
    }

    fn finish_directive(&mut self, id: String, ok: bool, message: String) {
        if ok {
            tracing::info!(id = %id, message = %message, "directive done");
        } else {
            tracing::warn!(id = %id, message = %message, "directive failed");
        }
        self.state
            .complete_directive(DirectiveResult { id, ok, message });
        self.persist();
        self.heartbeat_soon();
    }

    // ---------------------------------------------------------------- work

    fn start_work(&mut self, kind: WorkKind, spec: CommandSpec) {
        let outcome = Box::pin(async move { command::run(&spec, OUTPUT_TAIL_LINES).await });
        self.work = Some(Work { kind, outcome });
    }

    fn finish_work(&mut self, kind: WorkKind, outcome: CommandOutcome) {
        self.activity = None;
        match kind {
            WorkKind::Bootstrap => {
                let Some(role) = self.state.role() else {
                    return;
                };
                if outcome.success {
                    tracing::info!(command = %outcome.command, "kubeadm succeeded; the machine is running");
                    self.set_step(BootstrapStep::Done);
                    self.heartbeat_soon();
                } else {
                    self.fail_bootstrap(kubeadm_step_name(role), outcome.to_failure());
                }
            }
            WorkKind::TokenCreate { id, token_id } => {
                let message = if outcome.success {
                    format!("bootstrap token {token_id} created")
                } else {
                    outcome.summary()
                };
                self.finish_directive(id, outcome.success, message);
            }
            WorkKind::Reset { id } => {
                self.resetting = false;
                if outcome.success {
                    let written = self
                        .state
                        .bootstrap
                        .as_ref()
                        .map(|p| {
                            let mut w = p.written_files.clone();
                            w.extend(p.kubeadm_config_path.clone());
                            w
                        })
                        .unwrap_or_default();
                    let problems = files::remove_bundle_files(&self.settings.root, &written);
                    if let Some(p) = self.state.bootstrap.take() {
                        self.state.retired_generation =
                            self.state.retired_generation.max(p.assignment.generation);
                    }
                    self.config.wanted = false;
                    self.warned_generation = None;
                    let mut message =
                        "kubeadm reset done; the machine is back in its pool".to_owned();
                    if !problems.is_empty() {
                        message.push_str(&format!("; could not remove: {}", problems.join("; ")));
                    }
                    self.finish_directive(id, true, message);
                } else {
                    let failure = outcome.to_failure();
                    if let Some(p) = self.state.bootstrap.as_mut() {
                        p.step = BootstrapStep::Failed {
                            step: "kubeadm-reset".into(),
                            failure,
                        };
                    }
                    self.finish_directive(id, false, outcome.summary());
                }
            }
            WorkKind::ResetBeforeRetry => {
                if outcome.success {
                    tracing::info!("kubeadm reset done; bootstrapping again");
                    self.set_step(BootstrapStep::Assigned);
                    self.want_config_now();
                    self.heartbeat_soon();
                } else {
                    self.fail_bootstrap("kubeadm-reset", outcome.to_failure());
                }
            }
        }
    }

    // ------------------------------------------------------------- renewal

    async fn renew(&mut self, shutdown: &mut Shutdown) -> Result<(), Stopped> {
        let retry = |agent: &mut Self| {
            let delay = agent.renew_backoff.next_delay();
            agent.renew_at = Instant::now() + delay;
        };
        let (key_pem, csr_pem) = match &self.renewal_key {
            Some(pair) => pair.clone(),
            None => match drover_common::pki::generate_key_and_csr(&self.state.machine_name) {
                Ok(pair) => {
                    self.renewal_key = Some(pair.clone());
                    pair
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot create a key for certificate renewal");
                    retry(self);
                    return Ok(());
                }
            },
        };
        let request = RenewRequest { csr_pem };
        let answer = tokio::select! {
            r = self.api.renew(&request) => r,
            () = shutdown.requested() => return Err(Stopped),
        };
        let renewed = match answer {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, not_after = %rfc3339(self.state.certificate_not_after), "certificate renewal failed; retrying");
                retry(self);
                return Ok(());
            }
        };
        let mut next = self.state.clone();
        next.key_pem = key_pem;
        next.certificate_pem = renewed.certificate_pem;
        next.certificate_not_after = renewed.not_after;
        let client = match mtls_client(&next) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "the renewed certificate is unusable; retrying");
                retry(self);
                return Ok(());
            }
        };
        // The new key and certificate are saved before they are used, so a
        // crash cannot leave the agent with a key the coordinator never saw.
        if let Err(e) = self.store.save(&next) {
            tracing::error!(error = %e, "cannot save the renewed certificate; keeping the old one");
            retry(self);
            return Ok(());
        }
        self.state = next;
        self.api = client;
        self.renewal_key = None;
        self.renew_backoff.reset();
        self.renew_at = renewal_instant(&self.state);
        tracing::info!(not_after = %rfc3339(self.state.certificate_not_after), "client certificate renewed");
        Ok(())
    }
}

fn is_reset(d: &Directive) -> bool {
    matches!(d.action, DirectiveAction::Reset { .. })
}

fn describe(action: &DirectiveAction) -> String {
    match action {
        DirectiveAction::CreateBootstrapToken { token, ttl_seconds } => {
            format!("create bootstrap token {} (ttl {ttl_seconds}s)", token.id())
        }
        DirectiveAction::Reset { reason } => format!("reset ({reason})"),
    }
}

fn mtls_client(state: &State) -> Result<CoordinatorClient, AgentError> {
    let config = tls::mtls_config(
        &state.coordinator_ca_pem,
        &state.certificate_pem,
        &state.key_pem,
    )?;
    Ok(CoordinatorClient::new(
        &state.coordinators,
        config,
        Timeouts::default(),
    )?)
}

async fn maybe<F: Future + Unpin>(f: Option<&mut F>) -> F::Output {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

async fn maybe_sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A timestamp in RFC 3339 form, for logs.
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}

/// Keeps a coordinator-given heartbeat interval within sane bounds.
pub fn clamp_interval(d: Duration) -> Duration {
    d.clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

/// How long to wait after a 409 that asked for `retry_after_seconds`.
pub fn config_retry_delay(retry_after_seconds: u64) -> Duration {
    Duration::from_secs(retry_after_seconds).clamp(Duration::from_secs(1), MAX_CONFIG_RETRY)
}

/// When to renew a certificate: after two thirds of its lifetime.
pub fn renewal_time(not_before: OffsetDateTime, not_after: OffsetDateTime) -> OffsetDateTime {
    not_before + (not_after - not_before) * 2 / 3
}

/// The renewal time of the saved certificate as a timer instant.
fn renewal_instant(state: &State) -> Instant {
    let not_before = crate::tls::certs_from_pem(&state.certificate_pem, "the client certificate")
        .ok()
        .and_then(|certs| {
            x509_parser::parse_x509_certificate(&certs[0])
                .ok()
                .map(|(_, c)| c.validity().not_before.to_datetime())
        });
    let not_after = state.certificate_not_after;
    // Without a readable start, assume a 24 h certificate.
    let not_before = not_before.unwrap_or(not_after - time::Duration::hours(24));
    let at = renewal_time(not_before, not_after);
    let wait = at - OffsetDateTime::now_utc();
    Instant::now() + Duration::try_from(wait).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_after_two_thirds() {
        let nb = OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
        let na = nb + time::Duration::hours(24);
        assert_eq!(renewal_time(nb, na), nb + time::Duration::hours(16));
    }

    #[test]
    fn retry_delays_are_bounded() {
        assert_eq!(config_retry_delay(0), Duration::from_secs(1));
        assert_eq!(config_retry_delay(7), Duration::from_secs(7));
        assert_eq!(config_retry_delay(600), Duration::from_secs(30));
        assert_eq!(clamp_interval(Duration::ZERO), Duration::from_secs(1));
        assert_eq!(
            clamp_interval(Duration::from_secs(10)),
            Duration::from_secs(10)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_wakes_waiters_without_real_time() {
        let (trigger, mut shutdown) = Shutdown::new();
        let waiter = tokio::spawn(async move {
            tokio::select! {
                () = shutdown.requested() => "stopped",
                () = tokio::time::sleep(Duration::from_secs(3600)) => "timed out",
            }
        });
        tokio::task::yield_now().await;
        trigger.trigger();
        assert_eq!(waiter.await.unwrap(), "stopped");
        // With the trigger gone, waiting returns at once too.
        let (trigger, mut shutdown) = Shutdown::new();
        drop(trigger);
        shutdown.requested().await;
    }
}
