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
mod view;

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
    /// Restoring the cluster's etcd before `kubeadm init`.
    RestoreEtcd,
}

enum Wake {
    Shutdown,
    WorkDone(CommandOutcome),
    Heartbeat,
    FetchConfig,
    Renew,
}

/// The registered agent: its state in parts, each about one thing. The
/// loop ([`Agent::run`]) waits on the timers of `coordinator` (the next
/// heartbeat), `config` (the next fetch), `renewal` (the next renewal) and
/// on the command `work` runs.
pub struct Agent {
    /// The local configuration: flags and the first boot's document.
    settings: Settings,
    /// The machine's identity and bootstrap progress, as saved.
    saved: Saved,
    /// The connection to the coordinator: the client, when to heartbeat
    /// next and how heartbeats go.
    coordinator: Connection,
    /// What the agent carries out: the command running, the directives
    /// waiting, a reset under way.
    work: Workload,
    /// When to fetch the config bundle next.
    config: ConfigFetch,
    /// The client certificate's renewal.
    renewal: Renewal,
    /// What the agent reads of this machine and the cluster it runs in.
    local: Local,
    /// What of those reports the coordinator last accepted, so each is sent
    /// when it changes (or now and then), not at every heartbeat.
    delivered: Delivered,
    /// What was logged, so that each warning or transition is logged once.
    logged: Logged,
}

/// The identity (key, certificate, coordinator URLs and CA) and the
/// bootstrap progress, in `state.json`: every transition is saved before
/// the action it announces.
struct Saved {
    store: StateStore,
    state: State,
    /// Whether the identity was registered by this run or read from an
    /// earlier one's state file.
    origin: Origin,
}

/// The connection to the coordinator.
struct Connection {
    /// The HTTPS client of the machine API, with the saved identity.
    api: std::sync::Arc<CoordinatorClient>,
    /// The heartbeat interval the coordinator last named.
    interval: Duration,
    next_heartbeat: Instant,
    /// How the last heartbeat went, so transitions are logged once.
    link: Link,
    /// Datagram heartbeats, while the coordinator offers them.
    datagram: Option<crate::protocol::datagram::DatagramLink>,
    /// The socket datagrams go from, made on first use.
    udp: Option<tokio::net::UdpSocket>,
    /// Whether datagrams get answered.
    fallback: crate::protocol::datagram::Fallback<Instant>,
}

/// What the agent carries out, one command at a time.
struct Workload {
    /// The command running in the background of the loop.
    running: Option<Work>,
    /// Directives accepted and not started yet.
    queue: VecDeque<Directive>,
    /// A Reset directive is being carried out.
    resetting: bool,
    /// The step to report while a reset or the pre-kubeadm commands run.
    activity: Option<&'static str>,
}

/// The client certificate's renewal.
struct Renewal {
    /// When to renew next.
    at: Instant,
    backoff: Backoff,
    /// The key and CSR of a renewal not yet done: retries reuse them, so a
    /// renewal whose answer was lost is a retry to the coordinator, not a
    /// second holder of the identity (which revokes it).
    key: Option<(String, String)>,
}

/// This machine and its cluster, as the agent reads them.
struct Local {
    /// The kubelet and API server health probes.
    prober: Prober,
    /// The cluster view (etcd members, Nodes) a running control plane
    /// reads through its local etcd member and API server.
    view: view::ViewReader,
    /// The address this machine advertises, once known.
    advertise: Option<IpAddr>,
    /// The machine's kubeadm version, once read; read again after each
    /// command the agent runs (an upgrade may have replaced kubeadm).
    kubeadm_version: Option<Option<String>>,
    /// The machine's first kubeadm certificate to expire, once read; read
    /// again after each command the agent runs (they write certificates).
    certificates: Option<Option<drover_common::api::CertificateExpiry>>,
    /// What the image pod network's loop last did.
    podnet: crate::podnet::Shared,
    /// The node problems mirrored on the Node (`--node-conditions`).
    node_conditions: Option<crate::node_conditions::NodeConditions>,
}

/// What the coordinator last accepted of the agent's reports.
#[derive(Default)]
struct Delivered {
    /// The etcd report last delivered, and when.
    etcd: Option<(drover_common::wire::EtcdReport, Instant)>,
    /// The Nodes report last delivered, and when.
    nodes: Option<(drover_common::wire::NodesReport, Instant)>,
    /// The kubeadm version the coordinator last accepted.
    kubeadm_version: Option<String>,
    /// The certificate expiry the coordinator last accepted.
    certificates: Option<drover_common::api::CertificateExpiry>,
}

/// What was logged once and is not logged again until it changes.
#[derive(Default)]
struct Logged {
    /// The last "not ready" reason of a config fetch.
    config_reason: Option<String>,
    /// The newer assignment generation already warned about.
    warned_generation: Option<u64>,
    /// Why the last list of coordinator URLs named by the coordinator was
    /// refused.
    refused_coordinators: Option<drover_common::wire::CoordinatorUrlsError>,
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
        let api = std::sync::Arc::new(mtls_client(&state)?);
        let mut prober = Prober::new(&settings.root, settings.kubelet_healthz_url.clone())
            .with_bounds(settings.eviction_hard.clone());
        if let Some(kmsg) = &settings.kmsg {
            prober = prober.with_kernel_log(kmsg);
        }
        if let Some(socket) = &settings.cri_socket {
            prober = prober.with_cri_socket(socket);
        }
        let now = Instant::now();
        let renew_at = Self::renewal_instant(&state);
        Ok(Self {
            local: Local {
                prober,
                node_conditions: settings
                    .node_conditions
                    .then(crate::node_conditions::NodeConditions::default),
                view: view::ViewReader::new(&settings.root),
                advertise: settings.advertise_address,
                kubeadm_version: None,
                certificates: None,
                podnet: Default::default(),
            },
            delivered: Delivered::default(),
            settings,
            coordinator: Connection {
                api,
                interval: match origin {
                    Origin::Registered { heartbeat_interval } => clamp_interval(heartbeat_interval),
                    Origin::Saved => DEFAULT_HEARTBEAT_INTERVAL,
                },
                next_heartbeat: now,
                link: Link::Unknown,
                datagram: None,
                udp: None,
                fallback: Default::default(),
            },
            saved: Saved {
                store,
                state,
                origin,
            },
            config: ConfigFetch::default(),
            work: Workload {
                running: None,
                queue: VecDeque::new(),
                resetting: false,
                activity: None,
            },
            renewal: Renewal {
                at: renew_at,
                backoff: Backoff::standard(),
                key: None,
            },
            logged: Logged::default(),
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
            self.local.podnet.clone(),
        ));
        let _podnet = AbortOnDrop(podnet);
        loop {
            self.start_queued_directives();
            let heartbeat_at = self.coordinator.next_heartbeat;
            let renew_at = self.renewal.at;
            let config_at = self
                .config
                .next_at()
                .filter(|_| self.work.running.is_none() && !self.work.resetting);
            let wake = {
                let work = self.work.running.as_mut().map(|w| &mut w.outcome);
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
                    let work = self.work.running.take().expect("work was running");
                    self.finish_work(work.kind, outcome);
                    self.local.kubeadm_version = None;
                    self.local.certificates = None;
                    Ok(())
                }
                Wake::Heartbeat => self.heartbeat(&mut shutdown).await,
                Wake::FetchConfig => self.fetch_config(&mut shutdown).await,
                Wake::Renew => self.renew(&mut shutdown).await,
            };
            if step.is_err() {
                if self.work.running.is_some() {
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
        if self.work.resetting {
            return AgentPhase::Resetting;
        }
        match self.saved.state.bootstrap.as_ref().map(|p| &p.step) {
            None => AgentPhase::Waiting,
            Some(BootstrapStep::Done) => AgentPhase::Running,
            Some(BootstrapStep::Failed { .. }) => AgentPhase::Failed,
            Some(_) => AgentPhase::Bootstrapping,
        }
    }

    fn bootstrap_report(&self) -> Option<BootstrapReport> {
        if let Some(activity) = self.work.activity {
            return Some(report::at_step(activity));
        }
        let progress = self.saved.state.bootstrap.as_ref()?;
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
        let done = self.saved.state.bootstrapped() && !self.work.resetting;
        let control_plane = self
            .saved
            .state
            .role()
            .is_some_and(|r| r.is_control_plane());
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
            clock: self.coordinator.api.clock_reading(),
        }
    }

    async fn advertise_address(&mut self) -> Option<IpAddr> {
        if self.local.advertise.is_none() {
            match advertise_address(&self.settings, &self.saved.state.coordinators).await {
                Ok(ip) => self.local.advertise = Some(ip),
                Err(e) => tracing::warn!(error = %e, "cannot determine the advertise address"),
            }
        }
        self.local.advertise
    }

    fn heartbeat_soon(&mut self) {
        self.coordinator.next_heartbeat = Instant::now();
    }

    fn persist(&self) {
        if let Err(e) = self.saved.store.save(&self.saved.state) {
            tracing::error!(error = %e, "cannot save the agent state");
        }
    }

    // ---------------------------------------------------------------- work

    fn start_work(&mut self, kind: WorkKind, spec: CommandSpec) {
        let outcome = Box::pin(async move { command::run(&spec, OUTPUT_TAIL_LINES).await });
        self.work.running = Some(Work { kind, outcome });
    }

    fn finish_work(&mut self, kind: WorkKind, outcome: CommandOutcome) {
        self.work.activity = None;
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
            WorkKind::RestoreEtcd => self.finish_restore(outcome),
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
