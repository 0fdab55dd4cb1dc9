//! Filesystem and volume usage as the driver reports it (NodeGetVolumeStats, GetCapacity): statvfs(3) counters, turned into CSI's byte and inode figures.

use std::path::Path;

use kvol_csi::proto::csi;
use tonic::Status;

/// Filesystem counters as statvfs(3) reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsCounters {
    pub fragment_size: u64,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
    pub files_available: u64,
}

/// The byte and inode usage of a filesystem: available to unprivileged users, total, and used
/// (total less free); values past i64 are clamped.
pub fn usage(c: FsCounters) -> Vec<csi::VolumeUsage> {
    let clamp = |n: u128| i64::try_from(n).unwrap_or(i64::MAX);
    let bytes = |blocks: u64| clamp(u128::from(blocks) * u128::from(c.fragment_size));
    vec![
        csi::VolumeUsage {
            available: bytes(c.blocks_available),
            total: bytes(c.blocks),
            used: bytes(c.blocks.saturating_sub(c.blocks_free)),
            unit: csi::volume_usage::Unit::Bytes as i32,
        },
        csi::VolumeUsage {
            available: clamp(c.files_available.into()),
            total: clamp(c.files.into()),
            used: clamp(c.files.saturating_sub(c.files_free).into()),
            unit: csi::volume_usage::Unit::Inodes as i32,
        },
    ]
}

/// The usage of a volume of `size` bytes (its visible size; 0 when unknown) holding `used`
/// bytes on a filesystem with counters `c`: bytes total = the size, used = what its files
/// take, available = the rest, no more than the filesystem has; inodes are the
/// filesystem's. An unknown size reports the filesystem's bytes.
pub fn volume_usage(c: FsCounters, size: i64, used: u64) -> Vec<csi::VolumeUsage> {
    let mut all = usage(c);
    if size > 0 {
        let used = i64::try_from(used).unwrap_or(i64::MAX);
        let fs_available = all[0].available;
        all[0].total = size;
        all[0].used = used;
        all[0].available = size.saturating_sub(used).clamp(0, fs_available.max(0));
    }
    all
}

/// A block volume's usage: its size only, in bytes (a device has no free space or inodes to
/// report; kubelet shows only the capacity of a block volume too).
pub fn block_usage(size: i64) -> Vec<csi::VolumeUsage> {
    vec![csi::VolumeUsage { total: size, unit: csi::volume_usage::Unit::Bytes as i32, ..Default::default() }]
}

/// The bytes the filesystem holding `path` has available to unprivileged users.
pub(crate) fn filesystem_available(path: &Path) -> Result<i64, Status> {
    Ok(usage(counters(path)?)[0].available)
}

/// The statvfs(3) counters of the filesystem holding `path`.
pub fn counters(path: &Path) -> Result<FsCounters, Status> {
    let s = nix::sys::statvfs::statvfs(path)
        .map_err(|e| Status::internal(format!("cannot statvfs {}: {e}", path.display())))?;
    Ok(FsCounters {
        fragment_size: s.fragment_size(),
        blocks: s.blocks(),
        blocks_free: s.blocks_free(),
        blocks_available: s.blocks_available(),
        files: s.files(),
        files_free: s.files_free(),
        files_available: s.files_available(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_in_bytes_and_inodes_and_clamped() {
        let c = FsCounters {
            fragment_size: 4096,
            blocks: 100,
            blocks_free: 40,
            blocks_available: 30,
            files: 1000,
            files_free: 900,
            files_available: 800,
        };
        let u = usage(c);
        assert_eq!((u[0].total, u[0].used, u[0].available), (409_600, 245_760, 122_880));
        assert_eq!(u[0].unit, csi::volume_usage::Unit::Bytes as i32);
        assert_eq!((u[1].total, u[1].used, u[1].available), (1000, 100, 800));
        assert_eq!(u[1].unit, csi::volume_usage::Unit::Inodes as i32);
        let huge = FsCounters {
            fragment_size: u64::MAX,
            blocks: u64::MAX,
            files: u64::MAX,
            ..FsCounters::default()
        };
        let u = usage(huge);
        assert_eq!((u[0].total, u[0].used, u[1].total), (i64::MAX, i64::MAX, i64::MAX));
    }
}
