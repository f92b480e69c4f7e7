//! TLS for the agent.
//!
//! Before registration the agent trusts nothing but the CA pin from its
//! bootstrap document: [`PinnedCaVerifier`] finds the certificate in the
//! server's chain whose public key matches the pin, then verifies the server
//! certificate against it as the only root (signature, validity, host name).
//! After registration the coordinator CA received at registration is the only
//! root, and the agent presents its client certificate.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use drover_common::pin::CaPin;
use drover_common::tls_verify::{CheckedVerifier, PresentedCert, ServerCertCheck};
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, OtherError, RootCertStore};

/// The one crypto provider the agent uses, chosen explicitly.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what}: {detail}")]
    Pem { what: &'static str, detail: String },
    #[error("{what} holds no certificate")]
    NoCertificate { what: &'static str },
    #[error("cannot use {what} as a trust root: {detail}")]
    Root { what: &'static str, detail: String },
    #[error("cannot build the TLS configuration: {0}")]
    Config(String),
}

/// The server's chain holds no certificate matching the pin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PinMismatch {
    pub pinned: CaPin,
    /// Pins of the certificates the server presented, server certificate
    /// first; the coordinator sends its CA last.
    pub presented: Vec<CaPin>,
}

impl fmt::Display for PinMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the coordinator's CA does not match the pinned {}: ",
            self.pinned
        )?;
        match self.presented.as_slice() {
            [] => write!(f, "the server presented no certificate")?,
            [only] => write!(
                f,
                "the server presented only its own certificate, with pin {only}"
            )?,
            [.., ca] => write!(
                f,
                "the server presented a CA with pin {ca} ({} certificates in its chain)",
                self.presented.len()
            )?,
        }
        write!(
            f,
            "; check caPin in the bootstrap document (refusing to talk to this server)"
        )
    }
}

/// Trusts only the CA matching a pin: the certificate of the server's
/// chain whose public key matches, as the only root.
#[derive(Debug)]
pub struct PinnedCa(pub CaPin);

/// A server certificate verifier that trusts only the CA matching a pin.
pub type PinnedCaVerifier = CheckedVerifier<PinnedCa>;

impl ServerCertCheck for PinnedCa {
    fn check(&self, presented: PresentedCert<'_>) -> Result<ServerCertVerified, rustls::Error> {
        let PresentedCert {
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
            provider,
        } = presented;
        let chain = || std::iter::once(end_entity).chain(intermediates);
        let Some(ca) = chain().find(|c| self.0.matches_cert_der(c)) else {
            let mismatch = PinMismatch {
                pinned: self.0.clone(),
                presented: chain()
                    .filter_map(|c| CaPin::from_cert_der(c).ok())
                    .collect(),
            };
            return Err(rustls::Error::Other(OtherError(Arc::new(mismatch))));
        };
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        verifier.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }
}

/// Finds a [`PinMismatch`] anywhere in an error's chain, looking inside
/// `io::Error` and `rustls::Error` wrappers, which hide their payload from
/// `source()`.
pub fn find_pin_mismatch(err: &(dyn StdError + 'static)) -> Option<PinMismatch> {
    let mut next: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = next {
        if let Some(m) = e.downcast_ref::<PinMismatch>() {
            return Some(m.clone());
        }
        if let Some(rustls::Error::Other(OtherError(inner))) = e.downcast_ref::<rustls::Error>() {
            if let Some(m) = find_pin_mismatch(inner.as_ref()) {
                return Some(m);
            }
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(inner) = io.get_ref() {
                if let Some(m) = find_pin_mismatch(inner) {
                    return Some(m);
                }
            }
        }
        next = e.source();
    }
    None
}

fn builder() -> Result<rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier>, TlsError> {
    ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))
}

/// The configuration used before registration: only the pinned CA is trusted,
/// and no client certificate is presented.
pub fn pinned_config(pin: &CaPin) -> Result<ClientConfig, TlsError> {
    Ok(builder()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedCaVerifier::new(
            PinnedCa(pin.clone()),
            provider(),
        )))
        .with_no_client_auth())
}

/// The configuration for object storage reached through a presigned URL:
/// the system's trust roots (`rustls-native-certs` reads the distribution's
/// bundle, or `SSL_CERT_FILE`), no client certificate.
pub fn system_roots_config() -> Result<ClientConfig, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map_or("none found".to_owned(), |e| e.to_string());
        return Err(TlsError::Root {
            what: "the system's trust roots",
            detail: why,
        });
    }
    Ok(builder()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Parses every certificate of a PEM document.
pub fn certs_from_pem(
    pem: &str,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { what });
    }
    Ok(certs)
}

fn roots_from_pem(pem: &str, what: &'static str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certs_from_pem(pem, what)? {
        roots.add(cert).map_err(|e| TlsError::Root {
            what,
            detail: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// The mutual-TLS configuration used after registration: the coordinator CA
/// is the only root, and the agent presents its client certificate.
pub fn mtls_config(
    coordinator_ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<ClientConfig, TlsError> {
    mtls_config_with(coordinator_verifier(coordinator_ca_pem)?, cert_pem, key_pem)
}

/// A server certificate verifier trusting only the coordinator CA, which
/// many client configurations can share (the fleet simulator builds one for
/// all its machines).
pub fn coordinator_verifier(
    coordinator_ca_pem: &str,
) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
    let roots = roots_from_pem(coordinator_ca_pem, "the coordinator CA certificate")?;
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))
}

/// [`mtls_config`] with a verifier from [`coordinator_verifier`].
pub fn mtls_config_with(
    verifier: Arc<WebPkiServerVerifier>,
    cert_pem: &str,
    key_pem: &str,
) -> Result<ClientConfig, TlsError> {
    let chain = certs_from_pem(cert_pem, "the client certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| TlsError::Pem {
        what: "the client key",
        detail: e.to_string(),
    })?;
    builder()?
        .with_webpki_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))
}

/// A configuration trusting only the CA certificates of a PEM document.
pub fn trust_only_config(ca_pem: &str, what: &'static str) -> Result<ClientConfig, TlsError> {
    Ok(builder()?
        .with_root_certificates(roots_from_pem(ca_pem, what)?)
        .with_no_client_auth())
}

/// A configuration trusting nothing, for clients that only speak plain HTTP
/// (reqwest needs some TLS configuration to build a client).
pub fn trust_nothing_config() -> Result<ClientConfig, TlsError> {
    Ok(builder()?
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth())
}

/// A client for one endpoint on this machine (the kubelet, the API server,
/// etcd) over `config`: no proxy, one idle connection kept, `timeout` for
/// each request.
pub fn local_client(
    config: ClientConfig,
    timeout: std::time::Duration,
) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .timeout(timeout)
        .no_proxy()
        .pool_max_idle_per_host(1)
        .build()
}

/// A client kept until the credentials it was built from change (a reset
/// and a new cluster bring new ones).
#[derive(Debug, Default)]
pub struct CachedClient {
    cached: Option<(Vec<u8>, reqwest::Client)>,
}

impl CachedClient {
    /// The client built from the credentials in `files`, read now and
    /// built again by `build` (with their contents, in order) when they
    /// are not those of the kept client. A file that cannot be read is
    /// `unreadable`'s error.
    pub fn built_from_files<E>(
        &mut self,
        files: &[std::path::PathBuf],
        unreadable: impl Fn(std::path::PathBuf, std::io::Error) -> E,
        build: impl FnOnce(&[Vec<u8>]) -> Result<reqwest::Client, E>,
    ) -> Result<reqwest::Client, E> {
        let contents = files
            .iter()
            .map(|p| std::fs::read(p).map_err(|e| unreadable(p.clone(), e)))
            .collect::<Result<Vec<_>, E>>()?;
        let credentials = contents.concat();
        if let Some((kept, client)) = &self.cached {
            if *kept == credentials {
                return Ok(client.clone());
            }
        }
        let client = build(&contents)?;
        self.cached = Some((credentials, client.clone()));
        Ok(client)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use drover_common::pki::{CertificateAuthority, LeafSpec, LeafUsage};
    use rustls::pki_types::{ServerName, UnixTime};

    pub(crate) fn server_leaf(ca: &CertificateAuthority) -> (String, String) {
        let issued = ca
            .issue(&LeafSpec::loopback("coordinator", LeafUsage::Server))
            .unwrap();
        (issued.cert_pem, issued.key_pem.unwrap())
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        certs_from_pem(pem, "test").unwrap().remove(0)
    }

    fn verify(
        pin: &CaPin,
        leaf: &CertificateDer<'_>,
        rest: &[CertificateDer<'_>],
        name: &str,
    ) -> Result<ServerCertVerified, rustls::Error> {
        PinnedCaVerifier::new(PinnedCa(pin.clone()), provider()).verify_server_cert(
            leaf,
            rest,
            &ServerName::try_from(name.to_owned()).unwrap(),
            &[],
            UnixTime::now(),
        )
    }

    #[test]
    fn pinned_verifier_accepts_matching_ca() {
        let ca = CertificateAuthority::generate("coordinator-ca").unwrap();
        let pin = CaPin::from_cert_der(&ca.cert_der()).unwrap();
        let (leaf, _) = server_leaf(&ca);
        let ca_der = der(&ca.cert_pem);
        verify(
            &pin,
            &der(&leaf),
            std::slice::from_ref(&ca_der),
            "localhost",
        )
        .unwrap();
        verify(
            &pin,
            &der(&leaf),
            std::slice::from_ref(&ca_der),
            "127.0.0.1",
        )
        .unwrap();
        // The pin only selects the root; the host name is still checked.
        let err = verify(&pin, &der(&leaf), &[ca_der], "example.com").unwrap_err();
        assert!(
            matches!(err, rustls::Error::InvalidCertificate(_)),
            "{err:?}"
        );
    }

    #[test]
    fn pinned_verifier_refuses_other_ca_with_message() {
        let ca = CertificateAuthority::generate("coordinator-ca").unwrap();
        let other = CertificateAuthority::generate("someone-else").unwrap();
        let pinned = CaPin::from_cert_der(&other.cert_der()).unwrap();
        let presented = CaPin::from_cert_der(&ca.cert_der()).unwrap();
        let (leaf, _) = server_leaf(&ca);
        let err = verify(&pinned, &der(&leaf), &[der(&ca.cert_pem)], "localhost").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!(
                "the coordinator's CA does not match the pinned {pinned}"
            )),
            "{text}"
        );
        assert!(text.contains(&presented.to_string()), "{text}");
        let mismatch = find_pin_mismatch(&err).expect("mismatch is found in the error");
        assert_eq!(mismatch.pinned, pinned);
        assert_eq!(mismatch.presented.last(), Some(&presented));

        // Wrapped the way tokio-rustls and hyper wrap it, it is still found.
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, err);
        assert_eq!(find_pin_mismatch(&io), Some(mismatch));
    }

    #[test]
    fn leaf_signed_by_pinned_ca_but_sent_without_it_is_refused() {
        // A chain without the CA cannot prove anything about the pin.
        let ca = CertificateAuthority::generate("coordinator-ca").unwrap();
        let pin = CaPin::from_cert_der(&ca.cert_der()).unwrap();
        let (leaf, _) = server_leaf(&ca);
        let err = verify(&pin, &der(&leaf), &[], "localhost").unwrap_err();
        assert!(
            err.to_string().contains("only its own certificate"),
            "{err}"
        );
    }

    #[test]
    fn configs_build() {
        let ca = CertificateAuthority::generate("coordinator-ca").unwrap();
        let (leaf, key) = server_leaf(&ca);
        mtls_config(&ca.cert_pem, &leaf, &key).unwrap();
        trust_only_config(&ca.cert_pem, "ca").unwrap();
        assert!(matches!(
            trust_only_config("", "the cluster CA"),
            Err(TlsError::NoCertificate { .. })
        ));
        trust_nothing_config().unwrap();
    }
}
