//! `ApiError`, the problem document every failure of the API is answered
//! with, and the mapping of domain and store errors onto it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use drover_common::api::{FieldError, Problem};

use crate::store::StoreError;

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
            e @ BootstrapError::VersionMismatch { .. } => ApiError::conflict(e.to_string()),
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
            // The store itself failed (etcd without quorum, a full disk):
            // the request may succeed later, once an operator acts.
            StoreError::Backend(_) => {
                tracing::error!(error = %e, "the store failed");
                let mut a = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Store unavailable",
                    format!(
                        "{e}; {}",
                        e.remedy().unwrap_or("retry once the store answers")
                    ),
                );
                a.retry_after = Some(5);
                a
            }
            StoreError::Corrupt { .. } | StoreError::Sealed(_) | StoreError::Contended { .. } => {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_store_answers_503_with_the_cause_and_what_to_do() {
        for (cause, remedy) in [
            // What SQLite says when the disk is full (SQLITE_FULL).
            ("database or disk is full", "free space"),
            (
                "etcd http://127.0.0.1:2379: list clusters: http://127.0.0.1:2379: Unavailable: etcdserver: no leader",
                "lost quorum",
            ),
        ] {
            let e = ApiError::from(StoreError::Backend(cause.into()));
            assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE, "{e:?}");
            assert_eq!(e.title, "Store unavailable");
            assert!(e.detail.contains(cause), "{e:?}");
            assert!(e.detail.contains(remedy), "{e:?}");
            assert!(e.retry_after.is_some());
        }
        // An object's own trouble is not the store's.
        let e = ApiError::from(StoreError::NotFound {
            kind: "clusters",
            name: "a".into(),
        });
        assert_eq!(e.status, StatusCode::NOT_FOUND);
    }
}
