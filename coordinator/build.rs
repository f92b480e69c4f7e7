//! Generates the cluster-autoscaler's `externalgrpc` service (server and,
//! for the coordinator's own tests, client) from `proto/externalgrpc.proto`
//! with protoc (Debian's `protobuf-compiler`, which `scripts/setup-host`
//! installs).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/externalgrpc.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .compile_protos(&["proto/externalgrpc.proto"], &["proto"])?;
    Ok(())
}
