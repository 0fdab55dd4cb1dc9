//! Filesystem helpers of the hostpath driver: atomic file replacement and copying a directory tree with its owners and modes.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use kvol_csi::CsiError;

/// Writes `bytes` to `path` through a temporary file beside it: write, fsync, rename, fsync
/// the directory. Readers see the old content or the new one, never a mix.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CsiError> {
    kvol_plugin::atomic_file::replace(path, bytes, kvol_plugin::atomic_file::Durability::Synced)
        .map_err(|e| CsiError::io(e.op, e.path, e.source))
}

/// Creates the directory `path` (not its parents) with `mode`, whatever the umask.
pub fn create_dir_with_mode(path: &Path, mode: u32) -> Result<(), CsiError> {
    fs::create_dir(path).map_err(|e| CsiError::io("create directory", path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| CsiError::io("set the mode of", path, e))
}

/// Removes `path` and everything below it; a missing path is already removed.
pub fn remove_tree(path: &Path) -> Result<(), CsiError> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CsiError::io("remove", path, e)),
    }
}

/// Removes `path` and everything below it without entering another mount: a mount found below
/// is refused (what was on `path`'s own filesystem before it may be gone); a missing path is
/// already removed. No symlink is followed.
pub fn remove_tree_on_its_mount(path: &Path) -> Result<(), CsiError> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    let root = kvol_plugin::beneath::Root::open(parent).map_err(|e| CsiError::io("open", parent, e))?;
    root.remove_all(path).map_err(|e| CsiError::io("remove", path, e))
}

/// The bytes the files below directory `path` take on disk (allocated blocks), counting
/// nothing on another filesystem (mounts below it) and each hard-linked file once.
pub fn disk_usage(path: &Path) -> Result<u64, CsiError> {
    let root = fs::symlink_metadata(path).map_err(|e| CsiError::io("read", path, e))?;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut pending = vec![path.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).map_err(|e| CsiError::io("read directory", &dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| CsiError::io("read directory", &dir, e))?;
            let meta = entry.metadata().map_err(|e| CsiError::io("read", entry.path(), e))?;
            if meta.dev() != root.dev() || (meta.nlink() > 1 && !seen.insert(meta.ino())) {
                continue;
            }
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    Ok(total)
}

/// Copies the contents of directory `from` into the existing, empty directory `to`:
/// directories, regular files and symbolic links (not followed), each with its mode and owner;
/// `to` takes `from`'s mode and owner. Anything else (a device, fifo or socket), and anything
/// on another filesystem than `from` (a mount point below it), is refused.
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), CsiError> {
    let root = fs::symlink_metadata(from).map_err(|e| CsiError::io("read", from, e))?;
    if !root.is_dir() {
        return Err(CsiError::io("copy", from, std::io::Error::other("not a directory")));
    }
    copy_dir_contents(from, to, root.dev())?;
    copy_owner_and_mode(&root, to)
}

fn copy_dir_contents(from: &Path, to: &Path, device: u64) -> Result<(), CsiError> {
    let entries = fs::read_dir(from).map_err(|e| CsiError::io("read directory", from, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| CsiError::io("read directory", from, e))?;
        let source = entry.path();
        let target = to.join(entry.file_name());
        let meta = fs::symlink_metadata(&source).map_err(|e| CsiError::io("read", &source, e))?;
        if meta.dev() != device {
            return Err(CsiError::io(
                "copy",
                &source,
                std::io::Error::other("it is on another filesystem (a mount point)"),
            ));
        }
        let kind = meta.file_type();
        if kind.is_dir() {
            fs::create_dir(&target).map_err(|e| CsiError::io("create directory", &target, e))?;
            copy_dir_contents(&source, &target, device)?;
        } else if kind.is_file() {
            copy_file_sparse(&source, &target).map_err(|e| CsiError::io("copy to", &target, e))?;
        } else if kind.is_symlink() {
            let link = fs::read_link(&source).map_err(|e| CsiError::io("read link", &source, e))?;
            std::os::unix::fs::symlink(&link, &target)
                .map_err(|e| CsiError::io("create link", &target, e))?;
            std::os::unix::fs::lchown(&target, Some(meta.uid()), Some(meta.gid()))
                .map_err(|e| CsiError::io("set the owner of", &target, e))?;
            continue;
        } else {
            return Err(CsiError::io(
                "copy",
                &source,
                std::io::Error::other("it is not a directory, regular file or symbolic link"),
            ));
        }
        copy_owner_and_mode(&meta, &target)?;
    }
    Ok(())
}

/// Copies a regular file's data extents only, so a sparse file (a block volume's image) stays
/// sparse: `fs::copy` writes every hole out as zeros (a 10 GiB image became 10 GiB on disk).
pub(crate) fn copy_file_sparse(source: &Path, target: &Path) -> std::io::Result<()> {
    use nix::unistd::{Whence, lseek};
    let input = fs::File::open(source)?;
    let output = fs::OpenOptions::new().write(true).create_new(true).open(target)?;
    let size = i64::try_from(input.metadata()?.len()).map_err(std::io::Error::other)?;
    let mut offset = 0i64;
    while offset < size {
        let data = match lseek(&input, offset, Whence::SeekData) {
            Ok(data) => data,
            // No data after `offset`: the rest is a hole.
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = lseek(&input, data, Whence::SeekHole)?;
        let (mut from, mut to) = (data, data);
        while from < hole {
            let want = usize::try_from(hole - from).unwrap_or(usize::MAX).min(1 << 30);
            let copied = nix::fcntl::copy_file_range(&input, Some(&mut from), &output, Some(&mut to), want)?;
            if copied == 0 {
                return Err(std::io::Error::other(format!("{} shrank while being copied", source.display())));
            }
        }
        offset = hole;
    }
    output.set_len(input.metadata()?.len())
}

fn copy_owner_and_mode(meta: &fs::Metadata, target: &Path) -> Result<(), CsiError> {
    std::os::unix::fs::lchown(target, Some(meta.uid()), Some(meta.gid()))
        .map_err(|e| CsiError::io("set the owner of", target, e))?;
    // After chown: changing the owner clears set-id bits.
    fs::set_permissions(target, fs::Permissions::from_mode(meta.mode() & 0o7777))
        .map_err(|e| CsiError::io("set the mode of", target, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writes_replace_the_file_and_leave_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.json");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        fs::create_dir(dir.path().join("d")).unwrap();
        fs::write(dir.path().join("d/inside"), "x").unwrap();
        let err = write_atomically(&dir.path().join("d"), b"x").unwrap_err().to_string();
        assert!(err.starts_with("cannot rename a file over ") && err.contains("/d: "), "{err}");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2, "no temporary left");
    }

    #[test]
    fn trees_are_copied_with_modes_links_and_nested_directories() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        let to = dir.path().join("to");
        fs::create_dir_all(from.join("a/b")).unwrap();
        fs::write(from.join("a/b/file"), b"data").unwrap();
        fs::set_permissions(from.join("a/b/file"), fs::Permissions::from_mode(0o640)).unwrap();
        fs::set_permissions(&from, fs::Permissions::from_mode(0o751)).unwrap();
        std::os::unix::fs::symlink("a/b/file", from.join("link")).unwrap();
        fs::create_dir(&to).unwrap();
        copy_tree(&from, &to).unwrap();
        assert_eq!(fs::read(to.join("a/b/file")).unwrap(), b"data");
        assert_eq!(fs::metadata(to.join("a/b/file")).unwrap().mode() & 0o7777, 0o640);
        assert_eq!(fs::metadata(&to).unwrap().mode() & 0o7777, 0o751);
        assert_eq!(fs::read_link(to.join("link")).unwrap(), Path::new("a/b/file"));
        assert_eq!(fs::read(to.join("link")).unwrap(), b"data", "the link resolves inside the copy");
    }

    #[test]
    fn sparse_files_stay_sparse_and_keep_their_data() {
        use std::os::unix::fs::FileExt;
        let tmp = tempfile::tempdir().unwrap();
        let (from, to) = (tmp.path().join("from"), tmp.path().join("to"));
        fs::create_dir(&from).unwrap();
        fs::create_dir(&to).unwrap();
        let image = fs::File::create(from.join("block.img")).unwrap();
        image.set_len(256 << 20).unwrap();
        image.write_all_at(b"head", 0).unwrap();
        image.write_all_at(b"middle", 100 << 20).unwrap();
        image.write_all_at(b"tail", (256 << 20) - 4).unwrap();
        copy_tree(&from, &to).unwrap();
        let copy = fs::File::open(to.join("block.img")).unwrap();
        assert_eq!(copy.metadata().unwrap().len(), 256 << 20);
        let read = |offset: u64, len: usize| {
            let mut buf = vec![0; len];
            copy.read_exact_at(&mut buf, offset).unwrap();
            buf
        };
        assert_eq!(read(0, 4), b"head");
        assert_eq!(read(100 << 20, 6), b"middle");
        assert_eq!(read((256 << 20) - 4, 4), b"tail");
        assert_eq!(read(1 << 20, 8), [0; 8], "holes read back as zeros");
        let allocated = copy.metadata().unwrap().blocks() * 512;
        assert!(allocated < 4 << 20, "a 256 MiB image with three writes took {allocated} bytes");
    }

    #[test]
    fn special_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        let to = dir.path().join("to");
        fs::create_dir_all(&from).unwrap();
        fs::create_dir_all(&to).unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(from.join("sock")).unwrap();
        let err = copy_tree(&from, &to).unwrap_err().to_string();
        assert!(err.contains("from/sock") && err.contains("not a directory, regular file"), "{err}");
        let err = copy_tree(&from.join("sock"), &to).unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
    }

    #[test]
    fn disk_usage_counts_allocated_blocks_once() {
        let dir = tempfile::tempdir().unwrap();
        let empty = disk_usage(dir.path()).unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("sub/f"), vec![7u8; 1 << 20]).unwrap();
        fs::hard_link(dir.path().join("sub/f"), dir.path().join("g")).unwrap();
        let used = disk_usage(dir.path()).unwrap();
        assert!(used >= empty + (1 << 20), "{used}");
        assert!(used < empty + (2 << 20), "a hard link is counted once: {used}");
        assert!(disk_usage(&dir.path().join("missing")).unwrap_err().to_string().contains("missing"));
    }

    #[test]
    fn created_directories_get_the_asked_mode_despite_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("open");
        create_dir_with_mode(&path, 0o777).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o777);
        remove_tree(&path).unwrap();
        remove_tree(&path).unwrap();
        assert!(!path.exists());
    }
}
