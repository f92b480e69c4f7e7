//! `plan` holding a machine that leaves on purpose until its Node is
//! drained (`drain.rs`), and never holding a remediation.

use drover_common::api::MachinePhase;

use crate::drain::DRAIN_CONDITION;
use crate::fixtures::*;
use crate::{plan, Step};

#[test]
fn a_worker_deleted_on_request_leaves_only_once_drained_and_a_timed_out_drain_halts() {
    let (mut c, mut machines) = init_and_worker();
    c.spec.drain = Some(drover_common::api::DrainPolicy {
        timeout: Some("60s".into()),
        force: false,
        ..Default::default()
    });
    machines[1].metadata.deletion_timestamp = Some(drover_common::now());
    c.status.nodes = vec![cluster_node("a", "True"), cluster_node("w1", "True")];

    // First pass: no release; a drain through the control plane.
    let steps = plan(&c, &machines, &obs(true, &seen_now));
    assert_eq!(releases(&steps), vec![]);
    let st = final_status(&steps);
    let d = st.drain.clone().expect("a drain is asked for");
    assert_eq!(
        (d.machine.as_str(), d.node.as_str(), d.via.as_str()),
        ("w1", "w1", "a")
    );

    // Refused and retried; past the timeout the removal halts.
    let mut refused = d.clone();
    refused.result = Some(drover_common::api::DrainResult {
        ok: false,
        message: "evictions refused: default/web-1 (budget)".into(),
    });
    refused.started_at = drover_common::now() - time::Duration::seconds(61);
    c.status = st.clone();
    c.status.drain = Some(refused.clone());
    let steps = plan(&c, &machines, &obs(true, &seen_now));
    assert_eq!(releases(&steps), vec![]);
    let st = final_status(&steps);
    let failed = st
        .conditions
        .iter()
        .find(|x| x.type_ == DRAIN_CONDITION)
        .expect("DrainFailed");
    assert_eq!(failed.status, "True");
    assert!(
        failed.message.contains("default/web-1"),
        "{}",
        failed.message
    );

    // Halted, the drain is still asked for again, and the condition keeps
    // saying what blocked it until the next answer.
    let mut halted = c.clone();
    halted.status = st.clone();
    let mut stale = refused.clone();
    stale.requested_at = drover_common::now() - time::Duration::seconds(11);
    halted.status.drain = Some(stale.clone());
    let steps = plan(&halted, &machines, &obs(true, &seen_now));
    assert_eq!(releases(&steps), vec![]);
    let again = final_status(&steps);
    let asked = again.drain.clone().expect("asked again");
    assert!(asked.result.is_none() && asked.requested_at > stale.requested_at);
    let still = again
        .conditions
        .iter()
        .find(|x| x.type_ == DRAIN_CONDITION)
        .expect("DrainFailed");
    assert!(
        still.status == "True" && still.message.contains("default/web-1"),
        "{still:?}"
    );

    // With force, the machine goes after the timeout.
    let mut forced = c.clone();
    forced.spec.drain.as_mut().unwrap().force = true;
    let steps = plan(&forced, &machines, &obs(true, &seen_now));
    assert_eq!(releases(&steps), vec![("w1".to_owned(), false)]);

    // Drained: it is released; the drain and the condition clear once it
    // no longer leaves.
    c.status = st;
    let mut done = refused;
    done.result = Some(drover_common::api::DrainResult {
        ok: true,
        message: "node w1 drained".into(),
    });
    c.status.drain = Some(done);
    let steps = plan(&c, &machines, &obs(true, &seen_now));
    assert_eq!(releases(&steps), vec![("w1".to_owned(), false)]);
    machines[1].status.phase = MachinePhase::Releasing;
    let st = final_status(&plan(&c, &machines, &obs(true, &seen_now)));
    assert_eq!(st.drain, None);
    assert!(st
        .conditions
        .iter()
        .any(|x| x.type_ == DRAIN_CONDITION && x.status == "False"));
}

#[test]
fn a_silent_machine_is_not_drained_and_remediation_is_never_held() {
    let (mut c, mut machines) = init_and_worker();
    machines[1].metadata.deletion_timestamp = Some(drover_common::now());
    c.status.nodes = vec![cluster_node("w1", "True")];
    let steps = plan_silent(&c, &machines, &["w1"]);
    assert!(releases(&steps).iter().any(|(m, _)| m == "w1"), "{steps:?}");
    assert!(steps
        .iter()
        .all(|s| !matches!(s, Step::SetStatus(st) if st.drain.is_some())));
}

#[test]
fn a_node_not_reported_yet_is_drained_and_one_reported_not_ready_is_not() {
    let (mut c, mut machines) = init_and_worker();
    machines[1].metadata.deletion_timestamp = Some(drover_common::now());
    // The report lags: w1's Node is not in it yet, but may run Pods.
    c.status.nodes = vec![cluster_node("a", "True")];
    let steps = plan(&c, &machines, &obs(true, &seen_now));
    assert_eq!(releases(&steps), vec![]);
    let drain = final_status(&steps).drain.expect("a drain is asked for");
    assert_eq!((drain.node.as_str(), drain.via.as_str()), ("w1", "a"));
    // Reported not Ready: no kubelet would confirm an eviction.
    c.status.nodes.push(cluster_node("w1", "False"));
    let steps = plan(&c, &machines, &obs(true, &seen_now));
    assert_eq!(releases(&steps), vec![("w1".to_owned(), false)]);
}
