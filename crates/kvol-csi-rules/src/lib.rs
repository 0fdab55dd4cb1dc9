//! CSI's rules on a node as pure functions, reachable by a control-plane tool without the mount, exec or gRPC stacks.
//!
//! - [`policy`]: what a driver's CSIDriver object asks (upstream's defaults, lifecycle modes,
//!   fsGroup policy), access modes, the volume context, publish contexts.
//! - [`versions`]: the CSI versions a registering driver offers, and the duplicate-name rule.
//! - [`csinode`]: this node's CSINode entry, node-ID annotation, topology labels and migration
//!   annotation, as edits of the objects.
//! - [`names`]: upstream's hashed names (VolumeAttachment names, ephemeral volume handles).
//! - [`tokens`]: a CSIDriver's `tokenRequests` and the volume-context value they travel in.
//!
//! Nothing here does I/O, and the crate depends on neither tokio nor nix (a test in `kvol`
//! checks the dependency graph). `kvol-csi` re-exports these modules under its own paths.

pub mod csinode;
pub mod names;
pub mod policy;
pub mod tokens;
pub mod versions;

pub use policy::{AccessMode, DriverPolicy, FsGroupPolicy, LifecycleMode, PolicyRefusal};
pub use tokens::TokenAudience;
pub use versions::Version;
