//! The coordinator's objects served the way the Kubernetes API serves
//! its own, so that real kubectl reads them with no management cluster:
//! discovery (`/api`, `/apis`, `/apis/drover.dev/v1alpha1`), and get,
//! list and watch of clusters and machines, as JSON or as a `Table` (the
//! columns of `drover get`, its `-o wide` ones at priority 1), with `limit`
//! and `continue`, `labelSelector` and `fieldSelector=metadata.name`; a
//! watch from a list's `resourceVersion` replays what the change log
//! (`change_log.rs`) holds after it, or answers `410 Gone`; every failure a
//! `metav1.Status` with its `reason` and `code`. Over the same
//! domain and admin tokens as `/v1`, which stays for the CLI.
//!
//! What this copies, from Kubernetes' own sources: the discovery documents
//! (staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/types.go:
//! APIVersions, APIGroupList, APIResourceList), the Table (meta/v1/types.go
//! Table, TableColumnDefinition, TableRow; a row's object is a
//! PartialObjectMetadata), the content negotiation of
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`
//! (apiserver/pkg/endpoints/handlers/response.go), label selectors
//! (apimachinery/pkg/labels/selector.go: `=`, `==`, `!=`, exists, `!`
//! not exists, `in`, `notin`) and Status reasons
//! (apimachinery/pkg/api/errors/errors.go).
//!
//! Invariant: a page's `continue` names the last object read, not the last
//! returned, so a selector that filters a page out never stops a list.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

pub mod access;
pub mod discovery;
pub mod openapi_v3;
pub mod write;

use super::auth::resolve_admin;
use super::error::ApiError;
use super::paging::ListQuery;
use crate::app::App;
use crate::store::{Change, Span, StoreError};

/// The API group Drover's objects are served in.
pub const GROUP: &str = "drover.dev";

/// Its one version.
pub const VERSION: &str = "v1alpha1";

/// A resource served under [`GROUP`].
#[derive(Debug)]
pub struct Resource {
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    short_names: &'static [&'static str],
    verbs: &'static [&'static str],
    /// Whether it has a `status` subresource (read-only: the coordinator
    /// alone writes status).
    status: bool,
    /// Whether only the `admin` role reads it (as through `/v1`).
    admin_only: bool,
    /// The name of its schema in `/openapi.json`.
    schema: &'static str,
    /// A subresource a writer POSTs to for a credential made from the
    /// object, as `serviceaccounts/{name}/token` mints a service
    /// account's tokens.
    mints: Option<Minted>,
}

/// A subresource that mints a credential of its object.
#[derive(Debug)]
pub struct Minted {
    subresource: &'static str,
    /// The kind of the request and the answer.
    kind: &'static str,
    /// The name of the answer's schema in `/openapi.json`.
    schema: &'static str,
}

const CLUSTERS: Resource = Resource {
    plural: "clusters",
    singular: "cluster",
    kind: "Cluster",
    short_names: &["cl"],
    verbs: &[
        "create", "delete", "get", "list", "patch", "update", "watch",
    ],
    status: true,
    admin_only: false,
    schema: "Cluster",
    mints: None,
};

/// Machines are made by the coordinator (a provider's, or registered into
/// a pool): they are read, watched and deleted, never created.
const MACHINES: Resource = Resource {
    plural: "machines",
    singular: "machine",
    kind: "Machine",
    short_names: &["ma"],
    verbs: &["delete", "get", "list", "watch"],
    status: false,
    admin_only: false,
    schema: "Machine",
    mints: None,
};

/// Registration tokens: made with a name (or `generateName`), relabelled,
/// revoked (`spec.revoked`, for good: the rest of the spec is immutable)
/// and deleted as other objects; their tickets, in a bootstrap document
/// for `drover-agent --bootstrap`, come from the `bootstrap` subresource
/// (`kube/write.rs`).
const REGISTRATION_TOKENS: Resource = Resource {
    plural: "registrationtokens",
    singular: "registrationtoken",
    kind: "RegistrationToken",
    short_names: &["rt"],
    verbs: &[
        "create", "delete", "get", "list", "patch", "update", "watch",
    ],
    status: false,
    admin_only: false,
    schema: "RegistrationToken",
    mints: Some(Minted {
        subresource: "bootstrap",
        kind: drover_common::wire::BOOTSTRAP_KIND,
        schema: "BootstrapDocument",
    }),
};

/// Secrets are shown as `/v1` shows them (keys and sizes, never a value)
/// and to the admin role only; written with their values, which no answer
/// holds (`kube/write.rs`).
const SECRETS: Resource = Resource {
    plural: "secrets",
    singular: "secret",
    kind: "Secret",
    short_names: &[],
    verbs: &[
        "create", "delete", "get", "list", "patch", "update", "watch",
    ],
    status: false,
    admin_only: true,
    schema: "SecretInfo",
    mints: None,
};

const RESOURCES: [&Resource; 4] = [&CLUSTERS, &MACHINES, &REGISTRATION_TOKENS, &SECRETS];

/// A failure as the Kubernetes API answers it: a `metav1.Status`.
#[derive(Debug)]
pub struct KubeError {
    error: Box<ApiError>,
    /// The Status's `details`: the object it is about (`name`, `group`,
    /// `kind`).
    object: Option<(&'static Resource, String)>,
}

impl<E: Into<ApiError>> From<E> for KubeError {
    fn from(e: E) -> Self {
        KubeError {
            error: Box::new(e.into()),
            object: None,
        }
    }
}

impl KubeError {
    /// The failure, about the `resource` object `name`.
    fn about(self, resource: &'static Resource, name: &str) -> Self {
        KubeError {
            object: Some((resource, name.to_owned())),
            ..self
        }
    }
}

/// The reasons an [`ApiError`]'s title may name itself, where the status
/// code alone does not say (a 409 is `Conflict` or `AlreadyExists`).
const TITLED_REASONS: [&str; 2] = ["AlreadyExists", "Expired"];

/// The `reason` Kubernetes gives a status code
/// (apimachinery/pkg/api/errors/errors.go).
fn reason(code: StatusCode) -> &'static str {
    match code {
        StatusCode::BAD_REQUEST => "BadRequest",
        StatusCode::UNAUTHORIZED => "Unauthorized",
        StatusCode::FORBIDDEN => "Forbidden",
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowed",
        StatusCode::NOT_ACCEPTABLE => "NotAcceptable",
        StatusCode::CONFLICT => "Conflict",
        StatusCode::GONE => "Expired",
        StatusCode::PAYLOAD_TOO_LARGE => "RequestEntityTooLarge",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "UnsupportedMediaType",
        StatusCode::UNPROCESSABLE_ENTITY => "Invalid",
        StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
        StatusCode::GATEWAY_TIMEOUT => "Timeout",
        _ => "InternalError",
    }
}

impl IntoResponse for KubeError {
    fn into_response(self) -> Response {
        let e = *self.error;
        let conflict = e.status == StatusCode::CONFLICT;
        let mut message = e.detail.clone();
        if !conflict {
            for f in &e.errors {
                message.push_str(&format!("; {}: {}", f.field, f.message));
            }
        }
        let reason = TITLED_REASONS
            .into_iter()
            .find(|r| *r == e.title)
            .unwrap_or_else(|| reason(e.status));
        let mut body = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": e.status.as_u16(),
        });
        let mut details = serde_json::Map::new();
        if let Some((resource, name)) = &self.object {
            details.insert("name".into(), name.clone().into());
            details.insert("group".into(), GROUP.into());
            details.insert("kind".into(), resource.plural.into());
        }
        if !e.errors.is_empty() {
            // Apply conflicts are `FieldManagerConflict` causes
            // (apiserver/pkg/endpoints/handlers/fieldmanager: NewConflictError).
            let cause = if conflict {
                "FieldManagerConflict"
            } else {
                "FieldValueInvalid"
            };
            let causes: Vec<Value> = e
                .errors
                .iter()
                .map(|f| json!({"type": cause, "message": f.message, "field": f.field}))
                .collect();
            details.insert("causes".into(), causes.into());
        }
        if !details.is_empty() {
            body["details"] = Value::Object(details);
        }
        let mut response = (e.status, axum::Json(body)).into_response();
        if let Some(s) = e.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

type KubeResult = Result<Response, KubeError>;

fn json_response(v: Value) -> Response {
    axum::Json(v).into_response()
}

fn group_version() -> String {
    format!("{GROUP}/{VERSION}")
}

/// The Kubernetes API version whose conventions the coordinator follows
/// (and real kubectl of it is tested against).
pub const KUBERNETES_API: (&str, &str) = ("1", "32");

/// `GET /version`: what an API server says of itself
/// (apimachinery/pkg/version/types.go: `Info`), which kubectl, Argo CD and
/// Flux read first; public, as the API server's is (the
/// `system:public-info-viewer` role). Drover's own version is the build
/// metadata.
pub async fn version() -> Response {
    let (major, minor) = KUBERNETES_API;
    json_response(json!({
        "major": major,
        "minor": minor,
        "gitVersion": format!("v{major}.{minor}.0+drover-{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        }),
    }))
}

/// Whether the client asked for a `Table` (kubectl's `get` does), as the
/// API server negotiates it: a media range of `application/json` with
/// `as=Table` and `g=meta.k8s.io`, `v=v1` (or `v1beta1`, answered as
/// v1).
fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let params: Vec<&str> = range.split(';').map(str::trim).collect();
            params.contains(&"as=Table")
                && params.contains(&"g=meta.k8s.io")
                && (params.contains(&"v=v1") || params.contains(&"v=v1beta1"))
        })
}

/// A list call's query: paging, selectors and what kubectl adds.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListParams {
    limit: Option<usize>,
    #[serde(rename = "continue")]
    continue_: Option<String>,
    label_selector: Option<String>,
    field_selector: Option<String>,
    /// `Metadata` (kubectl's), `None` or `Object`: what a Table row
    /// carries.
    include_object: Option<String>,
    /// A list is read from the store as it is, whatever is asked; a watch
    /// starts after this revision (unset or `0`: with the objects there
    /// are now, as ADDED events).
    resource_version: Option<String>,
    /// Accepted and ignored, as `resourceVersion` is for a list.
    #[allow(dead_code)]
    resource_version_match: Option<String>,
    /// A watch instead of a list.
    watch: Option<bool>,
    /// How long a watch lasts (at most [`MAX_WATCH`]).
    timeout_seconds: Option<u64>,
    /// Whether a watch sends BOOKMARK events.
    allow_watch_bookmarks: Option<bool>,
    /// Sent by informers; accepted and ignored.
    #[allow(dead_code)]
    send_initial_events: Option<bool>,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => !labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        }
    }
}

/// Splits `s` at the commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (vec![], 0usize, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Parses a label selector (apimachinery/pkg/labels/selector.go's
/// grammar): requirements separated by commas, each `k=v`, `k==v`,
/// `k!=v`, `k`, `!k`, `k in (a,b)` or `k notin (a,b)`.
fn parse_label_selector(s: &str) -> Result<Vec<Requirement>, ApiError> {
    let bad = |part: &str, why: &str| {
        ApiError::bad_request(format!(
            "labelSelector {s:?}: {part:?} {why}; write requirements as k=v, k!=v, k, !k, k in (a,b) or k notin (a,b), separated by commas"
        ))
    };
    let mut out = vec![];
    for part in split_top(s).into_iter().map(str::trim) {
        if part.is_empty() {
            continue;
        }
        let set = |rest: &str| -> Option<Vec<String>> {
            let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
            Some(inner.split(',').map(|v| v.trim().to_owned()).collect())
        };
        let r = if let Some(k) = part.strip_prefix('!') {
            Requirement::NotExists(k.trim().to_owned())
        } else if let Some((k, v)) = part.split_once("!=") {
            Requirement::NotEquals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            Requirement::Equals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, rest)) = part.split_once(" notin ") {
            let vs = set(rest).ok_or_else(|| bad(part, "needs a set in parentheses"))?;
            Requirement::NotIn(k.trim().to_owned(), vs)
        } else if let Some((k, rest)) = part.split_once(" in ") {
            let vs = set(rest).ok_or_else(|| bad(part, "needs a set in parentheses"))?;
            Requirement::In(k.trim().to_owned(), vs)
        } else if part.contains(|c: char| c.is_whitespace() || "()".contains(c)) {
            return Err(bad(part, "is not a requirement"));
        } else {
            Requirement::Exists(part.to_owned())
        };
        out.push(r);
    }
    Ok(out)
}

/// Parses a field selector: only `metadata.name` (`=`, `==`, `!=`) is
/// served, as for most resources of the Kubernetes API.
fn parse_field_selector(s: &str) -> Result<Vec<(bool, String)>, ApiError> {
    let mut out = vec![];
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
            (f, false, v)
        } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            (f, true, v)
        } else {
            return Err(ApiError::bad_request(format!(
                "fieldSelector {s:?}: {part:?} is not field=value or field!=value"
            )));
        };
        if field.trim() != "metadata.name" {
            return Err(ApiError::bad_request(format!(
                "fieldSelector {s:?}: field label {:?} is not supported; only metadata.name is",
                field.trim()
            )));
        }
        out.push((equal, value.trim().to_owned()));
    }
    Ok(out)
}

/// What a list keeps of each object read.
struct Selection {
    labels: Vec<Requirement>,
    names: Vec<(bool, String)>,
}

impl Selection {
    fn of(p: &ListParams) -> Result<Self, ApiError> {
        Ok(Self {
            labels: p
                .label_selector
                .as_deref()
                .map(parse_label_selector)
                .transpose()?
                .unwrap_or_default(),
            names: p
                .field_selector
                .as_deref()
                .map(parse_field_selector)
                .transpose()?
                .unwrap_or_default(),
        })
    }

    fn keeps(&self, meta: &drover_common::api::ObjectMeta) -> bool {
        self.labels.iter().all(|r| r.matches(&meta.labels))
            && self
                .names
                .iter()
                .all(|(equal, name)| (meta.name == *name) == *equal)
    }
}

/// How one kind is listed, shown and tabled.
struct Kind<T> {
    resource: &'static Resource,
    stored: crate::store::Kind,
    page: fn(&App, Span<'_>) -> Result<Vec<T>, StoreError>,
    get: fn(&App, &str) -> Result<Option<T>, StoreError>,
    meta: fn(&T) -> &drover_common::api::ObjectMeta,
    table: fn(&[T], bool) -> Vec<Vec<String>>,
    /// What a viewer's token is shown of an object (as through `/v1`).
    for_viewer: fn(T) -> T,
}

impl<T> Kind<T> {
    /// Refuses `admin` a kind its role does not read.
    fn check_reader(&self, admin: &super::auth::Admin) -> Result<(), ApiError> {
        if self.resource.admin_only && admin.role != crate::types::AdminRole::Admin {
            return Err(ApiError::forbidden(format!(
                "token {} has the viewer role and cannot read {}",
                admin.token_id, self.resource.plural
            )));
        }
        Ok(())
    }

    /// `o` as `admin` may see it.
    fn as_seen_by(&self, admin: &super::auth::Admin, o: T) -> T {
        match admin.role {
            crate::types::AdminRole::Admin => o,
            crate::types::AdminRole::Viewer => (self.for_viewer)(o),
        }
    }
}

const CLUSTER_KIND: Kind<drover_common::api::Cluster> = Kind {
    resource: &CLUSTERS,
    stored: crate::store::Kind::Cluster,
    page: App::clusters_page,
    get: App::cluster,
    meta: |c| &c.metadata,
    table: crate::tables::clusters_table,
    for_viewer: crate::domain::customise::for_viewer,
};

const TOKEN_KIND: Kind<drover_common::api::RegistrationToken> = Kind {
    resource: &REGISTRATION_TOKENS,
    stored: crate::store::Kind::RegistrationToken,
    page: |app, span| {
        Ok(app
            .store
            .list_json_page::<drover_common::api::RegistrationToken>(
                crate::store::Kind::RegistrationToken,
                span,
            )?
            .into_iter()
            .map(|(mut t, rev)| {
                t.metadata.resource_version = Some(rev.to_string());
                t
            })
            .collect())
    },
    get: |app, name| {
        Ok(app
            .store
            .get_json::<drover_common::api::RegistrationToken>(
                crate::store::Kind::RegistrationToken,
                name,
            )?
            .map(|(mut t, rev)| {
                t.metadata.resource_version = Some(rev.to_string());
                t
            }))
    },
    meta: |t| &t.metadata,
    table: crate::tables::tokens_table,
    for_viewer: |t| t,
};

const SECRET_KIND: Kind<drover_common::api::SecretInfo> = Kind {
    resource: &SECRETS,
    stored: crate::store::Kind::UserSecret,
    page: |app, span| {
        app.store
            .list_json_page::<crate::domain::user_secrets::StoredSecret>(
                crate::store::Kind::UserSecret,
                span,
            )?
            .into_iter()
            .map(|(s, rev)| s.info(rev))
            .collect()
    },
    get: |app, name| {
        crate::domain::user_secrets::get(&app.store, name)?
            .map(|(s, rev)| s.info(rev))
            .transpose()
    },
    meta: |s| &s.metadata,
    table: crate::tables::secrets_table,
    for_viewer: |s| s,
};

const MACHINE_KIND: Kind<drover_common::api::Machine> = Kind {
    resource: &MACHINES,
    stored: crate::store::Kind::Machine,
    page: App::machines_page,
    get: App::machine,
    meta: |m| &m.metadata,
    table: crate::tables::machines_table,
    for_viewer: |m| m,
};

/// A column's name as the API gives it (`CONTROL-PLANE` is
/// `Control-Plane`; kubectl prints it upper-cased again).
fn column_name(header: &str) -> String {
    let mut out = String::with_capacity(header.len());
    let mut start = true;
    for c in header.chars() {
        out.extend(if start {
            c.to_uppercase().collect::<Vec<_>>()
        } else {
            c.to_lowercase().collect()
        });
        start = !c.is_alphanumeric();
    }
    out
}

/// `objects` as a `Table`: the CLI's columns (its wide ones at priority
/// 1), each row with the object's metadata unless `include_object` is
/// `None`.
fn table<T: serde::Serialize>(kind: &Kind<T>, objects: &[T], include: &str, meta: Value) -> Value {
    let narrow = (kind.table)(&[], false)[0].len();
    let rows = (kind.table)(objects, true);
    let header = rows.first().cloned().unwrap_or_default();
    let columns: Vec<Value> = header
        .iter()
        .enumerate()
        .map(|(i, h)| {
            json!({
                "name": column_name(h),
                "type": "string",
                "format": if i == 0 { "name" } else { "" },
                "description": "",
                "priority": if i < narrow { 0 } else { 1 },
            })
        })
        .collect();
    let rows: Vec<Value> = rows
        .iter()
        .skip(1)
        .zip(objects)
        .map(|(cells, o)| {
            let object = match include {
                "None" => Value::Null,
                "Object" => serde_json::to_value(o).unwrap_or(Value::Null),
                _ => json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": serde_json::to_value((kind.meta)(o)).unwrap_or(Value::Null),
                }),
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

async fn list<T: serde::Serialize + Clone + Send + Sync + 'static>(
    app: Arc<App>,
    headers: HeaderMap,
    params: ListParams,
    kind: &'static Kind<T>,
) -> KubeResult {
    let admin = resolve_admin(&app, &headers)?;
    kind.check_reader(&admin)?;
    let selection = Selection::of(&params)?;
    if params.watch == Some(true) {
        return watch(app, admin, &headers, &params, selection, kind);
    }
    // The list's resourceVersion: the store's revision before it is read,
    // so a watch from it misses nothing (it may repeat a change the list
    // already shows).
    let revision = crate::store::blocking({
        let app = app.clone();
        move || app.store.revision()
    })
    .await?;
    let page = ListQuery {
        limit: params.limit,
        continue_: params.continue_.clone(),
    }
    .page()?;
    let mut read = page.read(&app, kind.page).await?;
    let next = match page.limit {
        Some(limit) if read.len() > limit => {
            read.truncate(limit);
            read.last()
                .map(|o| super::paging::encode_token(&(kind.meta)(o).name))
        }
        _ => None,
    };
    let items: Vec<T> = read
        .into_iter()
        .filter(|o| selection.keeps((kind.meta)(o)))
        .map(|o| kind.as_seen_by(&admin, o))
        .collect();
    let mut meta = json!({"resourceVersion": revision.to_string()});
    if let Some(token) = next {
        meta["continue"] = token.into();
    }
    if wants_table(&headers) {
        let include = params.include_object.as_deref().unwrap_or("Metadata");
        return Ok(json_response(table(kind, &items, include, meta)));
    }
    Ok(json_response(json!({
        "apiVersion": group_version(),
        "kind": format!("{}List", kind.resource.kind),
        "metadata": meta,
        "items": items,
    })))
}

/// The longest a watch lasts; the client watches again from where it got.
pub const MAX_WATCH: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// How often a watch that asked for them gets a BOOKMARK.
pub const BOOKMARK_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// One watch event as a line of the stream (`application/json`,
/// newline-delimited, as the API server streams them).
fn event_line(kind: &str, object: Value) -> bytes::Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    line.push(b'\n');
    line.into()
}

/// What a watch sends of `object`: itself, or a one-row Table.
fn watched<T: serde::Serialize>(kind: &Kind<T>, object: &T, table_rows: bool) -> Value {
    if table_rows {
        table(kind, std::slice::from_ref(object), "Metadata", json!({}))
    } else {
        serde_json::to_value(object).unwrap_or(Value::Null)
    }
}

/// What a watch sends of an object deleted (or no longer selected): its
/// name and the revision of the change (a Table row: the name, the other
/// cells empty), as a watch keeps no objects.
fn deleted_stub<T: serde::Serialize>(
    kind: &Kind<T>,
    name: &str,
    revision: u64,
    table_rows: bool,
) -> Value {
    let metadata = json!({"name": name, "resourceVersion": revision.to_string()});
    if !table_rows {
        return json!({
            "apiVersion": group_version(),
            "kind": kind.resource.kind,
            "metadata": metadata,
        });
    }
    let mut t = table(kind, &[], "Metadata", json!({}));
    let columns = t["columnDefinitions"].as_array().map_or(1, Vec::len);
    let mut cells = vec![Value::from(name)];
    cells.resize(columns, Value::from(""));
    t["rows"] = json!([{
        "cells": cells,
        "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata},
    }]);
    t
}

/// A watch of `kind`: from `resourceVersion` (the changes after it, which
/// the change log must still hold, else `410 Gone`), or, without one, the
/// objects there are now as ADDED events then every change; each change
/// sends the object as it is when read (so several changes may arrive as
/// one), DELETED (its name and revision) when it is gone or stops matching
/// the selectors;
/// BOOKMARKs every [`BOOKMARK_EVERY`] when asked; ends after
/// `timeoutSeconds` (at most [`MAX_WATCH`]), or with an ERROR event
/// (`Expired`) when it fell behind the change log.
fn watch<T>(
    app: Arc<App>,
    admin: super::auth::Admin,
    headers: &HeaderMap,
    params: &ListParams,
    selection: Selection,
    kind: &'static Kind<T>,
) -> KubeResult
where
    T: serde::Serialize + Clone + Send + Sync + 'static,
{
    let log = app.fleet.changes.clone();
    let from = match params.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(v) => Some(v.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion {v:?} is not a revision this coordinator gives; watch without one, or from a list's"
            ))
        })?),
    };
    let starting = || ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Starting",
            "this coordinator is starting its change log; watch again in a moment",
        )
    };
    if log.head().is_none() {
        return Err(starting().into());
    }
    let start = match from {
        Some(rv) => {
            if let Err(e) = log.since(kind.stored, rv) {
                return Err(ApiError::new(StatusCode::GONE, "Expired", e.to_string()).into());
            }
            rv
        }
        None => log.head().ok_or_else(starting)?,
    };
    let table_rows = wants_table(headers);
    let timeout = params
        .timeout_seconds
        .map(std::time::Duration::from_secs)
        .unwrap_or(MAX_WATCH)
        .min(MAX_WATCH);
    let bookmarks = params.allow_watch_bookmarks == Some(true);
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        // The names the client holds: a watch keeps no objects, so a
        // watch of 100,000 machines costs their names, not their records.
        let mut seen: std::collections::BTreeSet<String> = Default::default();
        let mut cursor = start;
        let send = |line| tx.send(line);
        if from.is_none() {
            let all = crate::store::blocking({
                let app = app.clone();
                move || {
                    (kind.page)(
                        &app,
                        Span {
                            after: "",
                            limit: None,
                        },
                    )
                }
            })
            .await;
            let Ok(all) = all else { return };
            for o in all
                .into_iter()
                .filter(|o| selection.keeps((kind.meta)(o)))
                .map(|o| kind.as_seen_by(&admin, o))
            {
                if send(event_line("ADDED", watched(kind, &o, table_rows)))
                    .await
                    .is_err()
                {
                    return;
                }
                seen.insert((kind.meta)(&o).name.clone());
            }
        }
        let mut last_bookmark = tokio::time::Instant::now();
        loop {
            let notified = log.changed();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (changes, head) = match log.since(kind.stored, cursor) {
                Ok(c) => c,
                Err(e) => {
                    let status =
                        KubeError::from(ApiError::new(StatusCode::GONE, "Expired", e.to_string()));
                    let body = axum::body::to_bytes(status.into_response().into_body(), 1 << 20)
                        .await
                        .unwrap_or_default();
                    let object: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let _ = send(event_line("ERROR", object)).await;
                    return;
                }
            };
            // The newest change of each object, in revision order.
            let mut newest: Vec<&Change> = vec![];
            for c in changes.iter().rev() {
                if !newest.iter().any(|n| n.name == c.name) {
                    newest.push(c);
                }
            }
            newest.reverse();
            for c in newest {
                let now = if c.deleted {
                    None
                } else {
                    let (app, name) = (app.clone(), c.name.clone());
                    match crate::store::blocking(move || (kind.get)(&app, &name)).await {
                        Ok(o) => o,
                        Err(_) => return,
                    }
                };
                let line = match now.filter(|o| selection.keeps((kind.meta)(o))) {
                    Some(o) => {
                        let o = kind.as_seen_by(&admin, o);
                        let what = if seen.insert(c.name.clone()) {
                            "ADDED"
                        } else {
                            "MODIFIED"
                        };
                        event_line(what, watched(kind, &o, table_rows))
                    }
                    // Gone, or no longer selected: DELETED, if the client
                    // holds it (or may: it watches from a revision).
                    None if seen.remove(&c.name) || (c.deleted && from.is_some()) => event_line(
                        "DELETED",
                        deleted_stub(kind, &c.name, c.revision, table_rows),
                    ),
                    None => continue,
                };
                if send(line).await.is_err() {
                    return;
                }
            }
            cursor = head;
            let bookmark_at = last_bookmark + BOOKMARK_EVERY;
            tokio::select! {
                _ = &mut notified => {}
                _ = tx.closed() => return,
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tokio::time::sleep_until(bookmark_at), if bookmarks => {
                    let mark = json!({
                        "apiVersion": group_version(),
                        "kind": kind.resource.kind,
                        "metadata": {"resourceVersion": cursor.to_string()},
                    });
                    if send(event_line("BOOKMARK", mark)).await.is_err() {
                        return;
                    }
                    last_bookmark = tokio::time::Instant::now();
                }
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|line| (Ok::<_, std::convert::Infallible>(line), rx))
    });
    let mut response = Response::new(axum::body::Body::from_stream(stream));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

async fn get_one<T: serde::Serialize + Send + 'static>(
    app: Arc<App>,
    headers: HeaderMap,
    name: String,
    kind: &'static Kind<T>,
) -> KubeResult {
    let admin = resolve_admin(&app, &headers)?;
    kind.check_reader(&admin)?;
    let found = crate::store::blocking({
        let (app, name) = (app.clone(), name.clone());
        move || (kind.get)(&app, &name)
    })
    .await?
    .ok_or_else(|| {
        ApiError::not_found(
            &format!("{}.{GROUP}", kind.resource.plural),
            &format!("{name:?}"),
        )
    })?;
    let found = kind.as_seen_by(&admin, found);
    if wants_table(&headers) {
        return Ok(json_response(table(
            kind,
            std::slice::from_ref(&found),
            "Metadata",
            json!({}),
        )));
    }
    Ok(json_response(
        serde_json::to_value(&found).map_err(ApiError::internal)?,
    ))
}

/// `GET /apis/drover.dev/v1alpha1/clusters`.
pub async fn list_clusters(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(params): Query<ListParams>,
) -> KubeResult {
    list(app, headers, params, &CLUSTER_KIND).await
}

/// `GET /apis/drover.dev/v1alpha1/clusters/{name}`.
pub async fn get_cluster(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> KubeResult {
    get_one(app, headers, name, &CLUSTER_KIND).await
}

/// `GET /apis/drover.dev/v1alpha1/machines`.
pub async fn list_machines(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(params): Query<ListParams>,
) -> KubeResult {
    list(app, headers, params, &MACHINE_KIND).await
}

/// `GET /apis/drover.dev/v1alpha1/machines/{name}`.
pub async fn get_machine(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> KubeResult {
    get_one(app, headers, name, &MACHINE_KIND).await
}

/// `GET /apis/drover.dev/v1alpha1/registrationtokens`.
pub async fn list_tokens(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(params): Query<ListParams>,
) -> KubeResult {
    list(app, headers, params, &TOKEN_KIND).await
}

/// `GET /apis/drover.dev/v1alpha1/registrationtokens/{name}`.
pub async fn get_token(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> KubeResult {
    get_one(app, headers, name, &TOKEN_KIND).await
}

/// `GET /apis/drover.dev/v1alpha1/secrets`.
pub async fn list_secrets(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(params): Query<ListParams>,
) -> KubeResult {
    list(app, headers, params, &SECRET_KIND).await
}

/// `GET /apis/drover.dev/v1alpha1/secrets/{name}`.
pub async fn get_secret(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> KubeResult {
    get_one(app, headers, name, &SECRET_KIND).await
}

/// Any other path under `/apis`: a Status, as the API server answers.
pub async fn not_found() -> KubeResult {
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "Not found",
        "the server could not find the requested resource",
    )
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selectors_parse_and_match_as_kubernetes_does() {
        let env = labels(&[("env", "prod"), ("tier", "web")]);
        let matches = |s: &str| {
            parse_label_selector(s)
                .unwrap()
                .iter()
                .all(|r| r.matches(&env))
        };
        assert!(matches("env=prod"));
        assert!(matches("env==prod,tier"));
        assert!(matches("env in (dev, prod),!team"));
        assert!(!matches("env notin (prod)"));
        assert!(!matches("env!=prod"));
        assert!(!matches("team"));
        assert!(matches(""));
        let e = parse_label_selector("env in prod").unwrap_err();
        assert!(
            e.detail.contains("needs a set in parentheses"),
            "{}",
            e.detail
        );
        let e = parse_field_selector("spec.x=1").unwrap_err();
        assert!(e.detail.contains("only metadata.name"), "{}", e.detail);
        assert_eq!(
            parse_field_selector("metadata.name!=a").unwrap(),
            vec![(false, "a".to_string())]
        );
    }

    #[test]
    fn a_table_is_asked_as_kubectl_asks_it() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
            ),
        );
        assert!(wants_table(&h));
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        assert!(!wants_table(&h));
        assert_eq!(column_name("CONTROL-PLANE"), "Control-Plane");
        assert_eq!(column_name("NAME"), "Name");
    }

    #[test]
    fn failures_are_statuses_with_kubernetes_reasons() {
        let r =
            KubeError::from(ApiError::not_found("clusters.drover.dev", "\"x\"")).into_response();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert_eq!(reason(StatusCode::UNPROCESSABLE_ENTITY), "Invalid");
        assert_eq!(reason(StatusCode::FORBIDDEN), "Forbidden");
    }
}
