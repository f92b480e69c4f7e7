//! Admin kubeconfigs for managed clusters.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use drover_common::api::KubeconfigResponse;
use drover_common::pki::{CertificateAuthority, LeafSpec, LeafUsage, PkiError};
use serde_json::json;

/// Mints a kubeconfig whose client certificate (group
/// `kubeadm:cluster-admins`, the group kubeadm binds to cluster-admin) lives
/// `ttl_seconds`.
pub fn admin_kubeconfig(
    cluster: &str,
    endpoint: &str,
    ca: &CertificateAuthority,
    ttl_seconds: u64,
    requested_by: &str,
) -> Result<KubeconfigResponse, PkiError> {
    let issued = ca.issue(&LeafSpec {
        common_name: format!("drover-admin:{requested_by}"),
        organizations: vec!["kubeadm:cluster-admins".into()],
        dns_names: vec![],
        ip_addresses: vec![],
        usage: LeafUsage::Client,
        validity: time::Duration::seconds(ttl_seconds as i64),
    })?;
    let user = format!("{cluster}-admin");
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": cluster,
            "cluster": {
                "server": format!("https://{endpoint}"),
                "certificate-authority-data": STANDARD.encode(&ca.cert_pem),
            }
        }],
        "users": [{
            "name": user,
            "user": {
                "client-certificate-data": STANDARD.encode(&issued.cert_pem),
                "client-key-data": STANDARD.encode(issued.key_pem.as_deref().unwrap_or_default()),
            }
        }],
        "contexts": [{
            "name": format!("{user}@{cluster}"),
            "context": {"cluster": cluster, "user": user}
        }],
        "current-context": format!("{user}@{cluster}"),
        "preferences": {},
    });
    Ok(KubeconfigResponse {
        kubeconfig: serde_saphyr::to_string(&doc).expect("kubeconfig serializes"),
        expires_at: issued.not_after,
    })
}
