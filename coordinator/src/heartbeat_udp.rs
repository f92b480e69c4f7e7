//! The datagram heartbeat receiver: one UDP socket beside each HTTPS
//! listener, on the same address and port, read by a thread of its own.
//!
//! A datagram costs one `recv_from`, a table lookup, one HMAC to verify and
//! one to answer, and one `send_to`: no connection, no TLS, no allocation
//! and no task wake-up per machine. Only the leader answers (it holds the
//! heartbeat deadlines); a follower drops every datagram unanswered, and
//! the agent falls back to HTTPS, which names the leader. Nothing
//! unauthenticated is ever answered, and an answer is shorter than the
//! request, so the socket cannot be used to reflect or amplify traffic.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use drover_common::wire::datagram::{Verdict, REQUEST_LEN};

use crate::app::App;
use crate::machine_service::{self, DatagramRefusal};

/// How often a receiver looks whether the coordinator is stopping.
const STOP_CHECK: Duration = Duration::from_millis(250);

/// Why the datagram receiver could not start on an address.
#[derive(Debug, thiserror::Error)]
#[error("cannot receive datagram heartbeats on udp://{addr}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds a UDP socket on `addr` (the address and port of an HTTPS
/// listener) and receives heartbeat datagrams on a thread of its own until
/// `stop` turns true.
pub fn start(
    app: Arc<App>,
    addr: SocketAddr,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<std::thread::JoinHandle<()>, BindError> {
    let socket = bind(addr).map_err(|source| BindError { addr, source })?;
    std::thread::Builder::new()
        .name(format!("heartbeat-udp-{}", addr.port()))
        .spawn(move || receive(&app, &socket, &stop))
        .map_err(|source| BindError { addr, source })
}

fn bind(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let socket = UdpSocket::bind(addr)?;
    socket.set_read_timeout(Some(STOP_CHECK))?;
    // Bursts of a large fleet's datagrams wait in the kernel rather than
    // being dropped while the thread answers the ones before.
    let sock = socket2::SockRef::from(&socket);
    let _ = sock.set_recv_buffer_size(4 << 20);
    Ok(socket)
}

fn receive(app: &App, socket: &UdpSocket, stop: &tokio::sync::watch::Receiver<bool>) {
    let local = socket.local_addr().ok();
    tracing::info!(addr = ?local, "receiving datagram heartbeats");
    // One byte more than a request, so a longer datagram reads as one.
    let mut buf = [0u8; REQUEST_LEN + 1];
    while !*stop.borrow() {
        // Wait for a datagram (or the stop check's timeout)...
        match socket.recv_from(&mut buf) {
            Ok((n, from)) => handle(app, socket, &buf[..n], from),
            Err(e) if waited(&e) => continue,
            Err(e) => {
                // An ICMP error for an earlier answer (the machine went),
                // reported on this socket: nothing to do but go on.
                tracing::debug!(error = %e, "datagram heartbeat socket error");
                continue;
            }
        }
        // ...then take every one queued behind it, and let the next ones
        // gather for a moment: a large fleet's datagrams cost one wake-up
        // per [`GATHER`], not one each (a context switch costs more than
        // checking a datagram).
        if socket.set_nonblocking(true).is_ok() {
            loop {
                match socket.recv_from(&mut buf) {
                    Ok((n, from)) => handle(app, socket, &buf[..n], from),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => tracing::debug!(error = %e, "datagram heartbeat socket error"),
                }
            }
            let _ = socket.set_nonblocking(false);
        }
        std::thread::sleep(GATHER);
    }
    tracing::info!(addr = ?local, "datagram heartbeats stopped");
}

/// How long datagrams gather between two reads of the socket under load:
/// at most this much is added to an answer's latency.
const GATHER: Duration = Duration::from_millis(1);

/// Whether a blocking read ended for want of a datagram.
fn waited(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted
    )
}

/// Judges one datagram from `from` (through [`machine_service`], as an
/// HTTPS heartbeat is) and answers it when it is authentic.
fn handle(app: &App, socket: &UdpSocket, datagram: &[u8], from: SocketAddr) {
    let metrics = crate::metrics::global();
    let received = std::time::Instant::now();
    match machine_service::datagram_heartbeat(app, datagram, std::time::SystemTime::now()) {
        Err(DatagramRefusal::NotLeader) => metrics.datagram("not_leader"),
        Ok((answer, verdict)) => {
            metrics.datagram(match verdict {
                Verdict::Quiet => "quiet",
                Verdict::CallHttps => "call_https",
            });
            if let Err(e) = socket.send_to(&answer, from) {
                tracing::debug!(%from, error = %e, "cannot answer a heartbeat datagram");
            }
            metrics.machine_request("datagram", true, received.elapsed());
        }
        Err(DatagramRefusal::Refused(refusal)) => {
            metrics.datagram(refusal.label());
            metrics.machine_request("datagram", false, received.elapsed());
            tracing::debug!(%from, ?refusal, "heartbeat datagram refused");
        }
    }
}
