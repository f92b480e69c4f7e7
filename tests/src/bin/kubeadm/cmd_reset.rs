//! `kubeadm reset -f`: stop the stand-in daemons and remove what init/join
//! wrote.

use std::path::Path;

use anyhow::Result;

use crate::daemon;
use crate::store::STORE_DIR;
use crate::util::{phase_err, Root};

pub struct ResetOpts {
    pub force: bool,
    pub cert_dir: Option<String>,
    pub cleanup_tmp_dir: bool,
    pub dry_run: bool,
    /// Whether the remove-etcd-member phase runs.
    pub remove_etcd_member: bool,
    /// `--cri-socket`.
    pub cri_socket: Option<String>,
}

/// The CRI endpoints kubeadm looks for when it must detect one
/// (`cmd/kubeadm/app/util/runtime/runtime_unix.go`,
/// `defaultKnownCRISockets`).
const KNOWN_CRI_SOCKETS: [&str; 3] = [
    "/var/run/containerd/containerd.sock",
    "/var/run/crio/crio.sock",
    "/var/run/cri-dockerd.sock",
];

/// The CRI socket reset uses, as kubeadm picks it
/// (`cmd/kubeadm/app/cmd/reset.go`, `resetDetectCRISocket`): the flag; else
/// the node's `criSocket` from the cluster's configuration when it can be
/// read; else detection (`cmd/kubeadm/app/util/runtime/runtime.go`,
/// `detectCRISocketImpl`), which takes the one known socket present, the
/// default when none is, and fails when several are. After an interrupted
/// join there is no cluster configuration to read, so a host with two
/// runtimes needs the flag.
fn cri_socket(root: &Root, flag: Option<&str>) -> Result<String> {
    if let Some(s) = flag {
        return Ok(s.to_owned());
    }
    if let Some(yaml) = crate::store::load_local_cluster_config(root) {
        if let Ok(doc) = serde_saphyr::from_str::<serde_json::Value>(&yaml) {
            if let Some(s) = doc
                .pointer("/nodeRegistration/criSocket")
                .and_then(|s| s.as_str())
            {
                return Ok(s.to_owned());
            }
        }
    }
    use std::os::unix::fs::FileTypeExt;
    let found: Vec<String> = KNOWN_CRI_SOCKETS
        .iter()
        .filter(|s| std::fs::metadata(root.path(s)).is_ok_and(|m| m.file_type().is_socket()))
        .map(|s| format!("unix://{s}"))
        .collect();
    match found.as_slice() {
        [] => Ok(drover_common::kubeadm::CRI_SOCKET.to_owned()),
        [one] => Ok(one.clone()),
        many => Err(phase_err(
            "preflight",
            format!(
                "found multiple CRI endpoints on the host. Please define which one do you wish to use by setting the 'criSocket' field in the kubeadm configuration file: {}",
                many.join(", ")
            ),
        )),
    }
}

fn clean_dir_contents(root: &Root, logical: &str, dry_run: bool) -> Result<()> {
    let host = root.path(logical);
    let Ok(rd) = std::fs::read_dir(&host) else {
        return Ok(());
    };
    for entry in rd.flatten() {
        remove_path(&entry.path(), dry_run)?;
    }
    Ok(())
}

fn remove_path(p: &Path, dry_run: bool) -> Result<()> {
    if dry_run {
        return Ok(());
    }
    let meta = match std::fs::symlink_metadata(p) {
        Ok(m) => m,
        Err(_) => return Ok(()),
    };
    let r = if meta.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(anyhow::anyhow!("failed to delete {}: {e}", p.display())),
    }
}

pub async fn run(root: &Root, o: ResetOpts) -> Result<()> {
    println!("[reset] WARNING: Changes made to this host by 'kubeadm init' or 'kubeadm join' will be reverted.");
    if !o.force {
        println!("[reset] Are you sure you want to proceed? [y/N]: ");
        return Err(phase_err(
            "preflight",
            "won't proceed; the user didn't answer (Y|n) in order to continue (the stand-in never prompts: pass -f/--force)",
        ));
    }
    println!("[preflight] Running pre-flight checks");
    let cri = cri_socket(root, o.cri_socket.as_deref())?;
    println!("[reset] Using the CRI socket {cri}");
    // Like kubeadm, take certificatesDir from the cluster's kubeadm-config
    // (here the stand-in API server's copy) unless --cert-dir says otherwise.
    let cert_dir = o
        .cert_dir
        .clone()
        .or_else(|| {
            let yaml = crate::store::load_local_cluster_config(root)?;
            let doc: serde_json::Value = serde_saphyr::from_str(&yaml).ok()?;
            doc.get("certificatesDir")
                .and_then(|d| d.as_str())
                .filter(|d| d.starts_with('/'))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| drover_common::kubeadm::CERTIFICATES_DIR.to_owned());
    if o.dry_run {
        println!(
            "[dryrun] Would stop the stand-in daemons and delete the files kubeadm wrote under {}",
            root.dir().display()
        );
        return Ok(());
    }
    if o.remove_etcd_member {
        remove_etcd_member(root, &cert_dir).await;
    }
    println!("[reset] Deleted contents of the etcd data directory: /var/lib/etcd");
    println!("[reset] Stopping the kubelet service");
    for line in daemon::stop_all(root) {
        println!("[reset] {line}");
    }
    println!("[reset] Unmounting mounted directories in \"/var/lib/kubelet\"");
    let dirs = [
        "/etc/kubernetes/manifests".to_owned(),
        "/var/lib/kubelet".to_owned(),
        cert_dir.clone(),
        "/var/lib/etcd".to_owned(),
    ];
    println!(
        "[reset] Deleting contents of directories: [{}]",
        dirs.join(" ")
    );
    for d in &dirs {
        clean_dir_contents(root, d, false)?;
    }
    remove_path(&root.path(STORE_DIR), false)?;
    if o.cleanup_tmp_dir {
        clean_dir_contents(root, "/etc/kubernetes/tmp", false)?;
    }
    let mut deleted = Vec::new();
    if let Ok(rd) = std::fs::read_dir(root.path("/etc/kubernetes")) {
        let mut confs: Vec<_> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "conf"))
            .collect();
        confs.sort();
        for p in confs {
            if let Some(name) = p.file_name() {
                deleted.push(format!("/etc/kubernetes/{}", name.to_string_lossy()));
            }
            remove_path(&p, false)?;
        }
    }
    println!("[reset] Deleting files: [{}]", deleted.join(" "));
    println!();
    println!("The reset process does not clean CNI configuration. To do so, you must remove /etc/cni/net.d\n");
    println!("The reset process does not reset or clean up iptables rules or IPVS tables.\nIf you wish to reset iptables, you must do so manually by using the \"iptables\" command.\n");
    println!("The reset process does not clean your kubeconfig files and you must remove them manually.\nPlease, check the contents of the $HOME/.kube/config file.");
    Ok(())
}

/// The remove-etcd-member phase: a control plane with a stacked etcd
/// removes its own member through the cluster, as kubeadm does, unless it
/// is the last one. Failures are warnings: a machine whose cluster is gone
/// still resets.
async fn remove_etcd_member(root: &Root, cert_dir: &str) {
    let Ok(args) = crate::etcd::args_from_manifest(root) else {
        return; // Not a control plane with a local etcd.
    };
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .map(str::to_owned)
    };
    let (Some(name), Some(urls)) = (flag("name"), flag("advertise-client-urls")) else {
        return;
    };
    let result = async {
        let endpoint = urls.split(',').next().unwrap_or_default().to_owned();
        let access = crate::store::EtcdAccess::apiserver(root, cert_dir, &endpoint)?;
        let etcd = crate::store::Store::connect(&access).await?;
        let members = etcd.members().await?;
        let Some(me) = members.iter().find(|m| m.name == name) else {
            return Ok::<_, anyhow::Error>(format!("member {name} is not in the cluster"));
        };
        if members.len() == 1 {
            return Ok(format!("member {name} is the only one; it is not removed"));
        }
        // etcd refuses to remove a member until the others have been
        // connected for its health interval (5 s), "unhealthy cluster";
        // kubeadm retries, and so does the stand-in, within the deadline.
        loop {
            match etcd.remove_member(me.id).await {
                Ok(()) => break,
                Err(e) if format!("{e:#}").contains("unhealthy cluster") => {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(format!(
            "removed member {name} ({:x}) from the etcd cluster",
            me.id
        ))
    };
    match tokio::time::timeout(std::time::Duration::from_secs(15), result).await {
        Ok(Ok(msg)) => println!("[reset] {msg}"),
        Ok(Err(e)) => println!("W [reset] failed to remove the etcd member of this node: {e:#}; remove it by hand with etcdctl member remove"),
        Err(_) => println!("W [reset] failed to remove the etcd member of this node: etcd did not answer within 15s; remove it by hand with etcdctl member remove"),
    }
}
