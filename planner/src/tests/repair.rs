//! Remediation strategies (`Replace`, `Reboot`, `RebootThenReplace`) over
//! whole passes: what a node problem its pool lists does, and how a reboot
//! is asked for, waited for, and followed by a replacement.

use drover_common::api::{
    set_condition, BmcSpec, Cluster, Machine, MachinePhase, MachineRole, RebootMethod,
    RebootRequest, RemediationPolicy, RemediationStrategy,
};
use time::{Duration, OffsetDateTime};

use crate::fixtures::*;
use crate::Step;

/// Initialized pool cluster `c` with one control plane `a`, workers w1-w3
/// and free machine `f`; w1 has reported `problem` since `since` ago.
fn with_problem(problem: &str, since: Duration) -> (Cluster, Vec<Machine>, OffsetDateTime) {
    let now = drover_common::now();
    let c = initialized_by(pool_cluster(1, 3), "a");
    let mut machines = vec![running_init_a()];
    machines.extend(
        ["w1", "w2", "w3"]
            .iter()
            .map(|w| claimed(w, "w", MachineRole::Worker, MachinePhase::Running)),
    );
    machines.push(free("f", "dev"));
    let w1 = &mut machines[1];
    set_condition(
        &mut w1.status.conditions,
        problem,
        true,
        "Seen",
        "seen by the agent",
    );
    w1.status
        .conditions
        .last_mut()
        .unwrap()
        .last_transition_time = now - since;
    (c, machines, now)
}

fn set_worker_remediation(c: &mut Cluster, r: RemediationPolicy) {
    c.spec.worker_pools[0].remediation = Some(r);
}

fn reboot(requested: Duration, now: OffsetDateTime) -> RebootRequest {
    RebootRequest {
        id: "reboot-1".into(),
        reason: "unhealthy".into(),
        requested_at: now - requested,
        boot_id: Some("boot-1".into()),
        started_at: None,
        completed_at: None,
        failed: None,
        method: drover_common::api::RebootMethod::Agent,
    }
}

fn reboots(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Reboot {
                machine,
                method: RebootMethod::Agent,
                ..
            } => Some(machine.clone()),
            _ => None,
        })
        .collect()
}

/// The machines to power-cycle, with why.
fn power_cycles(steps: &[Step]) -> Vec<(String, String)> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Reboot {
                machine,
                reason,
                method: RebootMethod::PowerCycle,
            } => Some((machine.clone(), reason.clone())),
            _ => None,
        })
        .collect()
}

fn with_bmc(m: &mut Machine) {
    m.spec.bmc = Some(BmcSpec {
        url: "https://10.0.0.5".into(),
        system: None,
        credentials_secret: "bmc".into(),
    });
}

fn release_reason(steps: &[Step], machine: &str) -> Option<String> {
    steps.iter().find_map(|s| match s {
        Step::Release {
            machine: m, reason, ..
        } if m == machine => Some(reason.clone()),
        _ => None,
    })
}

#[test]
fn a_listed_problem_reboots_a_pool_machine_and_still_there_after_it_replaces_it() {
    let (c, mut machines, now) = with_problem("ReadOnlyFilesystem", Duration::minutes(3));
    // Past the unhealthy timeout (2 m): rebooted first, not replaced.
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert_eq!(reboots(&steps), vec!["w1"]);
    assert!(releases(&steps).is_empty(), "{steps:#?}");
    // While the reboot is under way nothing more happens, even silent.
    machines[1].status.reboot = Some(reboot(Duration::minutes(1), now));
    let silent = heard_but(now, &["w1"], Duration::seconds(50));
    let steps = plan_at(&c, &machines, now, &silent);
    assert!(
        reboots(&steps).is_empty() && releases(&steps).is_empty(),
        "{steps:#?}"
    );
    // Back, with the problem still reported: it gets the unhealthy timeout
    // to recover...
    let r = machines[1].status.reboot.as_mut().unwrap();
    r.completed_at = Some(now - Duration::minutes(1));
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert!(
        reboots(&steps).is_empty() && releases(&steps).is_empty(),
        "{steps:#?}"
    );
    // ...and then is replaced by the free machine.
    let r = machines[1].status.reboot.as_mut().unwrap();
    r.completed_at = Some(now - Duration::minutes(3));
    let steps = plan_at(&c, &machines, now, &seen_now);
    let why = release_reason(&steps, "w1").expect("w1 is released");
    assert!(
        why.contains("node problem ReadOnlyFilesystem")
            && why.contains("still unhealthy after a reboot"),
        "{why}"
    );
    assert_eq!(
        assigns(&steps),
        vec![("f".to_string(), MachineRole::Worker, Some("w1".to_string()))]
    );
}

#[test]
fn a_problem_the_pool_does_not_list_makes_no_machine_unhealthy() {
    let (mut c, machines, now) = with_problem("DiskPressure", Duration::minutes(30));
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert!(
        reboots(&steps).is_empty() && releases(&steps).is_empty(),
        "{steps:#?}"
    );
    set_worker_remediation(
        &mut c,
        RemediationPolicy {
            conditions: Some(vec!["DiskPressure".into()]),
            ..Default::default()
        },
    );
    assert_eq!(reboots(&plan_at(&c, &machines, now, &seen_now)), vec!["w1"]);
    // Not before the unhealthy timeout.
    let (c2, machines, now) = with_problem("ReadOnlyFilesystem", Duration::seconds(60));
    let steps = plan_at(&c2, &machines, now, &seen_now);
    assert!(
        reboots(&steps).is_empty() && releases(&steps).is_empty(),
        "{steps:#?}"
    );
}

#[test]
fn a_reboot_not_back_within_its_timeout_or_refused_leads_to_replacement() {
    let (c, mut machines, now) = with_problem("ReadOnlyFilesystem", Duration::minutes(30));
    // Asked 11 minutes ago (rebootTimeout 10 m), silent since.
    machines[1].status.reboot = Some(reboot(Duration::minutes(11), now));
    let silent = heard_but(now, &["w1"], Duration::minutes(10));
    let steps = plan_at(&c, &machines, now, &silent);
    let why = release_reason(&steps, "w1").expect("w1 is released");
    assert!(
        why.contains("not back from the reboot asked 660s ago"),
        "{why}"
    );
    // Refused by its agent: replaced at once.
    let r = machines[1].status.reboot.as_mut().unwrap();
    r.requested_at = now - Duration::minutes(1);
    r.failed = Some("systemctl: not found".into());
    let steps = plan_at(&c, &machines, now, &seen_now);
    let why = release_reason(&steps, "w1").expect("w1 is released");
    assert!(
        why.contains("its reboot failed: systemctl: not found"),
        "{why}"
    );
}

#[test]
fn a_silent_pool_machine_is_replaced_at_once_since_no_reboot_reaches_it() {
    let (c, machines, now) = with_problem("ReadOnlyFilesystem", Duration::seconds(1));
    let silent = heard_but(now, &["w1"], Duration::seconds(50));
    let steps = plan_at(&c, &machines, now, &silent);
    assert!(reboots(&steps).is_empty(), "{steps:#?}");
    let why = release_reason(&steps, "w1").expect("w1 is released");
    assert!(why.contains("a reboot cannot reach it"), "{why}");
}

#[test]
fn a_silent_pool_machine_with_a_bmc_is_power_cycled_then_replaced_if_not_back() {
    let (c, mut machines, now) = with_problem("ReadOnlyFilesystem", Duration::seconds(1));
    with_bmc(&mut machines[1]);
    let silent = heard_but(now, &["w1"], Duration::seconds(50));
    let steps = plan_at(&c, &machines, now, &silent);
    let cycles = power_cycles(&steps);
    assert_eq!(cycles.len(), 1, "{steps:#?}");
    assert_eq!(cycles[0].0, "w1");
    assert!(
        cycles[0].1.contains("its agent cannot be reached"),
        "{cycles:?}"
    );
    assert!(
        releases(&steps).is_empty() && reboots(&steps).is_empty(),
        "{steps:#?}"
    );
    // Under way: nothing more until rebootTimeout (10 m)...
    let mut r = reboot(Duration::minutes(2), now);
    r.method = RebootMethod::PowerCycle;
    r.started_at = Some(now - Duration::minutes(2));
    machines[1].status.reboot = Some(r);
    let silent = heard_but(now, &["w1"], Duration::minutes(3));
    let steps = plan_at(&c, &machines, now, &silent);
    assert!(
        power_cycles(&steps).is_empty() && releases(&steps).is_empty(),
        "{steps:#?}"
    );
    // ...then the spare takes its place.
    machines[1].status.reboot.as_mut().unwrap().requested_at = now - Duration::minutes(11);
    let steps = plan_at(&c, &machines, now, &silent);
    let why = release_reason(&steps, "w1").expect("w1 is released");
    assert!(
        why.contains("not back from the power cycle asked 660s ago"),
        "{why}"
    );
    assert!(power_cycles(&steps).is_empty(), "{steps:#?}");
    // A BMC that failed: replaced at once, with the BMC's words.
    let r = machines[1].status.reboot.as_mut().unwrap();
    r.requested_at = now - Duration::seconds(10);
    r.failed = Some("https://10.0.0.5 did not answer".into());
    let steps = plan_at(&c, &machines, now, &silent);
    let why = release_reason(&steps, "w1").expect("w1 is released");
    assert!(
        why.contains("its power cycle failed: https://10.0.0.5 did not answer"),
        "{why}"
    );
}

#[test]
fn an_agent_reboot_not_back_in_time_is_followed_by_a_power_cycle_when_there_is_a_bmc() {
    let (c, mut machines, now) = with_problem("ReadOnlyFilesystem", Duration::minutes(30));
    with_bmc(&mut machines[1]);
    // Answering: its agent reboots it first, the gentler way (it cordons).
    assert_eq!(reboots(&plan_at(&c, &machines, now, &seen_now)), vec!["w1"]);
    // Not back 11 minutes later: the BMC power-cycles it.
    machines[1].status.reboot = Some(reboot(Duration::minutes(11), now));
    let silent = heard_but(now, &["w1"], Duration::minutes(10));
    let steps = plan_at(&c, &machines, now, &silent);
    let cycles = power_cycles(&steps);
    assert_eq!(cycles.len(), 1, "{steps:#?}");
    assert!(
        cycles[0]
            .1
            .contains("not back from the reboot asked 660s ago"),
        "{cycles:?}"
    );
    assert!(releases(&steps).is_empty(), "{steps:#?}");
    // Replace never power-cycles.
    let mut replace = c.clone();
    set_worker_remediation(
        &mut replace,
        RemediationPolicy {
            strategy: Some(RemediationStrategy::Replace),
            ..Default::default()
        },
    );
    let steps = plan_at(&replace, &machines, now, &silent);
    assert!(power_cycles(&steps).is_empty(), "{steps:#?}");
    assert!(release_reason(&steps, "w1").is_some(), "{steps:#?}");
}

#[test]
fn reboot_only_power_cycles_a_silent_machine_with_a_bmc_at_most_once_a_timeout() {
    let (mut c, mut machines, now) = with_problem("ReadOnlyFilesystem", Duration::seconds(1));
    set_worker_remediation(
        &mut c,
        RemediationPolicy {
            strategy: Some(RemediationStrategy::Reboot),
            reboot_timeout: Some("5m".into()),
            ..Default::default()
        },
    );
    let silent = heard_but(now, &["w1"], Duration::minutes(1));
    // Without a BMC nothing reaches it (the test below); with one, cycled.
    assert!(power_cycles(&plan_at(&c, &machines, now, &silent)).is_empty());
    with_bmc(&mut machines[1]);
    assert_eq!(power_cycles(&plan_at(&c, &machines, now, &silent)).len(), 1);
    // Cycled 6 minutes ago and never back (rebootTimeout 5 m): again.
    let mut r = reboot(Duration::minutes(6), now);
    r.method = RebootMethod::PowerCycle;
    machines[1].status.reboot = Some(r);
    let long_silent = heard_but(now, &["w1"], Duration::minutes(7));
    let steps = plan_at(&c, &machines, now, &long_silent);
    assert_eq!(power_cycles(&steps).len(), 1, "{steps:#?}");
    assert!(releases(&steps).is_empty(), "{steps:#?}");
}

#[test]
fn reboot_only_asks_again_after_its_timeout_and_never_replaces() {
    let (mut c, mut machines, now) = with_problem("ReadOnlyFilesystem", Duration::minutes(30));
    set_worker_remediation(
        &mut c,
        RemediationPolicy {
            strategy: Some(RemediationStrategy::Reboot),
            reboot_timeout: Some("5m".into()),
            ..Default::default()
        },
    );
    assert_eq!(reboots(&plan_at(&c, &machines, now, &seen_now)), vec!["w1"]);
    // Back 3 minutes ago and still unhealthy: within rebootTimeout, waits.
    let mut r = reboot(Duration::minutes(4), now);
    r.completed_at = Some(now - Duration::minutes(3));
    machines[1].status.reboot = Some(r);
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert!(
        reboots(&steps).is_empty() && releases(&steps).is_empty(),
        "{steps:#?}"
    );
    // Back 6 minutes ago: asked again.
    let r = machines[1].status.reboot.as_mut().unwrap();
    r.requested_at = now - Duration::minutes(7);
    r.completed_at = Some(now - Duration::minutes(6));
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert_eq!(reboots(&steps), vec!["w1"]);
    assert!(releases(&steps).is_empty(), "{steps:#?}");
    // Silent: nothing reaches it, and nothing replaces it.
    let silent = heard_but(now, &["w1"], Duration::minutes(5));
    let steps = plan_at(&c, &machines, now, &silent);
    assert!(
        reboots(&steps).is_empty() && releases(&steps).is_empty(),
        "{steps:#?}"
    );
}

#[test]
fn replace_replaces_at_once_and_is_what_provider_clusters_do_unless_told() {
    let (mut c, machines, now) = with_problem("ReadOnlyFilesystem", Duration::minutes(3));
    set_worker_remediation(
        &mut c,
        RemediationPolicy {
            strategy: Some(RemediationStrategy::Replace),
            ..Default::default()
        },
    );
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert!(reboots(&steps).is_empty(), "{steps:#?}");
    assert!(release_reason(&steps, "w1").is_some(), "{steps:#?}");
    assert_eq!(
        docker_cluster(1, 1).spec.remediation("w").strategy,
        RemediationStrategy::Replace
    );
    assert_eq!(
        pool_cluster(1, 1)
            .spec
            .remediation("control-plane")
            .strategy,
        RemediationStrategy::RebootThenReplace
    );
}

#[test]
fn a_control_plane_is_not_rebooted_while_another_reboots() {
    let now = drover_common::now();
    let mut c = pool_cluster(3, 0);
    c.spec.worker_pools.clear();
    let mut c = initialized_by(c, "a");
    c.status.etcd_members = healthy_members(&["a", "b", "d"]);
    let mut machines = three_control_planes();
    hostnames_are_names(&mut machines);
    let b = &mut machines[1];
    set_condition(
        &mut b.status.conditions,
        "ReadOnlyFilesystem",
        true,
        "Seen",
        "",
    );
    b.status.conditions.last_mut().unwrap().last_transition_time = now - Duration::minutes(5);
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert_eq!(reboots(&steps), vec!["b"], "{steps:#?}");
    // While d reboots (for whatever reason), b waits its turn.
    machines[2].status.reboot = Some(reboot(Duration::seconds(30), now));
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert!(
        reboots(&steps).is_empty() && releases(&steps).is_empty(),
        "{steps:#?}"
    );
}

#[test]
fn a_provider_cluster_may_reboot_its_control_planes_one_at_a_time() {
    let now = drover_common::now();
    let mut c = initialized_docker(3, 0);
    c.spec.worker_pools.clear();
    c.status.etcd_members = healthy_members(&["i", "b", "d"]);
    c.spec.control_plane.remediation = Some(RemediationPolicy {
        strategy: Some(RemediationStrategy::Reboot),
        ..Default::default()
    });
    let mut machines = created_control_planes(&["i", "b", "d"]);
    hostnames_are_names(&mut machines);
    let b = &mut machines[1];
    set_condition(
        &mut b.status.conditions,
        "KernelDeadlock",
        true,
        "TaskHung",
        "",
    );
    b.status.conditions.last_mut().unwrap().last_transition_time = now - Duration::minutes(5);
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert_eq!(reboots(&steps), vec!["b"], "{steps:#?}");
    assert!(deletes(&steps).is_empty(), "{steps:#?}");
    machines[2].status.reboot = Some(reboot(Duration::seconds(30), now));
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert!(
        reboots(&steps).is_empty() && deletes(&steps).is_empty(),
        "{steps:#?}"
    );
}

#[test]
fn a_free_machine_reporting_a_listed_problem_is_not_claimed() {
    let (c, mut machines, now) = with_problem("ReadOnlyFilesystem", Duration::minutes(30));
    // w1 is replaced at once (Replace), and free f reports the problem
    // too: nothing is claimed until a sound machine is free.
    let mut c = c;
    set_worker_remediation(
        &mut c,
        RemediationPolicy {
            strategy: Some(RemediationStrategy::Replace),
            ..Default::default()
        },
    );
    let f = machines
        .iter_mut()
        .find(|m| m.metadata.name == "f")
        .unwrap();
    set_condition(
        &mut f.status.conditions,
        "ReadOnlyFilesystem",
        true,
        "Seen",
        "",
    );
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert!(release_reason(&steps, "w1").is_some(), "{steps:#?}");
    assert!(assigns(&steps).is_empty(), "{steps:#?}");
    // A problem the pool does not list does not keep it out.
    let f = machines
        .iter_mut()
        .find(|m| m.metadata.name == "f")
        .unwrap();
    f.status.conditions.clear();
    set_condition(&mut f.status.conditions, "DiskPressure", true, "Seen", "");
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert_eq!(assigns(&steps).len(), 1, "{steps:#?}");
}
