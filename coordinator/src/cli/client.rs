//! The operator CLI's connection to a coordinator: where it is, how to trust
//! it, and the admin token, from flags, environment or the config file that
//! `drover serve` writes at first start.

use std::path::PathBuf;

use anyhow::Context;
use drover_common::api::Problem;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use crate::types::{default_config_path, ClientConfigFile};

/// The error for a refused request: its problem document when it has one.
fn failure(status: reqwest::StatusCode, body: &[u8]) -> anyhow::Error {
    let message = match serde_json::from_slice::<Problem>(body) {
        Ok(p) => p.to_string(),
        Err(_) => format!("{status}: {}", String::from_utf8_lossy(body)),
    };
    anyhow::Error::new(Refused { status, message })
}

/// The coordinator answered and refused: its status and what it said.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    pub status: reqwest::StatusCode,
    message: String,
}

/// Whether `e` is the coordinator refusing a write made against an older
/// resourceVersion than the one stored (409): read again and redo it.
pub fn is_conflict(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Refused>()
        .is_some_and(|r| r.status == reqwest::StatusCode::CONFLICT)
}

/// Connection flags shared by every client command.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// Coordinator URL, e.g. https://127.0.0.1:7443.
    #[arg(long, env = "DROVER_ADDR", global = true)]
    pub addr: Option<String>,
    /// Admin token.
    #[arg(long, env = "DROVER_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// PEM file of the coordinator CA.
    #[arg(long, env = "DROVER_CA", global = true)]
    pub ca: Option<PathBuf>,
    /// Client config file (default: $DROVER_CONFIG or ~/.config/drover/config.yaml).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
}

/// The coordinator did not answer: no connection, TLS refused, or no
/// answer in time. `drover` exits 69 for it.
#[derive(Debug, thiserror::Error)]
#[error("cannot reach the coordinator at {base}")]
pub struct Unreachable {
    pub base: String,
    #[source]
    pub source: reqwest::Error,
}

/// The command line or the client config lacks what a command needs.
/// `drover` exits 64 for it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// The exit code for a failed operator command: 69 when the coordinator
/// could not be reached, 64 for missing settings, 1 otherwise.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| c.is::<Unreachable>()) {
        crate::types::EXIT_UNAVAILABLE
    } else if e.chain().any(|c| c.is::<Usage>()) {
        crate::types::EXIT_CONFIG
    } else {
        1
    }
}

/// A connected admin client.
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    /// The coordinator CA it trusts (PEM).
    ca_pem: Vec<u8>,
}

impl Client {
    /// Resolves the connection: flags and environment win over the file.
    pub fn connect(args: &ConnectArgs) -> anyhow::Result<Self> {
        let path = args.config.clone().unwrap_or_else(default_config_path);
        let file: Option<ClientConfigFile> = match std::fs::read_to_string(&path) {
            Ok(text) => Some(serde_saphyr::from_str(&text).map_err(|e| {
                anyhow::anyhow!(
                    "client config {} is invalid: {}; fix it, or pass --addr, --token and --ca",
                    path.display(),
                    crate::cli::documents::yaml_message(&e, 1)
                )
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let base = args
            .addr
            .clone()
            .or_else(|| file.as_ref().map(|f| f.server.clone()))
            .ok_or_else(|| {
                Usage(format!(
                    "no coordinator address: pass --addr, set DROVER_ADDR, or run `drover serve` once to write {}",
                    path.display()
                ))
            })?;
        let token = args
            .token
            .clone()
            .or_else(|| file.as_ref().and_then(|f| f.token.clone()))
            .ok_or_else(|| Usage("no admin token: pass --token or set DROVER_TOKEN".into()))?;
        let ca_path = args
            .ca
            .clone()
            .or_else(|| {
                file.as_ref()
                    .and_then(|f| f.ca_file.clone().map(PathBuf::from))
            })
            .ok_or_else(|| {
                Usage(
                    "no coordinator CA: pass --ca or set DROVER_CA (the data directory's ca.crt)"
                        .into(),
                )
            })?;
        let ca_pem = std::fs::read(&ca_path)
            .with_context(|| format!("cannot read the coordinator CA {}", ca_path.display()))?;
        let http = crate::tls::client_trusting(&ca_pem, std::time::Duration::from_secs(30))
            .with_context(|| format!("cannot use the coordinator CA {}", ca_path.display()))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token,
            ca_pem,
        })
    }

    /// A kubeconfig for the coordinator itself, as this client reaches it
    /// (its URL, its CA, the admin token as a bearer token), for kubectl
    /// and GitOps tools reading `drover.dev/v1alpha1`.
    pub fn coordinator_kubeconfig(&self) -> anyhow::Result<String> {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let doc = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "drover", "cluster": {
                "server": self.base,
                "certificate-authority-data": ca,
            }}],
            "users": [{"name": "drover-admin", "user": {"token": self.token}}],
            "contexts": [{"name": "drover", "context": {"cluster": "drover", "user": "drover-admin"}}],
            "current-context": "drover",
        });
        Ok(serde_saphyr::to_string(&doc)?)
    }

    /// Sends `req` with the token; an answer of any status is `Ok`.
    async fn dispatch(&self, req: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        Ok(req
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|source| Unreachable {
                base: self.base.clone(),
                source,
            })?)
    }

    async fn send<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> anyhow::Result<T> {
        let resp = self.dispatch(req).await?;
        let status = resp.status();
        let bytes = resp.bytes().await?;
        if !status.is_success() {
            return Err(failure(status, &bytes));
        }
        serde_json::from_slice(&bytes).with_context(|| format!("unexpected answer ({status})"))
    }

    /// A DELETE whose answer has no body.
    pub async fn delete_empty(&self, path: &str) -> anyhow::Result<()> {
        let resp = self
            .dispatch(self.http.delete(format!("{}{path}", self.base)))
            .await?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        Err(failure(status, &resp.bytes().await?))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    /// Every object of a list at `path` (`/v1/clusters`), read `chunk` at
    /// a time (each page names the next in its `Drover-Continue` header);
    /// `chunk` 0 reads the list in one answer.
    pub async fn list<T: DeserializeOwned>(
        &self,
        path: &str,
        chunk: usize,
    ) -> anyhow::Result<Vec<T>> {
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        loop {
            // The token is base64url: it needs no escaping in a query.
            let url = match (&token, chunk) {
                (_, 0) => format!("{}{path}", self.base),
                (None, n) => format!("{}{path}?limit={n}", self.base),
                (Some(t), n) => format!("{}{path}?limit={n}&continue={t}", self.base),
            };
            let resp = self.dispatch(self.http.get(url)).await?;
            let status = resp.status();
            token = resp
                .headers()
                .get(drover_common::CONTINUE_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let bytes = resp.bytes().await?;
            if !status.is_success() {
                return Err(failure(status, &bytes));
            }
            let page: Vec<T> = serde_json::from_slice(&bytes)
                .with_context(|| format!("unexpected answer ({status})"))?;
            all.extend(page);
            if token.is_none() {
                return Ok(all);
            }
        }
    }

    /// POSTs to `path` and writes the answer's body into `file` as it
    /// arrives (created new: an existing file is never overwritten);
    /// returns the answer's headers. A refused request writes nothing.
    pub async fn download(
        &self,
        path: &str,
        file: &std::path::Path,
    ) -> anyhow::Result<reqwest::header::HeaderMap> {
        use tokio::io::AsyncWriteExt;
        let mut resp = self
            .dispatch(self.http.post(format!("{}{path}", self.base)))
            .await?;
        let status = resp.status();
        if !status.is_success() {
            return Err(failure(status, &resp.bytes().await?));
        }
        let mut out = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(file)
            .await
            .with_context(|| format!("cannot create {}", file.display()))?;
        while let Some(chunk) = resp
            .chunk()
            .await
            .with_context(|| format!("the answer to POST {path} broke off"))?
        {
            out.write_all(&chunk)
                .await
                .with_context(|| format!("cannot write {}", file.display()))?;
        }
        out.sync_all()
            .await
            .with_context(|| format!("cannot write {}", file.display()))?;
        Ok(resp.headers().clone())
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send(self.http.delete(format!("{}{path}", self.base)))
            .await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body))
            .await
    }

    pub async fn put_json<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.send(self.http.put(format!("{}{path}", self.base)).json(body))
            .await
    }

    pub async fn put_yaml<T: DeserializeOwned>(
        &self,
        path: &str,
        body: String,
    ) -> anyhow::Result<T> {
        self.send(
            self.http
                .put(format!("{}{path}", self.base))
                .header("content-type", "application/yaml")
                .body(body),
        )
        .await
    }
}

/// An API path (`/v1/clusters/NAME`) from its segments, each
/// percent-encoded except for unreserved characters, so no segment can add a
/// path level, a query or a fragment. Names are checked before (a `..`
/// segment is refused by the name rules, not by encoding).
pub fn path(segments: &[&str]) -> String {
    let mut out = String::new();
    for seg in segments {
        out.push('/');
        for b in seg.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod path_tests {
    #[test]
    fn a_refusal_keeps_its_status_so_a_conflict_can_be_redone() {
        let body = br#"{"type":"about:blank","title":"Conflict","status":409,"detail":"cluster web has resourceVersion 48, the document says 47; fetch it again and reapply"}"#;
        let conflict = super::failure(reqwest::StatusCode::CONFLICT, body);
        assert!(super::is_conflict(&conflict));
        assert!(
            conflict.to_string().contains("resourceVersion 48"),
            "{conflict}"
        );
        let gone = super::failure(reqwest::StatusCode::NOT_FOUND, b"no such cluster");
        assert!(!super::is_conflict(&gone));
        assert_eq!(gone.to_string(), "404 Not Found: no such cluster");
        assert!(!super::is_conflict(&anyhow::anyhow!(
            "409 in a message is not a refusal"
        )));
    }

    #[test]
    fn segments_are_encoded() {
        assert_eq!(
            super::path(&["v1", "clusters", "demo"]),
            "/v1/clusters/demo"
        );
        assert_eq!(
            super::path(&["v1", "clusters", "a/b?c#d e"]),
            "/v1/clusters/a%2Fb%3Fc%23d%20e"
        );
    }
}
