//! Addons: manifests a cluster's spec lists, applied in order by
//! server-side apply (field manager `drover`) through a running control
//! plane once the API server answers, and their status.

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::serde_skip::is_default;

/// One addon of `spec.addons`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Addon {
    /// A DNS label, unique in the cluster.
    pub name: String,
    /// `ApplyOnce` (the default) or `Reconcile`.
    #[serde(default)]
    pub mode: AddonMode,
    /// One YAML stream, documents separated by `---`; each has
    /// `apiVersion`, `kind` and `metadata.name`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub manifests: String,
    /// A file `drover apply` reads (relative to the cluster document) and
    /// stores as `manifests`; the coordinator never fetches anything, so it
    /// refuses a document that still names one.
    pub manifests_from: Option<String>,
}

/// When an addon is applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum AddonMode {
    /// Once, when it first succeeds; later changes to its manifests are
    /// not applied.
    #[default]
    ApplyOnce,
    /// Again whenever its manifests change (their SHA-256 differs from the
    /// one applied).
    Reconcile,
}

/// Where one addon stands, in `status.addons` (spec order).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddonStatus {
    pub name: String,
    pub phase: AddonPhase,
    /// The SHA-256 of the manifests applied (`Applied`) or last tried.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hash: String,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub applied_at: Option<OffsetDateTime>,
    /// Why the last attempt failed: the object it failed on and the API
    /// server's own message.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Failed attempts in a row (0 once applied).
    #[serde(default, skip_serializing_if = "is_default")]
    pub failures: u32,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub last_attempt_at: Option<OffsetDateTime>,
}

impl AddonStatus {
    /// Records the outcome of an apply of the manifests with SHA-256
    /// `hash` at `at`: applied, or failed once more with `message`.
    pub fn record_attempt(&mut self, hash: String, ok: bool, message: &str, at: OffsetDateTime) {
        self.hash = hash;
        self.last_attempt_at = Some(at);
        if ok {
            self.phase = AddonPhase::Applied;
            self.applied_at = Some(at);
            self.failures = 0;
            self.message.clear();
        } else {
            self.phase = AddonPhase::Failed;
            self.failures += 1;
            message.clone_into(&mut self.message);
        }
    }
}

/// An addon's phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum AddonPhase {
    /// Not applied yet (waiting for the API server, or for the addons
    /// before it).
    #[default]
    Pending,
    /// Every document was applied.
    Applied,
    /// The last attempt failed; it is tried again after a back-off.
    Failed,
}

/// The apply asked of a running control plane, until it reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddonApply {
    pub addon: String,
    /// The SHA-256 of the manifests sent.
    pub hash: String,
    /// The control-plane machine asked.
    pub via: String,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: OffsetDateTime,
}

/// The prefix of an addon apply's directive id.
pub const ADDON_APPLY_PREFIX: &str = "addon-";

impl AddonApply {
    /// The id of the directive that carries it: a new request is a new
    /// directive.
    pub fn directive_id(&self) -> String {
        let subject = format!("{}-{}", self.addon, &self.hash[..self.hash.len().min(12)]);
        super::operations::operation_id(ADDON_APPLY_PREFIX, Some(&subject), self.requested_at)
    }
}

/// The name of the addon that is the node image's default pod network
/// (`spec.network.cni: image`), applied before the spec's addons.
pub const IMAGE_CNI_ADDON: &str = "cni";

/// Where a node image keeps its default pod network: `manifests.yaml`
/// (applied once, as addon [`IMAGE_CNI_ADDON`], by a control plane) and
/// `net.d/` (the CNI configuration every machine's agent installs into
/// `/etc/cni/net.d` before kubeadm runs), as kind's node image keeps its
/// default CNI manifest at a known path.
pub const IMAGE_CNI_DIR: &str = "/usr/share/drover/cni";

/// The hash that stands for the image's manifests, which the coordinator
/// never sees.
pub const IMAGE_CNI_HASH: &str = "image";

/// Where an addon's manifests come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddonSource<'a> {
    /// The spec's `manifests`.
    Spec(&'a str),
    /// The node image's default CNI manifest ([`IMAGE_CNI_DIR`]).
    Image,
}

/// An addon as the coordinator applies it: the spec's, after the image's
/// pod network when `spec.network.cni` is `image`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectiveAddon<'a> {
    pub name: &'a str,
    pub mode: AddonMode,
    pub source: AddonSource<'a>,
}

impl EffectiveAddon<'_> {
    /// What tells one version of the addon from another.
    pub fn hash(&self) -> String {
        match self.source {
            AddonSource::Spec(m) => manifests_hash(m),
            AddonSource::Image => IMAGE_CNI_HASH.to_owned(),
        }
    }
}

/// The SHA-256 of an addon's manifests, hex.
pub fn manifests_hash(manifests: &str) -> String {
    hex::encode(Sha256::digest(manifests.as_bytes()))
}

/// The largest `manifests` of one addon, in bytes.
pub const MAX_ADDON_BYTES: usize = 512 * 1024;
/// The most addons a cluster may list.
pub const MAX_ADDONS: usize = 32;

/// Why an addon's manifests are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("is not a YAML stream: {0}")]
    Yaml(String),
    #[error("holds no document")]
    Empty,
    #[error("document {index}{what} {problem}")]
    Document {
        /// 1-based.
        index: usize,
        /// ` (Kind name)` when known.
        what: String,
        problem: String,
    },
}

/// One document of an addon's manifests: what it is and its content.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestDocument {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// `metadata.namespace`, if it names one.
    pub namespace: Option<String>,
    pub object: serde_json::Value,
}

impl ManifestDocument {
    /// `Kind namespace/name` or `Kind name`.
    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

/// The documents of a YAML stream, each checked to have `apiVersion`,
/// `kind` and `metadata.name` (empty documents are skipped).
pub fn manifest_documents(text: &str) -> Result<Vec<ManifestDocument>, ManifestError> {
    let mut out = Vec::new();
    for (i, doc) in crate::yaml_documents(text).map_err(|e| ManifestError::Yaml(e.0))? {
        let index = i + 1;
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let what = match (kind.is_empty(), name.is_empty()) {
            (false, false) => format!(" ({kind} {name})"),
            (false, true) => format!(" ({kind})"),
            _ => String::new(),
        };
        let bad = |problem: &str| ManifestError::Document {
            index,
            what: what.clone(),
            problem: problem.to_owned(),
        };
        if !doc.is_object() {
            return Err(bad("is not a mapping"));
        }
        let api_version = doc["apiVersion"].as_str().unwrap_or_default().to_owned();
        if api_version.is_empty() {
            return Err(bad("has no apiVersion"));
        }
        if kind.is_empty() {
            return Err(bad("has no kind"));
        }
        if name.is_empty() {
            return Err(bad("has no metadata.name"));
        }
        if kind.ends_with("List") {
            return Err(bad("is a List; give its items as documents of their own"));
        }
        let namespace = doc["metadata"]["namespace"].as_str().map(str::to_owned);
        out.push(ManifestDocument {
            api_version,
            kind,
            name,
            namespace,
            object: doc,
        });
    }
    if out.is_empty() {
        return Err(ManifestError::Empty);
    }
    Ok(out)
}

/// Reports every problem of `spec.addons`; with `image_cni`, the name of
/// the image's network addon is taken.
pub(crate) fn validate_addons(
    addons: &[Addon],
    image_cni: bool,
    err: &mut dyn FnMut(&str, String),
) {
    if addons.len() > MAX_ADDONS {
        err(
            "spec.addons",
            format!("at most {MAX_ADDONS} addons, got {}", addons.len()),
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, addon) in addons.iter().enumerate() {
        let field = format!("spec.addons[{i}]");
        if let Err(e) = crate::names::check_dns_label("addon name", &addon.name) {
            err(&format!("{field}.name"), e.to_string());
        } else if image_cni && addon.name == IMAGE_CNI_ADDON {
            err(
                &format!("{field}.name"),
                format!("{IMAGE_CNI_ADDON:?} is the node image's pod network (spec.network.cni: image); name this addon otherwise"),
            );
        } else if !seen.insert(addon.name.as_str()) {
            err(
                &format!("{field}.name"),
                format!("duplicate addon name {:?}", addon.name),
            );
        }
        if let Some(from) = &addon.manifests_from {
            err(
                &format!("{field}.manifestsFrom"),
                format!("{from:?} is a file `drover apply` reads and sends as manifests; the coordinator fetches nothing. Apply the document with `drover apply -f`, or give manifests"),
            );
            continue;
        }
        if addon.manifests.len() > MAX_ADDON_BYTES {
            err(
                &format!("{field}.manifests"),
                format!(
                    "is {} bytes; an addon may hold at most {MAX_ADDON_BYTES}",
                    addon.manifests.len()
                ),
            );
            continue;
        }
        if addon.manifests.starts_with(super::customise::HIDDEN_PREFIX) {
            err(
                &format!("{field}.manifests"),
                super::customise::CustomiseError::Hidden.to_string(),
            );
            continue;
        }
        if let Err(e) = manifest_documents(&addon.manifests) {
            err(&format!("{field}.manifests"), e.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_cluster_autoscaler_addon_is_a_valid_addon() {
        let text = include_str!("../../../images/addons/cluster-autoscaler.yaml");
        let docs = manifest_documents(text).unwrap();
        let described: Vec<String> = docs.iter().map(ManifestDocument::describe).collect();
        assert!(
            described.contains(&"Deployment kube-system/cluster-autoscaler".to_owned()),
            "{described:?}"
        );
        assert!(text.contains("--cloud-provider=externalgrpc"));
        assert!(text.contains("--cloud-config=/config/cloud-config.yaml"));
        // The credentials come from a Secret, never from the addon.
        assert!(!text.contains("PRIVATE KEY"));
    }

    #[test]
    fn documents_are_checked_one_by_one_and_named() {
        let ok = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: kube-system}\n---\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n";
        let docs = manifest_documents(ok).unwrap();
        assert_eq!(
            docs.iter()
                .map(ManifestDocument::describe)
                .collect::<Vec<_>>(),
            ["ConfigMap kube-system/a", "Namespace b"]
        );
        let cases = [
            ("kind: ConfigMap\nmetadata: {name: a}\n", "document 1 (ConfigMap a) has no apiVersion"),
            ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Secret\nmetadata: {}\n", "document 2 (Secret) has no metadata.name"),
            ("apiVersion: v1\nmetadata: {name: a}\n", "document 1 has no kind"),
            ("- a\n- b\n", "document 1 is not a mapping"),
            ("apiVersion: v1\nkind: List\nmetadata: {name: l}\n", "is a List"),
            ("", "holds no document"),
            ("apiVersion: v1\nkind: [\n", "is not a YAML stream"),
        ];
        for (text, want) in cases {
            let e = manifest_documents(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn addons_validate_names_sources_and_content() {
        let addon = |name: &str, manifests: &str, from: Option<&str>| Addon {
            name: name.into(),
            mode: AddonMode::ApplyOnce,
            manifests: manifests.into(),
            manifests_from: from.map(str::to_owned),
        };
        let good = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n";
        let mut errs = Vec::new();
        let addons = [
            addon("cni", good, None),
            addon("cni", good, None),
            addon("Bad_Name", good, None),
            addon("from", "", Some("./cni.yaml")),
            addon("broken", "apiVersion: v1\nkind: ConfigMap\n", None),
        ];
        validate_addons(&addons, false, &mut |f, m| errs.push(format!("{f}: {m}")));
        let mut taken = Vec::new();
        validate_addons(&addons[..1], true, &mut |f, m| {
            taken.push(format!("{f}: {m}"))
        });
        assert_eq!(taken.len(), 1);
        assert!(
            taken[0].contains("is the node image's pod network"),
            "{taken:?}"
        );
        assert_eq!(errs.len(), 4, "{errs:#?}");
        assert!(errs[0].starts_with("spec.addons[1].name: duplicate"));
        assert!(errs[1].starts_with("spec.addons[2].name: "));
        assert!(errs[2].starts_with(
            "spec.addons[3].manifestsFrom: \"./cni.yaml\" is a file `drover apply` reads"
        ));
        assert_eq!(
            errs[3],
            "spec.addons[4].manifests: document 1 (ConfigMap) has no metadata.name"
        );
        let a = AddonApply {
            addon: "cni".into(),
            hash: manifests_hash(good),
            via: "m".into(),
            requested_at: OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap(),
        };
        assert_eq!(
            a.directive_id(),
            format!("addon-cni-{}-1700000000", &a.hash[..12])
        );
    }
}
