//! `drover bmc set|clear|power`: a pool machine's BMC.

use drover_common::api::{BmcSpec, Machine};

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::{api_path, object_name};

#[derive(Debug, clap::Args)]
pub struct BmcArgs {
    #[command(subcommand)]
    pub command: BmcCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum BmcCommand {
    /// Set a pool machine's BMC; the coordinator checks that it answers
    /// with the Secret's credentials first.
    Set {
        /// The machine.
        #[arg(value_parser = object_name)]
        machine: String,
        /// The BMC's Redfish root: https://HOST[:PORT].
        #[arg(long)]
        url: String,
        /// The Secret with the BMC's username, password and, when its
        /// certificate is self-signed, ca.crt.
        #[arg(long, value_parser = object_name)]
        credentials_secret: String,
        /// The ComputerSystem's id, when the BMC has more than one.
        #[arg(long)]
        system: Option<String>,
        #[command(flatten)]
        conn: ConnectArgs,
    },
    /// Forget a machine's BMC.
    Clear {
        #[arg(value_parser = object_name)]
        machine: String,
        #[command(flatten)]
        conn: ConnectArgs,
    },
    /// Power a machine off (only one no cluster holds), on, or through a
    /// cycle, by its BMC.
    Power {
        #[arg(value_parser = object_name)]
        machine: String,
        #[arg(value_enum)]
        action: PowerArg,
        #[command(flatten)]
        conn: ConnectArgs,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PowerArg {
    Off,
    On,
    Cycle,
}

/// `drover bmc ...`.
pub(super) async fn bmc(cmd: BmcCommand) -> anyhow::Result<()> {
    match cmd {
        BmcCommand::Set {
            machine,
            url,
            credentials_secret,
            system,
            conn,
        } => {
            let spec = BmcSpec {
                url,
                system,
                credentials_secret,
            };
            let errors = spec.validate();
            if !errors.is_empty() {
                let lines: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                anyhow::bail!("the BMC is not valid: {}", lines.join("; "));
            }
            let client = Client::connect(&conn)?;
            let m: Machine = client
                .put_json(&api_path(&["v1", "machines", &machine, "bmc"]), &spec)
                .await?;
            let said = m
                .status
                .events
                .iter()
                .rev()
                .find(|e| e.reason == "BmcSet")
                .map(|e| e.message.as_str())
                .unwrap_or("BMC set");
            println!(
                "machine/{} {}",
                m.metadata.name,
                crate::cli::printable(said)
            );
        }
        BmcCommand::Clear { machine, conn } => {
            let client = Client::connect(&conn)?;
            let m: Machine = client
                .delete(&api_path(&["v1", "machines", &machine, "bmc"]))
                .await?;
            println!("machine/{} has no BMC", m.metadata.name);
        }
        BmcCommand::Power {
            machine,
            action,
            conn,
        } => {
            let client = Client::connect(&conn)?;
            let name = match action {
                PowerArg::Off => "off",
                PowerArg::On => "on",
                PowerArg::Cycle => "cycle",
            };
            let answer: serde_json::Value = client
                .post(
                    &api_path(&["v1", "machines", &machine, "power"]),
                    &serde_json::json!({ "action": name }),
                )
                .await?;
            let text = |k: &str| crate::cli::printable(answer[k].as_str().unwrap_or_default());
            match answer["reset"].as_str() {
                Some(reset) => println!(
                    "machine/{machine}: {} {} (was {})",
                    text("system"),
                    crate::cli::printable(reset),
                    text("was")
                ),
                None => println!(
                    "machine/{machine}: {} already {}",
                    text("system"),
                    text("was")
                ),
            }
        }
    }
    Ok(())
}
