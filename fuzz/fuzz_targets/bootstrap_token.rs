//! `BootstrapToken::from_str`: kubeadm bootstrap tokens.
//!
//! Properties, besides "never panics": an accepted token matches kubeadm's
//! `BootstrapTokenPattern` (`^[a-z0-9]{6}\.[a-z0-9]{16}$`), which the module
//! promises to check exactly, and its `to_string()` parses back equal.
#![no_main]

use drover_common::token::BootstrapToken;
use libfuzzer_sys::fuzz_target;

fn kubeadm_pattern(s: &str) -> bool {
    let ok = |part: &str, len: usize| {
        part.len() == len
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    matches!(s.split_once('.'), Some((id, secret)) if ok(id, 6) && ok(secret, 16))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(token) = text.parse::<BootstrapToken>() {
        assert!(
            kubeadm_pattern(text),
            "accepted a token kubeadm refuses: {text:?}"
        );
        let shown = token.to_string();
        let back: BootstrapToken = shown
            .parse()
            .unwrap_or_else(|e| panic!("{shown:?} does not parse back: {e}"));
        assert!(back == token, "token changed in a round trip: {shown:?}");
        assert_eq!(shown, text, "an accepted token is not shown as given");
    }
});
