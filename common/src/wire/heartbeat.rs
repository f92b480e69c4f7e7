//! The heartbeat: what an agent reports (bounded before the coordinator
//! compares or stores it) and what the answer tells it (its assignment and
//! directives).

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use super::directive::{Directive, DirectiveResult};
pub use crate::objects::report::{
    BootstrapReport, CommandFailure, HealthReport, Probe, ProbeState,
};
use crate::objects::MachineRole;

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
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeartbeatRequest {
    pub phase: AgentPhase,
    /// The assignment generation the agent has applied (0: none).
    pub applied_generation: u64,
    pub health: HealthReport,
    pub bootstrap: Option<BootstrapReport>,
    /// Results of directives carried out since the last heartbeat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub directive_results: Vec<DirectiveResult>,
    /// The cluster's etcd members as this control plane sees them, sent
    /// when they change (and now and then).
    pub etcd: Option<EtcdReport>,
    /// The cluster's Nodes as this control plane's API server lists them,
    /// sent when they change (and now and then).
    pub nodes: Option<NodesReport>,
    /// The version of the machine's kubeadm (`kubeadm version -o short`),
    /// sent when the agent starts and when it changes (an in-place
    /// upgrade).
    pub kubeadm_version: Option<String>,
    /// When the first of this control plane's kubeadm certificates
    /// expires, sent when it changes (and when the agent starts).
    pub certificates: Option<crate::objects::CertificateExpiry>,
    /// Why this machine heartbeats over HTTPS although it was offered
    /// datagrams (they went unanswered), while it does.
    pub heartbeat_fallback: Option<String>,
    /// The agent takes datagram offers: only then does the answer carry
    /// one (an agent from before datagram heartbeats refuses an answer
    /// with a field it does not know).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub datagrams: bool,
    /// [`coordinators_digest`] of the coordinator URLs the agent holds.
    /// Only an agent that sends it is sent a new list
    /// ([`HeartbeatResponse::coordinators`]): an agent from before it
    /// refuses an answer with a field it does not know.
    pub coordinators_digest: Option<String>,
}

/// What a control-plane agent reads of the cluster's Nodes.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodesReport {
    #[serde(default)]
    pub nodes: Vec<crate::objects::ClusterNode>,
    /// Why the Nodes could not be read (then `nodes` is empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// `ClusterConfiguration.kubernetesVersion` in the ConfigMap
    /// `kube-system/kubeadm-config`: the control-plane version that
    /// `kubeadm join --control-plane` deploys. Absent when it could not be
    /// read.
    pub kubeadm_config_version: Option<String>,
    /// Whether the cluster's endpoint (the server `admin.conf` names)
    /// answered `GET /readyz` with 200. Absent when the machine has no
    /// `admin.conf` to read it from.
    pub endpoint_ready: Option<bool>,
}

/// The most Nodes one report may carry.
pub const MAX_NODES: usize = 1100;

/// What a control-plane agent reads of its etcd.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdReport {
    #[serde(default)]
    pub members: Vec<crate::objects::EtcdMember>,
    /// Why the member list could not be read (then `members` is empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// The most etcd members one report may carry.
pub const MAX_ETCD_MEMBERS: usize = 16;

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

/// Keeps the first `max` items of `list`; returns whether any was dropped.
fn truncate_list<T>(list: &mut Vec<T>, max: usize) -> bool {
    let cut = list.len() > max;
    list.truncate(max);
    cut
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
        // Problems: known types only, each once, so an agent cannot add
        // conditions of its own making to its machine.
        let before = self.health.problems.len();
        let mut seen = Vec::new();
        self.health.problems.retain(|p| {
            let known = crate::objects::NODE_PROBLEM_TYPES.contains(&p.type_.as_str())
                && !seen.contains(&p.type_);
            if known {
                seen.push(p.type_.clone());
            }
            known
        });
        cut |= self.health.problems.len() != before;
        for p in &mut self.health.problems {
            cut |= truncate_reported(&mut p.reason, MAX_REPORTED_ID_CHARS);
            cut |= truncate_reported(&mut p.message, MAX_REPORTED_CHARS);
        }
        if let Some(b) = &mut self.health.boot_id {
            cut |= truncate_reported(b, MAX_REPORTED_ID_CHARS);
        }
        cut |= truncate_list(&mut self.directive_results, MAX_DIRECTIVE_RESULTS);
        for r in &mut self.directive_results {
            cut |= truncate_reported(&mut r.id, MAX_REPORTED_ID_CHARS);
            cut |= truncate_reported(&mut r.message, MAX_REPORTED_CHARS);
        }
        if let Some(n) = &mut self.nodes {
            cut |= truncate_reported(&mut n.error, MAX_REPORTED_CHARS);
            cut |= truncate_list(&mut n.nodes, MAX_NODES);
            for node in &mut n.nodes {
                cut |= truncate_reported(&mut node.name, 253);
                cut |= truncate_reported(&mut node.ready, MAX_REPORTED_ID_CHARS);
                cut |= truncate_reported(&mut node.kubelet_version, MAX_REPORTED_ID_CHARS);
            }
        }
        if let Some(v) = &mut self.kubeadm_version {
            cut |= truncate_reported(v, MAX_REPORTED_ID_CHARS);
        }
        if let Some(c) = &mut self.certificates {
            cut |= truncate_reported(&mut c.certificate, MAX_REPORTED_ID_CHARS);
        }
        if let Some(f) = &mut self.heartbeat_fallback {
            cut |= truncate_reported(f, MAX_REPORTED_CHARS);
        }
        if let Some(e) = &mut self.etcd {
            cut |= truncate_reported(&mut e.error, MAX_REPORTED_CHARS);
            cut |= truncate_list(&mut e.members, MAX_ETCD_MEMBERS);
            for m in &mut e.members {
                cut |= truncate_reported(&mut m.id, MAX_REPORTED_ID_CHARS);
                cut |= truncate_reported(&mut m.name, MAX_REPORTED_ID_CHARS);
                for urls in [&mut m.peer_urls, &mut m.client_urls] {
                    cut |= truncate_list(urls, 4);
                    for u in urls.iter_mut() {
                        cut |= truncate_reported(u, 256);
                    }
                }
            }
        }
        cut
    }
}

/// The answer to a heartbeat.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeartbeatResponse {
    /// When to send the next heartbeat.
    pub heartbeat_interval_seconds: u64,
    /// The machine's current assignment, if any.
    pub assignment: Option<AssignmentNotice>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub directives: Vec<Directive>,
    /// Present when the machine may send its next heartbeats as datagrams
    /// (see [`crate::wire::datagram`]) while its report stays the same:
    /// absent, it heartbeats over HTTPS.
    pub datagram: Option<super::datagram::DatagramOffer>,
    /// The coordinator URLs this machine should use from now on (every
    /// registered replica, the leader's first), present only when they
    /// differ from the `coordinatorsDigest` of the heartbeat, and never to
    /// an agent whose heartbeat has no `coordinatorsDigest` (it predates
    /// the field and would refuse the answer). Checked by
    /// [`check_coordinator_urls`] on both sides.
    pub coordinators: Option<Vec<String>>,
}

/// The most coordinator URLs a machine keeps (a bootstrap document or a
/// heartbeat answer may name).
pub const MAX_COORDINATOR_URLS: usize = 16;
/// The longest coordinator URL, in bytes.
pub const MAX_COORDINATOR_URL_LEN: usize = 256;

/// Why a list of coordinator URLs is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordinatorUrlsError {
    #[error("the list is empty")]
    Empty,
    #[error("the list has {0} URLs, more than {MAX_COORDINATOR_URLS}")]
    TooMany(usize),
    #[error("{url:?} {why}")]
    Url { url: String, why: &'static str },
}

/// Checks a list of coordinator URLs a machine is told to use: 1 to
/// [`MAX_COORDINATOR_URLS`] distinct `https://host[:port]` URLs (no path
/// but `/`, no query or fragment) of at most [`MAX_COORDINATOR_URL_LEN`]
/// bytes.
pub fn check_coordinator_urls(urls: &[String]) -> Result<(), CoordinatorUrlsError> {
    if urls.is_empty() {
        return Err(CoordinatorUrlsError::Empty);
    }
    if urls.len() > MAX_COORDINATOR_URLS {
        return Err(CoordinatorUrlsError::TooMany(urls.len()));
    }
    for (i, url) in urls.iter().enumerate() {
        check_coordinator_url(url).map_err(|why| CoordinatorUrlsError::Url {
            url: url.chars().take(MAX_COORDINATOR_URL_LEN).collect(),
            why,
        })?;
        if urls[..i].contains(url) {
            return Err(CoordinatorUrlsError::Url {
                url: url.clone(),
                why: "is listed twice",
            });
        }
    }
    Ok(())
}

fn check_coordinator_url(url: &str) -> Result<(), &'static str> {
    if url.len() > MAX_COORDINATOR_URL_LEN {
        return Err("is too long");
    }
    let Some(rest) = url.strip_prefix("https://") else {
        return Err("must start with https://");
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() {
        return Err("names no host");
    }
    if authority
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || "/?#@\\".contains(c))
    {
        return Err("must be https://host[:port] with no path, query, fragment or user");
    }
    Ok(())
}

/// A short digest (16 hex digits) of a list of coordinator URLs as a set:
/// order, duplicates and a trailing `/` do not change it, so a list that
/// names the same replicas in another order is not sent again.
pub fn coordinators_digest(urls: &[String]) -> String {
    use sha2::Digest;
    let mut set: Vec<&str> = urls.iter().map(|u| u.trim_end_matches('/')).collect();
    set.sort_unstable();
    set.dedup();
    let mut h = sha2::Sha256::new();
    h.update(b"drover coordinators v1\0");
    for u in set {
        h.update(u.as_bytes());
        h.update(b"\n");
    }
    hex::encode(&h.finalize()[..8])
}

/// Tells an agent it belongs to a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AssignmentNotice {
    pub cluster: String,
    pub role: MachineRole,
    pub generation: u64,
}

/// The digest a heartbeat datagram ([`super::datagram`]) carries of the heartbeat report it stands for:
/// the first 8 bytes of a SHA-256 over the JSON of the report's steady
/// part, the report less what it delivers once (directive results, the
/// etcd members and Nodes a control plane repeats now and then, the
/// kubeadm version, certificate expiry). The agent sends a datagram only
/// while its report is quiet (delivers none of those) and its digest
/// equals that of the last report the coordinator accepted over HTTPS; the
/// coordinator compares the datagram's digest with that report's: any
/// change goes over HTTPS. Leaving out what is delivered once lets a
/// control plane go back to datagrams at the heartbeat after a refresh of
/// its cluster view, not two heartbeats later.
pub fn status_digest(report: &HeartbeatRequest) -> [u8; 8] {
    use sha2::{Digest, Sha256};
    let steady = HeartbeatRequest {
        directive_results: Vec::new(),
        etcd: None,
        nodes: None,
        kubeadm_version: None,
        certificates: None,
        ..report.clone()
    };
    let json = serde_json::to_vec(&steady).expect("a heartbeat report serialises");
    let mut h = Sha256::new();
    h.update(b"drover heartbeat digest v1\0");
    h.update(&json);
    h.finalize()[..8].try_into().expect("8 bytes")
}

#[cfg(test)]
mod bound_tests {
    use time::OffsetDateTime;

    use super::*;
    use crate::objects::{NodeProblem, DISK_PRESSURE, READ_ONLY_FILESYSTEM};

    #[test]
    fn only_known_problems_are_kept_once_each_and_bounded() {
        let problem = |t: &str, message: String| NodeProblem {
            type_: t.into(),
            reason: "R".repeat(500),
            message,
        };
        let mut hb = HeartbeatRequest::default();
        hb.health.problems = vec![
            problem(DISK_PRESSURE, "x".repeat(1 << 20)),
            problem(
                "Ready",
                "an agent may not set the conditions it likes".into(),
            ),
            problem(DISK_PRESSURE, "the same type again".into()),
            problem(READ_ONLY_FILESYSTEM, "/ is read-only".into()),
        ];
        assert!(hb.bound());
        let types: Vec<&str> = hb
            .health
            .problems
            .iter()
            .map(|p| p.type_.as_str())
            .collect();
        assert_eq!(types, [DISK_PRESSURE, READ_ONLY_FILESYSTEM]);
        let disk = &hb.health.problems[0];
        assert!(disk.reason.chars().count() <= MAX_REPORTED_ID_CHARS);
        assert!(disk.message.chars().count() <= MAX_REPORTED_CHARS);
        assert!(disk.message.ends_with(&format!(
            "({} bytes cut)",
            (1 << 20) - (MAX_REPORTED_CHARS - 40)
        )));
        assert_eq!(hb.health.problems[1].message, "/ is read-only");
        assert!(!hb.bound(), "bounding twice cuts nothing more");
    }

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
                problems: vec![],
                boot_id: Some(big.clone()),
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
        let boot = hb.health.boot_id.as_deref().unwrap();
        assert!(boot.chars().count() <= MAX_REPORTED_ID_CHARS, "{boot}");
        // Bounding twice changes nothing: a stored report compares equal.
        let once = hb.clone();
        assert!(!hb.bound());
        assert_eq!(hb, once);
        let mut small = HeartbeatRequest::default();
        small.health.kubelet.message = "kubelet is not running".into();
        assert!(!small.bound());
    }

    #[test]
    fn a_status_digest_covers_the_steady_report_only() {
        let report = |generation| HeartbeatRequest {
            applied_generation: generation,
            ..Default::default()
        };
        let d = status_digest(&report(3));
        assert_eq!(d, status_digest(&report(3)));
        assert_ne!(d, status_digest(&report(4)));
        // What a report delivers once is not part of its steady state.
        let refresh = HeartbeatRequest {
            nodes: Some(Default::default()),
            etcd: Some(Default::default()),
            kubeadm_version: Some("v1.31.1".into()),
            ..report(3)
        };
        assert_eq!(d, status_digest(&refresh));
    }
}
