//! Config fetches: what the outcome of building a machine's bundle keeps on
//! the machine.
//!
//! Invariant: the kubeadm version check is kept on the machine's
//! conditions, and written only when its verdict changes, so `drover
//! describe machine` says why a machine does not bootstrap.

use drover_common::api::{set_condition, Machine};
use drover_common::bundle::SignedBundle;

use crate::domain::bootstrap::{BootstrapError, KUBEADM_VERSION_CONDITION};

/// The kubeadm version check's verdict on a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionVerdict {
    pub matches: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The verdict a bundle build gives on `machine`'s kubeadm: a mismatch, a
/// match of the version it reported, or nothing to say.
pub fn version_verdict(
    machine: &Machine,
    bundle: &Result<SignedBundle, BootstrapError>,
) -> Option<VersionVerdict> {
    match bundle {
        Err(e @ BootstrapError::VersionMismatch { .. }) => Some(VersionVerdict {
            matches: false,
            reason: "Mismatch",
            message: e.to_string(),
        }),
        Ok(_) if !machine.status.kubeadm_version.is_empty() => Some(VersionVerdict {
            matches: true,
            reason: "Matches",
            message: format!("kubeadm {}", machine.status.kubeadm_version),
        }),
        _ => None,
    }
}

/// Whether `machine`'s conditions already say `verdict`.
pub fn holds(machine: &Machine, verdict: &VersionVerdict) -> bool {
    machine.status.conditions.iter().any(|c| {
        c.type_ == KUBEADM_VERSION_CONDITION
            && (c.status == "True") == verdict.matches
            && c.reason == verdict.reason
            && c.message == verdict.message
    })
}

/// Keeps `verdict` on machine `m`; whether that changed it.
pub fn keep(m: &mut Machine, verdict: &VersionVerdict) -> bool {
    set_condition(
        &mut m.status.conditions,
        KUBEADM_VERSION_CONDITION,
        verdict.matches,
        verdict.reason,
        &verdict.message,
    )
}
