//! The cluster's Nodes as a running control plane sees them through its
//! own API server, with the admin credentials kubeadm wrote
//! (`/etc/kubernetes/admin.conf`), and the Node deletions the coordinator
//! asks for once a machine has left, and the drain of a Node whose machine
//! is about to leave. The agent only ever dials its own API server.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use drover_common::api::ClusterNode;
use drover_common::wire::NodesReport;
use reqwest::Method;

use crate::api::error_chain;
use crate::tls;

/// How long one API call may take.
pub const KUBE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the endpoint's `/readyz` may take to answer.
pub const READYZ_TIMEOUT: Duration = Duration::from_secs(1);

/// Why the Nodes could not be read or deleted.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a usable kubeconfig: {detail}")]
    Kubeconfig { path: PathBuf, detail: String },
    #[error("cannot build the API client: {0}")]
    Client(String),
    #[error("{call} at {api} failed: {detail}")]
    Call {
        call: String,
        api: String,
        detail: String,
    },
    #[error("draining node {node} is not done: {why}")]
    DrainBlocked { node: String, why: String },
    /// The API server refused an object of an addon (or knows no such
    /// kind): the object and the server's own message.
    #[error("{object}: {message}")]
    Apply { object: String, message: String },
}

/// A client for the local API server, rebuilt when `admin.conf` changes.
#[derive(Debug)]
pub struct Kube {
    root: PathBuf,
    client: tls::CachedClient,
}

impl Kube {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
            client: tls::CachedClient::default(),
        }
    }

    fn client(&mut self) -> Result<reqwest::Client, KubeError> {
        let path = self.root.join("etc/kubernetes/admin.conf");
        let unreadable = |path, source| KubeError::Read { path, source };
        self.client
            .built_from_files(std::slice::from_ref(&path), unreadable, |text| {
                let text = &text[0];
                let bad = |detail: String| KubeError::Kubeconfig {
                    path: path.clone(),
                    detail,
                };
                let doc: serde_json::Value = serde_saphyr::from_str(&String::from_utf8_lossy(text))
                    .map_err(|e| bad(e.to_string()))?;
                let data = |v: &serde_json::Value, key: &str| {
                    v.get(key)
                        .and_then(|d| d.as_str())
                        .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
                        .map(|d| String::from_utf8_lossy(&d).into_owned())
                        .ok_or_else(|| bad(format!("no {key}")))
                };
                let cluster = &doc["clusters"][0]["cluster"];
                let user = &doc["users"][0]["user"];
                let config = tls::mtls_config(
                    &data(cluster, "certificate-authority-data")?,
                    &data(user, "client-certificate-data")?,
                    &data(user, "client-key-data")?,
                )
                .map_err(|e| KubeError::Client(e.to_string()))?;
                tls::local_client(config, KUBE_TIMEOUT)
                    .map_err(|e| KubeError::Client(error_chain(&e)))
            })
    }

    /// The names of every namespace, through the API server at `api`.
    pub async fn namespaces(&mut self, api: &str) -> Result<Vec<String>, KubeError> {
        let call = "list namespaces";
        let (status, body) = self
            .call(api, call, reqwest::Method::GET, "/api/v1/namespaces")
            .await?;
        if !status.is_success() {
            return Err(failed(call, api, format!("{status}: {body}")));
        }
        let list: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| failed(call, api, e.to_string()))?;
        let mut names: Vec<String> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| Some(n["metadata"]["name"].as_str()?.to_owned()))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Every Node with its `Ready` condition, through the API server at
    /// `api` (`https://host:port`).
    pub async fn nodes(&mut self, api: &str) -> Result<Vec<ClusterNode>, KubeError> {
        let call = "list nodes";
        let (status, body) = self
            .call(api, call, reqwest::Method::GET, "/api/v1/nodes")
            .await?;
        if !status.is_success() {
            return Err(failed(call, api, format!("{status}: {body}")));
        }
        let list: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| failed(call, api, e.to_string()))?;
        let mut nodes: Vec<ClusterNode> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| {
                let condition = n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "Ready");
                let ready = condition
                    .and_then(|c| c["status"].as_str())
                    .unwrap_or("Unknown");
                let since = condition
                    .and_then(|c| c["lastTransitionTime"].as_str())
                    .and_then(|t| {
                        time::OffsetDateTime::parse(
                            t,
                            &time::format_description::well_known::Rfc3339,
                        )
                        .ok()
                    });
                let message = if ready == "True" {
                    String::new()
                } else {
                    condition
                        .and_then(|c| c["message"].as_str())
                        .unwrap_or_default()
                        .chars()
                        .filter(|c| !c.is_control())
                        .take(drover_common::api::MAX_NODE_MESSAGE)
                        .collect()
                };
                Some(ClusterNode {
                    message,
                    name: n["metadata"]["name"].as_str()?.to_owned(),
                    ready: ready.to_owned(),
                    since,
                    unschedulable: n["spec"]["unschedulable"].as_bool().unwrap_or(false),
                    kubelet_version: n["status"]["nodeInfo"]["kubeletVersion"]
                        .as_str()
                        .filter(|v| v.len() <= 64 && !v.chars().any(char::is_control))
                        .unwrap_or_default()
                        .to_owned(),
                })
            })
            .collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(nodes)
    }

    /// The report a heartbeat carries.
    pub async fn report(&mut self, api: &str) -> NodesReport {
        let (nodes, error) = crate::api::list_or_error(self.nodes(api).await);
        let kubeadm_config_version = match self.kubeadm_config(api).await {
            Ok(config) => config.kubernetes_version().map(str::to_owned),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the kubeadm-config version");
                None
            }
        };
        let endpoint_ready = match self.endpoint() {
            Ok(endpoint) => Some(self.ready(&endpoint).await),
            Err(e) => {
                tracing::debug!(error = %e, "cannot tell the cluster's endpoint");
                None
            }
        };
        NodesReport {
            nodes,
            error,
            kubeadm_config_version,
            endpoint_ready,
        }
    }

    /// The cluster's endpoint, `https://host:port`: the server `admin.conf`
    /// names (kubeadm writes `controlPlaneEndpoint` there).
    fn endpoint(&self) -> Result<String, KubeError> {
        let path = self.root.join("etc/kubernetes/admin.conf");
        let text = std::fs::read_to_string(&path).map_err(|source| KubeError::Read {
            path: path.clone(),
            source,
        })?;
        let doc: serde_json::Value =
            serde_saphyr::from_str(&text).map_err(|e| KubeError::Kubeconfig {
                path: path.clone(),
                detail: e.to_string(),
            })?;
        doc["clusters"][0]["cluster"]["server"]
            .as_str()
            .map(|s| s.trim_end_matches('/').to_owned())
            .ok_or(KubeError::Kubeconfig {
                path,
                detail: "no clusters[0].cluster.server".into(),
            })
    }

    /// Whether the API server (or load balancer) at `api` answers
    /// `/readyz` with 200 within [`READYZ_TIMEOUT`]; no answer counts as
    /// not ready. Bounded so that a slow endpoint never holds up the
    /// heartbeat that carries the report.
    async fn ready(&mut self, api: &str) -> bool {
        let client = match self.client() {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "cannot probe the cluster's endpoint");
                return false;
            }
        };
        let answer = client
            .get(format!("{api}/readyz"))
            .timeout(READYZ_TIMEOUT)
            .send()
            .await;
        match answer {
            Ok(r) => r.status().is_success(),
            Err(e) => {
                tracing::debug!(error = %error_chain(&e), "the cluster's endpoint does not answer /readyz");
                false
            }
        }
    }

    /// The ConfigMap `kube-system/kubeadm-config` and the
    /// `ClusterConfiguration` it holds.
    async fn kubeadm_config(&mut self, api: &str) -> Result<KubeadmConfig, KubeError> {
        let call = "get configmap kube-system/kubeadm-config";
        let (status, body) = self.call(api, call, Method::GET, KUBEADM_CONFIG).await?;
        if !status.is_success() {
            return Err(failed(call, api, format!("{status}: {body}")));
        }
        let map: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| failed(call, api, e.to_string()))?;
        let text = map["data"]["ClusterConfiguration"]
            .as_str()
            .ok_or_else(|| failed(call, api, "it holds no data.ClusterConfiguration".into()))?;
        let cluster: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| {
            failed(
                call,
                api,
                format!("data.ClusterConfiguration is not YAML: {e}"),
            )
        })?;
        if !cluster.is_object() {
            return Err(failed(
                call,
                api,
                "data.ClusterConfiguration is not a map".into(),
            ));
        }
        Ok(KubeadmConfig { map, cluster })
    }

    /// Sets `ClusterConfiguration.kubernetesVersion` in
    /// `kube-system/kubeadm-config` to `version` (a write with the
    /// `resourceVersion` read, so a concurrent change fails it rather than
    /// being lost). Naming the version it already has changes nothing.
    pub async fn set_kubernetes_version(
        &mut self,
        api: &str,
        version: &str,
    ) -> Result<String, KubeError> {
        let mut config = self.kubeadm_config(api).await?;
        let was = config.kubernetes_version().unwrap_or_default().to_owned();
        if was == version {
            return Ok(format!("kubeadm-config already names {version}"));
        }
        let call = "update configmap kube-system/kubeadm-config";
        config.cluster["kubernetesVersion"] = serde_json::Value::String(version.to_owned());
        let text = serde_saphyr::to_string(&config.cluster)
            .map_err(|e| failed(call, api, format!("cannot write the YAML: {e}")))?;
        config.map["data"]["ClusterConfiguration"] = serde_json::Value::String(text);
        let body = Some(("application/json", config.map));
        let (status, body) = self
            .call_with(api, call, Method::PUT, KUBEADM_CONFIG, body)
            .await?;
        if !status.is_success() {
            return Err(failed(call, api, format!("{status}: {body}")));
        }
        Ok(format!(
            "kubeadm-config kubernetesVersion {was} -> {version}"
        ))
    }

    /// Upgrades kube-proxy and CoreDNS to Kubernetes `version`'s images
    /// (`crate::essential_addons`), as `kubeadm upgrade apply` does after
    /// the control plane: the image of the DaemonSet
    /// `kube-system/kube-proxy` and of the Deployment `kube-system/coredns`,
    /// each by an update of the object as read (its `resourceVersion`
    /// makes a concurrent change fail the write, which is read and tried
    /// again), field manager `drover`. An absent one is left absent (the
    /// cluster runs without it, as kubeadm's upgrade assumes when its
    /// ConfigMap is gone); one at its image already is done. Says what it
    /// did to each.
    pub async fn upgrade_essential_addons(
        &mut self,
        api: &str,
        version: &str,
    ) -> Result<String, KubeError> {
        let config = self.kubeadm_config(api).await?;
        let images = crate::essential_addons::images(&config.cluster, version).map_err(|e| {
            KubeError::Apply {
                object: "kube-proxy and CoreDNS".into(),
                message: e.to_string(),
            }
        })?;
        let proxy = self
            .set_workload_image(
                api,
                ESSENTIAL_ADDONS[0],
                "kube-proxy",
                Some(&images.kube_proxy),
            )
            .await?;
        let dns = self
            .set_workload_image(
                api,
                ESSENTIAL_ADDONS[1],
                "coredns",
                images.coredns.as_deref(),
            )
            .await?;
        Ok(format!("{proxy}; {dns}"))
    }

    /// Sets the image of container `container` of the workload at `path`
    /// (see [`Kube::upgrade_essential_addons`]); `None` leaves it as it is.
    async fn set_workload_image(
        &mut self,
        api: &str,
        (what, path): (&str, &str),
        container: &str,
        image: Option<&str>,
    ) -> Result<String, KubeError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let call = format!("get {what}");
            let (status, body) = self.call(api, &call, Method::GET, path).await?;
            if status == reqwest::StatusCode::NOT_FOUND {
                return Ok(format!("{what} is not installed: left alone"));
            }
            if !status.is_success() {
                return Err(failed(&call, api, format!("{status}: {body}")));
            }
            let mut workload: serde_json::Value =
                serde_json::from_str(&body).map_err(|e| failed(&call, api, e.to_string()))?;
            let Some(image) = image else {
                return Ok(format!(
                    "{what}: no CoreDNS version is known for this Kubernetes minor release: left alone"
                ));
            };
            let was = crate::essential_addons::set_image(&mut workload, container, image).map_err(
                |e| KubeError::Apply {
                    object: what.to_owned(),
                    message: e.to_string(),
                },
            )?;
            if was == image {
                return Ok(format!("{what} already at {image}"));
            }
            let call = format!("update {what}");
            let (status, body) = self
                .call_with(
                    api,
                    &call,
                    Method::PUT,
                    &format!("{path}?fieldManager=drover"),
                    Some(("application/json", workload)),
                )
                .await?;
            if status.is_success() {
                return Ok(format!("{what} image {was} -> {image}"));
            }
            if status != reqwest::StatusCode::CONFLICT || attempts >= 3 {
                return Err(failed(&call, api, format!("{status}: {body}")));
            }
        }
    }

    /// Deletes Node `name`; one already gone counts as done.
    pub async fn delete_node(&mut self, api: &str, name: &str) -> Result<String, KubeError> {
        let call = format!("delete node {name}");
        let path = format!("/api/v1/nodes/{name}");
        let (status, body) = self
            .call(api, &call, reqwest::Method::DELETE, &path)
            .await?;
        match status {
            s if s.is_success() => Ok(format!("node {name} deleted")),
            reqwest::StatusCode::NOT_FOUND => Ok(format!("node {name} was already gone")),
            s => Err(failed(&call, api, format!("{s}: {body}"))),
        }
    }

    /// Applies an addon's manifests document by document, in order, by
    /// server-side apply with field manager `drover` (forcing conflicts,
    /// as the addon's owner), as `kubectl apply --server-side
    /// --field-manager=drover --force-conflicts` does: each document's
    /// resource is found through the API's discovery, then the document is
    /// sent as an apply patch. Stops at the first refusal, naming the
    /// object and the API server's message.
    ///
    /// An addon's CustomResourceDefinitions go first, and the rest waits
    /// until each is `Established` (at most [`ESTABLISH_TIMEOUT`]), as
    /// `kubectl apply` users learn to `kubectl wait
    /// --for=condition=Established` in between: the API server serves a
    /// definition's kind only once it is established, a moment after it
    /// was created. One that is not established in time fails the addon,
    /// named with why its names were refused, if they were.
    pub async fn apply_manifests(
        &mut self,
        api: &str,
        addon: &str,
        manifests: &str,
    ) -> Result<String, KubeError> {
        self.apply_manifests_within(api, addon, manifests, ESTABLISH_TIMEOUT)
            .await
    }

    async fn apply_manifests_within(
        &mut self,
        api: &str,
        addon: &str,
        manifests: &str,
        establish_timeout: Duration,
    ) -> Result<String, KubeError> {
        let docs =
            drover_common::api::manifest_documents(manifests).map_err(|e| KubeError::Apply {
                object: format!("addon {addon}"),
                message: e.to_string(),
            })?;
        let is_definition = |d: &&drover_common::api::ManifestDocument| {
            d.kind == "CustomResourceDefinition"
                && d.api_version.starts_with("apiextensions.k8s.io/")
        };
        let definitions: Vec<_> = docs.iter().filter(is_definition).collect();
        let mut discovered = std::collections::HashMap::new();
        for doc in &definitions {
            self.apply_document(api, doc, &mut discovered).await?;
        }
        for doc in &definitions {
            self.wait_established(api, &doc.name, establish_timeout)
                .await?;
        }
        // A kind served now was unknown to discovery a moment ago.
        discovered.clear();
        for doc in docs.iter().filter(|d| !is_definition(d)) {
            self.apply_document(api, doc, &mut discovered).await?;
        }
        Ok(format!(
            "addon {addon}: {} objects applied: {}",
            docs.len(),
            definitions
                .iter()
                .copied()
                .chain(docs.iter().filter(|d| !is_definition(d)))
                .map(|d| d.describe())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    /// Waits until CustomResourceDefinition `name` is `Established`.
    async fn wait_established(
        &mut self,
        api: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<(), KubeError> {
        let call = format!("get CustomResourceDefinition {name}");
        let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}");
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::new();
        loop {
            let (status, body) = self.call(api, &call, Method::GET, &path).await?;
            if status.is_success() {
                let crd: serde_json::Value =
                    serde_json::from_str(&body).map_err(|e| failed(&call, api, e.to_string()))?;
                let conditions = crd["status"]["conditions"].as_array().cloned();
                let condition = |type_: &str| {
                    conditions
                        .iter()
                        .flatten()
                        .find(|c| c["type"] == type_)
                        .cloned()
                };
                if condition("Established").is_some_and(|c| c["status"] == "True") {
                    return Ok(());
                }
                last = match condition("NamesAccepted") {
                    Some(c) if c["status"] == "False" => format!(
                        ": its names are not accepted ({}: {})",
                        c["reason"].as_str().unwrap_or_default(),
                        c["message"].as_str().unwrap_or_default()
                    ),
                    _ => String::new(),
                };
            } else if status != reqwest::StatusCode::NOT_FOUND {
                return Err(failed(&call, api, format!("{status}: {body}")));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(KubeError::Apply {
                    object: format!("CustomResourceDefinition {name}"),
                    message: format!(
                        "not Established within {}s{last}; nothing of its kind was applied",
                        timeout.as_secs()
                    ),
                });
            }
            tokio::time::sleep(ESTABLISH_POLL).await;
        }
    }

    /// Applies one document (see [`Kube::apply_manifests`]); `discovered`
    /// keeps each group version's discovery.
    async fn apply_document(
        &mut self,
        api: &str,
        doc: &drover_common::api::ManifestDocument,
        discovered: &mut std::collections::HashMap<String, serde_json::Value>,
    ) -> Result<(), KubeError> {
        let base = if doc.api_version.contains('/') {
            format!("/apis/{}", doc.api_version)
        } else {
            format!("/api/{}", doc.api_version)
        };
        if !discovered.contains_key(&base) {
            let call = format!("discover {}", doc.api_version);
            let (status, body) = self.call(api, &call, Method::GET, &base).await?;
            let list = if status.is_success() {
                serde_json::from_str(&body).map_err(|e| failed(&call, api, e.to_string()))?
            } else if status == reqwest::StatusCode::NOT_FOUND {
                serde_json::Value::Null
            } else {
                return Err(failed(&call, api, format!("{status}: {body}")));
            };
            discovered.insert(base.clone(), list);
        }
        let resource = discovered[&base]["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| {
                r["kind"] == doc.kind.as_str()
                    && r["name"].as_str().is_some_and(|n| !n.contains('/'))
            });
        let Some(resource) = resource else {
            return Err(KubeError::Apply {
                object: doc.describe(),
                message: format!(
                    "no matches for kind {:?} in version {:?}; ensure its CustomResourceDefinition is installed first",
                    doc.kind, doc.api_version
                ),
            });
        };
        let plural = resource["name"].as_str().unwrap_or_default();
        let path = if resource["namespaced"].as_bool().unwrap_or(false) {
            let ns = doc.namespace.as_deref().unwrap_or("default");
            format!("{base}/namespaces/{ns}/{plural}/{}", doc.name)
        } else {
            format!("{base}/{plural}/{}", doc.name)
        };
        let path = format!("{path}?fieldManager={FIELD_MANAGER}&force=true");
        let call = format!("apply {}", doc.describe());
        let body = Some((APPLY_PATCH, doc.object.clone()));
        let (status, body) = self
            .call_with(api, &call, Method::PATCH, &path, body)
            .await?;
        if !status.is_success() {
            let message = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|s| s["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("{status}: {body}"));
            return Err(KubeError::Apply {
                object: doc.describe(),
                message,
            });
        }
        Ok(())
    }

    /// Cordons Node `node` (`unschedulable`) or uncordons it, as kubectl
    /// does: the call as logged, and the API server's answer.
    async fn set_unschedulable(
        &mut self,
        api: &str,
        node: &str,
        unschedulable: bool,
    ) -> Result<(String, reqwest::StatusCode, String), KubeError> {
        let (call, value) = if unschedulable {
            (format!("cordon node {node}"), serde_json::json!(true))
        } else {
            (format!("uncordon node {node}"), serde_json::Value::Null)
        };
        let patch = serde_json::json!({"spec": {"unschedulable": value}});
        let path = format!("/api/v1/nodes/{node}");
        let patch = Some(("application/merge-patch+json", patch));
        let (status, body) = self
            .call_with(api, &call, Method::PATCH, &path, patch)
            .await?;
        Ok((call, status, body))
    }

    /// Marks Node `node` schedulable again, as `kubectl uncordon` does.
    pub async fn uncordon(&mut self, api: &str, node: &str) -> Result<String, KubeError> {
        let (call, status, body) = self.set_unschedulable(api, node, false).await?;
        if !status.is_success() {
            return Err(failed(&call, api, format!("{status}: {body}")));
        }
        Ok(format!("node {node} uncordoned"))
    }

    /// Drains Node `node` as `kubectl drain --ignore-daemonsets` does
    /// (`staging/src/k8s.io/kubectl/pkg/drain/drain.go` and `filters.go`):
    /// cordons it, sorts its Pods by [`drain_plan`] (DaemonSet Pods stay,
    /// mirror Pods of static manifests are skipped, Pods without a
    /// controller and Pods with `emptyDir` volumes refuse the whole drain
    /// unless `options` allow deleting them, before anything is evicted),
    /// asks the Eviction API to evict the rest, then waits for each to go:
    /// an evicted Pod lingers, terminating, for its grace period
    /// (`terminationGracePeriodSeconds`, 30 s by default); one still there
    /// [`TERMINATION_MARGIN`] after that fails the attempt, naming it. A
    /// PodDisruptionBudget that refuses an eviction fails the attempt,
    /// naming the Pod and the budget. The coordinator asks again until its
    /// drain timeout. A Node already gone counts as drained.
    pub async fn drain(
        &mut self,
        api: &str,
        node: &str,
        options: DrainOptions,
    ) -> Result<String, KubeError> {
        let (call, status, body) = self.set_unschedulable(api, node, true).await?;
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(format!("node {node} is gone; nothing to drain"));
        }
        if !status.is_success() {
            return Err(failed(&call, api, format!("{status}: {body}")));
        }
        let plan = drain_plan(&self.pods_on(api, node).await?, options);
        if !plan.refused.is_empty() {
            return Err(KubeError::DrainBlocked {
                node: node.to_owned(),
                why: plan.refusal(),
            });
        }
        let mut blocked = Vec::new();
        let mut evicted = Vec::new();
        for pod in plan.evict {
            let (ns, name) = (&pod.namespace, &pod.name);
            let call = format!("evict pod {ns}/{name}");
            let eviction = serde_json::json!({
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": ns},
            });
            let path = format!("/api/v1/namespaces/{ns}/pods/{name}/eviction");
            let eviction = Some(("application/json", eviction));
            let asked = tokio::time::Instant::now();
            let (status, body) = self
                .call_with(api, &call, Method::POST, &path, eviction)
                .await?;
            match status {
                reqwest::StatusCode::NOT_FOUND => {}
                s if s.is_success() => evicted.push((pod, asked)),
                reqwest::StatusCode::TOO_MANY_REQUESTS => {
                    blocked.push(format!("{ns}/{name} ({})", refusal(&body)))
                }
                s => return Err(failed(&call, api, format!("{s}: {body}"))),
            }
        }
        if !blocked.is_empty() {
            return Err(KubeError::DrainBlocked {
                node: node.to_owned(),
                why: format!("evictions refused: {}", blocked.join("; ")),
            });
        }
        let count = evicted.len();
        loop {
            let now = tokio::time::Instant::now();
            let present = self.pods_on(api, node).await?;
            evicted.retain(|(pod, _)| present.iter().any(|p| p.same_pod(pod)));
            if evicted.is_empty() {
                return Ok(format!("node {node} drained: {count} pod(s) evicted"));
            }
            let overdue: Vec<String> = evicted
                .iter()
                .filter(|(pod, asked)| now >= *asked + pod.termination_wait())
                .map(|(pod, asked)| {
                    format!(
                        "{}/{} still terminating {}s after its eviction (grace period {}s)",
                        pod.namespace,
                        pod.name,
                        now.duration_since(*asked).as_secs(),
                        pod.grace.as_secs()
                    )
                })
                .collect();
            if !overdue.is_empty() {
                return Err(KubeError::DrainBlocked {
                    node: node.to_owned(),
                    why: format!(
                        "evicted Pods did not go within their grace period and {}s: {}",
                        TERMINATION_MARGIN.as_secs(),
                        overdue.join("; ")
                    ),
                });
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Every Pod bound to `node`.
    async fn pods_on(&mut self, api: &str, node: &str) -> Result<Vec<NodePod>, KubeError> {
        let call = format!("list the pods of node {node}");
        let (status, body) = self
            .call(
                api,
                &call,
                reqwest::Method::GET,
                &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
            )
            .await?;
        if !status.is_success() {
            return Err(failed(&call, api, format!("{status}: {body}")));
        }
        let list: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| failed(&call, api, e.to_string()))?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(NodePod::from_json)
            .collect())
    }

    /// One request to the API server at `api`: its status and body, or why
    /// it got no answer.
    async fn call(
        &mut self,
        api: &str,
        call: &str,
        method: reqwest::Method,
        path: &str,
    ) -> Result<(reqwest::StatusCode, String), KubeError> {
        self.call_with(api, call, method, path, None).await
    }

    /// [`Kube::call`] with a JSON body of the given content type.
    async fn call_with(
        &mut self,
        api: &str,
        call: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<(&str, serde_json::Value)>,
    ) -> Result<(reqwest::StatusCode, String), KubeError> {
        let client = self.client()?;
        let mut request = client.request(method, format!("{api}{path}"));
        if let Some((content_type, body)) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body.to_string());
        }
        let resp = request
            .send()
            .await
            .map_err(|e| failed(call, api, error_chain(&e)))?;
        let status = resp.status();
        let body = resp
            .text()
            .await
            .map_err(|e| failed(call, api, error_chain(&e)))?;
        Ok((status, body))
    }
}

/// How long an addon's CustomResourceDefinitions may take to be
/// `Established` before the addon fails.
pub const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(60);

/// How often a definition's conditions are read while waiting.
const ESTABLISH_POLL: Duration = Duration::from_millis(500);

/// The field manager of everything Drover applies.
pub const FIELD_MANAGER: &str = "drover";

/// The content type of a server-side apply patch.
const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// The path of the ConfigMap kubeadm keeps its `ClusterConfiguration` in.
const KUBEADM_CONFIG: &str = "/api/v1/namespaces/kube-system/configmaps/kubeadm-config";

/// The workloads of kube-proxy and CoreDNS as `kubeadm init` names them
/// (`cmd/kubeadm/app/constants/constants.go`), and their paths.
const ESSENTIAL_ADDONS: [(&str, &str); 2] = [
    (
        "DaemonSet kube-system/kube-proxy",
        "/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy",
    ),
    (
        "Deployment kube-system/coredns",
        "/apis/apps/v1/namespaces/kube-system/deployments/coredns",
    ),
];

/// The ConfigMap `kube-system/kubeadm-config` as read, and the
/// `ClusterConfiguration` it holds, parsed.
struct KubeadmConfig {
    map: serde_json::Value,
    cluster: serde_json::Value,
}

impl KubeadmConfig {
    fn kubernetes_version(&self) -> Option<&str> {
        self.cluster["kubernetesVersion"]
            .as_str()
            .filter(|v| v.len() <= 64 && !v.chars().any(char::is_control))
    }
}

/// How long past its grace period an evicted Pod may still be there
/// before the drain attempt fails: the kubelet kills its containers at the
/// end of the grace period and then deletes the Pod.
pub const TERMINATION_MARGIN: Duration = Duration::from_secs(10);

/// A Pod's grace period when its spec names none (the API server's
/// default `terminationGracePeriodSeconds`).
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);

/// The longest grace period a drain attempt waits out; a Pod asking for
/// more fails the attempt after this (and the next attempt waits again).
pub const MAX_GRACE_WAIT: Duration = Duration::from_secs(600);

/// What a cluster's drain policy lets a drain delete: kubectl drain's
/// `--force` (Pods without a controller) and `--delete-emptydir-data`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainOptions {
    pub delete_pods_without_controller: bool,
    pub delete_empty_dir_data: bool,
}

/// A Pod on the Node being drained, as much as a drain looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `status.phase`.
    pub phase: String,
    /// The kind of its controller (`metadata.ownerReferences` with
    /// `controller: true`), if it has one.
    pub controller: Option<String>,
    /// A mirror Pod of a static manifest (the kubelet owns it).
    pub mirror: bool,
    /// It has an `emptyDir` volume.
    pub empty_dir: bool,
    /// Its grace period: `metadata.deletionGracePeriodSeconds` once it is
    /// terminating, else `spec.terminationGracePeriodSeconds`, else 30 s.
    pub grace: Duration,
}

impl NodePod {
    fn from_json(p: &serde_json::Value) -> Option<Self> {
        let meta = &p["metadata"];
        let seconds = |v: &serde_json::Value| v.as_u64().map(Duration::from_secs);
        Some(Self {
            namespace: meta["namespace"].as_str()?.to_owned(),
            name: meta["name"].as_str()?.to_owned(),
            uid: meta["uid"].as_str().unwrap_or_default().to_owned(),
            phase: p["status"]["phase"].as_str().unwrap_or_default().to_owned(),
            controller: meta["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|o| o["controller"] == true)
                .map(|o| o["kind"].as_str().unwrap_or_default().to_owned()),
            mirror: meta["annotations"]
                .get("kubernetes.io/config.mirror")
                .is_some(),
            empty_dir: p["spec"]["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v.get("emptyDir").is_some()),
            grace: seconds(&meta["deletionGracePeriodSeconds"])
                .or_else(|| seconds(&p["spec"]["terminationGracePeriodSeconds"]))
                .unwrap_or(DEFAULT_GRACE_PERIOD),
        })
    }

    fn finished(&self) -> bool {
        self.phase == "Succeeded" || self.phase == "Failed"
    }

    /// The same Pod (not one made again under its name).
    fn same_pod(&self, other: &NodePod) -> bool {
        self.namespace == other.namespace && self.name == other.name && self.uid == other.uid
    }

    /// How long after its eviction the Pod may still be there.
    fn termination_wait(&self) -> Duration {
        self.grace.min(MAX_GRACE_WAIT) + TERMINATION_MARGIN
    }
}

/// What a drain does with a Node's Pods.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DrainPlan {
    /// The Pods to evict.
    pub evict: Vec<NodePod>,
    /// Why the drain is refused: each reason with the Pods (`ns/name`) it
    /// holds for, in the order kubectl checks them.
    pub refused: Vec<(&'static str, Vec<String>)>,
}

impl DrainPlan {
    /// The refusal, as kubectl words it, with the policy field that
    /// overrides each reason.
    pub fn refusal(&self) -> String {
        self.refused
            .iter()
            .map(|(why, pods)| format!("{why}: {}", pods.join(", ")))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

const UNMANAGED_REFUSED: &str = "cannot delete Pods that declare no controller (spec.drain.deletePodsWithoutController: true allows it, as kubectl drain --force)";
const LOCAL_STORAGE_REFUSED: &str = "cannot delete Pods with local storage (spec.drain.deleteEmptyDirData: true allows it, as kubectl drain --delete-emptydir-data)";

/// Sorts a Node's Pods as `kubectl drain --ignore-daemonsets` does, its
/// filters in their order (`staging/src/k8s.io/kubectl/pkg/drain/filters.go`),
/// the first that does not delete a Pod deciding it: a running DaemonSet Pod
/// stays (its controller would put it back; kubectl also refuses one whose
/// DaemonSet is gone without `--force`, which Drover leaves to the
/// DaemonSet controller); a mirror Pod is skipped; a running Pod with an
/// `emptyDir` volume refuses the drain unless
/// `delete_empty_dir_data`; a running Pod without a controller refuses it
/// unless `delete_pods_without_controller`. Finished Pods are evicted.
pub fn drain_plan(pods: &[NodePod], options: DrainOptions) -> DrainPlan {
    let mut plan = DrainPlan::default();
    let mut refuse = |why: &'static str, pod: &NodePod| {
        let name = format!("{}/{}", pod.namespace, pod.name);
        match plan.refused.iter_mut().find(|(w, _)| *w == why) {
            Some((_, pods)) => pods.push(name),
            None => plan.refused.push((why, vec![name])),
        }
    };
    let mut evict = Vec::new();
    for pod in pods {
        if pod.controller.as_deref() == Some("DaemonSet") && !pod.finished() {
            continue;
        }
        if pod.mirror {
            continue;
        }
        if pod.empty_dir && !pod.finished() && !options.delete_empty_dir_data {
            refuse(LOCAL_STORAGE_REFUSED, pod);
            continue;
        }
        if pod.controller.is_none() && !pod.finished() && !options.delete_pods_without_controller {
            refuse(UNMANAGED_REFUSED, pod);
            continue;
        }
        evict.push(pod.clone());
    }
    // kubectl lists each reason once; keep its order: local storage is
    // checked before the controller.
    plan.refused
        .sort_by_key(|(why, _)| *why != LOCAL_STORAGE_REFUSED);
    plan.evict = evict;
    plan
}

/// Why the API server refused an eviction: the budget's own words when it
/// gave them.
fn refusal(body: &str) -> String {
    let status: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    status["details"]["causes"]
        .as_array()
        .and_then(|c| c.first())
        .and_then(|c| c["message"].as_str())
        .or_else(|| status["message"].as_str())
        .unwrap_or("refused")
        .to_owned()
}

fn failed(call: &str, api: &str, detail: String) -> KubeError {
    KubeError::Call {
        call: call.to_owned(),
        api: api.to_owned(),
        detail,
    }
}

/// The local API server's URL.
pub fn local_api(advertise: std::net::IpAddr, port: u16) -> String {
    format!("https://{}", std::net::SocketAddr::new(advertise, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, extra: serde_json::Value) -> NodePod {
        let mut p = serde_json::json!({
            "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}"),
                         "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": true}]},
            "spec": {"nodeName": "w1"},
            "status": {"phase": "Running"},
        });
        json_merge(&mut p, extra);
        NodePod::from_json(&p).unwrap()
    }

    fn json_merge(into: &mut serde_json::Value, patch: serde_json::Value) {
        match (into, patch) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (slot, v) => *slot = v,
        }
    }

    /// kubectl drain's filters: bare Pods and emptyDir Pods refuse the
    /// drain unless the policy allows deleting them; DaemonSet Pods stay,
    /// mirror Pods are skipped, finished Pods go.
    #[test]
    fn a_drain_refuses_bare_and_empty_dir_pods_unless_the_policy_allows_them() {
        let bare = pod(
            "solo",
            serde_json::json!({"metadata": {"ownerReferences": []}}),
        );
        let cache = pod(
            "cache",
            serde_json::json!({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}),
        );
        let daemon = pod(
            "proxy",
            serde_json::json!({"metadata": {"ownerReferences": [{"kind": "DaemonSet", "name": "p", "controller": true}]}}),
        );
        let mirror = pod(
            "kube-apiserver-w1",
            serde_json::json!({"metadata": {"ownerReferences": [], "annotations": {"kubernetes.io/config.mirror": "x"}}}),
        );
        let done = pod(
            "job-1",
            serde_json::json!({"metadata": {"ownerReferences": []}, "status": {"phase": "Succeeded"}}),
        );
        let web = pod("web", serde_json::json!({}));
        let pods = [bare, cache, daemon, mirror, done, web];

        let plan = drain_plan(&pods, DrainOptions::default());
        assert!(!plan.refused.is_empty());
        let refusal = plan.refusal();
        assert_eq!(
            refusal,
            format!("{LOCAL_STORAGE_REFUSED}: default/cache; {UNMANAGED_REFUSED}: default/solo")
        );

        let plan = drain_plan(
            &pods,
            DrainOptions {
                delete_pods_without_controller: true,
                delete_empty_dir_data: false,
            },
        );
        assert_eq!(
            plan.refusal(),
            format!("{LOCAL_STORAGE_REFUSED}: default/cache")
        );

        let plan = drain_plan(
            &pods,
            DrainOptions {
                delete_pods_without_controller: true,
                delete_empty_dir_data: true,
            },
        );
        assert!(plan.refused.is_empty());
        let names: Vec<&str> = plan.evict.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["solo", "cache", "job-1", "web"]);
    }

    /// An evicted Pod may linger for its own grace period (30 s unless it
    /// says), and a margin; one terminating longer fails the attempt.
    #[test]
    fn an_evicted_pod_is_waited_for_its_grace_period_and_a_margin() {
        let default = pod("web", serde_json::json!({}));
        assert_eq!(default.grace, DEFAULT_GRACE_PERIOD);
        assert_eq!(
            default.termination_wait(),
            Duration::from_secs(30) + TERMINATION_MARGIN
        );
        let short = pod(
            "web",
            serde_json::json!({"spec": {"terminationGracePeriodSeconds": 2}}),
        );
        assert_eq!(
            short.termination_wait(),
            Duration::from_secs(2) + TERMINATION_MARGIN
        );
        // Once terminating, the grace period the deletion was given counts.
        let deleting = pod(
            "web",
            serde_json::json!({"metadata": {"deletionGracePeriodSeconds": 5},
                               "spec": {"terminationGracePeriodSeconds": 60}}),
        );
        assert_eq!(deleting.grace, Duration::from_secs(5));
        let long = pod(
            "web",
            serde_json::json!({"spec": {"terminationGracePeriodSeconds": 86400}}),
        );
        assert_eq!(long.termination_wait(), MAX_GRACE_WAIT + TERMINATION_MARGIN);
        // A Pod made again under the same name is not the one evicted.
        let mut again = short.clone();
        again.uid = "other".into();
        assert!(!again.same_pod(&short));
        assert!(short.same_pod(&short.clone()));
    }

    /// A fake API server for an addon of CustomResourceDefinitions and
    /// objects of their kinds: a definition applied is established after
    /// `gets_until_established` earlier reads of it (never when `None`, its names
    /// refused), and its kind is served only once it is.
    async fn fake_api(
        pki: &crate::fake_https::Pki,
        gets_until_established: Option<usize>,
    ) -> String {
        use crate::fake_https::{Call, Handler};
        let handler: Handler = std::sync::Arc::new(move |call: &Call, before: &[Call]| {
            const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/";
            let reads = before
                .iter()
                .filter(|c| c.method == "GET" && c.path.starts_with(CRDS))
                .count();
            let applied = before
                .iter()
                .any(|c| c.method == "PATCH" && c.path.starts_with(CRDS));
            let established = applied && gets_until_established.is_some_and(|n| reads >= n);
            let path = call.path.split('?').next().unwrap_or_default();
            match (call.method.as_str(), path) {
                ("GET", "/apis/apiextensions.k8s.io/v1") => (200, serde_json::json!({"resources": [
                    {"name": "customresourcedefinitions", "kind": "CustomResourceDefinition", "namespaced": false}
                ]}).to_string()),
                ("PATCH", p) if p.starts_with(CRDS) => (201, "{}".into()),
                ("GET", p) if p.starts_with(CRDS) && applied => {
                    let conditions = match gets_until_established {
                        None => serde_json::json!([
                            {"type": "NamesAccepted", "status": "False", "reason": "KindConflict", "message": "\"Widget\" is already in use"},
                            {"type": "Established", "status": "False", "reason": "NotAccepted"}]),
                        Some(_) if established => serde_json::json!([
                            {"type": "NamesAccepted", "status": "True"}, {"type": "Established", "status": "True"}]),
                        Some(_) => serde_json::json!([{"type": "NamesAccepted", "status": "True"}]),
                    };
                    (200, serde_json::json!({"status": {"conditions": conditions}}).to_string())
                }
                ("GET", "/apis/example.com/v1") if established => (200, serde_json::json!({"resources": [
                    {"name": "widgets", "kind": "Widget", "namespaced": true}
                ]}).to_string()),
                ("PATCH", "/apis/example.com/v1/namespaces/default/widgets/w1") if established => {
                    (201, "{}".into())
                }
                _ => (404, r#"{"kind":"Status","message":"the server could not find the requested resource"}"#.into()),
            }
        });
        let addr = pki.serve(handler).await;
        format!("https://{addr}")
    }

    /// A `Kube` whose admin.conf names a [`fake_api`], under a fresh root;
    /// with the PKI that records the calls.
    async fn kube_on_fake_api(
        gets_until_established: Option<usize>,
    ) -> (tempfile::TempDir, crate::fake_https::Pki, String, Kube) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let root = tempfile::tempdir().unwrap();
        let pki = crate::fake_https::Pki::new();
        let api = fake_api(&pki, gets_until_established).await;
        pki.write_admin_conf(root.path(), &api);
        let kube = Kube::new(root.path());
        (root, pki, api, kube)
    }

    /// A Widget before its definition, as an addon may list them.
    const ADDON: &str = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1, namespace: default}\n---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\nspec: {group: example.com}\n";

    #[tokio::test]
    async fn an_addons_objects_wait_for_their_definition_to_be_established() {
        let (_root, pki, api, mut kube) = kube_on_fake_api(Some(3)).await;
        let done = kube
            .apply_manifests_within(&api, "widgets", ADDON, Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(
            done,
            "addon widgets: 2 objects applied: CustomResourceDefinition widgets.example.com, Widget default/w1"
        );
        let calls: Vec<String> = pki
            .calls()
            .iter()
            .map(|c| format!("{} {}", c.method, c.path.split('?').next().unwrap()))
            .collect();
        let at = |s: &str| {
            calls
                .iter()
                .position(|c| c == s)
                .unwrap_or_else(|| panic!("no {s}: {calls:?}"))
        };
        let applied =
            at("PATCH /apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com");
        let widget = at("PATCH /apis/example.com/v1/namespaces/default/widgets/w1");
        assert!(applied < widget, "{calls:?}");
        // It read the definition until it was established, never the
        // kind's paths before.
        let reads = calls[..widget]
            .iter()
            .filter(|c| {
                c.starts_with("GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions/")
            })
            .count();
        assert_eq!(reads, 4, "{calls:?}");
        assert_eq!(
            calls
                .iter()
                .filter(|c| c.contains("example.com/v1"))
                .count(),
            2,
            "{calls:?}"
        );
    }

    #[tokio::test]
    async fn an_addon_whose_definition_is_never_established_fails_naming_it() {
        let (_root, pki, api, mut kube) = kube_on_fake_api(None).await;
        let err = kube
            .apply_manifests_within(&api, "widgets", ADDON, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "CustomResourceDefinition widgets.example.com: not Established within 1s: its names are not accepted (KindConflict: \"Widget\" is already in use); nothing of its kind was applied"
        );
        assert!(!pki.calls().iter().any(|c| c.path.contains("widgets/w1")));
    }

    #[test]
    fn local_api_brackets_ipv6() {
        assert_eq!(
            local_api("10.0.0.1".parse().unwrap(), 6443),
            "https://10.0.0.1:6443"
        );
        assert_eq!(
            local_api("fd00::1".parse().unwrap(), 6443),
            "https://[fd00::1]:6443"
        );
    }
}
