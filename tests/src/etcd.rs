//! A real etcd cluster on loopback for the high-availability tests, started
//! and stopped through `scripts/etcd` (Debian's `etcd-server`).

use std::path::PathBuf;
use std::process::Command;

/// An etcd cluster of 1 or 3 members, stopped on drop.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    /// The client endpoints, `127.0.0.1:PORT` each.
    pub endpoints: Vec<String>,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/etcd")
}

/// A base port with the `2 * members` ports after it free.
fn free_base(members: usize) -> u16 {
    for _ in 0..50 {
        let base = crate::free_port();
        if base > 65000 {
            continue;
        }
        let all_free = (0..2 * members as u16)
            .all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no run of {} free loopback ports", 2 * members);
}

impl EtcdCluster {
    pub fn start(members: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(script())
            .args(["start", dir.path().to_str().unwrap()])
            .arg(free_base(members).to_string())
            .arg(members.to_string())
            .output()
            .expect("run scripts/etcd");
        assert!(
            out.status.success(),
            "scripts/etcd start failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let endpoints = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .split(',')
            .map(|e| e.trim().trim_start_matches("http://").to_owned())
            .filter(|e| !e.is_empty())
            .collect::<Vec<_>>();
        assert_eq!(endpoints.len(), members, "{out:?}");
        Self { dir, endpoints }
    }

    /// `etcd://a,b,c` for `drover serve --store`.
    pub fn store_url(&self) -> String {
        format!("etcd://{}", self.endpoints.join(","))
    }

    /// Kills member `i` (SIGKILL).
    pub fn kill_member(&self, i: usize) {
        let pid = std::fs::read_to_string(self.dir.path().join(format!("member-{i}.pid")))
            .expect("member pid file");
        let pid: i32 = pid.trim().parse().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The members' own account, before their directory goes: a
            // member that died under a test says why only here.
            for i in 0..self.endpoints.len() {
                let dir = self.dir.path();
                let alive = std::fs::read_to_string(dir.join(format!("member-{i}.pid")))
                    .ok()
                    .and_then(|p| p.trim().parse::<i32>().ok())
                    .is_some_and(|pid| {
                        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
                    });
                let log = std::fs::read_to_string(dir.join(format!("member-{i}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                eprintln!(
                    "--- etcd member {i} ({}, {}), the last lines of its log ---",
                    self.endpoints[i],
                    if alive { "running" } else { "not running" }
                );
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
        let _ = Command::new(script())
            .args(["stop", self.dir.path().to_str().unwrap()])
            .output();
    }
}
