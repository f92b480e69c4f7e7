//! `kubeadm join --config PATH`: bootstrap-token discovery as kubeadm does
//! it, then a worker or a control-plane join.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use drover_common::pin::CaPin;
use drover_common::token::BootstrapToken;
use serde_json::Value;

use crate::certs::{self, check_shared_ca_set};
use crate::cmd_init::{read_config, NodeOpts};
use crate::net::{self, is_connect_error, status_message};
use crate::node::{self, ClusterSettings, ControlPlaneNode, KubeconfigSpec};
use crate::store;
use crate::util::{
    join_host_port, parse_go_duration_std, split_host_port, write_file, InPhase, Preflight, Root,
    JOIN_PHASES,
};

const STANDIN_DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// The outcome of discovery: the validated cluster CA and the server that
/// `cluster-info` names.
struct Discovered {
    ca_pem: String,
    ca_pin: CaPin,
    server: String,
}

const CLUSTER_INFO_PATH: &str = "/api/v1/namespaces/kube-public/configmaps/cluster-info";

async fn fetch_json(
    client: &reqwest::Client,
    url: &str,
    bearer: Option<&str>,
    deadline: tokio::time::Instant,
) -> Result<Value> {
    loop {
        let mut req = client.get(url);
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        match req.send().await {
            Ok(resp) => {
                let code = resp.status();
                let body = resp.text().await.unwrap_or_default();
                if !code.is_success() {
                    bail!("Get {url:?}: {} ({})", status_message(&body), code.as_u16());
                }
                return serde_json::from_str(&body)
                    .map_err(|e| anyhow!("Get {url:?}: invalid JSON: {e}"));
            }
            Err(e) if is_connect_error(&e) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => bail!("Get {url:?}: {e}{}", source_chain(&e)),
        }
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = String::new();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&format!(": {c}"));
        cur = c.source();
    }
    s
}

/// Token-based discovery: fetch `cluster-info` without trusting the server,
/// check the JWS for our token id, pin the CA, then fetch again over TLS
/// verified against that CA.
async fn discover(
    endpoint: &str,
    token: &BootstrapToken,
    pins: &[CaPin],
    unsafe_skip: bool,
    timeout: Duration,
) -> Result<Discovered> {
    let url = format!("https://{endpoint}{CLUSTER_INFO_PATH}");
    let deadline = tokio::time::Instant::now() + timeout;
    let insecure = net::http_client(net::insecure_client_config(), Duration::from_secs(5))?;
    let cm = fetch_json(&insecure, &url, None, deadline)
        .await
        .map_err(|e| anyhow!("couldn't validate the identity of the API Server: failed to request the cluster-info ConfigMap: {e:#}"))?;
    let data = cm.get("data").cloned().unwrap_or_default();
    let kubeconfig = data
        .get("kubeconfig")
        .and_then(|v| v.as_str())
        .ok_or_else(|| anyhow!("couldn't validate the identity of the API Server: there is no kubeconfig in the cluster-info ConfigMap"))?
        .to_owned();
    let id = token.id();
    let jws = data
        .get(format!("jws-kcs-{id}"))
        .and_then(|v| v.as_str())
        .ok_or_else(|| {
            anyhow!("couldn't validate the identity of the API Server: there is no JWS signed token in the cluster-info ConfigMap. This token id {id:?} is invalid for this cluster, can't connect")
        })?;
    drover_common::jws::verify_detached(&kubeconfig, jws, id, token.secret()).map_err(|_| {
        anyhow!("couldn't validate the identity of the API Server: failed to verify JWS signature of received cluster info object, can't trust this API Server")
    })?;
    let kc = certs::parse_kubeconfig(&kubeconfig, None).map_err(|e| {
        anyhow!(
            "couldn't validate the identity of the API Server: the cluster-info kubeconfig: {e:#}"
        )
    })?;
    let ca_pem = kc
        .ca_pem
        .ok_or_else(|| anyhow!("couldn't validate the identity of the API Server: the cluster-info kubeconfig holds no certificate-authority-data"))?;
    let ca_der = drover_common::pki::first_cert_der(&ca_pem).map_err(|e| {
        anyhow!(
            "couldn't validate the identity of the API Server: the cluster CA in cluster-info: {e}"
        )
    })?;
    let ca_pin = CaPin::from_cert_der(&ca_der).map_err(|e| anyhow!("{e}"))?;
    if !unsafe_skip && !pins.contains(&ca_pin) {
        bail!("couldn't validate the identity of the API Server: cluster CA found in cluster-info ConfigMap is not signed by any of the public keys provided (the cluster CA's pin is {ca_pin}; caCertHashes holds {})",
            pins.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "));
    }
    // The secure re-fetch: the server must present a certificate from this CA.
    let secure = net::http_client(net::client_config(&ca_pem, None)?, Duration::from_secs(5))?;
    let again = fetch_json(&secure, &url, None, deadline).await.map_err(|e| {
        anyhow!("couldn't validate the identity of the API Server: failed to request cluster-info over TLS verified with the cluster CA: {e:#}")
    })?;
    if again
        .get("data")
        .and_then(|d| d.get("kubeconfig"))
        .and_then(|v| v.as_str())
        != Some(kubeconfig.as_str())
    {
        bail!("couldn't validate the identity of the API Server: the cluster-info fetched over verified TLS differs from the signed one");
    }
    Ok(Discovered {
        ca_pem,
        ca_pin,
        server: kc.server,
    })
}

/// The ConfigMap at `path`, read through the API server with the
/// bootstrap token, as kubeadm reads the cluster's configuration.
async fn fetch_config_map(
    endpoint: &str,
    path: &str,
    ca_pem: &str,
    token: &BootstrapToken,
    timeout: Duration,
) -> Result<Value> {
    let url = format!("https://{endpoint}{path}");
    let client = net::http_client(net::client_config(ca_pem, None)?, Duration::from_secs(5))?;
    let deadline = tokio::time::Instant::now() + timeout;
    fetch_json(&client, &url, Some(&token.to_string()), deadline).await
}

/// The cluster's kubelet configuration, the `kubelet-config` ConfigMap
/// `kubeadm init` uploaded (cmd/kubeadm/app/componentconfigs: the kubelet's
/// must exist, unlike kube-proxy's).
async fn fetch_kubelet_configuration(
    endpoint: &str,
    ca_pem: &str,
    token: &BootstrapToken,
    timeout: Duration,
) -> Result<Value> {
    let fail = |e: anyhow::Error| {
        anyhow!("unable to fetch the {} ConfigMap, the cluster's kubelet configuration that `kubeadm init` uploads (phase upload-config/kubelet): {e:#}", crate::kubelet::CONFIG_MAP)
    };
    let cm = fetch_config_map(
        endpoint,
        crate::kubelet::CONFIG_MAP_PATH,
        ca_pem,
        token,
        timeout,
    )
    .await
    .map_err(fail)?;
    crate::kubelet::from_config_map(&cm).map_err(fail)
}

async fn fetch_cluster_configuration(
    endpoint: &str,
    ca_pem: &str,
    token: &BootstrapToken,
    timeout: Duration,
) -> Result<String> {
    let cm = fetch_config_map(
        endpoint,
        "/api/v1/namespaces/kube-system/configmaps/kubeadm-config",
        ca_pem,
        token,
        timeout,
    )
    .await
    .map_err(|e| anyhow!("unable to fetch the kubeadm-config ConfigMap: {e:#}"))?;
    cm.get("data")
        .and_then(|d| d.get("ClusterConfiguration"))
        .and_then(|v| v.as_str())
        .map(str::to_owned)
        .ok_or_else(|| {
            anyhow!("unable to fetch the kubeadm-config ConfigMap: it has no ClusterConfiguration")
        })
}

pub async fn run(root: &Root, o: NodeOpts) -> Result<()> {
    let text = read_config(root, &o.config)?;
    let cfg = crate::kconfig::parse(&text)?;
    if cfg.init.is_some() || cfg.cluster.is_some() {
        bail!("the config holds an InitConfiguration or ClusterConfiguration: `kubeadm join` reads a JoinConfiguration (the cluster's ClusterConfiguration comes from the kubeadm-config ConfigMap)");
    }
    let join = cfg.join.ok_or_else(|| {
        anyhow!("the config holds no JoinConfiguration (apiVersion kubeadm.k8s.io/v1beta4)")
    })?;
    if join.discovery.file.is_some() {
        bail!("discovery.file: the stand-in kubeadm supports only bootstrap token discovery");
    }
    let bt = join.discovery.bootstrap_token.clone().ok_or_else(|| {
        anyhow!("discovery: Invalid value: \"\": bootstrapToken or file must be set")
    })?;
    if bt.api_server_endpoint.is_empty() {
        bail!("discovery.bootstrapToken.apiServerEndpoint: Required value");
    }
    match split_host_port(&bt.api_server_endpoint) {
        Ok((_, Some(_))) => {}
        _ => bail!(
            "discovery.bootstrapToken.apiServerEndpoint: Invalid value: {:?}: must be host:port",
            bt.api_server_endpoint
        ),
    }
    let unsafe_skip = bt.unsafe_skip_ca_verification == Some(true);
    if bt.ca_cert_hashes.is_empty() && !unsafe_skip {
        bail!("discovery.bootstrapToken.caCertHashes: Invalid value: \"\": using token-based discovery without caCertHashes can be unsafe. Set unsafeSkipCAVerification as true in your kubeadm config file or pass --discovery-token-unsafe-skip-ca-verification flag to continue");
    }
    let tls_token: BootstrapToken = match &join.discovery.tls_bootstrap_token {
        Some(t) => t
            .parse()
            .map_err(|e| anyhow!("discovery.tlsBootstrapToken: Invalid value: {e}"))?,
        None => bt.token.clone(),
    };
    let patches_dir =
        crate::patches::directory(join.patches.as_ref(), "JoinConfiguration.patches")?;
    let cp = join.control_plane.clone();
    if let Some(cp) = &cp {
        if cp.certificate_key.is_some() {
            bail!("controlPlane.certificateKey is set: Drover copies the shared CA set to control-plane machines and joins without --certificate-key (no certificates are downloaded from the cluster); remove certificateKey");
        }
    }
    let dry_run = o.dry_run(join.dry_run);
    let node_name = o.node_name(&join.node_registration)?;
    let cp_endpoint = match &cp {
        Some(cp) => Some(node::local_endpoint(
            &cp.local_api_endpoint,
            "controlPlane.localAPIEndpoint",
        )?),
        None => None,
    };
    let (skip, ignore) =
        o.skip_and_ignore(JOIN_PHASES, &join.skip_phases, &join.node_registration)?;
    let timeouts = join.timeouts.clone().unwrap_or_default();
    let t = |v: Option<&String>, what: &str| -> Result<Duration> {
        match v {
            Some(s) => parse_go_duration_std(s).map_err(|e| anyhow!("timeouts.{what}: {e}")),
            None => Ok(STANDIN_DEFAULT_WAIT),
        }
    };
    let discovery_wait = t(timeouts.discovery.as_ref(), "discovery")?;
    let kubelet_wait = t(timeouts.kubelet_health_check.as_ref(), "kubeletHealthCheck")?;
    let api_wait = t(
        timeouts.control_plane_component_health_check.as_ref(),
        "controlPlaneComponentHealthCheck",
    )?;
    let ca_cert_path = join
        .ca_cert_path
        .clone()
        .unwrap_or_else(|| "/etc/kubernetes/pki/ca.crt".to_owned());
    // As real kubeadm join: a KubeletConfiguration document is ignored
    // (the kubelet's configuration is the cluster's), so a machine's own
    // kubelet settings must come as kubeletExtraArgs or patches.
    if node::raw_kubelet_doc(&text).is_some() {
        println!(
            "[config] WARNING: Ignored configuration document with GroupVersionKind {}, Kind=KubeletConfiguration",
            drover_common::kubeadm::KUBELET_API_VERSION
        );
    }

    println!("[preflight] Running pre-flight checks");
    if !skip.skipped("preflight") {
        let mut pf = Preflight::default();
        pf.file_available(root, "/etc/kubernetes/kubelet.conf");
        pf.file_available(root, "/etc/kubernetes/bootstrap-kubelet.conf");
        match &cp_endpoint {
            None => {
                pf.file_available(root, &ca_cert_path);
                let pki = ca_cert_path
                    .rsplit_once('/')
                    .map(|(d, _)| d)
                    .unwrap_or("/etc/kubernetes/pki");
                for key in ["ca.key", "front-proxy-ca.key", "etcd/ca.key", "sa.key"] {
                    let logical = format!("{pki}/{key}");
                    if root.path(&logical).exists() {
                        pf.error(
                            format!("FileAvailable-{}", logical.replace('/', "-")),
                            format!("{logical} exists: a worker must never hold a CA or service-account key"),
                        );
                    }
                }
            }
            Some((adv, port)) => {
                node::control_plane_files_available(&mut pf, root);
                pf.port(&adv.to_string(), *port);
            }
        }
        pf.finish(&ignore)?;
    }
    let disc = discover(
        &bt.api_server_endpoint,
        &bt.token,
        &bt.ca_cert_hashes,
        unsafe_skip,
        discovery_wait,
    )
    .await
    .in_phase("preflight")?;
    println!("[preflight] Reading configuration from the cluster...");
    println!("[preflight] FYI: You can look at this config file with 'kubectl -n kube-system get cm kubeadm-config -o yaml'");
    let cc_yaml = fetch_cluster_configuration(
        &bt.api_server_endpoint,
        &disc.ca_pem,
        &tls_token,
        discovery_wait,
    )
    .await
    .in_phase("preflight")?;
    let cc = crate::kconfig::parse(&cc_yaml)
        .map_err(|e| anyhow!("the kubeadm-config ConfigMap: {e:#}"))
        .in_phase("preflight")?
        .cluster
        .ok_or_else(|| anyhow!("the kubeadm-config ConfigMap holds no ClusterConfiguration"))
        .in_phase("preflight")?;
    let cs = ClusterSettings::from_config(&cc).in_phase("preflight")?;
    // The kubelet's configuration is the cluster's, with this machine's
    // patches; kubeadm waits for the kubelet on its healthz address
    // (cmd/kubeadm/app/cmd/phases/join/kubelet.go).
    let kubelet_config = fetch_kubelet_configuration(
        &bt.api_server_endpoint,
        &disc.ca_pem,
        &tls_token,
        discovery_wait,
    )
    .await
    .and_then(|doc| node::node_kubelet_config(Some(doc), &cs))
    .in_phase("preflight")?;
    let patches = patches_dir
        .map(|dir| crate::patches::load(root, &dir))
        .transpose()
        .in_phase("preflight")?;
    let kubelet = node::KubeletStart::new(kubelet_config, patches.as_ref(), kubelet_wait)
        .in_phase("preflight")?;
    if !skip.skipped("preflight") {
        // Where the kubelet will listen is known once its configuration is.
        let mut pf = Preflight::default();
        let (host, port) = kubelet
            .listen_address(&join.node_registration)
            .in_phase("preflight")?;
        pf.port(&host, port);
        pf.finish(&ignore)?;
    }

    let Some((advertise, bind_port)) = cp_endpoint else {
        // Worker join.
        if dry_run {
            println!("[dryrun] Would write {ca_cert_path}, /etc/kubernetes/kubelet.conf and the kubelet files, and start the stand-in kubelet");
            return Ok(());
        }
        if !skip.skipped("kubelet-start") {
            write_file(&root.path(&ca_cert_path), disc.ca_pem.as_bytes(), 0o644)
                .in_phase("kubelet-start")?;
            let user = format!("system:node:{node_name}");
            let creds = tls_bootstrap(&disc.server, &disc.ca_pem, &tls_token.to_string(), &user)
                .await
                .in_phase("kubelet-start")?;
            let text = certs::render_kubeconfig(
                &cs.cluster_name,
                &disc.server,
                &disc.ca_pem,
                &user,
                Some(&creds),
            );
            write_file(
                &root.path("/etc/kubernetes/kubelet.conf"),
                text.as_bytes(),
                0o600,
            )
            .in_phase("kubelet-start")?;
            kubelet
                .run(root, &node_name, &join.node_registration)
                .await?;
            println!("[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap");
        }
        println!("\nThis node has joined the cluster:\n* Certificate signing request was sent to apiserver and a response was received.\n* The Kubelet was informed of the new secure connection details.\n");
        println!("Run 'kubectl get nodes' on the control-plane to see this node join the cluster.");
        return Ok(());
    };

    // Control-plane join.
    if cs.control_plane_endpoint.is_none() {
        return Err(anyhow!(
            "unable to add a new control plane instance to a cluster that doesn't have a stable controlPlaneEndpoint address\n\nPlease ensure that:\n* The cluster has a stable controlPlaneEndpoint address."
        ))
        .in_phase("preflight");
    }
    crate::util::check_control_plane_version(&cs.kubernetes_version).in_phase("preflight")?;
    let set = check_shared_ca_set(root, &cs.cert_dir, cs.alg).in_phase("preflight")?;
    let local_pin = CaPin::from_cert_der(&set.ca.cert_der).map_err(|e| anyhow!("{e}"))?;
    if local_pin != disc.ca_pin {
        return Err(anyhow!(
            "the local cluster CA {}/ca.crt (pin {local_pin}) is not the CA this cluster publishes in cluster-info (pin {}): the shared CA set belongs to another cluster",
            cs.cert_dir,
            disc.ca_pin
        ))
        .in_phase("preflight");
    }
    let cp_node = ControlPlaneNode::new(&node_name, advertise, bind_port, true);
    if dry_run {
        println!("[dryrun] The shared CA set is complete, valid and matches the cluster");
        println!("[dryrun] Would write the leaf certificates, kubeconfigs, static Pod manifests and kubelet files, and start the stand-in kubelet and API server on {}", join_host_port(&advertise.to_string(), bind_port));
        return Ok(());
    }
    let server = cs.server_url(&advertise.to_string(), bind_port);
    let local_server = cp_node.local_server();
    println!(
        "[preflight] Running pre-flight checks before initializing the new control plane instance"
    );
    if !skip.skipped("control-plane-prepare/certs") {
        node::write_leaf_certs(
            root,
            &cs,
            &set,
            &cp_node,
            &skip,
            "control-plane-prepare/certs",
        )
        .in_phase("control-plane-prepare/certs")?;
    }
    if !skip.skipped("control-plane-prepare/kubeconfig") {
        let specs = vec![
            KubeconfigSpec {
                file: "admin.conf",
                user: "kubernetes-admin".into(),
                orgs: vec!["kubeadm:cluster-admins".into()],
                server: server.clone(),
            },
            KubeconfigSpec {
                file: "controller-manager.conf",
                user: "system:kube-controller-manager".into(),
                orgs: vec![],
                server: local_server.clone(),
            },
            KubeconfigSpec {
                file: "scheduler.conf",
                user: "system:kube-scheduler".into(),
                orgs: vec![],
                server: local_server.clone(),
            },
        ];
        node::write_kubeconfigs(root, &cs, &set, &specs)
            .in_phase("control-plane-prepare/kubeconfig")?;
    }
    if !skip.skipped("control-plane-prepare/control-plane") {
        node::write_control_plane_manifests(
            root,
            &cs,
            &cp_node,
            &skip,
            "control-plane-prepare/control-plane",
        )
        .in_phase("control-plane-prepare/control-plane")?;
    }
    if !skip.skipped("kubelet-start") {
        let kubelet_spec = KubeconfigSpec {
            file: "kubelet.conf",
            user: format!("system:node:{node_name}"),
            orgs: vec!["system:nodes".into()],
            server: server.clone(),
        };
        node::write_kubeconfigs(root, &cs, &set, &[kubelet_spec]).in_phase("kubelet-start")?;
        kubelet
            .run(root, &node_name, &join.node_registration)
            .await?;
    }
    let etcd_url = node::etcd_client_url(advertise);
    if !skip.skipped("control-plane-join/etcd") {
        let peer_url = format!("https://{}", join_host_port(&advertise.to_string(), 2380));
        let (etcd, initial) = add_etcd_member(root, &cs.cert_dir, &server, &node_name, &peer_url)
            .await
            .in_phase("control-plane-join/etcd")?;
        node::write_etcd_manifest(root, &cs, &cp_node, Some(&initial))
            .in_phase("control-plane-join/etcd")?;
        println!("[etcd] Announced new etcd member joining to the existing etcd cluster");
        println!(
            "[etcd] Waiting for the new etcd member to join the cluster. This can take up to {}",
            crate::util::format_go_duration(api_wait)
        );
        node::start_etcd(root, &cs.cert_dir, advertise, api_wait)
            .await
            .in_phase("control-plane-join/etcd")?;
        // The learner votes once in sync (local.go: MemberPromote after the
        // manifest, before the cluster is waited for).
        println!("[etcd] Promoting the etcd learner {peer_url} to a voting member");
        etcd.promote_member(&peer_url, api_wait)
            .await
            .in_phase("control-plane-join/etcd")?;
    }
    store::save_local_cluster_config(root, &cc_yaml).in_phase("wait-control-plane")?;
    node::start_apiserver(root, &cp_node, &cs, &etcd_url, &set.ca.cert_pem, api_wait)
        .await
        .in_phase("wait-control-plane")?;
    if !skip.skipped("control-plane-join/mark-control-plane") {
        println!("[mark-control-plane] Marking the node {node_name} as control-plane by adding the labels: [node-role.kubernetes.io/control-plane node.kubernetes.io/exclude-from-external-load-balancers]");
        println!("[mark-control-plane] Marking the node {node_name} as control-plane by adding the taints [node-role.kubernetes.io/control-plane:NoSchedule]");
    }
    println!("\nThis node has joined the cluster and a new control plane instance was created:\n\n* Certificate signing request was sent to apiserver and approval was received.\n* The Kubelet was informed of the new secure connection details.\n* Control plane label and taint were applied to the new node.\n* The Kubernetes control plane instances scaled up.\n* A new etcd member was added to the local/stacked etcd cluster.\n");
    Ok(())
}

/// Adds this machine's etcd member through the cluster's existing members,
/// which it finds as kubeadm does: the etcd Pods' client-URL annotations,
/// read through the control-plane endpoint with the admin credentials.
/// The member is added as a learner (see [`store::Store::add_member`]).
/// Returns the client it was added with and the new member's
/// `--initial-cluster`.
async fn add_etcd_member(
    root: &Root,
    cert_dir: &str,
    server: &str,
    node_name: &str,
    peer_url: &str,
) -> Result<(store::Store, String)> {
    let text = std::fs::read_to_string(root.path("/etc/kubernetes/admin.conf"))
        .map_err(|e| anyhow!("open /etc/kubernetes/admin.conf: {e}"))?;
    let kc = crate::certs::parse_kubeconfig(&text, None)?;
    let (Some(ca), Some(cert), Some(key)) = (kc.ca_pem, kc.client_cert_pem, kc.client_key_pem)
    else {
        bail!("/etc/kubernetes/admin.conf has no CA or client credentials");
    };
    let client = net::http_client(
        net::client_config(&ca, Some((&cert, &key)))?,
        Duration::from_secs(5),
    )?;
    let url = format!("{server}/api/v1/namespaces/kube-system/pods?labelSelector=component%3Detcd");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let pods = fetch_json(&client, &url, None, deadline).await?;
    let endpoints: Vec<String> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            p["metadata"]["annotations"]["kubeadm.kubernetes.io/etcd.advertise-client-urls"]
                .as_str()
        })
        .flat_map(|urls| urls.split(',').map(str::to_owned))
        .collect();
    if endpoints.is_empty() {
        bail!("no etcd member found: the cluster lists no etcd Pod");
    }
    println!(
        "[etcd] Adding etcd member {peer_url} through {}",
        endpoints.join(",")
    );
    let access = store::EtcdAccess::apiserver(root, cert_dir, &endpoints[0])?.at(endpoints);
    let etcd = store::Store::connect(&access).await?;
    println!("[etcd] Adding etcd member {peer_url} as a learner");
    let initial = etcd.add_member(node_name, peer_url).await?;
    Ok((etcd, initial))
}

/// The kubelet's TLS bootstrap, as `kubeadm join` leaves it to the kubelet:
/// a new key, a CertificateSigningRequest for `system:node:NAME` sent with
/// the bootstrap token, and the certificate the cluster signs (the
/// stand-in API server approves and signs node client requests from
/// bootstrappers at once, as kube-controller-manager's csrapproving and
/// csrsigning controllers do).
async fn tls_bootstrap(
    server: &str,
    ca_pem: &str,
    token: &str,
    user: &str,
) -> Result<certs::Issued> {
    use base64::Engine;
    let (key_pem, csr_pem) = drover_common::pki::generate_key_and_csr(user)
        .map_err(|e| anyhow!("cannot make the kubelet's key and CSR: {e}"))?;
    let client = net::http_client(net::client_config(ca_pem, None)?, Duration::from_secs(10))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "csr-"},
        "spec": {
            "request": b64.encode(csr_pem.as_bytes()),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "client auth"],
        },
    });
    let url = format!("{server}/apis/certificates.k8s.io/v1/certificatesigningrequests");
    let resp = client
        .post(&url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .map_err(|e| anyhow!("POST {url}: {e}"))?;
    let code = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if !code.is_success() {
        bail!(
            "the kubelet's certificate signing request was refused: {} ({})",
            status_message(&text),
            code.as_u16()
        );
    }
    let csr: Value =
        serde_json::from_str(&text).map_err(|e| anyhow!("POST {url}: invalid JSON: {e}"))?;
    let cert = csr["status"]["certificate"]
        .as_str()
        .and_then(|c| b64.decode(c).ok())
        .and_then(|c| String::from_utf8(c).ok())
        .ok_or_else(|| anyhow!("the certificate signing request was not issued"))?;
    println!("[kubelet-start] The kubelet's client certificate was signed by the cluster");
    Ok(certs::Issued {
        cert_pem: cert,
        key_pem,
    })
}
