//! The progress line of a `--wait`: the seconds since the wait began, the
//! object and what it is doing, printed to standard error whenever it
//! changes: rewritten in place on a terminal, one line per change
//! otherwise (a log, CI).

use std::future::Future;
use std::io::IsTerminal;
use std::time::Duration;

use tokio::time::Instant;

/// How often a `--wait` looks at the object again.
const POLL_PERIOD: Duration = Duration::from_secs(1);

/// What one look at the object a `--wait` follows found.
pub(crate) enum Look<T> {
    /// It is done; the wait ends with this.
    Done(T),
    /// Not yet: what it is doing, shown as the progress line.
    Waiting(String),
}

struct Progress {
    object: String,
    started: Instant,
    tty: bool,
    last: String,
}

impl Progress {
    /// A wait on `object` (`cluster/prod`) starting now.
    fn new(object: impl Into<String>) -> Self {
        Self {
            object: object.into(),
            started: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            last: String::new(),
        }
    }

    /// Shows `line` if it is not the one shown last.
    fn show(&mut self, line: String) {
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
    fn end(&self) {
        if self.tty && !self.last.is_empty() {
            eprintln!();
        }
    }

    /// The line shown last.
    fn last(&self) -> &str {
        &self.last
    }
}

/// The loop of every `--wait`: every second, `fetch`es the object (`object`
/// names it) and asks `look` whether it is done, showing what it is doing
/// as that changes. An error from either (the object failed, the
/// coordinator refused) ends the wait with that error; past `timeout`, the
/// wait fails with `timed_out(the line shown last)`. Either way the live
/// line is ended first.
pub(crate) async fn poll<O, T, Fut>(
    object: impl Into<String>,
    timeout: Duration,
    mut fetch: impl FnMut() -> Fut,
    mut look: impl FnMut(O) -> anyhow::Result<Look<T>>,
    timed_out: impl FnOnce(&str) -> anyhow::Error,
) -> anyhow::Result<T>
where
    Fut: Future<Output = anyhow::Result<O>>,
{
    let mut progress = Progress::new(object);
    let deadline = Instant::now() + timeout;
    loop {
        match fetch().await.and_then(&mut look) {
            Ok(Look::Done(done)) => {
                progress.end();
                return Ok(done);
            }
            Ok(Look::Waiting(line)) => progress.show(line),
            Err(e) => {
                progress.end();
                return Err(e);
            }
        }
        if Instant::now() > deadline {
            progress.end();
            return Err(timed_out(progress.last()));
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_with_what_the_look_found_or_its_error_or_the_last_line() {
        let looks = Cell::new(0);
        let done = poll(
            "cluster/a",
            Duration::from_secs(60),
            || async {
                looks.set(looks.get() + 1);
                Ok(looks.get())
            },
            |n| {
                Ok(if n == 3 {
                    Look::Done("ready")
                } else {
                    Look::Waiting(format!("look {n}"))
                })
            },
            |_| anyhow::anyhow!("timed out"),
        )
        .await
        .unwrap();
        assert_eq!((done, looks.get()), ("ready", 3));

        let failed = poll::<(), (), _>(
            "cluster/b",
            Duration::from_secs(60),
            || async { Ok(()) },
            |()| anyhow::bail!("snapshot s1 failed"),
            |_| anyhow::anyhow!("timed out"),
        )
        .await
        .unwrap_err();
        assert_eq!(failed.to_string(), "snapshot s1 failed");

        let started = Instant::now();
        let looks = Cell::new(0);
        let late = poll::<_, (), _>(
            "cluster/c",
            Duration::from_secs(5),
            || async {
                looks.set(looks.get() + 1);
                Ok(looks.get())
            },
            |n| Ok(Look::Waiting(format!("Provisioning, look {n}"))),
            |last| anyhow::anyhow!("not Running after 5s ({last})"),
        )
        .await
        .unwrap_err();
        assert_eq!(
            late.to_string(),
            format!("not Running after 5s (Provisioning, look {})", looks.get())
        );
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(5) && waited <= Duration::from_secs(7),
            "{waited:?}"
        );
    }
}
