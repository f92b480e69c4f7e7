//! What a cluster looks like from inside, through the real clients: real
//! `kubectl` for Nodes and Pods, real `etcdctl` for the etcd member list.
//! Tests check what Drover did with these, not only with Drover's view.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Runs real kubectl with `kubeconfig`; returns its output or why it failed.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout", "5s"])
        .args(args)
        .output()
        .map_err(|e| format!("cannot run kubectl: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A running `kubectl` (say `get clusters --watch`) and the lines it
/// prints, read on a thread of their own; kill the child when done.
pub fn kubectl_lines(
    kubeconfig: &Path,
    args: &[&str],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let out = child.stdout.take().expect("kubectl's stdout");
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, lines)
}

/// `kubectl get WHAT -n NAMESPACE -o jsonpath=PATH` with `kubeconfig`.
pub fn jsonpath(
    kubeconfig: &Path,
    what: &[&str],
    namespace: &str,
    path: &str,
) -> Result<String, String> {
    let jsonpath = format!("jsonpath={path}");
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    args.extend_from_slice(&["-n", namespace, "-o", &jsonpath]);
    kubectl(kubeconfig, &args)
}

/// The names of every Node and of the Ready ones, as real kubectl lists
/// them, sorted.
pub fn nodes(kubeconfig: &Path) -> Result<(Vec<String>, Vec<String>), String> {
    let out = kubectl(kubeconfig, &["get", "nodes", "-o", "json"])?;
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    let items = v["items"].as_array().cloned().unwrap_or_default();
    let name = |n: &serde_json::Value| n["metadata"]["name"].as_str().map(str::to_owned);
    let mut all: Vec<String> = items.iter().filter_map(name).collect();
    let mut ready: Vec<String> = items
        .iter()
        .filter(|n| {
            n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .filter_map(name)
        .collect();
    all.sort();
    ready.sort();
    Ok((all, ready))
}

/// Each Node's `spec.providerID` by its name, as real kubectl lists them
/// (empty when it has none).
pub fn provider_ids(
    kubeconfig: &Path,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let out = kubectl(
        kubeconfig,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.providerID}{\"\\n\"}{end}",
        ],
    )?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((
                f.next()?.to_owned(),
                f.next().unwrap_or_default().to_owned(),
            ))
        })
        .collect())
}

/// The names of the Ready Nodes, as real kubectl lists them, sorted.
pub fn ready_nodes(kubeconfig: &Path) -> Result<Vec<String>, String> {
    nodes(kubeconfig).map(|(_, ready)| ready)
}

/// The etcd member list as real `etcdctl` sees it at `endpoint`, with the
/// API server's etcd client certificate from the kubeadm PKI directory
/// `pki` (`/etc/kubernetes/pki` of a control plane).
pub fn etcd_members(pki: &Path, endpoint: &str) -> Result<Vec<serde_json::Value>, String> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(endpoint)
        .arg("--cacert")
        .arg(pki.join("etcd/ca.crt"))
        .arg("--cert")
        .arg(pki.join("apiserver-etcd-client.crt"))
        .arg("--key")
        .arg(pki.join("apiserver-etcd-client.key"))
        .args(["--command-timeout", "3s", "member", "list", "-w", "json"])
        .output()
        .map_err(|e| format!("cannot run etcdctl (scripts/setup-host installs it): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "etcdctl member list at {endpoint}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(v["members"].as_array().cloned().unwrap_or_default())
}

/// The names of the started members (those with client URLs) in `members`,
/// sorted.
pub fn started_member_names(members: &[serde_json::Value]) -> Vec<String> {
    let mut names: Vec<String> = members
        .iter()
        .filter(|m| m["clientURLs"].as_array().is_some_and(|u| !u.is_empty()))
        .filter_map(|m| m["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// Real kubectl asking `/readyz` through a kubeconfig once a second, on a
/// thread of its own, until stopped.
pub struct Prober {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Vec<bool>>,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Prober {
    pub fn start(kubeconfig: PathBuf) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = count.clone();
        let thread = std::thread::spawn(move || {
            let mut results = vec![];
            let started = std::time::Instant::now();
            loop {
                let ok = kubectl(
                    &kubeconfig,
                    &["get", "--raw", "/readyz", "--request-timeout=2s"],
                )
                .is_ok();
                if !ok {
                    // When each failure happened, to lay beside the
                    // coordinator's log (printed when a test fails, or
                    // always with DROVER_TEST_LOG set).
                    eprintln!(
                        "{} /readyz probe {} failed, {:.1} s after probing began",
                        time::OffsetDateTime::now_utc(),
                        results.len(),
                        started.elapsed().as_secs_f64()
                    );
                }
                results.push(ok);
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match stopped.recv_timeout(Duration::from_secs(1)) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return results,
                }
            }
        });
        Self {
            stop,
            thread,
            count,
        }
    }

    /// How many probes were made so far.
    pub fn count(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops probing, prints how the probes through `endpoint` went, and
    /// fails the test if more than `max_in_a_row` failed one after another.
    pub fn stop_and_check(self, endpoint: &str, max_in_a_row: usize) {
        let probes = self.stop();
        let worst = longest_failure_run(&probes);
        let failed = probes.iter().filter(|ok| !**ok).count();
        eprintln!(
            "/readyz through {endpoint}: {} probes, {failed} failed, at most {worst} in a row",
            probes.len()
        );
        assert!(worst <= max_in_a_row, "{worst} probes in a row failed");
    }

    /// Stops probing; returns whether each probe succeeded, in order.
    pub fn stop(self) -> Vec<bool> {
        let _ = self.stop.send(());
        self.thread.join().expect("the prober thread")
    }
}

/// The longest run of failed probes.
pub fn longest_failure_run(probes: &[bool]) -> usize {
    probes.split(|ok| *ok).map(<[bool]>::len).max().unwrap_or(0)
}

/// The version of the API server behind the cluster's endpoint, as real
/// `kubectl version` reports it.
pub fn server_version(kubeconfig: &Path) -> String {
    let out = kubectl(kubeconfig, &["version", "-o", "json"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["serverVersion"]["gitVersion"]
        .as_str()
        .unwrap_or_else(|| panic!("no server version: {out}"))
        .to_owned()
}

/// The kubelet version of every Node, as real kubectl lists them.
pub fn kubelet_versions(kubeconfig: &Path) -> Result<Vec<String>, String> {
    let out = kubectl(
        kubeconfig,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.status.nodeInfo.kubeletVersion}{\"\\n\"}{end}",
        ],
    )?;
    let mut v: Vec<String> = out.lines().map(str::to_owned).collect();
    v.sort();
    Ok(v)
}
