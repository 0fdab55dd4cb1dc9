//! The hostpath driver's records: volumes, snapshots, where each volume is staged and published; ids derived from names; the JSON state file, written atomically.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::fsutil;
use crate::loopfs::FsType;
use kvol_csi::CsiError;

/// The state file's format version; a file of another version is refused, never guessed at.
pub const STATE_VERSION: u32 = 1;

const VOLUME_PREFIX: &str = "vol-";
const SNAPSHOT_PREFIX: &str = "snap-";
const GROUP_PREFIX: &str = "group-";
/// Hex digits of sha256 kept in an id: 128 bits, no collisions in practice.
const ID_HEX_LEN: usize = 32;

/// Everything the driver knows, as kept in `<state>/state.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub version: u32,
    /// By volume id: persistent volumes (ids `vol-…`) and the ephemeral volumes in use (ids
    /// chosen by the kubelet).
    #[serde(default)]
    pub volumes: BTreeMap<String, VolumeRecord>,
    /// By snapshot id (`snap-…`).
    #[serde(default)]
    pub snapshots: BTreeMap<String, SnapshotRecord>,
    /// By group snapshot id (`group-…`); the members are in `snapshots`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub group_snapshots: BTreeMap<String, GroupSnapshotRecord>,
}

/// One volume.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// The CreateVolume name; empty for an ephemeral volume.
    #[serde(default)]
    pub name: String,
    /// The recorded capacity (not enforced); 0 means unknown.
    #[serde(default)]
    pub capacity_bytes: i64,
    /// The size the node has made visible (NodeGetVolumeStats' total): the capacity at
    /// creation, then what NodeExpandVolume grew it to; 0 means the capacity.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub node_size_bytes: i64,
    /// The storage-class `kind` parameter the volume was made with, which `--capacity` caps.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The node the volume is attached to (ControllerPublish), when attach is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached: Option<Attachment>,
    /// The mutable parameters set at creation or by ControllerModifyVolume.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mutable_parameters: BTreeMap<String, String>,
    /// An ephemeral inline volume: made on its first publish, deleted on its last unpublish.
    #[serde(default)]
    pub ephemeral: bool,
    /// A volume the driver did not create, taken on at its first stage (static provisioning);
    /// its directory is named by the hash of its id, which is not the driver's to trust.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
    /// What the volume was made from, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ContentSource>,
    /// A block volume: its directory holds a sparse image served through a loop device
    /// ([`crate::block`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub block: bool,
    /// A filesystem volume on a loop device ([`crate::loopfs`]): its data is the image
    /// `<state>/volumes/<id>.img` holding a filesystem of this type. `None`: a directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_type: Option<FsType>,
    /// Staging paths the volume is bind-mounted on (for a block volume: its loop device is
    /// attached for them).
    #[serde(default)]
    pub staged: BTreeSet<PathBuf>,
    /// Target paths the volume is published on.
    #[serde(default)]
    pub published: BTreeMap<PathBuf, Publication>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl VolumeRecord {
    /// Whether anything on this node still uses the volume.
    pub fn in_use(&self) -> bool {
        !self.staged.is_empty() || !self.published.is_empty()
    }

    /// The size the node shows: what it was expanded to, else the capacity.
    pub fn visible_size(&self) -> i64 {
        if self.node_size_bytes > 0 { self.node_size_bytes } else { self.capacity_bytes }
    }
}

/// A volume's attachment to a node (ControllerPublish).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub node: String,
    #[serde(default)]
    pub read_only: bool,
}

/// A volume's content source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ContentSource {
    Snapshot(String),
    Volume(String),
}

/// One published target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    #[serde(default)]
    pub read_only: bool,
}

/// One snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub name: String,
    pub source_volume_id: String,
    /// The source volume's capacity when the snapshot was taken: the least a restore needs.
    pub size_bytes: i64,
    pub created_seconds: i64,
    pub created_nanos: i32,
    /// The group snapshot this snapshot was taken in, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group_snapshot_id: String,
    /// A snapshot of a loop-backed volume: its directory holds the copied image
    /// ([`crate::loopfs::SNAPSHOT_IMAGE`]) with a filesystem of this type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_type: Option<FsType>,
}

/// One group snapshot: snapshots of several volumes, all recorded in one commit or none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSnapshotRecord {
    pub name: String,
    /// The member snapshots' ids, in the order of the source volumes asked for.
    pub snapshot_ids: Vec<String>,
    pub created_seconds: i64,
    pub created_nanos: i32,
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// The volume id CreateVolume gives the name `name`: the same name always gets the same id.
pub fn volume_id_for_name(name: &str) -> String {
    format!("{VOLUME_PREFIX}{}", &sha256_hex(name)[..ID_HEX_LEN])
}

/// The snapshot id CreateSnapshot gives the name `name`.
pub fn snapshot_id_for_name(name: &str) -> String {
    format!("{SNAPSHOT_PREFIX}{}", &sha256_hex(name)[..ID_HEX_LEN])
}

/// The group snapshot id CreateVolumeGroupSnapshot gives the name `name`.
pub fn group_snapshot_id_for_name(name: &str) -> String {
    format!("{GROUP_PREFIX}{}", &sha256_hex(name)[..ID_HEX_LEN])
}

/// The id of the member snapshot of volume `volume_id` in group snapshot `group_id`.
pub fn member_snapshot_id(group_id: &str, volume_id: &str) -> String {
    snapshot_id_for_name(&format!("{group_id}/{volume_id}"))
}

/// The directory name of an ephemeral volume: its id is the kubelet's, so it is hashed rather
/// than trusted as a path component.
pub fn ephemeral_dir_name(volume_id: &str) -> String {
    sha256_hex(volume_id)[..ID_HEX_LEN].to_string()
}

fn has_id_form(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix).is_some_and(|hex| {
        hex.len() == ID_HEX_LEN && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Whether `id` has the form of a persistent volume id this driver makes.
pub fn is_volume_id(id: &str) -> bool {
    has_id_form(id, VOLUME_PREFIX)
}

/// Whether `id` has the form of a snapshot id this driver makes.
pub fn is_snapshot_id(id: &str) -> bool {
    has_id_form(id, SNAPSHOT_PREFIX)
}

/// Whether `id` has the form of a group snapshot id this driver makes.
pub fn is_group_snapshot_id(id: &str) -> bool {
    has_id_form(id, GROUP_PREFIX)
}

/// The directories under the state directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    pub fn new(state_dir: &Path) -> Layout {
        Layout { root: state_dir.to_path_buf() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn state_file(&self) -> PathBuf {
        self.root.join("state.json")
    }

    pub fn volumes(&self) -> PathBuf {
        self.root.join("volumes")
    }

    pub fn snapshots(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    pub fn ephemeral(&self) -> PathBuf {
        self.root.join("ephemeral")
    }

    pub fn adopted(&self) -> PathBuf {
        self.root.join("static")
    }

    /// Where the data of volume `id` lives.
    pub fn volume_dir(&self, id: &str, record: &VolumeRecord) -> PathBuf {
        if record.ephemeral {
            self.ephemeral().join(ephemeral_dir_name(id))
        } else if record.adopted {
            self.adopted().join(ephemeral_dir_name(id))
        } else {
            self.volumes().join(id)
        }
    }

    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.snapshots().join(id)
    }

    /// The image of loop-backed volume `id`: `<state>/volumes/<id>.img`.
    pub fn volume_image(&self, id: &str) -> PathBuf {
        self.volumes().join(format!("{id}.img"))
    }

    /// The image in the snapshot `id` of a loop-backed volume.
    pub fn snapshot_image(&self, id: &str) -> PathBuf {
        self.snapshot_dir(id).join(crate::loopfs::SNAPSHOT_IMAGE)
    }

    /// Creates the state directory and its subdirectories.
    pub fn create(&self) -> Result<(), CsiError> {
        for dir in [self.root.clone(), self.volumes(), self.snapshots(), self.ephemeral()] {
            std::fs::create_dir_all(&dir).map_err(|e| CsiError::io("create directory", &dir, e))?;
        }
        Ok(())
    }
}

impl State {
    pub fn new() -> State {
        State { version: STATE_VERSION, ..State::default() }
    }

    /// Reads the state file; a missing file is an empty state.
    pub fn load(path: &Path) -> Result<State, CsiError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::new()),
            Err(e) => return Err(CsiError::io("read", path, e)),
        };
        let invalid = |reason: String| {
            CsiError::io("load", path, std::io::Error::new(std::io::ErrorKind::InvalidData, reason))
        };
        let state: State = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        if state.version != STATE_VERSION {
            return Err(invalid(format!("state version {} is not {STATE_VERSION}", state.version)));
        }
        Ok(state)
    }

    /// Replaces the state file atomically: a crash leaves the old file or the new one.
    pub fn save(&self, path: &Path) -> Result<(), CsiError> {
        let mut text = serde_json::to_string_pretty(self)
            .map_err(|e| CsiError::io("encode", path, std::io::Error::other(e)))?;
        text.push('\n');
        fsutil::write_atomically(path, text.as_bytes())
    }

    /// The volume staged on `path`, if any.
    pub fn staged_on(&self, path: &Path) -> Option<&str> {
        self.volumes.iter().find(|(_, v)| v.staged.contains(path)).map(|(id, _)| id.as_str())
    }

    /// The volume published on `path` and how, if any.
    pub fn published_on(&self, path: &Path) -> Option<(&str, Publication)> {
        self.volumes.iter().find_map(|(id, v)| v.published.get(path).map(|p| (id.as_str(), *p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_deterministic_distinct_and_recognised() {
        let a = volume_id_for_name("pvc-1");
        assert_eq!(a, volume_id_for_name("pvc-1"));
        assert_ne!(a, volume_id_for_name("pvc-2"));
        assert_eq!(a.len(), 4 + 32);
        let s = snapshot_id_for_name("pvc-1");
        assert!(s.starts_with("snap-") && s[5..] == a[4..], "same name, same hash: {s} {a}");
        let cases: &[(&str, bool, bool)] = &[
            (&a, true, false),
            (&s, false, true),
            ("vol-", false, false),
            ("vol-0123456789abcdef0123456789abcdeF", false, false),
            ("vol-0123456789abcdef0123456789abcdef0", false, false),
            ("vol-0123456789abcdef0123456789abcdef", true, false),
            ("snap-0123456789abcdef0123456789abcdef", false, true),
            ("csi-0123456789abcdef0123456789abcdef", false, false),
            ("invalid-token", false, false),
        ];
        for (id, volume, snapshot) in cases {
            assert_eq!((is_volume_id(id), is_snapshot_id(id)), (*volume, *snapshot), "{id}");
        }
        let e = ephemeral_dir_name("csi-abc/../x");
        assert_eq!(e.len(), 32);
        assert!(!e.contains('/'));
    }

    #[test]
    fn volume_dirs_depend_on_the_kind() {
        let layout = Layout::new(Path::new("/s"));
        let persistent = VolumeRecord::default();
        let ephemeral = VolumeRecord { ephemeral: true, ..VolumeRecord::default() };
        assert_eq!(layout.volume_dir("vol-1", &persistent), Path::new("/s/volumes/vol-1"));
        let dir = layout.volume_dir("csi-x", &ephemeral);
        assert_eq!(dir.parent().unwrap(), Path::new("/s/ephemeral"));
        assert_eq!(dir.file_name().unwrap().to_str().unwrap(), ephemeral_dir_name("csi-x"));
        assert_eq!(layout.snapshot_dir("snap-1"), Path::new("/s/snapshots/snap-1"));
        assert_eq!(layout.state_file(), Path::new("/s/state.json"));
    }

    #[test]
    fn state_round_trips_through_the_file_and_missing_means_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(State::load(&path).unwrap(), State::new());
        let mut state = State::new();
        let mut v = VolumeRecord {
            name: "pvc".into(),
            capacity_bytes: 1 << 20,
            source: Some(ContentSource::Snapshot("snap-1".into())),
            fs_type: Some(FsType::Ext4),
            ..VolumeRecord::default()
        };
        v.staged.insert("/stage".into());
        v.published.insert("/target".into(), Publication { read_only: true });
        state.volumes.insert("vol-1".into(), v);
        state.snapshots.insert(
            "snap-1".into(),
            SnapshotRecord {
                name: "s".into(),
                source_volume_id: "vol-0".into(),
                size_bytes: 5,
                created_seconds: 7,
                created_nanos: 9,
                group_snapshot_id: String::new(),
                fs_type: Some(FsType::Xfs),
            },
        );
        state.save(&path).unwrap();
        assert_eq!(State::load(&path).unwrap(), state);
        assert_eq!(state.staged_on(Path::new("/stage")), Some("vol-1"));
        assert_eq!(state.staged_on(Path::new("/target")), None);
        assert_eq!(
            state.published_on(Path::new("/target")),
            Some(("vol-1", Publication { read_only: true }))
        );
        assert!(state.volumes["vol-1"].in_use());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["state.json"], "no temporary file is left behind");
    }

    #[test]
    fn a_damaged_or_foreign_state_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, "{not json").unwrap();
        let err = State::load(&path).unwrap_err().to_string();
        assert!(err.starts_with(&format!("cannot load {}: ", path.display())), "{err}");
        std::fs::write(&path, r#"{"version": 2}"#).unwrap();
        let err = State::load(&path).unwrap_err().to_string();
        assert!(err.contains("state version 2 is not 1"), "{err}");
    }
}
