//! Certificates out of PEM documents, for `pin` and `pki`. A leaf: it
//! imports nothing of this crate.

/// Why a PEM document yields no certificate.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("cannot read the certificate of a PEM document: {0}")]
    Bad(String),
    #[error("PEM document holds no certificate")]
    NoCertificate,
}

/// The DER bytes of the first certificate in a PEM document.
pub fn first_cert_der(pem: &str) -> Result<Vec<u8>, PemError> {
    all_cert_ders(pem)?
        .into_iter()
        .next()
        .ok_or(PemError::NoCertificate)
}

/// The DER bytes of every certificate in a PEM document, in order.
pub fn all_cert_ders(pem: &str) -> Result<Vec<Vec<u8>>, PemError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|r| {
            r.map(|c| c.to_vec())
                .map_err(|e| PemError::Bad(e.to_string()))
        })
        .collect()
}
