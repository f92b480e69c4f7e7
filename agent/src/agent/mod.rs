//! The agent's main loop after registration: heartbeats, bootstrap,
//! directives and certificate renewal, one file each (`heartbeat.rs`,
//! `bootstrap.rs`, `directives.rs`, `renewal.rs`); the rules they follow
//! come from the protocol core (`crate::protocol`), the IO is done here.
//!
//! Everything runs on one task. The loop sleeps until the next heartbeat, the
//! next config fetch, the certificate renewal time or the end of the running
//! command, so an idle agent uses no CPU. Every state transition is persisted
//! before the action it announces, so the agent can be stopped at any await
//! point and resume correctly.

use std::collections::VecDeque;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;

use drover_common::pin::CaPin;
use drover_common::wire::{AgentPhase, BootstrapReport, Directive};
use tokio::time::Instant;

use crate::address::advertise_address;
use crate::api::{ApiError, CoordinatorClient, Timeouts};
use crate::backoff::Backoff;
use crate::command::{self, CommandOutcome, CommandSpec, OUTPUT_TAIL_LINES};
use crate::health::{ApiServerPlan, ProbePlan, Prober};
use crate::protocol::config::ConfigFetch;
use crate::protocol::report::{self, kubeadm_step_name};
use crate::protocol::timing::{clamp_interval, DEFAULT_HEARTBEAT_INTERVAL};
use crate::settings::Settings;
use crate::shutdown::Shutdown;
use crate::state::{BootstrapStep, State, StateStore};
use crate::tls::{self, TlsError};

mod bootstrap;
mod directives;
mod heartbeat;
mod renewal;

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
    /// A call on the cluster for a directive: an etcd member removal, a
    /// Node deletion.
    ClusterCall { id: String },
    /// `kubeadm reset` before bootstrapping again (interrupted join, or a new
    /// assignment after a failure).
    ResetBeforeRetry,
    /// The bundle's `preKubeadmCommands`, one after another.
    PreCommands,
    /// The bundle's `postKubeadmCommands`, one after another.
    PostCommands,
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
    /// The local etcd member, on control-plane machines.
    etcd: crate::etcd::Etcd,
    /// The etcd report last delivered, and when.
    etcd_sent: Option<(drover_common::wire::EtcdReport, Instant)>,
    /// The local API server, on control-plane machines.
    kube: crate::kube::Kube,
    /// The Nodes report last delivered, and when.
    nodes_sent: Option<(drover_common::wire::NodesReport, Instant)>,
    /// The machine's kubeadm version, once read; read again after each
    /// command the agent runs (an upgrade may have replaced kubeadm).
    kubeadm_version: Option<Option<String>>,
    /// The kubeadm version the coordinator last accepted.
    kubeadm_sent: Option<String>,
    /// The certificate expiry the coordinator last accepted.
    certificates_sent: Option<drover_common::api::CertificateExpiry>,
    /// The machine's first kubeadm certificate to expire, once read; read
    /// again after each command the agent runs (they write certificates).
    certificates: Option<Option<drover_common::api::CertificateExpiry>>,
    advertise: Option<IpAddr>,
    interval: Duration,
    next_heartbeat: Instant,
    /// When to fetch the config bundle next.
    config: ConfigFetch,
    /// The last "not ready" reason logged, so each is logged once.
    config_reason: Option<String>,
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
    /// Datagram heartbeats, while the coordinator offers them.
    datagram: Option<crate::protocol::datagram::DatagramLink>,
    /// The socket datagrams go from, made on first use.
    udp: Option<tokio::net::UdpSocket>,
    /// Whether datagrams get answered.
    fallback: crate::protocol::datagram::Fallback<Instant>,
    /// The newer assignment generation already warned about.
    warned_generation: Option<u64>,
    /// Why the last list of coordinator URLs named by the coordinator was
    /// refused, so each refusal is logged once.
    refused_coordinators: Option<drover_common::wire::CoordinatorUrlsError>,
    origin: Origin,
    /// What the image pod network's loop last did.
    podnet: crate::podnet::Shared,
}

/// Stops a spawned task when the agent's loop ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
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
        let renew_at = Self::renewal_instant(&state);
        Ok(Self {
            etcd: crate::etcd::Etcd::new(&settings.root),
            etcd_sent: None,
            kube: crate::kube::Kube::new(&settings.root),
            nodes_sent: None,
            kubeadm_version: None,
            kubeadm_sent: None,
            certificates_sent: None,
            certificates: None,
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
            config: ConfigFetch::default(),
            datagram: None,
            udp: None,
            fallback: Default::default(),
            config_reason: None,
            work: None,
            queue: VecDeque::new(),
            resetting: false,
            activity: None,
            renew_at,
            renew_backoff: Backoff::standard(),
            renewal_key: None,
            link: Link::Unknown,
            warned_generation: None,
            refused_coordinators: None,
            podnet: Default::default(),
        })
    }

    /// Runs until shutdown is requested.
    pub async fn run(mut self, mut shutdown: Shutdown) -> Result<(), AgentError> {
        crate::certificates::recover_static_pods(
            &self.settings.root.join("etc/kubernetes/manifests"),
        );
        self.resume();
        // The image pod network's loop (podnet.rs), beside this one; it
        // does nothing while the machine has no image network.
        let podnet = tokio::spawn(crate::podnet::run(
            self.settings.root.clone(),
            self.podnet.clone(),
        ));
        let _podnet = AbortOnDrop(podnet);
        loop {
            self.start_queued_directives();
            let heartbeat_at = self.next_heartbeat;
            let renew_at = self.renew_at;
            let config_at = self
                .config
                .next_at()
                .filter(|_| self.work.is_none() && !self.resetting);
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
                    self.kubeadm_version = None;
                    self.certificates = None;
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
            return Some(report::at_step(activity));
        }
        let progress = self.state.bootstrap.as_ref()?;
        let step = match &progress.step {
            BootstrapStep::Assigned => report::FETCH_CONFIG_STEP,
            BootstrapStep::Resetting => report::RESET_STEP,
            BootstrapStep::FilesWritten => report::WRITE_FILES_STEP,
            BootstrapStep::PostKubeadmCommands => report::POST_COMMANDS_STEP,
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
        Some(report::at_step(step))
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

    // ---------------------------------------------------------------- work

    fn start_work(&mut self, kind: WorkKind, spec: CommandSpec) {
        let outcome = Box::pin(async move { command::run(&spec, OUTPUT_TAIL_LINES).await });
        self.work = Some(Work { kind, outcome });
    }

    fn finish_work(&mut self, kind: WorkKind, outcome: CommandOutcome) {
        self.activity = None;
        match kind {
            WorkKind::Bootstrap => self.finish_bootstrap(outcome),
            WorkKind::TokenCreate { id, token_id } => {
                self.finish_token_create(id, &token_id, outcome)
            }
            WorkKind::Reset { id } => self.finish_reset(id, outcome),
            WorkKind::ClusterCall { id } => {
                let message = outcome.output_tail.join("\n");
                self.finish_directive(id, outcome.success, message)
            }
            WorkKind::ResetBeforeRetry => self.finish_reset_before_retry(outcome),
            WorkKind::PreCommands => self.finish_pre_commands(outcome),
            WorkKind::PostCommands => self.finish_post_commands(outcome),
        }
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
