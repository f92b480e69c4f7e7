//! The declarative objects, shaped like Kubernetes objects: `Cluster`,
//! `Machine` and `RegistrationToken`, their validation, and the problem
//! documents that refuse them.
//!
//! The objects never use the machine protocol ([`crate::wire`]); the
//! protocol may use them. `tests/tests/layers.rs` checks it.

pub mod addons;
pub mod aws;
pub mod cluster;
pub mod customise;
pub mod format;
pub mod machine;
pub mod meta;
pub mod operations;
pub mod problem;
pub mod registration;
pub mod report;
pub mod restore;
pub mod secret;
pub mod snapshot;

pub use addons::*;
pub use cluster::*;
pub use customise::*;
pub use format::FormatError;
pub use machine::*;
pub use meta::*;
pub use operations::*;
pub use problem::*;
pub use registration::*;
pub use report::*;
pub use restore::*;
pub use secret::*;
pub use snapshot::*;

pub use crate::names::CONTROL_PLANE_POOL;
pub use crate::units::{parse_duration, parse_percent, UnitError};
