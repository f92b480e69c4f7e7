//! `drover delete`: a cluster, a machine (through the safe path) or a
//! secret; with `--wait`, until it is gone.

use drover_common::api::{Cluster, Machine, MachinePhase, ProviderSpec, SecretInfo};

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::render::{poll, Look};
use crate::cli::{api_path, object_name, Single};

#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    pub kind: Single,
    #[arg(value_parser = object_name)]
    pub name: String,
    /// Wait until the object is gone.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "10m", value_parser = drover_common::api::parse_duration)]
    pub timeout: std::time::Duration,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

pub(super) async fn delete(d: DeleteArgs) -> anyhow::Result<()> {
    let client = Client::connect(&d.conn)?;
    match d.kind {
        Single::Cluster => {
            let c: Cluster = client
                .delete(&api_path(&["v1", "clusters", &d.name]))
                .await?;
            let what = match c.spec.provider {
                ProviderSpec::Pool(_) => "its machines are reset and return to their pools",
                ProviderSpec::Docker(_) => "its containers and its Docker network are removed",
                ProviderSpec::Aws(_) => "its EC2 instances are terminated",
            };
            println!("cluster/{} deletion requested; {what}", d.name);
            if d.wait {
                let path = api_path(&["v1", "clusters", &d.name]);
                poll(
                    format!("cluster/{}", d.name),
                    d.timeout,
                    || async { Ok(client.get::<Cluster>(&path).await) },
                    |got| {
                        Ok(match got {
                            Err(e) if e.to_string().contains("does not exist") => Look::Done(()),
                            Err(e) => return Err(e),
                            Ok(c) => Look::Waiting(format!(
                                "waiting for {} machine(s) to be released",
                                c.status.pools.iter().map(|p| p.assigned).sum::<u32>()
                            )),
                        })
                    },
                    |last| {
                        anyhow::anyhow!(
                            "cluster {} still exists after {:?} ({last})",
                            d.name,
                            d.timeout
                        )
                    },
                )
                .await?;
                println!("cluster/{} deleted", d.name);
            }
            Ok(())
        }
        Single::Machine => delete_machine(&client, &d).await,
        Single::Secret => {
            let s: SecretInfo = client
                .delete(&api_path(&["v1", "secrets", &d.name]))
                .await?;
            println!(
                "secret/{} deleted (it held {} key(s))",
                s.metadata.name,
                s.keys.len()
            );
            Ok(())
        }
    }
}

/// `drover delete machine NAME [--wait]`: the machine leaves its cluster
/// through the safe path (replaced or released, control planes one at a
/// time); with `--wait`, until it is gone.
async fn delete_machine(client: &Client, d: &DeleteArgs) -> anyhow::Result<()> {
    let path = api_path(&["v1", "machines", &d.name]);
    let m: Machine = client.delete(&path).await?;
    let Some(a) = &m.spec.assignment else {
        println!("machine/{} deregistered (it served no cluster)", d.name);
        return Ok(());
    };
    let how = if m.spec.provider.is_some() {
        "a replacement is created and then the machine is deleted"
    } else {
        "it is reset and a free matching machine is claimed in its place"
    };
    println!(
        "machine/{} deletion requested; it leaves cluster {} safely: {how}",
        d.name, a.cluster
    );
    if !d.wait {
        return Ok(());
    }
    poll(
        format!("machine/{}", d.name),
        d.timeout,
        || async { Ok(client.get::<Machine>(&path).await) },
        |got| {
            Ok(match got {
                Err(e) if e.to_string().contains("does not exist") => Look::Done(()),
                Err(e) => return Err(e),
                Ok(m) if m.status.phase == MachinePhase::Deleted => Look::Done(()),
                Ok(m) => Look::Waiting(format!("{}", m.status.phase)),
            })
        },
        |last| {
            anyhow::anyhow!(
                "machine {} has not left its cluster after {:?} (it is {last}); `drover describe machine {}` and `drover describe cluster {}` say what it waits for",
                d.name,
                d.timeout,
                d.name,
                a.cluster
            )
        },
    )
    .await?;
    println!("machine/{} deleted", d.name);
    Ok(())
}
