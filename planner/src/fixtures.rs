//! The objects and readings every planner test builds on: one cluster
//! and its machines as the tests write them, what is observed, and what
//! the planned steps say. The planner's own tests use them, and the
//! coordinator's tests of the reconciler around the planner (through the
//! `fixtures` feature).
//!
//! The pool cluster and the provider clusters are cluster `c` (uid `cu`);
//! every machine built here is assigned to it unless it is [`free`].

use std::collections::BTreeMap;
use std::time::Duration;

use drover_common::api::{
    Assignment, Cluster, ClusterStatus, ControlPlaneSpec, LabelSelector, Machine, MachinePhase,
    MachineRole, MachineSpec, MachineStatus, NetworkSpec, ObjectMeta, PoolProviderSpec,
    ProviderSpec, WorkerPoolSpec, CONTROL_PLANE_POOL,
};
use time::OffsetDateTime;

use crate::health::Policy;
use crate::{plan, InstanceState, Observed, Step};

/// The tests' "now".
pub fn t0() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
}

/// An assignment to the tests' cluster `c` (uid `cu`).
pub fn assignment(pool: &str, role: MachineRole) -> Assignment {
    Assignment {
        cluster: "c".into(),
        cluster_uid: "cu".into(),
        machine_pool: pool.into(),
        role,
        generation: 1,
        assigned_at: None,
        replaces: None,
        kubernetes_version: None,
        image: None,
    }
}

/// A Running machine of cluster `c` whose host name is its name.
pub fn running(name: &str, pool: &str, role: MachineRole) -> Machine {
    let mut m: Machine = serde_json::from_value(serde_json::json!({
        "apiVersion": drover_common::API_VERSION,
        "kind": "Machine",
        "metadata": {"name": name, "uid": format!("{name}-uid")},
        "spec": {},
        "status": {"phase": "Running", "hostname": name},
    }))
    .unwrap();
    m.spec.assignment = Some(assignment(pool, role));
    m
}

/// Cluster `c` (uid `cu`) at `version`, with `control_planes`, a worker
/// pool `w` of `workers`, `provider` (its JSON) and a 30 s settle time.
pub fn cluster(
    version: &str,
    control_planes: u32,
    workers: u32,
    provider: serde_json::Value,
) -> Cluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": drover_common::API_VERSION,
        "kind": "Cluster",
        "metadata": {"name": "c", "uid": "cu", "generation": 2},
        "spec": {
            "kubernetesVersion": version,
            "controlPlane": {"replicas": control_planes},
            "workerPools": [{"name": "w", "replicas": workers}],
            "provider": provider,
            "upgrade": {"settleTime": "30s"},
        },
    }))
    .unwrap()
}

/// Pool cluster `c` (uid `cu`) at v1.31.2 with `cp` control planes and a
/// worker pool `w` of `workers`, claiming free machines labelled `env: dev`.
pub fn pool_cluster(cp: u32, workers: u32) -> Cluster {
    Cluster {
        api_version: drover_common::API_VERSION.into(),
        kind: "Cluster".into(),
        metadata: ObjectMeta {
            name: "c".into(),
            uid: Some("cu".into()),
            generation: 1,
            ..Default::default()
        },
        spec: drover_common::api::ClusterSpec {
            kubernetes_version: "v1.31.2".into(),
            control_plane: ControlPlaneSpec {
                replicas: cp,
                selector: LabelSelector::default(),
                rollout: None,
                files: vec![],
                pre_kubeadm_commands: vec![],
                post_kubeadm_commands: vec![],
                remediation: None,
            },
            worker_pools: vec![WorkerPoolSpec {
                name: "w".into(),
                replicas: workers,
                autoscaling: None,
                selector: LabelSelector::default(),
                rollout: None,
                files: vec![],
                pre_kubeadm_commands: vec![],
                post_kubeadm_commands: vec![],
                remediation: None,
            }],
            network: NetworkSpec::default(),
            provider: ProviderSpec::Pool(PoolProviderSpec {
                pool: None,
                selector: LabelSelector {
                    match_labels: BTreeMap::from([("env".into(), "dev".into())]),
                },
            }),
            control_plane_endpoint: None,
            health: None,
            drain: None,
            upgrade: None,
            backup: None,
            files: vec![],
            pre_kubeadm_commands: vec![],
            post_kubeadm_commands: vec![],
            addons: vec![],
        },
        status: ClusterStatus::default(),
    }
}

/// A free pool machine (pool `p`) labelled `env: <env>`, at 10.0.0.9:6443.
pub fn free(name: &str, env: &str) -> Machine {
    Machine {
        api_version: drover_common::API_VERSION.into(),
        kind: "Machine".into(),
        metadata: ObjectMeta {
            name: name.into(),
            labels: BTreeMap::from([("env".into(), env.into())]),
            ..Default::default()
        },
        spec: MachineSpec {
            bmc: None,
            pool: "p".into(),
            provider: None,
            assignment: None,
        },
        status: MachineStatus {
            addresses: vec!["10.0.0.9".into()],
            api_server_port: 6443,
            ..Default::default()
        },
    }
}

/// Every machine heard from just now.
pub fn seen_now(_: &str) -> Option<OffsetDateTime> {
    Some(drover_common::now())
}

/// No provider reports any instance.
pub fn no_instance(_: &str) -> Option<InstanceState> {
    None
}

/// No failed create waits out a back-off.
pub fn no_retry(_: &str) -> Option<OffsetDateTime> {
    None
}

/// What is observed now, with `has_pki`, heartbeats from `last_seen`, the
/// default health policy (40 s heartbeat timeout) and 10 s heartbeats.
pub fn obs<'a>(
    has_pki: bool,
    last_seen: &'a dyn Fn(&str) -> Option<OffsetDateTime>,
) -> Observed<'a> {
    Observed {
        now: drover_common::now(),
        has_pki,
        last_seen,
        instance: &no_instance,
        retry_not_before: &no_retry,
        policy: Policy::defaults(Duration::from_secs(40)),
        heartbeat_interval: Duration::from_secs(10),
    }
}

/// [`pool_cluster`] with the docker provider: its machines are created.
pub fn docker_cluster(cp: u32, workers: u32) -> Cluster {
    let mut c = pool_cluster(cp, workers);
    c.spec.provider = ProviderSpec::Docker(drover_common::api::DockerProviderSpec {
        image: "drover-node:test".into(),
        profile: drover_common::api::DockerMachineProfile::Minimal,
        privileged: None,
    });
    c
}

/// A provider machine of cluster `c` in `pool`, created just now, its
/// ticket redeemed.
pub fn created(name: &str, pool: &str, role: MachineRole, phase: MachinePhase) -> Machine {
    let mut m = free(name, "dev");
    m.metadata.uid = Some(format!("uid-{name}"));
    m.metadata.creation_timestamp = Some(drover_common::now());
    m.spec.provider = Some("docker".into());
    m.spec.assignment = Some(Assignment {
        generation: 1,
        assigned_at: None,
        ..assignment(pool, role)
    });
    m.status.phase = phase;
    m.status.provider_id = Some(format!("ctr-{name}"));
    m.status.ticket_redeemed = true;
    m
}

/// The pools and roles of the `CreateMachine` steps.
pub fn creates(steps: &[Step]) -> Vec<(String, MachineRole)> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::CreateMachine {
                machine_pool, role, ..
            } => Some((machine_pool.clone(), *role)),
            _ => None,
        })
        .collect()
}

/// The machines of the `DeleteMachine` steps.
pub fn deletes(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::DeleteMachine { machine, .. } => Some(machine.clone()),
            _ => None,
        })
        .collect()
}

/// The status the steps record; panics without one.
pub fn status_of(steps: &[Step]) -> &ClusterStatus {
    steps
        .iter()
        .find_map(|s| match s {
            Step::SetStatus(st) => Some(st),
            _ => None,
        })
        .unwrap_or_else(|| panic!("status step expected: {steps:?}"))
}

/// Condition `t` of `st`; panics without one.
pub fn condition<'a>(st: &'a ClusterStatus, t: &str) -> &'a drover_common::api::Condition {
    st.conditions
        .iter()
        .find(|c| c.type_ == t)
        .unwrap_or_else(|| panic!("no {t} condition in {st:?}"))
}

/// A pool machine of cluster `c` in `pool`, claimed a minute ago.
pub fn claimed(name: &str, pool: &str, role: MachineRole, phase: MachinePhase) -> Machine {
    let mut m = free(name, "dev");
    m.metadata.creation_timestamp = Some(drover_common::now() - time::Duration::days(30));
    m.spec.assignment = Some(Assignment {
        generation: 2,
        assigned_at: Some(drover_common::now() - time::Duration::minutes(1)),
        ..assignment(pool, role)
    });
    m.status.phase = phase;
    m
}

/// Plans with the machines named in `silent` unheard for a minute.
pub fn plan_silent(c: &Cluster, machines: &[Machine], silent: &[&str]) -> Vec<Step> {
    let now = drover_common::now();
    let heard = |n: &str| {
        Some(if silent.contains(&n) {
            now - time::Duration::seconds(60)
        } else {
            now
        })
    };
    plan(
        c,
        machines,
        &Observed {
            now,
            ..obs(true, &heard)
        },
    )
}

/// Three Running control planes of cluster `c`: `a` (init), `b`, `d`.
pub fn three_control_planes() -> Vec<Machine> {
    vec![
        running_init_a(),
        claimed(
            "b",
            CONTROL_PLANE_POOL,
            MachineRole::ControlPlane,
            MachinePhase::Running,
        ),
        claimed(
            "d",
            CONTROL_PLANE_POOL,
            MachineRole::ControlPlane,
            MachinePhase::Running,
        ),
    ]
}

/// `c` as initialized by its init machine `init`.
pub fn initialized_by(mut c: Cluster, init: &str) -> Cluster {
    c.status.initialized = true;
    c.status.init_machine = Some(init.into());
    c
}

/// The machines, roles and replaced machines of the `Assign` steps.
pub fn assigns(steps: &[Step]) -> Vec<(String, MachineRole, Option<String>)> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Assign {
                machine,
                role,
                replaces,
                ..
            } => Some((machine.clone(), *role, replaces.clone())),
            _ => None,
        })
        .collect()
}

/// The machines of the `Release` steps, and whether each is a remediation.
pub fn releases(steps: &[Step]) -> Vec<(String, bool)> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Release {
                machine,
                remediation,
                ..
            } => Some((machine.clone(), *remediation)),
            _ => None,
        })
        .collect()
}

/// The status the last step records; panics when the last step is another.
pub fn final_status(steps: &[Step]) -> ClusterStatus {
    match steps.last() {
        Some(Step::SetStatus(st)) => (**st).clone(),
        other => panic!("a status step last, got {other:?}"),
    }
}

/// A started, healthy etcd member for each name, ids 0, 1, 2...
pub fn healthy_members(names: &[&str]) -> Vec<drover_common::api::EtcdMember> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| drover_common::api::EtcdMember {
            id: format!("{i:x}"),
            name: (*n).into(),
            peer_urls: vec![],
            client_urls: vec![],
            started: true,
            healthy: true,
            is_learner: false,
        })
        .collect()
}

/// Pool machine `a`, the Running init machine of the test cluster.
pub fn running_init_a() -> Machine {
    claimed(
        "a",
        CONTROL_PLANE_POOL,
        MachineRole::Init,
        MachinePhase::Running,
    )
}

/// An initialized pool cluster of its init machine `a` and worker `w1`,
/// both Running, each with its name as its hostname (its Node's name).
pub fn init_and_worker() -> (drover_common::api::Cluster, Vec<Machine>) {
    let c = initialized_by(pool_cluster(1, 1), "a");
    let mut machines = vec![
        running_init_a(),
        claimed("w1", "w", MachineRole::Worker, MachinePhase::Running),
    ];
    for m in &mut machines {
        m.status.hostname = m.metadata.name.clone();
    }
    (c, machines)
}

/// A Node as a control plane reports it.
pub fn cluster_node(name: &str, ready: &str) -> drover_common::api::ClusterNode {
    drover_common::api::ClusterNode {
        message: String::new(),
        name: name.into(),
        ready: ready.into(),
        since: Some(drover_common::now()),
        unschedulable: false,
        kubelet_version: "v1.31.2".into(),
    }
}

/// [`docker_cluster`] as initialized by its init machine `i`.
pub fn initialized_docker(cp: u32, workers: u32) -> Cluster {
    initialized_by(docker_cluster(cp, workers), "i")
}

/// A Running provider machine `name` of the control plane, as `role`.
pub fn created_cp(name: &str, role: MachineRole) -> Machine {
    created(name, CONTROL_PLANE_POOL, role, MachinePhase::Running)
}

/// The Running provider machines of the control plane: the first one
/// the init machine, the others joined control planes.
pub fn created_control_planes(names: &[&str]) -> Vec<Machine> {
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let role = if i == 0 {
                MachineRole::Init
            } else {
                MachineRole::ControlPlane
            };
            created_cp(name, role)
        })
        .collect()
}

/// Running provider workers of pool `w`.
pub fn created_workers(names: &[&str]) -> Vec<Machine> {
    names
        .iter()
        .map(|name| created(name, "w", MachineRole::Worker, MachinePhase::Running))
        .collect()
}

/// The Running init machine `i` of a provider cluster and its Running
/// workers of pool `w`.
pub fn init_i_and_workers(workers: &[&str]) -> Vec<Machine> {
    let mut machines = vec![created_cp("i", MachineRole::Init)];
    machines.extend(created_workers(workers));
    machines
}

/// Each machine's name as its hostname (its Node's name).
pub fn hostnames_are_names(machines: &mut [Machine]) {
    for m in machines {
        m.status.hostname = m.metadata.name.clone();
    }
}

/// Heartbeats: the machines named in `silent` unheard since `ago`
/// before `now`, every other one heard at `now`.
pub fn heard_but<'a>(
    now: OffsetDateTime,
    silent: &'a [&'a str],
    ago: time::Duration,
) -> impl Fn(&str) -> Option<OffsetDateTime> + 'a {
    move |n: &str| Some(if silent.contains(&n) { now - ago } else { now })
}

/// Plans with every machine heard from just now.
pub fn plan_now(c: &Cluster, machines: &[Machine]) -> Vec<Step> {
    plan(c, machines, &obs(true, &seen_now))
}

/// Plans at `now` with heartbeats from `last_seen`.
pub fn plan_at(
    c: &Cluster,
    machines: &[Machine],
    now: OffsetDateTime,
    last_seen: &dyn Fn(&str) -> Option<OffsetDateTime>,
) -> Vec<Step> {
    plan(
        c,
        machines,
        &Observed {
            now,
            ..obs(true, last_seen)
        },
    )
}

/// Whether `st` holds condition `t` with `status`.
pub fn has_condition(st: &ClusterStatus, t: &str, status: &str) -> bool {
    st.conditions
        .iter()
        .any(|c| c.type_ == t && c.status == status)
}

/// The docker load balancer `drover-c-lb` at 172.18.0.2:6443.
pub fn docker_load_balancer(backends: &[&str]) -> drover_common::api::LoadBalancerStatus {
    drover_common::api::LoadBalancerStatus {
        address: "172.18.0.2:6443".into(),
        id: "drover-c-lb".into(),
        backends: backends.iter().map(|b| (*b).to_owned()).collect(),
    }
}

/// Whether the steps set the endpoint's backends.
pub fn sets_backends(steps: &[Step]) -> bool {
    steps
        .iter()
        .any(|s| matches!(s, Step::SetEndpointBackends { .. }))
}

/// Asserts condition `t` of `st` has `status` and a message containing
/// `part`.
pub fn assert_condition(st: &ClusterStatus, t: &str, status: &str, part: &str) {
    let cond = condition(st, t);
    assert_eq!(cond.status, status, "{t}: {cond:?}");
    assert!(cond.message.contains(part), "{t}: {}", cond.message);
}

/// Asserts that `st` says a restore is under way, its message holding
/// `part`.
pub fn assert_restoring(st: &ClusterStatus, part: &str) {
    assert_condition(st, "Restoring", "True", part);
}

/// `c` as `drover restore cluster` leaves it, restoring snapshot
/// `c-20261128-000000` (revision 42) in place of control planes `old`:
/// not initialized, no init machine.
pub fn restoring(mut c: Cluster, old: &[&str]) -> Cluster {
    c.status.restore = Some(drover_common::api::ClusterRestore {
        snapshot: "c-20261128-000000".into(),
        revision: 42,
        requested_at: t0(),
        requested_by: "admin".into(),
        forced: false,
        replaced: old.iter().map(|o| o.to_string()).collect(),
        machine: None,
        source: None,
    });
    c.status.initialized = false;
    c.status.init_machine = None;
    c
}
