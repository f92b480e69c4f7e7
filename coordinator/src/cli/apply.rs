//! `drover apply -f`: every document read and checked, then sent in order;
//! with `--wait`, until each cluster applied is Running (the wait `drover
//! scale --wait` shares).

use std::path::PathBuf;

use drover_common::api::{Cluster, SecretInfo};

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::documents;
use crate::cli::render::Look;
use crate::cli::{api_path, wait_cluster};

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// A YAML or JSON file of Clusters and Secrets (documents separated by
    /// `---`), a directory (its .yaml, .yml and .json files in name order),
    /// or `-` for standard input; may be given more than once. Objects are
    /// applied in order; the first refused stops the rest.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub until_running: UntilRunning,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// `--wait` and `--timeout` of the commands that may wait until a cluster
/// is Running (`apply`, `scale`).
#[derive(Debug, clap::Args)]
pub struct UntilRunning {
    /// Wait until the cluster is Running, showing progress.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "15m", value_parser = drover_common::api::parse_duration)]
    pub timeout: std::time::Duration,
}

impl UntilRunning {
    /// With `--wait`, waits until cluster `name` is Running at `generation`
    /// ([`wait_running`]); without, returns at once.
    pub(super) async fn wait_for(
        &self,
        client: &Client,
        name: &str,
        generation: u64,
    ) -> anyhow::Result<()> {
        if !self.wait {
            return Ok(());
        }
        wait_running(client, name, generation, self.timeout).await
    }
}

pub(super) async fn apply(a: ApplyArgs) -> anyhow::Result<()> {
    // Every document is read and checked before the first is sent.
    let objects = documents::read_all(&a.files)?
        .iter()
        .map(documents::Document::object)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{e}; nothing was applied"))?;
    let client = Client::connect(&a.conn)?;
    let mut clusters = Vec::new();
    for (done, o) in objects.iter().enumerate() {
        let applied = apply_object(&client, o).await.map_err(|e| {
            let before = match done {
                0 => "nothing was applied".to_owned(),
                1 => "the object before it was applied".to_owned(),
                n => format!("the {n} objects before it were applied"),
            };
            e.context(format!(
                "{} ({}/{}) was refused; {before}, none after it",
                o.at, o.kind, o.name
            ))
        })?;
        if let Some(generation) = applied {
            clusters.push((o.name.clone(), generation));
        }
    }
    for (name, generation) in clusters {
        a.until_running.wait_for(&client, &name, generation).await?;
    }
    Ok(())
}

/// Sends one checked object and prints its line; a cluster's generation
/// for `--wait`.
async fn apply_object(client: &Client, o: &documents::Object) -> anyhow::Result<Option<u64>> {
    match o.kind {
        documents::Kind::Secret => {
            let s: SecretInfo = put(client, "secrets", o).await?;
            let keys = s.keys.iter().map(|k| k.key.as_str()).collect::<Vec<_>>();
            applied("secret", &s.metadata, format!("keys {}", keys.join(", ")));
            Ok(None)
        }
        documents::Kind::Cluster => {
            let c: Cluster = put(client, "clusters", o).await?;
            let rv = c.metadata.resource_version.as_deref().unwrap_or_default();
            applied("cluster", &c.metadata, format!("resourceVersion {rv}"));
            Ok(Some(c.metadata.generation))
        }
    }
}

/// Sends `o` to `/v1/{plural}/{its name}`.
async fn put<T: serde::de::DeserializeOwned>(
    client: &Client,
    plural: &str,
    o: &documents::Object,
) -> anyhow::Result<T> {
    client
        .put_yaml(&api_path(&["v1", plural, &o.name]), o.body.clone())
        .await
}

/// Prints the line of an object applied.
fn applied(kind: &str, meta: &drover_common::api::ObjectMeta, detail: String) {
    println!(
        "{kind}/{} applied (generation {}, {detail})",
        meta.name, meta.generation
    );
}

/// Polls the cluster until it is Running at `generation`, printing a line
/// whenever its progress changes (a live line on a terminal).
async fn wait_running(
    client: &Client,
    name: &str,
    generation: u64,
    timeout: std::time::Duration,
) -> anyhow::Result<()> {
    wait_cluster(
        client,
        name,
        timeout,
        |c| {
            if c.status.phase == drover_common::api::ClusterPhase::Running
                && c.status.observed_generation >= generation
            {
                return Ok(Look::Done(()));
            }
            let pools: Vec<String> = c
                .status
                .pools
                .iter()
                .map(|p| format!("{} {}/{}", p.name, p.running, p.desired))
                .collect();
            Ok(Look::Waiting(format!(
                "{} [{}]",
                c.status.phase,
                pools.join(", ")
            )))
        },
        |last| {
            anyhow::anyhow!(
                "cluster {name} is not Running after {timeout:?} (it is {last}); see `drover describe cluster {name}`"
            )
        },
    )
    .await?;
    println!("cluster/{name} is Running");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Command;

    #[test]
    fn apply_takes_files_directories_and_standard_input_more_than_once() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            command: Command,
        }
        let cli = <Cli as clap::Parser>::try_parse_from([
            "drover",
            "apply",
            "-f",
            "a.yaml",
            "-f",
            "-",
            "--filename",
            "dir/",
        ])
        .unwrap();
        let Command::Apply(a) = cli.command else {
            panic!("not apply");
        };
        assert_eq!(
            a.files,
            [PathBuf::from("a.yaml"), "-".into(), "dir/".into()]
        );
        assert!(<Cli as clap::Parser>::try_parse_from(["drover", "apply"]).is_err());
    }
}
