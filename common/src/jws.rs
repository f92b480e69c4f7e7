//! Detached JWS signatures as kubeadm uses them for the `cluster-info`
//! ConfigMap: HS256 keyed by the bootstrap token's secret, header exactly
//! `{"alg":"HS256","kid":"<token id>"}`, payload omitted from the output.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The JWS header kubeadm writes for the token `token_id`.
fn header_for(token_id: &str) -> String {
    format!(r#"{{"alg":"HS256","kid":"{token_id}"}}"#)
}

/// The HMAC of the signing input `header_b64.payload_b64` for `content`,
/// keyed with the token's secret.
fn mac_over(header_b64: &str, content: &str, token_secret: &str) -> HmacSha256 {
    let payload_b64 = URL_SAFE_NO_PAD.encode(content.as_bytes());
    let mut mac =
        HmacSha256::new_from_slice(token_secret.as_bytes()).expect("HMAC accepts any key length");
    mac.update(header_b64.as_bytes());
    mac.update(b".");
    mac.update(payload_b64.as_bytes());
    mac
}

/// Signs `content` for the token `token_id` with its `token_secret`, returning
/// `header..signature` (the detached compact serialization).
pub fn sign_detached(content: &str, token_id: &str, token_secret: &str) -> String {
    let header_b64 = URL_SAFE_NO_PAD.encode(header_for(token_id).as_bytes());
    let mac = mac_over(&header_b64, content, token_secret);
    let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{header_b64}..{sig}")
}

/// Why a detached JWS did not verify.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JwsError {
    #[error("detached JWS must have the form `header..signature`")]
    Malformed,
    #[error("JWS header is not the one kubeadm writes for token id {0:?}")]
    WrongHeader(String),
    #[error("JWS signature does not match the content for token id {0:?}")]
    BadSignature(String),
}

/// Verifies a detached JWS the way kubeadm's discovery does: the header must
/// name the token id and the signature must match in constant time.
pub fn verify_detached(
    content: &str,
    jws: &str,
    token_id: &str,
    token_secret: &str,
) -> Result<(), JwsError> {
    let mut parts = jws.split('.');
    let (Some(header_b64), Some(""), Some(sig_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwsError::Malformed);
    };
    let header = URL_SAFE_NO_PAD
        .decode(header_b64)
        .map_err(|_| JwsError::Malformed)?;
    if header != header_for(token_id).as_bytes() {
        return Err(JwsError::WrongHeader(token_id.to_owned()));
    }
    let sig = URL_SAFE_NO_PAD
        .decode(sig_b64)
        .map_err(|_| JwsError::Malformed)?;
    mac_over(header_b64, content, token_secret)
        .verify_slice(&sig)
        .map_err(|_| JwsError::BadSignature(token_id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTENT: &str = "Hello from the other side. I must have called a thousand times.";
    const EXPECTED: &str =
        "eyJhbGciOiJIUzI1NiIsImtpZCI6Impvc2h1YSJ9..VShe2taLd-YTrmWuRkcL_8QTNDHYxQIEBsAYYiIj1_8";

    #[test]
    fn kubeadm_test_vector() {
        assert_eq!(
            sign_detached(CONTENT, "joshua", "my voice is my passcode"),
            EXPECTED
        );
        verify_detached(CONTENT, EXPECTED, "joshua", "my voice is my passcode").unwrap();
    }

    #[test]
    fn verification_refuses_tampering() {
        assert_eq!(
            verify_detached(CONTENT, EXPECTED, "joshua", "wrong secret"),
            Err(JwsError::BadSignature("joshua".into()))
        );
        assert_eq!(
            verify_detached(
                "other content",
                EXPECTED,
                "joshua",
                "my voice is my passcode"
            ),
            Err(JwsError::BadSignature("joshua".into()))
        );
        assert_eq!(
            verify_detached(CONTENT, EXPECTED, "abcdef", "my voice is my passcode"),
            Err(JwsError::WrongHeader("abcdef".into()))
        );
        assert_eq!(
            verify_detached(CONTENT, "nodots", "joshua", "x"),
            Err(JwsError::Malformed)
        );
    }
}
