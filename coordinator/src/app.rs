//! Shared coordinator state: the store, key material, settings, and the
//! in-memory heartbeat table.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use drover_common::api::{Cluster, Machine};
use drover_common::pin::CaPin;
use drover_common::pki::CertificateAuthority;
use drover_common::ticket::TicketKey;
use time::OffsetDateTime;
use tokio::sync::Notify;

use crate::store::{Kind, Store, StoreError};

/// Settings of a running coordinator.
#[derive(Debug, Clone)]
pub struct Settings {
    /// URLs agents use to reach this coordinator.
    pub advertise_urls: Vec<String>,
    pub heartbeat_interval: Duration,
    /// Lifetime of machine client certificates.
    pub machine_cert_ttl: Duration,
    /// Lifetime of kubeadm join tokens the coordinator mints.
    pub join_token_ttl: Duration,
    /// Period of the cluster reconcile loop when nothing wakes it earlier.
    pub reconcile_period: Duration,
    /// Health and remediation defaults; clusters may override them.
    pub health_defaults: crate::health::Policy,
}

/// A request to serve the API on one more address (a Docker network's
/// gateway), answered with the port or why not.
pub struct ListenRequest {
    pub ip: std::net::IpAddr,
    pub reply: tokio::sync::oneshot::Sender<Result<u16, String>>,
}

/// What the coordinator remembers of a machine between heartbeats without
/// writing it: a heartbeat that changes nothing costs no durable write.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    pub last_seen: OffsetDateTime,
}

/// State shared by the API handlers and the background tasks.
pub struct App {
    pub store: Store,
    pub ca: CertificateAuthority,
    pub ca_pin: CaPin,
    pub ticket_key: TicketKey,
    pub settings: Settings,
    pub liveness: Mutex<HashMap<String, Liveness>>,
    /// Wakes the cluster reconciler now instead of at its next period.
    pub reconcile_now: Notify,
    /// The Docker provider, connected on first use.
    pub docker: tokio::sync::OnceCell<crate::provider::docker::DockerProvider>,
    /// Asks the server to listen on more addresses.
    pub listen_requests: tokio::sync::mpsc::UnboundedSender<ListenRequest>,
    /// Who changed what, and when.
    pub audit: crate::audit::AuditLog,
    /// Limits registrations per source address.
    pub register_limiter: crate::ratelimit::RateLimiter,
    /// One key rotation at a time.
    pub rotation: Mutex<()>,
}

impl App {
    /// Reads a cluster with its `resourceVersion` filled in.
    pub fn cluster(&self, name: &str) -> Result<Option<Cluster>, StoreError> {
        Ok(self
            .store
            .get_json::<Cluster>(Kind::Cluster, name)?
            .map(|(mut c, rev)| {
                c.metadata.resource_version = Some(rev.to_string());
                c
            }))
    }

    /// Reads every cluster.
    pub fn clusters(&self) -> Result<Vec<Cluster>, StoreError> {
        Ok(self
            .store
            .list_json::<Cluster>(Kind::Cluster)?
            .into_iter()
            .map(|(mut c, rev)| {
                c.metadata.resource_version = Some(rev.to_string());
                c
            })
            .collect())
    }

    /// Reads a machine with its `resourceVersion` and freshest heartbeat time.
    pub fn machine(&self, name: &str) -> Result<Option<Machine>, StoreError> {
        Ok(self
            .store
            .get_json::<Machine>(Kind::Machine, name)?
            .map(|(m, rev)| self.overlay(m, rev)))
    }

    /// Reads every machine.
    pub fn machines(&self) -> Result<Vec<Machine>, StoreError> {
        Ok(self
            .store
            .list_json::<Machine>(Kind::Machine)?
            .into_iter()
            .map(|(m, rev)| self.overlay(m, rev))
            .collect())
    }

    fn overlay(&self, mut m: Machine, rev: u64) -> Machine {
        m.metadata.resource_version = Some(rev.to_string());
        if let Some(l) = self
            .liveness
            .lock()
            .expect("liveness lock")
            .get(&m.metadata.name)
        {
            if m.status.last_heartbeat_time.is_none_or(|t| t < l.last_seen) {
                m.status.last_heartbeat_time = Some(l.last_seen);
            }
        }
        m
    }

    /// Writes a machine, conditional on the revision it was read at.
    pub fn write_machine(&self, m: &Machine) -> Result<u64, StoreError> {
        let mut stored = m.clone();
        let rev = stored
            .metadata
            .resource_version
            .take()
            .and_then(|r| r.parse().ok());
        self.store
            .update_json(Kind::Machine, &m.metadata.name, &stored, rev)
    }

    /// Writes a cluster, conditional on the revision it was read at.
    pub fn write_cluster(&self, c: &Cluster) -> Result<u64, StoreError> {
        let mut stored = c.clone();
        let rev = stored
            .metadata
            .resource_version
            .take()
            .and_then(|r| r.parse().ok());
        self.store
            .update_json(Kind::Cluster, &c.metadata.name, &stored, rev)
    }

    /// When a machine last heartbeated (or the coordinator started).
    pub fn last_seen(&self, machine: &str) -> Option<OffsetDateTime> {
        self.liveness
            .lock()
            .expect("liveness lock")
            .get(machine)
            .map(|l| l.last_seen)
    }

    /// The Docker provider, connecting on first use.
    pub async fn docker(
        &self,
    ) -> Result<&crate::provider::docker::DockerProvider, crate::provider::ProviderError> {
        self.docker
            .get_or_try_init(|| async {
                // The pin identifies this installation across restarts.
                let owner = self.ca_pin.to_string();
                let owner = owner.trim_start_matches("sha256:")[..16].to_owned();
                crate::provider::docker::DockerProvider::connect(owner).await
            })
            .await
    }

    /// Whether anything in the store uses the Docker provider.
    pub fn docker_in_use(&self) -> bool {
        self.docker.initialized()
            || self.clusters().is_ok_and(|cs| {
                cs.iter()
                    .any(|c| matches!(c.spec.provider, drover_common::api::ProviderSpec::Docker(_)))
            })
    }

    /// Makes the API reachable on `ip` (at the main port), for machines on
    /// a network whose gateway that is.
    pub async fn listen_on(&self, ip: std::net::IpAddr) -> Result<u16, String> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.listen_requests
            .send(ListenRequest { ip, reply })
            .map_err(|_| "the server is shutting down".to_string())?;
        answer
            .await
            .map_err(|_| "the server is shutting down".to_string())?
    }
}

impl App {
    /// Read-modify-write of a machine with optimistic concurrency: `change`
    /// edits the freshly read machine and says whether it changed anything;
    /// a concurrent write makes it run again on the newer copy.
    pub fn update_machine<E: From<StoreError>>(
        &self,
        name: &str,
        mut change: impl FnMut(&mut Machine) -> Result<bool, E>,
    ) -> Result<Option<Machine>, E> {
        for _ in 0..16 {
            let Some(mut m) = self.machine(name)? else {
                return Ok(None);
            };
            if !change(&mut m)? {
                return Ok(Some(m));
            }
            match self.write_machine(&m) {
                Ok(rev) => {
                    m.metadata.resource_version = Some(rev.to_string());
                    return Ok(Some(m));
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(StoreError::Backend(format!(
            "machine {name} kept changing under 16 consecutive updates"
        ))
        .into())
    }

    /// Read-modify-write of a cluster, like [`App::update_machine`].
    pub fn update_cluster<E: From<StoreError>>(
        &self,
        name: &str,
        mut change: impl FnMut(&mut Cluster) -> Result<bool, E>,
    ) -> Result<Option<Cluster>, E> {
        for _ in 0..16 {
            let Some(mut c) = self.cluster(name)? else {
                return Ok(None);
            };
            if !change(&mut c)? {
                return Ok(Some(c));
            }
            match self.write_cluster(&c) {
                Ok(rev) => {
                    c.metadata.resource_version = Some(rev.to_string());
                    return Ok(Some(c));
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(StoreError::Backend(format!(
            "cluster {name} kept changing under 16 consecutive updates"
        ))
        .into())
    }
}
