//! Config bundles: the files and kubeadm configuration one machine needs,
//! rendered for its role and signed with the coordinator CA key.

use drover_common::api::{
    Cluster, ClusterSpec, CustomiseError, Machine, MachinePhase, MachineRole, SecretKeyRef,
    CONTROL_PLANE_POOL,
};
use drover_common::bundle::{BundleFile, ConfigBundle, SignedBundle};
use drover_common::kubeadm::{self, ClusterParams, NodeHost, NodeParams, CERTIFICATES_DIR};
use drover_common::objects::customise::{bundle_text_bytes, BUNDLE_OWN_BYTES, MAX_BUNDLE_BYTES};
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
    /// Every machine of the cluster with UID `cluster_uid` (and maybe
    /// others: callers filter).
    fn cluster_machines(&self, cluster_uid: &str) -> Result<Vec<Machine>, StoreError>;
    /// Has the machine with UID `machine_uid` heartbeat over HTTPS at its
    /// next beat: a directive for it (a join token to register) lives
    /// outside its stored object and its cluster's.
    fn recall_to_https(&self, machine_uid: &str);
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

/// The machines whose config bundle is being built or sent now. A machine
/// is served one config fetch at a time: a second fetch with the same
/// identity while one is under way is refused (429), never queued, so a
/// stolen certificate cannot make the coordinator hold more than one
/// bundle of that machine at once, and an agent, which fetches one at a
/// time and retries after a back-off, only meets it after giving up on a
/// fetch the coordinator is still serving.
#[derive(Debug, Clone, Default)]
pub struct BundleBuilds(std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>);

impl BundleBuilds {
    /// Machine `name`'s turn, or `None` while another fetch of it has it.
    pub fn begin(&self, name: &str) -> Option<BuildTurn> {
        let mut busy = self.0.lock().unwrap_or_else(|e| e.into_inner());
        busy.insert(name.to_owned()).then(|| BuildTurn {
            builds: self.clone(),
            name: name.to_owned(),
        })
    }

    /// How many machines' bundles are being built or sent now.
    pub fn in_flight(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// One machine's turn to have its bundle built and sent; the next fetch
/// may start once it is dropped.
#[derive(Debug)]
pub struct BuildTurn {
    builds: BundleBuilds,
    name: String,
}

impl Drop for BuildTurn {
    fn drop(&mut self) {
        self.builds
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.name);
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

/// The Secrets' values a spec's files read, as opened by
/// [`crate::domain::user_secrets::referenced`].
pub type SecretValues =
    std::collections::BTreeMap<String, std::collections::BTreeMap<String, Vec<u8>>>;

/// The pools of `spec` (`spec.controlPlane`, `spec.workerPools[i]`), each
/// with its name, whose machines' config bundles would be larger than
/// [`MAX_BUNDLE_BYTES`], with the bytes the cluster's files and commands
/// take in one and that bundle's size: a Secret's value counts once for
/// every file that reads it.
pub fn oversized_pools(spec: &ClusterSpec, secrets: &SecretValues) -> Vec<OversizedPool> {
    // Each value is measured once, however many files read it.
    let mut sizes = std::collections::BTreeMap::new();
    for (_, r) in spec.secret_refs() {
        sizes
            .entry((r.secret.clone(), r.key.clone()))
            .or_insert_with(|| {
                secrets
                    .get(&r.secret)
                    .and_then(|values| values.get(&r.key))
                    .map_or(0, |v| bundle_text_bytes(&String::from_utf8_lossy(v)))
            });
    }
    let content_from_bytes = |r: &SecretKeyRef| {
        sizes
            .get(&(r.secret.clone(), r.key.clone()))
            .copied()
            .unwrap_or(0)
    };
    let pools = std::iter::once((
        CONTROL_PLANE_FIELD.to_owned(),
        CONTROL_PLANE_POOL.to_owned(),
        true,
    ))
    .chain(
        spec.worker_pools
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("spec.workerPools[{i}]"), p.name.clone(), false)),
    );
    pools
        .filter_map(|(field, pool, control_plane)| {
            let custom =
                spec.machine_customisation_bytes(&pool, control_plane, &content_from_bytes);
            let bytes = custom + BUNDLE_OWN_BYTES;
            (bytes > MAX_BUNDLE_BYTES).then_some(OversizedPool {
                field,
                pool,
                customisation_bytes: custom,
                bytes,
            })
        })
        .collect()
}

/// The field of the control plane's pool.
const CONTROL_PLANE_FIELD: &str = "spec.controlPlane";

/// A pool whose machines' config bundles would be over the cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OversizedPool {
    /// `spec.controlPlane` or `spec.workerPools[i]`.
    pub field: String,
    pub pool: String,
    /// What the cluster's files and commands take in one bundle.
    pub customisation_bytes: usize,
    /// That plus what the bundle's own part may take.
    pub bytes: usize,
}

impl std::fmt::Display for OversizedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a machine of pool {} would get a config bundle of up to {} bytes ({:.1} MiB: {} for its files and commands, \
             a Secret's value counted once for every file that reads it, and {BUNDLE_OWN_BYTES} for the CA set and kubeadm config), \
             over the cap of {MAX_BUNDLE_BYTES} bytes ({} MiB) per machine; make the files or commands smaller or fewer, \
             read a large Secret value from fewer files, or put large content on the machine image",
            self.pool,
            self.bytes,
            self.bytes as f64 / (1024.0 * 1024.0),
            self.customisation_bytes,
            MAX_BUNDLE_BYTES / (1024 * 1024),
        )
    }
}

/// How many bytes a signed bundle takes as it is sent (its JSON).
pub fn signed_bundle_bytes(signed: &SignedBundle) -> usize {
    fn json_string_bytes(text: &str) -> usize {
        2 + text
            .chars()
            .map(|c| match c {
                '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
                c if (c as u32) < 0x20 => 6,
                c => c.len_utf8(),
            })
            .sum::<usize>()
    }
    r#"{"payload":,"signature":}"#.len()
        + json_string_bytes(&signed.payload)
        + json_string_bytes(&signed.signature)
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
    // A joining machine that asks before `kubeadm init` ran is turned away
    // before anything is read or decrypted for it.
    if a.role != MachineRole::Init {
        wait_for_init(app, &cluster)?;
    }
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
    let address = machine.status.address().to_owned();
    let node = NodeParams {
        node_name: machine.status.hostname.clone(),
        advertise_address: address,
        api_server_port: machine.status.api_server_port,
        kubelet_healthz_port: machine.status.kubelet_healthz_port,
        provider_id: machine.status.node_provider_id.clone().unwrap_or_else(|| {
            drover_common::kubeadm::drover_provider_id(&a.cluster, &machine.metadata.name)
        }),
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
    // An init machine of a cluster being restored restores its snapshot:
    // never is it handed a bundle that would initialize a new cluster.
    let restore = match a.role {
        MachineRole::Init => {
            use crate::domain::etcd_restore::{for_init_machine, RestoreBundleError};
            for_init_machine(app.store(), &cluster, machine).map_err(|e| match e {
                RestoreBundleError::Gone(why) => BootstrapError::Conflict(why),
                RestoreBundleError::NotYet(why) => not_ready(why),
                RestoreBundleError::Store(e) => e.into(),
            })?
        }
        _ => None,
    };
    let kubeadm_yaml = match a.role {
        MachineRole::Init => {
            let token = init_token(app, &cluster, machine)?;
            let ttl = app.settings().join_token_ttl.as_secs();
            kubeadm::render_init(&cparams, &node, &token, ttl)
        }
        MachineRole::ControlPlane | MachineRole::Worker => {
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
    // Apply refuses a spec or Secret that would pass the cap; one stored
    // before the rule is refused here, before any file is resolved.
    if let Some(over) = oversized_pools(&cluster.spec, &secrets)
        .into_iter()
        .find(|o| {
            (o.field == CONTROL_PLANE_FIELD) == a.role.is_control_plane()
                && (a.role.is_control_plane() || o.pool == a.machine_pool)
        })
    {
        return Err(BootstrapError::Conflict(format!(
            "cluster {} {}: {over}; fix the cluster or its Secrets and apply them again",
            a.cluster, over.field
        )));
    }
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
    // The patches the config's `patches.directory` names (the machine's
    // own kubelet settings); none for a machine with the defaults.
    files.extend(
        kubeadm::kubeadm_patch_files(&node)
            .into_iter()
            .map(|f| BundleFile {
                path: f.path,
                mode: 0o644,
                content: f.content,
            }),
    );
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
        addons: cluster.spec.addons.iter().map(|a| a.name.clone()).collect(),
        restore,
        issued_at: drover_common::now(),
    };
    let signed = drover_common::bundle::sign(&bundle, app.ca_key_pem())
        .map_err(|e| BootstrapError::Internal(e.to_string()))?;
    drop(bundle);
    let bytes = signed_bundle_bytes(&signed);
    if bytes > MAX_BUNDLE_BYTES {
        return Err(BootstrapError::Conflict(format!(
            "the config bundle of machine {name} in cluster {} would be {bytes} bytes, over the cap of \
             {MAX_BUNDLE_BYTES}; make the cluster's files and commands smaller and apply it again",
            a.cluster
        )));
    }
    tracing::info!(machine = %name, cluster = %cluster.metadata.name, role = %a.role, generation = a.generation, bytes, "config bundle issued");
    Ok(signed)
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
        app.cluster_machines(cluster_uid)?
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
            app.recall_to_https(&registrar);
            tracing::info!(cluster, token_id = %id, registrar_uid = %registrar, "join token minted; the registrar's agent will register it");
            Err(waiting())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::MachineFile;

    fn spec(yaml: &str) -> ClusterSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn reading(n: usize, key: &str) -> Vec<MachineFile> {
        (0..n)
            .map(|i| MachineFile {
                path: format!("/etc/x/{key}-{i}"),
                permissions: None,
                owner: None,
                content: None,
                content_from: Some(SecretKeyRef {
                    secret: "blob".into(),
                    key: key.into(),
                }),
                control_plane_only: false,
            })
            .collect()
    }

    #[test]
    fn a_secret_read_by_many_files_counts_once_per_file() {
        let mut s = spec(
            "kubernetesVersion: v1.31.2\ncontrolPlane: {replicas: 1}\nworkerPools: [{name: gpu, replicas: 1}, {name: small, replicas: 1}]\nprovider: {pool: {selector: {matchLabels: {env: x}}}}\n",
        );
        let secrets: SecretValues = [(
            "blob".to_owned(),
            [("v".to_owned(), vec![b'a'; 250 * 1024])].into(),
        )]
        .into();
        // 16 files of 250 KiB fit in 4 MiB; 17 do not.
        s.worker_pools[0].files = reading(16, "v");
        assert!(oversized_pools(&s, &secrets).is_empty());
        s.worker_pools[0].files = reading(17, "v");
        let over = oversized_pools(&s, &secrets);
        assert_eq!(over.len(), 1, "{over:?}");
        assert_eq!(
            (over[0].field.as_str(), over[0].pool.as_str()),
            ("spec.workerPools[0]", "gpu")
        );
        assert!(over[0].bytes > 17 * 250 * 1024 + BUNDLE_OWN_BYTES);
        let message = over[0].to_string();
        assert!(
            message.contains("pool gpu") && message.contains("over the cap of 4194304 bytes"),
            "{message}"
        );
        // The cluster's files reach every pool; control-plane-only ones
        // only the control plane.
        s.worker_pools[0].files.clear();
        s.files = reading(17, "v");
        for f in &mut s.files {
            f.control_plane_only = true;
        }
        let over = oversized_pools(&s, &secrets);
        assert_eq!(over.len(), 1, "{over:?}");
        assert_eq!(over[0].pool, CONTROL_PLANE_POOL);
        // Characters JSON escapes count as what they take on the wire.
        let quotes: SecretValues = [(
            "blob".to_owned(),
            [("v".to_owned(), vec![b'"'; 250 * 1024])].into(),
        )]
        .into();
        // (5 files of 250 KiB of quotes: 1,250 KiB as text, 5 MB on the wire.)
        s.files = reading(5, "v");
        assert!(oversized_pools(&s, &secrets).is_empty());
        assert_eq!(oversized_pools(&s, &quotes).len(), 3);
    }

    #[test]
    fn one_build_per_machine_at_a_time() {
        let builds = BundleBuilds::default();
        let turn = builds.begin("m1").expect("the first turn");
        assert!(builds.begin("m1").is_none(), "a second fetch of m1 waits");
        let other = builds.begin("m2").expect("another machine is not held up");
        assert_eq!(builds.in_flight(), 2);
        drop(turn);
        assert!(builds.begin("m1").is_some());
        drop(other);
        assert_eq!(builds.in_flight(), 0);
    }

    #[test]
    fn signed_bundle_bytes_are_the_json_sent() {
        let signed = SignedBundle {
            payload: "{\"a\":\"b\\n\\u0001\"}\u{1}é".into(),
            signature: "c2ln".into(),
        };
        assert_eq!(
            signed_bundle_bytes(&signed),
            serde_json::to_vec(&signed).unwrap().len()
        );
    }
}
