//! What the connection caps of the coordinator's HTTPS server and of the
//! TCP proxy of control-plane endpoints share: the source a connection is
//! counted under, and a cap lowered to a share of the open-file limit.

use std::net::{IpAddr, Ipv6Addr};

/// The source a connection is counted under: its IPv4 address, or the /64
/// network of an IPv6 one (a single host commonly holds a whole /64).
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// `configured`, lowered to `open_files / divisor` (at least 1) when the
/// process's open-file limit is known, so that what the cap admits cannot
/// take more than that share of the process's open files.
pub fn within_share(configured: u32, open_files: Option<u64>, divisor: u64) -> u32 {
    match open_files {
        Some(limit) => u64::from(configured).min((limit / divisor.max(1)).max(1)) as u32,
        None => configured,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_sources_are_their_64_and_caps_a_share_of_the_files() {
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::ffff:1".parse().unwrap();
        assert_eq!(source_key(a), source_key(b));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(source_key(mapped), "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(within_share(4096, Some(1024), 4), 256);
        assert_eq!(within_share(100, Some(1024), 4), 100);
        assert_eq!(within_share(100, Some(2), 8), 1);
        assert_eq!(within_share(100, None, 8), 100);
    }
}
