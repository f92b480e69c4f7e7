//! The `Machine` object: its spec (the assignment), role, phase and status.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;
use time::OffsetDateTime;

use super::meta::{Condition, Event, ObjectMeta};
use super::problem::FieldError;
use super::report::{BootstrapReport, HealthReport};
use crate::serde_skip::is_default;

/// The condition type the reconciler keeps on a machine that went silent or
/// whose instance stopped (False), cleared to True when it is back. The
/// planner writes it, the operator CLI and the web view read it.
pub const ALIVE_CONDITION: &str = "Alive";

/// A machine known to the coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Machine {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: MachineSpec,
    #[serde(default)]
    pub status: MachineStatus,
}

/// What the coordinator wants of the machine.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineSpec {
    /// The registration pool the machine registered into (empty for
    /// machines a provider created).
    #[serde(default)]
    pub pool: String,
    /// The provider that created the machine, when the coordinator made it.
    pub provider: Option<String>,
    /// The cluster the machine serves, when claimed.
    pub assignment: Option<Assignment>,
    /// The machine's baseboard management controller, set by an admin
    /// (`drover bmc set`), never by the machine: how Drover power-cycles a
    /// silent pool machine and powers a free one off or on.
    pub bmc: Option<BmcSpec>,
}

/// A machine's BMC: its Redfish service and the Secret that holds its
/// credentials (keys `username` and `password`, and `ca.crt` when the
/// BMC's certificate is not signed by a CA this host trusts, as most are
/// not). The credentials never leave the coordinator.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BmcSpec {
    /// The Redfish service's root: `https://HOST[:PORT]`.
    pub url: String,
    /// The `ComputerSystem`'s id under `/redfish/v1/Systems/`; when
    /// absent, the BMC's only system.
    pub system: Option<String>,
    /// The Secret with the BMC's `username`, `password` and optional
    /// `ca.crt`.
    pub credentials_secret: String,
}

/// Keys a BMC's credentials Secret holds.
pub const BMC_USERNAME_KEY: &str = "username";
pub const BMC_PASSWORD_KEY: &str = "password";
pub const BMC_CA_KEY: &str = "ca.crt";

impl BmcSpec {
    /// Every field error of the spec, under `spec.bmc`.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errors = vec![];
        if let Err(why) = check_bmc_url(&self.url) {
            errors.push(FieldError {
                field: "spec.bmc.url".into(),
                message: format!("{:?} {why}", self.url),
            });
        }
        if let Some(system) = &self.system {
            let ok = !system.is_empty()
                && system.len() <= 253
                && system
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                && system != "."
                && system != "..";
            if !ok {
                errors.push(FieldError {
                    field: "spec.bmc.system".into(),
                    message: format!(
                        "{system:?} must be a system id of 1 to 253 letters, digits, '-', '_' or '.' (the last segment of /redfish/v1/Systems/ID)"
                    ),
                });
            }
        }
        if let Err(e) =
            crate::names::check_object_name("credentials Secret", &self.credentials_secret)
        {
            errors.push(FieldError {
                field: "spec.bmc.credentialsSecret".into(),
                message: e.to_string(),
            });
        }
        errors
    }
}

/// Why a BMC URL is refused: it must be `https://HOST[:PORT]` with an
/// optional trailing `/` (the Redfish root is found under it).
fn check_bmc_url(url: &str) -> Result<(), &'static str> {
    let rest = url
        .strip_prefix("https://")
        .ok_or("must start with https:// (the BMC's credentials never cross plain HTTP)")?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#', '@']) || authority.chars().any(char::is_whitespace) {
        return Err("must be https://HOST[:PORT], without a path, query or user");
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (addr, after) = v6
                .split_once(']')
                .ok_or("has an unclosed '[' in its host")?;
            addr.parse::<std::net::Ipv6Addr>()
                .map_err(|_| "has an IPv6 host that does not parse")?;
            (addr, after.strip_prefix(':'))
        }
        None => match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err("has no host");
    }
    if host.parse::<std::net::IpAddr>().is_err()
        && !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err("has a host that is neither a DNS name nor an IP address");
    }
    if let Some(p) = port {
        match p.parse::<u16>() {
            Ok(n) if n > 0 => {}
            _ => return Err("has a port that is not 1 to 65535"),
        }
    }
    Ok(())
}

/// A machine's place in a cluster.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Assignment {
    pub cluster: String,
    /// The cluster's UID, so a machine never joins a re-created namesake.
    pub cluster_uid: String,
    /// `control-plane` or a worker pool name.
    pub machine_pool: String,
    pub role: MachineRole,
    /// Bumped on every change of the assignment; the agent rejects config
    /// bundles older than the one it applied.
    pub generation: u64,
    /// When the machine was given this assignment. A pool machine may have
    /// waited in its pool for weeks, so its startup timeout runs from here,
    /// not from its registration.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub assigned_at: Option<OffsetDateTime>,
    /// The machine this one replaces in its cluster, when it was claimed or
    /// created to take an unhealthy or removed machine's place.
    pub replaces: Option<String>,
    /// The Kubernetes version the machine was made (or claimed) for: the
    /// cluster's `kubernetesVersion` then. A machine whose version (or
    /// image) differs from the cluster's is replaced by a rollout.
    pub kubernetes_version: Option<String>,
    /// The image a provider made the machine from (a docker image, an AMI).
    pub image: Option<String>,
}

/// What a machine does in its cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum MachineRole {
    /// The first control-plane machine: runs `kubeadm init`.
    Init,
    /// Another control-plane machine: `kubeadm join --control-plane`.
    ControlPlane,
    /// A worker: `kubeadm join`.
    Worker,
}

impl MachineRole {
    pub fn is_control_plane(self) -> bool {
        matches!(self, MachineRole::Init | MachineRole::ControlPlane)
    }
}

impl fmt::Display for MachineRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MachineRole::Init => "control-plane(init)",
            MachineRole::ControlPlane => "control-plane",
            MachineRole::Worker => "worker",
        })
    }
}

/// A machine's lifecycle phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum MachinePhase {
    /// Recorded by the coordinator; the provider is creating it or it has
    /// not registered yet.
    Provisioning,
    /// Registered and waiting in its pool.
    #[default]
    Registered,
    /// Claimed by a cluster; has not started bootstrapping.
    Assigned,
    /// Running kubeadm.
    Bootstrapping,
    /// Joined its cluster and reporting.
    Running,
    /// Bootstrap failed; see `status.bootstrap.failure`.
    Failed,
    /// Being reset to return to its pool.
    Releasing,
    /// Being deleted through its provider.
    Deleting,
    /// Gone; kept for a while so its history can be read.
    Deleted,
}

impl fmt::Display for MachinePhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A machine's CPUs and memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Capacity {
    /// The CPUs it may use (its cgroup's quota, if any).
    pub cpus: u32,
    /// Its memory, in bytes (`MemTotal` of `/proc/meminfo`).
    pub memory_bytes: u64,
}

impl Capacity {
    /// This host's, read from the kernel: `None` when it cannot be read.
    pub fn of_this_host() -> Option<Self> {
        let cpus = std::thread::available_parallelism().ok()?.get() as u32;
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let memory_bytes = parse_mem_total(&meminfo)?;
        Some(Self { cpus, memory_bytes })
    }
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line["MemTotal:".len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// What the coordinator knows about a machine.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineStatus {
    #[serde(default)]
    pub phase: MachinePhase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hostname: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// Where this machine's API server listens, when it is control plane.
    #[serde(default, skip_serializing_if = "is_default")]
    pub api_server_port: u16,
    /// Where this machine's kubelet serves `/healthz`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub kubelet_healthz_port: u16,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub agent_version: String,
    /// The version of the kubeadm on the machine (`kubeadm version -o
    /// short`), as its agent last reported it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kubeadm_version: String,
    /// When the first of the machine's kubeadm certificates expires (a
    /// control plane), as its agent last reported it.
    pub certificates: Option<CertificateExpiry>,
    /// The in-place upgrade this machine is asked to run (pool clusters),
    /// kept here so its heartbeats carry it without reading its cluster.
    pub upgrade: Option<crate::objects::operations::UpgradeRequest>,
    /// The last reboot remediation asked of the machine, and its outcome.
    pub reboot: Option<crate::objects::operations::RebootRequest>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub last_heartbeat_time: Option<OffsetDateTime>,
    pub health: Option<HealthReport>,
    pub bootstrap: Option<BootstrapReport>,
    /// The assignment generation the agent last applied.
    #[serde(default, skip_serializing_if = "is_default")]
    pub applied_generation: u64,
    /// Why the machine heartbeats over HTTPS although it was offered
    /// datagram heartbeats (their datagrams go unanswered: a firewall),
    /// as its agent last reported it.
    pub heartbeat_fallback: Option<String>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub certificate_not_after: Option<OffsetDateTime>,
    /// The `sha256:` pin of the current client certificate's public key.
    /// Only that certificate may renew, so a stolen copy cannot extend
    /// itself past its expiry without the coordinator noticing.
    pub certificate_key: Option<String>,
    /// When the machine's identity was revoked (by an admin, or by the
    /// coordinator on seeing two holders of it): from then on every
    /// certificate of the machine is refused.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub identity_revoked_at: Option<OffsetDateTime>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The provider's id for the machine (a container or instance id).
    pub provider_id: Option<String>,
    /// Its CPUs and memory, as its agent reported them at registration.
    pub capacity: Option<Capacity>,
    /// Its Node's `spec.providerID` when the provider names it
    /// (`aws:///<zone>/<instance-id>`); otherwise the Node's is
    /// `drover://<cluster>/<machine>`.
    pub node_provider_id: Option<String>,
    /// Where the provider placed the machine: its subnet on `aws`. Chosen
    /// and recorded before the first create call, so retries agree.
    pub failure_domain: Option<String>,
    /// Whether the machine's single-use ticket was redeemed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ticket_redeemed: bool,
    /// What happened to the machine, oldest first (the last 30 events).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Event>,
}

impl MachineStatus {
    /// Whether a reboot (an agent's or a power cycle) is under way: asked,
    /// neither back nor failed.
    pub fn rebooting(&self) -> bool {
        self.reboot.as_ref().is_some_and(|r| r.in_progress())
    }

    /// The machine's address (the first it reported), or `""` before it
    /// reported any.
    pub fn address(&self) -> &str {
        self.addresses
            .first()
            .map(String::as_str)
            .unwrap_or_default()
    }
}

/// The kubeadm certificate of a control plane that expires first: the
/// leaf certificates under `/etc/kubernetes/pki` and the client
/// certificates of the kubeconfigs kubeadm writes (what `kubeadm certs
/// check-expiration` lists; the CAs are not among them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateExpiry {
    /// Its file, relative to `/etc/kubernetes` (`pki/apiserver.crt`,
    /// `admin.conf`).
    pub certificate: String,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bmc_spec_is_an_https_root_a_system_id_and_a_secret_name() {
        let ok = |url: &str| BmcSpec {
            url: url.into(),
            system: None,
            credentials_secret: "bmc-1".into(),
        };
        for url in [
            "https://10.0.0.5",
            "https://bmc-1.example.com:8443/",
            "https://[fd00::5]:443",
        ] {
            assert_eq!(ok(url).validate(), vec![], "{url}");
        }
        for (url, why) in [
            ("http://10.0.0.5", "https://"),
            ("https://10.0.0.5/redfish/v1", "without a path"),
            ("https://admin@10.0.0.5", "without a path, query or user"),
            ("https://", "no host"),
            ("https://10.0.0.5:0", "port"),
            ("https://[fd00::5", "unclosed"),
            ("https://bad_host!", "neither a DNS name"),
        ] {
            let errors = ok(url).validate();
            assert_eq!(errors.len(), 1, "{url}: {errors:?}");
            assert_eq!(errors[0].field, "spec.bmc.url");
            assert!(errors[0].message.contains(why), "{url}: {}", errors[0]);
        }
        let bad = BmcSpec {
            url: "https://10.0.0.5".into(),
            system: Some("../Managers".into()),
            credentials_secret: "Not A Name".into(),
        };
        let fields: Vec<_> = bad.validate().into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            ["spec.bmc.system", "spec.bmc.credentialsSecret"],
            "both named"
        );
    }

    #[test]
    fn mem_total_is_read_in_bytes() {
        let text = "MemTotal:       16318452 kB\nMemFree:         1000 kB\n";
        assert_eq!(parse_mem_total(text), Some(16318452 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: x kB\n"), None);
    }
}
