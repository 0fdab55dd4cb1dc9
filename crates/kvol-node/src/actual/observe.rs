//! What the node shows: the mount table, the pod volume directories and the CSI `vol_data.json` records beside them, read without opening a volume.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use kvol_csi::paths::{CSI_PLUGIN_NAME, GLOBAL_MOUNT, VolData, load_vol_data};
use kvol_plugin::{MountError, Mounter, NodePaths};

/// What a pod volume directory's `vol_data.json` says: `None` when there is none, the
/// record, or why it could not be read.
pub type VolDataRead = Option<Result<VolData, String>>;

/// A directory `<root>/pods/<uid>/volumes/<plugin dir>/<volume>` found on disk.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodVolumeDir {
    pub pod_uid: String,
    /// The plugin's directory name as on disk (`kubernetes.io~csi`).
    pub plugin_dir: String,
    pub volume: String,
    pub path: PathBuf,
}

/// What the node shows after a restart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeObservation {
    /// Every mount point of the agent's mount namespace.
    pub mount_points: BTreeSet<PathBuf>,
    /// Every pod volume directory, in path order.
    pub pod_volume_dirs: Vec<PodVolumeDir>,
    /// What the `vol_data.json` of each CSI pod volume directory says (absent: no file).
    pub vol_data: BTreeMap<PathBuf, VolDataRead>,
    /// Each CSI staging path (`plugins/kubernetes.io/csi/<driver>/<hash>/globalmount`) whose
    /// volume directory holds a readable `vol_data.json`.
    pub csi_staged: Vec<(PathBuf, VolData)>,
}

/// The node could not be observed.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error(transparent)]
    MountTable(#[from] MountError),
    #[error("cannot read directory {}: {source}", path.display())]
    ReadDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Reads the mount table and walks `<root>/pods/*/volumes/*/*`. A missing `pods` or
/// `volumes` directory (or one removed during the walk) is no error; entries of
/// `volumes/<plugin dir>/` are listed without being opened, so a hung network mount cannot
/// stall the walk.
pub fn observe(paths: &NodePaths, mounter: &dyn Mounter) -> Result<NodeObservation, ObserveError> {
    let mount_points = mounter.mount_points()?.into_iter().map(|m| m.target).collect();
    let pod_volume_dirs = pod_volume_dirs(paths)?;
    let csi_dir = kvol_plugin::host::escape_plugin_name(CSI_PLUGIN_NAME);
    let vol_data = pod_volume_dirs
        .iter()
        .filter(|d| d.plugin_dir == csi_dir)
        .map(|d| (d.path.clone(), load_vol_data(&d.path).map_err(|e| e.to_string()).transpose()))
        .collect();
    let mut csi_staged = Vec::new();
    for (_, driver_dir) in subdirectories(&paths.plugin_dir(CSI_PLUGIN_NAME))? {
        for (_, volume_dir) in subdirectories(&driver_dir)? {
            if let Ok(Some(data)) = load_vol_data(&volume_dir) {
                csi_staged.push((volume_dir.join(GLOBAL_MOUNT), data));
            }
        }
    }
    Ok(NodeObservation { mount_points, pod_volume_dirs, vol_data, csi_staged })
}

/// Every pod volume directory (`<root>/pods/*/volumes/*/*`), in path order, listed without
/// being opened.
pub fn pod_volume_dirs(paths: &NodePaths) -> Result<Vec<PodVolumeDir>, ObserveError> {
    let mut found = Vec::new();
    for (pod_uid, pod_dir) in subdirectories(&paths.root().join("pods"))? {
        for (plugin_dir, plugin_path) in subdirectories(&pod_dir.join("volumes"))? {
            for (volume, path) in entries(&plugin_path)? {
                found.push(PodVolumeDir {
                    pod_uid: pod_uid.clone(),
                    plugin_dir: plugin_dir.clone(),
                    volume,
                    path,
                });
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The entries of `dir` that are directories, by name; none if `dir` does not exist.
pub(crate) fn subdirectories(dir: &Path) -> Result<Vec<(String, PathBuf)>, ObserveError> {
    let mut found = Vec::new();
    for (name, path) in entries(dir)? {
        // symlink_metadata: never follow a link out of the kubelet tree.
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            found.push((name, path));
        }
    }
    Ok(found)
}

/// Every entry of `dir` (names lossily decoded), without opening them; none if `dir` does not
/// exist.
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf)>, ObserveError> {
    let read_error = |source| ObserveError::ReadDir { path: dir.to_path_buf(), source };
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read_error(e)),
    };
    let mut found = Vec::new();
    for entry in listing {
        let entry = entry.map_err(read_error)?;
        found.push((entry.file_name().to_string_lossy().into_owned(), entry.path()));
    }
    found.sort();
    Ok(found)
}
