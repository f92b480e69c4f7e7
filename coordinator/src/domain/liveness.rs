//! What the coordinator remembers of machines between heartbeats.

use time::OffsetDateTime;

/// What the coordinator remembers of a machine between heartbeats without
/// writing it: a heartbeat that changes nothing costs no durable write.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    pub last_seen: OffsetDateTime,
}
