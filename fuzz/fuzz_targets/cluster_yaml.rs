//! A `Cluster` document as `drover apply` sends it to the admin API: YAML
//! (`serde_saphyr`) or JSON (`serde_json`), then `Cluster::validate`, exactly
//! what the coordinator does with the request body.
//!
//! Property, besides "never panics": a Cluster that validates survives the
//! JSON round trip the store puts it through.
#![no_main]

use drover_common::api::Cluster;
use libfuzzer_sys::fuzz_target;

fn accept(cluster: Cluster) {
    if cluster.validate().is_ok() {
        let stored = serde_json::to_vec(&cluster).expect("a Cluster serializes");
        let back: Cluster = serde_json::from_slice(&stored)
            .unwrap_or_else(|e| panic!("stored Cluster does not parse back: {e}"));
        assert_eq!(
            back, cluster,
            "Cluster changed in the store's JSON round trip"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(cluster) = serde_json::from_slice::<Cluster>(data) {
        accept(cluster);
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cluster) = serde_saphyr::from_str::<Cluster>(text) {
        accept(cluster);
    }
});
