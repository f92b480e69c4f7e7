//! When a control plane's kubeadm certificates expire: the leaf
//! certificates under `/etc/kubernetes/pki` and the client certificates
//! embedded in the kubeconfigs kubeadm writes, as `kubeadm certs
//! check-expiration` lists them (the CAs, valid for ten years, are not
//! among them). The coordinator replaces a control plane whose first
//! certificate expires within the cluster's renewal window.

use std::path::Path;

use base64::Engine;
use drover_common::api::CertificateExpiry;
use time::OffsetDateTime;

/// The leaf certificates kubeadm writes, relative to `/etc/kubernetes`.
const LEAF_CERTIFICATES: &[&str] = &[
    "pki/apiserver.crt",
    "pki/apiserver-kubelet-client.crt",
    "pki/apiserver-etcd-client.crt",
    "pki/front-proxy-client.crt",
    "pki/etcd/server.crt",
    "pki/etcd/peer.crt",
    "pki/etcd/healthcheck-client.crt",
];

/// The kubeconfigs with a client certificate kubeadm writes, relative to
/// `/etc/kubernetes`.
const KUBECONFIGS: &[&str] = &[
    "admin.conf",
    "super-admin.conf",
    "controller-manager.conf",
    "scheduler.conf",
];

/// The certificate that expires first on the machine under `root`, of
/// those present and readable; `None` when there is none (not a control
/// plane, or before `kubeadm` wrote them).
pub fn earliest_expiry(root: &Path) -> Option<CertificateExpiry> {
    let dir = root.join("etc/kubernetes");
    let leaves = LEAF_CERTIFICATES.iter().filter_map(|name| {
        let pem = std::fs::read_to_string(dir.join(name)).ok()?;
        Some((*name, not_after(&pem)?))
    });
    let kubeconfigs = KUBECONFIGS.iter().filter_map(|name| {
        let text = std::fs::read_to_string(dir.join(name)).ok()?;
        Some((*name, not_after(&client_certificate(&text)?)?))
    });
    leaves
        .chain(kubeconfigs)
        .min_by_key(|(_, at)| *at)
        .map(|(name, at)| CertificateExpiry {
            certificate: name.to_owned(),
            expires_at: at,
        })
}

/// The expiry of the first certificate of a PEM document.
fn not_after(pem: &str) -> Option<OffsetDateTime> {
    let der = drover_common::pki::first_cert_der(pem).ok()?;
    Some(drover_common::pki::cert_info(&der).ok()?.not_after)
}

/// The PEM client certificate embedded in a kubeconfig's first user.
fn client_certificate(kubeconfig: &str) -> Option<String> {
    let doc: serde_json::Value = serde_saphyr::from_str(kubeconfig).ok()?;
    let data = doc["users"][0]["user"]["client-certificate-data"].as_str()?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data)
        .ok()?;
    String::from_utf8(pem).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate valid for `days`, in PEM.
    fn cert(days: i64) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        p.not_before = OffsetDateTime::now_utc() - time::Duration::days(1);
        p.not_after = OffsetDateTime::now_utc() + time::Duration::days(days);
        p.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn the_first_leaf_or_kubeconfig_certificate_to_expire_is_reported() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(earliest_expiry(root.path()), None);
        let dir = root.path().join("etc/kubernetes");
        std::fs::create_dir_all(dir.join("pki/etcd")).unwrap();
        std::fs::write(dir.join("pki/apiserver.crt"), cert(365)).unwrap();
        std::fs::write(dir.join("pki/etcd/peer.crt"), cert(200)).unwrap();
        // A CA that expires sooner is not a kubeadm leaf certificate.
        std::fs::write(dir.join("pki/ca.crt"), cert(10)).unwrap();
        let found = earliest_expiry(root.path()).unwrap();
        assert_eq!(found.certificate, "pki/etcd/peer.crt");
        let days = (found.expires_at - OffsetDateTime::now_utc()).whole_days();
        assert!((199..=200).contains(&days), "{days}");
        // A kubeconfig's embedded client certificate counts; a kubeconfig
        // without one is skipped.
        let data = base64::engine::general_purpose::STANDARD.encode(cert(50));
        std::fs::write(
            dir.join("admin.conf"),
            format!("apiVersion: v1\nkind: Config\nusers:\n- name: admin\n  user:\n    client-certificate-data: {data}\n"),
        )
        .unwrap();
        std::fs::write(dir.join("scheduler.conf"), "apiVersion: v1\nkind: Config\n").unwrap();
        assert_eq!(
            earliest_expiry(root.path()).unwrap().certificate,
            "admin.conf"
        );
    }
}
