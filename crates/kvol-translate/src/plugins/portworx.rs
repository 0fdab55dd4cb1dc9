//! Portworx translation (`kubernetes.io/portworx-volume` ↔ `pxd.portworx.com`), auth secrets included.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, PortworxVolumeSource, SecretReference,
    Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_api::MigratablePlugin;

use super::Translator;
use crate::go::{key_is, zero_bool, zero_string};
use crate::{Result, TranslateError};

pub(crate) struct Portworx;

const PLUGIN: MigratablePlugin = MigratablePlugin::Portworx;
const DRIVER: &str = PLUGIN.csi_driver();

/// PV annotation and StorageClass parameter naming the secret that holds the auth token.
const AUTH_SECRET_NAME: &str = "openstorage.io/auth-secret-name";
/// PV annotation and StorageClass parameter naming that secret's namespace.
const AUTH_SECRET_NAMESPACE: &str = "openstorage.io/auth-secret-namespace";

/// The CSI StorageClass parameters an auth secret name becomes.
const CSI_SECRET_NAME_KEYS: [&str; 6] = [
    "csi.storage.k8s.io/provisioner-secret-name",
    "csi.storage.k8s.io/controller-publish-secret-name",
    "csi.storage.k8s.io/node-stage-secret-name",
    "csi.storage.k8s.io/node-publish-secret-name",
    "csi.storage.k8s.io/controller-expand-secret-name",
    "csi.storage.k8s.io/node-expand-secret-name",
];
/// The CSI StorageClass parameters an auth secret namespace becomes.
const CSI_SECRET_NAMESPACE_KEYS: [&str; 6] = [
    "csi.storage.k8s.io/provisioner-secret-namespace",
    "csi.storage.k8s.io/controller-publish-secret-namespace",
    "csi.storage.k8s.io/node-stage-secret-namespace",
    "csi.storage.k8s.io/node-publish-secret-namespace",
    "csi.storage.k8s.io/controller-expand-secret-namespace",
    "csi.storage.k8s.io/node-expand-secret-namespace",
];

const RWO: &str = "ReadWriteOnce";
const ROX: &str = "ReadOnlyMany";

/// Every key is copied except the two auth-secret keys, each of which fans out to six CSI keys.
fn translate_parameters(params: BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    // Upstream walks a Go map, so when two input keys land on the same output key (say both
    // `openstorage.io/auth-secret-name` and an upper-case spelling, or an auth key next to an
    // explicit `csi.storage.k8s.io/*-secret-*` key) the winner is random there. Here keys are
    // walked in BTreeMap order and the last one written wins.
    for (key, value) in params {
        let fan_out = if key_is(&key, AUTH_SECRET_NAME) {
            &CSI_SECRET_NAME_KEYS
        } else if key_is(&key, AUTH_SECRET_NAMESPACE) {
            &CSI_SECRET_NAMESPACE_KEYS
        } else {
            out.insert(key, value);
            continue;
        };
        for csi_key in fan_out {
            out.insert(csi_key.to_string(), value.clone());
        }
    }
    out
}

/// The secret both auth annotations name, if the PV has both (an empty value still counts,
/// though as a Go string field it is then left out of the reference).
fn auth_secret(meta: &ObjectMeta) -> Option<SecretReference> {
    let annotations = meta.annotations.as_ref()?;
    let name = annotations.get(AUTH_SECRET_NAME)?;
    let namespace = annotations.get(AUTH_SECRET_NAMESPACE)?;
    Some(SecretReference {
        name: zero_string(Some(name.clone())),
        namespace: zero_string(Some(namespace.clone())),
    })
}

fn name_of(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

impl Translator for Portworx {
    fn storage_class_to_csi(&self, mut sc: StorageClass) -> Result<StorageClass> {
        // Upstream replaces the parameters only when the result is non-empty; every input key
        // yields at least one output key, so absent stays absent and empty stays empty.
        if let Some(params) = sc.parameters.as_mut() {
            *params = translate_parameters(std::mem::take(params));
        }
        sc.provisioner = DRIVER.to_string();
        Ok(sc)
    }

    fn inline_to_csi(&self, vol: &Volume, _pod_namespace: &str) -> Result<PersistentVolume> {
        let Some(px) = vol.portworx_volume.as_ref() else {
            return Err(TranslateError::plugin(
                PLUGIN,
                format!("inline volume {:?} has no portworxVolume source", vol.name),
            ));
        };
        let mut name = String::with_capacity(DRIVER.len() + 1 + px.volume_id.len());
        name.push_str(DRIVER);
        name.push('-');
        name.push_str(&px.volume_id);
        let access_mode = if px.read_only == Some(true) { ROX } else { RWO };
        Ok(PersistentVolume {
            metadata: ObjectMeta { name: Some(name), ..Default::default() },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.to_string(),
                    volume_handle: px.volume_id.clone(),
                    fs_type: zero_string(px.fs_type.clone()),
                    // kvol departs from upstream: upstream leaves the CSI source's readOnly
                    // unset, losing a read-only inline volume's flag; kvol copies it (a
                    // `false` is left out, as Go's JSON would).
                    read_only: zero_bool(px.read_only),
                    volume_attributes: Some(BTreeMap::new()),
                    ..Default::default()
                }),
                access_modes: Some(vec![access_mode.to_string()]),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<()> {
        let Some(px) = pv.spec.as_mut().and_then(|s| s.portworx_volume.take()) else {
            return Err(TranslateError::plugin(
                PLUGIN,
                format!("persistent volume {:?} has no portworxVolume source", name_of(&pv.metadata)),
            ));
        };
        let secret = auth_secret(&pv.metadata);
        let csi = CSIPersistentVolumeSource {
            driver: DRIVER.to_string(),
            volume_handle: px.volume_id,
            fs_type: zero_string(px.fs_type),
            // kvol departs from upstream: upstream drops the PV's readOnly here (an apparent
            // omission, see the reference notes §4.6.7); kvol copies it to the CSI source (a
            // `false` is left out, as Go's JSON would).
            read_only: zero_bool(px.read_only),
            volume_attributes: Some(BTreeMap::new()),
            controller_publish_secret_ref: secret.clone(),
            node_stage_secret_ref: secret.clone(),
            node_publish_secret_ref: secret.clone(),
            controller_expand_secret_ref: secret.clone(),
            node_expand_secret_ref: secret,
        };
        if let Some(spec) = pv.spec.as_mut() {
            spec.csi = Some(csi);
        }
        Ok(())
    }

    fn csi_pv_to_in_tree(&self, pv: &mut PersistentVolume) -> Result<()> {
        let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.take()) else {
            return Err(TranslateError::plugin(
                PLUGIN,
                format!("persistent volume {:?} has no csi source", name_of(&pv.metadata)),
            ));
        };
        // Secret references and the auth annotations are not restored, as upstream.
        if let Some(spec) = pv.spec.as_mut() {
            spec.portworx_volume = Some(PortworxVolumeSource {
                volume_id: csi.volume_handle,
                fs_type: zero_string(csi.fs_type),
                read_only: zero_bool(csi.read_only),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::plugins::test_support::{Case, assert_same, check_result, pv, sc, vol};

    const IN_TREE: &str = "kubernetes.io/portworx-volume";

    /// The twelve CSI secret parameters, all naming `name` in `namespace`, plus `extra`.
    fn secret_params(name: &str, namespace: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut params = extra;
        if let serde_json::Value::Object(map) = &mut params {
            for key in CSI_SECRET_NAME_KEYS {
                map.insert(key.to_string(), json!(name));
            }
            for key in CSI_SECRET_NAMESPACE_KEYS {
                map.insert(key.to_string(), json!(namespace));
            }
        }
        params
    }

    /// From upstream TestTranslatePortworxInTreeStorageClassToCSI (portworx_test.go, with the
    /// auth-secret case of PR #129630), plus kvol cases. Upstream's "nil, err expected" case has
    /// no Rust counterpart: a StorageClass cannot be nil here.
    #[test]
    fn storage_class_to_csi() {
        struct Case {
            name: &'static str,
            input: serde_json::Value,
            want: serde_json::Value,
        }
        let cases = [
            Case {
                name: "upstream: correct",
                input: json!({"provisioner": IN_TREE, "parameters": {
                    "repl": "1", "fs": "ext4", "shared": "true", "priority_io": "high"}}),
                want: json!({"provisioner": "pxd.portworx.com", "parameters": {
                    "repl": "1", "fs": "ext4", "shared": "true", "priority_io": "high"}}),
            },
            Case {
                // Parameters stay absent (Go nil), not an empty map.
                name: "upstream: empty",
                input: json!({}),
                want: json!({"provisioner": "pxd.portworx.com"}),
            },
            Case {
                name: "upstream: with secret",
                input: json!({"provisioner": IN_TREE, "parameters": {
                    "repl": "1",
                    "openstorage.io/auth-secret-name": "test-secret",
                    "openstorage.io/auth-secret-namespace": "test-namespace"}}),
                want: json!({"provisioner": "pxd.portworx.com",
                    "parameters": secret_params("test-secret", "test-namespace", json!({"repl": "1"}))}),
            },
            Case {
                name: "empty parameters stay an empty map",
                input: json!({"provisioner": IN_TREE, "parameters": {}}),
                want: json!({"provisioner": "pxd.portworx.com", "parameters": {}}),
            },
            Case {
                name: "auth keys match case-insensitively; other keys keep their case",
                input: json!({"metadata": {"name": "px"}, "provisioner": IN_TREE, "parameters": {
                    "OpenStorage.IO/Auth-Secret-Name": "s", "OPENSTORAGE.IO/AUTH-SECRET-NAMESPACE": "ns",
                    "IO_Profile": "db"}}),
                want: json!({"metadata": {"name": "px"}, "provisioner": "pxd.portworx.com",
                    "parameters": secret_params("s", "ns", json!({"IO_Profile": "db"}))}),
            },
            Case {
                name: "a secret name alone gives only the six name keys",
                input: json!({"parameters": {"openstorage.io/auth-secret-name": "s"}}),
                want: json!({"provisioner": "pxd.portworx.com", "parameters": {
                    "csi.storage.k8s.io/provisioner-secret-name": "s",
                    "csi.storage.k8s.io/controller-publish-secret-name": "s",
                    "csi.storage.k8s.io/node-stage-secret-name": "s",
                    "csi.storage.k8s.io/node-publish-secret-name": "s",
                    "csi.storage.k8s.io/controller-expand-secret-name": "s",
                    "csi.storage.k8s.io/node-expand-secret-name": "s"}}),
            },
            Case {
                name: "a secret namespace alone gives only the six namespace keys",
                input: json!({"parameters": {"openstorage.io/auth-secret-namespace": "ns", "repl": "2"}}),
                want: json!({"provisioner": "pxd.portworx.com", "parameters": {
                    "repl": "2",
                    "csi.storage.k8s.io/provisioner-secret-namespace": "ns",
                    "csi.storage.k8s.io/controller-publish-secret-namespace": "ns",
                    "csi.storage.k8s.io/node-stage-secret-namespace": "ns",
                    "csi.storage.k8s.io/node-publish-secret-namespace": "ns",
                    "csi.storage.k8s.io/controller-expand-secret-namespace": "ns",
                    "csi.storage.k8s.io/node-expand-secret-namespace": "ns"}}),
            },
            Case {
                // Random in upstream (Go map order); BTreeMap order here, so the auth key,
                // walked after `csi.…`, wins.
                name: "auth key overrides an explicit csi secret key",
                input: json!({"parameters": {
                    "csi.storage.k8s.io/node-stage-secret-name": "explicit",
                    "openstorage.io/auth-secret-name": "auth"}}),
                want: json!({"provisioner": "pxd.portworx.com", "parameters": {
                    "csi.storage.k8s.io/provisioner-secret-name": "auth",
                    "csi.storage.k8s.io/controller-publish-secret-name": "auth",
                    "csi.storage.k8s.io/node-stage-secret-name": "auth",
                    "csi.storage.k8s.io/node-publish-secret-name": "auth",
                    "csi.storage.k8s.io/controller-expand-secret-name": "auth",
                    "csi.storage.k8s.io/node-expand-secret-name": "auth"}}),
            },
            Case {
                name: "other fields are kept",
                input: json!({"metadata": {"name": "px-sc", "labels": {"a": "b"}}, "provisioner": IN_TREE,
                    "reclaimPolicy": "Retain", "allowVolumeExpansion": true,
                    "allowedTopologies": [{"matchLabelExpressions": [
                        {"key": "topology.kubernetes.io/zone", "values": ["z1"]}]}]}),
                want: json!({"metadata": {"name": "px-sc", "labels": {"a": "b"}},
                    "provisioner": "pxd.portworx.com", "reclaimPolicy": "Retain", "allowVolumeExpansion": true,
                    "allowedTopologies": [{"matchLabelExpressions": [
                        {"key": "topology.kubernetes.io/zone", "values": ["z1"]}]}]}),
            },
        ];
        for case in cases {
            let input = sc(case.input);
            let got = crate::translate_in_tree_storage_class_to_csi(IN_TREE, &input)
                .unwrap_or_else(|e| panic!("case {:?}: {e}", case.name));
            assert_same(case.name, &got, &sc(case.want));
        }
    }

    /// From upstream TestTranslatePortworxInTreeInlineVolumeToCSI, plus kvol cases. Through the
    /// public API the dispatcher sets volumeMode Filesystem, which upstream's plugin-level test
    /// does not see; upstream's "nil" case becomes an inline volume without a Portworx source.
    #[test]
    fn inline_to_csi() {
        let cases = [
            Case {
                // A `false` readOnly is left out (Go's zero value), as in upstream's expectation.
                name: "upstream: normal",
                input: json!({"name": "PortworxVol",
                    "portworxVolume": {"volumeID": "ID", "fsType": "type", "readOnly": false}}),
                want: Some(json!({"metadata": {"name": "pxd.portworx.com-ID"}, "spec": {
                    "csi": {"driver": "pxd.portworx.com", "volumeHandle": "ID", "fsType": "type",
                        "volumeAttributes": {}},
                    "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}})),
            },
            Case { name: "upstream: nil", input: json!({"name": "PortworxVol"}), want: None },
            Case {
                // kvol departs from upstream: the CSI source keeps readOnly: true.
                name: "read-only inline volume is ReadOnlyMany",
                input: json!({"name": "v", "portworxVolume": {"volumeID": "vol-2", "readOnly": true}}),
                want: Some(json!({"metadata": {"name": "pxd.portworx.com-vol-2"}, "spec": {
                    "csi": {"driver": "pxd.portworx.com", "volumeHandle": "vol-2", "readOnly": true,
                        "volumeAttributes": {}},
                    "accessModes": ["ReadOnlyMany"], "volumeMode": "Filesystem"}})),
            },
            Case {
                name: "absent readOnly and fsType stay absent",
                input: json!({"name": "v", "portworxVolume": {"volumeID": "x"}}),
                want: Some(json!({"metadata": {"name": "pxd.portworx.com-x"}, "spec": {
                    "csi": {"driver": "pxd.portworx.com", "volumeHandle": "x", "volumeAttributes": {}},
                    "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}})),
            },
            Case {
                name: "empty fsType is left out",
                input: json!({"name": "v", "portworxVolume": {"volumeID": "x", "fsType": ""}}),
                want: Some(json!({"metadata": {"name": "pxd.portworx.com-x"}, "spec": {
                    "csi": {"driver": "pxd.portworx.com", "volumeHandle": "x", "volumeAttributes": {}},
                    "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}})),
            },
        ];
        for case in cases {
            let input = vol(case.input);
            let got = crate::translate_in_tree_inline_volume_to_csi(&input, "ns");
            check_result(case.name, got, case.want.map(pv));
        }
    }

    /// From upstream TestTranslatePortworxInTreePVToCSI (with the annotated-secret case of PR
    /// #129630), plus kvol cases. Upstream's "nil PV" case has no Rust counterpart.
    #[test]
    fn pv_to_csi() {
        let secret = json!({"name": "test-secret", "namespace": "test-namespace"});
        let cases = [
            Case {
                name: "upstream: no Portworx volume",
                input: json!({"metadata": {"name": "pxd.portworx.com"}, "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "claimRef": {"name": "test-pvc", "namespace": "default"}}}),
                want: None,
            },
            Case {
                // A `false` readOnly is left out (Go's zero value), as in upstream's expectation.
                name: "upstream: normal",
                input: json!({"metadata": {"name": "pxd.portworx.com"}, "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "claimRef": {"name": "test-pvc", "namespace": "default"},
                    "portworxVolume": {"volumeID": "ID1111", "fsType": "type", "readOnly": false}}}),
                want: Some(json!({"metadata": {"name": "pxd.portworx.com"}, "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "claimRef": {"name": "test-pvc", "namespace": "default"},
                    "csi": {"driver": "pxd.portworx.com", "volumeHandle": "ID1111", "fsType": "type",
                        "volumeAttributes": {}}}})),
            },
            Case {
                name: "upstream: with secret annotations",
                input: json!({"metadata": {"name": "pxd.portworx.com", "annotations": {
                        "openstorage.io/auth-secret-name": "test-secret",
                        "openstorage.io/auth-secret-namespace": "test-namespace"}},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                        "claimRef": {"name": "test-pvc", "namespace": "default"},
                        "portworxVolume": {"volumeID": "ID1111", "fsType": "type", "readOnly": false}}}),
                want: Some(json!({"metadata": {"name": "pxd.portworx.com", "annotations": {
                        "openstorage.io/auth-secret-name": "test-secret",
                        "openstorage.io/auth-secret-namespace": "test-namespace"}},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                        "claimRef": {"name": "test-pvc", "namespace": "default"},
                        "csi": {"driver": "pxd.portworx.com", "volumeHandle": "ID1111", "fsType": "type",
                            "volumeAttributes": {},
                            "controllerPublishSecretRef": secret, "nodeStageSecretRef": secret,
                            "nodePublishSecretRef": secret, "controllerExpandSecretRef": secret,
                            "nodeExpandSecretRef": secret}}})),
            },
            Case {
                name: "only the secret name annotation: no secret refs",
                input: json!({"metadata": {"name": "p", "annotations": {
                        "openstorage.io/auth-secret-name": "test-secret"}},
                    "spec": {"portworxVolume": {"volumeID": "v"}}}),
                want: Some(json!({"metadata": {"name": "p", "annotations": {
                        "openstorage.io/auth-secret-name": "test-secret"}},
                    "spec": {"csi": {"driver": "pxd.portworx.com", "volumeHandle": "v",
                        "volumeAttributes": {}}}})),
            },
            Case {
                name: "only the secret namespace annotation: no secret refs",
                input: json!({"metadata": {"name": "p", "annotations": {
                        "openstorage.io/auth-secret-namespace": "ns"}},
                    "spec": {"portworxVolume": {"volumeID": "v"}}}),
                want: Some(json!({"metadata": {"name": "p", "annotations": {
                        "openstorage.io/auth-secret-namespace": "ns"}},
                    "spec": {"csi": {"driver": "pxd.portworx.com", "volumeHandle": "v",
                        "volumeAttributes": {}}}})),
            },
            Case {
                // Annotations are matched exactly (upstream's HasAnnotation), not case-insensitively.
                name: "annotation keys are case-sensitive",
                input: json!({"metadata": {"name": "p", "annotations": {
                        "OpenStorage.io/auth-secret-name": "s",
                        "openstorage.io/auth-secret-namespace": "ns"}},
                    "spec": {"portworxVolume": {"volumeID": "v"}}}),
                want: Some(json!({"metadata": {"name": "p", "annotations": {
                        "OpenStorage.io/auth-secret-name": "s",
                        "openstorage.io/auth-secret-namespace": "ns"}},
                    "spec": {"csi": {"driver": "pxd.portworx.com", "volumeHandle": "v",
                        "volumeAttributes": {}}}})),
            },
            Case {
                // The references exist, but their empty Go string fields are left out.
                name: "empty annotation values still give secret refs",
                input: json!({"metadata": {"name": "p", "annotations": {
                        "openstorage.io/auth-secret-name": "",
                        "openstorage.io/auth-secret-namespace": ""}},
                    "spec": {"portworxVolume": {"volumeID": "v"}}}),
                want: Some(json!({"metadata": {"name": "p", "annotations": {
                        "openstorage.io/auth-secret-name": "",
                        "openstorage.io/auth-secret-namespace": ""}},
                    "spec": {"csi": {"driver": "pxd.portworx.com", "volumeHandle": "v",
                        "volumeAttributes": {},
                        "controllerPublishSecretRef": {}, "nodeStageSecretRef": {},
                        "nodePublishSecretRef": {}, "controllerExpandSecretRef": {},
                        "nodeExpandSecretRef": {}}}})),
            },
            Case {
                // kvol departs from upstream: readOnly: true reaches the CSI source.
                name: "read-only PV keeps readOnly; access modes, labels and affinity untouched",
                input: json!({"metadata": {"name": "p", "labels": {"topology.kubernetes.io/zone": "z"}},
                    "spec": {"accessModes": ["ReadWriteMany", "ReadOnlyMany"],
                        "capacity": {"storage": "1Gi"}, "persistentVolumeReclaimPolicy": "Delete",
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z"]}]}]}},
                        "portworxVolume": {"volumeID": "v", "readOnly": true}}}),
                want: Some(json!({"metadata": {"name": "p", "labels": {"topology.kubernetes.io/zone": "z"}},
                    "spec": {"accessModes": ["ReadWriteMany", "ReadOnlyMany"],
                        "capacity": {"storage": "1Gi"}, "persistentVolumeReclaimPolicy": "Delete",
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z"]}]}]}},
                        "csi": {"driver": "pxd.portworx.com", "volumeHandle": "v", "readOnly": true,
                            "volumeAttributes": {}}}})),
            },
        ];
        for case in cases {
            let input = pv(case.input);
            let before = input.clone();
            let got = crate::translate_in_tree_pv_to_csi(&input);
            assert_same(case.name, &input, &before);
            check_result(case.name, got, case.want.map(pv));
        }
    }

    /// From upstream TestTranslatePortworxCSIPvToInTree, plus kvol cases. Upstream's "nil PV"
    /// case has no Rust counterpart.
    #[test]
    fn csi_pv_to_in_tree() {
        let cases = [
            Case {
                name: "upstream: no CSI section",
                input: json!({"metadata": {"name": "pxd.portworx.com"}, "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "claimRef": {"name": "test-pvc", "namespace": "default"}}}),
                want: None,
            },
            Case {
                name: "upstream: normal",
                input: json!({"metadata": {"name": "pxd.portworx.com"}, "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "claimRef": {"name": "test-pvc", "namespace": "default"},
                    "csi": {"driver": "pxd.portworx.com", "volumeHandle": "ID1111", "fsType": "type",
                        "volumeAttributes": {}}}}),
                want: Some(json!({"metadata": {"name": "pxd.portworx.com"}, "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "claimRef": {"name": "test-pvc", "namespace": "default"},
                    "portworxVolume": {"volumeID": "ID1111", "fsType": "type"}}})),
            },
            Case {
                name: "readOnly copied; secret refs and annotations not restored",
                input: json!({"metadata": {"name": "p", "annotations": {
                        "openstorage.io/auth-secret-name": "s"}},
                    "spec": {"csi": {"driver": "pxd.portworx.com", "volumeHandle": "h", "readOnly": true,
                        "volumeAttributes": {"a": "b"}, "nodeStageSecretRef": {"name": "s", "namespace": "n"}}}}),
                want: Some(json!({"metadata": {"name": "p", "annotations": {
                        "openstorage.io/auth-secret-name": "s"}},
                    "spec": {"portworxVolume": {"volumeID": "h", "readOnly": true}}})),
            },
            Case {
                name: "false readOnly and empty fsType are left out",
                input: json!({"metadata": {"name": "p"}, "spec": {"csi": {"driver": "pxd.portworx.com",
                    "volumeHandle": "h", "fsType": "", "readOnly": false}}}),
                want: Some(json!({"metadata": {"name": "p"}, "spec": {"portworxVolume": {"volumeID": "h"}}})),
            },
            Case {
                name: "another driver is not translated",
                input: json!({"metadata": {"name": "p"}, "spec": {"csi": {"driver": "px.example.com",
                    "volumeHandle": "h"}}}),
                want: None,
            },
        ];
        for case in cases {
            let input = pv(case.input);
            let got = crate::translate_csi_pv_to_in_tree(&input);
            check_result(case.name, got, case.want.map(pv));
        }
    }

    /// kvol's departure, end to end: a read-only PV survives the round trip unchanged.
    #[test]
    fn read_only_round_trip() {
        let input = pv(json!({"metadata": {"name": "p"}, "spec": {
            "portworxVolume": {"volumeID": "v", "fsType": "ext4", "readOnly": true}}}));
        let csi = crate::translate_in_tree_pv_to_csi(&input).expect("to csi");
        let back = crate::translate_csi_pv_to_in_tree(&csi).expect("back");
        assert_same("round trip", &back, &input);
    }

    /// From upstream TestTranslateInTreeInlineVolumeToCSINameUniqueness (translate_test.go).
    #[test]
    fn inline_names_are_unique_per_volume() {
        let a = vol(json!({"name": "a", "portworxVolume": {"volumeID": "0f6d1c9e-1"}}));
        let b = vol(json!({"name": "a", "portworxVolume": {"volumeID": "0f6d1c9e-2"}}));
        let pa = crate::translate_in_tree_inline_volume_to_csi(&a, "").expect("a");
        let pb = crate::translate_in_tree_inline_volume_to_csi(&b, "").expect("b");
        assert_ne!(pa.metadata.name, pb.metadata.name);
    }

    #[test]
    fn names_and_repair() {
        assert_eq!(crate::csi_name_from_in_tree_name(IN_TREE), Ok("pxd.portworx.com"));
        assert_eq!(crate::in_tree_name_from_csi_name("pxd.portworx.com"), Ok(IN_TREE));
        assert!(crate::is_migrated_csi_driver_by_name("pxd.portworx.com"));
        assert!(crate::is_migratable_in_tree_plugin_by_name(IN_TREE));
        assert_eq!(crate::repair_volume_handle("pxd.portworx.com", "h/1", "node").as_deref(), Ok("h/1"));
    }

    #[test]
    fn key_is_follows_go_to_lower() {
        assert!(key_is("openstorage.io/auth-secret-name", AUTH_SECRET_NAME));
        assert!(key_is("OPENSTORAGE.IO/AUTH-SECRET-NAME", AUTH_SECRET_NAME));
        // Go lower-cases U+0130 to a plain `i`, Rust's to_lowercase would not.
        assert!(key_is("openstorage.\u{130}o/auth-secret-name", AUTH_SECRET_NAME));
        assert!(key_is("\u{212A}ey", "key"));
        assert!(!key_is("openstorage.io/auth-secret-name ", AUTH_SECRET_NAME));
        assert!(!key_is("openstorage.io/auth-secret-nam", AUTH_SECRET_NAME));
        assert!(!key_is("openstorage.io/auth-secret-namé", AUTH_SECRET_NAME));
        assert!(!key_is("", AUTH_SECRET_NAME));
        assert!(key_is("", ""));
    }
}
