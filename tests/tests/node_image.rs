//! The test node image (images/docker/Dockerfile.test-node) end to end: a
//! container started with no arguments reads its bootstrap document from the
//! NoCloud seed, registers with a coordinator on the host, runs `kubeadm
//! init` (the stand-in) when a cluster claims it, and its PID 1 reaps the
//! daemons kubeadm leaves behind.
//!
//! Traffic stays on a Docker network this test creates (`--internal`: no
//! route off it): the coordinator listens on the network's gateway address,
//! and containers reach it under the name `drover-coordinator`.

use std::net::{IpAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use drover_tests::*;

const BOOT: Duration = Duration::from_secs(120);

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run docker (is the Docker CLI installed?): {e}"))
}

/// Runs a docker command that must succeed; returns its trimmed stdout.
fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(
        out.status.success(),
        "docker {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:x}{:x}", std::process::id(), nanos & 0xff_ffff_ffff)
}

/// The Docker network and containers of one test, removed on drop even when
/// the test fails.
struct DockerEnv {
    network: String,
    containers: Vec<String>,
}

impl DockerEnv {
    fn new() -> Self {
        let network = format!("drover-test-{}", unique_suffix());
        docker_ok(&[
            "network",
            "create",
            "--internal",
            "--label",
            "dev.drover.test=node_image",
            &network,
        ]);
        Self {
            network,
            containers: Vec::new(),
        }
    }

    /// The host's address on the network.
    fn gateway(&self) -> IpAddr {
        let out = docker_ok(&[
            "network",
            "inspect",
            &self.network,
            "--format",
            "{{range .IPAM.Config}}{{.Gateway}} {{end}}",
        ]);
        out.split_whitespace()
            .filter_map(|s| s.parse::<IpAddr>().ok())
            .find(IpAddr::is_ipv4)
            .unwrap_or_else(|| panic!("network {} has no IPv4 gateway: {out:?}", self.network))
    }

    /// Creates (does not start) a node container on the network.
    fn create_node(&mut self, hostname: &str, gateway: IpAddr) -> String {
        let name = format!("{}-{hostname}", self.network);
        docker_ok(&[
            "create",
            "--name",
            &name,
            "--network",
            &self.network,
            "--hostname",
            hostname,
            "--add-host",
            &format!("drover-coordinator:{gateway}"),
            "--label",
            "dev.drover.test=node_image",
            "--env",
            "RUST_LOG=info,drover_agent=debug",
            &node_image(),
        ]);
        self.containers.push(name.clone());
        name
    }

    fn logs(&self, container: &str) -> String {
        let out = docker(&["logs", container]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for DockerEnv {
    fn drop(&mut self) {
        for c in &self.containers {
            if std::thread::panicking() {
                eprintln!("--- container {c} log ---\n{}", self.logs(c));
            }
            let _ = docker(&["rm", "--force", "--volumes", c]);
        }
        let _ = docker(&["network", "rm", &self.network]);
    }
}

/// A port free on `ip` (bound and released).
fn free_port_on(ip: IpAddr) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("cannot bind {ip}: {e}"))
        .port()
}

/// Copies a file out of a container (running or not).
fn container_file(container: &str, path: &str, dest_dir: &Path) -> String {
    let dest = dest_dir.join(
        Path::new(path)
            .file_name()
            .expect("a file path inside the container"),
    );
    let _ = std::fs::remove_file(&dest);
    docker_ok(&["cp", &format!("{container}:{path}"), dest.to_str().unwrap()]);
    std::fs::read_to_string(&dest).unwrap()
}

/// The container's live processes as `docker top` (ps on the host) shows
/// them: (pid, ppid, state, command). `docker top` lists a cgroup's
/// processes, which leaves zombies out: see [`zombie_children_of_pid1`].
fn processes(container: &str) -> Vec<(String, String, String, String)> {
    docker_ok(&["top", container, "-o", "pid,ppid,stat,args"])
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((
                f.next()?.to_owned(),
                f.next()?.to_owned(),
                f.next()?.to_owned(),
                f.collect::<Vec<_>>().join(" "),
            ))
        })
        .collect()
}

/// Zombie children of the container's PID 1, read from the host's /proc
/// (the Docker daemon runs on this machine, so the container's processes
/// are visible there under their host PIDs).
fn zombie_children_of_pid1(container: &str) -> Vec<String> {
    let pid1 = docker_ok(&["inspect", container, "--format", "{{.State.Pid}}"]);
    assert!(
        Path::new(&format!("/proc/{pid1}/stat")).exists(),
        "PID 1 of {container} (host pid {pid1}) is not in this /proc: the zombie check needs the Docker daemon on this machine"
    );
    let mut zombies = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let (Some(state), Some(ppid)) = (fields.next(), fields.next()) else {
            continue;
        };
        if ppid == pid1 && state == "Z" {
            zombies.push(stat.split(' ').take(2).collect::<Vec<_>>().join(" "));
        }
    }
    zombies
}

#[test]
fn node_container_boots_from_nocloud_seed_and_runs_kubeadm_init() {
    assert!(
        docker(&["version"]).status.success(),
        "the Docker daemon is not reachable; this test needs Docker Engine (scripts/test checks it)"
    );
    let id = drover_tests::docker::build_image();
    assert!(id.starts_with("sha256:"), "image id: {id:?}");

    let tmp = tempfile::tempdir().unwrap();
    let mut env = DockerEnv::new();
    let gateway = env.gateway();
    let port = free_port_on(gateway);
    let gw = gateway.to_string();
    let advertise = format!("https://drover-coordinator:{port}");
    let c = Coordinator::start_with_args(
        tmp.path(),
        CoordinatorOptions::default(),
        &[
            "--san",
            "drover-coordinator",
            "--san",
            &gw,
            "--advertise-url",
            &advertise,
        ],
        &format!("{gw}:{port}"),
    );

    // The bootstrap document names the coordinator as the containers see it.
    let boot = tmp.path().join("user-data");
    c.token("default", "env=image", 1, "10m", &boot);
    let doc = std::fs::read_to_string(&boot).unwrap();
    assert!(doc.contains(&advertise), "{doc}");

    // A container with no arguments: the seed is copied in before it starts.
    let node = env.create_node("node-1", gateway);
    docker_ok(&[
        "cp",
        boot.to_str().unwrap(),
        &format!("{node}:/var/lib/cloud/seed/nocloud/user-data"),
    ]);
    docker_ok(&["start", &node]);
    let container_ip: IpAddr = docker_ok(&[
        "inspect",
        &node,
        "--format",
        &format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
            env.network
        ),
    ])
    .parse()
    .expect("container IP");

    let machine = wait_for("node-1 to register", BOOT, || {
        let machines = c.machines();
        match machines
            .iter()
            .find(|m| m["status"]["hostname"] == "node-1")
        {
            Some(m) if m["status"]["phase"] == "Registered" => Ok(m.clone()),
            Some(m) => Err(format!("phase {}", m["status"]["phase"])),
            None => Err(format!("{} machines, none node-1", machines.len())),
        }
    });
    // It advertises its address on the route to the coordinator: the
    // container's own.
    let first_address = machine["status"]["addresses"][0].as_str();
    assert_eq!(
        first_address,
        Some(container_ip.to_string().as_str()),
        "container IP {container_ip}: {machine}"
    );
    let logs = env.logs(&node);
    assert!(
        logs.contains("read the bootstrap document from the NoCloud seed"),
        "{logs}"
    );

    // A cluster claims it: kubeadm init in the container, with the stand-in
    // API server on <container IP>:6443 and kubelet health on 127.0.0.1:10248.
    let cluster = tmp.path().join("cluster.yaml");
    std::fs::write(&cluster, pool_cluster_yaml("img", 1, 0, "image")).unwrap();
    c.cli_ok(&["apply", "-f", cluster.to_str().unwrap()]);
    c.wait_cluster_phase("img", "Running", BOOT);

    let calls = container_file(&node, "/var/log/kubeadm-invocations.jsonl", tmp.path());
    let calls: Vec<serde_json::Value> = calls
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let argv: Vec<String> = serde_json::from_value(calls[0]["argv"].clone()).unwrap();
    // The machine's root is / (no --rootfs), kubeadm from the image.
    assert_eq!(
        argv,
        [
            "/usr/bin/kubeadm",
            "init",
            "--config",
            "/etc/drover/kubeadm.yaml"
        ],
        "{calls:?}"
    );
    assert!(calls.iter().all(|c| c["exit"] == 0), "{calls:?}");
    // kubeadm was given the container's address: its API server advertises it.
    let manifest = container_file(
        &node,
        "/etc/kubernetes/manifests/kube-apiserver.yaml",
        tmp.path(),
    );
    assert!(
        manifest.contains(&format!("--advertise-address={container_ip}")),
        "{manifest}"
    );
    // The config held the join token: the agent removed it after init.
    let copied_to = tmp.path().join("kubeadm-config-left");
    let left = docker(&[
        "cp",
        &format!("{node}:/etc/drover/kubeadm.yaml"),
        copied_to.to_str().unwrap(),
    ]);
    assert!(
        !left.status.success(),
        "/etc/drover/kubeadm.yaml is still in the container"
    );

    // PID 1 is tini, with the agent its child; the stand-in daemons kubeadm
    // started were reparented to it when kubeadm exited.
    let procs = processes(&node);
    let init = procs
        .iter()
        .find(|p| p.3.starts_with("/usr/bin/tini"))
        .unwrap_or_else(|| panic!("no tini in {procs:#?}"));
    let agent = procs
        .iter()
        .find(|p| p.3.starts_with("/usr/bin/drover-agent"))
        .unwrap_or_else(|| panic!("no agent in {procs:#?}"));
    assert_eq!(agent.1, init.0, "the agent is tini's child: {procs:#?}");
    for daemon in ["__standin-apiserver", "__standin-kubelet"] {
        let d = procs
            .iter()
            .find(|p| p.3.contains(daemon))
            .unwrap_or_else(|| panic!("no {daemon} in {procs:#?}"));
        assert_eq!(d.1, init.0, "{daemon} is reparented to PID 1: {procs:#?}");
    }

    // Deleting the cluster resets the machine (`kubeadm reset -f` stops the
    // daemons): it returns to the pool and PID 1 leaves no zombie behind.
    c.cli_ok(&["delete", "cluster", "img", "--wait", "--timeout", "90s"]);
    wait_for("node-1 back in the pool without zombies", BOOT, || {
        let machines = c.machines();
        let m = machines
            .iter()
            .find(|m| m["status"]["hostname"] == "node-1")
            .ok_or("node-1 is gone")?;
        if m["status"]["phase"] != "Registered" || !m["spec"]["assignment"].is_null() {
            return Err(format!("not released yet: {m}"));
        }
        if let Some(p) = processes(&node)
            .into_iter()
            .find(|p| p.3.contains("__standin-"))
        {
            return Err(format!("a stand-in daemon still runs: {p:?}"));
        }
        let zombies = zombie_children_of_pid1(&node);
        if !zombies.is_empty() {
            return Err(format!("zombie children of PID 1: {zombies:?}"));
        }
        Ok(())
    });

    // `docker stop` sends SIGTERM to PID 1, which forwards it to the agent;
    // the agent's exit code is the container's.
    docker_ok(&["stop", "--time", "20", &node]);
    let code = docker_ok(&["inspect", &node, "--format", "{{.State.ExitCode}}"]);
    assert_eq!(code, "0", "{}", env.logs(&node));
}
