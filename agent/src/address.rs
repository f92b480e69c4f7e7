//! The machine's own address towards the coordinator.

use std::io;
use std::net::IpAddr;

use crate::settings::Settings;

/// The local address the OS picks to reach a coordinator URL: a UDP socket
/// is "connected" (no packet is sent) and its local address read.
pub async fn local_address_towards(url: &str) -> io::Result<IpAddr> {
    let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    let parsed = reqwest::Url::parse(url).map_err(|e| invalid(format!("{url}: {e}")))?;
    let host = parsed
        .host_str()
        .ok_or_else(|| invalid(format!("{url} has no host")))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = parsed.port_or_known_default().unwrap_or(443);
    let target = tokio::net::lookup_host((host.as_str(), port))
        .await?
        .next()
        .ok_or_else(|| invalid(format!("{host} resolves to no address")))?;
    let bind = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = tokio::net::UdpSocket::bind(bind).await?;
    socket.connect(target).await?;
    Ok(socket.local_addr()?.ip())
}

/// The advertise address: the configured one, or the local address towards
/// the first coordinator that resolves.
pub async fn advertise_address(settings: &Settings, coordinators: &[String]) -> io::Result<IpAddr> {
    if let Some(ip) = settings.advertise_address {
        return Ok(ip);
    }
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no coordinator URL");
    for url in coordinators {
        match local_address_towards(url).await {
            Ok(ip) => return Ok(ip),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_address_towards_loopback() {
        let ip = local_address_towards("https://127.0.0.1:8443")
            .await
            .unwrap();
        assert!(ip.is_loopback(), "{ip}");
    }
}
