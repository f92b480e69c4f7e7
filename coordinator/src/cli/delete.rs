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
                        gone(got, |c: Cluster| {
                            Look::Waiting(format!(
                                "waiting for {} machine(s) to be released",
                                c.status.pools.iter().map(|p| p.assigned).sum::<u32>()
                            ))
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
            gone(got, |m: Machine| match m.status.phase {
                MachinePhase::Deleted => Look::Done(()),
                phase => Look::Waiting(phase.to_string()),
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

/// One look of a `--wait` until an object is gone: done once the
/// coordinator says it does not exist, else what `present` makes of it.
fn gone<T>(
    got: anyhow::Result<T>,
    present: impl FnOnce(T) -> Look<()>,
) -> anyhow::Result<Look<()>> {
    match got {
        Err(e) if e.to_string().contains("does not exist") => Ok(Look::Done(())),
        Err(e) => Err(e),
        Ok(object) => Ok(present(object)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_for_deletion_ends_when_the_object_does_not_exist_and_only_then() {
        let missing: anyhow::Result<u32> = Err(anyhow::anyhow!("machine m1 does not exist"));
        assert!(matches!(
            gone(missing, |_| unreachable!()),
            Ok(Look::Done(()))
        ));
        let refused: anyhow::Result<u32> = Err(anyhow::anyhow!("403: this token may only read"));
        assert!(gone(refused, |_| unreachable!()).is_err());
        let present = gone(Ok(3u32), |n| Look::Waiting(format!("{n} left")));
        assert!(matches!(present, Ok(Look::Waiting(line)) if line == "3 left"));
    }
}
