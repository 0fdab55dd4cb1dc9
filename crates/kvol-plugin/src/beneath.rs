//! Paths under kvol's root opened, created, removed and re-owned relative to opened directories, never following a symlink or crossing a mount.
//!
//! Names from manifests become path segments under the kubelet root. Validation refuses the
//! bad ones, but a validation bug must not be enough to escape: every operation here starts
//! at an opened directory and resolves one plain component at a time with `O_NOFOLLOW`
//! (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` opens a whole path in one call
//! where the kernel has it). A `..`, `.` or absolute component is refused before any syscall.
//! Recursive removal and the `fsGroup` walk never follow a symlink and never step into
//! another mount: removal refuses, the walk leaves the other mount alone.

use std::ffi::{CStr, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{
    AtFlags, CWD, Dir, FileType, Gid, Mode, OFlags, ResolveFlags, Statx, StatxFlags, chownat, mkdirat,
    openat, openat2, statx, unlinkat,
};
use rustix::io::Errno;

/// Why a name cannot be one path segment: empty, `.`, `..`, or containing `/` or NUL.
pub fn check_segment(segment: &str) -> Result<(), String> {
    match segment {
        "" => Err("a path segment must not be empty".to_string()),
        "." | ".." => Err(format!("{segment:?} is not a path segment")),
        s if s.contains('/') => Err(format!("{s:?} contains \"/\"")),
        s if s.contains('\0') => Err(format!("{s:?} contains NUL")),
        _ => Ok(()),
    }
}

fn errno(e: Errno) -> io::Error {
    io::Error::from(e)
}

/// The error for a symlink (or, from `openat2`, an escape) met on the way to `path`.
fn refused(path: &Path, e: Errno) -> io::Error {
    match e {
        Errno::LOOP | Errno::XDEV | Errno::NOTDIR => io::Error::other(format!(
            "refusing {}: a symlink (or a non-directory, or a path leaving the root) is in the way, and kvol never follows one under its root",
            path.display()
        )),
        e => errno(e),
    }
}

const DIR_FLAGS: OFlags =
    OFlags::RDONLY.union(OFlags::DIRECTORY).union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

/// What `statx` says about an open descriptor: type, mode, owner, device and mount.
fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<Statx> {
    statx(
        fd,
        c"",
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
    )
    .map_err(errno)
}

/// The mount an inode is on: its mount id where the kernel reports one, else its device.
fn mount_of(st: &Statx) -> (u64, u32, u32) {
    let id = if st.stx_mask & StatxFlags::MNT_ID.bits() != 0 { st.stx_mnt_id } else { 0 };
    (id, st.stx_dev_major, st.stx_dev_minor)
}

fn file_type(st: &Statx) -> FileType {
    FileType::from_raw_mode(u32::from(st.stx_mode))
}

/// An opened directory that paths are resolved beneath.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

impl Root {
    /// Opens `path` (created if missing, mode 0750) as the root; the root itself is trusted
    /// configuration, so symlinks above and at it are followed.
    pub fn open(path: &Path) -> io::Result<Root> {
        std::fs::create_dir_all(path)?;
        let fd = openat(CWD, path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(errno)?;
        Ok(Root { fd, path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The plain components of `path` (absolute under the root, or relative to it); a `..`,
    /// `.` or a path outside the root is refused.
    fn components<'a>(&self, path: &'a Path) -> io::Result<Vec<&'a OsStr>> {
        let relative = if path.is_absolute() {
            path.strip_prefix(&self.path).map_err(|_| {
                io::Error::other(format!(
                    "refusing {}: it is not under {}",
                    path.display(),
                    self.path.display()
                ))
            })?
        } else {
            path
        };
        relative
            .components()
            .map(|c| match c {
                Component::Normal(name) => Ok(name),
                _ => Err(io::Error::other(format!(
                    "refusing {}: only plain names may follow {}",
                    path.display(),
                    self.path.display()
                ))),
            })
            .collect()
    }

    /// Opens the directory at `path` under the root without following any symlink.
    pub fn open_dir(&self, path: &Path) -> io::Result<OwnedFd> {
        let parts = self.components(path)?;
        if parts.is_empty() {
            return openat(&self.fd, c".", DIR_FLAGS, Mode::empty()).map_err(errno);
        }
        let relative: PathBuf = parts.iter().collect();
        let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        match openat2(&self.fd, &relative, DIR_FLAGS, Mode::empty(), resolve) {
            // No openat2 (old kernel, or a seccomp filter): one component at a time.
            Err(Errno::NOSYS | Errno::PERM) => self.walk(path, &parts, None),
            other => other.map_err(|e| refused(path, e)),
        }
    }

    /// Opens every component in turn with `O_NOFOLLOW`, creating missing ones with `mode`
    /// when given.
    fn walk(&self, path: &Path, parts: &[&OsStr], create: Option<u32>) -> io::Result<OwnedFd> {
        let mut dir = openat(&self.fd, c".", DIR_FLAGS, Mode::empty()).map_err(errno)?;
        for part in parts {
            if let Some(mode) = create {
                match mkdirat(&dir, *part, Mode::from_raw_mode(mode)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(errno(e)),
                }
            }
            dir = openat(&dir, *part, DIR_FLAGS, Mode::empty()).map_err(|e| refused(path, e))?;
        }
        Ok(dir)
    }

    /// Creates the directory at `path` and its missing parents (mode `mode`, less the umask)
    /// without following any symlink, and opens it.
    pub fn create_dir_all(&self, path: &Path, mode: u32) -> io::Result<OwnedFd> {
        let parts = self.components(path)?;
        self.walk(path, &parts, Some(mode))
    }

    /// The parent directory of `path`, opened, and the last component's name.
    fn parent_of<'a>(&self, path: &'a Path) -> io::Result<(OwnedFd, &'a OsStr)> {
        let parts = self.components(path)?;
        let Some((last, parents)) = parts.split_last() else {
            return Err(io::Error::other(format!("refusing to remove the root {}", self.path.display())));
        };
        let parent: PathBuf = parents.iter().collect();
        Ok((self.open_dir(&parent)?, last))
    }

    /// Removes `path` (a file, a symlink itself, or an empty directory); already gone is success.
    pub fn remove_empty(&self, path: &Path) -> io::Result<()> {
        let (parent, name) = match self.parent_of(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            other => other?,
        };
        let result = match statx(&parent, name, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::TYPE) {
            Ok(st) if file_type(&st) == FileType::Directory => unlinkat(&parent, name, AtFlags::REMOVEDIR),
            Ok(_) => unlinkat(&parent, name, AtFlags::empty()),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(errno(e)),
        }
    }

    /// Removes `path` if it is an empty directory or an empty regular file, and nothing else
    /// (a symlink, a file with content or a directory with entries is kept, with an error);
    /// already gone is success.
    pub fn remove_if_empty(&self, path: &Path) -> io::Result<()> {
        let (parent, name) = match self.parent_of(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            other => other?,
        };
        let result = match statx(&parent, name, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BASIC_STATS) {
            Ok(st) if file_type(&st) == FileType::Directory => unlinkat(&parent, name, AtFlags::REMOVEDIR),
            Ok(st) if file_type(&st) == FileType::RegularFile && st.stx_size == 0 => {
                unlinkat(&parent, name, AtFlags::empty())
            }
            Ok(_) => {
                return Err(io::Error::other(
                    "it is not the empty directory or empty file kvol created, so it is kept",
                ));
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(errno(e)),
        }
    }

    /// Creates (or opens) the regular file at `path`, its missing parents as
    /// [`Root::create_dir_all`] does, never following a symlink, not even at `path` itself.
    pub fn create_file(&self, path: &Path, mode: u32) -> io::Result<OwnedFd> {
        let parts = self.components(path)?;
        let Some((last, parents)) = parts.split_last() else {
            return Err(io::Error::other(format!(
                "refusing to create the root {} as a file",
                self.path.display()
            )));
        };
        let parent = self.walk(path, parents, Some(0o750))?;
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        openat(&parent, *last, flags, Mode::from_raw_mode(mode)).map_err(|e| refused(path, e))
    }

    /// Checks that the directory holding `path` is reached from the root without a symlink;
    /// `Ok(false)` when it does not exist.
    pub fn parent_exists(&self, path: &Path) -> io::Result<bool> {
        match self.parent_of(path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes `path` and everything below it, never following a symlink (the link is
    /// removed, not its target) and refusing to enter another mount; already gone is success.
    pub fn remove_all(&self, path: &Path) -> io::Result<()> {
        let (parent, name) = match self.parent_of(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            other => other?,
        };
        let mount = mount_of(&stat_fd(parent.as_fd())?);
        match remove_entry(parent.as_fd(), name, mount, path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// Sets the permission bits of the directory at `path`, resolved without symlinks.
    pub fn chmod_dir(&self, path: &Path, mode: u32) -> io::Result<()> {
        let dir = self.open_dir(path)?;
        rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode)).map_err(errno)
    }
}

/// The names in an open directory, without `.` and `..`.
fn names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut out = Vec::new();
    for entry in Dir::read_from(dir).map_err(errno)? {
        let entry = entry.map_err(errno)?;
        let name: &CStr = entry.file_name();
        if name != c"." && name != c".." {
            out.push(OsStr::from_bytes(name.to_bytes()).to_os_string());
        }
    }
    Ok(out)
}

/// Removes `name` in `parent` recursively; `mount` is the parent's, which a directory must share.
fn remove_entry(parent: BorrowedFd<'_>, name: &OsStr, mount: (u64, u32, u32), path: &Path) -> io::Result<()> {
    // Without syncing: a mount of a filesystem that does not answer (a stopped FUSE daemon)
    // is told by the VFS alone, and refused before anything opens it.
    let flags = AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT | AtFlags::STATX_DONT_SYNC;
    let st = statx(parent, name, flags, StatxFlags::BASIC_STATS | StatxFlags::MNT_ID).map_err(errno)?;
    let mount_root = st.stx_attributes_mask.contains(rustix::fs::StatxAttributes::MOUNT_ROOT)
        && st.stx_attributes.contains(rustix::fs::StatxAttributes::MOUNT_ROOT);
    if mount_root || (file_type(&st) == FileType::Directory && mount_of(&st) != mount) {
        return Err(io::Error::other(format!(
            "refusing to delete through the mount at {}: unmount it first",
            path.display()
        )));
    }
    if file_type(&st) != FileType::Directory {
        return unlinkat(parent, name, AtFlags::empty()).map_err(errno);
    }
    let dir = openat(parent, name, DIR_FLAGS, Mode::empty()).map_err(|e| refused(path, e))?;
    if mount_of(&stat_fd(dir.as_fd())?) != mount {
        return Err(io::Error::other(format!(
            "refusing to delete through the mount at {}: unmount it first",
            path.display()
        )));
    }
    for child in names(dir.as_fd())? {
        remove_entry(dir.as_fd(), &child, mount, &path.join(&child))?;
    }
    unlinkat(parent, name, AtFlags::REMOVEDIR).map_err(errno)
}

/// Whether a volume root needs the `fsGroup` walk under `fsGroupChangePolicy: OnRootMismatch`
/// (kubelet's rule): not when the root is a directory of group `gid` whose permission bits
/// include `g+rwx` (`g+rx` read-only), owner likewise, and setgid.
pub fn root_mismatches(gid: u32, mode: u32, is_dir: bool, fs_group: u32, read_only: bool) -> bool {
    let wanted = if read_only { 0o440 } else { 0o660 } | 0o110;
    gid != fs_group || !is_dir || mode & wanted != wanted || mode & 0o2000 == 0
}

/// The root's group and mode and whether it is a directory, read without following a symlink.
pub fn root_ownership(root: &Path) -> io::Result<(u32, u32, bool)> {
    let st = statx(CWD, root, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BASIC_STATS).map_err(errno)?;
    Ok((st.stx_gid, u32::from(st.stx_mode) & 0o7777, file_type(&st) == FileType::Directory))
}

/// What the `fsGroup` walk changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkCount {
    /// Inodes given the group (and, except symlinks, the group bits).
    pub changed: u64,
    /// Directories left alone because they are another mount.
    pub other_mounts: u64,
}

/// Gives group `gid` every inode of the volume at `root` (upstream's `SetVolumeOwnership`):
/// files gain `g+rw` (`g+r` read-only), directories also `g+x` and setgid; symlinks get the
/// group but are never followed, and no other mount is entered. Every inode is opened with
/// `O_PATH | O_NOFOLLOW` relative to its opened directory and changed through that descriptor.
pub fn apply_fs_group(root: &Path, gid: u32, read_only: bool) -> io::Result<WalkCount> {
    let fd = openat(CWD, root, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| refused(root, e))?;
    let st = stat_fd(fd.as_fd())?;
    if file_type(&st) == FileType::Symlink {
        return Err(refused(root, Errno::LOOP));
    }
    let mut count = WalkCount::default();
    let file_bits = if read_only { 0o440 } else { 0o660 };
    let mut walk = Walk { gid, file_bits, mount: mount_of(&st), count: &mut count };
    walk.visit(fd, &st, root)?;
    Ok(count)
}

/// Gives a pod's `fsGroup` (`group`) the volume at `root`, as kubelet does after setting up a
/// volume that takes it (emptyDir; a CSI volume its driver does not give it to) through [`apply_fs_group`] (no
/// symlink followed, no other mount entered); under `OnRootMismatch`, only when the root's
/// group and mode do not already match.
pub fn apply_pod_fs_group(
    root: &Path,
    group: i64,
    policy: crate::plugin::FsGroupChangePolicy,
    read_only: bool,
) -> crate::Result<()> {
    let gid = u32::try_from(group).map_err(|_| {
        let reason =
            io::Error::new(io::ErrorKind::InvalidInput, format!("fsGroup {group} is not a group ID"));
        crate::PluginError::io("apply fsGroup to", root, reason)
    })?;
    if policy == crate::plugin::FsGroupChangePolicy::OnRootMismatch {
        let (root_gid, mode, is_dir) =
            root_ownership(root).map_err(|e| crate::PluginError::io("inspect", root, e))?;
        if !root_mismatches(root_gid, mode, is_dir, gid, read_only) {
            tracing::debug!(path = %root.display(), gid, "fsGroup: the root already matches, no walk");
            return Ok(());
        }
    }
    let count = apply_fs_group(root, gid, read_only)
        .map_err(|e| crate::PluginError::io("apply fsGroup to", root, e))?;
    tracing::debug!(path = %root.display(), gid, changed = count.changed, other_mounts = count.other_mounts, "fsGroup applied");
    Ok(())
}

/// The pod's `fsGroup` given to a volume it just set up, with its change policy, as kubelet's
/// `SetVolumeOwnership` gives it for the plugins that take one (local volumes, Flexvolume):
/// nothing for a pod without an fsGroup or a read-only volume.
pub fn give_pod_fs_group(root: &Path, pod: &crate::plugin::PodInfo, read_only: bool) -> crate::Result<()> {
    match pod.fs_group {
        Some(group) if !read_only => apply_pod_fs_group(root, group, pod.fs_group_change_policy, false),
        _ => Ok(()),
    }
}

struct Walk<'a> {
    gid: u32,
    file_bits: u32,
    mount: (u64, u32, u32),
    count: &'a mut WalkCount,
}

impl Walk<'_> {
    /// Changes the inode behind `fd` (an `O_PATH` descriptor) and, for a directory on the
    /// volume's mount, everything below it.
    fn visit(&mut self, fd: OwnedFd, st: &Statx, path: &Path) -> io::Result<()> {
        let kind = file_type(st);
        if kind == FileType::Directory && mount_of(st) != self.mount {
            self.count.other_mounts += 1;
            return Ok(());
        }
        let gid = Gid::from_raw(self.gid);
        chownat(&fd, c"", None, Some(gid), AtFlags::EMPTY_PATH).map_err(|e| at(path, "chown", e))?;
        self.count.changed += 1;
        if kind == FileType::Symlink {
            return Ok(());
        }
        let mut bits = self.file_bits;
        if kind == FileType::Directory {
            bits |= 0o2000 | 0o110;
        }
        let mode = u32::from(st.stx_mode) & 0o7777;
        if mode | bits != mode {
            // An O_PATH descriptor has no fchmod; its /proc magic link names the very inode
            // opened (never a symlink: those returned above).
            let magic = format!("/proc/self/fd/{}", fd.as_raw_fd());
            rustix::fs::chmod(magic.as_str(), Mode::from_raw_mode(mode | bits))
                .map_err(|e| at(path, "chmod", e))?;
        }
        if kind != FileType::Directory {
            return Ok(());
        }
        let dir = openat(&fd, c".", DIR_FLAGS, Mode::empty()).map_err(|e| at(path, "open", e))?;
        for name in names(dir.as_fd())? {
            let child_path = path.join(&name);
            let child =
                match openat(&dir, &name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()) {
                    Err(Errno::NOENT) => continue,
                    other => other.map_err(|e| at(&child_path, "open", e))?,
                };
            let child_st = stat_fd(child.as_fd())?;
            self.visit(child, &child_st, &child_path)?;
        }
        Ok(())
    }
}

fn at(path: &Path, action: &str, e: Errno) -> io::Error {
    io::Error::new(
        io::Error::from(e).kind(),
        format!("cannot {action} {}: {}", path.display(), io::Error::from(e)),
    )
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    use super::*;

    #[test]
    fn segments_that_would_leave_their_directory_are_refused() {
        let cases: &[(&str, Option<&str>)] = &[
            ("cache", None),
            ("uid-1", None),
            ("..x", None),
            ("", Some("a path segment must not be empty")),
            (".", Some("\".\" is not a path segment")),
            ("..", Some("\"..\" is not a path segment")),
            ("a/b", Some("\"a/b\" contains \"/\"")),
            ("/abs", Some("\"/abs\" contains \"/\"")),
            ("a\0", Some("\"a\\0\" contains NUL")),
        ];
        for (segment, want) in cases {
            assert_eq!(check_segment(segment).err().as_deref(), *want, "{segment:?}");
        }
    }

    #[test]
    fn kubelet_rule_for_a_matching_root() {
        // (gid, mode, is_dir, read_only, mismatches)
        let cases = [
            (2000, 0o2770, true, false, false),
            (2000, 0o2775, true, false, false),
            (2000, 0o2550, true, true, false),
            (2000, 0o2550, true, false, true),
            (2000, 0o0770, true, false, true),
            (2000, 0o2760, true, false, true),
            (1000, 0o2770, true, false, true),
            (2000, 0o2770, false, false, true),
        ];
        for (gid, mode, is_dir, read_only, want) in cases {
            assert_eq!(root_mismatches(gid, mode, is_dir, 2000, read_only), want, "{gid} {mode:o} {is_dir}");
        }
    }

    #[test]
    fn components_must_be_plain_and_under_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap();
        for bad in ["../x", "a/../../x", "./a"] {
            let err = root.create_dir_all(Path::new(bad), 0o750).unwrap_err();
            assert!(err.to_string().contains("only plain names may follow"), "{bad}: {err}");
        }
        let err = root.create_dir_all(Path::new("/srv/x"), 0o750).unwrap_err();
        assert!(err.to_string().contains("is not under"), "{err}");
        root.create_dir_all(&dir.path().join("a/b"), 0o750).unwrap();
        assert!(dir.path().join("a/b").is_dir());
    }

    #[test]
    fn a_symlink_on_the_way_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir(outside.path().join("victim")).unwrap();
        fs::write(outside.path().join("victim/keep"), b"k").unwrap();
        let root = Root::open(&dir.path().join("root")).unwrap();
        fs::create_dir_all(dir.path().join("root/pods")).unwrap();
        symlink(outside.path(), dir.path().join("root/pods/uid")).unwrap();
        let target = dir.path().join("root/pods/uid/victim");
        let err = root.create_dir_all(&target, 0o777).unwrap_err();
        assert!(err.to_string().contains("kvol never follows one"), "{err}");
        let err = root.open_dir(&target).unwrap_err();
        assert!(err.to_string().contains("kvol never follows one"), "{err}");
        root.remove_all(&target).unwrap_err();
        // The link itself goes, its target stays.
        root.remove_all(&dir.path().join("root/pods/uid")).unwrap();
        assert!(outside.path().join("victim/keep").exists());
        assert!(!dir.path().join("root/pods/uid").exists());
    }

    #[test]
    fn remove_all_deletes_links_not_what_they_point_at() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("keep"), b"k").unwrap();
        let root = Root::open(dir.path()).unwrap();
        let volume = dir.path().join("pods/u/volumes/p/v");
        root.create_dir_all(&volume.join("sub"), 0o777).unwrap();
        symlink(outside.path(), volume.join("sub/link")).unwrap();
        symlink(outside.path().join("keep"), volume.join("file-link")).unwrap();
        fs::write(volume.join("sub/f"), b"x").unwrap();
        root.remove_all(&volume).unwrap();
        assert!(!volume.exists());
        assert!(outside.path().join("keep").exists());
        root.remove_all(&volume).unwrap();
    }

    #[test]
    fn fs_group_walk_never_leaves_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        fs::create_dir(&victim).unwrap();
        fs::write(victim.join("f"), b"x").unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(victim.join("f"), fs::Permissions::from_mode(0o600)).unwrap();
        let volume = dir.path().join("vol");
        fs::create_dir_all(volume.join("d")).unwrap();
        fs::write(volume.join("d/file"), b"x").unwrap();
        fs::set_permissions(volume.join("d/file"), fs::Permissions::from_mode(0o600)).unwrap();
        symlink(&victim, volume.join("to-dir")).unwrap();
        symlink(victim.join("f"), volume.join("d/to-file")).unwrap();
        let before = (fs::metadata(&victim).unwrap(), fs::metadata(victim.join("f")).unwrap());
        let gid = 4321;
        let count = apply_fs_group(&volume, gid, false).unwrap();
        assert_eq!(count, WalkCount { changed: 5, other_mounts: 0 });
        let file = fs::metadata(volume.join("d/file")).unwrap();
        assert_eq!((file.gid(), file.mode() & 0o7777), (gid, 0o660));
        let d = fs::metadata(volume.join("d")).unwrap();
        assert_eq!((d.gid(), d.mode() & 0o2070), (gid, 0o2070));
        assert_eq!(fs::symlink_metadata(volume.join("to-dir")).unwrap().gid(), gid);
        let after = (fs::metadata(&victim).unwrap(), fs::metadata(victim.join("f")).unwrap());
        for (b, a) in [(&before.0, &after.0), (&before.1, &after.1)] {
            assert_eq!((b.uid(), b.gid(), b.mode()), (a.uid(), a.gid(), a.mode()));
        }
        let (root_gid, mode, is_dir) = root_ownership(&volume).unwrap();
        assert!(!root_mismatches(root_gid, mode, is_dir, gid, false));
        let link_root = dir.path().join("link-root");
        symlink(&victim, &link_root).unwrap();
        assert!(
            apply_fs_group(&link_root, gid, false).is_err(),
            "a volume root that is a symlink is refused"
        );
    }
}
