//! `kubeadm::parse_config`: the strict multi-document kubeadm config reader
//! (what the test stand-in kubeadm applies to the configs an agent writes).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = drover_common::kubeadm::parse_config(text);
});
