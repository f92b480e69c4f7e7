//! Writes through the Kubernetes-style API: create, update (with
//! `resourceVersion` preconditions), delete, JSON merge patch, JSON patch
//! and server-side apply of clusters and Secrets; delete of machines. Each
//! takes `dryRun=All`, `fieldManager` and `fieldValidation`, and lands
//! through the same [`write_cluster`] or [`write_secret`] as `drover
//! apply`.
//!
//! What this copies, from Kubernetes' own sources:
//! - the patch types and the 415 for others
//!   (apiserver/pkg/endpoints/handlers/patch.go: `PatchResource`; custom
//!   resources refuse strategic merge patch);
//! - field validation (apiserver/pkg/endpoints/handlers/rest.go:
//!   `fieldValidation`; Strict is a 400 `strict decoding error: unknown
//!   field "spec.x"`, Warn a `Warning: 299 - "unknown field \"spec.x\""`
//!   header, Ignore drops them; unset is Warn);
//! - a patched object whose `metadata.resourceVersion` is not the stored
//!   one is a 409, as the API server's optimistic concurrency makes it
//!   (apiserver/pkg/registry/generic/registry/store.go: `Update`);
//! - server-side apply needs a `fieldManager` (422 otherwise:
//!   apiserver/pkg/endpoints/handlers/patch.go `applyPatcher`), and its
//!   conflicts are a 409 naming each other manager and field
//!   (see `domain::managed_fields`);
//! - the default manager of a write without `fieldManager` is the
//!   User-Agent's product (fieldmanager.go: `prefixFromUserAgent`);
//! - `DeleteOptions` preconditions (`uid`, `resourceVersion`) and
//!   `propagationPolicy` (meta/v1/types.go).
//!
//! Drover's deletion is already what `Foreground` asks: a cluster keeps
//! existing, with `deletionTimestamp` set, until its machines are
//! released, then goes. `Background` is answered the same way (the
//! machines cannot outlive their cluster's record); `Orphan` is refused,
//! as no machine may outlive its cluster.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use drover_common::api::{
    Cluster, FieldError, ManagedFieldsEntry, ObjectMeta, RegistrationToken, Secret,
};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{KubeError, KubeResult, Resource, CLUSTERS, MACHINES, REGISTRATION_TOKENS, SECRETS};
use crate::app::App;
use crate::domain::managed_fields;
use crate::domain::user_secrets::StoredSecret;
use crate::http::auth::{resolve_admin, Admin};
use crate::http::cluster_write::{write_cluster, Creation, Decided, Said, Write};
use crate::http::error::ApiError;
use crate::http::secrets::write_secret;
use crate::http::tokens::{remove_token, write_token};
use crate::http::AuditChanges;
use drover_common::wire::BOOTSTRAP_KIND;

/// The query of a write.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteParams {
    dry_run: Option<String>,
    field_manager: Option<String>,
    field_validation: Option<String>,
    force: Option<bool>,
    propagation_policy: Option<String>,
    /// Accepted and ignored: Drover's deletion has no grace period.
    #[allow(dead_code)]
    grace_period_seconds: Option<i64>,
    /// Accepted and ignored: answers are always indented the same.
    #[allow(dead_code)]
    pretty: Option<String>,
}

/// What a write does about fields the schema does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Strict,
    Warn,
    Ignore,
}

/// A write's options, checked.
struct Options {
    dry_run: bool,
    manager: Option<String>,
    validation: FieldValidation,
    force: bool,
}

/// The longest field manager name (apiserver/pkg/endpoints/handlers/rest.go
/// `validateFieldManagerName`'s limit).
const MAX_MANAGER: usize = 128;

fn dry_run_of(v: Option<&str>) -> Result<bool, ApiError> {
    match v {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "dryRun {other:?} is not supported; the only value is All"
        ))),
    }
}

impl WriteParams {
    fn options(&self, headers: &HeaderMap) -> Result<Options, ApiError> {
        let validation = match self.field_validation.as_deref() {
            None | Some("") | Some("Warn") => FieldValidation::Warn,
            Some("Strict") => FieldValidation::Strict,
            Some("Ignore") => FieldValidation::Ignore,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "fieldValidation {other:?} is not one of Strict, Warn, Ignore"
                )))
            }
        };
        let manager = match self.field_manager.as_deref() {
            Some(m) if m.len() > MAX_MANAGER || m.chars().any(|c| c.is_control()) => {
                return Err(ApiError::invalid(
                    "the field manager is invalid; nothing was changed",
                    vec![FieldError {
                        field: "fieldManager".into(),
                        message: format!("must be at most {MAX_MANAGER} printable characters"),
                    }],
                ))
            }
            Some(m) if !m.is_empty() => Some(m.to_owned()),
            _ => None,
        };
        Ok(Options {
            dry_run: dry_run_of(self.dry_run.as_deref())?,
            manager: manager.or_else(|| user_agent_manager(headers)),
            validation,
            force: self.force == Some(true),
        })
    }
}

/// The manager of a write that names none: the User-Agent up to its first
/// `/` (`kubectl` for `kubectl/v1.32.0 (linux/amd64) ...`).
fn user_agent_manager(headers: &HeaderMap) -> Option<String> {
    let agent = headers.get(header::USER_AGENT)?.to_str().ok()?;
    let product = agent.split('/').next()?.trim();
    (!product.is_empty()).then(|| product.chars().take(MAX_MANAGER).collect())
}

/// A request body whose refusals are Statuses.
pub struct KubeBody(pub axum::body::Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for KubeBody {
    type Rejection = KubeError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, KubeError> {
        let crate::http::body::RawBody(b) =
            crate::http::body::RawBody::from_request(req, state).await?;
        Ok(KubeBody(b))
    }
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// A body as JSON: JSON, or YAML (which JSON is too).
fn parse_body(body: &[u8], what: &str) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request(format!("the {what} is not UTF-8 text")))?;
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Ok(v);
    }
    serde_saphyr::from_str::<Value>(text).map_err(|e| {
        ApiError::bad_request(format!(
            "the {what} is neither JSON nor YAML: {}",
            crate::types::yaml_error(&e, None, 1)
        ))
    })
}

/// Where a `serde_path_to_error` path points in a JSON value.
fn json_path(path: &serde_path_to_error::Path) -> Option<Vec<Result<String, usize>>> {
    use serde_path_to_error::Segment;
    path.iter()
        .map(|s| match s {
            Segment::Map { key } => Some(Ok(key.clone())),
            Segment::Enum { variant } => Some(Ok(variant.clone())),
            Segment::Seq { index } => Some(Err(*index)),
            Segment::Unknown => None,
        })
        .collect()
}

fn display_path(path: &[Result<String, usize>]) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Ok(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Err(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn remove_path(doc: &mut Value, path: &[Result<String, usize>]) -> bool {
    let Some((last, parent)) = path.split_last() else {
        return false;
    };
    let mut at = doc;
    for s in parent {
        let next = match s {
            Ok(k) => at.get_mut(k.as_str()),
            Err(i) => at.get_mut(*i),
        };
        match next {
            Some(n) => at = n,
            None => return false,
        }
    }
    match (last, at) {
        (Ok(k), Value::Object(m)) => m.remove(k).is_some(),
        _ => false,
    }
}

/// Decodes `doc` as a `kind` object, doing with fields its schema does not
/// know what `validation` says: each is an error (Strict), a warning
/// (Warn) or dropped (Ignore). Any other mismatch is a 422 naming the
/// field. Returns the object and the warnings.
pub fn decode<T: serde::de::DeserializeOwned>(
    kind: &str,
    mut doc: Value,
    validation: FieldValidation,
) -> Result<(T, Vec<String>), ApiError> {
    let mut unknown = vec![];
    // Each round drops one unknown field; a document has finitely many.
    loop {
        let e = match serde_path_to_error::deserialize::<_, T>(&doc) {
            Ok(v) => {
                if validation == FieldValidation::Strict && !unknown.is_empty() {
                    let list: Vec<String> = unknown
                        .iter()
                        .map(|f| format!("unknown field {f:?}"))
                        .collect();
                    return Err(ApiError::bad_request(format!(
                        "{kind} cannot be handled: strict decoding error: {}; remove them, or send fieldValidation=Warn to drop them",
                        list.join(", ")
                    )));
                }
                let warnings = match validation {
                    FieldValidation::Warn => unknown
                        .iter()
                        .map(|f| format!("unknown field {f:?}"))
                        .collect(),
                    _ => vec![],
                };
                return Ok((v, warnings));
            }
            Err(e) => e,
        };
        let message = e.inner().to_string();
        let field = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
            .map(str::to_owned);
        let path = json_path(e.path());
        if let (Some(field), Some(mut path)) = (field, path) {
            if path.last() != Some(&Ok(field.clone())) {
                path.push(Ok(field));
            }
            if remove_path(&mut doc, &path) {
                unknown.push(display_path(&path));
                continue;
            }
        }
        let at = e.path().to_string();
        return Err(ApiError::invalid(
            format!("the {kind} does not match the schema; nothing was changed"),
            vec![FieldError {
                field: if at == "." { "(document)".into() } else { at },
                message,
            }],
        ));
    }
}

/// A written object as the API server answers it, with the warnings and
/// the changes for the audit log.
fn written<T: serde::Serialize>(
    status: StatusCode,
    object: &T,
    warnings: &[String],
    changes: AuditChanges,
) -> KubeResult {
    let mut response = (
        status,
        axum::Json(serde_json::to_value(object).map_err(ApiError::internal)?),
    )
        .into_response();
    for w in warnings {
        // RFC 7234 warn-code 299, agent `-`, the text quoted.
        let text = format!("299 - {}", Value::from(w.as_str()));
        if let Ok(v) = HeaderValue::from_str(&text) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response.extensions_mut().insert(changes);
    Ok(response)
}

fn writer(app: &App, headers: &HeaderMap) -> Result<Admin, ApiError> {
    let admin = resolve_admin(app, headers)?;
    admin.require_write()?;
    Ok(admin)
}

/// Refuses a document whose `apiVersion` or `kind` is not a Cluster's.
fn check_type(doc: &Value, kind: &str) -> Result<(), ApiError> {
    let api_version = doc.get("apiVersion").and_then(Value::as_str);
    let found = doc.get("kind").and_then(Value::as_str);
    if api_version != Some(drover_common::API_VERSION) || found != Some(kind) {
        return Err(ApiError::bad_request(format!(
            "the document is {}/{}, not {}/{kind}; send it to the resource it is",
            api_version.unwrap_or("(no apiVersion)"),
            found.unwrap_or("(no kind)"),
            drover_common::API_VERSION,
        )));
    }
    Ok(())
}

/// How a write decides the object it wants from the stored one.
pub type Decide<'a, C, W> = dyn FnMut(Option<&C>) -> Result<W, ApiError> + 'a;

/// A kind written here: how one write of it lands, through the write
/// `/v1` uses too. [`create`], [`replace`] and [`patch`] are its POST,
/// PUT and PATCH handlers.
pub trait Writer {
    /// The stored object a write is decided against.
    type Current;
    /// What the caller decides.
    type Wanted;
    /// What the answer shows.
    type Shown: serde::Serialize + Send + 'static;
    const RESOURCE: &'static Resource;
    fn write(
        app: &App,
        w: &Write<'_>,
        decide: &mut Decide<'_, Self::Current, Self::Wanted>,
    ) -> Result<(StatusCode, AuditChanges, Self::Shown), ApiError>;
    /// The stored object's resourceVersion.
    fn revision(current: &Self::Current) -> Option<String>;
    /// The stored object as a document a patch applies to (never sent:
    /// a Secret's has its values).
    fn document(current: &Self::Current) -> Result<Value, ApiError>;
    /// A whole document as the object wanted; its managedFields are the
    /// write's to set.
    fn wanted(
        doc: Value,
        validation: FieldValidation,
    ) -> Result<(Self::Wanted, Vec<String>), ApiError>;
    /// The top-level fields an applied configuration may carry besides
    /// `apiVersion`, `kind` and `metadata`.
    const APPLIED: &'static [&'static str];
    /// The top-level fields managers own besides labels and annotations.
    const OWNED: &'static [&'static str];
    /// An applied configuration as the stored document holds it.
    fn config(config: Value) -> Result<Value, ApiError> {
        Ok(config)
    }
    /// The stored object's managers.
    fn entries(current: &Self::Current) -> &[ManagedFieldsEntry];
    /// The document after a server-side apply of `config` as the object
    /// wanted, with `managed` its managers; `existed` whether it was
    /// stored before.
    fn applied(
        doc: Value,
        config: &Value,
        managed: Vec<ManagedFieldsEntry>,
        existed: bool,
        validation: FieldValidation,
    ) -> Result<(Self::Wanted, Vec<String>), ApiError>;
    /// What a failed delete precondition calls the object ("the cluster").
    const NOUN: &'static str;
    /// Deletes the named object (or, for one that leaves through a safe
    /// path, marks it) once `check` accepts what is stored.
    fn remove(
        app: &App,
        admin: &Admin,
        name: &str,
        dry_run: bool,
        check: &dyn Fn(&ObjectMeta) -> Result<(), ApiError>,
    ) -> Result<(AuditChanges, Self::Shown), ApiError>;
}

/// Clusters: only `spec`, labels, annotations and managedFields are
/// written; a server-side apply may create one (`cluster_write.rs`).
pub struct Clusters;

impl Writer for Clusters {
    type Current = Cluster;
    type Wanted = Decided;
    type Shown = Cluster;
    const RESOURCE: &'static Resource = &CLUSTERS;
    fn write(
        app: &App,
        w: &Write<'_>,
        decide: &mut Decide<'_, Cluster, Decided>,
    ) -> Result<(StatusCode, AuditChanges, Cluster), ApiError> {
        let (outcome, changes, cluster) = write_cluster(app, w, decide)?;
        Ok((outcome.status(), changes, cluster))
    }
    fn revision(current: &Cluster) -> Option<String> {
        current.metadata.resource_version.clone()
    }
    fn document(current: &Cluster) -> Result<Value, ApiError> {
        serde_json::to_value(current).map_err(ApiError::internal)
    }
    fn wanted(doc: Value, validation: FieldValidation) -> Result<(Decided, Vec<String>), ApiError> {
        let said = Said::of(&doc);
        let (mut cluster, warnings) = decode::<Cluster>("Cluster", doc, validation)?;
        cluster.metadata.managed_fields.clear();
        Ok((Decided { cluster, said }, warnings))
    }
    const APPLIED: &'static [&'static str] = &["spec", "status"];
    const OWNED: &'static [&'static str] = &["spec"];
    fn entries(current: &Cluster) -> &[ManagedFieldsEntry] {
        &current.metadata.managed_fields
    }
    fn applied(
        doc: Value,
        config: &Value,
        managed: Vec<ManagedFieldsEntry>,
        existed: bool,
        validation: FieldValidation,
    ) -> Result<(Decided, Vec<String>), ApiError> {
        let mut said = Said::of_apply(&doc, config);
        // The CNI default is a new cluster's only.
        said.cni |= existed;
        let (mut cluster, warnings) = decode::<Cluster>("Cluster", doc, validation)?;
        cluster.metadata.managed_fields = managed;
        Ok((Decided { cluster, said }, warnings))
    }
    const NOUN: &'static str = "the cluster";
    fn remove(
        app: &App,
        admin: &Admin,
        name: &str,
        dry_run: bool,
        check: &dyn Fn(&ObjectMeta) -> Result<(), ApiError>,
    ) -> Result<(AuditChanges, Cluster), ApiError> {
        let cluster =
            crate::http::cluster_write::request_deletion(app, name, admin, dry_run, |c| {
                check(&c.metadata)
            })?;
        Ok((AuditChanges::default(), cluster))
    }
}

/// Secrets: written with their values (in a server-side apply,
/// `stringData` is taken as `data`, so managers own values by key and
/// conflicts compare values without showing one); no answer holds a
/// value (`secrets.rs`).
pub struct Secrets;

impl Writer for Secrets {
    type Current = (StoredSecret, u64);
    type Wanted = Secret;
    type Shown = drover_common::api::SecretInfo;
    const RESOURCE: &'static Resource = &SECRETS;
    fn write(
        app: &App,
        w: &Write<'_>,
        decide: &mut Decide<'_, (StoredSecret, u64), Secret>,
    ) -> Result<(StatusCode, AuditChanges, Self::Shown), ApiError> {
        write_secret(app, w, decide)
    }
    fn revision((_, rev): &(StoredSecret, u64)) -> Option<String> {
        Some(rev.to_string())
    }
    fn document((stored, rev): &(StoredSecret, u64)) -> Result<Value, ApiError> {
        let mut metadata = stored.metadata.clone();
        metadata.resource_version = Some(rev.to_string());
        Ok(json!({
            "apiVersion": drover_common::API_VERSION,
            "kind": "Secret",
            "metadata": metadata,
            "data": stored.data,
        }))
    }
    fn wanted(doc: Value, validation: FieldValidation) -> Result<(Secret, Vec<String>), ApiError> {
        let (mut secret, warnings) = decode::<Secret>("Secret", doc, validation)?;
        secret.metadata.managed_fields.clear();
        Ok((secret, warnings))
    }
    const APPLIED: &'static [&'static str] = &["data", "stringData"];
    const OWNED: &'static [&'static str] = &["data"];
    /// `stringData` is taken as `data`, so managers own values by key and
    /// conflicts compare values without showing one.
    fn config(config: Value) -> Result<Value, ApiError> {
        with_string_data_as_data(config)
    }
    fn entries((current, _): &(StoredSecret, u64)) -> &[ManagedFieldsEntry] {
        &current.metadata.managed_fields
    }
    fn applied(
        doc: Value,
        _config: &Value,
        managed: Vec<ManagedFieldsEntry>,
        _existed: bool,
        validation: FieldValidation,
    ) -> Result<(Secret, Vec<String>), ApiError> {
        let (mut secret, warnings) = decode::<Secret>("Secret", doc, validation)?;
        secret.metadata.managed_fields = managed;
        Ok((secret, warnings))
    }
    const NOUN: &'static str = "the secret";
    fn remove(
        app: &App,
        admin: &Admin,
        name: &str,
        dry_run: bool,
        check: &dyn Fn(&ObjectMeta) -> Result<(), ApiError>,
    ) -> Result<(AuditChanges, Self::Shown), ApiError> {
        crate::http::secrets::remove_secret(app, admin, name, dry_run, |s| check(&s.metadata))
    }
}

/// Registration tokens: made with a spec of `pool`, `labels`, `maxUses`
/// and `expiresAt`; afterwards only labels and annotations change, and
/// `spec.revoked` (for good) (`tokens.rs`).
pub struct Tokens;

impl Writer for Tokens {
    type Current = (RegistrationToken, u64);
    type Wanted = RegistrationToken;
    type Shown = RegistrationToken;
    const RESOURCE: &'static Resource = &REGISTRATION_TOKENS;
    fn write(
        app: &App,
        w: &Write<'_>,
        decide: &mut Decide<'_, (RegistrationToken, u64), RegistrationToken>,
    ) -> Result<(StatusCode, AuditChanges, RegistrationToken), ApiError> {
        write_token(app, w, decide)
    }
    fn revision((_, rev): &(RegistrationToken, u64)) -> Option<String> {
        Some(rev.to_string())
    }
    fn document((token, rev): &(RegistrationToken, u64)) -> Result<Value, ApiError> {
        let mut token = token.clone();
        token.metadata.resource_version = Some(rev.to_string());
        serde_json::to_value(token).map_err(ApiError::internal)
    }
    fn wanted(
        doc: Value,
        validation: FieldValidation,
    ) -> Result<(RegistrationToken, Vec<String>), ApiError> {
        Self::applied(doc, &Value::Null, vec![], false, validation)
    }
    const APPLIED: &'static [&'static str] = &["spec", "status"];
    const OWNED: &'static [&'static str] = &["spec"];
    fn entries((current, _): &(RegistrationToken, u64)) -> &[ManagedFieldsEntry] {
        &current.metadata.managed_fields
    }
    fn applied(
        doc: Value,
        _config: &Value,
        managed: Vec<ManagedFieldsEntry>,
        _existed: bool,
        validation: FieldValidation,
    ) -> Result<(RegistrationToken, Vec<String>), ApiError> {
        let (mut token, warnings) =
            decode::<RegistrationToken>("RegistrationToken", doc, validation)?;
        token.metadata.managed_fields = managed;
        Ok((token, warnings))
    }
    const NOUN: &'static str = "the registration token";
    fn remove(
        app: &App,
        admin: &Admin,
        name: &str,
        dry_run: bool,
        check: &dyn Fn(&ObjectMeta) -> Result<(), ApiError>,
    ) -> Result<(AuditChanges, RegistrationToken), ApiError> {
        remove_token(app, admin, name, dry_run, |t| check(&t.metadata))
    }
}

/// Runs a write of kind `K` on the blocking pool: `decide` makes the
/// object wanted (and any warnings) from the stored one.
async fn run_write<K: Writer + 'static>(
    app: Arc<App>,
    admin: Admin,
    name: String,
    creation: Creation,
    options: Options,
    apply: bool,
    mut decide: impl FnMut(Option<&K::Current>, &Options) -> Result<(K::Wanted, Vec<String>), ApiError>
        + Send
        + 'static,
) -> KubeResult {
    let about = name.clone();
    let result = crate::store::blocking(move || {
        let mut warnings = vec![];
        let w = Write {
            name: &name,
            admin: &admin,
            creation,
            dry_run: options.dry_run,
            // An apply sets managedFields itself.
            manager: if apply {
                None
            } else {
                Some(options.manager.as_deref().unwrap_or("unknown"))
            },
        };
        let out = K::write(&app, &w, &mut |current| {
            let (wanted, w) = decide(current, &options)?;
            warnings = w;
            Ok(wanted)
        })?;
        Ok::<_, ApiError>((out, warnings))
    })
    .await;
    let ((status, changes, shown), warnings) =
        result.map_err(|e| KubeError::from(e).about(K::RESOURCE, &about))?;
    written(status, &shown, &warnings, changes)
}

/// The resourceVersion of `current`, if there is one.
fn revision_of<K: Writer>(current: Option<&K::Current>) -> Option<String> {
    current.and_then(K::revision)
}

/// POST `/apis/drover.dev/v1alpha1/{plural}`: creates a `K` from a whole
/// document (named, or by `generateName`).
pub async fn create<K: Writer + 'static>(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(params): Query<WriteParams>,
    KubeBody(body): KubeBody,
) -> KubeResult {
    let body: &[u8] = &body;
    let admin = writer(&app, &headers)?;
    let options = params.options(&headers)?;
    let kind = K::RESOURCE.kind;
    let doc = parse_body(body, &format!("{kind} document"))?;
    check_type(&doc, kind)?;
    let mut doc = doc;
    let name = name_of(&mut doc, kind)?;
    run_write::<K>(
        app,
        admin,
        name,
        Creation::Only,
        options,
        false,
        move |_, options| K::wanted(doc.clone(), options.validation),
    )
    .await
}

/// The name a new object's document gives it: `metadata.name`, or
/// `metadata.generateName` and five random characters (then written into
/// the document), as the API server's `SimpleNameGenerator` makes them
/// (apiserver/pkg/storage/names/generate.go).
fn name_of(doc: &mut Value, kind: &str) -> Result<String, ApiError> {
    if let Some(name) = doc["metadata"]["name"].as_str().filter(|n| !n.is_empty()) {
        return Ok(name.to_owned());
    }
    let Some(prefix) = doc["metadata"]["generateName"].as_str() else {
        return Err(ApiError::invalid(
            format!("the {kind} has no name; nothing was changed"),
            vec![FieldError {
                field: "metadata.name".into(),
                message: "name or generateName is required".into(),
            }],
        ));
    };
    // The generator's alphabet: no vowels, no look-alikes.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    const MAX_PREFIX: usize = 63 - 5;
    let prefix: String = prefix.chars().take(MAX_PREFIX).collect();
    let suffix: String = (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect();
    let name = format!("{prefix}{suffix}");
    if let Some(m) = doc["metadata"].as_object_mut() {
        m.remove("generateName");
        m.insert("name".into(), name.clone().into());
    }
    Ok(name)
}

/// PUT `/apis/drover.dev/v1alpha1/{plural}/{name}`: replaces `K` `name`
/// with a whole document, conditional on the `metadata.resourceVersion`
/// it may carry.
pub async fn replace<K: Writer + 'static>(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<WriteParams>,
    KubeBody(body): KubeBody,
) -> KubeResult {
    let body: &[u8] = &body;
    let admin = writer(&app, &headers)?;
    let options = params.options(&headers)?;
    let kind = K::RESOURCE.kind;
    let doc = parse_body(body, &format!("{kind} document"))?;
    check_type(&doc, kind)?;
    let url_name = name.clone();
    run_write::<K>(
        app,
        admin,
        name,
        Creation::Refused,
        options,
        false,
        move |current, options| {
            precondition(
                &doc,
                revision_of::<K>(current).as_deref(),
                K::RESOURCE,
                &url_name,
            )?;
            K::wanted(doc.clone(), options.validation)
        },
    )
    .await
}

/// A merge or JSON patch of `K` `name`'s document.
async fn patch_document<K: Writer + 'static>(
    app: Arc<App>,
    admin: Admin,
    name: String,
    options: Options,
    patch: Patch,
) -> KubeResult {
    let url_name = name.clone();
    run_write::<K>(
        app,
        admin,
        name,
        Creation::Refused,
        options,
        false,
        move |current, options| {
            let what = format!("{} {url_name}", K::RESOURCE.singular);
            let current_object =
                current.ok_or_else(|| ApiError::not_found(K::RESOURCE.singular, &url_name))?;
            let mut doc = K::document(current_object)?;
            patch.apply_to(&mut doc, &what)?;
            precondition(
                &doc,
                K::revision(current_object).as_deref(),
                K::RESOURCE,
                &url_name,
            )?;
            K::wanted(doc, options.validation)
        },
    )
    .await
}

/// Refuses a document decided against an object whose resourceVersion
/// is `found` (`None`: there is none) when the document names another.
fn precondition(
    doc: &Value,
    found: Option<&str>,
    resource: &Resource,
    name: &str,
) -> Result<(), ApiError> {
    let Some(rv) = doc["metadata"]["resourceVersion"].as_str() else {
        return Ok(());
    };
    if found != Some(rv) {
        return Err(ApiError::conflict(format!(
            "Operation cannot be fulfilled on {}.{} {name:?}: the object has been modified (resourceVersion {} now, {rv} sent); read it again and resend",
            resource.plural,
            super::GROUP,
            found.unwrap_or("none")
        )));
    }
    Ok(())
}

/// A patch, as its content type says.
enum Patch {
    Merge(Value),
    Json(json_patch::Patch),
    Apply(Value),
}

impl Patch {
    /// Reads a PATCH body: JSON merge patch, JSON patch or an applied
    /// configuration; any other type is 415.
    fn of(headers: &HeaderMap, body: &[u8]) -> Result<Self, KubeError> {
        match content_type(headers).as_str() {
            "application/merge-patch+json" => {
                let patch = parse_body(body, "merge patch")?;
                if !patch.is_object() {
                    return Err(ApiError::bad_request("a merge patch is a JSON object").into());
                }
                Ok(Patch::Merge(patch))
            }
            "application/json-patch+json" => Ok(Patch::Json(
                serde_json::from_slice(body).map_err(|e| {
                    ApiError::bad_request(format!(
                        "the JSON patch is not a list of RFC 6902 operations: {e}"
                    ))
                })?,
            )),
            "application/apply-patch+yaml" => {
                Ok(Patch::Apply(parse_body(body, "applied configuration")?))
            }
            "application/strategic-merge-patch+json" => Err(unsupported_patch(
                "strategic merge patch is not served for drover.dev resources (as for every custom resource)",
            )),
            other => Err(unsupported_patch(&format!(
                "the patch type {other:?} is not served"
            ))),
        }
    }

    /// Applies a merge or JSON patch to `doc`, the object `what` names.
    fn apply_to(&self, doc: &mut Value, what: &str) -> Result<(), ApiError> {
        match self {
            Patch::Merge(patch) => json_patch::merge(doc, patch),
            Patch::Json(ops) => json_patch::patch(doc, ops).map_err(|e| {
                ApiError::invalid(
                    format!("the JSON patch cannot be applied to {what}; nothing was changed"),
                    vec![FieldError {
                        field: "(patch)".into(),
                        message: e.to_string(),
                    }],
                )
            })?,
            Patch::Apply(_) => {}
        }
        Ok(())
    }
}

/// Checks an applied configuration: its type, its name, and fields
/// outside what it may set (as `fieldValidation` says: Strict refuses
/// them, Warn warns).
fn check_config(
    config: &Value,
    kind: &str,
    allowed: &[&str],
    name: &str,
    validation: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    check_type(config, kind)?;
    if config["metadata"]["name"].as_str() != Some(name) {
        return Err(ApiError::bad_request(format!(
            "metadata.name {} does not match the URL's name {name:?}",
            config["metadata"]["name"]
        )));
    }
    let unknown: Vec<String> = config
        .as_object()
        .into_iter()
        .flat_map(|m| m.keys())
        .filter(|k| {
            !["apiVersion", "kind", "metadata"].contains(&k.as_str())
                && !allowed.contains(&k.as_str())
        })
        .map(|k| format!("unknown field {k:?}"))
        .collect();
    match validation {
        FieldValidation::Strict if !unknown.is_empty() => Err(ApiError::bad_request(format!(
            "{kind} cannot be handled: strict decoding error: {}; remove them, or send fieldValidation=Warn to drop them",
            unknown.join(", ")
        ))),
        FieldValidation::Warn => Ok(unknown),
        _ => Ok(vec![]),
    }
}

/// The field manager an apply names, which it must.
fn apply_manager(params: &WriteParams) -> Result<String, ApiError> {
    params
        .field_manager
        .clone()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "PatchOptions.meta.k8s.io is invalid; nothing was changed",
                vec![FieldError {
                    field: "fieldManager".into(),
                    message: "Required value: is required for apply patch".into(),
                }],
            )
        })
}

/// The conflicts of an apply as a 409 naming each manager and field.
fn conflict_error(conflicts: &[managed_fields::Conflict]) -> ApiError {
    ApiError {
        errors: conflicts
            .iter()
            .map(|c| FieldError {
                field: managed_fields::path_string(&c.path),
                message: format!(
                    "conflict with {:?}: {}",
                    c.manager,
                    managed_fields::path_string(&c.path)
                ),
            })
            .collect(),
        ..ApiError::conflict(managed_fields::conflicts_message(conflicts))
    }
}

/// PATCH `/apis/drover.dev/v1alpha1/{plural}/{name}`: a JSON merge patch
/// (`application/merge-patch+json`), a JSON patch
/// (`application/json-patch+json`) or a server-side apply
/// (`application/apply-patch+yaml`, which may create it) of `K` `name`.
pub async fn patch<K: Writer + 'static>(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<WriteParams>,
    KubeBody(body): KubeBody,
) -> KubeResult {
    let body: &[u8] = &body;
    let admin = writer(&app, &headers)?;
    let options = params.options(&headers)?;
    let url_name = name.clone();
    let config = match Patch::of(&headers, body)? {
        Patch::Apply(config) => config,
        patch => return patch_document::<K>(app, admin, name, options, patch).await,
    };
    let kind = K::RESOURCE.kind;
    let warnings = check_config(&config, kind, K::APPLIED, &name, options.validation)?;
    let config = K::config(config)?;
    let apply = Apply {
        manager: apply_manager(&params)?,
        force: options.force,
    };
    run_write::<K>(
        app,
        admin,
        name,
        Creation::Allowed,
        options,
        true,
        move |current, options| {
            precondition(
                &config,
                revision_of::<K>(current).as_deref(),
                K::RESOURCE,
                &url_name,
            )?;
            let current_doc = current.map(K::document).transpose()?;
            let entries = current.map_or(&[][..], K::entries);
            let (doc, managed) = apply_document(
                current_doc,
                entries,
                &config,
                &apply,
                kind,
                K::OWNED,
                &url_name,
            )?;
            let (wanted, more) =
                K::applied(doc, &config, managed, current.is_some(), options.validation)?;
            Ok((wanted, [warnings.clone(), more].concat()))
        },
    )
    .await
}

fn unsupported_patch(why: &str) -> KubeError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "Unsupported patch type",
        format!(
            "{why}; send application/merge-patch+json (kubectl patch --type merge), application/json-patch+json (--type json) or application/apply-patch+yaml (kubectl apply --server-side)"
        ),
    )
    .into()
}

/// What a server-side apply of `config` by `manager` makes of
/// `current_doc` (the stored object as a document, `None` when there is
/// none, then a document of `kind` named `name`), whose managers are
/// `entries`; `body` names the top-level fields managers own besides
/// labels and annotations. The document after the apply, and its
/// managedFields.
fn apply_document(
    current_doc: Option<Value>,
    entries: &[drover_common::api::ManagedFieldsEntry],
    config: &Value,
    apply: &Apply,
    kind: &str,
    body: &[&str],
    name: &str,
) -> Result<(Value, Vec<drover_common::api::ManagedFieldsEntry>), ApiError> {
    let owned = current_doc
        .as_ref()
        .map_or(Value::Null, |d| managed_fields::owned_part_of(d, body));
    let applied = managed_fields::apply(
        &owned,
        entries,
        &managed_fields::owned_part_of(config, body),
        &apply.manager,
        apply.force,
        drover_common::API_VERSION,
        drover_common::now(),
    )
    .map_err(|conflicts| conflict_error(&conflicts))?;
    let mut doc = current_doc.unwrap_or_else(|| {
        json!({
            "apiVersion": drover_common::API_VERSION,
            "kind": kind,
            "metadata": {"name": name},
        })
    });
    for field in ["labels", "annotations"] {
        match applied.object["metadata"].get(field) {
            Some(v) => doc["metadata"][field] = v.clone(),
            None => {
                if let Some(m) = doc["metadata"].as_object_mut() {
                    m.remove(field);
                }
            }
        }
    }
    for field in body {
        match applied.object.get(*field) {
            Some(v) => doc[*field] = v.clone(),
            None => {
                if let Some(m) = doc.as_object_mut() {
                    m.remove(*field);
                }
            }
        }
    }
    Ok((doc, applied.managed_fields))
}

/// Who applies, and whether they take fields from other managers.
struct Apply {
    manager: String,
    force: bool,
}

/// `DeleteOptions`, as kubectl sends them in a DELETE's body.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeleteOptions {
    #[serde(default)]
    propagation_policy: Option<String>,
    #[serde(default)]
    preconditions: Option<Preconditions>,
    #[serde(default)]
    dry_run: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Preconditions {
    uid: Option<String>,
    resource_version: Option<String>,
}

/// The options of a DELETE: its body's and its query's.
fn delete_options(params: &WriteParams, body: &[u8]) -> Result<(DeleteOptions, bool), ApiError> {
    let options: DeleteOptions = if body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the body is not DeleteOptions: {e}")))?
    };
    let policy = options
        .propagation_policy
        .as_deref()
        .or(params.propagation_policy.as_deref());
    match policy {
        None | Some("Foreground") | Some("Background") => {}
        Some("Orphan") => {
            return Err(ApiError::invalid(
                "Drover cannot orphan: a cluster's machines are released before it goes, and nothing outlives it",
                vec![FieldError {
                    field: "propagationPolicy".into(),
                    message: "Orphan is not served; use Foreground or Background".into(),
                }],
            ))
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy {other:?} is not one of Foreground, Background, Orphan"
            )))
        }
    }
    let mut dry_run = dry_run_of(params.dry_run.as_deref())?;
    for d in &options.dry_run {
        dry_run |= dry_run_of(Some(d))?;
    }
    Ok((options, dry_run))
}

fn check_preconditions(
    p: Option<&Preconditions>,
    meta: &ObjectMeta,
    what: &str,
) -> Result<(), ApiError> {
    let Some(p) = p else { return Ok(()) };
    if let Some(uid) = &p.uid {
        if meta.uid.as_ref() != Some(uid) {
            return Err(ApiError::conflict(format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}; {what} is another object now",
                meta.uid.as_deref().unwrap_or("")
            )));
        }
    }
    if let Some(rv) = &p.resource_version {
        if meta.resource_version.as_ref() != Some(rv) {
            return Err(ApiError::conflict(format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}; read {what} again",
                meta.resource_version.as_deref().unwrap_or("")
            )));
        }
    }
    Ok(())
}

/// `DELETE /apis/drover.dev/v1alpha1/{clusters,secrets,registrationtokens}/{name}`:
/// as `drover delete`: a cluster is marked and leaves through its safe path
/// (the cluster, marked); a Secret no live cluster reads is deleted; a
/// token is deleted and its tickets stop working at once (`drover token
/// revoke` keeps it, revoked). `preconditions` in a DeleteOptions body are
/// checked against what is stored.
pub async fn delete<K: Writer + 'static>(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<WriteParams>,
    KubeBody(body): KubeBody,
) -> KubeResult {
    let admin = writer(&app, &headers)?;
    let (options, dry_run) = delete_options(&params, &body)?;
    let about = name.clone();
    let (changes, shown) = crate::store::blocking({
        let app = app.clone();
        move || {
            K::remove(&app, &admin, &name, dry_run, &|meta| {
                check_preconditions(options.preconditions.as_ref(), meta, K::NOUN)
            })
        }
    })
    .await
    .map_err(|e| KubeError::from(e).about(K::RESOURCE, &about))?;
    written(StatusCode::OK, &shown, &[], changes)
}

/// `DELETE /apis/drover.dev/v1alpha1/machines/{name}`: as `drover delete
/// machine`: a free machine is deregistered at once (a `Success` Status), a
/// cluster's leaves through the safe path (the machine, marked).
pub async fn delete_machine(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<WriteParams>,
    KubeBody(body): KubeBody,
) -> KubeResult {
    let admin = writer(&app, &headers)?;
    let (options, dry_run) = delete_options(&params, &body)?;
    let about = name.clone();
    let by = admin.token_id.clone();
    let (status, machine) = crate::store::blocking({
        let app = app.clone();
        let name = name.clone();
        move || {
            crate::http::admin::request_removal(&app, &name, &by, dry_run, |m| {
                check_preconditions(options.preconditions.as_ref(), &m.metadata, "the machine")
            })
        }
    })
    .await
    .map_err(|e| KubeError::from(e).about(&MACHINES, &about))?;
    if !dry_run {
        app.reconcile_machine(&name);
    }
    if status == StatusCode::OK {
        // Gone at once: a Status, as for an object without finalizers.
        return Ok(axum::Json(json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": name,
                "group": super::GROUP,
                "kind": "machines",
                "uid": machine.metadata.uid,
            },
        }))
        .into_response());
    }
    written(StatusCode::OK, &machine, &[], AuditChanges::default())
}

/// `PUT` and `PATCH` of `clusters/{name}/status`: refused, as the
/// coordinator alone writes a cluster's status.
pub async fn write_status(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> KubeResult {
    resolve_admin(&app, &headers)?;
    Err(KubeError::from(ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method not allowed",
        format!(
            "the status of cluster {name} is written by the coordinator alone; change its spec instead"
        ),
    ))
    .about(&CLUSTERS, &name))
}

/// An applied Secret with its `stringData` moved into `data` (base64), as
/// the API server stores it.
fn with_string_data_as_data(mut config: Value) -> Result<Value, ApiError> {
    use base64::Engine;
    let Some(strings) = config.as_object_mut().and_then(|m| m.remove("stringData")) else {
        return Ok(config);
    };
    let Value::Object(strings) = strings else {
        return Err(ApiError::bad_request("stringData is a map of keys to text"));
    };
    if !config["data"].is_object() {
        config["data"] = json!({});
    }
    for (k, v) in strings {
        let text = v
            .as_str()
            .ok_or_else(|| ApiError::bad_request(format!("stringData.{k} is not text")))?;
        config["data"][k] = base64::engine::general_purpose::STANDARD
            .encode(text)
            .into();
    }
    Ok(config)
}

/// `POST /apis/drover.dev/v1alpha1/registrationtokens/{name}/bootstrap`:
/// a bootstrap document with a new ticket of the token, for
/// `drover-agent --bootstrap` (as `serviceaccounts/{name}/token` mints a
/// service account's tokens). The body is empty or a `BootstrapConfig`
/// with nothing else; a token that can register nothing more
/// mints nothing (409).
pub async fn create_bootstrap(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<WriteParams>,
    KubeBody(body): KubeBody,
) -> KubeResult {
    let admin = writer(&app, &headers)?;
    let dry_run = dry_run_of(params.dry_run.as_deref())?;
    if !body.iter().all(u8::is_ascii_whitespace) {
        let request = parse_body(&body, "Bootstrap request")?;
        let fine = request.as_object().is_some_and(|m| {
            m.iter().all(|(k, v)| match k.as_str() {
                "apiVersion" => v.as_str() == Some(drover_common::API_VERSION),
                "kind" => v.as_str() == Some(BOOTSTRAP_KIND),
                "metadata" => v.as_object().is_some_and(|m| m.is_empty()),
                _ => false,
            })
        });
        if !fine {
            return Err(KubeError::from(ApiError::bad_request(format!(
                "the body is not a {}/{BOOTSTRAP_KIND} request: send nothing, or {{\"apiVersion\": \"{}\", \"kind\": \"{BOOTSTRAP_KIND}\"}}; a ticket lives as long as its token",
                drover_common::API_VERSION,
                drover_common::API_VERSION
            )))
            .about(&REGISTRATION_TOKENS, &name));
        }
    }
    let found = crate::store::blocking({
        let app = app.clone();
        let name = name.clone();
        move || {
            app.store
                .get_json::<RegistrationToken>(crate::store::Kind::RegistrationToken, &name)
        }
    })
    .await
    .map_err(ApiError::from)
    .and_then(|t| t.ok_or_else(|| ApiError::not_found("registration token", &name)));
    let (token, _) = found.map_err(|e| KubeError::from(e).about(&REGISTRATION_TOKENS, &name))?;
    crate::http::tokens::check_mintable(&token)
        .map_err(|e| KubeError::from(e).about(&REGISTRATION_TOKENS, &name))?;
    let document = crate::http::tokens::bootstrap(&app, &token);
    let changes = if dry_run {
        AuditChanges::default()
    } else {
        tracing::info!(token = %name, by = %admin.token_id, "registration ticket minted");
        AuditChanges(vec![format!("registration token {name}: ticket minted")])
    };
    let mut shown = serde_json::to_value(&document).map_err(ApiError::internal)?;
    if dry_run {
        shown["ticket"] = Value::from("");
    }
    written(StatusCode::CREATED, &shown, &[], changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        a: u32,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        spec: Inner,
        items: Vec<Inner>,
    }

    #[test]
    fn unknown_fields_are_errors_warnings_or_dropped_as_asked() {
        let doc = json!({"spec": {"a": 1, "b": 2}, "items": [{"a": 1}, {"a": 2, "c": 3}], "d": 4});
        let e = decode::<Outer>("Outer", doc.clone(), FieldValidation::Strict).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(
            e.detail.contains(
                r#"unknown field "d", unknown field "items[1].c", unknown field "spec.b""#
            ),
            "{}",
            e.detail
        );
        let (_, warnings) = decode::<Outer>("Outer", doc.clone(), FieldValidation::Warn).unwrap();
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        let (_, warnings) = decode::<Outer>("Outer", doc, FieldValidation::Ignore).unwrap();
        assert!(warnings.is_empty());
        let e = decode::<Outer>(
            "Outer",
            json!({"spec": {"a": "x"}, "items": []}),
            FieldValidation::Ignore,
        )
        .unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(e.errors[0].field, "spec.a");
    }

    #[test]
    fn generate_name_makes_a_name_as_the_api_server_does() {
        let mut doc = json!({"metadata": {"generateName": "rack7-"}});
        let name = name_of(&mut doc, "RegistrationToken").unwrap();
        assert!(name.starts_with("rack7-") && name.len() == 11, "{name}");
        assert!(name[6..]
            .bytes()
            .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)));
        assert_eq!(doc["metadata"]["name"], name.as_str());
        assert!(doc["metadata"].get("generateName").is_none());
        // A name wins; neither is an error naming the field.
        let mut doc = json!({"metadata": {"name": "a", "generateName": "b-"}});
        assert_eq!(name_of(&mut doc, "Cluster").unwrap(), "a");
        let e = name_of(&mut json!({"metadata": {}}), "Cluster").unwrap_err();
        assert_eq!(e.errors[0].field, "metadata.name");
    }

    #[test]
    fn a_write_without_a_field_manager_is_its_user_agents() {
        let mut h = HeaderMap::new();
        h.insert(
            header::USER_AGENT,
            HeaderValue::from_static("kubectl/v1.32.0 (linux/amd64) kubernetes/abc"),
        );
        assert_eq!(user_agent_manager(&h).as_deref(), Some("kubectl"));
        let p = WriteParams {
            field_manager: Some("ops".into()),
            ..Default::default()
        };
        assert_eq!(p.options(&h).unwrap().manager.as_deref(), Some("ops"));
        let p = WriteParams {
            dry_run: Some("Some".into()),
            ..Default::default()
        };
        assert!(p.options(&h).is_err());
    }
}
