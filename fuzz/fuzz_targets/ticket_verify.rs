//! `TicketKey::verify`: the ticket a machine presents at registration, the
//! first thing the coordinator reads from an unauthenticated caller.
//!
//! Properties, besides "never panics":
//! - a string that verifies is exactly what the key signs for the claims it
//!   yields (`key.sign(&claims) == input`), so no ticket can be altered,
//!   re-encoded or have its claims changed and still verify;
//! - it is not expired at `NOW`;
//! - a genuine ticket with a fuzzed splice never verifies with other claims.
#![no_main]

use std::sync::OnceLock;

use drover_common::ticket::{TicketClaims, TicketGrant, TicketKey};
use libfuzzer_sys::fuzz_target;

/// The fixed key the seed tickets in corpus/ticket_verify are signed with.
const KEY: &[u8] = b"drover-fuzz-ticket-key-012345678";
/// The fixed "current time" (unix seconds); the seed tickets are valid then.
const NOW: i64 = 1_700_000_000;

fn key() -> &'static TicketKey {
    static KEY_CELL: OnceLock<TicketKey> = OnceLock::new();
    KEY_CELL.get_or_init(|| TicketKey::from_bytes(KEY.to_vec()))
}

/// A genuine ticket to splice fuzzed bytes into.
fn genuine() -> &'static (String, TicketClaims) {
    static GENUINE: OnceLock<(String, TicketClaims)> = OnceLock::new();
    GENUINE.get_or_init(|| {
        let claims = TicketClaims {
            grant: TicketGrant::Machine {
                cluster: "demo".into(),
                machine: "demo-control-plane-0".into(),
                machine_uid: "5f0c7a1e-4a5b-4c1d-9e2f-0123456789ab".into(),
                role: drover_common::api::MachineRole::Worker,
            },
            issued_at: NOW - 60,
            expires_at: NOW + 3600,
            nonce: "00112233445566778899aabbccddeeff".into(),
        };
        (key().sign(&claims), claims)
    })
}

fn check(ticket: &str) -> Option<TicketClaims> {
    let claims = key().verify(ticket, NOW).ok()?;
    assert!(
        NOW < claims.expires_at,
        "expired ticket accepted: {claims:?}"
    );
    assert_eq!(
        key().sign(&claims),
        ticket,
        "a ticket verified that the key did not sign in this form"
    );
    Some(claims)
}

fuzz_target!(|data: &[u8]| {
    // The input as a ticket.
    if let Ok(text) = std::str::from_utf8(data) {
        check(text);
    }
    // A genuine ticket with data[2..] spliced over data[1] % 8 bytes at
    // offset data[0]: if it still verifies, its claims must be the genuine ones.
    if let [at, len, patch @ ..] = data {
        let (ticket, claims) = genuine();
        let bytes = ticket.as_bytes();
        let at = usize::from(*at) * bytes.len() / 256;
        let end = (at + usize::from(*len % 8)).min(bytes.len());
        let mut mutated = bytes[..at].to_vec();
        mutated.extend_from_slice(patch);
        mutated.extend_from_slice(&bytes[end..]);
        if let Ok(mutated) = String::from_utf8(mutated) {
            if let Some(got) = check(&mutated) {
                assert_eq!(
                    &got, claims,
                    "a mutated ticket verified with changed claims"
                );
            }
        }
    }
});
