//! The IO around the machine protocol core ([`crate::protocol`]), in the
//! one place both edges call: the HTTPS handlers (`http/machine.rs`) and
//! the datagram receiver (`heartbeat_udp.rs`).
//!
//! Here the machine and its cluster are read (from the read cache where a
//! request arrives from every machine every interval), the core's changes
//! are written with the store's optimistic concurrency (re-applied to a
//! fresher copy when a concurrent write wins), registrations are rate
//! limited, liveness is marked, and what happened is logged and wakes the
//! reconciler. Signing and store writes run on blocking threads.
//!
//! Invariant: a machine call changes the store only through a change of
//! the core applied here; every failure is a [`MachineCallError`], which
//! the HTTP edge turns into a problem document in one place.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use drover_common::api::{Cluster, Machine};
use drover_common::pki::{CertInfo, PkiError};
use drover_common::ticket::TicketGrant;
use drover_common::wire::datagram::{unix_micros, Verdict, ANSWER_LEN};
use drover_common::wire::status_digest;
use drover_common::wire::{
    DirectiveResult, HeartbeatRequest, HeartbeatResponse, RegisterRequest, RegisterResponse,
    RenewResponse,
};
use time::OffsetDateTime;

use crate::app::App;
use crate::domain::bootstrap::BootstrapError;
use crate::domain::datagrams::{Refusal, Stored};
use crate::domain::jointokens::ClusterJoinTokens;
use crate::domain::registrar::{PoolRegistration, RegistrationError};
use crate::protocol::heartbeat::{self, ClusterRecord};
use crate::protocol::identity::{self, AuthError, IssueError, Issued};
use crate::protocol::operations::Reported;
use crate::protocol::register::{self, RegisterError, TicketFor};
use crate::protocol::renewal::{self, RenewError, Renewal};
use crate::protocol::{config, view};
use crate::reconcile::provisioner::{verify_instance, InstanceCheckError};
use crate::store::{Kind, Modify, StoreError};

/// Why a machine call failed.
#[derive(Debug, thiserror::Error)]
pub enum MachineCallError {
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Register(#[from] RegisterError),
    #[error(transparent)]
    Renew(#[from] RenewError),
    #[error(transparent)]
    Issue(#[from] IssueError),
    #[error(transparent)]
    Registration(#[from] RegistrationError),
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The machine went while its call was served.
    #[error("machine {machine} was deleted")]
    Deleted { machine: String },
    /// Another config fetch of the machine is being served.
    #[error(
        "a config fetch with the identity of machine {machine} is being served; \
         one is served at a time per machine: ask again after Retry-After"
    )]
    ConfigBusy { machine: String, retry_after: u64 },
    #[error("{0}")]
    Encode(#[from] serde_json::Error),
    #[error(transparent)]
    Snapshot(#[from] crate::snapshots::SnapshotCallError),
    #[error(transparent)]
    Inventory(#[from] crate::drills::InventoryError),
}

type Result<T, E = MachineCallError> = std::result::Result<T, E>;

/// The heartbeat interval machines are told.
fn interval(app: &App) -> u64 {
    app.settings.heartbeat_interval.as_secs().max(1)
}

// ---------------------------------------------------------------- identity

/// The machine a call's verified client certificate (`presented`, as the
/// TLS layer parsed it) belongs to. From the read cache, like the rest of a
/// quiet heartbeat: a deletion or revocation written by any replica is seen
/// at the next request.
pub fn authenticate(app: &App, presented: Option<&Result<CertInfo, PkiError>>) -> Result<Machine> {
    let info = identity::identify(presented, drover_common::now())?;
    let stored = app.machine_cached(&info.common_name)?;
    Ok(identity::admit(&info.common_name, stored)?)
}

/// Issues machine `name` a certificate for `csr_pem`, off the async workers.
async fn issue(app: &Arc<App>, csr_pem: String, name: String) -> Result<Issued> {
    let app = app.clone();
    Ok(crate::store::blocking(move || {
        identity::issue(&app.keys.ca, &csr_pem, &name, app.settings.machine_cert_ttl)
    })
    .await?)
}

// ---------------------------------------------------------------- register

/// Redeems a registration ticket presented from `from` for a client
/// certificate.
pub async fn register(
    app: &Arc<App>,
    from: IpAddr,
    req: RegisterRequest,
) -> Result<RegisterResponse> {
    if let Err(wait) = app
        .intake
        .register_limiter
        .check(from, std::time::Instant::now())
    {
        tracing::warn!(source = %from, "registration rate limit hit");
        return Err(RegisterError::RateLimited { from, wait }.into());
    }
    // The facts are checked before anything logs them: a refused host
    // name never reaches the log.
    register::check_facts(&req.facts)?;
    let now = drover_common::now();
    let claims = app
        .keys
        .ticket_key
        .verify(&req.ticket, now.unix_timestamp())
        .map_err(|e| {
            tracing::warn!(error = %e, hostname = ?req.facts.hostname, source = %from, "registration refused");
            RegisterError::Ticket(e)
        })?;
    match claims.grant {
        TicketGrant::PoolRegistration {
            token_id,
            pool,
            token_uid,
        } => register_pool_machine(app, req, &token_id, token_uid, &pool, now).await,
        TicketGrant::Machine {
            cluster,
            machine,
            machine_uid,
            role,
        } => {
            let ticket = TicketFor {
                cluster: &cluster,
                machine: &machine,
                machine_uid: &machine_uid,
                role,
            };
            register_created_machine(app, &req, ticket).await
        }
    }
}

/// The answer to a registration of machine `name` (UID `uid`).
fn registered(app: &App, name: String, uid: String, issued: Issued) -> RegisterResponse {
    RegisterResponse {
        machine_name: name,
        machine_uid: uid,
        certificate_pem: issued.cert.cert_pem,
        not_after: issued.cert.not_after,
        coordinator_ca_pem: app.keys.ca.cert_pem.clone(),
        heartbeat_interval_seconds: interval(app),
    }
}

/// A registration into pool `pool` with token `token_id`: a new machine.
async fn register_pool_machine(
    app: &Arc<App>,
    req: RegisterRequest,
    token_id: &str,
    token_uid: Option<String>,
    pool: &str,
    now: OffsetDateTime,
) -> Result<RegisterResponse> {
    let name = format!("{pool}-{}", drover_common::names::random_suffix(6));
    let uid = uuid::Uuid::new_v4().to_string();
    let issued = issue(app, req.csr_pem.clone(), name.clone()).await?;
    let machine = register::pool_machine(&name, &uid, pool, token_id, &req.facts, &issued, now);
    // Redeeming the token and creating the machine commit together, in a
    // batch with the registrations arriving meanwhile (see `registrar.rs`).
    app.intake
        .registrar
        .register(PoolRegistration {
            token_id: token_id.to_owned(),
            token_uid,
            machine,
            now,
        })
        .await?;
    app.saw(&name, now);
    tracing::info!(machine = %name, pool = %pool, token = %token_id, hostname = %req.facts.hostname, "machine registered");
    app.reconcile_machine(&name);
    Ok(registered(app, name, uid, issued))
}

/// Logs a replayed ticket, which is refused.
fn logged(
    refused: Result<(), RegisterError>,
    machine: &str,
    hostname: &str,
) -> Result<(), RegisterError> {
    if let Err(RegisterError::Replayed { .. }) = &refused {
        tracing::warn!(machine, hostname, "replayed machine ticket refused");
    }
    refused
}

/// Registration of a machine the coordinator created: the ticket names the
/// machine; redeeming it is recorded on the machine in the same write that
/// stores its facts, so it works once.
async fn register_created_machine(
    app: &Arc<App>,
    req: &RegisterRequest,
    ticket: TicketFor<'_>,
) -> Result<RegisterResponse> {
    let (cluster, machine) = (ticket.cluster, ticket.machine);
    let hostname = &req.facts.hostname;
    let gone = || RegisterError::MachineGone {
        machine: machine.to_owned(),
        cluster: cluster.to_owned(),
    };
    let now = drover_common::now();
    let current = app.machine(machine)?.ok_or_else(gone)?;
    logged(ticket.redeemable_by(&current), machine, hostname)?;
    let owner = app
        .cluster(cluster)?
        .ok_or_else(|| RegisterError::ClusterGone {
            cluster: cluster.to_owned(),
            machine: machine.to_owned(),
        })?;
    if let Err(e) = verify_instance(app, &owner, &current, req.facts.instance_id.as_deref()).await {
        return Err(match e {
            InstanceCheckError::Refused(why) => {
                tracing::warn!(machine, cluster, instance = ?req.facts.instance_id, reason = %why, "registration from the wrong instance refused");
                RegisterError::WrongInstance(why)
            }
            InstanceCheckError::Unavailable(why) => RegisterError::InstanceUnchecked(why),
        }
        .into());
    }
    let issued = issue(app, req.csr_pem.clone(), machine.to_owned()).await?;
    // The write is conditional on the revision read: of two concurrent
    // redemptions, the second finds the ticket redeemed when it reads the
    // machine again. Another change of the machine (the reconciler's) only
    // makes the redemption read it again.
    let redeem = {
        let app = app.clone();
        let (cluster, machine, machine_uid, role) = (
            cluster.to_owned(),
            machine.to_owned(),
            ticket.machine_uid.to_owned(),
            ticket.role,
        );
        let facts = req.facts.clone();
        let issued = issued.clone();
        move || {
            let ticket = TicketFor {
                cluster: &cluster,
                machine: &machine,
                machine_uid: &machine_uid,
                role,
            };
            app.update_machine_from(current, |m| {
                logged(
                    ticket.redeem(m, &facts, &issued, now),
                    &machine,
                    &facts.hostname,
                )?;
                Ok::<bool, MachineCallError>(true)
            })
        }
    };
    crate::store::blocking(redeem).await?.ok_or_else(gone)?;
    app.saw(machine, now);
    tracing::info!(machine, cluster, hostname = %req.facts.hostname, "created machine registered");
    app.reconcile_machine(machine);
    Ok(registered(
        app,
        machine.to_owned(),
        ticket.machine_uid.to_owned(),
        issued,
    ))
}

// ---------------------------------------------------------------- heartbeat

/// Takes a heartbeat of `machine` (as authenticated): records liveness and
/// what changed, and answers with the assignment and directives.
pub async fn heartbeat(
    app: &Arc<App>,
    machine: Machine,
    mut hb: HeartbeatRequest,
) -> Result<HeartbeatResponse> {
    // Bounded before anything compares or stores it (see `bound`).
    hb.bound();
    let now = drover_common::now();
    app.saw(&machine.metadata.name, now);
    if heartbeat::is_quiet(&machine, &hb) {
        // The steady state: nothing to record, nothing read from the store
        // (the machine came from its read cache), no durable write.
        return answer(app, &machine, &hb, now);
    }
    let app = app.clone();
    crate::store::blocking(move || {
        let updated = record_heartbeat(&app, machine, &hb, now)?;
        answer(&app, &updated, &hb, now)
    })
    .await
}

/// Records what a heartbeat changed (blocking: it writes the store): the
/// join tokens it registered, its cluster's status, then the machine.
/// Returns the machine as written.
fn record_heartbeat(
    app: &App,
    machine: Machine,
    hb: &HeartbeatRequest,
    now: OffsetDateTime,
) -> Result<Machine> {
    let name = machine.metadata.name.clone();
    // Directive results first: registered join tokens become usable.
    let tokens = heartbeat::token_results(&machine, hb);
    for r in tokens.iter().filter(|r| !r.ok) {
        tracing::warn!(machine = %name, directive = ?r.id, message = ?r.message, "join token registration failed");
    }
    if let (Some(a), false) = (&machine.spec.assignment, tokens.is_empty()) {
        let uid = machine.metadata.uid.as_deref().unwrap_or_default();
        activate_tokens(app, &a.cluster, &tokens, uid)?;
    }
    for r in heartbeat::cleanup_results(hb) {
        if r.ok {
            tracing::info!(machine = %name, directive = %r.id, message = %r.message, "cluster cleanup done");
        } else {
            tracing::warn!(machine = %name, directive = %r.id, message = %r.message, "cluster cleanup failed");
        }
    }
    if heartbeat::touches_cluster(&machine, hb) {
        record_on_cluster(app, &machine, hb, now)?;
    }
    if heartbeat::cleanup_results(hb).next().is_some() {
        app.reconcile_machine(&name);
    }

    let mut woke = false;
    let updated = app
        .update_machine_from::<MachineCallError>(machine, |m| {
            let changed = heartbeat::record_on_machine(m, hb, now);
            woke |= changed;
            Ok(changed)
        })?
        .ok_or_else(|| MachineCallError::Deleted {
            machine: name.clone(),
        })?;
    if woke {
        tracing::info!(machine = %name, phase = %updated.status.phase, "machine status changed");
        app.reconcile_machine(&name);
    }
    Ok(updated)
}

/// Activates the join tokens machine `by` (a UID) reports registered in
/// `results`.
fn activate_tokens(app: &App, cluster: &str, results: &[&DirectiveResult], by: &str) -> Result<()> {
    let activated = app.store.modify_json(
        Kind::JoinTokens,
        cluster,
        |tokens: Option<ClusterJoinTokens>| {
            let Some(mut tokens) = tokens else {
                return Ok::<_, MachineCallError>(Modify::Keep(false));
            };
            let activation = heartbeat::activate_tokens(&mut tokens, results, by);
            for id in &activation.ignored {
                tracing::warn!(cluster, machine_uid = by, directive = ?id, "result for a join token this machine was not asked to register ignored");
            }
            Ok(if activation.changed {
                Modify::Write(tokens, true)
            } else {
                Modify::Keep(false)
            })
        },
    )?;
    if activated {
        tracing::info!(cluster, "join token registered in the cluster");
    }
    Ok(())
}

/// Records what a heartbeat of `machine` reports of its cluster (results of
/// the operations in flight, a control plane's view) on the cluster's
/// status, in one read-modify-write.
fn record_on_cluster(
    app: &App,
    machine: &Machine,
    hb: &HeartbeatRequest,
    now: OffsetDateTime,
) -> Result<()> {
    let Some(a) = &machine.spec.assignment else {
        return Ok(());
    };
    let name = &machine.metadata.name;
    if view::reports_view(machine, hb) {
        let (etcd, nodes) = view::read_errors(hb);
        if let Some(error) = etcd {
            tracing::warn!(machine = %name, cluster = %a.cluster, error = %error, "control plane cannot read its etcd members");
        }
        if let Some(error) = nodes {
            tracing::warn!(machine = %name, cluster = %a.cluster, error = %error, "control plane cannot list the Nodes");
        }
    }
    let mut record = ClusterRecord::default();
    app.update_cluster::<MachineCallError>(&a.cluster, |c| {
        let before = c.status.clone();
        record = heartbeat::record_on_cluster(c, machine, hb, now);
        Ok(c.status != before)
    })?;
    let cluster = &a.cluster;
    for r in &record.reported {
        log_reported(cluster, name, r);
    }
    let v = &record.view;
    if let Some(version) = &v.kubeadm_config_version {
        tracing::info!(machine = %name, cluster = %cluster, version = ?version, "kubeadm-config version changed");
    }
    match v.endpoint_ready {
        Some(false) => {
            tracing::warn!(machine = %name, cluster = %cluster, "the cluster's endpoint does not answer /readyz")
        }
        Some(true) => {
            tracing::info!(machine = %name, cluster = %cluster, "the cluster's endpoint answers /readyz")
        }
        None => {}
    }
    if v.etcd_members {
        tracing::info!(machine = %name, cluster = %cluster, members = %view::etcd_summary(hb), "etcd members changed");
    }
    if v.nodes {
        tracing::info!(machine = %name, cluster = %cluster, nodes = %view::nodes_summary(hb), "Nodes changed");
    }
    if record.wakes() {
        app.reconcile_machine(name);
    }
    Ok(())
}

/// Logs what a directive result of machine `via` told about cluster
/// `cluster`.
fn log_reported(cluster: &str, via: &str, r: &Reported) {
    match r {
        Reported::Drain {
            leaving,
            node,
            ok: true,
            message,
        } => {
            tracing::info!(cluster, machine = %leaving, %node, via, message = %message, "node drained")
        }
        Reported::Drain {
            leaving,
            node,
            ok: false,
            message,
        } => {
            tracing::warn!(cluster, machine = %leaving, %node, via, message = %message, "node drain refused; retrying until the drain timeout")
        }
        Reported::VersionSet { ok: true, message } => {
            tracing::info!(cluster, via, message = %message, "kubeadm-config version set")
        }
        Reported::VersionSet { ok: false, message } => {
            tracing::warn!(cluster, via, message = %message, "setting the kubeadm-config version failed; asking again later")
        }
        Reported::EssentialAddons { ok: true, message } => {
            tracing::info!(cluster, via, message = %message, "kube-proxy and CoreDNS upgraded")
        }
        Reported::EssentialAddons { ok: false, message } => {
            tracing::warn!(cluster, via, message = %message, "upgrading kube-proxy and CoreDNS failed; asking again later")
        }
        Reported::Renewal { ok: true, message } => {
            tracing::info!(cluster, machine = via, message = %message, "certificates renewed")
        }
        Reported::Renewal { ok: false, message } => {
            tracing::warn!(cluster, machine = via, message = %message, "renewing the certificates failed; asking again later")
        }
        Reported::UpgradeStep {
            machine,
            step,
            ok: true,
            message,
        } => {
            tracing::info!(cluster, %machine, %step, via, message = %message, "in-place upgrade step done")
        }
        Reported::UpgradeStep {
            machine,
            step,
            ok: false,
            message,
        } => {
            tracing::warn!(cluster, %machine, %step, via, message = %message, "in-place upgrade step failed")
        }
        Reported::Addon {
            addon,
            ok: true,
            message,
        } => {
            tracing::info!(cluster, %addon, via, message = %message, "addon applied")
        }
        Reported::Addon {
            addon,
            ok: false,
            message,
        } => {
            tracing::warn!(cluster, %addon, via, error = %message, "addon apply failed; trying again after a back-off")
        }
        Reported::SnapshotFailed { snapshot, message } => {
            tracing::warn!(cluster, %snapshot, via, error = %message, "etcd snapshot failed; the cluster's SnapshotsCurrent condition says so")
        }
        Reported::InventoryFailed { message } => {
            tracing::warn!(cluster, via, error = %message, "a drill cluster's inventory failed; the drill fails")
        }
    }
}

/// The answer to a heartbeat of `machine` (as recorded): the core's, with
/// the coordinator URLs and the datagram offer. Reads the store only for a
/// running control-plane machine.
fn answer(
    app: &App,
    machine: &Machine,
    hb: &HeartbeatRequest,
    now: OffsetDateTime,
) -> Result<HeartbeatResponse> {
    let (cluster, tokens) = match machine.spec.assignment.as_ref() {
        Some(a) if heartbeat::reads_cluster(machine) => (
            // From the read cache: every running control plane asks at
            // every heartbeat.
            app.cluster_cached(&a.cluster)?,
            app.store
                .get_json::<ClusterJoinTokens>(Kind::JoinTokens, &a.cluster)?
                .map(|(t, _)| t),
        ),
        _ => (None, None),
    };
    let mut answer = heartbeat::answer(
        machine,
        cluster.as_ref(),
        tokens.as_ref(),
        now,
        interval(app),
    );
    answer.coordinators = coordinators_for(app, machine, hb)?;
    let cluster_revision = cluster
        .as_ref()
        .and_then(|c| c.metadata.resource_version.as_deref()?.parse().ok());
    Ok(offer_datagrams(app, machine, cluster_revision, hb, answer))
}

/// Adds the datagram offer to an answer that asks nothing of the machine,
/// when the machine may heartbeat by datagram (see
/// [`crate::domain::datagrams`]); `machine` is as stored after the
/// heartbeat, `cluster_revision` the revision of the cluster the answer was
/// made from (read for a running control plane only).
fn offer_datagrams(
    app: &App,
    machine: &Machine,
    cluster_revision: Option<u64>,
    hb: &HeartbeatRequest,
    mut answer: HeartbeatResponse,
) -> HeartbeatResponse {
    if !heartbeat::may_offer_datagrams(hb, &answer) {
        app.fleet.datagrams.forget(machine);
        return answer;
    }
    let now = unix_micros(SystemTime::now());
    answer.datagram = app
        .fleet
        .datagrams
        .offer(machine, cluster_revision, status_digest(hb), now);
    answer
}

/// The coordinator URLs to name in the answer to `hb`: the machine's
/// current list (see [`crate::domain::replicas`]) when it differs from the
/// digest the heartbeat reports. Never to an agent that reports no digest
/// (it predates the field and would refuse the answer), and never on
/// SQLite (one replica, whose machines hold its URLs). Nothing is looked up
/// while the machine holds a current list, the steady state.
fn coordinators_for(
    app: &App,
    machine: &Machine,
    hb: &HeartbeatRequest,
) -> Result<Option<Vec<String>>> {
    let (Some(digest), Some(urls)) = (
        hb.coordinators_digest.as_deref(),
        app.leadership.machine_urls.get(),
    ) else {
        return Ok(None);
    };
    if urls.holds(digest) {
        return Ok(None);
    }
    let cluster = match machine.spec.assignment.as_ref() {
        Some(a) => app
            .store
            .get_json_cached::<Cluster>(Kind::Cluster, &a.cluster)?
            .map(|(c, _)| c),
        None => None,
    };
    let Some(kind) = heartbeat::machine_kind(machine, cluster.as_ref()) else {
        return Ok(None);
    };
    Ok(urls.for_kind(kind).map(|l| l.urls.clone()))
}

/// Why a heartbeat datagram got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatagramRefusal {
    /// This replica does not lead: it holds no heartbeat deadlines.
    NotLeader,
    /// The datagram is no heartbeat of a machine offered them.
    Refused(Refusal),
}

/// Takes a heartbeat datagram received at `now`: judged against the
/// machines offered datagram heartbeats, it marks its machine seen only
/// when the machine is still as offered (see
/// [`crate::domain::datagrams::DatagramTable::receive`]). The answer to
/// send, and whether it says quiet or call HTTPS.
pub fn datagram_heartbeat(
    app: &App,
    datagram: &[u8],
    now: SystemTime,
) -> Result<([u8; ANSWER_LEN], Verdict), DatagramRefusal> {
    if app.leadership.term().is_none() {
        return Err(DatagramRefusal::NotLeader);
    }
    let revision = |kind: Stored, name: &str| {
        let kind = match kind {
            Stored::Machine => Kind::Machine,
            Stored::Cluster => Kind::Cluster,
        };
        app.store.cached_revision(kind, name)
    };
    app.fleet
        .datagrams
        .receive(datagram, unix_micros(now), &revision, |name| {
            app.saw(name, OffsetDateTime::from(now))
        })
        .map_err(DatagramRefusal::Refused)
}

// ---------------------------------------------------------------- snapshots

/// The grant of the machine presenting `presented` to save snapshot `name`
/// (blocking: it may make the cluster's snapshot key).
pub fn snapshot_grant(
    app: &App,
    presented: Option<&Result<CertInfo, PkiError>>,
    name: &str,
) -> Result<drover_common::wire::SnapshotGrant> {
    let machine = authenticate(app, presented)?;
    Ok(crate::snapshots::grant(app, &machine, name)?)
}

/// Takes the sealed snapshot `name` the machine presenting `presented`
/// uploads as `body`, written off the async workers as it arrives and kept
/// only whole and matching `sha256` (when the machine named one). Its size.
pub async fn snapshot_upload(
    app: &Arc<App>,
    presented: Option<Arc<Result<CertInfo, PkiError>>>,
    name: String,
    sha256: Option<String>,
    body: axum::body::Body,
) -> Result<u64> {
    use crate::snapshots::{SnapshotCallError, Upload};
    use futures_util::StreamExt;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, axum::Error>>(8);
    let writer = {
        let (app, name) = (app.clone(), name.clone());
        crate::store::blocking(move || -> Result<u64> {
            let machine = authenticate(&app, presented.as_deref())?;
            let mut upload = Upload::start(&app, &machine, &name)?;
            while let Some(piece) = rx.blocking_recv() {
                let written = match piece {
                    Ok(bytes) => upload.write(&bytes),
                    Err(e) => Err(SnapshotCallError::Upload {
                        snapshot: name.clone(),
                        detail: e.to_string(),
                    }),
                };
                if let Err(e) = written {
                    upload.abandon();
                    return Err(e.into());
                }
            }
            Ok(upload.finish(sha256.as_deref())?)
        })
    };
    let reader = async move {
        let mut stream = body.into_data_stream();
        while let Some(piece) = stream.next().await {
            let failed = piece.is_err();
            // The writer stopped (it refused the upload): its error says why.
            if tx.send(piece).await.is_err() || failed {
                return;
            }
        }
    };
    let (written, ()) = tokio::join!(writer, reader);
    let len = written?;
    tracing::info!(snapshot = %name, bytes = len, "sealed etcd snapshot received");
    Ok(len)
}

/// Records snapshot `name` the machine presenting `presented` reports
/// saved (blocking: it reads the sealed file).
pub fn snapshot_saved(
    app: &App,
    presented: Option<&Result<CertInfo, PkiError>>,
    name: &str,
    saved: &drover_common::wire::SnapshotSaved,
) -> Result<drover_common::api::Snapshot> {
    let machine = authenticate(app, presented)?;
    Ok(crate::snapshots::record(app, &machine, name, saved)?)
}

/// Records the inventory a drill cluster asked of the machine presenting
/// `presented`; the drill cluster's name.
pub fn inventory(
    app: &App,
    presented: Option<&Result<CertInfo, PkiError>>,
    report: &drover_common::wire::InventoryReport,
) -> Result<String> {
    let machine = authenticate(app, presented)?;
    Ok(crate::drills::record_inventory(app, &machine, report)?)
}

// ---------------------------------------------------------------- config

/// The signed config bundle of the machine presenting `presented`, as JSON
/// (blocking: it reads secrets and signs). One fetch per machine at a time.
pub fn config(app: &App, presented: Option<&Result<CertInfo, PkiError>>) -> Result<Vec<u8>> {
    let machine = authenticate(app, presented)?;
    let name = &machine.metadata.name;
    // The turn lasts until the answer is serialized, so one machine never
    // has two bundles built, or held, at once.
    let _turn =
        app.fleet
            .bundle_builds
            .begin(name)
            .ok_or_else(|| MachineCallError::ConfigBusy {
                machine: name.clone(),
                retry_after: app.settings.heartbeat_interval.as_secs().clamp(1, 5),
            })?;
    let bundle = crate::domain::bootstrap::bundle_for(app, &machine);
    record_version_check(app, &machine, &bundle)?;
    Ok(serde_json::to_vec(&bundle?)?)
}

/// Keeps the outcome of the kubeadm version check on the machine's
/// conditions (written only when it changes).
fn record_version_check(
    app: &App,
    machine: &Machine,
    bundle: &Result<drover_common::bundle::SignedBundle, BootstrapError>,
) -> Result<()> {
    let Some(verdict) = config::version_verdict(machine, bundle) else {
        return Ok(());
    };
    if !verdict.matches {
        tracing::warn!(machine = %machine.metadata.name, error = %verdict.message, "machine refused: its kubeadm is not its cluster's version");
    }
    if config::holds(machine, &verdict) {
        return Ok(());
    }
    app.update_machine::<MachineCallError>(&machine.metadata.name, |m| {
        Ok(config::keep(m, &verdict))
    })?;
    Ok(())
}

// ---------------------------------------------------------------- renewal

/// Renews the certificate of `machine` (as authenticated with `presented`)
/// for the key of `csr_pem`.
pub async fn renew(
    app: &Arc<App>,
    machine: Machine,
    presented: Option<&Result<CertInfo, PkiError>>,
    csr_pem: String,
) -> Result<RenewResponse> {
    renewal::check_renewable(&machine)?;
    let presented = match presented {
        Some(Ok(info)) => info.public_key_pin.clone(),
        _ => return Err(RenewError::NoCertificate.into()),
    };
    let app = app.clone();
    // Signs and writes: off the async workers.
    crate::store::blocking(move || {
        let name = machine.metadata.name.clone();
        let issued = identity::issue(&app.keys.ca, &csr_pem, &name, app.settings.machine_cert_ttl)?;
        let not_after = issued.cert.not_after;
        let asked = Renewal {
            presented: &presented,
            new_key: &issued.key_pin,
            not_after,
        };
        let now = drover_common::now();
        let updated = app
            .update_machine_from::<MachineCallError>(machine, |m| {
                Ok(renewal::renew(m, &asked, now)?)
            })?
            .ok_or_else(|| MachineCallError::Deleted {
                machine: name.clone(),
            })?;
        if let Err(e) = renewal::renewed(&updated) {
            tracing::warn!(machine = %name, "renewal with a superseded certificate: the machine's identity is held twice and is revoked");
            return Err(e.into());
        }
        tracing::info!(machine = %name, %not_after, "machine certificate renewed");
        Ok(RenewResponse {
            certificate_pem: issued.cert.cert_pem,
            not_after,
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::bootstrap::join_token_for;
    use crate::domain::jointokens::TokenState;
    use drover_common::api::{
        Assignment, MachinePhase, MachineRole, MachineSpec, MachineStatus, ObjectMeta,
    };
    use drover_common::wire::AgentPhase;

    /// A running machine of cluster `c` (uid `u`) with the given role.
    fn member(app: &App, name: &str, role: MachineRole) -> Machine {
        let m = Machine {
            api_version: drover_common::API_VERSION.into(),
            kind: "Machine".into(),
            metadata: ObjectMeta {
                name: name.into(),
                uid: Some(format!("{name}-uid")),
                ..Default::default()
            },
            spec: MachineSpec {
                bmc: None,
                pool: "p".into(),
                provider: None,
                assignment: Some(Assignment {
                    cluster_uid: "u".into(),
                    ..drover_planner::fixtures::assignment("control-plane", role)
                }),
            },
            status: MachineStatus {
                phase: MachinePhase::Running,
                ..Default::default()
            },
        };
        app.store.create_json(Kind::Machine, name, &m).unwrap();
        app.machine(name).unwrap().unwrap()
    }

    fn result(id: &str) -> HeartbeatRequest {
        use crate::protocol::fixtures;
        HeartbeatRequest {
            directive_results: vec![fixtures::result(id, true, "")],
            ..fixtures::heartbeat(AgentPhase::Running, 1)
        }
    }

    fn tokens(app: &App) -> ClusterJoinTokens {
        app.store
            .get_json::<ClusterJoinTokens>(Kind::JoinTokens, "c")
            .unwrap()
            .unwrap()
            .0
    }

    #[tokio::test]
    async fn a_running_control_plane_heartbeats_by_datagram_until_something_waits_for_it() {
        use drover_common::wire::datagram::Beat;
        let dir = tempfile::tempdir().unwrap();
        let app = App::for_tests(dir.path());
        let mut c = drover_planner::fixtures::pool_cluster(1, 1);
        c.metadata.uid = Some("u".into());
        app.store.create_json(Kind::Cluster, "c", &c).unwrap();
        let cp = member(&app, "cp", MachineRole::Init);
        let hb = HeartbeatRequest {
            datagrams: true,
            ..crate::protocol::fixtures::heartbeat(AgentPhase::Running, 1)
        };
        let offered = |app: &App| {
            answer(app, &cp, &hb, drover_common::now())
                .unwrap()
                .datagram
                .expect("a quiet running control plane is offered datagrams")
        };
        let offer = offered(&app);
        let verdict = |app: &App| {
            let beat = Beat {
                id: offer.id,
                counter: unix_micros(SystemTime::now()),
                generation: 1,
                digest: status_digest(&hb),
            }
            .encode(&offer.heartbeat_key().unwrap());
            datagram_heartbeat(app, &beat, SystemTime::now()).unwrap().1
        };
        assert_eq!(verdict(&app), Verdict::Quiet);
        // An operation of its cluster begins: its directive goes in an
        // HTTPS answer, so the next datagram calls the machine over HTTPS.
        let (mut stored, rev) = app
            .store
            .get_json::<Cluster>(Kind::Cluster, "c")
            .unwrap()
            .unwrap();
        stored.status.snapshot_requested_at = Some(drover_common::now());
        app.store
            .update_json(Kind::Cluster, "c", &stored, Some(rev))
            .unwrap();
        assert_eq!(verdict(&app), Verdict::CallHttps);
        // Its HTTPS heartbeat is answered and offered datagrams again.
        assert_eq!(offered(&app).id, offer.id);
        assert_eq!(verdict(&app), Verdict::Quiet);
        // A joiner asks for a token, which this control plane is to
        // register: it is called over HTTPS, where the directive waits.
        assert!(join_token_for(app.as_ref(), "c", "u").is_err());
        assert_eq!(verdict(&app), Verdict::CallHttps);
        let asked = answer(&app, &cp, &hb, drover_common::now()).unwrap();
        assert_eq!(asked.directives.len(), 1, "{asked:?}");
        assert!(
            asked.datagram.is_none(),
            "an answer with a directive offers none"
        );
    }

    #[tokio::test]
    async fn only_the_registrar_completes_a_join_token_and_joiners_learn_no_id() {
        let dir = tempfile::tempdir().unwrap();
        let app = App::for_tests(dir.path());
        let cp = member(&app, "cp", MachineRole::Init);
        let worker = member(&app, "worker", MachineRole::Worker);
        // A joiner asks: a token is minted for the registrar, the init machine.
        let Err(BootstrapError::NotReady { reason, .. }) = join_token_for(app.as_ref(), "c", "u")
        else {
            panic!("a joiner waits for a token to be registered");
        };
        let minted = tokens(&app).tokens[0].clone();
        let id = minted.token.id().to_owned();
        assert_eq!(minted.registrar.as_deref(), Some("cp-uid"));
        assert!(
            !reason.contains(&id),
            "the reason names the pending token: {reason}"
        );
        // The worker is not asked to register it, and claiming it did
        // changes nothing.
        let now = drover_common::now();
        let claim = result(&format!("token-{id}"));
        assert!(answer(&app, &worker, &claim, now)
            .unwrap()
            .directives
            .is_empty());
        record_heartbeat(&app, worker, &claim, now).unwrap();
        assert_eq!(tokens(&app).tokens[0].state, TokenState::Pending);
        assert!(
            join_token_for(app.as_ref(), "c", "u").is_err(),
            "a joiner waits"
        );
        // The registrar is asked, and its result activates the token.
        let asked = answer(&app, &cp, &claim, now).unwrap();
        assert_eq!(asked.directives.len(), 1);
        assert_eq!(asked.directives[0].id, format!("token-{id}"));
        record_heartbeat(&app, cp, &claim, now).unwrap();
        assert_eq!(tokens(&app).tokens[0].state, TokenState::Active);
        assert_eq!(
            join_token_for(app.as_ref(), "c", "u").unwrap(),
            minted.token
        );
    }
}
