//! Which claims to provision and which provisioned volumes to reclaim, in standalone mode; pure.
//!
//! Upstream this is the external-provisioner's job beside the control plane; a standalone node
//! has no control plane, so the agent does the part a single node needs: `CreateVolume` with the
//! claim's size, access modes and the class's parameters, then a PersistentVolume bound to the
//! claim. Provisioned volumes are recorded under `<root>/provisioned/` (one JSON PV per claim)
//! and overlaid on the manifests' objects; they are never deleted by the agent (a claim that
//! disappears leaves its volume, so no data is lost by a manifest edit).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kvol_api::FeatureGates;
use serde_json::json;

use kvol_api::ObjectSet;

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
        let driver = kvol_api::gates::provisioner_for(gates, &class.provisioner);
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
    kvol_api::quantity::parse_bytes(&quantity.0)
        .map(|b| i64::try_from(b).unwrap_or(i64::MAX))
        .map_err(|e| format!("storage request {:?} is not a valid quantity: {e}", quantity.0))
}

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

#[cfg(test)]
pub(crate) mod tests {
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

    pub(crate) fn objects(claim_bound: bool, class_provisioner: &str) -> ObjectSet {
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
