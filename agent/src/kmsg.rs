//! The kernel's messages that mean the machine needs more than its
//! workload can give it: a hung task (node-problem-detector's
//! `KernelDeadlock`) and a failing device or file system (`DeviceError`).
//! The patterns follow node-problem-detector's
//! `config/kernel-monitor.json` (its `TaskHung`, `DockerHung`, `IOError`,
//! `Ext4Error` rules), and like its permanent conditions they hold until
//! the machine reboots: the kernel keeps its ring buffer for one boot.
//!
//! The agent reads `/dev/kmsg` (or `--kmsg`): each record is
//! `PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;MESSAGE`, continuation lines start
//! with a space. Opened once, it is read on from where the last read ended
//! at every heartbeat, without blocking; a file that cannot be opened (an
//! unprivileged container has no `/dev/kmsg`) leaves the check out.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use drover_common::api::{NodeProblem, DEVICE_ERROR, KERNEL_DEADLOCK};

/// The most bytes read per heartbeat, so a flood of kernel messages costs
/// a bounded amount each time (the rest is read at the next one).
const MAX_READ: usize = 1 << 20;

/// One pattern: the problem type, its reason, and what the message holds.
struct Rule {
    type_: &'static str,
    reason: &'static str,
    matches: fn(&str) -> bool,
}

/// "task NAME:PID blocked for more than N seconds." (the hung task
/// detector, `kernel/hung_task.c`).
fn task_hung(m: &str) -> bool {
    m.strip_prefix("INFO: ")
        .unwrap_or(m)
        .strip_prefix("task ")
        .is_some_and(|rest| rest.contains(" blocked for more than ") && rest.ends_with(" seconds."))
}

/// "Buffer I/O error on dev ...", "blk_update_request: I/O error, dev
/// ...", "I/O error, dev ..." (the block layer since 5.x).
fn io_error(m: &str) -> bool {
    m.starts_with("Buffer I/O error ")
        || m.starts_with("blk_update_request: I/O error")
        || m.contains("I/O error, dev ")
}

/// "EXT4-fs error ..." and XFS's "Corruption detected" / "metadata I/O
/// error".
fn filesystem_error(m: &str) -> bool {
    m.starts_with("EXT4-fs error ")
        || (m.starts_with("XFS ")
            && (m.contains("Corruption detected") || m.contains("metadata I/O error")))
}

const RULES: &[Rule] = &[
    Rule {
        type_: KERNEL_DEADLOCK,
        reason: "TaskHung",
        matches: task_hung,
    },
    Rule {
        type_: DEVICE_ERROR,
        reason: "IOError",
        matches: io_error,
    },
    Rule {
        type_: DEVICE_ERROR,
        reason: "FilesystemError",
        matches: filesystem_error,
    },
];

/// The message of a kmsg record line, or `None` for a continuation line or
/// one not in the record format.
fn message(line: &str) -> Option<&str> {
    if line.starts_with(' ') {
        return None;
    }
    let (prefix, message) = line.split_once(';')?;
    // PRIORITY,SEQUENCE,MICROSECONDS[,FLAGS...]
    let mut fields = prefix.split(',');
    let numeric =
        |f: Option<&str>| f.is_some_and(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()));
    (numeric(fields.next()) && numeric(fields.next()) && numeric(fields.next())).then_some(message)
}

/// What the kernel said so far this boot, as problems: the first message
/// of each type and reason, and how many followed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Seen {
    found: BTreeMap<(&'static str, &'static str), (String, u64)>,
}

impl Seen {
    /// Takes the records in `text` (whole lines).
    pub fn take(&mut self, text: &str) {
        for m in text.lines().filter_map(message) {
            if let Some(rule) = RULES.iter().find(|r| (r.matches)(m)) {
                let entry = self
                    .found
                    .entry((rule.type_, rule.reason))
                    .or_insert_with(|| (m.chars().take(300).collect(), 0));
                entry.1 += 1;
            }
        }
    }

    /// The problems, one per type (its first reason seen), each with the
    /// first message that matched: the same text however many follow, so
    /// a flood of kernel messages does not rewrite the machine's condition
    /// at every heartbeat.
    pub fn problems(&self) -> Vec<NodeProblem> {
        let mut out: Vec<NodeProblem> = vec![];
        for ((type_, reason), (first, _)) in &self.found {
            if out.iter().any(|p| p.type_ == *type_) {
                continue;
            }
            out.push(NodeProblem {
                type_: (*type_).to_owned(),
                reason: (*reason).to_owned(),
                message: format!("the kernel said {first:?}; this holds until the machine reboots"),
            });
        }
        out
    }

    /// How many messages matched `type_` and `reason`.
    #[cfg(test)]
    fn count(&self, type_: &str, reason: &str) -> u64 {
        self.found
            .iter()
            .find(|((t, r), _)| *t == type_ && *r == reason)
            .map_or(0, |(_, (_, n))| *n)
    }
}

/// The kernel log, read on at every heartbeat.
#[derive(Debug)]
pub struct KernelLog {
    path: PathBuf,
    file: Option<std::fs::File>,
    /// A partial line left by the last read (a regular file).
    rest: Vec<u8>,
    seen: Seen,
    /// Whether the failure to open it was logged.
    told: bool,
    /// How many lines were read.
    lines: u64,
}

impl KernelLog {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            file: None,
            rest: vec![],
            seen: Seen::default(),
            told: false,
            lines: 0,
        }
    }

    /// Reads what the kernel said since the last call; the problems so far.
    pub fn poll(&mut self) -> Vec<NodeProblem> {
        if self.file.is_none() {
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
                .open(&self.path)
            {
                Ok(f) => self.file = Some(f),
                Err(e) => {
                    if !self.told {
                        tracing::info!(path = %self.path.display(), error = %e, "the kernel log cannot be read; kernel message checks are off");
                        self.told = true;
                    }
                    return vec![];
                }
            }
        }
        let file = self.file.as_mut().expect("opened");
        let mut read = 0;
        let mut buf = vec![0u8; 8192];
        while read < MAX_READ {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    read += n;
                    self.rest.extend_from_slice(&buf[..n]);
                }
                // /dev/kmsg: records were overwritten before this read; the
                // next read goes on from the oldest one left.
                Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "reading the kernel log failed");
                    break;
                }
            }
        }
        if let Some(end) = self.rest.iter().rposition(|b| *b == b'\n') {
            let lines: Vec<u8> = self.rest.drain(..=end).collect();
            let text = String::from_utf8_lossy(&lines);
            self.lines += text.lines().count() as u64;
            self.seen.take(&text);
        }
        self.seen.problems()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hung_tasks_and_failing_devices_are_problems_and_the_rest_is_not() {
        let mut s = Seen::default();
        s.take(
            "6,100,5000,-;eth0: link up\n\
             3,101,5001,-;INFO: task jbd2/sda1-8:231 blocked for more than 120 seconds.\n \
             SUBSYSTEM=block\n\
             4,102,5002,-;Buffer I/O error on dev sdb1, logical block 0, async page read\n\
             3,103,5003,-;INFO: task kworker/1:2:88 blocked for more than 120 seconds.\n\
             6,104,5004,-;task is fine and blocked for more than nothing\n\
             garbage without a record prefix: task x:1 blocked for more than 1 seconds.\n",
        );
        let p = s.problems();
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(p[0].type_, DEVICE_ERROR);
        assert_eq!(p[0].reason, "IOError");
        assert!(
            p[0].message.contains("Buffer I/O error on dev sdb1"),
            "{p:?}"
        );
        assert_eq!(p[1].type_, KERNEL_DEADLOCK);
        assert_eq!(p[1].reason, "TaskHung");
        assert!(
            p[1].message
                .contains("task jbd2/sda1-8:231 blocked for more than 120 seconds."),
            "{p:?}"
        );
        assert_eq!(s.count(KERNEL_DEADLOCK, "TaskHung"), 2);
        let mut fs = Seen::default();
        fs.take("2,5,9,-;EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0\n");
        assert_eq!(fs.problems()[0].reason, "FilesystemError");
        assert!(Seen::default().problems().is_empty());
    }

    #[test]
    fn the_kernels_own_log_is_read_record_by_record_where_it_may_be_read() {
        let path = Path::new("/dev/kmsg");
        if std::fs::File::open(path).is_err() {
            eprintln!("/dev/kmsg cannot be opened here (no privilege); nothing to read");
            return;
        }
        let mut log = KernelLog::new(path);
        log.poll();
        // The kernel's first record, at least, and no partial one left.
        assert!(log.lines > 0);
        assert!(
            log.rest.is_empty(),
            "{:?}",
            String::from_utf8_lossy(&log.rest)
        );
    }

    #[test]
    fn the_log_is_read_on_from_where_it_ended_and_a_missing_one_is_no_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kmsg");
        assert!(KernelLog::new(&path).poll().is_empty());
        std::fs::write(
            &path,
            "6,1,1,-;all well\n3,2,2,-;INFO: task a:1 blocked for more than 5 sec",
        )
        .unwrap();
        let mut log = KernelLog::new(&path);
        // The last line is not whole yet.
        assert!(log.poll().is_empty());
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"onds.\n").unwrap();
        let p = log.poll();
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].type_, KERNEL_DEADLOCK);
        // It holds: nothing new read, still reported.
        assert_eq!(log.poll(), p);
    }
}
