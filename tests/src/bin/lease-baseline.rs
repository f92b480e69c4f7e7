//! The Kubernetes-style baseline for `bench/run`: what one node heartbeat
//! costs when, as in Kubernetes, it is a Lease renewal written to etcd.
//!
//! Each simulated node owns a key `/registry/leases/kube-node-lease/NODE`
//! holding a Lease-sized object (~300 bytes), and every `--interval` (with
//! ±10 % jitter) renews it the way kube-apiserver's GuaranteedUpdate does:
//! one etcd transaction that compares the key's mod revision with the one
//! last seen and puts the new object. It prints a JSON summary: renewals
//! done and failed, the rate achieved, and latency percentiles.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

#[derive(Parser, Debug)]
#[command(about = "Drives Kubernetes-style node lease renewals against etcd")]
struct Args {
    /// etcd client endpoints, comma-separated (`127.0.0.1:2379,...`).
    #[arg(long)]
    endpoints: String,
    /// Simulated nodes.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// Renewal interval of each node (Kubernetes renews every 10 s).
    #[arg(long, default_value = "10s", value_parser = drover_common::api::parse_duration)]
    interval: Duration,
    /// How long to measure, after every node has created its lease.
    #[arg(long, default_value = "60s", value_parser = drover_common::api::parse_duration)]
    duration: Duration,
    /// gRPC connections to spread the nodes over (kube-apiserver keeps a
    /// few).
    #[arg(long, default_value_t = 4)]
    connections: usize,
}

fn lease_object(node: usize, renew: u64) -> Vec<u8> {
    format!(
        r#"{{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{{"name":"node-{node}","namespace":"kube-node-lease","uid":"00000000-0000-4000-8000-{node:012}","resourceVersion":"{renew}","ownerReferences":[{{"apiVersion":"v1","kind":"Node","name":"node-{node}"}}]}},"spec":{{"holderIdentity":"node-{node}","leaseDurationSeconds":40,"renewTime":"2026-11-22T00:00:{:02}.{renew:06}Z"}}}}"#,
        renew % 60
    )
    .into_bytes()
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    failed: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let endpoints: Vec<String> = args
        .endpoints
        .split(',')
        .map(|e| e.trim().to_owned())
        .collect();
    let mut clients = vec![];
    for _ in 0..args.connections.max(1) {
        clients.push(Client::connect(&endpoints, None).await?);
    }
    // Create every lease first.
    let mut revisions = vec![0i64; args.nodes];
    for (i, rev) in revisions.iter_mut().enumerate() {
        let key = format!("/registry/leases/kube-node-lease/node-{i}");
        let resp = clients[i % clients.len()]
            .kv_client()
            .put(key, lease_object(i, 0), None)
            .await?;
        *rev = resp.header().map(|h| h.revision()).unwrap_or(0);
    }
    let tally = Arc::new(std::sync::Mutex::new(Tally::default()));
    let started = Instant::now();
    let deadline = started + args.duration;
    let mut tasks = vec![];
    for (i, mut rev) in revisions.into_iter().enumerate() {
        let mut kv = clients[i % clients.len()].kv_client();
        let tally = tally.clone();
        let interval = args.interval;
        let nodes = args.nodes;
        tasks.push(tokio::spawn(async move {
            use rand::Rng;
            // Spread the first renewals over one interval.
            let offset = interval.mul_f64(i as f64 / nodes as f64);
            tokio::time::sleep(offset).await;
            let key = format!("/registry/leases/kube-node-lease/node-{i}");
            let mut n = 1u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                    .and_then([TxnOp::put(key.as_str(), lease_object(i, n), None)]);
                let outcome = kv.txn(txn).await;
                let took = t.elapsed().as_micros() as u64;
                {
                    let mut t = tally.lock().unwrap();
                    match &outcome {
                        Ok(r) if r.succeeded() => t.latencies_us.push(took),
                        _ => t.failed += 1,
                    }
                }
                if let Ok(r) = outcome {
                    rev = r.header().map(|h| h.revision()).unwrap_or(rev);
                }
                n += 1;
                let jitter = rand::rng().random_range(0.9..1.1);
                tokio::time::sleep(interval.mul_f64(jitter)).await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut t = tally.lock().unwrap();
    t.latencies_us.sort_unstable();
    let pct = |p: f64| -> f64 {
        if t.latencies_us.is_empty() {
            return 0.0;
        }
        let idx = ((p / 100.0) * (t.latencies_us.len() - 1) as f64).round() as usize;
        t.latencies_us[idx] as f64 / 1000.0
    };
    let summary = serde_json::json!({
        "nodes": args.nodes,
        "intervalSeconds": args.interval.as_secs_f64(),
        "elapsedSeconds": elapsed,
        "renewals": t.latencies_us.len(),
        "failed": t.failed,
        "perSecond": t.latencies_us.len() as f64 / elapsed,
        "latencyMs": {"p50": pct(50.0), "p99": pct(99.0), "max": pct(100.0)},
    });
    println!("{summary}");
    Ok(())
}
