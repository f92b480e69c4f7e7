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

/// Why the static Pods could not be restarted.
#[derive(Debug, thiserror::Error)]
pub enum StaticPodError {
    #[error("cannot list {dir}: {source}")]
    List {
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot move {from} to {to}: {source}; move it back by hand if it is missing")]
    Move {
        from: std::path::PathBuf,
        to: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Restarts the static Pods of the manifests in `manifests` as kubeadm's
/// documentation says to after a certificate renewal: the manifests move
/// out of the directory (next to it, so the move is a rename), the kubelet
/// stops their Pods within its file check period `wait`, and they move
/// back, so it starts them again with the new certificates. Returns the
/// manifests restarted.
pub async fn restart_static_pods(
    manifests: &Path,
    wait: std::time::Duration,
) -> Result<Vec<String>, StaticPodError> {
    let aside = manifests.with_file_name(RESTARTING);
    let moved = |from: &Path, to: &Path| {
        std::fs::rename(from, to).map_err(|source| StaticPodError::Move {
            from: from.to_owned(),
            to: to.to_owned(),
            source,
        })
    };
    let mut names: Vec<String> = std::fs::read_dir(manifests)
        .map_err(|source| StaticPodError::List {
            dir: manifests.to_owned(),
            source,
        })?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    std::fs::create_dir_all(&aside).map_err(|source| StaticPodError::List {
        dir: aside.clone(),
        source,
    })?;
    for n in &names {
        moved(&manifests.join(n), &aside.join(n))?;
    }
    tokio::time::sleep(wait).await;
    for n in &names {
        moved(&aside.join(n), &manifests.join(n))?;
    }
    let _ = std::fs::remove_dir(&aside);
    Ok(names)
}

/// Puts back the manifests a restart interrupted by the agent's own end
/// left out of `manifests`, so the control plane comes back.
pub fn recover_static_pods(manifests: &Path) {
    let aside = manifests.with_file_name(RESTARTING);
    let Ok(entries) = std::fs::read_dir(&aside) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let to = manifests.join(e.file_name());
        match std::fs::rename(e.path(), &to) {
            Ok(()) => {
                tracing::warn!(manifest = %to.display(), "put back a static Pod manifest an interrupted restart left out")
            }
            Err(err) => {
                tracing::error!(manifest = %to.display(), error = %err, "cannot put back a static Pod manifest an interrupted restart left out; move it back by hand")
            }
        }
    }
    let _ = std::fs::remove_dir(&aside);
}

/// Where manifests wait while their Pods restart, next to the manifests
/// directory.
const RESTARTING: &str = "drover-restarting-manifests";

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

    #[tokio::test(start_paused = true)]
    async fn static_pods_restart_by_moving_their_manifests_out_and_back() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("etc/kubernetes/manifests");
        std::fs::create_dir_all(&dir).unwrap();
        for n in ["etcd.yaml", "kube-apiserver.yaml"] {
            std::fs::write(dir.join(n), n).unwrap();
        }
        let restart = tokio::spawn({
            let dir = dir.clone();
            async move { restart_static_pods(&dir, std::time::Duration::from_secs(20)).await }
        });
        // While the kubelet's file check period runs, the manifests are out.
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        let restarted = restart.await.unwrap().unwrap();
        assert_eq!(restarted, ["etcd.yaml", "kube-apiserver.yaml"]);
        assert_eq!(
            std::fs::read_to_string(dir.join("kube-apiserver.yaml")).unwrap(),
            "kube-apiserver.yaml"
        );
        assert!(!root
            .path()
            .join("etc/kubernetes/drover-restarting-manifests")
            .exists());
    }

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
