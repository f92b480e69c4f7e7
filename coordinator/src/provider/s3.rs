//! The S3 buckets clusters' sealed etcd snapshots go to
//! (`spec.backup.destination.s3`): presigned `PUT`s for the machines that
//! upload them, and the coordinator's own checks, fetches and deletes.
//!
//! Invariant: no machine is given a credential. A machine gets a URL
//! presigned for one object's `PUT`, valid for [`UPLOAD_URL_TTL`]; the
//! coordinator signs with its own AWS credentials (the SDK's standard
//! chain: environment, profile, container or instance role), and reads a
//! snapshot back itself when a restore needs it.
//!
//! The calls are blocking ([`S3Objects`] is used where the snapshot code
//! runs: on the store's blocking threads and inside the reconciler's); each
//! runs on the runtime while the calling thread waits, so none may be made
//! from an async worker.

use std::path::Path;
use std::time::Duration;

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::Client;
use drover_common::api::S3Object;

pub use super::S3Error;

/// How long a presigned upload URL is good for: the snapshot is given up
/// after 30 minutes, and the upload starts within it.
pub const UPLOAD_URL_TTL: Duration = Duration::from_secs(45 * 60);

/// S3 clients by region and endpoint, made on first use and kept (in
/// `Providers`).
pub type S3Clients =
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<(String, Option<String>), Client>>>;

/// The client of `region` and `endpoint` in `cache`, made on first use.
async fn client_of(cache: &S3Clients, region: &str, endpoint: Option<&str>) -> Client {
    let key = (region.to_owned(), endpoint.map(str::to_owned));
    if let Some(c) = cache.lock().expect("s3 clients lock").get(&key) {
        return c.clone();
    }
    let c = connect(region, endpoint).await;
    cache
        .lock()
        .expect("s3 clients lock")
        .entry(key)
        .or_insert(c)
        .clone()
}

/// A client for `region` and `endpoint`.
async fn connect(region: &str, endpoint: Option<&str>) -> Client {
    let base = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_owned()))
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(3))
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .build(),
        )
        .load()
        .await;
    let mut config = aws_sdk_s3::config::Builder::from(&base);
    if let Some(url) = endpoint {
        // S3-compatible stores (MinIO, Ceph, moto) answer path-style
        // requests; bucket subdomains of their host need DNS they lack.
        config = config.endpoint_url(url).force_path_style(true);
    }
    Client::from_conf(config.build())
}

/// What a call's caller is told when the runtime dropped the call (it is
/// shutting down).
const DROPPED: &str = "the call was dropped before it finished: the coordinator is stopping";

/// Runs `work` on the runtime and waits for it on this (blocking) thread;
/// `None` when the runtime dropped it.
fn wait<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    tokio::runtime::Handle::current().spawn(async move {
        let _ = tx.send(work.await);
    });
    rx.recv().ok()
}

/// The S3 calls the snapshot code makes, through the coordinator's clients.
pub struct S3Objects {
    pub clients: S3Clients,
}

impl S3Objects {
    fn client(&self, object: &S3Object) -> Result<Client, S3Error> {
        let (region, endpoint) = (object.region.clone(), object.endpoint.clone());
        let clients = self.clients.clone();
        wait(async move { client_of(&clients, &region, endpoint.as_deref()).await })
            .ok_or_else(|| self.error("connect to the bucket of", object, DROPPED.into()))
    }

    fn error(&self, action: &'static str, object: &S3Object, detail: String) -> S3Error {
        S3Error {
            action,
            object: object.to_string(),
            detail,
        }
    }

    /// A URL to `PUT` `object` with, valid for [`UPLOAD_URL_TTL`].
    pub fn presign_put(&self, object: &S3Object) -> Result<String, S3Error> {
        let client = self.client(object)?;
        let (bucket, key) = (object.bucket.clone(), object.key.clone());
        let signed = wait(async move {
            let config = PresigningConfig::expires_in(UPLOAD_URL_TTL).map_err(|e| e.to_string())?;
            client
                .put_object()
                .bucket(bucket)
                .key(key)
                .presigned(config)
                .await
                .map(|p| p.uri().to_owned())
                .map_err(|e| error_text(&e))
        });
        signed
            .unwrap_or_else(|| Err(DROPPED.into()))
            .map_err(|detail| self.error("presign the upload of", object, detail))
    }

    /// The size of `object`, or `None` when it does not exist.
    pub fn size(&self, object: &S3Object) -> Result<Option<u64>, S3Error> {
        let client = self.client(object)?;
        let (bucket, key) = (object.bucket.clone(), object.key.clone());
        let head = wait(async move { client.head_object().bucket(bucket).key(key).send().await });
        match head.ok_or_else(|| self.error("look up", object, DROPPED.into()))? {
            Ok(h) => Ok(Some(h.content_length().unwrap_or_default().max(0) as u64)),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => Ok(None),
            Err(e) => Err(self.error("look up", object, error_text(&e))),
        }
    }

    /// Copies `object` into the file at `path` (written beside it and
    /// renamed, so it is whole or absent). Its size.
    pub fn fetch(&self, object: &S3Object, path: &Path) -> Result<u64, S3Error> {
        let client = self.client(object)?;
        let (bucket, key) = (object.bucket.clone(), object.key.clone());
        let part = path.with_extension("drvsnap.fetch");
        let (to, target) = (part.clone(), path.to_owned());
        let fetched = wait(async move {
            use tokio::io::AsyncWriteExt;
            let answer = client
                .get_object()
                .bucket(bucket)
                .key(key)
                .send()
                .await
                .map_err(|e| error_text(&e))?;
            if let Some(dir) = to.parent() {
                tokio::fs::create_dir_all(dir)
                    .await
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            let mut file = tokio::fs::File::create(&to)
                .await
                .map_err(|e| format!("cannot create {}: {e}", to.display()))?;
            let mut body = answer.body;
            let mut len = 0u64;
            while let Some(chunk) = body
                .try_next()
                .await
                .map_err(|e| format!("the download broke off: {e}"))?
            {
                file.write_all(&chunk)
                    .await
                    .map_err(|e| format!("cannot write {}: {e}", to.display()))?;
                len += chunk.len() as u64;
            }
            file.sync_all()
                .await
                .map_err(|e| format!("cannot sync {}: {e}", to.display()))?;
            tokio::fs::rename(&to, &target)
                .await
                .map_err(|e| format!("cannot rename {}: {e}", to.display()))?;
            Ok::<u64, String>(len)
        });
        let result = fetched.unwrap_or_else(|| Err(DROPPED.into()));
        if result.is_err() {
            let _ = std::fs::remove_file(&part);
        }
        result.map_err(|detail| self.error("download", object, detail))
    }

    /// Deletes `object` (deleting one that is gone succeeds, as in S3).
    pub fn delete(&self, object: &S3Object) -> Result<(), S3Error> {
        let client = self.client(object)?;
        let (bucket, key) = (object.bucket.clone(), object.key.clone());
        let deleted =
            wait(async move { client.delete_object().bucket(bucket).key(key).send().await });
        match deleted.ok_or_else(|| self.error("delete", object, DROPPED.into()))? {
            Ok(_) => Ok(()),
            Err(e) => Err(self.error("delete", object, error_text(&e))),
        }
    }
}

/// An SDK error with its service code and message, or its cause chain.
fn error_text<E: std::error::Error + ProvideErrorMetadata + 'static>(
    e: &aws_sdk_s3::error::SdkError<E>,
) -> String {
    if let Some(code) = e.code() {
        return format!("{code}: {}", e.message().unwrap_or_default());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
