//! `datagram::Beat::decode` and `Answer::decode`: the heartbeat datagrams
//! the coordinator reads from anyone who can send UDP to it, and the
//! answers the agent reads.
//!
//! Properties, besides "never panics":
//! - a datagram that verifies is exactly what the key encodes for the beat
//!   (or answer) it yields, so none can be altered and still verify;
//! - `peek_id` of a verified request is the id it decodes to;
//! - a genuine datagram with fuzzed bytes spliced in verifies only if the
//!   bytes are unchanged.
#![no_main]

use drover_common::wire::datagram::{peek_id, Answer, Beat, HeartbeatKey, Verdict};
use libfuzzer_sys::fuzz_target;

fn key() -> HeartbeatKey {
    HeartbeatKey::derive(b"drover-fuzz-heartbeat-master-key", "machine-uid")
}

fn check(data: &[u8]) {
    let k = key();
    if let Ok(beat) = Beat::decode(data, &k) {
        assert_eq!(beat.encode(&k).as_slice(), data, "a request verified that the key did not encode");
        assert_eq!(peek_id(data).ok(), Some(beat.id));
    }
    if let Ok(answer) = Answer::decode(data, &k) {
        assert_eq!(answer.encode(&k).as_slice(), data, "an answer verified that the key did not encode");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // A genuine request and answer with data[2..] spliced over data[1] % 8
    // bytes at offset data[0]: they verify only unchanged.
    if let [at, len, patch @ ..] = data {
        let k = key();
        let beat = Beat { id: 42, counter: 1_700_000_000_000_000, generation: 7, digest: *b"abcdefgh" };
        let answer = Answer { id: 42, counter: 1_700_000_000_000_000, verdict: Verdict::CallHttps };
        for genuine in [beat.encode(&k).to_vec(), answer.encode(&k).to_vec()] {
            let at = usize::from(*at) % genuine.len();
            let end = (at + usize::from(*len % 8)).min(genuine.len());
            let mut mutated = genuine[..at].to_vec();
            mutated.extend_from_slice(patch);
            mutated.extend_from_slice(&genuine[end..]);
            if mutated != genuine {
                assert!(Beat::decode(&mutated, &k).is_err(), "a changed request verified");
                assert!(Answer::decode(&mutated, &k).is_err(), "a changed answer verified");
            }
            check(&mutated);
        }
    }
});
