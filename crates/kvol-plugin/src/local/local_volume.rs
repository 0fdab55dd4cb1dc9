//! The local persistent volume plugin: a directory or block device of this node, pinned by node affinity.
//!
//! A directory needs no staging and is bind-mounted into the pod's volume directory. A block
//! device is mounted once per node at `<root>/plugins/kubernetes.io/local-volume/mounts/<pv>`
//! with the volume's fsType (ext4 by default), and that mount is bind-mounted into pods. kvol
//! never formats a device: one without the filesystem fails to stage. Teardown unmounts and
//! removes only the mount points kvol made; the local path's data is never touched. A volume
//! with `volumeMode: Block` must be a block device: it is not staged, and publish maps the
//! device itself into the pod ([`crate::block::map_device`]).

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;

use super::{FileKind, bind_to_target, create_dir_all, file_kind, has_backsteps, is_mounted, node_affinity};
use super::{remove_empty, unmount_and_remove_target};
use crate::error::{PluginError, Result};
use crate::host::PluginHost;
use crate::plugin::{
    AccessMode, DeviceMounter, PluginKind, PublishRequest, StatsReader, StatsRequest, UnpublishRequest,
    VolumeMounter, VolumePlugin, VolumeStats,
};
use crate::spec::{SourceKey, VolumeSpec};

/// The plugin's upstream name.
pub const PLUGIN_NAME: &str = "kubernetes.io/local-volume";

/// The filesystem a block device is mounted as when the volume names none (upstream's default).
pub const DEFAULT_FS_TYPE: &str = "ext4";

/// The local source of a persistent volume, checked for what upstream refuses.
#[derive(Debug)]
struct LocalSource<'a> {
    pv: &'a PersistentVolume,
    path: &'a str,
    fs_type: &'a str,
}

impl<'a> LocalSource<'a> {
    fn of(spec: &'a VolumeSpec) -> Result<LocalSource<'a>> {
        let not_local = || PluginError::invalid(spec, "it is not a local persistent volume");
        let pv = spec.pv().ok_or_else(not_local)?;
        let local = pv.spec.as_ref().and_then(|s| s.local.as_ref()).ok_or_else(not_local)?;
        let path = local.path.as_str();
        if path.is_empty() {
            return Err(PluginError::invalid(spec, "its local path is not set"));
        }
        if !Path::new(path).is_absolute() {
            return Err(PluginError::invalid(
                spec,
                format!("invalid local path {path}: must be an absolute path"),
            ));
        }
        if has_backsteps(Path::new(path)) {
            return Err(PluginError::invalid(
                spec,
                format!("invalid local path {path}: must not contain '..'"),
            ));
        }
        let fs_type = local.fs_type.as_deref().filter(|t| !t.is_empty()).unwrap_or(DEFAULT_FS_TYPE);
        Ok(LocalSource { pv, path, fs_type })
    }

    /// What the local path is: a directory or a block device, or why it cannot back the volume.
    fn kind(&self, spec: &VolumeSpec) -> Result<FileKind> {
        match file_kind(Path::new(self.path)).map_err(|e| PluginError::io("inspect", self.path, e))? {
            None => Err(PluginError::invalid(
                spec,
                format!("local path {} does not exist on this node", self.path),
            )),
            Some(kind @ (FileKind::Directory | FileKind::BlockDevice)) => Ok(kind),
            Some(other) => Err(PluginError::invalid(
                spec,
                format!(
                    "local path {} is a {}; only a directory or a block device can back a local volume",
                    self.path,
                    other.type_name()
                ),
            )),
        }
    }
}

/// The local persistent volume plugin (`kubernetes.io/local-volume`).
#[derive(Debug)]
pub struct LocalVolumePlugin {
    host: PluginHost,
}

impl LocalVolumePlugin {
    pub fn new(host: PluginHost) -> LocalVolumePlugin {
        LocalVolumePlugin { host }
    }

    /// `<root>/plugins/kubernetes.io/local-volume/mounts`: where block devices are staged.
    pub fn staging_root(&self) -> PathBuf {
        self.host.paths.plugin_dir(PLUGIN_NAME).join("mounts")
    }

    /// Refuses a volume whose required node affinity this node does not satisfy.
    fn check_node_affinity(&self, spec: &VolumeSpec, pv: &PersistentVolume) -> Result<()> {
        let required =
            pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).and_then(|a| a.required.as_ref());
        let required = required.ok_or_else(|| {
            PluginError::invalid(
                spec,
                "a local persistent volume must set spec.nodeAffinity.required, and it sets none",
            )
        })?;
        node_affinity::check(required, &self.host.node).map_err(|reason| PluginError::NodeAffinity {
            spec: spec.to_string(),
            node: self.host.node.name.clone(),
            reason,
        })
    }

    /// Refuses a staging path outside the staging root: unstaging there could unmount or remove
    /// something that is not kvol's.
    fn check_staging_path(&self, staging_path: &Path) -> Result<()> {
        let root = self.staging_root();
        if staging_path.starts_with(&root) && staging_path != root && !has_backsteps(staging_path) {
            return Ok(());
        }
        let reason = format!("it is not a staging path of {PLUGIN_NAME} (below {})", root.display());
        Err(PluginError::io(
            "use staging path",
            staging_path,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, reason),
        ))
    }
}

impl VolumePlugin for LocalVolumePlugin {
    fn name(&self) -> &str {
        PLUGIN_NAME
    }

    fn kind(&self) -> PluginKind {
        PluginKind::CompiledIn
    }

    fn serves(&self) -> Vec<SourceKey<'_>> {
        vec![SourceKey::Field("local")]
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        spec.pv().and_then(|pv| pv.spec.as_ref()).is_some_and(|s| s.local.is_some())
    }

    fn access_modes(&self) -> Vec<AccessMode> {
        vec![AccessMode::ReadWriteOnce]
    }

    fn is_persistent(&self) -> bool {
        true
    }

    /// The persistent volume's name, as upstream names local volumes.
    fn volume_name(&self, spec: &VolumeSpec) -> Result<String> {
        let source = LocalSource::of(spec)?;
        Ok(source.pv.metadata.name.clone().unwrap_or_default())
    }

    /// A local volume with `volumeMode: Block` is its block device handed to the pod; the
    /// device is checked at publish.
    fn supports_block(&self, _spec: &VolumeSpec) -> bool {
        true
    }

    /// A Block volume is not staged: the device itself is mapped into the pod.
    fn can_device_mount(&self, spec: &VolumeSpec) -> bool {
        !spec.is_block()
    }

    fn device_mounter(&self) -> Option<&dyn DeviceMounter> {
        Some(self)
    }

    fn mounter(&self) -> Option<&dyn VolumeMounter> {
        Some(self)
    }

    fn stats_reader(&self) -> Option<&dyn StatsReader> {
        Some(self)
    }
}

/// Kubelet measures local volumes with `statvfs` (a block one by its device's size).
#[async_trait]
impl StatsReader for LocalVolumePlugin {
    async fn volume_stats(&self, req: &StatsRequest<'_>) -> Result<VolumeStats> {
        crate::stats::measure_published(req.target).await
    }
}

#[async_trait]
impl DeviceMounter for LocalVolumePlugin {
    /// `<root>/plugins/kubernetes.io/local-volume/mounts/<pv name>`, whatever the local path is:
    /// a directory is never mounted there, but the path stays kvol's to create and remove.
    fn device_mount_path(&self, spec: &VolumeSpec) -> Result<PathBuf> {
        let name = spec.name();
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(PluginError::invalid(spec, "its name cannot name a staging directory"));
        }
        LocalSource::of(spec)?;
        Ok(self.staging_root().join(name))
    }

    /// Mounts a block device at the staging path; a directory needs nothing (as upstream).
    async fn stage(&self, spec: &VolumeSpec, _device_path: Option<&str>, staging_path: &Path) -> Result<()> {
        let source = LocalSource::of(spec)?;
        self.check_node_affinity(spec, source.pv)?;
        if source.kind(spec)? == FileKind::Directory {
            return Ok(());
        }
        self.check_staging_path(staging_path)?;
        let mounter = self.host.mounter.as_ref();
        if is_mounted(mounter, staging_path)? {
            return Ok(());
        }
        let root = self.host.paths.open_root()?;
        create_dir_all(&root, staging_path, 0o750)?;
        if let Err(e) = mounter.mount(source.path, staging_path, source.fs_type, spec.read_only, &[]) {
            let _ = remove_empty(&root, staging_path);
            return Err(PluginError::DeviceMount {
                device: PathBuf::from(source.path),
                fstype: source.fs_type.to_string(),
                path: staging_path.to_path_buf(),
                source: e.source,
            });
        }
        Ok(())
    }

    /// Unmounts the staging path and removes it; nothing there is success.
    async fn unstage(&self, staging_path: &Path) -> Result<()> {
        self.check_staging_path(staging_path)?;
        let root = self.host.paths.open_root()?;
        unmount_and_remove_target(self.host.mounter.as_ref(), &root, staging_path)
    }
}

#[async_trait]
impl VolumeMounter for LocalVolumePlugin {
    /// Bind-mounts the directory, or the staged block device, onto the target.
    async fn publish(&self, req: &PublishRequest<'_>) -> Result<()> {
        let spec = req.spec;
        let source = LocalSource::of(spec)?;
        self.check_node_affinity(spec, source.pv)?;
        let mounter = self.host.mounter.as_ref();
        if spec.is_block() {
            if source.kind(spec)? != FileKind::BlockDevice {
                let reason = format!(
                    "it has volumeMode Block, but local path {} is a directory, not a block device",
                    source.path
                );
                return Err(PluginError::invalid(spec, reason));
            }
            return crate::block::map_device(&self.host.paths, mounter, req.target, Path::new(source.path));
        }
        let bind_source = match source.kind(spec)? {
            FileKind::BlockDevice => {
                let staging = match req.staging_path {
                    Some(path) => path.to_path_buf(),
                    None => self.device_mount_path(spec)?,
                };
                if !is_mounted(mounter, &staging)? {
                    return Err(PluginError::invalid(
                        spec,
                        format!(
                            "block device {} is not staged at {}; stage it first",
                            source.path,
                            staging.display()
                        ),
                    ));
                }
                staging
            }
            _ => PathBuf::from(source.path),
        };
        let root = self.host.paths.open_root()?;
        let read_only = req.read_only || spec.read_only;
        let fresh = !is_mounted(mounter, req.target)?;
        bind_to_target(mounter, &root, &bind_source, req.target, true, read_only)?;
        // The pod's fsGroup on the volume's first mount for this pod, as kubelet's local plugin
        // gives it (kubelet also skips it while another pod mounts the volume).
        if fresh {
            crate::beneath::give_pod_fs_group(req.target, req.pod, read_only)?;
        }
        Ok(())
    }

    async fn unpublish(&self, req: &UnpublishRequest<'_>) -> Result<()> {
        if crate::block::PodDevice::parse(req.target).is_some() {
            return crate::block::unmap_device(&self.host.paths, self.host.mounter.as_ref(), req.target);
        }
        let root = self.host.paths.open_root()?;
        unmount_and_remove_target(self.host.mounter.as_ref(), &root, req.target)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::io;

    use k8s_openapi::api::core::v1::{
        LocalVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeSpec,
        VolumeNodeAffinity,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::local::test_support::{
        POD, any_block_device, block_on, publish_request, recording_host, unpublish_request,
    };
    use crate::mount::{MountCall, Mounter};

    fn hostname_in(hosts: &[&str]) -> Option<NodeSelector> {
        let requirement = NodeSelectorRequirement {
            key: "kubernetes.io/hostname".to_string(),
            operator: "In".to_string(),
            values: Some(hosts.iter().map(|h| h.to_string()).collect()),
        };
        Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![requirement]),
                match_fields: None,
            }],
        })
    }

    fn local_pv(path: &Path, fs_type: Option<&str>, required: Option<NodeSelector>) -> VolumeSpec {
        VolumeSpec::persistent(PersistentVolume {
            metadata: ObjectMeta { name: Some("pv-1".to_string()), ..ObjectMeta::default() },
            spec: Some(PersistentVolumeSpec {
                local: Some(LocalVolumeSource {
                    path: path.to_str().unwrap().to_string(),
                    fs_type: fs_type.map(str::to_string),
                }),
                node_affinity: Some(VolumeNodeAffinity { required }),
                ..PersistentVolumeSpec::default()
            }),
            ..PersistentVolume::default()
        })
    }

    #[test]
    fn a_read_write_directory_takes_the_pods_fs_group_on_its_first_mount_as_its_policy_says() {
        use std::os::unix::fs::MetadataExt;
        let (root, host, _mounter) = recording_host();
        let plugin = LocalVolumePlugin::new(host);
        let disk = root.path().join("disk");
        fs::create_dir(&disk).unwrap();
        let spec = local_pv(&disk, None, hostname_in(&["node-a"]));
        // (what, read-only, fsGroup, policy, the target's gid and setgid after the publish)
        let policy = crate::plugin::FsGroupChangePolicy::OnRootMismatch;
        let rows = [
            ("no fsGroup", false, None, policy, (0, false)),
            ("read-only", true, Some(4321), policy, (0, false)),
            ("read-write, root mismatches", false, Some(4321), policy, (4321, true)),
        ];
        for (i, (what, read_only, fs_group, policy, want)) in rows.into_iter().enumerate() {
            let pod = crate::plugin::PodInfo { fs_group, fs_group_change_policy: policy, ..POD.clone() };
            let target = root.path().join(format!("pods/u{i}/volumes/kubernetes.io~local-volume/pv-1"));
            let request = PublishRequest { pod: &pod, ..publish_request(&spec, &target, read_only) };
            block_on(plugin.publish(&request)).unwrap();
            // The recording mounter binds nothing: the walk ran on the target directory itself.
            let meta = fs::metadata(&target).unwrap();
            assert_eq!((meta.gid(), meta.mode() & 0o2000 != 0), want, "{what}");
        }
    }

    #[test]
    fn a_directory_is_bound_without_staging() {
        let (root, host, mounter) = recording_host();
        let plugin = LocalVolumePlugin::new(host);
        let disk = root.path().join("disk");
        fs::create_dir(&disk).unwrap();
        let spec = local_pv(&disk, None, hostname_in(&["node-a"])).with_read_only(true);
        let staging = plugin.device_mount_path(&spec).unwrap();
        assert_eq!(staging, root.path().join("plugins/kubernetes.io/local-volume/mounts/pv-1"));
        block_on(plugin.stage(&spec, None, &staging)).unwrap();
        assert!(!staging.exists() && mounter.calls().is_empty(), "a directory is not staged");
        let target = root.path().join("pods/u/volumes/kubernetes.io~local-volume/pv-1");
        block_on(plugin.publish(&publish_request(&spec, &target, false))).unwrap();
        block_on(plugin.publish(&publish_request(&spec, &target, false))).unwrap();
        assert_eq!(
            mounter.calls(),
            [MountCall::Bind { source: disk.clone(), target: target.clone(), read_only: true }]
        );
        block_on(plugin.unpublish(&unpublish_request(&target))).unwrap();
        block_on(plugin.unstage(&staging)).unwrap();
        assert!(!target.exists() && disk.is_dir());
    }

    #[test]
    fn node_affinity_is_checked_in_stage_and_publish() {
        let (root, host, mounter) = recording_host();
        let plugin = LocalVolumePlugin::new(host);
        let disk = root.path().join("disk");
        fs::create_dir(&disk).unwrap();
        let target = root.path().join("target");
        let elsewhere = local_pv(&disk, None, hostname_in(&["node-b", "node-c"]));
        let staging = plugin.device_mount_path(&elsewhere).unwrap();
        let expected = "persistent volume \"pv-1\" cannot be used on node \"node-a\": no node selector term matches: term 0: matchExpressions[0] (kubernetes.io/hostname In [node-b, node-c]) fails: the node's label kubernetes.io/hostname is \"node-a\"";
        let err = block_on(plugin.stage(&elsewhere, None, &staging)).unwrap_err();
        assert_eq!(err.to_string(), expected);
        let err = block_on(plugin.publish(&publish_request(&elsewhere, &target, false))).unwrap_err();
        assert_eq!(err.to_string(), expected);

        let unpinned = local_pv(&disk, None, None);
        let err = block_on(plugin.publish(&publish_request(&unpinned, &target, false))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "persistent volume \"pv-1\": a local persistent volume must set spec.nodeAffinity.required, and it sets none"
        );
        assert!(mounter.calls().is_empty() && !target.exists());
    }

    #[test]
    fn paths_that_cannot_back_a_volume_are_named() {
        let (root, host, _) = recording_host();
        let plugin = LocalVolumePlugin::new(host);
        let file = root.path().join("file");
        fs::write(&file, b"x").unwrap();
        let missing = root.path().join("missing");
        let cases = [
            (missing.clone(), format!("local path {} does not exist on this node", missing.display())),
            (
                file.clone(),
                format!("local path {} is a File; only a directory or a block device", file.display()),
            ),
            (
                PathBuf::from("/mnt/../etc"),
                "invalid local path /mnt/../etc: must not contain '..'".to_string(),
            ),
            (PathBuf::from("disks/a"), "invalid local path disks/a: must be an absolute path".to_string()),
        ];
        for (path, expected) in cases {
            let spec = local_pv(&path, None, hostname_in(&["node-a"]));
            let err =
                block_on(plugin.publish(&publish_request(&spec, &root.path().join("t"), false))).unwrap_err();
            assert!(err.to_string().contains(&expected), "{err} lacks {expected}");
        }
    }

    fn block(mut spec: VolumeSpec) -> VolumeSpec {
        if let crate::spec::SpecSource::Persistent(pv) = &mut spec.source {
            std::sync::Arc::make_mut(pv).spec.as_mut().unwrap().volume_mode = Some("Block".into());
        }
        spec
    }

    #[test]
    fn a_block_volume_is_its_device_mapped_into_the_pod() {
        let Some(device) = any_block_device() else {
            eprintln!("skipped: no block device under /dev");
            return;
        };
        let (root, host, mounter) = recording_host();
        let paths = host.paths.clone();
        let plugin = LocalVolumePlugin::new(host);
        let spec = block(local_pv(&device, None, hostname_in(&["node-a"])));
        assert!(spec.is_block() && !plugin.can_device_mount(&spec));
        let target = crate::block::publish_target(&paths, &plugin, &spec, "u1").unwrap();
        assert_eq!(target, root.path().join("pods/u1/volumeDevices/kubernetes.io~local-volume/pv-1"));
        block_on(plugin.publish(&publish_request(&spec, &target, false))).unwrap();
        block_on(plugin.publish(&publish_request(&spec, &target, false))).unwrap();
        let global = root.path().join("plugins/kubernetes.io/local-volume/volumeDevices/pv-1/dev/u1");
        assert_eq!(fs::read_link(&target).unwrap(), device);
        assert!(mounter.is_mount_point(&global).unwrap());
        assert_eq!(mounter.calls().len(), 1, "{:?}", mounter.calls());

        block_on(plugin.unpublish(&unpublish_request(&target))).unwrap();
        assert!(!mounter.is_mount_point(&global).unwrap());
        for gone in [&target, &global, &root.path().join("pods/u1/volumeDevices")] {
            assert!(fs::symlink_metadata(gone).is_err(), "{} left", gone.display());
        }
        assert!(!root.path().join("plugins/kubernetes.io/local-volume/volumeDevices/pv-1").exists());
        assert!(device.exists(), "the device itself is never touched");
    }

    #[test]
    fn a_block_volume_needs_a_block_device_and_a_plugin_that_serves_block() {
        let (root, host, mounter) = recording_host();
        let paths = host.paths.clone();
        let plugin = LocalVolumePlugin::new(host.clone());
        let spec = block(local_pv(root.path(), None, hostname_in(&["node-a"])));
        let target = crate::block::publish_target(&paths, &plugin, &spec, "u1").unwrap();
        let err = block_on(plugin.publish(&publish_request(&spec, &target, false))).unwrap_err();
        let want = format!(
            "persistent volume \"pv-1\": it has volumeMode Block, but local path {} is a directory, not a block device",
            root.path().display()
        );
        assert_eq!(err.to_string(), want);
        assert!(mounter.calls().is_empty() && fs::symlink_metadata(&target).is_err());

        let host_path = block(VolumeSpec::persistent(PersistentVolume {
            metadata: ObjectMeta { name: Some("hp".into()), ..ObjectMeta::default() },
            spec: Some(PersistentVolumeSpec {
                host_path: Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
                    path: "/srv".into(),
                    type_: None,
                }),
                ..PersistentVolumeSpec::default()
            }),
            ..PersistentVolume::default()
        }));
        let plugin = crate::local::host_path::HostPathPlugin::new(host);
        let err = crate::block::publish_target(&paths, &plugin, &host_path, "u1").unwrap_err();
        assert_eq!(
            err.to_string(),
            "persistent volume \"hp\": it has volumeMode Block, and volume plugin kubernetes.io/host-path does not serve block volumes"
        );
    }

    #[test]
    fn a_block_device_is_mounted_at_the_staging_path_then_bound() {
        let Some(device) = any_block_device() else {
            eprintln!("skipped: no block device under /dev");
            return;
        };
        let (root, host, mounter) = recording_host();
        let plugin = LocalVolumePlugin::new(host);
        let spec = local_pv(&device, Some("xfs"), hostname_in(&["node-a"]));
        let staging = plugin.device_mount_path(&spec).unwrap();
        let target = root.path().join("target");

        let err = block_on(plugin.publish(&publish_request(&spec, &target, false))).unwrap_err();
        assert!(err.to_string().contains("is not staged at"), "{err}");

        block_on(plugin.stage(&spec, None, &staging)).unwrap();
        block_on(plugin.stage(&spec, None, &staging)).unwrap();
        let mut request = publish_request(&spec, &target, true);
        request.staging_path = Some(&staging);
        block_on(plugin.publish(&request)).unwrap();
        assert_eq!(
            mounter.calls(),
            [
                MountCall::Mount {
                    source: device.to_str().unwrap().to_string(),
                    target: staging.clone(),
                    fstype: "xfs".to_string(),
                    read_only: false,
                    data: vec![],
                },
                MountCall::Bind { source: staging.clone(), target: target.clone(), read_only: true },
            ]
        );
        block_on(plugin.unpublish(&unpublish_request(&target))).unwrap();
        block_on(plugin.unstage(&staging)).unwrap();
        block_on(plugin.unstage(&staging)).unwrap();
        assert!(!staging.exists() && !target.exists());
        assert!(mounter.mount_points().unwrap().is_empty());
    }

    #[test]
    fn a_device_that_will_not_mount_says_kvol_does_not_format() {
        let Some(device) = any_block_device() else {
            eprintln!("skipped: no block device under /dev");
            return;
        };
        let (_root, host, mounter) = recording_host();
        let plugin = LocalVolumePlugin::new(host);
        let spec = local_pv(&device, None, hostname_in(&["node-a"]));
        let staging = plugin.device_mount_path(&spec).unwrap();
        mounter.fail_next(io::ErrorKind::InvalidInput);
        let err = block_on(plugin.stage(&spec, None, &staging)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "cannot mount block device {} as ext4 at {}: invalid input parameter (kvol does not format devices: it must already hold a ext4 filesystem)",
                device.display(),
                staging.display()
            )
        );
        assert!(!staging.exists(), "a failed stage leaves no staging directory");
    }

    #[test]
    fn unstage_touches_nothing_outside_the_staging_root() {
        let (root, host, mounter) = recording_host();
        let plugin = LocalVolumePlugin::new(host);
        let disk = root.path().join("disk");
        fs::create_dir(&disk).unwrap();
        for outside in [disk.clone(), plugin.staging_root(), plugin.staging_root().join("../../x")] {
            let err = block_on(plugin.unstage(&outside)).unwrap_err();
            assert!(
                err.to_string().contains("it is not a staging path of kubernetes.io/local-volume"),
                "{err}"
            );
        }
        assert!(disk.is_dir() && mounter.calls().is_empty());
    }

    #[test]
    fn the_plugin_serves_local_persistent_volumes_by_name() {
        let (root, host, _) = recording_host();
        let plugin = LocalVolumePlugin::new(host);
        let spec = local_pv(root.path(), None, hostname_in(&["node-a"]));
        assert!(plugin.can_support(&spec));
        assert_eq!(plugin.volume_name(&spec).unwrap(), "pv-1");
        assert_eq!(plugin.serves(), [SourceKey::Field("local")]);
        assert_eq!(plugin.access_modes(), [AccessMode::ReadWriteOnce]);
        let caps = plugin.capabilities();
        assert!(caps.persistent && caps.device_mountable && caps.mountable && !caps.attachable);
    }
}
