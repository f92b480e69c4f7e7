//! The adversarial suite: real coordinators and agents over real TLS,
//! attacked the ways SECURITY.md lists.

use std::path::Path;
use std::time::Duration;

use drover_tests::docker::*;
use drover_tests::*;

const BOOT: Duration = Duration::from_secs(120);

fn apply(c: &Coordinator, dir: &Path, yaml: &str) {
    c.apply_yaml(dir, yaml);
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
fn viewer_tokens_read_but_change_nothing_and_are_audited() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    apply(&c, tmp.path(), &pool_cluster_yaml("guarded", 1, 0, "x"));
    let viewer = c.create_admin_token("viewer");
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
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
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
    // A lifetime past what a date can hold is refused, not a crash
    // (Schemathesis found 2^63 seconds).
    api.json(
        "POST",
        "/v1/registrationtokens",
        Some(&token),
        &serde_json::json!({"pool": "p", "ttlSeconds": 9_223_372_036_854_775_808u64, "maxUses": 1}),
    )
    .assert_problem(422, "ttlSeconds");
    api.send("GET", "/v1/machines/..%2F..%2Fetc", Some(&token), None)
        .assert_problem(400, "DNS-1123 subdomain");
    // Nothing was stored by any of it.
    assert!(c.machines().is_empty());
    assert_eq!(c.cli_ok(&["get", "clusters"]).lines().count(), 1);
    assert!(c.cli_ok(&["token", "list"]).lines().count() == 1);
}

/// A client that sends its whole body, as HTTP/1.1 clients do, gets the
/// answer the coordinator gave before reading that body: the server keeps
/// reading what still arrives before it closes (a lingering close), where
/// closing at once would reset the connection under the client's write,
/// which then fails without reading the answer. Schemathesis saw it as
/// "EOF occurred in violation of protocol" on one PUT in ten thousand.
#[test]
fn answers_given_before_a_body_is_read_reach_a_client_still_sending_it() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    let token = &c.admin_token;
    // Over the size limit, refused from the announced length; and a bad
    // name, refused before the body is parsed. Both bodies are far larger
    // than the socket buffers hold while the server reads none of them.
    for (path, size, status) in [
        ("/v1/clusters/big", 3 * 1024 * 1024, "413"),
        ("/v1/clusters/Bad_Name", 1000 * 1024, "400"),
    ] {
        let mut body = b"kind: Cluster\n#".to_vec();
        body.resize(size, b'x');
        let head = format!(
            "PUT {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/yaml\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        for _ in 0..5 {
            let (sent, answer) = send_whole(&c, &head, &body);
            // Most clients (Python's http.client, so requests and
            // Schemathesis) read no answer once a write has failed.
            assert!(
                sent.is_ok(),
                "PUT {path} with a {size}-byte body: the connection was reset under the client's write ({sent:?}); it read {answer:?}"
            );
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status}")),
                "PUT {path} with a {size}-byte body: {answer:?}"
            );
        }
    }
}

/// Sends `head` and all of `body` on a fresh connection, then reads the
/// answer until the server closes or 10 s pass: whether the whole request
/// could be written, and the answer.
fn send_whole(c: &Coordinator, head: &str, body: &[u8]) -> (std::io::Result<()>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tls = anonymous_tls(&c.ca_pem());
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", c.port).parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut s = tls_from("127.0.0.1".parse().unwrap(), addr, tls)
            .await
            .unwrap();
        let mut request = head.as_bytes().to_vec();
        request.extend_from_slice(body);
        let sent = s.write_all(&request).await;
        let mut buf = vec![];
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
        (sent, String::from_utf8_lossy(&buf).into_owned())
    })
}

#[test]
fn machines_see_only_their_own_config_and_workers_get_no_ca_key() {
    let (tmp, c, boot) = coordinator_with_token("default", "env=sec", 2, "1h");
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
    // Its kubeadm config and, as its kubelet's health port is not the
    // default on this shared loopback, the kubeadm patch that sets it.
    assert_eq!(
        paths,
        vec![
            "/etc/drover/kubeadm.yaml",
            "/etc/drover/kubeadm-patches/kubeletconfiguration+merge.yaml"
        ],
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
    let config = tmp.path().join("unused.yaml");
    let serve = |dir: &Path, extra: &[&str]| {
        drover_serve(dir, &config, extra)
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
        &drover_tests::cluster_yaml(
            &name,
            1,
            1,
            &format!("    docker:\n      image: {}\n", node_image()),
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
    let doc = read_yaml(&user_data);
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
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    let boot = tmp.path().join("boot.yaml");
    c.token("pool-a", "env=a", 1, "1h", &boot);
    let doc = read_yaml(&boot);
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
    let (tmp, c, boot) = coordinator_with_token("audit", "role=x", 1, "10m");
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

/// A TLS client without a certificate that trusts `ca_pem`.
fn anonymous_tls(ca_pem: &str) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A TLS connection to `addr` from the local address `source`.
async fn tls_from(
    source: std::net::IpAddr,
    addr: std::net::SocketAddr,
    tls: std::sync::Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::new(source, 0))?;
    let tcp = socket.connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
}

/// Sends `head` (and `body`) on a fresh connection from 127.0.0.1 and
/// reads the answer until the server closes or 10 s pass, whether or not
/// the whole request could be written.
fn raw_request(c: &Coordinator, head: &str, body: &[u8]) -> String {
    send_whole(c, head, body).1
}

/// The audit log through the CLI.
fn audit_log(c: &Coordinator) -> Vec<serde_json::Value> {
    serde_json::from_str(&c.cli_ok(&["audit", "--limit", "10000", "-o", "json"])).unwrap()
}

#[test]
fn slow_bodies_cannot_take_the_coordinators_connections() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // A coordinator with 256 open files: 300 connections held would take
    // them all.
    let log = std::fs::File::create(tmp.path().join("serve.log")).unwrap();
    let mut child = std::process::Command::new("bash")
        .args(["-c", "ulimit -n 256 && exec \"$@\"", "bash"])
        .arg(bin("drover"))
        .args(["serve", "--data-dir"])
        .arg(tmp.path().join("data"))
        .args(["--listen", &addr.to_string()])
        .args(["--max-unauthenticated-connections-per-source", "8"])
        .args(["--request-body-timeout", "3s"])
        .env("DROVER_CONFIG", tmp.path().join("client.yaml"))
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _kill = Kill(&mut child);
    let ca = wait_for("the coordinator's CA", Duration::from_secs(30), || {
        std::fs::read_to_string(tmp.path().join("data/ca.crt"))
            .ok()
            .filter(|s| s.contains("END CERTIFICATE"))
            .ok_or_else(|| "not written yet".to_owned())
    });
    let tls = anonymous_tls(&ca);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let healthz = |source: &str| {
        let tls = tls.clone();
        let source: std::net::IpAddr = source.parse().unwrap();
        async move {
            let answer = tokio::time::timeout(Duration::from_secs(2), async {
                let mut s = tls_from(source, addr, tls)
                    .await
                    .map_err(|e| e.to_string())?;
                s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                    .await
                    .map_err(|e| e.to_string())?;
                // Until the body ("ok") or the end.
                let mut buf = vec![];
                let mut chunk = [0u8; 1024];
                while !buf.ends_with(b"\r\n\r\nok") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                Ok::<_, String>(String::from_utf8_lossy(&buf).into_owned())
            })
            .await;
            match answer {
                Ok(Ok(a)) if a.starts_with("HTTP/1.1 200") => Ok(()),
                Ok(Ok(a)) => Err(format!("answered {a:?}")),
                Ok(Err(e)) => Err(e),
                Err(_) => Err("no answer within 2 s".to_owned()),
            }
        }
    };
    wait_for("/healthz", Duration::from_secs(30), || {
        rt.block_on(healthz("127.0.0.1"))
    });

    // 300 clients from four addresses announce a body and trickle it, one
    // byte every 500 ms.
    let holding = std::sync::Arc::new(AtomicUsize::new(0));
    let started = std::time::Instant::now();
    let flood: Vec<_> = (0..300)
        .map(|i| {
            let (tls, holding) = (tls.clone(), holding.clone());
            let source: std::net::IpAddr = format!("127.0.1.{}", 1 + i % 4).parse().unwrap();
            rt.spawn(async move {
                let Ok(s) = tls_from(source, addr, tls).await else {
                    return "refused".to_owned();
                };
                holding.fetch_add(1, Ordering::SeqCst);
                let (mut r, mut w) = tokio::io::split(s);
                let head = "POST /v1/machine/register HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n";
                let trickle = async {
                    if w.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    loop {
                        if w.write_all(b" ").await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                };
                let mut buf = vec![];
                let outcome = tokio::select! {
                    _ = r.read_to_end(&mut buf) => {
                        String::from_utf8_lossy(&buf).split("\r\n").next().unwrap_or("closed").to_owned()
                    }
                    _ = trickle => "write failed".to_owned(),
                };
                holding.fetch_sub(1, Ordering::SeqCst);
                if outcome.is_empty() {
                    "closed".to_owned()
                } else {
                    outcome
                }
            })
        })
        .collect();
    // While the flood holds connections, /healthz from elsewhere answers
    // within 2 s every time.
    wait_for(
        "the flood to hold connections",
        Duration::from_secs(10),
        || match holding.load(Ordering::SeqCst) {
            n if n >= 16 => Ok(()),
            n => Err(format!("{n} held")),
        },
    );
    let mut probes = 0;
    while holding.load(Ordering::SeqCst) >= 16 && started.elapsed() < Duration::from_secs(20) {
        if let Err(e) = rt.block_on(healthz("127.0.0.9")) {
            panic!(
                "/healthz failed while {} slow connections were open: {e}",
                holding.load(Ordering::SeqCst)
            );
        }
        probes += 1;
    }
    assert!(probes >= 3, "only {probes} probes ran during the flood");
    // Every slow client is cut off by the body deadline or refused at
    // once, within bounded time; at most 8 per source were served.
    let outcomes: Vec<String> = rt.block_on(async {
        let mut all = vec![];
        for f in flood {
            all.push(
                tokio::time::timeout(Duration::from_secs(20), f)
                    .await
                    .expect("a slow client was kept past the body deadline")
                    .unwrap(),
            );
        }
        all
    });
    let count = |prefix: &str| outcomes.iter().filter(|o| o.starts_with(prefix)).count();
    let cut = count("HTTP/1.1 408");
    assert!(
        (1..=4 * 8).contains(&cut),
        "{cut} cut off by the deadline: {outcomes:?}"
    );
    assert_eq!(
        cut + count("HTTP/1.1 503") + count("refused") + count("closed") + count("write failed"),
        300,
        "{outcomes:?}"
    );
    // And the connections came back: a client from a flooding address is
    // served again.
    wait_for(
        "/healthz from a flooding address",
        Duration::from_secs(10),
        || rt.block_on(healthz("127.0.1.1")),
    );
}

#[test]
fn anonymous_refusals_cannot_fill_the_audit_log() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    let api = c.api(None);
    let long = format!("/v1/clusters/{}", "a".repeat(4000));
    for _ in 0..200 {
        let a = api.send(
            "PUT",
            &long,
            None,
            Some(("application/yaml", b"kind: Cluster".to_vec())),
        );
        assert_eq!(a.status, 401, "{a:?}");
    }
    let audit = audit_log(&c);
    let anonymous: Vec<&serde_json::Value> =
        audit.iter().filter(|e| e["actor"] == "anonymous").collect();
    assert!(
        !anonymous.is_empty() && anonymous.len() <= 20,
        "{} anonymous refusals recorded one by one",
        anonymous.len()
    );
    for e in &anonymous {
        let path = e["path"].as_str().unwrap();
        assert!(path.len() <= 256 && path.ends_with('…'), "{path}");
    }
    let size = std::fs::metadata(tmp.path().join("data/audit.log"))
        .unwrap()
        .len();
    assert!(size < 16 * 1024, "200 refusals wrote {size} bytes");
}

#[test]
fn sign_outs_and_refused_machine_certificates_cannot_fill_the_audit_log() {
    let (tmp, c, boot) = coordinator_with_token("default", "env=x", 1, "1h");
    let mut agent = Agent::start(&tmp.path().join("a"), "a", &boot);
    wait_machines(&c, 1);
    let (cert, key, name) = identity_of(&c, &agent);
    agent.kill();
    c.cli_ok(&["revoke", "machine", &name]);
    let revoked = c.api(Some((&cert, &key)));
    let anonymous = c.api(None);
    let before = std::fs::metadata(tmp.path().join("data/audit.log"))
        .unwrap()
        .len();
    // The client follows the 303 to the sign-in page.
    for _ in 0..200 {
        let a = anonymous.send("POST", "/ui/logout", None, None);
        assert_eq!(a.status, 200, "{a:?}");
        revoked
            .send("GET", "/v1/machine/config", None, None)
            .assert_problem(401, "revoked");
    }
    // A sign-in is recorded as the token that signed in.
    let signed_in = anonymous.send(
        "POST",
        "/ui/login",
        None,
        Some((
            "application/x-www-form-urlencoded",
            format!("token={}", c.admin_token).into_bytes(),
        )),
    );
    assert_eq!(signed_in.status, 200, "{signed_in:?}");
    let audit = audit_log(&c);
    let flood: Vec<&serde_json::Value> = audit
        .iter()
        .filter(|e| {
            (e["actor"] == "anonymous" && e["path"] == "/ui/logout")
                || (e["actor"] == format!("machine:{name}").as_str() && e["status"] == 401)
        })
        .collect();
    assert!(
        !flood.is_empty() && flood.len() <= 20,
        "{} of 400 sign-outs and refused certificates recorded one by one",
        flood.len()
    );
    let token_id = c.admin_token.split('_').nth(1).unwrap();
    assert!(
        audit.iter().any(|e| e["path"] == "/ui/login"
            && e["status"] == 303
            && e["actor"] == format!("admin-token:{token_id} (admin)").as_str()),
        "the sign-in is not recorded as its token: {audit:#?}"
    );
    let grown = std::fs::metadata(tmp.path().join("data/audit.log"))
        .unwrap()
        .len()
        - before;
    assert!(grown < 16 * 1024, "400 requests wrote {grown} bytes");
}

#[test]
fn the_first_admin_token_is_not_printed_to_a_log() {
    let tmp = tempfile::tempdir().unwrap();
    // Its standard output is a pipe, as under systemd (the journal).
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    let token = c.client_config_token();
    assert!(token.starts_with("drv_"), "{token:?}");
    let output = c.output();
    assert!(!output.contains(&token), "the token was printed:\n{output}");
    assert!(
        output.contains(&c.client_config().display().to_string()),
        "where the token is was not said:\n{output}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(c.client_config())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // The token in the file works.
    c.cli_ok(&["get", "clusters"]);
}

#[test]
fn machine_config_fetches_and_oversized_requests_are_audited() {
    let (tmp, c, boot) = coordinator_with_token("audit", "role=x", 1, "10m");
    let agent = Agent::start(&tmp.path().join("m1"), "m1", &boot);
    let name = wait_for("the machine to register", BOOT, || {
        c.machines()
            .first()
            .and_then(|m| m["metadata"]["name"].as_str().map(str::to_owned))
            .ok_or_else(|| "none yet".to_owned())
    });
    let state = wait_for("the agent's identity", BOOT, || {
        std::panic::catch_unwind(|| agent.state())
            .ok()
            .filter(|s| s["certificatePem"].is_string())
            .ok_or_else(|| "not saved yet".to_owned())
    });
    let identity = (
        state["certificatePem"].as_str().unwrap(),
        state["keyPem"].as_str().unwrap(),
    );
    let fetched = c
        .api(Some(identity))
        .send("GET", "/v1/machine/config", None, None);
    assert!(fetched.status != 0, "{fetched:?}");
    c.api(None)
        .send_announced("POST", "/v1/machine/register", 2 * 1024 * 1024, b"{")
        .assert_problem(413, "");
    let audit = audit_log(&c);
    assert!(
        audit.iter().any(|e| e["method"] == "GET"
            && e["path"] == "/v1/machine/config"
            && e["actor"] == format!("machine:{name}").as_str()
            && e["status"] == fetched.status),
        "the config fetch is not audited: {audit:#?}"
    );
    assert!(
        audit
            .iter()
            .any(|e| e["path"] == "/v1/machine/register" && e["status"] == 413),
        "the 413 refusal is not audited: {audit:#?}"
    );
}

#[test]
fn a_viewers_change_is_refused_before_its_body_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    let viewer = c.create_admin_token("viewer");
    // Malformed: 403, not 422.
    c.api(None)
        .send(
            "PUT",
            "/v1/clusters/x",
            Some(&viewer),
            Some(("application/yaml", b"kind: [".to_vec())),
        )
        .assert_problem(403, "viewer role");
    c.api(None)
        .send(
            "POST",
            "/v1/registrationtokens",
            Some(&viewer),
            Some(("application/json", b"{not json".to_vec())),
        )
        .assert_problem(403, "viewer role");
    // A 900 KB body announced but never sent: answered at once, unread.
    let answer = raw_request(
        &c,
        &format!(
            "PUT /v1/clusters/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {viewer}\r\ncontent-type: application/yaml\r\ncontent-length: {}\r\n\r\n",
            900 * 1024
        ),
        b"kind: Cluster\n",
    );
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer:?}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
}

#[test]
fn a_refused_registration_logs_no_raw_control_characters() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    let hostname = "evil\nFORGED level=INFO machine registered\u{1b}[2J";
    let a = c.api(None).json(
        "POST",
        "/v1/machine/register",
        None,
        &serde_json::json!({"ticket": "dt1.e30.AAAA", "csrPem": "x", "facts": {"hostname": hostname, "addresses": ["127.0.0.1"], "apiServerPort": 6443, "kubeletHealthzPort": 10248, "agentVersion": "x"}}),
    );
    a.assert_problem(400, "DNS-1123 subdomain");
    // A refusal for the ticket logs the (valid) host name, escaped.
    c.api(None)
        .json(
            "POST",
            "/v1/machine/register",
            None,
            &serde_json::json!({"ticket": "dt1.e30.AAAA", "csrPem": "x", "facts": {"hostname": "plain-host", "addresses": ["127.0.0.1"], "apiServerPort": 6443, "kubeletHealthzPort": 10248, "agentVersion": "x"}}),
        )
        .assert_problem(401, "");
    let out = wait_for("the refusal in the log", Duration::from_secs(10), || {
        let out = c.output();
        if out.contains("plain-host") {
            Ok(out)
        } else {
            Err("not logged yet".to_owned())
        }
    });
    assert!(
        !out.lines().any(|l| l.starts_with("FORGED")),
        "an injected line reached the log:\n{out}"
    );
    assert!(
        !out.contains("\u{1b}[2J"),
        "an escape sequence reached the log"
    );
}

#[test]
fn an_encryption_key_file_others_can_change_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    c.kill();
    let key = tmp.path().join("data/encryption.key");
    let chmod =
        |mode: u32| std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
    // Readable by others: starts, with a warning.
    chmod(0o644);
    c.restart();
    // The log is read by a thread, so the warning may arrive after the
    // coordinator already answers.
    wait_for(
        "the warning about a key readable by others",
        Duration::from_secs(10),
        || {
            let out = c.output();
            if out.contains("readable by other users") && out.contains("chmod 600") {
                Ok(())
            } else {
                Err(out)
            }
        },
    );
    c.kill();
    // Writable by others: refused before anything starts.
    for mode in [0o666, 0o620] {
        chmod(mode);
        let out = std::process::Command::new(bin("drover"))
            .args(["serve", "--data-dir"])
            .arg(tmp.path().join("data"))
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .env("DROVER_CONFIG", tmp.path().join("unused.yaml"))
            .env_remove("DROVER_ENCRYPTION_KEY")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "mode {mode:o}: {err}");
        assert!(
            err.contains(&key.display().to_string())
                && err.contains(&format!("chmod 600 {}", key.display())),
            "{err}"
        );
    }
}

#[test]
fn a_read_only_data_dir_is_refused_with_its_path_and_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    // A read-only mount in a mount namespace of the test's own.
    let out = std::process::Command::new("unshare")
        .args([
            "-rm",
            "bash",
            "-c",
            "mount -t tmpfs -o ro tmpfs \"$1\" && shift && exec \"$@\"",
            "bash",
        ])
        .arg(&data)
        .arg(bin("drover"))
        .args(["serve", "--data-dir"])
        .arg(&data)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .env("DROVER_CONFIG", tmp.path().join("client.yaml"))
        .output()
        .expect("run unshare (util-linux)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("Read-only file system"),
        "not a read-only mount: {err}"
    );
    assert!(
        err.contains(&data.display().to_string()) && err.contains("mount it read-write"),
        "{err}"
    );
}

/// The agent identity a test takes over (what a thief copies): certificate
/// and key PEM, and the machine's name.
fn identity_of(c: &Coordinator, a: &Agent) -> (String, String, String) {
    let s = a.wait_identity();
    let uid = s["machineUid"].as_str().unwrap().to_owned();
    let name = c
        .machines()
        .into_iter()
        .find(|m| m["metadata"]["uid"] == uid.as_str())
        .unwrap()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    (
        s["certificatePem"].as_str().unwrap().to_owned(),
        s["keyPem"].as_str().unwrap().to_owned(),
        name,
    )
}

/// Waits for `n` registered machines.
fn wait_machines(c: &Coordinator, n: usize) {
    c.wait_registered(n, BOOT);
}

/// The kubeadm token in a signed bundle's kubeadm config.
fn bundle_token(answer: &Answer) -> String {
    assert_eq!(answer.status, 200, "{answer:?}");
    let payload: serde_json::Value =
        serde_json::from_str(answer.json()["payload"].as_str().unwrap()).unwrap();
    let config = payload["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "/etc/drover/kubeadm.yaml")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    config
        .lines()
        .find_map(|l| {
            let v = l.trim().trim_start_matches("- ").strip_prefix("token:")?;
            Some(v.trim().trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| panic!("no token in {config}"))
}

#[test]
fn init_config_fetches_reuse_one_join_token_so_later_joins_work() {
    let (tmp, c, boot) = coordinator_with_token("default", "env=jt", 3, "1h");
    let a = Agent::start(&tmp.path().join("a"), "a", &boot);
    let b = Agent::start(&tmp.path().join("b"), "b", &boot);
    wait_machines(&c, 2);
    apply(&c, tmp.path(), &pool_cluster_yaml("jt", 1, 1, "jt"));
    c.wait_cluster_phase("jt", "Running", BOOT);
    let init = [&a, &b]
        .into_iter()
        .find(|x| {
            let (_, _, name) = identity_of(&c, x);
            c.machines().iter().any(|m| {
                m["metadata"]["name"] == name.as_str() && m["spec"]["assignment"]["role"] == "init"
            })
        })
        .unwrap();
    let (cert, key, _) = identity_of(&c, init);
    // The init machine (or whoever holds its certificate) fetches its
    // config again and again: always the token kubeadm init registered.
    let api = c.api(Some((&cert, &key)));
    let first = bundle_token(&api.send("GET", "/v1/machine/config", None, None));
    for _ in 0..5 {
        assert_eq!(
            bundle_token(&api.send("GET", "/v1/machine/config", None, None)),
            first
        );
    }
    // So the next joiner is handed a token the cluster knows, and joins.
    let _c3 = Agent::start(&tmp.path().join("c"), "c", &boot);
    wait_machines(&c, 3);
    c.cli_ok(&["scale", "jt", "--pool", "default", "--replicas", "2"]);
    wait_for("the third machine to join", BOOT, || {
        let running = c
            .machines()
            .iter()
            .filter(|m| m["status"]["phase"] == "Running")
            .count();
        if running == 3 {
            Ok(())
        } else {
            Err(format!("{running} running: {:#?}", c.machines()))
        }
    });
}

#[test]
fn object_names_are_checked_by_the_cli_and_on_every_route() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    let second = c.create_admin_token("admin");
    let id = second.split('_').nth(1).unwrap().to_owned();
    // The CLI refuses a name that would reach another path, before sending.
    for args in [
        vec!["delete", "cluster", &format!("../admintokens/{id}")],
        vec!["get", "clusters", "../admintokens"],
        vec!["describe", "machine", ".."],
        vec!["kubeconfig", "a/b"],
        vec!["token", "revoke", "../clusters/x"],
        vec!["revoke", "machine", "Node_1"],
    ] {
        let out = c.cli(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.contains("DNS-1123 subdomain"), "{args:?}: {err}");
    }
    // The second admin token still works: nothing was revoked.
    assert_eq!(
        c.api(None)
            .send("GET", "/v1/clusters", Some(&second), None)
            .status,
        200
    );
    // The server refuses such names on every route, with a problem naming
    // the rule, whoever sends them.
    let api = c.api(None);
    let token = c.admin_token.clone();
    let yaml = pool_cluster_yaml("x", 1, 0, "x").into_bytes();
    for (method, path) in [
        ("GET", format!("/v1/clusters/..%2Fadmintokens%2F{id}")),
        ("DELETE", format!("/v1/clusters/..%2Fadmintokens%2F{id}")),
        ("PUT", "/v1/clusters/x%0Ay".to_owned()),
        ("POST", "/v1/clusters/..%2F..%2Fkeys/kubeconfig".to_owned()),
        ("GET", "/v1/machines/a..b".to_owned()),
        ("POST", "/v1/machines/..%2Fx/revoke".to_owned()),
        ("DELETE", "/v1/registrationtokens/..%2Fx".to_owned()),
        ("PUT", "/v1/registrationtokens/A".to_owned()),
        ("PUT", "/v1/secrets/..%2Fx".to_owned()),
        ("DELETE", "/v1/secrets/A".to_owned()),
        ("DELETE", format!("/v1/admintokens/{id}%2F..")),
    ] {
        let body = match method {
            "PUT" if path.starts_with("/v1/clusters") => Some(("application/yaml", yaml.clone())),
            "POST" | "PUT" => Some(("application/json", b"{}".to_vec())),
            _ => None,
        };
        api.send(method, &path, Some(&token), body)
            .assert_problem(400, "DNS-1123 subdomain");
    }
    assert_eq!(
        c.api(None)
            .send("GET", "/v1/clusters", Some(&second), None)
            .status,
        200
    );
    assert_eq!(c.cli_ok(&["get", "clusters"]).lines().count(), 1);
}

#[test]
fn names_labels_and_hostnames_are_validated_where_they_enter() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    let api = c.api(None);
    let token = c.admin_token.clone();
    // A selector key with a newline, a worker pool selector value with a space.
    let doc = pool_cluster_yaml("sel", 1, 1, "x");
    let bad = doc.replace(
        "  controlPlane:\n    replicas: 1\n",
        "  controlPlane:\n    replicas: 1\n    selector:\n      matchLabels:\n        \"env\\nrole\": x\n",
    );
    assert_ne!(doc, bad);
    api.send(
        "PUT",
        "/v1/clusters/sel",
        Some(&token),
        Some(("application/yaml", bad.into_bytes())),
    )
    .assert_problem(422, "spec.controlPlane.selector.matchLabels");
    api.json(
        "POST",
        "/v1/registrationtokens",
        Some(&token),
        &serde_json::json!({"pool": "p", "labels": {"a\nb": "x"}, "ttlSeconds": 60, "maxUses": 1}),
    )
    .assert_problem(422, "label key");
    let out = c.cli(&["token", "create", "--pool", "p", "--labels", "bad key=x"]);
    assert_eq!(out.status.code(), Some(64));
    // Host names are DNS-1123 subdomains (they become node names).
    let boot = tmp.path().join("boot.yaml");
    c.token("default", "env=x", 5, "1h", &boot);
    let doc = read_yaml(&boot);
    let ticket = doc["ticket"].as_str().unwrap().to_owned();
    let (_k, csr) = drover_common::pki::generate_key_and_csr("x").unwrap();
    for hostname in ["..", ".", "-rf", "a..b", "Node_1", "a\nb", "\u{1b}[2J"] {
        api.json(
            "POST",
            "/v1/machine/register",
            None,
            &serde_json::json!({"ticket": ticket, "csrPem": csr, "facts": {"hostname": hostname, "addresses": ["127.0.0.1"], "apiServerPort": 6443, "kubeletHealthzPort": 10248, "agentVersion": "x"}}),
        )
        .assert_problem(400, "hostname");
    }
    assert!(c.machines().is_empty());
    api.json(
        "POST",
        "/v1/machine/register",
        None,
        &serde_json::json!({"ticket": ticket, "csrPem": csr, "facts": {"hostname": "node-1.example", "addresses": ["127.0.0.1"], "apiServerPort": 6443, "kubeletHealthzPort": 10248, "agentVersion": "x"}}),
    );
    wait_machines(&c, 1);
}

#[test]
fn reported_strings_are_bounded_and_printed_escaped() {
    let (tmp, c, boot) = coordinator_with_token("default", "env=x", 1, "1h");
    let mut agent = Agent::start(&tmp.path().join("m"), "m", &boot);
    wait_machines(&c, 1);
    // Its certificate, in other hands: the agent itself is stopped.
    let (cert, key, name) = identity_of(&c, &agent);
    agent.kill();
    let escape = "\u{1b}]0;pwned\u{7}\u{1b}[2J";
    let message = format!("{escape}{}", "x".repeat(900 * 1024));
    let hb = serde_json::json!({
        "phase": "Waiting", "appliedGeneration": 0,
        "health": {"kubelet": {"state": "Unhealthy", "message": message}},
    });
    let a = c
        .api(Some((&cert, &key)))
        .json("POST", "/v1/machine/heartbeat", None, &hb);
    assert_eq!(a.status, 200, "{a:?}");
    let m = c
        .machines()
        .into_iter()
        .find(|m| m["metadata"]["name"] == name.as_str())
        .unwrap();
    let stored = m["status"]["health"]["kubelet"]["message"]
        .as_str()
        .unwrap();
    assert!(
        stored.chars().count() <= 1024 && stored.ends_with("bytes cut)"),
        "{} characters stored",
        stored.len()
    );
    // No control character reaches the operator's terminal.
    for args in [
        vec!["describe", "machine", name.as_str()],
        vec!["get", "machines", "-o", "wide"],
    ] {
        let out = c.cli_ok(&args);
        assert!(
            !out.chars().any(|ch| ch.is_control() && ch != '\n'),
            "{args:?} printed a control character"
        );
    }
    assert!(c
        .cli_ok(&["describe", "machine", &name])
        .contains("\\u{1b}]0;pwned"));
}

#[test]
fn a_revoked_or_doubly_held_machine_identity_is_refused_at_the_next_request() {
    let (tmp, c, boot) = coordinator_with_token("default", "env=x", 3, "1h");
    let mut a = Agent::start(&tmp.path().join("a"), "a", &boot);
    let mut b = Agent::start(&tmp.path().join("b"), "b", &boot);
    let mut m3 = Agent::start(&tmp.path().join("c"), "c", &boot);
    wait_machines(&c, 3);
    let (cert, key, name) = identity_of(&c, &a);
    let (cert_b, key_b, name_b) = identity_of(&c, &b);
    let (cert_c, key_c, name_c) = identity_of(&c, &m3);
    a.kill();
    b.kill();
    m3.kill();
    let hb = serde_json::json!({"phase": "Waiting", "appliedGeneration": 0, "health": {"kubelet": {"state": "Unknown"}}});
    let stolen = c.api(Some((&cert, &key)));
    assert_eq!(
        stolen
            .json("POST", "/v1/machine/heartbeat", None, &hb)
            .status,
        200
    );
    // An admin revokes the machine's identity: refused at the next request,
    // renewal included, and the revocation is audited.
    let out = c.cli_ok(&["revoke", "machine", &name]);
    assert!(out.contains("revoked"), "{out}");
    stolen
        .json("POST", "/v1/machine/heartbeat", None, &hb)
        .assert_problem(401, "revoked");
    stolen
        .send("GET", "/v1/machine/config", None, None)
        .assert_problem(401, "revoked");
    let (_k, csr) = drover_common::pki::generate_key_and_csr("x").unwrap();
    stolen
        .json(
            "POST",
            "/v1/machine/certificate",
            None,
            &serde_json::json!({"csrPem": csr}),
        )
        .assert_problem(401, "revoked");
    assert!(c
        .cli_ok(&["describe", "machine", &name])
        .contains("Identity:       revoked"));
    let audit: Vec<serde_json::Value> =
        serde_json::from_str(&c.cli_ok(&["audit", "--limit", "100", "-o", "json"])).unwrap();
    assert!(
        audit.iter().any(|e| e["method"] == "POST"
            && e["path"] == format!("/v1/machines/{name}/revoke")
            && e["status"] == 200),
        "{audit:#?}"
    );

    // A thief renews with a copy of machine b's certificate first; when the
    // machine renews with its own (now superseded) certificate, two holders
    // are evident and the identity is revoked for both.
    let renew = |api: &Api| {
        let (k, csr) = drover_common::pki::generate_key_and_csr("x").unwrap();
        let a = api.json(
            "POST",
            "/v1/machine/certificate",
            None,
            &serde_json::json!({"csrPem": csr}),
        );
        (a, k)
    };
    let original = c.api(Some((&cert_b, &key_b)));
    let (thief, thief_key) = renew(&original);
    assert_eq!(thief.status, 200, "{thief:?}");
    let thief_cert = thief.json()["certificatePem"].as_str().unwrap().to_owned();
    let thief_api = c.api(Some((&thief_cert, &thief_key)));
    assert_eq!(
        thief_api
            .json("POST", "/v1/machine/heartbeat", None, &hb)
            .status,
        200
    );
    renew(&original).0.assert_problem(401, "superseded");
    thief_api
        .json("POST", "/v1/machine/heartbeat", None, &hb)
        .assert_problem(401, "revoked");
    renew(&thief_api).0.assert_problem(401, "revoked");
    let events = c.cli_ok(&["describe", "machine", &name_b]);
    assert!(events.contains("IdentityRevoked"), "{events}");

    // The machine renews first, loses the answer and asks again for the
    // same key: a retry, not a second holder. A thief's copy of the old
    // certificate then cannot renew, and its attempt revokes the identity.
    let machine = c.api(Some((&cert_c, &key_c)));
    let (new_key, csr) = drover_common::pki::generate_key_and_csr("x").unwrap();
    let body = serde_json::json!({"csrPem": csr});
    let first = machine.json("POST", "/v1/machine/certificate", None, &body);
    assert_eq!(first.status, 200, "{first:?}");
    let retry = machine.json("POST", "/v1/machine/certificate", None, &body);
    assert_eq!(retry.status, 200, "{retry:?}");
    let renewed = retry.json()["certificatePem"].as_str().unwrap().to_owned();
    let renewed_api = c.api(Some((&renewed, &new_key)));
    assert_eq!(
        renewed_api
            .json("POST", "/v1/machine/heartbeat", None, &hb)
            .status,
        200
    );
    let stolen_copy = c.api(Some((&cert_c, &key_c)));
    renew(&stolen_copy).0.assert_problem(401, "superseded");
    renewed_api
        .json("POST", "/v1/machine/heartbeat", None, &hb)
        .assert_problem(401, "revoked");
    assert!(c
        .cli_ok(&["describe", "machine", &name_c])
        .contains("IdentityRevoked"));
}

#[test]
fn the_coordinator_runs_from_a_config_file_and_refuses_a_bad_one_before_binding() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = tmp.path().join("coordinator.yaml");
    let endpoint = free_port();
    std::fs::write(
        &config,
        format!(
            "# what /etc/drover/coordinator.yaml holds
dataDir: {data}
listen: 127.0.0.1:{port}
heartbeatTimeout: 1m
clientConfig: {client}
endpointPorts: {endpoint}-{endpoint}
",
            data = tmp.path().join("data").display(),
            client = tmp.path().join("client.yaml").display(),
        ),
    )
    .unwrap();
    let serve = |args: &[&str]| {
        let mut cmd = std::process::Command::new(bin("drover"));
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .args(args)
            .env_remove("DROVER_DATA_DIR")
            .env_remove("DROVER_STORE")
            .env(
                "DROVER_ENCRYPTION_KEY",
                "ZHJvdmVyLXRlc3Qta2V5LW9mLTMyLWJ5dGVzLWxvbmc=",
            );
        cmd
    };

    // The effective configuration: file, flag and defaults, each named, the
    // key from the environment redacted.
    let out = serve(&["--heartbeat-interval", "5s", "--print-config"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let shown = String::from_utf8_lossy(&out.stdout);
    let listen = format!("listen: 127.0.0.1:{port}  # file\n");
    for line in [
        listen.as_str(),
        "heartbeatTimeout: 1m  # file\n",
        "heartbeatInterval: 5s  # flag\n",
        "machineCertTtl: 24h  # default\n",
        "# DROVER_ENCRYPTION_KEY is set (redacted)",
    ] {
        assert!(shown.contains(line), "{line:?} is not in {shown}");
    }
    assert!(!shown.contains("ZHJvdmVyLXRlc3Qta2V5"), "{shown}");

    // A misspelt key and a bad value: exit 64, naming file, line and key,
    // and nothing is bound or created.
    let bad = tmp.path().join("bad.yaml");
    // Serves from `text` as the config file: its exit must be 64; returns
    // what it said.
    let refused = |text: &str| {
        std::fs::write(&bad, text).unwrap();
        let out = std::process::Command::new(bin("drover"))
            .args(["serve", "--config"])
            .arg(&bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused(&format!("listen: 127.0.0.1:{port}\nheartbeatTimout: 1m\n"));
    assert!(
        err.contains(&format!(
            "{}:2: unknown key `heartbeatTimout`",
            bad.display()
        )) && err.contains("heartbeatTimeout"),
        "{err}"
    );
    let err = refused("dataDir: /nonexistent/x\nregistrationRate: many\n");
    assert!(
        err.contains(":2: key `registrationRate`: invalid value 'many'"),
        "{err}"
    );
    assert!(!std::path::Path::new("/nonexistent/x").exists());

    // From the file alone, it serves: ready on the file's address.
    let mut child = serve(&[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ca = tmp.path().join("data/ca.crt");
    wait_for("the coordinator to be ready", BOOT, || {
        let pem = std::fs::read_to_string(&ca).map_err(|e| e.to_string())?;
        let ready = Api::new(&format!("https://127.0.0.1:{port}"), &pem, None)
            .send("GET", "/readyz", None, None);
        (ready.status == 200 && ready.body == "ok\n")
            .then_some(())
            .ok_or(format!("{ready:?}"))
    });
    let _ = child.kill();
    let _ = child.wait();
}

/// `drover_heartbeat_datagrams_total` by result, scraped with the admin
/// token.
fn datagram_counts(c: &Coordinator) -> std::collections::BTreeMap<String, u64> {
    c.metrics_text()
        .lines()
        .filter_map(|l| l.strip_prefix("drover_heartbeat_datagrams_total{result=\""))
        .filter_map(|l| {
            let (result, value) = l.split_once("\"} ")?;
            Some((result.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Waits until the coordinator counted `want` more datagrams of `result`
/// than `before`.
fn wait_counted(
    c: &Coordinator,
    before: &std::collections::BTreeMap<String, u64>,
    result: &str,
    want: u64,
) {
    let was = before.get(result).copied().unwrap_or(0);
    wait_for(
        &format!("{want} more {result} datagrams"),
        Duration::from_secs(20),
        || {
            let now = datagram_counts(c).get(result).copied().unwrap_or(0);
            if now >= was + want {
                Ok(())
            } else {
                Err(format!("{} so far", now - was))
            }
        },
    );
}

/// A heartbeat over mutual TLS with a machine's identity, returning the
/// answer's datagram offer: (id, key).
fn offer_of(
    c: &Coordinator,
    identity: (&str, &str),
    report: &drover_common::wire::HeartbeatRequest,
) -> (u64, drover_common::wire::datagram::HeartbeatKey) {
    let answer = c.api(Some(identity)).json(
        "POST",
        "/v1/machine/heartbeat",
        None,
        &serde_json::to_value(report).unwrap(),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    let offer: drover_common::wire::DatagramOffer =
        serde_json::from_value(answer.json()["datagram"].clone())
            .unwrap_or_else(|e| panic!("no datagram offer ({e}): {answer:?}"));
    (offer.id, offer.heartbeat_key().unwrap())
}

/// Receives one datagram within `wait`, if any comes.
fn recv_within(socket: &std::net::UdpSocket, wait: Duration) -> Option<Vec<u8>> {
    socket.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 128];
    socket.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
}

#[test]
fn heartbeat_datagrams_refuse_forgery_replay_another_machines_key_and_garbage() {
    use drover_common::wire::datagram::{self, Answer, Beat, Verdict};
    let (tmp, c, boot) = coordinator_with_token("default", "env=x", 2, "1h");
    let mut a = Agent::start(&tmp.path().join("a"), "a", &boot);
    let mut b = Agent::start(&tmp.path().join("b"), "b", &boot);
    wait_machines(&c, 2);
    let (cert_a, key_a, name_a) = identity_of(&c, &a);
    let (cert_b, key_b, _) = identity_of(&c, &b);
    a.kill();
    b.kill();
    // An agent from before datagram heartbeats (its report does not say it
    // takes offers) gets no offer: it would refuse an answer with a field
    // it does not know.
    let old = serde_json::json!({"phase": "Waiting", "appliedGeneration": 0, "health": {"kubelet": {"state": "Unknown"}}});
    let answer = c
        .api(Some((&cert_a, &key_a)))
        .json("POST", "/v1/machine/heartbeat", None, &old);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.json().get("datagram").is_none(), "{answer:?}");
    // Each identity heartbeats once over mutual TLS and is offered datagrams.
    let report = drover_common::wire::HeartbeatRequest {
        datagrams: true,
        ..Default::default()
    };
    let digest = drover_common::wire::status_digest(&report);
    let (id_a, hk_a) = offer_of(&c, (&cert_a, &key_a), &report);
    let (id_b, hk_b) = offer_of(&c, (&cert_b, &key_b), &report);
    assert_ne!(id_a, id_b);
    let coordinator: std::net::SocketAddr = format!("127.0.0.1:{}", c.port).parse().unwrap();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let now = || datagram::unix_micros(std::time::SystemTime::now());
    let beat = |id, key: &datagram::HeartbeatKey, counter| {
        Beat {
            id,
            counter,
            generation: 0,
            digest,
        }
        .encode(key)
    };

    // A genuine datagram is answered "quiet" under the machine's key, and
    // counts as its heartbeat.
    let before = datagram_counts(&c);
    let genuine = beat(id_a, &hk_a, now());
    socket.send_to(&genuine, coordinator).unwrap();
    let answer = recv_within(&socket, Duration::from_secs(10)).expect("an answer");
    assert_eq!(
        answer.len(),
        datagram::ANSWER_LEN,
        "shorter than the request"
    );
    let answer = Answer::decode(&answer, &hk_a).unwrap();
    assert_eq!((answer.id, answer.verdict), (id_a, Verdict::Quiet));
    wait_counted(&c, &before, "quiet", 1);

    // Each attack is counted by the coordinator, and none is answered.
    let attacks: Vec<(&str, Vec<u8>)> = vec![
        // The genuine datagram again, from another source address.
        ("replayed", genuine.to_vec()),
        // A changed tag.
        ("bad_tag", {
            let mut d = beat(id_a, &hk_a, now());
            d[datagram::REQUEST_LEN - 1] ^= 1;
            d.to_vec()
        }),
        // Machine b's key used to heartbeat for machine a.
        ("bad_tag", beat(id_a, &hk_b, now()).to_vec()),
        // A changed body under the old tag (another generation).
        ("bad_tag", {
            let mut d = beat(id_a, &hk_a, now());
            d[27] ^= 1;
            d.to_vec()
        }),
        // An id no machine has.
        ("unknown_machine", beat(id_a ^ 1, &hk_a, now()).to_vec()),
        // A genuine datagram whose counter is two minutes ahead (one
        // behind the last accepted is a replay).
        (
            "out_of_window",
            beat(id_a, &hk_a, now() + 120_000_000).to_vec(),
        ),
        // Not a heartbeat at all.
        ("malformed", b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        ("malformed", vec![0u8; 1400]),
    ];
    let spoofed = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
    for (result, d) in &attacks {
        let before = datagram_counts(&c);
        spoofed.send_to(d, coordinator).unwrap();
        wait_counted(&c, &before, result, 1);
    }
    // Counted means handled: no answer went to either address.
    assert_eq!(recv_within(&spoofed, Duration::from_millis(1)), None);
    assert_eq!(recv_within(&socket, Duration::from_millis(1)), None);

    // A flood of garbage, in bursts the socket buffer holds, each followed
    // by a genuine beat whose answer shows the burst was read: every
    // datagram is refused, counted, and left unanswered, and the genuine
    // heartbeats keep being answered.
    let before = datagram_counts(&c);
    let flood = std::net::UdpSocket::bind("127.0.0.3:0").unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (bursts, per_burst) = (25u64, 200u64);
    for _ in 0..bursts {
        for _ in 0..per_burst {
            let mut d = vec![0u8; datagram::REQUEST_LEN];
            for byte in d.iter_mut() {
                *byte = next() as u8;
            }
            // Half look like requests of machine b, with random tags.
            if next() % 2 == 0 {
                d[..4].copy_from_slice(b"DRH1");
                d[4..12].copy_from_slice(&id_b.to_be_bytes());
            }
            flood.send_to(&d, coordinator).unwrap();
        }
        socket
            .send_to(&beat(id_a, &hk_a, now()), coordinator)
            .unwrap();
        let answer =
            recv_within(&socket, Duration::from_secs(10)).expect("an answer after a burst");
        assert_eq!(
            Answer::decode(&answer, &hk_a).unwrap().verdict,
            Verdict::Quiet
        );
    }
    let after = datagram_counts(&c);
    let refused: u64 = ["malformed", "bad_tag", "unknown_machine"]
        .iter()
        .map(|r| after.get(*r).unwrap_or(&0) - before.get(*r).unwrap_or(&0))
        .sum();
    assert_eq!(refused, bursts * per_burst, "{before:?} -> {after:?}");
    assert_eq!(recv_within(&flood, Duration::from_millis(1)), None);
    // The machine's own heartbeats kept it alive throughout.
    let m = c
        .machines()
        .into_iter()
        .find(|m| m["metadata"]["name"] == name_a.as_str())
        .unwrap();
    assert!(m["status"]["lastHeartbeatTime"].is_string(), "{m:#}");
}

#[test]
fn a_revoked_machines_datagrams_do_not_keep_it_alive() {
    use drover_common::wire::datagram::{self, Answer, Beat, Verdict};
    let (tmp, c, boot) = coordinator_with_token("default", "env=x", 1, "1h");
    let mut a = Agent::start(&tmp.path().join("a"), "a", &boot);
    wait_machines(&c, 1);
    // The certificate is stolen; the real agent is gone.
    let (cert, key, name) = identity_of(&c, &a);
    a.kill();
    let report = drover_common::wire::HeartbeatRequest {
        datagrams: true,
        ..Default::default()
    };
    let digest = drover_common::wire::status_digest(&report);
    let (id, hk) = offer_of(&c, (&cert, &key), &report);
    let coordinator: std::net::SocketAddr = format!("127.0.0.1:{}", c.port).parse().unwrap();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let beat = || {
        Beat {
            id,
            counter: datagram::unix_micros(std::time::SystemTime::now()),
            generation: 0,
            digest,
        }
        .encode(&hk)
    };
    // Before the revocation a datagram is a heartbeat.
    socket.send_to(&beat(), coordinator).unwrap();
    let answer = recv_within(&socket, Duration::from_secs(10)).expect("an answer");
    assert_eq!(
        Answer::decode(&answer, &hk).unwrap().verdict,
        Verdict::Quiet
    );

    c.cli_ok(&["revoke", "machine", &name]);
    let last_heartbeat = || {
        let m = c
            .machines()
            .into_iter()
            .find(|m| m["metadata"]["name"] == name.as_str())
            .unwrap();
        time::OffsetDateTime::parse(
            m["status"]["lastHeartbeatTime"].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
    };
    let at_revocation = last_heartbeat();
    // A datagram a second with the stolen key, for more than two seconds:
    // each is handled (counted) and none is answered "quiet" or counts as
    // a heartbeat.
    let mut sent = 0;
    wait_for(
        "datagrams sent for two seconds after the revocation",
        Duration::from_secs(30),
        || {
            let before = datagram_counts(&c);
            socket.send_to(&beat(), coordinator).unwrap();
            sent += 1;
            wait_for("the datagram handled", Duration::from_secs(10), || {
                let after = datagram_counts(&c);
                let handled: u64 = after.values().sum::<u64>() - before.values().sum::<u64>();
                (handled >= 1).then_some(()).ok_or(format!("{after:?}"))
            });
            if let Some(answer) = recv_within(&socket, Duration::from_millis(1)) {
                assert_ne!(
                    Answer::decode(&answer, &hk).unwrap().verdict,
                    Verdict::Quiet,
                    "a revoked machine's datagram answered quiet"
                );
            }
            let elapsed = time::OffsetDateTime::now_utc() - at_revocation;
            (elapsed > time::Duration::seconds(2))
                .then_some(())
                .ok_or(format!("{sent} sent, {elapsed} since the revocation"))
        },
    );
    assert_eq!(
        last_heartbeat(),
        at_revocation,
        "{sent} datagrams after the revocation moved the machine's last heartbeat"
    );
    let counts = datagram_counts(&c);
    assert!(
        counts.get("unknown_machine").copied().unwrap_or(0) >= 1,
        "the revocation dropped the machine's datagram entry at once: {counts:?}"
    );
}

/// A Secret document holding `bytes` letters under key `v`.
fn letters_secret(name: &str, bytes: usize) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "drover.dev/v1alpha1",
        "kind": "Secret",
        "metadata": {"name": name},
        "stringData": {"v": "a".repeat(bytes)},
    })
}

/// `n` files under `/etc/<dir>/` that read Secret `blob` key `v`, as list
/// items indented by `indent` spaces (`[]` when there are none).
fn files_reading_blob(n: usize, dir: &str, indent: usize) -> String {
    if n == 0 {
        return " []\n".into();
    }
    let pad = " ".repeat(indent);
    let items: String = (0..n)
        .map(|i| {
            format!("{pad}- path: /etc/{dir}/{i}\n{pad}  contentFrom: {{secret: blob, key: v}}\n")
        })
        .collect();
    format!("\n{items}")
}

/// A pool cluster with one control plane and pool `gpu` (`workers`
/// machines); `spec_files` and `pool_files` files read Secret `blob`.
fn blob_cluster_yaml(
    name: &str,
    workers: u32,
    spec_files: usize,
    pool_files: usize,
    env: &str,
) -> String {
    let spec = format!(
        "  files:{}  controlPlane:\n    replicas: 1\n  workerPools:\n    - name: gpu\n      replicas: {workers}\n      files:{}{}",
        files_reading_blob(spec_files, "spec", 4),
        files_reading_blob(pool_files, "gpu", 8),
        pool_provider(env),
    );
    cluster_doc(name, &spec)
}

#[test]
fn config_bundles_over_the_cap_are_refused_at_apply_naming_the_pool_and_size() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    let api = c.api(None);
    let token = c.admin_token.clone();
    let put_yaml = |path: &str, yaml: String| {
        api.send(
            "PUT",
            path,
            Some(&token),
            Some(("application/yaml", yaml.into_bytes())),
        )
    };
    let a = api.json(
        "PUT",
        "/v1/secrets/blob",
        Some(&token),
        &letters_secret("blob", 200 * 1024),
    );
    assert_eq!(a.status, 201, "{a:?}");

    // The attack: a small spec whose 128 files read one 200 KiB value, a
    // bundle of 26 MB for every worker.
    let refused = put_yaml("/v1/clusters/big", blob_cluster_yaml("big", 1, 64, 64, "x"));
    refused.assert_problem(422, "over the cap of 4 MiB");
    let errors = refused.json()["errors"].as_array().unwrap().clone();
    let error_of = |field: &str| {
        errors
            .iter()
            .find(|e| e["field"] == field)
            .unwrap_or_else(|| panic!("no error for {field}: {errors:#?}"))["message"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let workers = error_of("spec.workerPools[0]");
    assert!(
        workers.contains("a machine of pool gpu")
            && workers.contains("over the cap of 4194304 bytes")
            && workers.contains("read a large Secret value from fewer files"),
        "{workers}"
    );
    // 128 x 200 KiB, and the bundle's own part.
    let bytes: usize = workers
        .split("up to ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{workers}"));
    assert!(bytes > 128 * 200 * 1024, "{workers}");
    assert!(error_of("spec.controlPlane").contains("pool control-plane"));
    assert!(c.cluster("big").is_none());
    // The CLI says the same.
    let f = tmp.path().join("big.yaml");
    std::fs::write(&f, blob_cluster_yaml("big", 1, 64, 64, "x")).unwrap();
    let out = c.cli(&["apply", "-f", f.to_str().unwrap()]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success() && text.contains("spec.workerPools[0]") && text.contains("pool gpu"),
        "{text}"
    );

    // Sixteen files of 200 KiB fit; the same files of 256 KiB would not,
    // so the Secret may not grow to that.
    let a = put_yaml("/v1/clusters/big", blob_cluster_yaml("big", 1, 0, 16, "x"));
    assert_eq!(a.status, 201, "{a:?}");
    let grown = api.json(
        "PUT",
        "/v1/secrets/blob",
        Some(&token),
        &letters_secret("blob", 256 * 1024),
    );
    grown.assert_problem(422, "over the cap of 4 MiB");
    let message = grown.json()["errors"][0]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("cluster big spec.workerPools[0] reads this Secret")
            && message.contains("pool gpu"),
        "{message}"
    );
    let kept = api.send("GET", "/v1/secrets/blob", Some(&token), None);
    assert_eq!(kept.json()["keys"][0]["bytes"], 200 * 1024, "{kept:?}");
}

/// Reads an answer's head (status line and headers, lower-cased) and
/// whatever of its body came with it.
async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> (String, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            return (head, buf[end + 4..].to_vec());
        }
        let n = tokio::time::timeout(Duration::from_secs(60), s.read(&mut chunk))
            .await
            .expect("an answer within 60 s")
            .unwrap();
        assert!(n > 0, "closed before the head ended: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A header's value in a lower-cased head.
fn header_of<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map(str::trim)
}

#[test]
fn one_config_fetch_per_machine_is_served_at_a_time() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tmp, c, boot) = coordinator_with_token("default", "env=one", 1, "1h");
    let agent = Agent::start(&tmp.path().join("a"), "a", &boot);
    wait_machines(&c, 1);
    let a = c.api(None).json(
        "PUT",
        "/v1/secrets/blob",
        Some(&c.admin_token),
        &letters_secret("blob", 200 * 1024),
    );
    assert_eq!(a.status, 201, "{a:?}");
    // A bundle of about 3.3 MB: 16 files of 200 KiB.
    apply(&c, tmp.path(), &blob_cluster_yaml("one", 0, 16, 0, "one"));
    c.wait_cluster_phase("one", "Running", BOOT);
    let (cert, key, name) = identity_of(&c, &agent);
    let uid = agent.state()["machineUid"].as_str().unwrap().to_owned();
    let ca = drover_common::pki::first_cert_der(&c.ca_pem()).unwrap();
    let tls = std::sync::Arc::new(client_tls(&c.ca_pem(), Some((&cert, &key))));
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", c.port).parse().unwrap();
    let loopback: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let request =
        b"GET /v1/machine/config HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Eight fetches at once with one machine's certificate, as often as it
    // takes for them to meet: every answer is a whole, verified bundle or
    // a 429 saying when to ask again, and while one is served every other
    // is refused, so no two bundles of the machine are ever built at once.
    let mut rounds = 0;
    wait_for(
        "eight concurrent fetches of which some were refused",
        Duration::from_secs(120),
        || {
            rounds += 1;
            let answers = rt.block_on(async {
                let mut fetches = tokio::task::JoinSet::new();
                for _ in 0..8 {
                    let tls = tls.clone();
                    fetches.spawn(async move {
                        let mut s = tls_from(loopback, addr, tls).await.unwrap();
                        s.write_all(request).await.unwrap();
                        let (head, mut body) = read_head(&mut s).await;
                        tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut body))
                            .await
                            .expect("the whole answer within 60 s")
                            .unwrap();
                        (head, body)
                    });
                }
                let mut answers = Vec::new();
                while let Some(answer) = fetches.join_next().await {
                    answers.push(answer.unwrap());
                }
                answers
            });
            let (mut served, mut refused) = (0, 0);
            for (head, body) in answers {
                let text = || String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned();
                if head.starts_with("http/1.1 200") {
                    let length: usize = header_of(&head, "content-length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_else(|| panic!("no content-length: {head}"));
                    assert_eq!(body.len(), length, "an answer was cut: {head}");
                    assert!(length > 3_000_000, "{length}");
                    let signed: drover_common::bundle::SignedBundle =
                        serde_json::from_slice(&body).unwrap();
                    let bundle = drover_common::bundle::verify(&signed, &ca, &uid).unwrap();
                    assert_eq!(bundle.machine_files.len(), 16);
                    served += 1;
                } else {
                    assert!(head.starts_with("http/1.1 429"), "{head}\n{}", text());
                    let retry: u64 = header_of(&head, "retry-after")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_else(|| panic!("no Retry-After: {head}"));
                    assert!((1..=5).contains(&retry), "{head}");
                    assert_eq!(
                        header_of(&head, "content-type"),
                        Some("application/problem+json")
                    );
                    assert!(
                        text().contains(&format!("machine {name} is being served")),
                        "{}",
                        text()
                    );
                    refused += 1;
                }
            }
            assert!(served >= 1, "round {rounds}: none of the eight was served");
            if refused > 0 {
                Ok(())
            } else {
                Err(format!(
                    "round {rounds}: all {served} were served one after another"
                ))
            }
        },
    );
}

#[test]
fn viewers_see_sizes_and_hashes_of_machine_files_commands_and_addons_not_their_text() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    let content = "token = FILE-SECRET-4711\n";
    let spec = format!(
        "  files:
    - path: /etc/hush/app.conf
      permissions: \"0600\"
      content: {content:?}
  preKubeadmCommands: [\"echo PRE-SECRET-1\"]
  postKubeadmCommands: [\"echo POST-SECRET-2\"]
  controlPlane:
    replicas: 1
    preKubeadmCommands: [\"echo CP-SECRET-3\"]
  workerPools:
    - name: gpu
      replicas: 0
      files:
        - path: /etc/hush/gpu.conf
          content: GPU-SECRET-5
      postKubeadmCommands: [\"echo POOL-SECRET-6\"]
  addons:
    - name: extra
      manifests: |
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: extra
        data:
          key: ADDON-SECRET-7
{}",
        pool_provider("hush")
    );
    apply(&c, tmp.path(), &cluster_doc("hush", &spec));
    let secrets = [
        "FILE-SECRET-4711",
        "PRE-SECRET-1",
        "POST-SECRET-2",
        "CP-SECRET-3",
        "GPU-SECRET-5",
        "POOL-SECRET-6",
        "ADDON-SECRET-7",
    ];
    let viewer = c.create_admin_token("viewer");
    let api = c.api(None);
    let shown = drover_common::api::hidden_text(content);
    assert!(
        shown.starts_with(&format!(
            "<hidden from viewers: {} bytes, sha256:",
            content.len()
        )) && shown.len() == "<hidden from viewers: 25 bytes, sha256:>".len() + 64,
        "{shown}"
    );
    let assert_hidden = |what: &str, text: &str| {
        for s in secrets {
            assert!(!text.contains(s), "{what} shows {s} to a viewer: {text}");
        }
    };
    // The API, which `get`, `get --watch` and `describe -o yaml` read.
    for path in ["/v1/clusters", "/v1/clusters/hush"] {
        let a = api.send("GET", path, Some(&viewer), None);
        assert_eq!(a.status, 200, "{a:?}");
        assert_hidden(path, &a.body);
        let v = a.json();
        let cluster = if v.is_array() { &v[0] } else { &v };
        let file = &cluster["spec"]["files"][0];
        assert_eq!(file["path"], "/etc/hush/app.conf");
        assert_eq!(file["permissions"], "0600");
        assert_eq!(file["content"], shown.as_str(), "{file}");
        let pre = cluster["spec"]["preKubeadmCommands"][0].as_str().unwrap();
        assert!(
            pre.starts_with("<hidden from viewers: 17 bytes, sha256:"),
            "{pre}"
        );
        // Admins see what was applied.
        let admin = api.send("GET", path, Some(&c.admin_token), None);
        for s in secrets {
            assert!(admin.body.contains(s), "{s} not shown to an admin");
        }
    }
    // The CLI with a viewer token.
    for args in [
        &["get", "clusters", "-o", "yaml"][..],
        &["describe", "cluster", "hush", "-o", "yaml"][..],
        &["describe", "cluster", "hush"][..],
    ] {
        let out = c
            .cli_command(args)
            .env("DROVER_TOKEN", &viewer)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{args:?}: {text}");
        assert_hidden(&format!("{args:?}"), &text);
    }
    // The web view and the metrics.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured((*anonymous_tls(&c.ca_pem())).clone())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    rt.block_on(async {
        let login = client
            .post(format!("{}/ui/login", c.url()))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={viewer}"))
            .send()
            .await
            .unwrap();
        let cookie = login
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .expect("a session cookie")
            .to_owned();
        for page in ["/ui", "/ui/clusters", "/ui/clusters/hush"] {
            let answer = client
                .get(format!("{}{page}", c.url()))
                .header("cookie", &cookie)
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 200, "{page}");
            assert_hidden(page, &answer.text().await.unwrap());
        }
    });
    let metrics = api.send("GET", "/metrics", Some(&viewer), None);
    assert_hidden("/metrics", &metrics.body);

    // What a viewer was shown cannot be applied back by mistake.
    let copy = api
        .send("GET", "/v1/clusters/hush", Some(&viewer), None)
        .json();
    let mut doc = copy.clone();
    doc["metadata"]["resourceVersion"] = serde_json::Value::Null;
    let a = api.json("PUT", "/v1/clusters/hush", Some(&c.admin_token), &doc);
    a.assert_problem(422, "is what a viewer token is shown in place of the text");
    let fields: Vec<String> = a.json()["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap().to_owned())
        .collect();
    for field in [
        "spec.files[0].content",
        "spec.preKubeadmCommands[0]",
        "spec.workerPools[0].files[0].content",
        "spec.addons[0].manifests",
    ] {
        assert!(
            fields.iter().any(|f| f == field),
            "{field} not in {fields:?}"
        );
    }
    let kept = api.send("GET", "/v1/clusters/hush", Some(&c.admin_token), None);
    assert!(kept.body.contains("FILE-SECRET-4711"), "{kept:?}");
}

/// The CA of a cluster, from the kubeconfig `drover kubeconfig` prints.
fn cluster_ca(c: &Coordinator, cluster: &str) -> String {
    use base64::Engine;
    let kubeconfig = c.cli_ok(&["kubeconfig", cluster]);
    let parsed: serde_json::Value = serde_saphyr::from_str(&kubeconfig).unwrap();
    let data = parsed["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .unwrap_or_else(|| panic!("no CA in {kubeconfig}"));
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .unwrap();
    String::from_utf8(pem).unwrap()
}

/// A TLS handshake from `source` with the API server behind the managed
/// endpoint at `addr` (its certificate names the endpoint's address):
/// `Ok` holding the connection, or why not within 10 s.
async fn through_endpoint(
    source: std::net::IpAddr,
    addr: std::net::SocketAddr,
    tls: std::sync::Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let attempt = async {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(std::net::SocketAddr::new(source, 0))?;
        let tcp = socket.connect(addr).await?;
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
    };
    match tokio::time::timeout(Duration::from_secs(10), attempt).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!("closed: {e}")),
        Err(_) => Err("hung: no handshake and no close within 10 s".to_owned()),
    }
}

/// The managed endpoints' proxy figures from the metrics.
fn endpoint_proxy_figures(c: &Coordinator) -> std::collections::BTreeMap<String, u64> {
    c.metrics_text()
        .lines()
        .filter_map(|l| l.strip_prefix("drover_endpoint_proxy_"))
        .filter_map(|l| {
            let (series, value) = l.split_once("} ")?;
            Some((format!("{series}}}"), value.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn endpoint_floods_are_capped_and_leave_the_coordinator_its_files() {
    let tmp = tempfile::tempdir().unwrap();
    // As the attack found it: 1,024 open files, which 600 proxied
    // connections (two files each) took. The proxy's total is then an
    // eighth of them, 128; one source may hold 64.
    let c = Coordinator::start_limited(
        tmp.path(),
        CoordinatorOptions::default(),
        &["--endpoint-max-connections-per-source", "64"],
        1024,
    );
    let boot = tmp.path().join("boot.yaml");
    c.token("default", "env=ep", 1, "1h", &boot);
    let _agent = Agent::start(&tmp.path().join("m"), "m", &boot);
    wait_machines(&c, 1);
    let yaml = pool_cluster_yaml("ep", 1, 0, "ep").replace(
        "          env: ep\n",
        "          env: ep\n  controlPlaneEndpoint:\n    managed: coordinator\n",
    );
    c.apply_until_running(tmp.path(), "ep", &yaml, BOOT);
    let port = c.cluster("ep").unwrap()["status"]["endpointPort"]
        .as_u64()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let tls = anonymous_tls(&cluster_ca(&c, "ep"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
    wait_for("a handshake through the endpoint", BOOT, || {
        rt.block_on(through_endpoint(ip("127.0.0.1"), addr, tls.clone()))
            .map(drop)
    });

    // 600 connections from four sources, 150 each, one source after the
    // other, every one of them kept open once through.
    let mut held = vec![];
    let mut per_source = vec![];
    for source in ["127.0.3.1", "127.0.3.2", "127.0.3.3", "127.0.3.4"] {
        let attempts: Vec<_> = (0..150)
            .map(|_| rt.spawn(through_endpoint(ip(source), addr, tls.clone())))
            .collect();
        let mut through = 0;
        for a in attempts {
            match rt.block_on(a).unwrap() {
                Ok(s) => {
                    through += 1;
                    held.push(s);
                }
                Err(e) => assert!(e.starts_with("closed"), "from {source}: {e}"),
            }
        }
        per_source.push(through);
    }
    // One source got its 64 and no more, all of them together the total
    // at most; every other connection was closed at once.
    assert_eq!(per_source[0], 64, "{per_source:?}");
    assert!(held.len() <= 128, "{} held: {per_source:?}", held.len());
    assert!(
        per_source[2..].iter().all(|n| *n <= 1),
        "past the total: {per_source:?}"
    );

    // While they are held, the coordinator answers: /livez, and an admin
    // list through the CLI.
    // (A coordinator out of files never answers: the client's own 30 s
    // timeout fails the request.)
    let api = c.api(None);
    let livez = api.send("GET", "/livez", None, None);
    assert_eq!(livez.status, 200, "{livez:?}");
    let mut list = c
        .cli_command(&["get", "machines"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let listed = wait_for("drover get machines", Duration::from_secs(20), || {
        list.try_wait()
            .unwrap()
            .ok_or_else(|| "still running".to_owned())
    });
    assert!(listed.success());

    // Refusals are counted, and logged once per source, not per connection.
    let figures = wait_for(
        "the refusals in the metrics",
        Duration::from_secs(10),
        || {
            let f = endpoint_proxy_figures(&c);
            let refused = f.get("closed{reason=\"per_source\"}").copied().unwrap_or(0)
                + f.get("closed{reason=\"total\"}").copied().unwrap_or(0);
            if refused >= 600 - 128
                && f.get("connections{state=\"open\"}") >= Some(&(held.len() as u64))
            {
                Ok(f)
            } else {
                Err(format!("{f:?}"))
            }
        },
    );
    assert!(
        figures["closed{reason=\"per_source\"}"] >= 86,
        "{figures:?}"
    );
    let warnings = c
        .output()
        .lines()
        .filter(|l| l.contains("endpoint refusing connections"))
        .count();
    assert!((1..=6).contains(&warnings), "{warnings} refusal warnings");

    // Once the flood lets go, its sources are served again.
    drop(held);
    wait_for(
        "a flooding source through the endpoint again",
        Duration::from_secs(20),
        || {
            rt.block_on(through_endpoint(ip("127.0.3.3"), addr, tls.clone()))
                .map(drop)
        },
    );
}
