//! Field ownership, as Kubernetes' server-side apply keeps it: which
//! client (field manager) set which fields of an object, the merge of an
//! applied configuration into an object, and the conflicts that refuse an
//! apply. Pure: objects are JSON values, the managers' sets the
//! `metadata.managedFields` entries.
//!
//! What this copies, from sigs.k8s.io/structured-merge-diff (v4):
//! `fieldpath/serialize.go` (the `FieldsV1` encoding: `f:<field>`,
//! `k:<key json>`, `.` for a list item itself), `merge/update.go` (an apply
//! conflicts with every other manager that owns a field it sets to a
//! different value; `force` takes the field over; fields the applier set
//! before and no longer sets are removed unless another manager owns them;
//! an update gives its manager the fields whose value it changed) and
//! `typed/merge.go` (maps merge key by key, a list with keys merges item by
//! item, any other list is replaced whole).
//!
//! Where this is simpler than Kubernetes, it is stricter, never laxer: only
//! `metadata.labels`, `metadata.annotations` and `spec` are owned (status
//! is the coordinator's alone); the lists merged by key are named in
//! [`list_key`] (the OpenAPI document marks them
//! `x-kubernetes-list-type: map`), every other list is atomic.

use std::collections::{BTreeMap, BTreeSet};

use drover_common::api::ManagedFieldsEntry;
use serde_json::{Map, Value};
use time::OffsetDateTime;

/// One step into an object: a field, or the item of a keyed list whose
/// key is this JSON (`{"name":"workers"}`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Segment {
    Field(String),
    Key(String),
}

/// Where a field is.
pub type FieldPath = Vec<Segment>;

/// The fields a manager owns: leaves (scalars, atomic lists, empty
/// objects) and keyed-list items themselves.
pub type FieldSet = BTreeSet<FieldPath>;

/// The operation a managedFields entry records.
pub const APPLY: &str = "Apply";
/// Any write but an apply.
pub const UPDATE: &str = "Update";

/// The key field of the list at `path`, if its items merge by key.
pub fn list_key(path: &[Segment]) -> Option<&'static str> {
    let fields: Vec<&str> = path
        .iter()
        .filter_map(|s| match s {
            Segment::Field(f) => Some(f.as_str()),
            Segment::Key(_) => None,
        })
        .collect();
    match fields.as_slice() {
        ["spec", "workerPools"] | ["spec", "addons"] => Some("name"),
        [.., "files"] if fields.first() == Some(&"spec") => Some("path"),
        _ => None,
    }
}

/// The part of an object managers own: `metadata.labels`,
/// `metadata.annotations` and `spec`.
pub fn owned_part(object: &Value) -> Value {
    owned_part_of(object, &["spec"])
}

/// The part of an object managers own: `metadata.labels`,
/// `metadata.annotations` and the top-level fields `body` (`spec` for a
/// Cluster, `data` for a Secret).
pub fn owned_part_of(object: &Value, body: &[&str]) -> Value {
    let mut metadata = Map::new();
    for field in ["labels", "annotations"] {
        if let Some(v) = object["metadata"].get(field) {
            if v.as_object().is_some_and(|m| !m.is_empty()) {
                metadata.insert(field.to_owned(), v.clone());
            }
        }
    }
    let mut out = Map::new();
    if !metadata.is_empty() {
        out.insert("metadata".into(), Value::Object(metadata));
    }
    for field in body {
        if let Some(v) = object.get(*field) {
            out.insert((*field).to_owned(), v.clone());
        }
    }
    Value::Object(out)
}

fn item_key(key_field: &str, item: &Value) -> Option<String> {
    let key = item.get(key_field)?;
    Some(serde_json::json!({ key_field: key }).to_string())
}

/// The fields `value` sets, under `prefix`.
pub fn fields_of(value: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    walk(value, &mut vec![], &mut out);
    out
}

fn walk(value: &Value, path: &mut FieldPath, out: &mut FieldSet) {
    match value {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                path.push(Segment::Field(k.clone()));
                walk(v, path, out);
                path.pop();
            }
        }
        Value::Array(items) if !path.is_empty() && list_key(path).is_some() => {
            let key_field = list_key(path).unwrap_or("name");
            if items.is_empty() {
                out.insert(path.clone());
            }
            for item in items {
                match item_key(key_field, item) {
                    Some(k) => {
                        path.push(Segment::Key(k));
                        out.insert(path.clone());
                        walk(item, path, out);
                        path.pop();
                    }
                    // An item without its key cannot be owned apart: the
                    // whole list is.
                    None => {
                        out.insert(path.clone());
                    }
                }
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// The value at `path` in `value`.
pub fn value_at<'a>(value: &'a Value, path: &[Segment]) -> Option<&'a Value> {
    let mut at = value;
    for (i, s) in path.iter().enumerate() {
        at = match s {
            Segment::Field(f) => at.get(f)?,
            Segment::Key(k) => {
                let key_field = list_key(&path[..i])?;
                let want: Value = serde_json::from_str(k).ok()?;
                at.as_array()?
                    .iter()
                    .find(|item| item.get(key_field) == want.get(key_field))?
            }
        };
    }
    Some(at)
}

/// Removes what is at `path` from `value` (a field, or a list item).
fn remove_at(value: &mut Value, path: &[Segment]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let Some(parent_value) = value_at_mut(value, parent) else {
        return;
    };
    match last {
        Segment::Field(f) => {
            if let Some(m) = parent_value.as_object_mut() {
                m.remove(f);
            }
        }
        Segment::Key(k) => {
            let (Some(key_field), Ok(want)) = (list_key(parent), serde_json::from_str::<Value>(k))
            else {
                return;
            };
            if let Some(items) = parent_value.as_array_mut() {
                items.retain(|item| item.get(key_field) != want.get(key_field));
            }
        }
    }
}

fn value_at_mut<'a>(value: &'a mut Value, path: &[Segment]) -> Option<&'a mut Value> {
    let mut at = value;
    for (i, s) in path.iter().enumerate() {
        at = match s {
            Segment::Field(f) => at.get_mut(f)?,
            Segment::Key(k) => {
                let key_field = list_key(&path[..i])?;
                let want: Value = serde_json::from_str(k).ok()?;
                at.as_array_mut()?
                    .iter_mut()
                    .find(|item| item.get(key_field) == want.get(key_field))?
            }
        };
    }
    Some(at)
}

/// Merges `applied` into `into`: objects key by key, keyed lists item by
/// item (new items appended), anything else replaced.
pub fn merge(into: &mut Value, applied: &Value) {
    merge_at(into, applied, &mut vec![]);
}

fn merge_at(into: &mut Value, applied: &Value, path: &mut FieldPath) {
    match (into, applied) {
        (Value::Object(target), Value::Object(source)) => {
            for (k, v) in source {
                path.push(Segment::Field(k.clone()));
                match target.get_mut(k) {
                    Some(existing) => merge_at(existing, v, path),
                    None => {
                        target.insert(k.clone(), v.clone());
                    }
                }
                path.pop();
            }
        }
        (Value::Array(target), Value::Array(source)) if list_key(path).is_some() => {
            let key_field = list_key(path).unwrap_or("name");
            if source.iter().any(|i| i.get(key_field).is_none()) {
                *target = source.clone();
                return;
            }
            for item in source {
                match target
                    .iter_mut()
                    .find(|t| t.get(key_field) == item.get(key_field))
                {
                    Some(existing) => merge_at(existing, item, path),
                    None => target.push(item.clone()),
                }
            }
        }
        (target, source) => *target = source.clone(),
    }
}

/// A field an apply would take from another manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub manager: String,
    pub path: FieldPath,
}

/// `.spec.workerPools[name="workers"].replicas`, as Kubernetes names a
/// conflicting field.
pub fn path_string(path: &[Segment]) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Segment::Field(f) => {
                out.push('.');
                out.push_str(f);
            }
            Segment::Key(k) => {
                let key: BTreeMap<String, Value> = serde_json::from_str(k).unwrap_or_default();
                let inner: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.push_str(&format!("[{}]", inner.join(",")));
            }
        }
    }
    out
}

/// The fields of a `FieldsV1` tree.
pub fn decode(fields: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    decode_at(fields, &mut vec![], &mut out);
    out
}

fn decode_at(node: &Value, path: &mut FieldPath, out: &mut FieldSet) {
    let Some(m) = node.as_object() else {
        return;
    };
    if m.is_empty() && !path.is_empty() {
        out.insert(path.clone());
        return;
    }
    for (k, child) in m {
        if k == "." {
            out.insert(path.clone());
            continue;
        }
        let segment = if let Some(f) = k.strip_prefix("f:") {
            Segment::Field(f.to_owned())
        } else if let Some(key) = k.strip_prefix("k:") {
            Segment::Key(key.to_owned())
        } else {
            // `v:` (set items) and `i:` (indexes) name nothing Drover
            // serves; they are dropped.
            continue;
        };
        path.push(segment);
        decode_at(child, path, out);
        path.pop();
    }
}

/// The `FieldsV1` tree of `set`.
pub fn encode(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for s in path {
            let name = match s {
                Segment::Field(f) => format!("f:{f}"),
                Segment::Key(k) => format!("k:{k}"),
            };
            node = node
                .entry(name)
                .or_insert_with(|| Value::Object(Map::new()))
                .as_object_mut()
                .expect("a FieldsV1 node is an object");
        }
        // A keyed-list item owned itself, with fields under it too.
        if matches!(path.last(), Some(Segment::Key(_))) {
            node.insert(".".into(), Value::Object(Map::new()));
        }
    }
    // An item with only `.` is written `{".": {}}`; a leaf `{}`.
    Value::Object(root)
}

/// A manager's identity: its name and operation (an apply and an update by
/// the same name are two managers, as in Kubernetes).
fn same_manager(e: &ManagedFieldsEntry, manager: &str, operation: &str) -> bool {
    e.manager == manager && e.operation == operation && e.subresource.is_none()
}

fn entry(
    manager: &str,
    operation: &str,
    api_version: &str,
    now: OffsetDateTime,
    set: &FieldSet,
) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        manager: manager.to_owned(),
        operation: operation.to_owned(),
        api_version: api_version.to_owned(),
        time: Some(now),
        fields_type: "FieldsV1".into(),
        fields_v1: encode(set),
        subresource: None,
    }
}

/// Whether `path` or anything under it is in `set`.
fn owns_within(set: &FieldSet, path: &FieldPath) -> bool {
    set.range(path.clone()..)
        .next()
        .is_some_and(|p| p.starts_with(path))
}

/// Whether `path` is the key field of a keyed-list item.
fn is_item_key(path: &[Segment]) -> bool {
    match path {
        [list @ .., Segment::Key(_), Segment::Field(f)] => list_key(list) == Some(f.as_str()),
        _ => false,
    }
}

/// What an apply makes of an object.
#[derive(Debug)]
pub struct Applied {
    /// The object's owned part after the apply (see [`owned_part`]).
    pub object: Value,
    /// The managedFields entries after it.
    pub managed_fields: Vec<ManagedFieldsEntry>,
}

/// Server-side apply of `config` (the owned part of the applied
/// configuration) by `manager` onto `current` (the owned part of the
/// object, `Null` when it is new), whose managers are `entries`. With
/// conflicts and no `force`, the conflicts; with `force`, the fields are
/// taken from their managers.
pub fn apply(
    current: &Value,
    entries: &[ManagedFieldsEntry],
    config: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    now: OffsetDateTime,
) -> Result<Applied, Vec<Conflict>> {
    let applied = fields_of(config);
    let mut sets: Vec<(ManagedFieldsEntry, FieldSet)> = entries
        .iter()
        .map(|e| (e.clone(), decode(&e.fields_v1)))
        .collect();
    let mut conflicts = vec![];
    for (e, set) in sets.iter_mut() {
        if same_manager(e, manager, APPLY) || e.subresource.is_some() {
            continue;
        }
        let taken: Vec<FieldPath> = set
            .intersection(&applied)
            .filter(|p| !matches!(p.last(), Some(Segment::Key(_))))
            .filter(|p| value_at(current, p) != value_at(config, p))
            .cloned()
            .collect();
        for path in taken {
            if force {
                set.remove(&path);
            } else {
                conflicts.push(Conflict {
                    manager: e.manager.clone(),
                    path,
                });
            }
        }
    }
    if !conflicts.is_empty() {
        return Err(conflicts);
    }
    let mut object = if current.is_object() {
        current.clone()
    } else {
        Value::Object(Map::new())
    };
    merge(&mut object, config);
    // What this manager applied before and applies no more goes, unless
    // another manager owns it (or, for a list item, something in it).
    let before: FieldSet = sets
        .iter()
        .find(|(e, _)| same_manager(e, manager, APPLY))
        .map(|(_, s)| s.clone())
        .unwrap_or_default();
    let mut dropped: Vec<&FieldPath> = before.difference(&applied).collect();
    // Shallowest first: an item no one keeps goes whole, with its fields.
    dropped.sort_by_key(|p| p.len());
    for path in dropped {
        if is_item_key(path) {
            // The key of an item that stays stays with it.
            continue;
        }
        let kept = sets
            .iter()
            .filter(|(e, _)| !same_manager(e, manager, APPLY))
            .any(|(_, s)| owns_within(s, path))
            || owns_within(&applied, path);
        if !kept {
            remove_at(&mut object, path);
        }
    }
    let mut managed_fields = vec![];
    let mut placed = false;
    for (e, set) in sets {
        if same_manager(&e, manager, APPLY) {
            placed = true;
            if set == applied {
                // The same fields: the entry (and its time) stays, so
                // applying twice writes nothing the second time.
                managed_fields.push(e);
            } else if !applied.is_empty() {
                managed_fields.push(entry(manager, APPLY, api_version, now, &applied));
            }
        } else if !set.is_empty() {
            let mut e = e;
            e.fields_v1 = encode(&set);
            managed_fields.push(e);
        }
    }
    if !placed && !applied.is_empty() {
        managed_fields.push(entry(manager, APPLY, api_version, now, &applied));
    }
    Ok(Applied {
        object,
        managed_fields,
    })
}

/// The managedFields after `manager` wrote `after` over `before` (owned
/// parts; `before` is `Null` for a create) by any write but an apply: it
/// owns what it changed; what it removed is no one's.
pub fn update(
    before: &Value,
    after: &Value,
    entries: &[ManagedFieldsEntry],
    manager: &str,
    api_version: &str,
    now: OffsetDateTime,
) -> Vec<ManagedFieldsEntry> {
    let old = if before.is_object() {
        fields_of(before)
    } else {
        FieldSet::new()
    };
    let new = fields_of(after);
    // A list item itself changes only by appearing; a change inside it is
    // its fields'.
    let changed: FieldSet = new
        .iter()
        .filter(|p| {
            !old.contains(*p)
                || (!matches!(p.last(), Some(Segment::Key(_)))
                    && value_at(before, p) != value_at(after, p))
        })
        .cloned()
        .collect();
    let removed: FieldSet = old.difference(&new).cloned().collect();
    let mut out = vec![];
    let mut mine = FieldSet::new();
    let mut mine_at = None;
    for e in entries {
        let mut set = decode(&e.fields_v1);
        set.retain(|p| !removed.contains(p));
        if same_manager(e, manager, UPDATE) {
            mine = set;
            mine_at = Some(out.len());
            out.push(e.clone());
            continue;
        }
        if e.subresource.is_none() {
            set.retain(|p| !changed.contains(p));
        }
        if set.is_empty() {
            continue;
        }
        let mut e = e.clone();
        e.fields_v1 = encode(&set);
        out.push(e);
    }
    if changed.is_empty() {
        // Nothing changed: the manager's entry (and its time) stays as it
        // was, so a no-op write is a no-op.
        if let Some(i) = mine_at {
            if mine.is_empty() {
                out.remove(i);
            } else {
                out[i].fields_v1 = encode(&mine);
            }
        }
        return out;
    }
    mine.extend(changed);
    let e = entry(manager, UPDATE, api_version, now, &mine);
    match mine_at {
        Some(i) => out[i] = e,
        None => out.push(e),
    }
    out
}

/// The message Kubernetes gives a refused apply
/// (structured-merge-diff merge/conflict.go, `Conflicts.Error`).
pub fn conflicts_message(conflicts: &[Conflict]) -> String {
    let mut lines = vec![];
    for c in conflicts {
        lines.push(format!(
            "conflict with {:?}: {}",
            c.manager,
            path_string(&c.path)
        ));
    }
    let n = conflicts.len();
    format!(
        "Apply failed with {n} conflict{}: {}",
        if n == 1 { "" } else { "s" },
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const AV: &str = "drover.dev/v1alpha1";

    fn now() -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH
    }

    fn pools(replicas: u64) -> Value {
        json!({"spec": {"kubernetesVersion": "1.31.0", "workerPools": [
            {"name": "workers", "replicas": replicas},
            {"name": "gpu", "replicas": 1},
        ]}})
    }

    #[test]
    fn fields_v1_round_trips_with_keyed_list_items() {
        let set = fields_of(&pools(3));
        let key = Segment::Key(r#"{"name":"workers"}"#.into());
        let spec = Segment::Field("spec".into());
        let pools_field = Segment::Field("workerPools".into());
        assert!(set.contains(&vec![spec.clone(), pools_field.clone(), key.clone()]));
        assert!(set.contains(&vec![
            spec,
            pools_field,
            key,
            Segment::Field("replicas".into())
        ]));
        let encoded = encode(&set);
        assert_eq!(
            encoded["f:spec"]["f:workerPools"][r#"k:{"name":"workers"}"#],
            json!({".": {}, "f:name": {}, "f:replicas": {}})
        );
        assert_eq!(decode(&encoded), set);
    }

    #[test]
    fn an_apply_conflicts_with_another_manager_unless_forced() {
        let created = update(&Value::Null, &pools(3), &[], "kubectl-create", AV, now());
        assert_eq!(created.len(), 1);
        let patched = update(&pools(3), &pools(5), &created, "kubectl-patch", AV, now());
        let owners: Vec<&str> = patched.iter().map(|e| e.manager.as_str()).collect();
        assert_eq!(owners, ["kubectl-create", "kubectl-patch"]);
        // Applying the value kubectl-patch set is no conflict; another is.
        let config = json!({"spec": {"workerPools": [{"name": "workers", "replicas": 5}]}});
        assert!(apply(&pools(5), &patched, &config, "ops", false, AV, now()).is_ok());
        let config = json!({"spec": {"workerPools": [{"name": "workers", "replicas": 7}]}});
        let conflicts = apply(&pools(5), &patched, &config, "ops", false, AV, now()).unwrap_err();
        assert_eq!(conflicts.len(), 1);
        assert_eq!(conflicts[0].manager, "kubectl-patch");
        let message = conflicts_message(&conflicts);
        assert!(
            message.contains(
                r#"conflict with "kubectl-patch": .spec.workerPools[name="workers"].replicas"#
            ),
            "{message}"
        );
        let forced = apply(&pools(5), &patched, &config, "ops", true, AV, now()).unwrap();
        assert_eq!(forced.object["spec"]["workerPools"][0]["replicas"], 7);
        assert_eq!(forced.object["spec"]["workerPools"][1]["name"], "gpu");
        // kubectl-patch owned only replicas, now taken: its entry goes.
        assert!(forced
            .managed_fields
            .iter()
            .all(|e| e.manager != "kubectl-patch"));
    }

    #[test]
    fn an_apply_removes_what_its_manager_no_longer_sets() {
        let config = json!({"metadata": {"labels": {"team": "web", "tier": "1"}}, "spec": {"workerPools": [{"name": "a", "replicas": 1}, {"name": "b", "replicas": 1}]}});
        let first = apply(&Value::Null, &[], &config, "ops", false, AV, now()).unwrap();
        let config = json!({"metadata": {"labels": {"team": "web"}}, "spec": {"workerPools": [{"name": "a", "replicas": 1}]}});
        let second = apply(
            &first.object,
            &first.managed_fields,
            &config,
            "ops",
            false,
            AV,
            now(),
        )
        .unwrap();
        assert_eq!(second.object["metadata"]["labels"], json!({"team": "web"}));
        assert_eq!(
            second.object["spec"]["workerPools"],
            json!([{"name": "a", "replicas": 1}])
        );
        // A field another manager owns stays when the applier drops it.
        let labelled = update(
            &second.object,
            &json!({"metadata": {"labels": {"team": "web", "owner": "me"}}, "spec": second.object["spec"].clone()}),
            &second.managed_fields,
            "kubectl-label",
            AV,
            now(),
        );
        let mut object = second.object.clone();
        object["metadata"]["labels"]["owner"] = json!("me");
        let third = apply(
            &object,
            &labelled,
            &json!({"spec": {"workerPools": [{"name": "a", "replicas": 1}]}}),
            "ops",
            false,
            AV,
            now(),
        )
        .unwrap();
        assert_eq!(third.object["metadata"]["labels"], json!({"owner": "me"}));
    }

    #[test]
    fn a_write_that_changes_nothing_changes_no_entry() {
        let created = update(&Value::Null, &pools(3), &[], "a", AV, now());
        let later = OffsetDateTime::UNIX_EPOCH + time::Duration::hours(1);
        let again = update(&pools(3), &pools(3), &created, "a", AV, later);
        assert_eq!(again, created);
        let applied = apply(&Value::Null, &[], &pools(3), "ops", false, AV, now()).unwrap();
        let twice = apply(
            &applied.object,
            &applied.managed_fields,
            &pools(3),
            "ops",
            false,
            AV,
            now(),
        )
        .unwrap();
        assert_eq!(twice.object, applied.object);
        assert_eq!(twice.managed_fields, applied.managed_fields);
    }
}
