//! The loop backing (`volume_backing: Loop`) end to end: real loop devices, real ext4 and xfs, real mounts, each test in a private mount namespace of its own thread.
//!
//! A volume holds its size and no more (written until ENOSPC), grows online (controller then
//! node expansion, seen by statvfs of the published path without unpublishing), survives a
//! driver that stopped without cleaning up (the same loop device found again, never a second),
//! and leaves nothing attached or mounted. These tests need root and `/dev/loop-control`; they
//! skip with a printed reason without it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvol_csi::CsiError;
use kvol_csi::proto::csi::controller_client::ControllerClient;
use kvol_csi::proto::csi::identity_client::IdentityClient;
use kvol_csi::proto::csi::node_client::NodeClient;
use kvol_csi::proto::csi::{self, volume_capability::access_mode::Mode};
use kvol_hostpath::backing::BackingChoice;
use kvol_hostpath::loopfs::FSTYPE_PARAMETER;
use kvol_hostpath::{HostpathConfig, HostpathDriver, VolumeBacking};
use kvol_plugin::mount::SystemMounter;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const MIB: i64 = 1 << 20;

mod support;

use support::Sandbox;

impl Sandbox {
    fn config(&self) -> HostpathConfig {
        HostpathConfig {
            state_dir: self.path("state"),
            csi_socket: self.path("plugins/hostpath.csi.kvol.io/csi.sock"),
            registration_dir: None,
            volume_backing: VolumeBacking::Loop,
            ..HostpathConfig::new("hostpath.csi.kvol.io", "node-a")
        }
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), CsiError>>,
    /// The backing it decided at start.
    backing: BackingChoice,
    controller: ControllerClient<Channel>,
    node: NodeClient<Channel>,
    identity: IdentityClient<Channel>,
}

async fn start(config: HostpathConfig) -> Running {
    let driver = HostpathDriver::bind(config, Arc::new(SystemMounter)).expect("the driver starts");
    let backing = driver.backing().clone();
    let socket = driver.csi_socket().to_path_buf();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(driver.run(async {
        let _ = stopped.await;
    }));
    let ch = Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()));
    Running {
        stop,
        task,
        backing,
        controller: ControllerClient::new(ch.clone()),
        node: NodeClient::new(ch.clone()),
        identity: IdentityClient::new(ch),
    }
}

impl Running {
    async fn stop(self) {
        let Running { stop, task, controller, node, identity, .. } = self;
        drop((controller, node, identity));
        stop.send(()).expect("the driver is still running");
        task.await.expect("the driver task").expect("the driver stops cleanly");
    }

    /// Ends the driver as `kill -9` would for what it leaves on disk: no shutdown at all, its
    /// sockets left behind for the next one to replace.
    async fn abort(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

fn loop_devices_usable() -> bool {
    let usable = Path::new("/dev/loop-control").exists()
        && std::process::Command::new("losetup").arg("-f").output().is_ok_and(|o| o.status.success());
    if !usable {
        eprintln!("skipped: no /dev/loop-control (or no free loop device) on this machine");
    }
    usable
}

fn has_program(program: &str) -> bool {
    let found = std::process::Command::new(program).arg("-V").output().is_ok();
    if !found {
        eprintln!("skipped: {program} is not installed");
    }
    found
}

/// Whether this process holds CAP_SYS_RESOURCE (bit 24 of CapEff).
fn has_cap_sys_resource() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

fn loop_devices_of(file: &Path) -> Vec<PathBuf> {
    let out = std::process::Command::new("losetup").arg("-j").arg(file).output().expect("losetup -j runs");
    kvol_hostpath::block::parse_associations(&String::from_utf8_lossy(&out.stdout))
}

fn mount_cap(fs_type: &str) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume {
            fs_type: fs_type.to_string(),
            ..Default::default()
        })),
        access_mode: Some(csi::volume_capability::AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    }
}

fn code<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> Code {
    result.expect_err("an error").code()
}

/// The bytes statvfs reports for the filesystem holding `path`: (total, available).
fn statvfs_bytes(path: &Path) -> (i64, i64) {
    let s = nix::sys::statvfs::statvfs(path).expect("statvfs");
    ((s.blocks() * s.fragment_size()) as i64, (s.blocks_available() * s.fragment_size()) as i64)
}

/// Writes `file` until the filesystem is full; the bytes written.
fn fill(file: &Path) -> i64 {
    let mut f = fs::File::create(file).expect("create the fill file");
    let chunk = vec![0x5au8; 256 << 10];
    let mut written = 0i64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as i64,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
            Err(e) => panic!("writing {}: {e}", file.display()),
        }
    }
    match f.sync_all() {
        Err(e) if e.raw_os_error() != Some(nix::libc::ENOSPC) => panic!("fsync {}: {e}", file.display()),
        _ => {}
    }
    written
}

/// One volume's life on the loop backing: created (`fs`, asked for through the StorageClass
/// parameter when `by_parameter`, else through the capability), staged, published, filled
/// until ENOSPC, the driver aborted and restarted mid-life, expanded online by `grow_by`,
/// filled further, unpublished, unstaged, deleted.
async fn volume_life(fs_name: &str, by_parameter: bool, asked: i64, size: i64, grow_by: i64, min_fill: i64) {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let cap = mount_cap(if by_parameter { "" } else { fs_name });
    let parameters = if by_parameter {
        [(FSTYPE_PARAMETER.to_string(), fs_name.to_string())].into()
    } else {
        Default::default()
    };
    let req = csi::CreateVolumeRequest {
        name: format!("pvc-{fs_name}"),
        capacity_range: Some(csi::CapacityRange { required_bytes: asked, limit_bytes: 0 }),
        volume_capabilities: vec![cap.clone()],
        parameters,
        ..Default::default()
    };
    let volume = d.controller.create_volume(req.clone()).await.unwrap().into_inner().volume.unwrap();
    assert_eq!(volume.capacity_bytes, size, "the capacity is the image's size");
    let again = d.controller.create_volume(req).await.unwrap().into_inner().volume.unwrap();
    assert_eq!(again.volume_id, volume.volume_id, "create is idempotent");
    let id = volume.volume_id;
    let image = sb.path("state/volumes").join(format!("{id}.img"));
    let meta = fs::metadata(&image).expect("the image exists");
    assert_eq!(meta.len() as i64, size);
    assert!(loop_devices_of(&image).is_empty(), "nothing attached before stage");

    let staging = sb.path("kubelet/plugins/kubernetes.io/csi/hostpath/globalmount");
    let target = sb.path("kubelet/pods/p1/volumes/kubernetes.io~csi/pvc/mount");
    let stage = |cap: csi::VolumeCapability| csi::NodeStageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap),
        ..Default::default()
    };
    let other = if fs_name == "xfs" { "ext4" } else { "xfs" };
    assert_eq!(code(d.node.node_stage_volume(stage(mount_cap(other))).await), Code::InvalidArgument);
    d.node.node_stage_volume(stage(cap.clone())).await.unwrap();
    d.node.node_stage_volume(stage(cap.clone())).await.expect("staging again is fine");
    let devices = loop_devices_of(&image);
    assert_eq!(devices.len(), 1, "one loop device: {devices:?}");
    assert_eq!(
        kvol_hostpath::block::autoclear(&devices[0]),
        Some(true),
        "the mount alone holds {}: it goes with the mount",
        devices[0].display()
    );
    let publish = csi::NodePublishVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    d.node.node_publish_volume(publish.clone()).await.unwrap();
    let (total, _) = statvfs_bytes(&target);
    assert!(total <= size, "the filesystem ({total} bytes) is no larger than the volume ({size})");

    let written = fill(&target.join("fill-1"));
    eprintln!("{fs_name}: {written} bytes written into a {size}-byte volume");
    assert!(written <= size, "{written} bytes written into a {size}-byte volume");
    assert!(written >= min_fill, "only {written} bytes fit in a {size}-byte volume");
    let stats = csi::NodeGetVolumeStatsRequest {
        volume_id: id.clone(),
        volume_path: target.display().to_string(),
        ..Default::default()
    };
    let usage = d.node.node_get_volume_stats(stats.clone()).await.unwrap().into_inner().usage;
    let bytes = usage.iter().find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32).unwrap();
    assert!(bytes.total <= size && bytes.used >= written - MIB, "the filesystem's own figures: {bytes:?}");
    assert!(usage.iter().any(|u| u.unit == csi::volume_usage::Unit::Inodes as i32 && u.total > 0));

    // The driver dies mid-life and comes back: the same loop device, never a second.
    d.abort().await;
    let mut d = start(sb.config()).await;
    d.node.node_stage_volume(stage(cap.clone())).await.unwrap();
    d.node.node_publish_volume(publish.clone()).await.unwrap();
    assert_eq!(loop_devices_of(&image), devices, "the same loop device after a restart");

    // Online expansion: the controller grows the image, the node the filesystem.
    let grown = size + grow_by;
    let expand = csi::ControllerExpandVolumeRequest {
        volume_id: id.clone(),
        capacity_range: Some(csi::CapacityRange { required_bytes: grown, limit_bytes: 0 }),
        ..Default::default()
    };
    let reply = d.controller.controller_expand_volume(expand).await.unwrap().into_inner();
    assert_eq!((reply.capacity_bytes, reply.node_expansion_required), (grown, true));
    assert_eq!(fs::metadata(&image).unwrap().len() as i64, grown, "the image grew");
    let node_expand = csi::NodeExpandVolumeRequest {
        volume_id: id.clone(),
        volume_path: target.display().to_string(),
        capacity_range: Some(csi::CapacityRange { required_bytes: grown, limit_bytes: 0 }),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    if fs_name == "ext4" && !has_cap_sys_resource() {
        // The kernel lets only CAP_SYS_RESOURCE grow a mounted ext4; without it (some
        // sandboxes) the error says so, and the growth happens at the next stage, unmounted.
        let err = d.node.node_expand_volume(node_expand.clone()).await.unwrap_err();
        assert!(err.message().contains("needs CAP_SYS_RESOURCE") && err.message().contains(&id), "{err:?}");
        eprintln!("online ext4 growth not checked: this process lacks CAP_SYS_RESOURCE; grown at restage");
        let unpublish = csi::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        };
        d.node.node_unpublish_volume(unpublish).await.unwrap();
        let unstage = csi::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        };
        d.node.node_unstage_volume(unstage).await.unwrap();
        d.node.node_stage_volume(stage(cap.clone())).await.unwrap();
        d.node.node_publish_volume(publish.clone()).await.unwrap();
    } else {
        let reply = d.node.node_expand_volume(node_expand.clone()).await.unwrap().into_inner();
        assert_eq!(reply.capacity_bytes, grown);
        d.node.node_expand_volume(node_expand).await.expect("expanding again is fine");
    }
    let (after, available) = statvfs_bytes(&target);
    assert!(after > total + grow_by / 2, "statvfs of the published path: {total} → {after} bytes");
    assert!(available > grow_by / 2, "{available} bytes available after growing by {grow_by}");
    let more = fill(&target.join("fill-2"));
    assert!(more >= grow_by / 2, "{more} more bytes after growing by {grow_by}");
    assert!(written + more <= grown);
    let stats = d.node.node_get_volume_stats(stats).await.unwrap().into_inner().usage;
    assert!(stats[0].total > total, "NodeGetVolumeStats sees the growth: {stats:?}");

    // Teardown: unstage detaches, delete removes the image.
    let busy =
        d.controller.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() });
    assert_eq!(code(busy.await), Code::FailedPrecondition, "in use");
    d.node
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
    let unstage = csi::NodeUnstageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
    };
    d.node.node_unstage_volume(unstage.clone()).await.unwrap();
    assert!(loop_devices_of(&image).is_empty(), "unstage detaches the loop device");
    d.node.node_unstage_volume(unstage).await.expect("unstaging again is fine");
    d.controller
        .delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() })
        .await
        .unwrap();
    assert!(!image.exists(), "delete removes the image");
    d.stop().await;
    assert!(sb.mounts().is_empty(), "mounts left: {:?}", sb.mounts());
    assert!(
        kvol_test_support::loop_devices_of(&sb.root).is_empty(),
        "loop devices left: {:?}",
        kvol_test_support::loop_devices_of(&sb.root)
    );
}

#[tokio::test(flavor = "current_thread")]
async fn an_ext4_volume_holds_its_size_grows_online_and_survives_a_restart() {
    if !loop_devices_usable() || !has_program("mkfs.ext4") {
        return;
    }
    // 16 MiB asked through the capability's fs_type; at least 12 MiB of data fit.
    volume_life("ext4", false, 16 * MIB, 16 * MIB, 16 * MIB, 12 * MIB).await;
}

#[tokio::test(flavor = "current_thread")]
async fn an_xfs_volume_holds_its_size_grows_online_and_survives_a_restart() {
    if !loop_devices_usable() || !has_program("mkfs.xfs") {
        return;
    }
    // 16 MiB asked through the StorageClass parameter: made at xfs's minimum, 300 MiB (sparse);
    // its 64 MiB log leaves a little over 200 MiB for data.
    volume_life("xfs", true, 16 * MIB, 300 * MIB, 32 * MIB, 200 * MIB).await;
}

/// A snapshot of a staged volume (frozen for the copy) restored into a larger volume: the data
/// is there and the filesystem is grown to the new size at stage. Delete refuses while a loop
/// device still holds the image.
#[tokio::test(flavor = "current_thread")]
async fn snapshots_copy_the_image_and_restores_grow_at_stage() {
    if !loop_devices_usable() || !has_program("mkfs.ext4") {
        return;
    }
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let cap = mount_cap("");
    let create =
        |name: &str, bytes: i64, source: Option<csi::VolumeContentSource>| csi::CreateVolumeRequest {
            name: name.to_string(),
            capacity_range: Some(csi::CapacityRange { required_bytes: bytes, limit_bytes: 0 }),
            volume_capabilities: vec![cap.clone()],
            volume_content_source: source,
            ..Default::default()
        };
    let id = d
        .controller
        .create_volume(create("src", 16 * MIB, None))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let staging = sb.path("stage-src");
    let stage = |id: &str, path: &Path| csi::NodeStageVolumeRequest {
        volume_id: id.to_string(),
        staging_target_path: path.display().to_string(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    d.node.node_stage_volume(stage(&id, &staging)).await.unwrap();
    fs::write(staging.join("hello"), b"from the source").unwrap();
    let snap = d
        .controller
        .create_snapshot(csi::CreateSnapshotRequest {
            name: "snap".into(),
            source_volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    fs::write(staging.join("after"), b"written after the snapshot").expect("thawed after the copy");
    let source = csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource { snapshot_id: snap.snapshot_id.clone() },
        )),
    };
    let restored = d
        .controller
        .create_volume(create("restored", 32 * MIB, Some(source)))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(restored.capacity_bytes, 32 * MIB);
    let restaging = sb.path("stage-restored");
    d.node.node_stage_volume(stage(&restored.volume_id, &restaging)).await.unwrap();
    assert_eq!(fs::read(restaging.join("hello")).unwrap(), b"from the source");
    assert!(!restaging.join("after").exists(), "the snapshot is of its moment");
    let (total, _) = statvfs_bytes(&restaging);
    assert!(total > 24 * MIB, "grown to the restored volume's size at stage: {total}");

    for (vid, path) in [(&id, &staging), (&restored.volume_id, &restaging)] {
        d.node
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: vid.clone(),
                staging_target_path: path.display().to_string(),
            })
            .await
            .unwrap();
    }
    // A loop device holding the image (left by someone else) stops the delete, by name.
    let image = sb.path("state/volumes").join(format!("{id}.img"));
    let out = std::process::Command::new("losetup").arg("-f").arg("--show").arg(&image).output().unwrap();
    let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let refused = d
        .controller
        .delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(refused.message().contains(&device) && refused.message().contains(&id), "{}", refused.message());
    std::process::Command::new("losetup").arg("-d").arg(&device).status().unwrap();
    for vid in [&id, &restored.volume_id] {
        d.controller
            .delete_volume(csi::DeleteVolumeRequest { volume_id: vid.clone(), ..Default::default() })
            .await
            .unwrap();
    }
    d.controller
        .delete_snapshot(csi::DeleteSnapshotRequest { snapshot_id: snap.snapshot_id, ..Default::default() })
        .await
        .unwrap();
    d.stop().await;
    assert!(sb.mounts().is_empty());
    assert!(kvol_test_support::loop_devices_of(&sb.root).is_empty());
    let left: Vec<_> =
        fs::read_dir(sb.path("state/volumes")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "nothing left in volumes/: {left:?}");
}

/// The default stays a directory: no image, no loop device.
#[tokio::test(flavor = "current_thread")]
async fn the_directory_backing_is_the_default_and_unchanged() {
    let sb = Sandbox::new();
    let mut d = start(HostpathConfig { volume_backing: VolumeBacking::default(), ..sb.config() }).await;
    let req = csi::CreateVolumeRequest {
        name: "dir".into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: MIB, limit_bytes: 0 }),
        volume_capabilities: vec![mount_cap("")],
        ..Default::default()
    };
    let id = d.controller.create_volume(req).await.unwrap().into_inner().volume.unwrap().volume_id;
    assert!(sb.path("state/volumes").join(&id).is_dir());
    assert!(!sb.path("state/volumes").join(format!("{id}.img")).exists());
    d.controller
        .delete_volume(csi::DeleteVolumeRequest { volume_id: id, ..Default::default() })
        .await
        .unwrap();
    d.stop().await;
}

/// A stage request for `id` on `staging` with a plain mount capability.
fn stage_request(id: &str, staging: &Path) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: id.to_string(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(mount_cap("")),
        ..Default::default()
    }
}

fn unstage_request(id: &str, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: id.to_string(),
        staging_target_path: staging.display().to_string(),
    }
}

async fn create(d: &mut Running, name: &str, bytes: i64) -> String {
    let req = csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(csi::CapacityRange { required_bytes: bytes, limit_bytes: 0 }),
        volume_capabilities: vec![mount_cap("")],
        ..Default::default()
    };
    d.controller.create_volume(req).await.unwrap().into_inner().volume.unwrap().volume_id
}

/// `auto` is loop here (the machine has loop devices), said in GetPluginInfo's manifest; a
/// volume keeps the backing it was made with across restarts whatever the driver's backing is
/// then: a directory volume made before the default changed stays a directory, and a driver
/// back on directories finds the loop volume's image, and its loop device, again.
#[tokio::test(flavor = "current_thread")]
async fn volumes_keep_their_backing_when_the_default_changes() {
    if !loop_devices_usable() || !has_program("mkfs.ext4") {
        return;
    }
    let sb = Sandbox::new();
    let directory = HostpathConfig { volume_backing: VolumeBacking::Directory, ..sb.config() };
    let auto = HostpathConfig { volume_backing: VolumeBacking::Auto, ..sb.config() };
    let (old_staging, new_staging) = (sb.path("stage-old"), sb.path("stage-new"));

    let mut d = start(directory.clone()).await;
    assert_eq!(d.backing.describe(), "directory (asked for); volumes' sizes are not enforced");
    let old = create(&mut d, "old", 16 * MIB).await;
    d.node.node_stage_volume(stage_request(&old, &old_staging)).await.unwrap();
    fs::write(old_staging.join("kept"), b"made on a directory").unwrap();
    d.stop().await;

    // The default changes to auto, which is loop here, and says so.
    let mut d = start(auto.clone()).await;
    assert_eq!(d.backing.backing, VolumeBacking::Loop, "{:?}", d.backing);
    assert!(
        d.backing.reason.starts_with("chosen automatically: loop devices can be made here"),
        "{:?}",
        d.backing
    );
    let info = d.identity.get_plugin_info(csi::GetPluginInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.manifest.get("volume-backing"), Some(&d.backing.describe()));
    let new = create(&mut d, "new", 16 * MIB).await;
    let volumes = sb.path("state/volumes");
    assert!(volumes.join(format!("{new}.img")).is_file(), "a new volume is an image");
    d.node.node_stage_volume(stage_request(&old, &old_staging)).await.expect("staged already");
    d.node.node_stage_volume(stage_request(&new, &new_staging)).await.unwrap();
    assert!(volumes.join(&old).is_dir() && !volumes.join(format!("{old}.img")).exists(), "still a directory");
    let old_mount = sb.mounts_on(&old_staging);
    assert!(old_mount.len() == 1 && !old_mount[0].source.starts_with("/dev/loop"), "{old_mount:?}");
    let image = volumes.join(format!("{new}.img"));
    let devices = loop_devices_of(&image);
    assert_eq!(devices.len(), 1, "{devices:?}");
    d.abort().await;

    // Back on directories after a kill: the loop volume's image and device are found again,
    // the old volume is still the directory it was, and a new volume is a directory.
    let mut d = start(directory).await;
    d.node.node_stage_volume(stage_request(&new, &new_staging)).await.unwrap();
    d.node.node_stage_volume(stage_request(&old, &old_staging)).await.unwrap();
    assert_eq!(loop_devices_of(&image), devices, "the same loop device");
    assert_eq!(fs::read(old_staging.join("kept")).unwrap(), b"made on a directory");
    let (total, _) = statvfs_bytes(&new_staging);
    assert!(total <= 16 * MIB, "the loop volume's own filesystem: {total} bytes");
    let third = create(&mut d, "third", 16 * MIB).await;
    assert!(volumes.join(&third).is_dir() && !volumes.join(format!("{third}.img")).exists());

    for (id, staging) in [(&old, &old_staging), (&new, &new_staging)] {
        d.node.node_unstage_volume(unstage_request(id, staging)).await.unwrap();
    }
    assert!(loop_devices_of(&image).is_empty(), "unstage leaves no loop device");
    for id in [old, new, third] {
        d.controller
            .delete_volume(csi::DeleteVolumeRequest { volume_id: id, ..Default::default() })
            .await
            .unwrap();
    }
    d.stop().await;
    sb.assert_nothing_mounted();
    assert!(kvol_test_support::loop_devices_of(&sb.root).is_empty());
}

/// A driver killed (no unstage, no shutdown) in a mount namespace that then dies, as the
/// README's first command's does: its staged volume's mount goes with the namespace, and the
/// kernel detaches the loop device with it (autoclear), so nothing is left attached.
#[test]
fn a_killed_driver_whose_namespace_dies_leaves_no_loop_device() {
    if !loop_devices_usable() || !has_program("mkfs.ext4") {
        return;
    }
    let scratch = kvol_test_support::ScratchRoot::new();
    let root = scratch.path().to_path_buf();
    let config = HostpathConfig {
        state_dir: root.join("state"),
        csi_socket: root.join("plugins/hostpath.csi.kvol.io/csi.sock"),
        registration_dir: None,
        volume_backing: VolumeBacking::Loop,
        ..HostpathConfig::new("hostpath.csi.kvol.io", "node-a")
    };
    // A thread of its own enters a namespace of its own, stages, and ends with the driver
    // killed: its namespace, holding the only mount, goes with it.
    let staged = std::thread::spawn(move || {
        support::enter_private_mount_namespace();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let staged = runtime.block_on(async {
            let mut d = start(config).await;
            let id = create(&mut d, "lost", 16 * MIB).await;
            let staging = root.join("staging");
            d.node.node_stage_volume(stage_request(&id, &staging)).await.unwrap();
            let image = root.join("state/volumes").join(format!("{id}.img"));
            let devices = loop_devices_of(&image);
            assert_eq!(devices.len(), 1, "{devices:?}");
            d.abort().await;
            (image, devices)
        });
        drop(runtime);
        staged
    })
    .join()
    .expect("the staging thread");
    let (image, devices) = staged;
    let started = std::time::Instant::now();
    while !loop_devices_of(&image).is_empty() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{devices:?} still hold {} after its namespace died",
            image.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    eprintln!("{devices:?} detached {:?} after the namespace died", started.elapsed());
    assert!(scratch.leftovers().is_empty(), "{}", scratch.leftovers());
}

/// A 1 GiB claim is 1 GiB: the filesystem on its image is no larger, and asking it for more
/// than it has left is refused (ENOSPC), measured by `fallocate` so nothing big is written.
#[tokio::test(flavor = "current_thread")]
async fn a_one_gib_volume_holds_one_gib() {
    if !loop_devices_usable() || !has_program("mkfs.ext4") {
        return;
    }
    const GIB: i64 = 1 << 30;
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let started = std::time::Instant::now();
    let id = create(&mut d, "one-gib", GIB).await;
    let created = started.elapsed();
    let staging = sb.path("staging");
    d.node.node_stage_volume(stage_request(&id, &staging)).await.unwrap();
    eprintln!("1 GiB loop volume: created in {created:?}, created and staged in {:?}", started.elapsed());
    let image = sb.path("state/volumes").join(format!("{id}.img"));
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(&image).unwrap();
    assert_eq!(meta.len() as i64, GIB);
    eprintln!("its image takes {} MiB of disk", meta.blocks() * 512 / MIB as u64);
    let (total, available) = statvfs_bytes(&staging);
    assert!(total <= GIB && total > GIB * 9 / 10, "the filesystem is the volume's size: {total} bytes");
    let file = fs::File::create(staging.join("big")).unwrap();
    let too_much = nix::fcntl::fallocate(&file, nix::fcntl::FallocateFlags::empty(), 0, available + 16 * MIB);
    assert_eq!(too_much, Err(nix::errno::Errno::ENOSPC), "{available} bytes were available");
    nix::fcntl::fallocate(&file, nix::fcntl::FallocateFlags::empty(), 0, available - 16 * MIB)
        .expect("what is available can be had");
    drop(file);
    d.node.node_unstage_volume(unstage_request(&id, &staging)).await.unwrap();
    d.controller
        .delete_volume(csi::DeleteVolumeRequest { volume_id: id, ..Default::default() })
        .await
        .unwrap();
    d.stop().await;
    sb.assert_nothing_mounted();
    assert!(kvol_test_support::loop_devices_of(&sb.root).is_empty());
}
