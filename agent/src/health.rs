//! Health probes sent with every heartbeat: kubelet `/healthz`, the API
//! server's `/readyz` on control-plane machines, free disk space, and the
//! node problem checks (`crate::problems`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_common::wire::{HealthReport, Probe, ProbeState};

use crate::api::error_chain;
use crate::tls;

/// How long one probe may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Which probes to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePlan {
    /// Probe the kubelet (after bootstrap finished); otherwise report Unknown.
    pub kubelet: bool,
    pub api_server: ApiServerPlan,
    /// The coordinator's clock against this one, as its last answer
    /// showed it (`crate::problems::ClockReading`).
    pub clock: Option<crate::problems::ClockReading>,
}

/// Whether and where to probe the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiServerPlan {
    /// Not a control-plane machine, or not bootstrapped: no API server probe.
    None,
    /// Probe `https://<addr>/readyz`.
    Probe(SocketAddr),
    /// Should probe, but cannot; reported as Unknown with this message.
    Unknown(String),
}

/// Runs the probes.
#[derive(Debug)]
pub struct Prober {
    root: PathBuf,
    kubelet_url: reqwest::Url,
    kubelet: Option<reqwest::Client>,
    /// The API server client, rebuilt when `ca.crt` changes.
    api_server: tls::CachedClient,
    /// The bounds of the node problem checks (`crate::problems`).
    bounds: crate::problems::Bounds,
    /// The kernel's messages (`crate::kmsg`), read on at every report.
    kernel: crate::kmsg::KernelLog,
    /// The container runtime's CRI socket check, when told the socket.
    cri: Option<crate::cri::CriCheck>,
}

impl Prober {
    pub fn new(root: &Path, kubelet_url: reqwest::Url) -> Self {
        Self {
            root: root.to_owned(),
            kubelet_url,
            kubelet: None,
            api_server: tls::CachedClient::default(),
            bounds: crate::problems::Bounds::default(),
            kernel: crate::kmsg::KernelLog::new(&root.join("dev/kmsg")),
            cri: None,
        }
    }

    /// Checks the container runtime on the CRI socket at `path` at every
    /// report (`crate::cri`).
    pub fn with_cri_socket(mut self, path: &Path) -> Self {
        self.cri = Some(crate::cri::CriCheck::new(path));
        self
    }

    /// The node problem checks judged by `bounds` (the kubelet's
    /// `--eviction-hard`) rather than the kubelet's defaults.
    pub fn with_bounds(mut self, bounds: crate::problems::Bounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// The kernel's messages read from `path` rather than the machine's
    /// `/dev/kmsg`.
    pub fn with_kernel_log(mut self, path: &Path) -> Self {
        self.kernel = crate::kmsg::KernelLog::new(path);
        self
    }

    /// Runs the planned probes concurrently.
    pub async fn report(&mut self, plan: &ProbePlan) -> HealthReport {
        let kubelet_client = if plan.kubelet {
            self.kubelet_client()
        } else {
            Ok(None)
        };
        let api_client = match &plan.api_server {
            ApiServerPlan::Probe(_) => self.api_server_client().map(Some),
            _ => Ok(None),
        };
        let kubelet = async {
            match kubelet_client {
                Ok(Some(client)) => get_probe(&client, self.kubelet_url.as_str()).await,
                Ok(None) => Probe::default(),
                Err(e) => unknown(e.to_string()),
            }
        };
        let api_server = async {
            match (&plan.api_server, api_client) {
                (ApiServerPlan::None, _) => None,
                (ApiServerPlan::Unknown(message), _) => Some(unknown(message.clone())),
                (ApiServerPlan::Probe(addr), Ok(Some(client))) => {
                    Some(get_probe(&client, &format!("https://{addr}/readyz")).await)
                }
                (ApiServerPlan::Probe(_), Ok(None)) => Some(Probe::default()),
                (ApiServerPlan::Probe(_), Err(e)) => Some(unknown(e.to_string())),
            }
        };
        let cri = async {
            match &self.cri {
                Some(check) => check.check().await,
                None => None,
            }
        };
        let (kubelet, api_server, runtime) = tokio::join!(kubelet, api_server, cri);
        let mut problems = crate::problems::judge(
            &crate::problems::Sample {
                clock: plan.clock,
                ..crate::problems::sample(&self.root)
            },
            &self.bounds,
        );
        problems.extend(self.kernel.poll());
        problems.extend(runtime);
        HealthReport {
            kubelet,
            api_server,
            disk_free_bytes: disk_free_bytes(&self.root),
            problems,
            // The heartbeat adds it (`crate::reboot::boot_id`).
            boot_id: None,
        }
    }

    fn kubelet_client(&mut self) -> Result<Option<reqwest::Client>, ProbeClientError> {
        if self.kubelet.is_none() {
            self.kubelet = Some(probe_client(tls::trust_nothing_config()?)?);
        }
        Ok(self.kubelet.clone())
    }

    fn api_server_client(&mut self) -> Result<reqwest::Client, ProbeClientError> {
        let ca_path = self.root.join("etc/kubernetes/pki/ca.crt");
        let unreadable = |path, source| ProbeClientError::ReadCa { path, source };
        self.api_server
            .built_from_files(std::slice::from_ref(&ca_path), unreadable, |ca| {
                let config =
                    tls::trust_only_config(&String::from_utf8_lossy(&ca[0]), "the cluster CA")
                        .map_err(|source| ProbeClientError::CaBundle {
                            path: ca_path.clone(),
                            source,
                        })?;
                probe_client(config)
            })
    }
}

/// Why a probe could not even be sent; reported as an Unknown probe.
#[derive(Debug, thiserror::Error)]
enum ProbeClientError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot read the cluster CA {}: {source}", path.display())]
    ReadCa {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    CaBundle {
        path: PathBuf,
        source: tls::TlsError,
    },
    #[error("cannot build the probe client: {}", error_chain(.0))]
    Build(#[source] reqwest::Error),
}

fn probe_client(config: rustls::ClientConfig) -> Result<reqwest::Client, ProbeClientError> {
    tls::local_client(config, PROBE_TIMEOUT).map_err(ProbeClientError::Build)
}

fn unknown(message: String) -> Probe {
    Probe {
        state: ProbeState::Unknown,
        message,
    }
}

async fn get_probe(client: &reqwest::Client, url: &str) -> Probe {
    match client.get(url).send().await {
        Ok(response) if response.status() == reqwest::StatusCode::OK => Probe {
            state: ProbeState::Healthy,
            message: String::new(),
        },
        Ok(response) => {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            let body: String = body.trim().chars().take(200).collect();
            Probe {
                state: ProbeState::Unhealthy,
                message: format!("GET {url}: HTTP {status}: {body}")
                    .trim_end_matches([':', ' '])
                    .to_owned(),
            }
        }
        Err(e) => Probe {
            state: ProbeState::Unhealthy,
            message: format!("GET {url}: {}", error_chain(&e)),
        },
    }
}

/// Free bytes for unprivileged users on the file system holding `root`,
/// rounded down by [`quantize_free_bytes`].
pub fn disk_free_bytes(root: &Path) -> u64 {
    match nix::sys::statvfs::statvfs(root) {
        // The field types differ between platforms, hence the allowance.
        #[allow(clippy::useless_conversion)]
        Ok(s) => {
            let unit = u64::from(s.fragment_size());
            quantize_free_bytes(
                u64::from(s.blocks_available()).saturating_mul(unit),
                u64::from(s.blocks()).saturating_mul(unit),
            )
        }
        Err(e) => {
            tracing::debug!(root = %root.display(), error = %e, "statvfs failed");
            0
        }
    }
}

/// Rounds free space down to about 1/1024 of the file system size, in whole
/// MiB (at least 1 MiB). Free space moves with every log line; reporting it to the byte
/// would make every heartbeat look like a change to the coordinator, while
/// this precision is plenty to see a disk filling up.
pub fn quantize_free_bytes(free: u64, total: u64) -> u64 {
    let step = ((total / 1024) >> 20).max(1) << 20;
    free / step * step
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves one canned HTTP answer per connection.
    async fn serve(answer: &'static str) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let _ = conn.write_all(answer.as_bytes()).await;
            }
        });
        addr
    }

    #[test]
    fn free_space_is_rounded_down() {
        const MIB: u64 = 1 << 20;
        // A small file system: 1 MiB steps.
        assert_eq!(quantize_free_bytes(5 * MIB + 123, 100 * MIB), 5 * MIB);
        assert_eq!(quantize_free_bytes(MIB - 1, 100 * MIB), 0);
        // 100 GiB: 100 MiB steps, so small changes report the same value.
        let total = 100 * 1024 * MIB;
        let a = quantize_free_bytes(40 * 1024 * MIB + 3 * MIB, total);
        let b = quantize_free_bytes(40 * 1024 * MIB + 7 * MIB, total);
        assert_eq!(a, b);
        assert!(a <= 40 * 1024 * MIB + 3 * MIB);
    }

    #[tokio::test]
    async fn kubelet_probe_states() {
        let dir = tempfile::tempdir().unwrap();
        let ok = serve("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
        let bad = serve(
            "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\nconnection: close\r\n\r\nsick",
        )
        .await;
        let plan = ProbePlan {
            kubelet: true,
            api_server: ApiServerPlan::None,
            clock: None,
        };
        let url = |a: SocketAddr| format!("http://{a}/healthz").parse().unwrap();

        let report = Prober::new(dir.path(), url(ok)).report(&plan).await;
        assert_eq!(report.kubelet.state, ProbeState::Healthy);
        assert!(report.api_server.is_none());
        assert!(report.disk_free_bytes > 0);
        assert_eq!(report.disk_free_bytes % (1 << 20), 0);

        let report = Prober::new(dir.path(), url(bad)).report(&plan).await;
        assert_eq!(report.kubelet.state, ProbeState::Unhealthy);
        assert!(
            report.kubelet.message.contains("500"),
            "{:?}",
            report.kubelet
        );
        assert!(
            report.kubelet.message.contains("sick"),
            "{:?}",
            report.kubelet
        );

        // Nothing listens on a port just released.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let report = Prober::new(dir.path(), url(closed)).report(&plan).await;
        assert_eq!(report.kubelet.state, ProbeState::Unhealthy);

        // Before bootstrap finished nothing is probed.
        let report = Prober::new(dir.path(), url(closed))
            .report(&ProbePlan {
                kubelet: false,
                api_server: ApiServerPlan::Probe(closed),
                clock: None,
            })
            .await;
        assert_eq!(report.kubelet.state, ProbeState::Unknown);
        let api = report.api_server.unwrap();
        assert_eq!(api.state, ProbeState::Unknown);
        assert!(api.message.contains("ca.crt"), "{api:?}");
    }
}
