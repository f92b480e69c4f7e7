//! A strict stand-in for `kubeadm` v1.31.2, for end-to-end tests where the
//! real kubeadm cannot run.
//!
//! It accepts only real kubeadm command lines and `kubeadm.k8s.io/v1beta4`
//! configs, checks what real kubeadm (and Drover's design) requires, writes
//! the files real kubeadm writes under `--rootfs`, and runs a stand-in API
//! server and kubelet as detached daemons (the same binary re-executed with
//! the hidden subcommands `__standin-apiserver` and `__standin-kubelet`).
//! Every invocation is appended to `<root>/var/log/kubeadm-invocations.jsonl`
//! as `{"argv": [program, args...], "exit": N}` (argv[0] is the program as
//! invoked, so the subcommand is argv[1]).

mod addons;
mod apiserver;
mod certs;
mod cmd_certs;
mod cmd_init;
mod cmd_join;
mod cmd_reset;
mod cmd_token;
mod cmd_upgrade;
mod daemon;
mod etcd;
mod hooks;
mod kconfig;
mod kubelet;
mod net;
mod node;
mod patches;
mod store;
mod util;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Result};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::util::{PhaseError, Root};

/// The version this stand-in claims to be unless its image says otherwise
/// (see [`util::kubeadm_version`]).
pub const KUBEADM_VERSION: &str = "v1.31.2";
const GIT_COMMIT: &str = "5864a4677267e6adeae276ad85882a8714d69d9d";
const BUILD_DATE: &str = "2024-10-22T20:33:04Z";
const GO_VERSION: &str = "go1.22.8";

/// The invocation log, relative to the root.
pub const INVOCATION_LOG: &str = "/var/log/kubeadm-invocations.jsonl";

#[derive(Parser, Debug)]
#[command(
    name = "kubeadm",
    about = "kubeadm: easily bootstrap a secure Kubernetes cluster (Drover's strict stand-in for v1.31.2)",
    disable_version_flag = true,
    arg_required_else_help = true
)]
struct Cli {
    /// The path to the 'real' host root filesystem. This will cause kubeadm to chroot into the provided path.
    #[arg(long, global = true, value_name = "DIR")]
    rootfs: Option<PathBuf>,
    /// number for the log level verbosity
    #[arg(long = "v", global = true, value_name = "N")]
    verbosity: Option<u32>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the version of kubeadm
    Version(VersionArgs),
    /// Run this command in order to set up the Kubernetes control plane
    Init(InitArgs),
    /// Run this on any machine you wish to join an existing cluster
    Join(JoinArgs),
    /// Performs a best effort revert of changes made to this host by 'kubeadm init' or 'kubeadm join'
    Reset(ResetArgs),
    /// Manage bootstrap tokens
    Token(TokenArgs),
    /// Manage configuration for a kubeadm cluster
    Config(ConfigArgs),
    /// Upgrade your cluster smoothly to a newer version with this command
    Upgrade(UpgradeArgs),
    /// Commands related to handling kubernetes certificates
    Certs(CertsArgs),
    #[command(name = "__standin-apiserver", hide = true)]
    StandinApiserver(StandinApiserverArgs),
    #[command(name = "__standin-kubelet", hide = true)]
    StandinKubelet,
    #[command(name = "__standin-etcd", hide = true)]
    StandinEtcd,
}

#[derive(Args, Debug)]
struct VersionArgs {
    /// Output format; available options are 'yaml', 'json' and 'short'
    #[arg(short = 'o', long = "output", value_name = "FORMAT")]
    output: Option<String>,
}

/// The flags `init` and `join` share.
#[derive(Args, Debug)]
struct NodeArgs {
    /// Path to a kubeadm configuration file.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// A list of checks whose errors will be shown as warnings. Example: 'IsPrivilegedUser,Swap'. Value 'all' ignores errors from all checks.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    ignore_preflight_errors: Vec<String>,
    /// List of phases to be skipped
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    skip_phases: Vec<String>,
    /// Don't apply any changes; just output what would be done.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    dry_run: Option<bool>,
    /// Specify the node name.
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
}

impl NodeArgs {
    /// The options of `init` or `join`, reading the config at `config`.
    fn opts(self, config: PathBuf) -> cmd_init::NodeOpts {
        cmd_init::NodeOpts {
            config,
            ignore_preflight_errors: self.ignore_preflight_errors,
            skip_phases: self.skip_phases,
            dry_run: self.dry_run == Some(true),
            node_name: self.node_name,
        }
    }
}

#[derive(Args, Debug)]
struct InitArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Upload control-plane certificates to the kubeadm-certs Secret.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    upload_certs: Option<bool>,
    /// Don't print the key used to encrypt the control-plane certificates.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    skip_certificate_key_print: Option<bool>,
    /// Skip printing of the default bootstrap token generated by 'kubeadm init'.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    skip_token_print: Option<bool>,
    // Flags real kubeadm has that cannot be mixed with --config.
    #[arg(long, hide = true)]
    apiserver_advertise_address: Option<String>,
    #[arg(long, hide = true)]
    apiserver_bind_port: Option<String>,
    #[arg(long, hide = true, value_delimiter = ',')]
    apiserver_cert_extra_sans: Vec<String>,
    #[arg(long, hide = true)]
    cert_dir: Option<String>,
    #[arg(long, hide = true)]
    certificate_key: Option<String>,
    #[arg(long, hide = true)]
    control_plane_endpoint: Option<String>,
    #[arg(long, hide = true)]
    cri_socket: Option<String>,
    #[arg(long, hide = true)]
    feature_gates: Option<String>,
    #[arg(long, hide = true)]
    image_repository: Option<String>,
    #[arg(long, hide = true)]
    kubernetes_version: Option<String>,
    #[arg(long, hide = true)]
    patches: Option<String>,
    #[arg(long, hide = true)]
    pod_network_cidr: Option<String>,
    #[arg(long, hide = true)]
    service_cidr: Option<String>,
    #[arg(long, hide = true)]
    service_dns_domain: Option<String>,
    #[arg(long, hide = true)]
    token: Option<String>,
    #[arg(long, hide = true)]
    token_ttl: Option<String>,
}

#[derive(Args, Debug)]
struct JoinArgs {
    /// The API server endpoint (refused with --config: the config names it).
    #[arg(value_name = "api-server-endpoint")]
    endpoint: Option<String>,
    #[command(flatten)]
    node: NodeArgs,
    // Flags real kubeadm has that cannot be mixed with --config.
    #[arg(long, hide = true)]
    apiserver_advertise_address: Option<String>,
    #[arg(long, hide = true)]
    apiserver_bind_port: Option<String>,
    #[arg(long, hide = true)]
    certificate_key: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    control_plane: Option<bool>,
    #[arg(long, hide = true)]
    cri_socket: Option<String>,
    #[arg(long, hide = true)]
    discovery_file: Option<String>,
    #[arg(long, hide = true)]
    discovery_token: Option<String>,
    #[arg(long, hide = true, value_delimiter = ',')]
    discovery_token_ca_cert_hash: Vec<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    discovery_token_unsafe_skip_ca_verification: Option<bool>,
    #[arg(long, hide = true)]
    patches: Option<String>,
    #[arg(long, hide = true)]
    tls_bootstrap_token: Option<String>,
    #[arg(long, hide = true)]
    token: Option<String>,
}

#[derive(Args, Debug)]
struct ResetArgs {
    /// Reset the node without prompting for confirmation.
    #[arg(short = 'f', long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    force: Option<bool>,
    /// The path to the directory where the certificates are stored.
    #[arg(long, value_name = "DIR")]
    cert_dir: Option<String>,
    /// Cleanup the "/etc/kubernetes/tmp" directory
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    cleanup_tmp_dir: Option<bool>,
    /// Path to the CRI socket to connect.
    #[arg(long, value_name = "SOCKET")]
    cri_socket: Option<String>,
    #[command(flatten)]
    cluster: ClusterFlags,
    /// List of phases to be skipped
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    skip_phases: Vec<String>,
    /// Path to a kubeadm configuration file (ResetConfiguration; refused by the stand-in).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
}

/// The flags `reset` and `upgrade` share.
#[derive(Args, Debug)]
struct ClusterFlags {
    /// Don't apply any changes; just output what would be done.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    dry_run: Option<bool>,
    /// A list of checks whose errors will be shown as warnings.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    ignore_preflight_errors: Vec<String>,
    /// The kubeconfig file to use when talking to the cluster.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct TokenArgs {
    /// The kubeconfig file to use when talking to the cluster.
    #[arg(long, global = true, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Whether to enable dry-run mode or not
    #[arg(long, global = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    dry_run: Option<bool>,
    #[command(subcommand)]
    cmd: TokenCmd,
}

#[derive(Subcommand, Debug)]
enum TokenCmd {
    /// Create bootstrap tokens on the server
    Create(TokenCreateArgs),
    /// Generate and print a bootstrap token, but do not create it on the server
    Generate,
}

#[derive(Args, Debug)]
struct TokenCreateArgs {
    /// The token to create (generated when absent).
    #[arg(value_name = "TOKEN")]
    token: Option<String>,
    /// The duration before the token is automatically deleted (e.g. 1s, 2m, 3h). If set to '0', the token will never expire
    #[arg(long, value_name = "DURATION")]
    ttl: Option<String>,
    /// A human friendly description of how this token is used.
    #[arg(long, value_name = "TEXT")]
    description: Option<String>,
    /// Describes the ways in which this token can be used.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    usages: Vec<String>,
    /// Extra groups that this token will authenticate as when used for authentication.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    groups: Vec<String>,
    /// Instead of printing only the token, print the full 'kubeadm join' flag needed to join the cluster using the token.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    print_join_command: Option<bool>,
    /// When used together with '--print-join-command', print the full 'kubeadm join' flag needed to join the cluster as a control-plane.
    #[arg(long, value_name = "KEY")]
    certificate_key: Option<String>,
    /// Path to a kubeadm configuration file (refused by the stand-in).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ConfigArgs {
    /// The kubeconfig file to use when talking to the cluster.
    #[arg(long, global = true, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    cmd: ConfigCmd,
}

#[derive(Subcommand, Debug)]
enum ConfigCmd {
    /// Read a file containing the kubeadm configuration API and report any validation problems
    Validate(ConfigValidateArgs),
}

#[derive(Args, Debug)]
struct ConfigValidateArgs {
    /// Path to a kubeadm configuration file.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Allow validation of experimental, unreleased APIs.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    allow_experimental_api: Option<bool>,
}

#[derive(Args, Debug)]
struct CertsArgs {
    #[command(subcommand)]
    cmd: CertsCmd,
}

#[derive(Subcommand, Debug)]
enum CertsCmd {
    /// Renew certificates for a Kubernetes cluster
    Renew(CertsRenewArgs),
    /// Check certificates expiration for a Kubernetes cluster
    CheckExpiration(CertsCommonArgs),
}

#[derive(Args, Debug)]
struct CertsRenewArgs {
    /// Which certificates: the stand-in renews `all`.
    #[arg(value_name = "which")]
    which: Option<String>,
    #[command(flatten)]
    common: CertsCommonArgs,
}

#[derive(Args, Debug)]
struct CertsCommonArgs {
    /// The path where to save the certificates
    #[arg(long, value_name = "DIR")]
    cert_dir: Option<String>,
    /// Path to a kubeadm configuration file (refused by the stand-in).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The kubeconfig file to use when talking to the cluster.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct UpgradeArgs {
    #[command(subcommand)]
    cmd: UpgradeCmd,
}

#[derive(Subcommand, Debug)]
enum UpgradeCmd {
    /// Upgrade your Kubernetes cluster to the specified version
    Apply(UpgradeApplyArgs),
    /// Upgrade commands for a node in the cluster
    Node(UpgradeNodeArgs),
}

/// The flags `upgrade apply` and `upgrade node` share.
#[derive(Args, Debug)]
struct UpgradeCommonArgs {
    /// Perform the renewal of certificates used by component changed during upgrades.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    certificate_renewal: Option<bool>,
    /// Perform the upgrade of etcd.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    etcd_upgrade: Option<bool>,
    #[command(flatten)]
    cluster: ClusterFlags,
    /// Path to a kubeadm configuration file (refused by the stand-in).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Path to a directory that contains files named "target[suffix][+patchtype].extension" (the stand-in applies only kubeletconfiguration patches).
    #[arg(long, value_name = "DIR")]
    patches: Option<String>,
}

#[derive(Args, Debug)]
struct UpgradeApplyArgs {
    /// The version to upgrade to.
    #[arg(value_name = "version")]
    version: Option<String>,
    /// Perform the upgrade and do not prompt for confirmation (non-interactive mode).
    #[arg(short = 'y', long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    yes: Option<bool>,
    /// Force upgrading although some requirements might not be met.
    #[arg(short = 'f', long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    force: Option<bool>,
    #[command(flatten)]
    common: UpgradeCommonArgs,
}

#[derive(Args, Debug)]
struct UpgradeNodeArgs {
    /// List of phases to be skipped
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    skip_phases: Vec<String>,
    #[command(flatten)]
    common: UpgradeCommonArgs,
}

#[derive(Args, Debug)]
struct StandinApiserverArgs {
    #[arg(long)]
    bind: String,
    #[arg(long)]
    cert_dir: String,
    #[arg(long)]
    server: String,
    /// The local etcd (kube-apiserver's `--etcd-servers`).
    #[arg(long)]
    etcd_servers: String,
}

/// Flags kubeadm allows together with `--config` (kubeadm's
/// `isAllowedFlag`); every `skip-*` flag is allowed too.
const ALLOWED_WITH_CONFIG: &[&str] = &[
    "config",
    "ignore-preflight-errors",
    "dry-run",
    "kubeconfig",
    "node-name",
    "kubeconfig-dir",
    "upload-certs",
    "print-manifest",
    "allow-experimental-api",
    "print-join-command",
    "rootfs",
    "v",
    "log-file",
    "yes",
];

/// The long names of flags set on the command line that kubeadm refuses to
/// mix with `--config`, sorted as pflag visits them.
fn mixed_with_config(sub: &ArgMatches, cmd: &clap::Command) -> Vec<String> {
    let mut out = Vec::new();
    for id in sub.ids() {
        if sub.value_source(id.as_str()) != Some(ValueSource::CommandLine) {
            continue;
        }
        let Some(arg) = cmd.get_arguments().find(|a| a.get_id() == id) else {
            continue;
        };
        let Some(long) = arg.get_long() else { continue };
        if ALLOWED_WITH_CONFIG.contains(&long) || long.starts_with("skip-") {
            continue;
        }
        out.push(long.to_owned());
    }
    out.sort();
    out
}

fn check_mix(
    sub: &ArgMatches,
    cmd: &clap::Command,
    config: &Option<PathBuf>,
    name: &str,
) -> Result<PathBuf> {
    let mixed = mixed_with_config(sub, cmd);
    match config {
        Some(path) => {
            if !mixed.is_empty() {
                bail!("can not mix '--config' with arguments [{}]", mixed.join(" "));
            }
            Ok(path.clone())
        }
        None => bail!(
            "the stand-in kubeadm runs `kubeadm {name}` only with --config (Drover always renders a kubeadm.k8s.io/v1beta4 config file){}",
            if mixed.is_empty() {
                String::new()
            } else {
                format!("; got only flags [{}]", mixed.join(" "))
            }
        ),
    }
}

fn version_output(format: Option<&str>) -> Result<String> {
    let version = crate::util::kubeadm_version();
    let (major, minor) = (version.major.to_string(), version.minor.to_string());
    let git_version = crate::util::kubeadm_version_string();
    Ok(match format {
        None | Some("") => format!(
            "kubeadm version: &version.Info{{Major:\"{major}\", Minor:\"{minor}\", GitVersion:\"{git_version}\", GitCommit:\"{GIT_COMMIT}\", GitTreeState:\"clean\", BuildDate:\"{BUILD_DATE}\", GoVersion:\"{GO_VERSION}\", Compiler:\"gc\", Platform:\"linux/amd64\"}}"
        ),
        Some("short") => git_version.clone(),
        Some("json") => serde_json::to_string_pretty(&serde_json::json!({
            "clientVersion": {
                "major": major, "minor": minor, "gitVersion": git_version, "gitCommit": GIT_COMMIT,
                "gitTreeState": "clean", "buildDate": BUILD_DATE, "goVersion": GO_VERSION,
                "compiler": "gc", "platform": "linux/amd64",
            }
        }))?,
        Some("yaml") => format!(
            "clientVersion:\n  buildDate: \"{BUILD_DATE}\"\n  compiler: gc\n  gitCommit: {GIT_COMMIT}\n  gitTreeState: clean\n  gitVersion: {git_version}\n  goVersion: {GO_VERSION}\n  major: \"{major}\"\n  minor: \"{minor}\"\n  platform: linux/amd64"
        ),
        Some(other) => bail!("invalid output format: {other}"),
    })
}

fn config_validate(root: &Root, path: &Path) -> Result<()> {
    let text = cmd_init::read_config(root, path)?;
    let cfg = kconfig::parse(&text)?;
    if let Some(init) = &cfg.init {
        patches::directory(init.patches.as_ref(), "InitConfiguration.patches")?;
    }
    if let Some(join) = &cfg.join {
        patches::directory(join.patches.as_ref(), "JoinConfiguration.patches")?;
    }
    match (&cfg.init, &cfg.cluster, &cfg.join) {
        (_, _, Some(join)) if cfg.init.is_none() && cfg.cluster.is_none() => {
            let bt = join.discovery.bootstrap_token.as_ref();
            if bt.is_none() && join.discovery.file.is_none() {
                bail!("discovery: Invalid value: \"\": bootstrapToken or file must be set");
            }
            if let Some(bt) = bt {
                if bt.ca_cert_hashes.is_empty() && bt.unsafe_skip_ca_verification != Some(true) {
                    bail!("discovery.bootstrapToken.caCertHashes: Invalid value: \"\": using token-based discovery without caCertHashes can be unsafe. Set unsafeSkipCAVerification as true in your kubeadm config file or pass --discovery-token-unsafe-skip-ca-verification flag to continue");
                }
            }
        }
        (_, Some(cc), None) => {
            node::ClusterSettings::from_config(cc)?;
        }
        (Some(_), None, None) => {}
        (None, None, None) => bail!("the config holds no kubeadm configuration (InitConfiguration, ClusterConfiguration or JoinConfiguration)"),
        _ => bail!("the config mixes a JoinConfiguration with InitConfiguration/ClusterConfiguration"),
    }
    println!("ok");
    Ok(())
}

async fn dispatch(
    cli: Cli,
    matches: &ArgMatches,
    command: &clap::Command,
    root: Root,
) -> Result<()> {
    let (sub_name, sub_m) = matches.subcommand().expect("a subcommand is required");
    let sub_cmd = command.find_subcommand(sub_name).expect("known subcommand");
    match cli.cmd {
        Cmd::Version(a) => {
            println!("{}", version_output(a.output.as_deref())?);
            Ok(())
        }
        Cmd::Init(a) => {
            let config = check_mix(sub_m, sub_cmd, &a.node.config, "init")?;
            if a.upload_certs == Some(true) {
                bail!("--upload-certs: the stand-in kubeadm refuses it: Drover copies the shared CA set to control-plane machines instead of uploading certificates to the cluster");
            }
            cmd_init::run(
                &root,
                cmd_init::InitOpts {
                    node: a.node.opts(config),
                    skip_token_print: a.skip_token_print == Some(true),
                },
            )
            .await
        }
        Cmd::Join(a) => {
            if let (Some(_), Some(ep)) = (&a.node.config, &a.endpoint) {
                bail!("can not mix '--config' with the API server endpoint argument {ep:?}: the config's discovery.bootstrapToken.apiServerEndpoint names it");
            }
            let config = check_mix(sub_m, sub_cmd, &a.node.config, "join")?;
            cmd_join::run(&root, a.node.opts(config)).await
        }
        Cmd::Reset(a) => {
            if a.config.is_some() {
                bail!("--config: the stand-in kubeadm does not read ResetConfiguration; use flags");
            }
            let skip = util::SkipPhases::new(
                &["preflight", "remove-etcd-member", "cleanup-node"],
                &[&a.skip_phases],
            )?;
            util::IgnoreSet::new(&[&a.cluster.ignore_preflight_errors])?;
            cmd_reset::run(
                &root,
                cmd_reset::ResetOpts {
                    force: a.force == Some(true),
                    cert_dir: a.cert_dir,
                    cleanup_tmp_dir: a.cleanup_tmp_dir == Some(true),
                    dry_run: a.cluster.dry_run == Some(true),
                    remove_etcd_member: !skip.skipped("remove-etcd-member"),
                    cri_socket: a.cri_socket,
                },
            )
            .await
        }
        Cmd::Token(t) => match t.cmd {
            TokenCmd::Generate => {
                println!("{}", drover_common::token::BootstrapToken::generate());
                Ok(())
            }
            TokenCmd::Create(c) => {
                if c.config.is_some() {
                    bail!("--config: the stand-in kubeadm does not read a config for `token create`; use flags");
                }
                cmd_token::create(
                    &root,
                    cmd_token::CreateOpts {
                        token: c.token,
                        ttl: c.ttl,
                        kubeconfig: t.kubeconfig,
                        description: c.description,
                        usages: c.usages,
                        groups: c.groups,
                        print_join_command: c.print_join_command == Some(true),
                        certificate_key: c.certificate_key,
                        dry_run: t.dry_run == Some(true),
                    },
                )
                .await
            }
        },
        Cmd::Config(c) => match c.cmd {
            ConfigCmd::Validate(v) => {
                let path = v.config.ok_or_else(|| {
                    anyhow!("missing --config: kubeadm config validate needs a configuration file")
                })?;
                config_validate(&root, &path)
            }
        },
        Cmd::Upgrade(u) => {
            let common = match &u.cmd {
                UpgradeCmd::Apply(a) => &a.common,
                UpgradeCmd::Node(n) => &n.common,
            };
            if common.config.is_some() {
                bail!("--config: the stand-in kubeadm does not read an UpgradeConfiguration; use flags");
            }
            let ignore = util::IgnoreSet::new(&[&common.cluster.ignore_preflight_errors])?;
            let opts = cmd_upgrade::UpgradeOpts {
                kubeconfig: common.cluster.kubeconfig.clone(),
                certificate_renewal: common.certificate_renewal != Some(false),
                etcd_upgrade: common.etcd_upgrade != Some(false),
                dry_run: common.cluster.dry_run == Some(true),
                ignore,
                force: false,
                patches: common.patches.clone(),
            };
            match u.cmd {
                UpgradeCmd::Apply(a) => {
                    let opts = cmd_upgrade::UpgradeOpts {
                        force: a.force == Some(true),
                        ..opts
                    };
                    let version = a.version.ok_or_else(|| {
                        anyhow!(
                            "missing one or more required arguments. Required arguments: [version]"
                        )
                    })?;
                    cmd_upgrade::apply(&root, &version, a.yes == Some(true), opts).await
                }
                UpgradeCmd::Node(n) => {
                    let skip = util::SkipPhases::new(
                        &[
                            "preflight",
                            "control-plane",
                            "kubelet-config",
                            "addon",
                            "post-upgrade",
                        ],
                        &[&n.skip_phases],
                    )?;
                    if !n.skip_phases.is_empty() {
                        bail!("--skip-phases: the stand-in kubeadm runs every phase of `upgrade node` ({skip:?} asked to be skipped)");
                    }
                    cmd_upgrade::node(&root, opts).await
                }
            }
        }
        Cmd::Certs(c) => {
            let common = match &c.cmd {
                CertsCmd::Renew(r) => &r.common,
                CertsCmd::CheckExpiration(a) => a,
            };
            if common.config.is_some() {
                bail!("--config: the stand-in kubeadm reads the ClusterConfiguration this node keeps; use flags");
            }
            let settings = cmd_certs::RenewSettings::load(&root, common.cert_dir.clone())?;
            match c.cmd {
                CertsCmd::Renew(r) => match r.which.as_deref() {
                    Some("all") => cmd_certs::renew_all(&root, &settings),
                    Some(other) => bail!("the stand-in kubeadm renews only `all` certificates, not {other:?}"),
                    None => bail!("missing subcommand; \"renew\" is not meant to be run on its own: use `kubeadm certs renew all`"),
                },
                CertsCmd::CheckExpiration(_) => cmd_certs::check_expiration(&root, &settings),
            }
        }
        Cmd::StandinApiserver(_) | Cmd::StandinKubelet | Cmd::StandinEtcd => {
            unreachable!("daemons are dispatched before")
        }
    }
}

/// The subcommand path named by `args`, for cobra-style messages.
fn command_path(args: &[String]) -> String {
    let mut path = vec!["kubeadm".to_owned()];
    let mut cmd = Cli::command();
    for a in args {
        if a.starts_with('-') {
            continue;
        }
        match cmd.find_subcommand(a) {
            Some(sc) => {
                path.push(a.clone());
                cmd = sc.clone();
            }
            None => break,
        }
    }
    path.join(" ")
}

fn context_str(e: &clap::Error, kind: ContextKind) -> Option<String> {
    match e.get(kind)? {
        ContextValue::String(s) => Some(s.clone()),
        ContextValue::Strings(v) => v.first().cloned(),
        other => Some(other.to_string()),
    }
}

/// Maps clap's errors to pflag/cobra's messages; returns the exit code.
fn report_clap_error(e: clap::Error, args: &[String]) -> u8 {
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return 0;
        }
        _ => {}
    }
    let msg = match e.kind() {
        ErrorKind::UnknownArgument => {
            let arg = context_str(&e, ContextKind::InvalidArg).unwrap_or_default();
            if let Some(long) = arg.strip_prefix("--") {
                format!("unknown flag: --{}", long.split('=').next().unwrap_or(long))
            } else if let Some(short) = arg.strip_prefix('-') {
                format!(
                    "unknown shorthand flag: '{}' in -{short}",
                    short.chars().next().unwrap_or('?')
                )
            } else {
                format!("unknown command {arg:?} for {:?}", command_path(args))
            }
        }
        ErrorKind::InvalidSubcommand => {
            let sub = context_str(&e, ContextKind::InvalidSubcommand).unwrap_or_default();
            format!("unknown command {sub:?} for {:?}", command_path(args))
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let arg = context_str(&e, ContextKind::InvalidArg).unwrap_or_default();
            let flag = arg.split_whitespace().next().unwrap_or_default().to_owned();
            match context_str(&e, ContextKind::InvalidValue) {
                Some(v) if !v.is_empty() => format!(
                    "invalid argument {v:?} for {flag:?} flag: {}",
                    first_line(&e)
                ),
                _ => format!("flag needs an argument: {flag}"),
            }
        }
        _ => first_line(&e),
    };
    eprintln!("{msg}\nTo see the stack trace of this error execute with --v=5 or higher");
    1
}

fn first_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    rendered
        .lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_owned()
}

fn print_error(e: &anyhow::Error) {
    if let Some(pe) = e.downcast_ref::<PhaseError>() {
        eprintln!("{pe}");
    } else {
        eprintln!("{e:#}");
    }
    eprintln!("To see the stack trace of this error execute with --v=5 or higher");
}

fn resolve_root(rootfs: Option<&Path>) -> Result<Root> {
    match rootfs {
        None => Ok(Root(PathBuf::from("/"))),
        Some(dir) => {
            let canon =
                std::fs::canonicalize(dir).map_err(|e| anyhow!("chroot {}: {e}", dir.display()))?;
            if !canon.is_dir() {
                bail!("chroot {}: not a directory", dir.display());
            }
            Ok(Root(canon))
        }
    }
}

fn run(args: &[String]) -> u8 {
    let mut command = Cli::command();
    command.build();
    let argv = std::iter::once("kubeadm".to_owned()).chain(args.iter().cloned());
    let matches = match command.try_get_matches_from_mut(argv) {
        Ok(m) => m,
        Err(e) => return report_clap_error(e, args),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => return report_clap_error(e, args),
    };
    let root = match resolve_root(cli.rootfs.as_deref()) {
        Ok(r) => r,
        Err(e) => {
            print_error(&e);
            return 1;
        }
    };
    let daemon_name = match &cli.cmd {
        Cmd::StandinApiserver(_) => Some("apiserver"),
        Cmd::StandinKubelet => Some("kubelet"),
        Cmd::StandinEtcd => Some("etcd"),
        _ => None,
    };
    let result = match &cli.cmd {
        Cmd::StandinApiserver(a) => apiserver::run(
            root,
            apiserver::Opts {
                bind: a.bind.clone(),
                cert_dir: a.cert_dir.clone(),
                server: a.server.clone(),
                etcd_servers: a.etcd_servers.clone(),
            },
        ),
        Cmd::StandinKubelet => kubelet::run(root),
        Cmd::StandinEtcd => etcd::run(root),
        _ => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(dispatch(cli, &matches, &command, root)),
            Err(e) => Err(e.into()),
        },
    };
    match (result, daemon_name) {
        (Ok(()), _) => 0,
        (Err(e), Some(name)) => {
            eprintln!("standin-{name}: {e:#}");
            1
        }
        (Err(e), None) => {
            print_error(&e);
            1
        }
    }
}

/// The root whose invocation log records this call: `--rootfs`, or for
/// `token` commands the root above a `--kubeconfig` ending in
/// `/etc/kubernetes/admin.conf`, else `/`.
fn log_root(args: &[String]) -> Option<PathBuf> {
    let mut rootfs = None;
    let mut kubeconfig = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if let Some(v) = a.strip_prefix("--rootfs=") {
            rootfs = Some(v.to_owned());
        } else if a == "--rootfs" {
            rootfs = it.next().cloned();
        } else if let Some(v) = a.strip_prefix("--kubeconfig=") {
            kubeconfig = Some(v.to_owned());
        } else if a == "--kubeconfig" {
            kubeconfig = it.next().cloned();
        }
    }
    if let Some(r) = rootfs {
        let p = PathBuf::from(r);
        // Only log into a root that exists; kubeadm would fail to chroot.
        return p.is_dir().then_some(p);
    }
    let is_token = args
        .iter()
        .find(|a| !a.starts_with('-'))
        .is_some_and(|a| a == "token");
    if is_token {
        if let Some(root) = kubeconfig
            .as_deref()
            .and_then(|k| k.strip_suffix("/etc/kubernetes/admin.conf"))
        {
            let root = if root.is_empty() { "/" } else { root };
            return Some(PathBuf::from(root));
        }
    }
    Some(PathBuf::from("/"))
}

/// Appends `{"argv": [program, args...], "exit": N}` to the root's log.
fn log_invocation(program: &str, args: &[String], exit: u8) {
    let Some(root) = log_root(args) else { return };
    append_invocation(program, args, exit, Root(root));
}

/// Appends one invocation to the log of `root`.
fn append_invocation(program: &str, args: &[String], exit: u8, root: Root) {
    let path = root.path(INVOCATION_LOG);
    if let Some(dir) = path.parent() {
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
    }
    let argv: Vec<&str> = std::iter::once(program)
        .chain(args.iter().map(String::as_str))
        .collect();
    let mut line = serde_json::json!({"argv": argv, "exit": exit}).to_string();
    line.push('\n');
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        // One write call, so concurrent invocations never interleave lines.
        let _ = f.write_all(line.as_bytes());
    }
}

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut argv = std::env::args_os().map(|a| a.to_string_lossy().into_owned());
    let program = argv.next().unwrap_or_else(|| "kubeadm".to_owned());
    let args: Vec<String> = argv.collect();
    if let Some(code) = hooks::run(&program, &args) {
        if let Some(root) = std::env::var_os(drover_common::kubeadm::HOOK_ROOT_ENV) {
            append_invocation(&program, &args, code, Root(root.into()));
        }
        return ExitCode::from(code);
    }
    // Its own daemons, and `version` (a query the agent makes with its
    // heartbeats, without --rootfs), are not kubeadm runs worth recording.
    let internal = args
        .first()
        .is_some_and(|a| a.starts_with("__standin-") || a == "version");
    let code = run(&args);
    if !internal {
        log_invocation(&program, &args, code);
    }
    ExitCode::from(code)
}
