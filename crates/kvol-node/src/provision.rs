//! Dynamic provisioning in standalone mode: a pod's unbound claim whose StorageClass names a registered CSI driver (after the migration mapping) gets a volume created and a PV bound to it.
//!
//! Upstream this is the external-provisioner's job beside the control plane; a standalone node
//! has no control plane, so the agent does the part a single node needs: `CreateVolume` with the
//! claim's size, access modes and the class's parameters, then a PersistentVolume bound to the
//! claim. Provisioned volumes are recorded under `<root>/provisioned/` (one JSON PV per claim)
//! and overlaid on the manifests' objects; they are never deleted by the agent (a claim that
//! disappears leaves its volume, so no data is lost by a manifest edit).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kvol_api::FeatureGates;
use kvol_csi::proto::csi;
use serde_json::json;

use crate::model::ObjectSet;

/// A claim to provision: `namespace/name`, its storage class and the CSI driver that serves it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProvisionRequest {
    pub claim_key: String,
    pub claim: PersistentVolumeClaim,
    pub class: StorageClass,
    pub driver: String,
    /// The driver's snapshot id the volume is restored from (the claim's `dataSource`).
    pub source_snapshot: Option<String>,
}

/// The claims used by pods of this node that are unbound, not yet provisioned, and whose class's
/// provisioner (mapped in-tree → CSI when migrated) is one of `drivers`; a claim restored from
/// a snapshot (`dataSource`) waits until `snapshots` has it ready. Pure.
pub fn claims_to_provision(
    objects: &ObjectSet,
    node_name: &str,
    provisioned: &BTreeMap<String, Arc<PersistentVolume>>,
    snapshots: &BTreeMap<String, crate::snapshots::SnapshotRecord>,
    drivers: &[String],
    gates: &FeatureGates,
) -> Vec<ProvisionRequest> {
    let mut wanted = BTreeMap::new();
    for pod in objects.pods.values() {
        let Some(spec) = &pod.spec else { continue };
        if spec.node_name.as_deref().is_some_and(|n| n != node_name) {
            continue;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        for volume in spec.volumes.iter().flatten() {
            if let Some(pvc) = &volume.persistent_volume_claim {
                wanted.insert(format!("{namespace}/{}", pvc.claim_name), ());
            }
        }
    }
    let mut out = Vec::new();
    for key in wanted.keys() {
        let Some(claim) = objects.claims.get(key) else { continue };
        let Some(claim_spec) = &claim.spec else { continue };
        if claim_spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) || provisioned.contains_key(key) {
            continue;
        }
        let Some(class_name) = claim_spec.storage_class_name.as_deref().filter(|c| !c.is_empty()) else {
            continue;
        };
        let Some(class) = objects.storage_classes.get(class_name) else { continue };
        let driver = kvol_plugin::migration::provisioner_for(gates, &class.provisioner);
        if !drivers.iter().any(|d| d == driver) {
            continue;
        }
        let Ok(source_snapshot) = crate::snapshots::restore_source(key, claim, snapshots) else { continue };
        out.push(ProvisionRequest {
            claim_key: key.clone(),
            claim: claim.clone(),
            class: class.clone(),
            driver: driver.to_string(),
            source_snapshot,
        });
    }
    out
}

/// The volume name a claim's volume is created under: `pvc-` and a stable hash of the claim.
pub fn volume_name(claim_key: &str, claim: &PersistentVolumeClaim) -> String {
    match claim.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => format!("pvc-{uid}"),
        _ => {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(claim_key.as_bytes());
            let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
            format!("pvc-{hex}")
        }
    }
}

/// The requested size of a claim in bytes (`spec.resources.requests.storage`), 0 when unset.
pub fn requested_bytes(claim: &PersistentVolumeClaim) -> Result<i64, String> {
    let Some(quantity) = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
    else {
        return Ok(0);
    };
    kvol_plugin::local::quantity::parse_bytes(&quantity.0)
        .map(|b| i64::try_from(b).unwrap_or(i64::MAX))
        .map_err(|e| format!("storage request {:?} is not a valid quantity: {e}", quantity.0))
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

/// A claim's volume mode, its key in the error.
fn claim_mode(claim: &PersistentVolumeClaim) -> Result<kvol_api::VolumeMode, String> {
    kvol_api::VolumeMode::of_claim(claim).map_err(|e| {
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        format!("persistentvolumeclaim {name}: {e}")
    })
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

/// The PV secret references a class asks for through the external-provisioner's parameters
/// (`csi.storage.k8s.io/<kind>-secret-name` and `-namespace`): PV field → parameter kind.
const SECRET_REFS: [(&str, &str); 4] = [
    ("nodeStageSecretRef", "node-stage"),
    ("nodePublishSecretRef", "node-publish"),
    ("controllerExpandSecretRef", "controller-expand"),
    ("nodeExpandSecretRef", "node-expand"),
];

/// The secret reference of `kind` from a class's parameters, templates filled in as the
/// external-provisioner fills them (`${pvc.name}`, `${pvc.namespace}`, `${pv.name}`); none when
/// the class names none. A name without a namespace (or the reverse), or an unknown template,
/// is an error naming the parameter. Pure.
pub fn secret_ref(
    parameters: &BTreeMap<String, String>,
    kind: &str,
    claim_key: &str,
    pv_name: &str,
) -> Result<Option<serde_json::Value>, String> {
    let (claim_namespace, claim_name) = claim_key.split_once('/').unwrap_or(("default", claim_key));
    let key = |part: &str| format!("csi.storage.k8s.io/{kind}-secret-{part}");
    let fill = |part: &str| -> Result<Option<String>, String> {
        let Some(value) = parameters.get(&key(part)) else { return Ok(None) };
        let filled = value
            .replace("${pvc.name}", claim_name)
            .replace("${pvc.namespace}", claim_namespace)
            .replace("${pv.name}", pv_name);
        if filled.contains("${") {
            return Err(format!(
                "storage class parameter {}: {value:?} has a template kvol does not know (known: ${{pvc.name}}, ${{pvc.namespace}}, ${{pv.name}})",
                key(part)
            ));
        }
        Ok(Some(filled))
    };
    match (fill("name")?, fill("namespace")?) {
        (None, None) => Ok(None),
        (Some(name), Some(namespace)) => Ok(Some(json!({"name": name, "namespace": namespace}))),
        _ => Err(format!(
            "storage class parameters {} and {} must be given together",
            key("name"),
            key("namespace")
        )),
    }
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

/// Adds the provisioned PVs to `objects` and binds their claims to them. Pure.
pub fn overlay(objects: &mut ObjectSet, provisioned: &BTreeMap<String, Arc<PersistentVolume>>) {
    for (claim_key, pv) in provisioned {
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        if let Some(claim) = objects.claims.get_mut(claim_key) {
            let spec = claim.spec.get_or_insert_with(Default::default);
            if spec.volume_name.as_deref().is_none_or(str::is_empty) {
                spec.volume_name = Some(pv_name.clone());
            }
        }
        objects.persistent_volumes.entry(pv_name).or_insert_with(|| Arc::clone(pv));
    }
}

pub(crate) fn record_path(dir: &Path, claim_key: &str) -> PathBuf {
    dir.join(format!("{}.json", claim_key.replace('/', "~")))
}

/// The provisioned PVs recorded in `dir`, by claim key; unreadable records are reported.
pub fn load(dir: &Path) -> (BTreeMap<String, Arc<PersistentVolume>>, Vec<String>) {
    load_records(dir, "provisioned volume record")
}

/// Records a provisioned PV for a claim (temp file, fsync, rename).
pub fn save(dir: &Path, claim_key: &str, pv: &PersistentVolume) -> Result<(), String> {
    save_record(&record_path(dir, claim_key), pv)
}

/// The JSON records in `dir` (`<namespace>~<name>.json`), by `namespace/name`; each one that
/// cannot be read is a problem naming `what` and its path.
pub fn load_records<T: serde::de::DeserializeOwned>(
    dir: &Path,
    what: &str,
) -> (BTreeMap<String, T>, Vec<String>) {
    let mut out = BTreeMap::new();
    let mut problems = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return (out, problems) };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(stem) = path
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|_| path.extension().is_some_and(|e| e == "json"))
        else {
            continue;
        };
        match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(record) => {
                out.insert(stem.replacen('~', "/", 1), record);
            }
            Err(e) => problems.push(format!("cannot read {what} {}: {e}", path.display())),
        }
    }
    (out, problems)
}

/// Writes a JSON record at `path` durably: a temporary file, fsync, rename.
pub fn save_record<T: serde::Serialize>(path: &Path, record: &T) -> Result<(), String> {
    let bytes = serde_json::to_vec_pretty(record).map_err(|e| e.to_string())?;
    kvol_plugin::atomic_file::replace(path, &bytes, kvol_plugin::atomic_file::Durability::Synced)
        .map_err(|e| e.to_string())
}

/// Removes a record; one already gone is fine.
pub fn remove_record(path: &Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", path.display())),
    }
}

/// A provisioned volume whose claim is gone: to delete through its driver, then forget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReclaimRequest {
    pub claim_key: String,
    pub pv_name: String,
    pub driver: String,
    pub volume_handle: String,
}

/// What the external-provisioner does when a claim is deleted, for the volumes kvol
/// provisioned: those whose claim is no longer among `objects`, whose reclaim policy is
/// `Delete`, and that the node no longer has attached, staged or published (`in_use`: unique
/// volume names, which end in `<driver>^<handle>`). A `Retain` volume is kept, as its PV would
/// be (Released). Pure.
pub fn volumes_to_reclaim(
    objects: &ObjectSet,
    provisioned: &BTreeMap<String, Arc<PersistentVolume>>,
    in_use: &[&str],
) -> Vec<ReclaimRequest> {
    provisioned
        .iter()
        .filter(|(claim_key, _)| !objects.claims.contains_key(*claim_key))
        .filter_map(|(claim_key, pv)| {
            let spec = pv.spec.as_ref()?;
            if spec.persistent_volume_reclaim_policy.as_deref().unwrap_or("Delete") != "Delete" {
                return None;
            }
            let csi = spec.csi.as_ref()?;
            let suffix = format!("{}^{}", csi.driver, csi.volume_handle);
            if in_use.iter().any(|name| name.ends_with(&suffix)) {
                return None;
            }
            Some(ReclaimRequest {
                claim_key: claim_key.clone(),
                pv_name: pv.metadata.name.clone().unwrap_or_default(),
                driver: csi.driver.clone(),
                volume_handle: csi.volume_handle.clone(),
            })
        })
        .collect()
}

/// Forgets the record of a claim's volume; a record already gone is fine.
pub fn remove(dir: &Path, claim_key: &str) -> Result<(), String> {
    remove_record(&record_path(dir, claim_key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_secret_parameters_become_pv_secret_refs() {
        let params = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (format!("csi.storage.k8s.io/{k}"), v.to_string())).collect()
        };
        // (parameters, kind, expected (name, namespace) or error words)
        type Expected = Result<Option<(&'static str, &'static str)>, &'static str>;
        type Row = (&'static [(&'static str, &'static str)], &'static str, Expected);
        let rows: &[Row] = &[
            (&[], "node-stage", Ok(None)),
            (
                &[("node-stage-secret-name", "creds"), ("node-stage-secret-namespace", "ops")],
                "node-stage",
                Ok(Some(("creds", "ops"))),
            ),
            (
                &[("node-stage-secret-name", "creds"), ("node-stage-secret-namespace", "ops")],
                "node-publish",
                Ok(None),
            ),
            (
                &[
                    ("node-publish-secret-name", "${pvc.name}-key"),
                    ("node-publish-secret-namespace", "${pvc.namespace}"),
                ],
                "node-publish",
                Ok(Some(("data-key", "shop"))),
            ),
            (
                &[("node-expand-secret-name", "${pv.name}"), ("node-expand-secret-namespace", "kube-system")],
                "node-expand",
                Ok(Some(("pvc-1", "kube-system"))),
            ),
            (&[("node-stage-secret-name", "creds")], "node-stage", Err("must be given together")),
            (&[("node-stage-secret-namespace", "ops")], "node-stage", Err("must be given together")),
            (
                &[
                    ("node-stage-secret-name", "${pvc.annotations['x']}"),
                    ("node-stage-secret-namespace", "ops"),
                ],
                "node-stage",
                Err(
                    "csi.storage.k8s.io/node-stage-secret-name: \"${pvc.annotations['x']}\" has a template kvol does not know",
                ),
            ),
        ];
        for (pairs, kind, expected) in rows {
            let got = secret_ref(&params(pairs), kind, "shop/data", "pvc-1");
            match (expected, got) {
                (Ok(None), Ok(None)) => {}
                (Ok(Some((name, namespace))), Ok(Some(value))) => {
                    assert_eq!(value, json!({"name": name, "namespace": namespace}), "{pairs:?} {kind}")
                }
                (Err(words), Err(e)) => assert!(e.contains(words), "{pairs:?} {kind}: {e}"),
                (expected, got) => panic!("{pairs:?} {kind}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    fn objects(claim_bound: bool, class_provisioner: &str) -> ObjectSet {
        let mut o = ObjectSet::default();
        let pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"containers": [], "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
        }))
        .unwrap();
        o.pods.insert("shop/web".into(), pod);
        let mut claim = json!({
            "metadata": {"name": "data", "namespace": "shop"},
            "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}
        });
        if claim_bound {
            claim["spec"]["volumeName"] = json!("pv-static");
        }
        o.claims.insert("shop/data".into(), serde_json::from_value(claim).unwrap());
        let class = json!({"metadata": {"name": "fast"}, "provisioner": class_provisioner,
                           "parameters": {"csi.storage.k8s.io/fstype": "ext4", "tier": "gold"}});
        o.storage_classes.insert("fast".into(), serde_json::from_value(class).unwrap());
        o
    }

    #[test]
    fn which_claims_are_provisioned() {
        let drivers = vec!["hostpath.csi.kvol.io".to_string(), "ebs.csi.aws.com".to_string()];
        let gates = FeatureGates::default();
        // (claim bound?, class provisioner, already provisioned?, node name, expect a request for driver)
        let rows: &[(bool, &str, bool, &str, Option<&str>)] = &[
            (false, "hostpath.csi.kvol.io", false, "n1", Some("hostpath.csi.kvol.io")),
            (true, "hostpath.csi.kvol.io", false, "n1", None),
            (false, "hostpath.csi.kvol.io", true, "n1", None),
            (false, "other.csi", false, "n1", None),
            // In-tree class, migrated: provisioned by its CSI driver.
            (false, "kubernetes.io/aws-ebs", false, "n1", Some("ebs.csi.aws.com")),
            // RBD is not migrated by default: no CSI provisioner.
            (false, "kubernetes.io/rbd", false, "n1", None),
        ];
        for (i, (bound, provisioner, done, node, want)) in rows.iter().enumerate() {
            let o = objects(*bound, provisioner);
            let mut provisioned = BTreeMap::new();
            if *done {
                provisioned.insert("shop/data".to_string(), Arc::new(PersistentVolume::default()));
            }
            let got = claims_to_provision(&o, node, &provisioned, &BTreeMap::new(), &drivers, &gates);
            assert_eq!(got.first().map(|r| r.driver.as_str()), *want, "row {i}");
        }
    }

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

    #[test]
    fn records_round_trip_and_bad_ones_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let pv: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "pvc-1"}})).unwrap();
        save(dir.path(), "shop/data", &pv).unwrap();
        std::fs::write(dir.path().join("bad~x.json"), "{").unwrap();
        let (loaded, problems) = load(dir.path());
        assert_eq!(loaded.get("shop/data").map(|pv| &**pv), Some(&pv));
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("bad~x.json"), "{problems:?}");
    }

    #[test]
    fn deleted_claims_volumes_are_reclaimed_unless_kept_or_in_use() {
        let pv = |name: &str, policy: Option<&str>, handle: &str| -> Arc<PersistentVolume> {
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
                "persistentVolumeReclaimPolicy": policy,
                "csi": {"driver": "d.example", "volumeHandle": handle}}}))
            .unwrap()
        };
        let claim: PersistentVolumeClaim =
            serde_json::from_value(json!({"metadata": {"name": "live"}})).unwrap();
        let mut objects = ObjectSet::default();
        objects.claims.insert("ns/live".into(), claim);
        let records = BTreeMap::from([
            ("ns/live".to_string(), pv("pvc-live", None, "h-live")),
            ("ns/gone".to_string(), pv("pvc-gone", None, "h-gone")),
            ("ns/kept".to_string(), pv("pvc-kept", Some("Retain"), "h-kept")),
            ("ns/mounted".to_string(), pv("pvc-mounted", Some("Delete"), "h-mounted")),
        ]);
        let in_use = ["kubernetes.io/csi/d.example^h-mounted"];
        let got: Vec<String> =
            volumes_to_reclaim(&objects, &records, &in_use).into_iter().map(|r| r.pv_name).collect();
        assert_eq!(got, ["pvc-gone"], "live claim, Retain and in-use volumes stay");
        let got = volumes_to_reclaim(&objects, &records, &[]);
        assert_eq!(got.len(), 2, "unmounted, the deleted claim's Delete volume goes too: {got:?}");
        assert_eq!(
            got[0],
            ReclaimRequest {
                claim_key: "ns/gone".into(),
                pv_name: "pvc-gone".into(),
                driver: "d.example".into(),
                volume_handle: "h-gone".into()
            }
        );
    }
}
