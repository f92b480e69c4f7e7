//! The `docker` provider: each machine is a container from a node image on a
//! Docker network of the cluster's own (the Cluster API Docker provider is
//! the model). User data goes in as a cloud-init NoCloud seed, copied into
//! the container before it starts.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerSummary, HostConfig,
    HostConfigCgroupnsModeEnum, Ipam, NetworkCreateRequest, RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptions, InspectNetworkOptions, KillContainerOptions, ListContainersOptions,
    ListNetworksOptions, RemoveContainerOptions, StartContainerOptions, UploadToContainerOptions,
};
use bollard::Docker;
use drover_common::api::{
    Cluster, DockerMachineProfile, DockerProviderSpec, Machine, ProviderSpec,
};

use super::{
    Check, CreateHost, Created, Fut, InstanceState, MachineRequest, Managed, Provider,
    ProviderError, ProviderMachine, ProviderNetwork, LABEL_CLUSTER, LABEL_CLUSTER_UID,
    LABEL_MACHINE, LABEL_MACHINE_UID, LABEL_MANAGED,
};

/// The host name containers use for the coordinator; it resolves to their
/// network's gateway, where the coordinator listens.
pub const COORDINATOR_HOST: &str = "drover-coordinator";
/// Where the NoCloud seed goes inside the container.
pub const SEED_DIR: &str = "/var/lib/cloud/seed/nocloud";

const PROVIDER: &str = "docker";
/// The label that marks a cluster's load-balancer container (not a machine).
pub const LABEL_ROLE: &str = "drover.dev/role";
/// Its value on the load-balancer container.
pub const ROLE_LOAD_BALANCER: &str = "load-balancer";
/// The port the load balancer serves the API on.
pub const LOAD_BALANCER_PORT: u16 = 6443;
/// What a `kind` machine gets beyond Docker's default capabilities when it
/// may not be privileged: mounts and namespaces for systemd, and the
/// network settings kube-proxy and the CNI plugins make.
pub const UNPRIVILEGED_KIND_CAPABILITIES: [&str; 2] = ["CAP_SYS_ADMIN", "CAP_NET_ADMIN"];

/// What a `minimal` machine gets beyond Docker's default capabilities:
/// the routes of the image pod network.
pub const MINIMAL_NETWORK_CAPABILITY: &str = "CAP_NET_ADMIN";

/// A connection to the Docker engine, scoped to one coordinator's objects.
#[derive(Clone)]
pub struct DockerProvider {
    docker: Docker,
    /// Value of the managed-by label: this coordinator's identity, so two
    /// coordinators on one engine never sweep each other's containers.
    owner: String,
}

/// A cluster network and the address of the host on it.
#[derive(Debug, Clone)]
pub struct ClusterNetwork {
    pub name: String,
    pub gateway: IpAddr,
}

fn failed(action: &'static str, object: impl Into<String>, e: DockerError) -> ProviderError {
    ProviderError::Failed {
        provider: PROVIDER,
        action,
        object: object.into(),
        detail: e.to_string(),
    }
}

/// The node image is not on the engine: nothing can be pulled, so the user
/// builds it or names another.
fn image_missing(action: &'static str, object: String, image: &str) -> ProviderError {
    ProviderError::Failed {
        provider: PROVIDER,
        action,
        object,
        detail: format!(
            "image {image} not found; build it (scripts/build-node-image) or fix spec.provider.docker.image"
        ),
    }
}

/// The container of a machine, made as its profile says.
fn machine_container(
    req: &MachineRequest,
    network: &ClusterNetwork,
    labels: HashMap<String, String>,
    spec: &DockerProviderSpec,
) -> ContainerCreateBody {
    let mut host_config = HostConfig {
        network_mode: Some(network.name.clone()),
        extra_hosts: Some(vec![format!("{COORDINATOR_HOST}:{}", network.gateway)]),
        ..Default::default()
    };
    let mut body = ContainerCreateBody {
        image: Some(req.image.clone()),
        hostname: Some(req.machine.clone()),
        labels: Some(labels),
        ..Default::default()
    };
    match spec.profile {
        // The image pod network's routes to other Nodes' pod ranges
        // (`cni: image`, agent/src/podnet.rs) need CAP_NET_ADMIN in the
        // machine's own network namespace; Docker's default set lacks it.
        DockerMachineProfile::Minimal => {
            host_config.cap_add = Some(vec![MINIMAL_NETWORK_CAPABILITY.into()]);
        }
        DockerMachineProfile::Kind => {
            // As kind's node provisioning does: systemd, containerd and the
            // kubelet need every device, capability and cgroup (privileged,
            // no seccomp or AppArmor profile), a private cgroup namespace to
            // run their own hierarchy in, /run and /tmp as tmpfs (systemd
            // expects them empty at boot), /var on a volume (containerd's
            // overlay snapshots cannot sit on the container's own overlay
            // root), and the host's kernel modules to load from.
            if spec.privileged() {
                host_config.privileged = Some(true);
            } else {
                host_config.cap_add =
                    Some(UNPRIVILEGED_KIND_CAPABILITIES.map(String::from).to_vec());
            }
            host_config.security_opt = Some(vec![
                "seccomp=unconfined".into(),
                "apparmor=unconfined".into(),
            ]);
            host_config.cgroupns_mode = Some(HostConfigCgroupnsModeEnum::PRIVATE);
            host_config.tmpfs = Some(HashMap::from([
                ("/run".to_owned(), "rw,nosuid,nodev,exec".to_owned()),
                ("/tmp".to_owned(), "rw,nosuid,nodev,exec".to_owned()),
            ]));
            // A bind in the `-v` form, as kind's: the engine creates the
            // source when the host has no modules directory, where the
            // `--mount` form would refuse to start the machine.
            host_config.binds = Some(vec!["/lib/modules:/lib/modules:ro".into()]);
            // The anonymous /var volume starts with the image's /var (the
            // agent's state directory and the seed directory) and is
            // removed with the container.
            body.volumes = Some(vec!["/var".to_owned()]);
            // systemd shuts down cleanly on SIGRTMIN+3, not on SIGTERM, and
            // detects the container manager from `container`.
            body.stop_signal = Some("SIGRTMIN+3".into());
            body.env = Some(vec!["container=docker".into()]);
            // A terminal, as kind gives its nodes: systemd writes its boot
            // progress to the container's output.
            body.tty = Some(true);
        }
    }
    body.host_config = Some(host_config);
    body
}

/// A privileged machine the engine cannot start because it may not grant
/// every capability (runc's "unable to apply caps"): the error says what
/// to change.
fn capabilities_hint(e: ProviderError, spec: &DockerProviderSpec) -> ProviderError {
    match e {
        ProviderError::Failed {
            provider,
            action,
            object,
            detail,
        } if spec.privileged() && detail.contains("apply caps") => ProviderError::Failed {
            provider,
            action,
            object,
            detail: format!(
                "{detail}; this engine cannot grant every capability to a privileged container: set spec.provider.docker.privileged: false, or run the engine with the full capability bounding set"
            ),
        },
        other => other,
    }
}

fn status_code(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

impl DockerProvider {
    /// Connects to the engine named by `DOCKER_HOST` (default: the local
    /// socket) and agrees on an API version with it.
    pub async fn connect(owner: String) -> Result<Self, ProviderError> {
        let docker = Docker::connect_with_defaults()
            .map_err(|e| ProviderError::Unavailable {
                provider: PROVIDER,
                detail: e.to_string(),
            })?
            .negotiate_version()
            .await
            .map_err(|e| ProviderError::Unavailable {
                provider: PROVIDER,
                detail: e.to_string(),
            })?;
        Ok(Self { docker, owner })
    }

    /// The name of a cluster's network.
    pub fn network_name(cluster: &str) -> String {
        format!("drover-{cluster}")
    }

    /// The name of a machine's container.
    pub fn container_name(cluster: &str, machine: &str) -> String {
        format!("drover-{cluster}-{machine}")
    }

    /// The name of a cluster's load-balancer container.
    pub fn load_balancer_name(cluster: &str) -> String {
        format!("drover-{cluster}-lb")
    }

    fn cluster_labels(&self, cluster: &str, cluster_uid: &str) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_MANAGED.to_owned(), self.owner.clone()),
            (LABEL_CLUSTER.to_owned(), cluster.to_owned()),
            (LABEL_CLUSTER_UID.to_owned(), cluster_uid.to_owned()),
        ])
    }

    /// Creates the cluster's network unless it exists; returns it with its gateway.
    pub async fn ensure_network(
        &self,
        cluster: &str,
        cluster_uid: &str,
    ) -> Result<ClusterNetwork, ProviderError> {
        if let Some(net) = self.find_network(cluster, cluster_uid).await? {
            return Ok(net);
        }
        let name = Self::network_name(cluster);
        let req = NetworkCreateRequest {
            name: name.clone(),
            driver: Some("bridge".into()),
            labels: Some(self.cluster_labels(cluster, cluster_uid)),
            ..Default::default()
        };
        match self.docker.create_network(req).await {
            Ok(_) => tracing::info!(network = %name, cluster, "docker network created"),
            // Someone created it meanwhile: inspect decides below.
            Err(e) if status_code(&e) == Some(409) => {}
            Err(e) => return Err(failed("create network", &name, e)),
        }
        self.find_network(cluster, cluster_uid)
            .await?
            .ok_or_else(|| ProviderError::Failed {
                provider: PROVIDER,
                action: "inspect network",
                object: name,
                detail: "the network was removed right after it was created".into(),
            })
    }

    /// The cluster's network with its gateway, if it exists; never creates
    /// it. A network of that name that is not this cluster's is refused.
    pub async fn find_network(
        &self,
        cluster: &str,
        cluster_uid: &str,
    ) -> Result<Option<ClusterNetwork>, ProviderError> {
        let name = Self::network_name(cluster);
        let net = match self
            .docker
            .inspect_network(&name, None::<InspectNetworkOptions>)
            .await
        {
            Ok(n) => n,
            Err(e) if status_code(&e) == Some(404) => return Ok(None),
            Err(e) => return Err(failed("inspect network", &name, e)),
        };
        self.check_owned(
            &net.labels.clone().unwrap_or_default(),
            cluster_uid,
            format!("docker network {name}"),
        )?;
        let gateway = net
            .ipam
            .as_ref()
            .and_then(|i: &Ipam| i.config.as_ref())
            .and_then(|c| c.iter().find_map(|c| c.gateway.as_ref()))
            .and_then(|g| g.parse::<IpAddr>().ok())
            .ok_or_else(|| ProviderError::Failed {
                provider: PROVIDER,
                action: "read the gateway of",
                object: format!("docker network {name}"),
                detail: "the network has no IPv4 gateway".into(),
            })?;
        Ok(Some(ClusterNetwork { name, gateway }))
    }

    /// Creates and starts a machine's container. Idempotent: a container with
    /// the machine's name and UID label is adopted, not created twice.
    pub async fn create(
        &self,
        req: &MachineRequest,
        network: &ClusterNetwork,
        spec: &DockerProviderSpec,
    ) -> Result<String, ProviderError> {
        let name = Self::container_name(&req.cluster, &req.machine);
        let mut labels = self.cluster_labels(&req.cluster, &req.cluster_uid);
        labels.insert(LABEL_MACHINE.into(), req.machine.clone());
        labels.insert(LABEL_MACHINE_UID.into(), req.machine_uid.clone());
        let body = machine_container(req, network, labels, spec);
        let opts = CreateContainerOptions {
            name: Some(name.clone()),
            ..Default::default()
        };
        let id = match self.docker.create_container(Some(opts), body).await {
            Ok(r) => {
                tracing::info!(container = %name, machine = %req.machine, "container created");
                r.id
            }
            Err(e) if status_code(&e) == Some(409) => {
                let (existing, labels) = self.inspect(&name, "inspect container").await?;
                let uid = labels.get(LABEL_MACHINE_UID).cloned();
                if uid.as_deref() != Some(req.machine_uid.as_str()) {
                    return Err(ProviderError::Foreign {
                        object: format!("container {name}"),
                        detail: format!("its machine UID label is {uid:?}"),
                    });
                }
                let running = existing
                    .state
                    .as_ref()
                    .and_then(|s| s.running)
                    .unwrap_or(false);
                let id = existing.id.unwrap_or_default();
                if running {
                    tracing::info!(container = %name, "container already exists and runs; adopted");
                    return Ok(id);
                }
                tracing::info!(container = %name, "container already exists; adopted");
                id
            }
            Err(e) if status_code(&e) == Some(404) => {
                return Err(image_missing("create container", name, &req.image))
            }
            Err(e) => return Err(failed("create container", &name, e)),
        };
        let tar = seed_archive(&req.user_data, &req.machine, &req.machine_uid).map_err(|e| {
            ProviderError::Failed {
                provider: PROVIDER,
                action: "pack the seed for",
                object: name.clone(),
                detail: e.to_string(),
            }
        })?;
        self.upload(&name, tar, "copy user data into").await?;
        self.start(&name, "start container")
            .await
            .map_err(|e| capabilities_hint(e, spec))?;
        Ok(id)
    }

    /// Creates and starts the cluster's load-balancer container unless it
    /// exists: `drover-agent load-balancer` from the node image, on the
    /// cluster's network. Returns it with its address on that network.
    pub async fn ensure_load_balancer(
        &self,
        cluster: &str,
        cluster_uid: &str,
        image: &str,
        network: &ClusterNetwork,
    ) -> Result<super::EndpointLoadBalancer, ProviderError> {
        let name = Self::load_balancer_name(cluster);
        let mut labels = self.cluster_labels(cluster, cluster_uid);
        labels.insert(LABEL_ROLE.into(), ROLE_LOAD_BALANCER.into());
        let body = ContainerCreateBody {
            image: Some(image.to_owned()),
            hostname: Some(name.clone()),
            labels: Some(labels),
            // On the PATH of every Drover node image (the test image has it
            // in /usr/bin, the user recipe in /usr/local/bin).
            entrypoint: Some(vec!["drover-agent".into(), "load-balancer".into()]),
            cmd: Some(vec![
                "--listen".into(),
                format!("0.0.0.0:{LOAD_BALANCER_PORT}"),
            ]),
            host_config: Some(HostConfig {
                network_mode: Some(network.name.clone()),
                init: Some(true),
                // The engine brings it back after a crash or a reboot; the
                // reconciler brings it back from anything else (a kill, a
                // pause, a removal).
                restart_policy: Some(RestartPolicy {
                    name: Some(RestartPolicyNameEnum::UNLESS_STOPPED),
                    maximum_retry_count: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let opts = CreateContainerOptions {
            name: Some(name.clone()),
            ..Default::default()
        };
        match self.docker.create_container(Some(opts), body).await {
            Ok(_) => tracing::info!(container = %name, cluster, "load-balancer container created"),
            Err(e) if status_code(&e) == Some(409) => {}
            Err(e) if status_code(&e) == Some(404) => {
                return Err(image_missing("create the load balancer", name, image))
            }
            Err(e) => return Err(failed("create the load balancer", &name, e)),
        }
        let (c, _) = self.inspect(&name, "inspect the load balancer").await?;
        if c.state.as_ref().and_then(|s| s.paused) == Some(true) {
            self.docker
                .unpause_container(&name)
                .await
                .map_err(|e| failed("unpause the load balancer", &name, e))?;
            tracing::info!(container = %name, cluster, "load-balancer container unpaused");
        }
        self.start(&name, "start the load balancer").await?;
        let (c, labels) = self.inspect(&name, "inspect the load balancer").await?;
        self.check_owned(&labels, cluster_uid, format!("container {name}"))?;
        let ip = c
            .network_settings
            .as_ref()
            .and_then(|n| n.networks.as_ref())
            .and_then(|n| n.get(&network.name))
            .and_then(|n| n.ip_address.clone())
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| ProviderError::Failed {
                provider: PROVIDER,
                action: "read the address of",
                object: format!("load-balancer container {name}"),
                detail: format!("it has no address on network {}", network.name),
            })?;
        Ok(super::EndpointLoadBalancer {
            id: name,
            address: format!("{ip}:{LOAD_BALANCER_PORT}"),
        })
    }

    /// Writes the backends file into the cluster's load-balancer container
    /// and signals the load balancer to read it at once.
    pub async fn set_load_balancer_backends(
        &self,
        cluster: &str,
        config: &drover_common::wire::LoadBalancerConfig,
    ) -> Result<(), ProviderError> {
        let name = Self::load_balancer_name(cluster);
        let json = serde_json::to_vec_pretty(config).expect("the backends file serializes");
        let tar = file_archive(drover_common::wire::LOAD_BALANCER_CONFIG_PATH, &json, 0o644)
            .map_err(|e| ProviderError::Failed {
                provider: PROVIDER,
                action: "pack the backends file for",
                object: name.clone(),
                detail: e.to_string(),
            })?;
        self.upload(&name, tar, "write the backends of").await?;
        // It re-reads the file at once on SIGHUP (else within a second).
        self.docker
            .kill_container(
                &name,
                Some(KillContainerOptions {
                    signal: "SIGHUP".into(),
                }),
            )
            .await
            .map_err(|e| failed("signal the load balancer", &name, e))?;
        tracing::info!(container = %name, backends = ?config.backends, "load-balancer backends written");
        Ok(())
    }

    /// Starts container `name` unless it runs; `action` says what for in
    /// an error.
    async fn start(&self, name: &str, action: &'static str) -> Result<(), ProviderError> {
        match self
            .docker
            .start_container(name, None::<StartContainerOptions>)
            .await
        {
            Ok(()) => Ok(()),
            // 304: already started.
            Err(e) if status_code(&e) == Some(304) => Ok(()),
            Err(e) => Err(failed(action, name, e)),
        }
    }

    /// Inspects container `name`, returning it with its labels; `action`
    /// says what for in an error.
    async fn inspect(
        &self,
        name: &str,
        action: &'static str,
    ) -> Result<(ContainerInspectResponse, HashMap<String, String>), ProviderError> {
        let c = self
            .docker
            .inspect_container(name, None)
            .await
            .map_err(|e| failed(action, name, e))?;
        let labels = c
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        Ok((c, labels))
    }

    /// Refuses `object` unless its labels say it is this coordinator's and
    /// cluster `cluster_uid`'s.
    fn check_owned(
        &self,
        labels: &HashMap<String, String>,
        cluster_uid: &str,
        object: String,
    ) -> Result<(), ProviderError> {
        if labels.get(LABEL_CLUSTER_UID).map(String::as_str) != Some(cluster_uid)
            || labels.get(LABEL_MANAGED) != Some(&self.owner)
        {
            return Err(ProviderError::Foreign {
                object,
                detail: format!("labels {labels:?}"),
            });
        }
        Ok(())
    }

    /// Unpacks tar archive `tar` at `/` in container `name`; `action` says
    /// what for in an error.
    async fn upload(
        &self,
        name: &str,
        tar: Vec<u8>,
        action: &'static str,
    ) -> Result<(), ProviderError> {
        self.docker
            .upload_to_container(
                name,
                Some(UploadToContainerOptions {
                    path: "/".into(),
                    ..Default::default()
                }),
                bollard::body_full(tar.into()),
            )
            .await
            .map_err(|e| failed(action, name, e))
    }

    /// Removes a machine's container; a missing one is already deleted.
    pub async fn delete(&self, cluster: &str, machine: &str) -> Result<(), ProviderError> {
        let name = Self::container_name(cluster, machine);
        self.remove_container(&name).await
    }

    /// Removes a container by name or id, whatever its state.
    pub async fn remove_container(&self, name: &str) -> Result<(), ProviderError> {
        match self
            .docker
            .remove_container(
                name,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await
        {
            Ok(()) => {
                tracing::info!(container = %name, "container removed");
                Ok(())
            }
            Err(e) if status_code(&e) == Some(404) => Ok(()),
            // 409: removal already in progress.
            Err(e) if status_code(&e) == Some(409) => Ok(()),
            Err(e) => Err(failed("remove container", name, e)),
        }
    }

    /// Removes a cluster's network; a missing one is already deleted.
    pub async fn delete_network(&self, cluster: &str) -> Result<(), ProviderError> {
        self.remove_network(&Self::network_name(cluster)).await
    }

    /// Removes a network by name.
    pub async fn remove_network(&self, name: &str) -> Result<(), ProviderError> {
        match self.docker.remove_network(name).await {
            Ok(()) => {
                tracing::info!(network = %name, "docker network removed");
                Ok(())
            }
            Err(e) if status_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(failed("remove network", name, e)),
        }
    }

    /// Every container this coordinator created, in any state, its load
    /// balancers' too.
    async fn containers(&self) -> Result<Vec<ContainerSummary>, ProviderError> {
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_MANAGED}={}", self.owner)],
        )]);
        self.docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| failed("list containers", "of this coordinator", e))
    }

    /// Every load-balancer container this coordinator created, in any
    /// state.
    async fn load_balancer_containers(
        &self,
    ) -> Result<impl Iterator<Item = ContainerSummary>, ProviderError> {
        Ok(self
            .containers()
            .await?
            .into_iter()
            .filter(|c| is_load_balancer(c.labels.as_ref())))
    }

    /// Every machine container this coordinator created, in any state.
    pub async fn list(&self) -> Result<Vec<ProviderMachine>, ProviderError> {
        Ok(self
            .containers()
            .await?
            .into_iter()
            .filter(|c| !is_load_balancer(c.labels.as_ref()))
            .map(|c| {
                let state = container_state(c.state);
                ProviderMachine {
                    provider_id: c.id.unwrap_or_default(),
                    labels: c
                        .labels
                        .unwrap_or_default()
                        .into_iter()
                        .collect::<BTreeMap<_, _>>(),
                    state,
                }
            })
            .collect())
    }

    /// The state of every load-balancer container this coordinator
    /// created, by its cluster's UID.
    pub async fn load_balancer_states(
        &self,
    ) -> Result<Vec<(String, InstanceState)>, ProviderError> {
        Ok(self
            .load_balancer_containers()
            .await?
            .filter_map(|c| {
                let uid = c.labels.as_ref()?.get(LABEL_CLUSTER_UID)?.clone();
                Some((uid, container_state(c.state)))
            })
            .collect())
    }

    /// Every load-balancer container this coordinator created, as
    /// cluster resources named by container name.
    pub async fn list_load_balancers(&self) -> Result<Vec<Managed>, ProviderError> {
        Ok(self
            .load_balancer_containers()
            .await?
            .filter_map(|c| {
                let name = c.names?.first()?.trim_start_matches('/').to_owned();
                Some(Managed::ClusterResource {
                    name,
                    labels: c.labels.unwrap_or_default().into_iter().collect(),
                })
            })
            .collect())
    }

    /// Every network this coordinator created.
    pub async fn list_networks(&self) -> Result<Vec<ProviderNetwork>, ProviderError> {
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_MANAGED}={}", self.owner)],
        )]);
        let list = self
            .docker
            .list_networks(Some(ListNetworksOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| failed("list networks", "of this coordinator", e))?;
        Ok(list
            .into_iter()
            .map(|n| ProviderNetwork {
                name: n.name.unwrap_or_default(),
                labels: n.labels.unwrap_or_default().into_iter().collect(),
            })
            .collect())
    }
}

/// The `docker` provider as a [`Provider`]: the coordinator's one engine
/// connection, made on first use (so a provider that only checks, such as
/// the registration's instance check, never connects).
pub struct DockerEngine<'a> {
    connection: &'a tokio::sync::OnceCell<DockerProvider>,
    owner: String,
}

impl<'a> DockerEngine<'a> {
    /// The provider over `connection`, connecting as `owner` on first use.
    pub fn new(connection: &'a tokio::sync::OnceCell<DockerProvider>, owner: String) -> Self {
        Self { connection, owner }
    }

    /// The engine connection, made on first use.
    pub async fn docker(&self) -> Result<&DockerProvider, ProviderError> {
        self.connection
            .get_or_try_init(|| DockerProvider::connect(self.owner.clone()))
            .await
    }

    async fn create_machine(&self, host: &dyn CreateHost) -> Result<Created, ProviderError> {
        let (cluster, m) = (host.cluster(), host.machine());
        let ProviderSpec::Docker(spec) = &cluster.spec.provider else {
            return super::not_its_cluster(PROVIDER, "create", host, "a docker cluster");
        };
        let docker = self.docker().await?;
        let cluster_uid = cluster.metadata.uid.clone().unwrap_or_default();
        let network = docker
            .ensure_network(&cluster.metadata.name, &cluster_uid)
            .await?;
        let port =
            host.listen_on(network.gateway)
                .await
                .map_err(|detail| ProviderError::Failed {
                    provider: PROVIDER,
                    action: "listen on the gateway of",
                    object: format!("docker network {}", network.name),
                    detail: detail.to_string(),
                })?;
        let coordinators =
            host.gateway_urls(port)
                .await
                .map_err(|detail| ProviderError::Failed {
                    provider: PROVIDER,
                    action: "list the coordinator replicas for",
                    object: format!("machine {}", m.metadata.name),
                    detail: detail.to_string(),
                })?;
        let req = MachineRequest::new(
            cluster,
            m,
            host.bootstrap_document(coordinators),
            &spec.image,
        );
        let id = docker.create(&req, &network, spec).await?;
        Ok(Created {
            message: format!(
                "container {} created on network {}",
                short(&id),
                network.name
            ),
            provider_id: id,
            node_provider_id: None,
        })
    }

    async fn managed_objects(&self) -> Result<Vec<Managed>, ProviderError> {
        let docker = self.docker().await?;
        let containers = docker.list().await?;
        let load_balancers = docker.list_load_balancers().await?;
        let networks = docker.list_networks().await?;
        // Containers before networks: a network goes only once nothing is
        // attached to it.
        Ok(containers
            .into_iter()
            .map(|pm| Managed::Machine {
                provider_id: pm.provider_id,
                labels: pm.labels,
                gone: false,
            })
            .chain(load_balancers)
            .chain(networks.into_iter().map(|n| Managed::ClusterResource {
                name: n.name,
                labels: n.labels,
            }))
            .collect())
    }

    async fn remove(&self, orphan: &Managed) -> Result<Option<String>, ProviderError> {
        let docker = self.docker().await?;
        match orphan {
            Managed::Machine {
                provider_id,
                labels,
                ..
            } => {
                docker.remove_container(provider_id).await?;
                tracing::warn!(container = %short(provider_id), labels = ?labels, "orphan container removed");
                Ok(Some(format!("container {}", short(provider_id))))
            }
            Managed::ClusterResource { name, labels } if is_load_balancer_labels(labels) => {
                docker.remove_container(name).await?;
                tracing::warn!(container = %name, "orphan load balancer removed");
                Ok(Some(format!("load-balancer container {name}")))
            }
            Managed::ClusterResource { name, .. } => match docker.remove_network(name).await {
                Ok(()) => {
                    tracing::warn!(network = %name, "orphan network removed");
                    Ok(Some(format!("network {name}")))
                }
                // Still in use by containers removed above: next sweep.
                Err(e) => {
                    tracing::info!(network = %name, error = %e, "orphan network not removed yet");
                    Ok(None)
                }
            },
        }
    }
}

impl Provider for DockerEngine<'_> {
    fn create<'a>(&'a self, host: &'a dyn CreateHost) -> Fut<'a, Created> {
        Box::pin(self.create_machine(host))
    }

    fn destroy<'a>(&'a self, cluster: &'a Cluster, machine: &'a Machine) -> Fut<'a, ()> {
        Box::pin(async move {
            self.docker()
                .await?
                .delete(&cluster.metadata.name, &machine.metadata.name)
                .await
        })
    }

    fn delete_cluster_resources<'a>(&'a self, cluster: &'a Cluster) -> Fut<'a, ()> {
        Box::pin(async move {
            let docker = self.docker().await?;
            let name = &cluster.metadata.name;
            docker
                .remove_container(&DockerProvider::load_balancer_name(name))
                .await?;
            docker.delete_network(name).await
        })
    }

    fn ensure_endpoint<'a>(
        &'a self,
        cluster: &'a Cluster,
    ) -> Fut<'a, Option<super::EndpointLoadBalancer>> {
        Box::pin(async move {
            let ProviderSpec::Docker(spec) = &cluster.spec.provider else {
                return Ok(None);
            };
            let docker = self.docker().await?;
            let uid = cluster.metadata.uid.clone().unwrap_or_default();
            let network = docker.ensure_network(&cluster.metadata.name, &uid).await?;
            let lb = docker
                .ensure_load_balancer(&cluster.metadata.name, &uid, &spec.image, &network)
                .await?;
            Ok(Some(lb))
        })
    }

    fn set_endpoint_backends<'a>(
        &'a self,
        cluster: &'a Cluster,
        config: &'a drover_common::wire::LoadBalancerConfig,
    ) -> Fut<'a, ()> {
        Box::pin(async move {
            self.docker()
                .await?
                .set_load_balancer_backends(&cluster.metadata.name, config)
                .await
        })
    }

    fn list(&self) -> Fut<'_, Vec<ProviderMachine>> {
        Box::pin(async move { self.docker().await?.list().await })
    }

    fn endpoint_states(&self) -> Fut<'_, Vec<(String, InstanceState)>> {
        Box::pin(async move { self.docker().await?.load_balancer_states().await })
    }

    fn managed(&self) -> Fut<'_, Vec<Managed>> {
        Box::pin(self.managed_objects())
    }

    fn remove_orphan<'a>(&'a self, orphan: &'a Managed) -> Fut<'a, Option<String>> {
        Box::pin(self.remove(orphan))
    }

    /// Containers run on the coordinator's own engine and read their seed
    /// from a file the coordinator copied in: there is no instance identity
    /// to check.
    fn verify_instance<'a>(&'a self, _: &'a Machine, _: Option<&'a str>) -> Check<'a> {
        Box::pin(async { Ok(()) })
    }
}

/// Whether a container's labels mark a load balancer, not a machine.
/// What a container's state means for the machine or endpoint it is.
fn container_state(state: Option<bollard::models::ContainerSummaryStateEnum>) -> InstanceState {
    use bollard::models::ContainerSummaryStateEnum as S;
    match state {
        Some(S::RUNNING) | Some(S::RESTARTING) => InstanceState::Running,
        Some(S::PAUSED) => InstanceState::Paused,
        Some(S::CREATED) | Some(S::EMPTY) | None => InstanceState::Pending,
        _ => InstanceState::Stopped,
    }
}

fn is_load_balancer(labels: Option<&HashMap<String, String>>) -> bool {
    labels.and_then(|l| l.get(LABEL_ROLE)).map(String::as_str) == Some(ROLE_LOAD_BALANCER)
}

fn is_load_balancer_labels(labels: &BTreeMap<String, String>) -> bool {
    labels.get(LABEL_ROLE).map(String::as_str) == Some(ROLE_LOAD_BALANCER)
}

/// The first 12 characters of a container ID, as `docker ps` shows it.
pub fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// A tar archive holding one file at absolute `path` (with its parent
/// directories), to upload at `/`.
fn file_archive(path: &str, content: &[u8], mode: u32) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let path = path.trim_start_matches('/');
    let mut dir = String::new();
    let parts: Vec<&str> = path.split('/').collect();
    for part in &parts[..parts.len() - 1] {
        dir.push_str(part);
        dir.push('/');
        append_dir(&mut builder, &dir)?;
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(mode);
    h.set_size(content.len() as u64);
    h.set_cksum();
    builder.append_data(&mut h, path, content)?;
    builder.into_inner()
}

fn append_dir(builder: &mut tar::Builder<Vec<u8>>, dir: &str) -> std::io::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o755);
    h.set_size(0);
    h.set_cksum();
    builder.append_data(&mut h, dir, std::io::empty())
}

/// A tar archive holding the NoCloud seed: `user-data` (the bootstrap
/// document) and `meta-data` (instance id and host name).
fn seed_archive(user_data: &str, machine: &str, machine_uid: &str) -> std::io::Result<Vec<u8>> {
    let meta = format!("instance-id: {machine_uid}\nlocal-hostname: {machine}\n");
    let mut builder = tar::Builder::new(Vec::new());
    let mut dir = String::new();
    for part in SEED_DIR.trim_start_matches('/').split('/') {
        dir.push_str(part);
        dir.push('/');
        append_dir(&mut builder, &dir)?;
    }
    for (file, content, mode) in [
        ("user-data", user_data, 0o600),
        ("meta-data", meta.as_str(), 0o644),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(mode);
        h.set_size(content.len() as u64);
        h.set_cksum();
        builder.append_data(&mut h, format!("{dir}{file}"), content.as_bytes())?;
    }
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_machines_are_made_as_kind_makes_nodes_and_minimal_ones_plain() {
        let req = MachineRequest {
            cluster: "c".into(),
            cluster_uid: "u".into(),
            machine: "m1".into(),
            machine_uid: "mu".into(),
            user_data: String::new(),
            image: "img".into(),
        };
        let network = ClusterNetwork {
            name: "drover-c".into(),
            gateway: "172.18.0.1".parse().unwrap(),
        };
        let container = |profile, privileged| {
            let spec = DockerProviderSpec {
                image: "img".into(),
                profile,
                privileged,
            };
            machine_container(&req, &network, HashMap::new(), &spec)
        };
        let plain = container(DockerMachineProfile::Minimal, None);
        let hc = plain.host_config.as_ref().unwrap();
        assert_eq!(hc.privileged, None);
        assert_eq!(
            hc.cap_add.as_deref(),
            Some(&["CAP_NET_ADMIN".to_owned()][..])
        );
        assert_eq!(hc.tmpfs, None);
        assert_eq!(plain.volumes, None);
        assert_eq!(plain.stop_signal, None);
        assert_eq!(hc.network_mode.as_deref(), Some("drover-c"));

        let kind = container(DockerMachineProfile::Kind, None);
        let hc = kind.host_config.as_ref().unwrap();
        assert_eq!(hc.privileged, Some(true));
        assert_eq!(hc.cap_add, None);
        assert_eq!(hc.cgroupns_mode, Some(HostConfigCgroupnsModeEnum::PRIVATE));
        let tmpfs = hc.tmpfs.as_ref().unwrap();
        assert!(tmpfs.contains_key("/run") && tmpfs.contains_key("/tmp"));
        assert_eq!(
            hc.binds.as_deref(),
            Some(&["/lib/modules:/lib/modules:ro".to_owned()][..])
        );
        assert_eq!(kind.volumes.as_deref(), Some(&["/var".to_owned()][..]));
        assert_eq!(kind.stop_signal.as_deref(), Some("SIGRTMIN+3"));
        assert_eq!(
            kind.env.as_deref(),
            Some(&["container=docker".to_owned()][..])
        );
        assert_eq!(
            hc.extra_hosts.as_deref(),
            Some(&[format!("{COORDINATOR_HOST}:172.18.0.1")][..])
        );

        let unprivileged = container(DockerMachineProfile::Kind, Some(false));
        let hc = unprivileged.host_config.as_ref().unwrap();
        assert_eq!(hc.privileged, None);
        assert_eq!(
            hc.cap_add.as_deref(),
            Some(&["CAP_SYS_ADMIN".to_owned(), "CAP_NET_ADMIN".to_owned()][..])
        );
        assert_eq!(hc.cgroupns_mode, Some(HostConfigCgroupnsModeEnum::PRIVATE));
    }

    #[test]
    fn a_privileged_machine_the_engine_cannot_start_names_the_way_out() {
        let refused = || {
            ProviderError::Failed {
            provider: PROVIDER,
            action: "start container",
            object: "drover-c-m1".into(),
            detail: "OCI runtime create failed: runc create failed: unable to start container process: unable to apply caps: operation not permitted".into(),
        }
        };
        let spec = |privileged| DockerProviderSpec {
            image: "img".into(),
            profile: DockerMachineProfile::Kind,
            privileged,
        };
        let hinted = capabilities_hint(refused(), &spec(None)).to_string();
        assert!(
            hinted.contains("unable to apply caps")
                && hinted.contains("set spec.provider.docker.privileged: false"),
            "{hinted}"
        );
        // Unprivileged machines, and other failures, are left as they are.
        let plain = capabilities_hint(refused(), &spec(Some(false))).to_string();
        assert!(!plain.contains("privileged: false"), "{plain}");
    }

    #[test]
    fn seed_archive_holds_user_and_meta_data() {
        let tar_bytes = seed_archive("ticket: x\n", "m1", "uid-1").unwrap();
        let mut archive = tar::Archive::new(&tar_bytes[..]);
        let mut files = BTreeMap::new();
        for e in archive.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            let mut s = String::new();
            std::io::Read::read_to_string(&mut e, &mut s).unwrap();
            files.insert(path, s);
        }
        assert_eq!(files["var/lib/cloud/seed/nocloud/user-data"], "ticket: x\n");
        assert!(files["var/lib/cloud/seed/nocloud/meta-data"].contains("local-hostname: m1"));
    }
}
