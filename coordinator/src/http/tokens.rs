//! Registration tokens: made, revoked, deleted, and their tickets minted,
//! through `/v1` (`drover token`) and the Kubernetes-style API
//! (`kube/write.rs`) alike. A token's spec is fixed once it is made,
//! except that it can be revoked (and then stays revoked); its tickets
//! name its UID, so a ticket of a deleted token does not work for one
//! made again under the same name.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use drover_common::api::{
    CreateRegistrationToken, CreatedRegistrationToken, FieldError, ObjectMeta, RegistrationToken,
    RegistrationTokenSpec, RegistrationTokenStatus,
};
use drover_common::names::{check_dns_label, check_labels, check_object_name};
use drover_common::ticket::{new_nonce, TicketClaims, TicketGrant};
use drover_common::wire::{BootstrapDocument, BOOTSTRAP_KIND};
use drover_common::API_VERSION;
use time::OffsetDateTime;

use super::admin::ObjectName;
use super::auth::Admin;
use super::cluster_write::{Creation, Write, DROVER_MANAGER};
use super::error::ApiError;
use super::AuditChanges;
use crate::app::App;
use crate::domain::managed_fields;
use crate::store::{Kind, StoreError, MODIFY_ATTEMPTS};

/// The longest a token (and so its tickets) may live.
pub const MAX_TOKEN_TTL_SECONDS: u64 = 30 * 24 * 3600;

/// The most registrations one token may allow.
pub const MAX_USES: u32 = 100_000;

/// The errors of a token's pool, labels and uses, each named under
/// `prefix` (`""` for `/v1`'s request, `"spec."` for a document).
fn check_spec(prefix: &str, spec: &RegistrationTokenSpec) -> Vec<FieldError> {
    let mut errors = vec![];
    let mut error = |field: &str, message: String| {
        errors.push(FieldError {
            field: format!("{prefix}{field}"),
            message,
        })
    };
    if let Err(e) = check_dns_label("pool name", &spec.pool) {
        error("pool", e.to_string());
    } else if spec.pool.len() > drover_common::names::MAX_NAME_PREFIX {
        error(
            "pool",
            format!(
                "must be at most {} characters, so the names of machines registering into it (<pool>-xxxxxx) stay DNS-1123 labels",
                drover_common::names::MAX_NAME_PREFIX
            ),
        );
    }
    for e in check_labels(&spec.labels) {
        error("labels", e.to_string());
    }
    if spec.max_uses == 0 || spec.max_uses > MAX_USES {
        error(
            "maxUses",
            format!("must be between 1 and {MAX_USES}, got {}", spec.max_uses),
        );
    }
    errors
}

/// The error of a lifetime of `seconds`, named `field`, if it is not
/// between one second and [`MAX_TOKEN_TTL_SECONDS`].
fn check_lifetime(field: &str, seconds: i64) -> Option<FieldError> {
    (seconds <= 0 || seconds > MAX_TOKEN_TTL_SECONDS as i64).then(|| FieldError {
        field: field.into(),
        message: format!(
            "the token must live between 1 and {MAX_TOKEN_TTL_SECONDS} seconds from now; it would live {seconds}"
        ),
    })
}

/// A new token named `name`.
fn new_token(
    name: &str,
    spec: RegistrationTokenSpec,
    labels: std::collections::BTreeMap<String, String>,
    annotations: std::collections::BTreeMap<String, String>,
    now: OffsetDateTime,
) -> RegistrationToken {
    RegistrationToken {
        api_version: API_VERSION.into(),
        kind: "RegistrationToken".into(),
        metadata: ObjectMeta {
            name: name.to_owned(),
            uid: Some(uuid::Uuid::new_v4().to_string()),
            generation: 1,
            creation_timestamp: Some(now),
            labels,
            annotations,
            ..Default::default()
        },
        spec,
        status: RegistrationTokenStatus::default(),
    }
}

/// A bootstrap document with a new ticket for `token`: what
/// `drover-agent --bootstrap` reads. Every ticket of a token redeems the
/// token's uses, so minting another gives no more registrations.
pub fn bootstrap(app: &App, token: &RegistrationToken) -> BootstrapDocument {
    let ticket = app.keys.ticket_key.sign(&TicketClaims {
        grant: TicketGrant::PoolRegistration {
            token_id: token.metadata.name.clone(),
            pool: token.spec.pool.clone(),
            token_uid: token.metadata.uid.clone(),
        },
        issued_at: drover_common::now().unix_timestamp(),
        expires_at: token.spec.expires_at.unix_timestamp(),
        nonce: new_nonce(),
    });
    BootstrapDocument {
        api_version: API_VERSION.into(),
        kind: BOOTSTRAP_KIND.into(),
        coordinators: app.settings.advertise_urls.clone(),
        ca_pin: app.keys.ca_pin.clone(),
        ticket,
    }
}

/// Refuses minting a ticket of a token that can register nothing more.
pub fn check_mintable(token: &RegistrationToken) -> Result<(), ApiError> {
    let name = &token.metadata.name;
    let why = if token.spec.revoked {
        "it was revoked"
    } else if token.spec.expires_at <= drover_common::now() {
        "it has expired"
    } else if token.status.uses >= token.spec.max_uses {
        "all its uses were redeemed"
    } else {
        return Ok(());
    };
    Err(ApiError::conflict(format!(
        "registration token {name} can register no more machines: {why}; create a new token"
    )))
}

/// The part of a token its managers own: its labels, annotations and spec.
fn owned(token: &RegistrationToken) -> Result<serde_json::Value, ApiError> {
    let doc = serde_json::to_value(token).map_err(ApiError::internal)?;
    Ok(managed_fields::owned_part_of(&doc, &["spec"]))
}

/// The token `desired` makes of `old`: its spec cannot change, except
/// that it can be revoked (never un-revoked).
fn changed_token(
    old: &RegistrationToken,
    desired: &RegistrationToken,
) -> Result<RegistrationToken, ApiError> {
    let name = &old.metadata.name;
    let (was, wants) = (&old.spec, &desired.spec);
    let mut errors = vec![];
    let mut immutable = |field: &str, same: bool| {
        if !same {
            errors.push(FieldError {
                field: format!("spec.{field}"),
                message: "field is immutable; create a new token instead".into(),
            });
        }
    };
    immutable("pool", was.pool == wants.pool);
    immutable("labels", was.labels == wants.labels);
    immutable("maxUses", was.max_uses == wants.max_uses);
    immutable("expiresAt", was.expires_at == wants.expires_at);
    if was.revoked && !wants.revoked {
        errors.push(FieldError {
            field: "spec.revoked".into(),
            message: "a revoked token stays revoked; create a new token instead".into(),
        });
    }
    if !errors.is_empty() {
        return Err(ApiError::invalid(
            format!("RegistrationToken {name:?} is invalid; nothing was changed"),
            errors,
        ));
    }
    let mut token = old.clone();
    token.metadata.labels = desired.metadata.labels.clone();
    token.metadata.annotations = desired.metadata.annotations.clone();
    if wants.revoked && !was.revoked {
        token.spec.revoked = true;
        token.metadata.generation += 1;
    }
    Ok(token)
}

/// Checks a new token's name, metadata and spec.
fn check_new(desired: &RegistrationToken, name: &str) -> Result<(), ApiError> {
    let mut errors = vec![];
    if let Err(e) = check_object_name("registration token name", name) {
        errors.push(FieldError {
            field: "metadata.name".into(),
            message: e.to_string(),
        });
    }
    errors.extend(check_spec("spec.", &desired.spec));
    let lifetime = (desired.spec.expires_at - drover_common::now()).whole_seconds();
    errors.extend(check_lifetime("spec.expiresAt", lifetime));
    if !errors.is_empty() {
        return Err(ApiError::invalid(
            format!("RegistrationToken {name:?} is invalid; nothing was changed"),
            errors,
        ));
    }
    Ok(())
}

/// Checks metadata every write of a token may change.
fn check_metadata(desired: &RegistrationToken, name: &str) -> Result<(), ApiError> {
    let mut errors: Vec<FieldError> = check_labels(&desired.metadata.labels)
        .into_iter()
        .map(|e| FieldError {
            field: "metadata.labels".into(),
            message: e.to_string(),
        })
        .collect();
    errors.extend(
        drover_common::names::check_annotations(&desired.metadata.annotations)
            .into_iter()
            .map(|message| FieldError {
                field: "metadata.annotations".into(),
                message,
            }),
    );
    if !errors.is_empty() {
        return Err(ApiError::invalid(
            format!("RegistrationToken {name:?} is invalid; nothing was changed"),
            errors,
        ));
    }
    Ok(())
}

/// Writes registration token `w.name` as `decide` wants it from the
/// stored one (with its revision): a new token, or a stored one revoked
/// or relabelled. A write that changes nothing stores nothing.
pub fn write_token(
    app: &App,
    w: &Write<'_>,
    mut decide: impl FnMut(Option<&(RegistrationToken, u64)>) -> Result<RegistrationToken, ApiError>,
) -> Result<(StatusCode, AuditChanges, RegistrationToken), ApiError> {
    let name = w.name;
    for _ in 0..MODIFY_ATTEMPTS {
        let current = app
            .store
            .get_json::<RegistrationToken>(Kind::RegistrationToken, name)?;
        match (&current, w.creation) {
            (None, Creation::Refused) => {
                return Err(ApiError::not_found("registration token", name))
            }
            (Some(_), Creation::Only) => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    format!("registration token {name} already exists; pick another name, or delete it first"),
                ))
            }
            _ => {}
        }
        let desired = decide(current.as_ref())?;
        super::body::check_document_name(&desired.metadata.name, name)?;
        check_metadata(&desired, name)?;
        let mut token = match &current {
            None => {
                check_new(&desired, name)?;
                new_token(
                    name,
                    desired.spec.clone(),
                    desired.metadata.labels.clone(),
                    desired.metadata.annotations.clone(),
                    drover_common::now(),
                )
            }
            Some((old, _)) => changed_token(old, &desired)?,
        };
        token.metadata.managed_fields = match w.manager {
            Some(manager) => managed_fields::update(
                &current
                    .as_ref()
                    .map(|(old, _)| owned(old))
                    .transpose()?
                    .unwrap_or(serde_json::Value::Null),
                &owned(&token)?,
                current
                    .as_ref()
                    .map_or(&[][..], |(old, _)| &old.metadata.managed_fields),
                manager,
                API_VERSION,
                drover_common::now(),
            ),
            None => desired.metadata.managed_fields.clone(),
        };
        let shown = |mut t: RegistrationToken, rev: u64| {
            t.metadata.resource_version = Some(rev.to_string());
            t
        };
        let written = match &current {
            None => {
                if w.dry_run {
                    return Ok((StatusCode::CREATED, AuditChanges::default(), token));
                }
                app.store
                    .create_json(Kind::RegistrationToken, name, &token)
                    .map(|rev| (StatusCode::CREATED, rev, "created"))
            }
            Some((old, rev)) => {
                if *old == token {
                    return Ok((StatusCode::OK, AuditChanges::default(), shown(token, *rev)));
                }
                if w.dry_run {
                    return Ok((StatusCode::OK, AuditChanges::default(), shown(token, *rev)));
                }
                let what = if token.spec.revoked && !old.spec.revoked {
                    "revoked"
                } else {
                    "relabelled"
                };
                app.store
                    .update_json(Kind::RegistrationToken, name, &token, Some(*rev))
                    .map(|rev| (StatusCode::OK, rev, what))
            }
        };
        match written {
            Ok((status, rev, what)) => {
                tracing::info!(token = %name, by = %w.admin.token_id, "registration token {what}");
                return Ok((
                    status,
                    AuditChanges(vec![format!("registration token {name} {what}")]),
                    shown(token, rev),
                ));
            }
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Contended {
        kind: Kind::RegistrationToken.as_str(),
        name: name.to_owned(),
        attempts: MODIFY_ATTEMPTS,
    }
    .into())
}

/// Deletes registration token `name` (after `check` passes on it): its
/// tickets stop working at once, as a revoked token's do.
pub fn remove_token(
    app: &App,
    admin: &Admin,
    name: &str,
    dry_run: bool,
    check: impl Fn(&RegistrationToken) -> Result<(), ApiError>,
) -> Result<(AuditChanges, RegistrationToken), ApiError> {
    let (mut token, rev) = app
        .store
        .get_json::<RegistrationToken>(Kind::RegistrationToken, name)?
        .ok_or_else(|| ApiError::not_found("registration token", name))?;
    token.metadata.resource_version = Some(rev.to_string());
    check(&token)?;
    if dry_run {
        return Ok((AuditChanges::default(), token));
    }
    match app.store.delete(Kind::RegistrationToken, name, Some(rev)) {
        Ok(_) => {}
        Err(StoreError::Conflict { .. }) => {
            return Err(ApiError::conflict(format!(
                "registration token {name} changed while it was being deleted; nothing was deleted, read it again and retry"
            )))
        }
        Err(e) => return Err(e.into()),
    }
    tracing::info!(token = %name, by = %admin.token_id, "registration token deleted");
    Ok((
        AuditChanges(vec![format!("registration token {name} deleted")]),
        token,
    ))
}

/// `POST /v1/registrationtokens`: a token and the bootstrap document that carries its ticket.
#[utoipa::path(
    post,
    path = "/v1/registrationtokens",
    tag = "registration-tokens",
    security(("adminToken" = [])),
    request_body(
        content = CreateRegistrationToken,
        example = json!({"pool": "default", "labels": {"env": "dev"}, "ttlSeconds": 3600, "maxUses": 1}),
    ),
    responses(
        (status = 201, description = "The token, and the bootstrap document (with its ticket) to hand to `drover-agent --bootstrap`.", body = CreatedRegistrationToken),
        (status = 409, response = super::responses::Conflict),
        super::responses::JsonBodyRefusals,
    ),
)]
pub async fn create_token(
    State(app): State<Arc<App>>,
    admin: Admin,
    super::body::Body(req): super::body::Body<CreateRegistrationToken>,
) -> Result<(StatusCode, Json<CreatedRegistrationToken>), ApiError> {
    admin.require_write()?;
    let now = drover_common::now();
    let ttl = i64::try_from(req.ttl_seconds).unwrap_or(i64::MAX);
    let mut spec = RegistrationTokenSpec {
        pool: req.pool,
        labels: req.labels,
        max_uses: req.max_uses,
        expires_at: now,
        revoked: false,
    };
    let mut errors = check_spec("", &spec);
    errors.extend(check_lifetime("ttlSeconds", ttl));
    if !errors.is_empty() {
        return Err(ApiError::invalid(
            "the registration token request is invalid",
            errors,
        ));
    }
    // Checked above: at most MAX_TOKEN_TTL_SECONDS, so this cannot overflow.
    spec.expires_at = now + time::Duration::seconds(ttl);
    let id = format!("rt-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let token = new_token(&id, spec, Default::default(), Default::default(), now);
    app.store
        .create_json(Kind::RegistrationToken, &id, &token)?;
    tracing::info!(token = %id, by = %admin.token_id, "registration token created");
    let bootstrap = bootstrap(&app, &token);
    Ok((
        StatusCode::CREATED,
        Json(CreatedRegistrationToken { token, bootstrap }),
    ))
}

/// `GET /v1/registrationtokens`: every registration token (never a ticket).
#[utoipa::path(
    get,
    path = "/v1/registrationtokens",
    tag = "registration-tokens",
    security(("adminToken" = [])),
    responses(
        (status = 200, description = "Every registration token, by name.", body = Vec<RegistrationToken>),
    ),
)]
pub async fn list_tokens(
    State(app): State<Arc<App>>,
    _admin: Admin,
) -> Result<Json<Vec<RegistrationToken>>, ApiError> {
    Ok(Json(
        app.store
            .list_json::<RegistrationToken>(Kind::RegistrationToken)?
            .into_iter()
            .map(|(mut t, rev)| {
                t.metadata.resource_version = Some(rev.to_string());
                t
            })
            .collect(),
    ))
}

/// `PUT /v1/registrationtokens/{name}`: the same as `DELETE`.
#[utoipa::path(
    put,
    path = "/v1/registrationtokens/{name}",
    tag = "registration-tokens",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The registration token's name.", example = "rt-0123456789")),
    responses(
        (status = 200, description = "The token, revoked; tickets issued under it stop working at once.", body = RegistrationToken),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
    ),
)]
pub async fn revoke_token_put(
    state: State<Arc<App>>,
    admin: Admin,
    path: ObjectName,
) -> Result<Json<RegistrationToken>, ApiError> {
    revoke_token(state, admin, path).await
}

/// `DELETE /v1/registrationtokens/{name}`: revokes a token; tickets issued
/// under it stop working at once. The token is kept, revoked, so `drover
/// get registrationtokens` still shows what it allowed.
#[utoipa::path(
    delete,
    path = "/v1/registrationtokens/{name}",
    tag = "registration-tokens",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The registration token's name.", example = "rt-0123456789")),
    responses(
        (status = 200, description = "The token, revoked; tickets issued under it stop working at once.", body = RegistrationToken),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
    ),
)]
pub async fn revoke_token(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
) -> Result<Json<RegistrationToken>, ApiError> {
    admin.require_write()?;
    let (_, _, token) = crate::store::blocking(move || {
        let w = Write {
            name: &name,
            admin: &admin,
            creation: Creation::Refused,
            dry_run: false,
            manager: Some(DROVER_MANAGER),
        };
        write_token(&app, &w, |current| {
            let (mut t, _) = current
                .cloned()
                .ok_or_else(|| ApiError::not_found("registration token", w.name))?;
            t.spec.revoked = true;
            Ok(t)
        })
    })
    .await?;
    Ok(Json(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(now: OffsetDateTime) -> RegistrationToken {
        new_token(
            "rack7",
            RegistrationTokenSpec {
                pool: "rack7".into(),
                labels: [("rack".to_owned(), "r7".to_owned())].into(),
                max_uses: 2,
                expires_at: now + time::Duration::hours(1),
                revoked: false,
            },
            Default::default(),
            Default::default(),
            now,
        )
    }

    #[test]
    fn a_tokens_spec_is_fixed_but_for_revoking_it_once() {
        let now = drover_common::now();
        let old = token(now);
        // Labels change; nothing else does.
        let mut relabelled = old.clone();
        relabelled
            .metadata
            .labels
            .insert("tier".into(), "edge".into());
        let t = changed_token(&old, &relabelled).unwrap();
        assert_eq!(t.metadata.labels["tier"], "edge");
        assert_eq!(t.metadata.generation, old.metadata.generation);
        // Each spec field but `revoked` is immutable, and each is named.
        let mut wants = old.clone();
        wants.spec.pool = "other".into();
        wants.spec.max_uses = 9;
        wants.spec.expires_at += time::Duration::hours(1);
        wants.spec.labels.clear();
        let e = changed_token(&old, &wants).unwrap_err();
        let fields: Vec<&str> = e.errors.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(
            fields,
            ["spec.pool", "spec.labels", "spec.maxUses", "spec.expiresAt"]
        );
        // Revoked once, for good.
        let mut revoke = old.clone();
        revoke.spec.revoked = true;
        let revoked = changed_token(&old, &revoke).unwrap();
        assert!(revoked.spec.revoked);
        assert_eq!(revoked.metadata.generation, old.metadata.generation + 1);
        let e = changed_token(&revoked, &old).unwrap_err();
        assert!(e.errors[0].message.contains("stays revoked"), "{e:?}");
        // Status is the coordinator's: a document's is ignored.
        let mut used = old.clone();
        used.status.uses = 2;
        assert_eq!(changed_token(&old, &used).unwrap().status.uses, 0);
    }

    #[test]
    fn a_token_that_can_register_nothing_more_mints_nothing() {
        let now = drover_common::now();
        assert!(check_mintable(&token(now)).is_ok());
        let mut t = token(now);
        t.spec.revoked = true;
        assert!(check_mintable(&t).unwrap_err().detail.contains("revoked"));
        let mut t = token(now);
        t.status.uses = 2;
        assert!(check_mintable(&t).unwrap_err().detail.contains("uses"));
        let t = token(now - time::Duration::hours(2));
        assert!(check_mintable(&t).unwrap_err().detail.contains("expired"));
    }

    #[test]
    fn a_new_token_lives_between_a_second_and_thirty_days() {
        let now = drover_common::now();
        let mut t = token(now);
        assert!(check_new(&t, "rack7").is_ok());
        t.spec.expires_at = now + time::Duration::days(31);
        let e = check_new(&t, "rack7").unwrap_err();
        assert_eq!(e.errors[0].field, "spec.expiresAt");
        let e = check_new(&token(now), "Not_A_Name").unwrap_err();
        assert_eq!(e.errors[0].field, "metadata.name");
    }
}
