//! The stand-in kubelet's one real static Pod: `kubeadm __standin-etcd`
//! runs the node's stacked etcd from `/etc/kubernetes/manifests/etcd.yaml`
//! with the real `etcd` binary (Debian's etcd-server: `/usr/bin/etcd` in
//! the test node image; on a host, `$DROVER_ETCD_BIN` or `etcd` on `PATH`),
//! paths resolved inside `--rootfs`. It stays etcd's parent: SIGTERM, or
//! its pid file going away (`kubeadm reset`, the test harness), stops etcd.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{anyhow, bail, Context, Result};

use crate::daemon;
use crate::node::MANIFESTS_DIR;
use crate::util::Root;

/// Flags whose value is a path on the machine.
const PATH_FLAGS: &[&str] = &[
    "cert-file",
    "key-file",
    "peer-cert-file",
    "peer-key-file",
    "peer-trusted-ca-file",
    "trusted-ca-file",
    "data-dir",
];

/// The etcd executable.
pub fn binary() -> PathBuf {
    if let Some(b) = std::env::var_os("DROVER_ETCD_BIN") {
        return PathBuf::from(b);
    }
    for dir in std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let candidate = dir.join("etcd");
        if candidate.is_file() {
            return candidate;
        }
    }
    PathBuf::from("/usr/bin/etcd")
}

/// The `--flag=value` arguments of the etcd static Pod, with machine paths
/// resolved inside the root.
pub fn args_from_manifest(root: &Root) -> Result<Vec<String>> {
    let logical = format!("{MANIFESTS_DIR}/etcd.yaml");
    let text =
        std::fs::read_to_string(root.path(&logical)).with_context(|| format!("open {logical}"))?;
    let pod: serde_json::Value =
        serde_saphyr::from_str(&text).map_err(|e| anyhow!("{logical}: {e}"))?;
    let command = pod["spec"]["containers"][0]["command"]
        .as_array()
        .ok_or_else(|| anyhow!("{logical}: no container command"))?;
    let mut out = vec![];
    for a in command.iter().skip(1) {
        let a = a
            .as_str()
            .ok_or_else(|| anyhow!("{logical}: a command argument is not a string"))?;
        let Some((flag, value)) = a.strip_prefix("--").and_then(|f| f.split_once('=')) else {
            bail!("{logical}: argument {a:?} is not --flag=value");
        };
        let value = if PATH_FLAGS.contains(&flag) {
            root.path(value).display().to_string()
        } else {
            value.to_owned()
        };
        out.push(format!("--{flag}={value}"));
    }
    Ok(out)
}

pub fn run(root: Root) -> Result<()> {
    // On this thread: etcd dies with the thread that started it
    // (PR_SET_PDEATHSIG), which must be the supervisor's only thread.
    daemon::run(&root, "etcd", None, supervise(&root))
}

async fn supervise(root: &Root) -> Result<()> {
    let args = args_from_manifest(root)?;
    let bin = binary();
    println!(
        "standin-etcd: starting {} {}",
        bin.display(),
        args.join(" ")
    );
    let mut cmd = tokio::process::Command::new(&bin);
    cmd.args(&args).stdin(Stdio::null()).kill_on_drop(true);
    // etcd dies with its supervisor, however the supervisor dies (a killed
    // machine's daemons are SIGKILLed): no member outlives its machine.
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork
    // and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start etcd ({})", bin.display()))?;
    let watchdog = daemon::watchdog(root.clone(), "etcd");
    tokio::pin!(watchdog);
    let term = daemon::termination();
    tokio::pin!(term);
    tokio::select! {
        status = child.wait() => {
            bail!("etcd exited: {}", status?);
        }
        sig = &mut term => println!("standin-etcd: received {}, stopping etcd", sig?),
        _ = &mut watchdog => println!("standin-etcd: stopping etcd"),
    }
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    match tokio::time::timeout(std::time::Duration::from_secs(5), child.wait()).await {
        Ok(_) => {}
        Err(_) => {
            let _ = child.kill().await;
        }
    }
    Ok(())
}
