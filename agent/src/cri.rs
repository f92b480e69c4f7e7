//! The container runtime check: the CRI `RuntimeService` on the runtime's
//! unix socket must answer `Version` and `Status` within a deadline, and
//! `Status` must say `RuntimeReady`. The kubelet makes the same two calls
//! (`pkg/kubelet/cri/remote/remote_runtime.go`); node-problem-detector's
//! containerd health checker reports the same failure as the
//! `ContainerRuntimeUnhealthy` condition, which this reports too.
//!
//! It runs only when the agent is told the socket (`--cri-socket`): the
//! Debian package's unit names containerd's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_common::api::{NodeProblem, CONTAINER_RUNTIME_UNHEALTHY};

/// The generated client (`proto/cri.proto`, upstream's field numbers).
pub mod pb {
    tonic::include_proto!("runtime.v1");
}

/// How long the runtime has to answer each call. The kubelet allows 2
/// minutes per call before it gives up on an operation; a health check
/// that waits that long would hold every heartbeat, and a runtime that
/// takes seconds to say its version is in trouble.
pub const DEADLINE: Duration = Duration::from_secs(5);

/// The CRI API version the agent asks for (`VersionRequest.version`).
const KUBELET_API_VERSION: &str = "v1";

/// Why the runtime did not answer.
#[derive(Debug, thiserror::Error)]
enum CriError {
    #[error("cannot connect: {0}")]
    Unreachable(String),
    #[error("{0}: {code}: {message}", code = .1.code(), message = .1.message())]
    Call(&'static str, tonic::Status),
}

impl CriError {
    /// The problem's reason.
    fn reason(&self) -> &'static str {
        match self {
            CriError::Unreachable(_) => "CRIUnreachable",
            CriError::Call(..) => "CRIError",
        }
    }
}

/// The check of one runtime socket.
#[derive(Debug, Clone)]
pub struct CriCheck {
    socket: PathBuf,
    deadline: Duration,
}

impl CriCheck {
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_owned(),
            deadline: DEADLINE,
        }
    }

    /// The problem, if the runtime does not answer in time or says it is
    /// not ready.
    pub async fn check(&self) -> Option<NodeProblem> {
        let problem = |reason: &str, message: String| {
            Some(NodeProblem {
                type_: CONTAINER_RUNTIME_UNHEALTHY.into(),
                reason: reason.into(),
                message,
            })
        };
        let socket = self.socket.display();
        let calls = async {
            let mut client = self.client().await?;
            let version = client
                .version(pb::VersionRequest {
                    version: KUBELET_API_VERSION.into(),
                })
                .await
                .map_err(|s| CriError::Call("Version", s))?
                .into_inner();
            let status = client
                .status(pb::StatusRequest { verbose: false })
                .await
                .map_err(|s| CriError::Call("Status", s))?
                .into_inner();
            Ok::<_, CriError>((version, status))
        };
        match tokio::time::timeout(self.deadline, calls).await {
            Err(_) => problem(
                "CRITimeout",
                format!(
                    "the container runtime at {socket} did not answer Version and Status within {}s",
                    self.deadline.as_secs()
                ),
            ),
            Ok(Err(e)) => problem(
                e.reason(),
                format!("the container runtime at {socket} failed: {e}"),
            ),
            Ok(Ok((version, status))) => {
                let conditions = status.status.map(|s| s.conditions).unwrap_or_default();
                let ready = conditions.iter().find(|c| c.r#type == "RuntimeReady");
                match ready {
                    Some(c) if c.status => None,
                    Some(c) => problem(
                        "RuntimeNotReady",
                        format!(
                            "{} {} at {socket} says RuntimeReady is false: {} {}",
                            version.runtime_name, version.runtime_version, c.reason, c.message
                        ),
                    ),
                    None => problem(
                        "RuntimeNotReady",
                        format!(
                            "{} {} at {socket} reports no RuntimeReady condition",
                            version.runtime_name, version.runtime_version
                        ),
                    ),
                }
            }
        }
    }

    async fn client(
        &self,
    ) -> Result<pb::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>, CriError>
    {
        let path = self.socket.clone();
        // The URI is not dialed: every connection is the unix socket.
        let channel = tonic::transport::Endpoint::from_static("http://cri.invalid")
            .connect_timeout(self.deadline)
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| {
                use std::error::Error;
                let mut why = e.to_string();
                let mut source = e.source();
                while let Some(s) = source {
                    why = format!("{why}: {s}");
                    source = s.source();
                }
                CriError::Unreachable(why)
            })?;
        Ok(pb::runtime_service_client::RuntimeServiceClient::new(
            channel,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_nobody_serves_is_an_unreachable_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let check = CriCheck::new(&dir.path().join("containerd.sock"));
        let p = check.check().await.expect("a problem");
        assert_eq!(
            (p.type_.as_str(), p.reason.as_str()),
            ("ContainerRuntimeUnhealthy", "CRIUnreachable")
        );
        assert!(p.message.contains("containerd.sock"), "{}", p.message);
    }

    #[tokio::test]
    async fn a_socket_that_accepts_and_never_answers_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hung.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        // Accepts and holds connections, answering nothing: a hung runtime.
        let held = tokio::spawn(async move {
            let mut conns = vec![];
            while let Ok((c, _)) = listener.accept().await {
                conns.push(c);
            }
        });
        let mut check = CriCheck::new(&path);
        check.deadline = Duration::from_millis(300);
        let p = check.check().await.expect("a problem");
        assert_eq!(p.reason, "CRITimeout", "{p:?}");
        held.abort();
    }
}
