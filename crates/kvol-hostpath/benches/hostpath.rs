//! The hostpath driver's cost: Create → Stage → Publish over gRPC against a straight `mkdir` + bind `mount` of the same paths, in the same run.
//!
//! `cargo bench -p kvol-hostpath` runs the driver in-process on a real unix socket with real
//! bind mounts, in a private mount namespace of the bench thread (needs root). Each round
//! creates a volume, stages and publishes it, timed; then unpublishes, unstages and deletes it,
//! untimed. The baseline does what the driver does on disk without gRPC or its state file: a
//! volume directory, a staging bind mount, a publish bind mount. Numbers are printed, never
//! asserted.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvol_csi::proto::csi::controller_client::ControllerClient;
use kvol_csi::proto::csi::node_client::NodeClient;
use kvol_csi::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use kvol_csi::proto::csi::{self, VolumeCapability};
use kvol_hostpath::{HostpathConfig, HostpathDriver};
use kvol_plugin::mount::{Mounter, SystemMounter};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use tonic::transport::Endpoint;

const ROUNDS: usize = 100;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    }
}

fn main() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (the bench needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(run());
}

/// The baseline: mkdir the volume, staging and target directories, bind-mount twice.
fn straight(root: &Path, i: usize) -> Duration {
    let (volume, staging, target) = (
        root.join(format!("raw/vol-{i}")),
        root.join(format!("raw/stage-{i}")),
        root.join(format!("raw/target-{i}")),
    );
    let start = Instant::now();
    for dir in [&volume, &staging, &target] {
        std::fs::create_dir_all(dir).unwrap();
    }
    SystemMounter.bind(&volume, &staging, false).unwrap();
    SystemMounter.bind(&staging, &target, false).unwrap();
    let took = start.elapsed();
    SystemMounter.unmount(&target).unwrap();
    SystemMounter.unmount(&staging).unwrap();
    took
}

/// What durability costs on this disk: three small files written the way the driver writes its
/// state (write, fsync, rename, fsync the directory), one per RPC.
fn durable_writes(root: &Path) -> Duration {
    use std::io::Write;
    let dir = root.join("raw");
    let start = Instant::now();
    for _ in 0..3 {
        let tmp = dir.join(".state.json.tmp");
        let mut f = std::fs::File::create(&tmp).unwrap();
        f.write_all(&[b'x'; 2048]).unwrap();
        f.sync_all().unwrap();
        std::fs::rename(&tmp, dir.join("state.json")).unwrap();
        std::fs::File::open(&dir).unwrap().sync_all().unwrap();
    }
    start.elapsed()
}

async fn run() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let config = HostpathConfig {
        state_dir: root.join("state"),
        csi_socket: root.join("csi.sock"),
        registration_dir: None,
        ..HostpathConfig::new("hostpath.csi.kvol.io", "node-a")
    };
    let driver = HostpathDriver::bind(config, Arc::new(SystemMounter)).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(driver.run(async {
        let _ = stopped.await;
    }));
    let ch = Endpoint::from_shared(format!("unix://{}", root.join("csi.sock").display()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (mut controller, mut node) = (ControllerClient::new(ch.clone()), NodeClient::new(ch));

    let (mut create, mut stage, mut publish, mut total, mut baseline) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut durable = Vec::new();
    for i in 0..ROUNDS {
        let (staging, target) = (root.join(format!("stage-{i}")), root.join(format!("target-{i}")));
        let t0 = Instant::now();
        let volume = controller
            .create_volume(csi::CreateVolumeRequest {
                name: format!("bench-{i}"),
                volume_capabilities: vec![capability()],
                capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 20, limit_bytes: 0 }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let t1 = Instant::now();
        let id = volume.volume_id;
        node.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        })
        .await
        .unwrap();
        let t2 = Instant::now();
        node.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        })
        .await
        .unwrap();
        let t3 = Instant::now();
        create.push(t1 - t0);
        stage.push(t2 - t1);
        publish.push(t3 - t2);
        total.push(t3 - t0);
        node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap();
        controller
            .delete_volume(csi::DeleteVolumeRequest { volume_id: id, ..Default::default() })
            .await
            .unwrap();
        baseline.push(straight(&root, i));
        durable.push(durable_writes(&root));
    }
    let (t, b) = (median(total), median(baseline));
    println!("create → stage → publish through the hostpath driver ({ROUNDS} rounds, medians)");
    println!(
        "  create {:.3} ms, stage {:.3} ms, publish {:.3} ms; total {:.3} ms",
        ms(median(create)),
        ms(median(stage)),
        ms(median(publish)),
        ms(t)
    );
    println!(
        "  straight mkdir ×3 + bind mount ×2: {:.3} ms; the driver costs {:.1}x ({:.3} ms more)",
        ms(b),
        t.as_secs_f64() / b.as_secs_f64(),
        ms(t.saturating_sub(b))
    );
    let d = median(durable);
    println!(
        "  of which durability: three fsync'd atomic file replacements (one per rpc) take {:.3} ms here; the rest, {:.3} ms, is grpc and bookkeeping",
        ms(d),
        ms(t.saturating_sub(b).saturating_sub(d))
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}
