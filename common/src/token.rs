//! kubeadm bootstrap tokens: `[a-z0-9]{6}\.[a-z0-9]{16}`.
//!
//! The format is checked exactly as kubeadm checks it
//! (`BootstrapTokenPattern` in kubeadm's bootstraputil), because a token that
//! kubeadm later refuses would fail a join long after the coordinator minted it.

use std::fmt;
use std::str::FromStr;

use rand::Rng;

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
const ID_LEN: usize = 6;
const SECRET_LEN: usize = 16;

/// A parsed, well-formed kubeadm bootstrap token.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    id: String,
    secret: String,
}

/// Why a string is not a kubeadm bootstrap token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenFormatError {
    #[error("bootstrap token must look like `abcdef.0123456789abcdef` (6 and 16 characters of [a-z0-9] joined by a dot); it has no dot")]
    MissingDot,
    #[error("bootstrap token id must be exactly 6 characters of [a-z0-9], got {0} characters")]
    IdLength(usize),
    #[error(
        "bootstrap token secret must be exactly 16 characters of [a-z0-9], got {0} characters"
    )]
    SecretLength(usize),
    #[error("bootstrap token may contain only lowercase letters and digits, found {0:?}")]
    BadCharacter(char),
}

impl BootstrapToken {
    /// Generates a fresh random token from the operating system's CSPRNG.
    pub fn generate() -> Self {
        let mut rng = rand::rng();
        let mut pick = |n: usize| -> String {
            (0..n)
                .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
                .collect()
        };
        let id = pick(ID_LEN);
        let secret = pick(SECRET_LEN);
        Self { id, secret }
    }

    /// The public token id (the part before the dot).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The token secret (the part after the dot).
    pub fn secret(&self) -> &str {
        &self.secret
    }
}

impl FromStr for BootstrapToken {
    type Err = TokenFormatError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (id, secret) = s.split_once('.').ok_or(TokenFormatError::MissingDot)?;
        if let Some(c) = s
            .chars()
            .find(|c| *c != '.' && !(c.is_ascii() && ALPHABET.contains(&(*c as u8))))
        {
            return Err(TokenFormatError::BadCharacter(c));
        }
        if id.len() != ID_LEN {
            return Err(TokenFormatError::IdLength(id.len()));
        }
        if secret.len() != SECRET_LEN {
            return Err(TokenFormatError::SecretLength(secret.len()));
        }
        if secret.contains('.') {
            return Err(TokenFormatError::BadCharacter('.'));
        }
        Ok(Self {
            id: id.to_owned(),
            secret: secret.to_owned(),
        })
    }
}

impl fmt::Display for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.id, self.secret)
    }
}

impl fmt::Debug for BootstrapToken {
    /// Never prints the secret, so tokens are safe in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BootstrapToken({}.<redacted>)", self.id)
    }
}

// OpenAPI and serde: a string in kubeadm's bootstrap token format.
string_type_serde!(
    BootstrapToken,
    pattern: r"^[a-z0-9]{6}\.[a-z0-9]{16}$",
    description: "A kubeadm bootstrap token: 6 and 16 characters of [a-z0-9] joined by a dot.",
    example: "abcdef.0123456789abcdef",
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_parse_back() {
        for _ in 0..200 {
            let t = BootstrapToken::generate();
            let s = t.to_string();
            assert_eq!(s.len(), 23);
            let back: BootstrapToken = s.parse().unwrap();
            assert_eq!(back, t);
        }
    }

    #[test]
    fn kubeadm_examples() {
        // Accepted and refused examples mirror kubeadm's token tests.
        assert!("abcdef.0123456789abcdef".parse::<BootstrapToken>().is_ok());
        assert_eq!(
            "abcdef:0123456789abcdef".parse::<BootstrapToken>(),
            Err(TokenFormatError::MissingDot)
        );
        assert_eq!(
            "abcde.0123456789abcdef".parse::<BootstrapToken>(),
            Err(TokenFormatError::IdLength(5))
        );
        assert_eq!(
            "abcdef.0123456789abcde".parse::<BootstrapToken>(),
            Err(TokenFormatError::SecretLength(15))
        );
        assert_eq!(
            "Abcdef.0123456789abcdef".parse::<BootstrapToken>(),
            Err(TokenFormatError::BadCharacter('A'))
        );
        assert_eq!(
            "abcdef.0123456789abcdef.x".parse::<BootstrapToken>(),
            Err(TokenFormatError::BadCharacter('.')).or(Err(TokenFormatError::SecretLength(18)))
        );
    }

    #[test]
    fn fuzzer_findings_are_refused() {
        // Found by fuzz/fuzz_targets/bootstrap_token.rs: a dot in the secret
        // and a non-ASCII character whose low byte is a letter.
        assert!("94kj75.t.tr2u5ayut0415m".parse::<BootstrapToken>().is_err());
        assert!("abcdef................".parse::<BootstrapToken>().is_err());
        assert_eq!(
            "abcd\u{161}.0123456789abcdef".parse::<BootstrapToken>(),
            Err(TokenFormatError::BadCharacter('\u{161}'))
        );
    }

    #[test]
    fn debug_redacts_secret() {
        let t: BootstrapToken = "abcdef.0123456789abcdef".parse().unwrap();
        assert_eq!(format!("{t:?}"), "BootstrapToken(abcdef.<redacted>)");
    }
}
