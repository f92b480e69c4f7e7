//! EC2 instance metadata (IMDSv2): where an AMI-booted machine finds its
//! bootstrap document when it has no `--bootstrap` file and no NoCloud seed.
//!
//! IMDSv2 is session-oriented: a `PUT /latest/api/token` with a TTL header
//! returns a token that every later request carries. User data is
//! `GET /latest/user-data`; a 404 means the instance has none.
//!
//! A booting machine may ask before its network is up, so connection
//! failures are retried with back-off for a bounded time; a 404 is final.
//! `AWS_EC2_METADATA_DISABLED=true` turns the source off (the AWS SDKs
//! honour the same variable), and the endpoint is
//! `AWS_EC2_METADATA_SERVICE_ENDPOINT` or `--imds-endpoint`, default
//! `http://169.254.169.254`.

use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use drover_common::wire::BootstrapDocument;

use crate::backoff::Backoff;

/// The default IMDS endpoint.
pub const DEFAULT_ENDPOINT: &str = "http://169.254.169.254";
/// Environment variable that disables the metadata source.
pub const DISABLED_ENV: &str = "AWS_EC2_METADATA_DISABLED";
/// Environment variable naming the endpoint.
pub const ENDPOINT_ENV: &str = "AWS_EC2_METADATA_SERVICE_ENDPOINT";

const TOKEN_TTL_SECONDS: &str = "21600";
/// Each request's own limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long to keep trying while the metadata service is unreachable.
const GIVE_UP_AFTER: Duration = Duration::from_secs(120);

/// Whether the metadata source is turned off in the environment.
pub fn disabled() -> bool {
    std::env::var(DISABLED_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The endpoint: the flag, else the environment, else the link-local default.
pub fn endpoint(flag: Option<&str>) -> String {
    flag.map(str::to_owned)
        .or_else(|| std::env::var(ENDPOINT_ENV).ok())
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned())
        .trim_end_matches('/')
        .to_owned()
}

/// What one attempt found.
enum Attempt {
    Found(Instance),
    /// The instance has no user data.
    None,
    /// Worth retrying (unreachable, 5xx, throttled).
    Retry(String),
}

/// What the agent reads of its instance at first boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The raw user data.
    pub user_data: String,
    /// The EC2 instance ID (`meta-data/instance-id`), which the coordinator
    /// checks against the instance it launched for the ticket's machine.
    pub instance_id: String,
}

/// Fetches the user data and instance ID, retrying while the service is
/// unreachable. `Ok(None)` when the instance has no user data.
pub async fn instance(endpoint: &str) -> anyhow::Result<Option<Instance>> {
    let http = reqwest::Client::builder()
        .tls_backend_preconfigured(crate::tls::trust_nothing_config().map_err(|e| anyhow!(e))?)
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(REQUEST_TIMEOUT)
        .no_proxy()
        .build()
        .context("cannot build the metadata client")?;
    let started = tokio::time::Instant::now();
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
    loop {
        match attempt(&http, endpoint).await {
            Attempt::Found(i) => return Ok(Some(i)),
            Attempt::None => return Ok(None),
            Attempt::Retry(why) => {
                if started.elapsed() > GIVE_UP_AFTER {
                    bail!(
                        "instance metadata at {endpoint} did not answer for {}s: {why}",
                        GIVE_UP_AFTER.as_secs()
                    );
                }
                let delay = backoff.next_delay();
                tracing::info!(%endpoint, %why, retry_in_ms = delay.as_millis() as u64, "instance metadata not reachable yet");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Why one metadata read failed; each is worth a retry.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("reading {path}: {source}")]
    Body {
        path: String,
        source: reqwest::Error,
    },
    #[error("{path} request answered {status}")]
    Status {
        path: String,
        status: reqwest::StatusCode,
    },
    #[error("{path} request failed: {source}")]
    Request {
        path: String,
        source: reqwest::Error,
    },
}

/// One metadata read: `Ok(None)` on 404.
async fn get(
    http: &reqwest::Client,
    endpoint: &str,
    token: &str,
    path: &str,
) -> Result<Option<String>, ReadError> {
    let path_owned = || path.to_string();
    match http
        .get(format!("{endpoint}/latest/{path}"))
        .header("X-aws-ec2-metadata-token", token)
        .send()
        .await
    {
        Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => Ok(None),
        Ok(r) if r.status().is_success() => {
            r.text().await.map(Some).map_err(|source| ReadError::Body {
                path: path_owned(),
                source,
            })
        }
        Ok(r) => Err(ReadError::Status {
            path: path_owned(),
            status: r.status(),
        }),
        Err(source) => Err(ReadError::Request {
            path: path_owned(),
            source,
        }),
    }
}

async fn attempt(http: &reqwest::Client, endpoint: &str) -> Attempt {
    let token = match http
        .put(format!("{endpoint}/latest/api/token"))
        .header("X-aws-ec2-metadata-token-ttl-seconds", TOKEN_TTL_SECONDS)
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => match r.text().await {
            Ok(t) if !t.trim().is_empty() => t.trim().to_owned(),
            Ok(_) => return Attempt::Retry("empty session token".into()),
            Err(e) => return Attempt::Retry(format!("reading the session token: {e}")),
        },
        Ok(r) => return Attempt::Retry(format!("token request answered {}", r.status())),
        Err(e) => return Attempt::Retry(format!("token request failed: {e}")),
    };
    let user_data = match get(http, endpoint, &token, "user-data").await {
        Ok(Some(u)) => u,
        Ok(None) => return Attempt::None,
        Err(why) => return Attempt::Retry(why.to_string()),
    };
    match get(http, endpoint, &token, "meta-data/instance-id").await {
        Ok(Some(id)) if !id.trim().is_empty() => Attempt::Found(Instance {
            user_data,
            instance_id: id.trim().to_owned(),
        }),
        Ok(_) => Attempt::Retry("the metadata service has no instance-id".into()),
        Err(why) => Attempt::Retry(why.to_string()),
    }
}

/// The bootstrap document in the instance's user data (in any of the
/// formats the NoCloud seed accepts), with the instance ID.
pub async fn read_bootstrap(endpoint: &str) -> anyhow::Result<Option<(BootstrapDocument, String)>> {
    match instance(endpoint).await? {
        Some(i) => crate::nocloud::parse_user_data(&i.user_data)
            .map(|doc| Some((doc, i.instance_id)))
            .with_context(|| format!("invalid user data from instance metadata at {endpoint}")),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A minimal IMDSv2 on loopback: requires the token, serves `body`.
    async fn serve(body: Option<&'static str>, fail_first: usize) -> (String, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let n = h.fetch_add(1, Ordering::SeqCst);
                let mut buf = vec![0u8; 4096];
                let len = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..len]).to_string();
                let resp = if n < fail_first {
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n".to_string()
                } else if req.starts_with("PUT /latest/api/token") {
                    assert!(req
                        .to_ascii_lowercase()
                        .contains("x-aws-ec2-metadata-token-ttl-seconds: 21600"));
                    "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\ntoken".to_string()
                } else if req.starts_with("GET /latest/user-data") {
                    if !req
                        .to_ascii_lowercase()
                        .contains("x-aws-ec2-metadata-token: token")
                    {
                        "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n".to_string()
                    } else if let Some(b) = body {
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{b}", b.len())
                    } else {
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_string()
                    }
                } else if req.starts_with("GET /latest/meta-data/instance-id") {
                    "HTTP/1.1 200 OK\r\nContent-Length: 19\r\n\r\ni-0123456789abcdef0".to_string()
                } else {
                    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_string()
                };
                let _ = s.write_all(resp.as_bytes()).await;
            }
        });
        (format!("http://{addr}"), hits)
    }

    #[tokio::test]
    async fn token_then_user_data_after_retries() {
        let (ep, hits) = serve(Some("hello"), 2).await;
        assert_eq!(
            instance(&ep).await.unwrap(),
            Some(Instance {
                user_data: "hello".into(),
                instance_id: "i-0123456789abcdef0".into()
            })
        );
        assert!(hits.load(Ordering::SeqCst) >= 4);
    }

    #[tokio::test]
    async fn no_user_data_is_final() {
        let (ep, _) = serve(None, 0).await;
        assert_eq!(instance(&ep).await.unwrap(), None);
    }

    #[test]
    fn endpoint_precedence() {
        assert_eq!(endpoint(Some("http://127.0.0.1:9/")), "http://127.0.0.1:9");
    }
}
