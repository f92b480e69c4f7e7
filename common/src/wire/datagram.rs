//! The datagram heartbeat: a quiet machine says "still here, nothing
//! changed" in one UDP datagram instead of an HTTPS request, and the
//! coordinator answers in one datagram "nothing for you" or "call me over
//! HTTPS". Everything that changes state still goes through the mutually
//! authenticated API; a datagram only proves that a machine holding its
//! heartbeat key is alive and that the status it last reported over HTTPS
//! (summarised by a digest) still holds.
//!
//! A machine's heartbeat key is handed to it over mutual TLS; the datagrams
//! carry no secret. Each is authenticated with HMAC-SHA256 (truncated to 16
//! bytes) under that key, and carries a counter that must grow: the agent
//! sends the Unix time in microseconds (strictly increasing), so the
//! receiver refuses a counter not above the last it accepted from the
//! machine (a replay) and one too far from its own clock (a replay across a
//! coordinator restart, or a clock to fix). Parsing is a fixed layout:
//! nothing is allocated and every length is known before a byte is read.
//!
//! Request, 52 bytes:
//! `"DRH1" | id u64 | counter u64 | generation u64 | digest [8] | tag [16]`.
//! Answer, 37 bytes:
//! `"DRA1" | id u64 | counter u64 | verdict u8 | tag [16]`.
//! Integers are big-endian. The tags are HMACs over a domain label and the
//! bytes before the tag, so an answer never verifies as a request.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// A request datagram's length.
pub const REQUEST_LEN: usize = 52;
/// An answer datagram's length.
pub const ANSWER_LEN: usize = 37;
/// The length of a heartbeat key.
pub const KEY_LEN: usize = 32;
/// The truncated tag's length.
pub const TAG_LEN: usize = 16;

const REQUEST_MAGIC: &[u8; 4] = b"DRH1";
const ANSWER_MAGIC: &[u8; 4] = b"DRA1";
const REQUEST_DOMAIN: &[u8] = b"drover heartbeat request v1";
const ANSWER_DOMAIN: &[u8] = b"drover heartbeat answer v1";

type HmacSha256 = Hmac<Sha256>;

/// A machine's heartbeat key: 32 random bytes the coordinator derives for
/// the machine and hands it over mutual TLS.
#[derive(Clone, PartialEq, Eq)]
pub struct HeartbeatKey([u8; KEY_LEN]);

impl std::fmt::Debug for HeartbeatKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeartbeatKey(..)")
    }
}

impl HeartbeatKey {
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The key of machine `machine_uid` under the coordinator's heartbeat
    /// master key: every replica derives the same, and nothing per machine
    /// needs storing.
    pub fn derive(master: &[u8], machine_uid: &str) -> Self {
        let mut mac = HmacSha256::new_from_slice(master).expect("HMAC takes any key length");
        mac.update(b"drover heartbeat key v1\0");
        mac.update(machine_uid.as_bytes());
        Self(mac.finalize().into_bytes().into())
    }

    fn tag(&self, domain: &[u8], body: &[u8]) -> [u8; TAG_LEN] {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(domain);
        mac.update(body);
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    fn verify(&self, domain: &[u8], body: &[u8], tag: &[u8]) -> bool {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(domain);
        mac.update(body);
        mac.verify_truncated_left(tag).is_ok()
    }
}

/// What a machine says in a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// The machine's heartbeat id (handed out with its key; not secret).
    pub id: u64,
    /// Strictly increasing per machine: the Unix time in microseconds.
    pub counter: u64,
    /// The config generation the machine has applied.
    pub generation: u64,
    /// A digest of the status the machine last reported over HTTPS.
    pub digest: [u8; 8],
}

/// What the coordinator answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Seen; nothing for the machine.
    Quiet,
    /// Something waits (a directive, a new assignment, a certificate to
    /// renew, a status the coordinator does not have): send the next
    /// heartbeat over HTTPS.
    CallHttps,
}

/// The answer to one beat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub id: u64,
    /// The counter of the beat answered.
    pub counter: u64,
    pub verdict: Verdict,
}

/// Why a datagram was refused. Each costs the receiver at most one MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DatagramError {
    #[error("a heartbeat datagram is {want} bytes, this one {got}")]
    Length { want: usize, got: usize },
    #[error("not a Drover heartbeat datagram (bad magic)")]
    Magic,
    #[error("unknown verdict {0}")]
    Verdict(u8),
    #[error("the tag does not verify under the machine's heartbeat key")]
    Tag,
}

/// The request's id, read before anything is verified, to find the key.
pub fn peek_id(datagram: &[u8]) -> Result<u64, DatagramError> {
    check_frame(datagram, REQUEST_LEN, REQUEST_MAGIC)?;
    Ok(u64::from_be_bytes(
        datagram[4..12].try_into().expect("8 bytes"),
    ))
}

impl Beat {
    /// The datagram of this beat under `key`.
    pub fn encode(&self, key: &HeartbeatKey) -> [u8; REQUEST_LEN] {
        let mut d = REQUEST.start::<REQUEST_LEN>(self.id, self.counter);
        d[20..28].copy_from_slice(&self.generation.to_be_bytes());
        d[28..36].copy_from_slice(&self.digest);
        REQUEST.seal(&mut d, key);
        d
    }

    /// Reads and authenticates a request datagram under `key` (the key of
    /// the id [`peek_id`] read).
    pub fn decode(datagram: &[u8], key: &HeartbeatKey) -> Result<Self, DatagramError> {
        let u = REQUEST.open(datagram, key)?;
        Ok(Self {
            id: u(4..12),
            counter: u(12..20),
            generation: u(20..28),
            digest: datagram[28..36].try_into().expect("8 bytes"),
        })
    }
}

impl Answer {
    /// The datagram of this answer under `key`.
    pub fn encode(&self, key: &HeartbeatKey) -> [u8; ANSWER_LEN] {
        let mut d = ANSWER.start::<ANSWER_LEN>(self.id, self.counter);
        d[20] = match self.verdict {
            Verdict::Quiet => 0,
            Verdict::CallHttps => 1,
        };
        ANSWER.seal(&mut d, key);
        d
    }

    /// Reads and authenticates an answer datagram under the machine's key.
    pub fn decode(datagram: &[u8], key: &HeartbeatKey) -> Result<Self, DatagramError> {
        let u = ANSWER.open(datagram, key)?;
        let verdict = match datagram[20] {
            0 => Verdict::Quiet,
            1 => Verdict::CallHttps,
            v => return Err(DatagramError::Verdict(v)),
        };
        Ok(Self {
            id: u(4..12),
            counter: u(12..20),
            verdict,
        })
    }
}

/// The layout of a kind of datagram: `magic`, the sender's id and counter,
/// its own fields up to `body`, then the tag of the first `body` bytes
/// under the key and `domain`, `len` bytes in all.
struct Frame {
    magic: &'static [u8; 4],
    domain: &'static [u8],
    body: usize,
    len: usize,
}

const REQUEST: Frame = Frame {
    magic: REQUEST_MAGIC,
    domain: REQUEST_DOMAIN,
    body: 36,
    len: REQUEST_LEN,
};

const ANSWER: Frame = Frame {
    magic: ANSWER_MAGIC,
    domain: ANSWER_DOMAIN,
    body: 21,
    len: ANSWER_LEN,
};

impl Frame {
    /// A datagram of this kind with its magic, `id` and `counter` written.
    fn start<const N: usize>(&self, id: u64, counter: u64) -> [u8; N] {
        let mut d = [0u8; N];
        d[..4].copy_from_slice(self.magic);
        d[4..12].copy_from_slice(&id.to_be_bytes());
        d[12..20].copy_from_slice(&counter.to_be_bytes());
        d
    }

    /// Writes the tag of `d`'s body under `key`.
    fn seal(&self, d: &mut [u8], key: &HeartbeatKey) {
        let tag = key.tag(self.domain, &d[..self.body]);
        d[self.body..].copy_from_slice(&tag);
    }

    /// Checks `datagram`'s frame and tag under `key`: the reader of its
    /// big-endian `u64` fields.
    fn open<'a>(
        &self,
        datagram: &'a [u8],
        key: &HeartbeatKey,
    ) -> Result<impl Fn(std::ops::Range<usize>) -> u64 + 'a, DatagramError> {
        check_frame(datagram, self.len, self.magic)?;
        if !key.verify(self.domain, &datagram[..self.body], &datagram[self.body..]) {
            return Err(DatagramError::Tag);
        }
        Ok(|r: std::ops::Range<usize>| u64::from_be_bytes(datagram[r].try_into().expect("8")))
    }
}

fn check_frame(d: &[u8], len: usize, magic: &[u8; 4]) -> Result<(), DatagramError> {
    if d.len() != len {
        return Err(DatagramError::Length {
            want: len,
            got: d.len(),
        });
    }
    if &d[..4] != magic {
        return Err(DatagramError::Magic);
    }
    Ok(())
}

/// What a machine needs to heartbeat by datagram: its heartbeat id and key,
/// handed only over mutual TLS. Datagrams go over UDP to the address and
/// port of the coordinator that answered.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DatagramOffer {
    /// The machine's heartbeat id (not secret).
    pub id: u64,
    /// The machine's heartbeat key, 32 bytes in standard base64: a secret
    /// of this machine's, like its private key.
    pub key: String,
}

impl std::fmt::Debug for DatagramOffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatagramOffer")
            .field("id", &self.id)
            .field("key", &"..")
            .finish()
    }
}

impl DatagramOffer {
    /// The offer of `key` for heartbeat id `id`.
    pub fn new(id: u64, key: &HeartbeatKey) -> Self {
        use base64::Engine;
        Self {
            id,
            key: base64::engine::general_purpose::STANDARD.encode(key.as_bytes()),
        }
    }

    /// The key, or why the offer is unusable.
    pub fn heartbeat_key(&self) -> Result<HeartbeatKey, OfferError> {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.key)
            .map_err(|_| OfferError)?;
        let bytes: [u8; KEY_LEN] = bytes.try_into().map_err(|_| OfferError)?;
        Ok(HeartbeatKey::from_bytes(bytes))
    }
}

/// The heartbeat offer in an answer carried a key that is not 32 bytes of
/// base64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the coordinator's datagram offer carries a key that is not 32 bytes of base64; heartbeating over HTTPS")]
pub struct OfferError;

/// The heartbeat id of machine `machine_uid`: the first 8 bytes of a
/// SHA-256 over it, so every replica finds the same id without storing one.
/// Not secret: it only says which key to verify a datagram with.
pub fn machine_id(machine_uid: &str) -> u64 {
    use sha2::Digest;
    let mut h = Sha256::new();
    h.update(b"drover heartbeat id v1\0");
    h.update(machine_uid.as_bytes());
    u64::from_be_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}

/// The microseconds since the Unix epoch of `at` (0 before it).
pub fn unix_micros(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// How far a beat's counter (microseconds) may be from the receiver's
/// clock: 60 s either way.
pub const COUNTER_SKEW_MICROS: u64 = 60_000_000;

/// Why a verified beat is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Freshness {
    #[error("counter {counter} is not above the last accepted {last}: a replay")]
    Replayed { counter: u64, last: u64 },
    #[error("counter {counter} is more than 60 s from this coordinator's clock ({now}); is the machine's clock right?")]
    OutOfWindow { counter: u64, now: u64 },
}

/// Whether a verified beat's `counter` may be accepted after `last` (the
/// machine's last accepted counter, 0 for none) at `now` (the receiver's
/// Unix time in microseconds).
pub fn check_fresh(counter: u64, last: u64, now: u64) -> Result<(), Freshness> {
    if counter <= last {
        return Err(Freshness::Replayed { counter, last });
    }
    if counter.abs_diff(now) > COUNTER_SKEW_MICROS {
        return Err(Freshness::OutOfWindow { counter, now });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> HeartbeatKey {
        HeartbeatKey::from_bytes([b; KEY_LEN])
    }

    fn beat() -> Beat {
        Beat {
            id: 0x0102_0304_0506_0708,
            counter: 1_700_000_000_000_000,
            generation: 3,
            digest: *b"digest!!",
        }
    }

    #[test]
    fn a_beat_and_an_answer_round_trip_and_only_under_their_key() {
        let k = key(7);
        let d = beat().encode(&k);
        assert_eq!(d.len(), REQUEST_LEN);
        assert_eq!(peek_id(&d).unwrap(), beat().id);
        assert_eq!(Beat::decode(&d, &k).unwrap(), beat());
        assert_eq!(Beat::decode(&d, &key(8)), Err(DatagramError::Tag));
        let a = Answer {
            id: beat().id,
            counter: beat().counter,
            verdict: Verdict::CallHttps,
        };
        let ad = a.encode(&k);
        assert_eq!(Answer::decode(&ad, &k).unwrap(), a);
        assert_eq!(Answer::decode(&ad, &key(8)), Err(DatagramError::Tag));
    }

    #[test]
    fn every_changed_bit_is_refused() {
        let k = key(1);
        let d = beat().encode(&k);
        for i in 0..REQUEST_LEN {
            for bit in 0..8 {
                let mut m = d;
                m[i] ^= 1 << bit;
                assert!(Beat::decode(&m, &k).is_err(), "byte {i} bit {bit}");
            }
        }
        assert_eq!(
            Beat::decode(&d[..51], &k),
            Err(DatagramError::Length { want: 52, got: 51 })
        );
        // An answer is never taken for a request, nor a request for an answer.
        let a = Answer {
            id: 1,
            counter: 2,
            verdict: Verdict::Quiet,
        }
        .encode(&k);
        assert!(Beat::decode(&a, &k).is_err());
        assert!(Answer::decode(&d, &k).is_err());
    }

    #[test]
    fn the_fuzz_seeds_are_genuine_datagrams() {
        // fuzz/corpus/heartbeat_datagram holds these two, made by an
        // independent HMAC implementation (Python's), so the layout and
        // the tags are checked against more than this module.
        let k = HeartbeatKey::derive(b"drover-fuzz-heartbeat-master-key", "machine-uid");
        let seeds = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fuzz/corpus/heartbeat_datagram"
        );
        let request = std::fs::read(format!("{seeds}/request")).unwrap();
        let beat = Beat::decode(&request, &k).unwrap();
        assert_eq!(
            (beat.id, beat.counter, beat.generation, &beat.digest),
            (42, 1_700_000_000_000_000, 7, b"abcdefgh")
        );
        let answer = std::fs::read(format!("{seeds}/answer")).unwrap();
        assert_eq!(
            Answer::decode(&answer, &k).unwrap(),
            Answer {
                id: 42,
                counter: 1_700_000_000_000_000,
                verdict: Verdict::CallHttps
            }
        );
    }

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(machine_id("uid-a"), machine_id("uid-a"));
        assert_ne!(machine_id("uid-a"), machine_id("uid-b"));
        let offer = DatagramOffer::new(7, &key(3));
        assert_eq!(offer.heartbeat_key().unwrap(), key(3));
        assert!(!format!("{offer:?}").contains(&offer.key));
        let bad = DatagramOffer {
            id: 7,
            key: "c2hvcnQ=".into(),
        };
        assert_eq!(bad.heartbeat_key(), Err(OfferError));
    }

    #[test]
    fn keys_are_derived_per_machine_and_never_printed() {
        let a = HeartbeatKey::derive(b"master", "uid-a");
        assert_eq!(a, HeartbeatKey::derive(b"master", "uid-a"));
        assert_ne!(a, HeartbeatKey::derive(b"master", "uid-b"));
        assert_ne!(a, HeartbeatKey::derive(b"other", "uid-a"));
        assert_eq!(format!("{a:?}"), "HeartbeatKey(..)");
    }

    #[test]
    fn counters_must_grow_and_stay_near_the_clock() {
        let now = 1_700_000_000_000_000;
        assert!(check_fresh(now, 0, now).is_ok());
        assert!(check_fresh(now + 1, now, now).is_ok());
        assert_eq!(
            check_fresh(now, now, now),
            Err(Freshness::Replayed {
                counter: now,
                last: now
            })
        );
        assert!(matches!(
            check_fresh(now - 61_000_000, 0, now),
            Err(Freshness::OutOfWindow { .. })
        ));
        assert!(check_fresh(now + 59_000_000, now, now).is_ok());
    }
}
