//! The coordinator's HTTP API: the admin API (bearer tokens) and the machine
//! API (a ticket to register, mutual TLS after that).

pub mod admin;
pub mod machine;
pub mod openapi;
pub mod security;
pub mod server;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use drover_common::api::{FieldError, Problem};

use crate::app::App;
use crate::domain::secrets::{hash_token, AdminRole, AdminTokens, ADMIN_TOKENS};
use crate::store::{Kind, StoreError};

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
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            leader_only,
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/openapi.json", get(openapi::openapi_json))
        .route("/v1/clusters", get(admin::list_clusters))
        .route(
            "/v1/clusters/{name}",
            get(admin::get_cluster)
                .put(admin::apply_cluster)
                .delete(admin::delete_cluster),
        )
        .route("/v1/clusters/{name}/kubeconfig", post(admin::kubeconfig))
        .route("/v1/machines", get(admin::list_machines))
        .route("/v1/status", get(admin::status))
        .route("/v1/machines/{name}", get(admin::get_machine))
        .route("/v1/machines/{name}/revoke", post(admin::revoke_machine))
        .route(
            "/v1/registrationtokens",
            get(admin::list_tokens).post(admin::create_token),
        )
        .route(
            "/v1/registrationtokens/{name}",
            put(admin::revoke_token_put).delete(admin::revoke_token),
        )
        .route("/v1/coordinators", get(admin::coordinators))
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
        .fallback(|| async { ApiError::not_found("route", "this path") })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(refuse_oversized))
        // Outside the size check, so 413 refusals are audited too.
        .layer(axum::middleware::from_fn_with_state(app.clone(), audit))
        .layer(axum::middleware::from_fn(close_if_body_unread))
        .with_state(app)
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

/// An API failure, rendered as an RFC 9457 problem document.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub title: String,
    pub detail: String,
    pub errors: Vec<FieldError>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
    /// Set for a machine that must wait for its config: the body is then a
    /// `ConfigNotReady` the agent reads, not a problem document.
    pub not_ready: Option<Box<drover_common::wire::ConfigNotReady>>,
}

impl ApiError {
    pub fn new(status: StatusCode, title: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            status,
            title: title.into(),
            detail: detail.into(),
            errors: vec![],
            retry_after: None,
            not_ready: None,
        }
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "Bad request", detail)
    }

    pub fn invalid(detail: impl Into<String>, errors: Vec<FieldError>) -> Self {
        Self {
            errors,
            ..Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid document", detail)
        }
    }

    pub fn not_found(kind: &str, name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "Not found",
            format!("{kind} {name} does not exist"),
        )
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Unauthorized", detail)
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Forbidden", detail)
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "Conflict", detail)
    }

    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal error",
            detail.to_string(),
        )
    }
}

impl From<crate::domain::bootstrap::BootstrapError> for ApiError {
    fn from(e: crate::domain::bootstrap::BootstrapError) -> Self {
        use crate::domain::bootstrap::BootstrapError;
        match e {
            BootstrapError::NotFound { kind, name } => ApiError::not_found(kind, &name),
            BootstrapError::Conflict(detail) => ApiError::conflict(detail),
            BootstrapError::NotReady {
                reason,
                retry_after_seconds,
            } => {
                let mut e = ApiError::new(StatusCode::CONFLICT, "Config not ready", reason.clone());
                e.not_ready = Some(Box::new(drover_common::wire::ConfigNotReady {
                    reason,
                    retry_after_seconds,
                }));
                e
            }
            BootstrapError::Store(e) => e.into(),
            BootstrapError::Internal(detail) => ApiError::internal(detail),
        }
    }
}

impl From<crate::domain::registrar::RegistrationError> for ApiError {
    fn from(e: crate::domain::registrar::RegistrationError) -> Self {
        use crate::domain::registrar::RegistrationError;
        match e {
            RegistrationError::Unauthorized(detail) => ApiError::unauthorized(detail),
            RegistrationError::UsedUp(detail) => ApiError::conflict(detail),
            RegistrationError::NameTaken { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "Name taken", e.to_string())
            }
            RegistrationError::Store(e) => e.into(),
            RegistrationError::Internal(detail) => ApiError::internal(detail),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match &e {
            StoreError::NotFound { kind, name } => ApiError::not_found(kind, name),
            StoreError::AlreadyExists { .. } | StoreError::Conflict { .. } => {
                ApiError::conflict(e.to_string())
            }
            StoreError::Corrupt { .. } | StoreError::Backend(_) | StoreError::Sealed(_) => {
                ApiError::internal(e)
            }
            // Deposed mid-request: the caller tries the next coordinator.
            StoreError::Fenced { .. } => {
                let mut a = ApiError::new(
                    StatusCode::MISDIRECTED_REQUEST,
                    "Not the leader",
                    e.to_string(),
                );
                a.retry_after = Some(1);
                a
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Some(nr) = self.not_ready {
            let secs = nr.retry_after_seconds;
            let mut resp = (self.status, axum::Json(*nr)).into_response();
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            return resp;
        }
        let problem = Problem {
            type_: "about:blank".into(),
            title: self.title,
            status: self.status.as_u16(),
            detail: self.detail,
            errors: self.errors,
        };
        let mut resp = (self.status, axum::Json(problem)).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// An authenticated admin caller.
#[derive(Debug, Clone)]
pub struct Admin {
    pub token_id: String,
    pub role: AdminRole,
}

impl Admin {
    /// Refuses callers who may only read.
    pub fn require_write(&self) -> Result<(), ApiError> {
        match self.role {
            AdminRole::Admin => Ok(()),
            AdminRole::Viewer => Err(ApiError::forbidden(format!(
                "token {} has the viewer role and cannot change anything",
                self.token_id
            ))),
        }
    }
}

impl FromRequestParts<Arc<App>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        resolve_admin(app, &parts.headers)
    }
}

/// Authenticates an admin bearer token; the one place tokens are checked.
pub fn resolve_admin(app: &App, headers: &axum::http::HeaderMap) -> Result<Admin, ApiError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            ApiError::unauthorized(
                "missing `Authorization: Bearer <token>`; pass --token or set DROVER_TOKEN",
            )
        })?;
    let token = value.strip_prefix("Bearer ").ok_or_else(|| {
        ApiError::unauthorized("the Authorization header must be `Bearer <token>`")
    })?;
    let hash = hash_token(token.trim());
    let tokens = app
        .store
        .get_json::<AdminTokens>(Kind::Secret, ADMIN_TOKENS)?
        .map(|(t, _)| t)
        .unwrap_or_default();
    let record = tokens
        .tokens
        .iter()
        .find(|t| constant_time_eq(t.sha256.as_bytes(), hash.as_bytes()))
        .ok_or_else(|| {
            ApiError::unauthorized("the admin token is not valid for this coordinator")
        })?;
    Ok(Admin {
        token_id: record.id.clone(),
        role: record.role,
    })
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
    let reads = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
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
            suppressed: None,
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
    let actor = if req.headers().contains_key(header::AUTHORIZATION) {
        match resolve_admin(&app, req.headers()) {
            Ok(a) => {
                let actor = format!("admin-token:{} ({:?})", a.token_id, a.role).to_lowercase();
                if a.role == AdminRole::Viewer {
                    viewer = Some(a);
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
    // The viewer role changes nothing: refused before the body is read or
    // parsed, whatever the route.
    let resp = match viewer {
        Some(v) if !reads => match v.require_write() {
            Err(e) => e.into_response(),
            Ok(()) => next.run(req).await,
        },
        _ => next.run(req).await,
    };
    app.audit.record(crate::domain::audit::AuditEntry {
        time: drover_common::now(),
        actor,
        source,
        method,
        path,
        status: resp.status().as_u16(),
        suppressed: None,
    });
    resp
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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

/// A 408 when a body extractor failed because the body did not arrive
/// in time (see [`crate::http::server::BodyTimedOut`]).
fn timed_out(rejection: &(dyn std::error::Error + 'static)) -> Option<ApiError> {
    let mut cause = Some(rejection);
    while let Some(e) = cause {
        if let Some(t) = e.downcast_ref::<crate::http::server::BodyTimedOut>() {
            return Some(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "Request body timed out",
                t.to_string(),
            ));
        }
        cause = e.source();
    }
    None
}

/// A raw body whose rejections (too large, unreadable) are problem documents.
pub struct RawBody(pub axum::body::Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        match axum::body::Bytes::from_request(req, state).await {
            Ok(b) => Ok(RawBody(b)),
            Err(rejection) => Err(timed_out(&rejection).unwrap_or_else(|| {
                ApiError::new(
                    rejection.status(),
                    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                        "Request body too large"
                    } else {
                        "Unreadable request body"
                    },
                    rejection.body_text(),
                )
            })),
        }
    }
}

/// A JSON body whose rejections are problem documents, like every other error.
pub struct Body<T>(pub T);

impl<T, S> axum::extract::FromRequest<S> for Body<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Body(v)),
            Err(rejection) => {
                if let Some(e) = timed_out(&rejection) {
                    return Err(e);
                }
                let status = rejection.status();
                let title = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    "Request body too large"
                } else {
                    "Malformed request body"
                };
                Err(ApiError::new(status, title, rejection.body_text()))
            }
        }
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

        let resp = router
            .clone()
            .oneshot(post_body("/reads", "{}"))
            .await
            .unwrap();
        assert_eq!(closes(&resp), None);
        let resp = router
            .clone()
            .oneshot(post_body("/ignores", ""))
            .await
            .unwrap();
        assert_eq!(closes(&resp), None);
    }
}
