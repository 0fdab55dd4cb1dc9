//! kvol's local API for whatever runs a pod's containers: the versioned protocol (`proto`), a container's mounts as kubelet's makeMounts makes them (`mounts`, pure) and as OCI `config.json` entries (`oci`).

pub mod mounts;
pub mod oci;

/// The generated protocol, `kvol.runtime.v1alpha1`.
pub mod proto {
    tonic::include_proto!("kvol.runtime.v1alpha1");
}

use std::path::{Path, PathBuf};
use std::time::Duration;

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
pub type Client = proto::pod_volumes_client::PodVolumesClient<tonic::transport::Channel>;

/// How often a waiting [`connect_within`] tries the socket again.
const RETRY_EVERY: Duration = Duration::from_millis(50);

/// Why no client could be had.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("bad socket path {socket}: {reason}")]
    BadPath { socket: PathBuf, reason: String },
    #[error(
        "no kvol agent answers at {socket}{waited}: is `kvol agent` running? point at it with \
         --state-dir DIR (its --state-dir or --root) or --socket PATH ({reason})",
        waited = waited_words(*.waited)
    )]
    NoAgent { socket: PathBuf, waited: Duration, reason: String },
}

fn waited_words(waited: Duration) -> String {
    if waited.is_zero() { String::new() } else { format!(" after waiting {:.1} s", waited.as_secs_f64()) }
}

/// A client of the API on `socket`, tried once: an agent that does not answer there (no
/// socket, a stale one, one not yet listening) is [`ConnectError::NoAgent`].
pub async fn connect(socket: &Path) -> Result<Client, ConnectError> {
    connect_within(socket, Duration::ZERO, || {}).await
}

/// A client of the API on `socket`, waiting up to `wait` for an agent that is still starting
/// (the socket not there yet, or there and not yet listening, or left by an agent that was
/// killed): tried every 50 ms until it answers. `waiting` is called once, when the first try
/// fails and the wait begins, so a command can say what it waits for.
pub async fn connect_within(
    socket: &Path,
    wait: Duration,
    waiting: impl FnOnce(),
) -> Result<Client, ConnectError> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
        .map_err(|e| ConnectError::BadPath { socket: socket.to_path_buf(), reason: e.to_string() })?;
    let start = tokio::time::Instant::now();
    let mut waiting = Some(waiting);
    loop {
        let error = match endpoint.connect().await {
            Ok(channel) => return Ok(Client::new(channel)),
            Err(e) => e,
        };
        let waited = start.elapsed();
        if waited + RETRY_EVERY > wait {
            let reason = connect_reason(socket, &error);
            return Err(ConnectError::NoAgent { socket: socket.to_path_buf(), waited, reason });
        }
        if let Some(say) = waiting.take() {
            say();
        }
        tokio::time::sleep(RETRY_EVERY).await;
    }
}

/// The connect failure in words: the socket's absence said plainly, else the error's own chain.
fn connect_reason(socket: &Path, error: &tonic::transport::Error) -> String {
    if !socket.exists() {
        return "no such socket".to_string();
    }
    let mut words = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        words = format!("{words}: {cause}");
        source = cause.source();
    }
    words
}
