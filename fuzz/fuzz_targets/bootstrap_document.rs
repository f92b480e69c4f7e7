//! `BootstrapDocument::parse`: what an agent boots from (user data, a NoCloud
//! seed or `--bootstrap`), written by whoever controls the machine's user data.
//!
//! Property, besides "never panics": a document that parses renders
//! (`to_yaml`, as `drover token create` does) to YAML that parses back equal.
#![no_main]

use drover_common::wire::BootstrapDocument;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(doc) = BootstrapDocument::parse(text) {
        let yaml = doc.to_yaml();
        match BootstrapDocument::parse(&yaml) {
            Ok(back) => assert_eq!(back, doc, "bootstrap document changed in a YAML round trip"),
            // The rendering may be longer than the input; only the size
            // limit may refuse it.
            Err(e) if yaml.len() > BootstrapDocument::MAX_LEN => drop(e),
            Err(e) => panic!("rendered bootstrap document does not parse back: {e}\n{yaml}"),
        }
    }
});
