//! Trust checks before a driver runs as root: owner, mode, file kind, and symlinks that leave the plugin directory.
//!
//! kvol goes past upstream here: the kubelet executes whatever sits in the driver directory.
//! The decisions are pure functions over observed [`Facts`] (tested by tables below); the I/O
//! wrappers gather the facts and turn a refusal into [`FlexError::Untrusted`]. The whole chain
//! is checked: the plugin directory, the driver directory and the executable. Before every
//! call, [`open_executable`] opens the executable (no symlink on the way, none at the end),
//! checks what it opened through the descriptor, and the call executes that descriptor (see
//! [`crate::driver`]), so a file swapped in after the check never runs.

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{CWD, FileType, Mode, OFlags, ResolveFlags, openat, openat2};
use rustix::io::Errno;

use crate::error::{FlexError, Result};

/// What kind of file a path is, as `lstat` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    Other,
}

impl FileKind {
    fn of(file_type: std::fs::FileType) -> FileKind {
        if file_type.is_file() {
            FileKind::Regular
        } else if file_type.is_dir() {
            FileKind::Directory
        } else if file_type.is_symlink() {
            FileKind::Symlink
        } else {
            FileKind::Other
        }
    }

    fn described(self) -> &'static str {
        match self {
            FileKind::Regular => "a regular file",
            FileKind::Directory => "a directory",
            FileKind::Symlink => "a symlink",
            FileKind::Other => "a device, socket or fifo",
        }
    }
}

/// The facts a trust decision is made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    pub kind: FileKind,
    /// The permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
}

impl Facts {
    /// The facts of `meta` (from `metadata`, so symlinks already followed, or `symlink_metadata`).
    pub fn of(meta: &std::fs::Metadata) -> Facts {
        Facts { kind: FileKind::of(meta.file_type()), mode: meta.mode() & 0o7777, uid: meta.uid() }
    }
}

/// Why a path that must be written by its owner only is not: world- before group-writable, then owner.
fn writable_or_foreign(facts: &Facts, owner_uid: u32) -> Option<String> {
    if facts.mode & 0o002 != 0 {
        return Some(format!("is world-writable (mode {:04o})", facts.mode));
    }
    if facts.mode & 0o020 != 0 {
        return Some(format!("is group-writable (mode {:04o})", facts.mode));
    }
    if facts.uid != owner_uid {
        return Some(format!("is owned by uid {}, not {owner_uid}", facts.uid));
    }
    None
}

/// Whether the resolved driver path stays inside the (canonical) plugin directory; the reason if not.
pub fn check_contained(resolved: &Path, plugin_dir: &Path) -> Result<(), String> {
    if resolved.starts_with(plugin_dir) && resolved != plugin_dir {
        Ok(())
    } else {
        Err(format!(
            "resolves to {}, outside the driver directory {}",
            resolved.display(),
            plugin_dir.display()
        ))
    }
}

/// Whether a driver directory (`vendor~driver`, symlinks followed) may hold a driver run as root.
pub fn check_directory(facts: &Facts, owner_uid: u32) -> Result<(), String> {
    if facts.kind != FileKind::Directory {
        return Err(format!("is not a directory but {}", facts.kind.described()));
    }
    writable_or_foreign(facts, owner_uid).map_or(Ok(()), Err)
}

/// Whether a driver executable (symlinks followed) may be run as root.
pub fn check_executable(facts: &Facts, owner_uid: u32) -> Result<(), String> {
    if facts.kind != FileKind::Regular {
        return Err(format!("is not a regular file but {}", facts.kind.described()));
    }
    if let Some(reason) = writable_or_foreign(facts, owner_uid) {
        return Err(reason);
    }
    if facts.mode & 0o111 == 0 {
        return Err(format!("is not executable (mode {:04o})", facts.mode));
    }
    Ok(())
}

/// Checks the driver directory `driver_dir` and its executable `executable` under `plugin_dir`
/// before anything runs: both resolve inside the plugin directory, both are written by
/// `owner_uid` only, the executable is an executable regular file.
pub fn verify_driver(plugin_dir: &Path, driver_dir: &Path, executable: &Path, owner_uid: u32) -> Result<()> {
    let dir = verify_driver_dir(plugin_dir, driver_dir, owner_uid)?;
    verify_executable(plugin_dir, &dir, executable, owner_uid)
}

/// Checks a driver directory: it resolves inside the plugin directory (a symlink may not lead
/// out of it) and is written by `owner_uid` only. Returns its canonical path.
pub fn verify_driver_dir(plugin_dir: &Path, driver_dir: &Path, owner_uid: u32) -> Result<PathBuf> {
    let root = canonical(plugin_dir)?;
    check_directory(&facts(&root)?, owner_uid).map_err(|r| {
        untrusted(driver_dir, format!("is in the plugin directory {}, which {r}", root.display()))
    })?;
    let dir = canonical(driver_dir)?;
    check_contained(&dir, &root).map_err(|r| untrusted(driver_dir, r))?;
    check_directory(&facts(&dir)?, owner_uid).map_err(|r| untrusted(driver_dir, r))?;
    Ok(dir)
}

/// Checks a driver executable whose driver directory resolved to `canonical_dir`: it resolves
/// inside the plugin directory, is an executable regular file written by `owner_uid` only, and
/// when a symlink leads into another directory, that one is written by `owner_uid` only too.
pub fn verify_executable(
    plugin_dir: &Path,
    canonical_dir: &Path,
    executable: &Path,
    owner_uid: u32,
) -> Result<()> {
    let root = canonical(plugin_dir)?;
    let exe = canonical(executable)?;
    check_contained(&exe, &root).map_err(|r| untrusted(executable, r))?;
    if let Some(holder) = exe.parent().filter(|p| *p != canonical_dir) {
        check_directory(&facts(holder)?, owner_uid)
            .map_err(|r| untrusted(executable, format!("is held by {}, which {r}", holder.display())))?;
    }
    check_executable(&facts(&exe)?, owner_uid).map_err(|r| untrusted(executable, r))
}

/// Opens the executable at `executable` for one call: resolved to its real path, its holding
/// directory opened with no symlink on the way (`openat2` with `RESOLVE_NO_SYMLINKS`) and
/// checked through that descriptor, then the file opened with `O_PATH | O_NOFOLLOW` and
/// checked through its descriptor. Executing the returned descriptor runs exactly the file
/// checked.
pub fn open_executable(executable: &Path, owner_uid: u32) -> Result<OwnedFd> {
    let real = canonical(executable)?;
    let (Some(holder), Some(name)) = (real.parent(), real.file_name()) else {
        return Err(untrusted(executable, "names no file".to_string()));
    };
    let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let dir = match openat2(CWD, holder, dir_flags, Mode::empty(), resolve) {
        Err(Errno::NOSYS | Errno::PERM) => openat(CWD, holder, dir_flags, Mode::empty()),
        other => other,
    }
    .map_err(|e| FlexError::io("open", holder, e.into()))?;
    check_directory(&fd_facts(&dir, holder)?, owner_uid)
        .map_err(|r| untrusted(executable, format!("is held by {}, which {r}", holder.display())))?;
    let file = openat(&dir, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| FlexError::io("open", &real, e.into()))?;
    check_executable(&fd_facts(&file, &real)?, owner_uid).map_err(|r| untrusted(executable, r))?;
    Ok(file)
}

fn fd_facts(fd: &OwnedFd, path: &Path) -> Result<Facts> {
    let st = rustix::fs::fstat(fd).map_err(|e| FlexError::io("inspect", path, e.into()))?;
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => FileKind::Regular,
        FileType::Directory => FileKind::Directory,
        FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    };
    Ok(Facts { kind, mode: st.st_mode & 0o7777, uid: st.st_uid })
}

fn untrusted(path: &Path, reason: String) -> FlexError {
    FlexError::Untrusted { path: path.to_path_buf(), reason }
}

fn canonical(path: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(path).map_err(|e| FlexError::io("resolve", path, e))
}

fn facts(path: &Path) -> Result<Facts> {
    std::fs::metadata(path).map(|m| Facts::of(&m)).map_err(|e| FlexError::io("inspect", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: FileKind = FileKind::Directory;
    const REG: FileKind = FileKind::Regular;

    fn f(kind: FileKind, mode: u32, uid: u32) -> Facts {
        Facts { kind, mode, uid }
    }

    /// (facts of the executable, required owner, expected refusal)
    #[test]
    fn executable_decisions() {
        let rows: &[(Facts, u32, Option<&str>)] = &[
            (f(REG, 0o755, 0), 0, None),
            (f(REG, 0o700, 0), 0, None),
            (f(REG, 0o4755, 0), 0, None),
            (f(REG, 0o755, 1000), 1000, None),
            (f(REG, 0o777, 0), 0, Some("is world-writable (mode 0777)")),
            (f(REG, 0o757, 1000), 0, Some("is world-writable (mode 0757)")),
            (f(REG, 0o775, 0), 0, Some("is group-writable (mode 0775)")),
            (f(REG, 0o755, 1000), 0, Some("is owned by uid 1000, not 0")),
            (f(REG, 0o755, 0), 1000, Some("is owned by uid 0, not 1000")),
            (f(REG, 0o644, 0), 0, Some("is not executable (mode 0644)")),
            (f(DIR, 0o755, 0), 0, Some("is not a regular file but a directory")),
            (f(FileKind::Other, 0o755, 0), 0, Some("is not a regular file but a device, socket or fifo")),
            (f(FileKind::Symlink, 0o777, 0), 0, Some("is not a regular file but a symlink")),
        ];
        for (facts, owner, want) in rows {
            let got = check_executable(facts, *owner).err();
            assert_eq!(got.as_deref(), *want, "{facts:?} owner {owner}");
        }
    }

    /// (facts of the driver directory, required owner, expected refusal)
    #[test]
    fn directory_decisions() {
        let rows: &[(Facts, u32, Option<&str>)] = &[
            (f(DIR, 0o755, 0), 0, None),
            (f(DIR, 0o700, 0), 0, None),
            (f(DIR, 0o1777, 0), 0, Some("is world-writable (mode 1777)")),
            (f(DIR, 0o770, 0), 0, Some("is group-writable (mode 0770)")),
            (f(DIR, 0o755, 1000), 0, Some("is owned by uid 1000, not 0")),
            (f(REG, 0o755, 0), 0, Some("is not a directory but a regular file")),
        ];
        for (facts, owner, want) in rows {
            let got = check_directory(facts, *owner).err();
            assert_eq!(got.as_deref(), *want, "{facts:?} owner {owner}");
        }
    }

    /// (resolved path, canonical plugin directory, expected refusal)
    #[test]
    fn containment_decisions() {
        let root = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec";
        let rows: &[(&str, &str, Option<&str>)] = &[
            ("/usr/libexec/kubernetes/kubelet-plugins/volume/exec/a~b/b", root, None),
            ("/usr/libexec/kubernetes/kubelet-plugins/volume/exec/c~d/d", root, None),
            (
                "/tmp/x",
                root,
                Some(
                    "resolves to /tmp/x, outside the driver directory \
                     /usr/libexec/kubernetes/kubelet-plugins/volume/exec",
                ),
            ),
            (
                "/usr/libexec/kubernetes/kubelet-plugins/volume/exec2/a~b/b",
                root,
                Some(
                    "resolves to /usr/libexec/kubernetes/kubelet-plugins/volume/exec2/a~b/b, outside the \
                     driver directory /usr/libexec/kubernetes/kubelet-plugins/volume/exec",
                ),
            ),
            (
                root,
                root,
                Some(
                    "resolves to /usr/libexec/kubernetes/kubelet-plugins/volume/exec, outside the driver \
                     directory /usr/libexec/kubernetes/kubelet-plugins/volume/exec",
                ),
            ),
        ];
        for (resolved, root, want) in rows {
            let got = check_contained(Path::new(resolved), Path::new(root)).err();
            assert_eq!(got.as_deref(), *want, "{resolved}");
        }
    }

    use std::os::unix::fs::{PermissionsExt, symlink};

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A plugin dir with `v~drv/drv` (0755 in a 0755 dir) owned by this process; returns (root, dir, exe).
    fn layout(tmp: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let root = tmp.join("exec");
        let dir = root.join("v~drv");
        std::fs::create_dir_all(&dir).unwrap();
        chmod(&dir, 0o755);
        let exe = dir.join("drv");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        chmod(&exe, 0o755);
        (root, dir, exe)
    }

    fn me() -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    fn refusal(r: Result<()>) -> (PathBuf, String) {
        match r {
            Err(FlexError::Untrusted { path, reason }) => (path, reason),
            other => panic!("expected an untrusted refusal, got {other:?}"),
        }
    }

    #[test]
    fn verify_reads_the_real_files() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, dir, exe) = layout(tmp.path());
        verify_driver(&root, &dir, &exe, me()).expect("a 0755 file of ours in a 0755 dir of ours is trusted");

        let (path, reason) = refusal(verify_driver(&root, &dir, &exe, me() + 1));
        assert_eq!(path, dir);
        let plugin_dir = std::fs::canonicalize(&root).unwrap();
        let in_plugin_dir = format!("is in the plugin directory {}, which ", plugin_dir.display());
        assert_eq!(reason, format!("{in_plugin_dir}is owned by uid {}, not {}", me(), me() + 1));

        chmod(&root, 0o777);
        let (path, reason) = refusal(verify_driver(&root, &dir, &exe, me()));
        assert_eq!((path, reason), (dir.clone(), format!("{in_plugin_dir}is world-writable (mode 0777)")));
        chmod(&root, 0o755);

        chmod(&exe, 0o777);
        let (path, reason) = refusal(verify_driver(&root, &dir, &exe, me()));
        assert_eq!((path, reason.as_str()), (exe.clone(), "is world-writable (mode 0777)"));
        chmod(&exe, 0o755);

        chmod(&dir, 0o775);
        let (path, reason) = refusal(verify_driver(&root, &dir, &exe, me()));
        assert_eq!((path, reason.as_str()), (dir.clone(), "is group-writable (mode 0775)"));
        chmod(&dir, 0o755);

        let err = verify_driver(&root, &dir, &dir.join("missing"), me()).unwrap_err().to_string();
        assert!(err.starts_with(&format!("cannot resolve {}", dir.join("missing").display())), "{err}");
    }

    #[test]
    fn symlinks_may_not_leave_the_plugin_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, dir, exe) = layout(tmp.path());
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "#!/bin/sh\n").unwrap();
        chmod(&outside, 0o755);
        let canonical_root = root.canonicalize().unwrap();

        std::fs::remove_file(&exe).unwrap();
        symlink(&outside, &exe).unwrap();
        let (path, reason) = refusal(verify_driver(&root, &dir, &exe, me()));
        assert_eq!(path, exe);
        assert_eq!(
            reason,
            format!(
                "resolves to {}, outside the driver directory {}",
                outside.canonicalize().unwrap().display(),
                canonical_root.display()
            )
        );

        // A symlink to another driver's executable stays inside: trusted.
        std::fs::remove_file(&exe).unwrap();
        let (_, _, other) = {
            let d = root.join("v~other");
            std::fs::create_dir(&d).unwrap();
            chmod(&d, 0o755);
            let e = d.join("other");
            std::fs::write(&e, "#!/bin/sh\n").unwrap();
            chmod(&e, 0o755);
            (root.clone(), d, e)
        };
        symlink(&other, &exe).unwrap();
        verify_driver(&root, &dir, &exe, me()).expect("a symlink inside the plugin dir is fine");

        // A driver directory that is a symlink out of the plugin dir.
        let away = tmp.path().join("away");
        std::fs::create_dir(&away).unwrap();
        let linked = root.join("v~away");
        symlink(&away, &linked).unwrap();
        let (path, reason) = refusal(verify_driver(&root, &linked, &linked.join("away"), me()));
        assert_eq!(path, linked);
        assert!(
            reason.starts_with("resolves to ") && reason.contains("outside the driver directory"),
            "{reason}"
        );
    }
}
