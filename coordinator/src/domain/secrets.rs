//! Key material the coordinator keeps in its store: its own CA, the ticket
//! key, hashed admin tokens and each cluster's CA set.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use drover_common::pki::{CertificateAuthority, PkiError};
use drover_common::ticket::TicketKey;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::store::{Kind, Op, Store, StoreError};

pub const COORDINATOR_CA: &str = "coordinator-ca";
pub const TICKET_KEY: &str = "ticket-key";
pub const ADMIN_TOKENS: &str = "admin-tokens";

/// A stored certificate authority.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredCa {
    pub cert_pem: String,
    pub key_pem: String,
}

impl From<CertificateAuthority> for StoredCa {
    fn from(ca: CertificateAuthority) -> Self {
        Self {
            cert_pem: ca.cert_pem,
            key_pem: ca.key_pem,
        }
    }
}

impl StoredCa {
    pub fn ca(&self) -> CertificateAuthority {
        CertificateAuthority {
            cert_pem: self.cert_pem.clone(),
            key_pem: self.key_pem.clone(),
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredTicketKey {
    key_b64: String,
}

pub use crate::types::AdminRole;

/// An admin token as stored: only its hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdminTokenRecord {
    pub id: String,
    pub sha256: String,
    pub role: AdminRole,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// Every stored admin token.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdminTokens {
    pub tokens: Vec<AdminTokenRecord>,
}

/// A cluster's shared CA set, which kubeadm derives every certificate from.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPki {
    pub cluster_uid: String,
    pub ca: StoredCa,
    pub front_proxy_ca: StoredCa,
    pub etcd_ca: StoredCa,
    pub sa_key_pem: String,
    pub sa_pub_pem: String,
}

/// The store name of a cluster's PKI secret.
pub fn cluster_pki_name(cluster: &str) -> String {
    format!("cluster-pki.{cluster}")
}

impl ClusterPki {
    /// Generates a fresh CA set for a cluster.
    pub fn generate(cluster_uid: &str) -> Result<Self, PkiError> {
        let (sa_key_pem, sa_pub_pem) = drover_common::pki::generate_service_account_key()?;
        Ok(Self {
            cluster_uid: cluster_uid.to_owned(),
            ca: CertificateAuthority::generate("kubernetes")?.into(),
            front_proxy_ca: CertificateAuthority::generate("front-proxy-ca")?.into(),
            etcd_ca: CertificateAuthority::generate("etcd-ca")?.into(),
            sa_key_pem,
            sa_pub_pem,
        })
    }
}

/// Things first start creates, loaded at every start.
pub struct CoordinatorSecrets {
    pub ca: CertificateAuthority,
    pub ticket_key: TicketKey,
    /// The admin token created at first start, shown once; `None` on later starts.
    pub first_admin_token: Option<String>,
}

/// Errors loading or creating coordinator secrets.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot create the coordinator CA: {0}")]
    Pki(#[from] PkiError),
    #[error("stored ticket key is not valid base64")]
    BadTicketKey,
}

/// Loads the coordinator's secrets, creating them on first start in one
/// transaction, so a crash half-way never leaves a CA without its admin token.
pub fn load_or_init(store: &Store) -> Result<CoordinatorSecrets, SecretsError> {
    let existing = store.get_json::<StoredCa>(Kind::Secret, COORDINATOR_CA)?;
    if let Some((ca, _)) = existing {
        let (tk, _) = store
            .get_json::<StoredTicketKey>(Kind::Secret, TICKET_KEY)?
            .ok_or(StoreError::NotFound {
                kind: "secrets",
                name: TICKET_KEY.into(),
            })?;
        let key = STANDARD
            .decode(tk.key_b64)
            .map_err(|_| SecretsError::BadTicketKey)?;
        return Ok(CoordinatorSecrets {
            ca: ca.ca(),
            ticket_key: TicketKey::from_bytes(key),
            first_admin_token: None,
        });
    }
    let ca = CertificateAuthority::generate("drover-coordinator-ca")?;
    let ticket_key = TicketKey::generate();
    let (token, record) = new_admin_token(AdminRole::Admin);
    store.txn(vec![
        Op::Create {
            kind: Kind::Secret,
            name: COORDINATOR_CA.into(),
            body: crate::store::encode(&StoredCa::from(ca.clone())),
        },
        Op::Create {
            kind: Kind::Secret,
            name: TICKET_KEY.into(),
            body: crate::store::encode(&StoredTicketKey {
                key_b64: STANDARD.encode(ticket_key.as_bytes()),
            }),
        },
        Op::Create {
            kind: Kind::Secret,
            name: ADMIN_TOKENS.into(),
            body: crate::store::encode(&AdminTokens {
                tokens: vec![record],
            }),
        },
    ])?;
    Ok(CoordinatorSecrets {
        ca,
        ticket_key,
        first_admin_token: Some(token),
    })
}

/// Creates an admin token: returns the secret (shown once) and its record.
pub fn new_admin_token(role: AdminRole) -> (String, AdminTokenRecord) {
    let mut id = [0u8; 4];
    let mut secret = [0u8; 24];
    rand::rng().fill_bytes(&mut id);
    rand::rng().fill_bytes(&mut secret);
    let id = hex::encode(id);
    let token = format!("drv_{id}_{}", hex::encode(secret));
    let record = AdminTokenRecord {
        id,
        sha256: hash_token(&token),
        role,
        created_at: drover_common::now(),
    };
    (token, record)
}

/// The stored form of an admin token.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Loads a cluster's PKI if it exists and belongs to this incarnation.
pub fn load_pki(
    store: &crate::store::Store,
    cluster: &drover_common::api::Cluster,
) -> Result<Option<ClusterPki>, crate::store::StoreError> {
    let uid = cluster.metadata.uid.as_deref().unwrap_or_default();
    Ok(store
        .get_json::<ClusterPki>(
            crate::store::Kind::Secret,
            &cluster_pki_name(&cluster.metadata.name),
        )?
        .map(|(p, _)| p)
        .filter(|p| p.cluster_uid == uid))
}
