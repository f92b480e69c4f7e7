//! `jws::verify_detached`: the detached JWS over `cluster-info` that a joining
//! machine checks before it trusts the cluster's CA.
//!
//! The input is `content NUL jws` (both UTF-8), verified for kubeadm's test
//! vector token. Property, besides "never panics": a JWS that verifies is
//! exactly the one `sign_detached` makes, so none can be altered and verify.
#![no_main]

use drover_common::jws::{sign_detached, verify_detached};
use libfuzzer_sys::fuzz_target;

const TOKEN_ID: &str = "joshua";
const TOKEN_SECRET: &str = "my voice is my passcode";

fuzz_target!(|data: &[u8]| {
    let (content, jws) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let (Ok(content), Ok(jws)) = (std::str::from_utf8(content), std::str::from_utf8(jws)) else {
        return;
    };
    if verify_detached(content, jws, TOKEN_ID, TOKEN_SECRET).is_ok() {
        assert_eq!(
            sign_detached(content, TOKEN_ID, TOKEN_SECRET),
            jws,
            "a JWS verified that is not the one signed"
        );
    }
});
