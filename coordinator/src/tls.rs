//! The rustls crypto provider the coordinator's server, its store client
//! and the operator CLI all use.

use std::sync::Arc;

/// The crypto provider every rustls configuration of the coordinator (and its CLI) uses:
/// ring's, with TLS 1.3's AES-128-GCM-SHA256 suite first. Its key schedule
/// runs on SHA-256, which CPUs do in hardware (SHA-NI, ARMv8 SHA); ring's
/// default first suite, AES-256-GCM-SHA384, runs it on SHA-512 in software,
/// and a resumed handshake is mostly key schedule.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    let first = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    provider
        .cipher_suites
        .retain(|s| s.suite() != first.suite());
    provider.cipher_suites.insert(0, first);
    Arc::new(provider)
}

/// Why an HTTPS client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the CA certificate is not usable: {0}")]
    Ca(String),
    #[error("TLS setup: {0}")]
    Tls(#[from] rustls::Error),
    #[error("cannot build the HTTPS client: {0}")]
    Build(#[from] reqwest::Error),
}

/// An HTTPS client that trusts only the CA certificates in `ca_pem`, with
/// `timeout` for each request.
pub fn client_trusting(
    ca_pem: &[u8],
    timeout: std::time::Duration,
) -> Result<reqwest::Client, ClientError> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| ClientError::Ca(format!("not a PEM certificate: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| ClientError::Ca(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(ClientError::Ca("no PEM certificate in it".into()));
    }
    let tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(timeout)
        .build()?)
}
