//! The one error type of Flexvolume: driver calls, loading, trust, discovery and installs.

use std::path::PathBuf;
use std::time::Duration;

/// Why a Flexvolume operation failed. Messages are lower-case and name the driver, command or path.
#[derive(Debug, thiserror::Error)]
pub enum FlexError {
    #[error("flexvolume driver {driver}: cannot run {command}: {source}")]
    Spawn {
        driver: String,
        command: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "flexvolume driver {driver}: {command} did not finish within {limit:?}; its process group was killed"
    )]
    Timeout { driver: String, command: &'static str, limit: Duration },
    #[error(
        "flexvolume driver {driver}: {command} wrote more than {limit} bytes of output; its process group was killed"
    )]
    OutputTooLarge { driver: String, command: &'static str, limit: usize },
    #[error(
        "flexvolume driver {driver}: {command} printed output that is not a driver status ({reason}): {head:?}"
    )]
    BadOutput { driver: String, command: &'static str, reason: String, head: String },
    #[error("flexvolume driver {driver}: {command} command failed, status: {status}, reason: {message}")]
    Failed { driver: String, command: &'static str, status: String, message: String },
    #[error("flexvolume driver {driver}: {command} is not supported")]
    NotSupported { driver: String, command: &'static str },
    /// A driver bug upstream also refuses: a Success body with a non-zero exit status.
    #[error("flexvolume driver {driver}: {command} exited with {exit} although it printed status Success")]
    SuccessWithFailedExit { driver: String, command: &'static str, exit: String },
    #[error("flexvolume driver directory {}: {reason}", dir.display())]
    InvalidName { dir: PathBuf, reason: String },
    #[error("refusing flexvolume driver {}: {reason}", path.display())]
    Untrusted { path: PathBuf, reason: String },
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("flexvolume driver {driver}: {reason}")]
    Protocol { driver: String, reason: String },
}

impl FlexError {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> FlexError {
        FlexError::Io { op, path: path.into(), source }
    }

    /// Whether this is the driver saying "Not supported" (so the caller falls back).
    pub fn is_not_supported(&self) -> bool {
        matches!(self, FlexError::NotSupported { .. })
    }
}

impl From<FlexError> for kvol_plugin::PluginError {
    fn from(e: FlexError) -> Self {
        let plugin = match &e {
            FlexError::Spawn { driver, .. }
            | FlexError::Timeout { driver, .. }
            | FlexError::OutputTooLarge { driver, .. }
            | FlexError::BadOutput { driver, .. }
            | FlexError::Failed { driver, .. }
            | FlexError::NotSupported { driver, .. }
            | FlexError::SuccessWithFailedExit { driver, .. }
            | FlexError::Protocol { driver, .. } => driver.clone(),
            FlexError::InvalidName { dir, .. } => dir.display().to_string(),
            FlexError::Untrusted { path, .. } | FlexError::Io { path, .. } => path.display().to_string(),
        };
        // A call killed at its deadline or for its output, or one whose output cannot be read,
        // may have done its work.
        let outcome_unknown = matches!(
            e,
            FlexError::Timeout { .. } | FlexError::OutputTooLarge { .. } | FlexError::BadOutput { .. }
        );
        kvol_plugin::PluginError::Driver { plugin, source: Box::new(e), outcome_unknown }
    }
}

/// The result of Flexvolume operations.
pub type Result<T, E = FlexError> = std::result::Result<T, E>;
