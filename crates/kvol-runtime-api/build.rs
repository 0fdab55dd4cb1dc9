//! Generates the runtime API's gRPC code from its .proto with protox (a pure-Rust compiler): no
//! system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/kvol/runtime/v1alpha1/runtime.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
