//! The control plane's stacked etcd as its agent sees it: the member list,
//! each member's health, and member removal on the coordinator's directive.
//! Through etcd's v3 JSON gateway over HTTPS with the certificate kubeadm
//! wrote for the API server (`apiserver-etcd-client.crt`), so the agent
//! needs no gRPC. The agent only dials its own member (and the members'
//! `/health`); it never connects anywhere it was not told by etcd itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

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
}

impl Etcd {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
            client: tls::CachedClient::default(),
        }
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
        let body = post(
            &client,
            endpoint,
            "member list",
            "/v3/cluster/member/list",
            serde_json::json!({}),
        )
        .await?;
        let list: MemberList = serde_json::from_str(&body).map_err(|e| EtcdError::Call {
            call: "member list",
            endpoint: endpoint.to_owned(),
            detail: e.to_string(),
        })?;
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
                id: m
                    .id
                    .parse::<u64>()
                    .map(|id| format!("{id:x}"))
                    .unwrap_or(m.id),
                started: !m.name.is_empty() && !m.client_urls.is_empty(),
                name: m.name,
                peer_urls: m.peer_urls,
                client_urls: m.client_urls,
                healthy,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// The report a heartbeat carries.
    pub async fn report(&mut self, endpoint: &str) -> EtcdReport {
        let (members, error) = crate::api::list_or_error(self.members(endpoint).await);
        EtcdReport { members, error }
    }

    /// Removes member `id` (hexadecimal) through `endpoint`, unless it is
    /// this machine's own (`own_name`).
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
        let client = self.client()?;
        post(
            &client,
            endpoint,
            "member remove",
            "/v3/cluster/member/remove",
            serde_json::json!({ "ID": numeric.to_string() }),
        )
        .await?;
        Ok(format!("removed etcd member {id} ({name})"))
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
}
