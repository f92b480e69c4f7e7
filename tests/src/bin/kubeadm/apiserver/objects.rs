//! The objects addons apply: ConfigMaps, Namespaces, ServiceAccounts,
//! Services, DaemonSets, Deployments and RBAC, served as the real API
//! server serves them to `kubectl get` and to server-side apply (`PATCH`
//! with `application/apply-patch+yaml`), strictly: an apply without a
//! `fieldManager`, a body whose apiVersion, kind, name or namespace is not
//! the URL's, an object without `metadata.name`, a namespace that does not
//! exist, or a workload whose selector does not match its template is
//! refused with the real server's status and message. An apply merges the
//! applied fields into what is stored and records the manager in
//! `managedFields`. Everything here is for admins, but for the reading of
//! the `kubelet-config` ConfigMap kubeadm allows joining machines and
//! nodes.

use serde_json::{json, Value};

use super::{forbidden, internal, json_resp, read_body, status, Identity, Resp, Routed, State};
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

/// One kind of object served here.
struct Resource {
    /// `""` for the core group.
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
}

const RESOURCES: &[Resource] = &[
    Resource {
        group: "",
        plural: "configmaps",
        kind: "ConfigMap",
        namespaced: true,
        short: &["cm"],
    },
    Resource {
        group: "",
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
        short: &["ns"],
    },
    Resource {
        group: "",
        plural: "serviceaccounts",
        kind: "ServiceAccount",
        namespaced: true,
        short: &["sa"],
    },
    Resource {
        group: "",
        plural: "services",
        kind: "Service",
        namespaced: true,
        short: &["svc"],
    },
    Resource {
        group: "apps",
        plural: "daemonsets",
        kind: "DaemonSet",
        namespaced: true,
        short: &["ds"],
    },
    Resource {
        group: "apps",
        plural: "deployments",
        kind: "Deployment",
        namespaced: true,
        short: &["deploy"],
    },
    Resource {
        group: RBAC,
        plural: "clusterroles",
        kind: "ClusterRole",
        namespaced: false,
        short: &[],
    },
    Resource {
        group: RBAC,
        plural: "clusterrolebindings",
        kind: "ClusterRoleBinding",
        namespaced: false,
        short: &[],
    },
    Resource {
        group: RBAC,
        plural: "roles",
        kind: "Role",
        namespaced: true,
        short: &[],
    },
    Resource {
        group: RBAC,
        plural: "rolebindings",
        kind: "RoleBinding",
        namespaced: true,
        short: &[],
    },
];

const RBAC: &str = "rbac.authorization.k8s.io";

/// Namespaces every cluster has from the start.
const BUILTIN_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Paths the API server answers elsewhere (kubeadm's ConfigMaps).
const ELSEWHERE: &[&str] = &[
    "/api/v1/namespaces/kube-public/configmaps/cluster-info",
    "/api/v1/namespaces/kube-system/configmaps/kubeadm-config",
];

impl Resource {
    fn group_version(&self) -> String {
        if self.group.is_empty() {
            "v1".into()
        } else {
            format!("{}/v1", self.group)
        }
    }

    /// `configmaps` or `deployments.apps`, as the API server names a
    /// resource in its messages.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.into()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn key(&self, ns: Option<&str>, name: &str) -> String {
        match ns {
            Some(ns) => format!("/registry/{}/{ns}/{name}", self.plural),
            None => format!("/registry/{}/{name}", self.plural),
        }
    }

    fn discovery(&self) -> Value {
        json!({"name": self.plural, "singularName": self.kind.to_lowercase(),
               "namespaced": self.namespaced, "kind": self.kind,
               "verbs": ["create", "delete", "get", "list", "patch", "update"],
               "shortNames": self.short})
    }
}

/// The core resources served here, for `/api/v1`.
pub(super) fn core_resources() -> Vec<Value> {
    RESOURCES
        .iter()
        .filter(|r| r.group.is_empty())
        .map(Resource::discovery)
        .collect()
}

/// The groups served here, for `/apis`.
pub(super) fn groups() -> Vec<Value> {
    ["apps", RBAC]
        .iter()
        .map(|g| {
            let v1 = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
            json!({"name": g, "versions": [v1.clone()], "preferredVersion": v1})
        })
        .collect()
}

/// What a path names.
struct Target {
    resource: &'static Resource,
    ns: Option<String>,
    name: Option<String>,
}

fn target(path: &str) -> Option<Result<Target, &'static str>> {
    let (group, rest) = if let Some(rest) = path.strip_prefix("/api/v1") {
        ("", rest)
    } else {
        let rest = path.strip_prefix("/apis/")?;
        let (group, rest) = rest.split_once('/')?;
        let rest = rest.strip_prefix("v1")?;
        (group, rest)
    };
    if rest.is_empty() {
        // Discovery of a group version served here.
        return (!group.is_empty() && RESOURCES.iter().any(|r| r.group == group))
            .then_some(Err("discovery"));
    }
    let parts: Vec<&str> = rest.strip_prefix('/')?.split('/').collect();
    let (ns, plural, name) = match parts.as_slice() {
        ["namespaces", ns, plural] => (Some(*ns), *plural, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
        [plural] => (None, *plural, None),
        [plural, name] => (None, *plural, Some(*name)),
        _ => return None,
    };
    let resource = RESOURCES
        .iter()
        .find(|r| r.group == group && r.plural == plural)?;
    if ns.is_some() && !resource.namespaced {
        return None;
    }
    // A namespaced object is named within its namespace.
    if resource.namespaced && ns.is_none() && name.is_some() {
        return None;
    }
    Some(Ok(Target {
        resource,
        ns: ns.map(str::to_owned),
        name: name.map(str::to_owned),
    }))
}

/// Serves the objects of [`RESOURCES`]; anything else goes back.
pub(super) async fn route(state: &State, who: &Identity, req: Request<Incoming>) -> Routed {
    let path = req.uri().path().to_owned();
    if ELSEWHERE.contains(&path.as_str()) {
        return Err(req);
    }
    let target = match target(&path) {
        None => return Err(req),
        Some(Err(_)) => {
            let group = path.trim_start_matches("/apis/").trim_end_matches("/v1");
            let resources: Vec<Value> = RESOURCES
                .iter()
                .filter(|r| r.group == group)
                .map(Resource::discovery)
                .collect();
            return Ok(json_resp(
                StatusCode::OK,
                &json!({"kind": "APIResourceList", "apiVersion": "v1",
                        "groupVersion": format!("{group}/v1"), "resources": resources}),
            ));
        }
        Some(Ok(t)) => t,
    };
    let method = req.method().clone();
    // Besides the admins, joining machines and nodes read the cluster's
    // kubelet configuration (kubeadm's Role `kubeadm:kubelet-config`, see
    // `Identity::may_read_node_config`).
    let reads_kubelet_config = method == Method::GET
        && target.resource.plural == "configmaps"
        && target.ns.as_deref() == Some("kube-system")
        && target.name.as_deref() == Some(crate::kubelet::CONFIG_MAP);
    let allowed = who.is_admin() || (reads_kubelet_config && who.may_read_node_config());
    if !allowed {
        let verb = match (&method, &target.name) {
            (&Method::GET, None) => "list",
            (&Method::GET, Some(_)) => "get",
            (&Method::PATCH, _) => "patch",
            (&Method::PUT, _) => "update",
            (&Method::DELETE, _) => "delete",
            _ => "create",
        };
        return Ok(forbidden(
            who,
            verb,
            target.resource.plural,
            target.ns.as_deref().unwrap_or_default(),
        ));
    }
    Ok(match (method, target.name.clone()) {
        (Method::GET, None) => list(state, &target).await,
        (Method::GET, Some(name)) => get(state, &target, &name).await,
        (Method::PATCH, Some(name)) => apply(state, &target, &name, req).await,
        (Method::POST, None) => write(state, &target, None, req).await,
        (Method::PUT, Some(name)) => write(state, &target, Some(name), req).await,
        (Method::DELETE, Some(name)) => delete(state, &target, &name).await,
        _ => not_allowed(),
    })
}

pub(super) fn not_allowed() -> Resp {
    status(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
    )
}

pub(super) fn not_found(what: &str, name: &str) -> Resp {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{what} \"{name}\" not found"),
    )
}

pub(super) fn invalid(kind: &str, name: &str, why: &str) -> Resp {
    status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        &format!("{kind} \"{name}\" is invalid: {why}"),
    )
}

pub(super) fn bad_request(message: &str) -> Resp {
    status(StatusCode::BAD_REQUEST, "BadRequest", message)
}

async fn list(state: &State, t: &Target) -> Resp {
    let prefix = match &t.ns {
        Some(ns) => format!("/registry/{}/{ns}/", t.resource.plural),
        None => format!("/registry/{}/", t.resource.plural),
    };
    let mut items = match state.store.objects(&prefix, t.resource.plural).await {
        Ok(items) => items,
        Err(e) => return internal(e),
    };
    if t.resource.kind == "Namespace" {
        for ns in BUILTIN_NAMESPACES {
            if !items.iter().any(|o| o["metadata"]["name"] == *ns) {
                items.push(builtin_namespace(ns));
            }
        }
    }
    json_resp(
        StatusCode::OK,
        &json!({"apiVersion": t.resource.group_version(),
                "kind": format!("{}List", t.resource.kind),
                "metadata": {}, "items": items}),
    )
}

fn builtin_namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name}, "status": {"phase": "Active"}})
}

async fn get(state: &State, t: &Target, name: &str) -> Resp {
    if t.resource.kind == "Namespace" && BUILTIN_NAMESPACES.contains(&name) {
        return json_resp(StatusCode::OK, &builtin_namespace(name));
    }
    match state
        .store
        .object(&t.resource.key(t.ns.as_deref(), name), t.resource.plural)
        .await
    {
        Ok(Some(obj)) => json_resp(StatusCode::OK, &obj),
        Ok(None) => not_found(&t.resource.qualified(), name),
        Err(e) => internal(e),
    }
}

async fn delete(state: &State, t: &Target, name: &str) -> Resp {
    let key = t.resource.key(t.ns.as_deref(), name);
    match state.store.object(&key, t.resource.plural).await {
        Ok(Some(obj)) => match state.store.delete_object(&key, t.resource.plural).await {
            Ok(_) => json_resp(StatusCode::OK, &obj),
            Err(e) => internal(e),
        },
        Ok(None) => not_found(&t.resource.qualified(), name),
        Err(e) => internal(e),
    }
}

/// Whether namespace `ns` exists.
pub(super) async fn namespace_exists(state: &State, ns: &str) -> anyhow::Result<bool> {
    if BUILTIN_NAMESPACES.contains(&ns) {
        return Ok(true);
    }
    Ok(state
        .store
        .object(&format!("/registry/namespaces/{ns}"), "namespaces")
        .await?
        .is_some())
}

/// A lowercase RFC 1123 subdomain.
pub(super) fn is_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Why `name` is no valid name of a `kind`, by the rule the real API
/// server validates it with: RBAC objects any path segment
/// (pkg/apis/rbac/validation/validation.go `ValidateRBACName`, so
/// `system:coredns` is fine), a Service a DNS-1035 label
/// (pkg/apis/core/validation/validation.go `ValidateServiceName`), a
/// Namespace a DNS-1123 label, everything else a DNS-1123 subdomain.
fn name_problem(kind: &str, name: &str) -> Option<String> {
    match kind {
        "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding" => {
            if name == "." || name == ".." {
                Some(format!(
                    "metadata.name: Invalid value: {name:?}: may not be '{name}'"
                ))
            } else if name.contains('/') || name.contains('%') {
                Some(format!(
                    "metadata.name: Invalid value: {name:?}: may not contain '/' or '%'"
                ))
            } else {
                None
            }
        }
        "Service" | "Namespace" => {
            let label = name.len() <= 63 && is_subdomain(name) && !name.contains('.');
            let starts_alpha = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase());
            if kind == "Service" && !(label && starts_alpha) {
                Some(format!("metadata.name: Invalid value: {name:?}: a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character"))
            } else if kind == "Namespace" && !label {
                Some(format!("metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"))
            } else {
                None
            }
        }
        _ => subdomain_problem(name),
    }
}

/// Why `name` is no DNS-1123 subdomain, the name of most kinds.
pub(super) fn subdomain_problem(name: &str) -> Option<String> {
    (!is_subdomain(name)).then(|| format!("metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"))
}

/// What the real API server checks of these kinds, as far as tests use
/// them: ConfigMap data holds strings; a workload's selector matches its
/// Pod template's labels.
fn check_kind(kind: &str, obj: &Value) -> Result<(), String> {
    match kind {
        "ConfigMap" => {
            if let Some(data) = obj.get("data") {
                let Some(map) = data.as_object() else {
                    return Err("data: Invalid value: must be a map of strings".into());
                };
                for (k, v) in map {
                    if !v.is_string() {
                        return Err(format!("data[{k}]: Invalid value: must be a string"));
                    }
                }
            }
            Ok(())
        }
        "DaemonSet" | "Deployment" => {
            let Some(selector) = obj["spec"]["selector"]["matchLabels"].as_object() else {
                return Err("spec.selector: Required value".into());
            };
            let labels = &obj["spec"]["template"]["metadata"]["labels"];
            let matches = selector.iter().all(|(k, v)| labels[k] == *v);
            if selector.is_empty() || !matches {
                return Err(format!(
                    "spec.template.metadata.labels: Invalid value: {labels}: `selector` does not match template `labels`"
                ));
            }
            if obj["spec"]["template"]["spec"]["containers"]
                .as_array()
                .is_none_or(|c| c.is_empty())
            {
                return Err("spec.template.spec.containers: Required value".into());
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Merges `applied` into `stored`: maps field by field, anything else
/// replaced.
pub(super) fn merge(stored: &mut Value, applied: &Value) {
    match (stored.as_object_mut(), applied.as_object()) {
        (Some(s), Some(a)) => {
            for (k, v) in a {
                match s.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        s.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        _ => *stored = applied.clone(),
    }
}

/// `PATCH` with an apply patch: server-side apply.
async fn apply(state: &State, t: &Target, name: &str, req: Request<Incoming>) -> Resp {
    let r = t.resource;
    let gv = r.group_version();
    let ns = t.ns.as_deref();
    let problem = name_problem(r.kind, name);
    let patch = match read_apply(req, &r.qualified(), &gv, r.kind, name, problem, ns).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    if let Err(why) = check_kind(r.kind, &patch.0) {
        return invalid(r.kind, name, &why);
    }
    let key = r.key(ns, name);
    let (mut obj, created) =
        match apply_over_stored(state, &key, r.plural, ns, &patch, &gv, false).await {
            Ok(o) => o,
            Err(r) => return r,
        };
    if r.kind == "Namespace" {
        obj["status"] = json!({"phase": "Active"});
    }
    let shown = format!("{} (field manager {})", shown_name(ns, name), patch.1);
    store(state, &key, &obj, created, &r.qualified(), name, &shown).await
}

/// How the log names object `name` of namespace `ns`.
pub(super) fn shown_name(ns: Option<&str>, name: &str) -> String {
    ns.map_or(name.to_owned(), |ns| format!("{ns}/{name}"))
}

/// Applies `patch` (from [`read_apply`]: the body and the field manager)
/// over what is stored at `key`, in namespace `ns` when namespaced (which
/// must exist): the object to store, and whether it is created.
pub(super) async fn apply_over_stored(
    state: &State,
    key: &str,
    plural: &str,
    ns: Option<&str>,
    patch: &(Value, String),
    api_version: &str,
    keep_status: bool,
) -> Result<(Value, bool), Resp> {
    check_namespace(state, ns).await?;
    let current = state.store.object(key, plural).await.map_err(internal)?;
    let created = current.is_none();
    let mut obj = applied_object(current, &patch.0, &patch.1, api_version, keep_status);
    if let Some(ns) = ns {
        obj["metadata"]["namespace"] = ns.into();
    }
    Ok((obj, created))
}

/// The entries of `obj`'s `managedFields` that `keep` keeps.
fn managed_fields(obj: &Value, keep: impl Fn(&Value) -> bool) -> Vec<Value> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| keep(m))
        .cloned()
        .collect()
}

/// A request header's value, `""` when absent or not text.
fn header(req: &Request<Incoming>, name: hyper::header::HeaderName) -> String {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// The refusal of a body in another media type than `accepted`; `note`
/// says what the stand-in does.
fn unsupported_media_type(accepted: &str, note: &str) -> Resp {
    status(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "UnsupportedMediaType",
        &format!("the body of the request was in an unknown format - accepted media types include: {accepted} (the stand-in API server {note})"),
    )
}

/// The refusal of a write over a newer version of object `name`.
fn conflict(what: &str, name: &str) -> Resp {
    status(
        StatusCode::CONFLICT,
        "Conflict",
        &format!("Operation cannot be fulfilled on {what} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
    )
}

/// The refusal of a body whose namespace is not the URL's `ns`, if it is
/// one.
fn body_namespace_refusal(ns: Option<&str>, obj: &Value) -> Option<Resp> {
    match (ns, obj["metadata"]["namespace"].as_str()) {
        (Some(ns), Some(body_ns)) if ns != body_ns => Some(bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => None,
    }
}

/// Refuses an object of namespace `ns` (if namespaced) when `ns` does not
/// exist.
async fn check_namespace(state: &State, ns: Option<&str>) -> Result<(), Resp> {
    if let Some(ns) = ns {
        match namespace_exists(state, ns).await {
            Ok(true) => {}
            Ok(false) => return Err(not_found("namespaces", ns)),
            Err(e) => return Err(internal(e)),
        }
    }
    Ok(())
}

/// The fields of an apply patch every kind checks: the media type, the
/// field manager, the body's apiVersion, kind and name against the URL's,
/// then the name itself (`name_problem`: why the kind refuses it) and the
/// body's namespace against the URL's `ns`.
/// `applies` names what the stand-in applies, for the media type refusal.
pub(super) async fn read_apply(
    req: Request<Incoming>,
    applies: &str,
    api_version: &str,
    kind: &str,
    name: &str,
    name_problem: Option<String>,
    ns: Option<&str>,
) -> Result<(Value, String), Resp> {
    if header(&req, hyper::header::CONTENT_TYPE) != "application/apply-patch+yaml" {
        return Err(unsupported_media_type(
            "application/apply-patch+yaml",
            &format!("applies {applies} by server-side apply only"),
        ));
    }
    let query = req.uri().query().unwrap_or_default().to_owned();
    let manager = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "fieldManager")
        .map(|(_, v)| v.into_owned())
        .filter(|m| !m.is_empty());
    let Some(manager) = manager else {
        return Err(invalid(
            "PatchOptions.meta.k8s.io",
            "",
            "fieldManager: Required value: is required for apply patch",
        ));
    };
    let body = read_body(req).await?;
    let applied: Value = match serde_saphyr::from_str::<Value>(&String::from_utf8_lossy(&body)) {
        Ok(v) if v.is_object() => v,
        Ok(_) => return Err(bad_request("the apply patch is not an object")),
        Err(e) => return Err(bad_request(&format!("error decoding YAML: {e}"))),
    };
    if applied["apiVersion"] != api_version {
        return Err(bad_request(&format!(
            "the API version in the data ({}) does not match the expected API version ({api_version})",
            applied["apiVersion"].as_str().unwrap_or_default()
        )));
    }
    if applied["kind"] != kind {
        return Err(bad_request(&format!(
            "the kind in the data ({}) does not match the expected kind ({kind})",
            applied["kind"].as_str().unwrap_or_default()
        )));
    }
    let body_name = applied["metadata"]["name"].as_str().unwrap_or_default();
    if body_name.is_empty() {
        return Err(invalid(
            kind,
            "",
            "metadata.name: Required value: name is required",
        ));
    }
    if body_name != name {
        return Err(bad_request(&format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    if let Some(why) = name_problem {
        return Err(invalid(kind, name, &why));
    }
    if let Some(refusal) = body_namespace_refusal(ns, &applied) {
        return Err(refusal);
    }
    Ok((applied, manager))
}

/// Merges `applied` into `current` (or a new object) and stamps it as
/// server-side apply does: uid, creation time, resourceVersion, the
/// manager's entry in `managedFields`. The status is applied too unless
/// `keep_status` (a kind with a status subresource).
fn applied_object(
    current: Option<Value>,
    applied: &Value,
    manager: &str,
    api_version: &str,
    keep_status: bool,
) -> Value {
    let now = super::now_rfc3339();
    let mut obj = current.unwrap_or_else(|| {
        json!({"metadata": {"uid": format!("{:032x}", rand::random::<u128>()),
                            "creationTimestamp": now.clone()}})
    });
    // Status is not applied through the main resource.
    let status = obj.get("status").cloned();
    merge(&mut obj, applied);
    if keep_status {
        match status {
            Some(s) => obj["status"] = s,
            None => {
                if let Some(o) = obj.as_object_mut() {
                    o.remove("status");
                }
            }
        }
    }
    let version = obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    obj["metadata"]["resourceVersion"] = version.to_string().into();
    let mut managed = managed_fields(&obj, |m| m["manager"] != manager);
    managed.push(
        json!({"manager": manager, "operation": "Apply", "apiVersion": api_version,
                        "time": now, "fieldsType": "FieldsV1"}),
    );
    obj["metadata"]["managedFields"] = managed.into();
    obj
}

/// Stores `obj` at `key` (created when `created`), answering as the API
/// server does; `shown` is how the log line names it.
pub(super) async fn store(
    state: &State,
    key: &str,
    obj: &Value,
    created: bool,
    what: &str,
    name: &str,
    shown: &str,
) -> Resp {
    match state.store.put_object(key, obj, created).await {
        Ok(true) => {
            println!("standin-apiserver: applied {what} {shown}");
            json_resp(
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                obj,
            )
        }
        Ok(false) => conflict(what, name),
        Err(e) => internal(e),
    }
}

/// The field manager of a create or an update: `fieldManager`, else the
/// client's user agent up to its first `/` (as the real API server
/// defaults it: staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go,
/// `prefixFromUserAgent`).
fn update_manager(query: &str, user_agent: &str) -> String {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "fieldManager")
        .map(|(_, v)| v.into_owned())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| user_agent.split('/').next().unwrap_or_default().to_owned())
}

/// `POST` to a collection (create; `name` is `None`) or `PUT` to an
/// object (update), with the whole object as JSON, as kubeadm's
/// `CreateOrUpdate` helpers (cmd/kubeadm/app/util/apiclient/idempotency.go)
/// and `kubectl create` / `replace` send it. The rules are the real
/// server's (staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go
/// `Create` and `Update`, pkg/registry/apps/{daemonset,deployment}/strategy.go):
/// a create of an existing name is `AlreadyExists`; an update of a missing
/// object is `NotFound` (these kinds allow no create on update); an update
/// naming a `resourceVersion` other than the stored one is a `Conflict`;
/// a workload's `spec.selector` is immutable; `uid`, `creationTimestamp`
/// and `status` stay the server's; `metadata.generation` counts changes of
/// `spec`.
async fn write(
    state: &State,
    t: &Target,
    url_name: Option<String>,
    req: Request<Incoming>,
) -> Resp {
    let r = t.resource;
    if !header(&req, hyper::header::CONTENT_TYPE).starts_with("application/json") {
        return unsupported_media_type(
            "application/json",
            &format!("reads {} as JSON only", r.qualified()),
        );
    }
    let user_agent = header(&req, hyper::header::USER_AGENT);
    let manager = update_manager(req.uri().query().unwrap_or_default(), &user_agent);
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mut obj: Value = match serde_json::from_slice::<Value>(&body) {
        Ok(v) if v.is_object() => v,
        Ok(_) => return bad_request("the object is not a JSON object"),
        Err(e) => return bad_request(&format!("error decoding JSON: {e}")),
    };
    let gv = r.group_version();
    if obj["apiVersion"] != gv.as_str() || obj["kind"] != r.kind {
        return bad_request(&format!(
            "the API version and kind in the data ({} {}) do not match the expected ones ({gv} {})",
            obj["apiVersion"].as_str().unwrap_or_default(),
            obj["kind"].as_str().unwrap_or_default(),
            r.kind
        ));
    }
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if name.is_empty() {
        return invalid(
            r.kind,
            "",
            "metadata.name: Required value: name or generateName is required",
        );
    }
    if let Some(url_name) = &url_name {
        if *url_name != name {
            return bad_request(&format!(
                "the name of the object ({name}) does not match the name on the URL ({url_name})"
            ));
        }
    }
    if let Some(why) = name_problem(r.kind, &name) {
        return invalid(r.kind, &name, &why);
    }
    if let Some(refusal) = body_namespace_refusal(t.ns.as_deref(), &obj) {
        return refusal;
    }
    if let Err(why) = check_kind(r.kind, &obj) {
        return invalid(r.kind, &name, &why);
    }
    if let Err(r) = check_namespace(state, t.ns.as_deref()).await {
        return r;
    }
    if let Some(ns) = &t.ns {
        obj["metadata"]["namespace"] = ns.as_str().into();
    }
    let key = r.key(t.ns.as_deref(), &name);
    let stored = match state.store.object_with_revision(&key, r.plural).await {
        Ok(s) => s,
        Err(e) => return internal(e),
    };
    let now = super::now_rfc3339();
    let conflict = || conflict(&r.qualified(), &name);
    let entry = json!({"manager": manager, "operation": "Update", "apiVersion": gv,
                       "time": now, "fieldsType": "FieldsV1"});
    let written = match (url_name.is_some(), stored) {
        (false, Some(_)) => {
            return status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                &format!("{} \"{name}\" already exists", r.qualified()),
            )
        }
        (true, None) => return not_found(&r.qualified(), &name),
        (false, None) => {
            let meta = &mut obj["metadata"];
            meta["uid"] = format!("{:032x}", rand::random::<u128>()).into();
            meta["creationTimestamp"] = now.clone().into();
            meta["resourceVersion"] = "1".into();
            meta["managedFields"] = json!([entry]);
            if obj.get("spec").is_some() {
                obj["metadata"]["generation"] = 1.into();
            }
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
            if r.kind == "Namespace" {
                obj["status"] = json!({"phase": "Active"});
            }
            state.store.put_object(&key, &obj, true).await
        }
        (true, Some((current, revision))) => {
            let was = current["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("0")
                .to_owned();
            match obj["metadata"]["resourceVersion"].as_str() {
                Some(v) if v != was => return conflict(),
                _ => {}
            }
            if matches!(r.kind, "DaemonSet" | "Deployment")
                && obj["spec"]["selector"] != current["spec"]["selector"]
            {
                return invalid(
                    r.kind,
                    &name,
                    &format!(
                        "spec.selector: Invalid value: {}: field is immutable",
                        obj["spec"]["selector"]
                    ),
                );
            }
            for k in ["uid", "creationTimestamp"] {
                obj["metadata"][k] = current["metadata"][k].clone();
            }
            let generation = current["metadata"]["generation"].as_u64().unwrap_or(0);
            if current.get("spec").is_some() || obj.get("spec").is_some() {
                let changed = obj["spec"] != current["spec"];
                obj["metadata"]["generation"] = (generation + u64::from(changed)).max(1).into();
            }
            let version = was.parse::<u64>().unwrap_or(0) + 1;
            obj["metadata"]["resourceVersion"] = version.to_string().into();
            let mut managed = managed_fields(&current, |m| {
                !(m["manager"] == manager.as_str() && m["operation"] == "Update")
            });
            managed.push(entry);
            obj["metadata"]["managedFields"] = managed.into();
            match current.get("status") {
                Some(st) => obj["status"] = st.clone(),
                None => {
                    if let Some(o) = obj.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            state.store.replace_object(&key, &obj, revision).await
        }
    };
    match written {
        Ok(true) => {
            let created = url_name.is_none();
            println!(
                "standin-apiserver: {} {} {} (field manager {manager})",
                if created { "created" } else { "updated" },
                r.qualified(),
                t.ns.as_ref()
                    .map_or(name.clone(), |ns| format!("{ns}/{name}"))
            );
            json_resp(
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                &obj,
            )
        }
        // Another writer got there first.
        Ok(false) if url_name.is_none() => status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", r.qualified()),
        ),
        Ok(false) => conflict(),
        Err(e) => internal(e),
    }
}
