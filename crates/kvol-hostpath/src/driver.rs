//! The hostpath driver's core: configuration, mount seam and records behind one lock, shared by the controller and node services.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvol_plugin::mount::{MountPoint, Mounter};
use tonic::Status;

use crate::HostpathConfig;
use crate::fsutil;
use crate::state::{Layout, State};
use kvol_csi::CsiError;
use kvol_csi::proto::csi;

/// The mode of a new, empty volume's directory: writable by any pod user, as the kubelet
/// applies no fsGroup to a volume without an fsType unless the CSIDriver's fsGroupPolicy is File.
pub const VOLUME_DIR_MODE: u32 = 0o777;

/// The driver's state: every RPC that reads or changes volumes holds the lock for its whole
/// run, mounts included, so RPCs on the node never interleave. The lock is tokio's: an RPC
/// waiting for it yields instead of blocking a runtime thread.
pub(crate) type Shared = Arc<tokio::sync::Mutex<Hostpath>>;

/// Configuration, layout, mount seam and records.
#[derive(Debug)]
pub(crate) struct Hostpath {
    pub config: Arc<HostpathConfig>,
    pub layout: Layout,
    pub mounter: Arc<dyn Mounter>,
    pub state: State,
}

impl Hostpath {
    /// Creates the state directory's layout and loads the records.
    pub fn open(config: Arc<HostpathConfig>, mounter: Arc<dyn Mounter>) -> Result<Hostpath, CsiError> {
        let layout = Layout::new(&config.state_dir);
        layout.create()?;
        let state = State::load(&layout.state_file())?;
        Ok(Hostpath { config, layout, mounter, state })
    }

    /// Makes `next` the state: written to the state file first, kept in memory only once it
    /// is there, so memory and file never disagree.
    pub fn commit(&mut self, next: State) -> Result<(), Status> {
        next.save(&self.layout.state_file()).map_err(internal)?;
        self.state = next;
        Ok(())
    }

    /// Whether something is mounted exactly on `path`: one statx, no mount table.
    pub fn is_mounted(&self, path: &Path) -> Result<bool, Status> {
        let Some(path) = canonical(path)? else { return Ok(false) };
        self.mounter.is_mount_point(&path).map_err(internal)
    }

    /// The mount on `path` (the topmost one), if something is mounted exactly there.
    pub fn mount_on(&self, path: &Path) -> Result<Option<MountPoint>, Status> {
        let Some(path) = canonical(path)? else { return Ok(None) };
        // One statx for the common "not mounted yet"; the table only for what is there.
        if !self.mounter.is_mount_point(&path).map_err(internal)? {
            return Ok(None);
        }
        let mounts = self.mounter.mounts_under(&path).map_err(internal)?;
        Ok(mounts.into_iter().rfind(|m| m.target == path))
    }

    /// Refuses to go on when anything is mounted at or below `dir` (deleting or copying it
    /// would reach through the mount).
    pub fn refuse_mounts_under(&self, dir: &Path) -> Result<(), Status> {
        let Some(canonical) = canonical(dir)? else { return Ok(()) };
        let mounts = self.mounter.mounts_under(&canonical).map_err(internal)?;
        match mounts.first() {
            None => Ok(()),
            Some(m) => Err(Status::failed_precondition(format!(
                "{} has a mount on {} below it",
                dir.display(),
                m.target.display()
            ))),
        }
    }

    /// Makes `final_dir` as a copy of `source` (or empty with [`VOLUME_DIR_MODE`]) through a
    /// temporary directory beside it, so a crash never leaves a half-made `final_dir`.
    pub(crate) fn make_dir(&self, final_dir: &Path, source: Option<&Path>) -> Result<(), Status> {
        self.make_dir_with(final_dir, |tmp| match source {
            Some(from) => {
                self.refuse_mounts_under(from).and_then(|()| fsutil::copy_tree(from, tmp).map_err(internal))
            }
            None => Ok(()),
        })
    }

    /// Makes `final_dir` through a temporary directory beside it (mode [`VOLUME_DIR_MODE`])
    /// that `fill` fills, so a crash never leaves a half-made `final_dir`.
    pub(crate) fn make_dir_with(
        &self,
        final_dir: &Path,
        fill: impl FnOnce(&Path) -> Result<(), Status>,
    ) -> Result<(), Status> {
        let parent = final_dir.parent().unwrap_or(self.layout.root());
        let name = final_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = parent.join(format!(".new-{name}"));
        // Leftovers of a crashed attempt: unrecorded, so nobody knows of them.
        for leftover in [&tmp, &final_dir.to_path_buf()] {
            self.refuse_mounts_under(leftover)?;
            fsutil::remove_tree(leftover).map_err(internal)?;
        }
        fsutil::create_dir_with_mode(&tmp, VOLUME_DIR_MODE).map_err(internal)?;
        let filled = fill(&tmp);
        let renamed = filled.and_then(|()| {
            std::fs::rename(&tmp, final_dir).map_err(|e| {
                Status::internal(format!("cannot rename {} to {}: {e}", tmp.display(), final_dir.display()))
            })
        });
        if renamed.is_err() {
            let _ = fsutil::remove_tree(&tmp);
        }
        renamed
    }

    /// This node's topology: `{topology.<driver>/node: <node>}`.
    pub fn topology(&self) -> csi::Topology {
        csi::Topology {
            segments: HashMap::from([(self.config.topology_key(), self.config.node_name.clone())]),
        }
    }
}

/// `path` with symbolic links resolved; `None` when it does not exist.
fn canonical(path: &Path) -> Result<Option<PathBuf>, Status> {
    match std::fs::canonicalize(path) {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Status::internal(format!("cannot resolve {}: {e}", path.display()))),
    }
}

/// An INTERNAL status carrying an error's message.
pub(crate) fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// Checks that a required string field is set.
pub(crate) fn required<'a>(value: &'a str, what: &str) -> Result<&'a str, Status> {
    if value.is_empty() { Err(Status::invalid_argument(format!("{what} is missing"))) } else { Ok(value) }
}

/// Checks that a required path field is set and absolute.
pub(crate) fn required_path(value: &str, what: &str) -> Result<PathBuf, Status> {
    let path = Path::new(required(value, what)?);
    if !path.is_absolute() {
        return Err(Status::invalid_argument(format!("{what} {value} is not an absolute path")));
    }
    // Normalised (no trailing slash, no `.`), so the same path is one record key.
    Ok(path.components().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn required_fields_are_checked_and_paths_normalised() {
        type Want<'a> = Result<&'a str, (Code, &'a str)>;
        let cases: &[(&str, Want)] = &[
            ("/a/b", Ok("/a/b")),
            ("/a/b/", Ok("/a/b")),
            ("/a/./b", Ok("/a/b")),
            ("", Err((Code::InvalidArgument, "target path is missing"))),
            ("a/b", Err((Code::InvalidArgument, "target path a/b is not an absolute path"))),
        ];
        for (value, want) in cases {
            let got = required_path(value, "target path");
            match (want, got) {
                (Ok(w), Ok(g)) => assert_eq!(g, Path::new(w), "{value}"),
                (Err((code, msg)), Err(s)) => {
                    assert_eq!((s.code(), s.message()), (*code, *msg), "{value}");
                }
                (want, got) => panic!("{value}: want {want:?}, got {got:?}"),
            }
        }
        assert_eq!(required("x", "volume id").unwrap(), "x");
        assert_eq!(required("", "volume id").unwrap_err().message(), "volume id is missing");
    }
}
