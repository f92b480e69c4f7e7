//! The control plane's stacked etcd as its agent sees it: the member list,
//! each member's health, and member removal on the coordinator's directive.
//! Through etcd's v3 JSON gateway over HTTPS with the certificate kubeadm
//! wrote for the API server (`apiserver-etcd-client.crt`), so the agent
//! needs no gRPC. The agent only dials its own member (and the members'
//! `/health`); it never connects anywhere it was not told by etcd itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use drover_common::api::EtcdMember;
use drover_common::wire::EtcdReport;
use serde::Deserialize;

use crate::api::error_chain;
use crate::tls;

/// How long one etcd call may take.
pub const ETCD_TIMEOUT: Duration = Duration::from_secs(2);

/// Why etcd could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot build the etcd client: {0}")]
    Client(String),
    #[error("{call} at {endpoint} failed: {detail}")]
    Call {
        call: &'static str,
        endpoint: String,
        detail: String,
    },
    #[error("etcd member {0} is not a hexadecimal member id")]
    BadId(String),
    #[error("member {name} ({id}) is this machine's own; a machine never removes its own member on request (kubeadm reset does)")]
    Own { id: String, name: String },
    #[error("etcd member {name} ({id}) leads and no other started, healthy voting member can take over; it is not removed while it leads")]
    NoSuccessor { id: String, name: String },
}

/// A client for the local etcd member, rebuilt when the certificates change
/// (a reset and a new cluster bring new ones).
#[derive(Debug)]
pub struct Etcd {
    root: PathBuf,
    client: tls::CachedClient,
}

#[derive(Deserialize)]
struct MemberList {
    #[serde(default)]
    members: Vec<GatewayMember>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct GatewayMember {
    /// A uint64, which the gateway writes as a decimal string.
    #[serde(rename = "ID")]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default, rename = "peerURLs")]
    peer_urls: Vec<String>,
    #[serde(default, rename = "clientURLs")]
    client_urls: Vec<String>,
    /// Absent (false) for a voting member.
    #[serde(default, rename = "isLearner")]
    is_learner: bool,
}

impl Etcd {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
            client: tls::CachedClient::default(),
        }
    }

    /// The client for a snapshot's calls (each sets its own timeout).
    pub fn snapshot_client(&mut self) -> Result<reqwest::Client, EtcdError> {
        self.client()
    }

    fn client(&mut self) -> Result<reqwest::Client, EtcdError> {
        let files = [
            "etc/kubernetes/pki/etcd/ca.crt",
            "etc/kubernetes/pki/apiserver-etcd-client.crt",
            "etc/kubernetes/pki/apiserver-etcd-client.key",
        ]
        .map(|rel| self.root.join(rel));
        let unreadable = |path, source| EtcdError::Read { path, source };
        self.client.built_from_files(&files, unreadable, |pem| {
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            let config = tls::mtls_config(&text(&pem[0]), &text(&pem[1]), &text(&pem[2]))
                .map_err(|e| EtcdError::Client(e.to_string()))?;
            tls::local_client(config, ETCD_TIMEOUT).map_err(|e| EtcdError::Client(error_chain(&e)))
        })
    }

    /// The member list through `endpoint` (the local member's client URL),
    /// with each started member's health as this machine sees it.
    pub async fn members(&mut self, endpoint: &str) -> Result<Vec<EtcdMember>, EtcdError> {
        let client = self.client()?;
        let list: MemberList =
            query(&client, endpoint, "member list", "/v3/cluster/member/list").await?;
        let checks = list.members.iter().map(|m| {
            let client = client.clone();
            let url = m.client_urls.first().cloned();
            async move {
                let Some(url) = url else { return false };
                match client.get(format!("{url}/health")).send().await {
                    Ok(r) if r.status().is_success() => r
                        .text()
                        .await
                        .is_ok_and(|b| b.contains("\"health\":\"true\"")),
                    _ => false,
                }
            }
        });
        let health = futures_util::future::join_all(checks).await;
        let mut out: Vec<EtcdMember> = list
            .members
            .into_iter()
            .zip(health)
            .map(|(m, healthy)| EtcdMember {
                id: hex_id(&m.id).unwrap_or(m.id),
                started: !m.name.is_empty() && !m.client_urls.is_empty(),
                name: m.name,
                peer_urls: m.peer_urls,
                client_urls: m.client_urls,
                healthy,
                is_learner: m.is_learner,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// The keys under `/registry/` (what the API server stores) counted by
    /// resource, through `endpoint` ([`count_keys`]).
    pub async fn count_objects(&mut self, endpoint: &str) -> Result<ObjectCount, EtcdError> {
        let client = self.client()?;
        count_keys(&client, endpoint).await
    }

    /// The report a heartbeat carries.
    pub async fn report(&mut self, endpoint: &str) -> EtcdReport {
        let (members, error) = crate::api::list_or_error(self.members(endpoint).await);
        EtcdReport { members, error }
    }

    /// The id (hexadecimal) of the member that leads, as the member at
    /// `endpoint` knows it (etcd's maintenance status).
    async fn leader(&mut self, endpoint: &str) -> Result<String, EtcdError> {
        #[derive(Deserialize)]
        struct Status {
            /// A uint64 as a decimal string; "0" or absent: no leader.
            #[serde(default)]
            leader: String,
        }
        let client = self.client()?;
        let status: Status = query(
            &client,
            endpoint,
            "maintenance status",
            "/v3/maintenance/status",
        )
        .await?;
        Ok(hex_id(&status.leader).unwrap_or_default())
    }

    /// Moves etcd leadership away from member `id` (hexadecimal) when it
    /// leads, before the member is removed, as Cluster API's
    /// KubeadmControlPlane does (controlplane/kubeadm/internal/
    /// workload_cluster_etcd.go ForwardEtcdLeadership, etcd's MoveLeader):
    /// removing the leader itself leaves the cluster without one until an
    /// election timeout passes, and every write waits. The new leader is a
    /// started, healthy voting member, the one at `endpoint` when it may;
    /// the request goes to the leader, the only member that can hand
    /// leadership over. Returns what was done, `None` when `id` does not
    /// lead.
    pub async fn hand_over_leadership(
        &mut self,
        endpoint: &str,
        id: &str,
    ) -> Result<Option<String>, EtcdError> {
        let members = self.members(endpoint).await?;
        if self.leader(endpoint).await? != id {
            return Ok(None);
        }
        let Some(leader) = members.iter().find(|m| m.id == id) else {
            return Ok(None);
        };
        let fit = |m: &&EtcdMember| m.id != id && m.started && m.healthy && !m.is_learner;
        let successor = members
            .iter()
            .filter(fit)
            .find(|m| m.client_urls.iter().any(|u| u == endpoint))
            .or_else(|| members.iter().find(fit));
        let (Some(successor), Some(leader_url)) = (successor, leader.client_urls.first()) else {
            return Err(EtcdError::NoSuccessor {
                id: id.to_owned(),
                name: leader.name.clone(),
            });
        };
        let target = u64::from_str_radix(&successor.id, 16)
            .map_err(|_| EtcdError::BadId(successor.id.clone()))?;
        let client = self.client()?;
        post(
            &client,
            leader_url,
            "move leader",
            "/v3/maintenance/transfer-leadership",
            serde_json::json!({ "targetID": target.to_string() }),
        )
        .await?;
        Ok(Some(format!(
            "moved etcd leadership from {} ({id}) to {} ({})",
            leader.name, successor.name, successor.id
        )))
    }

    /// Before this machine's `kubeadm reset` removes its own member (named
    /// `own_name`): leadership leaves it first when it leads.
    pub async fn hand_over_own_leadership(
        &mut self,
        endpoint: &str,
        own_name: &str,
    ) -> Result<Option<String>, EtcdError> {
        let members = self.members(endpoint).await?;
        let Some(own) = members.iter().find(|m| m.name == own_name) else {
            return Ok(None);
        };
        if members.len() == 1 {
            return Ok(None); // The last member: kubeadm reset keeps it.
        }
        let id = own.id.clone();
        self.hand_over_leadership(endpoint, &id).await
    }

    /// Removes member `id` (hexadecimal) through `endpoint`, unless it is
    /// this machine's own (`own_name`); when it leads, leadership moves to
    /// another member first ([`Etcd::hand_over_leadership`]).
    pub async fn remove(
        &mut self,
        endpoint: &str,
        id: &str,
        name: &str,
        own_name: &str,
    ) -> Result<String, EtcdError> {
        let members = self.members(endpoint).await?;
        let numeric = u64::from_str_radix(id, 16).map_err(|_| EtcdError::BadId(id.to_owned()))?;
        if let Some(m) = members.iter().find(|m| m.id == id) {
            if m.name == own_name {
                return Err(EtcdError::Own {
                    id: id.to_owned(),
                    name: m.name.clone(),
                });
            }
        } else {
            return Ok(format!("etcd member {id} ({name}) is already gone"));
        }
        let moved = self.hand_over_leadership(endpoint, id).await?;
        let client = self.client()?;
        post(
            &client,
            endpoint,
            "member remove",
            "/v3/cluster/member/remove",
            serde_json::json!({ "ID": numeric.to_string() }),
        )
        .await?;
        Ok(match moved {
            Some(moved) => format!("{moved}, then removed etcd member {id} ({name})"),
            None => format!("removed etcd member {id} ({name})"),
        })
    }
}

/// A member id (a uint64 as a decimal string) in hexadecimal.
fn hex_id(decimal: &str) -> Option<String> {
    decimal.parse::<u64>().ok().map(|id| format!("{id:x}"))
}

/// A call of etcd's JSON gateway without arguments; its answer parsed.
async fn query<T: serde::de::DeserializeOwned>(
    client: &reqwest::Client,
    endpoint: &str,
    call: &'static str,
    path: &str,
) -> Result<T, EtcdError> {
    let body = post(client, endpoint, call, path, serde_json::json!({})).await?;
    serde_json::from_str(&body).map_err(|e| EtcdError::Call {
        call,
        endpoint: endpoint.to_owned(),
        detail: e.to_string(),
    })
}

/// The keys under `/registry/` (what the API server stores) counted by
/// resource, through `endpoint`, at one revision: keys only, in pages
/// of [`KEYS_PAGE`]. The counts, their total and the revision.
pub async fn count_keys(
    client: &reqwest::Client,
    endpoint: &str,
) -> Result<ObjectCount, EtcdError> {
    #[derive(Deserialize)]
    struct Header {
        #[serde(default)]
        revision: String,
    }
    #[derive(Deserialize)]
    struct Kv {
        key: String,
    }
    #[derive(Deserialize)]
    struct Range {
        header: Header,
        #[serde(default)]
        kvs: Vec<Kv>,
        #[serde(default)]
        more: bool,
    }
    const PREFIX: &str = "/registry/";
    let call = "range /registry/ (keys only)";
    let bad = |detail: String| EtcdError::Call {
        call,
        endpoint: endpoint.to_owned(),
        detail,
    };
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut count = ObjectCount::default();
    let mut from = PREFIX.as_bytes().to_vec();
    loop {
        let mut body = serde_json::json!({
            "key": b64(&from),
            "range_end": b64(b"/registry0"),
            "keys_only": true,
            "limit": KEYS_PAGE,
        });
        if count.revision > 0 {
            body["revision"] = count.revision.to_string().into();
        }
        let text = post(client, endpoint, call, "/v3/kv/range", body).await?;
        let page: Range = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if count.revision == 0 {
            count.revision = page.header.revision.parse().unwrap_or_default();
        }
        let mut last = None;
        for kv in &page.kvs {
            let key = base64::engine::general_purpose::STANDARD
                .decode(&kv.key)
                .map_err(|e| bad(format!("a key is not base64: {e}")))?;
            let text = String::from_utf8_lossy(&key);
            let rest = text.strip_prefix(PREFIX).unwrap_or(&text);
            *count.objects.entry(resource_of(rest)).or_default() += 1;
            count.total += 1;
            last = Some(key);
        }
        match last {
            Some(mut key) if page.more => {
                key.push(0);
                from = key;
            }
            _ => return Ok(count),
        }
    }
}

/// How many keys one page of [`count_keys`] reads.
pub const KEYS_PAGE: u64 = 5000;

/// What etcd holds under `/registry/`, by resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectCount {
    pub objects: std::collections::BTreeMap<String, u64>,
    pub total: u64,
    pub revision: i64,
}

/// The resource of a key under `/registry/` (`rest` is what follows it):
/// its first part (`pods/ns/name` is `pods`), or its first two when the
/// first is an API group, as the API server stores custom and aggregated
/// resources (`apiextensions.k8s.io/customresourcedefinitions/name`;
/// k8s.io/apiserver's storage/names.go and the `etcd3` key layout).
fn resource_of(rest: &str) -> String {
    let mut parts = rest.split('/');
    let first = parts.next().unwrap_or_default();
    match parts.next() {
        Some(second) if first.contains('.') => format!("{first}/{second}"),
        _ => first.to_owned(),
    }
}

/// One call of etcd's JSON gateway; the answer's body when it succeeded.
async fn post(
    client: &reqwest::Client,
    endpoint: &str,
    call: &'static str,
    path: &str,
    body: serde_json::Value,
) -> Result<String, EtcdError> {
    let failed = |detail: String| EtcdError::Call {
        call,
        endpoint: endpoint.to_owned(),
        detail,
    };
    let resp = client
        .post(format!("{endpoint}{path}"))
        .json(&body)
        .send()
        .await
        .map_err(|e| failed(error_chain(&e)))?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| failed(error_chain(&e)))?;
    if !status.is_success() {
        return Err(failed(format!("{status}: {text}")));
    }
    Ok(text)
}

/// The client URL of this machine's own member.
pub fn local_endpoint(advertise: std::net::IpAddr) -> String {
    match advertise {
        std::net::IpAddr::V6(v6) => format!("https://[{v6}]:2379"),
        v4 => format!("https://{v4}:2379"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_member_lists_parse_with_decimal_ids() {
        let body = r#"{"header":{"cluster_id":"1"},"members":[{"ID":"10276657743932975437","name":"cp-1","peerURLs":["https://10.0.0.1:2380"],"clientURLs":["https://10.0.0.1:2379"]},{"ID":"42","peerURLs":["https://10.0.0.2:2380"]}]}"#;
        let list: MemberList = serde_json::from_str(body).unwrap();
        assert_eq!(list.members.len(), 2);
        assert_eq!(
            format!("{:x}", list.members[0].id.parse::<u64>().unwrap()),
            "8e9e05c52164694d"
        );
        assert!(list.members[1].name.is_empty() && list.members[1].client_urls.is_empty());
        assert_eq!(
            local_endpoint("fd00::1".parse().unwrap()),
            "https://[fd00::1]:2379"
        );
    }

    #[test]
    fn a_learner_is_reported_as_one() {
        // What etcd 3.4's gateway answers with a learner added and started.
        let body = r#"{"header":{"cluster_id":"3460116363838020990"},"members":[{"ID":"7501010807256764859","name":"a","peerURLs":["http://127.0.0.77:2380"],"clientURLs":["http://127.0.0.77:2379"]},{"ID":"8045402628072419262","name":"b","peerURLs":["http://127.0.0.78:2380"],"clientURLs":["http://127.0.0.78:2379"],"isLearner":true}]}"#;
        let list: MemberList = serde_json::from_str(body).unwrap();
        assert!(!list.members[0].is_learner);
        assert!(list.members[1].is_learner);
    }

    /// Two fake members behind etcd's JSON gateway: `cp-a` (id a) and
    /// `cp-b` (id b); `cp-a` leads until a leadership transfer sent to it
    /// hands it to the target.
    async fn two_members(pki: &crate::fake_https::Pki) -> (String, String) {
        use std::sync::{Arc, OnceLock};
        let addrs: Arc<OnceLock<(std::net::SocketAddr, std::net::SocketAddr)>> = Arc::default();
        let seen = addrs.clone();
        let handler: crate::fake_https::Handler = Arc::new(move |call, before| {
            let (a, b) = *seen.get().unwrap();
            let moved_to = before
                .iter()
                .rev()
                .find(|c| c.path == "/v3/maintenance/transfer-leadership")
                .map(|c| {
                    serde_json::from_str::<serde_json::Value>(&c.body).unwrap()["targetID"].clone()
                });
            let leader = match moved_to {
                Some(t) => t.as_str().unwrap().to_owned(),
                None => "10".to_owned(),
            };
            let url = |s: std::net::SocketAddr| format!("https://{s}");
            match call.path.as_str() {
                "/v3/cluster/member/list" => (200, serde_json::json!({"members": [
                    {"ID": "10", "name": "cp-a", "peerURLs": ["https://10.0.0.1:2380"], "clientURLs": [url(a)]},
                    {"ID": "11", "name": "cp-b", "peerURLs": ["https://10.0.0.2:2380"], "clientURLs": [url(b)]},
                ]}).to_string()),
                "/health" => (200, r#"{"health":"true"}"#.into()),
                "/v3/maintenance/status" => (200, serde_json::json!({"leader": leader}).to_string()),
                "/v3/maintenance/transfer-leadership" => {
                    let leads = if leader == "10" { a } else { b };
                    if call.server == leads {
                        (200, "{}".into())
                    } else {
                        (503, r#"{"error":"etcdserver: not leader","code":9}"#.into())
                    }
                }
                "/v3/cluster/member/remove" => (200, "{}".into()),
                _ => (404, "{}".into()),
            }
        });
        let a = pki.serve(handler.clone()).await;
        let b = pki.serve(handler).await;
        addrs.set((a, b)).unwrap();
        (format!("https://{a}"), format!("https://{b}"))
    }

    #[tokio::test]
    async fn leadership_moves_away_before_the_leaders_member_is_removed() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let root = tempfile::tempdir().unwrap();
        let pki = crate::fake_https::Pki::new();
        pki.write_etcd_client(root.path());
        let (a, b) = two_members(&pki).await;
        let mut etcd = Etcd::new(root.path());
        // cp-b's own member does not lead: nothing moves before its reset.
        assert_eq!(
            etcd.hand_over_own_leadership(&b, "cp-b").await.unwrap(),
            None
        );
        // The coordinator asks cp-b to remove cp-a, the leader: leadership
        // goes to cp-b first, through cp-a, then the member goes.
        let done = etcd.remove(&b, "a", "cp-a", "cp-b").await.unwrap();
        assert_eq!(
            done,
            "moved etcd leadership from cp-a (a) to cp-b (b), then removed etcd member a (cp-a)"
        );
        let calls: Vec<(String, String, String)> = pki
            .calls()
            .into_iter()
            .filter(|c| c.method == "POST" && c.path != "/v3/cluster/member/list")
            .map(|c| (format!("https://{}", c.server), c.path, c.body))
            .collect();
        let moved = calls
            .iter()
            .position(|c| c.1 == "/v3/maintenance/transfer-leadership")
            .expect("a leadership transfer");
        let removed = calls
            .iter()
            .position(|c| c.1 == "/v3/cluster/member/remove")
            .expect("a member removal");
        assert!(moved < removed, "{calls:?}");
        assert_eq!(calls[moved].0, a, "sent to the leader: {calls:?}");
        assert_eq!(calls[moved].2, r#"{"targetID":"11"}"#);
        assert_eq!(calls[removed].0, b);
        // cp-a, leading no more, would hand nothing over before its reset.
        let mut own = Etcd::new(root.path());
        assert_eq!(
            own.hand_over_own_leadership(&a, "cp-a").await.unwrap(),
            None
        );
    }

    /// A real etcd holding more keys than a page, under `/registry/` and
    /// beside it: every key under it is counted once, by resource (a
    /// group's resource by group and resource), at one revision; what is
    /// put after the first page is not counted.
    #[tokio::test]
    async fn a_real_etcds_objects_are_counted_by_resource_page_by_page() {
        use base64::engine::general_purpose::STANDARD;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let Some(etcd) = crate::test_etcd::TestEtcd::start() else {
            return;
        };
        let client = reqwest::Client::builder().build().unwrap();
        let put = |key: String| {
            let client = client.clone();
            let url = format!("{}/v3/kv/put", etcd.url);
            async move {
                let body =
                    serde_json::json!({"key": STANDARD.encode(key), "value": STANDARD.encode("v")});
                let r = client.post(url).json(&body).send().await.unwrap();
                assert!(r.status().is_success());
            }
        };
        let n = KEYS_PAGE as usize + 7;
        for i in 0..n {
            put(format!("/registry/configmaps/ns{}/cm-{i}", i % 3)).await;
        }
        put("/registry/namespaces/ns0".into()).await;
        put("/registry/apiextensions.k8s.io/customresourcedefinitions/a.example.com".into()).await;
        put("/registry0-not-it".into()).await;
        put("/other/key".into()).await;
        let count = count_keys(&client, &etcd.url).await.unwrap();
        assert_eq!(count.total, n as u64 + 2, "{count:?}");
        assert_eq!(count.objects["configmaps"], n as u64);
        assert_eq!(count.objects["namespaces"], 1);
        assert_eq!(
            count.objects["apiextensions.k8s.io/customresourcedefinitions"],
            1
        );
        assert_eq!(count.objects.len(), 3, "{count:?}");
        assert!(count.revision > n as i64, "{count:?}");
    }
}
