//! The node's filesystem steps on a real block device (a loop device): blkid finds nothing, mkfs makes ext4 or xfs, a second look finds it and never formats again, the mount holds a file, growing the device then the filesystem shows in statvfs.
//!
//! Needs root, losetup and the filesystem's tools; a missing tool skips that filesystem with the
//! reason. Runs in a private mount namespace of the test thread.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kvol_lvm::filesystem::{self, Prepare};
use kvol_plugin::mount::{Mounter, SystemMounter};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A loop device over a sparse file; detached on drop.
struct LoopDevice {
    device: PathBuf,
    image: PathBuf,
}

impl LoopDevice {
    fn create(image: &Path, mib: u64) -> Result<LoopDevice, String> {
        std::fs::File::create(image).and_then(|f| f.set_len(mib << 20)).map_err(|e| e.to_string())?;
        let out =
            Command::new("losetup").args(["-f", "--show"]).arg(image).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("losetup: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Ok(LoopDevice { device, image: image.to_path_buf() })
    }

    /// Grows the file to `mib` MiB and tells the kernel (`losetup -c`).
    fn grow(&self, mib: u64) {
        std::fs::OpenOptions::new().write(true).open(&self.image).unwrap().set_len(mib << 20).unwrap();
        let out = Command::new("losetup").arg("-c").arg(&self.device).output().unwrap();
        assert!(out.status.success(), "losetup -c: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).output();
    }
}

fn missing_tool(tools: &[&str]) -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("not root".into());
    }
    tools
        .iter()
        .find(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|t| format!("{t} is not installed"))
}

/// Whether this process has CAP_SYS_RESOURCE, which ext4's online resize needs (containers
/// often drop it).
fn has_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).map(str::trim).unwrap_or("0");
    u64::from_str_radix(eff, 16).is_ok_and(|bits| bits & (1 << 24) != 0)
}

fn total_bytes(path: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(path).unwrap();
    s.blocks() * s.fragment_size()
}

async fn format_mount_write_grow(fs: &str, tools: &[&str]) {
    if let Some(why) = missing_tool(tools) {
        eprintln!("skipping {fs}: {why}");
        return;
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).unwrap();
    let private = nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE;
    nix::mount::mount(None::<&str>, "/", None::<&str>, private, None::<&str>).unwrap();
    let dir = kvol_test_support::ScratchRoot::new();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let dev = LoopDevice::create(&root.join("disk.img"), 320).expect("a loop device");
    let staging = root.join("staging");
    std::fs::create_dir(&staging).unwrap();

    let found = filesystem::probe(&dev.device, TIMEOUT).await.unwrap();
    assert_eq!(filesystem::decide(&dev.device, &found, fs), Ok(Prepare::Format), "{found:?}");
    filesystem::make(&dev.device, fs, TIMEOUT).await.unwrap();
    let found = filesystem::probe(&dev.device, TIMEOUT).await.unwrap();
    assert_eq!(found.kind.as_deref(), Some(fs));
    assert_eq!(
        filesystem::decide(&dev.device, &found, fs),
        Ok(Prepare::Mount),
        "a formatted device is mounted as it is"
    );
    let other = if fs == "ext4" { "xfs" } else { "ext4" };
    assert!(
        filesystem::decide(&dev.device, &found, other).is_err(),
        "a device holding {fs} is not made {other}"
    );

    SystemMounter.mount(&dev.device.to_string_lossy(), &staging, fs, false, &[]).unwrap();
    std::fs::write(staging.join("data"), "kept").unwrap();
    if fs == "ext4" && !has_sys_resource() {
        eprintln!(
            "skipping ext4's online grow: no CAP_SYS_RESOURCE here, and the kernel refuses resize2fs without it"
        );
    } else {
        let before = total_bytes(&staging);
        dev.grow(640);
        filesystem::grow(fs, &dev.device, &staging, TIMEOUT).await.unwrap();
        let after = total_bytes(&staging);
        assert!(after > before + (250 << 20), "{fs}: {before} → {after} bytes");
    }
    SystemMounter.unmount(&staging).unwrap();

    // Stage again: the probe finds the filesystem, nothing is formatted, the file is there.
    let found = filesystem::probe(&dev.device, TIMEOUT).await.unwrap();
    assert_eq!(filesystem::decide(&dev.device, &found, fs), Ok(Prepare::Mount));
    SystemMounter.mount(&dev.device.to_string_lossy(), &staging, fs, false, &[]).unwrap();
    assert_eq!(std::fs::read_to_string(staging.join("data")).unwrap(), "kept");
    SystemMounter.unmount(&staging).unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn ext4_is_made_once_mounted_and_grown() {
    format_mount_write_grow("ext4", &["losetup", "blkid", "mkfs.ext4", "resize2fs"]).await;
}

#[tokio::test(flavor = "current_thread")]
async fn xfs_is_made_once_mounted_and_grown() {
    format_mount_write_grow("xfs", &["losetup", "blkid", "mkfs.xfs", "xfs_growfs"]).await;
}
