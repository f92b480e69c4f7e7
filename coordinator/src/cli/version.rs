//! `drover version`: this client's version and the coordinator's.

use crate::cli::client::{Client, ConnectArgs};

#[derive(Debug, clap::Args)]
pub struct VersionArgs {
    /// Print only the client's version; do not ask the coordinator.
    #[arg(long)]
    pub client: bool,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// `drover version`: the client's version, then the coordinator's (its
/// replica and whether it leads). Exits 69 after the client line when the
/// coordinator cannot be reached.
pub(super) async fn version(v: VersionArgs) -> anyhow::Result<()> {
    println!("client: drover {}", env!("CARGO_PKG_VERSION"));
    if v.client {
        return Ok(());
    }
    /// The part of `GET /v1/status` this command reads.
    #[derive(serde::Deserialize)]
    struct Status {
        version: String,
        replica: crate::types::ReplicaInfo,
        leader: bool,
    }
    let s: Status = Client::connect(&v.conn)?.get("/v1/status").await?;
    println!(
        "server: drover {} (replica {}, {})",
        s.version,
        s.replica.id,
        if s.leader { "leader" } else { "follower" }
    );
    Ok(())
}
