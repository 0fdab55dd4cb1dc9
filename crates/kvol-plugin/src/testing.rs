//! Test doubles behind the plugin seams, for this crate's tests and benchmarks and for later crates.
//!
//! [`FakePlugin`] is a volume plugin assembled by a builder: its name, kind, the sources it
//! serves, which lifecycle parts it offers and which specs it supports. Its parts really run:
//! every call is recorded (readable through [`FakePlugin::calls`]) and answers with plausible
//! values (device `/dev/fake-<volume>`, staging path `/fake/staging/<plugin>/<volume>`, …).
//! The free functions build specs without JSON: [`csi_pv`], [`flex_pv`], [`in_tree_pv`],
//! [`inline_empty_dir`] and friends.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
    AzureFileVolumeSource, CSIPersistentVolumeSource, CSIVolumeSource, CinderPersistentVolumeSource,
    CinderVolumeSource, EmptyDirVolumeSource, FlexPersistentVolumeSource, FlexVolumeSource,
    GCEPersistentDiskVolumeSource, HostPathVolumeSource, LocalVolumeSource, NFSVolumeSource,
    PersistentVolume, PersistentVolumeSpec, PortworxVolumeSource, RBDPersistentVolumeSource, RBDVolumeSource,
    Volume, VsphereVirtualDiskVolumeSource,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_api::MigratablePlugin;

use crate::error::{PluginError, Result};
use crate::plugin::{
    AccessMode, Attacher, ControllerExpander, Deleter, DeviceMounter, NodeExpander, PluginKind, PluginRef,
    Provisioner, PublishRequest, UnpublishRequest, VolumeMounter, VolumePlugin,
};
use crate::spec::{SourceKey, VolumeSpec};

/// The namespace the inline spec builders put their pod in.
pub const TEST_NAMESPACE: &str = "default";

/// A lifecycle part a [`FakePlugin`] may offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// [`Attacher`]: attach, wait for attach, is attached, detach.
    Attach,
    /// [`DeviceMounter`]: stage and unstage.
    Stage,
    /// [`VolumeMounter`]: publish and unpublish.
    Publish,
    /// [`ControllerExpander`].
    Expand,
    /// [`NodeExpander`].
    NodeExpand,
    /// [`Provisioner`].
    Provision,
    /// [`Deleter`].
    Delete,
}

impl Part {
    /// Every part, in lifecycle order.
    pub const ALL: [Part; 7] = [
        Part::Attach,
        Part::Stage,
        Part::Publish,
        Part::Expand,
        Part::NodeExpand,
        Part::Provision,
        Part::Delete,
    ];
}

/// A source key a fake serves, owned so the fake can lend it out as a [`SourceKey`].
#[derive(Clone, Debug, PartialEq, Eq)]
enum Served {
    Field(&'static str),
    Csi(String),
    Flex(String),
}

impl Served {
    fn key(&self) -> SourceKey<'_> {
        match self {
            Served::Field(f) => SourceKey::Field(f),
            Served::Csi(d) => SourceKey::Csi(d),
            Served::Flex(d) => SourceKey::Flex(d),
        }
    }
}

type SupportFn = Arc<dyn Fn(&VolumeSpec) -> bool + Send + Sync>;

/// A volume plugin whose behaviour is set by its builder and whose calls are recorded.
pub struct FakePlugin {
    name: String,
    kind: PluginKind,
    served: Vec<Served>,
    persistent: bool,
    access_modes: Vec<AccessMode>,
    migrates: Option<MigratablePlugin>,
    parts: BTreeSet<Part>,
    supports: Option<SupportFn>,
    can_attach: bool,
    can_device_mount: bool,
    failing: BTreeSet<&'static str>,
    calls: Mutex<Vec<String>>,
    /// `(volume name, node)` pairs attached and not yet detached.
    attached: Mutex<BTreeSet<(String, String)>>,
}

impl fmt::Debug for FakePlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakePlugin")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("served", &self.served)
            .field("persistent", &self.persistent)
            .field("parts", &self.parts)
            .field("supports", &self.supports.as_ref().map(|_| "<predicate>"))
            .field("can_attach", &self.can_attach)
            .field("can_device_mount", &self.can_device_mount)
            .field("failing", &self.failing)
            .finish_non_exhaustive()
    }
}

/// Builds a [`FakePlugin`]; start from [`FakePlugin::builder`], [`FakePlugin::csi`],
/// [`FakePlugin::flex`] or [`FakePlugin::field`].
#[derive(Debug)]
pub struct FakePluginBuilder {
    plugin: FakePlugin,
}

impl FakePlugin {
    /// A compiled-in plugin called `name` that serves nothing and offers no part yet.
    pub fn builder(name: impl Into<String>) -> FakePluginBuilder {
        FakePluginBuilder {
            plugin: FakePlugin {
                name: name.into(),
                kind: PluginKind::CompiledIn,
                served: Vec::new(),
                persistent: false,
                access_modes: Vec::new(),
                migrates: None,
                parts: BTreeSet::new(),
                supports: None,
                can_attach: true,
                can_device_mount: true,
                failing: BTreeSet::new(),
                calls: Mutex::new(Vec::new()),
                attached: Mutex::new(BTreeSet::new()),
            },
        }
    }

    /// A CSI driver as CSI registration would add it: kind CSI, serving `Csi(driver)`,
    /// persistent (ReadWriteOnce), offering publish.
    pub fn csi(driver: &str) -> FakePluginBuilder {
        FakePlugin::builder(driver)
            .kind(PluginKind::Csi)
            .serves(SourceKey::Csi(driver))
            .persistent(true)
            .access_modes([AccessMode::ReadWriteOnce])
            .offers([Part::Publish])
    }

    /// A Flexvolume driver (`vendor/driver`) as the prober would add it: kind Flexvolume,
    /// serving `Flex(driver)`, persistent (ReadWriteOnce), offering publish.
    pub fn flex(driver: &str) -> FakePluginBuilder {
        FakePlugin::builder(driver)
            .kind(PluginKind::Flexvolume)
            .serves(SourceKey::Flex(driver))
            .persistent(true)
            .access_modes([AccessMode::ReadWriteOnce])
            .offers([Part::Publish])
    }

    /// A compiled-in plugin called `name` serving the source field `field`, offering publish.
    pub fn field(name: impl Into<String>, field: &'static str) -> FakePluginBuilder {
        FakePlugin::builder(name).serves(SourceKey::Field(field)).offers([Part::Publish])
    }

    /// Every call made on the plugin's parts so far, oldest first, e.g. `attach pv-1 node-a`.
    pub fn calls(&self) -> Vec<String> {
        lock(&self.calls).clone()
    }

    /// The calls so far, forgetting them.
    pub fn take_calls(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.calls))
    }

    /// The `(volume name, node)` pairs attached and not detached, sorted.
    pub fn attached(&self) -> Vec<(String, String)> {
        lock(&self.attached).iter().cloned().collect()
    }

    /// Whether the plugin offers `part`.
    pub fn offers(&self, part: Part) -> bool {
        self.parts.contains(&part)
    }

    /// Records `call`, then fails it if the builder said `op` fails.
    fn record(&self, op: &'static str, call: String) -> Result<()> {
        lock(&self.calls).push(call);
        if self.failing.contains(op) {
            return Err(PluginError::Unsupported { plugin: self.name.clone(), what: op });
        }
        Ok(())
    }

    fn part<'a, T: ?Sized>(&self, part: Part, this: &'a T) -> Option<&'a T> {
        self.parts.contains(&part).then_some(this)
    }

    fn device_of(spec: &VolumeSpec) -> String {
        format!("/dev/fake-{}", spec.name())
    }
}

impl FakePluginBuilder {
    pub fn kind(mut self, kind: PluginKind) -> Self {
        self.plugin.kind = kind;
        self
    }

    /// Adds a source the plugin serves (the registry indexes lookups by it).
    pub fn serves(mut self, key: SourceKey<'_>) -> Self {
        self.plugin.served.push(match key {
            SourceKey::Field(f) => Served::Field(f),
            SourceKey::Csi(d) => Served::Csi(d.to_string()),
            SourceKey::Flex(d) => Served::Flex(d.to_string()),
        });
        self
    }

    /// Serves nothing: clears the sources given so far.
    pub fn serves_nothing(mut self) -> Self {
        self.plugin.served.clear();
        self
    }

    pub fn persistent(mut self, persistent: bool) -> Self {
        self.plugin.persistent = persistent;
        self
    }

    pub fn access_modes(mut self, modes: impl IntoIterator<Item = AccessMode>) -> Self {
        self.plugin.access_modes = modes.into_iter().collect();
        self
    }

    /// Makes the fake stand for a migratable in-tree plugin (see [`VolumePlugin::migrates`]).
    pub fn migrates(mut self, plugin: MigratablePlugin) -> Self {
        self.plugin.migrates = Some(plugin);
        self
    }

    /// Adds parts the plugin offers.
    pub fn offers(mut self, parts: impl IntoIterator<Item = Part>) -> Self {
        self.plugin.parts.extend(parts);
        self
    }

    /// Offers every part.
    pub fn offers_all(self) -> Self {
        self.offers(Part::ALL)
    }

    /// Takes a part away.
    pub fn without(mut self, part: Part) -> Self {
        self.plugin.parts.remove(&part);
        self
    }

    /// Supports exactly the specs `predicate` accepts (among those of a source it serves).
    pub fn supports_if(mut self, predicate: impl Fn(&VolumeSpec) -> bool + Send + Sync + 'static) -> Self {
        self.plugin.supports = Some(Arc::new(predicate));
        self
    }

    /// Supports only specs whose name starts with `prefix`.
    pub fn supports_names_starting_with(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.supports_if(move |spec| spec.name().starts_with(&prefix))
    }

    /// Whether specs need attaching when the plugin offers [`Part::Attach`] (a CSI driver
    /// without `ControllerPublishVolume` says no).
    pub fn can_attach(mut self, can: bool) -> Self {
        self.plugin.can_attach = can;
        self
    }

    /// Whether specs need staging when the plugin offers [`Part::Stage`].
    pub fn can_device_mount(mut self, can: bool) -> Self {
        self.plugin.can_device_mount = can;
        self
    }

    /// Makes the operation `op` fail after it is recorded, with
    /// `volume plugin <name> cannot <op>`. `op` is the call's first word: `attach`,
    /// `wait_for_attach`, `is_attached`, `detach`, `stage`, `unstage`, `publish`, `unpublish`,
    /// `expand`, `expand_on_node`, `provision`, `delete`.
    pub fn failing(mut self, op: &'static str) -> Self {
        self.plugin.failing.insert(op);
        self
    }

    pub fn build(self) -> Arc<FakePlugin> {
        Arc::new(self.plugin)
    }

    /// The plugin as the registry takes it.
    pub fn build_ref(self) -> PluginRef {
        self.build()
    }
}

impl VolumePlugin for FakePlugin {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> PluginKind {
        self.kind
    }

    fn serves(&self) -> Vec<SourceKey<'_>> {
        self.served.iter().map(Served::key).collect()
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        self.supports.as_ref().is_none_or(|f| f(spec))
    }

    fn access_modes(&self) -> Vec<AccessMode> {
        self.access_modes.clone()
    }

    fn is_persistent(&self) -> bool {
        self.persistent
    }

    fn migrates(&self) -> Option<MigratablePlugin> {
        self.migrates
    }

    fn can_attach(&self, _spec: &VolumeSpec) -> bool {
        self.can_attach && self.offers(Part::Attach)
    }

    fn can_device_mount(&self, _spec: &VolumeSpec) -> bool {
        self.can_device_mount && self.offers(Part::Stage)
    }

    fn attacher(&self) -> Option<&dyn Attacher> {
        self.part::<dyn Attacher>(Part::Attach, self)
    }

    fn device_mounter(&self) -> Option<&dyn DeviceMounter> {
        self.part::<dyn DeviceMounter>(Part::Stage, self)
    }

    fn mounter(&self) -> Option<&dyn VolumeMounter> {
        self.part::<dyn VolumeMounter>(Part::Publish, self)
    }

    fn controller_expander(&self) -> Option<&dyn ControllerExpander> {
        self.part::<dyn ControllerExpander>(Part::Expand, self)
    }

    fn node_expander(&self) -> Option<&dyn NodeExpander> {
        self.part::<dyn NodeExpander>(Part::NodeExpand, self)
    }

    fn provisioner(&self) -> Option<&dyn Provisioner> {
        self.part::<dyn Provisioner>(Part::Provision, self)
    }

    fn deleter(&self) -> Option<&dyn Deleter> {
        self.part::<dyn Deleter>(Part::Delete, self)
    }
}

#[async_trait]
impl Attacher for FakePlugin {
    async fn attach(&self, spec: &VolumeSpec, node: &str) -> Result<Option<String>> {
        self.record("attach", format!("attach {} {node}", spec.name()))?;
        lock(&self.attached).insert((self.volume_name(spec)?, node.to_string()));
        Ok(Some(FakePlugin::device_of(spec)))
    }

    async fn wait_for_attach(
        &self,
        spec: &VolumeSpec,
        device_path: Option<&str>,
        _timeout: Duration,
    ) -> Result<String> {
        self.record(
            "wait_for_attach",
            format!("wait_for_attach {} {}", spec.name(), device_path.unwrap_or("-")),
        )?;
        Ok(device_path.map_or_else(|| FakePlugin::device_of(spec), str::to_string))
    }

    async fn is_attached(&self, spec: &VolumeSpec, node: &str) -> Result<bool> {
        self.record("is_attached", format!("is_attached {} {node}", spec.name()))?;
        Ok(lock(&self.attached).contains(&(self.volume_name(spec)?, node.to_string())))
    }

    async fn detach(&self, volume_name: &str, node: &str) -> Result<()> {
        self.record("detach", format!("detach {volume_name} {node}"))?;
        lock(&self.attached).remove(&(volume_name.to_string(), node.to_string()));
        Ok(())
    }
}

#[async_trait]
impl DeviceMounter for FakePlugin {
    fn device_mount_path(&self, spec: &VolumeSpec) -> Result<PathBuf> {
        Ok(Path::new("/fake/staging").join(&self.name).join(spec.name()))
    }

    async fn stage(&self, spec: &VolumeSpec, device_path: Option<&str>, staging_path: &Path) -> Result<()> {
        self.record(
            "stage",
            format!("stage {} {} {}", spec.name(), device_path.unwrap_or("-"), staging_path.display()),
        )
    }

    async fn unstage(&self, staging_path: &Path) -> Result<()> {
        self.record("unstage", format!("unstage {}", staging_path.display()))
    }
}

#[async_trait]
impl VolumeMounter for FakePlugin {
    async fn publish(&self, req: &PublishRequest<'_>) -> Result<()> {
        let mode = if req.read_only { "ro" } else { "rw" };
        self.record("publish", format!("publish {} {} {mode}", req.spec.name(), req.target.display()))
    }

    async fn unpublish(&self, req: &UnpublishRequest<'_>) -> Result<()> {
        self.record(
            "unpublish",
            format!("unpublish {} {} {}", req.pod_uid, req.pod_volume_name, req.target.display()),
        )
    }
}

#[async_trait]
impl ControllerExpander for FakePlugin {
    async fn expand(&self, spec: &VolumeSpec, new_size: u64, old_size: u64) -> Result<u64> {
        self.record("expand", format!("expand {} {old_size}->{new_size}", spec.name()))?;
        Ok(new_size.max(old_size))
    }

    fn requires_node_expansion(&self) -> bool {
        self.offers(Part::NodeExpand)
    }
}

#[async_trait]
impl NodeExpander for FakePlugin {
    async fn expand_on_node(
        &self,
        spec: &VolumeSpec,
        _device_path: Option<&str>,
        mount_path: &Path,
        new_size: u64,
        _old_size: u64,
    ) -> Result<()> {
        self.record(
            "expand_on_node",
            format!("expand_on_node {} {} {new_size}", spec.name(), mount_path.display()),
        )
    }
}

#[async_trait]
impl Provisioner for FakePlugin {
    /// A PV `pvc-<claim>` of `size` bytes, with the first CSI, Flexvolume or hostPath source
    /// the plugin serves (none for other sources), so the registry finds this plugin for it.
    async fn provision(
        &self,
        claim_name: &str,
        size: u64,
        _parameters: &[(String, String)],
    ) -> Result<PersistentVolume> {
        self.record("provision", format!("provision {claim_name} {size}"))?;
        let name = format!("pvc-{claim_name}");
        let mut spec = PersistentVolumeSpec {
            capacity: Some([("storage".to_string(), Quantity(size.to_string()))].into()),
            access_modes: Some(self.access_modes.iter().map(|m| m.as_str().to_string()).collect()),
            persistent_volume_reclaim_policy: Some("Delete".to_string()),
            ..PersistentVolumeSpec::default()
        };
        for served in &self.served {
            match served {
                Served::Csi(driver) => {
                    spec.csi = Some(CSIPersistentVolumeSource {
                        driver: driver.clone(),
                        volume_handle: format!("fake-{name}"),
                        ..CSIPersistentVolumeSource::default()
                    });
                }
                Served::Flex(driver) => {
                    spec.flex_volume =
                        Some(FlexPersistentVolumeSource { driver: driver.clone(), ..Default::default() });
                }
                Served::Field("hostPath") => {
                    spec.host_path = Some(HostPathVolumeSource {
                        path: format!("/fake/provisioned/{name}"),
                        ..HostPathVolumeSource::default()
                    });
                }
                Served::Field(_) => continue,
            }
            break;
        }
        Ok(PersistentVolume { metadata: meta(&name), spec: Some(spec), ..PersistentVolume::default() })
    }
}

#[async_trait]
impl Deleter for FakePlugin {
    async fn delete(&self, spec: &VolumeSpec) -> Result<()> {
        self.record("delete", format!("delete {}", spec.name()))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.to_string()), ..ObjectMeta::default() }
}

/// A persistent volume called `name` with `spec`.
pub fn persistent_volume(name: &str, spec: PersistentVolumeSpec) -> PersistentVolume {
    PersistentVolume { metadata: meta(name), spec: Some(spec), ..PersistentVolume::default() }
}

/// A spec for the persistent volume `name` with `spec`.
pub fn pv(name: &str, spec: PersistentVolumeSpec) -> VolumeSpec {
    VolumeSpec::persistent(persistent_volume(name, spec))
}

/// A CSI persistent volume of `driver`, volume handle `handle-<name>`.
pub fn csi_pv(name: &str, driver: &str) -> VolumeSpec {
    pv(
        name,
        PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.to_string(),
                volume_handle: format!("handle-{name}"),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        },
    )
}

/// A Flexvolume persistent volume of `driver` (`vendor/driver`).
pub fn flex_pv(name: &str, driver: &str) -> VolumeSpec {
    pv(
        name,
        PersistentVolumeSpec {
            flex_volume: Some(FlexPersistentVolumeSource {
                driver: driver.to_string(),
                ..FlexPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        },
    )
}

/// A hostPath persistent volume at `path`.
pub fn host_path_pv(name: &str, path: &str) -> VolumeSpec {
    pv(
        name,
        PersistentVolumeSpec {
            host_path: Some(HostPathVolumeSource {
                path: path.to_string(),
                ..HostPathVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        },
    )
}

/// A local persistent volume at `path`.
pub fn local_pv(name: &str, path: &str) -> VolumeSpec {
    pv(
        name,
        PersistentVolumeSpec {
            local: Some(LocalVolumeSource { path: path.to_string(), ..LocalVolumeSource::default() }),
            ..PersistentVolumeSpec::default()
        },
    )
}

/// An NFS persistent volume of `server:path`.
pub fn nfs_pv(name: &str, server: &str, path: &str) -> VolumeSpec {
    pv(
        name,
        PersistentVolumeSpec {
            nfs: Some(NFSVolumeSource {
                server: server.to_string(),
                path: path.to_string(),
                ..NFSVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        },
    )
}

/// A persistent volume with the source of the in-tree plugin `plugin`, filled in enough to
/// translate (volume IDs derived from `name`).
pub fn in_tree_pv(name: &str, plugin: MigratablePlugin) -> VolumeSpec {
    let id = format!("vol-{name}");
    let mut spec = PersistentVolumeSpec::default();
    match plugin {
        MigratablePlugin::AwsEbs => {
            spec.aws_elastic_block_store =
                Some(AWSElasticBlockStoreVolumeSource { volume_id: id, ..Default::default() });
        }
        MigratablePlugin::GcePd => {
            spec.gce_persistent_disk =
                Some(GCEPersistentDiskVolumeSource { pd_name: id, ..Default::default() })
        }
        MigratablePlugin::AzureDisk => spec.azure_disk = Some(azure_disk(&id)),
        MigratablePlugin::AzureFile => {
            spec.azure_file = Some(AzureFilePersistentVolumeSource {
                secret_name: "azure-secret".to_string(),
                share_name: id,
                ..Default::default()
            });
        }
        MigratablePlugin::Cinder => {
            spec.cinder = Some(CinderPersistentVolumeSource { volume_id: id, ..Default::default() })
        }
        MigratablePlugin::Vsphere => spec.vsphere_volume = Some(vsphere(&id)),
        MigratablePlugin::Portworx => {
            spec.portworx_volume = Some(PortworxVolumeSource { volume_id: id, ..Default::default() })
        }
        MigratablePlugin::Rbd => {
            spec.rbd = Some(RBDPersistentVolumeSource {
                image: id,
                monitors: vec!["10.0.0.1:6789".to_string()],
                ..Default::default()
            });
        }
    }
    pv(name, spec)
}

fn azure_disk(id: &str) -> AzureDiskVolumeSource {
    AzureDiskVolumeSource {
        disk_name: id.to_string(),
        disk_uri: format!("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/{id}"),
        ..Default::default()
    }
}

fn vsphere(id: &str) -> VsphereVirtualDiskVolumeSource {
    VsphereVirtualDiskVolumeSource {
        volume_path: format!("[datastore] kvol/{id}.vmdk"),
        ..Default::default()
    }
}

/// A spec for a pod's inline volume, in [`TEST_NAMESPACE`].
pub fn inline(volume: Volume) -> VolumeSpec {
    VolumeSpec::inline(volume, TEST_NAMESPACE)
}

/// An inline volume called `name` with no source yet.
pub fn volume(name: &str) -> Volume {
    Volume { name: name.to_string(), ..Volume::default() }
}

/// An inline emptyDir volume.
pub fn inline_empty_dir(name: &str) -> VolumeSpec {
    inline(Volume { empty_dir: Some(EmptyDirVolumeSource::default()), ..volume(name) })
}

/// An inline hostPath volume at `path`.
pub fn inline_host_path(name: &str, path: &str) -> VolumeSpec {
    inline(Volume {
        host_path: Some(HostPathVolumeSource { path: path.to_string(), ..HostPathVolumeSource::default() }),
        ..volume(name)
    })
}

/// An inline (ephemeral) CSI volume of `driver`.
pub fn inline_csi(name: &str, driver: &str) -> VolumeSpec {
    inline(Volume {
        csi: Some(CSIVolumeSource { driver: driver.to_string(), ..CSIVolumeSource::default() }),
        ..volume(name)
    })
}

/// An inline Flexvolume volume of `driver`.
pub fn inline_flex(name: &str, driver: &str) -> VolumeSpec {
    inline(Volume {
        flex_volume: Some(FlexVolumeSource { driver: driver.to_string(), ..FlexVolumeSource::default() }),
        ..volume(name)
    })
}

/// An inline volume with the source of the in-tree plugin `plugin` (volume IDs derived from `name`).
pub fn inline_in_tree(name: &str, plugin: MigratablePlugin) -> VolumeSpec {
    let id = format!("vol-{name}");
    let mut vol = volume(name);
    match plugin {
        MigratablePlugin::AwsEbs => {
            vol.aws_elastic_block_store =
                Some(AWSElasticBlockStoreVolumeSource { volume_id: id, ..Default::default() });
        }
        MigratablePlugin::GcePd => {
            vol.gce_persistent_disk =
                Some(GCEPersistentDiskVolumeSource { pd_name: id, ..Default::default() })
        }
        MigratablePlugin::AzureDisk => vol.azure_disk = Some(azure_disk(&id)),
        MigratablePlugin::AzureFile => {
            vol.azure_file = Some(AzureFileVolumeSource {
                secret_name: "azure-secret".to_string(),
                share_name: id,
                ..Default::default()
            });
        }
        MigratablePlugin::Cinder => {
            vol.cinder = Some(CinderVolumeSource { volume_id: id, ..Default::default() })
        }
        MigratablePlugin::Vsphere => vol.vsphere_volume = Some(vsphere(&id)),
        MigratablePlugin::Portworx => {
            vol.portworx_volume = Some(PortworxVolumeSource { volume_id: id, ..Default::default() })
        }
        MigratablePlugin::Rbd => {
            vol.rbd = Some(RBDVolumeSource {
                image: id,
                monitors: vec!["10.0.0.1:6789".to_string()],
                ..Default::default()
            });
        }
    }
    inline(vol)
}

/// A spec for a persistent volume written as JSON (only in this crate's tests: serde_json is a
/// dev-dependency). Panics on JSON that is not a persistent volume.
#[cfg(test)]
pub fn pv_from_json(value: serde_json::Value) -> VolumeSpec {
    VolumeSpec::persistent(serde_json::from_value::<PersistentVolume>(value).expect("a persistent volume"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::PodInfo;

    #[test]
    fn capabilities_follow_the_parts_offered() {
        // (parts offered, capability words)
        let cases: &[(&[Part], &[&str])] = &[
            (&[], &[]),
            (&[Part::Publish], &["publish"]),
            (&[Part::Attach, Part::Stage], &["attach", "stage"]),
            (&[Part::Expand, Part::NodeExpand], &["expand", "node-expand"]),
            (&[Part::Provision, Part::Delete], &["provision", "delete"]),
            (&Part::ALL, &["attach", "stage", "publish", "expand", "node-expand", "provision", "delete"]),
        ];
        for (parts, words) in cases {
            let p = FakePlugin::builder("p").offers(parts.iter().copied()).build();
            assert_eq!(p.capabilities().words(), *words, "{parts:?}");
        }
        let csi = FakePlugin::csi("d.example.com").offers_all().without(Part::Provision).build();
        assert_eq!(
            csi.capabilities().words(),
            ["persistent", "attach", "stage", "publish", "expand", "node-expand", "delete"]
        );
        assert_eq!(csi.kind(), PluginKind::Csi);
        assert_eq!(csi.serves(), [SourceKey::Csi("d.example.com")]);
    }

    #[test]
    fn support_rules_refine_the_served_specs() {
        let any = FakePlugin::field("any", "nfs").build();
        let prefixed = FakePlugin::field("pre", "nfs").supports_names_starting_with("keep-").build();
        let read_only = FakePlugin::field("ro", "nfs").supports_if(|s| s.read_only).build();
        // (spec, any, prefixed, read_only)
        let cases = [
            (nfs_pv("keep-1", "s", "/"), true, true, false),
            (nfs_pv("drop-1", "s", "/"), true, false, false),
            (nfs_pv("drop-2", "s", "/").with_read_only(true), true, false, true),
        ];
        for (spec, want_any, want_prefixed, want_ro) in cases {
            let got = (any.can_support(&spec), prefixed.can_support(&spec), read_only.can_support(&spec));
            assert_eq!(got, (want_any, want_prefixed, want_ro), "{spec}");
        }
    }

    #[test]
    fn can_attach_needs_the_part_and_the_flag() {
        let spec = csi_pv("v", "d");
        // (offers attach, can_attach flag, can_attach answer)
        for (offers, flag, want) in [(true, true, true), (true, false, false), (false, true, false)] {
            let mut b = FakePlugin::csi("d").can_attach(flag);
            if offers {
                b = b.offers([Part::Attach]);
            }
            assert_eq!(b.build().can_attach(&spec), want, "offers={offers} flag={flag}");
        }
    }

    #[tokio::test]
    async fn parts_record_calls_and_answer_plausibly() {
        let p = FakePlugin::csi("d.example.com").offers_all().build();
        let spec = csi_pv("pv-1", "d.example.com");
        let attacher = p.attacher().expect("offers attach");
        assert_eq!(attacher.attach(&spec, "node-a").await.unwrap().as_deref(), Some("/dev/fake-pv-1"));
        assert!(attacher.is_attached(&spec, "node-a").await.unwrap());
        assert!(!attacher.is_attached(&spec, "node-b").await.unwrap());
        assert_eq!(attacher.wait_for_attach(&spec, None, Duration::ZERO).await.unwrap(), "/dev/fake-pv-1");
        assert_eq!(
            attacher.wait_for_attach(&spec, Some("/dev/sdb"), Duration::ZERO).await.unwrap(),
            "/dev/sdb"
        );
        assert_eq!(p.attached(), [("d.example.com^pv-1".to_string(), "node-a".to_string())]);

        let dm = p.device_mounter().expect("offers stage");
        let staging = dm.device_mount_path(&spec).unwrap();
        assert_eq!(staging, Path::new("/fake/staging/d.example.com/pv-1"));
        dm.stage(&spec, Some("/dev/fake-pv-1"), &staging).await.unwrap();

        let pod = PodInfo { uid: "uid-1".into(), ..PodInfo::default() };
        let target = Path::new("/pods/uid-1/volumes/v");
        let req = PublishRequest {
            spec: &spec,
            pod: &pod,
            pod_volume_name: "v",
            target,
            staging_path: Some(&staging),
            device_path: None,
            read_only: true,
            mount_options: &[],
            projection: None,
        };
        p.mounter().unwrap().publish(&req).await.unwrap();
        let unreq = UnpublishRequest { pod_uid: "uid-1", pod_volume_name: "v", target, spec: None };
        p.mounter().unwrap().unpublish(&unreq).await.unwrap();
        dm.unstage(&staging).await.unwrap();
        attacher.detach("d.example.com^pv-1", "node-a").await.unwrap();
        assert!(p.attached().is_empty());

        let ce = p.controller_expander().unwrap();
        assert_eq!(ce.expand(&spec, 2048, 1024).await.unwrap(), 2048);
        assert!(ce.requires_node_expansion());
        p.node_expander()
            .unwrap()
            .expand_on_node(&spec, None, Path::new("/mnt/v"), 2048, 1024)
            .await
            .unwrap();
        let made = p.provisioner().unwrap().provision("claim-1", 1024, &[]).await.unwrap();
        let made = VolumeSpec::persistent(made);
        assert_eq!(made.name(), "pvc-claim-1");
        assert_eq!(made.source_key().unwrap(), SourceKey::Csi("d.example.com"));
        p.deleter().unwrap().delete(&made).await.unwrap();

        assert_eq!(
            p.take_calls(),
            [
                "attach pv-1 node-a",
                "is_attached pv-1 node-a",
                "is_attached pv-1 node-b",
                "wait_for_attach pv-1 -",
                "wait_for_attach pv-1 /dev/sdb",
                "stage pv-1 /dev/fake-pv-1 /fake/staging/d.example.com/pv-1",
                "publish pv-1 /pods/uid-1/volumes/v ro",
                "unpublish uid-1 v /pods/uid-1/volumes/v",
                "unstage /fake/staging/d.example.com/pv-1",
                "detach d.example.com^pv-1 node-a",
                "expand pv-1 1024->2048",
                "expand_on_node pv-1 /mnt/v 2048",
                "provision claim-1 1024",
                "delete pvc-claim-1",
            ]
        );
        assert!(p.calls().is_empty(), "take_calls forgets");
    }

    #[tokio::test]
    async fn failing_operations_are_recorded_then_refused() {
        let p = FakePlugin::flex("vendor/drv").offers([Part::Attach]).failing("attach").build();
        let spec = flex_pv("pv-2", "vendor/drv");
        let err = p.attacher().unwrap().attach(&spec, "n").await.unwrap_err();
        assert_eq!(err.to_string(), "volume plugin vendor/drv cannot attach");
        assert!(p.attached().is_empty());
        assert!(p.attacher().unwrap().is_attached(&spec, "n").await.is_ok_and(|a| !a));
        assert_eq!(p.calls(), ["attach pv-2 n", "is_attached pv-2 n"]);
        assert!(p.device_mounter().is_none() && p.mounter().is_some());
    }

    #[test]
    fn spec_builders_set_exactly_one_source() {
        use MigratablePlugin::*;
        // (spec, source key, in-tree plugin)
        let cases = [
            (csi_pv("a", "d"), SourceKey::Csi("d"), None),
            (flex_pv("a", "v/d"), SourceKey::Flex("v/d"), None),
            (host_path_pv("a", "/x"), SourceKey::Field("hostPath"), None),
            (local_pv("a", "/x"), SourceKey::Field("local"), None),
            (nfs_pv("a", "s", "/"), SourceKey::Field("nfs"), None),
            (inline_empty_dir("a"), SourceKey::Field("emptyDir"), None),
            (inline_host_path("a", "/x"), SourceKey::Field("hostPath"), None),
            (inline_csi("a", "d"), SourceKey::Csi("d"), None),
            (inline_flex("a", "v/d"), SourceKey::Flex("v/d"), None),
            (in_tree_pv("a", AwsEbs), SourceKey::Field("awsElasticBlockStore"), Some(AwsEbs)),
            (inline_in_tree("a", Rbd), SourceKey::Field("rbd"), Some(Rbd)),
        ];
        for (spec, key, in_tree) in &cases {
            assert_eq!(spec.name(), "a");
            assert_eq!(spec.source_key().unwrap(), *key, "{spec}");
            assert_eq!(spec.in_tree_plugin(), *in_tree, "{spec}");
        }
        for plugin in MigratablePlugin::ALL {
            let field = crate::intree::source_field(plugin);
            assert_eq!(in_tree_pv("p", plugin).source_key().unwrap(), SourceKey::Field(field));
            assert_eq!(inline_in_tree("p", plugin).source_key().unwrap(), SourceKey::Field(field));
        }
        let json = pv_from_json(serde_json::json!({
            "metadata": {"name": "j"}, "spec": {"csi": {"driver": "d", "volumeHandle": "h"}}
        }));
        assert_eq!(json.source_key().unwrap(), SourceKey::Csi("d"));
    }
}
