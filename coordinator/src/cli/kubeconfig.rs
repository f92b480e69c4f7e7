//! `drover kubeconfig`: an admin kubeconfig for a cluster, or (with
//! `--coordinator`) for the coordinator itself, which serves its objects
//! to kubectl as `drover.dev/v1alpha1`.

use drover_common::api::KubeconfigResponse;

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::{api_path, object_name};

#[derive(Debug, clap::Args)]
pub struct KubeconfigArgs {
    #[arg(value_parser = object_name, required_unless_present = "coordinator")]
    pub cluster: Option<String>,
    /// A kubeconfig for the coordinator itself instead: its URL, its CA and
    /// this client's admin token (`kubectl get clusters`).
    #[arg(long, conflicts_with = "cluster")]
    pub coordinator: bool,
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
    let Some(cluster) = &k.cluster else {
        print!("{}", client.coordinator_kubeconfig()?);
        eprintln!("# a kubeconfig for the coordinator itself; it holds your admin token: keep it as you keep the token");
        return Ok(());
    };
    let resp: KubeconfigResponse = client
        .post(
            &api_path(&["v1", "clusters", cluster, "kubeconfig"]),
            &serde_json::json!({"ttlSeconds": k.ttl.as_secs()}),
        )
        .await?;
    print!("{}", resp.kubeconfig);
    eprintln!("# client certificate expires at {}", resp.expires_at);
    Ok(())
}
