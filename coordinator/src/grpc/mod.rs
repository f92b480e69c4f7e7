//! The cluster-autoscaler's `externalgrpc` cloud provider (issue 36),
//! served on a port of its own (`--autoscaler-listen`) over HTTP/2 with
//! mutual TLS: the autoscaler of cluster `C` presents a client
//! certificate the coordinator's CA signed for `C` alone
//! (`domain::autoscaling::client_credentials`, `drover
//! autoscaler-config`), and every call it makes reads and changes that
//! cluster only (`cloud_provider.rs`).
//! What the calls decide is `domain::autoscaling`; this layer parses,
//! identifies the caller, writes, audits and counts.

pub mod cloud_provider;
pub mod k8s;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use drover_common::pki::CertificateAuthority;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use tokio::net::TcpListener;

use crate::app::App;
use crate::http::server::TlsSetupError;

/// The service as `proto/externalgrpc.proto` defines it.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    tonic::include_proto!("clusterautoscaler.cloudprovider.v1.externalgrpc");
}

/// The TLS configuration of the autoscaler port: a serving certificate
/// for `dns_names`/`ips` signed by the coordinator's CA, a client
/// certificate the CA signed required of every connection, HTTP/2 only.
pub fn tls_config(
    ca: &CertificateAuthority,
    dns_names: Vec<String>,
    ips: Vec<IpAddr>,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let (chain, key) = crate::http::server::serving_chain(ca, dns_names, ips)?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(chain[1].clone()).map_err(TlsSetupError::Rustls)?;
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), crate::tls::provider())
            .build()
            .map_err(|e| TlsSetupError::Verifier(e.to_string()))?;
    let mut cfg = ServerConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the `CloudProvider` service of `app` on `listener` until
/// `shutdown` resolves. Handshakes run side by side, each in a task of
/// its own, so a slow or silent client holds up no other.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let (tx, rx) = tokio::sync::mpsc::channel::<
        std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>,
    >(64);
    let accepting = tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "autoscaler port: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::info!(%peer, error = %e, "autoscaler port: TLS handshake refused")
                    }
                    Err(_) => {
                        tracing::info!(%peer, "autoscaler port: TLS handshake timed out")
                    }
                }
            });
        }
    });
    let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
    let service =
        proto::cloud_provider_server::CloudProviderServer::new(cloud_provider::Service::new(app));
    if let Err(e) = tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
    {
        tracing::error!(error = %e, "the autoscaler port stopped");
    }
    accepting.abort();
}

/// Where an autoscaler reaches the port bound at `bound`: the host of the
/// coordinator's first advertised URL, and the port.
pub fn advertised_address(advertise_url: &str, bound: SocketAddr) -> String {
    let host = advertise_url
        .trim_start_matches("https://")
        .split('/')
        .next()
        .unwrap_or_default();
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    format!("{host}:{}", bound.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_is_the_advertised_host_at_the_autoscaler_port() {
        let bound: SocketAddr = "0.0.0.0:8444".parse().unwrap();
        assert_eq!(
            advertised_address("https://drover.example.com:8443", bound),
            "drover.example.com:8444"
        );
        assert_eq!(
            advertised_address("https://[::1]:8443/", bound),
            "[::1]:8444"
        );
        assert_eq!(
            advertised_address("https://10.0.0.1", bound),
            "10.0.0.1:8444"
        );
    }

    #[test]
    fn an_autoscaler_certificate_names_its_cluster_and_uid() {
        let ca = CertificateAuthority::generate("test").unwrap();
        let issued = crate::domain::autoscaling::client_credentials(&ca, "web", "uid-1").unwrap();
        let der = drover_common::pki::first_cert_der(&issued.cert_pem).unwrap();
        let info = drover_common::pki::cert_info(&der).unwrap();
        assert_eq!(info.common_name, "autoscaler:web");
        assert_eq!(info.organizations, ["drover:autoscaler:uid-1"]);
    }
}
