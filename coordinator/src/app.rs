//! Shared coordinator state: the store, key material, settings, and the
//! in-memory heartbeat table.

use std::collections::HashMap;
use std::sync::Mutex;

use drover_common::api::{Cluster, Machine};
use drover_common::pin::CaPin;
use drover_common::pki::CertificateAuthority;
use drover_common::ticket::TicketKey;
use time::OffsetDateTime;

pub use crate::domain::liveness::Liveness;
use crate::store::{Kind, Span, Store, StoreError};

pub use crate::domain::settings::Settings;

/// A request to serve the API on one more address (a Docker network's
/// gateway), answered with the port or why not.
pub struct ListenRequest {
    pub ip: std::net::IpAddr,
    pub reply: tokio::sync::oneshot::Sender<Result<u16, ListenError>>,
}

/// Why the API is not served on one more address.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// State shared by the API handlers and the background tasks: the store
/// and what sits beside it, grouped by what it is about.
pub struct App {
    pub store: Store,
    pub settings: Settings,
    /// The coordinator's signing material.
    pub keys: Keys,
    /// What the coordinator knows of machines and clusters at run time.
    pub fleet: Fleet,
    /// The provider clients, made by the provider layer on first use.
    pub providers: crate::provider::clients::Providers,
    /// What machines and listeners ask of the coordinator.
    pub intake: Intake,
    /// Who changed what, and when.
    pub audit: crate::domain::audit::AuditLog,
    /// Every background task, with its status (`tasks` in `/v1/status`).
    pub tasks: crate::tasks::Driver,
    /// This replica and whether it leads.
    pub leadership: crate::domain::leadership::Leadership,
}

/// The coordinator's signing material: the CA that signs machine
/// certificates and config bundles, its pin, and the key of join tickets.
///
/// Invariant: loaded once at start from the store's secrets and never
/// replaced while the coordinator runs (`ca_pin` is the pin of `ca`'s
/// certificate); a rotation of what is derived from them holds `rotation`,
/// so there is one at a time.
pub struct Keys {
    pub ca: CertificateAuthority,
    pub ca_pin: CaPin,
    pub ticket_key: TicketKey,
    /// One key rotation at a time.
    pub rotation: Mutex<()>,
}

/// What the coordinator knows of machines and clusters at run time, beside
/// what the store records.
///
/// Invariant: memory only, rebuilt from the store after a start or a
/// leader change (liveness gets a fresh grace period, the datagram table
/// is refilled); nothing here is written back as it is.
pub struct Fleet {
    /// When each machine was last heard from.
    pub liveness: Mutex<HashMap<String, Liveness>>,
    /// The coordinator's own stalls, not held against machines.
    pub stalls: std::sync::Arc<crate::domain::liveness::StallClock>,
    /// The machines that may heartbeat by datagram, and their keys.
    pub datagrams: crate::domain::datagrams::DatagramTable,
    /// The cluster controller's queue and fleet index.
    pub controller: std::sync::Arc<crate::domain::controller::Controller>,
    /// Back-off of failed provider creates, per machine.
    pub provision_retries: crate::provider::retries::ProvisionRetries,
    /// The machines whose config bundle is being built or sent: one fetch
    /// per machine at a time.
    pub bundle_builds: crate::domain::bootstrap::BundleBuilds,
    /// The fleet in numbers (for `/metrics` and the web overview), kept up
    /// to date from store changes by the `fleet-summary` task.
    pub summary: crate::domain::fleet_summary::FleetSummary,
    /// The recent store changes watches replay, kept by the `change-log`
    /// task.
    pub changes: std::sync::Arc<crate::change_log::ChangeLog>,
}

/// What machines and listeners ask of the coordinator: registrations and
/// more addresses to serve the API on.
///
/// Invariant: each request goes through here in order, once: a
/// registration passes `register_limiter` before `registrar` commits it,
/// and a listen request is answered by the server on `listen_requests`.
pub struct Intake {
    /// Commits pool registrations in batches.
    pub registrar: crate::domain::registrar::Registrar,
    /// Limits registrations per source address.
    pub register_limiter: crate::domain::ratelimit::RateLimiter,
    /// Asks the server to listen on more addresses.
    pub listen_requests: tokio::sync::mpsc::UnboundedSender<ListenRequest>,
}

/// The master key of datagram heartbeat keys, derived from the ticket key
/// (which every replica holds and which never changes for an
/// installation) under a label of its own, so a heartbeat key says nothing
/// about tickets.
fn heartbeat_master(ticket_key: &TicketKey) -> [u8; 32] {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(ticket_key.as_bytes())
        .expect("HMAC takes any key length");
    mac.update(b"drover heartbeat master key v1");
    mac.finalize().into_bytes().into()
}

/// What a coordinator is made of that its caller decides; [`App::new`] adds
/// the state every coordinator starts with (empty liveness, no provider
/// clients yet, the registrar and the task set).
pub struct AppParts {
    pub store: Store,
    pub secrets: crate::domain::secrets::CoordinatorSecrets,
    pub ca_pin: CaPin,
    pub settings: Settings,
    pub leadership: crate::domain::leadership::Leadership,
    pub listen_requests: tokio::sync::mpsc::UnboundedSender<ListenRequest>,
    pub audit: crate::domain::audit::AuditLog,
    pub register_limiter: crate::domain::ratelimit::RateLimiter,
}

/// The managed-by value of the installation with CA pin `pin`: see
/// [`App::owner`].
fn owner_of(pin: &CaPin) -> String {
    let pin = pin.to_string();
    pin.trim_start_matches("sha256:")[..16].to_owned()
}

/// A cluster as read, with its `resourceVersion` filled in.
fn with_revision((mut c, rev): (Cluster, u64)) -> Cluster {
    c.metadata.resource_version = Some(rev.to_string());
    c
}

impl App {
    /// Assembles a coordinator from its parts. Needs a tokio runtime (the
    /// registrar task starts here).
    pub fn new(parts: AppParts) -> std::sync::Arc<App> {
        let tasks = crate::tasks::Driver::default();
        let registrar = crate::domain::registrar::Registrar::start(parts.store.clone(), &tasks);
        let datagrams = crate::domain::datagrams::DatagramTable::new(heartbeat_master(
            &parts.secrets.ticket_key,
        ));
        let providers = crate::provider::clients::Providers::new(owner_of(&parts.ca_pin));
        std::sync::Arc::new(App {
            store: parts.store,
            settings: parts.settings,
            keys: Keys {
                ca: parts.secrets.ca,
                ca_pin: parts.ca_pin,
                ticket_key: parts.secrets.ticket_key,
                rotation: Mutex::new(()),
            },
            fleet: Fleet {
                liveness: Mutex::new(HashMap::new()),
                stalls: Default::default(),
                datagrams,
                controller: Default::default(),
                provision_retries: Default::default(),
                bundle_builds: Default::default(),
                summary: Default::default(),
                changes: Default::default(),
            },
            providers,
            intake: Intake {
                registrar,
                register_limiter: parts.register_limiter,
                listen_requests: parts.listen_requests,
            },
            audit: parts.audit,
            tasks,
            leadership: parts.leadership,
        })
    }

    /// Reads a cluster with its `resourceVersion` filled in.
    pub fn cluster(&self, name: &str) -> Result<Option<Cluster>, StoreError> {
        Ok(self
            .store
            .get_json::<Cluster>(Kind::Cluster, name)?
            .map(with_revision))
    }

    /// Reads a cluster like [`App::cluster`], from the store's read cache.
    pub fn cluster_cached(&self, name: &str) -> Result<Option<Cluster>, StoreError> {
        Ok(self
            .store
            .get_json_cached::<Cluster>(Kind::Cluster, name)?
            .map(with_revision))
    }

    /// Calls `f` with the fleet summary; before the `fleet-summary` task's
    /// first full read (just after a start), with one made from a full
    /// read here.
    pub fn with_summary<R>(
        &self,
        f: impl FnOnce(&crate::domain::fleet_summary::FleetSummary) -> R,
    ) -> Result<R, StoreError> {
        if self.fleet.summary.is_built() {
            return Ok(f(&self.fleet.summary));
        }
        let fresh = crate::domain::fleet_summary::FleetSummary::default();
        fresh.rebuild(&self.clusters()?, &self.machines()?);
        Ok(f(&fresh))
    }

    /// Reads every cluster.
    pub fn clusters(&self) -> Result<Vec<Cluster>, StoreError> {
        self.clusters_page(Span::ALL)
    }

    /// The clusters in `span`, by name, with their `resourceVersion`s.
    pub fn clusters_page(&self, span: Span<'_>) -> Result<Vec<Cluster>, StoreError> {
        self.page(Kind::Cluster, span, with_revision)
    }

    /// The objects of `kind` in `span`, by name, each as `read` fills in
    /// what the store keeps beside its body.
    fn page<T: serde::de::DeserializeOwned>(
        &self,
        kind: Kind,
        span: Span<'_>,
        read: impl FnMut((T, u64)) -> T,
    ) -> Result<Vec<T>, StoreError> {
        Ok(self
            .store
            .list_json_page::<T>(kind, span)?
            .into_iter()
            .map(read)
            .collect())
    }

    /// Reads a machine with its `resourceVersion` and freshest heartbeat time.
    pub fn machine(&self, name: &str) -> Result<Option<Machine>, StoreError> {
        Ok(self
            .store
            .get_json::<Machine>(Kind::Machine, name)?
            .map(|(m, rev)| self.overlay(m, rev)))
    }

    /// Reads a machine like [`App::machine`], from the store's read cache
    /// (see [`crate::store::Store::get_cached`]): for authenticating machine
    /// API calls, which arrive from every machine every interval.
    pub fn machine_cached(&self, name: &str) -> Result<Option<Machine>, StoreError> {
        Ok(self
            .store
            .get_json_cached::<Machine>(Kind::Machine, name)?
            .map(|(m, rev)| self.overlay(m, rev)))
    }

    /// Reads a machine a store change announced, as of that change or
    /// later (see [`crate::store::Store::get_json_at_least`]).
    pub fn machine_at_least(
        &self,
        name: &str,
        revision: u64,
    ) -> Result<Option<Machine>, StoreError> {
        Ok(self
            .store
            .get_json_at_least::<Machine>(Kind::Machine, name, revision)?
            .map(|(m, rev)| self.overlay(m, rev)))
    }

    /// Reads every machine.
    pub fn machines(&self) -> Result<Vec<Machine>, StoreError> {
        self.machines_page(Span::ALL)
    }

    /// The machines in `span`, by name, as [`App::machines`] reads them.
    pub fn machines_page(&self, span: Span<'_>) -> Result<Vec<Machine>, StoreError> {
        self.page(Kind::Machine, span, |(m, rev)| self.overlay(m, rev))
    }

    /// One page of every cluster's snapshot records, by name.
    pub fn snapshots_page(
        &self,
        span: Span<'_>,
    ) -> Result<Vec<drover_common::api::Snapshot>, StoreError> {
        self.page(Kind::Snapshot, span, |(s, _)| s)
    }

    /// Every machine of the cluster with UID `cluster_uid`, and maybe
    /// others (callers filter on the records): from the reconciler's fleet
    /// index while this replica leads, else every machine.
    pub fn cluster_machines(&self, cluster_uid: &str) -> Result<Vec<Machine>, StoreError> {
        if self.fleet.controller.term().is_none() {
            return self.machines();
        }
        let mut out = vec![];
        for name in self.fleet.controller.index.machines_of(cluster_uid) {
            out.extend(self.machine_cached(&name)?);
        }
        Ok(out)
    }

    fn overlay(&self, mut m: Machine, rev: u64) -> Machine {
        m.metadata.resource_version = Some(rev.to_string());
        if let Some(l) = self
            .fleet
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
        let rev = self.write_object(m)?;
        self.fleet.datagrams.forget_unless_eligible(m);
        Ok(rev)
    }

    /// Writes a cluster, conditional on the revision it was read at.
    pub fn write_cluster(&self, c: &Cluster) -> Result<u64, StoreError> {
        self.write_object(c)
    }

    fn write_object<T: StoredObject>(&self, o: &T) -> Result<u64, StoreError> {
        let mut stored = o.clone();
        let rev = stored
            .meta_mut()
            .resource_version
            .take()
            .and_then(|r| r.parse().ok());
        self.store
            .update_json(T::KIND, &stored.meta_mut().name.clone(), &stored, rev)
    }

    /// Gives every machine a fresh heartbeat grace period (after a start
    /// or a leader change, when no deadline can be trusted).
    pub fn grant_grace_to_all(&self) {
        let now = drover_common::now();
        // Read first: reading machines takes the liveness lock too.
        let Ok(machines) = self.machines() else {
            return;
        };
        self.fleet.datagrams.fill(
            &machines,
            drover_common::wire::datagram::unix_micros(std::time::SystemTime::now()),
        );
        let mut live = self.fleet.liveness.lock().expect("liveness lock");
        for m in machines {
            live.insert(m.metadata.name, Liveness { last_seen: now });
        }
    }

    /// Records that `machine` was heard from at `now` (memory only).
    pub fn saw(&self, machine: &str, now: OffsetDateTime) {
        let mut live = self.fleet.liveness.lock().expect("liveness lock");
        let revived = match live.get_mut(machine) {
            Some(l) => {
                let judged = self.fleet.stalls.judged_last_seen(l.last_seen, now);
                let was_quiet = now - judged > self.settings.health_defaults.heartbeat_timeout;
                l.last_seen = now;
                was_quiet
            }
            None => {
                live.insert(machine.to_owned(), Liveness { last_seen: now });
                false
            }
        };
        drop(live);
        if revived {
            // Its cluster judged it silent, or will: it looks again now.
            self.reconcile_machine(machine);
        }
    }

    /// When a machine last heartbeated (or the coordinator started).
    pub fn last_heard(&self, machine: &str) -> Option<OffsetDateTime> {
        self.fleet
            .liveness
            .lock()
            .expect("liveness lock")
            .get(machine)
            .map(|l| l.last_seen)
    }

    /// The time to judge a machine's silence from: its last heartbeat,
    /// moved forward by the time the coordinator itself stalled since (see
    /// [`crate::domain::liveness::StallClock`]).
    pub fn last_seen(&self, machine: &str) -> Option<OffsetDateTime> {
        let heard = self.last_heard(machine)?;
        Some(
            self.fleet
                .stalls
                .judged_last_seen(heard, drover_common::now()),
        )
    }

    /// The value of the managed-by label or tag on everything this
    /// installation creates: the CA pin's first 16 hex digits, which stay
    /// the same across restarts and differ between installations.
    pub fn owner(&self) -> String {
        owner_of(&self.keys.ca_pin)
    }

    /// Whether anything in the store uses the Docker provider.
    pub fn docker_in_use(&self) -> bool {
        self.providers.docker_connected() || self.with_summary(|s| s.uses_docker()).unwrap_or(false)
    }

    /// Makes the API reachable on `ip` (at the main port), for machines on
    /// a network whose gateway that is.
    pub async fn listen_on(&self, ip: std::net::IpAddr) -> Result<u16, ListenError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.intake
            .listen_requests
            .send(ListenRequest { ip, reply })
            .map_err(|_| ListenError::ShuttingDown)?;
        answer.await.map_err(|_| ListenError::ShuttingDown)?
    }
}

/// The API objects the coordinator reads and writes with optimistic concurrency.
pub trait StoredObject: Clone + serde::Serialize {
    const KIND: Kind;
    fn meta_mut(&mut self) -> &mut drover_common::api::ObjectMeta;
}

impl StoredObject for Machine {
    const KIND: Kind = Kind::Machine;
    fn meta_mut(&mut self) -> &mut drover_common::api::ObjectMeta {
        &mut self.metadata
    }
}

impl StoredObject for Cluster {
    const KIND: Kind = Kind::Cluster;
    fn meta_mut(&mut self) -> &mut drover_common::api::ObjectMeta {
        &mut self.metadata
    }
}

impl App {
    /// Read-modify-write of a machine with optimistic concurrency: `change`
    /// edits the freshly read machine and says whether it changed anything;
    /// a concurrent write makes it run again on the newer copy.
    pub fn update_machine<E: From<StoreError>>(
        &self,
        name: &str,
        change: impl FnMut(&mut Machine) -> Result<bool, E>,
    ) -> Result<Option<Machine>, E> {
        let first = self.first_copy(|| self.machine_cached(name))?;
        let updated = self.update_object(name, first, |n| self.machine(n), change)?;
        if let Some(m) = &updated {
            self.fleet.datagrams.forget_unless_eligible(m);
        }
        Ok(updated)
    }

    /// [`App::update_machine`] starting from a copy just read (with its
    /// `resourceVersion`), so a change that turns out to change nothing
    /// costs no second read. A conflict re-reads as usual.
    pub fn update_machine_from<E: From<StoreError>>(
        &self,
        read: Machine,
        change: impl FnMut(&mut Machine) -> Result<bool, E>,
    ) -> Result<Option<Machine>, E> {
        let name = read.metadata.name.clone();
        let updated = self.update_object(&name, Some(read), |n| self.machine(n), change)?;
        if let Some(m) = &updated {
            self.fleet.datagrams.forget_unless_eligible(m);
        }
        Ok(updated)
    }

    /// Read-modify-write of a cluster, like [`App::update_machine`].
    pub fn update_cluster<E: From<StoreError>>(
        &self,
        name: &str,
        change: impl FnMut(&mut Cluster) -> Result<bool, E>,
    ) -> Result<Option<Cluster>, E> {
        let first = self.first_copy(|| self.cluster_cached(name))?;
        self.update_object(name, first, |n| self.cluster(n), change)
    }

    /// The copy a read-modify-write starts from: the cached one when the
    /// cache is known current (a SQLite store this process serves), which
    /// spares a database read and a decryption; `None` (read the backend)
    /// on etcd, where a change that sees a lagging copy might decide there
    /// is nothing to write. Either way the write is conditional on the
    /// revision read, and a conflict re-reads the backend.
    fn first_copy<T>(
        &self,
        cached: impl FnOnce() -> Result<Option<T>, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        if self.store.cache_is_current() {
            cached()
        } else {
            Ok(None)
        }
    }

    fn update_object<T: StoredObject, E: From<StoreError>>(
        &self,
        name: &str,
        mut first: Option<T>,
        read: impl Fn(&str) -> Result<Option<T>, StoreError>,
        mut change: impl FnMut(&mut T) -> Result<bool, E>,
    ) -> Result<Option<T>, E> {
        for _ in 0..16 {
            let o = match first.take() {
                Some(o) => Some(o),
                None => read(name)?,
            };
            let Some(mut o) = o else {
                return Ok(None);
            };
            if !change(&mut o)? {
                return Ok(Some(o));
            }
            match self.write_object(&o) {
                Ok(rev) => {
                    o.meta_mut().resource_version = Some(rev.to_string());
                    return Ok(Some(o));
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(StoreError::Backend(format!(
            "{} {name} kept changing under 16 consecutive updates",
            T::KIND.as_str()
        ))
        .into())
    }
}

#[cfg(test)]
impl App {
    /// A leading coordinator over a new SQLite store in `dir`, without a
    /// listener or loops: for tests of handlers and their store effects.
    /// Needs a tokio runtime (the registrar task).
    pub fn for_tests(dir: &std::path::Path) -> std::sync::Arc<App> {
        use std::sync::{Arc, RwLock};
        use std::time::Duration;
        let key = {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode([7u8; 32])
        };
        let keyring =
            crate::store::keyring::Keyring::parse(&key, crate::store::keyring::KeySource::Env)
                .unwrap();
        let store = Store::open_sqlite(&dir.join("drover.db"))
            .unwrap()
            .with_keyring(Arc::new(RwLock::new(keyring)));
        let secrets = crate::domain::secrets::load_or_init(&store).unwrap();
        let ca_pin = CaPin::from_cert_pem(&secrets.ca.cert_pem).unwrap();
        let (listen_requests, _) = tokio::sync::mpsc::unbounded_channel();
        let me = crate::types::ReplicaInfo {
            id: "127.0.0.1:1".into(),
            url: "https://127.0.0.1:1".into(),
            version: "test".into(),
            started_at: drover_common::now(),
            gateway_port: None,
            advertise_urls: vec![],
        };
        App::new(AppParts {
            store,
            secrets,
            ca_pin,
            settings: Settings {
                advertise_urls: vec!["https://127.0.0.1:1".into()],
                heartbeat_interval: Duration::from_secs(1),
                machine_cert_ttl: Duration::from_secs(3600),
                join_token_ttl: Duration::from_secs(1800),
                reconcile_period: Duration::from_secs(1),
                health_defaults: drover_planner::health::Policy::defaults(Duration::from_secs(5)),
                endpoints: crate::domain::endpoint::EndpointSettings {
                    ports: (36443, 36542),
                    bind: std::net::Ipv4Addr::LOCALHOST.into(),
                    host: "127.0.0.1".into(),
                },
                snapshot_dir: dir.join("snapshots"),
                autoscaler_address: None,
            },
            leadership: crate::domain::leadership::Leadership::sole(me),
            listen_requests,
            audit: crate::domain::audit::AuditLog::open(&dir.join("audit.log")).unwrap(),
            register_limiter: crate::domain::ratelimit::RateLimiter::new(100, 100),
        })
    }
}

impl App {
    /// Asks the cluster reconciler to reconcile every cluster now
    /// (`Task::activate` of `cluster-reconciler`): for what concerns the
    /// whole fleet, such as a new leader term. A change to one cluster or
    /// machine queues just that cluster ([`App::reconcile_cluster`],
    /// [`App::reconcile_machine`]).
    pub fn reconcile_soon(&self) {
        self.tasks.activate(crate::tasks::RECONCILER_TASK);
    }

    /// Queues cluster `name` for a reconcile now.
    pub fn reconcile_cluster(&self, name: &str) {
        self.fleet.controller.queue.add(name);
    }

    /// Queues the cluster machine `name` belongs to, if any, for a
    /// reconcile now (a report or a result of the machine was recorded).
    pub fn reconcile_machine(&self, name: &str) {
        self.fleet.controller.machine_event(name);
    }
}

impl crate::domain::bootstrap::BundleSource for App {
    fn store(&self) -> &Store {
        &self.store
    }

    fn settings(&self) -> &Settings {
        &self.settings
    }

    fn ca_key_pem(&self) -> &str {
        &self.keys.ca.key_pem
    }

    fn cluster(&self, name: &str) -> Result<Option<Cluster>, StoreError> {
        App::cluster(self, name)
    }

    fn machine(&self, name: &str) -> Result<Option<Machine>, StoreError> {
        App::machine(self, name)
    }

    fn cluster_machines(&self, cluster_uid: &str) -> Result<Vec<Machine>, StoreError> {
        App::cluster_machines(self, cluster_uid)
    }

    fn recall_to_https(&self, machine_uid: &str) {
        self.fleet.datagrams.recall(machine_uid);
    }
}
