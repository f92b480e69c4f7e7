//! A TCP pass-through load balancer for control-plane endpoints: each
//! connection goes to the next backend, round robin, skipping one that does
//! not accept. TLS passes through untouched, so the proxy holds no key and
//! clients see the API servers' own certificates.
//!
//! Shared by the coordinator's managed endpoints (pool clusters) and the
//! agent's `load-balancer` mode (the docker provider's load-balancer
//! container). Which backends are healthy is the caller's to decide (each
//! probes `/readyz` with the cluster's CA); this module only forwards. It is
//! the one part of this crate that does IO, behind the `tcp-proxy` feature.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// The backends new connections go to; replaced as a whole by the caller.
pub type Backends = Arc<RwLock<Vec<SocketAddr>>>;

/// How long a backend may take to accept a proxied connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Accepts connections on `listener` forever, forwarding each to the
/// current `backends`; `name` names the endpoint in logs.
pub async fn accept_loop(listener: TcpListener, name: String, backends: Backends) {
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
        let chosen: Vec<SocketAddr> = backends.read().expect("backends lock").clone();
        let name = name.clone();
        let next = next.clone();
        tokio::spawn(async move {
            if let Err(e) = forward(client, &chosen, &next).await {
                tracing::debug!(endpoint = %name, %peer, error = %e, "endpoint connection ended");
            }
        });
    }
}

/// Connects `client` to the first backend, round robin, that accepts.
async fn forward(
    mut client: TcpStream,
    backends: &[SocketAddr],
    next: &AtomicUsize,
) -> std::io::Result<()> {
    if backends.is_empty() {
        return Err(std::io::Error::other("no control-plane machine is ready"));
    }
    let start = next.fetch_add(1, Ordering::Relaxed);
    for i in 0..backends.len() {
        let addr = backends[(start + i) % backends.len()];
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(mut server)) => {
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                tokio::io::copy_bidirectional(&mut client, &mut server).await?;
                return Ok(());
            }
            Ok(Err(e)) => tracing::debug!(%addr, error = %e, "backend refused; trying the next"),
            Err(_) => tracing::debug!(%addr, "backend did not accept in time; trying the next"),
        }
    }
    Err(std::io::Error::other("no control-plane machine accepted"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
        tokio::spawn(accept_loop(front, "c".into(), backends.clone()));
        let mut seen = vec![];
        for _ in 0..3 {
            let mut s = TcpStream::connect(front_addr).await.unwrap();
            let mut b = [0u8];
            s.read_exact(&mut b).await.unwrap();
            seen.push(b[0]);
        }
        assert_eq!(seen, b"abb", "a, then the dead one skipped to b, then b");
        // With no backend, a connection is closed at once.
        backends.write().unwrap().clear();
        let mut s = TcpStream::connect(front_addr).await.unwrap();
        let mut buf = vec![];
        assert_eq!(s.read_to_end(&mut buf).await.unwrap(), 0);
    }
}
