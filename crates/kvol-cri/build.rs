//! Generates the CRI v1 client (and, for the tests' fake runtime, server) from our own .proto with protox (a pure-Rust compiler): no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/runtime/v1/api.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
