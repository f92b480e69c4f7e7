//! The admin API's answers, the client config file and the wording of a
//! YAML error: what the server and the operator CLI share. This module imports nothing of the server,
//! so the CLI can use it without depending on the server's modules.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;
use time::OffsetDateTime;

/// Exit code for invalid configuration or flags (EX_USAGE), of `drover
/// serve`, the operator commands and `drover store` alike.
pub const EXIT_CONFIG: u8 = 64;

/// Exit code of an operator command that could not reach the coordinator
/// (EX_UNAVAILABLE).
pub const EXIT_UNAVAILABLE: u8 = 69;

/// The condition type the reconciler keeps on a machine that went silent or
/// whose instance stopped (False), cleared to True when it is back.
pub use drover_common::api::ALIVE_CONDITION;

/// A role an admin token grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AdminRole {
    Admin,
    Viewer,
}

/// An admin token as listed: never its secret.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdminTokenInfo {
    pub id: String,
    pub role: AdminRole,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: time::OffsetDateTime,
}

/// The answer to a creation: the only time the secret is shown.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedAdminToken {
    pub id: String,
    pub role: AdminRole,
    pub token: String,
}

/// The keyring's state.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeysInfo {
    /// The key that encrypts, then older keys still accepted.
    pub key_ids: Vec<String>,
    /// Records re-encrypted by the rotation that produced this answer.
    #[serde(default)]
    pub resealed: usize,
}

/// One coordinator replica, as announced to the others.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaInfo {
    /// `host:port` of the replica's API.
    pub id: String,
    /// Its API's URL.
    pub url: String,
    pub version: String,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    /// The port the replica serves the API on at the gateway of every
    /// Docker cluster network (its listen port); machines of docker
    /// clusters reach it at `https://drover-coordinator:PORT`. Absent from
    /// replicas that predate it.
    pub gateway_port: Option<u16>,
    /// The URLs the replica advertises to machines (`--advertise-url`);
    /// the leader hands every replica's to machines outside docker
    /// networks. Empty from replicas that predate it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub advertise_urls: Vec<String>,
}

/// One coordinator replica and whether it leads.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoordinatorEntry {
    #[serde(flatten)]
    pub replica: ReplicaInfo,
    pub leader: bool,
}

/// One audited request.
#[skip_serializing_none]
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    #[serde(with = "time::serde::rfc3339")]
    pub time: OffsetDateTime,
    /// `admin-token:<id> (<role>)`, `machine:<name>`, `invalid-admin-token`
    /// or `anonymous`.
    pub actor: String,
    /// The client's address.
    pub source: String,
    /// The method; `*` in a summary entry.
    pub method: String,
    /// The path, at most 256 bytes (a longer one is cut and ends in `…`);
    /// in a summary entry, the last refused path.
    pub path: String,
    /// The HTTP status of the answer (the last one, in a summary entry);
    /// 0 in an entry of stage `RequestReceived`, written before the answer.
    pub status: u16,
    /// `RequestReceived` in the entry of an admin's change written before
    /// the change is carried out (the entry with its answer follows); unset
    /// in every entry written after the answer.
    pub stage: Option<AuditStage>,
    /// In a summary entry: how many refused requests from `source` it
    /// stands for, which were not recorded one by one.
    pub suppressed: Option<u64>,
    /// What the request changed that runs or lands on machines (files and
    /// commands around kubeadm), one line each, content as hashes only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
}

/// When an audit entry was written, as Kubernetes' audit stages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum AuditStage {
    /// Before the request was carried out.
    RequestReceived,
}

/// The client config file.
#[skip_serializing_none]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientConfigFile {
    pub server: String,
    pub ca_file: Option<String>,
    pub token: Option<String>,
}

impl ClientConfigFile {
    /// Writes the file with mode 0600 (it holds the admin token).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_saphyr::to_string(self).expect("serializes");
        drover_common::fsutil::write_atomic(path, text.as_bytes(), 0o600)
    }
}

/// How long ago `t` was, as the CLI's tables and the web view show it:
/// "5s", "3m", "2h", "4d"; `-` for no time.
pub fn age(t: Option<OffsetDateTime>) -> String {
    let Some(t) = t else { return "-".into() };
    let s = (drover_common::now() - t).whole_seconds().max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// The default client config path: `$DROVER_CONFIG`, else
/// `$XDG_CONFIG_HOME/drover/config.yaml`, else `~/.config/drover/config.yaml`.
pub fn default_config_path() -> PathBuf {
    if let Ok(p) = std::env::var("DROVER_CONFIG") {
        return PathBuf::from(p);
    }
    if let Ok(x) = std::env::var("XDG_CONFIG_HOME") {
        return PathBuf::from(x).join("drover/config.yaml");
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    PathBuf::from(home).join(".config/drover/config.yaml")
}

/// A YAML parse error as Drover words it, on one line: the parser's message
/// at its line and column in the whole source (the text parsed starts at
/// line `first_line` of it), then, when `text` is given, that line as
/// written, so a type error still shows its field. Never a source snippet,
/// nor the library's hints to programmers (its functions and options, Rust
/// types). The coordinator gives the text of every document but a Secret's.
pub fn yaml_error(e: &serde_saphyr::Error, text: Option<&str>, first_line: usize) -> String {
    let mut out = e.render_with_options(serde_saphyr::render_options! {
        formatter: &YamlWords,
        snippets: serde_saphyr::SnippetMode::Off,
        line_offset: first_line.saturating_sub(1) as u64,
    });
    let written = e
        .location()
        .map(|l| l.line() as usize)
        .filter(|l| *l > 0)
        .and_then(|l| text?.lines().nth(l - 1))
        .map(str::trim)
        .filter(|l| !l.is_empty());
    if let Some(line) = written {
        let line: String = line.chars().take(80).collect();
        out.push_str(&format!(", in {line:?}"));
    }
    out
}

/// serde-saphyr's messages, and its messages for users (or ours) where
/// those name its functions, options or Rust types.
struct YamlWords;

impl serde_saphyr::MessageFormatter for YamlWords {
    fn format_message<'a>(&self, err: &'a serde_saphyr::Error) -> std::borrow::Cow<'a, str> {
        use serde_saphyr::Error as E;
        match err {
            E::MultipleDocuments { .. } => {
                "a second document starts here; put a line of --- between documents".into()
            }
            E::DuplicateMappingKey { .. }
            | E::BinaryNotUtf8 { .. }
            | E::InvalidCharNull { .. }
            | E::InvalidCharNotSingleScalar { .. }
            | E::NullIntoString { .. }
            | E::BytesNotSupportedMissingBinaryTag { .. }
            | E::InvalidBooleanStrict { .. } => {
                serde_saphyr::UserMessageFormatter.format_message(err)
            }
            _ => serde_saphyr::DefaultMessageFormatter.format_message(err),
        }
    }
}

/// What one background task of a coordinator reports about itself in
/// `GET /v1/status` (`tasks`), and what `drover get tasks` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    /// The task's name, such as `cluster-reconciler`.
    pub name: String,
    /// How long the task waits between runs when nothing activates it.
    pub period_millis: u64,
    /// Runs completed since the coordinator started.
    pub runs: u64,
    /// When the last run began.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub last_run_started: Option<OffsetDateTime>,
    /// When the last run ended.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub last_run_finished: Option<OffsetDateTime>,
    /// What went wrong in the last run; absent when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the task runs next unless something activates it earlier.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub next_run: Option<OffsetDateTime>,
    /// The work queue of a task that runs per object (the cluster
    /// reconciler: one run is one cluster's reconcile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStatus>,
    /// The last error of each object whose last run failed, each naming
    /// its object (the cluster reconciler: one per failing cluster).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub object_errors: Vec<String>,
}

/// A task's work queue as it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// Objects waiting for a worker.
    pub ready: u64,
    /// Objects being worked on.
    pub processing: u64,
    /// Objects waiting for their requeue time.
    pub delayed: u64,
    /// How long the last object taken had waited for a worker.
    pub last_wait_millis: u64,
}
