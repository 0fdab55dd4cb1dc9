//! Real containers for the cases that need one: `runc` on a root of one static busybox, the pod's published volumes bound in at `/v0`, `/v1` …, a shell script run as the user asked and its output returned.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};

use crate::report::Failure;

/// The most volumes one container is given (`/v0` … `/v3`).
pub const MOUNT_POINTS: usize = 4;
const APPLETS: [&str; 8] = ["sh", "echo", "cat", "ls", "id", "stat", "touch", "test"];

/// Where a container's volume goes: the host path and whether it is read-only.
#[derive(Clone, Debug)]
pub struct Bind<'a> {
    pub host: &'a Path,
    pub read_only: bool,
}

/// Who the container's process is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (a pod's fsGroup is one).
    pub groups: Vec<u32>,
}

impl User {
    pub fn root() -> User {
        User { uid: 0, gid: 0, groups: Vec::new() }
    }
}

/// runc and the busybox root it runs containers on.
#[derive(Debug)]
pub struct Runtime {
    runc: PathBuf,
    dir: PathBuf,
    rootfs: PathBuf,
    next: AtomicU32,
}

impl Runtime {
    /// Makes the root filesystem under `dir` from the static `busybox`.
    pub fn new(runc: &Path, busybox: &Path, dir: &Path) -> Result<Runtime, Failure> {
        let rootfs = dir.join("rootfs");
        let made = || -> std::io::Result<()> {
            let mut dirs = vec!["bin".to_string(), "proc".into(), "dev".into(), "tmp".into()];
            dirs.extend((0..MOUNT_POINTS).map(|i| format!("v{i}")));
            for sub in dirs {
                std::fs::create_dir_all(rootfs.join(sub))?;
            }
            std::fs::copy(busybox, rootfs.join("bin/busybox"))?;
            for applet in APPLETS {
                std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
            }
            Ok(())
        };
        made()
            .map_err(|e| Failure::new(format!("cannot make a busybox root in {}: {e}", rootfs.display())))?;
        Ok(Runtime { runc: runc.to_path_buf(), dir: dir.to_path_buf(), rootfs, next: AtomicU32::new(0) })
    }

    /// Runs `script` with busybox's shell in a container with `binds` at `/v0`, `/v1` …;
    /// its standard output, or the failure with what it said.
    pub fn run(&self, binds: &[Bind<'_>], user: &User, script: &str) -> Result<String, Failure> {
        if binds.len() > MOUNT_POINTS {
            return Err(Failure::new(format!("a container takes at most {MOUNT_POINTS} volumes")));
        }
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let id = format!("kvol-test-driver-{}-{n}", std::process::id());
        let bundle = self.dir.join(&id);
        let written = std::fs::create_dir_all(&bundle).and_then(|()| {
            let text = serde_json::to_vec_pretty(&config(&self.rootfs, binds, user, script))?;
            std::fs::write(bundle.join("config.json"), text)
        });
        written.map_err(|e| {
            Failure::new(format!("cannot write the container bundle {}: {e}", bundle.display()))
        })?;
        let output = Command::new(&self.runc)
            .arg("--root")
            .arg(self.dir.join("runc-state"))
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Failure::new(format!("cannot run {}: {e}", self.runc.display())))?;
        let _ = std::fs::remove_dir_all(&bundle);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            return Err(Failure::new(format!(
                "the container ({}) failed: {}; it said: {}{}",
                output.status,
                script.trim(),
                stdout.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(stdout)
    }
}

/// The OCI runtime config: busybox's shell running `script` as `user`, the binds, every
/// device denied. Pure.
pub fn config(rootfs: &Path, binds: &[Bind<'_>], user: &User, script: &str) -> Value {
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]}),
    ];
    for (i, bind) in binds.iter().enumerate() {
        let mut options = vec!["rbind", "rprivate"];
        if bind.read_only {
            options.push("ro");
        }
        mounts.push(
            json!({"destination": format!("/v{i}"), "type": "bind", "source": bind.host, "options": options}),
        );
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": user.uid, "gid": user.gid, "additionalGids": user.groups},
            "cwd": "/",
            "args": ["/bin/sh", "-c", script],
            "env": ["PATH=/bin"],
        },
        "root": {"path": rootfs, "readonly": true},
        "hostname": "kvol-test-driver",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}],
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_binds_each_volume_in_order_as_asked() {
        let a = PathBuf::from("/k/pods/1/volumes/x/mount");
        let b = PathBuf::from("/k/pods/1/volumes/y/mount");
        let binds = [Bind { host: &a, read_only: false }, Bind { host: &b, read_only: true }];
        let user = User { uid: 1001, gid: 1001, groups: vec![2000] };
        let c = config(Path::new("/r"), &binds, &user, "echo hi");
        let mounts = c["mounts"].as_array().unwrap();
        assert_eq!(mounts.len(), 5);
        assert_eq!(mounts[3]["destination"], "/v0");
        assert_eq!(mounts[3]["source"], "/k/pods/1/volumes/x/mount");
        assert_eq!(mounts[3]["options"], json!(["rbind", "rprivate"]));
        assert_eq!(mounts[4]["options"], json!(["rbind", "rprivate", "ro"]));
        assert_eq!(c["process"]["user"], json!({"uid": 1001, "gid": 1001, "additionalGids": [2000]}));
        assert_eq!(c["process"]["args"], json!(["/bin/sh", "-c", "echo hi"]));
        assert_eq!(c["root"]["readonly"], true);
    }
}
