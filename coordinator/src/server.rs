//! The HTTPS server: rustls in front of the axum router, with the peer's
//! client certificate (if any) handed to handlers, and a graceful drain.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use drover_common::pki::{CertificateAuthority, LeafSpec, LeafUsage, PkiError};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// The verified client certificate of a connection, if one was presented.
#[derive(Clone, Debug, Default)]
pub struct PeerCertificate(pub Option<CertificateDer<'static>>);

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an idle or slow HTTP/1 client may take to send its headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(15);

/// Errors building the TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("cannot issue the serving certificate: {0}")]
    Issue(#[from] PkiError),
    #[error("cannot load the serving certificate or key: {0}")]
    Pem(String),
    #[error("cannot build the TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("cannot build the client certificate verifier: {0}")]
    Verifier(String),
}

/// The crypto provider every rustls configuration of the coordinator uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the server TLS configuration: a fresh serving certificate for
/// `dns_names`/`ips` signed by the coordinator CA, the CA itself appended to
/// the chain (agents find it there by its pin), and client certificates
/// optional but verified against the CA when presented.
pub fn server_config(
    ca: &CertificateAuthority,
    dns_names: Vec<String>,
    ips: Vec<IpAddr>,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let leaf = ca.issue(&LeafSpec {
        common_name: "drover-coordinator".into(),
        organizations: vec![],
        dns_names,
        ip_addresses: ips,
        usage: LeafUsage::Server,
        validity: time::Duration::days(365),
    })?;
    let mut chain: Vec<CertificateDer<'static>> = vec![];
    for pem in [&leaf.cert_pem, &ca.cert_pem] {
        chain.push(
            CertificateDer::from_pem_slice(pem.as_bytes())
                .map_err(|e| TlsSetupError::Pem(e.to_string()))?,
        );
    }
    let key = PrivateKeyDer::from_pem_slice(
        leaf.key_pem
            .as_deref()
            .expect("issue() generates the key")
            .as_bytes(),
    )
    .map_err(|e| TlsSetupError::Pem(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(chain[1].clone()).map_err(TlsSetupError::Rustls)?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsSetupError::Verifier(e.to_string()))?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops
/// accepting and gives open connections `drain` to finish.
pub async fn run(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let cert = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.clone().into_owned());
            let peer_cert = PeerCertificate(cert);
            let service = hyper::service::service_fn(
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(peer_cert.clone());
                    req.extensions_mut()
                        .insert(axum::extract::ConnectInfo(peer));
                    app.clone().oneshot(req)
                },
            );
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections drained"),
        _ = tokio::time::sleep(drain) => tracing::warn!(?drain, "drain deadline passed; closing remaining connections"),
    }
}
