//! Registration: the request a machine sends with its ticket, which
//! refusals are final, and the check of the coordinator CA it gets back.

use std::net::IpAddr;

use drover_common::pin::CaPin;
use drover_common::wire::{MachineFacts, RegisterRequest};
use reqwest::StatusCode;

/// What a machine tells the coordinator about itself when it registers.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub hostname: &'a str,
    /// The address other machines reach this one on.
    pub address: IpAddr,
    pub api_server_port: u16,
    pub kubelet_healthz_port: u16,
    pub agent_version: &'a str,
    /// The cloud instance, when the bootstrap document came from instance
    /// metadata.
    pub instance_id: Option<&'a str>,
    /// Its CPUs and memory.
    pub capacity: Option<drover_common::api::Capacity>,
}

/// The registration request for a ticket and a CSR.
pub fn request(ticket: &str, csr_pem: &str, facts: Facts<'_>) -> RegisterRequest {
    RegisterRequest {
        ticket: ticket.to_owned(),
        csr_pem: csr_pem.to_owned(),
        facts: MachineFacts {
            hostname: facts.hostname.to_owned(),
            addresses: vec![facts.address.to_string()],
            api_server_port: facts.api_server_port,
            kubelet_healthz_port: facts.kubelet_healthz_port,
            agent_version: facts.agent_version.to_owned(),
            instance_id: facts.instance_id.map(str::to_owned),
            capacity: facts.capacity,
        },
    }
}

/// Whether a refusal status is final. A 4xx means the ticket was refused
/// (bad, forged, expired or already used); 408 and 429 are worth retrying.
pub fn permanent_status(status: StatusCode) -> bool {
    status.is_client_error()
        && status != StatusCode::REQUEST_TIMEOUT
        && status != StatusCode::TOO_MANY_REQUESTS
}

/// Why the coordinator CA of a registration answer is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaRefusal {
    /// The certificate cannot be read.
    Unreadable(String),
    /// It is a readable certificate with another pin.
    Mismatch(CaPin),
}

/// Checks the coordinator CA certificate a registration answer carries
/// against the pin of the bootstrap document.
pub fn check_coordinator_ca(pin: &CaPin, ca_pem: &str) -> Result<(), CaRefusal> {
    match CaPin::from_cert_pem(ca_pem) {
        Ok(got) if got == *pin => Ok(()),
        Ok(got) => Err(CaRefusal::Mismatch(got)),
        Err(e) => Err(CaRefusal::Unreadable(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::pki::CertificateAuthority;

    #[test]
    fn statuses() {
        assert!(permanent_status(StatusCode::UNAUTHORIZED));
        assert!(permanent_status(StatusCode::FORBIDDEN));
        assert!(permanent_status(StatusCode::CONFLICT));
        assert!(permanent_status(StatusCode::BAD_REQUEST));
        assert!(!permanent_status(StatusCode::TOO_MANY_REQUESTS));
        assert!(!permanent_status(StatusCode::REQUEST_TIMEOUT));
        assert!(!permanent_status(StatusCode::SERVICE_UNAVAILABLE));
    }

    #[test]
    fn request_carries_the_facts() {
        let r = request(
            "dt1.t",
            "csr",
            Facts {
                hostname: "host-1",
                address: "10.0.0.7".parse().unwrap(),
                api_server_port: 6443,
                kubelet_healthz_port: 10248,
                agent_version: "1.2.3",
                instance_id: Some("i-1"),
                capacity: None,
            },
        );
        assert_eq!(r.ticket, "dt1.t");
        assert_eq!(r.csr_pem, "csr");
        assert_eq!(r.facts.hostname, "host-1");
        assert_eq!(r.facts.addresses, ["10.0.0.7"]);
        assert_eq!(
            (r.facts.api_server_port, r.facts.kubelet_healthz_port),
            (6443, 10248)
        );
        assert_eq!(r.facts.agent_version, "1.2.3");
        assert_eq!(r.facts.instance_id.as_deref(), Some("i-1"));
    }

    #[test]
    fn coordinator_ca_must_match_the_pin() {
        let ca = CertificateAuthority::generate("coordinator-ca").unwrap();
        let other = CertificateAuthority::generate("other").unwrap();
        let pin = CaPin::from_cert_pem(&ca.cert_pem).unwrap();
        assert_eq!(check_coordinator_ca(&pin, &ca.cert_pem), Ok(()));
        assert_eq!(
            check_coordinator_ca(&pin, &other.cert_pem),
            Err(CaRefusal::Mismatch(
                CaPin::from_cert_pem(&other.cert_pem).unwrap()
            ))
        );
        assert!(matches!(
            check_coordinator_ca(&pin, "not a certificate"),
            Err(CaRefusal::Unreadable(_))
        ));
    }
}
