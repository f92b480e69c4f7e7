//! kubeadm configuration, API `kubeadm.k8s.io/v1beta4`, and the kubelet
//! configuration kubeadm passes on.
//!
//! The types are strict (unknown fields are errors, as kubeadm's own strict
//! decoding makes them) so that the coordinator can only render what kubeadm
//! accepts and the test stand-in can parse it back the way kubeadm would.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::pin::CaPin;
use crate::serde_skip::is_default;
use crate::token::BootstrapToken;

pub const KUBEADM_API_VERSION: &str = "kubeadm.k8s.io/v1beta4";
pub const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const KUBE_PROXY_API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";

/// The files of the shared CA set that control-plane machines receive,
/// relative to the certificates directory. kubeadm derives every leaf
/// certificate from them.
pub const SHARED_CA_FILES: [&str; 8] = [
    "ca.crt",
    "ca.key",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "etcd/ca.crt",
    "etcd/ca.key",
    "sa.key",
    "sa.pub",
];

/// kubeadm's default certificates directory.
pub const CERTIFICATES_DIR: &str = "/etc/kubernetes/pki";

/// kubeadm's default image repository (`DefaultImageRepository` in
/// `cmd/kubeadm/app/constants/constants.go`).
pub const DEFAULT_IMAGE_REPOSITORY: &str = "registry.k8s.io";

/// `CoreDNSVersion` in `cmd/kubeadm/app/constants/constants.go` of each
/// kubeadm minor release (Drover's oldest supported minor on): the CoreDNS
/// a kubeadm of that release deploys. Extend the table when a Kubernetes
/// release changes it.
pub const COREDNS_BY_MINOR: &[(u32, &str)] = &[
    (30, "v1.11.1"),
    (31, "v1.11.3"),
    (32, "v1.11.3"),
    (33, "v1.12.0"),
    (34, "v1.12.1"),
    (35, "v1.13.1"),
];

/// The container runtime socket every Drover node image provides
/// (containerd). It is set in every config: kubeadm's auto-detection fails
/// on a host with two runtime sockets.
pub const CRI_SOCKET: &str = "unix:///var/run/containerd/containerd.sock";

/// A `{name, value}` argument, the v1beta4 form of extra arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Arg {
    pub name: String,
    pub value: String,
}

/// `BootstrapToken` in `InitConfiguration.bootstrapTokens`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootstrapTokenSpec {
    pub token: BootstrapToken,
    pub description: Option<String>,
    /// A Go duration such as `900s` or `24h0m0s`.
    pub ttl: Option<String>,
    pub expires: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usages: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

/// `NodeRegistrationOptions`.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeRegistration {
    pub name: Option<String>,
    pub cri_socket: Option<String>,
    pub taints: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubelet_extra_args: Vec<Arg>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore_preflight_errors: Vec<String>,
    pub image_pull_policy: Option<String>,
    pub image_pull_serial: Option<bool>,
}

/// `APIEndpoint`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiEndpoint {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub advertise_address: String,
    #[serde(default, skip_serializing_if = "is_default")]
    pub bind_port: u16,
}

/// `Timeouts` (all Go durations).
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timeouts {
    pub control_plane_component_health_check: Option<String>,
    pub kubelet_health_check: Option<String>,
    #[serde(rename = "kubernetesAPICall")]
    pub kubernetes_api_call: Option<String>,
    #[serde(rename = "etcdAPICall")]
    pub etcd_api_call: Option<String>,
    pub tls_bootstrap: Option<String>,
    pub discovery: Option<String>,
    pub upgrade_manifests: Option<String>,
}

/// `InitConfiguration`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InitConfiguration {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bootstrap_tokens: Vec<BootstrapTokenSpec>,
    pub dry_run: Option<bool>,
    #[serde(default)]
    pub node_registration: NodeRegistration,
    #[serde(default, rename = "localAPIEndpoint")]
    pub local_api_endpoint: ApiEndpoint,
    pub certificate_key: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip_phases: Vec<String>,
    pub patches: Option<serde_json::Value>,
    pub timeouts: Option<Timeouts>,
}

/// `Networking`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Networking {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_subnet: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_subnet: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dns_domain: String,
}

/// `APIServer`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiServer {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<Arg>,
    #[serde(default, rename = "certSANs", skip_serializing_if = "Vec::is_empty")]
    pub cert_sans: Vec<String>,
}

/// `ClusterConfiguration`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfiguration {
    pub api_version: String,
    pub kind: String,
    pub etcd: Option<serde_json::Value>,
    #[serde(default)]
    pub networking: Networking,
    pub kubernetes_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub control_plane_endpoint: String,
    #[serde(default, rename = "apiServer")]
    pub api_server: ApiServer,
    pub controller_manager: Option<serde_json::Value>,
    pub scheduler: Option<serde_json::Value>,
    pub dns: Option<serde_json::Value>,
    pub proxy: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub certificates_dir: String,
    pub image_repository: Option<String>,
    pub feature_gates: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub encryption_algorithm: String,
    pub certificate_validity_period: Option<String>,
    pub ca_certificate_validity_period: Option<String>,
}

/// `BootstrapTokenDiscovery`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootstrapTokenDiscovery {
    pub token: BootstrapToken,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_server_endpoint: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ca_cert_hashes: Vec<CaPin>,
    #[serde(rename = "unsafeSkipCAVerification")]
    pub unsafe_skip_ca_verification: Option<bool>,
}

/// `Discovery`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Discovery {
    pub bootstrap_token: Option<BootstrapTokenDiscovery>,
    pub file: Option<serde_json::Value>,
    pub tls_bootstrap_token: Option<String>,
}

/// `JoinControlPlane`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinControlPlane {
    #[serde(default, rename = "localAPIEndpoint")]
    pub local_api_endpoint: ApiEndpoint,
    pub certificate_key: Option<String>,
}

/// `JoinConfiguration`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinConfiguration {
    pub api_version: String,
    pub kind: String,
    pub dry_run: Option<bool>,
    #[serde(default)]
    pub node_registration: NodeRegistration,
    pub ca_cert_path: Option<String>,
    pub discovery: Discovery,
    pub control_plane: Option<JoinControlPlane>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip_phases: Vec<String>,
    pub patches: Option<serde_json::Value>,
    pub timeouts: Option<Timeouts>,
}

/// The part of `KubeletConfiguration` Drover sets. Other fields are passed
/// through untouched when parsing.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub healthz_bind_address: String,
    #[serde(default, skip_serializing_if = "is_default")]
    pub healthz_port: u16,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cgroup_driver: String,
    pub fail_swap_on: Option<bool>,
    pub image_gc_high_threshold_percent: Option<u8>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_hard: BTreeMap<String, String>,
}

/// The part of kube-proxy's `KubeProxyConfiguration` Drover sets; kubeadm
/// passes it on to the `kube-proxy` ConfigMap. Other fields are passed
/// through untouched when parsing.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: String,
    pub kind: String,
    pub conntrack: Option<KubeProxyConntrack>,
}

/// kube-proxy's conntrack settings.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeProxyConntrack {
    /// Connections tracked per CPU; 0 leaves the kernel's limit alone.
    pub max_per_core: Option<u32>,
}

/// A parsed multi-document kubeadm config file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeadmConfig {
    pub init: Option<InitConfiguration>,
    pub cluster: Option<ClusterConfiguration>,
    pub join: Option<JoinConfiguration>,
    pub kubelet: Option<KubeletConfiguration>,
    pub kube_proxy: Option<KubeProxyConfiguration>,
}

/// Why a kubeadm config was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("config is not valid YAML: {0}")]
    Yaml(String),
    #[error("document {index} has no apiVersion/kind")]
    NoTypeMeta { index: usize },
    #[error("document {index}: unsupported apiVersion {api_version:?} for kind {kind:?}; this kubeadm reads kubeadm.k8s.io/v1beta4")]
    UnsupportedVersion {
        index: usize,
        api_version: String,
        kind: String,
    },
    #[error("document {index}: unknown kind {kind:?}")]
    UnknownKind { index: usize, kind: String },
    #[error("document {index} ({kind}): strict decoding error: {detail}")]
    Strict {
        index: usize,
        kind: String,
        detail: String,
    },
    #[error("kind {0} appears more than once")]
    Duplicate(String),
}

/// Parses a kubeadm config file strictly, as kubeadm does.
pub fn parse_config(text: &str) -> Result<KubeadmConfig, ConfigError> {
    let mut out = KubeadmConfig::default();
    for (index, doc) in crate::yaml_documents(text).map_err(|e| ConfigError::Yaml(e.0))? {
        let api_version = doc.get("apiVersion").and_then(|v| v.as_str());
        let kind = doc.get("kind").and_then(|v| v.as_str());
        let (Some(api_version), Some(kind)) = (api_version, kind) else {
            return Err(ConfigError::NoTypeMeta { index });
        };
        let (api_version, kind) = (api_version.to_owned(), kind.to_owned());
        let expected = match kind.as_str() {
            "KubeletConfiguration" => KUBELET_API_VERSION,
            "KubeProxyConfiguration" => KUBE_PROXY_API_VERSION,
            _ => KUBEADM_API_VERSION,
        };
        if matches!(
            kind.as_str(),
            "InitConfiguration"
                | "ClusterConfiguration"
                | "JoinConfiguration"
                | "KubeletConfiguration"
                | "KubeProxyConfiguration"
        ) && api_version != expected
        {
            return Err(ConfigError::UnsupportedVersion {
                index,
                api_version,
                kind,
            });
        }
        match kind.as_str() {
            "InitConfiguration" => put(&mut out.init, doc, index, &kind)?,
            "ClusterConfiguration" => put(&mut out.cluster, doc, index, &kind)?,
            "JoinConfiguration" => put(&mut out.join, doc, index, &kind)?,
            "KubeletConfiguration" => put(&mut out.kubelet, doc, index, &kind)?,
            "KubeProxyConfiguration" => put(&mut out.kube_proxy, doc, index, &kind)?,
            _ => return Err(ConfigError::UnknownKind { index, kind }),
        }
    }
    Ok(out)
}

/// Decodes document `index`, of kind `kind`, strictly into `slot`, which
/// must still be empty: a kind appears once in a file.
fn put<T: serde::de::DeserializeOwned>(
    slot: &mut Option<T>,
    doc: serde_json::Value,
    index: usize,
    kind: &str,
) -> Result<(), ConfigError> {
    let v = serde_json::from_value(doc).map_err(|detail| ConfigError::Strict {
        index,
        kind: kind.to_owned(),
        detail: detail.to_string(),
    })?;
    if slot.is_some() {
        return Err(ConfigError::Duplicate(kind.to_owned()));
    }
    *slot = Some(v);
    Ok(())
}

/// Node-local settings for rendering a config.
#[derive(Debug, Clone)]
pub struct NodeParams {
    pub node_name: String,
    pub advertise_address: String,
    pub api_server_port: u16,
    pub kubelet_healthz_port: u16,
    /// The Node's `spec.providerID`, which the kubelet sets from its
    /// `--provider-id` flag when it registers the Node: how the
    /// cluster-autoscaler matches Nodes to a provider's instances.
    pub provider_id: String,
}

/// The `spec.providerID` of a Node on a machine no cloud names (a pool
/// host, a container): `drover://<cluster>/<machine>`.
pub fn drover_provider_id(cluster: &str, machine: &str) -> String {
    format!("drover://{cluster}/{machine}")
}

/// Cluster-wide settings for rendering a config.
#[derive(Debug, Clone)]
pub struct ClusterParams {
    pub cluster_name: String,
    pub kubernetes_version: String,
    pub control_plane_endpoint: String,
    pub pod_subnet: String,
    pub service_subnet: String,
    pub dns_domain: String,
    /// What the cluster's nodes run on.
    pub nodes: NodeHost,
}

/// What a cluster's kubelets run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeHost {
    /// A machine of its own (an instance, a pool host).
    Machine,
    /// A container sharing its host's kernel and disks with other nodes (the
    /// `docker` provider). kubeadm then needs what kind gives it: no swap
    /// check, the kernel checks that cannot see the host's modules and
    /// sysctls ignored, no eviction or image collection driven by the host's
    /// disk, and kube-proxy leaving the host's conntrack table alone.
    Container,
}

/// The preflight checks that fail inside a container for reasons of the
/// host, not of the node: swap on the host, no kernel config or modules to
/// verify, the bridge sysctl of the host's namespace. Every other check runs.
pub const CONTAINER_IGNORED_PREFLIGHT_CHECKS: [&str; 3] = [
    "Swap",
    "SystemVerification",
    "FileContent--proc-sys-net-bridge-bridge-nf-call-iptables",
];

/// The kubelet configuration of the whole cluster. Only `kubeadm init`
/// reads it (it becomes the `kubelet-config` ConfigMap that joining
/// machines download); `kubeadm join` ignores such a document. So it holds
/// nothing of one machine: per-machine values go in [`node_registration`]
/// or the machine's kubeadm patches ([`kubeadm_patch_files`]).
fn cluster_kubelet_config(nodes: NodeHost) -> KubeletConfiguration {
    let mut config = KubeletConfiguration {
        api_version: KUBELET_API_VERSION.into(),
        kind: "KubeletConfiguration".into(),
        healthz_bind_address: "127.0.0.1".into(),
        healthz_port: 0,
        cgroup_driver: "systemd".into(),
        fail_swap_on: None,
        image_gc_high_threshold_percent: None,
        eviction_hard: BTreeMap::new(),
    };
    if nodes == NodeHost::Container {
        // The disk and swap are the host's, shared by every node on it: a
        // node must not evict Pods or delete images because of them.
        config.fail_swap_on = Some(false);
        config.image_gc_high_threshold_percent = Some(100);
        config.eviction_hard = ["nodefs.available", "nodefs.inodesFree", "imagefs.available"]
            .into_iter()
            .map(|signal| (signal.to_owned(), "0%".to_owned()))
            .collect();
    }
    config
}

/// kube-proxy's configuration, only for container nodes: there it must not
/// try to raise the conntrack limit, a host-wide sysctl it cannot write.
fn kube_proxy_config(nodes: NodeHost) -> Option<KubeProxyConfiguration> {
    (nodes == NodeHost::Container).then(|| KubeProxyConfiguration {
        api_version: KUBE_PROXY_API_VERSION.into(),
        kind: "KubeProxyConfiguration".into(),
        conntrack: Some(KubeProxyConntrack {
            max_per_core: Some(0),
        }),
    })
}

/// The machine's own registration: its name, the runtime socket, and the
/// kubelet's `--node-ip` and `--provider-id` as `kubeletExtraArgs`
/// (kubeadm writes them to `kubeadm-flags.env`; kubelet flags override its
/// config file), which `init` and `join` both honour.
///
/// The healthz port is no flag: kubeadm waits for the kubelet on the
/// `healthzBindAddress:healthzPort` of the kubelet configuration it wrote,
/// with its patches applied, never on a flag, so a `--healthz-port` flag
/// would make the kubelet listen where kubeadm does not look. It travels
/// as a patch instead ([`kubeadm_patch_files`]).
fn node_registration(node: &NodeParams, nodes: NodeHost) -> NodeRegistration {
    NodeRegistration {
        name: Some(node.node_name.clone()),
        cri_socket: Some(CRI_SOCKET.into()),
        kubelet_extra_args: vec![
            Arg {
                name: "node-ip".into(),
                value: node.advertise_address.clone(),
            },
            Arg {
                name: "provider-id".into(),
                value: node.provider_id.clone(),
            },
        ],
        ignore_preflight_errors: match nodes {
            NodeHost::Machine => vec![],
            NodeHost::Container => CONTAINER_IGNORED_PREFLIGHT_CHECKS
                .iter()
                .map(|c| (*c).to_owned())
                .collect(),
        },
        ..Default::default()
    }
}

/// Where Drover puts kubeadm's patches on a machine; a config rendered for
/// a machine that has any names it as `patches.directory`, which `init`,
/// `join` and `upgrade` (`--patches`) read.
pub const KUBEADM_PATCHES_DIR: &str = "/etc/drover/kubeadm-patches";

/// The patch of the machine's own kubelet settings: target
/// `kubeletconfiguration`, type `merge` (RFC 7386), in kubeadm's file
/// naming `target[suffix][+patchtype].extension`.
pub const KUBELET_CONFIG_PATCH_FILE: &str =
    "/etc/drover/kubeadm-patches/kubeletconfiguration+merge.yaml";

/// The kubelet's own default `healthzPort`.
pub const KUBELET_DEFAULT_HEALTHZ_PORT: u16 = 10248;

/// One file of a machine's kubeadm patches directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeadmPatchFile {
    /// The absolute machine path, under [`KUBEADM_PATCHES_DIR`].
    pub path: String,
    pub content: String,
}

/// The kubeadm patches a machine needs, to be written before kubeadm runs:
/// its kubelet's healthz port when it is not the kubelet's default. kubeadm
/// applies them to the kubelet configuration it writes to
/// `/var/lib/kubelet/config.yaml` and waits for the kubelet on the patched
/// address; the cluster's `kubelet-config` ConfigMap stays the same for
/// every machine. Empty for a machine with nothing of its own.
pub fn kubeadm_patch_files(node: &NodeParams) -> Vec<KubeadmPatchFile> {
    let port = node.kubelet_healthz_port;
    if port == 0 || port == KUBELET_DEFAULT_HEALTHZ_PORT {
        return vec![];
    }
    vec![KubeadmPatchFile {
        path: KUBELET_CONFIG_PATCH_FILE.into(),
        content: format!("healthzPort: {port}\n"),
    }]
}

/// `localAPIEndpoint` of a rendered config: where the machine's API
/// server listens, if it is a control plane.
fn local_api_endpoint(node: &NodeParams) -> ApiEndpoint {
    ApiEndpoint {
        advertise_address: node.advertise_address.clone(),
        bind_port: node.api_server_port,
    }
}

/// `patches` of a rendered config: the patches directory, when the
/// machine has patches.
fn patches_for(node: &NodeParams) -> Option<serde_json::Value> {
    (!kubeadm_patch_files(node).is_empty())
        .then(|| serde_json::json!({ "directory": KUBEADM_PATCHES_DIR }))
}

fn to_yaml_docs(docs: &[serde_json::Value]) -> String {
    docs.iter()
        .map(|d| serde_saphyr::to_string(d).expect("config serializes"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Renders the config for `kubeadm init` on the first control-plane machine.
/// `token` goes into `bootstrapTokens`, so kubeadm registers it and signs
/// `cluster-info` for it.
pub fn render_init(
    cluster: &ClusterParams,
    node: &NodeParams,
    token: &BootstrapToken,
    token_ttl_seconds: u64,
) -> String {
    let init = InitConfiguration {
        api_version: KUBEADM_API_VERSION.into(),
        kind: "InitConfiguration".into(),
        bootstrap_tokens: vec![BootstrapTokenSpec {
            token: token.clone(),
            description: Some("minted by drover for joining machines".into()),
            ttl: Some(format!("{token_ttl_seconds}s")),
            expires: None,
            usages: vec!["signing".into(), "authentication".into()],
            groups: vec!["system:bootstrappers:kubeadm:default-node-token".into()],
        }],
        dry_run: None,
        node_registration: node_registration(node, cluster.nodes),
        local_api_endpoint: local_api_endpoint(node),
        certificate_key: None,
        skip_phases: vec![],
        patches: patches_for(node),
        timeouts: None,
    };
    let cc = ClusterConfiguration {
        api_version: KUBEADM_API_VERSION.into(),
        kind: "ClusterConfiguration".into(),
        etcd: None,
        networking: Networking {
            service_subnet: cluster.service_subnet.clone(),
            pod_subnet: cluster.pod_subnet.clone(),
            dns_domain: cluster.dns_domain.clone(),
        },
        kubernetes_version: cluster.kubernetes_version.clone(),
        control_plane_endpoint: cluster.control_plane_endpoint.clone(),
        api_server: ApiServer::default(),
        controller_manager: None,
        scheduler: None,
        dns: None,
        proxy: None,
        certificates_dir: CERTIFICATES_DIR.into(),
        image_repository: None,
        feature_gates: None,
        cluster_name: cluster.cluster_name.clone(),
        encryption_algorithm: "ECDSA-P256".into(),
        certificate_validity_period: None,
        ca_certificate_validity_period: None,
    };
    let mut docs = vec![
        serde_json::to_value(init).expect("serializes"),
        serde_json::to_value(cc).expect("serializes"),
        serde_json::to_value(cluster_kubelet_config(cluster.nodes)).expect("serializes"),
    ];
    docs.extend(
        kube_proxy_config(cluster.nodes).map(|c| serde_json::to_value(c).expect("serializes")),
    );
    to_yaml_docs(&docs)
}

/// Renders the config for `kubeadm join`; with `control_plane` set, for a
/// control-plane join (the shared CA set is pre-provisioned, so no
/// certificate key is used).
pub fn render_join(
    cluster: &ClusterParams,
    node: &NodeParams,
    token: &BootstrapToken,
    ca_cert_hash: &CaPin,
    control_plane: bool,
) -> String {
    let join = JoinConfiguration {
        api_version: KUBEADM_API_VERSION.into(),
        kind: "JoinConfiguration".into(),
        dry_run: None,
        node_registration: node_registration(node, cluster.nodes),
        ca_cert_path: None,
        discovery: Discovery {
            bootstrap_token: Some(BootstrapTokenDiscovery {
                token: token.clone(),
                api_server_endpoint: cluster.control_plane_endpoint.clone(),
                ca_cert_hashes: vec![ca_cert_hash.clone()],
                unsafe_skip_ca_verification: None,
            }),
            file: None,
            tls_bootstrap_token: None,
        },
        control_plane: control_plane.then(|| JoinControlPlane {
            local_api_endpoint: local_api_endpoint(node),
            certificate_key: None,
        }),
        skip_phases: vec![],
        patches: patches_for(node),
        timeouts: None,
    };
    to_yaml_docs(&[serde_json::to_value(join).expect("serializes")])
}

/// The node image's in-place upgrade hooks, in the agent's `--hooks-dir`:
/// `upgrade-kubeadm VERSION` installs that kubeadm, `upgrade-kubelet
/// VERSION` installs that kubelet and restarts it. The agent runs them
/// around `kubeadm upgrade`, with [`HOOK_ROOT_ENV`] and
/// [`HOOK_KUBEADM_ENV`] set.
pub const UPGRADE_KUBEADM_HOOK: &str = "upgrade-kubeadm";
pub const UPGRADE_KUBELET_HOOK: &str = "upgrade-kubelet";

/// The machine root the agent runs with (`--root`), for the hooks.
pub const HOOK_ROOT_ENV: &str = "DROVER_ROOT";
/// The kubeadm the agent runs (`--kubeadm`), for the hooks.
pub const HOOK_KUBEADM_ENV: &str = "DROVER_KUBEADM";

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> ClusterParams {
        ClusterParams {
            cluster_name: "demo".into(),
            kubernetes_version: "v1.31.2".into(),
            control_plane_endpoint: "10.0.0.1:6443".into(),
            pod_subnet: "10.244.0.0/16".into(),
            service_subnet: "10.96.0.0/12".into(),
            dns_domain: "cluster.local".into(),
            nodes: NodeHost::Machine,
        }
    }

    fn pin() -> CaPin {
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
            .parse()
            .unwrap()
    }

    fn node() -> NodeParams {
        NodeParams {
            node_name: "n1".into(),
            advertise_address: "10.0.0.1".into(),
            api_server_port: 6443,
            kubelet_healthz_port: 10248,
            provider_id: drover_provider_id("demo", "n1"),
        }
    }

    #[test]
    fn init_round_trips_strictly() {
        let token = BootstrapToken::generate();
        let text = render_init(&cluster(), &node(), &token, 900);
        assert!(
            text.contains("apiVersion: kubeadm.k8s.io/v1beta4"),
            "{text}"
        );
        assert!(text.contains("localAPIEndpoint"), "{text}");
        let cfg = parse_config(&text).unwrap();
        let init = cfg.init.unwrap();
        assert_eq!(init.bootstrap_tokens[0].token, token);
        assert_eq!(init.node_registration.kubelet_extra_args[0].name, "node-ip");
        let cc = cfg.cluster.unwrap();
        assert_eq!(cc.encryption_algorithm, "ECDSA-P256");
        assert_eq!(cc.control_plane_endpoint, "10.0.0.1:6443");
        assert_eq!(
            cfg.kubelet.as_ref().unwrap().healthz_port,
            0,
            "per-machine values are not the cluster's"
        );
        assert_eq!(
            init.node_registration.cri_socket.as_deref(),
            Some(CRI_SOCKET)
        );
        // The kubelet's default healthz port needs no patch, and no flag;
        // the Node's providerID is a flag.
        let flags: Vec<(&str, &str)> = init
            .node_registration
            .kubelet_extra_args
            .iter()
            .map(|a| (a.name.as_str(), a.value.as_str()))
            .collect();
        assert_eq!(
            flags,
            [("node-ip", "10.0.0.1"), ("provider-id", "drover://demo/n1")]
        );
        assert_eq!(init.patches, None, "{text}");
        assert!(kubeadm_patch_files(&node()).is_empty());
        assert!(cfg.join.is_none());
        assert!(init.node_registration.ignore_preflight_errors.is_empty());
        assert_eq!(cfg.kubelet.as_ref().unwrap().fail_swap_on, None);
        assert!(cfg.kube_proxy.is_none(), "{text}");
    }

    #[test]
    fn container_nodes_get_what_kubeadm_needs_inside_a_container() {
        let token = BootstrapToken::generate();
        let pin = pin();
        let params = ClusterParams {
            nodes: NodeHost::Container,
            ..cluster()
        };
        let text = render_init(&params, &node(), &token, 900);
        let cfg = parse_config(&text).unwrap();
        let kubelet = cfg.kubelet.unwrap();
        assert_eq!(kubelet.fail_swap_on, Some(false), "{text}");
        assert_eq!(kubelet.image_gc_high_threshold_percent, Some(100));
        assert_eq!(kubelet.eviction_hard["nodefs.available"], "0%");
        assert_eq!(kubelet.eviction_hard.len(), 3);
        let proxy = cfg.kube_proxy.unwrap();
        assert_eq!(proxy.api_version, KUBE_PROXY_API_VERSION);
        assert_eq!(proxy.conntrack.unwrap().max_per_core, Some(0));
        let ignored = |nr: &NodeRegistration| nr.ignore_preflight_errors.clone();
        assert_eq!(
            ignored(&cfg.init.unwrap().node_registration),
            CONTAINER_IGNORED_PREFLIGHT_CHECKS
        );
        // Joining machines skip the same checks; the kubelet and kube-proxy
        // settings reach them through the ConfigMaps `init` uploaded.
        let join = parse_config(&render_join(&params, &node(), &token, &pin, false)).unwrap();
        assert!(join.kubelet.is_none() && join.kube_proxy.is_none());
        assert_eq!(
            ignored(&join.join.unwrap().node_registration),
            CONTAINER_IGNORED_PREFLIGHT_CHECKS
        );
    }

    #[test]
    fn join_round_trips_strictly() {
        let token = BootstrapToken::generate();
        let pin = pin();
        let text = render_join(&cluster(), &node(), &token, &pin, true);
        let cfg = parse_config(&text).unwrap();
        let join = cfg.join.unwrap();
        let d = join.discovery.bootstrap_token.unwrap();
        assert_eq!(d.ca_cert_hashes, vec![pin]);
        assert_eq!(join.control_plane.unwrap().certificate_key, None);
        // kubeadm join ignores a KubeletConfiguration document; this
        // machine's kubelet settings travel as flags and patches instead.
        assert!(cfg.kubelet.is_none(), "{text}");
        assert_eq!(join.patches, None, "the default port needs no patch");
        assert_eq!(
            join.node_registration.cri_socket.as_deref(),
            Some(CRI_SOCKET)
        );
        let args: Vec<(&str, &str)> = join
            .node_registration
            .kubelet_extra_args
            .iter()
            .map(|a| (a.name.as_str(), a.value.as_str()))
            .collect();
        assert_eq!(
            args,
            [("node-ip", "10.0.0.1"), ("provider-id", "drover://demo/n1")]
        );
    }

    #[test]
    fn a_machines_own_healthz_port_is_a_kubelet_config_patch_never_a_flag() {
        let token = BootstrapToken::generate();
        let pin = pin();
        let node = NodeParams {
            kubelet_healthz_port: 10300,
            ..node()
        };
        let files = kubeadm_patch_files(&node);
        assert_eq!(
            files,
            [KubeadmPatchFile {
                path: KUBELET_CONFIG_PATCH_FILE.into(),
                content: "healthzPort: 10300\n".into(),
            }]
        );
        assert!(files[0]
            .path
            .starts_with(&format!("{KUBEADM_PATCHES_DIR}/")));
        let patch: serde_json::Value = serde_saphyr::from_str(&files[0].content).unwrap();
        assert_eq!(patch, serde_json::json!({"healthzPort": 10300}));
        let directory = Some(serde_json::json!({"directory": KUBEADM_PATCHES_DIR}));
        let no_healthz_flag = |nr: &NodeRegistration| {
            let names: Vec<&str> = nr
                .kubelet_extra_args
                .iter()
                .map(|a| a.name.as_str())
                .collect();
            assert_eq!(names, ["node-ip", "provider-id"]);
        };
        let text = render_init(&cluster(), &node, &token, 900);
        let cfg = parse_config(&text).unwrap();
        let init = cfg.init.unwrap();
        assert_eq!(init.patches, directory, "{text}");
        no_healthz_flag(&init.node_registration);
        // The cluster's kubelet configuration stays every machine's.
        assert_eq!(cfg.kubelet.unwrap().healthz_port, 0, "{text}");
        for control_plane in [false, true] {
            let text = render_join(&cluster(), &node, &token, &pin, control_plane);
            let join = parse_config(&text).unwrap().join.unwrap();
            assert_eq!(join.patches, directory, "{text}");
            no_healthz_flag(&join.node_registration);
        }
        // An unknown port (0) is the kubelet's default: nothing to patch.
        let unknown = NodeParams {
            kubelet_healthz_port: 0,
            ..node
        };
        assert!(kubeadm_patch_files(&unknown).is_empty());
        let text = render_join(&cluster(), &unknown, &token, &pin, false);
        assert_eq!(parse_config(&text).unwrap().join.unwrap().patches, None);
    }

    #[test]
    fn go_acronym_spellings() {
        // kubeadm's Go types keep acronyms upper case in JSON names.
        let real = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n    token: abcdef.0123456789abcdef\n    apiServerEndpoint: 10.0.0.1:6443\n    unsafeSkipCAVerification: true\ntimeouts:\n  kubernetesAPICall: 1m0s\n  etcdAPICall: 2m0s\n";
        let join = parse_config(real).unwrap().join.unwrap();
        assert_eq!(
            join.discovery
                .bootstrap_token
                .unwrap()
                .unsafe_skip_ca_verification,
            Some(true)
        );
        let wrong = real.replace("unsafeSkipCAVerification", "unsafeSkipCaVerification");
        assert!(matches!(
            parse_config(&wrong),
            Err(ConfigError::Strict { .. })
        ));
        let wrong = real.replace("etcdAPICall", "etcdApiCall");
        assert!(matches!(
            parse_config(&wrong),
            Err(ConfigError::Strict { .. })
        ));
    }

    #[test]
    fn strictness() {
        let bad = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nbogus: 1\n";
        assert!(matches!(parse_config(bad), Err(ConfigError::Strict { .. })));
        let old = "apiVersion: kubeadm.k8s.io/v1beta3\nkind: InitConfiguration\n";
        assert!(matches!(
            parse_config(old),
            Err(ConfigError::UnsupportedVersion { .. })
        ));
        let badtoken = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nbootstrapTokens:\n- token: ABC.def\n";
        assert!(matches!(
            parse_config(badtoken),
            Err(ConfigError::Strict { .. })
        ));
        // v1beta3's map form of extraArgs is refused by v1beta4.
        let maps = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nnodeRegistration:\n  kubeletExtraArgs:\n    node-ip: 1.2.3.4\n";
        assert!(matches!(
            parse_config(maps),
            Err(ConfigError::Strict { .. })
        ));
    }
}
