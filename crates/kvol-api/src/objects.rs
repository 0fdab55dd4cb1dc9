//! What a source holds at one moment: the objects volumes need and the problems found reading them; plain data, no I/O.
//!
//! The node loop (`kvol-node`) and the standalone control plane (`kvol-claims`) both read it;
//! neither owns it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use serde::{Deserialize, Serialize};

/// Something wrong with one document of a source, with where it is; the other documents are
/// unaffected.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceProblem {
    /// The file (or `api` in cluster mode) the document came from.
    pub origin: String,
    /// The document's 1-based position in its file, when known.
    pub document: Option<usize>,
    pub reason: String,
}

impl fmt::Display for SourceProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.document {
            Some(n) => write!(f, "{} document {n}: {}", self.origin, self.reason),
            None => write!(f, "{}: {}", self.origin, self.reason),
        }
    }
}

/// Everything a source holds at one moment: the objects volumes need, by namespace/name (or
/// name for cluster-scoped kinds), and the problems found reading them. Its debug output
/// shows Secrets' keys, never their values.
#[derive(Clone, Default, PartialEq)]
pub struct ObjectSet {
    /// Pods by `namespace/name`; shared (with the manifests' parse cache, with the sets made
    /// from this one), as a pod weighs kilobytes.
    pub pods: BTreeMap<String, Arc<Pod>>,
    /// PersistentVolumes by name; shared (with the provisioned records, with the specs of the
    /// volumes they serve).
    pub persistent_volumes: BTreeMap<String, Arc<PersistentVolume>>,
    /// PersistentVolumeClaims by `namespace/name`.
    pub claims: BTreeMap<String, PersistentVolumeClaim>,
    /// StorageClasses by name.
    pub storage_classes: BTreeMap<String, StorageClass>,
    /// CSIDrivers by name.
    pub csi_drivers: BTreeMap<String, CSIDriver>,
    /// Secrets by `namespace/name`.
    pub secrets: BTreeMap<String, Secret>,
    /// ConfigMaps by `namespace/name`.
    pub config_maps: BTreeMap<String, ConfigMap>,
    /// VolumeSnapshots by `namespace/name`.
    pub volume_snapshots: BTreeMap<String, crate::snapshot::VolumeSnapshot>,
    /// VolumeSnapshotClasses by name.
    pub snapshot_classes: BTreeMap<String, crate::snapshot::VolumeSnapshotClass>,
    /// VolumeSnapshotContents by name (the pre-provisioned ones a person wrote).
    pub snapshot_contents: BTreeMap<String, crate::snapshot::VolumeSnapshotContent>,
    pub problems: Vec<SourceProblem>,
}

impl fmt::Debug for ObjectSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectSet")
            .field("pods", &self.pods)
            .field("persistent_volumes", &self.persistent_volumes)
            .field("claims", &self.claims)
            .field("storage_classes", &self.storage_classes)
            .field("csi_drivers", &self.csi_drivers)
            .field("secrets", &crate::redacted::RedactedSecrets(&self.secrets))
            .field("config_maps", &self.config_maps.keys().collect::<Vec<_>>())
            .field("volume_snapshots", &self.volume_snapshots)
            .field("snapshot_classes", &self.snapshot_classes)
            .field("snapshot_contents", &self.snapshot_contents)
            .field("problems", &self.problems)
            .finish()
    }
}
