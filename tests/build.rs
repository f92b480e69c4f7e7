//! Generates the server of the CRI `RuntimeService` (`Version`, `Status`)
//! for the stand-in container runtime (`src/bin/standin-cri.rs`) from the
//! agent's `proto/cri.proto`, the one copy of upstream's field numbers.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../agent/proto/cri.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .compile_protos(&["../agent/proto/cri.proto"], &["../agent/proto"])?;
    Ok(())
}
