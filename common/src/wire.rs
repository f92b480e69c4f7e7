//! The machine API: what the agent and the coordinator say to each other.
//!
//! Every request and answer here is JSON over HTTPS. Registration is the only
//! call without a client certificate; everything after it is mutual TLS with
//! the certificate issued at registration, whose common name is the machine
//! UID.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::api::MachineRole;
use crate::pin::CaPin;

/// `kind` of the bootstrap document.
pub const BOOTSTRAP_KIND: &str = "BootstrapConfig";

/// The document an agent boots from: where the coordinator is, how to
/// recognise it, and the ticket that lets this machine register. It holds no
/// other secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootstrapDocument {
    pub api_version: String,
    pub kind: String,
    /// `https://host:port` of every coordinator replica.
    pub coordinators: Vec<String>,
    /// The coordinator CA's public-key pin.
    pub ca_pin: CaPin,
    pub ticket: String,
}

/// Why a bootstrap document is refused.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapDocumentError {
    #[error("bootstrap document is not valid YAML or JSON: {0}")]
    Parse(String),
    #[error("bootstrap document field {field}: {message}")]
    Field {
        field: &'static str,
        message: String,
    },
}

impl BootstrapDocument {
    /// The largest bootstrap document accepted (EC2 user data is 16 KiB).
    pub const MAX_LEN: usize = 16 * 1024;

    /// Parses and checks a bootstrap document.
    pub fn parse(text: &str) -> Result<Self, BootstrapDocumentError> {
        if text.len() > Self::MAX_LEN {
            return Err(BootstrapDocumentError::Field {
                field: "(document)",
                message: format!("is {} bytes, more than {}", text.len(), Self::MAX_LEN),
            });
        }
        let doc: Self = serde_saphyr::from_str(text)
            .map_err(|e| BootstrapDocumentError::Parse(e.to_string()))?;
        doc.check()?;
        Ok(doc)
    }

    fn check(&self) -> Result<(), BootstrapDocumentError> {
        let bad = |field, message: String| Err(BootstrapDocumentError::Field { field, message });
        if self.api_version != crate::API_VERSION {
            return bad("apiVersion", format!("must be {:?}", crate::API_VERSION));
        }
        if self.kind != BOOTSTRAP_KIND {
            return bad("kind", format!("must be {BOOTSTRAP_KIND:?}"));
        }
        if self.coordinators.is_empty() {
            return bad("coordinators", "must list at least one https:// URL".into());
        }
        for url in &self.coordinators {
            if !url.starts_with("https://") {
                return bad("coordinators", format!("{url:?} must start with https://"));
            }
        }
        if self.ticket.is_empty() || self.ticket.len() > crate::ticket::MAX_TICKET_LEN {
            return bad("ticket", "is empty or too long".into());
        }
        Ok(())
    }

    /// Renders the document as YAML.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).expect("bootstrap document serializes")
    }
}

/// Facts a machine reports about itself at registration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineFacts {
    pub hostname: String,
    /// Addresses other machines reach this one on, most preferred first.
    pub addresses: Vec<String>,
    /// The port its API server will listen on if it becomes control plane.
    pub api_server_port: u16,
    /// The port its kubelet serves `/healthz` on.
    pub kubelet_healthz_port: u16,
    pub agent_version: String,
    /// The cloud instance the agent runs on, read from instance metadata;
    /// the coordinator checks it against the instance it launched for the
    /// ticket's machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
}

/// `POST /v1/machine/register`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterRequest {
    pub ticket: String,
    /// A PEM CSR for the key the agent generated; only its key is used.
    pub csr_pem: String,
    pub facts: MachineFacts,
}

/// The answer to a registration.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterResponse {
    pub machine_name: String,
    pub machine_uid: String,
    /// The agent's client certificate (PEM), valid until `not_after`.
    pub certificate_pem: String,
    #[serde(with = "time::serde::rfc3339")]
    pub not_after: OffsetDateTime,
    /// The coordinator CA certificate, which the agent checks against its pin.
    pub coordinator_ca_pem: String,
    pub heartbeat_interval_seconds: u64,
}

/// `POST /v1/machine/certificate`: renew the client certificate.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenewRequest {
    pub csr_pem: String,
}

/// The answer to a renewal.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenewResponse {
    pub certificate_pem: String,
    #[serde(with = "time::serde::rfc3339")]
    pub not_after: OffsetDateTime,
}

/// Health of one probed component.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum ProbeState {
    #[default]
    Unknown,
    Healthy,
    Unhealthy,
}

/// One probe's latest result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Probe {
    pub state: ProbeState,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// What the agent saw when it last probed its machine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthReport {
    /// kubelet `/healthz`.
    pub kubelet: Probe,
    /// API server `/readyz`, on control-plane machines only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server: Option<Probe>,
    /// Free bytes on the file system holding the agent's root.
    #[serde(default)]
    pub disk_free_bytes: u64,
}

impl HealthReport {
    /// Whether every probe that ran is healthy.
    pub fn healthy(&self) -> bool {
        self.kubelet.state == ProbeState::Healthy
            && self
                .api_server
                .as_ref()
                .is_none_or(|p| p.state == ProbeState::Healthy)
    }
}

/// Where bootstrap stands, as the agent reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootstrapReport {
    /// The step in progress or last finished, e.g. `kubeadm-join`.
    pub step: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<CommandFailure>,
}

/// A failed command, with enough to debug it without logging in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandFailure {
    /// The command line as run.
    pub command: String,
    /// The exit code, absent when killed by a signal or not started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The last lines of its combined output.
    pub output_tail: Vec<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
}

/// What the agent is doing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum AgentPhase {
    /// Registered and unassigned.
    #[default]
    Waiting,
    Bootstrapping,
    Running,
    Failed,
    Resetting,
}

/// `POST /v1/machine/heartbeat`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeartbeatRequest {
    pub phase: AgentPhase,
    /// The assignment generation the agent has applied (0: none).
    pub applied_generation: u64,
    pub health: HealthReport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapReport>,
    /// Results of directives carried out since the last heartbeat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub directive_results: Vec<DirectiveResult>,
}

/// The bootstrap step an agent reports while and after running
/// `kubeadm init`: from then on the init token it fetched is in use.
pub const KUBEADM_INIT_STEP: &str = "kubeadm-init";

/// The most characters of a reported message (probe messages, directive
/// results, a failed command line) the coordinator keeps.
pub const MAX_REPORTED_CHARS: usize = 1024;
/// The most lines of a failed command's output tail the coordinator keeps
/// (the last ones), and the most characters of each.
pub const MAX_OUTPUT_TAIL_LINES: usize = 40;
pub const MAX_OUTPUT_LINE_CHARS: usize = 512;
/// The most characters of a bootstrap step or directive id.
pub const MAX_REPORTED_ID_CHARS: usize = 64;
/// The most directive results one heartbeat may carry.
pub const MAX_DIRECTIVE_RESULTS: usize = 32;

/// Cuts `s` to at most `max` characters (`max` > 40), ending it with how
/// many bytes were cut. Returns whether it cut anything; cutting twice
/// changes nothing more.
pub fn truncate_reported(s: &mut String, max: usize) -> bool {
    if s.char_indices().nth(max).is_none() {
        return false;
    }
    // Room for the note, whose number has at most 20 digits.
    let keep = max.saturating_sub(40);
    let at = s.char_indices().nth(keep).map_or(s.len(), |(i, _)| i);
    let cut = s.len() - at;
    s.truncate(at);
    s.push_str(&format!("… ({cut} bytes cut)"));
    true
}

impl HeartbeatRequest {
    /// Bounds every string and list a machine reports, so what the
    /// coordinator stores and shows stays small whatever an agent (or
    /// someone holding its certificate) sends: messages are cut to
    /// [`MAX_REPORTED_CHARS`], an output tail keeps its last
    /// [`MAX_OUTPUT_TAIL_LINES`] lines of at most [`MAX_OUTPUT_LINE_CHARS`],
    /// and directive results beyond [`MAX_DIRECTIVE_RESULTS`] are dropped.
    /// Returns whether anything was cut.
    pub fn bound(&mut self) -> bool {
        let mut cut = false;
        cut |= truncate_reported(&mut self.health.kubelet.message, MAX_REPORTED_CHARS);
        if let Some(a) = &mut self.health.api_server {
            cut |= truncate_reported(&mut a.message, MAX_REPORTED_CHARS);
        }
        if let Some(b) = &mut self.bootstrap {
            cut |= truncate_reported(&mut b.step, MAX_REPORTED_ID_CHARS);
            if let Some(f) = &mut b.failure {
                cut |= truncate_reported(&mut f.command, MAX_REPORTED_CHARS);
                if f.output_tail.len() > MAX_OUTPUT_TAIL_LINES {
                    f.output_tail
                        .drain(..f.output_tail.len() - MAX_OUTPUT_TAIL_LINES);
                    cut = true;
                }
                for line in &mut f.output_tail {
                    cut |= truncate_reported(line, MAX_OUTPUT_LINE_CHARS);
                }
            }
        }
        if self.directive_results.len() > MAX_DIRECTIVE_RESULTS {
            self.directive_results.truncate(MAX_DIRECTIVE_RESULTS);
            cut = true;
        }
        for r in &mut self.directive_results {
            cut |= truncate_reported(&mut r.id, MAX_REPORTED_ID_CHARS);
            cut |= truncate_reported(&mut r.message, MAX_REPORTED_CHARS);
        }
        cut
    }
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeartbeatResponse {
    /// When to send the next heartbeat.
    pub heartbeat_interval_seconds: u64,
    /// The machine's current assignment, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment: Option<AssignmentNotice>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub directives: Vec<Directive>,
}

/// Tells an agent it belongs to a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AssignmentNotice {
    pub cluster: String,
    pub role: MachineRole,
    pub generation: u64,
}

/// Something the coordinator asks an agent to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Directive {
    /// Unique; echoed in the result.
    pub id: String,
    pub action: DirectiveAction,
}

/// The actions a heartbeat reply can carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum DirectiveAction {
    /// Register a kubeadm bootstrap token in the cluster
    /// (`kubeadm token create TOKEN --ttl ...`), on a control-plane machine.
    #[serde(rename_all = "camelCase")]
    CreateBootstrapToken {
        token: crate::token::BootstrapToken,
        ttl_seconds: u64,
    },
    /// Leave the cluster (`kubeadm reset -f`) and return to the pool.
    #[serde(rename_all = "camelCase")]
    Reset { reason: String },
}

/// The outcome of a directive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DirectiveResult {
    pub id: String,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The answer of `GET /v1/machine/config` while the machine cannot bootstrap yet.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigNotReady {
    pub reason: String,
    pub retry_after_seconds: u64,
}

#[cfg(test)]
mod bound_tests {
    use super::*;

    #[test]
    fn reported_strings_are_bounded() {
        let big = "x".repeat(1 << 20);
        let mut hb = HeartbeatRequest {
            health: HealthReport {
                kubelet: Probe {
                    state: ProbeState::Unhealthy,
                    message: big.clone(),
                },
                api_server: Some(Probe {
                    state: ProbeState::Unhealthy,
                    message: "é".repeat(5000),
                }),
                disk_free_bytes: 0,
            },
            bootstrap: Some(BootstrapReport {
                step: big.clone(),
                failure: Some(CommandFailure {
                    command: big.clone(),
                    exit_code: Some(1),
                    output_tail: (0..1000).map(|i| format!("{i} {big}")).collect(),
                    at: OffsetDateTime::UNIX_EPOCH,
                }),
            }),
            directive_results: (0..1000)
                .map(|_| DirectiveResult {
                    id: big.clone(),
                    ok: true,
                    message: big.clone(),
                })
                .collect(),
            ..Default::default()
        };
        assert!(hb.bound());
        let size = serde_json::to_vec(&hb).unwrap().len();
        assert!(size < 200 * 1024, "{size} bytes after bounding");
        assert!(hb.health.kubelet.message.chars().count() <= MAX_REPORTED_CHARS);
        assert!(hb.health.kubelet.message.ends_with("bytes cut)"));
        let f = hb.bootstrap.as_ref().unwrap().failure.as_ref().unwrap();
        assert_eq!(f.output_tail.len(), MAX_OUTPUT_TAIL_LINES);
        assert!(
            f.output_tail[0].starts_with("960 "),
            "the last lines are kept"
        );
        assert_eq!(hb.directive_results.len(), MAX_DIRECTIVE_RESULTS);
        // Bounding twice changes nothing: a stored report compares equal.
        let once = hb.clone();
        assert!(!hb.bound());
        assert_eq!(hb, once);
        let mut small = HeartbeatRequest::default();
        small.health.kubelet.message = "kubelet is not running".into();
        assert!(!small.bound());
    }
}
