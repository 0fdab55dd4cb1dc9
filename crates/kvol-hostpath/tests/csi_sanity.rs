//! The upstream conformance suite, csi-sanity, against the driver: with default flags and with every feature on, 0 failed and at least upstream's passed count.
//!
//! Runs when `KVOL_CSI_SANITY` names the csi-sanity binary (v5.3.1), and skips with a printed
//! reason otherwise. The driver runs in-process with the real mounter on a socket in a temporary
//! directory, inside a private mount namespace of the test thread, which the csi-sanity process
//! inherits; csi-sanity's own summary line is parsed and checked.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvol_hostpath::{HostpathConfig, HostpathDriver};
use kvol_plugin::mount::{Mounter, SystemMounter};
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use tokio::sync::oneshot;

mod sanity_summary;

use sanity_summary::{Counts, parse_summary};

fn sanity_binary() -> Option<PathBuf> {
    match std::env::var_os("KVOL_CSI_SANITY") {
        Some(path) => Some(PathBuf::from(path)),
        None => {
            eprintln!("skipped: KVOL_CSI_SANITY does not name a csi-sanity binary");
            None
        }
    }
}

/// Runs csi-sanity with `extra` arguments against the driver configured by `configure`, and
/// returns its counts (printing its output when it has no summary).
async fn run_sanity(
    sanity: &Path,
    configure: impl FnOnce(HostpathConfig) -> HostpathConfig,
    extra: &[&str],
) -> Counts {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (this test needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
    let dir = kvol_test_support::ScratchRoot::new();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let config = configure(HostpathConfig {
        state_dir: root.join("state"),
        csi_socket: root.join("csi.sock"),
        registration_dir: None,
        ..HostpathConfig::new("hostpath.csi.kvol.io", "node-a")
    });
    let driver = HostpathDriver::bind(config, Arc::new(SystemMounter)).expect("the driver starts");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(driver.run(async {
        let _ = stopped.await;
    }));
    std::fs::create_dir_all(root.join("sanity")).unwrap();
    let mutable = root.join("mutable.yaml");
    std::fs::write(&mutable, "iops: \"100\"\n").unwrap();
    let output = tokio::process::Command::new(sanity)
        .arg(format!("-csi.endpoint={}", root.join("csi.sock").display()))
        .arg(format!("-csi.stagingdir={}", root.join("sanity/staging").display()))
        .arg(format!("-csi.mountdir={}", root.join("sanity/mount").display()))
        .arg("-ginkgo.no-color")
        .args(extra.iter().map(|a| a.replace("{mutable}", &mutable.display().to_string())))
        .output()
        .await
        .expect("csi-sanity runs");
    let _ = stop.send(());
    task.await.unwrap().expect("the driver stops cleanly");
    let text =
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    let left = SystemMounter.mounts_under(&root).unwrap();
    for m in left.iter().rev() {
        let _ = nix::mount::umount2(&m.target, MntFlags::MNT_DETACH);
    }
    assert!(left.is_empty(), "mounts left behind: {left:?}");
    match parse_summary(&text) {
        Some(counts) => {
            eprintln!("csi-sanity {extra:?}: {counts:?}");
            if counts.failed > 0 {
                eprintln!("{text}");
            }
            counts
        }
        None => panic!("csi-sanity printed no summary:\n{text}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn csi_sanity_passes_with_default_flags() {
    let Some(sanity) = sanity_binary() else { return };
    let counts = run_sanity(&sanity, |c| c, &[]).await;
    assert_eq!(counts.failed, 0, "{counts:?}");
    assert!(counts.passed >= 73, "upstream's driver passes 73 with default flags: {counts:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn csi_sanity_passes_with_every_feature_on() {
    let Some(sanity) = sanity_binary() else { return };
    let all = |c: HostpathConfig| HostpathConfig {
        enable_attach: true,
        enable_controller_modify_volume: true,
        accepted_mutable_parameter_names: ["iops".to_string()].into(),
        ..c
    };
    let counts = run_sanity(&sanity, all, &["-csi.testvolumemutableparameters={mutable}"]).await;
    assert_eq!(counts.failed, 0, "{counts:?}");
    assert!(counts.passed >= 89, "upstream's driver passes 89 with every feature on: {counts:?}");
}

/// Block volumes (loop devices): csi-sanity's volumes all made and used with block access.
#[tokio::test(flavor = "current_thread")]
async fn csi_sanity_passes_with_block_access() {
    let Some(sanity) = sanity_binary() else { return };
    if !std::path::Path::new("/dev/loop-control").exists() {
        eprintln!("skipped: no /dev/loop-control on this machine");
        return;
    }
    let counts = run_sanity(&sanity, |c| c, &["-csi.testvolumeaccesstype=block"]).await;
    assert_eq!(counts.failed, 0, "{counts:?}");
    assert!(counts.passed >= 73, "as many as with mount access: {counts:?}");
}

/// The loop backing: csi-sanity's filesystem volumes all ext4 images on loop devices, with
/// default flags and with every feature on.
#[tokio::test(flavor = "current_thread")]
async fn csi_sanity_passes_with_the_loop_backing() {
    let Some(sanity) = sanity_binary() else { return };
    if !std::path::Path::new("/dev/loop-control").exists() {
        eprintln!("skipped: no /dev/loop-control on this machine");
        return;
    }
    let on_loop =
        |c: HostpathConfig| HostpathConfig { volume_backing: kvol_hostpath::VolumeBacking::Loop, ..c };
    let counts = run_sanity(&sanity, on_loop, &[]).await;
    assert_eq!(counts.failed, 0, "{counts:?}");
    assert!(counts.passed >= 73, "as many as with the directory backing: {counts:?}");
    let all = |c: HostpathConfig| HostpathConfig {
        enable_attach: true,
        enable_controller_modify_volume: true,
        accepted_mutable_parameter_names: ["iops".to_string()].into(),
        ..on_loop(c)
    };
    let counts = run_sanity(&sanity, all, &["-csi.testvolumemutableparameters={mutable}"]).await;
    assert_eq!(counts.failed, 0, "{counts:?}");
    assert!(counts.passed >= 89, "as many as with the directory backing: {counts:?}");
}
