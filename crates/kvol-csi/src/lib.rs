//! CSI for kvol: drivers that register over the kubelet plugin-registration protocol and are driven over gRPC.

pub mod error;
pub mod objects;
pub mod proto;

pub use error::CsiError;
pub use objects::{MemoryObjects, NodeObjects};
