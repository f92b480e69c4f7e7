//! `drover restore cluster NAME [--snapshot ID] [--force] [--wait]`:
//! restores a cluster's etcd from one of its snapshots onto a new init
//! machine, and (with `--wait`) follows it until the cluster runs again.

use anyhow::bail;
use drover_common::api::{ClusterPhase, RestoreRequest};

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::render::Look;
use crate::cli::{cluster_action, wait_cluster};

#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    #[command(subcommand)]
    pub what: RestoreOf,
}

#[derive(Debug, clap::Subcommand)]
pub enum RestoreOf {
    /// A cluster's etcd, from one of its snapshots (`drover get snapshots
    /// CLUSTER`): its control planes are replaced by a new init machine
    /// that restores the snapshot before `kubeadm init`, with the same CAs,
    /// keys, version and endpoint; the other control planes then join, and
    /// the workers stay. Refused while a control plane is healthy, unless
    /// --force. With --into NEW, a restore drill instead: the snapshot is
    /// restored into a new cluster NEW (one control plane, a copy of the
    /// CAs), inventoried once its API answers, and NEW is deleted; NAME is
    /// not touched. (The coordinator's own store: `drover store restore`.)
    Cluster(RestoreClusterArgs),
}

#[derive(Debug, clap::Args)]
pub struct RestoreClusterArgs {
    #[arg(value_parser = crate::cli::object_name)]
    pub name: String,
    /// The snapshot to restore; default: the newest one saved.
    #[arg(long, value_parser = crate::cli::object_name)]
    pub snapshot: Option<String>,
    /// Restore although some control plane is healthy: it is replaced, and
    /// every change made since the snapshot is lost.
    #[arg(long, conflicts_with = "into")]
    pub force: bool,
    /// Restore into a new cluster of this name (a drill) and report what it
    /// holds; the new cluster is deleted after.
    #[arg(long, value_parser = crate::cli::object_name)]
    pub into: Option<String>,
    /// Wait until the cluster runs again with every control plane (a drill:
    /// until it ended), showing progress.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "15m", value_parser = drover_common::api::parse_duration)]
    pub timeout: std::time::Duration,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

pub(super) async fn restore(r: RestoreArgs) -> anyhow::Result<()> {
    match r.what {
        RestoreOf::Cluster(c) => restore_cluster(c).await,
    }
}

async fn restore_cluster(c: RestoreClusterArgs) -> anyhow::Result<()> {
    let client = Client::connect(&c.conn)?;
    let name = &c.name;
    let request = RestoreRequest {
        snapshot: c.snapshot.clone(),
        force: c.force,
        into: c.into.clone(),
    };
    if c.into.is_some() {
        return drill(&client, &c, &request).await;
    }
    let asked = cluster_action(&client, name, &["restore"], &request).await?;
    let Some(restore) = asked.status.restore.clone() else {
        bail!("the coordinator did not record the restore of cluster {name}; see `drover describe cluster {name}`");
    };
    println!(
        "cluster/{name}: restoring etcd from snapshot {} (revision {})",
        restore.snapshot, restore.revision
    );
    if !c.wait {
        return Ok(());
    }
    let since = restore.requested_at;
    let started = std::time::Instant::now();
    let done = wait_cluster(
        &client,
        name,
        c.timeout,
        |cluster| {
            let s = cluster.status;
            let done = s
                .last_restore
                .as_ref()
                .filter(|d| d.requested_at == since && s.restore.is_none());
            Ok(match done {
                Some(d) if s.phase == ClusterPhase::Running => Look::Done(d.clone()),
                Some(d) => Look::Waiting(format!(
                    "etcd restored by {}; the cluster is {} ({})",
                    d.machine,
                    s.phase,
                    s.pools
                        .iter()
                        .map(|p| format!("{} {}/{} running", p.name, p.running, p.desired))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
                None => Look::Waiting(
                    s.conditions
                        .iter()
                        .find(|c| c.type_ == drover_common::api::RESTORING_CONDITION)
                        .map(|c| c.message.clone())
                        .unwrap_or_else(|| "waiting for the reconciler".into()),
                ),
            })
        },
        |last| {
            anyhow::anyhow!(
                "cluster {name} did not run again within {:?} ({last}); the restore goes on: see `drover describe cluster {name}`",
                c.timeout
            )
        },
    )
    .await?;
    println!(
        "cluster/{name} is Running, restored from snapshot {} by {} in {}s",
        done.snapshot,
        done.machine,
        started.elapsed().as_secs()
    );
    Ok(())
}

/// `drover restore cluster NAME --into NEW`: starts the drill and, with
/// `--wait`, follows it until it ended; fails when the drill failed.
async fn drill(
    client: &Client,
    c: &RestoreClusterArgs,
    request: &RestoreRequest,
) -> anyhow::Result<()> {
    let name = &c.name;
    let asked = cluster_action(client, name, &["restore"], request).await?;
    let Some(drill) = asked.status.drill.clone() else {
        bail!("the coordinator did not record the drill of cluster {name}; see `drover describe cluster {name}`");
    };
    println!(
        "cluster/{name}: drilling the restore of snapshot {} into cluster/{}",
        drill.snapshot, drill.cluster
    );
    if !c.wait {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let done = wait_cluster(
        client,
        name,
        c.timeout,
        |cluster| {
            let s = cluster.status;
            Ok(
                match s
                    .last_drill
                    .filter(|d| d.cluster == drill.cluster && d.started_at == drill.started_at)
                {
                    Some(d) => Look::Done(d),
                    None => Look::Waiting(format!(
                        "drill cluster {} restores snapshot {} (`drover describe cluster {}`)",
                        drill.cluster, drill.snapshot, drill.cluster
                    )),
                },
            )
        },
        |last| {
            anyhow::anyhow!(
                "the drill of cluster {name} did not end within {:?} ({last}); it goes on: see `drover describe cluster {}`",
                c.timeout,
                drill.cluster
            )
        },
    )
    .await?;
    if !done.ok {
        bail!(
            "the restore drill of cluster {name} failed after {}s: {}",
            started.elapsed().as_secs(),
            done.message
        );
    }
    println!(
        "cluster/{name}: restore drill passed in {}s: {}",
        started.elapsed().as_secs(),
        done.message
    );
    if let Some(inventory) = &done.inventory {
        println!("  namespaces: {}", inventory.namespaces.join(", "));
        for (resource, count) in &inventory.objects {
            println!("  {resource}: {count}");
        }
    }
    println!("cluster/{} is being deleted", done.cluster);
    Ok(())
}
