//! Flexvolume for kvol: exec drivers found at run time, driven by upstream's JSON protocol.

pub mod driver;
pub mod error;
pub mod install;
pub mod leftovers;
pub mod log_gate;
pub mod naming;
pub mod options;
pub mod plugin;
pub mod prober;
pub mod protocol;
pub mod status;
pub mod trust;

pub use driver::{CallLimits, FlexDriver};
pub use error::FlexError;
pub use install::{InstallOutcome, Installed, install};
pub use plugin::FlexVolumePlugin;
pub use prober::{DriverState, FlexProber, ProbedDriver, ProberConfig, probe_all_once};
pub use protocol::{Command, DriverCapabilities, DriverStatus};
