//! The node problems mirrored as conditions of the machine's Node
//! (`--node-conditions`), as node-problem-detector keeps its own, so that
//! workloads and their operators see them with kubectl: a strategic merge
//! patch of the Node's status with the kubelet's credentials (a node may
//! patch its own status), carrying only these types, so the kubelet's
//! conditions stay (`pkg/util/node/node.go`, `PatchNodeStatus`).
//!
//! Only the problems the kubelet does not report itself are mirrored:
//! `MemoryPressure`, `DiskPressure` and `PIDPressure` are the kubelet's
//! own conditions, and two writers of one condition would undo each
//! other. A mirrored condition is `True` while its problem is reported and
//! `False` otherwise (with node-problem-detector's reasons where it has the
//! same condition). The Node is patched when something changed, and again
//! every [`REFRESH`] so a Node registered anew gets them back.

use std::path::Path;
use std::time::{Duration, Instant};

use drover_common::api::{
    NodeProblem, CLOCK_SKEW, DEVICE_ERROR, KERNEL_DEADLOCK, READ_ONLY_FILESYSTEM,
};

use crate::podnet::KubeletClient;

/// How often the conditions are sent even when nothing changed.
pub const REFRESH: Duration = Duration::from_secs(300);

/// The mirrored types, each with the reason and message of its `False`.
pub const MIRRORED: &[(&str, &str, &str)] = &[
    (
        READ_ONLY_FILESYSTEM,
        "FilesystemIsNotReadOnly",
        "the Drover agent sees the machine's file systems writable",
    ),
    (
        KERNEL_DEADLOCK,
        "KernelHasNoDeadlock",
        "the kernel has reported no hung task this boot",
    ),
    (
        DEVICE_ERROR,
        "NoDeviceErrors",
        "the kernel has reported no device or file system errors this boot",
    ),
    (
        CLOCK_SKEW,
        "ClockInSync",
        "the machine's clock agrees with the coordinator's",
    ),
];

/// One mirrored condition: type, status, reason, message.
pub type Wanted = (String, bool, String, String);

/// The mirrored conditions for `problems`.
pub fn wanted(problems: &[NodeProblem]) -> Vec<Wanted> {
    MIRRORED
        .iter()
        .map(
            |(type_, ok_reason, ok_message)| match problems.iter().find(|p| p.type_ == *type_) {
                Some(p) => (type_.to_string(), true, p.reason.clone(), p.message.clone()),
                None => (
                    type_.to_string(),
                    false,
                    ok_reason.to_string(),
                    ok_message.to_string(),
                ),
            },
        )
        .collect()
}

/// The status patch for `now`, a condition's transition time now where its
/// status differs from `before` (or nothing was sent yet).
pub fn patch(now: &str, wanted: &[Wanted], before: Option<&[Wanted]>) -> serde_json::Value {
    let conditions: Vec<serde_json::Value> = wanted
        .iter()
        .map(|(type_, status, reason, message)| {
            let mut c = serde_json::json!({
                "type": type_,
                "status": if *status { "True" } else { "False" },
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
            });
            let same = before
                .and_then(|b| b.iter().find(|w| w.0 == *type_))
                .is_some_and(|w| w.1 == *status);
            if !same {
                c["lastTransitionTime"] = now.into();
            }
            c
        })
        .collect();
    serde_json::json!({"status": {"conditions": conditions}})
}

/// The mirror of one machine's node problems on its Node.
#[derive(Default)]
pub struct NodeConditions {
    client: KubeletClient,
    sent: Option<(Vec<Wanted>, Instant)>,
    /// When the last patch failed: the next waits [`RETRY`], so an API
    /// server that does not answer does not slow every heartbeat.
    failed: Option<Instant>,
}

/// How long after a failed patch the next is tried.
pub const RETRY: Duration = Duration::from_secs(30);

impl NodeConditions {
    /// Patches the Node when the conditions changed or are due again; a
    /// machine not joined yet (no `kubelet.conf`) is skipped.
    pub async fn sync(&mut self, root: &Path, problems: &[NodeProblem]) {
        if !root.join("etc/kubernetes/kubelet.conf").exists() {
            return;
        }
        if self.failed.is_some_and(|t| t.elapsed() < RETRY) {
            return;
        }
        let wanted = wanted(problems);
        if let Some((sent, at)) = &self.sent {
            if *sent == wanted && at.elapsed() < REFRESH {
                return;
            }
        }
        let now = time::OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .unwrap_or(time::OffsetDateTime::now_utc())
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let before = self.sent.as_ref().map(|(w, _)| w.as_slice());
        let body = patch(&now, &wanted, before);
        match self.client.patch_own_status(root, &body).await {
            Ok(node) => {
                if before != Some(wanted.as_slice()) {
                    tracing::info!(%node, problems = problems.len(), "node problem conditions set on the Node");
                }
                self.sent = Some((wanted, Instant::now()));
                self.failed = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in_seconds = RETRY.as_secs(), "cannot set the node problem conditions on the Node");
                self.failed = Some(Instant::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_problems_the_kubelet_does_not_own_are_mirrored() {
        let problems = vec![
            NodeProblem {
                type_: KERNEL_DEADLOCK.into(),
                reason: "TaskHung".into(),
                message: "task x".into(),
            },
            NodeProblem {
                type_: "DiskPressure".into(),
                reason: "DiskSpaceLow".into(),
                message: "low".into(),
            },
        ];
        let w = wanted(&problems);
        assert_eq!(w.len(), MIRRORED.len());
        assert!(!w.iter().any(|c| c.0 == "DiskPressure"));
        let k = w.iter().find(|c| c.0 == KERNEL_DEADLOCK).unwrap();
        assert_eq!((k.1, k.2.as_str()), (true, "TaskHung"));
        let r = w.iter().find(|c| c.0 == READ_ONLY_FILESYSTEM).unwrap();
        assert_eq!((r.1, r.2.as_str()), (false, "FilesystemIsNotReadOnly"));
        // The first patch sets every transition time; a later one only
        // those whose status changed.
        let first = patch("t1", &w, None);
        let conds = first["status"]["conditions"].as_array().unwrap();
        assert!(conds.iter().all(|c| c["lastTransitionTime"] == "t1"));
        let cleared = wanted(&[]);
        let second = patch("t2", &cleared, Some(&w));
        let conds = second["status"]["conditions"].as_array().unwrap();
        let moved: Vec<&str> = conds
            .iter()
            .filter(|c| c.get("lastTransitionTime").is_some())
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(moved, vec![KERNEL_DEADLOCK]);
    }
}
