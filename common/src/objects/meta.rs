//! What every object carries: metadata, conditions, label selectors and
//! events, shaped like their Kubernetes counterparts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;
use time::OffsetDateTime;

use crate::serde_skip::is_default;

/// Object metadata, as in Kubernetes' `ObjectMeta` (the subset Drover uses).
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    pub name: String,
    /// Set by the coordinator at creation; never changes.
    pub uid: Option<String>,
    /// Incremented by the coordinator whenever the spec changes.
    #[serde(default, skip_serializing_if = "is_default")]
    pub generation: u64,
    /// The store revision of the last write; send it back to update with
    /// optimistic concurrency.
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Notes for tools, never read by Drover (kubectl keeps its
    /// `kubectl.kubernetes.io/last-applied-configuration` here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Which client (field manager) last set which fields of `metadata`
    /// and `spec`, as server-side apply records it; written by the
    /// coordinator, ignored in what clients send.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub managed_fields: Vec<ManagedFieldsEntry>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub creation_timestamp: Option<OffsetDateTime>,
    /// Set when deletion was requested; the object goes once cleanup is done.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub deletion_timestamp: Option<OffsetDateTime>,
}

/// One field manager's fields, as in Kubernetes' `metav1.ManagedFieldsEntry`
/// (staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/types.go).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManagedFieldsEntry {
    /// The client that set them: `kubectl`'s `--field-manager`, or the
    /// name it gives itself (`kubectl-edit`, `kubectl-client-side-apply`).
    pub manager: String,
    /// `Apply` (server-side apply) or `Update` (any other write).
    pub operation: String,
    /// The API version the fields are named in.
    pub api_version: String,
    /// When the set last changed.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub time: Option<OffsetDateTime>,
    /// Always `FieldsV1`.
    pub fields_type: String,
    /// The fields, as a tree of `f:<name>` (a field), `k:<json>` (an item
    /// of a list keyed by name) and `.` (the item itself).
    #[schema(value_type = Object)]
    pub fields_v1: serde_json::Value,
    /// The subresource written through, if any (`status`).
    pub subresource: Option<String>,
}

/// A condition, as in Kubernetes' `metav1.Condition`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(with = "time::serde::rfc3339")]
    pub last_transition_time: OffsetDateTime,
}

/// Sets a condition, keeping its transition time when the status is unchanged.
/// Returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
) -> bool {
    let status = if status { "True" } else { "False" };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == status && c.reason == reason && c.message == message => false,
        Some(c) => {
            if c.status != status {
                c.last_transition_time = crate::now();
            }
            c.status = status.to_owned();
            c.reason = reason.to_owned();
            c.message = message.to_owned();
            true
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_owned(),
                status: status.to_owned(),
                reason: reason.to_owned(),
                message: message.to_owned(),
                last_transition_time: crate::now(),
            });
            true
        }
    }
}

/// A label selector (`matchLabels` only, which is all pools need).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
}

impl LabelSelector {
    /// Whether every selector label is present with the same value.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// Something that happened to an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Event {
    #[serde(with = "time::serde::rfc3339")]
    pub time: OffsetDateTime,
    /// A CamelCase word, e.g. `Created`, `Unhealthy`, `Replaced`.
    pub reason: String,
    pub message: String,
}

/// How many events an object keeps.
pub const MAX_EVENTS: usize = 30;

/// Appends an event, dropping the oldest beyond [`MAX_EVENTS`].
pub fn push_event(events: &mut Vec<Event>, reason: &str, message: impl Into<String>) {
    events.push(Event {
        time: crate::now(),
        reason: reason.to_owned(),
        message: message.into(),
    });
    if events.len() > MAX_EVENTS {
        let drop = events.len() - MAX_EVENTS;
        events.drain(..drop);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_matches() {
        let s = LabelSelector {
            match_labels: [("a".to_string(), "1".to_string())].into(),
        };
        assert!(s.matches(&[("a".into(), "1".into()), ("b".into(), "2".into())].into()));
        assert!(!s.matches(&[("a".into(), "2".into())].into()));
    }
}
