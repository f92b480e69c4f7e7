//! Small helpers: the root filesystem, file writing, Go durations, versions,
//! addresses, phases and preflight reporting.

use std::collections::BTreeSet;
use std::fmt;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

/// An error that happened inside a kubeadm workflow phase, printed as
/// `error execution phase <phase>: <message>`.
#[derive(Debug)]
pub struct PhaseError {
    pub phase: String,
    pub message: String,
}

impl fmt::Display for PhaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error execution phase {}: {}", self.phase, self.message)
    }
}

impl std::error::Error for PhaseError {}

/// Attaches a phase to an error (unless it already has one).
pub trait InPhase<T> {
    fn in_phase(self, phase: &str) -> Result<T>;
}

impl<T, E: Into<anyhow::Error>> InPhase<T> for std::result::Result<T, E> {
    fn in_phase(self, phase: &str) -> Result<T> {
        self.map_err(|e| {
            let e: anyhow::Error = e.into();
            if e.is::<PhaseError>() {
                e
            } else {
                PhaseError {
                    phase: phase.to_owned(),
                    message: format!("{e:#}"),
                }
                .into()
            }
        })
    }
}

/// Builds a phase error directly.
pub fn phase_err(phase: &str, message: impl fmt::Display) -> anyhow::Error {
    PhaseError {
        phase: phase.to_owned(),
        message: message.to_string(),
    }
    .into()
}

/// The machine's root filesystem (`--rootfs`, `/` without it). Every
/// absolute path kubeadm touches resolves under it, as after kubeadm's chroot.
#[derive(Debug, Clone)]
pub struct Root(pub PathBuf);

impl Root {
    /// Resolves a path as kubeadm sees it (absolute, inside the root) to the
    /// host path. Relative paths stay relative to the working directory.
    pub fn path(&self, p: impl AsRef<Path>) -> PathBuf {
        let p = p.as_ref();
        match p.strip_prefix("/") {
            Ok(rel) => self.0.join(rel),
            Err(_) => p.to_path_buf(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.0
    }
}

/// Writes a file (creating parent directories) atomically with the mode.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id()
    ));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(contents)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Parses a Go `time.Duration` string (`900s`, `15m0s`, `24h0m0s`, `1h30m`,
/// `1.5h`, `0`), returning nanoseconds. Mirrors Go's `time.ParseDuration`.
pub fn parse_go_duration(input: &str) -> Result<i128> {
    let invalid = || anyhow!("time: invalid duration {input:?}");
    let mut s = input;
    let mut neg = false;
    if let Some(rest) = s.strip_prefix('-') {
        neg = true;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: i128 = 0;
    while !s.is_empty() {
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let int_part = &s[..int_len];
        s = &s[int_len..];
        let mut frac_part = "";
        if let Some(rest) = s.strip_prefix('.') {
            let frac_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &rest[..frac_len];
            s = &rest[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }
        let unit_len = s
            .bytes()
            .take_while(|b| *b != b'.' && !b.is_ascii_digit())
            .count();
        if unit_len == 0 {
            return Err(anyhow!("time: missing unit in duration {input:?}"));
        }
        let unit = &s[..unit_len];
        s = &s[unit_len..];
        let scale: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(anyhow!("time: unknown unit {unit:?} in duration {input:?}")),
        };
        let int_val: i128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| invalid())?
        };
        let mut value = int_val.checked_mul(scale).ok_or_else(invalid)?;
        if !frac_part.is_empty() {
            let digits = frac_part.len().min(30) as u32;
            let frac: i128 = frac_part[..digits as usize]
                .parse()
                .map_err(|_| invalid())?;
            value += frac * scale / 10i128.pow(digits);
        }
        total = total.checked_add(value).ok_or_else(invalid)?;
        if total > i64::MAX as i128 {
            return Err(invalid());
        }
    }
    Ok(if neg { -total } else { total })
}

/// A non-negative Go duration as `std::time::Duration`.
pub fn parse_go_duration_std(input: &str) -> Result<std::time::Duration> {
    let ns = parse_go_duration(input)?;
    if ns < 0 {
        bail!("duration {input:?} must not be negative");
    }
    Ok(std::time::Duration::from_nanos(ns as u64))
}

/// Formats a duration the way Go prints it (`24h0m0s`, `1.5s`).
pub fn format_go_duration(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let frac = d.subsec_nanos();
    let sec = if frac == 0 {
        format!("{s}s")
    } else {
        let f = format!("{:09}", frac);
        format!("{s}.{}s", f.trim_end_matches('0'))
    };
    if h > 0 {
        format!("{h}h{m}m{sec}")
    } else if m > 0 {
        format!("{m}m{sec}")
    } else {
        sec
    }
}

/// A parsed Kubernetes version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

pub fn parse_version(v: &str) -> Result<Version> {
    let s = v.strip_prefix('v').unwrap_or(v);
    let core = s.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    let num = |p: &str| -> Option<u64> {
        (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
    };
    match parts.as_slice() {
        [a, b, c] => match (num(a), num(b), num(c)) {
            (Some(major), Some(minor), Some(patch)) => Ok(Version {
                major,
                minor,
                patch,
            }),
            _ => bail!("could not parse {v:?} as version"),
        },
        _ => bail!("could not parse {v:?} as version"),
    }
}

/// The environment variable that sets the stand-in's version for one run.
pub const VERSION_ENV: &str = "DROVER_STANDIN_KUBEADM_VERSION";

/// The version this stand-in kubeadm (and the kubelet it runs) claims to
/// be: `$DROVER_STANDIN_KUBEADM_VERSION`, else the first line of
/// `kubeadm.version` next to the executable (how a per-version node image
/// says which kubeadm it holds, as a real image holds that version's
/// binary, and what the `upgrade-kubeadm` hook rewrites), else the
/// built-in v1.31.2.
pub fn kubeadm_version_string() -> String {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION
        .get_or_init(|| {
            let from_env = std::env::var(VERSION_ENV).ok().filter(|v| !v.is_empty());
            from_env.map_or_else(|| installed_versions(&program_dir()).0, |v| with_v(&v))
        })
        .clone()
}

/// The version the stand-in kubelet reports in its Node's `nodeInfo`:
/// the first line of `kubelet.version` next to the executable (what the
/// `upgrade-kubelet` hook writes), else the kubeadm version.
pub fn kubelet_version_string() -> String {
    read_version(&program_dir().join(KUBELET_VERSION_FILE)).unwrap_or_else(kubeadm_version_string)
}

/// The files next to the stand-in that say which kubeadm and kubelet a
/// machine has installed.
pub const KUBEADM_VERSION_FILE: &str = "kubeadm.version";
pub const KUBELET_VERSION_FILE: &str = "kubelet.version";

/// The kubeadm and kubelet versions installed in `dir` (the directory of a
/// stand-in kubeadm), by its version files; the built-in version where
/// there is none.
pub fn installed_versions(dir: &Path) -> (String, String) {
    let kubeadm = read_version(&dir.join(KUBEADM_VERSION_FILE))
        .unwrap_or_else(|| crate::KUBEADM_VERSION.to_owned());
    let kubelet = read_version(&dir.join(KUBELET_VERSION_FILE)).unwrap_or_else(|| kubeadm.clone());
    (kubeadm, kubelet)
}

fn read_version(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .next()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(with_v)
}

fn with_v(v: &str) -> String {
    if v.starts_with('v') {
        v.to_owned()
    } else {
        format!("v{v}")
    }
}

/// The stand-in executable its daemons run as: this process's own, unless
/// a hook (another copy of the binary) set the kubeadm it serves.
pub fn program() -> PathBuf {
    PROGRAM
        .get()
        .cloned()
        .or_else(|| std::env::current_exe().ok())
        .unwrap_or_else(|| PathBuf::from("kubeadm"))
}

/// Makes [`program`] name `path` (the upgrade hooks do, so the kubelet they
/// restart is the kubeadm installation's, not the hook's copy).
pub fn set_program(path: PathBuf) {
    let _ = PROGRAM.set(path);
}

static PROGRAM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

fn program_dir() -> PathBuf {
    program()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// [`kubeadm_version_string`], parsed; a version that does not parse is a
/// broken image, reported once and replaced by the built-in one.
pub fn kubeadm_version() -> Version {
    let v = kubeadm_version_string();
    parse_version(&v).unwrap_or_else(|e| {
        eprintln!("stand-in kubeadm: ignoring its configured version: {e}");
        parse_version(crate::KUBEADM_VERSION).expect("built-in version parses")
    })
}

/// kubeadm v1.N deploys control planes of v1.(N-1).x and v1.N.x.
pub fn check_control_plane_version(v: &str) -> Result<Version> {
    if v.is_empty() {
        bail!("kubernetesVersion is empty: the stand-in kubeadm needs an explicit version such as v1.31.2 (it cannot fetch version labels from dl.k8s.io)");
    }
    if v.starts_with("stable") || v.starts_with("latest") || v.starts_with("ci/") {
        bail!("the stand-in kubeadm cannot resolve the version label {v:?} (real kubeadm fetches it from dl.k8s.io): set an explicit kubernetesVersion such as v1.31.2");
    }
    let parsed = parse_version(v)?;
    let me = kubeadm_version();
    let min = Version {
        major: me.major,
        minor: me.minor.saturating_sub(1),
        patch: 0,
    };
    if parsed < min {
        bail!(
            "this version of kubeadm only supports deploying clusters with the control plane version >= {}.{}.0. Current version: {v}",
            min.major,
            min.minor
        );
    }
    if parsed.major != me.major || parsed.minor > me.minor {
        bail!(
            "this version of kubeadm ({}) only supports deploying clusters with the control plane version <= {}.{}.x; Kubernetes version is greater than kubeadm version. Current version: {v}",
            kubeadm_version_string(),
            me.major,
            me.minor
        );
    }
    Ok(parsed)
}

/// Splits `host:port`, `[v6]:port`, `host` or `[v6]`.
pub fn split_host_port(s: &str) -> Result<(String, Option<u16>)> {
    let bad = || anyhow!("invalid address {s:?}: expected host or host:port");
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(bad)?;
        if after.is_empty() {
            return Ok((host.to_owned(), None));
        }
        let port = after.strip_prefix(':').ok_or_else(bad)?;
        return Ok((host.to_owned(), Some(port.parse().map_err(|_| bad())?)));
    }
    if s.matches(':').count() > 1 {
        // A bare IPv6 address.
        return Ok((s.to_owned(), None));
    }
    match s.split_once(':') {
        Some((host, port)) if !host.is_empty() => {
            Ok((host.to_owned(), Some(port.parse().map_err(|_| bad())?)))
        }
        Some(_) => Err(bad()),
        None if s.is_empty() => Err(bad()),
        None => Ok((s.to_owned(), None)),
    }
}

/// `host:port`, bracketing IPv6 hosts.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The `n`th address of a CIDR (n=1: first usable, kubeadm's service IP).
pub fn cidr_nth_ip(cidr: &str, n: u128) -> Result<IpAddr> {
    let (addr, bits) = cidr
        .split_once('/')
        .ok_or_else(|| anyhow!("invalid CIDR address: {cidr}"))?;
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| anyhow!("invalid CIDR address: {cidr}"))?;
    let bits: u32 = bits
        .parse()
        .map_err(|_| anyhow!("invalid CIDR address: {cidr}"))?;
    // Both families as 128-bit numbers of `width` bits.
    let (width, value) = match addr {
        IpAddr::V4(v4) => (32, u128::from(u32::from(v4))),
        IpAddr::V6(v6) => (128, u128::from(v6)),
    };
    if bits > width {
        bail!("invalid CIDR address: {cidr}");
    }
    let host_bits = width - bits;
    let net = if host_bits == 128 {
        0
    } else {
        value >> host_bits << host_bits
    };
    if host_bits < 128 && n >= (1u128 << host_bits) {
        bail!("CIDR {cidr} is too small");
    }
    Ok(match addr {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from((net + n) as u32)),
        IpAddr::V6(_) => IpAddr::V6((net + n).into()),
    })
}

/// This host's name, lowercased, as kubeadm's default node name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_lowercase())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

pub const INIT_PHASES: &[&str] = &[
    "preflight",
    "certs",
    "certs/all",
    "certs/ca",
    "certs/apiserver",
    "certs/apiserver-kubelet-client",
    "certs/front-proxy-ca",
    "certs/front-proxy-client",
    "certs/etcd-ca",
    "certs/etcd-server",
    "certs/etcd-peer",
    "certs/etcd-healthcheck-client",
    "certs/apiserver-etcd-client",
    "certs/sa",
    "kubeconfig",
    "kubeconfig/all",
    "kubeconfig/admin",
    "kubeconfig/super-admin",
    "kubeconfig/kubelet",
    "kubeconfig/controller-manager",
    "kubeconfig/scheduler",
    "etcd",
    "etcd/local",
    "control-plane",
    "control-plane/all",
    "control-plane/apiserver",
    "control-plane/controller-manager",
    "control-plane/scheduler",
    "kubelet-start",
    "wait-control-plane",
    "upload-config",
    "upload-config/all",
    "upload-config/kubeadm",
    "upload-config/kubelet",
    "upload-certs",
    "mark-control-plane",
    "bootstrap-token",
    "kubelet-finalize",
    "kubelet-finalize/all",
    "kubelet-finalize/enable-client-cert-rotation",
    "addon",
    "addon/all",
    "addon/coredns",
    "addon/kube-proxy",
    "show-join-command",
];

pub const JOIN_PHASES: &[&str] = &[
    "preflight",
    "control-plane-prepare",
    "control-plane-prepare/all",
    "control-plane-prepare/download-certs",
    "control-plane-prepare/certs",
    "control-plane-prepare/kubeconfig",
    "control-plane-prepare/control-plane",
    "kubelet-start",
    "control-plane-join",
    "control-plane-join/all",
    "control-plane-join/etcd",
    "control-plane-join/update-status",
    "control-plane-join/mark-control-plane",
    "wait-control-plane",
];

/// The phases to skip (from `--skip-phases` and the config's `skipPhases`).
#[derive(Debug, Default)]
pub struct SkipPhases(BTreeSet<String>);

impl SkipPhases {
    pub fn new(known: &[&str], lists: &[&[String]]) -> Result<Self> {
        let mut set = BTreeSet::new();
        for list in lists {
            for p in list.iter() {
                let p = p.trim();
                if p.is_empty() {
                    continue;
                }
                if !known.contains(&p) {
                    bail!(
                        "unknown phase {p:?} in skip-phases; the phases are: {}",
                        known.join(", ")
                    );
                }
                set.insert(p.to_owned());
            }
        }
        Ok(Self(set))
    }

    /// Whether `phase` (such as `certs/apiserver`) is skipped, directly, by
    /// its parent, or by `parent/all`.
    pub fn skipped(&self, phase: &str) -> bool {
        if self.0.contains(phase) {
            return true;
        }
        if let Some((parent, _)) = phase.split_once('/') {
            return self.0.contains(parent) || self.0.contains(&format!("{parent}/all"));
        }
        false
    }
}

/// The preflight checks to turn into warnings.
#[derive(Debug, Default)]
pub struct IgnoreSet {
    all: bool,
    names: BTreeSet<String>,
}

impl IgnoreSet {
    pub fn new(lists: &[&[String]]) -> Result<Self> {
        let mut names = BTreeSet::new();
        for list in lists {
            for n in list.iter() {
                let n = n.trim().to_lowercase();
                if !n.is_empty() {
                    names.insert(n);
                }
            }
        }
        let all = names.contains("all");
        if all && names.len() > 1 {
            bail!("ignore-preflight-errors: Invalid value: {:?}: don't specify individual checks if 'all' is used", names.iter().cloned().collect::<Vec<_>>().join(","));
        }
        Ok(Self { all, names })
    }

    fn ignores(&self, check: &str) -> bool {
        self.all || self.names.contains(&check.to_lowercase())
    }
}

/// Collects preflight errors, then reports them as kubeadm does.
#[derive(Debug, Default)]
pub struct Preflight {
    errors: Vec<(String, String)>,
}

impl Preflight {
    pub fn error(&mut self, check: impl Into<String>, message: impl Into<String>) {
        self.errors.push((check.into(), message.into()));
    }

    /// `FileAvailable--etc-kubernetes-...` for a path that must not exist.
    pub fn file_available(&mut self, root: &Root, logical: &str) {
        if root.path(logical).exists() {
            self.error(
                format!("FileAvailable-{}", logical.replace('/', "-")),
                format!("{logical} already exists"),
            );
        }
    }

    /// `DirAvailable--...` for a directory that must be absent or empty.
    pub fn dir_available(&mut self, root: &Root, logical: &str) {
        let host = root.path(logical);
        if let Ok(mut rd) = std::fs::read_dir(&host) {
            if rd.next().is_some() {
                self.error(
                    format!("DirAvailable-{}", logical.replace('/', "-")),
                    format!("{logical} is not empty"),
                );
            }
        }
    }

    /// `Port-N`: the address must be bindable.
    pub fn port(&mut self, host: &str, port: u16) {
        let addr = join_host_port(host, port);
        match std::net::TcpListener::bind(&addr) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                self.error(format!("Port-{port}"), format!("Port {port} is in use"));
            }
            Err(e) => {
                self.error(format!("Port-{port}"), format!("cannot bind {addr}: {e}"));
            }
        }
    }

    pub fn finish(self, ignore: &IgnoreSet) -> Result<()> {
        let mut fatal = Vec::new();
        for (check, msg) in self.errors {
            if ignore.ignores(&check) {
                println!("\t[WARNING {check}]: {msg}");
            } else {
                fatal.push(format!("\t[ERROR {check}]: {msg}"));
            }
        }
        if fatal.is_empty() {
            return Ok(());
        }
        Err(phase_err(
            "preflight",
            format!(
                "[preflight] Some fatal errors occurred:\n{}\n[preflight] If you know what you are doing, you can make a check non-fatal with `--ignore-preflight-errors=...`",
                fatal.join("\n")
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let s = 1_000_000_000i128;
        assert_eq!(parse_go_duration("900s").unwrap(), 900 * s);
        assert_eq!(parse_go_duration("15m0s").unwrap(), 900 * s);
        assert_eq!(parse_go_duration("24h0m0s").unwrap(), 86400 * s);
        assert_eq!(parse_go_duration("1h").unwrap(), 3600 * s);
        assert_eq!(parse_go_duration("1.5h").unwrap(), 5400 * s);
        assert_eq!(parse_go_duration("0").unwrap(), 0);
        assert_eq!(parse_go_duration("-1m").unwrap(), -60 * s);
        assert_eq!(parse_go_duration("300ms").unwrap(), 300_000_000);
        assert!(parse_go_duration("10").is_err());
        assert!(parse_go_duration("1d").is_err());
        assert!(parse_go_duration("").is_err());
        assert!(parse_go_duration("h").is_err());
        assert_eq!(
            format_go_duration(std::time::Duration::from_secs(86400)),
            "24h0m0s"
        );
        assert_eq!(
            format_go_duration(std::time::Duration::from_secs(61)),
            "1m1s"
        );
    }

    #[test]
    fn versions_and_addresses() {
        assert!(check_control_plane_version("v1.31.2").is_ok());
        assert!(check_control_plane_version("v1.30.0").is_ok());
        assert!(check_control_plane_version("v1.29.9").is_err());
        assert!(check_control_plane_version("v1.32.0").is_err());
        assert!(check_control_plane_version("stable").is_err());
        assert_eq!(
            split_host_port("10.0.0.1:6443").unwrap(),
            ("10.0.0.1".into(), Some(6443))
        );
        assert_eq!(
            split_host_port("[::1]:6443").unwrap(),
            ("::1".into(), Some(6443))
        );
        assert_eq!(
            split_host_port("cp.example").unwrap(),
            ("cp.example".into(), None)
        );
        assert_eq!(
            cidr_nth_ip("10.96.0.0/12", 1).unwrap().to_string(),
            "10.96.0.1"
        );
        assert_eq!(
            cidr_nth_ip("10.96.0.0/12", 10).unwrap().to_string(),
            "10.96.0.10"
        );
        assert_eq!(cidr_nth_ip("fd00::/108", 1).unwrap().to_string(), "fd00::1");
    }
}
