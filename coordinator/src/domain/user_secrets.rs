//! The operators' Secrets (`kind: Secret`): kept sealed in the store
//! ([`Kind::UserSecret`]), opened only to build a machine's config bundle,
//! and never shown back. Which clusters use a Secret decides whether it may
//! go or lose a key.

use std::collections::{BTreeMap, BTreeSet};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use drover_common::api::{
    Cluster, ClusterSpec, CustomiseError, FieldError, ObjectMeta, SecretInfo, SecretKeyRef,
};
use serde::{Deserialize, Serialize};

use crate::store::{Kind, Store, StoreError};

/// A Secret as stored (sealed at rest): its metadata and its values,
/// base64-encoded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredSecret {
    pub metadata: ObjectMeta,
    pub data: BTreeMap<String, String>,
}

impl StoredSecret {
    /// A stored Secret holding `values`.
    pub fn new(metadata: ObjectMeta, values: &BTreeMap<String, Vec<u8>>) -> Self {
        Self {
            metadata,
            data: values
                .iter()
                .map(|(k, v)| (k.clone(), STANDARD.encode(v)))
                .collect(),
        }
    }

    /// Its values. The coordinator wrote them, so a value that does not
    /// decode is a damaged store.
    pub fn values(&self) -> Result<BTreeMap<String, Vec<u8>>, StoreError> {
        self.data
            .iter()
            .map(|(k, v)| {
                STANDARD
                    .decode(v)
                    .map(|v| (k.clone(), v))
                    .map_err(|e| StoreError::Corrupt {
                        kind: Kind::UserSecret.as_str(),
                        name: self.metadata.name.clone(),
                        detail: format!("key {k} is not base64: {e}"),
                    })
            })
            .collect()
    }

    /// What the API shows of it, its resourceVersion the store revision.
    pub fn info(&self, revision: u64) -> Result<SecretInfo, StoreError> {
        let mut metadata = self.metadata.clone();
        metadata.resource_version = Some(revision.to_string());
        Ok(SecretInfo::new(metadata, &self.values()?))
    }
}

/// Reads one Secret and its store revision.
pub fn get(store: &Store, name: &str) -> Result<Option<(StoredSecret, u64)>, StoreError> {
    store.get_json::<StoredSecret>(Kind::UserSecret, name)
}

/// The Secrets a spec's files read, opened: one read per Secret named.
/// A Secret that does not exist is absent from the map.
pub fn referenced(
    store: &Store,
    spec: &ClusterSpec,
) -> Result<BTreeMap<String, BTreeMap<String, Vec<u8>>>, StoreError> {
    let names: BTreeSet<&str> = spec
        .secret_refs()
        .into_iter()
        .map(|(_, r)| r.secret.as_str())
        .collect();
    let mut out = BTreeMap::new();
    for name in names {
        if let Some((s, _)) = get(store, name)? {
            out.insert(name.to_owned(), s.values()?);
        }
    }
    Ok(out)
}

/// Looks a reference up in Secrets read by [`referenced`]: its value as
/// text, or why there is none.
pub fn lookup(
    secrets: &BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    r: &SecretKeyRef,
) -> Result<String, CustomiseError> {
    let values = secrets
        .get(&r.secret)
        .ok_or_else(|| CustomiseError::MissingSecret {
            secret: r.secret.clone(),
        })?;
    let value = values
        .get(&r.key)
        .ok_or_else(|| CustomiseError::MissingKey {
            secret: r.secret.clone(),
            key: r.key.clone(),
            keys: values.keys().cloned().collect::<Vec<_>>().join(", "),
        })?;
    String::from_utf8(value.clone()).map_err(|_| CustomiseError::NotText {
        secret: r.secret.clone(),
        key: r.key.clone(),
    })
}

/// Every `contentFrom` of `spec` that the stored Secrets cannot satisfy,
/// as a field error (what `drover apply` of a Cluster refuses).
pub fn unresolved_refs(store: &Store, spec: &ClusterSpec) -> Result<Vec<FieldError>, StoreError> {
    let secrets = referenced(store, spec)?;
    Ok(spec
        .secret_refs()
        .into_iter()
        .filter_map(|(field, r)| {
            lookup(&secrets, r).err().map(|e| FieldError {
                field,
                message: e.to_string(),
            })
        })
        .collect())
}

/// Where live clusters (not being deleted) read Secret `name`: each as
/// `cluster <c> <field> (key <k>)`, and the keys they read.
pub fn users(clusters: &[Cluster], name: &str) -> (Vec<String>, BTreeSet<String>) {
    let mut uses = Vec::new();
    let mut keys = BTreeSet::new();
    for c in clusters
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
    {
        for (field, r) in c.spec.secret_refs() {
            if r.secret == name {
                uses.push(format!(
                    "cluster {} {field} (key {})",
                    c.metadata.name, r.key
                ));
                keys.insert(r.key.clone());
            }
        }
    }
    (uses, keys)
}

/// The audit lines of a Secret's change: which keys were added, changed
/// or removed, never a value or a hash of one (a hash of a short value
/// would let anyone holding the log guess it).
pub fn changes(
    name: &str,
    before: Option<&BTreeMap<String, Vec<u8>>>,
    after: &BTreeMap<String, Vec<u8>>,
) -> Vec<String> {
    let empty = BTreeMap::new();
    let before = before.unwrap_or(&empty);
    let mut out = Vec::new();
    for (key, value) in after {
        match before.get(key) {
            None => out.push(format!(
                "secret {name} key {key} added ({} bytes)",
                value.len()
            )),
            Some(was) if was != value => out.push(format!(
                "secret {name} key {key} changed ({} bytes)",
                value.len()
            )),
            Some(_) => {}
        }
    }
    for key in before.keys().filter(|k| !after.contains_key(*k)) {
        out.push(format!("secret {name} key {key} removed"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect()
    }

    #[test]
    fn lookup_names_what_is_missing() {
        let secrets = BTreeMap::from([(
            "registry".to_owned(),
            values(&[("auth.json", b"{}"), ("bin", &[0xff, 0xfe])]),
        )]);
        let r = |s: &str, k: &str| SecretKeyRef {
            secret: s.into(),
            key: k.into(),
        };
        assert_eq!(lookup(&secrets, &r("registry", "auth.json")).unwrap(), "{}");
        let e = lookup(&secrets, &r("registry", "token")).unwrap_err();
        assert!(e.to_string().contains("(its keys: auth.json, bin)"), "{e}");
        let e = lookup(&secrets, &r("registry", "bin")).unwrap_err();
        assert!(e.to_string().contains("not UTF-8 text"), "{e}");
        let e = lookup(&secrets, &r("other", "k")).unwrap_err();
        assert!(
            e.to_string().contains("secret \"other\" does not exist"),
            "{e}"
        );
    }

    #[test]
    fn audit_lines_name_keys_never_values() {
        let before = values(&[("a", b"one"), ("b", b"two"), ("c", b"three")]);
        let after = values(&[("a", b"one"), ("b", b"TWO!"), ("d", b"four")]);
        assert_eq!(
            changes("registry", Some(&before), &after),
            [
                "secret registry key b changed (4 bytes)",
                "secret registry key d added (4 bytes)",
                "secret registry key c removed",
            ]
        );
        assert!(changes("registry", Some(&after), &after).is_empty());
    }

    #[test]
    fn stored_values_round_trip() {
        let v = values(&[("k", &[0, 1, 2, 255])]);
        let s = StoredSecret::new(
            ObjectMeta {
                name: "s".into(),
                ..Default::default()
            },
            &v,
        );
        assert_eq!(s.values().unwrap(), v);
        let info = s.info(7).unwrap();
        assert_eq!(info.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(info.keys[0].bytes, 4);
    }
}
