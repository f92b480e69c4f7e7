//! The HTTPS server: rustls in front of the axum router, with the peer's
//! client certificate (if any) handed to handlers, and a graceful drain.

use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use drover_common::caps::source_key;
use drover_common::pki::{
    cert_info, CertInfo, CertificateAuthority, LeafSpec, LeafUsage, PkiError,
};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// The verified client certificate of a connection, if one was presented,
/// parsed once when the connection is accepted: every request on the
/// connection shares the result instead of parsing the certificate again.
#[derive(Clone, Debug, Default)]
pub struct PeerCertificate(pub Option<Arc<Result<CertInfo, PkiError>>>);

impl PeerCertificate {
    /// Parses a client certificate the TLS layer has verified.
    pub fn parse(der: &[u8]) -> Self {
        Self(Some(Arc::new(cert_info(der))))
    }

    /// The certificate's common name, when one was presented and parses.
    pub fn common_name(&self) -> Option<&str> {
        match self.0.as_deref() {
            Some(Ok(info)) => Some(&info.common_name),
            _ => None,
        }
    }
}

/// Connection figures of this process's API server, for `/v1/status`:
/// whether agents resume their TLS sessions, and how many connections (each
/// with its buffers) are open.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionStats {
    /// Connections open now (past their handshake).
    pub open: u64,
    /// Handshakes that verified a certificate chain and signed.
    pub full_handshakes: u64,
    /// Handshakes that resumed a session from a ticket.
    pub resumed_handshakes: u64,
    /// Handshakes that failed or timed out.
    pub failed_handshakes: u64,
    /// Of the open connections, those parked between requests (holding
    /// only their TLS session).
    pub parked: u64,
    /// Connections in their TLS handshake, or past it without a client
    /// certificate: the ones `--max-unauthenticated-connections` caps.
    #[serde(default)]
    pub unauthenticated: u64,
    /// Connections closed at once because their source or the coordinator
    /// was at its cap of unauthenticated connections.
    #[serde(default)]
    pub refused: u64,
    /// Parked unauthenticated connections closed to make room near the
    /// open-file limit.
    #[serde(default)]
    pub shed: u64,
}

static OPEN: AtomicU64 = AtomicU64::new(0);
static FULL: AtomicU64 = AtomicU64::new(0);
static RESUMED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static PARKED: AtomicU64 = AtomicU64::new(0);
static HANDSHAKING: AtomicU64 = AtomicU64::new(0);
static UNAUTHENTICATED: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static SHED: AtomicU64 = AtomicU64::new(0);

/// The connection figures so far.
pub fn connection_stats() -> ConnectionStats {
    ConnectionStats {
        open: OPEN.load(Ordering::Relaxed),
        full_handshakes: FULL.load(Ordering::Relaxed),
        resumed_handshakes: RESUMED.load(Ordering::Relaxed),
        failed_handshakes: FAILED.load(Ordering::Relaxed),
        parked: PARKED.load(Ordering::Relaxed),
        unauthenticated: HANDSHAKING.load(Ordering::Relaxed)
            + UNAUTHENTICATED.load(Ordering::Relaxed),
        refused: REFUSED.load(Ordering::Relaxed),
        shed: SHED.load(Ordering::Relaxed),
    }
}

/// Adds one to a gauge (open connections, parked ones, requests in flight
/// on a connection) for as long as it lives.
struct Gauge<C: std::ops::Deref<Target = AtomicU64>>(C);

impl<C: std::ops::Deref<Target = AtomicU64>> Gauge<C> {
    fn new(gauge: C) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Self(gauge)
    }
}

impl<C: std::ops::Deref<Target = AtomicU64>> Drop for Gauge<C> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an idle or slow HTTP/1 client may take to send its headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a connection without a client certificate stays parked
/// between requests: admin clients come back within a command; agents,
/// which keep connections, have certificates.
const UNAUTHENTICATED_PARK: Duration = Duration::from_secs(15);
/// Open files kept free for everything that is not a connection (the
/// store, the audit log, logs, provider clients): nearer the open-file
/// limit than this, parked unauthenticated connections are shed.
const OPEN_FILES_HEADROOM: u64 = 128;

/// The caps on unauthenticated connections (see [`Admission`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnauthenticatedCaps {
    /// From one source address.
    pub per_source: u32,
    /// From all sources together.
    pub total: u32,
}

/// Which connections the server keeps when it cannot keep them all.
///
/// Every connection is *unauthenticated* while its TLS handshake runs, and
/// stays so after it unless the client presented a certificate the
/// coordinator CA signed (every registered machine does). Handshakes and
/// unauthenticated connections are each counted per source address and in
/// total; a new one over a cap is closed at once (a handshake) or answered
/// 503 and closed (an established connection), so clients without
/// credentials cannot hold the coordinator's open files. Near the process's
/// open-file limit, parked unauthenticated connections are shed before any
/// machine's.
#[derive(Debug)]
pub struct Admission {
    caps: UnauthenticatedCaps,
    open_files: Option<u64>,
    counts: std::sync::Mutex<Counts>,
    shed: tokio::sync::Notify,
    /// When a refusal was last logged (seconds since the Unix epoch): at
    /// most one warning a second.
    last_warning: AtomicU64,
    /// When shedding was last logged, likewise.
    last_shed_warning: AtomicU64,
}

/// Seconds since the Unix epoch.
fn epoch_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[derive(Debug, Default)]
struct Counts {
    /// Per source: handshakes in progress, unauthenticated connections.
    by_source: std::collections::HashMap<IpAddr, [u32; 2]>,
    totals: [u32; 2],
}

/// What an [`Admission`] slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Handshake = 0,
    Unauthenticated = 1,
}

impl Admission {
    /// Admission with `caps`; `open_files` is the process's open-file limit
    /// when known. The total caps are lowered to a quarter of it each, so
    /// handshakes and unauthenticated connections together leave half of
    /// the open files to machines.
    pub fn new(caps: UnauthenticatedCaps, open_files: Option<u64>) -> Self {
        let total = drover_common::caps::within_share(caps.total, open_files, 4);
        Self {
            caps: UnauthenticatedCaps {
                per_source: caps.per_source.min(total),
                total,
            },
            open_files,
            counts: Default::default(),
            shed: tokio::sync::Notify::new(),
            last_warning: AtomicU64::new(0),
            last_shed_warning: AtomicU64::new(0),
        }
    }

    /// The caps in force (the total possibly lowered, see [`Admission::new`]).
    pub fn caps(&self) -> UnauthenticatedCaps {
        self.caps
    }

    /// A slot for a connection at `stage` from `ip`, or `None` when the
    /// source or the server is at its cap.
    fn admit(&'static self, ip: IpAddr, stage: Stage) -> Option<Slot> {
        let ip = source_key(ip);
        let i = stage as usize;
        let mut counts = self.counts.lock().expect("admission lock");
        let from_source = counts.by_source.get(&ip).map_or(0, |c| c[i]);
        if from_source >= self.caps.per_source || counts.totals[i] >= self.caps.total {
            let total = counts.totals[i];
            drop(counts);
            REFUSED.fetch_add(1, Ordering::Relaxed);
            self.warn_refusal(ip, stage, from_source, total);
            return None;
        }
        counts.by_source.entry(ip).or_default()[i] += 1;
        counts.totals[i] += 1;
        match stage {
            Stage::Handshake => HANDSHAKING.fetch_add(1, Ordering::Relaxed),
            Stage::Unauthenticated => UNAUTHENTICATED.fetch_add(1, Ordering::Relaxed),
        };
        Some(Slot {
            admission: self,
            ip,
            stage,
        })
    }

    fn warn_refusal(&self, ip: IpAddr, stage: Stage, from_source: u32, total: u32) {
        let now = epoch_seconds();
        if self.last_warning.swap(now, Ordering::Relaxed) == now {
            return;
        }
        let what = match stage {
            Stage::Handshake => "TLS handshakes",
            Stage::Unauthenticated => "connections without a client certificate",
        };
        tracing::warn!(
            source = %ip,
            from_source,
            total,
            per_source_cap = self.caps.per_source,
            total_cap = self.caps.total,
            "refusing a connection: at the cap of {what} (--max-unauthenticated-connections, --max-unauthenticated-connections-per-source); further refusals this second are only counted"
        );
    }

    /// Closes every parked unauthenticated connection when the open
    /// connections come within [`OPEN_FILES_HEADROOM`] of the open-file
    /// limit, or when `out_of_files` (accept failed for want of one).
    fn shed_if_short(&self, out_of_files: bool) {
        let open = OPEN.load(Ordering::Relaxed) + HANDSHAKING.load(Ordering::Relaxed);
        let near = self
            .open_files
            .is_some_and(|limit| open + OPEN_FILES_HEADROOM >= limit);
        if !(near || out_of_files) {
            return;
        }
        self.shed.notify_waiters();
        let now = epoch_seconds();
        if self.last_shed_warning.swap(now, Ordering::Relaxed) != now {
            tracing::warn!(
                open_connections = open,
                open_files_limit = self.open_files,
                out_of_files,
                "open files are running short; closing parked connections without a client certificate so machines keep theirs (raise the open-file limit, or lower --max-unauthenticated-connections)"
            );
        }
    }
}

/// A connection's place under an [`Admission`] cap, given back on drop.
struct Slot {
    admission: &'static Admission,
    ip: IpAddr,
    stage: Stage,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let i = self.stage as usize;
        let mut counts = self.admission.counts.lock().expect("admission lock");
        counts.totals[i] -= 1;
        if let std::collections::hash_map::Entry::Occupied(mut e) = counts.by_source.entry(self.ip)
        {
            e.get_mut()[i] -= 1;
            if e.get() == &[0, 0] {
                e.remove();
            }
        }
        match self.stage {
            Stage::Handshake => HANDSHAKING.fetch_sub(1, Ordering::Relaxed),
            Stage::Unauthenticated => UNAUTHENTICATED.fetch_sub(1, Ordering::Relaxed),
        };
    }
}

/// Answers a connection over the unauthenticated cap with
/// [`over_cap_answer`] and closes it (at most a second).
async fn refuse_over_cap(mut tls: Tls) {
    use tokio::io::AsyncWriteExt;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        tls.write_all(&over_cap_answer()).await?;
        tls.shutdown().await
    })
    .await;
}

/// The problem document a connection over the unauthenticated cap gets
/// before it is closed.
fn over_cap_answer() -> Vec<u8> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": "Too many connections",
        "status": 503,
        "detail": "this coordinator holds as many connections without a client certificate as it allows (from this address or in total); retry later",
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\nretry-after: 5\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The error a request body gives when it does not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}; send the body with the headers")]
pub struct BodyTimedOut(pub Duration);

/// A request body that fails with [`BodyTimedOut`] once it has been
/// waited for longer than its timeout: the clock starts the first time a
/// read finds no data, so a body that comes with its headers (every
/// heartbeat) never arms a timer.
struct DeadlineBody {
    inner: hyper::body::Incoming,
    timeout: Duration,
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// Told when the deadline passes.
    shared: Arc<Shared>,
}

/// A response body that counts as a request in flight until it is sent
/// whole (or dropped).
struct InFlightBody {
    inner: axum::body::Body,
    _guard: Gauge<InFlight>,
}

impl hyper::body::Body for InFlightBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl hyper::body::Body for DeadlineBody {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|r| r.map_err(Into::into))),
            Poll::Pending => {
                let timeout = self.timeout;
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if timer.as_mut().poll(cx).is_ready() {
                    self.shared.body_timed_out.store(true, Ordering::Relaxed);
                    Poll::Ready(Some(Err(Box::new(BodyTimedOut(timeout)))))
                } else {
                    Poll::Pending
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Errors building the TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("cannot issue the serving certificate: {0}")]
    Issue(#[from] PkiError),
    #[error("cannot load the serving certificate or key: {0}")]
    Pem(String),
    #[error("cannot build the TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("cannot build the client certificate verifier: {0}")]
    Verifier(String),
}

use crate::tls::provider;

/// Builds the server TLS configuration: a fresh serving certificate for
/// `dns_names`/`ips` signed by the coordinator CA, the CA itself appended to
/// the chain (agents find it there by its pin), and client certificates
/// optional but verified against the CA when presented.
pub fn server_config(
    ca: &CertificateAuthority,
    dns_names: Vec<String>,
    ips: Vec<IpAddr>,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let (chain, key) = serving_chain(ca, dns_names, ips)?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(chain[1].clone()).map_err(TlsSetupError::Rustls)?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsSetupError::Verifier(e.to_string()))?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    // The server's suite order wins (see `provider`).
    cfg.ignore_client_order = true;
    // An agent whose connection was closed (by `--idle-timeout`, a restart
    // of its own, a network blip) comes back with a session ticket: a
    // resumed handshake verifies and signs no certificate. The ticket keys
    // live in memory and rotate every 6 hours; after a restart, or on
    // another replica, the next handshake is simply a full one. One ticket
    // per handshake is enough, since each resumption brings a fresh one.
    cfg.ticketer = rustls::crypto::ring::Ticketer::new()?;
    cfg.send_tls13_tickets = 1;
    Ok(Arc::new(cfg))
}

/// A fresh serving certificate for `dns_names`/`ips` signed by `ca`, with
/// the CA appended to the chain (agents find it there by its pin), and its
/// key: the coordinator's API and its autoscaler port both serve one.
pub fn serving_chain(
    ca: &CertificateAuthority,
    dns_names: Vec<String>,
    ips: Vec<IpAddr>,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsSetupError> {
    let leaf = ca.issue(&LeafSpec {
        common_name: "drover-coordinator".into(),
        organizations: vec![],
        dns_names,
        ip_addresses: ips,
        usage: LeafUsage::Server,
        validity: time::Duration::days(365),
    })?;
    let mut chain: Vec<CertificateDer<'static>> = vec![];
    for pem in [&leaf.cert_pem, &ca.cert_pem] {
        chain.push(
            CertificateDer::from_pem_slice(pem.as_bytes())
                .map_err(|e| TlsSetupError::Pem(e.to_string()))?,
        );
    }
    let key = PrivateKeyDer::from_pem_slice(
        leaf.key_pem
            .as_deref()
            .expect("issue() generates the key")
            .as_bytes(),
    )
    .map_err(|e| TlsSetupError::Pem(e.to_string()))?;
    Ok((chain, key))
}

/// How the server treats client connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionPolicy {
    /// How long a request's body may take to arrive (from the first wait
    /// for it); a body still missing then is answered 408.
    pub body_timeout: Duration,
    /// The caps on unauthenticated connections, shared by every listener
    /// of the process (one `Admission` lives as long as the process).
    pub admission: &'static Admission,
    /// How long open connections may take to finish after shutdown begins.
    pub drain: Duration,
    /// Close a connection that has been idle (no request in flight, no
    /// bytes either way) this long; `None` keeps it until the client closes.
    /// A parked connection holds about 15 KiB (the TLS session, its task);
    /// closing it trades that for a resumed handshake when the client comes
    /// back.
    pub idle_timeout: Option<Duration>,
}

/// How long a connection stays with hyper after its last request before it
/// is parked (see [`run`]): long enough for a burst (registration, config,
/// first heartbeat) to share one hyper connection.
const PARK_AFTER: Duration = Duration::from_millis(250);

/// How long a closing connection keeps reading what its client still
/// sends (see [`close_lingering`]), and how much of it.
const LINGER: Duration = Duration::from_secs(5);
const LINGER_BYTES: usize = 4 * crate::http::MAX_BODY_BYTES;

/// How long the server waits after a failed accept before the next.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `shutdown` resolves, then stops
/// accepting and gives open connections `policy.drain` to finish.
///
/// Connections are kept alive, but an idle one is *parked*: after
/// [`PARK_AFTER`] without a request, hyper lets go of it (its 8 KiB read
/// and 8 KiB write buffers and its dispatcher go), and the task holds only
/// the TLS session while it waits for the client's next byte, which starts
/// a fresh hyper connection on the same TLS session. An agent heartbeating
/// every 10 s thus costs its coordinator the TLS session between
/// heartbeats, not a whole HTTP connection, and no new handshake.
pub async fn run(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
    policy: ConnectionPolicy,
) {
    let acceptor = TlsAcceptor::from(tls);
    // Tells every connection to finish; each holds an `alive` sender, so
    // the receiver sees the last one go.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (alive_tx, mut alive_rx) = tokio::sync::mpsc::channel::<()>(1);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of open files (EMFILE) or kernel memory: the
                    // next accept would fail at once, so pause instead of
                    // spinning; closing connections frees files meanwhile,
                    // parked unauthenticated ones first.
                    let out_of_files = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                    policy.admission.shed_if_short(out_of_files);
                    tracing::warn!(error = %e, "accept failed; pausing 100 ms");
                    tokio::select! {
                        _ = &mut shutdown => break,
                        _ = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                    }
                    continue;
                }
            },
        };
        // Small TLS records and HTTP answers go out at once: with Nagle's
        // algorithm, a handshake flight written in two pieces waits for the
        // client's delayed ACK (40 ms on Linux).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        policy.admission.shed_if_short(false);
        // Over the cap of handshakes from this source or in all: closed
        // before the handshake costs anything.
        let Some(handshaking) = policy.admission.admit(peer.ip(), Stage::Handshake) else {
            drop(tcp);
            continue;
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        let stop = stop_rx.clone();
        let alive = alive_tx.clone();
        tokio::spawn(async move {
            let _alive = alive;
            // Boxed, like the busy phase below: an async task's size is its
            // largest state, and a parked connection should not pay for a
            // handshake's or hyper's.
            let handshake = Box::pin(acceptor.accept(tcp));
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await;
            drop(handshaking);
            let tls: Tls = match handshake {
                Ok(Ok(tls)) => Box::new(tls),
                Ok(Err(e)) => {
                    FAILED.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    FAILED.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            match tls.get_ref().1.handshake_kind() {
                Some(rustls::HandshakeKind::Resumed) => RESUMED.fetch_add(1, Ordering::Relaxed),
                _ => FULL.fetch_add(1, Ordering::Relaxed),
            };
            let _open = Gauge::new(&OPEN);
            let peer_cert = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map_or_else(PeerCertificate::default, |c| PeerCertificate::parse(c));
            // A verified client certificate makes a machine; any other
            // client needs a place under the unauthenticated caps.
            let slot = if peer_cert.0.is_some() {
                None
            } else {
                match policy.admission.admit(peer.ip(), Stage::Unauthenticated) {
                    Some(slot) => Some(slot),
                    None => {
                        Box::pin(refuse_over_cap(tls)).await;
                        return;
                    }
                }
            };
            Box::pin(serve_connection(
                tls,
                peer,
                peer_cert,
                app,
                policy,
                stop,
                slot.is_some(),
            ))
            .await;
            drop(slot);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(alive_tx);
    let drain = policy.drain;
    tokio::select! {
        _ = alive_rx.recv() => tracing::info!("all connections drained"),
        _ = tokio::time::sleep(drain) => tracing::warn!(?drain, "drain deadline passed; closing remaining connections"),
    }
}

/// A connection's TLS stream, boxed: it is about a kilobyte, and each
/// future it moves through (the connection task, its serving phases) would
/// otherwise reserve room for it in its own layout (issue 13's memory
/// regression). Boxed, it exists once per connection.
type Tls = Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>;

/// What a connection's requests share with the connection: how many are
/// in flight, and whether one's body missed its deadline. One allocation
/// per connection.
#[derive(Default)]
struct Shared {
    in_flight: AtomicU64,
    /// A request body timed out ([`BodyTimedOut`]): the client is too slow
    /// to be waited for again, so the connection closes without lingering.
    body_timed_out: std::sync::atomic::AtomicBool,
}

/// [`Shared`]'s in-flight count, as a [`Gauge`] counts it.
#[derive(Clone)]
struct InFlight(Arc<Shared>);

impl std::ops::Deref for InFlight {
    type Target = AtomicU64;
    fn deref(&self) -> &AtomicU64 {
        &self.0.in_flight
    }
}

/// Serves one client connection until the client closes it, it stays idle
/// past `policy.idle_timeout`, or the server stops; parks it between bursts
/// of requests (see [`run`]).
async fn serve_connection(
    mut tls: Tls,
    peer: std::net::SocketAddr,
    peer_cert: PeerCertificate,
    app: Router,
    policy: ConnectionPolicy,
    mut stop: tokio::sync::watch::Receiver<bool>,
    unauthenticated: bool,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let in_flight = InFlight(Arc::new(Shared::default()));
    let body_timeout = policy.body_timeout;
    let service = {
        let in_flight = in_flight.clone();
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let mut req = req.map(|inner| DeadlineBody {
                inner,
                timeout: body_timeout,
                timer: None,
                shared: in_flight.0.clone(),
            });
            req.extensions_mut().insert(peer_cert.clone());
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let guard = Gauge::new(in_flight.clone());
            let answer = app.clone().oneshot(req);
            Box::pin(async move {
                // In flight until its body is sent: a response that streams
                // (a watch, a snapshot) keeps the connection from parking
                // while it waits between chunks.
                answer.await.map(|resp| {
                    resp.map(|inner| {
                        axum::body::Body::new(InFlightBody {
                            inner,
                            _guard: guard,
                        })
                    })
                })
            })
        })
    };
    let park_after = policy
        .idle_timeout
        .map_or(PARK_AFTER, |t| t.min(PARK_AFTER));
    let mut pending = bytes::Bytes::new();
    loop {
        // Busy: hyper serves requests until the connection is quiet.
        // Boxed, so only a busy connection holds hyper's state.
        let Some((stream, rest)) = Box::pin(serve_burst(
            tls,
            pending,
            park_after,
            &in_flight,
            service.clone(),
            &mut stop,
            peer,
        ))
        .await
        else {
            return;
        };
        tls = stream;
        pending = rest;
        if !pending.is_empty() {
            continue;
        }

        // Parked: only the TLS session is held until the next byte.
        let _parked = Gauge::new(&PARKED);
        let mut byte = [0u8; 1];
        let mut wait = policy
            .idle_timeout
            .map(|t| t.saturating_sub(park_after))
            .unwrap_or(Duration::MAX);
        if unauthenticated {
            wait = wait.min(UNAUTHENTICATED_PARK);
        }
        let read = tokio::select! {
            r = tokio::time::timeout(wait, tls.read(&mut byte)) => r,
            _ = stop.changed() => {
                let _ = tokio::time::timeout(Duration::from_secs(1), tls.shutdown()).await;
                return;
            }
            _ = policy.admission.shed.notified(), if unauthenticated => {
                SHED.fetch_add(1, Ordering::Relaxed);
                let _ = tokio::time::timeout(Duration::from_secs(1), tls.shutdown()).await;
                return;
            }
        };
        match read {
            Ok(Ok(1)) => pending = bytes::Bytes::copy_from_slice(&byte),
            // The client closed, the connection failed, or it stayed idle
            // past the timeout.
            Ok(_) | Err(_) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), tls.shutdown()).await;
                return;
            }
        }
    }
}

/// Serves requests on `tls` until it has been quiet for `park_after`;
/// returns the stream and any bytes read past the last request, or `None`
/// when the connection is done (the client closed it, it failed, or the
/// server is stopping).
async fn serve_burst<S>(
    tls: Tls,
    pending: bytes::Bytes,
    park_after: Duration,
    in_flight: &InFlight,
    service: S,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    peer: std::net::SocketAddr,
) -> Option<(Tls, bytes::Bytes)>
where
    S: hyper::service::HttpService<hyper::body::Incoming> + Unpin,
    S::Future: Unpin,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use tokio::io::AsyncWriteExt;
    let io = IdleClose::new(tls, pending, park_after, in_flight.clone());
    let mut conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(io), service);
    let mut draining = false;
    let served = loop {
        tokio::select! {
            r = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => break r,
            _ = stop.changed(), if !draining => {
                std::pin::Pin::new(&mut conn).graceful_shutdown();
                draining = true;
            }
        }
    };
    let parts = conn.into_parts();
    let io = parts.io.into_inner();
    // A client that sent nothing is not kept: parking is for clients
    // between requests. Nor is a connection hyper finished on its own
    // rather than for being quiet: a request or an answer said
    // `Connection: close`, a body was left unread, or hyper failed (and may
    // have answered 400 or 431 with the rest of the request unread).
    let done = served.is_err() || io.peer_closed || !io.heard || !io.quiet_ended;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
    if done || draining || *stop.borrow() {
        // A client still sending is read out first, so it gets the answer,
        // unless it has closed or was too slow to send its body in time.
        if io.peer_closed || in_flight.0.body_timed_out.load(Ordering::Relaxed) {
            let mut tls = io.inner;
            let _ = tokio::time::timeout(Duration::from_secs(1), tls.shutdown()).await;
        } else {
            Box::pin(close_lingering(io.inner)).await;
        }
        return None;
    }
    // `read_buf` shares hyper's 8 KiB read buffer: keep a copy of what is
    // left in it (usually nothing), so the buffer itself goes now.
    Some((io.inner, bytes::Bytes::copy_from_slice(&parts.read_buf)))
}

/// Closes a connection the server is done with while its client may still
/// be sending (a body answered before it was read: 413, 400 for a bad
/// name, 403 for a viewer's change), without losing the answer: sends
/// `close_notify` and a FIN, then reads and drops what still arrives until
/// the client closes, for at most [`LINGER`] and [`LINGER_BYTES`].
///
/// Closing a socket with unread bytes makes the kernel send a reset in
/// place of the FIN, and a client still writing its body then fails on its
/// write before it reads the answer (Python's `ssl` raises "EOF occurred
/// in violation of protocol"). hyper reads no more than a handler asks
/// for and leaves this to the server (hyperium/hyper#3078, #3944); it is
/// the lingering close of Apache's `ap_lingering_close` and nginx's
/// `lingering_close`.
async fn close_lingering(mut tls: Tls) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = tokio::time::Instant::now() + LINGER;
    if tokio::time::timeout_at(deadline, tls.shutdown())
        .await
        .is_err()
    {
        return;
    }
    let mut buf = vec![0u8; 16 * 1024];
    let mut left = LINGER_BYTES;
    while left > 0 {
        match tokio::time::timeout_at(deadline, tls.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => left = left.saturating_sub(n),
            // The client closed, the connection failed, or time ran out.
            _ => return,
        }
    }
}

/// A connection's stream as hyper sees it: first the bytes read before
/// hyper took over (`prefix`), then the stream, which reads as ended once
/// the connection has been quiet for `quiet` (no bytes either way, no
/// request in flight). hyper, waiting for the next request, then finishes
/// as if the client had closed, and hands the stream back to be parked; a
/// request half-read is never cut, since arriving bytes reset the clock.
struct IdleClose<T> {
    inner: T,
    prefix: bytes::Bytes,
    quiet: Duration,
    in_flight: InFlight,
    last_activity: tokio::time::Instant,
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// The client really closed its side (not a quiet period).
    peer_closed: bool,
    /// The stream read as ended because the connection was quiet.
    quiet_ended: bool,
    /// Whether the client has sent anything: until it does, it has
    /// [`HEADER_READ_TIMEOUT`] (a client that completes TLS and then says
    /// nothing is closed, not parked).
    heard: bool,
}

impl<T> IdleClose<T> {
    fn new(inner: T, prefix: bytes::Bytes, quiet: Duration, in_flight: InFlight) -> Self {
        Self {
            inner,
            prefix,
            quiet,
            in_flight,
            last_activity: tokio::time::Instant::now(),
            timer: None,
            peer_closed: false,
            quiet_ended: false,
            heard: false,
        }
    }

    /// Whether the quiet period has passed; otherwise arms the timer so the
    /// task is woken when it would.
    fn quiet_expired(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        let now = tokio::time::Instant::now();
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            self.last_activity = now;
        }
        let quiet = if self.heard {
            self.quiet
        } else {
            HEADER_READ_TIMEOUT
        };
        let deadline = self.last_activity + quiet;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        timer.as_mut().poll(cx).is_ready()
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for IdleClose<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let head = self.prefix.split_to(n);
            buf.put_slice(&head);
            self.last_activity = tokio::time::Instant::now();
            self.heard = true;
            return std::task::Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut self.inner).poll_read(cx, buf) {
            std::task::Poll::Ready(Ok(())) if buf.filled().len() == before => {
                self.peer_closed = true;
                std::task::Poll::Ready(Ok(()))
            }
            std::task::Poll::Ready(r) => {
                self.last_activity = tokio::time::Instant::now();
                self.heard |= r.is_ok();
                std::task::Poll::Ready(r)
            }
            std::task::Poll::Pending => {
                if self.quiet_expired(cx) {
                    // Reads as the end: hyper finishes and lets go.
                    self.quiet_ended = true;
                    std::task::Poll::Ready(Ok(()))
                } else {
                    std::task::Poll::Pending
                }
            }
        }
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for IdleClose<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.last_activity = tokio::time::Instant::now();
        }
        r
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.last_activity = tokio::time::Instant::now();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server on loopback whose `/slow` answers after 600 ms, and a TLS
    /// client trusting its CA.
    async fn serve(
        idle_timeout: Option<Duration>,
    ) -> (std::net::SocketAddr, tokio_rustls::TlsConnector) {
        let s = serve_with(idle_timeout, 64, Duration::from_secs(30)).await;
        (s.addr, s.connector)
    }

    struct TestServer {
        addr: std::net::SocketAddr,
        /// A client without a certificate.
        connector: tokio_rustls::TlsConnector,
        /// A client with a certificate the CA signed (a machine).
        machine: tokio_rustls::TlsConnector,
        admission: &'static Admission,
    }

    /// The test server with these caps (`cap` unauthenticated connections
    /// from one source and from all) and body timeout; `/echo` answers a
    /// POST with its body.
    async fn serve_with(
        idle_timeout: Option<Duration>,
        cap: u32,
        body_timeout: Duration,
    ) -> TestServer {
        let caps = UnauthenticatedCaps {
            per_source: cap,
            total: cap,
        };
        let ca = CertificateAuthority::generate("test-ca").unwrap();
        let tls = server_config(&ca, vec!["localhost".into()], vec![]).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    "slow"
                }),
            )
            .route(
                "/echo",
                axum::routing::post(
                    |crate::http::RawBody(body): crate::http::RawBody| async move { body },
                ),
            )
            .layer(axum::middleware::from_fn(crate::http::close_if_body_unread));
        let admission: &'static Admission = Box::leak(Box::new(Admission::new(caps, None)));
        let policy = ConnectionPolicy {
            body_timeout,
            admission,
            drain: Duration::from_secs(1),
            idle_timeout,
        };
        tokio::spawn(run(listener, tls, router, std::future::pending(), policy));
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap())
            .unwrap();
        let builder = || {
            rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots.clone())
        };
        let leaf = ca
            .issue(&LeafSpec {
                common_name: "m1".into(),
                organizations: vec![],
                dns_names: vec![],
                ip_addresses: vec![],
                usage: LeafUsage::Client,
                validity: time::Duration::hours(1),
            })
            .unwrap();
        let machine = builder()
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(leaf.key_pem.unwrap().as_bytes()).unwrap(),
            )
            .unwrap();
        TestServer {
            addr,
            connector: tokio_rustls::TlsConnector::from(Arc::new(builder().with_no_client_auth())),
            machine: tokio_rustls::TlsConnector::from(Arc::new(machine)),
            admission,
        }
    }

    /// Reads until the server closes the connection; the answer, or `None`
    /// if it stays open for `within`.
    /// Sends `request`, then reads like [`read_until_closed`] for at most
    /// 5 s.
    async fn send_until_closed<S>(stream: &mut S, request: &[u8]) -> Option<String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        stream.write_all(request).await.unwrap();
        read_until_closed(stream, Duration::from_secs(5)).await
    }

    async fn read_until_closed<S: tokio::io::AsyncRead + Unpin>(
        stream: &mut S,
        within: Duration,
    ) -> Option<String> {
        let mut buf = vec![];
        match tokio::time::timeout(within, stream.read_to_end(&mut buf)).await {
            Ok(_) => Some(String::from_utf8_lossy(&buf).into_owned()),
            Err(_) => None,
        }
    }

    /// A TLS connection to the test server.
    async fn connect(
        addr: std::net::SocketAddr,
        connector: &tokio_rustls::TlsConnector,
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        connector.connect(name, tcp).await.unwrap()
    }

    async fn get(
        stream: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
        path: &str,
    ) -> String {
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = stream.read(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn idle_connections_close_after_the_timeout_but_slow_requests_finish() {
        let (addr, connector) = serve(Some(Duration::from_millis(200))).await;
        let mut stream = connect(addr, &connector).await;
        // A request that takes three timeouts is answered, not cut off.
        let answer = get(&mut stream, "/slow").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("slow"), "{answer}");
        // Then, idle, the server closes the connection (end of stream).
        let mut rest = vec![];
        let read =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
        assert!(
            matches!(read, Ok(Ok(0))),
            "the idle connection was not closed: {read:?}"
        );
        assert!(connection_stats().resumed_handshakes + connection_stats().full_handshakes >= 1);
    }

    #[tokio::test]
    async fn a_quiet_connection_is_parked_and_serves_its_next_request() {
        let (addr, connector) = serve(None).await;
        let parked_before = connection_stats().parked;
        let mut stream = connect(addr, &connector).await;
        assert!(get(&mut stream, "/").await.ends_with("ok"));
        // Quiet past PARK_AFTER: hyper lets go, the TLS session stays.
        tokio::time::timeout(Duration::from_secs(10), async {
            while connection_stats().parked <= parked_before {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the connection was parked");
        // The same TLS session serves the next requests.
        assert!(get(&mut stream, "/").await.ends_with("ok"));
        assert!(get(&mut stream, "/slow").await.ends_with("slow"));
    }

    #[tokio::test]
    async fn a_client_that_completes_tls_and_says_nothing_is_closed() {
        let (addr, connector) = serve(None).await;
        let mut stream = connect(addr, &connector).await;
        // Not parked forever: closed once HEADER_READ_TIMEOUT passes.
        let mut rest = vec![];
        let read = tokio::time::timeout(
            HEADER_READ_TIMEOUT + Duration::from_secs(20),
            stream.read_to_end(&mut rest),
        )
        .await;
        assert!(
            matches!(read, Ok(Ok(0))),
            "a silent client was kept: {read:?}"
        );
    }

    #[tokio::test]
    async fn without_a_timeout_connections_stay_for_the_next_request() {
        let (addr, connector) = serve(None).await;
        let mut stream = connect(addr, &connector).await;
        // The slow request outlasts what would have been an idle timeout;
        // the connection then serves a second request.
        assert!(get(&mut stream, "/slow").await.ends_with("slow"));
        assert!(get(&mut stream, "/").await.ends_with("ok"));
    }
    #[test]
    fn ipv6_sources_are_counted_by_their_64_network() {
        let key = |s: &str| source_key(s.parse().unwrap()).to_string();
        assert_eq!(key("192.0.2.7"), "192.0.2.7");
        assert_eq!(key("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::");
        assert_eq!(key("2001:db8:1:2:bbbb::9"), key("2001:db8:1:2::1"));
        assert_ne!(key("2001:db8:1:3::1"), key("2001:db8:1:2::1"));
    }

    #[tokio::test]
    async fn connection_close_closes_the_connection_after_the_answer() {
        let (addr, connector) = serve(None).await;
        let mut stream = connect(addr, &connector).await;
        // Answered, then closed: not parked for a next request.
        let request = b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n";
        let answer = send_until_closed(&mut stream, request)
            .await
            .expect("the connection was kept after `Connection: close`");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok"), "{answer}");
    }

    #[tokio::test]
    async fn a_body_trickled_past_the_timeout_is_cut_off() {
        let s = serve_with(None, 8, Duration::from_millis(500)).await;
        let mut stream = connect(s.addr, &s.connector).await;
        stream
            .write_all(b"POST /echo HTTP/1.1\r\nhost: localhost\r\ncontent-length: 100\r\n\r\n")
            .await
            .unwrap();
        // One byte every 100 ms: each resets any idle timer, none the
        // body's deadline.
        let trickle = async {
            for _ in 0..100 {
                if stream.write_all(b"x").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), trickle)
            .await
            .expect("the server kept reading the trickled body");
        let answer = read_until_closed(&mut stream, Duration::from_secs(5))
            .await
            .expect("the connection was closed");
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("did not arrive within"), "{answer}");
        // A body sent with its headers is served as always.
        let mut stream = connect(s.addr, &s.connector).await;
        let answer = send_until_closed(&mut stream, b"POST /echo HTTP/1.1\r\nhost: localhost\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello")
            .await
            .unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn unauthenticated_connections_are_capped_and_machines_still_get_in() {
        let s = serve_with(None, 3, Duration::from_secs(30)).await;
        // Three clients without certificates hold their connections.
        let mut held = vec![];
        for _ in 0..3 {
            let mut c = connect(s.addr, &s.connector).await;
            assert!(get(&mut c, "/").await.ends_with("ok"));
            held.push(c);
        }
        // The fourth is answered 503 and closed at once.
        let mut refused = connect(s.addr, &s.connector).await;
        let answer = read_until_closed(&mut refused, Duration::from_secs(5))
            .await
            .expect("an unauthenticated connection over the cap was kept");
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("without a client certificate"), "{answer}");
        assert!(connection_stats().refused >= 1);
        // A machine, from the same address, is served.
        for _ in 0..5 {
            let mut m = connect(s.addr, &s.machine).await;
            assert!(get(&mut m, "/").await.ends_with("ok"));
            held.push(m);
        }
        // A slot comes back when its connection closes.
        drop(held.remove(0));
        let mut again = None;
        for _ in 0..50 {
            let mut c = connect(s.addr, &s.connector).await;
            c.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n")
                .await
                .unwrap();
            let mut buf = vec![0u8; 4096];
            let n = c.read(&mut buf).await.unwrap_or(0);
            if String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200") {
                again = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            again.is_some(),
            "the closed connection's slot was not given back"
        );
    }

    #[tokio::test]
    async fn short_of_files_parked_unauthenticated_connections_go_first() {
        let s = serve_with(None, 8, Duration::from_secs(30)).await;
        let mut anonymous = connect(s.addr, &s.connector).await;
        assert!(get(&mut anonymous, "/").await.ends_with("ok"));
        let mut machine = connect(s.addr, &s.machine).await;
        assert!(get(&mut machine, "/").await.ends_with("ok"));
        // Shedding reaches connections once they are parked (after
        // PARK_AFTER, well before UNAUTHENTICATED_PARK).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let closed = loop {
            s.admission.shed_if_short(true);
            if let Some(rest) = read_until_closed(&mut anonymous, Duration::from_millis(100)).await
            {
                break rest;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the parked anonymous connection was not shed"
            );
        };
        assert_eq!(closed, "");
        // The machine's connection stays, and serves.
        assert!(get(&mut machine, "/").await.ends_with("ok"));
    }
}
