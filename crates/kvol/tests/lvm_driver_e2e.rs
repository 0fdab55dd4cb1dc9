//! The real `kvol lvm-driver` serving CSI on real lvm2 (loop-device volume groups the tests make and remove): volumes idempotent by name, capacity, expansion, refusals, lvmd.yaml reload (kept when it would orphan volumes), and kill -9 mid-CreateVolume leaving exactly one logical volume after the retry.
//!
//! Needs root and lvm2's tools; skips with the reason otherwise. On a kernel without
//! device-mapper (containers, some VMs) logical volumes cannot be activated, so these tests run
//! lvm with activation disabled (`LVM_SYSTEM_DIR` pointing at an lvm.conf with
//! `global { activation = 0 }`): the metadata operations, tags and sizes are lvm's own, nothing is
//! mounted. Thin pools need device-mapper and are tested in kvol-lvm's lifecycle test.

mod lvm_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kvol_csi::proto::csi::{
    self, controller_client::ControllerClient, identity_client::IdentityClient, node_client::NodeClient,
};
use lvm_support::*;
use tonic::Code;
use tonic::transport::Channel;

#[tokio::test(flavor = "current_thread")]
async fn volumes_on_real_lvm_are_idempotent_sized_expanded_and_deleted() {
    let Some(env) = skip_reason() else { return };
    let scratch = kvol_test_support::ScratchRoot::new();
    let vg_name = format!("kvolctl{}", std::process::id());
    let vg = LoopVg::create(&env, scratch.path(), &vg_name, 128).expect("a loop-device volume group");
    let driver_name = format!("ctl{}.lvm.csi.kvol.io", std::process::id());
    let config = scratch.path().join("lvmd.yaml");
    std::fs::write(&config, thick_config(&[("hdd", &vg.vg, true)])).unwrap();
    let driver = Driver::start(&env, &config, &scratch.path().join("csi.sock"), &driver_name, None);
    let ch = channel(&driver.socket).await;
    let mut identity = IdentityClient::new(ch.clone());
    let info = identity.get_plugin_info(csi::GetPluginInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.name, driver_name);
    let probe = identity.probe(csi::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    let mut ctl = driver.controller().await;

    let free_before =
        ctl.get_capacity(csi::GetCapacityRequest::default()).await.unwrap().into_inner().available_capacity;
    assert_eq!(free_before, 124 * MIB, "a 128 MiB PV holds 31 extents of 4 MiB");

    let made = ctl
        .create_volume(create_request("pvc-a", 10 * MIB, None))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(made.capacity_bytes, 12 * MIB, "10 MiB rounded up to whole extents");
    assert_eq!(made.volume_id, kvol_lvm::naming::volume_id("pvc-a"));
    let topology = &made.accessible_topology[0].segments;
    assert_eq!(topology.get(&format!("topology.{driver_name}/node")).map(String::as_str), Some("node-a"));
    let again = ctl
        .create_volume(create_request("pvc-a", 10 * MIB, None))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, made.volume_id, "the same name is the same volume");
    let lvs = env.owned(&driver_name);
    assert_eq!(lvs.len(), 1, "{lvs:?}");
    assert_eq!((lvs[0].vg.as_str(), lvs[0].size), (vg.vg.as_str(), 12 << 20));
    assert!(lvs[0].tags.contains(&"kvol.name=pvc-a".to_string()), "{:?}", lvs[0].tags);
    assert!(lvs[0].tags.contains(&"kvol.class=hdd".to_string()), "{:?}", lvs[0].tags);

    let err = ctl.create_volume(create_request("pvc-a", 40 * MIB, None)).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    let err = ctl.create_volume(create_request("pvc-huge", 200 * MIB, None)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("device class hdd has 117440512 bytes left"), "{}", err.message());
    let err = ctl.create_volume(create_request("pvc-x", MIB, Some("nvme"))).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::InvalidArgument, "volume pvc-x: device class \"nvme\" is not in lvmd.yaml (it has: hdd)")
    );
    assert_eq!(env.owned(&driver_name).len(), 1, "refused creates make nothing");
    let free =
        ctl.get_capacity(csi::GetCapacityRequest::default()).await.unwrap().into_inner().available_capacity;
    assert_eq!(free, free_before - 12 * MIB);

    let grown = expand(&mut ctl, &made.volume_id, 30 * MIB).await;
    assert_eq!((grown.capacity_bytes, grown.node_expansion_required), (32 * MIB, true));
    assert_eq!(env.owned(&driver_name)[0].size, 32 << 20);

    let err = ctl
        .create_snapshot(csi::CreateSnapshotRequest {
            name: "snap-a".into(),
            source_volume_id: made.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("is a thick volume"), "{}", err.message());

    for _ in 0..2 {
        ctl.delete_volume(csi::DeleteVolumeRequest {
            volume_id: made.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert!(env.owned(&driver_name).is_empty());
    drop((ctl, identity, ch));
    driver.stop_async().await;
}

#[tokio::test(flavor = "current_thread")]
async fn lvmd_yaml_reloads_at_once_but_never_orphans_volumes() {
    let Some(env) = skip_reason() else { return };
    let scratch = kvol_test_support::ScratchRoot::new();
    let pid = std::process::id();
    let vga = LoopVg::create(&env, scratch.path(), &format!("kvolrla{pid}"), 64).expect("volume group a");
    let vgb = LoopVg::create(&env, scratch.path(), &format!("kvolrlb{pid}"), 64).expect("volume group b");
    let driver_name = format!("rl{pid}.lvm.csi.kvol.io");
    let config = scratch.path().join("lvmd.yaml");
    std::fs::write(&config, thick_config(&[("a", &vga.vg, true)])).unwrap();
    let driver = Driver::start(&env, &config, &scratch.path().join("csi.sock"), &driver_name, None);
    let mut ctl = driver.controller().await;
    let v1 =
        ctl.create_volume(create_request("pvc-1", 4 * MIB, None)).await.unwrap().into_inner().volume.unwrap();

    // Moving class a to the other VG while it holds pvc-1 is refused; the running config stays.
    std::fs::write(&config, thick_config(&[("a", &vgb.vg, true)])).unwrap();
    driver.signal(nix::sys::signal::Signal::SIGHUP);
    let said = driver.wait_line("not reloaded").join("\n");
    let _ = driver.wait_line(&format!("device class a moves from {} to {}", vga.vg, vgb.vg));
    let _ = said;
    ctl.create_volume(create_request("pvc-2", 4 * MIB, None)).await.unwrap();
    let placed: Vec<String> = env.owned(&driver_name).iter().map(|lv| lv.vg.clone()).collect();
    assert_eq!(placed, [vga.vg.clone(), vga.vg.clone()], "still carved from the running class's VG");

    // Emptied, the class may move: the file watcher applies the next change without a signal.
    for name in ["pvc-1", "pvc-2"] {
        let id = kvol_lvm::naming::volume_id(name);
        ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: id, ..Default::default() }).await.unwrap();
    }
    let _ = v1;
    std::fs::write(&config, thick_config(&[("a", &vgb.vg, true), ("b", &vga.vg, false)])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ctl.create_volume(create_request("pvc-3", 4 * MIB, Some("b"))).await {
            Ok(_) => break,
            Err(e) if e.code() == Code::InvalidArgument && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("the new class never came: {e:?}"),
        }
    }
    ctl.create_volume(create_request("pvc-4", 4 * MIB, None)).await.unwrap();
    let mut placed: Vec<(String, String)> = env
        .owned(&driver_name)
        .iter()
        .map(|lv| {
            (
                lv.vg.clone(),
                kvol_lvm::naming::tag_value(&lv.tags, "kvol.name=").unwrap_or_default().to_string(),
            )
        })
        .collect();
    placed.sort();
    let mut want = vec![(vga.vg.clone(), "pvc-3".to_string()), (vgb.vg.clone(), "pvc-4".to_string())];
    want.sort();
    assert_eq!(placed, want);

    // An invalid file is not applied either: every problem logged, the classes stay.
    std::fs::write(&config, "device-classes:\n  - name: a\n").unwrap();
    driver.signal(nix::sys::signal::Signal::SIGHUP);
    let _ = driver.wait_line("volume-group: should not be empty");
    ctl.create_volume(create_request("pvc-5", 4 * MIB, Some("b"))).await.unwrap();

    // Removed (kvol's component copy goes when its user's file does): made again from the
    // node's volume groups, as at start. With two here and none named there is no one to pick,
    // so it is refused and the classes stay.
    std::fs::remove_file(&config).unwrap();
    driver.signal(nix::sys::signal::Signal::SIGHUP);
    let said = driver.wait_line("cannot generate");
    assert!(said.iter().any(|l| l.contains(&config.display().to_string())), "{said:?}");
    ctl.create_volume(create_request("pvc-6", 4 * MIB, Some("b"))).await.unwrap();
    for name in ["pvc-3", "pvc-4", "pvc-5", "pvc-6"] {
        let id = kvol_lvm::naming::volume_id(name);
        ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: id, ..Default::default() }).await.unwrap();
    }
    assert!(env.owned(&driver_name).is_empty());
    drop(ctl);
    driver.stop_async().await;
}

/// An `lvcreate` on PATH that runs the real one before (`after`) or after (`before`) it records
/// its pid and hangs, so the test can kill -9 the driver at that moment.
fn hanging_lvcreate(dir: &Path, when: &str) -> PathBuf {
    let bin = dir.join(format!("bin-{when}"));
    std::fs::create_dir_all(&bin).unwrap();
    let real = text(&Command::new("sh").args(["-c", "command -v lvcreate"]).output().unwrap().stdout)
        .trim()
        .to_string();
    let marker = dir.join(format!("hung-{when}"));
    let body = match when {
        "after" => format!(
            "#!/bin/sh\n{real} \"$@\" || exit $?\necho $$ > {m}.tmp && mv {m}.tmp {m}\nexec sleep 60\n",
            m = marker.display()
        ),
        _ => format!(
            "#!/bin/sh\necho $$ > {m}.tmp && mv {m}.tmp {m}\nsleep 60\nexec {real} \"$@\"\n",
            m = marker.display()
        ),
    };
    let script = bin.join("lvcreate");
    std::fs::write(&script, body).unwrap();
    Command::new("chmod").arg("755").arg(&script).status().unwrap();
    bin
}

#[tokio::test(flavor = "current_thread")]
async fn kill_9_mid_create_leaves_one_lv_after_the_retry_and_none_after_delete() {
    let Some(env) = skip_reason() else { return };
    let scratch = kvol_test_support::ScratchRoot::new();
    let pid = std::process::id();
    let vg = LoopVg::create(&env, scratch.path(), &format!("kvolcr{pid}"), 64).expect("a volume group");
    let config = scratch.path().join("lvmd.yaml");
    std::fs::write(&config, thick_config(&[("hdd", &vg.vg, true)])).unwrap();
    let socket = scratch.path().join("csi.sock");
    // Killed once lvcreate has committed (the LV exists, no answer was sent), or before it ran.
    for (when, lvs_after_kill) in [("after", 1), ("before", 0)] {
        let driver_name = format!("cr{when}{pid}.lvm.csi.kvol.io");
        let bin = hanging_lvcreate(scratch.path(), when);
        let marker = scratch.path().join(format!("hung-{when}"));
        let driver = Driver::start(&env, &config, &socket, &driver_name, Some(&bin));
        let mut ctl = driver.controller().await;
        let call =
            tokio::spawn(async move { ctl.create_volume(create_request("pvc-crash", 8 * MIB, None)).await });
        let started = Instant::now();
        while !marker.exists() {
            assert!(started.elapsed() < Duration::from_secs(20), "lvcreate never ran ({when})");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        driver.kill9();
        let hung: i32 = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(hung), nix::sys::signal::Signal::SIGKILL);
        assert!(call.await.unwrap().is_err(), "the killed driver never answered ({when})");
        assert_eq!(env.owned(&driver_name).len(), lvs_after_kill, "killed {when} lvcreate");

        let driver = Driver::start(&env, &config, &socket, &driver_name, None);
        let mut ctl = driver.controller().await;
        let retried =
            ctl.create_volume(create_request("pvc-crash", 8 * MIB, None)).await.unwrap().into_inner();
        let volume = retried.volume.unwrap();
        let lvs = env.owned(&driver_name);
        assert_eq!(lvs.len(), 1, "exactly one LV after the retry ({when}): {lvs:?}");
        assert_eq!(lvs[0].name, volume.volume_id);
        ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: volume.volume_id, ..Default::default() })
            .await
            .unwrap();
        assert!(env.owned(&driver_name).is_empty(), "none after delete ({when})");
        drop(ctl);
        driver.stop_async().await;
    }
}

/// Times one step and prints it.
struct Steps(Instant);

impl Steps {
    fn done(&mut self, what: &str) {
        eprintln!("step {what}: {:?}", self.0.elapsed());
        self.0 = Instant::now();
    }
}

/// ControllerExpandVolume of `id` to `bytes`, which must succeed.
async fn expand(
    ctl: &mut ControllerClient<Channel>,
    id: &str,
    bytes: i64,
) -> csi::ControllerExpandVolumeResponse {
    let request = csi::ControllerExpandVolumeRequest {
        volume_id: id.to_string(),
        capacity_range: Some(csi::CapacityRange { required_bytes: bytes, limit_bytes: 0 }),
        ..Default::default()
    };
    ctl.controller_expand_volume(request).await.unwrap().into_inner()
}

async fn stage(node: &mut NodeClient<Channel>, id: &str, staging: &Path, cap: csi::VolumeCapability) {
    node.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("stage {id}: {e:?}"));
}

async fn publish(
    node: &mut NodeClient<Channel>,
    id: &str,
    staging: &Path,
    target: &Path,
    cap: csi::VolumeCapability,
) {
    node.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("publish {id}: {e:?}"));
}

async fn tear_down(node: &mut NodeClient<Channel>, id: &str, staging: &Path, target: &Path) {
    let unpublish =
        csi::NodeUnpublishVolumeRequest { volume_id: id.into(), target_path: target.display().to_string() };
    node.node_unpublish_volume(unpublish).await.unwrap();
    assert!(!target.exists(), "the target is removed");
    let unstage = csi::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
    };
    node.node_unstage_volume(unstage.clone()).await.unwrap();
    node.node_unstage_volume(unstage).await.unwrap();
}

fn statvfs_total(path: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(path).unwrap();
    s.blocks() * s.fragment_size()
}

/// The whole life of a claim, with device-mapper: a thin volume formatted, mounted, written,
/// expanded (LV and filesystem), snapshotted, restored and read back; the thin class
/// overprovisioned to its ratio and no further; a raw block volume published as its device.
#[tokio::test(flavor = "current_thread")]
async fn with_device_mapper_a_volume_is_formatted_written_expanded_snapshotted_restored_and_deleted() {
    let Some(env) = skip_reason() else { return };
    if !env.activates() {
        eprintln!(
            "skipping: the kernel has no device-mapper, so no logical volume can be activated (or thin pool made) here"
        );
        return;
    }
    enter_private_mount_namespace();
    let mut steps = Steps(Instant::now());
    let scratch = kvol_test_support::ScratchRoot::new();
    let root = std::fs::canonicalize(scratch.path()).unwrap();
    let pid = std::process::id();
    let vg = LoopVg::create(&env, &root, &format!("kvollife{pid}"), 512).expect("a volume group");
    vg.thin_pool("pool", 256).expect("a thin pool");
    let config = root.join("lvmd.yaml");
    let classes = format!(
        "{}  - name: hdd\n    volume-group: {}\n    spare-gb: 0\n",
        thin_class("fast", &vg.vg, "pool", 2.0, true),
        vg.vg
    );
    std::fs::write(&config, format!("device-classes:\n{classes}")).unwrap();
    let driver_name = format!("life{pid}.lvm.csi.kvol.io");
    let driver = Driver::start(&env, &config, &root.join("csi.sock"), &driver_name, None);
    let ch = channel(&driver.socket).await;
    let mut ctl = driver.controller().await;
    let mut node = NodeClient::new(ch);
    steps.done("volume group, thin pool, driver up");

    let vol = ctl
        .create_volume(create_request("pvc-life", 64 * MIB, None))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let id = vol.volume_id.clone();
    let (staging, target) = (root.join("staging/life"), root.join("pods/life/mount"));
    stage(&mut node, &id, &staging, mount_cap()).await;
    stage(&mut node, &id, &staging, mount_cap()).await;
    publish(&mut node, &id, &staging, &target, mount_cap()).await;
    std::fs::write(target.join("hello"), "from the first volume").unwrap();
    nix::unistd::sync();
    steps.done("create, stage (formatted ext4), publish, write");

    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: target.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let before = statvfs_total(&target);
    assert_eq!(stats.usage[0].total as u64, before);
    let grown = expand(&mut ctl, &id, 128 * MIB).await;
    assert_eq!((grown.capacity_bytes, grown.node_expansion_required), (128 * MIB, true));
    if has_sys_resource() {
        let expand = csi::NodeExpandVolumeRequest {
            volume_id: id.clone(),
            volume_path: target.display().to_string(),
            ..Default::default()
        };
        let answer = node.node_expand_volume(expand).await.unwrap().into_inner();
        assert_eq!(answer.capacity_bytes, 128 * MIB);
        let after = statvfs_total(&target);
        assert!(after > before + (50 << 20), "the filesystem grew: {before} → {after}");
    } else {
        eprintln!("note: ext4's online grow skipped: no CAP_SYS_RESOURCE here");
    }
    steps.done("expand (lvextend, resize2fs)");

    let snap = ctl
        .create_snapshot(csi::CreateSnapshotRequest {
            name: "snap-life".into(),
            source_volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(snap.ready_to_use);
    let mut restore = create_request("pvc-restored", 128 * MIB, None);
    restore.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource { snapshot_id: snap.snapshot_id.clone() },
        )),
    });
    let restored = ctl.create_volume(restore).await.unwrap().into_inner().volume.unwrap();
    let (staging2, target2) = (root.join("staging/restored"), root.join("pods/restored/mount"));
    stage(&mut node, &restored.volume_id, &staging2, mount_cap()).await;
    publish(&mut node, &restored.volume_id, &staging2, &target2, mount_cap()).await;
    assert_eq!(std::fs::read_to_string(target2.join("hello")).unwrap(), "from the first volume");
    steps.done("snapshot, restore, stage and publish the restored volume, read");

    // Thin: 128 (volume) + 128 (snapshot) + 128 (restored) promised of 256 × 2.
    let fast = csi::GetCapacityRequest::default();
    assert_eq!(ctl.get_capacity(fast.clone()).await.unwrap().into_inner().available_capacity, 128 * MIB);
    ctl.create_volume(create_request("pvc-over", 128 * MIB, None))
        .await
        .expect("overprovisioned within the ratio");
    let err = ctl.create_volume(create_request("pvc-too-much", 4 * MIB, None)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    steps.done("overprovision to the ratio, refused beyond");

    let raw = ctl
        .create_volume(create_request("pvc-raw", 16 * MIB, Some("hdd")))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let (staging3, target3) = (root.join("staging/raw"), root.join("pods/raw/dev"));
    stage(&mut node, &raw.volume_id, &staging3, block_cap()).await;
    publish(&mut node, &raw.volume_id, &staging3, &target3, block_cap()).await;
    {
        use std::io::{Read, Seek, SeekFrom, Write};
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata(&target3).unwrap().file_type().is_block_device());
        let mut device = std::fs::OpenOptions::new().read(true).write(true).open(&target3).unwrap();
        device.write_all(b"raw bytes").unwrap();
        device.sync_all().unwrap();
        let mut back = [0u8; 9];
        device.seek(SeekFrom::Start(0)).unwrap();
        device.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"raw bytes");
    }
    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: raw.volume_id.clone(),
            volume_path: target3.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage[0].total, 16 * MIB);
    steps.done("raw block publish, write, read, stats");

    tear_down(&mut node, &raw.volume_id, &staging3, &target3).await;
    tear_down(&mut node, &restored.volume_id, &staging2, &target2).await;
    tear_down(&mut node, &id, &staging, &target).await;
    // Staged again, the volume is mounted as it is: never reformatted.
    stage(&mut node, &id, &staging, mount_cap()).await;
    assert_eq!(std::fs::read_to_string(staging.join("hello")).unwrap(), "from the first volume");
    let unstage = csi::NodeUnstageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
    };
    node.node_unstage_volume(unstage).await.unwrap();
    for volume_id in [
        id.clone(),
        restored.volume_id.clone(),
        raw.volume_id.clone(),
        kvol_lvm::naming::volume_id("pvc-over"),
    ] {
        ctl.delete_volume(csi::DeleteVolumeRequest { volume_id, ..Default::default() }).await.unwrap();
    }
    ctl.delete_snapshot(csi::DeleteSnapshotRequest { snapshot_id: snap.snapshot_id, ..Default::default() })
        .await
        .unwrap();
    assert!(env.owned(&driver_name).is_empty());
    steps.done("unpublish, unstage, restage unformatted, delete all");
    drop((ctl, node));
    driver.stop_async().await;
}

/// Stands in for lvm's activation where the kernel has no device-mapper: a loop device of the
/// logical volume's size linked at `/dev/<vg>/<lv>`, where the driver looks for the volume's
/// device. Only the device node is stood in for; lvm's metadata, the driver and the node's
/// tools (blkid, mkfs, mount, resize) are real. Removed on drop.
struct StandIn {
    link: PathBuf,
    device: String,
    image: PathBuf,
}

impl StandIn {
    fn new(dir: &Path, vg: &str, lv: &str, bytes: i64) -> StandIn {
        let image = dir.join(format!("{lv}.img"));
        std::fs::File::create(&image).and_then(|f| f.set_len(bytes as u64)).unwrap();
        let out = Command::new("losetup").args(["-f", "--show"]).arg(&image).output().unwrap();
        assert!(out.status.success(), "losetup: {}", text(&out.stderr));
        let device = text(&out.stdout).trim().to_string();
        let link = Path::new("/dev").join(vg).join(lv);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&device, &link).unwrap();
        StandIn { link, device, image }
    }

    fn grow(&self, bytes: i64) {
        std::fs::OpenOptions::new().write(true).open(&self.image).unwrap().set_len(bytes as u64).unwrap();
        assert!(Command::new("losetup").args(["-c", &self.device]).status().unwrap().success());
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.link);
        if let Some(dir) = self.link.parent() {
            let _ = std::fs::remove_dir(dir);
        }
        let _ = Command::new("losetup").args(["-d", &self.device]).output();
    }
}

fn fs_cap(fs: &str) -> csi::VolumeCapability {
    let mut cap = mount_cap();
    if let Some(csi::volume_capability::AccessType::Mount(m)) = &mut cap.access_type {
        m.fs_type = fs.to_string();
    }
    cap
}

/// The node service on a kernel without device-mapper: each volume's device stood in by a loop
/// device (see [`StandIn`]); formatting once (ext4, xfs), refusing to format over another
/// filesystem, publish, stats, expansion (xfs online; ext4 where CAP_SYS_RESOURCE allows), raw
/// block, and idempotent teardown, through the real driver's gRPC.
#[tokio::test(flavor = "current_thread")]
async fn without_device_mapper_the_node_service_works_on_stand_in_devices() {
    let Some(env) = skip_reason() else { return };
    if env.activates() {
        eprintln!(
            "skipping: device-mapper is here, and the lifecycle test covers the node service on real LVs"
        );
        return;
    }
    for tool in ["blkid", "mkfs.ext4", "mkfs.xfs", "xfs_growfs"] {
        if !Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            eprintln!("skipping: {tool} is not installed");
            return;
        }
    }
    enter_private_mount_namespace();
    let mut steps = Steps(Instant::now());
    let scratch = kvol_test_support::ScratchRoot::new();
    let root = std::fs::canonicalize(scratch.path()).unwrap();
    let pid = std::process::id();
    let vg = LoopVg::create(&env, &root, &format!("kvolnode{pid}"), 1024).expect("a volume group");
    let config = root.join("lvmd.yaml");
    std::fs::write(&config, thick_config(&[("hdd", &vg.vg, true)])).unwrap();
    let driver_name = format!("node{pid}.lvm.csi.kvol.io");
    let driver = Driver::start(&env, &config, &root.join("csi.sock"), &driver_name, None);
    let mut ctl = driver.controller().await;
    let mut node = NodeClient::new(channel(&driver.socket).await);
    let mut made = Vec::new();
    for (name, bytes) in [("pvc-ext4", 64 * MIB), ("pvc-xfs", 320 * MIB), ("pvc-raw", 16 * MIB)] {
        let v =
            ctl.create_volume(create_request(name, bytes, None)).await.unwrap().into_inner().volume.unwrap();
        let stand_in = StandIn::new(&root, &vg.vg, &v.volume_id, v.capacity_bytes);
        made.push((v.volume_id, stand_in));
    }
    let [(ext4, _), (xfs, xfs_device), (raw, raw_device)] = &made[..] else { unreachable!() };
    steps.done("three volumes made, their devices stood in");

    // ext4: formatted on first stage, mounted as it is afterwards, never reformatted.
    let (staging, target) = (root.join("staging/ext4"), root.join("pods/ext4/mount"));
    stage(&mut node, ext4, &staging, mount_cap()).await;
    stage(&mut node, ext4, &staging, mount_cap()).await;
    publish(&mut node, ext4, &staging, &target, mount_cap()).await;
    publish(&mut node, ext4, &staging, &target, mount_cap()).await;
    let read_only = csi::NodePublishVolumeRequest {
        volume_id: ext4.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount_cap()),
        readonly: true,
        ..Default::default()
    };
    assert_eq!(node.node_publish_volume(read_only).await.unwrap_err().code(), Code::AlreadyExists);
    std::fs::write(target.join("hello"), "kept").unwrap();
    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: ext4.clone(),
            volume_path: target.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage[0].total as u64, statvfs_total(&target));
    let elsewhere = csi::NodeGetVolumeStatsRequest {
        volume_id: ext4.clone(),
        volume_path: root.display().to_string(),
        ..Default::default()
    };
    assert_eq!(node.node_get_volume_stats(elsewhere).await.unwrap_err().code(), Code::NotFound);
    tear_down(&mut node, ext4, &staging, &target).await;
    let mut as_xfs = csi::NodeStageVolumeRequest {
        volume_id: ext4.clone(),
        staging_target_path: root.join("staging/other").display().to_string(),
        volume_capability: Some(fs_cap("xfs")),
        ..Default::default()
    };
    let err = node.node_stage_volume(as_xfs.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("holds ext4, not the xfs asked for"), "{}", err.message());
    as_xfs.volume_capability = Some(fs_cap("btrfs"));
    assert_eq!(node.node_stage_volume(as_xfs).await.unwrap_err().code(), Code::InvalidArgument);
    stage(&mut node, ext4, &staging, mount_cap()).await;
    assert_eq!(std::fs::read_to_string(staging.join("hello")).unwrap(), "kept", "never reformatted");
    let unstage = csi::NodeUnstageVolumeRequest {
        volume_id: ext4.clone(),
        staging_target_path: staging.display().to_string(),
    };
    node.node_unstage_volume(unstage).await.unwrap();
    steps.done("ext4: format once, publish, stats, refuse xfs over it, restage unformatted");

    // xfs: made, published, the LV then the filesystem grown.
    let (staging, target) = (root.join("staging/xfs"), root.join("pods/xfs/mount"));
    stage(&mut node, xfs, &staging, fs_cap("xfs")).await;
    publish(&mut node, xfs, &staging, &target, fs_cap("xfs")).await;
    let before = statvfs_total(&target);
    let grown = expand(&mut ctl, xfs, 640 * MIB).await;
    assert_eq!((grown.capacity_bytes, grown.node_expansion_required), (640 * MIB, true));
    xfs_device.grow(640 * MIB);
    let expand = csi::NodeExpandVolumeRequest {
        volume_id: xfs.clone(),
        volume_path: target.display().to_string(),
        ..Default::default()
    };
    assert_eq!(node.node_expand_volume(expand).await.unwrap().into_inner().capacity_bytes, 640 * MIB);
    let after = statvfs_total(&target);
    assert!(after > before + (250 << 20), "xfs grew: {before} → {after}");
    tear_down(&mut node, xfs, &staging, &target).await;
    steps.done("xfs: format, publish, lvextend then xfs_growfs");

    // Raw block: the device bound on a file at the target.
    let (staging, target) = (root.join("staging/raw"), root.join("pods/raw/dev"));
    stage(&mut node, raw, &staging, block_cap()).await;
    publish(&mut node, raw, &staging, &target, block_cap()).await;
    publish(&mut node, raw, &staging, &target, block_cap()).await;
    {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = std::fs::metadata(&target).unwrap();
        assert!(meta.file_type().is_block_device());
        assert_eq!(meta.rdev(), std::fs::metadata(&raw_device.device).unwrap().rdev());
    }
    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: raw.clone(),
            volume_path: target.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage[0].total, 16 * MIB);
    tear_down(&mut node, raw, &staging, &target).await;
    steps.done("raw block: publish the device, stats, unpublish");

    let left = SystemMounterView::under(&root);
    assert!(left.is_empty(), "mounts left: {left:?}");
    for (id, _) in &made {
        ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() })
            .await
            .unwrap();
    }
    assert!(env.owned(&driver_name).is_empty());
    drop((ctl, node));
    driver.stop_async().await;
}

/// The mounts at or below a path, from this thread's mount table.
struct SystemMounterView;

impl SystemMounterView {
    fn under(root: &Path) -> Vec<String> {
        let table = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap_or_default();
        table
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .filter(|target| Path::new(target).starts_with(root))
            .map(str::to_string)
            .collect()
    }
}
