//! `plan` over provider clusters (docker, aws): the load balancer first,
//! creations and their back-off, remediation against `maxUnhealthy` and
//! etcd quorum, requested deletions, scale-down and joins that wait for
//! etcd and kubeadm-config.

use std::collections::BTreeMap;

use drover_common::api::{
    push_event, set_condition, Cluster, ClusterPhase, Machine, MachinePhase, MachineRole,
    ProviderSpec, CONTROL_PLANE_POOL,
};

use crate::fixtures::*;
use crate::{plan, InstanceState, Observed, Step};

#[test]
fn an_aws_cluster_gets_a_load_balancer_unless_the_user_keeps_the_endpoint() {
    use drover_common::aws::{AwsLoadBalancerSpec, AwsMachineTemplate, AwsProviderSpec};
    let template = AwsMachineTemplate {
        ami: "ami-0123456789abcdef0".into(),
        instance_type: "m6i.large".into(),
        subnets: vec!["subnet-0aaa1111".into()],
        security_groups: vec![],
        instance_profile: None,
        tags: BTreeMap::new(),
    };
    let aws = |lb: Option<AwsLoadBalancerSpec>| {
        let mut c = pool_cluster(3, 0);
        c.spec.provider = ProviderSpec::Aws(AwsProviderSpec {
            region: "us-east-1".into(),
            tags: BTreeMap::new(),
            control_plane: template.clone(),
            worker_pools: BTreeMap::from([("w".into(), template.clone())]),
            load_balancer: lb,
        });
        c
    };
    let o = obs(true, &seen_now);
    // No endpoint of the user's: Drover's Network Load Balancer first.
    assert_eq!(plan(&aws(None), &[], &o), vec![Step::EnsureEndpoint]);
    // The user's endpoint and target group: that group is recorded
    // first, so control planes are registered in it.
    let mut with_group = aws(Some(AwsLoadBalancerSpec {
        target_group_arn: Some(
            "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/api/0123456789abcdef"
                .into(),
        ),
        ..Default::default()
    }));
    with_group.spec.control_plane_endpoint = Some(
        drover_common::api::ControlPlaneEndpoint::Address("api.example.com:6443".into()),
    );
    assert_eq!(plan(&with_group, &[], &o), vec![Step::EnsureEndpoint]);
    // The user's endpoint alone: nothing to make or register.
    let mut endpoint_only = aws(None);
    endpoint_only.spec.control_plane_endpoint = with_group.spec.control_plane_endpoint.clone();
    let steps = plan(&endpoint_only, &[], &o);
    assert!(!steps.contains(&Step::EnsureEndpoint), "{steps:?}");
    assert_eq!(
        creates(&steps),
        vec![(CONTROL_PLANE_POOL.to_owned(), MachineRole::Init)]
    );
}

#[test]
fn a_docker_cluster_gets_its_load_balancer_first_and_it_follows_the_control_planes() {
    let mut c = docker_cluster(3, 0);
    let o = obs(true, &seen_now);
    assert_eq!(plan(&c, &[], &o), vec![Step::EnsureEndpoint]);

    // Once made, it is the endpoint the init machine is created with.
    c.status.load_balancer = Some(drover_common::api::LoadBalancerStatus {
        address: "172.18.0.2:6443".into(),
        id: "drover-c-lb".into(),
        backends: vec![],
    });
    let steps = plan(&c, &[], &o);
    assert_eq!(
        creates(&steps),
        vec![(CONTROL_PLANE_POOL.to_owned(), MachineRole::Init)]
    );
    let status = steps
        .iter()
        .find_map(|s| match s {
            Step::SetStatus(st) => Some(st.clone()),
            _ => None,
        })
        .expect("a status");
    assert_eq!(
        status.control_plane_endpoint.as_deref(),
        Some("172.18.0.2:6443")
    );

    // Control planes are backends from the moment they bootstrap, set
    // before anything else of the pass.
    let cp = |name: &str, role, phase, ip: &str| {
        let mut m = created(name, CONTROL_PLANE_POOL, role, phase);
        m.status.addresses = vec![ip.into()];
        m
    };
    let mut machines = vec![
        cp("cp1", MachineRole::Init, MachinePhase::Running, "10.0.0.1"),
        cp(
            "cp2",
            MachineRole::ControlPlane,
            MachinePhase::Bootstrapping,
            "10.0.0.2",
        ),
    ];
    let both = vec!["10.0.0.1:6443".to_owned(), "10.0.0.2:6443".to_owned()];
    let steps = plan(&c, &machines, &o);
    assert_eq!(
        steps[0],
        Step::SetEndpointBackends {
            backends: both.clone()
        }
    );
    c.status.load_balancer.as_mut().unwrap().backends = both;
    let steps = plan(&c, &machines, &o);
    assert!(
        !steps
            .iter()
            .any(|s| matches!(s, Step::SetEndpointBackends { .. })),
        "{steps:?}"
    );

    // Scaled down to one: the control plane that leaves is taken out
    // of the backends first, and deleted only in a later pass, once the
    // load balancer was told.
    machines[1].status.phase = MachinePhase::Running;
    c.spec.control_plane.replicas = 1;
    let one = vec!["10.0.0.1:6443".to_owned()];
    let leaves_in_two_passes = |c: &mut Cluster, machines: &[Machine]| {
        let steps = plan(c, machines, &o);
        assert_eq!(
            steps[0],
            Step::SetEndpointBackends {
                backends: one.clone()
            }
        );
        assert!(deletes(&steps).is_empty(), "{steps:?}");
        c.status.load_balancer.as_mut().unwrap().backends = one.clone();
        assert_eq!(deletes(&plan(c, machines, &o)), vec!["cp2".to_owned()]);
    };
    leaves_in_two_passes(&mut c, &machines);

    // The same for one an operator asks to delete (it is marked for
    // deletion, yet still served until the backends say otherwise).
    c.spec.control_plane.replicas = 2;
    c.status.load_balancer.as_mut().unwrap().backends =
        vec!["10.0.0.1:6443".to_owned(), "10.0.0.2:6443".to_owned()];
    machines[1].metadata.deletion_timestamp = Some(drover_common::now());
    leaves_in_two_passes(&mut c, &machines);
}

#[test]
fn a_docker_load_balancer_that_is_down_is_brought_back_and_no_machine_is_blamed() {
    let mut c = initialized_by(docker_cluster(1, 1), "cp1");
    c.metadata.uid = Some("cluster-uid".into());
    c.status.load_balancer = Some(drover_common::api::LoadBalancerStatus {
        address: "172.18.0.2:6443".into(),
        id: "drover-c-lb".into(),
        backends: vec!["10.0.0.1:6443".into()],
    });
    c.status.control_plane_endpoint = Some("172.18.0.2:6443".into());
    let mut machines = vec![
        created(
            "cp1",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        ),
        created("w1", "default", MachineRole::Worker, MachinePhase::Running),
    ];
    machines[0].status.addresses = vec!["10.0.0.1".into()];
    for m in &mut machines {
        m.status.hostname = m.metadata.name.clone();
    }
    // Every Node Unknown for ten minutes: the kubelets cannot reach the
    // API through the stopped load balancer.
    c.status.nodes = ["cp1", "w1"]
        .iter()
        .map(|n| drover_common::api::ClusterNode {
            since: Some(drover_common::now() - time::Duration::minutes(10)),
            ..cluster_node(n, "Unknown")
        })
        .collect();
    let key = crate::endpoint_key("cluster-uid");
    let stopped = |k: &str| (k == key).then_some(InstanceState::Stopped);
    let o = Observed {
        instance: &stopped,
        ..obs(true, &seen_now)
    };
    let steps = plan(&c, &machines, &o);
    assert!(steps.contains(&Step::EnsureEndpoint), "{steps:?}");
    assert!(deletes(&steps).is_empty(), "{steps:?}");
    let st = final_status(&steps);
    let cond = st
        .conditions
        .iter()
        .find(|x| x.type_ == "EndpointAvailable")
        .expect("EndpointAvailable");
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "LoadBalancerDown")
    );
    assert!(cond.message.contains("drover-c-lb"), "{}", cond.message);
    // Running again: nothing to do, the condition says so.
    c.status = st;
    let running = |k: &str| (k == key).then_some(InstanceState::Running);
    let o = Observed {
        instance: &running,
        ..obs(true, &seen_now)
    };
    let steps = plan(&c, &machines, &o);
    assert!(!steps.contains(&Step::EnsureEndpoint), "{steps:?}");
    let st = final_status(&steps);
    assert!(st
        .conditions
        .iter()
        .any(|x| x.type_ == "EndpointAvailable" && x.status == "True"));
    // Its control planes report that the endpoint does not answer: the
    // Nodes they list are not the machines' fault either.
    c.status = st;
    c.status.endpoint_ready = Some(false);
    let steps = plan(&c, &machines, &o);
    assert!(deletes(&steps).is_empty(), "{steps:?}");
}

#[test]
fn a_failed_create_waits_out_its_back_off() {
    let c = docker_cluster(1, 1);
    let mut pending = created("w1", "w", MachineRole::Worker, MachinePhase::Provisioning);
    pending.status.provider_id = None;
    pending.status.ticket_redeemed = false;
    let machines = vec![
        created(
            "cp1",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        ),
        pending,
    ];
    let provisions = |o: &Observed<'_>| {
        plan(&c, &machines, o)
            .into_iter()
            .filter(|s| matches!(s, Step::Provision { .. }))
            .count()
    };
    let base = obs(true, &seen_now);
    let later = base.now + time::Duration::seconds(30);
    let waiting = |name: &str| (name == "w1").then_some(later);
    assert_eq!(provisions(&base), 1);
    assert_eq!(
        provisions(&Observed {
            retry_not_before: &waiting,
            ..obs(true, &seen_now)
        }),
        0
    );
    assert_eq!(
        provisions(&Observed {
            retry_not_before: &waiting,
            now: later,
            ..obs(true, &seen_now)
        }),
        1
    );
}

#[test]
fn provider_cluster_starts_with_the_init_machine_and_workers() {
    // Its load balancer is made (the pass before).
    let mut c = docker_cluster(3, 2);
    c.status.load_balancer = Some(drover_common::api::LoadBalancerStatus {
        address: "172.18.0.2:6443".into(),
        id: "drover-c-lb".into(),
        backends: vec![],
    });
    let steps = plan(&c, &[], &obs(true, &seen_now));
    assert_eq!(
        creates(&steps),
        vec![
            (CONTROL_PLANE_POOL.to_string(), MachineRole::Init),
            ("w".to_string(), MachineRole::Worker),
            ("w".to_string(), MachineRole::Worker)
        ]
    );
    // With the init machine recorded but not running, no other control plane yet.
    let mut c = docker_cluster(3, 0);
    c.status.init_machine = Some("i".into());
    let init = created(
        "i",
        CONTROL_PLANE_POOL,
        MachineRole::Init,
        MachinePhase::Bootstrapping,
    );
    assert!(creates(&plan(&c, &[init], &obs(true, &seen_now))).is_empty());
}

#[test]
fn stopped_worker_is_replaced() {
    let mut c = docker_cluster(1, 3);
    c.status.init_machine = Some("i".into());
    c.status.initialized = true;
    let machines = vec![
        created(
            "i",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        ),
        created("w1", "w", MachineRole::Worker, MachinePhase::Running),
        created("w2", "w", MachineRole::Worker, MachinePhase::Running),
        created("w3", "w", MachineRole::Worker, MachinePhase::Running),
    ];
    let stopped = |uid: &str| (uid == "uid-w2").then_some(InstanceState::Stopped);
    let o = Observed {
        instance: &stopped,
        ..obs(true, &seen_now)
    };
    let steps = plan(&c, &machines, &o);
    assert_eq!(deletes(&steps), vec!["w2".to_string()]);
    assert!(steps.contains(&Step::CreateMachine {
        machine_pool: "w".into(),
        role: MachineRole::Worker,
        replaces: Some("w2".into()),
    }));
}

#[test]
fn too_many_unhealthy_pauses_remediation() {
    let mut c = docker_cluster(1, 2);
    c.status.init_machine = Some("i".into());
    c.status.initialized = true;
    let machines = vec![
        created(
            "i",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        ),
        created("w1", "w", MachineRole::Worker, MachinePhase::Running),
        created("w2", "w", MachineRole::Worker, MachinePhase::Running),
    ];
    let silent = |n: &str| {
        Some(if n.starts_with('w') {
            drover_common::now() - time::Duration::minutes(5)
        } else {
            drover_common::now()
        })
    };
    let steps = plan(&c, &machines, &obs(true, &silent));
    assert!(deletes(&steps).is_empty(), "{steps:?}");
    let Some(Step::SetStatus(st)) = steps.last() else {
        panic!("{steps:?}")
    };
    let cond = st
        .conditions
        .iter()
        .find(|c| c.type_ == "RemediationAllowed")
        .unwrap();
    assert_eq!(cond.status, "False");
    assert!(
        cond.message.contains("remediation paused"),
        "{}",
        cond.message
    );
}

#[test]
fn lone_initialized_control_plane_is_not_remediated() {
    let mut c = docker_cluster(1, 0);
    c.status.init_machine = Some("i".into());
    c.status.initialized = true;
    let machines = vec![created(
        "i",
        CONTROL_PLANE_POOL,
        MachineRole::Init,
        MachinePhase::Running,
    )];
    let silent = |_: &str| Some(drover_common::now() - time::Duration::minutes(5));
    let steps = plan(&c, &machines, &obs(true, &silent));
    assert!(deletes(&steps).is_empty(), "{steps:?}");
}

#[test]
fn three_control_planes_remediate_one_keeping_quorum() {
    let mut c = docker_cluster(3, 0);
    c.status.init_machine = Some("a".into());
    c.status.initialized = true;
    let machines = vec![
        created(
            "a",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        ),
        created(
            "b",
            CONTROL_PLANE_POOL,
            MachineRole::ControlPlane,
            MachinePhase::Running,
        ),
        created(
            "c",
            CONTROL_PLANE_POOL,
            MachineRole::ControlPlane,
            MachinePhase::Running,
        ),
    ];
    let one_silent = |n: &str| {
        Some(if n == "c" {
            drover_common::now() - time::Duration::minutes(5)
        } else {
            drover_common::now()
        })
    };
    assert_eq!(
        deletes(&plan(&c, &machines, &obs(true, &one_silent))),
        vec!["c".to_string()]
    );
    let two_silent = |n: &str| {
        Some(if n == "a" {
            drover_common::now()
        } else {
            drover_common::now() - time::Duration::minutes(5)
        })
    };
    // Two of three unhealthy: over maxUnhealthy, and quorum would break anyway.
    assert!(deletes(&plan(&c, &machines, &obs(true, &two_silent))).is_empty());
}

#[test]
fn scale_down_removes_newest_worker() {
    let mut c = docker_cluster(1, 1);
    c.status.init_machine = Some("i".into());
    c.status.initialized = true;
    let mut old = created("w1", "w", MachineRole::Worker, MachinePhase::Running);
    old.metadata.creation_timestamp = Some(drover_common::now() - time::Duration::hours(1));
    let machines = vec![
        created(
            "i",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        ),
        old,
        created("w2", "w", MachineRole::Worker, MachinePhase::Running),
    ];
    assert_eq!(
        deletes(&plan(&c, &machines, &obs(true, &seen_now))),
        vec!["w2".to_string()]
    );
}

#[test]
fn no_remediation_in_the_pass_that_ends_a_pause() {
    let mut c = docker_cluster(1, 3);
    c.status.init_machine = Some("i".into());
    c.status.initialized = true;
    set_condition(
        &mut c.status.conditions,
        "RemediationAllowed",
        false,
        "RemediationPaused",
        "x",
    );
    let machines = vec![
        created(
            "i",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        ),
        created("w1", "w", MachineRole::Worker, MachinePhase::Running),
        created("w2", "w", MachineRole::Worker, MachinePhase::Running),
        created("w3", "w", MachineRole::Worker, MachinePhase::Running),
    ];
    // w1 is back, w2 is still a little late.
    let late = |n: &str| {
        Some(if n == "w2" {
            drover_common::now() - time::Duration::minutes(1)
        } else {
            drover_common::now()
        })
    };
    let steps = plan(&c, &machines, &obs(true, &late));
    assert!(deletes(&steps).is_empty(), "{steps:?}");
    let Some(Step::SetStatus(st)) = steps.last() else {
        panic!("{steps:?}")
    };
    let cond = st
        .conditions
        .iter()
        .find(|c| c.type_ == "RemediationAllowed")
        .unwrap();
    assert_eq!(cond.status, "True");
}

#[test]
fn a_replacement_still_starting_counts_against_max_unhealthy() {
    let mut c = docker_cluster(1, 3);
    c.status.init_machine = Some("i".into());
    c.status.initialized = true;
    let mut old = created("w1", "w", MachineRole::Worker, MachinePhase::Deleted);
    push_event(
        &mut old.status.events,
        "Remediating",
        "deleting to replace it",
    );
    push_event(&mut old.status.events, "ReplacedBy", "replaced by r1");
    old.metadata.deletion_timestamp = Some(drover_common::now());
    let machines = vec![
        created(
            "i",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        ),
        old,
        created("r1", "w", MachineRole::Worker, MachinePhase::Bootstrapping),
        created("w2", "w", MachineRole::Worker, MachinePhase::Running),
        created("w3", "w", MachineRole::Worker, MachinePhase::Running),
    ];
    // w2 went silent a pass after w1: with r1 not Running yet, two of
    // three slots are down.
    let w2_silent = |n: &str| {
        Some(if n == "w2" {
            drover_common::now() - time::Duration::minutes(5)
        } else {
            drover_common::now()
        })
    };
    let steps = plan(&c, &machines, &obs(true, &w2_silent));
    assert!(deletes(&steps).is_empty(), "{steps:?}");
    let cond = condition(status_of(&steps), "RemediationAllowed");
    assert_eq!(cond.status, "False");
    assert!(
        cond.message.contains("r1 being replaced"),
        "{}",
        cond.message
    );
    // Once r1 runs, w2 alone is within the limit.
    let mut machines = machines;
    machines[2].status.phase = MachinePhase::Running;
    assert_eq!(
        deletes(&plan(&c, &machines, &obs(true, &w2_silent))),
        vec!["w2".to_string()]
    );
}

#[test]
fn a_silent_machine_is_replaced_at_its_timeout_unless_others_missed_beats_too() {
    let mut c = docker_cluster(1, 3);
    c.status.init_machine = Some("i".into());
    c.status.initialized = true;
    let machines = vec![
        created(
            "i",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        ),
        created("w1", "w", MachineRole::Worker, MachinePhase::Running),
        created("w2", "w", MachineRole::Worker, MachinePhase::Running),
        created("w3", "w", MachineRole::Worker, MachinePhase::Running),
    ];
    let now = drover_common::now();
    let silent = |w1: i64, w2: i64| {
        move |n: &str| {
            Some(match n {
                "w1" => now - time::Duration::seconds(w1),
                "w2" => now - time::Duration::seconds(w2),
                _ => now,
            })
        }
    };
    // Timeout 40 s, interval 10 s. w1 alone is past its timeout: it is
    // replaced at once, with no wait beyond the timeout.
    let alone = silent(41, 0);
    assert_eq!(
        deletes(&plan(
            &c,
            &machines,
            &Observed {
                now,
                ..obs(true, &alone)
            }
        )),
        vec!["w1".to_string()]
    );
    // w2 was cut off with it and has missed beats for 32 s (late, not
    // yet past its own timeout): two of three count, so nothing is
    // replaced and remediation pauses.
    let together = silent(41, 32);
    let steps = plan(
        &c,
        &machines,
        &Observed {
            now,
            ..obs(true, &together)
        },
    );
    assert!(deletes(&steps).is_empty(), "{steps:?}");
    let status = status_of(&steps);
    let allowed = status
        .conditions
        .iter()
        .find(|c| c.type_ == "RemediationAllowed")
        .expect("RemediationAllowed condition");
    assert_eq!(allowed.status, "False", "{allowed:?}");
    assert!(
        allowed.message.contains("w2 missing heartbeats"),
        "{}",
        allowed.message
    );
}

#[test]
fn a_dead_lone_control_plane_degrades_the_cluster_with_a_stable_status() {
    let mut c = docker_cluster(1, 1);
    c.status.init_machine = Some("i".into());
    c.status.initialized = true;
    c.status.control_plane_endpoint = Some("10.0.0.9:6443".into());
    let machines = vec![
        created(
            "i",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        ),
        created("w1", "w", MachineRole::Worker, MachinePhase::Running),
    ];
    let now = drover_common::now();
    let cp_silent_since = now - time::Duration::minutes(5);
    let cp_silent = |n: &str| Some(if n == "i" { cp_silent_since } else { now });
    let steps = plan(
        &c,
        &machines,
        &Observed {
            now,
            ..obs(true, &cp_silent)
        },
    );
    assert!(deletes(&steps).is_empty(), "{steps:?}");
    assert!(steps.contains(&Step::SetAlive {
        machine: "i".into(),
        alive: false,
        reason: "Silent".into(),
        message: "no heartbeat within the heartbeat timeout (40s)".into(),
    }));
    let st = status_of(&steps).clone();
    assert_eq!(st.phase, ClusterPhase::Degraded);
    let ready = condition(&st, "Ready");
    assert_eq!(ready.reason, "MachinesUnhealthy");
    assert_eq!(ready.message, "control-plane: i silent");
    let allowed = condition(&st, "RemediationAllowed");
    assert_eq!(allowed.status, "False");
    assert_eq!(
        allowed.message,
        "pool control-plane: 1 of 1 machines are unhealthy or being replaced (i silent), more than maxUnhealthy 40% allows (0); remediation paused"
    );
    // A minute later nothing in the status changes: no rewrite per pass.
    c.status = st;
    let later = now + time::Duration::minutes(1);
    let still_silent = |n: &str| Some(if n == "i" { cp_silent_since } else { later });
    let steps = plan(
        &c,
        &machines,
        &Observed {
            now: later,
            ..obs(true, &still_silent)
        },
    );
    assert!(
        !steps.iter().any(|s| matches!(s, Step::SetStatus(_))),
        "{steps:?}"
    );
}

#[test]
fn after_the_init_machine_is_replaced_joins_aim_at_a_live_control_plane() {
    let mut c = docker_cluster(3, 0);
    c.status.init_machine = Some("a".into());
    c.status.initialized = true;
    c.status.control_plane_endpoint = Some("10.0.0.1:6443".into());
    let mut a = created(
        "a",
        CONTROL_PLANE_POOL,
        MachineRole::Init,
        MachinePhase::Deleted,
    );
    a.status.addresses = vec!["10.0.0.1".into()];
    push_event(
        &mut a.status.events,
        "Remediating",
        "deleting to replace it",
    );
    a.metadata.deletion_timestamp = Some(drover_common::now());
    let mut b = created(
        "b",
        CONTROL_PLANE_POOL,
        MachineRole::ControlPlane,
        MachinePhase::Running,
    );
    b.status.addresses = vec!["10.0.0.2".into()];
    let mut cc = created(
        "c",
        CONTROL_PLANE_POOL,
        MachineRole::ControlPlane,
        MachinePhase::Running,
    );
    cc.status.addresses = vec!["10.0.0.3".into()];
    b.metadata.creation_timestamp = Some(drover_common::now() - time::Duration::minutes(2));
    let steps = plan(&c, &[a, b, cc], &obs(true, &seen_now));
    // The replacement joins as a control plane: the cluster is initialized.
    assert!(steps.contains(&Step::CreateMachine {
        machine_pool: CONTROL_PLANE_POOL.into(),
        role: MachineRole::ControlPlane,
        replaces: Some("a".into()),
    }));
    let st = status_of(&steps);
    assert_eq!(st.init_machine, None, "a deleted machine's name stays");
    assert!(st.initialized);
    assert_eq!(st.control_plane_endpoint.as_deref(), Some("10.0.0.2:6443"));
}

#[test]
fn a_provider_machine_deleted_by_an_operator_is_replaced_one_control_plane_at_a_time() {
    let c = initialized_by(docker_cluster(3, 0), "cp1");
    let mut machines = vec![
        created(
            "cp1",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        ),
        created(
            "cp2",
            CONTROL_PLANE_POOL,
            MachineRole::ControlPlane,
            MachinePhase::Running,
        ),
        created(
            "cp3",
            CONTROL_PLANE_POOL,
            MachineRole::ControlPlane,
            MachinePhase::Running,
        ),
    ];
    machines[1].metadata.deletion_timestamp = Some(drover_common::now());
    push_event(
        &mut machines[1].status.events,
        "DeletionRequested",
        "by an operator",
    );
    let steps = plan(&c, &machines, &obs(true, &seen_now));
    assert_eq!(deletes(&steps), vec!["cp2".to_string()]);
    // Its replacement waits for the next pass, when the member of the
    // machine leaving no longer counts as healthy.
    assert_eq!(creates(&steps), vec![]);
    let mut deleting = machines.clone();
    deleting[1].status.phase = MachinePhase::Deleting;
    // Its member, last reported healthy, holds the join until removed.
    let mut reported = c.clone();
    reported.status.etcd_members = healthy_members(&["cp1", "cp2", "cp3"]);
    for m in &mut deleting {
        m.status.hostname = m.metadata.name.clone();
    }
    assert_eq!(
        creates(&plan(&reported, &deleting, &obs(true, &seen_now))),
        vec![]
    );
    reported.status.etcd_members.remove(1);
    assert_eq!(
        creates(&plan(&reported, &deleting, &obs(true, &seen_now))),
        vec![(CONTROL_PLANE_POOL.to_string(), MachineRole::ControlPlane)]
    );
    let steps = plan(&c, &deleting, &obs(true, &seen_now));
    assert_eq!(
        creates(&steps),
        vec![(CONTROL_PLANE_POOL.to_string(), MachineRole::ControlPlane)]
    );
    assert!(steps.iter().any(|s| matches!(
        s,
        Step::CreateMachine { replaces: Some(r), .. } if r == "cp2"
    )));
    // While another control plane still joins, the requested one waits.
    machines[2].status.phase = MachinePhase::Bootstrapping;
    assert!(deletes(&plan(&c, &machines, &obs(true, &seen_now))).is_empty());
}

#[test]
fn a_control_plane_joins_only_once_the_last_ones_learner_is_promoted() {
    // kubeadm 1.29+ adds a joining member as a learner and promotes it
    // once in sync; etcd takes one learner at a time, so the next
    // control plane waits for the promotion.
    let c = initialized_by(docker_cluster(3, 0), "cp1");
    let machines: Vec<Machine> = [
        ("cp1", MachineRole::Init),
        ("cp2", MachineRole::ControlPlane),
    ]
    .iter()
    .map(|(name, role)| {
        let mut m = created(name, CONTROL_PLANE_POOL, *role, MachinePhase::Running);
        m.status.hostname = m.metadata.name.clone();
        m
    })
    .collect();
    let mut reported = c.clone();
    reported.status.etcd_members = healthy_members(&["cp1", "cp2"]);
    reported.status.etcd_members[1].is_learner = true;
    assert_eq!(
        creates(&plan(&reported, &machines, &obs(true, &seen_now))),
        vec![],
        "a learner is a join under way"
    );
    // Promoted: the next control plane joins.
    reported.status.etcd_members[1].is_learner = false;
    assert_eq!(
        creates(&plan(&reported, &machines, &obs(true, &seen_now))),
        vec![(CONTROL_PLANE_POOL.to_string(), MachineRole::ControlPlane)]
    );
}

#[test]
fn a_new_version_control_plane_joins_only_once_kubeadm_config_names_its_version() {
    let mut c = initialized_by(docker_cluster(3, 0), "cp1");
    c.spec.kubernetes_version = "v1.32.0".into();
    let roles = [
        ("cp1", MachineRole::Init),
        ("cp2", MachineRole::ControlPlane),
        ("cp3", MachineRole::ControlPlane),
    ];
    let machines: Vec<Machine> = roles
        .iter()
        .map(|(name, role)| {
            let mut m = created(name, CONTROL_PLANE_POOL, *role, MachinePhase::Running);
            m.status.hostname = m.metadata.name.clone();
            m.spec.assignment.as_mut().unwrap().kubernetes_version = Some("v1.31.2".into());
            m
        })
        .collect();
    c.status.etcd_members = healthy_members(&["cp1", "cp2", "cp3"]);
    c.status.kubeadm_config_version = Some("v1.31.2".into());
    // The surge control plane would deploy v1.31.2: the config changes
    // first, through a running control plane.
    let steps = plan(&c, &machines, &obs(true, &seen_now));
    assert_eq!(creates(&steps), vec![]);
    let update = status_of(&steps).version_update.clone().expect("asked for");
    assert_eq!(
        (update.version.as_str(), update.via.as_str()),
        ("v1.32.0", "cp1")
    );
    // Asked once: a later pass keeps the same request (and directive).
    c.status.version_update = Some(update.clone());
    let steps = plan(&c, &machines, &obs(true, &seen_now));
    assert!(steps.iter().all(|s| match s {
        Step::SetStatus(st) => st.version_update.as_ref() == Some(&update),
        _ => true,
    }));
    // Once a control plane reports the new version, it joins, and the
    // request is dropped; not while the endpoint does not answer.
    c.status.kubeadm_config_version = Some("v1.32.0".into());
    c.status.endpoint_ready = Some(false);
    assert_eq!(creates(&plan(&c, &machines, &obs(true, &seen_now))), vec![]);
    c.status.endpoint_ready = Some(true);
    let steps = plan(&c, &machines, &obs(true, &seen_now));
    assert_eq!(
        creates(&steps),
        vec![(CONTROL_PLANE_POOL.to_string(), MachineRole::ControlPlane)]
    );
    assert_eq!(status_of(&steps).version_update, None);
}
