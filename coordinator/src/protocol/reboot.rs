//! Reboots remediation asks of unhealthy machines: the request the
//! reconciler records on the machine (`status.reboot`), the directive its
//! heartbeat answers carry until its agent says it asked the init system,
//! and how the machine's own reports end it: a failed result refuses it, a
//! report with another boot ID than the one the machine had when asked
//! says it came back.
//!
//! Invariant: a reboot is done only when the machine reports a boot ID
//! other than the one it had when asked; a directive result says only that
//! the reboot was asked for.

use drover_common::api::{push_event, Machine, RebootMethod, RebootRequest, REBOOT_PREFIX};
use drover_common::wire::{Directive, DirectiveAction, HeartbeatRequest};
use time::OffsetDateTime;

/// A new reboot request for `m` by `method`, numbered after its last one.
pub fn request(
    m: &Machine,
    reason: &str,
    method: RebootMethod,
    now: OffsetDateTime,
) -> RebootRequest {
    let n = m
        .status
        .reboot
        .as_ref()
        .and_then(|r| r.id.strip_prefix(REBOOT_PREFIX))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    RebootRequest {
        id: format!("{REBOOT_PREFIX}{}", n + 1),
        reason: reason.to_owned(),
        requested_at: now,
        boot_id: m.status.health.as_ref().and_then(|h| h.boot_id.clone()),
        started_at: None,
        completed_at: None,
        failed: None,
        method,
    }
}

/// The reboot directive for `m`, while its request is under way and its
/// agent has not answered it. A power cycle has none: the BMC does it.
pub fn directive(m: &Machine) -> Option<Directive> {
    // Once asked (a result came), the machine's boot ID tells the rest.
    let r =
        m.status.reboot.as_ref().filter(|r| {
            r.in_progress() && r.started_at.is_none() && r.method == RebootMethod::Agent
        })?;
    Some(Directive {
        id: r.id.clone(),
        action: DirectiveAction::Reboot {
            reason: r.reason.clone(),
        },
    })
}

/// Folds a heartbeat into `m`'s reboot under way: its directive's result,
/// and a boot ID other than the one it had when asked. Whether anything
/// changed.
pub fn record(m: &mut Machine, hb: &HeartbeatRequest, now: OffsetDateTime) -> bool {
    let Some(r) = m.status.reboot.as_mut().filter(|r| r.in_progress()) else {
        return false;
    };
    let id = r.id.clone();
    let mut events = vec![];
    let asked_of_agent = r.method == RebootMethod::Agent;
    if let Some(result) = hb
        .directive_results
        .iter()
        .find(|d| asked_of_agent && d.id == id)
    {
        if result.ok && r.started_at.is_none() {
            r.started_at = Some(now);
            let started = format!(
                "{} ({id})",
                non_empty(&result.message, "reboot asked of the init system")
            );
            events.push(("RebootStarted", started));
        } else if !result.ok {
            r.failed = Some(non_empty(&result.message, "the agent could not reboot").to_owned());
            events.push((
                "RebootFailed",
                format!("{} ({id})", r.failed.as_deref().unwrap_or_default()),
            ));
        }
    }
    let boot = hb.health.boot_id.as_deref();
    if r.failed.is_none() && boot.is_some() && boot != r.boot_id.as_deref() {
        r.completed_at = Some(now);
        events.push((
            "Rebooted",
            format!(
                "back with boot ID {} after {}s ({id}{})",
                boot.unwrap_or_default(),
                (now - r.requested_at).whole_seconds(),
                if asked_of_agent { "" } else { ", power cycle" }
            ),
        ));
    }
    let changed = !events.is_empty();
    for (reason, message) in events {
        push_event(&mut m.status.events, reason, message);
    }
    changed
}

fn non_empty<'a>(s: &'a str, or: &'a str) -> &'a str {
    if s.is_empty() {
        or
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::wire::{DirectiveResult, HealthReport};

    fn machine_with_boot(boot: &str) -> Machine {
        let mut m: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": drover_common::API_VERSION,
            "kind": "Machine",
            "metadata": {"name": "m"},
            "spec": {},
            "status": {"phase": "Running"},
        }))
        .unwrap();
        m.status.health = Some(HealthReport {
            boot_id: Some(boot.into()),
            ..Default::default()
        });
        m
    }

    fn heartbeat(boot: &str, results: Vec<DirectiveResult>) -> HeartbeatRequest {
        let mut hb: HeartbeatRequest = serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "appliedGeneration": 1,
            "health": {"kubelet": {"state": "Healthy"}},
        }))
        .unwrap();
        hb.health.boot_id = Some(boot.into());
        hb.directive_results = results;
        hb
    }

    #[test]
    fn a_reboot_is_asked_until_answered_and_done_only_at_a_new_boot_id() {
        let now = drover_common::now();
        let mut m = machine_with_boot("boot-a");
        let r = request(&m, "unhealthy: x", RebootMethod::Agent, now);
        assert_eq!(r.id, "reboot-1");
        assert_eq!(r.boot_id.as_deref(), Some("boot-a"));
        m.status.reboot = Some(r);
        let d = directive(&m).expect("the directive is carried");
        assert_eq!(d.id, "reboot-1");
        // A heartbeat before the agent acted changes nothing.
        assert!(!record(&mut m, &heartbeat("boot-a", vec![]), now));
        // The agent asked the init system: no more directive, not done.
        let ok = DirectiveResult {
            id: "reboot-1".into(),
            ok: true,
            message: "systemctl reboot".into(),
        };
        assert!(record(&mut m, &heartbeat("boot-a", vec![ok.clone()]), now));
        assert!(directive(&m).is_none());
        assert!(m.status.reboot.as_ref().unwrap().in_progress());
        // The same result again adds no second event.
        let events = m.status.events.len();
        record(&mut m, &heartbeat("boot-a", vec![ok]), now);
        assert_eq!(m.status.events.len(), events);
        // Back with another boot ID: done.
        let later = now + time::Duration::seconds(90);
        assert!(record(&mut m, &heartbeat("boot-b", vec![]), later));
        let r = m.status.reboot.as_ref().unwrap();
        assert_eq!(r.completed_at, Some(later));
        assert!(m
            .status
            .events
            .iter()
            .any(|e| e.reason == "Rebooted" && e.message.contains("boot-b after 90s")));
        // The next request is numbered after it.
        assert_eq!(
            request(&m, "again", RebootMethod::Agent, later).id,
            "reboot-2"
        );
    }

    #[test]
    fn a_refused_reboot_is_recorded_with_the_agents_words() {
        let now = drover_common::now();
        let mut m = machine_with_boot("boot-a");
        m.status.reboot = Some(request(&m, "unhealthy: x", RebootMethod::Agent, now));
        let refused = DirectiveResult {
            id: "reboot-1".into(),
            ok: false,
            message: "systemctl reboot: exit status 1".into(),
        };
        assert!(record(&mut m, &heartbeat("boot-a", vec![refused]), now));
        let r = m.status.reboot.as_ref().unwrap();
        assert_eq!(r.failed.as_deref(), Some("systemctl reboot: exit status 1"));
        assert!(!r.in_progress() && directive(&m).is_none());
        // A later boot ID does not turn a refusal into a reboot.
        assert!(!record(&mut m, &heartbeat("boot-b", vec![]), now));
    }

    #[test]
    fn a_power_cycle_carries_no_directive_and_ends_at_a_new_boot_id() {
        let now = drover_common::now();
        let mut m = machine_with_boot("boot-a");
        m.status.reboot = Some(request(&m, "silent", RebootMethod::PowerCycle, now));
        assert!(directive(&m).is_none(), "the BMC does it, not the agent");
        // A result with its id (an old agent's, a forgery) changes nothing.
        let result = DirectiveResult {
            id: "reboot-1".into(),
            ok: false,
            message: "no".into(),
        };
        assert!(!record(&mut m, &heartbeat("boot-a", vec![result]), now));
        let later = now + time::Duration::seconds(40);
        assert!(record(&mut m, &heartbeat("boot-b", vec![]), later));
        let r = m.status.reboot.as_ref().unwrap();
        assert_eq!((r.completed_at, r.failed.as_deref()), (Some(later), None));
        assert!(m
            .status
            .events
            .iter()
            .any(|e| e.reason == "Rebooted" && e.message.ends_with("(reboot-1, power cycle)")));
    }
}
