//! vSphere: `kubernetes.io/vsphere-volume` specs to `csi.vsphere.vmware.com` and back, as upstream translates them.
//!
//! vSphere keeps its own zone *and* region topology keys, so it does not use the shared
//! single-key topology translation. Go has no "unset" for plain strings: an `fsType` this module
//! builds from an empty Go string is `None`, as upstream's output reads back.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, Volume, VsphereVirtualDiskVolumeSource,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_api::MigratablePlugin;
use kvol_api::keys::PARAM_CSI_FSTYPE;

use super::Translator;
use crate::go::{go_ascii_lower, zero_string};
use crate::topology::{
    add_topology, has_topology_values, replace_topology_key, topology_labels, topology_values,
    translate_allowed_topologies,
};
use crate::{Result, TranslateError};

pub(crate) struct Vsphere;

const PLUGIN: MigratablePlugin = MigratablePlugin::Vsphere;
const DRIVER: &str = PLUGIN.csi_driver();
const ZONE_KEY: &str = "topology.csi.vmware.com/zone";
const REGION_KEY: &str = "topology.csi.vmware.com/region";
/// StorageClass parameter and volume attribute: the SPBM storage policy.
const STORAGE_POLICY_NAME: &str = "storagepolicyname";
/// Tells the driver the request comes from migration, so it reports `initialvolumefilepath`.
const CSI_MIGRATION: &str = "csimigration";
/// Volume attribute with the path the driver created the volume at (the in-tree volume path).
const INITIAL_VOLUME_FILE_PATH: &str = "initialvolumefilepath";
/// The longest known StorageClass parameter key.
const LONGEST_PARAM: usize = "hostfailurestotolerate".len();

fn refuse(reason: String) -> TranslateError {
    TranslateError::plugin(PLUGIN, reason)
}

fn name_of(pv: &PersistentVolume) -> &str {
    pv.metadata.name.as_deref().unwrap_or_default()
}

/// `{storagepolicyname: name}` when the source names a policy, else an empty map.
fn policy_attributes(policy: Option<String>) -> BTreeMap<String, String> {
    let mut attributes = BTreeMap::new();
    if let Some(policy) = zero_string(policy) {
        attributes.insert(STORAGE_POLICY_NAME.to_string(), policy);
    }
    attributes
}

/// The CSI parameter an in-tree parameter (lower-cased) becomes; `None` drops it.
fn csi_parameter(lower_key: &str) -> Option<&'static str> {
    Some(match lower_key {
        "fstype" => PARAM_CSI_FSTYPE,
        STORAGE_POLICY_NAME => STORAGE_POLICY_NAME,
        "datastore" => "datastore-migrationparam",
        "diskformat" => "diskformat-migrationparam",
        "hostfailurestotolerate" => "hostfailurestotolerate-migrationparam",
        "forceprovisioning" => "forceprovisioning-migrationparam",
        "cachereservation" => "cachereservation-migrationparam",
        "diskstripes" => "diskstripes-migrationparam",
        "objectspacereservation" => "objectspacereservation-migrationparam",
        "iopslimit" => "iopslimit-migrationparam",
        _ => return None,
    })
}

/// In-tree zone and region to the CSI keys: node-affinity keys are renamed; without them, a
/// non-empty zone or region *label* is appended to every term as one value (no `__` split).
fn topology_in_tree_to_csi(pv: &mut PersistentVolume) {
    let (zone_label, region_label) = topology_labels(pv);
    // add_topology does not look at labels: lend them out rather than cloning a value.
    let labels = pv.metadata.labels.take();
    for (label, csi_key) in [(zone_label, ZONE_KEY), (region_label, REGION_KEY)] {
        if has_topology_values(pv, label) {
            replace_topology_key(pv, label, csi_key);
        } else if let Some(value) = labels.as_ref().and_then(|l| l.get(label)) {
            // Like upstream, a value that is blank once trimmed adds nothing.
            add_topology(pv, csi_key, &[value.as_str()]);
        }
    }
    pv.metadata.labels = labels;
}

/// CSI zone and region keys back to the Kubernetes ones; each label, when absent, is set to the
/// first (sorted) value.
fn topology_csi_to_in_tree(pv: &mut PersistentVolume) {
    let (zone_label, region_label) = topology_labels(pv);
    for (csi_key, label) in [(ZONE_KEY, zone_label), (REGION_KEY, region_label)] {
        replace_topology_key(pv, csi_key, label);
    }
    for label in [zone_label, region_label] {
        if let Some(first) = topology_values(pv, label).into_iter().next() {
            let labels = pv.metadata.labels.get_or_insert_with(BTreeMap::new);
            labels.entry(label.to_string()).or_insert(first);
        }
    }
}

impl Translator for Vsphere {
    fn storage_class_to_csi(&self, mut sc: StorageClass) -> Result<StorageClass> {
        let mut params = BTreeMap::new();
        // Upstream ranges over a Go map, so when two spellings of a key are set (`fstype` and
        // `FSType`) a random one wins; here the last in key order wins.
        for (key, value) in sc.parameters.take().into_iter().flatten() {
            let mut buf = [0; LONGEST_PARAM];
            // Keys upstream does not know are dropped (upstream only logs them).
            if let Some(csi_key) = go_ascii_lower(&key, &mut buf).and_then(csi_parameter) {
                params.insert(csi_key.to_string(), value);
            }
        }
        params.insert(CSI_MIGRATION.to_string(), "true".to_string());
        if sc.allowed_topologies.as_ref().is_some_and(|t| !t.is_empty()) {
            sc.allowed_topologies =
                sc.allowed_topologies.as_deref().map(|t| translate_allowed_topologies(t, ZONE_KEY));
        }
        sc.parameters = Some(params);
        Ok(sc)
    }

    fn inline_to_csi(&self, vol: &Volume, _pod_namespace: &str) -> Result<PersistentVolume> {
        let Some(vsphere) = vol.vsphere_volume.as_ref() else {
            return Err(refuse(format!("inline volume {:?} has no vsphereVolume source", vol.name)));
        };
        Ok(PersistentVolume {
            // The name must be unique per disk: it is the unique part of the staging path.
            metadata: ObjectMeta {
                name: Some([DRIVER, "-", &vsphere.volume_path].concat()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.to_string(),
                    volume_handle: vsphere.volume_path.clone(),
                    fs_type: zero_string(vsphere.fs_type.clone()),
                    // kvol departs from upstream: upstream reads the policy name from the new
                    // PV's (nil) vSphere source here and panics; kvol takes it from the inline
                    // source, as the PV translation does.
                    volume_attributes: Some(policy_attributes(vsphere.storage_policy_name.clone())),
                    ..Default::default()
                }),
                access_modes: Some(vec!["ReadWriteOnce".to_string()]),
                ..Default::default()
            }),
            status: None,
        })
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<()> {
        let Some(vsphere) = pv.spec.as_mut().and_then(|s| s.vsphere_volume.take()) else {
            return Err(refuse(format!("persistent volume {:?} has no vsphereVolume source", name_of(pv))));
        };
        topology_in_tree_to_csi(pv);
        pv.spec.get_or_insert_with(Default::default).csi = Some(CSIPersistentVolumeSource {
            driver: DRIVER.to_string(),
            volume_handle: vsphere.volume_path,
            fs_type: zero_string(vsphere.fs_type),
            volume_attributes: Some(policy_attributes(vsphere.storage_policy_name)),
            ..Default::default()
        });
        Ok(())
    }

    fn csi_pv_to_in_tree(&self, pv: &mut PersistentVolume) -> Result<()> {
        let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.take()) else {
            return Err(refuse(format!("persistent volume {:?} has no CSI source", name_of(pv))));
        };
        // Without the attribute the volume path is empty; upstream does not refuse that.
        let volume_path =
            csi.volume_attributes.and_then(|mut a| a.remove(INITIAL_VOLUME_FILE_PATH)).unwrap_or_default();
        topology_csi_to_in_tree(pv);
        pv.spec.get_or_insert_with(Default::default).vsphere_volume = Some(VsphereVirtualDiskVolumeSource {
            volume_path,
            fs_type: zero_string(csi.fs_type),
            ..Default::default()
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::test_support::{affinity, assert_same, pv, sc, vol};
    use kvol_api::keys::{
        LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_TOPOLOGY_REGION,
        LABEL_TOPOLOGY_ZONE,
    };
    use serde_json::{Value, json};

    const IN_TREE: &str = "kubernetes.io/vsphere-volume";
    const BETA_ZONE: &str = LABEL_FAILURE_DOMAIN_BETA_ZONE;
    const BETA_REGION: &str = LABEL_FAILURE_DOMAIN_BETA_REGION;
    const GA_ZONE: &str = LABEL_TOPOLOGY_ZONE;
    const GA_REGION: &str = LABEL_TOPOLOGY_REGION;
    const PV_NAME: &str = "pvc-d8b4475f-2c47-486e-9b57-43ae006f9b59";
    const PATH: &str = "[vsanDatastore] 6785a85e-268e-6352-a2e8-02008b7afadd/kubernetes-dynamic-pvc-68734c9f-a679-42e6-a694-39632c51e31f.vmdk";
    const POLICY: &str = "vSAN Default Storage Policy";

    fn sc_of(params: Value, topologies: Value) -> StorageClass {
        sc(json!({"parameters": params, "allowedTopologies": topologies}))
    }

    /// An in-tree vSphere PV like upstream's tables use.
    fn in_tree(labels: Value, node_affinity: Value) -> Value {
        json!({
            "metadata": {"name": PV_NAME, "labels": labels},
            "spec": {
                "vsphereVolume": {"volumePath": PATH, "fsType": "ext4", "storagePolicyName": POLICY},
                "accessModes": ["ReadWriteOnce"],
                "nodeAffinity": node_affinity,
            },
        })
    }

    /// The CSI PV upstream's tables expect for [`in_tree`].
    fn csi(labels: Value, node_affinity: Value) -> Value {
        json!({
            "metadata": {"name": PV_NAME, "labels": labels},
            "spec": {
                "csi": {
                    "driver": DRIVER,
                    "volumeHandle": PATH,
                    "fsType": "ext4",
                    "volumeAttributes": {STORAGE_POLICY_NAME: POLICY},
                },
                "accessModes": ["ReadWriteOnce"],
                "nodeAffinity": node_affinity,
            },
        })
    }

    // Upstream: TestTranslatevSphereInTreeStorageClassToCSI (10 of 11 cases; "sc is nil" cannot
    // be expressed, the API takes a reference), then kvol's own cases.
    #[test]
    fn storage_class_to_csi() {
        let zone_a = json!([{"matchLabelExpressions": [{"key": GA_ZONE, "values": ["zone-a"]}]}]);
        let zone_a_beta = json!([{"matchLabelExpressions": [{"key": BETA_ZONE, "values": ["zone-a"]}]}]);
        let zone_a_csi = json!([{"matchLabelExpressions": [{"key": ZONE_KEY, "values": ["zone-a"]}]}]);
        let null = Value::Null;
        let cases: &[(&str, StorageClass, StorageClass)] = &[
            (
                "translate with no parameter",
                sc_of(json!({}), null.clone()),
                sc_of(json!({CSI_MIGRATION: "true"}), null.clone()),
            ),
            (
                "translate with unknown parameter",
                sc_of(json!({"unknownparam": "value"}), null.clone()),
                sc_of(json!({CSI_MIGRATION: "true"}), null.clone()),
            ),
            (
                "translate with storagepolicyname and datastore",
                sc_of(
                    json!({"storagepolicyname": "test-policy-name", "datastore": "vsanDatastore"}),
                    null.clone(),
                ),
                sc_of(
                    json!({"storagepolicyname": "test-policy-name", "datastore-migrationparam": "vsanDatastore", CSI_MIGRATION: "true"}),
                    null.clone(),
                ),
            ),
            (
                "translate with fstype",
                sc_of(json!({"fstype": "ext4"}), null.clone()),
                sc_of(json!({"csi.storage.k8s.io/fstype": "ext4", CSI_MIGRATION: "true"}), null.clone()),
            ),
            (
                "translate with storagepolicyname and fstype",
                sc_of(json!({"storagepolicyname": "test-policy-name", "fstype": "ext4"}), null.clone()),
                sc_of(
                    json!({"csi.storage.k8s.io/fstype": "ext4", "storagepolicyname": "test-policy-name", CSI_MIGRATION: "true"}),
                    null.clone(),
                ),
            ),
            (
                "translate with no parameter and allowedTopology",
                sc_of(json!({}), zone_a.clone()),
                sc_of(json!({CSI_MIGRATION: "true"}), zone_a_csi.clone()),
            ),
            (
                "translate with storagepolicyname and allowedTopology",
                sc_of(json!({"storagepolicyname": "test-policy-name"}), zone_a.clone()),
                sc_of(
                    json!({"storagepolicyname": "test-policy-name", CSI_MIGRATION: "true"}),
                    zone_a_csi.clone(),
                ),
            ),
            (
                "translate with storagepolicyname and allowedTopology beta labels",
                sc_of(json!({"storagepolicyname": "test-policy-name"}), zone_a_beta),
                sc_of(
                    json!({"storagepolicyname": "test-policy-name", CSI_MIGRATION: "true"}),
                    zone_a_csi.clone(),
                ),
            ),
            (
                "translate with raw vSAN policy parameters, datastore and diskformat",
                sc_of(
                    json!({"hostfailurestotolerate": "2", "datastore": "vsanDatastore", "diskformat": "thin"}),
                    zone_a.clone(),
                ),
                sc_of(
                    json!({
                        "hostfailurestotolerate-migrationparam": "2",
                        "datastore-migrationparam": "vsanDatastore",
                        "diskformat-migrationparam": "thin",
                        CSI_MIGRATION: "true",
                    }),
                    zone_a_csi.clone(),
                ),
            ),
            (
                "translate with all parameters",
                sc_of(
                    json!({
                        "storagepolicyname": "test-policy-name", "datastore": "test-datastore-name", "fstype": "ext4",
                        "diskformat": "thin", "hostfailurestotolerate": "1", "forceprovisioning": "yes",
                        "cachereservation": "25", "diskstripes": "4", "objectspacereservation": "10", "iopslimit": "32",
                    }),
                    zone_a.clone(),
                ),
                sc_of(
                    json!({
                        "storagepolicyname": "test-policy-name", "datastore-migrationparam": "test-datastore-name",
                        "csi.storage.k8s.io/fstype": "ext4", "diskformat-migrationparam": "thin",
                        "hostfailurestotolerate-migrationparam": "1", "forceprovisioning-migrationparam": "yes",
                        "cachereservation-migrationparam": "25", "diskstripes-migrationparam": "4",
                        "objectspacereservation-migrationparam": "10", "iopslimit-migrationparam": "32",
                        CSI_MIGRATION: "true",
                    }),
                    zone_a_csi.clone(),
                ),
            ),
            // kvol's own cases.
            (
                "absent parameters",
                sc_of(null.clone(), null.clone()),
                sc_of(json!({CSI_MIGRATION: "true"}), null.clone()),
            ),
            (
                "keys match case-insensitively, output keys are lower-case",
                sc_of(
                    json!({"StoragePolicyName": "p", "DataStore": "ds", "FSTYPE": "xfs", "IOPSLimit": "9"}),
                    null.clone(),
                ),
                sc_of(
                    json!({
                        "storagepolicyname": "p", "datastore-migrationparam": "ds", "csi.storage.k8s.io/fstype": "xfs",
                        "iopslimit-migrationparam": "9", CSI_MIGRATION: "true",
                    }),
                    null.clone(),
                ),
            ),
            (
                "Go lower-cases the Kelvin sign to k and dotted capital I to i",
                sc_of(
                    json!({"dis\u{212a}format": "thin", "IOPSL\u{130}MIT": "5", "dis\u{212a}format-extra": "x"}),
                    null.clone(),
                ),
                sc_of(
                    json!({"diskformat-migrationparam": "thin", "iopslimit-migrationparam": "5", CSI_MIGRATION: "true"}),
                    null.clone(),
                ),
            ),
            (
                "csimigration and already-translated keys are dropped, then csimigration set",
                sc_of(
                    json!({"csimigration": "false", "datastore-migrationparam": "x", "csi.storage.k8s.io/fstype": "y"}),
                    null.clone(),
                ),
                sc_of(json!({CSI_MIGRATION: "true"}), null.clone()),
            ),
            (
                "two spellings of one key: the later key in order wins",
                sc_of(json!({"FSType": "ext3", "fstype": "ext4"}), null.clone()),
                sc_of(json!({"csi.storage.k8s.io/fstype": "ext4", CSI_MIGRATION: "true"}), null.clone()),
            ),
            (
                "zone params are not topology for vSphere; region keys pass through",
                sc_of(
                    json!({"zone": "a", "zones": "a,b"}),
                    json!([{"matchLabelExpressions": [
                        {"key": GA_ZONE, "values": ["z"]}, {"key": GA_REGION, "values": ["r"]}]}]),
                ),
                sc_of(
                    json!({CSI_MIGRATION: "true"}),
                    json!([{"matchLabelExpressions": [
                        {"key": ZONE_KEY, "values": ["z"]}, {"key": GA_REGION, "values": ["r"]}]}]),
                ),
            ),
            (
                "empty allowed topologies stay empty",
                sc_of(json!({}), json!([])),
                sc_of(json!({CSI_MIGRATION: "true"}), json!([])),
            ),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_in_tree_storage_class_to_csi(IN_TREE, input)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_same(name, &got, want);
        }
    }

    // Upstream: TestTranslateVSphereInTreePVToCSI (all 4 cases; the empty PV is refused by the
    // dispatcher), then kvol's own cases.
    #[test]
    fn pv_to_csi() {
        let null = Value::Null;
        let cases: &[(&str, Value, Option<Value>)] = &[
            ("expect error when in-tree vsphere PV is nil", json!({"metadata": {"name": PV_NAME}}), None),
            (
                "translate valid vSphere in-tree PV to vSphere CSI PV",
                in_tree(null.clone(), null.clone()),
                Some(csi(null.clone(), null.clone())),
            ),
            (
                "translate valid vSphere in-tree PV with beta topology labels to vSphere CSI PV",
                in_tree(json!({BETA_ZONE: "z1", BETA_REGION: "r1"}), null.clone()),
                Some(csi(
                    json!({BETA_ZONE: "z1", BETA_REGION: "r1"}),
                    affinity(&[&[(ZONE_KEY, &["z1"]), (REGION_KEY, &["r1"])]]),
                )),
            ),
            (
                "translate valid vSphere in-tree PV with GA topology labels to vSphere CSI PV",
                in_tree(json!({GA_ZONE: "z1", GA_REGION: "r1"}), null.clone()),
                Some(csi(
                    json!({GA_ZONE: "z1", GA_REGION: "r1"}),
                    affinity(&[&[(ZONE_KEY, &["z1"]), (REGION_KEY, &["r1"])]]),
                )),
            ),
            // kvol's own cases.
            (
                "affinity keys are renamed in place; labels then unused",
                in_tree(
                    json!({GA_ZONE: "label-zone"}),
                    affinity(&[&[(BETA_ZONE, &["z2", "z1"]), ("other", &["x"]), (BETA_REGION, &["r1"])]]),
                ),
                Some(csi(
                    json!({GA_ZONE: "label-zone"}),
                    affinity(&[&[(ZONE_KEY, &["z2", "z1"]), ("other", &["x"]), (REGION_KEY, &["r1"])]]),
                )),
            ),
            (
                "zone from affinity, region from label, added to every term",
                in_tree(json!({GA_REGION: "r1"}), affinity(&[&[(GA_ZONE, &["z1"])], &[(GA_ZONE, &["z2"])]])),
                Some(csi(
                    json!({GA_REGION: "r1"}),
                    affinity(&[
                        &[(ZONE_KEY, &["z1"]), (REGION_KEY, &["r1"])],
                        &[(ZONE_KEY, &["z2"]), (REGION_KEY, &["r1"])],
                    ]),
                )),
            ),
            (
                "labels are single values: no __ split, but trimmed; blank ones add nothing",
                in_tree(json!({GA_ZONE: " z1__z2 ", GA_REGION: "  "}), null.clone()),
                Some(csi(
                    json!({GA_ZONE: " z1__z2 ", GA_REGION: "  "}),
                    affinity(&[&[(ZONE_KEY, &["z1__z2"])]]),
                )),
            ),
            (
                "beta zone label chooses the beta region label",
                in_tree(json!({BETA_ZONE: "z1", GA_REGION: "r1"}), null.clone()),
                Some(csi(json!({BETA_ZONE: "z1", GA_REGION: "r1"}), affinity(&[&[(ZONE_KEY, &["z1"])]]))),
            ),
            (
                "empty fsType and policy, storagePolicyID dropped, attributes empty",
                json!({"spec": {"vsphereVolume": {"volumePath": "[ds] a.vmdk", "fsType": "", "storagePolicyName": "", "storagePolicyID": "id"}}}),
                Some(
                    json!({"spec": {"csi": {"driver": DRIVER, "volumeHandle": "[ds] a.vmdk", "volumeAttributes": {}}}}),
                ),
            ),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_in_tree_pv_to_csi(&pv(input.clone()));
            match want {
                Some(want) => {
                    assert_same(name, &got.unwrap_or_else(|e| panic!("{name}: {e}")), &pv(want.clone()))
                }
                None => {
                    let err = got.expect_err(name).to_string();
                    assert!(err.contains(PV_NAME), "{name}: {err}");
                }
            }
        }
    }

    // Upstream: TestTranslateVSphereCSIPVToInTree (3 of 4 cases; "pv is nil" cannot be
    // expressed), then kvol's own cases.
    #[test]
    fn csi_pv_to_in_tree() {
        let null = Value::Null;
        let csi_pv = |labels: Value, attrs: Value, na: Value| {
            json!({
                "metadata": {"name": PV_NAME, "labels": labels},
                "spec": {
                    "csi": {
                        "driver": DRIVER,
                        "volumeHandle": "e4073a6d-642e-4dff-8f4a-b4e3a47c4bbd",
                        "fsType": "ext4",
                        "readOnly": true,
                        "volumeAttributes": attrs,
                    },
                    "accessModes": ["ReadWriteOnce"],
                    "nodeAffinity": na,
                },
            })
        };
        let in_tree_pv = |labels: Value, path: &str, na: Value| {
            json!({
                "metadata": {"name": PV_NAME, "labels": labels},
                "spec": {
                    "vsphereVolume": {"volumePath": path, "fsType": "ext4"},
                    "accessModes": ["ReadWriteOnce"],
                    "nodeAffinity": na,
                },
            })
        };
        let attrs = json!({STORAGE_POLICY_NAME: POLICY, INITIAL_VOLUME_FILE_PATH: PATH});
        let cases: &[(&str, Value, Option<Value>)] = &[
            (
                "expect error when pv.Spec.CSI is nil",
                json!({"metadata": {"name": PV_NAME}, "spec": {"accessModes": ["ReadWriteOnce"]}}),
                None,
            ),
            (
                "translate valid vSphere CSI PV to vSphere in-tree PV",
                csi_pv(null.clone(), attrs.clone(), null.clone()),
                Some(in_tree_pv(null.clone(), PATH, null.clone())),
            ),
            (
                "translate valid vSphere CSI PV with topology Node Affinity rules to vSphere CSI PV with topology labels",
                csi_pv(
                    null.clone(),
                    attrs.clone(),
                    affinity(&[&[(ZONE_KEY, &["z1"]), (REGION_KEY, &["r1"])]]),
                ),
                Some(in_tree_pv(
                    json!({GA_ZONE: "z1", GA_REGION: "r1"}),
                    PATH,
                    affinity(&[&[(GA_ZONE, &["z1"]), (GA_REGION, &["r1"])]]),
                )),
            ),
            // kvol's own cases.
            (
                "no initialvolumefilepath: empty volume path",
                csi_pv(null.clone(), null.clone(), null.clone()),
                Some(in_tree_pv(null.clone(), "", null.clone())),
            ),
            (
                "beta labels choose beta keys; existing labels kept; first sorted value labelled",
                csi_pv(
                    json!({BETA_ZONE: "keep"}),
                    attrs.clone(),
                    affinity(&[
                        &[(ZONE_KEY, &["z2", "z1"])],
                        &[(REGION_KEY, &["r2"]), ("other", &["x"])],
                        &[(REGION_KEY, &["r1"])],
                    ]),
                ),
                Some(in_tree_pv(
                    json!({BETA_ZONE: "keep", BETA_REGION: "r1"}),
                    PATH,
                    affinity(&[
                        &[(BETA_ZONE, &["z2", "z1"])],
                        &[(BETA_REGION, &["r2"]), ("other", &["x"])],
                        &[(BETA_REGION, &["r1"])],
                    ]),
                )),
            ),
            (
                "no region parser: a zone alone adds no region",
                csi_pv(null.clone(), attrs.clone(), affinity(&[&[(ZONE_KEY, &["z1"])]])),
                Some(in_tree_pv(json!({GA_ZONE: "z1"}), PATH, affinity(&[&[(GA_ZONE, &["z1"])]]))),
            ),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_csi_pv_to_in_tree(&pv(input.clone()));
            match want {
                Some(want) => {
                    assert_same(name, &got.unwrap_or_else(|e| panic!("{name}: {e}")), &pv(want.clone()))
                }
                None => {
                    let err = got.expect_err(name).to_string();
                    assert!(err.contains(PV_NAME), "{name}: {err}");
                }
            }
        }
    }

    // Upstream: TestTranslatevSphereInTreeInlineVolumeToCSI (both cases; the empty volume is
    // refused by the dispatcher), then the departure from upstream for storagePolicyName.
    #[test]
    fn inline_to_csi() {
        let cases: &[(&str, Value, Option<Value>)] = &[
            ("expect error when inline vsphere volume is nil", json!({"name": "inlinevolume"}), None),
            (
                "translate valid in-tree vsphere volume to vSphere CSI PV",
                json!({"name": "inlinevolume", "vsphereVolume": {"volumePath": "[vsanDatastore] volume/inlinevolume.vmdk", "fsType": "ext4"}}),
                Some(json!({
                    "metadata": {"name": "csi.vsphere.vmware.com-[vsanDatastore] volume/inlinevolume.vmdk"},
                    "spec": {
                        "csi": {
                            "driver": DRIVER,
                            "volumeHandle": "[vsanDatastore] volume/inlinevolume.vmdk",
                            "fsType": "ext4",
                            "volumeAttributes": {},
                        },
                        "accessModes": ["ReadWriteOnce"],
                        // Set by the dispatcher, as upstream's wrapper does.
                        "volumeMode": "Filesystem",
                    },
                })),
            ),
            (
                "storagePolicyName becomes an attribute (upstream panics here)",
                json!({"name": "v", "vsphereVolume": {"volumePath": "[ds] v.vmdk", "storagePolicyName": POLICY, "storagePolicyID": "id"}}),
                Some(json!({
                    "metadata": {"name": "csi.vsphere.vmware.com-[ds] v.vmdk"},
                    "spec": {
                        "csi": {
                            "driver": DRIVER,
                            "volumeHandle": "[ds] v.vmdk",
                            "volumeAttributes": {STORAGE_POLICY_NAME: POLICY},
                        },
                        "accessModes": ["ReadWriteOnce"],
                        "volumeMode": "Filesystem",
                    },
                })),
            ),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_in_tree_inline_volume_to_csi(&vol(input.clone()), "");
            match want {
                Some(want) => {
                    assert_same(name, &got.unwrap_or_else(|e| panic!("{name}: {e}")), &pv(want.clone()))
                }
                None => {
                    let err = got.expect_err(name).to_string();
                    assert!(err.contains("inlinevolume"), "{name}: {err}");
                }
            }
        }
    }

    // Upstream: TestTranslateInTreeInlineVolumeToCSINameUniqueness (translate_test.go), vSphere.
    #[test]
    fn inline_names_are_unique_per_disk() {
        let name = |path: &str| {
            let v = vol(json!({"name": "same", "vsphereVolume": {"volumePath": path, "fsType": "ext4"}}));
            crate::translate_in_tree_inline_volume_to_csi(&v, "").unwrap().metadata.name
        };
        assert_ne!(
            name(" [vsanDatastore] 6785a85e/kubernetes-dynamic-pvc-1.vmdk"),
            name(" [vsanDatastore] 6785a85e/kubernetes-dynamic-pvc-2.vmdk")
        );
    }

    // kvol: a PV with topology survives the round trip, labels and all (GA labels).
    #[test]
    fn round_trip_with_topology() {
        let input = json!({
            "metadata": {"name": PV_NAME, "labels": {GA_ZONE: "z1", GA_REGION: "r1"}},
            "spec": {
                "vsphereVolume": {"volumePath": PATH, "fsType": "ext4"},
                "nodeAffinity": affinity(&[&[(GA_ZONE, &["z1"]), (GA_REGION, &["r1"])]]),
            },
        });
        let mut csi = crate::translate_in_tree_pv_to_csi(&pv(input.clone())).unwrap();
        // The driver reports where it found the volume; the in-tree path comes back from there.
        if let Some(c) = csi.spec.as_mut().and_then(|s| s.csi.as_mut()) {
            c.volume_attributes
                .get_or_insert_with(BTreeMap::new)
                .insert(INITIAL_VOLUME_FILE_PATH.into(), PATH.into());
        }
        let back = crate::translate_csi_pv_to_in_tree(&csi).unwrap();
        assert_same("round trip", &back, &pv(input));
    }
}
