//! Heartbeats: the request a machine sends, and which directive results an
//! accepted heartbeat delivered.

use drover_common::wire::{
    AgentPhase, BootstrapReport, DirectiveResult, EtcdReport, HealthReport, HeartbeatRequest,
    NodesReport,
};

/// A heartbeat reporting the machine's phase, the generation of its
/// assignment (0 without one), its health, its bootstrap step and the
/// directive results not yet delivered.
pub fn request(
    phase: AgentPhase,
    applied_generation: u64,
    health: HealthReport,
    bootstrap: Option<BootstrapReport>,
    pending_results: &[DirectiveResult],
    etcd: Option<EtcdReport>,
    nodes: Option<NodesReport>,
) -> HeartbeatRequest {
    HeartbeatRequest {
        phase,
        applied_generation,
        health,
        bootstrap,
        directive_results: pending_results.to_vec(),
        etcd,
        nodes,
        kubeadm_version: None,
        certificates: None,
        heartbeat_fallback: None,
        datagrams: true,
        coordinators_digest: None,
    }
}

/// Drops the results an accepted heartbeat delivered (the first ones, as
/// results found meanwhile were appended); returns whether any were.
pub fn delivered(pending: &mut Vec<DirectiveResult>, sent: &HeartbeatRequest) -> bool {
    let n = sent.directive_results.len().min(pending.len());
    pending.drain(..n);
    n > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::wire::{Probe, ProbeState};

    fn result(id: &str) -> DirectiveResult {
        DirectiveResult {
            id: id.into(),
            ok: true,
            message: String::new(),
        }
    }

    #[test]
    fn results_are_sent_until_delivered() {
        let health = HealthReport {
            kubelet: Probe {
                state: ProbeState::Healthy,
                message: String::new(),
            },
            api_server: None,
            disk_free_bytes: 1,
            problems: vec![],
            boot_id: None,
        };
        let mut pending = vec![result("d1")];
        let sent = request(AgentPhase::Running, 3, health, None, &pending, None, None);
        assert_eq!(sent.phase, AgentPhase::Running);
        assert_eq!(sent.applied_generation, 3);
        assert_eq!(sent.directive_results, pending);
        // A result found while the heartbeat was under way stays pending.
        pending.push(result("d2"));
        assert!(delivered(&mut pending, &sent));
        assert_eq!(pending, [result("d2")]);
        let empty = request(
            AgentPhase::Waiting,
            0,
            sent.health.clone(),
            None,
            &[],
            None,
            None,
        );
        assert!(!delivered(&mut pending, &empty));
        assert_eq!(pending.len(), 1);
    }
}
