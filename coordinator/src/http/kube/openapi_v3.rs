//! OpenAPI v3 for the Kubernetes-style API, as the API server serves it:
//! `GET /openapi/v3` (the index of group versions) and
//! `GET /openapi/v3/apis/drover.dev/v1alpha1` (their document), which
//! kubectl needs for `apply`, `diff` and `explain`, and to know that the
//! server validates fields (`fieldValidation`) and takes `dryRun`.
//!
//! The schemas are those of `/openapi.json` (the same Rust types), renamed
//! as Kubernetes names them (`dev.drover.v1alpha1.Cluster`) and written in
//! OpenAPI 3.0, which kubectl reads (kube-openapi's spec3): a nullable
//! type is `nullable: true`, a reference with siblings is wrapped in
//! `allOf`. What this copies: the index (apiserver's
//! `k8s.io/kube-openapi/pkg/handler3`: `{"paths": {"apis/<g>/<v>":
//! {"serverRelativeURL": ...?hash=...}}}`), the extensions
//! `x-kubernetes-group-version-kind` (a list on schemas, an object on
//! operations), `x-kubernetes-action`, `x-kubernetes-list-type` and
//! `x-kubernetes-list-map-keys`, and the PATCH operation's query
//! parameters, which kubectl's `query_param_verifier_v3.go` looks for.

use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use sha2::Digest;

use super::{group_version, KubeResult, Resource, GROUP, RESOURCES, VERSION};
use crate::app::App;
use crate::http::auth::resolve_admin;

/// The prefix of every schema's name.
const PREFIX: &str = "dev.drover.v1alpha1.";

/// The path of the group version's document under `/openapi/v3/`.
pub fn document_path() -> String {
    format!("apis/{}", group_version())
}

/// Rewrites a 3.1 schema as 3.0, renaming references.
fn to_v30(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get_mut("$ref") {
                if let Some(name) = r.strip_prefix("#/components/schemas/") {
                    if !name.starts_with(PREFIX) {
                        *r = format!("#/components/schemas/{PREFIX}{name}");
                    }
                }
            }
            // `type: [T, "null"]` → `type: T, nullable: true`.
            if let Some(Value::Array(types)) = m.get("type") {
                let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                let nullable = rest.len() < types.len();
                if rest.len() == 1 {
                    m.insert("type".into(), rest[0].clone());
                } else {
                    m.remove("type");
                }
                if nullable {
                    m.insert("nullable".into(), true.into());
                }
            }
            // `oneOf: [{type: null}, S]` → S, nullable.
            if let Some(Value::Array(options)) = m.get("oneOf") {
                let rest: Vec<Value> = options
                    .iter()
                    .filter(|o| o.get("type") != Some(&Value::from("null")))
                    .cloned()
                    .collect();
                if rest.len() == 1 && rest.len() < options.len() {
                    m.remove("oneOf");
                    m.insert("nullable".into(), true.into());
                    if let Value::Object(only) = &rest[0] {
                        for (k, v) in only {
                            m.entry(k.clone()).or_insert_with(|| v.clone());
                        }
                    }
                }
            }
            // A reference with siblings: `allOf: [{$ref}]`, as Kubernetes
            // writes `metadata`.
            if m.len() > 1 {
                if let Some(r) = m.remove("$ref") {
                    m.insert("allOf".into(), json!([{"$ref": r}]));
                }
            }
            // 3.1 only; kube-openapi's 3.0 schema has no place for them.
            for k in ["examples", "const", "$schema", "contentMediaType"] {
                m.remove(k);
            }
            for child in m.values_mut() {
                to_v30(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(to_v30),
        _ => {}
    }
}

/// Marks the lists whose items merge by key (see
/// `domain::managed_fields::list_key`).
fn mark_keyed_lists(schemas: &mut Map<String, Value>) {
    let keyed = [
        ("ClusterSpec", "workerPools", "name"),
        ("ClusterSpec", "addons", "name"),
        ("ClusterSpec", "files", "path"),
        ("ControlPlaneSpec", "files", "path"),
        ("WorkerPoolSpec", "files", "path"),
    ];
    for (schema, field, key) in keyed {
        if let Some(p) = schemas
            .get_mut(&format!("{PREFIX}{schema}"))
            .and_then(|s| s.get_mut("properties"))
            .and_then(|p| p.get_mut(field))
            .and_then(Value::as_object_mut)
        {
            p.insert("x-kubernetes-list-type".into(), "map".into());
            p.insert("x-kubernetes-list-map-keys".into(), json!([key]));
        }
    }
}

fn gvk(kind: &str) -> Value {
    json!({"group": GROUP, "version": VERSION, "kind": kind})
}

fn schema_ref(kind: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{PREFIX}{kind}")})
}

fn query(name: &str, description: &str, schema: Value) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": schema, "uniqueItems": true})
}

fn ok(kind: &str) -> Value {
    json!({"description": "OK", "content": {"application/json": {"schema": schema_ref(kind)}}})
}

fn write_params() -> Vec<Value> {
    vec![
        query(
            "dryRun",
            "All: check everything, store nothing.",
            json!({"type": "string"}),
        ),
        query(
            "fieldManager",
            "The client whose fields these are.",
            json!({"type": "string"}),
        ),
        query(
            "fieldValidation",
            "Strict, Warn (the default) or Ignore: what an unknown field is.",
            json!({"type": "string"}),
        ),
    ]
}

fn operation(r: &Resource, action: &str, verb: &str) -> Value {
    json!({
        "operationId": format!("{verb}DroverDevV1alpha1{}", r.kind),
        "tags": ["droverDev_v1alpha1"],
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk(r.kind),
        "responses": {"200": ok(r.schema), "401": {"description": "Unauthorized"}},
    })
}

/// The paths of one resource.
fn resource_paths(r: &Resource, paths: &mut Map<String, Value>) {
    let base = format!("/apis/{}/{}", group_version(), r.plural);
    let item = format!("{base}/{{name}}");
    let name_param = json!({"name": "name", "in": "path", "required": true, "description": format!("The {}'s name.", r.singular), "schema": {"type": "string"}, "uniqueItems": true});
    let can = |verb: &str| r.verbs.contains(&verb);
    let mut collection = Map::new();
    let mut list = operation(r, "list", "list");
    list["responses"]["200"] = ok(&format!("{}List", r.kind));
    list["parameters"] = json!([
        query(
            "labelSelector",
            "Only objects whose labels match.",
            json!({"type": "string"})
        ),
        query(
            "fieldSelector",
            "Only objects whose fields match (metadata.name).",
            json!({"type": "string"})
        ),
        query("limit", "At most this many.", json!({"type": "integer"})),
        query(
            "continue",
            "The next page of a list.",
            json!({"type": "string"})
        ),
        query(
            "watch",
            "Watch instead of listing.",
            json!({"type": "boolean"})
        ),
        query(
            "resourceVersion",
            "Watch from this revision.",
            json!({"type": "string"})
        ),
        query(
            "allowWatchBookmarks",
            "Send BOOKMARK events.",
            json!({"type": "boolean"})
        ),
        query(
            "timeoutSeconds",
            "How long a watch lasts.",
            json!({"type": "integer"})
        ),
    ]);
    collection.insert("get".into(), list);
    if can("create") {
        let mut create = operation(r, "post", "create");
        create["parameters"] = Value::Array(write_params());
        // What is sent is the kind's document (a Secret with values);
        // what comes back, the resource's schema (a Secret's keys).
        create["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": schema_ref(r.kind)}}});
        create["responses"]["201"] = ok(r.schema);
        collection.insert("post".into(), create);
    }
    paths.insert(base, Value::Object(collection));
    let mut one = Map::new();
    one.insert("parameters".into(), json!([name_param]));
    one.insert("get".into(), operation(r, "get", "read"));
    if can("update") {
        let mut put = operation(r, "put", "replace");
        put["parameters"] = Value::Array(write_params());
        put["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": schema_ref(r.kind)}}});
        one.insert("put".into(), put);
    }
    if can("patch") {
        let mut patch = operation(r, "patch", "patch");
        let mut params = write_params();
        params.push(query(
            "force",
            "Take the fields of a server-side apply from their other managers.",
            json!({"type": "boolean"}),
        ));
        patch["parameters"] = Value::Array(params);
        let body = json!({"schema": {"type": "object"}});
        patch["requestBody"] = json!({"required": true, "content": {
            "application/apply-patch+yaml": body,
            "application/json-patch+json": body,
            "application/merge-patch+json": body,
        }});
        patch["responses"]["201"] = ok(r.schema);
        one.insert("patch".into(), patch);
    }
    if can("delete") {
        let mut delete = operation(r, "delete", "delete");
        delete["parameters"] = json!([
            query(
                "dryRun",
                "All: check everything, store nothing.",
                json!({"type": "string"})
            ),
            query(
                "propagationPolicy",
                "Foreground or Background (the same for Drover); Orphan is refused.",
                json!({"type": "string"})
            ),
        ]);
        one.insert("delete".into(), delete);
    }
    paths.insert(item.clone(), Value::Object(one));
    if r.status {
        let mut status = Map::new();
        status.insert("parameters".into(), json!([name_param]));
        status.insert("get".into(), operation(r, "get", "readStatus"));
        paths.insert(format!("{item}/status"), Value::Object(status));
    }
    if let Some(m) = &r.mints {
        let mut create = operation(r, "post", "create");
        create["operationId"] = format!(
            "createDroverDevV1alpha1{}{}",
            r.kind,
            m.subresource[..1].to_ascii_uppercase() + &m.subresource[1..]
        )
        .into();
        create["x-kubernetes-group-version-kind"] = gvk(m.kind);
        create["parameters"] = json!([query(
            "dryRun",
            "All: check everything, mint nothing.",
            json!({"type": "string"})
        )]);
        create["requestBody"] = json!({"required": false, "content": {"application/json": {"schema": {"type": "object"}}}});
        create["responses"] = json!({"201": ok(m.schema), "401": {"description": "Unauthorized"}});
        let mut minted = Map::new();
        minted.insert("parameters".into(), json!([name_param]));
        minted.insert("post".into(), create);
        paths.insert(format!("{item}/{}", m.subresource), Value::Object(minted));
    }
}

/// The group version's document.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let source: Value = serde_json::from_str(crate::http::openapi::document())
            .expect("the OpenAPI document is JSON");
        let mut schemas = Map::new();
        if let Some(all) = source["components"]["schemas"].as_object() {
            for (name, schema) in all {
                let mut schema = schema.clone();
                to_v30(&mut schema);
                schemas.insert(format!("{PREFIX}{name}"), schema);
            }
        }
        for r in RESOURCES {
            if let Some(Value::Object(s)) = schemas.get_mut(&format!("{PREFIX}{}", r.schema)) {
                s.insert("x-kubernetes-group-version-kind".into(), json!([gvk(r.kind)]));
            }
            schemas.insert(
                format!("{PREFIX}{}List", r.kind),
                json!({
                    "type": "object",
                    "description": format!("A list of {}.", r.plural),
                    "required": ["items"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object", "properties": {"resourceVersion": {"type": "string"}, "continue": {"type": "string"}}},
                        "items": {"type": "array", "items": schema_ref(r.schema)},
                    },
                    "x-kubernetes-group-version-kind": [gvk(&format!("{}List", r.kind))],
                }),
            );
        }
        mark_keyed_lists(&mut schemas);
        let mut paths = Map::new();
        for r in RESOURCES {
            resource_paths(r, &mut paths);
        }
        json!({
            "openapi": "3.0.0",
            "info": {"title": "Drover", "version": group_version()},
            "paths": paths,
            "components": {
                "schemas": schemas,
                "securitySchemes": {"BearerToken": {"type": "apiKey", "description": "An admin token, as `Authorization: Bearer drv_...`.", "name": "authorization", "in": "header"}},
            },
        })
    })
}

/// The document's hash, which its URL carries (kubectl caches by it).
fn hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        let digest = sha2::Sha256::digest(document().to_string().as_bytes());
        digest.iter().take(32).map(|b| format!("{b:02X}")).collect()
    })
}

/// `GET /openapi/v3`: where each group version's document is.
pub async fn index(State(app): State<Arc<App>>, headers: HeaderMap) -> KubeResult {
    resolve_admin(&app, &headers)?;
    let mut paths = Map::new();
    paths.insert(
        document_path(),
        json!({"serverRelativeURL": format!("/openapi/v3/{}?hash={}", document_path(), hash())}),
    );
    Ok(axum::Json(json!({ "paths": paths })).into_response())
}

/// `GET /openapi/v3/apis/drover.dev/v1alpha1`: the document.
pub async fn group_version_document(State(app): State<Arc<App>>, headers: HeaderMap) -> KubeResult {
    resolve_admin(&app, &headers)?;
    let mut response: Response = axum::Json(document()).into_response();
    response.headers_mut().insert(
        header::ETAG,
        HeaderValue::from_str(&format!("\"{}\"", hash()))
            .unwrap_or(HeaderValue::from_static("\"\"")),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_is_openapi_3_0_with_kubernetes_extensions() {
        let doc = document();
        let text = doc.to_string();
        assert!(!text.contains(r#""type":["#), "a 3.1 type list is left");
        let cluster = &doc["components"]["schemas"]["dev.drover.v1alpha1.Cluster"];
        assert_eq!(
            cluster["x-kubernetes-group-version-kind"][0]["kind"],
            "Cluster"
        );
        // Every reference names a schema the document has.
        for r in text.split(r##""$ref":"#/components/schemas/"##).skip(1) {
            let name = r.split('"').next().unwrap();
            assert!(
                doc["components"]["schemas"].get(name).is_some(),
                "{name} is referenced, not defined"
            );
        }
        let patch = &doc["paths"]["/apis/drover.dev/v1alpha1/clusters/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Cluster");
        let params: Vec<&str> = patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert!(params.contains(&"fieldValidation") && params.contains(&"dryRun"));
        let pools = &doc["components"]["schemas"]["dev.drover.v1alpha1.ClusterSpec"]["properties"]
            ["workerPools"];
        assert_eq!(pools["x-kubernetes-list-type"], "map");
    }
}
