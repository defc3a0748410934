//! Generates the Rust code of the agent's gRPC contract.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=pillar_csi/agent/v1/agent.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["pillar_csi/agent/v1/agent.proto"], &["."])?;
    Ok(())
}
