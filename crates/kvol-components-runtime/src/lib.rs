//! kvol's component runtime: the storage components a standalone node runs, as processes the agent supervises.
//!
//! Rooms: [`supervisor`] (one process: started, probed through CSI `Probe`, restarted with
//! backoff, stopped), [`component_config`] (a component's config file: rendered by
//! `kvol-components`' pure `render`, checked, replaced whole), [`components`] (the running
//! set kept equal to `kvol_components::decide`'s answer, the config watches, the states the
//! status shows) and [`runtime`] (all of it as the agent holds it: started, changed, stopped). What should run is decided in `kvol-components` (pure), never here; this
//! crate carries it out. It may import `kvol-api`, `kvol-components`, `kvol-plugin` (the
//! watched directory, atomic files) and `kvol-csi` (the probe's client); the node loop
//! (`kvol-node`) and the binary import it, and nothing here imports them.

pub mod component_config;
pub mod components;
pub mod runtime;
pub mod supervisor;

pub use components::{ComponentPaths, ComponentStatus, Components, ComponentsSetup};
pub use runtime::{ComponentChange, ComponentRuntime};
