//! CA public-key pins in kubeadm's format: `sha256:` followed by the lowercase
//! hex SHA-256 of the certificate's DER-encoded SubjectPublicKeyInfo.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// A parsed `sha256:<64 hex>` public-key pin.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CaPin([u8; 32]);

/// Why a pin could not be parsed or computed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PinError {
    #[error("CA pin must start with `sha256:` (kubeadm's --discovery-token-ca-cert-hash format), got {0:?}")]
    MissingPrefix(String),
    #[error("CA pin must have 64 lowercase hex characters after `sha256:`, got {0} characters")]
    BadLength(usize),
    #[error("CA pin must be lowercase hex after `sha256:`: {0}")]
    BadHex(String),
    #[error("cannot read the certificate to pin: {0}")]
    BadCertificate(String),
}

impl CaPin {
    /// Pins a DER-encoded SubjectPublicKeyInfo.
    pub fn from_spki_der(spki: &[u8]) -> Self {
        Self(Sha256::digest(spki).into())
    }

    /// Pins the public key of a DER-encoded X.509 certificate.
    pub fn from_cert_der(cert: &[u8]) -> Result<Self, PinError> {
        let (_, parsed) = x509_parser::parse_x509_certificate(cert)
            .map_err(|e| PinError::BadCertificate(e.to_string()))?;
        Ok(Self::from_spki_der(parsed.public_key().raw))
    }

    /// Pins the public key of the first certificate in a PEM document.
    pub fn from_cert_pem(pem: &str) -> Result<Self, PinError> {
        let der =
            crate::pem::first_cert_der(pem).map_err(|e| PinError::BadCertificate(e.to_string()))?;
        Self::from_cert_der(&der)
    }

    /// Whether this pin matches a DER-encoded certificate.
    pub fn matches_cert_der(&self, cert: &[u8]) -> bool {
        Self::from_cert_der(cert).is_ok_and(|p| p == *self)
    }
}

impl FromStr for CaPin {
    type Err = PinError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex_part = s
            .strip_prefix("sha256:")
            .ok_or_else(|| PinError::MissingPrefix(s.chars().take(16).collect()))?;
        if hex_part.len() != 64 {
            return Err(PinError::BadLength(hex_part.len()));
        }
        if hex_part.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(PinError::BadHex("uppercase letters are not allowed".into()));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).map_err(|e| PinError::BadHex(e.to_string()))?;
        Ok(Self(out))
    }
}

impl fmt::Display for CaPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for CaPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

// OpenAPI and serde: a string in kubeadm's `--discovery-token-ca-cert-hash` format.
string_type_serde!(
    CaPin,
    pattern: r"^sha256:[0-9a-f]{64}$",
    description: "`sha256:` and the lowercase hex SHA-256 of the CA certificate's DER SubjectPublicKeyInfo.",
    example: "sha256:0000000000000000000000000000000000000000000000000000000000000000",
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_is_sha256_of_spki_not_of_certificate() {
        let ca = crate::pki::CertificateAuthority::generate("pin-test").unwrap();
        let der = ca.cert_der();
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        let spki = parsed.public_key().raw;
        let pin = CaPin::from_cert_der(&der).unwrap();
        assert_eq!(
            pin.to_string(),
            format!("sha256:{}", hex::encode(Sha256::digest(spki)))
        );
        assert_ne!(
            pin.to_string(),
            format!("sha256:{}", hex::encode(Sha256::digest(&der)))
        );
        // Hashing empty input, the mistake the `openssl rsa -pubin` recipe makes
        // for ECDSA keys, must never produce the pin.
        assert_ne!(pin, CaPin::from_spki_der(&[]));
        assert!(pin.matches_cert_der(&der));
    }

    #[test]
    fn known_spki_vector() {
        // SHA-256 of the empty string, a fixed vector for the hex encoding.
        assert_eq!(
            CaPin::from_spki_der(b"").to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn parse_rules() {
        let good = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(good.parse::<CaPin>().unwrap().to_string(), good);
        assert!(matches!(
            good.replace("sha256:", "md5:").parse::<CaPin>(),
            Err(PinError::MissingPrefix(_))
        ));
        assert_eq!("sha256:abcd".parse::<CaPin>(), Err(PinError::BadLength(4)));
        assert!(matches!(
            good.to_uppercase()
                .replace("SHA256:", "sha256:")
                .parse::<CaPin>(),
            Err(PinError::BadHex(_))
        ));
        assert!(matches!(
            good.replace('e', "z").parse::<CaPin>(),
            Err(PinError::BadHex(_))
        ));
    }
}
