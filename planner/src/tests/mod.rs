//! `plan` as a whole, one cluster pass at a time, on the objects of
//! [`crate::fixtures`]: one file per planner (`pool.rs`, `provider.rs`) and
//! the drain gate both share (`drain.rs`). The planners' parts have their
//! own unit tests beside them.

mod drain;
mod pool;
mod provider;
mod repair;
