//! The cluster reconciler: for each cluster on its own, level-triggered,
//! it plans the steps from the cluster and its machines as they are (a
//! pure function) and applies them (the executor). It never sees events,
//! only objects, so running it twice changes nothing the second time. The
//! controller (`controller.rs`) decides when: a work queue of cluster names
//! (`domain::workqueue`) fed by store changes through the fleet index
//! (`domain::fleet_index`).

pub mod controller;
pub mod error;
pub mod provisioner;

pub use crate::provider::retries::ProvisionRetries;
pub use error::ReconcileError;

mod executor;
mod plan;

pub use executor::execute;
use executor::unassigned_alive;
pub use plan::{plan, Observed, Step, TOMBSTONE_TTL};

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::app::App;

/// Keeps the `Alive` condition of pool machines that no cluster claimed true
/// to what the coordinator sees. A machine's condition can only need a
/// change when its heartbeats stop or start again, so after a first read of
/// every machine the scan reads only those whose heartbeats went quiet or
/// came back since ([`FreeScan`]), and every machine again only every
/// [`FULL_FREE_SCAN`]: decoding a large fleet every heartbeat interval cost
/// more memory than the whole heartbeat path. It runs on a blocking thread,
/// at most once per heartbeat interval (a machine cannot go silent faster),
/// not on every store change.
async fn free_machines_alive(app: Arc<App>, mut scan: FreeScan) -> (FreeScan, Vec<String>) {
    crate::store::blocking(move || {
        let errors = scan.run(&app);
        (scan, errors)
    })
    .await
}

/// How often the free-machine scan reads every machine regardless.
pub const FULL_FREE_SCAN: Duration = Duration::from_secs(600);

/// What the free-machine scan saw: for each machine with a heartbeat
/// record, whether its heartbeats had stopped (longer than the heartbeat
/// timeout) when it was last looked at.
#[derive(Debug, Default)]
pub struct FreeScan {
    quiet: std::collections::HashMap<String, bool>,
    full_at: Option<Instant>,
}

impl FreeScan {
    /// Reads the machines that may need their `Alive` condition changed and
    /// changes it. Returns the errors met.
    fn run(&mut self, app: &App) -> Vec<String> {
        let now = drover_common::now();
        let timeout = app.settings.health_defaults.heartbeat_timeout;
        let quiet: std::collections::HashMap<String, bool> = app
            .liveness
            .lock()
            .expect("liveness lock")
            .iter()
            .map(|(name, l)| (name.clone(), now - l.last_seen > timeout))
            .collect();
        let full = self.full_at.is_none_or(|at| at.elapsed() >= FULL_FREE_SCAN);
        let machines = if full {
            match app.machines() {
                Ok(m) => m,
                Err(e) => return vec![format!("cannot list machines: {e}")],
            }
        } else {
            let mut read = vec![];
            for (name, q) in &quiet {
                if self.quiet.get(name) == Some(q) {
                    continue;
                }
                match app.machine(name) {
                    Ok(Some(m)) => read.push(m),
                    Ok(None) => {}
                    Err(e) => return vec![format!("cannot read machine {name}: {e}")],
                }
            }
            read
        };
        let errors = unassigned_alive(app, &machines);
        if errors.is_empty() {
            if full {
                self.full_at = Some(Instant::now());
            }
            self.quiet = quiet;
        }
        errors
    }
}

#[cfg(test)]
mod tests {

    use std::time::Duration;

    use drover_common::api::{
        push_event, set_condition, Assignment, Cluster, ClusterPhase, ClusterStatus, Machine,
        MachinePhase, MachineRole, MachineSpec, MachineStatus, ObjectMeta, ProviderSpec,
        CONTROL_PLANE_POOL,
    };
    use time::OffsetDateTime;

    use crate::domain::health::{Policy, ALIVE_CONDITION};

    use crate::provider::InstanceState;

    use super::plan::*;

    use drover_common::api::{
        ControlPlaneSpec, LabelSelector, NetworkSpec, PoolProviderSpec, WorkerPoolSpec,
    };
    use std::collections::BTreeMap;

    fn cluster(cp: u32, workers: u32) -> Cluster {
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
                },
                worker_pools: vec![WorkerPoolSpec {
                    name: "w".into(),
                    replicas: workers,
                    selector: LabelSelector::default(),
                    rollout: None,
                    files: vec![],
                    pre_kubeadm_commands: vec![],
                    post_kubeadm_commands: vec![],
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
                files: vec![],
                pre_kubeadm_commands: vec![],
                post_kubeadm_commands: vec![],
                addons: vec![],
            },
            status: ClusterStatus::default(),
        }
    }

    fn free(name: &str, env: &str) -> Machine {
        Machine {
            api_version: drover_common::API_VERSION.into(),
            kind: "Machine".into(),
            metadata: ObjectMeta {
                name: name.into(),
                labels: BTreeMap::from([("env".into(), env.into())]),
                ..Default::default()
            },
            spec: MachineSpec {
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

    fn seen_now(_: &str) -> Option<OffsetDateTime> {
        Some(drover_common::now())
    }

    fn no_instance(_: &str) -> Option<InstanceState> {
        None
    }

    fn no_retry(_: &str) -> Option<OffsetDateTime> {
        None
    }

    fn obs<'a>(
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

    #[test]
    fn pki_comes_first() {
        let steps = plan(&cluster(1, 2), &[free("a", "dev")], &obs(false, &seen_now));
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
        let steps = plan(&cluster(1, 2), &machines, &obs(true, &seen_now));
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
            &cluster(1, 0),
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

    #[test]
    fn converged_cluster_plans_nothing() {
        let mut c = cluster(1, 0);
        let mut m = free("a", "dev");
        m.spec.assignment = Some(Assignment {
            generation: 2,
            assigned_at: None,
            ..super::plan::fixtures::assignment(CONTROL_PLANE_POOL, MachineRole::Init)
        });
        m.status.phase = MachinePhase::Running;
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
        let mut c = cluster(1, 0);
        c.metadata.deletion_timestamp = Some(drover_common::now());
        let mut m = free("a", "dev");
        m.spec.assignment = Some(Assignment {
            generation: 2,
            assigned_at: None,
            ..super::plan::fixtures::assignment(CONTROL_PLANE_POOL, MachineRole::Init)
        });
        m.status.phase = MachinePhase::Running;
        let obs = obs(true, &seen_now);
        let steps = plan(&c, std::slice::from_ref(&m), &obs);
        assert!(matches!(steps[0], Step::Release { .. }));
        assert_eq!(plan(&c, &[], &obs), vec![Step::Finalize]);
    }

    fn docker_cluster(cp: u32, workers: u32) -> Cluster {
        let mut c = cluster(cp, workers);
        c.spec.provider = ProviderSpec::Docker(drover_common::api::DockerProviderSpec {
            image: "drover-node:test".into(),
            profile: drover_common::api::DockerMachineProfile::Minimal,
            privileged: None,
        });
        c
    }

    fn created(name: &str, pool: &str, role: MachineRole, phase: MachinePhase) -> Machine {
        let mut m = free(name, "dev");
        m.metadata.uid = Some(format!("uid-{name}"));
        m.metadata.creation_timestamp = Some(drover_common::now());
        m.spec.provider = Some("docker".into());
        m.spec.assignment = Some(Assignment {
            generation: 1,
            assigned_at: None,
            ..super::plan::fixtures::assignment(pool, role)
        });
        m.status.phase = phase;
        m.status.provider_id = Some(format!("ctr-{name}"));
        m.status.ticket_redeemed = true;
        m
    }

    fn creates(steps: &[Step]) -> Vec<(String, MachineRole)> {
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

    fn deletes(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::DeleteMachine { machine, .. } => Some(machine.clone()),
                _ => None,
            })
            .collect()
    }

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
            let mut c = cluster(3, 0);
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
        let mut c = initialized(docker_cluster(1, 1), "cp1");
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
        let key = crate::provider::endpoint_key("cluster-uid");
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
    fn a_pool_clusters_coordinator_endpoint_follows_its_control_planes() {
        let mut c = initialized(cluster(3, 0), "a");
        c.spec.control_plane_endpoint = Some(drover_common::api::ControlPlaneEndpoint::Managed {
            managed: drover_common::api::EndpointManager::Coordinator,
        });
        c.status.endpoint_port = Some(36443);
        c.status.control_plane_endpoint = Some("127.0.0.1:36443".into());
        let mut machines = three_control_planes();
        for (i, m) in machines.iter_mut().enumerate() {
            m.status.addresses = vec![format!("10.0.0.{}", i + 1)];
        }
        let backends = |ips: &[u8]| -> Vec<String> {
            ips.iter().map(|i| format!("10.0.0.{i}:6443")).collect()
        };
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
            id: crate::proxy::LOAD_BALANCER_ID.into(),
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

    fn status_of(steps: &[Step]) -> &ClusterStatus {
        steps
            .iter()
            .find_map(|s| match s {
                Step::SetStatus(st) => Some(st),
                _ => None,
            })
            .unwrap_or_else(|| panic!("status step expected: {steps:?}"))
    }

    fn condition<'a>(st: &'a ClusterStatus, t: &str) -> &'a drover_common::api::Condition {
        st.conditions
            .iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("no {t} condition in {st:?}"))
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
    fn alive_condition_is_written_only_when_it_changes() {
        let mut m = free("a", "dev");
        m.status.phase = MachinePhase::Registered;
        let now = drover_common::now();
        let silent = |_: &str| Some(now - time::Duration::minutes(5));
        let heard = |_: &str| Some(now);
        // Never in trouble: no condition, no write.
        assert!(alive_steps(
            &[&m],
            &Observed {
                now,
                ..obs(true, &heard)
            }
        )
        .is_empty());
        let steps = alive_steps(
            &[&m],
            &Observed {
                now,
                ..obs(true, &silent)
            },
        );
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
        assert!(alive_steps(
            &[&m],
            &Observed {
                now,
                ..obs(true, &silent)
            }
        )
        .is_empty());
        let stopped = |_: &str| Some(InstanceState::Stopped);
        assert!(matches!(
            &alive_steps(
                &[&m],
                &Observed {
                    now,
                    instance: &stopped,
                    ..obs(true, &heard)
                }
            )[..],
            [Step::SetAlive { alive: false, reason, .. }] if reason == "Stopped"
        ));
        assert!(matches!(
            &alive_steps(&[&m], &Observed { now, ..obs(true, &heard) })[..],
            [Step::SetAlive { alive: true, reason, .. }] if reason == "Heartbeating"
        ));
        // A deleted machine is left alone.
        m.status.phase = MachinePhase::Deleted;
        assert!(alive_steps(
            &[&m],
            &Observed {
                now,
                ..obs(true, &heard)
            }
        )
        .is_empty());
    }

    /// A pool machine of cluster `c` in `pool`, claimed a minute ago.
    fn claimed(name: &str, pool: &str, role: MachineRole, phase: MachinePhase) -> Machine {
        let mut m = free(name, "dev");
        m.metadata.creation_timestamp = Some(drover_common::now() - time::Duration::days(30));
        m.spec.assignment = Some(Assignment {
            generation: 2,
            assigned_at: Some(drover_common::now() - time::Duration::minutes(1)),
            ..super::plan::fixtures::assignment(pool, role)
        });
        m.status.phase = phase;
        m
    }

    /// Plans with the machines named in `silent` unheard for a minute.
    fn plan_silent(c: &Cluster, machines: &[Machine], silent: &[&str]) -> Vec<Step> {
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
    fn three_control_planes() -> Vec<Machine> {
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

    fn initialized(mut c: Cluster, init: &str) -> Cluster {
        c.status.initialized = true;
        c.status.init_machine = Some(init.into());
        c
    }

    fn assigns(steps: &[Step]) -> Vec<(String, MachineRole, Option<String>)> {
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

    fn releases(steps: &[Step]) -> Vec<(String, bool)> {
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

    fn final_status(steps: &[Step]) -> ClusterStatus {
        match steps.last() {
            Some(Step::SetStatus(st)) => (**st).clone(),
            other => panic!("a status step last, got {other:?}"),
        }
    }

    #[test]
    fn pool_control_planes_renew_their_certificates_one_at_a_time_soonest_first() {
        let c = initialized(cluster(3, 0), "a");
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
        let renewal = final_status(&plan(&c, &machines, &obs(true, &seen_now)))
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
            final_status(&plan(&asked, &machines, &obs(true, &seen_now))).certificate_renewal,
            Some(renewal.clone())
        );
        // Once b reports new certificates, a is next.
        expiring_in(&mut machines[1], 365);
        let next = final_status(&plan(&asked, &machines, &obs(true, &seen_now)))
            .certificate_renewal
            .expect("the next renewal");
        assert_eq!(next.machine, "a");
        // None starts while a control plane does not run.
        machines[2].status.phase = MachinePhase::Bootstrapping;
        assert_eq!(
            final_status(&plan(&c, &machines, &obs(true, &seen_now))).certificate_renewal,
            None
        );
    }

    #[test]
    fn a_silent_pool_worker_is_taken_out_and_a_free_machine_claimed_in_its_place() {
        // maxUnhealthy 40 % of 3 allows one.
        let c = initialized(cluster(1, 3), "a");
        let machines = vec![
            running_init_a(),
            claimed("w1", "w", MachineRole::Worker, MachinePhase::Running),
            claimed("w2", "w", MachineRole::Worker, MachinePhase::Running),
            claimed("w3", "w", MachineRole::Worker, MachinePhase::Running),
            free("f", "dev"),
        ];
        let steps = plan_silent(&c, &machines, &["w1"]);
        assert_eq!(releases(&steps), vec![("w1".to_string(), true)]);
        assert_eq!(
            assigns(&steps),
            vec![("f".to_string(), MachineRole::Worker, Some("w1".to_string()))]
        );
        let st = final_status(&steps);
        let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "False");
        assert!(ready.message.contains("w1 silent"), "{}", ready.message);
    }

    #[test]
    fn a_replacement_of_a_replacement_that_dies_is_replaced_in_turn() {
        // w1 died and was taken out; r1 took its place, died and was taken
        // out; r2 took r1's place and is silent now. Neither dead machine
        // ever came back to reset. Only r2 is unhealthy: w1's place is
        // held, so w1 no longer counts against maxUnhealthy (40 % of 3).
        let c = initialized(cluster(1, 3), "a");
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
        assert_eq!(releases(&steps), vec![("r2".to_string(), true)]);
        assert_eq!(
            assigns(&steps),
            vec![("f".to_string(), MachineRole::Worker, Some("r2".to_string()))]
        );
    }

    #[test]
    fn a_pool_machine_claimed_late_in_life_gets_its_full_startup_time() {
        let c = initialized(cluster(1, 1), "a");
        // Registered thirty days ago, claimed a minute ago, still joining.
        let machines = vec![
            running_init_a(),
            claimed("w1", "w", MachineRole::Worker, MachinePhase::Bootstrapping),
            free("f", "dev"),
        ];
        let steps = plan(&c, &machines, &obs(true, &seen_now));
        assert!(releases(&steps).is_empty(), "{steps:?}");
        assert!(assigns(&steps).is_empty(), "{steps:?}");
    }

    #[test]
    fn pool_control_planes_join_one_at_a_time() {
        let c = initialized(cluster(3, 0), "a");
        let mut machines = vec![
            running_init_a(),
            free("b", "dev"),
            free("d", "dev"),
            free("e", "dev"),
        ];
        let steps = plan(&c, &machines, &obs(true, &seen_now));
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
        assert!(assigns(&plan(&c, &machines, &obs(true, &seen_now))).is_empty());
        machines[1].status.phase = MachinePhase::Running;
        assert_eq!(
            assigns(&plan(&c, &machines, &obs(true, &seen_now))),
            vec![("d".to_string(), MachineRole::ControlPlane, None)]
        );
    }

    #[test]
    fn before_init_only_the_init_machine_is_claimed_for_the_control_plane() {
        let c = cluster(3, 0);
        let machines = vec![free("a", "dev"), free("b", "dev"), free("d", "dev")];
        assert_eq!(
            assigns(&plan(&c, &machines, &obs(true, &seen_now))),
            vec![("a".to_string(), MachineRole::Init, None)]
        );
    }

    #[test]
    fn pool_control_plane_scale_down_goes_one_at_a_time_and_keeps_the_init_machine() {
        let c = initialized(cluster(1, 0), "a");
        let mut machines = three_control_planes();
        machines[2].metadata.creation_timestamp = Some(drover_common::now());
        let steps = plan(&c, &machines, &obs(true, &seen_now));
        assert_eq!(releases(&steps), vec![("d".to_string(), false)]);
        // While d resets, b stays.
        machines[2].status.phase = MachinePhase::Releasing;
        let steps = plan(&c, &machines, &obs(true, &seen_now));
        assert!(releases(&steps).is_empty(), "{steps:?}");
        let st = final_status(&steps);
        assert!(st
            .conditions
            .iter()
            .any(|c| c.type_ == "RemovalAllowed" && c.status == "False"));
    }

    #[test]
    fn a_dead_init_machine_of_three_is_replaced_by_a_joining_control_plane() {
        let c = initialized(cluster(3, 0), "a");
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
        for m in &mut machines {
            m.status.hostname = m.metadata.name.clone();
        }
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
        let c = initialized(cluster(1, 1), "a");
        let mut gone = claimed(
            "a",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Releasing,
        );
        push_event(&mut gone.status.events, "Remediating", "taken out");
        let machines = vec![
            gone,
            claimed("w1", "w", MachineRole::Worker, MachinePhase::Running),
            free("f", "dev"),
        ];
        let steps = plan(&c, &machines, &obs(true, &seen_now));
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
        let c = initialized(cluster(1, 0), "a");
        let machines = vec![running_init_a(), free("f", "dev")];
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
        let st = final_status(&steps);
        let allowed = st
            .conditions
            .iter()
            .find(|c| c.type_ == "RemediationAllowed")
            .unwrap();
        assert_eq!(allowed.status, "False");
        assert!(allowed.message.contains("quorum"), "{}", allowed.message);
    }

    #[test]
    fn a_provider_machine_deleted_by_an_operator_is_replaced_one_control_plane_at_a_time() {
        let c = initialized(docker_cluster(3, 0), "cp1");
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
        let c = initialized(docker_cluster(3, 0), "cp1");
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

    /// A started, healthy etcd member for each name, ids 0, 1, 2...
    fn healthy_members(names: &[&str]) -> Vec<drover_common::api::EtcdMember> {
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

    #[test]
    fn a_new_version_control_plane_joins_only_once_kubeadm_config_names_its_version() {
        let mut c = initialized(docker_cluster(3, 0), "cp1");
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

    /// Pool machine `a`, the Running init machine of the test cluster.
    fn running_init_a() -> Machine {
        claimed(
            "a",
            CONTROL_PLANE_POOL,
            MachineRole::Init,
            MachinePhase::Running,
        )
    }

    /// An initialized pool cluster of its init machine `a` and worker `w1`,
    /// both Running, each with its name as its hostname (its Node's name).
    fn init_and_worker() -> (drover_common::api::Cluster, Vec<Machine>) {
        let c = initialized(cluster(1, 1), "a");
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
    fn cluster_node(name: &str, ready: &str) -> drover_common::api::ClusterNode {
        drover_common::api::ClusterNode {
            message: String::new(),
            name: name.into(),
            ready: ready.into(),
            since: Some(drover_common::now()),
            unschedulable: false,
            kubelet_version: "v1.31.2".into(),
        }
    }

    #[test]
    fn a_cluster_whose_endpoint_does_not_answer_is_not_ready() {
        // Every machine runs and every Node was Ready when last listed, but
        // the API server died under a living agent, which reports that
        // the endpoint does not answer /readyz.
        let (mut c, machines) = init_and_worker();
        c.status.nodes = vec![cluster_node("a", "True"), cluster_node("w1", "True")];
        c.status.endpoint_ready = Some(false);
        let st = final_status(&plan(&c, &machines, &obs(true, &seen_now)));
        let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
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
        let st = final_status(&plan(&c, &machines, &obs(true, &seen_now)));
        assert!(st
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"));
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
        let st = final_status(&plan(&c, &machines, &obs(true, &seen_now)));
        let removal = st.node_removal.clone().expect("the orphan Node goes");
        assert_eq!((removal.node.as_str(), removal.via.as_str()), ("gone", "a"));
        let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
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
        let st_net = final_status(&plan(&ready_before, &machines, &obs(true, &seen_now)));
        let ready = st_net
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
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
        let st = final_status(&plan(&c, &machines, &obs(true, &seen_now)));
        assert_eq!(st.node_removal, None);
        assert!(st
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"));
    }

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

    /// A control plane answers a drain between a pass's read of the cluster
    /// and its status write: the answer survives the write, so the machine
    /// is not drained a second time (CI on e5e632b drained a worker twice,
    /// 90 s apart, because the write dropped the first answer).
    #[tokio::test]
    async fn a_drain_answer_recorded_during_a_pass_survives_its_status_write() {
        use crate::store::{Kind, StoreError};
        use drover_common::api::{DrainResult, NodeDrain};
        let dir = tempfile::tempdir().unwrap();
        let app = crate::app::App::for_tests(dir.path());
        let at = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let mut c = cluster(1, 1);
        c.status.drain = Some(NodeDrain {
            machine: "w".into(),
            node: "w".into(),
            via: "cp".into(),
            started_at: at,
            requested_at: at,
            result: None,
        });
        app.store.create_json(Kind::Cluster, "c", &c).unwrap();
        let read_by_the_pass = app.cluster("c").unwrap().unwrap();
        app.update_cluster::<StoreError>("c", |c| {
            c.status.drain.as_mut().unwrap().result = Some(DrainResult {
                ok: true,
                message: "evicted 2 pods".into(),
            });
            Ok(true)
        })
        .unwrap();
        let mut status = read_by_the_pass.status.clone();
        status.phase = ClusterPhase::Provisioning;
        super::executor::execute(&app, &read_by_the_pass, &Step::SetStatus(Box::new(status)))
            .await
            .unwrap();
        let stored = app.cluster("c").unwrap().unwrap().status;
        assert_eq!(
            stored.phase,
            ClusterPhase::Provisioning,
            "the pass's own change is written"
        );
        assert_eq!(
            stored.drain.and_then(|d| d.result),
            Some(DrainResult {
                ok: true,
                message: "evicted 2 pods".into()
            }),
            "the answer recorded meanwhile is kept"
        );
    }

    #[tokio::test]
    async fn free_machines_are_read_again_only_when_their_heartbeats_stop_or_resume() {
        use crate::app::Liveness;
        use crate::store::{Kind, StoreError};
        let dir = tempfile::tempdir().unwrap();
        let app = crate::app::App::for_tests(dir.path());
        let mut m = free("m", "dev");
        m.status.phase = MachinePhase::Registered;
        app.store.create_json(Kind::Machine, "m", &m).unwrap();
        let seen = |ago: u64| {
            app.liveness.lock().unwrap().insert(
                "m".into(),
                Liveness {
                    last_seen: drover_common::now() - Duration::from_secs(ago),
                },
            );
        };
        let alive = || {
            let m = app.machine("m").unwrap().unwrap();
            m.status
                .conditions
                .iter()
                .find(|c| c.type_ == ALIVE_CONDITION)
                .map(|c| (c.status.clone(), c.reason.clone()))
        };
        let mut scan = super::FreeScan::default();
        // Silent for an hour: Alive turns False.
        seen(3600);
        assert!(scan.run(&app).is_empty());
        assert_eq!(alive(), Some(("False".into(), "Silent".into())));
        // Heartbeating again: True.
        seen(0);
        assert!(scan.run(&app).is_empty());
        assert_eq!(alive(), Some(("True".into(), "Heartbeating".into())));
        // While its heartbeats keep coming the machine is not read again:
        // a condition written behind the scan's back stays as it is ...
        app.update_machine::<StoreError>("m", |m| {
            for c in &mut m.status.conditions {
                if c.type_ == ALIVE_CONDITION {
                    c.status = "False".into();
                    c.reason = "Silent".into();
                }
            }
            Ok(true)
        })
        .unwrap();
        assert!(scan.run(&app).is_empty());
        assert_eq!(alive(), Some(("False".into(), "Silent".into())));
        // ... until the periodic full scan reads every machine.
        scan.full_at = std::time::Instant::now().checked_sub(super::FULL_FREE_SCAN);
        assert!(scan.run(&app).is_empty());
        assert_eq!(alive(), Some(("True".into(), "Heartbeating".into())));
    }
}
