//! Filesystem volumes on loop devices (`--volume-backing loop`): a sparse image file per volume, formatted ext4 or xfs, mounted through a loop device, so a volume holds its size and no more.
//!
//! With the loop backing, CreateVolume makes `<state>/volumes/<id>.img`, a sparse file of the
//! volume's capacity (a default of [`DEFAULT_LOOP_BYTES`] without one; at least the
//! filesystem's minimum, [`FsType::min_bytes`]), formatted by `mkfs.ext4 -F -q -m 0` (as
//! kubelet's mount-utils formats, no blocks reserved for root) or `mkfs.xfs -f -q` through a
//! temporary file renamed into place, so a crash never leaves a half-made image. The type is
//! the capabilities' `mount.fs_type`, else the `csi.storage.k8s.io/fstype` parameter, else
//! ext4. NodeStageVolume attaches the image to a loop device with util-linux's `losetup`
//! (the binary, bounded by a deadline: [`crate::block::attach`], which first asks the kernel
//! with `losetup -j <image>` whether a device already holds it, so a restarted or `kill -9`ed
//! driver finds its devices again and never attaches a second one) and mounts the device on
//! the staging path, then marks the device to be detached once unused
//! ([`crate::block::detach_when_unused`]: a `losetup -d` of a mounted device sets its
//! autoclear flag), so the mount alone holds it: unmounted — by NodeUnstageVolume, or with a
//! mount namespace that dies, as the README's first command's does — the kernel detaches it,
//! and a driver `kill -9`ed or stopped leaves no device that outlives its mount. Publish
//! bind-mounts the staging path as for a directory volume; NodeUnstageVolume unmounts (and
//! detaches what is left, `losetup -d`). DeleteVolume removes the image and refuses while a
//! loop device still holds it.
//!
//! Growing: ControllerExpandVolume lengthens the file (`set_len`) and asks for node expansion;
//! NodeExpandVolume has the loop device read its new size (`losetup -c`) and grows the mounted
//! filesystem online (`resize2fs <device>`, `xfs_growfs <mount point>`). A volume staged while
//! its filesystem is smaller than its image (expanded while unstaged, or restored into a larger
//! volume) is grown at stage. Statistics are the mounted filesystem's own (statvfs).
//!
//! Snapshots copy the image (sparse, by `copy_file_range`, which reflinks where the state
//! directory's filesystem can) into `<state>/snapshots/<snap id>/fs.img`, the filesystem of a
//! staged volume frozen (`fsfreeze`) for the copy; a volume made from a snapshot or a volume
//! with an image gets a copy of that image (grown to its capacity at stage), whatever the
//! configured backing, and a volume made from a directory source is a directory volume.
//! Block volumes ([`crate::block`]), ephemeral inline volumes and static volumes stay
//! directories whatever the backing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tonic::Status;

use kvol_csi::proto::csi;

/// The StorageClass parameter (and volume-context key) naming a volume's filesystem type.
pub const FSTYPE_PARAMETER: &str = "csi.storage.k8s.io/fstype";
/// The size of a loop-backed volume made without a capacity.
pub const DEFAULT_LOOP_BYTES: i64 = 1 << 30;
/// The image of a snapshot of a loop-backed volume, in the snapshot's directory.
pub const SNAPSHOT_IMAGE: &str = "fs.img";
/// How long mkfs, resize2fs or xfs_growfs may run before it is killed.
const TOOL_DEADLINE: Duration = Duration::from_secs(300);
/// How long fsfreeze may run before it is killed.
const FREEZE_DEADLINE: Duration = Duration::from_secs(30);

/// The filesystem in a loop-backed volume's image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsType {
    Ext4,
    Xfs,
}

impl FsType {
    /// The type named `name` (`ext4` or `xfs`).
    pub fn parse(name: &str) -> Result<FsType, String> {
        match name {
            "ext4" => Ok(FsType::Ext4),
            "xfs" => Ok(FsType::Xfs),
            other => Err(format!("filesystem type {other:?} is not supported (ext4 or xfs)")),
        }
    }

    /// The name mount(2) and mkfs know it by.
    pub fn name(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
        }
    }

    /// The smallest image its mkfs formats: xfsprogs ≥ 5.19 refuses less than 300 MiB; ext4
    /// needs room for a journal.
    pub fn min_bytes(self) -> i64 {
        match self {
            FsType::Ext4 => 4 << 20,
            FsType::Xfs => 300 << 20,
        }
    }
}

/// The filesystem type the capabilities (`mount.fs_type`) or else the parameters
/// ([`FSTYPE_PARAMETER`]) ask for; `None` when neither names one. Capabilities naming two
/// types, or an unsupported type, are refused.
pub fn requested_fs_type(
    capabilities: &[csi::VolumeCapability],
    parameters: &std::collections::HashMap<String, String>,
) -> Result<Option<FsType>, String> {
    use csi::volume_capability::AccessType;
    let mut named = capabilities.iter().filter_map(|c| match &c.access_type {
        Some(AccessType::Mount(m)) if !m.fs_type.is_empty() => Some(m.fs_type.as_str()),
        _ => None,
    });
    let first = named.next();
    if let Some(other) = named.clone().find(|n| Some(*n) != first) {
        return Err(format!(
            "capabilities ask for two filesystem types, {:?} and {other:?}",
            first.unwrap_or_default()
        ));
    }
    let name =
        first.or_else(|| parameters.get(FSTYPE_PARAMETER).map(String::as_str).filter(|n| !n.is_empty()));
    name.map(FsType::parse).transpose()
}

/// The size of a new loop-backed volume of `fs` for `capacity` (0: none asked) within `limit`
/// (0: none): the capacity, [`DEFAULT_LOOP_BYTES`] without one, at least the filesystem's
/// minimum; OUT_OF_RANGE when the limit is below that minimum.
pub fn image_size(fs: FsType, capacity: i64, limit: i64) -> Result<i64, String> {
    let wanted = if capacity > 0 {
        capacity
    } else if limit > 0 {
        limit.min(DEFAULT_LOOP_BYTES)
    } else {
        DEFAULT_LOOP_BYTES
    };
    let size = wanted.max(fs.min_bytes());
    if limit > 0 && size > limit {
        return Err(format!(
            "{} needs at least {} bytes, more than the limit of {limit} bytes",
            fs.name(),
            fs.min_bytes()
        ));
    }
    Ok(size)
}

/// Runs `program` with `args`, killed past `deadline`; its stdout, or a lower-case error naming
/// the command and what it said. A program not installed is named as such.
pub(crate) fn run(program: &str, args: &[&str], deadline: Duration) -> Result<String, Status> {
    run_accepting(program, args, deadline, &[0])
}

/// [`run`], taking the exit codes in `accepted` for success.
fn run_accepting(
    program: &str,
    args: &[&str],
    deadline: Duration,
    accepted: &[i32],
) -> Result<String, Status> {
    let shown = format!("{program} {}", args.join(" ")).trim_end().to_string();
    let failed = |why: String| Status::internal(format!("{shown}: {why}"));
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Status::failed_precondition(format!(
                "{program} is not installed (not found in PATH), and {shown} needs it"
            )),
            _ => failed(format!("cannot run it: {e}")),
        })?;
    let started = Instant::now();
    loop {
        match child.try_wait().map_err(|e| failed(e.to_string()))? {
            Some(_) => break,
            None if started.elapsed() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(format!("no answer within {deadline:?}; killed")));
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    let output = child.wait_with_output().map_err(|e| failed(e.to_string()))?;
    if !output.status.code().is_some_and(|c| accepted.contains(&c)) {
        let said = String::from_utf8_lossy(&output.stderr).trim().to_string();
        return Err(failed(format!("{} ({said})", output.status)));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn text(path: &Path) -> Result<&str, Status> {
    path.to_str().ok_or_else(|| Status::internal(format!("{} is not UTF-8", path.display())))
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Status {
    Status::internal(format!("cannot {what} {}: {e}", path.display()))
}

/// Formats `image` (a file or a device) as `fs`.
pub fn mkfs(image: &Path, fs: FsType) -> Result<(), Status> {
    match fs {
        FsType::Ext4 => run("mkfs.ext4", &["-F", "-q", "-m", "0", text(image)?], TOOL_DEADLINE)?,
        FsType::Xfs => run("mkfs.xfs", &["-f", "-q", text(image)?], TOOL_DEADLINE)?,
    };
    Ok(())
}

/// The temporary file an image is made in before it is renamed to `image`.
fn temporary(image: &Path) -> PathBuf {
    let name = image.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    image.with_file_name(format!(".new-{name}"))
}

/// Makes `image`: a copy of the image `source` when given (its filesystem frozen for the copy
/// when mounted on the path given with it; lengthened to `bytes` if shorter), else a sparse
/// file of `bytes` formatted as `fs`; made beside it and renamed into place, so a crash
/// leaves no half-made image. A leftover of a crashed attempt (unrecorded) is replaced.
pub fn create_image(
    image: &Path,
    bytes: i64,
    fs: FsType,
    source: Option<(&Path, Option<&Path>)>,
) -> Result<(), Status> {
    let tmp = temporary(image);
    for leftover in [&tmp, &image.to_path_buf()] {
        match std::fs::remove_file(leftover) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_error("remove", leftover, e));
            }
            _ => {}
        }
    }
    let made = (|| {
        match source {
            Some((from, mounted_on)) => copy_image(from, &tmp, mounted_on)?,
            None => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&tmp)
                    .map_err(|e| io_error("create", &tmp, e))?;
                drop(file);
            }
        }
        grow_image(&tmp, bytes)?;
        if source.is_none() {
            mkfs(&tmp, fs)?;
        }
        std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| io_error("sync", &tmp, e))?;
        std::fs::rename(&tmp, image).map_err(|e| {
            Status::internal(format!("cannot rename {} to {}: {e}", tmp.display(), image.display()))
        })
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    made
}

/// Lengthens `image` to `bytes` (sparse); never shortens it.
pub fn grow_image(image: &Path, bytes: i64) -> Result<(), Status> {
    let file = std::fs::OpenOptions::new().write(true).open(image).map_err(|e| io_error("open", image, e))?;
    let now = file.metadata().map_err(|e| io_error("read", image, e))?.len();
    let wanted = u64::try_from(bytes).unwrap_or(0);
    if wanted > now {
        file.set_len(wanted).map_err(|e| {
            Status::internal(format!("cannot grow {} to {bytes} bytes: {e}", image.display()))
        })?;
    }
    Ok(())
}

/// The length of `image` in bytes.
pub fn image_len(image: &Path) -> Result<i64, Status> {
    let len = std::fs::metadata(image).map_err(|e| io_error("read", image, e))?.len();
    Ok(i64::try_from(len).unwrap_or(i64::MAX))
}

/// Grows the filesystem `fs` on loop `device`, mounted on `mount_point`, online to the size of
/// its image: the device rereads its backing file's size (`losetup -c`), then `resize2fs` or
/// `xfs_growfs` grows the filesystem (a no-op when it has the size already).
pub fn grow_filesystem(device: &Path, mount_point: &Path, fs: FsType) -> Result<(), Status> {
    run("losetup", &["-c", text(device)?], TOOL_DEADLINE)?;
    // The tool kubelet's generic resize picks for the filesystem.
    let (program, args) = kvol_plugin::fs_resize::grow_command(fs.name(), device, mount_point)
        .map_err(Status::failed_precondition)?;
    let args: Vec<&str> = args.iter().map(|a| text(Path::new(a))).collect::<Result<_, _>>()?;
    match fs {
        FsType::Ext4 => run(program, &args, TOOL_DEADLINE).map_err(|e| {
            // FailedPrecondition: not while mounted here; it grows when staged again.
            if e.message().contains("Permission denied to resize") {
                Status::failed_precondition(format!(
                    "{}; growing a mounted ext4 filesystem needs CAP_SYS_RESOURCE (it grows when staged again)",
                    e.message()
                ))
            } else {
                e
            }
        })?,
        FsType::Xfs => run(program, &args, TOOL_DEADLINE)?,
    };
    tracing::info!(device = %device.display(), path = %mount_point.display(), fs = fs.name(), "grew filesystem");
    Ok(())
}

/// Grows the unmounted ext4 filesystem on loop `device` to the size of its image: checked
/// first (`e2fsck -f -p`, which resize2fs asks for), then `resize2fs`. Needs no capability
/// beyond opening the device, unlike growing it mounted.
pub fn grow_unmounted_ext4(device: &Path) -> Result<(), Status> {
    run("losetup", &["-c", text(device)?], TOOL_DEADLINE)?;
    // 0: clean; 1: errors corrected.
    run_accepting("e2fsck", &["-f", "-p", text(device)?], TOOL_DEADLINE, &[0, 1])?;
    run("resize2fs", &[text(device)?], TOOL_DEADLINE)?;
    tracing::info!(device = %device.display(), "grew unmounted ext4 filesystem");
    Ok(())
}

/// A filesystem frozen (`fsfreeze -f`) so its image can be copied consistently; thawed when
/// dropped.
#[derive(Debug)]
pub struct Frozen(PathBuf);

impl Frozen {
    pub fn freeze(mount_point: &Path) -> Result<Frozen, Status> {
        run("fsfreeze", &["-f", text(mount_point)?], FREEZE_DEADLINE)?;
        Ok(Frozen(mount_point.to_path_buf()))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Ok(path) = text(&self.0)
            && let Err(e) = run("fsfreeze", &["-u", path], FREEZE_DEADLINE)
        {
            tracing::error!(path = %self.0.display(), "cannot thaw the filesystem: {}", e.message());
        }
    }
}

/// Copies the image `from` to `image` (a new file, sparse), the filesystem mounted on
/// `mounted_on` (a staged volume's) frozen for the copy.
pub fn copy_image(from: &Path, image: &Path, mounted_on: Option<&Path>) -> Result<(), Status> {
    let _frozen = mounted_on.map(Frozen::freeze).transpose()?;
    crate::fsutil::copy_file_sparse(from, image)
        .map_err(|e| Status::internal(format!("cannot copy {} to {}: {e}", from.display(), image.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const MIB: i64 = 1 << 20;

    fn mount(fs_type: &str) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Mount(
                csi::volume_capability::MountVolume { fs_type: fs_type.to_string(), ..Default::default() },
            )),
            access_mode: None,
        }
    }

    #[test]
    fn the_filesystem_type_comes_from_the_capabilities_then_the_parameters() {
        let params = |v: &str| HashMap::from([(FSTYPE_PARAMETER.to_string(), v.to_string())]);
        let none = HashMap::new();
        type Want = Result<Option<FsType>, &'static str>;
        let cases: &[(&[&str], &HashMap<String, String>, Want)] = &[
            (&[""], &none, Ok(None)),
            (&["xfs"], &none, Ok(Some(FsType::Xfs))),
            (&["", "xfs"], &none, Ok(Some(FsType::Xfs))),
            (&["ext4"], &params("xfs"), Ok(Some(FsType::Ext4))),
            (&[""], &params("xfs"), Ok(Some(FsType::Xfs))),
            (&[""], &params(""), Ok(None)),
            (&["ext4", "xfs"], &none, Err("two filesystem types, \"ext4\" and \"xfs\"")),
            (&["btrfs"], &none, Err("filesystem type \"btrfs\" is not supported (ext4 or xfs)")),
            (&[""], &params("ext3"), Err("filesystem type \"ext3\" is not supported")),
        ];
        for (types, parameters, want) in cases {
            let caps: Vec<_> = types.iter().map(|t| mount(t)).collect();
            let got = requested_fs_type(&caps, parameters);
            match (want, &got) {
                (Ok(w), Ok(g)) if w == g => {}
                (Err(w), Err(g)) if g.contains(w) => {}
                _ => panic!("{types:?} {parameters:?}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn image_sizes_respect_the_filesystems_minimum_and_the_limit() {
        let cases: &[(FsType, i64, i64, Result<i64, &str>)] = &[
            (FsType::Ext4, 16 * MIB, 0, Ok(16 * MIB)),
            (FsType::Ext4, MIB, 0, Ok(4 * MIB)),
            (FsType::Ext4, 0, 0, Ok(DEFAULT_LOOP_BYTES)),
            (FsType::Ext4, 0, 64 * MIB, Ok(64 * MIB)),
            (FsType::Xfs, 16 * MIB, 0, Ok(300 * MIB)),
            (FsType::Xfs, 16 * MIB, 400 * MIB, Ok(300 * MIB)),
            (FsType::Xfs, 16 * MIB, 32 * MIB, Err("xfs needs at least 314572800 bytes")),
            (FsType::Ext4, MIB, 2 * MIB, Err("more than the limit of 2097152 bytes")),
        ];
        for (fs, capacity, limit, want) in cases {
            let got = image_size(*fs, *capacity, *limit);
            match (want, &got) {
                (Ok(w), Ok(g)) if w == g => {}
                (Err(w), Err(g)) if g.contains(w) => {}
                _ => panic!("{fs:?} {capacity} {limit}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn filesystem_types_round_trip_through_their_names_and_json() {
        for fs in [FsType::Ext4, FsType::Xfs] {
            assert_eq!(FsType::parse(fs.name()), Ok(fs));
            assert_eq!(serde_json::to_string(&fs).unwrap(), format!("\"{}\"", fs.name()));
        }
    }

    #[test]
    fn a_missing_program_is_named() {
        let err = run("kvol-no-such-mkfs", &["-q", "/x"], Duration::from_secs(1)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert_eq!(
            err.message(),
            "kvol-no-such-mkfs is not installed (not found in PATH), and kvol-no-such-mkfs -q /x needs it"
        );
        let err = run("false", &[], Duration::from_secs(5)).unwrap_err();
        assert!(err.message().starts_with("false: exit status: 1"), "{}", err.message());
    }
}
