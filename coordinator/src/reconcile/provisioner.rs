//! The executor's provider side: turning recorded machines into containers
//! (or instances), deleting them, and observing what exists.

use std::collections::HashMap;

use drover_common::api::{push_event, Cluster, Machine, MachinePhase, ProviderSpec};
use drover_common::ticket::{TicketClaims, TicketGrant};
use drover_common::wire::{BootstrapDocument, BOOTSTRAP_KIND};

use crate::app::App;
use crate::provider::docker::{DockerProvider, COORDINATOR_HOST};
use crate::provider::{CloudErrorClass, InstanceState, MachineRequest, ProviderError};
use crate::reconcile::error::ReconcileError;
use crate::store::StoreError;

/// How long a machine ticket lives beyond the startup timeout.
const TICKET_SLACK: time::Duration = time::Duration::minutes(5);

/// What a successful create reports.
struct Created {
    provider_id: String,
    /// The `ProviderCreated` event's message.
    message: String,
}

/// Creates the provider machine for a recorded machine. Idempotent.
pub async fn provision(app: &App, cluster: &Cluster, machine: &str) -> Result<(), ReconcileError> {
    let Some(m) = app.machine(machine)? else {
        return Ok(());
    };
    if m.status.provider_id.is_some() || m.status.phase != MachinePhase::Provisioning {
        return Ok(());
    }
    let result = match &cluster.spec.provider {
        ProviderSpec::Pool(_) => return Ok(()),
        ProviderSpec::Docker(spec) => provision_docker(app, cluster, &m, &spec.image).await,
        #[cfg(feature = "aws")]
        ProviderSpec::Aws(spec) => provision_aws(app, cluster, &m, spec).await,
        #[cfg(not(feature = "aws"))]
        ProviderSpec::Aws(_) => Err(ProviderError::NotBuilt { provider: "aws" }),
    };
    match result {
        Ok(created) => {
            app.provision_retries.succeeded(machine);
            app.update_machine::<StoreError>(machine, |m| {
                if m.status.provider_id.as_deref() == Some(created.provider_id.as_str()) {
                    return Ok(false);
                }
                m.status.provider_id = Some(created.provider_id.clone());
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
            let (attempt, delay) = app.provision_retries.failed(
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
    let policy = crate::domain::health::Policy::for_cluster(cluster, app.settings.health_defaults);
    let ttl = time::Duration::try_from(policy.startup_timeout)
        .unwrap_or(time::Duration::minutes(10))
        + TICKET_SLACK;
    let ticket = app.ticket_key.sign(&TicketClaims {
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
        ca_pin: app.ca_pin.clone(),
        ticket,
    }
}

fn machine_request(
    cluster: &Cluster,
    m: &Machine,
    user_data: String,
    image: &str,
) -> MachineRequest {
    MachineRequest {
        cluster: cluster.metadata.name.clone(),
        cluster_uid: cluster.metadata.uid.clone().unwrap_or_default(),
        machine: m.metadata.name.clone(),
        machine_uid: m.metadata.uid.clone().unwrap_or_default(),
        user_data,
        image: image.to_owned(),
    }
}

async fn provision_docker(
    app: &App,
    cluster: &Cluster,
    m: &Machine,
    image: &str,
) -> Result<Created, ProviderError> {
    let docker = app.docker().await?;
    let cluster_uid = cluster.metadata.uid.clone().unwrap_or_default();
    let network = docker
        .ensure_network(&cluster.metadata.name, &cluster_uid)
        .await?;
    let port = app
        .listen_on(network.gateway)
        .await
        .map_err(|e| ProviderError::Failed {
            provider: "docker",
            action: "listen on the gateway of",
            object: format!("docker network {}", network.name),
            detail: e.to_string(),
        })?;
    let coordinators =
        docker_coordinator_urls(app, port)
            .await
            .map_err(|e| ProviderError::Failed {
                provider: "docker",
                action: "list the coordinator replicas for",
                object: format!("machine {}", m.metadata.name),
                detail: e.to_string(),
            })?;
    let doc = bootstrap_document(app, cluster, m, coordinators);
    let req = machine_request(cluster, m, doc.to_yaml(), image);
    let id = docker.create(&req, &network).await?;
    Ok(Created {
        message: format!(
            "container {} created on network {}",
            short(&id),
            network.name
        ),
        provider_id: id,
    })
}

/// The coordinator URLs of a docker machine's bootstrap document: this
/// replica's listener on the cluster network's gateway (at `own_port`)
/// first, then that of every other replica in the registry (each serves
/// every cluster network's gateway at its own `gatewayPort`), so the
/// machine reaches whichever replica leads after a fail-over. The agent
/// moves on to the next URL on a refused connection or a follower's 421.
async fn docker_coordinator_urls(app: &App, own_port: u16) -> Result<Vec<String>, StoreError> {
    let replicas = crate::leader::replicas(app).await?;
    Ok(gateway_urls(own_port, replicas.iter().map(|(r, _)| r)))
}

/// `https://drover-coordinator:PORT` for `own_port` first, then for every
/// replica that announced a gateway port, each port once. A replica that
/// predates `gatewayPort` serves no gateway but the ones it provisioned on,
/// so it is left out.
fn gateway_urls<'a>(
    own_port: u16,
    replicas: impl IntoIterator<Item = &'a crate::types::ReplicaInfo>,
) -> Vec<String> {
    let mut ports = vec![own_port];
    for r in replicas {
        if let Some(p) = r.gateway_port.filter(|p| !ports.contains(p)) {
            ports.push(p);
        }
    }
    ports
        .into_iter()
        .map(|p| format!("https://{COORDINATOR_HOST}:{p}"))
        .collect()
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
    let clusters: Vec<Cluster> = app
        .clusters()?
        .into_iter()
        .filter(|c| matches!(c.spec.provider, ProviderSpec::Docker(_)))
        .collect();
    if clusters.is_empty() {
        return Ok(vec![]);
    }
    let docker = app.docker().await?;
    let mut served = vec![];
    for c in &clusters {
        let name = &c.metadata.name;
        let uid = c.metadata.uid.as_deref().unwrap_or_default();
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

/// Keeps this replica listening on every docker cluster network's gateway:
/// at once, whenever its role changes (a new leader must be reachable
/// before machines give up), and every `period` (networks another replica
/// made, a Docker engine that was down). Runs on every replica, leader or
/// not: a follower answers machines with 421, which sends the agent on to
/// the next URL as fast as a refusal, and serves at once if it is elected.
pub async fn run_gateway_listeners(
    app: std::sync::Arc<App>,
    period: std::time::Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut role = app.leadership.changes();
    loop {
        match restore_gateway_listeners(&app).await {
            // serve.rs logs every listener it opens.
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot restore the listeners on docker cluster networks")
            }
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            Ok(()) = role.changed() => {}
            _ = tokio::time::sleep(period) => {}
        }
    }
}

#[cfg(feature = "aws")]
async fn provision_aws(
    app: &App,
    cluster: &Cluster,
    m: &Machine,
    spec: &drover_common::aws::AwsProviderSpec,
) -> Result<Created, ProviderError> {
    use crate::provider::aws::{choose_subnet, user_data, Launch};
    let pool = m
        .spec
        .assignment
        .as_ref()
        .map(|a| a.machine_pool.clone())
        .unwrap_or_default();
    let template = spec.template(&pool).ok_or_else(|| ProviderError::Failed {
        provider: "aws",
        action: "find the machine template for",
        object: format!("machine {}", m.metadata.name),
        detail: format!("spec.provider.aws has no template for pool {pool}"),
    })?;
    // Record the subnet before the launch: a retried launch must send the
    // same parameters under the same client token.
    let subnet = match m
        .status
        .failure_domain
        .clone()
        .filter(|s| template.subnets.contains(s))
    {
        Some(s) => s,
        None => {
            let machines = app.machines().map_err(|e| ProviderError::Failed {
                provider: "aws",
                action: "choose a subnet for",
                object: format!("machine {}", m.metadata.name),
                detail: e.to_string(),
            })?;
            let in_use: Vec<&str> = machines
                .iter()
                .filter(|o| o.metadata.name != m.metadata.name)
                .filter(|o| o.status.phase != MachinePhase::Deleted)
                .filter(|o| {
                    o.spec
                        .assignment
                        .as_ref()
                        .map(|a| (&a.cluster_uid, &a.machine_pool))
                        == m.spec
                            .assignment
                            .as_ref()
                            .map(|a| (&a.cluster_uid, &a.machine_pool))
                })
                .filter_map(|o| o.status.failure_domain.as_deref())
                .collect();
            let chosen = choose_subnet(template, &in_use)
                .unwrap_or_default()
                .to_owned();
            app.update_machine::<StoreError>(&m.metadata.name, |m| {
                if m.status.failure_domain.as_deref() == Some(chosen.as_str()) {
                    return Ok(false);
                }
                m.status.failure_domain = Some(chosen.clone());
                Ok(true)
            })
            .map_err(|e| ProviderError::Failed {
                provider: "aws",
                action: "record the subnet of",
                object: format!("machine {}", m.metadata.name),
                detail: e.to_string(),
            })?;
            chosen
        }
    };
    let doc = bootstrap_document(app, cluster, m, app.settings.advertise_urls.clone());
    let req = machine_request(
        cluster,
        m,
        user_data(&cluster.metadata.name, &m.metadata.name, &doc.to_yaml()),
        &template.ami,
    );
    let aws = app.aws(&spec.region).await;
    let id = aws
        .create(&Launch {
            machine: &req,
            template,
            subnet: &subnet,
            tags: spec.tags_for(template),
        })
        .await?;
    Ok(Created {
        message: format!(
            "instance {id} launched in {subnet} ({}, {}, region {})",
            template.ami, template.instance_type, spec.region
        ),
        provider_id: id,
    })
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

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
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
    match &cluster.spec.provider {
        ProviderSpec::Pool(_) => {}
        ProviderSpec::Docker(_) => {
            app.docker()
                .await?
                .delete(&cluster.metadata.name, machine)
                .await?
        }
        #[cfg(feature = "aws")]
        ProviderSpec::Aws(spec) => {
            app.aws(&spec.region)
                .await
                .delete_machine(
                    m.metadata.uid.as_deref().unwrap_or_default(),
                    m.status.provider_id.as_deref(),
                )
                .await?
        }
        #[cfg(not(feature = "aws"))]
        ProviderSpec::Aws(_) => return Err(ProviderError::NotBuilt { provider: "aws" }.into()),
    }
    app.provision_retries.succeeded(machine);
    app.liveness.lock().expect("liveness lock").remove(machine);
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

/// Deletes what a cluster owns at its provider beyond machines (its network).
pub async fn delete_cluster_resources(app: &App, cluster: &Cluster) -> Result<(), ReconcileError> {
    if let ProviderSpec::Docker(_) = &cluster.spec.provider {
        app.docker()
            .await?
            .delete_network(&cluster.metadata.name)
            .await?;
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
    let mut add = |list: Vec<crate::provider::ProviderMachine>| {
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
    if clusters
        .iter()
        .any(|c| matches!(c.spec.provider, ProviderSpec::Docker(_)))
    {
        match async { app.docker().await?.list().await }.await {
            Ok(list) => add(list),
            Err(e) => errors.push(e),
        }
    }
    #[cfg(feature = "aws")]
    for region in aws_regions(app, clusters) {
        match app.aws(&region).await.list().await {
            Ok(list) => add(list),
            Err(e) => errors.push(e),
        }
    }
    (states, errors)
}

/// Every region an `aws` cluster uses now, or that this coordinator has
/// launched in since it started (a deleted cluster may have left instances).
#[cfg(feature = "aws")]
fn aws_regions(app: &App, clusters: &[Cluster]) -> std::collections::BTreeSet<String> {
    let mut regions = app.aws_regions();
    for c in clusters {
        if let ProviderSpec::Aws(a) = &c.spec.provider {
            regions.insert(a.region.clone());
        }
    }
    regions
}

/// Removes provider objects the store does not know: containers whose
/// machine is not recorded (or only as a tombstone), and networks of
/// clusters that no longer exist. Returns what it removed.
pub async fn sweep(app: &App) -> Result<Vec<String>, ReconcileError> {
    let mut removed = vec![];
    if app.docker_in_use() {
        removed.extend(sweep_docker(app).await?);
    }
    #[cfg(feature = "aws")]
    {
        let clusters = app.clusters()?;
        for region in aws_regions(app, &clusters) {
            removed.extend(sweep_aws(app, &region).await?);
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

/// Terminates instances of this coordinator that no known machine owns.
#[cfg(feature = "aws")]
async fn sweep_aws(app: &App, region: &str) -> Result<Vec<String>, ReconcileError> {
    let aws = app.aws(region).await;
    // Instances first, then the store: a machine is recorded before its
    // instance is launched.
    let instances = aws.instances().await?;
    let machines = app.machines()?;
    let mut removed = vec![];
    for i in instances {
        if matches!(i.state_name.as_str(), "terminated" | "shutting-down")
            || machine_known(
                &machines,
                i.tags
                    .get(crate::provider::LABEL_MACHINE_UID)
                    .map(String::as_str),
            )
        {
            continue;
        }
        aws.terminate(&i.instance_id).await?;
        tracing::warn!(instance = %i.instance_id, region, tags = ?i.tags, "orphan instance terminated");
        removed.push(format!("instance {} ({region})", i.instance_id));
    }
    Ok(removed)
}

async fn sweep_docker(app: &App) -> Result<Vec<String>, ReconcileError> {
    let docker: DockerProvider = app.docker().await?.clone();
    // List the provider first: a machine is recorded before its container is
    // created, so every container listed here has its record in the store
    // read next, unless it is an orphan.
    let containers = docker.list().await?;
    let networks = docker.list_networks().await?;
    let machines = app.machines()?;
    let clusters = app.clusters()?;
    let mut removed = vec![];
    for pm in containers {
        if !machine_known(&machines, pm.machine_uid()) {
            docker.remove_container(&pm.provider_id).await?;
            tracing::warn!(container = %short(&pm.provider_id), labels = ?pm.labels, "orphan container removed");
            removed.push(format!("container {}", short(&pm.provider_id)));
        }
    }
    for net in networks {
        let uid = net.labels.get(crate::provider::LABEL_CLUSTER_UID);
        let known = clusters
            .iter()
            .any(|c| c.metadata.uid.as_ref() == uid && c.spec.provider.creates_machines());
        if !known {
            match docker.remove_network(&net.name).await {
                Ok(()) => {
                    tracing::warn!(network = %net.name, "orphan network removed");
                    removed.push(format!("network {}", net.name));
                }
                // Still in use by containers removed above: next sweep.
                Err(e) => {
                    tracing::info!(network = %net.name, error = %e, "orphan network not removed yet")
                }
            }
        }
    }
    Ok(removed)
}

/// Runs the orphan sweeper every `period` until shutdown.
pub async fn run_sweeper(
    app: std::sync::Arc<App>,
    period: std::time::Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        if let Some(term) = app.leadership.term() {
            match crate::store::fenced(term, sweep(&app)).await {
                Ok(r) if !r.is_empty() => tracing::info!(removed = ?r, "orphan sweep"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "orphan sweep failed"),
            }
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(period) => {}
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
    match &cluster.spec.provider {
        ProviderSpec::Pool(_) | ProviderSpec::Docker(_) => Ok(()),
        #[cfg(feature = "aws")]
        ProviderSpec::Aws(spec) => verify_aws_instance(app, spec, m, reported).await,
        #[cfg(not(feature = "aws"))]
        ProviderSpec::Aws(_) => {
            let _ = (app, m, reported);
            Err(InstanceCheckError::Refused(
                ProviderError::NotBuilt { provider: "aws" }.to_string(),
            ))
        }
    }
}

#[cfg(feature = "aws")]
async fn verify_aws_instance(
    app: &App,
    spec: &drover_common::aws::AwsProviderSpec,
    m: &Machine,
    reported: Option<&str>,
) -> Result<(), InstanceCheckError> {
    use InstanceCheckError::{Refused, Unavailable};
    let name = &m.metadata.name;
    let uid = m.metadata.uid.as_deref().unwrap_or_default();
    let Some(reported) = reported else {
        return Err(Refused(format!(
            "machine {name} runs on EC2 but the agent reported no instance ID; it must read its bootstrap document from instance metadata (IMDSv2), not a file"
        )));
    };
    if let Some(launched) = m.status.provider_id.as_deref() {
        if launched != reported {
            return Err(Refused(format!(
                "the ticket of machine {name} belongs to instance {launched}, but it was presented from instance {reported}"
            )));
        }
    }
    let facts = app
        .aws(&spec.region)
        .await
        .describe(reported)
        .await
        .map_err(|e| Unavailable(format!("cannot check instance {reported}: {e}")))?
        .ok_or_else(|| {
            Refused(format!(
                "instance {reported} does not exist in region {}",
                spec.region
            ))
        })?;
    let tag = |k: &str| facts.tags.get(k).map(String::as_str);
    if tag(crate::provider::LABEL_MANAGED) != Some(app.owner().as_str())
        || tag(crate::provider::LABEL_MACHINE_UID) != Some(uid)
    {
        return Err(Refused(format!(
            "instance {reported} was not launched by this coordinator for machine {name} (its {} tag is {:?})",
            crate::provider::LABEL_MACHINE_UID,
            tag(crate::provider::LABEL_MACHINE_UID)
        )));
    }
    match facts.state {
        InstanceState::Running => Ok(()),
        InstanceState::Pending => Err(Unavailable(format!(
            "instance {reported} is still pending; retry when it runs"
        ))),
        InstanceState::Stopped | InstanceState::Paused => Err(Refused(format!(
            "instance {reported} is {}; only a running instance may register",
            facts.state_name
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::retries::ProvisionRetries;

    #[test]
    fn docker_machines_get_every_replicas_gateway_url_this_one_first() {
        let replica = |id: &str, port: Option<u16>| crate::types::ReplicaInfo {
            id: id.into(),
            url: format!("https://{id}"),
            version: "0.1.0".into(),
            started_at: drover_common::now(),
            gateway_port: port,
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
