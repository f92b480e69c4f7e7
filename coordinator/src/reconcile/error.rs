//! The reconciler's and the provisioner's error.

use crate::store::StoreError;

/// Errors while applying a step.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("cannot generate the PKI of cluster {cluster}: {source}")]
    Pki {
        cluster: String,
        source: drover_common::pki::PkiError,
    },
    #[error("cannot give cluster {cluster} a managed control-plane endpoint: {source}")]
    Endpoint {
        cluster: String,
        source: crate::domain::endpoint::EndpointError,
    },
    #[error(transparent)]
    Provider(#[from] crate::provider::ProviderError),
}
