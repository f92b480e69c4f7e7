//! Addons: which one is applied next and through which running control
//! plane, retries with back-off, and the conditions that say where they
//! stand. One addon at a time, in the spec's order: a later addon waits for
//! the ones before it (a network before what needs one).

use drover_common::api::{
    set_condition, AddonApply, AddonMode, AddonPhase, AddonStatus, Cluster, ClusterStatus,
    EffectiveAddon, Machine,
};
use time::{Duration, OffsetDateTime};

/// The condition that says whether every addon is applied.
pub const ADDONS_CONDITION: &str = "AddonsApplied";

/// How long a control plane may take to answer an apply before it is
/// asked again (counted as a failed attempt).
pub const ADDON_ANSWER_TIMEOUT: Duration = Duration::minutes(2);

/// The wait after the first failure; it doubles with each failure in a
/// row, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::seconds(5);
const MAX_BACKOFF: Duration = Duration::minutes(5);

/// The status of addon `name` before its first apply.
pub fn pending_addon(name: &str) -> AddonStatus {
    AddonStatus {
        name: name.to_owned(),
        phase: AddonPhase::Pending,
        hash: String::new(),
        applied_at: None,
        message: String::new(),
        failures: 0,
        last_attempt_at: None,
    }
}

/// The wait before an addon that failed `failures` times in a row is tried
/// again.
pub fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(10);
    (FIRST_BACKOFF * 2i32.pow(doublings)).min(MAX_BACKOFF)
}

/// Whether addon `spec` needs no apply, given its status.
fn done(mode: AddonMode, status: &AddonStatus, hash: &str) -> bool {
    status.phase == AddonPhase::Applied && (mode == AddonMode::ApplyOnce || status.hash == hash)
}

/// Brings `status.addons`, `status.addonApply` and the addon conditions up
/// to date for a pass at `now`. `via` are the cluster's running control
/// planes (an apply goes through the first); with none, nothing is asked.
pub(crate) fn apply_addons(
    status: &mut ClusterStatus,
    cluster: &Cluster,
    via: &[&Machine],
    now: OffsetDateTime,
) {
    let addons = cluster.spec.effective_addons();
    // One status per addon of the spec, in its order; an addon removed
    // from the spec is forgotten (what it applied stays in the cluster).
    status.addons = addons
        .iter()
        .map(|a| {
            status
                .addons
                .iter()
                .find(|s| s.name == a.name)
                .cloned()
                .unwrap_or_else(|| pending_addon(a.name))
        })
        .collect();
    // The request under way stands while its control plane runs, its
    // manifests are still the spec's and the answer is not overdue.
    if let Some(r) = status.addon_apply.take() {
        let current = addons
            .iter()
            .any(|a| a.name == r.addon && a.hash() == r.hash);
        let via_runs = via.iter().any(|m| m.metadata.name == r.via);
        let overdue = now - r.requested_at >= ADDON_ANSWER_TIMEOUT;
        if current && via_runs && !overdue {
            status.addon_apply = Some(r);
        } else if current && overdue {
            if let Some(s) = status.addons.iter_mut().find(|s| s.name == r.addon) {
                s.phase = AddonPhase::Failed;
                s.hash = r.hash.clone();
                s.failures += 1;
                s.last_attempt_at = Some(now);
                s.message = format!(
                    "{} did not answer within {} s",
                    r.via,
                    ADDON_ANSWER_TIMEOUT.whole_seconds()
                );
            }
        }
    }
    if status.addon_apply.is_none() {
        status.addon_apply = next_apply(status, &addons, via, now);
    }
    set_addon_conditions(status, &addons);
}

/// The next apply to ask for: the first addon (in order) not done, unless
/// it waits out its back-off.
fn next_apply(
    status: &ClusterStatus,
    addons: &[EffectiveAddon<'_>],
    via: &[&Machine],
    now: OffsetDateTime,
) -> Option<AddonApply> {
    let via = via
        .iter()
        .min_by(|a, b| a.metadata.name.cmp(&b.metadata.name))?;
    for (addon, s) in addons.iter().zip(&status.addons) {
        let hash = addon.hash();
        if done(addon.mode, s, &hash) {
            continue;
        }
        let waiting = s.phase == AddonPhase::Failed
            && s.hash == hash
            && s.last_attempt_at
                .is_some_and(|t| now < t + backoff(s.failures));
        if waiting {
            return None;
        }
        return Some(AddonApply {
            addon: addon.name.to_owned(),
            hash,
            via: via.metadata.name.clone(),
            requested_at: now,
        });
    }
    None
}

/// `AddonsApplied` (only while the spec lists addons), and `Ready` false
/// while an addon is not applied.
fn set_addon_conditions(status: &mut ClusterStatus, addons: &[EffectiveAddon<'_>]) {
    if addons.is_empty() {
        status.conditions.retain(|c| c.type_ != ADDONS_CONDITION);
        return;
    }
    let failed: Vec<String> = status
        .addons
        .iter()
        .filter(|s| s.phase == AddonPhase::Failed)
        .map(|s| {
            // An absolute time, so the message (and the stored status) does
            // not change from one pass to the next.
            let next = s
                .last_attempt_at
                .map(|t| t + backoff(s.failures))
                .and_then(|t| {
                    t.format(&time::format_description::well_known::Rfc3339)
                        .ok()
                })
                .unwrap_or_default();
            format!(
                "addon {} failed ({} attempts; next attempt at {next}): {}",
                s.name, s.failures, s.message
            )
        })
        .collect();
    let pending: Vec<&str> = addons
        .iter()
        .zip(&status.addons)
        .filter(|(a, s)| s.phase != AddonPhase::Failed && !done(a.mode, s, &a.hash()))
        .map(|(a, _)| a.name)
        .collect();
    let (ok, reason, message) = if !failed.is_empty() {
        (false, "AddonFailed", failed.join("; "))
    } else if !pending.is_empty() {
        (
            false,
            "AddonsPending",
            format!("not applied yet: {}", pending.join(", ")),
        )
    } else {
        (true, "AllApplied", String::new())
    };
    set_condition(
        &mut status.conditions,
        ADDONS_CONDITION,
        ok,
        reason,
        &message,
    );
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if ready && !ok {
        set_condition(&mut status.conditions, "Ready", false, reason, &message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{cluster, running};
    use drover_common::api::MachineRole;
    use drover_common::api::{manifests_hash, Addon};

    const CM: &str =
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: kube-system}\n";
    const NS: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n";

    fn with_addons(modes: &[(&str, AddonMode, &str)]) -> Cluster {
        let mut c = cluster("v1.31.2", 1, 0, serde_json::json!({"pool": {}}));
        c.spec.addons = modes
            .iter()
            .map(|(name, mode, manifests)| Addon {
                name: (*name).into(),
                mode: *mode,
                manifests: (*manifests).into(),
                manifests_from: None,
            })
            .collect();
        c.status.conditions.clear();
        set_condition(&mut c.status.conditions, "Ready", true, "Running", "");
        c
    }

    /// A cluster with `modes`' addons, its running control plane and its
    /// status, where the passes write.
    fn with_control_plane(modes: &[(&str, AddonMode, &str)]) -> (Cluster, Machine, ClusterStatus) {
        let c = with_addons(modes);
        let cp = running("cp-1", "control-plane", MachineRole::Init);
        let s = c.status.clone();
        (c, cp, s)
    }

    /// A planner pass: `Ready` as the machines make it (true here), then
    /// the addons.
    fn pass(s: &mut ClusterStatus, c: &Cluster, via: &[&Machine], now: OffsetDateTime) {
        set_condition(&mut s.conditions, "Ready", true, "Running", "");
        apply_addons(s, c, via, now);
    }

    fn t(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + s).unwrap()
    }

    fn condition<'a>(s: &'a ClusterStatus, type_: &str) -> &'a drover_common::api::Condition {
        s.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    fn answer(s: &mut ClusterStatus, ok: bool, message: &str, at: OffsetDateTime) {
        let r = s.addon_apply.take().unwrap();
        let st = s.addons.iter_mut().find(|x| x.name == r.addon).unwrap();
        st.record_attempt(r.hash, ok, message, at);
    }

    #[test]
    fn addons_go_in_order_one_at_a_time_and_ready_waits_for_all() {
        let (c, cp, mut s) = with_control_plane(&[
            ("cni", AddonMode::ApplyOnce, CM),
            ("extra", AddonMode::Reconcile, NS),
        ]);
        // No running control plane: nothing asked, Ready says why.
        pass(&mut s, &c, &[], t(0));
        assert_eq!(s.addon_apply, None);
        assert_eq!(condition(&s, "Ready").reason, "AddonsPending");
        assert_eq!(
            condition(&s, ADDONS_CONDITION).message,
            "not applied yet: cni, extra"
        );

        let mut s = c.status.clone();
        pass(&mut s, &c, &[&cp], t(0));
        let r = s.addon_apply.clone().unwrap();
        assert_eq!((r.addon.as_str(), r.via.as_str()), ("cni", "cp-1"));
        assert_eq!(r.hash, manifests_hash(CM));
        // While it is under way nothing else is asked.
        let mut again = s.clone();
        pass(&mut again, &c, &[&cp], t(5));
        assert_eq!(again.addon_apply, Some(r.clone()));
        answer(&mut s, true, "", t(1));
        pass(&mut s, &c, &[&cp], t(2));
        assert_eq!(s.addon_apply.as_ref().unwrap().addon, "extra");
        answer(&mut s, true, "", t(3));
        let mut ready = s.clone();
        pass(&mut ready, &c, &[&cp], t(4));
        assert_eq!(ready.addon_apply, None);
        assert_eq!(condition(&ready, ADDONS_CONDITION).status, "True");
        assert_eq!(condition(&ready, "Ready").status, "True");

        // A changed Reconcile addon is applied again; a changed ApplyOnce
        // one is not.
        let changed = with_addons(&[
            ("cni", AddonMode::ApplyOnce, NS),
            ("extra", AddonMode::Reconcile, CM),
        ]);
        pass(&mut ready, &changed, &[&cp], t(5));
        let r = ready.addon_apply.clone().unwrap();
        assert_eq!(
            (r.addon.as_str(), r.hash.as_str()),
            ("extra", manifests_hash(CM).as_str())
        );
    }

    #[test]
    fn a_failed_addon_is_retried_with_back_off_and_holds_the_ones_after_it() {
        let (c, cp, mut s) = with_control_plane(&[
            ("broken", AddonMode::ApplyOnce, CM),
            ("after", AddonMode::ApplyOnce, NS),
        ]);
        pass(&mut s, &c, &[&cp], t(0));
        answer(&mut s, false, "ConfigMap kube-system/a: denied", t(1));
        pass(&mut s, &c, &[&cp], t(2));
        assert_eq!(
            s.addon_apply, None,
            "waits out its back-off, and so does the next"
        );
        let cond = condition(&s, "Ready");
        assert_eq!(cond.reason, "AddonFailed");
        assert!(
            cond.message.starts_with(
                "addon broken failed (1 attempts; next attempt at 2027-01-15T08:00:06Z): ConfigMap kube-system/a: denied"
            ),
            "{}",
            cond.message
        );
        pass(&mut s, &c, &[&cp], t(6));
        assert_eq!(s.addon_apply.as_ref().unwrap().addon, "broken");
        answer(&mut s, false, "again", t(7));
        pass(&mut s, &c, &[&cp], t(7 + 9));
        assert_eq!(s.addon_apply, None, "the second wait is 10 s");
        pass(&mut s, &c, &[&cp], t(7 + 10));
        assert!(s.addon_apply.is_some());
        assert_eq!(backoff(1), Duration::seconds(5));
        assert_eq!(backoff(20), MAX_BACKOFF);

        // A control plane that never answers: the attempt counts as failed.
        let mut silent = c.status.clone();
        pass(&mut silent, &c, &[&cp], t(0));
        pass(&mut silent, &c, &[&cp], t(0) + ADDON_ANSWER_TIMEOUT);
        let st = &silent.addons[0];
        assert_eq!((st.phase, st.failures), (AddonPhase::Failed, 1));
        assert!(
            st.message.contains("cp-1 did not answer within 120 s"),
            "{}",
            st.message
        );

        // Fixed manifests go at once, whatever the back-off; a removed
        // addon is forgotten.
        let fixed = with_addons(&[("broken", AddonMode::ApplyOnce, NS)]);
        pass(&mut s, &fixed, &[&cp], t(8));
        assert_eq!(s.addons.len(), 1);
        let r = s.addon_apply.clone().unwrap();
        assert_eq!(r.hash, manifests_hash(NS));
    }
}
