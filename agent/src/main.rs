//! `drover-agent`: the Drover machine agent.
//!
//! It registers the machine with the coordinator using the single-use ticket
//! of its bootstrap document, fetches its signed config bundle, runs
//! `kubeadm init` or `kubeadm join`, and reports heartbeats with health for
//! the machine's whole life.
//!
//! On first start the bootstrap document comes from `--bootstrap FILE`, or
//! else from the cloud-init NoCloud seed (`--nocloud-dir`, file `user-data`);
//! later starts resume from the saved state.
//!
//! Exit codes: 0 after SIGTERM/SIGINT, 1 on an unexpected error, 2 when the
//! coordinator refuses the registration for good (bad ticket, wrong CA pin),
//! 64 for bad flags or a missing, unreadable or invalid bootstrap document.
//!
//! `drover-agent simulate` instead runs a fleet of simulated machines in one
//! process against a real coordinator, to size it (see `simulate/`), and
//! `drover-agent load-balancer` a docker cluster's control-plane endpoint
//! (see `load_balancer.rs`).

mod address;
mod agent;
mod api;
mod backoff;
mod boot;
mod certificates;
mod command;
mod cri;
mod essential_addons;
mod etcd;
#[cfg(test)]
mod fake_https;
mod files;
mod health;
mod imds;
mod inventory;
mod kmsg;
mod kube;
mod load_balancer;
mod netfilter;
mod nocloud;
mod node_conditions;
mod podnet;
mod problems;
mod protocol;
mod reboot;
mod register;
mod restore;
mod settings;
mod shutdown;
mod simulate;
mod snapshot;
mod state;
#[cfg(test)]
mod test_etcd;
mod tls;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use drover_common::wire::BootstrapDocument;

use crate::agent::{Agent, Origin};
use crate::boot::read_bootstrap;
use crate::settings::{Customisation, Settings};
use crate::shutdown::Shutdown;
use crate::state::StateStore;

/// Exit code for a refused registration.
const EXIT_REFUSED: u8 = 2;
/// Exit code for bad flags or configuration (EX_USAGE).
const EXIT_USAGE: u8 = 64;

/// The Drover machine agent.
#[derive(Debug, Parser)]
#[command(
    name = "drover-agent",
    version,
    about,
    long_about = None,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// The bootstrap document (YAML or JSON) with the coordinator URLs, the CA
    /// pin and the registration ticket. Read only until the agent has
    /// registered and saved its state; without it the NoCloud seed is read.
    #[arg(long, value_name = "FILE")]
    bootstrap: Option<PathBuf>,

    /// The cloud-init NoCloud seed directory (the machine's own, not under
    /// --root). Its `user-data` holds the bootstrap document, bare or as the
    /// `drover_bootstrap` key of a #cloud-config, when --bootstrap is not
    /// given; `local-hostname` in its `meta-data` is the default --hostname.
    #[arg(long, value_name = "DIR", default_value = nocloud::DEFAULT_DIR)]
    nocloud_dir: PathBuf,
    /// The EC2 instance metadata endpoint, read when there is no bootstrap
    /// file and no NoCloud seed [default: $AWS_EC2_METADATA_SERVICE_ENDPOINT
    /// or http://169.254.169.254].
    #[arg(long, value_name = "URL")]
    imds_endpoint: Option<String>,

    /// The machine's root directory. kubeadm runs with `--rootfs` when it is
    /// not `/`.
    #[arg(long, value_name = "DIR", default_value = "/")]
    root: PathBuf,

    /// The kubeadm program.
    #[arg(long, value_name = "PATH", default_value = "kubeadm")]
    kubeadm: String,

    /// Where the agent keeps its state [default: <root>/var/lib/drover-agent].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,

    /// The address other machines reach this one on [default: the local
    /// address the OS uses to reach the coordinator].
    #[arg(long, value_name = "IP")]
    advertise_address: Option<IpAddr>,

    /// The port the API server listens on if this machine is control plane.
    #[arg(long, value_name = "N", default_value_t = 6443, value_parser = clap::value_parser!(u16).range(1..))]
    api_server_port: u16,

    /// The kubelet health URL.
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:10248/healthz", value_parser = parse_healthz_url)]
    kubelet_healthz_url: reqwest::Url,

    /// The bounds of the node problem checks, in the text of the kubelet's
    /// `--eviction-hard` (give this machine's kubelet's, so a condition
    /// turns when the kubelet starts to evict); signals left out keep the
    /// kubelet's defaults [default: memory.available<100Mi,
    /// nodefs.available<10%, nodefs.inodesFree<5%, imagefs.available<15%,
    /// imagefs.inodesFree<5%, pid.available<10%].
    #[arg(
        long,
        env = "DROVER_EVICTION_HARD",
        value_name = "SIGNAL<QUANTITY,...",
        default_value = "",
        hide_default_value = true
    )]
    eviction_hard: crate::problems::Bounds,

    /// How far this machine's clock may be from the coordinator's before
    /// the agent reports the problem ClockSkew (measured from the `Date`
    /// of the coordinator's answers).
    #[arg(long, env = "DROVER_MAX_CLOCK_OFFSET", value_name = "DURATION", default_value = "10s", value_parser = drover_common::units::parse_duration)]
    max_clock_offset: std::time::Duration,

    /// Mirror the node problems the kubelet does not report itself
    /// (ReadOnlyFilesystem, KernelDeadlock, DeviceError, ClockSkew) as
    /// conditions of this machine's Node, as node-problem-detector does.
    #[arg(long, env = "DROVER_NODE_CONDITIONS")]
    node_conditions: bool,

    /// Where the kernel's messages are read for the kernel message checks
    /// (hung tasks, device and file system errors) [default: the
    /// machine's /dev/kmsg, under --root].
    #[arg(long, env = "DROVER_KMSG", value_name = "PATH")]
    kmsg: Option<PathBuf>,

    /// The container runtime's CRI socket (containerd's is
    /// /run/containerd/containerd.sock): when given, every health report
    /// checks that the runtime answers CRI Version and Status within 5 s
    /// and says RuntimeReady, else reports ContainerRuntimeUnhealthy.
    #[arg(long, env = "DROVER_CRI_SOCKET", value_name = "PATH")]
    cri_socket: Option<PathBuf>,

    /// How the agent reboots its machine when the coordinator's remediation
    /// asks (a reboot directive), after cordoning its Node: a program and
    /// its arguments, split at spaces, run without a shell. An agent whose
    /// --root is not `/` refuses to run the default (it would reboot the
    /// host, not its machine).
    #[arg(
        long,
        env = "DROVER_REBOOT_COMMAND",
        value_name = "COMMAND",
        default_value = "systemctl reboot"
    )]
    reboot_command: String,

    /// Where the machine's boot ID is read, which says whether it rebooted
    /// [default: the kernel's, /proc/sys/kernel/random/boot_id, with the
    /// start time of PID 1, so a container machine restarted counts as
    /// rebooted too].
    #[arg(long, env = "DROVER_BOOT_ID_FILE", value_name = "PATH")]
    boot_id_file: Option<PathBuf>,

    /// The host name to report [default: `local-hostname` of the NoCloud
    /// meta-data, else the system host name].
    #[arg(long, value_name = "NAME")]
    hostname: Option<String>,

    /// How long a static Pod manifest is kept out of
    /// /etc/kubernetes/manifests to restart its Pod after a certificate
    /// renewal: the kubelet's fileCheckFrequency.
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = drover_common::units::parse_duration)]
    static_pod_restart_wait: std::time::Duration,

    /// Where the image's upgrade hooks are: `upgrade-kubeadm VERSION` and
    /// `upgrade-kubelet VERSION`, run around `kubeadm upgrade` during an
    /// in-place upgrade [default: <root>/usr/lib/drover].
    #[arg(long, value_name = "DIR")]
    hooks_dir: Option<PathBuf>,

    /// Refuse config bundles that carry the cluster's `files`,
    /// `preKubeadmCommands` or `postKubeadmCommands`, or whose cluster has
    /// `addons` (manifests whose Pods would run on this machine): the
    /// bootstrap fails naming this flag, and nothing is written or run. As
    /// a control plane, refuse to apply an addon added later. For machines
    /// whose owners do not want a coordinator (or a thief of its CA key) to
    /// run anything on them.
    #[arg(long)]
    refuse_machine_customisation: bool,

    /// The log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// Commands other than running the agent.
#[derive(Debug, Subcommand)]
enum Command {
    /// Run N simulated machines against a real coordinator (real HTTPS and
    /// mutual TLS) to size it, and print a summary.
    Simulate(simulate::SimulateArgs),
    /// Run a docker cluster's control-plane endpoint: a TCP load balancer
    /// over the API servers the coordinator lists in the backends file,
    /// each probed on `/readyz` every second.
    LoadBalancer(load_balancer::LoadBalancerArgs),
    /// Print a shell completion script (`drover-agent completion bash`).
    Completion {
        #[arg(value_enum)]
        shell: drover_common::cli_docs::Shell,
    },
    /// Write the man pages (drover-agent.1, ...) into DIR.
    #[command(hide = true)]
    Man { dir: PathBuf },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Why `--kubelet-healthz-url` was refused.
#[derive(Debug, thiserror::Error)]
enum HealthzUrlError {
    #[error("not a URL: {reason}")]
    NotAUrl { reason: String },
    #[error("the kubelet health endpoint is plain http://")]
    NotHttp,
    #[error("the URL has no host")]
    NoHost,
}

fn parse_healthz_url(s: &str) -> Result<reqwest::Url, HealthzUrlError> {
    let url = reqwest::Url::parse(s).map_err(|e| HealthzUrlError::NotAUrl {
        reason: e.to_string(),
    })?;
    if url.scheme() != "http" {
        return Err(HealthzUrlError::NotHttp);
    }
    if url.host_str().is_none() {
        return Err(HealthzUrlError::NoHost);
    }
    Ok(url)
}

/// How the agent ends, with its exit code.
enum Exit {
    Usage(anyhow::Error),
    Refused(anyhow::Error),
    Failure(anyhow::Error),
}

fn main() -> ExitCode {
    let mut cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(EXIT_USAGE),
            };
        }
    };
    if let Err(e) = init_logging(cli.log_format) {
        eprintln!("drover-agent: cannot set up logging: {e:#}");
        return ExitCode::from(EXIT_USAGE);
    }
    match cli.command.take() {
        Some(Command::Simulate(args)) => {
            return match simulate::main(args) {
                simulate::Exit::Success => ExitCode::SUCCESS,
                simulate::Exit::Failure => ExitCode::FAILURE,
                simulate::Exit::Usage => ExitCode::from(EXIT_USAGE),
            };
        }
        Some(Command::LoadBalancer(args)) => return load_balancer_main(args),
        Some(Command::Completion { shell }) => {
            use clap::CommandFactory;
            return drover_common::cli_docs::print_completion(Cli::command(), shell);
        }
        Some(Command::Man { dir }) => {
            use clap::CommandFactory;
            return drover_common::cli_docs::write_man_pages(Cli::command(), &dir);
        }
        None => {}
    }
    if std::process::id() == 1 {
        // The agent waits only for its own kubeadm children; daemons kubeadm
        // leaves behind are reparented to PID 1 and would stay zombies.
        tracing::warn!(
            "running as PID 1: exited orphans are not reaped; run the agent under an init \
             (systemd, tini, `docker run --init`), as the Drover node images do"
        );
    }
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Exit::Usage(e)) => {
            tracing::error!("{e:#}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(Exit::Refused(e)) => {
            tracing::error!("{e:#}");
            ExitCode::from(EXIT_REFUSED)
        }
        Err(Exit::Failure(e)) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `drover-agent load-balancer` to its end.
fn load_balancer_main(args: load_balancer::LoadBalancerArgs) -> ExitCode {
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match runtime.block_on(load_balancer::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The async runtime, or the exit code when it cannot start. One thread is
/// plenty: the agent mostly sleeps between heartbeats, and the load
/// balancer forwards a cluster's API connections.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            tracing::error!(error = %e, "cannot start the async runtime");
            ExitCode::FAILURE
        })
}

fn init_logging(format: LogFormat) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(|e| anyhow!(e))
}

async fn run(cli: Cli) -> Result<(), Exit> {
    let settings = resolve_settings(&cli).map_err(Exit::Usage)?;
    let store = StateStore::new(&settings.state_dir);
    let saved = store.load().map_err(|e| Exit::Failure(anyhow!(e)))?;
    // Read the bootstrap document before anything else, so a bad one is
    // reported at once.
    let doc = match (&saved, &cli.bootstrap) {
        (Some(_), Some(path)) => {
            tracing::info!(
                bootstrap = %path.display(),
                state = %store.path().display(),
                "already registered; ignoring the bootstrap document (its ticket is single-use)"
            );
            None
        }
        (Some(_), None) => None,
        (None, _) => Some(
            first_boot_document(
                &cli,
                store.path(),
                (!imds::disabled()).then(|| imds::endpoint(cli.imds_endpoint.as_deref())),
            )
            .await
            .map_err(Exit::Usage)?,
        ),
    };

    let (trigger, mut shutdown) = Shutdown::new();
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Exit::Failure(anyhow!("cannot handle SIGTERM: {e}")))?;
    tokio::spawn(async move {
        tokio::select! {
            _ = sigterm.recv() => tracing::info!("SIGTERM received; shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received; shutting down"),
        }
        trigger.trigger();
    });

    let (state, origin) = match (saved, doc) {
        (Some(state), _) => (state, Origin::Saved),
        (None, Some(boot)) => {
            match register::register(
                &boot.doc,
                boot.instance_id.as_deref(),
                &settings,
                &store,
                &mut shutdown,
            )
            .await
            {
                Ok(Some(r)) => (
                    r.state,
                    Origin::Registered {
                        heartbeat_interval: r.heartbeat_interval,
                    },
                ),
                Ok(None) => {
                    tracing::info!("shut down before registration finished");
                    return Ok(());
                }
                Err(e) if e.is_permanent_refusal() => return Err(Exit::Refused(anyhow!(e))),
                Err(e) => return Err(Exit::Failure(anyhow!(e))),
            }
        }
        (None, None) => unreachable!("checked above"),
    };
    let agent =
        Agent::new(settings, store, state, origin).map_err(|e| Exit::Failure(anyhow!(e)))?;
    agent
        .run(shutdown)
        .await
        .map_err(|e| Exit::Failure(anyhow!(e)))
}

/// The bootstrap document of a first start: `--bootstrap FILE`, else the
/// NoCloud seed's user data, else EC2 instance metadata (IMDSv2) unless
/// `AWS_EC2_METADATA_DISABLED=true`. The error names every place looked at.
async fn first_boot_document(
    cli: &Cli,
    state_file: &Path,
    imds_endpoint: Option<String>,
) -> anyhow::Result<FirstBoot> {
    if let Some(path) = &cli.bootstrap {
        return Ok(FirstBoot::from(read_bootstrap(path)?));
    }
    let user_data = nocloud::user_data_path(&cli.nocloud_dir);
    if let Some(doc) = nocloud::read_bootstrap(&cli.nocloud_dir)? {
        tracing::info!(source = %user_data.display(), "read the bootstrap document from the NoCloud seed");
        return Ok(FirstBoot::from(doc));
    }
    let imds = if let Some(endpoint) = imds_endpoint {
        match imds::read_bootstrap(&endpoint).await? {
            Some((doc, instance_id)) => {
                tracing::info!(source = %endpoint, %instance_id, "read the bootstrap document from instance metadata (IMDSv2)");
                return Ok(FirstBoot {
                    doc,
                    instance_id: Some(instance_id),
                });
            }
            None => format!("instance metadata user data at {endpoint} (none)"),
        }
    } else {
        format!("instance metadata (disabled by {})", imds::DISABLED_ENV)
    };
    bail!(
        "no bootstrap document: the agent has not registered yet and looked at \
         --bootstrap FILE (not given), saved state {} (none), \
         NoCloud user data {} (none), {imds}; pass --bootstrap FILE or provide user data",
        state_file.display(),
        user_data.display()
    )
}

/// What a first start registers with.
#[derive(Debug)]
struct FirstBoot {
    doc: BootstrapDocument,
    /// The cloud instance, when the document came from instance metadata.
    instance_id: Option<String>,
}

impl From<BootstrapDocument> for FirstBoot {
    fn from(doc: BootstrapDocument) -> Self {
        Self {
            doc,
            instance_id: None,
        }
    }
}

fn resolve_settings(cli: &Cli) -> anyhow::Result<Settings> {
    let root = cli
        .root
        .canonicalize()
        .with_context(|| format!("--root {}", cli.root.display()))?;
    if !root.is_dir() {
        bail!("--root {}: not a directory", cli.root.display());
    }
    let state_dir = match &cli.state_dir {
        Some(dir) if dir.is_relative() => std::env::current_dir()
            .context("cannot resolve --state-dir")?
            .join(dir),
        Some(dir) => dir.clone(),
        None => root.join("var/lib/drover-agent"),
    };
    let hostname = match &cli.hostname {
        Some(name) => name.clone(),
        None => match nocloud::local_hostname(&cli.nocloud_dir)? {
            Some(name) => name,
            None => nix::unistd::gethostname()
                .context("cannot read the host name; pass --hostname")?
                .into_string()
                .map_err(|_| anyhow!("the host name is not UTF-8; pass --hostname"))?,
        },
    };
    // The host name becomes the Kubernetes node name, which kubeadm also
    // lowercases; the coordinator accepts only DNS-1123 subdomains.
    let hostname = hostname.to_ascii_lowercase();
    if let Err(e) = drover_common::names::check_hostname(&hostname) {
        bail!(
            "--hostname: {e}; pass a host name of dot-separated lowercase letters, digits and '-'"
        );
    }
    let hooks_dir = cli
        .hooks_dir
        .clone()
        .unwrap_or_else(|| root.join("usr/lib/drover"));
    Ok(Settings {
        hooks_dir,
        customisation: if cli.refuse_machine_customisation {
            Customisation::Refuse
        } else {
            Customisation::Allow
        },
        root,
        kubeadm: cli.kubeadm.clone(),
        state_dir,
        advertise_address: cli.advertise_address,
        api_server_port: cli.api_server_port,
        kubelet_healthz_url: cli.kubelet_healthz_url.clone(),
        hostname,
        static_pod_restart_wait: cli.static_pod_restart_wait,
        reboot_command: crate::reboot::parse_command(&cli.reboot_command)
            .map_err(|e| anyhow::anyhow!("--reboot-command: {e}"))?,
        boot_id_file: cli.boot_id_file.clone(),
        kmsg: cli.kmsg.clone(),
        cri_socket: cli.cri_socket.clone(),
        node_conditions: cli.node_conditions,
        eviction_hard: crate::problems::Bounds {
            clock_offset: cli.max_clock_offset,
            ..cli.eviction_hard.clone()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_defaults_and_errors() {
        let cli = Cli::try_parse_from(["drover-agent"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.root, PathBuf::from("/"));
        let cli = Cli::try_parse_from([
            "drover-agent",
            "simulate",
            "--bootstrap",
            "b.yaml",
            "--machines",
            "7",
        ])
        .unwrap();
        match cli.command {
            Some(Command::Simulate(a)) => assert_eq!(a.machines, 7),
            other => panic!("not simulate: {other:?}"),
        }
        let cli =
            Cli::try_parse_from(["drover-agent", "load-balancer", "--listen", "0.0.0.0:7443"])
                .unwrap();
        match cli.command {
            Some(Command::LoadBalancer(a)) => {
                assert_eq!(a.listen.to_string(), "0.0.0.0:7443");
                assert_eq!(
                    a.config,
                    PathBuf::from(drover_common::wire::LOAD_BALANCER_CONFIG_PATH)
                );
            }
            other => panic!("not load-balancer: {other:?}"),
        }
        assert_eq!(cli.kubeadm, "kubeadm");
        assert_eq!(cli.api_server_port, 6443);
        assert_eq!(
            cli.kubelet_healthz_url.as_str(),
            "http://127.0.0.1:10248/healthz"
        );
        assert_eq!(cli.log_format, LogFormat::Text);
        let settings =
            resolve_settings(&Cli::try_parse_from(["drover-agent", "--hostname", "h"]).unwrap())
                .unwrap();
        assert_eq!(settings.state_dir, PathBuf::from("/var/lib/drover-agent"));
        assert_eq!(settings.kubelet_healthz_port(), 10248);

        for bad in [
            vec!["drover-agent", "--api-server-port", "0"],
            vec!["drover-agent", "--advertise-address", "not-an-ip"],
            vec![
                "drover-agent",
                "--kubelet-healthz-url",
                "https://127.0.0.1/healthz",
            ],
            vec!["drover-agent", "--log-format", "xml"],
            vec!["drover-agent", "--eviction-hard", "memory.free<1Gi"],
            vec!["drover-agent", "--frobnicate"],
            // The agent's flags do not mix with the simulator.
            vec![
                "drover-agent",
                "--root",
                "/",
                "simulate",
                "--bootstrap",
                "b",
                "--machines",
                "1",
            ],
            vec!["drover-agent", "simulate", "--machines", "1"],
        ] {
            assert!(Cli::try_parse_from(&bad).is_err(), "{bad:?}");
        }
        let cli = Cli::try_parse_from(["drover-agent", "--root", "/nonexistent/root"]).unwrap();
        let err = resolve_settings(&cli).unwrap_err();
        assert!(
            format!("{err:#}").contains("--root /nonexistent/root"),
            "{err:#}"
        );
    }

    const DOC: &str = "apiVersion: drover.dev/v1alpha1
kind: BootstrapConfig
coordinators:
- https://drover.example:7443
caPin: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
ticket: dt1.seed.ticket
";

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("drover-agent").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn nocloud_default_dir() {
        assert_eq!(
            cli(&[]).nocloud_dir,
            PathBuf::from("/var/lib/cloud/seed/nocloud")
        );
    }

    #[tokio::test]
    async fn first_boot_reads_the_nocloud_seed() {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("seed");
        let seed_arg = seed.to_str().unwrap();
        let state = dir.path().join("state/state.json");

        // Nothing anywhere: the error names every place looked at.
        let err = first_boot_document(&cli(&["--nocloud-dir", seed_arg]), &state, None)
            .await
            .unwrap_err();
        let err = format!("{err:#}");
        assert!(err.contains("--bootstrap FILE (not given)"), "{err}");
        assert!(err.contains(&state.display().to_string()), "{err}");
        assert!(
            err.contains(&seed.join("user-data").display().to_string()),
            "{err}"
        );

        // A bare document in the seed.
        std::fs::create_dir_all(&seed).unwrap();
        std::fs::write(seed.join("user-data"), DOC).unwrap();
        let doc = first_boot_document(&cli(&["--nocloud-dir", seed_arg]), &state, None)
            .await
            .unwrap();
        assert_eq!(doc.doc.ticket, "dt1.seed.ticket");

        // The same inside a #cloud-config.
        let indented: String = DOC.lines().map(|l| format!("  {l}\n")).collect();
        std::fs::write(
            seed.join("user-data"),
            format!("#cloud-config\nruncmd: []\ndrover_bootstrap: |\n{indented}"),
        )
        .unwrap();
        let doc = first_boot_document(&cli(&["--nocloud-dir", seed_arg]), &state, None)
            .await
            .unwrap();
        assert_eq!(doc.doc.ticket, "dt1.seed.ticket");

        // --bootstrap wins over the seed.
        let file = dir.path().join("bootstrap.yaml");
        std::fs::write(&file, DOC.replace("dt1.seed.ticket", "dt1.file.ticket")).unwrap();
        let doc = first_boot_document(
            &cli(&[
                "--nocloud-dir",
                seed_arg,
                "--bootstrap",
                file.to_str().unwrap(),
            ]),
            &state,
            None,
        )
        .await
        .unwrap();
        assert_eq!(doc.doc.ticket, "dt1.file.ticket");

        // A broken seed is reported with its path.
        std::fs::write(seed.join("user-data"), "#cloud-config\nruncmd: []\n").unwrap();
        let err = first_boot_document(&cli(&["--nocloud-dir", seed_arg]), &state, None)
            .await
            .unwrap_err();
        let err = format!("{err:#}");
        assert!(err.contains("invalid NoCloud user data"), "{err}");
        assert!(err.contains("drover_bootstrap"), "{err}");
    }

    #[test]
    fn hostname_from_nocloud_meta_data() {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().to_str().unwrap();
        std::fs::write(
            dir.path().join("meta-data"),
            "instance-id: iid-1\nlocal-hostname: seeded-1\n",
        )
        .unwrap();
        let settings = resolve_settings(&cli(&["--nocloud-dir", seed])).unwrap();
        assert_eq!(settings.hostname, "seeded-1");
        let settings =
            resolve_settings(&cli(&["--nocloud-dir", seed, "--hostname", "flag-1"])).unwrap();
        assert_eq!(settings.hostname, "flag-1");
        // Without meta-data, the system host name.
        std::fs::remove_file(dir.path().join("meta-data")).unwrap();
        let settings = resolve_settings(&cli(&["--nocloud-dir", seed])).unwrap();
        assert!(!settings.hostname.is_empty());
        assert_ne!(settings.hostname, "seeded-1");
        // Broken meta-data is an error naming the file, not silently ignored.
        std::fs::write(dir.path().join("meta-data"), "local-hostname: [x]\n").unwrap();
        let err = format!(
            "{:#}",
            resolve_settings(&cli(&["--nocloud-dir", seed])).unwrap_err()
        );
        assert!(err.contains("meta-data"), "{err}");
    }
}
