//! The `RegistrationToken` object: a token under which machines register
//! themselves into a pool.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::meta::ObjectMeta;

/// A token under which machines register themselves into a pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistrationToken {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: RegistrationTokenSpec,
    #[serde(default)]
    pub status: RegistrationTokenStatus,
}

/// What a registration token allows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistrationTokenSpec {
    pub pool: String,
    /// Labels given to every machine registering with it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// How many machines may register with it.
    pub max_uses: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    #[serde(default)]
    pub revoked: bool,
}

/// How a registration token has been used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistrationTokenStatus {
    #[serde(default)]
    pub uses: u32,
    /// The last machines that registered with it (at most 16, the most
    /// recent last); each machine's `Registered` event names its token.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines: Vec<String>,
}
