//! Generates the Rust code of the wire contracts: the agent's
//! (`pillar_csi.agent.v1`) and CSI's (`csi.v1`), clients and servers both.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: [&str; 2] = ["pillar_csi/agent/v1/agent.proto", "csi/v1/csi.proto"];
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&PROTOS, &["."])?;
    Ok(())
}
