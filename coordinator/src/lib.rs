//! The Drover coordinator as a library: `main.rs` parses the command line
//! and dispatches to [`serve::run`], [`cli::run`] or [`migrate::run`].
//! ARCHITECTURE.md's code map says what every module does.

pub use types::EXIT_CONFIG;

pub mod app;
pub mod change_log;
pub mod cli;
pub mod cluster_restore;
pub mod config_file;
pub mod domain;
pub mod drills;
pub mod grpc;
pub mod heartbeat_udp;
pub mod http;
pub mod leader;
pub mod machine_service;
pub mod memory;
pub mod metrics;
pub mod migrate;
pub mod protocol;
pub mod provider;
pub mod proxy;
pub mod reconcile;
pub mod restore;
pub mod serve;
pub mod snapshots;
pub mod store;
pub mod summary;
pub mod tables;
pub mod tasks;
pub mod tls;
pub mod types;
