//! Detached stand-in daemons: spawning them (the same binary re-executed with
//! a hidden subcommand, in its own session, output to a log file), their pid
//! files, waiting until they serve, and stopping them.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::util::{write_file, Root};

pub const PID_DIR: &str = "/run/standin";

pub fn pid_file(root: &Root, name: &str) -> PathBuf {
    root.path(format!("{PID_DIR}/{name}.pid"))
}

pub fn log_file(root: &Root, name: &str) -> PathBuf {
    root.path(format!("/var/log/standin-{name}.log"))
}

fn read_pid(path: &std::path::Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether `pid` is a live (not zombie) stand-in `name` daemon of this root.
pub fn is_our_daemon(pid: i32, name: &str, root: &Root) -> bool {
    if !alive(pid) {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let root_str = root.dir().to_string_lossy();
    args.iter().any(|a| a == &format!("__standin-{name}"))
        && args
            .windows(2)
            .any(|w| w[0] == "--rootfs" && w[1] == root_str.as_ref())
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// Runs daemon `name` (`serve`'s future), holding its pid file while it
/// runs: on this thread, or with `workers` worker threads.
pub fn run<F>(root: &Root, name: &str, workers: Option<usize>, serve: F) -> Result<()>
where
    F: std::future::Future<Output = Result<()>>,
{
    let rt = match workers {
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
    };
    rt.block_on(async {
        claim_pid_file(root, name)?;
        let result = serve.await;
        release_pid_file(root, name);
        result
    })
}

/// Called by a daemon at start: refuses to run twice for one root, then
/// records its own pid.
pub fn claim_pid_file(root: &Root, name: &str) -> Result<()> {
    let path = pid_file(root, name);
    if let Some(pid) = read_pid(&path) {
        if pid != std::process::id() as i32 && is_our_daemon(pid, name, root) {
            bail!("the stand-in {name} of this root is already running with pid {pid}");
        }
    }
    write_file(&path, format!("{}\n", std::process::id()).as_bytes(), 0o644)
}

/// Removes the pid file if it still names this process.
pub fn release_pid_file(root: &Root, name: &str) {
    let path = pid_file(root, name);
    if read_pid(&path) == Some(std::process::id() as i32) {
        let _ = std::fs::remove_file(path);
    }
}

/// Resolves when the daemon's pid file is gone or names another process
/// (reset removed it, or the whole root was deleted): a daemon never outlives
/// its machine.
pub async fn watchdog(root: Root, name: &'static str) {
    let path = pid_file(&root, name);
    let me = std::process::id() as i32;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if read_pid(&path) != Some(me) {
            println!(
                "standin-{name}: pid file {} is gone; exiting",
                path.display()
            );
            return;
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn termination() -> Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

/// Hands every connection accepted on `listener` to `on_accept` until a
/// termination signal or the [`watchdog`] ends daemon `name`.
pub async fn accept_until_stopped(
    root: &Root,
    name: &'static str,
    listener: &tokio::net::TcpListener,
    mut on_accept: impl FnMut(tokio::net::TcpStream),
) -> Result<()> {
    let watchdog = watchdog(root.clone(), name);
    tokio::pin!(watchdog);
    let term = termination();
    tokio::pin!(term);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                on_accept(tcp);
            }
            sig = &mut term => {
                println!("standin-{name}: received {}, shutting down", sig?);
                return Ok(());
            }
            _ = &mut watchdog => return Ok(()),
        }
    }
}

/// Starts `kubeadm __standin-<name> --rootfs ROOT <args>` detached: its own
/// session, stdin from /dev/null, output appended to the daemon's log.
pub fn spawn(root: &Root, name: &str, args: &[String]) -> Result<Child> {
    let exe = crate::util::program();
    let log_path = log_file(root, name);
    if let Some(dir) = log_path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let log2 = log.try_clone()?;
    let mut cmd = Command::new(exe);
    cmd.arg(format!("__standin-{name}"))
        .arg("--rootfs")
        .arg(root.dir())
        .args(args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()
                .map(|_| ())
                .map_err(std::io::Error::from)
        });
    }
    cmd.spawn()
        .with_context(|| format!("cannot start the stand-in {name}"))
}

/// The last lines of a daemon's log, for error messages.
pub fn log_tail(root: &Root, name: &str) -> String {
    let path = log_file(root, name);
    let Ok(mut f) = std::fs::File::open(&path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(2000)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// Waits until `probe` succeeds, failing early if the daemon exits.
pub async fn wait_ready<F, Fut>(
    child: &mut Child,
    root: &Root,
    name: &str,
    timeout: Duration,
    mut probe: F,
) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<(), String>>,
{
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "the stand-in {name} exited during startup ({status}); its log {} ends with:\n{}",
                log_file(root, name).display(),
                log_tail(root, name)
            );
        }
        let last = match probe().await {
            Ok(()) => return Ok(start.elapsed()),
            Err(e) => e,
        };
        if start.elapsed() >= timeout {
            return Err(anyhow!(
                "the stand-in {name} (pid {}) did not become healthy within {:?}: {last}",
                child.id(),
                timeout
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Stops every stand-in daemon of this root: SIGTERM, up to 5 s, SIGKILL.
/// Pid files naming other processes are only removed. Returns what it did.
pub fn stop_all(root: &Root) -> Vec<String> {
    let mut report = Vec::new();
    let dir = root.path(PID_DIR);
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return report;
    };
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pid"))
        .collect();
    files.sort();
    for path in files {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(pid) = read_pid(&path) {
            if is_our_daemon(pid, &name, root) {
                report.push(stop_pid(pid, &name));
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    report
}

/// Stops the stand-in daemon `name` of `root`, if it runs; says what it did.
pub fn stop(root: &Root, name: &str) -> Option<String> {
    let pid = read_pid(&pid_file(root, name))?;
    is_our_daemon(pid, name, root).then(|| stop_pid(pid, name))
}

fn stop_pid(pid: i32, name: &str) -> String {
    let p = Pid::from_raw(pid);
    let _ = kill(p, Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if !alive(pid) {
            return format!("stopped the stand-in {name} (pid {pid})");
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = kill(p, Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && alive(pid) {
        std::thread::sleep(Duration::from_millis(25));
    }
    format!("killed the stand-in {name} (pid {pid}) after it ignored SIGTERM for 5s")
}
