//! kvol's shared vocabulary: migratable plugins, feature gates and well-known keys; no I/O.

pub mod gates;
pub mod keys;
pub mod plugin;

pub use gates::{FeatureGates, Gate, GateError};
pub use plugin::MigratablePlugin;
