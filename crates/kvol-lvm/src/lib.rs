//! kvol's LVM CSI driver (`lvm.csi.kvol.io`): so far its configuration, a TopoLVM-compatible `lvmd.yaml`.
//!
//! - [`lvmd`]: the file's format exactly as TopoLVM's lvmd reads it, and TopoLVM's validation
//!   rules, every problem collected (pure).
//! - [`vgs`]: the node's volume groups from `vgs --reportformat json` output (pure).
//! - [`generate`]: the file kvol writes when there is none, and how a generated file is told from
//!   a user's (pure).
//! - [`command`]: lvm2's tools run with a deadline, killed when it passes, udev-free.
//! - [`config_file`]: reading the file, or generating it when absent, never replacing a user's.

pub mod capacity;
pub mod command;
pub mod config_file;
pub mod generate;
pub mod lvm;
pub mod lvmd;
pub mod lvs;
pub mod naming;
pub mod reload;
pub mod vgs;

/// The driver's default CSI name.
pub const DEFAULT_DRIVER_NAME: &str = "lvm.csi.kvol.io";
/// Where the driver's `lvmd.yaml` lives by default.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/kvol/lvmd.yaml";
