//! The bootstrap document an agent boots from, and the answer of the config
//! fetch while a machine cannot bootstrap yet.

use serde::{Deserialize, Serialize};

use super::ticket::MAX_TICKET_LEN;
use crate::pin::CaPin;

/// `kind` of the bootstrap document.
pub const BOOTSTRAP_KIND: &str = "BootstrapConfig";

/// The document an agent boots from: where the coordinator is, how to
/// recognise it, and the ticket that lets this machine register. It holds no
/// other secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootstrapDocument {
    pub api_version: String,
    pub kind: String,
    /// `https://host:port` of every coordinator replica.
    pub coordinators: Vec<String>,
    /// The coordinator CA's public-key pin.
    pub ca_pin: CaPin,
    pub ticket: String,
}

/// Why a bootstrap document is refused.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapDocumentError {
    #[error("bootstrap document is not valid YAML or JSON: {0}")]
    Parse(String),
    #[error("bootstrap document field {field}: {message}")]
    Field {
        field: &'static str,
        message: String,
    },
}

impl BootstrapDocument {
    /// The largest bootstrap document accepted (EC2 user data is 16 KiB).
    pub const MAX_LEN: usize = 16 * 1024;

    /// Parses and checks a bootstrap document.
    pub fn parse(text: &str) -> Result<Self, BootstrapDocumentError> {
        if text.len() > Self::MAX_LEN {
            return Err(BootstrapDocumentError::Field {
                field: "(document)",
                message: format!("is {} bytes, more than {}", text.len(), Self::MAX_LEN),
            });
        }
        let doc: Self = serde_saphyr::from_str(text)
            .map_err(|e| BootstrapDocumentError::Parse(e.to_string()))?;
        doc.check()?;
        Ok(doc)
    }

    fn check(&self) -> Result<(), BootstrapDocumentError> {
        let bad = |field, message: String| Err(BootstrapDocumentError::Field { field, message });
        if self.api_version != crate::API_VERSION {
            return bad("apiVersion", format!("must be {:?}", crate::API_VERSION));
        }
        if self.kind != BOOTSTRAP_KIND {
            return bad("kind", format!("must be {BOOTSTRAP_KIND:?}"));
        }
        if self.coordinators.is_empty() {
            return bad("coordinators", "must list at least one https:// URL".into());
        }
        for url in &self.coordinators {
            if !url.starts_with("https://") {
                return bad("coordinators", format!("{url:?} must start with https://"));
            }
        }
        if self.ticket.is_empty() || self.ticket.len() > MAX_TICKET_LEN {
            return bad("ticket", "is empty or too long".into());
        }
        Ok(())
    }

    /// Renders the document as YAML.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).expect("bootstrap document serializes")
    }
}

/// The answer of `GET /v1/machine/config` while the machine cannot bootstrap yet.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigNotReady {
    pub reason: String,
    pub retry_after_seconds: u64,
}
