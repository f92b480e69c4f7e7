//! The executor: applies one planned step with optimistic concurrency.

use drover_common::api::{
    push_event, set_condition, Assignment, BmcSpec, Cluster, ClusterStatus, Machine, MachinePhase,
    MachineRole, MachineSpec, MachineStatus, ObjectMeta, RebootMethod, ALIVE_CONDITION,
    CONTROL_PLANE_POOL,
};
use drover_planner::{alive_steps, Observed, Step};

use super::error::ReconcileError;
use super::provisioner;
use crate::app::App;
use crate::domain::secrets::{cluster_pki_name, ClusterPki};
use crate::provider::redfish::PowerAction;
use crate::store::{Kind, StoreError};

/// Power-cycles `machine` through its BMC for reboot request `id`, and
/// records what the BMC did: started when it accepted the reset, failed
/// (with why) when it could not be reached or refused. The machine's next
/// boot ID ends the request, as an agent's reboot's does.
async fn power_cycle(
    app: &App,
    cname: &str,
    machine: &str,
    id: &str,
    bmc: &BmcSpec,
) -> Result<(), ReconcileError> {
    let outcome = match crate::domain::bmc::connect(&app.store, bmc) {
        Ok(client) => client
            .power(PowerAction::Cycle)
            .await
            .map_err(crate::domain::bmc::BmcError::from),
        Err(e) => Err(e),
    };
    crate::metrics::global().bmc_action("cycle", outcome.is_ok());
    match &outcome {
        Ok(done) => {
            tracing::info!(cluster = %cname, %machine, bmc = %bmc.url, %done, directive = %id, "machine power-cycled through its BMC")
        }
        Err(e) => {
            tracing::warn!(cluster = %cname, %machine, bmc = %bmc.url, error = %e, directive = %id, "machine's BMC could not power-cycle it")
        }
    }
    app.update_machine::<StoreError>(machine, |m| {
        let Some(r) = m
            .status
            .reboot
            .as_mut()
            .filter(|r| r.id == id && r.in_progress())
        else {
            return Ok(false);
        };
        let (reason, message) = match &outcome {
            Ok(done) => {
                r.started_at = Some(drover_common::now());
                (
                    "RebootStarted",
                    format!("the BMC at {} reset {done} ({id})", bmc.url),
                )
            }
            Err(e) => {
                r.failed = Some(e.to_string());
                ("RebootFailed", format!("{e} ({id})"))
            }
        };
        push_event(&mut m.status.events, reason, message);
        Ok(true)
    })?;
    Ok(())
}

/// Applies one step. Each step re-reads what it changes, so a plan made from
/// slightly old objects cannot overwrite newer ones.
pub async fn execute(app: &App, cluster: &Cluster, step: &Step) -> Result<(), ReconcileError> {
    let cname = &cluster.metadata.name;
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    match step {
        Step::EnsurePki => {
            let pki = ClusterPki::generate(&uid).map_err(|source| ReconcileError::Pki {
                cluster: cname.clone(),
                source,
            })?;
            let name = cluster_pki_name(cname);
            match app.store.get_json::<ClusterPki>(Kind::Secret, &name)? {
                None => {
                    app.store.create_json(Kind::Secret, &name, &pki)?;
                }
                Some((old, rev)) if old.cluster_uid != uid => {
                    // A leftover of a deleted namesake: never reuse its CA.
                    app.store
                        .update_json(Kind::Secret, &name, &pki, Some(rev))?;
                }
                Some(_) => return Ok(()),
            }
            tracing::info!(cluster = %cname, "cluster PKI created");
        }
        Step::AllocateEndpoint => {
            let settings = &app.settings.endpoints;
            let used: std::collections::BTreeSet<u16> = app
                .clusters()?
                .iter()
                .filter(|c| c.metadata.uid != cluster.metadata.uid)
                .filter_map(|c| c.status.endpoint_port)
                .collect();
            let port = crate::domain::endpoint::allocate(settings, &used).map_err(|source| {
                ReconcileError::Endpoint {
                    cluster: cname.clone(),
                    source,
                }
            })?;
            let address = crate::domain::endpoint::address(settings, port);
            app.update_cluster::<StoreError>(cname, |c| {
                if c.metadata.uid.as_deref() != Some(uid.as_str())
                    || c.status.endpoint_port.is_some()
                {
                    return Ok(false);
                }
                c.status.endpoint_port = Some(port);
                c.status.control_plane_endpoint = Some(address.clone());
                Ok(true)
            })?;
            tracing::info!(cluster = %cname, endpoint = %address, "managed control-plane endpoint allocated");
        }
        Step::EnsureEndpoint => provisioner::ensure_endpoint(app, cluster).await?,
        Step::SetEndpointBackends { backends } => {
            provisioner::set_endpoint_backends(app, cluster, backends).await?
        }
        Step::Assign {
            machine,
            machine_pool,
            role,
            replaces,
        } => {
            let done = app.update_machine::<StoreError>(machine, |m| {
                if m.spec.assignment.is_some() || m.status.phase != MachinePhase::Registered {
                    return Ok(false);
                }
                m.metadata.generation += 1;
                m.spec.assignment = Some(Assignment {
                    cluster: cname.clone(),
                    cluster_uid: uid.clone(),
                    machine_pool: machine_pool.clone(),
                    role: *role,
                    generation: m.metadata.generation,
                    assigned_at: Some(drover_common::now()),
                    replaces: replaces.clone(),
                    kubernetes_version: Some(cluster.spec.kubernetes_version.clone()),
                    image: None,
                });
                m.status.phase = MachinePhase::Assigned;
                m.status.upgrade = None;
                push_event(
                    &mut m.status.events,
                    "Assigned",
                    format!(
                        "claimed by cluster {cname} as {role} in pool {machine_pool}{}",
                        replaces
                            .as_ref()
                            .map(|r| format!(", replacing {r}"))
                            .unwrap_or_default()
                    ),
                );
                Ok(true)
            })?;
            if done.is_some_and(|m| {
                m.spec
                    .assignment
                    .as_ref()
                    .is_some_and(|a| a.cluster_uid == uid)
            }) {
                tracing::info!(cluster = %cname, machine = %machine, pool = %machine_pool, role = %role, "machine assigned");
            }
        }
        Step::Release {
            machine,
            reason,
            remediation,
        } => take_out(app, cname, machine, reason, *remediation, Leave::Release)?,
        Step::CreateMachine {
            machine_pool,
            role,
            replaces,
        } => {
            let short = if machine_pool == CONTROL_PLANE_POOL {
                "cp"
            } else {
                machine_pool.as_str()
            };
            let name = format!("{cname}-{short}-{}", drover_common::names::random_suffix(5));
            let now = drover_common::now();
            let mut status = MachineStatus {
                phase: MachinePhase::Provisioning,
                ..Default::default()
            };
            push_event(
                &mut status.events,
                "Created",
                format!(
                    "recorded for cluster {cname}, pool {machine_pool}, role {role}{}",
                    replaces
                        .as_ref()
                        .map(|r| format!(", replacing {r}"))
                        .unwrap_or_default()
                ),
            );
            let machine = Machine {
                api_version: drover_common::API_VERSION.into(),
                kind: "Machine".into(),
                metadata: ObjectMeta {
                    name: name.clone(),
                    uid: Some(uuid::Uuid::new_v4().to_string()),
                    generation: 1,
                    creation_timestamp: Some(now),
                    labels: [
                        ("drover.dev/cluster".to_string(), cname.clone()),
                        ("drover.dev/pool".to_string(), machine_pool.clone()),
                    ]
                    .into(),
                    ..Default::default()
                },
                spec: MachineSpec {
                    bmc: None,
                    pool: String::new(),
                    provider: Some(cluster.spec.provider.name().to_owned()),
                    assignment: Some(Assignment {
                        cluster: cname.clone(),
                        cluster_uid: uid.clone(),
                        machine_pool: machine_pool.clone(),
                        role: *role,
                        generation: 1,
                        assigned_at: Some(now),
                        replaces: replaces.clone(),
                        kubernetes_version: Some(cluster.spec.kubernetes_version.clone()),
                        image: cluster.spec.provider.machine_image(machine_pool),
                    }),
                },
                status,
            };
            app.store.create_json(Kind::Machine, &name, &machine)?;
            tracing::info!(cluster = %cname, machine = %name, pool = %machine_pool, role = %role, "machine recorded");
            if *role == MachineRole::Init {
                app.update_cluster::<StoreError>(cname, |c| {
                    if c.metadata.uid.as_deref() != Some(uid.as_str()) {
                        return Ok(false);
                    }
                    c.status.init_machine = Some(name.clone());
                    Ok(true)
                })?;
            }
            if let Some(old) = replaces {
                app.update_machine::<StoreError>(old, |m| {
                    push_event(
                        &mut m.status.events,
                        "ReplacedBy",
                        format!("replaced by {name}"),
                    );
                    Ok(true)
                })?;
            }
        }
        Step::Provision { machine } => provisioner::provision(app, cluster, machine).await?,
        Step::DeleteMachine {
            machine,
            reason,
            remediation,
        } => {
            take_out(app, cname, machine, reason, *remediation, Leave::Delete)?;
            provisioner::destroy(app, cluster, machine).await?;
        }
        Step::Destroy { machine } => provisioner::destroy(app, cluster, machine).await?,
        Step::SetAlive {
            machine,
            alive,
            reason,
            message,
        } => set_alive(app, Some(cname), machine, *alive, reason, message)?,
        Step::SetNodeFound {
            machine,
            found,
            message,
        } => {
            let reason = if *found { "NodeListed" } else { "NodeMissing" };
            let condition = drover_planner::health::NODE_FOUND_CONDITION;
            if set_machine_condition(app, machine, condition, *found, reason, message)? {
                tracing::info!(cluster = %cname, %machine, found, %message, "machine's Node found or missing");
            }
        }
        Step::Reboot {
            machine,
            reason,
            method,
        } => {
            let mut asked = None;
            app.update_machine::<StoreError>(machine, |m| {
                if m.status.rebooting() {
                    return Ok(false);
                }
                let bmc = m.spec.bmc.clone();
                if *method == RebootMethod::PowerCycle && bmc.is_none() {
                    return Ok(false);
                }
                let request =
                    crate::protocol::reboot::request(m, reason, *method, drover_common::now());
                let (event, how) = match method {
                    RebootMethod::Agent => ("RebootRequested", "asked to reboot"),
                    RebootMethod::PowerCycle => {
                        ("PowerCycleRequested", "to be power-cycled through its BMC")
                    }
                };
                push_event(
                    &mut m.status.events,
                    event,
                    format!("{reason}; {how} ({})", request.id),
                );
                asked = Some((request.id.clone(), bmc));
                m.status.reboot = Some(request);
                Ok(true)
            })?;
            if let Some((id, bmc)) = asked {
                tracing::info!(cluster = %cname, %machine, %reason, ?method, directive = %id, "machine to be rebooted");
                crate::metrics::global().reboot(drover_planner::health::remediation_class(reason));
                if let (RebootMethod::PowerCycle, Some(bmc)) = (method, bmc) {
                    power_cycle(app, cname, machine, &id, &bmc).await?;
                }
            }
        }
        Step::SetUpgradeRequest { machine, request } => {
            let mut changed = false;
            app.update_machine::<StoreError>(machine, |m| {
                changed = m.status.upgrade != *request;
                m.status.upgrade.clone_from(request);
                Ok(changed)
            })?;
            if changed {
                match request {
                    Some(r) => {
                        tracing::info!(cluster = %cname, %machine, version = %r.version, command = %r.command, "machine asked to upgrade in place")
                    }
                    None => tracing::info!(cluster = %cname, %machine, "upgrade request withdrawn"),
                }
            }
        }
        Step::MarkUpgraded { machine, version } => {
            app.update_machine::<StoreError>(machine, |m| {
                let Some(a) = m.spec.assignment.as_mut() else {
                    return Ok(false);
                };
                let changed = a.kubernetes_version.as_ref() != Some(version);
                a.kubernetes_version = Some(version.clone());
                Ok(changed)
            })?;
            tracing::info!(cluster = %cname, %machine, %version, "machine upgraded in place");
        }
        Step::Forget { machine } => match app.store.delete(Kind::Machine, machine, None) {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        },
        Step::SetStatus(status) => {
            let status: &ClusterStatus = status;
            let allowed = |st: &ClusterStatus| {
                st.conditions
                    .iter()
                    .any(|c| c.type_ == "RemediationAllowed" && c.status == "True")
            };
            if !allowed(&cluster.status)
                && cluster
                    .status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "RemediationAllowed")
                && allowed(status)
            {
                grant_grace(app, &uid);
                tracing::info!(cluster = %cname, "remediation resumes; every machine gets a fresh grace period");
            }
            if let Some(why) = newly_paused(&cluster.status, status) {
                tracing::info!(cluster = %cname, reason = %why, "remediation paused");
            }
            app.update_cluster::<StoreError>(cname, |c| {
                // A restore asked for after this pass read the cluster
                // reset what the old control planes reported: the pass's
                // status would bring it back.
                if c.status.restore.is_some() && cluster.status.restore.is_none() {
                    return Ok(false);
                }
                let mut wanted: ClusterStatus = status.clone();
                wanted.etcd_members = c.status.etcd_members.clone();
                wanted.etcd_reported_by = c.status.etcd_reported_by.clone();
                wanted.etcd_reported_at = c.status.etcd_reported_at;
                wanted.nodes = c.status.nodes.clone();
                // So are the endpoint's /readyz and the kubeadm-config
                // version, which only control planes report: a report made
                // while this reconcile ran must not be undone by it (an
                // agent reports a change once, so it would stick).
                wanted.endpoint_ready = c.status.endpoint_ready;
                wanted.kubeadm_config_version = c.status.kubeadm_config_version.clone();
                // The load balancer is the endpoint steps' to record.
                wanted.load_balancer = c.status.load_balancer.clone();
                // A drain result an agent reported meanwhile, for this very
                // attempt, is kept.
                if let (Some(w), Some(stored)) = (wanted.drain.as_mut(), c.status.drain.as_ref()) {
                    if w.result.is_none()
                        && w.machine == stored.machine
                        && w.requested_at == stored.requested_at
                    {
                        w.result = stored.result.clone();
                    }
                }
                keep_addon_reports(&mut wanted, &cluster.status, &c.status);
                keep_operation_reports(&mut wanted, &cluster.status, &c.status);
                if c.metadata.uid != cluster.metadata.uid || c.status == wanted {
                    return Ok(false);
                }
                if c.status.phase != status.phase {
                    tracing::info!(cluster = %cname, from = %c.status.phase, to = %status.phase, "cluster phase changed");
                }
                // The executor may have named a new init machine meanwhile
                // (this pass's CreateMachine); a name the plan dropped on
                // purpose (its machine is gone) stays dropped.
                let init = c.status.init_machine.clone();
                let named_meanwhile = init != cluster.status.init_machine;
                // `wanted` keeps what agents reported meanwhile (etcd
                // members, Nodes, this attempt's drain result): writing the
                // plan's `status` instead would lose a drain result the
                // machine already answered, and drain it again.
                c.status = wanted;
                if c.status.init_machine.is_none() && named_meanwhile {
                    c.status.init_machine = init;
                }
                Ok(true)
            })?;
        }
        Step::StartDrill { into } => {
            let req = drover_common::api::RestoreRequest {
                into: Some(into.clone()),
                ..Default::default()
            };
            let started = crate::drills::start(
                app,
                cname,
                &req,
                "schedule",
                drover_common::api::DrillTrigger::Scheduled,
            );
            if let Err(e) = started {
                // Recorded as the drill's outcome, so that the schedule
                // waits for its next turn rather than trying every pass.
                tracing::warn!(cluster = %cname, drill = %into, error = %e, "scheduled restore drill not started");
                let now = drover_common::now();
                let done = drover_common::api::DrillDone {
                    cluster: into.clone(),
                    snapshot: String::new(),
                    revision: 0,
                    trigger: drover_common::api::DrillTrigger::Scheduled,
                    started_at: now,
                    completed_at: now,
                    ok: false,
                    message: format!("the scheduled drill into {into} did not start: {e}"),
                    inventory: None,
                };
                crate::drills::record_not_started(app, cluster, &done)?;
            }
        }
        Step::FinishDrill { done } => crate::drills::finish(app, cluster, done)?,
        Step::Finalize => {
            crate::drills::forget(app, cluster)?;
            if cluster.spec.provider.creates_machines() {
                crate::reconcile::provisioner::delete_cluster_resources(app, cluster).await?;
            }
            // Tombstones of the cluster's machines go with it.
            for m in app.cluster_machines(&uid)? {
                if m.status.phase == MachinePhase::Deleted
                    && m.spec
                        .assignment
                        .as_ref()
                        .is_some_and(|a| a.cluster_uid == uid)
                {
                    let _ = app.store.delete(Kind::Machine, &m.metadata.name, None);
                }
            }
            let rev = cluster
                .metadata
                .resource_version
                .as_ref()
                .and_then(|r| r.parse().ok());
            crate::snapshots::forget_cluster(app, cname, &uid).map_err(|e| {
                StoreError::Backend(format!("forgetting the cluster's etcd snapshots: {e}"))
            })?;
            for (kind, name) in [
                (Kind::Secret, cluster_pki_name(cname)),
                (Kind::JoinTokens, cname.clone()),
            ] {
                match app.store.delete(kind, &name, None) {
                    Ok(_) | Err(StoreError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            match app.store.delete(Kind::Cluster, cname, rev) {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            tracing::info!(cluster = %cname, "cluster deleted");
        }
    }
    Ok(())
}

/// Keeps an addon result an agent reported after the plan was made:
/// `stored` (the cluster as it is now) then differs from `planned_from`
/// (the cluster the plan saw) in its addon statuses or the apply under way,
/// and writing the plan's would bring back an apply the agent already
/// answered (and will not answer again). The next pass plans from it.
fn keep_addon_reports(
    wanted: &mut ClusterStatus,
    planned_from: &ClusterStatus,
    stored: &ClusterStatus,
) {
    if stored.addons != planned_from.addons || stored.addon_apply != planned_from.addon_apply {
        wanted.addons.clone_from(&stored.addons);
        wanted.addon_apply.clone_from(&stored.addon_apply);
    }
}

/// Keeps the results agents reported on the operations in flight after the
/// plan was made. An operation the plan left as it read it (`wanted` equals
/// `planned_from` there) but that the store holds changed (`stored`) was
/// answered meanwhile by its machine (a failed member removal, renewal or
/// version change, a step of an in-place upgrade, the kube-proxy and CoreDNS
/// upgrade): reconciles of one cluster run one at a time, so nothing else
/// writes them. Writing the plan's copy would undo the answer, which the
/// agent gives once, and the operation would wait out its whole timeout.
/// Where the plan changed an operation (a new request, a retry, the end of
/// it), the plan's stands.
fn keep_operation_reports(
    wanted: &mut ClusterStatus,
    planned_from: &ClusterStatus,
    stored: &ClusterStatus,
) {
    fn keep<T: Clone + PartialEq>(wanted: &mut T, planned_from: &T, stored: &T) {
        if *wanted == *planned_from && *stored != *planned_from {
            wanted.clone_from(stored);
        }
    }
    keep(
        &mut wanted.etcd_removal,
        &planned_from.etcd_removal,
        &stored.etcd_removal,
    );
    keep(
        &mut wanted.certificate_renewal,
        &planned_from.certificate_renewal,
        &stored.certificate_renewal,
    );
    keep(
        &mut wanted.version_update,
        &planned_from.version_update,
        &stored.version_update,
    );
    keep(
        &mut wanted.machine_upgrade,
        &planned_from.machine_upgrade,
        &stored.machine_upgrade,
    );
    keep(
        &mut wanted.essential_addons,
        &planned_from.essential_addons,
        &stored.essential_addons,
    );
    // A snapshot saved or failed meanwhile, and one asked for meanwhile.
    keep(
        &mut wanted.snapshot,
        &planned_from.snapshot,
        &stored.snapshot,
    );
    keep(
        &mut wanted.snapshot_requested_at,
        &planned_from.snapshot_requested_at,
        &stored.snapshot_requested_at,
    );
    // Only a machine's report names the last snapshot saved.
    wanted.last_snapshot.clone_from(&stored.last_snapshot);
}

/// Why remediation pauses, when `planned` pauses it and `stored` did not.
fn newly_paused(stored: &ClusterStatus, planned: &ClusterStatus) -> Option<String> {
    let paused = |st: &ClusterStatus| {
        st.conditions
            .iter()
            .find(|c| c.type_ == "RemediationAllowed" && c.status == "False")
            .map(|c| c.message.clone())
    };
    match (paused(stored), paused(planned)) {
        (None, Some(why)) => Some(why),
        _ => None,
    }
}

/// Records a machine's `Alive` condition, unless it is leaving.
pub(super) fn set_alive(
    app: &App,
    cluster: Option<&str>,
    machine: &str,
    alive: bool,
    reason: &str,
    message: &str,
) -> Result<(), StoreError> {
    if set_machine_condition(app, machine, ALIVE_CONDITION, alive, reason, message)? {
        tracing::info!(cluster = cluster.unwrap_or("-"), machine = %machine, alive, %reason, "machine liveness changed");
    }
    Ok(())
}

/// Sets condition `type_` of a machine that is not leaving; whether it
/// changed.
fn set_machine_condition(
    app: &App,
    machine: &str,
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
) -> Result<bool, StoreError> {
    let mut changed = false;
    app.update_machine::<StoreError>(machine, |m| {
        changed = !matches!(
            m.status.phase,
            MachinePhase::Releasing | MachinePhase::Deleting | MachinePhase::Deleted
        ) && set_condition(&mut m.status.conditions, type_, ok, reason, message);
        Ok(changed)
    })?;
    Ok(changed)
}

/// Keeps the `Alive` condition of machines in no cluster (pool machines
/// waiting to be claimed) true to what the coordinator sees, with the
/// coordinator's health defaults. Returns the errors met.
pub(super) fn unassigned_alive(app: &App, machines: &[Machine]) -> Vec<String> {
    let free: Vec<&Machine> = machines
        .iter()
        .filter(|m| m.spec.assignment.is_none())
        .collect();
    let last_seen = |name: &str| app.last_seen(name);
    let observed = Observed {
        now: drover_common::now(),
        has_pki: false,
        last_seen: &last_seen,
        instance: &|_| None,
        retry_not_before: &|_| None,
        policy: app.settings.health_defaults,
        heartbeat_interval: app.settings.heartbeat_interval,
    };
    let mut errors = vec![];
    for step in alive_steps(&free, &observed) {
        if let Step::SetAlive {
            machine,
            alive,
            reason,
            message,
        } = &step
        {
            if let Err(e) = set_alive(app, None, machine, *alive, reason, message) {
                let msg = format!("machine {machine}: cannot record its liveness: {e}");
                tracing::warn!(error = %msg, "reconcile step failed");
                errors.push(msg);
            }
        }
    }
    errors
}

/// Gives every machine of a cluster a fresh heartbeat grace period.
pub(super) fn grant_grace(app: &App, cluster_uid: &str) {
    let now = drover_common::now();
    let Ok(machines) = app.cluster_machines(cluster_uid) else {
        return;
    };
    let mut live = app.fleet.liveness.lock().expect("liveness lock");
    for m in machines {
        if m.spec
            .assignment
            .as_ref()
            .is_some_and(|a| a.cluster_uid == cluster_uid)
        {
            live.insert(
                m.metadata.name,
                crate::domain::liveness::Liveness { last_seen: now },
            );
        }
    }
}

/// How a machine leaves its cluster.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Leave {
    /// Back to its pool, reset by its agent.
    Release,
    /// Deleted with its instance.
    Delete,
}

/// Takes `machine` out of cluster `cname` as `how` says, unless an earlier
/// pass did, with events saying why: `reason`, or for a remediation that it
/// is unhealthy and replaced. A remediation is counted once: a pass that
/// finds it already leaving changes nothing.
fn take_out(
    app: &App,
    cname: &str,
    machine: &str,
    reason: &str,
    remediation: bool,
    how: Leave,
) -> Result<(), StoreError> {
    let mut taken = false;
    app.update_machine::<StoreError>(machine, |m| {
        let leaving = match how {
            Leave::Release => {
                m.status.phase == MachinePhase::Releasing || m.spec.assignment.is_none()
            }
            Leave::Delete => matches!(
                m.status.phase,
                MachinePhase::Deleting | MachinePhase::Deleted
            ),
        };
        if leaving {
            return Ok(false);
        }
        taken = true;
        if remediation {
            // `describe machine` says why it was taken out.
            push_event(&mut m.status.events, "Unhealthy", reason);
            let remediating = match how {
                Leave::Release => format!("taken out of cluster {cname} to be replaced; its agent resets it before it can be claimed again"),
                Leave::Delete => "deleting to replace it".to_owned(),
            };
            push_event(&mut m.status.events, "Remediating", remediating);
        } else {
            let event = match how {
                Leave::Release => "Released",
                Leave::Delete => "Deleting",
            };
            push_event(&mut m.status.events, event, reason);
        }
        match how {
            Leave::Delete => {
                m.status.phase = MachinePhase::Deleting;
                m.metadata.deletion_timestamp = Some(drover_common::now());
            }
            Leave::Release
                if m.status.phase == MachinePhase::Assigned && m.status.applied_generation == 0 =>
            {
                // The agent has not started: nothing to undo on the machine.
                crate::domain::removal::finish_leaving(m);
            }
            Leave::Release => m.status.phase = MachinePhase::Releasing,
        }
        // A scale-down's mark has done its work: back in its pool, the
        // machine serves the next cluster that claims it.
        m.metadata
            .annotations
            .remove(drover_common::names::SCALE_DOWN_ANNOTATION);
        Ok(true)
    })?;
    match how {
        Leave::Release => {
            tracing::info!(cluster = %cname, machine = %machine, %reason, remediation, "machine released")
        }
        Leave::Delete => {
            tracing::info!(cluster = %cname, machine = %machine, %reason, "machine deletion started")
        }
    }
    if remediation && taken {
        crate::metrics::global().remediation(drover_planner::health::remediation_class(reason));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::{AddonApply, AddonPhase, ClusterPhase};

    #[test]
    fn a_failure_reported_after_the_plan_is_kept_and_a_retry_of_the_plan_stands() {
        let at = drover_common::now();
        let removal = drover_common::api::EtcdRemoval {
            id: "be99668240cb5dc7".into(),
            name: "cp-1".into(),
            via: "cp-2".into(),
            reason: "member of a dead control plane".into(),
            requested_at: at,
            failed_at: None,
            error: String::new(),
        };
        // The plan saw the removal under way and kept it.
        let planned_from = ClusterStatus {
            etcd_removal: Some(removal.clone()),
            ..Default::default()
        };
        // Meanwhile the machine reported that it failed.
        let mut stored = planned_from.clone();
        let failed = drover_common::api::EtcdRemoval {
            failed_at: Some(at),
            error: "member list timed out".into(),
            ..removal.clone()
        };
        stored.etcd_removal = Some(failed.clone());
        let mut wanted = planned_from.clone();
        keep_operation_reports(&mut wanted, &planned_from, &stored);
        assert_eq!(
            wanted.etcd_removal,
            Some(failed.clone()),
            "the failure is kept, so the removal is asked again shortly"
        );
        // A plan that asked again (a new request) writes its own.
        let retry = drover_common::api::EtcdRemoval {
            requested_at: at + time::Duration::seconds(5),
            ..removal.clone()
        };
        let mut wanted = ClusterStatus {
            etcd_removal: Some(retry.clone()),
            ..Default::default()
        };
        keep_operation_reports(&mut wanted, &planned_from, &stored);
        assert_eq!(wanted.etcd_removal, Some(retry));
        // Nothing reported meanwhile: the plan's end of it is written.
        let mut wanted = ClusterStatus::default();
        keep_operation_reports(&mut wanted, &planned_from, &planned_from.clone());
        assert_eq!(wanted.etcd_removal, None);
    }

    #[test]
    fn a_pause_is_said_with_its_reason_once() {
        let remediation = |allowed: bool, reason: &str, message: &str| {
            let mut status = ClusterStatus::default();
            drover_common::api::set_condition(
                &mut status.conditions,
                "RemediationAllowed",
                allowed,
                reason,
                message,
            );
            status
        };
        let paused = remediation(false, "RemediationPaused", "workers: 2 of 2 unhealthy");
        let allowed = remediation(true, "WithinLimits", "");
        assert_eq!(
            newly_paused(&allowed, &paused).as_deref(),
            Some("workers: 2 of 2 unhealthy")
        );
        assert_eq!(newly_paused(&paused, &paused), None);
        assert_eq!(newly_paused(&paused, &allowed), None);
    }

    #[test]
    fn an_addon_result_reported_after_the_plan_is_not_overwritten() {
        let at = drover_common::now();
        let pending = drover_planner::pending_addon("cni");
        let request = AddonApply {
            addon: "cni".into(),
            hash: "image".into(),
            via: "cp".into(),
            requested_at: at,
        };
        // The plan saw the request under way and kept it.
        let planned_from = ClusterStatus {
            addons: vec![pending.clone()],
            addon_apply: Some(request.clone()),
            ..Default::default()
        };
        let mut wanted = planned_from.clone();
        // Meanwhile the agent answered: applied, the request cleared.
        let mut stored = planned_from.clone();
        stored.addon_apply = None;
        stored.addons[0].phase = AddonPhase::Applied;
        keep_addon_reports(&mut wanted, &planned_from, &stored);
        assert_eq!(wanted.addon_apply, None);
        assert_eq!(wanted.addons[0].phase, AddonPhase::Applied);
        // Nothing reported meanwhile: the plan's own change is written.
        let mut wanted = planned_from.clone();
        wanted.addon_apply = None;
        keep_addon_reports(&mut wanted, &planned_from, &planned_from.clone());
        assert_eq!(wanted.addon_apply, None);
        let mut wanted = ClusterStatus {
            addon_apply: Some(request),
            ..Default::default()
        };
        keep_addon_reports(
            &mut wanted,
            &ClusterStatus::default(),
            &ClusterStatus::default(),
        );
        assert!(wanted.addon_apply.is_some());
    }

    /// A control plane answers a drain between a pass's read of the cluster
    /// and its status write: the answer survives the write, so the machine
    /// is not drained a second time (CI on e5e632b drained a worker twice,
    /// 90 s apart, because the write dropped the first answer).
    #[tokio::test]
    async fn a_drain_answer_recorded_during_a_pass_survives_its_status_write() {
        use crate::store::{Kind, StoreError};
        use drover_common::api::{DrainResult, NodeDrain};
        let dir = tempfile::tempdir().unwrap();
        let app = crate::app::App::for_tests(dir.path());
        let at = time::OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let mut c = drover_planner::fixtures::pool_cluster(1, 1);
        c.status.drain = Some(NodeDrain {
            machine: "w".into(),
            node: "w".into(),
            via: "cp".into(),
            started_at: at,
            requested_at: at,
            result: None,
        });
        app.store.create_json(Kind::Cluster, "c", &c).unwrap();
        let read_by_the_pass = app.cluster("c").unwrap().unwrap();
        app.update_cluster::<StoreError>("c", |c| {
            c.status.drain.as_mut().unwrap().result = Some(DrainResult {
                ok: true,
                message: "evicted 2 pods".into(),
            });
            Ok(true)
        })
        .unwrap();
        let mut status = read_by_the_pass.status.clone();
        status.phase = ClusterPhase::Provisioning;
        execute(&app, &read_by_the_pass, &Step::SetStatus(Box::new(status)))
            .await
            .unwrap();
        let stored = app.cluster("c").unwrap().unwrap().status;
        assert_eq!(
            stored.phase,
            ClusterPhase::Provisioning,
            "the pass's own change is written"
        );
        assert_eq!(
            stored.drain.and_then(|d| d.result),
            Some(DrainResult {
                ok: true,
                message: "evicted 2 pods".into()
            }),
            "the answer recorded meanwhile is kept"
        );
    }

    /// A scheduled drill starts as a manual one does, marked scheduled; one
    /// that cannot start (its name is taken) is recorded as the last drill,
    /// failed, so that the schedule waits for its next turn.
    #[tokio::test]
    async fn a_scheduled_drill_starts_or_records_why_it_could_not() {
        use drover_common::api::DrillTrigger;
        let dir = tempfile::tempdir().unwrap();
        let app = crate::app::App::for_tests(dir.path());
        let c = crate::cluster_restore::tests::with_snapshot(&app, "v1.31.2");
        app.store
            .create_json(
                Kind::Secret,
                &cluster_pki_name("c"),
                &ClusterPki::generate("cu").unwrap(),
            )
            .unwrap();
        let start = Step::StartDrill {
            into: "c-drill".into(),
        };
        execute(&app, &c, &start).await.unwrap();
        let drilled = app.cluster("c").unwrap().unwrap();
        let under_way = drilled.status.drill.expect("a drill under way");
        assert_eq!(under_way.cluster, "c-drill");
        assert_eq!(under_way.trigger, DrillTrigger::Scheduled);
        let d = app.cluster("c-drill").unwrap().unwrap();
        assert_eq!(
            d.status.drill_of.map(|o| o.trigger),
            Some(DrillTrigger::Scheduled)
        );

        // Its drill cluster gone by hand, and the name taken meanwhile.
        app.update_cluster::<StoreError>("c", |c| {
            c.status.drill = None;
            Ok(true)
        })
        .unwrap();
        let c = app.cluster("c").unwrap().unwrap();
        execute(&app, &c, &start).await.unwrap();
        let last = app.cluster("c").unwrap().unwrap().status.last_drill;
        let last = last.expect("the failed start recorded");
        assert!(!last.ok);
        assert!(
            last.message.contains("did not start") && last.message.contains("exists already"),
            "{}",
            last.message
        );
    }
}
