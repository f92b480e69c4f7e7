//! `drover rollout status` and `drover rollout resume`: a cluster's
//! rollout to a new version or image, followed or resumed.

use anyhow::bail;
use drover_common::api::Cluster;

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::render::{rollout_lines, Look};
use crate::cli::{api_path, cluster_action, object_name, wait_cluster};

#[derive(Debug, clap::Args)]
pub struct RolloutArgs {
    #[command(subcommand)]
    pub command: RolloutCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum RolloutCommand {
    /// Show each pool's progress (`2/3 at v1.32.0`) and any halt.
    Status(RolloutStatusArgs),
    /// Resume a halted rollout: the next step is taken again.
    Resume(RolloutResumeArgs),
}

#[derive(Debug, clap::Args)]
pub struct RolloutStatusArgs {
    #[arg(value_parser = object_name)]
    pub cluster: String,
    /// Follow the rollout until it is done or halted, showing progress.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "60m", value_parser = drover_common::api::parse_duration)]
    pub timeout: std::time::Duration,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Debug, clap::Args)]
pub struct RolloutResumeArgs {
    #[arg(value_parser = object_name)]
    pub cluster: String,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

pub(super) async fn rollout(command: RolloutCommand) -> anyhow::Result<()> {
    match command {
        RolloutCommand::Resume(r) => {
            let client = Client::connect(&r.conn)?;
            let c = cluster_action(
                &client,
                &r.cluster,
                &["rollout", "resume"],
                &serde_json::json!({}),
            )
            .await?;
            println!("cluster/{} rollout resumed", c.metadata.name);
            Ok(())
        }
        RolloutCommand::Status(s) => {
            let client = Client::connect(&s.conn)?;
            let path = api_path(&["v1", "clusters", &s.cluster]);
            if !s.wait {
                let c: Cluster = client.get(&path).await?;
                for line in rollout_lines(&c) {
                    println!("{line}");
                }
                return Ok(());
            }
            let cluster = &s.cluster;
            let version = wait_cluster(
                &client,
                cluster,
                s.timeout,
                |c| {
                    let lines = rollout_lines(&c).join("; ");
                    match &c.status.rollout {
                        None if c.status.observed_generation >= c.metadata.generation => {
                            Ok(Look::Done(c.spec.kubernetes_version))
                        }
                        Some(r) if r.halted.is_some() => {
                            bail!("cluster/{cluster}: the rollout is halted: {lines}")
                        }
                        _ => Ok(Look::Waiting(lines)),
                    }
                },
                |last| {
                    anyhow::anyhow!(
                        "cluster/{cluster}: the rollout is not done after {:?}: {last}",
                        s.timeout
                    )
                },
            )
            .await?;
            println!("cluster/{cluster}: rollout done, every machine is at {version}");
            Ok(())
        }
    }
}
