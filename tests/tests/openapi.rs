//! The OpenAPI document a real coordinator serves. `scripts/schemathesis`
//! fuzzes the API against it; this checks it is there, public, and complete.

use drover_tests::*;

/// Every operation of the router, as `METHOD path`.
const OPERATIONS: &[&str] = &[
    "GET /healthz",
    "GET /livez",
    "GET /readyz",
    "GET /metrics",
    "GET /openapi.json",
    "GET /v1/clusters",
    "GET /v1/clusters/{name}",
    "PUT /v1/clusters/{name}",
    "DELETE /v1/clusters/{name}",
    "POST /v1/clusters/{name}/kubeconfig",
    "POST /v1/clusters/{name}/autoscaler-credentials",
    "POST /v1/clusters/{name}/rollout/resume",
    "POST /v1/clusters/{name}/snapshots",
    "POST /v1/clusters/{name}/restore",
    "GET /v1/snapshots",
    "GET /v1/machines",
    "GET /v1/machines/{name}",
    "DELETE /v1/machines/{name}",
    "POST /v1/machines/{name}/revoke",
    "PUT /v1/machines/{name}/bmc",
    "DELETE /v1/machines/{name}/bmc",
    "POST /v1/machines/{name}/power",
    "GET /v1/registrationtokens",
    "POST /v1/registrationtokens",
    "PUT /v1/registrationtokens/{name}",
    "DELETE /v1/registrationtokens/{name}",
    "POST /v1/machine/register",
    "POST /v1/machine/heartbeat",
    "POST /v1/machine/inventory",
    "GET /v1/machine/config",
    "POST /v1/machine/certificate",
    "GET /v1/machine/snapshots/{name}",
    "GET /v1/machine/snapshots/{name}/data",
    "PUT /v1/machine/snapshots/{name}/data",
    "POST /v1/machine/snapshots/{name}",
    "GET /v1/admintokens",
    "POST /v1/admintokens",
    "POST /v1/backup",
    "DELETE /v1/admintokens/{id}",
    "GET /v1/keys",
    "POST /v1/keys/rotate",
    "GET /v1/audit",
    "GET /v1/status",
    "GET /v1/coordinators",
    "GET /v1/secrets",
    "GET /v1/secrets/{name}",
    "PUT /v1/secrets/{name}",
    "DELETE /v1/secrets/{name}",
];

#[test]
fn the_openapi_document_is_public_and_covers_every_operation() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    let answer = c.api(None).send("GET", "/openapi.json", None, None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.content_type.starts_with("application/json"),
        "{}",
        answer.content_type
    );
    let doc = answer.json();
    assert_eq!(doc["openapi"], "3.1.0");

    let mut documented = vec![];
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let name = format!("{} {path}", method.to_uppercase());
            let responses = op["responses"].as_object().unwrap();
            let security = op.get("security").map(|s| s.to_string());
            match security.as_deref() {
                // Authenticated operations: missing credentials are a 401 problem.
                Some(r#"[{"adminToken":[]}]"#) | Some(r#"[{"machineCertificate":[]}]"#) => {
                    assert_eq!(
                        responses["401"]["$ref"]
                            .as_str()
                            .map(|r| r.ends_with("Unauthorized")),
                        Some(true),
                        "{name}: {op:#}"
                    );
                }
                Some("[{}]") => assert_eq!(name, "POST /v1/machine/register"),
                None => assert!(
                    [
                        "GET /healthz",
                        "GET /livez",
                        "GET /readyz",
                        "GET /openapi.json"
                    ]
                    .contains(&name.as_str()),
                    "{name} is unauthenticated"
                ),
                Some(other) => panic!("{name}: unexpected security {other}"),
            }
            // Every `{param}` in the path is declared.
            for param in path.split('{').skip(1).filter_map(|p| p.split('}').next()) {
                assert!(
                    op["parameters"].as_array().is_some_and(|ps| ps
                        .iter()
                        .any(|p| p["name"] == param && p["in"] == "path")),
                    "{name}: path parameter {param} is not declared"
                );
            }
            documented.push(name);
        }
    }
    documented.sort();
    let mut expected: Vec<String> = OPERATIONS.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(documented, expected);

    // Problems are documented with their media type and schema.
    let unauthorized = &doc["components"]["responses"]["Unauthorized"];
    assert_eq!(
        unauthorized["content"]["application/problem+json"]["schema"]["$ref"],
        "#/components/schemas/Problem"
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["adminToken"]["scheme"],
        "bearer"
    );
}
