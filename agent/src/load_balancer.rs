//! `drover-agent load-balancer`: the control-plane endpoint of a docker
//! cluster. The docker provider runs it in a container of its own on the
//! cluster's network, created before the first control plane (its address
//! goes into the API server certificate and every kubeconfig), and writes
//! the backends into [`LOAD_BALANCER_CONFIG_PATH`] whenever a control plane
//! joins or leaves, and signals it (SIGHUP) to re-read at once. Every
//! second, and on that signal, this mode re-reads the file and probes
//! each backend's `/readyz` over TLS with the cluster CA; new connections go
//! round robin to the backends that answered (the forwarding itself is
//! `drover_common::tcp_proxy`, shared with the coordinator's managed
//! endpoints). A backend the coordinator removed, or one that stops
//! answering, gets no new connection from the next second on.
//!
//! Connections are capped per source and in total (half of the open-file
//! limit at most: the container does nothing else), and idle or half-closed
//! ones time out, as the coordinator's managed endpoints do.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use drover_common::tcp_proxy::{accept_loop, Admission, Backends, Limits};
use drover_common::wire::{LoadBalancerConfig, LOAD_BALANCER_CONFIG_PATH};

/// How often the backends are re-read and probed.
const PERIOD: Duration = Duration::from_secs(1);
/// How long one `/readyz` probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(800);

/// Flags of `drover-agent load-balancer`.
#[derive(Debug, clap::Args)]
pub struct LoadBalancerArgs {
    /// Where to accept API server connections.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:6443")]
    pub listen: SocketAddr,
    /// The backends file the coordinator writes (JSON: `caPem`, `backends`).
    #[arg(long, value_name = "FILE", default_value = LOAD_BALANCER_CONFIG_PATH)]
    pub config: PathBuf,
    /// Connections held at once; more are closed at once. Lowered to a
    /// quarter of the open-file limit if above it (each holds two files).
    #[arg(long, default_value_t = drover_common::tcp_proxy::DEFAULT_TOTAL)]
    pub max_connections: u32,
    /// Of those, from one source address (an IPv6 /64).
    #[arg(long, default_value_t = drover_common::tcp_proxy::DEFAULT_PER_SOURCE)]
    pub max_connections_per_source: u32,
    /// Close a connection after this long without a byte either way.
    #[arg(long, default_value = "1h", value_parser = drover_common::api::parse_duration)]
    pub idle_timeout: Duration,
}

/// Runs the load balancer until SIGTERM or SIGINT.
pub async fn run(args: LoadBalancerArgs) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut hup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(listen = %args.listen, config = %args.config.display(), "load balancer listening");
    let open_files = match drover_common::process::raise_open_files_limit() {
        Ok(limit) => Some(limit),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open-file limit");
            None
        }
    };
    let admission = Arc::new(Admission::new(
        Limits {
            per_source: args.max_connections_per_source.max(1),
            total: args.max_connections.max(1),
            idle_timeout: args.idle_timeout.max(Duration::from_secs(1)),
            ..Limits::default()
        },
        open_files.map(|limit| limit / 2),
    ));
    let limits = admission.limits();
    tracing::info!(
        total = limits.total,
        per_source = limits.per_source,
        idle_timeout = ?limits.idle_timeout,
        "load balancer connection limits"
    );
    let backends: Backends = Arc::new(RwLock::new(vec![]));
    let accept = tokio::spawn(accept_loop(
        listener,
        args.listen.to_string(),
        backends.clone(),
        admission,
    ));
    let mut state = Probing::default();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            // The coordinator signals after it wrote the file.
            _ = hup.recv() => {}
            _ = tick.tick() => {}
        }
        let listed = state.read(&args.config);
        // A backend no longer listed gets no new connection from now on,
        // before the others are probed.
        backends
            .write()
            .expect("backends lock")
            .retain(|b| listed.contains(b));
        let healthy = state.probe(&listed).await;
        let mut current = backends.write().expect("backends lock");
        if *current != healthy {
            tracing::info!(backends = ?healthy, "load balancer backends changed");
            *current = healthy;
        }
    }
    accept.abort();
    tracing::info!("load balancer stopped");
    Ok(())
}

/// What the last refresh read, so an unchanged file is not parsed again
/// and the probe client is rebuilt only when the CA changes.
#[derive(Default)]
struct Probing {
    raw: Option<Vec<u8>>,
    config: Option<LoadBalancerConfig>,
    client: Option<reqwest::Client>,
}

impl Probing {
    /// Re-reads the backends file and returns the backends it lists. A
    /// missing file means no backend yet; a file that cannot be parsed
    /// keeps the last good one, saying why.
    fn read(&mut self, path: &std::path::Path) -> Vec<SocketAddr> {
        match std::fs::read(path) {
            Ok(raw) if self.raw.as_ref() != Some(&raw) => {
                match serde_json::from_slice::<LoadBalancerConfig>(&raw) {
                    Ok(config) => {
                        let ca_changed =
                            self.config.as_ref().map(|c| &c.ca_pem) != Some(&config.ca_pem);
                        if ca_changed {
                            self.client = match probe_client(&config.ca_pem) {
                                Ok(c) => Some(c),
                                Err(e) => {
                                    tracing::warn!(file = %path.display(), error = %e, "cannot build the /readyz client from the cluster CA in the backends file");
                                    None
                                }
                            };
                        }
                        tracing::info!(file = %path.display(), backends = ?config.backends, "backends file read");
                        self.config = Some(config);
                    }
                    Err(e) => {
                        tracing::warn!(file = %path.display(), error = %e, "the backends file is not valid; keeping the last good one")
                    }
                }
                self.raw = Some(raw);
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot read the backends file")
            }
        }
        let Some(config) = &self.config else {
            return vec![];
        };
        config
            .backends
            .iter()
            .filter_map(|b| match b.parse() {
                Ok(a) => Some(a),
                Err(_) => {
                    tracing::warn!(backend = %b, "a backend is not ip:port; skipped");
                    None
                }
            })
            .collect()
    }

    /// The backends among `candidates` whose `/readyz` answers 200.
    async fn probe(&self, candidates: &[SocketAddr]) -> Vec<SocketAddr> {
        let Some(client) = &self.client else {
            return vec![];
        };
        drover_common::tcp_proxy::ready_backends(client, candidates, "backend").await
    }
}

fn probe_client(ca_pem: &str) -> anyhow::Result<reqwest::Client> {
    let config = crate::tls::trust_only_config(ca_pem, "the cluster CA")?;
    Ok(crate::tls::local_client(config, PROBE_TIMEOUT)?)
}
