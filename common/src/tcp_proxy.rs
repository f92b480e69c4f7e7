//! A TCP pass-through load balancer for control-plane endpoints: each
//! connection goes to the next backend, round robin, skipping one that does
//! not accept. TLS passes through untouched, so the proxy holds no key and
//! clients see the API servers' own certificates.
//!
//! Shared by the coordinator's managed endpoints (pool clusters) and the
//! agent's `load-balancer` mode (the docker provider's load-balancer
//! container). Which backends are healthy is the caller's to decide (each
//! probes `/readyz` with [`ready_backends`] and a client trusting the
//! cluster's CA); this module only forwards. It is the one part of this
//! crate that does IO, behind the `tcp-proxy` feature.
//!
//! Anyone who reaches the port may connect, and a proxied connection holds
//! two open files (the client's and the backend's) of the process that
//! runs it: the coordinator's own file budget, which its API and every
//! machine's connection need. So every connection is admitted by an
//! [`Admission`] first: per source address and in total, the total never
//! more than a share of the open-file limit; one over a cap is closed at
//! once and counted. A connection then lives while bytes flow: one idle
//! (no byte either way) for [`Limits::idle_timeout`] is closed, and so is
//! one whose side has closed while the other stays silent for
//! [`Limits::half_close_timeout`].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::caps::{source_key, within_share};

/// The backends new connections go to; replaced as a whole by the caller.
pub type Backends = Arc<RwLock<Vec<SocketAddr>>>;

/// The API servers among `candidates` that answer `/readyz` with 200,
/// probed at once with `client` (which trusts the cluster's CA); `what`
/// names a backend in the debug log of one that does not.
pub async fn ready_backends(
    client: &reqwest::Client,
    candidates: &[SocketAddr],
    what: &str,
) -> Vec<SocketAddr> {
    let probes = candidates.iter().map(|addr| async move {
        match client.get(format!("https://{addr}/readyz")).send().await {
            Ok(r) => r.status().is_success(),
            Err(e) => {
                tracing::debug!(%addr, error = %e, "{what} not ready");
                false
            }
        }
    });
    let answers = futures_util::future::join_all(probes).await;
    candidates
        .iter()
        .zip(answers)
        .filter_map(|(a, ok)| ok.then_some(*a))
        .collect()
}

/// How long a backend may take to accept a proxied connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default of [`Limits::per_source`].
pub const DEFAULT_PER_SOURCE: u32 = 256;
/// Default of [`Limits::total`].
pub const DEFAULT_TOTAL: u32 = 16384;
/// Default of [`Limits::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// Default of [`Limits::half_close_timeout`].
pub const DEFAULT_HALF_CLOSE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a refusal is logged per source: once per interval, the rest
/// only counted.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// Sources remembered for [`REFUSAL_LOG_INTERVAL`]; refusals from sources
/// beyond these (a flood from many addresses) are only counted.
const REMEMBERED_SOURCES: usize = 1024;

/// The limits of one proxy process's connections (every endpoint it
/// serves shares them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections held at once from one source address (an IPv4 address,
    /// an IPv6 /64). 256 by default: a Node's kubelet, kube-proxy and pod
    /// network agent hold a few each, and an operator's kubectl a few more;
    /// raise it when many Nodes reach the endpoint through one NAT address.
    pub per_source: u32,
    /// Connections held at once from all sources. Lowered to what a share
    /// of the open-file limit allows (see [`Admission::new`]). 16,384 by
    /// default: a few per Node of every cluster the process serves.
    pub total: u32,
    /// A connection with no byte either way for this long is closed. An
    /// hour by default, as the `timeout tunnel 1h` HAProxy setups commonly
    /// give API servers: live Kubernetes clients are never that quiet
    /// (client-go pings an idle HTTP/2 connection every 30 s, watches carry
    /// bookmarks), so only connections abandoned without a close (a
    /// crashed client, a vanished network) reach it, and an interactive
    /// `kubectl exec` left at a prompt, or `logs -f` of a quiet Pod,
    /// survives a long pause. The caps, not this timeout, bound what idle
    /// connections can hold.
    pub idle_timeout: Duration,
    /// Once one side has closed its half, the other may stay silent this
    /// long before the connection is closed (HAProxy's `client-fin` and
    /// `server-fin`). A minute by default: a client or server that closed
    /// expects the rest of an answer promptly, and one side that never
    /// finishes would otherwise hold both files for the idle timeout.
    pub half_close_timeout: Duration,
    /// How long a backend may take to accept before the next is tried.
    pub connect_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            per_source: DEFAULT_PER_SOURCE,
            total: DEFAULT_TOTAL,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            half_close_timeout: DEFAULT_HALF_CLOSE_TIMEOUT,
            connect_timeout: CONNECT_TIMEOUT,
        }
    }
}

/// What the proxy did, since the process started (`open` is now).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections held now (admitted, connecting or forwarding).
    pub open: u64,
    /// Closed at once: their source was at [`Limits::per_source`].
    pub refused_per_source: u64,
    /// Closed at once: the proxy was at [`Limits::total`].
    pub refused_total: u64,
    /// Closed because no backend was ready or none accepted in time.
    pub no_backend: u64,
    /// Closed after [`Limits::idle_timeout`] without a byte.
    pub idle_timeouts: u64,
    /// Closed after [`Limits::half_close_timeout`] with one side closed.
    pub half_close_timeouts: u64,
}

#[derive(Debug, Default)]
struct Counters {
    open: AtomicU64,
    refused_per_source: AtomicU64,
    refused_total: AtomicU64,
    no_backend: AtomicU64,
    idle_timeouts: AtomicU64,
    half_close_timeouts: AtomicU64,
}

/// Which connections a proxy process holds: per source address and in
/// total, as the coordinator's HTTPS server admits connections without a
/// client certificate. One per process, shared by its endpoints.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    /// Connections held per source, and their sum.
    counts: Mutex<(HashMap<IpAddr, u32>, u32)>,
    counters: Counters,
    /// When each source's refusal was last logged.
    warned: Mutex<HashMap<IpAddr, std::time::Instant>>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its source holds [`Limits::per_source`] connections.
    PerSource,
    /// The proxy holds [`Limits::total`] connections.
    Total,
}

impl Admission {
    /// Admission under `limits`; `open_files` is how many open files the
    /// proxy may hold in all, when the process's open-file limit is known
    /// (the caller's share of it). Each connection holds two, so the total
    /// is lowered to half of `open_files`, and the per-source cap to the
    /// total.
    pub fn new(limits: Limits, open_files: Option<u64>) -> Self {
        let total = within_share(limits.total, open_files, 2).max(1);
        Self {
            limits: Limits {
                total,
                per_source: limits.per_source.clamp(1, total),
                ..limits
            },
            counts: Mutex::new((HashMap::new(), 0)),
            counters: Counters::default(),
            warned: Mutex::new(HashMap::new()),
        }
    }

    /// The limits in force (the caps possibly lowered by [`Admission::new`]).
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The figures so far.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            open: c.open.load(Ordering::Relaxed),
            refused_per_source: c.refused_per_source.load(Ordering::Relaxed),
            refused_total: c.refused_total.load(Ordering::Relaxed),
            no_backend: c.no_backend.load(Ordering::Relaxed),
            idle_timeouts: c.idle_timeouts.load(Ordering::Relaxed),
            half_close_timeouts: c.half_close_timeouts.load(Ordering::Relaxed),
        }
    }

    /// A slot for a connection from `ip`, or why there is none (counted).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Refusal> {
        let ip = source_key(ip);
        let mut counts = self.counts.lock().expect("proxy admission lock");
        let (by_source, total) = &mut *counts;
        let from_source = by_source.get(&ip).copied().unwrap_or(0);
        let refusal = if from_source >= self.limits.per_source {
            Some(Refusal::PerSource)
        } else if *total >= self.limits.total {
            Some(Refusal::Total)
        } else {
            None
        };
        if let Some(r) = refusal {
            match r {
                Refusal::PerSource => &self.counters.refused_per_source,
                Refusal::Total => &self.counters.refused_total,
            }
            .fetch_add(1, Ordering::Relaxed);
            return Err(r);
        }
        *by_source.entry(ip).or_default() += 1;
        *total += 1;
        self.counters.open.fetch_add(1, Ordering::Relaxed);
        Ok(Slot {
            admission: self.clone(),
            ip,
        })
    }

    /// Whether a refusal from `ip` at `now` is to be logged: the first of
    /// each [`REFUSAL_LOG_INTERVAL`] per source is, the rest only counted.
    fn log_refusal(&self, ip: IpAddr, now: std::time::Instant) -> bool {
        let ip = source_key(ip);
        let mut warned = self.warned.lock().expect("proxy warnings lock");
        if let Some(last) = warned.get(&ip) {
            if now.duration_since(*last) < REFUSAL_LOG_INTERVAL {
                return false;
            }
        }
        if warned.len() >= REMEMBERED_SOURCES && !warned.contains_key(&ip) {
            warned.retain(|_, last| now.duration_since(*last) < REFUSAL_LOG_INTERVAL);
            if warned.len() >= REMEMBERED_SOURCES {
                return false;
            }
        }
        warned.insert(ip, now);
        true
    }
}

/// A connection's place under the caps, given back on drop.
#[derive(Debug)]
pub struct Slot {
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.admission.counts.lock().expect("proxy admission lock");
        let (by_source, total) = &mut *counts;
        *total -= 1;
        if let std::collections::hash_map::Entry::Occupied(mut e) = by_source.entry(self.ip) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
        self.admission.counters.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Accepts connections on `listener` forever, forwarding each to the
/// current `backends`; `name` names the endpoint in logs. A connection over
/// `admission`'s caps is closed at once.
pub async fn accept_loop(
    listener: TcpListener,
    name: String,
    backends: Backends,
    admission: Arc<Admission>,
) {
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of files, most likely: wait a little rather than spin.
                tracing::warn!(endpoint = %name, error = %e, "endpoint cannot accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let slot = match admission.admit(peer.ip()) {
            Ok(s) => s,
            Err(refusal) => {
                drop(client);
                if admission.log_refusal(peer.ip(), std::time::Instant::now()) {
                    let limits = admission.limits();
                    let cap = match refusal {
                        Refusal::PerSource => "connections from one source",
                        Refusal::Total => "connections in all",
                    };
                    tracing::warn!(
                        endpoint = %name,
                        source = %peer.ip(),
                        per_source_cap = limits.per_source,
                        total_cap = limits.total,
                        "endpoint refusing connections: at its cap of {cap}; further refusals from this source are only counted for {}s",
                        REFUSAL_LOG_INTERVAL.as_secs()
                    );
                }
                continue;
            }
        };
        let chosen: Vec<SocketAddr> = backends.read().expect("backends lock").clone();
        let name = name.clone();
        let next = next.clone();
        let admission = admission.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let limits = admission.limits();
            let counters = &admission.counters;
            match forward(client, &chosen, &next, &limits).await {
                Ok(Ended::Closed) => {}
                Ok(Ended::Idle) => {
                    counters.idle_timeouts.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(endpoint = %name, %peer, "endpoint connection idle; closed");
                }
                Ok(Ended::HalfClosed) => {
                    counters.half_close_timeouts.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(endpoint = %name, %peer, "endpoint connection half closed and silent; closed");
                }
                Ok(Ended::NoBackend) => {
                    counters.no_backend.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(endpoint = %name, %peer, "no control-plane machine accepted; connection closed");
                }
                Err(e) => {
                    tracing::debug!(endpoint = %name, %peer, error = %e, "endpoint connection ended")
                }
            }
        });
    }
}

/// How a proxied connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Both sides closed.
    Closed,
    /// No byte either way for the idle timeout.
    Idle,
    /// One side closed, the other silent for the half-close timeout.
    HalfClosed,
    /// No backend was ready, or none accepted in time.
    NoBackend,
}

/// Connects `client` to the first backend, round robin, that accepts.
async fn forward(
    client: TcpStream,
    backends: &[SocketAddr],
    next: &AtomicUsize,
    limits: &Limits,
) -> std::io::Result<Ended> {
    if backends.is_empty() {
        return Ok(Ended::NoBackend);
    }
    let start = next.fetch_add(1, Ordering::Relaxed);
    for i in 0..backends.len() {
        let addr = backends[(start + i) % backends.len()];
        match tokio::time::timeout(limits.connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(server)) => {
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                return pump(client, server, limits).await;
            }
            Ok(Err(e)) => tracing::debug!(%addr, error = %e, "backend refused; trying the next"),
            Err(_) => tracing::debug!(%addr, "backend did not accept in time; trying the next"),
        }
    }
    Ok(Ended::NoBackend)
}

/// Copies bytes both ways between `client` and `server` until both sides
/// have closed, or the connection is idle or half closed for too long
/// (see [`Limits`]).
pub async fn pump<A, B>(mut client: A, mut server: B, limits: &Limits) -> std::io::Result<Ended>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Activity {
        start: Instant::now(),
        last: AtomicU64::new(0),
        half_closed: AtomicBool::new(false),
        closing: tokio::sync::Notify::new(),
    };
    let mut a = Tracked {
        inner: &mut client,
        activity: &activity,
    };
    let mut b = Tracked {
        inner: &mut server,
        activity: &activity,
    };
    let copy = tokio::io::copy_bidirectional(&mut a, &mut b);
    tokio::pin!(copy);
    loop {
        let deadline = activity.deadline(limits);
        tokio::select! {
            done = &mut copy => return done.map(|_| Ended::Closed),
            // A side closed: the deadline comes nearer.
            _ = activity.closing.notified() => {}
            _ = tokio::time::sleep_until(deadline) => {
                // Bytes may have moved since the deadline was set.
                if activity.deadline(limits) <= Instant::now() {
                    return Ok(if activity.half_closed.load(Ordering::Relaxed) {
                        Ended::HalfClosed
                    } else {
                        Ended::Idle
                    });
                }
            }
        }
    }
}

/// When bytes last moved on a connection, and whether a side has closed.
struct Activity {
    start: Instant,
    /// Milliseconds from `start` to the last byte either way.
    last: AtomicU64,
    half_closed: AtomicBool,
    /// Told when a side closes.
    closing: tokio::sync::Notify,
}

impl Activity {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }

    /// When the connection is to be closed if no byte moves before.
    fn deadline(&self, limits: &Limits) -> Instant {
        let quiet = if self.half_closed.load(Ordering::Relaxed) {
            limits.half_close_timeout.min(limits.idle_timeout)
        } else {
            limits.idle_timeout
        };
        self.start + Duration::from_millis(self.last.load(Ordering::Relaxed)) + quiet
    }
}

/// A stream that records its traffic in an [`Activity`].
struct Tracked<'a, S> {
    inner: &'a mut S,
    activity: &'a Activity,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut *self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if buf.filled().len() > before {
                self.activity.touch();
            } else if buf.remaining() > 0 {
                // The end of this side's stream.
                self.activity.half_closed.store(true, Ordering::Relaxed);
                self.activity.touch();
                self.activity.closing.notify_one();
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut *self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            if n > 0 {
                self.activity.touch();
            }
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn unlimited() -> Arc<Admission> {
        Arc::new(Admission::new(Limits::default(), None))
    }

    #[tokio::test]
    async fn connections_go_round_robin_and_skip_a_dead_backend() {
        // Two echo-once backends that say who they are, and one dead port.
        let mut addrs = vec![];
        for tag in [b'a', b'b'] {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            addrs.push(l.local_addr().unwrap());
            tokio::spawn(async move {
                loop {
                    let (mut s, _) = l.accept().await.unwrap();
                    s.write_all(&[tag]).await.unwrap();
                }
            });
        }
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead_addr = dead.local_addr().unwrap();
        drop(dead);
        let backends = Arc::new(RwLock::new(vec![addrs[0], dead_addr, addrs[1]]));
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front_addr = front.local_addr().unwrap();
        let admission = unlimited();
        tokio::spawn(accept_loop(
            front,
            "c".into(),
            backends.clone(),
            admission.clone(),
        ));
        let mut seen = vec![];
        for _ in 0..3 {
            let mut s = TcpStream::connect(front_addr).await.unwrap();
            let mut b = [0u8];
            s.read_exact(&mut b).await.unwrap();
            seen.push(b[0]);
        }
        assert_eq!(seen, b"abb", "a, then the dead one skipped to b, then b");
        // With no backend, a connection is closed at once, and counted.
        backends.write().unwrap().clear();
        let mut s = TcpStream::connect(front_addr).await.unwrap();
        let mut buf = vec![];
        assert_eq!(s.read_to_end(&mut buf).await.unwrap(), 0);
        assert_eq!(admission.stats().no_backend, 1);
    }

    /// A connection from `source` to `addr`: `Some(greeting)` when the
    /// backend behind it said hello within 5 s, `None` when it was closed
    /// without a byte.
    async fn hello_from(source: &str, addr: SocketAddr) -> (TcpStream, Option<u8>) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::new(source.parse().unwrap(), 0))
            .unwrap();
        let mut s = socket.connect(addr).await.unwrap();
        let mut b = [0u8];
        let got = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
            .await
            .expect("neither a greeting nor a close within 5 s");
        match got {
            Ok(1) => (s, Some(b[0])),
            _ => (s, None),
        }
    }

    #[tokio::test]
    async fn connections_over_the_caps_are_closed_at_once_and_counted() {
        // A backend that greets each connection and holds it until the
        // client closes.
        let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend_addr = backend.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = backend.accept().await.unwrap();
                tokio::spawn(async move {
                    s.write_all(b"h").await.unwrap();
                    let _ = s.read_to_end(&mut vec![]).await;
                });
            }
        });
        let admission = Arc::new(Admission::new(
            Limits {
                per_source: 2,
                total: 3,
                ..Limits::default()
            },
            None,
        ));
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = front.local_addr().unwrap();
        tokio::spawn(accept_loop(
            front,
            "caps".into(),
            Arc::new(RwLock::new(vec![backend_addr])),
            admission.clone(),
        ));
        let (a1, got) = hello_from("127.0.0.1", addr).await;
        assert_eq!(got, Some(b'h'));
        let (_a2, got) = hello_from("127.0.0.1", addr).await;
        assert_eq!(got, Some(b'h'));
        // A third from the same source: over its cap.
        let (_, got) = hello_from("127.0.0.1", addr).await;
        assert_eq!(got, None, "a third connection from one source");
        // Another source gets one more, then the total is reached.
        let (_b1, got) = hello_from("127.0.0.2", addr).await;
        assert_eq!(got, Some(b'h'));
        let (_, got) = hello_from("127.0.0.3", addr).await;
        assert_eq!(got, None, "a fourth connection in all");
        let stats = admission.stats();
        assert_eq!(
            (stats.open, stats.refused_per_source, stats.refused_total),
            (3, 1, 1),
            "{stats:?}"
        );
        // A closed connection gives its place back.
        drop(a1);
        let start = Instant::now();
        loop {
            let (_s, got) = hello_from("127.0.0.3", addr).await;
            if got.is_some() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the place of a closed connection was not given back"
            );
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn the_total_is_a_share_of_the_open_files_and_refusals_are_logged_once_per_source() {
        let a = Admission::new(Limits::default(), Some(200));
        assert_eq!((a.limits().total, a.limits().per_source), (100, 100));
        let a = Admission::new(Limits::default(), Some(1 << 20));
        assert_eq!(a.limits().total, DEFAULT_TOTAL);
        assert_eq!(a.limits().per_source, DEFAULT_PER_SOURCE);
        let now = std::time::Instant::now();
        let (x, y): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        assert!(a.log_refusal(x, now));
        assert!(!a.log_refusal(x, now + Duration::from_secs(59)));
        assert!(a.log_refusal(y, now + Duration::from_secs(59)));
        assert!(a.log_refusal(x, now + REFUSAL_LOG_INTERVAL));
        // Many sources at once: the remembered ones are bounded.
        for i in 0..5000u32 {
            a.log_refusal(IpAddr::from(i.to_be_bytes()), now);
        }
        assert!(a.warned.lock().unwrap().len() <= REMEMBERED_SOURCES);
    }

    /// A proxied pair of in-memory connections: the client's end, the
    /// server's end, and the pump between them.
    fn pumped(
        limits: Limits,
    ) -> (
        tokio::io::DuplexStream,
        tokio::io::DuplexStream,
        tokio::task::JoinHandle<std::io::Result<Ended>>,
    ) {
        let (client, client_proxy) = tokio::io::duplex(1024);
        let (server_proxy, server) = tokio::io::duplex(1024);
        let pump = tokio::spawn(async move { pump(client_proxy, server_proxy, &limits).await });
        (client, server, pump)
    }

    const IDLE: Duration = Duration::from_secs(600);

    #[tokio::test(start_paused = true)]
    async fn a_connection_carrying_bytes_lives_and_an_idle_one_is_closed() {
        let limits = Limits {
            idle_timeout: IDLE,
            ..Limits::default()
        };
        let (mut client, mut server, pump) = pumped(limits);
        let started = Instant::now();
        // A watch: the server sends an event every half idle timeout, for
        // five idle timeouts.
        for _ in 0..10 {
            tokio::time::sleep(IDLE / 2).await;
            server.write_all(b"event").await.unwrap();
            let mut got = [0u8; 5];
            client.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"event");
        }
        assert!(!pump.is_finished(), "a live watch was cut");
        // Then nothing either way: closed one idle timeout after the last
        // byte, both sides told.
        let last = Instant::now();
        assert_eq!(pump.await.unwrap().unwrap(), Ended::Idle);
        assert_eq!(last.elapsed(), IDLE);
        assert!(started.elapsed() >= IDLE * 5);
        let mut rest = vec![];
        assert_eq!(client.read_to_end(&mut rest).await.unwrap(), 0);
        assert_eq!(server.read_to_end(&mut rest).await.unwrap(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_half_closed_connection_is_closed_when_the_other_side_stays_silent() {
        let limits = Limits {
            idle_timeout: IDLE,
            half_close_timeout: Duration::from_secs(60),
            ..Limits::default()
        };
        let (mut client, mut server, pump) = pumped(limits);
        // The client sends its request and closes its half; the server
        // reads it to the end, answers a part, and never finishes.
        client.write_all(b"request").await.unwrap();
        client.shutdown().await.unwrap();
        let mut request = vec![];
        server.read_to_end(&mut request).await.unwrap();
        assert_eq!(request, b"request");
        server.write_all(b"part").await.unwrap();
        let mut part = [0u8; 4];
        client.read_exact(&mut part).await.unwrap();
        let last = Instant::now();
        assert_eq!(pump.await.unwrap().unwrap(), Ended::HalfClosed);
        assert_eq!(last.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_backend_that_never_accepts_is_given_up_after_the_connect_timeout() {
        // A backend whose accept queue is full: the connect hangs (or, on
        // some kernels, is refused at once); either way the client is
        // closed, counted as having no backend.
        let limits = Limits {
            connect_timeout: Duration::from_secs(3),
            ..Limits::default()
        };
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = front.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = front.accept().await.unwrap();
        // 192.0.2.0/24 is TEST-NET-1: never routed, so no answer comes.
        let unroutable: SocketAddr = "192.0.2.1:6443".parse().unwrap();
        let next = AtomicUsize::new(0);
        let started = Instant::now();
        let ended = forward(accepted, &[unroutable], &next, &limits)
            .await
            .unwrap();
        assert_eq!(ended, Ended::NoBackend);
        assert!(started.elapsed() <= Duration::from_secs(3));
        drop(client);
    }
}
