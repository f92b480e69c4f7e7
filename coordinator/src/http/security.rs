//! Admin tokens, encryption keys and the audit log.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::Admin;
use super::body::Body;
use super::error::ApiError;
use crate::app::App;
use crate::domain::secrets::{new_admin_token, AdminRole, AdminTokens, ADMIN_TOKENS};
use crate::store::{Kind, Modify};
pub use crate::types::{AdminTokenInfo, CreatedAdminToken, KeysInfo};

/// `POST /v1/admintokens`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateAdminToken {
    pub role: AdminRole,
}

fn modify_tokens(
    app: &App,
    mut change: impl FnMut(&mut AdminTokens) -> Result<(), ApiError>,
) -> Result<(), ApiError> {
    app.store
        .modify_json(Kind::Secret, ADMIN_TOKENS, |tokens: Option<AdminTokens>| {
            let mut tokens =
                tokens.ok_or_else(|| ApiError::internal("the admin token list is missing"))?;
            change(&mut tokens)?;
            Ok(Modify::Write(tokens, ()))
        })
}

/// `POST /v1/admintokens`: a new admin token; its secret is shown only here.
#[utoipa::path(
    post,
    path = "/v1/admintokens",
    tag = "security",
    security(("adminToken" = [])),
    request_body(content = CreateAdminToken, example = json!({"role": "viewer"})),
    responses(
        (status = 201, description = "The token, with its secret (shown once).", body = CreatedAdminToken),
        (status = 409, response = super::responses::Conflict),
        super::responses::JsonBodyRefusals,
    ),
)]
pub async fn create_admin_token(
    State(app): State<Arc<App>>,
    admin: Admin,
    Body(req): Body<CreateAdminToken>,
) -> Result<(StatusCode, Json<CreatedAdminToken>), ApiError> {
    admin.require_write()?;
    let (token, record) = new_admin_token(req.role);
    let id = record.id.clone();
    modify_tokens(&app, |t| {
        t.tokens.push(record.clone());
        Ok(())
    })?;
    tracing::info!(token = %id, role = ?req.role, by = %admin.token_id, "admin token created");
    Ok((
        StatusCode::CREATED,
        Json(CreatedAdminToken {
            id,
            role: req.role,
            token,
        }),
    ))
}

/// `GET /v1/admintokens`: every admin token, never a secret.
#[utoipa::path(
    get,
    path = "/v1/admintokens",
    tag = "security",
    security(("adminToken" = [])),
    responses(
        (status = 200, description = "Every admin token.", body = Vec<AdminTokenInfo>),
        (status = 403, response = super::responses::Forbidden),
    ),
)]
pub async fn list_admin_tokens(
    State(app): State<Arc<App>>,
    admin: Admin,
) -> Result<Json<Vec<AdminTokenInfo>>, ApiError> {
    admin.require_write()?;
    let tokens = app
        .store
        .get_json::<AdminTokens>(Kind::Secret, ADMIN_TOKENS)?
        .map(|(t, _)| t)
        .unwrap_or_default();
    Ok(Json(
        tokens
            .tokens
            .into_iter()
            .map(|t| AdminTokenInfo {
                id: t.id,
                role: t.role,
                created_at: t.created_at,
            })
            .collect(),
    ))
}

/// `DELETE /v1/admintokens/{id}`: revokes an admin token; the last one with
/// the admin role cannot be revoked.
#[utoipa::path(
    delete,
    path = "/v1/admintokens/{id}",
    tag = "security",
    security(("adminToken" = [])),
    params(("id" = String, Path, description = "The token's id (8 hex digits).", example = "0a1b2c3d")),
    responses(
        (status = 204, description = "Revoked."),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
    ),
)]
pub async fn revoke_admin_token(
    State(app): State<Arc<App>>,
    admin: Admin,
    super::admin::ObjectName(id): super::admin::ObjectName,
) -> Result<StatusCode, ApiError> {
    admin.require_write()?;
    modify_tokens(&app, |t| {
        let Some(pos) = t.tokens.iter().position(|r| r.id == id) else {
            return Err(ApiError::not_found("admin token", &id));
        };
        let admins = t
            .tokens
            .iter()
            .filter(|r| r.role == AdminRole::Admin)
            .count();
        if t.tokens[pos].role == AdminRole::Admin && admins == 1 {
            return Err(ApiError::conflict(format!(
                "admin token {id} is the last one with the admin role; create another before revoking it"
            )));
        }
        t.tokens.remove(pos);
        Ok(())
    })?;
    tracing::info!(token = %id, by = %admin.token_id, "admin token revoked");
    Ok(StatusCode::NO_CONTENT)
}

/// The keyring of a store that encrypts secrets, for an admin who may write.
fn keyring<'a>(
    app: &'a App,
    admin: &Admin,
) -> Result<&'a Arc<std::sync::RwLock<crate::store::keyring::Keyring>>, ApiError> {
    admin.require_write()?;
    app.store
        .keyring()
        .ok_or_else(|| ApiError::internal("this store does not encrypt"))
}

/// `GET /v1/keys`: the ids of the keys that encrypt secrets at rest.
#[utoipa::path(
    get,
    path = "/v1/keys",
    tag = "security",
    security(("adminToken" = [])),
    responses(
        (status = 200, description = "The key that encrypts, then older keys still accepted.", body = KeysInfo),
        (status = 403, response = super::responses::Forbidden),
    ),
)]
pub async fn list_keys(
    State(app): State<Arc<App>>,
    admin: Admin,
) -> Result<Json<KeysInfo>, ApiError> {
    Ok(Json(KeysInfo {
        key_ids: keyring(&app, &admin)?.read().expect("keyring lock").ids(),
        resealed: 0,
    }))
}

/// `POST /v1/keys/rotate`: a new key encrypts from now on, every secret is
/// re-encrypted with it while the old key still opens them, then the old
/// key is dropped from the keyring file. Requests keep being served.
#[utoipa::path(
    post,
    path = "/v1/keys/rotate",
    tag = "security",
    security(("adminToken" = [])),
    responses(
        (status = 200, description = "The keys after rotation and how many records were re-encrypted.", body = KeysInfo),
        (status = 409, response = super::responses::Conflict),
    ),
)]
pub async fn rotate_keys(
    State(app): State<Arc<App>>,
    admin: Admin,
) -> Result<Json<KeysInfo>, ApiError> {
    let ring = keyring(&app, &admin)?.clone();
    let app2 = app.clone();
    let by = admin.token_id.clone();
    let result = tokio::task::spawn_blocking(move || -> Result<KeysInfo, ApiError> {
        let _rotation = app2.keys.rotation.lock().expect("rotation lock");
        let previous = {
            let mut r = ring.write().expect("keyring lock");
            let previous = r.clone();
            r.push_primary(crate::store::keyring::Key::generate());
            if let Err(e) = r.save() {
                *r = previous;
                return Err(ApiError::conflict(e.to_string()));
            }
            previous
        };
        // Re-seal until a pass finds nothing left under an old key: a write
        // that sealed just before the switch is caught by the next pass.
        let mut total = 0;
        for _ in 0..5 {
            let n = app2.store.reseal_all()?;
            total += n;
            if n == 0 {
                break;
            }
        }
        let mut r = ring.write().expect("keyring lock");
        r.retire_old();
        r.save().map_err(|e| ApiError::internal(e.to_string()))?;
        tracing::info!(
            from = previous.primary_id(),
            to = r.primary_id(),
            resealed = total,
            %by,
            "encryption key rotated"
        );
        Ok(KeysInfo {
            key_ids: r.ids(),
            resealed: total,
        })
    })
    .await
    .map_err(ApiError::internal)??;
    Ok(Json(result))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// How many of the newest entries to return (default 100, at most 10000).
    #[serde(default = "default_limit")]
    pub limit: usize,
}

fn default_limit() -> usize {
    100
}

/// `GET /v1/audit`: the newest audit log entries, oldest first.
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "security",
    security(("adminToken" = [])),
    params(AuditQuery),
    responses(
        (status = 200, description = "The last `limit` audit entries (at most 10000).", body = Vec<crate::domain::audit::AuditEntry>),
        (status = 400, response = super::responses::BadRequest),
        (status = 403, response = super::responses::Forbidden),
    ),
)]
pub async fn read_audit(
    State(app): State<Arc<App>>,
    admin: Admin,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<crate::domain::audit::AuditEntry>>, ApiError> {
    admin.require_write()?;
    // A malformed query is refused with a problem document, like every other.
    let Query(q) = query.map_err(|rejection| ApiError::bad_request(rejection.body_text()))?;
    // File reads: off the async workers.
    let entries = tokio::task::spawn_blocking(move || app.audit.tail(q.limit.min(10_000)))
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)?;
    Ok(Json(entries))
}
