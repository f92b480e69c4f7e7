//! Certificate renewal: a new key and CSR after two thirds of the
//! certificate's lifetime, saved before they are used.

use std::time::Duration;

use drover_common::wire::RenewRequest;
use time::OffsetDateTime;
use tokio::time::Instant;

use super::{mtls_client, Agent, Stopped};
use crate::protocol::timing::{renewal_time, rfc3339};
use crate::shutdown::Shutdown;
use crate::state::State;

impl Agent {
    pub(super) async fn renew(&mut self, shutdown: &mut Shutdown) -> Result<(), Stopped> {
        let retry = |agent: &mut Self| {
            let delay = agent.renewal.backoff.next_delay();
            agent.renewal.at = Instant::now() + delay;
        };
        let (key_pem, csr_pem) = match &self.renewal.key {
            Some(pair) => pair.clone(),
            None => {
                match drover_common::pki::generate_key_and_csr(&self.saved.state.machine_name) {
                    Ok(pair) => {
                        self.renewal.key = Some(pair.clone());
                        pair
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot create a key for certificate renewal");
                        retry(self);
                        return Ok(());
                    }
                }
            }
        };
        let request = RenewRequest { csr_pem };
        let answer = tokio::select! {
            r = self.coordinator.api.renew(&request) => r,
            () = shutdown.requested() => return Err(Stopped),
        };
        let renewed = match answer {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, not_after = %rfc3339(self.saved.state.certificate_not_after), "certificate renewal failed; retrying");
                retry(self);
                return Ok(());
            }
        };
        let mut next = self.saved.state.clone();
        next.key_pem = key_pem;
        next.certificate_pem = renewed.certificate_pem;
        next.certificate_not_after = renewed.not_after;
        let client = match mtls_client(&next) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "the renewed certificate is unusable; retrying");
                retry(self);
                return Ok(());
            }
        };
        // The new key and certificate are saved before they are used, so a
        // crash cannot leave the agent with a key the coordinator never saw.
        if let Err(e) = self.saved.store.save(&next) {
            tracing::error!(error = %e, "cannot save the renewed certificate; keeping the old one");
            retry(self);
            return Ok(());
        }
        self.saved.state = next;
        self.coordinator.api = std::sync::Arc::new(client);
        self.renewal.key = None;
        self.renewal.backoff.reset();
        self.renewal.at = Self::renewal_instant(&self.saved.state);
        tracing::info!(not_after = %rfc3339(self.saved.state.certificate_not_after), "client certificate renewed");
        Ok(())
    }

    /// The renewal time of the saved certificate as a timer instant.
    pub(super) fn renewal_instant(state: &State) -> Instant {
        let not_before =
            crate::tls::certs_from_pem(&state.certificate_pem, "the client certificate")
                .ok()
                .and_then(|certs| {
                    x509_parser::parse_x509_certificate(&certs[0])
                        .ok()
                        .map(|(_, c)| c.validity().not_before.to_datetime())
                });
        let not_after = state.certificate_not_after;
        // Without a readable start, assume a 24 h certificate.
        let not_before = not_before.unwrap_or(not_after - time::Duration::hours(24));
        let at = renewal_time(not_before, not_after);
        let wait = at - OffsetDateTime::now_utc();
        Instant::now() + Duration::try_from(wait).unwrap_or(Duration::ZERO)
    }
}
