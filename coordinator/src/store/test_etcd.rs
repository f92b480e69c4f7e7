//! A throwaway etcd for tests, one member or several: the real `etcd`
//! binary (Debian's `etcd-server`; `scripts/etcd install`) on free loopback
//! ports with a temporary data directory, killed on drop.
//!
//! Without the binary the tests that need it are skipped with a message,
//! except under `CI=true`, where a missing etcd fails them.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use drover_common::test_etcd::{etcd_binary, free_port, healthy};

use super::{EtcdOptions, Store};

pub(crate) struct TestEtcd {
    /// The members' processes (`None` once killed).
    members: Vec<Option<Child>>,
    /// Their client endpoints, `127.0.0.1:PORT`.
    pub endpoints: Vec<String>,
    /// Their plain-HTTP metrics endpoints, which serve `/health`.
    metrics: Vec<String>,
    dir: tempfile::TempDir,
}

/// The server side of TLS for clients: etcd's certificate and key, and the
/// CA client certificates must be signed by (required when given).
pub(crate) struct TestTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_ca_file: Option<PathBuf>,
}

impl TestEtcd {
    /// Starts a single-member etcd; see `start_cluster`.
    pub(crate) fn start() -> Option<Self> {
        Self::start_cluster(1)
    }

    /// Starts an etcd cluster of `size` members and waits until every one
    /// reports healthy; `None` (after saying why on stderr) when etcd is
    /// not installed and `CI` is not `true`.
    pub(crate) fn start_cluster(size: usize) -> Option<Self> {
        Self::start_with(size, None)
    }

    /// Starts one member serving clients over TLS only.
    pub(crate) fn start_tls(tls: &TestTls) -> Option<Self> {
        Self::start_with(1, Some(tls))
    }

    fn start_with(size: usize, tls: Option<&TestTls>) -> Option<Self> {
        let Some(bin) = etcd_binary() else {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("the etcd binary is not on PATH, and CI=true requires the etcd tests to run; install it with scripts/etcd install");
            }
            eprintln!("SKIPPED: the etcd binary is not on PATH (install it with scripts/etcd install); this etcd store test did not run");
            return None;
        };
        // A port taken between choosing and binding makes etcd exit: retry.
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start(&bin, size, tls) {
                Ok(e) => return Some(e),
                Err(why) => last = why,
            }
        }
        panic!("etcd did not start: {last}");
    }

    fn try_start(
        bin: &std::path::Path,
        size: usize,
        tls: Option<&TestTls>,
    ) -> Result<Self, String> {
        let dir = tempfile::tempdir().expect("temporary directory");
        let ports: Vec<(u16, u16)> = (0..size).map(|_| (free_port(), free_port())).collect();
        let metrics: Vec<String> = (0..size)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut etcd = Self {
            members: vec![],
            endpoints: ports
                .iter()
                .map(|(client, _)| format!("127.0.0.1:{client}"))
                .collect(),
            metrics,
            dir,
        };
        for (i, (client, peer)) in ports.iter().enumerate() {
            let client_url = format!("{scheme}://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let log = std::fs::File::create(etcd.dir.path().join(format!("m{i}.log")))
                .expect("etcd log file");
            let mut cmd = Command::new(bin);
            cmd.args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(etcd.dir.path().join(format!("m{i}")))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &cluster])
                .args([
                    "--listen-metrics-urls",
                    &format!("http://{}", etcd.metrics[i]),
                ])
                .args(["--logger", "zap", "--log-outputs", "stderr"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log);
            if let Some(tls) = tls {
                cmd.arg("--cert-file")
                    .arg(&tls.cert_file)
                    .arg("--key-file")
                    .arg(&tls.key_file);
                if let Some(ca) = &tls.client_ca_file {
                    cmd.arg("--client-cert-auth")
                        .arg("--trusted-ca-file")
                        .arg(ca);
                }
            }
            // etcd reads every ETCD_* variable as a flag.
            for (k, _) in std::env::vars_os() {
                if k.to_string_lossy().starts_with("ETCD_") {
                    cmd.env_remove(k);
                }
            }
            let child = cmd
                .spawn()
                .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
            etcd.members.push(Some(child));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0..size {
            loop {
                if let Some(Ok(Some(status))) = etcd.members[i].as_mut().map(Child::try_wait) {
                    return Err(format!(
                        "etcd member {i} exited ({status}); its log:\n{}",
                        etcd.log(i)
                    ));
                }
                // `GET /health` on the metrics port.
                if healthy(&etcd.metrics[i]) {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "etcd member {i} not healthy after 30s; its log:\n{}",
                        etcd.log(i)
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(etcd)
    }

    /// Kills member `i` (SIGKILL, as a crash would).
    pub(crate) fn kill_member(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The last lines member `i` logged.
    pub(crate) fn log(&self, i: usize) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join(format!("m{i}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Options for a store under `prefix` on this etcd, every member.
    pub(crate) fn options(&self, prefix: &str) -> EtcdOptions {
        let mut o = EtcdOptions::new(self.endpoints.clone(), prefix);
        o.timeout = Duration::from_secs(5);
        o
    }

    /// A new store handle (a replica, as far as the store can tell) under
    /// the prefix `/drover`.
    pub(crate) fn open(&self) -> Store {
        Store::open_etcd(&self.options("/drover")).unwrap_or_else(|e| {
            panic!(
                "cannot open the etcd store: {e}; the first member's log:\n{}",
                self.log(0)
            )
        })
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill_member(i);
        }
    }
}
