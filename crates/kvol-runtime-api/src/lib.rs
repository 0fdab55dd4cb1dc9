//! kvol's local API for whatever runs a pod's containers: the versioned protocol (`proto`), a container's mounts as kubelet's makeMounts makes them (`mounts`, pure) and as OCI `config.json` entries (`oci`).

pub mod mounts;
pub mod oci;

/// The generated protocol, `kvol.runtime.v1alpha1`.
pub mod proto {
    tonic::include_proto!("kvol.runtime.v1alpha1");
}

pub use tonic::{Code, Status};

/// The socket's name under kvol's state directory.
pub const SOCKET_NAME: &str = "runtime.sock";

impl From<mounts::Propagation> for proto::MountPropagation {
    fn from(p: mounts::Propagation) -> proto::MountPropagation {
        match p {
            mounts::Propagation::Private => proto::MountPropagation::PropagationPrivate,
            mounts::Propagation::HostToContainer => proto::MountPropagation::PropagationHostToContainer,
            mounts::Propagation::Bidirectional => proto::MountPropagation::PropagationBidirectional,
        }
    }
}

/// A client of the API on `socket`.
pub async fn connect(
    socket: &std::path::Path,
) -> Result<proto::pod_volumes_client::PodVolumesClient<tonic::transport::Channel>, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
        .map_err(|e| format!("bad socket path {}: {e}", socket.display()))?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect to the runtime api at {}: {e}", socket.display()))?;
    Ok(proto::pod_volumes_client::PodVolumesClient::new(channel))
}
