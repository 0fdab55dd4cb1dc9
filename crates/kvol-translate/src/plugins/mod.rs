//! One translator per migratable plugin, each compiled in by its cargo feature.

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use kvol_api::MigratablePlugin;

use crate::Result;

#[cfg(feature = "aws-ebs")]
mod aws_ebs;
#[cfg(feature = "azure-disk")]
mod azure_disk;
#[cfg(feature = "azure-file")]
mod azure_file;
#[cfg(feature = "cinder")]
mod cinder;
#[cfg(feature = "gce-pd")]
mod gce_pd;
#[cfg(feature = "portworx")]
mod portworx;
#[cfg(feature = "rbd")]
mod rbd;
#[cfg(test)]
pub(crate) mod test_support;
#[cfg(feature = "vsphere")]
mod vsphere;

/// The translation rules of one in-tree plugin. The dispatcher in `lib.rs` has already checked
/// that the object carries exactly this plugin's source (or, for CSI → in-tree, its driver);
/// PVs passed by `&mut` are the caller's copies and become the output.
pub(crate) trait Translator: Sync {
    /// StorageClass parameters and topology for the CSI driver.
    fn storage_class_to_csi(&self, sc: StorageClass) -> Result<StorageClass>;
    /// A new PV with a CSI source for a pod's inline volume.
    fn inline_to_csi(&self, vol: &Volume, pod_namespace: &str) -> Result<PersistentVolume>;
    /// Replaces the PV's in-tree source by a CSI source, in place (a PV is 3.5 KB: moving it
    /// through calls costs more than most translations). On error the PV is discarded.
    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<()>;
    /// Replaces the PV's CSI source by the in-tree source, in place; on error it is discarded.
    fn csi_pv_to_in_tree(&self, pv: &mut PersistentVolume) -> Result<()>;
    /// A volume handle completed from the node ID; most drivers need nothing.
    fn repair_volume_handle(&self, volume_handle: &str, _node_id: &str) -> Result<String> {
        Ok(volume_handle.to_string())
    }
}

/// The translator of `plugin`, if this build has it.
pub(crate) fn translator(plugin: MigratablePlugin) -> Option<&'static dyn Translator> {
    #[allow(unreachable_patterns)]
    match plugin {
        #[cfg(feature = "aws-ebs")]
        MigratablePlugin::AwsEbs => Some(&aws_ebs::AwsEbs),
        #[cfg(feature = "gce-pd")]
        MigratablePlugin::GcePd => Some(&gce_pd::GcePd),
        #[cfg(feature = "azure-disk")]
        MigratablePlugin::AzureDisk => Some(&azure_disk::AzureDisk),
        #[cfg(feature = "azure-file")]
        MigratablePlugin::AzureFile => Some(&azure_file::AzureFile),
        #[cfg(feature = "cinder")]
        MigratablePlugin::Cinder => Some(&cinder::Cinder),
        #[cfg(feature = "vsphere")]
        MigratablePlugin::Vsphere => Some(&vsphere::Vsphere),
        #[cfg(feature = "portworx")]
        MigratablePlugin::Portworx => Some(&portworx::Portworx),
        #[cfg(feature = "rbd")]
        MigratablePlugin::Rbd => Some(&rbd::Rbd),
        _ => None,
    }
}
