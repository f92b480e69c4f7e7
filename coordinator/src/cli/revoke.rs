//! `drover revoke machine`: a machine's identity revoked.

use drover_common::api::Machine;

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::{api_path, object_name};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Revocable {
    Machine,
}

#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    pub kind: Revocable,
    #[arg(value_parser = object_name)]
    pub name: String,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// `drover revoke machine NAME`.
pub(super) async fn revoke(r: RevokeArgs) -> anyhow::Result<()> {
    let client = Client::connect(&r.conn)?;
    match r.kind {
        Revocable::Machine => {
            let m: Machine = client
                .post(
                    &api_path(&["v1", "machines", &r.name, "revoke"]),
                    &serde_json::json!({}),
                )
                .await?;
            println!(
                "machine/{} identity revoked at {}: its certificates are refused from their next request; it needs a new ticket to come back",
                m.metadata.name,
                m.status
                    .identity_revoked_at
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            );
            Ok(())
        }
    }
}
