//! The CSI volume plugin: one per registered driver, turning kvol's lifecycle calls into the CSI RPCs upstream kubelet makes.
//!
//! | lifecycle call | RPC | notes |
//! |---|---|---|
//! | attach | `ControllerPublishVolume` | node-driven (standalone mode), only when the controller has `PUBLISH_UNPUBLISH_VOLUME`; otherwise a no-op, as upstream's external-attacher |
//! | detach | `ControllerUnpublishVolume` | same condition |
//! | attach, cluster mode | none | waits for the VolumeAttachment the attach/detach controller makes ([`crate::attachment`]); detach only forgets |
//! | stage | `NodeStageVolume` | only offered when the node has `STAGE_UNSTAGE_VOLUME` |
//! | unstage | `NodeUnstageVolume` | |
//! | publish | `NodePublishVolume` | target `<volume dir>/mount`, staging path when staged |
//! | unpublish | `NodeUnpublishVolume` | |
//! | expand on node | `NodeExpandVolume` | only offered when the node has `EXPAND_VOLUME` |
//!
//! The CSIDriver object is read at every call through [`NodeObjects`], so a changed
//! `attachRequired`, `podInfoOnMount`, `volumeLifecycleModes` or `fsGroupPolicy` applies
//! without registering the driver again.
//!
//! **Publish context.** Upstream keeps what ControllerPublishVolume returns in the
//! VolumeAttachment's `attachmentMetadata` and reads it back for NodeStage and NodePublish.
//! kvol's attacher returns it as the device path, a JSON object of strings (`{"lun":"3"}`),
//! and also records it in `attachment.json` in the volume's node-global directory (see
//! [`crate::paths`]). Stage and publish take it from the device path they are given, else from
//! that record, else send none (a driver that needs no attach).
//!
//! **Paths.** `PublishRequest::target` and `UnpublishRequest::target` are the pod's volume
//! directory; the driver's target path is `<target>/mount` and `vol_data.json` lies next to it.
//! [`CsiPlugin::pod_volume_dir`] gives upstream's directory
//! (`<root>/pods/<uid>/volumes/kubernetes.io~csi/<volume name>`). The plugin never mounts:
//! the driver does. It creates the directories upstream creates, removes only empty ones, and
//! refuses to remove a path that is still mounted or not empty after the driver's RPC.
//!
//! **Block.** A Block spec (`volumeMode: Block`) is staged at
//! `volumeDevices/staging/<spec name>` and published to the file
//! `volumeDevices/publish/<spec name>/<pod uid>` with a block capability; the target the agent
//! gives is then the pod device link, and [`kvol_plugin::block`] maps the published file into
//! the pod. Its `vol_data.json` lies in `volumeDevices/<spec name>/data` (see [`crate::paths`]).
//!
//! **fsGroup.** A driver with `VOLUME_MOUNT_GROUP` gets the pod's fsGroup in the capability
//! and applies it. Otherwise, when [`applies_fs_group`] says so, kvol applies it after
//! NodePublishVolume as upstream's `SetVolumeOwnership` does: group set on every file and
//! directory, `g+rw` (`g+rwx` and setgid on directories), symlinks left alone.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CSIVolumeSource, PersistentVolumeSpec, Secret, SecretReference,
};
use kvol_plugin::beneath;
use kvol_plugin::local::{create_dir_all, is_mounted};
use kvol_plugin::plugin::{
    Attacher, DeviceMounter, NodeExpander, PodInfo, PublishRequest, StatsReader, StatsRequest,
    UnpublishRequest, VolumeMounter, VolumeStats,
};
use kvol_plugin::{
    AccessMode, PluginError, PluginHost, PluginKind, SourceKey, SpecSource, VolumePlugin, VolumeSpec,
};

use crate::attachment::{AttachmentSource, AttachmentState, attachment_state, wait_for_attachment};
use crate::client::{ControllerCapabilities, CsiClient, NodeCapabilities, path_field};
use crate::error::CsiError;
use crate::objects::NodeObjects;
use crate::paths::{
    self, AttachmentRecord, SecretName, VolData, attachment_id, load_attachment, load_vol_data,
    remove_attachment, remove_dir_if_empty, remove_vol_data, save_attachment, save_vol_data,
};
use crate::policy::{
    DriverPolicy, LifecycleMode, access_mode, applies_fs_group, check_lifecycle_mode,
    ephemeral_volume_handle, parse_publish_context, publish_context_device_path, volume_capability,
    volume_context,
};
use crate::proto::csi::{
    CapacityRange, ControllerPublishVolumeRequest, NodeExpandVolumeRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, VolumeCapability,
};
use crate::tokens::{SERVICE_ACCOUNT_TOKENS_KEY, TokenSource, tokens_value};

type PluginResult<T> = kvol_plugin::Result<T>;

/// Mode of the directories kvol creates (upstream's `MkdirAll(…, 0750)`).
const DIR_MODE: u32 = 0o750;
/// Separates driver and volume handle in a volume name (upstream's `volNameSep`).
const VOLUME_NAME_SEPARATOR: char = '^';

/// What the driver's Node and Controller services offer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCapabilities {
    pub node: NodeCapabilities,
    pub controller: ControllerCapabilities,
}

/// A registered CSI driver as a volume plugin.
#[derive(Debug)]
pub struct CsiPlugin {
    driver: String,
    client: CsiClient,
    host: PluginHost,
    objects: Arc<dyn NodeObjects>,
    node_id: String,
    capabilities: DriverCapabilities,
    /// The CSI version the driver registered with, when it came through registration.
    version: Option<String>,
    /// Cluster mode: the VolumeAttachments the attach/detach controller makes; the node then
    /// never calls ControllerPublishVolume or ControllerUnpublishVolume. `None`: node-driven.
    attachments: Option<Arc<dyn AttachmentSource>>,
    /// Cluster mode: mints the service-account tokens a CSIDriver's `tokenRequests` asks for.
    /// `None` (standalone): a driver asking for tokens cannot publish.
    tokens: Option<Arc<dyn TokenSource>>,
}

/// The CSI source of a spec of this driver.
#[derive(Clone, Copy, Debug)]
enum Source<'a> {
    Persistent { pv: &'a PersistentVolumeSpec, csi: &'a CSIPersistentVolumeSource },
    Ephemeral { csi: &'a CSIVolumeSource },
}

impl Source<'_> {
    fn mode(&self) -> LifecycleMode {
        LifecycleMode::of_inline(matches!(self, Source::Ephemeral { .. }))
    }
}

impl CsiPlugin {
    /// A plugin for `driver_name`, reached through `client`, whose node ID is `node_id` (from
    /// NodeGetInfo). It knows no capabilities yet: add them with
    /// [`CsiPlugin::with_capabilities`], or build the plugin with [`CsiPlugin::connect`].
    pub fn new(
        driver_name: impl Into<String>,
        client: CsiClient,
        host: PluginHost,
        objects: Arc<dyn NodeObjects>,
        node_id: impl Into<String>,
    ) -> CsiPlugin {
        CsiPlugin {
            driver: driver_name.into(),
            client,
            host,
            objects,
            node_id: node_id.into(),
            capabilities: DriverCapabilities::default(),
            version: None,
            attachments: None,
            tokens: None,
        }
    }

    /// The same plugin handing drivers whose CSIDriver lists `tokenRequests` the pod's
    /// service-account tokens, minted by `tokens`.
    pub fn with_tokens(mut self, tokens: Option<Arc<dyn TokenSource>>) -> CsiPlugin {
        self.tokens = tokens;
        self
    }

    /// The same plugin attaching the cluster's way: it waits for the VolumeAttachments
    /// `attachments` reads instead of attaching and detaching itself.
    pub fn with_attachments(mut self, attachments: Option<Arc<dyn AttachmentSource>>) -> CsiPlugin {
        self.attachments = attachments;
        self
    }

    /// The same plugin, noting the CSI version it registered with (shown by `kvol plugins`).
    pub fn with_version(mut self, version: impl Into<String>) -> CsiPlugin {
        self.version = Some(version.into());
        self
    }

    /// The same plugin, with the driver's capabilities.
    pub fn with_capabilities(mut self, capabilities: DriverCapabilities) -> CsiPlugin {
        self.capabilities = capabilities;
        self
    }

    /// Asks the driver for its Node and Controller capabilities, then builds the plugin.
    pub async fn connect(
        driver_name: impl Into<String>,
        client: CsiClient,
        host: PluginHost,
        objects: Arc<dyn NodeObjects>,
        node_id: impl Into<String>,
    ) -> Result<CsiPlugin, CsiError> {
        let node = client.node_get_capabilities().await?;
        let controller = client.controller_get_capabilities().await?;
        let plugin = CsiPlugin::new(driver_name, client, host, objects, node_id);
        tracing::info!(driver = %plugin.driver, ?node, ?controller, "csi driver capabilities");
        Ok(plugin.with_capabilities(DriverCapabilities { node, controller }))
    }

    pub fn driver(&self) -> &str {
        &self.driver
    }

    pub fn client(&self) -> &CsiClient {
        &self.client
    }

    pub fn host(&self) -> &PluginHost {
        &self.host
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn driver_capabilities(&self) -> DriverCapabilities {
        self.capabilities
    }

    /// The driver's CSIDriver policy as it is now.
    pub fn policy(&self) -> DriverPolicy {
        DriverPolicy::from_object(self.objects.csi_driver(&self.driver).as_ref())
    }

    /// Where a volume of this driver is staged.
    pub fn stage_path(&self, volume_handle: &str) -> PathBuf {
        paths::stage_path(&self.host.paths, &self.driver, volume_handle)
    }

    /// Where NodePublishVolume put the volume kvol published at `target`: a raw block volume's
    /// publish file (`…/volumeDevices/publish/<spec>/<pod uid>`) for a pod device path, else
    /// `<pod volume directory>/mount`.
    fn published_path(&self, spec: &VolumeSpec, target: &Path) -> PathBuf {
        match kvol_plugin::block::PodDevice::parse(target) {
            Some(device) => paths::block_publish_dir(&self.host.paths, spec.name()).join(device.pod_uid),
            None => paths::publish_path(target),
        }
    }

    /// Where a spec is staged: the block stage path for a Block spec, else the filesystem one.
    fn stage_path_of(&self, spec: &VolumeSpec, volume_handle: &str) -> PathBuf {
        if spec.is_block() {
            return paths::block_stage_path(&self.host.paths, spec.name());
        }
        self.stage_path(volume_handle)
    }

    /// The directory holding the `vol_data.json` of a stage path: the block volume's record
    /// directory, or the stage path's parent.
    fn stage_record_dir(&self, staging_path: &Path) -> Option<PathBuf> {
        match paths::block_spec_of_stage_path(staging_path) {
            Some(spec_name) => Some(paths::block_data_dir(&self.host.paths, spec_name)),
            None => staging_path.parent().map(Path::to_path_buf),
        }
    }

    /// Upstream's pod directory for a CSI volume: the `target` to publish to.
    pub fn pod_volume_dir(&self, pod_uid: &str, volume_name: &str) -> PluginResult<PathBuf> {
        paths::pod_volume_dir(&self.host.paths, pod_uid, volume_name)
    }

    /// The spec's CSI source, which must name this driver.
    fn source<'a>(&self, spec: &'a VolumeSpec) -> PluginResult<Source<'a>> {
        let (driver, source) = match &spec.source {
            SpecSource::Persistent(pv) => {
                let pv = pv.spec.as_ref().ok_or_else(|| PluginError::invalid(spec, "it has no spec"))?;
                let csi =
                    pv.csi.as_ref().ok_or_else(|| PluginError::invalid(spec, "it is not a CSI volume"))?;
                (&csi.driver, Source::Persistent { pv, csi })
            }
            SpecSource::Inline { volume, .. } => {
                let csi = volume
                    .csi
                    .as_ref()
                    .ok_or_else(|| PluginError::invalid(spec, "it is not a CSI volume"))?;
                (&csi.driver, Source::Ephemeral { csi })
            }
        };
        if *driver != self.driver {
            let reason = format!("it names csi driver {driver:?}, not {:?}", self.driver);
            return Err(PluginError::invalid(spec, reason));
        }
        Ok(source)
    }

    /// The spec's persistent CSI source; `what` names the operation that needs one.
    fn persistent<'a>(
        &self,
        spec: &'a VolumeSpec,
        what: &str,
    ) -> PluginResult<(&'a PersistentVolumeSpec, &'a CSIPersistentVolumeSource)> {
        match self.source(spec)? {
            Source::Persistent { pv, csi } => Ok((pv, csi)),
            Source::Ephemeral { .. } => Err(PluginError::invalid(
                spec,
                format!("ephemeral inline csi volumes are only published, never {what}"),
            )),
        }
    }

    /// NodeUnstageVolume of the volume staged at `staging_path`: by the journal's record
    /// (`journal`) first, the staging directory's `vol_data.json` second, so a lost, empty or
    /// corrupt file does not leave a staging mount behind for good.
    async fn unstage_volume(&self, staging_path: &Path, journal: Option<&VolumeSpec>) -> PluginResult<()> {
        let Some(dir) = self.stage_record_dir(staging_path) else { return Ok(()) };
        let dir = dir.as_path();
        if !self.reach(&self.host.paths.open_root()?, staging_path)? {
            tracing::debug!(driver = %self.driver, path = %staging_path.display(), "nothing to unstage");
            return Ok(());
        }
        let journal_handle = journal.and_then(|spec| match self.source(spec).ok()? {
            Source::Persistent { csi, .. } => Some(csi.volume_handle.clone()),
            Source::Ephemeral { .. } => None,
        });
        let handle = match (journal_handle, local(load_vol_data(dir))) {
            (Some(handle), on_disk) => {
                if let Ok(Some(record)) = &on_disk {
                    self.check_record_driver(&record.driver_name, dir)?;
                } else {
                    tracing::info!(driver = %self.driver, path = %staging_path.display(), "staging record unusable; unstaging by the journal's record");
                }
                handle
            }
            (None, Ok(Some(record))) => {
                self.check_record_driver(&record.driver_name, dir)?;
                record.volume_handle
            }
            (None, Ok(None)) => {
                tracing::debug!(
                    driver = %self.driver, path = %staging_path.display(),
                    "nothing to unstage: no volume record"
                );
                return Ok(());
            }
            (None, Err(e)) => return Err(e),
        };
        if self.capabilities.node.stage_unstage {
            tracing::info!(
                driver = %self.driver, volume = %handle, staging = %staging_path.display(),
                "NodeUnstageVolume"
            );
            already_gone(self.client.node_unstage(&handle, staging_path).await, &self.driver)?;
        }
        self.remove_driver_dir(staging_path, "NodeUnstageVolume")?;
        local(remove_vol_data(dir))?;
        // The attach record, if any, keeps the directory until detach.
        local(remove_dir_if_empty(dir))?;
        if let Some(spec_name) = paths::block_spec_of_stage_path(staging_path) {
            self.remove_block_dirs(spec_name)?;
        }
        Ok(())
    }

    /// The volume handle of an unpublish's journal record (a persistent volume's, or the
    /// ephemeral handle of an inline one); `None` without a record of this driver's.
    fn journal_handle(&self, req: &UnpublishRequest<'_>) -> Option<String> {
        let spec = req.spec?;
        match self.source(spec).ok()? {
            Source::Persistent { csi, .. } => Some(csi.volume_handle.clone()),
            Source::Ephemeral { .. } => Some(ephemeral_volume_handle(req.pod_uid, spec.name())),
        }
    }

    /// The values of the Secret `namespace/name`, which `field` of the volume references.
    fn secret(&self, field: &str, namespace: &str, name: &str) -> Result<BTreeMap<String, String>, CsiError> {
        let refused = |why: String| CsiError::Driver {
            driver: self.driver.clone(),
            reason: format!("cannot read {field} secret {namespace}/{name}: {why}"),
        };
        let secret = self
            .host
            .secrets
            .get(namespace, name)
            .ok_or_else(|| refused("there is no such secret".into()))?;
        secret_values(&secret).map_err(refused)
    }

    /// The values of the Secret a PV's `field` references; none when it references none.
    fn pv_secret(
        &self,
        spec: &VolumeSpec,
        field: &str,
        reference: Option<&SecretReference>,
    ) -> PluginResult<BTreeMap<String, String>> {
        match secret_name(spec, field, reference)? {
            Some(name) => Ok(self.secret(field, &name.namespace, &name.name)?),
            None => Ok(BTreeMap::new()),
        }
    }

    /// The publish context for a volume: from the device path, else from the attach record,
    /// else none.
    fn publish_context(
        &self,
        device_path: Option<&str>,
        volume_handle: &str,
    ) -> PluginResult<BTreeMap<String, String>> {
        match parse_publish_context(device_path) {
            Ok(Some(context)) => Ok(context),
            Ok(None) => {
                let dir = paths::volume_dir(&self.host.paths, &self.driver, volume_handle);
                Ok(local(load_attachment(&dir))?.map(|r| r.publish_context).unwrap_or_default())
            }
            Err(reason) => Err(CsiError::Driver { driver: self.driver.clone(), reason }.into()),
        }
    }

    /// The capability of a persistent volume: its first access mode, fsType and mount options.
    fn pv_capability(
        &self,
        pv: &PersistentVolumeSpec,
        csi: &CSIPersistentVolumeSource,
        extra_mount_options: &[String],
        volume_mount_group: Option<i64>,
    ) -> VolumeCapability {
        let modes = pv.access_modes.as_deref().unwrap_or_default();
        let mode = access_mode(modes, self.capabilities.node.single_node_multi_writer);
        let mut flags = pv.mount_options.clone().unwrap_or_default();
        for option in extra_mount_options {
            if !flags.contains(option) {
                flags.push(option.clone());
            }
        }
        let block = pv.volume_mode.as_deref() == Some("Block");
        volume_capability(mode, block, csi.fs_type.as_deref().unwrap_or_default(), &flags, volume_mount_group)
    }

    /// Takes down a directory the driver was given (stage or publish target) once its RPC
    /// returned: refused while something is mounted there or it is not empty.
    fn remove_driver_dir(&self, path: &Path, rpc: &str) -> PluginResult<()> {
        let root = self.host.paths.open_root()?;
        if fs::symlink_metadata(path).is_err() || !self.reach(&root, path)? {
            return Ok(());
        }
        if is_mounted(self.host.mounter.as_ref(), path)? {
            return Err(CsiError::Driver {
                driver: self.driver.clone(),
                reason: format!("{} is still mounted after {rpc}; kvol leaves it in place", path.display()),
            }
            .into());
        }
        match root.remove_if_empty(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => Err(CsiError::Driver {
                driver: self.driver.clone(),
                reason: format!(
                    "{} is not empty after {rpc}; kvol never deletes data, so it is left in place",
                    path.display()
                ),
            }
            .into()),
            Err(e) => Err(PluginError::io("remove", path, e)),
        }
    }

    /// Whether `path`'s directory is reached from the kubelet root without a symlink: `false`
    /// when it does not exist, an error naming the path when a symlink (or another escape) is
    /// on the way. Records are read and directories removed only after this check.
    fn reach(&self, root: &beneath::Root, path: &Path) -> PluginResult<bool> {
        root.parent_exists(path).map_err(|e| PluginError::io("reach", path, e))
    }

    /// Undoes what a stage or publish set up before its RPC failed for good: the driver's
    /// directory if empty, the volume record, the record's directory if empty.
    fn clean_up_after_failure(&self, driver_dir: &Path, record_dir: &Path) {
        let cleaned = self
            .remove_driver_dir(driver_dir, "a failed call")
            .and_then(|()| local(remove_vol_data(record_dir)))
            .and_then(|()| Ok(remove_dir_if_empty(record_dir).map(drop)?));
        if let Err(e) = cleaned {
            tracing::warn!(
                driver = %self.driver, dir = %record_dir.display(),
                "cleanup after a failed call: {e}"
            );
        }
    }

    fn own_node(&self, node: &str, what: &str) -> PluginResult<()> {
        if node == self.host.node.name {
            return Ok(());
        }
        Err(CsiError::Policy {
            driver: self.driver.clone(),
            reason: format!(
                "cannot {what} node {node:?}: kvol attaches volumes only to its own node {:?}",
                self.host.node.name
            ),
        }
        .into())
    }

    /// The volume context of a NodePublishVolume: the volume's attributes, the pod's
    /// information when the CSIDriver asks for it, and the pod's service-account tokens when it
    /// lists `tokenRequests` (minted on every publish, so a driver that `requiresRepublish`
    /// gets fresh ones, as kubelet does).
    async fn publish_volume_context(
        &self,
        attributes: Option<&BTreeMap<String, String>>,
        pod: &PodInfo,
        policy: &DriverPolicy,
        mode: LifecycleMode,
    ) -> PluginResult<std::collections::HashMap<String, String>> {
        let mut context = volume_context(attributes, pod, policy, mode);
        if !policy.token_requests.is_empty() {
            let Some(source) = &self.tokens else {
                return Err(CsiError::Policy {
                    driver: self.driver.clone(),
                    reason: "its csidriver asks for service-account tokens (tokenRequests), and a node \
                             without an api server (standalone mode) cannot mint them"
                        .into(),
                }
                .into());
            };
            let mut tokens = BTreeMap::new();
            for request in &policy.token_requests {
                let token = source.token(pod, request).await.map_err(|reason| CsiError::Driver {
                    driver: self.driver.clone(),
                    reason: format!(
                        "cannot get a service-account token for audience {:?} of pod {}/{}: {reason}",
                        request.audience, pod.namespace, pod.name
                    ),
                })?;
                tokens.insert(request.audience.clone(), token);
            }
            context.insert(SERVICE_ACCOUNT_TOKENS_KEY.to_string(), tokens_value(&tokens));
        }
        Ok(context.into_iter().collect())
    }

    async fn publish_volume(&self, req: &PublishRequest<'_>) -> PluginResult<()> {
        let spec = req.spec;
        let source = self.source(spec)?;
        let policy = self.policy();
        let mode = source.mode();
        check_lifecycle_mode(&self.driver, &policy, mode).map_err(CsiError::from)?;
        let node_caps = self.capabilities.node;
        let volume_mount_group = if node_caps.volume_mount_group { req.pod.fs_group } else { None };

        let plan = match source {
            Source::Persistent { pv, csi } => {
                let staging = node_caps.stage_unstage.then(|| {
                    req.staging_path
                        .map_or_else(|| self.stage_path_of(spec, &csi.volume_handle), Path::to_path_buf)
                });
                Publish {
                    handle: csi.volume_handle.clone(),
                    staging,
                    context: self.publish_context(req.device_path, &csi.volume_handle)?,
                    secrets: self.pv_secret(
                        spec,
                        "nodePublishSecretRef",
                        csi.node_publish_secret_ref.as_ref(),
                    )?,
                    capability: self.pv_capability(pv, csi, req.mount_options, volume_mount_group),
                    attributes: csi.volume_attributes.as_ref(),
                    read_only: req.read_only || spec.read_only || csi.read_only.unwrap_or(false),
                    fs_type: csi.fs_type.as_deref().unwrap_or_default(),
                    access_modes: Some(pv.access_modes.as_deref().unwrap_or_default()),
                }
            }
            Source::Ephemeral { csi } => {
                let secrets = match &csi.node_publish_secret_ref {
                    Some(reference) => {
                        self.secret("nodePublishSecretRef", pod_namespace(req), &reference.name)?
                    }
                    None => BTreeMap::new(),
                };
                let fs_type = csi.fs_type.as_deref().unwrap_or_default();
                // Upstream publishes inline volumes ReadWriteOnce.
                let access = access_mode(&[], node_caps.single_node_multi_writer);
                Publish {
                    handle: ephemeral_volume_handle(&req.pod.uid, spec.name()),
                    staging: None,
                    context: BTreeMap::new(),
                    secrets,
                    capability: volume_capability(
                        access,
                        false,
                        fs_type,
                        req.mount_options,
                        volume_mount_group,
                    ),
                    attributes: csi.volume_attributes.as_ref(),
                    read_only: req.read_only || spec.read_only || csi.read_only.unwrap_or(false),
                    fs_type,
                    access_modes: None,
                }
            }
        };

        if kvol_plugin::block::PodDevice::parse(req.target).is_some() {
            return self.publish_block(req, plan, mode, &policy).await;
        }
        let dir = req.target;
        let target = paths::publish_path(dir);
        create_dir_all(&self.host.paths.open_root()?, dir, DIR_MODE)?;
        let node = &self.host.node.name;
        let record = VolData {
            driver_name: self.driver.clone(),
            volume_handle: plan.handle.clone(),
            spec_volume_id: spec.name().to_string(),
            node_name: node.clone(),
            attachment_id: attachment_id(&plan.handle, &self.driver, node),
            volume_lifecycle_mode: mode.as_str().to_string(),
        };
        local(save_vol_data(dir, &record))?;
        let request = NodePublishVolumeRequest {
            volume_id: plan.handle.clone(),
            publish_context: plan.context.into_iter().collect(),
            staging_target_path: plan.staging.as_deref().map(path_field).transpose()?.unwrap_or_default(),
            target_path: path_field(&target)?,
            volume_capability: Some(plan.capability),
            readonly: plan.read_only,
            secrets: plan.secrets.into_iter().collect(),
            volume_context: self.publish_volume_context(plan.attributes, req.pod, &policy, mode).await?,
        };
        tracing::info!(
            driver = %self.driver, volume = %plan.handle, target = %target.display(),
            "NodePublishVolume"
        );
        if let Err(e) = self.client.node_publish(request).await {
            // A final error means nothing is in progress: undo. Otherwise the driver may still
            // be publishing, and the record is what lets unpublish clean up later.
            if !e.is_retriable() {
                self.clean_up_after_failure(&target, dir);
            }
            return Err(with_ephemeral_hint(e, mode, &policy).into());
        }
        if let Some(group) = req.pod.fs_group
            && volume_mount_group.is_none()
            && applies_fs_group(policy.fs_group_policy, plan.fs_type, plan.access_modes, plan.read_only)
        {
            kvol_plugin::beneath::apply_pod_fs_group(
                &target,
                group,
                req.pod.fs_group_change_policy,
                plan.read_only,
            )?;
        }
        Ok(())
    }

    async fn unpublish_volume(&self, req: &UnpublishRequest<'_>) -> PluginResult<()> {
        if let Some(device) = kvol_plugin::block::PodDevice::parse(req.target) {
            return self.unpublish_block(req, &device).await;
        }
        let dir = req.target;
        let target = paths::publish_path(dir);
        if !self.reach(&self.host.paths.open_root()?, &target)? {
            tracing::debug!(driver = %self.driver, dir = %dir.display(), "nothing to unpublish");
            return Ok(());
        }
        // The journal first (the agent's record of what it published), `vol_data.json` second:
        // a lost, empty or corrupt file does not leave the volume mounted for good.
        let handle = match (self.journal_handle(req), local(load_vol_data(dir))) {
            (Some(handle), on_disk) => {
                let problem = match &on_disk {
                    Err(e) => Some(e.to_string()),
                    Ok(None) => Some(format!("{} is missing", dir.join(paths::VOL_DATA_FILE).display())),
                    Ok(Some(r)) => self.check_record_driver(&r.driver_name, dir).err().map(|e| e.to_string()),
                };
                if let Some(problem) = problem {
                    tracing::info!(driver = %self.driver, dir = %dir.display(), %problem, "unpublishing by the journal's record");
                }
                handle
            }
            (None, Ok(Some(record))) => {
                self.check_record_driver(&record.driver_name, dir)?;
                record.volume_handle
            }
            (None, Ok(None)) => {
                if fs::symlink_metadata(&target).is_ok() {
                    return Err(CsiError::Driver {
                        driver: self.driver.clone(),
                        reason: format!(
                            "cannot unpublish {}: {} is missing, so the volume handle is unknown (no record of the agent names it either)",
                            target.display(),
                            dir.join(paths::VOL_DATA_FILE).display()
                        ),
                    }
                    .into());
                }
                tracing::debug!(driver = %self.driver, dir = %dir.display(), "nothing to unpublish");
                return Ok(());
            }
            (None, Err(e)) => return Err(e),
        };
        tracing::info!(
            driver = %self.driver, volume = %handle, target = %target.display(),
            "NodeUnpublishVolume"
        );
        already_gone(self.client.node_unpublish(&handle, &target).await, &self.driver)?;
        self.remove_driver_dir(&target, "NodeUnpublishVolume")?;
        local(remove_vol_data(dir))?;
        if !local(remove_dir_if_empty(dir))? && fs::symlink_metadata(dir).is_ok() {
            tracing::warn!(
                driver = %self.driver, dir = %dir.display(),
                "pod volume directory not empty; kept"
            );
        }
        Ok(())
    }

    /// A block publish (`csi_block.go`'s MapPodDevice): `vol_data.json` in the volume's record
    /// directory, NodePublishVolume to the publish file
    /// `volumeDevices/publish/<spec name>/<pod uid>` (its directory created, the file left to
    /// the driver, as the CSI spec says), then the device mapped into the pod
    /// ([`kvol_plugin::block::map_device`]).
    async fn publish_block(
        &self,
        req: &PublishRequest<'_>,
        plan: Publish<'_>,
        mode: LifecycleMode,
        policy: &DriverPolicy,
    ) -> PluginResult<()> {
        let spec_name = req.spec.name();
        let root = self.host.paths.open_root()?;
        let data = paths::block_data_dir(&self.host.paths, spec_name);
        let publish_dir = paths::block_publish_dir(&self.host.paths, spec_name);
        let target = publish_dir.join(&req.pod.uid);
        create_dir_all(&root, &data, DIR_MODE)?;
        create_dir_all(&root, &publish_dir, DIR_MODE)?;
        let node = &self.host.node.name;
        let record = VolData {
            driver_name: self.driver.clone(),
            volume_handle: plan.handle.clone(),
            spec_volume_id: spec_name.to_string(),
            node_name: node.clone(),
            attachment_id: attachment_id(&plan.handle, &self.driver, node),
            volume_lifecycle_mode: mode.as_str().to_string(),
        };
        local(save_vol_data(&data, &record))?;
        let request = NodePublishVolumeRequest {
            volume_id: plan.handle.clone(),
            publish_context: plan.context.into_iter().collect(),
            staging_target_path: plan.staging.as_deref().map(path_field).transpose()?.unwrap_or_default(),
            target_path: path_field(&target)?,
            volume_capability: Some(plan.capability),
            readonly: plan.read_only,
            secrets: plan.secrets.into_iter().collect(),
            volume_context: self.publish_volume_context(plan.attributes, req.pod, policy, mode).await?,
        };
        tracing::info!(
            driver = %self.driver, volume = %plan.handle, target = %target.display(),
            "NodePublishVolume (block)"
        );
        self.client.node_publish(request).await?;
        kvol_plugin::block::map_device(&self.host.paths, self.host.mounter.as_ref(), req.target, &target)
    }

    /// A block unpublish: the pod's mapping taken down, NodeUnpublishVolume of the publish
    /// file, the file (if the driver left it) and the directories left empty.
    async fn unpublish_block(
        &self,
        req: &UnpublishRequest<'_>,
        device: &kvol_plugin::block::PodDevice,
    ) -> PluginResult<()> {
        kvol_plugin::block::unmap_device(&self.host.paths, self.host.mounter.as_ref(), req.target)?;
        let data = paths::block_data_dir(&self.host.paths, &device.spec_name);
        let target = paths::block_publish_dir(&self.host.paths, &device.spec_name).join(&device.pod_uid);
        let root = self.host.paths.open_root()?;
        if !self.reach(&root, &data)? {
            return Ok(());
        }
        let Some(record) = local(load_vol_data(&data))? else {
            if fs::symlink_metadata(&target).is_ok() {
                return Err(CsiError::Driver {
                    driver: self.driver.clone(),
                    reason: format!(
                        "cannot unpublish {}: {} is missing, so the volume handle is unknown",
                        target.display(),
                        data.join(paths::VOL_DATA_FILE).display()
                    ),
                }
                .into());
            }
            return Ok(());
        };
        self.check_record_driver(&record.driver_name, &data)?;
        tracing::info!(
            driver = %self.driver, volume = %record.volume_handle, target = %target.display(),
            "NodeUnpublishVolume (block)"
        );
        already_gone(self.client.node_unpublish(&record.volume_handle, &target).await, &self.driver)?;
        self.remove_driver_dir(&target, "NodeUnpublishVolume")?;
        let staged =
            fs::symlink_metadata(paths::block_stage_path(&self.host.paths, &device.spec_name)).is_ok();
        let published_elsewhere = fs::read_dir(target.parent().expect("a publish file has a directory"))
            .is_ok_and(|mut entries| entries.next().is_some());
        if !staged && !published_elsewhere {
            local(remove_vol_data(&data))?;
            self.remove_block_dirs(&device.spec_name)?;
        }
        Ok(())
    }

    /// The block volume's directories that are left empty: its record directory, its publish
    /// directory and its directory under `volumeDevices`.
    fn remove_block_dirs(&self, spec_name: &str) -> PluginResult<()> {
        let data = paths::block_data_dir(&self.host.paths, spec_name);
        local(remove_dir_if_empty(&data))?;
        local(remove_dir_if_empty(&paths::block_publish_dir(&self.host.paths, spec_name)))?;
        if let Some(volume_dir) = data.parent() {
            local(remove_dir_if_empty(volume_dir))?;
        }
        Ok(())
    }

    fn check_record_driver(&self, driver: &str, dir: &Path) -> PluginResult<()> {
        if driver == self.driver {
            return Ok(());
        }
        Err(CsiError::Driver {
            driver: self.driver.clone(),
            reason: format!(
                "{} belongs to csi driver {driver:?}, not to this one",
                dir.join(paths::VOL_DATA_FILE).display()
            ),
        }
        .into())
    }
}

/// Everything one NodePublishVolume sends, and what fsGroup needs afterwards.
struct Publish<'a> {
    handle: String,
    staging: Option<PathBuf>,
    context: BTreeMap<String, String>,
    secrets: BTreeMap<String, String>,
    capability: VolumeCapability,
    attributes: Option<&'a BTreeMap<String, String>>,
    read_only: bool,
    fs_type: &'a str,
    access_modes: Option<&'a [String]>,
}

/// An error of kvol's own files as the plugin host's I/O error (it names the path, not the
/// driver); other CSI errors as driver errors.
fn local<T>(result: Result<T, CsiError>) -> PluginResult<T> {
    result.map_err(|e| match e {
        CsiError::Io { op, path, source } => PluginError::Io { op, path, source },
        other => other.into(),
    })
}

/// The namespace an inline volume's Secret is read from: the pod's.
fn pod_namespace<'a>(req: &'a PublishRequest<'_>) -> &'a str {
    match &req.spec.source {
        SpecSource::Inline { pod_namespace, .. } if req.pod.namespace.is_empty() => pod_namespace,
        _ => &req.pod.namespace,
    }
}

/// The Secret a PV field references: `None` for no reference; a reference without a namespace
/// is an error (the API requires one).
fn secret_name(
    spec: &VolumeSpec,
    field: &str,
    reference: Option<&SecretReference>,
) -> PluginResult<Option<SecretName>> {
    let Some(reference) = reference else { return Ok(None) };
    let name = reference.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Ok(None);
    }
    match reference.namespace.as_deref() {
        Some(namespace) if !namespace.is_empty() => {
            Ok(Some(SecretName { namespace: namespace.to_string(), name }))
        }
        _ => Err(PluginError::invalid(spec, format!("its {field} names secret {name:?} but no namespace"))),
    }
}

/// A Secret's values as CSI secrets: `data` decoded as UTF-8, then `stringData` over it.
fn secret_values(secret: &Secret) -> Result<BTreeMap<String, String>, String> {
    let mut values = BTreeMap::new();
    for (key, value) in secret.data.iter().flatten() {
        let text = String::from_utf8(value.0.clone())
            .map_err(|_| format!("the value of key {key:?} is not UTF-8"))?;
        values.insert(key.clone(), text);
    }
    for (key, value) in secret.string_data.iter().flatten() {
        values.insert(key.clone(), value.clone());
    }
    Ok(values)
}

impl VolumePlugin for CsiPlugin {
    fn name(&self) -> &str {
        &self.driver
    }

    fn kind(&self) -> PluginKind {
        PluginKind::Csi
    }

    fn serves(&self) -> Vec<SourceKey<'_>> {
        vec![SourceKey::Csi(&self.driver)]
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        spec.csi_driver() == Some(self.driver.as_str())
    }

    fn access_modes(&self) -> Vec<AccessMode> {
        vec![
            AccessMode::ReadWriteOnce,
            AccessMode::ReadOnlyMany,
            AccessMode::ReadWriteMany,
            AccessMode::ReadWriteOncePod,
        ]
    }

    fn is_persistent(&self) -> bool {
        true
    }

    /// Block volumes go to the driver with a block capability; whether it serves them is the
    /// driver's answer.
    fn supports_block(&self, _spec: &VolumeSpec) -> bool {
        true
    }

    fn pod_dir_plugin_name(&self) -> &str {
        crate::paths::CSI_PLUGIN_NAME
    }

    fn details(&self) -> Vec<(String, String)> {
        let policy = self.policy();
        let node = self.capabilities.node;
        let node_caps = [
            (node.stage_unstage, "STAGE_UNSTAGE_VOLUME"),
            (node.expand, "EXPAND_VOLUME"),
            (node.get_volume_stats, "GET_VOLUME_STATS"),
            (node.single_node_multi_writer, "SINGLE_NODE_MULTI_WRITER"),
            (node.volume_mount_group, "VOLUME_MOUNT_GROUP"),
        ];
        let node_caps: Vec<&str> = node_caps.iter().filter(|(on, _)| *on).map(|(_, n)| *n).collect();
        let csidriver = if policy.has_object {
            let modes: Vec<String> = policy.lifecycle_modes.iter().map(|m| format!("{m:?}")).collect();
            format!(
                "attachRequired={} podInfoOnMount={} volumeLifecycleModes=[{}] fsGroupPolicy={:?} requiresRepublish={}",
                policy.attach_required,
                policy.pod_info_on_mount,
                modes.join(","),
                policy.fs_group_policy,
                policy.requires_republish
            )
        } else {
            "none (defaults: attachRequired=true, persistent volumes only)".to_string()
        };
        let mut details = vec![];
        if let Some(version) = &self.version {
            details.push(("version".to_string(), version.clone()));
        }
        details.extend([
            ("endpoint".to_string(), self.client.endpoint().display().to_string()),
            ("nodeID".to_string(), self.node_id.clone()),
            ("nodeCapabilities".to_string(), node_caps.join(",")),
            ("csiDriver".to_string(), csidriver),
        ]);
        details
    }

    /// `<driver>^<volume handle>` for a persistent volume (upstream's `GetVolumeName`); an
    /// inline volume has no handle before its pod is known, so it is `<driver>^<volume name>`.
    fn volume_name(&self, spec: &VolumeSpec) -> PluginResult<String> {
        match self.source(spec)? {
            Source::Persistent { csi, .. } => {
                Ok(format!("{}{VOLUME_NAME_SEPARATOR}{}", self.driver, csi.volume_handle))
            }
            Source::Ephemeral { .. } => Ok(format!("{}{VOLUME_NAME_SEPARATOR}{}", self.driver, spec.name())),
        }
    }

    /// The CSIDriver's `requiresRepublish`: NodePublishVolume is called again periodically
    /// for every volume of the driver (persistent or ephemeral).
    fn requires_remount(&self, _spec: &VolumeSpec) -> bool {
        self.policy().requires_republish
    }

    /// Persistent volumes need attaching unless the CSIDriver says `attachRequired: false`;
    /// ephemeral inline volumes never do.
    fn can_attach(&self, spec: &VolumeSpec) -> bool {
        matches!(self.source(spec), Ok(Source::Persistent { .. })) && self.policy().attach_required
    }

    /// Persistent volumes are staged when the node service has `STAGE_UNSTAGE_VOLUME`.
    fn can_device_mount(&self, spec: &VolumeSpec) -> bool {
        self.capabilities.node.stage_unstage && matches!(self.source(spec), Ok(Source::Persistent { .. }))
    }

    fn attacher(&self) -> Option<&dyn Attacher> {
        Some(self)
    }

    fn device_mounter(&self) -> Option<&dyn DeviceMounter> {
        self.capabilities.node.stage_unstage.then_some(self as &dyn DeviceMounter)
    }

    fn mounter(&self) -> Option<&dyn VolumeMounter> {
        Some(self)
    }

    /// Only a driver whose node service has `GET_VOLUME_STATS` is asked, as kubelet asks.
    fn stats_reader(&self) -> Option<&dyn StatsReader> {
        self.capabilities.node.get_volume_stats.then_some(self as &dyn StatsReader)
    }

    fn node_expander(&self) -> Option<&dyn NodeExpander> {
        self.capabilities.node.expand.then_some(self as &dyn NodeExpander)
    }
}

#[async_trait]
impl Attacher for CsiPlugin {
    /// `ControllerPublishVolume` to this node's driver node ID, when the controller offers
    /// `PUBLISH_UNPUBLISH_VOLUME`; the publish context as the device path (a JSON object).
    async fn attach(&self, spec: &VolumeSpec, node: &str) -> PluginResult<Option<String>> {
        let (pv, csi) = self.persistent(spec, "attached")?;
        self.own_node(node, "attach to")?;
        if self.attachments.is_some() {
            tracing::debug!(driver = %self.driver, volume = %csi.volume_handle, "cluster mode: the attach/detach controller attaches");
            return Ok(None);
        }
        if !self.capabilities.controller.publish_unpublish {
            tracing::debug!(driver = %self.driver, "no PUBLISH_UNPUBLISH_VOLUME: nothing to attach");
            return Ok(None);
        }
        let field = "controllerPublishSecretRef";
        let secret_ref = secret_name(spec, field, csi.controller_publish_secret_ref.as_ref())?;
        let secrets = match &secret_ref {
            Some(name) => self.secret(field, &name.namespace, &name.name)?,
            None => BTreeMap::new(),
        };
        let request = ControllerPublishVolumeRequest {
            volume_id: csi.volume_handle.clone(),
            node_id: self.node_id.clone(),
            volume_capability: Some(self.pv_capability(pv, csi, &[], None)),
            readonly: csi.read_only.unwrap_or(false),
            secrets: secrets.into_iter().collect(),
            volume_context: csi.volume_attributes.clone().unwrap_or_default().into_iter().collect(),
        };
        tracing::info!(
            driver = %self.driver, volume = %csi.volume_handle, node_id = %self.node_id,
            "ControllerPublishVolume"
        );
        let context = self.client.controller_publish(request).await?;
        let dir = paths::volume_dir(&self.host.paths, &self.driver, &csi.volume_handle);
        create_dir_all(&self.host.paths.open_root()?, &dir, DIR_MODE)?;
        let record = AttachmentRecord {
            driver_name: self.driver.clone(),
            volume_handle: csi.volume_handle.clone(),
            node_name: node.to_string(),
            node_id: self.node_id.clone(),
            attachment_id: attachment_id(&csi.volume_handle, &self.driver, node),
            publish_context: context.clone(),
            controller_publish_secret_ref: secret_ref,
        };
        local(save_attachment(&dir, &record))?;
        Ok(Some(publish_context_device_path(&context)))
    }

    /// Standalone: nothing to wait for, ControllerPublishVolume returned when the volume was
    /// attached; the device path given, else the recorded publish context. Cluster mode: waits
    /// up to `timeout` for the VolumeAttachment to be attached; its `attachmentMetadata` is the
    /// publish context, its `attachError` the error.
    async fn wait_for_attach(
        &self,
        spec: &VolumeSpec,
        device_path: Option<&str>,
        timeout: Duration,
    ) -> PluginResult<String> {
        if let Some(path) = device_path.filter(|p| !p.is_empty()) {
            return Ok(path.to_string());
        }
        let (_, csi) = self.persistent(spec, "attached")?;
        if let Some(source) = &self.attachments {
            let node = &self.host.node.name;
            let name = attachment_id(&csi.volume_handle, &self.driver, node);
            let context =
                wait_for_attachment(source.as_ref(), &name, &self.driver, &csi.volume_handle, node, timeout)
                    .await
                    .map_err(|reason| CsiError::Driver { driver: self.driver.clone(), reason })?;
            return Ok(publish_context_device_path(&context));
        }
        Ok(publish_context_device_path(&self.publish_context(None, &csi.volume_handle)?))
    }

    /// Attached when kvol's record says so, or when the controller has nothing to attach; in
    /// cluster mode when the VolumeAttachment says so.
    async fn is_attached(&self, spec: &VolumeSpec, node: &str) -> PluginResult<bool> {
        let (_, csi) = self.persistent(spec, "attached")?;
        if let Some(source) = &self.attachments {
            let name = attachment_id(&csi.volume_handle, &self.driver, node);
            let va = source
                .volume_attachment(&name)
                .await
                .map_err(|reason| CsiError::Driver { driver: self.driver.clone(), reason })?;
            let state = attachment_state(&name, va.as_ref(), &self.driver, &csi.volume_handle, node);
            return Ok(matches!(state, AttachmentState::Attached(_)));
        }
        if !self.capabilities.controller.publish_unpublish {
            return Ok(true);
        }
        let dir = paths::volume_dir(&self.host.paths, &self.driver, &csi.volume_handle);
        Ok(local(load_attachment(&dir))?
            .is_some_and(|r| r.node_name == node && r.volume_handle == csi.volume_handle))
    }

    /// `ControllerUnpublishVolume` of the volume named `<driver>^<handle>`, with the Secret
    /// the attach used; then the record goes.
    async fn detach(&self, volume_name: &str, node: &str) -> PluginResult<()> {
        let Some((driver, handle)) = volume_name.split_once(VOLUME_NAME_SEPARATOR) else {
            return Err(CsiError::Driver {
                driver: self.driver.clone(),
                reason: format!(
                    "cannot detach {volume_name:?}: it is not of the form <driver>^<volume handle>"
                ),
            }
            .into());
        };
        if driver != self.driver {
            return Err(CsiError::Driver {
                driver: self.driver.clone(),
                reason: format!("cannot detach {volume_name:?}: it belongs to csi driver {driver:?}"),
            }
            .into());
        }
        self.own_node(node, "detach from")?;
        let dir = paths::volume_dir(&self.host.paths, &self.driver, handle);
        let reached = self.reach(&self.host.paths.open_root()?, &dir.join(paths::ATTACHMENT_FILE))?;
        let record = if reached { local(load_attachment(&dir))? } else { None };
        if self.attachments.is_some() {
            tracing::debug!(driver = %self.driver, volume = %handle, "cluster mode: the attach/detach controller detaches");
        } else if self.capabilities.controller.publish_unpublish {
            let secrets = match record.as_ref().and_then(|r| r.controller_publish_secret_ref.as_ref()) {
                Some(name) => self.secret("controllerPublishSecretRef", &name.namespace, &name.name)?,
                None => BTreeMap::new(),
            };
            tracing::info!(
                driver = %self.driver, volume = %handle, node_id = %self.node_id,
                "ControllerUnpublishVolume"
            );
            self.client.controller_unpublish(handle, &self.node_id, secrets).await?;
        }
        if reached {
            local(remove_attachment(&dir))?;
            local(remove_dir_if_empty(&dir))?;
        }
        Ok(())
    }
}

#[async_trait]
impl DeviceMounter for CsiPlugin {
    fn device_mount_path(&self, spec: &VolumeSpec) -> PluginResult<PathBuf> {
        let (_, csi) = self.persistent(spec, "staged")?;
        Ok(self.stage_path_of(spec, &csi.volume_handle))
    }

    /// `NodeStageVolume` to `staging_path`, created (0750) with `vol_data.json` saved next to
    /// it before the call. A final error takes both away again; a retriable one leaves them
    /// for unstage.
    async fn stage(
        &self,
        spec: &VolumeSpec,
        device_path: Option<&str>,
        staging_path: &Path,
    ) -> PluginResult<()> {
        let (pv, csi) = self.persistent(spec, "staged")?;
        check_lifecycle_mode(&self.driver, &self.policy(), LifecycleMode::Persistent)
            .map_err(CsiError::from)?;
        if !self.capabilities.node.stage_unstage {
            return Err(PluginError::Unsupported {
                plugin: self.driver.clone(),
                what: "stage volumes: its node service lacks STAGE_UNSTAGE_VOLUME",
            });
        }
        let secrets = self.pv_secret(spec, "nodeStageSecretRef", csi.node_stage_secret_ref.as_ref())?;
        let context = self.publish_context(device_path, &csi.volume_handle)?;
        let dir = self.stage_record_dir(staging_path).ok_or_else(|| {
            PluginError::invalid(spec, format!("its staging path {} has no parent", staging_path.display()))
        })?;
        let dir = dir.as_path();
        let root = self.host.paths.open_root()?;
        create_dir_all(&root, staging_path, DIR_MODE)?;
        create_dir_all(&root, dir, DIR_MODE)?;
        let record = VolData {
            driver_name: self.driver.clone(),
            volume_handle: csi.volume_handle.clone(),
            ..VolData::default()
        };
        local(save_vol_data(dir, &record))?;
        let request = NodeStageVolumeRequest {
            volume_id: csi.volume_handle.clone(),
            publish_context: context.into_iter().collect(),
            staging_target_path: path_field(staging_path)?,
            volume_capability: Some(self.pv_capability(pv, csi, &[], None)),
            secrets: secrets.into_iter().collect(),
            volume_context: csi.volume_attributes.clone().unwrap_or_default().into_iter().collect(),
        };
        tracing::info!(
            driver = %self.driver, volume = %csi.volume_handle, staging = %staging_path.display(),
            "NodeStageVolume"
        );
        if let Err(e) = self.client.node_stage(request).await {
            if !e.is_retriable() {
                self.clean_up_after_failure(staging_path, dir);
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// `NodeUnstageVolume` of the volume `vol_data.json` next to `staging_path` names, then
    /// the staging path, the record and the volume directory when empty. No record: nothing
    /// was staged here (upstream skips too).
    async fn unstage(&self, staging_path: &Path) -> PluginResult<()> {
        self.unstage_volume(staging_path, None).await
    }

    async fn unstage_recorded(&self, staging_path: &Path, spec: &VolumeSpec) -> PluginResult<()> {
        self.unstage_volume(staging_path, Some(spec)).await
    }
}

#[async_trait]
impl VolumeMounter for CsiPlugin {
    /// `NodePublishVolume` to `<target>/mount`. Refused before anything happens when the
    /// CSIDriver does not list the volume's lifecycle mode or a Secret is missing.
    async fn publish(&self, req: &PublishRequest<'_>) -> PluginResult<()> {
        self.publish_volume(req).await
    }

    /// `NodeUnpublishVolume` of `<target>/mount`, then the empty target, `vol_data.json` and
    /// the pod volume directory when empty.
    async fn unpublish(&self, req: &UnpublishRequest<'_>) -> PluginResult<()> {
        self.unpublish_volume(req).await
    }
}

#[async_trait]
impl NodeExpander for CsiPlugin {
    /// `NodeExpandVolume` of the volume published at `mount_path` to `new_size` bytes: on a
    /// filesystem volume's `mount` directory there, or a raw block volume's publish file (the
    /// driver may need to see the grown device; there is no filesystem to grow).
    async fn expand_on_node(
        &self,
        spec: &VolumeSpec,
        _device_path: Option<&str>,
        mount_path: &Path,
        new_size: u64,
        _old_size: u64,
    ) -> PluginResult<()> {
        let (pv, csi) = self.persistent(spec, "expanded on the node")?;
        if !self.capabilities.node.expand {
            return Err(PluginError::Unsupported {
                plugin: self.driver.clone(),
                what: "expand volumes on the node: its node service lacks EXPAND_VOLUME",
            });
        }
        let required_bytes = i64::try_from(new_size).map_err(|_| {
            PluginError::invalid(spec, format!("the requested size {new_size} is too large for csi"))
        })?;
        let staging =
            self.capabilities.node.stage_unstage.then(|| self.stage_path_of(spec, &csi.volume_handle));
        let published = self.published_path(spec, mount_path);
        let request = NodeExpandVolumeRequest {
            volume_id: csi.volume_handle.clone(),
            volume_path: path_field(&published)?,
            capacity_range: Some(CapacityRange { required_bytes, limit_bytes: 0 }),
            staging_target_path: staging.as_deref().map(path_field).transpose()?.unwrap_or_default(),
            volume_capability: Some(self.pv_capability(pv, csi, &[], None)),
            secrets: self
                .pv_secret(spec, "nodeExpandSecretRef", csi.node_expand_secret_ref.as_ref())?
                .into_iter()
                .collect(),
        };
        tracing::info!(driver = %self.driver, volume = %csi.volume_handle, new_size, "NodeExpandVolume");
        match self.client.node_expand(request).await {
            Err(CsiError::Rpc { code: tonic::Code::FailedPrecondition, message, .. }) => {
                Err(PluginError::NotWhileInUse { plugin: self.driver.clone(), reason: message })
            }
            other => other.map(drop).map_err(PluginError::from),
        }
    }
}

#[async_trait]
impl StatsReader for CsiPlugin {
    /// `NodeGetVolumeStats` at the path the volume was published to (the `mount` directory, or
    /// a block volume's publish file), with its staging path when the driver stages; the
    /// condition is read only from a driver with `VOLUME_CONDITION`.
    async fn volume_stats(&self, req: &StatsRequest<'_>) -> PluginResult<VolumeStats> {
        let spec = req.spec;
        let (handle, staging) = match self.source(spec)? {
            Source::Persistent { csi, .. } => {
                let staging = self.capabilities.node.stage_unstage.then(|| {
                    req.staging_path
                        .map_or_else(|| self.stage_path_of(spec, &csi.volume_handle), Path::to_path_buf)
                });
                (csi.volume_handle.clone(), staging)
            }
            Source::Ephemeral { .. } => (ephemeral_volume_handle(req.pod_uid, spec.name()), None),
        };
        let volume_path = self.published_path(spec, req.target);
        let response = self.client.node_get_volume_stats(&handle, &volume_path, staging.as_deref()).await?;
        let condition = self.capabilities.node.volume_condition.then_some(response.volume_condition);
        Ok(stats_from_usage(&response.usage, condition.flatten().map(|c| c.abnormal)))
    }
}

/// A `NodeGetVolumeStats` answer as kubelet reads it: the `BYTES` entry gives capacity,
/// available and used, the `INODES` entry the inode counts; negative numbers are dropped.
fn stats_from_usage(usage: &[crate::proto::csi::VolumeUsage], abnormal: Option<bool>) -> VolumeStats {
    use crate::proto::csi::volume_usage::Unit;
    let count = |n: i64| u64::try_from(n).ok();
    let mut stats = VolumeStats { abnormal, ..VolumeStats::default() };
    for entry in usage {
        match Unit::try_from(entry.unit) {
            Ok(Unit::Bytes) => {
                stats.capacity_bytes = count(entry.total);
                stats.available_bytes = count(entry.available);
                stats.used_bytes = count(entry.used);
            }
            Ok(Unit::Inodes) => {
                stats.inodes = count(entry.total);
                stats.inodes_free = count(entry.available);
                stats.inodes_used = count(entry.used);
            }
            Ok(Unit::Unknown) | Err(_) => {}
        }
    }
    stats
}

/// A teardown call answered `NOT_FOUND` has nothing left to do at the driver: the volume does
/// not exist there (a teardown issued again after a crash, an ephemeral volume the driver has
/// already dropped), so the caller goes on to clean up its own records. kvol departs from
/// upstream: kubelet retries such a teardown for ever. What is still mounted is checked by the
/// cleanup that follows, which refuses to remove a directory with a mount in it.
fn already_gone(result: crate::error::Result<()>, driver: &str) -> crate::error::Result<()> {
    match result {
        Err(CsiError::Rpc { code: tonic::Code::NotFound, rpc, message, .. }) => {
            tracing::info!(driver, rpc, %message, "the driver does not know the volume: nothing to tear down there");
            Ok(())
        }
        other => other,
    }
}

/// A driver that answers NOT_FOUND for an ephemeral inline volume was most likely never told it
/// is one: like kubelet, kvol sends `csi.storage.k8s.io/ephemeral` only with the pod information
/// a CSIDriver asks for by `podInfoOnMount`. The error says so, since the driver cannot.
fn with_ephemeral_hint(error: CsiError, mode: LifecycleMode, policy: &DriverPolicy) -> CsiError {
    match error {
        CsiError::Rpc { driver, rpc, code: tonic::Code::NotFound, message, retriable }
            if mode == LifecycleMode::Ephemeral && !policy.pod_info_on_mount =>
        {
            let message = format!(
                "{message} (an ephemeral inline volume: the CSIDriver {driver} does not set podInfoOnMount, so the driver was not told that the volume is ephemeral)"
            );
            CsiError::Rpc { driver, rpc, code: tonic::Code::NotFound, message, retriable }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use k8s_openapi::ByteString;
    use kvol_plugin::plugin::FsGroupChangePolicy;

    #[test]
    fn a_not_found_ephemeral_publish_says_when_the_driver_was_not_told() {
        use tonic::Code;
        let rpc_error = |code| CsiError::Rpc {
            driver: "d".into(),
            rpc: "NodePublishVolume",
            code,
            message: "volume csi-1 does not exist".into(),
            retriable: false,
        };
        // (mode, podInfoOnMount, code, hinted)
        let rows = [
            (LifecycleMode::Ephemeral, false, Code::NotFound, true),
            (LifecycleMode::Ephemeral, true, Code::NotFound, false),
            (LifecycleMode::Persistent, false, Code::NotFound, false),
            (LifecycleMode::Ephemeral, false, Code::Internal, false),
        ];
        for (mode, pod_info_on_mount, code, hinted) in rows {
            let policy = DriverPolicy { pod_info_on_mount, ..DriverPolicy::from_object(None) };
            let message = with_ephemeral_hint(rpc_error(code), mode, &policy).to_string();
            assert!(message.contains("volume csi-1 does not exist"), "{message}");
            assert_eq!(
                message.contains("does not set podInfoOnMount"),
                hinted,
                "{mode:?} {pod_info_on_mount} {code:?}: {message}"
            );
        }
    }

    #[test]
    fn volume_usage_reads_as_kubelet_reads_it() {
        use crate::proto::csi::VolumeUsage;
        use crate::proto::csi::volume_usage::Unit;
        let usage =
            |unit: Unit, total, available, used| VolumeUsage { unit: unit as i32, total, available, used };
        let rows: [(&str, Vec<VolumeUsage>, Option<bool>, VolumeStats); 4] = [
            ("nothing reported", vec![], None, VolumeStats::default()),
            (
                "bytes and inodes",
                vec![usage(Unit::Bytes, 100, 60, 40), usage(Unit::Inodes, 10, 7, 3)],
                Some(false),
                VolumeStats {
                    capacity_bytes: Some(100),
                    available_bytes: Some(60),
                    used_bytes: Some(40),
                    inodes: Some(10),
                    inodes_free: Some(7),
                    inodes_used: Some(3),
                    abnormal: Some(false),
                },
            ),
            (
                "bytes only, abnormal",
                vec![usage(Unit::Bytes, 100, 0, 100)],
                Some(true),
                VolumeStats {
                    capacity_bytes: Some(100),
                    available_bytes: Some(0),
                    used_bytes: Some(100),
                    abnormal: Some(true),
                    ..VolumeStats::default()
                },
            ),
            (
                "negative and unknown entries dropped",
                vec![usage(Unit::Bytes, -1, 5, 5), usage(Unit::Unknown, 9, 9, 9)],
                None,
                VolumeStats { available_bytes: Some(5), used_bytes: Some(5), ..VolumeStats::default() },
            ),
        ];
        for (name, entries, abnormal, want) in rows {
            assert_eq!(stats_from_usage(&entries, abnormal), want, "{name}");
        }
    }

    #[test]
    fn secret_values_decode_data_and_let_string_data_win() {
        let secret = Secret {
            data: Some(BTreeMap::from([
                ("user".to_string(), ByteString(b"admin".to_vec())),
                ("key".to_string(), ByteString(b"old".to_vec())),
            ])),
            string_data: Some(BTreeMap::from([("key".to_string(), "new".to_string())])),
            ..Secret::default()
        };
        let want = BTreeMap::from([
            ("key".to_string(), "new".to_string()),
            ("user".to_string(), "admin".to_string()),
        ]);
        assert_eq!(secret_values(&secret), Ok(want));
        let binary = Secret {
            data: Some(BTreeMap::from([("cert".to_string(), ByteString(vec![0xff, 0xfe]))])),
            ..Secret::default()
        };
        assert_eq!(secret_values(&binary), Err("the value of key \"cert\" is not UTF-8".to_string()));
    }

    #[test]
    fn secret_references_need_a_namespace() {
        let spec = kvol_plugin::testing::csi_pv("pv-1", "d.example.com");
        let reference = |namespace: Option<&str>, name: Option<&str>| SecretReference {
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
        };
        let table = [
            (None, Ok(None)),
            (Some(reference(Some("ns"), None)), Ok(None)),
            (
                Some(reference(Some("ns"), Some("s"))),
                Ok(Some(SecretName { namespace: "ns".into(), name: "s".into() })),
            ),
            (
                Some(reference(None, Some("s"))),
                Err("persistent volume \"pv-1\": its nodeStageSecretRef names secret \"s\" but no namespace"
                    .to_string()),
            ),
        ];
        for (reference, want) in table {
            let got = secret_name(&spec, "nodeStageSecretRef", reference.as_ref()).map_err(|e| e.to_string());
            assert_eq!(got, want, "{reference:?}");
        }
    }

    #[test]
    fn fs_group_gives_the_group_and_group_access_but_follows_no_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("mount");
        fs::create_dir_all(root.join("sub")).unwrap();
        fs::write(root.join("sub/file"), "x").unwrap();
        fs::set_permissions(root.join("sub/file"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(root.join("sub"), fs::Permissions::from_mode(0o700)).unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, "y").unwrap();
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let gid = i64::from(nix::unistd::getegid().as_raw());
        kvol_plugin::beneath::apply_pod_fs_group(&root, gid, FsGroupChangePolicy::Always, false).unwrap();
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&root.join("sub/file")), 0o660);
        assert_eq!(mode(&root.join("sub")), 0o2770);
        assert_eq!(mode(&outside), 0o600, "the symlink's target is not touched");
        let err = kvol_plugin::beneath::apply_pod_fs_group(&root, -1, FsGroupChangePolicy::Always, false)
            .unwrap_err();
        assert!(err.to_string().contains("fsGroup -1 is not a group ID"));
    }

    #[test]
    fn on_root_mismatch_skips_the_walk_when_the_root_matches() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("mount");
        fs::create_dir_all(&root).unwrap();
        fs::write(root.join("file"), "x").unwrap();
        let gid = i64::from(nix::unistd::getegid().as_raw());
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
        // (root mode, the file's mode afterwards: 0o600 when skipped, 0o660 when walked)
        for (root_mode, want) in [(0o2770, 0o600), (0o0770, 0o660), (0o2750, 0o660)] {
            fs::set_permissions(root.join("file"), fs::Permissions::from_mode(0o600)).unwrap();
            fs::set_permissions(&root, fs::Permissions::from_mode(root_mode)).unwrap();
            kvol_plugin::beneath::apply_pod_fs_group(&root, gid, FsGroupChangePolicy::OnRootMismatch, false)
                .unwrap();
            assert_eq!(mode(&root.join("file")), want, "root {root_mode:o}");
        }
        fs::set_permissions(&root, fs::Permissions::from_mode(0o2770)).unwrap();
        kvol_plugin::beneath::apply_pod_fs_group(&root, gid, FsGroupChangePolicy::Always, false).unwrap();
        assert_eq!(mode(&root.join("file")), 0o660, "Always walks whatever the root");
    }
}
