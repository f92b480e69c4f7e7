//! CA pins: `CaPin::from_str` (`sha256:<64 hex>` from bootstrap documents and
//! kubeadm configs), and `CaPin::from_cert_der` / `from_cert_pem` on the
//! certificates a peer presents.
//!
//! Properties, besides "never panics": an accepted pin string is canonical
//! (`to_string()` gives it back and parses back equal); a certificate that
//! yields a pin matches it.
#![no_main]

use drover_common::pin::CaPin;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(pin) = CaPin::from_cert_der(data) {
        assert!(
            pin.matches_cert_der(data),
            "a certificate does not match its own pin"
        );
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(pin) = text.parse::<CaPin>() {
        let shown = pin.to_string();
        let back: CaPin = shown
            .parse()
            .unwrap_or_else(|e| panic!("{shown:?} does not parse back: {e}"));
        assert_eq!(back, pin, "pin changed in a round trip");
        assert_eq!(shown, text, "an accepted pin is not shown as given");
    }
    let _ = CaPin::from_cert_pem(text);
});
