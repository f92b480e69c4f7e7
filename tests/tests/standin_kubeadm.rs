//! Tests of the strict stand-in `kubeadm` binary: every machine is a temporary
//! root directory passed as `--rootfs`; the stand-in daemons are stopped by a
//! guard (`kubeadm reset -f`, then SIGKILL of leftover pids) even on failure.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_common::kubeadm::{
    kubeadm_patch_files, render_init, render_join, ClusterParams, NodeHost, NodeParams,
};
use drover_common::pin::CaPin;
use drover_common::pki::CertificateAuthority;
use drover_common::token::BootstrapToken;
use serde_json::Value;

const KUBEADM: &str = env!("CARGO_BIN_EXE_kubeadm");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral port")
        .local_addr()
        .expect("local addr")
        .port()
}

/// A process exists and is not a zombie.
fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z') | Some('X') | None
        ),
        Err(_) => false,
    }
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One machine: a root directory. Dropping it resets the machine.
struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    /// A machine with a CNI network configuration, so its Node goes Ready.
    fn new() -> Self {
        let m = Self::without_network();
        m.write(
            "/etc/cni/net.d/10-bridge.conflist",
            drover_tests::BRIDGE_CNI_CONFLIST,
        );
        m
    }

    /// A machine whose container runtime has no pod network yet.
    fn without_network() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp root"),
        }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The host path of a path inside the machine.
    fn path(&self, logical: &str) -> PathBuf {
        self.root().join(logical.trim_start_matches('/'))
    }

    fn write(&self, logical: &str, contents: &str) {
        let p = self.path(logical);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, contents).unwrap();
    }

    /// Writes the kubeadm patches Drover gives `node`'s machine, where the
    /// agent writes its bundle's files.
    fn write_patches(&self, node: &NodeParams) {
        for f in kubeadm_patch_files(node) {
            self.write(&f.path, &f.content);
        }
    }

    /// Writes the kubeadm config Drover rendered for `node` and the
    /// patches it names, as the agent does.
    fn configure(&self, config: &str, node: &NodeParams) {
        self.write(CONFIG, config);
        self.write_patches(node);
    }

    /// Runs `kubeadm <args> --rootfs <root>`.
    fn kubeadm(&self, args: &[&str]) -> Output {
        let mut all: Vec<&str> = args.to_vec();
        let root = self.root().to_str().unwrap().to_owned();
        all.push("--rootfs");
        all.push(&root);
        run(&all)
    }

    /// [`Machine::kubeadm`] with a stand-in kubeadm (and kubelet) of
    /// `version`, as an image of that version has.
    fn kubeadm_at(&self, version: &str, args: &[&str]) -> Output {
        let root = self.root().to_str().unwrap().to_owned();
        Command::new(KUBEADM)
            .args(args)
            .args(["--rootfs", &root])
            .env("DROVER_STANDIN_KUBEADM_VERSION", version)
            .output()
            .expect("run the stand-in kubeadm")
    }

    fn pids(&self) -> Vec<i32> {
        let Ok(rd) = std::fs::read_dir(self.path("/run/standin")) else {
            return vec![];
        };
        rd.filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|s| s.trim().parse().ok())
            .collect()
    }

    fn invocations(&self) -> Vec<Value> {
        std::fs::read_to_string(self.path("/var/log/kubeadm-invocations.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("invocation log line is JSON"))
            .collect()
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let pids = self.pids();
        let _ = self.kubeadm(&["reset", "-f"]);
        for pid in pids {
            if pid_alive(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

fn run(args: &[&str]) -> Output {
    Command::new(KUBEADM)
        .args(args)
        .output()
        .expect("run the stand-in kubeadm")
}

/// `kubeadm token create TOKEN` with `flags`, as the cluster's admin.
fn token_create(c: &Cluster, token: &BootstrapToken, flags: &[&str]) -> Output {
    let token = token.to_string();
    let admin = c.cp.path("/etc/kubernetes/admin.conf");
    let mut args = vec!["token", "create", &token];
    args.extend_from_slice(flags);
    args.extend(["--kubeconfig", admin.to_str().unwrap()]);
    run(&args)
}

/// Real kubectl with the cluster's `admin.conf`: whether it succeeded,
/// and its output.
fn kubectl_as(c: &Cluster, args: &[&str]) -> (bool, String) {
    let out = kubectl_output(c, args);
    (out.status.success(), text(&out))
}

/// What real kubectl with the cluster's `admin.conf` printed.
fn kubectl_output(c: &Cluster, args: &[&str]) -> Output {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(c.cp.path("/etc/kubernetes/admin.conf"))
        .args(["--request-timeout", "5s"])
        .args(args)
        .output()
        .expect("run kubectl")
}

/// What real kubectl with the cluster's `admin.conf` printed to stdout;
/// it must succeed.
fn kubectl_ok(c: &Cluster, args: &[&str]) -> String {
    let out = kubectl_output(c, args);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Real kubectl's server-side apply of `manifests`, written to `file`
/// first, as Drover's agent runs it.
fn server_side_apply(c: &Cluster, file: &Path, manifests: &str) -> Output {
    std::fs::write(file, manifests).unwrap();
    kubectl_output(
        c,
        &[
            "apply",
            "--server-side",
            "--field-manager=drover",
            "--validate=false",
            "-f",
            file.to_str().unwrap(),
        ],
    )
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn assert_ok(o: &Output) {
    assert!(o.status.success(), "kubeadm failed: {}", text(o));
}

/// Asserts that kubeadm succeeded and said `needle`.
fn assert_ok_saying(o: &Output, needle: &str) {
    assert_ok(o);
    assert!(text(o).contains(needle), "lacks {needle:?}: {}", text(o));
}

fn assert_fails_with(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(1), "expected exit 1: {}", text(o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(needle),
        "stderr lacks {needle:?}: {}",
        text(o)
    );
}

/// The shared CA set of one cluster.
struct SharedCas {
    ca: CertificateAuthority,
    front_proxy: CertificateAuthority,
    etcd: CertificateAuthority,
    sa_key: String,
    sa_pub: String,
}

impl SharedCas {
    fn generate() -> Self {
        let sa = rcgen::KeyPair::generate().unwrap();
        Self {
            ca: CertificateAuthority::generate("kubernetes").unwrap(),
            front_proxy: CertificateAuthority::generate("front-proxy-ca").unwrap(),
            etcd: CertificateAuthority::generate("etcd-ca").unwrap(),
            sa_key: sa.serialize_pem(),
            sa_pub: sa.public_key_pem(),
        }
    }

    fn pin(&self) -> CaPin {
        CaPin::from_cert_der(&self.ca.cert_der()).unwrap()
    }

    fn provision(&self, m: &Machine) {
        let pki = "/etc/kubernetes/pki";
        for (name, ca) in [
            ("ca", &self.ca),
            ("front-proxy-ca", &self.front_proxy),
            ("etcd/ca", &self.etcd),
        ] {
            m.write(&format!("{pki}/{name}.crt"), &ca.cert_pem);
            m.write(&format!("{pki}/{name}.key"), &ca.key_pem);
        }
        m.write(&format!("{pki}/sa.key"), &self.sa_key);
        m.write(&format!("{pki}/sa.pub"), &self.sa_pub);
    }
}

/// A self-signed certificate with keyCertSign, CA:TRUE only if `is_ca`.
fn self_signed_ca(alg: &'static rcgen::SignatureAlgorithm, is_ca: bool) -> (String, String) {
    let key = rcgen::KeyPair::generate_for(alg).unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = if is_ca {
        rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained)
    } else {
        rcgen::IsCa::ExplicitNoCa
    };
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let cert = p.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// The first control plane's own loopback address and API server port
/// make the cluster's endpoint.
fn cluster_params(address: &str, api_port: u16) -> ClusterParams {
    ClusterParams {
        cluster_name: "demo".into(),
        kubernetes_version: "v1.31.2".into(),
        control_plane_endpoint: format!("{address}:{api_port}"),
        pod_subnet: "10.244.0.0/16".into(),
        service_subnet: "10.96.0.0/12".into(),
        dns_domain: "cluster.local".into(),
        nodes: NodeHost::Machine,
    }
}

/// A node on its own loopback address (its etcd listens on 2379/2380).
fn node_params(name: &str, address: &str, api_port: u16) -> NodeParams {
    NodeParams {
        node_name: name.into(),
        advertise_address: address.into(),
        api_server_port: api_port,
        kubelet_healthz_port: free_port(),
        provider_id: drover_common::kubeadm::drover_provider_id("standin", name),
    }
}

const CONFIG: &str = "/etc/drover/kubeadm.yaml";

/// An initialised single control-plane cluster.
struct Cluster {
    cas: SharedCas,
    params: ClusterParams,
    token: BootstrapToken,
    cp: Machine,
    cp_node: NodeParams,
}

fn init_cluster() -> Cluster {
    let api_port = free_port();
    let address = drover_tests::free_loopback();
    let params = cluster_params(&address, api_port);
    let token = BootstrapToken::generate();
    let cas = SharedCas::generate();
    let cp = Machine::new();
    cas.provision(&cp);
    let cp_node = node_params("cp-1", &address, api_port);
    cp.configure(&render_init(&params, &cp_node, &token, 900), &cp_node);
    let out = cp.kubeadm(&["init", "--config", CONFIG]);
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("Your Kubernetes control-plane has initialized successfully!"));
    Cluster {
        cas,
        params,
        token,
        cp,
        cp_node,
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A TLS client configuration trusting the first certificate of
/// `ca_pem`, presenting `identity` (certificates and key) when given.
fn tls_trusting(
    ca_pem: &str,
    identity: Option<(
        Vec<rustls::pki_types::CertificateDer<'static>>,
        rustls::pki_types::PrivateKeyDer<'static>,
    )>,
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    let der = drover_common::pki::first_cert_der(ca_pem).unwrap();
    roots.add(der.into()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    match identity {
        Some((certs, key)) => builder.with_client_auth_cert(certs, key).unwrap(),
        None => builder.with_no_client_auth(),
    }
}

/// An HTTPS client over `tls`, without proxies, giving up after 5 s.
fn https_client(tls: rustls::ClientConfig) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// GET `path` anonymously from the cluster's endpoint, verified with its CA.
fn endpoint_get(c: &Cluster, path: &str) -> (u16, String) {
    https_get(
        &format!("https://{}{path}", c.params.control_plane_endpoint),
        &c.cas.ca.cert_pem,
    )
}

/// GET over TLS verified with the cluster CA, optionally with a client cert.
fn https_get(url: &str, ca_pem: &str) -> (u16, String) {
    let client = https_client(tls_trusting(ca_pem, None));
    block_on(async {
        let r = client.get(url).send().await.expect("GET");
        let code = r.status().as_u16();
        (code, r.text().await.unwrap())
    })
}

fn http_get(url: &str) -> Option<(u16, String)> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    block_on(async {
        let r = client.get(url).send().await.ok()?;
        let code = r.status().as_u16();
        Some((code, r.text().await.ok()?))
    })
}

fn cluster_info(c: &Cluster) -> Value {
    let (code, body) = endpoint_get(c, "/api/v1/namespaces/kube-public/configmaps/cluster-info");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The etcd member list as real `etcdctl` sees it, with `m`'s API server
/// client certificate (taken before `m` resets).
fn etcd_members(m: &Machine, endpoint: &str) -> Vec<Value> {
    drover_tests::kube::etcd_members(&m.path("/etc/kubernetes/pki"), endpoint)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn worker_join(
    c: &Cluster,
    name: &str,
    token: &BootstrapToken,
    pin: &CaPin,
) -> (Machine, NodeParams, Output) {
    let m = Machine::new();
    let (node, out) = join_worker_on(c, &m, name, token, pin);
    (m, node, out)
}

/// `kubeadm join` of machine `m` as worker `name` into `c`.
fn join_worker_on(
    c: &Cluster,
    m: &Machine,
    name: &str,
    token: &BootstrapToken,
    pin: &CaPin,
) -> (NodeParams, Output) {
    let node = node_params(name, &drover_tests::free_loopback(), 0);
    m.configure(&render_join(&c.params, &node, token, pin, false), &node);
    let out = m.kubeadm(&["join", "--config", CONFIG]);
    (node, out)
}

/// `kubeadm join --control-plane` of a new machine named `name` into `c`,
/// with a stand-in kubeadm (and kubelet) of `version`; its machine, API
/// server URL and output.
fn control_plane_join(c: &Cluster, name: &str, version: &str) -> (Machine, String, Output) {
    let m = Machine::new();
    c.cas.provision(&m);
    let port = free_port();
    let address = drover_tests::free_loopback();
    let node = node_params(name, &address, port);
    m.configure(
        &render_join(&c.params, &node, &c.token, &c.cas.pin(), true),
        &node,
    );
    let out = m.kubeadm_at(version, &["join", "--config", CONFIG]);
    (m, format!("https://{address}:{port}"), out)
}

/// The `gitVersion` an API server's `/version` answers.
fn api_server_version(c: &Cluster, api: &str) -> String {
    let (code, body) = https_get(&format!("{api}/version"), &c.cas.ca.cert_pem);
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["gitVersion"].as_str().unwrap().to_owned()
}

#[test]
fn a_control_plane_joins_at_the_version_kubeadm_config_names() {
    let c = init_cluster();
    let cp1 = format!("https://{}", c.params.control_plane_endpoint);
    assert_eq!(api_server_version(&c, &cp1), "v1.31.2");
    let kubectl = |args: &[&str]| kubectl_as(&c, args);
    const PATH: &str = "/api/v1/namespaces/kube-system/configmaps/kubeadm-config";
    let read = || {
        let out = kubectl_output(&c, &["get", "--raw", PATH]);
        assert_ok(&out);
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    // Real kubectl moves the config to v1.32.0, as `kubeadm upgrade apply`
    // or the coordinator does before a new control plane joins.
    let before = read();
    let config = before["data"]["ClusterConfiguration"].as_str().unwrap();
    assert!(config.contains("kubernetesVersion: v1.31.2"), "{config}");
    let mut after = before.clone();
    after["data"]["ClusterConfiguration"] = config
        .replace("kubernetesVersion: v1.31.2", "kubernetesVersion: v1.32.0")
        .into();
    let body = c.cp.path("/tmp/kubeadm-config.json");
    std::fs::create_dir_all(body.parent().unwrap()).unwrap();
    std::fs::write(&body, after.to_string()).unwrap();
    let (ok, out) = kubectl(&["replace", "--raw", PATH, "-f", body.to_str().unwrap()]);
    assert!(ok, "{out}");
    let now = read();
    assert!(now["data"]["ClusterConfiguration"]
        .as_str()
        .unwrap()
        .contains("kubernetesVersion: v1.32.0"));
    assert_ne!(
        now["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );
    // The same write again carries a stale resourceVersion: a conflict,
    // nothing lost.
    let (ok, out) = kubectl(&["replace", "--raw", PATH, "-f", body.to_str().unwrap()]);
    assert!(!ok && out.contains("the object has been modified"), "{out}");
    assert_eq!(read(), now);

    // The running API server runs what it was deployed with.
    assert_eq!(api_server_version(&c, &cp1), "v1.31.2");
    // A v1.31 kubeadm cannot deploy the v1.32.0 control plane the config
    // names; a v1.32 one does, and its API server runs v1.32.0.
    let (_old, _, out) = control_plane_join(&c, "cp-old", "v1.31.2");
    assert_fails_with(&out, "Kubernetes version is greater than kubeadm version");
    let (_new, api, out) = control_plane_join(&c, "cp-new", "v1.32.0");
    assert_ok(&out);
    assert_eq!(api_server_version(&c, &api), "v1.32.0");
}

#[test]
fn a_node_is_not_ready_until_its_machine_has_a_cni_network_config() {
    let c = init_cluster();
    // A worker without a network: registered, NotReady, with the real
    // kubelet's reason.
    let w = Machine::without_network();
    let token = c.token.clone();
    let pin = c.cas.pin();
    let (_, out) = join_worker_on(&c, &w, "worker-1", &token, &pin);
    assert_ok(&out);
    let condition = |field: &str| {
        let path = format!("jsonpath={{.status.conditions[?(@.type==\"Ready\")].{field}}}");
        let out = kubectl_output(&c, &["get", "node", "worker-1", "-o", &path]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wait_for(
        "worker-1 registered NotReady",
        Duration::from_secs(20),
        || condition("status") == "False",
    );
    assert!(
        condition("message").contains("container runtime network not ready")
            && condition("message").contains("cni plugin not initialized"),
        "{}",
        condition("message")
    );
    // A file that is not a network configuration changes nothing.
    w.write("/etc/cni/net.d/README", "not a config");
    w.write("/etc/cni/net.d/broken.conflist", "{not json");
    // The kubelet renews its status every 2 s: two renewals later it is
    // still NotReady.
    let renewed = |after: &str| condition("lastHeartbeatTime") != after;
    let first = condition("lastHeartbeatTime");
    wait_for("a renewal", Duration::from_secs(20), || renewed(&first));
    let second = condition("lastHeartbeatTime");
    wait_for("another renewal", Duration::from_secs(20), || {
        renewed(&second)
    });
    assert_eq!(condition("status"), "False");
    // A bridge config: Ready.
    w.write(
        "/etc/cni/net.d/10-bridge.conflist",
        drover_tests::BRIDGE_CNI_CONFLIST,
    );
    wait_for("worker-1 Ready", Duration::from_secs(20), || {
        condition("status") == "True"
    });
    assert_eq!(condition("reason"), "KubeletReady");
}

#[test]
fn nodes_get_distinct_pod_ranges_of_the_pod_subnet_and_a_deleted_nodes_range_is_reused() {
    let c = init_cluster();
    let token = c.token.clone();
    let pin = c.cas.pin();
    let (_w1, n1, out) = worker_join(&c, "worker-1", &token, &pin);
    assert_ok(&out);
    let (_w2, n2, out) = worker_join(&c, "worker-2", &token, &pin);
    assert_ok(&out);
    // What real kubectl reads: name, pod range and InternalIP per Node.
    let nodes = || -> Vec<(String, String, String)> {
        let path = "jsonpath={range .items[*]}{.metadata.name} {.spec.podCIDR} \
                    {.status.addresses[?(@.type==\"InternalIP\")].address}{\"\\n\"}{end}";
        let out = kubectl_output(&c, &["get", "nodes", "-o", path]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace().map(str::to_owned);
                Some((
                    f.next()?,
                    f.next().unwrap_or_default(),
                    f.next().unwrap_or_default(),
                ))
            })
            .collect()
    };
    wait_for("three Nodes", Duration::from_secs(20), || {
        nodes().len() == 3
    });
    let listed = nodes();
    let ranges: std::collections::BTreeSet<&str> =
        listed.iter().map(|(_, r, _)| r.as_str()).collect();
    assert_eq!(ranges.len(), 3, "{listed:?}");
    for (name, range, _) in &listed {
        let (addr, bits) = range.split_once('/').expect("a CIDR");
        assert_eq!(bits, "24", "{name}: {range}");
        assert!(
            addr.starts_with("10.244.") && addr.ends_with(".0"),
            "{name}: {range}"
        );
    }
    // The kubelets report their --node-ip as InternalIP.
    let ip_of = |name: &str| listed.iter().find(|n| n.0 == name).unwrap().2.clone();
    assert_eq!(ip_of("worker-1"), n1.advertise_address);
    assert_eq!(ip_of("worker-2"), n2.advertise_address);
    // The simple list real kubectl users run.
    let out = kubectl_output(
        &c,
        &["get", "nodes", "-o", "jsonpath={.items[*].spec.podCIDR}"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).split(' ').count(), 3);
    // A deleted Node's range goes back to the pool: the next Node gets it.
    let freed = listed.iter().find(|n| n.0 == "worker-1").unwrap().1.clone();
    let (ok, said) = kubectl_as(&c, &["delete", "node", "worker-1"]);
    assert!(ok, "{said}");
    let (_w3, _, out) = worker_join(&c, "worker-3", &token, &pin);
    assert_ok(&out);
    wait_for("worker-3 listed", Duration::from_secs(20), || {
        nodes().iter().any(|n| n.0 == "worker-3")
    });
    let after = nodes();
    assert_eq!(after.len(), 3, "{after:?}");
    let w3 = after.iter().find(|n| n.0 == "worker-3").unwrap();
    assert_eq!(w3.1, freed, "{after:?}");
    // podCIDR is immutable once set, as the API server's Node validation
    // says (pkg/apis/core/validation/validation.go ValidateNodeUpdate).
    let (ok, said) = kubectl_as(
        &c,
        &[
            "patch",
            "node",
            "worker-2",
            "-p",
            r#"{"spec":{"podCIDR":"10.244.99.0/24"}}"#,
        ],
    );
    assert!(!ok && said.contains("podCIDR"), "{said}");
    // Each kubelet registered its Node with its --provider-id (kubeadm's
    // kubeletExtraArgs), and a providerID is the Node's for good too.
    let out = kubectl_output(
        &c,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.spec.providerID} {end}",
        ],
    );
    let ids = String::from_utf8_lossy(&out.stdout).into_owned();
    for name in ["cp-1", "worker-2", "worker-3"] {
        assert!(
            ids.contains(&format!("{name}=drover://standin/{name} ")),
            "{ids}"
        );
    }
    let (ok, said) = kubectl_as(
        &c,
        &[
            "patch",
            "node",
            "worker-2",
            "-p",
            r#"{"spec":{"providerID":"drover://other/worker-2"}}"#,
        ],
    );
    assert!(!ok && said.contains("providerID"), "{said}");
}

#[test]
fn upgrade_apply_and_node_move_the_cluster_one_minor_at_a_time() {
    let c = init_cluster();
    let (w, _, out) = worker_join(&c, "worker-1", &c.token, &c.cas.pin());
    assert_ok(&out);
    wait_for("cp-1 Ready", Duration::from_secs(20), || {
        let ready = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";
        let out = kubectl_output(&c, &["get", "node", "cp-1", "-o", ready]);
        out.status.success() && out.stdout == b"True"
    });
    let cp1 = format!("https://{}", c.params.control_plane_endpoint);
    let apply = |version: &str, args: &[&str]| {
        let all = [&["upgrade", "apply"], args].concat();
        c.cp.kubeadm_at(version, &all)
    };
    let no_renewal = "--certificate-renewal=false";
    // A v1.31 kubeadm cannot upgrade to v1.32, even with --force
    // (policy.go: a minor above kubeadm's own is a mandatory error).
    let out = apply("v1.31.2", &["v1.32.0", "-y", "--force", no_renewal]);
    assert_fails_with(
        &out,
        "\"v1.32.0\" is at least one minor release higher than the kubeadm minor release (32 > 31)",
    );
    // A v1.32.0 kubeadm goes to a later v1.32 patch only with --force.
    let out = apply("v1.32.0", &["v1.32.1", "-y", "--dry-run", no_renewal]);
    assert_fails_with(&out, "is higher than the kubeadm version \"v1.32.0\"");
    assert_fails_with(&out, "Can be bypassed if you pass the --force flag");
    // A v1.33 kubeadm still moves one minor at a time.
    let out = apply("v1.33.0", &["v1.33.0", "-y", "--force", no_renewal]);
    assert_fails_with(&out, "kubeadm can upgrade only 1 minor version at a time");
    // A kubeadm whose minor is above the target's needs --force.
    let out = apply("v1.32.0", &["v1.31.3", "-y", "--dry-run", no_renewal]);
    assert_fails_with(
        &out,
        "Kubeadm version v1.32.0 can only be used to upgrade to Kubernetes version 1.32",
    );
    let out = apply(
        "v1.32.0",
        &["v1.31.3", "-y", "--force", "--dry-run", no_renewal],
    );
    assert_ok_saying(&out, "skipping since the --force flag is set");
    // The health checks: every control-plane static Pod manifest must be
    // there (health.go, StaticPodManifest), unless the check is ignored.
    let scheduler = c.cp.path("/etc/kubernetes/manifests/kube-scheduler.yaml");
    let aside = c.cp.path("/etc/kubernetes/kube-scheduler.yaml.aside");
    std::fs::rename(&scheduler, &aside).unwrap();
    let out = apply("v1.32.0", &["v1.32.0", "-y", "--dry-run", no_renewal]);
    assert_fails_with(&out, "[ERROR StaticPodManifest]");
    let ignored = "--ignore-preflight-errors=StaticPodManifest";
    let out = apply(
        "v1.32.0",
        &["v1.32.0", "-y", "--dry-run", ignored, no_renewal],
    );
    assert_ok_saying(&out, "[WARNING StaticPodManifest]");
    std::fs::rename(&aside, &scheduler).unwrap();
    // It asks before it acts.
    let out = apply("v1.32.0", &["v1.32.0", no_renewal]);
    assert_fails_with(&out, "won't proceed");
    assert_fails_with(
        &apply("v1.32.0", &["v1.32.0", "-y", "--bogus"]),
        "unknown flag: --bogus",
    );
    // Nothing changed so far.
    assert_eq!(api_server_version(&c, &cp1), "v1.31.2");
    let serving =
        || std::fs::read_to_string(c.cp.path("/etc/kubernetes/pki/apiserver.crt")).unwrap();
    let before = serving();
    let out = apply("v1.32.0", &["v1.32.0", "-y"]);
    assert_ok_saying(&out, "SUCCESS! Your cluster was upgraded to \"v1.32.0\"");
    // As with real kubeadm, the certificates were renewed on the way.
    assert!(text(&out).contains("certificate for serving the Kubernetes API renewed"));
    assert_ne!(serving(), before);
    // The control plane runs v1.32.0, the config names it, the old
    // manifests are kept.
    assert_eq!(api_server_version(&c, &cp1), "v1.32.0");
    let out = kubectl_output(
        &c,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/kube-system/configmaps/kubeadm-config",
        ],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("kubernetesVersion: v1.32.0"));
    let backups = std::fs::read_dir(c.cp.path("/etc/kubernetes/tmp"))
        .unwrap()
        .count();
    assert_eq!(
        backups, 3,
        "the manifests' backup, etcd's and the kubelet configuration's"
    );
    // etcd went to the etcd kubeadm v1.32 pairs with it.
    let etcd = std::fs::read_to_string(c.cp.path("/etc/kubernetes/manifests/etcd.yaml")).unwrap();
    assert!(etcd.contains("/etcd:3.5.16-0"), "{etcd}");
    // The worker: a v1.31 kubeadm cannot follow; a v1.32 one does, as the
    // kubelet, with no control plane to upgrade.
    let out = w.kubeadm_at("v1.31.2", &["upgrade", "node", no_renewal]);
    assert_fails_with(&out, "is higher than the kubeadm version");
    let out = w.kubeadm_at("v1.32.0", &["upgrade", "node", no_renewal]);
    assert_ok_saying(&out, "Skipping phase. Not a control plane node.");
    // A second upgrade apply to the same version changes nothing harmful.
    let out = apply("v1.32.0", &["v1.32.0", "-y", no_renewal]);
    assert_ok_saying(&out, "Skipping the renewal of certificates");
}

/// The serving certificate an API server presents, DER.
fn served_certificate(c: &Cluster, api: &str) -> Vec<u8> {
    let addr = api.trim_start_matches("https://");
    let tls = tls_trusting(&c.cas.ca.cert_pem, None);
    let host = addr.rsplit_once(':').unwrap().0.to_owned();
    block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from(host).unwrap();
        let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(name, tcp)
            .await
            .unwrap();
        stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
    })
}

#[test]
fn certs_renew_all_reissues_every_leaf_and_kubeconfig_and_the_api_server_serves_the_new_one() {
    let c = init_cluster();
    let cp1 = format!("https://{}", c.params.control_plane_endpoint);
    let check = || {
        let out = c.cp.kubeadm(&["certs", "check-expiration"]);
        assert_ok(&out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = check();
    for name in [
        "admin.conf",
        "apiserver",
        "etcd-peer",
        "front-proxy-client",
        "scheduler.conf",
    ] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(name) && l.contains("364d")),
            "{name}: {table}"
        );
    }
    let files = [
        "/etc/kubernetes/pki/apiserver.crt",
        "/etc/kubernetes/pki/etcd/server.crt",
        "/etc/kubernetes/admin.conf",
        "/etc/kubernetes/scheduler.conf",
    ];
    let read = || files.map(|f| std::fs::read_to_string(c.cp.path(f)).unwrap());
    let before = read();
    let served_before = served_certificate(&c, &cp1);
    assert_fails_with(
        &c.cp.kubeadm(&["certs", "renew", "apiserver"]),
        "renews only `all`",
    );
    let out = c.cp.kubeadm(&["certs", "renew", "all"]);
    assert_ok_saying(&out, "Done renewing certificates.");
    let after = read();
    for (f, (b, a)) in files.iter().zip(before.iter().zip(after.iter())) {
        assert_ne!(a, b, "{f} was not renewed");
    }
    // The admin kubeconfig still works (real kubectl), and the API server
    // serves its renewed certificate without a restart, as kube-apiserver
    // reloads it.
    let (ok, out) = kubectl_as(&c, &["get", "nodes"]);
    assert!(ok, "{out}");
    wait_for(
        "the renewed serving certificate",
        Duration::from_secs(10),
        || served_certificate(&c, &cp1) != served_before,
    );
}

#[test]
fn version_short() {
    let m = Machine::new();
    let out = m.kubeadm(&["version", "-o", "short"]);
    assert_ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "v1.31.2");
}

#[test]
fn reset_needs_the_cri_socket_on_a_host_with_two_runtimes() {
    // No cluster configuration to read (an interrupted join) and two
    // runtimes' sockets: detection fails, as kubeadm's does.
    let m = Machine::new();
    let mut listeners = Vec::new();
    for s in [
        "/var/run/containerd/containerd.sock",
        "/var/run/crio/crio.sock",
    ] {
        let p = m.path(s);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        listeners.push(std::os::unix::net::UnixListener::bind(&p).unwrap());
    }
    assert_fails_with(
        &m.kubeadm(&["reset", "-f"]),
        "found multiple CRI endpoints on the host",
    );
    // With the socket named, as the agent names it, reset goes through.
    let out = m.kubeadm(&[
        "reset",
        "-f",
        "--cri-socket",
        drover_common::kubeadm::CRI_SOCKET,
    ]);
    assert_ok_saying(&out, drover_common::kubeadm::CRI_SOCKET);
}

#[test]
fn unknown_flags_and_commands_are_refused() {
    let m = Machine::new();
    assert_fails_with(&m.kubeadm(&["init", "--foo"]), "unknown flag: --foo");
    assert_fails_with(
        &m.kubeadm(&["frobnicate"]),
        "unknown command \"frobnicate\"",
    );
    assert_fails_with(
        &m.kubeadm(&["version", "-o", "xml"]),
        "invalid output format: xml",
    );
    assert_fails_with(&m.kubeadm(&["reset"]), "won't proceed");
    // `token create` takes an absolute --kubeconfig; its log goes to the root above it.
    let kubeconfig = m.path("/etc/kubernetes/admin.conf");
    assert_fails_with(
        &run(&[
            "token",
            "create",
            "ABCDEF.0123456789abcdef",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ]),
        "was not of the form",
    );
    // `version` is a query and not recorded; the other four are.
    let log = m.invocations();
    assert_eq!(log.len(), 4, "{log:?}");
    assert!(log.iter().all(|l| l["exit"] == 1), "{log:?}");
    assert!(log.iter().all(|l| l["argv"][1] != "version"), "{log:?}");
    assert_eq!(log[3]["argv"][1], "token");
}

#[test]
fn init_refuses_flags_mixed_with_config() {
    let m = Machine::new();
    let out = m.kubeadm(&["init", "--config", CONFIG, "--token", "abc"]);
    assert_fails_with(&out, "can not mix '--config' with arguments [token]");
    let out = m.kubeadm(&[
        "join",
        "--config",
        CONFIG,
        "--discovery-token-ca-cert-hash",
        "sha256:00",
        "--control-plane",
    ]);
    assert_fails_with(
        &out,
        "can not mix '--config' with arguments [control-plane discovery-token-ca-cert-hash]",
    );
    // Every call is recorded, failures included.
    let log = m.invocations();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0]["exit"], 1);
    assert_eq!(log[0]["argv"][1], "init");
}

#[test]
fn init_refuses_incomplete_or_extra_ca_files() {
    let api_port = free_port();
    let address = drover_tests::free_loopback();
    let params = cluster_params(&address, api_port);
    let cas = SharedCas::generate();
    let cp_node = node_params("cp-1", &address, api_port);
    let config = render_init(&params, &cp_node, &BootstrapToken::generate(), 900);

    let missing = Machine::new();
    cas.provision(&missing);
    std::fs::remove_file(missing.path("/etc/kubernetes/pki/etcd/ca.key")).unwrap();
    missing.configure(&config, &cp_node);
    let out = missing.kubeadm(&["init", "--config", CONFIG]);
    assert_fails_with(&out, "/etc/kubernetes/pki/etcd/ca.key is missing");
    assert!(!missing.path("/etc/kubernetes/admin.conf").exists());

    // `kubeadm init` with the shared CAs, then `files` written over them,
    // fails with `needle`.
    let refused = |config: &str, files: &[(&str, &str)], needle: &str| {
        let m = Machine::new();
        cas.provision(&m);
        for (path, content) in files {
            m.write(path, content);
        }
        m.configure(config, &cp_node);
        assert_fails_with(&m.kubeadm(&["init", "--config", CONFIG]), needle);
    };
    refused(
        &config,
        &[("/etc/kubernetes/pki/apiserver.crt", "left over")],
        "unexpected file /etc/kubernetes/pki/apiserver.crt",
    );
    // Keys must match encryptionAlgorithm: P-256 keys under RSA-2048 are refused.
    refused(
        &config.replace("ECDSA-P256", "RSA-2048"),
        &[],
        "encryptionAlgorithm is RSA-2048",
    );
    // A CA key that is not the certificate's key is refused.
    refused(
        &config,
        &[("/etc/kubernetes/pki/ca.key", cas.etcd.key_pem.as_str())],
        "does not match the certificate",
    );
    // kubeadm refuses Ed25519 CAs, and CA certificates must be CAs.
    let (cert, key) = self_signed_ca(&rcgen::PKCS_ED25519, true);
    let front_proxy = [
        ("/etc/kubernetes/pki/front-proxy-ca.crt", cert.as_str()),
        ("/etc/kubernetes/pki/front-proxy-ca.key", key.as_str()),
    ];
    refused(&config, &front_proxy, "Ed25519");
    let (cert, key) = self_signed_ca(&rcgen::PKCS_ECDSA_P256_SHA256, false);
    let etcd_ca = [
        ("/etc/kubernetes/pki/etcd/ca.crt", cert.as_str()),
        ("/etc/kubernetes/pki/etcd/ca.key", key.as_str()),
    ];
    refused(&config, &etcd_ca, "CA:TRUE");

    // Malformed hashes and tokens in a config are strict decoding errors.
    let bad = Machine::new();
    let join = render_join(
        &params,
        &node_params("w", &drover_tests::free_loopback(), 0),
        &BootstrapToken::generate(),
        &cas.pin(),
        false,
    );
    bad.write(CONFIG, &join.replace(&cas.pin().to_string(), "sha256:1234"));
    assert_fails_with(
        &bad.kubeadm(&["join", "--config", CONFIG]),
        "CA pin must have 64",
    );

    // An unsupported Kubernetes version is refused.
    let old = Machine::new();
    cas.provision(&old);
    old.configure(&config.replace("v1.31.2", "v1.29.0"), &cp_node);
    let out = old.kubeadm(&["init", "--config", CONFIG]);
    assert_fails_with(&out, "control plane version >= 1.30.0");
}

#[test]
fn init_join_token_and_reset() {
    let c = init_cluster();

    // init wrote what kubeadm writes.
    for f in [
        "/etc/kubernetes/admin.conf",
        "/etc/kubernetes/super-admin.conf",
        "/etc/kubernetes/kubelet.conf",
        "/etc/kubernetes/controller-manager.conf",
        "/etc/kubernetes/scheduler.conf",
        "/etc/kubernetes/manifests/kube-apiserver.yaml",
        "/etc/kubernetes/manifests/etcd.yaml",
        "/etc/kubernetes/pki/apiserver.crt",
        "/etc/kubernetes/pki/etcd/server.key",
        "/etc/kubernetes/pki/apiserver-etcd-client.crt",
        "/var/lib/kubelet/config.yaml",
    ] {
        assert!(c.cp.path(f).is_file(), "init did not write {f}");
    }
    let manifest =
        std::fs::read_to_string(c.cp.path("/etc/kubernetes/manifests/kube-apiserver.yaml"))
            .unwrap();
    assert!(
        manifest.contains("registry.k8s.io/kube-apiserver:v1.31.2"),
        "{manifest}"
    );
    let admin = std::fs::read_to_string(c.cp.path("/etc/kubernetes/admin.conf")).unwrap();
    assert!(
        admin.contains(&format!(
            "server: https://{}",
            c.params.control_plane_endpoint
        )),
        "{admin}"
    );
    let doc: Value = serde_saphyr::from_str(&admin).unwrap();
    let cert_b64 = doc["users"][0]["user"]["client-certificate-data"]
        .as_str()
        .unwrap();
    use base64::Engine;
    let cert_pem = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(cert_b64)
            .unwrap(),
    )
    .unwrap();
    let info =
        drover_common::pki::cert_info(&drover_common::pki::first_cert_der(&cert_pem).unwrap())
            .unwrap();
    assert_eq!(info.common_name, "kubernetes-admin");
    assert_eq!(
        info.organizations,
        vec!["kubeadm:cluster-admins".to_string()]
    );

    // cluster-info is served, signed for the init token.
    let ci = cluster_info(&c);
    let jws_key = format!("jws-kcs-{}", c.token.id());
    let kubeconfig = ci["data"]["kubeconfig"].as_str().unwrap();
    let jws = ci["data"][&jws_key]
        .as_str()
        .unwrap_or_else(|| panic!("no {jws_key} in {ci}"));
    drover_common::jws::verify_detached(kubeconfig, jws, c.token.id(), c.token.secret()).unwrap();

    // A worker joins with the token and the CA pin.
    let (w1, w1_node, out) = worker_join(&c, "worker-1", &c.token, &c.cas.pin());
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("This node has joined the cluster"));
    assert_eq!(
        std::fs::read_to_string(w1.path("/etc/kubernetes/pki/ca.crt")).unwrap(),
        c.cas.ca.cert_pem
    );
    assert!(w1.path("/etc/kubernetes/kubelet.conf").is_file());
    assert!(!w1.path("/etc/kubernetes/pki/ca.key").exists());

    // Its kubelet answers, and fails while told to.
    let healthz = format!("http://127.0.0.1:{}/healthz", w1_node.kubelet_healthz_port);
    assert_eq!(http_get(&healthz), Some((200, "ok".into())));
    w1.write("/var/lib/kubelet/standin-fail", "");
    assert_eq!(http_get(&healthz).map(|r| r.0), Some(500));
    std::fs::remove_file(w1.path("/var/lib/kubelet/standin-fail")).unwrap();
    assert_eq!(http_get(&healthz).map(|r| r.0), Some(200));

    // A wrong pin is refused.
    let other = CertificateAuthority::generate("other").unwrap();
    let wrong_pin = CaPin::from_cert_der(&other.cert_der()).unwrap();
    let (_w, _, out) = worker_join(&c, "worker-wrong-pin", &c.token, &wrong_pin);
    assert_fails_with(&out, "is not signed by any of the public keys provided");

    // A token the cluster never registered has no JWS.
    let stranger = BootstrapToken::generate();
    let (_w, _, out) = worker_join(&c, "worker-stranger", &stranger, &c.cas.pin());
    assert_fails_with(
        &out,
        "there is no JWS signed token in the cluster-info ConfigMap",
    );
    assert_fails_with(
        &out,
        &format!(
            "This token id \"{}\" is invalid for this cluster",
            stranger.id()
        ),
    );

    // `token create` registers a new token through the API server; joining with it works.
    let new_token = BootstrapToken::generate();
    let out = token_create(&c, &new_token, &["--ttl", "15m0s"]);
    assert_ok(&out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        new_token.to_string()
    );
    let ci = cluster_info(&c);
    assert!(
        ci["data"][format!("jws-kcs-{}", new_token.id())].is_string(),
        "{ci}"
    );
    // Creating it again conflicts.
    let out = token_create(&c, &new_token, &[]);
    assert_fails_with(&out, "already exists");
    let (w2, _, out) = worker_join(&c, "worker-2", &new_token, &c.cas.pin());
    assert_ok(&out);
    // token create was logged in the root named by the kubeconfig.
    assert!(c
        .cp
        .invocations()
        .iter()
        .any(|i| i["argv"][1] == "token" && i["exit"] == 0));

    // A worker that already holds ca.crt is refused by preflight.
    let stale = Machine::new();
    stale.write("/etc/kubernetes/pki/ca.crt", &c.cas.ca.cert_pem);
    let stale_node = node_params("stale", &drover_tests::free_loopback(), 0);
    stale.configure(
        &render_join(&c.params, &stale_node, &c.token, &c.cas.pin(), false),
        &stale_node,
    );
    let out = stale.kubeadm(&["join", "--config", CONFIG]);
    assert_fails_with(
        &out,
        "[ERROR FileAvailable--etc-kubernetes-pki-ca.crt]: /etc/kubernetes/pki/ca.crt already exists",
    );

    // A second init on the same root is refused by preflight.
    let out = c.cp.kubeadm(&["init", "--config", CONFIG]);
    assert_fails_with(
        &out,
        "[ERROR FileAvailable--etc-kubernetes-manifests-kube-apiserver.yaml]",
    );

    // A control-plane join with the copied shared set starts its own API server.
    let cp2 = Machine::new();
    c.cas.provision(&cp2);
    let cp2_port = free_port();
    let cp2_address = drover_tests::free_loopback();
    let cp2_node = node_params("cp-2", &cp2_address, cp2_port);
    cp2.configure(
        &render_join(&c.params, &cp2_node, &c.token, &c.cas.pin(), true),
        &cp2_node,
    );
    let out = cp2.kubeadm(&["join", "--config", CONFIG]);
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("This node has joined the cluster and a new control plane instance was created"));
    let (code, body) = https_get(
        &format!("https://{cp2_address}:{cp2_port}/readyz"),
        &c.cas.ca.cert_pem,
    );
    assert_eq!((code, body.as_str()), (200, "ok"));
    assert!(cp2.path("/etc/kubernetes/admin.conf").is_file());
    // Real etcd: the join added a second member through etcd's own API,
    // and both are started.
    let cp1_etcd = format!(
        "https://{address}:2379",
        address = c.params.control_plane_endpoint.rsplit_once(':').unwrap().0
    );
    let members = etcd_members(&c.cp, &cp1_etcd);
    let mut names: Vec<&str> = members.iter().filter_map(|m| m["name"].as_str()).collect();
    names.sort();
    assert_eq!(names, ["cp-1", "cp-2"], "{members:?}");
    assert!(members
        .iter()
        .all(|m| m["clientURLs"].as_array().is_some_and(|u| !u.is_empty())));
    // Real kubectl with cp-1's admin.conf: every kubelet registered its
    // Node (the workers' after their TLS bootstrap); cordon and delete work.
    let kubectl = |args: &[&str]| kubectl_as(&c, args);
    // One field of one object, by its JSONPath.
    let field = |kind: &str, name: &str, path: &str| {
        kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")]).1
    };
    wait_for("four Ready Nodes", Duration::from_secs(20), || {
        let (ok, out) = kubectl(&["get", "nodes", "-o", "json"]);
        ok && ["cp-1", "cp-2", "worker-1", "worker-2"]
            .iter()
            .all(|n| out.contains(&format!("\"name\": \"{n}\"")))
            && out.matches("\"status\": \"True\"").count() >= 4
    });
    let (ok, out) = kubectl(&["cordon", "cp-2"]);
    assert!(ok && out.contains("node/cp-2 cordoned"), "{out}");
    let out = field("node", "cp-2", "{.spec.unschedulable}");
    assert!(out.contains("--- stdout\ntrue"), "{out}");
    let (ok, out) = kubectl(&["delete", "node", "cp-2"]);
    assert!(ok && out.contains("deleted"), "{out}");
    let (ok, out) = kubectl(&["get", "node", "cp-2"]);
    assert!(!ok && out.contains("NotFound"), "{out}");
    // Real kubectl drain: evictions go through the Eviction API, and a
    // PodDisruptionBudget that allows no disruption refuses them. A bare
    // Pod (web-1) and a Pod with an emptyDir volume (cache-1) refuse the
    // drain without --force and --delete-emptydir-data.
    let manifests = c.cp.path("/tmp/workloads.yaml");
    std::fs::create_dir_all(manifests.parent().unwrap()).unwrap();
    let owned = "ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: rs-1, uid: 0a, controller: true}]";
    std::fs::write(
        &manifests,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web-1, namespace: default, labels: {{app: web}}}}\n\
             spec: {{nodeName: worker-1, terminationGracePeriodSeconds: 2, containers: [{{name: web, image: web}}]}}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: batch-1, namespace: default, labels: {{app: batch}}, {owned}}}\n\
             spec: {{nodeName: worker-1, terminationGracePeriodSeconds: 2, containers: [{{name: batch, image: batch}}]}}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: cache-1, namespace: default, {owned}}}\n\
             spec: {{nodeName: worker-1, terminationGracePeriodSeconds: 2, containers: [{{name: c, image: c}}],\n\
             volumes: [{{name: scratch, emptyDir: {{}}}}]}}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: slow-1, namespace: default, {owned}}}\n\
             spec: {{nodeName: worker-1, containers: [{{name: s, image: s}}]}}\n---\n\
             apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: web, namespace: default}}\n\
             spec: {{minAvailable: 1, selector: {{matchLabels: {{app: web}}}}}}\n"
        ),
    )
    .unwrap();
    let (ok, out) = kubectl(&[
        "create",
        "--validate=false",
        "-f",
        manifests.to_str().unwrap(),
    ]);
    assert!(ok && out.contains("pod/web-1 created"), "{out}");
    // The API server defaults the grace period, as it does.
    let out = field("pod", "slow-1", "{.spec.terminationGracePeriodSeconds}");
    assert!(out.contains("--- stdout\n30"), "{out}");
    let out = field("pdb", "web", "{.status.disruptionsAllowed}");
    assert!(out.contains("--- stdout\n0"), "{out}");
    let pods = || kubectl(&["get", "pods", "-n", "default", "-o", "name"]).1;
    let (ok, out) = kubectl(&["drain", "worker-1", "--ignore-daemonsets", "--timeout=6s"]);
    assert!(
        !ok && out.contains("cannot delete Pods that declare no controller (use --force to override): default/web-1")
            && out.contains("cannot delete Pods with local storage (use --delete-emptydir-data to override): default/cache-1"),
        "{out}"
    );
    assert!(pods().contains("pod/batch-1"), "nothing was evicted");
    // An evicted Pod lingers, Terminating, for its grace period, then its
    // kubelet deletes it.
    let eviction = c.cp.path("/tmp/eviction.json");
    std::fs::write(
        &eviction,
        r#"{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "slow-1", "namespace": "default"}}"#,
    )
    .unwrap();
    let (ok, out) = kubectl(&[
        "create",
        "--raw",
        "/api/v1/namespaces/default/pods/slow-1/eviction",
        "-f",
        eviction.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    let out = field(
        "pod",
        "slow-1",
        "{.metadata.deletionGracePeriodSeconds}/{.metadata.deletionTimestamp}",
    );
    assert!(
        out.contains("--- stdout\n30/20"),
        "slow-1 is terminating for 30 s: {out}"
    );
    // A second deletion may shorten the grace period, never lengthen it.
    let (ok, out) = kubectl(&[
        "delete",
        "pod",
        "slow-1",
        "--grace-period=1",
        "--wait=false",
    ]);
    assert!(ok, "{out}");
    wait_for(
        "slow-1 to go after its shortened grace period",
        Duration::from_secs(20),
        || !pods().contains("pod/slow-1"),
    );
    let drain = [
        "drain",
        "worker-1",
        "--ignore-daemonsets",
        "--force",
        "--delete-emptydir-data",
    ];
    let (ok, out) = kubectl(&[&drain[..], &["--timeout=8s"]].concat());
    assert!(!ok && out.contains("disruption budget"), "{out}");
    let out = pods();
    assert!(
        out.contains("pod/web-1") && !out.contains("pod/batch-1") && !out.contains("pod/cache-1"),
        "the unprotected pods are evicted and gone after their grace period, the protected one stays: {out}"
    );
    let (ok, out) = kubectl(&["delete", "pdb", "web"]);
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&[&drain[..], &["--timeout=30s"]].concat());
    assert!(ok && out.contains("node/worker-1 drained"), "{out}");
    let (_, out) = kubectl(&["get", "pods", "-A", "-o", "name"]);
    assert!(!out.contains("web-1"), "{out}");
    // Both API servers serve the same store: a token made through cp-1
    // discovers through cp-2.
    let (code, body) = https_get(
        &format!("https://{cp2_address}:{cp2_port}/api/v1/namespaces/kube-public/configmaps/cluster-info"),
        &c.cas.ca.cert_pem,
    );
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(&format!("jws-kcs-{}", c.token.id())),
        "{body}"
    );

    // The invocation log recorded init.
    let log = c.cp.invocations();
    assert_eq!(log[0]["argv"][1], "init");
    assert_eq!(log[0]["exit"], 0);

    // reset -f stops the daemons and removes the files, on every machine;
    // a control plane's reset removes its etcd member first.
    for m in [&cp2, &w1, &w2, &c.cp] {
        let pids = m.pids();
        assert!(
            !pids.is_empty(),
            "no daemons recorded in {}",
            m.root().display()
        );
        assert!(pids.iter().all(|p| pid_alive(*p)));
        let reset_out = m.kubeadm(&["reset", "-f"]);
        assert_ok(&reset_out);
        wait_for("daemons to exit", Duration::from_secs(10), || {
            pids.iter().all(|p| !pid_alive(*p))
        });
        assert!(m.pids().is_empty());
        assert!(!m.path("/etc/kubernetes/kubelet.conf").exists());
        assert!(!m.path("/var/lib/kubelet/config.yaml").exists());
        assert!(!m.path("/etc/kubernetes/pki/ca.crt").exists());
        if std::ptr::eq(m, &cp2) {
            let left = etcd_members(&c.cp, &cp1_etcd);
            assert_eq!(left.len(), 1, "{left:?}: {}", text(&reset_out));
            assert_eq!(left[0]["name"], "cp-1");
        }
    }
    assert!(!c.cp.path("/etc/kubernetes/admin.conf").exists());
    assert!(!c
        .cp
        .path("/etc/kubernetes/manifests/kube-apiserver.yaml")
        .exists());
    assert!(!c.cp.path("/var/lib/standin-apiserver").exists());
    assert!(
        http_get(&healthz).is_none(),
        "the worker's kubelet still answers"
    );
}

/// The machine's `/var/lib/kubelet/config.yaml`.
fn kubelet_config_of(m: &Machine) -> Value {
    let text = std::fs::read_to_string(m.path("/var/lib/kubelet/config.yaml")).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

/// The kubelet flags kubeadm wrote on the machine.
fn kubelet_flags_of(m: &Machine) -> String {
    std::fs::read_to_string(m.path("/var/lib/kubelet/kubeadm-flags.env")).unwrap()
}

/// kubeadm waits for the kubelet on the healthz address of the kubelet
/// configuration it wrote, the machine's patches applied, never on a
/// kubelet flag, while the kubelet itself listens where its flags say.
/// Drover gives a machine's own healthz port as such a patch, so init and
/// join pass; a machine whose flag says another port fails the wait and
/// says where it waited; `upgrade` keeps the port only when given the
/// patches.
#[test]
fn kubeadm_waits_for_the_kubelet_on_its_patched_config_never_on_a_flag() {
    let c = init_cluster();
    let healthz = |port: u16| format!("http://127.0.0.1:{port}/healthz");
    let patch_line = "[patches] Applied patch of type \"application/merge-patch+json\" to target \"kubeletconfiguration\"";
    // init: this machine's kubelet has its own port, from the patch; the
    // cluster's kubelet-config ConfigMap keeps the kubelet's default.
    let cp_port = c.cp_node.kubelet_healthz_port;
    assert_eq!(kubelet_config_of(&c.cp)["healthzPort"], cp_port);
    assert!(!kubelet_flags_of(&c.cp).contains("healthz"));
    assert_eq!(http_get(&healthz(cp_port)), Some((200, "ok".into())));
    let out = kubectl_output(
        &c,
        &[
            "-n",
            "kube-system",
            "get",
            "cm",
            "kubelet-config",
            "-o",
            "jsonpath={.data.kubelet}",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let cluster: Value = serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert_eq!(cluster["kind"], "KubeletConfiguration", "{cluster}");
    assert_eq!(cluster["healthzPort"], 10248, "{cluster}");
    // Only joining machines, nodes and admins read it.
    let (code, body) = endpoint_get(
        &c,
        "/api/v1/namespaces/kube-system/configmaps/kubelet-config",
    );
    assert_eq!(code, 403, "{body}");

    // join with Drover's config and the patch where the agent writes it.
    let (w, node, out) = worker_join(&c, "worker-1", &c.token, &c.cas.pin());
    assert_ok(&out);
    let port = node.kubelet_healthz_port;
    assert!(
        text(&out).contains(&format!(
            "Waiting for a healthy kubelet at {}",
            healthz(port)
        )),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains(patch_line), "{}", text(&out));
    assert_eq!(http_get(&healthz(port)), Some((200, "ok".into())));
    let config = kubelet_config_of(&w);
    assert_eq!(config["healthzPort"], port, "{config}");
    assert_eq!(
        config["clusterDNS"][0], "10.96.0.10",
        "the cluster's: {config}"
    );
    assert!(!kubelet_flags_of(&w).contains("healthz"));

    // A kubelet flag that says another port: the kubelet listens there,
    // kubeadm waits on the configuration's port and gives up, naming it.
    let m = Machine::new();
    let node = node_params("worker-2", &drover_tests::free_loopback(), 0);
    let flag_port = free_port();
    let rendered = render_join(&c.params, &node, &c.token, &c.cas.pin(), false);
    let mut config: Value = serde_saphyr::from_str(&rendered).unwrap();
    config["nodeRegistration"]["kubeletExtraArgs"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "healthz-port", "value": flag_port.to_string()}));
    config["timeouts"] = serde_json::json!({"kubeletHealthCheck": "3s"});
    m.configure(&serde_saphyr::to_string(&config).unwrap(), &node);
    let out = m.kubeadm(&["join", "--config", CONFIG]);
    let waited = healthz(node.kubelet_healthz_port);
    assert_fails_with(&out, &format!("The kubelet is not healthy at {waited}"));
    assert_fails_with(&out, &format!("curl -sSL {waited}"));
    assert!(
        text(&out).contains(&format!("Waiting for a healthy kubelet at {waited}")),
        "{}",
        text(&out)
    );
    assert_eq!(http_get(&healthz(flag_port)), Some((200, "ok".into())));
    assert_eq!(http_get(&waited), None, "nothing listens there");

    // A config naming patches the machine does not have is refused.
    let bare = Machine::new();
    let bare_node = node_params("worker-3", &drover_tests::free_loopback(), 0);
    bare.write(
        CONFIG,
        &render_join(&c.params, &bare_node, &c.token, &c.cas.pin(), false),
    );
    assert_fails_with(
        &bare.kubeadm(&["join", "--config", CONFIG]),
        "could not list patch files for path \"/etc/drover/kubeadm-patches\"",
    );

    // upgrade writes the kubelet configuration again, from the ConfigMap
    // and the patches it is given: with them the port stays...
    let no_renewal = "--certificate-renewal=false";
    let patches = drover_common::kubeadm::KUBEADM_PATCHES_DIR;
    let upgrade = |args: &[&str]| {
        let all = [&["upgrade", "node", no_renewal][..], args].concat();
        w.kubeadm_at("v1.31.2", &all)
    };
    let out = upgrade(&["--patches", patches]);
    assert_ok_saying(&out, patch_line);
    assert_eq!(kubelet_config_of(&w)["healthzPort"], port);
    // ...a patch the stand-in does not apply is refused before anything
    // changes...
    w.write("/etc/other-patches/kube-apiserver+merge.yaml", "spec: {}\n");
    assert_fails_with(
        &upgrade(&["--patches", "/etc/other-patches"]),
        "applies only \"kubeletconfiguration\" patches",
    );
    // ...and without them the machine's own port is gone, as with real
    // kubeadm; the file it replaced is kept.
    assert_ok(&upgrade(&[]));
    assert_eq!(kubelet_config_of(&w)["healthzPort"], 10248);
    let kept: Vec<Value> = std::fs::read_dir(w.path("/etc/kubernetes/tmp"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("kubeadm-kubelet-config")
        })
        .map(|p| {
            serde_saphyr::from_str(&std::fs::read_to_string(p.join("config.yaml")).unwrap())
                .unwrap()
        })
        .collect();
    assert_eq!(kept.len(), 2, "one backup per upgrade");
    assert!(kept.iter().all(|k| k["healthzPort"] == port), "{kept:?}");
}

#[test]
fn expired_token_is_not_signed() {
    // A token with a 1s TTL disappears from cluster-info once it expires.
    let c = init_cluster();
    let short = BootstrapToken::generate();
    let out = token_create(&c, &short, &["--ttl", "1s"]);
    assert_ok(&out);
    let key = format!("jws-kcs-{}", short.id());
    wait_for("the token to expire", Duration::from_secs(10), || {
        cluster_info(&c)["data"].get(&key).is_none()
    });
    let (_w, _, out) = worker_join(&c, "late-worker", &short, &c.cas.pin());
    assert_fails_with(&out, "there is no JWS signed token");
    // The init token still works.
    assert!(cluster_info(&c)["data"][format!("jws-kcs-{}", c.token.id())].is_string());
}

/// The node image's upgrade hooks: the stand-in under the names
/// `upgrade-kubeadm` and `upgrade-kubelet` installs that version of kubeadm
/// (then the kubelet) beside the kubeadm the agent runs, as a package
/// manager would, and refuses what is not a version.
#[test]
fn upgrade_hooks_install_kubeadm_then_the_kubelet_of_a_version() {
    let m = Machine::new();
    let bin = m.root().join("usr/bin");
    let hooks = m.root().join("usr/lib/drover");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&hooks).unwrap();
    let kubeadm = bin.join("kubeadm");
    if std::fs::hard_link(KUBEADM, &kubeadm).is_err() {
        std::fs::copy(KUBEADM, &kubeadm).unwrap();
    }
    for hook in ["upgrade-kubeadm", "upgrade-kubelet"] {
        std::os::unix::fs::symlink(&kubeadm, hooks.join(hook)).unwrap();
    }
    let hook = |name: &str, args: &[&str]| {
        Command::new(hooks.join(name))
            .args(args)
            .env("DROVER_KUBEADM", &kubeadm)
            .env("DROVER_ROOT", m.root())
            .env_remove("DROVER_STANDIN_KUBEADM_VERSION")
            .output()
            .unwrap()
    };
    let version = || {
        let o = Command::new(&kubeadm)
            .args(["version", "-o", "short"])
            .env_remove("DROVER_STANDIN_KUBEADM_VERSION")
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let installed = |file: &str| {
        std::fs::read_to_string(bin.join(file))
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    assert_eq!(version(), "v1.31.2");

    assert_fails_with(
        &hook("upgrade-kubeadm", &[]),
        "usage: upgrade-kubeadm VERSION",
    );
    assert_fails_with(
        &hook("upgrade-kubelet", &["1.32"]),
        "is not a Kubernetes version such as v1.32.0",
    );
    assert_eq!(
        installed("kubeadm.version"),
        "",
        "a refused hook installs nothing"
    );

    // kubeadm first; the kubelet stays what it was until its own hook.
    assert_ok_saying(
        &hook("upgrade-kubeadm", &["v1.32.0"]),
        "kubeadm v1.31.2 -> v1.32.0 installed",
    );
    assert_eq!(version(), "v1.32.0");
    assert_eq!(installed("kubelet.version"), "v1.31.2");
    // No kubelet runs on this root: it is installed, not started.
    assert_ok_saying(
        &hook("upgrade-kubelet", &["v1.32.0"]),
        "not running; not started",
    );
    assert_eq!(installed("kubelet.version"), "v1.32.0");
    // Each run is in the machine's kubeadm invocation log.
    let log = std::fs::read_to_string(m.root().join("var/log/kubeadm-invocations.jsonl")).unwrap();
    assert_eq!(
        log.lines().filter(|l| l.contains("upgrade-kube")).count(),
        4,
        "{log}"
    );
}

/// A request to the API server of `c` with the admin credentials of its
/// `admin.conf`: `(status, body)`.
fn admin_request(
    c: &Cluster,
    method: reqwest::Method,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, String) {
    use base64::Engine;
    use rustls::pki_types::pem::PemObject;
    let conf: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(c.cp.path("/etc/kubernetes/admin.conf")).unwrap(),
    )
    .unwrap();
    let b64 = |v: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap()
    };
    let user = &conf["users"][0]["user"];
    let certs =
        rustls::pki_types::CertificateDer::pem_slice_iter(&b64(&user["client-certificate-data"]))
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
    let key =
        rustls::pki_types::PrivateKeyDer::from_pem_slice(&b64(&user["client-key-data"])).unwrap();
    let client = https_client(tls_trusting(&c.cas.ca.cert_pem, Some((certs, key))));
    let url = format!("https://{}{path}", c.params.control_plane_endpoint);
    block_on(async {
        let r = client
            .request(method, url)
            .header("content-type", content_type)
            .body(body.to_owned())
            .send()
            .await
            .expect("request");
        let code = r.status().as_u16();
        (code, r.text().await.unwrap())
    })
}

#[test]
fn server_side_apply_is_accepted_from_real_kubectl_and_refused_as_the_real_server_refuses() {
    let c = init_cluster();
    // Real kubectl applies server-side through discovery, as Drover's agent does.
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("m.yaml");
    let out = server_side_apply(&c, &manifests, "apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: team}\ndata: {a: \"1\"}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: reader}\nrules: [{apiGroups: [\"\"], resources: [pods], verbs: [get]}]\n");
    assert!(out.status.success(), "{}", text(&out));
    let get = |args: &[&str]| kubectl_ok(&c, args);
    let settings = |jsonpath: &str| {
        let jsonpath = format!("jsonpath={jsonpath}");
        get(&[
            "get",
            "configmap",
            "settings",
            "-n",
            "team",
            "-o",
            &jsonpath,
        ])
    };
    assert_eq!(
        settings("{.data.a} {.metadata.managedFields[*].manager}"),
        "1 drover"
    );
    assert_eq!(
        get(&[
            "get",
            "clusterrole",
            "reader",
            "-o",
            "jsonpath={.rules[0].verbs[0]}"
        ]),
        "get"
    );
    // Applied again with a change: merged, a new resourceVersion.
    let out = server_side_apply(&c, &manifests, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: team}\ndata: {a: \"2\"}\n");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(settings("{.data.a}"), "2");

    let path = "/api/v1/namespaces/team/configmaps/x";
    let apply = "application/apply-patch+yaml";
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n";
    let with_manager = format!("{path}?fieldManager=drover");
    let with_manager = with_manager.as_str();
    // Each case: what is wrong, the path, the content type, the body, the
    // status the real server answers and what its message says.
    let cases = [
        (
            "no field manager",
            path,
            apply,
            cm,
            422,
            "fieldManager: Required value: is required for apply patch",
        ),
        (
            "no metadata.name",
            with_manager,
            apply,
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
            422,
            "metadata.name: Required value",
        ),
        (
            "an apiVersion the server does not serve: nothing to apply it to",
            "/apis/example.com/v1/widgets/w?fieldManager=drover",
            apply,
            "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n",
            404,
            "",
        ),
        (
            "a namespace that does not exist",
            "/api/v1/namespaces/nowhere/configmaps/x?fieldManager=drover",
            apply,
            cm,
            404,
            "namespaces \\\"nowhere\\\" not found",
        ),
        (
            "a body that is not what the URL says",
            with_manager,
            apply,
            "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n",
            400,
            "does not match the expected kind (ConfigMap)",
        ),
        (
            "a merge patch, not what the stand-in serves here",
            with_manager,
            "application/merge-patch+json",
            "{}",
            415,
            "",
        ),
    ];
    for (what, url, content_type, sent, status, says) in cases {
        let (code, body) = admin_request(&c, reqwest::Method::PATCH, url, content_type, sent);
        assert_eq!(code, status, "{what}: {body}");
        assert!(body.contains(says), "{what}: {says:?} not in {body}");
    }
    let (code, _) = admin_request(&c, reqwest::Method::GET, "/apis/example.com/v1", "", "");
    assert_eq!(code, 404);
    // Nothing refused was stored.
    let out = kubectl_output(&c, &["get", "configmap", "x", "-n", "team"]);
    assert!(!out.status.success());
}

/// kubeadm 1.29+ (`EtcdLearnerMode`, GA in 1.32) adds a joining control
/// plane's etcd member as a learner and promotes it once it is in sync;
/// real etcd takes one learner at a time.
#[test]
fn a_joining_control_planes_member_is_a_learner_until_promoted_and_etcd_takes_one_at_a_time() {
    let c = init_cluster();
    let cp1_etcd = format!(
        "https://{}:2379",
        c.params.control_plane_endpoint.rsplit_once(':').unwrap().0
    );
    // A join whose etcd never starts: its member stays a learner.
    let stuck = Machine::new();
    c.cas.provision(&stuck);
    let address = drover_tests::free_loopback();
    let stuck_node = node_params("cp-stuck", &address, free_port());
    stuck.configure(
        &render_join(&c.params, &stuck_node, &c.token, &c.cas.pin(), true),
        &stuck_node,
    );
    let out = Command::new(KUBEADM)
        .args(["join", "--config", CONFIG, "--rootfs"])
        .arg(stuck.root())
        .env("DROVER_ETCD_BIN", "/bin/false")
        .output()
        .expect("run the stand-in kubeadm");
    assert!(!out.status.success(), "{}", text(&out));
    let members = etcd_members(&c.cp, &cp1_etcd);
    let peer = format!("https://{address}:2380");
    let learner = members
        .iter()
        .find(|m| m["peerURLs"][0] == peer.as_str())
        .unwrap_or_else(|| panic!("no member {peer}: {members:?}"));
    assert_eq!(learner["isLearner"], true, "{members:?}");
    let cp1 = members.iter().find(|m| m["name"] == "cp-1").unwrap();
    assert_ne!(cp1["isLearner"], true, "{members:?}");
    // etcd refuses a second learner: the next join fails and says why.
    let (second, _, out) = control_plane_join(&c, "cp-2", "v1.31.2");
    assert_fails_with(&out, "too many learner members");
    drop(second);
    // Once the stale learner is removed, a join adds its learner and
    // promotes it: every member votes.
    let id = learner["ID"].as_u64().expect("a numeric member id");
    let pki = c.cp.path("/etc/kubernetes/pki");
    let removed = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &cp1_etcd, "--cacert"])
        .arg(pki.join("etcd/ca.crt"))
        .arg("--cert")
        .arg(pki.join("apiserver-etcd-client.crt"))
        .arg("--key")
        .arg(pki.join("apiserver-etcd-client.key"))
        .args(["member", "remove", &format!("{id:x}")])
        .output()
        .expect("run etcdctl");
    assert!(removed.status.success(), "{removed:?}");
    let (_third, _, out) = control_plane_join(&c, "cp-3", "v1.31.2");
    assert_ok(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Promoting the etcd learner"),
        "{}",
        text(&out)
    );
    let members = etcd_members(&c.cp, &cp1_etcd);
    assert_eq!(
        drover_tests::kube::started_member_names(&members),
        ["cp-1", "cp-3"]
    );
    assert!(
        members.iter().all(|m| m["isLearner"] != true),
        "{members:?}"
    );
}

/// `kubeadm init` creates kube-proxy and CoreDNS as real kubeadm does
/// (phases/addons/proxy, phases/addons/dns), at the images it gives them,
/// and `kubeadm upgrade apply` moves them to the new version's after the
/// control plane (phases/upgrade/postupgrade.go), keeping the CoreDNS
/// ConfigMap as the user left it; all read with real kubectl.
#[test]
fn init_creates_kube_proxy_and_coredns_and_upgrade_apply_moves_their_images() {
    let c = init_cluster();
    let get = |args: &[&str]| {
        let all = [&["-n", "kube-system", "get"], args].concat();
        let out = kubectl_output(&c, &all);
        assert!(out.status.success(), "kubectl {all:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let corefile_text = || get(&["configmap", "coredns", "-o", "jsonpath={.data.Corefile}"]);
    let images = || {
        (
            get(&[
                "daemonset",
                "kube-proxy",
                "-o",
                "jsonpath={.spec.template.spec.containers[0].image}",
            ]),
            get(&[
                "deployment",
                "coredns",
                "-o",
                "jsonpath={.spec.template.spec.containers[0].image}",
            ]),
        )
    };
    assert_eq!(
        images(),
        (
            "registry.k8s.io/kube-proxy:v1.31.2".to_owned(),
            "registry.k8s.io/coredns/coredns:v1.11.3".to_owned()
        )
    );
    // The rest of what kubeadm creates with them.
    assert_eq!(
        get(&["service", "kube-dns", "-o", "jsonpath={.spec.clusterIP}"]),
        "10.96.0.10"
    );
    assert!(get(&[
        "configmap",
        "kube-proxy",
        "-o",
        "jsonpath={.data.config\\.conf}"
    ])
    .contains("clusterCIDR: \"10.244.0.0/16\""));
    assert!(corefile_text().contains("kubernetes cluster.local in-addr.arpa ip6.arpa"));
    assert_eq!(
        get(&[
            "serviceaccount",
            "kube-proxy",
            "-o",
            "jsonpath={.metadata.name}"
        ]),
        "kube-proxy"
    );
    // A user's Corefile survives upgrades (CreateOrRetainConfigMap); real
    // kubectl replaces it with a whole-object update (no client-side
    // validation: the stand-in serves no OpenAPI document).
    let mut corefile: Value =
        serde_json::from_str(&get(&["configmap", "coredns", "-o", "json"])).unwrap();
    corefile["data"]["Corefile"] = ".:53 {\n    errors\n    forward . 192.0.2.53\n}\n".into();
    let body = c.cp.path("/tmp/coredns.json");
    std::fs::create_dir_all(body.parent().unwrap()).unwrap();
    std::fs::write(&body, corefile.to_string()).unwrap();
    let (ok, out) = kubectl_as(
        &c,
        &["replace", "--validate=false", "-f", body.to_str().unwrap()],
    );
    assert!(ok, "{out}");
    // A stale resourceVersion is a conflict, as on the real server.
    let (ok, out) = kubectl_as(
        &c,
        &["replace", "--validate=false", "-f", body.to_str().unwrap()],
    );
    assert!(!ok && out.contains("the object has been modified"), "{out}");

    wait_for("cp-1 Ready", Duration::from_secs(20), || {
        let ready = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";
        let out = kubectl_output(&c, &["get", "node", "cp-1", "-o", ready]);
        out.status.success() && out.stdout == b"True"
    });
    let no_renewal = "--certificate-renewal=false";
    let out = c.cp.kubeadm_at(
        "v1.32.0",
        &["upgrade", "apply", "v1.32.0", "-y", no_renewal],
    );
    assert_ok_saying(&out, "[addons] Applied essential addon: kube-proxy");
    // kubeadm v1.32 pairs v1.32 with CoreDNS v1.11.3, as v1.31 did.
    assert_eq!(
        images(),
        (
            "registry.k8s.io/kube-proxy:v1.32.0".to_owned(),
            "registry.k8s.io/coredns/coredns:v1.11.3".to_owned()
        )
    );
    let out = c.cp.kubeadm_at(
        "v1.33.0",
        &["upgrade", "apply", "v1.33.0", "-y", no_renewal],
    );
    assert_ok(&out);
    assert_eq!(
        images(),
        (
            "registry.k8s.io/kube-proxy:v1.33.0".to_owned(),
            "registry.k8s.io/coredns/coredns:v1.12.0".to_owned()
        )
    );
    assert!(corefile_text().contains("forward . 192.0.2.53"));
    // Each write went through the API server as a whole-object update:
    // the Deployment's spec changed once (v1.33's CoreDNS).
    assert_eq!(
        get(&[
            "deployment",
            "coredns",
            "-o",
            "jsonpath={.metadata.generation}"
        ]),
        "2"
    );
}

/// The apiextensions API: a CustomResourceDefinition's kind is served only
/// once the controllers have accepted its names and established it, a
/// moment after it was applied, as kube-apiserver serves it (kubectl users
/// `kubectl wait --for=condition=Established` in between).
#[test]
fn a_custom_resource_kind_is_served_only_once_its_definition_is_established() {
    let c = init_cluster();
    let dir = tempfile::tempdir().unwrap();
    let crd = dir.path().join("crd.yaml");
    let definition = |plural: &str, kind: &str| {
        format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: {plural}.example.com}}\nspec:\n  group: example.com\n  scope: Namespaced\n  names: {{plural: {plural}, singular: {}, kind: {kind}, listKind: {kind}List}}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}\n",
            plural.trim_end_matches('s')
        )
    };
    let apply = |path: &Path, manifests: &str| server_side_apply(&c, path, manifests);
    let out = apply(&crd, &definition("widgets", "Widget"));
    assert!(out.status.success(), "{}", text(&out));
    // Not established yet: the kind's paths are NotFound.
    let admin_get =
        |path: &str| admin_request(&c, reqwest::Method::GET, path, "application/json", "");
    let (code, body) = admin_get("/apis/example.com/v1/namespaces/default/widgets");
    assert_eq!(code, 404, "served before Established: {body}");
    let (code, body) =
        admin_get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com");
    assert_eq!(code, 200, "{body}");
    let stored: Value = serde_json::from_str(&body).unwrap();
    assert!(
        !stored["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Established" && c["status"] == "True"),
        "established by the request that applied it: {stored}"
    );
    let out = kubectl_output(
        &c,
        &[
            "wait",
            "--for=condition=Established",
            "crd/widgets.example.com",
            "--timeout=30s",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let widget = dir.path().join("widget.yaml");
    let out = apply(&widget, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1, namespace: default}\nspec: {size: 3}\n");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        kubectl_ok(&c, &["get", "widgets", "w1", "-o", "jsonpath={.spec.size}"]),
        "3"
    );
    // A definition whose kind another of its group holds is never
    // established: its names are refused.
    let out = apply(&crd, &definition("gadgets", "Widget"));
    assert!(out.status.success(), "{}", text(&out));
    let names_accepted = || {
        kubectl_output(
            &c,
            &[
                "get",
                "crd",
                "gadgets.example.com",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"NamesAccepted\")].reason}",
            ],
        )
    };
    wait_for("the names to be judged", Duration::from_secs(20), || {
        String::from_utf8_lossy(&names_accepted().stdout) == "KindConflict"
    });
    let out = kubectl_output(
        &c,
        &[
            "wait",
            "--for=condition=Established",
            "crd/gadgets.example.com",
            "--timeout=4s",
        ],
    );
    assert!(!out.status.success(), "{}", text(&out));
    // A definition that breaks the API's rules is refused.
    let out = apply(
        &crd,
        &definition("things", "Thing")
            .replace("name: things.example.com", "name: stuff.example.com"),
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("must be spec.names.plural+\".\"+spec.group"),
        "{}",
        text(&out)
    );
}
