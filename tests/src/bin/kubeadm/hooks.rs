//! The node image's upgrade hooks, this binary under the names
//! `upgrade-kubeadm` and `upgrade-kubelet`: what the package manager does
//! on a real machine during an in-place upgrade.
//!
//! The agent runs `upgrade-kubeadm VERSION` before `kubeadm upgrade` and
//! `upgrade-kubelet VERSION` after it, with `DROVER_KUBEADM` naming the
//! kubeadm it runs and `DROVER_ROOT` its machine root. The stand-in's
//! "package" is a version file next to that kubeadm (`kubeadm.version`,
//! `kubelet.version`, see [`crate::util::installed_versions`]); installing
//! the kubelet restarts the stand-in kubelet of the root, if it runs, so
//! its Node reports the new version, as `systemctl restart kubelet` does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

use crate::util::{
    installed_versions, parse_version, write_file, Root, KUBEADM_VERSION_FILE, KUBELET_VERSION_FILE,
};

use drover_common::kubeadm::{
    HOOK_KUBEADM_ENV, HOOK_ROOT_ENV, UPGRADE_KUBEADM_HOOK as KUBEADM_HOOK,
    UPGRADE_KUBELET_HOOK as KUBELET_HOOK,
};

/// Runs the hook `program` names, if it names one; its exit code.
pub fn run(program: &str, args: &[String]) -> Option<u8> {
    let name = Path::new(program).file_name()?.to_str()?;
    if name != KUBEADM_HOOK && name != KUBELET_HOOK {
        return None;
    }
    let result = match args {
        [version] => hook(name, version),
        _ => Err(anyhow!(
            "usage: {name} VERSION (for example {name} v1.32.0); got {} arguments",
            args.len()
        )),
    };
    Some(match result {
        Ok(done) => {
            println!("{name}: {done}");
            0
        }
        Err(e) => {
            eprintln!("{name}: {e:#}");
            1
        }
    })
}

fn hook(name: &str, version: &str) -> Result<String> {
    let v = parse_version(version)
        .map_err(|e| anyhow!("{version:?} is not a Kubernetes version such as v1.32.0: {e}"))?;
    let version = format!("v{}.{}.{}", v.major, v.minor, v.patch);
    let kubeadm = kubeadm_path()?;
    let dir = kubeadm
        .parent()
        .ok_or_else(|| anyhow!("{} has no directory", kubeadm.display()))?
        .to_path_buf();
    let (installed_kubeadm, installed_kubelet) = installed_versions(&dir);
    if name == KUBEADM_HOOK {
        // The kubelet stays what it was until its own hook runs.
        write_version(&dir.join(KUBELET_VERSION_FILE), &installed_kubelet)?;
        write_version(&dir.join(KUBEADM_VERSION_FILE), &version)?;
        return Ok(format!(
            "kubeadm {installed_kubeadm} -> {version} installed at {}",
            kubeadm.display()
        ));
    }
    write_version(&dir.join(KUBELET_VERSION_FILE), &version)?;
    let root = Root(
        std::env::var_os(HOOK_ROOT_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/")),
    );
    let restarted = restart_kubelet(&root, kubeadm)?;
    Ok(format!(
        "kubelet {installed_kubelet} -> {version} installed; {restarted}"
    ))
}

/// The kubeadm whose installation the hooks change: `$DROVER_KUBEADM`
/// (a path, or a name looked up in `PATH`), else `kubeadm` in `PATH`;
/// symbolic links resolved, as the stand-in finds its own version files.
fn kubeadm_path() -> Result<PathBuf> {
    let named = std::env::var(HOOK_KUBEADM_ENV)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "kubeadm".to_owned());
    let found = if named.contains('/') {
        PathBuf::from(&named)
    } else {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join(&named))
            .find(|p| p.is_file())
            .ok_or_else(|| anyhow!("{named} is not in PATH: set DROVER_KUBEADM to its path"))?
    };
    std::fs::canonicalize(&found).with_context(|| format!("cannot find {}", found.display()))
}

fn write_version(path: &Path, version: &str) -> Result<()> {
    write_file(path, format!("{version}\n").as_bytes(), 0o644)
        .with_context(|| format!("cannot install {}", path.display()))
}

/// Restarts the stand-in kubelet of `root` as the installation of
/// `kubeadm`, when it runs; a machine whose kubelet is not running keeps
/// it stopped.
fn restart_kubelet(root: &Root, kubeadm: PathBuf) -> Result<String> {
    let Some(stopped) = crate::daemon::stop(root, "kubelet") else {
        return Ok("the kubelet was not running; not started".into());
    };
    crate::util::set_program(kubeadm);
    // The restarted kubelet is waited for where it listens (its config
    // file, flags over it), as a look at the service would: no kubeadm is
    // waiting here.
    let (host, port) = crate::kubelet::healthz_address(root)?;
    let url = crate::kubelet::healthz_url(&host, port);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(crate::node::start_kubelet(
        root,
        &url,
        Duration::from_secs(240),
    ))
    .map_err(|e| anyhow!("{stopped}, but it did not start again: {e:#}"))?;
    Ok(format!("{stopped}; the kubelet restarted"))
}
