//! The pod a volume is published for, as the volume layer sees it.

use serde::{Deserialize, Serialize};

/// The pod a volume is published for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInfo {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub service_account: String,
    pub fs_group: Option<i64>,
    /// The pod's `securityContext.fsGroupChangePolicy`.
    #[serde(default)]
    pub fs_group_change_policy: FsGroupChangePolicy,
    /// The pod's memory limit, when every container has one
    /// ([`crate::projection::pod_memory_limit`]): what sizes its memory-backed volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
}

/// A service-account token to ask for: its audience and lifetime.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenAudience {
    /// The audience the token is for; empty means the API server's own.
    pub audience: String,
    /// How long the token should live; `None` leaves it to the API server (one hour).
    pub expiration_seconds: Option<i64>,
}

/// When the `fsGroup` ownership walk runs (`securityContext.fsGroupChangePolicy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsGroupChangePolicy {
    /// On every publish (upstream's default).
    #[default]
    Always,
    /// Only when the volume root's group or mode does not already match.
    OnRootMismatch,
}

/// What a node's pod runner tells the API about one pod: its status as kubelet writes it, or
/// (`status: None`) that the pod is gone from the node — containers stopped, volumes let go —
/// so its object may be deleted.
#[derive(Clone, Debug, PartialEq)]
pub struct PodStatusReport {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub status: Option<Box<k8s_openapi::api::core::v1::PodStatus>>,
}

/// One of kubelet's Events about a pod (Pulling, Pulled, Created, Started, Killing, BackOff,
/// Unhealthy, …), as a node's pod runner reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEventReport {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The container's field path (`spec.containers{name}`, `spec.initContainers{name}`) for
    /// an Event about a container, empty for one about the pod.
    pub field_path: String,
    /// `Normal` or `Warning`.
    pub kind: &'static str,
    pub reason: String,
    pub message: String,
}

/// What a node's pod runner reports for the API: a pod's status, or an Event about it.
#[derive(Clone, Debug, PartialEq)]
pub enum PodReport {
    Status(PodStatusReport),
    Event(PodEventReport),
}
