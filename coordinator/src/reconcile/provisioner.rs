//! The executor's provider side: turning recorded machines into containers
//! (or instances), deleting them, and observing what exists.

use std::collections::HashMap;

use drover_common::api::{push_event, Cluster, Machine, MachinePhase, ProviderSpec};
use drover_common::ticket::{TicketClaims, TicketGrant};
use drover_common::wire::{BootstrapDocument, BOOTSTRAP_KIND};
use futures_util::future::BoxFuture;

use crate::app::App;
use crate::domain::replicas::gateway_urls;
use crate::provider::metered::Metered;
pub use crate::provider::InstanceCheckError;
use crate::provider::{
    CloudErrorClass, CreateHost, HostError, InstanceState, Managed, Provider, ProviderError,
    LABEL_CLUSTER_UID, LABEL_MACHINE_UID,
};
use crate::reconcile::error::ReconcileError;
use crate::store::StoreError;

/// How long a machine ticket lives beyond the startup timeout.
const TICKET_SLACK: time::Duration = time::Duration::minutes(5);

/// Creates the provider machine for a recorded machine. Idempotent.
pub async fn provision(app: &App, cluster: &Cluster, machine: &str) -> Result<(), ReconcileError> {
    let Some(m) = app.machine(machine)? else {
        return Ok(());
    };
    if m.status.provider_id.is_some() || m.status.phase != MachinePhase::Provisioning {
        return Ok(());
    }
    let Some(provider) = provider_for(app, &cluster.spec.provider).await else {
        // A pool machine is a host its operator registers: nothing to create.
        return Ok(());
    };
    let host = Host {
        app,
        cluster,
        machine: &m,
    };
    let result = provider.create(&host).await;
    match result {
        Ok(created) => {
            app.fleet.provision_retries.succeeded(machine);
            app.update_machine::<StoreError>(machine, |m| {
                if m.status.provider_id.as_deref() == Some(created.provider_id.as_str()) {
                    return Ok(false);
                }
                m.status.provider_id = Some(created.provider_id.clone());
                m.status.node_provider_id = created.node_provider_id.clone();
                set_provider_condition(m, true, "Created", "");
                push_event(
                    &mut m.status.events,
                    "ProviderCreated",
                    created.message.clone(),
                );
                Ok(true)
            })?;
            Ok(())
        }
        Err(e) => {
            let class = e.class();
            let (attempt, delay) = app.fleet.provision_retries.failed(
                machine,
                cluster.metadata.generation,
                class,
                drover_common::now(),
            );
            let msg = format!(
                "{e}; attempt {attempt}, next in {}s{}",
                delay.as_secs().max(1),
                if class == CloudErrorClass::InvalidConfiguration {
                    " or as soon as the cluster spec changes"
                } else {
                    ""
                }
            );
            tracing::warn!(cluster = %cluster.metadata.name, machine, attempt, retry_in_s = delay.as_secs(), reason = class.reason(), error = %e, "provider create failed");
            app.update_machine::<StoreError>(machine, |m| {
                Ok(set_provider_condition(m, false, class.reason(), &msg))
            })?;
            Err(e.into())
        }
    }
}

/// The machine's bootstrap document: its single-use ticket and where to
/// redeem it. Deterministic for a machine (issued at its creation, with its
/// UID as nonce), so a retried create sends byte-identical user data, which
/// EC2's client-token idempotency requires.
fn bootstrap_document(
    app: &App,
    cluster: &Cluster,
    m: &Machine,
    coordinators: Vec<String>,
) -> BootstrapDocument {
    let machine_uid = m.metadata.uid.clone().unwrap_or_default();
    let issued = m
        .metadata
        .creation_timestamp
        .unwrap_or_else(drover_common::now);
    let policy = drover_planner::health::Policy::for_cluster(cluster, app.settings.health_defaults);
    let ttl = time::Duration::try_from(policy.startup_timeout)
        .unwrap_or(time::Duration::minutes(10))
        + TICKET_SLACK;
    let ticket = app.keys.ticket_key.sign(&TicketClaims {
        grant: TicketGrant::Machine {
            cluster: cluster.metadata.name.clone(),
            machine: m.metadata.name.clone(),
            machine_uid: machine_uid.clone(),
            role: m
                .spec
                .assignment
                .as_ref()
                .map(|a| a.role)
                .unwrap_or(drover_common::api::MachineRole::Worker),
        },
        issued_at: issued.unix_timestamp(),
        expires_at: (issued + ttl).unix_timestamp(),
        nonce: machine_uid,
    });
    BootstrapDocument {
        api_version: drover_common::API_VERSION.into(),
        kind: BOOTSTRAP_KIND.into(),
        coordinators,
        ca_pin: app.keys.ca_pin.clone(),
        ticket,
    }
}

/// The coordinator URLs of a docker machine's bootstrap document: this
/// replica's listener on the cluster network's gateway (at `own_port`)
/// first, then that of every other replica known to the registry, down
/// ones included until [`crate::domain::replicas::REPLICA_RETENTION`]
/// (each serves every cluster network's gateway at its own `gatewayPort`),
/// so the machine reaches whichever replica leads after a fail-over. The
/// agent moves on to the next URL on a refused connection or a follower's
/// 421, and its heartbeat answers name the list again when it changes.
async fn docker_coordinator_urls(app: &App, own_port: u16) -> Result<Vec<String>, StoreError> {
    let replicas = crate::leader::known_replicas(app).await?;
    Ok(gateway_urls(own_port, &replicas))
}

/// How often every replica checks that it listens on the gateway of every
/// docker cluster's network (besides at start and on every role change).
pub const GATEWAY_CHECK_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// Opens this replica's listener on the gateway of every existing network
/// of a docker cluster in the store (a no-op for those it serves already):
/// the machines of clusters made before a restart, or by another replica,
/// reach it only there. Never creates a network. Returns the gateways
/// served; a cluster whose network cannot be read or served is logged and
/// the others are still served.
pub async fn restore_gateway_listeners(app: &App) -> Result<Vec<std::net::IpAddr>, ReconcileError> {
    // From the fleet summary: a fleet without docker clusters costs no
    // read of every cluster each period.
    let clusters = app.with_summary(|s| s.docker_clusters())?;
    if clusters.is_empty() {
        return Ok(vec![]);
    }
    let docker = app.providers.docker().await?;
    let mut served = vec![];
    for (name, uid) in &clusters {
        let network = match docker.find_network(name, uid).await {
            Ok(Some(n)) => n,
            // Not made yet (provisioning makes it) or already removed.
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(cluster = %name, error = %e, "cannot read the cluster's docker network; its machines may not reach this coordinator");
                continue;
            }
        };
        match app.listen_on(network.gateway).await {
            Ok(_) => served.push(network.gateway),
            Err(detail) => {
                tracing::warn!(cluster = %name, network = %network.name, gateway = %network.gateway, error = %detail, "cannot listen on the gateway of the cluster's docker network; its machines cannot reach this coordinator");
            }
        }
    }
    Ok(served)
}

/// The `gateway-listeners` task: keeps this replica listening on every
/// docker cluster network's gateway: at once, whenever its role changes (a
/// new leader must be reachable before machines give up), and every period
/// (networks another replica made, a Docker engine that was down). Runs on
/// every replica, leader or not: a follower answers machines with 421,
/// which sends the agent on to the next URL as fast as a refusal, and
/// serves at once if it is elected.
pub struct GatewayListeners {
    app: std::sync::Arc<App>,
    role: tokio::sync::watch::Receiver<crate::domain::leadership::Role>,
}

impl GatewayListeners {
    pub fn new(app: std::sync::Arc<App>) -> Self {
        Self {
            role: app.leadership.changes(),
            app,
        }
    }
}

impl crate::tasks::BackgroundTask for GatewayListeners {
    async fn activate(&mut self, _: crate::tasks::Wake) -> crate::tasks::Outcome {
        // serve.rs logs every listener it opens.
        let restored = restore_gateway_listeners(&self.app).await;
        if let Err(e) = &restored {
            tracing::warn!(error = %e, "cannot restore the listeners on docker cluster networks");
        }
        restored.map(|_| ()).into()
    }

    /// A change of role.
    async fn watch(&mut self) {
        if self.role.changed().await.is_err() {
            std::future::pending::<()>().await
        }
    }
}

fn set_provider_condition(
    m: &mut drover_common::api::Machine,
    ok: bool,
    reason: &str,
    message: &str,
) -> bool {
    let changed = drover_common::api::set_condition(
        &mut m.status.conditions,
        "ProviderReady",
        ok,
        reason,
        message,
    );
    if changed && !ok {
        push_event(&mut m.status.events, reason, message.to_owned());
    }
    changed
}

/// Deletes a machine marked Deleting through its provider and leaves a
/// tombstone. Idempotent.
pub async fn destroy(app: &App, cluster: &Cluster, machine: &str) -> Result<(), ReconcileError> {
    let Some(m) = app.machine(machine)? else {
        return Ok(());
    };
    if m.status.phase != MachinePhase::Deleting {
        return Ok(());
    }
    // A pool machine's host stays with its operator: only the record goes.
    if let Some(provider) = provider_for(app, &cluster.spec.provider).await {
        provider.destroy(cluster, &m).await?;
    }
    app.fleet.provision_retries.succeeded(machine);
    app.fleet
        .liveness
        .lock()
        .expect("liveness lock")
        .remove(machine);
    app.update_machine::<StoreError>(machine, |m| {
        if m.status.phase == MachinePhase::Deleted {
            return Ok(false);
        }
        m.status.phase = MachinePhase::Deleted;
        push_event(
            &mut m.status.events,
            "Deleted",
            "removed through its provider",
        );
        Ok(true)
    })?;
    tracing::info!(cluster = %cluster.metadata.name, machine, "machine deleted");
    Ok(())
}

/// Makes the cluster's control-plane load balancer at its provider unless
/// it exists, and records it as the cluster's endpoint.
pub async fn ensure_endpoint(app: &App, cluster: &Cluster) -> Result<(), ReconcileError> {
    let name = &cluster.metadata.name;
    let Some(provider) = provider_for(app, &cluster.spec.provider).await else {
        return Ok(());
    };
    if let Some(recorded) = &cluster.status.load_balancer {
        return restore_endpoint(app, cluster, provider.as_ref(), recorded).await;
    }
    let Some(lb) = provider.ensure_endpoint(cluster).await? else {
        return Err(crate::provider::ProviderError::Failed {
            provider: cluster.spec.provider.name(),
            action: "make the control-plane endpoint of",
            object: format!("cluster {name}"),
            detail: "the provider keeps no endpoint".into(),
        }
        .into());
    };
    let uid = cluster.metadata.uid.clone();
    let mut recorded = false;
    app.update_cluster::<StoreError>(name, |c| {
        if c.metadata.uid != uid || c.status.load_balancer.is_some() {
            return Ok(false);
        }
        recorded = true;
        c.status.control_plane_endpoint = Some(lb.address.clone());
        c.status.load_balancer = Some(drover_common::api::LoadBalancerStatus {
            address: lb.address.clone(),
            id: lb.id.clone(),
            backends: vec![],
        });
        Ok(true)
    })?;
    if recorded {
        tracing::info!(cluster = %name, endpoint = %lb.address, load_balancer = %lb.id, "control-plane load balancer made");
    }
    Ok(())
}

/// Brings back a cluster's load balancer that stopped, was paused or was
/// removed: the provider starts, unpauses or re-creates it; it must come
/// back at the recorded address (the API server's certificate and every
/// kubeconfig name it), and gets its backends again (a re-created one has
/// none).
async fn restore_endpoint(
    app: &App,
    cluster: &Cluster,
    provider: &dyn crate::provider::Provider,
    recorded: &drover_common::api::LoadBalancerStatus,
) -> Result<(), ReconcileError> {
    let name = &cluster.metadata.name;
    let Some(lb) = provider.ensure_endpoint(cluster).await? else {
        return Ok(());
    };
    if lb.address != recorded.address {
        return Err(crate::provider::ProviderError::Failed {
            provider: cluster.spec.provider.name(),
            action: "restore the control-plane endpoint of",
            object: format!("cluster {name}"),
            detail: format!(
                "load balancer {} came back at {} but the cluster's certificates and kubeconfigs name {}; \
                 free that address on the cluster's network (another container may hold it) and remove {} so it is made again",
                lb.id, lb.address, recorded.address, lb.id
            ),
        }
        .into());
    }
    if !recorded.backends.is_empty() {
        let Some(pki) = crate::domain::secrets::load_pki(&app.store, cluster)? else {
            return Ok(());
        };
        let config = drover_common::wire::LoadBalancerConfig {
            ca_pem: pki.ca.cert_pem.clone(),
            backends: recorded.backends.clone(),
        };
        provider.set_endpoint_backends(cluster, &config).await?;
    }
    tracing::warn!(cluster = %name, load_balancer = %lb.id, endpoint = %lb.address, "control-plane load balancer was down; restored");
    Ok(())
}

/// Points the cluster's load balancer at `backends` and records them. The
/// coordinator's own endpoint (pool clusters) has no provider to tell: the
/// record is what every replica's proxy forwards to, so it is made here
/// the first time.
pub async fn set_endpoint_backends(
    app: &App,
    cluster: &Cluster,
    backends: &[String],
) -> Result<(), ReconcileError> {
    let name = &cluster.metadata.name;
    match provider_for(app, &cluster.spec.provider).await {
        Some(provider) => {
            let Some(pki) = crate::domain::secrets::load_pki(&app.store, cluster)? else {
                return Ok(());
            };
            let config = drover_common::wire::LoadBalancerConfig {
                ca_pem: pki.ca.cert_pem.clone(),
                backends: backends.to_vec(),
            };
            provider.set_endpoint_backends(cluster, &config).await?;
        }
        None if cluster.spec.endpoint_managed_by_coordinator() => {}
        None => return Ok(()),
    }
    let uid = cluster.metadata.uid.clone();
    app.update_cluster::<StoreError>(name, |c| {
        if c.metadata.uid != uid {
            return Ok(false);
        }
        let mut changed = false;
        if c.status.load_balancer.is_none() && c.spec.endpoint_managed_by_coordinator() {
            if let Some(address) = c.status.control_plane_endpoint.clone() {
                c.status.load_balancer = Some(drover_common::api::LoadBalancerStatus {
                    address,
                    id: crate::proxy::LOAD_BALANCER_ID.into(),
                    backends: vec![],
                });
                changed = true;
            }
        }
        let Some(lb) = c.status.load_balancer.as_mut() else {
            return Ok(false);
        };
        changed |= lb.backends != backends;
        lb.backends = backends.to_vec();
        Ok(changed)
    })?;
    tracing::info!(cluster = %name, ?backends, "control-plane endpoint backends set");
    Ok(())
}

/// Deletes what a cluster owns at its provider beyond machines (its network).
pub async fn delete_cluster_resources(app: &App, cluster: &Cluster) -> Result<(), ReconcileError> {
    // A pool cluster owns nothing at a provider.
    if let Some(provider) = provider_for(app, &cluster.spec.provider).await {
        provider.delete_cluster_resources(cluster).await?;
    }
    Ok(())
}

/// The state of every provider machine, by machine UID, from every
/// provider (and AWS region) the clusters use. A provider that cannot be
/// listed is reported in the errors and its machines stay unknown (never
/// "gone"), so a cloud outage does not look like dead machines.
pub async fn observe(
    app: &App,
    clusters: &[Cluster],
) -> (HashMap<String, InstanceState>, Vec<ProviderError>) {
    let mut states = HashMap::new();
    let mut errors = vec![];
    let add = |states: &mut HashMap<String, InstanceState>,
               list: Vec<crate::provider::ProviderMachine>| {
        for pm in list {
            if let Some(uid) = pm.machine_uid() {
                // EC2 lists terminated instances for a while; a live one for
                // the same machine wins.
                let entry = states.entry(uid.to_owned()).or_insert(pm.state);
                if *entry == InstanceState::Stopped {
                    *entry = pm.state;
                }
            }
        }
    };
    let docker = clusters
        .iter()
        .any(|c| matches!(c.spec.provider, ProviderSpec::Docker(_)));
    for provider in providers_in_use(app, docker, aws_regions_of(clusters)).await {
        match provider.list().await {
            Ok(list) => add(&mut states, list),
            Err(e) => errors.push(e),
        }
        match provider.endpoint_states().await {
            Ok(list) => {
                for (uid, state) in list {
                    states.insert(crate::provider::endpoint_key(&uid), state);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if docker && errors.is_empty() {
        // A docker cluster whose recorded load balancer was not listed has
        // lost it (removed): as good as stopped.
        for c in clusters {
            if let (ProviderSpec::Docker(_), Some(_), Some(uid)) = (
                &c.spec.provider,
                &c.status.load_balancer,
                c.metadata.uid.as_deref(),
            ) {
                states
                    .entry(crate::provider::endpoint_key(uid))
                    .or_insert(InstanceState::Stopped);
            }
        }
    }
    (states, errors)
}

/// Removes provider objects the store does not know: containers whose
/// machine is not recorded (or only as a tombstone), and networks of
/// clusters that no longer exist. Returns what it removed.
pub async fn sweep(app: &App) -> Result<Vec<String>, ReconcileError> {
    let mut removed = vec![];
    // Which providers to list comes from the fleet summary, so a fleet of
    // pool clusters costs no read of every cluster each sweep.
    let docker = app.docker_in_use();
    let regions = app.with_summary(|s| s.aws_regions())?;
    for provider in providers_in_use(app, docker, regions).await {
        // List the provider first: a machine is recorded before its
        // container or instance is created, so everything listed here has
        // its record in the store read next, unless it is an orphan.
        let managed = provider.managed().await?;
        let machines = app.machines()?;
        let clusters = app.clusters()?;
        for object in &managed {
            let orphan = match object {
                Managed::Machine { gone, labels, .. } => {
                    !gone
                        && !machine_known(
                            &machines,
                            labels.get(LABEL_MACHINE_UID).map(String::as_str),
                        )
                }
                Managed::ClusterResource { labels, .. } => {
                    let uid = labels.get(LABEL_CLUSTER_UID);
                    !clusters.iter().any(|c| {
                        c.metadata.uid.as_ref() == uid && c.spec.provider.creates_machines()
                    })
                }
            };
            if orphan {
                removed.extend(provider.remove_orphan(object).await?);
            }
        }
    }
    Ok(removed)
}

/// Whether a provider object labelled with this machine UID belongs to a
/// machine the store knows (and has not deleted).
fn machine_known(machines: &[Machine], uid: Option<&str>) -> bool {
    uid.is_some_and(|uid| {
        machines.iter().any(|m| {
            m.metadata.uid.as_deref() == Some(uid) && m.status.phase != MachinePhase::Deleted
        })
    })
}

/// The `orphan-sweeper` task: while this replica leads, each run removes
/// what the providers hold for machines and clusters that are gone.
pub struct Sweeper(pub std::sync::Arc<App>);

impl crate::tasks::BackgroundTask for Sweeper {
    async fn activate(&mut self, _: crate::tasks::Wake) -> crate::tasks::Outcome {
        let Some(term) = self.0.leadership.term() else {
            return crate::tasks::Outcome::Idle;
        };
        match crate::store::fenced(term, sweep(&self.0)).await {
            Ok(r) => {
                if !r.is_empty() {
                    tracing::info!(removed = ?r, "orphan sweep");
                }
                crate::tasks::Outcome::Done
            }
            Err(e) => {
                tracing::warn!(error = %e, "orphan sweep failed");
                crate::tasks::Outcome::Failed(crate::tasks::TaskError::new(e))
            }
        }
    }
}

/// Checks that a machine ticket is presented from the machine the provider
/// created for it. On `aws`: the instance ID the agent read from instance
/// metadata must be the instance launched for the machine, running, and
/// carry this coordinator's tags for the machine's UID. Other providers have
/// nothing to check.
pub async fn verify_instance(
    app: &App,
    cluster: &Cluster,
    m: &Machine,
    reported: Option<&str>,
) -> Result<(), InstanceCheckError> {
    match provider_for(app, &cluster.spec.provider).await {
        // A pool machine is a host its operator vouches for: its ticket is
        // the whole check.
        None => Ok(()),
        Some(provider) => provider.verify_instance(m, reported).await,
    }
}

// ---- The one place that names the providers built into this coordinator.
// Everything above goes through the `Provider` trait; a new provider is a
// module under `provider/` and an arm here.

/// The provider of a cluster's spec, or `None` for a `pool` cluster: its
/// machines are hosts an operator registers, which no provider creates,
/// deletes, lists or checks, so the pool path does none of that.
pub async fn provider_for<'a>(app: &'a App, spec: &ProviderSpec) -> Option<Box<dyn Provider + 'a>> {
    match spec {
        ProviderSpec::Pool(_) => None,
        ProviderSpec::Docker(_) => Some(Box::new(Metered {
            name: "docker",
            inner: app.providers.docker_engine(),
        })),
        #[cfg(feature = "aws")]
        ProviderSpec::Aws(spec) => Some(Box::new(Metered {
            name: "aws",
            inner: app.providers.aws(&spec.region).await,
        })),
        #[cfg(not(feature = "aws"))]
        ProviderSpec::Aws(_) => Some(Box::new(crate::provider::NotBuilt { provider: "aws" })),
    }
}

/// The providers to observe or sweep: Docker if `docker` says so, and every
/// AWS region in `aws_regions` (those the clusters at hand use) or that
/// this coordinator has launched in since it started (a deleted cluster
/// may have left instances).
async fn providers_in_use<'a>(
    app: &'a App,
    docker: bool,
    aws_regions: std::collections::BTreeSet<String>,
) -> Vec<Box<dyn Provider + 'a>> {
    let mut providers: Vec<Box<dyn Provider + 'a>> = vec![];
    if docker {
        providers.push(Box::new(Metered {
            name: "docker",
            inner: app.providers.docker_engine(),
        }));
    }
    #[cfg(feature = "aws")]
    {
        let mut regions = app.providers.aws_regions();
        regions.extend(aws_regions);
        for region in regions {
            providers.push(Box::new(Metered {
                name: "aws",
                inner: app.providers.aws(&region).await,
            }));
        }
    }
    #[cfg(not(feature = "aws"))]
    let _ = aws_regions;
    providers
}

/// The AWS regions `clusters` use.
fn aws_regions_of(clusters: &[Cluster]) -> std::collections::BTreeSet<String> {
    clusters
        .iter()
        .filter_map(|c| match &c.spec.provider {
            ProviderSpec::Aws(a) => Some(a.region.clone()),
            _ => None,
        })
        .collect()
}

/// What the providers ask of the coordinator while creating one machine.
struct Host<'a> {
    app: &'a App,
    cluster: &'a Cluster,
    machine: &'a Machine,
}

impl CreateHost for Host<'_> {
    fn cluster(&self) -> &Cluster {
        self.cluster
    }

    fn machine(&self) -> &Machine {
        self.machine
    }

    fn bootstrap_document(&self, coordinators: Vec<String>) -> String {
        bootstrap_document(self.app, self.cluster, self.machine, coordinators).to_yaml()
    }

    fn advertise_urls(&self) -> Vec<String> {
        self.app.settings.advertise_urls.clone()
    }

    fn listen_on(&self, gateway: std::net::IpAddr) -> BoxFuture<'_, Result<u16, HostError>> {
        Box::pin(async move { self.app.listen_on(gateway).await.map_err(HostError::new) })
    }

    fn gateway_urls(&self, own_port: u16) -> BoxFuture<'_, Result<Vec<String>, HostError>> {
        Box::pin(async move {
            docker_coordinator_urls(self.app, own_port)
                .await
                .map_err(HostError::new)
        })
    }

    fn failure_domains_in_use(&self) -> Result<Vec<String>, HostError> {
        let m = self.machine;
        let pool_of = |o: &Machine| {
            o.spec
                .assignment
                .as_ref()
                .map(|a| (a.cluster_uid.clone(), a.machine_pool.clone()))
        };
        let machines = self.app.machines().map_err(HostError::new)?;
        Ok(machines
            .iter()
            .filter(|o| o.metadata.name != m.metadata.name)
            .filter(|o| o.status.phase != MachinePhase::Deleted)
            .filter(|o| pool_of(o) == pool_of(m))
            .filter_map(|o| o.status.failure_domain.clone())
            .collect())
    }

    fn record_failure_domain(&self, chosen: &str) -> Result<(), HostError> {
        self.app
            .update_machine::<StoreError>(&self.machine.metadata.name, |m| {
                if m.status.failure_domain.as_deref() == Some(chosen) {
                    return Ok(false);
                }
                m.status.failure_domain = Some(chosen.to_owned());
                Ok(true)
            })
            .map(drop)
            .map_err(HostError::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::retries::ProvisionRetries;

    #[test]
    fn docker_machines_get_every_replicas_gateway_url_this_one_first() {
        let replica = |id: &str, port: Option<u16>| crate::types::ReplicaInfo {
            id: id.into(),
            url: format!("https://{id}"),
            version: "0.1.0".into(),
            started_at: drover_common::now(),
            gateway_port: port,
            advertise_urls: vec![],
        };
        // The registry lists replicas by id, this one among them.
        let registry = [
            replica("10.0.0.1:7443", Some(7443)),
            replica("10.0.0.1:7444", Some(7444)),
            replica("10.0.0.1:7445", None),
            replica("10.0.0.1:7446", Some(7446)),
        ];
        assert_eq!(
            gateway_urls(7444, &registry),
            [
                "https://drover-coordinator:7444",
                "https://drover-coordinator:7443",
                "https://drover-coordinator:7446",
            ]
        );
        // Alone, or the registry not listing this replica yet.
        assert_eq!(gateway_urls(7443, &[]), ["https://drover-coordinator:7443"]);
        // An announcement from a replica that predates gatewayPort parses.
        let old: crate::types::ReplicaInfo = serde_json::from_str(
            r#"{"id":"a:1","url":"https://a:1","version":"0.0.9","startedAt":"2026-01-01T00:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!(old.gateway_port, None);
    }

    #[test]
    fn retries_back_off_exponentially_and_reset_on_a_new_spec() {
        let r = ProvisionRetries::default();
        let now = drover_common::now();
        assert_eq!(r.not_before("m", 1), None);
        let mut last = std::time::Duration::ZERO;
        for n in 1..=4 {
            let (attempt, delay) = r.failed("m", 1, CloudErrorClass::Throttled, now);
            assert_eq!(attempt, n);
            // 2 s doubling, ±20 %: each delay is above the last.
            assert!(delay > last, "{delay:?} after {last:?}");
            last = delay;
            assert_eq!(r.not_before("m", 1), Some(now + delay));
        }
        // Never beyond the class's ceiling (plus jitter).
        for _ in 0..20 {
            let (_, delay) = r.failed("m", 1, CloudErrorClass::Throttled, now);
            assert!(delay <= std::time::Duration::from_secs(144), "{delay:?}");
        }
        // A new cluster generation is tried at once and counts afresh.
        assert_eq!(r.not_before("m", 2), None);
        assert_eq!(r.failed("m", 2, CloudErrorClass::Throttled, now).0, 1);
        r.succeeded("m");
        assert_eq!(r.not_before("m", 2), None);
    }
}
