//! CSI end-to-end numbers: registration socket → driver usable, and what kvol adds to a NodePublishVolume.
//!
//! `cargo bench -p kvol-csi --bench csi` runs the bundled driver in-process on real sockets and
//! real bind mounts (in a private mount namespace of the bench thread; needs root), with
//! baselines from the same run: a bare dial + GetInfo for registration, and the same
//! NodePublishVolume sent straight to the driver for the publish overhead.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolume;
use kvol_api::FeatureGates;
use kvol_csi::proto::csi::controller_client::ControllerClient;
use kvol_csi::proto::csi::node_client::NodeClient;
use kvol_csi::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use kvol_csi::proto::csi::{
    CreateVolumeRequest, NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability,
};
use kvol_csi::registration::{RegistrationWatcher, WatcherConfig, plugin_info};
use kvol_csi::{CsiRegistrationHandler, MemoryObjects, Timeouts};
use kvol_hostpath::{HostpathConfig, HostpathDriver};
use kvol_plugin::plugin::{PodInfo, PublishRequest, UnpublishRequest};
use kvol_plugin::{NodeInfo, NodePaths, PluginHost, PluginRegistry, SystemMounter, VolumeSpec};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use tonic::transport::{Channel, Endpoint};

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

async fn channel(socket: &Path) -> Channel {
    Endpoint::from_shared(format!("unix://{}", socket.display())).unwrap().connect().await.unwrap()
}

fn main() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (the bench needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(run());
}

async fn run() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let registration_dir = root.join("plugins_registry");
    let host = PluginHost::new(
        NodePaths::new(root.join("kubelet")),
        NodeInfo::named("node-a"),
        Arc::new(SystemMounter),
    );
    let objects = MemoryObjects::new();
    let registry = Arc::new(PluginRegistry::new(Vec::new()).unwrap());
    let handler = Arc::new(CsiRegistrationHandler::new(
        Arc::clone(&registry),
        Arc::new(objects.clone()),
        host.clone(),
        &FeatureGates::default(),
        Timeouts::default(),
    ));
    let watcher = RegistrationWatcher::start(WatcherConfig::new(&registration_dir), handler).unwrap();

    // 1. Registration socket appearing → driver usable, for 20 drivers; baseline: dial + GetInfo.
    let mut usable = Vec::new();
    let mut get_info = Vec::new();
    let mut stops = Vec::new();
    for i in 0..20 {
        let name = format!("d{i}.bench.kvol.io");
        let config = HostpathConfig {
            state_dir: root.join("state").join(&name),
            csi_socket: root.join("kubelet/plugins").join(&name).join("csi.sock"),
            registration_dir: Some(registration_dir.clone()),
            ..HostpathConfig::new(&name, "node-a")
        };
        let reg_socket = config.registration_socket().unwrap();
        let appeared = Instant::now();
        let driver = HostpathDriver::bind(config, Arc::new(SystemMounter)).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            driver
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        while registry.snapshot().find_by_name(&name).is_err() {
            assert!(appeared.elapsed() < Duration::from_secs(10), "{name} never registered");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        usable.push(appeared.elapsed());
        let start = Instant::now();
        plugin_info(&reg_socket, &WatcherConfig::new(&registration_dir)).await.unwrap();
        get_info.push(start.elapsed());
        stops.push((stop, task));
    }
    let (u, g) = (median(usable.clone()), median(get_info));
    println!(
        "registration socket bound → driver usable (20 drivers; upstream polls every 1 s; target < 100 ms)"
    );
    println!(
        "  median {:.2} ms, max {:.2} ms; a bare dial + GetInfo {:.2} ms (ratio {:.1}x); {}",
        ms(u),
        ms(*usable.iter().max().unwrap()),
        ms(g),
        u.as_secs_f64() / g.as_secs_f64(),
        if u < Duration::from_millis(100) { "under target" } else { "OVER TARGET" }
    );

    // 2. NodePublishVolume through kvol's CSI plugin vs the same call sent straight to the driver.
    let name = "d0.bench.kvol.io";
    let csi_socket = root.join("kubelet/plugins").join(name).join("csi.sock");
    let ch = channel(&csi_socket).await;
    let volume = ControllerClient::new(ch.clone())
        .create_volume(CreateVolumeRequest {
            name: "bench".into(),
            volume_capabilities: vec![capability()],
            ..CreateVolumeRequest::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let snapshot = registry.snapshot();
    let plugin = snapshot.find_by_name(name).unwrap();
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "bench"},
        "spec": {"accessModes": ["ReadWriteOnce"], "csi": {"driver": name, "volumeHandle": volume}}
    }))
    .unwrap();
    let spec = VolumeSpec::persistent(pv);
    let stager = plugin.device_mounter().unwrap();
    let staging = stager.device_mount_path(&spec).unwrap();
    stager.stage(&spec, None, &staging).await.unwrap();
    let pod = PodInfo { name: "p".into(), namespace: "n".into(), uid: "uid".into(), ..PodInfo::default() };
    let mut node = NodeClient::new(ch);
    let rounds = 200;
    let (mut via_kvol, mut direct) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let target = host.paths.pod_volume_dir(&pod.uid, "kubernetes.io/csi", &format!("v{i}")).unwrap();
        let request = PublishRequest {
            spec: &spec,
            pod: &pod,
            pod_volume_name: "v",
            target: &target,
            staging_path: Some(&staging),
            device_path: None,
            read_only: false,
            mount_options: &[],
            projection: None,
        };
        let start = Instant::now();
        plugin.mounter().unwrap().publish(&request).await.unwrap();
        via_kvol.push(start.elapsed());
        let unpublish =
            UnpublishRequest { pod_uid: &pod.uid, pod_volume_name: "v", target: &target, spec: None };
        plugin.mounter().unwrap().unpublish(&unpublish).await.unwrap();

        let raw_target = root.join("direct").join(format!("t{i}"));
        std::fs::create_dir_all(raw_target.parent().unwrap()).unwrap();
        let request = NodePublishVolumeRequest {
            volume_id: volume.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: raw_target.display().to_string(),
            volume_capability: Some(capability()),
            ..NodePublishVolumeRequest::default()
        };
        let start = Instant::now();
        node.node_publish_volume(request).await.unwrap();
        direct.push(start.elapsed());
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: volume.clone(),
            target_path: raw_target.display().to_string(),
        })
        .await
        .unwrap();
    }
    let (k, d) = (median(via_kvol), median(direct));
    println!("NodePublishVolume with a real bind mount ({rounds} rounds; target overhead < 1 ms median)");
    println!(
        "  through kvol's CSI plugin {:.3} ms, straight to the driver {:.3} ms: kvol adds {:.3} ms; {}",
        ms(k),
        ms(d),
        ms(k.saturating_sub(d)),
        if k.saturating_sub(d) < Duration::from_millis(1) { "under target" } else { "OVER TARGET" }
    );
    stager.unstage(&staging).await.unwrap();
    for (stop, task) in stops {
        let _ = stop.send(());
        task.await.unwrap();
    }
    watcher.shutdown().await;
    drop(objects);
}
