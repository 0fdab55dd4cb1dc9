//! GCE PD: `kubernetes.io/gce-pd` specs to `pd.csi.storage.gke.io` and back, as upstream translates them.
//!
//! Go has no "unset" for plain bools, strings and ints: a zero value there is what the API omits.
//! So a source field this module builds from such a Go field is `None` when Go would hold zero
//! (`readOnly: false`, `fsType: ""`, `partition: 0`), exactly what upstream's output reads back as.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, GCEPersistentDiskVolumeSource, PersistentVolume, PersistentVolumeSpec, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_api::MigratablePlugin;
use kvol_api::keys::{
    LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_MULTI_ZONE_DELIMITER, LABEL_TOPOLOGY_ZONE, PARAM_CSI_FSTYPE,
};

use super::Translator;
use crate::go::{go_ascii_lower, zero_bool, zero_string};
use crate::topology::{
    topology_selector, translate_allowed_topologies, translate_topology_csi_to_in_tree,
    translate_topology_in_tree_to_csi,
};
use crate::{Result, TranslateError};

pub(crate) struct GcePd;

const PLUGIN: MigratablePlugin = MigratablePlugin::GcePd;
const DRIVER: &str = PLUGIN.csi_driver();
/// The zone topology key of the GCE PD CSI driver.
const TOPOLOGY_KEY: &str = "topology.gke.io/zone";
/// Stands for a project, zone or region the handle does not know.
const UNSPECIFIED: &str = "UNSPECIFIED";
const PARTITION: &str = "partition";
const RWO: &str = "ReadWriteOnce";
const ROX: &str = "ReadOnlyMany";
const RWX: &str = "ReadWriteMany";
const HANDLE_FORMAT: &str =
    "projects/{project}/zones/{zone}/disks/{name} or projects/{project}/regions/{region}/disks/{name}";

fn refuse(reason: String) -> TranslateError {
    TranslateError::plugin(PLUGIN, reason)
}

fn name_of(pv: &PersistentVolume) -> &str {
    pv.metadata.name.as_deref().unwrap_or_default()
}

/// `projects/{project}/{kind}/{location}/disks/{disk}`.
fn volume_handle(project: &str, kind: &str, location: &str, disk: &str) -> String {
    ["projects/", project, "/", kind, "/", location, "/disks/", disk].concat()
}

/// The first six `/`-separated parts; a handle or node ID with fewer is malformed.
fn first_six(id: &str) -> Option<[&str; 6]> {
    let mut parts = id.split('/');
    let mut six = [""; 6];
    for slot in &mut six {
        *slot = parts.next()?;
    }
    Some(six)
}

/// The region of a `{locale}-{region}-{zone}` zone (exactly three dash-separated parts).
fn zone_region(zone: &str) -> Option<&str> {
    let (region, _) = zone.rsplit_once('-')?;
    (region.bytes().filter(|&b| b == b'-').count() == 1).then_some(region)
}

/// The one region all `zones` lie in. Every zone must be well-formed, and there must be at least one.
fn region_from_zones<'a>(zones: impl IntoIterator<Item = &'a str>) -> Result<&'a str, String> {
    let mut region: Option<&str> = None;
    let mut other: Option<&str> = None;
    for zone in zones {
        let this = zone_region(zone)
            .ok_or_else(|| format!("zone {zone:?} is not of the form {{locale}}-{{region}}-{{zone}}"))?;
        match region {
            None => region = Some(this),
            Some(first) if first != this => other = Some(this),
            Some(_) => {}
        }
    }
    match (region, other) {
        (Some(region), None) => Ok(region),
        (Some(first), Some(second)) => {
            Err(format!("zones lie in more than one region ({first:?} and {second:?})"))
        }
        (None, _) => Err("no zones given".to_string()),
    }
}

/// The GCE region parser for topology translation back to in-tree.
fn gce_region(zones: &[String]) -> Result<String, String> {
    region_from_zones(zones.iter().map(String::as_str)).map(str::to_string)
}

/// The `partition` volume attribute: `""` for partition 0 (or none).
fn partition_attributes(partition: Option<i32>) -> BTreeMap<String, String> {
    let value = match partition {
        Some(p) if p != 0 => p.to_string(),
        _ => String::new(),
    };
    BTreeMap::from([(PARTITION.to_string(), value)])
}

/// Parses like Go's `strconv.Atoi` (optional sign, decimal digits, 64-bit range), then narrows
/// to 32 bits with wrap-around like Go's `int32(...)` conversion.
fn parse_partition(value: &str) -> Option<i32> {
    value.parse::<i64>().ok().map(|n| n as i32)
}

/// The handle of a PV, from its zone *labels* only: the beta label, or the GA one when the
/// beta label is absent or empty; several zones (`__`-separated) make a regional handle.
fn handle_from_labels(pv: &PersistentVolume, pd_name: &str) -> Result<String, String> {
    let label = |key: &str| {
        pv.metadata.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str).unwrap_or_default()
    };
    let mut zones = label(LABEL_FAILURE_DOMAIN_BETA_ZONE);
    if zones.is_empty() {
        zones = label(LABEL_TOPOLOGY_ZONE);
    }
    let mut parts = zones.split(LABEL_MULTI_ZONE_DELIMITER);
    let first = parts.next().unwrap_or_default();
    match parts.next() {
        None if first.is_empty() => Ok(volume_handle(UNSPECIFIED, "zones", UNSPECIFIED, pd_name)),
        None => Ok(volume_handle(UNSPECIFIED, "zones", first, pd_name)),
        Some(second) => {
            let region = region_from_zones([first, second].into_iter().chain(parts))
                .map_err(|e| format!("cannot derive the region of zone label {zones:?}: {e}"))?;
            Ok(volume_handle(UNSPECIFIED, "regions", region, pd_name))
        }
    }
}

/// Upstream's access-mode rewrite for PVs: the CSI driver refuses RWX (which in-tree treated as
/// RWO) and RWO together with ROX. Any RWO or RWX gives `[RWO]`; else ROX gives `[ROX]`; else
/// `[RWO]`. An absent list stays absent.
fn backward_compatible_access_modes(modes: Option<Vec<String>>) -> Option<Vec<String>> {
    let mut modes = modes?;
    let writable = modes.iter().any(|m| m == RWO || m == RWX);
    let read_only = !writable && modes.iter().any(|m| m == ROX);
    let result = if read_only { ROX } else { RWO };
    // Keep an existing string for the result rather than allocating a new one.
    match modes.iter().position(|m| m == result) {
        Some(i) => {
            modes.swap(0, i);
            modes.truncate(1);
        }
        None => {
            modes.clear();
            modes.push(result.to_string());
        }
    }
    Some(modes)
}

impl Translator for GcePd {
    fn storage_class_to_csi(&self, mut sc: StorageClass) -> Result<StorageClass> {
        let mut params = BTreeMap::new();
        let mut generated = None;
        // Upstream ranges over a Go map, so when several keys land on the same result (`fstype`
        // and `FSType`, or `zone` and `zones`) a random one wins; here the last in key order wins.
        for (key, value) in sc.parameters.take().into_iter().flatten() {
            let mut buf = [0; 6];
            match go_ascii_lower(&key, &mut buf) {
                Some("fstype") => {
                    params.insert(PARAM_CSI_FSTYPE.to_string(), value);
                }
                Some("zone") => generated = Some(topology_selector(TOPOLOGY_KEY, vec![value])),
                Some("zones") => {
                    let zones = value.split(',').map(str::to_string).collect();
                    generated = Some(topology_selector(TOPOLOGY_KEY, zones));
                }
                _ => {
                    params.insert(key, value);
                }
            }
        }
        let has_allowed = sc.allowed_topologies.as_ref().is_some_and(|t| !t.is_empty());
        match generated {
            Some(_) if has_allowed => {
                return Err(refuse(format!(
                    "storage class {:?} sets both allowedTopologies and the zone/zones parameters",
                    sc.metadata.name.as_deref().unwrap_or_default()
                )));
            }
            Some(terms) => sc.allowed_topologies = Some(terms),
            None if has_allowed => {
                sc.allowed_topologies =
                    sc.allowed_topologies.as_deref().map(|t| translate_allowed_topologies(t, TOPOLOGY_KEY));
            }
            None => {}
        }
        sc.parameters = Some(params);
        Ok(sc)
    }

    fn inline_to_csi(&self, vol: &Volume, _pod_namespace: &str) -> Result<PersistentVolume> {
        let Some(gce) = vol.gce_persistent_disk.as_ref() else {
            return Err(refuse(format!("inline volume {:?} has no gcePersistentDisk source", vol.name)));
        };
        let read_only = gce.read_only == Some(true);
        Ok(PersistentVolume {
            // The name must be unique per disk: it is the unique part of the staging path.
            metadata: ObjectMeta { name: Some([DRIVER, "-", &gce.pd_name].concat()), ..Default::default() },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.to_string(),
                    volume_handle: volume_handle(UNSPECIFIED, "zones", UNSPECIFIED, &gce.pd_name),
                    read_only: zero_bool(gce.read_only),
                    fs_type: zero_string(gce.fs_type.clone()),
                    volume_attributes: Some(partition_attributes(gce.partition)),
                    ..Default::default()
                }),
                access_modes: Some(vec![if read_only { ROX } else { RWO }.to_string()]),
                volume_mode: Some("Filesystem".to_string()),
                ..Default::default()
            }),
            status: None,
        })
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<()> {
        let Some(gce) = pv.spec.as_mut().and_then(|s| s.gce_persistent_disk.take()) else {
            return Err(refuse(format!(
                "persistent volume {:?} has no gcePersistentDisk source",
                name_of(pv)
            )));
        };
        let handle = handle_from_labels(pv, &gce.pd_name)
            .map_err(|e| refuse(format!("persistent volume {:?}: {e}", name_of(pv))))?;
        translate_topology_in_tree_to_csi(pv, TOPOLOGY_KEY);
        let spec = pv.spec.get_or_insert_with(Default::default);
        spec.csi = Some(CSIPersistentVolumeSource {
            driver: DRIVER.to_string(),
            volume_handle: handle,
            read_only: zero_bool(gce.read_only),
            fs_type: zero_string(gce.fs_type),
            volume_attributes: Some(partition_attributes(gce.partition)),
            ..Default::default()
        });
        spec.access_modes = backward_compatible_access_modes(spec.access_modes.take());
        Ok(())
    }

    fn csi_pv_to_in_tree(&self, pv: &mut PersistentVolume) -> Result<()> {
        let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.take()) else {
            return Err(refuse(format!("persistent volume {:?} has no CSI source", name_of(pv))));
        };
        let Some([.., pd_name]) = first_six(&csi.volume_handle) else {
            return Err(refuse(format!(
                "persistent volume {:?}: invalid volume handle {:?}: want {HANDLE_FORMAT}",
                name_of(pv),
                csi.volume_handle
            )));
        };
        let partition = match csi.volume_attributes.as_ref().and_then(|a| a.get(PARTITION)) {
            Some(p) if !p.is_empty() => Some(parse_partition(p).ok_or_else(|| {
                refuse(format!("persistent volume {:?}: partition {p:?} is not an integer", name_of(pv)))
            })?),
            _ => None,
        };
        let gce = GCEPersistentDiskVolumeSource {
            pd_name: pd_name.to_string(),
            fs_type: zero_string(csi.fs_type),
            partition: partition.filter(|&p| p != 0),
            read_only: zero_bool(csi.read_only),
        };
        translate_topology_csi_to_in_tree(pv, TOPOLOGY_KEY, Some(gce_region))
            .map_err(|e| refuse(format!("persistent volume {:?}: {e}", name_of(pv))))?;
        pv.spec.get_or_insert_with(Default::default).gce_persistent_disk = Some(gce);
        Ok(())
    }

    /// Fills a handle's `UNSPECIFIED` project, zone or region from the node ID
    /// (`projects/{project}/zones/{zone}/instances/{name}`). A handle with a project is complete.
    fn repair_volume_handle(&self, handle: &str, node_id: &str) -> Result<String> {
        let Some([_, project, kind, location, _, disk]) = first_six(handle) else {
            return Err(refuse(format!("invalid volume handle {handle:?}: want {HANDLE_FORMAT}")));
        };
        if project != UNSPECIFIED {
            return Ok(handle.to_string());
        }
        let Some([_, node_project, _, node_zone, ..]) = first_six(node_id) else {
            return Err(refuse(format!(
                "invalid node ID {node_id:?}: want projects/{{project}}/zones/{{zone}}/instances/{{name}}"
            )));
        };
        match kind {
            "zones" => {
                let zone = if location == UNSPECIFIED { node_zone } else { location };
                Ok(volume_handle(node_project, kind, zone, disk))
            }
            "regions" => {
                let region = if location == UNSPECIFIED {
                    region_from_zones([node_zone]).map_err(|e| {
                        refuse(format!("cannot derive a region from node ID {node_id:?}: {e}"))
                    })?
                } else {
                    location
                };
                Ok(volume_handle(node_project, kind, region, disk))
            }
            _ => Err(refuse(format!(
                "invalid volume handle {handle:?}: {kind:?} is neither \"zones\" nor \"regions\""
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::test_support::{affinity, assert_same, pv, sc, vol};
    use kvol_api::keys::LABEL_TOPOLOGY_REGION;
    use serde_json::{Value, json};

    const BETA_ZONE: &str = LABEL_FAILURE_DOMAIN_BETA_ZONE;
    const BETA_REGION: &str = kvol_api::keys::LABEL_FAILURE_DOMAIN_BETA_REGION;
    const GA_ZONE: &str = LABEL_TOPOLOGY_ZONE;
    const GA_REGION: &str = LABEL_TOPOLOGY_REGION;
    const IN_TREE: &str = "kubernetes.io/gce-pd";

    fn sc_of(params: Value, topologies: Value) -> StorageClass {
        sc(json!({"metadata": {"name": "sc"}, "parameters": params, "allowedTopologies": topologies}))
    }

    fn terms(key: &str, values: &[&str]) -> Value {
        json!([{"matchLabelExpressions": [{"key": key, "values": values}]}])
    }

    fn gce_pv(labels: Value, node_affinity: Value) -> PersistentVolume {
        pv(json!({
            "metadata": {"labels": labels},
            "spec": {
                "gcePersistentDisk": {"pdName": "test-disk", "fsType": "ext4"},
                "nodeAffinity": node_affinity,
            },
        }))
    }

    fn in_tree_pv_to_csi(p: &PersistentVolume) -> Result<PersistentVolume> {
        crate::translate_in_tree_pv_to_csi(p)
    }

    // Upstream: TestTranslatePDInTreeStorageClassToCSI (all 8 cases), then kvol's own cases.
    #[test]
    fn storage_class_to_csi() {
        let null = Value::Null;
        let cases: &[(&str, StorageClass, Option<StorageClass>)] = &[
            (
                "nothing special",
                sc_of(json!({"foo": "bar"}), null.clone()),
                Some(sc_of(json!({"foo": "bar"}), null.clone())),
            ),
            (
                "fstype",
                sc_of(json!({"fstype": "myfs"}), null.clone()),
                Some(sc_of(json!({"csi.storage.k8s.io/fstype": "myfs"}), null.clone())),
            ),
            ("empty params", sc_of(json!({}), null.clone()), Some(sc_of(json!({}), null.clone()))),
            (
                "zone",
                sc_of(json!({"zone": "foo"}), null.clone()),
                Some(sc_of(json!({}), terms(TOPOLOGY_KEY, &["foo"]))),
            ),
            (
                "zones",
                sc_of(json!({"zones": "foo,bar,baz"}), null.clone()),
                Some(sc_of(json!({}), terms(TOPOLOGY_KEY, &["foo", "bar", "baz"]))),
            ),
            (
                "some normal topology",
                sc_of(json!({}), terms(TOPOLOGY_KEY, &["foo"])),
                Some(sc_of(json!({}), terms(TOPOLOGY_KEY, &["foo"]))),
            ),
            (
                "some translated topology",
                sc_of(json!({}), terms(BETA_ZONE, &["foo"])),
                Some(sc_of(json!({}), terms(TOPOLOGY_KEY, &["foo"]))),
            ),
            ("zone and topology", sc_of(json!({"zone": "foo"}), terms(TOPOLOGY_KEY, &["foo"])), None),
            // kvol: absent parameters come out as an empty map, as upstream always sets a new map.
            ("absent params", sc_of(null.clone(), null.clone()), Some(sc_of(json!({}), null.clone()))),
            (
                "keys match case-insensitively; others keep their case",
                sc_of(
                    json!({"FsType": "xfs", "ZONES": "a,b", "Replication-Type": "regional-pd"}),
                    null.clone(),
                ),
                Some(sc_of(
                    json!({"csi.storage.k8s.io/fstype": "xfs", "Replication-Type": "regional-pd"}),
                    terms(TOPOLOGY_KEY, &["a", "b"]),
                )),
            ),
            (
                "non-ASCII keys match nothing and are copied as they are",
                sc_of(json!({"\u{212a}ey": "v", "FST\u{130}": "x", "zone\u{212a}": "y"}), null.clone()),
                Some(sc_of(json!({"\u{212a}ey": "v", "FST\u{130}": "x", "zone\u{212a}": "y"}), null.clone())),
            ),
            (
                "zones split on commas without trimming; empty zone kept",
                sc_of(json!({"zones": " a,,b "}), null.clone()),
                Some(sc_of(json!({}), terms(TOPOLOGY_KEY, &[" a", "", "b "]))),
            ),
            (
                "empty zone",
                sc_of(json!({"zone": ""}), null.clone()),
                Some(sc_of(json!({}), terms(TOPOLOGY_KEY, &[""]))),
            ),
            (
                "zone and zones: the later key in order wins",
                sc_of(json!({"zone": "a", "zones": "b,c"}), null.clone()),
                Some(sc_of(json!({}), terms(TOPOLOGY_KEY, &["b", "c"]))),
            ),
            (
                "fstype spellings collide: the later key in order wins",
                sc_of(json!({"FSTYPE": "ext3", "fstype": "ext4"}), null.clone()),
                Some(sc_of(json!({"csi.storage.k8s.io/fstype": "ext4"}), null.clone())),
            ),
            (
                "empty allowed topologies with a zone are no conflict",
                sc_of(json!({"zone": "a"}), json!([])),
                Some(sc_of(json!({}), terms(TOPOLOGY_KEY, &["a"]))),
            ),
            (
                "empty allowed topologies stay empty",
                sc_of(json!({}), json!([])),
                Some(sc_of(json!({}), json!([]))),
            ),
            (
                "GA zone and other keys in allowed topologies",
                sc_of(
                    json!({"type": "pd-ssd"}),
                    json!([{"matchLabelExpressions": [
                        {"key": GA_ZONE, "values": ["z1"]}, {"key": GA_REGION, "values": ["r1"]}]}, {}]),
                ),
                Some(sc_of(
                    json!({"type": "pd-ssd"}),
                    json!([{"matchLabelExpressions": [
                        {"key": TOPOLOGY_KEY, "values": ["z1"]}, {"key": GA_REGION, "values": ["r1"]}]}, {}]),
                )),
            ),
            ("zones and topology", sc_of(json!({"ZONES": "a"}), terms(BETA_ZONE, &["a"])), None),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_in_tree_storage_class_to_csi(IN_TREE, input);
            match want {
                Some(want) => assert_same(name, &got.unwrap_or_else(|e| panic!("{name}: {e}")), want),
                None => {
                    let err = got.expect_err(name).to_string();
                    assert!(err.contains("allowedTopologies") && err.contains("\"sc\""), "{name}: {err}");
                }
            }
        }
    }

    // Upstream: TestRepairVolumeHandle (all 8 cases), then kvol's own cases.
    #[test]
    fn repair_volume_handle() {
        let node = |p: &str, z: &str, n: &str| format!("projects/{p}/zones/{z}/instances/{n}");
        let zonal = |p: &str, z: &str, d: &str| format!("projects/{p}/zones/{z}/disks/{d}");
        let regional = |p: &str, r: &str, d: &str| format!("projects/{p}/regions/{r}/disks/{d}");
        let cases: Vec<(&str, String, String, Option<String>)> = vec![
            (
                "fully specified",
                zonal("foo", "bar", "baz"),
                node("bing", "bada", "boom"),
                Some(zonal("foo", "bar", "baz")),
            ),
            (
                "fully specified (regional)",
                regional("foo", "us-central1-c", "baz"),
                node("bing", "bada", "boom"),
                Some(regional("foo", "us-central1-c", "baz")),
            ),
            (
                "no project",
                zonal(UNSPECIFIED, "bar", "baz"),
                node("bing", "bada", "boom"),
                Some(zonal("bing", "bar", "baz")),
            ),
            (
                "no project or zone",
                zonal(UNSPECIFIED, UNSPECIFIED, "baz"),
                node("bing", "bada", "boom"),
                Some(zonal("bing", "bada", "baz")),
            ),
            (
                "no project or region",
                regional(UNSPECIFIED, UNSPECIFIED, "baz"),
                node("bing", "us-central1-c", "boom"),
                Some(regional("bing", "us-central1", "baz")),
            ),
            (
                "no project (regional)",
                regional(UNSPECIFIED, "us-west1", "baz"),
                node("bing", "us-central1-c", "boom"),
                Some(regional("bing", "us-west1", "baz")),
            ),
            ("invalid handle", "foo".to_string(), node("bing", "us-central1-c", "boom"), None),
            ("invalid node ID", regional(UNSPECIFIED, "us-west1", "baz"), "foo".to_string(), None),
            // kvol's own cases.
            (
                "unknown regionality",
                format!("projects/{UNSPECIFIED}/planets/mars/disks/baz"),
                node("bing", "us-central1-c", "boom"),
                None,
            ),
            (
                "region from a malformed node zone",
                regional(UNSPECIFIED, UNSPECIFIED, "baz"),
                node("bing", "bada", "boom"),
                None,
            ),
            (
                "an invalid node ID does not matter to a complete handle",
                zonal("p", "z", "d"),
                "foo".to_string(),
                Some(zonal("p", "z", "d")),
            ),
            (
                "parts after the disk name are dropped",
                format!("{}/extra", zonal(UNSPECIFIED, "z", "d")),
                format!("{}/extra", node("bing", "bada", "boom")),
                Some(zonal("bing", "z", "d")),
            ),
            ("empty handle", String::new(), node("bing", "bada", "boom"), None),
        ];
        for (name, handle, node_id, want) in cases {
            let got = crate::repair_volume_handle(DRIVER, &handle, &node_id);
            match want {
                Some(want) => assert_eq!(got.as_deref(), Ok(want.as_str()), "{name}"),
                None => assert!(got.is_err(), "{name}: got {got:?}"),
            }
        }
    }

    // Upstream: TestBackwardCompatibleAccessModes (all 7 cases), run through PV translation;
    // then kvol's own cases for absent and empty lists and other modes.
    #[test]
    fn pv_access_modes() {
        let cases: &[(&str, Value, Value)] = &[
            ("ROX", json!([ROX]), json!([ROX])),
            ("RWO", json!([RWO]), json!([RWO])),
            ("RWX", json!([RWX]), json!([RWO])),
            ("RWO, ROX", json!([ROX, RWO]), json!([RWO])),
            ("RWO, RWX", json!([RWO, RWX]), json!([RWO])),
            ("RWX, ROX", json!([RWX, ROX]), json!([RWO])),
            ("RWX, ROX, RWO", json!([RWX, RWO, ROX]), json!([RWO])),
            ("absent stays absent", Value::Null, Value::Null),
            ("empty", json!([]), json!([RWO])),
            ("ReadWriteOncePod", json!(["ReadWriteOncePod"]), json!([RWO])),
            ("ROX and ReadWriteOncePod", json!(["ReadWriteOncePod", ROX]), json!([ROX])),
            ("duplicates", json!([ROX, ROX]), json!([ROX])),
        ];
        for (name, modes, want) in cases {
            let input = pv(json!({"spec": {"gcePersistentDisk": {"pdName": "d"}, "accessModes": modes}}));
            let got = in_tree_pv_to_csi(&input).unwrap_or_else(|e| panic!("{name}: {e}"));
            let want: Option<Vec<String>> = serde_json::from_value(want.clone()).unwrap();
            assert_eq!(got.spec.and_then(|s| s.access_modes), want, "{name}");
        }
    }

    // Upstream: TestInlineReadOnly, then kvol's own full inline cases.
    #[test]
    fn inline_to_csi() {
        let cases: &[(&str, Value, Value)] = &[
            (
                "read-only (TestInlineReadOnly)",
                json!({"name": "v", "gcePersistentDisk": {"pdName": "foo", "readOnly": true}}),
                json!({
                    "metadata": {"name": "pd.csi.storage.gke.io-foo"},
                    "spec": {
                        "csi": {
                            "driver": DRIVER,
                            "volumeHandle": "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/foo",
                            "readOnly": true,
                            "volumeAttributes": {"partition": ""},
                        },
                        "accessModes": [ROX],
                        "volumeMode": "Filesystem",
                    },
                }),
            ),
            (
                "read-write with partition and fsType",
                json!({"name": "v", "gcePersistentDisk": {"pdName": "d1", "fsType": "xfs", "partition": 3, "readOnly": false}}),
                json!({
                    "metadata": {"name": "pd.csi.storage.gke.io-d1"},
                    "spec": {
                        "csi": {
                            "driver": DRIVER,
                            "volumeHandle": "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d1",
                            "fsType": "xfs",
                            "volumeAttributes": {"partition": "3"},
                        },
                        "accessModes": [RWO],
                        "volumeMode": "Filesystem",
                    },
                }),
            ),
            (
                "negative partition and empty fsType",
                json!({"name": "v", "gcePersistentDisk": {"pdName": "d2", "fsType": "", "partition": -1}}),
                json!({
                    "metadata": {"name": "pd.csi.storage.gke.io-d2"},
                    "spec": {
                        "csi": {
                            "driver": DRIVER,
                            "volumeHandle": "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d2",
                            "volumeAttributes": {"partition": "-1"},
                        },
                        "accessModes": [RWO],
                        "volumeMode": "Filesystem",
                    },
                }),
            ),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_in_tree_inline_volume_to_csi(&vol(input.clone()), "ns")
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_same(name, &got, &pv(want.clone()));
        }
    }

    // Upstream: TestTranslateInTreeInlineVolumeToCSINameUniqueness (translate_test.go), GCE PD.
    #[test]
    fn inline_names_are_unique_per_disk() {
        let name = |pd: &str| {
            let v = vol(json!({"name": "same", "gcePersistentDisk": {"pdName": pd}}));
            crate::translate_in_tree_inline_volume_to_csi(&v, "").unwrap().metadata.name
        };
        assert_ne!(name("a1b2"), name("c3d4"));
    }

    // Upstream: TestTranslateInTreePVToCSIVolIDFmt (all 4 cases), then kvol's own cases.
    #[test]
    fn pv_volume_handle_from_labels() {
        let cases: &[(&str, Value, Option<&str>)] = &[
            (
                "beta topology key zonal",
                json!({BETA_ZONE: "us-east1-a"}),
                Some("projects/UNSPECIFIED/zones/us-east1-a/disks/pd-name"),
            ),
            (
                "v1 topology key zonal",
                json!({GA_ZONE: "us-east1-a"}),
                Some("projects/UNSPECIFIED/zones/us-east1-a/disks/pd-name"),
            ),
            (
                "beta topology key regional",
                json!({BETA_ZONE: "us-central1-a__us-central1-c"}),
                Some("projects/UNSPECIFIED/regions/us-central1/disks/pd-name"),
            ),
            (
                "v1 topology key regional",
                json!({GA_ZONE: "us-central1-a__us-central1-c"}),
                Some("projects/UNSPECIFIED/regions/us-central1/disks/pd-name"),
            ),
            // kvol's own cases.
            ("no labels", Value::Null, Some("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/pd-name")),
            (
                "empty zone label",
                json!({GA_ZONE: ""}),
                Some("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/pd-name"),
            ),
            (
                "beta label wins over GA",
                json!({BETA_ZONE: "us-east1-b", GA_ZONE: "us-west1-a"}),
                Some("projects/UNSPECIFIED/zones/us-east1-b/disks/pd-name"),
            ),
            (
                "empty beta label falls back to GA",
                json!({BETA_ZONE: "", GA_ZONE: "us-west1-a"}),
                Some("projects/UNSPECIFIED/zones/us-west1-a/disks/pd-name"),
            ),
            (
                "a single zone is not validated or trimmed",
                json!({GA_ZONE: " not-a-zone-at-all "}),
                Some("projects/UNSPECIFIED/zones/ not-a-zone-at-all /disks/pd-name"),
            ),
            ("zones in two regions", json!({GA_ZONE: "us-central1-a__us-east1-b"}), None),
            ("malformed zone among several", json!({GA_ZONE: "us-central1-a__uscentral1"}), None),
            ("trailing delimiter", json!({GA_ZONE: "us-central1-a__"}), None),
        ];
        for (name, labels, want) in cases {
            let input = pv(json!({
                "metadata": {"name": "pv1", "labels": labels},
                "spec": {"gcePersistentDisk": {"pdName": "pd-name"}},
            }));
            let got = in_tree_pv_to_csi(&input);
            match want {
                Some(want) => {
                    let got = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                    let handle = got.spec.and_then(|s| s.csi).map(|c| c.volume_handle);
                    assert_eq!(handle.as_deref(), Some(*want), "{name}");
                }
                None => {
                    let err = got.expect_err(name).to_string();
                    assert!(err.contains("\"pv1\""), "{name}: {err}");
                }
            }
        }
    }

    // kvol's cases for whole PVs in both directions (reference §4.6.2).
    #[test]
    fn pv_to_csi_whole() {
        let cases: &[(&str, Value, Value)] = &[
            (
                "every field, zone label and beta affinity",
                json!({
                    "metadata": {"name": "pv1", "labels": {BETA_ZONE: "us-central1-a", BETA_REGION: "us-central1"}},
                    "spec": {
                        "gcePersistentDisk": {"pdName": "disk", "fsType": "ext4", "partition": 2, "readOnly": true},
                        "accessModes": [RWX],
                        "capacity": {"storage": "10Gi"},
                        "storageClassName": "standard",
                        "nodeAffinity": affinity(&[&[(BETA_ZONE, &["us-central1-a"]), (BETA_REGION, &["us-central1"])]]),
                    },
                }),
                json!({
                    "metadata": {"name": "pv1", "labels": {BETA_ZONE: "us-central1-a", BETA_REGION: "us-central1"}},
                    "spec": {
                        "csi": {
                            "driver": DRIVER,
                            "volumeHandle": "projects/UNSPECIFIED/zones/us-central1-a/disks/disk",
                            "fsType": "ext4",
                            "readOnly": true,
                            "volumeAttributes": {"partition": "2"},
                        },
                        "accessModes": [RWO],
                        "capacity": {"storage": "10Gi"},
                        "storageClassName": "standard",
                        "nodeAffinity": affinity(&[&[(TOPOLOGY_KEY, &["us-central1-a"]), (GA_REGION, &["us-central1"])]]),
                    },
                }),
            ),
            (
                "zero values come out absent",
                json!({"spec": {"gcePersistentDisk": {"pdName": "disk", "fsType": "", "partition": 0, "readOnly": false}}}),
                json!({"spec": {"csi": {
                    "driver": DRIVER,
                    "volumeHandle": "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk",
                    "volumeAttributes": {"partition": ""},
                }}}),
            ),
            (
                "labelled zones become sorted topology; handle keeps label order",
                json!({
                    "metadata": {"labels": {GA_ZONE: "us-central1-c__us-central1-a"}},
                    "spec": {"gcePersistentDisk": {"pdName": "disk"}},
                }),
                json!({
                    "metadata": {"labels": {GA_ZONE: "us-central1-c__us-central1-a"}},
                    "spec": {
                        "csi": {
                            "driver": DRIVER,
                            "volumeHandle": "projects/UNSPECIFIED/regions/us-central1/disks/disk",
                            "volumeAttributes": {"partition": ""},
                        },
                        "nodeAffinity": affinity(&[&[(TOPOLOGY_KEY, &["us-central1-a", "us-central1-c"])]]),
                    },
                }),
            ),
        ];
        for (name, input, want) in cases {
            let got = in_tree_pv_to_csi(&pv(input.clone())).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_same(name, &got, &pv(want.clone()));
        }
    }

    // kvol's reverse-translation cases (reference §4.6.2), including what upstream rejects.
    #[test]
    fn csi_pv_to_in_tree() {
        let csi = |handle: &str, attrs: Value, na: Value, labels: Value| {
            pv(json!({
                "metadata": {"name": "pv1", "labels": labels},
                "spec": {
                    "csi": {"driver": DRIVER, "volumeHandle": handle, "fsType": "ext4", "readOnly": true, "volumeAttributes": attrs},
                    "accessModes": [RWO],
                    "nodeAffinity": na,
                },
            }))
        };
        let null = Value::Null;
        let handle = "projects/p/zones/us-central1-a/disks/disk";
        let cases: Vec<(&str, PersistentVolume, Option<Value>)> = vec![
            (
                "zone topology gains region; labels added",
                csi(
                    handle,
                    json!({"partition": "2"}),
                    affinity(&[&[(TOPOLOGY_KEY, &["us-central1-a"])]]),
                    null.clone(),
                ),
                Some(json!({
                    "metadata": {"name": "pv1", "labels": {GA_ZONE: "us-central1-a", GA_REGION: "us-central1"}},
                    "spec": {
                        "gcePersistentDisk": {"pdName": "disk", "fsType": "ext4", "partition": 2, "readOnly": true},
                        "accessModes": [RWO],
                        "nodeAffinity": affinity(&[&[(GA_ZONE, &["us-central1-a"]), (GA_REGION, &["us-central1"])]]),
                    },
                })),
            ),
            (
                "beta labels choose beta keys; existing labels kept; zones joined",
                csi(
                    handle,
                    json!({"partition": ""}),
                    affinity(&[&[(TOPOLOGY_KEY, &["us-central1-b", "us-central1-a"])]]),
                    json!({BETA_REGION: "keep", BETA_ZONE: "keep"}),
                ),
                Some(json!({
                    "metadata": {"name": "pv1", "labels": {BETA_REGION: "keep", BETA_ZONE: "keep"}},
                    "spec": {
                        "gcePersistentDisk": {"pdName": "disk", "fsType": "ext4", "readOnly": true},
                        "accessModes": [RWO],
                        "nodeAffinity": affinity(&[&[
                            (BETA_ZONE, &["us-central1-b", "us-central1-a"]),
                            (BETA_REGION, &["us-central1"]),
                        ]]),
                    },
                })),
            ),
            (
                "no affinity, no attributes, short path kept to sixth part",
                csi("a/b/c/d/e/disk/g", null.clone(), null.clone(), null.clone()),
                Some(json!({
                    "metadata": {"name": "pv1"},
                    "spec": {
                        "gcePersistentDisk": {"pdName": "disk", "fsType": "ext4", "readOnly": true},
                        "accessModes": [RWO],
                    },
                })),
            ),
            (
                "partition 0 and signs parse as Go's Atoi",
                csi(handle, json!({"partition": "+0"}), null.clone(), null.clone()),
                Some(json!({
                    "metadata": {"name": "pv1"},
                    "spec": {
                        "gcePersistentDisk": {"pdName": "disk", "fsType": "ext4", "readOnly": true},
                        "accessModes": [RWO],
                    },
                })),
            ),
            (
                "partition wraps to 32 bits as Go's int32()",
                csi(handle, json!({"partition": "4294967297"}), null.clone(), null.clone()),
                Some(json!({
                    "metadata": {"name": "pv1"},
                    "spec": {
                        "gcePersistentDisk": {"pdName": "disk", "fsType": "ext4", "partition": 1, "readOnly": true},
                        "accessModes": [RWO],
                    },
                })),
            ),
            ("short handle", csi("projects/p/zones/z/disks", null.clone(), null.clone(), null.clone()), None),
            (
                "non-numeric partition",
                csi(handle, json!({"partition": "one"}), null.clone(), null.clone()),
                None,
            ),
            (
                "partition with spaces",
                csi(handle, json!({"partition": " 1"}), null.clone(), null.clone()),
                None,
            ),
            (
                "zones of two regions in one term",
                csi(
                    handle,
                    null.clone(),
                    affinity(&[&[(TOPOLOGY_KEY, &["us-central1-a", "us-east1-b"])]]),
                    null.clone(),
                ),
                None,
            ),
            (
                "malformed zone",
                csi(handle, null.clone(), affinity(&[&[(TOPOLOGY_KEY, &["uscentral1a"])]]), null.clone()),
                None,
            ),
            (
                "term without zones",
                csi(handle, null.clone(), affinity(&[&[("kubernetes.io/hostname", &["n1"])]]), null.clone()),
                None,
            ),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_csi_pv_to_in_tree(&input);
            match want {
                Some(want) => assert_same(name, &got.unwrap_or_else(|e| panic!("{name}: {e}")), &pv(want)),
                None => {
                    let err = got.expect_err(name).to_string();
                    assert!(err.contains("\"pv1\""), "{name}: {err}");
                }
            }
        }
    }

    // Upstream: TestTranslationStability (translate_test.go), the GCE PD case.
    #[test]
    fn round_trip_is_stable() {
        let input = pv(json!({"spec": {"gcePersistentDisk": {"pdName": "test-disk", "fsType": "ext4"}}}));
        let csi = in_tree_pv_to_csi(&input).unwrap();
        assert!(csi.spec.as_ref().is_some_and(|s| s.csi.is_some() && s.gce_persistent_disk.is_none()));
        let back = crate::translate_csi_pv_to_in_tree(&csi).unwrap();
        assert_same("GCE PD PV Source", &back, &input);
    }

    // Upstream: TestTopologyTranslation (translate_test.go), the 10 GCE PD cases: node affinity
    // after translation to CSI; after translating back, no CSI key and a Kubernetes zone key.
    #[test]
    fn topology_translation() {
        let beta = json!({BETA_ZONE: "us-east-1a", BETA_REGION: "us-east-1"});
        let ga = json!({GA_ZONE: "us-east-1a", GA_REGION: "us-east-1"});
        let regional_beta = json!({BETA_ZONE: "europe-west1-b__europe-west1-c"});
        let regional_ga = json!({GA_ZONE: "europe-west1-b__europe-west1-c"});
        let null = Value::Null;
        let one = |key: &str, values: &[&str]| affinity(&[&[(key, values)]]);
        let cases: Vec<(&str, bool, PersistentVolume, Value)> = vec![
            (
                "GCE PD with beta zone labels",
                true,
                gce_pv(beta.clone(), null.clone()),
                one(TOPOLOGY_KEY, &["us-east-1a"]),
            ),
            (
                "GCE PD with GA kubernetes zone labels",
                true,
                gce_pv(ga, null.clone()),
                one(TOPOLOGY_KEY, &["us-east-1a"]),
            ),
            (
                "GCE PD with existing topology (beta keys)",
                false,
                gce_pv(null.clone(), one(BETA_ZONE, &["us-east-2a"])),
                one(TOPOLOGY_KEY, &["us-east-2a"]),
            ),
            (
                "GCE PD with existing topology (CSI keys)",
                true,
                gce_pv(null.clone(), one(TOPOLOGY_KEY, &["us-east-2a"])),
                one(TOPOLOGY_KEY, &["us-east-2a"]),
            ),
            (
                "GCE PD with zone labels and topology",
                false,
                gce_pv(beta, one(BETA_ZONE, &["us-east-2a"])),
                one(TOPOLOGY_KEY, &["us-east-2a"]),
            ),
            (
                "GCE PD with regional zones",
                true,
                gce_pv(regional_beta.clone(), null.clone()),
                one(TOPOLOGY_KEY, &["europe-west1-b", "europe-west1-c"]),
            ),
            (
                "GCE PD with regional topology",
                true,
                gce_pv(null.clone(), one(GA_ZONE, &["europe-west1-b", "europe-west1-c"])),
                one(TOPOLOGY_KEY, &["europe-west1-b", "europe-west1-c"]),
            ),
            (
                "GCE PD with Beta regional zone and topology",
                true,
                gce_pv(regional_beta, one(BETA_ZONE, &["europe-west1-f", "europe-west1-g"])),
                one(TOPOLOGY_KEY, &["europe-west1-f", "europe-west1-g"]),
            ),
            (
                "GCE PD with GA regional zone and topology",
                true,
                gce_pv(regional_ga, one(GA_ZONE, &["europe-west1-f", "europe-west1-g"])),
                one(TOPOLOGY_KEY, &["europe-west1-f", "europe-west1-g"]),
            ),
            (
                "GCE PD with multiple node selector terms",
                true,
                gce_pv(
                    null.clone(),
                    affinity(&[&[(GA_ZONE, &["europe-west1-f"])], &[(GA_ZONE, &["europe-west1-g"])]]),
                ),
                affinity(&[&[(TOPOLOGY_KEY, &["europe-west1-f"])], &[(TOPOLOGY_KEY, &["europe-west1-g"])]]),
            ),
        ];
        for (name, check_back, input, want) in cases {
            let csi = in_tree_pv_to_csi(&input).unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = csi.spec.as_ref().and_then(|s| s.node_affinity.clone());
            assert_same(name, &got, &serde_json::from_value(want).unwrap());
            let back = crate::translate_csi_pv_to_in_tree(&csi).unwrap_or_else(|e| panic!("{name}: {e}"));
            let na = back.spec.as_ref().and_then(|s| s.node_affinity.as_ref());
            let has = |key: &str| crate::topology::topology_key_exists(key, na);
            if check_back {
                assert!(!has(TOPOLOGY_KEY), "{name}: CSI key left after translating back");
                assert!(
                    has(BETA_ZONE) || has(GA_ZONE),
                    "{name}: no Kubernetes zone key after translating back"
                );
            }
        }
    }

    // The multi-term case back to in-tree in full: every term gets its own region.
    #[test]
    fn topology_translation_back_per_term() {
        let input = gce_pv(
            Value::Null,
            affinity(&[&[(GA_ZONE, &["europe-west1-f"])], &[(GA_ZONE, &["europe-west1-g"])]]),
        );
        let back = crate::translate_csi_pv_to_in_tree(&in_tree_pv_to_csi(&input).unwrap()).unwrap();
        let want = pv(json!({
            "metadata": {"labels": {GA_ZONE: "europe-west1-f__europe-west1-g", GA_REGION: "europe-west1"}},
            "spec": {
                "gcePersistentDisk": {"pdName": "test-disk", "fsType": "ext4"},
                "nodeAffinity": affinity(&[
                    &[(GA_ZONE, &["europe-west1-f"]), (GA_REGION, &["europe-west1"])],
                    &[(GA_ZONE, &["europe-west1-g"]), (GA_REGION, &["europe-west1"])],
                ]),
            },
        }));
        assert_same("multi-term back", &back, &want);
    }

    #[test]
    fn region_parser() {
        let cases: &[(&[&str], Result<&str, ()>)] = &[
            (&["us-central1-a"], Ok("us-central1")),
            (&["us-central1-a", "us-central1-b"], Ok("us-central1")),
            (&["a--c"], Ok("a-")),
            (&["-b-c"], Ok("-b")),
            (&[], Err(())),
            (&["us-central1"], Err(())),
            (&["us-central1-a-b"], Err(())),
            (&["us-central1-a", "europe-west1-b"], Err(())),
            (&["us-central1-a", "europe-west1-b", "bad"], Err(())),
        ];
        for (zones, want) in cases {
            let got = region_from_zones(zones.iter().copied()).map_err(|_| ());
            assert_eq!(&got, want, "{zones:?}");
        }
    }
}
