//! Machine health as the remediation loop judges it. Pure functions of the
//! machine, the time, its last heartbeat and what its provider reports:
//! [`Policy`] (the timeouts and `maxUnhealthy`), [`check`] and
//! [`node_not_ready`] (whether one machine is unhealthy, [`Unhealthy`]),
//! [`silence`] and [`is_late`], [`decide`] (remediation over a whole pool)
//! and etcd quorum. Below the planners: it imports only
//! [`crate::instance`]. The coordinator's removal rule and metrics use it
//! too.

use std::time::Duration;

use drover_common::api::{
    parse_duration, parse_percent, Cluster, EtcdMember, Machine, MachinePhase,
};
use time::OffsetDateTime;

use crate::instance::InstanceState;
pub use drover_common::api::ALIVE_CONDITION;

/// The condition type the heartbeat handler keeps on machines.
pub const HEALTHY_CONDITION: &str = "Healthy";

/// The condition type the planner sets False on a Running machine whose
/// Node the cluster's API server no longer lists (True again once it
/// does); a machine whose Node was always listed carries none.
pub const NODE_FOUND_CONDITION: &str = "NodeFound";

/// Effective health settings of one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub heartbeat_timeout: Duration,
    pub startup_timeout: Duration,
    pub unhealthy_timeout: Duration,
    /// Percent of a pool that may be unhealthy before remediation pauses.
    pub max_unhealthy_percent: u32,
}

impl Policy {
    /// DESIGN.md's defaults with a heartbeat timeout from the coordinator.
    pub fn defaults(heartbeat_timeout: Duration) -> Self {
        Self {
            heartbeat_timeout,
            startup_timeout: Duration::from_secs(600),
            unhealthy_timeout: Duration::from_secs(120),
            max_unhealthy_percent: 40,
        }
    }

    /// The cluster's overrides applied to `defaults` (validated on apply).
    pub fn for_cluster(cluster: &Cluster, defaults: Policy) -> Self {
        let mut p = defaults;
        if let Some(h) = &cluster.spec.health {
            let d = |v: &Option<String>, fallback| {
                v.as_deref()
                    .and_then(|s| parse_duration(s).ok())
                    .unwrap_or(fallback)
            };
            p.heartbeat_timeout = d(&h.heartbeat_timeout, p.heartbeat_timeout);
            p.startup_timeout = d(&h.startup_timeout, p.startup_timeout);
            p.unhealthy_timeout = d(&h.unhealthy_timeout, p.unhealthy_timeout);
            if let Some(m) = h
                .max_unhealthy
                .as_deref()
                .and_then(|m| parse_percent(m).ok())
            {
                p.max_unhealthy_percent = m;
            }
        }
        p
    }

    /// How many machines of a pool of `desired` may be unhealthy (or being
    /// replaced) and still be remediated: the share rounded down, as
    /// Cluster API does, so that "more than maxUnhealthy unhealthy pauses"
    /// holds exactly (40 % of 3 allows 1; of 2 or 1, none).
    pub fn max_unhealthy(&self, desired: u32) -> u32 {
        desired * self.max_unhealthy_percent / 100
    }
}

/// Why a machine is unhealthy.
#[derive(Debug, Clone, PartialEq)]
pub enum Unhealthy {
    /// The provider reports the instance stopped.
    Stopped,
    /// Not Running within the startup timeout.
    NotStarted {
        phase: MachinePhase,
        timeout: Duration,
    },
    /// No heartbeat for longer than the heartbeat timeout.
    Silent {
        silence: time::Duration,
        timeout: Duration,
    },
    /// Its Node was not Ready for longer than the unhealthy timeout, as the
    /// cluster's API server says.
    NodeNotReady {
        ready: String,
        since: time::Duration,
        timeout: Duration,
    },
    /// Its Node has been missing from the cluster's Nodes for longer than
    /// the unhealthy timeout: a kubelet whose Node object was deleted (or
    /// was never in a restored etcd) does not register it again until it
    /// restarts.
    NodeMissing {
        since: time::Duration,
        timeout: Duration,
    },
    /// Its agent has reported a node problem its pool's remediation lists
    /// (`conditions`) for longer than the unhealthy timeout.
    Problem {
        type_: String,
        reason: String,
        since: time::Duration,
        timeout: Duration,
    },
    /// A probe reported failing for longer than the unhealthy timeout.
    Reported {
        since: time::Duration,
        reason: String,
        message: String,
        timeout: Duration,
    },
}

/// The class of a remediation whose reason reads `unhealthy: <why>`, `why`
/// an [`Unhealthy`]'s text: [`Unhealthy::class`] of it, or `other`.
pub fn remediation_class(reason: &str) -> &'static str {
    let why = reason.strip_prefix("unhealthy: ").unwrap_or(reason);
    [
        ("its provider reports it stopped", "stopped"),
        ("not Running ", "not_started"),
        ("no heartbeat ", "silent"),
        ("its Node has been Ready=", "node_not_ready"),
        ("its Node has been missing ", "node_missing"),
        ("reported unhealthy ", "reported"),
        ("it has reported node problem ", "problem"),
    ]
    .into_iter()
    .find(|(prefix, _)| why.starts_with(prefix))
    .map_or("other", |(_, class)| class)
}

impl Unhealthy {
    /// A metric label for this state: stopped, not_started, silent,
    /// node_not_ready, node_missing or reported.
    pub fn class(&self) -> &'static str {
        match self {
            Unhealthy::Stopped => "stopped",
            Unhealthy::NotStarted { .. } => "not_started",
            Unhealthy::Silent { .. } => "silent",
            Unhealthy::NodeNotReady { .. } => "node_not_ready",
            Unhealthy::NodeMissing { .. } => "node_missing",
            Unhealthy::Reported { .. } => "reported",
            Unhealthy::Problem { .. } => "problem",
        }
    }

    /// A few words that stay the same while the machine stays in this state
    /// (no ages), for status messages that must not change every pass.
    pub fn summary(&self) -> String {
        match self {
            Unhealthy::Stopped => "stopped".into(),
            Unhealthy::NotStarted { .. } => "not Running within the startup timeout".into(),
            Unhealthy::Silent { .. } => "silent".into(),
            Unhealthy::Reported { reason, .. } => format!("reports {reason}"),
            Unhealthy::NodeNotReady { ready, .. } => format!("Node Ready={ready}"),
            Unhealthy::NodeMissing { .. } => "Node missing".into(),
            Unhealthy::Problem { type_, .. } => format!("reports {type_}"),
        }
    }
}

impl std::fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unhealthy::Stopped => write!(f, "its provider reports it stopped"),
            Unhealthy::NotStarted { phase, timeout } => write!(
                f,
                "not Running {}s after creation (startup timeout; phase {phase})",
                timeout.as_secs()
            ),
            Unhealthy::Silent { silence, timeout } => write!(
                f,
                "no heartbeat for {}s (heartbeat timeout {}s)",
                silence.whole_seconds(),
                timeout.as_secs()
            ),
            Unhealthy::NodeNotReady {
                ready,
                since,
                timeout,
            } => write!(
                f,
                "its Node has been Ready={ready} for {}s, longer than the unhealthy timeout {}s",
                since.whole_seconds(),
                timeout.as_secs()
            ),
            Unhealthy::NodeMissing { since, timeout } => write!(
                f,
                "its Node has been missing from the cluster for {}s, longer than the unhealthy timeout {}s (a kubelet registers its Node only when it starts)",
                since.whole_seconds(),
                timeout.as_secs()
            ),
            Unhealthy::Problem {
                type_,
                reason,
                since,
                timeout,
            } => write!(
                f,
                "it has reported node problem {type_} ({reason}) for {}s, longer than the unhealthy timeout {}s",
                since.whole_seconds(),
                timeout.as_secs()
            ),
            Unhealthy::Reported {
                since,
                reason,
                message,
                timeout,
            } => write!(
                f,
                "reported unhealthy for {}s ({reason}: {message}), longer than the unhealthy timeout {}s",
                since.whole_seconds(),
                timeout.as_secs()
            ),
        }
    }
}

/// Whether a machine is unhealthy, and why.
pub fn check(
    m: &Machine,
    now: OffsetDateTime,
    last_seen: Option<OffsetDateTime>,
    instance: Option<InstanceState>,
    policy: &Policy,
) -> Option<Unhealthy> {
    use MachinePhase::*;
    if matches!(m.status.phase, Deleting | Deleted | Releasing) {
        return None;
    }
    if instance == Some(InstanceState::Stopped) {
        return Some(Unhealthy::Stopped);
    }
    // A pool machine may have waited in its pool long before it was
    // claimed: its startup runs from the assignment.
    let started = m
        .spec
        .assignment
        .as_ref()
        .and_then(|a| a.assigned_at)
        .or(m.metadata.creation_timestamp);
    let age = started.map(|t| now - t).unwrap_or(time::Duration::ZERO);
    if m.status.phase != Running && age > policy.startup_timeout {
        return Some(Unhealthy::NotStarted {
            phase: m.status.phase,
            timeout: policy.startup_timeout,
        });
    }
    if let Some(silence) = silence(m, now, last_seen, policy) {
        return Some(Unhealthy::Silent {
            silence,
            timeout: policy.heartbeat_timeout,
        });
    }
    if m.status.phase == Running {
        if let Some(c) = m
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == HEALTHY_CONDITION && c.status == "False")
        {
            let since = now - c.last_transition_time;
            if since > policy.unhealthy_timeout {
                return Some(Unhealthy::Reported {
                    since,
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    timeout: policy.unhealthy_timeout,
                });
            }
        }
    }
    None
}

/// Whether a Running machine's Node has not been Ready for longer than the
/// unhealthy timeout.
pub fn node_not_ready(
    m: &Machine,
    node: Option<&drover_common::api::ClusterNode>,
    now: OffsetDateTime,
    policy: &Policy,
) -> Option<Unhealthy> {
    let node = node?;
    // A cluster without a pod network leaves every Node NotReady; a new
    // machine would be no better, so that is not the machine's fault.
    if m.status.phase != MachinePhase::Running || node.ready == "True" || node.network_not_ready() {
        return None;
    }
    let since = now - node.since?;
    (since > policy.unhealthy_timeout).then(|| Unhealthy::NodeNotReady {
        ready: node.ready.clone(),
        since,
        timeout: policy.unhealthy_timeout,
    })
}

/// Whether a Running machine's Node has been missing from the cluster for
/// longer than the unhealthy timeout, as its [`NODE_FOUND_CONDITION`]
/// says. Cluster API's MachineHealthCheck remediates a machine whose Node
/// went missing too (`machinehealthcheck_targets.go`, `nodeMissing`); here
/// it waits the unhealthy timeout, since the condition is set from a Node
/// list that a control plane reports some seconds after a machine joins.
pub fn node_missing(m: &Machine, now: OffsetDateTime, policy: &Policy) -> Option<Unhealthy> {
    if m.status.phase != MachinePhase::Running {
        return None;
    }
    let c = m
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == NODE_FOUND_CONDITION && c.status == "False")?;
    let since = now - c.last_transition_time;
    (since > policy.unhealthy_timeout).then_some(Unhealthy::NodeMissing {
        since,
        timeout: policy.unhealthy_timeout,
    })
}

/// Whether a Running machine has reported one of `conditions` (node
/// problem types its pool's remediation lists) for longer than the
/// unhealthy timeout; the one reported longest when several are.
pub fn problem(
    m: &Machine,
    conditions: &[String],
    now: OffsetDateTime,
    policy: &Policy,
) -> Option<Unhealthy> {
    if m.status.phase != MachinePhase::Running {
        return None;
    }
    m.status
        .conditions
        .iter()
        .filter(|c| c.status == "True" && conditions.contains(&c.type_))
        .min_by_key(|c| c.last_transition_time)
        .map(|c| (c, now - c.last_transition_time))
        .filter(|(_, since)| *since > policy.unhealthy_timeout)
        .map(|(c, since)| Unhealthy::Problem {
            type_: c.type_.clone(),
            reason: c.reason.clone(),
            since,
            timeout: policy.unhealthy_timeout,
        })
}

/// When what makes a machine unhealthy began, as far as its record says:
/// the reboot remediation asks for counts against this episode only when
/// it was asked after this. `None` when it cannot be told (a stopped
/// instance).
pub fn unhealthy_since(
    why: &Unhealthy,
    m: &Machine,
    now: OffsetDateTime,
    last_seen: Option<OffsetDateTime>,
) -> Option<OffsetDateTime> {
    match why {
        Unhealthy::Stopped => None,
        Unhealthy::NotStarted { .. } => m
            .spec
            .assignment
            .as_ref()
            .and_then(|a| a.assigned_at)
            .or(m.metadata.creation_timestamp),
        Unhealthy::Silent { .. } => last_seen,
        Unhealthy::NodeNotReady { since, .. }
        | Unhealthy::NodeMissing { since, .. }
        | Unhealthy::Reported { since, .. }
        | Unhealthy::Problem { since, .. } => Some(now - *since),
    }
}

/// How long a registered machine may be silent before it counts as *late*
/// (it has missed heartbeats but is not yet past its timeout): two heartbeat
/// intervals, but no more than the timeout less one interval, and at least
/// one and a half intervals (so one slow beat is not late).
///
/// Machines cut off together cross their deadlines up to one interval
/// apart, plus however long the cut itself took. When the first of them is
/// past its timeout, the others have been silent for at least the timeout
/// less that spread, so they are late by then and all of them count against
/// `maxUnhealthy` in the same pass. With the defaults (40 s timeout, 10 s
/// beats) a machine is late after 20 s, which covers cuts spread over 20 s,
/// and replacement is never delayed beyond the timeout itself. Counting a
/// machine late too eagerly only pauses remediation; it never replaces one.
pub fn late_after(policy: &Policy, heartbeat_interval: Duration) -> Duration {
    (heartbeat_interval * 2)
        .min(policy.heartbeat_timeout.saturating_sub(heartbeat_interval))
        .max(heartbeat_interval * 3 / 2)
        .min(policy.heartbeat_timeout)
}

/// Whether a registered machine has missed heartbeats for longer than
/// [`late_after`] (it may also be past its timeout).
pub fn is_late(
    m: &Machine,
    now: OffsetDateTime,
    last_seen: Option<OffsetDateTime>,
    policy: &Policy,
    heartbeat_interval: Duration,
) -> bool {
    let Some(seen) = last_seen else { return false };
    let registered = m.status.ticket_redeemed || m.status.phase != MachinePhase::Provisioning;
    registered && now - seen > late_after(policy, heartbeat_interval)
}

/// How long a registered machine has been silent, when that is longer than
/// the heartbeat timeout.
pub fn silence(
    m: &Machine,
    now: OffsetDateTime,
    last_seen: Option<OffsetDateTime>,
    policy: &Policy,
) -> Option<time::Duration> {
    let registered = m.status.ticket_redeemed || m.status.phase != MachinePhase::Provisioning;
    let silence = now - last_seen?;
    (registered && silence > policy.heartbeat_timeout).then_some(silence)
}

/// One pool as remediation sees it in one pass.
#[derive(Debug, Clone)]
pub struct PoolHealth<'a> {
    pub pool: &'a str,
    pub desired: u32,
    /// Members not being deleted.
    pub members: u32,
    /// Unhealthy members, by name.
    pub unhealthy: Vec<(&'a str, Unhealthy)>,
    /// Members that are not unhealthy yet but have missed heartbeats
    /// ([`is_late`]): they were most likely cut off together with a silent
    /// one, so they count against the limit before their own deadline.
    pub late: Vec<&'a str>,
    /// Slots of machines remediated earlier whose replacement is not
    /// Running yet: the replacement's name, or the remediated machine's
    /// while no replacement exists.
    pub in_flight: Vec<&'a str>,
}

/// What remediation may do for one pool.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Replace these unhealthy machines, by name.
    Remediate(Vec<String>),
    /// Too much of the pool is unhealthy or being replaced: replace nothing.
    /// The message names no ages, so it stays the same while nothing changes.
    Paused(String),
}

/// Decides over the whole pool: the unhealthy machines, the late ones and
/// the replacements still in flight count together against `maxUnhealthy`,
/// and more than it allows pauses remediation of the pool.
pub fn decide(pool: &PoolHealth<'_>, policy: &Policy) -> Decision {
    let total = pool.desired.max(pool.members);
    let allowed = policy.max_unhealthy(total);
    let bad = (pool.unhealthy.len() + pool.late.len() + pool.in_flight.len()) as u32;
    if bad > allowed {
        let what: Vec<String> = pool
            .unhealthy
            .iter()
            .map(|(n, u)| format!("{n} {}", u.summary()))
            .chain(pool.late.iter().map(|n| format!("{n} missing heartbeats")))
            .chain(pool.in_flight.iter().map(|n| format!("{n} being replaced")))
            .collect();
        return Decision::Paused(format!(
            "pool {}: {bad} of {total} machines are unhealthy or being replaced ({}), more than maxUnhealthy {}% allows ({allowed}); remediation paused",
            pool.pool,
            bounded_list(what, ", "),
            policy.max_unhealthy_percent
        ));
    }
    let mut names: Vec<String> = pool.unhealthy.iter().map(|(n, _)| n.to_string()).collect();
    names.sort();
    Decision::Remediate(names)
}

/// How many items a status message names before it only counts the rest.
pub const MESSAGE_ITEMS: usize = 10;

/// `items` sorted and joined with `sep`, the first [`MESSAGE_ITEMS`] named
/// and the rest counted, so a message about a large pool stays short.
pub fn bounded_list(mut items: Vec<String>, sep: &str) -> String {
    items.sort();
    let more = items.len().saturating_sub(MESSAGE_ITEMS);
    items.truncate(MESSAGE_ITEMS);
    let mut out = items.join(sep);
    if more > 0 {
        out.push_str(&format!("{sep}and {more} more"));
    }
    out
}

/// etcd quorum of `members`.
pub fn quorum(members: u32) -> u32 {
    members / 2 + 1
}

/// Whether one of `members` control-plane machines may be taken out while
/// `healthy_others` of the rest are healthy: at least one stays, and the
/// rest keeps etcd quorum of the smaller cluster.
pub fn quorum_allows_removal(members: u32, healthy_others: u32) -> bool {
    let after = members.saturating_sub(1);
    after > 0 && healthy_others >= quorum(after)
}

/// Whether etcd member `victim` may be removed from `members` as a control
/// plane reported them, counting voting members only (a learner, as
/// kubeadm 1.29+ adds a joining member, votes for nothing: etcd's
/// `isReadyToRemoveVotingMember` counts voters alike). A learner or a
/// member that is down may always go: removing it lowers no count of
/// healthy voters. A healthy voter goes only while the healthy voters left
/// keep quorum of the voters left.
pub fn member_removal_keeps_quorum(members: &[EtcdMember], victim: &EtcdMember) -> bool {
    if victim.is_learner || !victim.healthy {
        return true;
    }
    let voters = members.iter().filter(|m| !m.is_learner).count() as u32;
    let healthy_others = members
        .iter()
        .filter(|m| !m.is_learner && m.healthy && m.id != victim.id)
        .count() as u32;
    quorum_allows_removal(voters, healthy_others)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remediation_reason_gives_back_its_class() {
        let t = Duration::from_secs(40);
        for u in [
            Unhealthy::Stopped,
            Unhealthy::NotStarted {
                phase: MachinePhase::Bootstrapping,
                timeout: t,
            },
            Unhealthy::Silent {
                silence: time::Duration::seconds(50),
                timeout: t,
            },
            Unhealthy::NodeNotReady {
                ready: "False".into(),
                since: time::Duration::seconds(400),
                timeout: t,
            },
            Unhealthy::Reported {
                since: time::Duration::seconds(400),
                reason: "KubeletUnhealthy".into(),
                message: "connection refused".into(),
                timeout: t,
            },
        ] {
            assert_eq!(
                remediation_class(&format!("unhealthy: {u}")),
                u.class(),
                "{u}"
            );
        }
        assert_eq!(
            remediation_class("deletion requested by an operator"),
            "other"
        );
    }
    use drover_common::api::{set_condition, MachineSpec, MachineStatus, ObjectMeta};

    fn t0() -> OffsetDateTime {
        time::macros::datetime!(2026-01-01 00:00 UTC)
    }

    fn machine(phase: MachinePhase) -> Machine {
        Machine {
            api_version: drover_common::API_VERSION.into(),
            kind: "Machine".into(),
            metadata: ObjectMeta {
                name: "m".into(),
                creation_timestamp: Some(t0()),
                ..Default::default()
            },
            spec: MachineSpec::default(),
            status: MachineStatus {
                phase,
                ticket_redeemed: true,
                ..Default::default()
            },
        }
    }

    fn policy() -> Policy {
        Policy::defaults(Duration::from_secs(40))
    }

    fn unhealthy_reason(
        m: &Machine,
        now: OffsetDateTime,
        last_seen: Option<OffsetDateTime>,
        instance: Option<InstanceState>,
        policy: &Policy,
    ) -> Option<String> {
        check(m, now, last_seen, instance, policy).map(|u| u.to_string())
    }

    #[test]
    fn silence_beyond_heartbeat_timeout() {
        let m = machine(MachinePhase::Running);
        let now = t0() + time::Duration::seconds(100);
        assert_eq!(
            unhealthy_reason(
                &m,
                now,
                Some(now - time::Duration::seconds(30)),
                None,
                &policy()
            ),
            None
        );
        let r = unhealthy_reason(
            &m,
            now,
            Some(now - time::Duration::seconds(41)),
            None,
            &policy(),
        )
        .unwrap();
        assert!(r.contains("no heartbeat for 41s"), "{r}");
    }

    #[test]
    fn startup_timeout() {
        let mut m = machine(MachinePhase::Provisioning);
        m.status.ticket_redeemed = false;
        assert_eq!(
            unhealthy_reason(&m, t0() + time::Duration::minutes(9), None, None, &policy()),
            None
        );
        assert!(unhealthy_reason(
            &m,
            t0() + time::Duration::minutes(11),
            None,
            None,
            &policy()
        )
        .is_some());
    }

    #[test]
    fn reported_unhealthy_after_timeout() {
        let mut m = machine(MachinePhase::Running);
        set_condition(
            &mut m.status.conditions,
            HEALTHY_CONDITION,
            false,
            "KubeletUnhealthy",
            "HTTP 500",
        );
        let since = m.status.conditions[0].last_transition_time;
        let seen = Some(since + time::Duration::seconds(119));
        assert_eq!(
            unhealthy_reason(
                &m,
                since + time::Duration::seconds(119),
                seen,
                None,
                &policy()
            ),
            None
        );
        let seen = Some(since + time::Duration::seconds(121));
        assert!(unhealthy_reason(
            &m,
            since + time::Duration::seconds(121),
            seen,
            None,
            &policy()
        )
        .is_some());
    }

    #[test]
    fn stopped_instance_is_unhealthy_at_once() {
        let m = machine(MachinePhase::Running);
        assert!(unhealthy_reason(
            &m,
            t0(),
            Some(t0()),
            Some(InstanceState::Stopped),
            &policy()
        )
        .is_some());
    }

    #[test]
    fn max_unhealthy_rounds_the_allowance_down() {
        let p = policy();
        // "More than 40 % unhealthy pauses": 1 of 3 (33 %) may be replaced,
        // 1 of 2 (50 %) may not.
        assert_eq!(p.max_unhealthy(1), 0);
        assert_eq!(p.max_unhealthy(2), 0);
        assert_eq!(p.max_unhealthy(3), 1);
        assert_eq!(p.max_unhealthy(5), 2);
        assert_eq!(p.max_unhealthy(10), 4);
        let all = Policy {
            max_unhealthy_percent: 100,
            ..p
        };
        assert_eq!(all.max_unhealthy(1), 1);
        let none = Policy {
            max_unhealthy_percent: 0,
            ..p
        };
        assert_eq!(none.max_unhealthy(10), 0);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(1), 1);
    }

    fn member(id: &str, healthy: bool, is_learner: bool) -> EtcdMember {
        EtcdMember {
            id: id.into(),
            name: format!("cp-{id}"),
            peer_urls: vec![],
            client_urls: vec![],
            started: true,
            healthy,
            is_learner,
        }
    }

    #[test]
    fn etcd_quorum_counts_voting_members_only() {
        // Two healthy voters, one voter down and a healthy learner: four
        // members, three healthy, but only three vote and two of them are
        // up. Taking a healthy voter out leaves one healthy of two voters:
        // below quorum, whatever the learner says.
        let members = vec![
            member("1", true, false),
            member("2", true, false),
            member("3", false, false),
            member("4", true, true),
        ];
        assert!(!member_removal_keeps_quorum(&members, &members[0]));
        // The learner and the member that is down may go.
        assert!(member_removal_keeps_quorum(&members, &members[3]));
        assert!(member_removal_keeps_quorum(&members, &members[2]));
        // Three healthy voters and a learner: one voter may go.
        let members = vec![
            member("1", true, false),
            member("2", true, false),
            member("3", true, false),
            member("4", true, true),
        ];
        assert!(member_removal_keeps_quorum(&members, &members[0]));
        // A lone voter with its learner is never removed.
        let members = vec![member("1", true, false), member("2", true, true)];
        assert!(!member_removal_keeps_quorum(&members, &members[0]));
    }

    /// Pool `default` of `members` machines, all desired, with `unhealthy`.
    fn pool_of(members: u32, unhealthy: Vec<(&str, Unhealthy)>) -> PoolHealth<'_> {
        PoolHealth {
            pool: "default",
            desired: members,
            members,
            unhealthy,
            late: vec![],
            in_flight: vec![],
        }
    }

    /// Why remediation of `pool` pauses at the default policy.
    fn paused(pool: &PoolHealth) -> String {
        match decide(pool, &policy()) {
            Decision::Paused(msg) => msg,
            other => panic!("remediation must pause, got {other:?}"),
        }
    }

    fn silent_for(secs: i64) -> Unhealthy {
        Unhealthy::Silent {
            silence: time::Duration::seconds(secs),
            timeout: Duration::from_secs(10),
        }
    }

    #[test]
    fn one_unhealthy_of_three_is_replaced_at_its_timeout() {
        let pool = |u: Unhealthy| pool_of(3, vec![("w1", u)]);
        assert_eq!(
            decide(&pool(Unhealthy::Stopped), &policy()),
            Decision::Remediate(vec!["w1".into()])
        );
        // Just past the timeout, with no other machine late: no delay.
        assert_eq!(
            decide(&pool(silent_for(11)), &policy()),
            Decision::Remediate(vec!["w1".into()])
        );
    }

    #[test]
    fn a_late_machine_counts_before_its_own_deadline() {
        // w1 and w2 were cut off together; w1's deadline expired first, and
        // w2 has missed heartbeats but is not past its timeout yet.
        let unhealthy = vec![("w1", silent_for(11))];
        assert_eq!(
            paused(&PoolHealth {
                late: vec!["w2"],
                ..pool_of(3, unhealthy)
            }),
            "pool default: 2 of 3 machines are unhealthy or being replaced (w1 silent, w2 missing heartbeats), more than maxUnhealthy 40% allows (1); remediation paused"
        );
    }

    #[test]
    fn late_means_missed_beats_that_machines_cut_off_together_all_show() {
        let interval = Duration::from_secs(10);
        // Defaults: 40 s timeout, 10 s beats: late after two missed beats.
        assert_eq!(late_after(&policy(), interval), Duration::from_secs(20));
        // Never more than the timeout less a beat, never less than one and
        // a half beats, never more than the timeout.
        let short = Policy::defaults(Duration::from_secs(25));
        assert_eq!(late_after(&short, interval), Duration::from_secs(15));
        let tight = Policy::defaults(Duration::from_secs(20));
        assert_eq!(late_after(&tight, interval), Duration::from_secs(15));
        let odd = Policy::defaults(Duration::from_secs(5));
        assert_eq!(late_after(&odd, interval), Duration::from_secs(5));
        // Two machines whose last beats were up to one interval apart: when
        // the first is past its timeout, the second is late.
        let m = machine(MachinePhase::Running);
        let now = OffsetDateTime::now_utc();
        let first_seen = now - time::Duration::seconds(41);
        let second_seen = first_seen + time::Duration::seconds(10);
        let p = policy();
        assert!(silence(&m, now, Some(first_seen), &p).is_some());
        assert!(silence(&m, now, Some(second_seen), &p).is_none());
        assert!(is_late(&m, now, Some(second_seen), &p, interval));
        // A machine that beat one interval ago is not late.
        let fresh = now - time::Duration::seconds(11);
        assert!(!is_late(&m, now, Some(fresh), &p, interval));
    }

    #[test]
    fn two_of_three_silent_pause_and_the_message_names_no_age() {
        let pool = pool_of(3, vec![("w1", silent_for(13)), ("w2", silent_for(11))]);
        let msg = paused(&pool);
        assert_eq!(
            msg,
            "pool default: 2 of 3 machines are unhealthy or being replaced (w1 silent, w2 silent), more than maxUnhealthy 40% allows (1); remediation paused"
        );
        // The message names no age: a later pass writes the same status.
        let later = PoolHealth {
            unhealthy: vec![("w1", silent_for(60)), ("w2", silent_for(58))],
            ..pool
        };
        assert_eq!(decide(&later, &policy()), Decision::Paused(msg));
    }

    #[test]
    fn replacements_not_yet_running_count_against_the_limit() {
        // w1 was replaced by r1, which is still starting; w2 now fails.
        let pool = PoolHealth {
            in_flight: vec!["r1"],
            ..pool_of(3, vec![("w2", silent_for(30))])
        };
        let msg = paused(&pool);
        assert!(msg.contains("r1 being replaced"), "{msg}");
        // With five machines two may be down at once.
        let five = PoolHealth {
            desired: 5,
            members: 5,
            ..pool
        };
        assert_eq!(
            decide(&five, &policy()),
            Decision::Remediate(vec!["w2".into()])
        );
        // A replacement in flight alone does not pause a pool of three.
        let alone = PoolHealth {
            in_flight: vec!["r1"],
            ..pool_of(3, vec![])
        };
        assert_eq!(decide(&alone, &policy()), Decision::Remediate(vec![]));
    }

    #[test]
    fn a_large_partition_names_ten_machines_and_counts_the_rest() {
        let names: Vec<String> = (0..25).map(|i| format!("w{i:02}")).collect();
        let pool = PoolHealth {
            pool: "big",
            ..pool_of(
                30,
                names.iter().map(|n| (n.as_str(), silent_for(30))).collect(),
            )
        };
        let msg = paused(&pool);
        assert!(
            msg.contains("(w00 silent, w01 silent, w02 silent, w03 silent, w04 silent, w05 silent, w06 silent, w07 silent, w08 silent, w09 silent, and 15 more)"),
            "{msg}"
        );
    }

    #[test]
    fn a_pool_of_two_is_not_remediated_at_the_default() {
        let pool = pool_of(2, vec![("w1", Unhealthy::Stopped)]);
        assert!(matches!(decide(&pool, &policy()), Decision::Paused(_)));
    }

    #[test]
    fn a_node_not_ready_past_the_unhealthy_timeout_is_unhealthy() {
        let policy = Policy::defaults(Duration::from_secs(40));
        let m = machine(MachinePhase::Running);
        let node = |ready: &str, ago: i64| drover_common::api::ClusterNode {
            message: String::new(),
            name: "m".into(),
            ready: ready.into(),
            since: Some(t0() - time::Duration::seconds(ago)),
            unschedulable: false,
            kubelet_version: String::new(),
        };
        assert_eq!(
            node_not_ready(&m, Some(&node("True", 600)), t0(), &policy),
            None
        );
        assert_eq!(
            node_not_ready(&m, Some(&node("Unknown", 60)), t0(), &policy),
            None
        );
        let u = node_not_ready(&m, Some(&node("Unknown", 600)), t0(), &policy).unwrap();
        assert_eq!(u.summary(), "Node Ready=Unknown");
        assert!(u.to_string().contains("600s"), "{u}");
        assert_eq!(node_not_ready(&m, None, t0(), &policy), None);
        // No pod network: every Node says so, and a new machine would too.
        let mut no_cni = node("False", 600);
        no_cni.message = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized".into();
        assert_eq!(node_not_ready(&m, Some(&no_cni), t0(), &policy), None);
    }
}
