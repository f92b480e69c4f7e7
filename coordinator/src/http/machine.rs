//! Machine API handlers: registration with a ticket, then heartbeats,
//! config bundles and certificate renewal over mutual TLS.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use drover_common::api::{
    push_event, set_condition, AddonSource, Machine, MachinePhase, MachineRole, MachineSpec,
    MachineStatus, MachineUpgradeStep, ObjectMeta, CERTIFICATE_RENEWAL_PREFIX, ETCD_REMOVAL_PREFIX,
    MACHINE_UPGRADE_PREFIX, UNCORDON_PREFIX, VERSION_UPDATE_PREFIX,
};
use drover_common::pki::{LeafSpec, LeafUsage};
use drover_common::ticket::TicketGrant;
use drover_common::wire::{
    AgentPhase, AssignmentNotice, ConfigNotReady, Directive, DirectiveAction, HeartbeatRequest,
    HeartbeatResponse, MachineFacts, RegisterRequest, RegisterResponse, RenewRequest,
    RenewResponse,
};
use drover_common::API_VERSION;

use super::body::Body;
use super::error::ApiError;
use crate::app::App;
use crate::domain::jointokens::{directive_id, ClusterJoinTokens};
use crate::http::server::PeerCertificate;
use crate::store::{Kind, Modify};

/// The organization every machine certificate carries.
pub const MACHINE_ORG: &str = "drover:machines";

/// `POST /v1/machine/register`: redeem a ticket, get a client certificate.
///
/// The only machine call without a client certificate: the ticket from the
/// bootstrap document authenticates it, once.
#[utoipa::path(
    post,
    path = "/v1/machine/register",
    tag = "machine",
    security(()),
    request_body(
        content = RegisterRequest,
        example = json!({
            "ticket": "dt1.eyJncmFudCI6e319.c2lnbmF0dXJl",
            "csrPem": super::responses::EXAMPLE_CSR,
            "facts": {
                "hostname": "node-1",
                "addresses": ["192.0.2.10"],
                "apiServerPort": 6443,
                "kubeletHealthzPort": 10248,
                "agentVersion": "0.1.0"
            }
        }),
    ),
    responses(
        (status = 201, description = "Registered: the machine's name and client certificate.", body = RegisterResponse),
        (status = 400, response = super::responses::BadRequest),
        (status = 401, description = "The ticket is invalid, expired or revoked, or its machine is gone.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The ticket is presented from another cloud instance than the one launched for its machine.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The cloud provider could not confirm the instance now; retry after `Retry-After` seconds.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The ticket was already used.", body = drover_common::api::Problem, content_type = "application/problem+json"),
        (status = 413, response = super::responses::PayloadTooLarge),
        (status = 415, response = super::responses::UnsupportedMediaType),
        (status = 422, response = super::responses::Unprocessable),
        (status = 429, response = super::responses::TooManyRequests),
    ),
)]
pub async fn register(
    State(app): State<Arc<App>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    Body(req): Body<RegisterRequest>,
) -> Result<(StatusCode, Json<RegisterResponse>), ApiError> {
    if let Err(wait) = app
        .register_limiter
        .check(peer.ip(), std::time::Instant::now())
    {
        tracing::warn!(source = %peer.ip(), "registration rate limit hit");
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many registrations",
            format!(
                "too many registrations from {}; retry in {wait} s",
                peer.ip()
            ),
        );
        e.retry_after = Some(wait);
        return Err(e);
    }
    // The facts are checked before anything logs them: a refused host
    // name never reaches the log.
    check_facts(&req.facts)?;
    let now = drover_common::now();
    let claims = app
        .ticket_key
        .verify(&req.ticket, now.unix_timestamp())
        .map_err(|e| {
            tracing::warn!(error = %e, hostname = ?req.facts.hostname, source = %peer.ip(), "registration refused");
            ApiError::unauthorized(e.to_string())
        })?;
    let (token_id, pool) = match claims.grant {
        TicketGrant::PoolRegistration { token_id, pool } => (token_id, pool),
        TicketGrant::Machine {
            cluster,
            machine,
            machine_uid,
            role,
        } => {
            return register_created_machine(&app, &req, &cluster, &machine, &machine_uid, role)
                .await;
        }
    };
    let name = format!("{pool}-{}", drover_common::names::random_suffix(6));
    let uid = uuid::Uuid::new_v4().to_string();
    let issued = {
        let (app, csr, name) = (app.clone(), req.csr_pem.clone(), name.clone());
        crate::store::blocking(move || app.ca.sign_csr(&csr, &machine_leaf(&app, &name)))
            .await
            .map_err(|e| ApiError::bad_request(format!("the CSR is not usable: {e}")))?
    };
    // The token's labels join these when the registrar redeems it.
    let labels = [("drover.dev/pool".to_owned(), pool.clone())].into();
    let machine = Machine {
        api_version: API_VERSION.into(),
        kind: "Machine".into(),
        metadata: ObjectMeta {
            name: name.clone(),
            uid: Some(uid.clone()),
            generation: 1,
            labels,
            creation_timestamp: Some(now),
            ..Default::default()
        },
        spec: MachineSpec {
            pool: pool.clone(),
            provider: None,
            assignment: None,
        },
        status: MachineStatus {
            phase: MachinePhase::Registered,
            hostname: req.facts.hostname.clone(),
            addresses: req.facts.addresses.clone(),
            api_server_port: req.facts.api_server_port,
            kubelet_healthz_port: req.facts.kubelet_healthz_port,
            agent_version: req.facts.agent_version.clone(),
            last_heartbeat_time: Some(now),
            certificate_not_after: Some(issued.not_after),
            certificate_key: Some(key_pin(&issued.cert_pem)?),
            events: vec![drover_common::api::Event {
                time: now,
                reason: "Registered".into(),
                message: format!("registered into pool {pool} with token {token_id}"),
            }],
            ..Default::default()
        },
    };
    // Redeeming the token and creating the machine commit together, in a
    // batch with the registrations arriving meanwhile (see `registrar.rs`).
    app.registrar
        .register(crate::domain::registrar::PoolRegistration {
            token_id: token_id.clone(),
            machine,
            now,
        })
        .await?;
    app.saw(&name, now);
    tracing::info!(machine = %name, pool = %pool, token = %token_id, hostname = %req.facts.hostname, "machine registered");
    app.reconcile_machine(&name);
    Ok((
        StatusCode::CREATED,
        Json(RegisterResponse {
            machine_name: name,
            machine_uid: uid,
            certificate_pem: issued.cert_pem,
            not_after: issued.not_after,
            coordinator_ca_pem: app.ca.cert_pem.clone(),
            heartbeat_interval_seconds: app.settings.heartbeat_interval.as_secs().max(1),
        }),
    ))
}

/// What a created machine's ticket names.
#[derive(Clone, Copy)]
struct TicketFor<'a> {
    cluster: &'a str,
    machine: &'a str,
    machine_uid: &'a str,
    role: MachineRole,
}

impl TicketFor<'_> {
    /// Whether machine record `current` may redeem this ticket now.
    fn redeemable_by(&self, current: &Machine, hostname: &str) -> Result<(), ApiError> {
        let machine = self.machine;
        let assigned = current
            .spec
            .assignment
            .as_ref()
            .map(|a| (a.cluster.as_str(), a.role));
        if current.metadata.uid.as_deref() != Some(self.machine_uid)
            || assigned != Some((self.cluster, self.role))
        {
            return Err(ApiError::unauthorized(format!(
                "this ticket was issued for another incarnation of machine {machine}"
            )));
        }
        if matches!(
            current.status.phase,
            MachinePhase::Deleting | MachinePhase::Deleted
        ) {
            return Err(ApiError::unauthorized(format!(
                "machine {machine} is being deleted; its ticket is no longer valid"
            )));
        }
        if current.status.ticket_redeemed {
            tracing::warn!(machine, hostname, "replayed machine ticket refused");
            return Err(ApiError::conflict(format!(
                "ticket already used: machine {machine} has registered; a ticket is redeemed once"
            )));
        }
        Ok(())
    }
}

/// Registration of a machine the coordinator created: the ticket names the
/// machine; redeeming it is recorded on the machine in the same write that
/// stores its facts, so it works once.
async fn register_created_machine(
    app: &Arc<App>,
    req: &RegisterRequest,
    cluster: &str,
    machine: &str,
    machine_uid: &str,
    role: MachineRole,
) -> Result<(StatusCode, Json<RegisterResponse>), ApiError> {
    let now = drover_common::now();
    let current = app.machine(machine)?.ok_or_else(|| {
        ApiError::unauthorized(format!(
            "machine {machine} of cluster {cluster} no longer exists; its ticket died with it"
        ))
    })?;
    let ticket = TicketFor {
        cluster,
        machine,
        machine_uid,
        role,
    };
    ticket.redeemable_by(&current, &req.facts.hostname)?;
    let owner = app.cluster(cluster)?.ok_or_else(|| {
        ApiError::unauthorized(format!(
            "cluster {cluster} no longer exists; the ticket of machine {machine} died with it"
        ))
    })?;
    if let Err(e) = crate::reconcile::provisioner::verify_instance(
        app,
        &owner,
        &current,
        req.facts.instance_id.as_deref(),
    )
    .await
    {
        return Err(match e {
            crate::reconcile::provisioner::InstanceCheckError::Refused(why) => {
                tracing::warn!(machine, cluster, instance = ?req.facts.instance_id, reason = %why, "registration from the wrong instance refused");
                ApiError::forbidden(why)
            }
            crate::reconcile::provisioner::InstanceCheckError::Unavailable(why) => {
                let mut e = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Instance check unavailable",
                    why,
                );
                e.retry_after = Some(5);
                e
            }
        });
    }
    let issued = {
        let (app, csr, name) = (app.clone(), req.csr_pem.clone(), machine.to_owned());
        crate::store::blocking(move || app.ca.sign_csr(&csr, &machine_leaf(&app, &name)))
            .await
            .map_err(|e| ApiError::bad_request(format!("the CSR is not usable: {e}")))?
    };
    // The write is conditional on the revision read: of two concurrent
    // redemptions, the second finds the ticket redeemed when it reads the
    // machine again. Another change of the machine (the reconciler's) only
    // makes the redemption read it again.
    let redeem = {
        let app = app.clone();
        let (cluster, machine, machine_uid) = (
            cluster.to_owned(),
            machine.to_owned(),
            machine_uid.to_owned(),
        );
        let facts = req.facts.clone();
        let cert_key = key_pin(&issued.cert_pem)?;
        let not_after = issued.not_after;
        move || {
            let ticket = TicketFor {
                cluster: &cluster,
                machine: &machine,
                machine_uid: &machine_uid,
                role,
            };
            app.update_machine_from(current, |m| {
                ticket.redeemable_by(m, &facts.hostname)?;
                m.status.ticket_redeemed = true;
                m.status.phase = MachinePhase::Assigned;
                m.status.hostname = facts.hostname.clone();
                m.status.addresses = facts.addresses.clone();
                m.status.api_server_port = facts.api_server_port;
                m.status.kubelet_healthz_port = facts.kubelet_healthz_port;
                m.status.agent_version = facts.agent_version.clone();
                m.status.last_heartbeat_time = Some(now);
                m.status.certificate_not_after = Some(not_after);
                m.status.certificate_key = Some(cert_key.clone());
                push_event(
                    &mut m.status.events,
                    "Registered",
                    format!(
                        "agent {} registered from {}",
                        facts.agent_version,
                        facts.addresses.join(", ")
                    ),
                );
                Ok::<bool, ApiError>(true)
            })
        }
    };
    crate::store::blocking(redeem).await?.ok_or_else(|| {
        ApiError::unauthorized(format!(
            "machine {machine} of cluster {cluster} no longer exists; its ticket died with it"
        ))
    })?;
    app.saw(machine, now);
    tracing::info!(machine, cluster, hostname = %req.facts.hostname, "created machine registered");
    app.reconcile_machine(machine);
    Ok((
        StatusCode::CREATED,
        Json(RegisterResponse {
            machine_name: machine.to_owned(),
            machine_uid: machine_uid.to_owned(),
            certificate_pem: issued.cert_pem,
            not_after: issued.not_after,
            coordinator_ca_pem: app.ca.cert_pem.clone(),
            heartbeat_interval_seconds: app.settings.heartbeat_interval.as_secs().max(1),
        }),
    ))
}

/// The `sha256:` pin of the public key of a certificate just issued.
fn key_pin(cert_pem: &str) -> Result<String, ApiError> {
    drover_common::pin::CaPin::from_cert_pem(cert_pem)
        .map(|p| p.to_string())
        .map_err(|e| ApiError::internal(format!("cannot read the certificate just issued: {e}")))
}

/// The certificate a machine gets: its name as CN, the machine group.
fn machine_leaf(app: &App, machine: &str) -> LeafSpec {
    LeafSpec {
        common_name: machine.to_owned(),
        organizations: vec![MACHINE_ORG.into()],
        dns_names: vec![],
        ip_addresses: vec![],
        usage: LeafUsage::Client,
        validity: time::Duration::try_from(app.settings.machine_cert_ttl)
            .unwrap_or(time::Duration::hours(24)),
    }
}

fn check_facts(f: &MachineFacts) -> Result<(), ApiError> {
    let mut problems = vec![];
    // The host name becomes the Kubernetes node name: a DNS-1123 subdomain.
    if let Err(e) = drover_common::names::check_hostname(&f.hostname) {
        problems.push(e.to_string());
    }
    if f.addresses.is_empty() || f.addresses.len() > 16 {
        problems.push("addresses must list 1 to 16 IP addresses".to_string());
    }
    for a in &f.addresses {
        if a.parse::<IpAddr>().is_err() {
            problems.push(format!("address {a:?} is not an IP address"));
        }
    }
    if f.api_server_port == 0 || f.kubelet_healthz_port == 0 {
        problems.push("apiServerPort and kubeletHealthzPort must be set".to_string());
    }
    if f.agent_version.len() > 64 || f.agent_version.chars().any(char::is_control) {
        problems.push(
            "agentVersion must be at most 64 characters without control characters".to_string(),
        );
    }
    if let Some(id) = &f.instance_id {
        if id.is_empty()
            || id.len() > 64
            || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            problems.push(format!(
                "instanceId {:?} must be 1 to 64 letters, digits and '-'",
                id.chars().take(80).collect::<String>()
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "machine facts are invalid: {}",
            problems.join("; ")
        )))
    }
}

/// Finds the machine a verified client certificate belongs to.
fn authenticate(app: &App, peer: &PeerCertificate) -> Result<Machine, ApiError> {
    let parsed = peer.0.as_deref().ok_or_else(|| {
        ApiError::unauthorized(
            "this call needs the machine's client certificate (mutual TLS); register first",
        )
    })?;
    let info = parsed
        .as_ref()
        .map_err(|e| ApiError::unauthorized(e.to_string()))?;
    if !info.organizations.iter().any(|o| o == MACHINE_ORG) {
        return Err(ApiError::forbidden(
            "the client certificate is not a machine certificate",
        ));
    }
    // A resumed TLS session carries the certificate of the handshake it
    // resumes without verifying it again, so expiry is checked here.
    if info.not_after <= drover_common::now() {
        return Err(ApiError::unauthorized(format!(
            "the client certificate of machine {} expired at {}; the machine needs a new ticket",
            info.common_name, info.not_after
        )));
    }
    // From the read cache, like the rest of a quiet heartbeat: a deletion or
    // revocation written by any replica is seen at the next request.
    let machine = app
        .machine_cached(&info.common_name)?
        .filter(|m| m.status.phase != MachinePhase::Deleted)
        .ok_or_else(|| {
            ApiError::unauthorized(format!(
                "machine {} is not known to this coordinator (it was deleted); it needs a new ticket",
                info.common_name
            ))
        })?;
    if let Some(at) = machine.status.identity_revoked_at {
        return Err(ApiError::unauthorized(format!(
            "the identity of machine {} was revoked at {at}: every certificate of it is refused; the machine needs a new ticket",
            info.common_name
        )));
    }
    Ok(machine)
}

/// `POST /v1/machine/heartbeat`: record liveness and what changed, answer
/// with the assignment and directives.
#[utoipa::path(
    post,
    path = "/v1/machine/heartbeat",
    tag = "machine",
    security(("machineCertificate" = [])),
    request_body = HeartbeatRequest,
    responses(
        (status = 200, description = "The machine's assignment and the directives it is to carry out.", body = HeartbeatResponse),
        (status = 400, response = super::responses::BadRequest),
        (status = 413, response = super::responses::PayloadTooLarge),
        (status = 415, response = super::responses::UnsupportedMediaType),
        (status = 422, response = super::responses::Unprocessable),
        (status = 401, response = super::responses::MachineUnauthorized),
        (status = 403, response = super::responses::MachineForbidden),
    ),
)]
pub async fn heartbeat(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<PeerCertificate>,
    Body(mut hb): Body<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let machine = authenticate(&app, &peer)?;
    // Bounded before anything compares or stores it (see `bound`).
    hb.bound();
    let now = drover_common::now();
    app.saw(&machine.metadata.name, now);
    if is_quiet(&machine, &hb) {
        // The steady state: nothing to record, nothing read from the store
        // (the machine came from its read cache), no durable write.
        let mut answer = heartbeat_answer(&app, &machine, now)?;
        answer.coordinators = coordinators_for(&app, &machine, &hb)?;
        return Ok(Json(offer_datagrams(&app, &machine, &hb, answer)));
    }
    crate::store::blocking(move || {
        let (updated, mut answer) = record_heartbeat(&app, machine, &hb, now)?;
        answer.coordinators = coordinators_for(&app, &updated, &hb)?;
        Ok(offer_datagrams(&app, &updated, &hb, answer))
    })
    .await
    .map(Json)
}

/// Adds the datagram offer to an answer that asks nothing of the machine,
/// when the machine may heartbeat by datagram (see
/// [`crate::domain::datagrams`]); `machine` is as stored after the
/// heartbeat.
fn offer_datagrams(
    app: &App,
    machine: &Machine,
    hb: &HeartbeatRequest,
    mut answer: HeartbeatResponse,
) -> HeartbeatResponse {
    // An answer naming new coordinator URLs offers none: the next report
    // carries the new list's digest, so it goes over HTTPS anyway.
    if !hb.datagrams || !answer.directives.is_empty() || answer.coordinators.is_some() {
        app.datagrams.forget(machine);
        return answer;
    }
    let digest = drover_common::wire::datagram::status_digest(hb);
    let now = drover_common::wire::datagram::unix_micros(std::time::SystemTime::now());
    answer.datagram = app.datagrams.offer(machine, digest, now);
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
) -> Result<Option<Vec<String>>, ApiError> {
    use crate::domain::replicas::MachineKind;
    let (Some(digest), Some(urls)) = (
        hb.coordinators_digest.as_deref(),
        app.leadership.machine_urls.get(),
    ) else {
        return Ok(None);
    };
    if urls.holds(digest) {
        return Ok(None);
    }
    let kind = match machine.spec.assignment.as_ref() {
        None => MachineKind::Other,
        Some(a) => {
            let cluster = app
                .store
                .get_json_cached::<drover_common::api::Cluster>(Kind::Cluster, &a.cluster)?
                .map(|(c, _)| c)
                .filter(|c| c.metadata.uid.as_deref() == Some(a.cluster_uid.as_str()));
            match cluster.map(|c| c.spec.provider) {
                Some(drover_common::api::ProviderSpec::Docker(_)) => MachineKind::Docker,
                Some(_) => MachineKind::Other,
                // Its cluster is gone: which list it can use is unknown.
                None => return Ok(None),
            }
        }
    };
    Ok(urls.for_kind(kind).map(|l| l.urls.clone()))
}

/// Whether a heartbeat changes nothing and needs nothing from the store:
/// no directive results to record, no status change, and not a running
/// control-plane machine (which may be handed join tokens to register).
fn is_quiet(machine: &Machine, hb: &HeartbeatRequest) -> bool {
    if !hb.directive_results.is_empty() {
        return false;
    }
    if machine.status.phase == MachinePhase::Running
        && machine
            .spec
            .assignment
            .as_ref()
            .is_some_and(|a| a.role.is_control_plane())
    {
        return false;
    }
    let mut after = machine.clone();
    apply_heartbeat(&mut after, hb);
    after.status == machine.status && after.spec == machine.spec
}

/// Records what a heartbeat changed (blocking: it writes the store) and
/// answers it.
fn record_heartbeat(
    app: &App,
    machine: Machine,
    hb: &HeartbeatRequest,
    now: time::OffsetDateTime,
) -> Result<(Machine, HeartbeatResponse), ApiError> {
    let name = machine.metadata.name.clone();
    // Directive results first: registered join tokens become usable.
    if let Some(a) = &machine.spec.assignment {
        let done: Vec<String> = hb
            .directive_results
            .iter()
            .filter(|r| r.id.starts_with("token-"))
            .map(|r| {
                if !r.ok {
                    tracing::warn!(machine = %name, directive = ?r.id, message = ?r.message, "join token registration failed");
                }
                r.id.clone()
            })
            .collect();
        if !done.is_empty() {
            let uid = machine.metadata.uid.as_deref().unwrap_or_default();
            activate_tokens(app, &a.cluster, hb, &done, uid)?;
        }
    }

    for r in hb
        .directive_results
        .iter()
        .filter(|r| r.id.starts_with(ETCD_REMOVAL_PREFIX) || r.id.starts_with("node-delete-"))
    {
        if r.ok {
            tracing::info!(machine = %name, directive = %r.id, message = %r.message, "cluster cleanup done");
        } else {
            tracing::warn!(machine = %name, directive = %r.id, message = %r.message, "cluster cleanup failed");
            if let Some(a) = &machine.spec.assignment {
                record_removal_failure(app, a, r, now)?;
            }
        }
        app.reconcile_machine(&name);
    }
    for r in hb
        .directive_results
        .iter()
        .filter(|r| r.id.starts_with("drain-"))
    {
        record_drain(app, &machine, r)?;
    }
    if let Some(a) = &machine.spec.assignment {
        for r in hb
            .directive_results
            .iter()
            .filter(|r| r.id.starts_with(VERSION_UPDATE_PREFIX))
        {
            record_version_update(app, a, &name, r)?;
        }
        for r in hb.directive_results.iter().filter(|r| {
            r.id.starts_with(drover_common::api::ESSENTIAL_ADDONS_PREFIX)
        }) {
            record_essential_addons(app, a, &name, r, now)?;
        }
        for r in hb
            .directive_results
            .iter()
            .filter(|r| r.id.starts_with(CERTIFICATE_RENEWAL_PREFIX))
        {
            record_renewal(app, a, &name, r, now)?;
        }
        for r in hb.directive_results.iter().filter(|r| {
            r.id.starts_with(MACHINE_UPGRADE_PREFIX) || r.id.starts_with(UNCORDON_PREFIX)
        }) {
            record_upgrade_step(app, a, &name, r)?;
        }
        for r in hb
            .directive_results
            .iter()
            .filter(|r| r.id.starts_with(drover_common::api::ADDON_APPLY_PREFIX))
        {
            record_addon(app, a, &name, r, now)?;
        }
    }
    if hb.etcd.is_some() || hb.nodes.is_some() {
        record_view(app, &machine, hb, now)?;
    }

    let mut woke = false;
    let updated = app
        .update_machine_from::<ApiError>(machine, |m| {
            let before = m.status.clone();
            let before_spec = m.spec.clone();
            apply_heartbeat(m, hb);
            let changed = m.status != before || m.spec != before_spec;
            if changed {
                m.status.last_heartbeat_time = Some(now);
                woke = true;
            }
            Ok(changed)
        })?
        .ok_or_else(|| ApiError::unauthorized(format!("machine {name} was deleted")))?;
    if woke {
        tracing::info!(machine = %name, phase = %updated.status.phase, "machine status changed");
        app.reconcile_machine(&name);
    }
    let answer = heartbeat_answer(app, &updated, now)?;
    Ok((updated, answer))
}

/// Records the outcome of a drain attempt on the cluster's status, when it
/// is the attempt under way and `machine` was asked for it.
fn record_drain(
    app: &App,
    machine: &Machine,
    result: &drover_common::wire::DirectiveResult,
) -> Result<(), ApiError> {
    let Some(a) = &machine.spec.assignment else {
        return Ok(());
    };
    let name = &machine.metadata.name;
    let mut recorded = None;
    update_own_cluster(app, a, |s| {
        let asked = |d: &&mut drover_common::api::NodeDrain| {
            d.via == *name && d.directive_id() == result.id && d.result.is_none()
        };
        let Some(d) = s.drain.as_mut().filter(asked) else {
            return false;
        };
        d.result = Some(drover_common::api::DrainResult {
            ok: result.ok,
            message: result.message.clone(),
        });
        recorded = Some((d.machine.clone(), d.node.clone()));
        true
    })?;
    if let Some((leaving, node)) = recorded {
        if result.ok {
            tracing::info!(cluster = %a.cluster, machine = %leaving, %node, via = %name, message = %result.message, "node drained");
        } else {
            tracing::warn!(cluster = %a.cluster, machine = %leaving, %node, via = %name, message = %result.message, "node drain refused; retrying until the drain timeout");
        }
        app.reconcile_machine(name);
    }
    Ok(())
}

/// Records the outcome of a `kubeadm-config` version change: its failure
/// on the cluster's status (the planner asks again a while later), its
/// success only in the log (the next report shows the version).
fn record_version_update(
    app: &App,
    a: &drover_common::api::Assignment,
    name: &str,
    result: &drover_common::wire::DirectiveResult,
) -> Result<(), ApiError> {
    if result.ok {
        tracing::info!(cluster = %a.cluster, via = %name, message = %result.message, "kubeadm-config version set");
        app.reconcile_machine(name);
        return Ok(());
    }
    tracing::warn!(cluster = %a.cluster, via = %name, message = %result.message, "setting the kubeadm-config version failed; asking again later");
    update_own_cluster(app, a, |s| match s.version_update.as_mut() {
        Some(u) if u.via == name && u.directive_id() == result.id && u.error != result.message => {
            u.error = result.message.clone();
            true
        }
        _ => false,
    })
}

/// Records the outcome of a kube-proxy and CoreDNS upgrade on the
/// cluster's status, when it is the request under way and `name` was asked
/// for it: done (the rollout may finish), or why it failed (the planner
/// asks again a while later).
fn record_essential_addons(
    app: &App,
    a: &drover_common::api::Assignment,
    name: &str,
    result: &drover_common::wire::DirectiveResult,
    now: time::OffsetDateTime,
) -> Result<(), ApiError> {
    let mut recorded = false;
    update_own_cluster(app, a, |s| match s.essential_addons.as_mut() {
        Some(u) if u.via == name && u.directive_id() == result.id && !u.is_done() => {
            if result.ok {
                u.done_at = Some(now);
                u.message.clone_from(&result.message);
                u.error.clear();
            } else if u.error == result.message {
                return false;
            } else {
                u.error.clone_from(&result.message);
            }
            recorded = true;
            true
        }
        _ => false,
    })?;
    if recorded {
        if result.ok {
            tracing::info!(cluster = %a.cluster, via = %name, message = %result.message, "kube-proxy and CoreDNS upgraded");
        } else {
            tracing::warn!(cluster = %a.cluster, via = %name, message = %result.message, "upgrading kube-proxy and CoreDNS failed; asking again later");
        }
        app.reconcile_machine(name);
    }
    Ok(())
}

/// Records the outcome of a certificate renewal: success in the log (the
/// machine's next report shows the new expiry), failure on the cluster's
/// status, so the planner asks again a while later.
fn record_renewal(
    app: &App,
    a: &drover_common::api::Assignment,
    name: &str,
    result: &drover_common::wire::DirectiveResult,
    now: time::OffsetDateTime,
) -> Result<(), ApiError> {
    if result.ok {
        tracing::info!(cluster = %a.cluster, machine = %name, message = %result.message, "certificates renewed");
        app.reconcile_machine(name);
        return Ok(());
    }
    tracing::warn!(cluster = %a.cluster, machine = %name, message = %result.message, "renewing the certificates failed; asking again later");
    update_own_cluster(app, a, |s| match s.certificate_renewal.as_mut() {
        Some(r) if r.machine == name && r.directive_id() == result.id && r.failed_at.is_none() => {
            r.failed_at = Some(now);
            r.error.clone_from(&result.message);
            true
        }
        _ => false,
    })
}

/// Records the outcome of an addon apply on the cluster's status, when it
/// is the apply under way and `name` was asked for it; the planner asks for
/// the next addon, or again after a back-off.
fn record_addon(
    app: &App,
    a: &drover_common::api::Assignment,
    name: &str,
    result: &drover_common::wire::DirectiveResult,
    now: time::OffsetDateTime,
) -> Result<(), ApiError> {
    use drover_common::api::AddonPhase;
    let mut recorded = None;
    update_own_cluster(app, a, |s| {
        let Some(r) = s
            .addon_apply
            .clone()
            .filter(|r| r.via == name && r.directive_id() == result.id)
        else {
            return false;
        };
        s.addon_apply = None;
        let Some(st) = s.addons.iter_mut().find(|x| x.name == r.addon) else {
            return true;
        };
        st.hash = r.hash;
        st.last_attempt_at = Some(now);
        if result.ok {
            st.phase = AddonPhase::Applied;
            st.applied_at = Some(now);
            st.failures = 0;
            st.message.clear();
        } else {
            st.phase = AddonPhase::Failed;
            st.failures += 1;
            st.message.clone_from(&result.message);
        }
        recorded = Some(r.addon);
        true
    })?;
    if let Some(addon) = recorded {
        if result.ok {
            tracing::info!(cluster = %a.cluster, %addon, via = %name, message = %result.message, "addon applied");
        } else {
            tracing::warn!(cluster = %a.cluster, %addon, via = %name, error = %result.message, "addon apply failed; trying again after a back-off");
        }
        app.reconcile_machine(name);
    }
    Ok(())
}

/// Records the outcome of a step of the in-place upgrade under way (the
/// upgrade itself, asked of the machine, or the uncordon, asked of a
/// control plane), when it is that step's directive; the planner moves on.
fn record_upgrade_step(
    app: &App,
    a: &drover_common::api::Assignment,
    name: &str,
    result: &drover_common::wire::DirectiveResult,
) -> Result<(), ApiError> {
    let mut recorded = None;
    update_own_cluster(app, a, |s| {
        let Some(u) = s.machine_upgrade.as_mut() else {
            return false;
        };
        let asked = match u.step {
            MachineUpgradeStep::Upgrade => u.machine == name,
            MachineUpgradeStep::Uncordon => u.via == name,
            MachineUpgradeStep::Drain | MachineUpgradeStep::Settle => false,
        };
        if !asked || u.directive_id() != result.id || u.result.is_some() {
            return false;
        }
        u.result = Some(drover_common::api::DrainResult {
            ok: result.ok,
            message: result.message.clone(),
        });
        recorded = Some((u.machine.clone(), u.step));
        true
    })?;
    if let Some((machine, step)) = recorded {
        if result.ok {
            tracing::info!(cluster = %a.cluster, %machine, %step, via = %name, message = %result.message, "in-place upgrade step done");
        } else {
            tracing::warn!(cluster = %a.cluster, %machine, %step, via = %name, message = %result.message, "in-place upgrade step failed");
        }
        app.reconcile_machine(name);
    }
    Ok(())
}

/// Records that the member removal under way failed, so the planner asks
/// again shortly instead of waiting out the request.
fn record_removal_failure(
    app: &App,
    a: &drover_common::api::Assignment,
    result: &drover_common::wire::DirectiveResult,
    now: time::OffsetDateTime,
) -> Result<(), ApiError> {
    update_own_cluster(app, a, |s| match s.etcd_removal.as_mut() {
        Some(r) if r.directive_id() == result.id && r.failed_at.is_none() => {
            r.failed_at = Some(now);
            r.error.clone_from(&result.message);
            true
        }
        _ => false,
    })
}

/// A read-modify-write of the status of the cluster of assignment `a`,
/// when it is still the same cluster (its uid); `change` says whether it
/// changed anything.
fn update_own_cluster(
    app: &App,
    a: &drover_common::api::Assignment,
    mut change: impl FnMut(&mut drover_common::api::ClusterStatus) -> bool,
) -> Result<(), ApiError> {
    app.update_cluster::<ApiError>(&a.cluster, |c| {
        Ok(c.metadata.uid.as_deref() == Some(a.cluster_uid.as_str()) && change(&mut c.status))
    })?;
    Ok(())
}

/// Keeps what a running control plane reports of its cluster (etcd
/// members, Nodes) on the cluster's status, when it changed (the newest
/// report wins).
fn record_view(
    app: &App,
    machine: &Machine,
    hb: &HeartbeatRequest,
    now: time::OffsetDateTime,
) -> Result<(), ApiError> {
    let Some(a) = &machine.spec.assignment else {
        return Ok(());
    };
    let name = &machine.metadata.name;
    if !a.role.is_control_plane() || machine.status.phase != MachinePhase::Running {
        return Ok(());
    }
    let etcd = hb.etcd.as_ref().filter(|r| {
        if !r.error.is_empty() {
            tracing::warn!(machine = %name, cluster = %a.cluster, error = %r.error, "control plane cannot read its etcd members");
        }
        r.error.is_empty()
    });
    let nodes = hb.nodes.as_ref().filter(|r| {
        if !r.error.is_empty() {
            tracing::warn!(machine = %name, cluster = %a.cluster, error = %r.error, "control plane cannot list the Nodes");
        }
        r.error.is_empty()
    });
    let mut etcd_changed = false;
    let mut nodes_changed = false;
    let mut reported_changed = false;
    app.update_cluster::<ApiError>(&a.cluster, |c| {
        if c.metadata.uid.as_deref() != Some(a.cluster_uid.as_str()) {
            return Ok(false);
        }
        etcd_changed = etcd.is_some_and(|r| c.status.etcd_members != r.members);
        nodes_changed = nodes.is_some_and(|r| c.status.nodes != r.nodes);
        if etcd_changed {
            c.status.etcd_members = etcd.map(|r| r.members.clone()).unwrap_or_default();
            c.status.etcd_reported_by = Some(name.clone());
            c.status.etcd_reported_at = Some(now);
        }
        if nodes_changed {
            c.status.nodes = nodes.map(|r| r.nodes.clone()).unwrap_or_default();
        }
        let version = nodes.and_then(|r| r.kubeadm_config_version.clone());
        reported_changed = version.is_some() && c.status.kubeadm_config_version != version;
        if reported_changed {
            tracing::info!(machine = %name, cluster = %a.cluster, version = ?version, "kubeadm-config version changed");
            c.status.kubeadm_config_version = version;
        }
        // Whether the endpoint answers is reported even when the Nodes
        // could not be listed: an API server that died is exactly when
        // they cannot be.
        let ready = hb.nodes.as_ref().and_then(|r| r.endpoint_ready);
        if ready.is_some() && c.status.endpoint_ready != ready {
            if ready == Some(false) {
                tracing::warn!(machine = %name, cluster = %a.cluster, "the cluster's endpoint does not answer /readyz");
            } else {
                tracing::info!(machine = %name, cluster = %a.cluster, "the cluster's endpoint answers /readyz");
            }
            c.status.endpoint_ready = ready;
            reported_changed = true;
        }
        Ok(etcd_changed || nodes_changed || reported_changed)
    })?;
    if etcd_changed {
        let summary: Vec<String> = hb
            .etcd
            .iter()
            .flat_map(|r| &r.members)
            .map(|m| {
                format!(
                    "{}({}{}{})",
                    if m.name.is_empty() { &m.id } else { &m.name },
                    if m.started { "started" } else { "unstarted" },
                    if m.healthy { ",healthy" } else { ",unhealthy" },
                    if m.is_learner { ",learner" } else { "" }
                )
            })
            .collect();
        tracing::info!(machine = %name, cluster = %a.cluster, members = %summary.join(" "), "etcd members changed");
    }
    if nodes_changed {
        let summary: Vec<String> = hb
            .nodes
            .iter()
            .flat_map(|r| &r.nodes)
            .map(|n| format!("{}({})", n.name, n.ready))
            .collect();
        tracing::info!(machine = %name, cluster = %a.cluster, nodes = %summary.join(" "), "Nodes changed");
    }
    if etcd_changed || nodes_changed || reported_changed {
        app.reconcile_machine(name);
    }
    Ok(())
}

/// The answer to a heartbeat: the assignment and the directives to carry
/// out. Reads the store only for a running control-plane machine.
fn heartbeat_answer(
    app: &App,
    machine: &Machine,
    now: time::OffsetDateTime,
) -> Result<HeartbeatResponse, ApiError> {
    let mut directives = vec![];
    let mut assignment = None;
    let gone = matches!(
        machine.status.phase,
        MachinePhase::Deleting | MachinePhase::Deleted
    );
    if let Some(a) = machine.spec.assignment.as_ref().filter(|_| !gone) {
        if machine.status.phase == MachinePhase::Releasing {
            directives.push(Directive {
                id: format!("reset-g{}", a.generation),
                action: DirectiveAction::Reset {
                    reason: format!("released from cluster {}", a.cluster),
                },
            });
        } else {
            assignment = Some(AssignmentNotice {
                cluster: a.cluster.clone(),
                role: a.role,
                generation: a.generation,
            });
            let running = machine.status.phase == MachinePhase::Running;
            if let Some(r) = machine.status.upgrade.clone().filter(|_| running) {
                directives.push(Directive {
                    id: r.id,
                    action: DirectiveAction::UpgradeKubernetes {
                        version: r.version,
                        command: r.command,
                    },
                });
            }
            if a.role.is_control_plane() && running {
                // From the read cache: every running control plane asks at
                // every heartbeat.
                let cluster = app
                    .cluster_cached(&a.cluster)?
                    .filter(|c| c.metadata.uid.as_deref() == Some(a.cluster_uid.as_str()));
                if let Some(u) = cluster
                    .as_ref()
                    .and_then(|c| c.status.machine_upgrade.clone())
                    .filter(|u| {
                        u.step == MachineUpgradeStep::Uncordon
                            && u.via == machine.metadata.name
                            && u.result.is_none()
                    })
                {
                    directives.push(Directive {
                        id: u.directive_id(),
                        action: DirectiveAction::UncordonNode { node: u.node },
                    });
                }
                if let Some(r) = cluster
                    .as_ref()
                    .and_then(|c| c.status.certificate_renewal.clone())
                    .filter(|r| r.machine == machine.metadata.name && r.failed_at.is_none())
                {
                    directives.push(Directive {
                        id: r.directive_id(),
                        action: DirectiveAction::RenewCertificates { reason: r.reason },
                    });
                }
                if let Some(d) = cluster
                    .as_ref()
                    .and_then(|c| c.status.drain.clone())
                    .filter(|d| d.via == machine.metadata.name && d.result.is_none())
                {
                    let policy = cluster.as_ref().and_then(|c| c.spec.drain.as_ref());
                    directives.push(Directive {
                        id: d.directive_id(),
                        action: DirectiveAction::DrainNode {
                            node: d.node,
                            delete_pods_without_controller: policy
                                .is_some_and(|p| p.delete_pods_without_controller),
                            delete_empty_dir_data: policy.is_some_and(|p| p.delete_empty_dir_data),
                        },
                    });
                }
                if let Some(r) = cluster
                    .as_ref()
                    .and_then(|c| c.status.node_removal.clone())
                    .filter(|r| r.via == machine.metadata.name)
                {
                    directives.push(Directive {
                        id: format!(
                            "node-delete-{}-{}",
                            r.node.chars().take(32).collect::<String>(),
                            r.requested_at.unix_timestamp()
                        ),
                        action: DirectiveAction::DeleteNode { node: r.node },
                    });
                }
                if let Some((id, action)) = cluster.as_ref().and_then(|c| {
                    let r = c
                        .status
                        .addon_apply
                        .clone()
                        .filter(|r| r.via == machine.metadata.name)?;
                    let addons = c.spec.effective_addons();
                    // Only the manifests the request was made for.
                    let addon = addons
                        .iter()
                        .find(|x| x.name == r.addon && x.hash() == r.hash)?;
                    let action = match addon.source {
                        AddonSource::Spec(manifests) => DirectiveAction::ApplyManifests {
                            addon: r.addon.clone(),
                            manifests: manifests.to_owned(),
                        },
                        AddonSource::Image => DirectiveAction::ApplyImageManifests {
                            addon: r.addon.clone(),
                        },
                    };
                    Some((r.directive_id(), action))
                }) {
                    directives.push(Directive { id, action });
                }
                if let Some(u) = cluster
                    .as_ref()
                    .and_then(|c| c.status.version_update.clone())
                    .filter(|u| u.via == machine.metadata.name)
                {
                    directives.push(Directive {
                        id: u.directive_id(),
                        action: DirectiveAction::SetKubernetesVersion { version: u.version },
                    });
                }
                if let Some(u) = cluster
                    .as_ref()
                    .and_then(|c| c.status.essential_addons.clone())
                    .filter(|u| u.via == machine.metadata.name && !u.is_done())
                {
                    directives.push(Directive {
                        id: u.directive_id(),
                        action: DirectiveAction::UpgradeEssentialAddons { version: u.version },
                    });
                }
                if let Some(r) = cluster
                    .and_then(|c| c.status.etcd_removal)
                    .filter(|r| r.via == machine.metadata.name)
                {
                    directives.push(Directive {
                        // A retry is a new directive.
                        id: r.directive_id(),
                        action: DirectiveAction::RemoveEtcdMember {
                            id: r.id,
                            name: r.name,
                        },
                    });
                }
                if let Some((tokens, _)) = app
                    .store
                    .get_json::<ClusterJoinTokens>(Kind::JoinTokens, &a.cluster)?
                {
                    let uid = machine.metadata.uid.as_deref().unwrap_or_default();
                    if tokens.cluster_uid == a.cluster_uid {
                        for t in tokens.pending_for(now, uid) {
                            directives.push(Directive {
                                id: directive_id(&t.token),
                                action: DirectiveAction::CreateBootstrapToken {
                                    token: t.token.clone(),
                                    ttl_seconds: (t.expires_at - now).whole_seconds().max(1) as u64,
                                },
                            });
                        }
                    }
                }
            }
        }
    }
    Ok(HeartbeatResponse {
        heartbeat_interval_seconds: app.settings.heartbeat_interval.as_secs().max(1),
        assignment,
        directives,
        datagram: None,
        coordinators: None,
    })
}

/// Folds a heartbeat into a machine. Pure, so it is unit-tested.
pub fn apply_heartbeat(m: &mut Machine, hb: &HeartbeatRequest) {
    m.status
        .heartbeat_fallback
        .clone_from(&hb.heartbeat_fallback);
    if let Some(v) = &hb.kubeadm_version {
        m.status.kubeadm_version.clone_from(v);
    }
    if let Some(c) = &hb.certificates {
        m.status.certificates = Some(c.clone());
    }
    let before_phase = m.status.phase;
    if matches!(before_phase, MachinePhase::Deleting | MachinePhase::Deleted) {
        m.status.health = Some(hb.health.clone());
        return;
    }
    let releasing = m.status.phase == MachinePhase::Releasing;
    if releasing {
        if hb.phase == AgentPhase::Waiting && hb.applied_generation == 0 {
            m.status.bootstrap = None;
            m.status.applied_generation = 0;
            // The agent reset itself.
            crate::domain::removal::finish_leaving(m);
        }
    } else {
        let assigned = m.spec.assignment.is_some();
        let current_gen = m.spec.assignment.as_ref().map(|a| a.generation);
        // Reports about an older assignment say nothing about the current one.
        let about_current =
            hb.applied_generation == 0 || Some(hb.applied_generation) == current_gen;
        m.status.phase = match hb.phase {
            AgentPhase::Waiting if assigned => MachinePhase::Assigned,
            AgentPhase::Waiting => MachinePhase::Registered,
            _ if !about_current => m.status.phase,
            AgentPhase::Bootstrapping => MachinePhase::Bootstrapping,
            AgentPhase::Running => MachinePhase::Running,
            AgentPhase::Failed => MachinePhase::Failed,
            AgentPhase::Resetting => MachinePhase::Releasing,
        };
        if about_current {
            m.status.bootstrap = hb.bootstrap.clone();
            m.status.applied_generation = hb.applied_generation;
        }
    }
    m.status.health = Some(hb.health.clone());
    if m.status.phase == MachinePhase::Running {
        let (healthy, reason, message) = health_verdict(&hb.health);
        set_condition(
            &mut m.status.conditions,
            drover_planner::health::HEALTHY_CONDITION,
            healthy,
            reason,
            &message,
        );
    }
    if m.status.phase != before_phase {
        let (reason, message) = match m.status.phase {
            MachinePhase::Bootstrapping => ("Bootstrapping", "kubeadm is running".to_string()),
            MachinePhase::Running => (
                "Bootstrapped",
                "kubeadm finished; the node is reporting".to_string(),
            ),
            MachinePhase::Failed => (
                "BootstrapFailed",
                m.status
                    .bootstrap
                    .as_ref()
                    .and_then(|b| b.failure.as_ref().map(|f| (b.step.as_str(), f)))
                    .map(|(step, f)| failure_event(step, f))
                    .unwrap_or_else(|| "bootstrap failed".into()),
            ),
            MachinePhase::Registered if before_phase == MachinePhase::Releasing => (
                "ReturnedToPool",
                "reset done; waiting in the pool".to_string(),
            ),
            MachinePhase::Deleted => (
                "Deleted",
                "reset done; deregistered as requested, its identity revoked".to_string(),
            ),
            other => ("PhaseChanged", format!("now {other}")),
        };
        push_event(&mut m.status.events, reason, message);
    }
}

/// Whether a health report is healthy, with a stable reason and message.
fn health_verdict(h: &drover_common::wire::HealthReport) -> (bool, &'static str, String) {
    use drover_common::wire::ProbeState;
    if h.kubelet.state == ProbeState::Unhealthy {
        return (false, "KubeletUnhealthy", h.kubelet.message.clone());
    }
    if let Some(a) = &h.api_server {
        if a.state == ProbeState::Unhealthy {
            return (false, "ApiServerUnhealthy", a.message.clone());
        }
    }
    (true, "Healthy", String::new())
}

/// Activates the join tokens machine `by` (a UID) reports registered.
/// A result for a token that was not sent to `by` changes nothing.
fn activate_tokens(
    app: &App,
    cluster: &str,
    hb: &HeartbeatRequest,
    ids: &[String],
    by: &str,
) -> Result<(), ApiError> {
    let activated = app.store.modify_json(
        Kind::JoinTokens,
        cluster,
        |tokens: Option<ClusterJoinTokens>| {
            let Some(mut tokens) = tokens else {
                return Ok::<_, ApiError>(Modify::Keep(false));
            };
            let mut changed = false;
            for r in hb
                .directive_results
                .iter()
                .filter(|r| r.ok && ids.contains(&r.id))
            {
                if let Some(id) = r.id.strip_prefix("token-") {
                    if tokens.activate(id, by) {
                        changed = true;
                    } else {
                        tracing::warn!(cluster, machine_uid = by, directive = ?r.id, "result for a join token this machine was not asked to register ignored");
                    }
                }
            }
            Ok(if changed {
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

/// `GET /v1/machine/config`: the signed bundle for the machine's assignment.
#[utoipa::path(
    get,
    path = "/v1/machine/config",
    tag = "machine",
    security(("machineCertificate" = [])),
    responses(
        (status = 200, description = "The config bundle, signed with the coordinator CA key.", body = drover_common::bundle::SignedBundle),
        (status = 401, response = super::responses::MachineUnauthorized),
        (status = 403, response = super::responses::MachineForbidden),
        (status = 404, response = super::responses::NotFound),
        (status = 409, description = "The machine cannot bootstrap yet (a `ConfigNotReady` to retry after `retryAfterSeconds`), or its state conflicts (a problem document; also when its bundle would be over the 4 MiB cap).",
            headers(("Retry-After" = u64, description = "Seconds to wait before asking again (with a `ConfigNotReady`).")),
            content(
                (ConfigNotReady = "application/json"),
                (drover_common::api::Problem = "application/problem+json"),
            ),
        ),
        (status = 429, description = "Another config fetch with this machine's identity is being served: one at a time per machine, never queued. Ask again after `Retry-After`.",
            headers(("Retry-After" = u64, description = "Seconds to wait before asking again.")),
            body = drover_common::api::Problem, content_type = "application/problem+json",
        ),
    ),
)]
pub async fn config(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<PeerCertificate>,
) -> Result<axum::response::Response, ApiError> {
    // Reads secrets and signs: off the async workers.
    crate::store::blocking(move || {
        let machine = authenticate(&app, &peer)?;
        let name = &machine.metadata.name;
        // The turn lasts until the answer is serialized, so one machine
        // never has two bundles built, or held, at once.
        let _turn = app.bundle_builds.begin(name).ok_or_else(|| {
            let mut e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "Config fetch under way",
                format!(
                    "a config fetch with the identity of machine {name} is being served; \
                     one is served at a time per machine: ask again after Retry-After"
                ),
            );
            e.retry_after = Some(app.settings.heartbeat_interval.as_secs().clamp(1, 5));
            e
        })?;
        let bundle = crate::domain::bootstrap::bundle_for(app.as_ref(), &machine);
        record_version_check(&app, &machine, &bundle)?;
        let json =
            serde_json::to_vec(&bundle.map_err(ApiError::from)?).map_err(ApiError::internal)?;
        Ok(axum::response::IntoResponse::into_response((
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            json,
        )))
    })
    .await
}

/// Keeps the outcome of the kubeadm version check on the machine's
/// conditions (written only when it changes), so `drover describe machine`
/// says why a machine does not bootstrap.
fn record_version_check(
    app: &App,
    machine: &Machine,
    bundle: &Result<drover_common::bundle::SignedBundle, crate::domain::bootstrap::BootstrapError>,
) -> Result<(), ApiError> {
    use crate::domain::bootstrap::{BootstrapError, KUBEADM_VERSION_CONDITION};
    let verdict = match bundle {
        Err(e @ BootstrapError::VersionMismatch { .. }) => {
            tracing::warn!(machine = %machine.metadata.name, error = %e, "machine refused: its kubeadm is not its cluster's version");
            Some((false, "Mismatch", e.to_string()))
        }
        Ok(_) if !machine.status.kubeadm_version.is_empty() => Some((
            true,
            "Matches",
            format!("kubeadm {}", machine.status.kubeadm_version),
        )),
        _ => None,
    };
    let Some((ok, reason, message)) = verdict else {
        return Ok(());
    };
    let unchanged = machine.status.conditions.iter().any(|c| {
        c.type_ == KUBEADM_VERSION_CONDITION
            && (c.status == "True") == ok
            && c.reason == reason
            && c.message == message
    });
    if unchanged {
        return Ok(());
    }
    app.update_machine::<ApiError>(&machine.metadata.name, |m| {
        Ok(set_condition(
            &mut m.status.conditions,
            KUBEADM_VERSION_CONDITION,
            ok,
            reason,
            &message,
        ))
    })?;
    Ok(())
}

/// `POST /v1/machine/certificate`: a fresh client certificate for a new key.
#[utoipa::path(
    post,
    path = "/v1/machine/certificate",
    tag = "machine",
    security(("machineCertificate" = [])),
    request_body(content = RenewRequest, example = json!({"csrPem": super::responses::EXAMPLE_CSR})),
    responses(
        (status = 200, description = "A new client certificate for the CSR's key.", body = RenewResponse),
        (status = 400, response = super::responses::BadRequest),
        (status = 413, response = super::responses::PayloadTooLarge),
        (status = 415, response = super::responses::UnsupportedMediaType),
        (status = 422, response = super::responses::Unprocessable),
        (status = 401, response = super::responses::MachineUnauthorized),
        (status = 403, response = super::responses::MachineForbidden),
    ),
)]
pub async fn renew(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<PeerCertificate>,
    Body(req): Body<RenewRequest>,
) -> Result<Json<RenewResponse>, ApiError> {
    let machine = authenticate(&app, &peer)?;
    let name = machine.metadata.name.clone();
    if matches!(
        machine.status.phase,
        MachinePhase::Deleting | MachinePhase::Deleted
    ) {
        return Err(ApiError::forbidden(format!(
            "machine {name} is being deleted; its certificate is not renewed"
        )));
    }
    let presented = match peer.0.as_deref() {
        Some(Ok(info)) => info.public_key_pin.clone(),
        _ => return Err(ApiError::unauthorized("no client certificate")),
    };
    // Signs and writes: off the async workers.
    crate::store::blocking(move || {
        let issued = app
            .ca
            .sign_csr(&req.csr_pem, &machine_leaf(&app, &name))
            .map_err(|e| ApiError::bad_request(format!("the CSR is not usable: {e}")))?;
        let not_after = issued.not_after;
        let new_key = key_pin(&issued.cert_pem)?;
        let updated = app
            .update_machine_from::<ApiError>(machine, |m| {
                if let Some(at) = m.status.identity_revoked_at {
                    return Err(ApiError::unauthorized(format!(
                        "the identity of machine {name} was revoked at {at}; the machine needs a new ticket"
                    )));
                }
                if matches!(m.status.phase, MachinePhase::Deleting | MachinePhase::Deleted) {
                    return Err(ApiError::forbidden(format!(
                        "machine {name} is being deleted; its certificate is not renewed"
                    )));
                }
                match &m.status.certificate_key {
                    // The current certificate renews; so does a superseded
                    // one asking again for the key it was last issued (the
                    // machine lost the answer and retries).
                    Some(current) if *current != presented && *current != new_key => {
                        // Another holder renewed with this identity since
                        // this certificate was current: one of the two
                        // stole it. Neither keeps it.
                        m.status.identity_revoked_at = Some(drover_common::now());
                        push_event(
                            &mut m.status.events,
                            "IdentityRevoked",
                            "a superseded certificate asked for renewal: two holders of this machine's identity exist, so every certificate of it is revoked",
                        );
                        return Ok(true);
                    }
                    _ => {}
                }
                m.status.certificate_not_after = Some(not_after);
                m.status.certificate_key = Some(new_key.clone());
                Ok(true)
            })?
            .ok_or_else(|| ApiError::unauthorized(format!("machine {name} was deleted")))?;
        if updated.status.identity_revoked_at.is_some() {
            tracing::warn!(machine = %name, "renewal with a superseded certificate: the machine's identity is held twice and is revoked");
            return Err(ApiError::unauthorized(format!(
                "this certificate of machine {name} was superseded by a renewal made by another holder of its identity; the identity is revoked and the machine needs a new ticket"
            )));
        }
        tracing::info!(machine = %name, %not_after, "machine certificate renewed");
        Ok(Json(RenewResponse {
            certificate_pem: issued.cert_pem,
            not_after,
        }))
    })
    .await
}

/// The lines of a failed command's output an event keeps.
const EVENT_OUTPUT_LINES: usize = 5;

/// A bootstrap failure as an event message: the step, the command, how it
/// ended and the last lines of its output.
fn failure_event(step: &str, f: &drover_common::wire::CommandFailure) -> String {
    let ended = match f.exit_code {
        Some(code) => format!("exited with status {code}"),
        None => "did not exit by itself (killed, timed out or not started)".to_owned(),
    };
    let mut message = format!("{step}: `{}` {ended}", f.command);
    let tail = &f.output_tail[f.output_tail.len().saturating_sub(EVENT_OUTPUT_LINES)..];
    if !tail.is_empty() {
        message.push_str("; output ends: ");
        let lines: Vec<String> = tail
            .iter()
            .map(|l| match l.char_indices().nth(EVENT_LINE_CHARS) {
                Some((cut, _)) => format!("{}…", &l[..cut]),
                None => l.clone(),
            })
            .collect();
        message.push_str(&lines.join(" | "));
    }
    message
}

/// The longest output line an event keeps, in characters.
const EVENT_LINE_CHARS: usize = 240;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::bootstrap::join_token_for;
    use drover_common::api::Assignment;
    use drover_common::wire::HealthReport;

    fn machine(phase: MachinePhase, generation: Option<u64>) -> Machine {
        Machine {
            api_version: API_VERSION.into(),
            kind: "Machine".into(),
            metadata: ObjectMeta {
                name: "m".into(),
                ..Default::default()
            },
            spec: MachineSpec {
                pool: "p".into(),
                provider: None,
                assignment: generation.map(|g| Assignment {
                    cluster: "c".into(),
                    cluster_uid: "u".into(),
                    machine_pool: "control-plane".into(),
                    role: MachineRole::Init,
                    generation: g,
                    assigned_at: None,
                    replaces: None,
                    kubernetes_version: None,
                    image: None,
                }),
            },
            status: MachineStatus {
                phase,
                ..Default::default()
            },
        }
    }

    fn hb(phase: AgentPhase, generation: u64) -> HeartbeatRequest {
        HeartbeatRequest {
            phase,
            applied_generation: generation,
            health: HealthReport::default(),
            bootstrap: None,
            directive_results: vec![],
            heartbeat_fallback: None,
            datagrams: false,
            etcd: None,
            nodes: None,
            kubeadm_version: None,
            certificates: None,
            coordinators_digest: None,
        }
    }

    /// A running machine of cluster `c` (uid `u`) with the given role.
    fn member(app: &App, name: &str, role: MachineRole) -> Machine {
        let mut m = machine(MachinePhase::Running, Some(1));
        m.metadata.name = name.into();
        m.metadata.uid = Some(format!("{name}-uid"));
        m.spec.assignment.as_mut().unwrap().role = role;
        app.store.create_json(Kind::Machine, name, &m).unwrap();
        app.machine(name).unwrap().unwrap()
    }

    fn result(id: &str) -> HeartbeatRequest {
        HeartbeatRequest {
            directive_results: vec![drover_common::wire::DirectiveResult {
                id: id.into(),
                ok: true,
                message: String::new(),
            }],
            ..hb(AgentPhase::Running, 1)
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
    async fn only_the_registrar_completes_a_join_token_and_joiners_learn_no_id() {
        let dir = tempfile::tempdir().unwrap();
        let app = App::for_tests(dir.path());
        let cp = member(&app, "cp", MachineRole::Init);
        let worker = member(&app, "worker", MachineRole::Worker);
        // A joiner asks: a token is minted for the registrar, the init machine.
        let e = ApiError::from(join_token_for(app.as_ref(), "c", "u").unwrap_err());
        let reason = e
            .not_ready
            .as_ref()
            .expect("a ConfigNotReady")
            .reason
            .clone();
        let minted = tokens(&app).tokens[0].clone();
        let id = minted.token.id().to_owned();
        assert_eq!(minted.registrar.as_deref(), Some("cp-uid"));
        assert!(
            !reason.contains(&id) && !e.detail.contains(&id),
            "the reason names the pending token: {reason}"
        );
        // The worker is not asked to register it, and claiming it did
        // changes nothing.
        let now = drover_common::now();
        assert!(heartbeat_answer(&app, &worker, now)
            .unwrap()
            .directives
            .is_empty());
        record_heartbeat(&app, worker, &result(&format!("token-{id}")), now).unwrap();
        assert_eq!(
            tokens(&app).tokens[0].state,
            crate::domain::jointokens::TokenState::Pending
        );
        assert!(
            join_token_for(app.as_ref(), "c", "u").is_err(),
            "a joiner waits"
        );
        // The registrar is asked, and its result activates the token.
        let answer = heartbeat_answer(&app, &cp, now).unwrap();
        assert_eq!(answer.directives.len(), 1);
        assert_eq!(answer.directives[0].id, format!("token-{id}"));
        record_heartbeat(&app, cp, &result(&format!("token-{id}")), now).unwrap();
        assert_eq!(
            tokens(&app).tokens[0].state,
            crate::domain::jointokens::TokenState::Active
        );
        assert_eq!(
            join_token_for(app.as_ref(), "c", "u").unwrap(),
            minted.token
        );
    }

    #[test]
    fn waiting_agent_with_assignment_is_assigned() {
        let mut m = machine(MachinePhase::Registered, Some(2));
        apply_heartbeat(&mut m, &hb(AgentPhase::Waiting, 0));
        assert_eq!(m.status.phase, MachinePhase::Assigned);
        apply_heartbeat(&mut m, &hb(AgentPhase::Running, 2));
        assert_eq!(m.status.phase, MachinePhase::Running);
    }

    #[test]
    fn stale_generation_reports_are_ignored() {
        let mut m = machine(MachinePhase::Assigned, Some(3));
        apply_heartbeat(&mut m, &hb(AgentPhase::Running, 2));
        assert_eq!(m.status.phase, MachinePhase::Assigned);
    }

    #[test]
    fn releasing_machine_returns_to_pool_after_reset() {
        let mut m = machine(MachinePhase::Releasing, Some(3));
        // An upgrade its cluster asked for does not follow it to the pool.
        m.status.upgrade = Some(drover_common::api::UpgradeRequest {
            id: "upgrade-n-1".into(),
            version: "v1.32.0".into(),
            command: drover_common::api::UpgradeCommand::Node,
        });
        apply_heartbeat(&mut m, &hb(AgentPhase::Running, 3));
        assert_eq!(m.status.phase, MachinePhase::Releasing);
        assert!(m.spec.assignment.is_some());
        apply_heartbeat(&mut m, &hb(AgentPhase::Waiting, 0));
        assert_eq!(m.status.phase, MachinePhase::Registered);
        assert!(m.spec.assignment.is_none());
        assert!(m.status.upgrade.is_none());
    }
}
