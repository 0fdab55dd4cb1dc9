//! How each wanted volume is served: in-tree or CSI (migration), the plugin, its unique name, staging path and publish target.

use kvol_api::FeatureGates;
use kvol_plugin::migration::{NodeMigration, NodeStatus, resolve};
use kvol_plugin::{NodePaths, Snapshot};

use crate::model::{DesiredState, DesiredVolume, unique_volume_name};
use crate::reconciler::{Resolution, Resolutions};

/// Resolves every wanted volume that has a spec: plugin, unique name, staging path, target.
pub fn resolve_all(
    snapshot: &Snapshot,
    gates: &FeatureGates,
    node: &NodeMigration,
    paths: &NodePaths,
    desired: &DesiredState,
) -> Resolutions {
    desired
        .volumes
        .iter()
        .filter_map(|(key, volume)| {
            let spec = volume.spec.as_ref()?;
            Some((key.clone(), resolve_one(snapshot, gates, node, paths, volume, spec)))
        })
        .collect()
}

fn resolve_one(
    snapshot: &Snapshot,
    gates: &FeatureGates,
    node: &NodeMigration,
    paths: &NodePaths,
    volume: &DesiredVolume,
    spec: &kvol_plugin::VolumeSpec,
) -> Result<Resolution, String> {
    let resolved = resolve(snapshot, gates, spec, NodeStatus::Known(node)).map_err(|e| e.to_string())?;
    let plugin = resolved.plugin;
    let spec = resolved.spec.into_owned();
    let staging_path = match plugin.device_mounter() {
        Some(stager) if plugin.can_device_mount(&spec) => {
            Some(stager.device_mount_path(&spec).map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    let attach = plugin.can_attach(&spec);
    // Upstream's unique names: node-wide for a volume that is attached or staged, per pod for
    // one that is only published; always with the plugin, so two plugins never share one.
    let node_wide = attach || staging_path.is_some();
    let volume_name = if node_wide {
        plugin.volume_name(&spec).map_err(|e| e.to_string())?
    } else {
        spec.name().to_string()
    };
    let unique_name =
        unique_volume_name(plugin.pod_dir_plugin_name(), &volume_name, node_wide, &volume.pod.uid);
    Ok(Resolution {
        plugin: plugin.name().to_string(),
        unique_name,
        attach,
        republish: plugin.requires_remount(&spec),
        node_expand: grows_on_the_node(plugin.as_ref(), &spec),
        staging_path,
        target: kvol_plugin::block::publish_target(paths, plugin.as_ref(), &spec, &volume.pod.uid)
            .map_err(|e| e.to_string())?,
        spec,
    })
}

/// Whether the node grows `spec`'s filesystem when its volume grows, as kubelet decides it: a
/// persistent filesystem volume, not mounted read-only (kubelet skips those: "requested
/// read-only file system"), of a plugin that expands on the node and, when it also expands on
/// the controller, says the node must follow (a Flexvolume driver's `requiresFSResize`).
fn grows_on_the_node(plugin: &dyn kvol_plugin::VolumePlugin, spec: &kvol_plugin::VolumeSpec) -> bool {
    let required = plugin.controller_expander().is_none_or(|c| c.requires_node_expansion());
    plugin.node_expander().is_some()
        && required
        && spec.is_persistent()
        && !spec.is_block()
        && !spec.read_only
}

/// Whether `plugin` attaches or stages `spec` (its unique name is then node-wide); `None` when
/// no such plugin is registered.
pub(crate) fn node_wide(snapshot: &Snapshot, plugin: &str, spec: &kvol_plugin::VolumeSpec) -> Option<bool> {
    let plugin = snapshot.find_by_name(plugin).ok()?;
    Some(plugin.can_attach(spec) || (plugin.device_mounter().is_some() && plugin.can_device_mount(spec)))
}
