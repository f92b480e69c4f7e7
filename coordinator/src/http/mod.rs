//! The coordinator's HTTP API: the admin API (bearer tokens) and the machine
//! API (a ticket to register, mutual TLS after that).

pub mod admin;
mod auth;
mod autoscaler;
mod backup;
mod bmc;
mod body;
pub mod cluster_write;
mod error;
pub mod kube;
pub mod machine;
pub mod openapi;
pub mod paging;
pub mod responses;
pub mod restore;
pub mod secrets;
pub mod security;
pub mod server;
pub mod snapshots;
pub mod tokens;
pub mod ui;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;

use crate::app::App;
use crate::domain::secrets::AdminRole;

pub use auth::{resolve_admin, Admin};
pub use body::{Body, RawBody};
pub use error::ApiError;

/// The largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Builds the router for the whole API.
pub fn router(app: Arc<App>) -> Router {
    // The machine API is the leader's: it holds the heartbeat deadlines and
    // its writes are fenced by its term.
    let machine_api = Router::new()
        .route("/v1/machine/register", post(machine::register))
        .route("/v1/machine/heartbeat", post(machine::heartbeat))
        .route("/v1/machine/config", get(machine::config))
        .route("/v1/machine/certificate", post(machine::renew))
        .route(
            "/v1/machine/snapshots/{name}",
            get(machine::snapshot_grant).post(machine::snapshot_saved),
        )
        .route("/v1/machine/inventory", post(machine::inventory))
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            leader_only,
        ))
        .route_layer(axum::middleware::from_fn(measure_machine_request));
    // A sealed etcd snapshot is streamed to disk, up to
    // `snapshots::MAX_SEALED_BYTES`: outside the body size limit.
    let snapshot_upload = Router::new()
        .route(
            "/v1/machine/snapshots/{name}/data",
            axum::routing::put(machine::snapshot_upload).get(restore::snapshot_download),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            leader_only,
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/ui", get(ui::overview))
        .route("/ui/", get(ui::overview))
        .route("/ui/login", get(ui::login_page).post(ui::login))
        .route("/ui/logout", post(ui::logout))
        .route("/ui/static/drover.css", get(ui::stylesheet))
        .route("/ui/clusters", get(ui::clusters))
        .route("/ui/clusters/{name}", get(ui::cluster))
        .route("/ui/machines", get(ui::machines))
        .route("/ui/machines/{name}", get(ui::machine))
        .route("/openapi.json", get(openapi::openapi_json))
        .route("/api", get(kube::discovery::core_versions))
        .route("/version", get(kube::version))
        .route("/apis", get(kube::discovery::groups))
        .route("/apis/drover.dev/v1alpha1", get(kube::discovery::resources))
        .route(
            "/apis/drover.dev/v1alpha1/clusters",
            get(kube::list_clusters).post(kube::write::create::<kube::write::Clusters>),
        )
        .route(
            "/apis/drover.dev/v1alpha1/clusters/{name}",
            get(kube::get_cluster)
                .put(kube::write::replace::<kube::write::Clusters>)
                .patch(kube::write::patch::<kube::write::Clusters>)
                .delete(kube::write::delete::<kube::write::Clusters>),
        )
        .route(
            "/apis/drover.dev/v1alpha1/clusters/{name}/status",
            get(kube::get_cluster)
                .put(kube::write::write_status)
                .patch(kube::write::write_status),
        )
        .route(
            "/apis/drover.dev/v1alpha1/machines",
            get(kube::list_machines),
        )
        .route(
            "/apis/drover.dev/v1alpha1/machines/{name}",
            get(kube::get_machine).delete(kube::write::delete_machine),
        )
        .route(
            "/apis/drover.dev/v1alpha1/registrationtokens",
            get(kube::list_tokens).post(kube::write::create::<kube::write::Tokens>),
        )
        .route(
            "/apis/drover.dev/v1alpha1/registrationtokens/{name}",
            get(kube::get_token)
                .put(kube::write::replace::<kube::write::Tokens>)
                .patch(kube::write::patch::<kube::write::Tokens>)
                .delete(kube::write::delete::<kube::write::Tokens>),
        )
        .route(
            "/apis/drover.dev/v1alpha1/registrationtokens/{name}/bootstrap",
            post(kube::write::create_bootstrap),
        )
        .route(
            "/apis/drover.dev/v1alpha1/secrets",
            get(kube::list_secrets).post(kube::write::create::<kube::write::Secrets>),
        )
        .route(
            "/apis/drover.dev/v1alpha1/secrets/{name}",
            get(kube::get_secret)
                .put(kube::write::replace::<kube::write::Secrets>)
                .patch(kube::write::patch::<kube::write::Secrets>)
                .delete(kube::write::delete::<kube::write::Secrets>),
        )
        .route(
            "/apis/authorization.k8s.io/v1",
            get(kube::discovery::authorization_resources),
        )
        .route(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            post(kube::access::access_review),
        )
        .route(
            "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            post(kube::access::rules_review),
        )
        .route("/openapi/v3", get(kube::openapi_v3::index))
        .route(
            "/openapi/v3/apis/drover.dev/v1alpha1",
            get(kube::openapi_v3::group_version_document),
        )
        .route("/apis/{*rest}", get(kube::not_found))
        .route("/v1/clusters", get(admin::list_clusters))
        .route(
            "/v1/clusters/{name}",
            get(admin::get_cluster)
                .put(admin::apply_cluster)
                .delete(admin::delete_cluster),
        )
        .route("/v1/clusters/{name}/kubeconfig", post(admin::kubeconfig))
        .route(
            "/v1/clusters/{name}/autoscaler-credentials",
            post(autoscaler::credentials),
        )
        .route(
            "/v1/clusters/{name}/rollout/resume",
            post(admin::resume_rollout),
        )
        .route(
            "/v1/clusters/{name}/snapshots",
            post(snapshots::request_snapshot),
        )
        .route(
            "/v1/clusters/{name}/restore",
            post(restore::restore_cluster),
        )
        .route("/v1/snapshots", get(snapshots::list_snapshots))
        .route("/v1/machines", get(admin::list_machines))
        .route("/v1/status", get(admin::status))
        .route(
            "/v1/machines/{name}",
            get(admin::get_machine).delete(admin::delete_machine),
        )
        .route("/v1/machines/{name}/revoke", post(admin::revoke_machine))
        .route(
            "/v1/machines/{name}/bmc",
            put(bmc::set_bmc).delete(bmc::clear_bmc),
        )
        .route("/v1/machines/{name}/power", post(bmc::power))
        .route(
            "/v1/registrationtokens",
            get(tokens::list_tokens).post(tokens::create_token),
        )
        .route(
            "/v1/registrationtokens/{name}",
            put(tokens::revoke_token_put).delete(tokens::revoke_token),
        )
        .route("/v1/coordinators", get(admin::coordinators))
        .route("/v1/secrets", get(secrets::list_secrets))
        .route(
            "/v1/secrets/{name}",
            get(secrets::get_secret)
                .put(secrets::apply_secret)
                .delete(secrets::delete_secret),
        )
        .merge(machine_api)
        .route(
            "/v1/admintokens",
            get(security::list_admin_tokens).post(security::create_admin_token),
        )
        .route(
            "/v1/admintokens/{id}",
            axum::routing::delete(security::revoke_admin_token),
        )
        .route("/v1/keys", get(security::list_keys))
        .route("/v1/keys/rotate", post(security::rotate_keys))
        .route("/v1/audit", get(security::read_audit))
        .route("/v1/backup", post(backup::backup))
        .fallback(|| async { ApiError::not_found("route", "this path") })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(refuse_oversized))
        .merge(snapshot_upload)
        // Outside the size check, so 413 refusals are audited too.
        .layer(axum::middleware::from_fn_with_state(app.clone(), audit))
        .layer(axum::middleware::from_fn(close_if_body_unread))
        .with_state(app)
}

/// `GET /metrics`: the Prometheus text exposition (OpenMetrics), for any
/// admin token (a viewer's is enough: give Prometheus one).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "meta",
    security(("adminToken" = [])),
    responses(
        (status = 200, description = "Every drover_ series: OpenMetrics when the Accept header asks for it (Prometheus does), else the classic text format 0.0.4.", body = String, content_type = "text/plain"),
    ),
)]
pub async fn metrics(
    State(app): State<Arc<App>>,
    _admin: Admin,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let connections = {
        let c = server::connection_stats();
        crate::metrics::Connections {
            open: c.open,
            parked: c.parked,
            unauthenticated: c.unauthenticated,
            full_handshakes: c.full_handshakes,
            resumed_handshakes: c.resumed_handshakes,
            failed_handshakes: c.failed_handshakes,
        }
    };
    let leader_term = app.leadership.term().map(|t| t.0);
    let (control_planes, others) = app.fleet.datagrams.by_datagram();
    let datagram_machines = crate::metrics::DatagramMachines {
        control_planes,
        others,
    };
    let text = app.with_summary(|fleet| {
        crate::metrics::global().render(&crate::metrics::State {
            fleet,
            leader_term,
            connections,
            datagram_machines,
        })
    })?;
    // Prometheus asks for OpenMetrics; anyone else gets the classic format.
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    Ok(if openmetrics {
        typed_body(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            text,
        )
    } else {
        typed_body(
            "text/plain; version=0.0.4; charset=utf-8",
            crate::metrics::classic_text(&text),
        )
    })
}

/// A 200 answer of `body`, already in the form `content_type` names (a
/// document serialised ahead, a rendered exposition, a stylesheet).
pub(crate) fn typed_body(content_type: &'static str, body: impl IntoResponse) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Records each machine API request's time and result in the metrics.
async fn measure_machine_request(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let operation = match req.uri().path() {
        "/v1/machine/register" => "register",
        "/v1/machine/heartbeat" => "heartbeat",
        "/v1/machine/config" => "config",
        "/v1/machine/certificate" => "certificate",
        _ => "other",
    };
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    crate::metrics::global().machine_request(
        operation,
        resp.status().is_success(),
        started.elapsed(),
    );
    resp
}

/// How long `/readyz` waits for the store to answer.
const READY_STORE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /readyz`: whether this replica can do its work: its store answers
/// a read within 2 s, its keys are loaded (the store is sealed with them),
/// and it leads or knows which replica does. 200 `ok`, or 503 with one
/// line per failed check; never any object's data.
async fn readyz(State(app): State<Arc<App>>) -> Response {
    let mut failed: Vec<&str> = Vec::new();
    let store = app.store.clone();
    let read = crate::store::blocking(move || {
        // Opening the CA record proves the store answers and the keys
        // that seal it are loaded.
        store.get(
            crate::store::Kind::Secret,
            crate::domain::secrets::COORDINATOR_CA,
        )
    });
    match tokio::time::timeout(READY_STORE_TIMEOUT, read).await {
        Ok(Ok(Some(_))) => {}
        Ok(Ok(None)) => failed.push("keys: the coordinator CA is missing from the store"),
        Ok(Err(crate::store::StoreError::Sealed(_))) => {
            failed.push("keys: the store's secrets do not open with the loaded keys")
        }
        Ok(Err(_)) => failed.push("store: unreachable"),
        Err(_) => failed.push("store: no answer within 2s"),
    }
    if app.leadership.term().is_none() && app.leadership.leader_url().is_none() {
        failed.push("leader: none elected yet");
    }
    if failed.is_empty() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        let body = failed.iter().map(|f| format!("{f}\n")).collect::<String>();
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

/// Serves a machine API request on the leader, inside its term's fence; a
/// follower answers 421 and names the leader, and the agent tries its next
/// coordinator URL.
async fn leader_only(
    State(app): State<Arc<App>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match app.leadership.term() {
        Some(term) => crate::store::fenced(term, next.run(req)).await,
        None => {
            let detail = match app.leadership.leader_url() {
                Some(url) => format!(
                    "coordinator {} is a follower; the leader is {url}",
                    app.leadership.me.id
                ),
                None => format!(
                    "coordinator {} is a follower and no leader is elected yet; retry shortly",
                    app.leadership.me.id
                ),
            };
            let mut e = ApiError::new(StatusCode::MISDIRECTED_REQUEST, "Not the leader", detail);
            e.retry_after = Some(1);
            e.into_response()
        }
    }
}

/// Records every request that may change something, every machine config
/// fetch (it hands out CA keys and mints join tokens) and every refusal
/// for size in the audit log: who (admin token id, machine, or anonymous
/// with the source address), what (method, path, outcome) and when.
/// Refuses a viewer's change here, before its body is read.
pub async fn audit(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use axum::http::Method;
    // An access review is a question, not a change: a POST that reads.
    let reads = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS)
        || req.uri().path().starts_with(kube::access::REVIEWS_PREFIX);
    if reads && req.uri().path() != "/v1/machine/config" && !announces_oversized(req.headers()) {
        return next.run(req).await;
    }
    // An accepted heartbeat changes no object and arrives every interval
    // from every machine: at 50,000 machines, auditing each would be most
    // of the coordinator's work and tens of gigabytes a day. Refused
    // heartbeats are audited like any other request.
    if req.uri().path() == "/v1/machine/heartbeat" {
        // Standard methods clone without allocating.
        let method = req.method().clone();
        let peer = req
            .extensions()
            .get::<crate::http::server::PeerCertificate>()
            .cloned();
        let source = req
            .extensions()
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0.ip().to_string())
            .unwrap_or_default();
        let resp = next.run(req).await;
        if resp.status().is_success() {
            return resp;
        }
        let actor = peer
            .as_ref()
            .and_then(|p| p.common_name())
            .map_or_else(|| "anonymous".to_owned(), |cn| format!("machine:{cn}"));
        app.audit.record(crate::domain::audit::AuditEntry {
            time: drover_common::now(),
            actor,
            source,
            method: method.to_string(),
            path: "/v1/machine/heartbeat".into(),
            status: resp.status().as_u16(),
            stage: None,
            suppressed: None,
            changes: Vec::new(),
        });
        return resp;
    }
    let method = req.method().to_string();
    let path = req.uri().path().to_owned();
    let source = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip().to_string())
        .unwrap_or_default();
    let mut viewer = None;
    let mut admin_change = false;
    let actor = if req.headers().contains_key(header::AUTHORIZATION) {
        match resolve_admin(&app, req.headers()) {
            Ok(a) => {
                let actor = a.audit_actor();
                if a.role == AdminRole::Viewer {
                    viewer = Some(a);
                } else {
                    admin_change = !reads;
                }
                actor
            }
            Err(_) => "invalid-admin-token".to_owned(),
        }
    } else if let Some(cn) = req
        .extensions()
        .get::<crate::http::server::PeerCertificate>()
        .and_then(|p| p.common_name().map(str::to_owned))
    {
        format!("machine:{cn}")
    } else {
        "anonymous".to_owned()
    };
    // Audit first: an admin's change is recorded before it is carried out,
    // and refused when that record cannot be written (a full disk), so no
    // change goes unaudited.
    if admin_change {
        let received = crate::domain::audit::AuditEntry {
            time: drover_common::now(),
            actor: actor.clone(),
            source: source.clone(),
            method: method.clone(),
            path: path.clone(),
            status: 0,
            stage: Some(crate::types::AuditStage::RequestReceived),
            suppressed: None,
            changes: Vec::new(),
        };
        if let Err(e) = app.audit.record_first(received) {
            let mut refused = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "Audit log unavailable",
                format!(
                    "{method} {path} was refused and nothing was changed: {e}. Every change is recorded in the audit log before it is made; free space on the file system holding {} (or make the file writable by the coordinator), then retry",
                    e.path.display()
                ),
            );
            refused.retry_after = Some(10);
            return refused.into_response();
        }
    }
    // The viewer role changes nothing: refused before the body is read or
    // parsed, whatever the route.
    let resp = match viewer {
        Some(v) if !reads => match v.require_write() {
            // The Kubernetes-style API answers with a Status.
            Err(e) if path.starts_with("/apis/") => kube::KubeError::from(e).into_response(),
            Err(e) => e.into_response(),
            Ok(()) => next.run(req).await,
        },
        _ => next.run(req).await,
    };
    let changes = resp
        .extensions()
        .get::<AuditChanges>()
        .map(|c| c.0.clone())
        .unwrap_or_default();
    let actor = resp
        .extensions()
        .get::<AuditActor>()
        .map_or(actor, |a| a.0.clone());
    app.audit.record(crate::domain::audit::AuditEntry {
        time: drover_common::now(),
        actor,
        source,
        method,
        path,
        status: resp.status().as_u16(),
        stage: None,
        suppressed: None,
        changes,
    });
    resp
}

/// What a handler tells the audit log it changed beyond the request line
/// (a response extension, never sent to the client).
#[derive(Debug, Clone, Default)]
pub struct AuditChanges(pub Vec<String>);

/// Who made a request that proved its identity in a way the audit
/// middleware cannot see (a sign-in by the token in its form, a sign-out
/// by its session cookie), as [`Admin::audit_actor`] names them (a
/// response extension, never sent to the client).
#[derive(Debug, Clone)]
pub struct AuditActor(pub String);

/// The body length a request announces, if it does.
fn announced_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Whether a request announces a body over [`MAX_BODY_BYTES`].
fn announces_oversized(headers: &axum::http::HeaderMap) -> bool {
    announced_length(headers).is_some_and(|n| n > MAX_BODY_BYTES as u64)
}

/// Refuses a request whose announced body is larger than [`MAX_BODY_BYTES`]
/// before reading any of it; bodies without a length are cut off by the
/// extractors at the same size.
async fn refuse_oversized(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let announced = announced_length(req.headers());
    if let Some(n) = announced.filter(|n| *n > MAX_BODY_BYTES as u64) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Request body too large",
            format!("the body is {n} bytes; the limit is {MAX_BODY_BYTES} bytes"),
        )
        .into_response();
    }
    next.run(req).await
}

/// Answers `Connection: close` when the request announced a body that was
/// not read to its end (an answer given before the body was needed, such as
/// a 401 or 405, or a body cut off at the size limit). hyper closes such a
/// connection after the answer, since the unread rest of the body stands
/// between it and the next request; without the header a client that reuses
/// the connection in the meantime loses its next request to the closing
/// socket.
pub(crate) async fn close_if_body_unread(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let headers = req.headers();
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()) != Some(0));
    if !has_body {
        return next.run(req).await;
    }
    let read = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let req = req.map(|inner| {
        axum::body::Body::new(ReadToEnd {
            inner,
            read: read.clone(),
        })
    });
    let mut resp = next.run(req).await;
    if !read.load(std::sync::atomic::Ordering::Acquire) {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// A request body that records whether it was read to its end.
struct ReadToEnd {
    inner: axum::body::Body,
    read: Arc<std::sync::atomic::AtomicBool>,
}

impl hyper::body::Body for ReadToEnd {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(None) = polled {
            self.read.store(true, std::sync::atomic::Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        let end = self.inner.is_end_stream();
        if end {
            self.read.store(true, std::sync::atomic::Ordering::Release);
        }
        end
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use tower::ServiceExt;

    fn post_body(path: &str, body: &'static str) -> axum::extract::Request {
        axum::extract::Request::post(path)
            .header(header::CONTENT_LENGTH, body.len())
            .body(axum::body::Body::from(body))
            .unwrap()
    }

    /// Stores a new admin token of `role`; returns its secret.
    fn admin_token(app: &App, role: AdminRole) -> String {
        use crate::domain::secrets::{new_admin_token, AdminTokens, ADMIN_TOKENS};
        let (token, record) = new_admin_token(role);
        app.store
            .modify_json(
                crate::store::Kind::Secret,
                ADMIN_TOKENS,
                |tokens: Option<AdminTokens>| {
                    let mut tokens = tokens.unwrap_or_default();
                    tokens.tokens.push(record.clone());
                    Ok::<_, crate::store::StoreError>(crate::store::Modify::Write(tokens, ()))
                },
            )
            .unwrap();
        token
    }

    #[tokio::test]
    async fn a_change_that_cannot_be_audited_is_refused_before_it_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.log");
        // Every write to /dev/full fails with ENOSPC, as on a full disk.
        std::os::unix::fs::symlink("/dev/full", &log).unwrap();
        let app = App::for_tests(dir.path());
        let token = admin_token(&app, AdminRole::Admin);
        let secret = "apiVersion: drover.dev/v1alpha1\nkind: Secret\nmetadata:\n  name: s\nstringData:\n  k: v\n";
        let put = axum::extract::Request::put("/v1/secrets/s")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/yaml")
            .header(header::CONTENT_LENGTH, secret.len())
            .body(axum::body::Body::from(secret))
            .unwrap();
        let resp = router(app.clone()).oneshot(put).await.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            resp.headers().get(header::CONTENT_TYPE).unwrap(),
            "application/problem+json"
        );
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(&log.display().to_string()), "{detail}");
        assert!(detail.contains("No space left on device"), "{detail}");
        assert!(detail.contains("nothing was changed"), "{detail}");
        assert!(
            crate::domain::user_secrets::get(&app.store, "s")
                .unwrap()
                .is_none(),
            "the unaudited change was made"
        );
        // Reading changes nothing and is served.
        let get = axum::extract::Request::get("/v1/secrets")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(axum::body::Body::empty())
            .unwrap();
        assert_eq!(
            router(app).oneshot(get).await.unwrap().status(),
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn an_admins_change_is_recorded_before_and_after_it_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let app = App::for_tests(dir.path());
        let token = admin_token(&app, AdminRole::Admin);
        let delete = axum::extract::Request::delete("/v1/secrets/nope")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(axum::body::Body::empty())
            .unwrap();
        let resp = router(app.clone()).oneshot(delete).await.unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let entries = app.audit.tail(10).unwrap();
        let stages: Vec<_> = entries.iter().map(|e| (e.stage, e.status)).collect();
        assert_eq!(
            stages,
            [
                (Some(crate::types::AuditStage::RequestReceived), 0),
                (None, 404)
            ]
        );
        assert!(entries.iter().all(|e| e.path == "/v1/secrets/nope"));
    }

    #[tokio::test]
    async fn answer_before_the_body_is_read_closes_the_connection() {
        let router = Router::new()
            .route("/ignores", post(|| async { StatusCode::UNAUTHORIZED }))
            .route("/reads", post(|body: String| async move { body }))
            .layer(axum::middleware::from_fn(close_if_body_unread));
        let closes = |resp: &Response| resp.headers().get(header::CONNECTION).cloned();

        let resp = router
            .clone()
            .oneshot(post_body("/ignores", "{}"))
            .await
            .unwrap();
        assert_eq!(closes(&resp), Some(HeaderValue::from_static("close")));
        // A method the route does not serve: answered 405 without reading.
        let req = axum::extract::Request::put("/reads")
            .header(header::CONTENT_LENGTH, 2)
            .body(axum::body::Body::from("{}"))
            .unwrap();
        let resp = router.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(closes(&resp), Some(HeaderValue::from_static("close")));

        for (path, body) in [("/reads", "{}"), ("/ignores", "")] {
            let resp = router.clone().oneshot(post_body(path, body)).await.unwrap();
            assert_eq!(closes(&resp), None, "{path} with body {body:?}");
        }
    }
}
