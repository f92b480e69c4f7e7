//! High availability: three `drover serve` replicas on a real three-member
//! etcd cluster, running an `aws` cluster against moto (its agents hold all
//! three coordinator URLs). The leader is killed, an etcd member is killed,
//! and a leader is paused past its lease and resumed; the cluster keeps
//! Running and no machine is replaced because of any of it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use drover_tests::aws::*;
use drover_tests::etcd::EtcdCluster;
use drover_tests::*;
use nix::sys::signal::Signal;

const BOOT: Duration = Duration::from_secs(90);
const LEASE: &str = "3s";

struct Ha {
    etcd: EtcdCluster,
    _moto: Moto,
    proxy: Ec2Proxy,
    ec2: Ec2,
    placement: Placement,
    replicas: Vec<Coordinator>,
    dir: std::path::PathBuf,
    agents: BTreeMap<String, Agent>,
}

impl Ha {
    fn start(tmp: &Path) -> Self {
        let etcd = EtcdCluster::start(3);
        let moto = Moto::start(tmp);
        let proxy = Ec2Proxy::start(&moto.url);
        let ec2 = Ec2::new(&moto.url);
        let placement = Placement::new(&ec2, "drover-ha");
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let urls: Vec<String> = ports
            .iter()
            .map(|p| format!("https://127.0.0.1:{p}"))
            .collect();
        let key = tmp.join("encryption.key");
        let mut replicas: Vec<Coordinator> = vec![];
        for (i, port) in ports.iter().enumerate() {
            let mut args = vec![
                "--store".to_owned(),
                etcd.store_url(),
                "--encryption-key-file".to_owned(),
                key.display().to_string(),
                "--leader-lease".to_owned(),
                LEASE.to_owned(),
            ];
            for u in &urls {
                args.extend(["--advertise-url".to_owned(), u.clone()]);
            }
            // Only the first start writes the client config and prints the
            // admin token; the others share them.
            let c = Coordinator::start_replica(
                &tmp.join(format!("replica-{i}")),
                CoordinatorOptions {
                    heartbeat_interval: "1s",
                    heartbeat_timeout: "6s",
                    env: Ec2::coordinator_env(&proxy.url),
                },
                &args,
                &format!("127.0.0.1:{port}"),
                replicas.first(),
            );
            replicas.push(c);
        }
        Self {
            etcd,
            _moto: moto,
            proxy,
            ec2,
            placement,
            replicas,
            dir: tmp.to_path_buf(),
            agents: BTreeMap::new(),
        }
    }

    /// The replicas still running (not killed), by index.
    fn alive(&self, except: &BTreeSet<usize>) -> Vec<usize> {
        (0..self.replicas.len())
            .filter(|i| !except.contains(i))
            .collect()
    }

    /// Waits until exactly one of `among` says it leads; returns it.
    fn wait_leader(&self, among: &[usize], timeout: Duration) -> usize {
        wait_for("one leader", timeout, || {
            let leaders: Vec<usize> = among
                .iter()
                .copied()
                .filter(|i| self.replicas[*i].status()["leader"] == true)
                .collect();
            match leaders.as_slice() {
                [one] => Ok(*one),
                other => Err(format!("leaders: {other:?}")),
            }
        })
    }

    /// Waits until the leader `i` has made `n` more reconcile passes.
    fn passes(&self, i: usize, n: u64) {
        let start = self.replicas[i].reconciler_runs();
        wait_for(&format!("{n} passes on replica {i}"), BOOT, || {
            let now = self.replicas[i].reconciler_runs();
            if now >= start + n {
                Ok(())
            } else {
                Err(format!("{now} of {}", start + n))
            }
        });
    }

    fn machines(&self, via: usize, cluster: &str) -> Vec<serde_json::Value> {
        self.replicas[via]
            .machines()
            .into_iter()
            .filter(|m| m["spec"]["assignment"]["cluster"] == cluster)
            .collect()
    }

    /// Asserts the cluster runs on exactly `names`, none of them ever judged
    /// unhealthy, every one heartbeating to the current leader.
    fn assert_undisturbed(&self, via: usize, cluster: &str, names: &BTreeSet<String>) {
        let c = self.replicas[via].cluster(cluster).unwrap();
        assert_eq!(c["status"]["phase"], "Running", "{c}");
        let ms = self.machines(via, cluster);
        let now: BTreeSet<String> = ms
            .iter()
            .filter(|m| m["status"]["phase"] != "Deleted")
            .map(|m| m["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(&now, names, "machines changed");
        for m in &ms {
            let events = m["status"]["events"].to_string();
            assert!(!events.contains("Unhealthy"), "{events}");
        }
        assert_eq!(self.ec2.live_instances(cluster).len(), names.len());
    }
}

#[test]
fn ha_replicas_fail_over_without_replacing_machines() {
    let tmp = tempfile::tempdir().unwrap();
    let mut ha = Ha::start(tmp.path());
    let mut dead = BTreeSet::new();

    // One leader; every replica lists all three.
    let leader = ha.wait_leader(&[0, 1, 2], BOOT);
    let listed = ha.replicas[0].cli_ok(&["get", "coordinators", "-o", "json"]);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert_eq!(listed.iter().filter(|c| c["leader"] == true).count(), 1);
    let table = ha.replicas[1].cli_ok(&["get", "coordinators"]);
    assert!(
        table.contains("leader") && table.contains("follower"),
        "{table}"
    );

    // A follower answers the machine API with 421 and names the leader.
    let follower = (leader + 1) % 3;
    let answer = ha.replicas[follower].api(None).send(
        "POST",
        "/v1/machine/heartbeat",
        None,
        Some(("application/json", b"{}".to_vec())),
    );
    answer.assert_problem(421, &ha.replicas[leader].url());
    // Both are ready (a follower knows its leader), to anyone, saying no more.
    for i in [leader, follower] {
        let ready = ha.replicas[i].api(None).send("GET", "/readyz", None, None);
        assert_eq!((ready.status, ready.body.as_str()), (200, "ok\n"), "{i}");
        let live = ha.replicas[i].api(None).send("GET", "/livez", None, None);
        assert_eq!(live.status, 200);
    }

    // A cluster, applied through a follower, made by the leader.
    let name = "ha";
    let f = ha.dir.join("cluster.yaml");
    std::fs::write(&f, ha.placement.cluster_yaml(name, 2, None)).unwrap();
    ha.replicas[follower].cli_ok(&["apply", "-f", f.to_str().unwrap()]);
    wait_for("three instances", BOOT, || {
        let n = ha.ec2.live_instances(name).len();
        if n == 3 {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    });
    for i in ha.ec2.live_instances(name) {
        let ud = ha.ec2.user_data(&i.id);
        for r in &ha.replicas {
            assert!(ud.contains(&r.url()), "every replica's URL in {ud}");
        }
    }
    boot_new_instances(&ha.ec2, &ha.proxy, &ha.dir, name, &mut ha.agents);
    ha.replicas[leader].wait_cluster_phase(name, "Running", BOOT);
    let names: BTreeSet<String> = ha
        .machines(leader, name)
        .iter()
        .map(|m| m["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names.len(), 3);

    // 1. The leader dies. Another takes over within the lease, and after
    //    well over a heartbeat timeout nothing was replaced.
    let killed_at = Instant::now();
    ha.replicas[leader].kill();
    dead.insert(leader);
    let second = ha.wait_leader(&ha.alive(&dead), BOOT);
    eprintln!(
        "leader {leader} killed; replica {second} leads after {:?} (lease {LEASE})",
        killed_at.elapsed()
    );
    ha.passes(second, 15);
    ha.assert_undisturbed(second, name, &names);

    // 2. One etcd member dies: the same leader, the same machines, and
    //    writes still work.
    ha.etcd.kill_member(0);
    ha.passes(second, 10);
    assert_eq!(ha.wait_leader(&ha.alive(&dead), BOOT), second);
    ha.replicas[second].token("spare", "role=spare", 1, "10m", &ha.dir.join("spare.yaml"));
    ha.assert_undisturbed(second, name, &names);

    // 3. The leader is paused past its lease. The third replica takes over;
    //    the paused one, resumed, finds itself deposed, and nothing it had
    //    planned in its stale view (every machine silent for a while) is
    //    written.
    ha.replicas[second].signal(Signal::SIGSTOP);
    let others: Vec<usize> = ha
        .alive(&dead)
        .into_iter()
        .filter(|i| *i != second)
        .collect();
    let third = ha.wait_leader(&others, BOOT);
    ha.passes(third, 5);
    ha.replicas[second].signal(Signal::SIGCONT);
    wait_for("the resumed replica to step down", BOOT, || {
        let s = ha.replicas[second].status();
        if s["leader"] == false {
            Ok(())
        } else {
            Err(s.to_string())
        }
    });
    assert!(
        ha.replicas[second].output().contains("no longer leads"),
        "{}",
        ha.replicas[second].output()
    );
    ha.passes(third, 15);
    assert_eq!(ha.wait_leader(&ha.alive(&dead), BOOT), third);
    ha.assert_undisturbed(third, name, &names);

    // Deleting works through any replica and terminates every instance.
    ha.replicas[second].cli_ok(&["delete", "cluster", name, "--wait", "--timeout", "90s"]);
    assert_eq!(ha.ec2.live_instances(name).len(), 0);

    // With its store's quorum gone (member 0 died above), a replica still
    // lives but is not ready, and says why without any data.
    ha.etcd.kill_member(1);
    ha.etcd.kill_member(2);
    wait_for("a replica without its store to be unready", BOOT, || {
        let ready = ha.replicas[third]
            .api(None)
            .send("GET", "/readyz", None, None);
        (ready.status == 503 && ready.body.starts_with("store: "))
            .then_some(())
            .ok_or(format!("{ready:?}"))
    });
    let live = ha.replicas[third]
        .api(None)
        .send("GET", "/livez", None, None);
    assert_eq!(live.status, 200);
    // The admin API says so too: 503, the store's failure and what to do.
    // Each store call may take its whole deadline (10 s) and calls queue
    // behind the reconciler's, so one request can outlast the client's
    // 30 s: asked again until one is answered, which must be a 503.
    let listed = wait_for("the admin API to answer without its store", BOOT, || {
        let a = ha.replicas[third].api(None).send(
            "GET",
            "/v1/clusters",
            Some(&ha.replicas[third].admin_token),
            None,
        );
        if a.status != 0 {
            Ok(a)
        } else {
            Err(format!("{a:?}"))
        }
    });
    listed.assert_problem(503, "Store unavailable");
    listed.assert_problem(503, "etcd http://127.0.0.1:");
    listed.assert_problem(503, "lost quorum");
}

/// A machine whose bootstrap document names only replica A (B was not
/// running when it was made) learns B's URL from its heartbeat answers and
/// saves it; once A dies and B leads, it heartbeats through B.
#[test]
fn a_machine_learns_a_later_replica_and_follows_the_leader_to_it() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdCluster::start(1);
    let key = tmp.path().join("encryption.key");
    let start = |i: usize, first: Option<&Coordinator>| {
        let port = free_port();
        let args: Vec<String> = [
            "--store",
            &etcd.store_url(),
            "--encryption-key-file",
            key.to_str().unwrap(),
            "--leader-lease",
            LEASE,
            // Each replica advertises only itself.
            "--advertise-url",
            &format!("https://127.0.0.1:{port}"),
        ]
        .map(str::to_owned)
        .to_vec();
        Coordinator::start_replica(
            &tmp.path().join(format!("replica-{i}")),
            CoordinatorOptions {
                heartbeat_interval: "1s",
                heartbeat_timeout: "6s",
                env: vec![],
            },
            &args,
            &format!("127.0.0.1:{port}"),
            first,
        )
    };
    let leads = |c: &Coordinator| c.status()["leader"] == true;
    let mut a = start(0, None);
    wait_for("A to lead", BOOT, || {
        leads(&a).then_some(()).ok_or_else(|| "not yet".to_owned())
    });
    let boot = tmp.path().join("bootstrap.yaml");
    a.token("spare", "role=spare", 1, "10m", &boot);
    let doc = std::fs::read_to_string(&boot).unwrap();
    let b = start(1, Some(&a));
    assert!(!doc.contains(&b.url()), "{doc}");
    let agent = Agent::start(&tmp.path().join("m"), "m-0", &boot);

    // The heartbeat answers name B too, and the agent saves the list.
    wait_for(
        "the agent to learn B's URL",
        Duration::from_secs(30),
        || {
            let path = agent.root.join("var/lib/drover-agent/state.json");
            let state: serde_json::Value = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            let urls = state["coordinators"].to_string();
            (urls.contains(&a.url()) && urls.contains(&b.url()))
                .then_some(())
                .ok_or(urls)
        },
    );

    // A dies; B leads and hears the machine's heartbeats.
    a.kill();
    wait_for("B to lead", BOOT, || {
        leads(&b).then_some(()).ok_or_else(|| "not yet".to_owned())
    });
    let after = time::OffsetDateTime::now_utc();
    let mut seen = BTreeSet::new();
    wait_for("heartbeats through B", Duration::from_secs(30), || {
        let m = b.machines().into_iter().next().ok_or("no machine")?;
        let t = m["status"]["lastHeartbeatTime"]
            .as_str()
            .and_then(|t| {
                time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
            })
            .ok_or(format!("{m}"))?;
        if t > after {
            seen.insert(t);
        }
        (seen.len() >= 2)
            .then_some(())
            .ok_or(format!("{seen:?} after {after}"))
    });
}

/// kubectl manages a cluster on a coordinator whose store is etcd, as on
/// the embedded store (`--test e2e`).
#[test]
fn kubectl_manages_clusters_on_etcd() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdCluster::start(1);
    let key = tmp.path().join("encryption.key");
    let c = Coordinator::start_with_args(
        &tmp.path().join("coordinator"),
        CoordinatorOptions::default(),
        &[
            "--store",
            &etcd.store_url(),
            "--encryption-key-file",
            key.to_str().unwrap(),
        ],
        &format!("127.0.0.1:{}", free_port()),
    );
    drover_tests::kube_api::kubectl_manages_a_cluster(&c, tmp.path(), "web");
    let tokens = tmp.path().join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    drover_tests::kube_api::kubectl_manages_registration_tokens(&c, &tokens);
    // etcd's own revisions: a watch resumes across a restart.
    let mut c = c;
    drover_tests::kube_api::a_watch_resumes_after_a_restart(&mut c, tmp.path());
}
