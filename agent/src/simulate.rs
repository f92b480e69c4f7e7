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

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use drover_common::api::MachineRole;
use drover_common::pin::CaPin;
use drover_common::wire::{
    AgentPhase, AssignmentNotice, BootstrapDocument, BootstrapReport, CommandFailure,
    DirectiveAction, DirectiveResult, HealthReport, HeartbeatRequest, HeartbeatResponse,
    MachineFacts, Probe, ProbeState, RegisterRequest, RegisterResponse,
};
use rand::Rng;
use rustls::client::{Resumption, WebPkiServerVerifier};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::agent::{clamp_interval, config_retry_delay, Shutdown, ShutdownTrigger};
use crate::api::{ApiError, ConfigAnswer, CoordinatorClient, Timeouts};
use crate::backoff::Backoff;
use crate::register::{local_address_towards, permanent_status};
use crate::state::kubeadm_step_name;
use crate::tls;

/// The most machines one simulator runs.
const MAX_MACHINES: i64 = 1_000_000;

/// --ramp unless the run is shorter.
const DEFAULT_RAMP: Duration = Duration::from_secs(10);

/// Free disk space every simulated machine reports (constant, so a
/// heartbeat that changes nothing stays one).
const DISK_FREE_BYTES: u64 = 50 << 30;

/// TLS sessions each machine keeps for resumption (one per coordinator
/// replica is plenty; rustls' default of 256 costs tens of KiB each).
const SESSIONS_PER_MACHINE: usize = 4;

/// How many messages are kept per error kind.
const ERROR_EXAMPLES: usize = 3;

/// Directive ids each machine remembers, so a repeated one is not redone.
const REMEMBERED_DIRECTIVES: usize = 64;

/// Runs a fleet of simulated machines against a real coordinator, to size it.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Create the token first, with at least as many uses as machines:
  drover token create --pool sim --uses 2000 -o sim.yaml
  drover-agent simulate --bootstrap sim.yaml --machines 2000 --duration 5m

Each machine holds one connection: the simulator raises its open-file limit
to the hard limit and warns when that is too low. The summary goes to stdout,
progress to stderr. Simulated machines do not renew their certificates:
keep a run shorter than the coordinator's machine certificate lifetime.

Exit codes: 0 when the run finished (or was interrupted) with at least one
machine registered, 1 when none registered, 64 for bad flags or an
unreadable bootstrap document.")]
pub struct SimulateArgs {
    /// The bootstrap document of a pool registration token
    /// (`drover token create --pool POOL --uses N -o FILE`); every simulated
    /// machine registers with its ticket, so it needs --machines uses.
    #[arg(long, value_name = "FILE")]
    pub bootstrap: PathBuf,

    /// How many machines to simulate.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=MAX_MACHINES))]
    pub machines: u32,

    /// How long the run lasts, counted from its start (the ramp included).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration_arg)]
    pub duration: Duration,

    /// Spread the machines' starts evenly over this long; 0 starts them all
    /// at once (a registration storm) [default: 10s, or --duration if
    /// shorter].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub ramp: Option<Duration>,

    /// At most this many registrations in flight at once.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub concurrency: u32,

    /// Vary every heartbeat interval by up to this much either way, so the
    /// fleet does not beat in lockstep (0% to 100%).
    #[arg(long, value_name = "PERCENT", default_value = "10%", value_parser = parse_jitter)]
    pub jitter: Jitter,

    /// Make K machines stop heartbeating at --silence-after, as if they died,
    /// to measure how the coordinator notices. Machines not claimed by a
    /// cluster are picked first.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub silence: u32,

    /// When the --silence machines stop, counted from the start of the run.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration_arg)]
    pub silence_after: Duration,

    /// Host names of the simulated machines are PREFIX-1, PREFIX-2, ...
    /// (zero-padded); the coordinator names the machines after its pool.
    #[arg(long, value_name = "PREFIX", default_value = "sim", value_parser = parse_name_prefix)]
    pub name_prefix: String,

    /// Also write the summary as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub summary_json: Option<PathBuf>,

    /// How often to print a progress line on stderr (0: never).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration_arg)]
    pub progress: Duration,

    /// The steady state (its own latency and rate in the summary) starts
    /// this long after the last machine registered [default: one heartbeat
    /// interval, plus jitter]. With short intervals, give the coordinator
    /// longer to finish the writes of the registration ramp.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub settle: Option<Duration>,
}

/// A heartbeat jitter, in percent of the interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Jitter(pub u32);

impl Jitter {
    fn fraction(self) -> f64 {
        f64::from(self.0) / 100.0
    }
}

/// A duration such as `60s`, `500ms`, `2m`, or a bare `0`.
fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    drover_common::api::parse_duration(s)
}

/// `10%` or `10`, from 0 to 100.
fn parse_jitter(s: &str) -> Result<Jitter, String> {
    let t = s.trim();
    t.strip_suffix('%')
        .unwrap_or(t)
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n <= 100)
        .map(Jitter)
        .ok_or_else(|| format!("must be a percentage from 0% to 100%, such as 10%, got {s:?}"))
}

fn parse_name_prefix(s: &str) -> Result<String, String> {
    // It starts host names, which the coordinator checks as DNS-1123
    // subdomains (the last part gets `-N` appended).
    if s.is_empty()
        || s.len() > 48
        || drover_common::names::check_hostname(&format!("{s}-1")).is_err()
    {
        return Err(format!(
            "{s:?} must be 1 to 48 lowercase letters, digits, '-' or '.', each dot-separated part starting with a letter or digit (it starts host names)"
        ));
    }
    Ok(s.to_owned())
}

impl SimulateArgs {
    /// --ramp, or its default.
    pub fn ramp(&self) -> Duration {
        self.ramp.unwrap_or_else(|| DEFAULT_RAMP.min(self.duration))
    }

    /// Checks what clap cannot check one flag at a time.
    fn check(&self) -> anyhow::Result<()> {
        if self.duration.is_zero() {
            bail!("--duration must be longer than 0");
        }
        if self.ramp() > self.duration {
            bail!(
                "--ramp {} is longer than --duration {}: the last machines would never start",
                secs(self.ramp()),
                secs(self.duration)
            );
        }
        if self.silence > self.machines {
            bail!(
                "--silence {} is more than --machines {}",
                self.silence,
                self.machines
            );
        }
        if self.silence > 0 && self.silence_after >= self.duration {
            bail!(
                "--silence-after {} is not within --duration {}: no machine would go silent",
                secs(self.silence_after),
                secs(self.duration)
            );
        }
        if let Some(settle) = self.settle {
            if self.ramp() + settle >= self.duration {
                bail!(
                    "--ramp {} plus --settle {} is not within --duration {}: the run would end before its steady state",
                    secs(self.ramp()),
                    secs(settle),
                    secs(self.duration)
                );
            }
        }
        Ok(())
    }
}

fn secs(d: Duration) -> String {
    format!("{}s", trim_float(d.as_secs_f64(), 3))
}

fn trim_float(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

// ------------------------------------------------------------ entry point

/// Runs `drover-agent simulate`; returns the process exit code.
pub fn main(args: SimulateArgs) -> ExitCode {
    let doc = match prepare(&args) {
        Ok(doc) => doc,
        Err(e) => {
            eprintln!("drover-agent simulate: {e:#}");
            return ExitCode::from(crate::EXIT_USAGE);
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
            return ExitCode::FAILURE;
        }
    };
    let summary = match runtime.block_on(run(&args, doc, notes, open_files, threads)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("drover-agent simulate: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    // Tasks still holding connections are dropped with the runtime.
    runtime.shutdown_timeout(Duration::from_secs(1));
    print!("{}", render(&summary));
    if let Some(path) = &args.summary_json {
        if let Err(e) = write_json(path, &summary) {
            eprintln!("drover-agent simulate: {e:#}");
            return ExitCode::FAILURE;
        }
    }
    if summary.registration.registered == 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Checks the flags and reads the bootstrap document; every error here is
/// a usage error.
fn prepare(args: &SimulateArgs) -> anyhow::Result<BootstrapDocument> {
    args.check()?;
    let doc = crate::read_bootstrap(&args.bootstrap)?;
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

// ------------------------------------------------------------ the fleet

/// What every machine task shares.
struct Fleet {
    urls: Vec<String>,
    pin: CaPin,
    ticket: String,
    /// Registration TLS: only the pinned CA, no client certificate.
    pinned: rustls::ClientConfig,
    /// The coordinator CA the first registration brought, checked against
    /// the pin, with the verifier every machine shares.
    ca: OnceLock<Arc<CoordinatorCa>>,
    /// This host's address towards the coordinator.
    address: IpAddr,
    /// Whether machines connect from addresses of their own: with a
    /// coordinator on loopback, one source address would run out of
    /// ephemeral ports (about 28,000) before 50,000 machines connected.
    spread_sources: bool,
    hostname_prefix: String,
    hostname_width: usize,
    jitter: f64,
    /// `--settle`, if given.
    settle: Option<Duration>,
    start: Instant,
    registrations: Semaphore,
    concurrency: u32,
    slots: Vec<Slot>,
    stats: Mutex<Stats>,
    interrupted: AtomicBool,
}

/// The coordinator CA, as the machines use it.
struct CoordinatorCa {
    pem: String,
    der: Vec<u8>,
    verifier: Arc<WebPkiServerVerifier>,
}

/// What the fleet knows about one machine, for --silence and the summary.
#[derive(Default)]
struct Slot {
    state: AtomicU8,
    silence: AtomicBool,
    name: OnceLock<String>,
}

/// [`Slot::state`] values (0: not registered yet).
const IN_POOL: u8 = 1;
const ASSIGNED: u8 = 2;
const GONE: u8 = 3;

/// Machine `index`'s own loopback address: 127.1.0.0, 127.1.0.1, ...
/// (Linux routes all of 127.0.0.0/8 to the loopback interface).
fn loopback_source(index: usize) -> std::net::Ipv4Addr {
    let offset = (index as u32).wrapping_add(1 << 16) & 0x00ff_ffff;
    std::net::Ipv4Addr::from(0x7f00_0000 | offset)
}

impl Fleet {
    /// The address machine `index` connects from: its own loopback
    /// address (127.1.0.0 onwards) when the coordinator is on loopback,
    /// this host's otherwise.
    fn source(&self, index: usize) -> IpAddr {
        if !self.spread_sources {
            return self.address;
        }
        IpAddr::V4(loopback_source(index))
    }

    /// A machine API client for machine `index`.
    fn client(
        &self,
        index: usize,
        tls: rustls::ClientConfig,
    ) -> Result<CoordinatorClient, ApiError> {
        if self.spread_sources {
            CoordinatorClient::bound_to(&self.urls, tls, Timeouts::default(), self.source(index))
        } else {
            CoordinatorClient::new(&self.urls, tls, Timeouts::default())
        }
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_state(&self, index: usize, state: u8) {
        self.slots[index].state.store(state, Ordering::Relaxed);
    }

    /// The shared coordinator CA if `pem` is it; else `pem` checked against
    /// the pin on its own (a coordinator whose CA certificate was reissued
    /// for the same key).
    fn coordinator_ca(&self, pem: &str) -> Result<Arc<CoordinatorCa>, String> {
        if let Some(ca) = self.ca.get() {
            if ca.pem == pem {
                return Ok(ca.clone());
            }
        }
        let got = CaPin::from_cert_pem(pem).map_err(|e| format!("unreadable CA: {e}"))?;
        if got != self.pin {
            return Err(format!(
                "the coordinator answered with a CA certificate pinned {got}, not the pinned {}",
                self.pin
            ));
        }
        let ca = Arc::new(CoordinatorCa {
            pem: pem.to_owned(),
            der: drover_common::pki::first_cert_der(pem).map_err(|e| e.to_string())?,
            verifier: tls::coordinator_verifier(pem).map_err(|e| e.to_string())?,
        });
        Ok(self.ca.get_or_init(|| ca.clone()).clone())
    }

    fn jittered(&self, interval: Duration) -> Duration {
        jittered(interval, self.jitter)
    }

    /// Once every machine has registered or failed, the steady state starts
    /// `--settle` later, by default one (jittered) interval, when the
    /// registration backlog and the first heartbeats are through.
    fn settle(&self, s: &mut Stats) {
        if s.steady_from.is_none()
            && s.registered + s.registration_failed == self.slots.len() as u64
        {
            if let Some(interval) = s.interval {
                let wait = self
                    .settle
                    .unwrap_or_else(|| interval.mul_f64(1.0 + self.jitter));
                s.steady_from = Some(Instant::now() + wait);
            }
        }
    }
}

/// `interval` scaled by a random factor from `1 - jitter` to `1 + jitter`.
fn jittered(interval: Duration, jitter: f64) -> Duration {
    if jitter <= 0.0 {
        return interval;
    }
    let f = rand::rng().random_range(-jitter..=jitter);
    interval.mul_f64((1.0 + f).max(0.0))
}

/// Counters and histograms of the run.
#[derive(Default)]
struct Stats {
    registered: u64,
    registration_failed: u64,
    registration_retries: u64,
    /// From a machine's first registration request to its identity.
    registration: Histogram,
    last_registered: Option<Instant>,
    heartbeats_sent: u64,
    heartbeats_ok: u64,
    heartbeats_failed: u64,
    heartbeat: Histogram,
    /// Heartbeats sent in the steady state (see [`Fleet::settle`]).
    steady_heartbeat: Histogram,
    steady_from: Option<Instant>,
    first_heartbeat: Option<Instant>,
    /// Successful heartbeats by the second of the run they were sent in.
    heartbeats_per_second: Vec<u64>,
    interval: Option<Duration>,
    config_fetches: u64,
    config_not_ready: u64,
    config_failed: u64,
    config: Histogram,
    directives: u64,
    errors: BTreeMap<String, ErrorCount>,
    silenced: Vec<String>,
    silenced_at: Option<(Instant, time::OffsetDateTime)>,
}

#[derive(Default)]
struct ErrorCount {
    count: u64,
    examples: Vec<String>,
}

impl Stats {
    fn error(&mut self, kind: String, message: String) {
        let e = self.errors.entry(kind).or_default();
        e.count += 1;
        if e.examples.len() < ERROR_EXAMPLES && !e.examples.contains(&message) {
            e.examples.push(message);
        }
    }

    fn api_error(&mut self, op: &str, e: &ApiError) {
        self.error(format!("{op}: {}", error_kind(e)), e.to_string());
    }
}

/// A short, stable name for the kind of a failed call.
fn error_kind(e: &ApiError) -> String {
    match e {
        ApiError::Client(_) => "client".into(),
        ApiError::PinMismatch(_) => "CA pin mismatch".into(),
        ApiError::Refused { status, .. } => format!("HTTP {}", status.as_u16()),
        ApiError::BadAnswer { status, .. } => format!("unreadable answer ({})", status.as_u16()),
        ApiError::Unreachable(text) => {
            let t = text.to_ascii_lowercase();
            if t.contains("timed out") || t.contains("timeout") {
                "timeout".into()
            } else if t.contains("too many open files") {
                "too many open files".into()
            } else if t.contains("connection refused") {
                "connection refused".into()
            } else if t.contains("connection reset") || t.contains("connection closed") {
                "connection reset".into()
            } else if t.contains("not the leader") {
                "no leader".into()
            } else {
                "unreachable".into()
            }
        }
    }
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
    let fleet = Arc::new(Fleet {
        urls: doc.coordinators.clone(),
        pin: doc.ca_pin.clone(),
        ticket: doc.ticket.clone(),
        pinned,
        ca: OnceLock::new(),
        address,
        spread_sources: address.is_loopback() && address.is_ipv4(),
        hostname_prefix: args.name_prefix.clone(),
        hostname_width: n.to_string().len(),
        jitter: args.jitter.fraction(),
        settle: args.settle,
        start,
        registrations: Semaphore::new(args.concurrency as usize),
        concurrency: args.concurrency,
        slots: (0..n).map(|_| Slot::default()).collect(),
        stats: Mutex::new(Stats::default()),
        interrupted: AtomicBool::new(false),
    });
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
        tasks.push(tokio::spawn(machine(fleet.clone(), i, at, stop.clone())));
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

// ------------------------------------------------------------ one machine

/// One simulated machine, from its start to the end of the run.
async fn machine(fleet: Arc<Fleet>, index: usize, start_at: Instant, mut stop: Shutdown) {
    tokio::select! {
        biased;
        () = stop.requested() => return,
        () = tokio::time::sleep_until(start_at) => {}
    }
    match register(&fleet, index, &mut stop).await {
        Some(m) => m.run(&fleet, &mut stop).await,
        None => fleet.set_state(index, GONE),
    }
}

/// Registers machine `index`; `None` when it failed for good or the run
/// ended first.
async fn register(fleet: &Fleet, index: usize, stop: &mut Shutdown) -> Option<Sim> {
    let hostname = format!(
        "{}-{:0width$}",
        fleet.hostname_prefix,
        index + 1,
        width = fleet.hostname_width
    );
    let fail = |kind: &str, message: String| {
        let mut s = fleet.stats();
        s.registration_failed += 1;
        s.error(format!("register: {kind}"), message);
        fleet.settle(&mut s);
    };
    let (key_pem, csr_pem) = match drover_common::pki::generate_key_and_csr(&hostname) {
        Ok(pair) => pair,
        Err(e) => {
            fail("key", e.to_string());
            return None;
        }
    };
    // A machine's first connection: a full handshake, no shared session.
    let mut config = fleet.pinned.clone();
    config.resumption = Resumption::disabled();
    let client = match fleet.client(index, config) {
        Ok(c) => c,
        Err(e) => {
            fail("client", e.to_string());
            return None;
        }
    };
    let request = RegisterRequest {
        ticket: fleet.ticket.clone(),
        csr_pem,
        facts: MachineFacts {
            hostname,
            addresses: vec![fleet.source(index).to_string()],
            api_server_port: 6443,
            kubelet_healthz_port: 10248,
            agent_version: concat!(env!("CARGO_PKG_VERSION"), "-simulated").to_owned(),
            instance_id: None,
        },
    };
    let mut backoff = Backoff::standard();
    let mut first_sent = None;
    let (response, took) = loop {
        let permit = tokio::select! {
            biased;
            () = stop.requested() => return None,
            p = fleet.registrations.acquire() => p.expect("the semaphore is never closed"),
        };
        let sent = Instant::now();
        let since = *first_sent.get_or_insert(sent);
        let answer = tokio::select! {
            biased;
            () = stop.requested() => return None,
            r = client.register(&request) => r,
        };
        drop(permit);
        match answer {
            Ok(r) => break (r, since.elapsed()),
            Err(e) => {
                let permanent = match &e {
                    ApiError::PinMismatch(_) | ApiError::Client(_) => true,
                    ApiError::Refused { status, .. } => permanent_status(*status),
                    _ => false,
                };
                let mut s = fleet.stats();
                s.api_error("register", &e);
                if permanent {
                    s.registration_failed += 1;
                    fleet.settle(&mut s);
                    return None;
                }
                s.registration_retries += 1;
            }
        }
        tokio::select! {
            biased;
            () = stop.requested() => return None,
            () = tokio::time::sleep(backoff.next_delay()) => {}
        }
    };
    drop(client);
    match Sim::new(fleet, index, &key_pem, response) {
        Ok(sim) => {
            let mut s = fleet.stats();
            s.registered += 1;
            s.registration.record(micros(took));
            s.last_registered = Some(Instant::now());
            s.interval.get_or_insert(sim.interval);
            fleet.settle(&mut s);
            drop(s);
            fleet.set_state(index, IN_POOL);
            Some(sim)
        }
        Err(why) => {
            fail("identity", why);
            None
        }
    }
}

/// Shutdown was requested during a call.
struct Stopped;

/// A registered simulated machine.
struct Sim {
    index: usize,
    uid: String,
    api: CoordinatorClient,
    ca: Arc<CoordinatorCa>,
    interval: Duration,
    phase: AgentPhase,
    assignment: Option<AssignmentNotice>,
    /// The newest assignment generation a reset gave up.
    retired: u64,
    bootstrap: Option<BootstrapReport>,
    results: Vec<DirectiveResult>,
    done: VecDeque<String>,
    config_at: Option<Instant>,
    config_backoff: Backoff,
}

impl Sim {
    fn new(
        fleet: &Fleet,
        index: usize,
        key_pem: &str,
        r: RegisterResponse,
    ) -> Result<Self, String> {
        let ca = fleet.coordinator_ca(&r.coordinator_ca_pem)?;
        let mut config = tls::mtls_config_with(ca.verifier.clone(), &r.certificate_pem, key_pem)
            .map_err(|e| e.to_string())?;
        config.resumption = Resumption::in_memory_sessions(SESSIONS_PER_MACHINE);
        let api = fleet.client(index, config).map_err(|e| e.to_string())?;
        let _ = fleet.slots[index].name.set(r.machine_name);
        Ok(Self {
            index,
            uid: r.machine_uid,
            api,
            ca,
            interval: clamp_interval(Duration::from_secs(r.heartbeat_interval_seconds)),
            phase: AgentPhase::Waiting,
            assignment: None,
            retired: 0,
            bootstrap: None,
            results: Vec::new(),
            done: VecDeque::new(),
            config_at: None,
            config_backoff: Backoff::standard(),
        })
    }

    /// Heartbeats (and fetches the config when assigned) until the run ends
    /// or the machine is silenced.
    async fn run(mut self, fleet: &Fleet, stop: &mut Shutdown) {
        // Like the agent: the first heartbeat right after registration.
        let mut next_heartbeat = Instant::now();
        loop {
            let wake = match self.config_at {
                Some(at) if at < next_heartbeat => at,
                _ => next_heartbeat,
            };
            tokio::select! {
                biased;
                () = stop.requested() => return,
                () = tokio::time::sleep_until(wake) => {}
            }
            if fleet.slots[self.index].silence.load(Ordering::Relaxed) {
                // Dropping the client closes the connection, as a dead
                // machine's kernel would.
                fleet.set_state(self.index, GONE);
                return;
            }
            let mut soon = false;
            if self.config_at.is_some_and(|at| at <= Instant::now()) {
                match self.fetch_config(fleet, stop).await {
                    Ok(s) => soon = s,
                    Err(Stopped) => return,
                }
            }
            if soon || next_heartbeat <= Instant::now() {
                match self.heartbeat(fleet, stop).await {
                    Ok(next) => next_heartbeat = next,
                    Err(Stopped) => return,
                }
            }
        }
    }

    fn role(&self) -> Option<MachineRole> {
        self.assignment.as_ref().map(|a| a.role)
    }

    fn request(&self) -> HeartbeatRequest {
        let healthy = || Probe {
            state: ProbeState::Healthy,
            message: String::new(),
        };
        let control_plane = self.role().is_some_and(|r| r.is_control_plane());
        HeartbeatRequest {
            phase: self.phase,
            applied_generation: self.assignment.as_ref().map_or(0, |a| a.generation),
            health: HealthReport {
                kubelet: healthy(),
                api_server: (self.phase == AgentPhase::Running && control_plane).then(healthy),
                disk_free_bytes: DISK_FREE_BYTES,
            },
            bootstrap: self.bootstrap.clone(),
            directive_results: self.results.clone(),
        }
    }

    /// Sends one heartbeat; returns when the next is due.
    async fn heartbeat(&mut self, fleet: &Fleet, stop: &mut Shutdown) -> Result<Instant, Stopped> {
        let request = self.request();
        let timeout = self
            .interval
            .clamp(Duration::from_secs(2), Duration::from_secs(20));
        let sent = Instant::now();
        fleet.stats().heartbeats_sent += 1;
        let answer = tokio::select! {
            biased;
            () = stop.requested() => return Err(Stopped),
            r = self.api.heartbeat(&request, timeout) => r,
        };
        let took = sent.elapsed();
        match answer {
            Ok(reply) => {
                {
                    let mut s = fleet.stats();
                    s.heartbeats_ok += 1;
                    s.heartbeat.record(micros(took));
                    if s.steady_from.is_some_and(|from| sent >= from) {
                        s.steady_heartbeat.record(micros(took));
                    }
                    s.first_heartbeat.get_or_insert(sent);
                    let second = (sent - fleet.start).as_secs() as usize;
                    if s.heartbeats_per_second.len() <= second {
                        s.heartbeats_per_second.resize(second + 1, 0);
                    }
                    s.heartbeats_per_second[second] += 1;
                }
                self.results.drain(..request.directive_results.len());
                self.interval =
                    clamp_interval(Duration::from_secs(reply.heartbeat_interval_seconds));
                let soon = self.on_reply(fleet, reply);
                Ok(if soon {
                    Instant::now()
                } else {
                    Instant::now() + fleet.jittered(self.interval)
                })
            }
            Err(e) => {
                let mut s = fleet.stats();
                s.heartbeats_failed += 1;
                s.api_error("heartbeat", &e);
                drop(s);
                Ok(Instant::now() + fleet.jittered(self.interval))
            }
        }
    }

    /// Acts on a heartbeat answer; true when the next heartbeat should go
    /// at once (to report what changed).
    fn on_reply(&mut self, fleet: &Fleet, reply: HeartbeatResponse) -> bool {
        let mut soon = false;
        for d in reply.directives {
            if self.done.contains(&d.id) {
                continue;
            }
            let (ok, message) = match d.action {
                DirectiveAction::CreateBootstrapToken { token, .. } => {
                    if self.phase == AgentPhase::Running
                        && self.role().is_some_and(|r| r.is_control_plane())
                    {
                        (
                            true,
                            format!(
                                "bootstrap token {} created (simulated machine; no kubeadm ran)",
                                token.id()
                            ),
                        )
                    } else {
                        (
                            false,
                            format!(
                                "this machine cannot create bootstrap tokens: it is not a running control-plane machine (phase {:?})",
                                self.phase
                            ),
                        )
                    }
                }
                DirectiveAction::Reset { .. } => {
                    if let Some(a) = self.assignment.take() {
                        self.retired = self.retired.max(a.generation);
                    }
                    self.phase = AgentPhase::Waiting;
                    self.bootstrap = None;
                    self.config_at = None;
                    fleet.set_state(self.index, IN_POOL);
                    (
                        true,
                        "reset done (simulated machine); back in the pool".to_owned(),
                    )
                }
            };
            fleet.stats().directives += 1;
            if self.done.len() == REMEMBERED_DIRECTIVES {
                self.done.pop_front();
            }
            self.done.push_back(d.id.clone());
            self.results.push(DirectiveResult {
                id: d.id,
                ok,
                message,
            });
            soon = true;
        }
        if let Some(notice) = reply.assignment {
            soon |= self.on_assignment(fleet, notice);
        }
        soon
    }

    fn on_assignment(&mut self, fleet: &Fleet, notice: AssignmentNotice) -> bool {
        let newer = match &self.assignment {
            None => notice.generation > self.retired,
            Some(a) => notice.generation > a.generation && self.phase != AgentPhase::Running,
        };
        if newer {
            self.assignment = Some(notice);
            self.phase = AgentPhase::Bootstrapping;
            self.bootstrap = Some(BootstrapReport {
                step: "fetch-config".into(),
                failure: None,
            });
            self.config_at = Some(Instant::now());
            self.config_backoff.reset();
            fleet.set_state(self.index, ASSIGNED);
            return true;
        }
        // A heartbeat saying "assigned" resumes fetching after a 404.
        if self.phase == AgentPhase::Bootstrapping
            && self.config_at.is_none()
            && self
                .assignment
                .as_ref()
                .is_some_and(|a| a.generation == notice.generation)
        {
            self.config_at = Some(Instant::now());
        }
        false
    }

    /// Fetches and verifies the config bundle; true when the machine now
    /// has something new to report.
    async fn fetch_config(&mut self, fleet: &Fleet, stop: &mut Shutdown) -> Result<bool, Stopped> {
        let Some(want) = self.assignment.as_ref().map(|a| a.generation) else {
            self.config_at = None;
            return Ok(false);
        };
        let sent = Instant::now();
        let answer = tokio::select! {
            biased;
            () = stop.requested() => return Err(Stopped),
            r = self.api.config() => r,
        };
        let took = sent.elapsed();
        let now = Instant::now();
        match answer {
            Ok(ConfigAnswer::Bundle(signed)) => {
                match drover_common::bundle::verify(&signed, &self.ca.der, &self.uid) {
                    Ok(bundle) if bundle.generation >= want => {
                        {
                            let mut s = fleet.stats();
                            s.config_fetches += 1;
                            s.config.record(micros(took));
                        }
                        self.config_at = None;
                        self.assignment = Some(AssignmentNotice {
                            cluster: bundle.cluster,
                            role: bundle.role,
                            generation: bundle.generation,
                        });
                        // As if kubeadm had run and succeeded.
                        self.phase = AgentPhase::Running;
                        self.bootstrap = Some(BootstrapReport {
                            step: kubeadm_step_name(bundle.role).into(),
                            failure: None,
                        });
                        Ok(true)
                    }
                    Ok(bundle) => {
                        fleet.stats().error(
                            "config: stale bundle".into(),
                            format!(
                                "bundle generation {} is older than the assignment's {want}",
                                bundle.generation
                            ),
                        );
                        self.config_at = Some(now + self.config_backoff.next_delay());
                        Ok(false)
                    }
                    Err(e) => {
                        let why = format!("config bundle refused: {e}");
                        {
                            let mut s = fleet.stats();
                            s.config_failed += 1;
                            s.error("config: invalid bundle".into(), why.clone());
                        }
                        self.config_at = None;
                        self.phase = AgentPhase::Failed;
                        self.bootstrap = Some(BootstrapReport {
                            step: "fetch-config".into(),
                            failure: Some(CommandFailure {
                                command: format!("GET {}", crate::api::CONFIG_PATH),
                                exit_code: None,
                                output_tail: vec![why],
                                at: drover_common::now(),
                            }),
                        });
                        Ok(true)
                    }
                }
            }
            Ok(ConfigAnswer::NotReady(not_ready)) => {
                fleet.stats().config_not_ready += 1;
                self.config_backoff.reset();
                self.config_at = Some(now + config_retry_delay(not_ready.retry_after_seconds));
                Ok(false)
            }
            Ok(ConfigAnswer::NotAssigned) => {
                self.config_at = None;
                Ok(false)
            }
            Err(e) => {
                {
                    let mut s = fleet.stats();
                    s.config_failed += 1;
                    s.api_error("config", &e);
                }
                self.config_at = Some(now + self.config_backoff.next_delay());
                Ok(false)
            }
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

// ------------------------------------------------------------ histogram

/// A latency histogram in the style of HdrHistogram: exact below 256 µs,
/// above that 128 buckets per power of two, so a percentile is reported
/// at most 1/128 (0.8 %) above the true value and never below it. Memory
/// is bounded (at most 7,424 counters) however many values are recorded.
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    min: u64,
    max: u64,
    sum: u128,
}

/// Sub-buckets per power of two, as a power of two.
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;

impl Histogram {
    fn index(v: u64) -> usize {
        if v < 2 * SUB {
            return v as usize;
        }
        let shift = (63 - v.leading_zeros()) - SUB_BITS;
        let top = v >> shift;
        (SUB * (u64::from(shift) + 1) + (top - SUB)) as usize
    }

    /// The largest value that lands in bucket `i`.
    fn highest_in(i: usize) -> u64 {
        let i = i as u64;
        if i < 2 * SUB {
            return i;
        }
        let shift = i / SUB - 1;
        let top = SUB + i % SUB;
        let end = u128::from(top + 1) << shift;
        u64::try_from(end - 1).unwrap_or(u64::MAX)
    }

    /// Records one value (microseconds).
    pub fn record(&mut self, v: u64) {
        let i = Self::index(v);
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
        if self.total == 0 || v < self.min {
            self.min = v;
        }
        self.max = self.max.max(v);
        self.total += 1;
        self.sum += u128::from(v);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The nearest-rank percentile `p` (0 < p <= 100): the smallest
    /// recorded value that at least `p` % of all values do not exceed, up
    /// to the bucket resolution; `None` when nothing was recorded.
    pub fn percentile(&self, p: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = nearest_rank(p, self.total);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Self::highest_in(i).clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }

    fn latency(&self) -> Latency {
        let p = |q| self.percentile(q).map(ms);
        Latency {
            count: self.count(),
            min_ms: (self.total > 0).then(|| ms(self.min)),
            mean_ms: (self.total > 0).then(|| {
                let mean_us = self.sum as f64 / self.total as f64;
                mean_us.round() / 1000.0
            }),
            p50_ms: p(50.0),
            p90_ms: p(90.0),
            p99_ms: p(99.0),
            max_ms: (self.total > 0).then(|| ms(self.max)),
        }
    }
}

/// The 1-based nearest rank of percentile `p` among `total` values:
/// ceil(p/100 * total), in integers (to a millionth of a percent) so that
/// p99.9 of 1,000 values is the 999th, not the 1,000th through a rounding
/// error.
fn nearest_rank(p: f64, total: u64) -> u64 {
    let per_hundred_million = (p.clamp(0.0, 100.0) * 1_000_000.0).round() as u128;
    let rank = (per_hundred_million * u128::from(total)).div_ceil(100_000_000);
    (rank as u64).clamp(1, total.max(1))
}

/// Microseconds as milliseconds with microsecond precision.
fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

// ------------------------------------------------------------ summary

/// The end-of-run summary; `--summary-json` writes it as is.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub coordinators: Vec<String>,
    pub machines: u32,
    /// How long the run lasted.
    pub duration_seconds: f64,
    pub planned_duration_seconds: f64,
    pub ramp_seconds: f64,
    pub concurrency: u32,
    pub jitter_percent: u32,
    /// Whether SIGINT or SIGTERM ended the run early.
    pub interrupted: bool,
    pub registration: RegistrationSummary,
    pub heartbeats: HeartbeatSummary,
    pub config: ConfigSummary,
    pub silence: SilenceSummary,
    pub errors: Vec<ErrorSummary>,
    pub simulator: SimulatorSummary,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationSummary {
    pub registered: u64,
    /// Refused for good (bad or used-up token, wrong CA pin).
    pub failed: u64,
    /// Not registered when the run ended (not started yet, or retrying).
    pub unfinished: u64,
    /// Attempts that failed and were retried (429, 5xx, unreachable).
    pub retries: u64,
    /// From the start of the run to the last registration.
    pub total_seconds: Option<f64>,
    pub per_second: Option<f64>,
    /// Per machine, from its first request to its identity (retries
    /// included, waiting for --concurrency excluded).
    pub latency: Latency,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatSummary {
    /// The interval the coordinator named.
    pub interval_seconds: Option<f64>,
    pub sent: u64,
    pub ok: u64,
    pub failed: u64,
    /// Latency of the successful heartbeats.
    pub latency: Latency,
    /// The same in the steady state: heartbeats sent one interval or more
    /// after every machine registered (none when the run ended first).
    pub steady_latency: Latency,
    /// Successful heartbeats per second, from the first to the end.
    pub rate_per_second: Option<f64>,
    /// The same over the whole seconds of the steady state.
    pub steady_rate_per_second: Option<f64>,
    /// Heartbeating machines at the end divided by the interval.
    pub expected_rate_per_second: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigSummary {
    /// Signed bundles fetched and verified.
    pub fetches: u64,
    /// "Not ready yet" answers (409), retried.
    pub not_ready: u64,
    pub failed: u64,
    pub latency: Latency,
    /// Directives (join tokens, resets) acknowledged.
    pub directives: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SilenceSummary {
    pub requested: u32,
    pub silenced: usize,
    pub after_seconds: Option<f64>,
    /// When, in RFC 3339, to compare with the coordinator's view.
    pub at: Option<String>,
    /// The coordinator's names of the silenced machines.
    pub machines: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorSummary {
    pub kind: String,
    pub count: u64,
    pub examples: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimulatorSummary {
    /// Resident memory at the end, with every machine still connected.
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
    /// Before any machine started.
    pub baseline_rss_bytes: u64,
    /// (rss - baseline) / registered machines.
    pub rss_per_machine_bytes: Option<u64>,
    pub open_files_limit: Option<u64>,
    pub worker_threads: usize,
}

/// Latency figures in milliseconds.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Latency {
    pub count: u64,
    pub min_ms: Option<f64>,
    pub mean_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

fn summarize(
    args: &SimulateArgs,
    doc: &BootstrapDocument,
    fleet: &Fleet,
    end: Instant,
    interrupted: bool,
    mut simulator: SimulatorSummary,
    notes: Vec<String>,
) -> Summary {
    let s = fleet.stats();
    let start = fleet.start;
    let round = |v: f64| (v * 1000.0).round() / 1000.0;
    let total = s.last_registered.map(|t| (t - start).as_secs_f64());
    let interval = s.interval.map(|i| i.as_secs_f64());
    let heartbeating = fleet
        .slots
        .iter()
        .filter(|slot| matches!(slot.state.load(Ordering::Relaxed), IN_POOL | ASSIGNED))
        .count();
    let rate = s.first_heartbeat.and_then(|first| {
        let window = (end - first).as_secs_f64();
        (window > 0.0).then(|| round(s.heartbeats_ok as f64 / window))
    });
    // The whole seconds of the steady state, up to the last whole second of
    // the run.
    let steady = match s.steady_from {
        Some(from) => {
            let from = from.saturating_duration_since(start).as_secs_f64().ceil() as usize;
            let to = (end - start).as_secs_f64().floor() as usize;
            let to = to.min(s.heartbeats_per_second.len());
            (to > from).then(|| {
                let sum: u64 = s.heartbeats_per_second[from..to].iter().sum();
                round(sum as f64 / (to - from) as f64)
            })
        }
        _ => None,
    };
    simulator.rss_per_machine_bytes = simulator
        .rss_bytes
        .saturating_sub(simulator.baseline_rss_bytes)
        .checked_div(s.registered);
    Summary {
        coordinators: doc.coordinators.clone(),
        machines: args.machines,
        duration_seconds: round((end - start).as_secs_f64()),
        planned_duration_seconds: args.duration.as_secs_f64(),
        ramp_seconds: args.ramp().as_secs_f64(),
        concurrency: args.concurrency,
        jitter_percent: args.jitter.0,
        interrupted,
        registration: RegistrationSummary {
            registered: s.registered,
            failed: s.registration_failed,
            unfinished: u64::from(args.machines)
                .saturating_sub(s.registered + s.registration_failed),
            retries: s.registration_retries,
            total_seconds: total.map(round),
            per_second: total
                .filter(|t| *t > 0.0)
                .map(|t| round(s.registered as f64 / t)),
            latency: s.registration.latency(),
        },
        heartbeats: HeartbeatSummary {
            interval_seconds: interval,
            sent: s.heartbeats_sent,
            ok: s.heartbeats_ok,
            failed: s.heartbeats_failed,
            latency: s.heartbeat.latency(),
            steady_latency: s.steady_heartbeat.latency(),
            rate_per_second: rate,
            steady_rate_per_second: steady,
            expected_rate_per_second: interval.map(|i| round(heartbeating as f64 / i)),
        },
        config: ConfigSummary {
            fetches: s.config_fetches,
            not_ready: s.config_not_ready,
            failed: s.config_failed,
            latency: s.config.latency(),
            directives: s.directives,
        },
        silence: SilenceSummary {
            requested: args.silence,
            silenced: s.silenced.len(),
            after_seconds: (args.silence > 0).then_some(args.silence_after.as_secs_f64()),
            at: s.silenced_at.map(|(_, wall)| crate::agent::rfc3339(wall)),
            machines: s.silenced.clone(),
        },
        errors: s
            .errors
            .iter()
            .map(|(kind, e)| ErrorSummary {
                kind: kind.clone(),
                count: e.count,
                examples: e.examples.clone(),
            })
            .collect(),
        simulator,
        notes,
    }
}

fn fmt_ms(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v >= 100.0 => format!("{v:.0} ms"),
        Some(v) if v >= 10.0 => format!("{v:.1} ms"),
        Some(v) => format!("{v:.2} ms"),
    }
}

fn fmt_latency(l: &Latency) -> String {
    if l.count == 0 {
        return "-".into();
    }
    format!(
        "p50 {}  p90 {}  p99 {}  max {}  (mean {}, n={})",
        fmt_ms(l.p50_ms),
        fmt_ms(l.p90_ms),
        fmt_ms(l.p99_ms),
        fmt_ms(l.max_ms),
        fmt_ms(l.mean_ms),
        l.count
    )
}

fn fmt_rate(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}/s"))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The summary as the table printed at the end.
pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "\nDrover fleet simulation: {} machines, {} of {} (ramp {}s, concurrency {}, jitter {}%){}",
        s.machines,
        secs(Duration::from_secs_f64(s.duration_seconds)),
        secs(Duration::from_secs_f64(s.planned_duration_seconds)),
        trim_float(s.ramp_seconds, 3),
        s.concurrency,
        s.jitter_percent,
        if s.interrupted { ", interrupted" } else { "" }
    );
    let _ = writeln!(w, "coordinator: {}", s.coordinators.join(", "));
    let row = |w: &mut String, label: &str, value: String| {
        let _ = writeln!(w, "  {label:<22}{value}");
    };
    let r = &s.registration;
    let _ = writeln!(w, "\nRegistration");
    row(
        w,
        "registered",
        format!(
            "{} / {}   failed {}, unfinished {}, retries {}",
            r.registered, s.machines, r.failed, r.unfinished, r.retries
        ),
    );
    row(
        w,
        "total time",
        match (r.total_seconds, r.per_second) {
            (Some(t), rate) => format!("{t:.2} s  ({})", fmt_rate(rate)),
            _ => "-".into(),
        },
    );
    row(w, "per registration", fmt_latency(&r.latency));
    let h = &s.heartbeats;
    let _ = writeln!(
        w,
        "\nHeartbeats (interval {}, jitter ±{}%)",
        h.interval_seconds
            .map_or("-".into(), |i| format!("{} s", trim_float(i, 3))),
        s.jitter_percent
    );
    row(
        w,
        "sent / ok / failed",
        format!("{} / {} / {}", h.sent, h.ok, h.failed),
    );
    row(w, "latency", fmt_latency(&h.latency));
    row(w, "latency (steady)", fmt_latency(&h.steady_latency));
    row(
        w,
        "rate",
        format!(
            "{} overall, {} steady, {} expected",
            fmt_rate(h.rate_per_second),
            fmt_rate(h.steady_rate_per_second),
            fmt_rate(h.expected_rate_per_second)
        ),
    );
    let c = &s.config;
    let _ = writeln!(w, "\nConfig");
    row(
        w,
        "bundles fetched",
        format!(
            "{}   not ready {}, failed {}, directives answered {}",
            c.fetches, c.not_ready, c.failed, c.directives
        ),
    );
    if c.latency.count > 0 {
        row(w, "fetch latency", fmt_latency(&c.latency));
    }
    if s.silence.requested > 0 {
        let _ = writeln!(w, "\nSilence");
        let mut names = s
            .silence
            .machines
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if s.silence.machines.len() > 5 {
            names.push_str(", ...");
        }
        row(
            w,
            "silenced",
            match &s.silence.at {
                Some(at) => format!(
                    "{} of {} at +{}s ({at}): {names}",
                    s.silence.silenced,
                    s.silence.requested,
                    trim_float(s.silence.after_seconds.unwrap_or_default(), 3)
                ),
                None => format!("0 of {} (the run ended first)", s.silence.requested),
            },
        );
    }
    let _ = writeln!(w, "\nErrors");
    if s.errors.is_empty() {
        let _ = writeln!(w, "  none");
    }
    for e in &s.errors {
        row(w, &e.kind, e.count.to_string());
        for ex in &e.examples {
            let ex: String = ex.chars().take(300).collect();
            let _ = writeln!(w, "      {ex}");
        }
    }
    let m = &s.simulator;
    let _ = writeln!(w, "\nSimulator");
    row(
        w,
        "memory (RSS)",
        format!(
            "{} at the end, {} peak, {} before the fleet{}",
            mib(m.rss_bytes),
            mib(m.peak_rss_bytes),
            mib(m.baseline_rss_bytes),
            m.rss_per_machine_bytes.map_or(String::new(), |b| format!(
                "; {:.1} KiB per machine",
                b as f64 / 1024.0
            ))
        ),
    );
    row(
        w,
        "open-file limit",
        m.open_files_limit
            .map_or("unknown".into(), |l| l.to_string()),
    );
    row(w, "worker threads", m.worker_threads.to_string());
    for n in &s.notes {
        let _ = writeln!(w, "  note: {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrap {
        #[command(flatten)]
        args: SimulateArgs,
    }

    fn parse(extra: &[&str]) -> Result<SimulateArgs, clap::Error> {
        let base = ["simulate", "--bootstrap", "boot.yaml", "--machines", "20"];
        Wrap::try_parse_from(base.iter().chain(extra)).map(|w| w.args)
    }

    #[test]
    fn machines_get_distinct_loopback_sources() {
        assert_eq!(loopback_source(0).to_string(), "127.1.0.0");
        assert_eq!(loopback_source(257).to_string(), "127.1.1.1");
        assert_eq!(loopback_source(65_536).to_string(), "127.2.0.0");
        let all: std::collections::HashSet<_> = (0..50_000).map(loopback_source).collect();
        assert_eq!(all.len(), 50_000);
        assert!(all.iter().all(|a| a.is_loopback()));
    }

    #[test]
    fn cli_defaults() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.machines, 20);
        assert_eq!(a.duration, Duration::from_secs(60));
        assert_eq!(a.ramp(), Duration::from_secs(10));
        assert_eq!(a.concurrency, 256);
        assert_eq!(a.jitter, Jitter(10));
        assert_eq!(a.silence, 0);
        assert_eq!(a.silence_after, Duration::from_secs(30));
        assert_eq!(a.name_prefix, "sim");
        assert_eq!(a.progress, Duration::from_secs(5));
        assert!(a.summary_json.is_none());
        a.check().unwrap();
    }

    #[test]
    fn cli_values() {
        let a = parse(&[
            "--duration",
            "5s",
            "--ramp",
            "0",
            "--jitter",
            "25",
            "--silence",
            "5",
            "--silence-after",
            "2s",
            "--summary-json",
            "out.json",
            "--concurrency",
            "8",
            "--name-prefix",
            "rack-7",
            "--progress",
            "500ms",
        ])
        .unwrap();
        assert_eq!(a.duration, Duration::from_secs(5));
        assert_eq!(a.ramp(), Duration::ZERO);
        assert_eq!(a.jitter, Jitter(25));
        assert_eq!(a.jitter.fraction(), 0.25);
        assert_eq!(a.silence, 5);
        assert_eq!(a.silence_after, Duration::from_secs(2));
        assert_eq!(a.summary_json, Some(PathBuf::from("out.json")));
        assert_eq!(a.concurrency, 8);
        assert_eq!(a.name_prefix, "rack-7");
        assert_eq!(a.progress, Duration::from_millis(500));
        a.check().unwrap();
        assert_eq!(parse(&["--jitter", "0%"]).unwrap().jitter, Jitter(0));
        assert_eq!(parse(&["--jitter", "100%"]).unwrap().jitter, Jitter(100));
    }

    #[test]
    fn cli_errors_name_the_flag() {
        for (bad, needle) in [
            (vec!["--machines", "0"], "--machines"),
            (vec!["--machines", "x"], "--machines"),
            (vec!["--duration", "5"], "needs a unit"),
            (vec!["--ramp", "soon"], "--ramp"),
            (vec!["--jitter", "150%"], "from 0% to 100%"),
            (vec!["--jitter=-1%"], "from 0% to 100%"),
            (vec!["--concurrency", "0"], "--concurrency"),
            (vec!["--name-prefix", "a b"], "host names"),
            (vec!["--frobnicate"], "--frobnicate"),
        ] {
            let err = parse(&bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{bad:?}: {err}");
        }
        // Required flags.
        let err = Wrap::try_parse_from(["simulate", "--machines", "3"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--bootstrap"), "{err}");
        let err = Wrap::try_parse_from(["simulate", "--bootstrap", "b"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--machines"), "{err}");
    }

    #[test]
    fn cross_flag_checks() {
        let err = |extra: &[&str]| format!("{:#}", parse(extra).unwrap().check().unwrap_err());
        assert!(
            err(&["--silence", "21"]).contains("--silence 21 is more than --machines 20"),
            "{}",
            err(&["--silence", "21"])
        );
        assert!(err(&["--duration", "5s", "--ramp", "10s"]).contains("--ramp 10s is longer"));
        assert!(err(&[
            "--duration",
            "5s",
            "--ramp",
            "0",
            "--silence",
            "1",
            "--silence-after",
            "5s"
        ])
        .contains("not within --duration 5s"));
        assert!(err(&["--duration", "0"]).contains("--duration must be longer than 0"));
        assert!(
            err(&["--duration", "30s", "--ramp", "20s", "--settle", "10s"])
                .contains("--settle 10s is not within --duration 30s")
        );
        parse(&["--duration", "30s", "--ramp", "20s", "--settle", "9s"])
            .unwrap()
            .check()
            .unwrap();
        // A short run ramps over its whole length by default; a silence
        // time beyond the run is fine when nothing goes silent.
        assert_eq!(
            parse(&["--duration", "5s"]).unwrap().ramp(),
            Duration::from_secs(5)
        );
        parse(&["--duration", "5s"]).unwrap().check().unwrap();
    }

    #[test]
    fn histogram_buckets_are_contiguous() {
        let mut last = None;
        for v in (0..5000u64).chain([1 << 20, (1 << 20) + 1, u64::MAX / 2, u64::MAX]) {
            let i = Histogram::index(v);
            assert!(Histogram::highest_in(i) >= v, "{v} above bucket {i}");
            if i > 0 {
                assert!(
                    Histogram::highest_in(i - 1) < v,
                    "{v} fits bucket {}",
                    i - 1
                );
            }
            if let Some(l) = last {
                assert!(i >= l);
            }
            last = Some(i);
        }
        assert_eq!(Histogram::index(u64::MAX), 7423);
    }

    /// Nearest-rank percentile of sorted values.
    fn exact(sorted: &[u64], p: f64) -> u64 {
        sorted[nearest_rank(p, sorted.len() as u64) as usize - 1]
    }

    #[test]
    fn percentiles_match_exact_within_resolution() {
        let mut rng = rand::rng();
        for n in [1usize, 2, 3, 10, 99, 100, 101, 1000, 54_321] {
            let mut values: Vec<u64> = (0..n)
                .map(|_| {
                    // Latencies from microseconds to tens of seconds.
                    let exp = rng.random_range(0.0..25.0f64);
                    2f64.powf(exp) as u64
                })
                .collect();
            let mut h = Histogram::default();
            for &v in &values {
                h.record(v);
            }
            values.sort_unstable();
            assert_eq!(h.count(), n as u64);
            for p in [0.1, 1.0, 50.0, 90.0, 99.0, 99.9, 100.0] {
                let want = exact(&values, p);
                let got = h.percentile(p).unwrap();
                assert!(got >= want, "n={n} p{p}: {got} < exact {want}");
                assert!(
                    got as f64 <= want as f64 * (1.0 + 1.0 / 128.0),
                    "n={n} p{p}: {got} too far above exact {want}"
                );
            }
            assert_eq!(h.percentile(100.0), Some(values[n - 1]));
            let l = h.latency();
            assert_eq!(l.max_ms, Some(ms(values[n - 1])));
            assert_eq!(l.min_ms, Some(ms(values[0])));
        }
    }

    #[test]
    fn nearest_ranks() {
        assert_eq!(nearest_rank(50.0, 4), 2);
        assert_eq!(nearest_rank(99.9, 1000), 999);
        assert_eq!(nearest_rank(99.0, 100), 99);
        assert_eq!(nearest_rank(99.0, 101), 100);
        assert_eq!(nearest_rank(100.0, 7), 7);
        assert_eq!(nearest_rank(0.0, 7), 1);
        assert_eq!(nearest_rank(0.001, 1_000_000), 10);
    }

    #[test]
    fn percentiles_small_cases() {
        let mut h = Histogram::default();
        assert_eq!(h.percentile(50.0), None);
        assert_eq!(h.latency().count, 0);
        assert_eq!(h.latency().p99_ms, None);
        // 1..=100 µs: exact in this range; nearest rank.
        for v in 1..=100 {
            h.record(v);
        }
        assert_eq!(h.percentile(50.0), Some(50));
        assert_eq!(h.percentile(90.0), Some(90));
        assert_eq!(h.percentile(99.0), Some(99));
        assert_eq!(h.percentile(99.5), Some(100));
        assert_eq!(h.percentile(100.0), Some(100));
        assert_eq!(h.percentile(0.5), Some(1));
        let l = h.latency();
        assert_eq!(l.mean_ms, Some(0.051)); // 50.5 µs
                                            // One slow outlier among fast values shows only at the top.
        let mut h = Histogram::default();
        for _ in 0..999 {
            h.record(1_000);
        }
        h.record(5_000_000);
        // The bucket of 1000 µs holds 1000..=1003.
        assert_eq!(h.percentile(99.0), Some(1_003));
        assert_eq!(h.percentile(99.9), Some(1_003));
        assert_eq!(h.percentile(100.0), Some(5_000_000));
    }

    fn summary() -> Summary {
        let mut hist = Histogram::default();
        for v in [900, 1_200, 1_500, 40_000] {
            hist.record(v);
        }
        Summary {
            coordinators: vec!["https://127.0.0.1:7443".into()],
            machines: 20,
            duration_seconds: 5.01,
            planned_duration_seconds: 5.0,
            ramp_seconds: 0.0,
            concurrency: 256,
            jitter_percent: 10,
            interrupted: false,
            registration: RegistrationSummary {
                registered: 19,
                failed: 1,
                unfinished: 0,
                retries: 2,
                total_seconds: Some(0.5),
                per_second: Some(38.0),
                latency: hist.latency(),
            },
            heartbeats: HeartbeatSummary {
                interval_seconds: Some(1.0),
                sent: 90,
                ok: 88,
                failed: 2,
                latency: hist.latency(),
                steady_latency: Histogram::default().latency(),
                rate_per_second: Some(18.1),
                steady_rate_per_second: Some(19.0),
                expected_rate_per_second: Some(19.0),
            },
            config: ConfigSummary {
                fetches: 3,
                not_ready: 4,
                failed: 0,
                latency: Histogram::default().latency(),
                directives: 1,
            },
            silence: SilenceSummary {
                requested: 5,
                silenced: 5,
                after_seconds: Some(2.0),
                at: Some("2025-01-01T00:00:02Z".into()),
                machines: (1..=6).map(|i| format!("sim-{i}")).collect(),
            },
            errors: vec![ErrorSummary {
                kind: "register: HTTP 409".into(),
                count: 1,
                examples: vec!["ticket already used".into()],
            }],
            simulator: SimulatorSummary {
                rss_bytes: 30 << 20,
                peak_rss_bytes: 31 << 20,
                baseline_rss_bytes: 10 << 20,
                rss_per_machine_bytes: Some((20 << 20) / 19),
                open_files_limit: Some(20000),
                worker_threads: 2,
            },
            notes: vec!["a note".into()],
        }
    }

    #[test]
    fn summary_table_and_json() {
        let s = summary();
        let table = render(&s);
        for needle in [
            "20 machines, 5.01s of 5s",
            "19 / 20   failed 1, unfinished 0, retries 2",
            "0.50 s  (38.0/s)",
            "p50 1.21 ms  p90 40.0 ms  p99 40.0 ms  max 40.0 ms",
            "90 / 88 / 2",
            "latency (steady)      -\n",
            "18.1/s overall, 19.0/s steady, 19.0/s expected",
            "bundles fetched",
            "5 of 5 at +2s (2025-01-01T00:00:02Z): sim-1, sim-2, sim-3, sim-4, sim-5, ...",
            "register: HTTP 409",
            "ticket already used",
            "30.0 MiB at the end",
            "1077.9 KiB per machine",
            "note: a note",
        ] {
            assert!(table.contains(needle), "{needle:?} not in\n{table}");
        }
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["registration"]["registered"], 19);
        assert_eq!(json["heartbeats"]["latency"]["p99Ms"], 40.0);
        assert_eq!(json["heartbeats"]["latency"]["p50Ms"], 1.207);
        assert_eq!(json["config"]["fetches"], 3);
        assert_eq!(json["silence"]["machines"][0], "sim-1");
        assert_eq!(json["errors"][0]["kind"], "register: HTTP 409");
        assert_eq!(json["simulator"]["rssBytes"], 30 << 20);
        assert_eq!(json["heartbeats"]["steadyRatePerSecond"], 19.0);
    }

    #[test]
    fn error_kinds() {
        assert_eq!(
            error_kind(&ApiError::Unreachable(
                "https://x: error sending request: operation timed out".into()
            )),
            "timeout"
        );
        assert_eq!(
            error_kind(&ApiError::Unreachable(
                "https://x: client error (Connect): tcp connect error: Connection refused (os error 111)".into()
            )),
            "connection refused"
        );
        assert_eq!(
            error_kind(&ApiError::Unreachable(
                "https://x: Too many open files".into()
            )),
            "too many open files"
        );
        let refused = ApiError::Refused {
            method: reqwest::Method::POST,
            url: "https://x/v1/machine/register".into(),
            status: reqwest::StatusCode::TOO_MANY_REQUESTS,
            problem: Box::new(drover_common::api::Problem {
                type_: "about:blank".into(),
                title: "Too many registrations".into(),
                status: 429,
                detail: String::new(),
                errors: vec![],
            }),
        };
        assert_eq!(error_kind(&refused), "HTTP 429");
        let mut s = Stats::default();
        for i in 0..5 {
            s.error("heartbeat: timeout".into(), format!("m{i}"));
        }
        s.error("heartbeat: timeout".into(), "m0".into());
        let e = &s.errors["heartbeat: timeout"];
        assert_eq!(e.count, 6);
        assert_eq!(e.examples, ["m0", "m1", "m2"]);
    }

    #[test]
    fn status_parsing() {
        let status = "Name:\tx\nVmHWM:\t   2048 kB\nVmRSS:\t   1024 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), 1024);
        assert_eq!(status_kib(status, "VmHWM:"), 2048);
        assert_eq!(status_kib(status, "VmSwap:"), 0);
        let (rss, peak) = memory();
        assert!(rss > 0 && peak >= rss, "{rss} {peak}");
    }

    #[test]
    fn jitter_stays_in_bounds() {
        let ten = Duration::from_secs(10);
        let (mut low, mut high) = (ten, ten);
        for _ in 0..2000 {
            let d = jittered(ten, 0.1);
            assert!(
                d >= Duration::from_secs(9) && d <= Duration::from_secs(11),
                "{d:?}"
            );
            low = low.min(d);
            high = high.max(d);
        }
        // It does spread.
        assert!(low < Duration::from_millis(9_500) && high > Duration::from_millis(10_500));
        assert_eq!(jittered(ten, 0.0), ten);
        assert!(jittered(ten, 1.0) <= Duration::from_secs(20));
    }
}
