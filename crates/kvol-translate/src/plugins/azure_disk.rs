//! Azure Disk: `kubernetes.io/azure-disk` ⇄ `disk.csi.azure.com`, as upstream's `azure_disk.go`.
//!
//! Only managed disks migrate. PVs keep their topology and access modes; StorageClass zones
//! become allowed topologies, where the numeric "fault domain" zones of regions without
//! availability zones turn into the driver's empty zone.
//!
//! Go's non-pointer `string` and `bool` fields map to `Option`s here; their zero value (`""`,
//! `false`) is written as `None`, which is how a Go object reads back after its JSON round trip.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AzureDiskVolumeSource, CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec,
    TopologySelectorTerm, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_api::MigratablePlugin;

use super::Translator;
use crate::go::{key_is, zero_bool, zero_string};
use crate::topology::{topology_selector, translate_allowed_topologies};
use crate::{Result, TranslateError};

pub(crate) struct AzureDisk;

const PLUGIN: MigratablePlugin = MigratablePlugin::AzureDisk;
const DRIVER: &str = PLUGIN.csi_driver();
/// Zone key of the CSI driver's topology.
const TOPOLOGY_KEY: &str = "topology.disk.csi.azure.com/zone";
/// The only disk kind that migrates (compared case-insensitively), and the kind written back.
const MANAGED: &str = "Managed";

// Volume attribute keys of the CSI driver; read back case-insensitively.
const ATTR_KIND: &str = "kind";
const ATTR_CACHING_MODE: &str = "cachingmode";
const ATTR_FS_TYPE: &str = "fstype";

/// Upstream's pattern for a managed disk URI, matched unanchored; `.` is any character but `\n`.
const MANAGED_DISK_PATTERN: &str =
    r".*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)";
/// Upstream's pattern for a blob-backed (unmanaged) disk URI, matched unanchored.
const UNMANAGED_DISK_PATTERN: &str = r"http(?:.*)://(?:.*)/vhds/(.+)";

/// The position just past the first `needle` in `hay` at or after `from`.
fn end_of_first(hay: &str, needle: &str, from: usize) -> Option<usize> {
    hay.get(from..)?.find(needle).map(|at| from + at + needle.len())
}

/// What [`MANAGED_DISK_PATTERN`]'s group captures, without a regex engine (which costs microseconds).
///
/// A match cannot cross a line, and the leading `.*` lets it start at any line's start, so the
/// first line holding the literals in order wins. Within it, the greedy `.*`s put the capture
/// after the *last* `/providers/Microsoft?Compute/disks/` that still leaves a character and
/// follows the first `/subscriptions/` … `/resourceGroups/` pair.
fn managed_disk_name(uri: &str) -> Option<&str> {
    const PROVIDER: &str = "/providers/Microsoft";
    const DISKS: &str = "Compute/disks/";
    uri.split('\n').find_map(|line| {
        let after_rg = end_of_first(line, "/resourceGroups/", end_of_first(line, "/subscriptions/", 0)?)?;
        let mut name = None;
        for (at, _) in line.match_indices(PROVIDER).filter(|(at, _)| *at >= after_rg) {
            // `Microsoft.Compute`: the dot is any one character.
            let Some(rest) = line.get(at + PROVIDER.len()..) else { continue };
            let Some(dot) = rest.chars().next() else { continue };
            let Some(tail) = rest.get(dot.len_utf8()..).and_then(|t| t.strip_prefix(DISKS)) else { continue };
            if !tail.is_empty() {
                name = Some(tail);
            }
        }
        name
    })
}

/// What [`UNMANAGED_DISK_PATTERN`]'s group captures, without a regex engine: from the first
/// `http` that has `://` and then `/vhds/` plus a character after it on its line, the rest of
/// the line after the last such `/vhds/`.
fn unmanaged_disk_name(uri: &str) -> Option<&str> {
    uri.match_indices("http").find_map(|(at, _)| {
        let line = uri.get(at..)?.split('\n').next()?;
        let after_scheme = end_of_first(line, "://", 4)?;
        // The last `/vhds/` that ends before the line's last character.
        let last_char = line.char_indices().next_back().map_or(0, |(at, _)| at);
        let at_vhds = line.get(..last_char)?.rfind("/vhds/").filter(|v| *v >= after_scheme)?;
        line.get(at_vhds + "/vhds/".len()..)
    })
}

/// Refuses every kind but Managed; an absent kind means Managed.
fn check_kind(kind: Option<&str>) -> Result<()> {
    match kind {
        Some(kind) if !kind.eq_ignore_ascii_case(MANAGED) => Err(TranslateError::plugin(
            PLUGIN,
            format!("disk kind {kind:?} is not supported in csi migration: only {MANAGED} disks migrate"),
        )),
        _ => Ok(()),
    }
}

/// Whether a disk URI names a managed disk: anything that does not start with `http`
/// (any case) and is longer than those four letters.
fn is_managed_disk(uri: &str) -> bool {
    !(uri.len() > 4 && uri.as_bytes().get(..4).is_some_and(|p| p.eq_ignore_ascii_case(b"http")))
}

/// The disk name at the end of a managed or unmanaged disk URI.
fn disk_name(uri: &str) -> Result<&str> {
    let (name, pattern) = if is_managed_disk(uri) {
        (managed_disk_name(uri), MANAGED_DISK_PATTERN)
    } else {
        (unmanaged_disk_name(uri), UNMANAGED_DISK_PATTERN)
    };
    name.ok_or_else(|| {
        TranslateError::plugin(
            PLUGIN,
            format!("invalid volume handle {uri:?}: want a disk URI matching {pattern}"),
        )
    })
}

/// The CSI source shared by PV and inline translation. The caller picks the caching mode, as
/// the two differ on an empty one.
fn csi_source(
    disk_uri: String,
    fs_type: Option<String>,
    read_only: Option<bool>,
    caching_mode: Option<String>,
) -> CSIPersistentVolumeSource {
    let mut attributes = BTreeMap::new();
    attributes.insert(ATTR_KIND.to_string(), MANAGED.to_string());
    if let Some(mode) = caching_mode {
        attributes.insert(ATTR_CACHING_MODE.to_string(), mode);
    }
    let fs_type = fs_type.and_then(|fs| {
        let csi_fs_type = zero_string(Some(fs.clone()));
        attributes.insert(ATTR_FS_TYPE.to_string(), fs);
        csi_fs_type
    });
    CSIPersistentVolumeSource {
        driver: DRIVER.to_string(),
        volume_handle: disk_uri,
        fs_type,
        read_only: zero_bool(read_only),
        volume_attributes: Some(attributes),
        ..Default::default()
    }
}

/// Whether a zone value is one of the numeric fault domains ("0", "1", ...) that in-tree Azure
/// reports in regions without availability zones.
fn is_fault_domain(zone: &str) -> bool {
    !zone.is_empty() && zone.bytes().all(|b| b.is_ascii_digit())
}

/// Replaces fault-domain values of the CSI zone key by "", the driver's non-zonal zone.
fn clear_fault_domains(terms: &mut [TopologySelectorTerm]) {
    let requirements = terms.iter_mut().flat_map(|t| t.match_label_expressions.iter_mut().flatten());
    for req in requirements.filter(|r| r.key == TOPOLOGY_KEY) {
        for value in req.values.iter_mut().filter(|v| is_fault_domain(v)) {
            value.clear();
        }
    }
}

impl Translator for AzureDisk {
    fn storage_class_to_csi(&self, mut sc: StorageClass) -> Result<StorageClass> {
        let mut zones: Option<Vec<String>> = None;
        let mut params = BTreeMap::new();
        // With both `zone` and `zones` (in any case) upstream keeps whichever Go's random map
        // order visits last; here the last in key order wins.
        for (key, value) in sc.parameters.take().into_iter().flatten() {
            if key_is(&key, "zone") {
                zones = Some(vec![value]);
            } else if key_is(&key, "zones") {
                zones = Some(value.split(',').map(str::to_string).collect());
            } else {
                params.insert(key, value);
            }
        }
        let has_topologies = sc.allowed_topologies.as_ref().is_some_and(|t| !t.is_empty());
        match zones {
            Some(_) if has_topologies => {
                return Err(TranslateError::plugin(
                    PLUGIN,
                    format!(
                        "storage class {:?}: cannot set both allowed topologies and zone/zones parameters",
                        sc.metadata.name.as_deref().unwrap_or_default()
                    ),
                ));
            }
            Some(zones) => sc.allowed_topologies = Some(topology_selector(TOPOLOGY_KEY, zones)),
            None if has_topologies => {
                let terms = sc.allowed_topologies.as_deref().unwrap_or_default();
                sc.allowed_topologies = Some(translate_allowed_topologies(terms, TOPOLOGY_KEY));
            }
            None => {}
        }
        if let Some(terms) = &mut sc.allowed_topologies {
            clear_fault_domains(terms);
        }
        sc.parameters = Some(params);
        Ok(sc)
    }

    fn inline_to_csi(&self, vol: &Volume, _pod_namespace: &str) -> Result<PersistentVolume> {
        let src = vol.azure_disk.as_ref().ok_or_else(|| {
            TranslateError::plugin(PLUGIN, format!("inline volume {:?} has no azureDisk source", vol.name))
        })?;
        check_kind(src.kind.as_deref())?;
        // Inline, an empty caching mode is left out; on a PV it is kept.
        let caching_mode = src.caching_mode.clone().filter(|m| !m.is_empty());
        let csi = csi_source(src.disk_uri.clone(), src.fs_type.clone(), src.read_only, caching_mode);
        Ok(PersistentVolume {
            // The disk URI is unique per disk, as the staging path needs.
            metadata: ObjectMeta { name: zero_string(Some(csi.volume_handle.clone())), ..Default::default() },
            spec: Some(PersistentVolumeSpec {
                csi: Some(csi),
                access_modes: Some(vec!["ReadWriteOnce".to_string()]),
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
        let Some(src) = spec.azure_disk.take() else {
            return Err(TranslateError::plugin(
                PLUGIN,
                format!("persistent volume {name:?} has no azureDisk source"),
            ));
        };
        check_kind(src.kind.as_deref())?;
        spec.csi = Some(csi_source(src.disk_uri, src.fs_type, src.read_only, src.caching_mode));
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
        let disk_name = disk_name(&csi.volume_handle)?.to_string();
        let mut caching_mode = None;
        let mut fs_type = csi.fs_type.unwrap_or_default();
        // Keys are matched case-insensitively and empty values ignored; should two spellings of
        // one key both be set, the last in key order wins (upstream: Go's random map order).
        for (key, value) in csi.volume_attributes.into_iter().flatten().filter(|(_, v)| !v.is_empty()) {
            if key.eq_ignore_ascii_case(ATTR_CACHING_MODE) {
                caching_mode = Some(value);
            } else if key.eq_ignore_ascii_case(ATTR_FS_TYPE) {
                fs_type = value;
            }
        }
        spec.azure_disk = Some(AzureDiskVolumeSource {
            caching_mode,
            disk_name,
            disk_uri: csi.volume_handle,
            fs_type: Some(fs_type),
            kind: Some(MANAGED.to_string()),
            read_only: Some(csi.read_only.unwrap_or_default()),
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::plugins::test_support::{assert_same, pv, sc, vol};

    const URI: &str = "/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name";

    /// Asserts a plugin refusal whose message names `needle`.
    #[track_caller]
    fn assert_refused<T: std::fmt::Debug>(case: &str, got: Result<T>, needle: &str) {
        match got {
            Err(TranslateError::Plugin { plugin: PLUGIN, reason }) if reason.contains(needle) => {}
            other => panic!("case {case:?}: want a refusal naming {needle:?}, got {other:?}"),
        }
    }

    // Upstream TestIsManagedDisk, all cases, plus the length boundary.
    #[test]
    fn managed_disk_is_anything_not_starting_with_http() {
        let cases = [
            ("testurl/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name", true),
            ("test.com", true),
            ("HTTP://test.com", false),
            ("http://test.com/vhds/name", false),
            ("http", true),
            ("hTTp:", false),
            ("", true),
            ("ht", true),
        ];
        for (uri, want) in cases {
            assert_eq!(is_managed_disk(uri), want, "{uri:?}");
        }
    }

    // Upstream TestGetDiskName, all cases, plus a few more URIs.
    #[test]
    fn disk_name_comes_from_the_end_of_the_uri() {
        let cases: [(&str, Option<&str>); 9] = [
            (
                "testurl/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name",
                Some("name"),
            ),
            ("testurl/subscriptions/23/providers/Microsoft.Compute/disks/name", None),
            ("http://test.com/vhds/name", Some("name")),
            ("http://test.io/name", None),
            ("https://acct.blob.core.windows.net/vhds/disk.vhd", Some("disk.vhd")),
            // Unmanaged by its prefix, but the pattern wants a lower-case scheme, as upstream's.
            ("HTTPS://acct.blob.core.windows.net/vhds/disk.vhd", None),
            ("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/", None),
            ("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/a/b", Some("a/b")),
            ("", None),
        ];
        for (uri, want) in cases {
            match (disk_name(uri), want) {
                (Ok(got), Some(want)) => assert_eq!(got, want, "{uri:?}"),
                (Err(e), None) => assert!(e.to_string().contains(&format!("{uri:?}")), "{uri:?}: {e}"),
                (got, want) => panic!("{uri:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// Every string of up to `max` tokens, in order.
    pub(super) fn token_strings(tokens: &[&str], max: u32) -> Vec<String> {
        let mut out = vec![String::new()];
        let mut last = vec![String::new()];
        for _ in 0..max {
            last = last.iter().flat_map(|s| tokens.iter().map(move |t| format!("{s}{t}"))).collect();
            out.extend(last.iter().cloned());
        }
        out
    }

    // The hand-written matchers agree with upstream's patterns run by a regex engine.
    #[test]
    fn disk_name_matchers_agree_with_the_upstream_patterns() {
        let managed = regex::Regex::new(MANAGED_DISK_PATTERN).expect("pattern");
        let unmanaged = regex::Regex::new(UNMANAGED_DISK_PATTERN).expect("pattern");
        let capture = |re: &regex::Regex, s: &str| {
            re.captures(s).and_then(|c| c.get(1)).map(|m| m.as_str().to_string())
        };
        let tokens = [
            "/subscriptions/",
            "subscriptions/",
            "/resourceGroups/",
            "resourceGroups/",
            "/providers/Microsoft.Compute/disks/",
            "providers/MicrosoftéCompute/disks/",
            "/providers/Microsoft",
            "Compute/disks/",
            "\n",
            "é",
            "/",
        ];
        let mut checked = 0;
        for s in token_strings(&tokens, 5) {
            assert_eq!(managed_disk_name(&s).map(str::to_string), capture(&managed, &s), "{s:?}");
            checked += 1;
        }
        for s in token_strings(&["http", "://", "/vhds/", "vhds/", "\n", "x", "é", "/", ":"], 6) {
            assert_eq!(unmanaged_disk_name(&s).map(str::to_string), capture(&unmanaged, &s), "{s:?}");
            checked += 1;
        }
        assert!(checked > 100_000, "{checked}");
    }

    // Upstream TestTranslateAzureDiskInTreeInlineVolumeToCSI (called
    // TestTranslateAzureDiskInTreeStorageClassToCSI in older versions); the nil volume case
    // becomes a volume without a source. Plus caching mode, fsType and readOnly cases.
    #[test]
    fn inline_volume_to_csi() {
        let cases = [
            (
                "azure disk volume",
                json!({"name": "v", "azureDisk": {"diskName": "diskname", "diskURI": "datadiskuri"}}),
                json!({
                    "metadata": {"name": "datadiskuri"},
                    "spec": {
                        "csi": {
                            "driver": "disk.csi.azure.com",
                            "volumeHandle": "datadiskuri",
                            "volumeAttributes": {"kind": "Managed"}
                        },
                        "accessModes": ["ReadWriteOnce"],
                        "volumeMode": "Filesystem"
                    }
                }),
            ),
            (
                "empty caching mode is left out, lower-case kind accepted",
                json!({"name": "v", "azureDisk": {
                    "diskName": "d", "diskURI": URI, "cachingMode": "", "kind": "managed",
                    "fsType": "ext4", "readOnly": true
                }}),
                json!({
                    "metadata": {"name": URI},
                    "spec": {
                        "csi": {
                            "driver": "disk.csi.azure.com",
                            "volumeHandle": URI,
                            "fsType": "ext4",
                            "readOnly": true,
                            "volumeAttributes": {"kind": "Managed", "fstype": "ext4"}
                        },
                        "accessModes": ["ReadWriteOnce"],
                        "volumeMode": "Filesystem"
                    }
                }),
            ),
            (
                "caching mode kept, empty fsType only as attribute, readOnly false dropped",
                json!({"name": "v", "azureDisk": {
                    "diskName": "d", "diskURI": URI, "cachingMode": "ReadOnly", "fsType": "", "readOnly": false
                }}),
                json!({
                    "metadata": {"name": URI},
                    "spec": {
                        "csi": {
                            "driver": "disk.csi.azure.com",
                            "volumeHandle": URI,
                            "volumeAttributes": {"kind": "Managed", "cachingmode": "ReadOnly", "fstype": ""}
                        },
                        "accessModes": ["ReadWriteOnce"],
                        "volumeMode": "Filesystem"
                    }
                }),
            ),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_in_tree_inline_volume_to_csi(&vol(input), "ns");
            assert_same(name, &got.expect(name), &pv(want));
        }
    }

    // Upstream inline error cases ("empty volume", "no azure disk volume", "azure disk volume
    // with non-managed kind"), plus the other non-managed kind.
    #[test]
    fn inline_volume_refusals() {
        let none = crate::translate_in_tree_inline_volume_to_csi(&vol(json!({"name": "v"})), "");
        assert!(matches!(none, Err(TranslateError::NoPluginForInline { .. })), "{none:?}");
        for kind in ["Dedicated", "Shared"] {
            let input =
                vol(json!({"name": "v", "azureDisk": {"diskName": "d", "diskURI": "u", "kind": kind}}));
            assert_refused(kind, crate::translate_in_tree_inline_volume_to_csi(&input, ""), kind);
        }
    }

    // Upstream TestTranslateAzureDiskInTreePVToCSI ("azure disk volume"), plus the rest of the
    // PV staying as it was and the empty caching mode being kept.
    #[test]
    fn pv_to_csi() {
        let cases = [
            (
                "azure disk volume",
                json!({"spec": {"azureDisk": {
                    "cachingMode": "cachingmode", "diskName": "", "diskURI": URI, "fsType": "fstype", "readOnly": true
                }}}),
                json!({"spec": {"csi": {
                    "driver": "disk.csi.azure.com",
                    "fsType": "fstype",
                    "readOnly": true,
                    "volumeAttributes": {"cachingmode": "cachingmode", "fstype": "fstype", "kind": "Managed"},
                    "volumeHandle": URI
                }}}),
            ),
            (
                "no topology or access mode change, empty caching mode kept, MANAGED accepted",
                json!({
                    "metadata": {"name": "pv1", "labels": {"topology.kubernetes.io/zone": "eastus-1"}},
                    "spec": {
                        "accessModes": ["ReadWriteMany", "ReadOnlyMany"],
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eastus-1"]}
                        ]}]}},
                        "claimRef": {"namespace": "ns", "name": "claim"},
                        "azureDisk": {"cachingMode": "", "diskName": "name", "diskURI": URI, "kind": "MANAGED"}
                    }
                }),
                json!({
                    "metadata": {"name": "pv1", "labels": {"topology.kubernetes.io/zone": "eastus-1"}},
                    "spec": {
                        "accessModes": ["ReadWriteMany", "ReadOnlyMany"],
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eastus-1"]}
                        ]}]}},
                        "claimRef": {"namespace": "ns", "name": "claim"},
                        "csi": {
                            "driver": "disk.csi.azure.com",
                            "volumeAttributes": {"cachingmode": "", "kind": "Managed"},
                            "volumeHandle": URI
                        }
                    }
                }),
            ),
            (
                "bare source",
                json!({"spec": {"azureDisk": {"diskName": "", "diskURI": ""}}}),
                json!({"spec": {"csi": {
                    "driver": "disk.csi.azure.com",
                    "volumeAttributes": {"kind": "Managed"},
                    "volumeHandle": ""
                }}}),
            ),
        ];
        for (name, input, want) in cases {
            let input = pv(input);
            let before = input.clone();
            assert_same(name, &crate::translate_in_tree_pv_to_csi(&input).expect(name), &pv(want));
            assert_same(name, &input, &before);
        }
    }

    // Upstream PV error cases ("empty volume", "no azure disk volume", "azure disk volume with
    // non-managed kind").
    #[test]
    fn pv_refusals() {
        let empty = crate::translate_in_tree_pv_to_csi(&pv(json!({"metadata": {"name": "p"}})));
        assert!(matches!(empty, Err(TranslateError::NoPluginForPv { .. })), "{empty:?}");
        let input = pv(json!({"spec": {"azureDisk": {
            "cachingMode": "cachingmode", "diskName": "", "diskURI": URI, "fsType": "fstype",
            "readOnly": true, "kind": "Dedicated"
        }}}));
        assert_refused("dedicated", crate::translate_in_tree_pv_to_csi(&input), "Dedicated");
    }

    // Upstream TestTranslateTranslateCSIPVToInTree plus the reference's camel-case attribute
    // example, an unmanaged URI, empty attributes and absent CSI fields.
    #[test]
    fn csi_pv_to_in_tree() {
        let cases = [
            (
                "azure disk volume",
                json!({"spec": {"csi": {
                    "driver": "disk.csi.azure.com", "fsType": "fstype", "readOnly": true,
                    "volumeAttributes": {"cachingmode": "cachingmode", "fstype": "fstype", "kind": "managed"},
                    "volumeHandle": URI
                }}}),
                json!({"spec": {"azureDisk": {
                    "cachingMode": "cachingmode", "diskURI": URI, "fsType": "fstype", "readOnly": true,
                    "kind": "Managed", "diskName": "name"
                }}}),
            ),
            (
                "attribute keys in any case; attribute fsType wins over the CSI one",
                json!({"metadata": {"name": "p"}, "spec": {"csi": {
                    "driver": "disk.csi.azure.com", "fsType": "ext4",
                    "volumeAttributes": {"cachingMode": "None", "fsType": "xfs", "kind": "Dedicated"},
                    "volumeHandle": URI
                }}}),
                json!({"metadata": {"name": "p"}, "spec": {"azureDisk": {
                    "cachingMode": "None", "diskURI": URI, "fsType": "xfs", "readOnly": false,
                    "kind": "Managed", "diskName": "name"
                }}}),
            ),
            (
                "unmanaged disk, empty attributes ignored, absent fsType and readOnly made explicit",
                json!({"spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "csi": {
                        "driver": "disk.csi.azure.com",
                        "volumeAttributes": {"cachingmode": "", "fstype": ""},
                        "volumeHandle": "https://acct.blob.core.windows.net/vhds/disk.vhd"
                    }
                }}),
                json!({"spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "azureDisk": {
                        "diskURI": "https://acct.blob.core.windows.net/vhds/disk.vhd", "fsType": "",
                        "readOnly": false, "kind": "Managed", "diskName": "disk.vhd"
                    }
                }}),
            ),
            (
                "two spellings of one key: the last in key order wins",
                json!({"spec": {"csi": {
                    "driver": "disk.csi.azure.com",
                    "volumeAttributes": {"CACHINGMODE": "ReadWrite", "cachingMode": "None"},
                    "volumeHandle": URI
                }}}),
                json!({"spec": {"azureDisk": {
                    "cachingMode": "None", "diskURI": URI, "fsType": "", "readOnly": false,
                    "kind": "Managed", "diskName": "name"
                }}}),
            ),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_csi_pv_to_in_tree(&pv(input));
            assert_same(name, &got.expect(name), &pv(want));
        }
    }

    #[test]
    fn csi_pv_with_a_malformed_handle_is_refused() {
        for handle in
            ["testurl/subscriptions/23/providers/Microsoft.Compute/disks/name", "http://test.io/name", ""]
        {
            let input =
                pv(json!({"spec": {"csi": {"driver": "disk.csi.azure.com", "volumeHandle": handle}}}));
            assert_refused(handle, crate::translate_csi_pv_to_in_tree(&input), &format!("{handle:?}"));
        }
    }

    fn terms(key: &str, values: &[&str]) -> serde_json::Value {
        json!([{"matchLabelExpressions": [{"key": key, "values": values}]}])
    }

    // Upstream TestTranslateInTreeStorageClassToCSI (all 11 cases), then kvol's own.
    #[test]
    fn storage_class_to_csi() {
        let csi = TOPOLOGY_KEY;
        let ga = "topology.kubernetes.io/zone";
        let beta = "failure-domain.beta.kubernetes.io/zone";
        let cases = [
            ("nothing special", json!({"parameters": {"foo": "bar"}}), json!({"parameters": {"foo": "bar"}})),
            ("empty params", json!({"parameters": {}}), json!({"parameters": {}})),
            (
                "zone",
                json!({"parameters": {"zone": "foo"}}),
                json!({"parameters": {}, "allowedTopologies": terms(csi, &["foo"])}),
            ),
            (
                "zones",
                json!({"parameters": {"zones": "foo,bar,baz"}}),
                json!({"parameters": {}, "allowedTopologies": terms(csi, &["foo", "bar", "baz"])}),
            ),
            (
                "some normal topology",
                json!({"parameters": {}, "allowedTopologies": terms(csi, &["foo"])}),
                json!({"parameters": {}, "allowedTopologies": terms(csi, &["foo"])}),
            ),
            (
                "some translated topology",
                json!({"parameters": {}, "allowedTopologies": terms(ga, &["foo"])}),
                json!({"parameters": {}, "allowedTopologies": terms(csi, &["foo"])}),
            ),
            (
                "some translated topology with beta labels",
                json!({"parameters": {}, "allowedTopologies": terms(beta, &["foo"])}),
                json!({"parameters": {}, "allowedTopologies": terms(csi, &["foo"])}),
            ),
            (
                "topology in regions without zones",
                json!({"parameters": {}, "allowedTopologies": terms(ga, &["0"])}),
                json!({"parameters": {}, "allowedTopologies": terms(csi, &[""])}),
            ),
            (
                "longer topology in regions without zones",
                json!({"parameters": {}, "allowedTopologies": terms(ga, &["1234"])}),
                json!({"parameters": {}, "allowedTopologies": terms(csi, &[""])}),
            ),
            (
                "topology in regions with zones",
                json!({"parameters": {}, "allowedTopologies": terms(ga, &["centralus-1"])}),
                json!({"parameters": {}, "allowedTopologies": terms(csi, &["centralus-1"])}),
            ),
            // kvol's own cases from here.
            ("absent parameters become empty ones", json!({}), json!({"parameters": {}})),
            (
                "keys matched in any case, others keep theirs, fstype untouched",
                json!({"provisioner": "kubernetes.io/azure-disk", "parameters": {"ZONES": "1,eastus-2,", "FsType": "xfs", "skuName": "Premium_LRS"}}),
                json!({
                    "provisioner": "kubernetes.io/azure-disk",
                    "parameters": {"FsType": "xfs", "skuName": "Premium_LRS"},
                    "allowedTopologies": terms(csi, &["", "eastus-2", ""])
                }),
            ),
            (
                "zone and zones: the last in key order wins",
                json!({"parameters": {"zone": "a", "zones": "b,c"}}),
                json!({"parameters": {}, "allowedTopologies": terms(csi, &["b", "c"])}),
            ),
            (
                "numeric values on other keys and mixed values kept",
                json!({"parameters": {}, "allowedTopologies": [
                    {"matchLabelExpressions": [
                        {"key": "topology.kubernetes.io/region", "values": ["1"]},
                        {"key": ga, "values": ["2", "a1", "-1", " 1"]}
                    ]},
                    {}
                ]}),
                json!({"parameters": {}, "allowedTopologies": [
                    {"matchLabelExpressions": [
                        {"key": "topology.kubernetes.io/region", "values": ["1"]},
                        {"key": csi, "values": ["", "a1", "-1", " 1"]}
                    ]},
                    {}
                ]}),
            ),
            (
                "empty allowed topologies stay empty",
                json!({"parameters": {"a": "b"}, "allowedTopologies": []}),
                json!({"parameters": {"a": "b"}, "allowedTopologies": []}),
            ),
        ];
        for (name, input, want) in cases {
            let input = sc(input);
            let got = crate::translate_in_tree_storage_class_to_csi("kubernetes.io/azure-disk", &input);
            assert_same(name, &got.expect(name), &sc(want));
        }
    }

    // Upstream "zone and topology", and the same with zones.
    #[test]
    fn storage_class_with_zones_and_topologies_is_refused() {
        for params in [json!({"zone": "foo"}), json!({"Zones": "foo,bar"})] {
            let input = sc(json!({
                "metadata": {"name": "fast"},
                "parameters": params,
                "allowedTopologies": terms(TOPOLOGY_KEY, &["foo"])
            }));
            let got = crate::translate_in_tree_storage_class_to_csi("kubernetes.io/azure-disk", &input);
            assert_refused("zone and topology", got, "\"fast\"");
        }
    }

    // Upstream TestTranslateInTreeInlineVolumeToCSINameUniqueness, for this driver.
    #[test]
    fn inline_pv_names_differ_per_disk() {
        let name = |uri: &str| {
            let input = vol(json!({"name": "same", "azureDisk": {"diskName": "same", "diskURI": uri}}));
            crate::translate_in_tree_inline_volume_to_csi(&input, "").expect(uri).metadata.name
        };
        assert_ne!(name("uri-1"), name("uri-2"));
    }

    // Round trip in the spirit of upstream TestTranslationStability.
    #[test]
    fn managed_pv_survives_a_round_trip() {
        let original = pv(json!({"metadata": {"name": "p"}, "spec": {"azureDisk": {
            "cachingMode": "ReadOnly", "diskName": "name", "diskURI": URI, "fsType": "ext4",
            "kind": "Managed", "readOnly": true
        }}}));
        let csi = crate::translate_in_tree_pv_to_csi(&original).expect("to csi");
        let back = crate::translate_csi_pv_to_in_tree(&csi).expect("back");
        assert_same("round trip", &back, &original);
    }
}
