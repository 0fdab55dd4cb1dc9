//! What is shown: the status report and its file ([`status_report`], [`status`]), Prometheus metrics ([`metrics`]), volume stats ([`volume_stats`]), pods' Events ([`pod_events`]) and the node's storage for a cluster ([`node_storage`]).
//!
//! May import `model`, the reconciler's resolutions and the executor's snapshot; nothing in
//! the loop's other rooms imports this one except the executor (its operation metrics).

pub mod claim_status;
pub mod metrics;
pub mod node_storage;
pub mod pod_events;
pub mod status;
pub mod status_report;
pub mod volume_stats;
