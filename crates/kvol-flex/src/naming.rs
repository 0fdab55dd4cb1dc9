//! Driver names: `vendor~driver` directories to `vendor/driver` plugin names and executable paths, validated.
//!
//! Upstream un-escapes a driver directory's name by turning every `~` into `/`
//! (`UnescapeQualifiedName`), runs `<dir>/<last segment of the name>`, and refuses names that
//! are not Kubernetes qualified names (`IsQualifiedName`): an optional DNS-1123 subdomain prefix
//! of at most 253 characters and a `/`, then a name of at most 63 characters of
//! `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`. Upstream skips such a driver silently; kvol says why.

use std::path::Path;

use crate::driver::{CallLimits, FlexDriver};
use crate::error::{FlexError, Result};

/// Longest name part of a qualified name.
pub const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
/// Longest DNS-1123 subdomain (the prefix of a qualified name).
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;

/// The driver installed in `dir` (`<plugin dir>/vendor~driver`): name `vendor/driver`, executable
/// `dir/driver`. Refuses names that are not Kubernetes qualified names.
pub fn driver_in_dir(dir: &Path, limits: CallLimits) -> Result<FlexDriver> {
    let invalid = |reason: String| FlexError::InvalidName { dir: dir.to_path_buf(), reason };
    let dir_name = dir.file_name().ok_or_else(|| invalid("the path names no directory".to_string()))?;
    let dir_name =
        dir_name.to_str().ok_or_else(|| invalid(format!("the name {dir_name:?} is not valid UTF-8")))?;
    let name = driver_name(dir_name);
    validate_driver_name(&name).map_err(|reason| {
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

/// Checks a driver name as upstream's `IsQualifiedName` does; the error lists every reason.
pub fn validate_driver_name(name: &str) -> std::result::Result<(), String> {
    let mut errors = Vec::new();
    let parts: Vec<&str> = name.split('/').collect();
    let local = match parts.as_slice() {
        [local] => *local,
        [prefix, local] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_string());
            } else {
                errors
                    .extend(dns1123_subdomain_errors(prefix).into_iter().map(|e| format!("prefix part {e}")));
            }
            *local
        }
        _ => {
            return Err(format!(
                "it has {} '/'; a qualified name is a name with an optional DNS subdomain prefix and one '/' \
                 (e.g. 'example.com/MyName')",
                parts.len() - 1
            ));
        }
    };
    if local.is_empty() {
        errors.push("name part must be non-empty".to_string());
    } else if local.len() > QUALIFIED_NAME_MAX_LENGTH {
        errors.push(format!("name part must be no more than {QUALIFIED_NAME_MAX_LENGTH} characters"));
    }
    if !local.is_empty() && !is_qualified_name_part(local) {
        errors.push(format!(
            "name part {local:?} must consist of alphanumeric characters, '-', '_' or '.', \
             and must start and end with an alphanumeric character"
        ));
    }
    if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`
fn is_qualified_name_part(part: &str) -> bool {
    let bytes = part.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else { return false };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Why `value` is not a DNS-1123 subdomain (upstream's `IsDNS1123Subdomain`): at most 253
/// characters of dot-separated labels `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errors.push(format!("must be no more than {DNS1123_SUBDOMAIN_MAX_LENGTH} characters"));
    }
    let label_ok = |label: &str| {
        let bytes = label.as_bytes();
        match (bytes.first(), bytes.last()) {
            (Some(first), Some(last)) => {
                is_lower_alnum(*first)
                    && is_lower_alnum(*last)
                    && bytes.iter().all(|b| is_lower_alnum(*b) || *b == b'-')
            }
            _ => false,
        }
    };
    if !value.split('.').all(label_ok) {
        errors.push(format!(
            "{value:?} must be a DNS-1123 subdomain: lower case alphanumeric characters, '-' or '.', \
             starting and ending with an alphanumeric character"
        ));
    }
    errors
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
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
    fn names_are_checked_like_is_qualified_name() {
        let long_name = "a".repeat(63);
        let too_long_name = "a".repeat(64);
        let long_prefix = format!("{}.com/x", "a".repeat(249));
        let too_long_prefix = format!("{}.com/x", "a".repeat(250));
        let cases: Vec<(&str, Option<&str>)> = vec![
            ("acme/lvm", None),
            ("lvm", None),
            ("example.com/My_Driver-1.0", None),
            ("a/b", None),
            ("1/2", None),
            ("sub.example.com/x", None),
            (&long_name, None),
            (&long_prefix, None),
            (
                "apple/banana:orange",
                Some("name part \"banana:orange\" must consist of alphanumeric characters"),
            ),
            ("a/b/c", Some("it has 2 '/'")),
            ("/lvm", Some("prefix part must be non-empty")),
            ("acme/", Some("name part must be non-empty")),
            ("", Some("name part must be non-empty")),
            ("Acme/lvm", Some("prefix part \"Acme\" must be a DNS-1123 subdomain")),
            ("acme_corp/lvm", Some("prefix part \"acme_corp\" must be a DNS-1123 subdomain")),
            ("acme./lvm", Some("must be a DNS-1123 subdomain")),
            ("-acme/lvm", Some("must be a DNS-1123 subdomain")),
            ("acme/-lvm", Some("must start and end with an alphanumeric character")),
            ("acme/lvm.", Some("must start and end with an alphanumeric character")),
            ("acme/lv m", Some("must consist of alphanumeric characters")),
            ("acme/lvé", Some("must consist of alphanumeric characters")),
            (&too_long_name, Some("name part must be no more than 63 characters")),
            (&too_long_prefix, Some("prefix part must be no more than 253 characters")),
        ];
        for (name, expected) in cases {
            match (validate_driver_name(name), expected) {
                (Ok(()), None) => {}
                (Err(reason), Some(expected)) => assert!(reason.contains(expected), "{name:?}: {reason}"),
                (got, expected) => panic!("{name:?}: got {got:?}, expected {expected:?}"),
            }
        }
        // Every reason is listed, as upstream lists them.
        let reason = validate_driver_name(&format!("Bad_Prefix/{}:", "x".repeat(70))).unwrap_err();
        assert_eq!(reason.matches("; ").count(), 2, "{reason}");
    }

    #[test]
    fn invalid_directories_are_refused_with_the_reason() {
        let cases = [
            (
                "/plugins/apple~banana:orange",
                "driver name \"apple/banana:orange\" is not a Kubernetes qualified name",
            ),
            ("/plugins/a~b~c", "it has 2 '/'"),
            ("/plugins/~lvm", "prefix part must be non-empty"),
            ("/plugins/acme~", "name part must be non-empty"),
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
