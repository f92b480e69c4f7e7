//! The machine protocol: what the agent and the coordinator say to each
//! other.
//!
//! Every request and answer here is JSON over HTTPS, except the datagram
//! heartbeat ([`datagram`]), which a quiet machine sends over UDP with a key
//! it was handed over HTTPS. Registration is the only
//! call without a client certificate; everything after it is mutual TLS with
//! the certificate issued at registration, whose common name is the machine
//! UID. The protocol may use the objects ([`crate::objects`]); the objects
//! never use it.

pub mod bootstrap;
pub mod datagram;
pub mod directive;
pub mod heartbeat;
pub mod load_balancer;
pub mod register;
pub mod snapshot;
pub mod ticket;

pub use bootstrap::*;
pub use datagram::DatagramOffer;
pub use directive::*;
pub use heartbeat::*;
pub use load_balancer::*;
pub use register::*;
pub use snapshot::*;
