//! Measuring a published volume for its stats, off the async threads: a raw block volume's device by its size, a filesystem by statvfs.

use std::path::Path;

use crate::error::Result;
use crate::plugin::VolumeStats;

/// The usage of a volume published at `target`, measured off the async threads (a dead mount
/// can block `statvfs`): a raw block volume's device reports its size only, a filesystem what
/// [`VolumeStats::of_filesystem`] reads.
pub async fn measure_published(target: &Path) -> Result<VolumeStats> {
    let path = target.to_path_buf();
    let measured = crate::blocking::shared().run(target, MEASURE_DEADLINE, move || {
        let outcome = match crate::block::PodDevice::parse(&path) {
            Some(_) => device_size(&path)
                .map(|size| VolumeStats { capacity_bytes: Some(size), ..VolumeStats::default() }),
            None => VolumeStats::of_filesystem(&path),
        };
        outcome.map_err(|e| crate::PluginError::io("measure the volume at", &path, e))
    });
    measured.await.unwrap_or_else(|e| {
        Err(crate::PluginError::io("measure the volume at", target, std::io::Error::other(e)))
    })
}

/// How long a measurement may block before its volume counts as a dead mount (the stats
/// collector usually gives up earlier; either way the measurement is not started again for
/// that volume until the stuck one returns).
const MEASURE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// The size of the block device at `path` (its end, as seeking finds it).
fn device_size(path: &Path) -> std::io::Result<u64> {
    use std::io::Seek;
    std::fs::File::open(path)?.seek(std::io::SeekFrom::End(0))
}
