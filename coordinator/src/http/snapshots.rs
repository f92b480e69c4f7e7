//! Clusters' etcd snapshots in the admin API: asking for one now, and
//! listing those saved.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use drover_common::api::{Cluster, Snapshot};
use serde::Deserialize;

use axum::response::{IntoResponse, Response};

use super::admin::ObjectName;
use super::auth::Admin;
use super::error::ApiError;
use super::paging::{self, ListQuery};
use crate::app::App;

/// `POST /v1/clusters/{name}/snapshots`: asks for an etcd snapshot of the
/// cluster now (`drover backup cluster`).
///
/// The reconciler asks it of a running control plane; the cluster's
/// `status.snapshot` names it, then `status.lastSnapshot` once saved (or
/// `status.snapshot.error` and the `SnapshotsCurrent` condition if it
/// failed). A snapshot already asked for or under way is the answer to a
/// second request.
#[utoipa::path(
    post,
    path = "/v1/clusters/{name}/snapshots",
    tag = "clusters",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The cluster's name.", example = "demo")),
    responses(
        (status = 202, description = "Asked for; the cluster as it stands.", body = Cluster),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
    ),
)]
pub async fn request_snapshot(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
) -> Result<(StatusCode, Json<Cluster>), ApiError> {
    admin.require_write()?;
    let cluster = crate::store::blocking({
        let (app, name) = (app.clone(), name.clone());
        move || {
            app.update_cluster::<ApiError>(&name, |c| {
                if c.metadata.deletion_timestamp.is_some() {
                    return Err(ApiError::conflict(format!(
                        "cluster {name} is being deleted; no snapshot is taken"
                    )));
                }
                if !c.status.initialized {
                    return Err(ApiError::conflict(format!(
                        "cluster {name} has not run kubeadm init yet: its etcd holds nothing to snapshot; ask again once it is Running"
                    )));
                }
                let pending = c.status.snapshot_requested_at.is_some()
                    || c.status.snapshot.as_ref().is_some_and(|s| s.under_way());
                if pending {
                    return Ok(false);
                }
                c.status.snapshot_requested_at = Some(drover_common::now());
                Ok(true)
            })
        }
    })
    .await?
    .ok_or_else(|| ApiError::not_found("cluster", &name))?;
    tracing::info!(cluster = %name, by = %admin.token_id, "etcd snapshot requested");
    app.reconcile_cluster(&name);
    Ok((StatusCode::ACCEPTED, Json(cluster)))
}

/// `GET /v1/snapshots`'s query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SnapshotQuery {
    /// Only this cluster's snapshots, oldest first, in one answer (as many
    /// as its retention keeps).
    pub cluster: Option<String>,
    /// Without `cluster`: the most snapshots to return, 1 to 10,000;
    /// absent or 0: every one. When more follow, the answer names the next
    /// page (`Link` and `Drover-Continue` headers).
    pub limit: Option<usize>,
    /// Without `cluster`: the token of the page to return, from the
    /// previous page's `Drover-Continue` header.
    #[serde(rename = "continue")]
    #[param(rename = "continue")]
    pub continue_: Option<String>,
}

/// `GET /v1/snapshots`: the etcd snapshots saved: one cluster's, oldest
/// first, or every cluster's by name (`<cluster>-<time>`, so each
/// cluster's oldest first), all or one page at a time.
#[utoipa::path(
    get,
    path = "/v1/snapshots",
    tag = "clusters",
    security(("adminToken" = [])),
    params(SnapshotQuery),
    responses(
        (status = 200, description = "The snapshots: one cluster's, or every one or a page of at most `limit`.", body = Vec<Snapshot>,
            headers(
                ("Link" = String, description = "With `limit`, when more follow: `<URL>; rel=\"next\"`, the next page."),
                ("Drover-Continue" = String, description = "With `limit`, when more follow: the next page's `continue` token."),
            ),
        ),
        (status = 400, response = super::responses::BadRequest),
        (status = 404, response = super::responses::NotFound),
    ),
)]
pub async fn list_snapshots(
    State(app): State<Arc<App>>,
    _admin: Admin,
    query: Result<Query<SnapshotQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::bad_request(format!(
            "{}; the parameters are cluster=NAME, or limit=N and continue=TOKEN",
            e.body_text()
        ))
    })?;
    let Some(name) = query.cluster else {
        let page = ListQuery {
            limit: query.limit,
            continue_: query.continue_,
        }
        .page()?;
        let snapshots = page.read(&app, App::snapshots_page).await?;
        return Ok(paging::answer(
            "/v1/snapshots",
            &page,
            snapshots,
            |s: &Snapshot| &s.metadata.name,
        ));
    };
    if query.limit.is_some() || query.continue_.is_some() {
        return Err(ApiError::bad_request(format!(
            "limit and continue page the list of every cluster's snapshots; cluster={name} lists that cluster's (as many as its retention keeps) in one answer"
        )));
    }
    drover_common::names::check_dns_label("cluster name", &name)
        .map_err(|e| ApiError::bad_request(format!("cluster={name:?}: {e}")))?;
    let snapshots = crate::store::blocking(move || -> Result<Vec<Snapshot>, ApiError> {
        let cluster = app
            .cluster(&name)?
            .ok_or_else(|| ApiError::not_found("cluster", &name))?;
        let uid = cluster.metadata.uid.unwrap_or_default();
        Ok(crate::snapshots::snapshots_of(&app, &name, &uid)?)
    })
    .await?;
    Ok(Json(snapshots).into_response())
}
