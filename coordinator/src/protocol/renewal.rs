//! Certificate renewal: a machine trades its client certificate for one of
//! a new key.
//!
//! Invariant: only the machine's current certificate renews (its key pin is
//! on the machine), or a superseded one asking again for the key it was
//! last issued (the machine lost the answer). A superseded certificate
//! asking for another key means two holders of the identity: it is revoked.

use drover_common::api::{push_event, Machine, MachinePhase};
use time::OffsetDateTime;

/// Why a renewal is refused.
#[derive(Debug, thiserror::Error)]
pub enum RenewError {
    #[error("machine {machine} is being deleted; its certificate is not renewed")]
    Deleting { machine: String },
    #[error("no client certificate")]
    NoCertificate,
    #[error(
        "the identity of machine {machine} was revoked at {at}; the machine needs a new ticket"
    )]
    Revoked { machine: String, at: OffsetDateTime },
    #[error("this certificate of machine {machine} was superseded by a renewal made by another holder of its identity; the identity is revoked and the machine needs a new ticket")]
    Superseded { machine: String },
}

/// Whether `machine` may have its certificate renewed at all.
pub fn check_renewable(machine: &Machine) -> Result<(), RenewError> {
    if matches!(
        machine.status.phase,
        MachinePhase::Deleting | MachinePhase::Deleted
    ) {
        return Err(RenewError::Deleting {
            machine: machine.metadata.name.clone(),
        });
    }
    Ok(())
}

/// The certificate a renewal issues: its key's pin and expiry.
#[derive(Debug, Clone)]
pub struct Renewal<'a> {
    /// The key pin of the certificate the renewal was asked with.
    pub presented: &'a str,
    /// The key pin of the certificate issued.
    pub new_key: &'a str,
    pub not_after: OffsetDateTime,
}

/// The change a renewal makes to machine `m` (as read now, re-applied on a
/// conflict): the new certificate's key and expiry, or, asked with a
/// superseded certificate for another key, the identity revoked at `now`.
/// Whether it changed (always, when not refused).
pub fn renew(m: &mut Machine, renewal: &Renewal, now: OffsetDateTime) -> Result<bool, RenewError> {
    let machine = m.metadata.name.clone();
    if let Some(at) = m.status.identity_revoked_at {
        return Err(RenewError::Revoked { machine, at });
    }
    check_renewable(m)?;
    match &m.status.certificate_key {
        // The current certificate renews; so does a superseded one asking
        // again for the key it was last issued (the machine lost the answer
        // and retries).
        Some(current) if current != renewal.presented && current != renewal.new_key => {
            // Another holder renewed with this identity since this
            // certificate was current: one of the two stole it. Neither
            // keeps it.
            m.status.identity_revoked_at = Some(now);
            push_event(
                &mut m.status.events,
                "IdentityRevoked",
                "a superseded certificate asked for renewal: two holders of this machine's identity exist, so every certificate of it is revoked",
            );
            return Ok(true);
        }
        _ => {}
    }
    m.status.certificate_not_after = Some(renewal.not_after);
    m.status.certificate_key = Some(renewal.new_key.to_owned());
    Ok(true)
}

/// Whether the renewal written left `updated` its identity: refused when it
/// revoked it.
pub fn renewed(updated: &Machine) -> Result<(), RenewError> {
    if updated.status.identity_revoked_at.is_some() {
        return Err(RenewError::Superseded {
            machine: updated.metadata.name.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(key: &str) -> Machine {
        let mut m = crate::protocol::fixtures::machine("m");
        m.status.certificate_key = Some(key.into());
        m
    }

    #[test]
    fn the_current_certificate_renews_and_a_superseded_one_revokes_the_identity() {
        let now = drover_common::now();
        let later = now + time::Duration::hours(1);
        let mut m = machine("sha256:a");
        let first = Renewal {
            presented: "sha256:a",
            new_key: "sha256:b",
            not_after: later,
        };
        assert!(renew(&mut m, &first, now).unwrap());
        assert_eq!(m.status.certificate_key.as_deref(), Some("sha256:b"));
        assert!(renewed(&m).is_ok());
        // The answer was lost: the old certificate asks again for its key.
        assert!(renew(&mut m, &first, now).is_ok());
        assert!(renewed(&m).is_ok());
        // The old certificate asks for yet another key: two holders.
        let thief = Renewal {
            new_key: "sha256:c",
            ..first
        };
        assert!(renew(&mut m, &thief, now).unwrap());
        assert_eq!(m.status.identity_revoked_at, Some(now));
        assert_eq!(m.status.certificate_key.as_deref(), Some("sha256:b"));
        assert!(matches!(renewed(&m), Err(RenewError::Superseded { .. })));
        // Once revoked, nothing renews.
        assert!(matches!(
            renew(&mut m, &first, now),
            Err(RenewError::Revoked { .. })
        ));
        let mut leaving = machine("sha256:a");
        leaving.status.phase = MachinePhase::Deleting;
        assert!(matches!(
            check_renewable(&leaving),
            Err(RenewError::Deleting { .. })
        ));
    }
}
