//! Well-known label, annotation and parameter keys, spelled exactly as upstream spells them.

/// GA zone label and node-affinity key.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// GA region label and node-affinity key.
pub const LABEL_TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";
/// Deprecated beta zone label.
pub const LABEL_FAILURE_DOMAIN_BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
/// Deprecated beta region label.
pub const LABEL_FAILURE_DOMAIN_BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
/// Separator of several zones in one zone label value.
pub const LABEL_MULTI_ZONE_DELIMITER: &str = "__";

/// Set on PVs and PVCs whose provisioning and deletion a CSI driver took over.
pub const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
/// The plugin or driver that provisioned a PV.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The provisioner that should act on a PVC.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// The beta spelling of [`ANN_STORAGE_PROVISIONER`].
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// The resizer that should expand a PVC.
pub const ANN_STORAGE_RESIZER: &str = "volume.kubernetes.io/storage-resizer";
/// On CSINode: the in-tree plugins this node has migrated, sorted and comma-joined.
pub const ANN_MIGRATED_PLUGINS: &str = "storage.alpha.kubernetes.io/migrated-plugins";

/// StorageClass parameter naming the filesystem type, in-tree spelling (matched case-insensitively).
pub const PARAM_FSTYPE: &str = "fstype";
/// StorageClass parameter naming the filesystem type, CSI spelling.
pub const PARAM_CSI_FSTYPE: &str = "csi.storage.k8s.io/fstype";

/// The Node annotation by which a node's volume manager hands attach and detach to the
/// attach/detach controller (kubelet sets it to `"true"` when it registers with
/// `--enable-controller-attach-detach`, the default); the controller ignores the volumes of a
/// node without it.
pub const ANN_CONTROLLER_MANAGED_ATTACH_DETACH: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";
