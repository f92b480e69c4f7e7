//! `bundle::verify`: the signed config bundle an agent fetches
//! (`GET /v1/machine/config`, a `SignedBundle` as JSON) and checks against the
//! coordinator CA it pinned before writing any file or running kubeadm.
//!
//! The input is the JSON body; the signer is a fixed test CA (its key is not
//! kept: corpus/bundle_verify holds bundles it signed). Property, besides
//! "never panics": a bundle that verifies is for this machine and is exactly
//! the signed payload.
#![no_main]

use std::sync::OnceLock;

use drover_common::bundle::{verify, ConfigBundle, SignedBundle};
use libfuzzer_sys::fuzz_target;

const MACHINE_UID: &str = "5f0c7a1e-4a5b-4c1d-9e2f-0123456789ab";

/// The test CA that signed the seed bundles.
const SIGNER_PEM: &str = "\
-----BEGIN CERTIFICATE-----\n\
MIIBjTCCATSgAwIBAgIUFTO7CK5SoRv9MNfqlkOdRpmKEhEwCgYIKoZIzj0EAwIw\n\
JTEjMCEGA1UEAwwaZHJvdmVyLWZ1enotY29vcmRpbmF0b3ItY2EwHhcNMjYxMTIy\n\
MDAzMDIzWhcNMzYxMTE5MDAzNTIzWjAlMSMwIQYDVQQDDBpkcm92ZXItZnV6ei1j\n\
b29yZGluYXRvci1jYTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABEie8D3x7OJ5\n\
VvDgQeojRH4BoDjCNOJE73yev5FNdB+bolkE6jmYxlbCvphmNuRQVLjy7KqBkeKB\n\
576zqSa8SXOjQjBAMA4GA1UdDwEB/wQEAwIBhjAdBgNVHQ4EFgQU8j+xtpftzz85\n\
i/J0nHX9iayymNowDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNHADBEAiB0\n\
C2cvr6zU12/u2JpxbrT0ibF63Y91aZp4SYDnAMIzmgIgc1ffz1l8bwy+2xJPw+qY\n\
Sjw9m2d9Nmsf0IiL1ngQqHA=\n\
-----END CERTIFICATE-----\n\
";

fn signer_der() -> &'static [u8] {
    static DER: OnceLock<Vec<u8>> = OnceLock::new();
    DER.get_or_init(|| drover_common::pki::first_cert_der(SIGNER_PEM).expect("signer PEM"))
}

fuzz_target!(|data: &[u8]| {
    let Ok(signed) = serde_json::from_slice::<SignedBundle>(data) else {
        return;
    };
    if let Ok(bundle) = verify(&signed, signer_der(), MACHINE_UID) {
        assert_eq!(
            bundle.machine_uid, MACHINE_UID,
            "bundle for another machine"
        );
        let payload: ConfigBundle =
            serde_json::from_str(&signed.payload).expect("a verified payload parses");
        assert_eq!(payload, bundle, "verified bundle is not the signed payload");
    }
});
