//! The apiextensions API as kube-apiserver serves it: CustomResourceDefinitions
//! (`apiextensions.k8s.io/v1`, server-side apply, get, list, delete) and the
//! custom resources they define, whose kind is served (discovery and REST
//! paths) only once its definition is `Established`; before, every path of
//! the kind answers 404 NotFound, as
//! staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/customresource_handler.go
//! does for a definition not established yet.
//!
//! Names and establishment are set by a controller loop in each API server
//! ([`run_controller`]), never by the request that applied the definition:
//! the naming controller (pkg/controller/status/naming_controller.go) accepts
//! the names unless another definition of the group holds one of them
//! (`NamesAccepted`), and the establishing controller
//! (pkg/controller/establish/establishing_controller.go) sets `Established`
//! after a delay (customresource_handler.go queues it 5 s after the names
//! are accepted when there are several API servers: [`ESTABLISH_DELAY`]).
//! A definition whose names are refused is never established. Everything
//! here is for admins.

use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::{json, Value};

use super::objects::{
    apply_over_stored, bad_request, invalid, not_allowed, not_found, read_apply, shown_name, store,
    subdomain_problem,
};
use super::{forbidden, internal, json_resp, status, Identity, Resp, Routed, State};

pub(super) const GROUP: &str = "apiextensions.k8s.io";
const GROUP_VERSION: &str = "apiextensions.k8s.io/v1";
const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
const CRD_PREFIX: &str = "/registry/apiextensions.k8s.io/customresourcedefinitions/";

/// How long after its names are accepted a definition is established: what
/// kube-apiserver waits with several API servers, shortened for tests
/// (it is 0 s with one, plus its informers' round trip).
pub(super) const ESTABLISH_DELAY: time::Duration = time::Duration::seconds(2);

/// How often the controller looks at the definitions.
const CONTROLLER_PERIOD: Duration = Duration::from_millis(250);

/// One definition's kind, as served.
#[derive(Debug, Clone)]
struct Kind {
    group: String,
    plural: String,
    singular: String,
    kind: String,
    short: Vec<String>,
    namespaced: bool,
    /// The served versions.
    versions: Vec<String>,
}

impl Kind {
    fn of(crd: &Value) -> Option<Self> {
        let spec = &crd["spec"];
        let names = &spec["names"];
        let kind = names["kind"].as_str()?.to_owned();
        Some(Self {
            group: spec["group"].as_str()?.to_owned(),
            plural: names["plural"].as_str()?.to_owned(),
            singular: names["singular"]
                .as_str()
                .map_or_else(|| kind.to_lowercase(), str::to_owned),
            kind,
            short: strings(&names["shortNames"]),
            namespaced: spec["scope"] == "Namespaced",
            versions: spec["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|v| v["served"] == true)
                .filter_map(|v| v["name"].as_str().map(str::to_owned))
                .collect(),
        })
    }

    fn discovery(&self) -> Value {
        json!({"name": self.plural, "singularName": self.singular,
               "namespaced": self.namespaced, "kind": self.kind,
               "verbs": ["delete", "get", "list", "patch"], "shortNames": self.short})
    }

    fn qualified(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    fn key(&self, ns: Option<&str>, name: &str) -> String {
        match ns {
            Some(ns) => format!("/registry/{}/{}/{ns}/{name}", self.group, self.plural),
            None => format!("/registry/{}/{}/{name}", self.group, self.plural),
        }
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

fn condition_true(crd: &Value, type_: &str) -> bool {
    crd["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == type_ && c["status"] == "True")
}

fn condition<'a>(crd: &'a Value, type_: &str) -> Option<&'a Value> {
    crd["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Every stored definition.
async fn definitions(state: &State) -> anyhow::Result<Vec<Value>> {
    state
        .store
        .objects(CRD_PREFIX, "customresourcedefinitions")
        .await
}

/// The kinds of the established definitions.
async fn established(state: &State) -> anyhow::Result<Vec<Kind>> {
    Ok(definitions(state)
        .await?
        .iter()
        .filter(|c| condition_true(c, "Established"))
        .filter_map(Kind::of)
        .collect())
}

/// The groups this module serves, for `/apis`: apiextensions, then the
/// groups of established definitions with their served versions.
pub(super) async fn groups(state: &State) -> Vec<Value> {
    let v1 = json!({"groupVersion": GROUP_VERSION, "version": "v1"});
    let mut out = vec![json!({"name": GROUP, "versions": [v1.clone()], "preferredVersion": v1})];
    let kinds = established(state).await.unwrap_or_default();
    let mut by_group: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for k in &kinds {
        let versions = by_group.entry(k.group.as_str()).or_default();
        for v in &k.versions {
            if !versions.contains(&v.as_str()) {
                versions.push(v);
            }
        }
    }
    for (group, versions) in by_group {
        let list: Vec<Value> = versions
            .iter()
            .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
            .collect();
        out.push(json!({"name": group, "versions": list, "preferredVersion": list[0]}));
    }
    out
}

fn crd_discovery() -> Value {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
           "resources": [{"name": "customresourcedefinitions",
                          "singularName": "customresourcedefinition", "namespaced": false,
                          "kind": "CustomResourceDefinition",
                          "verbs": ["delete", "get", "list", "patch"],
                          "shortNames": ["crd", "crds"]}]})
}

/// The path of nothing served: what kube-apiserver answers for a kind whose
/// definition is not established (or absent).
fn nothing_here() -> Resp {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// Serves the apiextensions API and established custom resources; any
/// other path goes back.
pub(super) async fn route(state: &State, who: &Identity, req: Request<Incoming>) -> Routed {
    let path = req.uri().path().to_owned();
    if path == format!("/apis/{GROUP_VERSION}") {
        return Ok(json_resp(StatusCode::OK, &crd_discovery()));
    }
    if let Some(rest) = path.strip_prefix(CRDS) {
        let name = match rest {
            "" => None,
            r => match r.strip_prefix('/') {
                Some(n) if !n.is_empty() && !n.contains('/') => Some(n.to_owned()),
                _ => return Ok(nothing_here()),
            },
        };
        if !who.is_admin() {
            return Ok(forbidden(
                who,
                verb(req.method(), &name),
                "customresourcedefinitions",
                "",
            ));
        }
        return Ok(match (req.method().clone(), name) {
            (Method::GET, None) => list_definitions(state, req.uri().query()).await,
            (Method::GET, Some(n)) => get_definition(state, &n).await,
            (Method::PATCH, Some(n)) => apply_definition(state, &n, req).await,
            (Method::DELETE, Some(n)) => delete_definition(state, &n).await,
            _ => not_allowed(),
        });
    }
    // A custom resource: /apis/GROUP/VERSION[/namespaces/NS]/PLURAL[/NAME].
    let Some(rest) = path.strip_prefix("/apis/") else {
        return Err(req);
    };
    let parts: Vec<&str> = rest.split('/').collect();
    if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
        return Err(req);
    }
    let (group, version) = (parts[0], parts[1]);
    let kinds = match established(state).await {
        Ok(k) => k,
        Err(e) => return Ok(internal(e)),
    };
    let served: Vec<&Kind> = kinds
        .iter()
        .filter(|k| k.group == group && k.versions.iter().any(|v| v == version))
        .collect();
    if served.is_empty() {
        return Err(req);
    }
    let (ns, plural, name) = match &parts[2..] {
        [] => {
            let resources: Vec<Value> = served.iter().map(|k| k.discovery()).collect();
            return Ok(json_resp(
                StatusCode::OK,
                &json!({"kind": "APIResourceList", "apiVersion": "v1",
                        "groupVersion": format!("{group}/{version}"), "resources": resources}),
            ));
        }
        ["namespaces", ns, plural] => (Some(*ns), *plural, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
        [plural] => (None, *plural, None),
        [plural, name] => (None, *plural, Some(*name)),
        _ => return Ok(nothing_here()),
    };
    let Some(kind) = served.iter().find(|k| k.plural == plural) else {
        return Ok(nothing_here());
    };
    if (ns.is_some() && !kind.namespaced) || (kind.namespaced && ns.is_none() && name.is_some()) {
        return Ok(nothing_here());
    }
    let name = name.map(str::to_owned);
    if !who.is_admin() {
        return Ok(forbidden(
            who,
            verb(req.method(), &name),
            &kind.qualified(),
            ns.unwrap_or_default(),
        ));
    }
    let target = Target {
        kind: (*kind).clone(),
        version: version.to_owned(),
        ns: ns.map(str::to_owned),
    };
    Ok(match (req.method().clone(), name) {
        (Method::GET, None) => list_objects(state, &target).await,
        (Method::GET, Some(n)) => get_object(state, &target, &n).await,
        (Method::PATCH, Some(n)) => apply_object(state, &target, &n, req).await,
        (Method::DELETE, Some(n)) => delete_object(state, &target, &n).await,
        _ => not_allowed(),
    })
}

fn verb(method: &Method, name: &Option<String>) -> &'static str {
    match (method, name) {
        (&Method::GET, None) => "list",
        (&Method::GET, Some(_)) => "get",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, _) => "delete",
        _ => "create",
    }
}

fn resource_version(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// How long a watch of definitions waits for a change before its stream
/// ends (the client watches again from where it was).
const WATCH_WAIT: Duration = Duration::from_secs(5);

/// Lists the definitions, or watches them (`watch=true`), as `kubectl get
/// crd` and `kubectl wait --for=condition=Established crd/NAME` ask:
/// `fieldSelector=metadata.name=NAME` picks one. A watch answers the
/// changes after `resourceVersion` as watch events once there is one, or
/// an empty stream after [`WATCH_WAIT`] (a server may end a watch at any
/// time; the client watches again).
async fn list_definitions(state: &State, query: Option<&str>) -> Resp {
    let query = query.unwrap_or_default();
    let param = |key: &str| {
        form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    };
    let name = match param("fieldSelector") {
        None => None,
        Some(sel) => match sel.strip_prefix("metadata.name=") {
            Some(n) => Some(n.to_owned()),
            None if sel.is_empty() => None,
            None => {
                return bad_request(&format!(
                    "\"{sel}\" is not a known field selector: only \"metadata.name\""
                ))
            }
        },
    };
    let matching = || async {
        definitions(state).await.map(|all| {
            all.into_iter()
                .filter(|c| name.as_deref().is_none_or(|n| c["metadata"]["name"] == n))
                .collect::<Vec<_>>()
        })
    };
    if matches!(param("watch").as_deref(), Some("true" | "1")) {
        let since: u64 = param("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let deadline = tokio::time::Instant::now() + WATCH_WAIT;
        loop {
            let items = match matching().await {
                Ok(items) => items,
                Err(e) => return internal(e),
            };
            let changed: Vec<&Value> = items
                .iter()
                .filter(|c| resource_version(c) > since)
                .collect();
            if !changed.is_empty() || tokio::time::Instant::now() >= deadline {
                let events: String = changed
                    .iter()
                    .map(|c| format!("{}\n", json!({"type": "MODIFIED", "object": c})))
                    .collect();
                return hyper::Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/json")
                    .body(http_body_util::Full::new(hyper::body::Bytes::from(events)))
                    .expect("a valid response");
            }
            tokio::time::sleep(CONTROLLER_PERIOD).await;
        }
    }
    match matching().await {
        Ok(items) => {
            let version = items.iter().map(resource_version).max().unwrap_or(0);
            json_resp(
                StatusCode::OK,
                &json!({"apiVersion": GROUP_VERSION, "kind": "CustomResourceDefinitionList",
                        "metadata": {"resourceVersion": version.to_string()}, "items": items}),
            )
        }
        Err(e) => internal(e),
    }
}

async fn get_definition(state: &State, name: &str) -> Resp {
    let key = format!("{CRD_PREFIX}{name}");
    match state.store.object(&key, "customresourcedefinitions").await {
        Ok(Some(obj)) => json_resp(StatusCode::OK, &obj),
        Ok(None) => not_found("customresourcedefinitions.apiextensions.k8s.io", name),
        Err(e) => internal(e),
    }
}

async fn delete_definition(state: &State, name: &str) -> Resp {
    let key = format!("{CRD_PREFIX}{name}");
    match state.store.object(&key, "customresourcedefinitions").await {
        Ok(Some(obj)) => match state
            .store
            .delete_object(&key, "customresourcedefinitions")
            .await
        {
            Ok(_) => json_resp(StatusCode::OK, &obj),
            Err(e) => internal(e),
        },
        Ok(None) => not_found("customresourcedefinitions.apiextensions.k8s.io", name),
        Err(e) => internal(e),
    }
}

/// What kube-apiserver's validation of a definition refuses, as far as
/// Drover's addons could meet it
/// (staging/src/k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation/validation.go).
fn check_definition(name: &str, crd: &Value) -> Result<(), String> {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    if group.is_empty() {
        return Err("spec.group: Required value".into());
    }
    if !group.contains('.') {
        return Err(format!(
            "spec.group: Invalid value: {group:?}: should be a domain with at least one dot"
        ));
    }
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or_default();
    if plural.is_empty() {
        return Err("spec.names.plural: Required value".into());
    }
    if names["kind"].as_str().unwrap_or_default().is_empty() {
        return Err("spec.names.kind: Required value".into());
    }
    if name != format!("{plural}.{group}") {
        return Err(format!(
            "metadata.name: Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"
        ));
    }
    match spec["scope"].as_str() {
        Some("Namespaced" | "Cluster") => {}
        Some(other) => {
            return Err(format!(
                "spec.scope: Unsupported value: {other:?}: supported values: \"Cluster\", \"Namespaced\""
            ))
        }
        None => return Err("spec.scope: Required value".into()),
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    if versions.is_empty() {
        return Err("spec.versions: Invalid value: null: must have exactly one version marked as storage version".into());
    }
    if versions.iter().filter(|v| v["storage"] == true).count() != 1 {
        return Err(
            "spec.versions: Invalid value: must have exactly one version marked as storage version"
                .into(),
        );
    }
    for (i, v) in versions.iter().enumerate() {
        if v["name"].as_str().unwrap_or_default().is_empty() {
            return Err(format!("spec.versions[{i}].name: Required value"));
        }
        if !v["schema"]["openAPIV3Schema"].is_object() {
            return Err(format!(
                "spec.versions[{i}].schema.openAPIV3Schema: Required value: schemas are required"
            ));
        }
    }
    Ok(())
}

async fn apply_definition(state: &State, name: &str, req: Request<Incoming>) -> Resp {
    let kind = "CustomResourceDefinition";
    let problem = subdomain_problem(name);
    let patch = match read_apply(
        req,
        "custom resources",
        GROUP_VERSION,
        kind,
        name,
        problem,
        None,
    )
    .await
    {
        Ok(a) => a,
        Err(r) => return r,
    };
    let key = format!("{CRD_PREFIX}{name}");
    let plural = "customresourcedefinitions";
    let (mut obj, created) =
        match apply_over_stored(state, &key, plural, None, &patch, GROUP_VERSION, true).await {
            Ok(o) => o,
            Err(r) => return r,
        };
    if let Err(why) = check_definition(name, &obj) {
        return invalid(kind, name, &why);
    }
    if created {
        // A new definition has no accepted names and no conditions: the
        // controllers set them (the registry's PrepareForCreate).
        let stored: Vec<Value> = obj["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["storage"] == true)
            .map(|v| v["name"].clone())
            .collect();
        obj["status"] = json!({"acceptedNames": {"plural": "", "kind": ""},
                               "conditions": [], "storedVersions": stored});
    }
    store(
        state,
        &key,
        &obj,
        created,
        "customresourcedefinitions.apiextensions.k8s.io",
        name,
        name,
    )
    .await
}

/// A custom resource path's kind, version and namespace.
struct Target {
    kind: Kind,
    version: String,
    ns: Option<String>,
}

impl Target {
    fn api_version(&self) -> String {
        format!("{}/{}", self.kind.group, self.version)
    }
}

async fn list_objects(state: &State, t: &Target) -> Resp {
    let prefix = match &t.ns {
        Some(ns) => format!("/registry/{}/{}/{ns}/", t.kind.group, t.kind.plural),
        None => format!("/registry/{}/{}/", t.kind.group, t.kind.plural),
    };
    match state.store.objects(&prefix, &t.kind.plural).await {
        Ok(items) => json_resp(
            StatusCode::OK,
            &json!({"apiVersion": t.api_version(), "kind": format!("{}List", t.kind.kind),
                    "metadata": {}, "items": items}),
        ),
        Err(e) => internal(e),
    }
}

async fn get_object(state: &State, t: &Target, name: &str) -> Resp {
    let key = t.kind.key(t.ns.as_deref(), name);
    match state.store.object(&key, &t.kind.plural).await {
        Ok(Some(obj)) => json_resp(StatusCode::OK, &obj),
        Ok(None) => not_found(&t.kind.qualified(), name),
        Err(e) => internal(e),
    }
}

async fn delete_object(state: &State, t: &Target, name: &str) -> Resp {
    let key = t.kind.key(t.ns.as_deref(), name);
    match state.store.object(&key, &t.kind.plural).await {
        Ok(Some(obj)) => match state.store.delete_object(&key, &t.kind.plural).await {
            Ok(_) => json_resp(StatusCode::OK, &obj),
            Err(e) => internal(e),
        },
        Ok(None) => not_found(&t.kind.qualified(), name),
        Err(e) => internal(e),
    }
}

async fn apply_object(state: &State, t: &Target, name: &str, req: Request<Incoming>) -> Resp {
    let api_version = t.api_version();
    let ns = t.ns.as_deref();
    let problem = subdomain_problem(name);
    let read = read_apply(
        req,
        "custom resources",
        &api_version,
        &t.kind.kind,
        name,
        problem,
        ns,
    );
    let patch = match read.await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let key = t.kind.key(ns, name);
    let (obj, created) = match apply_over_stored(
        state,
        &key,
        &t.kind.plural,
        ns,
        &patch,
        &api_version,
        true,
    )
    .await
    {
        Ok(o) => o,
        Err(r) => return r,
    };
    let shown = shown_name(ns, name);
    store(
        state,
        &key,
        &obj,
        created,
        &t.kind.qualified(),
        &shown,
        &shown,
    )
    .await
}

/// The naming and establishing controllers, every [`CONTROLLER_PERIOD`]
/// until the API server stops. Each write is conditional on the revision
/// read, so the controllers of several API servers never undo each other
/// or an apply.
pub(super) async fn run_controller(state: std::sync::Arc<State>) {
    loop {
        tokio::time::sleep(CONTROLLER_PERIOD).await;
        if let Err(e) = reconcile(&state).await {
            eprintln!("standin-apiserver: customresourcedefinitions: {e:#}");
        }
    }
}

fn set_condition(crd: &mut Value, type_: &str, ok: bool, reason: &str, message: &str) {
    let now = super::now_rfc3339();
    let status_text = if ok { "True" } else { "False" };
    let mut conditions: Vec<Value> = crd["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let since = conditions
        .iter()
        .find(|c| c["type"] == type_ && c["status"] == status_text)
        .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_owned))
        .unwrap_or(now);
    conditions.retain(|c| c["type"] != type_);
    conditions.push(
        json!({"type": type_, "status": status_text, "lastTransitionTime": since,
                           "reason": reason, "message": message}),
    );
    crd["status"]["conditions"] = conditions.into();
}

/// Which of `kind`'s names another definition of its group has accepted
/// already (naming_controller.go's checks): the reason and message.
fn name_conflict(kind: &Kind, others: &[&Value]) -> Option<(&'static str, String)> {
    for other in others {
        if other["spec"]["group"] != kind.group.as_str() {
            continue;
        }
        let accepted = &other["status"]["acceptedNames"];
        let holds = |field: &str, name: &str| accepted[field] == name;
        if holds("plural", &kind.plural) {
            return Some((
                "PluralConflict",
                format!("{:?} is already in use", kind.plural),
            ));
        }
        if holds("singular", &kind.singular) {
            return Some((
                "SingularConflict",
                format!("{:?} is already in use", kind.singular),
            ));
        }
        if let Some(s) = kind
            .short
            .iter()
            .find(|s| strings(&accepted["shortNames"]).contains(s))
        {
            return Some(("ShortNamesConflict", format!("{s:?} is already in use")));
        }
        if holds("kind", &kind.kind) {
            return Some(("KindConflict", format!("{:?} is already in use", kind.kind)));
        }
        if holds("listKind", &format!("{}List", kind.kind)) {
            return Some((
                "ListKindConflict",
                format!("\"{}List\" is already in use", kind.kind),
            ));
        }
    }
    None
}

async fn reconcile(state: &State) -> anyhow::Result<()> {
    let all = state
        .store
        .objects_with_revisions(CRD_PREFIX, "customresourcedefinitions")
        .await?;
    let now = time::OffsetDateTime::now_utc();
    for (key, crd, revision) in &all {
        let Some(kind) = Kind::of(crd) else { continue };
        let mut next = crd.clone();
        if condition(crd, "NamesAccepted").is_none() {
            let others: Vec<&Value> = all
                .iter()
                .filter(|(k, _, _)| k != key)
                .map(|(_, c, _)| c)
                .collect();
            match name_conflict(&kind, &others) {
                None => {
                    next["status"]["acceptedNames"] = json!({
                        "plural": kind.plural, "singular": kind.singular,
                        "shortNames": kind.short, "kind": kind.kind,
                        "listKind": format!("{}List", kind.kind)});
                    set_condition(
                        &mut next,
                        "NamesAccepted",
                        true,
                        "NoConflicts",
                        "no conflicts found",
                    );
                }
                Some((reason, message)) => {
                    set_condition(&mut next, "NamesAccepted", false, reason, &message);
                    set_condition(
                        &mut next,
                        "Established",
                        false,
                        "NotAccepted",
                        "not all names are accepted",
                    );
                }
            }
        } else if condition_true(crd, "NamesAccepted") && !condition_true(crd, "Established") {
            let accepted_at = condition(crd, "NamesAccepted")
                .and_then(|c| c["lastTransitionTime"].as_str())
                .and_then(|t| {
                    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                        .ok()
                });
            if accepted_at.is_some_and(|t| now - t >= ESTABLISH_DELAY) {
                set_condition(
                    &mut next,
                    "Established",
                    true,
                    "InitialNamesAccepted",
                    "the initial names have been accepted",
                );
            }
        }
        if next != *crd {
            next["metadata"]["resourceVersion"] = (resource_version(crd) + 1).to_string().into();
        }
        if next != *crd && state.store.replace_object(key, &next, *revision).await? {
            println!(
                "standin-apiserver: customresourcedefinition {}: NamesAccepted={} Established={}",
                kind.qualified(),
                condition_true(&next, "NamesAccepted"),
                condition_true(&next, "Established")
            );
        }
    }
    Ok(())
}
