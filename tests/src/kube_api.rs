//! What real kubectl does to clusters through the coordinator's
//! Kubernetes-style API, as Argo CD and Flux would (they use the same
//! verbs: apply, server-side apply, dry runs, watch): shared by the test
//! on the embedded store (`--test e2e`) and the one on etcd (`--test ha`).

use std::path::{Path, PathBuf};

use crate::kube::kubectl;
use crate::{cluster_yaml, pool_selector, Coordinator};

/// Runs kubectl, returning its exit status, stdout and stderr.
fn kubectl_status(kubeconfig: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout", "10s"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("kubectl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl get cluster NAME -o jsonpath=PATH`.
fn field(kubeconfig: &Path, name: &str, path: &str) -> String {
    kubectl(
        kubeconfig,
        &["get", "cluster", name, "-o", &format!("jsonpath={path}")],
    )
    .unwrap_or_else(|e| panic!("cluster {name} {path}: {e}"))
}

/// Asserts kubectl finds no `kind` object `name`.
fn assert_gone(kubeconfig: &Path, kind: &str, name: &str) {
    let missing = kubectl(kubeconfig, &["get", kind, name]).unwrap_err();
    assert!(missing.contains("(NotFound)"), "{kind} {name}: {missing}");
}

/// A cluster `name` of one control plane and `workers` workers in pool
/// `default`, claiming machines no one has (it stays Pending), labelled
/// `team: web`.
pub fn web_cluster(name: &str, workers: u32) -> String {
    cluster_yaml(name, 1, workers, &pool_selector("nowhere")).replace(
        &format!("metadata:\n  name: {name}\n"),
        &format!("metadata:\n  name: {name}\n  labels:\n    team: web\n"),
    )
}

/// Writes a kubeconfig for `c` itself under `dir`, as the admin and as a
/// new viewer.
pub fn coordinator_kubeconfigs(c: &Coordinator, dir: &Path) -> (PathBuf, PathBuf) {
    let admin = dir.join("coordinator.kubeconfig");
    std::fs::write(&admin, c.cli_ok(&["kubeconfig", "--coordinator"])).unwrap();
    let viewer_token = c.create_admin_token("viewer");
    let text = std::fs::read_to_string(&admin).unwrap();
    assert!(text.contains(&c.admin_token), "{text}");
    let viewer = dir.join("viewer.kubeconfig");
    std::fs::write(&viewer, text.replace(&c.admin_token, &viewer_token)).unwrap();
    (admin, viewer)
}

/// kubectl creates, applies, patches, edits, labels, diffs, explains,
/// dry-runs and deletes cluster `name` on `c`, and a viewer may only read.
pub fn kubectl_manages_a_cluster(c: &Coordinator, dir: &Path, name: &str) {
    let (kc, viewer) = coordinator_kubeconfigs(c, dir);
    let file = |workers: u32, tag: &str| {
        let path = dir.join(format!("{name}-{tag}.yaml"));
        std::fs::write(&path, web_cluster(name, workers)).unwrap();
        path
    };
    let two = file(2, "two");
    let two = two.to_str().unwrap();

    // The server's version, as kubectl reads it.
    let version = kubectl(&kc, &["version", "-o", "json"]).unwrap();
    assert!(
        version.contains(r#""gitVersion": "v1.32.0+drover-"#),
        "{version}"
    );

    // Client-side apply: created, then unchanged (no write: the same
    // resourceVersion).
    let out = kubectl(&kc, &["apply", "-f", two]).unwrap();
    assert!(
        out.contains(&format!("cluster.drover.dev/{name} created")),
        "{out}"
    );
    let rv = field(&kc, name, "{.metadata.resourceVersion}");
    let out = kubectl(&kc, &["apply", "-f", two]).unwrap();
    assert!(out.contains("unchanged"), "{out}");
    assert_eq!(field(&kc, name, "{.metadata.resourceVersion}"), rv);
    let table = kubectl(&kc, &["get", "clusters", name]).unwrap();
    assert!(
        table.starts_with("NAME") && table.contains("PHASE"),
        "{table}"
    );
    // What drover sees is what kubectl wrote.
    let shown = c.cli_ok(&["get", "cluster", name, "-o", "yaml"]);
    assert!(shown.contains("replicas: 2"), "{shown}");
    // drover leaves managedFields out, as kubectl does.
    assert!(!shown.contains("managedFields"), "{shown}");

    // A merge patch, then a server-side apply that would take its field:
    // refused naming kubectl-patch, then forced.
    let out = kubectl(
        &kc,
        &[
            "patch",
            "cluster",
            name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"workerPools":[{"name":"default","replicas":3}]}}"#,
        ],
    )
    .unwrap();
    assert!(out.contains("patched"), "{out}");
    let four = file(4, "four");
    let four = four.to_str().unwrap();
    let refused = kubectl(&kc, &["apply", "--server-side", "-f", four]).unwrap_err();
    assert!(
        refused.contains(r#"conflict with "kubectl-patch""#)
            && refused.contains(r#".spec.workerPools[name="default"].replicas"#),
        "{refused}"
    );
    assert_eq!(field(&kc, name, "{.spec.workerPools[0].replicas}"), "3");
    kubectl(
        &kc,
        &["apply", "--server-side", "--force-conflicts", "-f", four],
    )
    .unwrap();
    assert_eq!(field(&kc, name, "{.spec.workerPools[0].replicas}"), "4");
    let managers = kubectl(
        &kc,
        &[
            "get",
            "cluster",
            name,
            "--show-managed-fields",
            "-o",
            "jsonpath={range .metadata.managedFields[*]}{.manager}/{.operation} {end}",
        ],
    )
    .unwrap();
    assert!(managers.contains("kubectl/Apply"), "{managers}");

    // diff shows the change a dry run would make, and makes none.
    let five = file(5, "five");
    let (code, diff, err) = kubectl_status(&kc, &["diff", "-f", five.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{diff}{err}");
    assert!(
        diff.contains("+    replicas: 5") && diff.contains("-    replicas: 4"),
        "{diff}"
    );
    assert_eq!(field(&kc, name, "{.spec.workerPools[0].replicas}"), "4");

    // explain reads the OpenAPI v3 schema.
    let explained = kubectl(&kc, &["explain", "clusters.spec.workerPools"]).unwrap();
    assert!(
        explained.contains("FIELD: workerPools") && explained.contains("replicas"),
        "{explained}"
    );

    // label and edit (EDITOR a script).
    kubectl(&kc, &["label", "cluster", name, "tier=gold"]).unwrap();
    let labelled = kubectl(&kc, &["get", "clusters", "-l", "tier=gold", "-o", "name"]).unwrap();
    assert_eq!(labelled.trim(), format!("cluster.drover.dev/{name}"));
    let editor = dir.join("editor.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nsed -i 's/replicas: 4/replicas: 6/' \"$1\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (code, out, err) = kubectl_status(
        &kc,
        &["edit", "cluster", name],
        &[("EDITOR", editor.to_str().unwrap()), ("KUBE_EDITOR", "")],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(field(&kc, name, "{.spec.workerPools[0].replicas}"), "6");

    // Unknown fields: kubectl validates strictly by default; the server
    // names the field, and nothing is created.
    let bogus = dir.join(format!("{name}-bogus.yaml"));
    std::fs::write(
        &bogus,
        web_cluster("bogus", 1).replace("  controlPlane:\n", "  bogusField: 1\n  controlPlane:\n"),
    )
    .unwrap();
    let refused = kubectl(&kc, &["apply", "-f", bogus.to_str().unwrap()]).unwrap_err();
    assert!(
        refused.contains(r#"unknown field "spec.bogusField""#),
        "{refused}"
    );
    // A server dry run creates nothing.
    let dry = dir.join(format!("{name}-dry.yaml"));
    std::fs::write(&dry, web_cluster("dry", 1)).unwrap();
    let out = kubectl(
        &kc,
        &["apply", "--dry-run=server", "-f", dry.to_str().unwrap()],
    )
    .unwrap();
    assert!(out.contains("(server dry run)"), "{out}");
    assert_gone(&kc, "cluster", "bogus");
    assert_gone(&kc, "cluster", "dry");

    // The status is the coordinator's.
    let refused = kubectl(
        &kc,
        &[
            "patch",
            "cluster",
            name,
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"phase":"Running"}}"#,
        ],
    )
    .unwrap_err();
    assert!(refused.contains("(MethodNotAllowed)"), "{refused}");

    // A viewer reads, may not write, and kubectl auth can-i says so.
    assert_eq!(
        kubectl(&kc, &["auth", "can-i", "create", "clusters"])
            .unwrap()
            .trim(),
        "yes"
    );
    assert_eq!(
        kubectl(&viewer, &["auth", "can-i", "list", "clusters"])
            .unwrap()
            .trim(),
        "yes"
    );
    let (code, out, _) = kubectl_status(&viewer, &["auth", "can-i", "create", "clusters"], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("no - the viewer role"), "{out}");
    let refused = kubectl(&viewer, &["apply", "-f", five.to_str().unwrap()]).unwrap_err();
    assert!(
        refused.contains("(Forbidden)") && refused.contains("viewer"),
        "{refused}"
    );
    assert_eq!(field(&kc, name, "{.spec.workerPools[0].replicas}"), "6");

    // Registration tokens and Secrets are read as drover shows them; a
    // Secret's values never, and not by a viewer at all.
    c.token("edge", "env=edge", 3, "1h", &dir.join("edge-token.yaml"));
    let tokens = kubectl(&kc, &["get", "registrationtokens"]).unwrap();
    assert!(
        tokens.starts_with("NAME") && tokens.contains("edge"),
        "{tokens}"
    );
    assert!(kubectl(&viewer, &["get", "rt", "-o", "name"])
        .unwrap()
        .contains("registrationtoken.drover.dev/rt-"));
    // A Secret: server-side applied (its values never in any answer,
    // a conflicting value refused naming its manager), never client-side
    // applied (the last-applied annotation would hold its values).
    let secret = dir.join("secret.yaml");
    let secret_doc = |value: &str| {
        format!("apiVersion: drover.dev/v1alpha1\nkind: Secret\nmetadata:\n  name: registry\nstringData:\n  auth.json: {value}\n")
    };
    std::fs::write(&secret, secret_doc("not-shown-anywhere")).unwrap();
    let secret = secret.to_str().unwrap();
    let refused = kubectl(&kc, &["apply", "-f", secret]).unwrap_err();
    assert!(
        refused.contains("kubectl apply --server-side") && !refused.contains("not-shown-anywhere"),
        "{refused}"
    );
    let out = kubectl(
        &kc,
        &[
            "apply",
            "--server-side",
            "--field-manager=platform",
            "-f",
            secret,
            "-o",
            "yaml",
        ],
    )
    .unwrap();
    assert!(
        !out.contains("not-shown-anywhere") && out.contains("auth.json"),
        "{out}"
    );
    let shown = kubectl(&kc, &["get", "secret", "registry", "-o", "yaml"]).unwrap();
    assert!(
        shown.contains("auth.json") && !shown.contains("not-shown-anywhere"),
        "{shown}"
    );
    // drover reads what kubectl wrote: one key, its size.
    let described = c.cli_ok(&["get", "secrets"]);
    assert!(described.contains("registry"), "{described}");
    kubectl(
        &kc,
        &[
            "patch",
            "secret",
            "registry",
            "--type",
            "merge",
            "-p",
            r#"{"stringData":{"auth.json":"changed-by-hand"}}"#,
        ],
    )
    .unwrap();
    std::fs::write(dir.join("secret.yaml"), secret_doc("another-value")).unwrap();
    let refused = kubectl(
        &kc,
        &[
            "apply",
            "--server-side",
            "--field-manager=platform",
            "-f",
            secret,
        ],
    )
    .unwrap_err();
    assert!(
        refused.contains(r#"conflict with "kubectl-patch""#) && refused.contains(".data.auth.json"),
        "{refused}"
    );
    assert!(
        !refused.contains("changed-by-hand") && !refused.contains("another-value"),
        "{refused}"
    );
    kubectl(&kc, &["delete", "secret", "registry"]).unwrap();
    assert_gone(&kc, "secret", "registry");
    let refused = kubectl(&viewer, &["get", "secrets"]).unwrap_err();
    assert!(refused.contains("(Forbidden)"), "{refused}");

    // delete --wait returns once the cluster is gone.
    let out = kubectl(
        &kc,
        &[
            "delete",
            "cluster",
            name,
            "--wait",
            "--timeout=120s",
            "--request-timeout=0",
        ],
    )
    .unwrap();
    assert!(out.contains("deleted"), "{out}");
    assert_gone(&kc, "cluster", name);
}

/// A watch from a `resourceVersion` given before `c` restarted replays
/// what changed since, deletions included, instead of `410 Gone`.
pub fn a_watch_resumes_after_a_restart(c: &mut Coordinator, dir: &Path) {
    let (kc, _) = coordinator_kubeconfigs(c, dir);
    let file = dir.join("before.yaml");
    std::fs::write(&file, web_cluster("before", 1)).unwrap();
    kubectl(&kc, &["apply", "-f", file.to_str().unwrap()]).unwrap();
    let listed: serde_json::Value = serde_json::from_str(
        &kubectl(&kc, &["get", "--raw", "/apis/drover.dev/v1alpha1/clusters"]).unwrap(),
    )
    .unwrap();
    let rv = listed["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_else(|| panic!("{listed}"))
        .to_owned();
    let file = dir.join("after.yaml");
    std::fs::write(&file, web_cluster("after", 1)).unwrap();
    kubectl(&kc, &["apply", "-f", file.to_str().unwrap()]).unwrap();
    kubectl(
        &kc,
        &["delete", "cluster", "before", "--wait", "--timeout=60s"],
    )
    .unwrap();
    c.restart();
    let replay = kubectl(
        &kc,
        &[
            "get",
            "--raw",
            &format!("/apis/drover.dev/v1alpha1/clusters?watch=true&resourceVersion={rv}&timeoutSeconds=2"),
        ],
    )
    .unwrap();
    let events: Vec<(String, String)> = replay
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|e| {
            (
                e["type"].as_str().unwrap_or_default().to_owned(),
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert!(
        events.contains(&("ADDED".into(), "after".into()))
            && events.contains(&("DELETED".into(), "before".into())),
        "{replay}"
    );
    assert!(!replay.contains("Expired"), "{replay}");
}

/// A RegistrationToken document for kubectl: pool `pool`, `uses` uses,
/// living `ttl` from now; named `name`, or generated from `pool-`.
fn token_yaml(name: Option<&str>, pool: &str, uses: u32, ttl: time::Duration) -> String {
    let expires = (time::OffsetDateTime::now_utc() + ttl)
        .replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let naming = match name {
        Some(n) => format!("name: {n}"),
        None => format!("generateName: {pool}-"),
    };
    format!(
        "apiVersion: drover.dev/v1alpha1\nkind: RegistrationToken\nmetadata:\n  {naming}\n  labels:\n    site: lab\nspec:\n  pool: {pool}\n  labels:\n    rack: r7\n  maxUses: {uses}\n  expiresAt: \"{expires}\"\n"
    )
}

/// `kubectl create --raw` of token `name`'s bootstrap subresource, as
/// `kubeconfig` says: the bootstrap document, written to `file`.
fn mint(
    kubeconfig: &Path,
    dir: &Path,
    name: &str,
    file: &Path,
) -> Result<serde_json::Value, String> {
    let empty = dir.join("bootstrap-request.json");
    std::fs::write(&empty, "{}").unwrap();
    let out = kubectl(
        kubeconfig,
        &[
            "create",
            "--raw",
            &format!("/apis/drover.dev/v1alpha1/registrationtokens/{name}/bootstrap"),
            "-f",
            empty.to_str().unwrap(),
        ],
    )?;
    std::fs::write(file, &out).unwrap();
    Ok(serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}")))
}

/// Waits for `agent` to exit, returning its exit code.
fn exit_code(agent: &mut crate::Agent) -> i32 {
    crate::wait_for(
        "the agent to exit",
        std::time::Duration::from_secs(30),
        || {
            agent
                .try_exit()
                .map(|s| s.code().unwrap_or(-1))
                .ok_or_else(|| agent.log())
        },
    )
}

/// kubectl makes registration tokens (named, or from `generateName`),
/// mints their tickets through the `bootstrap` subresource (which a real
/// agent registers with), relabels, revokes and deletes them; their spec
/// is immutable, a revoked token stays revoked, and a ticket of a deleted
/// token does not work for one made again under its name.
pub fn kubectl_manages_registration_tokens(c: &Coordinator, dir: &Path) {
    let (kc, viewer) = coordinator_kubeconfigs(c, dir);
    let hour = time::Duration::hours(1);
    let file = |tag: &str, text: String| {
        let path = dir.join(format!("token-{tag}.yaml"));
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };

    // Discovery in one request: kubectl takes the aggregated form of
    // `/api` and `/apis` (apidiscovery.k8s.io/v2) and reads no group
    // version's list; the bootstrap subresource is in it.
    let cache = dir.join("discovery-cache");
    let (code, out, log) = kubectl_status(
        &kc,
        &[
            "api-resources",
            "-o",
            "wide",
            "--cache-dir",
            cache.to_str().unwrap(),
            "-v=6",
        ],
        &[],
    );
    assert_eq!(code, 0, "{log}");
    assert!(
        out.lines().any(|l| l.starts_with("registrationtokens")
            && l.contains("create,delete,get,list,patch,update,watch")),
        "{out}"
    );
    let requests: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split("] GET ").nth(1))
        .collect();
    assert!(
        requests.len() == 2
            && requests[0].contains("/api?")
            && requests[1].contains("/apis?")
            && requests.iter().all(|r| r.contains(" 200 OK")),
        "{log}"
    );
    let (_, subresources, _) =
        kubectl_status(&kc, &["get", "--raw", "/apis/drover.dev/v1alpha1"], &[]);
    assert!(
        subresources.contains(r#""name":"registrationtokens/bootstrap""#),
        "{subresources}"
    );

    // A token with a generated name.
    let made = kubectl(
        &kc,
        &[
            "create",
            "-f",
            &file("rack7", token_yaml(None, "rack7", 2, hour)),
            "-o",
            "name",
        ],
    )
    .unwrap();
    let name = made
        .trim()
        .strip_prefix("registrationtoken.drover.dev/")
        .unwrap_or_else(|| panic!("{made}"))
        .to_owned();
    assert!(
        name.starts_with("rack7-") && name.len() == "rack7-".len() + 5,
        "{name}"
    );

    // A bad one names each field, and stores nothing.
    let bad = token_yaml(Some("bad"), "Rack_7", 0, -hour);
    let refused = kubectl(&kc, &["create", "-f", &file("bad", bad)]).unwrap_err();
    for field in ["spec.pool", "spec.maxUses", "spec.expiresAt"] {
        assert!(refused.contains(field), "{field}: {refused}");
    }
    assert_gone(&kc, "rt", "bad");

    // Its ticket, minted by writers only; a real agent registers with it,
    // into the token's pool with its labels.
    assert_eq!(
        kubectl(
            &kc,
            &[
                "auth",
                "can-i",
                "create",
                "registrationtokens",
                "--subresource=bootstrap"
            ]
        )
        .unwrap()
        .trim(),
        "yes"
    );
    let (code, out, _) = kubectl_status(
        &viewer,
        &[
            "auth",
            "can-i",
            "create",
            "registrationtokens",
            "--subresource=bootstrap",
        ],
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("no - the viewer role"), "{out}");
    let boot = dir.join("rack7-bootstrap.json");
    let refused = mint(&viewer, dir, &name, &boot).unwrap_err();
    assert!(
        refused.contains("Forbidden") || refused.contains("forbidden"),
        "{refused}"
    );
    let doc = mint(&kc, dir, &name, &boot).unwrap();
    assert_eq!(doc["kind"], "BootstrapConfig", "{doc}");
    assert!(
        doc["ticket"].as_str().is_some_and(|t| t.len() > 40),
        "{doc}"
    );
    let agent = crate::Agent::start(&dir.join("rack7-machine"), "rack7-machine", &boot);
    let machine = crate::wait_for(
        "the machine to register",
        std::time::Duration::from_secs(60),
        || {
            c.machines()
                .into_iter()
                .find(|m| m["metadata"]["labels"]["drover.dev/pool"] == "rack7")
                .ok_or_else(|| agent.log())
        },
    );
    assert_eq!(machine["metadata"]["labels"]["rack"], "r7", "{machine}");
    let uses =
        |name: &str| kubectl(&kc, &["get", "rt", name, "-o", "jsonpath={.status.uses}"]).unwrap();
    assert_eq!(uses(&name), "1");

    // The spec is fixed; labels are not; a revoked token stays revoked
    // and mints nothing.
    let refused = kubectl(
        &kc,
        &[
            "patch",
            "rt",
            &name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"maxUses":50}}"#,
        ],
    )
    .unwrap_err();
    assert!(
        refused.contains("spec.maxUses") && refused.contains("immutable"),
        "{refused}"
    );
    kubectl(&kc, &["label", "rt", &name, "tier=edge"]).unwrap();
    kubectl(
        &kc,
        &[
            "patch",
            "rt",
            &name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"revoked":true}}"#,
        ],
    )
    .unwrap();
    assert_eq!(
        kubectl(
            &kc,
            &[
                "get",
                "rt",
                "-l",
                "tier=edge",
                "-o",
                "jsonpath={.items[0].spec.revoked}"
            ]
        )
        .unwrap(),
        "true"
    );
    let refused = kubectl(
        &kc,
        &[
            "patch",
            "rt",
            &name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"revoked":false}}"#,
        ],
    )
    .unwrap_err();
    assert!(refused.contains("stays revoked"), "{refused}");
    let refused = mint(&kc, dir, &name, &dir.join("unused.json")).unwrap_err();
    assert!(refused.contains("revoked"), "{refused}");
    let mut late = crate::Agent::start(&dir.join("rack7-late"), "rack7-late", &boot);
    assert_eq!(exit_code(&mut late), 2);
    assert!(late.log().contains("revoked"), "{}", late.log());
    assert_eq!(uses(&name), "1");

    // Server-side applied under a fixed name: a second apply changes
    // nothing. Deleted, then made again under that name: the first
    // one's ticket does not work for the second.
    let applied = file("lab", token_yaml(Some("lab"), "lab", 1, hour));
    let apply = |path: &str| {
        kubectl(
            &kc,
            &[
                "apply",
                "--server-side",
                "--field-manager=platform",
                "-f",
                path,
            ],
        )
        .unwrap()
    };
    apply(&applied);
    let rv = kubectl(
        &kc,
        &[
            "get",
            "rt",
            "lab",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
    )
    .unwrap();
    let again = apply(&applied);
    assert!(again.contains("serverside-applied"), "{again}");
    assert_eq!(
        kubectl(
            &kc,
            &[
                "get",
                "rt",
                "lab",
                "-o",
                "jsonpath={.metadata.resourceVersion}"
            ]
        )
        .unwrap(),
        rv
    );
    let old_boot = dir.join("lab-bootstrap.json");
    mint(&kc, dir, "lab", &old_boot).unwrap();
    let out = kubectl(&kc, &["delete", "rt", "lab", "--wait", "--timeout=30s"]).unwrap();
    assert!(out.contains("deleted"), "{out}");
    assert_gone(&kc, "rt", "lab");
    apply(&applied);
    let mut stale = crate::Agent::start(&dir.join("lab-stale"), "lab-stale", &old_boot);
    assert_eq!(exit_code(&mut stale), 2);
    assert!(
        stale.log().contains("deleted and made again"),
        "{}",
        stale.log()
    );
    assert_eq!(
        kubectl(&kc, &["get", "rt", "lab", "-o", "jsonpath={.status.uses}"]).unwrap(),
        "0"
    );
    kubectl(&kc, &["delete", "rt", "lab", &name]).unwrap();
    assert_gone(&kc, "rt", "lab");
    assert_gone(&kc, "rt", &name);
}

/// GitOps and the autoscaler do not fight over an autoscaled pool: a
/// manifest that leaves `replicas` out, applied by kubectl (client- and
/// server-side, as Argo CD and Flux apply), keeps whatever count the
/// autoscaler set; a new pool starts at its minimum; a count outside the
/// range is refused, naming the range.
pub fn gitops_leaves_an_autoscaled_pools_count_alone(c: &Coordinator, dir: &Path) {
    let (kc, _) = coordinator_kubeconfigs(c, dir);
    let doc = |range: &str, replicas: &str| {
        web_cluster("scaled", 1).replace(
            "      replicas: 1\n",
            &format!("      autoscaling: {{{range}}}\n{replicas}"),
        )
    };
    let manifest = dir.join("scaled.yaml");
    let write = |text: String| {
        std::fs::write(&manifest, text).unwrap();
        manifest.to_str().unwrap().to_owned()
    };
    let replicas = || field(&kc, "scaled", "{.spec.workerPools[0].replicas}");
    let git = write(doc("minReplicas: 2, maxReplicas: 6", ""));
    kubectl(
        &kc,
        &[
            "apply",
            "--server-side",
            "--field-manager=argocd",
            "-f",
            &git,
        ],
    )
    .unwrap();
    assert_eq!(
        replicas(),
        "2",
        "a new autoscaled pool starts at its minimum"
    );
    // `drover describe` shows the range once the reconciler has counted
    // the pool.
    crate::wait_for(
        "describe to show the autoscaled pool",
        std::time::Duration::from_secs(30),
        || {
            let described = c.cli_ok(&["describe", "cluster", "scaled"]);
            described
                .contains("├─ default: 0/2 running, 0 assigned, autoscaled 2..6")
                .then_some(())
                .ok_or(described)
        },
    );
    // The autoscaler's write (as the coordinator's gRPC server makes it).
    c.cli_ok(&["scale", "scaled", "--pool", "default", "--replicas", "5"]);
    assert_eq!(replicas(), "5");
    // GitOps re-applies its manifest, server-side and client-side: the
    // count stays the autoscaler's.
    let out = kubectl(
        &kc,
        &[
            "apply",
            "--server-side",
            "--field-manager=argocd",
            "-f",
            &git,
        ],
    )
    .unwrap();
    assert!(out.contains("serverside-applied"), "{out}");
    assert_eq!(replicas(), "5");
    let diff = kubectl_status(
        &kc,
        &[
            "diff",
            "--server-side",
            "--field-manager=argocd",
            "-f",
            &git,
        ],
        &[],
    );
    assert_eq!(diff.0, 0, "no drift to show: {diff:?}");
    // A narrower range brings the count into it.
    let narrower = write(doc("minReplicas: 2, maxReplicas: 4", ""));
    kubectl(
        &kc,
        &[
            "apply",
            "--server-side",
            "--field-manager=argocd",
            "-f",
            &narrower,
        ],
    )
    .unwrap();
    assert_eq!(replicas(), "4");
    // The count has another manager now: GitOps setting it is a conflict
    // naming it; forced, a count outside the range is refused, naming
    // the range.
    let outside = write(doc("minReplicas: 2, maxReplicas: 4", "      replicas: 9\n"));
    let apply_outside = |force: &[&str]| {
        let mut args = vec!["apply", "--server-side", "--field-manager=argocd"];
        args.extend_from_slice(force);
        args.extend_from_slice(&["-f", &outside]);
        kubectl(&kc, &args).unwrap_err()
    };
    let refused = apply_outside(&[]);
    assert!(
        refused.contains(r#"conflict with "drover": .spec.workerPools[name="default"].replicas"#),
        "{refused}"
    );
    let refused = apply_outside(&["--force-conflicts"]);
    assert!(
        refused.contains("spec.workerPools[0].replicas")
            && refused.contains("within autoscaling's 2..4"),
        "{refused}"
    );
    assert_eq!(replicas(), "4");
    let refused = c.cli(&["scale", "scaled", "--pool", "default", "--replicas", "7"]);
    assert!(!refused.status.success());
    // Without autoscaling, replicas is required again.
    let plain = write(web_cluster("scaled", 1).replace("      replicas: 1\n", ""));
    let refused = kubectl(&kc, &["replace", "-f", &plain]).unwrap_err();
    assert!(
        refused.contains("unless the pool is autoscaled"),
        "{refused}"
    );
    kubectl(
        &kc,
        &["delete", "cluster", "scaled", "--wait", "--timeout=60s"],
    )
    .unwrap();
}
