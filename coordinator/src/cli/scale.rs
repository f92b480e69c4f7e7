//! `drover scale`: one pool's replica count changed.

use anyhow::Context;
use drover_common::api::Cluster;

use crate::cli::apply::UntilRunning;
use crate::cli::client::{Client, ConnectArgs};
use crate::cli::{api_path, object_name};

/// `drover scale`: change one pool's replica count.
pub async fn scale(s: ScaleArgs) -> anyhow::Result<()> {
    let client = Client::connect(&s.conn)?;
    let mut c: Cluster = client
        .get(&api_path(&["v1", "clusters", &s.cluster]))
        .await?;
    if s.pool == drover_common::api::CONTROL_PLANE_POOL {
        c.spec.control_plane.replicas = s.replicas;
    } else {
        let pool = c
            .spec
            .worker_pools
            .iter_mut()
            .find(|p| p.name == s.pool)
            .with_context(|| format!("cluster {} has no pool {:?}", s.cluster, s.pool))?;
        pool.replicas = s.replicas;
    }
    c.status = Default::default();
    let generation_before = c.metadata.generation;
    let yaml = serde_saphyr::to_string(&c)?;
    let updated: Cluster = client
        .put_yaml(&api_path(&["v1", "clusters", &s.cluster]), yaml)
        .await?;
    println!(
        "cluster/{} pool {} scaled to {} (generation {} -> {})",
        s.cluster, s.pool, s.replicas, generation_before, updated.metadata.generation
    );
    s.until_running
        .wait_for(&client, &s.cluster, updated.metadata.generation)
        .await
}

#[derive(Debug, clap::Args)]
pub struct ScaleArgs {
    #[arg(value_parser = object_name)]
    pub cluster: String,
    /// The pool: `control-plane` or a worker pool name.
    #[arg(long, default_value = "default", value_parser = object_name)]
    pub pool: String,
    #[arg(long)]
    pub replicas: u32,
    #[command(flatten)]
    pub until_running: UntilRunning,
    #[command(flatten)]
    pub conn: ConnectArgs,
}
