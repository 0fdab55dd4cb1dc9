//! Volume snapshots on a standalone node (the `snapshot-controller` component, run by the agent): VolumeSnapshot manifests taken through the source volume's CSI driver or brought in from a pre-provisioned VolumeSnapshotContent, recorded, deleted with their manifest, and restored into new claims.
//!
//! The decisions are pure ([`snapshots_to_take`], [`snapshots_to_delete`], [`restore_source`]);
//! the agent makes the CSI calls and keeps the records under `<state dir>/snapshots/`, one JSON
//! file per VolumeSnapshot, as it keeps provisioned volumes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kvol_api::snapshot::{VolumeSnapshot, VolumeSnapshotClass};
use serde::{Deserialize, Serialize};

use kvol_api::ObjectSet;

/// What kvol knows of a snapshot it took: the standalone VolumeSnapshotContent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    pub driver: String,
    /// The driver's snapshot id.
    pub snapshot_handle: String,
    /// The volume handle it was taken of.
    pub source_volume_handle: String,
    /// The claim it was taken of, `namespace/name`.
    pub source_claim: String,
    pub size_bytes: i64,
    pub ready_to_use: bool,
    /// `Delete` or `Retain`, from the class at the time it was taken (or the content's).
    pub deletion_policy: String,
    pub created_unix_seconds: i64,
    /// The pre-provisioned VolumeSnapshotContent it was brought in from; `None`: taken by kvol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// What the agent does for one VolumeSnapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotWork {
    /// CreateSnapshot of its claim's volume.
    Take(SnapshotRequest),
    /// Bring in the snapshot a pre-provisioned content names: asked about with ListSnapshots
    /// when the driver can list (ready, size, source), taken as ready when it cannot, as the
    /// external-snapshotter does.
    Adopt(ContentAdoption),
}

impl SnapshotWork {
    pub fn key(&self) -> &str {
        match self {
            SnapshotWork::Take(request) => &request.key,
            SnapshotWork::Adopt(adoption) => &adoption.key,
        }
    }

    pub fn driver(&self) -> &str {
        match self {
            SnapshotWork::Take(request) => &request.driver,
            SnapshotWork::Adopt(adoption) => &adoption.driver,
        }
    }
}

/// A VolumeSnapshot bound to a pre-provisioned VolumeSnapshotContent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentAdoption {
    /// The VolumeSnapshot, `namespace/name`.
    pub key: String,
    /// The VolumeSnapshotContent's name.
    pub content: String,
    pub driver: String,
    pub snapshot_handle: String,
    pub deletion_policy: String,
}

/// A snapshot to take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRequest {
    /// The VolumeSnapshot, `namespace/name`.
    pub key: String,
    /// The name it is created under on the driver: `snapshot-` and its uid, or a stable hash of
    /// its key when it has none, so a retry finds the same snapshot.
    pub name: String,
    pub driver: String,
    pub source_volume_handle: String,
    pub source_claim: String,
    pub deletion_policy: String,
    pub parameters: BTreeMap<String, String>,
}

/// Why a VolumeSnapshot is not being taken (for the status).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotPending {
    pub key: String,
    pub reason: String,
}

/// The VolumeSnapshots not yet recorded, or recorded but not ready to use (asked again: a
/// repeated CreateSnapshot of the same name, or ListSnapshots of a content's handle, answers
/// with the snapshot's current state, as the external-snapshotter polls), each with what
/// taking or bringing it in needs — or why it cannot be done now: its claim missing or
/// unbound, no class (or the class's driver is not the volume's), its content missing or bound
/// to another snapshot, the driver not registered. `objects` has the provisioned volumes laid
/// over it. Pure.
pub fn snapshots_to_take(
    objects: &ObjectSet,
    records: &BTreeMap<String, SnapshotRecord>,
    drivers: &[String],
) -> (Vec<SnapshotWork>, Vec<SnapshotPending>) {
    let mut work = Vec::new();
    let mut pending = Vec::new();
    for (key, snapshot) in &objects.volume_snapshots {
        if records.get(key).is_some_and(|r| r.ready_to_use) {
            continue;
        }
        let planned = match snapshot.spec.source.volume_snapshot_content_name.as_deref() {
            Some(content) => adoption(key, content, objects).map(SnapshotWork::Adopt),
            None => request_for(key, snapshot, objects).map(SnapshotWork::Take),
        };
        let registered = planned.and_then(|w| {
            if drivers.iter().any(|d| d == w.driver()) {
                Ok(w)
            } else {
                Err(format!("csi driver {} is not registered on this node", w.driver()))
            }
        });
        match registered {
            Ok(w) => work.push(w),
            Err(reason) => pending.push(SnapshotPending { key: key.clone(), reason }),
        }
    }
    (work, pending)
}

/// The content a VolumeSnapshot names, if it names the snapshot back and holds a handle.
fn adoption(key: &str, content_name: &str, objects: &ObjectSet) -> Result<ContentAdoption, String> {
    let content = objects
        .snapshot_contents
        .get(content_name)
        .ok_or(format!("its VolumeSnapshotContent {content_name} does not exist"))?;
    let reference = &content.spec.volume_snapshot_ref;
    let bound_to = format!("{}/{}", reference.namespace, reference.name);
    if bound_to != key {
        return Err(format!(
            "VolumeSnapshotContent {content_name} is for VolumeSnapshot {bound_to}, not this one"
        ));
    }
    let handle = content.spec.source.snapshot_handle.clone().ok_or(format!(
        "VolumeSnapshotContent {content_name} has no source.snapshotHandle: only pre-provisioned contents are read \
         from manifests (kvol keeps the ones it takes itself)"
    ))?;
    Ok(ContentAdoption {
        key: key.to_string(),
        content: content_name.to_string(),
        driver: content.spec.driver.clone(),
        snapshot_handle: handle,
        deletion_policy: content.spec.deletion_policy.clone(),
    })
}

fn request_for(key: &str, snapshot: &VolumeSnapshot, objects: &ObjectSet) -> Result<SnapshotRequest, String> {
    let namespace = key.split_once('/').map_or("default", |(ns, _)| ns);
    let Some(claim_name) = snapshot.spec.source.persistent_volume_claim_name.as_deref() else {
        return Err("it names neither a claim nor a VolumeSnapshotContent".into());
    };
    let claim_key = format!("{namespace}/{claim_name}");
    let claim = objects.claims.get(&claim_key).ok_or(format!("its claim {claim_key} does not exist"))?;
    let pv_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty())
        .ok_or(format!("its claim {claim_key} is not bound yet"))?;
    let csi = objects
        .persistent_volumes
        .get(pv_name)
        .and_then(|pv| pv.spec.as_ref())
        .and_then(|spec| spec.csi.as_ref())
        .ok_or(format!("the volume {pv_name} of claim {claim_key} is not a CSI volume"))?;
    let class = class_for(snapshot, &csi.driver, &objects.snapshot_classes)?;
    if class.driver != csi.driver {
        return Err(format!(
            "its class {} is for driver {}, but the volume of claim {claim_key} is {}'s",
            class.metadata.name.as_deref().unwrap_or_default(),
            class.driver,
            csi.driver
        ));
    }
    let name = match snapshot.metadata.uid.as_deref().filter(|u| !u.is_empty()) {
        Some(uid) => format!("snapshot-{uid}"),
        None => format!("snapshot-{}", &kvol_csi_rules::names::sha256_hex(key)[..32]),
    };
    Ok(SnapshotRequest {
        key: key.to_string(),
        name,
        driver: csi.driver.clone(),
        source_volume_handle: csi.volume_handle.clone(),
        source_claim: claim_key,
        deletion_policy: class.deletion_policy.clone(),
        parameters: class.parameters.clone().unwrap_or_default(),
    })
}

/// The snapshot's class: the one it names, or the driver's only default class.
fn class_for<'a>(
    snapshot: &VolumeSnapshot,
    driver: &str,
    classes: &'a BTreeMap<String, VolumeSnapshotClass>,
) -> Result<&'a VolumeSnapshotClass, String> {
    if let Some(name) = snapshot.spec.volume_snapshot_class_name.as_deref() {
        return classes.get(name).ok_or(format!("its VolumeSnapshotClass {name} does not exist"));
    }
    let defaults: Vec<&VolumeSnapshotClass> =
        classes.values().filter(|c| c.driver == driver && c.is_default()).collect();
    match defaults.as_slice() {
        [only] => Ok(only),
        [] => Err(format!("it names no class and driver {driver} has no default VolumeSnapshotClass")),
        _ => Err(format!("it names no class and driver {driver} has {} default classes", defaults.len())),
    }
}

/// The records whose VolumeSnapshot is gone and whose policy is `Delete`: their snapshots are
/// deleted on the driver, then forgotten. A `Retain` record stays, as its content would. Pure.
pub fn snapshots_to_delete<'a>(
    objects: &ObjectSet,
    records: &'a BTreeMap<String, SnapshotRecord>,
) -> Vec<(&'a String, &'a SnapshotRecord)> {
    records
        .iter()
        .filter(|(key, record)| {
            !objects.volume_snapshots.contains_key(*key) && record.deletion_policy == "Delete"
        })
        .collect()
}

/// The snapshot a claim is to be restored from (its `dataSource` names a VolumeSnapshot):
/// `Ok(None)` for a claim without one, the driver's snapshot id once the snapshot is recorded
/// and ready, an error saying what it waits for otherwise. Pure.
pub fn restore_source(
    claim_key: &str,
    claim: &PersistentVolumeClaim,
    records: &BTreeMap<String, SnapshotRecord>,
) -> Result<Option<String>, String> {
    let Some(source) = claim.spec.as_ref().and_then(|s| s.data_source.as_ref()) else { return Ok(None) };
    if source.kind != "VolumeSnapshot" {
        return Err(format!("claim {claim_key}: a dataSource of kind {} is not served", source.kind));
    }
    let namespace = claim_key.split_once('/').map_or("default", |(ns, _)| ns);
    let key = format!("{namespace}/{}", source.name);
    match records.get(&key) {
        Some(record) if record.ready_to_use => Ok(Some(record.snapshot_handle.clone())),
        Some(_) => Err(format!("claim {claim_key}: snapshot {key} is not ready to use yet")),
        None => Err(format!("claim {claim_key}: snapshot {key} has not been taken")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn objects() -> ObjectSet {
        let mut set = ObjectSet::default();
        let claim = |volume: Option<&str>| -> PersistentVolumeClaim {
            serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {"volumeName": volume}}))
                .unwrap()
        };
        set.claims.insert("ns/data".into(), claim(Some("pv-data")));
        set.claims.insert("ns/unbound".into(), claim(None));
        set.persistent_volumes.insert(
            "pv-data".into(),
            serde_json::from_value(
                json!({"metadata": {"name": "pv-data"}, "spec": {"csi": {"driver": "d.example", "volumeHandle": "vol-1"}}}),
            )
            .unwrap(),
        );
        let class = |name: &str, driver: &str, default: bool| -> VolumeSnapshotClass {
            serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
                kvol_api::snapshot::ANN_DEFAULT_CLASS: default.to_string()}},
                "driver": driver, "deletionPolicy": "Delete", "parameters": {"p": "1"}}))
            .unwrap()
        };
        set.snapshot_classes.insert("fast".into(), class("fast", "d.example", true));
        set.snapshot_classes.insert("other".into(), class("other", "e.example", false));
        set
    }

    fn snapshot(claim: Option<&str>, class: Option<&str>) -> VolumeSnapshot {
        serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "ns", "uid": "u-1"},
            "spec": {"volumeSnapshotClassName": class, "source": {"persistentVolumeClaimName": claim}}}))
        .unwrap()
    }

    #[test]
    fn snapshots_are_taken_once_their_claim_class_and_driver_are_there() {
        let drivers = vec!["d.example".to_string()];
        // (what, the snapshot, registered drivers, Ok(class) or Err(words of the reason))
        type Row<'a> = (&'a str, VolumeSnapshot, &'a [String], Result<&'a str, &'a str>);
        let rows: [Row; 7] = [
            ("the default class", snapshot(Some("data"), None), &drivers, Ok("fast")),
            ("a named class", snapshot(Some("data"), Some("fast")), &drivers, Ok("fast")),
            (
                "no such claim",
                snapshot(Some("nope"), None),
                &drivers,
                Err("its claim ns/nope does not exist"),
            ),
            ("unbound", snapshot(Some("unbound"), None), &drivers, Err("ns/unbound is not bound yet")),
            (
                "no such class",
                snapshot(Some("data"), Some("slow")),
                &drivers,
                Err("VolumeSnapshotClass slow does not exist"),
            ),
            (
                "another driver's class",
                snapshot(Some("data"), Some("other")),
                &drivers,
                Err("is for driver e.example"),
            ),
            ("driver not registered", snapshot(Some("data"), None), &[], Err("d.example is not registered")),
        ];
        for (what, snap, drivers, want) in rows {
            let mut set = objects();
            set.volume_snapshots.insert("ns/s".into(), snap);
            let (take, pending) = snapshots_to_take(&set, &BTreeMap::new(), drivers);
            match want {
                Ok(_) => {
                    assert!(pending.is_empty(), "{what}: {pending:?}");
                    assert_eq!(
                        take,
                        [SnapshotWork::Take(SnapshotRequest {
                            key: "ns/s".into(),
                            name: "snapshot-u-1".into(),
                            driver: "d.example".into(),
                            source_volume_handle: "vol-1".into(),
                            source_claim: "ns/data".into(),
                            deletion_policy: "Delete".into(),
                            parameters: BTreeMap::from([("p".into(), "1".into())]),
                        })],
                        "{what}"
                    );
                }
                Err(words) => {
                    assert!(take.is_empty(), "{what}");
                    assert!(pending[0].reason.contains(words), "{what}: {:?}", pending[0].reason);
                }
            }
        }
    }

    fn record(policy: &str, ready: bool) -> SnapshotRecord {
        SnapshotRecord {
            driver: "d.example".into(),
            snapshot_handle: "snap-1".into(),
            source_volume_handle: "vol-1".into(),
            source_claim: "ns/data".into(),
            size_bytes: 1,
            ready_to_use: ready,
            deletion_policy: policy.into(),
            created_unix_seconds: 0,
            content: None,
        }
    }

    #[test]
    fn a_recorded_snapshot_is_not_taken_again_and_goes_with_its_manifest_unless_retained() {
        let mut set = objects();
        set.volume_snapshots.insert("ns/s".into(), snapshot(Some("data"), None));
        let records = BTreeMap::from([
            ("ns/s".to_string(), record("Delete", true)),
            ("ns/gone".to_string(), record("Delete", true)),
            ("ns/kept".to_string(), record("Retain", true)),
        ]);
        let (take, pending) = snapshots_to_take(&set, &records, &["d.example".into()]);
        assert!(take.is_empty() && pending.is_empty());
        // Recorded but not ready yet: asked again, under the same name.
        let waiting = BTreeMap::from([("ns/s".to_string(), record("Delete", false))]);
        let (take, _) = snapshots_to_take(&set, &waiting, &["d.example".into()]);
        let names: Vec<&str> = take
            .iter()
            .map(|w| match w {
                SnapshotWork::Take(r) => r.name.as_str(),
                SnapshotWork::Adopt(a) => a.content.as_str(),
            })
            .collect();
        assert_eq!(names, ["snapshot-u-1"]);
        let deleted: Vec<&String> = snapshots_to_delete(&set, &records).into_iter().map(|(k, _)| k).collect();
        assert_eq!(deleted, ["ns/gone"]);
    }

    #[test]
    fn a_pre_provisioned_content_is_brought_in_when_the_two_name_each_other() {
        let content = |name: &str,
                       bound_to: &str,
                       handle: Option<&str>|
         -> (String, kvol_api::snapshot::VolumeSnapshotContent) {
            let (namespace, snapshot) = bound_to.split_once('/').unwrap();
            let value = json!({"metadata": {"name": name}, "spec": {"driver": "d.example", "deletionPolicy": "Retain",
                "source": {"snapshotHandle": handle, "volumeHandle": if handle.is_none() { Some("vol-1") } else { None }},
                "volumeSnapshotRef": {"namespace": namespace, "name": snapshot}}});
            (name.to_string(), serde_json::from_value(value).unwrap())
        };
        let of_content = |name: &str| -> VolumeSnapshot {
            serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "ns"},
                "spec": {"source": {"volumeSnapshotContentName": name}}}))
            .unwrap()
        };
        let drivers = vec!["d.example".to_string()];
        // (what, contents present, the content the snapshot names, drivers, Ok(()) or Err(words))
        type Row<'a> = (
            &'a str,
            Vec<(String, kvol_api::snapshot::VolumeSnapshotContent)>,
            &'a str,
            &'a [String],
            Result<(), &'a str>,
        );
        let rows: Vec<Row> = vec![
            (
                "bound both ways",
                vec![content("imported", "ns/s", Some("snap-9"))],
                "imported",
                &drivers,
                Ok(()),
            ),
            (
                "no such content",
                vec![],
                "imported",
                &drivers,
                Err("VolumeSnapshotContent imported does not exist"),
            ),
            (
                "the content names another snapshot",
                vec![content("imported", "ns/other", Some("snap-9"))],
                "imported",
                &drivers,
                Err("is for VolumeSnapshot ns/other, not this one"),
            ),
            (
                "a dynamic content",
                vec![content("imported", "ns/s", None)],
                "imported",
                &drivers,
                Err("has no source.snapshotHandle"),
            ),
            (
                "driver not registered",
                vec![content("imported", "ns/s", Some("snap-9"))],
                "imported",
                &[],
                Err("d.example is not registered"),
            ),
        ];
        for (what, contents, named, drivers, want) in rows {
            let mut set = objects();
            set.snapshot_contents.extend(contents);
            set.volume_snapshots.insert("ns/s".into(), of_content(named));
            let (work, pending) = snapshots_to_take(&set, &BTreeMap::new(), drivers);
            match want {
                Ok(()) => assert_eq!(
                    (work, pending),
                    (
                        vec![SnapshotWork::Adopt(ContentAdoption {
                            key: "ns/s".into(),
                            content: "imported".into(),
                            driver: "d.example".into(),
                            snapshot_handle: "snap-9".into(),
                            deletion_policy: "Retain".into(),
                        })],
                        vec![]
                    ),
                    "{what}"
                ),
                Err(words) => {
                    assert!(work.is_empty(), "{what}");
                    assert!(pending[0].reason.contains(words), "{what}: {:?}", pending[0].reason);
                }
            }
        }
    }

    #[test]
    fn a_claim_is_restored_from_a_ready_snapshot_of_its_namespace() {
        let claim = |kind: &str| -> PersistentVolumeClaim {
            serde_json::from_value(json!({"metadata": {"name": "r"}, "spec": {"dataSource": {
                "apiGroup": "snapshot.storage.k8s.io", "kind": kind, "name": "s"}}}))
            .unwrap()
        };
        let ready = BTreeMap::from([("ns/s".to_string(), record("Delete", true))]);
        let not_ready = BTreeMap::from([("ns/s".to_string(), record("Delete", false))]);
        let plain: PersistentVolumeClaim =
            serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
        assert_eq!(restore_source("ns/p", &plain, &ready), Ok(None));
        assert_eq!(restore_source("ns/r", &claim("VolumeSnapshot"), &ready), Ok(Some("snap-1".into())));
        let rows = [
            (claim("VolumeSnapshot"), &not_ready, "snapshot ns/s is not ready to use yet"),
            (claim("VolumeSnapshot"), &BTreeMap::new(), "snapshot ns/s has not been taken"),
            (
                claim("PersistentVolumeClaim"),
                &ready,
                "a dataSource of kind PersistentVolumeClaim is not served",
            ),
        ];
        for (claim, records, want) in rows {
            let err = restore_source("ns/r", &claim, records).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
    }
}
