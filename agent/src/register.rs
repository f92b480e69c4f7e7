//! Registration: redeeming the bootstrap ticket for a machine identity.

use std::time::Duration;

use drover_common::api::Problem;
use drover_common::pin::CaPin;
use drover_common::pki::{self, PkiError};
use drover_common::wire::{BootstrapDocument, RegisterResponse};
use reqwest::StatusCode;

use crate::address::advertise_address;
use crate::api::{ApiError, CoordinatorClient, Timeouts};
use crate::backoff::Backoff;
use crate::protocol::register::{self as protocol, permanent_status, CaRefusal, Facts};
use crate::protocol::timing::rfc3339;
use crate::settings::Settings;
use crate::shutdown::Shutdown;
use crate::state::{State, StateError, StateStore, STATE_VERSION};
use crate::tls::{self, PinMismatch, TlsError};

/// Why registration ended without an identity.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("the coordinator refused the registration ({status}): {title}{}", detail_suffix(.detail))]
    Refused {
        status: StatusCode,
        title: String,
        detail: String,
    },
    #[error(transparent)]
    PinMismatch(#[from] PinMismatch),
    #[error("the coordinator answered with a CA certificate pinned {got}, not the pinned {pinned}; refusing it")]
    CaMismatch { pinned: CaPin, got: String },
    #[error("cannot create the machine key and CSR: {0}")]
    Pki(#[from] PkiError),
    #[error("cannot set up TLS: {0}")]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Client(ApiError),
    #[error("registered as {machine}, but cannot save the identity: {source}")]
    Save { machine: String, source: StateError },
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

impl RegisterError {
    /// Whether retrying cannot help: the ticket or the pin is wrong.
    pub fn is_permanent_refusal(&self) -> bool {
        matches!(
            self,
            RegisterError::Refused { .. }
                | RegisterError::PinMismatch(_)
                | RegisterError::CaMismatch { .. }
        )
    }
}

/// A new identity and the first heartbeat interval.
#[derive(Debug)]
pub struct Registered {
    pub state: State,
    pub heartbeat_interval: Duration,
}

/// Registers with the coordinator, retrying transient failures with back-off,
/// and saves the new identity. Returns `None` when shutdown was requested.
pub async fn register(
    doc: &BootstrapDocument,
    instance_id: Option<&str>,
    settings: &Settings,
    store: &StateStore,
    shutdown: &mut Shutdown,
) -> Result<Option<Registered>, RegisterError> {
    let client = CoordinatorClient::new(
        &doc.coordinators,
        tls::pinned_config(&doc.ca_pin)?,
        Timeouts::default(),
    )
    .map_err(RegisterError::Client)?;
    let (key_pem, csr_pem) = pki::generate_key_and_csr(&settings.hostname)?;
    let mut backoff = Backoff::standard();
    let mut attempt = 0u32;
    tracing::info!(
        coordinators = ?doc.coordinators,
        ca_pin = %doc.ca_pin,
        hostname = %settings.hostname,
        "registering with the coordinator"
    );
    let response = loop {
        attempt += 1;
        let outcome = match advertise_address(settings, &doc.coordinators).await {
            Ok(address) => {
                let request = protocol::request(
                    &doc.ticket,
                    &csr_pem,
                    Facts {
                        hostname: &settings.hostname,
                        address,
                        api_server_port: settings.api_server_port,
                        kubelet_healthz_port: settings.kubelet_healthz_port(),
                        agent_version: env!("CARGO_PKG_VERSION"),
                        instance_id,
                        capacity: drover_common::api::Capacity::of_this_host(),
                    },
                );
                tokio::select! {
                    r = client.register(&request) => r.map_err(Some),
                    () = shutdown.requested() => return Ok(None),
                }
            }
            Err(e) => {
                tracing::warn!(attempt, error = %e, "cannot determine the advertise address; retrying");
                Err(None)
            }
        };
        let delay = backoff.next_delay();
        match outcome {
            Ok(response) => break response,
            Err(Some(ApiError::PinMismatch(m))) => return Err(m.into()),
            Err(Some(ApiError::Refused {
                status, problem, ..
            })) if permanent_status(status) => {
                return Err(refused(status, *problem));
            }
            Err(Some(e)) => {
                tracing::warn!(
                    attempt,
                    retry_in_ms = delay.as_millis() as u64,
                    error = %e,
                    "registration failed; retrying"
                );
            }
            Err(None) => {}
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.requested() => return Ok(None),
        }
    };
    let heartbeat_interval = Duration::from_secs(response.heartbeat_interval_seconds);
    let state = identity(doc, key_pem, response)?;
    store.save(&state).map_err(|source| RegisterError::Save {
        machine: state.machine_name.clone(),
        source,
    })?;
    tracing::info!(
        machine = %state.machine_name,
        uid = %state.machine_uid,
        certificate_not_after = %rfc3339(state.certificate_not_after),
        "registered"
    );
    Ok(Some(Registered {
        state,
        heartbeat_interval,
    }))
}

fn refused(status: StatusCode, problem: Problem) -> RegisterError {
    RegisterError::Refused {
        status,
        title: problem.title,
        detail: problem.detail,
    }
}

/// Builds the persisted identity from a registration answer, checking the
/// coordinator CA it carries against the pin first.
fn identity(
    doc: &BootstrapDocument,
    key_pem: String,
    response: RegisterResponse,
) -> Result<State, RegisterError> {
    if let Err(refusal) = protocol::check_coordinator_ca(&doc.ca_pin, &response.coordinator_ca_pem)
    {
        return Err(RegisterError::CaMismatch {
            pinned: doc.ca_pin.clone(),
            got: match refusal {
                CaRefusal::Mismatch(pin) => pin.to_string(),
                CaRefusal::Unreadable(e) => format!("(unreadable: {e})"),
            },
        });
    }
    // Fail now, not at the first heartbeat, if the answer is unusable.
    tls::mtls_config(
        &response.coordinator_ca_pem,
        &response.certificate_pem,
        &key_pem,
    )?;
    Ok(State {
        version: STATE_VERSION,
        coordinators: doc.coordinators.clone(),
        ca_pin: doc.ca_pin.clone(),
        coordinator_ca_pem: response.coordinator_ca_pem,
        machine_name: response.machine_name,
        machine_uid: response.machine_uid,
        key_pem,
        certificate_pem: response.certificate_pem,
        certificate_not_after: response.not_after,
        bootstrap: None,
        retired_generation: 0,
        completed_directives: Vec::new(),
        pending_results: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::pki::{CertificateAuthority, LeafSpec, LeafUsage};

    #[test]
    fn identity_checks_the_returned_ca_against_the_pin() {
        let ca = CertificateAuthority::generate("coordinator-ca").unwrap();
        let other = CertificateAuthority::generate("other").unwrap();
        let (key_pem, csr_pem) = pki::generate_key_and_csr("host-1").unwrap();
        let cert = ca
            .sign_csr(
                &csr_pem,
                &LeafSpec {
                    common_name: "uid-1".into(),
                    organizations: vec![],
                    dns_names: vec![],
                    ip_addresses: vec![],
                    usage: LeafUsage::Client,
                    validity: time::Duration::hours(24),
                },
            )
            .unwrap();
        let doc = BootstrapDocument {
            api_version: drover_common::API_VERSION.into(),
            kind: drover_common::wire::BOOTSTRAP_KIND.into(),
            coordinators: vec!["https://127.0.0.1:1".into()],
            ca_pin: CaPin::from_cert_pem(&ca.cert_pem).unwrap(),
            ticket: "t".into(),
        };
        let response = |ca_pem: &str| RegisterResponse {
            machine_name: "m-1".into(),
            machine_uid: "uid-1".into(),
            certificate_pem: cert.cert_pem.clone(),
            not_after: cert.not_after,
            coordinator_ca_pem: ca_pem.into(),
            heartbeat_interval_seconds: 10,
        };
        let state = identity(&doc, key_pem.clone(), response(&ca.cert_pem)).unwrap();
        assert_eq!(state.machine_uid, "uid-1");
        let err = identity(&doc, key_pem, response(&other.cert_pem)).unwrap_err();
        assert!(matches!(err, RegisterError::CaMismatch { .. }), "{err}");
        assert!(err.is_permanent_refusal());
    }
}
