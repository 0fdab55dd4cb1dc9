//! The runtime handoff: what whatever runs a pod's containers asks of its volume manager — kubelet's WaitForAttachAndMount, makeMounts and WaitForUnmount as a local gRPC API ([`server`]), from a view of the node the loop publishes each pass ([`view`], pure), and the runner's own pods, a third object source ([`runner_pods`]).
//!
//! Imports `report` (the volumes' status) and `sources` (a runner's pod is checked as a
//! manifest's is); nothing else of the loop.

pub mod runner_pods;
pub mod server;
pub mod view;
