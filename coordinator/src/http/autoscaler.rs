//! `POST /v1/clusters/{name}/autoscaler-credentials`: what the
//! cluster-autoscaler of one cluster needs to reach the coordinator's
//! `externalgrpc` service (`crate::grpc`): its address, a client
//! certificate for that cluster alone, and the CA to trust.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;

use drover_common::api::AutoscalerCredentials;

use super::admin::ObjectName;
use super::auth::Admin;
use super::error::ApiError;
use crate::app::App;

/// Mints a client certificate for the autoscaler of cluster `{name}`.
#[utoipa::path(
    post,
    path = "/v1/clusters/{name}/autoscaler-credentials",
    tag = "clusters",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The cluster's name.", example = "demo")),
    responses(
        (status = 200, description = "The service's address, a client certificate for this cluster's autoscaler and the CA.", body = AutoscalerCredentials),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
    ),
)]
pub async fn credentials(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
) -> Result<Json<AutoscalerCredentials>, ApiError> {
    admin.require_write()?;
    let address = app.settings.autoscaler_address.clone().ok_or_else(|| {
        ApiError::conflict(
            "this coordinator does not serve the autoscaler's externalgrpc service; start it with --autoscaler-listen ADDR",
        )
    })?;
    let cluster = crate::store::blocking({
        let app = app.clone();
        let name = name.clone();
        move || app.cluster(&name)
    })
    .await?
    .ok_or_else(|| ApiError::not_found("cluster", &name))?;
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    let issued = crate::domain::autoscaling::client_credentials(&app.keys.ca, &name, &uid)
        .map_err(ApiError::internal)?;
    tracing::info!(cluster = %name, by = %admin.token_id, "autoscaler credentials minted");
    Ok(Json(AutoscalerCredentials {
        address,
        cert_pem: issued.cert_pem,
        key_pem: issued.key_pem.unwrap_or_default(),
        ca_pem: app.keys.ca.cert_pem.clone(),
        expires_at: issued.not_after,
    }))
}
