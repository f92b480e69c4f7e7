//! The stand-in API server's state, kept in the control plane's real etcd
//! (the stacked etcd `kubeadm init` starts and `kubeadm join
//! --control-plane` extends) under the keys the real API server uses:
//! `/registry/secrets/kube-system/bootstrap-token-<id>` and
//! `/registry/configmaps/kube-system/kubeadm-config`, with JSON values. So
//! every control plane of a cluster serves the same bootstrap tokens and
//! config, whichever one a join reaches through the cluster's endpoint.
//!
//! The client authenticates with the API server's etcd client certificate
//! (`apiserver-etcd-client.crt`), as kube-apiserver does. A copy of the
//! uploaded ClusterConfiguration also stays on the machine
//! (`/var/lib/standin-apiserver/kubeadm-config.yaml`), where `kubeadm reset`
//! finds the certificates directory when the cluster is out of reach.

use std::time::Duration;

use anyhow::{Context, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use drover_common::token::BootstrapToken;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, GetResponse, Identity,
    TlsOptions, Txn, TxnOp,
};
use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::util::{write_file, Root};

pub const STORE_DIR: &str = "/var/lib/standin-apiserver";
pub const CLUSTER_CONFIG_FILE: &str = "/var/lib/standin-apiserver/kubeadm-config.yaml";

/// gRPC's UNAVAILABLE status code, which etcd answers while it has no
/// leader.
const GRPC_UNAVAILABLE: i32 = 14;

const TOKEN_PREFIX: &str = "/registry/secrets/kube-system/bootstrap-token-";
const KUBEADM_CONFIG_KEY: &str = "/registry/configmaps/kube-system/kubeadm-config";
/// Where the real API server keeps Nodes (their old name, minions).
const NODE_PREFIX: &str = "/registry/minions/";

/// Where a control plane's etcd is and how to authenticate to it.
#[derive(Debug, Clone)]
pub struct EtcdAccess {
    pub endpoints: Vec<String>,
    /// The etcd CA, the client certificate and its key (PEM).
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl EtcdAccess {
    /// The API server's access to the local etcd at `endpoint`, with the
    /// certificates under `cert_dir` (a path as kubeadm sees it).
    pub fn apiserver(root: &Root, cert_dir: &str, endpoint: &str) -> Result<Self> {
        let read = |f: &str| {
            let logical = format!("{cert_dir}/{f}");
            std::fs::read_to_string(root.path(&logical)).with_context(|| format!("open {logical}"))
        };
        Ok(Self {
            endpoints: vec![endpoint.to_owned()],
            ca_pem: read("etcd/ca.crt")?,
            cert_pem: read("apiserver-etcd-client.crt")?,
            key_pem: read("apiserver-etcd-client.key")?,
        })
    }

    /// The same access with other endpoints.
    pub fn at(&self, endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            ..self.clone()
        }
    }
}

/// A connected etcd client.
pub async fn connect(access: &EtcdAccess) -> Result<Client> {
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(&access.ca_pem))
        .identity(Identity::from_pem(&access.cert_pem, &access.key_pem));
    let opts = ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(3))
        .with_timeout(Duration::from_secs(5));
    Client::connect(access.endpoints.clone(), Some(opts))
        .await
        .with_context(|| format!("cannot connect to etcd at {}", access.endpoints.join(",")))
}

/// The API server's objects in etcd.
#[derive(Clone)]
pub struct Store {
    client: Client,
}

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
    /// The token as the API server serves it: a bootstrap-token Secret.
    pub fn secret_json(&self) -> serde_json::Value {
        let t = self;
        let mut data = std::collections::BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            data.insert(k.to_owned(), B64.encode(v.as_bytes()));
        };
        put("token-id", &t.id);
        put("token-secret", &t.secret);
        if let Some(e) = &t.expires {
            put("expiration", e);
        }
        if let Some(d) = &t.description {
            put("description", d);
        }
        for u in &t.usages {
            put(&format!("usage-bootstrap-{u}"), "true");
        }
        if !t.groups.is_empty() {
            put("auth-extra-groups", &t.groups.join(","));
        }
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": format!("bootstrap-token-{}", t.id), "namespace": "kube-system"},
            "type": "bootstrap.kubernetes.io/token",
            "data": data,
        })
    }

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

/// Outcome of adding a token.
#[derive(Debug, PartialEq, Eq)]
pub enum Added {
    Created,
    /// An unexpired token with this id exists (with `replace` false).
    AlreadyExists,
}

impl Store {
    pub async fn connect(access: &EtcdAccess) -> Result<Self> {
        Ok(Self {
            client: connect(access).await?,
        })
    }

    /// A read (etcd Range) of `key`, tried again while etcd answers
    /// UNAVAILABLE (a leader election under way, as when the leader's
    /// member is removed), as etcd's Go client retries repeatable requests
    /// for kube-apiserver: up to six times, 50 ms apart and doubling.
    async fn get(
        &self,
        key: &str,
        options: Option<GetOptions>,
    ) -> Result<GetResponse, etcd_client::Error> {
        let mut delay = Duration::from_millis(50);
        let mut attempts = 0;
        loop {
            match self.client.kv_client().get(key, options.clone()).await {
                Err(etcd_client::Error::GRpcStatus(s))
                    if s.code() as i32 == GRPC_UNAVAILABLE && attempts < 6 =>
                {
                    attempts += 1;
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                other => return other,
            }
        }
    }

    /// Every unexpired bootstrap token.
    pub async fn load_tokens(&self) -> Result<Vec<StoredToken>> {
        let resp = self
            .get(TOKEN_PREFIX, Some(GetOptions::new().with_prefix()))
            .await
            .context("cannot read bootstrap tokens from etcd")?;
        let mut out = vec![];
        for item in resp.kvs() {
            let t: StoredToken = serde_json::from_slice(item.value()).with_context(|| {
                format!(
                    "corrupt bootstrap token {}",
                    String::from_utf8_lossy(item.key())
                )
            })?;
            out.push(t);
        }
        Ok(out)
    }

    /// Adds (or, with `replace`, updates) a token; an expired one with the
    /// same id is replaced, as the token cleaner would have deleted it.
    pub async fn add_token(&self, token: StoredToken, replace: bool) -> Result<Added> {
        let key = format!("{TOKEN_PREFIX}{}", token.id);
        let value = serde_json::to_vec(&token)?;
        let mut kv = self.client.kv_client();
        if !replace {
            let current = kv.get(key.as_str(), None).await?;
            if let Some(existing) = current.kvs().first() {
                let t: Option<StoredToken> = serde_json::from_slice(existing.value()).ok();
                if t.is_some_and(|t| !t.expired()) {
                    return Ok(Added::AlreadyExists);
                }
                // Expired: replace it only if nobody changed it meanwhile.
                let revision = existing.mod_revision();
                let unchanged = Compare::mod_revision(key.as_str(), CompareOp::Equal, revision);
                return put_when(&mut kv, &key, value, unchanged).await;
            }
            let absent = Compare::version(key.as_str(), CompareOp::Equal, 0);
            return put_when(&mut kv, &key, value, absent).await;
        }
        kv.put(key, value, None)
            .await
            .context("cannot write a bootstrap token to etcd")?;
        Ok(Added::Created)
    }

    /// Stores the ClusterConfiguration YAML kubeadm uploads as `kubeadm-config`.
    pub async fn save_cluster_config(&self, yaml: &str) -> Result<()> {
        self.client
            .kv_client()
            .put(KUBEADM_CONFIG_KEY, yaml, None)
            .await
            .context("cannot write the kubeadm-config ConfigMap to etcd")?;
        Ok(())
    }

    /// The stored ClusterConfiguration YAML and its etcd revision, which the
    /// ConfigMap shows as its `resourceVersion`.
    pub async fn cluster_config_with_revision(&self) -> Result<Option<(String, i64)>> {
        let resp = self
            .get(KUBEADM_CONFIG_KEY, None)
            .await
            .context("cannot read the kubeadm-config ConfigMap from etcd")?;
        Ok(resp.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.mod_revision(),
            )
        }))
    }

    /// Replaces the ClusterConfiguration if it is still at `revision`;
    /// false when another writer changed it first.
    pub async fn replace_cluster_config(&self, yaml: &str, revision: i64) -> Result<bool> {
        let unchanged = Compare::mod_revision(KUBEADM_CONFIG_KEY, CompareOp::Equal, revision);
        let mut kv = self.client.kv_client();
        let put = put_when(
            &mut kv,
            KUBEADM_CONFIG_KEY,
            yaml.as_bytes().to_vec(),
            unchanged,
        )
        .await
        .context("cannot write the kubeadm-config ConfigMap to etcd")?;
        Ok(put == Added::Created)
    }

    pub async fn load_cluster_config(&self) -> Result<Option<String>> {
        Ok(self
            .cluster_config_with_revision()
            .await?
            .map(|(yaml, _)| yaml))
    }

    /// The cluster's etcd members, as `(id, name, peer URLs, client URLs)`.
    pub async fn members(&self) -> Result<Vec<Member>> {
        let resp = self
            .client
            .cluster_client()
            .member_list()
            .await
            .context("cannot list the etcd members")?;
        Ok(resp.members().iter().map(Member::from).collect())
    }

    /// Adds a member with `peer_url` as a learner unless one has it
    /// already, as kubeadm's join does since its `EtcdLearnerMode` (GA in
    /// 1.32; cmd/kubeadm/app/phases/etcd/local.go
    /// CreateStackedEtcdStaticPodManifestFile calls
    /// cmd/kubeadm/app/util/etcd/etcd.go AddMemberAsLearner): the learner
    /// votes for nothing until [`Store::promote_member`], and etcd itself
    /// refuses a second learner ("too many learner members in cluster").
    /// Returns every member's `name=peerURL` for the new member's
    /// `--initial-cluster` (`name` is empty for members not started yet;
    /// the new member is named `new_name`).
    pub async fn add_member(&self, new_name: &str, peer_url: &str) -> Result<String> {
        let mut members = self.members().await?;
        if !members
            .iter()
            .any(|m| m.peer_urls.iter().any(|u| u == peer_url))
        {
            // etcd refuses a new member until the last one has been
            // connected for its health interval (5 s): "unhealthy cluster".
            // kubeadm retries with back-off; so does the stand-in, for up
            // to a minute.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            let resp = loop {
                match self
                    .client
                    .cluster_client()
                    .member_add(
                        vec![peer_url.to_owned()],
                        Some(etcd_client::MemberAddOptions::new().with_is_learner()),
                    )
                    .await
                {
                    Ok(r) => break r,
                    Err(e)
                        if e.to_string().contains("unhealthy cluster")
                            && tokio::time::Instant::now() < deadline =>
                    {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => {
                        return Err(e)
                            .with_context(|| format!("cannot add the etcd member {peer_url}"))
                    }
                }
            };
            members = resp.member_list().iter().map(Member::from).collect();
        }
        Ok(members
            .iter()
            .filter_map(|m| {
                let url = m.peer_urls.first()?;
                let name = if url == peer_url {
                    new_name
                } else {
                    m.name.as_str()
                };
                (!name.is_empty()).then(|| format!("{name}={url}"))
            })
            .collect::<Vec<_>>()
            .join(","))
    }

    /// Promotes the learner with `peer_url` to a voting member, as
    /// kubeadm's join does once the learner's static Pod is written
    /// (cmd/kubeadm/app/util/etcd/etcd.go MemberPromote): etcd refuses
    /// while the learner is not in sync with the leader ("can only promote
    /// a learner member which is in sync with leader"), and kubeadm tries
    /// again until `timeout`. A member already voting is left as it is.
    pub async fn promote_member(&self, peer_url: &str, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let members = self.members().await?;
            let Some(member) = members
                .iter()
                .find(|m| m.peer_urls.iter().any(|u| u == peer_url))
            else {
                anyhow::bail!("no etcd member has the peer URL {peer_url}");
            };
            if !member.is_learner {
                return Ok(());
            }
            match self.client.cluster_client().member_promote(member.id).await {
                Ok(_) => return Ok(()),
                Err(e)
                    if e.to_string().contains("in sync with leader")
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "cannot promote the etcd learner {:x} ({peer_url})",
                            member.id
                        )
                    })
                }
            }
        }
    }

    /// Every Node, as stored.
    pub async fn nodes(&self) -> Result<Vec<serde_json::Value>> {
        self.objects(NODE_PREFIX, "Nodes").await
    }

    pub async fn node(&self, name: &str) -> Result<Option<serde_json::Value>> {
        self.object(&Self::node_key(name), "a Node").await
    }

    /// The key of Node `name`, for [`Self::put_object`].
    pub fn node_key(name: &str) -> String {
        format!("{NODE_PREFIX}{name}")
    }

    /// Deletes a Node; false when there was none.
    pub async fn delete_node(&self, name: &str) -> Result<bool> {
        self.delete_object(&Self::node_key(name), "a Node").await
    }

    /// Every object stored under `prefix` (`what`, for errors).
    pub async fn objects(&self, prefix: &str, what: &str) -> Result<Vec<serde_json::Value>> {
        let options = GetOptions::new().with_prefix();
        self.read(prefix, Some(options), what).await
    }

    /// The object at `key` (`what`, for errors).
    pub async fn object(&self, key: &str, what: &str) -> Result<Option<serde_json::Value>> {
        Ok(self.read(key, None, what).await?.into_iter().next())
    }

    /// The objects a read of `key` with `options` finds, parsed.
    async fn read(
        &self,
        key: &str,
        options: Option<GetOptions>,
        what: &str,
    ) -> Result<Vec<serde_json::Value>> {
        let entries = self.read_entries(key, options, what).await?;
        Ok(entries.into_iter().map(|(_, value, _)| value).collect())
    }

    /// What a read of `key` with `options` finds: each object parsed, with
    /// its key and etcd mod revision.
    async fn read_entries(
        &self,
        key: &str,
        options: Option<GetOptions>,
        what: &str,
    ) -> Result<Vec<(String, serde_json::Value, i64)>> {
        let resp = self
            .get(key, options)
            .await
            .with_context(|| format!("cannot read {what} from etcd"))?;
        resp.kvs()
            .iter()
            .map(|kv| {
                let value = serde_json::from_slice(kv.value())
                    .with_context(|| format!("the stored {what} is corrupt"))?;
                Ok((
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    value,
                    kv.mod_revision(),
                ))
            })
            .collect()
    }

    /// Puts `value` at `key` if `cmp` holds.
    async fn put_object_when(
        &self,
        key: &str,
        value: &serde_json::Value,
        cmp: Compare,
    ) -> Result<Added> {
        let mut kv = self.client.kv_client();
        put_when(&mut kv, key, serde_json::to_vec(value)?, cmp).await
    }

    /// Writes the object at `key`: `create` only when absent (false: it
    /// exists), else only when present (false: it is gone).
    pub async fn put_object(
        &self,
        key: &str,
        value: &serde_json::Value,
        create: bool,
    ) -> Result<bool> {
        let cmp = if create {
            Compare::version(key, CompareOp::Equal, 0)
        } else {
            Compare::version(key, CompareOp::Greater, 0)
        };
        let added = self.put_object_when(key, value, cmp).await?;
        Ok(matches!(added, Added::Created))
    }

    /// The object at `key` with its etcd modification revision, for an
    /// update that must not overwrite a concurrent one.
    pub async fn object_with_revision(
        &self,
        key: &str,
        what: &str,
    ) -> Result<Option<(serde_json::Value, i64)>> {
        let entries = self.read_entries(key, None, what).await?;
        Ok(entries
            .into_iter()
            .next()
            .map(|(_, value, rev)| (value, rev)))
    }

    /// Every object stored under `prefix` (`what`, for errors), each with
    /// its key and etcd mod revision, for [`Self::replace_object`].
    pub async fn objects_with_revisions(
        &self,
        prefix: &str,
        what: &str,
    ) -> Result<Vec<(String, serde_json::Value, i64)>> {
        let options = GetOptions::new().with_prefix();
        self.read_entries(prefix, Some(options), what).await
    }

    /// Replaces the object at `key` if it is still at `revision`, as the
    /// API server's optimistic concurrency does; false when another writer
    /// changed it first.
    pub async fn replace_object(
        &self,
        key: &str,
        value: &serde_json::Value,
        revision: i64,
    ) -> Result<bool> {
        let unchanged = Compare::mod_revision(key, CompareOp::Equal, revision);
        let put = self.put_object_when(key, value, unchanged).await?;
        Ok(put == Added::Created)
    }

    /// Deletes the object at `key`; false when there was none.
    pub async fn delete_object(&self, key: &str, what: &str) -> Result<bool> {
        let mut kv = self.client.kv_client();
        let deleted = kv.delete(key, None).await;
        Ok(deleted
            .with_context(|| format!("cannot delete {what} in etcd"))?
            .deleted()
            > 0)
    }

    /// Removes the member `id`.
    pub async fn remove_member(&self, id: u64) -> Result<()> {
        self.client
            .cluster_client()
            .member_remove(id)
            .await
            .with_context(|| format!("cannot remove etcd member {id:x}"))?;
        Ok(())
    }
}

/// Puts `value` at `key` if `cmp` holds: `Created`, or `AlreadyExists`
/// when another writer got there first.
async fn put_when(
    kv: &mut etcd_client::KvClient,
    key: &str,
    value: Vec<u8>,
    cmp: Compare,
) -> Result<Added> {
    let txn = Txn::new()
        .when(vec![cmp])
        .and_then(vec![TxnOp::put(key, value, None)]);
    Ok(if kv.txn(txn).await?.succeeded() {
        Added::Created
    } else {
        Added::AlreadyExists
    })
}

/// One etcd member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

impl From<&etcd_client::Member> for Member {
    fn from(m: &etcd_client::Member) -> Self {
        Self {
            id: m.id(),
            name: m.name().to_owned(),
            peer_urls: m.peer_urls().to_vec(),
            client_urls: m.client_urls().to_vec(),
            is_learner: m.is_learner(),
        }
    }
}

/// Keeps the machine's copy of the uploaded ClusterConfiguration (for
/// `kubeadm reset`).
pub fn save_local_cluster_config(root: &Root, yaml: &str) -> Result<()> {
    write_file(&root.path(CLUSTER_CONFIG_FILE), yaml.as_bytes(), 0o644)
}

pub fn load_local_cluster_config(root: &Root) -> Option<String> {
    std::fs::read_to_string(root.path(CLUSTER_CONFIG_FILE)).ok()
}
