//! Driver names: `vendor~driver` directories to `vendor/driver` plugin names and executable paths, validated.
//!
//! Upstream un-escapes a driver directory's name by turning every `~` into `/`
//! (`UnescapeQualifiedName`), runs `<dir>/<last segment of the name>`, and refuses names that
//! are not Kubernetes qualified names (`IsQualifiedName`, checked by kvol-api's one
//! `validation::qualified_name`). Upstream skips such a driver silently; kvol says why.

use std::path::Path;

use kvol_api::validation::qualified_name;

use crate::driver::{CallLimits, FlexDriver};
use crate::error::{FlexError, Result};

/// The driver installed in `dir` (`<plugin dir>/vendor~driver`): name `vendor/driver`, executable
/// `dir/driver`. Refuses names that are not Kubernetes qualified names.
pub fn driver_in_dir(dir: &Path, limits: CallLimits) -> Result<FlexDriver> {
    let invalid = |reason: String| FlexError::InvalidName { dir: dir.to_path_buf(), reason };
    let dir_name = dir.file_name().ok_or_else(|| invalid("the path names no directory".to_string()))?;
    let dir_name =
        dir_name.to_str().ok_or_else(|| invalid(format!("the name {dir_name:?} is not valid UTF-8")))?;
    let name = driver_name(dir_name);
    qualified_name(&name).map_err(|reason| {
        invalid(format!("driver name {name:?} is not a Kubernetes qualified name: {reason}"))
    })?;
    let executable = dir.join(executable_name(&name));
    // Root owns drivers on a real node; the prober sets its configured owner.
    Ok(FlexDriver { name, executable, limits, owner_uid: 0 })
}

/// The directory name a driver is installed under: `vendor/driver` → `vendor~driver`
/// (upstream's `EscapeQualifiedName`).
pub fn plugin_dir_name(name: &str) -> String {
    name.replace('/', "~")
}

/// The driver name a directory stands for: `vendor~driver` → `vendor/driver`; a name without `~`
/// is a driver without a vendor (upstream's `UnescapeQualifiedName`).
pub fn driver_name(dir_name: &str) -> String {
    dir_name.replace('~', "/")
}

/// The file name of a driver's executable: the last `/` segment of its name.
pub fn executable_name(driver_name: &str) -> &str {
    driver_name.rsplit('/').next().unwrap_or(driver_name)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn directories_map_to_names_and_executables() {
        let cases = [
            ("/plugins/acme~lvm", "acme/lvm", "/plugins/acme~lvm/lvm"),
            (
                "/plugins/example.com~my-driver",
                "example.com/my-driver",
                "/plugins/example.com~my-driver/my-driver",
            ),
            ("/plugins/nfs", "nfs", "/plugins/nfs/nfs"),
            ("/plugins/k8s~Driver_2.x", "k8s/Driver_2.x", "/plugins/k8s~Driver_2.x/Driver_2.x"),
            ("relative/acme~cifs", "acme/cifs", "relative/acme~cifs/cifs"),
        ];
        for (dir, name, executable) in cases {
            let driver = driver_in_dir(Path::new(dir), CallLimits::default()).unwrap();
            assert_eq!(driver.name, name, "{dir}");
            assert_eq!(driver.executable, PathBuf::from(executable), "{dir}");
            assert_eq!(driver.limits, CallLimits::default());
            assert_eq!(plugin_dir_name(name), Path::new(dir).file_name().unwrap().to_str().unwrap());
        }
    }

    #[test]
    fn invalid_directories_are_refused_with_the_reason() {
        let cases = [
            (
                "/plugins/apple~banana:orange",
                "driver name \"apple/banana:orange\" is not a Kubernetes qualified name",
            ),
            ("/plugins/a~b~c", "its name part \"b/c\": it contains '/'"),
            ("/plugins/~lvm", "its prefix \"\": it is empty"),
            ("/plugins/acme~", "its name part \"\": it is empty"),
            ("/", "the path names no directory"),
        ];
        for (dir, reason) in cases {
            let err = driver_in_dir(Path::new(dir), CallLimits::default()).unwrap_err();
            assert!(matches!(err, FlexError::InvalidName { .. }), "{dir}: {err:?}");
            let message = err.to_string();
            assert!(message.starts_with(&format!("flexvolume driver directory {dir}: ")), "{message}");
            assert!(message.contains(reason), "{dir}: {message}");
        }
    }

    #[test]
    fn non_utf8_directory_names_are_refused() {
        use std::os::unix::ffi::OsStrExt;
        let dir = Path::new(std::ffi::OsStr::from_bytes(b"/plugins/acme~\xfflvm"));
        let err = driver_in_dir(dir, CallLimits::default()).unwrap_err();
        assert!(err.to_string().contains("is not valid UTF-8"), "{err}");
    }

    #[test]
    fn escaping_round_trips() {
        for name in ["acme/lvm", "lvm", "example.com/x"] {
            assert_eq!(driver_name(&plugin_dir_name(name)), name);
        }
        assert_eq!(executable_name("acme/lvm"), "lvm");
        assert_eq!(executable_name("lvm"), "lvm");
    }
}
