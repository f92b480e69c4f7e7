//! The admin API's vocabulary: the objects it serves (re-exported from
//! [`crate::objects`]) and its own request and answer bodies, some of which
//! carry a document of the machine protocol ([`crate::wire`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

pub use crate::objects::*;
use crate::wire::BootstrapDocument;

/// The request body of `POST /v1/registrationtokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateRegistrationToken {
    pub pool: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Seconds until the token and its ticket expire.
    pub ttl_seconds: u64,
    pub max_uses: u32,
}

/// The answer to `POST /v1/registrationtokens`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreatedRegistrationToken {
    pub token: RegistrationToken,
    /// The document to hand to `drover-agent --bootstrap`.
    pub bootstrap: BootstrapDocument,
}

/// What one cluster's autoscaler needs to reach the coordinator's
/// `externalgrpc` service (`drover autoscaler-config`).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AutoscalerCredentials {
    /// Where the service listens, `host:port` (the cloud-config's `address`).
    pub address: String,
    /// The client certificate (`cert`), for this cluster only.
    pub cert_pem: String,
    /// Its private key (`key`); shown once, kept nowhere.
    pub key_pem: String,
    /// The coordinator's CA (`cacert`), which signed the service's certificate.
    pub ca_pem: String,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

/// An admin kubeconfig minted for a cluster.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeconfigResponse {
    pub kubeconfig: String,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}
