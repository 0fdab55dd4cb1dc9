//! kvol's standalone control plane: the jobs a cluster's external-provisioner and snapshot-controller do, done by kvol on a node with no control plane.
//!
//! Rooms:
//! - decisions, pure and table-tested: [`provision`] (which claims to provision, which
//!   provisioned volumes to reclaim, the provisioned PVs laid over the objects) and
//!   [`snapshots`] (which VolumeSnapshots to take, adopt or delete, a claim's restore source).
//!   They import only `kvol-api`, k8s-openapi and serde; built with `--no-default-features`
//!   the crate is these alone, and `kvol-csi-rules`' `tests/no_io_stacks.rs` checks that no
//!   runtime, gRPC or mount stack comes in.
//! - the runner (feature `runner`, on by default): [`wire`] (the CSI messages), [`records`]
//!   (what was done, on disk) and [`runner`] ([`ClaimsController`], one call per key at a time).
//!
//! The node loop (`kvol-node`) uses [`ClaimsController`] and nothing else of the runner;
//! nothing here imports `kvol-node`. Cluster mode does not start it: there the cluster's own
//! controllers do these jobs.

pub mod claim_status;
pub mod provision;
pub mod resize;
pub mod snapshots;

#[cfg(feature = "runner")]
pub mod records;
#[cfg(feature = "runner")]
pub mod runner;
#[cfg(feature = "runner")]
pub mod wire;

#[cfg(feature = "runner")]
pub use runner::ClaimsController;
