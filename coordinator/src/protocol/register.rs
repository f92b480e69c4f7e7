//! Registration: a machine redeems its ticket for a client certificate.
//!
//! A pool registration ticket makes a new machine record (the registrar
//! commits it with the token's use); a created machine's ticket names its
//! record, and redeeming it is recorded on that record in the write that
//! stores the machine's facts.
//!
//! Invariant: a machine's ticket is redeemed once, by the incarnation of
//! the machine it was issued for, while the machine is not being deleted.

use std::net::IpAddr;

use drover_common::api::{
    push_event, Machine, MachinePhase, MachineRole, MachineSpec, MachineStatus, ObjectMeta,
};
use drover_common::ticket::TicketError;
use drover_common::wire::MachineFacts;
use drover_common::API_VERSION;
use time::OffsetDateTime;

use super::identity::Issued;

/// Why a registration is refused.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("too many registrations from {from}; retry in {wait} s")]
    RateLimited { from: IpAddr, wait: u64 },
    #[error("machine facts are invalid: {0}")]
    InvalidFacts(String),
    #[error(transparent)]
    Ticket(#[from] TicketError),
    #[error("this ticket was issued for another incarnation of machine {machine}")]
    OtherIncarnation { machine: String },
    #[error("machine {machine} is being deleted; its ticket is no longer valid")]
    Deleting { machine: String },
    #[error("ticket already used: machine {machine} has registered; a ticket is redeemed once")]
    Replayed { machine: String },
    #[error("machine {machine} of cluster {cluster} no longer exists; its ticket died with it")]
    MachineGone { machine: String, cluster: String },
    #[error("cluster {cluster} no longer exists; the ticket of machine {machine} died with it")]
    ClusterGone { cluster: String, machine: String },
    /// The presenting instance is not the one launched for the machine.
    #[error("{0}")]
    WrongInstance(String),
    /// The provider could not confirm the instance now.
    #[error("{0}")]
    InstanceUnchecked(String),
}

/// Checks the facts a registering machine reports, before anything logs
/// them: a refused host name never reaches the log.
pub fn check_facts(f: &MachineFacts) -> Result<(), RegisterError> {
    let mut problems = vec![];
    // The host name becomes the Kubernetes node name: a DNS-1123 subdomain.
    if let Err(e) = drover_common::names::check_hostname(&f.hostname) {
        problems.push(e.to_string());
    }
    if f.addresses.is_empty() || f.addresses.len() > 16 {
        problems.push("addresses must list 1 to 16 IP addresses".to_string());
    }
    for a in &f.addresses {
        if a.parse::<IpAddr>().is_err() {
            problems.push(format!("address {a:?} is not an IP address"));
        }
    }
    if f.api_server_port == 0 || f.kubelet_healthz_port == 0 {
        problems.push("apiServerPort and kubeletHealthzPort must be set".to_string());
    }
    if f.agent_version.len() > 64 || f.agent_version.chars().any(char::is_control) {
        problems.push(
            "agentVersion must be at most 64 characters without control characters".to_string(),
        );
    }
    if let Some(c) = &f.capacity {
        if c.cpus == 0 || c.cpus > 4096 {
            problems.push(format!("capacity.cpus must be 1 to 4096, got {}", c.cpus));
        }
        if !(64 << 20..=64 << 40).contains(&c.memory_bytes) {
            problems.push(format!(
                "capacity.memoryBytes must be 64 MiB to 64 TiB, got {}",
                c.memory_bytes
            ));
        }
    }
    if let Some(id) = &f.instance_id {
        if id.is_empty()
            || id.len() > 64
            || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            problems.push(format!(
                "instanceId {:?} must be 1 to 64 letters, digits and '-'",
                id.chars().take(80).collect::<String>()
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(RegisterError::InvalidFacts(problems.join("; ")))
    }
}

/// The record of a machine registering into pool `pool` with token
/// `token_id`, named `name` with UID `uid`, issued `issued` at `now`. The
/// token's labels join its own when the registrar redeems the token.
pub fn pool_machine(
    name: &str,
    uid: &str,
    pool: &str,
    token_id: &str,
    facts: &MachineFacts,
    issued: &Issued,
    now: OffsetDateTime,
) -> Machine {
    let labels = [("drover.dev/pool".to_owned(), pool.to_owned())].into();
    Machine {
        api_version: API_VERSION.into(),
        kind: "Machine".into(),
        metadata: ObjectMeta {
            name: name.to_owned(),
            uid: Some(uid.to_owned()),
            generation: 1,
            labels,
            creation_timestamp: Some(now),
            ..Default::default()
        },
        spec: MachineSpec {
            bmc: None,
            pool: pool.to_owned(),
            provider: None,
            assignment: None,
        },
        status: MachineStatus {
            phase: MachinePhase::Registered,
            hostname: facts.hostname.clone(),
            addresses: facts.addresses.clone(),
            api_server_port: facts.api_server_port,
            kubelet_healthz_port: facts.kubelet_healthz_port,
            agent_version: facts.agent_version.clone(),
            capacity: facts.capacity,
            last_heartbeat_time: Some(now),
            certificate_not_after: Some(issued.cert.not_after),
            certificate_key: Some(issued.key_pin.clone()),
            events: vec![drover_common::api::Event {
                time: now,
                reason: "Registered".into(),
                message: format!("registered into pool {pool} with token {token_id}"),
            }],
            ..Default::default()
        },
    }
}

/// What a created machine's ticket names.
#[derive(Debug, Clone, Copy)]
pub struct TicketFor<'a> {
    pub cluster: &'a str,
    pub machine: &'a str,
    pub machine_uid: &'a str,
    pub role: MachineRole,
}

impl TicketFor<'_> {
    /// Whether machine record `current` may redeem this ticket now.
    pub fn redeemable_by(&self, current: &Machine) -> Result<(), RegisterError> {
        let machine = self.machine.to_owned();
        let assigned = current
            .spec
            .assignment
            .as_ref()
            .map(|a| (a.cluster.as_str(), a.role));
        if current.metadata.uid.as_deref() != Some(self.machine_uid)
            || assigned != Some((self.cluster, self.role))
        {
            return Err(RegisterError::OtherIncarnation { machine });
        }
        if matches!(
            current.status.phase,
            MachinePhase::Deleting | MachinePhase::Deleted
        ) {
            return Err(RegisterError::Deleting { machine });
        }
        if current.status.ticket_redeemed {
            return Err(RegisterError::Replayed { machine });
        }
        Ok(())
    }

    /// Redeems this ticket on machine record `m`, storing the machine's
    /// `facts` and its certificate `issued` at `now`; refused as
    /// [`TicketFor::redeemable_by`] refuses.
    pub fn redeem(
        &self,
        m: &mut Machine,
        facts: &MachineFacts,
        issued: &Issued,
        now: OffsetDateTime,
    ) -> Result<(), RegisterError> {
        self.redeemable_by(m)?;
        m.status.ticket_redeemed = true;
        m.status.phase = MachinePhase::Assigned;
        m.status.hostname = facts.hostname.clone();
        m.status.addresses = facts.addresses.clone();
        m.status.api_server_port = facts.api_server_port;
        m.status.kubelet_healthz_port = facts.kubelet_healthz_port;
        m.status.agent_version = facts.agent_version.clone();
        m.status.capacity = facts.capacity;
        m.status.last_heartbeat_time = Some(now);
        m.status.certificate_not_after = Some(issued.cert.not_after);
        m.status.certificate_key = Some(issued.key_pin.clone());
        push_event(
            &mut m.status.events,
            "Registered",
            format!(
                "agent {} registered from {}",
                facts.agent_version,
                facts.addresses.join(", ")
            ),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::Assignment;

    fn facts() -> MachineFacts {
        MachineFacts {
            hostname: "node-1".into(),
            addresses: vec!["192.0.2.10".into()],
            api_server_port: 6443,
            kubelet_healthz_port: 10248,
            agent_version: "0.1.0".into(),
            instance_id: None,
            capacity: Some(drover_common::api::Capacity {
                cpus: 2,
                memory_bytes: 4 << 30,
            }),
        }
    }

    #[test]
    fn facts_are_checked_before_anything_keeps_them() {
        assert!(check_facts(&facts()).is_ok());
        let none = MachineFacts {
            capacity: Some(drover_common::api::Capacity {
                cpus: 0,
                memory_bytes: 1,
            }),
            ..facts()
        };
        let e = check_facts(&none).unwrap_err().to_string();
        assert!(
            e.contains("capacity.cpus") && e.contains("capacity.memoryBytes"),
            "{e}"
        );
        let bad = MachineFacts {
            hostname: "Not A Host".into(),
            addresses: vec!["nowhere".into()],
            api_server_port: 0,
            instance_id: Some("i_1".into()),
            ..facts()
        };
        let e = check_facts(&bad).unwrap_err().to_string();
        assert!(e.starts_with("machine facts are invalid: "), "{e}");
        for part in [
            "\"nowhere\" is not an IP address",
            "apiServerPort",
            "instanceId",
        ] {
            assert!(e.contains(part), "{e}");
        }
    }

    #[test]
    fn a_ticket_is_redeemed_once_by_its_own_incarnation() {
        let ticket = TicketFor {
            cluster: "c",
            machine: "m",
            machine_uid: "uid-1",
            role: MachineRole::Worker,
        };
        let mut m = Machine {
            api_version: API_VERSION.into(),
            kind: "Machine".into(),
            metadata: ObjectMeta {
                name: "m".into(),
                uid: Some("uid-1".into()),
                ..Default::default()
            },
            spec: MachineSpec {
                bmc: None,
                pool: "c-workers".into(),
                provider: None,
                assignment: Some(Assignment {
                    cluster: "c".into(),
                    cluster_uid: "cu".into(),
                    machine_pool: "workers".into(),
                    role: MachineRole::Worker,
                    generation: 1,
                    assigned_at: None,
                    replaces: None,
                    kubernetes_version: None,
                    image: None,
                }),
            },
            status: MachineStatus::default(),
        };
        let mut other = m.clone();
        other.metadata.uid = Some("uid-0".into());
        assert!(matches!(
            ticket.redeemable_by(&other),
            Err(RegisterError::OtherIncarnation { .. })
        ));
        let ca = drover_common::pki::CertificateAuthority::generate("test CA").unwrap();
        let key = rcgen_key();
        let issued =
            super::super::identity::issue(&ca, &key, "m", std::time::Duration::from_secs(3600))
                .unwrap();
        let now = drover_common::now();
        ticket.redeem(&mut m, &facts(), &issued, now).unwrap();
        assert!(m.status.ticket_redeemed);
        assert_eq!(m.status.phase, MachinePhase::Assigned);
        assert_eq!(
            m.status.certificate_key.as_deref(),
            Some(issued.key_pin.as_str())
        );
        assert_eq!(m.status.events.last().unwrap().reason, "Registered");
        assert!(matches!(
            ticket.redeem(&mut m, &facts(), &issued, now),
            Err(RegisterError::Replayed { .. })
        ));
    }

    /// A CSR for a fresh key.
    fn rcgen_key() -> String {
        drover_common::pki::generate_key_and_csr("m").unwrap().1
    }
}
