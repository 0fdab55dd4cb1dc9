//! Descriptors of the migratable in-tree plugins: they know their specs and exist to be migrated; kvol has none of their code.

use kvol_api::MigratablePlugin;

use crate::plugin::{AccessMode, PluginKind, VolumePlugin};
use crate::spec::SourceKey;

/// A migratable in-tree plugin as kvol carries it: a name, the source it serves and the access
/// modes upstream gave it. Lookups find it; every operation on it is refused with the gate to
/// turn on, because its volumes run through its CSI driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InTreeDescriptor {
    plugin: MigratablePlugin,
}

impl InTreeDescriptor {
    pub const fn new(plugin: MigratablePlugin) -> InTreeDescriptor {
        InTreeDescriptor { plugin }
    }
}

/// The API field of the volume source an in-tree plugin serves (the same in PVs and pods).
pub const fn source_field(plugin: MigratablePlugin) -> &'static str {
    match plugin {
        MigratablePlugin::AwsEbs => "awsElasticBlockStore",
        MigratablePlugin::GcePd => "gcePersistentDisk",
        MigratablePlugin::AzureDisk => "azureDisk",
        MigratablePlugin::AzureFile => "azureFile",
        MigratablePlugin::Cinder => "cinder",
        MigratablePlugin::Vsphere => "vsphereVolume",
        MigratablePlugin::Portworx => "portworxVolume",
        MigratablePlugin::Rbd => "rbd",
    }
}

impl VolumePlugin for InTreeDescriptor {
    fn name(&self) -> &str {
        self.plugin.in_tree_name()
    }

    fn kind(&self) -> PluginKind {
        PluginKind::InTree
    }

    fn serves(&self) -> Vec<SourceKey<'_>> {
        vec![SourceKey::Field(source_field(self.plugin))]
    }

    fn access_modes(&self) -> Vec<AccessMode> {
        use AccessMode::*;
        match self.plugin {
            MigratablePlugin::AwsEbs
            | MigratablePlugin::AzureDisk
            | MigratablePlugin::Cinder
            | MigratablePlugin::Vsphere => vec![ReadWriteOnce],
            MigratablePlugin::GcePd | MigratablePlugin::Rbd => vec![ReadWriteOnce, ReadOnlyMany],
            MigratablePlugin::AzureFile => vec![ReadWriteOnce, ReadOnlyMany, ReadWriteMany],
            MigratablePlugin::Portworx => vec![ReadWriteOnce, ReadWriteMany],
        }
    }

    fn is_persistent(&self) -> bool {
        true
    }

    fn migrates(&self) -> Option<MigratablePlugin> {
        Some(self.plugin)
    }
}
