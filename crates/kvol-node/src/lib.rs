//! kvol's node loop: pods in, volumes attached, staged and published through whichever plugin serves them, state that survives a crash.
//!
//! Rooms, in the order of the flow ([`agent`] wires them and runs `Loop::pass`):
//! - [`sources`]: objects in (the manifests directory, code; the API server in `kvol-cluster`);
//! - [`desired`]: what is wanted (pods → volumes, pure) and how each is served (resolve);
//! - [`reconciler`]: what to do (pure);
//! - [`executor`]: doing it, one operation per volume, journalled;
//! - [`actual`]: what is — the journal ([`actual::store`]), what the node shows
//!   ([`actual::observe`]), the state rebuilt after a crash ([`actual::rebuild`],
//!   [`actual::reconstruct`]) and leftovers put right ([`actual::repair`]);
//! - [`report`]: what is shown — status, metrics, volume stats, pod events, the node's storage;
//! - [`runtime`]: the handoff to whatever runs the containers — the local API, its view of the
//!   node, and the runner's own pods.
//!
//! [`model`] is the vocabulary every room shares; [`config`] is how the agent runs. The
//! standalone control plane (`kvol-claims`) and the component runtime
//! (`kvol-components-runtime`) are crates of their own that the agent holds; nothing in them
//! imports this crate.

pub mod actual;
pub mod agent;
pub mod config;
pub mod desired;
pub mod executor;
pub mod model;
pub mod reconciler;
pub mod report;
pub mod runtime;
pub mod sources;
pub use kvol_plugin::watched_dir;

pub use config::AgentConfig;
pub use model::{
    ActualState, AttachedVolume, DesiredState, DesiredVolume, ObjectSet, Operation, PodVolumeKey,
    PublishedVolume, SourceProblem, StagedVolume,
};
