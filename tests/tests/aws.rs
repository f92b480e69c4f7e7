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
        let moto = Moto::start(tmp);
        let proxy = Ec2Proxy::start(&moto.url);
        let ec2 = Ec2::new(&moto.url);
        let placement = Placement::new(&ec2, &unique("drover-nodes"));
        let c = Coordinator::start(
            tmp,
            CoordinatorOptions {
                heartbeat_interval: "1s",
                heartbeat_timeout,
                env: Ec2::coordinator_env(&proxy.url),
            },
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
