//! CSI migration decisions: in-tree plugin or CSI driver for a spec on a node, and the control-plane rules; pure, no I/O.
//!
//! Phase 1 (migration on, in-tree plugin still registered): the node decides. Its CSINode must
//! list the plugin in `storage.alpha.kubernetes.io/migrated-plugins` and the mapped driver in
//! `spec.drivers`. Phase 2 (`InTreePlugin<X>Unregister`, or `CSIMigrationInTreeOff` for a
//! migrated plugin): migration is complete, the in-tree plugin is not registered, and the node
//! is not asked. A spec is translated before its plugin is looked up, so a migratable spec never
//! ends in "no volume plugin matched".

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::storage::v1::CSINode;
use kvol_api::keys::{
    ANN_BETA_STORAGE_PROVISIONER, ANN_MIGRATED_PLUGINS, ANN_MIGRATED_TO, ANN_PROVISIONED_BY,
    ANN_STORAGE_PROVISIONER,
};
use kvol_api::{FeatureGates, Gate, MigratablePlugin};

use crate::error::{PluginError, Result};
use crate::plugin::{PluginKind, PluginRef};
use crate::registry::Snapshot;
use crate::spec::{InlineOrigin, Migrated, SpecSource, VolumeSpec};

/// What a node says about migration: its CSINode's migrated-plugins annotation and drivers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeMigration {
    pub node: String,
    /// In-tree plugin names the node has migrated.
    pub migrated_plugins: BTreeSet<String>,
    /// CSI drivers installed on the node.
    pub drivers: BTreeSet<String>,
}

impl NodeMigration {
    /// Reads a CSINode: the annotation is split on commas (blank entries dropped).
    pub fn from_csinode(csinode: &CSINode) -> NodeMigration {
        let migrated_plugins = csinode
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_MIGRATED_PLUGINS))
            .map(|v| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect())
            .unwrap_or_default();
        NodeMigration {
            node: csinode.metadata.name.clone().unwrap_or_default(),
            migrated_plugins,
            drivers: csinode.spec.drivers.iter().map(|d| d.name.clone()).collect(),
        }
    }

    /// The view a node agent has of itself: the plugins its gates migrate and the CSI drivers
    /// registered with it (what it writes into its own CSINode).
    pub fn of_own_node<'a>(
        node: &str,
        gates: &FeatureGates,
        drivers: impl IntoIterator<Item = &'a str>,
    ) -> NodeMigration {
        NodeMigration {
            node: node.to_string(),
            migrated_plugins: gates.migrated_plugin_names().into_iter().map(str::to_string).collect(),
            drivers: drivers.into_iter().map(str::to_string).collect(),
        }
    }

    /// The value of the CSINode migrated-plugins annotation: sorted, comma-joined.
    pub fn annotation_value(&self) -> String {
        self.migrated_plugins.iter().map(String::as_str).collect::<Vec<_>>().join(",")
    }
}

/// What is known of the node a decision is for.
#[derive(Clone, Copy, Debug)]
pub enum NodeStatus<'a> {
    Known(&'a NodeMigration),
    /// The node has no CSINode object (yet): phase-1 decisions cannot be made.
    NoCsiNode {
        node: &'a str,
    },
}

/// Which code serves a spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Not an in-tree spec of a migratable plugin: look it up as it is.
    Native,
    /// The in-tree plugin (whose code kvol does not carry: this ends in an error naming the gate).
    InTree(MigratablePlugin),
    /// The plugin's CSI driver, with the spec translated.
    Csi(MigratablePlugin),
}

/// Decides between the in-tree plugin and its CSI driver for a spec of `plugin` on a node.
///
/// Not migrated → in-tree. Migration complete (in-tree code off) → CSI without asking the node
/// (upstream's `IsMigrationCompleteForPlugin`; for Portworx this is its KEP's "all gates on").
/// Otherwise the node decides: no CSINode is an error; the plugin not in its annotation →
/// in-tree; in the annotation but its driver not installed → an error naming the driver.
pub fn decide(gates: &FeatureGates, plugin: MigratablePlugin, node: NodeStatus<'_>) -> Result<Route> {
    if !gates.is_migrated(plugin) {
        return Ok(Route::InTree(plugin));
    }
    if gates.is_migration_complete(plugin) {
        return Ok(Route::Csi(plugin));
    }
    let node = match node {
        NodeStatus::Known(node) => node,
        NodeStatus::NoCsiNode { node } => {
            return Err(PluginError::NoCsiNode { plugin, node: node.to_string() });
        }
    };
    if !node.migrated_plugins.contains(plugin.in_tree_name()) {
        return Ok(Route::InTree(plugin));
    }
    if !node.drivers.contains(plugin.csi_driver()) {
        return Err(PluginError::DriverNotInstalled { plugin, node: node.node.clone() });
    }
    Ok(Route::Csi(plugin))
}

/// [`decide`] for a spec: the in-tree plugin is the spec's migration marker or its in-tree
/// source; any other spec is [`Route::Native`].
///
/// This is also the attach decision for a node (upstream's ADC `translateInTreeSpecToCSIIfNeeded`):
/// attach through the CSI driver exactly when the route is [`Route::Csi`].
pub fn decide_for_spec(gates: &FeatureGates, spec: &VolumeSpec, node: NodeStatus<'_>) -> Result<Route> {
    match spec.in_tree_plugin() {
        Some(plugin) => decide(gates, plugin, node),
        None => Ok(Route::Native),
    }
}

/// The CSI translation of an in-tree spec, carrying the marker that tells it from a native CSI
/// spec. `readOnly` is kept, as upstream keeps it.
pub fn translate_spec(spec: &VolumeSpec) -> Result<VolumeSpec> {
    let failed = |source| PluginError::Translate { spec: spec.to_string(), source };
    let (pv, from, inline_origin) = match &spec.source {
        SpecSource::Persistent(pv) => {
            let from = kvol_translate::in_tree_plugin_from_spec(spec.as_translate_ref()).map_err(failed)?;
            (kvol_translate::translate_in_tree_pv_to_csi(pv).map_err(failed)?, from, None)
        }
        SpecSource::Inline { volume, pod_namespace } => {
            let from = kvol_translate::in_tree_plugin_from_spec(spec.as_translate_ref()).map_err(failed)?;
            let pv = kvol_translate::translate_in_tree_inline_volume_to_csi(volume, pod_namespace)
                .map_err(failed)?;
            let origin = InlineOrigin { volume: volume.clone(), pod_namespace: pod_namespace.clone() };
            (pv, from, Some(origin))
        }
    };
    Ok(VolumeSpec {
        source: SpecSource::Persistent(std::sync::Arc::new(pv)),
        read_only: spec.read_only,
        migrated: Some(Migrated { from, inline_origin }),
    })
}

/// Turns a translated spec back into the in-tree spec it came from, for a node that is not
/// migrated: the original inline volume, or the CSI → in-tree translation of the PV.
pub fn turn_back(spec: &VolumeSpec) -> Result<VolumeSpec> {
    let Some(migrated) = &spec.migrated else {
        return Err(PluginError::invalid(spec, "is not a translated spec, so there is nothing to turn back"));
    };
    if let Some(origin) = &migrated.inline_origin {
        return Ok(VolumeSpec {
            source: SpecSource::Inline {
                volume: origin.volume.clone(),
                pod_namespace: origin.pod_namespace.clone(),
            },
            read_only: spec.read_only,
            migrated: None,
        });
    }
    let pv = spec
        .pv()
        .ok_or_else(|| PluginError::invalid(spec, "a translated spec must be a persistent volume"))?;
    let in_tree = kvol_translate::translate_csi_pv_to_in_tree(pv)
        .map_err(|source| PluginError::Translate { spec: spec.to_string(), source })?;
    Ok(VolumeSpec {
        source: SpecSource::Persistent(std::sync::Arc::new(in_tree)),
        read_only: spec.read_only,
        migrated: None,
    })
}

/// A spec resolved to the plugin that serves it.
#[derive(Debug)]
pub struct Resolved<'s, 'a> {
    pub plugin: &'s PluginRef,
    /// The spec the plugin gets: the input itself, its translation, or its turned-back form.
    pub spec: Cow<'a, VolumeSpec>,
    pub route: Route,
}

/// The one place a spec meets the registry: decide the route, translate (or turn back), then
/// look up. Every operation starts here.
pub fn resolve<'s, 'a>(
    snapshot: &'s Snapshot,
    gates: &FeatureGates,
    spec: &'a VolumeSpec,
    node: NodeStatus<'_>,
) -> Result<Resolved<'s, 'a>> {
    let route = decide_for_spec(gates, spec, node)?;
    // Errors name the spec as the caller knows it, not its translation (whose PV name is the
    // driver and handle).
    let original = spec;
    let spec = match (route, spec.migrated.is_some()) {
        (Route::Csi(_), false) => Cow::Owned(translate_spec(spec)?),
        (Route::InTree(_), true) => Cow::Owned(turn_back(spec)?),
        _ => Cow::Borrowed(spec),
    };
    let plugin = match route {
        Route::Native => snapshot.find_by_spec(&spec)?,
        Route::Csi(plugin) => match snapshot.find_by_spec(&spec) {
            Ok(found) => found,
            Err(PluginError::NoPluginMatched { .. }) => {
                return Err(PluginError::DriverNotRegistered { spec: original.to_string(), plugin });
            }
            Err(e) => return Err(e),
        },
        Route::InTree(plugin) => {
            if !kvol_translate::is_compiled_in(plugin) {
                return Err(PluginError::Translate {
                    spec: original.to_string(),
                    source: kvol_translate::TranslateError::NotCompiledIn {
                        plugin,
                        feature: kvol_translate::cargo_feature(plugin),
                    },
                });
            }
            let found = snapshot.find_by_spec(&spec)?;
            if found.kind() == PluginKind::InTree {
                return Err(if gates.is_migrated(plugin) {
                    PluginError::NodeNotMigrated { spec: original.to_string(), plugin, node: node_name(node) }
                } else {
                    PluginError::MigrationOff {
                        spec: original.to_string(),
                        plugin,
                        gate: gate_to_enable(gates, plugin),
                    }
                });
            }
            found
        }
    };
    Ok(Resolved { plugin, spec, route })
}

fn node_name(node: NodeStatus<'_>) -> String {
    match node {
        NodeStatus::Known(n) => n.node.clone(),
        NodeStatus::NoCsiNode { node } => node.to_string(),
    }
}

/// The gate(s) that migrate `plugin`, as `A=true` settings, naming only those now off.
fn gate_to_enable(gates: &FeatureGates, plugin: MigratablePlugin) -> String {
    [Gate::CsiMigration, Gate::Migration(plugin)]
        .into_iter()
        .filter(|g| !gates.enabled(*g))
        .map(|g| format!("{}=true", g.name()))
        .collect::<Vec<_>>()
        .join(" and ")
}

pub use kvol_api::gates::provisioner_for;

/// Which object's annotations [`sync_migrated_to`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Annotated {
    /// A PVC: the provisioner is its `volume.kubernetes.io/storage-provisioner` (or the beta key).
    Claim,
    /// A PV: the provisioner is its `pv.kubernetes.io/provisioned-by`.
    Volume,
}

/// Keeps `pv.kubernetes.io/migrated-to` true on a PV or PVC: set to the CSI driver when the
/// object's provisioner is migrated, removed when it is not (rollback). Objects without a
/// provisioner annotation (statically provisioned) are left alone. Returns whether anything
/// changed.
pub fn sync_migrated_to(
    gates: &FeatureGates,
    annotations: &mut BTreeMap<String, String>,
    object: Annotated,
) -> bool {
    let provisioner = match object {
        Annotated::Claim => {
            annotations.get(ANN_STORAGE_PROVISIONER).or_else(|| annotations.get(ANN_BETA_STORAGE_PROVISIONER))
        }
        Annotated::Volume => annotations.get(ANN_PROVISIONED_BY),
    };
    let Some(provisioner) = provisioner else { return false };
    match MigratablePlugin::from_in_tree_name(provisioner).filter(|p| gates.is_migrated(*p)) {
        Some(plugin) => {
            let driver = plugin.csi_driver();
            if annotations.get(ANN_MIGRATED_TO).map(String::as_str) == Some(driver) {
                return false;
            }
            annotations.insert(ANN_MIGRATED_TO.to_string(), driver.to_string());
            true
        }
        None => annotations.remove(ANN_MIGRATED_TO).is_some(),
    }
}

/// The name of the resizer that expands a claim's volume (the PVC's
/// `volume.kubernetes.io/storage-resizer`): the CSI driver for migrated in-tree specs and CSI
/// specs, the Flexvolume driver for Flexvolume specs, else the in-tree plugin. `None` when the
/// spec's source has no expansion at all.
pub fn storage_resizer(gates: &FeatureGates, spec: &VolumeSpec) -> Option<String> {
    if let Some(plugin) = spec.in_tree_plugin() {
        let name = if gates.is_migrated(plugin) { plugin.csi_driver() } else { plugin.in_tree_name() };
        return Some(name.to_string());
    }
    spec.csi_driver().or(spec.flex_driver()).map(str::to_string)
}

#[cfg(test)]
#[path = "migration_tests.rs"]
mod tests;
