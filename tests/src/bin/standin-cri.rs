//! The stand-in container runtime of the tests' machines: the CRI
//! `RuntimeService`'s `Version` and `Status` on a unix socket, as
//! containerd serves them (`agent/proto/cri.proto` holds upstream's field
//! numbers), so the agent's runtime check talks real gRPC over HTTP/2 to
//! it. A test stops the machine's runtime by killing this process, hangs
//! it with SIGSTOP, or starts it `--not-ready`.
//!
//!   standin-cri --socket PATH [--not-ready REASON]

use std::path::PathBuf;

use tonic::{Request, Response, Status};

mod pb {
    tonic::include_proto!("runtime.v1");
}

use pb::runtime_service_server::{RuntimeService, RuntimeServiceServer};

struct Runtime {
    /// Why `RuntimeReady` is false, when it is.
    not_ready: Option<String>,
}

#[tonic::async_trait]
impl RuntimeService for Runtime {
    async fn version(
        &self,
        request: Request<pb::VersionRequest>,
    ) -> Result<Response<pb::VersionResponse>, Status> {
        // containerd answers any requested version with its own: v1 is the
        // only CRI API it serves.
        let _ = request;
        Ok(Response::new(pb::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "standin-containerd".into(),
            runtime_version: "v2.0.0".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let runtime_ready = pb::RuntimeCondition {
            r#type: "RuntimeReady".into(),
            status: self.not_ready.is_none(),
            reason: self.not_ready.clone().unwrap_or_default(),
            message: self
                .not_ready
                .as_ref()
                .map(|r| format!("the stand-in runtime was started not ready ({r})"))
                .unwrap_or_default(),
        };
        let network_ready = pb::RuntimeCondition {
            r#type: "NetworkReady".into(),
            status: true,
            reason: String::new(),
            message: String::new(),
        };
        Ok(Response::new(pb::StatusResponse {
            status: Some(pb::RuntimeStatus {
                conditions: vec![runtime_ready, network_ready],
            }),
            info: Default::default(),
        }))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut socket: Option<PathBuf> = None;
    let mut not_ready = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = args.next().map(PathBuf::from),
            "--not-ready" => not_ready = args.next(),
            other => anyhow::bail!("standin-cri: unknown argument {other:?}; usage: standin-cri --socket PATH [--not-ready REASON]"),
        }
    }
    let socket = socket.ok_or_else(|| anyhow::anyhow!("standin-cri: --socket PATH is required"))?;
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket)?;
    eprintln!(
        "standin-cri: serving CRI RuntimeService on {}",
        socket.display()
    );
    tonic::transport::Server::builder()
        .add_service(RuntimeServiceServer::new(Runtime { not_ready }))
        .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
        .await?;
    Ok(())
}
