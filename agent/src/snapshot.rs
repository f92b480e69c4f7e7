//! Saving the cluster's etcd snapshot on the coordinator's directive: read
//! it from this control plane's member (etcd's Maintenance.Snapshot through
//! the JSON gateway, as `etcdctl snapshot save` reads it over gRPC), seal it
//! chunk by chunk as it arrives ([`drover_common::snapshot`]) into a file
//! under the agent's state directory, upload the sealed file where the
//! grant says, report it, and remove the file.
//!
//! The member streams the snapshot as newline-separated JSON frames
//! (`{"result":{"header":{..},"remaining_bytes":"N","blob":"<base64>"}}`),
//! ending with the SHA-256 etcd appends to every snapshot, which `etcdctl
//! snapshot restore` checks. A stream that ends before the member said no
//! bytes remain, or that carries an error frame, fails the snapshot; the
//! partial file is removed.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use drover_common::snapshot::{Sealer, SnapshotError, SnapshotKey};
use drover_common::wire::{SnapshotGrant, SnapshotSaved};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::api::{error_chain, ApiError, CoordinatorClient};

/// How long reading a snapshot from etcd may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How long uploading the sealed snapshot may take.
pub const UPLOAD_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The longest frame the member may send (its chunks are 32 KiB, base64).
const MAX_FRAME: usize = 4 * 1024 * 1024;

/// Why a snapshot was not saved.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error("etcd snapshot via {endpoint}: {detail}")]
    Etcd { endpoint: String, detail: String },
    #[error("snapshot {snapshot}: {source}")]
    Seal {
        snapshot: String,
        source: SnapshotError,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("snapshot {snapshot}: {source}")]
    Coordinator { snapshot: String, source: ApiError },
    #[error(transparent)]
    Client(#[from] crate::etcd::EtcdError),
}

#[derive(Deserialize)]
struct Frame {
    #[serde(default)]
    result: Option<Chunk>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    header: Option<Header>,
    /// An int64 as a decimal string; absent when 0.
    #[serde(default, alias = "remainingBytes")]
    remaining_bytes: Option<String>,
    #[serde(default)]
    blob: String,
}

#[derive(Deserialize)]
struct Header {
    /// An int64 as a decimal string.
    #[serde(default)]
    revision: Option<String>,
}

/// A sealed snapshot on this machine's disk, ready to upload.
#[derive(Debug)]
pub struct SealedFile {
    pub path: PathBuf,
    pub saved: SnapshotSaved,
}

/// Streams the snapshot of the member at `endpoint` through `client`,
/// sealed for `grant`, into `dir/<snapshot>.drvsnap`.
pub async fn read_sealed(
    client: &reqwest::Client,
    endpoint: &str,
    grant: &SnapshotGrant,
    dir: &Path,
) -> Result<SealedFile, SaveError> {
    let failed = |detail: String| SaveError::Etcd {
        endpoint: endpoint.to_owned(),
        detail,
    };
    let seal_error = |source| SaveError::Seal {
        snapshot: grant.snapshot.clone(),
        source,
    };
    let key = SnapshotKey::from_base64(&grant.key).map_err(seal_error)?;
    // etcd 3.4 sends no header with the snapshot's frames: the revision is
    // the one the member reports just before it starts (the snapshot holds
    // at least that one).
    let (etcd_version, revision_before) = member_status(client, endpoint).await.unwrap_or_default();
    let mut response = client
        .post(format!("{endpoint}/v3/maintenance/snapshot"))
        .json(&serde_json::json!({}))
        .timeout(READ_TIMEOUT)
        .send()
        .await
        .map_err(|e| failed(error_chain(&e)))?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        return Err(failed(format!("{status}: {text}")));
    }

    std::fs::create_dir_all(dir).map_err(|source| SaveError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let path = dir.join(format!("{}.drvsnap", grant.snapshot));
    let part = dir.join(format!("{}.drvsnap.part", grant.snapshot));
    let mut out = SealedWriter::create(&part)?;
    let (mut sealer, head) = Sealer::new(&key, &grant.cluster, &grant.cluster_uid, &grant.snapshot);
    out.write(&head)?;

    let mut pending: Vec<u8> = Vec::new();
    let mut sealed = Vec::new();
    let mut revision = None;
    let mut remaining = None;
    let mut frame =
        |line: &[u8], sealer: &mut Sealer, sealed: &mut Vec<u8>| -> Result<(), SaveError> {
            if line.iter().all(u8::is_ascii_whitespace) {
                return Ok(());
            }
            let frame: Frame = serde_json::from_slice(line)
                .map_err(|e| failed(format!("an unreadable frame: {e}")))?;
            if let Some(error) = frame.error {
                return Err(failed(format!("the member failed the snapshot: {error}")));
            }
            let Some(chunk) = frame.result else {
                return Err(failed("a frame with neither result nor error".into()));
            };
            if revision.is_none() {
                revision = chunk.header.and_then(|h| h.revision?.parse::<i64>().ok());
            }
            remaining = Some(
                chunk
                    .remaining_bytes
                    .as_deref()
                    .unwrap_or("0")
                    .parse::<u64>()
                    .map_err(|e| failed(format!("remaining_bytes: {e}")))?,
            );
            let blob = STANDARD
                .decode(chunk.blob.as_bytes())
                .map_err(|e| failed(format!("a chunk that is not base64: {e}")))?;
            sealer.update(&blob, sealed).map_err(seal_error)
        };

    let result: Result<(), SaveError> = async {
        while let Some(bytes) = response
            .chunk()
            .await
            .map_err(|e| failed(format!("the stream broke: {}", error_chain(&e))))?
        {
            pending.extend_from_slice(&bytes);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                frame(&line, &mut sealer, &mut sealed)?;
                out.write(&sealed)?;
                sealed.clear();
            }
            if pending.len() > MAX_FRAME {
                return Err(failed(format!("a frame longer than {MAX_FRAME} bytes")));
            }
        }
        frame(&pending, &mut sealer, &mut sealed)?;
        out.write(&sealed)?;
        sealed.clear();
        Ok(())
    }
    .await;
    if let Err(e) = result {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    if remaining != Some(0) {
        let _ = std::fs::remove_file(&part);
        return Err(failed(match remaining {
            None => "the member sent no snapshot".into(),
            Some(n) => format!("the stream ended with {n} bytes still to come"),
        }));
    }
    let digest = sealer.finish(&mut sealed).map_err(seal_error)?;
    out.write(&sealed)?;
    let (sealed_size, sealed_sha256) = out.finish(&path)?;
    Ok(SealedFile {
        path,
        saved: SnapshotSaved {
            size: digest.size,
            sha256: digest.sha256,
            sealed_size,
            sealed_sha256,
            revision: revision.unwrap_or(revision_before),
            etcd_version,
        },
    })
}

/// The member's version (`etcdserver`) and revision, from its maintenance
/// status.
async fn member_status(client: &reqwest::Client, endpoint: &str) -> Option<(String, i64)> {
    #[derive(Deserialize)]
    struct Status {
        #[serde(default)]
        version: String,
        #[serde(default)]
        header: Option<Header>,
    }
    let answer = client
        .post(format!("{endpoint}/v3/maintenance/status"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .ok()?;
    let status: Status = answer.json().await.ok()?;
    let revision = status
        .header
        .and_then(|h| h.revision?.parse().ok())
        .unwrap_or_default();
    Some((status.version, revision))
}

/// The sealed file being written: private from its first byte, hashed as
/// written, synced and renamed into place when done.
struct SealedWriter {
    file: std::fs::File,
    part: PathBuf,
    hash: Sha256,
    len: u64,
}

impl SealedWriter {
    fn create(part: &Path) -> Result<Self, SaveError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(part)
            .map_err(|source| SaveError::Write {
                path: part.to_owned(),
                source,
            })?;
        Ok(Self {
            file,
            part: part.to_owned(),
            hash: Sha256::new(),
            len: 0,
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), SaveError> {
        self.hash.update(bytes);
        self.len += bytes.len() as u64;
        self.file
            .write_all(bytes)
            .map_err(|source| SaveError::Write {
                path: self.part.clone(),
                source,
            })
    }

    fn finish(self, path: &Path) -> Result<(u64, String), SaveError> {
        let write_error = |source| SaveError::Write {
            path: self.part.clone(),
            source,
        };
        self.file.sync_all().map_err(write_error)?;
        std::fs::rename(&self.part, path).map_err(write_error)?;
        Ok((self.len, hex::encode(self.hash.finalize())))
    }
}

/// Carries out directive `SaveEtcdSnapshot { snapshot }`: the grant, the
/// sealed snapshot, its upload and report; the sealed file is removed
/// whatever happens. The success message says what was saved.
pub async fn save_and_upload(
    api: &CoordinatorClient,
    etcd: &mut crate::etcd::Etcd,
    endpoint: &str,
    snapshot: &str,
    dir: &Path,
) -> Result<String, SaveError> {
    let at_coordinator = |source| SaveError::Coordinator {
        snapshot: snapshot.to_owned(),
        source,
    };
    let grant = api.snapshot_grant(snapshot).await.map_err(at_coordinator)?;
    let client = etcd.snapshot_client()?;
    let file = read_sealed(&client, endpoint, &grant, dir).await?;
    let uploaded = api
        .upload_snapshot(
            &grant.upload,
            &file.path,
            file.saved.sealed_size,
            &file.saved.sealed_sha256,
            UPLOAD_TIMEOUT,
        )
        .await;
    let _ = std::fs::remove_file(&file.path);
    uploaded.map_err(at_coordinator)?;
    api.snapshot_saved(snapshot, &file.saved)
        .await
        .map_err(at_coordinator)?;
    Ok(format!(
        "etcd snapshot {snapshot} saved: revision {}, {} bytes (sealed {}), sha256 {}",
        file.saved.revision, file.saved.size, file.saved.sealed_size, file.saved.sha256
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real etcd (the `etcd` binary on PATH, as scripts/setup-host
    /// installs it) holding some keys: the snapshot read through its JSON
    /// gateway opens with the cluster's key, and `etcdctl snapshot status`
    /// (which checks etcd's own hash) reads the revision the agent
    /// reported.
    #[tokio::test]
    async fn a_real_etcds_snapshot_is_sealed_and_opens_as_etcdctl_reads_it() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let Some(etcd) = crate::test_etcd::TestEtcd::start() else {
            return;
        };
        let client = reqwest::Client::builder().build().unwrap();
        for i in 0..200 {
            let put = serde_json::json!({
                "key": STANDARD.encode(format!("/registry/configmaps/default/cm-{i}")),
                "value": STANDARD.encode(vec![b'x'; 1000]),
            });
            let r = client
                .post(format!("{}/v3/kv/put", etcd.url))
                .json(&put)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{:?}", r.text().await);
        }
        let key = SnapshotKey::generate();
        let grant = SnapshotGrant {
            snapshot: "prod-1".into(),
            cluster: "prod".into(),
            cluster_uid: "uid-prod".into(),
            key: key.to_base64(),
            upload: drover_common::wire::SnapshotUpload::Coordinator {
                path: "/unused".into(),
            },
        };
        let dir = tempfile::tempdir().unwrap();
        let file = read_sealed(&client, &etcd.url, &grant, dir.path())
            .await
            .unwrap();
        assert!(file.saved.revision >= 201, "{:?}", file.saved);
        assert!(file.saved.size > 200 * 1000, "{:?}", file.saved);
        assert!(
            file.saved.etcd_version.starts_with("3."),
            "{:?}",
            file.saved
        );
        assert!(!dir.path().join("prod-1.drvsnap.part").exists());

        let sealed = std::fs::read(&file.path).unwrap();
        assert_eq!(sealed.len() as u64, file.saved.sealed_size);
        assert_eq!(
            hex::encode(Sha256::digest(&sealed)),
            file.saved.sealed_sha256
        );
        let (header, plain, digest) = drover_common::snapshot::open_all(&key, &sealed).unwrap();
        assert_eq!(header.cluster_uid, "uid-prod");
        assert_eq!(digest.sha256, file.saved.sha256);
        assert_eq!(digest.size, file.saved.size);
        // Nothing of the keys' values shows through the seal.
        assert!(!sealed.windows(100).any(|w| w == [b'x'; 100]));

        let db = dir.path().join("snapshot.db");
        std::fs::write(&db, &plain).unwrap();
        let status = std::process::Command::new("etcdctl")
            .args(["snapshot", "status", "-w", "json"])
            .arg(&db)
            .env("ETCDCTL_API", "3")
            .output()
            .expect("etcdctl runs (scripts/setup-host installs etcd-client)");
        assert!(
            status.status.success(),
            "{}",
            String::from_utf8_lossy(&status.stderr)
        );
        let read: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(
            read["revision"].as_i64(),
            Some(file.saved.revision),
            "{read}"
        );
        assert!(read["totalKey"].as_i64().unwrap() >= 200, "{read}");

        // A cut-short snapshot does not open.
        let cut = &sealed[..sealed.len() - 20];
        assert!(drover_common::snapshot::open_all(&key, cut).is_err());
    }

    #[tokio::test]
    async fn a_member_that_fails_the_snapshot_leaves_no_file() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let pki = crate::fake_https::Pki::new();
        let handler: crate::fake_https::Handler = std::sync::Arc::new(|call, _| {
            match call.path.as_str() {
                "/v3/maintenance/status" => (200, r#"{"version":"3.4.23"}"#.into()),
                // Half a snapshot, then an error frame, as the gateway
                // writes a stream the server ended with an error.
                "/v3/maintenance/snapshot" => (
                    200,
                    format!(
                        "{}\n{}\n",
                        serde_json::json!({"result": {"header": {"revision": "7"}, "remaining_bytes": "100", "blob": STANDARD.encode([1u8; 50])}}),
                        serde_json::json!({"error": {"grpc_code": 14, "message": "etcdserver: snapshot stream closed"}}),
                    ),
                ),
                _ => (404, "{}".into()),
            }
        });
        let addr = pki.serve(handler).await;
        let root = tempfile::tempdir().unwrap();
        pki.write_etcd_client(root.path());
        let mut etcd = crate::etcd::Etcd::new(root.path());
        let client = etcd.snapshot_client().unwrap();
        let grant = SnapshotGrant {
            snapshot: "prod-2".into(),
            cluster: "prod".into(),
            cluster_uid: "uid-prod".into(),
            key: SnapshotKey::generate().to_base64(),
            upload: drover_common::wire::SnapshotUpload::Coordinator {
                path: "/unused".into(),
            },
        };
        let dir = tempfile::tempdir().unwrap();
        let err = read_sealed(&client, &format!("https://{addr}"), &grant, dir.path())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("snapshot stream closed"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

        let bad_key = SnapshotGrant {
            key: "c2hvcnQ=".into(),
            ..grant
        };
        let err = read_sealed(&client, &format!("https://{addr}"), &bad_key, dir.path())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("32 bytes"), "{err}");
    }
}
