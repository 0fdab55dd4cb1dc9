//! kvol's node agent: pods in, volumes attached, staged and published through whichever plugin serves them, state that survives a crash.

pub mod model;

pub use model::{
    ActualState, AttachedVolume, DesiredState, DesiredVolume, ObjectSet, Operation, PodVolumeKey,
    PublishedVolume, SourceProblem, StagedVolume,
};
