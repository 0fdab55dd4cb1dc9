//! A volume spec as the plugin host sees it: a persistent volume or a pod's inline volume, with its migration marker.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use kvol_api::MigratablePlugin;
use kvol_translate::{VolumeSpecRef, inline_sources, pv_sources};
use serde::{Deserialize, Serialize};

use crate::error::PluginError;

/// Where a spec's volume comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SpecSource {
    /// A persistent volume (a pod's claim, already resolved to its volume). Shared, not
    /// copied: the desired state, the resolutions, the published and staged records and the
    /// object set all hold the same volume, and a PV weighs kilobytes.
    Persistent(Arc<PersistentVolume>),
    /// A volume written inline in a pod.
    Inline {
        volume: Box<Volume>,
        /// The pod's namespace: inline translation needs it (Azure File secrets).
        pod_namespace: String,
    },
}

/// Marks a spec that is the CSI translation of an in-tree spec, so it can be told from a native
/// CSI spec and turned back for a node that is not migrated (mission D6).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Migrated {
    /// The in-tree plugin the spec was written for.
    #[serde(with = "plugin_by_name")]
    pub from: MigratablePlugin,
    /// For a translated inline volume: the pod's original volume, which is what turning back
    /// restores (CSI → in-tree translation is defined for persistent volumes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline_origin: Option<InlineOrigin>,
}

/// The inline volume a translated spec came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InlineOrigin {
    pub volume: Box<Volume>,
    pub pod_namespace: String,
}

/// A volume spec: what every lookup and every operation takes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    pub source: SpecSource,
    /// Mount read-only (the pod's claim or volume says so).
    #[serde(default)]
    pub read_only: bool,
    /// Set when this spec is a translation of an in-tree spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrated: Option<Migrated>,
}

/// The one volume source of a spec, as lookups index it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourceKey<'a> {
    /// A source that names no driver, by its API field name (`emptyDir`, `hostPath`, `rbd` …).
    Field(&'static str),
    /// A CSI source, by driver name.
    Csi(&'a str),
    /// A Flexvolume source, by driver name (`vendor/driver`).
    Flex(&'a str),
}

impl fmt::Display for SourceKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceKey::Field(field) => write!(f, "source {field}"),
            SourceKey::Csi(driver) => write!(f, "CSI driver {driver:?}"),
            SourceKey::Flex(driver) => write!(f, "Flexvolume driver {driver:?}"),
        }
    }
}

impl VolumeSpec {
    /// A spec for a persistent volume.
    pub fn persistent(pv: impl Into<Arc<PersistentVolume>>) -> VolumeSpec {
        VolumeSpec { source: SpecSource::Persistent(pv.into()), read_only: false, migrated: None }
    }

    /// A spec for a pod's inline volume.
    pub fn inline(volume: Volume, pod_namespace: impl Into<String>) -> VolumeSpec {
        VolumeSpec {
            source: SpecSource::Inline { volume: Box::new(volume), pod_namespace: pod_namespace.into() },
            read_only: false,
            migrated: None,
        }
    }

    /// The same spec, read-only or not.
    pub fn with_read_only(mut self, read_only: bool) -> VolumeSpec {
        self.read_only = read_only;
        self
    }

    /// The persistent volume, if this is one.
    pub fn pv(&self) -> Option<&PersistentVolume> {
        match &self.source {
            SpecSource::Persistent(pv) => Some(pv),
            SpecSource::Inline { .. } => None,
        }
    }

    /// The inline volume, if this is one.
    pub fn inline_volume(&self) -> Option<&Volume> {
        match &self.source {
            SpecSource::Persistent(_) => None,
            SpecSource::Inline { volume, .. } => Some(volume),
        }
    }

    /// The volume's name: the PV's name, or the pod's name for the inline volume.
    pub fn name(&self) -> &str {
        match &self.source {
            SpecSource::Persistent(pv) => pv.metadata.name.as_deref().unwrap_or(""),
            SpecSource::Inline { volume, .. } => &volume.name,
        }
    }

    /// Whether this is a raw block volume: a persistent volume with `volumeMode: Block`
    /// (an inline volume never is).
    pub fn is_block(&self) -> bool {
        self.pv().and_then(|pv| pv.spec.as_ref()?.volume_mode.as_deref()) == Some("Block")
    }

    /// Whether this is a persistent volume.
    pub fn is_persistent(&self) -> bool {
        matches!(self.source, SpecSource::Persistent(_))
    }

    /// The borrowed form the translation library takes.
    pub fn as_translate_ref(&self) -> VolumeSpecRef<'_> {
        match &self.source {
            SpecSource::Persistent(pv) => VolumeSpecRef::Persistent(pv),
            SpecSource::Inline { volume, .. } => VolumeSpecRef::Inline(volume),
        }
    }

    /// The API field names of every source the spec sets.
    pub fn source_fields(&self) -> Vec<&'static str> {
        match &self.source {
            SpecSource::Persistent(pv) => pv_sources(pv).into_iter().map(|(f, _)| f).collect(),
            SpecSource::Inline { volume, .. } => inline_sources(volume).into_iter().map(|(f, _)| f).collect(),
        }
    }

    /// The CSI driver the spec names, if its source is CSI.
    pub fn csi_driver(&self) -> Option<&str> {
        match &self.source {
            SpecSource::Persistent(pv) => pv.spec.as_ref()?.csi.as_ref().map(|c| c.driver.as_str()),
            SpecSource::Inline { volume, .. } => volume.csi.as_ref().map(|c| c.driver.as_str()),
        }
    }

    /// The Flexvolume driver the spec names, if its source is Flexvolume.
    pub fn flex_driver(&self) -> Option<&str> {
        match &self.source {
            SpecSource::Persistent(pv) => pv.spec.as_ref()?.flex_volume.as_ref().map(|c| c.driver.as_str()),
            SpecSource::Inline { volume, .. } => volume.flex_volume.as_ref().map(|c| c.driver.as_str()),
        }
    }

    /// The in-tree plugin this spec was written for: its migration marker, else its in-tree source.
    pub fn in_tree_plugin(&self) -> Option<MigratablePlugin> {
        if let Some(m) = &self.migrated {
            return Some(m.from);
        }
        kvol_translate::in_tree_plugin_from_spec(self.as_translate_ref()).ok()
    }

    /// The spec's one source, or why it has not exactly one.
    pub fn source_key(&self) -> Result<SourceKey<'_>, PluginError> {
        // CSI and Flexvolume first: they are the common dynamic case and need no scan when alone.
        let fields = self.source_fields();
        match fields.as_slice() {
            [] => Err(PluginError::NoSource { spec: self.to_string() }),
            ["csi"] => Ok(SourceKey::Csi(self.csi_driver().unwrap_or(""))),
            ["flexVolume"] => Ok(SourceKey::Flex(self.flex_driver().unwrap_or(""))),
            [field] => Ok(SourceKey::Field(field)),
            _ => Err(PluginError::MultipleSources { spec: self.to_string(), sources: fields }),
        }
    }
}

impl fmt::Display for VolumeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            SpecSource::Persistent(_) => write!(f, "persistent volume {:?}", self.name()),
            SpecSource::Inline { .. } => write!(f, "inline volume {:?}", self.name()),
        }
    }
}

/// Serialises a migratable plugin by its in-tree name, so stored specs read as upstream names.
mod plugin_by_name {
    use kvol_api::MigratablePlugin;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(plugin: &MigratablePlugin, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(plugin.in_tree_name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<MigratablePlugin, D::Error> {
        let name = String::deserialize(d)?;
        MigratablePlugin::from_in_tree_name(&name)
            .ok_or_else(|| D::Error::custom(format!("unknown in-tree plugin {name:?}")))
    }
}
