//! `drover`: the coordinator (`drover serve`) and the operator CLI.

use drover::cli::{self, client};
use drover::http::server;
use drover::{config_file, migrate, serve, store, EXIT_CONFIG};
use drover_common::cli_docs::{self, Shell};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Drover runs Kubernetes clusters as a service.
#[derive(Debug, Parser)]
#[command(name = "drover", version, about)]
struct Cli {
    /// Log format: text or json.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: TopCommand,
}

/// The operator commands, and `drover store`, which works on a store
/// directly rather than through a coordinator.
#[derive(Debug, Subcommand)]
enum TopCommand {
    #[command(flatten)]
    Main(Command),
    /// Work on a stopped coordinator's store: `drover store migrate` moves
    /// it from SQLite to etcd.
    Store(migrate::StoreArgs),
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the coordinator.
    Serve(Box<ServeArgs>),
    /// Print a shell completion script (`drover completion bash >
    /// /usr/share/bash-completion/completions/drover`).
    Completion {
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Write the man pages (drover.1, drover-serve.1, ...) into DIR.
    #[command(hide = true)]
    Man { dir: PathBuf },
    #[command(flatten)]
    Operator(cli::Command),
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// A YAML file of settings: each key is one of these flags' names in
    /// camelCase (`dataDir`, `listen`, `heartbeatTimeout`). Flags and
    /// their environment variables win over the file. Unknown keys and bad
    /// values are refused naming the file, line and key (exit 64).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the effective configuration (file, flags, environment and
    /// defaults, each value's source noted, secrets redacted) and exit.
    #[arg(long)]
    print_config: bool,
    /// Directory for the embedded store, the encryption key, the audit log
    /// and the CA certificate.
    #[arg(long, env = "DROVER_DATA_DIR")]
    data_dir: PathBuf,
    /// Where objects are kept: `sqlite` (DATA_DIR/drover.db), `sqlite:DIR`
    /// (DIR/drover.db), or `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`, an
    /// etcd cluster several coordinator replicas share (keys under PREFIX,
    /// default /drover). The data directory keeps the encryption key and
    /// the audit log either way.
    #[arg(long, env = "DROVER_STORE", default_value = "sqlite")]
    store: store::Location,
    #[command(flatten)]
    etcd: serve::EtcdTlsArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7443")]
    listen: std::net::SocketAddr,
    /// URL agents use to reach this coordinator (repeatable); defaults to the listen address.
    #[arg(long = "advertise-url")]
    advertise_urls: Vec<String>,
    /// Extra DNS name or IP for the serving certificate (repeatable).
    #[arg(long = "san")]
    sans: Vec<String>,
    /// How often agents heartbeat.
    #[arg(long, default_value = "10s", value_parser = drover_common::api::parse_duration)]
    heartbeat_interval: std::time::Duration,
    /// Silence after which a machine counts as dead.
    #[arg(long, default_value = "40s", value_parser = drover_common::api::parse_duration)]
    heartbeat_timeout: std::time::Duration,
    /// Lifetime of machine client certificates.
    #[arg(long, default_value = "24h", value_parser = drover_common::api::parse_duration)]
    machine_cert_ttl: std::time::Duration,
    /// Lifetime of the kubeadm join tokens the coordinator mints.
    #[arg(long, default_value = "30m", value_parser = drover_common::api::parse_duration)]
    join_token_ttl: std::time::Duration,
    /// Where to write the client config at first start (default: $DROVER_CONFIG or ~/.config/drover/config.yaml).
    #[arg(long)]
    client_config: Option<PathBuf>,
    /// File of base64 keys that encrypt secrets at rest, the first encrypting
    /// (default: DATA_DIR/encryption.key, created at first start). The
    /// environment variable DROVER_ENCRYPTION_KEY overrides it.
    #[arg(long)]
    encryption_key_file: Option<PathBuf>,
    /// Registrations accepted per second from one source address, with a
    /// burst of five times as many (0 disables the limit).
    #[arg(long, default_value_t = 20)]
    registration_rate: u32,
    /// How long open connections may take to finish after SIGTERM.
    #[arg(long, default_value = "10s", value_parser = drover_common::api::parse_duration)]
    drain_timeout: std::time::Duration,
    /// Close client connections idle this long (default: keep them open).
    /// A kept connection holds about 15 KiB between heartbeats. With a
    /// timeout well below --heartbeat-interval (100ms, say), agents
    /// reconnect for every heartbeat, resuming their TLS session: under
    /// 4 KiB per machine, for about three times the CPU per heartbeat
    /// (see BENCHMARKS.md).
    #[arg(long, value_parser = drover_common::api::parse_duration)]
    idle_timeout: Option<std::time::Duration>,
    /// How long a request's body may take to arrive once the server waits
    /// for it; a body still missing then is answered 408 and the
    /// connection closed.
    #[arg(long, default_value = "30s", value_parser = drover_common::api::parse_duration)]
    request_body_timeout: std::time::Duration,
    /// The ports of the coordinator's own control-plane endpoints (pool
    /// clusters with `controlPlaneEndpoint: {managed: coordinator}`),
    /// `FIRST-LAST`. One port per such cluster, on the --listen address.
    #[arg(long, default_value = drover::domain::endpoint::DEFAULT_PORTS, value_parser = drover::domain::endpoint::parse_port_range)]
    endpoint_ports: (u16, u16),
    /// Connections without a client certificate (admin commands,
    /// registrations, anyone else) held at once, TLS handshakes counted
    /// apart; more are refused. Lowered to a quarter of the open-file
    /// limit if above it.
    #[arg(long, default_value_t = 4096)]
    max_unauthenticated_connections: u32,
    /// Of those, from one source address.
    #[arg(long, default_value_t = 256)]
    max_unauthenticated_connections_per_source: u32,
    /// Connections the managed control-plane endpoints hold at once, all
    /// endpoints together; more are closed at once. Lowered to an eighth of
    /// the open-file limit if above it (each holds two open files), so the
    /// API keeps its own.
    #[arg(long, default_value_t = drover_common::tcp_proxy::DEFAULT_TOTAL)]
    endpoint_max_connections: u32,
    /// Of those, from one source address (an IPv6 /64). Raise it when many
    /// Nodes reach an endpoint through one NAT address.
    #[arg(long, default_value_t = drover_common::tcp_proxy::DEFAULT_PER_SOURCE)]
    endpoint_max_connections_per_source: u32,
    /// Close a managed endpoint's connection after this long without a byte
    /// either way (live Kubernetes clients ping or watch well within it).
    /// One whose side has closed is closed after a minute of silence.
    #[arg(long, default_value = "1h", value_parser = drover_common::api::parse_duration)]
    endpoint_idle_timeout: std::time::Duration,
    /// With an etcd store: the leader's lease. A new leader takes over
    /// within this long after the old one dies.
    #[arg(long, default_value = "15s", value_parser = drover_common::api::parse_duration)]
    leader_lease: std::time::Duration,
}

fn main() -> ExitCode {
    let env = |name: &std::ffi::OsStr| std::env::var_os(name);
    let command = Cli::command();
    // `drover serve --config FILE`: the file's keys become flags first, each
    // value checked and its line named, before anything is bound.
    let expanded = match config_file::expand(std::env::args_os().collect(), &command, &env) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("drover serve: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let parsed = command
        .clone()
        .try_get_matches_from(&expanded.argv)
        .and_then(|m| Cli::from_arg_matches(&m).map(|c| (c, m)));
    let (cli, matches) = match parsed {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    if let TopCommand::Main(Command::Serve(args)) = &cli.command {
        if args.print_config {
            let serve = command
                .find_subcommand("serve")
                .expect("serve is a subcommand");
            let (_, serve_matches) = matches.subcommand().expect("serve was given");
            print!(
                "{}",
                config_file::render(serve, serve_matches, &expanded, &env)
            );
            return ExitCode::SUCCESS;
        }
    }
    init_tracing(
        &cli.log_format,
        matches!(cli.command, TopCommand::Main(Command::Serve(_))),
    );
    let command = match cli.command {
        TopCommand::Store(args) => return migrate::run(args),
        TopCommand::Main(Command::Completion { shell }) => {
            use std::io::Write;
            let script = cli_docs::completion(&mut Cli::command(), shell);
            // A closed pipe (`| head`) is the reader's choice, not a failure.
            let _ = std::io::stdout().write_all(&script);
            return ExitCode::SUCCESS;
        }
        TopCommand::Main(Command::Man { dir }) => {
            return match cli_docs::man_pages(Cli::command(), &dir) {
                Ok(pages) => {
                    println!("{} man pages written to {}", pages.len(), dir.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("drover man: cannot write into {}: {e}", dir.display());
                    ExitCode::FAILURE
                }
            };
        }
        TopCommand::Main(command) => command,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // Store writes, etcd round trips and certificate signing run on
        // blocking threads (`store::blocking`): enough for etcd calls to
        // overlap during a registration storm, bounded so a stalled store
        // cannot make the coordinator start hundreds of threads.
        .max_blocking_threads(64)
        .build()
        .expect("tokio runtime");
    match command {
        Command::Serve(args) => {
            let cfg = serve::ServeConfig {
                data_dir: args.data_dir,
                listen: args.listen,
                advertise_urls: args.advertise_urls,
                extra_sans: args.sans,
                heartbeat_interval: args.heartbeat_interval,
                heartbeat_timeout: args.heartbeat_timeout,
                machine_cert_ttl: args.machine_cert_ttl,
                join_token_ttl: args.join_token_ttl,
                client_config: args
                    .client_config
                    .unwrap_or_else(client::default_config_path),
                drain: args.drain_timeout,
                idle_timeout: args.idle_timeout,
                encryption_key_file: args.encryption_key_file,
                registration_rate: args.registration_rate,
                leader_lease: args.leader_lease,
                store: args.store,
                etcd_ca_file: args.etcd.etcd_ca_file,
                etcd_cert_file: args.etcd.etcd_cert_file,
                etcd_key_file: args.etcd.etcd_key_file,
                request_body_timeout: args.request_body_timeout,
                endpoint_ports: args.endpoint_ports,
                unauthenticated: server::UnauthenticatedCaps {
                    per_source: args.max_unauthenticated_connections_per_source,
                    total: args.max_unauthenticated_connections,
                },
                endpoint_proxy: drover_common::tcp_proxy::Limits {
                    per_source: args.endpoint_max_connections_per_source,
                    total: args.endpoint_max_connections,
                    idle_timeout: args.endpoint_idle_timeout,
                    ..Default::default()
                },
            };
            let cfg = match cfg.validate() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("drover serve: {e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            match runtime.block_on(serve::run(cfg)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "coordinator failed");
                    eprintln!("drover serve: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Completion { .. } | Command::Man { .. } => {
            unreachable!("answered before the runtime starts")
        }
        Command::Operator(command) => match runtime.block_on(cli::run(command)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(client::exit_code(&e))
            }
        },
    }
}

fn init_tracing(format: &str, server: bool) {
    let default = if server { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("DROVER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}
