//! Encryption of secrets at rest: AES-256-GCM under a key-encryption key the
//! operator keeps outside the store (a file or the environment).
//!
//! Every secret record is sealed with the primary key; its key id, nonce and
//! the record's kind and name (as associated data, so sealed records cannot
//! be swapped) are bound in. Older keys stay in the keyring only until
//! `drover keys rotate` has re-sealed every record with the new one.

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The environment variable that may hold the keyring.
pub const KEY_ENV: &str = "DROVER_ENCRYPTION_KEY";

/// One key: its id (a hash prefix, safe to print) and its bytes.
#[derive(Clone)]
pub struct Key {
    pub id: String,
    bytes: [u8; 32],
}

impl Key {
    /// A new random key.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .expect("the system RNG works");
        Self::from_bytes(bytes)
    }

    fn from_bytes(bytes: [u8; 32]) -> Self {
        let id = hex::encode(&Sha256::digest(bytes)[..6]);
        Self { id, bytes }
    }

    fn encoded(&self) -> String {
        STANDARD.encode(self.bytes)
    }
}

/// Where the keyring came from, which decides whether it can be rewritten.
#[derive(Debug, Clone)]
pub enum KeySource {
    File(PathBuf),
    Env,
}

/// The keys the coordinator can open secrets with; the first seals.
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<Key>,
    pub source: KeySource,
}

/// Keyring and sealing failures.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read the encryption key file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the encryption key file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the encryption key {origin} is malformed: {why}; it must hold base64 32-byte keys, one per line (the first encrypts)")]
    Malformed { origin: String, why: String },
    #[error("{what} is encrypted with key {key_id}, which is not in the keyring ({have}); start with the key this store was written with (--encryption-key-file or {KEY_ENV})")]
    UnknownKey {
        what: String,
        key_id: String,
        have: String,
    },
    #[error(
        "{what} does not decrypt with key {key_id}: the key is wrong or the record was altered"
    )]
    Open { what: String, key_id: String },
    #[error("the keyring comes from {KEY_ENV} and cannot be rewritten; set {KEY_ENV} to the new key followed by the old one")]
    NotWritable,
}

/// A sealed record as stored.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Envelope {
    #[serde(rename = "drover-sealed")]
    version: u32,
    key_id: String,
    nonce: String,
    ciphertext: String,
}

impl Keyring {
    /// Parses keys, one base64 key per line, blank lines and `#` comments ignored.
    pub fn parse(text: &str, source: KeySource) -> Result<Self, KeyError> {
        let origin = match &source {
            KeySource::File(p) => format!("file {}", p.display()),
            KeySource::Env => format!("in {KEY_ENV}"),
        };
        let mut keys = vec![];
        for line in text
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#'))
            .flat_map(|l| l.split(','))
            .map(str::trim)
            .filter(|l| !l.is_empty())
        {
            let raw = STANDARD.decode(line).map_err(|e| KeyError::Malformed {
                origin: origin.clone(),
                why: e.to_string(),
            })?;
            let bytes: [u8; 32] = raw.try_into().map_err(|v: Vec<u8>| KeyError::Malformed {
                origin: origin.clone(),
                why: format!("a key is {} bytes, not 32", v.len()),
            })?;
            keys.push(Key::from_bytes(bytes));
        }
        if keys.is_empty() {
            return Err(KeyError::Malformed {
                origin,
                why: "it holds no key".into(),
            });
        }
        Ok(Self { keys, source })
    }

    /// Loads the keyring from the environment, else from `file`; when
    /// neither exists and `create` is set, generates a key into `file`.
    pub fn load(file: &Path, create: bool) -> Result<(Self, bool), KeyError> {
        if let Ok(v) = std::env::var(KEY_ENV) {
            return Ok((Self::parse(&v, KeySource::Env)?, false));
        }
        match std::fs::read_to_string(file) {
            Ok(text) => Ok((Self::parse(&text, KeySource::File(file.to_owned()))?, false)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                let ring = Self {
                    keys: vec![Key::generate()],
                    source: KeySource::File(file.to_owned()),
                };
                ring.save()?;
                Ok((ring, true))
            }
            Err(source) => Err(KeyError::Read {
                path: file.to_owned(),
                source,
            }),
        }
    }

    /// Writes the keyring back to its file (mode 0600, atomically).
    pub fn save(&self) -> Result<(), KeyError> {
        let KeySource::File(path) = &self.source else {
            return Err(KeyError::NotWritable);
        };
        let mut text = String::from(
            "# Drover encryption keys (base64, one per line; the first encrypts).\n# Keep this file away from backups of the store.\n",
        );
        for k in &self.keys {
            text.push_str(&k.encoded());
            text.push('\n');
        }
        drover_common::fsutil::write_atomic(path, text.as_bytes(), 0o600).map_err(|source| {
            KeyError::Write {
                path: path.clone(),
                source,
            }
        })
    }

    /// The id of the key that seals.
    pub fn primary_id(&self) -> &str {
        &self.keys[0].id
    }

    /// Every key id, primary first.
    pub fn ids(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.id.clone()).collect()
    }

    /// Where the keyring came from and its key ids, for messages: `file
    /// /d/encryption.key, key ids k2, k1`.
    pub fn describe(&self) -> String {
        let origin = match &self.source {
            KeySource::File(p) => format!("file {}", p.display()),
            KeySource::Env => format!("from {KEY_ENV}"),
        };
        format!("{origin}, key ids {}", self.ids().join(", "))
    }

    /// Puts a new key first.
    pub fn push_primary(&mut self, key: Key) {
        self.keys.insert(0, key);
    }

    /// Keeps only the primary key.
    pub fn retire_old(&mut self) {
        self.keys.truncate(1);
    }

    /// Seals `plain` for the record `what` (bound in as associated data).
    pub fn seal(&self, what: &str, plain: &[u8]) -> Vec<u8> {
        let key = &self.keys[0];
        let sealing =
            LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key.bytes).expect("32-byte AES key"));
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .expect("the system RNG works");
        let mut data = plain.to_vec();
        sealing
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(what.as_bytes()),
                &mut data,
            )
            .expect("AES-GCM sealing cannot fail for in-memory data");
        serde_json::to_vec(&Envelope {
            version: 1,
            key_id: key.id.clone(),
            nonce: STANDARD.encode(nonce),
            ciphertext: STANDARD.encode(data),
        })
        .expect("envelope serializes")
    }

    /// Whether a stored body is sealed, and with which key.
    pub fn sealed_with(body: &[u8]) -> Option<String> {
        serde_json::from_slice::<Envelope>(body)
            .ok()
            .map(|e| e.key_id)
    }

    /// Opens a sealed body of the record `what`. A body that is not an
    /// envelope is returned as is (records written before encryption).
    pub fn open(&self, what: &str, body: &[u8]) -> Result<Vec<u8>, KeyError> {
        let Ok(env) = serde_json::from_slice::<Envelope>(body) else {
            return Ok(body.to_vec());
        };
        let key = self
            .keys
            .iter()
            .find(|k| k.id == env.key_id)
            .ok_or_else(|| KeyError::UnknownKey {
                what: what.to_owned(),
                key_id: env.key_id.clone(),
                have: self.ids().join(", "),
            })?;
        let bad = || KeyError::Open {
            what: what.to_owned(),
            key_id: env.key_id.clone(),
        };
        let nonce: [u8; NONCE_LEN] = STANDARD
            .decode(&env.nonce)
            .ok()
            .and_then(|n| n.try_into().ok())
            .ok_or_else(bad)?;
        let mut data = STANDARD.decode(&env.ciphertext).map_err(|_| bad())?;
        let opening =
            LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key.bytes).expect("32-byte AES key"));
        let plain = opening
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(what.as_bytes()),
                &mut data,
            )
            .map_err(|_| bad())?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Keyring {
        Keyring {
            keys: vec![Key::generate()],
            source: KeySource::Env,
        }
    }

    #[test]
    fn seal_open_round_trip_and_binding() {
        let r = ring();
        let sealed = r.seal("secrets/a", b"{\"x\":1}");
        assert!(!String::from_utf8_lossy(&sealed).contains("\"x\""));
        assert_eq!(r.open("secrets/a", &sealed).unwrap(), b"{\"x\":1}");
        // Moved to another record name: refused.
        assert!(matches!(
            r.open("secrets/b", &sealed),
            Err(KeyError::Open { .. })
        ));
        // Another key: refused, naming the key id needed.
        let other = ring();
        let e = other.open("secrets/a", &sealed).unwrap_err().to_string();
        assert!(e.contains(r.primary_id()), "{e}");
        // Plain records from before encryption still read.
        assert_eq!(r.open("secrets/a", b"{\"y\":2}").unwrap(), b"{\"y\":2}");
    }

    #[test]
    fn rotation_keeps_old_records_readable_until_retired() {
        let mut r = ring();
        let old = r.seal("s", b"v");
        r.push_primary(Key::generate());
        assert_eq!(r.open("s", &old).unwrap(), b"v");
        let new = r.seal("s", b"v");
        assert_eq!(Keyring::sealed_with(&new).as_deref(), Some(r.primary_id()));
        r.retire_old();
        assert!(r.open("s", &old).is_err());
        assert_eq!(r.open("s", &new).unwrap(), b"v");
    }

    #[test]
    fn parse_rejects_bad_keys() {
        assert!(Keyring::parse("not base64!", KeySource::Env).is_err());
        assert!(Keyring::parse(&STANDARD.encode([0u8; 16]), KeySource::Env).is_err());
        assert!(Keyring::parse("# only a comment, really\n", KeySource::Env).is_err());
        let saved = format!(
            "# a comment, with a comma\n{}\n",
            STANDARD.encode([3u8; 32])
        );
        assert_eq!(
            Keyring::parse(&saved, KeySource::Env).unwrap().ids().len(),
            1
        );
        let two = format!(
            "{}\n{}\n",
            STANDARD.encode([1u8; 32]),
            STANDARD.encode([2u8; 32])
        );
        assert_eq!(Keyring::parse(&two, KeySource::Env).unwrap().ids().len(), 2);
    }
}
