//! Harness for Drover's end-to-end tests: real `drover serve` and
//! `drover-agent` processes on loopback, the strict stand-in kubeadm, and
//! helpers that wait on conditions with deadlines.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The directory holding the workspace's built binaries.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test>-<hash>
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    dir.to_path_buf()
}

/// Path of a workspace binary, checked to exist.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is not built; run `cargo build --workspace --bins` first (scripts/test does)",
        p.display()
    );
    p
}

/// The test node image the docker tests run: `drover-node:test`, or
/// `$DROVER_NODE_IMAGE` so that work trees building their own agent can test
/// side by side without replacing each other's image.
pub fn node_image() -> String {
    std::env::var("DROVER_NODE_IMAGE").unwrap_or_else(|_| "drover-node:test".to_string())
}

/// The API servers of the Running control planes among `machines` (as the
/// API lists them), `ip:port`, sorted: what a cluster's load balancer
/// should forward to.
pub fn running_control_plane_backends(machines: &[serde_json::Value]) -> Vec<String> {
    let mut out: Vec<String> = machines
        .iter()
        .filter(|m| {
            m["spec"]["assignment"]["role"] != "worker" && m["status"]["phase"] == "Running"
        })
        .map(|m| {
            format!(
                "{}:{}",
                m["status"]["addresses"][0].as_str().unwrap_or_default(),
                m["status"]["apiServerPort"]
            )
        })
        .collect();
    out.sort();
    out
}

/// The systemd node image the kind-profile test runs:
/// `drover-node:systemd`, or `$DROVER_SYSTEMD_NODE_IMAGE`.
pub fn systemd_node_image() -> String {
    std::env::var("DROVER_SYSTEMD_NODE_IMAGE").unwrap_or_else(|_| "drover-node:systemd".to_string())
}

/// A free TCP port on 127.0.0.1 (bound and released; tests run few enough
/// processes that a race is unlikely, and a taken port fails loudly).
/// A YAML file (a bootstrap document, user data) as JSON.
pub fn read_yaml(path: &Path) -> serde_json::Value {
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `drover serve` of data directory `data` on a free loopback port, with
/// the CLI config file `config` and `extra` arguments, to be run.
pub fn drover_serve(data: &Path, config: &Path, extra: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin("drover"));
    cmd.args(["serve", "--data-dir"])
        .arg(data)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(extra)
        .env("DROVER_CONFIG", config);
    cmd
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// `count` consecutive loopback ports, free now, below the
/// ephemeral range, for one coordinator's managed endpoints. Coordinators of
/// tests running at once each get their own, so no two hand out (and race
/// to bind) the same port.
pub fn free_port_range(count: u16) -> (u16, u16) {
    use rand::Rng;
    let mut rng = rand::rng();
    loop {
        let first: u16 = rng.random_range(20000..32000 - count);
        let free = (first..first + count).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok());
        if free {
            return (first, first + count - 1);
        }
    }
}

/// A loopback address of its own for one simulated machine (Linux routes
/// all of 127.0.0.0/8 to `lo`): a control plane's etcd listens on the
/// fixed ports 2379 and 2380 of its advertise address, as with real
/// kubeadm, so machines sharing this host each need their own. Random in
/// 127.1.0.0-127.254.255.255, probed free on those ports; concurrent test
/// binaries pick among 16 million addresses, so a clash is unlikely and
/// fails loudly.
pub fn free_loopback() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    loop {
        let ip = std::net::Ipv4Addr::new(
            127,
            rng.random_range(1..=254),
            rng.random_range(0..=255),
            rng.random_range(1..=254),
        );
        let free = [2379u16, 2380, 2381]
            .iter()
            .all(|p| TcpListener::bind((ip, *p)).is_ok());
        if free {
            return ip.to_string();
        }
    }
}

/// Polls `cond` every 100 ms until it returns `Some`, or panics after
/// `timeout` with `what` and the last observation.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    let mut last;
    loop {
        match cond() {
            Ok(v) => return v,
            Err(e) => last = e,
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last observation: {last}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `prefix-xxxxx`: a name no other test run uses at the same time (Docker
/// objects and EC2 tags outlive a crashed test).
pub fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{:05x}", n % 0xfffff)
}

/// A coordinator of its own under a new temporary directory, and the
/// bootstrap file (`boot.yaml` there) of a token for pool `pool`, labels
/// `labels`, `uses` machines and `ttl`. Bind the three in this order, so
/// the coordinator stops before the directory goes.
pub fn coordinator_with_token(
    pool: &str,
    labels: &str,
    uses: u32,
    ttl: &str,
) -> (tempfile::TempDir, Coordinator, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    let boot = tmp.path().join("boot.yaml");
    c.token(pool, labels, uses, ttl, &boot);
    (tmp, c, boot)
}

/// Settings for a test coordinator.
#[derive(Debug, Clone)]
pub struct CoordinatorOptions {
    pub heartbeat_interval: &'static str,
    pub heartbeat_timeout: &'static str,
    /// Extra environment of `drover serve` (e.g. the AWS SDK's).
    pub env: Vec<(String, String)>,
}

impl Default for CoordinatorOptions {
    fn default() -> Self {
        Self {
            heartbeat_interval: "1s",
            heartbeat_timeout: "5s",
            env: Vec::new(),
        }
    }
}

/// A running `drover serve`, killed on drop.
pub struct Coordinator {
    pub dir: PathBuf,
    pub port: u16,
    pub admin_token: String,
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
    opts: CoordinatorOptions,
    /// `--listen` of `drover serve`.
    listen: String,
    /// More `drover serve` flags (from `start_with_args`).
    extra_args: Vec<String>,
    /// The URL CLI commands use instead of the client config's server.
    cli_addr: Option<String>,
    /// `--endpoint-ports`, chosen once so a restart keeps it.
    pub endpoint_ports: (u16, u16),
    /// The open-file limit `drover serve` runs under (`ulimit -n`), if set.
    open_files: Option<u64>,
    /// A coordinator run in this process instead of a `drover serve` child.
    in_process: Option<InProcess>,
}

/// A coordinator run in the test process (`drover::serve::start` on a
/// listener bound here), on a runtime of its own; stopped (drained, every
/// background task stopped) on drop.
struct InProcess {
    runtime: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    running: Option<drover::serve::Running>,
}

impl InProcess {
    fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(running) = self.running.take() {
            self.runtime
                .block_on(async {
                    tokio::time::timeout(Duration::from_secs(30), running.wait()).await
                })
                .expect("the in-process coordinator stops within 30 s");
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Coordinator {
    /// Starts a coordinator with a new data directory under `dir`.
    pub fn start(dir: &Path, opts: CoordinatorOptions) -> Self {
        let mut c = Self::unstarted(dir, opts, free_port());
        c.spawn();
        c
    }

    /// A coordinator not yet started, listening on `127.0.0.1:port` with
    /// no more flags once started.
    fn unstarted(dir: &Path, opts: CoordinatorOptions, port: u16) -> Self {
        Self {
            dir: dir.to_path_buf(),
            port,
            admin_token: String::new(),
            child: None,
            log: Default::default(),
            opts,
            listen: format!("127.0.0.1:{port}"),
            extra_args: Vec::new(),
            cli_addr: None,
            endpoint_ports: free_port_range(8),
            open_files: None,
            in_process: None,
        }
    }

    /// Starts a coordinator in this test process with a new data directory
    /// under `dir`, on `127.0.0.1:0` (mini-redis' in-process server tests):
    /// for tests that need no coordinator process (no kill, restart,
    /// signal or output), no agent and no Docker. The CLI still runs as
    /// the `drover` binary.
    pub fn in_process(dir: &Path, opts: CoordinatorOptions) -> Self {
        Self::in_process_with(dir, opts, &[])
    }

    /// [`Self::in_process`] with more `drover serve` flags.
    pub fn in_process_with(dir: &Path, opts: CoordinatorOptions, extra: &[&str]) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the coordinator");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind 127.0.0.1:0");
        let mut c = Self::unstarted(dir, opts, listener.local_addr().unwrap().port());
        let data = dir.join("data");
        let client = c.client_config();
        let ports = format!("{}-{}", c.endpoint_ports.0, c.endpoint_ports.1);
        let flags: Vec<&std::ffi::OsStr> = vec![
            "--data-dir".as_ref(),
            data.as_os_str(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--heartbeat-interval".as_ref(),
            c.opts.heartbeat_interval.as_ref(),
            "--heartbeat-timeout".as_ref(),
            c.opts.heartbeat_timeout.as_ref(),
            "--endpoint-ports".as_ref(),
            ports.as_ref(),
            "--client-config".as_ref(),
            client.as_os_str(),
        ];
        let flags: Vec<&std::ffi::OsStr> = flags
            .into_iter()
            .chain(extra.iter().map(|f| f.as_ref()))
            .collect();
        let cfg = drover::serve::config_from_flags(flags).expect("valid serve flags");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = runtime
            .block_on(drover::serve::start(cfg, listener, async {
                let _ = stopped.await;
            }))
            .unwrap_or_else(|e| panic!("the in-process coordinator did not start: {e:#}"));
        c.in_process = Some(InProcess {
            runtime,
            stop: Some(stop),
            running: Some(running),
        });
        c.admin_token = c.client_config_token();
        c
    }

    /// [`Self::start`] with more `drover serve` flags, run under an
    /// open-file limit of `open_files` (soft and hard, as `ulimit -n` sets
    /// them), restarts included.
    pub fn start_limited(
        dir: &Path,
        opts: CoordinatorOptions,
        extra_args: &[&str],
        open_files: u64,
    ) -> Self {
        let mut c = Self::unstarted(dir, opts, free_port());
        c.extra_args = extra_args.iter().map(|a| (*a).to_owned()).collect();
        c.open_files = Some(open_files);
        c.spawn();
        c
    }

    /// Starts a coordinator listening on `listen` (a concrete `IP:PORT`,
    /// e.g. a test Docker network's gateway) with more `drover serve` flags
    /// (`--san`, `--advertise-url`, ...). CLI commands then talk to
    /// `https://<listen>` whatever the advertised URL is, so the serving
    /// certificate must cover the listen IP (`--san IP`, or the coordinator's
    /// default SANs).
    pub fn start_with_args(
        dir: &Path,
        opts: CoordinatorOptions,
        extra_args: &[&str],
        listen: &str,
    ) -> Self {
        let addr: std::net::SocketAddr = listen
            .parse()
            .unwrap_or_else(|e| panic!("listen {listen:?} is not IP:PORT: {e}"));
        assert!(
            !addr.ip().is_unspecified() && addr.port() != 0,
            "listen {listen:?} must be a concrete address and port"
        );
        let mut c = Self::unstarted(dir, opts, addr.port());
        c.listen = addr.to_string();
        c.extra_args = extra_args.iter().map(|a| (*a).to_owned()).collect();
        c.cli_addr = Some(format!("https://{addr}"));
        c.spawn();
        c
    }

    /// Starts a replica sharing a store with `first`'s, like
    /// [`Self::start_with_args`], in `dir` (created). Only the first start
    /// writes the client config and prints the admin token; a later replica
    /// (`first` given) shares them.
    pub fn start_replica(
        dir: &Path,
        opts: CoordinatorOptions,
        extra_args: &[String],
        listen: &str,
        first: Option<&Coordinator>,
    ) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        if let Some(first) = first {
            std::fs::copy(first.client_config(), dir.join("client.yaml")).unwrap();
        }
        let args: Vec<&str> = extra_args.iter().map(String::as_str).collect();
        let mut c = Self::start_with_args(dir, opts, &args, listen);
        if let Some(first) = first {
            c.admin_token = first.admin_token.clone();
        }
        c
    }

    fn spawn(&mut self) {
        let mut command = match self.open_files {
            Some(n) => {
                let mut c = Command::new("bash");
                c.args(["-c", &format!("ulimit -n {n} && exec \"$@\""), "bash"])
                    .arg(bin("drover"));
                c
            }
            None => Command::new(bin("drover")),
        };
        let mut child = command
            .args(["serve", "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--listen", &self.listen])
            .args(["--heartbeat-interval", self.opts.heartbeat_interval])
            .args(["--heartbeat-timeout", self.opts.heartbeat_timeout])
            .args(&self.extra_args)
            .args([
                "--endpoint-ports".to_owned(),
                format!("{}-{}", self.endpoint_ports.0, self.endpoint_ports.1),
            ])
            .env("DROVER_CONFIG", self.client_config())
            .env("DROVER_LOG", "info,drover=debug")
            .envs(self.opts.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start drover serve");
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                log.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(line.clone());
                let _ = tx.send(line);
            }
        });
        let stderr = child.stderr.take().unwrap();
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                log.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if line.starts_with("Listening on ") {
                        break;
                    }
                }
                Err(_) => panic!(
                    "drover serve did not start listening; its output:\n{}",
                    self.log
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .join("\n")
                ),
            }
        }
        self.child = Some(child);
        // Its standard output is a pipe, not a terminal: the first start
        // writes the admin token only to the client config.
        if self.admin_token.is_empty() {
            self.admin_token = self.client_config_token();
        }
    }

    /// The admin token of the client config file, or "" without one.
    pub fn client_config_token(&self) -> String {
        #[derive(serde::Deserialize)]
        struct ClientConfig {
            token: Option<String>,
        }
        std::fs::read_to_string(self.client_config())
            .ok()
            .and_then(|text| serde_saphyr::from_str::<ClientConfig>(&text).ok())
            .and_then(|c| c.token)
            .unwrap_or_default()
    }

    /// How many passes the cluster reconciler has completed.
    pub fn reconciler_runs(&self) -> u64 {
        let status = self.status();
        status["tasks"]
            .as_array()
            .and_then(|tasks| tasks.iter().find(|t| t["name"] == "cluster-reconciler"))
            .and_then(|t| t["runs"].as_u64())
            .unwrap_or_else(|| panic!("no reconciler in {status}"))
    }

    /// The client config file `drover serve` wrote at first start.
    pub fn client_config(&self) -> PathBuf {
        self.dir.join("client.yaml")
    }

    /// Sends `signal` to the coordinator process (SIGSTOP pauses it, SIGCONT
    /// resumes it).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        assert!(
            self.in_process.is_none(),
            "an in-process coordinator cannot be signalled; start it with Coordinator::start"
        );
        let pid = self.child.as_ref().expect("coordinator runs").id();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).unwrap();
    }

    /// `GET /v1/status` of this replica.
    pub fn status(&self) -> serde_json::Value {
        let answer = self
            .api(None)
            .send("GET", "/v1/status", Some(&self.admin_token), None);
        assert_eq!(answer.status, 200, "{answer:?}");
        answer.json()
    }

    /// Kills the coordinator (SIGKILL, as a crash would).
    pub fn kill(&mut self) {
        assert!(
            self.in_process.is_none(),
            "an in-process coordinator cannot be killed; start it with Coordinator::start"
        );
        kill_child(&mut self.child);
    }

    /// Starts it again on the same data directory and port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Everything the coordinator printed so far.
    pub fn output(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }

    /// Runs a `drover` CLI command against this coordinator.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_command(args).output().expect("run drover")
    }

    /// A `drover` CLI command against this coordinator, to run or spawn.
    pub fn cli_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("drover"));
        cmd.args(args)
            .env("DROVER_CONFIG", self.client_config())
            .env_remove("DROVER_ADDR")
            .env_remove("DROVER_TOKEN")
            .env_remove("DROVER_CA");
        if let Some(addr) = &self.cli_addr {
            cmd.env("DROVER_ADDR", addr);
        }
        cmd
    }

    /// Runs a CLI command that must succeed; returns its stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "drover {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a CLI command that must fail; returns its stderr.
    pub fn cli_refused(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success(),
            "drover {args:?} succeeded: {err}\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        err
    }

    /// Writes `yaml` to a file of its own under `dir` and applies it with
    /// `drover apply -f`, which must succeed.
    pub fn apply_yaml(&self, dir: &Path, yaml: &str) {
        static APPLIED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = APPLIED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let f = dir.join(format!("cluster-{n}.yaml"));
        self.apply_file(&f, yaml);
    }

    /// Applies `yaml` (as [`Self::apply_yaml`]) and waits up to `timeout`
    /// for cluster `name` to be Running.
    pub fn apply_until_running(&self, dir: &Path, name: &str, yaml: &str, timeout: Duration) {
        self.apply_yaml(dir, yaml);
        self.wait_cluster_phase(name, "Running", timeout);
    }

    /// Writes `yaml` to `file` and applies it with `drover apply -f`,
    /// which must succeed; returns its stdout.
    pub fn apply_file(&self, file: &Path, yaml: &str) -> String {
        std::fs::write(file, yaml).unwrap();
        self.cli_ok(&["apply", "-f", file.to_str().unwrap()])
    }

    /// Writes `yaml` to `file` and applies it with `drover apply -f`,
    /// which must fail; returns its stderr.
    pub fn apply_refused(&self, file: &Path, yaml: &str) -> String {
        std::fs::write(file, yaml).unwrap();
        let out = self.cli(&["apply", "-f", file.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "accepted:\n{yaml}\n{err}");
        err
    }

    /// Waits up to `timeout` until `n` machines have registered.
    pub fn wait_registered(&self, n: usize, timeout: Duration) {
        wait_for(&format!("{n} machines to register"), timeout, || {
            let got = self.machines().len();
            (got == n).then_some(()).ok_or(format!("{got} registered"))
        });
    }

    /// Creates an admin token with `role` through the CLI; returns it.
    pub fn create_admin_token(&self, role: &str) -> String {
        self.cli_ok(&["admin-token", "create", "--role", role])
            .trim()
            .to_owned()
    }

    /// Creates a registration token and writes its bootstrap document.
    pub fn token(&self, pool: &str, labels: &str, uses: u32, ttl: &str, file: &Path) {
        self.cli_ok(&[
            "token",
            "create",
            "--pool",
            pool,
            "--labels",
            labels,
            "--uses",
            &uses.to_string(),
            "--ttl",
            ttl,
            "-o",
            file.to_str().unwrap(),
        ]);
    }

    /// Reads machines as JSON.
    pub fn machines(&self) -> Vec<serde_json::Value> {
        let out = self.cli_ok(&["get", "machines", "-o", "json"]);
        serde_json::from_str(&out).expect("machines json")
    }

    /// Reads one cluster as JSON, if it exists.
    pub fn cluster(&self, name: &str) -> Option<serde_json::Value> {
        let out = self.cli(&["get", "clusters", name, "-o", "json"]);
        if !out.status.success() {
            return None;
        }
        let v: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).ok()?;
        v.into_iter().next()
    }

    /// The status and message of condition `type_` of a cluster, if set.
    pub fn condition(&self, cluster: &str, type_: &str) -> Option<(String, String)> {
        self.cluster(cluster)?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|x| x["type"] == type_)
            .map(|x| {
                (
                    x["status"].as_str().unwrap_or_default().to_owned(),
                    x["message"].as_str().unwrap_or_default().to_owned(),
                )
            })
    }

    /// Waits until condition `type_` of a cluster has status `status`, and
    /// returns its message.
    pub fn wait_condition(&self, cluster: &str, type_: &str, status: &str) -> String {
        wait_for(
            &format!("condition {type_} of cluster {cluster} to be {status}"),
            Duration::from_secs(120),
            || match self.condition(cluster, type_) {
                Some((s, m)) if s == status => Ok(m),
                other => Err(format!("{other:?}")),
            },
        )
    }

    /// The sealed file this coordinator keeps of etcd snapshot `snap` (as
    /// `drover get snapshots -o json` prints it) and its bytes, checked to
    /// be one: the format's magic first, and the size the snapshot's record
    /// says.
    pub fn sealed_snapshot(&self, snap: &serde_json::Value) -> (PathBuf, Vec<u8>) {
        let file = self
            .dir
            .join("data/snapshots")
            .join(snap["spec"]["clusterUid"].as_str().unwrap())
            .join(format!(
                "{}.drvsnap",
                snap["metadata"]["name"].as_str().unwrap()
            ));
        let sealed = std::fs::read(&file).unwrap();
        assert!(sealed.starts_with(b"DRVSNAP1"), "{}", file.display());
        assert_eq!(
            sealed.len() as u64,
            snap["status"]["sealedSize"].as_u64().unwrap()
        );
        (file, sealed)
    }

    /// Waits until the cluster's phase is `phase`.
    pub fn wait_cluster_phase(&self, name: &str, phase: &str, timeout: Duration) {
        wait_for(&format!("cluster {name} to be {phase}"), timeout, || {
            let c = self.cluster(name).ok_or("cluster not found")?;
            let p = c["status"]["phase"].as_str().unwrap_or("").to_owned();
            if p == phase {
                Ok(())
            } else {
                Err(format!(
                    "phase {p}; machines: {}",
                    self.cli_ok(&["get", "machines", "-o", "wide"])
                ))
            }
        })
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        if let Some(mut p) = self.in_process.take() {
            p.stop();
        }
        kill_child(&mut self.child);
        if std::thread::panicking() || std::env::var_os("DROVER_TEST_LOG").is_some() {
            eprintln!("--- coordinator output ---\n{}", self.output());
        }
    }
}

/// Ports one simulated machine uses on 127.0.0.1.
#[derive(Debug, Clone, Copy)]
pub struct MachinePorts {
    pub api_server: u16,
    pub kubelet: u16,
}

impl MachinePorts {
    pub fn free() -> Self {
        Self {
            api_server: free_port(),
            kubelet: free_port(),
        }
    }
}

/// A running `drover-agent` with its own root directory. On drop it is
/// killed and the stand-in daemons it started are stopped.
pub struct Agent {
    pub root: PathBuf,
    pub ports: MachinePorts,
    /// The machine's own loopback address (`--advertise-address`).
    pub address: String,
    pub hostname: String,
    boot: Boot,
    /// More environment for the agent (and the kubeadm it runs).
    env: Vec<(String, String)>,
    /// The kubeadm the agent runs.
    kubeadm: PathBuf,
    child: Option<Child>,
    log_path: PathBuf,
}

/// Where a test agent finds its bootstrap document.
#[derive(Debug, Clone)]
pub enum Boot {
    /// `--bootstrap FILE`.
    File(PathBuf),
    /// Instance metadata (IMDSv2) at this endpoint, as on EC2.
    Imds(String),
}

impl Agent {
    /// Starts an agent for a new machine rooted at `root`.
    pub fn start(root: &Path, hostname: &str, bootstrap: &Path) -> Self {
        Self::boot(root, hostname, Boot::File(bootstrap.to_path_buf()))
    }

    /// Starts an agent that reads its bootstrap document as `boot` says.
    pub fn boot(root: &Path, hostname: &str, boot: Boot) -> Self {
        Self::boot_with_env(root, hostname, boot, vec![])
    }

    /// [`Agent::start`] for a machine with its own kubeadm installation,
    /// as a node image has: the stand-in at `<root>/usr/bin/kubeadm` and
    /// the upgrade hooks `<root>/usr/lib/drover/upgrade-{kubeadm,kubelet}`
    /// (links to it), so an in-place upgrade of this machine changes its
    /// kubeadm and kubelet versions only.
    pub fn start_installed(root: &Path, hostname: &str, bootstrap: &Path) -> Self {
        let kubeadm = root.join("usr/bin/kubeadm");
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        if std::fs::hard_link(bin("kubeadm"), &kubeadm).is_err() {
            std::fs::copy(bin("kubeadm"), &kubeadm).unwrap();
        }
        let hooks = root.join("usr/lib/drover");
        std::fs::create_dir_all(&hooks).unwrap();
        for hook in ["upgrade-kubeadm", "upgrade-kubelet"] {
            std::os::unix::fs::symlink(&kubeadm, hooks.join(hook)).unwrap();
        }
        Self::launch(
            root,
            hostname,
            Boot::File(bootstrap.to_path_buf()),
            vec![],
            kubeadm,
        )
    }

    /// [`Agent::boot`] with more environment for the agent and its kubeadm.
    pub fn boot_with_env(
        root: &Path,
        hostname: &str,
        boot: Boot,
        env: Vec<(String, String)>,
    ) -> Self {
        Self::launch(root, hostname, boot, env, bin("kubeadm"))
    }

    fn launch(
        root: &Path,
        hostname: &str,
        boot: Boot,
        env: Vec<(String, String)>,
        kubeadm: PathBuf,
    ) -> Self {
        std::fs::create_dir_all(root).unwrap();
        let mut a = Self {
            root: root.to_path_buf(),
            ports: MachinePorts::free(),
            address: free_loopback(),
            hostname: hostname.to_owned(),
            boot,
            env,
            kubeadm,
            child: None,
            log_path: root.join("agent.log"),
        };
        a.spawn();
        a
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap();
        let mut cmd = Command::new(bin("drover-agent"));
        match &self.boot {
            Boot::File(path) => {
                // Tests never reach for the real link-local metadata service.
                cmd.env("AWS_EC2_METADATA_DISABLED", "true")
                    .arg("--bootstrap")
                    .arg(path);
            }
            Boot::Imds(endpoint) => {
                cmd.env_remove("AWS_EC2_METADATA_DISABLED")
                    .args(["--imds-endpoint", endpoint]);
            }
        }
        let child = cmd
            // Never the host's own seed.
            .arg("--nocloud-dir")
            .arg(self.root.join("var/lib/cloud/seed/nocloud"))
            .arg("--root")
            .arg(&self.root)
            .arg("--kubeadm")
            .arg(&self.kubeadm)
            .args(["--advertise-address", &self.address])
            .args(["--api-server-port", &self.ports.api_server.to_string()])
            .args([
                "--kubelet-healthz-url",
                &format!("http://127.0.0.1:{}/healthz", self.ports.kubelet),
            ])
            .args(["--hostname", &self.hostname])
            // Nothing watches the stand-in's static Pod manifests.
            .args(["--static-pod-restart-wait", "1s"])
            .env("RUST_LOG", "info")
            // A test agent's machine is a directory of this host: a reboot
            // it is asked for fails, unless the test gives a command of
            // its own.
            .env("DROVER_REBOOT_COMMAND", "/bin/false")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start drover-agent");
        self.child = Some(child);
    }

    /// Stops the agent process (SIGSTOP) without ending it: a hung agent
    /// on a hung machine, which answers nothing until killed.
    pub fn hang(&mut self) {
        if let Some(c) = &self.child {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGSTOP,
            )
            .expect("SIGSTOP the agent");
        }
    }

    /// Kills the agent process (SIGKILL); its machine's daemons keep running.
    pub fn kill(&mut self) {
        kill_child(&mut self.child);
    }

    /// Starts the agent again on the same root.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts the agent again on the same root with `env` as its extra
    /// environment instead of what it had.
    pub fn restart_with_env(&mut self, env: Vec<(String, String)>) {
        self.env = env;
        self.restart();
    }

    /// Whether the agent process has exited, with its status.
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Every kubeadm invocation the stand-in recorded for this machine.
    pub fn kubeadm_calls(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.root.join("var/log/kubeadm-invocations.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The subcommands (argv[1], argv[2] for `token create`) kubeadm ran.
    pub fn kubeadm_subcommands(&self) -> Vec<String> {
        self.kubeadm_calls()
            .iter()
            .filter_map(|c| {
                let argv = c["argv"].as_array()?;
                let sub = argv.get(1)?.as_str()?.to_owned();
                Some(if sub == "token" {
                    format!(
                        "token {}",
                        argv.get(2).and_then(|v| v.as_str()).unwrap_or("")
                    )
                } else {
                    sub
                })
            })
            .collect()
    }

    /// Stops the stand-in daemons (kubelet, API server) of this machine.
    pub fn stop_daemons(&self) {
        let dir = self.root.join("run/standin");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if let Ok(pid) = std::fs::read_to_string(e.path()) {
                    if let Ok(pid) = pid.trim().parse::<i32>() {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
        }
    }
}

/// A machine's stand-in container runtime (`standin-cri`: the CRI
/// `RuntimeService` on a unix socket), killed on drop.
pub struct StandinCri {
    pub socket: PathBuf,
    child: Option<Child>,
}

impl StandinCri {
    /// Starts it on `socket` and waits until it accepts.
    pub fn start(socket: &Path) -> Self {
        let log = socket.with_extension("log");
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin("standin-cri"))
            .arg("--socket")
            .arg(socket)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("start standin-cri");
        wait_for(
            "the stand-in runtime to listen",
            Duration::from_secs(30),
            || {
                std::os::unix::net::UnixStream::connect(socket)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        );
        Self {
            socket: socket.to_owned(),
            child: Some(child),
        }
    }

    /// Stops the runtime (SIGKILL): its socket stays, and nobody answers.
    pub fn stop(&mut self) {
        kill_child(&mut self.child);
    }
}

impl Drop for StandinCri {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        self.stop_daemons();
        if std::thread::panicking() {
            eprintln!("--- agent {} log ---\n{}", self.hostname, self.log());
        }
    }
}

/// A bridge CNI network configuration (the `bridge`, `host-local` and
/// `portmap` plugins of Debian's containernetworking-plugins): what a
/// machine needs in `/etc/cni/net.d` before its kubelet's Node goes Ready,
/// the stand-in's as a real one's.
pub const BRIDGE_CNI_CONFLIST: &str = r#"{"cniVersion": "1.0.0", "name": "drover-bridge", "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]}}, {"type": "portmap", "capabilities": {"portMappings": true}}]}"#;

/// `spec.files` with [`BRIDGE_CNI_CONFLIST`] at
/// `/etc/cni/net.d/10-bridge.conflist`, indented for a cluster spec.
pub fn bridge_cni_files() -> String {
    format!(
        "  files:\n    - path: /etc/cni/net.d/10-bridge.conflist\n      content: |\n        {BRIDGE_CNI_CONFLIST}\n"
    )
}

/// A cluster document of `cp` control planes and `workers` in pool
/// `default`; `provider` is the indented text under `  provider:` (and
/// whatever follows it in the spec). Its machines get a bridge CNI config
/// through `spec.files`, so their Nodes go Ready.
pub fn cluster_yaml(name: &str, cp: u32, workers: u32, provider: &str) -> String {
    let files = bridge_cni_files();
    cluster_doc(
        name,
        &format!(
            "{files}  controlPlane:\n    replicas: {cp}\n  workerPools:\n    - name: default\n      replicas: {workers}\n  provider:\n{provider}"
        ),
    )
}

/// What `drover restore cluster NAME --into NEW --wait` printed, which
/// must be a drill that passed: the namespaces its inventory lists.
pub fn drill_passed(out: &std::process::Output) -> Vec<String> {
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("restore drill passed"), "{said}");
    eprintln!("{said}");
    said.lines()
        .find_map(|l| l.trim().strip_prefix("namespaces: "))
        .unwrap_or_else(|| panic!("no namespaces in {said}"))
        .split(", ")
        .map(str::to_owned)
        .collect()
}

/// The start of a Cluster document named `name` at v1.31.2, then `spec`:
/// the rest of its spec, indented by two.
pub fn cluster_doc(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: drover.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  kubernetesVersion: v1.31.2\n{spec}"
    )
}

/// What stands under `  provider:` for the pool provider: claim machines
/// labelled `env: <env>`.
pub fn pool_selector(env: &str) -> String {
    format!("    pool:\n      selector:\n        matchLabels:\n          env: {env}\n")
}

/// A cluster's `provider:` for the pool provider (see [`pool_selector`]).
pub fn pool_provider(env: &str) -> String {
    format!("  provider:\n{}", pool_selector(env))
}

/// A pool cluster `name` claiming machines labelled `env: <env>`, its spec
/// starting with `spec_start` (say the spec's own files), one control
/// plane and one worker in pool `default` that gets file
/// `/etc/drover-test/auth.json` from Secret `secret`.
pub fn cluster_reading_secret(name: &str, secret: &str, spec_start: &str, env: &str) -> String {
    cluster_doc(
        name,
        &format!(
            "{spec_start}  controlPlane:\n    replicas: 1\n  workerPools:\n    - name: default\n      replicas: 1\n      files:\n        - path: /etc/drover-test/auth.json\n          permissions: \"0600\"\n          contentFrom: {{secret: {secret}, key: auth.json}}\n{}",
            pool_provider(env)
        ),
    )
}

/// A cluster document for the pool provider. With more than one control
/// plane it asks for the coordinator's managed endpoint, which such a
/// cluster needs.
pub fn pool_cluster_yaml(name: &str, cp: u32, workers: u32, env: &str) -> String {
    let endpoint = if cp > 1 {
        "  controlPlaneEndpoint:\n    managed: coordinator\n"
    } else {
        ""
    };
    cluster_yaml(
        name,
        cp,
        workers,
        &format!("{}{endpoint}", pool_selector(env)),
    )
}

/// When the last bootstrap of each of `machines` (JSON, as `drover get
/// machines -o json` prints them) began and ended, from its `Bootstrapping`
/// and `Bootstrapped` events, sorted by start.
fn bootstrap_spans(
    machines: &[serde_json::Value],
) -> Vec<(time::OffsetDateTime, time::OffsetDateTime)> {
    let mut spans: Vec<_> = machines
        .iter()
        .map(|m| {
            let events = m["status"]["events"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let last = |reason: &str| {
                let t = events
                    .iter()
                    .rev()
                    .find(|e| e["reason"] == reason)
                    .and_then(|e| e["time"].as_str())
                    .unwrap_or_else(|| panic!("no {reason} event: {m}"));
                time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                    .unwrap()
            };
            (last("Bootstrapping"), last("Bootstrapped"))
        })
        .collect();
    spans.sort();
    spans
}

/// Panics unless `machines` (JSON, as `drover get machines -o json`
/// prints them) are `n` whose last bootstraps ran one after another: each
/// ended before the next began (see [`bootstrap_spans`]).
pub fn assert_bootstrapped_one_after_another(machines: &[serde_json::Value], n: usize) {
    let spans = bootstrap_spans(machines);
    assert_eq!(spans.len(), n, "{spans:?}");
    for pair in spans.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "a join started before the one before it finished: {spans:?}"
        );
    }
}

/// Kills a child process (SIGKILL) if there is one, and reaps it.
fn kill_child(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Helpers for tests that use the Docker engine.
#[cfg(feature = "aws")]
pub mod autoscaler;
pub mod aws;
pub mod browser;
pub mod etcd;
pub mod kube;
pub mod kube_api;
pub mod redfish;

pub mod docker {
    use std::path::Path;
    use std::process::Command;

    use super::bin_dir;

    pub fn docker(args: &[&str]) -> std::process::Output {
        Command::new("docker")
            .args(args)
            .output()
            .expect("run docker")
    }

    pub fn docker_ok(args: &[&str]) -> String {
        let out = docker(args);
        assert!(
            out.status.success(),
            "docker {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Builds the test node image once (scripts/build-node-image is idempotent).
    pub fn ensure_image() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            build_image();
        });
    }

    /// Runs scripts/build-node-image (which reuses the image when its
    /// inputs are unchanged) and returns the image id it printed.
    pub fn build_image() -> String {
        run_image_script("scripts/build-node-image", &crate::node_image())
    }

    /// Builds the systemd node image once (see
    /// scripts/build-systemd-node-image; reused while its inputs are
    /// unchanged).
    pub fn ensure_systemd_image() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            run_image_script(
                "scripts/build-systemd-node-image",
                &crate::systemd_node_image(),
            );
        });
    }

    /// Builds the test node image whose stand-in kubeadm and kubelet are
    /// `version` (`scripts/build-node-image --kubernetes-version`), tagged
    /// `drover-node:<version>`; returns the tag.
    pub fn ensure_versioned_image(version: &str) -> String {
        let tag = format!("drover-node:{version}");
        run_image_script_with(
            "scripts/build-node-image",
            &tag,
            &["--kubernetes-version", version],
        );
        tag
    }

    /// Runs an image script of the repository with this build's binaries;
    /// returns the image id it printed.
    fn run_image_script(script: &str, tag: &str) -> String {
        run_image_script_with(script, tag, &[])
    }

    /// [`run_image_script`] with more arguments.
    fn run_image_script_with(script: &str, tag: &str, more: &[&str]) -> String {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = Command::new(root.join(script))
            .arg("--bin-dir")
            .arg(bin_dir())
            .arg("--tag")
            .arg(tag)
            .args(more)
            .current_dir(&root)
            .output()
            .unwrap_or_else(|e| panic!("run {script}: {e}"));
        assert!(
            out.status.success(),
            "{script} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Removes every container and network of a cluster, even when the test failed.
    pub struct DockerCleanup(pub String);

    impl Drop for DockerCleanup {
        fn drop(&mut self) {
            let ids = docker(&[
                "ps",
                "-aq",
                "--filter",
                &format!("label=drover.dev/cluster={}", self.0),
            ]);
            for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
                // With its anonymous volumes (a kind-profile machine's /var).
                let _ = docker(&["rm", "-f", "-v", id]);
            }
            let _ = docker(&["network", "rm", &format!("drover-{}", self.0)]);
        }
    }
}

/// A raw HTTPS client for the coordinator's API, for tests that send what
/// the CLI and the agent never would.
pub struct Api {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    tls: std::sync::Arc<rustls::ClientConfig>,
    base: String,
}

/// An answer: status, content type, body and (from [`Api::send`]) headers.
#[derive(Debug, Default)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
    pub headers: reqwest::header::HeaderMap,
}

impl Answer {
    /// The answer as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// Asserts this is a problem document with `status` whose detail or
    /// title contains `needle`.
    pub fn assert_problem(&self, status: u16, needle: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert!(
            self.content_type.starts_with("application/problem+json"),
            "not a problem document: {self:?}"
        );
        let p = self.json();
        let text = format!("{} {} {}", p["title"], p["detail"], p["errors"]);
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
}

/// A TLS client configuration trusting `ca_pem`, presenting `identity`
/// (certificate and key PEM) when given.
pub fn client_tls(ca_pem: &str, identity: Option<(&str, &str)>) -> rustls::ClientConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    }
}

impl Api {
    /// A client trusting `ca_pem`, presenting `identity` (certificate and
    /// key PEM) when given.
    pub fn new(base: &str, ca_pem: &str, identity: Option<(&str, &str)>) -> Self {
        let cfg = client_tls(ca_pem, identity);
        let tls = std::sync::Arc::new(cfg.clone());
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(cfg)
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        Self {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            client,
            tls,
            base: base.trim_end_matches('/').to_owned(),
        }
    }

    /// Sends a request; `body` is `(content type, bytes)`.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<(&str, Vec<u8>)>,
    ) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some((ct, bytes)) = body {
            req = req.header("content-type", ct).body(bytes);
        }
        self.rt.block_on(async {
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    // Status 0: the connection itself was refused (TLS).
                    let mut chain = e.to_string();
                    let mut src = std::error::Error::source(&e);
                    while let Some(s) = src {
                        chain.push_str(": ");
                        chain.push_str(&s.to_string());
                        src = s.source();
                    }
                    return Answer {
                        status: 0,
                        body: chain,
                        ..Answer::default()
                    };
                }
            };
            let status = resp.status().as_u16();
            let content_type = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let headers = resp.headers().clone();
            let body = resp.text().await.unwrap_or_default();
            Answer {
                status,
                content_type,
                body,
                headers,
            }
        })
    }

    /// A JSON request.
    pub fn json(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        v: &serde_json::Value,
    ) -> Answer {
        self.send(
            method,
            path,
            token,
            Some(("application/json", serde_json::to_vec(v).unwrap())),
        )
    }
}

impl Coordinator {
    /// The coordinator CA certificate (PEM).
    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.dir.join("data/ca.crt")).expect("ca.crt")
    }

    /// The base URL tests reach it on.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// `/metrics` in the classic text format, scraped with the admin token.
    pub fn metrics_text(&self) -> String {
        let scraped = self
            .api(None)
            .send("GET", "/metrics", Some(&self.admin_token), None);
        assert_eq!(scraped.status, 200, "{scraped:?}");
        scraped.body
    }

    /// One series' value in a scrape of `/metrics` (0 when it is absent).
    pub fn metric(&self, series: &str) -> f64 {
        self.metrics_text()
            .lines()
            .find_map(|l| {
                l.strip_prefix(series)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0)
    }

    /// A raw API client, optionally with a machine identity.
    pub fn api(&self, identity: Option<(&str, &str)>) -> Api {
        Api::new(&self.url(), &self.ca_pem(), identity)
    }
}

impl Agent {
    /// The agent's persisted state (identity and progress).
    pub fn state(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.root.join("var/lib/drover-agent/state.json"))
            .expect("agent state");
        serde_json::from_str(&text).unwrap()
    }

    /// The agent's persisted state once it holds its machine certificate:
    /// the coordinator records a machine before the agent has saved the
    /// answer, so a test that takes over an identity waits for it.
    pub fn wait_identity(&self) -> serde_json::Value {
        let path = self.root.join("var/lib/drover-agent/state.json");
        wait_for(
            "the agent to save its identity",
            Duration::from_secs(30),
            || {
                let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
                let s: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| e.to_string())?;
                if s["certificatePem"].is_string() && s["machineUid"].is_string() {
                    Ok(s)
                } else {
                    Err("no certificate saved yet".to_owned())
                }
            },
        )
    }
}

impl Api {
    /// Announces a body of `announced` bytes but sends only `prefix`, then
    /// reads the answer: how a server must treat an oversized upload
    /// (refuse from the headers, without reading it all).
    pub fn send_announced(
        &self,
        method: &str,
        path: &str,
        announced: usize,
        prefix: &[u8],
    ) -> Answer {
        use rustls::pki_types::ServerName;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let hostport = self.base.trim_start_matches("https://").to_owned();
        let cfg = self.tls.clone();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\nContent-Length: {announced}\r\n\r\n"
        );
        self.rt.block_on(async move {
            let tcp = tokio::net::TcpStream::connect(&hostport).await.unwrap();
            let connector = tokio_rustls::TlsConnector::from(cfg);
            let name = ServerName::try_from("localhost").unwrap();
            let mut tls = connector.connect(name, tcp).await.unwrap();
            tls.write_all(head.as_bytes()).await.unwrap();
            let _ = tls.write_all(prefix).await;
            let _ = tls.flush().await;
            let mut buf = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut buf)).await;
            let text = String::from_utf8_lossy(&buf).into_owned();
            let status = text
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let content_type = text
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-type: ")
                        .map(str::to_owned)
                })
                .unwrap_or_default();
            let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
            Answer {
                status,
                content_type,
                body,
                ..Answer::default()
            }
        })
    }
}
