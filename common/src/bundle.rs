//! Config bundles: everything a machine needs to run kubeadm, signed by the
//! coordinator CA key so the agent can check it came from the coordinator it
//! pinned, whatever carried it.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;
use time::OffsetDateTime;

use crate::objects::{MachineFileContent, MachineRole};

/// A file to write on the machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BundleFile {
    /// Absolute path on the machine (under the agent's root).
    pub path: String,
    /// Unix permission bits.
    pub mode: u32,
    pub content: String,
}

/// The content of a config bundle.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigBundle {
    pub machine_uid: String,
    pub cluster: String,
    pub role: MachineRole,
    /// The assignment generation this bundle is for.
    pub generation: u64,
    pub kubernetes_version: String,
    /// Files to write before kubeadm runs, the kubeadm config among them.
    pub files: Vec<BundleFile>,
    /// Path of the kubeadm config file within `files`.
    pub kubeadm_config_path: String,
    /// The files the cluster's spec puts on this machine (`spec.files` and
    /// its pool's), written before kubeadm with the mode and owner given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machine_files: Vec<MachineFileContent>,
    /// Shell commands run in order after the files are written, before
    /// kubeadm.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_kubeadm_commands: Vec<String>,
    /// Shell commands run in order once kubeadm succeeded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_kubeadm_commands: Vec<String>,
    /// Whether the node image's CNI config (`/usr/share/drover/cni/net.d`)
    /// is installed into `/etc/cni/net.d` before kubeadm runs
    /// (`spec.network.cni: image`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub image_cni: bool,
    /// The names of the cluster's addons (`spec.addons`): manifests the
    /// coordinator applies through a control plane, whose Pods run on the
    /// cluster's machines. An agent that refuses customisation refuses a
    /// bundle that names any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addons: Vec<String>,
    /// For the init machine of a cluster being restored: the etcd snapshot
    /// it restores before `kubeadm init`. An agent that does not know this
    /// field refuses the bundle, rather than initialize a new cluster.
    pub restore: Option<crate::wire::EtcdRestore>,
    #[serde(with = "time::serde::rfc3339")]
    pub issued_at: OffsetDateTime,
}

/// A bundle as sent: its JSON text and an ECDSA P-256 signature over it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignedBundle {
    pub payload: String,
    /// Base64 ASN.1 ECDSA-P256-SHA256 signature of `payload`.
    pub signature: String,
}

/// Why a bundle could not be signed or verified.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("cannot load the signing key: {0}")]
    Key(String),
    #[error("cannot sign the bundle")]
    Sign,
    #[error("bundle signature does not verify against the pinned coordinator CA")]
    BadSignature,
    #[error("bundle payload is malformed: {0}")]
    Malformed(String),
    #[error("bundle is for machine {got}, this machine is {expected}")]
    WrongMachine { expected: String, got: String },
}

/// Signs a bundle with a PEM ECDSA P-256 private key.
pub fn sign(bundle: &ConfigBundle, key_pem: &str) -> Result<SignedBundle, BundleError> {
    let key = rcgen::KeyPair::from_pem(key_pem).map_err(|e| BundleError::Key(e.to_string()))?;
    let rng = SystemRandom::new();
    let pair = EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        &key.serialize_der(),
        &rng,
    )
    .map_err(|e| BundleError::Key(e.to_string()))?;
    let payload =
        serde_json::to_string(bundle).map_err(|e| BundleError::Malformed(e.to_string()))?;
    let sig = pair
        .sign(&rng, payload.as_bytes())
        .map_err(|_| BundleError::Sign)?;
    Ok(SignedBundle {
        payload,
        signature: STANDARD.encode(sig.as_ref()),
    })
}

/// Verifies a signed bundle against the signer's certificate (DER) and checks
/// it is for `machine_uid`.
pub fn verify(
    signed: &SignedBundle,
    signer_cert_der: &[u8],
    machine_uid: &str,
) -> Result<ConfigBundle, BundleError> {
    let (_, cert) = x509_parser::parse_x509_certificate(signer_cert_der)
        .map_err(|e| BundleError::Key(e.to_string()))?;
    let point = cert.public_key().subject_public_key.data.to_vec();
    let sig = STANDARD
        .decode(&signed.signature)
        .map_err(|_| BundleError::BadSignature)?;
    UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, point)
        .verify(signed.payload.as_bytes(), &sig)
        .map_err(|_| BundleError::BadSignature)?;
    let bundle: ConfigBundle =
        serde_json::from_str(&signed.payload).map_err(|e| BundleError::Malformed(e.to_string()))?;
    if bundle.machine_uid != machine_uid {
        return Err(BundleError::WrongMachine {
            expected: machine_uid.to_owned(),
            got: bundle.machine_uid,
        });
    }
    Ok(bundle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::CertificateAuthority;

    fn bundle() -> ConfigBundle {
        ConfigBundle {
            machine_uid: "m1".into(),
            cluster: "c".into(),
            role: MachineRole::Worker,
            generation: 1,
            kubernetes_version: "v1.31.2".into(),
            files: vec![],
            kubeadm_config_path: "/etc/drover/kubeadm.yaml".into(),
            machine_files: vec![],
            pre_kubeadm_commands: vec![],
            post_kubeadm_commands: vec![],
            image_cni: false,
            addons: vec![],
            restore: None,
            issued_at: crate::now(),
        }
    }

    #[test]
    fn sign_and_verify() {
        let ca = CertificateAuthority::generate("c").unwrap();
        let signed = sign(&bundle(), &ca.key_pem).unwrap();
        assert_eq!(verify(&signed, &ca.cert_der(), "m1").unwrap(), {
            let mut b = bundle();
            b.issued_at = verify(&signed, &ca.cert_der(), "m1").unwrap().issued_at;
            b
        });
        assert!(matches!(
            verify(&signed, &ca.cert_der(), "m2"),
            Err(BundleError::WrongMachine { .. })
        ));
        let other = CertificateAuthority::generate("o").unwrap();
        assert!(matches!(
            verify(&signed, &other.cert_der(), "m1"),
            Err(BundleError::BadSignature)
        ));
        let mut tampered = signed.clone();
        tampered.payload = tampered.payload.replace("worker", "init");
        assert!(matches!(
            verify(&tampered, &ca.cert_der(), "m1"),
            Err(BundleError::BadSignature)
        ));
    }
}
