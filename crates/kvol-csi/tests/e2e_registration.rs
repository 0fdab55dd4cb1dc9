//! CSI end to end: the bundled driver registers through the real registration protocol, joins
//! the registry and the CSINode, and serves persistent, ephemeral and migrated in-tree volumes
//! through `resolve` and the CSI plugin onto real bind mounts in a private mount namespace.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::CSIDriver;
use kvol_api::FeatureGates;
use kvol_csi::proto::csi::controller_client::ControllerClient;
use kvol_csi::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use kvol_csi::proto::csi::{CreateVolumeRequest, VolumeCapability};
use kvol_csi::registration::{RegistrationWatcher, WatcherConfig};
use kvol_csi::{CsiRegistrationHandler, MemoryObjects, NodeObjects, Timeouts};
use kvol_hostpath::{HostpathConfig, HostpathDriver};
use kvol_plugin::migration::{NodeMigration, NodeStatus, Route, resolve};
use kvol_plugin::plugin::{PodInfo, PublishRequest, UnpublishRequest};
use kvol_plugin::{
    Mounter, NodeInfo, NodePaths, PluginHost, PluginRegistry, SystemMounter, VolumePlugin, VolumeSpec,
};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use serde_json::json;
use tokio::sync::oneshot;

fn enter_private_mount_namespace() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
}

async fn until(what: &str, ready: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    start.elapsed()
}

/// One node: the bundled driver (named `driver`) serving and registering, kvol's watcher and
/// handler feeding a registry and an in-memory CSINode.
struct Node {
    root: PathBuf,
    host: PluginHost,
    registry: Arc<PluginRegistry>,
    objects: MemoryObjects,
    handler: Arc<CsiRegistrationHandler>,
    watcher: Option<RegistrationWatcher>,
    stop_driver: Option<oneshot::Sender<()>>,
    driver_task: Option<tokio::task::JoinHandle<()>>,
    csi_socket: PathBuf,
    _dir: kvol_test_support::ScratchRoot,
}

impl Node {
    async fn start(driver: &str, csidriver: Option<serde_json::Value>) -> (Node, Duration) {
        let dir = kvol_test_support::ScratchRoot::new();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let registration_dir = root.join("plugins_registry");
        let host = PluginHost::new(
            NodePaths::new(root.join("kubelet")),
            NodeInfo::named("node-a"),
            Arc::new(SystemMounter),
        );
        let objects = MemoryObjects::new();
        if let Some(object) = csidriver {
            objects.put_csi_driver(serde_json::from_value::<CSIDriver>(object).unwrap());
        }
        let registry = Arc::new(PluginRegistry::new(Vec::new()).unwrap());
        let handler = Arc::new(CsiRegistrationHandler::new(
            Arc::clone(&registry),
            Arc::new(objects.clone()),
            host.clone(),
            &FeatureGates::default(),
            Timeouts::default(),
        ));
        let watcher =
            RegistrationWatcher::start(WatcherConfig::new(&registration_dir), handler.clone()).unwrap();

        let config = HostpathConfig {
            state_dir: root.join("state"),
            csi_socket: root.join("kubelet/plugins").join(driver).join("csi.sock"),
            registration_dir: Some(registration_dir),
            ..HostpathConfig::new(driver, "node-a")
        };
        let csi_socket = config.csi_socket.clone();
        let appeared = Instant::now();
        let bound = HostpathDriver::bind(config, Arc::new(SystemMounter)).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            bound
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        let name = driver.to_string();
        until("the driver to register", || registry.snapshot().find_by_name(&name).is_ok()).await;
        let usable = appeared.elapsed();
        let node = Node {
            root,
            host,
            registry,
            objects,
            handler,
            watcher: Some(watcher),
            stop_driver: Some(stop),
            driver_task: Some(task),
            csi_socket,
            _dir: dir,
        };
        (node, usable)
    }

    async fn create_volume(&self, name: &str) -> String {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("unix://{}", self.csi_socket.display()))
                .unwrap()
                .connect()
                .await
                .unwrap();
        let capability = VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
        };
        let request = CreateVolumeRequest {
            name: name.to_string(),
            volume_capabilities: vec![capability],
            ..CreateVolumeRequest::default()
        };
        let response = ControllerClient::new(channel).create_volume(request).await.unwrap().into_inner();
        response.volume.unwrap().volume_id
    }

    fn volume_dir(&self, id: &str) -> PathBuf {
        self.root.join("state/volumes").join(id)
    }

    async fn stop(mut self) {
        let _ = self.stop_driver.take().unwrap().send(());
        self.driver_task.take().unwrap().await.unwrap();
        self.watcher.take().unwrap().shutdown().await;
        let left: Vec<_> =
            SystemMounter.mounts_under(&self.root).unwrap().into_iter().map(|m| m.target).collect();
        assert!(left.is_empty(), "mounts left behind: {left:?}");
    }
}

fn pod() -> PodInfo {
    PodInfo {
        name: "web".into(),
        namespace: "shop".into(),
        uid: "uid-1".into(),
        service_account: "default".into(),
        fs_group: None,
        fs_group_change_policy: kvol_plugin::plugin::FsGroupChangePolicy::Always,
        memory_limit: None,
    }
}

/// Stages (when the plugin stages) and publishes `spec` for the pod, writes a file through the
/// pod's path, then tears it all down; returns the target path the driver got.
async fn publish_write_and_tear_down(
    node: &Node,
    plugin: &dyn VolumePlugin,
    spec: &VolumeSpec,
    name: &str,
) -> PathBuf {
    let pod = pod();
    let staging = match plugin.device_mounter().filter(|_| plugin.can_device_mount(spec)) {
        Some(stager) => {
            let path = stager.device_mount_path(spec).unwrap();
            stager.stage(spec, None, &path).await.unwrap();
            Some(path)
        }
        None => None,
    };
    let target = node.host.paths.pod_volume_dir(&pod.uid, "kubernetes.io/csi", name).unwrap();
    let request = PublishRequest {
        spec,
        pod: &pod,
        pod_volume_name: name,
        target: &target,
        staging_path: staging.as_deref(),
        device_path: None,
        read_only: false,
        mount_options: &[],
        projection: None,
    };
    plugin.mounter().unwrap().publish(&request).await.unwrap();
    let mount = target.join("mount");
    assert!(SystemMounter.is_mount_point(&mount).unwrap(), "{} is mounted", mount.display());
    std::fs::write(mount.join("hello"), name).unwrap();
    let unpublish =
        UnpublishRequest { pod_uid: &pod.uid, pod_volume_name: name, target: &target, spec: None };
    plugin.mounter().unwrap().unpublish(&unpublish).await.unwrap();
    assert!(!mount.exists(), "unpublish removes the target");
    if let (Some(path), Some(stager)) = (&staging, plugin.device_mounter()) {
        stager.unstage(path).await.unwrap();
        assert!(!SystemMounter.is_mount_point(path).unwrap());
    }
    mount
}

fn csi_pv(name: &str, driver: &str, handle: &str) -> VolumeSpec {
    VolumeSpec::persistent(
        serde_json::from_value::<PersistentVolume>(json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "csi": {"driver": driver, "volumeHandle": handle}}
        }))
        .unwrap(),
    )
}

#[tokio::test]
async fn the_bundled_driver_registers_and_serves_persistent_and_ephemeral_volumes() {
    enter_private_mount_namespace();
    let csidriver = json!({
        "metadata": {"name": "hostpath.csi.kvol.io"},
        "spec": {"attachRequired": false, "podInfoOnMount": true, "volumeLifecycleModes": ["Persistent", "Ephemeral"]}
    });
    let (node, usable) = Node::start("hostpath.csi.kvol.io", Some(csidriver)).await;
    eprintln!("registration socket bound → driver usable: {usable:?}");

    // Registration filled the CSINode and the node-ID annotation.
    let csinode = node.objects.csi_node("node-a").expect("the CSINode exists");
    let entry = csinode.spec.drivers.iter().find(|d| d.name == "hostpath.csi.kvol.io").expect("driver entry");
    assert_eq!(entry.node_id, "node-a");
    assert_eq!(entry.topology_keys.as_deref(), Some(&["topology.hostpath.csi.kvol.io/node".to_string()][..]));
    let annotations = csinode.metadata.annotations.clone().unwrap_or_default();
    assert!(annotations["storage.alpha.kubernetes.io/migrated-plugins"].contains("kubernetes.io/aws-ebs"));
    assert_eq!(node.handler.node_id_annotation().as_deref(), Some(r#"{"hostpath.csi.kvol.io":"node-a"}"#));
    let labels = node.handler.topology_labels();
    assert_eq!(
        labels.get("topology.hostpath.csi.kvol.io/node").map(String::as_str),
        Some("node-a"),
        "{labels:?}"
    );
    let listed = node.registry.snapshot().find_by_name("hostpath.csi.kvol.io").unwrap().details();
    let details: BTreeMap<_, _> = listed.into_iter().collect();
    assert_eq!(details["version"], "1.0.0");
    assert!(details["csiDriver"].starts_with("attachRequired=false podInfoOnMount=true"), "{details:?}");

    // A persistent volume: attach skipped (attachRequired false), staged and published for real.
    let id = node.create_volume("pv-data").await;
    let spec = csi_pv("pv-data", "hostpath.csi.kvol.io", &id);
    let gates = FeatureGates::default();
    let own = NodeMigration::of_own_node("node-a", &gates, ["hostpath.csi.kvol.io"]);
    let snapshot = node.registry.snapshot();
    let resolved = resolve(&snapshot, &gates, &spec, NodeStatus::Known(&own)).unwrap();
    assert_eq!(resolved.route, Route::Native);
    assert!(snapshot.find_attachable_by_spec(&spec).unwrap().is_none(), "attachRequired: false skips attach");
    publish_write_and_tear_down(&node, resolved.plugin.as_ref(), &resolved.spec, "data").await;
    assert_eq!(std::fs::read_to_string(node.volume_dir(&id).join("hello")).unwrap(), "data");

    // An ephemeral inline volume: published without stage, gone after unpublish.
    let inline: Volume =
        serde_json::from_value(json!({"name": "scratch", "csi": {"driver": "hostpath.csi.kvol.io"}}))
            .unwrap();
    let spec = VolumeSpec::inline(inline, "shop");
    let plugin = snapshot.find_by_spec(&spec).unwrap();
    assert!(!plugin.can_device_mount(&spec), "ephemeral volumes are not staged");
    publish_write_and_tear_down(&node, plugin.as_ref(), &spec, "scratch").await;
    let ephemeral_left = std::fs::read_dir(node.root.join("state/ephemeral")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(ephemeral_left, 0, "the ephemeral volume's directory is deleted with its last publication");

    node.stop().await;
}

#[tokio::test]
async fn a_stopped_driver_is_deregistered_from_registry_and_csinode() {
    enter_private_mount_namespace();
    let (mut node, _) = Node::start("hostpath.csi.kvol.io", None).await;
    let _ = node.stop_driver.take().unwrap().send(());
    node.driver_task.take().unwrap().await.unwrap();
    let registry = Arc::clone(&node.registry);
    until("deregistration", || registry.snapshot().find_by_name("hostpath.csi.kvol.io").is_err()).await;
    let csinode = node.objects.csi_node("node-a").unwrap();
    assert!(csinode.spec.drivers.is_empty(), "the CSINode is kept, without the driver");
    assert_eq!(node.handler.node_id_annotation(), None);
    assert!(node.handler.topology_labels().is_empty(), "the driver's topology labels go with it");
    node.watcher.take().unwrap().shutdown().await;
}

/// A migrated in-tree PV through the bundled driver, by a test mapping: the bundled driver runs
/// under the AWS EBS driver's name, and the in-tree PV names one of its volumes.
#[tokio::test]
async fn a_migrated_in_tree_pv_is_published_through_the_bundled_driver() {
    enter_private_mount_namespace();
    let (node, _) = Node::start("ebs.csi.aws.com", None).await;
    let id = node.create_volume("ebs-data").await;
    let in_tree: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "ebs-data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "awsElasticBlockStore": {"volumeID": id.clone()}}
    }))
    .unwrap();
    let spec = VolumeSpec::persistent(in_tree);
    let gates = FeatureGates::default();
    let snapshot = node.registry.snapshot();

    // The node has not migrated AWS EBS: no CSI route (kvol has no in-tree code: an error).
    let unmigrated = NodeMigration { node: "node-a".into(), ..NodeMigration::default() };
    assert!(resolve(&snapshot, &gates, &spec, NodeStatus::Known(&unmigrated)).is_err());

    // Its CSINode (written by registration) says migrated, with the driver installed.
    let csinode = node.objects.csi_node("node-a").unwrap();
    let migrated = NodeMigration::from_csinode(&csinode);
    let resolved = resolve(&snapshot, &gates, &spec, NodeStatus::Known(&migrated)).unwrap();
    assert_eq!(resolved.route, Route::Csi(kvol_api::MigratablePlugin::AwsEbs));
    assert_eq!(resolved.plugin.name(), "ebs.csi.aws.com");
    assert_eq!(resolved.spec.migrated.as_ref().unwrap().from, kvol_api::MigratablePlugin::AwsEbs);
    publish_write_and_tear_down(&node, resolved.plugin.as_ref(), &resolved.spec, "ebs").await;
    assert_eq!(std::fs::read_to_string(node.volume_dir(&id).join("hello")).unwrap(), "ebs");
    node.stop().await;
}

/// A directory outside the kubelet root (mode 0700, one file) holding `below` as an empty
/// directory: what stage or publish would create, and teardown remove, if it followed a link.
fn victim(below: &str) -> (kvol_test_support::ScratchRoot, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let outside = kvol_test_support::ScratchRoot::new();
    let victim = std::fs::canonicalize(outside.path()).unwrap().join("victim");
    std::fs::create_dir_all(victim.join(below)).unwrap();
    std::fs::write(victim.join("keep"), b"precious").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o700)).unwrap();
    (outside, victim)
}

fn assert_untouched(victim: &std::path::Path, below: &str) {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(victim).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "{} changed mode", victim.display());
    assert_eq!(std::fs::read(victim.join("keep")).unwrap(), b"precious");
    assert!(victim.join(below).is_dir(), "{} was removed", victim.join(below).display());
    let entries = |d: &std::path::Path| std::fs::read_dir(d).unwrap().count();
    assert_eq!(entries(victim), 2, "nothing was added to {}", victim.display());
    assert_eq!(entries(&victim.join(below)), 0, "nothing was created in {}", victim.join(below).display());
    assert!(SystemMounter.mounts_under(victim).unwrap().is_empty(), "nothing is mounted in the victim");
}

fn plant_link(node: &Node, link: &str, victim: &std::path::Path) {
    let link = node.root.join(link);
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(victim, &link).unwrap();
}

#[tokio::test]
async fn csi_paths_under_a_planted_symlink_are_refused_and_teardown_removes_nothing_outside() {
    enter_private_mount_namespace();
    let csidriver = json!({
        "metadata": {"name": "hostpath.csi.kvol.io"},
        "spec": {"attachRequired": false, "volumeLifecycleModes": ["Persistent"]}
    });
    let (node, _) = Node::start("hostpath.csi.kvol.io", Some(csidriver)).await;
    let id = node.create_volume("pv-data").await;
    let spec = csi_pv("pv-data", "hostpath.csi.kvol.io", &id);
    let snapshot = node.registry.snapshot();
    let plugin = snapshot.find_by_spec(&spec).unwrap();
    let stager = plugin.device_mounter().unwrap();
    let mounter = plugin.mounter().unwrap();
    let staging = stager.device_mount_path(&spec).unwrap();
    let refused = |e: kvol_plugin::PluginError| {
        let message = e.to_string();
        assert!(message.contains("kvol never follows one"), "{message}");
    };

    // The CSI plugin directory is a link: staging refuses, unstaging removes nothing.
    let below_plugin = staging.strip_prefix(node.root.join("kubelet/plugins/kubernetes.io/csi")).unwrap();
    let below_plugin = below_plugin.to_str().unwrap().to_string();
    let (_outside, plugin_victim) = victim(&below_plugin);
    plant_link(&node, "kubelet/plugins/kubernetes.io/csi", &plugin_victim);
    refused(stager.stage(&spec, None, &staging).await.unwrap_err());
    refused(stager.unstage(&staging).await.unwrap_err());
    assert_untouched(&plugin_victim, &below_plugin);
    std::fs::remove_file(node.root.join("kubelet/plugins/kubernetes.io/csi")).unwrap();

    // The pod's volumes directory is a link: publishing refuses, unpublishing removes nothing.
    stager.stage(&spec, None, &staging).await.unwrap();
    let pod = pod();
    let target = node.host.paths.pod_volume_dir(&pod.uid, "kubernetes.io/csi", "data").unwrap();
    let (_outside, pod_victim) = victim("kubernetes.io~csi/data/mount");
    // A record that, if read through the link, would send the victim to NodeUnpublishVolume.
    let record = format!(r#"{{"driverName":"hostpath.csi.kvol.io","volumeHandle":"{id}"}}"#);
    let outside_record = pod_victim.join("kubernetes.io~csi/data/vol_data.json");
    std::fs::write(&outside_record, &record).unwrap();
    plant_link(&node, "kubelet/pods/uid-1/volumes", &pod_victim);
    let request = PublishRequest {
        spec: &spec,
        pod: &pod,
        pod_volume_name: "data",
        target: &target,
        staging_path: Some(&staging),
        device_path: None,
        read_only: false,
        mount_options: &[],
        projection: None,
    };
    refused(mounter.publish(&request).await.unwrap_err());
    let unpublish =
        UnpublishRequest { pod_uid: &pod.uid, pod_volume_name: "data", target: &target, spec: None };
    refused(mounter.unpublish(&unpublish).await.unwrap_err());
    assert_untouched(&pod_victim, "kubernetes.io~csi/data/mount");
    assert_eq!(std::fs::read_to_string(&outside_record).unwrap(), record);
    std::fs::remove_file(node.root.join("kubelet/pods/uid-1/volumes")).unwrap();
    stager.unstage(&staging).await.unwrap();

    // Without the links the same volume stages, publishes and tears down.
    publish_write_and_tear_down(&node, plugin.as_ref(), &spec, "data").await;
    node.stop().await;
}
