//! Machine health as the remediation loop judges it. Pure functions of the
//! machine, the time, its last heartbeat and what its provider reports.

use std::time::Duration;

use drover_common::api::{parse_duration, parse_percent, Cluster, Machine, MachinePhase};
use time::OffsetDateTime;

use crate::provider::InstanceState;

/// The condition type the heartbeat handler keeps on machines.
pub const HEALTHY_CONDITION: &str = "Healthy";

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

    /// How many machines of a pool of `desired` may be unhealthy and still
    /// be remediated (rounded up, as Cluster API does).
    pub fn max_unhealthy(&self, desired: u32) -> u32 {
        (desired * self.max_unhealthy_percent).div_ceil(100)
    }
}

/// Why a machine is unhealthy, or `None` when it is not.
pub fn unhealthy_reason(
    m: &Machine,
    now: OffsetDateTime,
    last_seen: Option<OffsetDateTime>,
    instance: Option<InstanceState>,
    policy: &Policy,
) -> Option<String> {
    use MachinePhase::*;
    if matches!(m.status.phase, Deleting | Deleted | Releasing) {
        return None;
    }
    if instance == Some(InstanceState::Stopped) {
        return Some("its provider reports it stopped".into());
    }
    let age = m
        .metadata
        .creation_timestamp
        .map(|t| now - t)
        .unwrap_or(time::Duration::ZERO);
    if m.status.phase != Running && age > policy.startup_timeout {
        return Some(format!(
            "not Running {}s after creation (startup timeout; phase {})",
            policy.startup_timeout.as_secs(),
            m.status.phase
        ));
    }
    let registered = m.status.ticket_redeemed || m.status.phase != Provisioning;
    if registered {
        if let Some(seen) = last_seen {
            let silence = now - seen;
            if silence > policy.heartbeat_timeout {
                return Some(format!(
                    "no heartbeat for {}s (heartbeat timeout {}s)",
                    silence.whole_seconds(),
                    policy.heartbeat_timeout.as_secs()
                ));
            }
        }
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
                return Some(format!(
                    "reported unhealthy for {}s ({}: {}), longer than the unhealthy timeout {}s",
                    since.whole_seconds(),
                    c.reason,
                    c.message,
                    policy.unhealthy_timeout.as_secs()
                ));
            }
        }
    }
    None
}

/// etcd quorum of `members`.
pub fn quorum(members: u32) -> u32 {
    members / 2 + 1
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn max_unhealthy_rounds_up() {
        let p = policy();
        assert_eq!(p.max_unhealthy(2), 1);
        assert_eq!(p.max_unhealthy(3), 2);
        assert_eq!(p.max_unhealthy(5), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(1), 1);
    }
}
