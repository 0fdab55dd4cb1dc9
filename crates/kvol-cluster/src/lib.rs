//! Cluster mode: the Kubernetes API server as the agent's object source.
//!
//! [`source::ApiSource`] is an [`kvol_node::sources::ObjectSource`] fed by the API: the pods
//! bound to this node (one watch, field selector `spec.nodeName`), every CSIDriver (few; one
//! watch), and only the claims, PersistentVolumes and StorageClasses those pods reference
//! ([`refs`], read by name) and the ConfigMaps and Secrets they reference (one watch per
//! object, field selector `metadata.name`, shared by its referrers: `follow`), so a node's load
//! on the API grows with its own pods, not with the cluster. The agent's loop, planner and
//! executor are the same in both modes.
//! [`events::EventWriter`] makes the pods' volume Events (kubelet's reasons, one per failure).
//! [`attachments::ApiAttachments`] gives the CSI plugins the VolumeAttachments they wait for,
//! [`tokens::ApiTokens`] the service-account tokens their CSIDrivers ask for.

pub mod attachments;
pub mod bootstrap;
pub mod bundles;
pub mod claims;
pub mod client;
pub mod client_cert;
pub mod events;
mod follow;
pub mod inventory;
pub mod merged;
pub mod mirror_pods;
pub mod node_objects;
pub mod node_registration;
pub mod node_taints;
pub mod pod_status;
pub mod refs;
pub mod source;
pub mod tokens;
mod watching;
