//! A real single-member etcd on loopback for the agent's tests, started
//! from the `etcd` binary scripts/setup-host installs. Plain HTTP: the
//! tests that use it exercise the gateway calls, not TLS.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use drover_common::test_etcd::{etcd_binary, free_port, healthy};

pub struct TestEtcd {
    pub url: String,
    child: Child,
    dir: tempfile::TempDir,
}

impl TestEtcd {
    /// Starts etcd and waits until it answers; `None` (after saying why)
    /// when etcd is not installed and `CI` is not `true`.
    pub fn start() -> Option<Self> {
        if etcd_binary().is_none() {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("the etcd binary is not on PATH, and CI=true requires the etcd tests to run; run scripts/setup-host");
            }
            eprintln!("SKIPPED: the etcd binary is not on PATH (run scripts/setup-host); this test did not run");
            return None;
        }
        let dir = tempfile::tempdir().expect("temporary directory");
        let (client, peer) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd log");
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", "agent-test"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("agent-test={peer_url}")])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd.spawn().expect("etcd starts");
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = format!("127.0.0.1:{client}");
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.path().join("etcd.log")).unwrap_or_default();
                panic!("etcd exited ({status}): {log}");
            }
            if healthy(&addr) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "etcd not healthy after 30 s: {}",
                std::fs::read_to_string(dir.path().join("etcd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Self { url, child, dir })
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = &self.dir;
    }
}
