//! The machine API client: JSON over HTTPS to the coordinator replicas, in
//! order, failing over to the next replica when one cannot be reached.

use std::error::Error as StdError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use drover_common::api::Problem;
use drover_common::wire::{
    ConfigNotReady, HeartbeatRequest, HeartbeatResponse, InventoryReport, RegisterRequest,
    RegisterResponse, RenewRequest, RenewResponse, SnapshotGrant, SnapshotSaved, SnapshotUpload,
    INVENTORY_PATH, SEALED_SHA256_HEADER, SNAPSHOT_PATH,
};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::protocol::config::ConfigAnswer;
use crate::protocol::paths::{CERTIFICATE_PATH, CONFIG_PATH, HEARTBEAT_PATH, REGISTER_PATH};
use crate::tls::{find_pin_mismatch, PinMismatch};

/// Timeouts of coordinator requests.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub request: Duration,
    /// How long the agent keeps an unused connection open. Longer than any
    /// heartbeat interval, so heartbeats reuse one connection (a new TLS
    /// handshake costs the coordinator about three heartbeats' CPU). A
    /// coordinator short of memory closes idle connections itself
    /// (`drover serve --idle-timeout`); the agent then reconnects, resuming
    /// its TLS session from the coordinator's ticket.
    pub idle_connection: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(20),
            idle_connection: Duration::from_secs(90),
        }
    }
}

/// Why a call to the coordinator did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot build the HTTPS client: {0}")]
    Client(String),
    #[error(transparent)]
    PinMismatch(#[from] PinMismatch),
    #[error("cannot reach any coordinator: {0}")]
    Unreachable(String),
    #[error("{method} {url} was refused with {status}: {problem}")]
    Refused {
        method: Method,
        url: String,
        status: StatusCode,
        problem: Box<Problem>,
    },
    #[error("{method} {url} answered {status} with a body the agent cannot read: {detail}")]
    BadAnswer {
        method: Method,
        url: String,
        status: StatusCode,
        detail: String,
    },
}

impl ApiError {
    /// The HTTP status of a refusal.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ApiError::Refused { status, .. } | ApiError::BadAnswer { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the coordinator refused this machine's client certificate.
    pub fn is_unauthorized(&self) -> bool {
        matches!(
            self.status(),
            Some(StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
        )
    }
}

/// A client for the coordinator replicas.
#[derive(Debug)]
pub struct CoordinatorClient {
    /// The replicas' URLs without a trailing `/`; replaced when a heartbeat
    /// answer names new ones ([`CoordinatorClient::set_urls`]).
    urls: RwLock<Arc<Vec<String>>>,
    http: reqwest::Client,
    /// The replica that answered last; tried first next time.
    preferred: AtomicUsize,
    /// The coordinator's clock against this machine's, as the last answer
    /// with a `Date` showed it.
    clock: std::sync::Mutex<Option<crate::problems::ClockReading>>,
}

/// A raw answer.
struct Answer {
    method: Method,
    url: String,
    status: StatusCode,
    body: Vec<u8>,
}

impl Answer {
    fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_json::from_slice(&self.body).map_err(|e| ApiError::BadAnswer {
            method: self.method.clone(),
            url: self.url.clone(),
            status: self.status,
            detail: e.to_string(),
        })
    }

    fn problem(&self) -> Problem {
        serde_json::from_slice::<Problem>(&self.body).unwrap_or_else(|_| {
            let text = String::from_utf8_lossy(&self.body);
            Problem {
                type_: "about:blank".into(),
                title: self
                    .status
                    .canonical_reason()
                    .unwrap_or("Unexpected status")
                    .into(),
                status: self.status.as_u16(),
                detail: text.chars().take(300).collect(),
                errors: vec![],
            }
        })
    }

    fn refused(self) -> ApiError {
        let problem = Box::new(self.problem());
        ApiError::Refused {
            method: self.method,
            url: self.url,
            status: self.status,
            problem,
        }
    }
}

/// Where heartbeat datagrams go: the address and port of coordinator
/// `url`, over UDP.
pub async fn datagram_target(url: &str) -> Result<std::net::SocketAddr, std::io::Error> {
    let invalid =
        |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{url}: {why}"));
    let parsed = reqwest::Url::parse(url).map_err(|e| invalid(&e.to_string()))?;
    let port = parsed
        .port_or_known_default()
        .ok_or_else(|| invalid("no port"))?;
    let host = parsed.host_str().ok_or_else(|| invalid("no host"))?;
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
        return Ok((ip, port).into());
    }
    let mut addrs = tokio::net::lookup_host((bare.as_str(), port)).await?;
    addrs
        .next()
        .ok_or_else(|| invalid("the name has no address"))
}

/// A list a heartbeat reports, or why it could not be read: the list (empty
/// on failure) and the error's message (empty on success).
pub fn list_or_error<T, E: std::fmt::Display>(result: Result<Vec<T>, E>) -> (Vec<T>, String) {
    match result {
        Ok(list) => (list, String::new()),
        Err(e) => (vec![], e.to_string()),
    }
}

/// An error and all its sources on one line.
pub fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

impl CoordinatorClient {
    /// How far the coordinator's clock is from this machine's, as the
    /// last answer that carried a `Date` showed it.
    pub fn clock_reading(&self) -> Option<crate::problems::ClockReading> {
        *self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the clock reading of an answer sent at `sent` with `headers`
    /// (HTTP servers date every answer, to the second: RFC 9110 6.6.1).
    fn note_clock(&self, sent: std::time::SystemTime, headers: &reqwest::header::HeaderMap) {
        let Some(date) = headers
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
        else {
            return;
        };
        let reading = crate::problems::ClockReading::of(sent, std::time::SystemTime::now(), date);
        *self.clock.lock().unwrap_or_else(|e| e.into_inner()) = Some(reading);
    }

    /// A client for `urls` (`https://host:port`) using the given TLS setup.
    pub fn new(
        urls: &[String],
        tls: rustls::ClientConfig,
        timeouts: Timeouts,
    ) -> Result<Self, ApiError> {
        Self::build(urls, tls, timeouts, None)
    }

    /// A client like [`CoordinatorClient::new`] whose connections leave
    /// from `source` (the fleet simulator spreads its machines over
    /// loopback addresses, as a real fleet has one address per machine).
    pub fn bound_to(
        urls: &[String],
        tls: rustls::ClientConfig,
        timeouts: Timeouts,
        source: std::net::IpAddr,
    ) -> Result<Self, ApiError> {
        Self::build(urls, tls, timeouts, Some(source))
    }

    fn build(
        urls: &[String],
        tls: rustls::ClientConfig,
        timeouts: Timeouts,
        source: Option<std::net::IpAddr>,
    ) -> Result<Self, ApiError> {
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .connect_timeout(timeouts.connect)
            .timeout(timeouts.request)
            .pool_idle_timeout(timeouts.idle_connection)
            .local_address(source)
            .user_agent(concat!("drover-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ApiError::Client(error_chain(&e)))?;
        Ok(Self {
            urls: RwLock::new(Arc::new(normalise(urls))),
            http,
            preferred: AtomicUsize::new(0),
            clock: std::sync::Mutex::new(None),
        })
    }

    async fn call<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<Answer, ApiError> {
        self.call_within(method, path, body, None).await
    }

    /// [`CoordinatorClient::call`] with each URL given at most `timeout`
    /// (instead of the client's request timeout) before the next is tried.
    async fn call_within<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        timeout: Option<Duration>,
    ) -> Result<Answer, ApiError> {
        let urls = self.urls();
        let n = urls.len();
        let start = self.preferred.load(Ordering::Relaxed) % n.max(1);
        let mut failures = Vec::new();
        let mut mismatch = None;
        // The first replica that answered it cannot serve now (502, 503,
        // 504): its answer is returned when no other replica serves.
        let mut unavailable = None;
        for i in 0..n {
            let index = (start + i) % n;
            let url = format!("{}{path}", urls[index]);
            let mut request = self
                .http
                .request(method.clone(), &url)
                .header(reqwest::header::ACCEPT, "application/json");
            if let Some(body) = body {
                request = request.json(body);
            }
            if let Some(t) = timeout {
                request = request.timeout(t);
            }
            let sent = std::time::SystemTime::now();
            let response = match request.send().await {
                Ok(r) => {
                    self.note_clock(sent, r.headers());
                    r
                }
                Err(e) => {
                    if let Some(m) = find_pin_mismatch(&e) {
                        tracing::debug!(url = %url, "{m}");
                        mismatch = Some(m);
                    } else {
                        let chain = error_chain(&e);
                        tracing::debug!(url = %url, error = %chain, "coordinator unreachable");
                        failures.push(format!("{url}: {chain}"));
                    }
                    continue;
                }
            };
            let status = response.status();
            let body = match response.bytes().await {
                Ok(b) => b.to_vec(),
                Err(e) => {
                    failures.push(format!("{url}: reading the answer: {}", error_chain(&e)));
                    continue;
                }
            };
            // A follower of a highly available coordinator: the leader is
            // another of the URLs.
            if status == StatusCode::MISDIRECTED_REQUEST {
                tracing::debug!(url = %url, "coordinator is not the leader; trying the next");
                failures.push(format!("{url}: not the leader"));
                continue;
            }
            // A replica that cannot serve now (its store is unreachable, a
            // proxy in front of it has no backend): another may.
            if matches!(
                status,
                StatusCode::BAD_GATEWAY
                    | StatusCode::SERVICE_UNAVAILABLE
                    | StatusCode::GATEWAY_TIMEOUT
            ) {
                tracing::debug!(url = %url, %status, "coordinator cannot serve now; trying the next");
                failures.push(format!("{url}: {status}"));
                unavailable.get_or_insert(Answer {
                    method: method.clone(),
                    url,
                    status,
                    body,
                });
                continue;
            }
            self.preferred.store(index, Ordering::Relaxed);
            return Ok(Answer {
                method,
                url,
                status,
                body,
            });
        }
        match (mismatch, unavailable) {
            (Some(m), _) => Err(ApiError::PinMismatch(m)),
            (None, Some(answer)) => Ok(answer),
            (None, None) => Err(ApiError::Unreachable(failures.join("; "))),
        }
    }

    /// The replicas' URLs now.
    pub fn urls(&self) -> Arc<Vec<String>> {
        self.urls.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the replicas' URLs (a heartbeat answer named new ones). The
    /// replica that answered last is still tried first when the new list
    /// names it; else the new list's first.
    pub fn set_urls(&self, urls: &[String]) {
        let urls = normalise(urls);
        let preferred = self.preferred_url();
        let index = urls.iter().position(|u| *u == preferred).unwrap_or(0);
        *self.urls.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(urls);
        self.preferred.store(index, Ordering::Relaxed);
    }

    /// The URL of the replica that answered last (the leader, in a highly
    /// available coordinator).
    pub fn preferred_url(&self) -> String {
        let urls = self.urls();
        let n = urls.len().max(1);
        urls.get(self.preferred.load(Ordering::Relaxed) % n)
            .cloned()
            .unwrap_or_default()
    }

    /// `POST /v1/machine/register`.
    pub async fn register(&self, req: &RegisterRequest) -> Result<RegisterResponse, ApiError> {
        let answer = self.call(Method::POST, REGISTER_PATH, Some(req)).await?;
        match answer.status {
            StatusCode::CREATED | StatusCode::OK => answer.json(),
            _ => Err(answer.refused()),
        }
    }

    /// `POST /v1/machine/heartbeat`, giving each coordinator at most
    /// `timeout`: a heartbeat later than its interval is worth less than
    /// trying the next coordinator (a hung leader must not make the machine
    /// look silent to the new one).
    pub async fn heartbeat(
        &self,
        req: &HeartbeatRequest,
        timeout: Duration,
    ) -> Result<HeartbeatResponse, ApiError> {
        let answer = self
            .call_within(Method::POST, HEARTBEAT_PATH, Some(req), Some(timeout))
            .await?;
        match answer.status {
            StatusCode::OK => answer.json(),
            _ => Err(answer.refused()),
        }
    }

    /// `GET /v1/machine/config`.
    pub async fn config(&self) -> Result<ConfigAnswer, ApiError> {
        let answer = self.call::<()>(Method::GET, CONFIG_PATH, None).await?;
        match answer.status {
            StatusCode::OK => answer.json().map(ConfigAnswer::Bundle),
            StatusCode::CONFLICT => Ok(ConfigAnswer::NotReady(not_ready(&answer.body))),
            StatusCode::NOT_FOUND => Ok(ConfigAnswer::NotAssigned),
            _ => Err(answer.refused()),
        }
    }

    /// `POST /v1/machine/certificate`.
    pub async fn renew(&self, req: &RenewRequest) -> Result<RenewResponse, ApiError> {
        let answer = self.call(Method::POST, CERTIFICATE_PATH, Some(req)).await?;
        match answer.status {
            StatusCode::OK | StatusCode::CREATED => answer.json(),
            _ => Err(answer.refused()),
        }
    }
}

impl CoordinatorClient {
    /// `GET /v1/machine/snapshots/{name}`: the grant to save snapshot
    /// `name`.
    pub async fn snapshot_grant(&self, name: &str) -> Result<SnapshotGrant, ApiError> {
        let path = format!("{SNAPSHOT_PATH}/{name}");
        let answer = self.call::<()>(Method::GET, &path, None).await?;
        match answer.status {
            StatusCode::OK => answer.json(),
            _ => Err(answer.refused()),
        }
    }

    /// `POST /v1/machine/snapshots/{name}`: snapshot `name` was saved and
    /// uploaded.
    pub async fn snapshot_saved(&self, name: &str, saved: &SnapshotSaved) -> Result<(), ApiError> {
        let path = format!("{SNAPSHOT_PATH}/{name}");
        let answer = self.call(Method::POST, &path, Some(saved)).await?;
        match answer.status {
            StatusCode::OK | StatusCode::CREATED | StatusCode::NO_CONTENT => Ok(()),
            _ => Err(answer.refused()),
        }
    }

    /// Reports the inventory a drill cluster asked of this machine.
    pub async fn inventory(&self, report: &InventoryReport) -> Result<(), ApiError> {
        let answer = self
            .call(Method::POST, INVENTORY_PATH, Some(report))
            .await?;
        match answer.status {
            StatusCode::OK | StatusCode::CREATED | StatusCode::NO_CONTENT => Ok(()),
            _ => Err(answer.refused()),
        }
    }

    /// `GET`s the sealed snapshot at `path` of the coordinator that
    /// answered last (with the machine's certificate) into `file`, streamed;
    /// `timeout` bounds the whole download. The bytes written.
    pub async fn download_snapshot(
        &self,
        path: &str,
        file: &std::path::Path,
        timeout: Duration,
    ) -> Result<u64, ApiError> {
        use futures_util::StreamExt as _;
        use tokio::io::AsyncWriteExt as _;
        let url = format!("{}{path}", self.preferred_url());
        let response = self
            .http
            .get(&url)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| ApiError::Unreachable(format!("GET {url}: {}", error_chain(&e))))?;
        let status = response.status();
        if !status.is_success() {
            let body = response
                .bytes()
                .await
                .map(|b| b.to_vec())
                .unwrap_or_default();
            return Err(Answer {
                method: Method::GET,
                url,
                status,
                body,
            }
            .refused());
        }
        let cannot_write =
            |e: std::io::Error| ApiError::Client(format!("cannot write {}: {e}", file.display()));
        let mut out = tokio::fs::File::create(file).await.map_err(cannot_write)?;
        let mut stream = response.bytes_stream();
        let mut len = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::Unreachable(format!(
                    "GET {url}: the body broke off: {}",
                    error_chain(&e)
                ))
            })?;
            out.write_all(&chunk).await.map_err(cannot_write)?;
            len += chunk.len() as u64;
        }
        out.sync_all().await.map_err(cannot_write)?;
        Ok(len)
    }

    /// `PUT`s the sealed snapshot at `file` (`len` bytes, SHA-256
    /// `sealed_sha256`) to `upload`: the coordinator that granted it (the
    /// replica that answered last, with the machine's certificate) or a
    /// presigned URL (with nothing of the machine's). The body streams from
    /// the file; `timeout` bounds the whole upload.
    pub async fn upload_snapshot(
        &self,
        upload: &SnapshotUpload,
        file: &std::path::Path,
        len: u64,
        sealed_sha256: &str,
        timeout: Duration,
    ) -> Result<(), ApiError> {
        let (client, url) = match upload {
            SnapshotUpload::Coordinator { path } => {
                (self.http.clone(), format!("{}{path}", self.preferred_url()))
            }
            SnapshotUpload::Presigned { url } => {
                let tls = crate::tls::system_roots_config()
                    .map_err(|e| ApiError::Client(e.to_string()))?;
                let plain = reqwest::Client::builder()
                    .tls_backend_preconfigured(tls)
                    .user_agent(concat!("drover-agent/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .map_err(|e| ApiError::Client(error_chain(&e)))?;
                (plain, url.clone())
            }
        };
        // What a log line may say of the URL: never a presigned query.
        let shown = url.split('?').next().unwrap_or_default().to_owned();
        let opened = tokio::fs::File::open(file)
            .await
            .map_err(|e| ApiError::Unreachable(format!("cannot read {}: {e}", file.display())))?;
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(opened));
        let response = client
            .put(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .header(reqwest::header::CONTENT_LENGTH, len)
            .header(SEALED_SHA256_HEADER, sealed_sha256)
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| ApiError::Unreachable(format!("PUT {shown}: {}", error_chain(&e))))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let body = response
            .bytes()
            .await
            .map(|b| b.to_vec())
            .unwrap_or_default();
        Err(Answer {
            method: Method::PUT,
            url: shown,
            status,
            body,
        }
        .refused())
    }
}

/// URLs as the client uses them: without a trailing `/`.
fn normalise(urls: &[String]) -> Vec<String> {
    urls.iter()
        .map(|u| u.trim_end_matches('/').to_owned())
        .collect()
}

/// Reads a 409 answer: a `ConfigNotReady`, or a problem document carrying its
/// fields as extension members, or at worst any problem document.
fn not_ready(body: &[u8]) -> ConfigNotReady {
    if let Ok(nr) = serde_json::from_slice::<ConfigNotReady>(body) {
        return nr;
    }
    let value: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let text = |key: &str| value.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    let reason = text("reason")
        .or_else(|| text("detail").filter(|d| !d.is_empty()))
        .or_else(|| text("title"))
        .unwrap_or_else(|| "the coordinator has no config for this machine yet".into());
    let retry_after_seconds = value
        .get("retryAfterSeconds")
        .and_then(|v| v.as_u64())
        .unwrap_or(5);
    ConfigNotReady {
        reason,
        retry_after_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_forms() {
        let nr = not_ready(br#"{"reason":"waiting for init","retryAfterSeconds":7}"#);
        assert_eq!(
            (nr.reason.as_str(), nr.retry_after_seconds),
            ("waiting for init", 7)
        );
        let nr = not_ready(
            br#"{"type":"about:blank","title":"Config not ready","status":409,"detail":"no join token yet","retryAfterSeconds":3}"#,
        );
        assert_eq!(
            (nr.reason.as_str(), nr.retry_after_seconds),
            ("no join token yet", 3)
        );
        let nr = not_ready(b"garbage");
        assert_eq!(nr.retry_after_seconds, 5);
    }

    #[test]
    fn problem_fallback_for_plain_bodies() {
        let answer = Answer {
            method: Method::POST,
            url: "https://c/v1/machine/register".into(),
            status: StatusCode::BAD_GATEWAY,
            body: b"upstream down".to_vec(),
        };
        let p = answer.problem();
        assert_eq!(p.status, 502);
        assert_eq!(p.title, "Bad Gateway");
        assert_eq!(p.detail, "upstream down");
    }
}
