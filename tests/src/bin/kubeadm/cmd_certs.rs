//! `kubeadm certs renew all` and `kubeadm certs check-expiration`: the leaf
//! certificates under the certificates directory and the client
//! certificates of the kubeconfigs kubeadm wrote, re-issued by their CAs
//! with a new key for the cluster's validity period (the CAs are not
//! renewed). As with real kubeadm, the components must be restarted to use
//! them, except the API server, which reloads its serving certificate.

use std::net::IpAddr;

use anyhow::{anyhow, Context, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use time::{Duration, OffsetDateTime};

use crate::certs::{issue, load_ca, subject, write_leaf, EncryptionAlgorithm, LeafSpec};
use crate::util::{write_file, Root};

/// A certificate `certs renew all` renews.
struct Renewed {
    /// What `check-expiration` calls it.
    name: &'static str,
    /// Its file: a base under the certificates directory, or a kubeconfig
    /// under `/etc/kubernetes`.
    file: File,
    /// The base of the CA that signs it.
    ca: &'static str,
    /// What kubeadm says when it renews it.
    long_name: &'static str,
}

enum File {
    Leaf(&'static str),
    Kubeconfig(&'static str),
}

/// In kubeadm's order.
const RENEWED: &[Renewed] = &[
    Renewed {
        name: "admin.conf",
        file: File::Kubeconfig("admin.conf"),
        ca: "ca",
        long_name: "certificate embedded in the kubeconfig file for the admin to use and for kubeadm itself",
    },
    Renewed {
        name: "super-admin.conf",
        file: File::Kubeconfig("super-admin.conf"),
        ca: "ca",
        long_name: "certificate embedded in the kubeconfig file for the super-admin",
    },
    Renewed {
        name: "apiserver",
        file: File::Leaf("apiserver"),
        ca: "ca",
        long_name: "certificate for serving the Kubernetes API",
    },
    Renewed {
        name: "apiserver-etcd-client",
        file: File::Leaf("apiserver-etcd-client"),
        ca: "etcd/ca",
        long_name: "certificate the apiserver uses to access etcd",
    },
    Renewed {
        name: "apiserver-kubelet-client",
        file: File::Leaf("apiserver-kubelet-client"),
        ca: "ca",
        long_name: "certificate for the API server to connect to kubelet",
    },
    Renewed {
        name: "controller-manager.conf",
        file: File::Kubeconfig("controller-manager.conf"),
        ca: "ca",
        long_name: "certificate embedded in the kubeconfig file for the controller manager to use",
    },
    Renewed {
        name: "etcd-healthcheck-client",
        file: File::Leaf("etcd/healthcheck-client"),
        ca: "etcd/ca",
        long_name: "certificate for liveness probes to healthcheck etcd",
    },
    Renewed {
        name: "etcd-peer",
        file: File::Leaf("etcd/peer"),
        ca: "etcd/ca",
        long_name: "certificate for etcd nodes to communicate with each other",
    },
    Renewed {
        name: "etcd-server",
        file: File::Leaf("etcd/server"),
        ca: "etcd/ca",
        long_name: "certificate for serving etcd",
    },
    Renewed {
        name: "front-proxy-client",
        file: File::Leaf("front-proxy-client"),
        ca: "front-proxy-ca",
        long_name: "certificate for the front proxy client",
    },
    Renewed {
        name: "scheduler.conf",
        file: File::Kubeconfig("scheduler.conf"),
        ca: "ca",
        long_name: "certificate embedded in the kubeconfig file for the scheduler manager to use",
    },
];

/// What renewal needs of the cluster's configuration.
pub struct RenewSettings {
    pub cert_dir: String,
    pub alg: EncryptionAlgorithm,
    pub validity: Duration,
}

impl RenewSettings {
    /// From the ClusterConfiguration this node keeps a copy of (kubeadm
    /// reads it from the cluster), `--cert-dir` winning.
    pub fn load(root: &Root, cert_dir: Option<String>) -> Result<Self> {
        let yaml = crate::store::load_local_cluster_config(root).ok_or_else(|| {
            anyhow!("this node has no ClusterConfiguration: it is not a control plane of a cluster kubeadm init or join --control-plane made")
        })?;
        let cc: serde_json::Value =
            serde_saphyr::from_str(&yaml).context("the ClusterConfiguration does not parse")?;
        let validity = match cc["certificateValidityPeriod"].as_str() {
            Some(d) => {
                let d = crate::util::parse_go_duration_std(d)
                    .context("ClusterConfiguration.certificateValidityPeriod")?;
                Duration::try_from(d).map_err(|e| anyhow!("certificateValidityPeriod: {e}"))?
            }
            None => Duration::days(365),
        };
        Ok(Self {
            cert_dir: cert_dir
                .or_else(|| cc["certificatesDir"].as_str().map(str::to_owned))
                .unwrap_or_else(|| drover_common::kubeadm::CERTIFICATES_DIR.to_owned()),
            alg: EncryptionAlgorithm::parse(cc["encryptionAlgorithm"].as_str().unwrap_or(""))?,
            validity,
        })
    }
}

/// `kubeadm certs renew all`.
pub fn renew_all(root: &Root, s: &RenewSettings) -> Result<()> {
    for r in RENEWED {
        let renewed = match r.file {
            File::Leaf(base) => renew_leaf(root, s, base, r.ca)?,
            File::Kubeconfig(file) => renew_kubeconfig(root, s, file, r.ca)?,
        };
        if renewed {
            println!("{} renewed", r.long_name);
        } else {
            println!("MISSING! {}", r.long_name);
        }
    }
    println!("\nDone renewing certificates. You must restart the kube-apiserver, kube-controller-manager, kube-scheduler and etcd, so that they can use the new certificates.");
    Ok(())
}

/// `kubeadm certs check-expiration`: each certificate's expiry.
pub fn check_expiration(root: &Root, s: &RenewSettings) -> Result<()> {
    println!(
        "{:<26} {:<24} {:<15} {:<23} EXTERNALLY MANAGED",
        "CERTIFICATE", "EXPIRES", "RESIDUAL TIME", "CERTIFICATE AUTHORITY"
    );
    let now = OffsetDateTime::now_utc();
    for r in RENEWED {
        let pem = match r.file {
            File::Leaf(base) => {
                std::fs::read_to_string(root.path(format!("{}/{base}.crt", s.cert_dir))).ok()
            }
            File::Kubeconfig(file) => {
                std::fs::read_to_string(root.path(format!("/etc/kubernetes/{file}")))
                    .ok()
                    .and_then(|t| kubeconfig_client(&t).ok())
                    .map(|(cert, _)| cert)
            }
        };
        let Some(pem) = pem else {
            println!("!MISSING! {}", r.name);
            continue;
        };
        let der =
            drover_common::pki::first_cert_der(&pem).map_err(|e| anyhow!("{}: {e}", r.name))?;
        let info = drover_common::pki::cert_info(&der).map_err(|e| anyhow!("{}: {e}", r.name))?;
        let left = info.not_after - now;
        let residual = if left.is_negative() {
            "<invalid>".to_owned()
        } else if left.whole_days() > 0 {
            format!("{}d", left.whole_days())
        } else {
            format!("{}h", left.whole_hours())
        };
        let format = time::macros::format_description!(
            "[month repr:short] [day], [year] [hour]:[minute] UTC"
        );
        println!(
            "{:<26} {:<24} {:<15} {:<23} no",
            r.name,
            info.not_after.format(&format).unwrap_or_default(),
            residual,
            r.ca.replace('/', "-"),
        );
    }
    Ok(())
}

/// Re-issues `<cert_dir>/<base>.crt` (and a new key) with its subject,
/// names and usages; false when it is not there.
fn renew_leaf(root: &Root, s: &RenewSettings, base: &str, ca: &str) -> Result<bool> {
    let logical = format!("{}/{base}.crt", s.cert_dir);
    let Ok(pem) = std::fs::read_to_string(root.path(&logical)) else {
        return Ok(false);
    };
    let spec = leaf_spec(&pem).with_context(|| format!("cannot renew {logical}"))?;
    let ca = load_ca(root, &s.cert_dir, ca, ca, s.alg)?;
    let issued = issue(&ca, &spec, s.alg, s.validity)?;
    write_leaf(root, &s.cert_dir, base, &issued)?;
    Ok(true)
}

/// Re-issues the client certificate embedded in `/etc/kubernetes/<file>`;
/// false when the file is not there.
fn renew_kubeconfig(root: &Root, s: &RenewSettings, file: &str, ca: &str) -> Result<bool> {
    let logical = format!("/etc/kubernetes/{file}");
    let path = root.path(&logical);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(false);
    };
    let (cert_pem, key_pem) =
        kubeconfig_client(&text).with_context(|| format!("cannot renew {logical}"))?;
    let mut spec = leaf_spec(&cert_pem).with_context(|| format!("cannot renew {logical}"))?;
    spec.server = false;
    spec.client = true;
    let ca = load_ca(root, &s.cert_dir, ca, ca, s.alg)?;
    let issued = issue(&ca, &spec, s.alg, s.validity)?;
    let renewed = text
        .replace(&B64.encode(&cert_pem), &B64.encode(&issued.cert_pem))
        .replace(&B64.encode(&key_pem), &B64.encode(&issued.key_pem));
    write_file(&path, renewed.as_bytes(), 0o600)?;
    Ok(true)
}

/// The client certificate and key (PEM) embedded in a kubeconfig.
fn kubeconfig_client(text: &str) -> Result<(String, String)> {
    let doc: serde_json::Value = serde_saphyr::from_str(text).context("invalid kubeconfig")?;
    let user = &doc["users"][0]["user"];
    let data = |key: &str| -> Result<String> {
        let b64 = user[key]
            .as_str()
            .ok_or_else(|| anyhow!("the kubeconfig's user has no {key}"))?;
        let bytes = B64
            .decode(b64)
            .with_context(|| format!("{key} is not base64"))?;
        String::from_utf8(bytes).with_context(|| format!("{key} is not PEM"))
    };
    Ok((data("client-certificate-data")?, data("client-key-data")?))
}

/// What a certificate was issued for: its subject, names and usages.
fn leaf_spec(pem: &str) -> Result<LeafSpec> {
    let der = drover_common::pki::first_cert_der(pem).map_err(|e| anyhow!("{e}"))?;
    let (cn, orgs) = subject(&der).ok_or_else(|| anyhow!("unreadable certificate"))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| anyhow!("unreadable certificate: {e}"))?;
    let mut dns = vec![];
    let mut ips = vec![];
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(d) => dns.push((*d).to_owned()),
                x509_parser::extensions::GeneralName::IPAddress(b) => {
                    let ip: Option<IpAddr> = match b.len() {
                        4 => <[u8; 4]>::try_from(*b).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*b).ok().map(IpAddr::from),
                        _ => None,
                    };
                    ips.extend(ip);
                }
                _ => {}
            }
        }
    }
    let eku = cert.extended_key_usage().ok().flatten().map(|e| e.value);
    Ok(LeafSpec {
        cn,
        orgs,
        dns,
        ips,
        server: eku.is_some_and(|e| e.server_auth),
        client: eku.is_some_and(|e| e.client_auth),
    })
}
