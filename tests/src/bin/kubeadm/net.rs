//! TLS configurations (rustls with the ring provider) and HTTP clients.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use drover_common::tls_verify::{CheckedVerifier, PresentedCert, ServerCertCheck};
use rustls::client::danger::ServerCertVerified;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any server certificate, as kubeadm's discovery does for its first
/// `cluster-info` fetch (trust comes from the JWS and the CA pin instead).
/// Handshake signatures are still checked.
#[derive(Debug)]
struct AcceptAnyServerCert;

impl ServerCertCheck for AcceptAnyServerCert {
    fn check(&self, _presented: PresentedCert<'_>) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
}

pub fn certs_from_pem(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow!("{what}: invalid PEM certificate: {e}"))?;
    if certs.is_empty() {
        return Err(anyhow!("{what}: no certificate found"));
    }
    Ok(certs)
}

pub fn key_from_pem(pem: &str, what: &str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| anyhow!("{what}: invalid PEM private key: {e}"))
}

fn roots(ca_pem: &str) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for c in certs_from_pem(ca_pem, "CA")? {
        roots
            .add(c)
            .map_err(|e| anyhow!("cannot trust the CA certificate: {e}"))?;
    }
    Ok(roots)
}

/// A client config that trusts nothing but accepts any server.
pub fn insecure_client_config() -> ClientConfig {
    let p = provider();
    ClientConfig::builder_with_provider(p.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(CheckedVerifier::new(AcceptAnyServerCert, p)))
        .with_no_client_auth()
}

/// A client config trusting `ca_pem`, optionally presenting a client cert.
pub fn client_config(ca_pem: &str, client: Option<(&str, &str)>) -> Result<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots(ca_pem)?);
    Ok(match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                certs_from_pem(cert, "client certificate")?,
                key_from_pem(key, "client key")?,
            )
            .context("cannot use the client certificate")?,
        None => builder.with_no_client_auth(),
    })
}

/// A server config with the serving cert; clients may present a certificate
/// signed by `client_ca_pem` but need not.
pub fn server_config(cert_pem: &str, key_pem: &str, client_ca_pem: &str) -> Result<ServerConfig> {
    let p = provider();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(client_ca_pem)?),
        p.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| anyhow!("cannot build the client verifier: {e}"))?;
    let mut cfg = ServerConfig::builder_with_provider(p)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certs_from_pem(cert_pem, "serving certificate")?,
            key_from_pem(key_pem, "serving key")?,
        )
        .context("cannot use the serving certificate")?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The environment variable that plays `/etc/hosts` for the stand-in:
/// `name=ip[,name=ip...]`. Tests of cloud load balancers (whose DNS names
/// resolve nowhere here) point a load balancer's name at the loopback
/// address where the test serves its traffic.
pub const RESOLVE_ENV: &str = "DROVER_STANDIN_RESOLVE";

/// An HTTP client over the given TLS config.
pub fn http_client(tls: ClientConfig, timeout: Duration) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .no_proxy()
        .connect_timeout(Duration::from_secs(3))
        .timeout(timeout);
    for (name, addr) in resolve_overrides()? {
        builder = builder.resolve(&name, addr);
    }
    builder.build().context("cannot build the HTTP client")
}

/// The names [`RESOLVE_ENV`] resolves (the port is the URL's own).
fn resolve_overrides() -> Result<Vec<(String, std::net::SocketAddr)>> {
    let Ok(value) = std::env::var(RESOLVE_ENV) else {
        return Ok(vec![]);
    };
    value
        .split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|entry| {
            let (name, ip) = entry
                .split_once('=')
                .with_context(|| format!("{RESOLVE_ENV}: {entry:?} is not name=ip"))?;
            let ip: std::net::IpAddr = ip
                .trim()
                .parse()
                .with_context(|| format!("{RESOLVE_ENV}: {ip:?} is not an IP address"))?;
            Ok((name.trim().to_owned(), std::net::SocketAddr::new(ip, 0)))
        })
        .collect()
}

/// Whether a request error means nobody is listening (yet).
pub fn is_connect_error(e: &reqwest::Error) -> bool {
    e.is_connect() || e.is_timeout()
}

/// The message of a Kubernetes `Status` body, or the body itself.
pub fn status_message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
        .unwrap_or_else(|| body.trim().to_owned())
}
