//! Mounts whose filesystem does not answer, on real FUSE mounts (`bindfs`): a daemon that died (`ENOTCONN`) and a daemon that is stopped (every `stat` hangs). Teardown must finish, not wedge; measuring must not pile up threads.
//!
//! Needs root and `bindfs` (Debian's `bindfs` package; `.ci/run` installs it); without
//! `bindfs` the tests say so and pass.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{HostPathVolumeSource, Volume};
use kvol_plugin::local::HostPathPlugin;
use kvol_plugin::mount::{Mounter, PROBE_DEADLINE, SystemMounter};
use kvol_plugin::plugin::{PodInfo, PublishRequest, UnpublishRequest, VolumeMounter};
use kvol_plugin::stats::measure_published;
use kvol_plugin::{NodeInfo, NodePaths, PluginHost, VolumeSpec};
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

fn enter_private_mount_namespace() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS)
        .expect("unshare the mount namespace (these tests need root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
}

fn bindfs_missing() -> bool {
    let missing =
        Command::new("bindfs").arg("--version").output().is_err() || !Path::new("/dev/fuse").exists();
    if missing {
        eprintln!("skipped: bindfs or /dev/fuse is missing (apt-get install bindfs)");
    }
    missing
}

/// The start of each FUSE test: a published FUSE volume in a private mount namespace, or `None`
/// (with the reason printed) without bindfs.
async fn published_fuse_volume() -> Option<FuseVolume> {
    if bindfs_missing() {
        return None;
    }
    enter_private_mount_namespace();
    Some(FuseVolume::publish().await)
}

/// A FUSE mount of `source` at `at` served by a foreground bindfs, and a hostPath volume of it
/// published under a node root.
struct FuseVolume {
    daemon: Child,
    fuse: PathBuf,
    target: PathBuf,
    plugin: HostPathPlugin,
    _root: kvol_test_support::ScratchRoot,
}

impl FuseVolume {
    async fn publish() -> FuseVolume {
        let root = kvol_test_support::ScratchRoot::new();
        let base = fs::canonicalize(root.path()).unwrap();
        let (source, fuse) = (base.join("source"), base.join("fuse"));
        fs::create_dir_all(&source).unwrap();
        fs::write(source.join("data"), b"kept").unwrap();
        fs::create_dir_all(&fuse).unwrap();
        let daemon = Command::new("bindfs")
            .args(["-f", "-o", "attr_timeout=0,entry_timeout=0"])
            .arg(&source)
            .arg(&fuse)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start bindfs");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !SystemMounter.mount_points().unwrap().iter().any(|m| m.target == fuse) {
            assert!(Instant::now() < deadline, "bindfs did not mount {}", fuse.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        let host = PluginHost::new(
            NodePaths::new(base.join("kubelet")),
            NodeInfo::named("n"),
            Arc::new(SystemMounter),
        );
        let plugin = HostPathPlugin::new(host.clone());
        let spec = VolumeSpec::inline(
            Volume {
                name: "fuse".into(),
                host_path: Some(HostPathVolumeSource {
                    path: fuse.to_str().unwrap().into(),
                    type_: Some("Directory".into()),
                }),
                ..Volume::default()
            },
            "ns",
        );
        let target = host.paths.pod_volume_dir("uid-1", "kubernetes.io/host-path", "fuse").unwrap();
        let pod = PodInfo::default();
        let request = PublishRequest {
            spec: &spec,
            pod: &pod,
            pod_volume_name: "fuse",
            target: &target,
            staging_path: None,
            device_path: None,
            read_only: false,
            mount_options: &[],
            projection: None,
        };
        plugin.publish(&request).await.expect("publish the fuse hostPath");
        assert_eq!(fs::read(target.join("data")).unwrap(), b"kept");
        FuseVolume { daemon, fuse, target, plugin, _root: root }
    }

    fn signal(&self, signal: &str) {
        let status =
            Command::new("kill").arg(format!("-{signal}")).arg(self.daemon.id().to_string()).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{signal} bindfs");
    }

    /// Tears the pod's volume down, bounded so a hang fails the test instead of wedging it.
    async fn unpublish(&self) -> Duration {
        let started = Instant::now();
        let request =
            UnpublishRequest { pod_uid: "uid-1", pod_volume_name: "fuse", target: &self.target, spec: None };
        tokio::time::timeout(Duration::from_secs(30), self.plugin.unpublish(&request))
            .await
            .expect("teardown of a dead mount must not hang")
            .expect("teardown of a dead mount succeeds");
        started.elapsed()
    }

    fn assert_torn_down(&self) {
        let table = SystemMounter.mount_points().unwrap();
        assert!(!table.iter().any(|m| m.target.starts_with(&self.target)), "the pod's mount is gone");
        // Listing the parent looks at nothing under the dead mount.
        let parent = self.target.parent().unwrap();
        let left: Vec<_> =
            fs::read_dir(parent).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
        assert!(left.is_empty(), "the pod volume directory is removed: {left:?}");
    }
}

impl Drop for FuseVolume {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        let _ = nix::mount::umount2(&self.target, MntFlags::MNT_DETACH);
        let _ = nix::mount::umount2(&self.fuse, MntFlags::MNT_DETACH);
    }
}

#[tokio::test]
async fn a_fuse_mount_whose_daemon_died_is_unmounted_and_removed() {
    let Some(volume) = published_fuse_volume().await else { return };
    volume.signal("KILL");
    let deadline = Instant::now() + Duration::from_secs(10);
    let dead = loop {
        match fs::metadata(&volume.target) {
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOTCONN) => break true,
            _ if Instant::now() > deadline => break false,
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    assert!(dead, "a killed bindfs leaves its mount answering ENOTCONN");
    assert!(SystemMounter.is_mount_point(&volume.target).unwrap(), "a dead mount is still a mount");
    let took = volume.unpublish().await;
    volume.assert_torn_down();
    eprintln!("dead fuse mount torn down in {took:?}");
}

#[tokio::test]
async fn a_fuse_mount_whose_daemon_is_stopped_is_torn_down_without_hanging() {
    let Some(volume) = published_fuse_volume().await else { return };
    volume.signal("STOP");
    // The hazard is real: an ordinary stat of the mount hangs with the daemon.
    let (tx, rx) = std::sync::mpsc::channel();
    let looked_at = volume.target.join("data");
    std::thread::spawn(move || {
        let _ = tx.send(fs::metadata(&looked_at).is_ok());
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(1)).is_err(),
        "a stat under a stopped fuse daemon should hang"
    );
    // A look at the mount (what publish and teardown ask) answers at once or, after the
    // probe's deadline, from the table, instead of hanging with the daemon.
    let started = Instant::now();
    assert!(SystemMounter.is_mount_point(&volume.target).unwrap());
    let probed = started.elapsed();
    assert!(probed < PROBE_DEADLINE + Duration::from_secs(3), "the probe answered after {probed:?}");
    // The stat above still hangs in the mount, so it is busy for good: teardown finds it does
    // not answer and detaches it lazily, within the probe's deadline.
    let took = volume.unpublish().await;
    assert!(took < PROBE_DEADLINE + Duration::from_secs(5), "teardown took {took:?}");
    volume.assert_torn_down();
    assert!(fs::read_dir(volume.fuse.parent().unwrap()).is_ok(), "the host side is untouched");
    eprintln!("stopped fuse mount: probe answered in {probed:?}, teardown took {took:?}");
    volume.signal("CONT");
}

#[tokio::test]
async fn measuring_a_stopped_fuse_mount_pins_one_call_and_is_not_started_again() {
    let Some(volume) = published_fuse_volume().await else { return };
    let lane = kvol_plugin::blocking::shared();
    assert!(measure_published(&volume.target).await.is_ok(), "a live mount is measured");
    volume.signal("STOP");
    // The stats collector waits a bounded time; giving up counts as the call's deadline.
    let first = tokio::time::timeout(Duration::from_millis(500), measure_published(&volume.target)).await;
    assert!(first.is_err(), "statvfs of a mount whose fuse daemon is stopped should hang");
    assert_eq!(lane.stuck_calls(&volume.target), 1);
    // Each later period asks again: answered at once, with no second thread pinned.
    for _ in 0..3 {
        let started = Instant::now();
        let again = measure_published(&volume.target).await.expect_err("a stuck mount is not measured");
        assert!(started.elapsed() < Duration::from_secs(1), "answered after {:?}", started.elapsed());
        let message = again.to_string();
        assert!(message.contains("has not returned") && message.contains("fuse"), "{message}");
        assert_eq!(lane.stuck_calls(&volume.target), 1, "no second call on the dead mount");
    }
    volume.signal("CONT");
    let deadline = Instant::now() + Duration::from_secs(10);
    while lane.stuck_calls(&volume.target) > 0 {
        assert!(Instant::now() < deadline, "the stuck statvfs did not return after SIGCONT");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(measure_published(&volume.target).await.is_ok(), "measured again once it answers");
    volume.unpublish().await;
    volume.assert_torn_down();
}

#[test]
fn a_busy_mount_that_answers_is_not_detached() {
    enter_private_mount_namespace();
    let root = kvol_test_support::ScratchRoot::new();
    let target = fs::canonicalize(root.path()).unwrap().join("busy");
    fs::create_dir(&target).unwrap();
    SystemMounter.mount("kvol-test", &target, "tmpfs", false, &[]).unwrap();
    // A process working in the mount keeps it busy: its cwd is there.
    let mut user = Command::new("sleep").arg("30").current_dir(&target).spawn().unwrap();
    let err = SystemMounter.unmount(&target).unwrap_err();
    assert_eq!(err.source.raw_os_error(), Some(nix::libc::EBUSY), "{err}");
    assert!(SystemMounter.is_mount_point(&target).unwrap(), "a live mount in use stays mounted");
    user.kill().unwrap();
    user.wait().unwrap();
    SystemMounter.unmount(&target).unwrap();
}
