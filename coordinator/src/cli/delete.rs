//! `drover delete`: a cluster, a machine (through the safe path) or a
//! secret; with `--wait`, until it is gone.

use std::io::IsTerminal;

use anyhow::bail;
use drover_common::api::{Cluster, Machine, MachinePhase, ProviderSpec, SecretInfo};

use crate::cli::client::{Client, ConnectArgs};
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
                let deadline = std::time::Instant::now() + d.timeout;
                let tty = std::io::stderr().is_terminal();
                loop {
                    match client
                        .get::<Cluster>(&api_path(&["v1", "clusters", &d.name]))
                        .await
                    {
                        Err(e) if e.to_string().contains("does not exist") => break,
                        Err(e) => return Err(e),
                        Ok(c) => {
                            let assigned: u32 = c.status.pools.iter().map(|p| p.assigned).sum();
                            if tty {
                                eprint!(
                                    "\rwaiting for {} machine(s) to be released...   ",
                                    assigned
                                );
                            }
                        }
                    }
                    if std::time::Instant::now() > deadline {
                        bail!("cluster {} still exists after {:?}", d.name, d.timeout);
                    }
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
                if tty {
                    eprintln!();
                }
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
    let deadline = std::time::Instant::now() + d.timeout;
    let tty = std::io::stderr().is_terminal();
    loop {
        match client.get::<Machine>(&path).await {
            Err(e) if e.to_string().contains("does not exist") => break,
            Err(e) => return Err(e),
            Ok(m) if m.status.phase == MachinePhase::Deleted => break,
            Ok(m) => {
                if tty {
                    eprint!("\rmachine {} is {}...   ", d.name, m.status.phase);
                }
            }
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "machine {} has not left its cluster after {:?}; `drover describe machine {}` and `drover describe cluster {}` say what it waits for",
                d.name,
                d.timeout,
                d.name,
                a.cluster
            );
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    if tty {
        eprintln!();
    }
    println!("machine/{} deleted", d.name);
    Ok(())
}
