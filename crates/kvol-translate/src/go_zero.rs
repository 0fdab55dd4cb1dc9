//! Go's zero values made absent in the volume sources translation writes, as Go's JSON omits them.
//!
//! Upstream's sources hold plain Go `bool`, `string` and `int32` fields (`omitempty`), so
//! `readOnly: false`, `fsType: ""` and `partition: 0` cannot exist there: they are simply unset.
//! k8s-openapi has `Option`s that can hold them, so after a translation the dispatcher clears
//! them from the source it produced. Fields that are pointers in Go (Azure Disk's `readOnly`,
//! `fsType`, `cachingMode`, `kind`; Azure File's `secretNamespace`) keep their value: Go keeps
//! a pointer to `false` or `""` too.

use k8s_openapi::api::core::v1::PersistentVolumeSpec;

fn bool_field(v: &mut Option<bool>) {
    if *v == Some(false) {
        *v = None;
    }
}

fn string_field(v: &mut Option<String>) {
    if v.as_deref() == Some("") {
        *v = None;
    }
}

fn int_field(v: &mut Option<i32>) {
    if *v == Some(0) {
        *v = None;
    }
}

/// Clears Go zero values from the CSI source of a spec produced by an in-tree → CSI translation.
pub(crate) fn csi_source(spec: &mut PersistentVolumeSpec) {
    if let Some(csi) = spec.csi.as_mut() {
        bool_field(&mut csi.read_only);
        string_field(&mut csi.fs_type);
    }
}

/// Clears Go zero values from the in-tree source of a spec produced by a CSI → in-tree translation.
pub(crate) fn in_tree_source(spec: &mut PersistentVolumeSpec) {
    if let Some(s) = spec.aws_elastic_block_store.as_mut() {
        string_field(&mut s.fs_type);
        int_field(&mut s.partition);
        bool_field(&mut s.read_only);
    }
    if let Some(s) = spec.gce_persistent_disk.as_mut() {
        string_field(&mut s.fs_type);
        int_field(&mut s.partition);
        bool_field(&mut s.read_only);
    }
    if let Some(s) = spec.azure_file.as_mut() {
        bool_field(&mut s.read_only);
    }
    if let Some(s) = spec.cinder.as_mut() {
        string_field(&mut s.fs_type);
        bool_field(&mut s.read_only);
    }
    if let Some(s) = spec.vsphere_volume.as_mut() {
        string_field(&mut s.fs_type);
        string_field(&mut s.storage_policy_name);
        string_field(&mut s.storage_policy_id);
    }
    if let Some(s) = spec.portworx_volume.as_mut() {
        string_field(&mut s.fs_type);
        bool_field(&mut s.read_only);
    }
    if let Some(s) = spec.rbd.as_mut() {
        string_field(&mut s.fs_type);
        string_field(&mut s.pool);
        string_field(&mut s.user);
        string_field(&mut s.keyring);
        bool_field(&mut s.read_only);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{AzureDiskVolumeSource, CSIPersistentVolumeSource};

    #[test]
    fn zero_values_go_and_pointer_fields_stay() {
        let mut spec = PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                read_only: Some(false),
                fs_type: Some(String::new()),
                ..Default::default()
            }),
            ..Default::default()
        };
        csi_source(&mut spec);
        assert_eq!(spec.csi, Some(CSIPersistentVolumeSource::default()));
        let disk = AzureDiskVolumeSource { read_only: Some(false), fs_type: Some(String::new()), ..Default::default() };
        let mut spec = PersistentVolumeSpec { azure_disk: Some(disk.clone()), ..Default::default() };
        in_tree_source(&mut spec);
        assert_eq!(spec.azure_disk, Some(disk));
    }
}
