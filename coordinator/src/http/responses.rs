//! The documented shapes of the API's answers that many operations share
//! (the problem documents of each failure) and the documents' examples;
//! the handlers' `#[utoipa::path]` annotations and `openapi.rs` use them.

use drover_common::api::Problem;

/// A PEM CSR for a P-256 key (whose private half was thrown away), the
/// documents' example: only its key is used, the subject is ignored.
pub const EXAMPLE_CSR: &str = "-----BEGIN CERTIFICATE REQUEST-----\nMIHNMHQCAQAwEjEQMA4GA1UEAwwHZXhhbXBsZTBZMBMGByqGSM49AgEGCCqGSM49\nAwEHA0IABJQrnsz6UTOwFSXjkXXJzbBmqebQgSQSDC6yGkC7J+xzat6J7QmjEyaF\n1RHctYFpoUvW8M/KPnELq7FwfRTFbPOgADAKBggqhkjOPQQDAgNJADBGAiEAvTrI\nv0C/3OAc5Mhpu5J41YXEl5vurKq76WYc7jDsMD8CIQCLFxSV8c+JHB1DUiwa1QIs\nqh5vJHbr4r0W5tb8la7PqQ==\n-----END CERTIFICATE REQUEST-----\n";

/// The documents' example Cluster: one control-plane machine and two
/// workers claimed from the pool machines labelled `env: dev`.
pub fn example_cluster() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": drover_common::API_VERSION,
        "kind": "Cluster",
        "metadata": {"name": "demo", "labels": {"env": "dev"}},
        "spec": {
            "kubernetesVersion": "v1.31.2",
            "controlPlane": {"replicas": 1},
            "workerPools": [{"name": "default", "replicas": 2}],
            "provider": {"pool": {"selector": {"matchLabels": {"env": "dev"}}}}
        }
    })
}

/// The request is malformed: unparseable JSON, or a value the operation refuses.
#[derive(utoipa::ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub struct BadRequest(Problem);

/// No valid admin token: the `Authorization: Bearer <token>` header is
/// missing, malformed, or names a token this coordinator does not know.
#[derive(utoipa::ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub struct Unauthorized(Problem);

/// No valid machine identity: the call was made without the machine's client
/// certificate (mutual TLS), or the machine it names was deleted.
#[derive(utoipa::ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub struct MachineUnauthorized(Problem);

/// The admin token has the `viewer` role, which may only read.
#[derive(utoipa::ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub struct Forbidden(Problem);

/// The client certificate is valid but not a machine certificate.
#[derive(utoipa::ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub struct MachineForbidden(Problem);

/// No such object.
#[derive(utoipa::ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub struct NotFound(Problem);

/// The request conflicts with the object's current state (a stale
/// `resourceVersion`, an object being deleted, a concurrent change); fetch
/// it again and retry.
#[derive(utoipa::ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub struct Conflict(Problem);

/// The body is larger than 1 MiB; refused from its announced length before
/// it is read.
#[derive(utoipa::ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub struct PayloadTooLarge(Problem);

/// The body is not sent as `Content-Type: application/json`.
#[derive(utoipa::ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub struct UnsupportedMediaType(Problem);

/// The document does not match the schema or fails validation; `errors`
/// names every refused field.
#[derive(utoipa::ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub struct Unprocessable(Problem);

/// What is refused of a JSON request body before the operation looks at
/// it: 400 when it is not JSON, 413 when it is over 1 MiB, 415 when it is
/// not sent as `application/json`, 422 when it does not match the schema.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum JsonBodyRefusals {
    #[response(status = 400)]
    Malformed(#[ref_response] BadRequest),
    #[response(status = 413)]
    TooLarge(#[ref_response] PayloadTooLarge),
    #[response(status = 415)]
    NotJson(#[ref_response] UnsupportedMediaType),
    #[response(status = 422)]
    Invalid(#[ref_response] Unprocessable),
}

/// Too many registrations from this source address.
#[derive(utoipa::ToResponse)]
#[response(
    content_type = "application/problem+json",
    headers(("Retry-After" = u64, description = "Seconds to wait before retrying."))
)]
#[allow(dead_code)]
pub struct TooManyRequests(Problem);
