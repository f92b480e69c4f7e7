//! Certificates and keys: checking the pre-provisioned shared CA set the way
//! kubeadm would use it, issuing the leaf certificates kubeadm derives, and
//! writing and reading kubeconfig files.

use std::net::IpAddr;

use anyhow::{anyhow, bail, Context, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use drover_common::kubeadm::SHARED_CA_FILES;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, SubjectPublicKeyInfoDer};
use time::{Duration, OffsetDateTime};
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

use crate::util::{write_file, Root};

/// `ClusterConfiguration.encryptionAlgorithm` (v1beta4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncryptionAlgorithm {
    EcdsaP256,
    EcdsaP384,
    Rsa(usize),
}

impl EncryptionAlgorithm {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            // kubeadm's default.
            "" | "RSA-2048" => Self::Rsa(2048),
            "RSA-3072" => Self::Rsa(3072),
            "RSA-4096" => Self::Rsa(4096),
            "ECDSA-P256" => Self::EcdsaP256,
            "ECDSA-P384" => Self::EcdsaP384,
            other => bail!(
                "ClusterConfiguration.encryptionAlgorithm: Unsupported value: {other:?}: supported values: \"ECDSA-P256\", \"ECDSA-P384\", \"RSA-2048\", \"RSA-3072\", \"RSA-4096\""
            ),
        })
    }

    fn name(self) -> String {
        match self {
            Self::EcdsaP256 => "ECDSA-P256".into(),
            Self::EcdsaP384 => "ECDSA-P384".into(),
            Self::Rsa(bits) => format!("RSA-{bits}"),
        }
    }

    /// The algorithm for keys the stand-in generates. ring cannot generate
    /// RSA keys, so RSA clusters get P-256 leaf keys signed by their RSA CAs.
    fn leaf_alg(self) -> &'static rcgen::SignatureAlgorithm {
        match self {
            Self::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            _ => &rcgen::PKCS_ECDSA_P256_SHA256,
        }
    }

    fn accepts(self, kind: &KeyKind) -> bool {
        match (self, kind) {
            (Self::EcdsaP256, KeyKind::EcP256) | (Self::EcdsaP384, KeyKind::EcP384) => true,
            (Self::Rsa(_), KeyKind::Rsa(bits)) => *bits >= 2048,
            _ => false,
        }
    }
}

/// The type of a public key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    EcP256,
    EcP384,
    Rsa(usize),
    Ed25519,
    Other(String),
}

impl std::fmt::Display for KeyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::EcP256 => write!(f, "ECDSA P-256"),
            Self::EcP384 => write!(f, "ECDSA P-384"),
            Self::Rsa(bits) => write!(f, "RSA-{bits}"),
            Self::Ed25519 => write!(f, "Ed25519"),
            Self::Other(oid) => write!(f, "unsupported key algorithm {oid}"),
        }
    }
}

fn spki_kind(spki: &SubjectPublicKeyInfo<'_>) -> KeyKind {
    let alg = spki.algorithm.algorithm.to_id_string();
    match alg.as_str() {
        "1.2.840.10045.2.1" => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|o| o.to_id_string())
                .unwrap_or_default();
            match curve.as_str() {
                "1.2.840.10045.3.1.7" => KeyKind::EcP256,
                "1.3.132.0.34" => KeyKind::EcP384,
                other => KeyKind::Other(format!("EC curve {other}")),
            }
        }
        "1.2.840.113549.1.1.1" => {
            let bits = spki.parsed().map(|k| k.key_size()).unwrap_or(0);
            KeyKind::Rsa(bits)
        }
        "1.3.101.112" => KeyKind::Ed25519,
        other => KeyKind::Other(other.to_owned()),
    }
}

fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .iter()
            .copied()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

fn wrap_pkcs8(alg_id: &[u8], inner: &[u8]) -> Vec<u8> {
    let mut body = der_tlv(0x02, &[0]);
    body.extend_from_slice(alg_id);
    body.extend(der_tlv(0x04, inner));
    der_tlv(0x30, &body)
}

const ALG_RSA: &[u8] = &[
    0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
];
const ALG_EC_P256: &[u8] = &[
    0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48,
    0xce, 0x3d, 0x03, 0x01, 0x07,
];
const ALG_EC_P384: &[u8] = &[
    0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b, 0x81, 0x04,
    0x00, 0x22,
];

/// Loads a private key in any of the PEM forms kubeadm reads: PKCS#8
/// (`PRIVATE KEY`), PKCS#1 (`RSA PRIVATE KEY`) or SEC1 (`EC PRIVATE KEY`).
pub fn load_key(pem: &str, what: &str) -> Result<KeyPair> {
    let der = PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| anyhow!("{what} is not a PEM private key: {e}"))?;
    let unreadable = || anyhow!("{what}: unsupported or malformed private key");
    match &der {
        PrivateKeyDer::Pkcs8(_) => KeyPair::try_from(&der).map_err(|e| {
            anyhow!(
                "{what}: cannot read the private key ({e}); kubeadm supports RSA and ECDSA keys"
            )
        }),
        PrivateKeyDer::Pkcs1(k) => {
            let p8 = wrap_pkcs8(ALG_RSA, k.secret_pkcs1_der());
            KeyPair::try_from(p8.as_slice()).map_err(|_| unreadable())
        }
        PrivateKeyDer::Sec1(k) => {
            let sec1 = k.secret_sec1_der();
            [ALG_EC_P256, ALG_EC_P384]
                .iter()
                .find_map(|alg| KeyPair::try_from(wrap_pkcs8(alg, sec1).as_slice()).ok())
                .ok_or_else(unreadable)
        }
        _ => Err(unreadable()),
    }
}

fn key_kind(key: &KeyPair) -> KeyKind {
    let spki = key.subject_public_key_info();
    match SubjectPublicKeyInfo::from_der(&spki) {
        Ok((_, parsed)) => spki_kind(&parsed),
        Err(_) => KeyKind::Other("unparseable".into()),
    }
}

/// A loaded certificate authority from the shared set.
pub struct Ca {
    pub cert_pem: String,
    pub cert_der: Vec<u8>,
    pub key: KeyPair,
}

impl Ca {
    fn issuer(&self) -> Result<Issuer<'_, &KeyPair>> {
        Issuer::from_ca_cert_der(&CertificateDer::from(self.cert_der.clone()), &self.key)
            .map_err(|e| anyhow!("cannot use the CA as issuer: {e}"))
    }
}

/// The three CAs and the service-account key pair of the shared set.
pub struct SharedCaSet {
    pub ca: Ca,
    pub front_proxy: Ca,
    pub etcd: Ca,
}

/// Checks that `cert_dir` holds exactly the shared CA set (nothing missing,
/// nothing else) and that every piece is usable, then loads it.
pub fn check_shared_ca_set(
    root: &Root,
    cert_dir: &str,
    alg: EncryptionAlgorithm,
) -> Result<SharedCaSet> {
    // Nothing missing.
    for f in SHARED_CA_FILES {
        let logical = format!("{cert_dir}/{f}");
        if !root.path(&logical).is_file() {
            bail!(
                "the shared CA set is incomplete: {logical} is missing. Drover pre-provisions exactly {} in {cert_dir}; kubeadm derives every other certificate from them",
                SHARED_CA_FILES.join(", ")
            );
        }
    }
    // Nothing else.
    let mut extra = Vec::new();
    collect_files(&root.path(cert_dir), "", &mut extra)?;
    extra.retain(|f| !SHARED_CA_FILES.contains(&f.as_str()));
    extra.sort();
    if let Some(first) = extra.first() {
        bail!(
            "unexpected file {cert_dir}/{first} in the certificates dir{}: only the shared CA set ({}) may be pre-provisioned; a leftover from an earlier run? (kubeadm reset cleans {cert_dir})",
            if extra.len() > 1 {
                format!(" (and {} more: {})", extra.len() - 1, extra[1..].join(", "))
            } else {
                String::new()
            },
            SHARED_CA_FILES.join(", ")
        );
    }
    let load = |base: &str, name: &str| load_ca(root, cert_dir, base, name, alg);
    let set = SharedCaSet {
        ca: load("ca", "ca")?,
        front_proxy: load("front-proxy-ca", "front-proxy-ca")?,
        etcd: load("etcd/ca", "etcd/ca")?,
    };
    check_sa_pair(root, cert_dir)?;
    Ok(set)
}

fn collect_files(dir: &std::path::Path, prefix: &str, out: &mut Vec<String>) -> Result<()> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
    };
    for entry in rd {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        if entry.file_type()?.is_dir() {
            collect_files(&entry.path(), &rel, out)?;
        } else {
            out.push(rel);
        }
    }
    Ok(())
}

/// Loads and checks one CA of the set: CA:TRUE, keyCertSign, valid now, key
/// type matching `encryptionAlgorithm`, key matching the certificate.
pub fn load_ca(
    root: &Root,
    cert_dir: &str,
    base: &str,
    name: &str,
    alg: EncryptionAlgorithm,
) -> Result<Ca> {
    let crt_logical = format!("{cert_dir}/{base}.crt");
    let key_logical = format!("{cert_dir}/{base}.key");
    let cert_pem = std::fs::read_to_string(root.path(&crt_logical)).with_context(|| {
        format!("failure loading {name} certificate authority: open {crt_logical}")
    })?;
    let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
        .map_err(|e| anyhow!("failure loading {name} certificate authority: {crt_logical} holds no PEM certificate: {e}"))?
        .to_vec();
    let (_, cert) = x509_parser::parse_x509_certificate(&cert_der)
        .map_err(|e| anyhow!("failure loading {name} certificate authority: {crt_logical}: {e}"))?;
    let bc = cert.basic_constraints().ok().flatten().map(|b| b.value.ca);
    if bc != Some(true) {
        bail!("{name} certificate authority {crt_logical} is not a CA: it lacks basicConstraints CA:TRUE");
    }
    let ku = cert
        .key_usage()
        .ok()
        .flatten()
        .map(|k| k.value.key_cert_sign());
    if ku != Some(true) {
        bail!("{name} certificate authority {crt_logical} lacks the keyCertSign key usage");
    }
    let now = OffsetDateTime::now_utc();
    let validity = cert.validity();
    if validity.not_after.to_datetime() < now || validity.not_before.to_datetime() > now {
        bail!(
            "{name} certificate authority {crt_logical} is not valid now (valid from {} to {})",
            validity.not_before,
            validity.not_after
        );
    }
    let cert_kind = spki_kind(cert.public_key());
    check_kind(&cert_kind, alg, &crt_logical)?;
    let key_pem = std::fs::read_to_string(root.path(&key_logical)).with_context(|| {
        format!("failure loading {name} certificate authority: open {key_logical}")
    })?;
    let key = load_key(&key_pem, &key_logical)?;
    check_kind(&key_kind(&key), alg, &key_logical)?;
    if key.der_bytes() != cert.public_key().subject_public_key.data.as_ref() {
        bail!("{name} certificate authority: the private key {key_logical} does not match the certificate {crt_logical}");
    }
    Ok(Ca {
        cert_pem,
        cert_der,
        key,
    })
}

fn check_kind(kind: &KeyKind, alg: EncryptionAlgorithm, what: &str) -> Result<()> {
    if *kind == KeyKind::Ed25519 {
        bail!("{what} holds an Ed25519 key; kubeadm supports only RSA and ECDSA keys");
    }
    if !alg.accepts(kind) {
        bail!(
            "{what} holds a {kind} key, but ClusterConfiguration.encryptionAlgorithm is {} (set encryptionAlgorithm to match the pre-provisioned keys)",
            alg.name()
        );
    }
    Ok(())
}

fn check_sa_pair(root: &Root, cert_dir: &str) -> Result<()> {
    let key_logical = format!("{cert_dir}/sa.key");
    let pub_logical = format!("{cert_dir}/sa.pub");
    let key_pem = std::fs::read_to_string(root.path(&key_logical))
        .with_context(|| format!("open {key_logical}"))?;
    let key = load_key(&key_pem, &key_logical)?;
    // kubeadm uses an existing service-account key of any supported type,
    // whatever encryptionAlgorithm says.
    match key_kind(&key) {
        KeyKind::EcP256 | KeyKind::EcP384 | KeyKind::Rsa(_) => {}
        other => bail!("{key_logical} holds a {other} key; kubeadm supports only RSA and ECDSA service-account keys"),
    }
    let pub_pem = std::fs::read_to_string(root.path(&pub_logical))
        .with_context(|| format!("open {pub_logical}"))?;
    let spki = SubjectPublicKeyInfoDer::from_pem_slice(pub_pem.as_bytes())
        .map_err(|e| anyhow!("{pub_logical} is not a PEM public key (\"PUBLIC KEY\"): {e}"))?;
    let (_, parsed) = SubjectPublicKeyInfo::from_der(spki.as_ref())
        .map_err(|e| anyhow!("{pub_logical}: malformed public key: {e}"))?;
    if parsed.subject_public_key.data.as_ref() != key.der_bytes() {
        bail!("the service account key pair does not match: {pub_logical} is not the public key of {key_logical}");
    }
    Ok(())
}

/// What a leaf certificate is for and who it names.
pub struct LeafSpec {
    pub cn: String,
    pub orgs: Vec<String>,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub server: bool,
    pub client: bool,
}

/// An issued certificate and its new key, both PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

fn leaf_params(spec: &LeafSpec, validity: Duration) -> Result<CertificateParams> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    for o in &spec.orgs {
        dn.push(DnType::OrganizationName, o.as_str());
    }
    dn.push(DnType::CommonName, spec.cn.as_str());
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    if spec.server {
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ServerAuth);
    }
    if spec.client {
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ClientAuth);
    }
    drover_common::pki::name_and_date_leaf(&mut params, &spec.dns, &spec.ips, validity)
        .map_err(|(d, e)| anyhow!("invalid DNS name {d:?}: {e}"))?;
    Ok(params)
}

/// Issues a leaf certificate with a fresh key signed by `ca`.
pub fn issue(
    ca: &Ca,
    spec: &LeafSpec,
    alg: EncryptionAlgorithm,
    validity: Duration,
) -> Result<Issued> {
    let key =
        KeyPair::generate_for(alg.leaf_alg()).map_err(|e| anyhow!("cannot generate a key: {e}"))?;
    let cert = leaf_params(spec, validity)?
        .signed_by(&key, &ca.issuer()?)
        .map_err(|e| anyhow!("cannot sign the certificate for {}: {e}", spec.cn))?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Issues and writes `<cert_dir>/<base>.crt` and `.key`.
pub fn write_leaf(root: &Root, cert_dir: &str, base: &str, issued: &Issued) -> Result<()> {
    write_file(
        &root.path(format!("{cert_dir}/{base}.crt")),
        issued.cert_pem.as_bytes(),
        0o644,
    )?;
    write_file(
        &root.path(format!("{cert_dir}/{base}.key")),
        issued.key_pem.as_bytes(),
        0o600,
    )
}

/// A kubeconfig with embedded CA data and, optionally, client credentials,
/// laid out as client-go's `clientcmd.Write` lays it out.
pub fn render_kubeconfig(
    cluster_name: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    creds: Option<&Issued>,
) -> String {
    let context = format!("{user}@{cluster_name}");
    let user_block = match creds {
        Some(c) => format!(
            "  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            B64.encode(c.cert_pem.as_bytes()),
            B64.encode(c.key_pem.as_bytes())
        ),
        None => "  user: {}\n".into(),
    };
    format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: {server}\n  name: {cluster_name}\ncontexts:\n- context:\n    cluster: {cluster_name}\n    user: {user}\n  name: {context}\ncurrent-context: {context}\nkind: Config\npreferences: {{}}\nusers:\n- name: {user}\n{user_block}",
        ca = B64.encode(ca_pem.as_bytes()),
    )
}

/// The kubeconfig kubeadm publishes in the `cluster-info` ConfigMap: one
/// unnamed cluster, no users.
pub fn render_cluster_info_kubeconfig(server: &str, ca_pem: &str) -> String {
    format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: {server}\n  name: \"\"\ncontexts: null\ncurrent-context: \"\"\nkind: Config\npreferences: {{}}\nusers: null\n",
        B64.encode(ca_pem.as_bytes())
    )
}

/// What a kubeconfig says about one cluster and user.
pub struct Kubeconfig {
    pub server: String,
    pub ca_pem: Option<String>,
    pub client_cert_pem: Option<String>,
    pub client_key_pem: Option<String>,
}

impl Kubeconfig {
    /// An HTTP client for this kubeconfig's API server, trusting `ca` (its
    /// CA) and presenting its client certificate when it holds one.
    pub fn http_client(&self, ca: &str, timeout: std::time::Duration) -> Result<reqwest::Client> {
        let creds = match (&self.client_cert_pem, &self.client_key_pem) {
            (Some(c), Some(k)) => Some((c.as_str(), k.as_str())),
            _ => None,
        };
        crate::net::http_client(crate::net::client_config(ca, creds)?, timeout)
    }

    /// The API server's URL, without a trailing `/`.
    pub fn server_url(&self) -> &str {
        self.server.trim_end_matches('/')
    }
}

/// Reads a kubeconfig (YAML or JSON): the current context's cluster and user,
/// or the first ones. File references resolve relative to `base_dir`.
pub fn parse_kubeconfig(text: &str, base_dir: Option<&std::path::Path>) -> Result<Kubeconfig> {
    let doc: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| anyhow!("invalid kubeconfig: {e}"))?;
    if doc.get("kind").and_then(|k| k.as_str()) != Some("Config") {
        bail!("invalid kubeconfig: kind must be Config");
    }
    let list = |key: &str| -> Vec<serde_json::Value> {
        doc.get(key)
            .and_then(|v| v.as_array())
            .cloned()
            .unwrap_or_default()
    };
    let clusters = list("clusters");
    let users = list("users");
    let contexts = list("contexts");
    let current = doc
        .get("current-context")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let ctx = contexts
        .iter()
        .find(|c| c.get("name").and_then(|n| n.as_str()) == Some(current))
        .and_then(|c| c.get("context"));
    let pick = |items: &[serde_json::Value], field: &str, key: &str| -> Option<serde_json::Value> {
        let wanted = ctx.and_then(|c| c.get(key)).and_then(|v| v.as_str());
        let item = match wanted {
            Some(w) => items
                .iter()
                .find(|i| i.get("name").and_then(|n| n.as_str()) == Some(w)),
            None => items.first(),
        };
        item.and_then(|i| i.get(field)).cloned()
    };
    let cluster = pick(&clusters, "cluster", "cluster")
        .ok_or_else(|| anyhow!("invalid kubeconfig: no cluster"))?;
    let user = pick(&users, "user", "user").unwrap_or(serde_json::Value::Null);
    let data_or_file =
        |obj: &serde_json::Value, data_key: &str, file_key: &str| -> Result<Option<String>> {
            if let Some(d) = obj.get(data_key).and_then(|v| v.as_str()) {
                let bytes = B64
                    .decode(d.trim())
                    .map_err(|e| anyhow!("invalid kubeconfig: {data_key} is not base64: {e}"))?;
                return Ok(Some(String::from_utf8(bytes).map_err(|_| {
                    anyhow!("invalid kubeconfig: {data_key} is not PEM text")
                })?));
            }
            if let Some(f) = obj.get(file_key).and_then(|v| v.as_str()) {
                let path = match base_dir {
                    Some(b) if !f.starts_with('/') => b.join(f),
                    _ => std::path::PathBuf::from(f),
                };
                return Ok(Some(
                    std::fs::read_to_string(&path).with_context(|| format!("open {f}"))?,
                ));
            }
            Ok(None)
        };
    let server = cluster
        .get("server")
        .and_then(|v| v.as_str())
        .ok_or_else(|| anyhow!("invalid kubeconfig: cluster has no server"))?
        .to_owned();
    Ok(Kubeconfig {
        server,
        ca_pem: data_or_file(
            &cluster,
            "certificate-authority-data",
            "certificate-authority",
        )?,
        client_cert_pem: data_or_file(&user, "client-certificate-data", "client-certificate")?,
        client_key_pem: data_or_file(&user, "client-key-data", "client-key")?,
    })
}

/// Subject CN and organizations of a DER certificate.
pub fn subject(der: &[u8]) -> Option<(String, Vec<String>)> {
    let info = drover_common::pki::cert_info(der).ok()?;
    Some((info.common_name, info.organizations))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_forms_load() {
        let k = KeyPair::generate().unwrap();
        let pem = k.serialize_pem();
        let back = load_key(&pem, "k").unwrap();
        assert_eq!(back.der_bytes(), k.der_bytes());
        assert_eq!(key_kind(&back), KeyKind::EcP256);
        let k384 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        assert_eq!(
            key_kind(&load_key(&k384.serialize_pem(), "k").unwrap()),
            KeyKind::EcP384
        );
        assert!(load_key("garbage", "k").is_err());
    }

    #[test]
    fn kubeconfig_round_trip() {
        let ca = drover_common::pki::CertificateAuthority::generate("ca").unwrap();
        let creds = Issued {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        };
        let text = render_kubeconfig(
            "kubernetes",
            "https://10.0.0.1:6443",
            &ca.cert_pem,
            "kubernetes-admin",
            Some(&creds),
        );
        let kc = parse_kubeconfig(&text, None).unwrap();
        assert_eq!(kc.server, "https://10.0.0.1:6443");
        assert_eq!(kc.ca_pem.as_deref(), Some(ca.cert_pem.as_str()));
        assert_eq!(kc.client_cert_pem.as_deref(), Some("CERT"));
        let ci = render_cluster_info_kubeconfig("https://x:1", &ca.cert_pem);
        let kc = parse_kubeconfig(&ci, None).unwrap();
        assert_eq!(kc.server, "https://x:1");
        assert!(kc.client_cert_pem.is_none());
    }
}
