//! The read-only web view at `/ui`: server-rendered HTML (maud escapes
//! every value), one stylesheet served from here, no script, no CDN, no
//! external font, and a Content-Security-Policy that allows nothing else.
//!
//! Signing in takes an admin token (a viewer's is enough). The session is
//! a cookie holding the token's SHA-256 and an expiry, signed with a key
//! derived from the coordinator's ticket key, so every replica accepts it
//! and nothing is kept per session; each page checks the token still
//! exists, so revoking it ends its sessions. The pages show no secret: no
//! token, key, certificate, file content or Secret value. The only forms
//! sign in and out: the view changes nothing.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use drover_common::api::{Cluster, ClusterPhase, Machine, MachinePhase};
use hmac::{Hmac, Mac};
use maud::{html, Markup, DOCTYPE};
use sha2::Sha256;

use super::auth::{admin_for_hash, Admin};
use super::AuditActor;
use crate::app::App;
use crate::domain::secrets::{hash_token, AdminRole};

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "drover_ui";
/// How long a session lasts.
pub const SESSION_SECONDS: i64 = 8 * 3600;

/// Every page's Content-Security-Policy: this origin's stylesheet and
/// nothing else; forms post only here; no framing.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const STYLESHEET: &str = include_str!("ui.css");

/// How many clusters that are not Running the overview lists.
const ATTENTION_ROWS: usize = 50;

/// `GET /ui/static/drover.css`.
pub async fn stylesheet() -> Response {
    let mut r = super::typed_body("text/css; charset=utf-8", STYLESHEET);
    harden(&mut r);
    r
}

/// `GET /ui/login`.
pub async fn login_page() -> Response {
    respond(StatusCode::OK, login_form(None))
}

/// `POST /ui/login`: checks the form's `token` and sets the session
/// cookie.
pub async fn login(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    let token = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let hash = hash_token(token.trim());
    match admin_for_hash(&app, &hash) {
        Ok(admin) => {
            tracing::info!(token = %admin.token_id, "web view: signed in");
            let expires = drover_common::now().unix_timestamp() + SESSION_SECONDS;
            let cookie = format!(
                "{SESSION_COOKIE}={}; Path=/ui; Max-Age={SESSION_SECONDS}; HttpOnly; Secure; SameSite=Strict",
                seal_session(&app, &hash, expires)
            );
            let mut r = Redirect::to("/ui").into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r.extensions_mut().insert(AuditActor(admin.audit_actor()));
            harden(&mut r);
            r
        }
        Err(_) => respond(
            StatusCode::UNAUTHORIZED,
            login_form(Some(
                "That token is not an admin token of this coordinator. Create one with `drover admin-token create --role viewer`.",
            )),
        ),
    }
}

/// `POST /ui/logout`: forgets the cookie. Audited as the session's token
/// when the session is valid; without one, as anonymous (and so counted in
/// the anonymous per-source window).
pub async fn logout(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let mut r = Redirect::to("/ui/login").into_response();
    if let Some(admin) = session(&app, &headers) {
        r.extensions_mut().insert(AuditActor(admin.audit_actor()));
    }
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "drover_ui=; Path=/ui; Max-Age=0; HttpOnly; Secure; SameSite=Strict",
        ),
    );
    harden(&mut r);
    r
}

/// `GET /ui`: the fleet at a glance.
pub async fn overview(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    signed_in(&app, &headers, |admin| {
        // Counts kept up to date from the store's changes, and only the
        // clusters that need attention read: the page costs what it shows,
        // not the fleet.
        let counted = app.with_summary(|s| {
            (
                s.overview(),
                s.clusters_not_in(ClusterPhase::Running, ATTENTION_ROWS),
            )
        });
        let (counts, (attention, needing)) = match counted {
            Ok(c) => c,
            Err(e) => return store_failed(&e),
        };
        let mut clusters = Vec::with_capacity(attention.len());
        for name in &attention {
            match app.cluster_cached(name) {
                Ok(Some(c)) => clusters.push(c),
                Ok(None) => {}
                Err(e) => return store_failed(&e),
            }
        }
        let hour = crate::metrics::global().last_hour();
        let heartbeats: u64 = hour.iter().map(|m| m.heartbeats).sum();
        let remediations: u64 = hour.iter().map(|m| m.remediations).sum();
        let body = html! {
            section.counts {
                div.card { h2 { "Clusters" } p.big #cluster-count { (counts.clusters) }
                    (tally("cluster-phases", &counts.cluster_phases)) }
                div.card { h2 { "Machines" } p.big #machine-count { (counts.machines) }
                    (tally("machine-phases", &counts.machine_phases)) }
                div.card { h2 { "Health" } (tally("machine-health", &counts.machine_health)) }
            }
            section {
                h2 { "The last hour" }
                p #hour-totals {
                    (heartbeats) " heartbeats accepted, " (remediations) " remediations (this replica)"
                }
                (chart("Heartbeats per minute", "hb", hour.iter().map(|m| m.heartbeats).collect()))
                (chart("Remediations per minute", "rem", hour.iter().map(|m| m.remediations).collect()))
            }
            section {
                h2 { "Clusters not Running" }
                p #attention-count {
                    (needing) " of " (counts.clusters) " clusters are not Running"
                    @if needing > clusters.len() { "; the first " (clusters.len()) " by name" }
                    ". " a href="/ui/clusters" { "Every cluster" }
                }
                @if !clusters.is_empty() { (clusters_table_with_id("attention", &clusters)) }
            }
        };
        respond(StatusCode::OK, page("Overview", &admin, body))
    })
}

/// `GET /ui/clusters`.
pub async fn clusters(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let read = || app.clusters().map(Some);
    read_page(&app, &headers, ("clusters", ""), read, |admin, list| {
        let table = clusters_table(&list);
        respond(StatusCode::OK, page("Clusters", &admin, table))
    })
}

/// `GET /ui/clusters/{name}`.
pub async fn cluster(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let read = || -> Result<_, crate::store::StoreError> {
        match app.cluster(&name)? {
            Some(c) => Ok(Some((c, app.machines()?))),
            None => Ok(None),
        }
    };
    let show = |admin: Admin, (c, machines): (Cluster, Vec<Machine>)| {
        let mine: Vec<Machine> = machines
            .into_iter()
            .filter(|m| {
                m.status.phase != MachinePhase::Deleted
                    && m.spec
                        .assignment
                        .as_ref()
                        .is_some_and(|a| a.cluster == c.metadata.name)
            })
            .collect();
        let body = html! {
            dl.facts {
                dt { "Phase" } dd #phase { (c.status.phase) }
                dt { "Kubernetes" } dd { (c.spec.kubernetes_version) }
                dt { "Provider" } dd { (c.spec.provider.name()) }
                dt { "Endpoint" } dd { (c.status.control_plane_endpoint.as_deref().unwrap_or("-")) }
                dt { "Created" } dd { (ago(c.metadata.creation_timestamp)) }
            }
            h2 { "Pools" }
            table #pools {
                thead { tr { th { "Pool" } th { "Desired" } th { "Assigned" } th { "Running" } } }
                tbody { @for p in &c.status.pools {
                    tr { td { (p.name) } td { (p.desired) } td { (p.assigned) } td { (p.running) } }
                } }
            }
            h2 { "Conditions" }
            (conditions(&c.status.conditions))
            h2 { "Nodes" }
            table #nodes {
                thead { tr { th { "Node" } th { "Ready" } th { "Kubelet" } th { "Message" } } }
                tbody { @for n in &c.status.nodes {
                    tr { td { (n.name) } td { (n.ready) } td { (n.kubelet_version) } td { (n.message) } }
                } }
            }
            @if !c.status.addons.is_empty() {
                h2 { "Addons" }
                table #addons {
                    thead { tr { th { "Addon" } th { "Phase" } th { "Applied" } } }
                    tbody { @for a in &c.status.addons {
                        tr { td { (a.name) } td { (format!("{:?}", a.phase)) } td { (ago(a.applied_at)) } }
                    } }
                }
            }
            h2 { "Machines" }
            (machines_table(&app, &mine))
        };
        respond(
            StatusCode::OK,
            page(&format!("Cluster {}", c.metadata.name), &admin, body),
        )
    };
    read_page(&app, &headers, ("cluster", &name), read, show)
}

/// `GET /ui/machines`.
pub async fn machines(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let read = || app.machines().map(Some);
    read_page(&app, &headers, ("machines", ""), read, |admin, list| {
        let live: Vec<Machine> = list
            .into_iter()
            .filter(|m| m.status.phase != MachinePhase::Deleted)
            .collect();
        respond(
            StatusCode::OK,
            page("Machines", &admin, machines_table(&app, &live)),
        )
    })
}

/// `GET /ui/machines/{name}`.
pub async fn machine(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let read = || app.machine(&name);
    read_page(&app, &headers, ("machine", &name), read, |admin, m| {
        let a = m.spec.assignment.as_ref();
        let body = html! {
            dl.facts {
                dt { "Phase" } dd #phase { (m.status.phase) }
                dt { "Health" } dd #health { (health_text(&m)) }
                dt { "Cluster" } dd { @match a {
                    Some(a) => a href={ "/ui/clusters/" (a.cluster) } { (a.cluster) },
                    None => "-",
                } }
                dt { "Pool" } dd { (a.map_or("-", |a| a.machine_pool.as_str())) }
                dt { "Role" } dd { (a.map_or("-".to_owned(), |a| a.role.to_string())) }
                dt { "Host name" } dd { (m.status.hostname) }
                dt { "Addresses" } dd { (m.status.addresses.join(", ")) }
                dt { "Last heartbeat" } dd #last-heartbeat { (ago(app.last_heard(&m.metadata.name).or(m.status.last_heartbeat_time))) }
                dt { "kubeadm" } dd { (m.status.kubeadm_version) }
                dt { "Agent" } dd { (m.status.agent_version) }
                dt { "Provider" } dd { (m.spec.provider.as_deref().unwrap_or("pool")) }
            }
            h2 { "Conditions" }
            (conditions(&m.status.conditions))
            h2 { "Events" }
            table #events {
                thead { tr { th { "When" } th { "Reason" } th { "Message" } } }
                tbody { @for e in m.status.events.iter().rev() {
                    tr { td { (ago(Some(e.time))) } td { (e.reason) } td { (e.message) } }
                } }
            }
        };
        respond(
            StatusCode::OK,
            page(&format!("Machine {}", m.metadata.name), &admin, body),
        )
    })
}

// ---- Sessions.

type HmacSha256 = Hmac<Sha256>;

/// The key that signs sessions: derived from the ticket key, so it is the
/// same on every replica and never the ticket key itself.
fn session_key(app: &App) -> HmacSha256 {
    let mut derive = HmacSha256::new_from_slice(app.keys.ticket_key.as_bytes())
        .expect("HMAC takes any key length");
    derive.update(b"drover web view session v1");
    let key = derive.finalize().into_bytes();
    HmacSha256::new_from_slice(&key).expect("HMAC takes any key length")
}

/// `payload.mac`: the token's hash and the expiry, signed.
fn seal_session(app: &App, hash: &str, expires: i64) -> String {
    let payload = URL_SAFE_NO_PAD.encode(format!("{hash}:{expires}"));
    let mut mac = session_key(app);
    mac.update(payload.as_bytes());
    format!(
        "{payload}.{}",
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    )
}

/// The answer that sends a request without a valid session to sign in.
fn to_login() -> Response {
    let mut r = Redirect::to("/ui/login").into_response();
    harden(&mut r);
    r
}

/// `page` for the signed-in admin of a request, or the way to the login
/// page when there is none.
fn signed_in(app: &App, headers: &HeaderMap, page: impl FnOnce(Admin) -> Response) -> Response {
    match session(app, headers) {
        Some(admin) => page(admin),
        None => to_login(),
    }
}

/// The signed-in admin of a request: its session cookie is signed, not
/// expired, and its token still exists.
fn session(app: &App, headers: &HeaderMap) -> Option<Admin> {
    let value = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(&format!("{SESSION_COOKIE}=")))?;
    let (payload, tag) = value.split_once('.')?;
    let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
    let mut mac = session_key(app);
    mac.update(payload.as_bytes());
    mac.verify_slice(&tag).ok()?;
    let payload = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
    let (hash, expires) = payload.split_once(':')?;
    let expires: i64 = expires.parse().ok()?;
    if expires < drover_common::now().unix_timestamp() {
        return None;
    }
    // A revoked token ends its sessions.
    admin_for_hash(app, hash).ok()
}

// ---- Rendering.

/// Sets the headers every web view answer carries.
fn harden(r: &mut Response) {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

fn respond(status: StatusCode, markup: Markup) -> Response {
    let mut r = (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response();
    harden(&mut r);
    r
}

/// The page `show` makes of what `read` finds, for a signed-in admin; when
/// it finds nothing, the page saying there is no `what` (a kind and a name).
fn read_page<T>(
    app: &App,
    headers: &HeaderMap,
    what: (&str, &str),
    read: impl FnOnce() -> Result<Option<T>, crate::store::StoreError>,
    show: impl FnOnce(Admin, T) -> Response,
) -> Response {
    signed_in(app, headers, |admin| match read() {
        Ok(Some(found)) => show(admin, found),
        Ok(None) => not_found(&admin, what.0, what.1),
        Err(e) => store_failed(&e),
    })
}

fn store_failed(e: &crate::store::StoreError) -> Response {
    tracing::warn!(error = %e, "web view: the store failed");
    respond(
        StatusCode::SERVICE_UNAVAILABLE,
        html! { (DOCTYPE) html lang="en" { head { meta charset="utf-8"; title { "Drover" } }
        body { p { "The coordinator's store did not answer; try again shortly." } } } },
    )
}

fn not_found(admin: &Admin, kind: &str, name: &str) -> Response {
    respond(
        StatusCode::NOT_FOUND,
        page(
            "Not found",
            admin,
            html! { p { "There is no " (kind) " named " code { (name) } "." } },
        ),
    )
}

fn page(title: &str, admin: &Admin, body: Markup) -> Markup {
    let role = match admin.role {
        AdminRole::Admin => "admin",
        AdminRole::Viewer => "viewer",
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Drover · " (title) }
                link rel="stylesheet" href="/ui/static/drover.css";
            }
            body {
                header {
                    span.brand { "Drover" }
                    nav {
                        a href="/ui" { "Overview" }
                        a href="/ui/clusters" { "Clusters" }
                        a href="/ui/machines" { "Machines" }
                    }
                    span.who #who { "token " (admin.token_id) " · " (role) }
                    form.signout method="post" action="/ui/logout" {
                        button type="submit" { "Sign out" }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
                footer { "Read-only view · drover " (env!("CARGO_PKG_VERSION")) }
            }
        }
    }
}

fn login_form(error: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "Drover · sign in" }
                link rel="stylesheet" href="/ui/static/drover.css";
            }
            body.login {
                main {
                    h1 { "Drover" }
                    p { "A read-only view of this coordinator's clusters and machines. Sign in with an admin token; a viewer token is enough." }
                    @if let Some(e) = error { p.error #login-error { (e) } }
                    form method="post" action="/ui/login" {
                        label for="token" { "Admin token" }
                        input #token type="password" name="token" autocomplete="off" required;
                        button type="submit" #sign-in { "Sign in" }
                    }
                }
            }
        }
    }
}

fn tally(id: &str, counts: &[(String, u64)]) -> Markup {
    html! {
        ul.tally id=(id) {
            @for (k, n) in counts { li { span.key { (k) } " " span.n { (n) } } }
            @if counts.is_empty() { li { "none" } }
        }
    }
}

/// A bar chart of one value per minute, as inline SVG (markup, styled by
/// the stylesheet's classes: no inline style or script).
fn chart(title: &str, class: &str, values: Vec<u64>) -> Markup {
    const W: u64 = 600;
    const H: u64 = 80;
    let peak = values.iter().copied().max().unwrap_or(0);
    let max = peak.max(1);
    let n = values.len().max(1) as u64;
    let bar = W / n;
    html! {
        figure.chart {
            figcaption { (title) " · peak " (peak) }
            svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (W) " " (H) } width=(W) height=(H) role="img" aria-label=(title) {
                line.axis x1="0" y1=(H) x2=(W) y2=(H) {}
                @for (i, v) in values.iter().enumerate() {
                    @let h = v * (H - 4) / max;
                    rect class=(class) x=(i as u64 * bar) y=(H - h) width=(bar.saturating_sub(1)) height=(h) {
                        @let ago = n - 1 - i as u64;
                        title { @if ago == 0 { "this minute" } @else { (ago) " min ago" } ": " (v) }
                    }
                }
            }
        }
    }
}

fn clusters_table(list: &[Cluster]) -> Markup {
    clusters_table_with_id("clusters", list)
}

fn clusters_table_with_id(id: &str, list: &[Cluster]) -> Markup {
    html! {
        table id=(id) {
            thead { tr { th { "Cluster" } th { "Phase" } th { "Version" } th { "Pools (running/desired)" } th { "Ready" } } }
            tbody { @for c in list {
                @let ready = c.status.conditions.iter().find(|x| x.type_ == "Ready");
                tr {
                    td { a href={ "/ui/clusters/" (c.metadata.name) } { (c.metadata.name) } }
                    td.phase { (c.status.phase) }
                    td { (c.spec.kubernetes_version) }
                    td { (c.status.pools.iter().map(|p| format!("{} {}/{}", p.name, p.running, p.desired)).collect::<Vec<_>>().join(", ")) }
                    td { @match ready {
                        Some(r) => { (r.status) @if !r.reason.is_empty() { " (" (r.reason) ")" } },
                        None => "-",
                    } }
                }
            } }
        }
    }
}

fn conditions(list: &[drover_common::api::Condition]) -> Markup {
    html! {
        table.conditions {
            thead { tr { th { "Condition" } th { "Status" } th { "Reason" } th { "Message" } th { "Since" } } }
            tbody { @for c in list {
                tr class={ "status-" (c.status.to_lowercase()) } {
                    td { (c.type_) } td { (c.status) } td { (c.reason) } td { (c.message) }
                    td { (ago(Some(c.last_transition_time))) }
                }
            } }
        }
    }
}

fn machines_table(app: &App, list: &[Machine]) -> Markup {
    html! {
        table #machines {
            thead { tr { th { "Machine" } th { "Cluster" } th { "Pool" } th { "Phase" } th { "Health" } th { "Last heartbeat" } th { "Version" } } }
            tbody { @for m in list {
                @let a = m.spec.assignment.as_ref();
                tr {
                    td { a href={ "/ui/machines/" (m.metadata.name) } { (m.metadata.name) } }
                    td { (a.map_or("-", |a| a.cluster.as_str())) }
                    td { (a.map_or("-", |a| a.machine_pool.as_str())) }
                    td.phase { (m.status.phase) }
                    td { (health_text(m)) }
                    td { (ago(app.last_heard(&m.metadata.name).or(m.status.last_heartbeat_time))) }
                    td { (if m.status.kubeadm_version.is_empty() { "-" } else { &m.status.kubeadm_version }) }
                }
            } }
        }
    }
}

/// A machine's health label, with why when it is not healthy.
fn health_text(m: &Machine) -> String {
    let label = crate::domain::fleet_summary::machine_health(m);
    match crate::domain::fleet_summary::not_alive(m) {
        Some(c) if !c.reason.is_empty() => format!("{label} ({})", c.reason),
        _ => label.to_owned(),
    }
}

fn ago(t: Option<time::OffsetDateTime>) -> String {
    match t {
        None => "-".into(),
        Some(_) => format!("{} ago", crate::types::age(t)),
    }
}
