//! kubeadm's "essential addons", kube-proxy and CoreDNS: the objects `kubeadm
//! init` creates in `kube-system` (its `addon/kube-proxy` and
//! `addon/coredns` phases: cmd/kubeadm/app/phases/addons/proxy/proxy.go and
//! manifests.go, cmd/kubeadm/app/phases/addons/dns/dns.go and manifests.go)
//! and `kubeadm upgrade apply` creates or updates again for the new version
//! (cmd/kubeadm/app/phases/upgrade/postupgrade.go), through the API server
//! as kubeadm does, with kubeadm's `CreateOrUpdate` and `CreateOrRetain`
//! (cmd/kubeadm/app/util/apiclient/idempotency.go): a POST, and on
//! `AlreadyExists` a PUT of the whole object (or nothing, for the CoreDNS
//! ConfigMap and the objects a user may have changed).
//!
//! The images are kubeadm's: `<imageRepository>/kube-proxy:<kubernetesVersion>`
//! (cmd/kubeadm/app/images/images.go `GetKubernetesImage`, a `+` in the
//! version becoming `_`) and `<repository>/coredns:<tag>`, where the
//! repository is `dns.imageRepository` or `imageRepository`, the default
//! `registry.k8s.io` becoming `registry.k8s.io/coredns`, and the tag
//! `dns.imageTag` or the CoreDNS version compiled into this kubeadm
//! (images.go `GetDNSImage`; cmd/kubeadm/app/constants/constants.go
//! `CoreDNSVersion`, one per kubeadm release: [`COREDNS_BY_KUBEADM_MINOR`]).

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::certs::parse_kubeconfig;
use crate::net;
use crate::util::{cidr_nth_ip, kubeadm_version, Root};

pub use drover_common::kubeadm::DEFAULT_IMAGE_REPOSITORY;

/// The CoreDNS version this kubeadm deploys: that of its own minor (the
/// nearest known one outside the table, kubeadm's
/// `constants.CoreDNSVersion` of each release).
fn coredns_version() -> &'static str {
    let minor = kubeadm_version().minor;
    let table = drover_common::kubeadm::COREDNS_BY_MINOR;
    table
        .iter()
        .find(|(m, _)| u64::from(*m) == minor)
        .or_else(|| {
            if minor < u64::from(table[0].0) {
                table.first()
            } else {
                table.last()
            }
        })
        .map(|(_, v)| *v)
        .expect("the table is not empty")
}

/// What the addons are made from: the cluster's `ClusterConfiguration` (as
/// JSON) and the API server address kube-proxy's kubeconfig names when the
/// configuration has no `controlPlaneEndpoint`.
pub struct Addons {
    config: Value,
    fallback_server: String,
}

impl Addons {
    pub fn new(config: Value, fallback_server: &str) -> Self {
        Self {
            config,
            fallback_server: fallback_server.to_owned(),
        }
    }

    fn disabled(&self, addon: &str) -> bool {
        self.config[addon]["disabled"].as_bool() == Some(true)
    }

    /// `dns.disabled`.
    pub fn dns_disabled(&self) -> bool {
        self.disabled("dns")
    }

    /// `proxy.disabled`.
    pub fn proxy_disabled(&self) -> bool {
        self.disabled("proxy")
    }

    fn repository(&self) -> &str {
        self.config["imageRepository"]
            .as_str()
            .filter(|r| !r.is_empty())
            .unwrap_or(DEFAULT_IMAGE_REPOSITORY)
    }

    /// kube-proxy's image for the configuration's `kubernetesVersion`.
    pub fn kube_proxy_image(&self) -> Result<String> {
        let version = self.config["kubernetesVersion"]
            .as_str()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| anyhow!("the ClusterConfiguration names no kubernetesVersion"))?;
        Ok(format!(
            "{}/kube-proxy:{}",
            self.repository(),
            version.replace('+', "_")
        ))
    }

    /// CoreDNS's image.
    pub fn coredns_image(&self) -> String {
        let dns = &self.config["dns"];
        let mut repository = dns["imageRepository"]
            .as_str()
            .filter(|r| !r.is_empty())
            .unwrap_or(self.repository())
            .to_owned();
        if repository == DEFAULT_IMAGE_REPOSITORY {
            repository.push_str("/coredns");
        }
        let tag = dns["imageTag"]
            .as_str()
            .filter(|t| !t.is_empty())
            .unwrap_or(coredns_version());
        format!("{repository}/coredns:{tag}")
    }

    fn server(&self) -> String {
        match self.config["controlPlaneEndpoint"]
            .as_str()
            .filter(|e| !e.is_empty())
        {
            Some(endpoint) => format!("https://{endpoint}"),
            None => self.fallback_server.clone(),
        }
    }

    /// kube-proxy's objects (proxy/manifests.go and proxy.go): its
    /// ServiceAccount, RBAC, ConfigMap and DaemonSet.
    pub fn kube_proxy_objects(&self) -> Result<Vec<(Value, Write)>> {
        let image = self.kube_proxy_image()?;
        let pod_subnet = self.config["networking"]["podSubnet"]
            .as_str()
            .unwrap_or_default();
        let config = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nbindAddress: 0.0.0.0\nclientConnection:\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\nclusterCIDR: {pod_subnet:?}\nkind: KubeProxyConfiguration\nmode: \"\"\n"
        );
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt\n    server: {}\n  name: default\ncontexts:\n- context:\n    cluster: default\n    namespace: default\n    user: default\n  name: default\ncurrent-context: default\nusers:\n- name: default\n  user:\n    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
            self.server()
        );
        let labels = json!({"k8s-app": "kube-proxy"});
        Ok(vec![
            service_account("kube-proxy"),
            cluster_role_binding("kubeadm:node-proxier", "system:node-proxier", "kube-proxy"),
            (
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "kube-proxy", "namespace": "kube-system",
                                    "labels": {"app": "kube-proxy"}},
                       "data": {"config.conf": config, "kubeconfig.conf": kubeconfig}}),
                Write::CreateOrUpdate,
            ),
            (
                json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": "kube-proxy", "namespace": "kube-system",
                             "labels": labels},
                "spec": {
                    "selector": {"matchLabels": labels},
                    "updateStrategy": {"type": "RollingUpdate"},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "priorityClassName": "system-node-critical",
                            "containers": [{
                                "name": "kube-proxy",
                                "image": image,
                                "imagePullPolicy": "IfNotPresent",
                                "command": ["/usr/local/bin/kube-proxy",
                                            "--config=/var/lib/kube-proxy/config.conf",
                                            "--hostname-override=$(NODE_NAME)"],
                                "securityContext": {"privileged": true},
                                "volumeMounts": [
                                    {"mountPath": "/var/lib/kube-proxy", "name": "kube-proxy"},
                                    {"mountPath": "/run/xtables.lock", "name": "xtables-lock"},
                                    {"mountPath": "/lib/modules", "name": "lib-modules",
                                     "readOnly": true}],
                                "env": [{"name": "NODE_NAME", "valueFrom":
                                         {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
                            }],
                            "hostNetwork": true,
                            "serviceAccountName": "kube-proxy",
                            "volumes": [
                                {"name": "kube-proxy", "configMap": {"name": "kube-proxy"}},
                                {"name": "xtables-lock", "hostPath":
                                 {"path": "/run/xtables.lock", "type": "FileOrCreate"}},
                                {"name": "lib-modules", "hostPath": {"path": "/lib/modules"}}],
                            "tolerations": [{"operator": "Exists"}],
                            "nodeSelector": {"kubernetes.io/os": "linux"}
                        }
                    }
                }}),
                Write::CreateOrUpdate,
            ),
        ])
    }

    /// CoreDNS's objects (dns/manifests.go and dns.go): its
    /// ServiceAccount, RBAC, ConfigMap (kept as the user left it on an
    /// upgrade: `CreateOrRetainConfigMap`), Deployment and the Service
    /// `kube-dns` at the service subnet's tenth address (dns.go
    /// `GetDNSIP`).
    pub fn coredns_objects(&self) -> Result<Vec<(Value, Write)>> {
        let image = self.coredns_image();
        let networking = &self.config["networking"];
        let domain = networking["dnsDomain"]
            .as_str()
            .filter(|d| !d.is_empty())
            .unwrap_or("cluster.local");
        let subnet = networking["serviceSubnet"]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or("10.96.0.0/12");
        let first = subnet.split(',').next().unwrap_or_default().trim();
        let dns_ip = cidr_nth_ip(first, 10)
            .with_context(|| {
                format!("unable to get the DNS IP from the service subnet {subnet:?}")
            })?
            .to_string();
        let corefile = format!(
            ".:53 {{\n    errors\n    health {{\n       lameduck 5s\n    }}\n    ready\n    kubernetes {domain} in-addr.arpa ip6.arpa {{\n       pods insecure\n       fallthrough in-addr.arpa ip6.arpa\n       ttl 30\n    }}\n    prometheus :9153\n    forward . /etc/resolv.conf {{\n       max_concurrent 1000\n    }}\n    cache 30 {{\n       disable success {domain}\n       disable denial {domain}\n    }}\n    loop\n    reload\n    loadbalance\n}}\n"
        );
        let labels = json!({"k8s-app": "kube-dns"});
        Ok(vec![
            service_account("coredns"),
            (
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                       "metadata": {"name": "system:coredns"},
                       "rules": [
                           {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                            "verbs": ["list", "watch"]},
                           {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                           {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                            "verbs": ["list", "watch"]}]}),
                Write::CreateOrUpdate,
            ),
            cluster_role_binding("system:coredns", "system:coredns", "coredns"),
            (
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "coredns", "namespace": "kube-system"},
                       "data": {"Corefile": corefile}}),
                Write::CreateOrRetain,
            ),
            (
                json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "coredns", "namespace": "kube-system",
                             "labels": labels},
                "spec": {
                    "replicas": 2,
                    "strategy": {"type": "RollingUpdate",
                                 "rollingUpdate": {"maxUnavailable": 1}},
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "priorityClassName": "system-cluster-critical",
                            "serviceAccountName": "coredns",
                            "tolerations": [
                                {"key": "CriticalAddonsOnly", "operator": "Exists"},
                                {"key": "node-role.kubernetes.io/control-plane",
                                 "effect": "NoSchedule"}],
                            "nodeSelector": {"kubernetes.io/os": "linux"},
                            "containers": [{
                                "name": "coredns",
                                "image": image,
                                "imagePullPolicy": "IfNotPresent",
                                "resources": {"limits": {"memory": "170Mi"},
                                              "requests": {"cpu": "100m", "memory": "70Mi"}},
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "volumeMounts": [{"name": "config-volume",
                                                  "mountPath": "/etc/coredns",
                                                  "readOnly": true}],
                                "ports": [
                                    {"containerPort": 53, "name": "dns", "protocol": "UDP"},
                                    {"containerPort": 53, "name": "dns-tcp", "protocol": "TCP"},
                                    {"containerPort": 9153, "name": "metrics", "protocol": "TCP"}],
                                "livenessProbe": {"httpGet": {"path": "/health", "port": 8080,
                                                              "scheme": "HTTP"}},
                                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181,
                                                               "scheme": "HTTP"}}
                            }],
                            "dnsPolicy": "Default",
                            "volumes": [{"name": "config-volume", "configMap": {
                                "name": "coredns",
                                "items": [{"key": "Corefile", "path": "Corefile"}]}}]
                        }
                    }
                }}),
                Write::CreateOrUpdate,
            ),
            (
                json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "kube-dns", "namespace": "kube-system",
                             "labels": {"k8s-app": "kube-dns",
                                        "kubernetes.io/cluster-service": "true",
                                        "kubernetes.io/name": "CoreDNS"},
                             "annotations": {"prometheus.io/port": "9153",
                                             "prometheus.io/scrape": "true"}},
                "spec": {
                    "clusterIP": dns_ip,
                    "selector": labels,
                    "ports": [
                        {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                        {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                        {"name": "metrics", "port": 9153, "protocol": "TCP",
                         "targetPort": 9153}]
                }}),
                Write::CreateOrRetain,
            ),
        ])
    }
}

/// How an object is written when it exists already (idempotency.go).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Replaced by kubeadm's version (`CreateOrUpdate*`).
    CreateOrUpdate,
    /// Left as it is (`CreateOrRetain*`, and what a user may have tuned).
    CreateOrRetain,
}

/// The cluster's API as a kubeconfig's user.
pub struct Client {
    http: reqwest::Client,
    server: String,
}

impl Client {
    /// The client of the kubeconfig at `logical` (a path as kubeadm sees
    /// it).
    pub fn from_kubeconfig(root: &Root, logical: &Path) -> Result<Self> {
        let host = root.path(logical);
        let text = std::fs::read_to_string(&host).map_err(|e| {
            anyhow!(
                "couldn't create a Kubernetes client from file {:?}: {e}",
                logical.display()
            )
        })?;
        let kc = parse_kubeconfig(&text, host.parent())
            .with_context(|| format!("failed to load kubeconfig {}", logical.display()))?;
        let ca = kc
            .ca_pem
            .clone()
            .ok_or_else(|| anyhow!("the kubeconfig {} holds no CA", logical.display()))?;
        Ok(Self {
            http: kc.http_client(&ca, Duration::from_secs(10))?,
            server: kc.server_url().to_owned(),
        })
    }

    /// The API server this client talks to.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The collection path of `obj` and its own path.
    fn paths(obj: &Value) -> Result<(String, String)> {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let plural = match kind {
            "ServiceAccount" => "serviceaccounts",
            "ConfigMap" => "configmaps",
            "Service" => "services",
            "DaemonSet" => "daemonsets",
            "Deployment" => "deployments",
            "ClusterRole" => "clusterroles",
            "ClusterRoleBinding" => "clusterrolebindings",
            other => bail!("the stand-in kubeadm writes no {other}"),
        };
        let base = if api_version.contains('/') {
            format!("/apis/{api_version}")
        } else {
            format!("/api/{api_version}")
        };
        let collection = match obj["metadata"]["namespace"].as_str() {
            Some(ns) => format!("{base}/namespaces/{ns}/{plural}"),
            None => format!("{base}/{plural}"),
        };
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        Ok((collection.clone(), format!("{collection}/{name}")))
    }

    /// GETs `path`: the object, or `None` when it is not found.
    pub async fn get(&self, path: &str) -> Result<Option<Value>> {
        let resp = self
            .http
            .get(format!("{}{path}", self.server))
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            bail!("GET {path}: {status}: {}", net::status_message(&body));
        }
        Ok(Some(
            serde_json::from_str(&body).with_context(|| format!("GET {path}"))?,
        ))
    }

    /// Writes `obj` as kubeadm's idempotency helpers do: a create, and
    /// when it exists a whole-object update (with the `resourceVersion`
    /// read) or nothing. Returns what happened.
    pub async fn ensure(&self, obj: &Value, write: Write) -> Result<&'static str> {
        let (collection, path) = Self::paths(obj)?;
        let kind = obj["kind"].as_str().unwrap_or_default();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let what = format!("{kind} {name}");
        // kubeadm's idempotency helpers poll every 500 ms, for up to the
        // KubernetesAPICall timeout (1 min), while the API server cannot be
        // reached (cmd/kubeadm/app/util/apiclient/idempotency.go): through
        // the control-plane endpoint, until its load balancer has found the
        // new API server ready.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let resp = loop {
            let sent = self
                .http
                .post(format!("{}{collection}?fieldManager=kubeadm", self.server))
                .json(obj)
                .send()
                .await;
            match sent {
                Ok(r) => break r,
                Err(_) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e).with_context(|| format!("unable to create {what}")),
            }
        };
        if written(resp, "create", &what).await? {
            return Ok("created");
        }
        if write == Write::CreateOrRetain {
            return Ok("kept");
        }
        // idempotency.go retries an update that met a conflict.
        for _ in 0..5 {
            let current = self
                .get(&path)
                .await?
                .ok_or_else(|| anyhow!("unable to update {what}: it was deleted meanwhile"))?;
            let mut wanted = obj.clone();
            wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
            let resp = self
                .http
                .put(format!("{}{path}?fieldManager=kubeadm", self.server))
                .json(&wanted)
                .send()
                .await
                .with_context(|| format!("unable to update {what}"))?;
            if written(resp, "update", &what).await? {
                return Ok("updated");
            }
        }
        bail!("unable to update {what}: it kept changing meanwhile")
    }

    /// Whether the ConfigMap `kube-system/<name>` exists.
    pub async fn config_map_exists(&self, name: &str) -> Result<bool> {
        Ok(self
            .get(&format!("/api/v1/namespaces/kube-system/configmaps/{name}"))
            .await?
            .is_some())
    }
}

/// Whether a write (`verb` of `what`, for errors) succeeded: false when it
/// met a conflict, an error for any other refusal.
async fn written(resp: reqwest::Response, verb: &str, what: &str) -> Result<bool> {
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    if status.is_success() {
        return Ok(true);
    }
    if status != reqwest::StatusCode::CONFLICT {
        bail!(
            "unable to {verb} {what}: {status}: {}",
            net::status_message(&body)
        );
    }
    Ok(false)
}

/// A ServiceAccount of kube-system, created once and then kept.
fn service_account(name: &str) -> (Value, Write) {
    (
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": name, "namespace": "kube-system"}}),
        Write::CreateOrRetain,
    )
}

/// ClusterRoleBinding `name` of ClusterRole `role` to the kube-system
/// ServiceAccount `account`, kept up to date.
fn cluster_role_binding(name: &str, role: &str, account: &str) -> (Value, Write) {
    (
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": role},
               "subjects": [{"kind": "ServiceAccount", "name": account,
                             "namespace": "kube-system"}]}),
        Write::CreateOrUpdate,
    )
}

/// Creates or updates the objects of kube-proxy and CoreDNS, those of
/// `dns` and `proxy` that are wanted; prints kubeadm's lines.
pub async fn ensure(client: &Client, addons: &Addons, dns: bool, proxy: bool) -> Result<()> {
    if dns {
        for (obj, write) in addons.coredns_objects()? {
            client.ensure(&obj, write).await?;
        }
        println!("[addons] Applied essential addon: CoreDNS");
    }
    if proxy {
        for (obj, write) in addons.kube_proxy_objects()? {
            client.ensure(&obj, write).await?;
        }
        println!("[addons] Applied essential addon: kube-proxy");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_follow_the_configuration_as_kubeadm_names_them() {
        let a = Addons::new(
            json!({"kubernetesVersion": "v1.32.0+build.1"}),
            "https://10.0.0.1:6443",
        );
        assert_eq!(
            a.kube_proxy_image().unwrap(),
            "registry.k8s.io/kube-proxy:v1.32.0_build.1"
        );
        assert!(a
            .coredns_image()
            .starts_with("registry.k8s.io/coredns/coredns:v1."));
        let a = Addons::new(
            json!({"kubernetesVersion": "v1.31.2", "imageRepository": "mirror.example/k8s",
                   "dns": {"imageTag": "v9.9.9"}}),
            "https://10.0.0.1:6443",
        );
        assert_eq!(
            a.kube_proxy_image().unwrap(),
            "mirror.example/k8s/kube-proxy:v1.31.2"
        );
        assert_eq!(a.coredns_image(), "mirror.example/k8s/coredns:v9.9.9");
    }
}
