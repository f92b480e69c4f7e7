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
        spot: None,
    };
    let aws = |lb: Option<AwsLoadBalancerSpec>| {
        let mut c = pool_cluster(3, 0);
        c.spec.provider = ProviderSpec::Aws(Box::new(AwsProviderSpec {
            region: "us-east-1".into(),
            tags: BTreeMap::new(),
            control_plane: template.clone(),
            worker_pools: BTreeMap::from([("w".into(), template.clone())]),
            load_balancer: lb,
        }));
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
    c.status.load_balancer = Some(docker_load_balancer(&[]));
    let steps = plan(&c, &[], &o);
    assert_eq!(
        creates(&steps),
        vec![(CONTROL_PLANE_POOL.to_owned(), MachineRole::Init)]
    );
    assert_eq!(
        status_of(&steps).control_plane_endpoint.as_deref(),
        Some("172.18.0.2:6443")
    );

    // Control planes are backends from the moment they bootstrap, set
    // before anything else of the pass.
    let mut machines = created_control_planes(&["cp1", "cp2"]);
    machines[1].status.phase = MachinePhase::Bootstrapping;
    for (m, ip) in machines.iter_mut().zip(["10.0.0.1", "10.0.0.2"]) {
        m.status.addresses = vec![ip.into()];
    }
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
    assert!(!sets_backends(&steps), "{steps:?}");

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
    c.status.load_balancer = Some(docker_load_balancer(&["10.0.0.1:6443"]));
    c.status.control_plane_endpoint = Some("172.18.0.2:6443".into());
    let mut machines = vec![
        created_cp("cp1", MachineRole::Init),
        created("w1", "default", MachineRole::Worker, MachinePhase::Running),
    ];
    machines[0].status.addresses = vec!["10.0.0.1".into()];
    hostnames_are_names(&mut machines);
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
    let cond = condition(&st, "EndpointAvailable");
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
    assert!(has_condition(&st, "EndpointAvailable", "True"), "{st:?}");
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
    let machines = vec![created_cp("cp1", MachineRole::Init), pending];
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
    c.status.load_balancer = Some(docker_load_balancer(&[]));
    assert_eq!(
        creates(&plan_now(&c, &[])),
        vec![
            (CONTROL_PLANE_POOL.to_string(), MachineRole::Init),
            ("w".to_string(), MachineRole::Worker),
            ("w".to_string(), MachineRole::Worker)
        ]
    );
    // With the init machine recorded but not running, no other control plane yet.
    let mut c = docker_cluster(3, 0);
    c.status.init_machine = Some("i".into());
    let mut init = created_cp("i", MachineRole::Init);
    init.status.phase = MachinePhase::Bootstrapping;
    assert!(creates(&plan_now(&c, &[init])).is_empty());
}

#[test]
fn stopped_worker_is_replaced() {
    let c = initialized_docker(1, 3);
    let machines = init_i_and_workers(&["w1", "w2", "w3"]);
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

/// Plans `c` with the machines named in `silent` unheard for `ago`.
fn plan_with_silent(
    c: &Cluster,
    machines: &[Machine],
    silent: &[&str],
    ago: time::Duration,
) -> Vec<Step> {
    let now = drover_common::now();
    plan_at(c, machines, now, &heard_but(now, silent, ago))
}

/// Asserts the steps delete nothing and pause remediation, the
/// `RemediationAllowed` condition's message containing `why`.
fn assert_remediation_paused(steps: &[Step], why: &str) {
    assert!(deletes(steps).is_empty(), "{steps:?}");
    assert_condition(status_of(steps), "RemediationAllowed", "False", why);
}

#[test]
fn too_many_unhealthy_pauses_remediation() {
    let c = initialized_docker(1, 2);
    let machines = init_i_and_workers(&["w1", "w2"]);
    let steps = plan_with_silent(&c, &machines, &["w1", "w2"], time::Duration::minutes(5));
    assert_remediation_paused(&steps, "remediation paused");
}

#[test]
fn lone_initialized_control_plane_is_not_remediated() {
    let c = initialized_docker(1, 0);
    let machines = init_i_and_workers(&[]);
    let steps = plan_with_silent(&c, &machines, &["i"], time::Duration::minutes(5));
    assert!(deletes(&steps).is_empty(), "{steps:?}");
}

#[test]
fn three_control_planes_remediate_one_keeping_quorum() {
    let c = initialized_by(docker_cluster(3, 0), "a");
    let machines = created_control_planes(&["a", "b", "c"]);
    let five_minutes = time::Duration::minutes(5);
    assert_eq!(
        deletes(&plan_with_silent(&c, &machines, &["c"], five_minutes)),
        vec!["c".to_string()]
    );
    // Two of three unhealthy: over maxUnhealthy, and quorum would break anyway.
    assert!(deletes(&plan_with_silent(&c, &machines, &["b", "c"], five_minutes)).is_empty());
}

#[test]
fn a_silent_control_plane_whose_member_etcd_needs_is_not_remediated() {
    // cp3 is silent, but etcd, as cp1 reports it, says cp3's member is
    // healthy and cp2's is down (its etcd crashed under a living agent):
    // two of three machines look healthy, yet taking cp3 out would leave
    // etcd one healthy voter of two.
    let mut c = initialized_by(docker_cluster(3, 0), "cp1");
    let mut machines = created_control_planes(&["cp1", "cp2", "cp3"]);
    hostnames_are_names(&mut machines);
    c.status.etcd_members = healthy_members(&["cp1", "cp2", "cp3"]);
    c.status.etcd_members[1].healthy = false;
    let five_minutes = time::Duration::minutes(5);
    let steps = plan_with_silent(&c, &machines, &["cp3"], five_minutes);
    assert!(deletes(&steps).is_empty(), "{steps:?}");
    assert_remediation_paused(
        &steps,
        "would break etcd quorum (etcd reports 1 other healthy of 3 voting members)",
    );
    // Once etcd says cp3's member is down too, removing it costs etcd
    // nothing: cp3 is replaced.
    c.status.etcd_members[2].healthy = false;
    assert_eq!(
        deletes(&plan_with_silent(&c, &machines, &["cp3"], five_minutes)),
        vec!["cp3".to_string()]
    );
    // An operator's deletion of a healthy cp3 waits the same way.
    c.status.etcd_members[2].healthy = true;
    machines[2].metadata.deletion_timestamp = Some(drover_common::now());
    push_event(
        &mut machines[2].status.events,
        "DeletionRequested",
        "by an operator",
    );
    let steps = plan_now(&c, &machines);
    assert!(deletes(&steps).is_empty(), "{steps:?}");
    assert_eq!(final_status(&steps).etcd_removal, None, "{steps:?}");
    // With cp2's member healthy again, cp3's member is asked to leave
    // first.
    c.status.etcd_members[1].healthy = true;
    let steps = plan_now(&c, &machines);
    let removal = final_status(&steps).etcd_removal;
    assert_eq!(
        removal.map(|r| r.name),
        Some("cp3".to_string()),
        "{steps:?}"
    );
}

#[test]
fn scale_down_removes_newest_worker() {
    let c = initialized_docker(1, 1);
    let mut machines = init_i_and_workers(&["w1", "w2"]);
    machines[1].metadata.creation_timestamp = Some(drover_common::now() - time::Duration::hours(1));
    assert_eq!(deletes(&plan_now(&c, &machines)), vec!["w2".to_string()]);
}

#[test]
fn no_remediation_in_the_pass_that_ends_a_pause() {
    let mut c = initialized_docker(1, 3);
    set_condition(
        &mut c.status.conditions,
        "RemediationAllowed",
        false,
        "RemediationPaused",
        "x",
    );
    let machines = init_i_and_workers(&["w1", "w2", "w3"]);
    // w1 is back, w2 is still a little late.
    let steps = plan_with_silent(&c, &machines, &["w2"], time::Duration::minutes(1));
    assert!(deletes(&steps).is_empty(), "{steps:?}");
    assert!(
        has_condition(&final_status(&steps), "RemediationAllowed", "True"),
        "{steps:?}"
    );
}

/// `m` deleted by remediation, to be replaced.
fn deleted_to_replace(m: &mut Machine) {
    m.status.phase = MachinePhase::Deleted;
    push_event(
        &mut m.status.events,
        "Remediating",
        "deleting to replace it",
    );
    m.metadata.deletion_timestamp = Some(drover_common::now());
}

#[test]
fn a_replacement_still_starting_counts_against_max_unhealthy() {
    let c = initialized_docker(1, 3);
    let mut machines = init_i_and_workers(&["w1", "r1", "w2", "w3"]);
    deleted_to_replace(&mut machines[1]);
    push_event(
        &mut machines[1].status.events,
        "ReplacedBy",
        "replaced by r1",
    );
    machines[2].status.phase = MachinePhase::Bootstrapping;
    // w2 went silent a pass after w1: with r1 not Running yet, two of
    // three slots are down.
    let five_minutes = time::Duration::minutes(5);
    let steps = plan_with_silent(&c, &machines, &["w2"], five_minutes);
    assert_remediation_paused(&steps, "r1 being replaced");
    // Once r1 runs, w2 alone is within the limit.
    machines[2].status.phase = MachinePhase::Running;
    assert_eq!(
        deletes(&plan_with_silent(&c, &machines, &["w2"], five_minutes)),
        vec!["w2".to_string()]
    );
}

#[test]
fn a_silent_machine_is_replaced_at_its_timeout_unless_others_missed_beats_too() {
    let c = initialized_docker(1, 3);
    let machines = init_i_and_workers(&["w1", "w2", "w3"]);
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
    assert_eq!(
        deletes(&plan_at(&c, &machines, now, &silent(41, 0))),
        vec!["w1".to_string()]
    );
    // w2 was cut off with it and has missed beats for 32 s (late, not
    // yet past its own timeout): two of three count, so nothing is
    // replaced and remediation pauses.
    let steps = plan_at(&c, &machines, now, &silent(41, 32));
    assert_remediation_paused(&steps, "w2 missing heartbeats");
}

#[test]
fn a_dead_lone_control_plane_degrades_the_cluster_with_a_stable_status() {
    let mut c = initialized_docker(1, 1);
    c.status.control_plane_endpoint = Some("10.0.0.9:6443".into());
    let machines = init_i_and_workers(&["w1"]);
    let now = drover_common::now();
    let cp_silent_since = now - time::Duration::minutes(5);
    let cp_silent = |n: &str| Some(if n == "i" { cp_silent_since } else { now });
    let steps = plan_at(&c, &machines, now, &cp_silent);
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
    let steps = plan_at(&c, &machines, later, &still_silent);
    assert!(
        !steps.iter().any(|s| matches!(s, Step::SetStatus(_))),
        "{steps:?}"
    );
}

#[test]
fn after_the_init_machine_is_replaced_joins_aim_at_a_live_control_plane() {
    let mut c = initialized_by(docker_cluster(3, 0), "a");
    c.status.control_plane_endpoint = Some("10.0.0.1:6443".into());
    let mut machines = created_control_planes(&["a", "b", "c"]);
    for (m, ip) in machines
        .iter_mut()
        .zip(["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    {
        m.status.addresses = vec![ip.into()];
    }
    deleted_to_replace(&mut machines[0]);
    machines[1].metadata.creation_timestamp =
        Some(drover_common::now() - time::Duration::minutes(2));
    let steps = plan_now(&c, &machines);
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
    let mut machines = created_control_planes(&["cp1", "cp2", "cp3"]);
    machines[1].metadata.deletion_timestamp = Some(drover_common::now());
    push_event(
        &mut machines[1].status.events,
        "DeletionRequested",
        "by an operator",
    );
    let steps = plan_now(&c, &machines);
    assert_eq!(deletes(&steps), vec!["cp2".to_string()]);
    // Its replacement waits for the next pass, when the member of the
    // machine leaving no longer counts as healthy.
    assert_eq!(creates(&steps), vec![]);
    let mut deleting = machines.clone();
    deleting[1].status.phase = MachinePhase::Deleting;
    // Its member, last reported healthy, holds the join until removed.
    let mut reported = c.clone();
    reported.status.etcd_members = healthy_members(&["cp1", "cp2", "cp3"]);
    hostnames_are_names(&mut deleting);
    assert_eq!(creates(&plan_now(&reported, &deleting)), vec![]);
    reported.status.etcd_members.remove(1);
    let joins = vec![(CONTROL_PLANE_POOL.to_string(), MachineRole::ControlPlane)];
    assert_eq!(creates(&plan_now(&reported, &deleting)), joins);
    let steps = plan_now(&c, &deleting);
    assert_eq!(creates(&steps), joins);
    assert!(steps.iter().any(|s| matches!(
        s,
        Step::CreateMachine { replaces: Some(r), .. } if r == "cp2"
    )));
    // While another control plane still joins, the requested one waits.
    machines[2].status.phase = MachinePhase::Bootstrapping;
    assert!(deletes(&plan_now(&c, &machines)).is_empty());
}

#[test]
fn a_control_plane_joins_only_once_the_last_ones_learner_is_promoted() {
    // kubeadm 1.29+ adds a joining member as a learner and promotes it
    // once in sync; etcd takes one learner at a time, so the next
    // control plane waits for the promotion.
    let c = initialized_by(docker_cluster(3, 0), "cp1");
    let mut machines = created_control_planes(&["cp1", "cp2"]);
    hostnames_are_names(&mut machines);
    let mut reported = c.clone();
    reported.status.etcd_members = healthy_members(&["cp1", "cp2"]);
    reported.status.etcd_members[1].is_learner = true;
    assert_eq!(
        creates(&plan_now(&reported, &machines)),
        vec![],
        "a learner is a join under way"
    );
    // Promoted: the next control plane joins.
    reported.status.etcd_members[1].is_learner = false;
    assert_eq!(
        creates(&plan_now(&reported, &machines)),
        vec![(CONTROL_PLANE_POOL.to_string(), MachineRole::ControlPlane)]
    );
}

/// A docker cluster of three running control planes made for v1.31.2,
/// whose spec now names v1.32.0.
fn three_control_planes_to_upgrade() -> (Cluster, Vec<Machine>) {
    let mut c = initialized_by(docker_cluster(3, 0), "cp1");
    c.spec.kubernetes_version = "v1.32.0".into();
    let mut machines = created_control_planes(&["cp1", "cp2", "cp3"]);
    hostnames_are_names(&mut machines);
    for m in &mut machines {
        m.spec.assignment.as_mut().unwrap().kubernetes_version = Some("v1.31.2".into());
    }
    c.status.etcd_members = healthy_members(&["cp1", "cp2", "cp3"]);
    c.status.kubeadm_config_version = Some("v1.31.2".into());
    (c, machines)
}

#[test]
fn a_new_version_control_plane_joins_only_once_kubeadm_config_names_its_version() {
    let (mut c, machines) = three_control_planes_to_upgrade();
    // The surge control plane would deploy v1.31.2: the config changes
    // first, through a running control plane.
    let steps = plan_now(&c, &machines);
    assert_eq!(creates(&steps), vec![]);
    let update = status_of(&steps).version_update.clone().expect("asked for");
    assert_eq!(
        (update.version.as_str(), update.via.as_str()),
        ("v1.32.0", "cp1")
    );
    // Asked once: a later pass keeps the same request (and directive).
    c.status.version_update = Some(update.clone());
    let steps = plan_now(&c, &machines);
    assert!(steps.iter().all(|s| match s {
        Step::SetStatus(st) => st.version_update.as_ref() == Some(&update),
        _ => true,
    }));
    // Once a control plane reports the new version, it joins, and the
    // request is dropped; not while the endpoint does not answer.
    c.status.kubeadm_config_version = Some("v1.32.0".into());
    c.status.endpoint_ready = Some(false);
    assert_eq!(creates(&plan_now(&c, &machines)), vec![]);
    c.status.endpoint_ready = Some(true);
    let steps = plan_now(&c, &machines);
    assert_eq!(
        creates(&steps),
        vec![(CONTROL_PLANE_POOL.to_string(), MachineRole::ControlPlane)]
    );
    assert_eq!(status_of(&steps).version_update, None);
}

#[test]
fn a_control_plane_upgrade_waits_for_a_snapshot_saved_before_it() {
    let (mut c, machines) = three_control_planes_to_upgrade();
    c.spec.backup = Some(Default::default());
    // Nothing of the upgrade starts (not even kubeadm-config's version):
    // a snapshot is asked first, and the rollout says it waits for it.
    let steps = plan_now(&c, &machines);
    assert_eq!(creates(&steps), vec![]);
    let st = status_of(&steps);
    assert_eq!(st.version_update, None);
    let op = st.snapshot.clone().expect("a snapshot asked");
    assert_eq!(
        op.trigger,
        drover_common::api::SnapshotTrigger::BeforeUpgrade
    );
    let before = op.before.clone().unwrap();
    assert!(before.starts_with("upgrade to v1.32.0"), "{before}");
    let waiting = st.rollout.as_ref().and_then(|r| r.waiting_for.clone());
    assert!(
        waiting
            .as_deref()
            .is_some_and(|w| w.contains("a snapshot of etcd before the upgrade")),
        "{waiting:?}"
    );
    // Saved: the upgrade goes ahead with its first step.
    c.status.snapshot_taken_before = Some(before);
    let steps = plan_now(&c, &machines);
    assert!(status_of(&steps).version_update.is_some(), "{steps:?}");
    assert_eq!(status_of(&steps).snapshot, None);
}

/// A restore recorded on the status (as `drover restore cluster` leaves
/// it: not initialized, no init machine, nothing reported) first deletes
/// the control planes of before, whatever quorum says, with remediation
/// paused; once they are gone, one init machine is created (it restores
/// the snapshot); once it runs, the restore is done and the cluster is
/// initialized again.
#[test]
fn a_restore_replaces_the_old_control_planes_by_one_init_machine_and_ends_when_it_runs() {
    let mut c = restoring(initialized_docker(3, 1), &["i", "b", "d"]);
    c.status.load_balancer = Some(docker_load_balancer(&[]));
    let mut machines = created_control_planes(&["i", "b", "d"]);
    machines.extend(created_workers(&["w1"]));

    // The old control planes are silent: all three go at once, and the
    // silent worker is not remediated meanwhile.
    let steps = plan_silent(&c, &machines, &["i", "b", "d", "w1"]);
    let mut gone = deletes(&steps);
    gone.sort();
    assert_eq!(gone, vec!["b", "d", "i"], "{steps:?}");
    assert!(creates(&steps).is_empty(), "{steps:?}");
    let st = status_of(&steps);
    assert_restoring(st, "removing the control planes of before");
    assert_condition(st, "RemediationAllowed", "False", "etcd is being restored");
    assert!(!st.initialized);

    // Gone: one init machine, and only one.
    for m in machines.iter_mut().take(3) {
        m.status.phase = MachinePhase::Deleted;
    }
    let steps = plan_now(&c, &machines);
    assert_eq!(
        creates(&steps),
        vec![(CONTROL_PLANE_POOL.to_owned(), MachineRole::Init)],
        "{steps:?}"
    );
    assert!(deletes(&steps).is_empty());

    // Named and bootstrapping: the restore names it and waits.
    c.status.init_machine = Some("n".into());
    let mut n = created_cp("n", MachineRole::Init);
    n.status.phase = MachinePhase::Bootstrapping;
    machines.push(n);
    let steps = plan_now(&c, &machines);
    assert!(creates(&steps).is_empty(), "{steps:?}");
    let st = status_of(&steps);
    assert_eq!(
        st.restore.as_ref().and_then(|r| r.machine.as_deref()),
        Some("n")
    );
    assert_restoring(st, "init machine n restores it");

    // Running: done.
    machines.last_mut().unwrap().status.phase = MachinePhase::Running;
    let steps = plan_now(&c, &machines);
    let st = status_of(&steps);
    assert!(st.restore.is_none(), "{st:?}");
    assert!(st.initialized);
    let done = st.last_restore.as_ref().expect("lastRestore");
    assert_eq!(
        (done.snapshot.as_str(), done.machine.as_str(), done.revision),
        ("c-20261128-000000", "n", 42)
    );
    assert_condition(
        st,
        "Restoring",
        "False",
        "restored from snapshot c-20261128-000000",
    );
}

/// An init machine whose restore failed says so, with what to do, in the
/// `Restoring` condition, and is not remediated: its failure is kept to
/// read.
#[test]
fn a_failed_restore_says_where_and_waits_for_the_operator() {
    use drover_common::api::{BootstrapReport, CommandFailure};
    let mut c = restoring(initialized_docker(1, 0), &["i"]);
    c.status.load_balancer = Some(docker_load_balancer(&[]));
    c.status.restore.as_mut().unwrap().machine = Some("n".into());
    c.status.init_machine = Some("n".into());
    let mut n = created_cp("n", MachineRole::Init);
    n.status.phase = MachinePhase::Failed;
    n.status.bootstrap = Some(BootstrapReport {
        step: "etcd-restore".into(),
        failure: Some(CommandFailure {
            command: "restore etcd from snapshot c-20261128-000000 into /var/lib/etcd".into(),
            exit_code: Some(1),
            output_tail: vec![
                "snapshot c-20261128-000000 does not restore: it opens to 3 bytes".into(),
            ],
            at: t0(),
        }),
    });
    let steps = plan_now(&c, &[n]);
    assert!(deletes(&steps).is_empty(), "{steps:?}");
    assert!(creates(&steps).is_empty(), "{steps:?}");
    let st = status_of(&steps);
    assert_restoring(
        st,
        "init machine n failed at etcd-restore: snapshot c-20261128-000000 does not restore",
    );
    assert_restoring(st, "drover delete machine n");
}

#[test]
fn a_worker_whose_node_went_missing_is_replaced_after_the_unhealthy_timeout() {
    let mut c = initialized_docker(1, 3);
    let mut machines = init_i_and_workers(&["w1", "w2", "w3"]);
    hostnames_are_names(&mut machines);
    let now = drover_common::now();
    // The Nodes a control plane reports: no w2 (its Node is not in a
    // restored etcd, or was deleted).
    c.status.nodes = ["i", "w1", "w3"]
        .iter()
        .map(|n| cluster_node(n, "True"))
        .collect();
    let node_found = |steps: &[Step]| -> Vec<(String, bool)> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::SetNodeFound { machine, found, .. } => Some((machine.clone(), *found)),
                _ => None,
            })
            .collect()
    };
    // w2 became Running a moment ago: the next report lists it; nothing
    // is said yet.
    push_event(
        &mut machines[2].status.events,
        "Bootstrapped",
        "kubeadm finished",
    );
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert!(node_found(&steps).is_empty(), "{steps:?}");
    // Running for longer than the heartbeat timeout (40 s): missing.
    machines[2].status.events[0].time = now - time::Duration::minutes(5);
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert_eq!(node_found(&steps), vec![("w2".to_string(), false)]);
    assert!(deletes(&steps).is_empty(), "{steps:?}");
    // Missing for less than the unhealthy timeout (2 m): kept.
    let missing_since = |m: &mut Machine, ago: time::Duration| {
        set_condition(
            &mut m.status.conditions,
            crate::health::NODE_FOUND_CONDITION,
            false,
            "NodeMissing",
            "no Node w2",
        );
        let c = m.status.conditions.iter_mut();
        c.filter(|c| c.type_ == crate::health::NODE_FOUND_CONDITION)
            .for_each(|c| c.last_transition_time = now - ago);
    };
    missing_since(&mut machines[2], time::Duration::seconds(60));
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert!(node_found(&steps).is_empty(), "{steps:?}");
    assert!(deletes(&steps).is_empty(), "{steps:?}");
    // Past it: replaced, and the reason says why.
    missing_since(&mut machines[2], time::Duration::seconds(121));
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert_eq!(deletes(&steps), vec!["w2".to_string()]);
    let reason = steps
        .iter()
        .find_map(|s| match s {
            Step::DeleteMachine { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .unwrap();
    assert!(
        reason.starts_with("unhealthy: its Node has been missing from the cluster for 121s"),
        "{reason}"
    );
    assert_eq!(
        crate::health::remediation_class(&reason),
        "node_missing",
        "{reason}"
    );
    // Its Node is back before then: the condition goes True.
    missing_since(&mut machines[2], time::Duration::seconds(60));
    c.status.nodes.push(cluster_node("w2", "True"));
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert_eq!(node_found(&steps), vec![("w2".to_string(), true)]);
    // With no report, or while etcd is restored, nothing is said or
    // judged of Nodes.
    c.status.nodes.clear();
    missing_since(&mut machines[2], time::Duration::seconds(600));
    let steps = plan_at(&c, &machines, now, &seen_now);
    assert!(node_found(&steps).is_empty(), "{steps:?}");
    assert!(deletes(&steps).is_empty(), "{steps:?}");
}

/// Drill cluster `c` (docker, one control plane) as the coordinator makes
/// it: restoring snapshot `src-20261128-000000` of cluster `src`, started
/// at `started`.
fn drill_cluster(started: time::OffsetDateTime) -> Cluster {
    use drover_common::api::{DrillOf, DrillTrigger, RestoreSource};
    let mut c = restoring(docker_cluster(1, 0), &[]);
    c.status.load_balancer = Some(docker_load_balancer(&[]));
    let source = RestoreSource {
        cluster: "src".into(),
        uid: "src-uid".into(),
    };
    c.status.restore.as_mut().unwrap().source = Some(source.clone());
    c.status.drill_of = Some(DrillOf {
        source,
        snapshot: "src-20261128-000000".into(),
        revision: 42,
        trigger: DrillTrigger::Manual,
        started_at: started,
        inventory: None,
        failed: None,
    });
    c
}

/// The drill's end, if a pass planned it.
fn drill_end(steps: &[Step]) -> Option<&drover_common::api::DrillDone> {
    steps.iter().find_map(|s| match s {
        Step::FinishDrill { done } => Some(&**done),
        _ => None,
    })
}

/// A drill cluster comes up as a restore's first init machine; once the
/// restore is done its control plane is asked for the inventory, and once
/// that is reported the drill ends, passed, with it.
#[test]
fn a_drill_cluster_is_inventoried_once_restored_then_ends() {
    use drover_common::api::Inventory;
    let now = drover_common::now();
    let mut c = drill_cluster(now);
    let steps = plan_at(&c, &[], now, &seen_now);
    assert_eq!(
        creates(&steps),
        vec![(CONTROL_PLANE_POOL.to_owned(), MachineRole::Init)],
        "{steps:?}"
    );
    assert!(drill_end(&steps).is_none(), "{steps:?}");

    // Running: the restore is done this pass, the inventory asked the next.
    c.status.init_machine = Some("n".into());
    let machines = vec![created_cp("n", MachineRole::Init)];
    let steps = plan_at(&c, &machines, now, &seen_now);
    let st = status_of(&steps).clone();
    assert!(st.restore.is_none() && st.initialized, "{st:?}");
    assert!(st.drill_of.as_ref().unwrap().inventory.is_none());
    c.status = st;
    let steps = plan_at(&c, &machines, now, &seen_now);
    let st = status_of(&steps).clone();
    let ask = st.drill_of.as_ref().unwrap().inventory.clone().unwrap();
    assert_eq!(ask.via, "n");
    assert!(ask.under_way());
    assert!(drill_end(&steps).is_none(), "{steps:?}");

    // Reported: the drill ends, passed, with what was found.
    c.status = st;
    let inventory = Inventory {
        namespaces: vec!["default".into(), "kept".into()],
        objects: [("configmaps".to_string(), 3u64)].into_iter().collect(),
        total: 3,
        revision: 50,
    };
    c.status
        .drill_of
        .as_mut()
        .unwrap()
        .inventory
        .as_mut()
        .unwrap()
        .result = Some(inventory.clone());
    let steps = plan_at(&c, &machines, now, &seen_now);
    let done = drill_end(&steps).expect("the drill ends");
    assert!(done.ok, "{done:?}");
    assert_eq!(done.inventory.as_ref(), Some(&inventory));
    assert!(
        done.message
            .contains("snapshot src-20261128-000000 (revision 42) of cluster src restored into c"),
        "{}",
        done.message
    );
    assert!(
        done.message.contains("2 namespace(s), 3 object(s)"),
        "{}",
        done.message
    );

    // A drill being deleted plans no end again.
    c.metadata.deletion_timestamp = Some(now);
    assert!(drill_end(&plan_at(&c, &machines, now, &seen_now)).is_none());
}

/// A drill fails, and ends, when its init machine fails, when its
/// inventory fails, or when it does not come up in time.
#[test]
fn a_drill_that_cannot_restore_fails_and_ends() {
    use drover_common::api::{BootstrapReport, CommandFailure, DRILL_TIMEOUT};
    let now = drover_common::now();
    let mut c = drill_cluster(now);
    c.status.init_machine = Some("n".into());
    let mut n = created_cp("n", MachineRole::Init);
    n.status.phase = MachinePhase::Failed;
    n.status.bootstrap = Some(BootstrapReport {
        step: "etcd-restore".into(),
        failure: Some(CommandFailure {
            command: "restore etcd".into(),
            exit_code: Some(1),
            output_tail: vec!["it opens to 3 bytes".into()],
            at: now,
        }),
    });
    let steps = plan_at(&c, &[n], now, &seen_now);
    let done = drill_end(&steps).expect("the drill ends");
    assert!(!done.ok);
    assert!(
        done.message
            .contains("did not restore: machine n failed at etcd-restore: it opens to 3 bytes"),
        "{}",
        done.message
    );

    // Still bootstrapping when the time is up.
    let mut n = created_cp("n", MachineRole::Init);
    n.status.phase = MachinePhase::Bootstrapping;
    let machines = vec![n];
    assert!(drill_end(&plan_at(&c, &machines, now, &seen_now)).is_none());
    let late = now + DRILL_TIMEOUT;
    let done = drill_end(&plan_at(&c, &machines, late, &|_| Some(late)))
        .expect("the drill ends")
        .clone();
    assert!(!done.ok);
    assert!(
        done.message.contains("did not come up within 45 minutes"),
        "{}",
        done.message
    );

    // The inventory failed.
    c.status.restore = None;
    c.status.initialized = true;
    c.status.drill_of.as_mut().unwrap().inventory = Some(drover_common::api::InventoryAsk {
        via: "n".into(),
        requested_at: now,
        result: None,
        error: Some("list namespaces failed".into()),
    });
    let steps = plan_at(&c, &[created_cp("n", MachineRole::Init)], now, &seen_now);
    let done = drill_end(&steps).expect("the drill ends");
    assert!(!done.ok);
    assert!(
        done.message
            .contains("its inventory failed on n: list namespaces failed"),
        "{}",
        done.message
    );
}

/// `spec.backup.drill` starts a drill into `<name>-drill` once due, when
/// the cluster has a snapshot and no drill under way, and not before.
#[test]
fn a_scheduled_drill_starts_when_due_with_a_snapshot_and_none_under_way() {
    use drover_common::api::{
        BackupSpec, DrillDone, DrillSchedule, DrillTrigger, DrillUnderWay, SnapshotRef,
    };
    let now = drover_common::now();
    let mut c = initialized_docker(1, 0);
    c.status.load_balancer = Some(docker_load_balancer(&[]));
    c.metadata.creation_timestamp = Some(now - time::Duration::hours(2));
    c.spec.backup = Some(BackupSpec {
        drill: Some(DrillSchedule { every: "1h".into() }),
        ..Default::default()
    });
    let machines = vec![created_cp("i", MachineRole::Init)];
    let starts = |c: &Cluster, at| {
        plan_at(c, &machines, at, &|_| Some(at))
            .into_iter()
            .filter_map(|s| match s {
                Step::StartDrill { into } => Some(into),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    // No snapshot yet: nothing to drill.
    assert!(starts(&c, now).is_empty());
    assert_eq!(crate::drill_due_at(&c), None);
    c.status.last_snapshot = Some(SnapshotRef {
        name: "c-20261128-000000".into(),
        saved_at: now,
        revision: 7,
        size: 10,
    });
    assert_eq!(starts(&c, now), vec!["c-drill".to_string()]);
    // Under way: no second one.
    c.status.drill = Some(DrillUnderWay {
        cluster: "c-drill".into(),
        snapshot: "c-20261128-000000".into(),
        trigger: DrillTrigger::Scheduled,
        started_at: now,
    });
    assert!(starts(&c, now).is_empty());
    // Ended: the next is due an hour after it started.
    c.status.drill = None;
    c.status.last_drill = Some(DrillDone {
        cluster: "c-drill".into(),
        snapshot: "c-20261128-000000".into(),
        revision: 7,
        trigger: DrillTrigger::Scheduled,
        started_at: now,
        completed_at: now,
        ok: true,
        message: String::new(),
        inventory: None,
    });
    assert!(starts(&c, now + time::Duration::minutes(59)).is_empty());
    assert_eq!(
        starts(&c, now + time::Duration::hours(1)),
        vec!["c-drill".to_string()]
    );
    assert_eq!(
        crate::drill_name(&"x".repeat(60)),
        format!("{}-drill", "x".repeat(48))
    );
}

#[test]
fn a_worker_the_autoscaler_takes_out_is_deleted_unreplaced() {
    let mut c = initialized_docker(1, 2);
    let mut machines = init_i_and_workers(&["w1", "w2"]);
    machines[1].metadata.annotations.insert(
        drover_common::names::SCALE_DOWN_ANNOTATION.into(),
        "cluster-autoscaler".into(),
    );
    c.spec.worker_pools[0].replicas = 1;
    let steps = plan_now(&c, &machines);
    assert_eq!(deletes(&steps), vec!["w1".to_owned()], "{steps:?}");
    assert!(steps
        .iter()
        .any(|s| matches!(s, Step::DeleteMachine { reason, .. }
        if reason == "scaled down by cluster-autoscaler")));
    assert!(creates(&steps).is_empty(), "{steps:?}");
}
