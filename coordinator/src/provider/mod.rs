//! Providers: where machines come from. The coordinator records a machine as
//! intent in the store first, then asks its provider to create it; every
//! call is idempotent on the machine UID, and everything a provider creates
//! is labelled with the coordinator, cluster and machine, so the sweeper can
//! find and delete what the store does not know.

#[cfg(feature = "aws")]
pub mod aws;
pub mod docker;

use std::collections::BTreeMap;

/// Labels (or tags) on everything a provider creates.
pub const LABEL_MANAGED: &str = "drover.dev/managed-by";
pub const LABEL_CLUSTER: &str = "drover.dev/cluster";
pub const LABEL_CLUSTER_UID: &str = "drover.dev/cluster-uid";
pub const LABEL_MACHINE: &str = "drover.dev/machine";
pub const LABEL_MACHINE_UID: &str = "drover.dev/machine-uid";

/// What the provider needs to create one machine.
#[derive(Debug, Clone)]
pub struct MachineRequest {
    pub cluster: String,
    pub cluster_uid: String,
    pub machine: String,
    pub machine_uid: String,
    /// The bootstrap document, delivered as user data.
    pub user_data: String,
    pub image: String,
}

/// The state of a provider machine as the provider sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    Pending,
    Running,
    /// Stopped, exited or dead: it will not come back by itself.
    Stopped,
    Paused,
}

/// A machine the provider knows about.
#[derive(Debug, Clone)]
pub struct ProviderMachine {
    pub provider_id: String,
    pub labels: BTreeMap<String, String>,
    pub state: InstanceState,
}

impl ProviderMachine {
    pub fn machine_uid(&self) -> Option<&str> {
        self.labels.get(LABEL_MACHINE_UID).map(String::as_str)
    }
}

/// A cluster-wide resource (a network) the provider created.
#[derive(Debug, Clone)]
pub struct ProviderNetwork {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// Provider failures, with what was being done to which object.
#[derive(Debug, thiserror::Error)]
// Without a cloud provider built in, nothing makes `Cloud` errors.
#[cfg_attr(not(feature = "aws"), allow(dead_code))]
pub enum ProviderError {
    #[error("cannot reach the {provider} provider: {detail}")]
    Unavailable {
        provider: &'static str,
        detail: String,
    },
    #[error("{provider} provider failed to {action} {object}: {detail}")]
    Failed {
        provider: &'static str,
        action: &'static str,
        object: String,
        detail: String,
    },
    #[error(
        "{object} exists but belongs to another owner ({detail}); delete it or rename the cluster"
    )]
    Foreign { object: String, detail: String },
    /// A cloud API refused or failed a call; `class` says how to back off.
    #[error("{provider} provider failed to {action} {object}: {detail}")]
    Cloud {
        provider: &'static str,
        action: &'static str,
        object: String,
        class: CloudErrorClass,
        detail: String,
    },
    #[cfg(not(feature = "aws"))]
    #[error("this coordinator was built without the {provider} provider; rebuild it with `--features {provider}`")]
    NotBuilt { provider: &'static str },
}

impl ProviderError {
    /// What kind of failure this is, for the condition's reason and the
    /// back-off before the next attempt.
    pub fn class(&self) -> CloudErrorClass {
        match self {
            ProviderError::Cloud { class, .. } => *class,
            ProviderError::Unavailable { .. } => CloudErrorClass::Transient,
            ProviderError::Failed { .. } => CloudErrorClass::Other,
            ProviderError::Foreign { .. } => CloudErrorClass::InvalidConfiguration,
            #[cfg(not(feature = "aws"))]
            ProviderError::NotBuilt { .. } => CloudErrorClass::InvalidConfiguration,
        }
    }
}

/// Kinds of provider failure, each with its own back-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "aws"), allow(dead_code))]
pub enum CloudErrorClass {
    /// The API asked us to slow down.
    Throttled,
    /// The zone has no capacity for the instance type now.
    InsufficientCapacity,
    /// An account limit (instances, vCPUs) is reached.
    QuotaExceeded,
    /// Credentials are missing, wrong or not allowed to do this.
    Unauthorized,
    /// The spec names something that does not exist or cannot work (a bad
    /// AMI, subnet or security group); retrying helps only after a fix.
    InvalidConfiguration,
    /// A timeout, a dropped connection or a server-side error.
    Transient,
    /// Anything else.
    Other,
}

impl CloudErrorClass {
    /// Classifies an EC2 error code.
    #[cfg_attr(not(feature = "aws"), allow(dead_code))]
    pub fn from_code(code: &str) -> Self {
        match code {
            "RequestLimitExceeded"
            | "Throttling"
            | "ThrottlingException"
            | "RequestThrottled"
            | "SlowDown" => Self::Throttled,
            "InsufficientInstanceCapacity"
            | "InsufficientCapacity"
            | "InsufficientHostCapacity"
            | "InsufficientReservedInstanceCapacity"
            | "InsufficientAddressCapacity" => Self::InsufficientCapacity,
            "InstanceLimitExceeded" | "VcpuLimitExceeded" | "MaxSpotInstanceCountExceeded" => {
                Self::QuotaExceeded
            }
            "AuthFailure"
            | "UnauthorizedOperation"
            | "Blocked"
            | "OptInRequired"
            | "InvalidClientTokenId"
            | "SignatureDoesNotMatch"
            | "PendingVerification" => Self::Unauthorized,
            "InternalError" | "InternalFailure" | "ServiceUnavailable" | "Unavailable" => {
                Self::Transient
            }
            c if c.ends_with("LimitExceeded") => Self::QuotaExceeded,
            c if c.starts_with("Invalid") || c == "Unsupported" || c == "MissingParameter" => {
                Self::InvalidConfiguration
            }
            _ => Self::Other,
        }
    }

    /// The condition reason for a failed create.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Throttled => "Throttled",
            Self::InsufficientCapacity => "InsufficientCapacity",
            Self::QuotaExceeded => "QuotaExceeded",
            Self::Unauthorized => "Unauthorized",
            Self::InvalidConfiguration => "InvalidConfiguration",
            Self::Transient | Self::Other => "CreateFailed",
        }
    }

    /// The first delay before retrying, and the most it grows to.
    pub fn backoff(self) -> (std::time::Duration, std::time::Duration) {
        use std::time::Duration as D;
        match self {
            Self::Throttled => (D::from_secs(2), D::from_secs(120)),
            Self::Transient | Self::Other => (D::from_secs(2), D::from_secs(300)),
            Self::InsufficientCapacity => (D::from_secs(30), D::from_secs(600)),
            Self::QuotaExceeded | Self::Unauthorized | Self::InvalidConfiguration => {
                (D::from_secs(60), D::from_secs(600))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ec2_error_codes_are_classified() {
        use CloudErrorClass as C;
        for (code, class) in [
            ("RequestLimitExceeded", C::Throttled),
            ("InsufficientInstanceCapacity", C::InsufficientCapacity),
            ("VcpuLimitExceeded", C::QuotaExceeded),
            ("InstanceLimitExceeded", C::QuotaExceeded),
            ("SecurityGroupLimitExceeded", C::QuotaExceeded),
            ("InvalidAMIID.NotFound", C::InvalidConfiguration),
            ("InvalidSubnetID.NotFound", C::InvalidConfiguration),
            ("UnauthorizedOperation", C::Unauthorized),
            ("InternalError", C::Transient),
            ("SomethingNew", C::Other),
        ] {
            assert_eq!(CloudErrorClass::from_code(code), class, "{code}");
        }
    }

    #[test]
    fn back_off_starts_short_for_throttling_and_long_for_bad_config() {
        let (t, t_max) = CloudErrorClass::Throttled.backoff();
        let (i, i_max) = CloudErrorClass::InvalidConfiguration.backoff();
        assert!(t < i && t_max <= i_max);
        assert_eq!(CloudErrorClass::Throttled.reason(), "Throttled");
    }
}
