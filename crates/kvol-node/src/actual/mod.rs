//! What is: the journal of what the node has ([`store`]; a damaged one kept aside, [`damage`]), what the node shows ([`observe`]), the state rebuilt after a crash ([`rebuild`], pure, and [`reconstruct`], pure), and leftovers put right ([`repair`]).
//!
//! May import `model`, `sources` (the journal remembers manifests' last clean texts),
//! `desired::resolve` (which plugin a reconstructed volume needs) and the executor (repair
//! hands it what it finds); the reconciler reads the actual state through the executor.

pub mod damage;
pub mod observe;
pub mod rebuild;
pub mod reconstruct;
pub mod repair;
pub mod store;
