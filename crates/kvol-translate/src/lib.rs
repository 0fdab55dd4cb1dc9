//! In-tree Kubernetes volume specs to CSI and back, field for field as upstream's csi-translation-lib.
//!
//! Four operations — PV in-tree → CSI, inline pod volume → CSI, StorageClass in-tree → CSI and
//! PV CSI → in-tree — plus name mappings, "is this migratable" and volume-handle repair. Every
//! function is pure: no I/O, no global state, and inputs are never mutated (they are borrowed;
//! the `*_owned` variants consume their input instead of copying it).
//!
//! Each plugin sits behind a cargo feature of the same name (all on by default). A build without
//! a plugin's feature reports its specs as [`TranslateError::NotCompiledIn`].

// A build that leaves plugins out leaves some shared helpers unused; that is expected.
#![cfg_attr(
    not(all(
        feature = "aws-ebs",
        feature = "gce-pd",
        feature = "azure-disk",
        feature = "azure-file",
        feature = "cinder",
        feature = "vsphere",
        feature = "portworx",
        feature = "rbd"
    )),
    allow(dead_code)
)]

mod error;
mod go;
pub mod migration_check;
mod plugins;
mod source;
#[cfg(test)]
mod tests;
mod topology;

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
pub use kvol_api::MigratablePlugin;

pub use error::TranslateError;
use source::SingleSource;
pub use source::{inline_sources, pv_sources};

/// The result of a translation.
pub type Result<T, E = TranslateError> = std::result::Result<T, E>;

/// A volume spec as kubelet sees it: a persistent volume, or a pod's inline volume.
#[derive(Clone, Copy, Debug)]
pub enum VolumeSpecRef<'a> {
    Persistent(&'a PersistentVolume),
    Inline(&'a Volume),
}

/// The cargo feature that compiles a plugin's translation in.
pub const fn cargo_feature(plugin: MigratablePlugin) -> &'static str {
    match plugin {
        MigratablePlugin::AwsEbs => "aws-ebs",
        MigratablePlugin::GcePd => "gce-pd",
        MigratablePlugin::AzureDisk => "azure-disk",
        MigratablePlugin::AzureFile => "azure-file",
        MigratablePlugin::Cinder => "cinder",
        MigratablePlugin::Vsphere => "vsphere",
        MigratablePlugin::Portworx => "portworx",
        MigratablePlugin::Rbd => "rbd",
    }
}

/// Whether this build carries the translation of `plugin`.
pub fn is_compiled_in(plugin: MigratablePlugin) -> bool {
    plugins::translator(plugin).is_some()
}

/// The plugins this build can translate.
pub fn compiled_in_plugins() -> impl Iterator<Item = MigratablePlugin> {
    MigratablePlugin::ALL.into_iter().filter(|p| is_compiled_in(*p))
}

fn translator(plugin: MigratablePlugin) -> Result<&'static dyn plugins::Translator> {
    plugins::translator(plugin)
        .ok_or(TranslateError::NotCompiledIn { plugin, feature: cargo_feature(plugin) })
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// The one migratable plugin behind a PV's source, or why there is none.
fn pv_plugin(pv: &PersistentVolume) -> Result<MigratablePlugin> {
    match source::single_pv_source(pv) {
        SingleSource::One(Some(plugin)) => Ok(plugin),
        SingleSource::Nothing | SingleSource::One(None) => {
            Err(TranslateError::NoPluginForPv { name: name_of(&pv.metadata) })
        }
        SingleSource::Many => Err(TranslateError::MultipleSources {
            what: "persistent volume",
            name: name_of(&pv.metadata),
            sources: pv_sources(pv).into_iter().map(|(field, _)| field).collect(),
        }),
    }
}

/// The one migratable plugin behind an inline volume's source, or why there is none.
fn inline_plugin(vol: &Volume) -> Result<MigratablePlugin> {
    match source::single_inline_source(vol) {
        SingleSource::One(Some(plugin)) => Ok(plugin),
        SingleSource::Nothing | SingleSource::One(None) => {
            Err(TranslateError::NoPluginForInline { name: vol.name.clone() })
        }
        SingleSource::Many => Err(TranslateError::MultipleSources {
            what: "inline volume",
            name: vol.name.clone(),
            sources: inline_sources(vol).into_iter().map(|(field, _)| field).collect(),
        }),
    }
}

/// Translates an in-tree StorageClass of the plugin named `in_tree_plugin_name` (usually the
/// class's provisioner) into the parameters and topology its CSI driver expects. The
/// provisioner is left as it is except where upstream changes it (Portworx, RBD).
pub fn translate_in_tree_storage_class_to_csi(
    in_tree_plugin_name: &str,
    sc: &StorageClass,
) -> Result<StorageClass> {
    translate_in_tree_storage_class_to_csi_owned(in_tree_plugin_name, sc.clone())
}

/// [`translate_in_tree_storage_class_to_csi`], consuming its input.
pub fn translate_in_tree_storage_class_to_csi_owned(
    in_tree_plugin_name: &str,
    sc: StorageClass,
) -> Result<StorageClass> {
    let plugin = MigratablePlugin::from_in_tree_name(in_tree_plugin_name)
        .ok_or_else(|| TranslateError::UnknownInTreePlugin(in_tree_plugin_name.to_string()))?;
    translator(plugin)?.storage_class_to_csi(sc)
}

/// Translates a pod's inline in-tree volume into a PersistentVolume with a CSI source.
/// `pod_namespace` matters only to Azure File (its secret's namespace). A volume mode the
/// plugin leaves unset becomes `Filesystem`.
pub fn translate_in_tree_inline_volume_to_csi(vol: &Volume, pod_namespace: &str) -> Result<PersistentVolume> {
    let plugin = inline_plugin(vol)?;
    let mut pv = translator(plugin)?.inline_to_csi(vol, pod_namespace)?;
    let spec = pv.spec.get_or_insert_with(Default::default);
    go::clear_csi_zeros(spec);
    if spec.volume_mode.is_none() {
        spec.volume_mode = Some("Filesystem".to_string());
    }
    Ok(pv)
}

/// Translates a PersistentVolume with an in-tree source into one with a CSI source.
pub fn translate_in_tree_pv_to_csi(pv: &PersistentVolume) -> Result<PersistentVolume> {
    let plugin = pv_plugin(pv)?;
    let translator = translator(plugin)?;
    let mut out = pv.clone();
    translator.pv_to_csi(&mut out)?;
    clear_zeros(&mut out, go::clear_csi_zeros);
    Ok(out)
}

/// [`translate_in_tree_pv_to_csi`], consuming its input.
pub fn translate_in_tree_pv_to_csi_owned(mut pv: PersistentVolume) -> Result<PersistentVolume> {
    let plugin = pv_plugin(&pv)?;
    translator(plugin)?.pv_to_csi(&mut pv)?;
    clear_zeros(&mut pv, go::clear_csi_zeros);
    Ok(pv)
}

/// Applies a Go zero-value clearing pass to a translated PV's spec.
fn clear_zeros(pv: &mut PersistentVolume, clear: fn(&mut k8s_openapi::api::core::v1::PersistentVolumeSpec)) {
    if let Some(spec) = pv.spec.as_mut() {
        clear(spec);
    }
}

/// Translates a PersistentVolume with the CSI source of a migrated driver back to its in-tree source.
pub fn translate_csi_pv_to_in_tree(pv: &PersistentVolume) -> Result<PersistentVolume> {
    let plugin = csi_pv_plugin(pv)?;
    let translator = translator(plugin)?;
    let mut out = pv.clone();
    translator.csi_pv_to_in_tree(&mut out)?;
    clear_zeros(&mut out, go::clear_in_tree_zeros);
    Ok(out)
}

/// [`translate_csi_pv_to_in_tree`], consuming its input.
pub fn translate_csi_pv_to_in_tree_owned(mut pv: PersistentVolume) -> Result<PersistentVolume> {
    let plugin = csi_pv_plugin(&pv)?;
    translator(plugin)?.csi_pv_to_in_tree(&mut pv)?;
    clear_zeros(&mut pv, go::clear_in_tree_zeros);
    Ok(pv)
}

fn csi_pv_plugin(pv: &PersistentVolume) -> Result<MigratablePlugin> {
    let csi = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .ok_or_else(|| TranslateError::NotCsi { name: name_of(&pv.metadata) })?;
    MigratablePlugin::from_csi_driver(&csi.driver)
        .ok_or_else(|| TranslateError::UnknownCsiDriver(csi.driver.clone()))
}

/// Whether this build can translate specs of the in-tree plugin with this name.
pub fn is_migratable_in_tree_plugin_by_name(in_tree_plugin_name: &str) -> bool {
    MigratablePlugin::from_in_tree_name(in_tree_plugin_name).is_some_and(is_compiled_in)
}

/// Whether `driver` supersedes an in-tree plugin this build can translate.
pub fn is_migrated_csi_driver_by_name(driver: &str) -> bool {
    MigratablePlugin::from_csi_driver(driver).is_some_and(is_compiled_in)
}

/// The CSI driver that supersedes the in-tree plugin `in_tree_plugin_name`.
pub fn csi_name_from_in_tree_name(in_tree_plugin_name: &str) -> Result<&'static str> {
    let plugin = MigratablePlugin::from_in_tree_name(in_tree_plugin_name)
        .ok_or_else(|| TranslateError::UnknownInTreePlugin(in_tree_plugin_name.to_string()))?;
    translator(plugin).map(|_| plugin.csi_driver())
}

/// The in-tree plugin that `driver` supersedes.
pub fn in_tree_name_from_csi_name(driver: &str) -> Result<&'static str> {
    let plugin = MigratablePlugin::from_csi_driver(driver)
        .ok_or_else(|| TranslateError::UnknownCsiDriver(driver.to_string()))?;
    translator(plugin).map(|_| plugin.in_tree_name())
}

/// The migratable in-tree plugin behind a spec (a PV is looked at before an inline volume).
pub fn in_tree_plugin_from_spec(spec: VolumeSpecRef<'_>) -> Result<MigratablePlugin> {
    let plugin = match spec {
        VolumeSpecRef::Persistent(pv) => pv_plugin(pv)?,
        VolumeSpecRef::Inline(vol) => inline_plugin(vol)?,
    };
    translator(plugin).map(|_| plugin)
}

/// The migratable in-tree plugin a PV's source belongs to, whether or not this build carries
/// its translation (an inventory of data must not depend on build features).
pub fn pv_in_tree_plugin(pv: &PersistentVolume) -> Result<MigratablePlugin> {
    pv_plugin(pv)
}

/// Whether a PV has an in-tree source this build can translate.
pub fn is_pv_migratable(pv: &PersistentVolume) -> bool {
    pv_plugin(pv).is_ok_and(is_compiled_in)
}

/// Whether an inline volume has an in-tree source this build can translate.
pub fn is_inline_migratable(vol: &Volume) -> bool {
    inline_plugin(vol).is_ok_and(is_compiled_in)
}

/// Completes a volume handle from the node ID where the driver needs it (GCE PD: project,
/// zone or region left `UNSPECIFIED`); other drivers return the handle unchanged.
pub fn repair_volume_handle(driver: &str, volume_handle: &str, node_id: &str) -> Result<String> {
    let plugin = MigratablePlugin::from_csi_driver(driver)
        .ok_or_else(|| TranslateError::UnknownCsiDriver(driver.to_string()))?;
    translator(plugin)?.repair_volume_handle(volume_handle, node_id)
}
