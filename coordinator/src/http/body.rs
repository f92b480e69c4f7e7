//! Request body extractors whose rejections (too large, unreadable, late)
//! are problem documents.

use axum::http::StatusCode;

use super::error::ApiError;

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

/// Refuses a document whose `metadata.name` is not the URL's `name`.
pub(super) fn check_document_name(document_name: &str, name: &str) -> Result<(), ApiError> {
    if document_name != name {
        return Err(ApiError::bad_request(format!(
            "metadata.name {document_name:?} does not match the URL's name {name:?}"
        )));
    }
    Ok(())
}

/// Refuses a document whose `metadata.resourceVersion` (`rv`) is not the
/// stored `kind` object `name`'s (`found`; `None`: there is none). A
/// document without one is unconditional.
pub(super) fn check_precondition(
    kind: &str,
    name: &str,
    rv: Option<&str>,
    found: Option<&str>,
) -> Result<(), ApiError> {
    let Some(rv) = rv else { return Ok(()) };
    match found {
        None => Err(ApiError::not_found(kind, name)),
        Some(found) if found != rv => Err(ApiError::conflict(format!(
            "{kind} {name} has resourceVersion {found}, the document says {rv}; fetch it again and reapply"
        ))),
        Some(_) => Ok(()),
    }
}
