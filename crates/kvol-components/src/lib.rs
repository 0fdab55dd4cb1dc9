//! Optional storage components (the MicroShift problem): definitions as data, and one pure
//! decision of which components should run, shared by every caller.
//!
//! - [`definition`]: what a component is (name, what it provides, how it runs standalone),
//!   parsed and checked from YAML; kvol ships some built in and a user drops more in a directory.
//! - [`catalogue`]: the built-in definitions plus a directory's, with problems per file.
//! - [`selection`]: the `storage` config section checked against the catalogue, all problems at
//!   once, and the verdict for every component. The deployer, `kvol components` and any health
//!   check ask [`selection::decide`]; none keeps its own copy of the rules.
//!
//! No I/O except [`catalogue::Catalogue::load`], which reads a directory of definitions.

pub mod bundle;
pub mod catalogue;
pub mod cluster_footprint;
pub mod component_config;
pub mod definition;
pub mod selection;
pub mod uninstall;

pub use catalogue::{Catalogue, CatalogueProblem};
pub use definition::{ComponentDefinition, DefinitionError, NodeFeature, Role};
pub use selection::{ConfigProblem, Decision, NodeFacts, Verdict, decide, decide_for_cluster};
