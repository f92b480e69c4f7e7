//! The adversarial suite: real coordinators and agents over real TLS,
//! attacked the ways SECURITY.md lists.

use std::path::Path;
use std::time::Duration;

use drover_tests::docker::*;
use drover_tests::*;

const BOOT: Duration = Duration::from_secs(120);

fn apply(c: &Coordinator, dir: &Path, yaml: &str) {
    let f = dir.join("cluster.yaml");
    std::fs::write(&f, yaml).unwrap();
    c.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
fn viewer_tokens_read_but_change_nothing_and_are_audited() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    apply(&c, tmp.path(), &pool_cluster_yaml("guarded", 1, 0, "x"));
    let viewer = c
        .cli_ok(&["admin-token", "create", "--role", "viewer"])
        .trim()
        .to_owned();
    assert!(viewer.starts_with("drv_"), "{viewer}");
    let api = c.api(None);
    assert_eq!(
        api.send("GET", "/v1/clusters", Some(&viewer), None).status,
        200
    );
    let before = c.cluster("guarded").unwrap();

    let yaml = pool_cluster_yaml("guarded", 3, 0, "x").into_bytes();
    let attempts: Vec<Answer> = vec![
        api.send(
            "PUT",
            "/v1/clusters/guarded",
            Some(&viewer),
            Some(("application/yaml", yaml)),
        ),
        api.send("DELETE", "/v1/clusters/guarded", Some(&viewer), None),
        api.json(
            "POST",
            "/v1/registrationtokens",
            Some(&viewer),
            &serde_json::json!({"pool": "p", "ttlSeconds": 60, "maxUses": 1}),
        ),
        api.json(
            "POST",
            "/v1/clusters/guarded/kubeconfig",
            Some(&viewer),
            &serde_json::json!({}),
        ),
        api.json(
            "POST",
            "/v1/admintokens",
            Some(&viewer),
            &serde_json::json!({"role": "admin"}),
        ),
        api.json(
            "POST",
            "/v1/keys/rotate",
            Some(&viewer),
            &serde_json::json!({}),
        ),
    ];
    for a in &attempts {
        a.assert_problem(403, "viewer role");
    }
    let after = c.cluster("guarded").unwrap();
    assert_eq!(before["spec"], after["spec"]);
    assert!(after["metadata"]["deletionTimestamp"].is_null());

    // No token, or a made-up one: 401 with what to do.
    api.send("GET", "/v1/clusters", None, None)
        .assert_problem(401, "DROVER_TOKEN");
    api.send("GET", "/v1/clusters", Some("drv_00000000_forged"), None)
        .assert_problem(401, "not valid");

    // Every refused change is in the audit log, with who and the outcome.
    let audit: Vec<serde_json::Value> =
        serde_json::from_str(&c.cli_ok(&["audit", "--limit", "100", "-o", "json"])).unwrap();
    let refused = audit
        .iter()
        .filter(|e| e["status"] == 403 && e["actor"].as_str().unwrap_or("").contains("viewer"))
        .count();
    assert_eq!(refused, attempts.len(), "{audit:#?}");
    assert!(audit.iter().any(|e| e["method"] == "PUT"
        && e["status"] == 201
        && e["actor"].as_str().unwrap().contains("admin")));
}

#[test]
fn oversized_and_malformed_bodies_are_refused_with_problems() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    let api = c.api(None);
    let token = c.admin_token.clone();
    // Refused from the announced length, before the body is read.
    api.send_announced(
        "POST",
        "/v1/machine/register",
        2 * 1024 * 1024,
        b"{\"ticket\":\"",
    )
    .assert_problem(413, "");
    api.send_announced(
        "PUT",
        "/v1/clusters/big",
        64 * 1024 * 1024,
        b"kind: Cluster\n",
    )
    .assert_problem(413, "");
    api.send(
        "POST",
        "/v1/machine/register",
        None,
        Some(("application/json", b"{not json".to_vec())),
    )
    .assert_problem(400, "");
    api.json(
        "POST",
        "/v1/machine/register",
        None,
        &serde_json::json!({"ticket": "dt1.x.y", "csrPem": "", "facts": {}}),
    )
    .assert_problem(422, "missing field `hostname`");
    api.json(
        "POST",
        "/v1/machine/register",
        None,
        &serde_json::json!({"ticket": "dt1.x.y", "csrPem": "", "facts": {}, "extra": 1}),
    )
    .assert_problem(422, "unknown field");
    api.send(
        "PUT",
        "/v1/clusters/bad",
        Some(&token),
        Some(("application/yaml", b"kind: [".to_vec())),
    )
    .assert_problem(422, "document");
    api.json(
        "POST",
        "/v1/registrationtokens",
        Some(&token),
        &serde_json::json!({"pool": "../etc", "ttlSeconds": 0, "maxUses": 0}),
    )
    .assert_problem(422, "pool");
    api.send("GET", "/v1/machines/..%2F..%2Fetc", Some(&token), None)
        .assert_problem(404, "");
    // Nothing was stored by any of it.
    assert!(c.machines().is_empty());
    assert_eq!(c.cli_ok(&["get", "clusters"]).lines().count(), 1);
    assert!(c.cli_ok(&["token", "list"]).lines().count() == 1);
}

#[test]
fn machines_see_only_their_own_config_and_workers_get_no_ca_key() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    let boot = tmp.path().join("boot.yaml");
    c.token("default", "env=sec", 2, "1h", &boot);
    let agents = [
        Agent::start(&tmp.path().join("a"), "a", &boot),
        Agent::start(&tmp.path().join("b"), "b", &boot),
    ];
    wait_for("2 machines", BOOT, || {
        if c.machines().len() == 2 {
            Ok(())
        } else {
            Err("waiting".into())
        }
    });
    apply(&c, tmp.path(), &pool_cluster_yaml("sec", 1, 1, "sec"));
    c.wait_cluster_phase("sec", "Running", BOOT);
    let ms = c.machines();
    let role_of = |host: &str| {
        ms.iter()
            .find(|m| m["status"]["hostname"] == host)
            .map(|m| m["spec"]["assignment"]["role"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let (cp, worker) = if role_of("a") == "init" {
        (&agents[0], &agents[1])
    } else {
        (&agents[1], &agents[0])
    };
    let id = |a: &Agent| {
        let s = a.state();
        (
            s["certificatePem"].as_str().unwrap().to_owned(),
            s["keyPem"].as_str().unwrap().to_owned(),
            s["machineUid"].as_str().unwrap().to_owned(),
        )
    };
    let (wc, wk, wuid) = id(worker);
    let (cc, ck, cuid) = id(cp);
    let bundle = |cert: &str, key: &str, path: &str| {
        let a = c.api(Some((cert, key))).send("GET", path, None, None);
        assert_eq!(a.status, 200, "{a:?}");
        let payload: serde_json::Value =
            serde_json::from_str(a.json()["payload"].as_str().unwrap()).unwrap();
        payload
    };
    // The worker gets its own bundle, whatever it asks for, and no CA file.
    let cp_name = ms
        .iter()
        .find(|m| m["metadata"]["uid"] == cuid.as_str())
        .unwrap()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let wb = bundle(&wc, &wk, &format!("/v1/machine/config?machine={cp_name}"));
    assert_eq!(wb["machineUid"], wuid.as_str());
    let paths: Vec<&str> = wb["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        vec!["/etc/drover/kubeadm.yaml"],
        "a worker receives no CA file"
    );
    assert!(!wb.to_string().contains("PRIVATE KEY"));
    // The control plane gets the shared CA set; only it.
    let cb = bundle(&cc, &ck, "/v1/machine/config");
    assert_eq!(cb["machineUid"], cuid.as_str());
    assert!(cb.to_string().contains("/etc/kubernetes/pki/ca.key"));

    // Without a client certificate, or with one from another CA: refused.
    c.api(None)
        .send("GET", "/v1/machine/config", None, None)
        .assert_problem(401, "client certificate");
    let rogue = drover_common::pki::CertificateAuthority::generate("rogue").unwrap();
    let leaf = rogue
        .issue(&drover_common::pki::LeafSpec {
            common_name: cp_name.clone(),
            organizations: vec!["drover:machines".into()],
            dns_names: vec![],
            ip_addresses: vec![],
            usage: drover_common::pki::LeafUsage::Client,
            validity: time::Duration::hours(1),
        })
        .unwrap();
    let a = c
        .api(Some((&leaf.cert_pem, leaf.key_pem.as_deref().unwrap())))
        .send("GET", "/v1/machine/config", None, None);
    assert!(
        a.status == 0 || a.status == 401,
        "a certificate from another CA must not work: {a:?}"
    );
    assert!(a.status != 200);
}

#[test]
fn an_agent_refuses_a_coordinator_with_another_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let real = Coordinator::start(&tmp.path().join("real"), CoordinatorOptions::default());
    let impostor = Coordinator::start(&tmp.path().join("impostor"), CoordinatorOptions::default());
    let boot = tmp.path().join("boot.yaml");
    real.token("default", "env=x", 1, "1h", &boot);
    let text = std::fs::read_to_string(&boot).unwrap();
    let diverted = text.replace(&real.url(), &impostor.url());
    assert_ne!(text, diverted);
    let f = tmp.path().join("diverted.yaml");
    std::fs::write(&f, diverted).unwrap();
    let mut a = Agent::start(&tmp.path().join("m"), "m", &f);
    let code = wait_for("the agent to give up", Duration::from_secs(30), || {
        a.try_exit()
            .map(|s| s.code().unwrap_or(-1))
            .ok_or_else(|| a.log())
    });
    assert_eq!(code, 2);
    let log = a.log();
    assert!(log.contains("does not match the pinned"), "{log}");
    assert!(impostor.machines().is_empty() && real.machines().is_empty());
}

#[test]
fn a_store_copied_without_its_key_is_refused_and_rotation_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    apply(&c, tmp.path(), &pool_cluster_yaml("vault", 1, 0, "x"));
    wait_for("the cluster PKI", BOOT, || {
        let out = c.cli_ok(&["get", "clusters", "vault", "-o", "json"]);
        if out.contains("\"pools\"") {
            Ok(())
        } else {
            Err(out)
        }
    });
    c.kill();
    let data = tmp.path().join("data");
    // No CA key is readable in the store file.
    let db = std::fs::read(data.join("drover.db")).unwrap();
    let wal = std::fs::read(data.join("drover.db-wal")).unwrap_or_default();
    for bytes in [&db, &wal] {
        assert!(
            !String::from_utf8_lossy(bytes).contains("PRIVATE KEY"),
            "a private key is stored in the clear"
        );
    }

    // The store on another host, without the key.
    let stolen = tmp.path().join("stolen");
    std::fs::create_dir_all(&stolen).unwrap();
    for f in ["drover.db", "drover.db-wal", "drover.db-shm"] {
        if data.join(f).exists() {
            std::fs::copy(data.join(f), stolen.join(f)).unwrap();
        }
    }
    let serve = |dir: &Path, extra: &[&str]| {
        std::process::Command::new(bin("drover"))
            .args(["serve", "--data-dir"])
            .arg(dir)
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .args(extra)
            .env("DROVER_CONFIG", tmp.path().join("unused.yaml"))
            .env_remove("DROVER_ENCRYPTION_KEY")
            .output()
            .unwrap()
    };
    let out = serve(&stolen, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("encryption key file") && err.contains("does not exist"),
        "{err}"
    );
    // With some other key: refused, naming the key id it needs.
    let wrong = tmp.path().join("wrong.key");
    std::fs::write(
        &wrong,
        format!("{}\n", b64("0123456789abcdef0123456789abcdef")),
    )
    .unwrap();
    let out = serve(&stolen, &["--encryption-key-file", wrong.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not in the keyring"), "{err}");

    // Back home: rotate while serving; the old key alone no longer opens it.
    let old_key = std::fs::read_to_string(data.join("encryption.key")).unwrap();
    c.restart();
    let before = c.cli_ok(&["keys", "list"]);
    let rotated = c.cli_ok(&["keys", "rotate"]);
    assert!(rotated.contains("re-encrypted"), "{rotated}");
    let after = c.cli_ok(&["keys", "list"]);
    assert_ne!(before, after);
    assert_eq!(after.lines().count(), 1, "the old key is retired: {after}");
    let new_key = std::fs::read_to_string(data.join("encryption.key")).unwrap();
    assert_ne!(old_key, new_key);
    c.cli_ok(&["get", "clusters", "vault"]);
    c.restart();
    c.cli_ok(&["get", "clusters", "vault"]);
    c.kill();
    let old = tmp.path().join("old.key");
    std::fs::write(&old, &old_key).unwrap();
    let out = serve(&data, &["--encryption-key-file", old.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "the retired key must not open the store"
    );
}

#[test]
fn machine_tickets_are_single_use_and_die_with_their_machine() {
    ensure_image();
    let tmp = tempfile::tempdir().unwrap();
    let name = format!("tk-{:05x}", std::process::id() % 0xfffff);
    // Dropped after the coordinator, which would otherwise re-create containers.
    let _cleanup = DockerCleanup(name.clone());
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    apply(
        &c,
        tmp.path(),
        &format!(
            "apiVersion: drover.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  kubernetesVersion: v1.31.2\n  controlPlane:\n    replicas: 1\n  workerPools:\n    - name: default\n      replicas: 1\n  provider:\n    docker:\n      image: {image}\n",
            image = node_image()
        ),
    );
    c.wait_cluster_phase(&name, "Running", BOOT);
    let worker = c
        .machines()
        .into_iter()
        .find(|m| {
            m["spec"]["assignment"]["role"] == "worker"
                && m["spec"]["assignment"]["cluster"] == name.as_str()
        })
        .unwrap();
    let wname = worker["metadata"]["name"].as_str().unwrap().to_owned();
    let container = format!("drover-{name}-{wname}");
    // What an attacker with a copy of the machine's user data has.
    let user_data = tmp.path().join("user-data");
    docker_ok(&[
        "cp",
        &format!("{container}:/var/lib/cloud/seed/nocloud/user-data"),
        user_data.to_str().unwrap(),
    ]);
    let state = tmp.path().join("state.json");
    docker_ok(&[
        "cp",
        &format!("{container}:/var/lib/drover-agent/state.json"),
        state.to_str().unwrap(),
    ]);
    let doc: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&user_data).unwrap()).unwrap();
    let ticket = doc["ticket"].as_str().unwrap().to_owned();
    let (_key, csr) = drover_common::pki::generate_key_and_csr("thief").unwrap();
    let register = |ticket: &str| {
        c.api(None).json(
            "POST",
            "/v1/machine/register",
            None,
            &serde_json::json!({
                "ticket": ticket,
                "csrPem": csr,
                "facts": {"hostname": "thief", "addresses": ["127.0.0.1"], "apiServerPort": 6443, "kubeletHealthzPort": 10248, "agentVersion": "x"}
            }),
        )
    };
    // From another machine, after the real one registered: refused.
    register(&ticket).assert_problem(409, "already used");

    // The machine's own certificate works until the machine is deleted.
    let st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    let cert = st["certificatePem"].as_str().unwrap().to_owned();
    let key = st["keyPem"].as_str().unwrap().to_owned();
    let hb = serde_json::json!({"phase": "Running", "appliedGeneration": 1, "health": {"kubelet": {"state": "Healthy"}}});
    assert_eq!(
        c.api(Some((&cert, &key)))
            .json("POST", "/v1/machine/heartbeat", None, &hb)
            .status,
        200
    );
    c.cli_ok(&["scale", &name, "--pool", "default", "--replicas", "0"]);
    wait_for("the worker to be deleted", BOOT, || {
        let all: Vec<serde_json::Value> =
            serde_json::from_str(&c.cli_ok(&["get", "machines", "-a", "-o", "json"])).unwrap();
        let phase = all
            .iter()
            .find(|m| m["metadata"]["name"] == wname.as_str())
            .map(|m| m["status"]["phase"].clone());
        if phase == Some("Deleted".into()) {
            Ok(())
        } else {
            Err(format!("{phase:?}"))
        }
    });
    c.api(Some((&cert, &key)))
        .json("POST", "/v1/machine/heartbeat", None, &hb)
        .assert_problem(401, "not known");
    c.api(Some((&cert, &key)))
        .send("GET", "/v1/machine/config", None, None)
        .assert_problem(401, "not known");
    // Its ticket died with it.
    register(&ticket).assert_problem(401, "");
}

#[test]
fn registration_is_rate_limited_and_silent_clients_are_cut_off() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let c = Coordinator::start_with_args(
        tmp.path(),
        CoordinatorOptions::default(),
        &["--registration-rate", "1"],
        &format!("127.0.0.1:{port}"),
    );
    let api = c.api(None);
    let body = serde_json::json!({"ticket": "dt1.e30.AAAA", "csrPem": "x", "facts": {"hostname": "h", "addresses": ["127.0.0.1"], "apiServerPort": 6443, "kubeletHealthzPort": 10248, "agentVersion": "x"}});
    let answers: Vec<Answer> = (0..12)
        .map(|_| api.json("POST", "/v1/machine/register", None, &body))
        .collect();
    let limited: Vec<&Answer> = answers.iter().filter(|a| a.status == 429).collect();
    assert!(
        !limited.is_empty(),
        "a burst of 12 must hit a limit of 1/s (burst 5): {answers:?}"
    );
    limited[0].assert_problem(429, "retry in");
    // Refused registrations before the limit were refused for their ticket.
    answers[0].assert_problem(401, "signature");

    // A client that connects and never starts TLS is disconnected.
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 16];
    let n = s
        .read(&mut buf)
        .expect("the server closes the connection, not the test's timeout");
    assert_eq!(n, 0, "expected EOF");
}

#[test]
fn a_ticket_altered_to_name_another_cluster_is_refused() {
    use base64::Engine;
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    let boot = tmp.path().join("boot.yaml");
    c.token("pool-a", "env=a", 1, "1h", &boot);
    let doc: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&boot).unwrap()).unwrap();
    let ticket = doc["ticket"].as_str().unwrap().to_owned();
    let parts: Vec<&str> = ticket.split('.').collect();
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut claims: serde_json::Value =
        serde_json::from_slice(&engine.decode(parts[1]).unwrap()).unwrap();
    claims["grant"]["pool"] = "pool-b".into();
    let altered = format!(
        "{}.{}.{}",
        parts[0],
        engine.encode(serde_json::to_vec(&claims).unwrap()),
        parts[2]
    );
    let (_k, csr) = drover_common::pki::generate_key_and_csr("x").unwrap();
    c.api(None)
        .json(
            "POST",
            "/v1/machine/register",
            None,
            &serde_json::json!({"ticket": altered, "csrPem": csr, "facts": {"hostname": "x", "addresses": ["127.0.0.1"], "apiServerPort": 6443, "kubeletHealthzPort": 10248, "agentVersion": "x"}}),
        )
        .assert_problem(401, "signature is invalid");
    assert!(c.machines().is_empty());
}

#[test]
fn accepted_heartbeats_are_not_audited_but_refused_ones_are() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    let boot = tmp.path().join("bootstrap.yaml");
    c.token("audit", "role=x", 1, "10m", &boot);
    let _agent = Agent::start(&tmp.path().join("m1"), "m1", &boot);
    // Heartbeats every second: wait until three were accepted.
    let mut seen = std::collections::BTreeSet::new();
    wait_for("three accepted heartbeats", Duration::from_secs(30), || {
        if let Some(t) = c
            .machines()
            .first()
            .and_then(|m| m["status"]["lastHeartbeatTime"].as_str().map(str::to_owned))
        {
            seen.insert(t);
        }
        if seen.len() >= 3 {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    // A malformed heartbeat without a machine certificate is refused, and
    // audited.
    let refused = c.api(None).send(
        "POST",
        "/v1/machine/heartbeat",
        None,
        Some(("application/json", b"{}".to_vec())),
    );
    assert!(refused.status >= 400, "{refused:?}");
    let audit: Vec<serde_json::Value> =
        serde_json::from_str(&c.cli_ok(&["audit", "--limit", "1000", "-o", "json"])).unwrap();
    let heartbeats: Vec<&serde_json::Value> = audit
        .iter()
        .filter(|e| e["path"] == "/v1/machine/heartbeat")
        .collect();
    assert_eq!(heartbeats.len(), 1, "{heartbeats:#?}");
    assert_eq!(heartbeats[0]["status"], refused.status);
    assert_eq!(heartbeats[0]["actor"], "anonymous");
    assert!(
        audit
            .iter()
            .any(|e| e["path"] == "/v1/machine/register" && e["status"] == 201),
        "{audit:#?}"
    );
}
