//! A volumeMount's `subPath` bound for the runtime as kubelet v1.26 binds it — at `<pod dir>/volume-subpaths/<volume>/<container>/<index>` — without ever leaving the volume; and those bind mounts cleaned up without deleting through one.
//!
//! Facts from upstream (`pkg/volume/util/subpath/subpath_linux.go`, `pkg/kubelet/kubelet_pods.go`
//! `makeMounts`): the sub-path is checked (relative, no `..` element:
//! [`kvol_api::subpath_expr::validate_sub_path`]); when it does not exist it is created as
//! directories, each missing one made with `mkdirat` relative to its opened parent, opened
//! again with `O_NOFOLLOW` and `fchmod`ed to the volume directory's own mode (kubelet passes
//! `GetMode(volumePath)`: [`creation_mode`]); the sub-path is then opened component by
//! component, and the *descriptor* (not the path) is bind-mounted (`MS_BIND`, not recursive)
//! through `/proc/<pid>/fd/<fd>` on the target: an empty directory (mode 0750) for a directory,
//! an empty file (0640) for anything else, under parents made 0750. A target already mounted
//! with the same file is success; mounted with another, it is unmounted and bound again.
//! Cleanup unmounts each `<index>`, removes it, then the `<container>`, `<volume>` and
//! `volume-subpaths` directories when empty.
//!
//! Where kvol differs, or chose where kubelet is loose:
//! - **Symlinks inside the volume.** Kubelet resolves the whole host path with
//!   `filepath.EvalSymlinks`, refuses the result when it is not within the volume, then opens it
//!   with `O_NOFOLLOW` at each step (a symlink met then is a race, refused). So a symlink whose
//!   target stays inside the volume is followed — which is what makes `subPath: key` work on a
//!   configMap or secret volume, where `key → ..data/key` and `..data → ..<timestamp>` — and one
//!   that leaves it (`/etc`, `../../..`) is refused. Refusing every symlink would break those
//!   volumes, so kvol follows a symlink exactly when the kernel's `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_MAGICLINKS)` does: a relative target that never climbs above the volume. An
//!   *absolute* symlink is always refused, even one that names a place inside the volume (kubelet
//!   takes that one); a `/proc` magic link is refused. Where the kernel has no `openat2`
//!   ([`Resolver::Walk`]), kvol walks one component at a time from descriptors it holds
//!   (`openat(O_PATH | O_NOFOLLOW)`), reads each symlink and splices its target in, keeping `..`
//!   on its own stack of opened directories: the same rule, and nothing a concurrent rename can
//!   turn into an escape (resolution never restarts from a path).
//! - **Creating missing directories** happens only for the trailing, literal components of the
//!   sub-path that do not exist, below the longest prefix that resolves (beneath the volume, as
//!   above); a symlink where a directory is to be made is never followed (a dangling one is
//!   refused, as kubelet's `doSafeMakeDir` fails on it).
//! - **The target** (`dest`) is made and looked at beneath the pod directory with
//!   [`crate::beneath::Root`] (no symlink followed, not even at `dest`), and the mount is made
//!   onto `/proc/thread-self/fd/<fd>` of the target opened `O_PATH | O_NOFOLLOW`. After the mount,
//!   `dest` must be a mount point whose device and inode are those of the opened sub-path; if not,
//!   it is unmounted and the call fails. Kubelet trusts the mount.
//! - **Cleanup** finds mounts in the mount table (read once; the kernel formats it without asking
//!   any filesystem, so a dead FUSE or NFS volume cannot hang it), unmounts every mount stacked on
//!   an `<index>` (kubelet unmounts once), and removes only empty directories and empty files:
//!   what is not a mount and not empty is kept and reported, never deleted (kubernetes#72257: an
//!   orphan cleanup that took a bind mount for a directory and deleted the volume's data through
//!   it). A symlink or other stray entry is kept and reported; kubelet stops at the first one.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::mount::MsFlags;
use rustix::fs::{
    AtFlags, CWD, Dir, FileType, Mode, OFlags, ResolveFlags, Statx, StatxFlags, fchmod, mkdirat, openat,
    openat2, readlinkat, statx,
};
use rustix::io::Errno;

use crate::beneath::{Root, check_segment};
use crate::mount::{Mounter, SystemMounter};

/// The directory under a pod's directory that holds its sub-path bind mounts.
pub const SUBPATHS_DIR: &str = "volume-subpaths";

/// Kubelet's modes: the target's parents and a directory target (`MkdirAll`/`Mkdir` 0750),
/// a file target (`WriteFile` 0640).
const TARGET_DIR_MODE: u32 = 0o750;
const TARGET_FILE_MODE: u32 = 0o640;

/// Symlinks followed in one resolution before it is refused (the kernel's limit).
const MAX_SYMLINKS: usize = 40;

/// `openat2` answers `EAGAIN` when a rename raced a `..` it resolved; tries before refusing.
const RACE_RETRIES: usize = 16;

/// Mounts stacked on one target that cleanup (or a replacing prepare) will take off.
const MAX_STACKED: usize = 16;

/// How the sub-path is resolved beneath the volume.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Resolver {
    /// `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` where the kernel has it (5.6+, and no
    /// seccomp filter refusing it), else [`Resolver::Walk`].
    #[default]
    Auto,
    /// kvol's own walk, one component at a time from held descriptors, with the same rule.
    Walk,
}

/// A file as the kernel tells files apart: device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    pub dev_major: u32,
    pub dev_minor: u32,
    pub ino: u64,
}

impl FileId {
    fn of(st: &Statx) -> FileId {
        FileId { dev_major: st.stx_dev_major, dev_minor: st.stx_dev_minor, ino: st.stx_ino }
    }

    /// The device and inode of `path`, not following a symlink at it (a test's check).
    pub fn of_path(path: &Path) -> io::Result<FileId> {
        let st = statx(CWD, path, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BASIC_STATS)?;
        Ok(FileId::of(&st))
    }
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {}:{} inode {}", self.dev_major, self.dev_minor, self.ino)
    }
}

/// Why a sub-path was not bound. Messages are lower-case and carry the paths.
#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    /// The sub-path or a name breaks a rule before anything is looked at (kubelet's messages
    /// for the sub-path itself).
    #[error("{reason}")]
    Invalid { reason: String },
    /// Resolving the sub-path would leave the volume, or meets a symlink where none may be.
    #[error("refusing subPath {sub_path:?} of volume {}: {reason}", volume.display())]
    Refused { sub_path: String, volume: PathBuf, reason: String },
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// After the bind mount, the target showed another file than the one opened (or no mount);
    /// what was mounted there was unmounted again.
    #[error(
        "the bind mount at {} shows {found} where subPath {sub_path:?} of volume {} was opened as {expected}; it was unmounted",
        dest.display(), volume.display()
    )]
    NotWhatWasOpened { dest: PathBuf, sub_path: String, volume: PathBuf, expected: FileId, found: String },
}

impl SubPathError {
    /// The sub-path itself is refused (invalid, or leading out of the volume), as opposed to
    /// an I/O failure that a retry may get past.
    pub fn is_refusal(&self) -> bool {
        matches!(self, SubPathError::Invalid { .. } | SubPathError::Refused { .. })
    }

    fn io(op: &'static str, path: impl Into<PathBuf>, source: impl Into<io::Error>) -> SubPathError {
        SubPathError::Io { op, path: path.into(), source: source.into() }
    }
}

impl From<SubPathError> for crate::PluginError {
    fn from(e: SubPathError) -> Self {
        match e {
            SubPathError::Io { op, path, source } => crate::PluginError::Io { op, path, source },
            SubPathError::Invalid { reason } => {
                crate::PluginError::InvalidSpec { spec: "subPath".into(), reason }
            }
            SubPathError::Refused { sub_path, volume, reason } => crate::PluginError::InvalidSpec {
                spec: format!("subPath {sub_path:?} of volume {}", volume.display()),
                reason,
            },
            SubPathError::NotWhatWasOpened { ref dest, .. } => {
                let path = dest.clone();
                crate::PluginError::Io { op: "bind-mount a subPath onto", path, source: io::Error::other(e) }
            }
        }
    }
}

/// Where kubelet binds sub-path `index` (the volumeMount's position in the container's list) of
/// `volume` (the pod's name for it) for `container`: `<pod_dir>/volume-subpaths/<volume>/<container>/<index>`.
pub fn bind_target(
    pod_dir: &Path,
    volume: &str,
    container: &str,
    index: usize,
) -> Result<PathBuf, SubPathError> {
    for (what, name) in [("volume name", volume), ("container name", container)] {
        check_segment(name)
            .map_err(|reason| SubPathError::Invalid { reason: format!("{what} {name:?}: {reason}") })?;
    }
    Ok(pod_dir.join(SUBPATHS_DIR).join(volume).join(container).join(index.to_string()))
}

/// The mode kubelet creates a missing sub-path with: the volume directory's own (permission
/// bits and setuid, setgid, sticky), read following symlinks as `os.Stat` does.
pub fn creation_mode(volume_dir: &Path) -> Result<u32, SubPathError> {
    let st = statx(CWD, volume_dir, AtFlags::empty(), StatxFlags::MODE)
        .map_err(|e| SubPathError::io("inspect the volume directory", volume_dir, e))?;
    Ok(u32::from(st.stx_mode) & 0o7777)
}

/// The target path's parts: the pod directory and the three names below `volume-subpaths`.
#[derive(Debug)]
struct Target<'a> {
    pod_dir: PathBuf,
    dest: &'a Path,
    parent: &'a Path,
    name: &'a OsStr,
}

impl<'a> Target<'a> {
    fn parse(dest: &'a Path) -> Result<Target<'a>, SubPathError> {
        let bad = |why: &str| SubPathError::Invalid {
            reason: format!(
                "bind target {} is not <pod dir>/{SUBPATHS_DIR}/<volume>/<container>/<index>: {why}",
                dest.display()
            ),
        };
        if !dest.is_absolute() {
            return Err(bad("it is not absolute"));
        }
        if dest.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(bad("it has a \"..\" component"));
        }
        let names: Vec<&OsStr> = dest
            .components()
            .filter_map(|c| match c {
                Component::Normal(name) => Some(name),
                _ => None,
            })
            .collect();
        let [.., subpaths, volume, container, index] = names.as_slice() else {
            return Err(bad("it is too short"));
        };
        if *subpaths != OsStr::new(SUBPATHS_DIR) {
            return Err(bad(&format!("it is not below {SUBPATHS_DIR:?}")));
        }
        for name in [volume, container] {
            let name = name.to_str().ok_or_else(|| bad("a name is not UTF-8"))?;
            check_segment(name).map_err(|why| bad(&why))?;
        }
        if index.is_empty() || !index.as_bytes().iter().all(u8::is_ascii_digit) {
            return Err(bad("the index is not a number"));
        }
        let parent = dest.parent().ok_or_else(|| bad("it has no parent"))?;
        let pod_dir = parent.ancestors().nth(3).ok_or_else(|| bad("it has no pod directory"))?.to_path_buf();
        Ok(Target { pod_dir, dest, parent, name: index })
    }
}

/// `/proc/thread-self/fd/<fd>`: the very file `fd` holds, for mount(2) to take as a path (the
/// thread's own view, which is the one that counts in a thread that unshared its namespace).
fn magic(fd: BorrowedFd<'_>) -> String {
    format!("/proc/thread-self/fd/{}", fd.as_raw_fd())
}

fn stat_fd(fd: BorrowedFd<'_>) -> Result<Statx, Errno> {
    statx(
        fd,
        c"",
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
    )
}

fn stat_at(dir: BorrowedFd<'_>, name: &OsStr) -> Result<Statx, Errno> {
    statx(
        dir,
        name,
        AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT,
        StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
    )
}

fn kind(st: &Statx) -> FileType {
    FileType::from_raw_mode(u32::from(st.stx_mode))
}

fn mnt_id(st: &Statx) -> Option<u64> {
    (st.stx_mask & StatxFlags::MNT_ID.bits() != 0).then_some(st.stx_mnt_id)
}

/// Whether `st` (of `path`, looked up in the directory of `dir_st`) is the root of another mount:
/// by mount id (Linux 5.8+), else by the mount table.
fn is_mount_point(dir_st: &Statx, st: &Statx, path: &Path) -> Result<bool, SubPathError> {
    if let (Some(dir), Some(here)) = (mnt_id(dir_st), mnt_id(st)) {
        return Ok(dir != here);
    }
    if (dir_st.stx_dev_major, dir_st.stx_dev_minor) != (st.stx_dev_major, st.stx_dev_minor) {
        return Ok(true);
    }
    let table = SystemMounter
        .mount_points()
        .map_err(|e| SubPathError::io("read the mount table for", path, e.source))?;
    Ok(table.iter().any(|m| m.target == path))
}

/// The kernel has no usable `openat2` (learnt once).
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// Opens `parts` (plain names) beneath `volume` as an `O_PATH` descriptor, following a symlink
/// only when its target is relative and stays beneath the volume.
fn open_beneath(volume: BorrowedFd<'_>, parts: &[&OsStr], resolver: Resolver) -> Result<OwnedFd, Errno> {
    if parts.is_empty() {
        return openat(volume, c".", OFlags::PATH | OFlags::CLOEXEC, Mode::empty());
    }
    if resolver == Resolver::Auto && !NO_OPENAT2.load(Ordering::Relaxed) {
        let joined: PathBuf = parts.iter().collect();
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        for _ in 0..RACE_RETRIES {
            match openat2(volume, &joined, OFlags::PATH | OFlags::CLOEXEC, Mode::empty(), how) {
                Err(Errno::AGAIN) => continue,
                // No openat2 (an old kernel, or a seccomp filter): kvol's own walk.
                Err(Errno::NOSYS | Errno::PERM) => {
                    NO_OPENAT2.store(true, Ordering::Relaxed);
                    return walk_beneath(volume, parts);
                }
                other => return other,
            }
        }
        return Err(Errno::AGAIN);
    }
    walk_beneath(volume, parts)
}

/// The walk: each component opened `O_PATH | O_NOFOLLOW` from the descriptor of the one before;
/// a symlink read and its target's components put in its place (an absolute target refused);
/// `..` steps back on the stack of directories opened, never above the volume.
fn walk_beneath(volume: BorrowedFd<'_>, parts: &[&OsStr]) -> Result<OwnedFd, Errno> {
    let mut dirs: Vec<OwnedFd> = Vec::new();
    let mut todo: Vec<OsString> = parts.iter().rev().map(|p| p.to_os_string()).collect();
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name.as_bytes() == b".." {
            if dirs.pop().is_none() {
                return Err(Errno::XDEV);
            }
            continue;
        }
        let here = dirs.last().map_or(volume, |d| d.as_fd());
        let fd = openat(here, &name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
        let st = stat_fd(fd.as_fd())?;
        match kind(&st) {
            FileType::Directory => dirs.push(fd),
            FileType::Symlink => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(Errno::LOOP);
                }
                let target = readlinkat(&fd, c"", Vec::new())?;
                let target = target.as_bytes();
                if target.is_empty() {
                    return Err(Errno::NOENT);
                }
                if target[0] == b'/' {
                    return Err(Errno::XDEV);
                }
                for part in target.split(|b| *b == b'/').rev() {
                    if !part.is_empty() && part != b"." {
                        todo.push(OsStr::from_bytes(part).to_os_string());
                    }
                }
            }
            _ if todo.is_empty() => return Ok(fd),
            _ => return Err(Errno::NOTDIR),
        }
    }
    match dirs.pop() {
        Some(fd) => Ok(fd),
        None => openat(volume, c".", OFlags::PATH | OFlags::CLOEXEC, Mode::empty()),
    }
}

/// One sub-path of one volume, for its errors.
struct SubPath<'a> {
    volume_dir: &'a Path,
    sub_path: &'a str,
}

impl SubPath<'_> {
    fn refuse(&self, reason: impl Into<String>) -> SubPathError {
        SubPathError::Refused {
            sub_path: self.sub_path.to_string(),
            volume: self.volume_dir.to_path_buf(),
            reason: reason.into(),
        }
    }

    fn path_of(&self, parts: &[&OsStr]) -> PathBuf {
        let mut path = self.volume_dir.to_path_buf();
        path.extend(parts);
        path
    }

    fn resolve_error(&self, parts: &[&OsStr], e: Errno) -> SubPathError {
        let path = self.path_of(parts);
        match e {
            Errno::XDEV => self.refuse(format!(
                "{} leads out of the volume (an absolute symlink, or one whose target climbs above the volume, is on the way)",
                path.display()
            )),
            Errno::LOOP => self.refuse(format!(
                "{} passes too many symlinks, or a /proc magic link",
                path.display()
            )),
            Errno::AGAIN => self.refuse(format!(
                "{} kept changing while it was resolved (renames racing the lookup); kvol does not guess",
                path.display()
            )),
            e => SubPathError::io("open", path, e),
        }
    }

    /// The sub-path opened; missing trailing directories created first (doSafeMakeDir).
    fn open_or_create(
        &self,
        volume: BorrowedFd<'_>,
        parts: &[&OsStr],
        mode: u32,
        resolver: Resolver,
    ) -> Result<OwnedFd, SubPathError> {
        match open_beneath(volume, parts, resolver) {
            Err(Errno::NOENT) => {}
            other => return other.map_err(|e| self.resolve_error(parts, e)),
        }
        // The longest prefix that resolves (the empty one, the volume, always does).
        let mut have = parts.len().saturating_sub(1);
        let mut dir = loop {
            match open_beneath(volume, &parts[..have], resolver) {
                Err(Errno::NOENT) if have > 0 => have -= 1,
                other => break other.map_err(|e| self.resolve_error(&parts[..have], e))?,
            }
        };
        let mode = Mode::from_raw_mode(mode & 0o7777);
        for (i, name) in parts.iter().enumerate().skip(have) {
            let here = self.path_of(&parts[..=i]);
            let created = match mkdirat(&dir, *name, mode) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(e) => return Err(SubPathError::io("create directory", here, e)),
            };
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let child = match openat(&dir, *name, flags, Mode::empty()) {
                Ok(fd) => fd,
                // O_DIRECTORY | O_NOFOLLOW on a symlink answers ELOOP or ENOTDIR.
                Err(e) if stat_at(dir.as_fd(), name).is_ok_and(|st| kind(&st) == FileType::Symlink) => {
                    return Err(self.refuse(format!(
                        "{} is a symlink (dangling, or leading out of the volume) where kvol creates a directory; it is never followed ({})",
                        here.display(),
                        io::Error::from(e)
                    )));
                }
                Err(e) => return Err(SubPathError::io("open the created directory", here, e)),
            };
            if created {
                // mkdirat's mode went through the umask; kubelet sets the exact mode after.
                fchmod(&child, mode).map_err(|e| SubPathError::io("chmod", &here, e))?;
                tracing::debug!(path = %here.display(), mode = format!("{:o}", mode.as_raw_mode()), "subPath directory created");
            }
            dir = child;
        }
        Ok(dir)
    }
}

/// Binds `sub_path` of the volume at `volume_dir` on `dest` (kubelet's layout, see
/// [`bind_target`]) and returns `dest`, the path to hand the runtime. A missing sub-path is
/// created as directories of mode `create_mode` (kubelet: the volume directory's, see
/// [`creation_mode`]). Resolution never leaves the volume (see the module); `dest` and its
/// parents are made beneath the pod directory without following a symlink; after the mount,
/// `dest` must show the device and inode that were opened. Idempotent: a `dest` already bound
/// to the same file is success.
pub fn prepare(
    volume_dir: &Path,
    sub_path: &str,
    dest: &Path,
    create_mode: u32,
) -> Result<PathBuf, SubPathError> {
    prepare_with(volume_dir, sub_path, dest, create_mode, Resolver::Auto)
}

/// [`prepare`] with the resolver chosen (tests run both).
pub fn prepare_with(
    volume_dir: &Path,
    sub_path: &str,
    dest: &Path,
    create_mode: u32,
    resolver: Resolver,
) -> Result<PathBuf, SubPathError> {
    kvol_api::subpath_expr::validate_sub_path(sub_path).map_err(|reason| SubPathError::Invalid { reason })?;
    if sub_path.contains('\0') {
        return Err(SubPathError::Invalid { reason: format!("subPath {sub_path:?} contains NUL") });
    }
    let target = Target::parse(dest)?;
    let ctx = SubPath { volume_dir, sub_path };

    // The volume directory is trusted configuration (kubelet evaluates its symlinks).
    let volume = openat(CWD, volume_dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| SubPathError::io("open the volume directory", volume_dir, e))?;
    let parts: Vec<&OsStr> =
        sub_path.split('/').filter(|p| !p.is_empty() && *p != ".").map(OsStr::new).collect();
    let source = ctx.open_or_create(volume.as_fd(), &parts, create_mode, resolver)?;
    let source_st =
        stat_fd(source.as_fd()).map_err(|e| SubPathError::io("inspect", ctx.path_of(&parts), e))?;
    let expected = FileId::of(&source_st);
    let want_dir = kind(&source_st) == FileType::Directory;

    let root = Root::open(&target.pod_dir)
        .map_err(|e| SubPathError::io("open the pod directory", &target.pod_dir, e))?;
    let parent = root
        .create_dir_all(target.parent, TARGET_DIR_MODE)
        .map_err(|e| SubPathError::io("create the directory of", target.dest, e))?;
    let parent_st = stat_fd(parent.as_fd()).map_err(|e| SubPathError::io("inspect", target.parent, e))?;

    if ensure_target(&root, &target, parent.as_fd(), &parent_st, expected, want_dir)? == Present::Bound {
        tracing::debug!(dest = %dest.display(), "subPath already bound");
        return Ok(dest.to_path_buf());
    }
    let target_fd =
        openat(&parent, target.name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| SubPathError::io("open", dest, e))?;
    let target_st = stat_fd(target_fd.as_fd()).map_err(|e| SubPathError::io("inspect", dest, e))?;
    let target_kind = kind(&target_st);
    if target_kind != FileType::Directory && target_kind != FileType::RegularFile {
        undo_target(&root, &target);
        return Err(SubPathError::io(
            "bind-mount onto",
            dest,
            io::Error::other(format!("it is a {target_kind:?}, not the directory or file kvol makes there")),
        ));
    }
    if let Err(e) = nix::mount::mount(
        Some(magic(source.as_fd()).as_str()),
        magic(target_fd.as_fd()).as_str(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    ) {
        undo_target(&root, &target);
        return Err(SubPathError::io("bind-mount a subPath onto", dest, e));
    }
    drop(target_fd);

    // What is mounted at dest now must be the file opened.
    let found = match stat_at(parent.as_fd(), target.name) {
        Ok(st) if FileId::of(&st) == expected && is_mount_point(&parent_st, &st, dest)? => None,
        Ok(st) => Some(format!("{} (a mount: {})", FileId::of(&st), is_mount_point(&parent_st, &st, dest)?)),
        Err(e) => Some(format!("nothing that can be looked at ({})", io::Error::from(e))),
    };
    if let Some(found) = found {
        let _ = SystemMounter.unmount(dest);
        undo_target(&root, &target);
        return Err(SubPathError::NotWhatWasOpened {
            dest: dest.to_path_buf(),
            sub_path: sub_path.to_string(),
            volume: volume_dir.to_path_buf(),
            expected,
            found,
        });
    }
    tracing::debug!(sub_path, volume = %volume_dir.display(), dest = %dest.display(), file = %expected, "subPath bound");
    Ok(dest.to_path_buf())
}

/// What [`ensure_target`] left at `dest`.
#[derive(Debug, PartialEq, Eq)]
enum Present {
    /// Bound to the wanted file already.
    Bound,
    /// An empty directory or file, ready for the mount.
    Ready,
}

/// Makes `dest` an unmounted empty directory (or file) matching the source's type: a mount of
/// another file there is unmounted (kubelet does so), a leftover of the other type removed when
/// empty; a symlink is refused, never followed.
fn ensure_target(
    root: &Root,
    target: &Target<'_>,
    parent: BorrowedFd<'_>,
    parent_st: &Statx,
    expected: FileId,
    want_dir: bool,
) -> Result<Present, SubPathError> {
    let dest = target.dest;
    for _ in 0..MAX_STACKED {
        let st = match stat_at(parent, target.name) {
            Err(Errno::NOENT) => return make_target(parent, target, want_dir),
            Err(e) => return Err(SubPathError::io("inspect", dest, e)),
            Ok(st) => st,
        };
        if is_mount_point(parent_st, &st, dest)? {
            if FileId::of(&st) == expected {
                return Ok(Present::Bound);
            }
            tracing::info!(dest = %dest.display(), found = %FileId::of(&st), wanted = %expected, "subPath target holds another mount: unmounting it");
            SystemMounter.unmount(dest).map_err(|e| SubPathError::io("unmount", dest, e.source))?;
            continue;
        }
        return match kind(&st) {
            FileType::Directory if want_dir => Ok(Present::Ready),
            FileType::RegularFile if !want_dir => Ok(Present::Ready),
            FileType::Symlink => Err(SubPathError::io(
                "bind-mount onto",
                dest,
                io::Error::other("refusing: it is a symlink, and kvol never follows one under its root"),
            )),
            _ => {
                // A mount point left from a source of the other type: kvol's, and empty.
                root.remove_if_empty(dest).map_err(|e| SubPathError::io("replace", dest, e))?;
                make_target(parent, target, want_dir)
            }
        };
    }
    Err(SubPathError::io(
        "unmount",
        dest,
        io::Error::other(format!("more than {MAX_STACKED} mounts are stacked there")),
    ))
}

/// An empty directory (0750) or empty file (0640) at `dest`, made without following a symlink.
fn make_target(parent: BorrowedFd<'_>, target: &Target<'_>, want_dir: bool) -> Result<Present, SubPathError> {
    if want_dir {
        match mkdirat(parent, target.name, Mode::from_raw_mode(TARGET_DIR_MODE)) {
            Ok(()) | Err(Errno::EXIST) => Ok(Present::Ready),
            Err(e) => Err(SubPathError::io("create the mount point", target.dest, e)),
        }
    } else {
        // NONBLOCK: should a FIFO ever sit there, opening it must not wait for a reader.
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        openat(parent, target.name, flags, Mode::from_raw_mode(TARGET_FILE_MODE))
            .map(drop)
            .map(|()| Present::Ready)
            .map_err(|e| SubPathError::io("create the mount point", target.dest, e))
    }
}

/// After a failed bind: `dest` and its parents up to the pod directory, each only if empty
/// (kubelet's `cleanSubPath` on error); best effort.
fn undo_target(root: &Root, target: &Target<'_>) {
    for path in target.dest.ancestors().take(4) {
        if root.remove_if_empty(path).is_err() {
            break;
        }
    }
}

/// What [`clean_up`] did and what it left.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanReport {
    /// Mounts taken off (a path twice when two were stacked there).
    pub unmounted: Vec<PathBuf>,
    /// Empty mount points and directories removed.
    pub removed: Vec<PathBuf>,
    /// What stays, and why.
    pub kept: Vec<Kept>,
}

impl CleanReport {
    /// Nothing stayed.
    pub fn is_clean(&self) -> bool {
        self.kept.is_empty()
    }

    fn keep(&mut self, path: &Path, reason: impl Into<String>) {
        let reason = reason.into();
        tracing::warn!(path = %path.display(), reason, "subPath cleanup keeps this");
        self.kept.push(Kept { path: path.to_path_buf(), reason });
    }
}

/// One path [`clean_up`] left, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    pub path: PathBuf,
    pub reason: String,
}

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

/// Takes down the sub-path bind mounts of one volume (`Some`) or all (`None`) under
/// `<pod_dir>/volume-subpaths`: every mount on an `<index>` is unmounted, the mount point
/// removed, then each `<container>`, `<volume>` and `volume-subpaths` directory when empty.
/// Nothing is deleted but empty directories and empty files; no symlink is followed; what stays
/// is in [`CleanReport::kept`] with the reason. Paths are reported below the pod directory's
/// resolved path. `Err` only when the cleanup cannot start.
pub fn clean_up(pod_dir: &Path, volume: Option<&str>) -> Result<CleanReport, SubPathError> {
    if let Some(name) = volume {
        check_segment(name)
            .map_err(|reason| SubPathError::Invalid { reason: format!("volume name {name:?}: {reason}") })?;
    }
    let mut report = CleanReport::default();
    // The mount table holds resolved paths.
    let pod_dir = match std::fs::canonicalize(pod_dir) {
        Ok(path) => path,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(report),
        Err(e) => return Err(SubPathError::io("resolve the pod directory", pod_dir, e)),
    };
    let base = pod_dir.join(SUBPATHS_DIR);
    let root = Root::open(&pod_dir).map_err(|e| SubPathError::io("open the pod directory", &pod_dir, e))?;
    let base_dir = match root.open_dir(&base) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(report),
        Err(e) => {
            report.keep(&base, e.to_string());
            return Ok(report);
        }
    };
    // Read once, before any filesystem below is looked at: a dead volume cannot hang this.
    let mut mounted: BTreeMap<PathBuf, usize> = BTreeMap::new();
    let table = SystemMounter
        .mounts_under(&base)
        .map_err(|e| SubPathError::io("read the mount table for", &base, e.source))?;
    for m in table {
        *mounted.entry(m.target).or_default() += 1;
    }
    let volumes = match volume {
        Some(name) => vec![OsString::from(name)],
        None => names(base_dir.as_fd()).map_err(|e| SubPathError::io("list", &base, e))?,
    };
    for name in volumes {
        clean_volume(&root, base_dir.as_fd(), &base.join(name), &mounted, &mut report);
    }
    match root.remove_if_empty(&base) {
        Ok(()) => report.removed.push(base),
        // Other volumes' sub-paths are still there: kubelet leaves it too.
        Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty && volume.is_some() => {}
        Err(e) => report.keep(&base, not_removed(&e)),
    }
    Ok(report)
}

fn not_removed(e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::DirectoryNotEmpty {
        "not empty: it holds what was kept".to_string()
    } else {
        format!("not removed: {e}")
    }
}

/// `<volume>`: each `<container>` directory, then the volume directory itself when empty.
fn clean_volume(
    root: &Root,
    base: BorrowedFd<'_>,
    path: &Path,
    mounted: &BTreeMap<PathBuf, usize>,
    report: &mut CleanReport,
) {
    let Some(name) = path.file_name() else { return };
    match stat_at(base, name) {
        Err(Errno::NOENT) => return,
        Ok(st) if kind(&st) == FileType::Directory => {}
        Ok(st) => {
            report.keep(path, format!("a {:?}, not a volume directory kvol made; nothing but empty directories and files is deleted here", kind(&st)));
            return;
        }
        Err(e) => {
            report.keep(path, format!("cannot be looked at: {}", io::Error::from(e)));
            return;
        }
    }
    let dir = match root.open_dir(path) {
        Ok(fd) => fd,
        Err(e) => {
            report.keep(path, e.to_string());
            return;
        }
    };
    let containers = match names(dir.as_fd()) {
        Ok(names) => names,
        Err(e) => {
            report.keep(path, format!("cannot be listed: {e}"));
            return;
        }
    };
    for container in containers {
        let container_path = path.join(&container);
        match stat_at(dir.as_fd(), &container) {
            Ok(st) if kind(&st) == FileType::Directory => {}
            Ok(st) => {
                report.keep(
                    &container_path,
                    format!("a {:?}, not a container directory kvol made; kept", kind(&st)),
                );
                continue;
            }
            Err(e) => {
                report.keep(&container_path, format!("cannot be looked at: {}", io::Error::from(e)));
                continue;
            }
        }
        clean_container(root, &container_path, mounted, report);
    }
    match root.remove_if_empty(path) {
        Ok(()) => report.removed.push(path.to_path_buf()),
        Err(e) => report.keep(path, not_removed(&e)),
    }
}

/// `<container>`: each `<index>` unmounted and removed, then the directory when empty.
fn clean_container(root: &Root, path: &Path, mounted: &BTreeMap<PathBuf, usize>, report: &mut CleanReport) {
    let dir = match root.open_dir(path) {
        Ok(fd) => fd,
        Err(e) => {
            report.keep(path, e.to_string());
            return;
        }
    };
    let dir_st = match stat_fd(dir.as_fd()) {
        Ok(st) => st,
        Err(e) => {
            report.keep(path, format!("cannot be looked at: {}", io::Error::from(e)));
            return;
        }
    };
    let entries = match names(dir.as_fd()) {
        Ok(names) => names,
        Err(e) => {
            report.keep(path, format!("cannot be listed: {e}"));
            return;
        }
    };
    for name in entries {
        let point = path.join(&name);
        clean_point(
            root,
            dir.as_fd(),
            &dir_st,
            &name,
            &point,
            mounted.get(&point).copied().unwrap_or(0),
            report,
        );
    }
    match root.remove_if_empty(path) {
        Ok(()) => report.removed.push(path.to_path_buf()),
        Err(e) => report.keep(path, not_removed(&e)),
    }
}

/// One `<index>`: the mounts the table shows on it taken off (then any the table missed, by
/// mount id), and the mount point removed if it is an empty directory or file.
fn clean_point(
    root: &Root,
    dir: BorrowedFd<'_>,
    dir_st: &Statx,
    name: &OsStr,
    point: &Path,
    in_table: usize,
    report: &mut CleanReport,
) {
    for _ in 0..in_table {
        match SystemMounter.unmount(point) {
            Ok(()) => report.unmounted.push(point.to_path_buf()),
            Err(e) => {
                report.keep(point, format!("still mounted: {}", e.source));
                return;
            }
        }
    }
    // Only now is it looked at: after the unmounts, the look reaches the pod's own filesystem.
    for _ in 0..MAX_STACKED {
        let st = match stat_at(dir, name) {
            Ok(st) => st,
            Err(Errno::NOENT) => return,
            Err(e) => {
                report.keep(point, format!("cannot be looked at: {}", io::Error::from(e)));
                return;
            }
        };
        match is_mount_point(dir_st, &st, point) {
            Ok(false) => break,
            Ok(true) => match SystemMounter.unmount(point) {
                Ok(()) => report.unmounted.push(point.to_path_buf()),
                Err(e) => {
                    report.keep(point, format!("still mounted: {}", e.source));
                    return;
                }
            },
            Err(e) => {
                report.keep(point, format!("cannot tell whether it is a mount: {e}"));
                return;
            }
        }
    }
    match root.remove_if_empty(point) {
        Ok(()) => report.removed.push(point.to_path_buf()),
        Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => report
            .keep(point, "not a mount, and not empty: kvol never deletes what it holds (kubernetes#72257)"),
        Err(e) => report.keep(point, format!("not removed: {e}")),
    }
}

/// The names in an open directory, without `.` and `..`, sorted.
fn names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut out = Vec::new();
    for entry in Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    // In order, so reports read the same each time.
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    use nix::sched::CloneFlags;

    use super::*;
    use crate::mount::MountPoint;

    #[test]
    fn bind_targets_follow_kubelets_layout() {
        let pod = Path::new("/var/lib/kubelet/pods/uid-1");
        assert_eq!(
            bind_target(pod, "data", "app", 3).unwrap(),
            Path::new("/var/lib/kubelet/pods/uid-1/volume-subpaths/data/app/3")
        );
        for (volume, container) in [("..", "app"), ("data", "a/b"), ("", "app"), ("data", ".")] {
            let err = bind_target(pod, volume, container, 0).unwrap_err();
            assert!(err.is_refusal(), "{volume:?} {container:?}: {err}");
        }
    }

    #[test]
    fn targets_outside_the_layout_are_refused() {
        // (dest, the pod directory, or the reason it is refused)
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("/r/pods/u/volume-subpaths/v/c/0", Ok("/r/pods/u")),
            ("/r/pods/u/volume-subpaths/v/c/12", Ok("/r/pods/u")),
            ("r/pods/u/volume-subpaths/v/c/0", Err("it is not absolute")),
            ("/r/pods/u/volume-subpaths/v/../c/0", Err("it has a \"..\" component")),
            ("/r/pods/u/volumes/v/c/0", Err("it is not below \"volume-subpaths\"")),
            ("/r/pods/u/volume-subpaths/v/c/x", Err("the index is not a number")),
            ("/r/pods/u/volume-subpaths/v/c/", Err("it is not below \"volume-subpaths\"")),
            ("/v/c/0", Err("it is too short")),
        ];
        for (dest, want) in cases {
            let got = Target::parse(Path::new(dest)).map(|t| t.pod_dir).map_err(|e| e.to_string());
            match (got, want) {
                (Ok(pod), Ok(want)) => assert_eq!(pod, Path::new(want), "{dest}"),
                (Err(e), Err(want)) => assert!(e.ends_with(want), "{dest}: {e}"),
                (got, want) => panic!("{dest}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// A volume with what a configMap holds, plain files and directories, and links that stay
    /// inside or lead out.
    fn hostile_volume(at: &Path, outside: &Path) {
        fs::create_dir_all(at.join("a/b")).unwrap();
        fs::write(at.join("a/b/file"), b"inside").unwrap();
        fs::create_dir_all(at.join("..2030_01_01_00_00_00.000000001")).unwrap();
        fs::write(at.join("..2030_01_01_00_00_00.000000001/key"), b"value").unwrap();
        symlink("..2030_01_01_00_00_00.000000001", at.join("..data")).unwrap();
        symlink("..data/key", at.join("key")).unwrap();
        symlink("a/b", at.join("to-b")).unwrap();
        symlink("../b", at.join("a/b/up")).unwrap();
        symlink(outside, at.join("abs-out")).unwrap();
        symlink(at.join("a"), at.join("abs-in")).unwrap();
        symlink("../../outside", at.join("a/rel-out")).unwrap();
        symlink("loop", at.join("loop")).unwrap();
        symlink("missing", at.join("dangling")).unwrap();
        symlink("/proc/self/root", at.join("magic")).unwrap();
    }

    #[test]
    fn both_resolvers_agree_and_never_leave_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::create_dir_all(outside.join("x")).unwrap();
        let vol_path = dir.path().join("vol");
        hostile_volume(&vol_path, &outside);
        let volume = openat(CWD, &vol_path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        // (sub-path, where it lands inside the volume or the errno)
        let cases: &[(&str, Result<&str, Errno>)] = &[
            ("a", Ok("a")),
            ("a/b/file", Ok("a/b/file")),
            ("key", Ok("..2030_01_01_00_00_00.000000001/key")),
            ("..data/key", Ok("..2030_01_01_00_00_00.000000001/key")),
            ("to-b/file", Ok("a/b/file")),
            ("to-b/up/up/up/file", Ok("a/b/file")),
            ("a/b/up", Ok("a/b")),
            ("abs-out", Err(Errno::XDEV)),
            ("abs-out/x", Err(Errno::XDEV)),
            ("abs-in", Err(Errno::XDEV)),
            ("a/rel-out", Err(Errno::XDEV)),
            ("a/rel-out/x", Err(Errno::XDEV)),
            ("loop", Err(Errno::LOOP)),
            ("dangling", Err(Errno::NOENT)),
            ("missing/deeper", Err(Errno::NOENT)),
            ("a/b/file/deeper", Err(Errno::NOTDIR)),
            ("magic", Err(Errno::XDEV)),
        ];
        for (sub_path, want) in cases {
            let parts: Vec<&OsStr> = sub_path.split('/').map(OsStr::new).collect();
            for resolver in [Resolver::Auto, Resolver::Walk] {
                let got = open_beneath(volume.as_fd(), &parts, resolver)
                    .map(|fd| FileId::of(&stat_fd(fd.as_fd()).unwrap()));
                let want = want.map(|inside| FileId::of_path(&vol_path.join(inside)).unwrap());
                assert_eq!(got, want, "{sub_path} with {resolver:?}");
            }
        }
    }

    #[test]
    fn a_missing_sub_path_is_created_with_the_mode_given_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        let vol_path = dir.path().join("vol");
        hostile_volume(&vol_path, &outside);
        fs::set_permissions(vol_path.join("a"), fs::Permissions::from_mode(0o700)).unwrap();
        let volume = openat(CWD, &vol_path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        for resolver in [Resolver::Auto, Resolver::Walk] {
            let top = format!("new-{resolver:?}");
            let ctx = SubPath { volume_dir: &vol_path, sub_path: "" };
            let parts = [OsStr::new(&top), OsStr::new("b"), OsStr::new("c")];
            let fd = ctx.open_or_create(volume.as_fd(), &parts, 0o2777, resolver).unwrap();
            let made = vol_path.join(&top).join("b/c");
            assert_eq!(FileId::of(&stat_fd(fd.as_fd()).unwrap()), FileId::of_path(&made).unwrap());
            for path in [vol_path.join(&top), vol_path.join(&top).join("b"), made] {
                // 0o2777 survives the umask only through the fchmod after mkdirat.
                assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o2777, "{}", path.display());
            }
            // Through a link that stays inside; what exists keeps its mode.
            let parts = [OsStr::new("to-b"), OsStr::new(&top)];
            ctx.open_or_create(volume.as_fd(), &parts, 0o750, resolver).unwrap();
            assert_eq!(fs::metadata(vol_path.join("a/b").join(&top)).unwrap().mode() & 0o7777, 0o750);
            assert_eq!(fs::metadata(vol_path.join("a")).unwrap().mode() & 0o7777, 0o700);
            // A dangling link is never created through, nor a link out of the volume.
            for bad in [["dangling", "x"], ["abs-out", "y"], ["a", "rel-out"]] {
                let parts = bad.map(OsStr::new);
                let err = ctx.open_or_create(volume.as_fd(), &parts, 0o750, resolver).unwrap_err();
                assert!(err.is_refusal(), "{bad:?} with {resolver:?}: {err}");
            }
            assert!(!outside.join("y").exists() && !dir.path().join("missing").exists());
            assert!(!vol_path.join("missing").exists());
        }
    }

    // Real mounts from here on (root): each test in a private mount namespace of its own thread.

    fn enter_private_mount_namespace() {
        nix::sched::unshare(CloneFlags::CLONE_NEWNS)
            .expect("unshare the mount namespace (these tests need root)");
        nix::mount::mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .expect("make every mount private");
    }

    struct Pod {
        scratch: kvol_test_support::ScratchRoot,
        dir: PathBuf,
        volume: PathBuf,
    }

    impl Pod {
        fn new() -> Pod {
            enter_private_mount_namespace();
            let scratch = kvol_test_support::ScratchRoot::new();
            let dir = scratch.path().join("pods/uid-1");
            let volume = dir.join("volumes/kubernetes.io~empty-dir/data");
            fs::create_dir_all(&volume).unwrap();
            Pod { scratch, dir, volume }
        }

        fn target(&self, volume: &str, container: &str, index: usize) -> PathBuf {
            bind_target(&self.dir, volume, container, index).unwrap()
        }

        fn mounts(&self) -> Vec<MountPoint> {
            SystemMounter.mounts_under(self.scratch.path()).unwrap()
        }

        fn assert_bound(&self, dest: &Path, inside: &str) {
            assert_eq!(FileId::of_path(dest).unwrap(), FileId::of_path(&self.volume.join(inside)).unwrap());
            let on_dest = self.mounts().into_iter().filter(|m| m.target == dest).count();
            assert_eq!(on_dest, 1, "one mount on {}", dest.display());
        }
    }

    #[test]
    fn a_directory_is_bound_once_however_often_it_is_prepared_and_cleaned_up() {
        let pod = Pod::new();
        fs::create_dir_all(pod.volume.join("logs/app")).unwrap();
        fs::write(pod.volume.join("logs/app/today"), b"line").unwrap();
        let dest = pod.target("data", "app", 1);
        assert_eq!(prepare(&pod.volume, "logs/app", &dest, 0o777).unwrap(), dest);
        pod.assert_bound(&dest, "logs/app");
        assert_eq!(fs::read(dest.join("today")).unwrap(), b"line");
        // The mount point's directory as kubelet makes it (0750, less the umask).
        let umask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022)).bits();
        let container_dir = fs::symlink_metadata(dest.parent().unwrap()).unwrap();
        assert_eq!(container_dir.mode() & 0o7777, 0o750 & !umask);
        // Again, and with the same path spelled otherwise: the mount is there, nothing stacks.
        assert_eq!(prepare(&pod.volume, "logs/app", &dest, 0o777).unwrap(), dest);
        assert_eq!(prepare_with(&pod.volume, "./logs//app/", &dest, 0o777, Resolver::Walk).unwrap(), dest);
        pod.assert_bound(&dest, "logs/app");

        let report = clean_up(&pod.dir, Some("data")).unwrap();
        assert!(report.is_clean(), "{report:?}");
        assert_eq!(report.unmounted, vec![dest.clone()]);
        let subpaths = pod.dir.join(SUBPATHS_DIR);
        assert_eq!(
            report.removed,
            vec![dest.clone(), subpaths.join("data/app"), subpaths.join("data"), subpaths.clone()]
        );
        assert!(pod.mounts().is_empty());
        assert!(!subpaths.exists());
        assert_eq!(fs::read(pod.volume.join("logs/app/today")).unwrap(), b"line", "the volume's data stays");
        // Nothing left: a second cleanup has nothing to do.
        assert_eq!(clean_up(&pod.dir, Some("data")).unwrap(), CleanReport::default());
    }

    #[test]
    fn a_file_is_bound_on_an_empty_file() {
        let pod = Pod::new();
        fs::create_dir_all(pod.volume.join("conf")).unwrap();
        fs::write(pod.volume.join("conf/app.yaml"), b"a: 1\n").unwrap();
        let dest = pod.target("data", "app", 0);
        prepare(&pod.volume, "conf/app.yaml", &dest, 0o777).unwrap();
        pod.assert_bound(&dest, "conf/app.yaml");
        assert!(fs::symlink_metadata(&dest).unwrap().is_file());
        assert_eq!(fs::read(&dest).unwrap(), b"a: 1\n");
        prepare(&pod.volume, "conf/app.yaml", &dest, 0o777).unwrap();
        pod.assert_bound(&dest, "conf/app.yaml");
        let report = clean_up(&pod.dir, None).unwrap();
        assert!(report.is_clean(), "{report:?}");
        assert_eq!(report.unmounted, vec![dest.clone()]);
        assert!(pod.mounts().is_empty() && !pod.dir.join(SUBPATHS_DIR).exists());
        assert_eq!(fs::read(pod.volume.join("conf/app.yaml")).unwrap(), b"a: 1\n");
    }

    #[test]
    fn a_config_map_key_is_bound_through_its_links() {
        let pod = Pod::new();
        let payload = pod.volume.join("..2030_01_01_00_00_00.000000001");
        fs::create_dir_all(&payload).unwrap();
        fs::write(payload.join("app.conf"), b"k=v").unwrap();
        symlink("..2030_01_01_00_00_00.000000001", pod.volume.join("..data")).unwrap();
        symlink("..data/app.conf", pod.volume.join("app.conf")).unwrap();
        for resolver in [Resolver::Auto, Resolver::Walk] {
            let dest = pod.target("config", "app", 0);
            prepare_with(&pod.volume, "app.conf", &dest, 0o777, resolver).unwrap();
            pod.assert_bound(&dest, "..2030_01_01_00_00_00.000000001/app.conf");
            assert_eq!(fs::read(&dest).unwrap(), b"k=v");
            assert!(clean_up(&pod.dir, Some("config")).unwrap().is_clean());
        }
        assert!(pod.mounts().is_empty());
    }

    #[test]
    fn a_missing_sub_path_is_created_with_kubelets_mode_then_bound() {
        let pod = Pod::new();
        // Private to this thread since the unshare: the mode must not depend on it.
        nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
        fs::set_permissions(&pod.volume, fs::Permissions::from_mode(0o2775)).unwrap();
        let mode = creation_mode(&pod.volume).unwrap();
        assert_eq!(mode, 0o2775);
        let dest = pod.target("data", "app", 2);
        prepare(&pod.volume, "made/by/kvol", &dest, mode).unwrap();
        pod.assert_bound(&dest, "made/by/kvol");
        for path in ["made", "made/by", "made/by/kvol"] {
            let meta = fs::metadata(pod.volume.join(path)).unwrap();
            assert!(meta.is_dir());
            assert_eq!(meta.mode() & 0o7777, 0o2775, "{path}");
        }
        assert!(clean_up(&pod.dir, Some("data")).unwrap().is_clean());
        assert!(
            pod.volume.join("made/by/kvol").is_dir(),
            "what was created in the volume stays, as with kubelet"
        );
        assert!(pod.mounts().is_empty());
    }

    #[test]
    fn another_mount_on_the_target_is_replaced() {
        let pod = Pod::new();
        fs::create_dir_all(pod.volume.join("old")).unwrap();
        fs::create_dir_all(pod.volume.join("new")).unwrap();
        let dest = pod.target("data", "app", 0);
        prepare(&pod.volume, "old", &dest, 0o777).unwrap();
        pod.assert_bound(&dest, "old");
        prepare(&pod.volume, "new", &dest, 0o777).unwrap();
        pod.assert_bound(&dest, "new");
        // A directory target where a file is now wanted: replaced, being kvol's and empty.
        fs::write(pod.volume.join("file"), b"f").unwrap();
        prepare(&pod.volume, "file", &dest, 0o777).unwrap();
        pod.assert_bound(&dest, "file");
        assert!(clean_up(&pod.dir, None).unwrap().is_clean());
        assert!(pod.mounts().is_empty());
    }

    #[test]
    fn clean_up_unmounts_everything_and_deletes_no_data() {
        let pod = Pod::new();
        for dir in ["one", "two"] {
            fs::create_dir_all(pod.volume.join(dir)).unwrap();
            fs::write(pod.volume.join(dir).join("data"), dir).unwrap();
        }
        let a0 = pod.target("data", "a", 0);
        let a1 = pod.target("data", "a", 1);
        let b0 = pod.target("other", "b", 0);
        prepare(&pod.volume, "one", &a0, 0o777).unwrap();
        prepare(&pod.volume, "two", &a1, 0o777).unwrap();
        prepare(&pod.volume, "one", &b0, 0o777).unwrap();
        // A second mount stacked on a1 (a crash between mount and record, say).
        let two = pod.volume.join("two");
        nix::mount::mount(Some(&two), &a1, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
        // kubernetes#72257: what looks like an index but is a plain directory with data in it.
        let stray = pod.target("data", "a", 7);
        fs::create_dir_all(&stray).unwrap();
        fs::write(stray.join("precious"), b"keep me").unwrap();
        // A symlink planted as an index: removed never, followed never.
        let link = pod.target("data", "a", 8);
        symlink(pod.volume.join("one"), &link).unwrap();

        let report = clean_up(&pod.dir, Some("data")).unwrap();
        assert_eq!(report.unmounted, vec![a0.clone(), a1.clone(), a1.clone()]);
        let kept: Vec<&Path> = report.kept.iter().map(|k| k.path.as_path()).collect();
        let container = pod.dir.join(SUBPATHS_DIR).join("data/a");
        assert_eq!(
            kept,
            vec![stray.as_path(), link.as_path(), container.as_path(), container.parent().unwrap()]
        );
        assert!(report.kept[0].reason.contains("kubernetes#72257"), "{}", report.kept[0]);
        assert!(
            report.kept[1].reason.contains("not the empty directory or empty file"),
            "{}",
            report.kept[1]
        );
        assert_eq!(fs::read(stray.join("precious")).unwrap(), b"keep me");
        assert_eq!(fs::read(pod.volume.join("one/data")).unwrap(), b"one");
        assert_eq!(fs::read(pod.volume.join("two/data")).unwrap(), b"two");
        // The other volume's mount is untouched.
        let left: Vec<PathBuf> = pod.mounts().into_iter().map(|m| m.target).collect();
        assert_eq!(left, vec![b0.clone()]);

        let report = clean_up(&pod.dir, None).unwrap();
        assert_eq!(report.unmounted, vec![b0]);
        assert!(pod.mounts().is_empty());
        assert!(stray.join("precious").exists());
        assert!(!report.is_clean());
    }
}
