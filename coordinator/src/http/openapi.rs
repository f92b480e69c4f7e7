//! The API's OpenAPI 3.1 document, built from the handlers' `#[utoipa::path]`
//! annotations and the wire types' schemas, served unauthenticated at
//! `GET /openapi.json` (it describes the API, it holds no secret).
//! `scripts/schemathesis` fuzzes a running coordinator against it.

use std::sync::OnceLock;

use drover_common::api::Problem;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::admin;
use super::machine;
use super::responses::*;
use super::secrets;
use super::security;
use super::tokens;

/// The name of the admin bearer-token security scheme.
pub const ADMIN_TOKEN: &str = "adminToken";
/// The name of the machine client-certificate (mutual TLS) security scheme.
pub const MACHINE_CERTIFICATE: &str = "machineCertificate";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Drover coordinator API",
        description = "The admin API (bearer admin tokens, roles `admin` and `viewer`) and the \
            machine API (a ticket to register, mutual TLS with the issued machine certificate \
            after that). Every error is an RFC 9457 problem document \
            (`application/problem+json`); a refused request changes nothing.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        healthz,
        livez,
        readyz,
        super::metrics,
        openapi_json,
        admin::list_clusters,
        admin::get_cluster,
        admin::apply_cluster,
        admin::delete_cluster,
        admin::kubeconfig,
        super::autoscaler::credentials,
        admin::list_machines,
        admin::status,
        admin::coordinators,
        admin::get_machine,
        admin::delete_machine,
        admin::revoke_machine,
        super::bmc::set_bmc,
        super::bmc::clear_bmc,
        super::bmc::power,
        admin::resume_rollout,
        tokens::list_tokens,
        tokens::create_token,
        tokens::revoke_token_put,
        tokens::revoke_token,
        secrets::list_secrets,
        secrets::get_secret,
        secrets::apply_secret,
        secrets::delete_secret,
        machine::register,
        machine::heartbeat,
        machine::config,
        machine::renew,
        machine::snapshot_grant,
        machine::snapshot_upload,
        machine::snapshot_saved,
        machine::inventory,
        super::snapshots::request_snapshot,
        super::snapshots::list_snapshots,
        super::restore::restore_cluster,
        super::restore::snapshot_download,
        security::list_admin_tokens,
        security::create_admin_token,
        security::revoke_admin_token,
        security::list_keys,
        security::rotate_keys,
        security::read_audit,
        super::backup::backup,
    ),
    components(
        schemas(Problem, drover_common::api::FieldError),
        responses(
            BadRequest,
            Unauthorized,
            MachineUnauthorized,
            Forbidden,
            MachineForbidden,
            NotFound,
            Conflict,
            PayloadTooLarge,
            UnsupportedMediaType,
            Unprocessable,
            TooManyRequests,
        ),
    ),
    modifiers(&SecuritySchemes),
    tags(
        (name = "clusters", description = "Declarative clusters (admin API)."),
        (name = "machines", description = "Machines known to the coordinator (admin API)."),
        (name = "registration-tokens", description = "Tokens under which machines register into a pool (admin API)."),
        (name = "secrets", description = "Values machine files read (`contentFrom`); keys and sizes are shown, never a value (admin role only)."),
        (name = "security", description = "Admin tokens, encryption keys and the audit log (admin role only)."),
        (name = "machine", description = "The machine API the agent calls."),
        (name = "coordinator", description = "The coordinator's own state: version and background loops (admin API)."),
        (name = "meta", description = "Health and this document."),
    ),
)]
pub struct ApiDoc;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        optional_kubeconfig_body(doc);
        shared_refusals(doc);
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            ADMIN_TOKEN,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An admin token (`drv_<id>_<secret>`), as printed at first start or \
                         made by `drover admin-token create`. Role `viewer` may only read.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            MACHINE_CERTIFICATE,
            SecurityScheme::MutualTls {
                description: Some(
                    "The machine's client certificate, issued at registration and signed by \
                     the coordinator CA (CN = machine name, O = drover:machines)."
                        .into(),
                ),
                extensions: None,
            },
        );
    }
}

/// The kubeconfig request body is optional (absent, with no `Content-Type`),
/// never `null`: `Option<KubeconfigRequest>` in the annotation makes the body
/// not required, and this drops the `null` alternative it also adds.
fn optional_kubeconfig_body(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::schema::Schema;
    use utoipa::openapi::RefOr;
    let body = doc
        .paths
        .paths
        .get_mut("/v1/clusters/{name}/kubeconfig")
        .and_then(|item| item.post.as_mut())
        .and_then(|op| op.request_body.as_mut());
    for content in body.into_iter().flat_map(|b| b.content.values_mut()) {
        let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema else {
            continue;
        };
        let not_null: Vec<_> = one_of
            .items
            .iter()
            .filter(|s| {
                !matches!(s, RefOr::T(Schema::Object(o))
                    if o.schema_type == utoipa::openapi::schema::SchemaType::Type(utoipa::openapi::Type::Null))
            })
            .cloned()
            .collect();
        if let [only] = not_null.as_slice() {
            content.schema = Some(only.clone());
        }
    }
}

/// The refusals whole kinds of operations share, declared here once so no
/// route can forget them; an operation that documents its own keeps it:
/// - with a name in its path: 400 for a name that is not a valid object
///   name, before anything else (issue 12);
/// - behind an admin token: 401 without a valid one (the `Admin`
///   extractor) and, when it may change something, 403 to a viewer (the
///   audit middleware refuses a viewer's change before the body is read);
/// - behind a machine certificate: 401 and 403 when the certificate names
///   no machine, or is not a machine's.
fn shared_refusals(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::security::SecurityRequirement;
    use utoipa::openapi::{Ref, RefOr};
    let admin = SecurityRequirement::new(ADMIN_TOKEN, [""; 0]);
    let machine = SecurityRequirement::new(MACHINE_CERTIFICATE, [""; 0]);
    for (path, item) in doc.paths.paths.iter_mut() {
        let operations = [
            (&mut item.get, true),
            (&mut item.put, false),
            (&mut item.post, false),
            (&mut item.delete, false),
            (&mut item.patch, false),
        ];
        for (op, reads) in operations {
            let Some(op) = op else {
                continue;
            };
            let security = op.security.as_deref().unwrap_or_default();
            let mut refusals = vec![];
            if path.contains('{') {
                refusals.push(("400", "BadRequest"));
            }
            if security.contains(&admin) {
                refusals.push(("401", "Unauthorized"));
                if !reads {
                    refusals.push(("403", "Forbidden"));
                }
            }
            if security.contains(&machine) {
                refusals.push(("401", "MachineUnauthorized"));
                refusals.push(("403", "MachineForbidden"));
            }
            for (status, response) in refusals {
                op.responses
                    .responses
                    .entry(status.to_owned())
                    .or_insert_with(|| RefOr::Ref(Ref::from_response_name(response)));
            }
        }
    }
}

/// The document as JSON, built once.
pub fn document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        ApiDoc::openapi()
            .to_pretty_json()
            .expect("the OpenAPI document serializes")
    })
}

/// `GET /openapi.json`: this document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of this API.", body = Object, content_type = "application/json"),
    ),
)]
pub async fn openapi_json() -> axum::response::Response {
    super::typed_body("application/json", document())
}

/// Documents a plain-text `GET` route of the `meta` tag whose handler in
/// [`super::router`] carries no annotation (a closure, or `readyz` there):
/// `fn $name` only carries the path for [`ApiDoc`]. Each response is
/// `(status, description, example)`.
macro_rules! plain_text_route {
    ($(#[doc = $doc:tt])* fn $name:ident, $path:tt, $(($status:tt, $description:tt, $example:tt)),+ $(,)?) => {
        $(#[doc = $doc])*
        #[utoipa::path(
            get,
            path = $path,
            tag = "meta",
            responses($(
                (status = $status, description = $description, body = String, content_type = "text/plain", example = $example),
            )+),
        )]
        #[allow(dead_code)]
        fn $name() {}
    };
}

plain_text_route!(
    /// `GET /healthz`: whether the coordinator serves requests (documentation
    /// only: the route's handler is a closure in [`super::router`]).
    fn healthz,
    "/healthz",
    (200, "The coordinator serves requests.", "ok"),
);

plain_text_route!(
    /// `GET /livez`: whether the process serves requests; wire it to a
    /// process supervisor's liveness check (documentation only).
    fn livez,
    "/livez",
    (200, "The coordinator serves requests.", "ok"),
);

plain_text_route!(
    /// `GET /readyz`: whether this replica can do its work (store reachable,
    /// keys loaded, a leader known); wire it to a load balancer's health check
    /// (documentation only).
    fn readyz,
    "/readyz",
    (200, "The replica is ready.", "ok"),
    (503, "Not ready: one line per failed check, such as `store: unreachable`.", "leader: none elected yet"),
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_is_json_with_every_route() {
        let doc: serde_json::Value = serde_json::from_str(document()).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        let paths = doc["paths"].as_object().unwrap();
        for p in [
            "/healthz",
            "/openapi.json",
            "/v1/clusters/{name}",
            "/v1/machine/register",
            "/v1/audit",
            "/v1/status",
            "/v1/secrets/{name}",
            "/v1/backup",
            "/v1/snapshots",
            "/v1/clusters/{name}/snapshots",
            "/v1/machine/snapshots/{name}",
            "/v1/machine/snapshots/{name}/data",
            "/v1/machine/inventory",
            "/v1/clusters/{name}/restore",
            "/v1/clusters/{name}/autoscaler-credentials",
            "/v1/machines/{name}/bmc",
            "/v1/machines/{name}/power",
        ] {
            assert!(paths.contains_key(p), "{p} is missing");
        }
        let operations: usize = paths.values().map(|p| p.as_object().unwrap().len()).sum();
        assert_eq!(operations, 48);
        let schemas = &doc["components"]["schemas"];
        assert_eq!(
            schemas["CaPin"]["pattern"].as_str(),
            Some("^sha256:[0-9a-f]{64}$")
        );
        assert_eq!(
            schemas["BootstrapToken"]["pattern"].as_str(),
            Some("^[a-z0-9]{6}\\.[a-z0-9]{16}$")
        );
        // An optional body, never `null`.
        let kubeconfig = &paths["/v1/clusters/{name}/kubeconfig"]["post"]["requestBody"];
        assert_eq!(kubeconfig.get("required"), None);
        assert_eq!(
            kubeconfig["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/KubeconfigRequest"
        );
        let put = &paths["/v1/clusters/{name}"]["put"]["requestBody"]["content"];
        assert!(put.get("application/yaml").is_some() && put.get("application/json").is_some());
    }
}
