//! The CSI messages of provisioning: a claim's `CreateVolume` request, and the PersistentVolume bound to the volume created; pure, but spoken in the CSI protos.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kvol_csi::proto::csi;
use serde_json::json;

use crate::provision::{ProvisionRequest, requested_bytes, secret_ref, volume_name};

/// The PV secret references a class asks for through the external-provisioner's parameters
/// (`csi.storage.k8s.io/<kind>-secret-name` and `-namespace`): PV field → parameter kind.
const SECRET_REFS: [(&str, &str); 4] = [
    ("nodeStageSecretRef", "node-stage"),
    ("nodePublishSecretRef", "node-publish"),
    ("controllerExpandSecretRef", "controller-expand"),
    ("nodeExpandSecretRef", "node-expand"),
];

/// A claim's volume mode, its key in the error.
fn claim_mode(claim: &PersistentVolumeClaim) -> Result<kvol_api::VolumeMode, String> {
    kvol_api::VolumeMode::of_claim(claim).map_err(|e| {
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        format!("persistentvolumeclaim {name}: {e}")
    })
}

/// The CSI access mode for the claim's first access mode.
fn access_mode(claim: &PersistentVolumeClaim) -> csi::volume_capability::access_mode::Mode {
    use csi::volume_capability::access_mode::Mode;
    match claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.as_ref())
        .and_then(|m| m.first())
        .map(String::as_str)
    {
        Some("ReadOnlyMany") => Mode::MultiNodeReaderOnly,
        Some("ReadWriteMany") => Mode::MultiNodeMultiWriter,
        _ => Mode::SingleNodeWriter,
    }
}

/// The `CreateVolume` request for a claim.
pub fn create_request(request: &ProvisionRequest) -> Result<csi::CreateVolumeRequest, String> {
    // A class whose secret parameters cannot make a PV must fail before a volume exists.
    let all_parameters = request.class.parameters.clone().unwrap_or_default();
    let pv_name = volume_name(&request.claim_key, &request.claim);
    for (_, kind) in SECRET_REFS {
        secret_ref(&all_parameters, kind, &request.claim_key, &pv_name)?;
    }
    let fs_type = request.class.parameters.as_ref().and_then(|p| p.get("csi.storage.k8s.io/fstype")).cloned();
    // A Block claim asks the driver for a raw block volume.
    let access_type = match claim_mode(&request.claim)? {
        kvol_api::VolumeMode::Block => {
            csi::volume_capability::AccessType::Block(csi::volume_capability::BlockVolume {})
        }
        kvol_api::VolumeMode::Filesystem => {
            csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume {
                fs_type: fs_type.unwrap_or_default(),
                mount_flags: request.class.mount_options.clone().unwrap_or_default(),
                volume_mount_group: String::new(),
            })
        }
    };
    let capability = csi::VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(csi::volume_capability::AccessMode { mode: access_mode(&request.claim) as i32 }),
    };
    let parameters = request
        .class
        .parameters
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("csi.storage.k8s.io/"))
        .collect();
    Ok(csi::CreateVolumeRequest {
        name: volume_name(&request.claim_key, &request.claim),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: requested_bytes(&request.claim)?,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability],
        parameters,
        volume_content_source: request.source_snapshot.as_ref().map(|id| csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource { snapshot_id: id.clone() },
            )),
        }),
        ..csi::CreateVolumeRequest::default()
    })
}

/// The PersistentVolume for a created volume, bound to its claim. Pure.
pub fn bound_pv(request: &ProvisionRequest, volume: &csi::Volume) -> Result<PersistentVolume, String> {
    let (namespace, name) = request.claim_key.split_once('/').unwrap_or(("default", &request.claim_key));
    let pv_name = volume_name(&request.claim_key, &request.claim);
    let parameters = request.class.parameters.clone().unwrap_or_default();
    let mut csi_source = json!({
        "driver": request.driver,
        "volumeHandle": volume.volume_id,
        "fsType": parameters.get("csi.storage.k8s.io/fstype"),
        "volumeAttributes": volume.volume_context,
    });
    for (field, kind) in SECRET_REFS {
        if let Some(reference) = secret_ref(&parameters, kind, &request.claim_key, &pv_name)? {
            csi_source[field] = reference;
        }
    }
    let spec = request.claim.spec.clone().unwrap_or_default();
    let pv = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": pv_name,
            "annotations": {
                kvol_api::keys::ANN_PROVISIONED_BY: request.driver,
            }
        },
        "spec": {
            "capacity": {"storage": volume.capacity_bytes.to_string()},
            "accessModes": spec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".to_string()]),
            "persistentVolumeReclaimPolicy": request.class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
            "storageClassName": request.class.metadata.name,
            "mountOptions": request.class.mount_options,
            "claimRef": {"namespace": namespace, "name": name, "uid": request.claim.metadata.uid},
            "volumeMode": claim_mode(&request.claim)?.as_str(),
            "csi": csi_source,
        }
    });
    serde_json::from_value(pv).map_err(|e| format!("cannot build the persistent volume: {e}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use kvol_api::FeatureGates;

    use super::*;
    use crate::provision::tests::objects;
    use crate::provision::{claims_to_provision, overlay};

    #[test]
    fn the_request_and_the_bound_pv() {
        let o = objects(false, "hostpath.csi.kvol.io");
        let drivers = vec!["hostpath.csi.kvol.io".to_string()];
        let request = claims_to_provision(
            &o,
            "n1",
            &BTreeMap::new(),
            &BTreeMap::new(),
            &drivers,
            &FeatureGates::default(),
        )
        .remove(0);
        let create = create_request(&request).unwrap();
        assert!(create.name.starts_with("pvc-"), "{}", create.name);
        assert_eq!(create.capacity_range.unwrap().required_bytes, 1 << 30);
        assert_eq!(
            create.parameters,
            BTreeMap::from([("tier".to_string(), "gold".to_string())]).into_iter().collect()
        );
        let volume =
            csi::Volume { capacity_bytes: 1 << 30, volume_id: "vol-1".into(), ..csi::Volume::default() };
        let pv = bound_pv(&request, &volume).unwrap();
        let csi_source = pv.spec.as_ref().unwrap().csi.as_ref().unwrap();
        assert_eq!(
            (csi_source.driver.as_str(), csi_source.volume_handle.as_str()),
            ("hostpath.csi.kvol.io", "vol-1")
        );
        assert_eq!(csi_source.fs_type.as_deref(), Some("ext4"));
        let claim_ref = pv.spec.as_ref().unwrap().claim_ref.as_ref().unwrap();
        assert_eq!((claim_ref.namespace.as_deref(), claim_ref.name.as_deref()), (Some("shop"), Some("data")));

        let mut o = o;
        let provisioned = BTreeMap::from([("shop/data".to_string(), Arc::new(pv.clone()))]);
        overlay(&mut o, &provisioned);
        let pv_name = pv.metadata.name.clone().unwrap();
        assert_eq!(
            o.claims["shop/data"].spec.as_ref().unwrap().volume_name.as_deref(),
            Some(pv_name.as_str())
        );
        assert!(o.persistent_volumes.contains_key(&pv_name));
        // The volume name is stable for the claim.
        assert_eq!(volume_name("shop/data", &o.claims["shop/data"]), pv_name);
        assert_eq!(pv.spec.as_ref().unwrap().volume_mode.as_deref(), Some("Filesystem"));

        // A Block claim asks for block access and gets a Block volume.
        let mut block = request.clone();
        block.claim.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let create = create_request(&block).unwrap();
        assert!(matches!(
            create.volume_capabilities[0].access_type,
            Some(csi::volume_capability::AccessType::Block(_))
        ));
        let pv = bound_pv(&block, &volume).unwrap();
        assert_eq!(pv.spec.as_ref().unwrap().volume_mode.as_deref(), Some("Block"));
    }
}
