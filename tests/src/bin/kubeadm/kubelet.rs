//! The stand-in kubelet (`kubeadm __standin-kubelet`): plain HTTP `/healthz`
//! on the KubeletConfiguration's healthzBindAddress:healthzPort, failing while
//! `<root>/var/lib/kubelet/standin-fail` exists.

use std::convert::Infallible;
use std::sync::Arc;

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::daemon;
use crate::util::{join_host_port, Root};

pub const CONFIG_FILE: &str = "/var/lib/kubelet/config.yaml";
pub const FAIL_FILE: &str = "/var/lib/kubelet/standin-fail";

/// The healthz address from the kubelet's config file (kubelet defaults:
/// 127.0.0.1:10248).
pub fn healthz_address(root: &Root) -> Result<(String, u16)> {
    let text = std::fs::read_to_string(root.path(CONFIG_FILE))
        .with_context(|| format!("failed to load kubelet config file, path: {CONFIG_FILE}"))?;
    let doc: serde_json::Value = serde_saphyr::from_str(&text)
        .with_context(|| format!("failed to parse kubelet config file {CONFIG_FILE}"))?;
    Ok(healthz_from_doc(&doc))
}

pub fn healthz_from_doc(doc: &serde_json::Value) -> (String, u16) {
    let addr = doc
        .get("healthzBindAddress")
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("127.0.0.1")
        .to_owned();
    let port = doc
        .get("healthzPort")
        .and_then(|v| v.as_u64())
        .filter(|p| *p != 0 && *p <= u16::MAX as u64)
        .unwrap_or(10248) as u16;
    (addr, port)
}

pub fn run(root: Root) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        daemon::claim_pid_file(&root, "kubelet")?;
        let r = serve(&root).await;
        daemon::release_pid_file(&root, "kubelet");
        r
    })
}

async fn serve(root: &Root) -> Result<()> {
    let (host, port) = healthz_address(root)?;
    let bind = join_host_port(&host, port);
    let listener = TcpListener::bind(&bind)
        .await
        .with_context(|| format!("failed to listen on {bind}"))?;
    println!(
        "standin-kubelet: serving healthz on http://{bind}/healthz (pid {}, root {})",
        std::process::id(),
        root.dir().display()
    );
    let fail_file = Arc::new(root.path(FAIL_FILE));
    let watchdog = daemon::watchdog(root.clone(), "kubelet");
    tokio::pin!(watchdog);
    let term = daemon::termination();
    tokio::pin!(term);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let fail_file = fail_file.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let fail_file = fail_file.clone();
                        async move {
                            let (code, body) = match (req.method(), req.uri().path()) {
                                (&Method::GET, "/healthz") if fail_file.exists() => {
                                    (StatusCode::INTERNAL_SERVER_ERROR, "kubelet unhealthy")
                                }
                                (&Method::GET, "/healthz") => (StatusCode::OK, "ok"),
                                _ => (StatusCode::NOT_FOUND, "404 page not found"),
                            };
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .status(code)
                                    .header("content-type", "text/plain; charset=utf-8")
                                    .body(Full::new(Bytes::from_static(body.as_bytes())))
                                    .expect("valid response"),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
            sig = &mut term => {
                println!("standin-kubelet: received {}, shutting down", sig?);
                return Ok(());
            }
            _ = &mut watchdog => return Ok(()),
        }
    }
}
