//! The Drover coordinator as a library: `main.rs` parses the command line
//! and dispatches to [`serve::run`], [`cli::run`] or [`migrate::run`].
//! ARCHITECTURE.md's code map says what every module does.

/// Exit code for invalid configuration or flags (EX_USAGE).
pub const EXIT_CONFIG: u8 = 64;

pub mod api;
pub mod app;
pub mod audit;
pub mod bootstrap;
pub mod cli;
pub mod client;
pub mod health;
pub mod jointokens;
pub mod keyring;
pub mod kubeconfig;
pub mod leader;
pub mod memory;
pub mod migrate;
pub mod provider;
pub mod provisioner;
pub mod ratelimit;
pub mod reconcile;
pub mod secrets;
pub mod serve;
pub mod server;
pub mod store;
pub mod tls;
pub mod types;
