//! A machine's identity: the client certificate it is issued, and who a
//! presented certificate is.
//!
//! Invariant: a machine call is admitted only with an unexpired machine
//! certificate of a machine that exists and whose identity is not revoked.

use drover_common::api::{Machine, MachinePhase};
use drover_common::pki::{
    CertInfo, CertificateAuthority, IssuedCert, LeafSpec, LeafUsage, PkiError,
};
use time::OffsetDateTime;

/// The organization every machine certificate carries.
pub const MACHINE_ORG: &str = "drover:machines";

/// Why a machine call is refused before anything else is looked at.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("this call needs the machine's client certificate (mutual TLS); register first")]
    NoCertificate,
    /// The certificate could not be read.
    #[error("{0}")]
    Unreadable(String),
    #[error("the client certificate is not a machine certificate")]
    NotMachine,
    #[error("the client certificate of machine {machine} expired at {at}; the machine needs a new ticket")]
    Expired { machine: String, at: OffsetDateTime },
    #[error("machine {machine} is not known to this coordinator (it was deleted); it needs a new ticket")]
    Unknown { machine: String },
    #[error("the identity of machine {machine} was revoked at {at}: every certificate of it is refused; the machine needs a new ticket")]
    Revoked { machine: String, at: OffsetDateTime },
}

/// The machine certificate a call presented (as the TLS layer verified and
/// parsed it), checked at `now`. A resumed TLS session carries the
/// certificate of the handshake it resumes without verifying it again, so
/// expiry is checked here.
pub fn identify(
    presented: Option<&Result<CertInfo, PkiError>>,
    now: OffsetDateTime,
) -> Result<&CertInfo, AuthError> {
    let info = presented
        .ok_or(AuthError::NoCertificate)?
        .as_ref()
        .map_err(|e| AuthError::Unreadable(e.to_string()))?;
    if !info.organizations.iter().any(|o| o == MACHINE_ORG) {
        return Err(AuthError::NotMachine);
    }
    if info.not_after <= now {
        return Err(AuthError::Expired {
            machine: info.common_name.clone(),
            at: info.not_after,
        });
    }
    Ok(info)
}

/// Admits machine `name` as `stored` (`None`: not in the store): not
/// deleted, its identity not revoked.
pub fn admit(name: &str, stored: Option<Machine>) -> Result<Machine, AuthError> {
    let machine = stored
        .filter(|m| m.status.phase != MachinePhase::Deleted)
        .ok_or_else(|| AuthError::Unknown {
            machine: name.to_owned(),
        })?;
    if let Some(at) = machine.status.identity_revoked_at {
        return Err(AuthError::Revoked {
            machine: name.to_owned(),
            at,
        });
    }
    Ok(machine)
}

/// Why a certificate could not be issued.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("the CSR is not usable: {0}")]
    Csr(PkiError),
    #[error("cannot read the certificate just issued: {0}")]
    Unreadable(drover_common::pin::PinError),
}

/// A certificate issued to a machine, with the pin of its key.
#[derive(Clone)]
pub struct Issued {
    pub cert: IssuedCert,
    /// The `sha256:` pin of its public key, kept on the machine.
    pub key_pin: String,
}

/// Issues machine `machine` a client certificate valid for `validity` for
/// the key of `csr_pem`: its name as CN, the machine group.
pub fn issue(
    ca: &CertificateAuthority,
    csr_pem: &str,
    machine: &str,
    validity: std::time::Duration,
) -> Result<Issued, IssueError> {
    let spec = LeafSpec {
        common_name: machine.to_owned(),
        organizations: vec![MACHINE_ORG.into()],
        dns_names: vec![],
        ip_addresses: vec![],
        usage: LeafUsage::Client,
        validity: time::Duration::try_from(validity).unwrap_or(time::Duration::hours(24)),
    };
    let cert = ca.sign_csr(csr_pem, &spec).map_err(IssueError::Csr)?;
    let key_pin = drover_common::pin::CaPin::from_cert_pem(&cert.cert_pem)
        .map(|p| p.to_string())
        .map_err(IssueError::Unreadable)?;
    Ok(Issued { cert, key_pin })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(org: &str, not_after: OffsetDateTime) -> Result<CertInfo, PkiError> {
        Ok(CertInfo {
            common_name: "m".into(),
            organizations: vec![org.into()],
            not_after,
            is_ca: false,
            public_key_pin: "sha256:x".into(),
        })
    }

    #[test]
    fn only_a_current_machine_certificate_of_a_standing_identity_is_admitted() {
        let now = drover_common::now();
        let later = now + time::Duration::hours(1);
        assert!(matches!(identify(None, now), Err(AuthError::NoCertificate)));
        assert!(matches!(
            identify(Some(&cert("admins", later)), now),
            Err(AuthError::NotMachine)
        ));
        assert!(matches!(
            identify(Some(&cert(MACHINE_ORG, now)), now),
            Err(AuthError::Expired { .. })
        ));
        let presented = cert(MACHINE_ORG, later);
        assert_eq!(identify(Some(&presented), now).unwrap().common_name, "m");

        assert!(matches!(admit("m", None), Err(AuthError::Unknown { .. })));
        let mut m = crate::protocol::fixtures::machine("m");
        assert!(admit("m", Some(m.clone())).is_ok());
        m.status.identity_revoked_at = Some(now);
        let refused = admit("m", Some(m.clone())).unwrap_err();
        assert!(matches!(refused, AuthError::Revoked { .. }));
        assert!(refused
            .to_string()
            .contains("every certificate of it is refused"));
        m.status.identity_revoked_at = None;
        m.status.phase = MachinePhase::Deleted;
        assert!(matches!(
            admit("m", Some(m)),
            Err(AuthError::Unknown { .. })
        ));
    }
}
