//! `drover scale`: one pool's replica count changed.

use anyhow::Context;
use drover_common::api::Cluster;

use crate::cli::apply::UntilRunning;
use crate::cli::client::{is_conflict, Client, ConnectArgs};
use crate::cli::{api_path, object_name};

/// How many times `drover scale` reads and writes the cluster when the
/// reconciler's status writes keep moving its resourceVersion (client-go's
/// `retry.DefaultRetry` takes 5 steps).
const ATTEMPTS: usize = 5;

/// `drover scale`: change one pool's replica count.
pub async fn scale(s: ScaleArgs) -> anyhow::Result<()> {
    let client = Client::connect(&s.conn)?;
    let mut attempt = 1;
    let (generation_before, updated) = loop {
        // A read-modify-write: the write names the resourceVersion read, so
        // a status write in between (the reconciler's, any moment on a
        // busy cluster) refuses it and the change is made again on what is
        // stored now; a change by someone else is never overwritten.
        match scale_once(&client, &s).await {
            Err(e) if is_conflict(&e) && attempt < ATTEMPTS => {
                tracing::debug!(cluster = %s.cluster, attempt, error = %e, "cluster changed under the scale; reading it again");
                attempt += 1;
            }
            other => break other?,
        }
    };
    println!(
        "cluster/{} pool {} scaled to {} (generation {} -> {})",
        s.cluster, s.pool, s.replicas, generation_before, updated.metadata.generation
    );
    s.until_running
        .wait_for(&client, &s.cluster, updated.metadata.generation)
        .await
}

/// One read and write of the cluster with the pool's count changed: the
/// generation before and the cluster written.
async fn scale_once(client: &Client, s: &ScaleArgs) -> anyhow::Result<(u64, Cluster)> {
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
    Ok((generation_before, updated))
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
