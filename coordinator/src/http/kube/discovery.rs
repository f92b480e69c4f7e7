//! Discovery: what kubectl, Argo CD and Flux read first to learn the
//! served groups, resources and verbs. Both forms are made from one
//! description ([`served`]):
//! - the legacy documents: `/api` (`APIVersions`, empty), `/apis`
//!   (`APIGroupList`) and each group version's `APIResourceList`, with
//!   subresources as `plural/subresource` entries
//!   (apiserver/pkg/endpoints/discovery/{legacy,group,version}.go);
//! - aggregated discovery (`apidiscovery.k8s.io/v2`), every group's
//!   resources in the one answer to `/api` and `/apis`, when the client's
//!   `Accept` asks for `application/json;g=apidiscovery.k8s.io;v=v2;
//!   as=APIGroupDiscoveryList` (apiserver/pkg/endpoints/discovery/
//!   aggregated/negotiation.go). client-go uses it only when both `/api`
//!   and `/apis` answer it, which they do (client-go/discovery/
//!   discovery_client.go: `GroupsAndMaybeResources`), and then reads no
//!   group version's list: one request instead of one per group.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::access::AUTHORIZATION_GROUP;
use super::{KubeResult, GROUP, RESOURCES, VERSION};
use crate::app::App;
use crate::http::auth::resolve_admin;

/// The content type of an aggregated discovery answer.
pub const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// A served resource or subresource.
struct Entry {
    /// The resource (`clusters`), or its subresource (`status`).
    name: &'static str,
    singular: &'static str,
    /// The kind answered, in `group`/`version` when it is not the
    /// resource's own group version.
    kind: &'static str,
    verbs: &'static [&'static str],
    short_names: &'static [&'static str],
    categories: &'static [&'static str],
    subresources: Vec<Entry>,
}

/// One served group version and its resources.
struct Served {
    group: &'static str,
    version: &'static str,
    resources: Vec<Entry>,
}

/// Everything served, in the order clients are told it.
fn served() -> [Served; 2] {
    let drover = RESOURCES
        .iter()
        .map(|r| {
            let mut subresources = vec![];
            if r.status {
                subresources.push(Entry {
                    name: "status",
                    singular: "",
                    kind: r.kind,
                    verbs: &["get"],
                    short_names: &[],
                    categories: &[],
                    subresources: vec![],
                });
            }
            if let Some(m) = &r.mints {
                subresources.push(Entry {
                    name: m.subresource,
                    singular: "",
                    kind: m.kind,
                    verbs: &["create"],
                    short_names: &[],
                    categories: &[],
                    subresources: vec![],
                });
            }
            Entry {
                name: r.plural,
                singular: r.singular,
                kind: r.kind,
                verbs: r.verbs,
                short_names: r.short_names,
                categories: &["drover"],
                subresources,
            }
        })
        .collect();
    let review = |name, singular, kind| Entry {
        name,
        singular,
        kind,
        verbs: &["create"],
        short_names: &[],
        categories: &[],
        subresources: vec![],
    };
    [
        Served {
            group: GROUP,
            version: VERSION,
            resources: drover,
        },
        Served {
            group: AUTHORIZATION_GROUP,
            version: "v1",
            resources: vec![
                review(
                    "selfsubjectaccessreviews",
                    "selfsubjectaccessreview",
                    "SelfSubjectAccessReview",
                ),
                review(
                    "selfsubjectrulesreviews",
                    "selfsubjectrulesreview",
                    "SelfSubjectRulesReview",
                ),
            ],
        },
    ]
}

/// Whether the client takes aggregated discovery: a media range of
/// `application/json` with `g=apidiscovery.k8s.io`, `v=v2` and
/// `as=APIGroupDiscoveryList` (parameters in any order; only v2 is
/// served, so a client asking for v2beta1 alone gets the legacy form).
fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mut parts = range.split(';').map(str::trim);
            parts
                .next()
                .is_some_and(|t| t.eq_ignore_ascii_case("application/json"))
                && {
                    let params: Vec<&str> = parts.collect();
                    ["g=apidiscovery.k8s.io", "v=v2", "as=APIGroupDiscoveryList"]
                        .iter()
                        .all(|p| params.contains(p))
                }
        })
}

/// The aggregated discovery document of `groups`.
fn aggregated(groups: &[Served]) -> Response {
    let items: Vec<Value> = groups
        .iter()
        .map(|g| {
            let response_kind = |kind: &str| json!({"group": g.group, "version": g.version, "kind": kind});
            let resources: Vec<Value> = g
                .resources
                .iter()
                .map(|r| {
                    let subresources: Vec<Value> = r
                        .subresources
                        .iter()
                        .map(|s| json!({"subresource": s.name, "responseKind": response_kind(s.kind), "verbs": s.verbs}))
                        .collect();
                    let mut resource = json!({
                        "resource": r.name,
                        "responseKind": response_kind(r.kind),
                        "scope": "Cluster",
                        "singularResource": r.singular,
                        "verbs": r.verbs,
                    });
                    for (key, list) in [("shortNames", r.short_names), ("categories", r.categories)] {
                        if !list.is_empty() {
                            resource[key] = json!(list);
                        }
                    }
                    if !subresources.is_empty() {
                        resource["subresources"] = Value::Array(subresources);
                    }
                    resource
                })
                .collect();
            json!({
                "metadata": {"name": g.group, "creationTimestamp": null},
                "versions": [{"version": g.version, "resources": resources, "freshness": "Current"}],
            })
        })
        .collect();
    let mut response = axum::Json(json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    }))
    .into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(AGGREGATED));
    // Caches keyed by URL alone would hand one form to a client asking for
    // the other.
    response
        .headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    response
}

/// `GET /api`: the legacy core group, which the coordinator does not
/// serve: no versions, or an aggregated list of no groups.
pub async fn core_versions(State(app): State<Arc<App>>, headers: HeaderMap) -> KubeResult {
    resolve_admin(&app, &headers)?;
    if wants_aggregated(&headers) {
        return Ok(aggregated(&[]));
    }
    Ok(axum::Json(json!({
        "kind": "APIVersions",
        "versions": [],
        "serverAddressByClientCIDRs": [],
    }))
    .into_response())
}

/// `GET /apis`: the groups, or (aggregated) the groups and their resources.
pub async fn groups(State(app): State<Arc<App>>, headers: HeaderMap) -> KubeResult {
    resolve_admin(&app, &headers)?;
    let served = served();
    if wants_aggregated(&headers) {
        return Ok(aggregated(&served));
    }
    let groups: Vec<Value> = served
        .iter()
        .map(|g| {
            let version =
                json!({"groupVersion": format!("{}/{}", g.group, g.version), "version": g.version});
            json!({"name": g.group, "versions": [version], "preferredVersion": version})
        })
        .collect();
    Ok(axum::Json(json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups,
    }))
    .into_response())
}

/// The `APIResourceList` of group `group`'s one version.
fn resource_list(group: &str) -> Response {
    let served = served();
    let g = served
        .iter()
        .find(|g| g.group == group)
        .expect("a served group");
    let mut resources = vec![];
    for r in &g.resources {
        resources.push(json!({
            "name": r.name,
            "singularName": r.singular,
            "namespaced": false,
            "kind": r.kind,
            "verbs": r.verbs,
            "shortNames": r.short_names,
            "categories": r.categories,
        }));
        for s in &r.subresources {
            resources.push(json!({
                "name": format!("{}/{}", r.name, s.name),
                "singularName": "",
                "namespaced": false,
                "kind": s.kind,
                "verbs": s.verbs,
            }));
        }
    }
    axum::Json(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{}/{}", g.group, g.version),
        "resources": resources,
    }))
    .into_response()
}

/// `GET /apis/drover.dev/v1alpha1`: its resources and their verbs.
pub async fn resources(State(app): State<Arc<App>>, headers: HeaderMap) -> KubeResult {
    resolve_admin(&app, &headers)?;
    Ok(resource_list(GROUP))
}

/// `GET /apis/authorization.k8s.io/v1`: the two reviews.
pub async fn authorization_resources(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
) -> KubeResult {
    resolve_admin(&app, &headers)?;
    Ok(resource_list(AUTHORIZATION_GROUP))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn aggregated_discovery_is_negotiated_as_the_api_server_does() {
        // kubectl 1.32's Accept.
        assert!(wants_aggregated(&accept(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
        )));
        assert!(wants_aggregated(&accept(
            "application/json; as=APIGroupDiscoveryList; v=v2; g=apidiscovery.k8s.io"
        )));
        assert!(!wants_aggregated(&accept("application/json")));
        assert!(!wants_aggregated(&accept(
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
        )));
        assert!(!wants_aggregated(&HeaderMap::new()));
    }

    async fn body(r: Response) -> Value {
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn both_forms_say_the_same() {
        let served = served();
        let agg = aggregated(&served);
        assert_eq!(agg.headers()[header::CONTENT_TYPE], AGGREGATED);
        let agg = body(agg).await;
        for g in &served {
            let legacy = body(resource_list(g.group)).await;
            let item = agg["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|i| i["metadata"]["name"] == g.group)
                .unwrap();
            let mut from_aggregated: Vec<(String, Value)> = vec![];
            for r in item["versions"][0]["resources"].as_array().unwrap() {
                let name = r["resource"].as_str().unwrap();
                from_aggregated.push((name.to_owned(), r["verbs"].clone()));
                for s in r["subresources"].as_array().into_iter().flatten() {
                    from_aggregated.push((
                        format!("{name}/{}", s["subresource"].as_str().unwrap()),
                        s["verbs"].clone(),
                    ));
                }
            }
            let from_legacy: Vec<(String, Value)> = legacy["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["name"].as_str().unwrap().to_owned(), r["verbs"].clone()))
                .collect();
            assert_eq!(from_aggregated, from_legacy, "{}", g.group);
        }
        let minted = &agg["items"][0]["versions"][0]["resources"][2]["subresources"][0];
        assert_eq!(minted["subresource"], "bootstrap", "{agg}");
        assert_eq!(minted["verbs"], json!(["create"]));
    }
}
