//! Types and formats shared by the Drover coordinator and agent.
//!
//! Only types from this crate cross the wire between the two binaries. The
//! crate holds no IO: everything here is pure and unit-tested, so the
//! coordinator and the agent agree on formats by construction. The one
//! system call, in `process`, raises the open-file limit at start.

pub mod api;
pub mod aws;
pub mod bundle;
pub mod jws;
pub mod kubeadm;
pub mod names;
pub mod pin;
pub mod pki;
pub mod process;
pub mod ticket;
pub mod token;
pub mod wire;

/// The API group and version of every Drover object.
pub const API_VERSION: &str = "drover.dev/v1alpha1";

/// Current time as a UTC `OffsetDateTime`, in one place so tests can reason about it.
pub fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}
