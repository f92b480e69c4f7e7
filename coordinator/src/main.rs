//! `drover`: the coordinator (`drover serve`) and the operator CLI.

use drover::cli::{self, client};
use drover::{config_file, migrate, serve, EXIT_CONFIG};
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
    /// it from SQLite to etcd; `drover store restore` makes a data
    /// directory from a backup.
    Store(migrate::StoreArgs),
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the coordinator.
    Serve(Box<serve::ServeArgs>),
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
            return cli_docs::print_completion(Cli::command(), shell);
        }
        TopCommand::Main(Command::Man { dir }) => {
            return cli_docs::write_man_pages(Cli::command(), &dir);
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
            let cfg = args.into_config();
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
