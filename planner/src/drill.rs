//! Restore drills: a snapshot restored into a new, separate cluster,
//! inventoried, then deleted, so that a backup is known to restore before
//! it is needed.
//!
//! The drill cluster is an ordinary cluster of one control plane that the
//! coordinator creates already restoring (`status.restore` with its
//! `source`, `status.drillOf`); `restore.rs` brings it up. Here:
//! - on the drill cluster, once its restore is done, the inventory is asked
//!   of its running control plane ([`apply_drill`]); once reported (or the
//!   drill failed: its init machine failed, the inventory failed, or
//!   [`DRILL_TIMEOUT`] passed), [`Step::FinishDrill`] records the outcome on
//!   the cluster drilled and deletes the drill cluster;
//! - on a cluster with `spec.backup.drill`, [`Step::StartDrill`] once the
//!   schedule is due ([`drill_due_at`]), it has a snapshot, and no drill of
//!   it is under way.

use drover_common::api::{
    BackupSpec, Cluster, ClusterStatus, DrillDone, DrillOf, InventoryAsk, Machine, MachinePhase,
    DRILL_TIMEOUT,
};
use drover_common::names::MAX_NAME_PREFIX;
use time::OffsetDateTime;

use super::shared::{is_control_plane, Step};

/// The name of `cluster`'s scheduled drill cluster: `<name>-drill`, the
/// name cut so that its machines' names stay DNS labels (the room a
/// cluster's name has, as `Cluster::validate` checks it).
pub fn drill_name(cluster: &str) -> String {
    const SUFFIX: &str = "-drill";
    let room = MAX_NAME_PREFIX - "cp".len() - SUFFIX.len();
    let base = cluster[..cluster.len().min(room)].trim_end_matches('-');
    format!("{base}{SUFFIX}")
}

/// When `cluster`'s next scheduled drill is due: `spec.backup.drill.every`
/// after the last one started (or after the cluster was made). `None`
/// when none can start: no schedule, a drill cluster itself, a drill under
/// way, not initialized, no snapshot yet, or being deleted.
pub fn drill_due_at(cluster: &Cluster) -> Option<OffsetDateTime> {
    let s = &cluster.status;
    if s.drill_of.is_some()
        || s.drill.is_some()
        || !s.initialized
        || s.last_snapshot.is_none()
        || cluster.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    let every = BackupSpec::drill_every(cluster.spec.backup.as_ref())?;
    let every = time::Duration::try_from(every).ok()?;
    let since = cluster
        .status
        .last_drill
        .as_ref()
        .map(|d| d.started_at)
        .or(cluster.metadata.creation_timestamp)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    Some(since + every)
}

/// On a drill cluster's `status` (the one a pass is building): asks the
/// inventory of its first running control plane of `via` once its restore
/// is done (`initialized` and no restore left).
pub(crate) fn apply_drill(
    status: &mut ClusterStatus,
    cluster: &Cluster,
    via: &[&Machine],
    initialized: bool,
    now: OffsetDateTime,
) {
    let Some(drill) = status.drill_of.as_mut() else {
        return;
    };
    if drill.inventory.is_some()
        || drill.failed.is_some()
        || !initialized
        || status.restore.is_some()
        || cluster.metadata.deletion_timestamp.is_some()
    {
        return;
    }
    let mut running: Vec<&&Machine> = via.iter().collect();
    running.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    if let Some(m) = running.first() {
        drill.inventory = Some(InventoryAsk {
            via: m.metadata.name.clone(),
            requested_at: now,
            result: None,
            error: None,
        });
    }
}

/// The drill steps of `cluster` (its machines `mine`): the end of its own
/// drill when it is a drill cluster, or the start of a scheduled drill of
/// it.
pub(crate) fn drill_steps(cluster: &Cluster, mine: &[&Machine], now: OffsetDateTime) -> Vec<Step> {
    if cluster.metadata.deletion_timestamp.is_some() {
        return vec![];
    }
    if let Some(drill) = &cluster.status.drill_of {
        return ended(cluster, drill, mine, now)
            .map(|(ok, message)| Step::FinishDrill {
                done: Box::new(DrillDone {
                    cluster: cluster.metadata.name.clone(),
                    snapshot: drill.snapshot.clone(),
                    revision: drill.revision,
                    trigger: drill.trigger,
                    started_at: drill.started_at,
                    completed_at: now,
                    ok,
                    message,
                    inventory: drill
                        .inventory
                        .as_ref()
                        .and_then(|i| i.result.clone())
                        .filter(|_| ok),
                }),
            })
            .into_iter()
            .collect();
    }
    if drill_due_at(cluster).is_some_and(|at| at <= now) {
        return vec![Step::StartDrill {
            into: drill_name(&cluster.metadata.name),
        }];
    }
    vec![]
}

/// Whether drill cluster `cluster`'s drill has ended, and how: passed
/// with its inventory, or failed and why.
fn ended(
    cluster: &Cluster,
    drill: &DrillOf,
    mine: &[&Machine],
    now: OffsetDateTime,
) -> Option<(bool, String)> {
    let restored = format!(
        "snapshot {} (revision {}) of cluster {}",
        drill.snapshot, drill.revision, drill.source.cluster
    );
    if let Some(why) = &drill.failed {
        return Some((false, why.clone()));
    }
    if let Some(ask) = &drill.inventory {
        if let Some(inventory) = &ask.result {
            return Some((
                true,
                format!(
                    "{restored} restored into {}, whose API answered with {}",
                    cluster.metadata.name,
                    inventory.summary()
                ),
            ));
        }
        if let Some(error) = &ask.error {
            return Some((
                false,
                format!(
                    "{restored} restored into {}, but its inventory failed on {}: {error}",
                    cluster.metadata.name, ask.via
                ),
            ));
        }
    }
    let init_failed = mine.iter().find_map(|m| {
        let failure = m.status.bootstrap.as_ref()?;
        let f = failure.failure.as_ref()?;
        (is_control_plane(m) && m.status.phase != MachinePhase::Running).then(|| {
            format!(
                "{restored} did not restore: machine {} failed at {}: {}",
                m.metadata.name,
                failure.step,
                f.output_tail
                    .last()
                    .map(String::as_str)
                    .unwrap_or("no output")
            )
        })
    });
    if let Some(why) = init_failed {
        return Some((false, why));
    }
    if now - drill.started_at >= DRILL_TIMEOUT {
        let stage = match &drill.inventory {
            Some(ask) => format!("the inventory asked of {} was not reported", ask.via),
            None => cluster
                .status
                .conditions
                .iter()
                .find(|c| c.type_ == drover_common::api::RESTORING_CONDITION)
                .map(|c| c.message.clone())
                .unwrap_or_else(|| "the restore did not finish".into()),
        };
        return Some((
            false,
            format!(
                "{restored} did not come up within {} minutes: {stage}",
                DRILL_TIMEOUT.whole_minutes()
            ),
        ));
    }
    None
}
