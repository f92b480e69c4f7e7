//! The etcd backend, so several coordinator replicas share one store.
//!
//! Layout: object `(kind, name)` is the key `PREFIX/KIND/NAME`
//! (`/drover/machines/web-0`), and its value is exactly the bytes SQLite
//! would store: sealed records for sealed kinds, since sealing happens above
//! the backend. An object's revision is its key's `mod_revision`; the global
//! revision is etcd's store revision, which every transaction that writes
//! advances by one, as SQLite's counter does (it is shared with whatever else
//! writes to the same etcd, so it may skip numbers; it never goes back).
//!
//! Transactions are one etcd `Txn`. The first operation on each key becomes
//! a compare on the key's state before the transaction (`Create`:
//! `create_revision == 0`; `Update`/`Delete` at R: `mod_revision == R`;
//! unconditional `Update`/`Delete`: `create_revision > 0`), and each key's
//! final state becomes one put or delete (etcd refuses two writes to one key
//! in a `Txn`, SQLite applies them in order; folding keeps SQLite's result).
//! When a compare fails, the `Txn`'s else-branch reads every key at the same
//! revision and the operations are replayed in order against that snapshot,
//! so the error is the one SQLite returns: the first failing operation's,
//! with the same `expected`/`found` revisions.
//!
//! Members: one etcd-client `Client` per endpoint, and requests fail over
//! between them here (see `Members::request`): etcd-client's own balancing
//! fails a request it routes to a dead member instead of trying another
//! (etcd-client issue #39), so with it one dead member of three would be an
//! outage. Reads move on to the next member after any transient failure;
//! writes only when the member surely did not take them (no connection, or
//! it has no leader). A write a member took and never answered, typically
//! during a leader election, fails as "may or may not have been applied":
//! callers' read-modify-write loops re-read and find out.
//!
//! Watch: one etcd watch on the prefix, from the revision read at open, so
//! watchers see every replica's writes. After a failure it resumes on the
//! next member from the last revision seen (backoff 0.2 s doubling to 5 s);
//! if etcd compacted the revisions missed meanwhile, those changes are
//! lost, which watchers tolerate: a change only tells them to look again,
//! and they re-list on a period anyway. Changes arrive a moment after `txn`
//! returns, not before it returns as with SQLite.
//!
//! Where it differs from SQLite, none of which callers rely on: revisions
//! may skip numbers; a transaction with no operations (or only ones that
//! cancel out, like a create and a delete of one object) writes nothing and
//! returns the current revision instead of a new one, and announces no
//! change; an operation expecting a revision on an object written earlier
//! in the same transaction always conflicts; a transaction may touch at most
//! 128 objects and carry 1.5 MiB (etcd's `--max-txn-ops` and
//! `--max-request-bytes` defaults); and the watch reports other replicas'
//! writes too, asynchronously.
//!
//! Sync over async: the `Store` API is synchronous (as SQLite is), while
//! etcd-client is async. A dedicated thread (`drover-etcd`) runs a
//! current-thread tokio runtime that owns the clients' connections and the
//! watch task; each call spawns its future there through the runtime's
//! handle and blocks the calling thread on a std channel until the reply
//! comes. Nothing calls `block_on` on the caller's runtime (that panics
//! inside a runtime, and would deadlock a current-thread one), and the
//! connections do not depend on which runtime a caller happens to run on.
//! The cost: each call blocks its caller's thread, usually a tokio worker
//! as SQLite's fsyncs do, for one round trip to the etcd leader (writes also
//! wait for a quorum's fsync: milliseconds on a LAN) plus two thread
//! hand-offs (tens of µs), so a slow etcd stalls that worker's other tasks;
//! and one thread drives all etcd traffic, which is I/O, not CPU. Every
//! call has a deadline (`EtcdOptions::timeout`, 10 s by default, over all
//! the members it tries); errors are `StoreError::Backend` naming the
//! endpoints and the operation.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    KvClient, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::broadcast;

use super::backend::{
    Backend, Change, Fence, History, Kind, Op, Record, Span, StoreError, HISTORY_REVISIONS,
};
use super::cache::{self, ReadCache};

/// Objects read per range request when listing a kind.
const PAGE: i64 = 256;

/// How to reach an etcd cluster.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Client endpoints as `host:port`; `http://` or, with `tls`, `https://`.
    pub endpoints: Vec<String>,
    /// Objects live at `PREFIX/KIND/NAME`, e.g. prefix `/drover`.
    pub prefix: String,
    pub tls: Option<EtcdTls>,
    /// Deadline of every etcd call (and of connecting).
    pub timeout: Duration,
}

impl EtcdOptions {
    /// Plain-text endpoints, a 10 s deadline per call.
    pub fn new(endpoints: Vec<String>, prefix: impl Into<String>) -> Self {
        Self {
            endpoints,
            prefix: prefix.into(),
            tls: None,
            timeout: Duration::from_secs(10),
        }
    }

    fn urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }
}

/// TLS to etcd: the CA that signed the servers' certificates and, for
/// client-certificate authentication, a certificate and its key.
#[derive(Clone)]
pub struct EtcdTls {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("client_certificate", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

/// Which TLS file a problem is with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFile {
    Ca,
    Cert,
    Key,
}

/// A TLS file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {why}", path.display())]
pub struct EtcdTlsError {
    pub file: TlsFile,
    pub path: PathBuf,
    pub why: String,
}

impl EtcdTls {
    /// Reads and checks the PEM files: `ca` must hold certificates, `cert`
    /// a certificate chain and `key` its private key.
    pub fn from_files(
        ca: &Path,
        cert_and_key: Option<(&Path, &Path)>,
    ) -> Result<Self, EtcdTlsError> {
        let err = |file, path: &Path, why: String| EtcdTlsError {
            file,
            path: path.to_owned(),
            why,
        };
        let read = |file, path: &Path| {
            std::fs::read(path).map_err(|e| err(file, path, format!("cannot read it: {e}")))
        };
        let certs = |file, path: &Path, pem: &[u8]| {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| err(file, path, format!("is not PEM: {e}")))?;
            if certs.is_empty() {
                return Err(err(file, path, "holds no PEM certificate".into()));
            }
            Ok(certs)
        };
        let ca_pem = read(TlsFile::Ca, ca)?;
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(TlsFile::Ca, ca, &ca_pem)? {
            roots.add(c).map_err(|e| {
                err(
                    TlsFile::Ca,
                    ca,
                    format!("holds an unusable certificate: {e}"),
                )
            })?;
        }
        let identity = match cert_and_key {
            None => None,
            Some((cert, key)) => {
                let cert_pem = read(TlsFile::Cert, cert)?;
                let chain = certs(TlsFile::Cert, cert, &cert_pem)?;
                let key_pem = read(TlsFile::Key, key)?;
                let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                    err(TlsFile::Key, key, format!("holds no PEM private key: {e}"))
                })?;
                rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                    .with_safe_default_protocol_versions()
                    .expect("the provider supports TLS 1.2 and 1.3")
                    .with_root_certificates(roots)
                    .with_client_auth_cert(chain, private)
                    .map_err(|e| {
                        err(
                            TlsFile::Key,
                            key,
                            format!("is not usable with the certificate {}: {e}", cert.display()),
                        )
                    })?;
                Some((cert_pem, key_pem))
            }
        };
        Ok(Self { ca_pem, identity })
    }

    fn options(&self) -> TlsOptions {
        let tls = TlsOptions::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        match &self.identity {
            Some((cert, key)) => tls.identity(Identity::from_pem(cert, key)),
            None => tls,
        }
    }
}

/// One etcd member: its URL and a client that talks only to it.
struct Member {
    url: String,
    client: Client,
    kv: KvClient,
}

/// The members, and which one answered last.
///
/// etcd-client can balance over several endpoints, but a request it routes
/// to a member that is down fails instead of going to another one
/// (etcd-client issue #39), which would make one dead member of three an
/// outage. So each member gets its own client, and requests fail over here,
/// as etcd's Go client does: stay on the member that answers, move on to
/// the next when it does not.
struct Members {
    list: Vec<Member>,
    preferred: AtomicUsize,
    /// Every URL, for messages.
    endpoints: String,
    timeout: Duration,
}

impl Members {
    fn error(&self, what: &str, why: impl std::fmt::Display) -> StoreError {
        StoreError::Backend(format!("etcd {}: {what}: {why}", self.endpoints))
    }

    /// Runs `request` on one member after another, from the one that
    /// answered last, until one answers or the deadline (`timeout`) passes;
    /// after a round in which none answered, waits a little (a leader
    /// election takes about a second). Reads (`idempotent`) move on after
    /// any failure that may be the member's, and give each member at most
    /// half the deadline when there are others; writes move on only when
    /// the member surely did not take the request (no connection, or it has
    /// no leader): a write that reached etcd may still be applied, and
    /// sending it again would make its compare fail on its own result.
    async fn request<T, F, Fut>(
        &self,
        what: &str,
        idempotent: bool,
        request: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.request_with(what, idempotent, |m| m.kv.clone(), request)
            .await
    }

    /// [`Members::request`] with the client `pick` takes from the member
    /// (its KV client, or the whole client for leases).
    async fn request_with<C, T, F, Fut>(
        &self,
        what: &str,
        idempotent: bool,
        pick: impl Fn(&Member) -> C,
        mut request: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut(C) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.list.len();
        let deadline = tokio::time::Instant::now() + self.timeout;
        let first = self.preferred.load(Ordering::Relaxed);
        let mut failures = std::collections::VecDeque::new();
        for attempt in 1.. {
            let index = (first + attempt - 1) % n;
            let member = &self.list[index];
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let cap = if idempotent && n > 1 {
                left.min(self.timeout / 2)
            } else {
                left
            };
            match tokio::time::timeout(cap, request(pick(member))).await {
                Ok(Ok(v)) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return Ok(v);
                }
                Ok(Err(e)) => {
                    let why = describe(&e);
                    if !(not_taken(&e) || (idempotent && transient(&e))) {
                        return Err(StoreError::Backend(format!(
                            "etcd {}: {what}: {why}",
                            member.url
                        )));
                    }
                    failures.push_back(format!("{}: {why}", member.url));
                }
                Err(_) if idempotent => {
                    failures.push_back(format!("{}: no answer within {cap:?}", member.url))
                }
                Err(_) => {
                    return Err(StoreError::Backend(format!(
                        "etcd {}: {what}: no answer within {cap:?}; the write may or may not have been applied",
                        member.url
                    )))
                }
            }
            if failures.len() > n {
                failures.pop_front();
            }
            if attempt % n == 0 {
                tokio::time::sleep_until(
                    deadline.min(tokio::time::Instant::now() + Duration::from_millis(200)),
                )
                .await;
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        Err(self.error(
            what,
            format!(
                "no member answered within {:?} ({})",
                self.timeout,
                Vec::from(failures).join("; ")
            ),
        ))
    }
}

/// A gRPC error with its causes ("Unavailable: tcp connect error:
/// Connection refused (os error 111)").
fn describe(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            let mut text = format!("{:?}: {}", s.code(), s.message());
            let mut source = std::error::Error::source(s);
            while let Some(cause) = source {
                let cause_text = cause.to_string();
                if !text.contains(&cause_text) {
                    text = format!("{text}: {cause_text}");
                }
                source = cause.source();
            }
            text
        }
        e => e.to_string(),
    }
}

/// The member surely did not take the request: it was never sent, or the
/// member refused it for want of a leader before doing anything.
fn not_taken(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(s) => {
            s.code() as i32 == grpc::UNAVAILABLE
                && (s.message().contains("connect") || s.message().contains("no leader"))
        }
        _ => false,
    }
}

/// gRPC status codes (standard numbers; etcd-client does not re-export
/// tonic's `Code`).
mod grpc {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const ABORTED: i32 = 10;
    pub const INTERNAL: i32 = 13;
    pub const UNAVAILABLE: i32 = 14;
}

/// A failure another member may not have.
fn transient(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => matches!(
            s.code() as i32,
            grpc::UNAVAILABLE
                | grpc::DEADLINE_EXCEEDED
                | grpc::UNKNOWN
                | grpc::INTERNAL
                | grpc::CANCELLED
                | grpc::ABORTED
        ),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

pub(super) struct Etcd {
    members: Arc<Members>,
    runtime: tokio::runtime::Handle,
    /// Dropped with the backend: stops the runtime thread, the watch with it.
    _stop: tokio::sync::oneshot::Sender<()>,
    /// `PREFIX/`.
    prefix: String,
}

/// Runs `fut` on the etcd runtime and waits for its result on this thread.
fn run<T: Send + 'static>(
    runtime: &tokio::runtime::Handle,
    fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().unwrap_or_else(|_| {
        Err(StoreError::Backend(
            "etcd: the client thread has stopped".into(),
        ))
    })
}

impl Etcd {
    pub(super) fn open(
        options: &EtcdOptions,
        changes: broadcast::Sender<Change>,
        cache: Arc<ReadCache>,
    ) -> Result<Self, StoreError> {
        let urls = options.urls();
        let endpoints = urls.join(",");
        let fail = |what: &str, why: &dyn std::fmt::Display| {
            StoreError::Backend(format!("etcd {endpoints}: {what}: {why}"))
        };
        if urls.is_empty() {
            return Err(fail("connect", &"no endpoint given"));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| fail("start the client runtime", &e))?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("drover-etcd".into())
            .spawn(move || {
                // Until the backend is dropped; dropping the runtime then
                // cancels the watch and any call in flight (whose caller
                // gets an error).
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(|e| fail("start the client thread", &e))?;

        let mut connect = ConnectOptions::new()
            // A small part of the deadline, leaving time to try another.
            .with_connect_timeout(options.timeout / 4)
            // Finds dead connections (and so a silently broken watch).
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member cut off from its cluster's leader refuses at once
            // (and another is asked) instead of hanging.
            .with_require_leader(true);
        if let Some(tls) = &options.tls {
            connect = connect.with_tls(tls.options());
        }
        // Connecting is lazy: this only sets the clients up.
        let list = run(&handle, {
            let endpoints = endpoints.clone();
            async move {
                let mut list = vec![];
                for url in urls {
                    let client = Client::connect([url.as_str()], Some(connect.clone()))
                        .await
                        .map_err(|e| {
                            StoreError::Backend(format!(
                                "etcd {endpoints}: connect to {url}: {}",
                                describe(&e)
                            ))
                        })?;
                    let kv = client.kv_client().max_decoding_message_size(64 << 20);
                    list.push(Member { url, client, kv });
                }
                Ok(list)
            }
        })?;
        let members = Arc::new(Members {
            list,
            preferred: AtomicUsize::new(0),
            endpoints,
            timeout: options.timeout,
        });
        let prefix = format!("{}/", options.prefix.trim_end_matches('/'));

        // The store's revision now: the watch starts after it, and this
        // first request proves etcd answers before the coordinator goes on.
        let revision = run(&handle, {
            let (members, key) = (members.clone(), prefix.clone());
            async move {
                let resp = members
                    .request("read the store revision", true, |mut kv| {
                        let opts = GetOptions::new().with_prefix().with_count_only();
                        let key = key.clone();
                        async move { kv.get(key, Some(opts)).await }
                    })
                    .await?;
                Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
            }
        })?;
        handle.spawn(watch(
            members.clone(),
            prefix.clone(),
            revision + 1,
            changes,
            cache,
        ));
        Ok(Self {
            members,
            runtime: handle,
            _stop: stop,
            prefix,
        })
    }

    fn call<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        run(&self.runtime, fut)
    }

    fn key(&self, kind: Kind, name: &str) -> String {
        format!("{}{}/{name}", self.prefix, kind.as_str())
    }
}

impl Etcd {
    /// The records of `kind` after `after`, at most `limit`, read at
    /// revision `at` (0: the current one), and the revision read at.
    fn range(&self, kind: Kind, span: Span<'_>, at: i64) -> Result<(Vec<Record>, i64), StoreError> {
        let Span { after, limit } = span;
        let start = format!("{}{}/", self.prefix, kind.as_str());
        let members = self.members.clone();
        // The first key after `after`'s: `after` followed by a zero byte.
        let mut from = format!("{start}{after}").into_bytes();
        if !after.is_empty() {
            from.push(0);
        }
        self.call(async move {
            let what = format!("list {start}");
            let end = prefix_end(start.as_bytes());
            let mut out = vec![];
            // Every page at the first page's revision: one consistent
            // snapshot, as SQLite's single SELECT is.
            let mut at = at;
            loop {
                let wanted = limit.map_or(PAGE, |n| (n - out.len()).min(PAGE as usize) as i64);
                if wanted == 0 {
                    return Ok((out, at));
                }
                let mut opts = GetOptions::new().with_range(end.clone()).with_limit(wanted);
                if at != 0 {
                    opts = opts.with_revision(at);
                }
                let resp = members
                    .request(&what, true, |mut kv| {
                        let (from, opts) = (from.clone(), opts.clone());
                        async move { kv.get(from, Some(opts)).await }
                    })
                    .await?;
                if at == 0 {
                    at = resp.header().map(|h| h.revision()).unwrap_or(0);
                }
                for kv in resp.kvs() {
                    let name = std::str::from_utf8(&kv.key()[start.len()..]).map_err(|_| {
                        StoreError::Corrupt {
                            kind: kind.as_str(),
                            name: String::from_utf8_lossy(kv.key()).into_owned(),
                            detail: "the key is not UTF-8".into(),
                        }
                    })?;
                    out.push(Record {
                        name: name.to_owned(),
                        revision: kv.mod_revision() as u64,
                        body: kv.value().to_vec(),
                    });
                }
                match resp.kvs().last() {
                    Some(last) if resp.more() => {
                        from = last.key().to_vec();
                        from.push(0);
                    }
                    _ => return Ok((out, at)),
                }
            }
        })
    }
}

impl Backend for Etcd {
    fn revision(&self) -> Result<u64, StoreError> {
        let (members, key) = (self.members.clone(), self.prefix.clone());
        self.call(async move {
            let resp = members
                .request("read the revision", true, |mut kv| {
                    let key = key.clone();
                    async move { kv.get(key, Some(GetOptions::new().with_count_only())).await }
                })
                .await?;
            Ok(resp.header().map_or(0, |h| h.revision()) as u64)
        })
    }

    fn history(&self, limit: usize) -> Result<History, StoreError> {
        let head = self.revision()?;
        let (members, prefix) = (self.members.clone(), self.prefix.clone());
        self.call(async move {
            let mut start = head.saturating_sub(HISTORY_REVISIONS).max(1) as i64;
            // A second try starts after a compaction the first ran into.
            for _ in 0..2 {
                match read_history(&members, &prefix, start).await? {
                    Ok((changes, head)) => {
                        let mut history = History {
                            floor: (start - 1) as u64,
                            head,
                            changes,
                        };
                        history.truncate(limit);
                        return Ok(history);
                    }
                    Err(compacted) => start = compacted,
                }
            }
            // Compacted twice over: no history, only the present.
            Ok(History {
                floor: head,
                head,
                changes: vec![],
            })
        })
    }

    fn describe(&self) -> String {
        format!(
            "etcd {} (keys under {})",
            self.members.endpoints, self.prefix
        )
    }

    fn get(&self, kind: Kind, name: &str) -> Result<Option<Record>, StoreError> {
        let key = self.key(kind, name);
        let (members, name) = (self.members.clone(), name.to_owned());
        self.call(async move {
            let what = format!("get {key}");
            let resp = members
                .request(&what, true, |mut kv| {
                    let key = key.clone();
                    async move { kv.get(key, None).await }
                })
                .await?;
            Ok(resp.kvs().first().map(|kv| Record {
                name,
                revision: kv.mod_revision() as u64,
                body: kv.value().to_vec(),
            }))
        })
    }

    fn list(&self, kind: Kind, span: Span<'_>) -> Result<Vec<Record>, StoreError> {
        Ok(self.range(kind, span, 0)?.0)
    }

    /// Every kind read at one revision, written into a SQLite database a
    /// kind at a time (never the whole store in memory at once).
    fn backup(&self, dest: &std::path::Path) -> Result<(), StoreError> {
        super::sqlite::write_snapshot(dest, |write| {
            let mut at = 0;
            for kind in Kind::ALL {
                let (records, read_at) = self.range(kind, Span::ALL, at)?;
                at = read_at;
                write(kind, records)?;
            }
            Ok(at as u64)
        })
    }

    fn txn(&self, ops: &[Op], fence: Option<Fence>) -> Result<u64, StoreError> {
        let mut plan = Plan::new(ops, |kind, name| self.key(kind, name));
        let what = format!("transaction on {}", plan.keys.join(", "));
        let leader_key = leader_key(&self.prefix);
        let mut reads: Vec<TxnOp> = plan
            .keys
            .iter()
            .map(|k| TxnOp::get(k.as_str(), None))
            .collect();
        if let Some(Fence(term)) = fence {
            // The leader key is created once per term and never rewritten:
            // its create revision names the term.
            plan.compares.push(Compare::create_revision(
                leader_key.as_str(),
                CompareOp::Equal,
                i64::try_from(term).unwrap_or(-1),
            ));
            reads.push(TxnOp::get(leader_key.as_str(), None));
        }
        let doomed = plan.doomed;
        let txn = if doomed {
            // Fails whatever etcd holds; read the keys to say how.
            Txn::new().and_then(reads)
        } else {
            Txn::new()
                .when(plan.compares)
                .and_then(plan.writes)
                .or_else(reads)
        };
        let members = self.members.clone();
        let fence_key = leader_key.clone();
        let (committed, revision, snapshot, term_now) = self.call(async move {
            let resp = members
                .request(&what, doomed, |mut kv| {
                    let txn = txn.clone();
                    async move { kv.txn(txn).await }
                })
                .await?;
            let revision = resp.header().map(|h| h.revision()).unwrap_or(0) as u64;
            let mut snapshot = HashMap::new();
            let mut term_now = None;
            if !resp.succeeded() || doomed {
                for r in resp.op_responses() {
                    if let TxnOpResponse::Get(g) = r {
                        for kv in g.kvs() {
                            let key = String::from_utf8_lossy(kv.key()).into_owned();
                            if key == fence_key {
                                term_now = Some(kv.create_revision() as u64);
                            } else {
                                snapshot.insert(key, kv.mod_revision() as u64);
                            }
                        }
                    }
                }
            }
            Ok((resp.succeeded() && !doomed, revision, snapshot, term_now))
        })?;
        if committed {
            return Ok(revision);
        }
        if let Some(Fence(term)) = fence {
            if term_now != Some(term) {
                return Err(StoreError::Fenced {
                    term,
                    detail: match term_now {
                        Some(t) => format!("term {t} began since"),
                        None => "no coordinator holds the lease now".into(),
                    },
                });
            }
        }
        match replay(
            ops,
            |kind, name| self.key(kind, name),
            &snapshot,
            revision + 1,
        ) {
            Err(e) => Err(e),
            Ok(()) => Err(self.members.error(
                "transaction",
                "a precondition failed, but none fails on the state read with it",
            )),
        }
    }
}

/// The key whose holder leads: it exists while the leader's lease lives.
fn leader_key(prefix: &str) -> String {
    format!("{prefix}_leader")
}

/// Leader election and the replica registry on the store's etcd, sharing
/// its members (and their fail-over) and its client thread. A replica is
/// registered twice: under `PREFIX/_coordinators/ID`, bound to its
/// leadership lease, while it lives (what `drover get coordinators` lists),
/// and under `PREFIX/_coordinators_known/ID`, bound to a lease of its own
/// of `REPLICA_RETENTION` (24 h) renewed while it lives, so a replica that
/// is down stays in the machines' coordinator lists that long: it may lead
/// again.
#[derive(Clone)]
pub struct Election {
    members: Arc<Members>,
    runtime: tokio::runtime::Handle,
    prefix: String,
}

impl Etcd {
    /// The election on this store's etcd.
    pub(super) fn election(&self) -> Election {
        Election {
            members: self.members.clone(),
            runtime: self.runtime.clone(),
            prefix: self.prefix.clone(),
        }
    }
}

impl Election {
    /// Runs `fut` on the etcd thread and awaits it without blocking the caller.
    async fn on_etcd<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.runtime.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Backend(
                "etcd: the client thread has stopped".into(),
            ))
        })
    }

    fn replica_key(&self, id: &str) -> String {
        format!("{}_coordinators/{id}", self.prefix)
    }

    fn known_key(&self, id: &str) -> String {
        format!("{}_coordinators_known/{id}", self.prefix)
    }

    /// Grants a lease of `ttl`; returns its id.
    pub async fn grant(&self, ttl: Duration) -> Result<i64, StoreError> {
        let members = self.members.clone();
        let secs = ttl.as_secs().max(1) as i64;
        self.on_etcd(async move {
            let resp = members
                .request_with(
                    "grant a lease",
                    true,
                    |m| m.client.lease_client(),
                    |mut lease| async move { lease.grant(secs, None).await },
                )
                .await?;
            Ok(resp.id())
        })
        .await
    }

    /// Renews a lease once; returns its time left (zero: it has expired).
    pub async fn keep_alive(&self, lease: i64) -> Result<Duration, StoreError> {
        let members = self.members.clone();
        self.on_etcd(async move {
            members
                .request_with(
                    "renew the lease",
                    true,
                    |m| m.client.lease_client(),
                    |mut client| async move {
                        let renew = async {
                            let (mut keeper, mut stream) = client.keep_alive(lease).await?;
                            keeper.keep_alive().await?;
                            Ok(stream.message().await?.map(|r| r.ttl()).unwrap_or(0))
                        };
                        match renew.await {
                            Ok(ttl) => Ok(Duration::from_secs(ttl.max(0) as u64)),
                            // Expired or revoked: nothing left to renew.
                            Err(etcd_client::Error::LeaseKeepAliveError(m))
                                if m.contains("not found") =>
                            {
                                Ok(Duration::ZERO)
                            }
                            Err(e) => Err(e),
                        }
                    },
                )
                .await
        })
        .await
    }

    /// Revokes a lease: its keys (leadership, registration) go at once.
    pub async fn resign(&self, lease: i64) -> Result<(), StoreError> {
        let members = self.members.clone();
        self.on_etcd(async move {
            members
                .request_with(
                    "revoke the lease",
                    true,
                    |m| m.client.lease_client(),
                    |mut client| async move { client.revoke(lease).await.map(|_| ()) },
                )
                .await
        })
        .await
    }

    /// Becomes leader under `lease` if nobody leads. `Ok(term)` when this
    /// replica leads (now or already), else `Err(the leader's value)`.
    pub async fn campaign(
        &self,
        lease: i64,
        value: Vec<u8>,
    ) -> Result<Result<Fence, Vec<u8>>, StoreError> {
        let members = self.members.clone();
        let key = leader_key(&self.prefix);
        self.on_etcd(async move {
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    value.clone(),
                    Some(etcd_client::PutOptions::new().with_lease(lease)),
                )])
                .or_else([TxnOp::get(key.as_str(), None)]);
            let resp = members
                .request("campaign for leadership", false, |mut kv| {
                    let txn = txn.clone();
                    async move { kv.txn(txn).await }
                })
                .await?;
            if resp.succeeded() {
                let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
                return Ok(Ok(Fence(rev as u64)));
            }
            for r in resp.op_responses() {
                if let TxnOpResponse::Get(g) = r {
                    if let Some(kv) = g.kvs().first() {
                        // A retried campaign that had won: the key is ours.
                        if kv.lease() == lease && kv.value() == value.as_slice() {
                            return Ok(Ok(Fence(kv.create_revision() as u64)));
                        }
                        return Ok(Err(kv.value().to_vec()));
                    }
                }
            }
            Ok(Err(vec![]))
        })
        .await
    }

    /// The leader's value and term, if anyone leads.
    pub async fn leader(&self) -> Result<Option<(Vec<u8>, Fence)>, StoreError> {
        let members = self.members.clone();
        let key = leader_key(&self.prefix);
        self.on_etcd(async move {
            let resp = members
                .request("read the leader", true, |mut kv| {
                    let key = key.clone();
                    async move { kv.get(key, None).await }
                })
                .await?;
            Ok(resp
                .kvs()
                .first()
                .map(|kv| (kv.value().to_vec(), Fence(kv.create_revision() as u64))))
        })
        .await
    }

    /// Records this replica under `lease`, so it disappears with it.
    pub async fn announce(&self, id: &str, value: Vec<u8>, lease: i64) -> Result<(), StoreError> {
        let options = etcd_client::PutOptions::new().with_lease(lease);
        self.put(
            "announce this coordinator",
            self.replica_key(id),
            value,
            options,
        )
        .await
        .map(|_| ())
    }

    /// Puts `value` at `key` with `options`.
    async fn put(
        &self,
        what: &'static str,
        key: String,
        value: Vec<u8>,
        options: etcd_client::PutOptions,
    ) -> Result<etcd_client::PutResponse, StoreError> {
        let members = self.members.clone();
        self.on_etcd(async move {
            members
                .request(what, true, |mut kv| {
                    let (key, value, options) = (key.clone(), value.clone(), options.clone());
                    async move { kv.put(key, value, Some(options)).await }
                })
                .await
        })
        .await
    }

    /// Records this replica among the known ones under a lease of its own
    /// (`ttl`, the retention, renewed with [`Election::keep_alive`]), so it
    /// stays known that long after it stops: it may lead again. Revokes the
    /// lease an earlier run of this replica left on the key, so restarts
    /// leave no leases behind. Returns the new lease.
    pub async fn remember(
        &self,
        id: &str,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<i64, StoreError> {
        let lease = self.grant(ttl).await?;
        let options = etcd_client::PutOptions::new()
            .with_lease(lease)
            .with_prev_key();
        let previous = self
            .put(
                "remember this coordinator",
                self.known_key(id),
                value,
                options,
            )
            .await?
            .prev_key()
            .map(|kv| kv.lease())
            .unwrap_or(0);
        if previous != 0 && previous != lease {
            // Expires by itself otherwise.
            let _ = self.resign(previous).await;
        }
        Ok(lease)
    }

    /// Every known replica's announcement: registered now, or within the
    /// retention of the lease it was remembered under.
    pub async fn known_replicas(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        self.values_under("list the known coordinators", self.known_key(""))
            .await
    }

    /// Every live replica's announcement.
    pub async fn replicas(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        self.values_under("list the coordinators", self.replica_key(""))
            .await
    }

    /// The values of every key under `prefix`.
    async fn values_under(
        &self,
        what: &'static str,
        prefix: String,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let members = self.members.clone();
        self.on_etcd(async move {
            let resp = members
                .request(what, true, |mut kv| {
                    let prefix = prefix.clone();
                    async move { kv.get(prefix, Some(GetOptions::new().with_prefix())).await }
                })
                .await?;
            Ok(resp.kvs().iter().map(|kv| kv.value().to_vec()).collect())
        })
        .await
    }
}

/// A transaction translated for etcd.
struct Plan {
    /// Every key the transaction touches, in order of first touch.
    keys: Vec<String>,
    /// The preconditions on the keys' states before the transaction.
    compares: Vec<Compare>,
    /// One put or delete per key whose state changes.
    writes: Vec<TxnOp>,
    /// An operation fails on the state an earlier one in the transaction
    /// left, whatever etcd holds.
    doomed: bool,
}

impl Plan {
    fn new(ops: &[Op], key: impl Fn(Kind, &str) -> String) -> Self {
        let mut keys = vec![];
        let mut compares = vec![];
        // The key's state after the operations so far (`Some(body)`: it
        // exists) and whether it existed before, for keys touched so far.
        let mut after: HashMap<String, Option<&[u8]>> = HashMap::new();
        let mut before: HashMap<String, bool> = HashMap::new();
        let mut doomed = false;
        for op in ops {
            let (kind, name, expected) = target(op);
            let k = key(kind, name);
            match after.get(&k) {
                None => {
                    compares.push(match (op, expected) {
                        (Op::Create { .. }, _) => {
                            Compare::create_revision(k.as_str(), CompareOp::Equal, 0)
                        }
                        (_, Some(r)) => Compare::mod_revision(
                            k.as_str(),
                            CompareOp::Equal,
                            i64::try_from(r).unwrap_or(-1),
                        ),
                        (_, None) => Compare::create_revision(k.as_str(), CompareOp::Greater, 0),
                    });
                    before.insert(k.clone(), !matches!(op, Op::Create { .. }));
                    keys.push(k.clone());
                }
                Some(state) => {
                    let exists = state.is_some();
                    let ok = match op {
                        Op::Create { .. } => !exists,
                        // Its revision is the one this transaction commits
                        // at, unknown until then: see `replay`.
                        _ if expected.is_some() => false,
                        _ => exists,
                    };
                    doomed |= !ok;
                }
            }
            let state = match op {
                Op::Create { body, .. } | Op::Update { body, .. } => Some(body.as_slice()),
                Op::Delete { .. } => None,
            };
            after.insert(k, state);
        }
        let writes = keys
            .iter()
            .filter_map(|k| match (after[k], before[k]) {
                (Some(body), _) => Some(TxnOp::put(k.as_str(), body, None)),
                (None, true) => Some(TxnOp::delete(k.as_str(), None)),
                // Created and deleted again: etcd never sees it.
                (None, false) => None,
            })
            .collect();
        Self {
            keys,
            compares,
            writes,
            doomed,
        }
    }
}

fn target(op: &Op) -> (Kind, &str, Option<u64>) {
    match op {
        Op::Create { kind, name, .. } => (*kind, name, None),
        Op::Update {
            kind,
            name,
            expected_revision,
            ..
        }
        | Op::Delete {
            kind,
            name,
            expected_revision,
        } => (*kind, name, *expected_revision),
    }
}

/// Applies `ops` in order, as SQLite does, to the keys' revisions in
/// `snapshot` (absent: no such object), and returns the first failure.
/// `next` is the revision the transaction would have committed at: the
/// revision of objects it wrote. An operation expecting a revision on an
/// object written earlier in the same transaction always conflicts (SQLite
/// would accept it if the caller guessed `next` right).
fn replay(
    ops: &[Op],
    key: impl Fn(Kind, &str) -> String,
    snapshot: &HashMap<String, u64>,
    next: u64,
) -> Result<(), StoreError> {
    // Some((revision, written by this transaction)) when the object exists.
    let mut state: HashMap<String, Option<(u64, bool)>> = HashMap::new();
    for op in ops {
        let (kind, name, expected) = target(op);
        let k = key(kind, name);
        let current = *state
            .entry(k.clone())
            .or_insert_with(|| snapshot.get(&k).map(|r| (*r, false)));
        match op {
            Op::Create { .. } => {
                if current.is_some() {
                    return Err(StoreError::AlreadyExists {
                        kind: kind.as_str(),
                        name: name.to_owned(),
                    });
                }
            }
            Op::Update { .. } | Op::Delete { .. } => {
                let Some((found, written_here)) = current else {
                    return Err(StoreError::NotFound {
                        kind: kind.as_str(),
                        name: name.to_owned(),
                    });
                };
                if let Some(expected) = expected {
                    if expected != found || written_here {
                        return Err(StoreError::Conflict {
                            kind: kind.as_str(),
                            name: name.to_owned(),
                            expected,
                            found,
                        });
                    }
                }
            }
        }
        let after = match op {
            Op::Delete { .. } => None,
            _ => Some((next, true)),
        };
        state.insert(k, after);
    }
    Ok(())
}

/// The first key after every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff: to the end of the key space.
    vec![0]
}

/// `(kind, name)` of a key under `prefix`, if it is one of ours.
fn parse_key(prefix: &str, key: &[u8]) -> Option<(Kind, String)> {
    let rest = std::str::from_utf8(key.strip_prefix(prefix.as_bytes())?).ok()?;
    let (kind, name) = rest.split_once('/')?;
    Some((Kind::parse(kind)?, name.to_owned()))
}

/// The changes under `prefix` from revision `start` on, read with a watch
/// from `start`, and the revision they are complete up to; `Err(revision)`
/// when etcd compacted the history before `start` (the oldest it keeps).
///
/// Where the replay ends is marked by a write: a key outside every kind
/// is put once the watch runs (and deleted after). A watch delivers events
/// in revision order, so when the marker's arrives every earlier change
/// has. (etcd 3.4 answers a progress request at once, before the replay,
/// so a progress notification cannot mark it: etcd-io/etcd#15220.)
async fn read_history(
    members: &Members,
    prefix: &str,
    start: i64,
) -> Result<Result<(Vec<Change>, u64), i64>, StoreError> {
    let what = "read the change history";
    let member = &members.list[members.preferred.load(Ordering::Relaxed) % members.list.len()];
    let opts = WatchOptions::new().with_prefix().with_start_revision(start);
    let mut wc = member.client.watch_client();
    let mut stream = tokio::time::timeout(members.timeout, wc.watch(prefix, Some(opts)))
        .await
        .map_err(|_| members.error(what, "no answer"))?
        .map_err(|e| members.error(what, describe(&e)))?;
    let marker = format!("{prefix}~history/{}", uuid::Uuid::new_v4());
    let mut kv = member.client.kv_client();
    let put = tokio::time::timeout(members.timeout, kv.put(marker.as_str(), "", None))
        .await
        .map_err(|_| members.error(what, "no answer"))?
        .map_err(|e| members.error(what, describe(&e)))?;
    let marked = put.header().map_or(0, |h| h.revision()) as u64;
    let mut changes = vec![];
    let result = loop {
        let resp = tokio::time::timeout(members.timeout, stream.message())
            .await
            .map_err(|_| members.error(what, "no answer"))?
            .map_err(|e| members.error(what, describe(&e)))?
            .ok_or_else(|| members.error(what, "the watch ended"))?;
        if resp.canceled() {
            if resp.compact_revision() > 0 {
                break Err(resp.compact_revision());
            }
            return Err(members.error(
                what,
                format!("the watch was cancelled: {}", resp.cancel_reason()),
            ));
        }
        let mut done = false;
        for ev in resp.events() {
            let Some(ev_kv) = ev.kv() else { continue };
            let revision = ev_kv.mod_revision() as u64;
            if ev_kv.key() == marker.as_bytes() || revision >= marked {
                done = true;
                break;
            }
            if let Some((kind, name)) = parse_key(prefix, ev_kv.key()) {
                changes.push(Change {
                    kind,
                    name,
                    revision,
                    deleted: matches!(ev.event_type(), EventType::Delete),
                    origin: None,
                });
            }
        }
        if done {
            break Ok((changes, marked.saturating_sub(1)));
        }
    };
    let _ = tokio::time::timeout(members.timeout, kv.delete(marker.as_str(), None)).await;
    Ok(result)
}

/// Broadcasts every change under `prefix` from revision `next` on, for the
/// life of the backend, resuming after failures where it left off, on the
/// next member.
async fn watch(
    members: Arc<Members>,
    prefix: String,
    mut next: i64,
    changes: broadcast::Sender<Change>,
    cache: Arc<ReadCache>,
) {
    let initial_backoff = Duration::from_millis(200);
    let mut backoff = initial_backoff;
    let mut index = members.preferred.load(Ordering::Relaxed);
    loop {
        let member = &members.list[index % members.list.len()];
        index += 1;
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(next)
            .with_progress_notify();
        let mut wc = member.client.watch_client();
        match tokio::time::timeout(members.timeout, wc.watch(prefix.as_str(), Some(opts))).await {
            Err(_) => {
                tracing::warn!(member = %member.url, "cannot watch etcd: no answer; trying again")
            }
            Ok(Err(e)) => {
                tracing::warn!(member = %member.url, error = describe(&e), "cannot watch etcd; trying again")
            }
            Ok(Ok(mut stream)) => loop {
                match stream.message().await {
                    Ok(Some(resp)) => {
                        if resp.canceled() {
                            if resp.compact_revision() > 0 {
                                tracing::warn!(
                                    member = %member.url,
                                    from = next,
                                    to = resp.compact_revision(),
                                    "etcd compacted changes before the watch saw them; resuming after them"
                                );
                                next = resp.compact_revision();
                                // The changes skipped may include any cached object.
                                cache.clear();
                            } else {
                                tracing::warn!(member = %member.url, reason = resp.cancel_reason(), "etcd cancelled the watch; resuming");
                            }
                            break;
                        }
                        backoff = initial_backoff;
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            next = next.max(kv.mod_revision() + 1);
                            if let Some((kind, name)) = parse_key(&prefix, kv.key()) {
                                if cache::caches(kind) {
                                    cache.changed(kind, &name, Some(kv.mod_revision() as u64));
                                }
                                // Nobody listening is fine: watchers re-list on start.
                                let _ = changes.send(Change {
                                    kind,
                                    name,
                                    revision: kv.mod_revision() as u64,
                                    deleted: matches!(ev.event_type(), EventType::Delete),
                                    origin: None,
                                });
                            }
                        }
                        if resp.events().is_empty() && !resp.created() {
                            // Progress: nothing at or before this revision is left.
                            if let Some(h) = resp.header() {
                                next = next.max(h.revision() + 1);
                            }
                        }
                    }
                    Ok(None) => {
                        tracing::warn!(member = %member.url, "etcd closed the watch; resuming");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(member = %member.url, error = describe(&e), "the etcd watch failed; resuming");
                        break;
                    }
                }
            },
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: Kind, name: &str) -> String {
        format!("/p/{}/{name}", kind.as_str())
    }

    #[test]
    fn prefix_end_and_keys() {
        assert_eq!(prefix_end(b"/drover/"), b"/drover0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(
            parse_key("/drover/", b"/drover/machines/m-1"),
            Some((Kind::Machine, "m-1".into()))
        );
        assert_eq!(
            parse_key("/drover/", b"/drover/secrets/a/b"),
            Some((Kind::Secret, "a/b".into()))
        );
        assert_eq!(parse_key("/drover/", b"/drover/unknown/x"), None);
        assert_eq!(parse_key("/drover/", b"/other/machines/x"), None);
    }

    #[test]
    fn plans_fold_writes_per_key() {
        let create = |n: &str| Op::Create {
            kind: Kind::Machine,
            name: n.into(),
            body: b"1".to_vec(),
        };
        let update = |n: &str, r| Op::Update {
            kind: Kind::Machine,
            name: n.into(),
            body: b"2".to_vec(),
            expected_revision: r,
        };
        let delete = |n: &str| Op::Delete {
            kind: Kind::Machine,
            name: n.into(),
            expected_revision: None,
        };
        let p = Plan::new(&[create("a"), update("a", None), update("b", Some(3))], key);
        assert_eq!(p.keys, ["/p/machines/a", "/p/machines/b"]);
        assert_eq!((p.compares.len(), p.writes.len(), p.doomed), (2, 2, false));
        let p = Plan::new(&[create("a"), delete("a")], key);
        assert_eq!((p.compares.len(), p.writes.len(), p.doomed), (1, 0, false));
        assert!(Plan::new(&[create("a"), create("a")], key).doomed);
        assert!(Plan::new(&[delete("a"), update("a", None)], key).doomed);
        assert!(Plan::new(&[create("a"), update("a", Some(9))], key).doomed);

        // Replays report what SQLite reports.
        let snap: HashMap<String, u64> = [("/p/machines/b".to_string(), 5)].into();
        assert!(matches!(
            replay(&[create("a"), update("b", Some(3))], key, &snap, 8),
            Err(StoreError::Conflict {
                expected: 3,
                found: 5,
                ..
            })
        ));
        assert!(matches!(
            replay(&[update("c", None), create("b")], key, &snap, 8),
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            replay(&[create("a"), create("a")], key, &snap, 8),
            Err(StoreError::AlreadyExists { .. })
        ));
        assert!(replay(&[create("a"), update("b", Some(5))], key, &snap, 8).is_ok());
    }
}
