//! The generated gRPC code: CSI v1 (`csi.v1`) and kubelet plugin registration v1 (`pluginregistration`).

/// CSI v1: Identity, Controller and Node services and their messages.
pub mod csi {
    #![allow(missing_docs, clippy::all, clippy::pedantic, missing_debug_implementations)]
    tonic::include_proto!("csi.v1");
}

/// Kubelet plugin registration v1: the Registration service a plugin serves.
pub mod registration {
    #![allow(missing_docs, clippy::all, clippy::pedantic, missing_debug_implementations)]
    tonic::include_proto!("pluginregistration");
}
