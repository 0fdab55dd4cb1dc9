//! The records of what the standalone control plane did, one JSON file per claim or VolumeSnapshot under the state directory, each replaced whole and durably.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;

use crate::snapshots::SnapshotRecord;

/// A record's file: `<namespace>~<name>.json` of the claim or VolumeSnapshot `key`.
pub fn record_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{}.json", key.replace('/', "~")))
}

/// The provisioned PVs recorded in `dir`, by claim key; unreadable records are reported.
pub fn load_provisioned(dir: &Path) -> (BTreeMap<String, Arc<PersistentVolume>>, Vec<String>) {
    load_records(dir, "provisioned volume record")
}

/// Records a provisioned PV for a claim (temp file, fsync, rename).
pub fn save_provisioned(dir: &Path, claim_key: &str, pv: &PersistentVolume) -> Result<(), String> {
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

/// Forgets the record of a claim's volume; a record already gone is fine.
pub fn remove_provisioned(dir: &Path, claim_key: &str) -> Result<(), String> {
    remove_record(&record_path(dir, claim_key))
}

/// The snapshot records in `dir`, by VolumeSnapshot key; unreadable ones are reported.
pub fn load_snapshots(dir: &Path) -> (BTreeMap<String, SnapshotRecord>, Vec<String>) {
    load_records(dir, "snapshot record")
}

/// Records a snapshot (temporary file, fsync, rename).
pub fn save_snapshot(dir: &Path, key: &str, record: &SnapshotRecord) -> Result<(), String> {
    save_record(&record_path(dir, key), record)
}

/// Forgets a snapshot's record; one already gone is fine.
pub fn remove_snapshot(dir: &Path, key: &str) -> Result<(), String> {
    remove_record(&record_path(dir, key))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn records_round_trip_and_bad_ones_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let pv: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "pvc-1"}})).unwrap();
        save_provisioned(dir.path(), "shop/data", &pv).unwrap();
        std::fs::write(dir.path().join("bad~x.json"), "{").unwrap();
        let (loaded, problems) = load_provisioned(dir.path());
        assert_eq!(loaded.get("shop/data").map(|pv| &**pv), Some(&pv));
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("bad~x.json"), "{problems:?}");
    }
}
