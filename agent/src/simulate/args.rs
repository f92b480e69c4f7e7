//! The simulator's flags and their checks.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;

/// The most machines one simulator runs.
const MAX_MACHINES: i64 = 1_000_000;

/// --ramp unless the run is shorter.
const DEFAULT_RAMP: Duration = Duration::from_secs(10);

/// Runs a fleet of simulated machines against a real coordinator, to size it.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Create the token first, with at least as many uses as machines:
  drover token create --pool sim --uses 2000 -o sim.yaml
  drover-agent simulate --bootstrap sim.yaml --machines 2000 --duration 5m

Each machine holds one connection: the simulator raises its open-file limit
to the hard limit and warns when that is too low. The summary goes to stdout,
progress to stderr. Simulated machines do not renew their certificates:
keep a run shorter than the coordinator's machine certificate lifetime.

Exit codes: 0 when the run finished (or was interrupted) with at least one
machine registered, 1 when none registered, 64 for bad flags or an
unreadable bootstrap document.")]
pub struct SimulateArgs {
    /// The bootstrap document of a pool registration token
    /// (`drover token create --pool POOL --uses N -o FILE`); every simulated
    /// machine registers with its ticket, so it needs --machines uses.
    #[arg(long, value_name = "FILE")]
    pub bootstrap: PathBuf,

    /// How many machines to simulate.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=MAX_MACHINES))]
    pub machines: u32,

    /// How long the run lasts, counted from its start (the ramp included).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration_arg)]
    pub duration: Duration,

    /// Spread the machines' starts evenly over this long; 0 starts them all
    /// at once (a registration storm) [default: 10s, or --duration if
    /// shorter].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub ramp: Option<Duration>,

    /// At most this many registrations in flight at once.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub concurrency: u32,

    /// Vary every heartbeat interval by up to this much either way, so the
    /// fleet does not beat in lockstep (0% to 100%).
    #[arg(long, value_name = "PERCENT", default_value = "10%", value_parser = parse_jitter)]
    pub jitter: Jitter,

    /// Make K machines stop heartbeating at --silence-after, as if they died,
    /// to measure how the coordinator notices. Machines not claimed by a
    /// cluster are picked first.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub silence: u32,

    /// When the --silence machines stop, counted from the start of the run.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration_arg)]
    pub silence_after: Duration,

    /// Host names of the simulated machines are PREFIX-1, PREFIX-2, ...
    /// (zero-padded); the coordinator names the machines after its pool.
    #[arg(long, value_name = "PREFIX", default_value = "sim", value_parser = parse_name_prefix)]
    pub name_prefix: String,

    /// Also write the summary as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub summary_json: Option<PathBuf>,

    /// How often to print a progress line on stderr (0: never).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration_arg)]
    pub progress: Duration,

    /// The steady state (its own latency and rate in the summary) starts
    /// this long after the last machine registered [default: one heartbeat
    /// interval, plus jitter]. With short intervals, give the coordinator
    /// longer to finish the writes of the registration ramp.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub settle: Option<Duration>,

    /// How quiet heartbeats go: `datagram` takes the coordinator's offer of
    /// datagram heartbeats, as the agent does, and holds no connection
    /// between changes; `https` ignores it and heartbeats over HTTPS on a
    /// kept connection (the transport agents fall back to).
    #[arg(long, value_name = "TRANSPORT", default_value = "datagram")]
    pub transport: Transport,

    /// The size of the etcd snapshot a simulated control plane saves when
    /// asked (`drover backup cluster`): this many bytes and the SHA-256
    /// etcd appends, sealed with the cluster's key and uploaded as the
    /// agent does.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(0..=1 << 30))]
    pub snapshot_bytes: u64,
}

/// How simulated machines send quiet heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    Datagram,
    Https,
}

/// A heartbeat jitter, in percent of the interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Jitter(pub u32);

impl Jitter {
    pub(super) fn fraction(self) -> f64 {
        f64::from(self.0) / 100.0
    }
}

/// A duration such as `60s`, `500ms`, `2m`, or a bare `0`.
fn parse_duration_arg(s: &str) -> Result<Duration, drover_common::units::UnitError> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    drover_common::api::parse_duration(s)
}

/// `10%` or `10`, from 0 to 100.
fn parse_jitter(s: &str) -> Result<Jitter, ArgError> {
    let t = s.trim();
    t.strip_suffix('%')
        .unwrap_or(t)
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n <= 100)
        .map(Jitter)
        .ok_or_else(|| ArgError::Jitter { got: s.to_string() })
}

fn parse_name_prefix(s: &str) -> Result<String, ArgError> {
    // It starts host names, which the coordinator checks as DNS-1123
    // subdomains (the last part gets `-N` appended).
    if s.is_empty()
        || s.len() > 48
        || drover_common::names::check_hostname(&format!("{s}-1")).is_err()
    {
        return Err(ArgError::NamePrefix { got: s.to_string() });
    }
    Ok(s.to_owned())
}

/// Why a flag's value was refused.
#[derive(Debug, thiserror::Error)]
enum ArgError {
    #[error("must be a percentage from 0% to 100%, such as 10%, got {got:?}")]
    Jitter { got: String },
    #[error(
        "{got:?} must be 1 to 48 lowercase letters, digits, '-' or '.', each dot-separated part starting with a letter or digit (it starts host names)"
    )]
    NamePrefix { got: String },
}

impl SimulateArgs {
    /// --ramp, or its default.
    pub fn ramp(&self) -> Duration {
        self.ramp.unwrap_or_else(|| DEFAULT_RAMP.min(self.duration))
    }

    /// Checks what clap cannot check one flag at a time.
    pub(super) fn check(&self) -> anyhow::Result<()> {
        if self.duration.is_zero() {
            bail!("--duration must be longer than 0");
        }
        if self.ramp() > self.duration {
            bail!(
                "--ramp {} is longer than --duration {}: the last machines would never start",
                secs(self.ramp()),
                secs(self.duration)
            );
        }
        if self.silence > self.machines {
            bail!(
                "--silence {} is more than --machines {}",
                self.silence,
                self.machines
            );
        }
        if self.silence > 0 && self.silence_after >= self.duration {
            bail!(
                "--silence-after {} is not within --duration {}: no machine would go silent",
                secs(self.silence_after),
                secs(self.duration)
            );
        }
        if let Some(settle) = self.settle {
            if self.ramp() + settle >= self.duration {
                bail!(
                    "--ramp {} plus --settle {} is not within --duration {}: the run would end before its steady state",
                    secs(self.ramp()),
                    secs(settle),
                    secs(self.duration)
                );
            }
        }
        Ok(())
    }
}

pub(super) fn secs(d: Duration) -> String {
    format!("{}s", trim_float(d.as_secs_f64(), 3))
}

pub(super) fn trim_float(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrap {
        #[command(flatten)]
        args: SimulateArgs,
    }

    fn parse(extra: &[&str]) -> Result<SimulateArgs, clap::Error> {
        let base = ["simulate", "--bootstrap", "boot.yaml", "--machines", "20"];
        Wrap::try_parse_from(base.iter().chain(extra)).map(|w| w.args)
    }

    #[test]
    fn cli_defaults() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.machines, 20);
        assert_eq!(a.duration, Duration::from_secs(60));
        assert_eq!(a.ramp(), Duration::from_secs(10));
        assert_eq!(a.concurrency, 256);
        assert_eq!(a.jitter, Jitter(10));
        assert_eq!(a.silence, 0);
        assert_eq!(a.silence_after, Duration::from_secs(30));
        assert_eq!(a.name_prefix, "sim");
        assert_eq!(a.progress, Duration::from_secs(5));
        assert!(a.summary_json.is_none());
        a.check().unwrap();
    }

    #[test]
    fn cli_values() {
        let a = parse(&[
            "--duration",
            "5s",
            "--ramp",
            "0",
            "--jitter",
            "25",
            "--silence",
            "5",
            "--silence-after",
            "2s",
            "--summary-json",
            "out.json",
            "--concurrency",
            "8",
            "--name-prefix",
            "rack-7",
            "--progress",
            "500ms",
        ])
        .unwrap();
        assert_eq!(a.duration, Duration::from_secs(5));
        assert_eq!(a.ramp(), Duration::ZERO);
        assert_eq!(a.jitter, Jitter(25));
        assert_eq!(a.jitter.fraction(), 0.25);
        assert_eq!(a.silence, 5);
        assert_eq!(a.silence_after, Duration::from_secs(2));
        assert_eq!(a.summary_json, Some(PathBuf::from("out.json")));
        assert_eq!(a.concurrency, 8);
        assert_eq!(a.name_prefix, "rack-7");
        assert_eq!(a.progress, Duration::from_millis(500));
        a.check().unwrap();
        assert_eq!(parse(&["--jitter", "0%"]).unwrap().jitter, Jitter(0));
        assert_eq!(parse(&["--jitter", "100%"]).unwrap().jitter, Jitter(100));
    }

    #[test]
    fn cli_errors_name_the_flag() {
        for (bad, needle) in [
            (vec!["--machines", "0"], "--machines"),
            (vec!["--machines", "x"], "--machines"),
            (vec!["--duration", "5"], "needs a unit"),
            (vec!["--ramp", "soon"], "--ramp"),
            (vec!["--jitter", "150%"], "from 0% to 100%"),
            (vec!["--jitter=-1%"], "from 0% to 100%"),
            (vec!["--concurrency", "0"], "--concurrency"),
            (vec!["--name-prefix", "a b"], "host names"),
            (vec!["--frobnicate"], "--frobnicate"),
        ] {
            let err = parse(&bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{bad:?}: {err}");
        }
        // Required flags.
        let err = Wrap::try_parse_from(["simulate", "--machines", "3"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--bootstrap"), "{err}");
        let err = Wrap::try_parse_from(["simulate", "--bootstrap", "b"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--machines"), "{err}");
    }

    #[test]
    fn cross_flag_checks() {
        let err = |extra: &[&str]| format!("{:#}", parse(extra).unwrap().check().unwrap_err());
        assert!(
            err(&["--silence", "21"]).contains("--silence 21 is more than --machines 20"),
            "{}",
            err(&["--silence", "21"])
        );
        assert!(err(&["--duration", "5s", "--ramp", "10s"]).contains("--ramp 10s is longer"));
        assert!(err(&[
            "--duration",
            "5s",
            "--ramp",
            "0",
            "--silence",
            "1",
            "--silence-after",
            "5s"
        ])
        .contains("not within --duration 5s"));
        assert!(err(&["--duration", "0"]).contains("--duration must be longer than 0"));
        assert!(
            err(&["--duration", "30s", "--ramp", "20s", "--settle", "10s"])
                .contains("--settle 10s is not within --duration 30s")
        );
        parse(&["--duration", "30s", "--ramp", "20s", "--settle", "9s"])
            .unwrap()
            .check()
            .unwrap();
        // A short run ramps over its whole length by default; a silence
        // time beyond the run is fine when nothing goes silent.
        assert_eq!(
            parse(&["--duration", "5s"]).unwrap().ramp(),
            Duration::from_secs(5)
        );
        parse(&["--duration", "5s"]).unwrap().check().unwrap();
    }
}
