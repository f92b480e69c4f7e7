//! The node image's pod network (`spec.network.cni: image`) on this
//! machine, as kind's kindnetd keeps it on a flat network: the bridge of
//! this Node takes the Node's own pod range (`spec.podCIDR`, which the
//! controller manager's node IPAM gives every Node from the cluster's pod
//! subnet), and every other Node's pod range is routed to that Node's
//! `InternalIP`. A loop reads the Nodes through the API with the machine's
//! kubelet credentials (`/etc/kubernetes/kubelet.conf`), writes the CNI
//! config from the image's template only when it changes, and adds,
//! replaces and deletes its routes (marked with their own routing protocol
//! number, [`ROUTE_PROTOCOL`], so no other route is ever touched) until
//! they are exactly the other Nodes' ranges. The kubelet reports its Node
//! NotReady until the config exists, so a Node goes Ready only once its
//! bridge has its own range.
//!
//! The loop runs while `/etc/cni/net.d/.drover-image-network` exists: the
//! bootstrap writes it for `cni: image` ([`crate::files::install_image_cni`]);
//! `kubeadm reset` leaves `/etc/cni/net.d`, which the agent then removes,
//! and with it the marker, and the loop deletes its routes. Routes are
//! kept only when the agent's root is `/` (an agent of a test with a root
//! directory of its own shares the host's routing table).

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde::Serialize;

/// The marker of `cni: image`, under the machine's root.
pub const MARKER: &str = "etc/cni/net.d/.drover-image-network";

/// The routing protocol number of the routes to other Nodes' pod ranges
/// (`ip route show proto 207`); unassigned in `/etc/iproute2/rt_protos`.
pub const ROUTE_PROTOCOL: u8 = 207;

/// How often the Nodes are read while this Node's config is not written
/// yet or the last pass failed, and once it is.
const WAITING_PERIOD: Duration = Duration::from_secs(2);
const SETTLED_PERIOD: Duration = Duration::from_secs(5);

/// An IPv4 range, kept normalised (no host bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub bits: u8,
}

impl Cidr {
    pub fn new(addr: Ipv4Addr, bits: u8) -> Option<Self> {
        if bits > 32 {
            return None;
        }
        let mask = if bits == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(bits))
        };
        Some(Self {
            addr: Ipv4Addr::from(u32::from(addr) & mask),
            bits,
        })
    }
}

/// A text that is not an IPv4 CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IPv4 CIDR")]
pub struct NotACidr(String);

impl FromStr for Cidr {
    type Err = NotACidr;
    fn from_str(s: &str) -> Result<Self, NotACidr> {
        let bad = || NotACidr(s.to_owned());
        let (a, b) = s.split_once('/').ok_or_else(bad)?;
        Cidr::new(a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?).ok_or_else(bad)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

/// What the plan needs of one Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNet {
    pub name: String,
    /// `spec.podCIDR`, if given (an IPv4 one).
    pub pod_cidr: Option<Cidr>,
    /// The `InternalIP` of `status.addresses` (an IPv4 one).
    pub internal_ip: Option<Ipv4Addr>,
}

impl NodeNet {
    /// A Node as the API serves it.
    pub fn from_json(node: &serde_json::Value) -> Option<Self> {
        let name = node["metadata"]["name"].as_str()?.to_owned();
        let pod_cidr = node["spec"]["podCIDRs"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(std::iter::once(&node["spec"]["podCIDR"]))
            .filter_map(|c| c.as_str()?.parse().ok())
            .next();
        let internal_ip = node["status"]["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["type"] == "InternalIP")
            .filter_map(|a| a["address"].as_str()?.parse().ok())
            .next();
        Some(Self {
            name,
            pod_cidr,
            internal_ip,
        })
    }
}

/// Why this Node's CNI config cannot be written (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("Node {0} is not registered yet")]
    NotRegistered(String),
    #[error("Node {0} has no spec.podCIDR yet (the controller manager gives one from the cluster's pod subnet)")]
    NoPodCidr(String),
    #[error("the image's CNI config has no plugin with host-local IPAM to give the Node's range")]
    NoHostLocal,
    #[error("the image's CNI config cannot be written as JSON: {0}")]
    Json(String),
    #[error("cannot read {path}: {detail}")]
    Read { path: String, detail: String },
    #[error("{0} holds no .conflist")]
    NoTemplate(String),
    #[error("{name} is not JSON: {detail}")]
    NotJson { name: String, detail: String },
}

/// What to do on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// This Node's CNI config, or why there is none yet.
    pub conflist: Result<String, ConfigError>,
    /// The routes there should be: other Nodes' ranges to their addresses.
    pub routes: BTreeMap<Cidr, Ipv4Addr>,
    /// Routes to add, or to replace (their Node moved).
    pub add: Vec<(Cidr, Ipv4Addr)>,
    /// Routes to delete (their Node is gone or has another range).
    pub remove: Vec<(Cidr, Ipv4Addr)>,
    /// Other Nodes that cannot be routed to yet, and why.
    pub skipped: Vec<String>,
}

/// The plan for Node `own` of `nodes`, with the image's CNI config
/// `template` and the routes `current` this loop keeps now.
pub fn plan(
    own: &str,
    nodes: &[NodeNet],
    template: &serde_json::Value,
    current: &BTreeMap<Cidr, Ipv4Addr>,
) -> Plan {
    let me = nodes.iter().find(|n| n.name == own);
    let conflist = match me {
        None => Err(ConfigError::NotRegistered(own.to_owned())),
        Some(NodeNet { pod_cidr: None, .. }) => Err(ConfigError::NoPodCidr(own.to_owned())),
        Some(NodeNet {
            pod_cidr: Some(cidr),
            ..
        }) => conflist(template, *cidr),
    };
    let mut routes = BTreeMap::new();
    let mut skipped = Vec::new();
    let own_ip = me.and_then(|m| m.internal_ip);
    let own_cidr = me.and_then(|m| m.pod_cidr);
    for n in nodes.iter().filter(|n| n.name != own) {
        match (n.pod_cidr, n.internal_ip) {
            (None, _) => skipped.push(format!("{}: no spec.podCIDR", n.name)),
            (_, None) => skipped.push(format!("{}: no InternalIP", n.name)),
            (Some(c), Some(ip)) if Some(ip) == own_ip || Some(c) == own_cidr => {
                skipped.push(format!("{}: same address or range as {own}", n.name))
            }
            (Some(c), Some(ip)) => match routes.entry(c) {
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(ip);
                }
                // Two Nodes claiming one range: the first listed keeps it.
                std::collections::btree_map::Entry::Occupied(e) if *e.get() != ip => {
                    skipped.push(format!("{}: {c} is another Node's too", n.name))
                }
                std::collections::btree_map::Entry::Occupied(_) => {}
            },
        }
    }
    let add = routes
        .iter()
        .filter(|(c, ip)| current.get(c) != Some(ip))
        .map(|(c, ip)| (*c, *ip))
        .collect();
    let remove = current
        .iter()
        .filter(|(c, _)| !routes.contains_key(c))
        .map(|(c, ip)| (*c, *ip))
        .collect();
    Plan {
        conflist,
        routes,
        add,
        remove,
        skipped,
    }
}

/// The image's config with every `host-local` IPAM's ranges set to `cidr`.
pub fn conflist(template: &serde_json::Value, cidr: Cidr) -> Result<String, ConfigError> {
    let mut doc = template.clone();
    let mut set = 0;
    let plugins: Vec<&mut serde_json::Value> = match doc.get_mut("plugins") {
        Some(serde_json::Value::Array(p)) => p.iter_mut().collect(),
        _ => vec![],
    };
    for p in plugins {
        if p["ipam"]["type"] == "host-local" {
            p["ipam"]["ranges"] = serde_json::json!([[{"subnet": cidr.to_string()}]]);
            set += 1;
        }
    }
    if set == 0 {
        return Err(ConfigError::NoHostLocal);
    }
    let mut text =
        serde_json::to_string_pretty(&doc).map_err(|e| ConfigError::Json(e.to_string()))?;
    text.push('\n');
    Ok(text)
}

/// What the loop last did, for the heartbeat and `drover describe machine`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// This Node's pod range, once known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
    /// The routes kept: `range via address`, sorted.
    pub routes: Vec<String>,
    /// Why the last pass did not finish (empty when it did).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// The status shared with the agent's heartbeat: none while the machine
/// has no image network.
pub type Shared = Arc<Mutex<Option<Status>>>;

/// The image's config template: the one file of its `net.d` directory.
pub fn template(root: &Path) -> Result<(String, serde_json::Value), ConfigError> {
    let dir = root
        .join(drover_common::api::IMAGE_CNI_DIR.trim_start_matches('/'))
        .join("net.d");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| ConfigError::Read {
            path: dir.display().to_string(),
            detail: e.to_string(),
        })?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".conflist"))
        .collect();
    names.sort();
    let Some(name) = names.into_iter().next() else {
        return Err(ConfigError::NoTemplate(dir.display().to_string()));
    };
    let text = std::fs::read_to_string(dir.join(&name)).map_err(|e| ConfigError::Read {
        path: name.clone(),
        detail: e.to_string(),
    })?;
    let doc = serde_json::from_str(&text).map_err(|e| ConfigError::NotJson {
        name: name.clone(),
        detail: e.to_string(),
    })?;
    Ok((name, doc))
}

/// Runs the loop until the task is dropped.
pub async fn run(root: PathBuf, shared: Shared) {
    let manage_routes = root == Path::new("/");
    let mut kube = KubeletClient::default();
    let mut routes: Option<Routes> = None;
    // Routes of an earlier run may be left after a reset: look once.
    let mut may_have_routes = manage_routes;
    let mut last_error = String::new();
    loop {
        let active = root.join(MARKER).exists();
        let period = if active {
            let status = pass(&root, &mut kube, &mut routes, manage_routes).await;
            let settled = status.error.is_empty();
            may_have_routes |= !status.routes.is_empty();
            // Each new reason is logged once.
            if status.error != last_error {
                if !status.error.is_empty() {
                    tracing::warn!(reason = %status.error, "pod network not in place yet");
                }
                last_error = status.error.clone();
            }
            if let Ok(mut s) = shared.lock() {
                *s = Some(status);
            }
            if settled {
                SETTLED_PERIOD
            } else {
                WAITING_PERIOD
            }
        } else {
            if let Ok(mut s) = shared.lock() {
                *s = None;
            }
            if may_have_routes {
                match Routes::connect().await {
                    Ok(r) => match r.clear().await {
                        Ok(()) => may_have_routes = false,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot delete the pod network's routes")
                        }
                    },
                    Err(e) => tracing::warn!(error = %e, "cannot open netlink"),
                }
            }
            SETTLED_PERIOD
        };
        tokio::time::sleep(period).await;
    }
}

/// One pass: read, write the config if it changed, set the routes.
async fn pass(
    root: &Path,
    kube: &mut KubeletClient,
    routes: &mut Option<Routes>,
    manage_routes: bool,
) -> Status {
    let mut status = Status::default();
    let (name, template) = match template(root) {
        Ok(t) => t,
        Err(e) => {
            status.error = e.to_string();
            return status;
        }
    };
    let (own, nodes) = match kube.nodes(root).await {
        Ok(n) => n,
        Err(e) => {
            status.error = e.to_string();
            return status;
        }
    };
    status.pod_cidr = nodes
        .iter()
        .find(|n| n.name == own)
        .and_then(|n| n.pod_cidr)
        .map(|c| c.to_string());
    let current = if manage_routes {
        if routes.is_none() {
            match Routes::connect().await {
                Ok(r) => *routes = Some(r),
                Err(e) => {
                    status.error = format!("cannot open netlink: {e}");
                    return status;
                }
            }
        }
        match routes.as_ref().expect("connected").list().await {
            Ok(c) => c,
            Err(e) => {
                *routes = None;
                status.error = e.to_string();
                return status;
            }
        }
    } else {
        BTreeMap::new()
    };
    let plan = plan(&own, &nodes, &template, &current);
    match &plan.conflist {
        Ok(text) => {
            let path = root.join("etc/cni/net.d").join(&name);
            if std::fs::read(&path).ok().as_deref() != Some(text.as_bytes()) {
                if let Err(e) = drover_common::fsutil::write_atomic(&path, text.as_bytes(), 0o644) {
                    status.error = format!("cannot write {}: {e}", path.display());
                } else {
                    tracing::info!(path = %path.display(), pod_cidr = ?status.pod_cidr, "pod network config written");
                }
            }
        }
        Err(why) => status.error = why.to_string(),
    }
    if !manage_routes {
        return status;
    }
    let r = routes.as_ref().expect("connected");
    let mut kept = current.clone();
    for (cidr, via) in &plan.remove {
        match r.delete(*cidr, *via).await {
            Ok(()) => {
                kept.remove(cidr);
                tracing::info!(%cidr, %via, "pod route deleted");
            }
            Err(e) => status.error = format!("cannot delete the route to {cidr}: {e}"),
        }
    }
    for (cidr, via) in &plan.add {
        match r.replace(*cidr, *via).await {
            Ok(()) => {
                kept.insert(*cidr, *via);
                tracing::info!(%cidr, %via, "pod route set");
            }
            Err(e) => status.error = format!("cannot route {cidr} via {via}: {e}"),
        }
    }
    status.routes = kept.iter().map(|(c, ip)| format!("{c} via {ip}")).collect();
    status
}

/// The Nodes through the API, as this machine's kubelet.
#[derive(Default)]
pub(crate) struct KubeletClient {
    cached: Option<(Vec<u8>, String, String, reqwest::Client)>,
}

impl KubeletClient {
    /// Cordons (or uncordons) this machine's own Node, as the kubelet may
    /// (the NodeRestriction plugin lets a node change its own
    /// `spec.unschedulable`); the Node's name.
    pub(crate) async fn set_unschedulable(
        &mut self,
        root: &Path,
        unschedulable: bool,
    ) -> Result<String, KubeletApiError> {
        let (verb, value) = if unschedulable {
            ("cordon", serde_json::json!(true))
        } else {
            ("uncordon", serde_json::Value::Null)
        };
        let patch = serde_json::json!({"spec": {"unschedulable": value}});
        self.patch_own(root, "", "application/merge-patch+json", &patch, verb)
            .await
    }

    /// Sends `patch`, a strategic merge patch, to this machine's own Node's
    /// status (a node may patch its own status); the Node's name.
    pub(crate) async fn patch_own_status(
        &mut self,
        root: &Path,
        patch: &serde_json::Value,
    ) -> Result<String, KubeletApiError> {
        let what = "patch the status of";
        let kind = "application/strategic-merge-patch+json";
        self.patch_own(root, "/status", kind, patch, what).await
    }

    /// Patches this machine's own Node (`sub`: "" or a subresource such as
    /// "/status") with `patch` of media type `kind`; `what` names the call
    /// in errors ("cordon": "cordon node NAME at SERVER: ...").
    async fn patch_own(
        &mut self,
        root: &Path,
        sub: &str,
        kind: &str,
        patch: &serde_json::Value,
        what: &str,
    ) -> Result<String, KubeletApiError> {
        let (own, server, client) = self.client(root)?;
        let call = format!("{what} node {own} at {server}");
        let resp = client
            .patch(format!("{server}/api/v1/nodes/{own}{sub}"))
            .header("Content-Type", kind)
            .body(patch.to_string())
            .send()
            .await
            .map_err(|e| format!("{call}: {}", crate::api::error_chain(&e)))?;
        let code = resp.status();
        if !code.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(KubeletApiError(format!(
                "{call}: {code}: {}",
                body.chars().take(300).collect::<String>()
            )));
        }
        Ok(own)
    }

    /// This machine's Node name and every Node.
    async fn nodes(&mut self, root: &Path) -> Result<(String, Vec<NodeNet>), KubeletApiError> {
        let (own, server, client) = self.client(root)?;
        let url = format!("{server}/api/v1/nodes");
        let resp = client
            .get(&url)
            .send()
            .await
            .map_err(|e| format!("list nodes at {server}: {}", crate::api::error_chain(&e)))?;
        let code = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if !code.is_success() {
            return Err(KubeletApiError(format!(
                "list nodes at {server}: {code}: {}",
                body.chars().take(300).collect::<String>()
            )));
        }
        let list: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("list nodes: {e}"))?;
        let nodes = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(NodeNet::from_json)
            .collect();
        Ok((own, nodes))
    }

    fn client(
        &mut self,
        root: &Path,
    ) -> Result<(String, String, reqwest::Client), KubeletApiError> {
        let path = root.join("etc/kubernetes/kubelet.conf");
        let text = std::fs::read(&path)
            .map_err(|e| format!("cannot read {}: {e} (not joined yet)", path.display()))?;
        let doc: serde_json::Value = serde_saphyr::from_str(&String::from_utf8_lossy(&text))
            .map_err(|e| format!("{} is not a kubeconfig: {e}", path.display()))?;
        let cluster = &doc["clusters"][0]["cluster"];
        let user = &doc["users"][0]["user"];
        // Inline data, or a file (kubeadm's kubelet.conf names the rotated
        // client certificate, /var/lib/kubelet/pki/kubelet-client-current.pem).
        let pem =
            |data: &str, file: &str, v: &serde_json::Value| -> Result<String, KubeletApiError> {
                if let Some(d) = v[data].as_str() {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(d)
                        .map_err(|e| format!("kubelet.conf {data}: {e}"))?;
                    return Ok(String::from_utf8_lossy(&bytes).into_owned());
                }
                let f = v[file]
                    .as_str()
                    .ok_or_else(|| format!("kubelet.conf has no {data} or {file}"))?;
                std::fs::read_to_string(root.join(f.trim_start_matches('/')))
                    .map_err(|e| KubeletApiError(format!("cannot read {f}: {e}")))
            };
        let ca = pem(
            "certificate-authority-data",
            "certificate-authority",
            cluster,
        )?;
        let cert = pem("client-certificate-data", "client-certificate", user)?;
        let key = pem("client-key-data", "client-key", user)?;
        let server = cluster["server"]
            .as_str()
            .ok_or("kubelet.conf has no server")?
            .trim_end_matches('/')
            .to_owned();
        let mut fingerprint = text.clone();
        fingerprint.extend_from_slice(cert.as_bytes());
        if let Some((f, own, s, c)) = &self.cached {
            if *f == fingerprint {
                return Ok((own.clone(), s.clone(), c.clone()));
            }
        }
        let own = node_name(&cert)?;
        let config = crate::tls::mtls_config(&ca, &cert, &key).map_err(|e| e.to_string())?;
        let client = crate::tls::local_client(config, crate::kube::KUBE_TIMEOUT)
            .map_err(|e| crate::api::error_chain(&e))?;
        self.cached = Some((fingerprint, own.clone(), server.clone(), client.clone()));
        Ok((own, server, client))
    }
}

/// The Node a kubelet certificate is for (`CN=system:node:NAME`).
fn node_name(cert_pem: &str) -> Result<String, KubeletApiError> {
    let der = drover_common::pki::first_cert_der(cert_pem).map_err(|e| e.to_string())?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| format!("kubelet.conf: unreadable client certificate: {e}"))?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or_default();
    cn.strip_prefix("system:node:")
        .map(str::to_owned)
        .ok_or_else(|| KubeletApiError(format!("kubelet.conf: {cn:?} is not a Node's certificate")))
}

/// Why the Nodes could not be read with the kubelet's credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the Nodes with the kubelet's credentials: {0}")]
pub struct KubeletApiError(String);

impl From<String> for KubeletApiError {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for KubeletApiError {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// Why a route of the image network could not be read or changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("routes (netlink): {0}")]
pub struct RouteError(String);

impl From<String> for RouteError {
    fn from(s: String) -> Self {
        Self(s)
    }
}

/// The routes this loop keeps, through rtnetlink.
struct Routes {
    handle: rtnetlink::Handle,
}

impl Routes {
    async fn connect() -> Result<Self, RouteError> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        Ok(Self { handle })
    }

    /// The main table's IPv4 routes of [`ROUTE_PROTOCOL`].
    async fn list(&self) -> Result<BTreeMap<Cidr, Ipv4Addr>, RouteError> {
        use futures_util::TryStreamExt;
        use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteProtocol};
        let query = rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().build();
        let mut stream = self.handle.route().get(query).execute();
        let mut found = BTreeMap::new();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(|e| format!("cannot list routes: {e}"))?
        {
            if msg.header.protocol != RouteProtocol::Other(ROUTE_PROTOCOL)
                || msg.header.table != rtnetlink::packet_route::route::RouteHeader::RT_TABLE_MAIN
            {
                continue;
            }
            let mut dst = None;
            let mut via = None;
            for a in &msg.attributes {
                match a {
                    RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(*ip),
                    RouteAttribute::Gateway(RouteAddress::Inet(ip)) => via = Some(*ip),
                    _ => {}
                }
            }
            if let (Some(dst), Some(via)) = (dst, via) {
                if let Some(c) = Cidr::new(dst, msg.header.destination_prefix_length) {
                    found.insert(c, via);
                }
            }
        }
        Ok(found)
    }

    fn message(cidr: Cidr, via: Ipv4Addr) -> rtnetlink::packet_route::route::RouteMessage {
        rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(cidr.addr, cidr.bits)
            .gateway(via)
            .protocol(rtnetlink::packet_route::route::RouteProtocol::Other(
                ROUTE_PROTOCOL,
            ))
            .build()
    }

    /// `ip route replace CIDR via VIA proto 207`.
    async fn replace(&self, cidr: Cidr, via: Ipv4Addr) -> Result<(), RouteError> {
        self.handle
            .route()
            .add(Self::message(cidr, via))
            .replace()
            .execute()
            .await
            .map_err(|e| RouteError(e.to_string()))
    }

    async fn delete(&self, cidr: Cidr, via: Ipv4Addr) -> Result<(), RouteError> {
        match self
            .handle
            .route()
            .del(Self::message(cidr, via))
            .execute()
            .await
        {
            // Already gone (ESRCH): what was wanted.
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc_esrch() => Ok(()),
            other => other.map_err(|e| RouteError(e.to_string())),
        }
    }

    /// Deletes every route of [`ROUTE_PROTOCOL`].
    async fn clear(&self) -> Result<(), RouteError> {
        for (cidr, via) in self.list().await? {
            self.delete(cidr, via).await?;
        }
        Ok(())
    }
}

/// `ESRCH`, the answer to deleting a route that is not there.
const fn libc_esrch() -> i32 {
    3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidr: Option<&str>, ip: Option<&str>) -> NodeNet {
        NodeNet {
            name: name.into(),
            pod_cidr: cidr.map(|c| c.parse().unwrap()),
            internal_ip: ip.map(|i| i.parse().unwrap()),
        }
    }

    fn template() -> serde_json::Value {
        serde_json::from_str(include_str!(
            "../../images/cni/net.d/10-drover-bridge.conflist"
        ))
        .unwrap()
    }

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn the_bridge_takes_the_nodes_range_and_other_ranges_go_to_their_nodes() {
        let nodes = [
            node("cp", Some("10.244.0.0/24"), Some("172.18.0.2")),
            node("w1", Some("10.244.1.0/24"), Some("172.18.0.3")),
            node("w2", Some("10.244.2.0/24"), Some("172.18.0.4")),
        ];
        let p = plan("w1", &nodes, &template(), &BTreeMap::new());
        let text = p.conflist.unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            doc["plugins"][0]["ipam"]["ranges"],
            serde_json::json!([[{"subnet": "10.244.1.0/24"}]])
        );
        assert_eq!(doc["plugins"][0]["bridge"], "cni0");
        assert_eq!(doc["plugins"][1]["type"], "portmap");
        let want: BTreeMap<Cidr, Ipv4Addr> = [
            (c("10.244.0.0/24"), "172.18.0.2".parse().unwrap()),
            (c("10.244.2.0/24"), "172.18.0.4".parse().unwrap()),
        ]
        .into();
        assert_eq!(p.routes, want);
        assert_eq!(p.add, want.clone().into_iter().collect::<Vec<_>>());
        assert!(p.remove.is_empty() && p.skipped.is_empty());
        // Once they are in place, nothing to do.
        let again = plan("w1", &nodes, &template(), &want);
        assert!(again.add.is_empty() && again.remove.is_empty());
    }

    #[test]
    fn a_replaced_node_moves_its_route_and_a_gone_one_loses_it() {
        let current: BTreeMap<Cidr, Ipv4Addr> = [
            (c("10.244.0.0/24"), "172.18.0.2".parse().unwrap()),
            (c("10.244.2.0/24"), "172.18.0.4".parse().unwrap()),
            (c("10.244.3.0/24"), "172.18.0.5".parse().unwrap()),
        ]
        .into();
        // w2 was deleted; its range went to w3 on another address; the
        // Node behind 10.244.3.0/24 is gone.
        let nodes = [
            node("cp", Some("10.244.0.0/24"), Some("172.18.0.2")),
            node("w1", Some("10.244.1.0/24"), Some("172.18.0.3")),
            node("w3", Some("10.244.2.0/24"), Some("172.18.0.6")),
        ];
        let p = plan("w1", &nodes, &template(), &current);
        assert_eq!(
            p.add,
            vec![(c("10.244.2.0/24"), "172.18.0.6".parse().unwrap())]
        );
        assert_eq!(
            p.remove,
            vec![(c("10.244.3.0/24"), "172.18.0.5".parse().unwrap())]
        );
    }

    #[test]
    fn nothing_is_written_until_the_node_has_its_range_and_incomplete_nodes_wait() {
        let nodes = [
            node("cp", Some("10.244.0.0/24"), Some("172.18.0.2")),
            node("w1", None, Some("172.18.0.3")),
            node("w2", Some("10.244.2.0/24"), None),
        ];
        let refused = |p: &Plan, why: &str| {
            let err = p.conflist.as_ref().unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        };
        let p = plan("w1", &nodes, &template(), &BTreeMap::new());
        refused(&p, "no spec.podCIDR");
        assert_eq!(p.routes.len(), 1);
        assert_eq!(p.skipped, vec!["w2: no InternalIP".to_owned()]);
        let p = plan("w9", &nodes, &template(), &BTreeMap::new());
        refused(&p, "not registered");
        // A config without host-local IPAM cannot take a range.
        let bad = serde_json::json!({"name": "x", "plugins": [{"type": "ptp"}]});
        assert!(conflist(&bad, c("10.244.0.0/24")).is_err());
    }

    #[test]
    fn nodes_are_read_from_the_api_and_ranges_are_normalised() {
        let n = NodeNet::from_json(&serde_json::json!({
            "metadata": {"name": "w1"},
            "spec": {"podCIDR": "10.244.1.7/24", "podCIDRs": ["fd00::/64", "10.244.1.0/24"]},
            "status": {"addresses": [
                {"type": "Hostname", "address": "w1"},
                {"type": "InternalIP", "address": "fd00::1"},
                {"type": "InternalIP", "address": "172.18.0.3"},
            ]},
        }))
        .unwrap();
        assert_eq!(n.pod_cidr, Some(c("10.244.1.0/24")));
        assert_eq!(n.internal_ip, Some("172.18.0.3".parse().unwrap()));
        assert_eq!(c("10.244.1.7/24").to_string(), "10.244.1.0/24");
        assert!("10.244.1.0".parse::<Cidr>().is_err());
    }
}
