//! PKI helpers: certificate authorities, leaf certificates and CSR signing,
//! all with ECDSA P-256 keys (kubeadm accepts them with
//! `encryptionAlgorithm: ECDSA-P256`, and rcgen covers every certificate
//! Drover makes with them).

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

/// Errors from certificate handling, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot generate a key pair: {0}")]
    KeyGen(rcgen::Error),
    #[error("cannot read the private key of {what}: {source}")]
    BadKey { what: String, source: rcgen::Error },
    #[error("cannot read the certificate of {what}: {detail}")]
    BadCert { what: String, detail: String },
    #[error("cannot read the certificate signing request: {0}")]
    BadCsr(rcgen::Error),
    #[error("cannot sign a certificate for {subject}: {source}")]
    Sign {
        subject: String,
        source: rcgen::Error,
    },
    /// A PEM document without a readable certificate.
    #[error(transparent)]
    Pem(#[from] crate::pem::PemError),
}

impl PkiError {
    /// Signing the certificate for `subject` failed.
    fn sign(subject: &str, source: rcgen::Error) -> Self {
        Self::Sign {
            subject: subject.to_owned(),
            source,
        }
    }
}

/// A certificate authority: its certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CertificateAuthority {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafUsage {
    Server,
    Client,
}

/// Parameters of a leaf certificate.
#[derive(Debug, Clone)]
pub struct LeafSpec {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<std::net::IpAddr>,
    pub usage: LeafUsage,
    pub validity: Duration,
}

impl LeafSpec {
    /// A certificate for `localhost` and 127.0.0.1, valid for an hour: a
    /// service on loopback, as tests and local tools run one.
    pub fn loopback(common_name: &str, usage: LeafUsage) -> Self {
        Self {
            common_name: common_name.into(),
            organizations: vec![],
            dns_names: vec!["localhost".into()],
            ip_addresses: vec![std::net::Ipv4Addr::LOCALHOST.into()],
            usage,
            validity: Duration::hours(1),
        }
    }
}

/// An issued leaf certificate and, when the CA generated the key, its key.
#[derive(Clone)]
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: Option<String>,
    pub not_after: OffsetDateTime,
}

impl CertificateAuthority {
    /// Generates a self-signed CA valid for ten years, with CA:TRUE and
    /// keyCertSign as kubeadm requires.
    pub fn generate(common_name: &str) -> Result<Self, PkiError> {
        let key = KeyPair::generate().map_err(PkiError::KeyGen)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::minutes(5);
        params.not_after = now + Duration::days(3650);
        let cert = params
            .self_signed(&key)
            .map_err(|source| PkiError::sign(common_name, source))?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The DER bytes of the CA certificate.
    pub fn cert_der(&self) -> Vec<u8> {
        first_cert_der(&self.cert_pem).expect("CA certificate PEM was produced by this module")
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>, PkiError> {
        let key = KeyPair::from_pem(&self.key_pem).map_err(|source| PkiError::BadKey {
            what: "the certificate authority".into(),
            source,
        })?;
        Issuer::from_ca_cert_pem(&self.cert_pem, key).map_err(|e| PkiError::BadCert {
            what: "the certificate authority".into(),
            detail: e.to_string(),
        })
    }

    /// Issues a leaf certificate with a freshly generated key.
    pub fn issue(&self, spec: &LeafSpec) -> Result<IssuedCert, PkiError> {
        let key = KeyPair::generate().map_err(PkiError::KeyGen)?;
        let params = leaf_params(spec)?;
        let not_after = params.not_after;
        let cert = params
            .signed_by(&key, &self.issuer()?)
            .map_err(|source| PkiError::sign(&spec.common_name, source))?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: Some(key.serialize_pem()),
            not_after,
        })
    }

    /// Signs a CSR's public key into a certificate described by `spec`. Only
    /// the key is taken from the CSR: subject, names and usage come from the
    /// caller, so a machine cannot ask for an identity it was not given.
    pub fn sign_csr(&self, csr_pem: &str, spec: &LeafSpec) -> Result<IssuedCert, PkiError> {
        let mut csr =
            CertificateSigningRequestParams::from_pem(csr_pem).map_err(PkiError::BadCsr)?;
        csr.params = leaf_params(spec)?;
        let not_after = csr.params.not_after;
        let cert = csr
            .signed_by(&self.issuer()?)
            .map_err(|source| PkiError::sign(&spec.common_name, source))?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: None,
            not_after,
        })
    }
}

fn dn(common_name: &str, organizations: &[String]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for o in organizations {
        dn.push(DnType::OrganizationName, o.as_str());
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

/// Names a leaf certificate (the subject alternative names `dns_names` and
/// `ip_addresses`, with the authority key identifier) and dates it as
/// kubeadm does: backdated by five minutes, valid for `validity` from now.
/// Err: a DNS name that is no IA5 string, and why.
pub fn name_and_date_leaf(
    params: &mut CertificateParams,
    dns_names: &[String],
    ip_addresses: &[std::net::IpAddr],
    validity: Duration,
) -> Result<(), (String, rcgen::Error)> {
    for name in dns_names {
        let ia5 = name
            .clone()
            .try_into()
            .map_err(|source| (name.clone(), source))?;
        params.subject_alt_names.push(SanType::DnsName(ia5));
    }
    for ip in ip_addresses {
        params.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    params.use_authority_key_identifier_extension = true;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + validity;
    Ok(())
}

fn leaf_params(spec: &LeafSpec) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(&spec.common_name, &spec.organizations);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![match spec.usage {
        LeafUsage::Server => ExtendedKeyUsagePurpose::ServerAuth,
        LeafUsage::Client => ExtendedKeyUsagePurpose::ClientAuth,
    }];
    name_and_date_leaf(
        &mut params,
        &spec.dns_names,
        &spec.ip_addresses,
        spec.validity,
    )
    .map_err(|(_, source)| PkiError::sign(&spec.common_name, source))?;
    let mut serial = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut serial);
    serial[0] &= 0x7f;
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
    Ok(params)
}

/// Generates a new ECDSA P-256 key and a CSR for it, returning `(key_pem, csr_pem)`.
pub fn generate_key_and_csr(common_name: &str) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(PkiError::KeyGen)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(common_name, &[]);
    let csr = params
        .serialize_request(&key)
        .map_err(|source| PkiError::sign(common_name, source))?;
    let csr_pem = csr
        .pem()
        .map_err(|source| PkiError::sign(common_name, source))?;
    Ok((key.serialize_pem(), csr_pem))
}

/// The DER bytes of the first certificate in a PEM document.
pub fn first_cert_der(pem: &str) -> Result<Vec<u8>, PkiError> {
    Ok(crate::pem::first_cert_der(pem)?)
}

/// The DER bytes of every certificate in a PEM document, in order.
pub fn all_cert_ders(pem: &str) -> Result<Vec<Vec<u8>>, PkiError> {
    Ok(crate::pem::all_cert_ders(pem)?)
}

/// Facts read from a certificate.
#[derive(Debug, Clone)]
pub struct CertInfo {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub not_after: OffsetDateTime,
    pub is_ca: bool,
    /// The `sha256:` pin of the certificate's public key.
    pub public_key_pin: String,
}

/// Reads the subject, expiry and CA flag of a DER certificate.
pub fn cert_info(der: &[u8]) -> Result<CertInfo, PkiError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| PkiError::BadCert {
        what: "a certificate".into(),
        detail: e.to_string(),
    })?;
    let subject = cert.subject();
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_owned();
    let organizations = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Ok(CertInfo {
        common_name,
        organizations,
        not_after: cert.validity().not_after.to_datetime(),
        is_ca: cert.is_ca(),
        public_key_pin: crate::pin::CaPin::from_spki_der(cert.public_key().raw).to_string(),
    })
}

/// Generates the service-account signing key pair kubeadm expects as
/// `sa.key` / `sa.pub`, returning `(private_pem, public_pem)`.
pub fn generate_service_account_key() -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(PkiError::KeyGen)?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_signs_csr_with_its_own_subject() {
        let ca = CertificateAuthority::generate("test-ca").unwrap();
        let info = cert_info(&ca.cert_der()).unwrap();
        assert!(info.is_ca);
        let (_key, csr) = generate_key_and_csr("i-want-to-be-admin").unwrap();
        let issued = ca
            .sign_csr(
                &csr,
                &LeafSpec {
                    common_name: "machine-123".into(),
                    organizations: vec!["drover:machines".into()],
                    dns_names: vec![],
                    ip_addresses: vec![],
                    usage: LeafUsage::Client,
                    validity: Duration::hours(24),
                },
            )
            .unwrap();
        let info = cert_info(&first_cert_der(&issued.cert_pem).unwrap()).unwrap();
        assert_eq!(info.common_name, "machine-123");
        assert_eq!(info.organizations, vec!["drover:machines".to_string()]);
        assert!(!info.is_ca);
    }
}
