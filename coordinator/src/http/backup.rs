//! `POST /v1/backup`: a backup of the coordinator's whole store, taken
//! while it serves (see [`crate::store::backup`]). A POST, so the audit
//! log records who took one: it holds every sealed secret, token hash and
//! cluster CA, though never the key that opens them.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderName, HeaderValue};
use axum::response::Response;

use super::auth::Admin;
use super::error::ApiError;
use crate::app::App;

/// The response header with the store revision a backup was taken at.
pub const REVISION_HEADER: &str = "drover-backup-revision";
/// The response header with a backup's object counts (`clusters=3,...`).
pub const OBJECTS_HEADER: &str = "drover-backup-objects";

/// `POST /v1/backup`: every object of the store at one revision, as a
/// SQLite database in the embedded store's schema.
///
/// Taken while the coordinator keeps serving (SQLite: `VACUUM INTO` from a
/// read transaction of its own; etcd: one range read at one revision),
/// staged in the coordinator's temporary directory (`$TMPDIR`) and
/// streamed. Restore it with `drover store restore --from FILE --data-dir
/// DIR` on a stopped or new host, with the encryption key the backup does
/// not hold.
#[utoipa::path(
    post,
    path = "/v1/backup",
    tag = "coordinator",
    security(("adminToken" = [])),
    responses(
        (status = 200, description = "The backup: a SQLite database.", content_type = "application/vnd.sqlite3", body = Vec<u8>,
            headers(
                ("Drover-Backup-Revision" = u64, description = "The store revision the backup was taken at."),
                ("Drover-Backup-Objects" = String, description = "Objects per kind: `clusters=3,machines=12,...`."),
            ),
        ),
    ),
)]
pub async fn backup(State(app): State<Arc<App>>, admin: Admin) -> Result<Response, ApiError> {
    admin.require_write()?;
    let (file, summary) = crate::store::blocking(move || {
        let staging = tempfile::Builder::new()
            .prefix("drover-backup-")
            .tempdir()
            .map_err(|e| {
                ApiError::internal(format!(
                    "cannot make a staging directory for the backup in {}: {e}",
                    std::env::temp_dir().display()
                ))
            })?;
        let path = staging.path().join("drover.db");
        let summary = app.store.backup(&path)?;
        // Open before the staging directory goes: the open file stays
        // readable once its name is removed.
        let file = std::fs::File::open(&path).map_err(ApiError::internal)?;
        Ok::<_, ApiError>((file, summary))
    })
    .await?;
    tracing::info!(
        by = %admin.token_id,
        revision = summary.revision,
        objects = summary.total(),
        bytes = summary.bytes,
        "store backup taken"
    );
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.sqlite3"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(summary.bytes));
    headers.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_str(&format!(
            "attachment; filename=\"drover-backup-r{}.db\"",
            summary.revision
        ))
        .map_err(ApiError::internal)?,
    );
    headers.insert(
        HeaderName::from_static(REVISION_HEADER),
        HeaderValue::from(summary.revision),
    );
    headers.insert(
        HeaderName::from_static(OBJECTS_HEADER),
        HeaderValue::from_str(&summary.counts_header()).map_err(ApiError::internal)?,
    );
    Ok(response)
}
