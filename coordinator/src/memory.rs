//! Hands freed heap memory back to the operating system.
//!
//! A registration storm allocates a great deal for a short while (CSRs,
//! certificates, batches of records) and frees it again. glibc's allocator
//! keeps what it freed in the middle of its heaps, so the coordinator's
//! resident memory stays at the storm's high-water mark, several KiB per
//! machine above what it holds. The trimmer asks the allocator to return
//! the free pages, on a period, on a blocking thread.

use std::time::{Duration, Instant};

/// How often the trimmer runs.
pub const TRIM_PERIOD: Duration = Duration::from_secs(30);

/// The `memory-trimmer` task: [`trim`] on a blocking thread, once a
/// [`TRIM_PERIOD`] (first after one period).
pub struct Trimmer;

impl crate::tasks::BackgroundTask for Trimmer {
    async fn activate(&mut self, _: crate::tasks::Wake) -> crate::tasks::Outcome {
        let started = Instant::now();
        match tokio::task::spawn_blocking(trim).await {
            Ok(released) => {
                tracing::debug!(
                    released,
                    took_ms = started.elapsed().as_millis() as u64,
                    "heap trimmed"
                );
                crate::tasks::Outcome::Done
            }
            Err(e) => {
                tracing::warn!(error = %e, "heap trim did not finish");
                crate::tasks::Outcome::Failed(crate::tasks::TaskError::new(format!(
                    "heap trim did not finish: {e}"
                )))
            }
        }
    }
}

/// Returns the allocator's free pages to the operating system; whether any
/// were returned.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn trim() -> bool {
    // SAFETY: malloc_trim only walks glibc's own heaps, under their locks.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Other allocators return memory on their own: nothing to do.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// Freed small allocations below a live one stay resident until
    /// trimmed; the trim gives their pages back.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn trimming_returns_pages_freed_under_live_allocations() {
        // On a thread of its own, which glibc gives an arena of its own
        // while there are fewer threads than arenas.
        std::thread::spawn(|| {
            // 64 MiB in 1 KiB pieces, each 16th kept: nothing coalesces up
            // to the top of the heap, so free() alone returns nothing.
            let mut blocks: Vec<Box<[u8; 1024]>> =
                (0..65_536).map(|_| Box::new([1u8; 1024])).collect();
            let kept: Vec<_> = blocks
                .drain(..)
                .enumerate()
                .filter_map(|(i, b)| (i % 16 == 0).then_some(b))
                .collect();
            let before = rss_kib();
            assert!(trim(), "malloc_trim returned nothing");
            let after = rss_kib();
            assert!(
                before.saturating_sub(after) > 16 * 1024,
                "RSS went from {before} KiB to {after} KiB"
            );
            drop(kept);
        })
        .join()
        .unwrap();
    }
}
