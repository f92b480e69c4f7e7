//! The domain: what the coordinator knows and decides about clusters,
//! machines and its own secrets, independent of HTTP. The HTTP edge
//! (`crate::http`), the reconciler and `serve` use it.

pub mod audit;
pub mod autoscaling;
pub mod bmc;
pub mod bootstrap;
pub mod controller;
pub mod customise;
pub mod datagrams;
pub mod endpoint;
pub mod etcd_restore;
pub mod fleet_index;
pub mod fleet_summary;
pub mod jointokens;
pub mod kubeconfig;
pub mod leadership;
pub mod liveness;
pub mod managed_fields;
pub mod ratelimit;
pub mod registrar;
pub mod removal;
pub mod replicas;
pub mod secrets;
pub mod settings;
pub mod user_secrets;
pub mod workqueue;
