//! Admin authentication: the bearer token of every admin request, checked
//! against the stored hashes in one place.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use crate::app::App;
use crate::domain::secrets::{hash_token, AdminRole, AdminTokens, ADMIN_TOKENS};
use crate::store::Kind;

use super::error::ApiError;

/// An authenticated admin caller.
#[derive(Debug, Clone)]
pub struct Admin {
    pub token_id: String,
    pub role: AdminRole,
}

impl Admin {
    /// How the audit log names this token's holder.
    pub fn audit_actor(&self) -> String {
        format!("admin-token:{} ({:?})", self.token_id, self.role).to_lowercase()
    }

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
    admin_for_hash(app, &hash_token(token.trim()))
}

/// The admin whose token hashes to `hash` (a web view session holds the
/// hash, never the token).
pub fn admin_for_hash(app: &App, hash: &str) -> Result<Admin, ApiError> {
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

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
