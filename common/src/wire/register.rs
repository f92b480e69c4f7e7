//! Registration (a ticket and a CSR for a certificate) and certificate
//! renewal.

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;
use time::OffsetDateTime;

/// Facts a machine reports about itself at registration.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineFacts {
    pub hostname: String,
    /// Addresses other machines reach this one on, most preferred first.
    pub addresses: Vec<String>,
    /// The port its API server will listen on if it becomes control plane.
    pub api_server_port: u16,
    /// The port its kubelet serves `/healthz` on.
    pub kubelet_healthz_port: u16,
    pub agent_version: String,
    /// The cloud instance the agent runs on, read from instance metadata;
    /// the coordinator checks it against the instance it launched for the
    /// ticket's machine.
    pub instance_id: Option<String>,
    /// What the machine has to run Pods on, as its kubelet will report it:
    /// what a template node of its pool is built from, so the
    /// cluster-autoscaler can scale the pool from zero.
    pub capacity: Option<crate::objects::Capacity>,
}

/// `POST /v1/machine/register`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterRequest {
    pub ticket: String,
    /// A PEM CSR for the key the agent generated; only its key is used.
    pub csr_pem: String,
    pub facts: MachineFacts,
}

/// The answer to a registration.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterResponse {
    pub machine_name: String,
    pub machine_uid: String,
    /// The agent's client certificate (PEM), valid until `not_after`.
    pub certificate_pem: String,
    #[serde(with = "time::serde::rfc3339")]
    pub not_after: OffsetDateTime,
    /// The coordinator CA certificate, which the agent checks against its pin.
    pub coordinator_ca_pem: String,
    pub heartbeat_interval_seconds: u64,
}

/// `POST /v1/machine/certificate`: renew the client certificate.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenewRequest {
    pub csr_pem: String,
}

/// The answer to a renewal.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenewResponse {
    pub certificate_pem: String,
    #[serde(with = "time::serde::rfc3339")]
    pub not_after: OffsetDateTime,
}
