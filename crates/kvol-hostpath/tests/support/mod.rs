//! What the driver's end-to-end tests share: a private mount namespace and a scratch root that takes down whatever a failed test left mounted (and, through `ScratchRoot`, loop devices of files under it).

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

use kvol_plugin::mount::{MountPoint, Mounter, SystemMounter};
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

/// Moves the calling thread into a mount namespace of its own whose mounts propagate nowhere.
/// Called first in every test: the async body, and so the driver, then runs on this thread.
pub fn enter_private_mount_namespace() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS)
        .expect("unshare the mount namespace (these tests need root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
}

/// A temporary root holding the driver's state, sockets, staging and target paths (its
/// `ScratchRoot` detaches loop devices of files under it). Dropping it
/// detaches whatever a failed test left mounted below it before deleting it, so deletion can
/// never reach through a mount.
pub struct Sandbox {
    pub root: PathBuf,
    _dir: kvol_test_support::ScratchRoot,
}

impl Sandbox {
    pub fn new() -> Sandbox {
        enter_private_mount_namespace();
        let dir = kvol_test_support::ScratchRoot::new();
        let root = fs::canonicalize(dir.path()).expect("canonical root");
        Sandbox { root, _dir: dir }
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    pub fn mounts(&self) -> Vec<MountPoint> {
        SystemMounter.mounts_under(&self.root).expect("read the mount table")
    }

    pub fn mounts_on(&self, path: &Path) -> Vec<MountPoint> {
        self.mounts().into_iter().filter(|m| m.target == path).collect()
    }

    pub fn assert_nothing_mounted(&self) {
        let left = self.mounts();
        assert!(left.is_empty(), "mounts left under the root: {left:?}");
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let mut left = self.mounts();
        left.reverse();
        for m in left {
            let _ = nix::mount::umount2(&m.target, MntFlags::MNT_DETACH);
        }
    }
}
