//! The progress line of a `--wait`: the seconds since the wait began, the
//! object and what it is doing, printed to standard error whenever it
//! changes: rewritten in place on a terminal, one line per change
//! otherwise (a log, CI).

use std::io::IsTerminal;
use std::time::Instant;

pub(crate) struct Progress {
    object: String,
    started: Instant,
    tty: bool,
    last: String,
}

impl Progress {
    /// A wait on `object` (`cluster/prod`) starting now.
    pub(crate) fn new(object: impl Into<String>) -> Self {
        Self {
            object: object.into(),
            started: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            last: String::new(),
        }
    }

    /// Shows `line` if it is not the one shown last.
    pub(crate) fn show(&mut self, line: String) {
        if line == self.last {
            return;
        }
        let secs = self.started.elapsed().as_secs();
        if self.tty {
            eprint!("\r\x1b[2K{secs:>4}s  {}: {line}", self.object);
        } else {
            eprintln!("{secs:>4}s  {}: {line}", self.object);
        }
        self.last = line;
    }

    /// Ends the live line, before the wait's last word (an outcome or an
    /// error) is printed.
    pub(crate) fn end(&self) {
        if self.tty && !self.last.is_empty() {
            eprintln!();
        }
    }

    /// The line shown last.
    pub(crate) fn last(&self) -> &str {
        &self.last
    }

    /// Seconds since the wait began.
    pub(crate) fn seconds(&self) -> u64 {
        self.started.elapsed().as_secs()
    }
}
