//! The stand-in API server's state, kept in files under
//! `<root>/var/lib/standin-apiserver/` so that `kubeadm init` can register
//! tokens directly and the daemon re-reads them on each request:
//! `tokens.json` (bootstrap tokens) and `kubeadm-config.yaml` (the uploaded
//! ClusterConfiguration, served as the `kubeadm-config` ConfigMap).

use std::io::Write;

use anyhow::{anyhow, Context, Result};
use drover_common::token::BootstrapToken;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::util::{write_file, Root};

pub const STORE_DIR: &str = "/var/lib/standin-apiserver";
pub const TOKENS_FILE: &str = "/var/lib/standin-apiserver/tokens.json";
pub const CLUSTER_CONFIG_FILE: &str = "/var/lib/standin-apiserver/kubeadm-config.yaml";

/// A bootstrap token as the `bootstrap-token-<id>` Secret holds it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoredToken {
    pub id: String,
    pub secret: String,
    /// RFC 3339; absent means the token never expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    #[serde(default)]
    pub usages: Vec<String>,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl StoredToken {
    pub fn new(
        token: &BootstrapToken,
        ttl: Option<std::time::Duration>,
        usages: Vec<String>,
        groups: Vec<String>,
        description: Option<String>,
    ) -> Self {
        let expires = ttl.filter(|d| !d.is_zero()).map(|d| {
            let at = OffsetDateTime::now_utc() + d;
            at.replace_nanosecond(0)
                .unwrap_or(at)
                .format(&Rfc3339)
                .expect("RFC 3339 formats")
        });
        Self {
            id: token.id().to_owned(),
            secret: token.secret().to_owned(),
            expires,
            usages,
            groups,
            description,
        }
    }

    pub fn expired(&self) -> bool {
        match &self.expires {
            None => false,
            Some(e) => match OffsetDateTime::parse(e, &Rfc3339) {
                Ok(at) => at <= OffsetDateTime::now_utc(),
                Err(_) => true,
            },
        }
    }

    pub fn has_usage(&self, usage: &str) -> bool {
        self.usages.iter().any(|u| u == usage)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    tokens: Vec<StoredToken>,
}

/// Reads the token store (an absent file is an empty store).
pub fn load_tokens(root: &Root) -> Result<Vec<StoredToken>> {
    let path = root.path(TOKENS_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(serde_json::from_str::<TokenFile>(&text)
            .with_context(|| format!("corrupt token store {}", path.display()))?
            .tokens),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Outcome of adding a token.
#[derive(Debug, PartialEq, Eq)]
pub enum Added {
    Created,
    /// An unexpired token with this id exists (with `replace` false).
    AlreadyExists,
}

/// Adds (or, with `replace`, updates) a token under an exclusive lock.
/// Expired tokens are dropped, as the token cleaner controller deletes them.
pub fn add_token(root: &Root, token: StoredToken, replace: bool) -> Result<Added> {
    let dir = root.path(STORE_DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let lock_path = dir.join("tokens.lock");
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("cannot open {}", lock_path.display()))?;
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow!("cannot lock {}: {e}", lock_path.display()))?;
    let mut tokens = load_tokens(root)?;
    tokens.retain(|t| !t.expired());
    if let Some(pos) = tokens.iter().position(|t| t.id == token.id) {
        if !replace {
            return Ok(Added::AlreadyExists);
        }
        tokens.remove(pos);
    }
    tokens.push(token);
    let mut text = serde_json::to_vec_pretty(&TokenFile { tokens })?;
    text.write_all(b"\n")?;
    write_file(&root.path(TOKENS_FILE), &text, 0o600)?;
    Ok(Added::Created)
}

/// Makes sure the store exists (possibly empty) so a daemon can start.
pub fn ensure_store(root: &Root) -> Result<()> {
    let path = root.path(TOKENS_FILE);
    if !path.exists() {
        write_file(&path, b"{\n  \"tokens\": []\n}\n", 0o600)?;
    }
    Ok(())
}

/// Stores the ClusterConfiguration YAML kubeadm uploads as `kubeadm-config`.
pub fn save_cluster_config(root: &Root, yaml: &str) -> Result<()> {
    write_file(&root.path(CLUSTER_CONFIG_FILE), yaml.as_bytes(), 0o644)
}

pub fn load_cluster_config(root: &Root) -> Option<String> {
    std::fs::read_to_string(root.path(CLUSTER_CONFIG_FILE)).ok()
}
