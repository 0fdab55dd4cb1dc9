//! kvol's node agent: pods in, volumes attached, staged and published through whichever plugin serves them, state that survives a crash.

pub mod agent;
pub mod component_config;
pub mod components;
pub mod desired;
pub mod executor;
pub mod metrics;
pub mod model;
pub mod node_storage;
pub mod pod_events;
pub mod provision;
pub mod rebuild;
pub mod reconciler;
pub mod reconstruct;
pub mod snapshots;
pub mod source;
pub mod status;
pub mod store;
pub mod supervisor;
pub mod volume_stats;
pub use kvol_plugin::watched_dir;

pub use model::{
    ActualState, AttachedVolume, DesiredState, DesiredVolume, ObjectSet, Operation, PodVolumeKey,
    PublishedVolume, SourceProblem, StagedVolume,
};
