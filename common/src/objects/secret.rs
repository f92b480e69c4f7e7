//! `Secret`: named values an operator keeps in the coordinator for machine
//! files (`files[].contentFrom: {secret, key}`), such as registry
//! credentials. The coordinator seals them at rest and never shows a value
//! back: reading a Secret lists its keys and their sizes.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::meta::ObjectMeta;
use super::problem::FieldError;

/// The `kind` of a Secret document.
pub const SECRET_KIND: &str = "Secret";
/// The most keys one Secret holds.
pub const MAX_SECRET_KEYS: usize = 64;
/// The longest key name.
pub const MAX_SECRET_KEY_LEN: usize = 253;
/// The largest value: as large as a machine file may be.
pub const MAX_SECRET_VALUE_BYTES: usize = 256 * 1024;

/// A key name Kubernetes would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "key {0:?} must be 1 to {MAX_SECRET_KEY_LEN} letters, digits, '-', '_' or '.' (not \".\" or \"..\")"
)]
pub struct SecretKeyError(pub String);

/// A Secret as applied: values in `data` (base64) or `stringData` (text),
/// as in Kubernetes; a key in both takes `stringData`'s value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Secret {
    /// `drover.dev/v1alpha1`.
    pub api_version: String,
    /// `Secret`.
    pub kind: String,
    pub metadata: ObjectMeta,
    /// Values, each base64-encoded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    /// Values as plain text.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub string_data: BTreeMap<String, String>,
}

/// A Secret as the API shows it: its keys and their sizes, never a value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretInfo {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    /// Every key, by name.
    pub keys: Vec<SecretKeyInfo>,
}

/// One key of a Secret, as shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyInfo {
    pub key: String,
    /// The value's length in bytes.
    pub bytes: usize,
}

/// Where a machine file's content comes from instead of `content`: one key
/// of a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub secret: String,
    /// The key whose value is the file's content.
    pub key: String,
}

impl std::fmt::Display for SecretKeyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "secret {} key {}", self.secret, self.key)
    }
}

/// Checks a key name as Kubernetes does: letters, digits, `-`, `_` and
/// `.`, not `.` or `..`, at most [`MAX_SECRET_KEY_LEN`] characters.
pub fn check_secret_key(key: &str) -> Result<(), SecretKeyError> {
    let ok = !key.is_empty()
        && key.len() <= MAX_SECRET_KEY_LEN
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(SecretKeyError(key.chars().take(80).collect()))
    }
}

impl Secret {
    /// Checks the document and returns its values, every problem at once.
    pub fn values(&self) -> Result<BTreeMap<String, Vec<u8>>, Vec<FieldError>> {
        let mut errs = Vec::new();
        let mut err = |field: String, message: String| errs.push(FieldError { field, message });
        if self.api_version != crate::API_VERSION {
            err(
                "apiVersion".into(),
                format!("must be {:?}", crate::API_VERSION),
            );
        }
        if self.kind != SECRET_KIND {
            err("kind".into(), format!("must be {SECRET_KIND:?}"));
        }
        if let Err(e) = crate::names::check_object_name("metadata.name", &self.metadata.name) {
            err("metadata.name".into(), e.to_string());
        }
        let mut values = BTreeMap::new();
        for (key, b64) in &self.data {
            match STANDARD.decode(b64.trim()) {
                Ok(v) => {
                    values.insert(key.clone(), v);
                }
                Err(e) => err(
                    format!("data.{key}"),
                    format!("is not base64 ({e}); put plain text under stringData instead"),
                ),
            }
        }
        for (key, text) in &self.string_data {
            values.insert(key.clone(), text.as_bytes().to_vec());
        }
        if values.is_empty() {
            err(
                "data".into(),
                "the Secret holds no key; give data or stringData".into(),
            );
        }
        if values.len() > MAX_SECRET_KEYS {
            err(
                "data".into(),
                format!("at most {MAX_SECRET_KEYS} keys, got {}", values.len()),
            );
        }
        for (key, value) in &values {
            let field = if self.string_data.contains_key(key) {
                format!("stringData.{key}")
            } else {
                format!("data.{key}")
            };
            if let Err(e) = check_secret_key(key) {
                err(field.clone(), e.to_string());
            }
            if value.len() > MAX_SECRET_VALUE_BYTES {
                err(
                    field,
                    format!(
                        "the value is {} bytes; a value may hold at most {MAX_SECRET_VALUE_BYTES} (the largest machine file)",
                        value.len()
                    ),
                );
            }
        }
        if errs.is_empty() {
            Ok(values)
        } else {
            Err(errs)
        }
    }
}

impl SecretInfo {
    /// What the API shows of a Secret with `values`.
    pub fn new(metadata: ObjectMeta, values: &BTreeMap<String, Vec<u8>>) -> Self {
        Self {
            api_version: crate::API_VERSION.into(),
            kind: SECRET_KIND.into(),
            metadata,
            keys: values
                .iter()
                .map(|(key, v)| SecretKeyInfo {
                    key: key.clone(),
                    bytes: v.len(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(data: &[(&str, &str)], string_data: &[(&str, &str)]) -> Secret {
        Secret {
            api_version: crate::API_VERSION.into(),
            kind: SECRET_KIND.into(),
            metadata: ObjectMeta {
                name: "registry".into(),
                ..Default::default()
            },
            data: data
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            string_data: string_data
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn values_merge_data_and_string_data() {
        let s = secret(
            &[("a", "aGVsbG8="), ("b", "eA==")],
            &[("b", "y"), ("c.toml", "z")],
        );
        let v = s.values().unwrap();
        assert_eq!(v["a"], b"hello");
        assert_eq!(v["b"], b"y", "stringData wins");
        assert_eq!(v["c.toml"], b"z");
        let info = SecretInfo::new(s.metadata.clone(), &v);
        assert_eq!(
            info.keys,
            vec![
                SecretKeyInfo {
                    key: "a".into(),
                    bytes: 5
                },
                SecretKeyInfo {
                    key: "b".into(),
                    bytes: 1
                },
                SecretKeyInfo {
                    key: "c.toml".into(),
                    bytes: 1
                },
            ]
        );
    }

    #[test]
    fn every_problem_is_named() {
        let mut s = secret(&[("ok", "not base64!")], &[("bad/key", "x"), ("..", "y")]);
        s.kind = "ConfigMap".into();
        s.metadata.name = "Registry".into();
        let errs = s.values().unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "kind",
                "metadata.name",
                "data.ok",
                "stringData...",
                "stringData.bad/key"
            ],
            "{errs:#?}"
        );
        assert!(errs[2].message.contains("not base64"), "{errs:#?}");
        assert!(secret(&[], &[]).values().unwrap_err()[0]
            .message
            .contains("holds no key"));
        let big = "x".repeat(MAX_SECRET_VALUE_BYTES + 1);
        let errs = secret(&[], &[("big", &big)]).values().unwrap_err();
        assert!(errs[0].message.contains("at most"), "{errs:#?}");
    }
}
