//! The Flexvolume plugin: one per loaded driver, attachable or mount-only as its `init` says.
//!
//! Every lifecycle call runs one driver command with upstream's argument order and options
//! JSON. A command the driver answers "Not supported" is remembered for the life of this plugin
//! instance (the prober builds a new instance when the driver changes) and from then on goes
//! straight to upstream's default:
//!
//! | command | default |
//! |---|---|
//! | `attach` | no device path |
//! | `waitforattach` | the device path it was given |
//! | `isattached` | attached (upstream returns no information, which leaves the volume attached) |
//! | `detach` | nothing to do |
//! | `mountdevice` | kvol mounts the device path (if any) on the staging path: the spec's fsType, else ext4 |
//! | `unmountdevice` | kvol unmounts the staging path |
//! | `mount` | kvol bind-mounts the staging path onto the target |
//! | `unmount` | kvol unmounts the target |
//! | `expandvolume` | the new size |
//! | `expandfs` | an error: kvol does not do upstream's generic filesystem resize |
//!
//! Mounts run inline in the async calls (never on another thread), so they land in the calling
//! thread's mount namespace.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use kvol_plugin::beneath::Root;
use kvol_plugin::local::{create_dir_all, is_mounted, remove_empty, unmount_and_remove_target};
use kvol_plugin::plugin::{
    Attacher, ControllerExpander, DeviceMounter, NodeExpander, PodInfo, PublishRequest, UnpublishRequest,
    VolumeMounter,
};
use kvol_plugin::{
    AccessMode, PluginError, PluginHost, PluginKind, SourceKey, SpecSource, VolumePlugin, VolumeSpec,
};

use crate::driver::FlexDriver;
use crate::error::{FlexError, Result};
use crate::options::{FlexSource, Options, driver_options, mount_extras, secret_values, to_json};
use crate::protocol::{Command, DriverCapabilities, DriverStatus};

/// The plugin directory all Flexvolume drivers stage under:
/// `<root>/plugins/kubernetes.io/flexvolume/<driver name>/mounts/<volume name>`.
pub const FLEXVOLUME_PLUGIN_DIR: &str = "kubernetes.io/flexvolume";
/// The filesystem kvol's `mountdevice` default mounts when the spec names none (mount-utils'
/// `FormatAndMount` default). kvol does not format devices.
pub const DEFAULT_FS_TYPE: &str = "ext4";
/// Mode of the staging and target directories kvol creates (upstream's `prepareForMount`).
const DIR_MODE: u32 = 0o750;

type PluginResult<T> = kvol_plugin::Result<T>;

/// How long kubelet's generic filesystem resize (blkid, then resize2fs or xfs_growfs) may take.
const GENERIC_RESIZE_DEADLINE: Duration = Duration::from_secs(120);

/// A loaded Flexvolume driver as a volume plugin.
#[derive(Debug)]
pub struct FlexVolumePlugin {
    driver: FlexDriver,
    host: PluginHost,
    capabilities: DriverCapabilities,
    /// Commands the driver answered "Not supported"; never asked again by this instance.
    unsupported: Mutex<BTreeSet<Command>>,
}

impl FlexVolumePlugin {
    /// Runs the driver's `init` and builds the plugin from its capabilities; a failing `init`
    /// is an error and no plugin.
    pub async fn load(driver: FlexDriver, host: PluginHost) -> Result<FlexVolumePlugin> {
        let status = driver.call(Command::Init, &[]).await?;
        let capabilities = status.capabilities;
        tracing::info!(
            driver = %driver.name,
            executable = %driver.executable.display(),
            attach = capabilities.attach,
            requires_fs_resize = capabilities.requires_fs_resize,
            "flexvolume driver loaded"
        );
        Ok(FlexVolumePlugin { driver, host, capabilities, unsupported: Mutex::default() })
    }

    pub fn driver(&self) -> &FlexDriver {
        &self.driver
    }

    pub fn driver_capabilities(&self) -> DriverCapabilities {
        self.capabilities
    }

    pub fn host(&self) -> &PluginHost {
        &self.host
    }

    /// The commands this instance has learnt the driver does not support.
    pub fn unsupported_commands(&self) -> Vec<Command> {
        self.lock_unsupported().iter().copied().collect()
    }

    /// `<root>/plugins/kubernetes.io/flexvolume/<driver name>/mounts`: the driver's name keeps
    /// its `/`, so a vendor gets a directory of its own.
    pub fn mounts_dir(&self) -> PathBuf {
        self.host.paths.plugin_dir(FLEXVOLUME_PLUGIN_DIR).join(&self.driver.name).join("mounts")
    }

    /// Grows the filesystem on the node with `expandfs <json> <device> <deviceMountPath> <new>
    /// <old>`. Upstream wants a persistent volume here; so does kvol.
    pub async fn expand_fs(
        &self,
        spec: &VolumeSpec,
        device_path: Option<&str>,
        device_mount_path: &Path,
        new_size: u64,
        old_size: u64,
    ) -> PluginResult<()> {
        if !spec.is_persistent() {
            return Err(PluginError::invalid(
                spec,
                "growing a filesystem on the node needs a persistent volume",
            ));
        }
        let args = vec![
            self.spec_json(spec, Options::new())?,
            device_path.unwrap_or_default().to_string(),
            path_arg(device_mount_path)?,
            new_size.to_string(),
            old_size.to_string(),
        ];
        match self.run(Command::ExpandFs, &args).await? {
            Some(_) => Ok(()),
            // kubelet's fallback: the filesystem on the device grown by kvol itself.
            None => {
                let Some(device) = device_path.filter(|d| !d.is_empty()) else {
                    return Err(PluginError::invalid(
                        spec,
                        format!(
                            "flexvolume driver {} does not grow filesystems (expandfs) and names no device \
                             to grow one on",
                            self.driver.name
                        ),
                    ));
                };
                kvol_plugin::fs_resize::grow_mounted(
                    Path::new(device),
                    device_mount_path,
                    GENERIC_RESIZE_DEADLINE,
                )
                .await
                .map_err(|e| {
                    PluginError::invalid(spec, format!("flexvolume driver {}: {e}", self.driver.name))
                })
            }
        }
    }

    /// Runs `command` unless the driver is known not to support it: `Ok(None)` means "Not
    /// supported" (now or before), so the caller falls back.
    async fn run(&self, command: Command, args: &[String]) -> Result<Option<DriverStatus>> {
        self.run_within(command, args, self.driver.limits.timeout_of(command)).await
    }

    async fn run_within(
        &self,
        command: Command,
        args: &[String],
        timeout: Duration,
    ) -> Result<Option<DriverStatus>> {
        if self.lock_unsupported().contains(&command) {
            let remembered = "not supported by the driver (remembered); using kvol's default";
            tracing::debug!(driver = %self.driver.name, %command, "{remembered}");
            return Ok(None);
        }
        match self.driver.call_within(command, args, timeout).await {
            Ok(status) => Ok(Some(status)),
            Err(e) if e.is_not_supported() => {
                self.lock_unsupported().insert(command);
                let fallback = "not supported by the driver; using kvol's default";
                tracing::warn!(driver = %self.driver.name, %command, "{fallback}");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn lock_unsupported(&self) -> MutexGuard<'_, BTreeSet<Command>> {
        self.unsupported.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The spec's Flexvolume source, which must name this driver.
    fn source<'a>(&self, spec: &'a VolumeSpec) -> PluginResult<FlexSource<'a>> {
        let source = FlexSource::of(spec)
            .ok_or_else(|| PluginError::invalid(spec, "it is not a Flexvolume volume"))?;
        if source.driver != self.driver.name {
            return Err(PluginError::invalid(
                spec,
                format!("it names flexvolume driver {:?}, not {:?}", source.driver, self.driver.name),
            ));
        }
        Ok(source)
    }

    /// The options JSON of a call about `spec`, with `extra` keys.
    fn spec_json(&self, spec: &VolumeSpec, extra: Options) -> PluginResult<String> {
        let source = self.source(spec)?;
        Ok(to_json(&driver_options(&source, spec.name(), extra)))
    }

    /// The values of the Secret the source references, if any; a reference to a missing Secret
    /// or one of another type is an error.
    fn secret_for(&self, source: &FlexSource<'_>, pod_namespace: &str) -> Result<BTreeMap<String, Vec<u8>>> {
        let Some((namespace, name)) = source.secret_location(pod_namespace) else {
            return Ok(BTreeMap::new());
        };
        let refused = |why: String| FlexError::Protocol {
            driver: self.driver.name.clone(),
            reason: format!("cannot get secret {namespace}/{name}: {why}"),
        };
        let secret = self
            .host
            .secrets
            .get(namespace, name)
            .ok_or_else(|| refused("there is no such secret".into()))?;
        secret_values(&secret, &self.driver.name).map_err(refused)
    }

    /// `mountdevice <deviceMountPath> <device> <json>`, or kvol's default.
    async fn mount_device(&self, spec: &VolumeSpec, device: &str, staging_path: &Path) -> PluginResult<()> {
        let source = self.source(spec)?;
        let args = vec![path_arg(staging_path)?, device.to_string(), self.spec_json(spec, Options::new())?];
        if self.run(Command::MountDevice, &args).await?.is_some() {
            return Ok(());
        }
        // Without a device (the driver does not attach) there is nothing to mount.
        if device.is_empty() {
            return Ok(());
        }
        let fstype = if source.fs_type.is_empty() { DEFAULT_FS_TYPE } else { source.fs_type };
        self.host.mounter.mount(device, staging_path, fstype, source.read_only, &[]).map_err(|e| {
            PluginError::DeviceMount {
                device: PathBuf::from(device),
                fstype: fstype.to_string(),
                path: staging_path.to_path_buf(),
                source: e.source,
            }
        })
    }

    /// `mount <target> <json>` with the pod, Secret and fsGroup options, or kvol's default.
    async fn mount(&self, req: &PublishRequest<'_>) -> PluginResult<()> {
        let source = self.source(req.spec)?;
        let secret = self.secret_for(&source, pod_namespace(req.pod, req.spec))?;
        let args = vec![path_arg(req.target)?, self.spec_json(req.spec, mount_extras(req.pod, &secret))?];
        if self.run(Command::Mount, &args).await?.is_some() {
            return Ok(());
        }
        let staged = self.mounts_dir().join(checked_volume_name(req.spec)?);
        // Upstream binds read-write and leaves read-only to the container runtime; kvol has none,
        // so a read-only volume is bound read-only.
        let read_only = req.read_only || source.read_only;
        Ok(self.host.mounter.bind(&staged, req.target, read_only)?)
    }
}

/// The namespace Secrets of inline volumes are read from: the pod's.
fn pod_namespace<'a>(pod: &'a PodInfo, spec: &'a VolumeSpec) -> &'a str {
    match &spec.source {
        SpecSource::Inline { pod_namespace, .. } if pod.namespace.is_empty() => pod_namespace,
        _ => &pod.namespace,
    }
}

/// Upstream's volume name (`spec.Name()`), refused when it cannot be one path component: it
/// names the staging directory.
fn checked_volume_name(spec: &VolumeSpec) -> PluginResult<&str> {
    let name = spec.name();
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(PluginError::invalid(spec, format!("its name {name:?} cannot name a staging directory")));
    }
    Ok(name)
}

/// A path as a driver argument.
fn path_arg(path: &Path) -> PluginResult<String> {
    path.to_str().map(str::to_string).ok_or_else(|| {
        let reason = io::Error::new(io::ErrorKind::InvalidInput, "the path is not valid UTF-8");
        PluginError::io("pass to a flexvolume driver", path, reason)
    })
}

/// Whether anything is at `path` (upstream's `PathExists`, without following a last symlink).
fn exists(path: &Path) -> PluginResult<bool> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(PluginError::io("inspect", path, e)),
    }
}

impl VolumePlugin for FlexVolumePlugin {
    fn details(&self) -> Vec<(String, String)> {
        let c = self.capabilities;
        vec![
            ("executable".to_string(), self.driver.executable.display().to_string()),
            (
                "init".to_string(),
                format!(
                    "attach={} selinuxRelabel={} supportsMetrics={} fsGroup={} requiresFSResize={}",
                    c.attach, c.selinux_relabel, c.supports_metrics, c.fs_group, c.requires_fs_resize
                ),
            ),
        ]
    }

    fn name(&self) -> &str {
        &self.driver.name
    }

    fn kind(&self) -> PluginKind {
        PluginKind::Flexvolume
    }

    fn serves(&self) -> Vec<SourceKey<'_>> {
        vec![SourceKey::Flex(&self.driver.name)]
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        spec.flex_driver() == Some(self.driver.name.as_str())
    }

    fn access_modes(&self) -> Vec<AccessMode> {
        vec![AccessMode::ReadWriteOnce, AccessMode::ReadOnlyMany]
    }

    fn is_persistent(&self) -> bool {
        true
    }

    /// The PV's or the inline volume's name. Upstream calls `getvolumename` and then ignores
    /// the answer, using this name anyway; kvol does not make the call.
    fn volume_name(&self, spec: &VolumeSpec) -> PluginResult<String> {
        checked_volume_name(spec).map(str::to_string)
    }

    fn attacher(&self) -> Option<&dyn Attacher> {
        self.capabilities.attach.then_some(self as &dyn Attacher)
    }

    fn device_mounter(&self) -> Option<&dyn DeviceMounter> {
        self.capabilities.attach.then_some(self as &dyn DeviceMounter)
    }

    fn mounter(&self) -> Option<&dyn VolumeMounter> {
        Some(self)
    }

    fn controller_expander(&self) -> Option<&dyn ControllerExpander> {
        Some(self)
    }

    fn node_expander(&self) -> Option<&dyn NodeExpander> {
        Some(self)
    }
}

#[async_trait]
impl Attacher for FlexVolumePlugin {
    /// `attach <json> <node>`; the device path the driver names, if any.
    async fn attach(&self, spec: &VolumeSpec, node: &str) -> PluginResult<Option<String>> {
        let args = vec![self.spec_json(spec, Options::new())?, node.to_string()];
        Ok(self.run(Command::Attach, &args).await?.map(|s| s.device).filter(|device| !device.is_empty()))
    }

    /// `waitforattach <device> <json>` under the caller's `timeout` (zero: the limits' one),
    /// never longer than the limits allow.
    async fn wait_for_attach(
        &self,
        spec: &VolumeSpec,
        device_path: Option<&str>,
        timeout: Duration,
    ) -> PluginResult<String> {
        let device = device_path.unwrap_or_default();
        let args = vec![device.to_string(), self.spec_json(spec, Options::new())?];
        let limit = self.driver.limits.wait_for_attach_timeout;
        let timeout = if timeout.is_zero() { limit } else { timeout.min(limit) };
        match self.run_within(Command::WaitForAttach, &args, timeout).await? {
            Some(status) => Ok(status.device),
            None => Ok(device.to_string()),
        }
    }

    /// `isattached <json> <node>`. "Not supported" answers attached: upstream then reports
    /// nothing, which leaves the volume marked attached.
    async fn is_attached(&self, spec: &VolumeSpec, node: &str) -> PluginResult<bool> {
        let args = vec![self.spec_json(spec, Options::new())?, node.to_string()];
        Ok(self.run(Command::IsAttached, &args).await?.is_none_or(|status| status.attached))
    }

    /// `detach <volumeName> <node>`.
    async fn detach(&self, volume_name: &str, node: &str) -> PluginResult<()> {
        let args = vec![volume_name.to_string(), node.to_string()];
        self.run(Command::Detach, &args).await?;
        Ok(())
    }
}

#[async_trait]
impl DeviceMounter for FlexVolumePlugin {
    fn device_mount_path(&self, spec: &VolumeSpec) -> PluginResult<PathBuf> {
        Ok(self.mounts_dir().join(checked_volume_name(spec)?))
    }

    /// Mounts once: an already mounted staging path is left alone; a missing one is created
    /// (0750) and removed again if staging fails.
    async fn stage(
        &self,
        spec: &VolumeSpec,
        device_path: Option<&str>,
        staging_path: &Path,
    ) -> PluginResult<()> {
        let root = self.host.paths.open_root()?;
        create_parent(&root, staging_path)?;
        if is_mounted(self.host.mounter.as_ref(), staging_path)? {
            return Ok(());
        }
        create_dir_all(&root, staging_path, DIR_MODE)?;
        let staged = self.mount_device(spec, device_path.unwrap_or_default(), staging_path).await;
        if staged.is_err() {
            let _ = remove_empty(&root, staging_path);
        }
        staged
    }

    /// `unmountdevice <deviceMountPath>` when something is mounted there, then removes the
    /// directory if the driver left it. A missing path is already done.
    async fn unstage(&self, staging_path: &Path) -> PluginResult<()> {
        let root = self.host.paths.open_root()?;
        if !reached(&root, staging_path)? || !exists(staging_path)? {
            let path = staging_path.display();
            tracing::debug!(driver = %self.driver.name, %path, "nothing to unstage: the path is gone");
            return Ok(());
        }
        let mounter = self.host.mounter.as_ref();
        if is_mounted(mounter, staging_path)? {
            let args = vec![path_arg(staging_path)?];
            if self.run(Command::UnmountDevice, &args).await?.is_none() {
                unmount_and_remove_target(mounter, &root, staging_path)?;
            }
        } else {
            let path = staging_path.display();
            tracing::warn!(driver = %self.driver.name, %path, "staging path already unmounted");
        }
        remove_empty(&root, staging_path)
    }
}

/// Creates the directories holding `path` under the kubelet root, never through a symlink.
fn create_parent(root: &Root, path: &Path) -> PluginResult<()> {
    match path.parent() {
        Some(parent) => create_dir_all(root, parent, DIR_MODE),
        None => Ok(()),
    }
}

/// Whether the directory holding `path` exists, reached from the root without a symlink (a
/// symlink on the way is an error naming the path: the driver is never called through one).
fn reached(root: &Root, path: &Path) -> PluginResult<bool> {
    root.parent_exists(path).map_err(|e| PluginError::io("reach", path, e))
}

#[async_trait]
impl VolumeMounter for FlexVolumePlugin {
    /// Mounts once: an already mounted target is left alone; a missing one is created (0750)
    /// and removed again if the mount fails (a missing Secret included). A volume mounted
    /// read-write gets the pod's fsGroup (with its change policy) unless the driver's `init`
    /// said `fsGroup: false`; as kubelet, a failure there is said, not fatal.
    async fn publish(&self, req: &PublishRequest<'_>) -> PluginResult<()> {
        let root = self.host.paths.open_root()?;
        create_parent(&root, req.target)?;
        if is_mounted(self.host.mounter.as_ref(), req.target)? {
            return Ok(());
        }
        create_dir_all(&root, req.target, DIR_MODE)?;
        let mounted = self.mount(req).await;
        if mounted.is_err() {
            let _ = remove_empty(&root, req.target);
        }
        mounted?;
        let read_only = req.read_only || self.source(req.spec)?.read_only;
        if self.capabilities.fs_group
            && let Err(e) = kvol_plugin::beneath::give_pod_fs_group(req.target, req.pod, read_only)
        {
            tracing::warn!(driver = %self.driver.name, target = %req.target.display(), error = %e, "fsGroup not given");
        }
        Ok(())
    }

    /// `unmount <target>`, then removes the target if the driver left it. A missing target is
    /// already done.
    async fn unpublish(&self, req: &UnpublishRequest<'_>) -> PluginResult<()> {
        let root = self.host.paths.open_root()?;
        if !reached(&root, req.target)? || !exists(req.target)? {
            return Ok(());
        }
        let args = vec![path_arg(req.target)?];
        if self.run(Command::Unmount, &args).await?.is_none() {
            unmount_and_remove_target(self.host.mounter.as_ref(), &root, req.target)?;
        }
        remove_empty(&root, req.target)
    }
}

#[async_trait]
impl ControllerExpander for FlexVolumePlugin {
    /// `expandvolume <json> <deviceMountPath> <new> <old>`; the new size either way (upstream
    /// ignores the driver's `volumeNewSize`).
    async fn expand(&self, spec: &VolumeSpec, new_size: u64, old_size: u64) -> PluginResult<u64> {
        let args = vec![
            self.spec_json(spec, Options::new())?,
            path_arg(&self.device_mount_path(spec)?)?,
            new_size.to_string(),
            old_size.to_string(),
        ];
        self.run(Command::ExpandVolume, &args).await?;
        Ok(new_size)
    }

    fn requires_node_expansion(&self) -> bool {
        self.capabilities.requires_fs_resize
    }
}

#[async_trait]
impl NodeExpander for FlexVolumePlugin {
    /// [`FlexVolumePlugin::expand_fs`].
    async fn expand_on_node(
        &self,
        spec: &VolumeSpec,
        device_path: Option<&str>,
        mount_path: &Path,
        new_size: u64,
        old_size: u64,
    ) -> PluginResult<()> {
        self.expand_fs(spec, device_path, mount_path, new_size, old_size).await
    }
}
