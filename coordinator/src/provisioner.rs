//! The executor's provider side: turning recorded machines into containers
//! (or instances), deleting them, and observing what exists.

use std::collections::HashMap;

use drover_common::api::{push_event, Cluster, MachinePhase, ProviderSpec};
use drover_common::ticket::{new_nonce, TicketClaims, TicketGrant};
use drover_common::wire::{BootstrapDocument, BOOTSTRAP_KIND};

use crate::app::App;
use crate::provider::docker::{DockerProvider, COORDINATOR_HOST};
use crate::provider::{InstanceState, MachineRequest, ProviderError};
use crate::reconcile::ReconcileError;
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
    let ProviderSpec::Docker(spec) = &cluster.spec.provider else {
        return Ok(());
    };
    let docker = app.docker().await?;
    let cluster_uid = cluster.metadata.uid.clone().unwrap_or_default();
    let network = docker
        .ensure_network(&cluster.metadata.name, &cluster_uid)
        .await?;
    let port = app
        .listen_on(network.gateway)
        .await
        .map_err(|detail| ProviderError::Failed {
            provider: "docker",
            action: "listen on the gateway of",
            object: format!("docker network {}", network.name),
            detail,
        })?;
    let machine_uid = m.metadata.uid.clone().unwrap_or_default();
    let now = drover_common::now();
    let policy = crate::health::Policy::for_cluster(cluster, app.settings.health_defaults);
    let ttl = time::Duration::try_from(policy.startup_timeout)
        .unwrap_or(time::Duration::minutes(10))
        + TICKET_SLACK;
    let ticket = app.ticket_key.sign(&TicketClaims {
        grant: TicketGrant::Machine {
            cluster: cluster.metadata.name.clone(),
            machine: machine.to_owned(),
            machine_uid: machine_uid.clone(),
            role: m
                .spec
                .assignment
                .as_ref()
                .map(|a| a.role)
                .unwrap_or(drover_common::api::MachineRole::Worker),
        },
        issued_at: now.unix_timestamp(),
        expires_at: (now + ttl).unix_timestamp(),
        nonce: new_nonce(),
    });
    let doc = BootstrapDocument {
        api_version: drover_common::API_VERSION.into(),
        kind: BOOTSTRAP_KIND.into(),
        coordinators: vec![format!("https://{COORDINATOR_HOST}:{port}")],
        ca_pin: app.ca_pin.clone(),
        ticket,
    };
    let req = MachineRequest {
        cluster: cluster.metadata.name.clone(),
        cluster_uid,
        machine: machine.to_owned(),
        machine_uid,
        user_data: doc.to_yaml(),
        image: spec.image.clone(),
    };
    let result = docker.create(&req, &network).await;
    match result {
        Ok(id) => {
            app.update_machine::<StoreError>(machine, |m| {
                if m.status.provider_id.as_deref() == Some(id.as_str()) {
                    return Ok(false);
                }
                m.status.provider_id = Some(id.clone());
                set_provider_condition(m, true, "Created", "");
                push_event(
                    &mut m.status.events,
                    "ProviderCreated",
                    format!(
                        "container {} created on network {}",
                        short(&id),
                        network.name
                    ),
                );
                Ok(true)
            })?;
            Ok(())
        }
        Err(e) => {
            let msg = e.to_string();
            app.update_machine::<StoreError>(machine, |m| {
                Ok(set_provider_condition(m, false, "CreateFailed", &msg))
            })?;
            Err(e.into())
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
    if let ProviderSpec::Docker(_) = &cluster.spec.provider {
        app.docker()
            .await?
            .delete(&cluster.metadata.name, machine)
            .await?;
    }
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

/// The state of every provider machine, by machine UID.
pub async fn observe(app: &App) -> Result<HashMap<String, InstanceState>, ProviderError> {
    let docker = app.docker().await?;
    Ok(docker
        .list()
        .await?
        .into_iter()
        .filter_map(|pm| pm.machine_uid().map(|u| (u.to_owned(), pm.state)))
        .collect())
}

/// Removes provider objects the store does not know: containers whose
/// machine is not recorded (or only as a tombstone), and networks of
/// clusters that no longer exist. Returns what it removed.
pub async fn sweep(app: &App) -> Result<Vec<String>, ReconcileError> {
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
        let known = pm.machine_uid().is_some_and(|uid| {
            machines.iter().any(|m| {
                m.metadata.uid.as_deref() == Some(uid) && m.status.phase != MachinePhase::Deleted
            })
        });
        if !known {
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
        if app.docker_in_use() {
            match sweep(&app).await {
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
