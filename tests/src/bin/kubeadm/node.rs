//! What `init` and a control-plane `join` share: cluster settings, leaf
//! certificates, kubeconfigs, static Pod manifests, kubelet files and the
//! stand-in daemons.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use drover_common::kubeadm::{ApiEndpoint, Arg, ClusterConfiguration, NodeRegistration};
use serde_json::Value;

use crate::certs::{self, EncryptionAlgorithm, LeafSpec, SharedCaSet};
use crate::daemon;
use crate::kubelet;
use crate::util::{
    cidr_nth_ip, join_host_port, split_host_port, write_file, InPhase, Preflight, Root, SkipPhases,
};

pub const KUBERNETES_DIR: &str = "/etc/kubernetes";
pub const MANIFESTS_DIR: &str = "/etc/kubernetes/manifests";
pub const ETCD_IMAGE_TAG: &str = "3.5.15-0";

/// Cluster-wide settings with kubeadm's defaults applied.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub cluster_name: String,
    pub kubernetes_version: String,
    pub control_plane_endpoint: Option<(String, Option<u16>)>,
    pub service_subnet: String,
    pub pod_subnet: String,
    pub dns_domain: String,
    pub cert_dir: String,
    pub image_repository: String,
    pub alg: EncryptionAlgorithm,
    pub cert_validity: time::Duration,
    pub api_server_extra_args: Vec<Arg>,
    pub cert_sans: Vec<String>,
    pub controller_manager_extra_args: Vec<Arg>,
    pub scheduler_extra_args: Vec<Arg>,
    pub etcd_extra_args: Vec<Arg>,
    pub etcd_server_sans: Vec<String>,
    pub etcd_peer_sans: Vec<String>,
    pub etcd_data_dir: String,
}

fn check_keys(v: &Value, what: &str, allowed: &[&str]) -> Result<()> {
    let obj = v
        .as_object()
        .ok_or_else(|| anyhow!("strict decoding error: {what} must be an object"))?;
    for k in obj.keys() {
        if !allowed.contains(&k.as_str()) {
            bail!("strict decoding error: unknown field \"{what}.{k}\"");
        }
    }
    Ok(())
}

/// v1beta4 extra arguments: a list of `{name, value}` (the v1beta3 map form
/// is a strict decoding error).
fn extra_args(v: Option<&Value>, what: &str) -> Result<Vec<Arg>> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => serde_json::from_value::<Vec<Arg>>(v.clone()).map_err(|e| {
            anyhow!("strict decoding error: {what}: v1beta4 extraArgs is a list of {{name, value}}: {e}")
        }),
    }
}

fn string_list(v: Option<&Value>, what: &str) -> Result<Vec<String>> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| anyhow!("strict decoding error: {what} must be a list of strings: {e}")),
    }
}

impl ClusterSettings {
    pub fn from_config(cc: &ClusterConfiguration) -> Result<Self> {
        crate::util::check_control_plane_version(&cc.kubernetes_version)?;
        let kubernetes_version = if cc.kubernetes_version.starts_with('v') {
            cc.kubernetes_version.clone()
        } else {
            format!("v{}", cc.kubernetes_version)
        };
        let alg = EncryptionAlgorithm::parse(&cc.encryption_algorithm)?;
        let cert_validity = match &cc.certificate_validity_period {
            Some(d) => {
                let d = crate::util::parse_go_duration_std(d)
                    .context("ClusterConfiguration.certificateValidityPeriod")?;
                time::Duration::try_from(d)
                    .map_err(|e| anyhow!("certificateValidityPeriod: {e}"))?
            }
            None => time::Duration::days(365),
        };
        let control_plane_endpoint = if cc.control_plane_endpoint.is_empty() {
            None
        } else {
            Some(split_host_port(&cc.control_plane_endpoint).context("controlPlaneEndpoint")?)
        };
        let cert_dir = if cc.certificates_dir.is_empty() {
            drover_common::kubeadm::CERTIFICATES_DIR.to_owned()
        } else {
            cc.certificates_dir.trim_end_matches('/').to_owned()
        };
        if !cert_dir.starts_with('/') {
            bail!("ClusterConfiguration.certificatesDir: Invalid value: {cert_dir:?}: path must be absolute");
        }
        let service_subnet = if cc.networking.service_subnet.is_empty() {
            "10.96.0.0/12".to_owned()
        } else {
            cc.networking.service_subnet.clone()
        };
        for s in service_subnet.split(',') {
            cidr_nth_ip(s.trim(), 1).context("networking.serviceSubnet")?;
        }
        if !cc.networking.pod_subnet.is_empty() {
            for s in cc.networking.pod_subnet.split(',') {
                cidr_nth_ip(s.trim(), 0).context("networking.podSubnet")?;
            }
        }
        let component = |v: &Option<Value>, what: &str| -> Result<Vec<Arg>> {
            match v {
                None => Ok(Vec::new()),
                Some(v) => {
                    check_keys(v, what, &["extraArgs", "extraVolumes", "extraEnvs"])?;
                    extra_args(v.get("extraArgs"), &format!("{what}.extraArgs"))
                }
            }
        };
        let controller_manager_extra_args = component(&cc.controller_manager, "controllerManager")?;
        let scheduler_extra_args = component(&cc.scheduler, "scheduler")?;
        let (mut etcd_extra_args, mut etcd_server_sans, mut etcd_peer_sans) =
            (vec![], vec![], vec![]);
        let mut etcd_data_dir = "/var/lib/etcd".to_owned();
        if let Some(etcd) = &cc.etcd {
            check_keys(etcd, "etcd", &["local", "external"])?;
            if etcd.get("external").is_some() {
                bail!("etcd.external: the stand-in kubeadm supports only stacked (local) etcd");
            }
            if let Some(local) = etcd.get("local") {
                check_keys(
                    local,
                    "etcd.local",
                    &[
                        "imageRepository",
                        "imageTag",
                        "dataDir",
                        "extraArgs",
                        "extraEnvs",
                        "serverCertSANs",
                        "peerCertSANs",
                    ],
                )?;
                etcd_extra_args = extra_args(local.get("extraArgs"), "etcd.local.extraArgs")?;
                etcd_server_sans =
                    string_list(local.get("serverCertSANs"), "etcd.local.serverCertSANs")?;
                etcd_peer_sans = string_list(local.get("peerCertSANs"), "etcd.local.peerCertSANs")?;
                if let Some(d) = local.get("dataDir").and_then(|d| d.as_str()) {
                    etcd_data_dir = d.to_owned();
                }
            }
        }
        if let Some(dns) = &cc.dns {
            check_keys(dns, "dns", &["imageRepository", "imageTag", "disabled"])?;
        }
        if let Some(proxy) = &cc.proxy {
            check_keys(proxy, "proxy", &["disabled"])?;
        }
        Ok(Self {
            cluster_name: if cc.cluster_name.is_empty() {
                "kubernetes".into()
            } else {
                cc.cluster_name.clone()
            },
            kubernetes_version,
            control_plane_endpoint,
            service_subnet,
            pod_subnet: cc.networking.pod_subnet.clone(),
            dns_domain: if cc.networking.dns_domain.is_empty() {
                "cluster.local".into()
            } else {
                cc.networking.dns_domain.clone()
            },
            cert_dir,
            image_repository: cc
                .image_repository
                .clone()
                .unwrap_or_else(|| "registry.k8s.io".into()),
            alg,
            cert_validity,
            api_server_extra_args: cc.api_server.extra_args.clone(),
            cert_sans: cc.api_server.cert_sans.clone(),
            controller_manager_extra_args,
            scheduler_extra_args,
            etcd_extra_args,
            etcd_server_sans,
            etcd_peer_sans,
            etcd_data_dir,
        })
    }

    /// The first IP of each service subnet (the `kubernetes` Service).
    pub fn service_ips(&self, n: u128) -> Vec<IpAddr> {
        self.service_subnet
            .split(',')
            .filter_map(|s| cidr_nth_ip(s.trim(), n).ok())
            .collect()
    }

    /// `https://<controlPlaneEndpoint>` (its port defaulting to the bind
    /// port) or `https://<advertise>:<port>`.
    pub fn server_url(&self, advertise: &str, bind_port: u16) -> String {
        match &self.control_plane_endpoint {
            Some((host, port)) => format!(
                "https://{}",
                join_host_port(host, port.unwrap_or(bind_port))
            ),
            None => format!("https://{}", join_host_port(advertise, bind_port)),
        }
    }
}

/// This node's control-plane identity.
pub struct ControlPlaneNode {
    pub name: String,
    pub advertise: IpAddr,
    pub bind_port: u16,
    pub joining: bool,
}

impl ControlPlaneNode {
    pub fn new(name: &str, advertise: IpAddr, bind_port: u16, joining: bool) -> Self {
        Self {
            name: name.to_owned(),
            advertise,
            bind_port,
            joining,
        }
    }

    /// The host and port this machine's API server listens on.
    pub fn bind_address(&self) -> String {
        join_host_port(&self.advertise.to_string(), self.bind_port)
    }

    /// This machine's API server, `https://` its bind address.
    pub fn local_server(&self) -> String {
        format!("https://{}", self.bind_address())
    }
}

/// The advertise address and port of a local API endpoint (`what`, for
/// errors), the port 6443 when unset.
pub fn local_endpoint(endpoint: &ApiEndpoint, what: &str) -> Result<(IpAddr, u16)> {
    let advertise = parse_advertise(&endpoint.advertise_address, what)?;
    let bind_port = match endpoint.bind_port {
        0 => 6443,
        p => p,
    };
    Ok((advertise, bind_port))
}

/// Checks, before a control plane starts, that none of its static Pod
/// manifests and no `admin.conf` are there yet.
pub fn control_plane_files_available(pf: &mut Preflight, root: &Root) {
    for m in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "etcd",
    ] {
        pf.file_available(root, &format!("{MANIFESTS_DIR}/{m}.yaml"));
    }
    pf.file_available(root, "/etc/kubernetes/admin.conf");
}

pub fn parse_advertise(addr: &str, what: &str) -> Result<IpAddr> {
    if addr.is_empty() {
        bail!("{what}.advertiseAddress is empty: the stand-in kubeadm cannot detect the host's default address; set it explicitly");
    }
    addr.parse().map_err(|_| {
        anyhow!("{what}.advertiseAddress: Invalid value: {addr:?}: must be a valid IP address")
    })
}

fn san_split(names: &[String], dns: &mut Vec<String>, ips: &mut Vec<IpAddr>) {
    for n in names {
        match n.parse::<IpAddr>() {
            Ok(ip) => {
                if !ips.contains(&ip) {
                    ips.push(ip)
                }
            }
            Err(_) => {
                if !dns.contains(n) {
                    dns.push(n.clone())
                }
            }
        }
    }
}

fn fmt_sans(dns: &[String], ips: &[IpAddr]) -> String {
    format!(
        "DNS names [{}] and IPs [{}]",
        dns.join(" "),
        ips.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    )
}

/// Issues and writes every leaf certificate kubeadm derives from the shared
/// CA set. `phase` prefixes the skip names (`certs` or
/// `control-plane-prepare/certs`).
pub fn write_leaf_certs(
    root: &Root,
    cs: &ClusterSettings,
    set: &SharedCaSet,
    node: &ControlPlaneNode,
    skip: &SkipPhases,
    phase: &str,
) -> Result<()> {
    let cd = &cs.cert_dir;
    println!("[certs] Using certificateDir folder {cd:?}");
    let sub = |name: &str| {
        if phase == "certs" {
            format!("certs/{name}")
        } else {
            phase.to_owned()
        }
    };
    let v = cs.cert_validity;
    let issue_and_write =
        |ca: &certs::Ca, base: &str, spec: LeafSpec, show_sans: bool| -> Result<()> {
            println!("[certs] Generating {base:?} certificate and key");
            if show_sans {
                println!(
                    "[certs] {base} serving cert is signed for {}",
                    fmt_sans(&spec.dns, &spec.ips)
                );
            }
            let issued = certs::issue(ca, &spec, cs.alg, v)?;
            certs::write_leaf(root, cd, base, &issued)
        };
    println!("[certs] Using existing ca certificate authority");
    if !skip.skipped(&sub("apiserver")) {
        let mut dns = vec![
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
            format!("kubernetes.default.svc.{}", cs.dns_domain),
            node.name.clone(),
        ];
        let mut ips = cs.service_ips(1);
        if !ips.contains(&node.advertise) {
            ips.push(node.advertise);
        }
        let mut extra: Vec<String> = Vec::new();
        if let Some((host, _)) = &cs.control_plane_endpoint {
            extra.push(host.clone());
        }
        extra.extend(cs.cert_sans.iter().cloned());
        san_split(&extra, &mut dns, &mut ips);
        issue_and_write(
            &set.ca,
            "apiserver",
            LeafSpec {
                cn: "kube-apiserver".into(),
                orgs: vec![],
                dns,
                ips,
                server: true,
                client: false,
            },
            true,
        )?;
    }
    if !skip.skipped(&sub("apiserver-kubelet-client")) {
        issue_and_write(
            &set.ca,
            "apiserver-kubelet-client",
            client_spec("kube-apiserver-kubelet-client", &["kubeadm:cluster-admins"]),
            false,
        )?;
    }
    println!("[certs] Using existing front-proxy-ca certificate authority");
    if !skip.skipped(&sub("front-proxy-client")) {
        issue_and_write(
            &set.front_proxy,
            "front-proxy-client",
            client_spec("front-proxy-client", &[]),
            false,
        )?;
    }
    println!("[certs] Using existing etcd/ca certificate authority");
    // The etcd server and peer certificates: the node's names and
    // addresses, and the extra SANs asked for.
    let etcd_spec = |extra: &[String]| {
        let mut dns = vec!["localhost".to_owned(), node.name.clone()];
        let mut ips = vec![
            node.advertise,
            IpAddr::from([127, 0, 0, 1]),
            "::1".parse().expect("ip"),
        ];
        ips.dedup();
        san_split(extra, &mut dns, &mut ips);
        LeafSpec {
            cn: node.name.clone(),
            orgs: vec![],
            dns,
            ips,
            server: true,
            client: true,
        }
    };
    if !skip.skipped(&sub("etcd-server")) {
        issue_and_write(
            &set.etcd,
            "etcd/server",
            etcd_spec(&cs.etcd_server_sans),
            true,
        )?;
    }
    if !skip.skipped(&sub("etcd-peer")) {
        issue_and_write(&set.etcd, "etcd/peer", etcd_spec(&cs.etcd_peer_sans), true)?;
    }
    if !skip.skipped(&sub("etcd-healthcheck-client")) {
        issue_and_write(
            &set.etcd,
            "etcd/healthcheck-client",
            client_spec("kube-etcd-healthcheck-client", &[]),
            false,
        )?;
    }
    if !skip.skipped(&sub("apiserver-etcd-client")) {
        issue_and_write(
            &set.etcd,
            "apiserver-etcd-client",
            client_spec("kube-apiserver-etcd-client", &[]),
            false,
        )?;
    }
    println!("[certs] Using the existing \"sa\" key");
    Ok(())
}

fn client_spec(cn: &str, orgs: &[&str]) -> LeafSpec {
    LeafSpec {
        cn: cn.to_owned(),
        orgs: orgs.iter().map(|o| o.to_string()).collect(),
        dns: vec![],
        ips: vec![],
        server: false,
        client: true,
    }
}

/// One kubeconfig kubeadm writes: file, user name, organizations, server.
pub struct KubeconfigSpec {
    pub file: &'static str,
    pub user: String,
    pub orgs: Vec<String>,
    pub server: String,
}

pub fn write_kubeconfigs(
    root: &Root,
    cs: &ClusterSettings,
    set: &SharedCaSet,
    specs: &[KubeconfigSpec],
) -> Result<()> {
    println!("[kubeconfig] Using kubeconfig folder {KUBERNETES_DIR:?}");
    for s in specs {
        println!("[kubeconfig] Writing {:?} kubeconfig file", s.file);
        let spec = LeafSpec {
            cn: s.user.clone(),
            orgs: s.orgs.clone(),
            dns: vec![],
            ips: vec![],
            server: false,
            client: true,
        };
        let issued = certs::issue(&set.ca, &spec, cs.alg, cs.cert_validity)?;
        let text = certs::render_kubeconfig(
            &cs.cluster_name,
            &s.server,
            &set.ca.cert_pem,
            &s.user,
            Some(&issued),
        );
        write_file(
            &root.path(format!("{KUBERNETES_DIR}/{}", s.file)),
            text.as_bytes(),
            0o600,
        )?;
    }
    Ok(())
}

fn merged_args(base: Vec<(String, String)>, extra: &[Arg]) -> Vec<String> {
    let mut args = base;
    for a in extra {
        if let Some(slot) = args.iter_mut().find(|(n, _)| *n == a.name) {
            slot.1 = a.value.clone();
        } else {
            args.push((a.name.clone(), a.value.clone()));
        }
    }
    args.into_iter()
        .map(|(n, v)| format!("--{n}={v}"))
        .collect()
}

/// Writes component `component`'s static Pod manifest (see
/// [`pod_manifest`]; the command is the component's name).
fn write_pod_manifest(
    root: &Root,
    component: &str,
    image: &str,
    args: &[String],
    annotation: Option<(&str, String)>,
) -> Result<()> {
    let text = pod_manifest(component, image, component, args, annotation);
    write_file(
        &root.path(format!("{MANIFESTS_DIR}/{component}.yaml")),
        text.as_bytes(),
        0o600,
    )
}

fn pod_manifest(
    component: &str,
    image: &str,
    command: &str,
    args: &[String],
    annotation: Option<(&str, String)>,
) -> String {
    let mut s = String::from("apiVersion: v1\nkind: Pod\nmetadata:\n");
    if let Some((k, v)) = annotation {
        s.push_str(&format!("  annotations:\n    {k}: {v}\n"));
    }
    s.push_str(&format!(
        "  labels:\n    component: {component}\n    tier: control-plane\n  name: {component}\n  namespace: kube-system\nspec:\n  containers:\n  - command:\n    - {command}\n"
    ));
    for a in args {
        s.push_str(&format!(
            "    - {}\n",
            serde_json::to_string(a).expect("string")
        ));
    }
    s.push_str(&format!(
        "    image: {image}\n    imagePullPolicy: IfNotPresent\n    name: {component}\n  hostNetwork: true\n  priority: 2000001000\n  priorityClassName: system-node-critical\n  securityContext:\n    seccompProfile:\n      type: RuntimeDefault\nstatus: {{}}\n"
    ));
    s
}

/// Writes the kube-apiserver, kube-controller-manager and kube-scheduler
/// static Pod manifests.
pub fn write_control_plane_manifests(
    root: &Root,
    cs: &ClusterSettings,
    node: &ControlPlaneNode,
    skip: &SkipPhases,
    phase: &str,
) -> Result<()> {
    let cd = &cs.cert_dir;
    let image = |c: &str| format!("{}/{c}:{}", cs.image_repository, cs.kubernetes_version);
    let sub = |name: &str| {
        if phase == "control-plane" {
            format!("control-plane/{name}")
        } else {
            phase.to_owned()
        }
    };
    println!("[control-plane] Using manifest folder {MANIFESTS_DIR:?}");
    let p = |n: &str, v: String| (n.to_owned(), v);
    if !skip.skipped(&sub("apiserver")) {
        println!("[control-plane] Creating static Pod manifest for \"kube-apiserver\"");
        let args = merged_args(
            vec![
                p("advertise-address", node.advertise.to_string()),
                p("allow-privileged", "true".into()),
                p("authorization-mode", "Node,RBAC".into()),
                p("client-ca-file", format!("{cd}/ca.crt")),
                p("enable-admission-plugins", "NodeRestriction".into()),
                p("enable-bootstrap-token-auth", "true".into()),
                p("etcd-cafile", format!("{cd}/etcd/ca.crt")),
                p("etcd-certfile", format!("{cd}/apiserver-etcd-client.crt")),
                p("etcd-keyfile", format!("{cd}/apiserver-etcd-client.key")),
                p("etcd-servers", "https://127.0.0.1:2379".into()),
                p(
                    "kubelet-client-certificate",
                    format!("{cd}/apiserver-kubelet-client.crt"),
                ),
                p(
                    "kubelet-client-key",
                    format!("{cd}/apiserver-kubelet-client.key"),
                ),
                p(
                    "kubelet-preferred-address-types",
                    "InternalIP,ExternalIP,Hostname".into(),
                ),
                p(
                    "proxy-client-cert-file",
                    format!("{cd}/front-proxy-client.crt"),
                ),
                p(
                    "proxy-client-key-file",
                    format!("{cd}/front-proxy-client.key"),
                ),
                p("requestheader-allowed-names", "front-proxy-client".into()),
                p(
                    "requestheader-client-ca-file",
                    format!("{cd}/front-proxy-ca.crt"),
                ),
                p(
                    "requestheader-extra-headers-prefix",
                    "X-Remote-Extra-".into(),
                ),
                p("requestheader-group-headers", "X-Remote-Group".into()),
                p("requestheader-username-headers", "X-Remote-User".into()),
                p("secure-port", node.bind_port.to_string()),
                p(
                    "service-account-issuer",
                    format!("https://kubernetes.default.svc.{}", cs.dns_domain),
                ),
                p("service-account-key-file", format!("{cd}/sa.pub")),
                p("service-account-signing-key-file", format!("{cd}/sa.key")),
                p("service-cluster-ip-range", cs.service_subnet.clone()),
                p("tls-cert-file", format!("{cd}/apiserver.crt")),
                p("tls-private-key-file", format!("{cd}/apiserver.key")),
            ],
            &cs.api_server_extra_args,
        );
        write_pod_manifest(
            root,
            "kube-apiserver",
            &image("kube-apiserver"),
            &args,
            Some((
                "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint",
                join_host_port(&node.advertise.to_string(), node.bind_port),
            )),
        )?;
    }
    if !skip.skipped(&sub("controller-manager")) {
        println!("[control-plane] Creating static Pod manifest for \"kube-controller-manager\"");
        let kc = format!("{KUBERNETES_DIR}/controller-manager.conf");
        let mut base = vec![
            p("authentication-kubeconfig", kc.clone()),
            p("authorization-kubeconfig", kc.clone()),
            p("bind-address", "127.0.0.1".into()),
            p("client-ca-file", format!("{cd}/ca.crt")),
            p("cluster-name", cs.cluster_name.clone()),
            p("cluster-signing-cert-file", format!("{cd}/ca.crt")),
            p("cluster-signing-key-file", format!("{cd}/ca.key")),
            p("controllers", "*,bootstrapsigner,tokencleaner".into()),
            p("kubeconfig", kc),
            p("leader-elect", "true".into()),
            p(
                "requestheader-client-ca-file",
                format!("{cd}/front-proxy-ca.crt"),
            ),
            p("root-ca-file", format!("{cd}/ca.crt")),
            p("service-account-private-key-file", format!("{cd}/sa.key")),
            p("service-cluster-ip-range", cs.service_subnet.clone()),
            p("use-service-account-credentials", "true".into()),
        ];
        if !cs.pod_subnet.is_empty() {
            base.push(p("allocate-node-cidrs", "true".into()));
            base.push(p("cluster-cidr", cs.pod_subnet.clone()));
        }
        let args = merged_args(base, &cs.controller_manager_extra_args);
        write_pod_manifest(
            root,
            "kube-controller-manager",
            &image("kube-controller-manager"),
            &args,
            None,
        )?;
    }
    if !skip.skipped(&sub("scheduler")) {
        println!("[control-plane] Creating static Pod manifest for \"kube-scheduler\"");
        let kc = format!("{KUBERNETES_DIR}/scheduler.conf");
        let args = merged_args(
            vec![
                p("authentication-kubeconfig", kc.clone()),
                p("authorization-kubeconfig", kc.clone()),
                p("bind-address", "127.0.0.1".into()),
                p("kubeconfig", kc),
                p("leader-elect", "true".into()),
            ],
            &cs.scheduler_extra_args,
        );
        write_pod_manifest(
            root,
            "kube-scheduler",
            &image("kube-scheduler"),
            &args,
            None,
        )?;
    }
    Ok(())
}

/// Writes the local etcd static Pod manifest.
/// `initial_cluster`: for a joining member, every member's `name=peerURL`
/// (this one included), as the member add returned them.
pub fn write_etcd_manifest(
    root: &Root,
    cs: &ClusterSettings,
    node: &ControlPlaneNode,
    initial_cluster: Option<&str>,
) -> Result<()> {
    println!("[etcd] Creating static Pod manifest for local etcd in {MANIFESTS_DIR:?}");
    let cd = &cs.cert_dir;
    let adv = node.advertise.to_string();
    let client_url = format!("https://{}", join_host_port(&adv, 2379));
    let peer_url = format!("https://{}", join_host_port(&adv, 2380));
    let p = |n: &str, v: String| (n.to_owned(), v);
    let mut base = vec![
        p("advertise-client-urls", client_url.clone()),
        p("cert-file", format!("{cd}/etcd/server.crt")),
        p("client-cert-auth", "true".into()),
        p("data-dir", cs.etcd_data_dir.clone()),
        p("initial-advertise-peer-urls", peer_url.clone()),
        p(
            "initial-cluster",
            initial_cluster
                .map(str::to_owned)
                .unwrap_or_else(|| format!("{}={peer_url}", node.name)),
        ),
        p("key-file", format!("{cd}/etcd/server.key")),
        // Real kubeadm also listens on 127.0.0.1. Machines the tests run
        // side by side on one host each advertise their own loopback
        // address, so there the member listens on that address alone (a
        // stand-in concession; a non-loopback advertise address keeps
        // kubeadm's exact flags).
        p(
            "listen-client-urls",
            if node.advertise.is_loopback() {
                client_url.clone()
            } else {
                format!("https://127.0.0.1:2379,{client_url}")
            },
        ),
        p(
            "listen-metrics-urls",
            if node.advertise.is_loopback() {
                format!("http://{}", join_host_port(&adv, 2381))
            } else {
                "http://127.0.0.1:2381".into()
            },
        ),
        p("listen-peer-urls", peer_url),
        p("name", node.name.clone()),
        p("peer-cert-file", format!("{cd}/etcd/peer.crt")),
        p("peer-client-cert-auth", "true".into()),
        p("peer-key-file", format!("{cd}/etcd/peer.key")),
        p("peer-trusted-ca-file", format!("{cd}/etcd/ca.crt")),
        p("snapshot-count", "10000".into()),
        p("trusted-ca-file", format!("{cd}/etcd/ca.crt")),
    ];
    if node.joining {
        base.push(p("initial-cluster-state", "existing".into()));
    }
    let args = merged_args(base, &cs.etcd_extra_args);
    write_pod_manifest(
        root,
        "etcd",
        &format!("{}/etcd:{ETCD_IMAGE_TAG}", cs.image_repository),
        &args,
        Some((
            "kubeadm.kubernetes.io/etcd.advertise-client-urls",
            client_url,
        )),
    )?;
    std::fs::create_dir_all(root.path(&cs.etcd_data_dir))
        .with_context(|| format!("cannot create {}", cs.etcd_data_dir))?;
    Ok(())
}

/// Finds the raw KubeletConfiguration document of a config file, keeping
/// every field (the typed form keeps only the fields Drover sets).
pub fn raw_kubelet_doc(config_text: &str) -> Option<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(config_text).ok()?;
    docs.into_iter()
        .find(|d| d.get("kind").and_then(|k| k.as_str()) == Some("KubeletConfiguration"))
}

/// The kubelet configuration kubeadm generates from `doc` (a config file's
/// KubeletConfiguration document, the cluster's `kubelet-config`
/// ConfigMap, or nothing): the document with kubeadm's defaults filled in
/// (`cmd/kubeadm/app/componentconfigs/kubelet.go` `Default`, and the
/// kubelet's own for the healthz address). It is what `init` uploads as
/// the `kubelet-config` ConfigMap, before any patch.
pub fn kubelet_config(
    doc: Option<Value>,
    cluster_dns: Option<IpAddr>,
    dns_domain: &str,
) -> Result<Value> {
    let mut doc = doc.unwrap_or_else(|| {
        serde_json::json!({
            "apiVersion": drover_common::kubeadm::KUBELET_API_VERSION,
            "kind": "KubeletConfiguration",
        })
    });
    let obj = doc
        .as_object_mut()
        .ok_or_else(|| anyhow!("KubeletConfiguration must be a mapping"))?;
    let mut default = |k: &str, v: Value| {
        obj.entry(k.to_owned()).or_insert(v);
    };
    default(
        "authentication",
        serde_json::json!({
            "anonymous": {"enabled": false},
            "webhook": {"cacheTTL": "0s", "enabled": true},
            "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"},
        }),
    );
    default("authorization", serde_json::json!({"mode": "Webhook"}));
    default("cgroupDriver", "systemd".into());
    if let Some(ip) = cluster_dns {
        default("clusterDNS", serde_json::json!([ip.to_string()]));
    }
    default("clusterDomain", dns_domain.into());
    default("healthzBindAddress", "127.0.0.1".into());
    default("healthzPort", 10248.into());
    default("rotateCertificates", true.into());
    default("staticPodPath", MANIFESTS_DIR.into());
    Ok(doc)
}

/// The kubelet configuration of a node: [`kubelet_config`] with
/// the cluster's DNS settings.
pub fn node_kubelet_config(doc: Option<Value>, cs: &ClusterSettings) -> Result<Value> {
    kubelet_config(doc, cs.service_ips(10).first().copied(), &cs.dns_domain)
}

/// Writes `/var/lib/kubelet/config.yaml` (`config`, the machine's patches
/// already applied) as kubeadm does.
pub fn write_kubelet_config(root: &Root, config: &Value) -> Result<()> {
    let text = serde_saphyr::to_string(config)
        .map_err(|e| anyhow!("cannot render the kubelet config: {e}"))?;
    println!(
        "[kubelet-start] Writing kubelet configuration to file \"{}\"",
        kubelet::CONFIG_FILE
    );
    write_file(&root.path(kubelet::CONFIG_FILE), text.as_bytes(), 0o644)
}

/// Writes `/var/lib/kubelet/kubeadm-flags.env` and
/// `/var/lib/kubelet/config.yaml` (`config`, the machine's patches
/// already applied).
pub fn write_kubelet_files(
    root: &Root,
    config: &Value,
    node_name: &str,
    reg: &NodeRegistration,
) -> Result<()> {
    let mut flags = vec![format!(
        "--container-runtime-endpoint={}",
        reg.cri_socket
            .clone()
            .unwrap_or_else(|| "unix:///var/run/containerd/containerd.sock".into())
    )];
    if node_name != crate::util::hostname() {
        flags.push(format!("--hostname-override={node_name}"));
    }
    for a in &reg.kubelet_extra_args {
        flags.push(format!("--{}={}", a.name, a.value));
    }
    println!("[kubelet-start] Writing kubelet environment file with flags to file \"/var/lib/kubelet/kubeadm-flags.env\"");
    write_file(
        &root.path(kubelet::FLAGS_FILE),
        format!("KUBELET_KUBEADM_ARGS=\"{}\"\n", flags.join(" ")).as_bytes(),
        0o644,
    )?;
    write_kubelet_config(root, config)
}

/// What the kubelet-start phase takes from a command's configuration: the
/// kubelet configuration with the machine's patches applied, where kubeadm
/// waits for the kubelet (that configuration's healthz address, never a
/// flag), and how long.
pub struct KubeletStart {
    config: Value,
    healthz: (String, u16),
    timeout: Duration,
}

impl KubeletStart {
    /// `config` (the defaulted kubelet configuration) with `patches`
    /// applied, as kubeadm applies them before writing it and before
    /// waiting on it.
    pub fn new(
        mut config: Value,
        patches: Option<&crate::patches::Patches>,
        timeout: Duration,
    ) -> Result<Self> {
        if let Some(patches) = patches {
            patches.apply_to_kubelet_config(&mut config)?;
        }
        let healthz = kubelet::healthz_of_config(&config)?;
        Ok(Self {
            config,
            healthz,
            timeout,
        })
    }

    /// Where the kubelet will listen for healthz: the configuration's
    /// address unless `reg`'s kubelet flags say otherwise (for the
    /// preflight port check; kubeadm's wait ignores the flags).
    pub fn listen_address(&self, reg: &NodeRegistration) -> Result<(String, u16)> {
        let flags: Vec<(String, String)> = reg
            .kubelet_extra_args
            .iter()
            .map(|a| (a.name.clone(), a.value.clone()))
            .collect();
        kubelet::with_flags(self.healthz.clone(), &flags)
    }

    /// The kubelet-start phase: the kubelet's files for `node_name`, then
    /// the kubelet, waited on until it is healthy.
    pub async fn run(self, root: &Root, node_name: &str, reg: &NodeRegistration) -> Result<()> {
        write_kubelet_files(root, &self.config, node_name, reg).in_phase("kubelet-start")?;
        let (host, port) = &self.healthz;
        start_kubelet(root, &kubelet::healthz_url(host, *port), self.timeout)
            .await
            .in_phase("kubelet-start")
    }
}

/// Starts the stand-in kubelet and waits until `url` answers 200.
pub async fn start_kubelet(root: &Root, url: &str, timeout: Duration) -> Result<()> {
    println!("[kubelet-start] Starting the kubelet");
    let mut child = daemon::spawn(root, "kubelet", &[])?;
    println!(
        "[kubelet-check] Waiting for a healthy kubelet at {url}. This can take up to {}",
        crate::util::format_go_duration(timeout)
    );
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()?;
    let took = daemon::wait_ready(&mut child, root, "kubelet", timeout, || {
        let client = client.clone();
        let url = url.to_owned();
        async move {
            match client.get(&url).send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(format!(
                    "the HTTP call equal to 'curl -sSL {url}' returned {}: {}",
                    r.status(),
                    r.text().await.unwrap_or_default()
                )),
                Err(e) => Err(format!(
                    "the HTTP call equal to 'curl -sSL {url}' failed with error: {e}"
                )),
            }
        }
    })
    .await
    .map_err(|e| anyhow!("The kubelet is not healthy at {url}: {e:#}"))?;
    println!("[kubelet-check] The kubelet is healthy after {took:?}");
    Ok(())
}

/// The client URL of a control plane's local etcd member.
pub fn etcd_client_url(advertise: IpAddr) -> String {
    format!("https://{}", join_host_port(&advertise.to_string(), 2379))
}

/// Starts the node's stacked etcd (the static Pod the stand-in kubelet
/// runs) and waits until it answers `/health` to the health-check client
/// certificate, as kubeadm's etcd wait does.
pub async fn start_etcd(
    root: &Root,
    cert_dir: &str,
    advertise: IpAddr,
    timeout: Duration,
) -> Result<()> {
    let read = |f: &str| {
        let logical = format!("{cert_dir}/{f}");
        std::fs::read_to_string(root.path(&logical)).with_context(|| format!("open {logical}"))
    };
    let tls = crate::net::client_config(
        &read("etcd/ca.crt")?,
        Some((
            &read("etcd/healthcheck-client.crt")?,
            &read("etcd/healthcheck-client.key")?,
        )),
    )?;
    let client = crate::net::http_client(tls, Duration::from_secs(2))?;
    let mut child = daemon::spawn(root, "etcd", &[])?;
    let url = format!("{}/health", etcd_client_url(advertise));
    println!("[etcd] Waiting for the etcd member at {url} to be healthy");
    let took = daemon::wait_ready(&mut child, root, "etcd", timeout, || {
        let client = client.clone();
        let url = url.clone();
        async move {
            match client.get(&url).send().await {
                Ok(r) if r.status().is_success() => {
                    let body = r.text().await.unwrap_or_default();
                    if body.contains("\"health\":\"true\"") {
                        Ok(())
                    } else {
                        Err(format!("GET {url}: {body}"))
                    }
                }
                Ok(r) => Err(format!("GET {url}: {}", r.status())),
                Err(e) => Err(format!("GET {url}: {e}")),
            }
        }
    })
    .await
    .map_err(|e| anyhow!("etcd is not healthy: {e:#}"))?;
    println!("[etcd] The etcd member is healthy after {took:?}");
    Ok(())
}

/// Starts the stand-in API server of control plane `node` on its bind
/// address, for the cluster's server URL, and waits until /readyz answers
/// (verifying its serving certificate against the cluster CA).
pub async fn start_apiserver(
    root: &Root,
    node: &ControlPlaneNode,
    cs: &ClusterSettings,
    etcd_servers: &str,
    ca_pem: &str,
    timeout: Duration,
) -> Result<()> {
    let bind = node.bind_address();
    let server = cs.server_url(&node.advertise.to_string(), node.bind_port);
    let mut child = daemon::spawn(
        root,
        "apiserver",
        &[
            "--bind".into(),
            bind.clone(),
            "--cert-dir".into(),
            cs.cert_dir.clone(),
            "--server".into(),
            server,
            "--etcd-servers".into(),
            etcd_servers.into(),
        ],
    )?;
    println!(
        "[api-check] Waiting for a healthy API server. This can take up to {}",
        crate::util::format_go_duration(timeout)
    );
    let client = crate::net::http_client(
        crate::net::client_config(ca_pem, None)?,
        Duration::from_secs(2),
    )?;
    let url = format!("https://{bind}/readyz");
    let took = daemon::wait_ready(&mut child, root, "apiserver", timeout, || {
        let client = client.clone();
        let url = url.clone();
        async move {
            match client.get(&url).send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(format!("GET {url}: {}", r.status())),
                Err(e) => Err(format!("GET {url}: {e}")),
            }
        }
    })
    .await
    .map_err(|e| anyhow!("the API server is not healthy: {e:#}"))?;
    println!("[api-check] The API server is healthy after {took:?}");
    Ok(())
}
