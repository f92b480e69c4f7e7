//! The rustls crypto provider the coordinator's server, its store client
//! and the operator CLI all use.

use std::sync::Arc;

/// The crypto provider every rustls configuration of the coordinator (and its CLI) uses:
/// ring's, with TLS 1.3's AES-128-GCM-SHA256 suite first. Its key schedule
/// runs on SHA-256, which CPUs do in hardware (SHA-NI, ARMv8 SHA); ring's
/// default first suite, AES-256-GCM-SHA384, runs it on SHA-512 in software,
/// and a resumed handshake is mostly key schedule.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    let first = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    provider
        .cipher_suites
        .retain(|s| s.suite() != first.suite());
    provider.cipher_suites.insert(0, first);
    Arc::new(provider)
}
