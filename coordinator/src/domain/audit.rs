//! The audit log: one JSON line per request that may change something, in
//! `DATA_DIR/audit.log` (mode 0600), also emitted as a tracing event.
//!
//! Its size is bounded whatever clients send: paths and methods are cut to
//! a fixed length; requests of clients that proved no identity, or whose
//! machine certificate was refused, are recorded one by one only up to
//! [`REFUSALS_PER_WINDOW`] per source address a minute, the rest summed up
//! in one entry per source and minute; and the file is rotated by size
//! (`audit.log.1` ... `audit.log.3`).
//!
//! A change an admin asks for is recorded before it is carried out
//! ([`AuditLog::record_first`]): when that entry cannot be written (the
//! disk is full), the change is refused, so no change goes unaudited.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use crate::types::AuditEntry;

/// The longest path recorded, in bytes; longer ones are cut and end in `…`.
pub const MAX_PATH_BYTES: usize = 256;
/// The longest method recorded, in bytes.
const MAX_METHOD_BYTES: usize = 16;
/// Refusals of unauthenticated clients recorded one by one per source and
/// window; the rest of the window's go into one summary entry.
pub const REFUSALS_PER_WINDOW: u32 = 20;
/// The window of [`REFUSALS_PER_WINDOW`].
pub const REFUSAL_WINDOW: Duration = Duration::from_secs(60);
/// Sources whose refusals are counted at once; beyond it, the windows of
/// the others are summed up and closed early.
const MAX_TRACKED_SOURCES: usize = 4096;
/// The size at which the log is rotated.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// Rotated files kept (`audit.log.1` is the newest).
const KEPT_FILES: usize = 3;

impl AuditEntry {
    /// A request anyone can send as often as they like, counted in the
    /// per-source window: one of a client that proved no identity
    /// (`anonymous`, `invalid-admin-token`), whatever its answer but
    /// success (an anonymous sign-out answers 303; an anonymous success is
    /// a registration, proven by its ticket and capped by the registration
    /// limit), and one whose machine certificate was refused (401 or 403:
    /// revoked, deleted, expired or superseded).
    fn is_unproven(&self) -> bool {
        match self.actor.as_str() {
            "anonymous" | "invalid-admin-token" => !(200..300).contains(&self.status),
            actor if actor.starts_with("machine:") => matches!(self.status, 401 | 403),
            _ => false,
        }
    }
}

/// Errors reading the audit log.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the audit log {path}: {source}")]
pub struct AuditReadError {
    path: PathBuf,
    source: std::io::Error,
}

/// An entry that could not be written to the audit log.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the audit log {}: {source}", path.display())]
pub struct AuditWriteError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// The refusals of one source in the current window.
struct Window {
    start: Instant,
    recorded: u32,
    suppressed: u64,
    /// The last suppressed refusal (for the summary).
    last: Option<AuditEntry>,
}

struct Writer {
    file: Option<std::fs::File>,
    size: u64,
    /// A write failed part-way: the file may end in a torn line, which the
    /// next entry must not continue.
    torn: bool,
    windows: HashMap<String, Window>,
    last_sweep: Instant,
}

/// The append-only audit file.
pub struct AuditLog {
    path: PathBuf,
    max_bytes: u64,
    writer: Mutex<Writer>,
}

/// `s` cut to at most `max` bytes on a character boundary, ending in `…`
/// when cut.
fn truncate(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push('…');
}

impl AuditLog {
    /// Opens (creating) the log at `path`, rotated at [`DEFAULT_MAX_BYTES`].
    pub fn open(path: &Path) -> std::io::Result<Self> {
        Self::open_with_max(path, DEFAULT_MAX_BYTES)
    }

    /// Opens (creating) the log at `path`, rotated when it reaches
    /// `max_bytes`.
    pub fn open_with_max(path: &Path, max_bytes: u64) -> std::io::Result<Self> {
        let file = Self::open_file(path)?;
        let size = file.metadata()?.len();
        Ok(Self {
            path: path.to_owned(),
            max_bytes,
            writer: Mutex::new(Writer {
                file: Some(file),
                size,
                torn: false,
                windows: HashMap::new(),
                last_sweep: Instant::now(),
            }),
        })
    }

    fn open_file(path: &Path) -> std::io::Result<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
    }

    fn rotated(&self, n: usize) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    }

    /// Appends an entry. A failing write is logged, never fatal to the request.
    pub fn record(&self, e: AuditEntry) {
        self.record_at(e, Instant::now());
    }

    /// Appends the entry of a change before it is carried out, outside the
    /// per-source windows, and waits until it is on disk: an error means
    /// the change must be refused, since it could not be audited.
    pub fn record_first(&self, mut e: AuditEntry) -> Result<(), AuditWriteError> {
        truncate(&mut e.path, MAX_PATH_BYTES);
        truncate(&mut e.method, MAX_METHOD_BYTES);
        let mut w = self.writer.lock().expect("audit lock");
        self.write(&mut w, &e)
            .and_then(|()| match w.file.as_ref() {
                Some(f) => f.sync_data(),
                None => Ok(()),
            })
            .map_err(|source| AuditWriteError {
                path: self.path.clone(),
                source,
            })
    }

    /// [`AuditLog::record`] at `now` (for tests).
    pub fn record_at(&self, mut e: AuditEntry, now: Instant) {
        truncate(&mut e.path, MAX_PATH_BYTES);
        truncate(&mut e.method, MAX_METHOD_BYTES);
        let mut w = self.writer.lock().expect("audit lock");
        if now.saturating_duration_since(w.last_sweep) >= REFUSAL_WINDOW
            || w.windows.len() > MAX_TRACKED_SOURCES
        {
            w.last_sweep = now;
            let expired: Vec<String> = w
                .windows
                .iter()
                .filter(|(_, win)| {
                    now.saturating_duration_since(win.start) >= REFUSAL_WINDOW
                        || w.windows.len() > MAX_TRACKED_SOURCES
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in expired {
                if let Some(win) = w.windows.remove(&k) {
                    self.summarise(&mut w, win);
                }
            }
        }
        if e.is_unproven() {
            let window = w.windows.remove(&e.source);
            let mut window = match window {
                Some(win) if now.saturating_duration_since(win.start) < REFUSAL_WINDOW => win,
                ended => {
                    if let Some(win) = ended {
                        self.summarise(&mut w, win);
                    }
                    Window {
                        start: now,
                        recorded: 0,
                        suppressed: 0,
                        last: None,
                    }
                }
            };
            let source = e.source.clone();
            if window.recorded < REFUSALS_PER_WINDOW {
                window.recorded += 1;
                w.windows.insert(source, window);
                let _ = self.write(&mut w, &e);
            } else {
                window.suppressed += 1;
                window.last = Some(e);
                w.windows.insert(source, window);
            }
            return;
        }
        let _ = self.write(&mut w, &e);
    }

    /// Writes the summary of a window that suppressed refusals.
    fn summarise(&self, w: &mut Writer, win: Window) {
        if let Some(mut last) = win.last {
            last.method = "*".into();
            last.suppressed = Some(win.suppressed);
            last.time = drover_common::now();
            let _ = self.write(w, &last);
        }
    }

    /// Appends one line; a failure is logged and returned.
    fn write(&self, w: &mut Writer, e: &AuditEntry) -> std::io::Result<()> {
        tracing::info!(target: "audit", actor = ?e.actor, source = %e.source, method = ?e.method, path = ?e.path, status = e.status, stage = ?e.stage, suppressed = e.suppressed, "audit");
        let mut line = Vec::with_capacity(256);
        if w.torn {
            // Ends the torn line, which readers skip, so this one parses.
            line.push(b'\n');
        }
        serde_json::to_writer(&mut line, e).expect("audit entry serializes");
        line.push(b'\n');
        if w.size + line.len() as u64 > self.max_bytes && w.size > 0 {
            self.rotate(w);
        }
        if w.file.is_none() {
            // Opening failed after a rotation: try again for each entry.
            let f = Self::open_file(&self.path).inspect_err(|err| {
                tracing::error!(error = %err, path = %self.path.display(), "cannot write the audit log");
            })?;
            w.size = f.metadata().map_or(0, |m| m.len());
            w.file = Some(f);
        }
        let f = w.file.as_mut().expect("opened above");
        match f.write_all(&line) {
            Ok(()) => {
                w.size += line.len() as u64;
                w.torn = false;
                Ok(())
            }
            Err(err) => {
                w.torn = true;
                tracing::error!(error = %err, path = %self.path.display(), "cannot write the audit log");
                Err(err)
            }
        }
    }

    /// Moves `audit.log` to `audit.log.1` (and each older file one up,
    /// dropping the oldest) and starts an empty one.
    fn rotate(&self, w: &mut Writer) {
        for n in (1..KEPT_FILES).rev() {
            let from = self.rotated(n);
            if from.exists() {
                if let Err(err) = std::fs::rename(&from, self.rotated(n + 1)) {
                    tracing::error!(error = %err, path = %from.display(), "cannot rotate the audit log");
                }
            }
        }
        if let Err(err) = std::fs::rename(&self.path, self.rotated(1)) {
            tracing::error!(error = %err, path = %self.path.display(), "cannot rotate the audit log; it keeps growing");
            return;
        }
        match Self::open_file(&self.path) {
            Ok(f) => {
                w.file = Some(f);
                w.size = 0;
                w.torn = false;
                tracing::info!(path = %self.path.display(), "audit log rotated");
            }
            Err(err) => {
                tracing::error!(error = %err, path = %self.path.display(), "cannot open the audit log after rotating it; entries are only logged");
                w.file = None;
            }
        }
    }

    /// The last `limit` entries, oldest first: read backwards from the end
    /// of the log (and of the newest rotated file if the log holds fewer),
    /// never the whole file.
    pub fn tail(&self, limit: usize) -> Result<Vec<AuditEntry>, AuditReadError> {
        let mut newest_first = Vec::new();
        for path in [self.path.clone(), self.rotated(1)] {
            if newest_first.len() >= limit {
                break;
            }
            match tail_lines(&path, limit - newest_first.len(), &mut newest_first) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && path != self.path => {}
                Err(source) => return Err(AuditReadError { path, source }),
            }
        }
        newest_first.reverse();
        Ok(newest_first)
    }
}

impl Drop for AuditLog {
    /// Writes the summaries of the windows still open.
    fn drop(&mut self) {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let windows: Vec<Window> = w.windows.drain().map(|(_, win)| win).collect();
        for win in windows {
            self.summarise(&mut w, win);
        }
    }
}

/// Pushes up to `limit` entries of `path`, newest first, onto `out`,
/// reading it backwards in blocks.
fn tail_lines(path: &Path, limit: usize, out: &mut Vec<AuditEntry>) -> std::io::Result<()> {
    const BLOCK: u64 = 64 * 1024;
    let mut f = std::fs::File::open(path)?;
    let mut end = f.metadata()?.len();
    // Bytes of a line whose start is in a block not read yet.
    let mut carry: Vec<u8> = Vec::new();
    let mut taken = 0;
    while end > 0 && taken < limit {
        let start = end.saturating_sub(BLOCK);
        let mut block = vec![0u8; (end - start) as usize];
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut block)?;
        block.extend_from_slice(&carry);
        // Every complete line of the block, newest first; the part before
        // the first newline may continue in the previous block.
        let mut lines = block.rsplit(|b| *b == b'\n');
        let mut pieces: Vec<&[u8]> = lines.by_ref().collect();
        let first = if start > 0 { pieces.pop() } else { None };
        for line in pieces {
            if taken >= limit {
                break;
            }
            if let Ok(e) = serde_json::from_slice::<AuditEntry>(line) {
                out.push(e);
                taken += 1;
            }
        }
        carry = first.map(<[u8]>::to_vec).unwrap_or_default();
        end = start;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Appends half a line to the log at `path`, as a write that failed
    /// part-way leaves it.
    fn tear_a_line(path: &Path) {
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .unwrap()
            .write_all(b"{\"torn")
            .unwrap();
    }

    /// Records each of `entries` 30 times at `at`, in turn.
    fn record_30_times(log: &AuditLog, entries: &[AuditEntry], at: Instant) {
        for _ in 0..30 {
            for e in entries {
                log.record_at(e.clone(), at);
            }
        }
    }

    /// How many of `all` are from `actor` at `source`.
    fn count_of(all: &[AuditEntry], actor: &str, source: &str) -> usize {
        all.iter()
            .filter(|e| e.actor == actor && e.source == source)
            .count()
    }

    fn entry(actor: &str, source: &str, path: &str, status: u16) -> AuditEntry {
        AuditEntry {
            time: drover_common::now(),
            actor: actor.into(),
            source: source.into(),
            method: "POST".into(),
            path: path.into(),
            status,
            stage: None,
            suppressed: None,
            changes: Vec::new(),
        }
    }

    #[test]
    fn unauthenticated_refusals_are_bounded_and_summed_up_per_source() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(&dir.path().join("audit.log")).unwrap();
        let t0 = Instant::now();
        let long = format!("/v1/clusters/{}", "a".repeat(10_000));
        for i in 0..100u64 {
            let at = t0 + Duration::from_millis(i * 100);
            log.record_at(entry("anonymous", "192.0.2.1", &long, 401), at);
            log.record_at(entry("invalid-admin-token", "192.0.2.2", "/x", 401), at);
        }
        // Accepted requests and authenticated refusals are all recorded.
        record_30_times(
            &log,
            &[
                entry("machine:m", "192.0.2.1", "/v1/machine/register", 201),
                entry("admin-token:ab (viewer)", "192.0.2.1", "/v1/x", 403),
            ],
            t0,
        );
        let all = log.tail(10_000).unwrap();
        let from = |source: &str, actor: &str| count_of(&all, actor, source);
        assert_eq!(from("192.0.2.1", "anonymous"), REFUSALS_PER_WINDOW as usize);
        assert_eq!(
            from("192.0.2.2", "invalid-admin-token"),
            REFUSALS_PER_WINDOW as usize
        );
        assert_eq!(from("192.0.2.1", "machine:m"), 30);
        assert_eq!(from("192.0.2.1", "admin-token:ab (viewer)"), 30);
        assert!(
            all.iter().all(|e| e.path.len() <= MAX_PATH_BYTES),
            "{all:?}"
        );
        assert!(all[0].path.ends_with('…'));
        // The next window: one summary per source for the last one.
        log.record_at(
            entry("anonymous", "192.0.2.1", "/y", 404),
            t0 + REFUSAL_WINDOW + Duration::from_secs(1),
        );
        let all = log.tail(10_000).unwrap();
        let summaries: Vec<&AuditEntry> = all.iter().filter(|e| e.suppressed.is_some()).collect();
        assert_eq!(summaries.len(), 2, "{summaries:#?}");
        for s in summaries {
            assert_eq!(s.suppressed, Some(100 - u64::from(REFUSALS_PER_WINDOW)));
            assert_eq!(s.method, "*");
        }
        assert_eq!(all.last().unwrap().path, "/y");
    }

    #[test]
    fn anonymous_sign_outs_and_refused_machine_certificates_are_bounded_per_source() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(&dir.path().join("audit.log")).unwrap();
        let t0 = Instant::now();
        for i in 0..100u64 {
            let at = t0 + Duration::from_millis(i * 100);
            // An anonymous sign-out answers 303, not a refusal.
            log.record_at(entry("anonymous", "192.0.2.1", "/ui/logout", 303), at);
            // A revoked or deleted machine's certificate.
            log.record_at(
                entry("machine:gone", "192.0.2.2", "/v1/machine/config", 401),
                at,
            );
        }
        // Registrations (proven by their tickets), a machine's other
        // answers and signed-in admins are all recorded.
        record_30_times(
            &log,
            &[
                entry("anonymous", "192.0.2.3", "/v1/machine/register", 201),
                entry("machine:m", "192.0.2.3", "/v1/machine/config", 409),
                entry("admin-token:ab (admin)", "192.0.2.3", "/ui/logout", 303),
            ],
            t0,
        );
        let all = log.tail(10_000).unwrap();
        let count = |actor: &str, source: &str| count_of(&all, actor, source);
        assert_eq!(
            count("anonymous", "192.0.2.1"),
            REFUSALS_PER_WINDOW as usize
        );
        assert_eq!(
            count("machine:gone", "192.0.2.2"),
            REFUSALS_PER_WINDOW as usize
        );
        assert_eq!(count("anonymous", "192.0.2.3"), 30);
        assert_eq!(count("machine:m", "192.0.2.3"), 30);
        assert_eq!(count("admin-token:ab (admin)", "192.0.2.3"), 30);
        drop(log);
        // Closing the log sums up what the windows held back.
        let log = AuditLog::open(&dir.path().join("audit.log")).unwrap();
        let summaries: Vec<AuditEntry> = log
            .tail(10_000)
            .unwrap()
            .into_iter()
            .filter(|e| e.suppressed.is_some())
            .collect();
        assert_eq!(summaries.len(), 2, "{summaries:#?}");
        assert!(summaries
            .iter()
            .all(|s| s.suppressed == Some(100 - u64::from(REFUSALS_PER_WINDOW))));
    }

    #[test]
    fn an_entry_written_first_fails_when_the_disk_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        // Every write to /dev/full fails with ENOSPC, as on a full disk.
        std::os::unix::fs::symlink("/dev/full", &path).unwrap();
        let log = AuditLog::open(&path).unwrap();
        let e = log
            .record_first(entry("admin-token:ab (admin)", "192.0.2.1", "/v1/x", 0))
            .unwrap_err();
        assert_eq!(e.source.kind(), std::io::ErrorKind::StorageFull, "{e}");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    }

    #[test]
    fn an_entry_after_a_torn_line_is_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::open(&path).unwrap();
        log.record(entry("machine:m", "192.0.2.1", "/v1/a", 200));
        // A write that failed part-way left half a line.
        tear_a_line(&path);
        log.writer.lock().unwrap().torn = true;
        log.record_first(entry("machine:m", "192.0.2.1", "/v1/b", 200))
            .unwrap();
        let paths: Vec<String> = log.tail(10).unwrap().into_iter().map(|e| e.path).collect();
        assert_eq!(paths, ["/v1/a", "/v1/b"]);
    }

    #[test]
    fn the_log_rotates_by_size_and_the_tail_spans_the_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::open_with_max(&path, 4096).unwrap();
        for i in 0..200 {
            log.record(entry("machine:m", "192.0.2.1", &format!("/v1/p/{i}"), 200));
        }
        let size = |p: &Path| std::fs::metadata(p).unwrap().len();
        assert!(size(&path) <= 4096, "{}", size(&path));
        assert!(size(&dir.path().join("audit.log.1")) <= 4096);
        assert!(dir.path().join("audit.log.3").exists());
        assert!(!dir.path().join("audit.log.4").exists());
        // The newest entries, in order, across the current and last file.
        let current = std::fs::read_to_string(&path).unwrap().lines().count();
        let want = current + 5;
        let tail = log.tail(want).unwrap();
        assert_eq!(tail.len(), want);
        let paths: Vec<String> = tail.iter().map(|e| e.path.clone()).collect();
        let expected: Vec<String> = (200 - want..200).map(|i| format!("/v1/p/{i}")).collect();
        assert_eq!(paths, expected);
    }

    #[test]
    fn the_tail_is_read_in_blocks_from_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::open(&path).unwrap();
        // Lines straddle the 64 KiB blocks; a torn last line is skipped.
        for i in 0..3000 {
            log.record(entry(
                "machine:m",
                "192.0.2.1",
                &format!("/v1/{i}/{}", "x".repeat(i % 97)),
                200,
            ));
        }
        tear_a_line(&path);
        let tail = log.tail(2500).unwrap();
        assert_eq!(tail.len(), 2500);
        for (n, e) in tail.iter().enumerate() {
            let i = 500 + n;
            assert_eq!(e.path, format!("/v1/{i}/{}", "x".repeat(i % 97)));
        }
        assert_eq!(log.tail(10_000).unwrap().len(), 3000);
    }
}
