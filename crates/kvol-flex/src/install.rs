//! The atomic driver installer: copy to `vendor~driver/.driver`, fsync, rename over `driver`, fsync the directory.
//!
//! This is the install the Flexvolume design settled on ("the only atomic file op is rename"):
//! the prober ignores dot files, so it never sees the copy half-written, and a driver being
//! executed keeps its old inode. Only the driver's own directory is touched. Installing the
//! same bytes and mode again writes nothing.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::driver::CallLimits;
use crate::error::{FlexError, Result};
use crate::naming;

/// Where kubelet looks for Flexvolume drivers unless told otherwise.
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec";

/// The mode every installed driver gets.
pub const DRIVER_MODE: u32 = 0o755;

/// What an install did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstallOutcome {
    /// There was no driver at the path before.
    Installed,
    /// Another version (other bytes, another mode, not a regular file) was replaced.
    Updated,
    /// The same bytes with the same mode were there already; nothing was written.
    Unchanged,
}

impl InstallOutcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            InstallOutcome::Installed => "installed",
            InstallOutcome::Updated => "updated",
            InstallOutcome::Unchanged => "unchanged",
        }
    }
}

/// The result of [`install`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    /// The plugin name (`vendor/driver`).
    pub name: String,
    /// The installed executable, `<plugin dir>/<vendor~driver>/<driver>`.
    pub executable: PathBuf,
    pub outcome: InstallOutcome,
}

/// What is at the executable's path now, as far as the install decision goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Current {
    Missing,
    /// A regular file with these permission bits and whether its bytes equal the new ones.
    File {
        mode: u32,
        same_bytes: bool,
    },
    /// Anything else (a symlink, a directory, …); renaming over it decides whether that works.
    Other,
}

/// The install decision: nothing to do when the same bytes and mode are installed already.
pub fn decide(current: &Current) -> InstallOutcome {
    match current {
        Current::Missing => InstallOutcome::Installed,
        Current::File { mode, same_bytes: true } if *mode == DRIVER_MODE => InstallOutcome::Unchanged,
        Current::File { .. } | Current::Other => InstallOutcome::Updated,
    }
}

/// Why `dir_name` cannot be a driver directory name, before the qualified-name rules of
/// [`naming`] (which look at the last component of a path only): it must be one path component
/// the prober would not ignore.
pub fn check_dir_name(dir_name: &str) -> Result<(), String> {
    if dir_name.is_empty() {
        return Err("the driver name is empty".to_string());
    }
    if dir_name.contains('/') || dir_name.contains('\0') {
        return Err(
            "the driver name must be one path component (vendor~driver), without / or NUL".to_string()
        );
    }
    if dir_name.starts_with('.') {
        return Err("the driver name must not start with '.': the prober ignores dot directories".to_string());
    }
    Ok(())
}

/// Installs the driver file `source` as `<plugin_dir>/<dir_name>/<driver>` (mode 0755), where
/// `dir_name` is `vendor~driver` (or just `driver`). Creates the driver directory (0755) if
/// missing; the plugin directory must exist. On failure the previous version stays in place
/// and no temporary file is left behind.
pub fn install(source: &Path, plugin_dir: &Path, dir_name: &str) -> Result<Installed> {
    let driver_dir = plugin_dir.join(dir_name);
    check_dir_name(dir_name).map_err(|reason| FlexError::InvalidName { dir: driver_dir.clone(), reason })?;
    let driver = naming::driver_in_dir(&driver_dir, CallLimits::default())?;
    let executable = driver.executable;
    let file_name =
        executable.file_name().and_then(|n| n.to_str()).ok_or_else(|| FlexError::InvalidName {
            dir: driver_dir.clone(),
            reason: "the driver executable has no file name".to_string(),
        })?;

    let bytes = fs::read(source).map_err(|e| FlexError::io("read driver file", source, e))?;
    match fs::metadata(plugin_dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            let e = std::io::Error::new(ErrorKind::NotADirectory, "not a directory");
            return Err(FlexError::io("use plugin directory", plugin_dir, e));
        }
        Err(e) => return Err(FlexError::io("use plugin directory", plugin_dir, e)),
    }
    ensure_driver_dir(plugin_dir, &driver_dir)?;

    let outcome = decide(&current(&executable, &bytes)?);
    if outcome != InstallOutcome::Unchanged {
        let temp = driver_dir.join(format!(".{file_name}"));
        write_and_rename(&bytes, &temp, &executable)?;
        sync_dir(&driver_dir)?;
    }
    Ok(Installed { name: driver.name, executable, outcome })
}

/// Creates `driver_dir` (0755, whatever the umask) if missing and makes its entry durable.
fn ensure_driver_dir(plugin_dir: &Path, driver_dir: &Path) -> Result<()> {
    match DirBuilder::new().mode(DRIVER_MODE).create(driver_dir) {
        Ok(()) => {
            fs::set_permissions(driver_dir, fs::Permissions::from_mode(DRIVER_MODE))
                .map_err(|e| FlexError::io("set the mode of", driver_dir, e))?;
            sync_dir(plugin_dir)
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists && driver_dir.is_dir() => Ok(()),
        Err(e) => Err(FlexError::io("create driver directory", driver_dir, e)),
    }
}

/// What is installed at `executable` now, compared with `bytes`.
fn current(executable: &Path, bytes: &[u8]) -> Result<Current> {
    let meta = match fs::symlink_metadata(executable) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Current::Missing),
        Err(e) => return Err(FlexError::io("inspect installed driver", executable, e)),
    };
    if !meta.file_type().is_file() {
        return Ok(Current::Other);
    }
    let same_bytes = meta.len() == bytes.len() as u64
        && fs::read(executable).map_err(|e| FlexError::io("read installed driver", executable, e))? == bytes;
    Ok(Current::File { mode: meta.mode() & 0o7777, same_bytes })
}

/// Writes `bytes` to the fresh file `temp` (0755), fsyncs it and renames it over `target`;
/// removes `temp` if any step fails.
fn write_and_rename(bytes: &[u8], temp: &Path, target: &Path) -> Result<()> {
    // A leftover from an interrupted install is ours to replace; removing it first means the
    // exclusive create below never follows a symlink someone planted there.
    if fs::symlink_metadata(temp).is_ok() {
        fs::remove_file(temp).map_err(|e| FlexError::io("remove stale temporary file", temp, e))?;
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(DRIVER_MODE)
        .open(temp)
        .map_err(|e| FlexError::io("create temporary file", temp, e))?;
    let mut guard = RemoveOnDrop { path: temp, armed: true };
    file.write_all(bytes).map_err(|e| FlexError::io("write temporary file", temp, e))?;
    // The umask may have cleared bits of the create mode.
    file.set_permissions(fs::Permissions::from_mode(DRIVER_MODE))
        .map_err(|e| FlexError::io("set the mode of", temp, e))?;
    file.sync_all().map_err(|e| FlexError::io("fsync temporary file", temp, e))?;
    drop(file);
    fs::rename(temp, target).map_err(|e| FlexError::io("rename the new driver over", target, e))?;
    guard.armed = false;
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| FlexError::io("fsync directory", dir, e))
}

/// Removes the temporary file unless the install got as far as the rename.
struct RemoveOnDrop<'a> {
    path: &'a Path,
    armed: bool,
}

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = fs::remove_file(self.path)
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove temporary driver file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (what is installed, expected outcome)
    #[test]
    fn install_decisions() {
        let rows: &[(Current, InstallOutcome)] = &[
            (Current::Missing, InstallOutcome::Installed),
            (Current::File { mode: 0o755, same_bytes: true }, InstallOutcome::Unchanged),
            (Current::File { mode: 0o755, same_bytes: false }, InstallOutcome::Updated),
            (Current::File { mode: 0o644, same_bytes: true }, InstallOutcome::Updated),
            (Current::File { mode: 0o777, same_bytes: true }, InstallOutcome::Updated),
            (Current::File { mode: 0o4755, same_bytes: true }, InstallOutcome::Updated),
            (Current::Other, InstallOutcome::Updated),
        ];
        for (current, want) in rows {
            assert_eq!(decide(current), *want, "{current:?}");
        }
    }

    /// (directory name, refused with)
    #[test]
    fn dir_name_rules() {
        let rows: &[(&str, Option<&str>)] = &[
            ("example.com~nfs", None),
            ("nfs", None),
            ("", Some("the driver name is empty")),
            ("a/b", Some("the driver name must be one path component (vendor~driver), without / or NUL")),
            ("..", Some("the driver name must not start with '.': the prober ignores dot directories")),
            (
                ".hidden~x",
                Some("the driver name must not start with '.': the prober ignores dot directories"),
            ),
            (".", Some("the driver name must not start with '.': the prober ignores dot directories")),
        ];
        for (name, want) in rows {
            assert_eq!(check_dir_name(name).err().as_deref(), *want, "{name:?}");
        }
    }
}
