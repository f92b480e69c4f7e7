//! `drover autoscaler-config CLUSTER --out-dir DIR`: the cluster-autoscaler's
//! `externalgrpc` cloud-config for one cluster, with its client
//! certificate, key and the coordinator's CA beside it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use drover_common::api::AutoscalerCredentials;

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::{api_path, object_name};

#[derive(Debug, clap::Args)]
pub struct AutoscalerConfigArgs {
    #[arg(value_parser = object_name)]
    pub cluster: String,
    /// Where to write `cloud-config.yaml`, `cert.pem`, `key.pem` (mode
    /// 0600) and `ca.pem`.
    #[arg(long)]
    pub out_dir: PathBuf,
    /// Where the autoscaler will find those files, as `cloud-config.yaml`
    /// names them (default: the output directory): `/config` when they are
    /// mounted from a Secret there.
    #[arg(long)]
    pub mount_dir: Option<PathBuf>,
    /// How long the autoscaler waits for each call (`grpc_timeout`).
    #[arg(long, default_value = "5s", value_parser = drover_common::api::parse_duration)]
    pub grpc_timeout: std::time::Duration,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// The cloud-config the externalgrpc provider reads
/// (externalgrpc_cloud_provider.go `cloudConfig`: `address`, `key`,
/// `cert`, `cacert`, `grpc_timeout` as a duration string).
pub fn cloud_config(address: &str, dir: &Path, timeout: std::time::Duration) -> String {
    let file = |name: &str| dir.join(name).display().to_string();
    format!(
        "address: {}\ncert: {}\nkey: {}\ncacert: {}\ngrpc_timeout: {}s\n",
        serde_json::Value::from(address),
        serde_json::Value::from(file("cert.pem")),
        serde_json::Value::from(file("key.pem")),
        serde_json::Value::from(file("ca.pem")),
        timeout.as_secs_f64()
    )
}

pub(super) async fn autoscaler_config(a: AutoscalerConfigArgs) -> anyhow::Result<()> {
    let client = Client::connect(&a.conn)?;
    let creds: AutoscalerCredentials = client
        .post(
            &api_path(&["v1", "clusters", &a.cluster, "autoscaler-credentials"]),
            &serde_json::json!({}),
        )
        .await?;
    std::fs::create_dir_all(&a.out_dir)
        .with_context(|| format!("cannot create {}", a.out_dir.display()))?;
    let out = std::path::absolute(&a.out_dir)
        .with_context(|| format!("cannot resolve {}", a.out_dir.display()))?;
    let mount = a.mount_dir.clone().unwrap_or_else(|| out.clone());
    let write = |name: &str, text: &str, mode: u32| -> anyhow::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = out.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        f.write_all(text.as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))
    };
    write("key.pem", &creds.key_pem, 0o600)?;
    write("cert.pem", &creds.cert_pem, 0o644)?;
    write("ca.pem", &creds.ca_pem, 0o644)?;
    write(
        "cloud-config.yaml",
        &cloud_config(&creds.address, &mount, a.grpc_timeout),
        0o644,
    )?;
    println!(
        "autoscaler credentials of cluster {} written to {} (service {}, certificate expires {})",
        a.cluster,
        out.display(),
        creds.address,
        creds.expires_at
    );
    println!(
        "run the cluster-autoscaler with --cloud-provider=externalgrpc --cloud-config={}",
        mount.join("cloud-config.yaml").display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cloud_config_has_the_upstream_keys() {
        let text = cloud_config(
            "drover.example.com:8444",
            Path::new("/config"),
            std::time::Duration::from_secs(5),
        );
        assert_eq!(
            text,
            "address: \"drover.example.com:8444\"\ncert: \"/config/cert.pem\"\nkey: \"/config/key.pem\"\ncacert: \"/config/ca.pem\"\ngrpc_timeout: 5s\n"
        );
        let v: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(v["grpc_timeout"], "5s");
    }
}
