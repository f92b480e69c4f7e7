//! Machine API handlers: registration with a ticket, then heartbeats,
//! config bundles and certificate renewal over mutual TLS.
//!
//! The edge only: each handler parses the request, authenticates the
//! machine's certificate, calls [`crate::machine_service`] (the IO around
//! the protocol core, [`crate::protocol`]) and encodes the answer. Every
//! failure becomes a problem document in one place, the `From` below.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use drover_common::wire::{
    ConfigNotReady, HeartbeatRequest, HeartbeatResponse, RegisterRequest, RegisterResponse,
    RenewRequest, RenewResponse,
};

use super::body::Body;
use super::error::ApiError;
use crate::app::App;
use crate::http::server::PeerCertificate;
use crate::machine_service::{self, MachineCallError};
use crate::protocol::identity::{AuthError, IssueError};
use crate::protocol::register::RegisterError;
use crate::protocol::renewal::RenewError;
use crate::snapshots::SnapshotCallError;

/// `POST /v1/machine/register`: redeem a ticket, get a client certificate.
///
/// The only machine call without a client certificate: the ticket from the
/// bootstrap document authenticates it, once.
#[utoipa::path(
    post,
    path = "/v1/machine/register",
    tag = "machine",
    security(()),
    request_body(
        content = RegisterRequest,
        example = json!({
            "ticket": "dt1.eyJncmFudCI6e319.c2lnbmF0dXJl",
            "csrPem": super::responses::EXAMPLE_CSR,
            "facts": {
                "hostname": "node-1",
                "addresses": ["192.0.2.10"],
                "apiServerPort": 6443,
                "kubeletHealthzPort": 10248,
                "agentVersion": "0.1.0"
            }
        }),
    ),
    responses(
        (status = 201, description = "Registered: the machine's name and client certificate.", body = RegisterResponse),
        (status = 401, description = "The ticket is invalid, expired or revoked, or its machine is gone.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The ticket is presented from another cloud instance than the one launched for its machine.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The cloud provider could not confirm the instance now; retry after `Retry-After` seconds.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The ticket was already used.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 429, response = super::responses::TooManyRequests),
        super::responses::JsonBodyRefusals,
    ),
)]
pub async fn register(
    State(app): State<Arc<App>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    Body(req): Body<RegisterRequest>,
) -> Result<(StatusCode, Json<RegisterResponse>), ApiError> {
    let registered = machine_service::register(&app, peer.ip(), req).await?;
    Ok((StatusCode::CREATED, Json(registered)))
}

/// Finds the machine a verified client certificate belongs to.
fn authenticate(
    app: &App,
    peer: &PeerCertificate,
) -> Result<drover_common::api::Machine, ApiError> {
    Ok(machine_service::authenticate(app, peer.0.as_deref())?)
}

/// `POST /v1/machine/heartbeat`: record liveness and what changed, answer
/// with the assignment and directives.
#[utoipa::path(
    post,
    path = "/v1/machine/heartbeat",
    tag = "machine",
    security(("machineCertificate" = [])),
    request_body = HeartbeatRequest,
    responses(
        (status = 200, description = "The machine's assignment and the directives it is to carry out.", body = HeartbeatResponse),
        super::responses::JsonBodyRefusals,
    ),
)]
pub async fn heartbeat(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<PeerCertificate>,
    Body(hb): Body<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let machine = authenticate(&app, &peer)?;
    Ok(Json(machine_service::heartbeat(&app, machine, hb).await?))
}

/// `GET /v1/machine/config`: the signed bundle for the machine's assignment.
#[utoipa::path(
    get,
    path = "/v1/machine/config",
    tag = "machine",
    security(("machineCertificate" = [])),
    responses(
        (status = 200, description = "The config bundle, signed with the coordinator CA key.", body = drover_common::bundle::SignedBundle),
        (status = 404, response = super::responses::NotFound),
        (status = 409, description = "The machine cannot bootstrap yet (a `ConfigNotReady` to retry after `retryAfterSeconds`), or its state conflicts (a problem document; also when its bundle would be over the 4 MiB cap).",
            headers(("Retry-After" = u64, description = "Seconds to wait before asking again (with a `ConfigNotReady`).")),
            content(
                (ConfigNotReady = "application/json"),
                (drover_common::api::Problem = "application/problem+json"),
            ),
        ),
        (status = 429, description = "Another config fetch with this machine's identity is being served: one at a time per machine, never queued. Ask again after `Retry-After`.",
            headers(("Retry-After" = u64, description = "Seconds to wait before asking again.")),
            body = drover_common::api::Problem, content_type = "application/problem+json",
        ),
    ),
)]
pub async fn config(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<PeerCertificate>,
) -> Result<axum::response::Response, ApiError> {
    // Reads secrets and signs: off the async workers.
    let json =
        crate::store::blocking(move || machine_service::config(&app, peer.0.as_deref())).await?;
    Ok(super::typed_body("application/json", json))
}

/// `POST /v1/machine/certificate`: a fresh client certificate for a new key.
#[utoipa::path(
    post,
    path = "/v1/machine/certificate",
    tag = "machine",
    security(("machineCertificate" = [])),
    request_body(content = RenewRequest, example = json!({"csrPem": super::responses::EXAMPLE_CSR})),
    responses(
        (status = 200, description = "A new client certificate for the CSR's key.", body = RenewResponse),
        super::responses::JsonBodyRefusals,
    ),
)]
pub async fn renew(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<PeerCertificate>,
    Body(req): Body<RenewRequest>,
) -> Result<Json<RenewResponse>, ApiError> {
    let machine = authenticate(&app, &peer)?;
    let renewed = machine_service::renew(&app, machine, peer.0.as_deref(), req.csr_pem).await?;
    Ok(Json(renewed))
}

/// `GET /v1/machine/snapshots/{name}`: what the machine asked to save
/// etcd snapshot `name` needs: the cluster's snapshot key and where to
/// upload.
#[utoipa::path(
    get,
    path = "/v1/machine/snapshots/{name}",
    tag = "machine",
    security(("machineCertificate" = [])),
    params(("name" = String, Path, description = "The snapshot, as the directive named it.")),
    responses(
        (status = 200, description = "The grant.", body = drover_common::wire::SnapshotGrant),
        (status = 409, description = "The machine's cluster does not ask this snapshot of it (any more).", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 502, description = "The cluster's snapshot bucket failed (S3 answered an error or not at all).", body = drover_common::api::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn snapshot_grant(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<PeerCertificate>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Json<drover_common::wire::SnapshotGrant>, ApiError> {
    let grant = crate::store::blocking(move || {
        machine_service::snapshot_grant(&app, peer.0.as_deref(), &name)
    })
    .await?;
    Ok(Json(grant))
}

/// `PUT /v1/machine/snapshots/{name}/data`: the sealed snapshot, streamed
/// to the coordinator's disk; kept only whole and matching the
/// `Drover-Sealed-Sha256` header.
#[utoipa::path(
    put,
    path = "/v1/machine/snapshots/{name}/data",
    tag = "machine",
    security(("machineCertificate" = [])),
    params(
        ("name" = String, Path, description = "The snapshot, as the directive named it."),
        ("Drover-Sealed-Sha256" = Option<String>, Header, description = "SHA-256 (hex) of the sealed file; a body that does not match is discarded."),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The sealed snapshot (see `drover_common::snapshot`)."),
    responses(
        (status = 204, description = "Received whole."),
        (status = 400, description = "The body broke off before its end; nothing was kept.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The machine's cluster does not ask this snapshot of it (any more).", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 413, response = super::responses::PayloadTooLarge),
        (status = 422, description = "The body does not match the SHA-256 it was sent with; nothing was kept.", body = drover_common::api::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn snapshot_upload(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<PeerCertificate>,
    axum::extract::Path(name): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<StatusCode, ApiError> {
    let sha256 = headers
        .get(drover_common::wire::SEALED_SHA256_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    machine_service::snapshot_upload(&app, peer.0.clone(), name, sha256, body).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/machine/snapshots/{name}`: snapshot `name` was saved and
/// uploaded; the coordinator checks the sealed file against the report and
/// records it.
#[utoipa::path(
    post,
    path = "/v1/machine/snapshots/{name}",
    tag = "machine",
    security(("machineCertificate" = [])),
    params(("name" = String, Path, description = "The snapshot, as the directive named it.")),
    request_body = drover_common::wire::SnapshotSaved,
    responses(
        (status = 201, description = "Recorded.", body = drover_common::api::Snapshot),
        (status = 409, description = "The machine's cluster does not ask this snapshot of it (any more), or it was not uploaded.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 413, response = super::responses::PayloadTooLarge),
        (status = 415, response = super::responses::UnsupportedMediaType),
        (status = 422, description = "The report does not match the sealed file the coordinator holds.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 502, description = "The cluster's snapshot bucket failed (S3 answered an error or not at all).", body = drover_common::api::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn snapshot_saved(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<PeerCertificate>,
    axum::extract::Path(name): axum::extract::Path<String>,
    Body(saved): Body<drover_common::wire::SnapshotSaved>,
) -> Result<(StatusCode, Json<drover_common::api::Snapshot>), ApiError> {
    let snapshot = crate::store::blocking(move || {
        machine_service::snapshot_saved(&app, peer.0.as_deref(), &name, &saved)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(snapshot)))
}

/// `POST /v1/machine/inventory`: the inventory of a drill cluster's
/// restored control plane, which the drill cluster asked of this machine
/// (directive `TakeInventory`).
#[utoipa::path(
    post,
    path = "/v1/machine/inventory",
    tag = "machine",
    security(("machineCertificate" = [])),
    request_body = drover_common::wire::InventoryReport,
    responses(
        (status = 204, description = "Recorded."),
        (status = 409, description = "The machine's cluster does not ask this inventory of it (any more).", body = drover_common::api::Problem, content_type = "application/problem+json"),
        super::responses::JsonBodyRefusals,
    ),
)]
pub async fn inventory(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<PeerCertificate>,
    Body(report): Body<drover_common::wire::InventoryReport>,
) -> Result<StatusCode, ApiError> {
    let drill = crate::store::blocking(move || {
        machine_service::inventory(&app, peer.0.as_deref(), &report)
            .map(|drill| (drill, report.inventory.summary()))
    })
    .await?;
    tracing::info!(drill = %drill.0, inventory = %drill.1, "drill cluster inventory recorded");
    Ok(StatusCode::NO_CONTENT)
}

impl From<SnapshotCallError> for ApiError {
    fn from(e: SnapshotCallError) -> Self {
        let detail = e.to_string();
        match e {
            SnapshotCallError::NotAssigned { .. }
            | SnapshotCallError::NotAsked { .. }
            | SnapshotCallError::NotUploaded { .. } => ApiError::conflict(detail),
            SnapshotCallError::TooLarge { .. } => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "Snapshot too large", detail)
            }
            SnapshotCallError::Mismatch { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Snapshot does not match",
                detail,
            ),
            SnapshotCallError::Upload { .. } => ApiError::bad_request(detail),
            SnapshotCallError::Storage(_) => {
                ApiError::new(StatusCode::BAD_GATEWAY, "Snapshot storage failed", detail)
            }
            SnapshotCallError::Io { .. } | SnapshotCallError::Key { .. } => {
                ApiError::internal(detail)
            }
            SnapshotCallError::Store(e) => e.into(),
        }
    }
}

impl From<MachineCallError> for ApiError {
    fn from(e: MachineCallError) -> Self {
        let detail = e.to_string();
        match e {
            MachineCallError::Auth(AuthError::NotMachine) => ApiError::forbidden(detail),
            MachineCallError::Auth(_) => ApiError::unauthorized(detail),
            MachineCallError::Register(e) => match e {
                RegisterError::RateLimited { wait, .. } => {
                    let mut e = ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "Too many registrations",
                        detail,
                    );
                    e.retry_after = Some(wait);
                    e
                }
                RegisterError::InvalidFacts(_) => ApiError::bad_request(detail),
                RegisterError::Replayed { .. } => ApiError::conflict(detail),
                RegisterError::WrongInstance(_) => ApiError::forbidden(detail),
                RegisterError::InstanceUnchecked(_) => {
                    let mut e = ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "Instance check unavailable",
                        detail,
                    );
                    e.retry_after = Some(5);
                    e
                }
                RegisterError::Ticket(_)
                | RegisterError::OtherIncarnation { .. }
                | RegisterError::Deleting { .. }
                | RegisterError::MachineGone { .. }
                | RegisterError::ClusterGone { .. } => ApiError::unauthorized(detail),
            },
            MachineCallError::Renew(e) => match e {
                RenewError::Deleting { .. } => ApiError::forbidden(detail),
                RenewError::NoCertificate
                | RenewError::Revoked { .. }
                | RenewError::Superseded { .. } => ApiError::unauthorized(detail),
            },
            MachineCallError::Issue(IssueError::Csr(_)) => ApiError::bad_request(detail),
            MachineCallError::Issue(IssueError::Unreadable(_)) => ApiError::internal(detail),
            MachineCallError::Registration(e) => e.into(),
            MachineCallError::Bootstrap(e) => e.into(),
            MachineCallError::Store(e) => e.into(),
            MachineCallError::Deleted { .. } => ApiError::unauthorized(detail),
            MachineCallError::ConfigBusy { retry_after, .. } => {
                let mut e = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "Config fetch under way",
                    detail,
                );
                e.retry_after = Some(retry_after);
                e
            }
            MachineCallError::Encode(_) => ApiError::internal(detail),
            MachineCallError::Snapshot(e) => e.into(),
            MachineCallError::Inventory(e @ crate::drills::InventoryError::NotAsked { .. }) => {
                ApiError::conflict(e.to_string())
            }
            MachineCallError::Inventory(crate::drills::InventoryError::Store(e)) => e.into(),
        }
    }
}
