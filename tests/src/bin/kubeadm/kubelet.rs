//! The stand-in kubelet (`kubeadm __standin-kubelet`): plain HTTP `/healthz`
//! on the KubeletConfiguration's healthzBindAddress:healthzPort, failing while
//! `<root>/var/lib/kubelet/standin-fail` exists; and, as a real kubelet does,
//! it registers its Node with the API server (`kubelet.conf`'s credentials)
//! and renews the Node's `Ready` condition every few seconds: NotReady while
//! failing, and, as the real one, NotReady with "cni plugin not
//! initialized" until a CNI network configuration exists in
//! `/etc/cni/net.d` on its machine. A Node deleted through the API is not registered again until
//! the kubelet restarts.

use std::convert::Infallible;
use std::sync::Arc;

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::daemon;
use crate::util::{join_host_port, Root};

pub const CONFIG_FILE: &str = "/var/lib/kubelet/config.yaml";
pub const FAIL_FILE: &str = "/var/lib/kubelet/standin-fail";

pub const FLAGS_FILE: &str = "/var/lib/kubelet/kubeadm-flags.env";

/// The healthz address the kubelet serves: its config file's (kubelet
/// defaults: 127.0.0.1:10248), overridden by the flags kubeadm wrote to
/// `kubeadm-flags.env`, as kubelet flags override its config file.
pub fn healthz_address(root: &Root) -> Result<(String, u16)> {
    let text = std::fs::read_to_string(root.path(CONFIG_FILE))
        .with_context(|| format!("failed to load kubelet config file, path: {CONFIG_FILE}"))?;
    let doc: serde_json::Value = serde_saphyr::from_str(&text)
        .with_context(|| format!("failed to parse kubelet config file {CONFIG_FILE}"))?;
    let flags = std::fs::read_to_string(root.path(FLAGS_FILE)).unwrap_or_default();
    let flags: Vec<(String, String)> = flags
        .split(['"', ' ', '\n'])
        .filter_map(|f| f.strip_prefix("--")?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    Ok(with_flags(healthz_from_doc(&doc), &flags))
}

/// The healthz address of a kubelet started with `doc` (or none) as its
/// config and `extra_args` as flags.
pub fn healthz_for(
    doc: Option<&serde_json::Value>,
    extra_args: &[drover_common::kubeadm::Arg],
) -> (String, u16) {
    let base = doc
        .map(healthz_from_doc)
        .unwrap_or_else(|| ("127.0.0.1".into(), 10248));
    let flags: Vec<(String, String)> = extra_args
        .iter()
        .map(|a| (a.name.clone(), a.value.clone()))
        .collect();
    with_flags(base, &flags)
}

/// `--healthz-bind-address` and `--healthz-port` over the config's values.
fn with_flags((mut host, mut port): (String, u16), flags: &[(String, String)]) -> (String, u16) {
    for (name, value) in flags {
        match name.as_str() {
            "healthz-bind-address" if !value.is_empty() => host = value.clone(),
            "healthz-port" => {
                if let Some(p) = value.parse::<u16>().ok().filter(|p| *p != 0) {
                    port = p;
                }
            }
            _ => {}
        }
    }
    (host, port)
}

pub fn healthz_from_doc(doc: &serde_json::Value) -> (String, u16) {
    let addr = doc
        .get("healthzBindAddress")
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("127.0.0.1")
        .to_owned();
    let port = doc
        .get("healthzPort")
        .and_then(|v| v.as_u64())
        .filter(|p| *p != 0 && *p <= u16::MAX as u64)
        .unwrap_or(10248) as u16;
    (addr, port)
}

pub fn run(root: Root) -> Result<()> {
    daemon::run(&root, "kubelet", None, serve(&root))
}

async fn serve(root: &Root) -> Result<()> {
    let (host, port) = healthz_address(root)?;
    let bind = join_host_port(&host, port);
    let listener = TcpListener::bind(&bind)
        .await
        .with_context(|| format!("failed to listen on {bind}"))?;
    println!(
        "standin-kubelet: serving healthz on http://{bind}/healthz (pid {}, root {})",
        std::process::id(),
        root.dir().display()
    );
    let fail_file = Arc::new(root.path(FAIL_FILE));
    tokio::spawn(node_status_loop(root.clone()));
    let watchdog = daemon::watchdog(root.clone(), "kubelet");
    tokio::pin!(watchdog);
    let term = daemon::termination();
    tokio::pin!(term);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let fail_file = fail_file.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let fail_file = fail_file.clone();
                        async move {
                            let (code, body) = match (req.method(), req.uri().path()) {
                                (&Method::GET, "/healthz") if fail_file.exists() => {
                                    (StatusCode::INTERNAL_SERVER_ERROR, "kubelet unhealthy")
                                }
                                (&Method::GET, "/healthz") => (StatusCode::OK, "ok"),
                                _ => (StatusCode::NOT_FOUND, "404 page not found"),
                            };
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .status(code)
                                    .header("content-type", "text/plain; charset=utf-8")
                                    .body(Full::new(Bytes::from_static(body.as_bytes())))
                                    .expect("valid response"),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
            sig = &mut term => {
                println!("standin-kubelet: received {}, shutting down", sig?);
                return Ok(());
            }
            _ = &mut watchdog => return Ok(()),
        }
    }
}

/// How often the kubelet renews its Node's status (the real default is 10s;
/// tests want it brisk).
const NODE_STATUS_UPDATE: std::time::Duration = std::time::Duration::from_secs(2);

/// Registers the Node, then renews its status until the kubelet stops.
async fn node_status_loop(root: Root) {
    // The kubelet's version is the binary's: read once, at start (an
    // upgrade takes a restart).
    let version = crate::util::kubelet_version_string();
    let mut registered = false;
    let mut gone = false;
    loop {
        if !gone {
            match node_status_once(&root, registered, &version).await {
                Ok(NodeUpdate::Registered) => {
                    println!("standin-kubelet: node registered");
                    registered = true;
                }
                Ok(NodeUpdate::Renewed) => registered = true,
                Ok(NodeUpdate::Deleted) => {
                    println!("standin-kubelet: the node object was deleted; not registering it again until restarted");
                    gone = true;
                }
                Err(e) => println!("standin-kubelet: node status update failed: {e:#}"),
            }
        }
        tokio::time::sleep(NODE_STATUS_UPDATE).await;
    }
}

enum NodeUpdate {
    Registered,
    Renewed,
    Deleted,
}

async fn node_status_once(root: &Root, registered: bool, version: &str) -> Result<NodeUpdate> {
    let text = std::fs::read_to_string(root.path("/etc/kubernetes/kubelet.conf"))
        .context("open /etc/kubernetes/kubelet.conf")?;
    let kc = crate::certs::parse_kubeconfig(&text, None)?;
    let (Some(ca), Some(cert), Some(key)) = (kc.ca_pem, kc.client_cert_pem, kc.client_key_pem)
    else {
        anyhow::bail!("kubelet.conf has no CA or client credentials");
    };
    let der = drover_common::pki::first_cert_der(&cert)
        .map_err(|e| anyhow::anyhow!("kubelet.conf: {e}"))?;
    let (cn, _) =
        crate::certs::subject(&der).context("kubelet.conf: unreadable client certificate")?;
    let name = cn
        .strip_prefix("system:node:")
        .context("kubelet.conf: the client certificate is not a node's")?
        .to_owned();
    let client = crate::net::http_client(
        crate::net::client_config(&ca, Some((&cert, &key)))?,
        std::time::Duration::from_secs(3),
    )?;
    let ready = if root.path(FAIL_FILE).exists() {
        Err("the stand-in kubelet is told to fail".to_owned())
    } else {
        network_ready(root)
    };
    let control_plane = root
        .path("/etc/kubernetes/manifests/kube-apiserver.yaml")
        .exists();
    let mut node = node_object(&name, ready, control_plane, version);
    node["status"]["addresses"] = node_addresses(root, &name);
    if !registered {
        let r = client
            .post(format!("{}/api/v1/nodes", kc.server))
            .json(&node)
            .send()
            .await?;
        if r.status().is_success() || r.status() == StatusCode::CONFLICT {
            return Ok(NodeUpdate::Registered);
        }
        anyhow::bail!(
            "register node {name}: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        );
    }
    let r = client
        .put(format!("{}/api/v1/nodes/{name}/status", kc.server))
        .json(&node)
        .send()
        .await?;
    match r.status() {
        s if s.is_success() => Ok(NodeUpdate::Renewed),
        StatusCode::NOT_FOUND => Ok(NodeUpdate::Deleted),
        s => anyhow::bail!(
            "update node {name}: {s} {}",
            r.text().await.unwrap_or_default()
        ),
    }
}

/// Where the container runtime looks for a CNI network configuration.
pub const CNI_CONF_DIR: &str = "/etc/cni/net.d";

/// Whether the container runtime's network is ready, as containerd decides
/// it: some file in `/etc/cni/net.d` ending in `.conf`, `.conflist` or
/// `.json` holds a network configuration (JSON with a `name`, and a `type`
/// or `plugins`). Otherwise the message the real kubelet puts on its Node.
pub fn network_ready(root: &Root) -> Result<(), String> {
    let dir = root.path(CNI_CONF_DIR);
    let found = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            [".conf", ".conflist", ".json"]
                .iter()
                .any(|ext| name.ends_with(ext))
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .any(|conf| {
            conf["name"].is_string() && (conf["type"].is_string() || conf["plugins"].is_array())
        });
    if found {
        Ok(())
    } else {
        Err("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized".to_owned())
    }
}

/// The Node as this kubelet reports it: Ready, or NotReady and why.
fn node_object(
    name: &str,
    ready: Result<(), String>,
    control_plane: bool,
    version: &str,
) -> serde_json::Value {
    let now = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or(time::OffsetDateTime::now_utc())
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let mut labels = serde_json::json!({
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
    });
    if control_plane {
        labels["node-role.kubernetes.io/control-plane"] = "".into();
    }
    let (status, reason, message) = match &ready {
        Ok(()) => ("True", "KubeletReady", "kubelet is posting ready status"),
        Err(why) => ("False", "KubeletNotReady", why.as_str()),
    };
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "conditions": [{
                "type": "Ready",
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }],
            "nodeInfo": {"kubeletVersion": version, "operatingSystem": "linux", "architecture": "amd64"},
        },
    })
}

/// The Node's addresses as the kubelet sets them (pkg/kubelet/nodestatus/
/// setters.go NodeAddress): the InternalIP is `--node-ip` when given,
/// otherwise the address of the interface holding the default route
/// (k8s.io/apimachinery/pkg/util/net ChooseHostInterface; the address a
/// socket towards the outside would leave from), and the Hostname.
fn node_addresses(root: &Root, name: &str) -> serde_json::Value {
    let flags = std::fs::read_to_string(root.path(FLAGS_FILE)).unwrap_or_default();
    let node_ip = flags
        .split(['"', ' ', '\n'])
        .find_map(|f| f.strip_prefix("--node-ip="))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.trim().parse::<std::net::IpAddr>().ok())
        .or_else(|| {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
            s.connect("192.0.2.1:9").ok()?;
            Some(s.local_addr().ok()?.ip())
        });
    let mut addresses = Vec::new();
    if let Some(ip) = node_ip {
        addresses.push(serde_json::json!({"type": "InternalIP", "address": ip.to_string()}));
    }
    addresses.push(serde_json::json!({"type": "Hostname", "address": name}));
    serde_json::Value::Array(addresses)
}
