//! The audit log: one JSON line per request that may change something, in
//! `DATA_DIR/audit.log` (mode 0600), also emitted as a tracing event.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// One audited request.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    #[serde(with = "time::serde::rfc3339")]
    pub time: OffsetDateTime,
    /// `admin-token:<id> (<role>)`, `machine:<name>` or `anonymous`.
    pub actor: String,
    /// The client's address.
    pub source: String,
    pub method: String,
    pub path: String,
    /// The HTTP status of the answer.
    pub status: u16,
}

/// The append-only audit file.
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<Option<std::fs::File>>,
}

impl AuditLog {
    /// Opens (creating) the log at `path`.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(Self {
            path: path.to_owned(),
            file: Mutex::new(Some(file)),
        })
    }

    /// Appends an entry. A failing write is logged, never fatal to the request.
    pub fn record(&self, e: AuditEntry) {
        tracing::info!(target: "audit", actor = %e.actor, source = %e.source, method = %e.method, path = %e.path, status = e.status, "audit");
        let mut line = serde_json::to_vec(&e).expect("audit entry serializes");
        line.push(b'\n');
        let mut guard = self.file.lock().expect("audit lock");
        if let Some(f) = guard.as_mut() {
            if let Err(err) = f.write_all(&line) {
                tracing::error!(error = %err, path = %self.path.display(), "cannot write the audit log");
            }
        }
    }

    /// The last `limit` entries.
    pub fn tail(&self, limit: usize) -> std::io::Result<Vec<AuditEntry>> {
        let text = std::fs::read_to_string(&self.path)?;
        let mut entries: Vec<AuditEntry> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let skip = entries.len().saturating_sub(limit);
        Ok(entries.split_off(skip))
    }
}
