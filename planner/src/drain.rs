//! A machine that leaves on purpose (scale-down, `drover delete machine`) is
//! drained first: a running control plane cordons its Node and evicts its
//! Pods through the Eviction API, so PodDisruptionBudgets hold. This pass
//! runs over the steps either planner made: it holds back the step that
//! removes a machine (`Release` or `DeleteMachine`, not a remediation) until
//! its drain succeeded, one drain at a time, and after the drain timeout
//! either halts with a `DrainFailed` condition naming what blocks it or,
//! with `spec.drain.force`, lets the machine go.
//!
//! A pool machine about to upgrade in place (`status.machineUpgrade` at its
//! drain step) is drained the same way, though it stays.
//!
//! A machine that is silent, or whose Node is reported not Ready, is not
//! drained: there is nothing to evict through, or no kubelet to confirm an
//! eviction. Remediations are never held.

use super::shared::{Observed, Step};
use drover_common::api::{
    set_condition, Cluster, DrainPolicy, Machine, MachinePhase, MachineUpgradeStep, NodeDrain,
};

/// The condition a halted drain sets.
pub const DRAIN_CONDITION: &str = "DrainFailed";

/// How long after a failed attempt the next one is asked for.
pub const DRAIN_RETRY: time::Duration = time::Duration::seconds(10);

/// How long an attempt may go unanswered before it is asked for again (the
/// agent may have restarted and lost it). A drain is idempotent, so asking
/// again costs one heartbeat's work; the period is longer than an attempt
/// may take (the agent waits up to 30 s for evicted Pods to go), so a slow
/// attempt is not asked for twice.
pub const DRAIN_RESEND: time::Duration = time::Duration::seconds(60);

/// Holds back the removals of `steps` whose machines are not drained yet,
/// and records the drain under way in the cluster's status.
pub(crate) fn gate_drains(
    cluster: &Cluster,
    mine: &[&Machine],
    observed: &Observed<'_>,
    mut steps: Vec<Step>,
) -> Vec<Step> {
    let before = cluster.status.drain.clone();
    // Nothing is drained from a cluster being deleted, nor from one whose
    // etcd is being restored (its API server is what is being replaced).
    let deleting =
        cluster.metadata.deletion_timestamp.is_some() || cluster.status.restore.is_some();
    let mut leaving: Vec<String> = steps
        .iter()
        .filter_map(|s| match s.removal() {
            Some((machine, false)) if !deleting => Some(machine.clone()),
            _ => None,
        })
        .collect();
    // A pool machine about to upgrade in place is drained as well, though
    // it stays.
    let planned = steps
        .iter()
        .find_map(|s| match s {
            Step::SetStatus(st) => Some(&**st),
            _ => None,
        })
        .unwrap_or(&cluster.status);
    let upgrading: Option<String> = planned
        .machine_upgrade
        .as_ref()
        .filter(|u| u.step == MachineUpgradeStep::Drain && !deleting)
        .map(|u| u.machine.clone());
    leaving.extend(upgrading.clone());
    // A drain whose machine no longer leaves (it left, or stays) is over.
    let mut drain = before.clone().filter(|d| leaving.contains(&d.machine));
    let mut failed: Option<String> = None;
    let mut held: Vec<String> = Vec::new();
    for name in &leaving {
        let Some(node) = node_to_drain(cluster, mine, observed, name) else {
            continue;
        };
        let purpose = if upgrading.as_ref() == Some(name) {
            "upgraded"
        } else {
            "removed"
        };
        let verdict = decide(
            cluster,
            mine,
            observed,
            name,
            &node,
            drain.as_ref(),
            purpose,
        );
        match verdict {
            Verdict::Go => {}
            Verdict::Hold => held.push(name.clone()),
            Verdict::Ask(d) => {
                drain = Some(d);
                held.push(name.clone());
            }
            Verdict::Halt(why, next) => {
                if next.is_some() {
                    drain = next;
                }
                failed = Some(why);
                held.push(name.clone());
            }
        }
    }
    steps.retain(|s| {
        s.removal()
            .is_none_or(|(machine, _)| !held.contains(machine))
    });
    let had_condition = cluster
        .status
        .conditions
        .iter()
        .any(|c| c.type_ == DRAIN_CONDITION);
    if drain == before && failed.is_none() && !had_condition {
        return steps;
    }
    let mut status = match steps.iter().position(|s| matches!(s, Step::SetStatus(_))) {
        Some(i) => match steps.remove(i) {
            Step::SetStatus(st) => *st,
            _ => unreachable!("the position of a SetStatus step"),
        },
        None => cluster.status.clone(),
    };
    status.drain = drain;
    match &failed {
        Some(why) => {
            set_condition(
                &mut status.conditions,
                DRAIN_CONDITION,
                true,
                "DrainTimedOut",
                why,
            );
        }
        None if had_condition => {
            set_condition(
                &mut status.conditions,
                DRAIN_CONDITION,
                false,
                "Drained",
                "",
            );
        }
        None => {}
    }
    if status != cluster.status {
        steps.push(Step::SetStatus(Box::new(status)));
    }
    steps
}

/// What to do with one leaving machine.
enum Verdict {
    /// It may leave now.
    Go,
    /// It waits for its drain (or another machine's).
    Hold,
    /// It waits; this attempt is to be asked for.
    Ask(NodeDrain),
    /// Its drain timed out: removal halts, saying why; the drain may be
    /// asked for again.
    Halt(String, Option<NodeDrain>),
}

fn decide(
    cluster: &Cluster,
    mine: &[&Machine],
    observed: &Observed<'_>,
    name: &str,
    node: &str,
    drain: Option<&NodeDrain>,
    purpose: &str,
) -> Verdict {
    let now = observed.now;
    let policy = cluster.spec.drain.as_ref();
    let timeout = time::Duration::try_from(DrainPolicy::timeout(policy))
        .unwrap_or(time::Duration::minutes(10));
    let force = policy.is_some_and(|p| p.force);
    let Some(d) = drain else {
        return match via(mine, observed, name) {
            Some(via) => Verdict::Ask(NodeDrain {
                machine: name.to_owned(),
                node: node.to_owned(),
                via,
                started_at: now,
                requested_at: now,
                result: None,
            }),
            // No running control plane to drain through: nothing can be
            // evicted, so nothing holds the machine.
            None => Verdict::Go,
        };
    };
    if d.machine != name {
        // One drain at a time.
        return Verdict::Hold;
    }
    if d.result.as_ref().is_some_and(|r| r.ok) {
        return Verdict::Go;
    }
    let timed_out = now - d.started_at >= timeout;
    if timed_out && force {
        return Verdict::Go;
    }
    // Halted or not, a failed drain is asked for again, so the machine goes
    // as soon as what blocks it is gone.
    let again = match &d.result {
        Some(_) => now - d.requested_at >= DRAIN_RETRY,
        None => now - d.requested_at >= DRAIN_RESEND,
    };
    // The control plane asked before may be gone.
    let via_gone = !mine
        .iter()
        .any(|m| m.metadata.name == d.via && observed.alive(&m.metadata.name));
    let next = if again || via_gone {
        via(mine, observed, name).map(|via| NodeDrain {
            via,
            requested_at: now,
            result: None,
            ..d.clone()
        })
    } else {
        None
    };
    if timed_out {
        // While an attempt after the halt is pending, the halt keeps saying
        // what blocked the last one.
        let said_before = cluster
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == DRAIN_CONDITION && c.status == "True")
            .map(|c| c.message.clone());
        if let (None, Some(said)) = (&d.result, said_before) {
            return Verdict::Halt(said, next);
        }
        let why = d
            .result
            .as_ref()
            .map(|r| r.message.clone())
            .unwrap_or_else(|| format!("machine {} did not answer the drain", d.via));
        return Verdict::Halt(
            format!(
                "machine {name} is not {purpose}: draining Node {node} failed for {}s: {why}; \
                 remove what blocks it, or set spec.drain.force to go on anyway",
                timeout.whole_seconds()
            ),
            next,
        );
    }
    match next {
        Some(d) => Verdict::Ask(d),
        None => Verdict::Hold,
    }
}

/// The Node of `name` if it is to be drained: the machine is heard from
/// and its Node is not known to be down. The reported Node list lags the
/// cluster by a report, so a Node missing from it may well exist and run
/// Pods: it is drained (a Node that is really gone drains at once). Only a
/// Node reported not Ready is left alone: its kubelet would never confirm
/// an eviction.
fn node_to_drain(
    cluster: &Cluster,
    mine: &[&Machine],
    observed: &Observed<'_>,
    name: &str,
) -> Option<String> {
    let m = mine.iter().find(|m| m.metadata.name == name)?;
    let node = &m.status.hostname;
    if node.is_empty() || !observed.alive(name) {
        return None;
    }
    let down = cluster
        .status
        .nodes
        .iter()
        .any(|n| n.name == *node && n.ready != "True");
    (!down).then(|| node.clone())
}

/// A running control plane, heard from and not leaving, to drain through;
/// the leaving machine itself only when no other is.
fn via(mine: &[&Machine], observed: &Observed<'_>, leaving: &str) -> Option<String> {
    let mut running: Vec<&&Machine> = mine
        .iter()
        .filter(|m| {
            m.status.phase == MachinePhase::Running
                && m.metadata.deletion_timestamp.is_none()
                && observed.alive(&m.metadata.name)
                && super::shared::is_control_plane(m)
        })
        .collect();
    running.sort_by_key(|m| (m.metadata.name == leaving, m.metadata.name.clone()));
    running.first().map(|m| m.metadata.name.clone())
}
