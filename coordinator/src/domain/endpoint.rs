//! Coordinator-managed control-plane endpoints (`controlPlaneEndpoint:
//! {managed: coordinator}`, pool clusters): the port range they come from,
//! and the choice of a cluster's port. The proxy that serves them is
//! `crate::proxy`.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

/// Where managed endpoints listen and how machines reach them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSettings {
    /// The first and last port of the range (inclusive).
    pub ports: (u16, u16),
    /// The address the proxies bind (the coordinator's listen address).
    pub bind: IpAddr,
    /// The host machines dial (from the coordinator's first advertised
    /// URL), which goes into every kubeconfig and the API server
    /// certificate's SANs.
    pub host: String,
}

/// The default `--endpoint-ports`.
pub const DEFAULT_PORTS: &str = "36443-36542";

/// Why no endpoint could be allocated.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("every port of the managed endpoint range {first}-{last} is taken ({used} by clusters, the rest by other programs); widen --endpoint-ports")]
    RangeFull { first: u16, last: u16, used: usize },
}

/// Why `--endpoint-ports` is not a port range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortRangeError {
    #[error("{0:?} is not a port (1-65535)")]
    NotAPort(String),
    #[error("the range {0:?} ends before it starts; write FIRST-LAST, e.g. {DEFAULT_PORTS}")]
    Reversed(String),
}

/// Parses `FIRST-LAST` (or one port) into an inclusive range.
pub fn parse_port_range(s: &str) -> Result<(u16, u16), PortRangeError> {
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| PortRangeError::NotAPort(p.to_owned()))
    };
    let (first, last) = match s.split_once('-') {
        Some((a, b)) => (port(a)?, port(b)?),
        None => {
            let p = port(s)?;
            (p, p)
        }
    };
    if first > last {
        return Err(PortRangeError::Reversed(s.to_owned()));
    }
    Ok((first, last))
}

/// Picks the lowest port of the range that no cluster holds (`used`) and
/// that nothing else on this host listens on (a bind probe).
pub fn allocate(settings: &EndpointSettings, used: &BTreeSet<u16>) -> Result<u16, EndpointError> {
    let (first, last) = settings.ports;
    (first..=last)
        .filter(|p| !used.contains(p))
        .find(|p| std::net::TcpListener::bind(SocketAddr::new(settings.bind, *p)).is_ok())
        .ok_or(EndpointError::RangeFull {
            first,
            last,
            used: used.len(),
        })
}

/// `host:port` machines and kubeconfigs use for a managed endpoint.
pub fn address(settings: &EndpointSettings, port: u16) -> String {
    if settings.host.contains(':') {
        format!("[{}]:{port}", settings.host)
    } else {
        format!("{}:{port}", settings.host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_bad_ones_say_why() {
        assert_eq!(parse_port_range("36443-36542"), Ok((36443, 36542)));
        assert_eq!(parse_port_range("7000"), Ok((7000, 7000)));
        let why = |s: &str| parse_port_range(s).unwrap_err().to_string();
        assert!(why("9-1").contains("ends before"));
        assert!(why("0-5").contains("not a port"));
        assert!(why("a-b").contains("not a port"));
    }

    #[test]
    fn allocation_skips_ports_in_use_by_clusters_or_other_programs() {
        let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = busy.local_addr().unwrap().port();
        let settings = EndpointSettings {
            ports: (p, p),
            bind: "127.0.0.1".parse().unwrap(),
            host: "127.0.0.1".into(),
        };
        assert!(matches!(
            allocate(&settings, &BTreeSet::new()),
            Err(EndpointError::RangeFull { .. })
        ));
        drop(busy);
        assert_eq!(allocate(&settings, &BTreeSet::new()).unwrap(), p);
        assert!(allocate(&settings, &BTreeSet::from([p])).is_err());
        assert_eq!(address(&settings, p), format!("127.0.0.1:{p}"));
    }
}
