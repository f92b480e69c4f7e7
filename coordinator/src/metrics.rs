//! The coordinator's Prometheus metrics, served at `GET /metrics` in the
//! text exposition format. Every series is named `drover_…`.
//!
//! Counters and histograms are updated where things happen (the machine
//! API, the store, the providers, the background tasks, remediation) in
//! one process-wide [`Metrics`]; the gauges of what the coordinator holds
//! (clusters, machines, leadership, connections) are computed from its
//! state at each scrape, so they can never drift from it.

use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// A series' labels, in a fixed order.
pub type Labels = Vec<(&'static str, String)>;

type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Latency buckets from 1 ms to about 16 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Every metric of this coordinator process.
pub struct Metrics {
    registry: Registry,
    /// Serializes scrapes: each refreshes the state gauges, then encodes.
    scrape: Mutex<()>,
    heartbeats: Family<Labels, Counter>,
    machine_requests: Histograms,
    store_ops: Histograms,
    loop_runs: Histograms,
    reconcile_duration: Histograms,
    reconcile_wait: Histogram,
    reconcile_queue_depth: Gauge,
    loop_errors: Family<Labels, Counter>,
    loop_last_run: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    loop_period: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    remediations: Family<Labels, Counter>,
    reboots: Family<Labels, Counter>,
    bmc_actions: Family<Labels, Counter>,
    spot_fallbacks: Counter,
    provider_calls: Family<Labels, Counter>,
    provider_errors: Family<Labels, Counter>,
    autoscaler_calls: Family<Labels, Counter>,
    autoscaler_call_seconds: Histograms,
    clusters: Family<Labels, Gauge>,
    machines: Family<Labels, Gauge>,
    machine_problems: Family<Labels, Gauge>,
    leader: Gauge,
    leader_term: Gauge,
    connections: Family<Labels, Gauge>,
    handshakes: Family<Labels, Gauge>,
    datagram_machines: Family<Labels, Gauge>,
    endpoint_proxy_connections: Family<Labels, Gauge>,
    endpoint_proxy_closed: Family<Labels, Gauge>,
    history: Mutex<std::collections::VecDeque<Minute>>,
    /// The hot paths' series, made once: a heartbeat or a store call finds
    /// its histogram without building labels.
    hot: std::collections::HashMap<(&'static str, &'static str), Histogram>,
    heartbeats_accepted: Counter,
    heartbeats_refused: Counter,
    datagrams: Family<Labels, Counter>,
    /// [`DATAGRAM_RESULTS`]' counters, in that order.
    datagram_results: Vec<Counter>,
}

/// The `result` label of `drover_heartbeat_datagrams_total`: answered quiet
/// or "call over HTTPS", or refused unanswered, and why.
pub const DATAGRAM_RESULTS: [&str; 8] = [
    "quiet",
    "call_https",
    "malformed",
    "unknown_machine",
    "bad_tag",
    "replayed",
    "out_of_window",
    "not_leader",
];

/// The machine API operations, as the `operation` label.
const MACHINE_OPERATIONS: [&str; 6] = [
    "register",
    "heartbeat",
    "datagram",
    "config",
    "certificate",
    "other",
];
/// The store operations, as the `operation` label.
const STORE_OPERATIONS: [&str; 3] = ["get", "list", "txn"];
/// The store results, as the `result` label.
const STORE_RESULTS: [&str; 3] = ["ok", "conflict", "error"];

/// Heartbeats accepted and remediations in one minute, for the web view's
/// chart of the last hour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Minute {
    /// Minutes since the Unix epoch.
    pub minute: u64,
    pub heartbeats: u64,
    pub remediations: u64,
}

/// How many minutes [`Metrics::last_hour`] covers.
pub const HISTORY_MINUTES: usize = 60;

fn unix_minute() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        / 60
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn global() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("drover");
        let m = Self {
            registry: Registry::default(),
            scrape: Mutex::new(()),
            heartbeats: Family::default(),
            machine_requests: Family::new_with_constructor(latency_histogram),
            store_ops: Family::new_with_constructor(latency_histogram),
            loop_runs: Family::new_with_constructor(latency_histogram),
            reconcile_duration: Family::new_with_constructor(latency_histogram),
            reconcile_wait: latency_histogram(),
            reconcile_queue_depth: Gauge::default(),
            loop_errors: Family::default(),
            loop_last_run: Family::default(),
            loop_period: Family::default(),
            remediations: Family::default(),
            reboots: Family::default(),
            bmc_actions: Family::default(),
            spot_fallbacks: Counter::default(),
            provider_calls: Family::default(),
            provider_errors: Family::default(),
            autoscaler_calls: Family::default(),
            autoscaler_call_seconds: Family::new_with_constructor(latency_histogram),
            clusters: Family::default(),
            machines: Family::default(),
            machine_problems: Family::default(),
            leader: Gauge::default(),
            leader_term: Gauge::default(),
            connections: Family::default(),
            handshakes: Family::default(),
            datagram_machines: Family::default(),
            endpoint_proxy_connections: Family::default(),
            endpoint_proxy_closed: Family::default(),
            history: Mutex::new(Default::default()),
            hot: Default::default(),
            heartbeats_accepted: Counter::default(),
            heartbeats_refused: Counter::default(),
            datagrams: Family::default(),
            datagram_results: Vec::new(),
        };
        let datagram_results = DATAGRAM_RESULTS
            .iter()
            .map(|r| {
                m.datagrams
                    .get_or_create_owned(&vec![("result", (*r).to_owned())])
            })
            .collect();
        registry.register(
            "heartbeat_datagrams",
            "Heartbeat datagrams received, by result: answered quiet or call_https, or refused unanswered (malformed, unknown_machine, bad_tag, replayed, out_of_window, not_leader)",
            m.datagrams.clone(),
        );
        let mut hot = std::collections::HashMap::new();
        for op in MACHINE_OPERATIONS {
            for result in ["ok", "refused"] {
                let h = m.machine_requests.get_or_create_owned(&vec![
                    ("operation", op.to_owned()),
                    ("result", result.to_owned()),
                ]);
                hot.insert((op, result), h);
            }
        }
        for op in STORE_OPERATIONS {
            for result in STORE_RESULTS {
                let h = m.store_ops.get_or_create_owned(&vec![
                    ("operation", op.to_owned()),
                    ("result", result.to_owned()),
                ]);
                hot.insert((op, result), h);
            }
        }
        let heartbeats_accepted = m
            .heartbeats
            .get_or_create_owned(&vec![("result", "accepted".to_owned())]);
        let heartbeats_refused = m
            .heartbeats
            .get_or_create_owned(&vec![("result", "refused".to_owned())]);
        registry.register(
            "heartbeats",
            "Machine heartbeats answered, by result: accepted, or refused (a bad certificate, a revoked or deleted machine, a follower, a malformed body)",
            m.heartbeats.clone(),
        );
        registry.register(
            "machine_request_duration_seconds",
            "Time to answer machine API requests, by operation (register, config, heartbeat, certificate; datagram: a heartbeat datagram, from its receipt to its answer) and result",
            m.machine_requests.clone(),
        );
        registry.register(
            "store_operation_duration_seconds",
            "Time of store operations that reach the backend (reads served from the cache are not counted), by operation (get, list, txn) and result",
            m.store_ops.clone(),
        );
        registry.register(
            "loop_run_duration_seconds",
            "Time of one run of a background loop (the cluster reconciler, the sweeper, ...), by loop",
            m.loop_runs.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time of one cluster's reconcile (read, plan, apply its steps), by result (ok, error)",
            m.reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_queue_wait_seconds",
            "How long a cluster waited in the reconcile queue for a worker",
            m.reconcile_wait.clone(),
        );
        registry.register(
            "reconcile_queue_depth",
            "Clusters waiting in the reconcile queue for a worker",
            m.reconcile_queue_depth.clone(),
        );
        registry.register(
            "loop_errors",
            "Runs of a background loop that ended in an error, by loop",
            m.loop_errors.clone(),
        );
        registry.register(
            "loop_last_run_timestamp_seconds",
            "When a background loop last finished a run (Unix time), by loop; with loop_period_seconds, shows a stalled loop",
            m.loop_last_run.clone(),
        );
        registry.register(
            "loop_period_seconds",
            "How often a background loop runs when nothing wakes it earlier, by loop; none for a loop that runs only when woken",
            m.loop_period.clone(),
        );
        registry.register(
            "remediations",
            "Machines taken out of their cluster to be replaced, by why (silent, stopped, not_started, node_not_ready, node_missing, reported, problem)",
            m.remediations.clone(),
        );
        registry.register(
            "remediation_reboots",
            "Reboots asked of unhealthy machines by their pool's remediation, by why (as drover_remediations_total)",
            m.reboots.clone(),
        );
        registry.register(
            "spot_fallbacks",
            "Instances launched on demand because EC2 refused a spot launch (a pool's onDemandFallback)",
            m.spot_fallbacks.clone(),
        );
        registry.register(
            "bmc_power_actions",
            "Power actions asked of machines' BMCs through Redfish, by action (cycle, off, on) and result (ok, error)",
            m.bmc_actions.clone(),
        );
        registry.register(
            "provider_calls",
            "Calls to a machine provider, by provider (docker, aws) and operation",
            m.provider_calls.clone(),
        );
        registry.register(
            "provider_errors",
            "Failed calls to a machine provider, by provider, operation and error class (throttled, insufficient_capacity, quota_exceeded, unauthorized, invalid_configuration, transient, other)",
            m.provider_errors.clone(),
        );
        registry.register(
            "autoscaler_calls",
            "Calls of the cluster-autoscaler's externalgrpc service, by method and gRPC code (ok, invalid_argument, not_found, permission_denied, out_of_range, failed_precondition, unauthenticated, unimplemented, unavailable, other)",
            m.autoscaler_calls.clone(),
        );
        registry.register(
            "autoscaler_call_seconds",
            "How long the externalgrpc service took to answer, by method (the autoscaler gives up after its grpc_timeout, 5 s by default)",
            m.autoscaler_call_seconds.clone(),
        );
        registry.register("clusters", "Clusters, by phase.", m.clusters.clone());
        registry.register(
            "machines",
            "Machines, by phase, health (healthy, unhealthy, silent, unknown) and provider (pool, docker, aws)",
            m.machines.clone(),
        );
        registry.register(
            "machine_problems",
            "Machines whose agent reports a node problem now, by problem (ReadOnlyFilesystem, DiskPressure, MemoryPressure, PIDPressure)",
            m.machine_problems.clone(),
        );
        registry.register(
            "leader",
            "Whether this replica leads (1) or follows (0)",
            m.leader.clone(),
        );
        registry.register(
            "leader_term",
            "This replica's leadership term while it leads, else 0",
            m.leader_term.clone(),
        );
        registry.register(
            "heartbeat_datagram_machines",
            "Machines whose last heartbeat was a quiet datagram, by role (control_plane: a running control plane; other: a worker or a pool machine)",
            m.datagram_machines.clone(),
        );
        registry.register(
            "connections",
            "Client connections held now, by state (open, parked between requests, unauthenticated)",
            m.connections.clone(),
        );
        registry.register(
            "tls_handshakes",
            "TLS handshakes since start, by result (full, resumed, failed); a counter kept by the server, exposed as a gauge of its value",
            m.handshakes.clone(),
        );
        registry.register(
            "endpoint_proxy_connections",
            "Connections the managed control-plane endpoints hold now, all endpoints together, by state (open: admitted, connecting or forwarding)",
            m.endpoint_proxy_connections.clone(),
        );
        registry.register(
            "endpoint_proxy_closed",
            "Managed endpoint connections the proxy closed since start, by reason: refused at once over a cap (per_source, total), no backend ready or accepting (no_backend), or timed out (idle: no byte either way; half_closed: one side closed, the other silent); a counter kept by the proxy, exposed as a gauge of its value and refreshed every second",
            m.endpoint_proxy_closed.clone(),
        );
        Self {
            registry,
            hot,
            heartbeats_accepted,
            heartbeats_refused,
            datagram_results,
            ..m
        }
    }

    /// Records a machine API request: `operation` is register, config,
    /// heartbeat or certificate.
    pub fn machine_request(&self, operation: &'static str, ok: bool, took: Duration) {
        let result = if ok { "ok" } else { "refused" };
        if operation == "heartbeat" {
            if ok {
                self.heartbeats_accepted.inc();
                self.count_minute(|m| m.heartbeats += 1);
            } else {
                self.heartbeats_refused.inc();
            }
        }
        self.observe_hot(operation, result, took);
    }

    /// Records the managed endpoints' proxy figures (the `endpoint-proxies`
    /// task, once a period).
    pub fn endpoint_proxy(&self, stats: &drover_common::tcp_proxy::Stats) {
        self.endpoint_proxy_connections
            .get_or_create(&vec![("state", "open".to_owned())])
            .set(stats.open as i64);
        for (reason, v) in [
            ("per_source", stats.refused_per_source),
            ("total", stats.refused_total),
            ("no_backend", stats.no_backend),
            ("idle", stats.idle_timeouts),
            ("half_closed", stats.half_close_timeouts),
        ] {
            self.endpoint_proxy_closed
                .get_or_create(&vec![("reason", reason.to_owned())])
                .set(v as i64);
        }
    }

    /// Counts one heartbeat datagram by `result`, one of
    /// [`DATAGRAM_RESULTS`]; a quiet one also counts as an accepted
    /// heartbeat (one answered "call over HTTPS" is counted when that
    /// heartbeat comes).
    pub fn datagram(&self, result: &'static str) {
        if let Some(i) = DATAGRAM_RESULTS.iter().position(|r| *r == result) {
            self.datagram_results[i].inc();
        }
        if result == "quiet" {
            self.heartbeats_accepted.inc();
            self.count_minute(|m| m.heartbeats += 1);
        }
    }

    fn observe_hot(&self, operation: &'static str, result: &'static str, took: Duration) {
        match self.hot.get(&(operation, result)) {
            Some(h) => h.observe(took.as_secs_f64()),
            None => {
                let family = if STORE_OPERATIONS.contains(&operation) {
                    &self.store_ops
                } else {
                    &self.machine_requests
                };
                family
                    .get_or_create(&vec![
                        ("operation", operation.to_owned()),
                        ("result", result.to_owned()),
                    ])
                    .observe(took.as_secs_f64());
            }
        }
    }

    /// Records one store operation that reached the backend; `result` is
    /// ok, conflict (a precondition failed) or error.
    pub fn store_operation(&self, operation: &'static str, result: &'static str, took: Duration) {
        self.observe_hot(operation, result, took);
    }

    /// Records one run of background loop `name`.
    /// Records a run of background loop `name`; `period` is `None` for a
    /// loop that runs only when woken (the registration committer), which
    /// gets no `loop_period_seconds` series: it is never late, and a period
    /// of 0 would make `DroverLoopStalled` fire a second after each run.
    pub fn loop_run(&self, name: &str, period: Option<Duration>, took: Duration, failed: bool) {
        let labels = vec![("loop", name.to_owned())];
        self.loop_runs
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if failed {
            self.loop_errors.get_or_create(&labels).inc();
        } else {
            // Registered with no error yet: the series exists at 0.
            let _ = self.loop_errors.get_or_create(&labels);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.loop_last_run.get_or_create(&labels).set(now);
        if let Some(period) = period {
            self.loop_period
                .get_or_create(&labels)
                .set(period.as_secs_f64());
        }
    }

    /// Records how long a cluster waited in the reconcile queue.
    pub fn reconcile_queued(&self, waited: Duration) {
        self.reconcile_wait.observe(waited.as_secs_f64());
    }

    /// Records one cluster's reconcile and the queue's depth after it.
    pub fn reconcile_done(&self, took: Duration, ok: bool, depth: usize) {
        let result = if ok { "ok" } else { "error" };
        self.reconcile_duration
            .get_or_create(&vec![("result", result.to_owned())])
            .observe(took.as_secs_f64());
        self.reconcile_queue_depth.set(depth as i64);
    }

    /// Records a machine taken out for replacement, `why` one of the
    /// classes of `drover_planner::health::Unhealthy`.
    pub fn remediation(&self, why: &'static str) {
        self.count_minute(|m| m.remediations += 1);
        self.remediations
            .get_or_create(&vec![("reason", why.to_owned())])
            .inc();
    }

    /// Records a reboot asked of an unhealthy machine, `why` as
    /// [`Metrics::remediation`]'s.
    pub fn reboot(&self, why: &'static str) {
        self.reboots
            .get_or_create(&vec![("reason", why.to_owned())])
            .inc();
    }

    /// Records an on-demand launch made because spot was refused.
    pub fn spot_fallback(&self) {
        self.spot_fallbacks.inc();
    }

    /// Records a power action asked of a BMC and whether it was accepted.
    pub fn bmc_action(&self, action: &'static str, ok: bool) {
        self.bmc_actions
            .get_or_create(&vec![
                ("action", action.to_owned()),
                ("result", if ok { "ok" } else { "error" }.to_owned()),
            ])
            .inc();
    }

    /// Records a provider call and, when it failed, its error class.
    pub fn provider_call(
        &self,
        provider: &'static str,
        operation: &'static str,
        error: Option<&'static str>,
    ) {
        let labels = vec![
            ("provider", provider.to_owned()),
            ("operation", operation.to_owned()),
        ];
        self.provider_calls.get_or_create(&labels).inc();
        if let Some(class) = error {
            let mut labels = labels;
            labels.push(("class", class.to_owned()));
            self.provider_errors.get_or_create(&labels).inc();
        }
    }

    /// Records a call of the autoscaler's service: its method, the gRPC
    /// code it was answered with, and how long it took.
    pub fn autoscaler_call(&self, method: &'static str, code: &'static str, took: Duration) {
        self.autoscaler_calls
            .get_or_create(&vec![
                ("method", method.to_owned()),
                ("code", code.to_owned()),
            ])
            .inc();
        self.autoscaler_call_seconds
            .get_or_create(&vec![("method", method.to_owned())])
            .observe(took.as_secs_f64());
    }

    fn count_minute(&self, bump: impl FnOnce(&mut Minute)) {
        let now = unix_minute();
        let mut h = self.history.lock().expect("metrics history lock");
        if h.back().is_none_or(|m| m.minute != now) {
            h.push_back(Minute {
                minute: now,
                ..Default::default()
            });
        }
        while h.len() > HISTORY_MINUTES {
            h.pop_front();
        }
        bump(h.back_mut().expect("pushed above"));
    }

    /// The last [`HISTORY_MINUTES`] minutes, oldest first, this one last;
    /// minutes without any count are zeros.
    pub fn last_hour(&self) -> Vec<Minute> {
        let now = unix_minute();
        let h = self.history.lock().expect("metrics history lock");
        (0..HISTORY_MINUTES as u64)
            .rev()
            .map(|ago| {
                let minute = now.saturating_sub(ago);
                h.iter()
                    .find(|m| m.minute == minute)
                    .copied()
                    .unwrap_or(Minute {
                        minute,
                        ..Default::default()
                    })
            })
            .collect()
    }

    /// The text exposition of every metric, the state gauges computed from
    /// `state` first.
    pub fn render(&self, state: &State) -> String {
        let _one = self.scrape.lock().expect("metrics scrape lock");
        self.clusters.clear();
        for (phase, n) in state.fleet.cluster_phases() {
            self.clusters
                .get_or_create(&vec![("phase", phase)])
                .set(n as i64);
        }
        self.machines.clear();
        for (l, n) in state.fleet.machine_counts() {
            self.machines
                .get_or_create(&vec![
                    ("phase", l.phase),
                    ("health", l.health.to_owned()),
                    ("provider", l.provider),
                ])
                .set(n as i64);
        }
        self.machine_problems.clear();
        for (problem, n) in state.fleet.machine_problems() {
            self.machine_problems
                .get_or_create(&vec![("problem", problem.to_owned())])
                .set(n as i64);
        }
        self.leader.set(i64::from(state.leader_term.is_some()));
        self.leader_term
            .set(state.leader_term.map_or(0, |t| t as i64));
        let c = &state.connections;
        let gauges = [
            (&self.connections, "state", "open", c.open),
            (&self.connections, "state", "parked", c.parked),
            (
                &self.connections,
                "state",
                "unauthenticated",
                c.unauthenticated,
            ),
            (&self.handshakes, "result", "full", c.full_handshakes),
            (&self.handshakes, "result", "resumed", c.resumed_handshakes),
            (&self.handshakes, "result", "failed", c.failed_handshakes),
            (
                &self.datagram_machines,
                "role",
                "control_plane",
                state.datagram_machines.control_planes,
            ),
            (
                &self.datagram_machines,
                "role",
                "other",
                state.datagram_machines.others,
            ),
        ];
        for (family, label, value, v) in gauges {
            family
                .get_or_create(&vec![(label, value.to_owned())])
                .set(v as i64);
        }
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        // The per-cluster series are kept rendered by the fleet summary (one
        // cluster's lines change when the cluster does), so a scrape of
        // 10,000 clusters copies text instead of building 50,000 label sets.
        if out.ends_with("# EOF\n") {
            out.truncate(out.len() - "# EOF\n".len());
        }
        out.push_str(CLUSTER_CONDITION_HEADER);
        state.fleet.write_condition_series(&mut out);
        out.push_str(SNAPSHOT_AGE_HEADER);
        state
            .fleet
            .write_snapshot_ages(&mut out, drover_common::now().unix_timestamp());
        out.push_str("# EOF\n");
        out
    }
}

/// The family lines of `drover_cluster_condition`.
const CLUSTER_CONDITION_HEADER: &str = "# HELP drover_cluster_condition One series per cluster and condition type, with the condition's status and reason as labels; the value is 1.\n# TYPE drover_cluster_condition gauge\n";

/// The family lines of `drover_snapshot_age_seconds`.
const SNAPSHOT_AGE_HEADER: &str = "# HELP drover_snapshot_age_seconds How long ago each cluster's newest etcd snapshot was saved (clusters with none saved have no series).\n# TYPE drover_snapshot_age_seconds gauge\n# UNIT drover_snapshot_age_seconds seconds\n";

/// Appends the `drover_cluster_condition` series of one condition of
/// `cluster` to `out`: the fleet summary renders a cluster's series when
/// the cluster changes, with this.
pub fn write_condition_series(out: &mut String, cluster: &str, [type_, status, reason]: [&str; 3]) {
    out.push_str("drover_cluster_condition{cluster=\"");
    escape_label(out, cluster);
    out.push_str("\",condition=\"");
    escape_label(out, type_);
    out.push_str("\",status=\"");
    escape_label(out, status);
    out.push_str("\",reason=\"");
    escape_label(out, reason);
    out.push_str("\"} 1\n");
}

/// A label value as the exposition formats quote it: backslash, double
/// quote and line feed escaped.
pub fn escape_label(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// The classic Prometheus text format (version 0.0.4) of an OpenMetrics
/// exposition, for clients that do not ask for OpenMetrics (`curl`,
/// `promtool check metrics`): a counter's family is named with its
/// `_total` suffix, and the `# UNIT` and `# EOF` lines go.
pub fn classic_text(openmetrics: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" counter") {
                counters.insert(name.to_owned());
            }
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// What the state gauges are computed from at a scrape.
pub struct State<'a> {
    /// The fleet's counts, kept up to date between scrapes (the domain's
    /// fleet summary), so a scrape reads no store.
    pub fleet: &'a dyn FleetGauges,
    /// This replica's term while it leads.
    pub leader_term: Option<u64>,
    pub connections: Connections,
    pub datagram_machines: DatagramMachines,
}

/// How many machines' last heartbeat was a quiet datagram.
#[derive(Debug, Clone, Copy, Default)]
pub struct DatagramMachines {
    pub control_planes: u64,
    pub others: u64,
}

/// The labels a machine is counted under in `drover_machines`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MachineLabels {
    pub phase: String,
    pub health: &'static str,
    /// The provider that made it, or `pool` for a registered machine.
    pub provider: String,
}

/// The fleet as the state gauges show it.
pub trait FleetGauges {
    /// How many clusters are in each phase.
    fn cluster_phases(&self) -> Vec<(String, u64)>;
    /// How many machines (not deleted) have each set of labels.
    fn machine_counts(&self) -> Vec<(MachineLabels, u64)>;
    /// How many machines (not deleted) have each node problem now.
    fn machine_problems(&self) -> Vec<(&'static str, u64)>;
    /// Appends the `drover_cluster_condition` series of every condition of
    /// every cluster, each as [`write_condition_series`] writes it.
    fn write_condition_series(&self, out: &mut String);
    /// Appends the `drover_snapshot_age_seconds` series of every cluster
    /// with a snapshot saved, its age at `now` (Unix seconds).
    fn write_snapshot_ages(&self, out: &mut String, now: i64);
}

/// The server's connection counts at a scrape (the HTTP layer fills it;
/// metrics depend on nothing of it).
#[derive(Debug, Clone, Copy, Default)]
pub struct Connections {
    pub open: u64,
    pub parked: u64,
    pub unauthenticated: u64,
    pub full_handshakes: u64,
    pub resumed_handshakes: u64,
    pub failed_handshakes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoFleet;
    impl FleetGauges for NoFleet {
        fn cluster_phases(&self) -> Vec<(String, u64)> {
            vec![("Running".into(), 3)]
        }
        fn machine_counts(&self) -> Vec<(MachineLabels, u64)> {
            vec![]
        }
        fn machine_problems(&self) -> Vec<(&'static str, u64)> {
            vec![("DiskPressure", 2)]
        }
        fn write_condition_series(&self, out: &mut String) {
            write_condition_series(out, "web", ["Ready", "True", "ControlPlaneUp"]);
            write_condition_series(out, "odd", ["Ready", "False", "a \"quoted\" \\ reason"]);
        }
        fn write_snapshot_ages(&self, out: &mut String, _now: i64) {
            out.push_str("drover_snapshot_age_seconds{cluster=\"web\"} 90\n");
        }
    }

    #[test]
    fn the_exposition_names_every_series_drover_and_counts_what_happened() {
        let m = Metrics::new();
        m.machine_request("heartbeat", true, Duration::from_millis(2));
        m.machine_request("heartbeat", true, Duration::from_millis(3));
        m.machine_request("heartbeat", false, Duration::from_millis(1));
        m.remediation("silent");
        m.provider_call("aws", "create", Some("throttled"));
        m.loop_run(
            "cluster-reconciler",
            Some(Duration::from_secs(5)),
            Duration::from_millis(40),
            true,
        );
        m.loop_run(
            "registration-committer",
            None,
            Duration::from_millis(3),
            false,
        );
        let text = m.render(&State {
            fleet: &NoFleet,
            leader_term: Some(7),
            connections: Default::default(),
            datagram_machines: DatagramMachines {
                control_planes: 4,
                others: 9,
            },
        });
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("drover_"), "{line}");
        }
        for want in [
            "drover_heartbeats_total{result=\"accepted\"} 2",
            "drover_heartbeats_total{result=\"refused\"} 1",
            "drover_remediations_total{reason=\"silent\"} 1",
            "drover_provider_errors_total{provider=\"aws\",operation=\"create\",class=\"throttled\"} 1",
            "drover_loop_errors_total{loop=\"cluster-reconciler\"} 1",
            "drover_loop_period_seconds{loop=\"cluster-reconciler\"} 5.0",
            "drover_leader 1",
            "drover_leader_term 7",
            "drover_heartbeat_datagram_machines{role=\"control_plane\"} 4",
            "drover_heartbeat_datagram_machines{role=\"other\"} 9",
            "drover_clusters{phase=\"Running\"} 3",
            "drover_machine_problems{problem=\"DiskPressure\"} 2",
            "drover_cluster_condition{cluster=\"web\",condition=\"Ready\",status=\"True\",reason=\"ControlPlaneUp\"} 1",
            "drover_cluster_condition{cluster=\"odd\",condition=\"Ready\",status=\"False\",reason=\"a \\\"quoted\\\" \\\\ reason\"} 1",
            "# TYPE drover_snapshot_age_seconds gauge\n# UNIT drover_snapshot_age_seconds seconds\ndrover_snapshot_age_seconds{cluster=\"web\"} 90\n# EOF\n",
        ] {
            assert!(text.contains(want), "{want} is missing from\n{text}");
        }
        // A loop that runs only when woken has a last run and no period.
        assert!(text
            .contains("drover_loop_last_run_timestamp_seconds{loop=\"registration-committer\"}"));
        assert!(
            !text.contains("drover_loop_period_seconds{loop=\"registration-committer\"}"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        let classic = classic_text(&text);
        for want in [
            "# TYPE drover_heartbeats_total counter\n",
            "# HELP drover_heartbeats_total Machine heartbeats",
            "# TYPE drover_leader gauge\n",
        ] {
            assert!(classic.contains(want), "{classic}");
        }
        assert!(!classic.contains("# EOF"), "{classic}");
        let hour = m.last_hour();
        assert_eq!(hour.len(), HISTORY_MINUTES);
        // Counted in this minute (or the one before, had it just turned).
        let heartbeats: u64 = hour.iter().map(|m| m.heartbeats).sum();
        let remediations: u64 = hour.iter().map(|m| m.remediations).sum();
        assert_eq!((heartbeats, remediations), (2, 1), "{hour:?}");
        assert!(hour[..HISTORY_MINUTES - 2]
            .iter()
            .all(|m| m.heartbeats == 0));
    }
}
