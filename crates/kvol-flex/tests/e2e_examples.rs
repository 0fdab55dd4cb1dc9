//! The example drivers end to end through kvol: installed, found by the prober, resolved from a
//! spec, and driven through the Flexvolume plugin onto real mounts in a private mount namespace.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{FlexPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_api::FeatureGates;
use kvol_flex::install::install;
use kvol_flex::prober::{FlexProber, ProberConfig};
use kvol_plugin::migration::{NodeMigration, NodeStatus, resolve};
use kvol_plugin::plugin::{PodInfo, PublishRequest, UnpublishRequest};
use kvol_plugin::{Mounter, NodeInfo, NodePaths, PluginHost, PluginRegistry, SystemMounter, VolumeSpec};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;

fn enter_private_mount_namespace() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
}

fn example(relative: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/flexvolume").join(relative)
}

fn flex_pv(name: &str, driver: &str, options: &[(&str, &str)]) -> VolumeSpec {
    let options: BTreeMap<String, String> =
        options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    VolumeSpec::persistent(PersistentVolume {
        metadata: ObjectMeta { name: Some(name.to_string()), ..ObjectMeta::default() },
        spec: Some(PersistentVolumeSpec {
            flex_volume: Some(FlexPersistentVolumeSource {
                driver: driver.to_string(),
                fs_type: Some("ext4".to_string()),
                options: Some(options),
                ..FlexPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    })
}

/// A node under a temporary root with both example drivers installed and the prober running.
struct Node {
    host: PluginHost,
    registry: Arc<PluginRegistry>,
    prober: Option<FlexProber>,
    _root: kvol_test_support::ScratchRoot,
}

impl Node {
    async fn start() -> Node {
        let root = kvol_test_support::ScratchRoot::new();
        let base = std::fs::canonicalize(root.path()).unwrap();
        let plugins = base.join("exec");
        std::fs::create_dir(&plugins).unwrap();
        install(&example("kvol~tmpfs/tmpfs"), &plugins, "kvol~tmpfs").unwrap();
        install(&example("kvol~loop/loop"), &plugins, "kvol~loop").unwrap();
        let host = PluginHost::new(
            NodePaths::new(base.join("kubelet")),
            NodeInfo::named("node-a"),
            Arc::new(SystemMounter),
        );
        let registry = Arc::new(PluginRegistry::new(Vec::new()).unwrap());
        let config =
            ProberConfig { owner_uid: nix::unistd::getuid().as_raw(), ..ProberConfig::new(&plugins) };
        let prober = FlexProber::start(config, host.clone(), Arc::clone(&registry)).unwrap();
        let start = Instant::now();
        while registry.snapshot().plugins().len() < 2 {
            assert!(start.elapsed() < Duration::from_secs(10), "the example drivers were not loaded");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Node { host, registry, prober: Some(prober), _root: root }
    }
}

fn pod() -> PodInfo {
    PodInfo {
        name: "web".into(),
        namespace: "default".into(),
        uid: "uid-1".into(),
        service_account: "default".into(),
        fs_group: None,
        fs_group_change_policy: kvol_plugin::plugin::FsGroupChangePolicy::Always,
        memory_limit: None,
    }
}

#[tokio::test]
async fn the_tmpfs_driver_publishes_a_sized_tmpfs_into_the_pod() {
    enter_private_mount_namespace();
    let node = Node::start().await;
    let gates = FeatureGates::default();
    let own = NodeMigration::of_own_node("node-a", &gates, []);
    let snapshot = node.registry.snapshot();
    let spec = flex_pv("scratch", "kvol/tmpfs", &[("size", "32Mi")]);
    let resolved = resolve(&snapshot, &gates, &spec, NodeStatus::Known(&own)).unwrap();
    let plugin = resolved.plugin;
    assert_eq!(plugin.name(), "kvol/tmpfs");
    assert!(plugin.attacher().is_none(), "tmpfs says attach: false in init");

    let pod = pod();
    let target = node.host.paths.pod_volume_dir(&pod.uid, plugin.name(), "scratch").unwrap();
    let request = PublishRequest {
        spec: &resolved.spec,
        pod: &pod,
        pod_volume_name: "scratch",
        target: &target,
        staging_path: None,
        device_path: None,
        read_only: false,
        mount_options: &[],
        projection: None,
    };
    plugin.mounter().unwrap().publish(&request).await.unwrap();
    let mounted =
        SystemMounter.mount_points().unwrap().into_iter().find(|m| m.target == target).expect("mounted");
    assert_eq!(mounted.fstype, "tmpfs");
    assert!(mounted.options.iter().any(|o| o == "size=32768k"), "{:?}", mounted.options);
    std::fs::write(target.join("file"), b"hello").unwrap();

    let unpublish =
        UnpublishRequest { pod_uid: &pod.uid, pod_volume_name: "scratch", target: &target, spec: None };
    plugin.mounter().unwrap().unpublish(&unpublish).await.unwrap();
    assert!(!SystemMounter.is_mount_point(&target).unwrap());
    assert!(!target.exists());
    node.prober.unwrap().shutdown().await;
}

/// Detaches the loop device of a volume even when the test fails half-way.
/// The loop tests one at a time: a private mount namespace made while another test's loop
/// device is mounted holds a copy of that mount, and the device cannot go until it does.
static LOOP_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct LoopGuard(String);

impl Drop for LoopGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[tokio::test]
async fn the_loop_driver_attaches_stages_and_kvol_binds_it_into_the_pod() {
    let tools = ["losetup", "mkfs.ext4", "blkid"];
    if !Path::new("/dev/loop-control").exists()
        || tools.iter().any(|t| {
            std::process::Command::new("which").arg(t).output().map_or(true, |o| !o.status.success())
        })
    {
        eprintln!("skipped: needs /dev/loop-control, losetup, mkfs.ext4 and blkid");
        return;
    }
    let _one_at_a_time = LOOP_TESTS.lock().await;
    enter_private_mount_namespace();
    let node = Node::start().await;
    let gates = FeatureGates::default();
    let own = NodeMigration::of_own_node("node-a", &gates, []);
    let snapshot = node.registry.snapshot();
    let backing = node.host.paths.root().join("disk.img");
    let volume = format!("kvol-e2e-{}", std::process::id());
    let spec = flex_pv(&volume, "kvol/loop", &[("backingFile", backing.to_str().unwrap()), ("size", "16Mi")]);
    let resolved = resolve(&snapshot, &gates, &spec, NodeStatus::Known(&own)).unwrap();
    let plugin = resolved.plugin;
    let spec = &resolved.spec;

    let attacher = plugin.attacher().expect("loop is attachable");
    let device = attacher.attach(spec, "node-a").await.unwrap().expect("attach names the device");
    let _guard = LoopGuard(device.clone());
    assert!(device.starts_with("/dev/loop"), "{device}");
    let device = attacher.wait_for_attach(spec, Some(&device), Duration::from_secs(10)).await.unwrap();
    assert!(attacher.is_attached(spec, "node-a").await.unwrap());

    let stager = plugin.device_mounter().expect("loop stages");
    let staging = stager.device_mount_path(spec).unwrap();
    stager.stage(spec, Some(&device), &staging).await.unwrap();
    let staged =
        SystemMounter.mount_points().unwrap().into_iter().find(|m| m.target == staging).expect("staged");
    assert_eq!((staged.fstype.as_str(), staged.source.as_str()), ("ext4", device.as_str()));

    let pod = pod();
    let target = node.host.paths.pod_volume_dir(&pod.uid, plugin.name(), &volume).unwrap();
    let request = PublishRequest {
        spec,
        pod: &pod,
        pod_volume_name: &volume,
        target: &target,
        staging_path: Some(&staging),
        device_path: Some(&device),
        read_only: false,
        mount_options: &[],
        projection: None,
    };
    // The driver answers mount with "Not supported": kvol binds the staged filesystem itself.
    plugin.mounter().unwrap().publish(&request).await.unwrap();
    std::fs::write(target.join("kept"), b"on the loop device").unwrap();
    assert_eq!(std::fs::read(staging.join("kept")).unwrap(), b"on the loop device");

    let unpublish =
        UnpublishRequest { pod_uid: &pod.uid, pod_volume_name: &volume, target: &target, spec: None };
    plugin.mounter().unwrap().unpublish(&unpublish).await.unwrap();
    stager.unstage(&staging).await.unwrap();
    assert!(!SystemMounter.is_mount_point(&staging).unwrap());
    attacher.detach(&plugin.volume_name(spec).unwrap(), "node-a").await.unwrap();
    assert!(!attacher.is_attached(spec, "node-a").await.unwrap());
    let listed =
        std::process::Command::new("losetup").args(["-j", backing.to_str().unwrap()]).output().unwrap();
    assert!(listed.stdout.is_empty(), "the loop device is gone: {}", String::from_utf8_lossy(&listed.stdout));
    node.prober.unwrap().shutdown().await;
}

/// The filesystem size at `path` (statvfs).
fn fs_bytes(path: &Path) -> u64 {
    let fs = nix::sys::statvfs::statvfs(path).unwrap();
    fs.blocks() as u64 * fs.fragment_size() as u64
}

/// Expansion through a Flexvolume driver that grows the device (`expandvolume`) and asks the
/// node to grow the filesystem (`requiresFSResize`) without doing it itself (`expandfs` is "Not
/// supported"): kvol grows the published xfs with kubelet's generic resize, and the pod's
/// filesystem shows the new size with its data.
#[tokio::test]
async fn the_loop_driver_grows_its_device_and_kvol_grows_the_filesystem_on_the_node() {
    let tools = ["losetup", "mkfs.xfs", "blkid", "xfs_growfs"];
    if !Path::new("/dev/loop-control").exists()
        || tools.iter().any(|t| {
            std::process::Command::new("which").arg(t).output().map_or(true, |o| !o.status.success())
        })
    {
        eprintln!("skipped: needs /dev/loop-control, losetup, mkfs.xfs, blkid and xfs_growfs");
        return;
    }
    let _one_at_a_time = LOOP_TESTS.lock().await;
    enter_private_mount_namespace();
    let node = Node::start().await;
    let gates = FeatureGates::default();
    let own = NodeMigration::of_own_node("node-a", &gates, []);
    let snapshot = node.registry.snapshot();
    let backing = node.host.paths.root().join("grow.img");
    let volume = format!("kvol-grow-{}", std::process::id());
    let spec = flex_pv(
        &volume,
        "kvol/loop",
        &[("backingFile", backing.to_str().unwrap()), ("size", "300Mi"), ("kubernetes.io/fsType", "xfs")],
    );
    let resolved = resolve(&snapshot, &gates, &spec, NodeStatus::Known(&own)).unwrap();
    let (plugin, spec) = (resolved.plugin, &resolved.spec);
    let attacher = plugin.attacher().unwrap();
    let device = attacher.attach(spec, "node-a").await.unwrap().unwrap();
    let _guard = LoopGuard(device.clone());
    let device = attacher.wait_for_attach(spec, Some(&device), Duration::from_secs(10)).await.unwrap();
    let stager = plugin.device_mounter().unwrap();
    let staging = stager.device_mount_path(spec).unwrap();
    stager.stage(spec, Some(&device), &staging).await.unwrap();
    let pod = pod();
    let target = node.host.paths.pod_volume_dir(&pod.uid, plugin.name(), &volume).unwrap();
    let request = PublishRequest {
        spec,
        pod: &pod,
        pod_volume_name: &volume,
        target: &target,
        staging_path: Some(&staging),
        device_path: Some(&device),
        read_only: false,
        mount_options: &[],
        projection: None,
    };
    plugin.mounter().unwrap().publish(&request).await.unwrap();
    std::fs::write(target.join("kept"), b"before the growth").unwrap();
    let before = fs_bytes(&target);

    let (old, new) = (300u64 << 20, 600u64 << 20);
    let controller = plugin.controller_expander().expect("the driver expands");
    assert!(controller.requires_node_expansion(), "requiresFSResize");
    assert_eq!(controller.expand(spec, new, old).await.unwrap(), new);
    assert_eq!(std::fs::metadata(&backing).unwrap().len(), new, "expandvolume grew the backing file");
    assert_eq!(fs_bytes(&target), before, "the filesystem waits for the node");
    let started = Instant::now();
    let expander = plugin.node_expander().expect("the node grows it");
    expander.expand_on_node(spec, Some(&device), &target, new, old).await.unwrap();
    let after = fs_bytes(&target);
    eprintln!(
        "flexvolume loop: expandfs not supported; generic resize {} → {} MiB in {:?}",
        before >> 20,
        after >> 20,
        started.elapsed()
    );
    assert!(after > before + (250 << 20), "{before} → {after}");
    assert_eq!(std::fs::read(target.join("kept")).unwrap(), b"before the growth");

    let unpublish =
        UnpublishRequest { pod_uid: &pod.uid, pod_volume_name: &volume, target: &target, spec: None };
    plugin.mounter().unwrap().unpublish(&unpublish).await.unwrap();
    stager.unstage(&staging).await.unwrap();
    attacher.detach(&plugin.volume_name(spec).unwrap(), "node-a").await.unwrap();
    node.prober.unwrap().shutdown().await;
}
