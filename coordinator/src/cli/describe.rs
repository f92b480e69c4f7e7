//! `drover describe`: one cluster, machine or secret, as the text view or
//! the whole object.

use drover_common::api::{Cluster, Machine, SecretInfo};

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::render::describe::{describe_cluster, describe_machine, describe_secret};
use crate::cli::render::{object_name_of, printable_text};
use crate::cli::{api_path, object_name, Output, Single};

#[derive(Debug, clap::Args)]
pub struct DescribeArgs {
    pub kind: Single,
    #[arg(value_parser = object_name)]
    pub name: String,
    /// `table` (or `text`, `wide`): the text view; `json`, `yaml`: the
    /// whole object; `name`: `kind/name`.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

pub(super) async fn describe(d: DescribeArgs) -> anyhow::Result<()> {
    let client = Client::connect(&d.conn)?;
    let text_view = matches!(d.output, Output::Table | Output::Wide);
    let (kind, object, text) = match d.kind {
        Single::Machine => {
            let m: Machine = client.get(&api_path(&["v1", "machines", &d.name])).await?;
            let text = text_view.then(|| describe_machine(&m));
            ("machine", serde_json::to_value(&m)?, text)
        }
        Single::Cluster => {
            let c: Cluster = client.get(&api_path(&["v1", "clusters", &d.name])).await?;
            let text = if text_view {
                let machines: Vec<Machine> = client.get("/v1/machines").await?;
                Some(describe_cluster(&c, &machines))
            } else {
                None
            };
            ("cluster", serde_json::to_value(&c)?, text)
        }
        Single::Secret => {
            let s: SecretInfo = client.get(&api_path(&["v1", "secrets", &d.name])).await?;
            let text = if text_view {
                let clusters: Vec<Cluster> = client.get("/v1/clusters").await?;
                Some(describe_secret(&s, &clusters))
            } else {
                None
            };
            ("secret", serde_json::to_value(&s)?, text)
        }
    };
    match (d.output, text) {
        (_, Some(text)) => print!("{}", printable_text(&text)),
        (Output::Json, _) => println!("{}", serde_json::to_string_pretty(&object)?),
        (Output::Yaml, _) => print!("{}", serde_saphyr::to_string(&object)?),
        _ => println!("{kind}/{}", object_name_of(&object)),
    }
    Ok(())
}
