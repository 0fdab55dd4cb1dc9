//! Block volumes of the bundled driver: a sparse image file in the volume's directory, attached to a loop device by `losetup` (bounded), found again after a restart.
//!
//! A volume made with a block capability holds `block.img` (sparse, the volume's capacity).
//! Stage attaches it to a loop device (`losetup -f --show --direct-io=off <file>`), publish
//! bind-mounts the loop device node onto the target file, unstage and delete detach it
//! (`losetup -d`). Which loop device holds a file is always asked of the kernel
//! (`losetup -j <file>`), never remembered, so a restarted driver finds its devices again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::Status;

/// The image file of a block volume, in its directory.
pub const IMAGE_FILE: &str = "block.img";
/// The size of a block volume made without a capacity.
pub const DEFAULT_BLOCK_BYTES: i64 = 64 << 20;
/// How long one `losetup` may run before it is killed.
const LOSETUP_DEADLINE: Duration = Duration::from_secs(10);

/// The image file of the block volume in `dir`.
pub fn image(dir: &Path) -> PathBuf {
    dir.join(IMAGE_FILE)
}

/// Makes the sparse image of `bytes` bytes in `dir`.
pub fn create_image(dir: &Path, bytes: i64) -> Result<(), Status> {
    let path = image(dir);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| Status::internal(format!("cannot create {}: {e}", path.display())))?;
    file.set_len(bytes.max(0) as u64)
        .map_err(|e| Status::internal(format!("cannot size {} to {bytes} bytes: {e}", path.display())))
}

/// The loop devices `losetup -j` lists for a file (pure): each line is
/// `/dev/loopN: [dev]:inode (path)`.
pub fn parse_associations(output: &str) -> Vec<PathBuf> {
    output
        .lines()
        .filter_map(|line| line.split_once(':').map(|(device, _)| device.trim()))
        .filter(|device| device.starts_with("/dev/"))
        .map(PathBuf::from)
        .collect()
}

/// Runs `losetup` with `args`, killed past its deadline; its stdout, or an error naming the
/// command and what it said (or that util-linux's losetup is not installed).
fn losetup(args: &[&str]) -> Result<String, Status> {
    crate::loopfs::run("losetup", args, LOSETUP_DEADLINE)
}

fn text(path: &Path) -> Result<&str, Status> {
    path.to_str().ok_or_else(|| Status::internal(format!("{} is not UTF-8", path.display())))
}

/// The loop devices holding `file` now.
pub fn devices_of(file: &Path) -> Result<Vec<PathBuf>, Status> {
    Ok(parse_associations(&losetup(&["-j", text(file)?])?))
}

/// Makes every loop device holding `file` reread its size (`losetup -c`), after it grew.
pub fn reread_size(file: &Path) -> Result<(), Status> {
    for device in devices_of(file)? {
        losetup(&["-c", text(&device)?])?;
    }
    Ok(())
}

/// The loop device holding `file`, attaching it to a free one if none does.
pub fn attach(file: &Path) -> Result<PathBuf, Status> {
    if let Some(device) = devices_of(file)?.into_iter().next() {
        return Ok(device);
    }
    let device = losetup(&["-f", "--show", "--direct-io=off", text(file)?])?;
    let device = device.trim();
    if !device.starts_with("/dev/") {
        return Err(Status::internal(format!(
            "losetup attached {} to {device:?}, not a device",
            file.display()
        )));
    }
    tracing::info!(file = %file.display(), device, "attached loop device");
    Ok(PathBuf::from(device))
}

/// Has the kernel detach `device`, which a mount holds, once nothing holds it any more: a
/// `losetup -d` of a device in use only sets its autoclear flag (the kernel's lazy detach,
/// since Linux 3.7). So unmounting its filesystem detaches it — also when the mount goes
/// without an unmount, with a mount namespace that dies or a driver killed before it could
/// unstage. Never for a device nothing holds: that one it would detach at once.
pub fn detach_when_unused(device: &Path) -> Result<(), Status> {
    losetup(&["-d", text(device)?])?;
    match autoclear(device) {
        Some(true) => Ok(()),
        Some(false) => Err(Status::internal(format!(
            "losetup -d {} left the device without its autoclear flag",
            device.display()
        ))),
        None => Err(Status::internal(format!(
            "losetup -d {} detached the device at once: nothing held it",
            device.display()
        ))),
    }
}

/// Whether loop `device` is set to detach when its last user closes it
/// (`/sys/block/loopN/loop/autoclear`); `None` when it is not attached.
pub fn autoclear(device: &Path) -> Option<bool> {
    let name = device.file_name()?.to_str()?;
    let said = std::fs::read_to_string(format!("/sys/block/{name}/loop/autoclear")).ok()?;
    Some(said.trim() == "1")
}

/// Detaches every loop device holding `file`; none is success. The kernel detaches a device
/// only at its last close: one that something else has open — udev's blkid after an unmount,
/// a `losetup` of another volume looking through the devices, a mount namespace copied while
/// the volume was mounted — is only marked by `losetup -d` (autoclear). So this waits, at most
/// [`DETACH_WAIT`], until the kernel says the device no longer holds the file
/// (`/sys/block/loopN/loop/backing_file`, read without opening the device, which would hold it
/// longer): a moment's opener is waited out, and a DeleteVolume right after an unstage finds
/// the image free. A device still held after that is left marked, to go at its last close, and
/// said; nothing of the driver holds it any more.
pub fn detach(file: &Path) -> Result<(), Status> {
    if !file.exists() {
        return Ok(());
    }
    let devices = devices_of(file)?;
    let resolved = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    for device in &devices {
        // Gone meanwhile (an autoclear finishing) is what was asked for.
        if let Err(e) = losetup(&["-d", text(device)?])
            && holds(device, &resolved)
        {
            return Err(e);
        }
    }
    let started = std::time::Instant::now();
    loop {
        let holding: Vec<&PathBuf> = devices.iter().filter(|d| holds(d, &resolved)).collect();
        if holding.is_empty() {
            break;
        }
        if started.elapsed() > DETACH_WAIT {
            for device in holding {
                if autoclear(device) != Some(true) {
                    return Err(Status::internal(format!(
                        "losetup -d {} left it holding {} without its autoclear flag",
                        device.display(),
                        file.display()
                    )));
                }
                tracing::warn!(file = %file.display(), device = %device.display(), "the loop device is still open elsewhere: the kernel detaches it at its last close");
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for device in &devices {
        tracing::info!(file = %file.display(), device = %device.display(), "detached loop device");
    }
    Ok(())
}

/// How long [`detach`] waits for the kernel to let go of a file another opener held.
const DETACH_WAIT: Duration = Duration::from_secs(2);

/// Whether loop `device` is attached to `file` (a resolved path), as sysfs says.
fn holds(device: &Path, file: &Path) -> bool {
    let Some(name) = device.file_name().and_then(|n| n.to_str()) else { return false };
    std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .is_ok_and(|said| Path::new(said.trim_end().trim_end_matches(" (deleted)")) == file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn associations_are_read_from_losetup_lines() {
        let cases: &[(&str, &[&str])] = &[
            ("", &[]),
            ("/dev/loop3: [2049]:131 (/var/lib/kvol/csi-hostpath/volumes/v1/block.img)\n", &["/dev/loop3"]),
            (
                "/dev/loop0: [0045]:7 (/s/v/block.img)\n/dev/loop12: [0045]:7 (/s/v/block.img (deleted))\n",
                &["/dev/loop0", "/dev/loop12"],
            ),
            ("losetup: something odd\n", &[]),
        ];
        for (output, want) in cases {
            let want: Vec<PathBuf> = want.iter().map(PathBuf::from).collect();
            assert_eq!(parse_associations(output), want, "{output:?}");
        }
    }
}
