//! OpenStack Cinder (`kubernetes.io/cinder`) to and from the `cinder.csi.openstack.org` CSI driver, as upstream translates it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CinderPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_api::MigratablePlugin;
use kvol_api::keys::PARAM_CSI_FSTYPE;

use super::Translator;
use crate::go::key_is;
use crate::topology::{
    translate_allowed_topologies, translate_topology_csi_to_in_tree, translate_topology_in_tree_to_csi,
};
use crate::{Result, TranslateError};

pub(crate) struct Cinder;

const PLUGIN: MigratablePlugin = MigratablePlugin::Cinder;
const DRIVER: &str = PLUGIN.csi_driver();
/// The zone key of the Cinder CSI driver's topology.
const TOPOLOGY_KEY: &str = "topology.cinder.csi.openstack.org/zone";

impl Translator for Cinder {
    fn storage_class_to_csi(&self, mut sc: StorageClass) -> Result<StorageClass> {
        let mut params = BTreeMap::new();
        // Every parameter but `fstype` passes to the CSI driver, `availability` included: it is
        // not turned into allowed topologies. Upstream ranges over a Go map in random order;
        // where `fstype` and `csi.storage.k8s.io/fstype` (or two spellings of `fstype`) are both
        // set, the last key in BTreeMap key order wins here.
        for (key, value) in sc.parameters.take().unwrap_or_default() {
            // No non-ASCII letter lowercases to one of "fstype" in Go, so ASCII folding matches it.
            if key_is(&key, "fstype") {
                params.insert(PARAM_CSI_FSTYPE.to_string(), value);
            } else {
                params.insert(key, value);
            }
        }
        if sc.allowed_topologies.as_ref().is_some_and(|t| !t.is_empty()) {
            sc.allowed_topologies =
                sc.allowed_topologies.map(|terms| translate_allowed_topologies(&terms, TOPOLOGY_KEY));
        }
        // Always a map, empty when there were no parameters, as upstream.
        sc.parameters = Some(params);
        Ok(sc)
    }

    fn inline_to_csi(&self, vol: &Volume, _pod_namespace: &str) -> Result<PersistentVolume> {
        let cinder = vol.cinder.as_ref().ok_or_else(|| {
            TranslateError::plugin(PLUGIN, format!("inline volume {:?} has no cinder source", vol.name))
        })?;
        // The name must be unique per disk: kubelet uses it in the staging path.
        let mut name = String::with_capacity(DRIVER.len() + 1 + cinder.volume_id.len());
        name.push_str(DRIVER);
        name.push('-');
        name.push_str(&cinder.volume_id);
        Ok(PersistentVolume {
            metadata: ObjectMeta { name: Some(name), ..Default::default() },
            spec: Some(PersistentVolumeSpec {
                csi: Some(csi_source(cinder.volume_id.clone(), cinder.read_only, cinder.fs_type.clone())),
                access_modes: Some(vec!["ReadWriteOnce".to_string()]),
                ..Default::default()
            }),
            status: None,
        })
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<()> {
        let Some(cinder) = pv.spec.as_mut().and_then(|s| s.cinder.take()) else {
            return Err(no_source(pv, "cinder"));
        };
        // The secret reference has no place in the CSI source and is dropped, as upstream.
        let csi = csi_source(cinder.volume_id, cinder.read_only, cinder.fs_type);
        translate_topology_in_tree_to_csi(pv, TOPOLOGY_KEY);
        pv.spec.get_or_insert_with(Default::default).csi = Some(csi);
        Ok(())
    }

    fn csi_pv_to_in_tree(&self, pv: &mut PersistentVolume) -> Result<()> {
        let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.take()) else {
            return Err(no_source(pv, "csi"));
        };
        let cinder = CinderPersistentVolumeSource {
            volume_id: csi.volume_handle,
            fs_type: csi.fs_type,
            read_only: csi.read_only,
            secret_ref: None,
        };
        // A Cinder region cannot be told from a zone, so no region is derived.
        translate_topology_csi_to_in_tree(pv, TOPOLOGY_KEY, None).map_err(|e| {
            let name = pv.metadata.name.as_deref().unwrap_or_default();
            TranslateError::plugin(PLUGIN, format!("persistent volume {name:?}: {e}"))
        })?;
        pv.spec.get_or_insert_with(Default::default).cinder = Some(cinder);
        Ok(())
    }
}

fn no_source(pv: &PersistentVolume, field: &str) -> TranslateError {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    TranslateError::plugin(PLUGIN, format!("persistent volume {name:?} has no {field} source"))
}

fn csi_source(handle: String, read_only: Option<bool>, fs_type: Option<String>) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER.to_string(),
        volume_handle: handle,
        read_only,
        fs_type,
        // Present and empty, as upstream.
        volume_attributes: Some(BTreeMap::new()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::plugins::test_support::{assert_same, pv, sc, vol};

    const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
    const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
    const GA_ZONE: &str = "topology.kubernetes.io/zone";

    /// One node-selector term per entry, each holding `key In values`.
    fn affinity(terms: &[(&str, &[&str])]) -> Value {
        let terms: Vec<Value> = terms
            .iter()
            .map(|(key, values)| {
                json!({"matchExpressions": [{"key": key, "operator": "In", "values": values}]})
            })
            .collect();
        json!({"required": {"nodeSelectorTerms": terms}})
    }

    fn topo(key: &str, values: &[&str]) -> Value {
        json!([{"matchLabelExpressions": [{"key": key, "values": values}]}])
    }

    #[test]
    fn storage_class_to_csi() {
        let cases = [
            // TestTranslateCinderInTreeStorageClassToCSI (openstack_cinder_test.go); also reference 5.3.
            (
                "translate normal",
                json!({"parameters": {"foo": "bar"}}),
                json!({"parameters": {"foo": "bar"}}),
            ),
            ("translate empty map", json!({"parameters": {}}), json!({"parameters": {}})),
            (
                "translate with fstype",
                json!({"parameters": {"fstype": "ext3"}}),
                json!({"parameters": {"csi.storage.k8s.io/fstype": "ext3"}}),
            ),
            (
                "translate with topology in parameters (no translation expected)",
                json!({"parameters": {"availability": "nova"}}),
                json!({"parameters": {"availability": "nova"}}),
            ),
            (
                "translate with topology",
                json!({"parameters": {}, "allowedTopologies": topo(BETA_ZONE, &["nova"])}),
                json!({"parameters": {}, "allowedTopologies": topo(TOPOLOGY_KEY, &["nova"])}),
            ),
            // Upstream's rules beyond its table.
            ("no parameters gives an empty map", json!({}), json!({"parameters": {}})),
            (
                "fstype matched case-insensitively, other keys keep their case",
                json!({"parameters": {"FSType": "xfs", "Availability": "nova", "zone": "z"}}),
                json!({"parameters": {"csi.storage.k8s.io/fstype": "xfs", "Availability": "nova", "zone": "z"}}),
            ),
            (
                "GA zone key renamed, other keys and the provisioner kept",
                json!({
                    "provisioner": "kubernetes.io/cinder",
                    "allowedTopologies": [{"matchLabelExpressions": [
                        {"key": GA_ZONE, "values": ["a", "b"]}, {"key": "rack", "values": ["r"]}
                    ]}]
                }),
                json!({
                    "provisioner": "kubernetes.io/cinder",
                    "parameters": {},
                    "allowedTopologies": [{"matchLabelExpressions": [
                        {"key": TOPOLOGY_KEY, "values": ["a", "b"]}, {"key": "rack", "values": ["r"]}
                    ]}]
                }),
            ),
        ];
        for (name, input, want) in cases {
            let got =
                crate::translate_in_tree_storage_class_to_csi("kubernetes.io/cinder", &sc(input)).unwrap();
            assert_same(name, &got, &sc(want));
        }
    }

    #[test]
    fn inline_volume_to_csi() {
        let cases = [
            (
                "every field; secret dropped; volume mode from the wrapper",
                json!({"name": "v", "cinder": {
                    "volumeID": "vol1", "fsType": "ext4", "readOnly": true, "secretRef": {"name": "s"}
                }}),
                json!({
                    "metadata": {"name": "cinder.csi.openstack.org-vol1"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "volumeMode": "Filesystem",
                        "csi": {
                            "driver": "cinder.csi.openstack.org", "volumeHandle": "vol1", "fsType": "ext4",
                            "readOnly": true, "volumeAttributes": {}
                        }
                    }
                }),
            ),
            (
                "unset fields stay unset",
                json!({"name": "v", "cinder": {"volumeID": "vol2"}}),
                json!({
                    "metadata": {"name": "cinder.csi.openstack.org-vol2"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "volumeMode": "Filesystem",
                        "csi": {"driver": "cinder.csi.openstack.org", "volumeHandle": "vol2", "volumeAttributes": {}}
                    }
                }),
            ),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_in_tree_inline_volume_to_csi(&vol(input), "ns").unwrap();
            assert_same(name, &got, &pv(want));
        }
        // translate_test.go TestTranslateInTreeInlineVolumeToCSINameUniqueness, for this driver.
        let name_of = |id: &str| {
            let input = vol(json!({"name": "v", "cinder": {"volumeID": id}}));
            crate::translate_in_tree_inline_volume_to_csi(&input, "").unwrap().metadata.name
        };
        assert_ne!(
            name_of("0c9f4d3e-7a51-4b8e-9b4f-2d7c1e0a6b11"),
            name_of("5a2e8c71-3f0d-4c6a-8e19-b7d4f2a09c35")
        );
        let empty = vol(json!({"name": "v"}));
        assert!(crate::translate_in_tree_inline_volume_to_csi(&empty, "").is_err());
    }

    #[test]
    fn pv_to_csi_and_back() {
        let cinder = json!({"volumeID": "vol1", "fsType": "ext4"});
        let csi = json!({
            "driver": "cinder.csi.openstack.org", "volumeHandle": "vol1", "fsType": "ext4",
            "volumeAttributes": {}
        });
        let beta_labels = json!({BETA_ZONE: "us-east-1a", BETA_REGION: "us-east-1"});
        let cases = [
            // TestTopologyTranslation (translate_test.go), the Cinder cases; also reference 5.3
            // Cinder 4. Upstream checks the CSI side and that the way back succeeds; the way back
            // here follows upstream's rules (no region for Cinder).
            (
                "OpenStack Cinder with zone labels",
                json!({"metadata": {"labels": beta_labels}, "spec": {"cinder": cinder}}),
                json!({"metadata": {"labels": beta_labels}, "spec": {
                    "csi": csi, "nodeAffinity": affinity(&[(TOPOLOGY_KEY, &["us-east-1a"])])
                }}),
                json!({"metadata": {"labels": beta_labels}, "spec": {
                    "cinder": cinder, "nodeAffinity": affinity(&[(BETA_ZONE, &["us-east-1a"])])
                }}),
            ),
            (
                "OpenStack Cinder with zone labels and topology",
                json!({"metadata": {"labels": beta_labels}, "spec": {
                    "cinder": cinder, "nodeAffinity": affinity(&[(BETA_ZONE, &["us-east-2a"])])
                }}),
                json!({"metadata": {"labels": beta_labels}, "spec": {
                    "csi": csi, "nodeAffinity": affinity(&[(TOPOLOGY_KEY, &["us-east-2a"])])
                }}),
                json!({"metadata": {"labels": beta_labels}, "spec": {
                    "cinder": cinder, "nodeAffinity": affinity(&[(BETA_ZONE, &["us-east-2a"])])
                }}),
            ),
            // Upstream's rules beyond its tables.
            (
                "secret dropped, other fields kept, no topology, labels stay absent",
                json!({"metadata": {"name": "pv"}, "spec": {
                    "cinder": {"volumeID": "vol1", "secretRef": {"name": "s", "namespace": "n"}},
                    "accessModes": ["ReadWriteMany"], "storageClassName": "standard"
                }}),
                json!({"metadata": {"name": "pv"}, "spec": {
                    "csi": {"driver": "cinder.csi.openstack.org", "volumeHandle": "vol1", "volumeAttributes": {}},
                    "accessModes": ["ReadWriteMany"], "storageClassName": "standard"
                }}),
                json!({"metadata": {"name": "pv"}, "spec": {
                    "cinder": {"volumeID": "vol1"},
                    "accessModes": ["ReadWriteMany"], "storageClassName": "standard"
                }}),
            ),
            (
                "two terms and a multi-zone GA label",
                json!({"metadata": {"labels": {GA_ZONE: "nova__az2"}}, "spec": {
                    "cinder": cinder, "nodeAffinity": affinity(&[("rack", &["r1"]), ("rack", &["r2"])])
                }}),
                json!({"metadata": {"labels": {GA_ZONE: "nova__az2"}}, "spec": {
                    "csi": csi,
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [
                        {"matchExpressions": [
                            {"key": "rack", "operator": "In", "values": ["r1"]},
                            {"key": TOPOLOGY_KEY, "operator": "In", "values": ["az2", "nova"]}
                        ]},
                        {"matchExpressions": [
                            {"key": "rack", "operator": "In", "values": ["r2"]},
                            {"key": TOPOLOGY_KEY, "operator": "In", "values": ["az2", "nova"]}
                        ]}
                    ]}}
                }}),
                json!({"metadata": {"labels": {GA_ZONE: "nova__az2"}}, "spec": {
                    "cinder": cinder,
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [
                        {"matchExpressions": [
                            {"key": "rack", "operator": "In", "values": ["r1"]},
                            {"key": GA_ZONE, "operator": "In", "values": ["az2", "nova"]}
                        ]},
                        {"matchExpressions": [
                            {"key": "rack", "operator": "In", "values": ["r2"]},
                            {"key": GA_ZONE, "operator": "In", "values": ["az2", "nova"]}
                        ]}
                    ]}}
                }}),
            ),
        ];
        for (name, input, want_csi, want_back) in cases {
            let got = crate::translate_in_tree_pv_to_csi(&pv(input)).unwrap();
            assert_same(name, &got, &pv(want_csi));
            let back = crate::translate_csi_pv_to_in_tree(&got).unwrap();
            assert_same(name, &back, &pv(want_back));
        }
    }

    #[test]
    fn csi_pv_to_in_tree() {
        let cases = [
            // TestTranslateTopologyFromCSIToInTree (in_tree_volume_test.go) "cinder translation",
            // through the whole PV; also reference 5.3 Cinder 5.
            (
                "cinder translation",
                json!({"metadata": {"name": "cinder"}, "spec": {
                    "csi": {"driver": "cinder.csi.openstack.org", "volumeHandle": "vol1"},
                    "nodeAffinity": affinity(&[(TOPOLOGY_KEY, &["nova"])])
                }}),
                json!({"metadata": {"name": "cinder", "labels": {GA_ZONE: "nova"}}, "spec": {
                    "cinder": {"volumeID": "vol1"},
                    "nodeAffinity": affinity(&[(GA_ZONE, &["nova"])])
                }}),
            ),
            (
                "attributes and secrets dropped",
                json!({"spec": {"csi": {
                    "driver": "cinder.csi.openstack.org", "volumeHandle": "vol1", "fsType": "xfs", "readOnly": true,
                    "volumeAttributes": {"k": "v"}, "nodePublishSecretRef": {"name": "s", "namespace": "n"}
                }}}),
                json!({"spec": {"cinder": {"volumeID": "vol1", "fsType": "xfs", "readOnly": true}}}),
            ),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_csi_pv_to_in_tree(&pv(input)).unwrap();
            assert_same(name, &got, &pv(want));
        }
        assert_eq!(Cinder.repair_volume_handle("vol1", "node").unwrap(), "vol1");
    }
}
