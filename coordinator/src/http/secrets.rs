//! Secrets (`kind: Secret`): values machine files read through
//! `contentFrom`. Only the admin role reaches them, and no answer ever
//! holds a value: reading a Secret lists its keys and their sizes.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use drover_common::api::{FieldError, Secret, SecretInfo};

use super::admin::ObjectName;
use super::auth::Admin;
use super::cluster_write::{Creation, Write};
use super::error::ApiError;
use super::AuditChanges;
use crate::app::App;
use crate::domain::user_secrets::{self, StoredSecret};
use crate::store::{Kind, StoreError, MODIFY_ATTEMPTS};

/// `GET /v1/secrets`: every Secret's keys, never a value.
#[utoipa::path(
    get,
    path = "/v1/secrets",
    tag = "secrets",
    security(("adminToken" = [])),
    responses(
        (status = 200, description = "Every Secret, by name: keys and sizes only.", body = Vec<SecretInfo>),
        (status = 403, response = super::responses::Forbidden),
    ),
)]
pub async fn list_secrets(
    State(app): State<Arc<App>>,
    admin: Admin,
) -> Result<Json<Vec<SecretInfo>>, ApiError> {
    require_admin(&admin)?;
    let list = app.store.list_json::<StoredSecret>(Kind::UserSecret)?;
    let infos = list
        .into_iter()
        .map(|(s, rev)| s.info(rev))
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(Json(infos))
}

/// `GET /v1/secrets/{name}`: one Secret's keys, never a value.
#[utoipa::path(
    get,
    path = "/v1/secrets/{name}",
    tag = "secrets",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The Secret's name.", example = "registry")),
    responses(
        (status = 200, description = "The Secret: keys and sizes only.", body = SecretInfo),
        (status = 403, response = super::responses::Forbidden),
        (status = 404, response = super::responses::NotFound),
    ),
)]
pub async fn get_secret(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
) -> Result<Json<SecretInfo>, ApiError> {
    require_admin(&admin)?;
    let (s, rev) = user_secrets::get(&app.store, &name)?
        .ok_or_else(|| ApiError::not_found("secret", &name))?;
    Ok(Json(s.info(rev)?))
}

/// `PUT /v1/secrets/{name}`: create or replace a Secret (what `drover
/// apply -f` sends for `kind: Secret`).
///
/// The document is YAML unless sent as `application/json`, parsed
/// strictly. Its values replace the stored ones as a whole; a key a live
/// cluster's file reads may not be removed. A `metadata.resourceVersion`
/// makes the change conditional on it. Machines read the new values the
/// next time their config bundle is built (when they bootstrap).
#[utoipa::path(
    put,
    path = "/v1/secrets/{name}",
    tag = "secrets",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The Secret's name.", example = "registry")),
    request_body(
        description = "A Secret document, YAML or JSON.",
        content(
            (Secret = "application/yaml", example = example_secret),
            (Secret = "application/json", example = example_secret),
        ),
    ),
    responses(
        (status = 200, description = "The Secret was replaced, or already held these values.", body = SecretInfo),
        (status = 201, description = "The Secret was created.", body = SecretInfo),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
        (status = 413, response = super::responses::PayloadTooLarge),
        (status = 422, response = super::responses::Unprocessable),
    ),
)]
pub async fn apply_secret(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
    headers: HeaderMap,
    super::body::RawBody(body): super::body::RawBody,
) -> Result<(StatusCode, Extension<AuditChanges>, Json<SecretInfo>), ApiError> {
    require_admin(&admin)?;
    let desired: Secret = super::admin::parse_document("Secret", &headers, &body)?;
    let write = Write {
        name: &name,
        admin: &admin,
        creation: Creation::Allowed,
        dry_run: false,
        manager: Some(super::cluster_write::DROVER_MANAGER),
    };
    let (status, changes, info) = write_secret(&app, &write, |current| {
        let found = current.map(|(_, r)| r.to_string());
        super::body::check_precondition(
            "secret",
            &name,
            desired.metadata.resource_version.as_deref(),
            found.as_deref(),
        )?;
        let mut desired = desired.clone();
        desired.metadata.managed_fields.clear();
        Ok(desired)
    })?;
    Ok((status, Extension(changes), Json(info)))
}

/// The annotation kubectl's client-side apply keeps the whole applied
/// document in: for a Secret, its values, which nothing may show back.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The part of a Secret field managers own: labels, annotations and the
/// values (base64, so ownership and conflicts compare values without
/// showing one).
pub fn owned_secret(
    metadata: &drover_common::api::ObjectMeta,
    data: &std::collections::BTreeMap<String, String>,
) -> serde_json::Value {
    crate::domain::managed_fields::owned_part_of(
        &serde_json::json!({"metadata": metadata, "data": data}),
        &["data"],
    )
}

/// Writes the Secret `decide` makes of the stored one (with its revision;
/// `None`: there is none), whichever API it came through: `/v1`'s PUT and
/// the Kubernetes-style writes. Its values replace the stored ones as a
/// whole; a key a live cluster's file reads may not go; no machine's
/// bundle may outgrow its cap. Blocking: it reads and writes the store.
pub fn write_secret(
    app: &App,
    w: &Write<'_>,
    mut decide: impl FnMut(Option<&(StoredSecret, u64)>) -> Result<Secret, ApiError>,
) -> Result<(StatusCode, AuditChanges, SecretInfo), ApiError> {
    let name = w.name;
    for _ in 0..MODIFY_ATTEMPTS {
        let current = user_secrets::get(&app.store, name)?;
        match (&current, w.creation) {
            (None, Creation::Refused) => return Err(ApiError::not_found("secret", name)),
            (Some(_), Creation::Only) => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    format!("secret {name} already exists; replace it, or delete it first"),
                ))
            }
            _ => {}
        }
        let desired = decide(current.as_ref())?;
        super::body::check_document_name(&desired.metadata.name, name)?;
        if desired.metadata.annotations.contains_key(LAST_APPLIED) {
            return Err(ApiError::invalid(
                format!("Secret {name:?} carries {LAST_APPLIED}, which would show its values to anyone who reads it; nothing was changed"),
                vec![FieldError {
                    field: format!("metadata.annotations.{LAST_APPLIED}"),
                    message: "apply Secrets with kubectl apply --server-side (or drover apply), which keep no copy".into(),
                }],
            ));
        }
        if let Some(e) = drover_common::names::check_annotations(&desired.metadata.annotations)
            .into_iter()
            .next()
        {
            return Err(ApiError::invalid(
                format!("Secret {name:?} is invalid; nothing was changed"),
                vec![FieldError {
                    field: "metadata.annotations".into(),
                    message: e,
                }],
            ));
        }
        let values = desired.values().map_err(|errors| {
            ApiError::invalid(
                format!("Secret {name:?} is invalid; nothing was changed"),
                errors,
            )
        })?;
        let mut metadata = current
            .as_ref()
            .map(|(old, _)| old.metadata.clone())
            .unwrap_or_else(|| drover_common::api::ObjectMeta {
                name: name.to_owned(),
                uid: Some(uuid::Uuid::new_v4().to_string()),
                generation: 1,
                creation_timestamp: Some(drover_common::now()),
                ..Default::default()
            });
        metadata.labels = desired.metadata.labels.clone();
        metadata.annotations = desired.metadata.annotations.clone();
        let stored = StoredSecret::new(metadata, &values);
        let mut stored = stored;
        stored.metadata.managed_fields = match w.manager {
            Some(manager) => crate::domain::managed_fields::update(
                &current
                    .as_ref()
                    .map(|(old, _)| owned_secret(&old.metadata, &old.data))
                    .unwrap_or(serde_json::Value::Null),
                &owned_secret(&stored.metadata, &stored.data),
                current
                    .as_ref()
                    .map_or(&[][..], |(old, _)| &old.metadata.managed_fields),
                manager,
                drover_common::API_VERSION,
                drover_common::now(),
            ),
            None => desired.metadata.managed_fields.clone(),
        };
        let written = match &current {
            None => {
                refuse_oversized_bundles(app, name, &values)?;
                if w.dry_run {
                    return Ok((
                        StatusCode::CREATED,
                        AuditChanges::default(),
                        stored.info(0)?,
                    ));
                }
                app.store
                    .create_json(Kind::UserSecret, name, &stored)
                    .map(|rev| (StatusCode::CREATED, stored, rev, None))
            }
            Some((old, rev)) => {
                let old_values = old.values()?;
                let unchanged = old_values == values
                    && old.metadata.labels == stored.metadata.labels
                    && old.metadata.annotations == stored.metadata.annotations
                    && old.metadata.managed_fields == stored.metadata.managed_fields;
                if unchanged {
                    return Ok((StatusCode::OK, AuditChanges::default(), old.info(*rev)?));
                }
                refuse_removing_used_keys(app, name, &values)?;
                refuse_oversized_bundles(app, name, &values)?;
                if old_values != values {
                    stored.metadata.generation += 1;
                }
                if w.dry_run {
                    return Ok((StatusCode::OK, AuditChanges::default(), stored.info(*rev)?));
                }
                app.store
                    .update_json(Kind::UserSecret, name, &stored, Some(*rev))
                    .map(|rev| (StatusCode::OK, stored, rev, Some(old_values)))
            }
        };
        match written {
            Ok((status, stored, rev, before)) => {
                let changes = user_secrets::changes(name, before.as_ref(), &values);
                for change in &changes {
                    tracing::info!(secret = %name, by = %w.admin.token_id, %change, "secret changed");
                }
                return Ok((status, AuditChanges(changes), stored.info(rev)?));
            }
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Contended {
        kind: Kind::UserSecret.as_str(),
        name: name.to_owned(),
        attempts: MODIFY_ATTEMPTS,
    }
    .into())
}

/// `DELETE /v1/secrets/{name}`: delete a Secret no live cluster reads.
#[utoipa::path(
    delete,
    path = "/v1/secrets/{name}",
    tag = "secrets",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The Secret's name.", example = "registry")),
    responses(
        (status = 200, description = "The Secret is gone; what it held, keys only.", body = SecretInfo),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
    ),
)]
pub async fn delete_secret(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
) -> Result<(Extension<AuditChanges>, Json<SecretInfo>), ApiError> {
    require_admin(&admin)?;
    let (changes, info) = crate::store::blocking({
        let app = app.clone();
        move || remove_secret(&app, &admin, &name, false, |_| Ok(()))
    })
    .await?;
    Ok((Extension(changes), Json(info)))
}

/// Deletes Secret `name` once `check` accepts it, unless a live cluster
/// reads it or a machine's BMC names it; for a dry run, only checks. Blocking: it reads and writes the
/// store.
pub fn remove_secret(
    app: &App,
    admin: &Admin,
    name: &str,
    dry_run: bool,
    check: impl Fn(&StoredSecret) -> Result<(), ApiError>,
) -> Result<(AuditChanges, SecretInfo), ApiError> {
    let (old, rev) =
        user_secrets::get(&app.store, name)?.ok_or_else(|| ApiError::not_found("secret", name))?;
    check(&old)?;
    let (uses, _) = user_secrets::users(&app.clusters()?, name);
    if !uses.is_empty() {
        return Err(ApiError::conflict(format!(
            "secret {name} is read by {}; change those files first, then delete it",
            uses.join(", ")
        )));
    }
    // Rare, so a read of every machine is affordable here.
    let bmcs: Vec<String> = app
        .machines()?
        .into_iter()
        .filter(|m| {
            m.spec
                .bmc
                .as_ref()
                .is_some_and(|b| b.credentials_secret == name)
        })
        .map(|m| m.metadata.name)
        .collect();
    if !bmcs.is_empty() {
        return Err(ApiError::conflict(format!(
            "secret {name} holds the BMC credentials of machine {}; point their BMC at another Secret (drover bmc set) or clear it (drover bmc clear) first",
            bmcs.join(", ")
        )));
    }
    if dry_run {
        return Ok((AuditChanges::default(), old.info(rev)?));
    }
    match app.store.delete(Kind::UserSecret, name, Some(rev)) {
        Ok(_) => {}
        Err(StoreError::Conflict { .. }) => {
            return Err(ApiError::conflict(format!(
                "secret {name} changed while it was being deleted; nothing was deleted, try again"
            )))
        }
        Err(e) => return Err(e.into()),
    }
    tracing::info!(secret = %name, by = %admin.token_id, "secret deleted");
    Ok((
        AuditChanges(vec![format!("secret {name} deleted")]),
        old.info(rev)?,
    ))
}

/// Refuses a viewer: even a Secret's key names are for the admin role.
fn require_admin(admin: &Admin) -> Result<(), ApiError> {
    admin.require_write().map_err(|_| {
        ApiError::forbidden(format!(
            "token {} has the viewer role; Secrets are for admin tokens only",
            admin.token_id
        ))
    })
}

/// Refuses new values that drop a key a live cluster's file reads.
fn refuse_removing_used_keys(
    app: &App,
    name: &str,
    values: &std::collections::BTreeMap<String, Vec<u8>>,
) -> Result<(), ApiError> {
    let (uses, keys) = user_secrets::users(&app.clusters()?, name);
    let dropped: Vec<&String> = keys.iter().filter(|k| !values.contains_key(*k)).collect();
    if dropped.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        format!("Secret {name:?} would lose keys clusters read; nothing was changed"),
        dropped
            .into_iter()
            .map(|key| FieldError {
                field: format!("data.{key}"),
                message: format!(
                    "is read by {}; keep it, or change those files first",
                    uses.iter()
                        .filter(|u| u.ends_with(&format!("(key {key})")))
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
            .collect(),
    ))
}

/// Refuses new values that would give a machine of a live cluster that
/// reads this Secret a config bundle over the cap.
fn refuse_oversized_bundles(
    app: &App,
    name: &str,
    values: &std::collections::BTreeMap<String, Vec<u8>>,
) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    for cluster in app.clusters()? {
        if cluster.metadata.deletion_timestamp.is_some()
            || !cluster
                .spec
                .secret_refs()
                .iter()
                .any(|(_, r)| r.secret == name)
        {
            continue;
        }
        let mut secrets = user_secrets::referenced(&app.store, &cluster.spec)?;
        secrets.insert(name.to_owned(), values.clone());
        for over in crate::domain::bootstrap::oversized_pools(&cluster.spec, &secrets) {
            errors.push(FieldError {
                field: "data".into(),
                message: format!(
                    "cluster {} {} reads this Secret, and {over}",
                    cluster.metadata.name, over.field
                ),
            });
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        format!(
            "Secret {name:?} would give machines config bundles over the cap of {} MiB; nothing was changed",
            drover_common::api::MAX_BUNDLE_BYTES / (1024 * 1024)
        ),
        errors,
    ))
}

/// The documents' example Secret: a registry credential a file reads.
pub fn example_secret() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": drover_common::API_VERSION,
        "kind": "Secret",
        "metadata": {"name": "registry"},
        "stringData": {"hosts.toml": "server = \"https://registry.example.com\"\n"}
    })
}
