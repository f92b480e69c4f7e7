//! The cluster-autoscaler's calls, made by `scripts/grpc-client` (Python's
//! grpcio, from `tests/grpc/externalgrpc.proto`) with the credentials
//! `drover autoscaler-config` writes.

use std::path::{Path, PathBuf};

use crate::Coordinator;

/// One cluster's autoscaler, as its cloud-config names it.
pub struct Autoscaler {
    pub config: PathBuf,
}

/// What one call gave back.
#[derive(Debug, Clone)]
pub struct Call {
    /// The gRPC code's name (`OK`, `OUT_OF_RANGE`, ...).
    pub code: String,
    pub message: String,
    pub response: serde_json::Value,
    /// A template node, decoded from `nodeBytes` as the autoscaler does.
    pub node: serde_json::Value,
    /// How long the call took, as the client measured it.
    pub seconds: f64,
}

impl Call {
    /// The response of a call that must have succeeded.
    pub fn ok(self) -> serde_json::Value {
        assert_eq!(self.code, "OK", "{self:?}");
        self.response
    }

    /// Asserts the call was refused with `code` and a message containing
    /// `says`.
    pub fn refused(&self, code: &str, says: &str) {
        assert_eq!(self.code, code, "{self:?}");
        assert!(self.message.contains(says), "{self:?}");
    }
}

impl Autoscaler {
    /// Writes cluster `cluster`'s autoscaler credentials into `dir` with
    /// `drover autoscaler-config`.
    pub fn for_cluster(c: &Coordinator, cluster: &str, dir: &Path) -> Self {
        let out = c.cli_ok(&[
            "autoscaler-config",
            cluster,
            "--out-dir",
            dir.to_str().unwrap(),
        ]);
        assert!(out.contains("--cloud-provider=externalgrpc"), "{out}");
        Self {
            config: dir.join("cloud-config.yaml"),
        }
    }

    /// Calls `method` with `request` (proto3 JSON).
    pub fn call(&self, method: &str, request: serde_json::Value) -> Call {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/grpc-client");
        let out = std::process::Command::new(script)
            .arg("call")
            .arg(&self.config)
            .arg(method)
            .arg(request.to_string())
            .output()
            .expect("scripts/grpc-client runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{method}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{method}: {e}: {text}"));
        Call {
            code: v["code"].as_str().unwrap_or_default().to_owned(),
            message: v["message"].as_str().unwrap_or_default().to_owned(),
            response: v["response"].clone(),
            node: v["node"].clone(),
            seconds: v["seconds"].as_f64().unwrap_or_default(),
        }
    }
}
