//! `drover rollout status` and `drover rollout resume`: a cluster's
//! rollout to a new version or image, followed or resumed.

use anyhow::bail;
use drover_common::api::Cluster;

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::render::rollout_lines;
use crate::cli::{api_path, cluster_action, object_name};

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
            let deadline = std::time::Instant::now() + s.timeout;
            let started = std::time::Instant::now();
            let mut last = vec![];
            loop {
                let c: Cluster = client.get(&path).await?;
                let lines = rollout_lines(&c);
                if lines != last {
                    eprintln!(
                        "{:>4}s  cluster/{}: {}",
                        started.elapsed().as_secs(),
                        s.cluster,
                        lines.join("; ")
                    );
                    last = lines;
                }
                match &c.status.rollout {
                    None if c.status.observed_generation >= c.metadata.generation => {
                        println!(
                            "cluster/{}: rollout done, every machine is at {}",
                            s.cluster, c.spec.kubernetes_version
                        );
                        return Ok(());
                    }
                    Some(r) if r.halted.is_some() => {
                        bail!(
                            "cluster/{}: the rollout is halted: {}",
                            s.cluster,
                            last.join("; ")
                        )
                    }
                    _ => {}
                }
                if std::time::Instant::now() > deadline {
                    bail!(
                        "cluster/{}: the rollout is not done after {:?}: {}",
                        s.cluster,
                        s.timeout,
                        last.join("; ")
                    );
                }
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    }
}
