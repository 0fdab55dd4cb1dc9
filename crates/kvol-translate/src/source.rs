//! Which volume sources a PV or inline volume sets, and which migratable plugin owns each.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec, Volume};
use kvol_api::MigratablePlugin;

type Probe<T> = (&'static str, fn(&T) -> bool, Option<MigratablePlugin>);

/// Every volume source field of a PV spec, with the migratable plugin that owns it.
const PV_SOURCES: &[Probe<PersistentVolumeSpec>] = &[
    ("awsElasticBlockStore", |s| s.aws_elastic_block_store.is_some(), Some(MigratablePlugin::AwsEbs)),
    ("azureDisk", |s| s.azure_disk.is_some(), Some(MigratablePlugin::AzureDisk)),
    ("azureFile", |s| s.azure_file.is_some(), Some(MigratablePlugin::AzureFile)),
    ("cephfs", |s| s.cephfs.is_some(), None),
    ("cinder", |s| s.cinder.is_some(), Some(MigratablePlugin::Cinder)),
    ("csi", |s| s.csi.is_some(), None),
    ("fc", |s| s.fc.is_some(), None),
    ("flexVolume", |s| s.flex_volume.is_some(), None),
    ("flocker", |s| s.flocker.is_some(), None),
    ("gcePersistentDisk", |s| s.gce_persistent_disk.is_some(), Some(MigratablePlugin::GcePd)),
    ("glusterfs", |s| s.glusterfs.is_some(), None),
    ("hostPath", |s| s.host_path.is_some(), None),
    ("iscsi", |s| s.iscsi.is_some(), None),
    ("local", |s| s.local.is_some(), None),
    ("nfs", |s| s.nfs.is_some(), None),
    ("photonPersistentDisk", |s| s.photon_persistent_disk.is_some(), None),
    ("portworxVolume", |s| s.portworx_volume.is_some(), Some(MigratablePlugin::Portworx)),
    ("quobyte", |s| s.quobyte.is_some(), None),
    ("rbd", |s| s.rbd.is_some(), Some(MigratablePlugin::Rbd)),
    ("scaleIO", |s| s.scale_io.is_some(), None),
    ("storageos", |s| s.storageos.is_some(), None),
    ("vsphereVolume", |s| s.vsphere_volume.is_some(), Some(MigratablePlugin::Vsphere)),
];

/// Every volume source field of a pod volume, with the migratable plugin that owns it.
const INLINE_SOURCES: &[Probe<Volume>] = &[
    ("awsElasticBlockStore", |v| v.aws_elastic_block_store.is_some(), Some(MigratablePlugin::AwsEbs)),
    ("azureDisk", |v| v.azure_disk.is_some(), Some(MigratablePlugin::AzureDisk)),
    ("azureFile", |v| v.azure_file.is_some(), Some(MigratablePlugin::AzureFile)),
    ("cephfs", |v| v.cephfs.is_some(), None),
    ("cinder", |v| v.cinder.is_some(), Some(MigratablePlugin::Cinder)),
    ("configMap", |v| v.config_map.is_some(), None),
    ("csi", |v| v.csi.is_some(), None),
    ("downwardAPI", |v| v.downward_api.is_some(), None),
    ("emptyDir", |v| v.empty_dir.is_some(), None),
    ("ephemeral", |v| v.ephemeral.is_some(), None),
    ("fc", |v| v.fc.is_some(), None),
    ("flexVolume", |v| v.flex_volume.is_some(), None),
    ("flocker", |v| v.flocker.is_some(), None),
    ("gcePersistentDisk", |v| v.gce_persistent_disk.is_some(), Some(MigratablePlugin::GcePd)),
    ("gitRepo", |v| v.git_repo.is_some(), None),
    ("glusterfs", |v| v.glusterfs.is_some(), None),
    ("hostPath", |v| v.host_path.is_some(), None),
    ("image", |v| v.image.is_some(), None),
    ("iscsi", |v| v.iscsi.is_some(), None),
    ("nfs", |v| v.nfs.is_some(), None),
    ("persistentVolumeClaim", |v| v.persistent_volume_claim.is_some(), None),
    ("photonPersistentDisk", |v| v.photon_persistent_disk.is_some(), None),
    ("portworxVolume", |v| v.portworx_volume.is_some(), Some(MigratablePlugin::Portworx)),
    ("projected", |v| v.projected.is_some(), None),
    ("quobyte", |v| v.quobyte.is_some(), None),
    ("rbd", |v| v.rbd.is_some(), Some(MigratablePlugin::Rbd)),
    ("scaleIO", |v| v.scale_io.is_some(), None),
    ("secret", |v| v.secret.is_some(), None),
    ("storageos", |v| v.storageos.is_some(), None),
    ("vsphereVolume", |v| v.vsphere_volume.is_some(), Some(MigratablePlugin::Vsphere)),
];

/// The source fields a PV sets (by their API names), each with its migratable plugin if any.
pub fn pv_sources(pv: &PersistentVolume) -> Vec<(&'static str, Option<MigratablePlugin>)> {
    match &pv.spec {
        Some(spec) => PV_SOURCES.iter().filter(|(_, set, _)| set(spec)).map(|(f, _, p)| (*f, *p)).collect(),
        None => Vec::new(),
    }
}

/// The source fields an inline volume sets (by their API names), each with its migratable plugin if any.
pub fn inline_sources(vol: &Volume) -> Vec<(&'static str, Option<MigratablePlugin>)> {
    INLINE_SOURCES.iter().filter(|(_, set, _)| set(vol)).map(|(f, _, p)| (*f, *p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{AWSElasticBlockStoreVolumeSource, NFSVolumeSource};

    #[test]
    fn every_source_field_is_listed_once() {
        // A new k8s-openapi release with a new source must be added here; the count keeps us honest.
        assert_eq!(PV_SOURCES.len(), 22);
        assert_eq!(INLINE_SOURCES.len(), 30);
        for table in
            [PV_SOURCES.iter().map(|p| p.0).collect::<Vec<_>>(), INLINE_SOURCES.iter().map(|p| p.0).collect()]
        {
            let mut sorted = table.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), table.len());
        }
        for plugin in MigratablePlugin::ALL {
            assert_eq!(PV_SOURCES.iter().filter(|p| p.2 == Some(plugin)).count(), 1, "{plugin}");
            assert_eq!(INLINE_SOURCES.iter().filter(|p| p.2 == Some(plugin)).count(), 1, "{plugin}");
        }
    }

    #[test]
    fn sources_are_reported_in_field_order() {
        let pv = PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                nfs: Some(NFSVolumeSource::default()),
                aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource::default()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            pv_sources(&pv),
            vec![("awsElasticBlockStore", Some(MigratablePlugin::AwsEbs)), ("nfs", None)]
        );
        assert!(pv_sources(&PersistentVolume::default()).is_empty());
    }
}

/// What a spec's sources say about translation, found without allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SingleSource {
    /// No source field is set.
    Nothing,
    /// Exactly one source field is set; the plugin if it is migratable.
    One(Option<MigratablePlugin>),
    /// Several source fields are set.
    Many,
}

fn single<T>(probes: &[Probe<T>], value: &T) -> SingleSource {
    let mut found = SingleSource::Nothing;
    for (_, set, plugin) in probes {
        if set(value) {
            if found != SingleSource::Nothing {
                return SingleSource::Many;
            }
            found = SingleSource::One(*plugin);
        }
    }
    found
}

pub(crate) fn single_pv_source(pv: &PersistentVolume) -> SingleSource {
    pv.spec.as_ref().map_or(SingleSource::Nothing, |s| single(PV_SOURCES, s))
}

pub(crate) fn single_inline_source(vol: &Volume) -> SingleSource {
    single(INLINE_SOURCES, vol)
}
