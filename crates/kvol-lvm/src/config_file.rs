//! Reading lvmd.yaml, or generating it from the node's volume groups when it is absent or kvol's own; a user's file is never replaced.

use std::path::{Path, PathBuf};

use crate::generate::{self, GenerateError};
use crate::lvmd::{self, LvmdConfig};
use crate::vgs::VolumeGroup;

/// A valid configuration and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub config: LvmdConfig,
    /// Whether kvol generated the file (it may regenerate it); false for a user's file.
    pub generated: bool,
}

/// Why there is no usable configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    Parse { path: PathBuf, source: lvmd::ParseError },
    #[error("{} is not a valid lvmd.yaml:\n{}", path.display(), problems.join("\n"))]
    Invalid { path: PathBuf, problems: Vec<String> },
    #[error("cannot generate {}: {source}", path.display())]
    Generate { path: PathBuf, source: GenerateError },
    #[error("cannot generate {}: cannot list the node's volume groups: {reason}", path.display())]
    VolumeGroups { path: PathBuf, reason: String },
}

impl ConfigError {
    /// Every problem, one per line item, each naming the file.
    pub fn problems(&self) -> Vec<String> {
        match self {
            ConfigError::Invalid { path, problems } => {
                problems.iter().map(|p| format!("{}: {p}", path.display())).collect()
            }
            other => vec![other.to_string()],
        }
    }
}

/// Reads and validates the file at `path` (touches nothing).
pub fn load(path: &Path) -> Result<Loaded, ConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
    load_text(path, &text)
}

fn load_text(path: &Path, text: &str) -> Result<Loaded, ConfigError> {
    let config = lvmd::parse(text).map_err(|source| ConfigError::Parse { path: path.into(), source })?;
    let problems: Vec<String> = lvmd::validate(&config).iter().map(ToString::to_string).collect();
    if !problems.is_empty() {
        return Err(ConfigError::Invalid { path: path.into(), problems });
    }
    Ok(Loaded { config, generated: generate::is_generated(text) })
}

/// The configuration at `path`: a user's file as it is (invalid → every problem); when the file is
/// absent or kvol generated it, one generated from `vgs` (the VG `wanted`, else the only one),
/// written atomically when its text changes.
pub fn ensure(path: &Path, vgs: &[VolumeGroup], wanted: Option<&str>) -> Result<Loaded, ConfigError> {
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(ConfigError::Read { path: path.into(), source }),
    };
    if let Some(text) = &existing
        && !generate::is_generated(text)
    {
        return load_text(path, text);
    }
    let config = generate::generate(vgs, wanted)
        .map_err(|source| ConfigError::Generate { path: path.into(), source })?;
    let text = generate::render_generated(&config);
    if existing.as_deref() != Some(text.as_str()) {
        write_atomically(path, &text).map_err(|source| ConfigError::Write { path: path.into(), source })?;
    }
    Ok(Loaded { config, generated: true })
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    kvol_plugin::atomic_file::replace(path, text.as_bytes(), kvol_plugin::atomic_file::Durability::Synced)
        .map_err(|e| e.source)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vg(name: &str) -> VolumeGroup {
        VolumeGroup { name: name.into(), size: 1 << 30, free: 1 << 30 }
    }

    #[test]
    fn absent_file_is_generated_and_a_generated_file_regenerated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etc/lvmd.yaml");
        let first = ensure(&path, &[vg("vg0")], None).unwrap();
        assert!(first.generated);
        assert_eq!(load(&path).unwrap(), first);
        let again = ensure(&path, &[vg("vg1")], None).unwrap();
        assert_eq!(again.config.device_classes[0].volume_group, "vg1");
        assert_eq!(load(&path).unwrap().config.device_classes[0].volume_group, "vg1");
    }

    #[test]
    fn a_users_file_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lvmd.yaml");
        let mine = "# mine\ndevice-classes:\n  - name: fast\n    volume-group: vg9\n    default: true\n";
        std::fs::write(&path, mine).unwrap();
        let loaded = ensure(&path, &[vg("vg0")], None).unwrap();
        assert!(!loaded.generated);
        assert_eq!(loaded.config.device_classes[0].name, "fast");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), mine);
    }

    #[test]
    fn a_users_invalid_file_lists_every_problem_and_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lvmd.yaml");
        let bad = "device-classes:\n  - name: a\n  - name: a\n    volume-group: vg\n";
        std::fs::write(&path, bad).unwrap();
        let err = ensure(&path, &[vg("vg0")], None).unwrap_err();
        let shown = path.display().to_string();
        assert_eq!(
            err.problems(),
            vec![
                format!("{shown}: device-classes[0] (\"a\").volume-group: should not be empty"),
                format!("{shown}: device-classes[1] (\"a\").name: duplicate device-class name"),
            ]
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), bad);
    }

    #[test]
    fn several_vgs_and_no_file_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lvmd.yaml");
        let err = ensure(&path, &[vg("a"), vg("b")], None).unwrap_err();
        assert!(err.to_string().contains("several volume groups (a, b)"), "{err}");
        assert!(!path.exists());
    }
}
