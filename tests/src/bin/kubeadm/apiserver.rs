//! The stand-in API server (`kubeadm __standin-apiserver`): HTTPS with the
//! node's `apiserver.crt`, optional client certificates from the cluster CA,
//! and the few endpoints bootstrap needs.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use drover_common::token::BootstrapToken;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::certs::{render_cluster_info_kubeconfig, subject};
use crate::daemon;
use crate::store::{Added, EtcdAccess, Store, StoredToken};
use crate::util::Root;

mod crds;
mod nodeipam;
mod objects;
mod workloads;

pub struct Opts {
    pub bind: String,
    pub cert_dir: String,
    pub server: String,
    pub etcd_servers: String,
}

struct State {
    root: Root,
    cert_dir: String,
    server: String,
    /// Where the objects are: the cluster's etcd, through the local member.
    store: Store,
}

type Resp = Response<Full<Bytes>>;

/// What a part of the API ([`workloads`], [`objects`], [`crds`]) makes of a
/// request: its answer, or the request back when the path is not its own.
type Routed = Result<Resp, Request<Incoming>>;

/// Who is calling.
#[derive(Debug, Clone)]
enum Identity {
    Anonymous,
    Cert {
        cn: String,
        groups: Vec<String>,
    },
    /// A bootstrap token: `system:bootstrappers` and the token's
    /// `auth-extra-groups`, as the bootstrap token authenticator gives them.
    Bootstrap {
        id: String,
        groups: Vec<String>,
    },
}

impl Identity {
    fn user(&self) -> String {
        match self {
            Self::Anonymous => "system:anonymous".into(),
            Self::Cert { cn, .. } => cn.clone(),
            Self::Bootstrap { id, .. } => format!("system:bootstrap:{id}"),
        }
    }

    fn is_admin(&self) -> bool {
        matches!(self, Self::Cert { groups, .. }
            if groups.iter().any(|g| g == "system:masters" || g == "kubeadm:cluster-admins"))
    }

    fn in_group(&self, group: &str) -> bool {
        match self {
            Self::Anonymous => false,
            Self::Cert { groups, .. } | Self::Bootstrap { groups, .. } => {
                groups.iter().any(|g| g == group)
            }
        }
    }

    /// Whether the caller may read the cluster's configuration for nodes,
    /// the ConfigMaps `kubeadm-config` and `kubelet-config`: kubeadm's
    /// Roles `kubeadm:nodes-kubeadm-config` and `kubeadm:kubelet-config`
    /// bind them to the groups `system:bootstrappers:kubeadm:default-node-token`
    /// (joining machines) and `system:nodes` (their kubelets, and `upgrade
    /// node`), besides the admins (cmd/kubeadm/app/phases/uploadconfig/
    /// uploadconfig.go and cmd/kubeadm/app/phases/kubelet/config.go
    /// `createConfigMapRBACRules`).
    fn may_read_node_config(&self) -> bool {
        self.is_admin()
            || self.in_group(crate::cmd_init::DEFAULT_TOKEN_GROUP)
            || self.in_group("system:nodes")
    }
}

pub fn run(root: Root, opts: Opts) -> Result<()> {
    daemon::run(&root, "apiserver", Some(2), serve(&root, opts))
}

async fn serve(root: &Root, opts: Opts) -> Result<()> {
    let cert_dir = opts.cert_dir.clone();
    let read = |f: &str| {
        let logical = format!("{cert_dir}/{f}");
        std::fs::read_to_string(root.path(&logical)).with_context(|| format!("open {logical}"))
    };
    // Like kube-apiserver, it serves a renewed certificate without a
    // restart: the files are read again when the certificate changes.
    let serving = root.path(format!("{}/apiserver.crt", opts.cert_dir));
    let modified = || std::fs::metadata(&serving).and_then(|m| m.modified()).ok();
    let load = || -> Result<TlsAcceptor> {
        let tls = crate::net::server_config(
            &read("apiserver.crt")?,
            &read("apiserver.key")?,
            &read("ca.crt")?,
        )?;
        Ok(TlsAcceptor::from(Arc::new(tls)))
    };
    let mut acceptor = load()?;
    let mut loaded = modified();
    let listener = TcpListener::bind(&opts.bind)
        .await
        .with_context(|| format!("failed to listen on {}", opts.bind))?;
    println!(
        "standin-apiserver: listening on https://{} (pid {}, root {})",
        opts.bind,
        std::process::id(),
        root.dir().display()
    );
    let access = EtcdAccess::apiserver(root, &opts.cert_dir, &opts.etcd_servers)?;
    let store = Store::connect(&access).await?;
    let state = Arc::new(State {
        root: root.clone(),
        cert_dir: opts.cert_dir,
        server: opts.server,
        store,
    });
    // kube-apiserver's apiextensions controllers (naming, establishing).
    tokio::spawn(crds::run_controller(state.clone()));
    daemon::accept_until_stopped(root, "apiserver", &listener, |tcp| {
        if modified() != loaded {
            match load() {
                Ok(a) => {
                    println!("standin-apiserver: serving the renewed certificate");
                    acceptor = a;
                    loaded = modified();
                }
                Err(e) => eprintln!("standin-apiserver: keeping the serving certificate: {e:#}"),
            }
        }
        let acceptor = acceptor.clone();
        let state = state.clone();
        tokio::spawn(async move {
            let Ok(Ok(tls)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
            else {
                return;
            };
            let peer = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| subject(c.as_ref()));
            let svc = hyper::service::service_fn(move |req| {
                let state = state.clone();
                let peer = peer.clone();
                async move { Ok::<_, Infallible>(route(&state, peer, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        });
    })
    .await
}

/// A plain-text answer (the kubelet's health endpoint answers the same way).
pub(crate) fn text(code: StatusCode, body: &str) -> Resp {
    Response::builder()
        .status(code)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("valid response")
}

fn json_resp(code: StatusCode, v: &serde_json::Value) -> Resp {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .expect("valid response")
}

/// A Kubernetes `Status` error.
fn status(code: StatusCode, reason: &str, message: &str) -> Resp {
    json_resp(
        code,
        &json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code.as_u16(),
        }),
    )
}

fn forbidden(who: &Identity, verb: &str, resource: &str, ns: &str) -> Resp {
    status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        &format!(
            "{resource} is forbidden: User \"{}\" cannot {verb} resource \"{resource}\" in API group \"\" in the namespace \"{ns}\"",
            who.user()
        ),
    )
}

const CLUSTER_INFO: &str = "/api/v1/namespaces/kube-public/configmaps/cluster-info";
const KUBEADM_CONFIG: &str = "/api/v1/namespaces/kube-system/configmaps/kubeadm-config";
const SECRETS: &str = "/api/v1/namespaces/kube-system/secrets";
const NODES: &str = "/api/v1/nodes";
const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

/// How long a Node may go without a status update before the API server
/// reports it `Ready=Unknown` (the node lifecycle controller's
/// `--node-monitor-grace-period`, 40s by default).
const NODE_MONITOR_GRACE: time::Duration = time::Duration::seconds(40);

async fn route(state: &State, peer: Option<(String, Vec<String>)>, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let Some(who) = authenticate(state, peer, &req).await else {
        return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    };
    let req = match workloads::route(state, &who, req).await {
        Ok(resp) => return resp,
        Err(req) => req,
    };
    let req = match objects::route(state, &who, req).await {
        Ok(resp) => return resp,
        Err(req) => req,
    };
    let req = match crds::route(state, &who, req).await {
        Ok(resp) => return resp,
        Err(req) => req,
    };
    match (method, path.as_str()) {
        (Method::GET, "/livez") => text(StatusCode::OK, "ok"),
        (Method::GET, "/readyz" | "/healthz") => ready(state).await,
        (Method::GET, "/version") => version(state).await,
        (Method::GET, CLUSTER_INFO) => cluster_info(state).await,
        (Method::GET, "/api") => json_resp(
            StatusCode::OK,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": state.server.trim_start_matches("https://")}]}),
        ),
        (Method::GET, "/apis") => json_resp(
            StatusCode::OK,
            &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": std::iter::once(workloads::policy_group()).chain(objects::groups()).chain(crds::groups(state).await).collect::<Vec<_>>()}),
        ),
        (Method::GET, workloads::POLICY_V1) => {
            json_resp(StatusCode::OK, &workloads::policy_resources())
        }
        (Method::GET, "/api/v1") => json_resp(StatusCode::OK, &core_resources()),
        (Method::POST, CSRS) => {
            if !matches!(who, Identity::Bootstrap { .. }) && !who.is_admin() {
                return status(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    &format!("certificatesigningrequests.certificates.k8s.io is forbidden: User \"{}\" cannot create resource \"certificatesigningrequests\" in API group \"certificates.k8s.io\" at the cluster scope", who.user()),
                );
            }
            sign_kubelet_csr(state, &who, req).await
        }
        (_, p) if p == NODES || p.starts_with("/api/v1/nodes/") => nodes(state, &who, req).await,
        (Method::GET, KUBEADM_CONFIG) => {
            if !who.may_read_node_config() {
                return forbidden(&who, "get", "configmaps", "kube-system");
            }
            kubeadm_config(state).await
        }
        (Method::PUT, KUBEADM_CONFIG) => {
            if !who.is_admin() {
                return forbidden(&who, "update", "configmaps", "kube-system");
            }
            update_kubeadm_config(state, req).await
        }
        (Method::POST, SECRETS) => {
            if !who.is_admin() {
                return forbidden(&who, "create", "secrets", "kube-system");
            }
            create_secret(state, req).await
        }
        (Method::GET, p) if p.starts_with(SECRETS) && p[SECRETS.len()..].starts_with('/') => {
            if !who.is_admin() {
                return forbidden(&who, "get", "secrets", "kube-system");
            }
            get_secret(state, &p[SECRETS.len() + 1..]).await
        }
        (
            _,
            "/livez" | "/readyz" | "/healthz" | "/version" | CLUSTER_INFO | KUBEADM_CONFIG
            | SECRETS,
        ) => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ),
        _ => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        ),
    }
}

/// The caller's identity; `None` when it presented invalid credentials.
async fn authenticate(
    state: &State,
    peer: Option<(String, Vec<String>)>,
    req: &Request<Incoming>,
) -> Option<Identity> {
    if let Some(auth) = req.headers().get("authorization") {
        let bearer = auth.to_str().ok()?.strip_prefix("Bearer ")?;
        let token: BootstrapToken = bearer.trim().parse().ok()?;
        let tokens = state.store.load_tokens().await.ok()?;
        let found = tokens.into_iter().find(|t| {
            t.id == token.id()
                && t.secret == token.secret()
                && !t.expired()
                && t.has_usage("authentication")
        })?;
        return Some(Identity::Bootstrap {
            id: found.id,
            groups: std::iter::once("system:bootstrappers".to_owned())
                .chain(found.groups)
                .collect(),
        });
    }
    Some(match peer {
        Some((cn, groups)) => Identity::Cert { cn, groups },
        None => Identity::Anonymous,
    })
}

/// `/version`: what this API server runs, the tag of the image its static
/// Pod manifest names (what `kubeadm init` or `join --control-plane` wrote
/// from the ClusterConfiguration of the time), not what the cluster's
/// config names now.
async fn version(state: &State) -> Resp {
    let manifest = state.root.path(format!(
        "{}/kube-apiserver.yaml",
        crate::node::MANIFESTS_DIR
    ));
    let v = std::fs::read_to_string(manifest)
        .ok()
        .and_then(|text| {
            text.lines()
                .filter_map(|l| l.trim().strip_prefix("image:"))
                .find_map(|image| image.trim().rsplit_once(':').map(|(_, tag)| tag.to_owned()))
        })
        .unwrap_or_else(crate::util::kubeadm_version_string);
    let parsed = crate::util::parse_version(&v).ok();
    json_resp(
        StatusCode::OK,
        &json!({
            "major": parsed.map(|p| p.major.to_string()).unwrap_or_default(),
            "minor": parsed.map(|p| p.minor.to_string()).unwrap_or_default(),
            "gitVersion": v,
            "platform": "linux/amd64",
        }),
    )
}

async fn cluster_info(state: &State) -> Resp {
    let ca_logical = format!("{}/ca.crt", state.cert_dir);
    let ca_pem = match std::fs::read_to_string(state.root.path(&ca_logical)) {
        Ok(p) => p,
        Err(e) => {
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                &format!("open {ca_logical}: {e}"),
            )
        }
    };
    let kubeconfig = render_cluster_info_kubeconfig(&state.server, &ca_pem);
    let tokens = match state.store.load_tokens().await {
        Ok(t) => t,
        Err(e) => return internal(e),
    };
    let mut data = BTreeMap::new();
    for t in tokens
        .iter()
        .filter(|t| !t.expired() && t.has_usage("signing"))
    {
        data.insert(
            format!("jws-kcs-{}", t.id),
            drover_common::jws::sign_detached(&kubeconfig, &t.id, &t.secret),
        );
    }
    data.insert("kubeconfig".to_owned(), kubeconfig);
    json_resp(
        StatusCode::OK,
        &json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": data,
        }),
    )
}

async fn kubeadm_config(state: &State) -> Resp {
    match state.store.cluster_config_with_revision().await {
        Err(e) => internal(e),
        Ok(Some((yaml, revision))) => {
            json_resp(StatusCode::OK, &kubeadm_config_map(&yaml, revision))
        }
        Ok(None) => kubeadm_config_not_found(),
    }
}

fn kubeadm_config_map(yaml: &str, revision: i64) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "kubeadm-config",
            "namespace": "kube-system",
            "resourceVersion": revision.to_string(),
        },
        "data": {"ClusterConfiguration": yaml},
    })
}

fn kubeadm_config_not_found() -> Resp {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "configmaps \"kubeadm-config\" not found",
    )
}

/// `PUT` of the ConfigMap `kube-system/kubeadm-config`, as the API server
/// takes it: the whole object, with a `resourceVersion` that must be the
/// current one when given (optimistic concurrency), data values strings.
async fn update_kubeadm_config(state: &State, req: Request<Incoming>) -> Resp {
    let map = match read_json(req).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let invalid = |msg: String| {
        status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            &format!("ConfigMap \"kubeadm-config\" is invalid: {msg}"),
        )
    };
    if map["kind"] != "ConfigMap" || map["apiVersion"] != "v1" {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body must be a v1 ConfigMap",
        );
    }
    let meta = &map["metadata"];
    if meta["name"] != "kubeadm-config"
        || !(meta["namespace"].is_null() || meta["namespace"] == "kube-system")
    {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the name of the object (kube-system/kubeadm-config) does not match the name on the URL",
        );
    }
    let Some(yaml) = map["data"]["ClusterConfiguration"].as_str() else {
        return invalid("data[ClusterConfiguration]: Required value: kubeadm keeps its ClusterConfiguration here".into());
    };
    if let Some((k, _)) = map["data"]
        .as_object()
        .into_iter()
        .flatten()
        .find(|(_, v)| !v.is_string())
    {
        return invalid(format!("data[{k}]: Invalid value: must be a string"));
    }
    let current = match state.store.cluster_config_with_revision().await {
        Ok(Some((_, revision))) => revision,
        Ok(None) => return kubeadm_config_not_found(),
        Err(e) => return internal(e),
    };
    let conflict = || {
        status(
            StatusCode::CONFLICT,
            "Conflict",
            "Operation cannot be fulfilled on configmaps \"kubeadm-config\": the object has been modified; please apply your changes to the latest version and try again",
        )
    };
    let revision = match meta["resourceVersion"].as_str() {
        None => current,
        Some(rv) => match rv.parse::<i64>() {
            Ok(r) if r == current => r,
            Ok(_) => return conflict(),
            Err(_) => return invalid(format!("metadata.resourceVersion: Invalid value: {rv:?}")),
        },
    };
    match state.store.replace_cluster_config(yaml, revision).await {
        Ok(true) => {
            println!("standin-apiserver: updated configmap kube-system/kubeadm-config");
            match state.store.cluster_config_with_revision().await {
                Ok(Some((yaml, revision))) => {
                    json_resp(StatusCode::OK, &kubeadm_config_map(&yaml, revision))
                }
                _ => json_resp(StatusCode::OK, &map),
            }
        }
        Ok(false) => conflict(),
        Err(e) => internal(e),
    }
}

async fn get_secret(state: &State, name: &str) -> Resp {
    let tokens = state.store.load_tokens().await.unwrap_or_default();
    match tokens
        .iter()
        .find(|t| format!("bootstrap-token-{}", t.id) == name && !t.expired())
    {
        Some(t) => json_resp(StatusCode::OK, &t.secret_json()),
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("secrets \"{name}\" not found"),
        ),
    }
}

async fn create_secret(state: &State, req: Request<Incoming>) -> Resp {
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let token = match parse_token_secret(&body) {
        Ok(t) => t,
        Err((code, reason, msg)) => return status(code, reason, &msg),
    };
    let name = format!("bootstrap-token-{}", token.id);
    match state.store.add_token(token.clone(), false).await {
        Ok(Added::Created) => {
            println!("standin-apiserver: created secret kube-system/{name}");
            json_resp(StatusCode::CREATED, &token.secret_json())
        }
        Ok(Added::AlreadyExists) => status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("secrets \"{name}\" already exists"),
        ),
        Err(e) => internal(e),
    }
}

type Reject = (StatusCode, &'static str, String);

fn invalid(msg: impl Into<String>) -> Reject {
    (StatusCode::UNPROCESSABLE_ENTITY, "Invalid", msg.into())
}

/// Validates a `bootstrap.kubernetes.io/token` Secret strictly.
fn parse_token_secret(body: &[u8]) -> Result<StoredToken, Reject> {
    let bad = |m: String| (StatusCode::BAD_REQUEST, "BadRequest", m);
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON body: {e}")))?;
    if v.get("apiVersion").and_then(|x| x.as_str()) != Some("v1")
        || v.get("kind").and_then(|x| x.as_str()) != Some("Secret")
    {
        return Err(bad("the body must be a v1 Secret".into()));
    }
    for key in v
        .as_object()
        .map(|o| o.keys().cloned().collect::<Vec<_>>())
        .unwrap_or_default()
    {
        if !matches!(
            key.as_str(),
            "apiVersion" | "kind" | "metadata" | "type" | "data" | "stringData" | "immutable"
        ) {
            return Err(bad(format!(
                "strict decoding error: unknown field \"{key}\""
            )));
        }
    }
    let meta = v.get("metadata").cloned().unwrap_or_default();
    let name = meta
        .get("name")
        .and_then(|x| x.as_str())
        .unwrap_or_default()
        .to_owned();
    if name.is_empty() {
        return Err(invalid("Secret \"\" is invalid: metadata.name: Required value: name or generateName is required"));
    }
    if let Some(ns) = meta.get("namespace").and_then(|x| x.as_str()) {
        if ns != "kube-system" {
            return Err(bad("the namespace of the provided object does not match the namespace sent on the request".into()));
        }
    }
    let ty = v.get("type").and_then(|x| x.as_str()).unwrap_or("Opaque");
    if ty != "bootstrap.kubernetes.io/token" {
        return Err(invalid(format!(
            "Secret {name:?}: the stand-in API server stores only type bootstrap.kubernetes.io/token, got {ty:?}"
        )));
    }
    let mut fields: BTreeMap<String, String> = BTreeMap::new();
    // `stringData` is written over `data`.
    for (field, base64) in [("data", true), ("stringData", false)] {
        let Some(map) = v.get(field) else {
            continue;
        };
        let obj = map
            .as_object()
            .ok_or_else(|| bad(format!("{field} must be a map")))?;
        let want = if base64 {
            "a base64 string"
        } else {
            "a string"
        };
        for (k, val) in obj {
            let s = val
                .as_str()
                .ok_or_else(|| bad(format!("{field}[{k}] must be {want}")))?;
            let s = if base64 {
                let bytes = B64
                    .decode(s)
                    .map_err(|e| bad(format!("data[{k}]: illegal base64 data: {e}")))?;
                String::from_utf8(bytes).map_err(|_| invalid(format!("data[{k}] is not UTF-8")))?
            } else {
                s.to_owned()
            };
            fields.insert(k.clone(), s);
        }
    }
    for k in fields.keys() {
        if !matches!(
            k.as_str(),
            "token-id"
                | "token-secret"
                | "expiration"
                | "description"
                | "usage-bootstrap-authentication"
                | "usage-bootstrap-signing"
                | "auth-extra-groups"
        ) {
            return Err(invalid(format!(
                "Secret {name:?}: unknown bootstrap token key {k:?}"
            )));
        }
    }
    let id = fields.get("token-id").cloned().unwrap_or_default();
    let secret = fields.get("token-secret").cloned().unwrap_or_default();
    let token: BootstrapToken = format!("{id}.{secret}").parse().map_err(|e| {
        invalid(format!(
            "Secret {name:?}: token-id/token-secret do not form a bootstrap token: {e}"
        ))
    })?;
    if name != format!("bootstrap-token-{id}") {
        return Err(invalid(format!(
            "Secret {name:?}: a bootstrap token Secret must be named bootstrap-token-{id}"
        )));
    }
    let expires = match fields.get("expiration") {
        Some(e) => {
            let at = OffsetDateTime::parse(e, &Rfc3339).map_err(|err| {
                invalid(format!(
                    "Secret {name:?}: expiration {e:?} is not RFC 3339: {err}"
                ))
            })?;
            Some(at.format(&Rfc3339).expect("formats"))
        }
        None => None,
    };
    let mut usages = Vec::new();
    for u in ["authentication", "signing"] {
        if fields
            .get(&format!("usage-bootstrap-{u}"))
            .map(String::as_str)
            == Some("true")
        {
            usages.push(u.to_owned());
        }
    }
    let groups: Vec<String> = fields
        .get("auth-extra-groups")
        .map(|g| {
            g.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    for g in &groups {
        if !g.starts_with("system:bootstrappers:") {
            return Err(invalid(format!(
                "Secret {name:?}: auth-extra-groups: {g:?} must start with system:bootstrappers:"
            )));
        }
    }
    Ok(StoredToken {
        id: token.id().to_owned(),
        secret: token.secret().to_owned(),
        expires,
        usages,
        groups,
        description: fields.get("description").cloned(),
    })
}

/// A kubelet's client certificate request (its TLS bootstrap), approved
/// and signed at once when it asks for a node identity with the kubelet
/// client signer, as kube-controller-manager's csrapproving and csrsigning
/// controllers do for bootstrappers. The subject comes from the request's
/// CN (`system:node:NAME`); the organization is always `system:nodes`.
async fn sign_kubelet_csr(state: &State, who: &Identity, req: Request<Incoming>) -> Resp {
    let csr = match read_json(req).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let invalid = |msg: &str| {
        status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            &format!("CertificateSigningRequest.certificates.k8s.io is invalid: {msg}"),
        )
    };
    if csr["spec"]["signerName"] != "kubernetes.io/kube-apiserver-client-kubelet" {
        return invalid(
            "spec.signerName: the stand-in signs only kubernetes.io/kube-apiserver-client-kubelet",
        );
    }
    let Some(pem) = csr["spec"]["request"]
        .as_str()
        .and_then(|r| B64.decode(r).ok())
        .and_then(|r| String::from_utf8(r).ok())
    else {
        return invalid("spec.request: not a base64 PEM certificate request");
    };
    let Some(cn) = csr_common_name(&pem) else {
        return invalid("spec.request: not a parseable certificate request");
    };
    if !cn.starts_with("system:node:") || cn.len() <= "system:node:".len() {
        return invalid(&format!(
            "spec.request: subject {cn:?} is not system:node:NAME"
        ));
    }
    let read =
        |f: &str| std::fs::read_to_string(state.root.path(format!("{}/{f}", state.cert_dir)));
    let ca = match (read("ca.crt"), read("ca.key")) {
        (Ok(cert_pem), Ok(key_pem)) => {
            drover_common::pki::CertificateAuthority { cert_pem, key_pem }
        }
        _ => {
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "this API server cannot read the cluster CA key",
            )
        }
    };
    let spec = drover_common::pki::LeafSpec {
        common_name: cn.clone(),
        organizations: vec!["system:nodes".into()],
        dns_names: vec![],
        ip_addresses: vec![],
        usage: drover_common::pki::LeafUsage::Client,
        validity: time::Duration::days(365),
    };
    match ca.sign_csr(&pem, &spec) {
        Ok(issued) => {
            println!(
                "standin-apiserver: signed the kubelet certificate of {cn} for {}",
                who.user()
            );
            let mut out = csr.clone();
            out["metadata"]["name"] = format!("csr-{:08x}", rand::random::<u32>()).into();
            out["spec"]["username"] = who.user().into();
            out["status"] = json!({
                "conditions": [{"type": "Approved", "status": "True", "reason": "AutoApproved",
                                "message": "Auto approving kubelet client certificate after SubjectAccessReview."}],
                "certificate": B64.encode(issued.cert_pem.as_bytes()),
            });
            json_resp(StatusCode::CREATED, &out)
        }
        Err(e) => invalid(&format!("spec.request: {e}")),
    }
}

/// The subject CN of a PEM certificate request.
fn csr_common_name(pem: &str) -> Option<String> {
    let der = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<String>();
    let der = B64.decode(der).ok()?;
    use x509_parser::prelude::FromDer;
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&der).ok()?;
    let cn = req
        .certification_request_info
        .subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    Some(cn)
}

/// The core group's discovery document: the resources this stand-in serves.
fn core_resources() -> serde_json::Value {
    let mut list = core_node_resources();
    if let Some(resources) = list["resources"].as_array_mut() {
        resources.extend(workloads::core_resources());
        resources.extend(objects::core_resources());
    }
    list
}

fn core_node_resources() -> serde_json::Value {
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {"name": "nodes", "singularName": "node", "namespaced": false, "kind": "Node",
             "verbs": ["create", "delete", "get", "list", "patch", "update"], "shortNames": ["no"]},
            {"name": "nodes/status", "singularName": "", "namespaced": false, "kind": "Node",
             "verbs": ["get", "update"]},
        ],
    })
}

/// What the NodeRestriction admission plugin refuses of a node updating its
/// own Node (`plugin/pkg/admission/noderestriction/admission.go`,
/// `admitNode`, its Update branch): a new non-nil `spec.configSource`, any
/// change of `spec.taints` or of `metadata.ownerReferences`, and a change
/// of a label in the `kubernetes.io` or `k8s.io` domains other than the
/// kubelet's own (`staging/src/k8s.io/kubelet/pkg/apis/well_known_labels.go`,
/// `IsKubeletLabel`). Anything else, `spec.unschedulable` among it, a node
/// may change of itself.
fn node_restriction(
    name: &str,
    old: &serde_json::Value,
    new: &serde_json::Value,
) -> Result<(), String> {
    let source = &new["spec"]["configSource"];
    if !source.is_null() && *source != old["spec"]["configSource"] {
        return Err(format!(
            "node {name:?} is not allowed to update configSource to a new non-nil configSource"
        ));
    }
    if new["spec"]["taints"] != old["spec"]["taints"] {
        return Err(format!("node {name:?} is not allowed to modify taints"));
    }
    if new["metadata"]["ownerReferences"] != old["metadata"]["ownerReferences"] {
        return Err(format!(
            "node {name:?} is not allowed to modify ownerReferences"
        ));
    }
    let labels = |v: &serde_json::Value| -> std::collections::BTreeMap<String, serde_json::Value> {
        v["metadata"]["labels"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    };
    let (before, after) = (labels(old), labels(new));
    let mut forbidden: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k) && !node_may_set_label(k))
        .collect();
    forbidden.sort();
    forbidden.dedup();
    if !forbidden.is_empty() {
        let list: Vec<&str> = forbidden.iter().map(|k| k.as_str()).collect();
        return Err(format!(
            "is not allowed to modify labels: {}",
            list.join(", ")
        ));
    }
    Ok(())
}

/// Whether a kubelet may set label `key` on its own Node: any label outside
/// the `kubernetes.io` and `k8s.io` domains, and in them only the kubelet's
/// own (`well_known_labels.go`: `kubeletLabels`, and the
/// `kubelet.kubernetes.io` and `node.kubernetes.io` namespaces).
fn node_may_set_label(key: &str) -> bool {
    const KUBELET_LABELS: &[&str] = &[
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "node.kubernetes.io/instance-type",
        "beta.kubernetes.io/instance-type",
    ];
    let Some((domain, _)) = key.split_once('/') else {
        return true;
    };
    let in_domain = |d: &str| domain == d || domain.ends_with(&format!(".{d}"));
    if !(in_domain("kubernetes.io") || in_domain("k8s.io")) {
        return true;
    }
    KUBELET_LABELS.contains(&key)
        || domain == "kubelet.kubernetes.io"
        || domain.ends_with(".kubelet.kubernetes.io")
        || domain == "node.kubernetes.io"
        || domain.ends_with(".node.kubernetes.io")
}

/// `/api/v1/nodes[/NAME[/status]]`: list, get, create, status update,
/// cordon (a merge patch of `spec`), delete. A node may write only its own
/// Node, and patch it only as the NodeRestriction admission plugin lets it
/// ([`node_restriction`]); reading needs a node or an admin; patching
/// another's Node and deleting one, an admin.
async fn nodes(state: &State, who: &Identity, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let rest = path
        .strip_prefix(NODES)
        .unwrap_or_default()
        .trim_start_matches('/');
    let (name, sub) = match rest.split_once('/') {
        Some((n, s)) => (n.to_owned(), Some(s.to_owned())),
        None => (rest.to_owned(), None),
    };
    let own_node = matches!(who, Identity::Cert { cn, groups }
        if groups.iter().any(|g| g == "system:nodes") && cn.strip_prefix("system:node:") == Some(name.as_str()));
    let reader = who.is_admin()
        || matches!(who, Identity::Cert { groups, .. } if groups.iter().any(|g| g == "system:nodes"));
    let forbid = |verb: &str| {
        status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!("nodes{} is forbidden: User \"{}\" cannot {verb} resource \"nodes\" in API group \"\" at the cluster scope", if name.is_empty() { String::new() } else { format!(" \"{name}\"") }, who.user()),
        )
    };
    let not_found = || node_not_found(&name);
    match (method, name.is_empty(), sub.as_deref()) {
        (Method::GET, true, None) => {
            if !reader {
                return forbid("list");
            }
            match state.store.nodes().await {
                Ok(items) => json_resp(
                    StatusCode::OK,
                    &json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                            "items": items.into_iter().map(observed_node).collect::<Vec<_>>()}),
                ),
                Err(e) => internal(e),
            }
        }
        (Method::POST, true, None) => {
            let node = match read_json(req).await {
                Ok(v) => v,
                Err(r) => return r,
            };
            let n = node["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let creator = who.is_admin()
                || matches!(who, Identity::Cert { cn, .. } if cn.strip_prefix("system:node:") == Some(n.as_str()));
            if n.is_empty() || !creator {
                return forbid("create");
            }
            // The node IPAM controller's pod range (nodeipam.rs); a Node
            // that cannot have one is still created, as upstream.
            let range = match nodeipam::allocate(&state.root, &state.store, &n).await {
                Ok(r) => r,
                Err(e) => {
                    println!("standin-apiserver: node {n}: {e:#}");
                    None
                }
            };
            let node = match &range {
                Some(r) => nodeipam::with_range(node, r),
                None => node,
            };
            let created = state
                .store
                .put_object(&Store::node_key(&n), &stamped(node, None), true)
                .await;
            if let (Some(r), false) = (&range, matches!(created, Ok(true))) {
                let _ = nodeipam::release(&state.store, r).await;
            }
            match created {
                Ok(true) => json_resp(
                    StatusCode::CREATED,
                    &json!({"kind": "Node", "metadata": {"name": n}}),
                ),
                Ok(false) => status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    &format!("nodes \"{n}\" already exists"),
                ),
                Err(e) => internal(e),
            }
        }
        (Method::GET, false, None) => {
            if !reader {
                return forbid("get");
            }
            match state.store.node(&name).await {
                Ok(Some(n)) => json_resp(StatusCode::OK, &observed_node(n)),
                Ok(None) => not_found(),
                Err(e) => internal(e),
            }
        }
        (Method::PUT, false, Some("status")) => {
            if !(own_node || who.is_admin()) {
                return forbid("update");
            }
            let (update, current) = match body_and_node(req, &state.store, &name).await {
                Ok(both) => both,
                Err(r) => return r,
            };
            let mut next = current.clone();
            next["status"] = update["status"].clone();
            // A condition keeps its lastTransitionTime while its status
            // stays the same.
            if let (Some(new), Some(old)) = (
                next["status"]["conditions"].as_array_mut(),
                current["status"]["conditions"].as_array(),
            ) {
                for c in new.iter_mut() {
                    if let Some(o) = old
                        .iter()
                        .find(|o| o["type"] == c["type"] && o["status"] == c["status"])
                    {
                        c["lastTransitionTime"] = o["lastTransitionTime"].clone();
                    }
                }
            }
            match state
                .store
                .put_object(
                    &Store::node_key(&name),
                    &stamped(next, Some(&current)),
                    false,
                )
                .await
            {
                Ok(true) => json_resp(
                    StatusCode::OK,
                    &json!({"kind": "Node", "metadata": {"name": name}}),
                ),
                Ok(false) => not_found(),
                Err(e) => internal(e),
            }
        }
        (Method::PATCH, false, Some("status")) => {
            if !(own_node || who.is_admin()) {
                return forbid("patch");
            }
            let strategic = match req
                .headers()
                .get(hyper::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
            {
                Some("application/strategic-merge-patch+json") => true,
                Some("application/merge-patch+json") => false,
                other => {
                    return status(
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        "UnsupportedMediaType",
                        &format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"),
                    )
                }
            };
            let (patch, current) = match body_and_node(req, &state.store, &name).await {
                Ok(both) => both,
                Err(r) => return r,
            };
            let mut next = current.clone();
            // Only the status: a patch of the status subresource leaves the
            // rest of the object alone (registry/core/node/strategy.go,
            // nodeStatusStrategy.PrepareForUpdate).
            let status_patch = json!({"status": patch["status"].clone()});
            if strategic {
                strategic_merge_node_status(&mut next, &status_patch);
            } else {
                merge_patch(&mut next, &status_patch);
            }
            store_patched_node(state, &name, next, &current).await
        }
        (Method::PATCH, false, None) => {
            // The system:node ClusterRole lets a node patch Nodes; the
            // NodeRestriction plugin narrows that to its own.
            if !(who.is_admin() || own_node) {
                return forbid("patch");
            }
            let (patch, current) = match body_and_node(req, &state.store, &name).await {
                Ok(both) => both,
                Err(r) => return r,
            };
            let mut next = current.clone();
            merge_patch(&mut next, &patch);
            if !who.is_admin() {
                if let Err(why) = node_restriction(&name, &current, &next) {
                    return status(
                        StatusCode::FORBIDDEN,
                        "Forbidden",
                        &format!("nodes \"{name}\" is forbidden: {why}"),
                    );
                }
            }
            // A pod range and a provider ID, once set, are the Node's for
            // good (pkg/apis/core/validation/validation.go
            // ValidateNodeUpdate).
            for (field, shown, what) in [
                ("podCIDR", "podCIDRs", "podCIDR"),
                ("providerID", "providerID", "providerID"),
            ] {
                let had = &current["spec"][field];
                if had.as_str().is_some_and(|v| !v.is_empty()) && next["spec"][field] != *had {
                    return status(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "Invalid",
                        &format!("Node \"{name}\" is invalid: spec.{shown}: Forbidden: node updates may not change {what} except from \"\" to valid"),
                    );
                }
            }
            store_patched_node(state, &name, next, &current).await
        }
        (Method::DELETE, false, None) => {
            if !who.is_admin() {
                return forbid("delete");
            }
            // The node IPAM controller releases a deleted Node's range.
            let range = match state.store.node(&name).await {
                Ok(node) => node.and_then(|n| n["spec"]["podCIDR"].as_str().map(str::to_owned)),
                Err(e) => return internal(e),
            };
            let deleted = state.store.delete_node(&name).await;
            if let (Some(r), Ok(true)) = (&range, &deleted) {
                if let Err(e) = nodeipam::release(&state.store, r).await {
                    println!("standin-apiserver: node {name}: cannot release {r}: {e:#}");
                }
            }
            match deleted {
                Ok(true) => json_resp(
                    StatusCode::OK,
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                            "details": {"name": name, "kind": "nodes"}}),
                ),
                Ok(false) => not_found(),
                Err(e) => internal(e),
            }
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ),
    }
}

/// A request body as JSON (1 MiB at most), or the error to answer.
/// The answer to a request the server could not carry out.
fn internal(e: anyhow::Error) -> Resp {
    status(
        StatusCode::INTERNAL_SERVER_ERROR,
        "InternalError",
        &format!("{e:#}"),
    )
}

fn node_not_found(name: &str) -> Resp {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("nodes \"{name}\" not found"),
    )
}

/// The JSON body of `req` and the stored Node `name`, or the answer that
/// says why there are not both.
async fn body_and_node(
    req: Request<Incoming>,
    store: &Store,
    name: &str,
) -> Result<(serde_json::Value, serde_json::Value), Resp> {
    let body = read_json(req).await?;
    match store.node(name).await {
        Ok(Some(node)) => Ok((body, node)),
        Ok(None) => Err(node_not_found(name)),
        Err(e) => Err(internal(e)),
    }
}

/// A request body of at most 1 MiB, as the API server limits it.
async fn read_body(req: Request<Incoming>) -> Result<hyper::body::Bytes, Resp> {
    Ok(Limited::new(req.into_body(), 1 << 20)
        .collect()
        .await
        .map_err(|_| {
            status(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                "request body too large or unreadable",
            )
        })?
        .to_bytes())
}

async fn read_json(req: Request<Incoming>) -> Result<serde_json::Value, Resp> {
    let body = read_body(req).await?;
    serde_json::from_slice(&body).map_err(|e| {
        status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &format!("the body is not JSON: {e}"),
        )
    })
}

/// A Node with the fields the API server keeps: its creation time (kept
/// from `current`) and a uid.
fn stamped(mut node: serde_json::Value, current: Option<&serde_json::Value>) -> serde_json::Value {
    let created = current
        .and_then(|c| {
            c["metadata"]["creationTimestamp"]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_else(now_rfc3339);
    let uid = current
        .and_then(|c| c["metadata"]["uid"].as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
    node["metadata"]["creationTimestamp"] = created.into();
    node["metadata"]["uid"] = uid.into();
    node["apiVersion"] = "v1".into();
    node["kind"] = "Node".into();
    node
}

/// Now, as the API server writes times (whole seconds, RFC 3339).
fn now_rfc3339() -> String {
    let now = OffsetDateTime::now_utc();
    now.replace_nanosecond(0)
        .unwrap_or(now)
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// RFC 7386 merge patch.
/// Stores a patched Node over `current`; the Node as the cluster sees it.
async fn store_patched_node(
    state: &State,
    name: &str,
    next: serde_json::Value,
    current: &serde_json::Value,
) -> Resp {
    match state
        .store
        .put_object(
            &Store::node_key(name),
            &stamped(next.clone(), Some(current)),
            false,
        )
        .await
    {
        Ok(true) => json_resp(StatusCode::OK, &observed_node(next)),
        Ok(false) => node_not_found(name),
        Err(e) => internal(e),
    }
}

/// A strategic merge patch of a Node's status, as the API server applies
/// one (`staging/src/k8s.io/apimachinery/pkg/util/strategicpatch`): like a
/// JSON merge patch, except that the lists `status.conditions` and
/// `status.addresses` merge item by item on their `patchMergeKey`s (`type`
/// and `type`, `staging/src/k8s.io/api/core/v1/types.go`, NodeStatus): an
/// item of the patch replaces the fields it names of the item of its type,
/// or is added; the other items stay. This is how a kubelet and
/// node-problem-detector each keep their own conditions on one Node
/// (`pkg/util/node/node.go`, `PatchNodeStatus`).
fn strategic_merge_node_status(node: &mut serde_json::Value, patch: &serde_json::Value) {
    let mut rest = patch.clone();
    for list in ["conditions", "addresses"] {
        let Some(items) = rest["status"].as_object_mut().and_then(|s| s.remove(list)) else {
            continue;
        };
        let Some(items) = items.as_array() else {
            node["status"][list] = items;
            continue;
        };
        if !node["status"][list].is_array() {
            node["status"][list] = json!([]);
        }
        let have = node["status"][list].as_array_mut().expect("an array");
        for item in items {
            match have.iter_mut().find(|h| h["type"] == item["type"]) {
                Some(h) => merge_patch(h, item),
                None => have.push(item.clone()),
            }
        }
    }
    merge_patch(node, &rest);
}

fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match patch {
        serde_json::Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            for (k, v) in p {
                if v.is_null() {
                    target.as_object_mut().expect("object").remove(k);
                } else {
                    merge_patch(&mut target[k.as_str()], v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// A Node as the cluster sees it: `Ready=Unknown` once its kubelet has not
/// posted status for the grace period (the node lifecycle controller's
/// verdict).
fn observed_node(mut node: serde_json::Value) -> serde_json::Value {
    let now = OffsetDateTime::now_utc();
    if let Some(conds) = node["status"]["conditions"].as_array_mut() {
        for c in conds.iter_mut().filter(|c| c["type"] == "Ready") {
            let stale = c["lastHeartbeatTime"]
                .as_str()
                .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
                .is_none_or(|t| now - t > NODE_MONITOR_GRACE);
            if stale {
                // It went Unknown when the grace period ran out.
                if c["status"] != "Unknown" {
                    if let Some(t) = c["lastHeartbeatTime"]
                        .as_str()
                        .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
                    {
                        c["lastTransitionTime"] = (t + NODE_MONITOR_GRACE)
                            .format(&Rfc3339)
                            .unwrap_or_default()
                            .into();
                    }
                }
                c["status"] = "Unknown".into();
                c["reason"] = "NodeStatusUnknown".into();
                c["message"] = "Kubelet stopped posting node status.".into();
            }
        }
    }
    node
}

/// `/readyz`: ready while the cluster's etcd answers through the local
/// member (as kube-apiserver's etcd check), so a control plane whose etcd
/// lost quorum drops out of its load balancer.
async fn ready(state: &State) -> Resp {
    let check = state.store.load_cluster_config();
    match tokio::time::timeout(Duration::from_secs(2), check).await {
        Ok(Ok(_)) => text(StatusCode::OK, "ok"),
        Ok(Err(e)) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("[-]etcd failed: {e:#}\nreadyz check failed"),
        ),
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "[-]etcd failed: no answer within 2s\nreadyz check failed",
        ),
    }
}

/// `GET .../kube-system/pods?labelSelector=component=etcd`: the etcd mirror
/// Pods, one per member, with the annotation kubeadm reads the members'
/// client URLs from (`kubeadm.kubernetes.io/etcd.advertise-client-urls`).
/// Other Pods are not served.
async fn etcd_pods(state: &State, query: &str) -> Resp {
    let selector = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "labelSelector")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if selector != "component=etcd" {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the stand-in API server lists only the etcd Pods (labelSelector=component=etcd)",
        );
    }
    let members = match state.store.members().await {
        Ok(m) => m,
        Err(e) => return internal(e),
    };
    let items: Vec<serde_json::Value> = members
        .iter()
        .filter(|m| !m.name.is_empty())
        .map(|m| {
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": format!("etcd-{}", m.name),
                    "namespace": "kube-system",
                    "labels": {"component": "etcd", "tier": "control-plane"},
                    "annotations": {
                        "kubeadm.kubernetes.io/etcd.advertise-client-urls": m.client_urls.join(","),
                    },
                },
                "spec": {"nodeName": m.name},
            })
        })
        .collect();
    json_resp(
        StatusCode::OK,
        &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strategic_merge_of_node_status_keeps_the_conditions_of_other_writers() {
        let mut node = json!({"metadata": {"name": "n"}, "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock"},
            ],
            "nodeInfo": {"kubeletVersion": "v1.31.2"},
        }});
        strategic_merge_node_status(
            &mut node,
            &json!({"status": {"conditions": [
                {"type": "KernelDeadlock", "status": "True", "reason": "TaskHung"},
                {"type": "DeviceError", "status": "True", "reason": "IOError"},
            ]}}),
        );
        let c = node["status"]["conditions"].as_array().unwrap();
        let types: Vec<&str> = c.iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(types, vec!["Ready", "KernelDeadlock", "DeviceError"]);
        assert_eq!(c[0]["reason"], "KubeletReady");
        assert_eq!(c[1]["reason"], "TaskHung");
        assert_eq!(node["status"]["nodeInfo"]["kubeletVersion"], "v1.31.2");
        // A JSON merge patch would have replaced the list whole.
        let mut plain = node.clone();
        merge_patch(
            &mut plain,
            &json!({"status": {"conditions": [{"type": "Ready"}]}}),
        );
        assert_eq!(plain["status"]["conditions"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_node_may_cordon_itself_but_not_touch_taints_owners_or_kubernetes_labels() {
        let node = json!({
            "metadata": {"name": "n", "labels": {"kubernetes.io/hostname": "n", "team": "a"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
        });
        let with = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut n = node.clone();
            f(&mut n);
            node_restriction("n", &node, &n)
        };
        assert_eq!(with(&|n| n["spec"]["unschedulable"] = json!(true)), Ok(()));
        assert_eq!(
            with(&|n| n["metadata"]["labels"]["team"] = json!("b")),
            Ok(())
        );
        assert_eq!(
            with(&|n| n["metadata"]["labels"]
                ["node.kubernetes.io/exclude-from-external-load-balancers"] = json!("")),
            Ok(())
        );
        assert_eq!(
            with(&|n| n["spec"]["taints"] = json!([])),
            Err("node \"n\" is not allowed to modify taints".into())
        );
        assert_eq!(
            with(&|n| n["metadata"]["ownerReferences"] = json!([{"name": "x"}])),
            Err("node \"n\" is not allowed to modify ownerReferences".into())
        );
        assert_eq!(
            with(&|n| n["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] = json!("")),
            Err("is not allowed to modify labels: node-role.kubernetes.io/control-plane".into())
        );
        assert!(with(&|n| n["spec"]["configSource"] = json!({"configMap": {}})).is_err());
    }

    #[test]
    fn secret_parsing() {
        let good = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "bootstrap-token-abcdef", "namespace": "kube-system"},
            "type": "bootstrap.kubernetes.io/token",
            "stringData": {"token-id": "abcdef", "token-secret": "0123456789abcdef",
                "expiration": "2099-01-01T00:00:00Z",
                "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true"}
        });
        let t = parse_token_secret(good.to_string().as_bytes()).unwrap();
        assert_eq!(t.id, "abcdef");
        assert_eq!(t.usages, vec!["authentication", "signing"]);
        let mut wrong_name = good.clone();
        wrong_name["metadata"]["name"] = json!("bootstrap-token-zzzzzz");
        assert!(parse_token_secret(wrong_name.to_string().as_bytes()).is_err());
        let mut bad_secret = good.clone();
        bad_secret["stringData"]["token-secret"] = json!("SHORT");
        assert!(parse_token_secret(bad_secret.to_string().as_bytes()).is_err());
        let mut opaque = good;
        opaque["type"] = json!("Opaque");
        assert!(parse_token_secret(opaque.to_string().as_bytes()).is_err());
    }
}
