//! The volume snapshot kinds (`snapshot.storage.k8s.io/v1`, CRDs, so not in k8s-openapi): the fields kvol acts on, spelled as the API spells them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// The API group and version of the snapshot kinds.
pub const API_VERSION: &str = "snapshot.storage.k8s.io/v1";
/// The annotation that makes a VolumeSnapshotClass its driver's default.
pub const ANN_DEFAULT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";

/// A request for a snapshot of a claim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshot {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeSnapshotSpec,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSpec {
    /// The class; unset: the default class of the source volume's driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    #[serde(default)]
    pub source: VolumeSnapshotSource,
}

/// What the snapshot is of: a claim in the snapshot's namespace, or a pre-provisioned
/// VolumeSnapshotContent (a snapshot that exists on the driver already).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_content_name: Option<String>,
}

/// How snapshots of a driver are taken and what deleting one does.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotClass {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub driver: String,
    /// `Delete` (the snapshot on the driver goes with the VolumeSnapshot) or `Retain`.
    pub deletion_policy: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
}

impl VolumeSnapshotClass {
    /// Whether the class is marked as its driver's default.
    pub fn is_default(&self) -> bool {
        self.metadata.annotations.as_ref().and_then(|a| a.get(ANN_DEFAULT_CLASS)).is_some_and(|v| v == "true")
    }
}

/// A snapshot on a driver, as the cluster knows it. kvol reads the pre-provisioned kind
/// (`source.snapshotHandle`, written by a person to bring an existing snapshot in); the
/// dynamic kind (`source.volumeHandle`) is what a snapshot controller writes for itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContent {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeSnapshotContentSpec,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSpec {
    /// `Delete` (the snapshot on the driver goes with its VolumeSnapshot) or `Retain`.
    #[serde(default)]
    pub deletion_policy: String,
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub source: VolumeSnapshotContentSource,
    /// The VolumeSnapshot this content is for; the two must name each other.
    #[serde(default)]
    pub volume_snapshot_ref: SnapshotReference,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
}

/// Where a content's snapshot comes from: exactly one of the two.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSource {
    /// The driver's id of a snapshot that exists (pre-provisioned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
    /// The volume to take a snapshot of (dynamic; a controller's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_handle: Option<String>,
}

/// The VolumeSnapshot a content is bound to (an ObjectReference; kvol reads its name and
/// namespace).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotReference {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
}
