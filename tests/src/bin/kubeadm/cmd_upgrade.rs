//! `kubeadm upgrade apply VERSION` and `kubeadm upgrade node`: the in-place
//! upgrade of a running cluster, as strict as real kubeadm about versions.
//!
//! `upgrade apply` (on one control plane) runs kubeadm's cluster health
//! checks (`cmd/kubeadm/app/phases/upgrade/health.go`: the API server
//! answers, every control-plane Node is Ready, this node's control-plane
//! static Pod manifests exist; each can be made a warning with
//! `--ignore-preflight-errors`), enforces kubeadm's version skew policy
//! (`cmd/kubeadm/app/phases/upgrade/policy.go`, `EnforceVersionPolicies`:
//! more than one minor up or down, or a minor above this kubeadm's, is
//! refused outright; a patch above this kubeadm's, or a target below this
//! kubeadm's minor, only with `--force`), records the new version in
//! `kube-system/kubeadm-config` and rewrites this node's control-plane
//! static Pod manifests for it (the old ones backed up under
//! `/etc/kubernetes/tmp`); the stand-in API server then answers `/version`
//! with it. `upgrade node` (on the other control planes and on workers)
//! reads the version the config names and does the same for this node's
//! manifests, if it has any. Both then write this node's
//! `/var/lib/kubelet/config.yaml` again from the cluster's `kubelet-config`
//! ConfigMap and the patches `--patches` names, the old file backed up
//! (`cmd/kubeadm/app/phases/upgrade/postupgrade.go`
//! `WriteKubeletConfigFiles`): a machine's own kubelet settings survive
//! only in its patches. Neither upgrades or restarts the kubelet: the
//! package manager (Drover's `upgrade-kubelet` hook) does that afterwards.
//!
//! Both renew this node's certificates first, unless
//! `--certificate-renewal=false`, and upgrade the local etcd member's
//! static Pod to the etcd kubeadm pairs with the target release
//! (`constants.SupportedEtcdVersion`), never down, unless
//! `--etcd-upgrade=false`, as real kubeadm does. The stand-in's etcd
//! process is the node image's; the manifest records the image.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::certs::parse_kubeconfig;
use crate::net;
use crate::node::MANIFESTS_DIR;
use crate::util::{kubeadm_version, kubeadm_version_string, parse_version, write_file, Root};

/// The flags `upgrade apply` and `upgrade node` share.
pub struct UpgradeOpts {
    pub kubeconfig: Option<PathBuf>,
    pub certificate_renewal: bool,
    pub etcd_upgrade: bool,
    pub dry_run: bool,
    /// `--ignore-preflight-errors`: health checks that only warn.
    pub ignore: crate::util::IgnoreSet,
    /// `upgrade apply --force`: version skew errors that may be skipped
    /// are.
    pub force: bool,
    /// `--patches`: the directory of patches (the stand-in applies only
    /// `kubeletconfiguration` ones).
    pub patches: Option<String>,
}

/// `kubeadm upgrade apply VERSION`.
pub async fn apply(root: &Root, version: &str, yes: bool, o: UpgradeOpts) -> Result<()> {
    let target = parse_version(version)
        .map_err(|e| anyhow!("unable to parse the version {version:?} to upgrade to: {e}"))?;
    let target_string = format!("v{}.{}.{}", target.major, target.minor, target.patch);
    let api = Api::connect(root, o.kubeconfig.as_deref(), "/etc/kubernetes/admin.conf")?;
    println!("[upgrade] Reading configuration from the cluster...");
    println!("[upgrade] FYI: You can look at this config file with 'kubectl -n kube-system get cm kubeadm-config -o yaml'");
    let (map, mut config) = api.kubeadm_config().await?;
    let current_string = config["kubernetesVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let current = parse_version(&current_string).map_err(|e| {
        anyhow!("the cluster's kubernetesVersion {current_string:?} does not parse: {e}")
    })?;
    println!("[upgrade] Running cluster health checks");
    let mut health = crate::util::Preflight::default();
    api.health(root, &mut health).await;
    health.finish(&o.ignore)?;
    println!(
        "[upgrade/version] You have chosen to change the cluster version to {target_string:?}"
    );
    println!(
        "[upgrade/versions] Cluster version: {current_string}\n[upgrade/versions] kubeadm version: {}",
        kubeadm_version_string()
    );
    let skew = version_skew(
        current,
        target,
        &target_string,
        version_is_pre_release(version),
    );
    if !skew.mandatory.is_empty() {
        bail!(
            "[upgrade/version] FATAL: the --version argument is invalid due to these fatal errors:\n\n{}\nPlease fix the misalignments highlighted above and try upgrading again",
            format_errors(&skew.mandatory)
        );
    }
    if !skew.skippable.is_empty() {
        if !o.force {
            bail!(
                "[upgrade/version] FATAL: the --version argument is invalid due to these errors:\n\n{}\nCan be bypassed if you pass the --force flag",
                format_errors(&skew.skippable)
            );
        }
        println!(
            "[upgrade/version] Found {} potential version compatibility errors but skipping since the --force flag is set: \n\n{}",
            skew.skippable.len(),
            format_errors(&skew.skippable)
        );
    }
    // Read before anything changes: a patch the stand-in refuses fails
    // the upgrade while nothing was upgraded yet.
    let patches = load_patches(root, &o)?;
    if !yes {
        println!("[upgrade] Are you sure you want to proceed? [y/N]: ");
        bail!("won't proceed; the user didn't answer (Y|y) in order to continue (the stand-in never prompts: pass -y/--yes)");
    }
    if o.dry_run {
        println!("[dryrun] Would update the ConfigMap kube-system/kubeadm-config to kubernetesVersion {target_string} and write the static Pod manifests for it");
        return Ok(());
    }
    config["kubernetesVersion"] = serde_json::Value::String(target_string.clone());
    api.put_kubeadm_config(map, &config).await?;
    println!("[upgrade/config] Uploaded the ClusterConfiguration with kubernetesVersion {target_string} to the kube-system/kubeadm-config ConfigMap");
    renew_certificates(root, &o)?;
    upgrade_etcd(root, &o, target)?;
    upgrade_static_pods(root, &target_string)?;
    upgrade_kubelet_config(root, &api, patches.as_ref()).await?;
    upgrade_addons(root, &o, &config).await?;
    println!(
        "\n[upgrade/successful] SUCCESS! Your cluster was upgraded to {target_string:?}. Enjoy!\n"
    );
    println!("[upgrade/kubelet] Now that your control plane is upgraded, please proceed with upgrading your kubelets if you haven't already done so.");
    Ok(())
}

/// `kubeadm upgrade node`.
pub async fn node(root: &Root, o: UpgradeOpts) -> Result<()> {
    // A worker has no admin.conf: kubeadm reads the config as the kubelet.
    let default = if root.path("/etc/kubernetes/admin.conf").exists() {
        "/etc/kubernetes/admin.conf"
    } else {
        "/etc/kubernetes/kubelet.conf"
    };
    let api = Api::connect(root, o.kubeconfig.as_deref(), default)?;
    println!("[upgrade] Reading configuration from the cluster...");
    let (_, config) = api.kubeadm_config().await?;
    let version = config["kubernetesVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let parsed = parse_version(&version)
        .map_err(|e| anyhow!("the cluster's kubernetesVersion {version:?} does not parse: {e}"))?;
    if parsed > kubeadm_version() {
        bail!(
            "[upgrade/version] FATAL: the cluster's version {version:?} is higher than the kubeadm version {:?}. Upgrade kubeadm first using the tool you used to install kubeadm",
            kubeadm_version_string()
        );
    }
    let control_plane = root
        .path(format!("{MANIFESTS_DIR}/kube-apiserver.yaml"))
        .exists();
    let patches = load_patches(root, &o)?;
    if o.dry_run {
        println!("[dryrun] Would upgrade this node to {version}");
        return Ok(());
    }
    if control_plane {
        println!("[upgrade] Upgrading your Static Pod-hosted control plane instance to version {version:?}...");
        renew_certificates(root, &o)?;
        upgrade_etcd(root, &o, parsed)?;
        upgrade_static_pods(root, &version)?;
        println!("[upgrade] The control plane instance for this node was successfully updated!");
    } else {
        println!("[upgrade] Skipping phase. Not a control plane node.");
    }
    upgrade_kubelet_config(root, &api, patches.as_ref()).await?;
    println!("[upgrade/kubelet-config] The kubelet configuration for this node was successfully upgraded!");
    println!("[upgrade] Now you should go ahead and upgrade the kubelet package using your package manager.");
    Ok(())
}

/// The patches `--patches` names, if any.
fn load_patches(root: &Root, o: &UpgradeOpts) -> Result<Option<crate::patches::Patches>> {
    o.patches
        .as_deref()
        .filter(|dir| !dir.is_empty())
        .map(|dir| crate::patches::load(root, dir))
        .transpose()
}

/// The kubelet-config phase (cmd/kubeadm/app/phases/upgrade/postupgrade.go
/// `WriteKubeletConfigFiles`): the current `/var/lib/kubelet/config.yaml`
/// is backed up under `/etc/kubernetes/tmp/kubeadm-kubelet-config*`, then
/// written again from the cluster's `kubelet-config` ConfigMap with
/// `patches` applied (`kubeletphase.WriteConfigToDisk`). Without the
/// patches a machine wrote its own kubelet settings in, they are gone.
async fn upgrade_kubelet_config(
    root: &Root,
    api: &Api,
    patches: Option<&crate::patches::Patches>,
) -> Result<()> {
    let fail = |e: anyhow::Error| anyhow!("[upgrade/kubelet-config] FATAL: {e:#}");
    let cm = api
        .get(crate::kubelet::CONFIG_MAP_PATH, crate::kubelet::CONFIG_MAP)
        .await
        .map_err(fail)?;
    let mut config = crate::kubelet::from_config_map(&cm).map_err(fail)?;
    if let Some(patches) = patches {
        patches
            .apply_to_kubelet_config(&mut config)
            .map_err(|e| fail(e.context("error writing kubelet configuration to file")))?;
    }
    crate::kubelet::healthz_of_config(&config).map_err(fail)?;
    let current = crate::kubelet::CONFIG_FILE;
    let text = std::fs::read(root.path(current))
        .with_context(|| format!("error backing up the kubelet config file: open {current}"))
        .map_err(fail)?;
    // A directory of its own each time, as os.MkdirTemp makes it.
    let backup = format!(
        "/etc/kubernetes/tmp/kubeadm-kubelet-config{}/config.yaml",
        rand::random::<u32>()
    );
    println!("[upgrade] Backing up kubelet config file to {backup}");
    write_file(&root.path(&backup), &text, 0o644)?;
    crate::node::write_kubelet_config(root, &config)
}

/// Upgrades kube-proxy and CoreDNS to the new version after the control
/// plane, as `kubeadm upgrade apply` does (phases/upgrade/postupgrade.go,
/// through phases/addons/proxy/proxy.go `EnsureProxyAddon` and
/// phases/addons/dns/dns.go `EnsureDNSAddon`): an addon that is disabled in
/// the ClusterConfiguration, or whose ConfigMap is missing (it was skipped
/// at init, or its removal was the user's choice), is not deployed again.
async fn upgrade_addons(root: &Root, o: &UpgradeOpts, config: &serde_json::Value) -> Result<()> {
    let logical = o
        .kubeconfig
        .clone()
        .unwrap_or_else(|| PathBuf::from("/etc/kubernetes/admin.conf"));
    let client = crate::addons::Client::from_kubeconfig(root, &logical)?;
    let addons = crate::addons::Addons::new(config.clone(), client.server());
    let mut dns = !addons.dns_disabled();
    if dns && !client.config_map_exists("coredns").await? {
        println!("[upgrade/addons] the ConfigMap \"coredns\" in the namespace \"kube-system\" was not found; assuming that a DNS server was not deployed for this cluster");
        dns = false;
    }
    let mut proxy = !addons.proxy_disabled();
    if proxy && !client.config_map_exists("kube-proxy").await? {
        println!("[upgrade/addons] the ConfigMap \"kube-proxy\" in the namespace \"kube-system\" was not found; assuming that kube-proxy was not deployed for this cluster");
        proxy = false;
    }
    crate::addons::ensure(&client, &addons, dns, proxy)
        .await
        .context("[upgrade/addons] FATAL")
}

/// The version skew errors of an upgrade from `current` to `target`, as
/// `EnforceVersionPolicies` (`cmd/kubeadm/app/phases/upgrade/policy.go`)
/// sorts them: mandatory ones no flag bypasses, skippable ones `--force`
/// does. A pre-release target turns the skew errors into skippable ones.
struct Skew {
    mandatory: Vec<String>,
    skippable: Vec<String>,
}

fn version_is_pre_release(v: &str) -> bool {
    v.split('+').next().unwrap_or_default().contains('-')
}

fn version_skew(
    current: crate::util::Version,
    target: crate::util::Version,
    target_string: &str,
    pre_release: bool,
) -> Skew {
    let mine = kubeadm_version();
    let mut skew = Skew {
        mandatory: Vec::new(),
        skippable: Vec::new(),
    };
    let fatal_unless_pre_release = |e: String, skew: &mut Skew| {
        if pre_release {
            skew.skippable.push(e)
        } else {
            skew.mandatory.push(e)
        }
    };
    if target.minor > current.minor + 1 || target.major != current.major {
        fatal_unless_pre_release(
            format!("Specified version to upgrade to {target_string:?} is too high; kubeadm can upgrade only 1 minor version at a time"),
            &mut skew,
        );
    }
    if target.minor + 1 < current.minor {
        fatal_unless_pre_release(
            format!("Specified version to downgrade to {target_string:?} is too low; kubeadm can downgrade only 1 minor version at a time"),
            &mut skew,
        );
    }
    if mine < target {
        if target.minor > mine.minor {
            fatal_unless_pre_release(
                format!(
                    "Specified version to upgrade to {target_string:?} is at least one minor release higher than the kubeadm minor release ({} > {}). Such an upgrade is not supported",
                    target.minor, mine.minor
                ),
                &mut skew,
            );
        } else {
            skew.skippable.push(format!(
                "Specified version to upgrade to {target_string:?} is higher than the kubeadm version {:?}. Upgrade kubeadm first using the tool you used to install kubeadm",
                kubeadm_version_string()
            ));
        }
    }
    if mine.major > target.major || mine.minor > target.minor {
        skew.skippable.push(format!(
            "Kubeadm version {} can only be used to upgrade to Kubernetes version {}.{}",
            kubeadm_version_string(),
            mine.major,
            mine.minor
        ));
    }
    if pre_release {
        skew.skippable.push(format!(
            "Specified version to upgrade to {target_string:?} is an unstable version and such upgrades weren't allowed via setting the --allow-*-upgrades flags"
        ));
    }
    skew
}

/// Errors as kubeadm lists them (`kubeadmutil.FormatErrMsg`).
fn format_errors(errors: &[String]) -> String {
    errors.iter().map(|e| format!("\t- {e}\n")).collect()
}

/// The etcd release kubeadm pairs with Kubernetes `minor`
/// (`cmd/kubeadm/app/constants/constants.go`, `SupportedEtcdVersion`, as
/// of the kubeadm release of each minor); an unlisted minor takes the
/// nearest listed one, as `EtcdSupportedVersion` does.
fn etcd_version_for(minor: u64) -> &'static str {
    const SUPPORTED: &[(u64, &str)] = &[
        (30, "3.5.15-0"),
        (31, "3.5.15-0"),
        (32, "3.5.16-0"),
        (33, "3.5.21-0"),
    ];
    SUPPORTED
        .iter()
        .min_by_key(|(m, _)| m.abs_diff(minor))
        .map(|(_, v)| *v)
        .unwrap_or(crate::node::ETCD_IMAGE_TAG)
}

/// An etcd image tag (`3.5.15-0`) as numbers, for comparing.
fn etcd_tag_order(tag: &str) -> Vec<u64> {
    tag.split(['.', '-'])
        .map(|p| p.parse().unwrap_or(0))
        .collect()
}

/// Upgrades this node's local etcd member (its static Pod) to the etcd of
/// `target`, as kubeadm's `upgrade/etcd` does: never to an older etcd, not
/// at all with `--etcd-upgrade=false` or without a local member.
fn upgrade_etcd(root: &Root, o: &UpgradeOpts, target: crate::util::Version) -> Result<()> {
    let logical = format!("{MANIFESTS_DIR}/etcd.yaml");
    if !o.etcd_upgrade {
        println!("[upgrade/etcd] Skipping the upgrade of etcd (--etcd-upgrade=false)");
        return Ok(());
    }
    let Ok(text) = std::fs::read_to_string(root.path(&logical)) else {
        return Ok(());
    };
    let current = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("image:"))
        .and_then(|i| i.trim().rsplit_once(':'))
        .map(|(_, tag)| tag.to_owned())
        .ok_or_else(|| anyhow!("{logical} names no etcd image"))?;
    let wanted = etcd_version_for(target.minor);
    if etcd_tag_order(wanted) <= etcd_tag_order(&current) {
        println!(
            "[upgrade/etcd] etcd {current} is not older than {wanted}, the etcd of v{}.{}: not upgrading it",
            target.major, target.minor
        );
        return Ok(());
    }
    let stamp = time::OffsetDateTime::now_utc().unix_timestamp();
    let backup = format!("/etc/kubernetes/tmp/kubeadm-backup-etcd-{stamp}/etcd.yaml");
    write_file(&root.path(&backup), text.as_bytes(), 0o600)?;
    let upgraded = retag(&text, wanted).ok_or_else(|| anyhow!("{logical} names no image"))?;
    write_file(&root.path(&logical), upgraded.as_bytes(), 0o600)?;
    println!("[upgrade/staticpods] Moving new manifest to {logical:?} and backing up old manifest to {backup:?}");
    println!("[upgrade/staticpods] Component \"etcd\" upgraded successfully!");
    Ok(())
}

/// Renews this control plane's certificates, unless told not to.
fn renew_certificates(root: &Root, o: &UpgradeOpts) -> Result<()> {
    if !o.certificate_renewal {
        println!("[upgrade/staticpods] Skipping the renewal of certificates (--certificate-renewal=false)");
        return Ok(());
    }
    println!("[upgrade/staticpods] Renewing the certificates of this control plane");
    let settings = crate::cmd_certs::RenewSettings::load(root, None)?;
    crate::cmd_certs::renew_all(root, &settings)
}

/// The control-plane static Pods an upgrade rewrites (etcd stays the
/// node image's).
const CONTROL_PLANE_PODS: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// Rewrites this node's control-plane static Pod manifests for `version`,
/// the old ones backed up first. The images are the only thing that
/// changes.
fn upgrade_static_pods(root: &Root, version: &str) -> Result<()> {
    let stamp = time::OffsetDateTime::now_utc().unix_timestamp();
    let backup = format!("/etc/kubernetes/tmp/kubeadm-backup-manifests-{stamp}");
    for pod in CONTROL_PLANE_PODS {
        let logical = format!("{MANIFESTS_DIR}/{pod}.yaml");
        let path = root.path(&logical);
        let text = std::fs::read_to_string(&path).with_context(|| format!("read {logical}"))?;
        write_file(
            &root.path(format!("{backup}/{pod}.yaml")),
            text.as_bytes(),
            0o600,
        )?;
        let upgraded =
            retag(&text, version).ok_or_else(|| anyhow!("{logical} names no image to upgrade"))?;
        write_file(&path, upgraded.as_bytes(), 0o600)?;
        println!("[upgrade/staticpods] Moving new manifest to {logical:?} and backing up old manifest to \"{backup}/{pod}.yaml\"");
        println!("[upgrade/staticpods] Component {pod:?} upgraded successfully!");
    }
    Ok(())
}

/// `manifest` with the tag of its `image:` lines set to `version`; `None`
/// when it has none.
fn retag(manifest: &str, version: &str) -> Option<String> {
    let mut found = false;
    let lines: Vec<String> = manifest
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            match trimmed
                .strip_prefix("image:")
                .and_then(|i| i.trim().rsplit_once(':'))
            {
                Some((repo, _)) => {
                    found = true;
                    let indent = &line[..line.len() - trimmed.len()];
                    format!("{indent}image: {repo}:{version}")
                }
                None => line.to_owned(),
            }
        })
        .collect();
    found.then(|| lines.join("\n") + "\n")
}

/// The cluster's API, through the server and credentials of a kubeconfig.
struct Api {
    client: reqwest::Client,
    server: String,
}

const KUBEADM_CONFIG: &str = "/api/v1/namespaces/kube-system/configmaps/kubeadm-config";

impl Api {
    fn connect(root: &Root, kubeconfig: Option<&Path>, default: &str) -> Result<Self> {
        let logical = kubeconfig.map_or_else(|| PathBuf::from(default), Path::to_owned);
        let host = root.path(&logical);
        let text = std::fs::read_to_string(&host).map_err(|e| {
            anyhow!(
                "couldn't create a Kubernetes client from file {:?}: open {}: {e}",
                logical.display(),
                logical.display()
            )
        })?;
        let kc = parse_kubeconfig(&text, host.parent())
            .with_context(|| format!("failed to load kubeconfig {}", logical.display()))?;
        let ca = kc.ca_pem.clone().ok_or_else(|| {
            anyhow!(
                "the kubeconfig {} holds no certificate authority",
                logical.display()
            )
        })?;
        Ok(Self {
            client: kc.http_client(&ca, Duration::from_secs(10))?,
            server: kc.server_url().to_owned(),
        })
    }

    /// The ConfigMap `kube-system/kubeadm-config` and its
    /// ClusterConfiguration.
    async fn kubeadm_config(&self) -> Result<(serde_json::Value, serde_json::Value)> {
        let fail = |e: String| anyhow!("unable to fetch the kubeadm-config ConfigMap: {e}");
        let map = self.get(KUBEADM_CONFIG, "kubeadm-config").await?;
        let yaml = map["data"]["ClusterConfiguration"]
            .as_str()
            .ok_or_else(|| fail("it holds no data.ClusterConfiguration".into()))?;
        let config: serde_json::Value = serde_saphyr::from_str(yaml)
            .map_err(|e| fail(format!("failed to decode cluster configuration data: {e}")))?;
        Ok((map, config))
    }

    /// The ConfigMap at `path` (`what` names it in errors); not finding
    /// it is an error.
    async fn get(&self, path: &str, what: &str) -> Result<serde_json::Value> {
        let fail = |e: String| anyhow!("unable to fetch the {what} ConfigMap: {e}");
        let resp = self
            .client
            .get(format!("{}{path}", self.server))
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| fail(e.to_string()))?;
        if !status.is_success() {
            return Err(fail(format!("{status}: {}", net::status_message(&body))));
        }
        serde_json::from_str(&body).map_err(|e| fail(e.to_string()))
    }

    /// Writes `config` back into `map` (with the `resourceVersion` read).
    async fn put_kubeadm_config(
        &self,
        mut map: serde_json::Value,
        config: &serde_json::Value,
    ) -> Result<()> {
        map["data"]["ClusterConfiguration"] = serde_json::Value::String(
            serde_saphyr::to_string(config).context("encode the ClusterConfiguration")?,
        );
        let resp = self
            .client
            .put(format!("{}{KUBEADM_CONFIG}", self.server))
            .json(&map)
            .send()
            .await
            .context("error uploading the kubeadm ClusterConfiguration")?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            bail!(
                "error uploading the kubeadm ClusterConfiguration: {status}: {}",
                net::status_message(&body)
            );
        }
        Ok(())
    }

    /// kubeadm's upgrade health checks (`CheckClusterHealth` in
    /// `cmd/kubeadm/app/phases/upgrade/health.go`), each failure recorded
    /// under its check's name: `CreateJob` (kubeadm runs a Job; the
    /// stand-in, which runs no Pods, asks the API server's `/healthz`
    /// through the same credentials), `ControlPlaneNodesReady` and
    /// `StaticPodManifest` (this node's control-plane manifests exist).
    async fn health(&self, root: &Root, checks: &mut crate::util::Preflight) {
        let healthz = self
            .client
            .get(format!("{}/healthz", self.server))
            .send()
            .await;
        match healthz {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => checks.error(
                "CreateJob",
                format!(
                    "the API server is not healthy: /healthz answered {}",
                    r.status()
                ),
            ),
            Err(e) => checks.error("CreateJob", format!("the API server is not healthy: {e}")),
        }
        if let Err(e) = self.control_planes_ready().await {
            checks.error("ControlPlaneNodesReady", format!("{e:#}"));
        }
        let missing: Vec<String> = CONTROL_PLANE_PODS
            .iter()
            .map(|pod| format!("{MANIFESTS_DIR}/{pod}.yaml"))
            .filter(|m| !root.path(m).exists())
            .collect();
        if !missing.is_empty() {
            checks.error(
                "StaticPodManifest",
                format!(
                    "The control plane seems to be Static Pod-hosted, but some of the manifests don't seem to exist on disk. This probably means you're running 'kubeadm upgrade' on a remote machine, which is not supported for a Static Pod-hosted cluster. Manifest files not found: [{}]",
                    missing.join(" ")
                ),
            );
        }
    }

    /// Fails, as kubeadm's `ControlPlaneNodesReady` check does, when a
    /// control-plane Node is not Ready.
    async fn control_planes_ready(&self) -> Result<()> {
        let resp = self
            .client
            .get(format!(
                "{}/api/v1/nodes?labelSelector=node-role.kubernetes.io%2Fcontrol-plane",
                self.server
            ))
            .send()
            .await
            .context("[preflight] could not list the control-plane Nodes")?;
        let list: serde_json::Value = resp
            .json()
            .await
            .context("[preflight] could not list the control-plane Nodes")?;
        let not_ready: Vec<String> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| {
                n["metadata"]["labels"]
                    .get("node-role.kubernetes.io/control-plane")
                    .is_some()
            })
            .filter(|n| {
                !n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        if !not_ready.is_empty() {
            bail!(
                "there are NotReady control-planes in the cluster: [{}]",
                not_ready.join(" ")
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn retag_changes_only_image_tags() {
        let m = "spec:\n  containers:\n  - command:\n    - kube-apiserver\n    image: registry.k8s.io/kube-apiserver:v1.31.2\n    name: kube-apiserver\n";
        let out = super::retag(m, "v1.32.0").unwrap();
        assert_eq!(out, m.replace("v1.31.2", "v1.32.0"));
        assert_eq!(super::retag("kind: Pod\n", "v1.32.0"), None);
    }
}
