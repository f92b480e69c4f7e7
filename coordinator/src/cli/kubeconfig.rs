//! `drover kubeconfig`: an admin kubeconfig for a cluster.

use drover_common::api::KubeconfigResponse;

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::{api_path, object_name};

#[derive(Debug, clap::Args)]
pub struct KubeconfigArgs {
    #[arg(value_parser = object_name)]
    pub cluster: String,
    /// Lifetime of the client certificate.
    #[arg(long, default_value = "1h", value_parser = drover_common::api::parse_duration)]
    pub ttl: std::time::Duration,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// `drover kubeconfig CLUSTER`: the kubeconfig on standard output, when its
/// client certificate expires on standard error.
pub(super) async fn kubeconfig(k: KubeconfigArgs) -> anyhow::Result<()> {
    let client = Client::connect(&k.conn)?;
    let resp: KubeconfigResponse = client
        .post(
            &api_path(&["v1", "clusters", &k.cluster, "kubeconfig"]),
            &serde_json::json!({"ttlSeconds": k.ttl.as_secs()}),
        )
        .await?;
    print!("{}", resp.kubeconfig);
    eprintln!("# client certificate expires at {}", resp.expires_at);
    Ok(())
}
