//! A pool machine's BMC (`spec.bmc`): set by an admin after checking that
//! the BMC answers with the Secret's credentials, cleared, and asked to
//! power the machine off, on or through a cycle. Remediation power-cycles
//! through the same BMC (`reconcile/executor.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use drover_common::api::{push_event, BmcSpec, FieldError, Machine};
use serde::{Deserialize, Serialize};

use super::admin::{change_machine, ObjectName};
use super::auth::Admin;
use super::error::ApiError;
use crate::app::App;
use crate::domain::bmc::{self, BmcError};
use crate::provider::redfish::PowerAction;

impl From<BmcError> for ApiError {
    fn from(e: BmcError) -> Self {
        match e {
            BmcError::Store(e) => e.into(),
            BmcError::None(_) => ApiError::conflict(e.to_string()),
            BmcError::MissingSecret { .. }
            | BmcError::MissingKey { .. }
            | BmcError::NotText { .. } => ApiError::invalid(
                "the BMC's credentials Secret is not usable; nothing was changed",
                vec![FieldError {
                    field: "credentialsSecret".into(),
                    message: e.to_string(),
                }],
            ),
            BmcError::Redfish(e) => ApiError::new(
                axum::http::StatusCode::BAD_GATEWAY,
                "BMC failed",
                format!("{e}; nothing was changed"),
            ),
        }
    }
}

/// A power action asked through `POST /v1/machines/{name}/power`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PowerRequest {
    pub action: PowerActionName,
}

/// `off` (only a machine no cluster holds), `on`, or `cycle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum PowerActionName {
    Off,
    On,
    Cycle,
}

/// What the BMC did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PowerAnswer {
    /// The machine's `ComputerSystem` (`@odata.id`).
    pub system: String,
    /// Its power state before.
    pub was: String,
    /// The `ResetType` sent; absent when nothing needed doing.
    pub reset: Option<String>,
}

fn pool_machine(app: &App, name: &str) -> Result<Machine, ApiError> {
    let m = app
        .machine(name)?
        .ok_or_else(|| ApiError::not_found("machine", name))?;
    if let Some(provider) = &m.spec.provider {
        return Err(ApiError::conflict(format!(
            "machine {name} was made by the {provider} provider, which powers it itself; a BMC belongs to a pool machine"
        )));
    }
    Ok(m)
}

/// `PUT /v1/machines/{name}/bmc`: sets a pool machine's BMC.
///
/// The BMC is asked for the machine's system and its power state with the
/// Secret's credentials first: a BMC that does not answer, refuses them,
/// or has several systems and none named is refused, and nothing changes.
/// The credentials stay in the Secret; only its name is kept.
#[utoipa::path(
    put,
    path = "/v1/machines/{name}/bmc",
    tag = "machines",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The machine's name.", example = "metal-a1b2c3")),
    request_body(content = BmcSpec, description = "The BMC's Redfish root and credentials Secret."),
    responses(
        (status = 200, description = "The machine, its BMC set.", body = Machine),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
        super::responses::JsonBodyRefusals,
        (status = 502, description = "The BMC did not answer as Redfish does; nothing was changed.", body = drover_common::api::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn set_bmc(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
    super::body::Body(spec): super::body::Body<BmcSpec>,
) -> Result<Json<Machine>, ApiError> {
    admin.require_write()?;
    let errors = spec.validate();
    if !errors.is_empty() {
        return Err(ApiError::invalid(
            "the BMC is not valid; nothing was changed",
            errors,
        ));
    }
    let client = crate::store::blocking({
        let (app, name, spec) = (app.clone(), name.clone(), spec.clone());
        move || {
            pool_machine(&app, &name)?;
            Ok::<_, ApiError>(bmc::connect(&app.store, &spec)?)
        }
    })
    .await?;
    let (system, power) = client.power_state().await.map_err(BmcError::from)?;
    let by = admin.token_id.clone();
    let set = {
        let spec = spec.clone();
        change_machine(&app, &name, move |m| {
            if m.spec.bmc.as_ref() == Some(&spec) {
                return Ok(false);
            }
            m.spec.bmc = Some(spec.clone());
            push_event(
                &mut m.status.events,
                "BmcSet",
                format!(
                    "BMC {} (system {system}, power {power}) set by admin token {by}; credentials in Secret {}",
                    spec.url, spec.credentials_secret
                ),
            );
            Ok(true)
        })
        .await?
    };
    tracing::info!(machine = %name, bmc = %spec.url, by = %admin.token_id, "machine's BMC set");
    app.reconcile_machine(&name);
    Ok(Json(set))
}

/// `DELETE /v1/machines/{name}/bmc`: forgets a machine's BMC; it is then
/// rebooted only through its agent, and replaced when that cannot reach
/// it.
#[utoipa::path(
    delete,
    path = "/v1/machines/{name}/bmc",
    tag = "machines",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The machine's name.", example = "metal-a1b2c3")),
    responses(
        (status = 200, description = "The machine, without a BMC.", body = Machine),
        (status = 404, response = super::responses::NotFound),
    ),
)]
pub async fn clear_bmc(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
) -> Result<Json<Machine>, ApiError> {
    admin.require_write()?;
    let by = admin.token_id.clone();
    let cleared = change_machine(&app, &name, move |m| {
        let Some(old) = m.spec.bmc.take() else {
            return Ok(false);
        };
        push_event(
            &mut m.status.events,
            "BmcCleared",
            format!("BMC {} forgotten by admin token {by}", old.url),
        );
        Ok(true)
    })
    .await?;
    tracing::info!(machine = %name, by = %admin.token_id, "machine's BMC cleared");
    Ok(Json(cleared))
}

/// `POST /v1/machines/{name}/power`: powers a machine off, on, or through
/// a cycle by its BMC.
///
/// Only a machine no cluster holds may be powered off (a machine in a
/// cluster leaves it through `drover delete machine` first). A powered-off
/// machine goes silent; a free one that stays silent is simply not
/// claimed, and `on` brings it back to its pool.
#[utoipa::path(
    post,
    path = "/v1/machines/{name}/power",
    tag = "machines",
    security(("adminToken" = [])),
    params(("name" = String, Path, description = "The machine's name.", example = "metal-a1b2c3")),
    request_body(content = PowerRequest),
    responses(
        (status = 200, description = "What the BMC did.", body = PowerAnswer),
        (status = 404, response = super::responses::NotFound),
        (status = 409, response = super::responses::Conflict),
        super::responses::JsonBodyRefusals,
        (status = 502, description = "The BMC did not answer as Redfish does.", body = drover_common::api::Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn power(
    State(app): State<Arc<App>>,
    admin: Admin,
    ObjectName(name): ObjectName,
    super::body::Body(req): super::body::Body<PowerRequest>,
) -> Result<Json<PowerAnswer>, ApiError> {
    admin.require_write()?;
    let (client, spec) = crate::store::blocking({
        let (app, name) = (app.clone(), name.clone());
        move || {
            let m = pool_machine(&app, &name)?;
            let spec = m.spec.bmc.clone().ok_or(BmcError::None(name.clone()))?;
            if req.action == PowerActionName::Off {
                if let Some(a) = &m.spec.assignment {
                    return Err(ApiError::conflict(format!(
                        "machine {name} serves cluster {}; take it out with `drover delete machine {name}` before powering it off",
                        a.cluster
                    )));
                }
            }
            Ok::<_, ApiError>((bmc::connect(&app.store, &spec)?, spec))
        }
    })
    .await?;
    let (action, label) = match req.action {
        PowerActionName::Off => (PowerAction::Off, "off"),
        PowerActionName::On => (PowerAction::On, "on"),
        PowerActionName::Cycle => (PowerAction::Cycle, "cycle"),
    };
    let outcome = client.power(action).await;
    crate::metrics::global().bmc_action(label, outcome.is_ok());
    let done = outcome.map_err(BmcError::from)?;
    let by = admin.token_id.clone();
    let message = format!(
        "power {label} by admin token {by}: the BMC at {} {}",
        spec.url,
        match &done.reset {
            Some(_) => format!("reset {done}"),
            None => format!("found {done}"),
        }
    );
    change_machine(&app, &name, move |m| {
        push_event(&mut m.status.events, "PowerAction", message.clone());
        Ok(true)
    })
    .await?;
    tracing::info!(machine = %name, action = label, %done, by = %admin.token_id, "machine power action through its BMC");
    Ok(Json(PowerAnswer {
        system: done.system,
        was: done.was,
        reset: done.reset,
    }))
}
