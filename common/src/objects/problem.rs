//! Problem documents (RFC 9457), the body of every API error, and the
//! field errors of a refused document.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One refused field of a document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FieldError {
    /// A path such as `spec.workerPools[1].replicas`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// An RFC 9457 problem document, the body of every API error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    #[serde(rename = "type", default = "default_problem_type")]
    pub type_: String,
    pub title: String,
    pub status: u16,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// Field-level errors of a refused document.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

fn default_problem_type() -> String {
    "about:blank".into()
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.title, self.status)?;
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        for e in &self.errors {
            write!(f, "\n  - {e}")?;
        }
        Ok(())
    }
}
