//! Where CSI volumes live on the node (upstream's layout) and the small JSON files that let a restarted node tear them down.
//!
//! ```text
//! <root>/plugins/kubernetes.io/csi/<driver>/<sha256(volume handle)>/globalmount   stage path
//! <root>/plugins/kubernetes.io/csi/<driver>/<sha256(volume handle)>/vol_data.json  written by stage
//! <root>/plugins/kubernetes.io/csi/<driver>/<sha256(volume handle)>/attachment.json  kvol's attach record
//! <root>/pods/<uid>/volumes/kubernetes.io~csi/<volume name>/mount                  publish path
//! <root>/pods/<uid>/volumes/kubernetes.io~csi/<volume name>/vol_data.json          written by publish
//! ```
//!
//! Raw block volumes use kubelet's block layout (`csi_block.go`), keyed by the spec's name:
//!
//! ```text
//! <root>/plugins/kubernetes.io/csi/volumeDevices/staging/<spec name>             stage path (a directory)
//! <root>/plugins/kubernetes.io/csi/volumeDevices/publish/<spec name>/<pod uid>   publish path (a file)
//! <root>/plugins/kubernetes.io/csi/volumeDevices/<spec name>/data/vol_data.json  written by stage and publish
//! <root>/plugins/kubernetes.io/csi/volumeDevices/<spec name>/dev/<pod uid>       global map file (kvol_plugin::block)
//! <root>/pods/<uid>/volumeDevices/kubernetes.io~csi/<spec name>                  pod device link
//! ```
//!
//! `vol_data.json` holds upstream's keys (`driverName`, `volumeHandle`, `specVolID`,
//! `nodeName`, `attachmentID`, `volumeLifecycleMode`), all strings, so files written by a
//! kubelet load here and the other way round. `attachment.json` is kvol's own: in standalone
//! mode it stands in for the VolumeAttachment object (its `attachmentMetadata` is the publish
//! context). Files are written atomically (a temporary file, then a rename).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use kvol_plugin::NodePaths;
use kvol_plugin::host::escape_plugin_name;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{CsiError, Result};

/// The in-tree plugin name all CSI volumes are filed under (upstream's `CSIPluginName`).
pub const CSI_PLUGIN_NAME: &str = "kubernetes.io/csi";
/// The last component of a stage path.
pub const GLOBAL_MOUNT: &str = "globalmount";
/// The last component of a publish path.
pub const MOUNT_DIR: &str = "mount";
/// The file next to a stage or publish path that records the volume.
pub const VOL_DATA_FILE: &str = "vol_data.json";
/// kvol's attach record, next to the stage path.
pub const ATTACHMENT_FILE: &str = "attachment.json";

pub use kvol_csi_rules::names::{attachment_id, sha256_hex};

/// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(volume handle)>`: a volume's node-global
/// directory, holding its stage path and its records.
pub fn volume_dir(paths: &NodePaths, driver: &str, volume_handle: &str) -> PathBuf {
    paths.plugin_dir(CSI_PLUGIN_NAME).join(driver).join(sha256_hex(volume_handle))
}

/// `<volume dir>/globalmount`: where a volume is staged.
pub fn stage_path(paths: &NodePaths, driver: &str, volume_handle: &str) -> PathBuf {
    volume_dir(paths, driver, volume_handle).join(GLOBAL_MOUNT)
}

/// `<root>/pods/<uid>/volumes/kubernetes.io~csi/<volume name>`: a pod's directory for a CSI
/// volume (the volume name is the PV's name, or the pod's name for an inline volume).
pub fn pod_volume_dir(paths: &NodePaths, pod_uid: &str, volume_name: &str) -> kvol_plugin::Result<PathBuf> {
    paths.pod_volume_dir(pod_uid, CSI_PLUGIN_NAME, &escape_plugin_name(volume_name))
}

/// `<pod volume dir>/mount`: the target path NodePublishVolume gets.
pub fn publish_path(pod_volume_dir: &Path) -> PathBuf {
    pod_volume_dir.join(MOUNT_DIR)
}

/// `<root>/plugins/kubernetes.io/csi/volumeDevices/staging/<spec name>`: where a block volume
/// is staged.
pub fn block_stage_path(paths: &NodePaths, spec_name: &str) -> PathBuf {
    paths.volume_devices_dir(CSI_PLUGIN_NAME).join(BLOCK_STAGING).join(spec_name)
}

/// `<root>/plugins/kubernetes.io/csi/volumeDevices/publish/<spec name>`: the directory of a
/// block volume's publish files, one per pod.
pub fn block_publish_dir(paths: &NodePaths, spec_name: &str) -> PathBuf {
    paths.volume_devices_dir(CSI_PLUGIN_NAME).join(BLOCK_PUBLISH).join(spec_name)
}

/// `<root>/plugins/kubernetes.io/csi/volumeDevices/<spec name>/data`: a block volume's record
/// directory (`vol_data.json`).
pub fn block_data_dir(paths: &NodePaths, spec_name: &str) -> PathBuf {
    paths.volume_devices_dir(CSI_PLUGIN_NAME).join(spec_name).join(BLOCK_DATA)
}

/// The spec name of a block stage path (`…/volumeDevices/staging/<spec name>`); `None` for a
/// filesystem stage path.
pub fn block_spec_of_stage_path(staging_path: &Path) -> Option<&str> {
    let parent = staging_path.parent()?;
    let is_block = parent.file_name()? == BLOCK_STAGING
        && parent.parent()?.file_name()? == kvol_plugin::block::VOLUME_DEVICES;
    is_block.then(|| staging_path.file_name()?.to_str()).flatten()
}

/// Block layout: the staging directory's name.
pub const BLOCK_STAGING: &str = "staging";
/// Block layout: the publish directory's name.
pub const BLOCK_PUBLISH: &str = "publish";
/// Block layout: the record directory's name.
pub const BLOCK_DATA: &str = "data";

/// What `vol_data.json` records (upstream's `volDataKey`s).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolData {
    #[serde(rename = "driverName")]
    pub driver_name: String,
    #[serde(rename = "volumeHandle")]
    pub volume_handle: String,
    /// The volume's name (PV name, or the pod's name for an inline volume); publish only.
    #[serde(rename = "specVolID", default, skip_serializing_if = "String::is_empty")]
    pub spec_volume_id: String,
    #[serde(rename = "nodeName", default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    #[serde(rename = "attachmentID", default, skip_serializing_if = "String::is_empty")]
    pub attachment_id: String,
    /// `Persistent` or `Ephemeral`; publish only.
    #[serde(rename = "volumeLifecycleMode", default, skip_serializing_if = "String::is_empty")]
    pub volume_lifecycle_mode: String,
}

/// A Secret named by namespace and name (no values: they are read again when needed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretName {
    pub namespace: String,
    pub name: String,
}

/// What kvol's attacher records about a ControllerPublishVolume it made.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentRecord {
    pub driver_name: String,
    pub volume_handle: String,
    /// The node (kvol's name for it) the volume is attached to.
    pub node_name: String,
    /// The driver's ID of that node.
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// Upstream's VolumeAttachment name for the attachment.
    #[serde(rename = "attachmentID")]
    pub attachment_id: String,
    /// What ControllerPublishVolume returned; NodeStage and NodePublish get it.
    #[serde(default)]
    pub publish_context: BTreeMap<String, String>,
    /// The Secret ControllerUnpublishVolume needs again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_publish_secret_ref: Option<SecretName>,
}

/// Writes `dir/vol_data.json` atomically.
pub fn save_vol_data(dir: &Path, data: &VolData) -> Result<()> {
    save_json(&dir.join(VOL_DATA_FILE), data)
}

/// Reads `dir/vol_data.json`; `None` when there is none.
pub fn load_vol_data(dir: &Path) -> Result<Option<VolData>> {
    load_json(&dir.join(VOL_DATA_FILE))
}

/// Removes `dir/vol_data.json`, and the temporary files of writes of it that a killed process
/// left (`.vol_data.json.<pid>.tmp`), which would otherwise keep the directory forever; a
/// missing file is fine.
pub fn remove_vol_data(dir: &Path) -> Result<()> {
    remove_stray_vol_data_temps(dir)?;
    remove_file(&dir.join(VOL_DATA_FILE))
}

/// Removes only the half-written `vol_data.json` copies (`.vol_data.json.<pid>.tmp`) a killed
/// process left in `dir`: what an orphan directory may hold besides nothing.
pub fn remove_stray_vol_data_temps(dir: &Path) -> Result<()> {
    remove_stray_temps(dir, VOL_DATA_FILE)
}

/// Removes `dir/.<name>.<pid>.tmp` files, what [`save_json`] writes before its rename.
fn remove_stray_temps(dir: &Path, name: &str) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(CsiError::io("list", dir, e)),
    };
    let prefix = format!(".{name}.");
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        let pid = file.strip_prefix(&prefix).and_then(|rest| rest.strip_suffix(".tmp"));
        if pid.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
            remove_file(&entry.path())?;
        }
    }
    Ok(())
}

/// Writes `dir/attachment.json` atomically.
pub fn save_attachment(dir: &Path, record: &AttachmentRecord) -> Result<()> {
    save_json(&dir.join(ATTACHMENT_FILE), record)
}

/// Reads `dir/attachment.json`; `None` when there is none.
pub fn load_attachment(dir: &Path) -> Result<Option<AttachmentRecord>> {
    load_json(&dir.join(ATTACHMENT_FILE))
}

/// Removes `dir/attachment.json`; a missing file is fine.
pub fn remove_attachment(dir: &Path) -> Result<()> {
    remove_file(&dir.join(ATTACHMENT_FILE))
}

/// Writes `value` as JSON to `path` through a temporary file in the same directory, synced
/// and renamed over `path`, so a crash leaves the old file or the new one, never half of one.
fn save_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("data");
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut text =
        serde_json::to_vec(value).map_err(|e| CsiError::io("encode", path, io::Error::other(e)))?;
    text.push(b'\n');
    let written = (|| {
        let mut file = fs::File::create(&temp)?;
        file.write_all(&text)?;
        file.sync_all()
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(CsiError::io("write", &temp, e));
    }
    fs::rename(&temp, path).map_err(|e| {
        let _ = fs::remove_file(&temp);
        CsiError::io("save", path, e)
    })
}

/// Reads JSON from `path`; `None` when the file does not exist. A file that does not parse is
/// an error naming it.
fn load_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let text = match fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CsiError::io("read", path, e)),
    };
    serde_json::from_slice(&text).map(Some).map_err(|e| {
        let reason = format!("{e} (the file is corrupt; if the volume is gone, remove the file by hand)");
        CsiError::io("parse volume record", path, io::Error::new(io::ErrorKind::InvalidData, reason))
    })
}

fn remove_file(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(CsiError::io("remove", path, e)),
        _ => Ok(()),
    }
}

/// Removes the directory `path` if it is empty: `Ok(true)` when removed, `Ok(false)` when it
/// is gone already or still holds something (which is kept).
pub fn remove_dir_if_empty(path: &Path) -> Result<bool> {
    match fs::remove_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::DirectoryNotEmpty) => Ok(false),
        Err(e) => Err(CsiError::io("remove", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_paths_follow_kubelet_block_layout() {
        let p = NodePaths::new("/var/lib/kubelet");
        let base = "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices";
        assert_eq!(block_stage_path(&p, "pv-1"), Path::new(&format!("{base}/staging/pv-1")));
        assert_eq!(block_publish_dir(&p, "pv-1"), Path::new(&format!("{base}/publish/pv-1")));
        assert_eq!(block_data_dir(&p, "pv-1"), Path::new(&format!("{base}/pv-1/data")));
        let cases = [
            (format!("{base}/staging/pv-1"), Some("pv-1")),
            (format!("{base}/pv-1/dev"), None),
            ("/var/lib/kubelet/plugins/kubernetes.io/csi/d/abc/globalmount".to_string(), None),
            ("/x/staging/pv-1".to_string(), None),
        ];
        for (path, want) in cases {
            assert_eq!(block_spec_of_stage_path(Path::new(&path)), want, "{path}");
        }
    }

    #[test]
    fn removing_vol_data_removes_the_temporary_files_a_killed_writer_left() {
        let dir = tempfile::tempdir().unwrap();
        let keep = [".vol_data.json.tmp", ".vol_data.json.12x.tmp", "data", ".attachment.json.7.tmp"];
        for name in [VOL_DATA_FILE, ".vol_data.json.4242.tmp", ".vol_data.json.7.tmp"].iter().chain(&keep) {
            fs::write(dir.path().join(name), b"{}").unwrap();
        }
        remove_vol_data(dir.path()).unwrap();
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want: Vec<String> = keep.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(left, want, "only vol_data.json and its own temporaries go");
    }

    #[test]
    fn paths_follow_upstream_layout() {
        let paths = NodePaths::new("/var/lib/kubelet");
        // printf 'handle-1' | sha256sum
        let hash = "4219dcd75aa1fff692ddc5cf84c1b34bf799aaad291afdf03dde2213f2f3b397";
        let table = [
            (
                stage_path(&paths, "hostpath.csi.k8s.io", "handle-1"),
                format!("/var/lib/kubelet/plugins/kubernetes.io/csi/hostpath.csi.k8s.io/{hash}/globalmount"),
            ),
            (
                volume_dir(&paths, "hostpath.csi.k8s.io", "handle-1"),
                format!("/var/lib/kubelet/plugins/kubernetes.io/csi/hostpath.csi.k8s.io/{hash}"),
            ),
            (
                pod_volume_dir(&paths, "uid-1", "pv-1").unwrap(),
                "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1".to_string(),
            ),
            (
                publish_path(&pod_volume_dir(&paths, "uid-1", "pv-1").unwrap()),
                "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount".to_string(),
            ),
        ];
        for (got, want) in table {
            assert_eq!(got, PathBuf::from(want));
        }
    }

    #[test]
    fn vol_data_round_trips_atomically_and_uses_upstream_keys() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load_vol_data(dir.path()).unwrap(), None, "no file is no data");
        let data = VolData {
            driver_name: "d.example.com".into(),
            volume_handle: "h-1".into(),
            spec_volume_id: "pv-1".into(),
            node_name: "node-a".into(),
            attachment_id: "csi-x".into(),
            volume_lifecycle_mode: "Persistent".into(),
        };
        save_vol_data(dir.path(), &data).unwrap();
        assert_eq!(load_vol_data(dir.path()).unwrap(), Some(data.clone()));
        let text = fs::read_to_string(dir.path().join(VOL_DATA_FILE)).unwrap();
        let keys: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            keys,
            serde_json::json!({
                "driverName": "d.example.com", "volumeHandle": "h-1", "specVolID": "pv-1",
                "nodeName": "node-a", "attachmentID": "csi-x", "volumeLifecycleMode": "Persistent"
            })
        );
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [VOL_DATA_FILE], "no temporary file is left behind");
        remove_vol_data(dir.path()).unwrap();
        remove_vol_data(dir.path()).unwrap();
        assert_eq!(load_vol_data(dir.path()).unwrap(), None);
    }

    #[test]
    fn a_kubelet_written_file_loads() {
        let dir = tempfile::tempdir().unwrap();
        let upstream = r#"{"driverName":"d.example.com","volumeHandle":"h-1","seLinuxMountContext":"x"}"#;
        fs::write(dir.path().join(VOL_DATA_FILE), upstream).unwrap();
        let data = load_vol_data(dir.path()).unwrap().unwrap();
        assert_eq!(
            data,
            VolData {
                driver_name: "d.example.com".into(),
                volume_handle: "h-1".into(),
                ..VolData::default()
            }
        );
    }

    #[test]
    fn corrupt_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let table = [
            ("{\"driverName\": \"d\"", "EOF while parsing"),
            ("{\"driverName\": \"d\"}", "missing field `volumeHandle`"),
            ("[]", "expected struct VolData"),
        ];
        for (text, why) in table {
            fs::write(dir.path().join(VOL_DATA_FILE), text).unwrap();
            let err = load_vol_data(dir.path()).unwrap_err().to_string();
            let file = dir.path().join(VOL_DATA_FILE);
            assert!(err.starts_with(&format!("cannot parse volume record {}: ", file.display())), "{err}");
            assert!(err.contains(why), "{err}");
            assert!(err.contains("remove the file by hand"), "{err}");
        }
    }

    #[test]
    fn attachment_records_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let record = AttachmentRecord {
            driver_name: "d.example.com".into(),
            volume_handle: "h-1".into(),
            node_name: "node-a".into(),
            node_id: "n-1".into(),
            attachment_id: attachment_id("h-1", "d.example.com", "node-a"),
            publish_context: BTreeMap::from([("lun".into(), "3".into())]),
            controller_publish_secret_ref: Some(SecretName { namespace: "ns".into(), name: "s".into() }),
        };
        save_attachment(dir.path(), &record).unwrap();
        assert_eq!(load_attachment(dir.path()).unwrap(), Some(record));
        remove_attachment(dir.path()).unwrap();
        assert_eq!(load_attachment(dir.path()).unwrap(), None);
    }

    #[test]
    fn only_empty_directories_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("full");
        fs::create_dir(&full).unwrap();
        fs::write(full.join("data"), "keep me").unwrap();
        assert!(!remove_dir_if_empty(&full).unwrap());
        assert_eq!(fs::read_to_string(full.join("data")).unwrap(), "keep me");
        let empty = dir.path().join("empty");
        fs::create_dir(&empty).unwrap();
        assert!(remove_dir_if_empty(&empty).unwrap());
        assert!(!remove_dir_if_empty(&empty).unwrap(), "gone already");
    }
}
