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
