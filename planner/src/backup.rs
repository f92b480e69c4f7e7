//! Etcd snapshots: when one is asked of which control plane, when the one
//! asked has failed, and whether the cluster's snapshots are current (the
//! `SnapshotsCurrent` condition).
//!
//! One snapshot at a time per cluster. It is asked when `drover backup
//! cluster` requested one (`status.snapshotRequestedAt`) or when
//! `spec.backup.every` has passed since the last one saved, of the first
//! running control plane (by name), once the cluster was initialised. The
//! coordinator clears it when the machine reports the snapshot saved; the
//! planner fails it when it takes too long or its machine stops running,
//! and asks again after [`SNAPSHOT_FAILED_RETRY`] (at once for a request).
//!
//! A cluster with `spec.backup` (unless `beforeChanges: false`) also saves
//! one before each risky change: the control plane's upgrade to a new
//! target, and a control-plane scale-down. The change waits
//! ([`waits_for_snapshot`]) until a snapshot taken [`Before`] it is saved,
//! which the status records as `snapshotTakenBefore`; the key names the
//! change, so the steps of one change need one snapshot, and the next
//! change another.

use drover_common::api::{
    set_condition, snapshot_name, BackupSpec, Cluster, ClusterStatus, Machine, SnapshotSave,
    SnapshotTrigger, SNAPSHOTS_CURRENT_CONDITION,
};

/// A change that waits for a snapshot saved before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Before {
    pub trigger: SnapshotTrigger,
    /// What it is, which is also its key: `upgrade to v1.31.2`.
    pub change: String,
}

impl Before {
    /// The control plane's upgrade to `target` (a version, or a rollout
    /// target of version and images).
    pub fn upgrade(target: &str) -> Self {
        Self {
            trigger: SnapshotTrigger::BeforeUpgrade,
            change: format!("upgrade to {target}"),
        }
    }

    /// A control-plane scale-down to `desired`, for the spec `cluster`
    /// has now (scaling down to the same count again later is another
    /// change).
    pub fn scale_down(cluster: &Cluster, desired: u32) -> Self {
        Self {
            trigger: SnapshotTrigger::BeforeScaleDown,
            change: format!(
                "control-plane scale-down to {desired} at generation {}",
                cluster.metadata.generation
            ),
        }
    }
}

/// Why `before` must wait for a snapshot; `None` when it may go ahead: the
/// cluster saves none before changes, is not initialised yet (there is
/// nothing to save), or one was saved before this very change.
pub(crate) fn waits_for_snapshot(cluster: &Cluster, before: &Before) -> Option<String> {
    let s = &cluster.status;
    if !BackupSpec::before_changes(cluster.spec.backup.as_ref())
        || !s.initialized
        || s.snapshot_taken_before.as_deref() == Some(before.change.as_str())
    {
        return None;
    }
    let asked = s
        .snapshot
        .as_ref()
        .filter(|op| op.before.as_deref() == Some(before.change.as_str()));
    Some(match asked {
        Some(op) if op.under_way() => format!(
            "a snapshot of etcd before the {}: {} asked of {} at {}",
            before.change, op.name, op.via, op.requested_at
        ),
        Some(op) => format!(
            "a snapshot of etcd before the {}: {} failed ({}); it is asked again {} minutes after a failure, or set spec.backup.beforeChanges: false to go ahead without one",
            before.change,
            op.name,
            op.error,
            SNAPSHOT_FAILED_RETRY.whole_minutes()
        ),
        None => format!("a snapshot of etcd before the {}", before.change),
    })
}
use time::OffsetDateTime;

/// How long a machine may take to save a snapshot before it counts as
/// failed.
pub const SNAPSHOT_TIMEOUT: time::Duration = time::Duration::minutes(30);

/// How long after a failed scheduled snapshot the next is asked.
pub const SNAPSHOT_FAILED_RETRY: time::Duration = time::Duration::minutes(5);

/// When the next scheduled snapshot of `cluster` is due, as its status
/// stands: `spec.backup.every` after the last one saved (or after the
/// cluster was made), not before a failed one may be retried. `None` when
/// it has no schedule.
pub fn snapshot_due_at(cluster: &Cluster) -> Option<OffsetDateTime> {
    due_at(cluster, &cluster.status)
}

/// [`snapshot_due_at`] with status `s` (the one a pass is building).
fn due_at(cluster: &Cluster, s: &ClusterStatus) -> Option<OffsetDateTime> {
    let every = BackupSpec::every(cluster.spec.backup.as_ref())?;
    let every = time::Duration::try_from(every).ok()?;
    let since = s
        .last_snapshot
        .as_ref()
        .map(|l| l.saved_at)
        .or(cluster.metadata.creation_timestamp)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let retry = s
        .snapshot
        .as_ref()
        .and_then(|op| op.failed_at)
        .map(|t| t + SNAPSHOT_FAILED_RETRY);
    Some(match retry {
        Some(r) => (since + every).max(r),
        None => since + every,
    })
}

/// Plans the cluster's snapshot on `status` (the status the pass is
/// building): keeps or fails the one under way, asks a new one of a
/// running control plane of `via` when one is due or a change waits for
/// one (`before`, from [`waits_for_snapshot`]), and sets the
/// `SnapshotsCurrent` condition.
pub(crate) fn apply_backup(
    status: &mut ClusterStatus,
    cluster: &Cluster,
    via: &[&Machine],
    before: Option<&Before>,
    now: OffsetDateTime,
) {
    if let Some(mut op) = status.snapshot.take() {
        if op.under_way() {
            let runs = via.iter().any(|m| m.metadata.name == op.via);
            if now - op.requested_at >= SNAPSHOT_TIMEOUT {
                op.failed_at = Some(now);
                op.error = format!(
                    "{} did not save it within {} minutes",
                    op.via,
                    SNAPSHOT_TIMEOUT.whole_minutes()
                );
            } else if !runs {
                op.failed_at = Some(now);
                op.error = format!(
                    "{} stopped running as a control plane before saving it",
                    op.via
                );
            }
        }
        status.snapshot = Some(op);
    }
    let under_way = status.snapshot.as_ref().is_some_and(|s| s.under_way());
    let requested = status.snapshot_requested_at.is_some();
    let scheduled = due_at(cluster, status).is_some_and(|at| at <= now);
    // A change waits for its snapshot, unless the last one asked for it
    // failed a moment ago.
    let before = before.filter(|b| {
        !status.snapshot.as_ref().is_some_and(|op| {
            op.before.as_deref() == Some(b.change.as_str())
                && op
                    .failed_at
                    .is_some_and(|at| now < at + SNAPSHOT_FAILED_RETRY)
        })
    });
    let may = status.initialized && cluster.metadata.deletion_timestamp.is_none();
    if !under_way && may && (requested || scheduled || before.is_some()) {
        let mut running: Vec<&&Machine> = via.iter().collect();
        running.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        if let Some(m) = running.first() {
            status.snapshot = Some(SnapshotSave {
                name: snapshot_name(&cluster.metadata.name, now),
                via: m.metadata.name.clone(),
                trigger: match (before, requested) {
                    (Some(b), _) => b.trigger,
                    (None, true) => SnapshotTrigger::Manual,
                    (None, false) => SnapshotTrigger::Scheduled,
                },
                before: before.map(|b| b.change.clone()),
                requested_at: now,
                failed_at: None,
                error: String::new(),
            });
            status.snapshot_requested_at = None;
        }
    }
    set_snapshots_condition(status, cluster, now);
}

/// `SnapshotsCurrent`: False when the last snapshot asked failed, or when a
/// scheduled cluster has saved none for twice its period; True when the
/// last one saved is recent; absent for a cluster that never had one and
/// has no schedule.
fn set_snapshots_condition(status: &mut ClusterStatus, cluster: &Cluster, now: OffsetDateTime) {
    let every = BackupSpec::every(cluster.spec.backup.as_ref())
        .and_then(|e| time::Duration::try_from(e).ok());
    if let Some(op) = status.snapshot.as_ref().filter(|s| !s.under_way()) {
        let message = format!(
            "snapshot {} asked of {} at {} failed: {}",
            op.name, op.via, op.requested_at, op.error
        );
        set_condition(
            &mut status.conditions,
            SNAPSHOTS_CURRENT_CONDITION,
            false,
            "SnapshotFailed",
            &message,
        );
        return;
    }
    let last = status.last_snapshot.clone();
    let since = last
        .as_ref()
        .map(|l| l.saved_at)
        .or(cluster.metadata.creation_timestamp);
    match (every, since) {
        (Some(every), Some(since)) if now - since > every * 2 => {
            let what = match &last {
                Some(l) => format!("the last snapshot, {}, was saved at {}", l.name, l.saved_at),
                None => "no snapshot was ever saved".to_owned(),
            };
            let message = format!(
                "{what}; spec.backup.every is {}",
                cluster
                    .spec
                    .backup
                    .as_ref()
                    .and_then(|b| b.every.clone())
                    .unwrap_or_default()
            );
            set_condition(
                &mut status.conditions,
                SNAPSHOTS_CURRENT_CONDITION,
                false,
                "SnapshotLate",
                &message,
            );
        }
        _ => match &last {
            Some(l) => {
                set_condition(
                    &mut status.conditions,
                    SNAPSHOTS_CURRENT_CONDITION,
                    true,
                    "SnapshotSaved",
                    &format!(
                        "snapshot {} saved at {} (etcd revision {})",
                        l.name, l.saved_at, l.revision
                    ),
                );
            }
            None => status
                .conditions
                .retain(|c| c.type_ != SNAPSHOTS_CURRENT_CONDITION),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{pool_cluster as cluster, running};
    use drover_common::api::{MachineRole, SnapshotRef};

    fn scheduled(every: &str) -> Cluster {
        let mut c = cluster(3, 0);
        c.spec.backup = Some(BackupSpec {
            every: Some(every.into()),
            ..Default::default()
        });
        c.status.initialized = true;
        c.metadata.creation_timestamp = Some(time::macros::datetime!(2026-11-28 00:00 UTC));
        c
    }

    fn condition(s: &ClusterStatus) -> Option<(String, String, String)> {
        s.conditions
            .iter()
            .find(|c| c.type_ == SNAPSHOTS_CURRENT_CONDITION)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    }

    #[test]
    fn a_schedule_asks_one_running_control_plane_when_due_then_waits() {
        let c = scheduled("1h");
        let t0 = time::macros::datetime!(2026-11-28 00:30 UTC);
        let cp = [
            running("cp-b", "control-plane", MachineRole::ControlPlane),
            running("cp-a", "control-plane", MachineRole::Init),
        ];
        let via: Vec<&Machine> = cp.iter().collect();
        let mut s = c.status.clone();
        apply_backup(&mut s, &c, &via, None, t0);
        assert_eq!(s.snapshot, None, "not due before an hour has passed");
        assert_eq!(condition(&s), None);

        let t1 = time::macros::datetime!(2026-11-28 01:00:01 UTC);
        apply_backup(&mut s, &c, &via, None, t1);
        let op = s.snapshot.clone().expect("due after an hour");
        assert_eq!(op.via, "cp-a");
        assert_eq!(op.name, "c-20261128-010001");
        assert_eq!(op.trigger, SnapshotTrigger::Scheduled);

        // Under way, it stands; past the timeout, it fails and says so.
        let mut with_op = c.clone();
        with_op.status.snapshot = Some(op.clone());
        let mut s2 = with_op.status.clone();
        apply_backup(
            &mut s2,
            &with_op,
            &via,
            None,
            t1 + time::Duration::minutes(5),
        );
        assert_eq!(s2.snapshot.as_ref(), Some(&op));
        apply_backup(&mut s2, &with_op, &via, None, t1 + SNAPSHOT_TIMEOUT);
        let failed = s2.snapshot.clone().unwrap();
        assert!(failed.failed_at.is_some());
        let (status, reason, message) = condition(&s2).unwrap();
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "SnapshotFailed")
        );
        assert!(
            message.contains("did not save it within 30 minutes"),
            "{message}"
        );

        // A failure is retried after its back-off, not at once.
        with_op.status.snapshot = Some(failed.clone());
        let retry_at = snapshot_due_at(&with_op).unwrap();
        assert_eq!(retry_at, failed.failed_at.unwrap() + SNAPSHOT_FAILED_RETRY);
        let mut s3 = with_op.status.clone();
        apply_backup(
            &mut s3,
            &with_op,
            &via,
            None,
            retry_at - time::Duration::seconds(1),
        );
        assert_eq!(s3.snapshot.as_ref(), Some(&failed));
        apply_backup(&mut s3, &with_op, &via, None, retry_at);
        assert!(s3.snapshot.as_ref().unwrap().under_way());
    }

    #[test]
    fn a_request_goes_at_once_and_a_machine_that_stops_fails_the_snapshot() {
        let mut c = cluster(1, 0);
        c.status.initialized = true;
        let now = time::macros::datetime!(2026-11-28 00:30 UTC);
        c.status.snapshot_requested_at = Some(now);
        let cp = running("cp-a", "control-plane", MachineRole::Init);
        let mut s = c.status.clone();
        apply_backup(&mut s, &c, &[&cp], None, now);
        let op = s.snapshot.clone().unwrap();
        assert_eq!(op.trigger, SnapshotTrigger::Manual);
        assert_eq!(s.snapshot_requested_at, None);

        // Its machine no longer runs: failed, with the reason.
        c.status.snapshot = Some(op);
        c.status.snapshot_requested_at = None;
        let mut s = c.status.clone();
        apply_backup(&mut s, &c, &[], None, now + time::Duration::seconds(10));
        let op = s.snapshot.clone().unwrap();
        assert!(op.error.contains("stopped running"), "{}", op.error);

        // A request waits while no control plane runs, and for init.
        let mut waiting = cluster(1, 0);
        waiting.status.snapshot_requested_at = Some(now);
        let mut s = waiting.status.clone();
        apply_backup(&mut s, &waiting, &[&cp], None, now);
        assert_eq!(s.snapshot, None, "not initialised yet");
        waiting.status.initialized = true;
        let mut s = waiting.status.clone();
        apply_backup(&mut s, &waiting, &[], None, now);
        assert_eq!(s.snapshot, None);
        assert_eq!(s.snapshot_requested_at, Some(now));
    }

    #[test]
    fn snapshots_go_late_after_twice_the_period() {
        let mut c = scheduled("1h");
        let saved_at = time::macros::datetime!(2026-11-28 01:00 UTC);
        c.status.last_snapshot = Some(SnapshotRef {
            name: "c-20261128-010000".into(),
            saved_at,
            revision: 42,
            size: 1000,
        });
        let mut s = c.status.clone();
        // Due, but no control plane runs to take it.
        apply_backup(
            &mut s,
            &c,
            &[],
            None,
            saved_at + time::Duration::minutes(90),
        );
        assert_eq!(condition(&s).unwrap().1, "SnapshotSaved");
        apply_backup(
            &mut s,
            &c,
            &[],
            None,
            saved_at + time::Duration::minutes(121),
        );
        let (status, reason, message) = condition(&s).unwrap();
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "SnapshotLate")
        );
        assert!(
            message.contains("c-20261128-010000") && message.contains("1h"),
            "{message}"
        );
    }

    #[test]
    fn a_change_waits_for_a_snapshot_saved_before_it_and_only_its_own() {
        let mut c = cluster(3, 0);
        c.status.initialized = true;
        let cp = running("cp-a", "control-plane", MachineRole::Init);
        let upgrade = Before::upgrade("v1.32.0");
        let now = time::macros::datetime!(2026-11-28 02:00 UTC);
        // No spec.backup: nothing waits.
        assert_eq!(waits_for_snapshot(&c, &upgrade), None);
        c.spec.backup = Some(BackupSpec::default());
        let why = waits_for_snapshot(&c, &upgrade).expect("the upgrade waits");
        assert!(why.contains("before the upgrade to v1.32.0"), "{why}");

        // The pass asks one, for this change.
        let mut s = c.status.clone();
        apply_backup(&mut s, &c, &[&cp], Some(&upgrade), now);
        let op = s.snapshot.clone().unwrap();
        assert_eq!(op.trigger, SnapshotTrigger::BeforeUpgrade);
        assert_eq!(op.before.as_deref(), Some("upgrade to v1.32.0"));
        c.status = s;
        let why = waits_for_snapshot(&c, &upgrade).unwrap();
        assert!(why.contains(&format!("{} asked of cp-a", op.name)), "{why}");

        // It fails: the change still waits, says why and how to go on,
        // and it is asked again only after the retry time.
        c.status.snapshot.as_mut().unwrap().failed_at = Some(now);
        c.status.snapshot.as_mut().unwrap().error = "etcd is down".into();
        let why = waits_for_snapshot(&c, &upgrade).unwrap();
        assert!(
            why.contains("failed (etcd is down)") && why.contains("beforeChanges: false"),
            "{why}"
        );
        let mut s = c.status.clone();
        apply_backup(
            &mut s,
            &c,
            &[&cp],
            Some(&upgrade),
            now + time::Duration::minutes(1),
        );
        assert!(!s.snapshot.as_ref().unwrap().under_way());
        apply_backup(
            &mut s,
            &c,
            &[&cp],
            Some(&upgrade),
            now + SNAPSHOT_FAILED_RETRY,
        );
        assert!(s.snapshot.as_ref().unwrap().under_way());

        // Saved (as the coordinator records it): the upgrade goes ahead,
        // and a scale-down is another change.
        c.status.snapshot = None;
        c.status.snapshot_taken_before = Some(upgrade.change.clone());
        assert_eq!(waits_for_snapshot(&c, &upgrade), None);
        assert!(waits_for_snapshot(&c, &Before::scale_down(&c, 1)).is_some());
        assert!(waits_for_snapshot(&c, &Before::upgrade("v1.33.0")).is_some());

        // Turned off, or before the cluster is initialised: nothing waits.
        c.spec.backup.as_mut().unwrap().before_changes = Some(false);
        assert_eq!(waits_for_snapshot(&c, &Before::scale_down(&c, 1)), None);
        c.spec.backup.as_mut().unwrap().before_changes = None;
        c.status.initialized = false;
        assert_eq!(waits_for_snapshot(&c, &Before::scale_down(&c, 1)), None);
    }
}
