//! `drover-agent simulate`: a fleet of simulated machines in one process,
//! against a real coordinator over real HTTPS and mutual TLS, to size a
//! coordinator.
//!
//! Every simulated machine is one task, not a thread. It does what a real
//! agent does on the wire and nothing else: it generates its own key and CSR,
//! registers with the ticket of a pool registration token, checks the
//! coordinator CA against the pin, then heartbeats with its own client
//! certificate (its own HTTPS client and connection, as a real machine has)
//! at the interval the coordinator names, give or take `--jitter`, reporting
//! a healthy kubelet. A machine a cluster claims fetches its signed config
//! bundle once and verifies it, then reports itself running as if kubeadm
//! had succeeded (no kubeadm runs); it acknowledges token and reset
//! directives the same way.
//!
//! All machines share one crypto provider and one verifier of the
//! coordinator CA; their TLS configurations differ only in the client
//! certificate and a small per-machine session cache (TLS resumption is
//! bound to the client's identity, so it must never be shared).
//!
//! The run ends after `--duration`, or at SIGINT/SIGTERM, and prints a
//! summary (registrations, heartbeat latency percentiles and rate, config
//! fetches, errors by kind, the simulator's memory) on stdout, and as JSON
//! with `--summary-json`.

mod args;
mod datagrams;
mod fleet;
mod histogram;
mod machine;
mod summary;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use drover_common::wire::BootstrapDocument;
use tokio::time::Instant;

use self::args::secs;
pub use self::args::SimulateArgs;
use self::fleet::{Fleet, ASSIGNED, IN_POOL};
use self::histogram::ms;
use self::summary::{fmt_ms, render, summarize, SimulatorSummary, Summary};
use crate::address::local_address_towards;
use crate::boot::read_bootstrap;
use crate::shutdown::{Shutdown, ShutdownTrigger};
use crate::tls;

/// How a simulation ended, for the process exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The run finished (or was interrupted) with a machine registered.
    Success,
    /// No machine registered, or the run could not go on.
    Failure,
    /// Bad flags or an unreadable bootstrap document.
    Usage,
}

// ------------------------------------------------------------ entry point

/// Runs `drover-agent simulate`; returns how it ended.
pub fn main(args: SimulateArgs) -> Exit {
    let doc = match prepare(&args) {
        Ok(doc) => doc,
        Err(e) => {
            eprintln!("drover-agent simulate: {e:#}");
            return Exit::Usage;
        }
    };
    let mut notes = Vec::new();
    let open_files = match drover_common::process::raise_open_files_limit() {
        Ok(limit) => {
            let needed = u64::from(args.machines) + u64::from(args.concurrency) + 64;
            if limit < needed {
                let note = format!(
                    "the open-file limit is {limit}, but {} machines need about {needed} \
                     (one connection each, plus registrations in flight); connections beyond it \
                     fail with \"Too many open files\": raise the hard limit (`ulimit -Hn`, \
                     systemd LimitNOFILE) or simulate fewer machines per process",
                    args.machines
                );
                eprintln!("drover-agent simulate: warning: {note}");
                notes.push(note);
            }
            Some(limit)
        }
        Err(e) => {
            eprintln!("drover-agent simulate: warning: cannot raise the open-file limit: {e}");
            None
        }
    };
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drover-agent simulate: cannot start the async runtime: {e}");
            return Exit::Failure;
        }
    };
    let summary = match runtime.block_on(run(&args, doc, notes, open_files, threads)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("drover-agent simulate: {e:#}");
            return Exit::Failure;
        }
    };
    // Tasks still holding connections are dropped with the runtime.
    runtime.shutdown_timeout(Duration::from_secs(1));
    print!("{}", render(&summary));
    if let Some(path) = &args.summary_json {
        if let Err(e) = write_json(path, &summary) {
            eprintln!("drover-agent simulate: {e:#}");
            return Exit::Failure;
        }
    }
    if summary.registration.registered == 0 {
        Exit::Failure
    } else {
        Exit::Success
    }
}

/// Checks the flags and reads the bootstrap document; every error here is
/// a usage error.
fn prepare(args: &SimulateArgs) -> anyhow::Result<BootstrapDocument> {
    args.check()?;
    let doc = read_bootstrap(&args.bootstrap)?;
    if let Some(path) = &args.summary_json {
        // Fail now, not after a long run.
        std::fs::write(path, b"")
            .with_context(|| format!("--summary-json {}: cannot write", path.display()))?;
    }
    Ok(doc)
}

fn write_json(path: &Path, summary: &Summary) -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(summary).expect("the summary serializes");
    text.push('\n');
    std::fs::write(path, text)
        .with_context(|| format!("cannot write the summary to {}", path.display()))
}

/// `VmRSS` and `VmHWM` of this process, in bytes.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (
        status_kib(&status, "VmRSS:") * 1024,
        status_kib(&status, "VmHWM:") * 1024,
    )
}

fn status_kib(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

// ------------------------------------------------------------ the run

async fn run(
    args: &SimulateArgs,
    doc: BootstrapDocument,
    mut notes: Vec<String>,
    open_files: Option<u64>,
    threads: usize,
) -> anyhow::Result<Summary> {
    let (baseline_rss, _) = memory();
    let mut address = None;
    for url in &doc.coordinators {
        if let Ok(ip) = local_address_towards(url).await {
            address = Some(ip);
            break;
        }
    }
    let address = address.ok_or_else(|| {
        anyhow!(
            "cannot find a local address towards any of {:?}",
            doc.coordinators
        )
    })?;
    let pinned = tls::pinned_config(&doc.ca_pin).context("cannot set up TLS")?;
    let n = args.machines as usize;
    let start = Instant::now();
    let hub = match args.transport {
        args::Transport::Datagram => Some(
            datagrams::DatagramHub::bind(address.is_ipv4())
                .context("cannot open UDP sockets for datagram heartbeats")?,
        ),
        args::Transport::Https => None,
    };
    let fleet = Arc::new(Fleet::new(&doc, args, pinned, address, start, hub));
    eprintln!(
        "drover-agent simulate: {n} machines against {} for {} (ramp {}, concurrency {}, jitter {}%)",
        doc.coordinators.join(", "),
        secs(args.duration),
        secs(args.ramp()),
        args.concurrency,
        args.jitter.0
    );

    let (trigger, stop) = Shutdown::new();
    let trigger = Arc::new(trigger);
    spawn_signal_handler(fleet.clone(), trigger.clone())?;

    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let at = start + args.ramp().mul_f64(i as f64 / n as f64);
        tasks.push(tokio::spawn(machine::machine(
            fleet.clone(),
            i,
            at,
            stop.clone(),
        )));
    }
    if !args.progress.is_zero() {
        tokio::spawn(progress(fleet.clone(), args.progress, stop.clone()));
    }
    if args.silence > 0 {
        tokio::spawn(silence(
            fleet.clone(),
            args.silence as usize,
            start + args.silence_after,
            stop.clone(),
        ));
    }

    let mut waiting = stop.clone();
    tokio::select! {
        () = tokio::time::sleep_until(start + args.duration) => {}
        () = waiting.requested() => {}
    }
    let end = Instant::now();
    // Measured while the fleet still holds its connections.
    let (rss, peak_rss) = memory();
    trigger.trigger();
    let all_done = async {
        for t in tasks {
            let _ = t.await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(10), all_done)
        .await
        .is_err()
    {
        notes.push("some machine tasks did not stop within 10 s of the end".into());
    }
    let interrupted = fleet.interrupted.load(Ordering::Relaxed);
    if interrupted {
        notes.push(format!(
            "interrupted after {} of {}",
            secs(end - start),
            secs(args.duration)
        ));
    }
    let memory = SimulatorSummary {
        rss_bytes: rss,
        peak_rss_bytes: peak_rss,
        baseline_rss_bytes: baseline_rss,
        rss_per_machine_bytes: None,
        open_files_limit: open_files,
        worker_threads: threads,
    };
    let summary = summarize(args, &doc, &fleet, end, interrupted, memory, notes);
    Ok(summary)
}

fn spawn_signal_handler(fleet: Arc<Fleet>, trigger: Arc<ShutdownTrigger>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eprintln!(
            "drover-agent simulate: stopping early; interrupt again to quit without a summary"
        );
        fleet.interrupted.store(true, Ordering::Relaxed);
        trigger.trigger();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        std::process::exit(130);
    });
    Ok(())
}

/// Prints a progress line every `every` on stderr.
async fn progress(fleet: Arc<Fleet>, every: Duration, mut stop: Shutdown) {
    let n = fleet.slots.len();
    let mut last_ok = 0;
    let mut last_failed = 0;
    let mut last_at = Instant::now();
    loop {
        tokio::select! {
            () = stop.requested() => return,
            () = tokio::time::sleep(every) => {}
        }
        let now = Instant::now();
        let in_flight = fleet.concurrency as usize - fleet.registrations.available_permits();
        let line = {
            let s = fleet.stats();
            let rate = (s.heartbeats_ok - last_ok) as f64 / (now - last_at).as_secs_f64();
            let failed = s.heartbeats_failed - last_failed;
            last_ok = s.heartbeats_ok;
            last_failed = s.heartbeats_failed;
            let p99 = fmt_ms(s.heartbeat.percentile(99.0).map(ms));
            format!(
                "simulate: +{:.0}s registered {}/{n} (failed {}, in flight {in_flight}), \
                 heartbeats {rate:.0}/s ({failed} failed, p99 so far {p99}), config fetches {}, silenced {}",
                (now - fleet.start).as_secs_f64(),
                s.registered,
                s.registration_failed,
                s.config_fetches,
                s.silenced.len()
            )
        };
        last_at = now;
        eprintln!("{line}");
    }
}

/// Stops the heartbeats of `k` machines at `at`: machines in their pool
/// first, then machines a cluster claimed, the latest started first.
async fn silence(fleet: Arc<Fleet>, k: usize, at: Instant, mut stop: Shutdown) {
    tokio::select! {
        () = stop.requested() => return,
        () = tokio::time::sleep_until(at) => {}
    }
    let mut chosen = Vec::with_capacity(k);
    for wanted in [IN_POOL, ASSIGNED] {
        for (i, slot) in fleet.slots.iter().enumerate().rev() {
            if chosen.len() == k {
                break;
            }
            if slot.state.load(Ordering::Relaxed) == wanted {
                chosen.push(i);
            }
        }
    }
    let mut names = Vec::with_capacity(chosen.len());
    for &i in &chosen {
        let slot = &fleet.slots[i];
        slot.silence.store(true, Ordering::Relaxed);
        names.push(slot.name.get().cloned().unwrap_or_default());
    }
    let mut s = fleet.stats();
    s.silenced = names;
    s.silenced_at = Some((Instant::now(), drover_common::now()));
    if chosen.len() < k {
        let note = format!(
            "--silence {k}: only {} machines were heartbeating at +{}",
            chosen.len(),
            secs(at - fleet.start)
        );
        s.error("silence: too few machines".into(), note);
    }
    drop(s);
    eprintln!(
        "simulate: +{:.0}s silenced {} machines",
        (at - fleet.start).as_secs_f64(),
        chosen.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_parsing() {
        let status = "Name:\tx\nVmHWM:\t   2048 kB\nVmRSS:\t   1024 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), 1024);
        assert_eq!(status_kib(status, "VmHWM:"), 2048);
        assert_eq!(status_kib(status, "VmSwap:"), 0);
        let (rss, peak) = memory();
        assert!(rss > 0 && peak >= rss, "{rss} {peak}");
    }
}
