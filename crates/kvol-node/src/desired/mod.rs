//! What is wanted: the pods' volumes ([`pods`], pure) and how each is served ([`resolve`]).
//!
//! May import `model`, `sources` (the manifests' defaults) and the plugin registry's
//! snapshot; the reconciler and the executor read what this room decides, never the reverse.

pub mod pods;
pub mod resolve;

pub use pods::desired_state;
pub use resolve::resolve_all;
