//! `kubectl auth can-i` against the coordinator: `SelfSubjectAccessReview`
//! and `SelfSubjectRulesReview` (authorization.k8s.io/v1), answered from
//! the admin token's role as every handler enforces it: any token reads
//! (get, list, watch) and the `admin` role writes, each only with the verbs
//! a resource serves.
//!
//! What this copies: the review objects and their `status`
//! (staging/src/k8s.io/api/authorization/v1/types.go), created with a 201
//! as the API server creates them
//! (pkg/registry/authorization/selfsubjectaccessreview/rest.go).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::{json, Value};

use super::write::KubeBody;
use super::{KubeResult, GROUP, RESOURCES};
use crate::app::App;
use crate::http::auth::resolve_admin;
use crate::http::error::ApiError;
use crate::types::AdminRole;

/// The group the reviews are served in.
pub const AUTHORIZATION_GROUP: &str = "authorization.k8s.io";

/// Where the reviews are created: POSTs that change nothing, so a viewer
/// may make them and the audit log counts them as reads.
pub const REVIEWS_PREFIX: &str = "/apis/authorization.k8s.io/v1/";

const READS: [&str; 3] = ["get", "list", "watch"];

/// Whether `role` may `verb` the `resource` (with `subresource`) of
/// `group`, and why.
pub fn decide(
    role: AdminRole,
    group: &str,
    resource: &str,
    subresource: &str,
    verb: &str,
) -> (bool, String) {
    if group != GROUP && !(group.is_empty() && RESOURCES.iter().any(|r| r.plural == resource)) {
        return (
            false,
            format!("the coordinator serves only the {GROUP} group"),
        );
    }
    let Some(r) = RESOURCES
        .iter()
        .find(|r| r.plural == resource || resource == "*")
    else {
        return (false, format!("{GROUP} has no resource {resource:?}"));
    };
    let served: &[&str] = match subresource {
        "" => r.verbs,
        "status" if r.status => &["get"],
        s if r.mints.as_ref().is_some_and(|m| m.subresource == s) => &["create"],
        other => return (false, format!("{resource} has no subresource {other:?}")),
    };
    let reads = READS.contains(&verb);
    if verb != "*" && !served.contains(&verb) {
        return (
            false,
            format!("{resource} cannot be {verb}: it is not served"),
        );
    }
    if r.admin_only && role != AdminRole::Admin {
        return (false, format!("only the admin role reads {resource}"));
    }
    match role {
        AdminRole::Admin => (true, "the admin role may read and write".into()),
        AdminRole::Viewer if reads => (true, "the viewer role may read".into()),
        AdminRole::Viewer => (false, "the viewer role may only get, list and watch".into()),
    }
}

/// The protobuf wire form kubectl sends a review in (typed clients of
/// built-in kinds send `application/vnd.kubernetes.protobuf`): the
/// `k8s\0` magic, then a `runtime.Unknown` holding the object
/// (apimachinery/pkg/runtime/serializer/protobuf/protobuf.go,
/// apimachinery/pkg/runtime/generated.proto), the review's fields as in
/// api/authorization/v1/generated.proto. Fields not read are skipped.
mod wire {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Unknown {
        #[prost(bytes = "vec", optional, tag = "2")]
        pub raw: Option<Vec<u8>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Review {
        #[prost(message, optional, tag = "2")]
        pub spec: Option<Spec>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Spec {
        #[prost(message, optional, tag = "1")]
        pub resource_attributes: Option<ResourceAttributes>,
        #[prost(message, optional, tag = "2")]
        pub non_resource_attributes: Option<NonResourceAttributes>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceAttributes {
        #[prost(string, optional, tag = "1")]
        pub namespace: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub verb: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub group: Option<String>,
        #[prost(string, optional, tag = "4")]
        pub version: Option<String>,
        #[prost(string, optional, tag = "5")]
        pub resource: Option<String>,
        #[prost(string, optional, tag = "6")]
        pub subresource: Option<String>,
        #[prost(string, optional, tag = "7")]
        pub name: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NonResourceAttributes {
        #[prost(string, optional, tag = "1")]
        pub path: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub verb: Option<String>,
    }
}

/// The protobuf envelope's magic.
const PROTOBUF_MAGIC: &[u8] = b"k8s\0";

/// A review's body, JSON or protobuf, as JSON.
fn review_of(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let protobuf = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/vnd.kubernetes.protobuf"));
    if !protobuf {
        return serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the body is not a SelfSubjectAccessReview: {e}"))
        });
    }
    use prost::Message;
    let bad = |why: String| {
        ApiError::bad_request(format!(
            "the protobuf body is not a SelfSubjectAccessReview: {why}"
        ))
    };
    let envelope = body
        .strip_prefix(PROTOBUF_MAGIC)
        .ok_or_else(|| bad("it does not start with the k8s\\0 magic".into()))?;
    let unknown = wire::Unknown::decode(envelope).map_err(|e| bad(e.to_string()))?;
    let review = wire::Review::decode(unknown.raw.unwrap_or_default().as_slice())
        .map_err(|e| bad(e.to_string()))?;
    let spec = review.spec.unwrap_or_default();
    let mut out = serde_json::Map::new();
    if let Some(r) = spec.resource_attributes {
        out.insert(
            "resourceAttributes".into(),
            json!({
                "namespace": r.namespace, "verb": r.verb, "group": r.group,
                "version": r.version, "resource": r.resource,
                "subresource": r.subresource, "name": r.name,
            }),
        );
    }
    if let Some(n) = spec.non_resource_attributes {
        out.insert(
            "nonResourceAttributes".into(),
            json!({"path": n.path, "verb": n.verb}),
        );
    }
    Ok(json!({ "spec": out }))
}

/// `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`.
pub async fn access_review(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    KubeBody(body): KubeBody,
) -> KubeResult {
    let admin = resolve_admin(&app, &headers)?;
    let review = review_of(&headers, &body)?;
    let spec = &review["spec"];
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let (allowed, reason) = if let Some(r) = spec.get("resourceAttributes") {
        decide(
            admin.role,
            &text(&r["group"]),
            &text(&r["resource"]),
            &text(&r["subresource"]),
            &text(&r["verb"]),
        )
    } else if let Some(n) = spec.get("nonResourceAttributes") {
        match text(&n["verb"]).as_str() {
            "get" => (true, "any admin token reads discovery and OpenAPI".into()),
            other => (false, format!("no path takes {other:?}")),
        }
    } else {
        return Err(ApiError::invalid(
            "the SelfSubjectAccessReview asks nothing",
            vec![drover_common::api::FieldError {
                field: "spec".into(),
                message: "exactly one of resourceAttributes, nonResourceAttributes is required"
                    .into(),
            }],
        )
        .into());
    };
    let answer = json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": format!("{AUTHORIZATION_GROUP}/v1"),
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": {"allowed": allowed, "reason": reason},
    });
    Ok((StatusCode::CREATED, axum::Json(answer)).into_response())
}

/// `POST /apis/authorization.k8s.io/v1/selfsubjectrulesreviews`: what
/// `kubectl auth can-i --list` prints.
pub async fn rules_review(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    KubeBody(_body): KubeBody,
) -> KubeResult {
    let admin = resolve_admin(&app, &headers)?;
    let mut rules = vec![];
    for r in RESOURCES {
        let verbs: Vec<&str> = r
            .verbs
            .iter()
            .copied()
            .filter(|v| admin.role == AdminRole::Admin || (READS.contains(v) && !r.admin_only))
            .collect();
        if verbs.is_empty() {
            continue;
        }
        rules.push(json!({"verbs": verbs, "apiGroups": [GROUP], "resources": [r.plural]}));
        if r.status {
            rules.push(json!({"verbs": ["get"], "apiGroups": [GROUP], "resources": [format!("{}/status", r.plural)]}));
        }
        if let Some(m) = r.mints.as_ref().filter(|_| admin.role == AdminRole::Admin) {
            rules.push(json!({"verbs": ["create"], "apiGroups": [GROUP], "resources": [format!("{}/{}", r.plural, m.subresource)]}));
        }
    }
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({
            "kind": "SelfSubjectRulesReview",
            "apiVersion": format!("{AUTHORIZATION_GROUP}/v1"),
            "metadata": {"creationTimestamp": null},
            "spec": {},
            "status": {
                "resourceRules": rules,
                "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["/api", "/apis", "/apis/*", "/openapi/*", "/version"]}],
                "incomplete": false,
            },
        })),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_protobuf_review_reads_as_its_json() {
        use prost::Message;
        let review = wire::Review {
            spec: Some(wire::Spec {
                resource_attributes: Some(wire::ResourceAttributes {
                    verb: Some("create".into()),
                    group: Some(GROUP.into()),
                    resource: Some("clusters".into()),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            }),
        };
        let mut body = PROTOBUF_MAGIC.to_vec();
        body.extend(
            wire::Unknown {
                raw: Some(review.encode_to_vec()),
            }
            .encode_to_vec(),
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/vnd.kubernetes.protobuf"),
        );
        let json = review_of(&headers, &body).unwrap();
        assert_eq!(json["spec"]["resourceAttributes"]["verb"], "create");
        assert_eq!(json["spec"]["resourceAttributes"]["resource"], "clusters");
        let e = review_of(&headers, b"not protobuf").unwrap_err();
        assert!(e.detail.contains("magic"), "{}", e.detail);
    }

    #[test]
    fn roles_map_to_verbs() {
        let viewer = |verb, resource| decide(AdminRole::Viewer, GROUP, resource, "", verb).0;
        let admin = |verb, resource| decide(AdminRole::Admin, GROUP, resource, "", verb).0;
        assert!(viewer("list", "clusters") && viewer("watch", "machines"));
        assert!(!viewer("create", "clusters") && !viewer("delete", "machines"));
        assert!(admin("patch", "clusters") && admin("delete", "machines"));
        // Not served, whoever asks.
        assert!(!admin("create", "machines"));
        assert!(!decide(AdminRole::Admin, GROUP, "clusters", "status", "update").0);
        assert!(!decide(AdminRole::Admin, "apps", "deployments", "", "get").0);
        // Secrets are the admin role's alone, as through /v1.
        assert!(!viewer("get", "secrets") && admin("list", "secrets"));
        assert!(viewer("watch", "registrationtokens"));
        // A token's tickets are minted by writers only.
        let mint = |role| decide(role, GROUP, "registrationtokens", "bootstrap", "create").0;
        assert!(mint(AdminRole::Admin) && !mint(AdminRole::Viewer));
        assert!(
            !decide(
                AdminRole::Admin,
                GROUP,
                "registrationtokens",
                "bootstrap",
                "get"
            )
            .0
        );
    }
}
