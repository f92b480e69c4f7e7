//! Admin API handlers: declarative clusters, machines, registration tokens,
//! kubeconfigs.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};
use drover_common::api::{Cluster, FieldError, KubeconfigResponse, Machine};
use drover_common::names::check_object_name;
use serde::{Deserialize, Serialize};

use super::auth::Admin;
use super::error::ApiError;
use super::paging::{self, ListQuery, Page};
use super::AuditChanges;
use crate::app::App;
use crate::store::Kind;
pub use crate::types::CoordinatorEntry;

/// A `{name}` path segment that is a valid object name (a DNS-1123
/// subdomain). Every route naming an object takes one, so a name such as
/// `../admintokens/x` (sent as `..%2Fadmintokens%2Fx`) is refused with a 400
/// naming the rule before the handler runs.
pub struct ObjectName(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ObjectName {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("the path is malformed: {e}")))?;
        check_object_name("the name in the path", &name)
            .map_err(|e| ApiError::bad_request(format!("{e}; nothing was read or changed")))?;
        Ok(Self(name))
    }
}

/// `GET /v1/clusters`: every cluster, or one page of them.
#[utoipa::path(
    get,
    path = "/v1/clusters",
    tag = "clusters",
    security(("adminToken" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "The clusters, by name: every one, or a page of at most `limit`.", body = Vec<Cluster>,
            headers(
                ("Link" = String, description = "With `limit`, when more follow: `<URL>; rel=\"next\"`, the next page."),
                ("Drover-Continue" = String, description = "With `limit`, when more follow: the next page's `continue` token."),
            ),
        ),
        (status = 400, response = super::responses::BadRequest),
    ),
)]
pub async fn list_clusters(
    State(app): State<Arc<App>>,
    admin: Admin,
    page: Page,
) -> Result<Response, ApiError> {
    let clusters = page.read(&app, App::clusters_page).await?;
    let clusters = clusters
        .into_iter()
        .map(|c| as_seen_by(&admin, c))
        .collect();
    Ok(paging::answer(
        "/v1/clusters",
        &page,
        clusters,
        |c: &Cluster| &c.metadata.name,
    ))
}

/// A cluster as `admin` may see it: a viewer sees the sizes and SHA-256
/// hashes of inline files, commands and addon manifests, not the text.
fn as_seen_by(admin: &Admin, cluster: Cluster) -> Cluster {
    match admin.role {
        crate::types::AdminRole::Admin => cluster,
        crate::types::AdminRole::Viewer => crate::domain::customise::for_viewer(cluster),
    }
}

/// `GET /v1/clusters/{name}`: one cluster.
#[utoipa::path(
    get,
    path = "/v1/clusters/{name}",
    tag = "clusters",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The cluster's name.", example = "demo")),
    responses(
        (status = 200, description = "The cluster.", body = Cluster),
        (status = 404, response = super::responses::NotFound),
    ),
)]
pub async fn get_cluster(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
) -> Result<Json<Cluster>, ApiError> {
    app.cluster(&name)?
        .map(|c| Json(as_seen_by(&admin, c)))
        .ok_or_else(|| ApiError::not_found("cluster", &name))
}

/// Parses a document of `kind` (a Cluster, a Secret), YAML or JSON by
/// content type, strictly.
pub(super) fn parse_document<T: serde::de::DeserializeOwned>(
    kind: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the document is not UTF-8 text"))?;
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let parsed = if is_json {
        serde_json::from_str::<T>(text).map_err(|e| e.to_string())
    } else {
        // One line in words for people, showing the line at fault (never
        // a Secret's: it may hold a value).
        serde_saphyr::from_str::<T>(text)
            .map_err(|e| crate::types::yaml_error(&e, (kind != "Secret").then_some(text), 1))
    };
    parsed.map_err(|e| {
        ApiError::invalid(
            format!("the {kind} document does not match the schema; nothing was changed"),
            vec![FieldError {
                field: "(document)".into(),
                message: e,
            }],
        )
    })
}

/// `PUT /v1/clusters/{name}`: create or update a cluster (what `drover apply` sends).
///
/// The document is YAML unless sent as `application/json`; it is parsed
/// strictly (unknown fields are errors) and validated as a whole. Its
/// `metadata.name` must be the URL's name; a `metadata.resourceVersion`
/// makes the update conditional on it. `status` and the other metadata the
/// coordinator sets are ignored.
#[utoipa::path(
    put,
    path = "/v1/clusters/{name}",
    tag = "clusters",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The cluster's name.", example = "demo")),
    request_body(
        description = "A Cluster document, YAML (what `drover apply -f` sends) or JSON.",
        content(
            (Cluster = "application/yaml", example = super::responses::example_cluster),
            (Cluster = "application/json", example = super::responses::example_cluster),
        ),
    ),
    responses(
        (status = 200, description = "The cluster was updated, or already matched the document.", body = Cluster),
        (status = 201, description = "The cluster was created.", body = Cluster),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
        (status = 413, response = super::responses::PayloadTooLarge),
        (status = 422, response = super::responses::Unprocessable),
    ),
)]
pub async fn apply_cluster(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
    headers: HeaderMap,
    super::body::RawBody(body): super::body::RawBody,
) -> Result<(StatusCode, Extension<AuditChanges>, Json<Cluster>), ApiError> {
    use super::cluster_write::{write_cluster, Creation, Decided, Write};
    admin.require_write()?;
    let desired = parse_document::<Cluster>("Cluster", &headers, &body)?;
    let said = super::cluster_write::Said::of_text(&body);
    let write = Write {
        name: &name,
        admin: &admin,
        creation: Creation::Allowed,
        dry_run: false,
        manager: Some(super::cluster_write::DROVER_MANAGER),
    };
    let (outcome, changes, cluster) = write_cluster(&app, &write, |current| {
        super::body::check_precondition(
            "cluster",
            &name,
            desired.metadata.resource_version.as_deref(),
            current.map(|c| c.metadata.resource_version.as_deref().unwrap_or("?")),
        )?;
        let mut cluster = desired.clone();
        cluster.metadata.managed_fields.clear();
        Ok(Decided {
            cluster,
            said: said.clone(),
        })
    })?;
    Ok((outcome.status(), Extension(changes), Json(cluster)))
}

/// `DELETE /v1/clusters/{name}`: marks the cluster for deletion; the
/// reconciler releases its machines, then removes it.
#[utoipa::path(
    delete,
    path = "/v1/clusters/{name}",
    tag = "clusters",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The cluster's name.", example = "demo")),
    responses(
        (status = 202, description = "Deletion was requested (or already under way); the cluster as marked.", body = Cluster),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
    ),
)]
pub async fn delete_cluster(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
) -> Result<(StatusCode, Json<Cluster>), ApiError> {
    admin.require_write()?;
    let c = crate::store::blocking({
        let app = app.clone();
        move || super::cluster_write::request_deletion(&app, &name, &admin, false, |_| Ok(()))
    })
    .await?;
    Ok((StatusCode::ACCEPTED, Json(c)))
}

/// What a coordinator reports about itself.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoordinatorStatus {
    /// The coordinator's version.
    pub version: String,
    /// This replica.
    pub replica: crate::types::ReplicaInfo,
    /// Whether this replica leads (runs the loops, answers machines).
    pub leader: bool,
    /// The leader's URL, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_url: Option<String>,
    /// Every background task: its period, runs, last error and next run.
    pub tasks: Vec<crate::types::TaskStatus>,
    /// Its API server's connections and TLS handshakes.
    pub connections: crate::http::server::ConnectionStats,
}

/// `GET /v1/status`: the coordinator's version and its background loops.
#[utoipa::path(
    get,
    path = "/v1/status",
    tag = "coordinator",
    security(("adminToken" = [])),
    responses(
        (status = 200, description = "The coordinator and its loops.", body = CoordinatorStatus),
    ),
)]
pub async fn status(State(app): State<Arc<App>>, _admin: Admin) -> Json<CoordinatorStatus> {
    let mut tasks = app.tasks.statuses();
    if let Some(r) = tasks
        .iter_mut()
        .find(|t| t.name == crate::tasks::RECONCILER_TASK)
    {
        r.object_errors = app.fleet.controller.errors();
    }
    Json(CoordinatorStatus {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        replica: app.leadership.me.clone(),
        leader: matches!(
            app.leadership.role(),
            crate::domain::leadership::Role::Leader { .. }
        ),
        leader_url: app.leadership.leader_url(),
        tasks,
        connections: crate::http::server::connection_stats(),
    })
}

/// `GET /v1/coordinators`: every coordinator replica sharing this store,
/// and which one leads.
#[utoipa::path(
    get,
    path = "/v1/coordinators",
    tag = "coordinator",
    security(("adminToken" = [])),
    responses(
        (status = 200, description = "The replicas, by id.", body = Vec<CoordinatorEntry>),
    ),
)]
pub async fn coordinators(
    State(app): State<Arc<App>>,
    _admin: Admin,
) -> Result<Json<Vec<CoordinatorEntry>>, ApiError> {
    Ok(Json(
        crate::leader::replicas(&app)
            .await?
            .into_iter()
            .map(|(replica, leader)| CoordinatorEntry { replica, leader })
            .collect(),
    ))
}

/// `GET /v1/machines`: every machine, or one page of them.
#[utoipa::path(
    get,
    path = "/v1/machines",
    tag = "machines",
    security(("adminToken" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "The machines, by name: every one, or a page of at most `limit`.", body = Vec<Machine>,
            headers(
                ("Link" = String, description = "With `limit`, when more follow: `<URL>; rel=\"next\"`, the next page."),
                ("Drover-Continue" = String, description = "With `limit`, when more follow: the next page's `continue` token."),
            ),
        ),
        (status = 400, response = super::responses::BadRequest),
    ),
)]
pub async fn list_machines(
    State(app): State<Arc<App>>,
    _admin: Admin,
    page: Page,
) -> Result<Response, ApiError> {
    let machines = page.read(&app, App::machines_page).await?;
    Ok(paging::answer(
        "/v1/machines",
        &page,
        machines,
        |m: &Machine| &m.metadata.name,
    ))
}

/// `GET /v1/machines/{name}`: one machine.
#[utoipa::path(
    get,
    path = "/v1/machines/{name}",
    tag = "machines",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The machine's name.", example = "default-a1b2c3")),
    responses(
        (status = 200, description = "The machine.", body = Machine),
        (status = 404, response = super::responses::NotFound),
    ),
)]
pub async fn get_machine(
    State(app): State<Arc<App>>,
    _admin: Admin,
    ObjectName(name): ObjectName,
) -> Result<Json<Machine>, ApiError> {
    app.machine(&name)?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("machine", &name))
}

/// `DELETE /v1/machines/{name}`: takes a machine out.
///
/// A machine that serves no cluster is deregistered at once (200). A member
/// of a cluster is marked (202) and leaves through the reconciler's safe
/// path: a provider machine is replaced and then deleted, a pool machine is
/// released (its agent runs `kubeadm reset`) and a free matching machine is
/// claimed in its place; control-plane machines one at a time. Refused (409)
/// when the cluster would lose its last control plane or etcd quorum.
#[utoipa::path(
    delete,
    path = "/v1/machines/{name}",
    tag = "machines",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The machine's name.", example = "default-a1b2c3")),
    responses(
        (status = 200, description = "The machine served no cluster and is deregistered; its record as it was.", body = Machine),
        (status = 202, description = "The machine leaves its cluster through the safe path; the machine as marked.", body = Machine),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
    ),
)]
pub async fn delete_machine(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
) -> Result<(StatusCode, Json<Machine>), ApiError> {
    admin.require_write()?;
    let by = admin.token_id.clone();
    let answer = crate::store::blocking({
        let app = app.clone();
        let name = name.clone();
        move || request_removal(&app, &name, &by, false, |_| Ok(()))
    })
    .await?;
    app.reconcile_machine(&name);
    Ok((answer.0, Json(answer.1)))
}

/// Checks and records a removal request, once `check` accepts the
/// machine; for a dry run, only checks it (blocking: it reads and writes
/// the store).
pub(super) fn request_removal(
    app: &App,
    name: &str,
    by: &str,
    dry_run: bool,
    check: impl Fn(&Machine) -> Result<(), ApiError>,
) -> Result<(StatusCode, Machine), ApiError> {
    use crate::domain::removal::{check_removal, Removal};
    let machine = app
        .machine(name)?
        .ok_or_else(|| ApiError::not_found("machine", name))?;
    check(&machine)?;
    let all = app.machines()?;
    let removal = check_removal(&machine, &all).map_err(|e| ApiError::conflict(e.to_string()))?;
    if dry_run {
        let status = match removal {
            Removal::Deregister => StatusCode::OK,
            Removal::AlreadyLeaving | Removal::Mark => StatusCode::ACCEPTED,
        };
        return Ok((status, machine));
    }
    match removal {
        Removal::Deregister => {
            let rev = machine
                .metadata
                .resource_version
                .as_ref()
                .and_then(|r| r.parse().ok());
            app.store.delete(Kind::Machine, name, rev)?;
            app.fleet.datagrams.forget(&machine);
            tracing::info!(machine = %name, by, "free machine deregistered");
            Ok((StatusCode::OK, machine))
        }
        Removal::AlreadyLeaving => Ok((StatusCode::ACCEPTED, machine)),
        Removal::Mark => {
            let marked = app
                .update_machine::<ApiError>(name, |m| {
                    check(m)?;
                    if m.metadata.deletion_timestamp.is_some() {
                        return Ok(false);
                    }
                    m.metadata.deletion_timestamp = Some(drover_common::now());
                    drover_common::api::push_event(
                        &mut m.status.events,
                        "DeletionRequested",
                        format!("deletion requested by admin token {by}; the machine leaves its cluster through the safe path"),
                    );
                    Ok(true)
                })?
                .ok_or_else(|| ApiError::not_found("machine", name))?;
            tracing::info!(machine = %name, by, "machine deletion requested");
            Ok((StatusCode::ACCEPTED, marked))
        }
    }
}

/// Read-modify-write of machine `name` off the async workers (the store
/// is synchronous), as [`App::update_machine`]; 404 when it does not exist.
pub(super) async fn change_machine(
    app: &Arc<App>,
    name: &str,
    change: impl FnMut(&mut Machine) -> Result<bool, ApiError> + Send + 'static,
) -> Result<Machine, ApiError> {
    let (app, owned) = (app.clone(), name.to_owned());
    crate::store::blocking(move || app.update_machine::<ApiError>(&owned, change))
        .await?
        .ok_or_else(|| ApiError::not_found("machine", name))
}

/// `POST /v1/machines/{name}/revoke`: revokes the machine's identity.
///
/// Every certificate of the machine is refused from its next request on
/// (heartbeat, config, renewal), on every replica; the machine needs a new
/// ticket to come back. The machine record stays, so its cluster sees it go
/// silent and replaces it as its health policy says. Revoking twice changes
/// nothing more.
#[utoipa::path(
    post,
    path = "/v1/machines/{name}/revoke",
    tag = "machines",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The machine's name.", example = "default-a1b2c3")),
    responses(
        (status = 200, description = "The machine, its identity revoked.", body = Machine),
        (status = 404, response = super::responses::NotFound),
    ),
)]
pub async fn revoke_machine(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
) -> Result<Json<Machine>, ApiError> {
    admin.require_write()?;
    let by = admin.token_id.clone();
    let revoked = change_machine(&app, &name, move |m| {
        if m.status.identity_revoked_at.is_some() {
            return Ok(false);
        }
        m.status.identity_revoked_at = Some(drover_common::now());
        drover_common::api::push_event(
            &mut m.status.events,
            "IdentityRevoked",
            format!(
                "identity revoked by admin token {by}: every certificate of the machine is refused"
            ),
        );
        Ok(true)
    })
    .await?;
    tracing::warn!(machine = %name, by = %admin.token_id, "machine identity revoked");
    app.reconcile_machine(&name);
    Ok(Json(revoked))
}

/// `POST /v1/clusters/{name}/rollout/resume`: resumes a halted rollout.
///
/// Clears the halt the cluster's status records; the reconciler then takes
/// the rollout's next step (a new machine in place of the one that
/// failed). A rollout that is not halted is left as it is.
#[utoipa::path(
    post,
    path = "/v1/clusters/{name}/rollout/resume",
    tag = "clusters",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The cluster's name.", example = "demo")),
    responses(
        (status = 200, description = "The cluster, its rollout no longer halted.", body = Cluster),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
    ),
)]
pub async fn resume_rollout(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
) -> Result<Json<Cluster>, ApiError> {
    admin.require_write()?;
    let resumed = crate::store::blocking({
        let (app, name) = (app.clone(), name.clone());
        move || {
            app.update_cluster::<ApiError>(&name, |c| {
                let Some(r) = c.status.rollout.as_mut() else {
                    return Err(ApiError::conflict(format!(
                        "cluster {} has no rollout under way: every machine is at its version and image",
                        c.metadata.name
                    )));
                };
                Ok(r.halted.take().is_some())
            })
        }
    })
    .await?
    .ok_or_else(|| ApiError::not_found("cluster", &name))?;
    tracing::info!(cluster = %name, by = %admin.token_id, "rollout resumed");
    app.reconcile_cluster(&name);
    Ok(Json(resumed))
}

/// The request of `POST /v1/clusters/{name}/kubeconfig`.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeconfigRequest {
    #[serde(default = "default_kubeconfig_ttl")]
    pub ttl_seconds: u64,
}

fn default_kubeconfig_ttl() -> u64 {
    3600
}

/// Mints an admin kubeconfig with a short-lived client certificate signed by
/// the cluster CA.
///
/// The body is optional; without one (and without a `Content-Type`) the
/// certificate lives an hour.
#[utoipa::path(
    post,
    path = "/v1/clusters/{name}/kubeconfig",
    tag = "clusters",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The cluster's name.", example = "demo")),
    request_body(
        content = Option<KubeconfigRequest>,
        example = json!({"ttlSeconds": 3600}),
    ),
    responses(
        (status = 200, description = "An admin kubeconfig with a client certificate signed by the cluster CA.", body = KubeconfigResponse),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
        super::responses::JsonBodyRefusals,
    ),
)]
pub async fn kubeconfig(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
    body: Result<Option<Json<KubeconfigRequest>>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<KubeconfigResponse>, ApiError> {
    admin.require_write()?;
    // An unusable body is refused with a problem document, like every other.
    let body = body.map_err(|rejection| {
        let status = rejection.status();
        let title = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "Request body too large"
        } else {
            "Malformed request body"
        };
        ApiError::new(status, title, rejection.body_text())
    })?;
    let ttl = body.map(|b| b.0.ttl_seconds).unwrap_or(3600);
    if ttl == 0 || ttl > 24 * 3600 {
        return Err(ApiError::bad_request(
            "ttlSeconds must be between 1 and 86400",
        ));
    }
    let cluster = app
        .cluster(&name)?
        .ok_or_else(|| ApiError::not_found("cluster", &name))?;
    let endpoint = cluster.status.control_plane_endpoint.clone().ok_or_else(|| {
        ApiError::conflict(format!(
            "cluster {name} has no control-plane endpoint yet; wait until its first control-plane machine is assigned"
        ))
    })?;
    let pki = crate::domain::secrets::load_pki(&app.store, &cluster)?.ok_or_else(|| {
        ApiError::conflict(format!(
            "cluster {name} has no PKI yet; wait for the reconciler"
        ))
    })?;
    let kc = crate::domain::kubeconfig::admin_kubeconfig(
        &name,
        &endpoint,
        &pki.ca.ca(),
        ttl,
        &admin.token_id,
    )
    .map_err(ApiError::internal)?;
    tracing::info!(cluster = %name, by = %admin.token_id, ttl, "admin kubeconfig issued");
    Ok(Json(kc))
}
