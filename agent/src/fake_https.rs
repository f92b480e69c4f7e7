//! Tests only: HTTPS servers on loopback that answer from a closure and
//! record every request, standing in for the local endpoints the agent
//! calls (etcd's JSON gateway, the API server) so a unit test sees what
//! the agent asked, and in which order. The certificates come from one CA
//! that [`Pki::write_etcd_client`] and [`Pki::write_admin_conf`] put where
//! kubeadm would under a test root.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use base64::Engine;
use drover_common::pki::{CertificateAuthority, LeafSpec, LeafUsage};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// One request a fake server received.
#[derive(Debug, Clone)]
pub struct Call {
    /// The server's `127.0.0.1:port`.
    pub server: SocketAddr,
    pub method: String,
    /// The path and query.
    pub path: String,
    pub body: String,
}

/// What a fake server answers: status and JSON body.
pub type Answer = (u16, String);

/// The handler of every fake server of a test: the call, and what was
/// recorded before it.
pub type Handler = Arc<dyn Fn(&Call, &[Call]) -> Answer + Send + Sync>;

/// The CA of a test's fake servers and its client certificates.
pub struct Pki {
    ca: CertificateAuthority,
    /// The calls every server made with this PKI received, in order.
    pub calls: Arc<Mutex<Vec<Call>>>,
}

impl Pki {
    pub fn new() -> Self {
        Self {
            ca: CertificateAuthority::generate("fake").unwrap(),
            calls: Arc::default(),
        }
    }

    /// Writes the etcd CA and the API server's etcd client certificate
    /// where kubeadm does under `root`.
    pub fn write_etcd_client(&self, root: &Path) {
        let client = self
            .ca
            .issue(&LeafSpec::loopback(
                "kube-apiserver-etcd-client",
                LeafUsage::Client,
            ))
            .unwrap();
        let pki = root.join("etc/kubernetes/pki");
        std::fs::create_dir_all(pki.join("etcd")).unwrap();
        std::fs::write(pki.join("etcd/ca.crt"), &self.ca.cert_pem).unwrap();
        std::fs::write(pki.join("apiserver-etcd-client.crt"), &client.cert_pem).unwrap();
        std::fs::write(
            pki.join("apiserver-etcd-client.key"),
            client.key_pem.unwrap(),
        )
        .unwrap();
    }

    /// Writes `/etc/kubernetes/admin.conf` under `root` for `server`.
    pub fn write_admin_conf(&self, root: &Path, server: &str) {
        let client = self
            .ca
            .issue(&LeafSpec::loopback("kubernetes-admin", LeafUsage::Client))
            .unwrap();
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        let conf = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
            b64(&self.ca.cert_pem),
            b64(&client.cert_pem),
            b64(client.key_pem.as_deref().unwrap()),
        );
        let dir = root.join("etc/kubernetes");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("admin.conf"), conf).unwrap();
    }

    /// The calls received so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Starts a server on loopback answering with `handler`; its address.
    pub async fn serve(&self, handler: Handler) -> SocketAddr {
        let leaf = self
            .ca
            .issue(&LeafSpec::loopback("fake", LeafUsage::Server))
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.unwrap().as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = listener.local_addr().unwrap();
        let calls = self.calls.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let handler = handler.clone();
                let calls = calls.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let handler = handler.clone();
                            let calls = calls.clone();
                            async move {
                                let method = req.method().to_string();
                                let path = req
                                    .uri()
                                    .path_and_query()
                                    .map_or_else(String::new, |p| p.to_string());
                                let body = req.into_body().collect().await?.to_bytes();
                                let call = Call {
                                    server,
                                    method,
                                    path,
                                    body: String::from_utf8_lossy(&body).into_owned(),
                                };
                                let (status, body) = {
                                    let before = calls.lock().unwrap().clone();
                                    handler(&call, &before)
                                };
                                calls.lock().unwrap().push(call);
                                Ok::<_, hyper::Error>(
                                    hyper::Response::builder()
                                        .status(status)
                                        .header("content-type", "application/json")
                                        .body(Full::new(Bytes::from(body)))
                                        .unwrap(),
                                )
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        server
    }
}
