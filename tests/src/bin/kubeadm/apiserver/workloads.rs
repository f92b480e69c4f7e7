//! Pods, PodDisruptionBudgets and the Eviction API: as much as `kubectl
//! drain` and a drain by the agent use. Pods are stored as given (there is
//! no scheduler: a Pod runs on the node its `spec.nodeName` names, and is
//! Pending without one), `spec.terminationGracePeriodSeconds` defaulted to
//! 30 as the API server's defaulting does. An eviction is refused with 429
//! while a PodDisruptionBudget selecting the Pod allows no disruption, as
//! the real API server does. Deletion (by `DELETE` or an eviction) is
//! graceful, as `pkg/registry/core/pod/strategy.go` (`CheckGracefulDelete`)
//! and `staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go`
//! (`BeforeDelete`) make it: a scheduled, unfinished Pod gets
//! `metadata.deletionTimestamp` (now plus its grace period) and
//! `deletionGracePeriodSeconds` and stays, Terminating, until its kubelet
//! has killed its containers at the end of the grace period (the stand-in's
//! containers ignore SIGTERM, so it takes all of it) and deletes it: a Pod
//! is removed once its deadline passed, its Node is Ready (a dead kubelet
//! deletes nothing) and it has no finalizers left; a Pod whose Node is gone
//! is removed by the Pod garbage collector (`pkg/controller/podgc`). A
//! second deletion only shortens the grace period. Everything here is for
//! admins.

use serde_json::Value;

use super::{forbidden, internal, json_resp, read_json, status, Identity, Resp, Routed, State};
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::json;

const POD_PREFIX: &str = "/registry/pods/";
const PDB_PREFIX: &str = "/registry/poddisruptionbudgets/";
/// The policy API group's version path.
pub(super) const POLICY_V1: &str = "/apis/policy/v1";

/// The `policy` group, for `/apis`.
pub(super) fn policy_group() -> Value {
    let v1 = json!({"groupVersion": "policy/v1", "version": "v1"});
    json!({"name": "policy", "versions": [v1.clone()], "preferredVersion": v1})
}

/// `/apis/policy/v1`.
pub(super) fn policy_resources() -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "policy/v1",
        "resources": [
            {"name": "poddisruptionbudgets", "singularName": "poddisruptionbudget",
             "namespaced": true, "kind": "PodDisruptionBudget",
             "verbs": ["create", "delete", "get", "list"], "shortNames": ["pdb"]},
        ],
    })
}

/// The core resources this file serves, for `/api/v1`. `pods/eviction`
/// names its group and version, which is how kubectl finds the Eviction
/// API.
pub(super) fn core_resources() -> [Value; 2] {
    [
        json!({"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
               "verbs": ["create", "delete", "get", "list"], "shortNames": ["po"]}),
        json!({"name": "pods/eviction", "singularName": "", "namespaced": true,
               "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]}),
    ]
}

/// What a path names.
enum Target {
    /// `/api/v1/pods`: every namespace.
    AllPods,
    /// `/api/v1/namespaces/NS/pods[/NAME[/eviction]]`.
    Pods {
        ns: String,
        name: Option<String>,
        eviction: bool,
    },
    /// `/apis/policy/v1/poddisruptionbudgets`.
    AllPdbs,
    /// `/apis/policy/v1/namespaces/NS/poddisruptionbudgets[/NAME]`.
    Pdbs { ns: String, name: Option<String> },
}

fn target(path: &str) -> Option<Target> {
    if path == "/api/v1/pods" {
        return Some(Target::AllPods);
    }
    if path == format!("{POLICY_V1}/poddisruptionbudgets") {
        return Some(Target::AllPdbs);
    }
    let (rest, pods) = match path.strip_prefix("/api/v1/namespaces/") {
        Some(rest) => (rest, true),
        None => (path.strip_prefix("/apis/policy/v1/namespaces/")?, false),
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let resource = if pods { "pods" } else { "poddisruptionbudgets" };
    match parts.as_slice() {
        [ns, r] if *r == resource => Some((ns, None, false)),
        [ns, r, name] if *r == resource => Some((ns, Some(*name), false)),
        [ns, "pods", name, "eviction"] if pods => Some((ns, Some(*name), true)),
        _ => None,
    }
    .filter(|(ns, name, _)| !ns.is_empty() && name.is_none_or(|n| !n.is_empty()))
    .map(|(ns, name, eviction)| {
        let (ns, name) = (ns.to_string(), name.map(str::to_owned));
        if pods {
            Target::Pods { ns, name, eviction }
        } else {
            Target::Pdbs { ns, name }
        }
    })
}

/// Serves the request if its path is one of this file's; `None` otherwise.
pub(super) async fn route(state: &State, who: &Identity, req: Request<Incoming>) -> Routed {
    let Some(target) = target(req.uri().path()) else {
        return Err(req);
    };
    if !who.is_admin() {
        let (resource, ns) = match &target {
            Target::AllPods => ("pods", ""),
            Target::Pods { ns, .. } => ("pods", ns.as_str()),
            Target::AllPdbs => ("poddisruptionbudgets", ""),
            Target::Pdbs { ns, .. } => ("poddisruptionbudgets", ns.as_str()),
        };
        return Ok(forbidden(
            who,
            &req.method().as_str().to_lowercase(),
            resource,
            ns,
        ));
    }
    let method = req.method().clone();
    let query = req.uri().query().unwrap_or_default().to_owned();
    Ok(match (method, target) {
        (Method::GET, Target::AllPods) => list_pods(state, None, &query).await,
        (Method::GET, Target::Pods { ns, name: None, .. }) => {
            list_pods(state, Some(&ns), &query).await
        }
        (Method::POST, Target::Pods { ns, name: None, .. }) => {
            create(state, req, &ns, Kind::Pod).await
        }
        (
            Method::GET,
            Target::Pods {
                ns,
                name: Some(name),
                eviction: false,
            },
        ) => get(state, &ns, &name, Kind::Pod).await,
        (
            Method::DELETE,
            Target::Pods {
                ns,
                name: Some(name),
                eviction: false,
            },
        ) => delete_pod(state, req, &ns, &name, &query).await,
        (
            Method::POST,
            Target::Pods {
                ns,
                name: Some(name),
                eviction: true,
            },
        ) => evict(state, &ns, &name).await,
        (Method::GET, Target::AllPdbs) => list_pdbs(state, None).await,
        (Method::GET, Target::Pdbs { ns, name: None }) => list_pdbs(state, Some(&ns)).await,
        (Method::POST, Target::Pdbs { ns, name: None }) => create(state, req, &ns, Kind::Pdb).await,
        (
            Method::GET,
            Target::Pdbs {
                ns,
                name: Some(name),
            },
        ) => get(state, &ns, &name, Kind::Pdb).await,
        (
            Method::DELETE,
            Target::Pdbs {
                ns,
                name: Some(name),
            },
        ) => delete(state, &ns, &name, Kind::Pdb).await,
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ),
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Pod,
    Pdb,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Pod => POD_PREFIX,
            Kind::Pdb => PDB_PREFIX,
        }
    }
    fn resource(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::Pdb => "poddisruptionbudgets.policy",
        }
    }
    fn type_meta(self) -> (&'static str, &'static str) {
        match self {
            Kind::Pod => ("v1", "Pod"),
            Kind::Pdb => ("policy/v1", "PodDisruptionBudget"),
        }
    }
    fn key(self, ns: &str, name: &str) -> String {
        format!("{}{ns}/{name}", self.prefix())
    }
}

fn not_found(kind: Kind, name: &str) -> Resp {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{} \"{name}\" not found", kind.resource()),
    )
}

fn invalid(kind: Kind, name: &str, why: &str) -> Resp {
    status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        &format!("{} \"{name}\" is invalid: {why}", kind.resource()),
    )
}

/// `POST`: stores a new Pod or PodDisruptionBudget with the fields the API
/// server sets (namespace, uid, creation time; a Pod's phase).
async fn create(state: &State, req: Request<Incoming>, ns: &str, kind: Kind) -> Resp {
    let mut obj = match read_json(req).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let (api_version, kind_name) = kind.type_meta();
    if obj["kind"] != kind_name || obj["apiVersion"] != api_version {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &format!("the body must be a {api_version} {kind_name}"),
        );
    }
    let Some(name) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
        return invalid(kind, "", "metadata.name: Required value");
    };
    if obj["metadata"]["namespace"]
        .as_str()
        .is_some_and(|n| n != ns)
    {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request",
        );
    }
    if kind == Kind::Pdb {
        if let Err(why) = check_pdb_spec(&obj["spec"]) {
            return invalid(kind, &name, &why);
        }
    }
    obj["metadata"]["namespace"] = ns.into();
    obj["metadata"]["uid"] = format!("{:032x}", rand::random::<u128>()).into();
    obj["metadata"]["creationTimestamp"] = super::now_rfc3339().into();
    if kind == Kind::Pod {
        // pkg/apis/core/v1/defaults.go (SetDefaults_PodSpec).
        if obj["spec"].get("terminationGracePeriodSeconds").is_none() {
            obj["spec"]["terminationGracePeriodSeconds"] = DEFAULT_GRACE_SECONDS.into();
        }
        let scheduled = obj["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty());
        obj["status"] = if scheduled {
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
        } else {
            json!({"phase": "Pending"})
        };
    }
    match state
        .store
        .put_object(&kind.key(ns, &name), &obj, true)
        .await
    {
        Ok(true) => {
            println!("standin-apiserver: created {} {ns}/{name}", kind.resource());
            json_resp(StatusCode::CREATED, &obj)
        }
        Ok(false) => status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", kind.resource()),
        ),
        Err(e) => internal(e),
    }
}

/// The stand-in selects by `matchLabels` only and needs exactly one of
/// `minAvailable` and `maxUnavailable`.
fn check_pdb_spec(spec: &Value) -> Result<(), String> {
    if spec["selector"].get("matchExpressions").is_some() {
        return Err(
            "spec.selector.matchExpressions: the stand-in API server selects by matchLabels only"
                .into(),
        );
    }
    match (spec.get("minAvailable"), spec.get("maxUnavailable")) {
        (Some(_), Some(_)) => {
            Err("spec: minAvailable and maxUnavailable cannot be both set".into())
        }
        (None, None) => Err("spec: one of minAvailable and maxUnavailable is required".into()),
        (Some(v), None) | (None, Some(v)) => scaled(v, 100).map(|_| ()),
    }
}

/// An int-or-percent of `total`, percentages rounded up (as Kubernetes'
/// disruption controller does).
fn scaled(v: &Value, total: u64) -> Result<u64, String> {
    if let Some(n) = v.as_u64() {
        return Ok(n);
    }
    v.as_str()
        .and_then(|s| s.strip_suffix('%'))
        .and_then(|p| p.parse::<u64>().ok())
        .filter(|p| *p <= 100)
        .map(|p| (p * total).div_ceil(100))
        .ok_or_else(|| format!("{v}: must be an integer or a percentage such as 50%"))
}

async fn get(state: &State, ns: &str, name: &str, kind: Kind) -> Resp {
    match state
        .store
        .object(&kind.key(ns, name), kind.resource())
        .await
    {
        Ok(Some(obj)) if kind == Kind::Pdb => match pdb_with_status(state, obj).await {
            Ok(obj) => json_resp(StatusCode::OK, &obj),
            Err(e) => internal(e),
        },
        Ok(Some(obj)) if kind == Kind::Pod => match reap(state, vec![obj]).await {
            Ok(mut left) if !left.is_empty() => json_resp(StatusCode::OK, &left.remove(0)),
            Ok(_) => not_found(kind, name),
            Err(e) => internal(e),
        },
        Ok(Some(obj)) => json_resp(StatusCode::OK, &obj),
        Ok(None) => not_found(kind, name),
        Err(e) => internal(e),
    }
}

async fn delete(state: &State, ns: &str, name: &str, kind: Kind) -> Resp {
    match state
        .store
        .delete_object(&kind.key(ns, name), kind.resource())
        .await
    {
        Ok(true) => {
            println!("standin-apiserver: deleted {} {ns}/{name}", kind.resource());
            json_resp(
                StatusCode::OK,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": name, "kind": kind.resource()}}),
            )
        }
        Ok(false) => not_found(kind, name),
        Err(e) => internal(e),
    }
}

/// The Pods of `ns` (all namespaces without one), filtered by a
/// `fieldSelector=spec.nodeName=NODE` when given. The etcd Pods of
/// kube-system keep their own listing (`labelSelector=component=etcd`).
async fn list_pods(state: &State, ns: Option<&str>, query: &str) -> Resp {
    let param = |key: &str| {
        form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    };
    if ns == Some("kube-system") && param("labelSelector").as_deref() == Some("component=etcd") {
        return super::etcd_pods(state, query).await;
    }
    let node = match param("fieldSelector") {
        None => None,
        Some(f) => match f.strip_prefix("spec.nodeName=") {
            Some(n) if !n.contains(',') => Some(n.to_owned()),
            _ => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("fieldSelector {f:?}: the stand-in API server selects Pods by spec.nodeName=NODE only"),
                )
            }
        },
    };
    let prefix = match ns {
        Some(ns) => format!("{POD_PREFIX}{ns}/"),
        None => POD_PREFIX.to_owned(),
    };
    let pods = match state.store.objects(&prefix, "Pods").await {
        Ok(pods) => reap(state, pods).await,
        Err(e) => Err(e),
    };
    match pods {
        Ok(pods) => {
            let items: Vec<Value> = pods
                .into_iter()
                .filter(|p| node.as_deref().is_none_or(|n| p["spec"]["nodeName"] == n))
                .collect();
            json_resp(
                StatusCode::OK,
                &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}),
            )
        }
        Err(e) => internal(e),
    }
}

async fn list_pdbs(state: &State, ns: Option<&str>) -> Resp {
    let prefix = match ns {
        Some(ns) => format!("{PDB_PREFIX}{ns}/"),
        None => PDB_PREFIX.to_owned(),
    };
    let listed = async {
        let mut items = Vec::new();
        for pdb in state.store.objects(&prefix, "PodDisruptionBudgets").await? {
            items.push(pdb_with_status(state, pdb).await?);
        }
        anyhow::Ok(items)
    };
    match listed.await {
        Ok(items) => json_resp(
            StatusCode::OK,
            &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudgetList", "metadata": {}, "items": items}),
        ),
        Err(e) => internal(e),
    }
}

/// How many disruptions a budget allows now.
struct Budget {
    name: String,
    current_healthy: u64,
    desired_healthy: u64,
    expected: u64,
}

impl Budget {
    fn allowed(&self) -> u64 {
        self.current_healthy.saturating_sub(self.desired_healthy)
    }
}

/// Whether `pod`'s labels match the budget's `matchLabels`.
fn selects(pdb: &Value, pod: &Value) -> bool {
    let Some(want) = pdb["spec"]["selector"]["matchLabels"].as_object() else {
        return false;
    };
    !want.is_empty() && want.iter().all(|(k, v)| pod["metadata"]["labels"][k] == *v)
}

async fn budget(state: &State, pdb: &Value) -> anyhow::Result<Budget> {
    let ns = pdb["metadata"]["namespace"].as_str().unwrap_or_default();
    let pods = state
        .store
        .objects(&format!("{POD_PREFIX}{ns}/"), "Pods")
        .await?;
    let pods = reap(state, pods).await?;
    let selected: Vec<&Value> = pods.iter().filter(|p| selects(pdb, p)).collect();
    let expected = selected.len() as u64;
    // A terminating Pod is not healthy (pkg/controller/disruption,
    // countHealthyPods).
    let current_healthy = selected
        .iter()
        .filter(|p| p["status"]["phase"] == "Running" && !terminating(p))
        .count() as u64;
    let spec = &pdb["spec"];
    let desired_healthy = match (spec.get("minAvailable"), spec.get("maxUnavailable")) {
        (Some(min), _) => scaled(min, expected).map_err(anyhow::Error::msg)?,
        (None, Some(max)) => {
            expected.saturating_sub(scaled(max, expected).map_err(anyhow::Error::msg)?)
        }
        (None, None) => 0,
    };
    Ok(Budget {
        name: pdb["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        current_healthy,
        desired_healthy,
        expected,
    })
}

async fn pdb_with_status(state: &State, mut pdb: Value) -> anyhow::Result<Value> {
    let b = budget(state, &pdb).await?;
    pdb["status"] = json!({
        "currentHealthy": b.current_healthy,
        "desiredHealthy": b.desired_healthy,
        "expectedPods": b.expected,
        "disruptionsAllowed": b.allowed(),
        "observedGeneration": 1,
    });
    Ok(pdb)
}

/// Pod `ns/name` as it stands (one whose grace period ran out is reaped
/// first, so it is gone), or the answer when there is none.
async fn live_pod(state: &State, ns: &str, name: &str) -> Result<Value, Resp> {
    match state.store.object(&Kind::Pod.key(ns, name), "a Pod").await {
        Ok(Some(p)) => match reap(state, vec![p]).await {
            Ok(mut left) if !left.is_empty() => Ok(left.remove(0)),
            Ok(_) => Err(not_found(Kind::Pod, name)),
            Err(e) => Err(internal(e)),
        },
        Ok(None) => Err(not_found(Kind::Pod, name)),
        Err(e) => Err(internal(e)),
    }
}

/// `POST pods/NAME/eviction`: deletes the Pod gracefully unless a budget
/// selecting it allows no disruption (429, naming the budget).
async fn evict(state: &State, ns: &str, name: &str) -> Resp {
    let pod = match live_pod(state, ns, name).await {
        Ok(pod) => pod,
        Err(r) => return r,
    };
    let pdbs = match state
        .store
        .objects(&format!("{PDB_PREFIX}{ns}/"), "PodDisruptionBudgets")
        .await
    {
        Ok(p) => p,
        Err(e) => return internal(e),
    };
    // A Pod that is not running, or already terminating, disrupts nothing
    // more: its budget is not asked (pkg/registry/core/pod/storage/
    // eviction.go, canIgnorePDB).
    if pod["status"]["phase"] == "Running" && !terminating(&pod) {
        for pdb in pdbs.iter().filter(|b| selects(b, &pod)) {
            let b = match budget(state, pdb).await {
                Ok(b) => b,
                Err(e) => return internal(e),
            };
            if b.allowed() == 0 {
                println!("standin-apiserver: eviction of pod {ns}/{name} refused by PodDisruptionBudget {}", b.name);
                return json_resp(
                    StatusCode::TOO_MANY_REQUESTS,
                    &json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                        "reason": "TooManyRequests",
                        "details": {"causes": [{
                            "reason": "DisruptionBudget",
                            "message": format!("The disruption budget {} needs {} healthy pods and has {} currently", b.name, b.desired_healthy, b.current_healthy),
                        }]},
                        "code": 429,
                    }),
                );
            }
        }
    }
    match delete_gracefully(state, pod, None).await {
        Ok(_) => {
            println!("standin-apiserver: evicted pod {ns}/{name}");
            json_resp(
                StatusCode::CREATED,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            )
        }
        Err(e) => internal(e),
    }
}

/// The grace period of a Pod whose spec names none.
const DEFAULT_GRACE_SECONDS: u64 = 30;

/// Whether the Pod is being deleted.
fn terminating(pod: &Value) -> bool {
    pod["metadata"].get("deletionTimestamp").is_some()
}

fn parse_time(v: &Value) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(v.as_str()?, &time::format_description::well_known::Rfc3339).ok()
}

/// `DELETE pods/NAME`: a graceful deletion with the grace period of the
/// `gracePeriodSeconds` parameter or body (`DeleteOptions`), else the
/// Pod's own. Answers the Pod as it now is, as the real server does.
async fn delete_pod(
    state: &State,
    req: Request<Incoming>,
    ns: &str,
    name: &str,
    query: &str,
) -> Resp {
    let from_query = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "gracePeriodSeconds")
        .and_then(|(_, v)| v.parse::<u64>().ok());
    let body = match super::read_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let from_body = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|o| o["gracePeriodSeconds"].as_u64());
    let pod = match live_pod(state, ns, name).await {
        Ok(pod) => pod,
        Err(r) => return r,
    };
    match delete_gracefully(state, pod, from_body.or(from_query)).await {
        Ok(pod) => {
            println!("standin-apiserver: deleted pods {ns}/{name}");
            json_resp(StatusCode::OK, &pod)
        }
        Err(e) => internal(e),
    }
}

/// Deletes `pod` as the API server does: at once when it is not
/// scheduled, finished or given no grace period; else it is marked
/// Terminating until `now + grace` (a second deletion only shortens it).
/// Returns the Pod as it now is.
async fn delete_gracefully(
    state: &State,
    mut pod: Value,
    grace: Option<u64>,
) -> anyhow::Result<Value> {
    let ns = pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let key = Kind::Pod.key(&ns, &name);
    let scheduled = pod["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    let mut grace = grace.unwrap_or_else(|| {
        pod["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or(DEFAULT_GRACE_SECONDS)
    });
    if !scheduled || finished {
        grace = 0;
    }
    let has_finalizers = pod["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    let now = time::OffsetDateTime::now_utc().replace_nanosecond(0)?;
    if let Some(current) = pod["metadata"]["deletionGracePeriodSeconds"].as_u64() {
        if grace >= current {
            return Ok(pod);
        }
    }
    if grace == 0 && !has_finalizers {
        state.store.delete_object(&key, "a Pod").await?;
        return Ok(pod);
    }
    let deadline = now + time::Duration::seconds(grace as i64);
    pod["metadata"]["deletionTimestamp"] = deadline
        .format(&time::format_description::well_known::Rfc3339)?
        .into();
    pod["metadata"]["deletionGracePeriodSeconds"] = grace.into();
    state.store.put_object(&key, &pod, false).await?;
    Ok(pod)
}

/// `pods` without those the kubelet (or the Pod garbage collector) has
/// deleted by now, which are removed from the store: a terminating Pod
/// past its deadline whose Node is Ready, or whose Node is gone, and that
/// has no finalizers.
async fn reap(state: &State, pods: Vec<Value>) -> anyhow::Result<Vec<Value>> {
    let now = time::OffsetDateTime::now_utc();
    let mut left = Vec::with_capacity(pods.len());
    for pod in pods {
        let due = parse_time(&pod["metadata"]["deletionTimestamp"]).is_some_and(|t| t <= now);
        let finalizers = pod["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if !due || finalizers {
            left.push(pod);
            continue;
        }
        let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
        let kubelet_done = match state.store.node(node).await? {
            None => true,
            Some(n) => n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True"),
        };
        if !kubelet_done {
            left.push(pod);
            continue;
        }
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        state
            .store
            .delete_object(&Kind::Pod.key(ns, name), "a Pod")
            .await?;
        println!("standin-apiserver: pod {ns}/{name} terminated and deleted by its kubelet");
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_targets() {
        assert!(matches!(target("/api/v1/pods"), Some(Target::AllPods)));
        assert!(matches!(
            target("/api/v1/namespaces/default/pods/web-1/eviction"),
            Some(Target::Pods { ref ns, name: Some(ref n), eviction: true }) if ns == "default" && n == "web-1"
        ));
        assert!(matches!(
            target("/apis/policy/v1/namespaces/default/poddisruptionbudgets"),
            Some(Target::Pdbs { name: None, .. })
        ));
        assert!(target("/api/v1/namespaces/default/secrets").is_none());
        assert!(target("/api/v1/namespaces//pods").is_none());
        assert!(target("/apis/policy/v1/namespaces/x/pods/a/eviction").is_none());
    }

    #[test]
    fn budgets_scale_percentages_up() {
        assert_eq!(scaled(&json!(2), 5), Ok(2));
        assert_eq!(scaled(&json!("50%"), 3), Ok(2));
        assert!(scaled(&json!("150%"), 3).is_err());
        assert!(check_pdb_spec(&json!({"minAvailable": 1, "maxUnavailable": 1})).is_err());
        assert!(check_pdb_spec(
            &json!({"minAvailable": 1, "selector": {"matchLabels": {"a": "b"}}})
        )
        .is_ok());
    }
}
