//! The stand-in kubelet (`kubeadm __standin-kubelet`): plain HTTP `/healthz`
//! on the KubeletConfiguration's healthzBindAddress:healthzPort (or on what
//! the `--healthz-*` flags in `kubeadm-flags.env` say instead, as a real
//! kubelet's flags override its config file), failing while
//! `<root>/var/lib/kubelet/standin-fail` exists; and, as a real kubelet does,
//! it registers its Node with the API server (`kubelet.conf`'s credentials)
//! and renews the Node's `Ready` condition every few seconds: NotReady while
//! failing, and, as the real one, NotReady with "cni plugin not
//! initialized" until a CNI network configuration exists in
//! `/etc/cni/net.d` on its machine. A Node deleted through the API (or
//! missing from a restored etcd) is not registered again until the kubelet
//! restarts, as upstream's `pkg/kubelet/kubelet_node_status.go`:
//! `registerWithAPIServer` returns at once when `registrationCompleted` is set,
//! and the status update then fails on the missing Node.

use std::convert::Infallible;
use std::sync::Arc;

use anyhow::{Context, Result};
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::daemon;
use crate::util::{join_host_port, Root};

pub const CONFIG_FILE: &str = "/var/lib/kubelet/config.yaml";
pub const FAIL_FILE: &str = "/var/lib/kubelet/standin-fail";

pub const FLAGS_FILE: &str = "/var/lib/kubelet/kubeadm-flags.env";

/// The healthz address the kubelet daemon serves: its config file's,
/// overridden by the flags kubeadm wrote to `kubeadm-flags.env`, as kubelet
/// flags override its config file. kubeadm itself never looks at the flags
/// (see [`healthz_of_config`]).
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
    let base =
        healthz_of_config(&doc).with_context(|| format!("kubelet config file {CONFIG_FILE}"))?;
    with_flags(base, &flags)
}

/// `--healthz-bind-address` and `--healthz-port` over the config's values,
/// as the kubelet takes them; a port flag that is no port is refused, as
/// the kubelet's flag parsing and validation refuse it (0, which turns the
/// healthz server off, too: nothing could wait on it).
pub fn with_flags(
    (mut host, mut port): (String, u16),
    flags: &[(String, String)],
) -> Result<(String, u16)> {
    for (name, value) in flags {
        match name.as_str() {
            "healthz-bind-address" if !value.is_empty() => host = value.clone(),
            "healthz-port" => {
                port = value.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                    anyhow::anyhow!("invalid argument {value:?} for \"--healthz-port\" flag: the stand-in kubelet needs a port between 1 and 65535")
                })?;
            }
            _ => {}
        }
    }
    Ok((host, port))
}

/// Where kubeadm waits for the kubelet: the `healthzBindAddress` and
/// `healthzPort` of the kubelet configuration it wrote, its patches
/// applied, never a kubelet flag (`cmd/kubeadm/app/cmd/phases/join/
/// kubelet.go` `runKubeletWaitBootstrapPhase` and init's
/// `wait-control-plane` phase: `ApplyPatchesToConfig`, then
/// `WaitForKubelet(HealthzBindAddress, *HealthzPort)`), with the kubelet's
/// defaults (`127.0.0.1`, `10248`) for what the document leaves out.
/// Strict as decoding into the Go type and the kubelet's validation are: a
/// port that is no integer between 1 and 65535, or an address that is no
/// string, is an error (port 0 turns the healthz server off, and kubeadm
/// would wait in vain).
pub fn healthz_of_config(doc: &serde_json::Value) -> Result<(String, u16)> {
    let host = match doc.get("healthzBindAddress") {
        None | Some(serde_json::Value::Null) => "127.0.0.1".to_owned(),
        Some(serde_json::Value::String(s)) if s.is_empty() => "127.0.0.1".to_owned(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => anyhow::bail!(
            "KubeletConfiguration.healthzBindAddress: cannot unmarshal {other} into a string"
        ),
    };
    let port = match doc.get("healthzPort") {
        None | Some(serde_json::Value::Null) => 10248,
        Some(v) => v
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                anyhow::anyhow!("invalid configuration: healthzPort (--healthz-port) {v} must be between 1 and 65535, inclusive")
            })?,
    };
    Ok((host, port))
}

/// The ConfigMap `kube-system/kubelet-config` `kubeadm init` uploads the
/// cluster's kubelet configuration to, under the data key `kubelet`
/// (cmd/kubeadm/app/constants: `KubeletBaseConfigurationConfigMap`,
/// `KubeletBaseConfigurationConfigMapKey`); joining machines and upgrades
/// write `/var/lib/kubelet/config.yaml` from it.
pub const CONFIG_MAP: &str = "kubelet-config";
pub const CONFIG_MAP_KEY: &str = "kubelet";
pub const CONFIG_MAP_PATH: &str = "/api/v1/namespaces/kube-system/configmaps/kubelet-config";

/// The ConfigMap holding `config` (cmd/kubeadm/app/phases/kubelet/
/// config.go `CreateConfigMap`).
pub fn config_map(config: &serde_json::Value) -> Result<serde_json::Value> {
    let yaml = serde_saphyr::to_string(config)
        .map_err(|e| anyhow::anyhow!("cannot render the kubelet configuration: {e}"))?;
    Ok(serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": "kube-system"},
        "data": {CONFIG_MAP_KEY: yaml},
    }))
}

/// The kubelet configuration a `kubelet-config` ConfigMap holds: a
/// KubeletConfiguration of `kubelet.config.k8s.io/v1beta1`.
pub fn from_config_map(cm: &serde_json::Value) -> Result<serde_json::Value> {
    let yaml = cm["data"][CONFIG_MAP_KEY].as_str().ok_or_else(|| {
        anyhow::anyhow!("the {CONFIG_MAP} ConfigMap has no data.{CONFIG_MAP_KEY}")
    })?;
    let doc: serde_json::Value = serde_saphyr::from_str(yaml)
        .map_err(|e| anyhow::anyhow!("the {CONFIG_MAP} ConfigMap: invalid YAML: {e}"))?;
    let api_version = drover_common::kubeadm::KUBELET_API_VERSION;
    if doc["kind"] != "KubeletConfiguration" || doc["apiVersion"] != api_version {
        anyhow::bail!("the {CONFIG_MAP} ConfigMap holds no KubeletConfiguration of {api_version}");
    }
    Ok(doc)
}

/// The URL kubeadm (or anyone) checks the kubelet's health at.
pub fn healthz_url(host: &str, port: u16) -> String {
    format!("http://{}/healthz", join_host_port(host, port))
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
    daemon::accept_until_stopped(root, "kubelet", &listener, |tcp| {
        let fail_file = fail_file.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let fail_file = fail_file.clone();
                    async move {
                        let (code, body) = match (req.method(), req.uri().path()) {
                            (&Method::GET, "/healthz") if fail_file.exists() => {
                                (StatusCode::INTERNAL_SERVER_ERROR, "kubelet unhealthy")
                            }
                            (&Method::GET, "/healthz") => (StatusCode::OK, "ok"),
                            _ => (StatusCode::NOT_FOUND, "404 page not found"),
                        };
                        Ok::<_, Infallible>(crate::apiserver::text(code, body))
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    })
    .await
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
    if let Some(id) = flag_value(root, "provider-id") {
        node["spec"]["providerID"] = id.into();
    }
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
    // As the real kubelet (`tryUpdateNodeStatus` in
    // pkg/kubelet/kubelet_node_status.go): read the Node, set its own
    // conditions (a condition keeps its lastTransitionTime while its
    // status stays), and send a strategic merge patch of the status
    // (`PatchNodeStatus`), so the conditions others keep on the Node
    // (node-problem-detector's, the Drover agent's) stay.
    let url = format!("{}/api/v1/nodes/{name}", kc.server);
    let r = client.get(&url).send().await?;
    match r.status() {
        s if s.is_success() => {
            let current: serde_json::Value = r.json().await?;
            let before = current["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if let Some(conds) = node["status"]["conditions"].as_array_mut() {
                for c in conds.iter_mut() {
                    if let Some(old) = before
                        .iter()
                        .find(|o| o["type"] == c["type"] && o["status"] == c["status"])
                    {
                        c["lastTransitionTime"] = old["lastTransitionTime"].clone();
                    }
                }
            }
        }
        StatusCode::NOT_FOUND => return Ok(NodeUpdate::Deleted),
        s => anyhow::bail!(
            "read node {name}: {s} {}",
            r.text().await.unwrap_or_default()
        ),
    }
    let r = client
        .patch(format!("{url}/status"))
        .header("Content-Type", "application/strategic-merge-patch+json")
        .body(serde_json::json!({"status": node["status"].clone()}).to_string())
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

/// The value of the kubelet's flag `--NAME=` in kubeadm's flags file.
///
/// `--provider-id` becomes the registered Node's `spec.providerID`, as the
/// kubelet's `initialNode` sets it (pkg/kubelet/kubelet_node_status.go);
/// later status updates leave the spec alone.
fn flag_value(root: &Root, name: &str) -> Option<String> {
    let flags = std::fs::read_to_string(root.path(FLAGS_FILE)).ok()?;
    let prefix = format!("--{name}=");
    flags
        .split(['"', ' ', '\n'])
        .find_map(|f| f.strip_prefix(prefix.as_str()))
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// The Node's addresses as the kubelet sets them (pkg/kubelet/nodestatus/
/// setters.go NodeAddress): the InternalIP is `--node-ip` when given,
/// otherwise the address of the interface holding the default route
/// (k8s.io/apimachinery/pkg/util/net ChooseHostInterface; the address a
/// socket towards the outside would leave from), and the Hostname.
fn node_addresses(root: &Root, name: &str) -> serde_json::Value {
    let node_ip = flag_value(root, "node-ip")
        .as_deref()
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubeadm_waits_on_the_config_and_the_kubelet_listens_on_flags_over_it() {
        let local = |port| ("127.0.0.1".to_owned(), port);
        assert_eq!(healthz_of_config(&json!({})).unwrap(), local(10248));
        let doc = json!({"healthzBindAddress": "127.0.0.5", "healthzPort": 10300});
        assert_eq!(
            healthz_of_config(&doc).unwrap(),
            ("127.0.0.5".to_owned(), 10300)
        );
        assert_eq!(
            healthz_of_config(&json!({"healthzBindAddress": ""})).unwrap(),
            local(10248)
        );
        for bad in [
            json!({"healthzPort": 0}),
            json!({"healthzPort": 70000}),
            json!({"healthzPort": "10300"}),
            json!({"healthzBindAddress": 1}),
        ] {
            assert!(healthz_of_config(&bad).is_err(), "{bad}");
        }
        let flag = |name: &str, value: &str| vec![(name.to_owned(), value.to_owned())];
        assert_eq!(
            with_flags(local(10300), &flag("healthz-port", "10301")).unwrap(),
            local(10301)
        );
        assert_eq!(
            with_flags(local(10300), &flag("node-ip", "10.0.0.1")).unwrap(),
            local(10300)
        );
        assert_eq!(
            with_flags(local(10300), &flag("healthz-bind-address", "127.0.0.9")).unwrap(),
            ("127.0.0.9".to_owned(), 10300)
        );
        assert!(with_flags(local(10300), &flag("healthz-port", "0")).is_err());
        assert!(with_flags(local(10300), &flag("healthz-port", "x")).is_err());
    }
}
