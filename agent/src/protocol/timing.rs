//! The protocol's clocks: heartbeat intervals, config retries, renewal.

use std::time::Duration;

use time::OffsetDateTime;

/// The heartbeat interval used until the coordinator names one.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);

/// The longest wait for a config the coordinator says is not ready yet.
pub const MAX_CONFIG_RETRY: Duration = Duration::from_secs(30);

/// Keeps a coordinator-given heartbeat interval within sane bounds.
pub fn clamp_interval(d: Duration) -> Duration {
    d.clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

/// The interval a heartbeat answer names, within sane bounds.
pub fn interval_from_seconds(seconds: u64) -> Duration {
    clamp_interval(Duration::from_secs(seconds))
}

/// How long one coordinator gets to answer a heartbeat before the next is
/// tried: a heartbeat later than its interval is worth less than trying the
/// next coordinator (a hung leader must not make the machine look silent to
/// the new one).
pub fn heartbeat_timeout(interval: Duration) -> Duration {
    interval.clamp(Duration::from_secs(2), Duration::from_secs(20))
}

/// How long to wait after a 409 that asked for `retry_after_seconds`.
pub fn config_retry_delay(retry_after_seconds: u64) -> Duration {
    Duration::from_secs(retry_after_seconds).clamp(Duration::from_secs(1), MAX_CONFIG_RETRY)
}

/// When to renew a certificate: after two thirds of its lifetime.
pub fn renewal_time(not_before: OffsetDateTime, not_after: OffsetDateTime) -> OffsetDateTime {
    not_before + (not_after - not_before) * 2 / 3
}

/// A timestamp in RFC 3339 form, for logs and summaries.
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_after_two_thirds() {
        let nb = OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
        let na = nb + time::Duration::hours(24);
        assert_eq!(renewal_time(nb, na), nb + time::Duration::hours(16));
    }

    #[test]
    fn retry_delays_are_bounded() {
        assert_eq!(config_retry_delay(0), Duration::from_secs(1));
        assert_eq!(config_retry_delay(7), Duration::from_secs(7));
        assert_eq!(config_retry_delay(600), Duration::from_secs(30));
        assert_eq!(clamp_interval(Duration::ZERO), Duration::from_secs(1));
        assert_eq!(
            clamp_interval(Duration::from_secs(10)),
            Duration::from_secs(10)
        );
        assert_eq!(interval_from_seconds(7200), Duration::from_secs(3600));
        assert_eq!(
            heartbeat_timeout(Duration::from_secs(1)),
            Duration::from_secs(2)
        );
        assert_eq!(
            heartbeat_timeout(Duration::from_secs(10)),
            Duration::from_secs(10)
        );
        assert_eq!(
            heartbeat_timeout(Duration::from_secs(60)),
            Duration::from_secs(20)
        );
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let t = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20Z");
    }
}
