//! Generates the client of the container runtime's CRI `RuntimeService`
//! (`Version`, `Status`) from `proto/cri.proto` with protoc (Debian's
//! `protobuf-compiler`, which `scripts/setup-host` installs).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/cri.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_protos(&["proto/cri.proto"], &["proto"])?;
    Ok(())
}
