//! Runs a node's pods through CRI, getting their volumes only through kvol's runtime API.
//!
//! The decisions are pure and table-tested — `sandbox` (the sandbox config), `container` and
//! `env` (a container's config), `actions` (kubelet's computePodActions, the crash-loop
//! backoff and the pod phase), `status` (what `kvol status` shows); `runner` is the thin loop
//! that asks CRI and the runtime API and does what they decide.

pub mod actions;
pub mod admission;
pub mod api_status;
pub mod backoff;
pub mod container;
pub mod cri_view;
pub mod env;
pub mod hosts;
mod insecure_tls;
pub mod labels;
pub mod runner;
pub mod sandbox;
pub mod shared;
pub mod status;
#[cfg(test)]
mod test_pods;
pub mod worker;

pub use runner::{Runner, RunnerConfig, RunnerError};
pub mod prober;
pub mod probes;
pub mod pull_secrets;
