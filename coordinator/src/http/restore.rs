//! Restoring a cluster's etcd from a snapshot in the admin API (`drover
//! restore cluster`), and the sealed snapshot the restoring init machine
//! fetches. The checks and the record are `crate::cluster_restore`'s.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};
use drover_common::api::{Cluster, DrillTrigger, RestoreRequest};

use super::admin::ObjectName;
use super::auth::Admin;
use super::body::Body;
use super::error::ApiError;
use crate::app::App;
use crate::cluster_restore::{self, RestoreError};
use crate::http::server::PeerCertificate;

impl From<RestoreError> for ApiError {
    fn from(e: RestoreError) -> Self {
        match e {
            RestoreError::NotFound { kind, name } => ApiError::not_found(kind, &name),
            RestoreError::Refused(detail) => ApiError::conflict(detail),
            e @ RestoreError::Unusable { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Snapshot cannot be restored",
                e.to_string(),
            ),
            RestoreError::Snapshot(e) => e.into(),
            RestoreError::Store(e) => e.into(),
        }
    }
}

/// `POST /v1/clusters/{name}/restore`: restores the cluster's etcd from one
/// of its snapshots (`drover restore cluster`).
///
/// Every check is made before anything changes: the snapshot (the newest
/// unless named) must be this cluster's, not newer than its version, and
/// open whole with its key; no control plane may be healthy unless
/// `force`. Then the reconciler removes the old control planes, creates an
/// init machine that restores the snapshot before `kubeadm init`, and
/// joins the others as usual; `status.restore` says how far it is, then
/// `status.lastRestore`. Asking again for the restore under way answers
/// it.
///
/// With `into`, a restore drill instead: the snapshot (checked the same
/// way) is restored into a new cluster of that name, with one control
/// plane and a copy of this cluster's CAs, which is inventoried once its
/// API answers and then deleted; this cluster is not touched but for its
/// status (`status.drill`, then `status.lastDrill` and the `RestoreDrill`
/// condition). The answer is this cluster.
#[utoipa::path(
    post,
    path = "/v1/clusters/{name}/restore",
    tag = "clusters",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The cluster's name.", example = "demo")),
    request_body = RestoreRequest,
    responses(
        (status = 202, description = "Started (or under way); the cluster as it stands.", body = Cluster),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
        (status = 413, response = super::responses::PayloadTooLarge),
        (status = 415, response = super::responses::UnsupportedMediaType),
        (status = 422, description = "The snapshot cannot be restored (corrupt, cut, another cluster's, newer than the cluster's version); nothing changed.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 502, description = "The cluster's snapshot bucket failed (S3 answered an error or not at all).", body = drover_common::api::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn restore_cluster(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
    Body(req): Body<RestoreRequest>,
) -> Result<(StatusCode, Json<Cluster>), ApiError> {
    admin.require_write()?;
    let by = admin.token_id.clone();
    let drill = req.into.clone();
    let cluster = crate::store::blocking({
        let (app, name) = (app.clone(), name.clone());
        move || {
            match req.into {
                Some(_) => crate::drills::start(&app, &name, &req, &by, DrillTrigger::Manual),
                None => cluster_restore::request(&app, &name, &req, &by),
            }
            .map_err(ApiError::from)
        }
    })
    .await?;
    if drill.is_some() {
        return Ok((StatusCode::ACCEPTED, Json(cluster)));
    }
    if let Some(r) = &cluster.status.restore {
        tracing::info!(cluster = %name, snapshot = %r.snapshot, revision = r.revision, forced = r.forced, by = %admin.token_id, "etcd restore requested");
    }
    app.reconcile_cluster(&name);
    Ok((StatusCode::ACCEPTED, Json(cluster)))
}

/// `GET /v1/machine/snapshots/{name}/data`: the sealed snapshot, for the
/// init machine of the cluster being restored from it (and no other).
#[utoipa::path(
    get,
    path = "/v1/machine/snapshots/{name}/data",
    tag = "machine",
    security(("machineCertificate" = [])),
    params(("name" = String, Path, description = "The snapshot the machine's bundle names.")),
    responses(
        (status = 200, description = "The sealed snapshot (see `drover_common::snapshot`).", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 409, description = "The machine does not restore this snapshot, or this coordinator does not hold its file.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 502, description = "The cluster's snapshot bucket failed (S3 answered an error or not at all).", body = drover_common::api::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn snapshot_download(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<PeerCertificate>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let (path, machine) = crate::store::blocking(move || {
        let machine = crate::machine_service::authenticate(&app, peer.0.as_deref())?;
        let path = cluster_restore::file_for(&app, &machine, &name)?;
        Ok::<_, ApiError>((path, machine.metadata.name))
    })
    .await?;
    let file = tokio::fs::File::open(&path).await.map_err(|e| {
        ApiError::conflict(format!(
            "this coordinator does not hold the sealed file {} ({e}); in an HA installation snapshots are kept on the replica that received them",
            path.display()
        ))
    })?;
    let len = file.metadata().await.map_err(ApiError::internal)?.len();
    tracing::info!(%machine, path = %path.display(), bytes = len, "sealed snapshot sent for a restore");
    let stream = tokio_util::io::ReaderStream::new(file);
    let mut response = Response::new(axum::body::Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    Ok(response)
}
