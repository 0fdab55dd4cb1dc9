//! Filesystems on volume devices: what `blkid -p` finds, the format-or-mount decision that never formats a device holding data, mkfs, and growing a mounted filesystem.

use std::path::Path;
use std::time::Duration;

use crate::command::{self, CommandError};

/// The filesystem a mount capability without an fs type gets.
pub const DEFAULT_FS: &str = "ext4";
/// The filesystems the driver makes and grows.
pub const SUPPORTED_FS: [&str; 2] = ["ext4", "xfs"];

/// What `blkid -p -o export` reports of a device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probe {
    /// `TYPE`: a filesystem (or another signature: swap, LVM2_member…).
    pub kind: Option<String>,
    /// `PTTYPE`: a partition table.
    pub partition_table: Option<String>,
}

/// What NodeStage does with a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepare {
    /// Nothing on it: make the filesystem, then mount.
    Format,
    /// The filesystem asked for is there: mount it as it is.
    Mount,
}

/// The fs type a capability asks for: `requested`, or [`DEFAULT_FS`] when empty.
pub fn fs_type(requested: &str) -> Result<&str, String> {
    match requested {
        "" => Ok(DEFAULT_FS),
        fs if SUPPORTED_FS.contains(&fs) => Ok(fs),
        other => Err(format!("fs type {other:?} is not supported; use one of {}", SUPPORTED_FS.join(", "))),
    }
}

/// Reads `blkid -p -o export` output (`KEY=value` lines).
pub fn parse_blkid(output: &str) -> Probe {
    let mut probe = Probe::default();
    for line in output.lines() {
        match line.split_once('=') {
            Some(("TYPE", v)) => probe.kind = Some(v.to_string()),
            Some(("PTTYPE", v)) => probe.partition_table = Some(v.to_string()),
            _ => {}
        }
    }
    probe
}

/// Format or mount `device` found as `probe`, for a filesystem `wanted`: only a device with no
/// signature at all is formatted; one holding anything else is refused, never overwritten.
pub fn decide(device: &Path, probe: &Probe, wanted: &str) -> Result<Prepare, String> {
    match (&probe.kind, &probe.partition_table) {
        (Some(kind), _) if kind == wanted => Ok(Prepare::Mount),
        (Some(kind), _) => Err(format!(
            "{} holds {kind}, not the {wanted} asked for; it is neither formatted nor mounted",
            device.display()
        )),
        (None, Some(table)) => Err(format!(
            "{} holds a {table} partition table; it is neither formatted nor mounted",
            device.display()
        )),
        (None, None) => Ok(Prepare::Format),
    }
}

/// What is on `device` (blkid's exit status 2 means nothing is).
pub async fn probe(device: &Path, timeout: Duration) -> Result<Probe, CommandError> {
    let device = device.to_string_lossy();
    let finished = command::output("blkid", &["-p", "-o", "export", &device], timeout).await?;
    match finished.code {
        Some(2) => Ok(Probe::default()),
        _ => finished.ok().map(|out| parse_blkid(&out)),
    }
}

/// Makes a filesystem `fs` on `device` (which [`decide`] found empty).
pub async fn make(device: &Path, fs: &str, timeout: Duration) -> Result<(), CommandError> {
    let device = device.to_string_lossy();
    match fs {
        "xfs" => command::run("mkfs.xfs", &["-q", &device], timeout).await.map(drop),
        _ => command::run("mkfs.ext4", &["-q", "-F", "-m", "0", &device], timeout).await.map(drop),
    }
}

/// Grows the filesystem `fs` on `device`, mounted on `mounted`, to fill the device, with the
/// tool kubelet's generic resize picks (`kvol_plugin::fs_resize::grow_command`).
pub async fn grow(fs: &str, device: &Path, mounted: &Path, timeout: Duration) -> Result<(), CommandError> {
    let (program, args) = kvol_plugin::fs_resize::grow_command(fs, device, mounted).map_err(|reason| {
        CommandError::Failed { command: format!("growing {fs}"), status: "refused".into(), stderr: reason }
    })?;
    let args: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    command::run(program, &args, timeout).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fs_types_default_to_ext4_and_are_limited() {
        let rows = [
            ("", Ok("ext4")),
            ("ext4", Ok("ext4")),
            ("xfs", Ok("xfs")),
            ("btrfs", Err("fs type \"btrfs\" is not supported; use one of ext4, xfs")),
        ];
        for (asked, want) in rows {
            assert_eq!(fs_type(asked), want.map_err(str::to_string), "{asked}");
        }
    }

    #[test]
    fn only_an_empty_device_is_formatted() {
        let dev = Path::new("/dev/vg0/vol-1");
        // Captured from blkid 2.38 on an ext4 LV, an xfs one, and a disk with a GPT.
        let ext4 =
            "DEVNAME=/dev/vg0/vol-1\nUUID=4c1f\nVERSION=1.0\nBLOCK_SIZE=1024\nTYPE=ext4\nUSAGE=filesystem\n";
        let xfs = "DEVNAME=/dev/vg0/vol-1\nUUID=9e2a\nBLOCK_SIZE=512\nTYPE=xfs\nUSAGE=filesystem\n";
        let gpt = "DEVNAME=/dev/vg0/vol-1\nPTUUID=77aa\nPTTYPE=gpt\n";
        let rows = [
            ("", "ext4", Ok(Prepare::Format)),
            (ext4, "ext4", Ok(Prepare::Mount)),
            (xfs, "xfs", Ok(Prepare::Mount)),
            (
                xfs,
                "ext4",
                Err("/dev/vg0/vol-1 holds xfs, not the ext4 asked for; it is neither formatted nor mounted"),
            ),
            (
                "TYPE=swap\n",
                "ext4",
                Err("/dev/vg0/vol-1 holds swap, not the ext4 asked for; it is neither formatted nor mounted"),
            ),
            (
                gpt,
                "ext4",
                Err("/dev/vg0/vol-1 holds a gpt partition table; it is neither formatted nor mounted"),
            ),
        ];
        for (blkid, wanted, want) in rows {
            assert_eq!(decide(dev, &parse_blkid(blkid), wanted), want.map_err(str::to_string), "{blkid:?}");
        }
    }
}
