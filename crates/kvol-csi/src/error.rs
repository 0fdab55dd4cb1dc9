//! The one error type of CSI: connections, RPCs, registration, policy and the bundled driver's setup.

use std::path::PathBuf;
use std::time::Duration;

/// Why a CSI operation failed. Messages are lower-case and name the driver, RPC, socket or path.
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    #[error("csi driver {driver}: cannot connect to {endpoint}: {reason}")]
    Connect { driver: String, endpoint: String, reason: String },
    /// A gRPC call that returned a status; `retriable` says whether trying again can help.
    #[error("csi driver {driver}: {rpc} failed ({code:?}{}): {message}", if *retriable { ", will retry" } else { "" })]
    Rpc { driver: String, rpc: &'static str, code: tonic::Code, message: String, retriable: bool },
    #[error("csi driver {driver}: {rpc} did not answer within {limit:?}")]
    Timeout { driver: String, rpc: &'static str, limit: Duration },
    #[error("csi driver {driver}: {reason}")]
    Driver { driver: String, reason: String },
    #[error("plugin socket {}: {reason}", socket.display())]
    Registration { socket: PathBuf, reason: String },
    #[error("csi driver {driver}: {reason}")]
    Policy { driver: String, reason: String },
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl CsiError {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> CsiError {
        CsiError::Io { op, path: path.into(), source }
    }

    /// Whether retrying the same operation later can succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            CsiError::Rpc { retriable, .. } => *retriable,
            CsiError::Connect { .. } | CsiError::Timeout { .. } => true,
            _ => false,
        }
    }

    /// Whether the call may have taken effect at the driver although it failed: it timed out,
    /// the connection broke under it, or the driver's code says the operation may still be in
    /// progress (the retriable codes, as upstream's `isFinalError` marks progress uncertain). A
    /// socket that could not be dialled never reached the driver.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, CsiError::Timeout { .. } | CsiError::Rpc { retriable: true, .. })
    }

    /// The driver (or socket) the error is about.
    pub fn subject(&self) -> String {
        match self {
            CsiError::Connect { driver, .. }
            | CsiError::Rpc { driver, .. }
            | CsiError::Timeout { driver, .. }
            | CsiError::Driver { driver, .. }
            | CsiError::Policy { driver, .. } => driver.clone(),
            CsiError::Registration { socket, .. } => socket.display().to_string(),
            CsiError::Io { path, .. } => path.display().to_string(),
        }
    }
}

impl From<CsiError> for kvol_plugin::PluginError {
    fn from(e: CsiError) -> Self {
        let outcome_unknown = e.outcome_unknown();
        kvol_plugin::PluginError::Driver { plugin: e.subject(), source: Box::new(e), outcome_unknown }
    }
}

/// The result of CSI operations.
pub type Result<T, E = CsiError> = std::result::Result<T, E>;
