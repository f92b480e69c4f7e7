//! The simulator's datagram heartbeats: a few UDP sockets every simulated
//! machine shares, and a table of the machines waiting for an answer, so a
//! fleet of 100,000 needs a handful of open files, not one per machine.
//! Each answer is verified by the machine it is for.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_common::wire::datagram::ANSWER_LEN;
use tokio::net::UdpSocket;
use tokio::sync::oneshot;

/// How many sockets the machines share.
const SOCKETS: usize = 8;

/// The shared sockets and who waits for an answer.
pub(super) struct DatagramHub {
    sockets: Vec<Arc<UdpSocket>>,
    waiters: Mutex<HashMap<u64, oneshot::Sender<[u8; ANSWER_LEN]>>>,
}

impl DatagramHub {
    /// Binds the sockets (towards an IPv4 or IPv6 coordinator) and starts
    /// reading answers.
    pub(super) fn bind(ipv4: bool) -> std::io::Result<Arc<Self>> {
        let any: SocketAddr = if ipv4 {
            "0.0.0.0:0".parse().expect("an address")
        } else {
            "[::]:0".parse().expect("an address")
        };
        let mut sockets = Vec::with_capacity(SOCKETS);
        for _ in 0..SOCKETS {
            let s = std::net::UdpSocket::bind(any)?;
            s.set_nonblocking(true)?;
            // A fleet's answers arrive in bursts.
            let _ = socket2::SockRef::from(&s).set_recv_buffer_size(4 << 20);
            sockets.push(Arc::new(UdpSocket::from_std(s)?));
        }
        let hub = Arc::new(Self {
            sockets,
            waiters: Mutex::new(HashMap::new()),
        });
        for socket in &hub.sockets {
            tokio::spawn(read_answers(socket.clone(), Arc::downgrade(&hub)));
        }
        Ok(hub)
    }

    /// Sends machine `index`'s datagram (heartbeat id `id`) to `target` and
    /// waits up to `wait` for an answer naming `id`.
    pub(super) async fn exchange(
        &self,
        index: usize,
        target: SocketAddr,
        id: u64,
        datagram: &[u8],
        wait: Duration,
    ) -> Option<[u8; ANSWER_LEN]> {
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().expect("waiters lock").insert(id, tx);
        let socket = &self.sockets[index % self.sockets.len()];
        let answer = match socket.send_to(datagram, target).await {
            Ok(_) => tokio::time::timeout(wait, rx)
                .await
                .ok()
                .and_then(Result::ok),
            Err(_) => None,
        };
        if answer.is_none() {
            self.waiters.lock().expect("waiters lock").remove(&id);
        }
        answer
    }
}

async fn read_answers(socket: Arc<UdpSocket>, hub: std::sync::Weak<DatagramHub>) {
    let mut buf = [0u8; ANSWER_LEN + 1];
    loop {
        let Ok((n, _)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let Some(hub) = hub.upgrade() else { return };
        if n != ANSWER_LEN {
            continue;
        }
        let id = u64::from_be_bytes(buf[4..12].try_into().expect("8 bytes"));
        let waiter = hub.waiters.lock().expect("waiters lock").remove(&id);
        if let Some(tx) = waiter {
            let mut answer = [0u8; ANSWER_LEN];
            answer.copy_from_slice(&buf[..ANSWER_LEN]);
            let _ = tx.send(answer);
        }
    }
}
