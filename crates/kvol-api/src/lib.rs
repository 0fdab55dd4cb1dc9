//! kvol's shared vocabulary: migratable plugins, feature gates and well-known keys; no I/O.

pub mod backoff;
pub mod config;
pub mod gates;
pub mod keys;
pub mod plugin;

pub use backoff::Backoff;
pub use config::KvolConfig;
pub use gates::{FeatureGates, Gate, GateError};
pub use plugin::MigratablePlugin;
