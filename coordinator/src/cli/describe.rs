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
    let cluster_text = |c: &Cluster, machines: Vec<Machine>| describe_cluster(c, &machines);
    let secret_text = |s: &SecretInfo, clusters: Vec<Cluster>| describe_secret(s, &clusters);
    let read = Read {
        client: &client,
        name: &d.name,
        text_view,
    };
    let (kind, object, text) = match d.kind {
        Single::Machine => {
            read.of("machine", None, |m, ()| describe_machine(m))
                .await?
        }
        Single::Cluster => {
            read.of("cluster", Some("/v1/machines"), cluster_text)
                .await?
        }
        Single::Secret => read.of("secret", Some("/v1/clusters"), secret_text).await?,
    };
    let object = super::get::without_managed_fields(object);
    match (d.output, text) {
        (_, Some(text)) => print!("{}", printable_text(&text)),
        (Output::Json, _) => println!("{}", serde_json::to_string_pretty(&object)?),
        (Output::Yaml, _) => print!("{}", serde_saphyr::to_string(&object)?),
        _ => println!("{kind}/{}", object_name_of(&object)),
    }
    Ok(())
}

/// What `drover describe` reads: object `name`, and for the text view what
/// that view reads besides.
struct Read<'a> {
    client: &'a Client,
    name: &'a str,
    text_view: bool,
}

impl Read<'_> {
    /// The object, of `kind`, as JSON, and its text view when wanted:
    /// `describe` of it and of what it reads at `context` (nothing without
    /// one).
    async fn of<T, L>(
        &self,
        kind: &'static str,
        context: Option<&str>,
        describe: impl FnOnce(&T, L) -> String,
    ) -> anyhow::Result<(&'static str, serde_json::Value, Option<String>)>
    where
        T: serde::de::DeserializeOwned + serde::Serialize,
        L: serde::de::DeserializeOwned + Default,
    {
        let path = api_path(&["v1", &format!("{kind}s"), self.name]);
        let object: T = self.client.get(&path).await?;
        let text = if self.text_view {
            let read = match context {
                Some(path) => self.client.get(path).await?,
                None => L::default(),
            };
            Some(describe(&object, read))
        } else {
            None
        };
        Ok((kind, serde_json::to_value(&object)?, text))
    }
}
