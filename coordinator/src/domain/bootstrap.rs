//! Config bundles: the files and kubeadm configuration one machine needs,
//! rendered for its role and signed with the coordinator CA key.

use drover_common::api::{Cluster, Machine, MachinePhase, MachineRole};
use drover_common::bundle::{BundleFile, ConfigBundle, SignedBundle};
use drover_common::kubeadm::{self, ClusterParams, NodeParams, CERTIFICATES_DIR};
use drover_common::pin::CaPin;

use crate::app::App;
use crate::domain::jointokens::ClusterJoinTokens;
use crate::domain::secrets::ClusterPki;
use crate::http::machine::{join_token_for, not_ready};
use crate::http::ApiError;
use crate::store::{Kind, StoreError};

/// Where the agent writes the kubeadm config, inside the machine's root.
pub const KUBEADM_CONFIG_PATH: &str = "/etc/drover/kubeadm.yaml";

/// Builds and signs the bundle for a machine's current assignment.
pub fn bundle_for(app: &App, machine: &Machine) -> Result<SignedBundle, ApiError> {
    let name = &machine.metadata.name;
    let a = machine
        .spec
        .assignment
        .as_ref()
        .ok_or_else(|| ApiError::not_found("assignment of machine", name))?;
    if machine.status.phase == MachinePhase::Releasing {
        return Err(ApiError::not_found("assignment of machine", name));
    }
    let cluster = app
        .cluster(&a.cluster)?
        .filter(|c| c.metadata.uid.as_deref() == Some(a.cluster_uid.as_str()))
        .ok_or_else(|| ApiError::not_found("cluster", &a.cluster))?;
    if cluster.metadata.deletion_timestamp.is_some() {
        return Err(ApiError::conflict(format!(
            "cluster {} is being deleted",
            a.cluster
        )));
    }
    let pki = crate::reconcile::load_pki(app, &cluster)?.ok_or_else(|| {
        not_ready(
            app,
            format!("the PKI of cluster {} is not created yet", a.cluster),
        )
    })?;
    let endpoint = cluster
        .status
        .control_plane_endpoint
        .clone()
        .ok_or_else(|| {
            not_ready(
                app,
                format!("cluster {} has no control-plane endpoint yet", a.cluster),
            )
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
    };
    let kubeadm_yaml = match a.role {
        MachineRole::Init => {
            let token = init_token(app, &cluster, machine)?;
            let ttl = app.settings.join_token_ttl.as_secs();
            kubeadm::render_init(&cparams, &node, &token, ttl)
        }
        MachineRole::ControlPlane | MachineRole::Worker => {
            wait_for_init(app, &cluster)?;
            let token = join_token_for(app, &cluster.metadata.name, &a.cluster_uid)?;
            let pin = CaPin::from_cert_pem(&pki.ca.cert_pem).map_err(ApiError::internal)?;
            kubeadm::render_join(
                &cparams,
                &node,
                &token,
                &pin,
                a.role == MachineRole::ControlPlane,
            )
        }
    };
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
        issued_at: drover_common::now(),
    };
    tracing::info!(machine = %name, cluster = %cluster.metadata.name, role = %a.role, generation = a.generation, "config bundle issued");
    drover_common::bundle::sign(&bundle, &app.ca.key_pem).map_err(ApiError::internal)
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
fn wait_for_init(app: &App, cluster: &Cluster) -> Result<(), ApiError> {
    if cluster.status.initialized {
        return Ok(());
    }
    let name = &cluster.metadata.name;
    let init = cluster
        .status
        .init_machine
        .as_deref()
        .ok_or_else(|| not_ready(app, format!("cluster {name} has no init machine yet")))?;
    let phase = app.machine(init)?.map(|m| m.status.phase);
    match phase {
        Some(MachinePhase::Running) => Ok(()),
        Some(p) => Err(not_ready(
            app,
            format!("waiting for init machine {init} of cluster {name} to finish kubeadm init (it is {p})"),
        )),
        None => Err(not_ready(
            app,
            format!("init machine {init} of cluster {name} is gone before it initialized the cluster; waiting for a new one"),
        )),
    }
}

/// The token that goes into the init machine's InitConfiguration: one per
/// init machine, recorded as registered (kubeadm init itself creates it)
/// and reused by every later fetch (see [`ClusterJoinTokens::init_token`]).
fn init_token(
    app: &App,
    cluster: &Cluster,
    machine: &Machine,
) -> Result<drover_common::token::BootstrapToken, ApiError> {
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
    let ttl = time::Duration::try_from(app.settings.join_token_ttl)
        .unwrap_or(time::Duration::minutes(30));
    for _ in 0..16 {
        let existing = app
            .store
            .get_json::<ClusterJoinTokens>(Kind::JoinTokens, name)?;
        let mut tokens = match &existing {
            Some((t, _)) if t.cluster_uid == uid => t.clone(),
            _ => ClusterJoinTokens {
                cluster_uid: uid.clone(),
                tokens: vec![],
            },
        };
        let (token, changed) = tokens.init_token(&machine_uid, may_init, now, ttl);
        if !changed {
            return Ok(token);
        }
        let r = match existing {
            Some((_, rev)) => app
                .store
                .update_json(Kind::JoinTokens, name, &tokens, Some(rev)),
            None => app.store.create_json(Kind::JoinTokens, name, &tokens),
        };
        match r {
            Ok(_) => return Ok(token),
            Err(StoreError::Conflict { .. }) | Err(StoreError::AlreadyExists { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::internal("join tokens kept changing"))
}
