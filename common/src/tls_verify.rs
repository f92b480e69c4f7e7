//! A rustls server certificate verifier made of two halves: the handshake
//! signatures are checked with the crypto provider's algorithms, always;
//! the server certificate is left to a [`ServerCertCheck`], so that a
//! verifier trusting a pinned CA and one accepting any certificate differ
//! only in that check.

use std::fmt::Debug;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// What the server presented in a handshake, as rustls hands it to
/// [`ServerCertVerifier::verify_server_cert`].
pub struct PresentedCert<'a> {
    pub end_entity: &'a CertificateDer<'a>,
    pub intermediates: &'a [CertificateDer<'a>],
    pub server_name: &'a ServerName<'a>,
    pub ocsp_response: &'a [u8],
    pub now: UnixTime,
    /// The verifier's crypto provider.
    pub provider: &'a Arc<CryptoProvider>,
}

/// Decides whether a server certificate is trusted.
pub trait ServerCertCheck: Debug + Send + Sync {
    fn check(&self, presented: PresentedCert<'_>) -> Result<ServerCertVerified, rustls::Error>;
}

/// A verifier trusting what `C` trusts, with handshake signatures checked
/// by the provider.
#[derive(Debug)]
pub struct CheckedVerifier<C> {
    check: C,
    provider: Arc<CryptoProvider>,
}

impl<C> CheckedVerifier<C> {
    pub fn new(check: C, provider: Arc<CryptoProvider>) -> Self {
        Self { check, provider }
    }
}

impl<C: ServerCertCheck> ServerCertVerifier for CheckedVerifier<C> {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = PresentedCert {
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
            provider: &self.provider,
        };
        self.check.check(presented)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
