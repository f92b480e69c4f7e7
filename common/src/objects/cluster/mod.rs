//! The `Cluster` object, one file per concern: [`spec`] (what the user
//! declares, and what the coordinator derives from it: the addons in order,
//! a machine's files and commands), [`status`] (what the coordinator
//! observes and keeps), [`validation`] (`Cluster::validate`, which returns
//! every field error at once) and [`versions`] (the Kubernetes version
//! grammar and the skew rules between two versions). The operations in
//! flight on its status are in [`super::operations`].
//!
//! Every item is re-exported here, so `drover_common::objects::cluster::X`,
//! `drover_common::objects::X` and `drover_common::api::X` all keep naming
//! it; the files are an arrangement of this module, not paths of their own.

mod spec;
mod status;
mod validation;
mod versions;

pub use spec::*;
pub use status::*;
pub use validation::*;
pub use versions::*;

/// A pool cluster's document that validates, which the tests of every file
/// here vary.
#[cfg(test)]
fn sample() -> &'static str {
    r#"apiVersion: drover.dev/v1alpha1
kind: Cluster
metadata:
  name: demo
spec:
  kubernetesVersion: v1.31.2
  controlPlane:
    replicas: 1
  workerPools:
    - name: default
      replicas: 2
  provider:
    pool:
      selector:
        matchLabels:
          env: dev
"#
}
