//! kvol's shared vocabulary: migratable plugins, feature gates, well-known keys and object validation; no I/O.

pub mod allocatable;
pub mod backoff;
pub mod config;
pub mod downward;
pub mod field;
pub mod gates;
pub mod go_duration;
pub mod keys;
pub mod objects;
pub mod plugin;
pub mod pod;
pub mod projection;
pub mod quantity;
pub mod redacted;
pub mod snapshot;
pub mod subpath_expr;
pub mod validation;
pub mod volume_mode;

pub use backoff::Backoff;
pub use config::{KvolConfig, StorageSection};
pub use gates::{FeatureGates, Gate, GateError};
pub use objects::{ObjectSet, SourceProblem};
pub use plugin::MigratablePlugin;
pub use volume_mode::VolumeMode;

/// What a JSON value is, in words, for errors that say what was found instead of what was
/// expected ("expected a mapping, found a list").
pub fn json_kind(value: &k8s_openapi::serde_json::Value) -> &'static str {
    use k8s_openapi::serde_json::Value;
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}
