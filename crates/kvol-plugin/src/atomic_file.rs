//! Files replaced whole: written beside their place, optionally synced, renamed over the old one.
//!
//! kvol's one implementation of "a reader sees the old content or the new one, never a mix";
//! records, status, pid files and the config files kvol writes for its components all go
//! through [`replace`].

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Whether a replacement must survive a power loss once [`replace`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// The file and the rename are fsynced (the directory too): for records and configs.
    Synced,
    /// Only atomic: after a power loss a reader may see the older file, never a torn one. For
    /// views rewritten often (status) where an fsync would sit on every operation's path.
    AtomicOnly,
}

/// The temporary file [`replace`] writes before renaming it to `path`: hidden, beside it, named
/// after it and this process, so two writers never share one.
pub fn temporary_for(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

/// A replacement that did not happen: what could not be done to which file.
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {}: {source}", path.display())]
pub struct ReplaceError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Replaces `path` with `bytes`, creating its directory if needed; the temporary file is
/// removed when anything fails, and the old content stays.
pub fn replace(path: &Path, bytes: &[u8], durability: Durability) -> Result<(), ReplaceError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(failed("create directory", dir))?;
    let temporary = temporary_for(path);
    let written = (|| {
        let mut file = fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        if durability == Durability::Synced {
            file.sync_all()?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&temporary);
        return Err(failed("write", &temporary)(e));
    }
    if let Err(e) = fs::rename(&temporary, path) {
        let _ = fs::remove_file(&temporary);
        return Err(failed("rename a file over", path)(e));
    }
    if durability == Durability::Synced {
        fs::File::open(dir).and_then(|d| d.sync_all()).map_err(failed("sync directory", dir))?;
    }
    Ok(())
}

fn failed<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ReplaceError + 'a {
    move |source| ReplaceError { op, path: path.to_path_buf(), source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_and_no_temporary_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/config.yaml");
        for (durability, text) in [(Durability::Synced, "one"), (Durability::AtomicOnly, "two")] {
            replace(&path, text.as_bytes(), durability).unwrap();
            assert_eq!(fs::read_to_string(&path).unwrap(), text);
        }
        let names: Vec<_> =
            fs::read_dir(path.parent().unwrap()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, ["config.yaml"], "only the file itself");
    }

    #[test]
    fn a_failed_write_names_the_file_and_keeps_the_old_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kept");
        fs::write(&path, "old").unwrap();
        // A directory where the temporary file would go makes the write fail.
        fs::create_dir(temporary_for(&path)).unwrap();
        let error = replace(&path, b"new", Durability::Synced).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("cannot write {}: {}", temporary_for(&path).display(), error.source)
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "old");
    }
}
