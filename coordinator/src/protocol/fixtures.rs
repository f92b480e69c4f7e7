//! Machines, heartbeats and directive results the protocol's tests (and the
//! machine service's) start from.

use drover_common::api::{Machine, ObjectMeta};
use drover_common::wire::{AgentPhase, DirectiveResult, HealthReport, HeartbeatRequest};

/// Machine `name` with an empty spec and status.
pub fn machine(name: &str) -> Machine {
    Machine {
        api_version: drover_common::API_VERSION.into(),
        kind: "Machine".into(),
        metadata: ObjectMeta {
            name: name.into(),
            ..Default::default()
        },
        spec: Default::default(),
        status: Default::default(),
    }
}

/// A heartbeat in `phase` at `generation` that reports nothing else.
pub fn heartbeat(phase: AgentPhase, generation: u64) -> HeartbeatRequest {
    HeartbeatRequest {
        phase,
        applied_generation: generation,
        health: HealthReport::default(),
        bootstrap: None,
        directive_results: vec![],
        heartbeat_fallback: None,
        datagrams: false,
        etcd: None,
        nodes: None,
        kubeadm_version: None,
        certificates: None,
        coordinators_digest: None,
    }
}

/// The result of directive `id`.
pub fn result(id: &str, ok: bool, message: &str) -> DirectiveResult {
    DirectiveResult {
        id: id.into(),
        ok,
        message: message.into(),
    }
}
