//! The coordinator's half of the machine protocol, as a pure core: the
//! mirror of the agent's `agent/src/protocol/`.
//!
//! It does no IO: no store, no sockets, no providers, no tasks. Its
//! functions take a machine and its cluster as read, the request and the
//! time, and return what to write (a change, re-applied to a fresher copy
//! when a concurrent write wins) and what to answer, or a typed error per
//! area. `crate::machine_service` does the IO around it (reads, the
//! compare-and-swap writes, the rate limit, liveness, logs), for both edges
//! that call it: the HTTPS handlers (`http/machine.rs`) and the datagram
//! receiver (`heartbeat_udp.rs`). `tests/tests/layers.rs` checks that
//! nothing here imports the store, `App`, the HTTP edge, the providers or
//! tokio.

pub mod config;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod heartbeat;
pub mod identity;
pub mod operations;
pub mod reboot;
pub mod register;
pub mod renewal;
pub mod view;
