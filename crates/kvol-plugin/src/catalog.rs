//! The plugins a node has: the compiled-in set as the feature gates shape it, and a listing of every plugin for `kvol plugins`.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvol_api::{FeatureGates, Gate, MigratablePlugin};
use serde::Serialize;

use crate::host::PluginHost;
use crate::intree::InTreeDescriptor;
use crate::local::{EmptyDirPlugin, HostPathPlugin, LocalVolumePlugin, PodObjectPlugin};
use crate::plugin::{PluginKind, PluginRef};
use crate::registry::{DynamicSource, Snapshot};

/// A plugin kvol knows but did not register, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NotRegistered {
    pub name: String,
    pub kind: PluginKind,
    pub reason: String,
}

/// The compiled-in plugins to register: the local plugins and the four of API objects always; each migratable in-tree
/// descriptor unless its in-tree code is off (phase 2) or its translation is not compiled in
/// (phase 3). The ones left out are returned with the reason.
pub fn compiled_in(host: &PluginHost, gates: &FeatureGates) -> (Vec<PluginRef>, Vec<NotRegistered>) {
    let mut plugins: Vec<PluginRef> = vec![
        Arc::new(EmptyDirPlugin::new(host.clone())),
        Arc::new(HostPathPlugin::new(host.clone())),
        Arc::new(LocalVolumePlugin::new(host.clone())),
    ];
    plugins.extend(PodObjectPlugin::all(host).into_iter().map(|p| Arc::new(p) as PluginRef));
    let mut skipped = Vec::new();
    for plugin in MigratablePlugin::ALL {
        let reason = if !kvol_translate::is_compiled_in(plugin) {
            Some(format!(
                "not compiled into this build (cargo feature {:?} of kvol-translate)",
                kvol_translate::cargo_feature(plugin)
            ))
        } else if gates.enabled(Gate::Unregister(plugin)) {
            Some(format!("{} is on", Gate::Unregister(plugin).name()))
        } else if gates.is_in_tree_off(plugin) {
            Some("CSIMigrationInTreeOff is on and the plugin is migrated".to_string())
        } else {
            None
        };
        match reason {
            Some(reason) => {
                tracing::info!(plugin = plugin.in_tree_name(), %reason, "in-tree plugin not registered");
                skipped.push(NotRegistered {
                    name: plugin.in_tree_name().to_string(),
                    kind: PluginKind::InTree,
                    reason,
                });
            }
            None => plugins.push(Arc::new(InTreeDescriptor::new(plugin))),
        }
    }
    (plugins, skipped)
}

/// Where a migratable in-tree plugin stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationListing {
    pub csi_driver: &'static str,
    /// `off` (migration off: its volumes fail until the gate is on), `on` (phase 1: each node's
    /// CSINode decides) or `complete` (phase 2: always the CSI driver, in-tree not registered).
    pub state: &'static str,
    /// The gate that switches it.
    pub gate: String,
}

/// One row of `kvol plugins`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginListing {
    pub name: String,
    pub kind: PluginKind,
    pub registered: bool,
    /// The dynamic source that registered it (none for compiled-in plugins).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<DynamicSource>,
    pub capabilities: Vec<&'static str>,
    pub access_modes: Vec<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationListing>,
    /// Why it is not registered, or another remark.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Plugin-specific facts (a CSI driver's version and CSIDriver settings, a Flexvolume
    /// driver's executable …), in the plugin's order.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, String>,
}

/// Every plugin of a snapshot plus those left out, in kind then name order.
pub fn listing(
    snapshot: &Snapshot,
    gates: &FeatureGates,
    not_registered: &[NotRegistered],
) -> Vec<PluginListing> {
    let mut rows: Vec<PluginListing> = snapshot
        .plugins()
        .iter()
        .map(|r| {
            let p = &r.plugin;
            let note = (p.kind() == PluginKind::InTree)
                .then(|| "no in-tree code in kvol: served by its CSI driver".to_string());
            PluginListing {
                name: p.name().to_string(),
                kind: p.kind(),
                registered: true,
                source: r.source,
                capabilities: p.capabilities().words(),
                access_modes: p.access_modes().into_iter().map(|m| m.as_str()).collect(),
                migration: p.migrates().map(|m| migration_listing(gates, m)),
                note,
                details: p.details().into_iter().collect(),
            }
        })
        .collect();
    rows.extend(not_registered.iter().map(|n| PluginListing {
        name: n.name.clone(),
        kind: n.kind,
        registered: false,
        source: None,
        capabilities: Vec::new(),
        access_modes: Vec::new(),
        migration: MigratablePlugin::from_in_tree_name(&n.name).map(|m| migration_listing(gates, m)),
        note: Some(n.reason.clone()),
        details: BTreeMap::new(),
    }));
    rows.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    rows
}

fn migration_listing(gates: &FeatureGates, plugin: MigratablePlugin) -> MigrationListing {
    let state = if gates.is_migration_complete(plugin) {
        "complete"
    } else if gates.is_migrated(plugin) {
        "on"
    } else {
        "off"
    };
    MigrationListing { csi_driver: plugin.csi_driver(), state, gate: Gate::Migration(plugin).name() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{NodeInfo, NodePaths};
    use crate::mount::RecordingMounter;
    use crate::registry::PluginRegistry;

    fn host() -> PluginHost {
        PluginHost::new(
            NodePaths::new("/var/lib/kvol"),
            NodeInfo::named("node-1"),
            Arc::new(RecordingMounter::new()),
        )
    }

    fn names(plugins: &[PluginRef]) -> Vec<&str> {
        plugins.iter().map(|p| p.name()).collect()
    }

    /// (gates, in-tree plugins expected unregistered with their reason)
    #[test]
    fn gates_decide_which_in_tree_plugins_register() {
        let rows: &[(&str, &[(&str, &str)])] = &[
            ("", &[]),
            (
                "CSIMigrationRBD=true,InTreePluginRBDUnregister=true",
                &[("kubernetes.io/rbd", "InTreePluginRBDUnregister is on")],
            ),
            (
                "InTreePluginPortworxUnregister=true",
                &[("kubernetes.io/portworx-volume", "InTreePluginPortworxUnregister is on")],
            ),
            (
                "CSIMigrationInTreeOff=true",
                &[
                    ("kubernetes.io/aws-ebs", "CSIMigrationInTreeOff is on and the plugin is migrated"),
                    ("kubernetes.io/gce-pd", "CSIMigrationInTreeOff is on and the plugin is migrated"),
                    ("kubernetes.io/azure-disk", "CSIMigrationInTreeOff is on and the plugin is migrated"),
                    ("kubernetes.io/azure-file", "CSIMigrationInTreeOff is on and the plugin is migrated"),
                    ("kubernetes.io/cinder", "CSIMigrationInTreeOff is on and the plugin is migrated"),
                    (
                        "kubernetes.io/vsphere-volume",
                        "CSIMigrationInTreeOff is on and the plugin is migrated",
                    ),
                    (
                        "kubernetes.io/portworx-volume",
                        "CSIMigrationInTreeOff is on and the plugin is migrated",
                    ),
                ],
            ),
        ];
        for (flag, want_skipped) in rows {
            let gates = FeatureGates::parse(flag).unwrap();
            let (plugins, skipped) = compiled_in(&host(), &gates);
            let got: Vec<(&str, &str)> =
                skipped.iter().map(|s| (s.name.as_str(), s.reason.as_str())).collect();
            assert_eq!(&got, want_skipped, "{flag:?}");
            let registered = names(&plugins);
            assert_eq!(
                &registered[..7],
                [
                    "kubernetes.io/empty-dir",
                    "kubernetes.io/host-path",
                    "kubernetes.io/local-volume",
                    "kubernetes.io/configmap",
                    "kubernetes.io/downward-api",
                    "kubernetes.io/projected",
                    "kubernetes.io/secret",
                ]
            );
            assert_eq!(registered.len(), 7 + 8 - want_skipped.len(), "{flag:?}");
            for (name, _) in *want_skipped {
                assert!(!registered.contains(name), "{flag:?}: {name} must not be registered");
            }
            PluginRegistry::new(plugins).expect("compiled-in names are unique");
        }
    }

    #[test]
    fn listing_shows_kinds_capabilities_and_migration_state() {
        let gates = FeatureGates::parse("InTreePluginPortworxUnregister=true").unwrap();
        let (plugins, skipped) = compiled_in(&host(), &gates);
        let registry = PluginRegistry::new(plugins).unwrap();
        let rows = listing(&registry.snapshot(), &gates, &skipped);
        let row =
            |name: &str| rows.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("{name} listed"));
        assert_eq!(rows[0].kind, PluginKind::CompiledIn);
        let empty_dir = row("kubernetes.io/empty-dir");
        assert!(empty_dir.registered && empty_dir.migration.is_none());
        assert!(empty_dir.capabilities.contains(&"publish"));
        let ebs = row("kubernetes.io/aws-ebs");
        assert_eq!(
            ebs.migration,
            Some(MigrationListing {
                csi_driver: "ebs.csi.aws.com",
                state: "on",
                gate: "CSIMigrationAWS".into()
            })
        );
        assert_eq!(ebs.capabilities, ["persistent"], "a descriptor offers no operations");
        assert_eq!(row("kubernetes.io/rbd").migration.as_ref().unwrap().state, "off");
        let px = row("kubernetes.io/portworx-volume");
        assert!(!px.registered);
        assert_eq!(px.migration.as_ref().unwrap().state, "complete");
        assert_eq!(px.note.as_deref(), Some("InTreePluginPortworxUnregister is on"));
    }
}
