//! The operator commands (`drover apply`, `get`, `describe`, `delete`,
//! `kubeconfig`, `token`, ...): [`Command`] and its dispatch ([`run`]), the
//! argument types several verbs share, and one module per verb (its
//! arguments and what it does). What they print is composed in `render`;
//! how they reach a coordinator is [`client`], what `apply -f` reads
//! [`documents`].

pub mod client;
pub mod documents;

mod admin;
mod apply;
mod autoscaler;
mod backup;
mod bmc;
mod delete;
mod describe;
mod get;
mod kubeconfig;
mod render;
mod restore;
mod revoke;
mod rollout;
mod scale;
mod token;
mod version;

pub use admin::{
    admin_token, audit, keys, AdminTokenArgs, AdminTokenCommand, AuditArgs, KeysArgs, KeysCommand,
    RoleArg,
};
pub use apply::{ApplyArgs, UntilRunning};
pub use autoscaler::AutoscalerConfigArgs;
pub use backup::BackupArgs;
pub use bmc::{BmcArgs, BmcCommand};
pub use delete::DeleteArgs;
pub use describe::DescribeArgs;
pub use get::{GetArgs, Resource};
pub use kubeconfig::KubeconfigArgs;
pub use render::{age, describe_machine, health_summary, printable, printable_text, rollout_lines};
pub use restore::RestoreArgs;
pub use revoke::{Revocable, RevokeArgs};
pub use rollout::{RolloutArgs, RolloutCommand, RolloutResumeArgs, RolloutStatusArgs};
pub use scale::{scale, ScaleArgs};
pub use token::{TokenArgs, TokenCommand};
pub use version::VersionArgs;

/// The operator commands: each talks to a coordinator through
/// [`Client`](client::Client).
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Create or update Clusters and Secrets from YAML files, a directory or
    /// standard input.
    Apply(ApplyArgs),
    /// List objects.
    Get(GetArgs),
    /// Show one object in detail.
    Describe(DescribeArgs),
    /// Delete an object.
    Delete(DeleteArgs),
    /// Print an admin kubeconfig for a cluster.
    Kubeconfig(KubeconfigArgs),
    /// Write the cluster-autoscaler's externalgrpc cloud-config for a
    /// cluster, with its client certificate, key and CA.
    AutoscalerConfig(AutoscalerConfigArgs),
    /// Manage registration tokens for self-registering machines.
    Token(TokenArgs),
    /// Change the replica count of one pool of a cluster.
    Scale(ScaleArgs),
    /// Manage admin tokens (roles admin and viewer).
    AdminToken(AdminTokenArgs),
    /// Manage the keys that encrypt secrets at rest.
    Keys(KeysArgs),
    /// Show the audit log.
    Audit(AuditArgs),
    /// Revoke a machine's identity: every certificate of it is refused from
    /// its next request on.
    Revoke(RevokeArgs),
    /// Set or clear a pool machine's BMC (Redfish), or power it off, on or
    /// through a cycle.
    Bmc(BmcArgs),
    /// Follow or resume a cluster's rollout to a new version or image.
    Rollout(RolloutArgs),
    /// Print this client's version and the coordinator's.
    Version(VersionArgs),
    /// Back up the coordinator's store while it serves (restore with
    /// `drover store restore`), or a cluster's etcd (`drover backup
    /// cluster NAME`).
    Backup(Box<BackupArgs>),
    /// Restore a cluster's etcd from one of its snapshots (`drover restore
    /// cluster NAME`). The coordinator's own store: `drover store restore`.
    Restore(RestoreArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Columns (for `describe`: the text view).
    #[value(alias = "text")]
    Table,
    /// More columns.
    Wide,
    Json,
    Yaml,
    /// `kind/name`, one per line.
    Name,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Single {
    Cluster,
    Machine,
    Secret,
}

/// Parses an object name argument: a DNS-1123 subdomain, checked before any
/// request so a name can never reach another path (`../admintokens/x`).
pub(crate) fn object_name(s: &str) -> Result<String, drover_common::names::NameError> {
    drover_common::names::check_object_name("name", s).map(|()| s.to_owned())
}

/// An API path from its segments, each percent-encoded.
pub(crate) fn api_path(segments: &[&str]) -> String {
    crate::cli::client::path(segments)
}

/// Asks cluster `name` for an action (the segments after its path:
/// `snapshots`, `restore`, `rollout` `resume`) with `body`; the cluster as
/// the coordinator answers.
pub(crate) async fn cluster_action<B: serde::Serialize>(
    client: &client::Client,
    name: &str,
    action: &[&str],
    body: &B,
) -> anyhow::Result<drover_common::api::Cluster> {
    let mut segments = vec!["v1", "clusters", name];
    segments.extend_from_slice(action);
    client.post(&api_path(&segments), body).await
}

/// A `--wait` on cluster `name`: [`render::poll`] with each fresh copy of
/// it handed to `look`.
pub(crate) async fn wait_cluster<T>(
    client: &client::Client,
    name: &str,
    timeout: std::time::Duration,
    look: impl FnMut(drover_common::api::Cluster) -> anyhow::Result<render::Look<T>>,
    timed_out: impl FnOnce(&str) -> anyhow::Error,
) -> anyhow::Result<T> {
    let path = api_path(&["v1", "clusters", name]);
    render::poll(
        format!("cluster/{name}"),
        timeout,
        || client.get(&path),
        look,
        timed_out,
    )
    .await
}

/// Runs one operator command.
pub async fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Apply(a) => apply::apply(a).await,
        Command::Get(g) => get::get(g).await,
        Command::Describe(d) => describe::describe(d).await,
        Command::Delete(d) => delete::delete(d).await,
        Command::Kubeconfig(k) => kubeconfig::kubeconfig(k).await,
        Command::AutoscalerConfig(a) => autoscaler::autoscaler_config(a).await,
        Command::Token(t) => token::token(t.command).await,
        Command::Scale(s) => scale(s).await,
        Command::AdminToken(t) => admin_token(t.command).await,
        Command::Keys(k) => keys(k.command).await,
        Command::Audit(a) => audit(a).await,
        Command::Revoke(r) => revoke::revoke(r).await,
        Command::Bmc(b) => bmc::bmc(b.command).await,
        Command::Rollout(r) => rollout::rollout(r.command).await,
        Command::Version(v) => version::version(v).await,
        Command::Backup(b) => backup::backup(*b).await,
        Command::Restore(r) => restore::restore(r).await,
    }
}
