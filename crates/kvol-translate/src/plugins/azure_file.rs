//! Azure File: `kubernetes.io/azure-file` ⇄ `file.csi.azure.com`, as upstream's `azure_file.go`.
//!
//! The CSI volume handle is `{resource group}#{storage account}#{share}#{volume name}#{secret
//! namespace}`; the account comes from the secret name when it follows the in-tree
//! `azure-storage-account-{account}-secret` convention. StorageClasses are left as they are.
//!
//! Go's non-pointer `string` and `bool` fields map to `Option`s here; their zero value (`""`,
//! `false`) is written as `None`, which is how a Go object reads back after its JSON round trip.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AzureFilePersistentVolumeSource, CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec,
    SecretReference, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_api::MigratablePlugin;

use super::Translator;
use crate::go::{zero_bool, zero_string};
use crate::{Result, TranslateError};

pub(crate) struct AzureFile;

const PLUGIN: MigratablePlugin = MigratablePlugin::AzureFile;
const DRIVER: &str = PLUGIN.csi_driver();
/// Separator of the volume handle's fields.
const SEPARATOR: char = '#';
/// PV annotation holding the share's resource group.
const ANN_RESOURCE_GROUP: &str = "kubernetes.io/azure-file-resource-group";
/// Secret namespace when nothing else names one.
const DEFAULT_SECRET_NAMESPACE: &str = "default";
/// The in-tree secret name is `{SECRET_PREFIX}{account}{SECRET_SUFFIX}`.
const SECRET_PREFIX: &str = "azure-storage-account-";
const SECRET_SUFFIX: &str = "-secret";

// Volume attribute keys of the CSI driver; read back case-insensitively.
const ATTR_SHARE_NAME: &str = "sharename";
const ATTR_SECRET_NAME: &str = "secretname";
const ATTR_SECRET_NAMESPACE: &str = "secretnamespace";

/// The storage account in a secret name, as the unanchored pattern
/// `azure-storage-account-(.+)-secret` finds it: the leftmost prefix, then the longest
/// non-empty run up to a `-secret` on the same line.
fn storage_account(secret_name: &str) -> Option<&str> {
    secret_name.match_indices(SECRET_PREFIX).find_map(|(at, _)| {
        let rest = secret_name.get(at + SECRET_PREFIX.len()..)?;
        let line = rest.split('\n').next().unwrap_or_default();
        line.rfind(SECRET_SUFFIX).filter(|end| *end > 0).and_then(|end| line.get(..end))
    })
}

/// The account part of the volume handle: the account in the secret name, else the name.
fn account_or_secret(secret_name: &str) -> &str {
    storage_account(secret_name).unwrap_or(secret_name)
}

/// The fields of a volume handle: resource group, account, share and (possibly empty) name.
/// Needs at least two `#`; fields after the fourth are ignored.
fn file_share_info(handle: &str) -> Option<(&str, &str, &str, &str)> {
    let mut fields = handle.split(SEPARATOR);
    let (rg, account, share) = (fields.next()?, fields.next()?, fields.next()?);
    Some((rg, account, share, fields.next().unwrap_or_default()))
}

fn volume_handle(rg: &str, account: &str, share: &str, name: &str, namespace: &str) -> String {
    let mut handle =
        String::with_capacity(rg.len() + account.len() + share.len() + name.len() + namespace.len() + 4);
    for (i, field) in [rg, account, share, name, namespace].into_iter().enumerate() {
        if i > 0 {
            handle.push(SEPARATOR);
        }
        handle.push_str(field);
    }
    handle
}

fn csi_source(
    handle: String,
    share_name: String,
    secret_name: String,
    namespace: String,
    read_only: Option<bool>,
) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER.to_string(),
        volume_handle: handle,
        read_only: zero_bool(read_only),
        volume_attributes: Some(BTreeMap::from([(ATTR_SHARE_NAME.to_string(), share_name)])),
        node_stage_secret_ref: Some(SecretReference {
            name: zero_string(Some(secret_name)),
            namespace: zero_string(Some(namespace)),
        }),
        ..Default::default()
    }
}

impl Translator for AzureFile {
    fn storage_class_to_csi(&self, sc: StorageClass) -> Result<StorageClass> {
        Ok(sc)
    }

    fn inline_to_csi(&self, vol: &Volume, pod_namespace: &str) -> Result<PersistentVolume> {
        let src = vol.azure_file.as_ref().ok_or_else(|| {
            TranslateError::plugin(PLUGIN, format!("inline volume {:?} has no azureFile source", vol.name))
        })?;
        let namespace = if pod_namespace.is_empty() { DEFAULT_SECRET_NAMESPACE } else { pod_namespace };
        let account = account_or_secret(&src.secret_name);
        let handle = volume_handle("", account, &src.share_name, &vol.name, namespace);
        Ok(PersistentVolume {
            // The handle names share, volume and namespace, so it is unique as the staging path needs.
            metadata: ObjectMeta { name: Some(handle.clone()), ..Default::default() },
            spec: Some(PersistentVolumeSpec {
                csi: Some(csi_source(
                    handle,
                    src.share_name.clone(),
                    src.secret_name.clone(),
                    namespace.to_string(),
                    src.read_only,
                )),
                access_modes: Some(vec!["ReadWriteMany".to_string()]),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<()> {
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let Some(spec) = pv.spec.as_mut() else {
            return Err(TranslateError::plugin(PLUGIN, format!("persistent volume {name:?} has no spec")));
        };
        let Some(src) = spec.azure_file.take() else {
            return Err(TranslateError::plugin(
                PLUGIN,
                format!("persistent volume {name:?} has no azureFile source"),
            ));
        };
        // The secret's namespace: the source's own (even if empty), else the claim's.
        let namespace = match src.secret_namespace {
            Some(namespace) => namespace,
            None => spec.claim_ref.as_ref().and_then(|c| c.namespace.clone()).unwrap_or_default(),
        };
        if namespace.is_empty() {
            return Err(TranslateError::plugin(
                PLUGIN,
                format!(
                    "persistent volume {name:?}: no secret namespace in its azureFile source or claimRef"
                ),
            ));
        }
        let rg = pv.metadata.annotations.as_ref().and_then(|a| a.get(ANN_RESOURCE_GROUP));
        let account = account_or_secret(&src.secret_name);
        let handle = volume_handle(rg.map_or("", String::as_str), account, &src.share_name, name, &namespace);
        spec.csi = Some(csi_source(handle, src.share_name, src.secret_name, namespace, src.read_only));
        Ok(())
    }

    fn csi_pv_to_in_tree(&self, pv: &mut PersistentVolume) -> Result<()> {
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let Some(spec) = pv.spec.as_mut() else {
            return Err(TranslateError::plugin(PLUGIN, format!("persistent volume {name:?} has no spec")));
        };
        let Some(csi) = spec.csi.take() else {
            return Err(TranslateError::plugin(
                PLUGIN,
                format!("persistent volume {name:?} has no csi source"),
            ));
        };
        let mut share_name = String::new();
        let mut secret_name = String::new();
        let mut secret_namespace = None;
        // Keys are matched case-insensitively; should two spellings of one key both be set, the
        // last in key order wins (upstream: whichever Go's random map order visits last).
        for (key, value) in csi.volume_attributes.into_iter().flatten() {
            if key.eq_ignore_ascii_case(ATTR_SHARE_NAME) {
                share_name = value;
            } else if key.eq_ignore_ascii_case(ATTR_SECRET_NAME) {
                secret_name = value;
            } else if key.eq_ignore_ascii_case(ATTR_SECRET_NAMESPACE) {
                secret_namespace = Some(value);
            }
        }
        if let Some(secret) =
            csi.node_stage_secret_ref.filter(|s| s.name.as_ref().is_some_and(|n| !n.is_empty()))
        {
            secret_name = secret.name.unwrap_or_default();
            secret_namespace = Some(secret.namespace.unwrap_or_default());
        }
        let mut resource_group = None;
        if share_name.is_empty() || secret_name.is_empty() {
            let handle = &csi.volume_handle;
            let (rg, account, share, _) = file_share_info(handle).ok_or_else(|| {
                TranslateError::plugin(
                    PLUGIN,
                    format!("invalid volume handle {handle:?}: want {{resource group}}#{{account}}#{{share}}[#...]"),
                )
            })?;
            if share_name.is_empty() {
                share_name = share.to_string();
            }
            if secret_name.is_empty() {
                secret_name = [SECRET_PREFIX, account, SECRET_SUFFIX].concat();
            }
            resource_group = (!rg.is_empty()).then(|| rg.to_string());
        }
        spec.azure_file = Some(AzureFilePersistentVolumeSource {
            read_only: zero_bool(csi.read_only),
            secret_name,
            secret_namespace: Some(secret_namespace.unwrap_or_else(|| DEFAULT_SECRET_NAMESPACE.to_string())),
            share_name,
        });
        let annotations = pv.metadata.annotations.get_or_insert_with(BTreeMap::new);
        if let Some(rg) = resource_group {
            annotations.insert(ANN_RESOURCE_GROUP.to_string(), rg);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use regex::Regex;
    use serde_json::json;

    use super::*;
    use crate::plugins::test_support::{assert_same, pv, sc, vol};

    /// Asserts a plugin refusal whose message names `needle`.
    #[track_caller]
    fn assert_refused<T: std::fmt::Debug>(case: &str, got: Result<T>, needle: &str) {
        match got {
            Err(TranslateError::Plugin { plugin: PLUGIN, reason }) if reason.contains(needle) => {}
            other => panic!("case {case:?}: want a refusal naming {needle:?}, got {other:?}"),
        }
    }

    // Upstream TestGetFileShareInfo, all cases, plus extra separators.
    #[test]
    fn volume_handle_fields() {
        let share = "pvc-file-dynamic-17e43f84-f474-11e8-acd0-000d3a00df41";
        let cases = [
            (
                "rg#f5713de20cde511e8ba4900#pvc-file-dynamic-17e43f84-f474-11e8-acd0-000d3a00df41#diskname.vhd",
                Some(("rg", "f5713de20cde511e8ba4900", share, "diskname.vhd")),
            ),
            (
                "rg#f5713de20cde511e8ba4900#pvc-file-dynamic-17e43f84-f474-11e8-acd0-000d3a00df41",
                Some(("rg", "f5713de20cde511e8ba4900", share, "")),
            ),
            ("rg#f5713de20cde511e8ba4900", None),
            ("rg", None),
            ("", None),
            ("##", Some(("", "", "", ""))),
            ("rg#acct#share#name#ns#more", Some(("rg", "acct", "share", "name"))),
        ];
        for (handle, want) in cases {
            assert_eq!(file_share_info(handle), want, "{handle:?}");
        }
    }

    // Upstream TestGetStorageAccount, all cases, plus agreement with the upstream pattern itself
    // on awkward names.
    #[test]
    fn storage_account_from_secret_name() {
        let cases = [
            ("azure-storage-account-accountname-secret", Some("accountname")),
            ("azure-storage-account-accountname-dup-secret", Some("accountname-dup")),
            ("invalid", None),
        ];
        for (secret, want) in cases {
            assert_eq!(storage_account(secret), want, "{secret:?}");
        }
        let upstream = Regex::new("azure-storage-account-(.+)-secret").expect("pattern");
        let awkward = [
            "azure-storage-account--secret",
            "azure-storage-account---secret",
            "xazure-storage-account-a-secret-secretz",
            "azure-storage-account-a\n-secret",
            "azure-storage-account-a\nazure-storage-account-b-secret",
            "azure-storage-account-azure-storage-account-b-secret",
            "azure-storage-account--secret-secret",
            "azure-storage-account-é-secret\r\n-secret",
            "azure-storage-account-",
            "-secret",
            "",
        ];
        for secret in awkward {
            let want = upstream.captures(secret).and_then(|c| c.get(1)).map(|m| m.as_str());
            assert_eq!(storage_account(secret), want, "{secret:?}");
        }
        let tokens = ["azure-storage-account-", "-secret", "secret", "-", "a", "\n", "é"];
        let mut strings = vec![String::new()];
        for _ in 0..6 {
            strings = strings.iter().flat_map(|s| tokens.iter().map(move |t| format!("{s}{t}"))).collect();
            for secret in &strings {
                let want = upstream.captures(secret).and_then(|c| c.get(1)).map(|m| m.as_str());
                assert_eq!(storage_account(secret), want, "{secret:?}");
            }
        }
    }

    fn inline_pv(handle: &str, secret: serde_json::Value, read_only: bool) -> serde_json::Value {
        let mut csi = json!({
            "driver": "file.csi.azure.com",
            "nodeStageSecretRef": secret,
            "volumeAttributes": {"sharename": "sharename"},
            "volumeHandle": handle
        });
        if read_only {
            csi["readOnly"] = json!(true);
        }
        json!({
            "metadata": {"name": handle},
            "spec": {"csi": csi, "accessModes": ["ReadWriteMany"], "volumeMode": "Filesystem"}
        })
    }

    // Upstream TestTranslateAzureFileInTreeStorageClassToCSI, which tests inline volumes, plus
    // an account-style secret name and a read-write volume.
    #[test]
    fn inline_volume_to_csi() {
        let source = |secret: &str, ro: bool| json!({"name": "name", "azureFile": {"readOnly": ro, "secretName": secret, "shareName": "sharename"}});
        let cases = [
            (
                "azure file volume",
                source("secretname", true),
                "",
                inline_pv(
                    "#secretname#sharename#name#default",
                    json!({"name": "secretname", "namespace": "default"}),
                    true,
                ),
            ),
            (
                "azure file volume with a pod namespace",
                source("secretname", true),
                "test",
                inline_pv(
                    "#secretname#sharename#name#test",
                    json!({"name": "secretname", "namespace": "test"}),
                    true,
                ),
            ),
            (
                "account taken from the secret name, readOnly false dropped",
                source("azure-storage-account-acct-secret", false),
                "ns",
                inline_pv(
                    "#acct#sharename#name#ns",
                    json!({"name": "azure-storage-account-acct-secret", "namespace": "ns"}),
                    false,
                ),
            ),
            (
                "empty secret name",
                source("", false),
                "ns",
                inline_pv("##sharename#name#ns", json!({"namespace": "ns"}), false),
            ),
        ];
        for (name, input, namespace, want) in cases {
            let got = crate::translate_in_tree_inline_volume_to_csi(&vol(input), namespace);
            assert_same(name, &got.expect(name), &pv(want));
        }
        // "empty volume" and "no azure file volume".
        let none = crate::translate_in_tree_inline_volume_to_csi(&vol(json!({"name": "v"})), "ns");
        assert!(matches!(none, Err(TranslateError::NoPluginForInline { .. })), "{none:?}");
    }

    fn file_pv(
        annotations: serde_json::Value,
        source: serde_json::Value,
        claim_ns: Option<&str>,
    ) -> serde_json::Value {
        let mut pv = json!({"metadata": {"name": "uuid"}, "spec": {}});
        if !annotations.is_null() {
            pv["metadata"]["annotations"] = annotations;
        }
        if let Some(ns) = claim_ns {
            pv["spec"]["claimRef"] = json!({"namespace": ns, "name": "claim"});
        }
        let key = if source.get("driver").is_some() { "csi" } else { "azureFile" };
        pv["spec"][key] = source;
        pv
    }

    fn csi(handle: &str, secret: &str, namespace: &str) -> serde_json::Value {
        json!({
            "driver": "file.csi.azure.com",
            "readOnly": true,
            "nodeStageSecretRef": {"name": secret, "namespace": namespace},
            "volumeAttributes": {"sharename": "sharename"},
            "volumeHandle": handle
        })
    }

    // Upstream TestTranslateAzureFileInTreePVToCSI, its successful cases, plus an account-style
    // secret name and untouched PV fields.
    #[test]
    fn pv_to_csi() {
        let rg = json!({ANN_RESOURCE_GROUP: "rg"});
        let source = |ns: Option<&str>| {
            let mut s = json!({"shareName": "sharename", "secretName": "secretname", "readOnly": true});
            if let Some(ns) = ns {
                s["secretNamespace"] = json!(ns);
            }
            s
        };
        let cases = [
            (
                "azure file volume",
                file_pv(json!(null), source(Some("secretnamespace")), None),
                file_pv(
                    json!(null),
                    csi("#secretname#sharename#uuid#secretnamespace", "secretname", "secretnamespace"),
                    None,
                ),
            ),
            (
                "azure file volume with rg annotation",
                file_pv(rg.clone(), source(Some("secretnamespace")), None),
                file_pv(
                    rg.clone(),
                    csi("rg#secretname#sharename#uuid#secretnamespace", "secretname", "secretnamespace"),
                    None,
                ),
            ),
            (
                "get secret namespace from ClaimRef when it's missing in pv spec source",
                file_pv(rg.clone(), source(None), Some("claimrefnamespace")),
                file_pv(
                    rg.clone(),
                    csi("rg#secretname#sharename#uuid#claimrefnamespace", "secretname", "claimrefnamespace"),
                    Some("claimrefnamespace"),
                ),
            ),
            (
                "source namespace wins over the claim's; account from the secret name",
                file_pv(
                    json!({"other": "x"}),
                    json!({"shareName": "s", "secretName": "azure-storage-account-acct-secret", "secretNamespace": "a", "readOnly": false}),
                    Some("b"),
                ),
                file_pv(
                    json!({"other": "x"}),
                    json!({
                        "driver": "file.csi.azure.com",
                        "nodeStageSecretRef": {"name": "azure-storage-account-acct-secret", "namespace": "a"},
                        "volumeAttributes": {"sharename": "s"},
                        "volumeHandle": "#acct#s#uuid#a"
                    }),
                    Some("b"),
                ),
            ),
        ];
        for (name, input, want) in cases {
            let input = pv(input);
            let before = input.clone();
            assert_same(name, &crate::translate_in_tree_pv_to_csi(&input).expect(name), &pv(want));
            assert_same(name, &input, &before);
        }
        let mut nameless = pv(file_pv(json!(null), source(Some("ns")), None));
        nameless.metadata.name = None;
        let got = crate::translate_in_tree_pv_to_csi(&nameless).expect("nameless");
        let handle = got.spec.and_then(|s| s.csi).map(|c| c.volume_handle);
        assert_eq!(handle.as_deref(), Some("#secretname#sharename##ns"));
    }

    // Upstream PV error cases ("empty volume", "no azure file volume", "return error if secret
    // namespace could not be found"), plus an empty source namespace, which the claim's does
    // not replace.
    #[test]
    fn pv_refusals() {
        let empty = crate::translate_in_tree_pv_to_csi(&pv(json!({"metadata": {"name": "p"}})));
        assert!(matches!(empty, Err(TranslateError::NoPluginForPv { .. })), "{empty:?}");
        let source = json!({"shareName": "sharename", "secretName": "secretname", "readOnly": true});
        let cases = [
            ("no namespace anywhere", pv(file_pv(json!({ANN_RESOURCE_GROUP: "rg"}), source.clone(), None))),
            ("claim without namespace", pv(file_pv(json!(null), source.clone(), Some("")))),
            ("empty source namespace", {
                let mut s = source.clone();
                s["secretNamespace"] = json!("");
                pv(file_pv(json!(null), s, Some("claimns")))
            }),
        ];
        for (name, input) in cases {
            assert_refused(name, crate::translate_in_tree_pv_to_csi(&input), "\"uuid\"");
        }
    }

    fn reverse_pv(annotations: serde_json::Value, source: serde_json::Value) -> serde_json::Value {
        json!({"metadata": {"name": "file.csi.azure.com-sharename", "annotations": annotations}, "spec": {"azureFile": source}})
    }

    fn csi_input(csi: serde_json::Value) -> serde_json::Value {
        json!({"metadata": {"name": "file.csi.azure.com-sharename"}, "spec": {"csi": csi}})
    }

    // Upstream TestTranslateCSIPVToInTree (its successful cases), plus camel-case and duplicate
    // attribute keys, an empty secret reference name and an existing resource group annotation.
    #[test]
    fn csi_pv_to_in_tree() {
        let driver = "file.csi.azure.com";
        let handle = "rg#st#pvc-file-dynamic#diskname.vhd";
        let cases = [
            (
                "resource group empty",
                json!({"spec": {"csi": {
                    "driver": driver,
                    "nodeStageSecretRef": {"name": "ut", "namespace": "secretnamespace"},
                    "readOnly": true,
                    "volumeAttributes": {"shareName": "unit-test"},
                    "volumeHandle": ""
                }}}),
                json!({"metadata": {"annotations": {}}, "spec": {"azureFile": {
                    "secretName": "ut", "secretNamespace": "secretnamespace", "readOnly": true, "shareName": "unit-test"
                }}}),
            ),
            (
                "translate from volume handle",
                csi_input(json!({"driver": driver, "volumeHandle": handle, "readOnly": true})),
                reverse_pv(
                    json!({ANN_RESOURCE_GROUP: "rg"}),
                    json!({"secretName": "azure-storage-account-st-secret", "shareName": "pvc-file-dynamic", "secretNamespace": "default", "readOnly": true}),
                ),
            ),
            (
                "translate from VolumeAttributes",
                csi_input(json!({
                    "driver": driver, "volumeHandle": handle, "readOnly": true,
                    "volumeAttributes": {"shareName": "sharename", "secretName": "secretname", "secretNamespace": "secretnamespace"}
                })),
                reverse_pv(
                    json!({}),
                    json!({"secretName": "secretname", "shareName": "sharename", "secretNamespace": "secretnamespace", "readOnly": true}),
                ),
            ),
            (
                "translate from SecretRef",
                csi_input(json!({
                    "driver": driver, "volumeHandle": handle, "readOnly": true,
                    "volumeAttributes": {"sharename": "sharename", "secretname": "ignored", "secretnamespace": "ignored"},
                    "nodeStageSecretRef": {"name": "secretname", "namespace": "secretnamespace"}
                })),
                reverse_pv(
                    json!({}),
                    json!({"secretName": "secretname", "shareName": "sharename", "secretNamespace": "secretnamespace", "readOnly": true}),
                ),
            ),
            (
                "secret from the handle, share and namespace from attributes, rg annotation overwritten",
                json!({
                    "metadata": {"annotations": {ANN_RESOURCE_GROUP: "old", "keep": "me"}},
                    "spec": {"csi": {
                        "driver": driver, "volumeHandle": "newrg#acct#share-in-handle",
                        "volumeAttributes": {"SHARENAME": "share", "SecretNamespace": "", "other": "x"},
                        "nodeStageSecretRef": {"name": "", "namespace": "ignored"}
                    }}
                }),
                json!({
                    "metadata": {"annotations": {ANN_RESOURCE_GROUP: "newrg", "keep": "me"}},
                    "spec": {"azureFile": {"secretName": "azure-storage-account-acct-secret", "shareName": "share", "secretNamespace": ""}}
                }),
            ),
            (
                "secret reference without namespace, empty rg in the handle",
                csi_input(json!({
                    "driver": driver, "volumeHandle": "#acct#share",
                    "nodeStageSecretRef": {"name": "s"}
                })),
                reverse_pv(
                    json!({}),
                    json!({"secretName": "s", "shareName": "share", "secretNamespace": ""}),
                ),
            ),
            (
                "two spellings of one key: the last in key order wins",
                csi_input(json!({
                    "driver": driver, "volumeHandle": "x",
                    "volumeAttributes": {"ShareName": "first", "shareName": "second", "secretName": "s"}
                })),
                reverse_pv(
                    json!({}),
                    json!({"secretName": "s", "shareName": "second", "secretNamespace": "default"}),
                ),
            ),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_csi_pv_to_in_tree(&pv(input));
            assert_same(name, &got.expect(name), &pv(want));
        }
    }

    // Upstream "translate from volume handle error" (a share name but no secret, and a handle
    // with fewer than two '#'), plus the same with nothing set at all.
    #[test]
    fn csi_pv_with_a_malformed_handle_is_refused() {
        let cases = [
            json!({"driver": "file.csi.azure.com", "volumeHandle": "unit-test", "readOnly": true, "volumeAttributes": {"shareName": "unit-test"}}),
            json!({"driver": "file.csi.azure.com", "volumeHandle": "rg#acct"}),
        ];
        for source in cases {
            let handle = source["volumeHandle"].as_str().unwrap_or_default().to_string();
            let input = pv(json!({"spec": {"csi": source}}));
            assert_refused(&handle, crate::translate_csi_pv_to_in_tree(&input), &format!("{handle:?}"));
        }
    }

    #[test]
    fn storage_class_is_left_as_it_is() {
        let input = sc(json!({
            "provisioner": "kubernetes.io/azure-file",
            "parameters": {"skuName": "Standard_LRS", "zone": "1"},
            "allowedTopologies": [{"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["1"]}]}]
        }));
        let got = crate::translate_in_tree_storage_class_to_csi("kubernetes.io/azure-file", &input);
        assert_same("identity", &got.expect("identity"), &input);
        let bare = sc(json!({}));
        let got = crate::translate_in_tree_storage_class_to_csi("kubernetes.io/azure-file", &bare);
        assert_same("bare", &got.expect("bare"), &bare);
    }

    // Upstream TestTranslateInTreeInlineVolumeToCSINameUniqueness, for this driver.
    #[test]
    fn inline_pv_names_differ_per_share() {
        let name = |share: &str| {
            let input = vol(json!({"name": "", "azureFile": {"secretName": "s", "shareName": share}}));
            crate::translate_in_tree_inline_volume_to_csi(&input, "").expect(share).metadata.name
        };
        assert_ne!(name("share-1"), name("share-2"));
    }

    // Round trip in the spirit of upstream TestTranslationStability: all comes back, and the
    // annotations come back initialised.
    #[test]
    fn pv_survives_a_round_trip() {
        let original = pv(file_pv(
            json!(null),
            json!({"shareName": "s", "secretName": "azure-storage-account-acct-secret", "secretNamespace": "ns", "readOnly": true}),
            None,
        ));
        let csi = crate::translate_in_tree_pv_to_csi(&original).expect("to csi");
        let back = crate::translate_csi_pv_to_in_tree(&csi).expect("back");
        let mut want = original;
        want.metadata.annotations = Some(BTreeMap::new());
        assert_same("round trip", &back, &want);
    }
}
