//! What every simulated machine shares: the coordinator, its CA, the
//! registration limit, the per-machine slots and the run's statistics.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use drover_common::pin::CaPin;
use drover_common::wire::BootstrapDocument;
use rand::Rng;
use rustls::client::WebPkiServerVerifier;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::args::SimulateArgs;
use super::histogram::Histogram;
use crate::api::{ApiError, CoordinatorClient, Timeouts};
use crate::protocol::register::{check_coordinator_ca, CaRefusal};
use crate::tls;

/// How many messages are kept per error kind.
pub(super) const ERROR_EXAMPLES: usize = 3;

/// What every machine task shares.
pub(super) struct Fleet {
    urls: Vec<String>,
    /// The digest every machine reports of `urls` until a heartbeat answer
    /// names another list for it.
    pub(super) coordinators_digest: String,
    pin: CaPin,
    pub(super) ticket: String,
    /// Registration TLS: only the pinned CA, no client certificate.
    pub(super) pinned: rustls::ClientConfig,
    /// The coordinator CA the first registration brought, checked against
    /// the pin, with the verifier every machine shares.
    ca: OnceLock<Arc<CoordinatorCa>>,
    /// This host's address towards the coordinator.
    address: IpAddr,
    /// Whether machines connect from addresses of their own: with a
    /// coordinator on loopback, one source address would run out of
    /// ephemeral ports (about 28,000) before 50,000 machines connected.
    spread_sources: bool,
    pub(super) hostname_prefix: String,
    pub(super) hostname_width: usize,
    jitter: f64,
    /// `--settle`, if given.
    settle: Option<Duration>,
    /// `--snapshot-bytes`.
    pub(super) snapshot_bytes: u64,
    pub(super) start: Instant,
    pub(super) registrations: Semaphore,
    pub(super) concurrency: u32,
    pub(super) slots: Vec<Slot>,
    pub(super) stats: Mutex<Stats>,
    pub(super) interrupted: AtomicBool,
    /// The shared sockets of datagram heartbeats (`--transport datagram`).
    pub(super) datagrams: Option<Arc<super::datagrams::DatagramHub>>,
}

/// The coordinator CA, as the machines use it.
pub(super) struct CoordinatorCa {
    pub(super) pem: String,
    pub(super) der: Vec<u8>,
    pub(super) verifier: Arc<WebPkiServerVerifier>,
}

/// What the fleet knows about one machine, for --silence and the summary.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) state: AtomicU8,
    pub(super) silence: AtomicBool,
    pub(super) name: OnceLock<String>,
}

/// [`Slot::state`] values (0: not registered yet).
pub(super) const IN_POOL: u8 = 1;
pub(super) const ASSIGNED: u8 = 2;
pub(super) const GONE: u8 = 3;

/// Machine `index`'s own loopback address: 127.1.0.0, 127.1.0.1, ...
/// (Linux routes all of 127.0.0.0/8 to the loopback interface).
pub(super) fn loopback_source(index: usize) -> std::net::Ipv4Addr {
    let offset = (index as u32).wrapping_add(1 << 16) & 0x00ff_ffff;
    std::net::Ipv4Addr::from(0x7f00_0000 | offset)
}

/// Why a registered simulated machine cannot use the identity it got.
#[derive(Debug, thiserror::Error)]
pub(super) enum IdentityError {
    #[error("unreadable CA: {0}")]
    UnreadableCa(String),
    #[error("the coordinator answered with a CA certificate pinned {got}, not the pinned {pin}")]
    CaMismatch { got: CaPin, pin: CaPin },
    #[error(transparent)]
    Pem(#[from] drover_common::pki::PkiError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Client(#[from] ApiError),
}

impl Fleet {
    /// The fleet of a run: `args.machines` slots, machines registering with
    /// the ticket of `doc` from `address` (spread over loopback addresses
    /// when it is loopback).
    pub(super) fn new(
        doc: &BootstrapDocument,
        args: &SimulateArgs,
        pinned: rustls::ClientConfig,
        address: IpAddr,
        start: Instant,
        datagrams: Option<Arc<super::datagrams::DatagramHub>>,
    ) -> Self {
        let n = args.machines as usize;
        Self {
            urls: doc.coordinators.clone(),
            coordinators_digest: crate::protocol::coordinators::digest(&doc.coordinators),
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
            snapshot_bytes: args.snapshot_bytes,
            start,
            registrations: Semaphore::new(args.concurrency as usize),
            concurrency: args.concurrency,
            slots: (0..n).map(|_| Slot::default()).collect(),
            stats: Mutex::new(Stats::default()),
            interrupted: AtomicBool::new(false),
            datagrams,
        }
    }

    /// The address machine `index` connects from: its own loopback
    /// address (127.1.0.0 onwards) when the coordinator is on loopback,
    /// this host's otherwise.
    pub(super) fn source(&self, index: usize) -> IpAddr {
        if !self.spread_sources {
            return self.address;
        }
        IpAddr::V4(loopback_source(index))
    }

    /// A machine API client for machine `index`, for the run's coordinator
    /// URLs.
    pub(super) fn client(
        &self,
        index: usize,
        tls: rustls::ClientConfig,
    ) -> Result<CoordinatorClient, ApiError> {
        self.client_for(index, tls, &self.urls)
    }

    /// A machine API client for machine `index`, for `urls`.
    pub(super) fn client_for(
        &self,
        index: usize,
        tls: rustls::ClientConfig,
        urls: &[String],
    ) -> Result<CoordinatorClient, ApiError> {
        if self.spread_sources {
            CoordinatorClient::bound_to(urls, tls, Timeouts::default(), self.source(index))
        } else {
            CoordinatorClient::new(urls, tls, Timeouts::default())
        }
    }

    /// The run's coordinator URLs (those of its bootstrap document).
    pub(super) fn urls(&self) -> &[String] {
        &self.urls
    }

    pub(super) fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn set_state(&self, index: usize, state: u8) {
        self.slots[index].state.store(state, Ordering::Relaxed);
    }

    /// The shared coordinator CA if `pem` is it; else `pem` checked against
    /// the pin on its own (a coordinator whose CA certificate was reissued
    /// for the same key).
    pub(super) fn coordinator_ca(&self, pem: &str) -> Result<Arc<CoordinatorCa>, IdentityError> {
        if let Some(ca) = self.ca.get() {
            if ca.pem == pem {
                return Ok(ca.clone());
            }
        }
        match check_coordinator_ca(&self.pin, pem) {
            Ok(()) => {}
            Err(CaRefusal::Unreadable(e)) => return Err(IdentityError::UnreadableCa(e)),
            Err(CaRefusal::Mismatch(got)) => {
                return Err(IdentityError::CaMismatch {
                    got,
                    pin: self.pin.clone(),
                })
            }
        }
        let ca = Arc::new(CoordinatorCa {
            pem: pem.to_owned(),
            der: drover_common::pki::first_cert_der(pem)?,
            verifier: tls::coordinator_verifier(pem)?,
        });
        Ok(self.ca.get_or_init(|| ca.clone()).clone())
    }

    pub(super) fn jittered(&self, interval: Duration) -> Duration {
        jittered(interval, self.jitter)
    }

    /// Once every machine has registered or failed, the steady state starts
    /// `--settle` later, by default one (jittered) interval, when the
    /// registration backlog and the first heartbeats are through.
    pub(super) fn settle(&self, s: &mut Stats) {
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
pub(super) fn jittered(interval: Duration, jitter: f64) -> Duration {
    if jitter <= 0.0 {
        return interval;
    }
    let f = rand::rng().random_range(-jitter..=jitter);
    interval.mul_f64((1.0 + f).max(0.0))
}

/// Counters and histograms of the run.
#[derive(Default)]
pub(super) struct Stats {
    pub(super) registered: u64,
    pub(super) registration_failed: u64,
    pub(super) registration_retries: u64,
    /// From a machine's first registration request to its identity.
    pub(super) registration: Histogram,
    pub(super) last_registered: Option<Instant>,
    pub(super) heartbeats_sent: u64,
    pub(super) heartbeats_ok: u64,
    pub(super) heartbeats_failed: u64,
    pub(super) datagrams: DatagramSummary,
    pub(super) heartbeat: Histogram,
    /// Heartbeats sent in the steady state (see [`Fleet::settle`]).
    pub(super) steady_heartbeat: Histogram,
    pub(super) steady_from: Option<Instant>,
    pub(super) first_heartbeat: Option<Instant>,
    /// Successful heartbeats by the second of the run they were sent in.
    pub(super) heartbeats_per_second: Vec<u64>,
    pub(super) interval: Option<Duration>,
    pub(super) config_fetches: u64,
    pub(super) config_not_ready: u64,
    pub(super) config_failed: u64,
    pub(super) config: Histogram,
    pub(super) directives: u64,
    pub(super) errors: BTreeMap<String, ErrorCount>,
    pub(super) silenced: Vec<String>,
    pub(super) silenced_at: Option<(Instant, time::OffsetDateTime)>,
}

/// What became of heartbeat datagrams.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DatagramSummary {
    pub quiet: u64,
    pub call_https: u64,
    pub unanswered: u64,
}

#[derive(Default)]
pub(super) struct ErrorCount {
    pub(super) count: u64,
    pub(super) examples: Vec<String>,
}

impl Stats {
    pub(super) fn error(&mut self, kind: String, message: String) {
        let e = self.errors.entry(kind).or_default();
        e.count += 1;
        if e.examples.len() < ERROR_EXAMPLES && !e.examples.contains(&message) {
            e.examples.push(message);
        }
    }

    pub(super) fn api_error(&mut self, op: &str, e: &ApiError) {
        self.error(format!("{op}: {}", error_kind(e)), e.to_string());
    }
}

/// A short, stable name for the kind of a failed call.
pub(super) fn error_kind(e: &ApiError) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
