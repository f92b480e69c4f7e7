//! Running kubeadm: the exact command lines, and a runner that keeps the tail
//! of the combined output for the bootstrap report.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;

use drover_common::api::{MachineRole, UpgradeCommand};
use drover_common::kubeadm::{HOOK_KUBEADM_ENV, HOOK_ROOT_ENV, KUBEADM_PATCHES_DIR};
use drover_common::token::BootstrapToken;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// How many output lines are kept for reports.
pub const OUTPUT_TAIL_LINES: usize = 30;

/// How long output is still read after the command exited.
const OUTPUT_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The longest output line kept; longer lines are cut.
const MAX_LINE_CHARS: usize = 2048;

/// A command to run, with the strings that must never appear in logs or
/// reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    pub program: String,
    pub args: Vec<String>,
    /// Secrets replaced by `<redacted>` in the displayed command and output.
    pub redact: Vec<String>,
    /// Environment set for the command, on top of the agent's.
    pub env: Vec<(String, String)>,
    /// How long it may run; past it, its whole process group is killed and
    /// it fails. `None`: as long as it takes.
    pub timeout: Option<std::time::Duration>,
}

/// The reboot command `argv` (`--reboot-command`, never empty), bounded
/// by `timeout`.
pub fn reboot(argv: &[String], timeout: std::time::Duration) -> CommandSpec {
    let mut spec = CommandSpec::new(argv.first().map_or("systemctl", String::as_str), &[]);
    spec.args = argv.iter().skip(1).cloned().collect();
    spec.timeout = Some(timeout);
    spec
}

impl CommandSpec {
    fn new(program: &str, args: &[&str]) -> Self {
        Self {
            program: program.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            redact: Vec::new(),
            env: Vec::new(),
            timeout: None,
        }
    }

    /// The command line as a shell would show it, secrets redacted.
    pub fn display(&self) -> String {
        let line = std::iter::once(&self.program)
            .chain(&self.args)
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ");
        self.redact_text(&line)
    }

    /// Replaces every secret in `text`.
    pub fn redact_text(&self, text: &str) -> String {
        self.redact
            .iter()
            .filter(|s| !s.is_empty())
            .fold(text.to_owned(), |t, s| t.replace(s.as_str(), "<redacted>"))
    }
}

fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+%".contains(c));
    if plain {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// Appends `--rootfs <root>` unless the root is `/`.
fn push_rootfs(spec: &mut CommandSpec, root: &Path) {
    if root != Path::new("/") {
        spec.args.push("--rootfs".into());
        spec.args.push(root.display().to_string());
    }
}

/// `kubeadm init|join --config <path> [--rootfs <root>]`. The config path is
/// the path inside the root, because kubeadm chroots into the root first.
pub fn kubeadm_bootstrap(
    kubeadm: &str,
    role: MachineRole,
    config_path: &str,
    root: &Path,
) -> CommandSpec {
    let verb = match role {
        MachineRole::Init => "init",
        MachineRole::ControlPlane | MachineRole::Worker => "join",
    };
    let mut spec = CommandSpec::new(kubeadm, &[verb, "--config", config_path]);
    push_rootfs(&mut spec, root);
    spec
}

/// `etcdctl snapshot restore DB --name N --initial-cluster N=URL
/// --initial-advertise-peer-urls URL --data-dir DIR`: a new one-member etcd
/// (a new cluster id; etcd 3.4's etcdctl checks the hash etcd appended to
/// the snapshot) from the snapshot at `db`, as a restore of a cluster does
/// before `kubeadm init` (kubeadm's etcd then starts on that data).
pub fn etcdctl_snapshot_restore(
    etcdctl: &str,
    db: &Path,
    member: &str,
    peer_url: &str,
    data_dir: &Path,
) -> CommandSpec {
    let initial = format!("{member}={peer_url}");
    let db = db.display().to_string();
    let data_dir = data_dir.display().to_string();
    let mut spec = CommandSpec::new(
        etcdctl,
        &[
            "snapshot",
            "restore",
            &db,
            "--name",
            member,
            "--initial-cluster",
            &initial,
            "--initial-advertise-peer-urls",
            peer_url,
            "--data-dir",
            &data_dir,
        ],
    );
    spec.env.push(("ETCDCTL_API".into(), "3".into()));
    spec.timeout = Some(std::time::Duration::from_secs(30 * 60));
    spec
}

/// The version of `kubeadm` (`kubeadm version -o short`), or `None` when it
/// cannot be run or says something else (logged).
pub async fn kubeadm_version(kubeadm: &str) -> Option<String> {
    let mut spec = CommandSpec::new(kubeadm, &["version", "-o", "short"]);
    // Past it, the runner kills the process group: nothing is left running.
    spec.timeout = Some(std::time::Duration::from_secs(10));
    let outcome = run(&spec, 5).await;
    let version = match &outcome {
        o if o.success => o
            .output_tail
            .iter()
            .rev()
            .map(|l| l.trim())
            .find(|l| l.starts_with('v') && l.len() <= 64 && !l.contains(char::is_whitespace))
            .map(str::to_owned),
        _ => None,
    };
    if version.is_none() {
        tracing::warn!(
            command = %outcome.command,
            exit_code = ?outcome.exit_code,
            output = %outcome.output_tail.join(" | "),
            "cannot tell the kubeadm version; the coordinator cannot check it against the cluster's"
        );
    }
    version
}

/// `kubeadm certs renew all [--rootfs <root>]`.
pub fn kubeadm_certs_renew(kubeadm: &str, root: &Path) -> CommandSpec {
    let mut spec = CommandSpec::new(kubeadm, &["certs", "renew", "all"]);
    push_rootfs(&mut spec, root);
    spec
}

/// `kubeadm upgrade apply VERSION -y` or `kubeadm upgrade node`, with
/// `--patches` naming the machine's kubeadm patches directory when it has
/// one, and `--rootfs <root>` unless the root is `/`.
///
/// Both commands write `/var/lib/kubelet/config.yaml` again, from the
/// cluster's `kubelet-config` ConfigMap and the patches they are given
/// (kubeadm's `WriteKubeletConfigFiles`): without `--patches` the machine's
/// own kubelet settings (its healthz port) would be lost at the kubelet's
/// restart. kubeadm refuses a `--patches` directory that does not exist,
/// so it is named only when the bundle wrote one.
pub fn kubeadm_upgrade(
    kubeadm: &str,
    command: UpgradeCommand,
    version: &str,
    root: &Path,
) -> CommandSpec {
    let mut spec = match command {
        UpgradeCommand::Apply => CommandSpec::new(kubeadm, &["upgrade", "apply", version, "-y"]),
        UpgradeCommand::Node => CommandSpec::new(kubeadm, &["upgrade", "node"]),
    };
    let patches = KUBEADM_PATCHES_DIR;
    if crate::files::safe_join(root, patches).is_ok_and(|dir| dir.is_dir()) {
        spec.args.push("--patches".into());
        spec.args.push(patches.into());
    }
    push_rootfs(&mut spec, root);
    spec
}

/// How long an upgrade hook may run; past it, it is killed (and under
/// systemd, its unit is stopped by systemd itself).
pub const HOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// How the image's hooks are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookRunner {
    /// As a child of the agent (containers, test roots, no systemd).
    Direct,
    /// As a transient systemd service of its own (`systemd-run --wait
    /// --pipe`), outside the agent unit's sandbox: the agent's unit has
    /// `NoNewPrivileges=yes` and `RestrictSUIDSGID=yes`, which every child
    /// inherits, and the kubelet hook's `apt-get`/`dpkg` need setuid
    /// helpers and may install setuid files.
    Systemd,
}

impl HookRunner {
    /// [`HookRunner::Systemd`] when this agent runs as a systemd service
    /// (systemd is the init system and set `INVOCATION_ID` for it) on the
    /// machine's real root; else [`HookRunner::Direct`]. A test agent with
    /// a root of its own never asks systemd, even on a host that runs
    /// systemd.
    pub fn detect(root: &Path) -> Self {
        let under_systemd = std::env::var_os("INVOCATION_ID").is_some_and(|v| !v.is_empty())
            && Path::new("/run/systemd/system").is_dir();
        if under_systemd && root == Path::new("/") {
            HookRunner::Systemd
        } else {
            HookRunner::Direct
        }
    }
}

/// The image's upgrade hook `name` (`upgrade-kubeadm` or `upgrade-kubelet`)
/// in `hooks_dir`, given `version`. It learns the machine's root and the
/// kubeadm the agent runs from `DROVER_ROOT` and `DROVER_KUBEADM`. Under
/// systemd it runs as the transient unit `drover-hook-NAME` (one per hook,
/// so a second copy of a hook cannot start while one runs), its output
/// piped back, its exit status the command's, the unit collected even when
/// it fails, and stopped by systemd after [`HOOK_TIMEOUT`].
pub fn upgrade_hook(
    hooks_dir: &Path,
    name: &str,
    version: &str,
    kubeadm: &str,
    root: &Path,
    runner: HookRunner,
) -> CommandSpec {
    let program = hooks_dir.join(name).display().to_string();
    let env = vec![
        (HOOK_ROOT_ENV.to_owned(), root.display().to_string()),
        (HOOK_KUBEADM_ENV.to_owned(), kubeadm.to_owned()),
    ];
    let mut spec = match runner {
        HookRunner::Direct => {
            let mut spec = CommandSpec::new(&program, &[version]);
            spec.env = env;
            spec
        }
        HookRunner::Systemd => {
            let unit: String = name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let mut args = vec![
                "--wait".to_owned(),
                "--pipe".to_owned(),
                "--collect".to_owned(),
                "--quiet".to_owned(),
                format!("--unit=drover-hook-{unit}"),
                format!("--description=Drover upgrade hook {name} {version}"),
                format!("--property=RuntimeMaxSec={}", HOOK_TIMEOUT.as_secs()),
            ];
            args.extend(env.iter().map(|(k, v)| format!("--setenv={k}={v}")));
            args.extend(["--".to_owned(), program, version.to_owned()]);
            CommandSpec {
                program: "systemd-run".into(),
                args,
                redact: Vec::new(),
                env: Vec::new(),
                timeout: None,
            }
        }
    };
    spec.timeout = Some(HOOK_TIMEOUT);
    spec
}

/// One of a cluster's `preKubeadmCommands` or `postKubeadmCommands`:
/// `/bin/sh -c COMMAND` with `DROVER_ROOT` set to the machine's root (`/`
/// on a real machine) and [`COMMAND_TIMEOUT`] to finish.
///
/// [`COMMAND_TIMEOUT`]: drover_common::objects::customise::COMMAND_TIMEOUT
pub fn machine_command(command: &str, root: &Path) -> CommandSpec {
    let mut spec = CommandSpec::new("/bin/sh", &["-c", command]);
    spec.env = vec![(HOOK_ROOT_ENV.into(), root.display().to_string())];
    spec.timeout = Some(drover_common::objects::customise::COMMAND_TIMEOUT);
    spec
}

/// `kubeadm reset -f --cri-socket <socket> [--rootfs <root>]`. The socket
/// is the one init and join were given: after an interrupted join there is
/// no cluster configuration for reset to read it from, and detection fails
/// on a host with two runtimes.
pub fn kubeadm_reset(kubeadm: &str, root: &Path) -> CommandSpec {
    let mut spec = CommandSpec::new(
        kubeadm,
        &[
            "reset",
            "-f",
            "--cri-socket",
            drover_common::kubeadm::CRI_SOCKET,
        ],
    );
    push_rootfs(&mut spec, root);
    spec
}

/// `kubeadm token create <token> --ttl <n>s --kubeconfig <root>/etc/kubernetes/admin.conf`.
/// `token create` has no `--rootfs`, so the kubeconfig path is the host path.
pub fn kubeadm_token_create(
    kubeadm: &str,
    token: &BootstrapToken,
    ttl_seconds: u64,
    root: &Path,
) -> CommandSpec {
    let kubeconfig = root.join("etc/kubernetes/admin.conf");
    let mut spec = CommandSpec::new(
        kubeadm,
        &[
            "token",
            "create",
            &token.to_string(),
            "--ttl",
            &format!("{ttl_seconds}s"),
            "--kubeconfig",
            &kubeconfig.display().to_string(),
        ],
    );
    spec.redact.push(token.secret().to_owned());
    spec
}

/// The last lines of a command's output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputTail {
    lines: VecDeque<String>,
    capacity: usize,
}

impl OutputTail {
    pub fn new(capacity: usize) -> Self {
        Self {
            lines: VecDeque::with_capacity(capacity.min(64)),
            capacity,
        }
    }

    /// Adds a line, dropping the oldest when full.
    pub fn push(&mut self, line: String) {
        if self.capacity == 0 {
            return;
        }
        if self.lines.len() == self.capacity {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    pub fn into_lines(self) -> Vec<String> {
        self.lines.into()
    }
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutcome {
    /// The command line, secrets redacted.
    pub command: String,
    /// Whether it exited 0.
    pub success: bool,
    /// The exit code; `None` when killed by a signal or never started.
    pub exit_code: Option<i32>,
    /// The last lines of combined stdout and stderr, secrets redacted; the
    /// spawn error when the command could not start.
    pub output_tail: Vec<String>,
}

impl CommandOutcome {
    /// The outcome of work done in the agent itself (a call on the
    /// cluster, a restore), shown as `command`: its message, or its error.
    pub fn of_call<E: std::fmt::Display>(command: String, result: Result<String, E>) -> Self {
        let (success, message) = match result {
            Ok(m) => (true, m),
            Err(e) => (false, e.to_string()),
        };
        Self {
            command,
            success,
            exit_code: Some(if success { 0 } else { 1 }),
            output_tail: vec![message],
        }
    }

    /// The outcome as a wire failure report.
    pub fn to_failure(&self) -> drover_common::wire::CommandFailure {
        drover_common::wire::CommandFailure {
            command: self.command.clone(),
            exit_code: self.exit_code,
            output_tail: self.output_tail.clone(),
            at: drover_common::now(),
        }
    }

    /// A short description for directive results and logs.
    pub fn summary(&self) -> String {
        let status = match (self.success, self.exit_code) {
            (true, _) => "succeeded".to_owned(),
            (false, Some(code)) => format!("exited with code {code}"),
            (false, None) if self.output_tail.is_empty() => "was killed".to_owned(),
            (false, None) => "did not run".to_owned(),
        };
        let mut text = format!("{} {status}", self.command);
        if !self.success && !self.output_tail.is_empty() {
            text.push_str(":\n");
            text.push_str(&self.output_tail.join("\n"));
        }
        text
    }
}

/// Runs a command to completion, keeping the last `tail_lines` lines of its
/// combined output. stdout and stderr share one pipe, as with `2>&1`, so the
/// tail keeps the order the command wrote in and its final error line is
/// never displaced by earlier output. The child gets its own process group so
/// a terminal's Ctrl-C meant for the agent does not interrupt kubeadm
/// halfway, and it is not killed when the agent stops waiting for it.
pub async fn run(spec: &CommandSpec, tail_lines: usize) -> CommandOutcome {
    let command = spec.display();
    let not_started = |e: String| CommandOutcome {
        command: command.clone(),
        success: false,
        exit_code: None,
        output_tail: vec![format!("cannot start {}: {e}", spec.program)],
    };
    let (reader, writer) = match output_pipe() {
        Ok(p) => p,
        Err(e) => return not_started(format!("cannot create an output pipe: {e}")),
    };
    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .process_group(0)
        .kill_on_drop(false);
    match writer.try_clone() {
        Ok(w) => cmd.stdout(Stdio::from(w)).stderr(Stdio::from(writer)),
        Err(e) => return not_started(format!("cannot create an output pipe: {e}")),
    };
    let spawned = cmd.spawn();
    // The command holds the write ends; dropping it closes the agent's
    // copies, so the reader sees end-of-file when the child exits.
    drop(cmd);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return not_started(e.to_string()),
    };
    tracing::info!(command = %command, pid = child.id(), "started command");
    let mut tail = OutputTail::new(tail_lines);
    let pid = child.id();
    let mut timed_out = false;
    let status = {
        let mut output = std::pin::pin!(collect(reader, &mut tail, spec));
        let limit = async {
            match spec.timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(limit);
        tokio::select! {
            () = &mut output => tokio::select! {
                status = child.wait() => status,
                () = &mut limit => {
                    timed_out = true;
                    kill_group(pid);
                    child.wait().await
                }
            },
            status = child.wait() => {
                // A descendant that outlives the command (a daemon it
                // started) may keep the pipe open: read what is left, but
                // only for a moment.
                let _ = tokio::time::timeout(OUTPUT_DRAIN, &mut output).await;
                status
            }
            () = &mut limit => {
                timed_out = true;
                kill_group(pid);
                let status = child.wait().await;
                let _ = tokio::time::timeout(OUTPUT_DRAIN, &mut output).await;
                status
            }
        }
    };
    let mut output_tail = tail.into_lines();
    if timed_out {
        let secs = spec.timeout.map_or(0, |t| t.as_secs());
        output_tail.push(format!(
            "killed: the command did not finish in {secs} s, the most it may take"
        ));
        tracing::warn!(command = %command, timeout_s = secs, "command timed out; killed its process group");
        return CommandOutcome {
            command,
            success: false,
            exit_code: None,
            output_tail,
        };
    }
    match status {
        Ok(status) => CommandOutcome {
            command,
            success: status.success(),
            exit_code: status.code(),
            output_tail,
        },
        Err(e) => {
            output_tail.push(format!("cannot wait for the command: {e}"));
            CommandOutcome {
                command,
                success: false,
                exit_code: None,
                output_tail,
            }
        }
    }
}

/// Kills the process group a command leads (it was started as its own).
fn kill_group(pid: Option<u32>) {
    let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) else {
        return;
    };
    if let Err(e) = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    ) {
        tracing::warn!(pid, error = %e, "cannot kill the process group of a command that timed out");
    }
}

/// A pipe whose read end is async and whose write end goes to the child.
fn output_pipe() -> std::io::Result<(tokio::net::unix::pipe::Receiver, std::os::fd::OwnedFd)> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok((
        tokio::net::unix::pipe::Receiver::from_owned_fd(read)?,
        write,
    ))
}

async fn collect(stream: impl AsyncRead + Unpin, tail: &mut OutputTail, spec: &CommandSpec) {
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = String::from_utf8_lossy(&buf);
                let text = text.trim_end_matches(['\n', '\r']);
                let mut line = spec.redact_text(text);
                if line.chars().count() > MAX_LINE_CHARS {
                    line = line.chars().take(MAX_LINE_CHARS).collect::<String>() + "…";
                }
                tracing::debug!(program = %spec.program, "{line}");
                tail.push(line);
            }
        }
    }
}

/// Test support: waits up to 10 s for the process whose pid `pid_file`
/// holds to be gone (or a zombie), and kills it if it is not; returns the
/// pid and whether it was gone. SIGKILL is delivered at once, but the
/// kernel may take a moment.
#[cfg(test)]
pub(crate) async fn wait_gone(pid_file: &std::path::Path) -> (i32, bool) {
    let pid: i32 = std::fs::read_to_string(pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let gone = || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !gone() && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    let gone = gone();
    if !gone {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    (pid, gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_last_lines() {
        let mut tail = OutputTail::new(3);
        for i in 0..10 {
            tail.push(format!("line {i}"));
        }
        assert_eq!(tail.into_lines(), ["line 7", "line 8", "line 9"]);
        let mut short = OutputTail::new(30);
        short.push("only".into());
        assert_eq!(short.into_lines(), ["only"]);
        let mut none = OutputTail::new(0);
        none.push("x".into());
        assert!(none.into_lines().is_empty());
    }

    #[test]
    fn command_lines() {
        let root = Path::new("/");
        assert_eq!(
            kubeadm_bootstrap(
                "kubeadm",
                MachineRole::Init,
                "/etc/drover/kubeadm.yaml",
                root
            )
            .display(),
            "kubeadm init --config /etc/drover/kubeadm.yaml"
        );
        let chroot = Path::new("/var/tmp/m1 root");
        assert_eq!(
            kubeadm_bootstrap(
                "/usr/bin/kubeadm",
                MachineRole::ControlPlane,
                "/etc/drover/kubeadm.yaml",
                chroot
            )
            .display(),
            "/usr/bin/kubeadm join --config /etc/drover/kubeadm.yaml --rootfs '/var/tmp/m1 root'"
        );
        assert_eq!(
            kubeadm_bootstrap("kubeadm", MachineRole::Worker, "/k.yaml", Path::new("/r")).args,
            ["join", "--config", "/k.yaml", "--rootfs", "/r"]
        );
        let cri = drover_common::kubeadm::CRI_SOCKET;
        assert_eq!(
            kubeadm_reset("kubeadm", root).args,
            ["reset", "-f", "--cri-socket", cri]
        );
        assert_eq!(
            kubeadm_reset("kubeadm", Path::new("/r")).args,
            ["reset", "-f", "--cri-socket", cri, "--rootfs", "/r"]
        );
        let token: BootstrapToken = "abcdef.0123456789abcdef".parse().unwrap();
        let create = kubeadm_token_create("kubeadm", &token, 3600, Path::new("/r"));
        assert_eq!(
            create.args,
            [
                "token",
                "create",
                "abcdef.0123456789abcdef",
                "--ttl",
                "3600s",
                "--kubeconfig",
                "/r/etc/kubernetes/admin.conf"
            ]
        );
        assert_eq!(
            create.display(),
            "kubeadm token create abcdef.<redacted> --ttl 3600s --kubeconfig /r/etc/kubernetes/admin.conf"
        );
    }

    /// kubeadm upgrade writes the kubelet configuration again: it is given
    /// the machine's patches when the machine has them, and only then.
    #[test]
    fn upgrades_pass_the_machines_kubeadm_patches_when_it_has_them() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let shown = root.display().to_string();
        let upgrade = |command| kubeadm_upgrade("kubeadm", command, "v1.32.0", root).args;
        assert_eq!(
            upgrade(UpgradeCommand::Apply),
            ["upgrade", "apply", "v1.32.0", "-y", "--rootfs", &shown]
        );
        assert_eq!(
            upgrade(UpgradeCommand::Node),
            ["upgrade", "node", "--rootfs", &shown]
        );
        let patch = drover_common::kubeadm::KUBELET_CONFIG_PATCH_FILE;
        let patch = crate::files::safe_join(root, patch).unwrap();
        std::fs::create_dir_all(patch.parent().unwrap()).unwrap();
        std::fs::write(&patch, "healthzPort: 10300\n").unwrap();
        let patches = ["--patches", KUBEADM_PATCHES_DIR];
        assert_eq!(
            upgrade(UpgradeCommand::Apply),
            [
                &["upgrade", "apply", "v1.32.0", "-y"][..],
                &patches,
                &["--rootfs", &shown]
            ]
            .concat()
        );
        assert_eq!(
            upgrade(UpgradeCommand::Node),
            [&["upgrade", "node"][..], &patches, &["--rootfs", &shown]].concat()
        );
    }

    /// Under systemd a hook runs as a transient unit of its own, outside
    /// the agent unit's `NoNewPrivileges=yes` sandbox; elsewhere directly.
    #[test]
    fn hooks_run_outside_the_agent_units_sandbox_under_systemd() {
        let hooks = Path::new("/usr/lib/drover");
        let direct = upgrade_hook(
            hooks,
            "upgrade-kubelet",
            "v1.32.0",
            "kubeadm",
            Path::new("/r"),
            HookRunner::Direct,
        );
        assert_eq!(direct.display(), "/usr/lib/drover/upgrade-kubelet v1.32.0");
        assert_eq!(
            direct.env,
            [
                ("DROVER_ROOT".to_owned(), "/r".to_owned()),
                ("DROVER_KUBEADM".to_owned(), "kubeadm".to_owned())
            ]
        );
        assert_eq!(direct.timeout, Some(HOOK_TIMEOUT));
        let unit = upgrade_hook(
            hooks,
            "upgrade-kubelet",
            "v1.32.0",
            "/usr/bin/kubeadm",
            Path::new("/"),
            HookRunner::Systemd,
        );
        assert_eq!(unit.program, "systemd-run");
        assert_eq!(
            unit.args,
            [
                "--wait",
                "--pipe",
                "--collect",
                "--quiet",
                "--unit=drover-hook-upgrade-kubelet",
                "--description=Drover upgrade hook upgrade-kubelet v1.32.0",
                "--property=RuntimeMaxSec=600",
                "--setenv=DROVER_ROOT=/",
                "--setenv=DROVER_KUBEADM=/usr/bin/kubeadm",
                "--",
                "/usr/lib/drover/upgrade-kubelet",
                "v1.32.0",
            ]
        );
        // The unit gets its environment from systemd, not from the agent.
        assert!(unit.env.is_empty());
        assert_eq!(unit.timeout, Some(HOOK_TIMEOUT));
        // A test agent with a root of its own never asks systemd.
        assert_eq!(HookRunner::detect(Path::new("/tmp/m1")), HookRunner::Direct);
    }

    #[tokio::test(start_paused = true)]
    async fn a_descendant_holding_the_output_does_not_block() {
        let spec = CommandSpec::new("/bin/sh", &["-c", "sleep 5 & echo started"]);
        let outcome = run(&spec, OUTPUT_TAIL_LINES).await;
        assert!(outcome.success, "{outcome:?}");
    }

    #[tokio::test]
    async fn a_command_past_its_timeout_is_killed_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("child.pid");
        let mut spec = machine_command(
            &format!(
                "echo started; sleep 600 & echo $! > {}; wait",
                pid_file.display()
            ),
            dir.path(),
        );
        spec.timeout = Some(std::time::Duration::from_millis(300));
        let outcome = run(&spec, OUTPUT_TAIL_LINES).await;
        assert!(!outcome.success);
        assert_eq!(outcome.exit_code, None);
        assert_eq!(outcome.output_tail[0], "started");
        assert!(
            outcome
                .output_tail
                .last()
                .unwrap()
                .contains("did not finish in 0 s"),
            "{outcome:?}"
        );
        // The background child went with the group.
        let (pid, gone) = wait_gone(&pid_file).await;
        assert!(gone, "the group's sleep {pid} outlived the timeout");
    }

    #[tokio::test]
    async fn machine_commands_see_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let spec = machine_command("echo \"root=$DROVER_ROOT\"; exit 4", dir.path());
        assert_eq!(
            spec.display(),
            "/bin/sh -c 'echo \"root=$DROVER_ROOT\"; exit 4'"
        );
        let outcome = run(&spec, OUTPUT_TAIL_LINES).await;
        assert_eq!(outcome.exit_code, Some(4));
        assert_eq!(
            outcome.output_tail,
            [format!("root={}", dir.path().display())]
        );
    }

    #[tokio::test]
    async fn run_captures_combined_tail_and_exit_code() {
        let spec = CommandSpec {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                "for i in $(seq 1 40); do echo out $i; echo err $i >&2; done; echo secret-value >&2; exit 3".into(),
            ],
            redact: vec!["secret-value".into()],
            env: vec![],
            timeout: None,
        };
        let outcome = run(&spec, OUTPUT_TAIL_LINES).await;
        assert!(!outcome.success);
        assert_eq!(outcome.exit_code, Some(3));
        assert_eq!(outcome.output_tail.len(), OUTPUT_TAIL_LINES);
        // One pipe keeps the order: the last lines are exactly the last written.
        assert_eq!(
            outcome.output_tail[OUTPUT_TAIL_LINES - 3..],
            ["out 40", "err 40", "<redacted>"]
        );
        assert_eq!(outcome.output_tail[0], "err 26");
        assert!(outcome.summary().contains("exited with code 3"));

        let missing = CommandSpec::new("/nonexistent/kubeadm", &["init"]);
        let outcome = run(&missing, OUTPUT_TAIL_LINES).await;
        assert!(!outcome.success);
        assert_eq!(outcome.exit_code, None);
        assert!(outcome.output_tail[0].contains("cannot start /nonexistent/kubeadm"));
        assert_eq!(outcome.to_failure().command, "/nonexistent/kubeadm init");
    }
}
