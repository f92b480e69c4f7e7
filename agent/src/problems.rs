//! Node problems: what the agent's checks see wrong with its machine
//! besides its probes, reported with every heartbeat as
//! [`NodeProblem`]s (the coordinator keeps each as a machine condition).
//!
//! The checks, in order:
//! - **ReadOnlyFilesystem**: the machine's root, the kubelet's directory
//!   (`/var/lib/kubelet`) or containerd's (`/var/lib/containerd`) is on a
//!   file system mounted read-only (`statvfs`'s `ST_RDONLY`), as a kernel
//!   remounts one after an I/O error (node-problem-detector's
//!   `ReadonlyFilesystem`).
//! - **DiskPressure**: free space or free inodes of the kubelet's
//!   directory (the kubelet's `nodefs`) or containerd's (`imagefs`) below
//!   the eviction bounds.
//! - **MemoryPressure**: `MemAvailable` of `/proc/meminfo` below the
//!   `memory.available` bound.
//! - **ClockSkew**: this machine's clock off the coordinator's by more
//!   than `--max-clock-offset` (10 s by default), measured from the `Date`
//!   of the coordinator's answers and judged only beyond what the
//!   measurement cannot tell (half the round trip, and the second `Date`
//!   is rounded to): certificates, tokens and etcd leases all assume
//!   clocks that agree.
//! - **PIDPressure**: process IDs left (`/proc/sys/kernel/pid_max` less
//!   the tasks `/proc/loadavg` counts, as the kubelet's
//!   `pkg/kubelet/stats/pidlimit/pidlimit_linux.go` reads them) below the
//!   `pid.available` bound.
//!
//! The bounds are the kubelet's `--eviction-hard` (`--eviction-hard` of
//! the agent takes the same text), defaulting to the kubelet's own
//! defaults (`DefaultEvictionHard`, `pkg/kubelet/eviction/defaults_linux.go`:
//! `memory.available<100Mi`, `nodefs.available<10%`,
//! `nodefs.inodesFree<5%`, `imagefs.available<15%`, and
//! `imagefs.inodesFree<5%`) and `pid.available<10%`, which the kubelet
//! leaves unset: so the machine's condition turns when its kubelet starts
//! to evict. [`judge`] is pure; [`sample`] does the reading.

use std::path::{Path, PathBuf};

use std::time::{Duration, SystemTime};

use drover_common::objects::{
    NodeProblem, CLOCK_SKEW, DISK_PRESSURE, MEMORY_PRESSURE, PID_PRESSURE, READ_ONLY_FILESYSTEM,
};

/// How far the coordinator's clock was from this machine's at one answer:
/// `offset_ms` is the coordinator's time less this machine's (positive:
/// this clock is behind), known to within `uncertainty_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockReading {
    pub offset_ms: i64,
    pub uncertainty_ms: i64,
}

impl ClockReading {
    /// The reading of a request sent at `sent` and answered at `received`
    /// (this clock) with `date` (the coordinator's, whole seconds): the
    /// answer was dated somewhere in the round trip, and its true time in
    /// the second after `date`.
    pub fn of(sent: SystemTime, received: SystemTime, date: SystemTime) -> Self {
        let ms = |t: SystemTime| match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => d.as_millis() as i64,
            Err(e) => -(e.duration().as_millis() as i64),
        };
        let (sent, received) = (ms(sent), ms(received).max(ms(sent)));
        let midpoint = sent + (received - sent) / 2;
        ClockReading {
            offset_ms: ms(date) + 500 - midpoint,
            uncertainty_ms: (received - sent) / 2 + 500,
        }
    }
}

/// One bound: below this much, or below this share of the whole.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// An absolute amount (bytes, inodes, process IDs).
    Amount(u64),
    /// A percentage of the whole (0–100).
    Percent(f64),
}

impl Bound {
    /// Whether `available` of `total` is below the bound.
    fn crossed(self, available: u64, total: u64) -> bool {
        match self {
            Bound::Amount(a) => available < a,
            Bound::Percent(p) => total > 0 && (available as f64) * 100.0 < p * total as f64,
        }
    }

    fn describe(self, unit: &str) -> String {
        match self {
            Bound::Amount(a) if unit == "bytes" => format!("{} MiB", a >> 20),
            Bound::Amount(a) => format!("{a} {unit}"),
            Bound::Percent(p) => format!("{p}%"),
        }
    }
}

/// `--max-clock-offset`'s default.
pub const DEFAULT_MAX_CLOCK_OFFSET: Duration = Duration::from_secs(10);

/// The eviction bounds, by the kubelet's signal names, and the clock's.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounds {
    /// How far this clock may be from the coordinator's
    /// (`--max-clock-offset`).
    pub clock_offset: Duration,
    pub memory_available: Bound,
    pub nodefs_available: Bound,
    pub nodefs_inodes_free: Bound,
    pub imagefs_available: Bound,
    pub imagefs_inodes_free: Bound,
    pub pid_available: Bound,
}

impl Default for Bounds {
    /// The kubelet's `DefaultEvictionHard`, and 10% of process IDs.
    fn default() -> Self {
        Bounds {
            clock_offset: DEFAULT_MAX_CLOCK_OFFSET,
            memory_available: Bound::Amount(100 << 20),
            nodefs_available: Bound::Percent(10.0),
            nodefs_inodes_free: Bound::Percent(5.0),
            imagefs_available: Bound::Percent(15.0),
            imagefs_inodes_free: Bound::Percent(5.0),
            pid_available: Bound::Percent(10.0),
        }
    }
}

/// Why an `--eviction-hard` value was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BoundsError {
    #[error("'{0}' is not SIGNAL<QUANTITY (e.g. memory.available<100Mi or nodefs.available<10%)")]
    Shape(String),
    #[error("unknown eviction signal '{0}'; known: memory.available, nodefs.available, nodefs.inodesFree, imagefs.available, imagefs.inodesFree, pid.available")]
    Signal(String),
    #[error("'{0}' is not a quantity: a percentage up to 100% or a whole amount with an optional suffix Ki, Mi, Gi, Ti, k, M, G or T")]
    Quantity(String),
}

impl std::str::FromStr for Bounds {
    type Err = BoundsError;

    /// The kubelet's `--eviction-hard` text: `SIGNAL<QUANTITY` items
    /// separated by commas; signals left out keep their defaults.
    fn from_str(text: &str) -> Result<Self, BoundsError> {
        let mut bounds = Bounds::default();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (signal, quantity) = item
                .split_once('<')
                .ok_or_else(|| BoundsError::Shape(item.to_owned()))?;
            let bound = quantity_bound(quantity.trim())?;
            let slot = match signal.trim() {
                "memory.available" => &mut bounds.memory_available,
                "nodefs.available" => &mut bounds.nodefs_available,
                "nodefs.inodesFree" => &mut bounds.nodefs_inodes_free,
                "imagefs.available" => &mut bounds.imagefs_available,
                "imagefs.inodesFree" => &mut bounds.imagefs_inodes_free,
                "pid.available" => &mut bounds.pid_available,
                other => return Err(BoundsError::Signal(other.to_owned())),
            };
            *slot = bound;
        }
        Ok(bounds)
    }
}

fn quantity_bound(q: &str) -> Result<Bound, BoundsError> {
    let bad = || BoundsError::Quantity(q.to_owned());
    if let Some(p) = q.strip_suffix('%') {
        let p: f64 = p.parse().map_err(|_| bad())?;
        return if (0.0..=100.0).contains(&p) {
            Ok(Bound::Percent(p))
        } else {
            Err(bad())
        };
    }
    let digits = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (number, suffix) = q.split_at(digits);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let scale: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(scale).map(Bound::Amount).ok_or_else(bad)
}

/// One file system as `statvfs` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Filesystem {
    pub read_only: bool,
    pub bytes_free: u64,
    pub bytes_total: u64,
    pub inodes_free: u64,
    pub inodes_total: u64,
}

/// What the checks read: each file system by the directory it was read
/// for, memory and process IDs (None where it could not be read).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    pub root: Option<Filesystem>,
    pub nodefs: Option<(PathBuf, Filesystem)>,
    pub imagefs: Option<(PathBuf, Filesystem)>,
    /// `MemAvailable` and `MemTotal`, in bytes.
    pub memory: Option<(u64, u64)>,
    /// Process IDs in use and `pid_max`.
    pub pids: Option<(u64, u64)>,
    /// The coordinator's clock against this one (none answered yet).
    pub clock: Option<ClockReading>,
}

/// The problems a sample shows under `bounds`, at most one per type.
/// Messages name the bound crossed and the whole, never the amount left:
/// that moves with every write, and a message that changed would make
/// every heartbeat a change the coordinator stores (the amount of disk
/// left is in the report's `diskFreeBytes`, quantized).
pub fn judge(sample: &Sample, bounds: &Bounds) -> Vec<NodeProblem> {
    let mut out = Vec::new();
    let mut read_only: Vec<String> = Vec::new();
    if sample.root.is_some_and(|f| f.read_only) {
        read_only.push("/".into());
    }
    for (dir, fs) in [&sample.nodefs, &sample.imagefs].into_iter().flatten() {
        if fs.read_only {
            read_only.push(dir.display().to_string());
        }
    }
    if !read_only.is_empty() {
        out.push(problem(
            READ_ONLY_FILESYSTEM,
            "FilesystemIsReadOnly",
            format!(
                "mounted read-only: {}; nothing there can be written",
                read_only.join(", ")
            ),
        ));
    }
    let mut disk: Vec<String> = Vec::new();
    let filesystems = [
        (
            &sample.nodefs,
            "nodefs",
            bounds.nodefs_available,
            bounds.nodefs_inodes_free,
        ),
        (
            &sample.imagefs,
            "imagefs",
            bounds.imagefs_available,
            bounds.imagefs_inodes_free,
        ),
    ];
    for (fs, signal, space, inodes) in filesystems {
        let Some((dir, fs)) = fs else { continue };
        if space.crossed(fs.bytes_free, fs.bytes_total) {
            disk.push(format!(
                "{} ({signal}, {} MiB): free space below {signal}.available<{}",
                dir.display(),
                fs.bytes_total >> 20,
                space.describe("bytes")
            ));
        }
        if inodes.crossed(fs.inodes_free, fs.inodes_total) {
            disk.push(format!(
                "{} ({signal}, {} inodes): free inodes below {signal}.inodesFree<{}",
                dir.display(),
                fs.inodes_total,
                inodes.describe("inodes")
            ));
        }
    }
    if !disk.is_empty() {
        let reason = if disk.iter().all(|d| d.contains("inodes")) {
            "InodesLow"
        } else {
            "DiskSpaceLow"
        };
        out.push(problem(DISK_PRESSURE, reason, disk.join("; ")));
    }
    if let Some((available, total)) = sample.memory {
        if bounds.memory_available.crossed(available, total) {
            out.push(problem(
                MEMORY_PRESSURE,
                "MemoryLow",
                format!(
                    "MemAvailable below memory.available<{} (MemTotal {} MiB)",
                    bounds.memory_available.describe("bytes"),
                    total >> 20
                ),
            ));
        }
    }
    if let Some(c) = sample.clock {
        let bound = bounds.clock_offset.as_millis() as i64;
        if c.offset_ms.abs() - c.uncertainty_ms > bound {
            let way = if c.offset_ms > 0 {
                "behind"
            } else {
                "ahead of"
            };
            out.push(problem(
                CLOCK_SKEW,
                "ClockOffsetLarge",
                format!(
                    "this machine's clock is {way} the coordinator's by more than --max-clock-offset {} s; make it keep time (NTP)",
                    bounds.clock_offset.as_secs_f64()
                ),
            ));
        }
    }
    if let Some((used, max)) = sample.pids {
        let left = max.saturating_sub(used);
        if bounds.pid_available.crossed(left, max) {
            out.push(problem(
                PID_PRESSURE,
                "ProcessIdsLow",
                format!(
                    "process IDs left below pid.available<{} (pid_max {max})",
                    bounds.pid_available.describe("process IDs")
                ),
            ));
        }
    }
    out
}

fn problem(type_: &str, reason: &str, message: String) -> NodeProblem {
    NodeProblem {
        type_: type_.into(),
        reason: reason.into(),
        message,
    }
}

/// Reads what the checks need for the machine whose root is `root`; what
/// cannot be read is left out (and logged at debug), never guessed.
pub fn sample(root: &Path) -> Sample {
    let dir = |rel: &str| {
        let wanted = root.join(rel);
        // A directory not made yet is on its nearest parent's file system.
        let existing = wanted
            .ancestors()
            .find(|p| p.exists())
            .map(Path::to_path_buf)?;
        Some((Path::new("/").join(rel), filesystem(&existing)?))
    };
    Sample {
        root: filesystem(root),
        nodefs: dir("var/lib/kubelet"),
        imagefs: dir("var/lib/containerd"),
        memory: meminfo(),
        pids: pids(),
        clock: None,
    }
}

fn filesystem(path: &Path) -> Option<Filesystem> {
    use nix::sys::statvfs::{statvfs, FsFlags};
    match statvfs(path) {
        // The field types differ between platforms, hence the allowance.
        #[allow(clippy::useless_conversion)]
        Ok(s) => {
            let unit = u64::from(s.fragment_size());
            Some(Filesystem {
                read_only: s.flags().contains(FsFlags::ST_RDONLY),
                bytes_free: u64::from(s.blocks_available()).saturating_mul(unit),
                bytes_total: u64::from(s.blocks()).saturating_mul(unit),
                inodes_free: u64::from(s.files_available()),
                inodes_total: u64::from(s.files()),
            })
        }
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "statvfs failed");
            None
        }
    }
}

fn meminfo() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib << 10)
    };
    Some((field("MemAvailable:")?, field("MemTotal:")?))
}

fn pids() -> Option<(u64, u64)> {
    let max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // The fourth field is running/total tasks.
    let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
    let tasks = loadavg.split_whitespace().nth(3)?.split_once('/')?.1;
    Some((tasks.parse().ok()?, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs(free_pct: u64, inodes_free_pct: u64) -> Filesystem {
        Filesystem {
            read_only: false,
            bytes_free: free_pct << 30,
            bytes_total: 100 << 30,
            inodes_free: inodes_free_pct * 1000,
            inodes_total: 100_000,
        }
    }

    fn healthy() -> Sample {
        Sample {
            root: Some(fs(50, 50)),
            nodefs: Some(("/var/lib/kubelet".into(), fs(50, 50))),
            imagefs: Some(("/var/lib/containerd".into(), fs(50, 50))),
            memory: Some((4 << 30, 16 << 30)),
            pids: Some((300, 4_194_304)),
            clock: Some(ClockReading {
                offset_ms: 300,
                uncertainty_ms: 520,
            }),
        }
    }

    fn types(problems: &[NodeProblem]) -> Vec<&str> {
        problems.iter().map(|p| p.type_.as_str()).collect()
    }

    #[test]
    fn a_healthy_machine_has_no_problems_and_nothing_read_is_nothing_judged() {
        assert_eq!(judge(&healthy(), &Bounds::default()), vec![]);
        assert_eq!(judge(&Sample::default(), &Bounds::default()), vec![]);
    }

    #[test]
    fn each_check_turns_at_the_kubelets_default_bounds() {
        let bounds = Bounds::default();
        let mut s = healthy();
        s.root.as_mut().unwrap().read_only = true;
        s.nodefs = Some(("/var/lib/kubelet".into(), fs(9, 50)));
        s.imagefs = Some(("/var/lib/containerd".into(), fs(16, 4)));
        s.memory = Some((99 << 20, 16 << 30));
        s.pids = Some((4_000_000, 4_194_304));
        let got = judge(&s, &bounds);
        assert_eq!(
            types(&got),
            [
                READ_ONLY_FILESYSTEM,
                DISK_PRESSURE,
                MEMORY_PRESSURE,
                PID_PRESSURE
            ]
        );
        assert_eq!(
            got[0].message,
            "mounted read-only: /; nothing there can be written"
        );
        assert_eq!(got[1].reason, "DiskSpaceLow");
        assert_eq!(
            got[1].message,
            "/var/lib/kubelet (nodefs, 102400 MiB): free space below nodefs.available<10%; \
             /var/lib/containerd (imagefs, 100000 inodes): free inodes below imagefs.inodesFree<5%"
        );
        assert_eq!(
            got[2].message,
            "MemAvailable below memory.available<100 MiB (MemTotal 16384 MiB)"
        );
        assert_eq!(
            got[3].message,
            "process IDs left below pid.available<10% (pid_max 4194304)"
        );
        // Just above every bound: nothing.
        s.root.as_mut().unwrap().read_only = false;
        s.nodefs = Some(("/var/lib/kubelet".into(), fs(10, 5)));
        s.imagefs = Some(("/var/lib/containerd".into(), fs(15, 5)));
        s.memory = Some((100 << 20, 16 << 30));
        s.pids = Some((3_774_873, 4_194_304));
        assert_eq!(judge(&s, &bounds), vec![]);
    }

    #[test]
    fn a_message_stays_the_same_while_the_amount_left_moves() {
        let mut s = healthy();
        s.memory = Some((90 << 20, 16 << 30));
        s.nodefs = Some(("/var/lib/kubelet".into(), fs(3, 50)));
        let before = judge(&s, &Bounds::default());
        s.memory = Some((42 << 20, 16 << 30));
        s.nodefs = Some(("/var/lib/kubelet".into(), fs(1, 50)));
        assert_eq!(judge(&s, &Bounds::default()), before);
    }

    #[test]
    fn inodes_alone_say_so_and_a_read_only_kubelet_directory_is_named() {
        let mut s = healthy();
        s.nodefs = Some((
            "/var/lib/kubelet".into(),
            Filesystem {
                read_only: true,
                ..fs(50, 1)
            },
        ));
        let got = judge(&s, &Bounds::default());
        assert_eq!(types(&got), [READ_ONLY_FILESYSTEM, DISK_PRESSURE]);
        assert!(got[0].message.contains("/var/lib/kubelet"));
        assert_eq!(got[1].reason, "InodesLow");
    }

    #[test]
    fn a_clock_is_judged_off_only_beyond_what_the_reading_cannot_tell() {
        let at = |s: u64, ms: u64| {
            SystemTime::UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms)
        };
        // Sent at 1000.000, answered at 1000.200, dated 1000: the answer was
        // made between 1000.000 and 1001.000, read at about 1000.100.
        let r = ClockReading::of(at(1000, 0), at(1000, 200), at(1000, 0));
        assert_eq!(
            r,
            ClockReading {
                offset_ms: 400,
                uncertainty_ms: 600
            }
        );
        // This clock 2 minutes ahead: the coordinator's answer is dated
        // 120 s before.
        let ahead = ClockReading::of(at(1120, 0), at(1120, 100), at(1000, 0));
        assert_eq!(ahead.offset_ms, -119_550);
        let mut s = healthy();
        s.clock = Some(ahead);
        let got = judge(&s, &Bounds::default());
        assert_eq!(types(&got), [CLOCK_SKEW]);
        assert_eq!(got[0].reason, "ClockOffsetLarge");
        assert!(
            got[0]
                .message
                .contains("ahead of the coordinator's by more than --max-clock-offset 10 s"),
            "{}",
            got[0].message
        );
        let behind = ClockReading::of(at(1000, 0), at(1000, 100), at(1120, 0));
        s.clock = Some(behind);
        assert!(judge(&s, &Bounds::default())[0].message.contains("behind"));
        // 10.4 s off, read to within 0.55 s: not beyond 10 s for sure.
        s.clock = Some(ClockReading {
            offset_ms: 10_400,
            uncertainty_ms: 550,
        });
        assert_eq!(judge(&s, &Bounds::default()), vec![]);
        s.clock = Some(ClockReading {
            offset_ms: -10_600,
            uncertainty_ms: 550,
        });
        assert_eq!(types(&judge(&s, &Bounds::default())), [CLOCK_SKEW]);
    }

    #[test]
    fn eviction_hard_takes_the_kubelets_text_and_names_what_is_wrong() {
        let b: Bounds = "memory.available<1Gi, nodefs.available<99.5%,pid.available<1000"
            .parse()
            .unwrap();
        assert_eq!(b.memory_available, Bound::Amount(1 << 30));
        assert_eq!(b.nodefs_available, Bound::Percent(99.5));
        assert_eq!(b.pid_available, Bound::Amount(1000));
        assert_eq!(b.imagefs_available, Bounds::default().imagefs_available);
        assert_eq!("".parse::<Bounds>().unwrap(), Bounds::default());
        for (bad, says) in [
            ("memory.available=1Gi", "is not SIGNAL<QUANTITY"),
            ("memory.free<1Gi", "unknown eviction signal 'memory.free'"),
            ("nodefs.available<120%", "'120%' is not a quantity"),
            ("nodefs.available<1Xi", "'1Xi' is not a quantity"),
            ("memory.available<99999999999Ti", "is not a quantity"),
        ] {
            let e = bad.parse::<Bounds>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn sampling_a_real_machine_reads_every_part() {
        let dir = tempfile::tempdir().unwrap();
        let s = sample(dir.path());
        let root = s.root.expect("statvfs of a temporary directory");
        assert!(root.bytes_total > 0 && root.bytes_free <= root.bytes_total);
        // Not made yet: read from the nearest parent, named as the machine sees it.
        let (nodefs, _) = s.nodefs.expect("the kubelet's directory's file system");
        assert_eq!(nodefs, PathBuf::from("/var/lib/kubelet"));
        let (available, total) = s.memory.expect("/proc/meminfo");
        assert!(available <= total && total > 0);
        let (used, max) = s.pids.expect("/proc/loadavg and pid_max");
        assert!(used > 0 && used < max);
    }
}
