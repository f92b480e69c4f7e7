//! Providers: where machines come from. The coordinator records a machine as
//! intent in the store first, then asks its provider to create it; every
//! call is idempotent on the machine UID, and everything a provider creates
//! is labelled with the coordinator, cluster and machine, so the sweeper can
//! find and delete what the store does not know.
//!
//! The [`Provider`] trait is the seam: the reconciler's provisioner
//! (`reconcile/provisioner.rs`) chooses a provider for a cluster's spec in
//! one place (`provider_for` and `providers_in_use`) and does everything
//! else through the trait, so a new provider is a new module here plus its
//! arm there. A `pool` cluster has no provider: its machines are hosts an
//! operator registers, so nothing creates, deletes, lists or checks them.

#[cfg(feature = "aws")]
pub mod aws;
pub mod clients;
pub mod docker;
pub mod metered;
pub mod redfish;
pub mod retries;
#[cfg(feature = "aws")]
pub mod s3;
#[cfg(not(feature = "aws"))]
#[path = "s3_absent.rs"]
pub mod s3;

use std::collections::BTreeMap;
use std::net::IpAddr;

use drover_common::api::{Cluster, Machine};
use futures_util::future::BoxFuture;

/// The state of a provider machine and the key of a provider-run endpoint's
/// state: facts the providers produce and the planner reads, so they live
/// in the planner crate.
pub use drover_planner::{endpoint_key, InstanceState};

/// Why a call to a snapshot bucket failed (`s3.rs`, or `s3_absent.rs` in
/// a build without `aws`).
#[derive(Debug, thiserror::Error)]
#[error("{action} {object}: {detail}")]
pub struct S3Error {
    pub action: &'static str,
    pub object: String,
    pub detail: String,
}

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

impl MachineRequest {
    /// The request for a recorded machine of `cluster`.
    pub fn new(cluster: &Cluster, m: &Machine, user_data: String, image: &str) -> Self {
        Self {
            cluster: cluster.metadata.name.clone(),
            cluster_uid: cluster.metadata.uid.clone().unwrap_or_default(),
            machine: m.metadata.name.clone(),
            machine_uid: m.metadata.uid.clone().unwrap_or_default(),
            user_data,
            image: image.to_owned(),
        }
    }
}

/// A provider's load balancer in front of a cluster's control planes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointLoadBalancer {
    /// What the provider calls it (a container name, an ARN).
    pub id: String,
    /// The endpoint, `host:port`.
    pub address: String,
}

/// What a successful create reports.
#[derive(Debug, Clone)]
pub struct Created {
    pub provider_id: String,
    /// What Kubernetes calls the machine, its Node's `spec.providerID`,
    /// when the provider has a name for it (`aws:///<zone>/<instance-id>`);
    /// otherwise it is [`drover_common::kubeadm::drover_provider_id`].
    pub node_provider_id: Option<String>,
    /// The `ProviderCreated` event's message.
    pub message: String,
}

/// Something this coordinator manages at a provider, as listed for the
/// orphan sweeper (before the store is read: a machine is recorded before
/// its instance is created, so whatever is listed here and not recorded is
/// an orphan).
#[derive(Debug, Clone)]
pub enum Managed {
    /// A machine's container or instance.
    Machine {
        provider_id: String,
        labels: BTreeMap<String, String>,
        /// The provider is already deleting it (an EC2 instance shutting
        /// down or terminated): nothing to sweep.
        gone: bool,
    },
    /// A cluster-wide resource (a docker network).
    ClusterResource {
        name: String,
        labels: BTreeMap<String, String>,
    },
}

impl Managed {
    /// The labels (or tags) it carries.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        match self {
            Managed::Machine { labels, .. } | Managed::ClusterResource { labels, .. } => labels,
        }
    }
}

/// Why a machine's registration cannot go ahead.
#[derive(Debug)]
#[cfg_attr(not(feature = "aws"), allow(dead_code))]
pub enum InstanceCheckError {
    /// The presenting instance is not the machine's: refuse for good.
    Refused(String),
    /// The provider could not answer now: the agent should retry.
    Unavailable(String),
}

/// A failure of the coordinator's side of a create (the store, a listener),
/// passed through [`CreateHost`] with its source kept: the provider layer
/// names no coordinator error type.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct HostError(Box<dyn std::error::Error + Send + Sync>);

impl HostError {
    /// Wraps the coordinator-side error `e`.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(e))
    }
}

/// What a provider asks of the coordinator while it creates a machine (the
/// provisioner implements it over the coordinator's state; the provider
/// layer never sees the store or the server).
pub trait CreateHost: Sync {
    /// The cluster the machine is created for.
    fn cluster(&self) -> &Cluster;
    /// The machine to create.
    fn machine(&self) -> &Machine;
    /// The machine's bootstrap document (YAML) naming `coordinators`.
    /// Deterministic for a machine, so a retried create sends the same user
    /// data.
    fn bootstrap_document(&self, coordinators: Vec<String>) -> String;
    /// The URLs the coordinator advertises to machines outside its host.
    fn advertise_urls(&self) -> Vec<String>;
    /// Makes this replica listen on `gateway` (a cluster network's gateway
    /// on this host); returns the port.
    fn listen_on(&self, gateway: IpAddr) -> BoxFuture<'_, Result<u16, HostError>>;
    /// The coordinator URLs of a machine behind a gateway where this replica
    /// listens at `own_port`: this replica first, then every other replica.
    fn gateway_urls(&self, own_port: u16) -> BoxFuture<'_, Result<Vec<String>, HostError>>;
    /// The failure domains (subnets) of the machine's pool siblings that
    /// are not deleted, to spread the machine across them.
    fn failure_domains_in_use(&self) -> Result<Vec<String>, HostError>;
    /// Records the machine's chosen failure domain before its create, so a
    /// retried create sends the same parameters.
    fn record_failure_domain(&self, chosen: &str) -> Result<(), HostError>;
}

/// What a provider call returns: a boxed future (the trait is used as
/// `dyn Provider`) of its result, by default with a [`ProviderError`].
pub type Fut<'a, T, E = ProviderError> = BoxFuture<'a, Result<T, E>>;

/// What [`Provider::verify_instance`] returns.
pub type Check<'a> = Fut<'a, (), InstanceCheckError>;

/// A place machines come from (the Docker engine, an EC2 region). Every
/// call is idempotent on the machine UID and everything created carries the
/// labels above.
///
/// A provider may also keep the cluster's control-plane endpoint: a load
/// balancer in front of its control-plane machines, made before the first
/// machine ([`Provider::ensure_endpoint`]), told its backends as control
/// planes come and go ([`Provider::set_endpoint_backends`]), listed by
/// [`Provider::managed`] for the sweeper and deleted with the cluster's
/// other resources.
pub trait Provider: Send + Sync {
    /// Creates the machine's container or instance unless it exists, with
    /// its bootstrap document as user data and its UID as idempotency key.
    fn create<'a>(&'a self, host: &'a dyn CreateHost) -> Fut<'a, Created>;

    /// Deletes the machine's container or instance; a missing one is
    /// already deleted.
    fn destroy<'a>(&'a self, cluster: &'a Cluster, machine: &'a Machine) -> Fut<'a, ()>;

    /// Deletes what the cluster owns beyond its machines (a network, a load
    /// balancer). A provider whose clusters own nothing else keeps this.
    fn delete_cluster_resources<'a>(&'a self, _cluster: &'a Cluster) -> Fut<'a, ()> {
        Box::pin(async { Ok(()) })
    }

    /// Makes the cluster's control-plane endpoint unless it exists and
    /// returns it, or `None` when this provider keeps none (the endpoint is
    /// then the spec's, or a control plane's own address).
    fn ensure_endpoint<'a>(
        &'a self,
        cluster: &'a Cluster,
    ) -> Fut<'a, Option<EndpointLoadBalancer>> {
        let _ = cluster;
        Box::pin(async { Ok(None) })
    }

    /// Points the cluster's endpoint at `config.backends` (the API servers
    /// of its Running control planes that are not leaving).
    fn set_endpoint_backends<'a>(
        &'a self,
        cluster: &'a Cluster,
        config: &'a drover_common::wire::LoadBalancerConfig,
    ) -> Fut<'a, ()> {
        let _ = (cluster, config);
        Box::pin(async {
            Err(ProviderError::Failed {
                provider: "this",
                action: "set the backends of",
                object: "a control-plane endpoint".into(),
                detail: "the provider keeps no endpoint".into(),
            })
        })
    }

    /// Observes: every machine this coordinator has at this provider, with
    /// its state (the caller matches them to machines by UID label).
    fn list(&self) -> Fut<'_, Vec<ProviderMachine>>;

    /// Observes the control-plane endpoints this provider runs as its own
    /// objects (docker's load-balancer containers): the state of each, by
    /// cluster UID. A cluster with a recorded endpoint that is not listed
    /// has lost it. Providers whose endpoints are the cloud's own service
    /// (an NLB) list none.
    fn endpoint_states(&self) -> Fut<'_, Vec<(String, InstanceState)>> {
        Box::pin(async { Ok(vec![]) })
    }

    /// Sweep support: everything this coordinator manages at this provider.
    fn managed(&self) -> Fut<'_, Vec<Managed>>;

    /// Removes an orphan listed by [`Provider::managed`]; returns what was
    /// removed, or `None` when it cannot go yet (logged; the next sweep
    /// retries).
    fn remove_orphan<'a>(&'a self, orphan: &'a Managed) -> Fut<'a, Option<String>>;

    /// Checks at registration that a machine ticket is presented from the
    /// instance the provider created for the machine (`reported` is the
    /// instance ID the agent read from instance metadata).
    fn verify_instance<'a>(&'a self, machine: &'a Machine, reported: Option<&'a str>) -> Check<'a>;
}

/// A provider this coordinator was built without: every machine call
/// refuses with [`ProviderError::NotBuilt`]; it has created nothing, so it
/// has no cluster resources to delete and nothing to list or sweep.
#[cfg(not(feature = "aws"))]
pub struct NotBuilt {
    pub provider: &'static str,
}

#[cfg(not(feature = "aws"))]
impl Provider for NotBuilt {
    fn create<'a>(&'a self, _: &'a dyn CreateHost) -> Fut<'a, Created> {
        Box::pin(async move {
            Err(ProviderError::NotBuilt {
                provider: self.provider,
            })
        })
    }

    fn destroy<'a>(&'a self, _: &'a Cluster, _: &'a Machine) -> Fut<'a, ()> {
        Box::pin(async move {
            Err(ProviderError::NotBuilt {
                provider: self.provider,
            })
        })
    }

    fn list(&self) -> Fut<'_, Vec<ProviderMachine>> {
        Box::pin(async { Ok(vec![]) })
    }

    fn managed(&self) -> Fut<'_, Vec<Managed>> {
        Box::pin(async { Ok(vec![]) })
    }

    fn remove_orphan<'a>(&'a self, _: &'a Managed) -> Fut<'a, Option<String>> {
        Box::pin(async { Ok(None) })
    }

    fn verify_instance<'a>(&'a self, _: &'a Machine, _: Option<&'a str>) -> Check<'a> {
        Box::pin(async move {
            Err(InstanceCheckError::Refused(
                ProviderError::NotBuilt {
                    provider: self.provider,
                }
                .to_string(),
            ))
        })
    }
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

/// The refusal of `provider` to `action` the machine of `host`, whose
/// cluster's spec names another provider (`expected`: "an aws cluster").
pub(crate) fn not_its_cluster<T>(
    provider: &'static str,
    action: &'static str,
    host: &dyn CreateHost,
    expected: &str,
) -> Result<T, ProviderError> {
    Err(ProviderError::Failed {
        provider,
        action,
        object: format!("machine {}", host.machine().metadata.name),
        detail: format!("cluster {} is not {expected}", host.cluster().metadata.name),
    })
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
    /// The class as a metric label: throttled, insufficient_capacity,
    /// quota_exceeded, unauthorized, invalid_configuration, transient or
    /// other.
    pub fn label(self) -> &'static str {
        match self {
            Self::Throttled => "throttled",
            Self::InsufficientCapacity => "insufficient_capacity",
            Self::QuotaExceeded => "quota_exceeded",
            Self::Unauthorized => "unauthorized",
            Self::InvalidConfiguration => "invalid_configuration",
            Self::Transient => "transient",
            Self::Other => "other",
        }
    }

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
