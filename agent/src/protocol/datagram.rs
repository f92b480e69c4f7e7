//! Datagram heartbeats, the machine's side: when a report may go as a
//! datagram instead of an HTTPS request, the datagram, what its answer
//! says, and when to give up on datagrams for a while (a firewall that
//! drops them).
//!
//! A report goes as a datagram only while it is the same as the last one
//! the coordinator accepted over HTTPS together with an offer, and it has
//! nothing to deliver (no directive results, no cluster reports): a
//! datagram says "still here, nothing changed", never anything new.

use std::time::{Duration, SystemTime};

use drover_common::wire::datagram::{
    unix_micros, Answer, Beat, DatagramOffer, HeartbeatKey, OfferError, Verdict, REQUEST_LEN,
};
use drover_common::wire::status_digest;
use drover_common::wire::{AgentPhase, HeartbeatRequest};

/// How long to wait for the answer to a datagram before heartbeating over
/// HTTPS instead (at most a quarter of the interval).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

/// Unanswered datagrams in a row after which the machine heartbeats over
/// HTTPS for [`RETRY_AFTER`] before trying datagrams again.
pub const MAX_UNANSWERED: u32 = 3;

/// How long a machine whose datagrams went unanswered heartbeats over HTTPS
/// before trying again.
pub const RETRY_AFTER: Duration = Duration::from_secs(300);

/// The wait for an answer at heartbeat interval `interval`.
pub fn answer_timeout(interval: Duration) -> Duration {
    ANSWER_TIMEOUT.min(interval / 4)
}

/// What a machine holds to heartbeat by datagram: its id and key from the
/// last offer, and the digest of the report accepted with it.
#[derive(Debug, Clone)]
pub struct DatagramLink {
    id: u64,
    key: HeartbeatKey,
    digest: [u8; 8],
    last_counter: u64,
}

/// One datagram on its way: its bytes and the counter its answer names.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    pub datagram: [u8; REQUEST_LEN],
    pub counter: u64,
}

impl DatagramLink {
    /// The link an HTTPS answer offered, for the report it accepted.
    pub fn from_offer(
        offer: &DatagramOffer,
        accepted: &HeartbeatRequest,
    ) -> Result<Self, OfferError> {
        Ok(Self {
            id: offer.id,
            key: offer.heartbeat_key()?,
            digest: status_digest(accepted),
            last_counter: 0,
        })
    }

    /// The machine's heartbeat id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The datagram standing for `report` at `now`, when it may go as one:
    /// the report is the accepted one and has nothing to deliver. The
    /// counter is the time in microseconds, always above the last sent.
    pub fn beat(&mut self, report: &HeartbeatRequest, now: SystemTime) -> Option<Sent> {
        if !quiet(report) || status_digest(report) != self.digest {
            return None;
        }
        let counter = unix_micros(now).max(self.last_counter + 1);
        self.last_counter = counter;
        let datagram = Beat {
            id: self.id,
            counter,
            generation: report.applied_generation,
            digest: self.digest,
        }
        .encode(&self.key);
        Some(Sent { datagram, counter })
    }

    /// What `datagram` says, when it is the authentic answer to `sent`;
    /// `None` for anything else (another beat's answer, a forgery).
    pub fn verdict(&self, datagram: &[u8], sent: &Sent) -> Option<Verdict> {
        let a = Answer::decode(datagram, &self.key).ok()?;
        (a.id == self.id && a.counter == sent.counter).then_some(a.verdict)
    }
}

/// Whether a report has nothing to deliver and the machine is in a steady
/// phase.
fn quiet(r: &HeartbeatRequest) -> bool {
    matches!(r.phase, AgentPhase::Waiting | AgentPhase::Running)
        && r.directive_results.is_empty()
        && r.bootstrap.as_ref().is_none_or(|b| b.failure.is_none())
        && r.etcd.is_none()
        && r.nodes.is_none()
        && r.kubeadm_version.is_none()
        && r.certificates.is_none()
}

/// What to do about a datagram that went unanswered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unanswered {
    /// The first in a row: send nothing more now and a datagram again at
    /// the next interval. A coordinator that stalls for a moment (or drops
    /// a burst) must not get its whole fleet's heartbeats over HTTPS at
    /// once; one missed beat is well within the heartbeat timeout.
    Wait,
    /// The second in a row: heartbeat over HTTPS now.
    Https,
    /// The third: heartbeat over HTTPS from now on, for [`RETRY_AFTER`].
    FallBack,
}

/// Whether datagrams get answered, and the note the machine's report
/// carries while they do not.
#[derive(Debug, Clone)]
pub struct Fallback<I> {
    unanswered: u32,
    /// Until when the machine heartbeats over HTTPS only.
    until: Option<I>,
    note: Option<String>,
}

impl<I> Default for Fallback<I> {
    fn default() -> Self {
        Self {
            unanswered: 0,
            until: None,
            note: None,
        }
    }
}

impl<I: Copy + Ord + std::ops::Add<Duration, Output = I>> Fallback<I> {
    /// Whether a datagram may be tried at `now`.
    pub fn may_try(&self, now: I) -> bool {
        self.until.is_none_or(|until| now >= until)
    }

    /// A datagram was answered: datagrams work (again).
    pub fn answered(&mut self) {
        self.unanswered = 0;
        self.until = None;
        self.note = None;
    }

    /// A datagram to `target` went unanswered at `now`: what to do.
    pub fn unanswered(&mut self, target: &str, now: I, at: &str) -> Unanswered {
        self.unanswered += 1;
        if self.unanswered < MAX_UNANSWERED {
            return if self.unanswered == 1 {
                Unanswered::Wait
            } else {
                Unanswered::Https
            };
        }
        self.unanswered = 0;
        self.until = Some(now + RETRY_AFTER);
        self.note = Some(format!(
            "heartbeat datagrams to udp://{target} went unanswered {MAX_UNANSWERED} times in a row (last at {at}); heartbeating over HTTPS and trying datagrams again every {} s (is UDP to the coordinator blocked?)",
            RETRY_AFTER.as_secs()
        ));
        Unanswered::FallBack
    }

    /// Why the machine heartbeats over HTTPS, while it does.
    pub fn note(&self) -> Option<String> {
        self.note.clone()
    }
}

#[cfg(test)]
mod tests {
    use drover_common::wire::datagram::{check_fresh, peek_id, Answer};
    use drover_common::wire::DirectiveResult;

    use super::*;

    fn offer() -> DatagramOffer {
        DatagramOffer::new(7, &HeartbeatKey::from_bytes([5; 32]))
    }

    fn report() -> HeartbeatRequest {
        HeartbeatRequest {
            phase: AgentPhase::Running,
            applied_generation: 2,
            ..Default::default()
        }
    }

    #[test]
    fn only_the_accepted_quiet_report_goes_as_a_datagram() {
        let mut link = DatagramLink::from_offer(&offer(), &report()).unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let sent = link.beat(&report(), now).unwrap();
        assert_eq!(peek_id(&sent.datagram).unwrap(), 7);
        let b = Beat::decode(&sent.datagram, &HeartbeatKey::from_bytes([5; 32])).unwrap();
        assert_eq!(b.generation, 2);
        assert!(check_fresh(b.counter, 0, unix_micros(now)).is_ok());
        // The same instant again: the counter still grows.
        let again = link.beat(&report(), now).unwrap();
        assert_eq!(again.counter, sent.counter + 1);
        // A changed report, or one with something to deliver, goes over HTTPS.
        let mut changed = report();
        changed.applied_generation = 3;
        assert!(link.beat(&changed, now).is_none());
        let mut results = report();
        results.directive_results.push(DirectiveResult {
            id: "d".into(),
            ok: true,
            message: String::new(),
        });
        assert!(link.beat(&results, now).is_none());
    }

    #[test]
    fn only_the_answer_to_this_beat_counts() {
        let key = HeartbeatKey::from_bytes([5; 32]);
        let mut link = DatagramLink::from_offer(&offer(), &report()).unwrap();
        let sent = link.beat(&report(), SystemTime::now()).unwrap();
        let answer = |counter, key: &HeartbeatKey| {
            Answer {
                id: 7,
                counter,
                verdict: Verdict::CallHttps,
            }
            .encode(key)
        };
        assert_eq!(
            link.verdict(&answer(sent.counter, &key), &sent),
            Some(Verdict::CallHttps)
        );
        assert_eq!(link.verdict(&answer(sent.counter - 1, &key), &sent), None);
        let forged = answer(sent.counter, &HeartbeatKey::from_bytes([6; 32]));
        assert_eq!(link.verdict(&forged, &sent), None);
    }

    #[test]
    fn unanswered_datagrams_fall_back_to_https_for_a_while_and_say_so() {
        let mut f = Fallback::<Duration>::default();
        let t0 = Duration::ZERO;
        assert!(f.may_try(t0));
        assert_eq!(f.unanswered("10.0.0.1:7443", t0, "now"), Unanswered::Wait);
        assert_eq!(f.unanswered("10.0.0.1:7443", t0, "now"), Unanswered::Https);
        assert!(f.note().is_none());
        assert_eq!(
            f.unanswered("10.0.0.1:7443", t0, "now"),
            Unanswered::FallBack
        );
        assert!(!f.may_try(t0 + RETRY_AFTER / 2));
        assert!(f
            .note()
            .unwrap()
            .contains("udp://10.0.0.1:7443 went unanswered 3 times"));
        assert!(f.may_try(t0 + RETRY_AFTER));
        f.answered();
        assert!(f.note().is_none());
        assert_eq!(
            answer_timeout(Duration::from_secs(2)),
            Duration::from_millis(500)
        );
    }
}
