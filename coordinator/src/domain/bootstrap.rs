//! Config bundles: the files and kubeadm configuration one machine needs,
//! rendered for its role and signed with the coordinator CA key.

use drover_common::api::{Cluster, CustomiseError, Machine, MachinePhase, MachineRole};
use drover_common::bundle::{BundleFile, ConfigBundle, SignedBundle};
use drover_common::kubeadm::{self, ClusterParams, NodeHost, NodeParams, CERTIFICATES_DIR};
use drover_common::pin::CaPin;

use crate::domain::jointokens::{ClusterJoinTokens, JoinTokenDecision};
use crate::domain::secrets::ClusterPki;
use crate::domain::settings::Settings;
use crate::store::{Kind, Modify, Store, StoreError};

/// What building a bundle reads: the coordinator's store, settings and CA
/// key, and its view of clusters and machines (with their freshest
/// heartbeat times). `App` provides it; the domain never names `App`.
pub trait BundleSource {
    fn store(&self) -> &Store;
    fn settings(&self) -> &Settings;
    fn ca_key_pem(&self) -> &str;
    fn cluster(&self, name: &str) -> Result<Option<Cluster>, StoreError>;
    fn machine(&self, name: &str) -> Result<Option<Machine>, StoreError>;
    fn machines(&self) -> Result<Vec<Machine>, StoreError>;
}

/// Where the agent writes the kubeadm config, inside the machine's root.
pub const KUBEADM_CONFIG_PATH: &str = "/etc/drover/kubeadm.yaml";

/// Why a machine's config bundle cannot be built, or not yet. The HTTP
/// edge answers each with its problem document (`NotReady` with a
/// `ConfigNotReady` the agent reads).
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// An object the bundle needs does not exist, or no longer applies.
    #[error("{kind} {name} does not exist")]
    NotFound { kind: &'static str, name: String },
    /// The machine's cluster is in a state with no bundle (being deleted).
    #[error("{0}")]
    Conflict(String),
    /// The machine's kubeadm is of another version than the one it is to
    /// run: it is not bootstrapped (kubeadm would refuse, or deploy a
    /// version the cluster does not declare).
    #[error(
        "machine {machine} has kubeadm {kubeadm} but cluster {cluster} runs Kubernetes {version}: \
         a machine bootstraps only with its cluster's version of kubeadm; make it from an image built \
         for {version} (the test node image: scripts/build-node-image --kubernetes-version {version}), \
         or set the cluster's kubernetesVersion to the image's"
    )]
    VersionMismatch {
        machine: String,
        kubeadm: String,
        cluster: String,
        version: String,
    },
    /// The machine must wait and ask again after `retry_after_seconds`.
    #[error("{reason}")]
    NotReady {
        reason: String,
        retry_after_seconds: u64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Signing failed, the CA pin could not be computed, or the join tokens
    /// kept changing under concurrent writers.
    #[error("{0}")]
    Internal(String),
}

impl BootstrapError {
    /// The "not yet" answer for a machine that must wait: it asks again
    /// after a heartbeat interval (1 to 5 s).
    pub fn not_ready(app: &dyn BundleSource, reason: String) -> Self {
        let retry_after_seconds = app.settings().heartbeat_interval.as_secs().clamp(1, 5);
        tracing::debug!(%reason, "config not ready");
        Self::NotReady {
            reason,
            retry_after_seconds,
        }
    }
}

/// The machine condition that says whether its kubeadm is its cluster's
/// version.
pub const KUBEADM_VERSION_CONDITION: &str = "KubeadmVersionMatches";

/// Refuses a machine whose reported kubeadm is not the version its
/// cluster runs (a machine that has not said, an older agent, passes).
pub fn check_kubeadm_version(machine: &Machine, cluster: &Cluster) -> Result<(), BootstrapError> {
    let have = machine.status.kubeadm_version.as_str();
    let want = cluster.spec.kubernetes_version.as_str();
    if have.is_empty() || have.trim_start_matches('v') == want.trim_start_matches('v') {
        return Ok(());
    }
    Err(BootstrapError::VersionMismatch {
        machine: machine.metadata.name.clone(),
        kubeadm: have.to_owned(),
        cluster: cluster.metadata.name.clone(),
        version: want.to_owned(),
    })
}

/// Builds and signs the bundle for a machine's current assignment.
pub fn bundle_for(
    app: &dyn BundleSource,
    machine: &Machine,
) -> Result<SignedBundle, BootstrapError> {
    let name = &machine.metadata.name;
    let a = machine
        .spec
        .assignment
        .as_ref()
        .ok_or_else(|| BootstrapError::NotFound {
            kind: "assignment of machine",
            name: name.clone(),
        })?;
    if machine.status.phase == MachinePhase::Releasing {
        return Err(BootstrapError::NotFound {
            kind: "assignment of machine",
            name: name.clone(),
        });
    }
    let cluster = app
        .cluster(&a.cluster)?
        .filter(|c| c.metadata.uid.as_deref() == Some(a.cluster_uid.as_str()))
        .ok_or_else(|| BootstrapError::NotFound {
            kind: "cluster",
            name: a.cluster.clone(),
        })?;
    if cluster.metadata.deletion_timestamp.is_some() {
        return Err(BootstrapError::Conflict(format!(
            "cluster {} is being deleted",
            a.cluster
        )));
    }
    check_kubeadm_version(machine, &cluster)?;
    let not_ready = |why: String| BootstrapError::not_ready(app, why);
    let pki = crate::domain::secrets::load_pki(app.store(), &cluster)?.ok_or_else(|| {
        not_ready(format!(
            "the PKI of cluster {} is not created yet",
            a.cluster
        ))
    })?;
    let endpoint = cluster
        .status
        .control_plane_endpoint
        .clone()
        .ok_or_else(|| {
            not_ready(format!(
                "cluster {} has no control-plane endpoint yet",
                a.cluster
            ))
        })?;
    let address = machine
        .status
        .addresses
        .first()
        .cloned()
        .unwrap_or_default();
    let node = NodeParams {
        node_name: machine.status.hostname.clone(),
        advertise_address: address,
        api_server_port: machine.status.api_server_port,
        kubelet_healthz_port: machine.status.kubelet_healthz_port,
    };
    let cparams = ClusterParams {
        cluster_name: cluster.metadata.name.clone(),
        kubernetes_version: cluster.spec.kubernetes_version.clone(),
        control_plane_endpoint: endpoint,
        pod_subnet: cluster.spec.network.pod_subnet.clone(),
        service_subnet: cluster.spec.network.service_subnet.clone(),
        dns_domain: cluster.spec.network.dns_domain.clone(),
        nodes: if cluster.spec.provider.machines_are_containers() {
            NodeHost::Container
        } else {
            NodeHost::Machine
        },
    };
    let kubeadm_yaml = match a.role {
        MachineRole::Init => {
            let token = init_token(app, &cluster, machine)?;
            let ttl = app.settings().join_token_ttl.as_secs();
            kubeadm::render_init(&cparams, &node, &token, ttl)
        }
        MachineRole::ControlPlane | MachineRole::Worker => {
            wait_for_init(app, &cluster)?;
            let token = join_token_for(app, &cluster.metadata.name, &a.cluster_uid)?;
            let pin = CaPin::from_cert_pem(&pki.ca.cert_pem)
                .map_err(|e| BootstrapError::Internal(e.to_string()))?;
            kubeadm::render_join(
                &cparams,
                &node,
                &token,
                &pin,
                a.role == MachineRole::ControlPlane,
            )
        }
    };
    // Validated at apply; an error here means a stored spec from before a
    // rule, which the machine cannot be given.
    // A file's Secret may have gone or lost its key since the apply (a
    // race with its deletion, or a restored store): the machine waits,
    // saying which, until the Secret is applied again.
    let secrets = crate::domain::user_secrets::referenced(app.store(), &cluster.spec)?;
    let lookup =
        |r: &drover_common::api::SecretKeyRef| crate::domain::user_secrets::lookup(&secrets, r);
    let custom = cluster
        .spec
        .machine_customisation(&a.machine_pool, a.role.is_control_plane(), &lookup)
        .map_err(|e| match e {
            CustomiseError::MissingSecret { .. }
            | CustomiseError::MissingKey { .. }
            | CustomiseError::NotText { .. } => not_ready(format!(
                "a file of cluster {} cannot be read: {e}",
                a.cluster
            )),
            e => BootstrapError::Conflict(format!(
                "the files of cluster {} are refused ({e}); fix the spec and apply it again",
                a.cluster
            )),
        })?;
    let mut files = vec![];
    if a.role.is_control_plane() {
        files.extend(shared_ca_files(&pki));
    }
    files.push(BundleFile {
        path: KUBEADM_CONFIG_PATH.into(),
        mode: 0o600,
        content: kubeadm_yaml,
    });
    let bundle = ConfigBundle {
        machine_uid: machine.metadata.uid.clone().unwrap_or_default(),
        cluster: cluster.metadata.name.clone(),
        role: a.role,
        generation: a.generation,
        kubernetes_version: cluster.spec.kubernetes_version.clone(),
        files,
        kubeadm_config_path: KUBEADM_CONFIG_PATH.into(),
        machine_files: custom.files,
        pre_kubeadm_commands: custom.pre_kubeadm_commands,
        post_kubeadm_commands: custom.post_kubeadm_commands,
        image_cni: cluster.spec.network.cni == drover_common::api::CniMode::Image,
        issued_at: drover_common::now(),
    };
    tracing::info!(machine = %name, cluster = %cluster.metadata.name, role = %a.role, generation = a.generation, "config bundle issued");
    drover_common::bundle::sign(&bundle, app.ca_key_pem())
        .map_err(|e| BootstrapError::Internal(e.to_string()))
}

/// The shared CA set, for control-plane machines only.
fn shared_ca_files(pki: &ClusterPki) -> Vec<BundleFile> {
    let f = |rel: &str, content: &str, mode: u32| BundleFile {
        path: format!("{CERTIFICATES_DIR}/{rel}"),
        mode,
        content: content.to_owned(),
    };
    vec![
        f("ca.crt", &pki.ca.cert_pem, 0o644),
        f("ca.key", &pki.ca.key_pem, 0o600),
        f("front-proxy-ca.crt", &pki.front_proxy_ca.cert_pem, 0o644),
        f("front-proxy-ca.key", &pki.front_proxy_ca.key_pem, 0o600),
        f("etcd/ca.crt", &pki.etcd_ca.cert_pem, 0o644),
        f("etcd/ca.key", &pki.etcd_ca.key_pem, 0o600),
        f("sa.key", &pki.sa_key_pem, 0o600),
        f("sa.pub", &pki.sa_pub_pem, 0o644),
    ]
}

/// Joiners wait until the cluster is initialized: a fact of the cluster,
/// recorded once its init machine finished `kubeadm init`, that outlives
/// that machine. Only before it is recorded does the init machine's phase
/// tell (it may be Running a pass before the status says so).
fn wait_for_init(app: &dyn BundleSource, cluster: &Cluster) -> Result<(), BootstrapError> {
    if cluster.status.initialized {
        return Ok(());
    }
    let name = &cluster.metadata.name;
    let init = cluster.status.init_machine.as_deref().ok_or_else(|| {
        BootstrapError::not_ready(app, format!("cluster {name} has no init machine yet"))
    })?;
    let phase = app.machine(init)?.map(|m| m.status.phase);
    match phase {
        Some(MachinePhase::Running) => Ok(()),
        Some(p) => Err(BootstrapError::not_ready(
            app,
            format!("waiting for init machine {init} of cluster {name} to finish kubeadm init (it is {p})"),
        )),
        None => Err(BootstrapError::not_ready(
            app,
            format!("init machine {init} of cluster {name} is gone before it initialized the cluster; waiting for a new one"),
        )),
    }
}

/// The token that goes into the init machine's InitConfiguration: one per
/// init machine, recorded as registered (kubeadm init itself creates it)
/// and reused by every later fetch (see [`ClusterJoinTokens::init_token`]).
fn init_token(
    app: &dyn BundleSource,
    cluster: &Cluster,
    machine: &Machine,
) -> Result<drover_common::token::BootstrapToken, BootstrapError> {
    let now = drover_common::now();
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    let name = &cluster.metadata.name;
    let machine_uid = machine.metadata.uid.clone().unwrap_or_default();
    // Once the agent reported running kubeadm init, init has run (or is
    // running) with the token it fetched; it never runs again.
    let past_init = match machine.status.phase {
        MachinePhase::Running => true,
        MachinePhase::Bootstrapping | MachinePhase::Failed => machine
            .status
            .bootstrap
            .as_ref()
            .is_some_and(|b| b.step == drover_common::wire::KUBEADM_INIT_STEP),
        _ => false,
    };
    let may_init = !past_init;
    let ttl = time::Duration::try_from(app.settings().join_token_ttl)
        .unwrap_or(time::Duration::minutes(30));
    app.store().modify_json(
        Kind::JoinTokens,
        name,
        |existing: Option<ClusterJoinTokens>| {
            let mut tokens = ClusterJoinTokens::of_cluster(existing, &uid);
            let (token, changed) = tokens.init_token(&machine_uid, may_init, now, ttl);
            Ok::<_, BootstrapError>(if changed {
                Modify::Write(tokens, token)
            } else {
                Modify::Keep(token)
            })
        },
    )
}

/// The control-plane machine that registers a cluster's new join tokens:
/// the init machine while it runs, else the first running control-plane
/// machine by name. Only it is sent a token's directive, and only its
/// result activates the token.
fn token_registrar(
    app: &dyn BundleSource,
    cluster_uid: &str,
) -> Result<Option<Machine>, StoreError> {
    let mut candidates: Vec<Machine> =
        app.machines()?
            .into_iter()
            .filter(|o| {
                o.status.phase == MachinePhase::Running
                    && o.spec.assignment.as_ref().is_some_and(|oa| {
                        oa.cluster_uid == cluster_uid && oa.role.is_control_plane()
                    })
            })
            .collect();
    candidates.sort_by_key(|o| {
        (
            o.spec.assignment.as_ref().map(|a| a.role) != Some(MachineRole::Init),
            o.metadata.name.clone(),
        )
    });
    Ok(candidates.into_iter().next())
}

/// Mints a join token or reports why a joiner waits.
pub fn join_token_for(
    app: &dyn BundleSource,
    cluster: &str,
    cluster_uid: &str,
) -> Result<drover_common::token::BootstrapToken, BootstrapError> {
    let now = drover_common::now();
    let ttl = time::Duration::try_from(app.settings().join_token_ttl)
        .unwrap_or(time::Duration::minutes(30));
    // What the joiner learns; the reasons name no token and no other
    // machine: a joiner learns only that it waits.
    enum Answer {
        Use(drover_common::token::BootstrapToken),
        Wait,
        Minted { id: String, registrar: String },
    }
    let answer = app.store().modify_json(
        Kind::JoinTokens,
        cluster,
        |existing: Option<ClusterJoinTokens>| {
            let mut tokens = ClusterJoinTokens::of_cluster(existing, cluster_uid);
            let pruned = tokens.prune(now);
            let registrar = token_registrar(app, cluster_uid)?.and_then(|m| m.metadata.uid);
            let (answer, write) = match tokens.decide(now, ttl, registrar.as_deref()) {
                JoinTokenDecision::Use(t) => (Answer::Use(t), pruned),
                JoinTokenDecision::Wait => (Answer::Wait, pruned),
                JoinTokenDecision::Mint(t) => {
                    let answer = Answer::Minted {
                        id: t.token.id().to_owned(),
                        registrar: t.registrar.clone().unwrap_or_default(),
                    };
                    tokens.tokens.push(t);
                    (answer, true)
                }
            };
            Ok::<_, BootstrapError>(if write {
                Modify::Write(tokens, answer)
            } else {
                Modify::Keep(answer)
            })
        },
    )?;
    let waiting = || {
        BootstrapError::not_ready(
            app,
            format!(
                "waiting for a control-plane machine of cluster {cluster} to register a join token"
            ),
        )
    };
    match answer {
        Answer::Use(t) => Ok(t),
        Answer::Wait => Err(waiting()),
        Answer::Minted { id, registrar } => {
            tracing::info!(cluster, token_id = %id, registrar_uid = %registrar, "join token minted; the registrar's agent will register it");
            Err(waiting())
        }
    }
}
