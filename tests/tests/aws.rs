//! The `aws` provider against the moto EC2 emulator on loopback: launches
//! with tags, client tokens and user data; each instance's boot played by an
//! agent reading that instance's user data from an IMDSv2 endpoint; a
//! terminated instance replaced; launch failures shown as conditions with
//! back-off and recovered from; orphans swept; delete terminating every
//! instance.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use drover_tests::aws::*;
use drover_tests::*;

const BOOT: Duration = Duration::from_secs(90);

/// The test's world: moto, the proxy in front of it, a client, and a
/// coordinator whose SDK goes through the proxy.
struct World {
    _moto: Moto,
    proxy: Ec2Proxy,
    ec2: Ec2,
    c: Coordinator,
    ami: String,
    subnets: Vec<String>,
    placement: Placement,
    dir: std::path::PathBuf,
    agents: BTreeMap<String, Agent>,
}

impl World {
    fn start(tmp: &Path, heartbeat_timeout: &'static str) -> Self {
        Self::start_with(tmp, heartbeat_timeout, &[])
    }

    /// [`World::start`] with more `drover serve` flags.
    fn start_with(tmp: &Path, heartbeat_timeout: &'static str, extra: &[&str]) -> Self {
        let moto = Moto::start(tmp);
        let proxy = Ec2Proxy::start(&moto.url);
        let ec2 = Ec2::new(&moto.url);
        let placement = Placement::new(&ec2, &unique("drover-nodes"));
        let c = Coordinator::start_with_args(
            tmp,
            CoordinatorOptions {
                heartbeat_interval: "1s",
                heartbeat_timeout,
                env: Ec2::coordinator_env(&proxy.url),
            },
            extra,
            &format!("127.0.0.1:{}", free_port()),
        );
        Self {
            _moto: moto,
            proxy,
            ec2,
            c,
            ami: placement.ami.clone(),
            subnets: placement.subnets.clone(),
            placement,
            dir: tmp.to_path_buf(),
            agents: BTreeMap::new(),
        }
    }

    fn cluster_yaml(&self, name: &str, workers: u32, ami: &str) -> String {
        self.placement.cluster_yaml(name, workers, Some(ami))
    }

    fn apply(&self, yaml: &str) {
        let f = self.dir.join("cluster.yaml");
        std::fs::write(&f, yaml).unwrap();
        self.c.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
    }

    /// Plays the boot of every live instance that has no agent yet.
    fn boot_new_instances(&mut self, cluster: &str) {
        boot_new_instances(&self.ec2, &self.proxy, &self.dir, cluster, &mut self.agents);
    }

    fn machines(&self, cluster: &str) -> Vec<serde_json::Value> {
        let out = self.c.cli_ok(&["get", "machines", "-a", "-o", "json"]);
        let all: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
        all.into_iter()
            .filter(|m| m["spec"]["assignment"]["cluster"] == cluster)
            .collect()
    }

    fn live_machines(&self, cluster: &str) -> Vec<serde_json::Value> {
        self.machines(cluster)
            .into_iter()
            .filter(|m| m["status"]["phase"] != "Deleted")
            .collect()
    }
}

fn condition<'a>(m: &'a serde_json::Value, type_: &str) -> Option<&'a serde_json::Value> {
    m["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn events(m: &serde_json::Value) -> Vec<String> {
    m["status"]["events"]
        .as_array()
        .map(|v| {
            v.iter()
                .map(|e| {
                    format!(
                        "{}: {}",
                        e["reason"].as_str().unwrap_or(""),
                        e["message"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn aws_cluster_launches_boots_replaces_and_deletes() {
    let tmp = tempfile::tempdir().unwrap();
    // A long heartbeat timeout: the terminated instance must be replaced
    // because EC2 reports it, not because it went silent.
    let mut w = World::start(tmp.path(), "120s");
    let name = unique("aws");
    w.apply(&w.cluster_yaml(&name, 2, &w.ami.clone()));

    // Three instances with Drover's tags, the user's and a Name.
    let instances = wait_for("three instances", BOOT, || {
        let v = w.ec2.live_instances(&name);
        if v.len() == 3 {
            Ok(v)
        } else {
            Err(format!("{} instances", v.len()))
        }
    });
    let machines = w.live_machines(&name);
    assert_eq!(machines.len(), 3);
    let cluster = w.c.cluster(&name).unwrap();
    let owner = instances[0].tags["drover.dev/managed-by"].clone();
    assert_eq!(owner.len(), 16, "{:?}", instances[0].tags);
    for i in &instances {
        let m = machines
            .iter()
            .find(|m| m["metadata"]["name"] == i.tags["drover.dev/machine"].as_str())
            .unwrap_or_else(|| panic!("no machine for {i:?}"));
        assert_eq!(
            i.tags["drover.dev/machine-uid"],
            m["metadata"]["uid"].as_str().unwrap()
        );
        assert_eq!(i.tags["drover.dev/cluster"], name);
        assert_eq!(
            i.tags["drover.dev/cluster-uid"],
            cluster["metadata"]["uid"].as_str().unwrap()
        );
        assert_eq!(i.tags["drover.dev/managed-by"], owner);
        assert_eq!(
            i.tags["Name"],
            format!("drover-{name}-{}", i.tags["drover.dev/machine"])
        );
        let role = m["spec"]["assignment"]["role"].as_str().unwrap();
        assert_eq!(
            i.tags["team"],
            if role == "worker" { "apps" } else { "infra" }
        );
        assert_eq!(i.image, w.ami);
        assert_eq!(m["status"]["providerId"], i.id.as_str());
        assert_eq!(m["status"]["failureDomain"], i.subnet.as_str());
        // User data: the cloud-config the agent reads, within EC2's limit,
        // carrying a ticket and no key material.
        let ud = w.ec2.user_data(&i.id);
        assert!(ud.starts_with("#cloud-config\n"), "{ud}");
        assert!(ud.contains("drover_bootstrap: |"), "{ud}");
        let cfg: serde_json::Value = serde_saphyr::from_str(&ud).unwrap();
        let doc: serde_json::Value =
            serde_saphyr::from_str(cfg["drover_bootstrap"].as_str().unwrap()).unwrap();
        assert!(doc["ticket"].as_str().unwrap().starts_with("dt1."), "{ud}");
        assert_eq!(doc["coordinators"][0], w.c.url().as_str(), "{ud}");
        assert!(!ud.contains("PRIVATE KEY"), "{ud}");
        assert!(ud.len() <= 16 * 1024);
    }
    // The workers spread over the pool's two subnets.
    let worker_subnets: BTreeSet<&str> = instances
        .iter()
        .filter(|i| i.tags["team"] == "apps")
        .map(|i| i.subnet.as_str())
        .collect();
    assert_eq!(worker_subnets.len(), 2, "{instances:?}");

    // Every launch carried its machine's UID as the client token, and the
    // instances asked for IMDSv2 only.
    let launches = w.proxy.calls("RunInstances");
    let tokens: BTreeSet<String> = launches
        .iter()
        .map(|c| c.params.get("ClientToken").cloned().unwrap_or_default())
        .collect();
    let uids: BTreeSet<String> = instances
        .iter()
        .map(|i| i.tags["drover.dev/machine-uid"].clone())
        .collect();
    assert_eq!(tokens, uids, "{launches:?}");
    for l in &launches {
        assert_eq!(
            l.params
                .get("MetadataOptions.HttpTokens")
                .map(String::as_str),
            Some("required"),
            "{l:?}"
        );
        assert_eq!(l.params.get("MinCount").map(String::as_str), Some("1"));
    }

    // A ticket presented from another instance is refused, and stays good
    // for its own instance.
    let (a, b) = (&instances[1], &instances[2]);
    let stolen = w.proxy.imds(&b.id, &w.ec2.user_data(&a.id));
    let mut thief = Agent::boot(&w.dir.join("thief"), "thief", Boot::Imds(stolen));
    let status = wait_for("the thief's agent to give up", BOOT, || {
        thief.try_exit().ok_or("still running".to_string())
    });
    assert_eq!(status.code(), Some(2), "{}", thief.log());
    assert!(
        thief
            .log()
            .contains(&format!("presented from instance {}", b.id)),
        "{}",
        thief.log()
    );

    // Each instance boots; the cluster runs.
    w.boot_new_instances(&name);
    w.c.wait_cluster_phase(&name, "Running", BOOT);

    // An instance terminated behind Drover's back is replaced without
    // waiting for the heartbeat timeout.
    let victim = w
        .live_machines(&name)
        .into_iter()
        .find(|m| m["spec"]["assignment"]["role"] == "worker")
        .unwrap();
    let victim_name = victim["metadata"]["name"].as_str().unwrap().to_owned();
    let victim_id = victim["status"]["providerId"].as_str().unwrap().to_owned();
    let started = std::time::Instant::now();
    w.ec2.terminate(&victim_id);
    if let Some(mut a) = w.agents.remove(&victim_id) {
        a.kill();
        a.stop_daemons();
    }
    wait_for(
        "the terminated instance's machine to be replaced",
        BOOT,
        || {
            let all = w.machines(&name);
            let old = all
                .iter()
                .find(|m| m["metadata"]["name"] == victim_name.as_str())
                .ok_or("old machine forgotten")?;
            let ev = events(old);
            if ev.iter().any(|e| e.starts_with("ReplacedBy")) {
                Ok(())
            } else {
                Err(format!("{ev:?}"))
            }
        },
    );
    let replaced_after = started.elapsed();
    assert!(w
        .machines(&name)
        .iter()
        .find(|m| m["metadata"]["name"] == victim_name.as_str())
        .map(events)
        .unwrap()
        .iter()
        .any(|e| e.contains("its provider reports it stopped")),);
    eprintln!("terminated instance replaced after {replaced_after:?} (heartbeat timeout 120s)");
    wait_for("a fourth instance", BOOT, || {
        let n = w.ec2.live_instances(&name).len();
        if n == 3 && w.ec2.instances(&name).len() == 4 {
            Ok(())
        } else {
            Err(format!("{n} live"))
        }
    });
    w.boot_new_instances(&name);
    w.c.wait_cluster_phase(&name, "Running", BOOT);

    // An instance tagged as this coordinator's but for no known machine is
    // an orphan: the sweeper terminates it.
    let mut tags = instances[0].tags.clone();
    tags.insert(
        "drover.dev/machine-uid".into(),
        "00000000-0000-4000-8000-000000000000".into(),
    );
    tags.insert("drover.dev/machine".into(), "ghost".into());
    let orphan = w.ec2.launch_orphan(&w.ami, &w.subnets[0], &tags);
    wait_for(
        "the orphan to be terminated",
        Duration::from_secs(60),
        || {
            let st = w
                .ec2
                .instances(&name)
                .into_iter()
                .find(|i| i.id == orphan)
                .map(|i| i.state)
                .unwrap_or_default();
            if st == "terminated" {
                Ok(())
            } else {
                Err(st)
            }
        },
    );
    assert!(w.c.output().contains("orphan instance terminated"));

    // Delete terminates every instance the cluster launched.
    w.c.cli_ok(&["delete", "cluster", &name, "--wait", "--timeout", "90s"]);
    assert_eq!(
        w.ec2.live_instances(&name).len(),
        0,
        "{:?}",
        w.ec2.instances(&name)
    );
    let terminates = w.proxy.calls("TerminateInstances");
    assert!(!terminates.is_empty());
}

#[test]
fn aws_launch_failures_show_as_conditions_and_recover() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = World::start(tmp.path(), "20s");
    let name = unique("awsfail");

    // An AMI EC2 does not know: every machine says so, nothing launches,
    // and the launches back off instead of hammering the API.
    w.apply(&w.cluster_yaml(&name, 1, "ami-00000000deadbeef0"));
    wait_for("InvalidConfiguration on both machines", BOOT, || {
        let ms = w.live_machines(&name);
        let bad: Vec<_> = ms
            .iter()
            .filter_map(|m| condition(m, "ProviderReady"))
            .filter(|c| c["status"] == "False" && c["reason"] == "InvalidConfiguration")
            .collect();
        if ms.len() == 2 && bad.len() == 2 {
            Ok(())
        } else {
            Err(format!("{ms:?}"))
        }
    });
    let m = &w.live_machines(&name)[0];
    let msg = condition(m, "ProviderReady").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(msg.contains("InvalidAMIID"), "{msg}");
    assert!(msg.contains("next in"), "{msg}");
    assert_eq!(w.ec2.live_instances(&name).len(), 0);
    // Watch the API over five more reconcile passes: with a first back-off
    // of a minute, no machine is tried again.
    let before = w.proxy.calls("RunInstances").len();
    let runs = w.c.reconciler_runs();
    wait_for("five reconcile passes", BOOT, || {
        let now = w.c.reconciler_runs();
        if now >= runs + 5 {
            Ok(())
        } else {
            Err(format!("{now} runs"))
        }
    });
    let after = w.proxy.calls("RunInstances").len();
    assert!(
        before <= 2 && after == before,
        "RunInstances calls: {before} then {after}"
    );

    // Fixing the AMI retries at once, without waiting out the back-off.
    w.apply(&w.cluster_yaml(&name, 1, &w.ami.clone()));
    wait_for("two instances", BOOT, || {
        let n = w.ec2.live_instances(&name).len();
        if n == 2 {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    });
    w.boot_new_instances(&name);
    w.c.wait_cluster_phase(&name, "Running", BOOT);
    for m in w.live_machines(&name) {
        let c = condition(&m, "ProviderReady").unwrap();
        assert_eq!(c["status"], "True", "{m}");
    }

    // Throttling: the SDK retries three times, then Drover backs off and
    // shows it; the next attempt gets through.
    w.proxy
        .fail_next("RunInstances", 4, 503, "RequestLimitExceeded");
    w.apply(&w.cluster_yaml(&name, 2, &w.ami.clone()));
    let throttled = wait_for("a Throttled machine", BOOT, || {
        w.live_machines(&name)
            .into_iter()
            .find(|m| events(m).iter().any(|e| e.starts_with("Throttled")))
            .map(|m| m["metadata"]["name"].as_str().unwrap().to_owned())
            .ok_or_else(|| "none yet".to_string())
    });
    wait_for("the throttled machine's instance", BOOT, || {
        let m = w
            .live_machines(&name)
            .into_iter()
            .find(|m| m["metadata"]["name"] == throttled.as_str())
            .ok_or("gone")?;
        match (
            m["status"]["providerId"].as_str(),
            condition(&m, "ProviderReady"),
        ) {
            (Some(_), Some(c)) if c["status"] == "True" => Ok(()),
            _ => Err(format!("{}", m["status"])),
        }
    });
    assert!(w.proxy.calls("RunInstances").len() >= 4 + 3);
    w.boot_new_instances(&name);
    w.c.wait_cluster_phase(&name, "Running", BOOT);

    w.c.cli_ok(&["delete", "cluster", &name, "--wait", "--timeout", "90s"]);
    assert_eq!(w.ec2.live_instances(&name).len(), 0);
}

/// The registered targets of a target group, `ip:port`, sorted.
fn targets(w: &World, tg: &str) -> Vec<String> {
    let mut v: Vec<String> = w
        .proxy
        .elb
        .targets(tg)
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    v.sort();
    v
}

/// The ARNs of every load balancer and of every target group moto holds.
fn load_balancers(w: &World) -> (Vec<String>, Vec<String>) {
    let elb = w.proxy.elb.client().clone();
    w.proxy.elb.block_on(async move {
        let lbs = elb.describe_load_balancers().send().await.unwrap();
        let tgs = elb.describe_target_groups().send().await.unwrap();
        (
            lbs.load_balancers()
                .iter()
                .filter_map(|l| l.load_balancer_arn().map(str::to_owned))
                .collect(),
            tgs.target_groups()
                .iter()
                .filter_map(|t| t.target_group_arn().map(str::to_owned))
                .collect(),
        )
    })
}

/// `address:apiServerPort` of the cluster's live control planes, sorted.
fn control_plane_backends(w: &World, cluster: &str) -> Vec<String> {
    let mut v: Vec<String> = w
        .live_machines(cluster)
        .iter()
        .filter(|m| m["spec"]["assignment"]["role"] != "worker")
        .filter(|m| m["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|m| {
            Some(format!(
                "{}:{}",
                m["status"]["addresses"][0].as_str()?,
                m["status"]["apiServerPort"].as_u64()?
            ))
        })
        .collect();
    v.sort();
    v
}

/// Waits for the cluster's recorded load balancer.
fn wait_load_balancer(w: &World, name: &str) -> serde_json::Value {
    wait_for("the load balancer in the cluster status", BOOT, || {
        let c = w.c.cluster(name).ok_or("no cluster")?;
        let lb = c["status"]["loadBalancer"].clone();
        if lb["id"].is_string() {
            Ok(lb)
        } else {
            Err(format!("{}", c["status"]))
        }
    })
}

/// Boots every instance as it is launched (joiners are launched once the
/// first control plane runs) until the cluster runs on `n` instances.
fn boot_until_running(w: &mut World, name: &str, n: usize) {
    wait_for(
        &format!("cluster {name} Running on {n} instances"),
        BOOT,
        || {
            w.boot_new_instances(name);
            let live = w.ec2.live_instances(name).len();
            let phase = w.c.cluster(name).map(|c| c["status"]["phase"].clone());
            match phase {
                Some(p) if live == n && p == "Running" => Ok(()),
                p => Err(format!("{live} live instances, phase {p:?}")),
            }
        },
    );
}

#[test]
fn aws_network_load_balancer_is_the_endpoint_and_follows_the_control_planes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = World::start(tmp.path(), "120s");
    let name = unique("awsnlb");
    w.apply(&w.placement.cluster_yaml_with(&name, 3, 1, None));

    // The load balancer comes first: its name goes into the API server
    // certificates and every kubeconfig.
    let lb = wait_load_balancer(&w, &name);
    let cluster = w.c.cluster(&name).unwrap();
    let uid = cluster["metadata"]["uid"].as_str().unwrap().to_owned();
    let lb_arn = lb["id"].as_str().unwrap().to_owned();
    let address = lb["address"].as_str().unwrap().to_owned();
    assert_eq!(cluster["status"]["controlPlaneEndpoint"], address.as_str());
    let actions = w.proxy.actions();
    let created = actions.iter().position(|a| a == "CreateLoadBalancer");
    let launched = actions.iter().position(|a| a == "RunInstances");
    assert!(
        created.is_some() && (launched.is_none() || created < launched),
        "{actions:?}"
    );

    // A Network Load Balancer tagged like the instances, a TCP listener on
    // 6443 forwarding to an ip target group health-checked on /readyz.
    let elb = w.proxy.elb.client().clone();
    let arn = lb_arn.clone();
    let (described, tags, listeners) = w.proxy.elb.block_on(async move {
        let d = elb.describe_load_balancers().load_balancer_arns(&arn);
        let t = elb.describe_tags().resource_arns(&arn).send().await;
        let l = elb.describe_listeners().load_balancer_arn(&arn);
        (d.send().await.unwrap(), t.unwrap(), l.send().await.unwrap())
    });
    let nlb = &described.load_balancers()[0];
    assert_eq!(nlb.r#type().unwrap().as_str(), "network");
    assert_eq!(nlb.scheme().unwrap().as_str(), "internal");
    let dns = nlb.dns_name().unwrap().to_owned();
    assert_eq!(address, format!("{dns}:6443"));
    assert!(
        nlb.load_balancer_name()
            .unwrap()
            .starts_with("drover-awsnlb"),
        "{nlb:?}"
    );
    let tags: BTreeMap<String, String> = tags.tag_descriptions()[0]
        .tags()
        .iter()
        .filter_map(|t| Some((t.key()?.to_owned(), t.value()?.to_owned())))
        .collect();
    assert_eq!(tags["drover.dev/cluster"], name);
    assert_eq!(tags["drover.dev/cluster-uid"], uid);
    assert_eq!(tags["team"], "infra");
    assert_eq!(tags["drover.dev/managed-by"].len(), 16, "{tags:?}");
    let listener = &listeners.listeners()[0];
    assert_eq!(listener.port(), Some(6443));
    assert_eq!(listener.protocol().unwrap().as_str(), "TCP");
    let tg_arn = listener.default_actions()[0]
        .target_group_arn()
        .unwrap()
        .to_owned();
    let elb = w.proxy.elb.client().clone();
    let arn = tg_arn.clone();
    let groups = w.proxy.elb.block_on(async move {
        elb.describe_target_groups()
            .target_group_arns(arn)
            .send()
            .await
            .unwrap()
    });
    let tg = &groups.target_groups()[0];
    assert_eq!(tg.protocol().unwrap().as_str(), "TCP");
    assert_eq!(tg.port(), Some(6443));
    assert_eq!(tg.target_type().unwrap().as_str(), "ip");
    assert_eq!(tg.health_check_protocol().unwrap().as_str(), "HTTPS");
    assert_eq!(tg.health_check_path(), Some("/readyz"));

    // Every machine joins through the load balancer (the test plays its
    // data plane); each control plane is registered once it bootstraps.
    boot_until_running(&mut w, &name, 4);
    wait_for("the three control planes registered", BOOT, || {
        let (have, want) = (targets(&w, &tg_arn), control_plane_backends(&w, &name));
        if want.len() == 3 && have == want {
            Ok(())
        } else {
            Err(format!("registered {have:?}, control planes {want:?}"))
        }
    });

    // Real kubectl reaches the API through the load balancer's name.
    let served = w.proxy.elb.address(&dns).unwrap();
    let kubeconfig = tmp.path().join("nlb.kubeconfig");
    let kc = w.c.cli_ok(&["kubeconfig", &name]);
    let server_line = format!("server: https://{address}");
    assert!(kc.contains(&server_line), "{kc}");
    let kc = kc.replace(
        &server_line,
        &format!("server: https://{served}\n    tls-server-name: {dns}"),
    );
    std::fs::write(&kubeconfig, kc).unwrap();
    wait_for("four Ready Nodes through the load balancer", BOOT, || {
        let (all, ready) = drover_tests::kube::nodes(&kubeconfig)?;
        if all.len() == 4 && ready.len() == 4 {
            Ok(())
        } else {
            Err(format!("{all:?}, ready {ready:?}"))
        }
    });
    // Each Node's providerID is what the AWS cloud controller would give
    // its instance: aws:///<zone>/<instance-id>.
    let ids: BTreeSet<String> = drover_tests::kube::provider_ids(&kubeconfig)
        .unwrap()
        .into_values()
        .collect();
    let instances: BTreeSet<String> = w
        .live_machines(&name)
        .iter()
        .map(|m| m["status"]["providerId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    for id in &ids {
        let (zone, instance) = id
            .strip_prefix("aws:///")
            .and_then(|rest| rest.split_once('/'))
            .unwrap_or_else(|| panic!("{id}"));
        let region = drover_tests::aws::REGION;
        assert!(
            zone.starts_with(region) && zone.len() == region.len() + 1,
            "{id}"
        );
        assert!(instances.contains(instance), "{id} among {instances:?}");
    }

    // A control plane whose instance is terminated is deregistered before
    // its machine goes, and its replacement registered; its Node goes.
    let init = w.c.cluster(&name).unwrap()["status"]["initMachine"].clone();
    let victim = w
        .live_machines(&name)
        .into_iter()
        .find(|m| m["spec"]["assignment"]["role"] != "worker" && m["metadata"]["name"] != init)
        .unwrap();
    let victim_name = victim["metadata"]["name"].as_str().unwrap().to_owned();
    let victim_id = victim["status"]["providerId"].as_str().unwrap().to_owned();
    let victim_backend = format!(
        "{}:{}",
        victim["status"]["addresses"][0].as_str().unwrap(),
        victim["status"]["apiServerPort"]
    );
    assert!(targets(&w, &tg_arn).contains(&victim_backend));
    w.ec2.terminate(&victim_id);
    if let Some(mut a) = w.agents.remove(&victim_id) {
        a.kill();
        a.stop_daemons();
    }
    wait_for("the terminated control plane deregistered", BOOT, || {
        let have = targets(&w, &tg_arn);
        if have.contains(&victim_backend) {
            Err(format!("{have:?}"))
        } else {
            Ok(())
        }
    });
    wait_for(
        "the terminated control plane's machine replaced",
        BOOT,
        || {
            let n = w.ec2.instances(&name).len();
            if n == 5 {
                Ok(())
            } else {
                Err(format!("{n} instances"))
            }
        },
    );
    boot_until_running(&mut w, &name, 4);
    wait_for("the replacement registered", BOOT, || {
        let (have, want) = (targets(&w, &tg_arn), control_plane_backends(&w, &name));
        if want.len() == 3 && have == want && !have.contains(&victim_backend) {
            Ok(())
        } else {
            Err(format!("registered {have:?}, control planes {want:?}"))
        }
    });
    wait_for("four Ready Nodes, the terminated one gone", BOOT, || {
        let (all, ready) = drover_tests::kube::nodes(&kubeconfig)?;
        if all.len() == 4 && ready.len() == 4 && !all.contains(&victim_name) {
            Ok(())
        } else {
            Err(format!("{all:?}, ready {ready:?}"))
        }
    });

    // Delete takes the load balancer and its target group with the
    // instances.
    w.c.cli_ok(&["delete", "cluster", &name, "--wait", "--timeout", "90s"]);
    assert_eq!(w.ec2.live_instances(&name).len(), 0);
    let (lb_left, tg_left) = load_balancers(&w);
    assert!(!lb_left.contains(&lb_arn), "{lb_left:?}");
    assert!(!tg_left.contains(&tg_arn), "{tg_left:?}");
}

#[test]
fn aws_control_planes_are_registered_in_the_users_target_group() {
    use aws_sdk_elasticloadbalancingv2::types::{
        Action, ActionTypeEnum, LoadBalancerTypeEnum, ProtocolEnum, TargetDescription,
        TargetTypeEnum,
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut w = World::start(tmp.path(), "120s");
    let name = unique("awstg");

    // The user's own load balancer, with a target of their own in its group.
    let elb = w.proxy.elb.client().clone();
    let subnet = w.subnets[0].clone();
    let (dns, lb_arn, tg_arn) = w.proxy.elb.block_on(async move {
        let lb = elb
            .create_load_balancer()
            .name("user-api")
            .r#type(LoadBalancerTypeEnum::Network)
            .subnets(subnet)
            .send()
            .await
            .unwrap();
        let lb = lb.load_balancers()[0].clone();
        let tg = elb
            .create_target_group()
            .name("user-api")
            .protocol(ProtocolEnum::Tcp)
            .port(6443)
            .vpc_id(lb.vpc_id().unwrap())
            .target_type(TargetTypeEnum::Ip)
            .send()
            .await
            .unwrap();
        let tg_arn = tg.target_groups()[0].target_group_arn().unwrap().to_owned();
        elb.create_listener()
            .load_balancer_arn(lb.load_balancer_arn().unwrap())
            .protocol(ProtocolEnum::Tcp)
            .port(6443)
            .default_actions(
                Action::builder()
                    .r#type(ActionTypeEnum::Forward)
                    .target_group_arn(&tg_arn)
                    .build(),
            )
            .send()
            .await
            .unwrap();
        elb.register_targets()
            .target_group_arn(&tg_arn)
            .targets(
                TargetDescription::builder()
                    .id("10.0.0.99")
                    .port(6443)
                    .build(),
            )
            .send()
            .await
            .unwrap();
        (
            lb.dns_name().unwrap().to_owned(),
            lb.load_balancer_arn().unwrap().to_owned(),
            tg_arn,
        )
    });
    let yaml = w.placement.cluster_yaml_with(&name, 1, 0, None).replace(
        "      controlPlane:\n",
        &format!("      loadBalancer:\n        targetGroupArn: {tg_arn}\n      controlPlane:\n"),
    ) + &format!("  controlPlaneEndpoint: {dns}:6443\n");
    w.apply(&yaml);
    let lb = wait_load_balancer(&w, &name);
    assert_eq!(lb["id"], tg_arn.as_str());
    assert_eq!(lb["address"], format!("{dns}:6443").as_str());
    boot_until_running(&mut w, &name, 1);
    wait_for(
        "the control plane registered beside the user's target",
        BOOT,
        || {
            let mut want = control_plane_backends(&w, &name);
            want.push("10.0.0.99:6443".into());
            want.sort();
            let have = targets(&w, &tg_arn);
            if want.len() == 2 && have == want {
                Ok(())
            } else {
                Err(format!("registered {have:?}, want {want:?}"))
            }
        },
    );
    // Drover made no load balancer of its own.
    assert!(
        w.proxy.calls("CreateLoadBalancer").is_empty()
            && w.proxy.calls("CreateTargetGroup").is_empty(),
        "{:?}",
        w.proxy.actions()
    );

    // Deleting the cluster deregisters its control plane and leaves the
    // user's load balancer, group and target alone.
    w.c.cli_ok(&["delete", "cluster", &name, "--wait", "--timeout", "90s"]);
    assert_eq!(targets(&w, &tg_arn), vec!["10.0.0.99:6443".to_string()]);
    assert!(load_balancers(&w).0.contains(&lb_arn));
}

/// An autoscaled AWS pool at zero: its template node has the vCPUs and
/// memory EC2 gives its instance type (t3.medium), so the autoscaler can
/// scale it from zero; scaled up, the new instance is the group's,
/// matched by its aws:/// providerID.
#[test]
fn an_aws_pool_scales_from_zero_by_its_instance_type() {
    use drover_tests::autoscaler::Autoscaler;
    let tmp = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut w = World::start_with(tmp.path(), "120s", &["--autoscaler-listen", &listen]);
    let name = unique("asg");
    let doc = w.cluster_yaml(&name, 0, &w.ami.clone()).replace(
        "    - name: default\n      replicas: 0\n",
        "    - name: default\n      autoscaling: {minReplicas: 0, maxReplicas: 2}\n",
    );
    assert!(doc.contains("autoscaling"), "{doc}");
    w.apply(&doc);
    boot_until_running(&mut w, &name, 1);
    let ca = Autoscaler::for_cluster(&w.c, &name, &tmp.path().join("autoscaler"));
    let group = format!("{name}/default");
    let template = ca.call(
        "NodeGroupTemplateNodeInfo",
        serde_json::json!({"id": group}),
    );
    assert_eq!(template.code, "OK", "{template:?}");
    // t3.medium: 2 vCPUs, 4 GiB (EC2's DescribeInstanceTypes).
    assert_eq!(template.node["status"]["capacity"]["cpu"]["string"], "2");
    assert_eq!(
        template.node["status"]["capacity"]["memory"]["string"],
        (4096u64 << 20).to_string()
    );

    ca.call(
        "NodeGroupIncreaseSize",
        serde_json::json!({"id": group, "delta": 1}),
    )
    .ok();
    boot_until_running(&mut w, &name, 2);
    let instances = ca
        .call("NodeGroupNodes", serde_json::json!({"id": group}))
        .ok()["instances"]
        .clone();
    let ids: Vec<String> = instances
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 1, "{instances}");
    assert!(
        ids[0].starts_with(&format!("aws:///{}", drover_tests::aws::REGION)),
        "{ids:?}"
    );
    let worker_instance = w
        .live_machines(&name)
        .into_iter()
        .find(|m| m["spec"]["assignment"]["machinePool"] == "default")
        .unwrap()["status"]["providerId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(ids[0].ends_with(&format!("/{worker_instance}")), "{ids:?}");
    let found = ca
        .call(
            "NodeGroupForNode",
            serde_json::json!({"node": {"providerID": ids[0]}}),
        )
        .ok();
    assert_eq!(found["nodeGroup"]["id"], group.as_str());
}

#[test]
fn an_aws_spot_pool_launches_on_spot_and_falls_back_to_on_demand_when_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let w = World::start(tmp.path(), "20s");
    let name = unique("awsspot");
    let spot = |workers: u32| {
        let yaml = w.cluster_yaml(&name, workers, &w.ami.clone()).replace(
            "          tags:\n            team: apps\n",
            "          tags:\n            team: apps\n          spot:\n            enabled: true\n            maxPrice: \"0.05\"\n            onDemandFallback: true\n",
        );
        assert!(yaml.contains("onDemandFallback: true"), "{yaml}");
        yaml
    };
    let spot_calls = || -> Vec<Call> {
        w.proxy
            .calls("RunInstances")
            .into_iter()
            .filter(|c| c.params.contains_key("InstanceMarketOptions.MarketType"))
            .collect()
    };
    // The control plane is never on spot.
    w.apply(&spot(0));
    wait_for("the control plane's instance", BOOT, || {
        let n = w.ec2.live_instances(&name).len();
        (n == 1).then_some(()).ok_or(format!("{n}"))
    });
    assert!(spot_calls().is_empty(), "the control plane went to spot");

    // EC2 has no spot capacity (every attempt of the SDK's three): the
    // worker is launched on demand, under another client token, and says
    // so.
    w.proxy
        .fail_next("RunInstances", 3, 500, "InsufficientInstanceCapacity");
    w.apply(&spot(1));
    let worker = wait_for("the worker launched on demand", BOOT, || {
        w.live_machines(&name)
            .into_iter()
            .find(|m| {
                m["spec"]["assignment"]["role"] == "worker" && m["status"]["providerId"].is_string()
            })
            .ok_or_else(|| "not yet".to_string())
    });
    let said = events(&worker);
    assert!(
        said.iter().any(|e| e.starts_with("ProviderCreated")
            && e.contains("on demand after spot was refused")
            && e.contains("InsufficientInstanceCapacity")),
        "{said:?}"
    );
    let refused = spot_calls();
    assert!(!refused.is_empty(), "no spot launch was tried");
    for c in &refused {
        assert_eq!(c.params["InstanceMarketOptions.MarketType"], "spot");
        assert_eq!(
            c.params["InstanceMarketOptions.SpotOptions.MaxPrice"],
            "0.05"
        );
        assert_eq!(
            c.params["InstanceMarketOptions.SpotOptions.SpotInstanceType"],
            "one-time"
        );
    }
    let uid = worker["metadata"]["uid"].as_str().unwrap();
    let on_demand: Vec<Call> = w
        .proxy
        .calls("RunInstances")
        .into_iter()
        .filter(|c| {
            c.params.get("ClientToken").map(String::as_str) == Some(&format!("{uid}-on-demand"))
        })
        .collect();
    assert_eq!(on_demand.len(), 1, "one on-demand launch");
    assert!(!on_demand[0]
        .params
        .contains_key("InstanceMarketOptions.MarketType"));
    assert!(
        w.c.metrics_text().contains("drover_spot_fallbacks_total 1"),
        "{}",
        w.c.metrics_text()
    );

    // With capacity, the next worker goes to spot.
    let before = spot_calls().len();
    w.apply(&spot(2));
    wait_for("the second worker on spot", BOOT, || {
        let ms = w.live_machines(&name);
        let created: Vec<Vec<String>> = ms
            .iter()
            .filter(|m| m["spec"]["assignment"]["role"] == "worker")
            .map(events)
            .collect();
        created
            .iter()
            .any(|es| {
                es.iter()
                    .any(|e| e.starts_with("ProviderCreated") && e.contains(", spot, region"))
            })
            .then_some(())
            .ok_or(format!("{created:?}"))
    });
    assert_eq!(spot_calls().len(), before + 1);
}
