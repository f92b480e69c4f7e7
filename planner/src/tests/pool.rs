//! `plan` over pool clusters: claiming free machines, their health and
//! replacement, control-plane changes under quorum, the coordinator's
//! managed endpoint, Nodes and the endpoint's readiness.

use std::time::Duration;

use drover_common::api::{
    push_event, set_condition, Assignment, ClusterPhase, Machine, MachinePhase, MachineRole,
    CONTROL_PLANE_POOL,
};

use crate::fixtures::*;
use crate::health::{Policy, ALIVE_CONDITION};
use crate::{alive_steps, plan, InstanceState, Observed, Step};

#[test]
fn pki_comes_first() {
    let steps = plan(
        &pool_cluster(1, 2),
        &[free("a", "dev")],
        &obs(false, &seen_now),
    );
    assert_eq!(steps, vec![Step::EnsurePki]);
}

#[test]
fn claims_matching_machines_init_first() {
    let machines = vec![
        free("a", "dev"),
        free("b", "prod"),
        free("c", "dev"),
        free("d", "dev"),
    ];
    let steps = plan(&pool_cluster(1, 2), &machines, &obs(true, &seen_now));
    let assigns: Vec<_> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Assign { machine, role, .. } => Some((machine.as_str(), *role)),
            _ => None,
        })
        .collect();
    assert_eq!(
        assigns,
        vec![
            ("a", MachineRole::Init),
            ("c", MachineRole::Worker),
            ("d", MachineRole::Worker)
        ]
    );
    let Some(Step::SetStatus(st)) = steps.last() else {
        panic!("status step expected")
    };
    assert_eq!(st.init_machine.as_deref(), Some("a"));
    assert_eq!(st.control_plane_endpoint.as_deref(), Some("10.0.0.9:6443"));
    assert_eq!(st.phase, ClusterPhase::Provisioning);
}

#[test]
fn dead_machines_are_not_claimed() {
    let dead = |n: &str| (n != "a").then(drover_common::now);
    let steps = plan(
        &pool_cluster(1, 0),
        &[free("a", "dev"), free("b", "dev")],
        &obs(true, &dead),
    );
    assert!(steps.contains(&Step::Assign {
        machine: "b".into(),
        machine_pool: CONTROL_PLANE_POOL.into(),
        role: MachineRole::Init,
        replaces: None,
    }));
}

/// Free machine `a` assigned as the Running init machine of cluster `c`.
fn init_a_assigned_at_creation() -> Machine {
    let mut m = free("a", "dev");
    m.spec.assignment = Some(Assignment {
        generation: 2,
        assigned_at: None,
        ..assignment(CONTROL_PLANE_POOL, MachineRole::Init)
    });
    m.status.phase = MachinePhase::Running;
    m
}

#[test]
fn converged_cluster_plans_nothing() {
    let mut c = pool_cluster(1, 0);
    let m = init_a_assigned_at_creation();
    let obs = obs(true, &seen_now);
    let steps = plan(&c, std::slice::from_ref(&m), &obs);
    let Some(Step::SetStatus(st)) = steps.last() else {
        panic!()
    };
    assert_eq!(st.phase, ClusterPhase::Running);
    c.status = (**st).clone();
    assert!(plan(&c, &[m], &obs).is_empty());
}

#[test]
fn deletion_releases_then_finalizes() {
    let mut c = pool_cluster(1, 0);
    c.metadata.deletion_timestamp = Some(drover_common::now());
    let m = init_a_assigned_at_creation();
    let obs = obs(true, &seen_now);
    let steps = plan(&c, std::slice::from_ref(&m), &obs);
    assert!(matches!(steps[0], Step::Release { .. }));
    assert_eq!(plan(&c, &[], &obs), vec![Step::Finalize]);
}

#[test]
fn a_pool_clusters_coordinator_endpoint_follows_its_control_planes() {
    let mut c = initialized_by(pool_cluster(3, 0), "a");
    c.spec.control_plane_endpoint = Some(drover_common::api::ControlPlaneEndpoint::Managed {
        managed: drover_common::api::EndpointManager::Coordinator,
    });
    c.status.endpoint_port = Some(36443);
    c.status.control_plane_endpoint = Some("127.0.0.1:36443".into());
    let mut machines = three_control_planes();
    for (i, m) in machines.iter_mut().enumerate() {
        m.status.addresses = vec![format!("10.0.0.{}", i + 1)];
    }
    let backends =
        |ips: &[u8]| -> Vec<String> { ips.iter().map(|i| format!("10.0.0.{i}:6443")).collect() };
    // Recorded first, before anything else of the pass.
    let steps = plan_silent(&c, &machines, &[]);
    assert_eq!(
        steps[0],
        Step::SetEndpointBackends {
            backends: backends(&[1, 2, 3])
        }
    );
    c.status.load_balancer = Some(drover_common::api::LoadBalancerStatus {
        address: "127.0.0.1:36443".into(),
        id: "coordinator".into(),
        backends: backends(&[1, 2, 3]),
    });
    let steps = plan_silent(&c, &machines, &[]);
    assert!(
        !steps
            .iter()
            .any(|s| matches!(s, Step::SetEndpointBackends { .. })),
        "{steps:?}"
    );

    // A control plane an operator takes out leaves the backends first
    // and is released only once they are recorded without it.
    machines[2].metadata.deletion_timestamp = Some(drover_common::now());
    let steps = plan_silent(&c, &machines, &[]);
    assert_eq!(
        steps[0],
        Step::SetEndpointBackends {
            backends: backends(&[1, 2])
        }
    );
    assert!(releases(&steps).is_empty(), "{steps:?}");
    c.status.load_balancer.as_mut().unwrap().backends = backends(&[1, 2]);
    let steps = plan_silent(&c, &machines, &[]);
    assert_eq!(releases(&steps), vec![("d".to_owned(), false)]);

    // A dead one is not waited for: it is released in the same pass.
    machines[2].metadata.deletion_timestamp = None;
    c.status.load_balancer.as_mut().unwrap().backends = backends(&[1, 2, 3]);
    let steps = plan_silent(&c, &machines, &["d"]);
    assert_eq!(releases(&steps), vec![("d".to_owned(), true)]);
    assert_eq!(
        steps[0],
        Step::SetEndpointBackends {
            backends: backends(&[1, 2])
        }
    );
}

#[test]
fn alive_condition_is_written_only_when_it_changes() {
    let mut m = free("a", "dev");
    m.status.phase = MachinePhase::Registered;
    let now = drover_common::now();
    let silent = |_: &str| Some(now - time::Duration::minutes(5));
    let heard = |_: &str| Some(now);
    let stopped = |_: &str| Some(InstanceState::Stopped);
    let no_instance = |_: &str| None;
    let alive_at = |m: &Machine,
                    last_seen: &dyn Fn(&str) -> Option<time::OffsetDateTime>,
                    instance: &dyn Fn(&str) -> Option<InstanceState>| {
        alive_steps(
            &[m],
            &Observed {
                now,
                instance,
                ..obs(true, last_seen)
            },
        )
    };
    // Never in trouble: no condition, no write.
    assert!(alive_at(&m, &heard, &no_instance).is_empty());
    let steps = alive_at(&m, &silent, &no_instance);
    assert_eq!(
        steps,
        vec![Step::SetAlive {
            machine: "a".into(),
            alive: false,
            reason: "Silent".into(),
            message: "no heartbeat within the heartbeat timeout (40s)".into(),
        }]
    );
    set_condition(
        &mut m.status.conditions,
        ALIVE_CONDITION,
        false,
        "Silent",
        "no heartbeat within the heartbeat timeout (40s)",
    );
    assert!(alive_at(&m, &silent, &no_instance).is_empty());
    assert!(matches!(
        &alive_at(&m, &heard, &stopped)[..],
        [Step::SetAlive { alive: false, reason, .. }] if reason == "Stopped"
    ));
    assert!(matches!(
        &alive_at(&m, &heard, &no_instance)[..],
        [Step::SetAlive { alive: true, reason, .. }] if reason == "Heartbeating"
    ));
    // A deleted machine is left alone.
    m.status.phase = MachinePhase::Deleted;
    assert!(alive_at(&m, &heard, &no_instance).is_empty());
}

#[test]
fn pool_control_planes_renew_their_certificates_one_at_a_time_soonest_first() {
    let c = initialized_by(pool_cluster(3, 0), "a");
    let expiring_in = |m: &mut Machine, days: i64| {
        m.status.certificates = Some(drover_common::api::CertificateExpiry {
            certificate: "pki/apiserver.crt".into(),
            expires_at: drover_common::now() + time::Duration::days(days),
        });
    };
    let mut machines = three_control_planes();
    for (m, days) in machines.iter_mut().zip([20, 10, 300]) {
        expiring_in(m, days);
    }
    // b expires first: it alone renews.
    let renewal = final_status(&plan_now(&c, &machines))
        .certificate_renewal
        .expect("a renewal");
    assert_eq!(renewal.machine, "b");
    assert!(
        renewal.reason.starts_with("pki/apiserver.crt expires at"),
        "{renewal:?}"
    );
    // While it is under way, it stands.
    let mut asked = c.clone();
    asked.status.certificate_renewal = Some(renewal.clone());
    assert_eq!(
        final_status(&plan_now(&asked, &machines)).certificate_renewal,
        Some(renewal.clone())
    );
    // Once b reports new certificates, a is next.
    expiring_in(&mut machines[1], 365);
    let next = final_status(&plan_now(&asked, &machines))
        .certificate_renewal
        .expect("the next renewal");
    assert_eq!(next.machine, "a");
    // None starts while a control plane does not run.
    machines[2].status.phase = MachinePhase::Bootstrapping;
    assert_eq!(
        final_status(&plan_now(&c, &machines)).certificate_renewal,
        None
    );
}

/// Asserts the steps release worker `dead` as a remediation and claim
/// free machine `f` in its place.
fn assert_worker_replaced_by_f(steps: &[Step], dead: &str) {
    assert_eq!(releases(steps), vec![(dead.to_string(), true)]);
    assert_eq!(
        assigns(steps),
        vec![("f".to_string(), MachineRole::Worker, Some(dead.to_string()))]
    );
}

/// The Running init machine `a`, Running workers of pool `w` claimed a
/// minute ago, and free machine `f`.
fn init_a_workers_and_free_f(workers: &[&str]) -> Vec<Machine> {
    let mut machines = vec![running_init_a()];
    machines.extend(
        workers
            .iter()
            .map(|w| claimed(w, "w", MachineRole::Worker, MachinePhase::Running)),
    );
    machines.push(free("f", "dev"));
    machines
}

#[test]
fn a_silent_pool_worker_is_taken_out_and_a_free_machine_claimed_in_its_place() {
    // maxUnhealthy 40 % of 3 allows one.
    let c = initialized_by(pool_cluster(1, 3), "a");
    let machines = init_a_workers_and_free_f(&["w1", "w2", "w3"]);
    let steps = plan_silent(&c, &machines, &["w1"]);
    assert_worker_replaced_by_f(&steps, "w1");
    assert_condition(&final_status(&steps), "Ready", "False", "w1 silent");
}

#[test]
fn a_replacement_of_a_replacement_that_dies_is_replaced_in_turn() {
    // w1 died and was taken out; r1 took its place, died and was taken
    // out; r2 took r1's place and is silent now. Neither dead machine
    // ever came back to reset. Only r2 is unhealthy: w1's place is
    // held, so w1 no longer counts against maxUnhealthy (40 % of 3).
    let c = initialized_by(pool_cluster(1, 3), "a");
    let taken_out = |name: &str, replaces: Option<&str>| {
        let mut m = claimed(name, "w", MachineRole::Worker, MachinePhase::Releasing);
        m.spec.assignment.as_mut().unwrap().replaces = replaces.map(str::to_owned);
        push_event(&mut m.status.events, "Remediating", "unhealthy: silent");
        m
    };
    let mut r2 = claimed("r2", "w", MachineRole::Worker, MachinePhase::Running);
    r2.spec.assignment.as_mut().unwrap().replaces = Some("r1".into());
    let machines = vec![
        running_init_a(),
        taken_out("w1", None),
        taken_out("r1", Some("w1")),
        r2,
        claimed("w2", "w", MachineRole::Worker, MachinePhase::Running),
        claimed("w3", "w", MachineRole::Worker, MachinePhase::Running),
        free("f", "dev"),
    ];
    let steps = plan_silent(&c, &machines, &["w1", "r1", "r2"]);
    assert_worker_replaced_by_f(&steps, "r2");
}

#[test]
fn a_pool_machine_claimed_late_in_life_gets_its_full_startup_time() {
    let c = initialized_by(pool_cluster(1, 1), "a");
    // Registered thirty days ago, claimed a minute ago, still joining.
    let mut machines = init_a_workers_and_free_f(&["w1"]);
    machines[1].status.phase = MachinePhase::Bootstrapping;
    let steps = plan_now(&c, &machines);
    assert!(releases(&steps).is_empty(), "{steps:?}");
    assert!(assigns(&steps).is_empty(), "{steps:?}");
}

#[test]
fn pool_control_planes_join_one_at_a_time() {
    let c = initialized_by(pool_cluster(3, 0), "a");
    let mut machines = vec![
        running_init_a(),
        free("b", "dev"),
        free("d", "dev"),
        free("e", "dev"),
    ];
    let steps = plan_now(&c, &machines);
    assert_eq!(
        assigns(&steps),
        vec![("b".to_string(), MachineRole::ControlPlane, None)]
    );
    // While b joins, nothing else is claimed for the control plane.
    machines[1] = claimed(
        "b",
        CONTROL_PLANE_POOL,
        MachineRole::ControlPlane,
        MachinePhase::Bootstrapping,
    );
    assert!(assigns(&plan_now(&c, &machines)).is_empty());
    machines[1].status.phase = MachinePhase::Running;
    assert_eq!(
        assigns(&plan_now(&c, &machines)),
        vec![("d".to_string(), MachineRole::ControlPlane, None)]
    );
}

#[test]
fn before_init_only_the_init_machine_is_claimed_for_the_control_plane() {
    let c = pool_cluster(3, 0);
    let machines = vec![free("a", "dev"), free("b", "dev"), free("d", "dev")];
    assert_eq!(
        assigns(&plan_now(&c, &machines)),
        vec![("a".to_string(), MachineRole::Init, None)]
    );
}

#[test]
fn pool_control_plane_scale_down_goes_one_at_a_time_and_keeps_the_init_machine() {
    let c = initialized_by(pool_cluster(1, 0), "a");
    let mut machines = three_control_planes();
    machines[2].metadata.creation_timestamp = Some(drover_common::now());
    let steps = plan_now(&c, &machines);
    assert_eq!(releases(&steps), vec![("d".to_string(), false)]);
    // While d resets, b stays.
    machines[2].status.phase = MachinePhase::Releasing;
    let steps = plan_now(&c, &machines);
    assert!(releases(&steps).is_empty(), "{steps:?}");
    let st = final_status(&steps);
    assert!(has_condition(&st, "RemovalAllowed", "False"));
}

#[test]
fn a_pool_control_plane_whose_member_etcd_needs_is_neither_remediated_nor_scaled_away() {
    // etcd, as a reports it: b's member is down (its etcd crashed under a
    // living agent), d's is healthy. Two of three machines look healthy,
    // but without d's member etcd would have one healthy voter of two.
    let mut c = initialized_by(pool_cluster(3, 0), "a");
    let mut machines = three_control_planes();
    hostnames_are_names(&mut machines);
    c.status.etcd_members = healthy_members(&["a", "b", "d"]);
    c.status.etcd_members[1].healthy = false;
    let steps = plan_silent(&c, &machines, &["d"]);
    assert!(releases(&steps).is_empty(), "{steps:?}");
    assert_condition(
        &final_status(&steps),
        "RemediationAllowed",
        "False",
        "would break etcd quorum (etcd reports 1 other healthy of 3 voting members)",
    );
    // A scale-down to one would take the newest, d, out the same way.
    c.spec.control_plane.replicas = 1;
    machines[2].metadata.creation_timestamp = Some(drover_common::now());
    let steps = plan_now(&c, &machines);
    assert!(releases(&steps).is_empty(), "{steps:?}");
    let st = final_status(&steps);
    assert_eq!(st.drain, None, "{steps:?}");
    assert_condition(&st, "RemovalAllowed", "False", "would break etcd quorum");
    // With b's member healthy again, d goes (drained first).
    c.status.etcd_members[1].healthy = true;
    let steps = plan_now(&c, &machines);
    let drain = final_status(&steps).drain;
    assert_eq!(drain.map(|d| d.machine), Some("d".to_string()), "{steps:?}");
}

#[test]
fn a_dead_init_machine_of_three_is_replaced_by_a_joining_control_plane() {
    let c = initialized_by(pool_cluster(3, 0), "a");
    let machines = {
        let mut m = three_control_planes();
        m.push(free("f", "dev"));
        m
    };
    let steps = plan_silent(&c, &machines, &["a"]);
    assert_eq!(releases(&steps), vec![("a".to_string(), true)]);
    // Its replacement waits for the next pass, when the dead member can
    // be removed first.
    assert!(assigns(&steps).is_empty(), "{steps:?}");
    // The cluster is not Ready while a member is silent.
    let mut c = c;
    c.status = final_status(&steps);
    assert_eq!(c.status.phase, ClusterPhase::Degraded);
    let mut machines = machines;
    machines[0].status.phase = MachinePhase::Releasing;
    push_event(&mut machines[0].status.events, "Remediating", "taken out");
    // etcd still lists a's member, down: it is removed through b first.
    let member = |id: &str, name: &str, healthy: bool| drover_common::api::EtcdMember {
        id: id.into(),
        name: name.into(),
        peer_urls: vec![],
        client_urls: vec!["https://x:2379".into()],
        started: true,
        healthy,
        is_learner: false,
    };
    c.status.etcd_members = vec![
        member("1", "a", false),
        member("2", "b", true),
        member("3", "d", true),
    ];
    hostnames_are_names(&mut machines);
    let steps = plan_silent(&c, &machines, &["a"]);
    assert!(assigns(&steps).is_empty(), "{steps:?}");
    let removal = final_status(&steps).etcd_removal.expect("a removal");
    assert_eq!((removal.id.as_str(), removal.via.as_str()), ("1", "b"));
    // A request that failed a moment ago stands; once it failed a
    // while ago, it is asked again (a new request, a new directive).
    let mut failed = c.clone();
    let mut r = removal.clone();
    r.requested_at -= time::Duration::seconds(20);
    r.failed_at = Some(drover_common::now() - time::Duration::seconds(1));
    failed.status.etcd_removal = Some(r.clone());
    let again = plan_silent(&failed, &machines, &["a"]);
    assert_eq!(final_status(&again).etcd_removal, Some(r.clone()));
    r.failed_at = Some(drover_common::now() - time::Duration::seconds(6));
    failed.status.etcd_removal = Some(r.clone());
    let again = final_status(&plan_silent(&failed, &machines, &["a"]))
        .etcd_removal
        .expect("asked again");
    assert_eq!(again.id, "1");
    assert_eq!(again.failed_at, None);
    assert_ne!(again.directive_id(), r.directive_id());
    // Once the member is gone, the free machine joins in a's place.
    c.status = final_status(&steps);
    c.status.etcd_members.remove(0);
    let steps = plan_silent(&c, &machines, &["a"]);
    assert_eq!(
        assigns(&steps),
        vec![(
            "f".to_string(),
            MachineRole::ControlPlane,
            Some("a".to_string())
        )]
    );
    assert_eq!(final_status(&steps).etcd_removal, None);
}

#[test]
fn a_pool_cluster_that_lost_every_control_plane_is_never_initialized_again() {
    let c = initialized_by(pool_cluster(1, 1), "a");
    let mut machines = init_a_workers_and_free_f(&["w1"]);
    let gone = &mut machines[0];
    gone.status.phase = MachinePhase::Releasing;
    push_event(&mut gone.status.events, "Remediating", "taken out");
    let steps = plan_now(&c, &machines);
    assert!(assigns(&steps).is_empty(), "{steps:?}");
    let st = final_status(&steps);
    let lost = st
        .conditions
        .iter()
        .find(|c| c.type_ == "ControlPlaneLost")
        .expect("a ControlPlaneLost condition");
    assert!(lost.message.contains("Restore etcd"), "{}", lost.message);
    assert_ne!(st.phase, ClusterPhase::Running);
}

#[test]
fn a_lone_dead_pool_control_plane_is_kept_for_quorum() {
    let c = initialized_by(pool_cluster(1, 0), "a");
    let machines = init_a_workers_and_free_f(&[]);
    let now = drover_common::now();
    let heard = move |_: &str| Some(now - time::Duration::seconds(60));
    let mut policy = Policy::defaults(Duration::from_secs(40));
    // Not paused by maxUnhealthy: the quorum rule alone keeps it.
    policy.max_unhealthy_percent = 100;
    let steps = plan(
        &c,
        &machines,
        &Observed {
            now,
            policy,
            ..obs(true, &heard)
        },
    );
    assert!(releases(&steps).is_empty(), "{steps:?}");
    assert_condition(
        &final_status(&steps),
        "RemediationAllowed",
        "False",
        "quorum",
    );
}

#[test]
fn a_cluster_whose_endpoint_does_not_answer_is_not_ready() {
    // Every machine runs and every Node was Ready when last listed, but
    // the API server died under a living agent, which reports that
    // the endpoint does not answer /readyz.
    let (mut c, machines) = init_and_worker();
    c.status.nodes = vec![cluster_node("a", "True"), cluster_node("w1", "True")];
    c.status.endpoint_ready = Some(false);
    let st = final_status(&plan_now(&c, &machines));
    let ready = condition(&st, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "EndpointNotReady"),
        "{}",
        ready.message
    );
    assert!(ready.message.contains("/readyz"), "{}", ready.message);
    // It answers again: Ready.
    c.status = st;
    c.status.endpoint_ready = Some(true);
    let st = final_status(&plan_now(&c, &machines));
    assert!(has_condition(&st, "Ready", "True"));
}

#[test]
fn a_node_without_a_machine_is_deleted_and_a_not_ready_node_keeps_the_cluster_unready() {
    let (mut c, machines) = init_and_worker();
    let node = cluster_node;
    c.status.nodes = vec![
        node("a", "True"),
        node("gone", "Unknown"),
        node("w1", "False"),
    ];
    let st = final_status(&plan_now(&c, &machines));
    let removal = st.node_removal.clone().expect("the orphan Node goes");
    assert_eq!((removal.node.as_str(), removal.via.as_str()), ("gone", "a"));
    let ready = condition(&st, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "NodesNotReady")
    );
    assert!(ready.message.contains("w1 (False)"), "{}", ready.message);
    // Without a pod network every Node says so, and so does the cluster.
    let no_cni = |name: &str| {
        drover_common::api::ClusterNode {
        message: "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized".into(),
        ..node(name, "False")
    }
    };
    let mut ready_before = c.clone();
    ready_before.status.nodes = vec![no_cni("a"), no_cni("w1")];
    let st_net = final_status(&plan_now(&ready_before, &machines));
    let ready = condition(&st_net, "Ready");
    assert_eq!(ready.reason, "NodesNotReady");
    assert!(
        ready
            .message
            .starts_with("no pod network: Nodes a (False), w1 (False)"),
        "{}",
        ready.message
    );
    // Once it is gone and w1 is Ready, the cluster is Ready again.
    c.status = st;
    c.status.nodes = vec![node("a", "True"), node("w1", "True")];
    let st = final_status(&plan_now(&c, &machines));
    assert_eq!(st.node_removal, None);
    assert!(has_condition(&st, "Ready", "True"));
}

#[test]
fn a_pool_control_plane_scale_down_waits_for_a_snapshot_saved_before_it() {
    let mut c = initialized_by(pool_cluster(1, 0), "a");
    c.spec.backup = Some(Default::default());
    let mut machines = three_control_planes();
    machines[2].metadata.creation_timestamp = Some(drover_common::now());
    let steps = plan_now(&c, &machines);
    assert!(releases(&steps).is_empty(), "{steps:?}");
    let st = final_status(&steps);
    let op = st.snapshot.clone().expect("a snapshot asked");
    assert_eq!(
        op.trigger,
        drover_common::api::SnapshotTrigger::BeforeScaleDown
    );
    let removal = st
        .conditions
        .iter()
        .find(|c| c.type_ == "RemovalAllowed")
        .expect("RemovalAllowed");
    assert_eq!(
        (removal.status.as_str(), removal.reason.as_str()),
        ("False", "WaitingForSnapshot")
    );
    assert!(
        removal.message.contains("scale-down to 1"),
        "{}",
        removal.message
    );
    // Saved: the scale-down goes ahead, one machine at a time.
    c.status.snapshot_taken_before = op.before.clone();
    let steps = plan_now(&c, &machines);
    assert_eq!(releases(&steps), vec![("d".to_string(), false)]);
}

#[test]
fn a_pool_clusters_in_place_upgrade_waits_for_a_snapshot_saved_before_it() {
    let (mut c, machines) = init_and_worker();
    c.spec.kubernetes_version = "v1.32.0".into();
    c.spec.backup = Some(Default::default());
    c.status.nodes = vec![cluster_node("a", "True"), cluster_node("w1", "True")];
    c.status.etcd_members = healthy_members(&["a"]);
    let steps = plan_now(&c, &machines);
    let st = final_status(&steps);
    assert_eq!(st.machine_upgrade, None, "{steps:?}");
    let op = st.snapshot.clone().expect("a snapshot asked");
    assert_eq!(
        op.trigger,
        drover_common::api::SnapshotTrigger::BeforeUpgrade
    );
    assert_eq!(op.before.as_deref(), Some("upgrade to v1.32.0"));
    // Saved: the control plane upgrades first.
    c.status.snapshot_taken_before = op.before.clone();
    let steps = plan_now(&c, &machines);
    let upgrade = final_status(&steps)
        .machine_upgrade
        .expect("an upgrade started");
    assert_eq!(upgrade.machine, "a");
}

/// A pool cluster whose control plane is lost is restored: `drover restore
/// cluster` clears `initialized`, the dead control plane is released (it
/// resets and returns to its pool when heard again), a free machine is
/// claimed as the init machine that restores the snapshot, and once it
/// runs the restore is done; the worker stays throughout.
#[test]
fn a_lost_pool_control_plane_is_restored_onto_a_free_machine() {
    let mut c = restoring(initialized_by(pool_cluster(1, 1), "a"), &["a"]);
    let mut machines = init_a_workers_and_free_f(&["w1"]);

    // The dead control plane is released first; nothing is claimed, and
    // the silent worker is not taken out.
    let steps = plan_silent(&c, &machines, &["a", "w1"]);
    assert_eq!(releases(&steps), vec![("a".to_owned(), false)], "{steps:?}");
    assert!(assigns(&steps).is_empty(), "{steps:?}");
    let st = final_status(&steps);
    assert_restoring(&st, "removing the control planes of before (a)");
    assert!(!has_condition(&st, "ControlPlaneLost", "True"));

    // Released: the free machine becomes the init machine.
    machines[0].status.phase = MachinePhase::Releasing;
    let steps = plan_silent(&c, &machines, &["a"]);
    assert_eq!(
        assigns(&steps),
        vec![("f".to_owned(), MachineRole::Init, None)],
        "{steps:?}"
    );
    assert!(releases(&steps).is_empty(), "{steps:?}");

    // It runs: the restore is done and the cluster initialized again.
    c.status.init_machine = Some("f".into());
    let f = &mut machines[2];
    *f = claimed(
        "f",
        CONTROL_PLANE_POOL,
        MachineRole::Init,
        MachinePhase::Running,
    );
    let steps = plan_silent(&c, &machines, &["a"]);
    let st = final_status(&steps);
    assert!(st.restore.is_none() && st.initialized, "{st:?}");
    assert_eq!(
        st.last_restore.as_ref().map(|r| r.machine.as_str()),
        Some("f")
    );
}

#[test]
fn a_worker_the_autoscaler_takes_out_goes_back_to_its_pool_unreplaced() {
    let mut c = initialized_by(pool_cluster(1, 2), "a");
    let mut machines = vec![
        claimed(
            "a",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        ),
        claimed("b", "w", MachineRole::Worker, MachinePhase::Running),
        claimed("c", "w", MachineRole::Worker, MachinePhase::Running),
        free("d", "dev"),
    ];
    hostnames_are_names(&mut machines);
    // The autoscaler marks the Node it drained and lowers replicas in the
    // same write: that one machine goes, released (not deleted), and
    // nothing takes its place, though a free machine is there.
    machines[1].metadata.annotations.insert(
        drover_common::names::SCALE_DOWN_ANNOTATION.into(),
        "cluster-autoscaler".into(),
    );
    c.spec.worker_pools[0].replicas = 1;
    // First its Node is drained, as for any machine leaving on purpose.
    let steps = plan_silent(&c, &machines, &[]);
    assert!(
        releases(&steps).is_empty() && assigns(&steps).is_empty(),
        "{steps:?}"
    );
    let mut drain = final_status(&steps).drain.expect("a drain of b");
    assert_eq!(drain.machine, "b");
    drain.result = Some(drover_common::api::DrainResult {
        ok: true,
        message: String::new(),
    });
    c.status.drain = Some(drain);
    let steps = plan_silent(&c, &machines, &[]);
    assert_eq!(releases(&steps), vec![("b".to_owned(), false)], "{steps:?}");
    assert!(steps
        .iter()
        .any(|s| matches!(s, Step::Release { reason, .. }
        if reason == "scaled down by cluster-autoscaler; back to its pool")));
    assert!(assigns(&steps).is_empty(), "{steps:?}");
}
