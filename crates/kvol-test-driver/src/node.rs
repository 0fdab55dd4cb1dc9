//! One node's worth of kubelet around the driver under test: volumes provisioned as kvol's standalone provisioner provisions them, staged and published by kvol's CSI volume plugin (the code the agent's executor runs) in kubelet's layout under a scratch root, and "pods" as sets of published volumes; everything made is taken down again after each case.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{CSIVolumeSource, PersistentVolumeClaim, Volume as PodVolume};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kvol_claims::provision::ProvisionRequest;
use kvol_csi::proto::csi;
use kvol_csi::{CsiClient, CsiPlugin, MemoryObjects};
use kvol_plugin::plugin::{
    FsGroupChangePolicy, PodInfo, PublishRequest, StatsRequest, UnpublishRequest, VolumeStats,
};
use kvol_plugin::{Mounter, NodeInfo, NodePaths, PluginHost, SystemMounter, VolumePlugin, VolumeSpec};
use serde_json::json;

use crate::report::{CallNote, Failure};

/// The namespace the test's claims and pods live in.
pub const NAMESPACE: &str = "kvol-test-driver";
/// The node name kvol gives the plugin host.
pub const NODE_NAME: &str = "kvol-test-node";

/// A provisioned volume.
#[derive(Clone, Debug)]
pub struct Volume {
    pub spec: VolumeSpec,
    pub handle: String,
    /// The PersistentVolume's name.
    pub name: String,
    /// What CreateVolume said it holds (0: not said).
    pub capacity: i64,
}

/// One volume published into a pod.
#[derive(Clone, Debug)]
pub struct Published {
    pub spec: VolumeSpec,
    /// The pod's volume directory (`…/volumes/kubernetes.io~csi/<name>`).
    pub target: PathBuf,
    /// Where the pod sees the volume: `<target>/mount`.
    pub path: PathBuf,
    pub staging: Option<PathBuf>,
    pub read_only: bool,
    /// The NodePublishVolume request, summed up for a report.
    pub request: String,
}

/// A pod: its identity and its published volumes, in the order asked.
#[derive(Clone, Debug)]
pub struct Pod {
    pub info: PodInfo,
    pub volumes: Vec<Published>,
}

impl Pod {
    /// The directory kubelet keeps the pod's things in (`<root>/pods/<uid>`).
    pub fn dir(&self, root: &Path) -> PathBuf {
        root.join("pods").join(&self.info.uid)
    }
}

/// A volume to publish into a pod.
#[derive(Clone, Copy, Debug)]
pub enum Want<'a> {
    Persistent {
        volume: &'a Volume,
        read_only: bool,
    },
    /// A CSI inline (ephemeral) volume.
    Inline {
        name: &'a str,
        attributes: &'a BTreeMap<String, String>,
        read_only: bool,
    },
}

/// What kubelet would do with a failed call of each kind.
fn kubelet_reaction(rpc: &str) -> &'static str {
    match rpc {
        "CreateVolume" | "DeleteVolume" | "CreateSnapshot" | "ControllerExpandVolume" => {
            "the control plane's sidecar retries with exponential back-off; the claim stays pending"
        }
        "NodeStageVolume" | "NodePublishVolume" | "ControllerPublishVolume" => {
            "kubelet retries the mount (500 ms doubling to 2m2s), the pod stays ContainerCreating with a FailedMount event"
        }
        "NodeUnpublishVolume" | "NodeUnstageVolume" => {
            "kubelet retries the teardown and keeps the volume in the node's volumesInUse"
        }
        "NodeExpandVolume" => "kubelet retries the resize and records VolumeResizeFailed on the pod",
        _ => "",
    }
}

/// A failure of the driver call `rpc`, its request summed up by `request`.
pub fn call_failure(rpc: &str, request: String, error: &dyn std::fmt::Display) -> Failure {
    Failure::new(format!("{rpc} failed: {error}")).with_call(CallNote {
        rpc: rpc.to_string(),
        request,
        answer: error.to_string(),
        kubelet: kubelet_reaction(rpc).to_string(),
    })
}

/// What the node has made during the current case, to take down after it.
#[derive(Debug, Default)]
struct Made {
    volumes: Vec<Volume>,
    snapshots: Vec<String>,
    pods: BTreeMap<String, Pod>,
    /// Volume handle → (staging path, the spec, pods using it).
    staged: BTreeMap<String, (PathBuf, VolumeSpec, usize)>,
}

/// The node around the driver.
pub struct Node {
    pub root: PathBuf,
    pub driver: String,
    pub client: CsiClient,
    pub plugin: CsiPlugin,
    pub class: StorageClass,
    pub snapshot_parameters: BTreeMap<String, String>,
    counter: AtomicU64,
    made: std::sync::Mutex<Made>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("root", &self.root).field("driver", &self.driver).finish_non_exhaustive()
    }
}

impl Node {
    /// The node for `driver` reached through `client`, kubelet's directories under `root`.
    /// The CSIDriver object is the one kubelet would need: attach required exactly when the
    /// controller publishes, pod info on mount, persistent and (with `inline`) ephemeral.
    pub async fn new(
        root: &Path,
        driver: &str,
        client: CsiClient,
        class: StorageClass,
        snapshot_parameters: BTreeMap<String, String>,
        inline: bool,
    ) -> Result<Node, Failure> {
        std::fs::create_dir_all(root)
            .map_err(|e| Failure::new(format!("cannot make {}: {e}", root.display())))?;
        let info =
            client.node_get_info().await.map_err(|e| call_failure("NodeGetInfo", String::new(), &e))?;
        let controller = client
            .controller_get_capabilities()
            .await
            .map_err(|e| call_failure("ControllerGetCapabilities", String::new(), &e))?;
        let objects = MemoryObjects::new();
        let mut modes = vec!["Persistent"];
        if inline {
            modes.push("Ephemeral");
        }
        let csidriver: CSIDriver = serde_json::from_value(json!({
            "metadata": {"name": driver},
            "spec": {
                "attachRequired": controller.publish_unpublish,
                "podInfoOnMount": true,
                "volumeLifecycleModes": modes,
                "fsGroupPolicy": "File",
            }
        }))
        .map_err(|e| Failure::new(format!("cannot build the csidriver of {driver}: {e}")))?;
        objects.put_csi_driver(csidriver);
        let host = PluginHost::new(NodePaths::new(root), NodeInfo::named(NODE_NAME), Arc::new(SystemMounter));
        let plugin = CsiPlugin::connect(driver, client.clone(), host, Arc::new(objects), info.node_id)
            .await
            .map_err(|e| call_failure("NodeGetCapabilities", String::new(), &e))?;
        Ok(Node {
            root: root.to_path_buf(),
            driver: driver.to_string(),
            client,
            plugin,
            class,
            snapshot_parameters,
            counter: AtomicU64::new(0),
            made: std::sync::Mutex::new(Made::default()),
        })
    }

    fn made(&self) -> std::sync::MutexGuard<'_, Made> {
        self.made.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A name no other object of this run has: `<prefix>-<n>`.
    pub fn unique(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.counter.fetch_add(1, Ordering::SeqCst))
    }

    /// A claim of `size` bytes in the test's class, as a user would write it.
    fn claim(&self, name: &str, size: u64, mode: &str) -> Result<PersistentVolumeClaim, Failure> {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("{}-{name}", self.run_id())},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": size.to_string()}},
                "storageClassName": self.class.metadata.name,
                "volumeMode": mode,
            }
        }))
        .map_err(|e| Failure::new(format!("cannot build claim {name}: {e}")))
    }

    /// What makes this run's names its own (the root's last component).
    fn run_id(&self) -> String {
        self.root
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "run".to_string())
    }

    /// Provisions a volume of `size` bytes through the class, as kvol's standalone
    /// provisioner does (kvol-claims' CreateVolume request and bound PersistentVolume);
    /// `source` is CSI's content source (a snapshot or a volume to clone).
    pub async fn provision(
        &self,
        size: u64,
        source: Option<csi::volume_content_source::Type>,
    ) -> Result<Volume, Failure> {
        self.provision_in(&self.class, size, source).await
    }

    /// [`Node::provision`] of a raw block volume (a claim with `volumeMode: Block`).
    pub async fn provision_block(&self, size: u64) -> Result<Volume, Failure> {
        self.provision_as(&self.class, size, None, "Block").await
    }

    /// [`Node::provision`] through another class.
    pub async fn provision_in(
        &self,
        class: &StorageClass,
        size: u64,
        source: Option<csi::volume_content_source::Type>,
    ) -> Result<Volume, Failure> {
        self.provision_as(class, size, source, "Filesystem").await
    }

    async fn provision_as(
        &self,
        class: &StorageClass,
        size: u64,
        source: Option<csi::volume_content_source::Type>,
        mode: &str,
    ) -> Result<Volume, Failure> {
        let name = self.unique("claim");
        let claim = self.claim(&name, size, mode)?;
        let request = ProvisionRequest {
            claim_key: format!("{NAMESPACE}/{name}"),
            claim,
            class: class.clone(),
            driver: self.driver.clone(),
            source_snapshot: None,
        };
        let mut create = kvol_claims::wire::create_request(&request).map_err(|e| {
            Failure::new(format!("cannot make the CreateVolume request of claim {name}: {e}"))
        })?;
        let described = describe_source(source.as_ref());
        create.volume_content_source = source.map(|t| csi::VolumeContentSource { r#type: Some(t) });
        let summary = format!(
            "name={} required_bytes={size} parameters={:?}{described}",
            create.name,
            create.parameters.keys()
        );
        let created =
            self.client.create_volume(create).await.map_err(|e| call_failure("CreateVolume", summary, &e))?;
        let pv = kvol_claims::wire::bound_pv(&request, &created)
            .map_err(|e| Failure::new(format!("cannot make the persistent volume of claim {name}: {e}")))?;
        let volume = Volume {
            name: pv.metadata.name.clone().unwrap_or_default(),
            spec: VolumeSpec::persistent(pv),
            handle: created.volume_id.clone(),
            capacity: created.capacity_bytes,
        };
        self.made().volumes.push(volume.clone());
        Ok(volume)
    }

    /// Takes a snapshot of `volume`, waiting until the driver says it is ready to use; its id.
    pub async fn snapshot(&self, volume: &Volume) -> Result<String, Failure> {
        Ok(self.take_snapshot(volume).await?.snapshot_id)
    }

    /// DeleteSnapshot.
    pub async fn delete_snapshot(&self, id: &str) -> Result<(), Failure> {
        self.client
            .delete_snapshot(id)
            .await
            .map_err(|e| call_failure("DeleteSnapshot", format!("snapshot_id={id}"), &e))?;
        self.made().snapshots.retain(|s| s != id);
        Ok(())
    }

    /// [`Node::snapshot`], the driver's whole answer.
    pub async fn take_snapshot(&self, volume: &Volume) -> Result<csi::Snapshot, Failure> {
        let name = format!("snapshot-{}-{}", self.run_id(), self.unique("s"));
        let request = csi::CreateSnapshotRequest {
            source_volume_id: volume.handle.clone(),
            name: name.clone(),
            parameters: self.snapshot_parameters.clone().into_iter().collect(),
            ..Default::default()
        };
        let summary = format!("name={name} source_volume_id={}", volume.handle);
        for _ in 0..300 {
            let snapshot = self
                .client
                .create_snapshot(request.clone())
                .await
                .map_err(|e| call_failure("CreateSnapshot", summary.clone(), &e))?;
            if !self.made().snapshots.contains(&snapshot.snapshot_id) {
                self.made().snapshots.push(snapshot.snapshot_id.clone());
            }
            if snapshot.ready_to_use {
                return Ok(snapshot);
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Err(Failure::new(format!(
            "snapshot {name} of volume {} was not ready to use after 30s",
            volume.handle
        )))
    }

    /// Stages a persistent volume unless a running pod already has it staged (attaching it
    /// first when the driver's controller publishes).
    async fn stage(&self, volume: &Volume) -> Result<Option<PathBuf>, Failure> {
        let Some(stager) = self.plugin.device_mounter() else { return Ok(None) };
        if let Some(entry) = self.made().staged.get_mut(&volume.handle) {
            entry.2 += 1;
            return Ok(Some(entry.0.clone()));
        }
        let mut device = None;
        if let Some(attacher) = self.plugin.attacher() {
            device = attacher.attach(&volume.spec, NODE_NAME).await.map_err(|e| {
                call_failure("ControllerPublishVolume", format!("volume_id={}", volume.handle), &e)
            })?;
        }
        let staging = stager.device_mount_path(&volume.spec).map_err(|e| Failure::new(e.to_string()))?;
        stager.stage(&volume.spec, device.as_deref(), &staging).await.map_err(|e| {
            call_failure(
                "NodeStageVolume",
                format!("volume_id={} staging_target_path={}", volume.handle, staging.display()),
                &e,
            )
        })?;
        self.made().staged.insert(volume.handle.clone(), (staging.clone(), volume.spec.clone(), 1));
        Ok(Some(staging))
    }

    /// Unstages `handle` once no pod uses it (detaching it when it was attached).
    async fn release(&self, handle: &str) -> Result<(), Failure> {
        let last = {
            let mut made = self.made();
            match made.staged.get_mut(handle) {
                Some(entry) if entry.2 > 1 => {
                    entry.2 -= 1;
                    None
                }
                Some(_) => made.staged.remove(handle),
                None => None,
            }
        };
        let Some((staging, spec, _)) = last else { return Ok(()) };
        self.unstage(handle, &staging, &spec).await
    }

    async fn unstage(&self, handle: &str, staging: &Path, spec: &VolumeSpec) -> Result<(), Failure> {
        if let Some(stager) = self.plugin.device_mounter() {
            stager.unstage(staging).await.map_err(|e| {
                call_failure(
                    "NodeUnstageVolume",
                    format!("volume_id={handle} staging_target_path={}", staging.display()),
                    &e,
                )
            })?;
        }
        if let Some(attacher) = self.plugin.attacher()
            && self.plugin.driver_capabilities().controller.publish_unpublish
        {
            attacher
                .detach(spec.name(), NODE_NAME)
                .await
                .map_err(|e| call_failure("ControllerUnpublishVolume", format!("volume_id={handle}"), &e))?;
        }
        Ok(())
    }

    /// A pod named `name` with a fresh uid and no fsGroup.
    pub fn pod_info(&self, name: &str) -> PodInfo {
        let name = self.unique(name);
        PodInfo {
            uid: format!("{}-{name}", self.run_id()),
            name,
            namespace: NAMESPACE.to_string(),
            service_account: "default".to_string(),
            fs_group: None,
            fs_group_change_policy: FsGroupChangePolicy::Always,
            memory_limit: None,
        }
    }

    /// Starts a pod: every wanted volume staged (once per node) and published into it, in
    /// order, as kubelet sets a pod's volumes up before its containers start.
    pub async fn start_pod(&self, name: &str, wanted: &[Want<'_>]) -> Result<Pod, Failure> {
        self.start(self.pod_info(name), wanted).await
    }

    /// [`Node::start_pod`] of a pod whose security context has `fsGroup: group` and the
    /// change policy `policy`.
    pub async fn start_pod_with_fs_group(
        &self,
        name: &str,
        wanted: &[Want<'_>],
        group: i64,
        policy: FsGroupChangePolicy,
    ) -> Result<Pod, Failure> {
        let info = PodInfo { fs_group: Some(group), fs_group_change_policy: policy, ..self.pod_info(name) };
        self.start(info, wanted).await
    }

    async fn start(&self, info: PodInfo, wanted: &[Want<'_>]) -> Result<Pod, Failure> {
        let mut pod = Pod { info, volumes: Vec::new() };
        self.made().pods.insert(pod.info.uid.clone(), pod.clone());
        for want in wanted {
            let published = self.publish(&pod.info, want).await?;
            // Booked before it is checked, so that a bad publish is still taken down.
            pod.volumes.push(published.clone());
            self.made().pods.insert(pod.info.uid.clone(), pod.clone());
            expect_mounted(&published)?;
        }
        Ok(pod)
    }

    async fn publish(&self, pod: &PodInfo, want: &Want<'_>) -> Result<Published, Failure> {
        let (spec, staging, read_only, handle) = match *want {
            Want::Persistent { volume, read_only } => {
                let staging = self.stage(volume).await?;
                (volume.spec.clone().with_read_only(read_only), staging, read_only, volume.handle.clone())
            }
            Want::Inline { name, attributes, read_only } => {
                let volume = PodVolume {
                    name: name.to_string(),
                    csi: Some(CSIVolumeSource {
                        driver: self.driver.clone(),
                        volume_attributes: Some(attributes.clone()),
                        read_only: Some(read_only),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                (
                    VolumeSpec::inline(volume, NAMESPACE).with_read_only(read_only),
                    None,
                    read_only,
                    format!("inline {name}"),
                )
            }
        };
        // A block volume's target is the pod's device link, else the pod's volume directory.
        let target =
            kvol_plugin::block::publish_target(&self.plugin.host().paths, &self.plugin, &spec, &pod.uid)
                .map_err(|e| Failure::new(e.to_string()))?;
        let mounter = self.plugin.mounter().ok_or_else(|| Failure::new("the csi plugin cannot publish"))?;
        let request = PublishRequest {
            spec: &spec,
            pod,
            pod_volume_name: spec.name(),
            target: &target,
            staging_path: staging.as_deref(),
            device_path: None,
            read_only,
            mount_options: &[],
            projection: None,
        };
        let path = if spec.is_block() { target.clone() } else { target.join("mount") };
        let summary = format!("volume_id={handle} target_path={} readonly={read_only}", path.display());
        mounter
            .publish(&request)
            .await
            .map_err(|e| call_failure("NodePublishVolume", summary.clone(), &e))?;
        Ok(Published { spec, target, path, staging, read_only, request: summary })
    }

    /// Stops a pod: each volume unpublished, and unstaged when no other pod uses it.
    pub async fn stop_pod(&self, pod: &Pod) -> Result<(), Failure> {
        // SubPath binds go first, as kubelet cleans them before the volume's teardown.
        let pod_dir = pod.dir(&self.root);
        kvol_plugin::subpath::clean_up(&pod_dir, None)
            .map_err(|e| Failure::new(format!("cannot clean the pod's subPaths: {e}")))?;
        let mounter = self.plugin.mounter().ok_or_else(|| Failure::new("the csi plugin cannot unpublish"))?;
        for published in &pod.volumes {
            let request = UnpublishRequest {
                pod_uid: &pod.info.uid,
                pod_volume_name: published.spec.name(),
                target: &published.target,
                spec: Some(&published.spec),
            };
            mounter.unpublish(&request).await.map_err(|e| {
                call_failure("NodeUnpublishVolume", format!("target_path={}", published.path.display()), &e)
            })?;
            if let Some(pv) = published.spec.pv() {
                let handle = pv.spec.as_ref().and_then(|s| s.csi.as_ref()).map(|c| c.volume_handle.clone());
                if let Some(handle) = handle {
                    self.release(&handle).await?;
                }
            }
        }
        self.made().pods.remove(&pod.info.uid);
        remove_pod_dir(&pod_dir)
    }

    /// NodeGetVolumeStats of a published volume, through the plugin (as kubelet's volume
    /// stats are gathered).
    pub async fn stats(&self, pod: &Pod, published: &Published) -> Result<VolumeStats, Failure> {
        let reader =
            self.plugin.stats_reader().ok_or_else(|| Failure::new("the csi plugin cannot read stats"))?;
        let request = StatsRequest {
            spec: &published.spec,
            pod_uid: &pod.info.uid,
            target: &published.target,
            staging_path: published.staging.as_deref(),
        };
        reader.volume_stats(&request).await.map_err(|e| {
            call_failure("NodeGetVolumeStats", format!("volume_path={}", published.path.display()), &e)
        })
    }

    /// ControllerExpandVolume to `size` bytes; the capacity the driver reports and whether it
    /// wants NodeExpandVolume.
    pub async fn controller_expand(&self, volume: &Volume, size: u64) -> Result<(i64, bool), Failure> {
        let request = csi::ControllerExpandVolumeRequest {
            volume_id: volume.handle.clone(),
            capacity_range: Some(csi::CapacityRange { required_bytes: size as i64, limit_bytes: 0 }),
            ..Default::default()
        };
        let summary = format!("volume_id={} required_bytes={size}", volume.handle);
        self.client
            .controller_expand(request)
            .await
            .map_err(|e| call_failure("ControllerExpandVolume", summary, &e))
    }

    /// NodeExpandVolume of a published volume to `size` bytes, through the plugin.
    pub async fn node_expand(&self, published: &Published, size: u64, old: u64) -> Result<(), Failure> {
        let expander = self
            .plugin
            .node_expander()
            .ok_or_else(|| Failure::new("the csi plugin cannot expand on the node"))?;
        expander.expand_on_node(&published.spec, None, &published.target, size, old).await.map_err(|e| {
            call_failure(
                "NodeExpandVolume",
                format!("volume_path={} required_bytes={size}", published.path.display()),
                &e,
            )
        })
    }

    /// Takes down what the case made: pods stopped, volumes unstaged, snapshots and volumes
    /// deleted. Every step is tried; the first failure is returned.
    pub async fn clean_up(&self) -> Result<(), Failure> {
        let mut first = None;
        let pods: Vec<Pod> = self.made().pods.values().cloned().collect();
        for pod in pods {
            if let Err(e) = self.stop_pod(&pod).await {
                first.get_or_insert(e);
                self.made().pods.remove(&pod.info.uid);
            }
        }
        let staged = std::mem::take(&mut self.made().staged);
        for (handle, (staging, spec, _)) in staged {
            if let Err(e) = self.unstage(&handle, &staging, &spec).await {
                first.get_or_insert(e);
            }
        }
        let snapshots = std::mem::take(&mut self.made().snapshots);
        for id in snapshots {
            if let Err(e) = self.client.delete_snapshot(&id).await {
                first.get_or_insert(call_failure("DeleteSnapshot", format!("snapshot_id={id}"), &e));
            }
        }
        let volumes = std::mem::take(&mut self.made().volumes);
        for volume in volumes.iter().rev() {
            if let Err(e) = self.delete(volume).await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// DeleteVolume.
    pub async fn delete(&self, volume: &Volume) -> Result<(), Failure> {
        self.client
            .delete_volume(&volume.handle, BTreeMap::new())
            .await
            .map_err(|e| call_failure("DeleteVolume", format!("volume_id={}", volume.handle), &e))?;
        self.made().volumes.retain(|v| v.handle != volume.handle);
        Ok(())
    }
}

/// Checks that NodePublishVolume left a mount at the target path, as every filesystem volume
/// a container is given must be.
fn expect_mounted(published: &Published) -> Result<(), Failure> {
    if published.spec.is_block() {
        use std::os::unix::fs::FileTypeExt;
        return match std::fs::metadata(&published.path) {
            Ok(m) if m.file_type().is_block_device() => Ok(()),
            Ok(_) => Err(Failure::new(format!(
                "NodePublishVolume answered OK but the pod's device {} is not a block device: the driver did not publish the device at its target_path",
                published.path.display()
            ))),
            Err(e) => Err(Failure::new(format!(
                "the pod's device {} cannot be opened: {e}",
                published.path.display()
            ))),
        };
    }
    if SystemMounter.is_mount_point(&published.path).unwrap_or(false) {
        return Ok(());
    }
    Err(Failure::new(format!(
        "NodePublishVolume answered OK but nothing is mounted at its target_path {}: the driver mounted the volume somewhere else, or not at all",
        published.path.display()
    ))
    .with_call(CallNote {
        rpc: "NodePublishVolume".to_string(),
        request: published.request.clone(),
        answer: "OK".to_string(),
        kubelet: "kubelet would start the containers on an empty directory of the node's root filesystem".to_string(),
    }))
}

/// Removes a stopped pod's directory, never through a mount: with one left below it, the
/// directory stays and that is the failure.
fn remove_pod_dir(pod_dir: &Path) -> Result<(), Failure> {
    match SystemMounter.mounts_under(pod_dir) {
        Ok(mounts) if mounts.is_empty() => {
            let _ = std::fs::remove_dir_all(pod_dir);
            Ok(())
        }
        Ok(mounts) => Err(Failure::new(format!(
            "after every volume of the pod was unpublished, {} is still mounted: the driver's NodeUnpublishVolume left it",
            mounts[0].target.display()
        ))),
        Err(e) => Err(Failure::new(format!("cannot read the mount table under {}: {e}", pod_dir.display()))),
    }
}

fn describe_source(source: Option<&csi::volume_content_source::Type>) -> String {
    match source {
        Some(csi::volume_content_source::Type::Snapshot(s)) => format!(" source=snapshot:{}", s.snapshot_id),
        Some(csi::volume_content_source::Type::Volume(v)) => format!(" source=volume:{}", v.volume_id),
        None => String::new(),
    }
}
