//! The compiled-in local plugins: emptyDir, hostPath, local persistent volumes, and the volumes made of API objects (configMap, secret, downwardAPI, projected), on real mounts.
//!
//! Their syscalls run inline in the async lifecycle calls: local mounts and binds return at
//! once, and running them on the calling thread keeps them in that thread's mount namespace.

pub mod atomic_writer;
pub mod empty_dir;
pub mod host_path;
pub mod local_volume;
pub mod node_affinity;
pub mod pod_objects;
pub use kvol_api::quantity;

pub use empty_dir::EmptyDirPlugin;
pub use host_path::HostPathPlugin;
pub use local_volume::LocalVolumePlugin;
pub use pod_objects::PodObjectPlugin;

use std::cmp::Reverse;
use std::fs;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use crate::beneath::Root;
use crate::error::{PluginError, Result};
use crate::mount::{MountPoint, Mounter};

/// What a path is, in upstream's terms (`hostutil.FileType`), after following symlinks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    File,
    Socket,
    CharDevice,
    BlockDevice,
    /// A named pipe: the one kind upstream does not recognise.
    Fifo,
}

impl FileKind {
    /// Upstream's spelling (`Directory`, `File`, `Socket`, `CharDevice`, `BlockDevice`).
    pub const fn type_name(self) -> &'static str {
        match self {
            FileKind::Directory => "Directory",
            FileKind::File => "File",
            FileKind::Socket => "Socket",
            FileKind::CharDevice => "CharDevice",
            FileKind::BlockDevice => "BlockDevice",
            FileKind::Fifo => "FIFO",
        }
    }

    fn of(file_type: fs::FileType) -> FileKind {
        if file_type.is_dir() {
            FileKind::Directory
        } else if file_type.is_file() {
            FileKind::File
        } else if file_type.is_socket() {
            FileKind::Socket
        } else if file_type.is_char_device() {
            FileKind::CharDevice
        } else if file_type.is_block_device() {
            FileKind::BlockDevice
        } else {
            // stat(2) follows symlinks, so what is left is a FIFO.
            FileKind::Fifo
        }
    }
}

/// What `path` is, following symlinks; `None` when it does not exist.
pub fn file_kind(path: &Path) -> io::Result<Option<FileKind>> {
    match fs::metadata(path) {
        Ok(metadata) => Ok(Some(FileKind::of(metadata.file_type()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether a path steps up with `..` (upstream's `ValidatePathNoBacksteps` refuses those).
pub fn has_backsteps(path: &Path) -> bool {
    path.components().any(|c| c == Component::ParentDir)
}

/// The path as the mount table spells it: its parent's symlinks resolved (mountinfo holds
/// resolved paths), the last component as given. The path itself is never looked at: it may be
/// a mount whose filesystem does not answer.
pub fn mount_table_path(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => {
            fs::canonicalize(parent).map_or_else(|_| path.to_path_buf(), |p| p.join(name))
        }
        _ => fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// The mounts at or below `path`, deepest first and, at one depth, latest first: the order
/// they can be unmounted in.
pub fn mounts_at_or_below(mounter: &dyn Mounter, path: &Path) -> Result<Vec<MountPoint>> {
    let mut mounts = mounter.mounts_under(&mount_table_path(path))?;
    mounts.reverse();
    mounts.sort_by_key(|m| Reverse(m.target.components().count()));
    Ok(mounts)
}

/// Whether something is mounted exactly on `path`.
pub fn is_mounted(mounter: &dyn Mounter, path: &Path) -> Result<bool> {
    Ok(mounter.is_mount_point(&mount_table_path(path))?)
}

/// Takes a bind-mounted target down: unmounts whatever is mounted at or below it (a recursive
/// bind brings the source's submounts along), then removes the target, which is then the
/// empty directory or empty file publish created. Never deletes anything else: a target that
/// is not empty after unmounting is an error. A target already gone is success.
///
/// The target's directory is first reached from `root` without a symlink: a pod directory
/// swapped for a link to elsewhere is refused before any unmount, so nothing outside the root
/// is unmounted or removed. The mounts come from the mount table and go before the target is
/// looked at, so a mount whose filesystem does not answer (a stopped FUSE daemon) is unmounted
/// without being touched.
pub fn unmount_and_remove_target(mounter: &dyn Mounter, root: &Root, target: &Path) -> Result<()> {
    if !root.parent_exists(target).map_err(|e| PluginError::io("reach", target, e))? {
        return Ok(());
    }
    for mount in mounts_at_or_below(mounter, target)? {
        mounter.unmount(&mount.target)?;
    }
    remove_empty(root, target)
}

/// Removes an empty directory or an empty regular file under `root`, and nothing else,
/// through its opened parent (never through a symlink).
pub fn remove_empty(root: &Root, path: &Path) -> Result<()> {
    root.remove_if_empty(path).map_err(|e| PluginError::io("remove", path, e))
}

/// Creates the directory under `root` and its parents, each new one with `mode` (less the
/// umask), never following a symlink.
pub fn create_dir_all(root: &Root, path: &Path, mode: u32) -> Result<()> {
    root.create_dir_all(path, mode).map(drop).map_err(|e| PluginError::io("create directory", path, e))
}

/// Publishes `source` at `target` (under `root`) by a bind mount, creating the target as a
/// directory or, when the source is not one, as an empty file. Already published: nothing to
/// do. A failed bind leaves no target behind.
///
/// The target and its parents are created through [`Root`], so none of them is a symlink when
/// the bind runs; the bind is then given that verified path (the mount seam takes paths). Only
/// root can write the directories on the way (`pods/<uid>/volumes/<plugin>`), so nothing can
/// swap them between the walk and the mount.
pub fn bind_to_target(
    mounter: &dyn Mounter,
    root: &Root,
    source: &Path,
    target: &Path,
    source_is_dir: bool,
    read_only: bool,
) -> Result<()> {
    if let Some(parent) = target.parent() {
        create_dir_all(root, parent, 0o750)?;
    }
    if is_mounted(mounter, target)? {
        return Ok(());
    }
    if source_is_dir {
        create_dir_all(root, target, 0o750)?;
    } else {
        root.create_file(target, 0o640).map_err(|e| PluginError::io("create file", target, e))?;
    }
    if let Err(e) = mounter.bind(source, target, read_only) {
        let _ = remove_empty(root, target);
        return Err(e.into());
    }
    Ok(())
}

/// Shared pieces of the local plugins' unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use std::future::Future;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use crate::host::{NodeInfo, NodePaths, PluginHost};
    use crate::mount::RecordingMounter;
    use crate::plugin::{PodInfo, PublishRequest, UnpublishRequest};
    use crate::spec::VolumeSpec;

    pub static POD: PodInfo = PodInfo {
        name: String::new(),
        namespace: String::new(),
        uid: String::new(),
        service_account: String::new(),
        fs_group: None,
        fs_group_change_policy: crate::plugin::FsGroupChangePolicy::Always,
        memory_limit: None,
    };

    /// A host rooted in a fresh temporary directory, on node `node-a`, with a recording mounter.
    pub fn recording_host() -> (tempfile::TempDir, PluginHost, Arc<RecordingMounter>) {
        let root = tempfile::tempdir().unwrap();
        let mounter = Arc::new(RecordingMounter::new());
        let host = PluginHost::new(NodePaths::new(root.path()), NodeInfo::named("node-a"), mounter.clone());
        (root, host, mounter)
    }

    pub fn publish_request<'a>(
        spec: &'a VolumeSpec,
        target: &'a Path,
        read_only: bool,
    ) -> PublishRequest<'a> {
        PublishRequest {
            spec,
            pod: &POD,
            pod_volume_name: spec.name(),
            target,
            staging_path: None,
            device_path: None,
            read_only,
            mount_options: &[],
            projection: None,
        }
    }

    pub fn unpublish_request(target: &Path) -> UnpublishRequest<'_> {
        UnpublishRequest { pod_uid: "", pod_volume_name: "", target, spec: None }
    }

    /// Runs a lifecycle call to completion on this thread.
    pub fn block_on<F: Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
    }

    /// Some block device node under /dev, if the machine has one.
    pub fn any_block_device() -> Option<PathBuf> {
        use std::os::unix::fs::FileTypeExt;
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir("/dev").ok()?.filter_map(|e| Some(e.ok()?.path())).collect();
        entries.sort();
        entries.into_iter().find(|p| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device()))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::mount::RecordingMounter;

    #[test]
    fn backsteps_are_path_components_only() {
        let cases = [
            ("/var/lib/data", false),
            ("/var/../etc", true),
            ("..", true),
            ("/var/lib/..", true),
            ("/var/..data/x", false),
            ("/var/data../x", false),
            ("relative/./x", false),
        ];
        for (path, expected) in cases {
            assert_eq!(has_backsteps(Path::new(path)), expected, "{path}");
        }
    }

    #[test]
    fn file_kinds_follow_symlinks_and_report_missing_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert_eq!(file_kind(dir.path()).unwrap(), Some(FileKind::Directory));
        assert_eq!(file_kind(&file).unwrap(), Some(FileKind::File));
        assert_eq!(file_kind(&link).unwrap(), Some(FileKind::File));
        assert_eq!(file_kind(&dangling).unwrap(), None);
        assert_eq!(file_kind(Path::new("/dev/null")).unwrap(), Some(FileKind::CharDevice));
    }

    #[test]
    fn unmounting_goes_deepest_first_and_removes_only_empty_targets() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::create_dir(&target).unwrap();
        let mounter = RecordingMounter::new();
        let root = Root::open(dir.path()).unwrap();
        mounter.bind(Path::new("/src"), &target, false).unwrap();
        mounter.mount("tmpfs", &target.join("inner"), "tmpfs", false, &[]).unwrap();
        unmount_and_remove_target(&mounter, &root, &target).unwrap();
        let unmounted: Vec<_> = mounter
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                crate::mount::MountCall::Unmount { target } => Some(target),
                _ => None,
            })
            .collect();
        assert_eq!(unmounted, [target.join("inner"), target.clone()]);
        assert!(!target.exists());
        // Gone already: success, and no calls.
        unmount_and_remove_target(&mounter, &root, &target).unwrap();
        assert_eq!(mounter.calls().len(), 4);
    }

    #[test]
    fn targets_with_content_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap();
        let full_dir = dir.path().join("full");
        fs::create_dir(&full_dir).unwrap();
        fs::write(full_dir.join("data"), b"keep").unwrap();
        let err = unmount_and_remove_target(&RecordingMounter::new(), &root, &full_dir).unwrap_err();
        assert!(err.to_string().starts_with(&format!("cannot remove {}", full_dir.display())), "{err}");
        assert!(full_dir.join("data").exists());

        let full_file = dir.path().join("file");
        fs::write(&full_file, b"keep").unwrap();
        let err = remove_empty(&root, &full_file).unwrap_err();
        assert!(
            err.to_string().contains("it is not the empty directory or empty file kvol created"),
            "{err}"
        );
        assert!(full_file.exists());

        let empty_file = dir.path().join("empty");
        fs::write(&empty_file, b"").unwrap();
        remove_empty(&root, &empty_file).unwrap();
        assert!(!empty_file.exists());
    }

    #[test]
    fn a_failed_bind_leaves_no_target() {
        let dir = tempfile::tempdir().unwrap();
        let mounter = RecordingMounter::new();
        mounter.fail_next(io::ErrorKind::PermissionDenied);
        let root = Root::open(dir.path()).unwrap();
        let target = dir.path().join("pod").join("target");
        let err = bind_to_target(&mounter, &root, Path::new("/dev/null"), &target, false, true).unwrap_err();
        assert!(err.to_string().contains("permission denied"), "{err}");
        assert!(!target.exists());
        assert!(dir.path().join("pod").is_dir(), "parents may stay: they are kvol's pod directories");
    }
}
