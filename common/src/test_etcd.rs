//! What the throwaway etcd of the agent's tests and the coordinator's
//! store tests share: free loopback ports for its URLs, the `etcd` binary
//! on `PATH`, and the health check that says a member is up. Behind the
//! `test-etcd` feature, which only their dev-dependencies turn on.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

/// A loopback port that was free when asked; etcd binds it a moment later.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// The `etcd` binary on `PATH`; `None` when it is not installed.
pub fn etcd_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

/// Whether `GET /health` on `addr` (`127.0.0.1:PORT`, plain HTTP: a client
/// URL without TLS, or a metrics URL) answers `"health":"true"`.
pub fn healthy(addr: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut answer = String::new();
    s.write_all(req.as_bytes()).is_ok()
        && s.read_to_string(&mut answer).is_ok()
        && answer.contains("\"health\":\"true\"")
}
