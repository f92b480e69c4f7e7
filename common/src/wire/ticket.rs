//! Join tickets: short-lived, signed statements from the coordinator that a
//! machine may register.
//!
//! A ticket is `dt1.<claims>.<mac>`: the claims are base64url JSON and the MAC
//! is HMAC-SHA256 under a key only the coordinator holds. Only the coordinator
//! ever verifies tickets, so a symmetric key is enough and keeps them short
//! (user data is limited to 16 KiB on EC2). A ticket carries no secret of its
//! own: it is worth something only until it is redeemed or expires.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

const PREFIX: &str = "dt1";
/// The longest ticket the coordinator will look at.
pub const MAX_TICKET_LEN: usize = 4096;

/// What a ticket entitles its holder to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
pub enum TicketGrant {
    /// Register into a machine pool under a registration token.
    #[serde(rename_all = "camelCase")]
    PoolRegistration {
        /// The registration token this ticket was issued under.
        token_id: String,
        /// The pool a machine registering with it joins.
        pool: String,
        /// The token's UID: a ticket of a deleted token does not work for
        /// another made later under the same name. Absent in tickets
        /// issued before tokens could be named (their names were random).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token_uid: Option<String>,
    },
    /// Register as one specific machine the coordinator created.
    #[serde(rename_all = "camelCase")]
    Machine {
        cluster: String,
        machine: String,
        machine_uid: String,
        /// The role the machine was created for.
        role: crate::objects::MachineRole,
    },
}

/// The signed content of a ticket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TicketClaims {
    pub grant: TicketGrant,
    /// Unix seconds.
    pub issued_at: i64,
    /// Unix seconds; the ticket is refused at and after this instant.
    pub expires_at: i64,
    /// Random, unique per ticket; recorded when a single-use ticket is redeemed.
    pub nonce: String,
}

/// A ticket signing key.
#[derive(Clone)]
pub struct TicketKey(Vec<u8>);

/// Why a ticket was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TicketError {
    #[error("ticket is longer than {MAX_TICKET_LEN} bytes")]
    TooLong,
    #[error(
        "ticket is malformed: {0}; copy the whole bootstrap document from `drover token create`"
    )]
    Malformed(&'static str),
    #[error("ticket signature is invalid: it was not issued by this coordinator or was altered")]
    BadSignature,
    #[error("ticket expired at {expired_at} (unix seconds); create a new one with `drover token create`")]
    Expired { expired_at: i64 },
}

impl TicketKey {
    /// A fresh random 256-bit key.
    pub fn generate() -> Self {
        let mut k = vec![0u8; 32];
        rand::rng().fill_bytes(&mut k);
        Self(k)
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Signs claims into a compact ticket string.
    pub fn sign(&self, claims: &TicketClaims) -> String {
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).expect("claims serialize"));
        let signed = format!("{PREFIX}.{body}");
        let mac = self.mac(signed.as_bytes());
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(mac))
    }

    /// Verifies a ticket's signature and expiry at `now` (unix seconds).
    pub fn verify(&self, ticket: &str, now: i64) -> Result<TicketClaims, TicketError> {
        if ticket.len() > MAX_TICKET_LEN {
            return Err(TicketError::TooLong);
        }
        let (signed, mac_b64) = ticket
            .rsplit_once('.')
            .ok_or(TicketError::Malformed("missing signature"))?;
        let (prefix, body) = signed
            .split_once('.')
            .ok_or(TicketError::Malformed("missing claims"))?;
        if prefix != PREFIX {
            return Err(TicketError::Malformed("unknown ticket version"));
        }
        let mac = URL_SAFE_NO_PAD
            .decode(mac_b64)
            .map_err(|_| TicketError::Malformed("signature is not base64url"))?;
        let mut verifier =
            HmacSha256::new_from_slice(&self.0).expect("HMAC accepts any key length");
        verifier.update(signed.as_bytes());
        verifier
            .verify_slice(&mac)
            .map_err(|_| TicketError::BadSignature)?;
        let json = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| TicketError::Malformed("claims are not base64url"))?;
        let claims: TicketClaims = serde_json::from_slice(&json)
            .map_err(|_| TicketError::Malformed("claims are not valid"))?;
        if now >= claims.expires_at {
            return Err(TicketError::Expired {
                expired_at: claims.expires_at,
            });
        }
        Ok(claims)
    }

    fn mac(&self, data: &[u8]) -> Vec<u8> {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC accepts any key length");
        m.update(data);
        m.finalize().into_bytes().to_vec()
    }
}

/// A random nonce for a new ticket.
pub fn new_nonce() -> String {
    let mut n = [0u8; 16];
    rand::rng().fill_bytes(&mut n);
    hex::encode(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(exp: i64) -> TicketClaims {
        TicketClaims {
            grant: TicketGrant::PoolRegistration {
                token_id: "tok1".into(),
                pool: "default".into(),
                token_uid: Some("uid-1".into()),
            },
            issued_at: 100,
            expires_at: exp,
            nonce: new_nonce(),
        }
    }

    #[test]
    fn round_trip() {
        let k = TicketKey::generate();
        let c = claims(1000);
        let t = k.sign(&c);
        assert!(t.starts_with("dt1."));
        assert_eq!(k.verify(&t, 500).unwrap(), c);
    }

    #[test]
    fn expired_refused() {
        let k = TicketKey::generate();
        let t = k.sign(&claims(1000));
        assert_eq!(
            k.verify(&t, 1000),
            Err(TicketError::Expired { expired_at: 1000 })
        );
    }

    #[test]
    fn forged_refused() {
        let k = TicketKey::generate();
        let other = TicketKey::generate();
        let t = other.sign(&claims(1000));
        assert_eq!(k.verify(&t, 0), Err(TicketError::BadSignature));
        // Altering the claims of a genuine ticket breaks the signature.
        let genuine = k.sign(&claims(1000));
        let (_, rest) = genuine.split_once('.').unwrap();
        let (_, mac) = rest.split_once('.').unwrap();
        let mut forged_claims = claims(i64::MAX);
        forged_claims.nonce = "x".into();
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged_claims).unwrap());
        assert_eq!(
            k.verify(&format!("dt1.{body}.{mac}"), 0),
            Err(TicketError::BadSignature)
        );
        assert!(matches!(
            k.verify("garbage", 0),
            Err(TicketError::Malformed(_))
        ));
        assert_eq!(k.verify(&"a".repeat(5000), 0), Err(TicketError::TooLong));
    }
}
