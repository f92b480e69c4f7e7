//! Heartbeats: what one changes on its machine and its cluster, and the
//! answer (the assignment and the directives to carry out).
//!
//! A heartbeat is taken in three changes, each re-applied to a fresher copy
//! when a concurrent write wins: the join tokens it reports registered
//! ([`activate_tokens`]), its cluster's status ([`record_on_cluster`]: the
//! results of the operations in flight and a control plane's view of the
//! cluster) and the machine itself ([`record_on_machine`]). The answer
//! ([`answer`]) is made from what they left.
//!
//! Invariant: a report about an older assignment (a stale generation) says
//! nothing about the current one, and a quiet heartbeat ([`is_quiet`])
//! changes nothing and needs nothing from the store.

use drover_common::api::{
    push_event, set_condition, Cluster, Condition, Machine, MachinePhase, NodeProblem,
    NODE_PROBLEM_TYPES,
};
use drover_common::wire::{
    AgentPhase, AssignmentNotice, CommandFailure, Directive, DirectiveAction, DirectiveResult,
    HealthReport, HeartbeatRequest, HeartbeatResponse, ProbeState,
};
use time::OffsetDateTime;

use super::operations::{self, Reported};
use super::view::{self, ViewChange};
use crate::domain::jointokens::{directive_id, ClusterJoinTokens};
use crate::domain::replicas::MachineKind;

/// The id prefix of the directives that register a join token.
const TOKEN_PREFIX: &str = "token-";

/// Whether a heartbeat changes nothing and needs nothing from the store:
/// no directive results to record, no status change, and not a running
/// control-plane machine (which may be handed join tokens to register).
pub fn is_quiet(machine: &Machine, hb: &HeartbeatRequest) -> bool {
    if !hb.directive_results.is_empty() {
        return false;
    }
    if machine.status.phase == MachinePhase::Running
        && machine
            .spec
            .assignment
            .as_ref()
            .is_some_and(|a| a.role.is_control_plane())
    {
        return false;
    }
    let mut after = machine.clone();
    apply_heartbeat(&mut after, hb);
    after.status == machine.status && after.spec == machine.spec
}

/// The change a heartbeat makes to its machine: folds it in, and stamps the
/// heartbeat time when that changed anything. Whether it did.
pub fn record_on_machine(m: &mut Machine, hb: &HeartbeatRequest, now: OffsetDateTime) -> bool {
    let before = m.status.clone();
    let before_spec = m.spec.clone();
    apply_heartbeat(m, hb);
    super::reboot::record(m, hb, now);
    let changed = m.status != before || m.spec != before_spec;
    if changed {
        m.status.last_heartbeat_time = Some(now);
    }
    changed
}

/// Folds a heartbeat into a machine.
pub fn apply_heartbeat(m: &mut Machine, hb: &HeartbeatRequest) {
    m.status
        .heartbeat_fallback
        .clone_from(&hb.heartbeat_fallback);
    if let Some(v) = &hb.kubeadm_version {
        m.status.kubeadm_version.clone_from(v);
    }
    if let Some(c) = &hb.certificates {
        m.status.certificates = Some(c.clone());
    }
    let before_phase = m.status.phase;
    if matches!(before_phase, MachinePhase::Deleting | MachinePhase::Deleted) {
        m.status.health = Some(hb.health.clone());
        return;
    }
    let releasing = m.status.phase == MachinePhase::Releasing;
    if releasing {
        if hb.phase == AgentPhase::Waiting && hb.applied_generation == 0 {
            m.status.bootstrap = None;
            m.status.applied_generation = 0;
            // The agent reset itself.
            crate::domain::removal::finish_leaving(m);
        }
    } else {
        let assigned = m.spec.assignment.is_some();
        let current_gen = m.spec.assignment.as_ref().map(|a| a.generation);
        // Reports about an older assignment say nothing about the current one.
        let about_current =
            hb.applied_generation == 0 || Some(hb.applied_generation) == current_gen;
        m.status.phase = match hb.phase {
            AgentPhase::Waiting if assigned => MachinePhase::Assigned,
            AgentPhase::Waiting => MachinePhase::Registered,
            _ if !about_current => m.status.phase,
            AgentPhase::Bootstrapping => MachinePhase::Bootstrapping,
            AgentPhase::Running => MachinePhase::Running,
            AgentPhase::Failed => MachinePhase::Failed,
            AgentPhase::Resetting => MachinePhase::Releasing,
        };
        if about_current {
            m.status.bootstrap = hb.bootstrap.clone();
            m.status.applied_generation = hb.applied_generation;
        }
    }
    m.status.health = Some(hb.health.clone());
    record_problems(&mut m.status.conditions, &hb.health.problems);
    if m.status.phase == MachinePhase::Running {
        let (healthy, reason, message) = health_verdict(&hb.health);
        set_condition(
            &mut m.status.conditions,
            drover_planner::health::HEALTHY_CONDITION,
            healthy,
            reason,
            &message,
        );
    }
    if m.status.phase != before_phase {
        let (reason, message) = match m.status.phase {
            MachinePhase::Bootstrapping => ("Bootstrapping", "kubeadm is running".to_string()),
            MachinePhase::Running => (
                "Bootstrapped",
                "kubeadm finished; the node is reporting".to_string(),
            ),
            MachinePhase::Failed => (
                "BootstrapFailed",
                m.status
                    .bootstrap
                    .as_ref()
                    .and_then(|b| b.failure.as_ref().map(|f| (b.step.as_str(), f)))
                    .map(|(step, f)| failure_event(step, f))
                    .unwrap_or_else(|| "bootstrap failed".into()),
            ),
            MachinePhase::Registered if before_phase == MachinePhase::Releasing => (
                "ReturnedToPool",
                "reset done; waiting in the pool".to_string(),
            ),
            MachinePhase::Deleted => (
                "Deleted",
                "reset done; deregistered as requested, its identity revoked".to_string(),
            ),
            other => ("PhaseChanged", format!("now {other}")),
        };
        push_event(&mut m.status.events, reason, message);
    }
}

/// Keeps the problems the agent's checks report as conditions of their
/// type: True while reported (the transition time says since when), False
/// once no longer reported. A type never reported adds no condition.
fn record_problems(conditions: &mut Vec<Condition>, problems: &[NodeProblem]) {
    for p in problems {
        set_condition(conditions, &p.type_, true, &p.reason, &p.message);
    }
    for t in NODE_PROBLEM_TYPES {
        let was = conditions
            .iter()
            .any(|c| c.type_ == *t && c.status == "True");
        if was && !problems.iter().any(|p| p.type_ == *t) {
            set_condition(
                conditions,
                t,
                false,
                "NoLongerSeen",
                "the agent's check no longer sees this problem",
            );
        }
    }
}

/// Whether a health report is healthy, with a stable reason and message.
fn health_verdict(h: &HealthReport) -> (bool, &'static str, String) {
    if h.kubelet.state == ProbeState::Unhealthy {
        return (false, "KubeletUnhealthy", h.kubelet.message.clone());
    }
    if let Some(a) = &h.api_server {
        if a.state == ProbeState::Unhealthy {
            return (false, "ApiServerUnhealthy", a.message.clone());
        }
    }
    (true, "Healthy", String::new())
}

/// The lines of a failed command's output an event keeps.
const EVENT_OUTPUT_LINES: usize = 5;

/// The longest output line an event keeps, in characters.
const EVENT_LINE_CHARS: usize = 240;

/// A bootstrap failure as an event message: the step, the command, how it
/// ended and the last lines of its output.
fn failure_event(step: &str, f: &CommandFailure) -> String {
    let ended = match f.exit_code {
        Some(code) => format!("exited with status {code}"),
        None => "did not exit by itself (killed, timed out or not started)".to_owned(),
    };
    let mut message = format!("{step}: `{}` {ended}", f.command);
    let tail = &f.output_tail[f.output_tail.len().saturating_sub(EVENT_OUTPUT_LINES)..];
    if !tail.is_empty() {
        message.push_str("; output ends: ");
        let lines: Vec<String> = tail
            .iter()
            .map(|l| match l.char_indices().nth(EVENT_LINE_CHARS) {
                Some((cut, _)) => format!("{}…", &l[..cut]),
                None => l.clone(),
            })
            .collect();
        message.push_str(&lines.join(" | "));
    }
    message
}

/// The results of join-token registrations a heartbeat reports, ok or not;
/// none for a machine without an assignment (its cluster's tokens are not
/// its own).
pub fn token_results<'a>(machine: &Machine, hb: &'a HeartbeatRequest) -> Vec<&'a DirectiveResult> {
    if machine.spec.assignment.is_none() {
        return vec![];
    }
    hb.directive_results
        .iter()
        .filter(|r| r.id.starts_with(TOKEN_PREFIX))
        .collect()
}

/// What [`activate_tokens`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Activation {
    /// Whether a token became usable (the tokens are to be written).
    pub changed: bool,
    /// The directives reported done for a token that was not sent to the
    /// machine: ignored.
    pub ignored: Vec<String>,
}

/// Activates the join tokens that machine `by` (a UID) reports registered
/// in `results` (those of [`token_results`]). A result for a token that was
/// not sent to `by` changes nothing.
pub fn activate_tokens(
    tokens: &mut ClusterJoinTokens,
    results: &[&DirectiveResult],
    by: &str,
) -> Activation {
    let mut out = Activation::default();
    for r in results.iter().filter(|r| r.ok) {
        if let Some(id) = r.id.strip_prefix(TOKEN_PREFIX) {
            if tokens.activate(id, by) {
                out.changed = true;
            } else {
                out.ignored.push(r.id.clone());
            }
        }
    }
    out
}

/// The results of cleanups (member removals, Node deletions) a heartbeat
/// reports: each makes its cluster look again, whatever it says.
pub fn cleanup_results(hb: &HeartbeatRequest) -> impl Iterator<Item = &DirectiveResult> {
    hb.directive_results
        .iter()
        .filter(|r| operations::is_cleanup(r))
}

/// Whether a heartbeat of `machine` reports what its cluster keeps: results
/// of the operations in flight, or (a running control plane) its view of
/// the cluster. Only then is the cluster read and maybe written.
pub fn touches_cluster(machine: &Machine, hb: &HeartbeatRequest) -> bool {
    machine.spec.assignment.is_some()
        && (hb.directive_results.iter().any(operations::is_recorded)
            || view::reports_view(machine, hb))
}

/// What a heartbeat recorded on its cluster.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ClusterRecord {
    /// What the directive results told.
    pub reported: Vec<Reported>,
    /// What changed in the control plane's view of the cluster.
    pub view: ViewChange,
}

impl ClusterRecord {
    /// Whether the cluster is to be looked at again now.
    pub fn wakes(&self) -> bool {
        self.reported.iter().any(Reported::wakes) || self.view.changed()
    }
}

/// The change a heartbeat of `machine` makes to its cluster `cluster` (as
/// read now): the results of the operations in flight, then a running
/// control plane's view. Nothing when `cluster` is not the machine's (gone
/// and made again under the same name).
pub fn record_on_cluster(
    cluster: &mut Cluster,
    machine: &Machine,
    hb: &HeartbeatRequest,
    now: OffsetDateTime,
) -> ClusterRecord {
    let Some(a) = &machine.spec.assignment else {
        return ClusterRecord::default();
    };
    if cluster.metadata.uid.as_deref() != Some(a.cluster_uid.as_str()) {
        return ClusterRecord::default();
    }
    let name = &machine.metadata.name;
    let reported =
        operations::record_results(&mut cluster.status, name, &hb.directive_results, now);
    let view = if view::reports_view(machine, hb) {
        view::record_view(&mut cluster.status, name, hb, now)
    } else {
        ViewChange::default()
    };
    ClusterRecord { reported, view }
}

/// Whether the answer to `machine` needs its cluster and the cluster's join
/// tokens: a running control plane, which carries the cluster's directives.
pub fn reads_cluster(machine: &Machine) -> bool {
    machine.status.phase == MachinePhase::Running
        && machine
            .spec
            .assignment
            .as_ref()
            .is_some_and(|a| a.role.is_control_plane())
}

/// The answer to a heartbeat of `machine` (as recorded): the assignment and
/// the directives to carry out. `cluster` and `tokens` are the machine's
/// cluster and its join tokens when [`reads_cluster`] (either is ignored
/// when it belongs to another cluster of the same name).
pub fn answer(
    machine: &Machine,
    cluster: Option<&Cluster>,
    tokens: Option<&ClusterJoinTokens>,
    now: OffsetDateTime,
    heartbeat_interval_seconds: u64,
) -> HeartbeatResponse {
    let mut directives = vec![];
    let mut assignment = None;
    let gone = matches!(
        machine.status.phase,
        MachinePhase::Deleting | MachinePhase::Deleted
    );
    if let Some(a) = machine.spec.assignment.as_ref().filter(|_| !gone) {
        if machine.status.phase == MachinePhase::Releasing {
            directives.push(Directive {
                id: format!("reset-g{}", a.generation),
                action: DirectiveAction::Reset {
                    reason: format!("released from cluster {}", a.cluster),
                },
            });
        } else {
            assignment = Some(AssignmentNotice {
                cluster: a.cluster.clone(),
                role: a.role,
                generation: a.generation,
            });
            let running = machine.status.phase == MachinePhase::Running;
            directives.extend(super::reboot::directive(machine));
            if let Some(r) = machine.status.upgrade.clone().filter(|_| running) {
                directives.push(Directive {
                    id: r.id,
                    action: DirectiveAction::UpgradeKubernetes {
                        version: r.version,
                        command: r.command,
                    },
                });
            }
            if reads_cluster(machine) {
                let name = &machine.metadata.name;
                let cluster =
                    cluster.filter(|c| c.metadata.uid.as_deref() == Some(a.cluster_uid.as_str()));
                if let Some(c) = cluster {
                    directives.extend(operations::directives(c, name));
                }
                let uid = machine.metadata.uid.as_deref().unwrap_or_default();
                if let Some(tokens) = tokens.filter(|t| t.cluster_uid == a.cluster_uid) {
                    for t in tokens.pending_for(now, uid) {
                        directives.push(Directive {
                            id: directive_id(&t.token),
                            action: DirectiveAction::CreateBootstrapToken {
                                token: t.token.clone(),
                                ttl_seconds: (t.expires_at - now).whole_seconds().max(1) as u64,
                            },
                        });
                    }
                }
            }
        }
    }
    HeartbeatResponse {
        heartbeat_interval_seconds,
        assignment,
        directives,
        datagram: None,
        coordinators: None,
    }
}

/// Whether an answer may offer datagram heartbeats: the agent takes them,
/// and the answer asks nothing of it. An answer naming new coordinator URLs
/// offers none: the next report carries the new list's digest, so it goes
/// over HTTPS anyway.
pub fn may_offer_datagrams(hb: &HeartbeatRequest, answer: &HeartbeatResponse) -> bool {
    hb.datagrams && answer.directives.is_empty() && answer.coordinators.is_none()
}

/// Which coordinator URL list `machine` can use: docker machines dial the
/// gateway's. `None` when that is unknown (its cluster is gone).
pub fn machine_kind(machine: &Machine, cluster: Option<&Cluster>) -> Option<MachineKind> {
    let Some(a) = machine.spec.assignment.as_ref() else {
        return Some(MachineKind::Other);
    };
    let cluster = cluster.filter(|c| c.metadata.uid.as_deref() == Some(a.cluster_uid.as_str()))?;
    Some(match cluster.spec.provider {
        drover_common::api::ProviderSpec::Docker(_) => MachineKind::Docker,
        _ => MachineKind::Other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::{
        Assignment, ClusterStatus, MachineRole, MachineSpec, MachineStatus, MachineUpgrade,
        MachineUpgradeStep, NodeDrain, UpgradeCommand,
    };

    fn machine(phase: MachinePhase, generation: Option<u64>) -> Machine {
        Machine {
            spec: MachineSpec {
                bmc: None,
                pool: "p".into(),
                provider: None,
                assignment: generation.map(|g| Assignment {
                    cluster: "c".into(),
                    cluster_uid: "u".into(),
                    machine_pool: "control-plane".into(),
                    role: MachineRole::Init,
                    generation: g,
                    assigned_at: None,
                    replaces: None,
                    kubernetes_version: None,
                    image: None,
                }),
            },
            status: MachineStatus {
                phase,
                ..Default::default()
            },
            ..crate::protocol::fixtures::machine("m")
        }
    }

    use crate::protocol::fixtures::{heartbeat as hb, result};

    /// Whether an answer asks for the uncordon of an in-place upgrade.
    fn asks_uncordon(answer: &HeartbeatResponse) -> bool {
        answer
            .directives
            .iter()
            .any(|d| matches!(d.action, DirectiveAction::UncordonNode { .. }))
    }

    fn t0() -> OffsetDateTime {
        time::macros::datetime!(2026-01-01 00:00 UTC)
    }

    /// Cluster `c` (uid `u`) with a drain of `leaving` asked of `m`.
    fn cluster_draining(requested_at: OffsetDateTime) -> Cluster {
        let mut c: Cluster = serde_saphyr::from_str(
            "apiVersion: drover.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: c\n  uid: u\n\
             spec:\n  kubernetesVersion: v1.31.2\n  controlPlane:\n    replicas: 1\n  \
             provider:\n    pool:\n      selector: {}\n",
        )
        .unwrap();
        c.status = ClusterStatus {
            drain: Some(NodeDrain {
                machine: "leaving".into(),
                node: "node-leaving".into(),
                via: "m".into(),
                started_at: t0(),
                requested_at,
                result: None,
            }),
            ..Default::default()
        };
        c
    }

    #[test]
    fn waiting_agent_with_assignment_is_assigned() {
        let mut m = machine(MachinePhase::Registered, Some(2));
        apply_heartbeat(&mut m, &hb(AgentPhase::Waiting, 0));
        assert_eq!(m.status.phase, MachinePhase::Assigned);
        apply_heartbeat(&mut m, &hb(AgentPhase::Running, 2));
        assert_eq!(m.status.phase, MachinePhase::Running);
    }

    #[test]
    fn the_agents_problems_become_conditions_that_say_since_when_and_clear() {
        let mut m = machine(MachinePhase::Running, Some(2));
        let problem = |t: &str, reason: &str| NodeProblem {
            type_: t.into(),
            reason: reason.into(),
            message: format!("{t} seen"),
        };
        let mut beat = hb(AgentPhase::Running, 2);
        beat.health.problems = vec![
            problem(drover_common::api::DISK_PRESSURE, "DiskSpaceLow"),
            problem(
                drover_common::api::READ_ONLY_FILESYSTEM,
                "FilesystemIsReadOnly",
            ),
        ];
        apply_heartbeat(&mut m, &beat);
        let of = |m: &Machine, t: &str| {
            m.status
                .conditions
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone(), c.last_transition_time))
        };
        let (status, reason, since) = of(&m, "DiskPressure").expect("a DiskPressure condition");
        assert_eq!((status.as_str(), reason.as_str()), ("True", "DiskSpaceLow"));
        assert_eq!(of(&m, "ReadOnlyFilesystem").unwrap().0, "True");
        assert_eq!(
            of(&m, "MemoryPressure"),
            None,
            "never reported: no condition"
        );
        // The same again keeps its time; one gone turns False.
        beat.health.problems.truncate(1);
        apply_heartbeat(&mut m, &beat);
        assert_eq!(of(&m, "DiskPressure").unwrap().2, since);
        let (status, reason, _) = of(&m, "ReadOnlyFilesystem").unwrap();
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "NoLongerSeen")
        );
        // A free pool machine's problems are kept too.
        let mut free = machine(MachinePhase::Registered, None);
        let mut beat = hb(AgentPhase::Waiting, 0);
        beat.health.problems = vec![problem(drover_common::api::MEMORY_PRESSURE, "MemoryLow")];
        apply_heartbeat(&mut free, &beat);
        assert_eq!(of(&free, "MemoryPressure").unwrap().0, "True");
    }

    #[test]
    fn stale_generation_reports_are_ignored() {
        let mut m = machine(MachinePhase::Assigned, Some(3));
        apply_heartbeat(&mut m, &hb(AgentPhase::Running, 2));
        assert_eq!(m.status.phase, MachinePhase::Assigned);
    }

    #[test]
    fn releasing_machine_returns_to_pool_after_reset() {
        let mut m = machine(MachinePhase::Releasing, Some(3));
        // An upgrade its cluster asked for does not follow it to the pool.
        m.status.upgrade = Some(drover_common::api::UpgradeRequest {
            id: "upgrade-n-1".into(),
            version: "v1.32.0".into(),
            command: UpgradeCommand::Node,
        });
        apply_heartbeat(&mut m, &hb(AgentPhase::Running, 3));
        assert_eq!(m.status.phase, MachinePhase::Releasing);
        assert!(m.spec.assignment.is_some());
        apply_heartbeat(&mut m, &hb(AgentPhase::Waiting, 0));
        assert_eq!(m.status.phase, MachinePhase::Registered);
        assert!(m.spec.assignment.is_none());
        assert!(m.status.upgrade.is_none());
    }

    #[test]
    fn a_stale_generation_heartbeat_changes_nothing_but_health_and_is_answered_with_the_assignment()
    {
        let mut m = machine(MachinePhase::Assigned, Some(3));
        m.status.health = Some(HealthReport::default());
        let beat = hb(AgentPhase::Running, 2);
        assert!(is_quiet(&m, &beat), "a report about generation 2 is quiet");
        let mut after = m.clone();
        assert!(!record_on_machine(&mut after, &beat, t0()));
        assert_eq!(after, m);
        let answer = answer(&after, None, None, t0(), 7);
        assert_eq!(answer.heartbeat_interval_seconds, 7);
        assert_eq!(answer.assignment.map(|a| a.generation), Some(3));
        assert!(answer.directives.is_empty());
        // It takes its assignment: the change is stamped and not quiet.
        let now = hb(AgentPhase::Bootstrapping, 3);
        assert!(!is_quiet(&m, &now));
        assert!(record_on_machine(&mut after, &now, t0()));
        assert_eq!(after.status.phase, MachinePhase::Bootstrapping);
        assert_eq!(after.status.last_heartbeat_time, Some(t0()));
        assert_eq!(after.status.events.last().unwrap().reason, "Bootstrapping");
    }

    #[test]
    fn a_running_control_plane_is_asked_for_its_clusters_operations_and_their_results_recorded() {
        let m = machine(MachinePhase::Running, Some(1));
        let mut c = cluster_draining(t0());
        let id = c.status.drain.as_ref().unwrap().directive_id();
        assert!(reads_cluster(&m));
        let asked = answer(&m, Some(&c), None, t0(), 1);
        assert_eq!(asked.directives.len(), 1);
        assert_eq!(asked.directives[0].id, id);
        assert!(matches!(
            &asked.directives[0].action,
            DirectiveAction::DrainNode { node, .. } if node == "node-leaving"
        ));
        assert!(!asks_uncordon(&asked));
        // Another incarnation of the cluster asks nothing.
        let mut other = c.clone();
        other.metadata.uid = Some("u2".into());
        assert!(answer(&m, Some(&other), None, t0(), 1)
            .directives
            .is_empty());

        // The result is recorded once, and then asks nothing more.
        let mut beat = hb(AgentPhase::Running, 1);
        beat.directive_results = vec![result(&id, false, "pdb blocks")];
        assert!(touches_cluster(&m, &beat));
        let record = record_on_cluster(&mut c, &m, &beat, t0());
        assert_eq!(
            record.reported,
            [Reported::Drain {
                leaving: "leaving".into(),
                node: "node-leaving".into(),
                ok: false,
                message: "pdb blocks".into(),
            }]
        );
        assert!(record.wakes());
        assert!(!c.status.drain.as_ref().unwrap().result.as_ref().unwrap().ok);
        assert!(answer(&m, Some(&c), None, t0(), 1).directives.is_empty());
        let again = c.clone();
        assert_eq!(
            record_on_cluster(&mut c, &m, &beat, t0()),
            ClusterRecord::default()
        );
        assert_eq!(c, again);
    }

    #[test]
    fn a_result_for_an_operation_no_longer_current_changes_nothing() {
        let m = machine(MachinePhase::Running, Some(1));
        // The planner asked again since: the old attempt's result is late.
        let old = cluster_draining(t0()).status.drain.unwrap().directive_id();
        let mut c = cluster_draining(t0() + time::Duration::seconds(30));
        let mut beat = hb(AgentPhase::Running, 1);
        beat.directive_results = vec![result(&old, true, "drained")];
        let before = c.clone();
        assert_eq!(
            record_on_cluster(&mut c, &m, &beat, t0()),
            ClusterRecord::default()
        );
        assert_eq!(c, before);
        // So does a result from a machine the drain was not asked of.
        let mut stranger = m.clone();
        stranger.metadata.name = "other".into();
        let current = c.status.drain.as_ref().unwrap().directive_id();
        beat.directive_results = vec![result(&current, true, "drained")];
        assert_eq!(
            record_on_cluster(&mut c, &stranger, &beat, t0()),
            ClusterRecord::default()
        );
        assert_eq!(c, before);
        // And an in-place upgrade step, once its result is in.
        c.status.machine_upgrade = Some(MachineUpgrade {
            machine: "worker".into(),
            node: "node-w".into(),
            version: "v1.32.0".into(),
            command: UpgradeCommand::Node,
            step: MachineUpgradeStep::Uncordon,
            started_at: t0(),
            requested_at: t0(),
            via: "m".into(),
            result: None,
        });
        assert!(asks_uncordon(&answer(&m, Some(&c), None, t0(), 1)));
        let uncordon = c.status.machine_upgrade.as_ref().unwrap().directive_id();
        beat.directive_results = vec![result(&uncordon, true, "")];
        let record = record_on_cluster(&mut c, &m, &beat, t0());
        assert_eq!(record.reported.len(), 1);
        assert!(!asks_uncordon(&answer(&m, Some(&c), None, t0(), 1)));
        assert!(record_on_cluster(&mut c, &m, &beat, t0())
            .reported
            .is_empty());
    }

    #[test]
    fn only_the_registrar_activates_a_join_token() {
        use crate::domain::jointokens::{JoinToken, TokenState};
        let token = drover_common::token::BootstrapToken::generate();
        let mut tokens = ClusterJoinTokens {
            cluster_uid: "u".into(),
            tokens: vec![JoinToken {
                token: token.clone(),
                state: TokenState::Pending,
                created_at: t0(),
                expires_at: t0() + time::Duration::minutes(30),
                registrar: Some("cp-uid".into()),
                init_for: None,
            }],
        };
        let mut cp = machine(MachinePhase::Running, Some(1));
        cp.metadata.uid = Some("cp-uid".into());
        let asked = answer(&cp, None, Some(&tokens), t0(), 1);
        assert_eq!(asked.directives.len(), 1);
        assert_eq!(asked.directives[0].id, directive_id(&token));
        let mut beat = hb(AgentPhase::Running, 1);
        beat.directive_results = vec![result(&directive_id(&token), true, "")];
        let results = token_results(&cp, &beat);
        assert_eq!(results.len(), 1);
        // Another machine's word changes nothing.
        assert_eq!(
            activate_tokens(&mut tokens, &results, "worker-uid"),
            Activation {
                changed: false,
                ignored: vec![directive_id(&token)],
            }
        );
        assert_eq!(tokens.tokens[0].state, TokenState::Pending);
        assert!(activate_tokens(&mut tokens, &results, "cp-uid").changed);
        assert_eq!(tokens.tokens[0].state, TokenState::Active);
        assert!(answer(&cp, None, Some(&tokens), t0(), 1)
            .directives
            .is_empty());
        // A machine without an assignment reports no token of a cluster.
        assert!(token_results(&machine(MachinePhase::Registered, None), &beat).is_empty());
    }

    #[test]
    fn a_releasing_machine_is_asked_to_reset_and_a_deleted_one_nothing() {
        let m = machine(MachinePhase::Releasing, Some(4));
        let a = answer(&m, None, None, t0(), 1);
        assert_eq!(a.assignment, None);
        assert_eq!(a.directives.len(), 1);
        assert_eq!(a.directives[0].id, "reset-g4");
        let gone = machine(MachinePhase::Deleted, Some(4));
        let a = answer(&gone, None, None, t0(), 1);
        assert_eq!((&a.assignment, a.directives.len()), (&None, 0));
        let mut offered = hb(AgentPhase::Waiting, 0);
        offered.datagrams = true;
        assert!(may_offer_datagrams(&offered, &a));
        assert!(!may_offer_datagrams(
            &offered,
            &answer(&m, None, None, t0(), 1)
        ));
    }
}
