//! The fleet simulator, `drover-agent simulate`, against a real coordinator.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use drover_tests::*;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

fn simulate(args: &[&str]) -> Output {
    Command::new(bin("drover-agent"))
        .arg("simulate")
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run drover-agent simulate")
}

/// `simulate` of `machines` machines bootstrapped by `boot`, with `more`
/// arguments.
fn simulate_fleet(boot: &Path, machines: &str, more: &[&str]) -> Output {
    let mut args = vec![
        "--bootstrap",
        boot.to_str().unwrap(),
        "--machines",
        machines,
    ];
    args.extend_from_slice(more);
    simulate(&args)
}

fn read_summary(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("summary JSON written");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("summary is not JSON ({e}): {text}"))
}

fn heartbeat_time(m: &serde_json::Value) -> OffsetDateTime {
    let t = m["status"]["lastHeartbeatTime"]
        .as_str()
        .unwrap_or_else(|| panic!("no lastHeartbeatTime: {m}"));
    OffsetDateTime::parse(t, &Rfc3339).unwrap()
}

#[test]
fn twenty_machines_register_heartbeat_fetch_config_and_go_silent() {
    let (tmp, c, boot) = coordinator_with_token("sim", "env=sim", 20, "1h");
    // A cluster that claims three simulated machines as they register, so
    // they fetch (and verify) their config bundles.
    c.apply_yaml(tmp.path(), &pool_cluster_yaml("simc", 1, 2, "sim"));

    let summary_path = tmp.path().join("summary.json");
    let out = simulate_fleet(
        &boot,
        "20",
        &[
            "--duration",
            "5s",
            "--ramp",
            "0",
            "--silence",
            "5",
            "--silence-after",
            "2s",
            "--summary-json",
            summary_path.to_str().unwrap(),
            "--progress",
            "1s",
        ],
    );
    // Right away, before the coordinator's 5 s heartbeat timeout can see
    // the machines the simulator stopped with its end.
    let cluster = c.cluster("simc").expect("cluster simc");
    let machines = c.machines();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "simulate failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );

    // The summary, as a table and as JSON.
    for needle in [
        "Registration",
        "20 / 20   failed 0",
        "Heartbeats (interval 1 s",
        "p99",
        "bundles fetched       3",
        "5 of 5 at +2s",
        "Errors\n  none",
        "memory (RSS)",
    ] {
        assert!(stdout.contains(needle), "{needle:?} not in:\n{stdout}");
    }
    assert!(
        stderr.contains("registered 20/20"),
        "no progress:\n{stderr}"
    );
    let s = read_summary(&summary_path);
    let context = format!("{s:#}\n{stdout}\n{stderr}");
    assert_eq!(s["machines"], 20, "{context}");
    assert_eq!(s["interrupted"], false, "{context}");
    assert_eq!(s["registration"]["registered"], 20, "{context}");
    assert_eq!(s["registration"]["failed"], 0, "{context}");
    assert!(s["registration"]["latency"]["p99Ms"].as_f64().unwrap() > 0.0);
    let hb = &s["heartbeats"];
    assert!(hb["ok"].as_u64().unwrap() > 20, "{context}");
    assert_eq!(hb["failed"], 0, "{context}");
    assert_eq!(hb["intervalSeconds"], 1.0, "{context}");
    let lat = &hb["latency"];
    let (p50, p90, p99, max) = (
        lat["p50Ms"].as_f64().unwrap(),
        lat["p90Ms"].as_f64().unwrap(),
        lat["p99Ms"].as_f64().unwrap(),
        lat["maxMs"].as_f64().unwrap(),
    );
    assert!(
        0.0 < p50 && p50 <= p90 && p90 <= p99 && p99 <= max,
        "{context}"
    );
    assert_eq!(lat["count"], hb["ok"], "{context}");
    // Registration ends within the first second: the rest is steady state.
    assert!(
        hb["steadyLatency"]["count"].as_u64().unwrap() > 0,
        "{context}"
    );
    assert!(hb["ratePerSecond"].as_f64().unwrap() > 0.0, "{context}");
    assert_eq!(s["config"]["fetches"], 3, "{context}");
    assert_eq!(s["config"]["failed"], 0, "{context}");
    assert_eq!(s["silence"]["silenced"], 5, "{context}");
    assert_eq!(s["errors"], serde_json::json!([]), "{context}");
    assert!(s["simulator"]["rssBytes"].as_u64().unwrap() > 0);

    // The coordinator's view: 20 simulated machines, three of them claimed
    // and running (config fetched and verified, reported bootstrapped).
    assert_eq!(machines.len(), 20, "{machines:#?}");
    for m in &machines {
        let host = m["status"]["hostname"].as_str().unwrap();
        assert!(host.starts_with("sim-"), "{m}");
        assert!(
            m["status"]["agentVersion"]
                .as_str()
                .unwrap()
                .ends_with("-simulated"),
            "{m}"
        );
    }
    let claimed: Vec<&serde_json::Value> = machines
        .iter()
        .filter(|m| m["spec"]["assignment"].is_object())
        .collect();
    assert_eq!(claimed.len(), 3, "{machines:#?}");
    for m in &claimed {
        assert_eq!(m["status"]["phase"], "Running", "{m}");
        let healthy = m["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Healthy"))
            .unwrap_or_else(|| panic!("no Healthy condition: {m}"));
        assert_eq!(healthy["status"], "True", "{m}");
    }
    assert_eq!(cluster["status"]["phase"], "Running", "{cluster:#}");

    // The silenced machines (unclaimed ones) stopped at +2 s; the others
    // heartbeated to the end at +5 s.
    let silenced: Vec<&str> = s["silence"]["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(silenced.len(), 5);
    let (quiet, alive): (Vec<_>, Vec<_>) = machines
        .iter()
        .partition(|m| silenced.contains(&m["metadata"]["name"].as_str().unwrap()));
    assert_eq!(quiet.len(), 5, "silenced names are the coordinator's");
    assert!(quiet.iter().all(|m| !m["spec"]["assignment"].is_object()));
    let last_quiet = quiet.iter().map(|m| heartbeat_time(m)).max().unwrap();
    let first_alive = alive.iter().map(|m| heartbeat_time(m)).min().unwrap();
    assert!(
        last_quiet + time::Duration::seconds(1) < first_alive,
        "silenced machines heartbeated until {last_quiet}, the others only until {first_alive}"
    );
}

/// A simulated control plane saves the snapshot it is asked for as the
/// agent does: the coordinator receives it sealed and records it, with
/// the size of the made-up database and etcd's hash.
#[test]
fn a_simulated_control_plane_saves_the_snapshot_it_is_asked_for() {
    let (tmp, c, boot) = coordinator_with_token("sim", "env=sim", 1, "1h");
    c.apply_yaml(tmp.path(), &pool_cluster_yaml("simb", 1, 0, "sim"));
    let mut child = Command::new(bin("drover-agent"))
        .args(["simulate", "--bootstrap", boot.to_str().unwrap()])
        .args(["--machines", "1", "--duration", "10m", "--ramp", "0"])
        .args(["--progress", "0", "--snapshot-bytes", "100000"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start drover-agent simulate");
    c.wait_cluster_phase("simb", "Running", Duration::from_secs(30));
    let saved = c.cli(&["backup", "cluster", "simb", "--wait", "--timeout", "30s"]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        saved.status.success(),
        "{}",
        String::from_utf8_lossy(&saved.stderr)
    );
    let snapshots: serde_json::Value =
        serde_json::from_str(&c.cli_ok(&["get", "snapshots", "simb", "-o", "json"])).unwrap();
    let snap = &snapshots[0];
    assert_eq!(snap["status"]["size"], 100_032, "{snapshots:#}");
    assert_eq!(snap["status"]["etcdVersion"], "simulated", "{snap:#}");
    c.sealed_snapshot(snap);
}

#[test]
fn sigterm_stops_early_and_still_prints_the_summary() {
    let (tmp, c, boot) = coordinator_with_token("sim", "env=sim", 5, "1h");
    let summary_path = tmp.path().join("summary.json");
    let mut child = Command::new(bin("drover-agent"))
        .args(["simulate", "--bootstrap", boot.to_str().unwrap()])
        .args(["--machines", "5", "--duration", "10m", "--ramp", "0"])
        .args(["--progress", "0", "--summary-json"])
        .arg(&summary_path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start drover-agent simulate");
    wait_for("5 simulated machines", Duration::from_secs(30), || {
        let n = c.machines().len();
        if n == 5 {
            Ok(())
        } else {
            Err(format!("{n} registered"))
        }
    });
    std::thread::sleep(Duration::from_millis(1500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("simulate did not stop within 20 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(status.success(), "{status:?}\n{stdout}");
    assert!(stdout.contains("interrupted"), "{stdout}");
    let s = read_summary(&summary_path);
    assert_eq!(s["interrupted"], true, "{s:#}");
    assert_eq!(s["registration"]["registered"], 5, "{s:#}");
    assert!(s["heartbeats"]["ok"].as_u64().unwrap() >= 5, "{s:#}");
    assert!(s["durationSeconds"].as_f64().unwrap() < 60.0, "{s:#}");
}

#[test]
fn bad_flags_exit_64_with_a_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing.yaml");
    let missing = missing.to_str().unwrap();
    let unwritable = tmp.path().join("no/such/dir/summary.json");
    for (args, needle) in [
        (
            vec!["--bootstrap", missing, "--machines", "0"],
            "--machines",
        ),
        (vec!["--machines", "3"], "--bootstrap"),
        (
            vec![
                "--bootstrap",
                missing,
                "--machines",
                "3",
                "--jitter",
                "150%",
            ],
            "from 0% to 100%",
        ),
        (
            vec!["--bootstrap", missing, "--machines", "2", "--silence", "3"],
            "--silence 3 is more than --machines 2",
        ),
        (
            vec![
                "--bootstrap",
                missing,
                "--machines",
                "2",
                "--duration",
                "1h2",
            ],
            "needs a unit",
        ),
        (
            vec!["--bootstrap", missing, "--machines", "2"],
            "cannot read the bootstrap document",
        ),
    ] {
        let out = simulate(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: {needle:?} not in {stderr}"
        );
    }
    // An unwritable summary file is reported before the run, not after it.
    let boot = tmp.path().join("boot.yaml");
    std::fs::write(
        &boot,
        "apiVersion: drover.dev/v1alpha1\nkind: BootstrapConfig\ncoordinators:\n- https://127.0.0.1:1\n\
         caPin: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\nticket: t\n",
    )
    .unwrap();
    let out = simulate_fleet(
        &boot,
        "2",
        &["--summary-json", unwritable.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("--summary-json"), "{stderr}");
    // Help is not an error.
    let out = simulate(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--silence-after") && help.contains("drover token create"));
}
