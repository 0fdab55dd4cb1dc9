//! The plugin seams: a volume plugin and the lifecycle parts it may offer (attach, stage, publish, expand, provision).
//!
//! A plugin answers questions synchronously (name, which specs, which capabilities) and does
//! its I/O in async lifecycle calls. Capabilities are not declared separately: a plugin is
//! attachable exactly when [`VolumePlugin::attacher`] returns one, and so on, so a listing can
//! never disagree with what the plugin does.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;
use kvol_api::MigratablePlugin;
use serde::Serialize;

use crate::error::Result;
use crate::spec::{SourceKey, VolumeSpec};

/// A shared handle on a plugin, as the registry hands them out.
pub type PluginRef = Arc<dyn VolumePlugin>;

/// Where a plugin comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PluginKind {
    /// Compiled into kvol with real code (emptyDir, hostPath, local).
    CompiledIn,
    /// A migratable in-tree plugin kvol knows by name and spec only; its volumes are served by
    /// its CSI driver once migrated.
    InTree,
    /// A Flexvolume exec driver found in the driver directory.
    Flexvolume,
    /// A CSI driver registered over the plugin-registration socket.
    Csi,
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PluginKind::CompiledIn => "compiled-in",
            PluginKind::InTree => "in-tree",
            PluginKind::Flexvolume => "flexvolume",
            PluginKind::Csi => "csi",
        })
    }
}

/// A persistent volume access mode, as the API spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum AccessMode {
    ReadWriteOnce,
    ReadOnlyMany,
    ReadWriteMany,
    ReadWriteOncePod,
}

impl AccessMode {
    /// The API spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadOnlyMany => "ReadOnlyMany",
            AccessMode::ReadWriteMany => "ReadWriteMany",
            AccessMode::ReadWriteOncePod => "ReadWriteOncePod",
        }
    }
}

/// What a plugin can do, derived from the parts it offers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// Serves persistent volumes (not only inline ones).
    pub persistent: bool,
    pub attachable: bool,
    pub device_mountable: bool,
    pub mountable: bool,
    pub controller_expandable: bool,
    pub node_expandable: bool,
    pub provisionable: bool,
    pub deletable: bool,
}

impl Capabilities {
    /// The capabilities as short words, for tables: `attach stage publish expand …`.
    pub fn words(&self) -> Vec<&'static str> {
        [
            (self.persistent, "persistent"),
            (self.attachable, "attach"),
            (self.device_mountable, "stage"),
            (self.mountable, "publish"),
            (self.controller_expandable, "expand"),
            (self.node_expandable, "node-expand"),
            (self.provisionable, "provision"),
            (self.deletable, "delete"),
        ]
        .into_iter()
        .filter_map(|(on, word)| on.then_some(word))
        .collect()
    }
}

/// A volume plugin.
pub trait VolumePlugin: Send + Sync + fmt::Debug {
    /// The plugin's unique name: `kubernetes.io/empty-dir`, `vendor/driver`, a CSI driver name.
    fn name(&self) -> &str;
    fn kind(&self) -> PluginKind;
    /// The sources this plugin serves. The registry indexes lookups by them, so a lookup by
    /// spec asks [`VolumePlugin::can_support`] only of the plugins serving the spec's source.
    fn serves(&self) -> Vec<SourceKey<'_>>;
    /// Whether the plugin serves this spec; called only for specs whose source it serves.
    fn can_support(&self, _spec: &VolumeSpec) -> bool {
        true
    }
    /// The access modes persistent volumes of this plugin may have.
    fn access_modes(&self) -> Vec<AccessMode> {
        Vec::new()
    }
    /// Whether the plugin serves persistent volumes at all.
    fn is_persistent(&self) -> bool {
        false
    }
    /// The in-tree plugin this one stands for, if it is a migratable in-tree descriptor.
    fn migrates(&self) -> Option<MigratablePlugin> {
        None
    }
    /// A name unique to the volume (not the pod), under which it is attached and staged.
    fn volume_name(&self, spec: &VolumeSpec) -> Result<String> {
        Ok(format!("{}^{}", self.name(), spec.name()))
    }
    /// The plugin name pod volume directories are filed under
    /// (`pods/<uid>/volumes/<this, / as ~>/<volume>`): the plugin's name, except that every CSI
    /// driver files under `kubernetes.io/csi` as kubelet does.
    fn pod_dir_plugin_name(&self) -> &str {
        self.name()
    }
    /// Facts worth showing in `kvol plugins`, as key/value pairs (a driver's version, endpoint,
    /// CSIDriver settings …); none by default.
    fn details(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Whether a published volume of this spec is to be published again from time to time
    /// (upstream's `RequiresRemount`: a CSI driver whose CSIDriver says `requiresRepublish`).
    fn requires_remount(&self, _spec: &VolumeSpec) -> bool {
        false
    }
    /// Whether the plugin serves this spec as a raw block volume (`volumeMode: Block`): then
    /// publish maps a device to the pod's device path ([`crate::block`]) instead of mounting a
    /// filesystem. No by default.
    fn supports_block(&self, _spec: &VolumeSpec) -> bool {
        false
    }
    /// Whether this spec needs attaching (a CSI driver may say no per spec).
    fn can_attach(&self, _spec: &VolumeSpec) -> bool {
        self.attacher().is_some()
    }
    /// Whether this spec needs staging.
    fn can_device_mount(&self, _spec: &VolumeSpec) -> bool {
        self.device_mounter().is_some()
    }

    fn attacher(&self) -> Option<&dyn Attacher> {
        None
    }
    fn device_mounter(&self) -> Option<&dyn DeviceMounter> {
        None
    }
    fn mounter(&self) -> Option<&dyn VolumeMounter> {
        None
    }
    fn controller_expander(&self) -> Option<&dyn ControllerExpander> {
        None
    }
    fn node_expander(&self) -> Option<&dyn NodeExpander> {
        None
    }
    fn provisioner(&self) -> Option<&dyn Provisioner> {
        None
    }
    fn deleter(&self) -> Option<&dyn Deleter> {
        None
    }
    /// How the plugin measures a published volume (kubelet's `MetricsProvider`); none by
    /// default, as for kubelet's hostPath.
    fn stats_reader(&self) -> Option<&dyn StatsReader> {
        None
    }

    /// What the plugin can do, from the parts it offers.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            persistent: self.is_persistent(),
            attachable: self.attacher().is_some(),
            device_mountable: self.device_mounter().is_some(),
            mountable: self.mounter().is_some(),
            controller_expandable: self.controller_expander().is_some(),
            node_expandable: self.node_expander().is_some(),
            provisionable: self.provisioner().is_some(),
            deletable: self.deleter().is_some(),
        }
    }
}

/// Attaches volumes to nodes and detaches them.
#[async_trait]
pub trait Attacher: Send + Sync {
    /// Attaches the volume to `node`; returns the device path when the plugin knows it already.
    async fn attach(&self, spec: &VolumeSpec, node: &str) -> Result<Option<String>>;
    /// Waits until the attached device shows up on this node; returns its path.
    async fn wait_for_attach(
        &self,
        spec: &VolumeSpec,
        device_path: Option<&str>,
        timeout: Duration,
    ) -> Result<String>;
    /// Whether the volume is attached to `node`.
    async fn is_attached(&self, spec: &VolumeSpec, node: &str) -> Result<bool>;
    /// Detaches the volume known by `volume_name` ([`VolumePlugin::volume_name`]) from `node`.
    async fn detach(&self, volume_name: &str, node: &str) -> Result<()>;
}

/// Stages a volume's device once per node (mount-device), for every pod to publish from.
#[async_trait]
pub trait DeviceMounter: Send + Sync {
    /// The node-global staging path of the volume.
    fn device_mount_path(&self, spec: &VolumeSpec) -> Result<PathBuf>;
    async fn stage(&self, spec: &VolumeSpec, device_path: Option<&str>, staging_path: &Path) -> Result<()>;
    async fn unstage(&self, staging_path: &Path) -> Result<()>;

    /// [`DeviceMounter::unstage`] of a volume the agent's journal records as `spec`: what a
    /// plugin tears down by when the node's own record of the staging (a CSI
    /// `vol_data.json`) is lost or corrupt. By default, the same as `unstage`.
    async fn unstage_recorded(&self, staging_path: &Path, spec: &VolumeSpec) -> Result<()> {
        let _ = spec;
        self.unstage(staging_path).await
    }
}

pub use kvol_api::pod::{FsGroupChangePolicy, PodInfo};

/// Everything a publish needs.
#[derive(Clone, Copy, Debug)]
pub struct PublishRequest<'a> {
    pub spec: &'a VolumeSpec,
    pub pod: &'a PodInfo,
    /// The pod's name for the volume (its `volumes[].name`).
    pub pod_volume_name: &'a str,
    /// Where to publish: `<root>/pods/<uid>/volumes/<escaped plugin>/<volume>`.
    pub target: &'a Path,
    /// The staged path, when the plugin stages.
    pub staging_path: Option<&'a Path>,
    pub device_path: Option<&'a str>,
    pub read_only: bool,
    pub mount_options: &'a [String],
    /// What a configMap, secret, downwardAPI or projected volume holds, made by the agent from
    /// the objects it names; `None` for every other volume.
    pub projection: Option<&'a kvol_api::projection::Projection>,
}

/// Everything an unpublish needs; it works without the spec, so a restarted node can tear down
/// what it finds on disk.
#[derive(Clone, Copy, Debug)]
pub struct UnpublishRequest<'a> {
    pub pod_uid: &'a str,
    pub pod_volume_name: &'a str,
    pub target: &'a Path,
    /// The volume as the agent's journal knows it, when it does: what a plugin tears down by
    /// when the node's own records of it (a CSI `vol_data.json`) are lost or corrupt.
    pub spec: Option<&'a VolumeSpec>,
}

/// Publishes a volume into a pod's volume directory and takes it out again.
#[async_trait]
pub trait VolumeMounter: Send + Sync {
    async fn publish(&self, req: &PublishRequest<'_>) -> Result<()>;
    async fn unpublish(&self, req: &UnpublishRequest<'_>) -> Result<()>;
}

/// A published volume's usage, as kubelet's `kubelet_volume_stats_*` gauges report it; what
/// the plugin cannot tell stays `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeStats {
    pub capacity_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub inodes_used: Option<u64>,
    /// The driver's volume condition (CSI `VOLUME_CONDITION`): `Some(true)` when it says the
    /// volume is abnormal, `None` when it does not report one.
    pub abnormal: Option<bool>,
}

impl VolumeStats {
    /// The usage of the filesystem at `path`, as kubelet's `MetricsStatFS` computes it: capacity
    /// from the blocks, available from those an unprivileged user may take, used from those not
    /// free.
    pub fn of_filesystem(path: &Path) -> std::io::Result<VolumeStats> {
        let fs = rustix::fs::statvfs(path)?;
        let block = fs.f_frsize;
        Ok(VolumeStats {
            capacity_bytes: Some(fs.f_blocks.saturating_mul(block)),
            available_bytes: Some(fs.f_bavail.saturating_mul(block)),
            used_bytes: Some(fs.f_blocks.saturating_sub(fs.f_bfree).saturating_mul(block)),
            inodes: Some(fs.f_files),
            inodes_free: Some(fs.f_ffree),
            inodes_used: Some(fs.f_files.saturating_sub(fs.f_ffree)),
            abnormal: None,
        })
    }
}

/// Which published volume to measure.
#[derive(Clone, Copy, Debug)]
pub struct StatsRequest<'a> {
    pub spec: &'a VolumeSpec,
    pub pod_uid: &'a str,
    /// The pod volume directory (or, for a raw block volume, the pod's device path).
    pub target: &'a Path,
    pub staging_path: Option<&'a Path>,
}

/// Measures published volumes (kubelet's `MetricsProvider`).
#[async_trait]
pub trait StatsReader: Send + Sync {
    async fn volume_stats(&self, req: &StatsRequest<'_>) -> Result<VolumeStats>;
}

/// Grows a volume on the storage side (the control plane's part of expansion).
#[async_trait]
pub trait ControllerExpander: Send + Sync {
    /// Grows the volume to at least `new_size` bytes; returns the size it now has.
    async fn expand(&self, spec: &VolumeSpec, new_size: u64, old_size: u64) -> Result<u64>;
    /// Whether the node must then grow the filesystem.
    fn requires_node_expansion(&self) -> bool;
}

/// Grows a volume's filesystem on the node; `mount_path` is the pod volume directory the volume
/// was published into ([`PublishRequest::target`]).
#[async_trait]
pub trait NodeExpander: Send + Sync {
    async fn expand_on_node(
        &self,
        spec: &VolumeSpec,
        device_path: Option<&str>,
        mount_path: &Path,
        new_size: u64,
        old_size: u64,
    ) -> Result<()>;
}

/// Creates persistent volumes for claims.
#[async_trait]
pub trait Provisioner: Send + Sync {
    async fn provision(
        &self,
        claim_name: &str,
        size: u64,
        parameters: &[(String, String)],
    ) -> Result<PersistentVolume>;
}

/// Deletes the storage behind persistent volumes.
#[async_trait]
pub trait Deleter: Send + Sync {
    async fn delete(&self, spec: &VolumeSpec) -> Result<()>;
}
