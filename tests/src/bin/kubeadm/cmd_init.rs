//! `kubeadm init --config PATH`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use drover_common::kubeadm::{BootstrapTokenSpec, NodeRegistration};
use drover_common::pin::CaPin;
use drover_common::token::BootstrapToken;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::certs::check_shared_ca_set;
use crate::node::{self, ClusterSettings, ControlPlaneNode, KubeconfigSpec, MANIFESTS_DIR};
use crate::store::{self, StoredToken};
use crate::util::{
    join_host_port, parse_go_duration_std, IgnoreSet, InPhase, Preflight, Root, SkipPhases,
    INIT_PHASES,
};

/// What `kubeadm init` and `kubeadm join` take from the flags they share.
pub struct NodeOpts {
    pub config: PathBuf,
    pub ignore_preflight_errors: Vec<String>,
    pub skip_phases: Vec<String>,
    pub dry_run: bool,
    pub node_name: Option<String>,
}

impl NodeOpts {
    /// Whether to change nothing: `--dry-run` or the config's `dryRun`.
    pub fn dry_run(&self, configured: Option<bool>) -> bool {
        self.dry_run || configured == Some(true)
    }

    /// The node's name: `--node-name`, else `registration.name`, else the
    /// host name; checked as kubeadm does.
    pub fn node_name(&self, registration: &NodeRegistration) -> Result<String> {
        let name = self
            .node_name
            .clone()
            .or_else(|| registration.name.clone())
            .unwrap_or_else(crate::util::hostname);
        check_node_name(&name)?;
        Ok(name)
    }

    /// The phases of `phases` to skip (the flag's and the config's
    /// `skip_phases`) and the preflight errors to ignore (the flag's and
    /// `registration`'s).
    pub fn skip_and_ignore(
        &self,
        phases: &[&str],
        skip_phases: &[String],
        registration: &NodeRegistration,
    ) -> Result<(SkipPhases, IgnoreSet)> {
        let skip = SkipPhases::new(phases, &[&self.skip_phases, skip_phases])?;
        let ignore = IgnoreSet::new(&[
            &self.ignore_preflight_errors,
            &registration.ignore_preflight_errors,
        ])?;
        Ok((skip, ignore))
    }
}

pub struct InitOpts {
    pub node: NodeOpts,
    pub skip_token_print: bool,
}

pub const DEFAULT_TOKEN_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";
const STANDIN_DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// Reads the config file (resolved under the root, as after kubeadm's chroot).
pub fn read_config(root: &Root, path: &std::path::Path) -> Result<String> {
    let host = root.path(path);
    std::fs::read_to_string(&host).map_err(|e| {
        anyhow!(
            "unable to read config from {:?} (resolved under --rootfs to {:?}): {e}",
            path.display().to_string(),
            host.display().to_string()
        )
    })
}

/// Validates a node name as kubeadm does (a DNS-1123 subdomain).
pub fn check_node_name(name: &str) -> Result<()> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        bail!("nodeRegistration.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character");
    }
    Ok(())
}

/// Checks the validity of `groups` the way kubeadm does.
pub fn check_token_groups(groups: &[String], what: &str) -> Result<()> {
    for g in groups {
        let rest = g.strip_prefix("system:bootstrappers:").unwrap_or("");
        let ok = !rest.is_empty()
            && rest.len() <= 256
            && rest
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
            && rest
                .bytes()
                .last()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !ok {
            bail!("{what}: Invalid value: {g:?}: bootstrap group {g:?} is invalid (must match \\Asystem:bootstrappers:[a-z0-9:-]{{0,255}}[a-z0-9]\\z)");
        }
    }
    Ok(())
}

pub fn check_token_usages(usages: &[String], what: &str) -> Result<()> {
    for u in usages {
        if u != "signing" && u != "authentication" {
            bail!("{what}: Invalid value: {u:?}: invalid bootstrap token usage string: {u}, valid usage options: authentication,signing");
        }
    }
    Ok(())
}

fn token_from_spec(spec: &BootstrapTokenSpec, i: usize) -> Result<StoredToken> {
    let what = format!("bootstrapTokens[{i}]");
    let usages = if spec.usages.is_empty() {
        vec!["signing".to_owned(), "authentication".to_owned()]
    } else {
        spec.usages.clone()
    };
    check_token_usages(&usages, &format!("{what}.usages"))?;
    let groups = if spec.groups.is_empty() {
        vec![DEFAULT_TOKEN_GROUP.to_owned()]
    } else {
        spec.groups.clone()
    };
    check_token_groups(&groups, &format!("{what}.groups"))?;
    let t = match &spec.expires {
        Some(e) => {
            let at = OffsetDateTime::parse(e, &Rfc3339)
                .map_err(|err| anyhow!("{what}.expires: {e:?} is not an RFC 3339 time: {err}"))?;
            let mut t =
                StoredToken::new(&spec.token, None, usages, groups, spec.description.clone());
            t.expires = Some(at.format(&Rfc3339).expect("formats"));
            t
        }
        None => {
            let ttl = match &spec.ttl {
                Some(ttl) => parse_go_duration_std(ttl).with_context(|| format!("{what}.ttl"))?,
                None => Duration::from_secs(24 * 3600),
            };
            StoredToken::new(
                &spec.token,
                Some(ttl),
                usages,
                groups,
                spec.description.clone(),
            )
        }
    };
    Ok(t)
}

fn timeout_from(t: Option<&String>, what: &str) -> Result<Duration> {
    match t {
        Some(s) => parse_go_duration_std(s).with_context(|| format!("timeouts.{what}")),
        None => Ok(STANDIN_DEFAULT_WAIT),
    }
}

/// Uploads the cluster's kubelet configuration (without any machine's
/// patches) as the ConfigMap `kube-system/kubelet-config`, as the admin,
/// created or replaced (cmd/kubeadm/app/phases/kubelet/config.go
/// `CreateConfigMap`: `apiclient.CreateOrUpdate`); joining machines read it
/// with their bootstrap token.
async fn upload_kubelet_config(root: &Root, config: &serde_json::Value) -> Result<()> {
    let client = crate::addons::Client::from_kubeconfig(
        root,
        std::path::Path::new("/etc/kubernetes/admin.conf"),
    )?;
    let cm = crate::kubelet::config_map(config)?;
    client
        .ensure(&cm, crate::addons::Write::CreateOrUpdate)
        .await?;
    Ok(())
}

pub async fn run(root: &Root, o: InitOpts) -> Result<()> {
    let text = read_config(root, &o.node.config)?;
    let cfg = crate::kconfig::parse(&text)?;
    if cfg.join.is_some() {
        bail!("the config holds a JoinConfiguration: `kubeadm init` reads InitConfiguration and ClusterConfiguration (use `kubeadm join` for a JoinConfiguration)");
    }
    let init = cfg.init.ok_or_else(|| {
        anyhow!("the config holds no InitConfiguration (apiVersion kubeadm.k8s.io/v1beta4)")
    })?;
    let cc = cfg.cluster.ok_or_else(|| {
        anyhow!("the config holds no ClusterConfiguration (apiVersion kubeadm.k8s.io/v1beta4)")
    })?;
    let cs = ClusterSettings::from_config(&cc)?;
    if init.certificate_key.is_some() {
        bail!("InitConfiguration.certificateKey is set: it only serves `--upload-certs`, which Drover never uses (it copies the shared CA set to control-plane machines)");
    }
    let dry_run = o.node.dry_run(init.dry_run);
    let node_name = o.node.node_name(&init.node_registration)?;
    let (advertise, bind_port) =
        node::local_endpoint(&init.local_api_endpoint, "localAPIEndpoint")?;
    let (skip, ignore) =
        o.node
            .skip_and_ignore(INIT_PHASES, &init.skip_phases, &init.node_registration)?;
    let timeouts = init.timeouts.clone().unwrap_or_default();
    let kubelet_wait = timeout_from(timeouts.kubelet_health_check.as_ref(), "kubeletHealthCheck")?;
    let api_wait = timeout_from(
        timeouts.control_plane_component_health_check.as_ref(),
        "controlPlaneComponentHealthCheck",
    )?;
    let mut tokens = init
        .bootstrap_tokens
        .iter()
        .enumerate()
        .map(|(i, spec)| token_from_spec(spec, i))
        .collect::<Result<Vec<_>>>()?;
    if tokens.is_empty() {
        // kubeadm's default: one random token valid for 24 h.
        tokens.push(StoredToken::new(
            &BootstrapToken::generate(),
            Some(Duration::from_secs(24 * 3600)),
            vec!["signing".into(), "authentication".into()],
            vec![DEFAULT_TOKEN_GROUP.into()],
            None,
        ));
    }
    // The cluster's kubelet configuration: the config's
    // KubeletConfiguration with kubeadm's defaults. It is uploaded as it
    // is; this machine's kubelet gets it with the patches applied, and
    // kubeadm waits on the patched healthz address.
    let kubelet_config = node::node_kubelet_config(node::raw_kubelet_doc(&text), &cs)?;
    let patches =
        crate::patches::from_config(root, init.patches.as_ref(), "InitConfiguration.patches")?;
    let kubelet = node::KubeletStart::new(kubelet_config.clone(), patches.as_ref(), kubelet_wait)?;
    let (kubelet_host, kubelet_port) = kubelet.listen_address(&init.node_registration)?;

    println!("[init] Using Kubernetes version: {}", cs.kubernetes_version);
    if !skip.skipped("preflight") {
        println!("[preflight] Running pre-flight checks");
        let mut pf = Preflight::default();
        node::control_plane_files_available(&mut pf, root);
        pf.file_available(root, "/etc/kubernetes/kubelet.conf");
        pf.port(&advertise.to_string(), bind_port);
        pf.port(&kubelet_host, kubelet_port);
        pf.dir_available(root, &cs.etcd_data_dir);
        pf.finish(&ignore)?;
        println!("[preflight] Pulling images required for setting up a Kubernetes cluster");
        println!("[preflight] This might take a minute or two, depending on the speed of your internet connection");
    }

    let set = check_shared_ca_set(root, &cs.cert_dir, cs.alg).in_phase("certs/ca")?;
    let pin = CaPin::from_cert_der(&set.ca.cert_der).map_err(|e| anyhow!("{e}"))?;
    let server = cs.server_url(&advertise.to_string(), bind_port);
    let cp_node = ControlPlaneNode::new(&node_name, advertise, bind_port, false);
    let local_server = cp_node.local_server();

    if dry_run {
        println!(
            "[dryrun] The shared CA set in {:?} is complete and valid",
            cs.cert_dir
        );
        println!("[dryrun] Would write the leaf certificates, kubeconfigs, static Pod manifests and kubelet files under {}", root.dir().display());
        println!(
            "[dryrun] Would start the stand-in kubelet and API server on {}",
            join_host_port(&advertise.to_string(), bind_port)
        );
        println!(
            "[dryrun] Would register {} bootstrap token(s)",
            tokens.len()
        );
        println!("[dryrun] Finished dry-running successfully. Above are the resources that would be created");
        return Ok(());
    }

    if !skip.skipped("certs") {
        node::write_leaf_certs(root, &cs, &set, &cp_node, &skip, "certs").in_phase("certs")?;
    }
    if !skip.skipped("kubeconfig") {
        let specs: Vec<KubeconfigSpec> = [
            (
                "admin.conf",
                "admin",
                "kubernetes-admin".to_owned(),
                vec!["kubeadm:cluster-admins"],
                &server,
            ),
            (
                "super-admin.conf",
                "super-admin",
                "kubernetes-super-admin".to_owned(),
                vec!["system:masters"],
                &server,
            ),
            (
                "kubelet.conf",
                "kubelet",
                format!("system:node:{node_name}"),
                vec!["system:nodes"],
                &server,
            ),
            (
                "controller-manager.conf",
                "controller-manager",
                "system:kube-controller-manager".to_owned(),
                vec![],
                &local_server,
            ),
            (
                "scheduler.conf",
                "scheduler",
                "system:kube-scheduler".to_owned(),
                vec![],
                &local_server,
            ),
        ]
        .into_iter()
        .filter(|(_, phase, ..)| !skip.skipped(&format!("kubeconfig/{phase}")))
        .map(|(file, _, user, orgs, server)| KubeconfigSpec {
            file,
            user,
            orgs: orgs.into_iter().map(str::to_owned).collect(),
            server: server.clone(),
        })
        .collect();
        node::write_kubeconfigs(root, &cs, &set, &specs).in_phase("kubeconfig")?;
    }
    if !skip.skipped("etcd/local") {
        node::write_etcd_manifest(root, &cs, &cp_node, None).in_phase("etcd/local")?;
    }
    if !skip.skipped("control-plane") {
        node::write_control_plane_manifests(root, &cs, &cp_node, &skip, "control-plane")
            .in_phase("control-plane")?;
    }
    if !skip.skipped("kubelet-start") {
        kubelet
            .run(root, &node_name, &init.node_registration)
            .await?;
    }
    println!("[wait-control-plane] Waiting for the kubelet to boot up the control plane as static Pods from directory {MANIFESTS_DIR:?}");
    node::start_etcd(root, &cs.cert_dir, advertise, api_wait)
        .await
        .in_phase("wait-control-plane")?;
    let etcd_url = node::etcd_client_url(advertise);
    node::start_apiserver(root, &cp_node, &cs, &etcd_url, &set.ca.cert_pem, api_wait)
        .await
        .in_phase("wait-control-plane")?;
    let etcd = store::Store::connect(&store::EtcdAccess::apiserver(
        root,
        &cs.cert_dir,
        &etcd_url,
    )?)
    .await
    .in_phase("wait-control-plane")?;
    if !skip.skipped("upload-config/kubeadm") {
        println!("[upload-config] Storing the configuration used in ConfigMap \"kubeadm-config\" in the \"kube-system\" Namespace");
        let yaml = serde_saphyr::to_string(&cc).map_err(|e| anyhow!("{e}"));
        let yaml = yaml.in_phase("upload-config/kubeadm")?;
        etcd.save_cluster_config(&yaml)
            .await
            .in_phase("upload-config/kubeadm")?;
        store::save_local_cluster_config(root, &yaml).in_phase("upload-config/kubeadm")?;
    }
    if !skip.skipped("upload-config/kubelet") {
        println!("[kubelet] Creating a ConfigMap \"kubelet-config\" in namespace kube-system with the configuration for the kubelets in the cluster");
        upload_kubelet_config(root, &kubelet_config)
            .await
            .in_phase("upload-config/kubelet")?;
    }
    println!("[upload-certs] Skipping phase. Please see --upload-certs");
    if !skip.skipped("mark-control-plane") {
        println!("[mark-control-plane] Marking the node {node_name} as control-plane by adding the labels: [node-role.kubernetes.io/control-plane node.kubernetes.io/exclude-from-external-load-balancers]");
        println!("[mark-control-plane] Marking the node {node_name} as control-plane by adding the taints [node-role.kubernetes.io/control-plane:NoSchedule]");
    }
    if !skip.skipped("bootstrap-token") {
        for t in &tokens {
            println!("[bootstrap-token] Using token: {}.{}", t.id, t.secret);
        }
        println!(
            "[bootstrap-token] Configuring bootstrap tokens, cluster-info ConfigMap, RBAC Roles"
        );
        for t in &tokens {
            etcd.add_token(t.clone(), true)
                .await
                .in_phase("bootstrap-token")?;
        }
        println!("[bootstrap-token] Creating the \"cluster-info\" ConfigMap in the \"kube-public\" namespace");
    } else {
        tokens.clear();
    }
    if !skip.skipped("kubelet-finalize") {
        println!("[kubelet-finalize] Updating \"/etc/kubernetes/kubelet.conf\" to point to a rotatable kubelet client certificate and key");
    }
    let disabled = |addon: &Option<serde_json::Value>| {
        addon
            .as_ref()
            .and_then(|d| d.get("disabled"))
            .and_then(|d| d.as_bool())
            == Some(true)
    };
    let dns_disabled = disabled(&cc.dns);
    let proxy_disabled = disabled(&cc.proxy);
    let dns = !skip.skipped("addon/coredns") && !dns_disabled;
    let proxy = !skip.skipped("addon/kube-proxy") && !proxy_disabled;
    if dns || proxy {
        // The addon phases create kube-proxy's and CoreDNS's objects through
        // the API server, as the cluster admin (phases/addons/proxy/proxy.go,
        // phases/addons/dns/dns.go).
        let config = serde_json::to_value(&cc).map_err(|e| anyhow!("{e}"));
        let addons = crate::addons::Addons::new(config.in_phase("addon")?, &server);
        let client = crate::addons::Client::from_kubeconfig(
            root,
            std::path::Path::new("/etc/kubernetes/admin.conf"),
        )
        .in_phase("addon")?;
        crate::addons::ensure(&client, &addons, dns, proxy)
            .await
            .in_phase("addon")?;
    }
    println!("\nYour Kubernetes control-plane has initialized successfully!\n");
    println!("To start using your cluster, you need to run the following as a regular user:\n");
    println!("  mkdir -p $HOME/.kube\n  sudo cp -i /etc/kubernetes/admin.conf $HOME/.kube/config\n  sudo chown $(id -u):$(id -g) $HOME/.kube/config\n");
    if !skip.skipped("show-join-command") && !o.skip_token_print {
        if let Some(t) = tokens.first() {
            let endpoint = server.trim_start_matches("https://");
            println!("Then you can join any number of worker nodes by running the following on each as root:\n");
            println!(
                "kubeadm join {endpoint} --token {}.{} \\\n\t--discovery-token-ca-cert-hash {pin}",
                t.id, t.secret
            );
        }
    }
    Ok(())
}
