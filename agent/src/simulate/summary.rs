//! The end-of-run summary: its figures, as JSON and as the printed table.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::Duration;

use drover_common::wire::BootstrapDocument;
use serde::Serialize;
use tokio::time::Instant;

use super::args::{secs, trim_float, SimulateArgs};
use super::fleet::{Fleet, ASSIGNED, IN_POOL};
use super::histogram::Latency;
use crate::protocol::timing::rfc3339;

/// The end-of-run summary; `--summary-json` writes it as is.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub coordinators: Vec<String>,
    pub machines: u32,
    /// How long the run lasted.
    pub duration_seconds: f64,
    pub planned_duration_seconds: f64,
    pub ramp_seconds: f64,
    pub concurrency: u32,
    pub jitter_percent: u32,
    /// Whether SIGINT or SIGTERM ended the run early.
    pub interrupted: bool,
    pub registration: RegistrationSummary,
    pub heartbeats: HeartbeatSummary,
    pub config: ConfigSummary,
    pub silence: SilenceSummary,
    pub errors: Vec<ErrorSummary>,
    pub simulator: SimulatorSummary,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationSummary {
    pub registered: u64,
    /// Refused for good (bad or used-up token, wrong CA pin).
    pub failed: u64,
    /// Not registered when the run ended (not started yet, or retrying).
    pub unfinished: u64,
    /// Attempts that failed and were retried (429, 5xx, unreachable).
    pub retries: u64,
    /// From the start of the run to the last registration.
    pub total_seconds: Option<f64>,
    pub per_second: Option<f64>,
    /// Per machine, from its first request to its identity (retries
    /// included, waiting for --concurrency excluded).
    pub latency: Latency,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatSummary {
    /// The interval the coordinator named.
    pub interval_seconds: Option<f64>,
    pub sent: u64,
    pub ok: u64,
    pub failed: u64,
    /// Latency of the successful heartbeats.
    pub latency: Latency,
    /// The same in the steady state: heartbeats sent one interval or more
    /// after every machine registered (none when the run ended first).
    pub steady_latency: Latency,
    /// Successful heartbeats per second, from the first to the end.
    pub rate_per_second: Option<f64>,
    /// The same over the whole seconds of the steady state.
    pub steady_rate_per_second: Option<f64>,
    /// Heartbeating machines at the end divided by the interval.
    pub expected_rate_per_second: Option<f64>,
    /// Heartbeats sent as datagrams, by answer (an unanswered or "call
    /// over HTTPS" one is followed by an HTTPS heartbeat, counted above).
    pub datagrams: super::fleet::DatagramSummary,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigSummary {
    /// Signed bundles fetched and verified.
    pub fetches: u64,
    /// "Not ready yet" answers (409), retried.
    pub not_ready: u64,
    pub failed: u64,
    pub latency: Latency,
    /// Directives (join tokens, resets) acknowledged.
    pub directives: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SilenceSummary {
    pub requested: u32,
    pub silenced: usize,
    pub after_seconds: Option<f64>,
    /// When, in RFC 3339, to compare with the coordinator's view.
    pub at: Option<String>,
    /// The coordinator's names of the silenced machines.
    pub machines: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorSummary {
    pub kind: String,
    pub count: u64,
    pub examples: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimulatorSummary {
    /// Resident memory at the end, with every machine still connected.
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
    /// Before any machine started.
    pub baseline_rss_bytes: u64,
    /// (rss - baseline) / registered machines.
    pub rss_per_machine_bytes: Option<u64>,
    pub open_files_limit: Option<u64>,
    pub worker_threads: usize,
}

pub(super) fn summarize(
    args: &SimulateArgs,
    doc: &BootstrapDocument,
    fleet: &Fleet,
    end: Instant,
    interrupted: bool,
    mut simulator: SimulatorSummary,
    notes: Vec<String>,
) -> Summary {
    let s = fleet.stats();
    let start = fleet.start;
    let round = |v: f64| (v * 1000.0).round() / 1000.0;
    let total = s.last_registered.map(|t| (t - start).as_secs_f64());
    let interval = s.interval.map(|i| i.as_secs_f64());
    let heartbeating = fleet
        .slots
        .iter()
        .filter(|slot| matches!(slot.state.load(Ordering::Relaxed), IN_POOL | ASSIGNED))
        .count();
    let rate = s.first_heartbeat.and_then(|first| {
        let window = (end - first).as_secs_f64();
        (window > 0.0).then(|| round(s.heartbeats_ok as f64 / window))
    });
    // The whole seconds of the steady state, up to the last whole second of
    // the run.
    let steady = match s.steady_from {
        Some(from) => {
            let from = from.saturating_duration_since(start).as_secs_f64().ceil() as usize;
            let to = (end - start).as_secs_f64().floor() as usize;
            let to = to.min(s.heartbeats_per_second.len());
            (to > from).then(|| {
                let sum: u64 = s.heartbeats_per_second[from..to].iter().sum();
                round(sum as f64 / (to - from) as f64)
            })
        }
        _ => None,
    };
    simulator.rss_per_machine_bytes = simulator
        .rss_bytes
        .saturating_sub(simulator.baseline_rss_bytes)
        .checked_div(s.registered);
    Summary {
        coordinators: doc.coordinators.clone(),
        machines: args.machines,
        duration_seconds: round((end - start).as_secs_f64()),
        planned_duration_seconds: args.duration.as_secs_f64(),
        ramp_seconds: args.ramp().as_secs_f64(),
        concurrency: args.concurrency,
        jitter_percent: args.jitter.0,
        interrupted,
        registration: RegistrationSummary {
            registered: s.registered,
            failed: s.registration_failed,
            unfinished: u64::from(args.machines)
                .saturating_sub(s.registered + s.registration_failed),
            retries: s.registration_retries,
            total_seconds: total.map(round),
            per_second: total
                .filter(|t| *t > 0.0)
                .map(|t| round(s.registered as f64 / t)),
            latency: s.registration.latency(),
        },
        heartbeats: HeartbeatSummary {
            interval_seconds: interval,
            sent: s.heartbeats_sent,
            ok: s.heartbeats_ok,
            failed: s.heartbeats_failed,
            latency: s.heartbeat.latency(),
            steady_latency: s.steady_heartbeat.latency(),
            rate_per_second: rate,
            steady_rate_per_second: steady,
            expected_rate_per_second: interval.map(|i| round(heartbeating as f64 / i)),
            datagrams: s.datagrams.clone(),
        },
        config: ConfigSummary {
            fetches: s.config_fetches,
            not_ready: s.config_not_ready,
            failed: s.config_failed,
            latency: s.config.latency(),
            directives: s.directives,
        },
        silence: SilenceSummary {
            requested: args.silence,
            silenced: s.silenced.len(),
            after_seconds: (args.silence > 0).then_some(args.silence_after.as_secs_f64()),
            at: s.silenced_at.map(|(_, wall)| rfc3339(wall)),
            machines: s.silenced.clone(),
        },
        errors: s
            .errors
            .iter()
            .map(|(kind, e)| ErrorSummary {
                kind: kind.clone(),
                count: e.count,
                examples: e.examples.clone(),
            })
            .collect(),
        simulator,
        notes,
    }
}

pub(super) fn fmt_ms(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v >= 100.0 => format!("{v:.0} ms"),
        Some(v) if v >= 10.0 => format!("{v:.1} ms"),
        Some(v) => format!("{v:.2} ms"),
    }
}

fn fmt_latency(l: &Latency) -> String {
    if l.count == 0 {
        return "-".into();
    }
    format!(
        "p50 {}  p90 {}  p99 {}  max {}  (mean {}, n={})",
        fmt_ms(l.p50_ms),
        fmt_ms(l.p90_ms),
        fmt_ms(l.p99_ms),
        fmt_ms(l.max_ms),
        fmt_ms(l.mean_ms),
        l.count
    )
}

fn fmt_rate(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}/s"))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The summary as the table printed at the end.
pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "\nDrover fleet simulation: {} machines, {} of {} (ramp {}s, concurrency {}, jitter {}%){}",
        s.machines,
        secs(Duration::from_secs_f64(s.duration_seconds)),
        secs(Duration::from_secs_f64(s.planned_duration_seconds)),
        trim_float(s.ramp_seconds, 3),
        s.concurrency,
        s.jitter_percent,
        if s.interrupted { ", interrupted" } else { "" }
    );
    let _ = writeln!(w, "coordinator: {}", s.coordinators.join(", "));
    let row = |w: &mut String, label: &str, value: String| {
        let _ = writeln!(w, "  {label:<22}{value}");
    };
    let r = &s.registration;
    let _ = writeln!(w, "\nRegistration");
    row(
        w,
        "registered",
        format!(
            "{} / {}   failed {}, unfinished {}, retries {}",
            r.registered, s.machines, r.failed, r.unfinished, r.retries
        ),
    );
    row(
        w,
        "total time",
        match (r.total_seconds, r.per_second) {
            (Some(t), rate) => format!("{t:.2} s  ({})", fmt_rate(rate)),
            _ => "-".into(),
        },
    );
    row(w, "per registration", fmt_latency(&r.latency));
    let h = &s.heartbeats;
    let _ = writeln!(
        w,
        "\nHeartbeats (interval {}, jitter ±{}%)",
        h.interval_seconds
            .map_or("-".into(), |i| format!("{} s", trim_float(i, 3))),
        s.jitter_percent
    );
    row(
        w,
        "sent / ok / failed",
        format!("{} / {} / {}", h.sent, h.ok, h.failed),
    );
    row(w, "latency", fmt_latency(&h.latency));
    row(w, "latency (steady)", fmt_latency(&h.steady_latency));
    row(
        w,
        "rate",
        format!(
            "{} overall, {} steady, {} expected",
            fmt_rate(h.rate_per_second),
            fmt_rate(h.steady_rate_per_second),
            fmt_rate(h.expected_rate_per_second)
        ),
    );
    let d = &h.datagrams;
    row(
        w,
        "as datagrams",
        format!(
            "{} quiet, {} asked for HTTPS, {} unanswered",
            d.quiet, d.call_https, d.unanswered
        ),
    );
    let c = &s.config;
    let _ = writeln!(w, "\nConfig");
    row(
        w,
        "bundles fetched",
        format!(
            "{}   not ready {}, failed {}, directives answered {}",
            c.fetches, c.not_ready, c.failed, c.directives
        ),
    );
    if c.latency.count > 0 {
        row(w, "fetch latency", fmt_latency(&c.latency));
    }
    if s.silence.requested > 0 {
        let _ = writeln!(w, "\nSilence");
        let mut names = s
            .silence
            .machines
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if s.silence.machines.len() > 5 {
            names.push_str(", ...");
        }
        row(
            w,
            "silenced",
            match &s.silence.at {
                Some(at) => format!(
                    "{} of {} at +{}s ({at}): {names}",
                    s.silence.silenced,
                    s.silence.requested,
                    trim_float(s.silence.after_seconds.unwrap_or_default(), 3)
                ),
                None => format!("0 of {} (the run ended first)", s.silence.requested),
            },
        );
    }
    let _ = writeln!(w, "\nErrors");
    if s.errors.is_empty() {
        let _ = writeln!(w, "  none");
    }
    for e in &s.errors {
        row(w, &e.kind, e.count.to_string());
        for ex in &e.examples {
            let ex: String = ex.chars().take(300).collect();
            let _ = writeln!(w, "      {ex}");
        }
    }
    let m = &s.simulator;
    let _ = writeln!(w, "\nSimulator");
    row(
        w,
        "memory (RSS)",
        format!(
            "{} at the end, {} peak, {} before the fleet{}",
            mib(m.rss_bytes),
            mib(m.peak_rss_bytes),
            mib(m.baseline_rss_bytes),
            m.rss_per_machine_bytes.map_or(String::new(), |b| format!(
                "; {:.1} KiB per machine",
                b as f64 / 1024.0
            ))
        ),
    );
    row(
        w,
        "open-file limit",
        m.open_files_limit
            .map_or("unknown".into(), |l| l.to_string()),
    );
    row(w, "worker threads", m.worker_threads.to_string());
    for n in &s.notes {
        let _ = writeln!(w, "  note: {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::histogram::Histogram;
    use super::*;

    fn summary() -> Summary {
        let mut hist = Histogram::default();
        for v in [900, 1_200, 1_500, 40_000] {
            hist.record(v);
        }
        Summary {
            coordinators: vec!["https://127.0.0.1:7443".into()],
            machines: 20,
            duration_seconds: 5.01,
            planned_duration_seconds: 5.0,
            ramp_seconds: 0.0,
            concurrency: 256,
            jitter_percent: 10,
            interrupted: false,
            registration: RegistrationSummary {
                registered: 19,
                failed: 1,
                unfinished: 0,
                retries: 2,
                total_seconds: Some(0.5),
                per_second: Some(38.0),
                latency: hist.latency(),
            },
            heartbeats: HeartbeatSummary {
                interval_seconds: Some(1.0),
                sent: 90,
                ok: 88,
                failed: 2,
                latency: hist.latency(),
                steady_latency: Histogram::default().latency(),
                rate_per_second: Some(18.1),
                steady_rate_per_second: Some(19.0),
                expected_rate_per_second: Some(19.0),
                datagrams: super::super::fleet::DatagramSummary {
                    quiet: 60,
                    call_https: 1,
                    unanswered: 0,
                },
            },
            config: ConfigSummary {
                fetches: 3,
                not_ready: 4,
                failed: 0,
                latency: Histogram::default().latency(),
                directives: 1,
            },
            silence: SilenceSummary {
                requested: 5,
                silenced: 5,
                after_seconds: Some(2.0),
                at: Some("2025-01-01T00:00:02Z".into()),
                machines: (1..=6).map(|i| format!("sim-{i}")).collect(),
            },
            errors: vec![ErrorSummary {
                kind: "register: HTTP 409".into(),
                count: 1,
                examples: vec!["ticket already used".into()],
            }],
            simulator: SimulatorSummary {
                rss_bytes: 30 << 20,
                peak_rss_bytes: 31 << 20,
                baseline_rss_bytes: 10 << 20,
                rss_per_machine_bytes: Some((20 << 20) / 19),
                open_files_limit: Some(20000),
                worker_threads: 2,
            },
            notes: vec!["a note".into()],
        }
    }

    #[test]
    fn summary_table_and_json() {
        let s = summary();
        let table = render(&s);
        for needle in [
            "20 machines, 5.01s of 5s",
            "19 / 20   failed 1, unfinished 0, retries 2",
            "0.50 s  (38.0/s)",
            "p50 1.21 ms  p90 40.0 ms  p99 40.0 ms  max 40.0 ms",
            "90 / 88 / 2",
            "latency (steady)      -\n",
            "18.1/s overall, 19.0/s steady, 19.0/s expected",
            "bundles fetched",
            "5 of 5 at +2s (2025-01-01T00:00:02Z): sim-1, sim-2, sim-3, sim-4, sim-5, ...",
            "register: HTTP 409",
            "ticket already used",
            "30.0 MiB at the end",
            "1077.9 KiB per machine",
            "note: a note",
        ] {
            assert!(table.contains(needle), "{needle:?} not in\n{table}");
        }
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["registration"]["registered"], 19);
        assert_eq!(json["heartbeats"]["latency"]["p99Ms"], 40.0);
        assert_eq!(json["heartbeats"]["latency"]["p50Ms"], 1.207);
        assert_eq!(json["config"]["fetches"], 3);
        assert_eq!(json["silence"]["machines"][0], "sim-1");
        assert_eq!(json["errors"][0]["kind"], "register: HTTP 409");
        assert_eq!(json["simulator"]["rssBytes"], 30 << 20);
        assert_eq!(json["heartbeats"]["steadyRatePerSecond"], 19.0);
    }
}
